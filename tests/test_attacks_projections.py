"""Projections onto Lp-ball ∩ [0,1] box (spec §8 item 1) and the shared norm helpers."""

import pytest
import torch

from rgb.attacks import EvalCounter, lp_norm, parse_norm, project_l1_ball_box, project_l2, project_linf
from rgb.attacks.common import kth_largest, largest_first


def random_case(seed, n=16, shape=(3, 8, 8), eps_range=(0.05, 20.0)):
    """Images with exact 0/1 pixels and deltas with exact zeros and box-violating entries."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, *shape, generator=g)
    x = torch.where(torch.rand(x.shape, generator=g) < 0.15, torch.round(x), x)
    delta = torch.randn(n, *shape, generator=g) * torch.rand(n, 1, 1, 1, generator=g) * 0.6
    delta = torch.where(torch.rand(x.shape, generator=g) < 0.15, torch.zeros_like(delta), delta)
    low, high = eps_range
    eps = low + (high - low) * torch.rand(n, generator=g)
    return x, delta, eps


def float64_root(magnitude, room, eps):
    """The threshold by a 200-step float64 bisection of the mass (spec §8 item 1's brute force), (N, 1)."""
    magnitude, room, eps = magnitude.double(), room.double(), eps.double().view(-1, 1)
    lo, hi = torch.zeros_like(eps), magnitude.amax(dim=1, keepdim=True)
    for _ in range(200):
        mid = (lo + hi) / 2
        above = torch.minimum((magnitude - mid).clamp_min(0), room).sum(dim=1, keepdim=True) > eps
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return hi


def reference_l1_projection(x, delta, eps):
    """Float64 brute force: bisection on lambda (many steps) with the closed form of spec §3.3."""
    x, delta = x.double().flatten(1), delta.double().flatten(1)
    magnitude = delta.abs()
    room = torch.minimum(magnitude, torch.where(delta > 0, 1 - x, x))
    eps = torch.as_tensor(eps, dtype=torch.float64).expand(x.shape[0]).reshape(-1, 1)
    lam = torch.where(room.sum(dim=1, keepdim=True) > eps, float64_root(magnitude, room, eps), 0.0)
    return torch.sign(delta) * torch.minimum((magnitude - lam).clamp_min(0), room)


@pytest.mark.parametrize("seed", range(4))
def test_l1_projection_matches_float64_reference(seed):
    x, delta, eps = random_case(seed)
    projected = project_l1_ball_box(x, delta, eps)
    assert projected.dtype == torch.float32 and projected.shape == delta.shape
    expected = reference_l1_projection(x, delta, eps)
    torch.testing.assert_close(projected.double().flatten(1), expected, atol=2e-6, rtol=0)


def test_l1_projection_budget_box_zeros_and_idempotence():
    x, delta, eps = random_case(10, n=32, eps_range=(0.01, 5.0))
    projected = project_l1_ball_box(x, delta, eps)
    assert torch.all(lp_norm(projected, "L1") <= eps * (1 + 1e-5))
    assert torch.all((x + projected >= 0) & (x + projected <= 1))
    assert torch.all(projected[delta == 0] == 0)
    assert torch.all(torch.sign(projected) * torch.sign(delta) >= 0)
    torch.testing.assert_close(project_l1_ball_box(x, projected, eps), projected, atol=1e-6, rtol=0)


def test_l1_projection_leaves_feasible_points_unchanged():
    x, delta, _ = random_case(11)
    feasible = (x + delta).clamp(0, 1) - x
    eps = lp_norm(feasible, "L1") * 1.01
    assert torch.equal(project_l1_ball_box(x, feasible, eps), feasible)


def test_l1_projection_scalar_eps_zero_eps_and_zero_delta():
    x, delta, _ = random_case(12, n=4)
    by_row = project_l1_ball_box(x, delta, torch.full((4,), 1.5))
    torch.testing.assert_close(project_l1_ball_box(x, delta, 1.5), by_row)
    assert torch.all(project_l1_ball_box(x, delta, 0.0) == 0)
    assert torch.all(project_l1_ball_box(x, torch.zeros_like(delta), 1.0) == 0)


def test_l1_projection_no_feasible_point_is_closer():
    x, delta, eps = random_case(13, n=8, shape=(2, 4, 4), eps_range=(0.05, 2.0))
    projected = project_l1_ball_box(x, delta, eps).double()
    g = torch.Generator().manual_seed(0)
    best = (projected - delta.double()).flatten(1).norm(dim=1)
    for _ in range(200):
        # Random box-feasible points scaled into the L1 ball (0 is feasible, the set is convex),
        # then also points near the answer on the segment towards them.
        other = torch.rand(x.shape, generator=g, dtype=torch.float64) * 1.0 - x.double()
        other = other * (eps.double() / lp_norm(other, "L1").clamp_min(1e-12)).clamp(max=1.0).view(-1, 1, 1, 1)
        for step in (1.0, 1e-2):
            candidate = projected + step * (other - projected)
            distance = (candidate - delta.double()).flatten(1).norm(dim=1)
            assert torch.all(distance >= best - 1e-6)


def test_l1_projection_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="same shape"):
        project_l1_ball_box(torch.zeros(2, 3), torch.zeros(2, 4), 1.0)


