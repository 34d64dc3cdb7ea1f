"""FAB-T and untargeted FAB (spec §4) and their box-constrained hyperplane projections (spec §8 items 2, 3, 7, 9)."""

import importlib
import itertools

import numpy as np
import pytest
import torch
from torch import nn

from helpers import assert_attack_invariants

from rgb.attacks import EvalCounter, lp_norm
from rgb.attacks.fab import (
    _closest_boundary,
    fab_project_l1,
    fab_project_l2,
    fab_project_linf,
    fab_random_start,
    fab_targeted,
    fab_untargeted,
)

PROJECTIONS = {"Linf": fab_project_linf, "L2": fab_project_l2, "L1": fab_project_l1}
NORM_TOLERANCE = {
    "Linf": lambda eps: eps + 1e-7,
    "L2": lambda eps: eps * (1 + 1e-5),
    "L1": lambda eps: eps * (1 + 1e-5),
}
# eps at which the toy MLP (minimal adversarial norms around 0.07 / 0.8 / 5.6) is broken on most points.
BREAKING_EPS = {"Linf": 0.1, "L2": 1.1, "L1": 8.0}


def hyperplane_cases(seed, n, dim):
    """Points with some exact 0/1 coordinates, normals with some zeros, and b reachable inside the box."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, dim, generator=g)
    t = torch.where(torch.rand(n, dim, generator=g) < 0.2, t.round(), t)
    w = torch.randn(n, dim, generator=g)
    w = torch.where(torch.rand(n, dim, generator=g) < 0.15, torch.zeros_like(w), w)
    b = (w * torch.rand(n, dim, generator=g)).sum(dim=1)
    return t, w, b


def minimal_norm_lp(t, w, b, norm):
    """Minimal Linf / L1 norm of d with <w, t + d> = b and t + d in the box, by linear programming."""
    from scipy.optimize import linprog

    n = len(t)
    box = [(-ti, 1 - ti) for ti in t]
    if norm == "Linf":  # variables (d, s): minimise s with -s <= d_i <= s
        bound_rows = np.vstack([np.c_[np.eye(n), -np.ones(n)], np.c_[-np.eye(n), -np.ones(n)]])
        result = linprog(np.r_[np.zeros(n), 1.0], A_ub=bound_rows, b_ub=np.zeros(2 * n),
                         A_eq=np.r_[w, 0.0][None], b_eq=[b - w @ t], bounds=box + [(0, None)])
    else:  # d = d_plus - d_minus with both >= 0: minimise their sum
        box_rows = np.vstack([np.c_[np.eye(n), -np.eye(n)], np.c_[-np.eye(n), np.eye(n)]])
        result = linprog(np.ones(2 * n), A_ub=box_rows, b_ub=np.r_[1 - t, t], A_eq=np.r_[w, -w][None],
                         b_eq=[b - w @ t], bounds=[(0, None)] * (2 * n))
    assert result.status == 0
    return result.fun


def minimal_norm_l2_exhaustive(t, w, b):
    """Minimal L2 norm by trying every active set: each coordinate at its lower bound, its upper bound, or
    free, where the free ones take the least-norm solution of the remaining equality."""
    best = np.inf
    for states in itertools.product((0, 1, 2), repeat=len(t)):
        states = np.array(states)
        d = np.where(states == 0, -t, np.where(states == 1, 1 - t, 0.0))
        free = (states == 2) & (w != 0)
        residual = b - w @ (t + d * (states != 2))
        if not free.any():
            if abs(residual) < 1e-9:
                best = min(best, np.linalg.norm(d * (states != 2)))
            continue
        d = np.where(states == 2, 0.0, d)
        d[free] = w[free] * residual / (w[free] @ w[free])
        if np.all(d >= -t - 1e-12) and np.all(d <= 1 - t + 1e-12):
            best = min(best, np.linalg.norm(d))
    return best


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_projection_reaches_the_hyperplane_inside_the_box(norm):
    t, w, b = hyperplane_cases(0, n=16, dim=3 * 16 * 16)
    d = PROJECTIONS[norm](t, w, b)
    assert torch.all(((w * (t + d)).sum(dim=1) - b).abs() <= 1e-4 * w.abs().sum(dim=1))
    assert torch.all((t + d >= -1e-6) & (t + d <= 1 + 1e-6))
    assert torch.all(d[w == 0] == 0)


@pytest.mark.parametrize("norm", ["Linf", "L1"])
def test_projection_norm_matches_linear_programming(norm):
    pytest.importorskip("scipy.optimize")
    for dim in range(1, 7):
        t, w, b = hyperplane_cases(dim, n=25, dim=dim)
        d = PROJECTIONS[norm](t, w, b)
        found = lp_norm(d, norm).double()
        for row in range(t.shape[0]):
            expected = minimal_norm_lp(t[row].double().numpy(), w[row].double().numpy(), float(b[row]), norm)
            assert float(found[row]) == pytest.approx(expected, abs=1e-5), (dim, row)


def test_l2_projection_norm_matches_exhaustive_active_sets():
    for dim in range(1, 6):
        t, w, b = hyperplane_cases(10 + dim, n=20, dim=dim)
        found = lp_norm(fab_project_l2(t, w, b), "L2").double()
        for row in range(t.shape[0]):
            expected = minimal_norm_l2_exhaustive(t[row].double().numpy(), w[row].double().numpy(), float(b[row]))
            assert float(found[row]) == pytest.approx(expected, abs=1e-5), (dim, row)


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_level_search_finishes_by_bisection_where_newton_has_not_settled(norm, monkeypatch):
    """The Linf/L2 level search: Newton steps, then bisection for rows with kinks left before the root. One
    Newton step leaves most rows unsettled; the result must not change beyond float rounding."""
    pytest.importorskip("scipy.optimize")
    fab_module = importlib.import_module("rgb.attacks.fab")
    t, w, b = hyperplane_cases(5, n=64, dim=3 * 16 * 16)
    newton = PROJECTIONS[norm](t, w, b)
    monkeypatch.setattr(fab_module, "_NEWTON_STEPS", 1)
    bisected = PROJECTIONS[norm](t, w, b)
    torch.testing.assert_close(lp_norm(bisected, norm), lp_norm(newton, norm), rtol=1e-5, atol=1e-7)
    assert torch.all(((w * (t + bisected)).sum(dim=1) - b).abs() <= 1e-4 * w.abs().sum(dim=1))
    for dim in range(1, 6):  # and against the exact minimal norms in small dimension
        t, w, b = hyperplane_cases(20 + dim, n=20, dim=dim)
        found = lp_norm(PROJECTIONS[norm](t, w, b), norm).double()
        for row in range(t.shape[0]):
            point, normal = t[row].double().numpy(), w[row].double().numpy()
            expected = (minimal_norm_lp(point, normal, float(b[row]), norm) if norm == "Linf"
                        else minimal_norm_l2_exhaustive(point, normal, float(b[row])))
            assert float(found[row]) == pytest.approx(expected, abs=1e-5), (dim, row)


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
@pytest.mark.parametrize("direction", [-1.0, 1.0])
def test_unreachable_hyperplane_gives_the_face_vertex(norm, direction):
    t, w, _ = hyperplane_cases(3, n=8, dim=12)
    lowest, highest = w.clamp_max(0).sum(dim=1), w.clamp_min(0).sum(dim=1)
    b = lowest - 0.5 if direction < 0 else highest + 0.5
    d = PROJECTIONS[norm](t, w, b)
    toward_lower = (w > 0) if direction < 0 else (w < 0)
    face = torch.where(toward_lower, torch.zeros_like(t), torch.ones_like(t))
    expected = torch.where(w == 0, torch.zeros_like(t), face - t)
    torch.testing.assert_close(d, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm", ["L2", "L1"])
def test_negligible_weights_never_move(norm):
    t, w, b = hyperplane_cases(4, n=8, dim=20)
    w[:, :5] = 1e-9
    for offset in (0.0, -100.0):  # reachable, and unreachable (everything else goes to its face)
        d = PROJECTIONS[norm](t, w, b + offset)
        assert torch.all(d[:, :5] == 0)
        assert torch.all(d[:, 5:].abs().sum(dim=1) > 0)


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_point_on_the_hyperplane_does_not_move(norm):
    t, w, _ = hyperplane_cases(5, n=8, dim=10)
    assert torch.all(PROJECTIONS[norm](t, w, (w * t).sum(dim=1)).abs() <= 1e-6)


def test_projection_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="expected t of shape"):
        fab_project_l2(torch.rand(2, 3), torch.rand(2, 4), torch.rand(2))
    with pytest.raises(ValueError, match="M dividing N"):  # w's rows must tile t's
        fab_project_l1(torch.rand(6, 3), torch.rand(4, 3), torch.rand(6))


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_projection_with_w_repeated_down_t_is_the_projection_with_w_tiled(norm):
    """FAB projects its iterate and its start onto one hyperplane: w given once for both halves gives the same
    bits as w tiled (the L1 greedy selects its order once per row of w), ties in |w| and zero weights included."""
    t, w, b = hyperplane_cases(11, n=12, dim=300)
    w = w[:6].clone()
    w[:, :40] = w[:, :1]  # tied magnitudes
    w[:, 40:50] = 0.0  # coordinates that stay put
    t[:, :20] = torch.where(torch.arange(12)[:, None] % 2 == 0, 0.0, 1.0)  # on the faces
    expected = PROJECTIONS[norm](t, w.repeat(2, 1), b)
    assert torch.equal(PROJECTIONS[norm](t, w, b).view(torch.int32), expected.view(torch.int32))  # signed zeros too


def as_bits(values):
    return values.view(torch.int64 if values.dtype == torch.float64 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_distance_to_face_is_the_choice_between_t_and_one_minus_t_bit_for_bit(dtype):
    """The projections' room, written as |m - t| with a 0/1 float m: the bits of choosing t or 1 - t by the sign
    of w (what a lerp by the mask gave), on the box's faces and for zero, signed-zero, tiny and infinite w."""
    fab_module = importlib.import_module("rgb.attacks.fab")
    g = torch.Generator().manual_seed(0)
    t = torch.rand(7, 301, generator=g, dtype=dtype)
    t[:, :60] = t[:, :60].round()
    w = torch.randn(7, 301, generator=g, dtype=dtype)
    w[:, 40:50], w[:, 50:60], w[:, 60:70] = 0.0, -0.0, w[:, 60:70] * torch.finfo(dtype).tiny
    w[:, 70], w[:, 71] = float("inf"), -float("inf")
    expected = torch.where(w > 0, t, 1 - t)
    assert torch.equal(as_bits(fab_module._distance_to_face(t, w)), as_bits(expected))


