"""APGD / APGD-T and the attack losses (spec §8 items 3-7, 9-10) on tiny models."""

import importlib

import pytest
import torch
from torch import nn

from rgb.models.toy import separable_data

from rgb.attacks import (
    EvalCounter,
    apgd,
    apgd_targeted,
    ce_loss,
    checkpoint_schedule,
    dlr_loss,
    l1_eps_stages,
    lp_norm,
    targeted_dlr_loss,
)

# The package re-exports the function `apgd`, which shadows the submodule attribute of the same name.
apgd_module = importlib.import_module("rgb.attacks.apgd")

# Budgets where the trained MLP below is partly robust, and where it is not at all.
MIXED_EPS = {"Linf": 0.07, "L2": 0.8, "L1": 6.0}
LARGE_EPS = {"Linf": 0.15, "L2": 2.0, "L1": 20.0}
SCHEDULE = {"Linf": None, "L2": None, "L1": "largereps"}
NORM_SLACK = {"Linf": lambda eps: eps + 1e-7, "L2": lambda eps: eps * (1 + 1e-5), "L1": lambda eps: eps * (1 + 1e-5)}


@pytest.fixture(scope="module")
def test_batch(trained_mlp):
    x, y = separable_data(64, seed=1)
    assert (trained_mlp(x).argmax(1) == y).float().mean() >= 0.95
    return x, y


class ConstantLogits(nn.Module):
    """Ignores its input (zero gradient): the loss never changes and nothing is ever fooled."""

    def __init__(self, logits):
        super().__init__()
        self.register_buffer("logits", logits)

    def forward(self, x):
        return self.logits.expand(x.shape[0], -1) + 0 * x.flatten(1).sum(1, keepdim=True)


class SumThreshold(nn.Module):
    """Class 1 wins iff the pixel sum exceeds `threshold` (an L1 budget question on constant images)."""

    def __init__(self, threshold):
        super().__init__()
        self.threshold = threshold

    def forward(self, x):
        score = 10 * (x.flatten(1).sum(1) - self.threshold)
        return torch.stack([torch.zeros_like(score), score], dim=1)


def assert_valid_attack(model, x, y, result, norm, eps):
    for images in (result.x_adv, result.x_best):
        assert not torch.isnan(images).any()
        assert torch.all((images >= 0) & (images <= 1))
        assert torch.all(lp_norm(images - x, norm) <= NORM_SLACK[norm](eps))
    assert torch.equal(result.x_adv[~result.fooled], x[~result.fooled])
    assert torch.all(model(result.x_adv).argmax(1)[result.fooled] != y[result.fooled])


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
@pytest.mark.parametrize("early_stop", [True, False])
def test_budget_invariants(trained_mlp, test_batch, norm, early_stop):
    x, y = test_batch
    result = apgd(trained_mlp, x, y, norm=norm, eps=MIXED_EPS[norm], eps_schedule=SCHEDULE[norm], n_iter=30,
                  early_stop=early_stop, generator=0)
    assert 0 < result.fooled.sum() < len(y)
    assert result.x_adv.dtype == torch.float32 and result.loss_best.shape == y.shape
    assert_valid_attack(trained_mlp, x, y, result, norm, MIXED_EPS[norm])


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_undefended_model_is_broken_at_large_eps(trained_mlp, test_batch, norm):
    x, y = test_batch
    result = apgd(trained_mlp, x, y, norm=norm, eps=LARGE_EPS[norm], eps_schedule=SCHEDULE[norm], generator=0)
    assert result.fooled.float().mean() >= 0.95
    assert_valid_attack(trained_mlp, x, y, result, norm, LARGE_EPS[norm])


