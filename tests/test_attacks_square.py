"""Square Attack (spec §5): schedules, proposals, budget invariants, determinism (spec §8 items 3, 5, 9)."""

import pytest
import torch
from torch import nn

from helpers import assert_attack_invariants

from rgb.attacks import EvalCounter, lp_norm, project_l1_ball_box
from rgb.attacks.common import AttackInputError
from rgb.attacks.square import square, square_p, square_pattern, square_window

NORM_TOLERANCE = {
    "Linf": lambda eps: eps + 1e-7,
    "L2": lambda eps: eps * (1 + 1e-5),
    "L1": lambda eps: eps * (1 + 1e-5),
}
# Square is a black-box search: on the toy MLP (minimal adversarial norms about 0.07 / 0.8 / 5.6) a few hundred
# queries break most points at roughly 3.5x those norms.
BREAKING_EPS = {"Linf": 0.25, "L2": 3.0, "L1": 20.0}

# Spec §5 table: iteration ranges, p, window side at 224x224 for Linf and for L2/L1.
SCHEDULE_224 = [
    ((0, 10), 0.8, 200, 201),
    ((11, 50), 0.4, 142, 143),
    ((51, 200), 0.2, 100, 101),
    ((201, 500), 0.1, 71, 71),
    ((501, 1000), 0.05, 50, 51),
    ((1001, 2000), 0.025, 35, 35),
    ((2001, 4000), 0.0125, 25, 25),
    ((4001, 4999), 0.00625, 18, 19),
]


@pytest.mark.parametrize("iterations, p, linf_side, l2_side", SCHEDULE_224)
def test_schedule_and_window_sides_reproduce_the_224_table(iterations, p, linf_side, l2_side):
    for i in iterations:
        assert square_p(i) == pytest.approx(p)
        assert square_window(square_p(i), 224, 224, "Linf") == linf_side
        assert square_window(square_p(i), 224, 224, "L2") == l2_side
        assert square_window(square_p(i), 224, 224, "l1") == l2_side


def test_schedule_keeps_halving_beyond_5000_queries():
    assert square_p(6000) == pytest.approx(0.8 / 128)
    assert square_p(8001) == pytest.approx(0.8 / 512)
    assert square_p(0, p_init=0.5) == 0.5


def test_window_side_bounds_on_small_and_non_square_images():
    assert square_window(1e-4, 8, 8, "Linf") == 1
    assert square_window(1e-4, 8, 8, "L2") == 3
    assert square_window(0.8, 8, 8, "L2") == 7  # round(sqrt(51.2)) = 7, already odd
    assert square_window(0.8, 8, 6, "L1") == 6  # 6 -> 7 (odd) -> capped at min(h, w)
    assert square_window(1.0, 8, 8, "Linf") == 8


def test_l2_pattern_by_hand_for_side_3():
    """Top row: pyramid over 1x3 (levels 1 + 1/4 at the centre, 1/4 outside); bottom: the 2x3 pyramid negated."""
    top = torch.tensor([[0.25, 1.25, 0.25]], dtype=torch.float64)
    bottom = torch.tensor([[0.25, 0.25, 0.25], [0.25, 1.25, 0.25]], dtype=torch.float64)
    expected = torch.cat([top / top.norm(), -bottom / bottom.norm()])
    torch.testing.assert_close(square_pattern(3, "L2"), expected / expected.norm())