@pytest.mark.parametrize("norm", ["L2", "L1"])
def test_projections_skip_the_still_mask_only_where_it_has_nothing_to_mask(norm, monkeypatch):
    """On the CPU a call whose weights all reach 1e-8 skips the passes that zero the coordinates staying put: the
    same bits as masking them; a call with a zero, tiny or NaN weight masks."""
    fab_module = importlib.import_module("rgb.attacks.fab")
    t, w, b = hyperplane_cases(12, n=8, dim=200)
    for weak in (0.0, 1e-9, float("nan")):
        assert fab_module._still(w.abs().index_fill(1, torch.tensor([3]), weak)) is not None
    w = torch.where(w.abs() < 1e-3, torch.full_like(w, 1e-3), w)
    assert fab_module._still(w.abs()) is None
    skipped = PROJECTIONS[norm](t, w, b)
    monkeypatch.setattr(fab_module, "_still", lambda magnitude: torch.ge(magnitude, 1e-8).logical_not_())
    assert torch.equal(as_bits(PROJECTIONS[norm](t, w, b)), as_bits(skipped))


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_fab_breaks_an_undefended_model_within_budget(toy, norm):
    model, x, y = toy
    eps = BREAKING_EPS[norm]
    result = fab_targeted(model, x, y, norm=norm, eps=eps)
    assert result.fooled.float().mean() >= 0.8
    assert_attack_invariants(model, x, y, result.x_adv, result.fooled, norm, eps)
    assert torch.all(result.norms[result.fooled] <= eps)