@pytest.mark.parametrize("norm", ["Linf", "L1"])
def test_best_loss_monotone_and_fooled_sticky(trained_mlp, test_batch, norm):
    x, y = test_batch
    trace = []
    apgd(trained_mlp, x, y, norm=norm, eps=MIXED_EPS[norm], eps_schedule=SCHEDULE[norm], early_stop=False,
         generator=0, trace=trace)
    assert len(trace) == 100
    for before, after in zip(trace, trace[1:]):
        if before["stage"] == after["stage"]:
            assert torch.equal(before["rows"], after["rows"])
            assert torch.all(after["loss_best"] >= before["loss_best"])
            assert torch.all(after["fooled"] >= before["fooled"])
            assert torch.all(after["loss_best"] >= after["loss"])


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_best_rows_updated_in_place_give_the_bits_of_a_where(trained_mlp, test_batch, norm, monkeypatch):
    """x_best/grad_best take improved rows in place (`rows_into`): the same bits as fresh `where`s, restarts and
    momentum included (x_prev must not change with x_best's updates), on a single row too (all rows at once)."""
    x, y = test_batch
    kwargs = dict(norm=norm, eps=MIXED_EPS[norm], eps_schedule=SCHEDULE[norm], n_iter=30, n_restarts=2)

    def runs():
        return [apgd(trained_mlp, x[rows], y[rows], generator=0, **kwargs) for rows in (slice(None),
                                                                                                 slice(0, 1))]
    in_place = runs()
    monkeypatch.setattr(apgd_module.common, "rows_into",
                        lambda mask, new, old: torch.where(mask.view(-1, *[1] * (new.dim() - 1)), new, old))
    for fresh, ours in zip(runs(), in_place):
        for name in ("x_adv", "x_best", "loss_best", "fooled"):
            assert torch.equal(getattr(fresh, name), getattr(ours, name)), name


def test_l1_ascent_reads_the_gradient_in_its_memory_order():
    """An NHWC gradient (a channels_last model call's) gives the L1 ascent of its NCHW copy bit for bit, in the
    gradient's own layout (issue 54: no copy per step), ties at the threshold and zero gradients included."""
    g = torch.Generator().manual_seed(0)
    grad = (torch.randn(4, 3, 8, 8, generator=g) * 4).round() / 4  # ties
    grad[1] = 0.0
    state = {"x": torch.rand(4, 3, 8, 8, generator=g), "q": torch.tensor([0.05, 0.2, 0.01, 1.0])}
    ball = apgd_module._BALLS[apgd_module.parse_norm("L1")]
    nchw = ball.ascent(dict(state, grad=grad))
    nhwc = ball.ascent(dict(state, grad=grad.contiguous(memory_format=torch.channels_last)))
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and nchw.is_contiguous()
    assert torch.equal(nhwc, nchw) and torch.equal(torch.signbit(nhwc), torch.signbit(nchw))
    magnitude = grad.flatten(1).abs()
    k = 192 - ((1 - state["q"]) * 192).long().clamp(0, 191)
    threshold = magnitude.sort(dim=1, descending=True)[0].gather(1, (k - 1)[:, None])
    selected = (magnitude >= threshold) & (magnitude > 0)  # ties at the threshold are all selected
    assert torch.equal(nchw.flatten(1) != 0, selected) and selected[0].sum() > k[0]


def test_rows_into_writes_the_flagged_rows_into_old():
    new, old = torch.arange(6.0).view(3, 2), -torch.arange(6.0).view(3, 2)
    for mask in ([True, False, True], [False] * 3, [True] * 3):
        mask = torch.tensor(mask)
        expected = torch.where(mask[:, None], new, old)
        answer = apgd_module.common.rows_into(mask, new, old)
        assert answer is old and torch.equal(answer, expected)


def test_early_stop_keeps_the_same_flags_with_fewer_evaluations(trained_mlp, test_batch):
    x, y = test_batch
    full = apgd(trained_mlp, x, y, norm="Linf", eps=MIXED_EPS["Linf"], n_iter=30, early_stop=False, generator=3)
    fast = apgd(trained_mlp, x, y, norm="Linf", eps=MIXED_EPS["Linf"], n_iter=30, early_stop=True, generator=3)
    assert 0 < fast.fooled.sum() < len(y) and torch.equal(full.fooled, fast.fooled)
    assert fast.backward_rows < full.backward_rows == 31 * len(y)


def test_checkpoint_schedule():
    assert checkpoint_schedule(100) == [21, 40, 56, 69, 79, 86, 92, 98]
    assert checkpoint_schedule(10) == list(range(1, 10))
    assert checkpoint_schedule(1) == [0]


def test_step_size_starts_at_2eps_and_halves_at_each_checkpoint():
    model = ConstantLogits(torch.tensor([[2.0, 0.0, 1.0]]))
    x, y, eps = torch.full((2, 3, 4, 4), 0.5), torch.zeros(2, dtype=torch.long), 0.1
    trace = []
    result = apgd(model, x, y, norm="L2", eps=eps, early_stop=False, generator=0, trace=trace)
    checkpoints = checkpoint_schedule(100)
    for record in trace:
        n_halvings = sum(c <= record["iteration"] for c in checkpoints)
        torch.testing.assert_close(record["step_size"], torch.full((2,), 2 * eps / 2**n_halvings))
    assert not result.fooled.any() and torch.equal(result.x_adv, x)


