"""MALT targeting and version="fast" (issue 12): exact on linear models, equal to a per-class loop, and never
weaker than the standard cascade on the toy model by more than one image."""

import warnings

import pytest
import torch
from torch import nn

from rgb.attacks import VERSIONS, AutoAttack, is_standard, lp_norm
from rgb.attacks.malt import apgd_malt, malt_scores, malt_targets
from rgb.core.threat import Norm
from rgb.models.toy import separable_data

MIXED_EPS = {"Linf": 0.07, "L2": 0.8, "L1": 6.0}


def linear_model(n_classes: int = 10, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, n_classes)).eval().requires_grad_(False)


def steepest_unit_direction(g: torch.Tensor, norm: Norm) -> torch.Tensor:
    """u with ||u||_p = 1 maximising <g, u> (per row), so <g, u> = ||g||_q."""
    if norm == Norm.LINF:
        return torch.sign(g)
    if norm == Norm.L2:
        return g / g.norm(dim=1, keepdim=True)
    u = torch.zeros_like(g)
    largest = g.abs().argmax(dim=1, keepdim=True)
    return u.scatter(1, largest, torch.sign(g.gather(1, largest)))


@pytest.mark.parametrize("norm", list(Norm))
def test_scores_are_exact_boundary_distances_on_a_linear_model(norm):
    model = linear_model()
    x = torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    logits = model(x)
    y = logits.argmax(dim=1)
    candidates = logits.scatter(1, y[:, None], -torch.inf).topk(9, dim=1).indices
    scores = malt_scores(model, x, y, candidates, norm)
    weight = model[1].weight
    for j in range(candidates.shape[1]):
        direction = weight[candidates[:, j]] - weight[y]  # grad of z_t - z_y
        delta = scores[:, j, None] * steepest_unit_direction(direction, norm)
        moved = model((x.flatten(1) + delta).view_as(x))
        gap = moved.gather(1, candidates[:, j, None]) - moved.gather(1, y[:, None])
        torch.testing.assert_close(gap.squeeze(1), torch.zeros(6), atol=1e-4, rtol=0)  # on the y/t boundary
        torch.testing.assert_close(lp_norm(delta, norm), scores[:, j])  # at distance s_t, the minimum (Hölder)


@pytest.mark.parametrize("norm", list(Norm))
def test_targets_equal_a_per_class_loop(trained_mlp, norm):
    x, y = separable_data(12, seed=4)
    logits = trained_mlp(x)
    targets = malt_targets(trained_mlp, x, y, logits, norm=norm, n_targets=5)
    expected = []
    for i in range(len(x)):
        scores = {}
        for t in range(logits.shape[1]):
            if t == y[i]:
                continue
            xi = x[i:i + 1].clone().requires_grad_(True)
            z = trained_mlp(xi)[0]
            (grad,) = torch.autograd.grad(z[t] - z[y[i]], xi)
            scores[t] = float((z[y[i]] - z[t]).detach() / torch.linalg.vector_norm(grad.flatten(), ord=norm.dual_p))
        expected.append(sorted(scores, key=scores.get)[:5])
    assert targets.tolist() == expected


def test_zero_gradient_candidates_rank_last_and_counts_are_one_pass():
    class Flat(nn.Module):  # logits 0 and 3 ignore the input: zero gradient for the 3-vs-0 boundary
        def __init__(self):
            super().__init__()
            self.inner = linear_model(5)

        def forward(self, x):
            z = self.inner(x)
            constant = torch.tensor([6.0, 5.0]) + 0 * z[:, [0, 3]]
            return torch.cat([constant[:, :1], z[:, 1:3], constant[:, 1:], z[:, 4:]], dim=1)

    model = Flat()
    x = torch.rand(4, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    y = torch.zeros(4, dtype=torch.long)
    scores = malt_scores(model, x, y, torch.tensor([[3, 1, 2, 4]] * 4), "L2")
    assert torch.isinf(scores[:, 0]).all() and torch.isfinite(scores[:, 1:]).all()
    assert torch.isfinite(malt_scores(model, x, y, torch.tensor([[1, 2, 4]] * 4), "L2")).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DLR's zero-gradient warning: the true logit is constant
        result = apgd_malt(model, x, y, norm="L2", eps=0.01, n_targets=2, n_iter=2, generator=0)
    # clean pass, one MALT forward with 4 candidates' backward rows, then APGD-T's own passes
    apgd_only = 4 * 3 * 2  # per target: start + 2 steps (nothing is fooled at eps 0.01)
    assert (result.forward_rows, result.backward_rows) == (4 + 4 + apgd_only, 4 * 4 + apgd_only)


def test_fast_is_labelled_and_built_from_the_table():
    assert not is_standard("fast")
    assert VERSIONS["fast"].attacks == ("apgd-ce", "apgd-t-malt")
    assert VERSIONS["fast"].steps[0].params_at("L1") == VERSIONS["standard"].steps[0].params_at("L1")


@pytest.mark.parametrize("norm", list(Norm))
def test_fast_never_reports_more_robust_points_than_standard_by_more_than_one(trained_mlp, norm):
    x, y = separable_data(32, seed=1)
    standard = AutoAttack(trained_mlp, norm, MIXED_EPS[norm], seed=0).run(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*experimental at L1")  # the version's own note at L1
        fast = AutoAttack(trained_mlp, norm, MIXED_EPS[norm], version="fast", seed=0).run(x, y)
    assert fast.attacks == ["apgd-ce", "apgd-t-malt"] and fast.version == "fast"
    assert 0 < int(standard.robust.sum()) < len(y)  # a budget where the attacks have work to do
    assert int(fast.robust.sum()) <= int(standard.robust.sum()) + 1
    assert fast.accuracy_after["apgd-ce"] == standard.accuracy_after["apgd-ce"]  # APGD-CE exactly as standard
    cost = {name: float(r.forward_rows.sum() + 2 * r.backward_rows.sum()) for name, r in (("s", standard), ("f", fast))}
    assert cost["f"] < cost["s"]


def test_fast_warnings_say_the_standard_version_is_needed(trained_mlp):
    class Probabilities(nn.Module):
        def forward(self, x):
            return trained_mlp(x).softmax(dim=1)

    x, y = separable_data(8, seed=2)
    with pytest.warns(UserWarning, match="probabilities.*run the standard version"):
        AutoAttack(Probabilities(), "Linf", 0.01, version="fast", steps=3).run(x, y)


def test_fast_at_l1_says_it_is_experimental(trained_mlp):
    x, y = separable_data(8, seed=1)
    with pytest.warns(UserWarning, match="experimental at L1"):
        AutoAttack(trained_mlp, Norm.L1, MIXED_EPS[Norm.L1], version="fast", seed=0).run(x, y)