def fab_on_a_line(n_iter, alpha_max, eta, beta):
    """FAB-T's best norm on an affine classifier, in units of the exact minimal norm: with the box inactive every
    projection points the same way, so an iterate is a scalar r (0 = clean point, 1 = boundary)."""
    r, best = 0.0, float("inf")
    for _ in range(n_iter):
        alpha = min(abs(1 - r) / (abs(1 - r) + 1), alpha_max)
        r = (1 - alpha) * (r + eta * (1 - r)) + alpha * eta
        if r > 1:
            best, r = min(best, r), beta * r
    return best


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
@pytest.mark.parametrize("n_iter, alpha_max, eta, beta", [(100, 0.1, 1.05, 0.9), (7, 0.05, 1.3, 0.6)])
def test_fab_on_a_linear_classifier_follows_the_exact_iteration(norm, n_iter, alpha_max, eta, beta):
    """Two classes, affine logits, box inactive: the minimal norm is |margin| / ||w_y - w_other||_dual, and
    FAB-T's steps reduce to the scalar recursion above."""
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Flatten(), nn.Linear(48, 2))
    with torch.no_grad():  # boundary through the grey image, so the points below are close to it
        linear[1].bias.copy_(-0.5 * linear[1].weight.sum(dim=1))
    x = 0.5 + 0.01 * torch.randn(6, 3, 4, 4)
    logits = linear(x)
    y = logits.argmax(dim=1)
    normal = linear[1].weight[y] - linear[1].weight[1 - y]
    dual = {"Linf": 1, "L2": 2, "L1": float("inf")}[norm]
    margin = (logits.gather(1, y[:, None]) - logits.gather(1, 1 - y[:, None])).squeeze(1)
    exact = (margin / normal.norm(p=dual, dim=1)).detach()
    assert torch.all(exact * eta < 0.4)  # pixels stay within 0.5 +- 0.45: the box is never active
    result = fab_targeted(linear, x, y, norm=norm, eps=0.0, n_targets=1, n_iter=n_iter, alpha_max=alpha_max,
                          eta=eta, beta=beta)
    expected = fab_on_a_line(n_iter, alpha_max, eta, beta)
    torch.testing.assert_close(result.norms / exact, torch.full_like(exact, expected), rtol=1e-3, atol=0)


