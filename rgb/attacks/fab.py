"""FAB (spec §4): minimal-norm adversarial search along linearised decision boundaries, targeted and untargeted.

FAB-T (the standard version's) has no random start, so it is deterministic. For each of the `n_targets`
runner-up classes of the clean logits it iterates: linearise z_t - z_y at the current point, project both the
current point x1 and the clean point x0 onto that hyperplane (box-constrained, minimal Lp norm), step to a
convex mix of the two projections with overshoot `eta`, and pull adversarial iterates back towards x0 by `beta`.
The smallest adversarial perturbation found counts as a success when its norm is within eps. Untargeted FAB
(the `plus` version's) linearises, at every step, the boundary of the class closest in the dual norm, which
needs the input gradient of every logit (one backward pass per class), and restarts from random points.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rgb.attacks import common
from rgb.attacks.common import (AttackResult, EvalCounter, LiveRows, Progress, check_eps, first_success,
                                largest_first, lp_norm, make_generator, nested, runner_up_targets, side_by_side,
                                unfinished)
from rgb.attacks.projections import distance_to_face
from rgb.core.threat import parse_norm

# Coordinates whose gradient entry is below this never move in the L2 and L1 projections (spec §4).
_ZERO_WEIGHT = 1e-8
# Projection norms are floored here before mixing the two projections (spec §4 step 2).
_NORM_FLOOR = 1e-8
# With early stopping, finished rows are dropped from the batch every this many iterations (one host sync).
_COMPACT_EVERY = 10
# Newton steps of the Linf/L2 projections' level search before any bisection, and the host check of
# convergence every this many steps (on the CPU only, where a read is free and a step is two passes over the rows:
# elsewhere all steps and the bisection run, no host read).
_NEWTON_STEPS = 16
_NEWTON_CHECK_EVERY = 1
# The head of the order by |w| that FAB-L1's projection selects first (on the CPU): the second of largest_first's
# heads (64, 256, ...). On FAB-T's calls at 3x32x32 (a PGD-AT CNN, issue 54) a row's greedy needs 83 coordinates at
# the median and <= 256 in 99.9% of rows, so a call almost always needs more than 64 and one selection of 256
# replaces two (64, then 256).
_L1_HEAD = 4 * 64


@dataclass
class FABResult(AttackResult):
    """norms: smallest adversarial perturbation norm FAB found per sample (0 for points misclassified to begin
    with, inf where it found none; with early_stop the search stops at the first norm within eps)."""

    norms: torch.Tensor


def _down_rows(rows: torch.Tensor, per_row: torch.Tensor) -> torch.Tensor:
    """`rows` (N, D) viewed as (N / M, M, D) to broadcast against `per_row` (M, D), which repeats down it: an
    element-wise op on the view gives the bits of the same op against `per_row` repeated, without the copy."""
    return rows.view(-1 if per_row.shape[0] else 1, *per_row.shape)


def _orientation(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, flip) per row of t: flip (N, 1) is -1 where <w, t> < b, else 1, and c = (<w, t> - b) * flip >= 0, so the
    step must decrease <flip * w, .> by c (w (M, D) repeated down t's N rows). Each product is written once, to a
    contiguous (N, D) tensor, and summed as such: the same bits as repeating w first."""
    t = t.contiguous()
    c = torch.mul(_down_rows(t, w), w).view_as(t).sum(dim=1) - b
    flip = torch.where(c < 0, -1.0, 1.0).to(w.dtype)
    return c * flip, flip[:, None]