@pytest.mark.parametrize("norm, order", [("L2", 2), ("L1", 1)])
@pytest.mark.parametrize("side", [1, 3, 7, 44, 201])
def test_patterns_have_unit_norm_and_opposite_halves(norm, order, side):
    pattern = square_pattern(side, norm)
    assert pattern.shape == (side, side)
    assert torch.linalg.vector_norm(pattern, ord=order) == pytest.approx(1.0)
    assert torch.all(pattern[: side // 2] > 0) and torch.all(pattern[side // 2:] < 0)
    if side % 2:  # odd sides (every step's window) are centred; even ones (the init blocks) peak right of centre
        torch.testing.assert_close(pattern, pattern.flip(1))


def test_l1_pattern_is_more_peaked_than_l2():
    l1, l2 = square_pattern(21, "L1"), square_pattern(21, "L2")
    assert l1[5, 10] / l1[0, 0] > 10 * l2[5, 10] / l2[0, 0]  # top-half centre over corner: 1/r^4 vs 1/r^2
    with pytest.raises(ValueError, match="L2 and L1"):
        square_pattern(5, "Linf")


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_square_breaks_an_undefended_model_within_budget(toy, norm):
    model, x, y = toy
    eps, n_queries = BREAKING_EPS[norm], 300
    result = square(model, x, y, norm=norm, eps=eps, n_queries=n_queries, generator=0)
    assert result.fooled.float().mean() >= 0.8
    assert_attack_invariants(model, x, y, result.x_adv, result.fooled, norm, eps)
    assert torch.all((result.n_queries_used >= 1) & (result.n_queries_used <= n_queries + 1))


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_failed_points_stay_within_budget_and_are_returned_unchanged(toy, norm):
    model, x, y = toy
    eps = BREAKING_EPS[norm] / 4
    counter = EvalCounter()
    result = square(model, x, y, norm=norm, eps=eps, n_queries=40, generator=1, counter=counter)
    assert not result.fooled.all()
    assert torch.equal(result.x_adv[~result.fooled], x[~result.fooled])
    assert torch.all(result.n_queries_used[~result.fooled] == 41)
    assert counter.forward_rows >= int(result.n_queries_used.sum()) and counter.backward_rows == 0


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
def test_fixed_seed_is_deterministic_and_early_stop_changes_nothing(toy, norm):
    model, x, y = toy
    eps = BREAKING_EPS[norm]
    first = square(model, x, y, norm=norm, eps=eps, n_queries=60, generator=3)
    again = square(model, x, y, norm=norm, eps=eps, n_queries=60, generator=torch.Generator().manual_seed(3))
    no_stop_counter = EvalCounter()
    no_stop = square(model, x, y, norm=norm, eps=eps, n_queries=60, generator=3, early_stop=False,
                     counter=no_stop_counter)
    other_seed = square(model, x, y, norm=norm, eps=eps, n_queries=60, generator=4)
    assert 0 < first.fooled.sum() < len(y)
    for run in (again, no_stop):
        assert torch.equal(run.x_adv, first.x_adv)
        assert torch.equal(run.fooled, first.fooled)
        assert torch.equal(run.n_queries_used, first.n_queries_used)
    assert no_stop_counter.forward_rows == len(y) * 61
    assert not torch.equal(other_seed.x_adv, first.x_adv)


class RecordingModel(nn.Module):
    """Records its inputs and always predicts class 0 by a wide margin."""

    def __init__(self):
        super().__init__()
        self.inputs = []

    def forward(self, x):
        self.inputs.append(x.clone())
        return torch.tensor([10.0, 0.0, 0.0]).expand(x.shape[0], 3)


def test_linf_stripes_and_one_window_with_shared_channel_signs():
    x, y, eps = torch.full((6, 3, 12, 10), 0.5), torch.zeros(6, dtype=torch.long), 0.1
    model = RecordingModel()
    result = square(model, x, y, norm="Linf", eps=eps, n_queries=1, generator=0)
    assert not result.fooled.any() and torch.equal(result.x_adv, x)
    start, candidate = model.inputs
    stripes = start - x
    assert torch.allclose(stripes.abs(), torch.tensor(eps))
    assert torch.equal(stripes, stripes[:, :, :1].expand_as(stripes))
    side = square_window(square_p(0), 12, 10, "Linf")
    changed = (candidate != start).any(dim=0).any(dim=0)
    rows, cols = changed.nonzero().unbind(1)
    assert rows.max() - rows.min() < side and cols.max() - cols.min() < side
    window = (candidate - x)[:, :, rows.min():rows.min() + 1, cols.min():cols.min() + 1].flatten(1)
    assert torch.allclose(window.abs(), torch.tensor(eps)) and torch.equal(window, window[:1].expand_as(window))


def test_points_fooled_at_the_start_cost_one_query():
    x, y = torch.rand(5, 3, 8, 8), torch.ones(5, dtype=torch.long)
    counter = EvalCounter()
    result = square(RecordingModel(), x, y, norm="L2", eps=0.5, n_queries=100, generator=0, counter=counter)
    assert result.fooled.all() and torch.all(result.n_queries_used == 1) and counter.forward_rows == 5
    assert torch.all(lp_norm(result.x_adv - x, "L2") <= 0.5 * (1 + 1e-5))


def test_square_rejects_bad_arguments():
    model, x, y = RecordingModel(), torch.rand(2, 3, 8, 8), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="N, C, H, W"):
        square(model, x.flatten(1), y, norm="Linf", eps=0.1)
    with pytest.raises(ValueError, match="at least 5x5"):
        square(model, x[..., :4, :4], y, norm="L1", eps=0.1)
    with pytest.raises(ValueError, match="p_init"):
        square(model, x, y, norm="L2", eps=0.1, p_init=0.0)
    with pytest.raises(AttackInputError, match=r"labels y of shape \(N,\) for 2 images, got \(1,\)"):
        square(model, x, y[:1], norm="L2", eps=0.1)
    for labels in (y[:, None], y[:1, None]):  # a column of labels would broadcast against the predictions
        with pytest.raises(AttackInputError, match="labels y of shape"):
            square(model, x[:len(labels)], labels, norm="L1", eps=0.1)


def test_l1_on_the_cpu_projects_over_the_support_with_the_whole_rows_results(toy, monkeypatch):
    """Square-L1 on the CPU projects each candidate over best's support and the rewritten window (issue 54), and
    finds best's support again after every accepted query: the same images, flags and queries as whole-row
    projections solving on the head, over a run that accepts and rejects, drops fooled rows and starts with windows
    too large for it."""
    import importlib

    square_module = importlib.import_module("rgb.attacks.square")
    from rgb.attacks import projections

    model, x, y = toy
    calls = []

    def counted(*args):
        calls.append(args[0].shape[1])
        return projections.project_l1_values(*args)

    monkeypatch.setattr(square_module, "project_l1_values", counted)
    monkeypatch.setattr(square_module, "_SUPPORT_MOST", 100)  # 3x8x8 images: the first windows exceed it
    # whole rows of 192 pixels solve on the head's breakpoints too (as rows of 3x32x32 do; by default they bisect)
    monkeypatch.setattr(projections, "_HEAD_SHARE", 1.0)
    on_support = square(model, x, y, norm="L1", eps=10.0, n_queries=300, generator=5)
    assert 0 < len(calls) < 300 and max(calls) <= 100
    monkeypatch.setattr(square_module, "_SUPPORT_MOST", 0)
    whole_rows = square(model, x, y, norm="L1", eps=10.0, n_queries=300, generator=5)
    assert 0 < on_support.fooled.sum() < len(y)
    for field in ("x_adv", "fooled", "n_queries_used"):
        assert torch.equal(getattr(on_support, field), getattr(whole_rows, field))


@pytest.mark.parametrize("seed, eps", [(0, 0.5), (1, 3.0), (2, 12.0), (3, 400.0)])
def test_l1_candidate_from_the_cached_support_is_the_projected_image_bit_for_bit(seed, eps):
    """Square-L1's CPU candidate (issue 54; `proposals`, not the whole rows' `propose`) is `start` with the projected
    values of best's cached support and the first window written in: the bits of the whole image's projection (on its
    head, as the support is small) plus x, clipped, with padding, tied magnitudes, pixels at box faces, x = -0, and
    windows that cover best's support and each other."""
    import importlib

    square_module = importlib.import_module("rgb.attacks.square")
    from rgb.attacks.common import LiveRows

    g = torch.Generator().manual_seed(seed)
    n, c, h, w, side = 6, 3, 32, 32, 5  # 3x32x32: under 192 pixels the support is projected on its own
    d = c * h * w
    x = torch.randint(0, 65, (n, c, h, w), generator=g) / 64  # a grid: exact ties, both box faces
    x = torch.where((x == 0) & (torch.rand(x.shape, generator=g) < 0.5), -0.0, x)
    best = x.clone()
    for row in range(n):
        pixels = torch.randperm(d, generator=g)[:int(torch.randint(0, 90, (), generator=g))]
        best.view(n, -1)[row, pixels] += torch.randint(-8, 9, (len(pixels),), generator=g) / 16
    best.clamp_(0.0, 1.0)
    centre = torch.nonzero(best[0] != x[0])[0].tolist() if bool((best[0] != x[0]).any()) else [0, 10, 10]
    top, left = min(centre[1], h - side), min(centre[2], w - side)
    windows = [(..., slice(top, top + side), slice(left, left + side)),
               (..., slice(top + 2, top + 2 + side), slice(left + 1, left + 1 + side))]
    geometry = square_module._SquareL1()
    draw = geometry.draws(torch.rand(1, 5 + n * c, generator=g), n, c, eps)[0]
    rows = {"x": x, "best": best}
    geometry.prepare(rows, eps)
    state = LiveRows(rows, outputs=("best",))
    candidate = next(geometry.proposals(state, range(1), [draw], [windows], [side], eps))

    delta = geometry.direction(state, draw, windows, side, eps)
    rewritten = torch.arange(d).view(c, h, w)[windows[0]].reshape(-1)
    support = square_module._nonzero_columns((best - x).flatten(1))
    assert support.shape[1] + len(rewritten) < d // 16  # the support path, not whole rows
    expected = project_l1_ball_box(x, delta, eps * square_module._L1_SHRINK).add_(x).clamp_(0.0, 1.0)
    assert torch.equal(candidate.view(torch.int32), expected.view(torch.int32))
    assert not torch.equal(candidate, state["start"])


def _rewrite_before_issue_54(geometry, state, draw, windows, side):
    """Square-L2/L1's window rewrite as written before issue 54's runs (96b0989): the oriented pattern made by
    `torch.where` (column-major in memory whichever way it is oriented), the windows as slices."""
    import importlib

    square_module = importlib.import_module("rgb.attacks.square")
    transposed, signs = draw
    signs = signs[state.positions] if len(state) < len(signs) else signs
    made = square_module.square_pattern(side, geometry.norm).to(state["x"])
    pattern = torch.where(torch.tensor(transposed), made.T, made)
    first, second = windows
    delta = state["delta"]
    first_mass = geometry.mass(delta[first])
    windows_mass = first_mass + geometry.mass(delta[second])
    overlap = square_module._overlap(first, second)
    if overlap is not None:
        windows_mass = (windows_mass - geometry.mass(delta[overlap])).clamp_min_(0.0)
    proposal = pattern * signs + delta[first] / (geometry.norm_of_mass(first_mass) + 1e-12)
    target = geometry.window_norm(state["share"], windows_mass)
    return proposal / (geometry.channel_norms(proposal) + 1e-12) * target


@pytest.mark.parametrize("norm", ["L2", "L1"])
def test_queries_proposed_together_get_the_bits_each_gets_alone(norm):
    """Square-L2/L1 rewrite one query's windows with the bits they had before issue 54 (`rewrite`), Square-L1 those of
    a run of queries of one side in one pass with the bits of each alone (`rewrites`), and Square-L1 on the CPU
    projects them in one pass (issue 54): each query's window content and candidate are bit for bit those of the
    query proposed alone, with both pattern orientations, overlapping windows and rows that have left the batch."""
    import importlib

    square_module = importlib.import_module("rgb.attacks.square")
    from rgb.attacks.common import LiveRows

    g = torch.Generator().manual_seed(7)
    n, c, h, w, count = 7, 3, 32, 32, 12
    eps = {"L2": 1.0, "L1": 12.0}[norm]
    x = torch.rand(n, c, h, w, generator=g)
    geometry = square_module._SQUARE_NORMS[square_module.parse_norm(norm)]()
    best = geometry.init(x, eps, g)
    if norm == "L1":  # a best of tens of pixels, as Square-L1's bests are once the windows are small
        sparse = torch.rand(n, c, h, w, generator=g) < 0.01
        best = torch.where(sparse, (x + torch.randn(n, c, h, w, generator=g) / 4).clamp(0.0, 1.0), x)
    rows = {"x": x, "best": best}
    geometry.prepare(rows, eps)
    state = LiveRows(rows, outputs=("best",))
    state.keep(torch.arange(n) != 2)  # a row has left: the draws are still shaped for the whole batch
    uniforms = torch.rand(count, geometry.uniforms_per_query(n, c), generator=g)
    for side in (3, 5, 13):
        windows = square_module._windows(uniforms, [side] * count, h, w, 2)
        top, left = (min(corner.start, h - side - 1) for corner in windows[0][0][1:])
        windows[0] = [(..., slice(top, top + side), slice(left, left + side)),  # windows that overlap
                      (..., slice(top + 1, top + 1 + side), slice(left + 1, left + 1 + side))]
        draws = geometry.draws(uniforms, n, c, eps)
        assert len({flag for flag, _ in draws}) == 2
        geometry.know_best(state, eps)
        for query in range(count):  # one query against the formula as the reference's order has it (96b0989)
            assert torch.equal(geometry.rewrite(state, draws[query], windows[query], side),
                               _rewrite_before_issue_54(geometry, state, draws[query], windows[query], side))
        if norm == "L1":
            together = geometry.rewrites(state, draws, windows, side,
                                         square_module._window_planes(windows, side, w, x.device))
            for query in range(count):
                assert torch.equal(together[query], geometry.rewrite(state, draws[query], windows[query], side))
        if norm == "L1" and side < 13:  # the CPU's support path: all candidates from one projection
            assert square_module.solved_on_the_head(c * h * w, state["support"].shape[1] + c * side * side)
            together = [candidate.clone() for candidate in geometry.proposals(state, range(count), draws, windows,
                                                                              [side] * count, eps)]
            for query in range(count):
                alone = next(geometry.proposals(state, range(query, query + 1), draws, windows, [side] * count, eps))
                assert torch.equal(together[query].view(torch.int32), alone.view(torch.int32))


def test_a_candidate_is_kept_below_the_bar_exactly_when_spec_rule_keeps_it():
    """Square's loop keeps a candidate margin m iff m < bar (issue 54: one comparison per query, the bar made when a
    margin changes), which is spec §5's rule `attacking and (m < margin or m <= 0)` for every pair of values,
    signed zeros, infinities and NaN included; `attacking` is the still-robust rows (margin > 0)."""
    import importlib

    square_module = importlib.import_module("rgb.attacks.square")
    values = torch.tensor([float("-inf"), -1.0, -0.0, 0.0, 1e-30, 0.5, 1.0, float("inf"), float("nan")])
    margin, candidate = (grid.flatten() for grid in torch.meshgrid(values, values, indexing="ij"))
    attacking, bar = square_module._bar(margin)
    assert torch.equal(attacking, margin > 0)
    assert torch.equal(candidate < bar, attacking & ((candidate < margin) | (candidate <= 0)))