def test_fab_is_deterministic_across_seeds(toy):
    model, x, y = toy
    runs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        runs.append(fab_targeted(model, x, y, norm="L2", eps=0.8, n_targets=2, n_iter=20))
    assert torch.equal(runs[0].x_adv, runs[1].x_adv)
    assert torch.equal(runs[0].fooled, runs[1].fooled)
    assert torch.equal(runs[0].norms, runs[1].norms)


def test_early_stop_keeps_the_success_flags_and_saves_evaluations(toy):
    model, x, y = toy
    counters = {True: EvalCounter(), False: EvalCounter()}
    results = {stop: fab_targeted(model, x, y, norm="Linf", eps=0.075, n_targets=2, n_iter=20, early_stop=stop,
                                  counter=counters[stop]) for stop in (True, False)}
    assert 0 < results[True].fooled.sum() < len(y)
    assert torch.equal(results[True].fooled, results[False].fooled)
    assert torch.all(results[False].norms <= results[True].norms)
    assert counters[True].backward_rows < counters[False].backward_rows


class UnbreakableModel(nn.Module):
    """Constant logits (zero input gradient): FAB can never cross a boundary."""

    def __init__(self, n_classes=5):
        super().__init__()
        self.logits = nn.Parameter(torch.arange(n_classes, 0, -1).float())

    def forward(self, x):
        return self.logits + 0 * x.flatten(1).sum(dim=1, keepdim=True)


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_failed_points_are_returned_unchanged_and_evaluations_are_counted(norm):
    x, y = torch.rand(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)
    counter = EvalCounter()
    result = fab_targeted(UnbreakableModel(), x, y, norm=norm, eps=1.0, n_targets=3, n_iter=7, counter=counter)
    assert not result.fooled.any() and torch.equal(result.x_adv, x) and torch.all(result.norms == float("inf"))
    assert counter.backward_rows == 3 * 7 * 4
    assert counter.forward_rows == 4 + 3 * (2 * 7 * 4 + 4)  # clean pass; per target 2 per step + a re-check
    with_logits = EvalCounter()
    fab_targeted(UnbreakableModel(), x, y, norm=norm, eps=1.0, n_targets=3, n_iter=7, counter=with_logits,
                 clean_logits=UnbreakableModel()(x))
    assert with_logits.forward_rows == counter.forward_rows - 4