@pytest.mark.parametrize("norm, project", [("Linf", project_linf), ("L2", project_l2)])
def test_linf_l2_projection_budget_box_idempotence(norm, project):
    x, delta, eps = random_case(20, eps_range=(0.01, 1.0))
    projected = project(x, x + 3 * delta, eps)
    slack = eps + 1e-7 if norm == "Linf" else eps * (1 + 1e-5)
    assert torch.all(lp_norm(projected - x, norm) <= slack)
    assert torch.all((projected >= 0) & (projected <= 1))
    torch.testing.assert_close(project(x, projected, eps), projected, atol=1e-6, rtol=0)
    inside = (x + delta * 1e-3).clamp(0, 1)
    assert torch.equal(project(x, inside, lp_norm(inside - x, norm) * 1.01 + 1e-6), inside)


def test_linf_projection_is_clip():
    x = torch.tensor([[0.5, 0.02, 0.99]])
    x_adv = torch.tensor([[0.9, -0.5, 0.5]])
    assert torch.allclose(project_linf(x, x_adv, 0.1), torch.tensor([[0.6, 0.0, 0.89]]))


def test_l2_projection_rescales_then_clips():
    x = torch.tensor([[0.5, 0.5]])
    projected = project_l2(x, torch.tensor([[0.5 + 3.0, 0.5 + 4.0]]), 0.5)
    assert torch.allclose(projected, torch.tensor([[0.8, 0.9]]))


def test_parse_norm_and_lp_norm():
    assert [parse_norm(n) for n in ("linf", "LINF", "l2", "L1")] == ["Linf", "Linf", "L2", "L1"]
    for bad in ("L3", "inf", None):
        with pytest.raises(ValueError, match="norm must be one of"):
            parse_norm(bad)
    delta = torch.tensor([[3.0, -4.0], [0.0, 0.0]])
    assert torch.equal(lp_norm(delta, "linf"), torch.tensor([4.0, 0.0]))
    assert torch.equal(lp_norm(delta, "L2"), torch.tensor([5.0, 0.0]))
    assert torch.equal(lp_norm(delta, "l1"), torch.tensor([7.0, 0.0]))


def test_eval_counter():
    counter = EvalCounter()
    counter.forward(8)
    counter.forward(4)
    counter.backward(4)
    assert (counter.forward_rows, counter.backward_rows) == (12, 4)
    assert counter.per_image(4) == {"forward": 3.0, "backward": 1.0}
    with pytest.raises(ValueError, match="n_images"):
        counter.per_image(0)


def test_live_rows_write_dropped_rows_when_they_leave_and_the_rest_at_sync():
    """`LiveRows.keep` writes only the rows it drops into the results (issue 54: a check that drops nothing, most of
    Square's every-10-queries checks, copies nothing); `sync` brings every row up to date."""
    from rgb.attacks.common import LiveRows

    rows = LiveRows({"value": torch.arange(6.0)}, outputs=("value",))
    rows["value"] = rows["value"] + 10
    assert rows.keep(torch.ones(6, dtype=torch.bool)) == 6
    assert torch.equal(rows.results["value"], torch.arange(6.0))  # nothing dropped: nothing written yet
    assert rows.keep(torch.tensor([True, False, True, True, False, True])) == 4
    assert torch.equal(rows.results["value"], torch.tensor([0.0, 11, 2, 3, 14, 5]))
    rows["value"] = rows["value"] + 100
    assert rows.keep(torch.tensor([False, True, True, False])) == 2
    assert torch.equal(rows.positions, torch.tensor([2, 3]))
    assert torch.equal(rows.sync()["value"], torch.tensor([110.0, 11, 112, 113, 14, 115]))