def test_l1_eps_schedule_stages_and_only_last_stage_counts():
    assert l1_eps_stages(100) == [(3.0, 30), (2.0, 30), (1.0, 40)]
    eps, d = 2.0, 3 * 8 * 8
    x, y = torch.full((4, 3, 8, 8), 0.5), torch.zeros(4, dtype=torch.long)
    model = SumThreshold(0.5 * d + 2 * eps)  # reachable within 3 eps, not within eps
    trace = []
    result = apgd(model, x, y, norm="L1", eps=eps, eps_schedule="largereps", early_stop=False, generator=0,
                  trace=trace)
    assert [sum(r["stage"] == s for r in trace) for s in range(3)] == [30, 30, 40]
    for stage, multiplier in enumerate([3.0, 2.0, 1.0]):
        steps = torch.stack([r["step_size"] for r in trace if r["stage"] == stage])
        assert steps.max() <= multiplier * eps and steps.min() >= multiplier * eps / 10 - 1e-6
    assert not result.fooled.any() and torch.equal(result.x_adv, x)
    assert result.backward_rows == 103 * 4
    assert all(trace[29]["fooled"]) and not any(trace[-1]["fooled"])
    assert apgd(model, x, y, norm="L1", eps=3 * eps, n_iter=40, generator=0).fooled.all()


def test_dlr_losses_on_hand_made_logits():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [3.0, 1.0, 2.0, 0.0]])
    y = torch.tensor([0, 2])
    torch.testing.assert_close(dlr_loss(logits, y), torch.tensor([-0.5, 0.5]))
    torch.testing.assert_close(targeted_dlr_loss(logits, y, torch.tensor([3, 1])), torch.tensor([-1.2, -0.4]))
    for transformed in (logits + 7.0, logits * 3.5, logits * 0.2 - 4.0):
        torch.testing.assert_close(dlr_loss(transformed, y), dlr_loss(logits, y))
        torch.testing.assert_close(targeted_dlr_loss(transformed, y, torch.tensor([3, 1])),
                                   targeted_dlr_loss(logits, y, torch.tensor([3, 1])))


def test_losses_are_maximised_by_lowering_the_true_logit():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0]])
    lowered = logits - torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    y, target = torch.tensor([0]), torch.tensor([1])
    assert ce_loss(lowered, y) > ce_loss(logits, y)
    assert dlr_loss(lowered, y) > dlr_loss(logits, y)
    assert targeted_dlr_loss(lowered, y, target) > targeted_dlr_loss(logits, y, target)


def test_losses_reject_too_few_classes():
    with pytest.raises(ValueError, match="at least 3 classes"):
        dlr_loss(torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="at least 4 classes"):
        targeted_dlr_loss(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long))


def test_targets_are_clean_logit_ranks_2_to_10(monkeypatch):
    clean = torch.tensor([[9.0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 8.5], [9.0, 0.5, 8, 7, 6, 5, 4, 3, 2, 1, 0]])
    model = ConstantLogits(clean[:1])  # never fooled; the targets must come from `clean`
    x, y = torch.full((2, 3, 4, 4), 0.5), torch.tensor([0, 0])
    calls = []

    def recording_apgd(*args, **kwargs):
        calls.append(kwargs["y_target"].clone())
        return apgd(*args, **kwargs)

    monkeypatch.setattr(apgd_module, "apgd", recording_apgd)
    with pytest.warns(UserWarning, match="zero gradient at the initial point"):
        result = apgd_targeted(model, x, y, norm="Linf", eps=0.1, n_iter=3, clean_logits=clean, generator=0)
    assert torch.equal(torch.stack(calls, dim=1), torch.tensor([[10, 9, 8, 7, 6, 5, 4, 3, 2],
                                                                  [2, 3, 4, 5, 6, 7, 8, 9, 1]]))
    assert not result.fooled.any() and torch.equal(result.x_adv, x)