def test_misclassified_points_count_as_fooled_at_zero_norm(toy):
    model, x, y = toy
    wrong = (y + 1) % 10
    result = fab_targeted(model, x[:4], wrong[:4], norm="L2", eps=0.1, n_targets=2, n_iter=5)
    assert result.fooled.all() and torch.equal(result.x_adv, x[:4]) and torch.all(result.norms == 0)


def test_fab_leaves_model_mode_and_parameter_gradients_alone(toy):
    _, x, y = toy
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 10)).train()
    fab_targeted(model, x, y, norm="Linf", eps=0.05, n_targets=2, n_iter=5)
    assert model.training
    assert all(parameter.grad is None for parameter in model.parameters())


def test_fab_rejects_bad_arguments(toy):
    model, x, y = toy
    with pytest.raises(ValueError, match="norm"):
        fab_targeted(model, x, y, norm="L3", eps=0.1)
    with pytest.raises(ValueError, match="batch size"):
        fab_targeted(model, x, y[:3], norm="L2", eps=0.1)
    with pytest.raises(ValueError, match="n_targets"):
        fab_targeted(model, x, y, norm="L2", eps=0.1, n_targets=10)
    with pytest.raises(ValueError, match="beta"):
        fab_targeted(model, x, y, norm="L2", eps=0.1, beta=0.0)


# ---------------------------------------------------------------- untargeted FAB (the `plus` version)


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_closest_boundary_is_the_brute_force_nearest_class_of_a_linear_model(norm):
    """For logits Wx + c the boundary of class k is exactly linear: the choice is argmin |f_k| / ||w_k||_dual."""
    g = torch.Generator().manual_seed(3)
    linear = nn.Linear(12, 6)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(6, 12, generator=g))
    x, y = torch.rand(9, 12, generator=g), torch.randint(0, 6, (9,), generator=g)
    counter = EvalCounter()
    gap, grad = _closest_boundary(linear, x, y, norm, counter)
    dual = {"Linf": 1, "L2": 2, "L1": float("inf")}[norm]
    with torch.no_grad():
        logits = linear(x)
    weight = linear.weight.detach()
    for i in range(9):
        distance = {k: abs(float(logits[i, k] - logits[i, y[i]])) / float(
            torch.linalg.vector_norm(weight[k] - weight[y[i]], ord=dual)) for k in range(6) if k != y[i]}
        k = min(distance, key=distance.get)
        assert float(gap[i]) == pytest.approx(float(logits[i, k] - logits[i, y[i]]), abs=1e-5)
        torch.testing.assert_close(grad[i], weight[k] - weight[y[i]])
    assert (counter.forward_rows, counter.backward_rows) == (9, 9 * 6)  # one backward pass per class


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_untargeted_fab_breaks_an_undefended_model_within_budget(toy, norm):
    model, x, y = toy
    result = fab_untargeted(model, x, y, norm=norm, eps=BREAKING_EPS[norm], n_restarts=2, n_iter=30, generator=0)
    assert result.fooled.float().mean() >= 0.8
    assert_attack_invariants(model, x, y, result.x_adv, result.fooled, norm, BREAKING_EPS[norm])
    assert torch.all(result.norms[result.fooled] <= BREAKING_EPS[norm])


def test_untargeted_fab_restarts_are_seeded_and_only_attack_survivors(toy):
    model, x, y = toy
    runs = [fab_untargeted(model, x, y, norm="L2", eps=0.8, n_restarts=3, n_iter=15, generator=seed)
            for seed in (5, 5)]
    assert torch.equal(runs[0].x_adv, runs[1].x_adv) and torch.equal(runs[0].fooled, runs[1].fooled)
    one = EvalCounter()
    first = fab_untargeted(model, x, y, norm="L2", eps=0.8, n_restarts=1, n_iter=15, counter=one)
    assert torch.all(runs[0].fooled >= first.fooled)  # restart 0 is deterministic: later restarts only add
    more = EvalCounter()
    fab_untargeted(model, x, y, norm="L2", eps=0.8, n_restarts=3, n_iter=15, generator=5, counter=more)
    assert more.backward_rows - one.backward_rows <= 2 * 15 * 10 * int((~first.fooled).sum())


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_random_start_has_half_the_budget_and_stays_in_the_box(norm):
    x0 = torch.rand(16, 48, generator=torch.Generator().manual_seed(0))
    start = fab_random_start(x0, norm, 0.3, torch.Generator().manual_seed(1))
    assert torch.all((start >= 0) & (start <= 1))
    assert torch.all(lp_norm(start - x0, norm) <= 0.15 + 1e-6)  # 0.15 before the box clip, at most that after