@pytest.mark.parametrize("largest", [1, 63, 64, 65, 300, 1000, 3000])
def test_kth_largest_matches_a_full_sort(largest):
    g = torch.Generator().manual_seed(largest)
    values = torch.rand(6, 3000, generator=g).round(decimals=2)  # many ties
    k = torch.randint(1, largest + 1, (6,), generator=g)
    k[0] = largest  # the head must grow to the largest k
    expected = values.sort(dim=1).values.gather(1, (3000 - k)[:, None])
    assert torch.equal(kth_largest(values, k), expected)


def test_largest_first_grows_the_head_until_it_is_enough():
    values = torch.rand(3, 1000, generator=torch.Generator().manual_seed(0))
    widths = []

    def enough(top, order):
        widths.append(top.shape[1])
        assert torch.equal(top, values.gather(1, order)) and torch.all(top[:, :-1] >= top[:, 1:])
        return top.shape[1] >= 200

    top, order = largest_first(values, enough)
    assert widths == [64, 256] and top.shape == (3, 256)
    assert torch.equal(top, values.sort(dim=1, descending=True).values[:, :256])
    assert largest_first(values, lambda top, order: False)[0].shape == (3, 1000)  # never more than the row
    widths.clear()
    assert largest_first(values, enough, first=256)[0].shape == (3, 256) and widths == [256]  # a caller's first head


@pytest.mark.parametrize("moving", [5, 100, 2000])
def test_l1_projection_of_sparse_and_dense_moves_matches_float64_reference(moving):
    """A few large entries over many small ones (the attacks' case: the head of each row's order decides the
    threshold) and dense moves (whole rows bisected) agree with the brute force alike."""
    g = torch.Generator().manual_seed(moving)
    x = torch.rand(6, 3, 32, 32, generator=g)
    delta = 1e-3 * torch.randn(x.shape, generator=g)
    big = torch.rand(6, 3 * 32 * 32, generator=g).argsort(dim=1)[:, :moving]
    delta.view(6, -1).scatter_(1, big, torch.randn(6, moving, generator=g))
    eps = 0.3 * lp_norm(delta, "L1")
    projected = project_l1_ball_box(x, delta, eps)
    torch.testing.assert_close(projected.double().flatten(1), reference_l1_projection(x, delta, eps), atol=2e-6,
                               rtol=0)
    assert torch.all(lp_norm(projected, "L1") <= eps * (1 + 1e-5))


def test_kth_largest_is_the_sorted_rows_entry_whichever_selection_runs():
    """APGD-L1's top-q threshold: one quickselect where every row wants the same k, one topk otherwise (issue 54):
    the value at sorted position k - 1, bit for bit, ties included."""
    values = torch.rand(5, 300, generator=torch.Generator().manual_seed(0)).round(decimals=2)  # many ties
    ordered = values.sort(dim=1, descending=True)[0]
    for k in (torch.full((5,), 37), torch.tensor([1, 300, 64, 65, 200])):
        assert torch.equal(kth_largest(values, k), ordered.gather(1, (k - 1)[:, None]))
    assert kth_largest(values[:0], k[:0]).shape == (0, 1)


def test_kth_largest_of_a_few_looks_at_the_blocks_with_the_largest_maxima_only(monkeypatch):
    """APGD-L1's top-q threshold wants the 3rd to 21st largest of 3072 (issue 54): on the CPU the selections run over
    the entries of the blocks with the largest maxima, never a whole row, and give the sorted row's entry bit for bit:
    top entries crowded into one block, maxima tied across blocks, ties at the k-th, one k or several."""
    g = torch.Generator().manual_seed(3)
    values = torch.rand(6, 3072, generator=g).round(decimals=3)  # many ties
    values[0, 5::192][:12] = 2.0 + torch.arange(12.0)  # row 0's top 12 in one block (entries 5, 197, 389, ...)
    values[1, ::97] = 1.5  # equal maxima across blocks
    values[2, :40] = 1.25  # the k-th largest tied with many
    ordered = values.sort(dim=1, descending=True)[0]
    widths = []
    for name in ("topk", "kthvalue"):
        select = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda v, *a, select=select, **kw: widths.append(v.shape[1])
                            or select(v, *a, **kw))
    for k in (torch.tensor([12, 3, 21, 7, 1, 48]), torch.full((6,), 13), torch.tensor([1, 2, 40, 4, 5, 6])):
        assert torch.equal(kth_largest(values, k), ordered.gather(1, (k - 1)[:, None]))
    assert widths and max(widths) < values.shape[1]