def _orient(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip (w, b) so that the step must decrease <w, .>: returns (w, c) with c = <w, t> - b >= 0, w (M, D) repeated
    down t's N rows (the returned w has N rows)."""
    target, flip = _orientation(t, w, b)
    return torch.mul(w, _down_rows(flip, w[:, :1])).view_as(t), target


def _distance_to_face(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Distance from t in [0,1] to the box face that decreases <w, .>: t_i if w_i > 0, else 1 - t_i. (At a NaN w_i
    the distance is t_i, not 1 - t_i: no projection reads it there.)"""
    return distance_to_face(t, torch.le(w, 0, out=torch.empty_like(t)))


# Integer types with the bit width of each float type: non-negative floats order like their bit patterns.
_BITS_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}


def _bisect_floats(lo, hi, value_lo, value_hi, evaluate, target):
    """Per row (N, 1): shrink [lo, hi] (0 <= lo <= hi) to adjacent floats keeping value(lo) <= target < value(hi)
    for a non-decreasing `evaluate`, by halving the bit patterns of the floats in between (they order like the
    floats), so bit width - 1 halvings always suffice; one `evaluate` per halving, no sort and no host sync.
    Returns lo, hi and their values."""
    bits = _BITS_OF[lo.dtype]
    lo_bits, hi_bits = lo.view(bits), hi.view(bits)
    for _ in range(torch.finfo(lo.dtype).bits - 1):
        mid_bits = lo_bits + (hi_bits - lo_bits) // 2
        value = evaluate(mid_bits.view(lo.dtype))
        below = value <= target
        lo_bits, value_lo = torch.where(below, mid_bits, lo_bits), torch.where(below, value, value_lo)
        hi_bits, value_hi = torch.where(below, hi_bits, mid_bits), torch.where(below, value_hi, value)
    return lo_bits.view(lo.dtype), hi_bits.view(lo.dtype), value_lo, value_hi


def _saturation_level(breaks: torch.Tensor, weights: torch.Tensor, target: torch.Tensor):
    """Solve sum_i weights_i * min(lam, breaks_i) = target per row (weights, breaks >= 0), exactly.

    The left side g is piecewise linear, non-decreasing and concave in lam, with kinks at the breaks. Instead of
    sorting the breaks (the reference does; on a small CNN a sort per FAB step costs as much as the model's
    backward pass), Newton steps from lam = 0 use the slope right of lam (the weights of the breaks above it):
    by concavity each step stays at or below the root, and once no kink lies between a step and the root the
    step lands on it, which is seen as an unchanged slope (typically within a few steps; on the CPU the host
    reads that every few steps, elsewhere it never reads: settled rows keep their level, so the result is the
    same). Rows still short of it after _NEWTON_STEPS are finished by bisecting the floats between
    their Newton point and max(breaks) down to adjacent floats, where g is linear. Returns (lam, feasible),
    where feasible is False when even lam = max(breaks) cannot reach the target. `weights` (M, D) may hold fewer
    rows than `breaks` (N, D), repeated down them (`_down_rows`).
    """
    target = target[:, None]
    scratch = torch.empty_like(breaks)

    def weighted_sum(terms):
        """sum_i weights_i * terms_i per row, `terms` (N, D) overwritten."""
        _down_rows(terms, weights).mul_(weights)
        return terms.sum(dim=1, keepdim=True)

    def value_at(lam):
        return weighted_sum(torch.minimum(breaks, lam, out=scratch))

    def slope_at(lam):
        # The breaks above lam as a 0/1 float mask written in place (a `where` on it is 5x slower on the CPU).
        return weighted_sum(torch.gt(breaks, lam, out=scratch))

    torch.mul(_down_rows(breaks, weights), weights, out=_down_rows(scratch, weights))
    top = scratch.sum(dim=1, keepdim=True)
    feasible = top >= target
    goal = torch.minimum(target, top)  # infeasible rows settle at max(breaks); callers override them

    lam = torch.zeros_like(target)
    # At lam = 0 every min(lam, break) is 0 (breaks >= 0): the value needs no pass over the row, the slope one.
    value, slope = torch.zeros_like(target), slope_at(0.0)
    settled = torch.zeros_like(feasible)
    check_every = _NEWTON_CHECK_EVERY if common.host_reads_are_free(lam.device) else _NEWTON_STEPS + 1
    for step in range(1, _NEWTON_STEPS + 1):
        rise = torch.where(slope > 0, (goal - value) / slope.clamp_min(torch.finfo(slope.dtype).tiny), 0.0)
        lam = torch.where(settled, lam, lam + rise.clamp_min(0.0))
        previous = slope
        slope = slope_at(lam)
        settled = settled | (slope == previous)
        if step % check_every == 0 and bool(settled.all()):
            return lam, feasible.squeeze(1)  # a settled lam needs no value: only a next step reads it
        value = value_at(lam)
    # Rare: many kinks between the start and the root. Bisect the rest of the way on the unsettled rows.
    hi = breaks.amax(dim=1, keepdim=True) if breaks.shape[1] else lam
    lo, hi, value_lo, value_hi = _bisect_floats(
        lam, torch.maximum(hi, lam), value, top,
        lambda point: weighted_sum(torch.minimum(breaks, point)), goal)
    rise = value_hi - value_lo
    bisected = torch.where(rise > 0, lo + (goal - value_lo) * (hi - lo) / rise.clamp_min(torch.finfo(rise.dtype).tiny),
                           lo).clamp(min=lo, max=hi)
    return torch.where(settled, lam, bisected), feasible.squeeze(1)


def _check_hyperplane_args(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> int:
    """How many times w's rows repeat down t's: t (N, D), b (N,), w (M, D) with M dividing N (row i of t and b
    uses row i mod M of w: FAB projects its iterate and its start onto the same hyperplane)."""
    if (t.dim() != 2 or w.dim() != 2 or t.shape[1] != w.shape[1] or b.shape != t.shape[:1]
            or (w.shape[0] == 0 and t.shape[0] > 0) or (w.shape[0] and t.shape[0] % w.shape[0])):
        raise ValueError(f"expected t of shape (N, D), w of shape (M, D) with M dividing N and b of shape (N,), "
                         f"got {tuple(t.shape)}, {tuple(w.shape)}, {tuple(b.shape)}")
    return t.shape[0] // w.shape[0] if w.shape[0] else 1


def _still(magnitude: torch.Tensor) -> torch.Tensor | None:
    """The coordinates that stay put in the L2 and L1 projections (|w_i| < 1e-8, NaN too) as a bool mask per row of
    w, or None on the CPU when there is none (one min read on the host: most of FAB's calls have none, and the
    mask's passes cost ~10% of a call)."""
    if (common.host_reads_are_free(magnitude.device) and magnitude.numel()
            and bool(magnitude.amin() >= _ZERO_WEIGHT)):
        return None
    return torch.ge(magnitude, _ZERO_WEIGHT).logical_not_()


def _zero_still(values: torch.Tensor, still: torch.Tensor | None) -> torch.Tensor:
    """`values` (N, D) set to +0 in place at the still coordinates (`still` repeated down its rows)."""
    if still is not None:
        _down_rows(values, still).masked_fill_(still, 0.0)
    return values


def fab_project_linf(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Minimal-Linf d with <w, t + d> = b and t + d in [0,1]^D, per row; the face vertex if unreachable.

    d_i = -sign(w_i) * min(lam, p_i) with p_i the distance to the face that decreases <w, .>. (w may hold fewer
    rows than t, repeated down it: `_check_hyperplane_args`.)
    """
    _check_hyperplane_args(t, w, b)
    magnitude = w.abs()  # before orienting: the same for every repeat of a row
    w, target = _orient(t, w, b)
    room = _distance_to_face(t, w)
    lam, feasible = _saturation_level(room, magnitude, target)
    lam = torch.where(feasible[:, None], lam, torch.full_like(lam, float("inf")))
    return w.sign_().neg_().mul_(torch.minimum(lam, room, out=room))  # w: _orient's own tensor


def fab_project_l2(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Minimal-L2 d with <w, t + d> = b and t + d in [0,1]^D, per row; the face vertex if unreachable.

    d_i = -w_i * min(alpha, r_i) with r_i = p_i / |w_i| the alpha at which coordinate i reaches its face;
    coordinates with |w_i| < 1e-8 stay put. (w may hold fewer rows than t, repeated down it.)
    """
    _check_hyperplane_args(t, w, b)
    # Per row of w (before orienting, the same for its repeats): the coordinates that stay put, zeroed in place (a
    # `where` against a zero tensor gives the same bits, slower).
    magnitude = w.abs()
    still = _still(magnitude)
    _zero_still(magnitude, still)
    w, target = _orient(t, w, b)
    room = _zero_still(_distance_to_face(t, w), still)
    divisor = magnitude if still is None else magnitude.masked_fill(still, 1.0)
    reach = (_down_rows(room, magnitude) / divisor).view_as(room)
    alpha, feasible = _saturation_level(reach, magnitude.square(), target)
    closest = torch.mul(_down_rows(alpha, magnitude[:, :1]), magnitude).view_as(room)
    step = _zero_still(common.rows_where(feasible, torch.minimum(closest, room, out=closest), room), still)
    return w.sign_().neg_().mul_(step)


def _l1_cpu_head(magnitude, greedy, target):
    """On the CPU, a head of FAB-L1's greedy order with the bits of `largest_first`'s (the topk of _L1_HEAD, then 4x
    wider for every row until all rows close their gaps on it), widened for the rows that need it only: a row that
    closes its gap on its head, with no two magnitudes tied up to the coordinate that closes it, has one order up to
    there whatever the selection (the greedy reads nothing past it), so it keeps its head; the others take the wider
    topk of their own rows (each row is selected by itself). A kept head is padded with its last column, which then
    takes step 0 at each of its places (as off the head). On FAB-T's calls at 3x32x32 one in nine calls has a row
    that needs more than _L1_HEAD coordinates, and a topk of 1024 of all rows costs 2x that of 256."""
    width = magnitude.shape[1]
    k = min(width, _L1_HEAD)
    top, order = magnitude.topk(k, dim=1)
    while True:
        _, _, _, _, closed, n_full = greedy(top, order)
        closes = closed[:, -1] >= target
        if k == width or bool(closes.all()):
            return top, order
        position = torch.arange(k - 1, device=top.device)[None, :]
        repeats = closed.shape[0] // top.shape[0]
        tied = (torch.eq(top[:, 1:], top[:, :-1]).repeat(repeats, 1) & (position <= n_full)).any(dim=1)
        # a kept row closes before its head's last column (n_full < k - 1), so that column's padding copies lie
        # past n_full, where the greedy gives step 0
        wider = (~closes | tied | (n_full[:, 0] >= k - 1)).view(repeats, -1).any(dim=0).nonzero().squeeze(1)
        k, kept = min(width, 4 * k), k
        top = nn.functional.pad(top, (0, k - kept))
        order = torch.cat((order, order[:, -1:].expand(-1, k - kept)), dim=1)
        top[wider], order[wider] = magnitude[wider].topk(k, dim=1)


def fab_project_l1(t: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Minimal-L1 d with <w, t + d> = b and t + d in [0,1]^D, per row; the face vertex if unreachable.

    Greedy (a fractional knapsack): coordinates in order of decreasing |w_i| move all the way to their face
    until one partial move closes the remaining gap; coordinates with |w_i| < 1e-8 stay put. w may hold fewer rows
    than t, repeated down it (`_check_hyperplane_args`): the order by |w_i| is then selected once per row of w and
    shared by its repeats (FAB's iterate and start: half the selection, which is most of this projection's time).
    """
    repeats = _check_hyperplane_args(t, w, b)
    # Zero weights stay put: their magnitude zeroed in place (a `where` against zeros gives the same bits, slower),
    # per row of w, shared by its repeats; so is their room, which the greedy reads on the head only (the room of
    # every coordinate would cost three passes over t's rows that the head, ~1/10 of a row, does not need).
    magnitude = w.abs()
    still = _still(magnitude)
    _zero_still(magnitude, still)
    target, flip = _orientation(t, w, b)
    checked = {}  # the last head's width and its greedy over t's rows

    def greedy(top, order):
        """Over t's rows: the head's magnitudes, columns, flipped weights and room, the gap closed after moving each
        of its coordinates fully, and how many of them move fully (the head's width where it cannot close it)."""
        if checked.get("width") != top.shape[1]:
            head_w = w.gather(1, order).repeat(repeats, 1).mul_(flip)
            top, order = top.repeat(repeats, 1), order.repeat(repeats, 1)
            head_room = _distance_to_face(t.gather(1, order), head_w)
            if still is not None:
                head_room.masked_fill_(top == 0, 0.0)  # the still coordinates' magnitude is 0, others' >= 1e-8
            closed = (top * head_room).cumsum(dim=1)
            checked.update(width=top.shape[1], head=(top, order, head_w, head_room, closed,
                                                     (closed < target[:, None]).sum(dim=1, keepdim=True)))
        return checked["head"]

    # The greedy never looks past the coordinate that closes the gap: only that head of the order is needed.
    if common.host_reads_are_free(w.device):
        head = _l1_cpu_head(magnitude, greedy, target)
    else:
        head = largest_first(magnitude, lambda top, order: bool((greedy(top, order)[4][:, -1] >= target).all()),
                             first=_L1_HEAD)
    # (the greedy of the head found last: `checked` is keyed by the width, and every widening changes it)
    sorted_magnitude, order, sorted_w, sorted_room, closed, n_full = greedy(*head)
    # Where the whole row cannot close the gap, every coordinate moves fully (n_full is the row's width): the face.
    closed_before = nn.functional.pad(closed, (1, 0)).gather(1, n_full)
    partial_index = n_full.clamp_max(order.shape[1] - 1)
    partial = (target[:, None] - closed_before) / sorted_magnitude.gather(1, partial_index).clamp_min(_ZERO_WEIGHT)
    position = torch.arange(order.shape[1], device=w.device)[None, :]
    sorted_step = sorted_room.masked_fill(position >= n_full, 0.0)
    sorted_step = torch.where(position == n_full, torch.minimum(partial.clamp_min(0.0), sorted_room), sorted_step)
    # -sign(flip * w) * step, with step 0 off the head: there sign(flip * w) * -0, which is sign(w) * (flip * -0)
    # but -0 at a zero or NaN weight (its sign is +0), written from w's rows without flipping them all.
    sign = w.sign()
    step = torch.mul(sign, _down_rows(flip.mul(-0.0), sign[:, :1])).view_as(t)
    if still is not None:
        _down_rows(step, sign).masked_fill_(sign == 0, -0.0)
    return step.scatter_(1, order, torch.mul(sorted_w.sign(), sorted_step).neg_())


_PROJECTIONS = {"Linf": fab_project_linf, "L2": fab_project_l2, "L1": fab_project_l1}


def _boundary_of_target(model, x1, y, target, counter):
    """(z_t - z_y, its input gradient) at x1 (N, ...): one forward and one backward pass."""
    with torch.enable_grad():
        x1 = x1.detach().requires_grad_(True)
        logits = model(x1)
        gap = (logits.gather(1, target[:, None]) - logits.gather(1, y[:, None])).squeeze(1)
        (grad,) = torch.autograd.grad(gap.sum(), x1)
    counter.forward(x1.shape[0])
    counter.backward(x1.shape[0])
    return gap.detach(), grad.flatten(1)


def _closest_boundary(model, x1, y, norm, counter):
    """Untargeted FAB's choice at x1: the class k != y whose linearised boundary z_k - z_y = 0 is nearest in the
    attack's norm, |z_k - z_y| / ||grad(z_k - z_y)||_q (first k on ties); one forward, one backward per class."""
    dual = parse_norm(norm).dual
    with torch.enable_grad():
        x1 = x1.detach().requires_grad_(True)
        logits = model(x1)
        true_logit = logits.gather(1, y[:, None]).squeeze(1)
        n_rows, n_classes = logits.shape
        best_distance = torch.full((n_rows,), float("inf"), dtype=x1.dtype, device=x1.device)
        best_gap = torch.zeros_like(best_distance)
        best_grad = torch.zeros_like(x1).flatten(1)
        for k in range(n_classes):
            gap = logits[:, k] - true_logit
            (grad,) = torch.autograd.grad(gap.sum(), x1, retain_graph=k < n_classes - 1)
            grad, gap = grad.flatten(1), gap.detach()
            distance = gap.abs() / (lp_norm(grad, dual) + 1e-12)
            closer = (distance < best_distance) & (y != k)
            best_distance = torch.where(closer, distance, best_distance)
            best_gap = torch.where(closer, gap, best_gap)
            best_grad = torch.where(closer[:, None], grad, best_grad)
    counter.forward(n_rows)
    counter.backward(n_rows * n_classes)
    return best_gap, best_grad


def _run_target(model, x0, y, target, *, image_shape, norm, eps, n_iter, alpha_max, eta, beta, early_stop,
                counter, progress, start=None, groups=None):
    """One FAB run from the flattened clean points x0 -> (best_adv, best_norm): towards `target`, or towards
    the closest boundary at every step when `target` is None; from `start` (flattened) instead of x0 if given.
    `progress` hears (iteration, n_iter) after every iteration. `groups`: a point id per row where several rows
    attack one point; with early_stop all rows of a point leave once one of them is done."""
    project = _PROJECTIONS[norm]
    image_shape = (-1, *image_shape)
    targeted = target is not None
    run = LiveRows({"x0": x0, "x1": x0.clone() if start is None else start, "y": y,
                    "target": target if targeted else y, "best_adv": x0.clone(),
                    "best_norm": torch.full_like(x0[:, 0], float("inf")),
                    "done": torch.zeros_like(y, dtype=torch.bool), **({} if groups is None else {"group": groups})},
                   outputs=("best_adv", "best_norm"))

    for iteration in range(n_iter):
        if (early_stop and iteration % _COMPACT_EVERY == 0 and iteration > 0
                and run.keep(unfinished(run["done"], run.state.get("group"))) == 0):
            break
        n_rows = len(run)

        x1 = run["x1"].view(image_shape)
        if targeted:
            gap, w = _boundary_of_target(model, x1, run["y"], run["target"], counter)
        else:
            gap, w = _closest_boundary(model, x1, run["y"], norm, counter)

        # x1 and x0 projected together onto the same hyperplane; the mix of both overshoots is one lerp.
        offset = torch.linalg.vecdot(w, run["x1"]) - gap
        points = torch.cat([run["x1"], run["x0"]])
        steps = project(points, w, torch.cat([offset, offset]))
        sizes = lp_norm(steps, norm).clamp_min(_NORM_FLOOR)
        alpha = (sizes[:n_rows] / (sizes[:n_rows] + sizes[n_rows:])).clamp(0.0, alpha_max)[:, None]
        overshoots = points.add_(steps, alpha=eta)
        candidate = torch.lerp(overshoots[:n_rows], overshoots[n_rows:], alpha).clamp_(0, 1)

        # A separate forward: reusing it as the next gradient pass would only help non-adversarial iterates,
        # but FAB-T iterates are adversarial (hence pulled back, needing a new gradient) on >90% of steps.
        with torch.inference_mode():
            predicted = model(candidate.view(image_shape)).argmax(dim=1)
        counter.forward(n_rows)

        adversarial = (predicted != run["y"]) & ~run["done"]
        distance = lp_norm(candidate - run["x0"], norm)
        improved = adversarial & (distance < run["best_norm"])
        # Row choices by mask, skipped on the CPU when a mask is uniform (no row improved, every row adversarial).
        run["best_adv"] = common.rows_where(improved, candidate, run["best_adv"])
        run["best_norm"] = torch.where(improved, distance, run["best_norm"])
        pulled_back = common.rows_where(adversarial, torch.lerp(run["x0"], candidate, beta), candidate)
        run["x1"] = common.rows_where(run["done"], run["x1"], pulled_back)
        if early_stop:
            run["done"] = run["done"] | (run["best_norm"] <= eps)
        if progress is not None:
            progress(iteration + 1, n_iter)

    results = run.sync()
    return results["best_adv"], results["best_norm"]


def _validate(x, y, n_iter, alpha_max, eta, beta) -> None:
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y disagree on the batch size: {x.shape[0]} vs {y.shape[0]}")
    if n_iter < 0 or not 0 <= alpha_max <= 1 or eta <= 0 or not 0 < beta <= 1:
        raise ValueError(f"need n_iter >= 0, 0 <= alpha_max <= 1, eta > 0 and 0 < beta <= 1, got {n_iter}, "
                         f"{alpha_max}, {eta}, {beta}")


def _clean_logits(model, x, clean_logits, counter) -> torch.Tensor:
    if clean_logits is None:
        with torch.inference_mode():
            clean_logits = model(x)
        counter.forward(x.shape[0])
    elif clean_logits.shape[0] != x.shape[0]:
        raise ValueError(f"clean_logits has {clean_logits.shape[0]} rows for {x.shape[0]} images")
    return clean_logits


class _Outcome:
    """The merged result over targets or restarts: each run attacks the points no earlier run fooled."""

    def __init__(self, model, x, y, clean_logits, eps, counter):
        self.model, self.image_shape, self.y, self.eps, self.counter = model, x.shape[1:], y, eps, counter
        self.flat_x = x.flatten(1)
        self.x_adv = self.flat_x.clone()
        self.fooled = clean_logits.argmax(dim=1) != y
        self.norms = torch.where(self.fooled, 0.0, float("inf")).to(x.dtype)

    def still_robust(self) -> torch.Tensor:
        return (~self.fooled).nonzero().squeeze(1)

    def merge(self, attacked, best_adv, best_norm, copies: int = 1) -> None:
        """A success needs argmax != y at the returned point (re-checked) and a norm within eps. With `copies`
        runs per point side by side (run-major rows), a point takes its first successful run."""
        with torch.inference_mode():
            predicted = self.model(best_adv.view(-1, *self.image_shape)).argmax(dim=1)
        still_correct = predicted == self.y[attacked.repeat(copies)]
        self.counter.forward(best_adv.shape[0])
        success, first = first_success(~still_correct & (best_norm <= self.eps), copies)
        self.x_adv[attacked] = torch.where(success[:, None], best_adv[first], self.flat_x[attacked])
        self.norms[attacked] = torch.minimum(self.norms[attacked], best_norm.view(copies, -1).amin(dim=0))
        self.fooled[attacked] = success

    def result(self) -> FABResult:
        return FABResult(x_adv=self.x_adv.view(-1, *self.image_shape), fooled=self.fooled,
                         forward_rows=self.counter.forward_rows, backward_rows=self.counter.backward_rows,
                         norms=self.norms)


def fab_targeted(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    norm: str,
    eps: float,
    n_targets: int = 9,
    n_iter: int = 100,
    alpha_max: float = 0.1,
    eta: float = 1.05,
    beta: float = 0.9,
    clean_logits: torch.Tensor | None = None,
    early_stop: bool = True,
    counter: EvalCounter | None = None,
    progress: Progress | None = None,
    tail_rows: int = 0,
) -> FABResult:
    """FAB-T (spec §4) on images x in [0,1] (N, ...) with labels y; targets are clean-logit ranks 2..n_targets+1.

    Each target attacks only the points no earlier target fooled. `clean_logits` (N, n_classes) saves the
    clean forward pass. `early_stop` freezes a point once it has an adversarial within eps (the success flag
    is then certain; only its norm could still shrink). Gradients are taken w.r.t. the input only, and the
    model's train/eval mode is left as it is. `progress` hears (target, n_targets, iteration, n_iter).
    `tail_rows` > 0: once the still-robust points times the targets left fit in that many rows, the targets left
    run side by side in one batch (spec §6.3 item 8). FAB-T is deterministic and a point is fooled iff one of
    its targets succeeds, so the flags are the same (up to float rounding of other batch shapes); robust points
    cost the same evaluations, points that fall cost more, and the image may come from a later target.
    """
    norm = parse_norm(norm)
    check_eps(eps)
    _validate(x, y, n_iter, alpha_max, eta, beta)
    counter = EvalCounter(parent=counter)
    x = x.detach()
    clean_logits = _clean_logits(model, x, clean_logits, counter)
    targets = runner_up_targets(clean_logits, n_targets)
    outcome = _Outcome(model, x, y, clean_logits, eps, counter)
    for rank in range(n_targets):
        attacked = outcome.still_robust()
        if attacked.numel() == 0:
            break
        stacked, groups, copies = side_by_side(attacked, n_targets - rank, tail_rows)
        best_adv, best_norm = _run_target(
            model, outcome.flat_x[stacked], y[stacked], targets[attacked, rank:rank + copies].T.reshape(-1),
            image_shape=x.shape[1:], norm=norm, eps=eps, n_iter=n_iter, alpha_max=alpha_max, eta=eta, beta=beta,
            early_stop=early_stop, counter=counter, progress=nested(progress, rank + 1, n_targets), groups=groups)
        outcome.merge(attacked, best_adv, best_norm, copies)
        if copies > 1:  # every target left has run
            break
    return outcome.result()


def _uniform_noise(x0: torch.Tensor, generator) -> torch.Tensor:
    return 2 * torch.rand(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype) - 1


def _gaussian_noise(x0: torch.Tensor, generator) -> torch.Tensor:
    return torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)


# Each norm's start direction before scaling: uniform in [-1,1]^d for Linf, Gaussian for L2 and L1.
_START_NOISE = {"Linf": _uniform_noise, "L2": _gaussian_noise, "L1": _gaussian_noise}


def fab_random_start(x0: torch.Tensor, norm: str, eps: float, generator) -> torch.Tensor:
    """A restart's first iterate (flattened rows): x0 plus a random perturbation of norm eps/2 in the norm's start
    direction (`_START_NOISE`), clipped to the box."""
    t = _START_NOISE[norm](x0, generator)
    return (x0 + 0.5 * eps * t / lp_norm(t, norm)[:, None]).clamp(0.0, 1.0)


def fab_untargeted(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    norm: str,
    eps: float,
    n_restarts: int = 5,
    n_iter: int = 100,
    alpha_max: float = 0.1,
    eta: float = 1.05,
    beta: float = 0.9,
    generator: torch.Generator | int | None = None,
    clean_logits: torch.Tensor | None = None,
    early_stop: bool = True,
    counter: EvalCounter | None = None,
    progress: Progress | None = None,
) -> FABResult:
    """Untargeted FAB (the `plus` version's "fab") on images x in [0,1] (N, ...) with labels y.

    Every step linearises the boundary of the class nearest in the dual norm (K backward passes for K classes,
    which is why the standard version uses FAB-T). The first restart starts at the clean point, later ones
    (`fab_random_start`, drawn from `generator`: a torch.Generator on x's device or an int seed) at a random
    point; each restart attacks only the points no earlier restart fooled. `progress` hears (restart,
    n_restarts, iteration, n_iter). Other arguments as `fab_targeted`.
    """
    norm = parse_norm(norm)
    check_eps(eps)
    _validate(x, y, n_iter, alpha_max, eta, beta)
    if n_restarts < 1:
        raise ValueError(f"n_restarts must be >= 1, got {n_restarts}")
    counter = EvalCounter(parent=counter)
    generator = make_generator(generator, x.device)
    x = x.detach()
    clean_logits = _clean_logits(model, x, clean_logits, counter)
    outcome = _Outcome(model, x, y, clean_logits, eps, counter)
    for restart in range(n_restarts):
        attacked = outcome.still_robust()
        if attacked.numel() == 0:
            break
        x0 = outcome.flat_x[attacked]
        start = None if restart == 0 else fab_random_start(x0, norm, eps, generator)
        best_adv, best_norm = _run_target(
            model, x0, y[attacked], None, image_shape=x.shape[1:], norm=norm, eps=eps, n_iter=n_iter,
            alpha_max=alpha_max, eta=eta, beta=beta, early_stop=early_stop, counter=counter,
            progress=nested(progress, restart + 1, n_restarts), start=start)
        outcome.merge(attacked, best_adv, best_norm)
    return outcome.result()