def greedy_l1_by_full_sort(t, w, b):
    """Minimal-L1 step by the textbook greedy over the whole sorted row, in float64 (the reference's way)."""
    t, w, b = t.double(), w.double(), b.double()
    c = (w * t).sum(dim=1) - b
    w = w * torch.where(c < 0, -1.0, 1.0)[:, None]
    gap = c.abs()
    room = torch.where(w > 0, t, 1 - t)
    steps = torch.zeros_like(t)
    for row in range(t.shape[0]):
        left = float(gap[row])
        for i in w[row].abs().argsort(descending=True).tolist():
            if left <= 0 or abs(float(w[row, i])) < 1e-8:
                break
            move = min(float(room[row, i]), left / abs(float(w[row, i])))
            steps[row, i] = -torch.sign(w[row, i]) * move
            left -= abs(float(w[row, i])) * move
    return steps


@pytest.mark.parametrize("share", [0.001, 0.05, 0.3, 0.9])
def test_l1_projection_with_long_greedy_heads_matches_the_full_sort(share):
    """Gaps closed by a few, hundreds or thousands of coordinates: the head the projection looks at grows."""
    t, w, _ = hyperplane_cases(7, n=5, dim=3000)
    reachable = (w.abs() * torch.where(w > 0, 1 - t, t)).sum(dim=1)
    b = (w * t).sum(dim=1) + share * reachable
    d = fab_project_l1(t, w, b)
    expected = greedy_l1_by_full_sort(t, w, b)
    torch.testing.assert_close(lp_norm(d, "L1").double(), lp_norm(expected, "L1"), rtol=1e-5, atol=1e-6)
    # The partial move is the gap left after a float32 cumulative sum over up to thousands of moves.
    torch.testing.assert_close(d.double(), expected, rtol=0, atol=1e-4)


def test_l1_projection_off_its_head_is_minus_sign_of_the_flipped_w_times_zero_bit_for_bit():
    """Off the greedy's head FAB-L1's step is -sign(w') * 0 with w' = w flipped towards the hyperplane, written from
    w's rows: -0 where w' > 0, +0 where w' < 0 and -0 at zero weights of either sign, for both flips of a row."""
    t, w, _ = hyperplane_cases(4, n=8, dim=600)
    w = w[:4]
    w[:, 500:510], w[:, 510:520] = 0.0, -0.0
    w[:, 520:530] *= 1e-9  # below the weight floor, not zero
    tiled = w.repeat(2, 1)
    b = (tiled * t).sum(dim=1) + torch.tensor([1.0, -1.0]).repeat_interleave(4) * 0.05  # rows 0-3 and 4-7 flip apart
    d = fab_project_l1(t, w, b)
    flip = torch.where((tiled * t).sum(dim=1) < b, -1.0, 1.0)[:, None]
    zero = d == 0
    assert zero[:, 500:520].all() and zero.sum() > 0.8 * d.numel()
    assert torch.equal(as_bits(d[zero]), as_bits((torch.sign(tiled * flip) * -0.0)[zero]))