def test_l1_projection_inside_the_ball_is_the_box_clip_without_a_selection(monkeypatch):
    """Rows whose box-clipped delta already fits the budget need no threshold (issue 54): the projection is then
    sign(delta) * min(|delta|, room) bit for bit, and neither the head selection nor the bisection runs."""
    import rgb.attacks.projections as projections

    x, delta, _ = random_case(14, n=6, shape=(3, 32, 32))
    delta = delta * 3  # many entries leave the box
    room = torch.minimum(delta.abs(), torch.where(delta > 0, 1 - x, x)).flatten(1)
    eps = room.sum(dim=1) * 1.01
    expected = (torch.sign(delta.flatten(1)) * room).view_as(delta)

    def refuse(*args, **kwargs):
        raise AssertionError("no selection or bisection inside the ball")

    monkeypatch.setattr(projections, "largest_first", refuse)
    monkeypatch.setattr(projections, "_l1_bisection", refuse)
    monkeypatch.setattr(projections, "_l1_breakpoints", refuse)
    assert torch.equal(project_l1_ball_box(x, delta, eps), expected)


def test_l1_mass_into_a_scratch_tensor_is_bit_for_bit():
    """The bisection's masses are written into one scratch tensor (issue 54): the same bits as the plain formula."""
    from rgb.attacks.projections import _l1_mass

    g = torch.Generator().manual_seed(3)
    magnitude, room = torch.rand(8, 500, generator=g), torch.rand(8, 500, generator=g)
    lam = torch.rand(8, 1, generator=g)
    scratch = torch.empty_like(magnitude)
    plain = torch.minimum((magnitude - lam).clamp_min(0.0), room).sum(dim=1, keepdim=True)
    assert torch.equal(_l1_mass(magnitude, room, lam, scratch), plain)
    assert torch.equal(_l1_mass(magnitude, room, lam), plain)


@pytest.mark.parametrize("seed", range(3))
def test_l1_breakpoint_solver_finds_the_float64_root_with_ties_and_saturated_rooms(seed):
    """The sorted-breakpoint solver (issue 54) against a float64 bisection: rows with many tied magnitudes, rooms
    of 0 (coordinates at a box face), whole rooms (inside the box) and partial ones, eps anywhere below the row's
    whole room; within float32 resolution of the largest magnitude."""
    from rgb.attacks.projections import _l1_breakpoints

    g = torch.Generator().manual_seed(seed)
    magnitude = torch.rand(40, 64, generator=g).round(decimals=1 + seed % 2)  # ties, some exact zeros
    kind = torch.randint(0, 3, magnitude.shape, generator=g)
    room = torch.where(kind == 0, 0.0, torch.where(kind == 1, magnitude, magnitude * torch.rand(40, 64, generator=g)))
    eps = room.sum(dim=1) * torch.rand(40, generator=g).clamp_min(0.01)
    lam = _l1_breakpoints(magnitude, room, eps.view(-1, 1))
    assert lam.dtype == torch.float32 and lam.shape == (40, 1)
    torch.testing.assert_close(lam.double(), float64_root(magnitude, room, eps), atol=2e-7, rtol=0)


def test_l1_breakpoint_solver_keeps_rooms_far_below_a_float32_step_of_their_magnitude():
    """A coordinate 1e-9 from the face it points at, |delta| 0.9: in float32, a_i - c_i rounds back to a_i and the
    room dropped out of the mass, so the solver returned lam 0 and the projection kept twice the budget (review of
    issue 54's solver). In float64 the rooms count, and the projection stays inside the ball."""
    x = torch.full((4, 3, 32, 32), 0.5)
    delta = torch.zeros_like(x)
    x.view(4, -1)[:, :100], delta.view(4, -1)[:, :100] = 1e-9, -0.9
    eps = torch.full((4,), 5e-8)
    v = project_l1_ball_box(x, delta, eps)
    assert (v.flatten(1).abs().sum(dim=1) <= eps * (1 + 1e-5)).all()
    # within float32 resolution of |delta| (a_i - lam is taken in float32: 5e-10 of 0.9 rounds to 0, as it did before)
    torch.testing.assert_close(v.double().flatten(1), reference_l1_projection(x, delta, eps), atol=1e-7, rtol=0)