def test_apgd_targeted_attacks_only_still_robust_points(trained_mlp, test_batch, monkeypatch):
    x, y = test_batch
    batch_sizes = []

    def recording_apgd(model, x_rows, *args, **kwargs):
        batch_sizes.append(len(x_rows))
        return apgd(model, x_rows, *args, **kwargs)

    monkeypatch.setattr(apgd_module, "apgd", recording_apgd)
    counter = EvalCounter()
    result = apgd_targeted(trained_mlp, x, y, norm="Linf", eps=MIXED_EPS["Linf"], n_targets=3, n_iter=30,
                           generator=0, counter=counter)
    assert batch_sizes[0] == len(y) and batch_sizes == sorted(batch_sizes, reverse=True)
    assert len(y) - int(result.fooled.sum()) <= batch_sizes[-1]
    assert (counter.forward_rows, counter.backward_rows) == (result.forward_rows, result.backward_rows)
    assert_valid_attack(trained_mlp, x, y, result, "Linf", MIXED_EPS["Linf"])


def test_restarts_and_eval_counting():
    model = ConstantLogits(torch.tensor([[2.0, 0.0, 1.0]]))
    x, y = torch.full((5, 3, 4, 4), 0.5), torch.zeros(5, dtype=torch.long)
    counter = EvalCounter()
    result = apgd(model, x, y, norm="Linf", eps=0.1, n_iter=10, n_restarts=3, generator=0, counter=counter)
    assert (result.forward_rows, result.backward_rows) == (5 + 3 * 11 * 5, 3 * 11 * 5)
    assert (counter.forward_rows, counter.backward_rows) == (result.forward_rows, result.backward_rows)


@pytest.mark.parametrize("norm", ["Linf", "L1"])
def test_fixed_seed_is_deterministic(trained_mlp, test_batch, norm):
    x, y = test_batch
    runs = [apgd(trained_mlp, x, y, norm=norm, eps=MIXED_EPS[norm], n_iter=20, generator=seed)
            for seed in (5, 5, 6)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv) and torch.equal(runs[0].fooled, runs[1].fooled)
    assert torch.equal(runs[0].x_best, runs[1].x_best)
    assert not torch.equal(runs[0].x_best, runs[2].x_best)


def test_training_inner_attack_leaves_model_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5)).train()
    x, y = torch.rand(6, 3, 8, 8), torch.randint(0, 5, (6,))
    clean_loss = ce_loss(model(x), y)
    result = apgd(model, x, y, norm="Linf", eps=4 / 255, n_iter=10, random_start=False, early_stop=False)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert torch.all(lp_norm(result.x_best - x, "Linf") <= 4 / 255 + 1e-7)
    assert result.forward_rows == result.backward_rows == 11 * 6
    assert torch.all(result.loss_best >= clean_loss - 1e-6)


def test_runs_under_bfloat16_autocast(trained_mlp, test_batch):
    x, y = test_batch
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10)).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for norm in ("Linf", "L2", "L1"):
            result = apgd(model, x, y, norm=norm, eps=MIXED_EPS[norm], n_iter=10, generator=0)
            assert result.x_adv.dtype == torch.float32 and torch.isfinite(result.loss_best).all()
            assert torch.all(lp_norm(result.x_adv - x, norm) <= NORM_SLACK[norm](MIXED_EPS[norm]))
        targeted = apgd_targeted(model, x, y, norm="Linf", eps=0.03, n_iter=5, n_targets=2, generator=0)
        assert torch.all(lp_norm(targeted.x_adv - x, "Linf") <= 0.03 + 1e-7)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(norm="L3", eps=0.1), "norm must be one of"),
        (dict(norm="Linf", eps=0.1, loss="hinge"), "loss must be one of"),
        (dict(norm="Linf", eps=0.1, loss="dlr-targeted"), "y_target must be given"),
        (dict(norm="Linf", eps=0.1, eps_schedule="largereps"), "eps_schedule"),
        (dict(norm="Linf", eps=-0.1), "eps must be >= 0"),
        (dict(norm="Linf", eps=0.1, n_iter=0), "n_iter and n_restarts"),
        (dict(norm="L1", eps=0.1, n_iter=2, eps_schedule="largereps"), "needs n_iter >= 3"),
    ],
)
def test_apgd_rejects_bad_arguments(kwargs, message):
    model = ConstantLogits(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=message):
        apgd(model, torch.rand(2, 3, 4, 4), torch.zeros(2, dtype=torch.long), **kwargs)