def test_l1_projection_whose_head_reaches_zero_weights_leaves_them_put():
    """The greedy reads the room of its head only. Rows whose gap needs every nonzero weight (unreachable ones, and
    ones closed by the last nonzero weights) take zero weights into the head: those stay put, tied magnitudes and
    points on the faces included, and the rest is the float64 greedy's step (the face vertex where unreachable)."""
    t, w, _ = hyperplane_cases(3, n=6, dim=500)
    w[:, 100:] = 0.0  # 400 zero weights: a head of 256 or more holds some
    w[:, :30] = w[:, :1]  # tied magnitudes
    t[:, 30:60] = t[:, 30:60].round()  # on the faces
    reachable = (w.abs() * torch.where(w > 0, 1 - t, t)).sum(dim=1)
    b = (w * t).sum(dim=1) + torch.tensor([2.0, 1.5, 1.0, 0.999, 0.99, 0.9]) * reachable
    for rows in (w, w[:3]):  # w once per row, and given once for two halves of t (FAB's iterate and start)
        tiled = rows.repeat(len(t) // len(rows), 1)
        d = fab_project_l1(t, rows, b)
        assert torch.equal(d[:, 100:], torch.zeros_like(d[:, 100:]))
        expected = greedy_l1_by_full_sort(t, tiled, b)
        torch.testing.assert_close(d.double(), expected, rtol=0, atol=1e-4)
        torch.testing.assert_close(lp_norm(d, "L1").double(), lp_norm(expected, "L1"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_fab_targets_side_by_side_give_the_same_flags(toy, norm):
    """FAB-T is deterministic and a point falls iff one of its targets succeeds: running the targets left side
    by side (tail_rows) keeps every flag; a robust point costs the same evaluations either way."""
    model, x, y = toy
    eps = {"Linf": 0.075, "L2": 0.8, "L1": 6.0}[norm]
    counters = {rows: EvalCounter() for rows in (0, 10_000)}
    results = {rows: fab_targeted(model, x, y, norm=norm, eps=eps, n_targets=3, n_iter=30, tail_rows=rows,
                                  counter=counters[rows]) for rows in counters}
    assert 0 < results[0].fooled.sum() < len(y)
    assert torch.equal(results[0].fooled, results[10_000].fooled)
    assert_attack_invariants(model, x, y, results[10_000].x_adv, results[10_000].fooled, norm, eps)
    x0, y0 = torch.rand(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)
    spent = []
    for rows in (0, 10_000):
        counter = EvalCounter()
        fab_targeted(UnbreakableModel(), x0, y0, norm=norm, eps=0.1, n_targets=3, n_iter=10, tail_rows=rows,
                     counter=counter)
        spent.append((counter.forward_rows, counter.backward_rows))
    assert spent[0] == spent[1]


def test_l1_projection_widens_its_head_only_for_the_rows_that_need_it_bit_for_bit(monkeypatch):
    """On the CPU the head of the greedy's order grows (256, then 1024 coordinates) only for the rows of w whose gap
    it does not close, or whose magnitudes tie before the coordinate that closes it (issue 54): every other row has
    one order up to there, so the step is the one of the wider selection for all rows, bit for bit."""
    t, w, _ = hyperplane_cases(11, n=8, dim=3000)
    w = w[:4]  # given once for two halves of t (FAB's iterate and start)
    w[1, w[1].abs().argsort(descending=True)[1:4]] = w[1].abs().max()  # ties at the top of row 1's order
    tiled = w.repeat(2, 1)
    reachable = (tiled.abs() * torch.where(tiled > 0, 1 - t, t)).sum(dim=1)
    share = torch.tensor([0.4, 0.01, 0.01, 0.02]).repeat(2)  # row 0 needs hundreds of coordinates, the others few
    b = (tiled * t).sum(dim=1) + share * reachable
    selections = []
    topk = torch.Tensor.topk

    def spy(values, k, *args, **kwargs):
        selections.append((values.shape[0], k))
        return topk(values, k, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "topk", spy)
    d = fab_project_l1(t, w, b)
    assert selections == [(4, 256), (2, 1024)]  # rows 0 (long gap) and 1 (tied) take the wider selection
    fab = importlib.import_module("rgb.attacks.fab")
    monkeypatch.setattr(fab, "_L1_HEAD", 1024)  # every row's head from the selection of 1024
    assert torch.equal(as_bits(d), as_bits(fab_project_l1(t, w, b)))
    expected = greedy_l1_by_full_sort(t, tiled, b)  # tied magnitudes may move in another order there: rows 1, 5
    untied = torch.tensor([0, 2, 3, 4, 6, 7])
    torch.testing.assert_close(d[untied].double(), expected[untied], rtol=0, atol=1e-4)
    torch.testing.assert_close(lp_norm(d, "L1").double(), lp_norm(expected, "L1"), rtol=1e-5, atol=1e-6)