def test_l1_projection_on_the_cpu_head_uses_the_breakpoints_and_matches_float64_reference(monkeypatch):
    """Square-L1's case (few large entries, many of them leaving the box, tied magnitudes): the threshold comes from
    the sorted head's breakpoints, never a bisection, and the projection matches the float64 brute force."""
    import rgb.attacks.projections as projections

    def refuse(*args, **kwargs):
        raise AssertionError("the sparse case solves on the head's breakpoints")

    monkeypatch.setattr(projections, "_l1_bisection", refuse)
    g = torch.Generator().manual_seed(7)
    x = torch.rand(8, 3, 32, 32, generator=g)
    x = torch.where(torch.rand(x.shape, generator=g) < 0.3, torch.round(x), x)  # at box faces: rooms of 0
    delta = 1e-3 * torch.randn(x.shape, generator=g)
    big = torch.rand(8, 3 * 32 * 32, generator=g).argsort(dim=1)[:, :40]
    delta.view(8, -1).scatter_(1, big, torch.randint(-4, 5, (8, 40), generator=g) * 0.25)  # ties, out of the box
    eps = 0.4 * lp_norm((x + delta).clamp(0, 1) - x, "L1")
    projected = project_l1_ball_box(x, delta, eps)
    torch.testing.assert_close(projected.double().flatten(1), reference_l1_projection(x, delta, eps), atol=2e-6,
                               rtol=0)
    assert torch.all(lp_norm(projected, "L1") <= eps * (1 + 1e-5))