def test_apgd_rejects_unnormalised_images_and_too_many_targets():
    model = ConstantLogits(torch.zeros(1, 4))
    y = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"x must lie in \[0, 1\]"):
        apgd(model, torch.rand(2, 3, 4, 4) * 2 - 0.5, y, norm="Linf", eps=0.1)
    with pytest.raises(ValueError, match="n_targets must be in"):
        apgd_targeted(model, torch.rand(2, 3, 4, 4), y, norm="Linf", eps=0.1, n_targets=9)


def test_accepts_inputs_made_under_inference_mode(trained_mlp, test_batch):
    """AutoAttack computes clean logits (and may load images) under torch.inference_mode."""
    with torch.inference_mode():
        x, y = test_batch[0].clone(), test_batch[1].clone()
        clean_logits = trained_mlp(x)
    for attack in (apgd, apgd_targeted):
        result = attack(trained_mlp, x, y, norm="Linf", eps=MIXED_EPS["Linf"], n_iter=5, clean_logits=clean_logits,
                        random_start=False, generator=0)
        assert torch.all(lp_norm(result.x_adv - x, "Linf") <= MIXED_EPS["Linf"] + 1e-7)


def test_eot_averages_gradients_over_passes(trained_mlp, test_batch):
    x, y = test_batch
    once = apgd(trained_mlp, x, y, norm="Linf", eps=0.05, n_iter=5, generator=0, early_stop=False)
    thrice = apgd(trained_mlp, x, y, norm="Linf", eps=0.05, n_iter=5, generator=0, early_stop=False, eot_iter=3)
    assert thrice.backward_rows == 3 * once.backward_rows
    assert torch.equal(once.fooled, thrice.fooled)  # a deterministic model: averaging identical gradients
    with pytest.raises(ValueError, match="eot_iter"):
        apgd(trained_mlp, x, y, norm="Linf", eps=0.05, eot_iter=0)


@pytest.mark.parametrize("norm", ["Linf", "L1"])
def test_targets_side_by_side_in_the_tail_agree_and_cost_no_more_on_robust_points(trained_mlp, test_batch, norm):
    """tail_rows: the targets left run in one batch once few points remain (spec §6.3 item 8). Statistically
    equivalent (other random starts): the robust counts agree within noise, every success is real, and a
    point that stays robust costs what it costs one target after another."""
    x, y = test_batch
    schedule = {"eps_schedule": SCHEDULE[norm]} if SCHEDULE[norm] else {}
    counters = {rows: EvalCounter() for rows in (0, 10_000)}
    results = {rows: apgd_targeted(trained_mlp, x, y, norm=norm, eps=MIXED_EPS[norm], n_targets=3, n_iter=20,
                                   generator=0, tail_rows=rows, counter=counters[rows], **schedule)
               for rows in counters}
    robust = {rows: len(y) - int(result.fooled.sum()) for rows, result in results.items()}
    assert 0 < robust[0] < len(y) and abs(robust[0] - robust[10_000]) <= 2, robust
    assert_valid_attack(trained_mlp, x, y, results[10_000], norm, MIXED_EPS[norm])
    constant = ConstantLogits(torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]))  # nothing ever falls
    x0, y0 = torch.rand(4, 3, 4, 4), torch.zeros(4, dtype=torch.long)
    spent = []
    for rows in (0, 10_000):
        counter = EvalCounter()
        apgd_targeted(constant, x0, y0, norm=norm, eps=0.1, n_targets=3, n_iter=10, generator=0, tail_rows=rows,
                      counter=counter, **schedule)
        spent.append((counter.forward_rows, counter.backward_rows))
    assert spent[0] == spent[1]


def test_a_point_leaves_with_all_its_side_by_side_rows(trained_mlp, test_batch, monkeypatch):
    """Once one target fools a point, its other targets stop too (the earlier CPU attempt kept them running)."""
    x, y = test_batch
    spent = []
    for grouped in (True, False):
        if not grouped:  # every row for itself: the rows of a fallen point keep running
            monkeypatch.setattr(apgd_module, "unfinished", lambda finished, groups: ~finished)
        counter = EvalCounter()
        result = apgd_targeted(trained_mlp, x, y, norm="Linf", eps=MIXED_EPS["Linf"], n_targets=3, n_iter=50,
                               generator=0, tail_rows=10_000, counter=counter)
        spent.append(counter.backward_rows)
        assert 0 < result.fooled.sum() < len(y)
    assert spent[0] < 0.9 * spent[1], spent