@pytest.mark.parametrize("seed", range(3))
def test_l1_projection_of_known_pixels_equals_the_whole_row_projection(seed):
    """Square-L1's projection of the pixels it knows can be nonzero (issue 54): their values gathered by indices
    padded with D (unordered, padding anywhere, rows of different counts, pixels at box faces, tied magnitudes),
    projected and scattered back, are the bits of `project_l1_ball_box` on the whole rows, which scans them for the
    head instead."""
    from rgb.attacks.projections import project_l1_values, solved_on_the_head

    g = torch.Generator().manual_seed(seed)
    n, d = 7, 3 * 32 * 32  # rows whose head the whole-row projection solves on breakpoints too
    x = torch.rand(n, 3, 32, 32, generator=g)
    x = torch.where(torch.rand(x.shape, generator=g) < 0.2, torch.round(x), x)
    delta = torch.zeros_like(x)
    counts = torch.randint(0, 100, (n,), generator=g)
    support = torch.full((n, 110), d)
    for row, count in enumerate(counts.tolist()):
        pixels = torch.randperm(d, generator=g)[:count]
        delta.view(n, -1)[row, pixels] = torch.randint(-6, 7, (count,), generator=g) * 0.05  # ties, zeros
        support[row, torch.randperm(110, generator=g)[:count]] = pixels
    eps = torch.rand(n, generator=g) * lp_norm(delta, "L1")
    eps[0] = lp_norm(delta, "L1")[0] * 2  # inside the ball
    assert solved_on_the_head(d, support.shape[1])  # where Square-L1 takes the support (else whole rows bisect)
    assert not solved_on_the_head(d, d // 16) and not solved_on_the_head(3 * 8 * 8, 10)
    padding = torch.zeros(n, 1)
    values = project_l1_values(torch.cat((x.flatten(1), padding), dim=1).gather(1, support),
                               torch.cat((delta.flatten(1), padding), dim=1).gather(1, support), eps)
    projected = torch.zeros(n, d + 1).scatter_(1, support, values)[:, :-1].reshape(x.shape)
    assert torch.equal(projected, project_l1_ball_box(x, delta, eps))


@pytest.mark.parametrize("seed", range(4))
def test_l1_projection_of_rows_within_the_first_head_equals_the_whole_row_solve(seed, monkeypatch):
    """APGD-L1's steps change tens of pixels (issue 54): rows whose nonzeros all fit in the CPU's first head are
    projected on that head alone, bit for bit what the whole rows give (0 to 64 nonzeros and past them, ties, signed
    zeros, pixels at box faces, rows inside the ball and far outside it)."""
    import rgb.attacks.projections as projections

    g = torch.Generator().manual_seed(seed)
    n, d = 9, 3 * 32 * 32
    x = torch.rand(n, 3, 32, 32, generator=g)
    x = torch.where(torch.rand(x.shape, generator=g) < 0.2, torch.round(x), x)
    x[2] = 0.5  # far from the box faces: row 2's rooms are its magnitudes
    delta = torch.zeros_like(x)
    delta.view(n, -1)[:, :5] = -0.0
    counts = torch.randint(0, 65, (n,), generator=g)
    counts[:3] = torch.tensor([0, 64, projections._FIRST_HEAD + (seed % 2)])  # the last is past the head on odd seeds
    for row, count in enumerate(counts.tolist()):
        pixels = torch.randperm(d, generator=g)[:count]
        values = torch.randint(-6, 7, (count,), generator=g) * 0.05  # ties, zeros
        delta.view(n, -1)[row, pixels] = values.abs() + 0.05 if row == 2 else values  # row 2: all nonzero
    eps = torch.rand(n, generator=g) * lp_norm(delta, "L1")
    eps[3], eps[4] = lp_norm(delta, "L1")[3] * 2, 1e-6  # inside the ball; a tiny budget
    first_head, ran = projections._project_on_first_head, []

    def spy(*args):
        ran.append(first_head(*args) is not None)
        return first_head(*args)

    def both(expect_the_head):
        ran.clear()
        monkeypatch.setattr(projections, "_project_on_first_head", spy)
        on_the_head = project_l1_ball_box(x, delta, eps)
        assert ran == [expect_the_head]
        monkeypatch.setattr(projections, "_project_on_first_head", lambda *args: None)
        whole_rows = project_l1_ball_box(x, delta, eps)
        assert torch.equal(on_the_head, whole_rows)
        assert torch.equal(torch.signbit(on_the_head), torch.signbit(whole_rows))

    both(expect_the_head=seed % 2 == 0)
    eps[2] = 0.99 * lp_norm(delta, "L1")[2]  # row 2's root below its smallest magnitude: the whole rows' head grows
    both(expect_the_head=False)


@pytest.mark.parametrize("seed", range(4))
def test_l1_projection_on_a_head_narrower_than_the_first_equals_the_whole_row_solve(seed, monkeypatch):
    """Rows of at most k < 64 nonzeros are solved on a head of k (issue 54: a cheaper selection), bit for bit what
    the whole rows give; a row whose rooms sum to its budget within float rounding leaves the narrow head's check
    unsure, and the 64-wide head decides as the whole rows' solve does."""
    import rgb.attacks.projections as projections

    g = torch.Generator().manual_seed(seed)
    n, d = 8, 3 * 32 * 32
    x = torch.rand(n, 3, 32, 32, generator=g)
    x = torch.where(torch.rand(x.shape, generator=g) < 0.2, torch.round(x), x)
    delta = torch.zeros_like(x)
    delta.view(n, -1)[:, :5] = -0.0
    for row, count in enumerate(torch.randint(1, 40, (n,), generator=g).tolist()):
        pixels = torch.randperm(d, generator=g)[:count]
        delta.view(n, -1)[row, pixels] = torch.randint(-6, 7, (count,), generator=g) * 0.05  # ties, zeros
    room = torch.minimum(delta.abs(), torch.where(delta > 0, 1 - x, x)).flatten(1).sum(dim=1)
    eps = torch.rand(n, generator=g) * room
    widths = []
    topk = torch.Tensor.topk

    def spy(values, k, *args, **kwargs):
        widths.append(k)
        return topk(values, k, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "topk", spy)
    for unsure in (False, True):
        if unsure:
            eps[0] = room[0] * (1 - 2 ** -23)  # inside the slack of the narrow head's check
        widths.clear()
        on_the_head = project_l1_ball_box(x, delta, eps)
        assert widths[0] < 64 and (64 in widths) == unsure
        with monkeypatch.context() as whole:
            whole.setattr(projections, "_project_on_first_head", lambda *args: None)
            whole_rows = project_l1_ball_box(x, delta, eps)
        assert torch.equal(on_the_head, whole_rows)
        assert torch.equal(torch.signbit(on_the_head), torch.signbit(whole_rows))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_distance_to_face_is_the_choice_between_x_and_one_minus_x_bit_for_bit(dtype):
    """The distance to the face a move reaches (FAB's projections and the L1 projection's rooms, issue 54) is |up - x|:
    the bits of choosing 1 - x or x, at the faces too, and +0.0 for an x of -0.0."""
    from rgb.attacks.projections import distance_to_face

    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 500, generator=g, dtype=dtype)
    x[:, :40] = torch.tensor([0.0, 1.0, -0.0, 0.5], dtype=dtype).repeat(10)
    up = (torch.rand(x.shape, generator=g) < 0.5).to(dtype)
    expected = torch.where(up.bool(), 1.0 - x, x).abs()  # abs: the chosen x of -0.0 comes out +0.0
    got = distance_to_face(x, up.clone())
    assert torch.equal(got.view(torch.int64 if dtype == torch.float64 else torch.int32),
                       expected.view(torch.int64 if dtype == torch.float64 else torch.int32))
