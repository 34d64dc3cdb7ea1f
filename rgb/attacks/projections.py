"""Projections onto the Lp-ball around x intersected with the [0,1] box (per sample, on device; host reads only
on the CPU, where they cost nothing)."""

from __future__ import annotations

import torch

from rgb.attacks import common
from rgb.attacks.common import largest_first, per_sample


def linf_box(x: torch.Tensor, eps: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pixel bounds of the Linf ball around x intersected with [0, 1]. An attack that projects every step
    computes them once: `x_adv.clamp(lower, upper)` is then the whole projection (one pass, not five)."""
    eps = per_sample(eps, x)
    return (x - eps).clamp_min(0.0), (x + eps).clamp_max(1.0)


def project_linf(x: torch.Tensor, x_adv: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Clip x_adv to [x - eps, x + eps], then to [0, 1] (this order is the exact projection for Linf; x in
    [0, 1] makes it one clip to `linf_box`)."""
    return x_adv.clamp(*linf_box(x, eps))


def project_l2(x: torch.Tensor, x_adv: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Rescale x_adv - x onto the L2 ball of radius eps if outside it, then clip to [0, 1] (AutoAttack's order)."""
    eps = per_sample(eps, x)
    delta = x_adv - x
    norm = delta.flatten(1).norm(p=2, dim=1).view_as(eps)
    # Rows inside the ball scale by 1 (delta * 1 is delta): the bits of a `where` between the scaled and the plain
    # delta, without that pass over the images (on the CPU it costs several arithmetic passes).
    scale = torch.where(norm > eps, eps / norm.clamp_min(1e-12), 1.0)
    return delta.mul_(scale).add_(x).clamp_(0.0, 1.0)


# Two exact solvers of the L1 threshold, each where it was measured faster (issue 54, one CPU thread, 63 rows of
# 3x32x32, load ~9): on the CPU's sorted head (N, 64) the breakpoints take 0.21 ms against the bisection's 0.63, at
# (N, 256) 0.86 against 0.75 (a near tie: one solver for the head); on whole rows, which the CPU's dense case and
# every other device solve, the bisection (3.3-3.8 ms) beats sorting 2 x 3072 breakpoints (22-28 ms); on rows of
# 192 it is 0.64 against 0.77 ms. Whether a GPU's segmented sort beats its ~350 small bisection kernels is not
# measured yet, so devices other than the CPU keep the bisection.
# Halvings of [0, max |delta|] when bisecting for the L1 threshold: 2^-32 is below float32 resolution.
_L1_BISECTION_STEPS = 32
# On the CPU, a projection whose moving coordinates do not fit in a head of this share of the row bisects
# whole rows (a partial selection of more would cost about as much as the whole-row bisection it saves).
_HEAD_SHARE = 1 / 16
# The head of each row's order by |delta| that the CPU selects first (then 4x wider, as far as _HEAD_SHARE).
_FIRST_HEAD = 64
# Two float32 sums of the same k <= _FIRST_HEAD nonnegative terms in different orders differ by under 2(k - 1)
# units of 2^-24 of the sum: a sum above (1 + this) times a bound is above it in any order.
_SUM_ORDER_SLACK = 4 * _FIRST_HEAD * 2.0 ** -24


def _l1_mass(magnitude: torch.Tensor, room: torch.Tensor, lam: torch.Tensor, out: torch.Tensor | None = None
             ) -> torch.Tensor:
    """sum_i clamp(|delta_i| - lam, 0, room_i): the L1 norm of the projection for threshold lam, (N, 1)
    (`out`: a scratch tensor shaped like magnitude, so that a loop allocates nothing)."""
    out = torch.sub(magnitude, lam, out=out).clamp_min_(0.0)
    return torch.minimum(out, room, out=out).sum(dim=1, keepdim=True)


def _l1_bisection(magnitude: torch.Tensor, room: torch.Tensor, eps_col: torch.Tensor, lo: torch.Tensor,
                  hi: torch.Tensor) -> torch.Tensor:
    """The lam in [lo, hi] with _l1_mass(lam) = eps per row, given _l1_mass(lo) >= eps >= _l1_mass(hi)."""
    scratch = torch.empty_like(magnitude)  # one buffer for all the steps' masses (same values, no allocation)
    mass_lo, mass_hi = _l1_mass(magnitude, room, lo, scratch), _l1_mass(magnitude, room, hi, scratch)
    for _ in range(_L1_BISECTION_STEPS):
        mid = torch.add(lo, hi).div_(2)
        mass_mid = _l1_mass(magnitude, room, mid, scratch)
        keep_low = mass_mid >= eps_col
        lo, mass_lo = torch.where(keep_low, mid, lo), torch.where(keep_low, mass_mid, mass_lo)
        hi, mass_hi = torch.where(keep_low, hi, mid), torch.where(keep_low, mass_hi, mass_mid)
    drop = mass_lo - mass_hi
    return torch.where(drop > 0, lo + (mass_lo - eps_col) * (hi - lo) / drop.clamp_min(1e-30), hi)


def _l1_breakpoints(magnitude: torch.Tensor, room: torch.Tensor, eps_col: torch.Tensor) -> torch.Tensor:
    """The lam with _l1_mass(lam) = eps per row, (N, 1), where some lam >= min(a_i - c_i) has it; other rows
    (whose whole room is below eps: the caller discards theirs) get that smallest breakpoint.

    The mass is piecewise linear in lam with breakpoints a_i (below it coordinate i moves: slope -1 more) and
    a_i - c_i (below it the coordinate has used its room: slope back up by 1). Sorted from the top, a cumulative sum
    of the slope changes counts the moving coordinates on each segment (negated), a second one of count * width
    gives the mass at every breakpoint, and the segment where it crosses eps gives lam by one linear interpolation:
    about twenty tensor operations and no host read. Ties and rooms of 0 make zero-width segments, which add nothing.
    The breakpoints and masses are in float64: a room far below a float32 step of its a_i would round a_i - c_i back
    to a_i in float32 and drop that room from the mass (a projection over the budget); in float64 each mass is its
    terms' sum to about 1e-16 relative. (A stable sort: the faster of torch's two on the CPU at these widths.)
    """
    width = magnitude.shape[1]
    wide = magnitude.double()
    points, order = torch.cat((wide, wide - room.double()), dim=1).sort(dim=1, descending=True, stable=True)
    # minus the moving count on each segment (integers; negated as torch.diff is minus each segment's width)
    minus_moving = torch.where(order < width, -1, 1).cumsum_(dim=1)
    mass = torch.nn.functional.pad(torch.diff(points, dim=1).mul_(minus_moving[:, :-1]).cumsum_(dim=1), (1, 0))
    eps_wide = eps_col.double().contiguous()  # (a float64 eps column may be a stride-0 view: searchsorted warns)
    crossing = torch.searchsorted(mass, eps_wide)  # how many masses are below eps (they never decrease)
    segment = crossing.sub(1).clamp_(0, 2 * width - 2)  # S crosses eps on this segment
    slope = minus_moving.gather(1, segment).clamp_max_(-1)
    lam = points.gather(1, segment) + (eps_wide - mass.gather(1, segment)) / slope
    return torch.where(crossing < 2 * width, lam, points[:, -1:]).to(magnitude.dtype)


def project_l1_ball_box(x: torch.Tensor, delta: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Exact Euclidean projection of delta onto {v : ||v||_1 <= eps, 0 <= x + v <= 1}, per sample.

    With a_i = |delta_i| and c_i = min(a_i, distance from x_i to the box face delta_i points at), the solution
    is v_i = sign(delta_i) * clamp(a_i - lam, 0, c_i) with lam = 0 if sum(c) <= eps, else the root of the
    piecewise-linear, non-increasing mass S(lam) = eps. Only coordinates with a_i > lam move, and in attacks these
    are few (tens of 3072 in APGD-L1 and Square-L1): on the CPU the root is solved on the head of each row's order
    by a_i (up to _HEAD_SHARE of it), grown until the mass at its smallest a_i reaches eps, so that the root lies
    above every coordinate outside the head; there, like the reference, we sort the 2k breakpoints of S, but read
    the root off cumulative sums in one step (`_l1_breakpoints`) instead of bisecting over them. Whole rows (the
    CPU's dense case, other devices) bisect on lam itself (`_l1_bisection`: no sort, no host sync on a GPU), which
    after _L1_BISECTION_STEPS halvings leaves the bracket far below float32 resolution, and interpolate linearly
    inside it. Either differs from the exact root by float rounding only (spec §3.3: any exact root finder; the
    breakpoints round differently from the bisection, so results move in their last bits against the bisection's:
    the agreement allowance of spec §6.3 / §8 item 10). When no row needs shrinking (on the CPU, where the check is
    a free host read) nothing is selected or solved: the answer is the box clip. Rows whose nonzeros all fit in the
    CPU's first head are projected on that head alone (`_project_on_first_head`, the same bits). Assumes x in [0, 1].
    """
    if x.shape != delta.shape:
        raise ValueError(f"x and delta must have the same shape, got {tuple(x.shape)} and {tuple(delta.shape)}")
    n = x.shape[0]
    eps_col = per_sample(eps, x).view(n, 1)
    x_flat, delta_flat = x.flatten(1), delta.flatten(1)
    if x.device.type == "cpu" and n and x_flat.shape[1] * _HEAD_SHARE > _FIRST_HEAD:
        projected = _project_on_first_head(x_flat, delta_flat, eps_col)
        if projected is not None:
            return projected.view_as(delta)
    magnitude, sign, room = _l1_terms(x_flat, delta_flat)
    shrink = room.sum(dim=1, keepdim=True) > eps_col
    zero = torch.zeros_like(eps_col)
    if magnitude.shape[1] == 0 or (common.host_reads_are_free(magnitude.device) and not bool(shrink.any())):
        lam = zero  # inside the ball: the box clip alone (what any threshold becomes below)
    elif magnitude.device.type == "cpu" and magnitude.shape[1] * _HEAD_SHARE > _FIRST_HEAD:
        checked = {}  # the last head checked: its width, its rooms, whether the root lies above it

        def root_above_head(top, order):
            """Is the root above the head's smallest a_i in every row that needs shrinking?"""
            if checked.get("width") != top.shape[1]:
                head_room = room.gather(1, order)
                above = bool(((_l1_mass(top, head_room, top[:, -1:]) >= eps_col) | ~shrink).all())
                checked.update(width=top.shape[1], room=head_room, above=above)
            return checked["above"]

        give_up = magnitude.shape[1] * _HEAD_SHARE
        top, order = largest_first(
            magnitude, lambda top, order: top.shape[1] >= give_up or root_above_head(top, order), first=_FIRST_HEAD)
        if root_above_head(top, order):
            # the root lies at or above the head's smallest a_i (checked): the clamp only ever keeps it there
            lam = _l1_breakpoints(top, checked["room"], eps_col).clamp_min_(top[:, -1:])
        else:  # dense: many coordinates move, bisect whole rows
            lam = _l1_bisection(magnitude, room, eps_col, zero, magnitude.amax(dim=1, keepdim=True))
    else:
        lam = _l1_bisection(magnitude, room, eps_col, zero, magnitude.amax(dim=1, keepdim=True))
    return _l1_step(magnitude, room, sign, torch.where(shrink, lam.clamp_min(0.0), zero)).view_as(delta)


def _project_on_first_head(x: torch.Tensor, delta: torch.Tensor, eps_col: torch.Tensor) -> torch.Tensor | None:
    """`project_l1_ball_box` of rows (N, D) on the CPU where every row's nonzeros fit in the first head it selects
    (APGD-L1's steps: tens of 3072 pixels), else None. The same checks and solve, with the terms of the head's
    coordinates only: every other coordinate has |delta| = 0, so its room and its answer are +0, and scattering the
    head's rooms into zeros gives the whole rows' rooms (the same sums). The head is first only the rows' k largest
    |delta|, k the most nonzeros of a row (a selection of under 48 of 3072 costs about half one of 64): the
    breakpoints' root is that of the _FIRST_HEAD head (the zeros it adds lie below the root), but the check that the
    root lies above the head sums its terms in another order, so it must pass by _SUM_ORDER_SLACK; rows where it does
    not are checked as the whole rows' solve checks them (`_root_above_first_head`). None where the whole rows'
    solve would widen the head (the root below it): the bits are always those of the whole rows."""
    width = int(torch.ne(delta, 0.0, out=torch.empty_like(delta)).sum(dim=1).max())
    if width > _FIRST_HEAD:
        return None
    abs_delta = delta.abs()
    top, order = abs_delta.topk(width, dim=1)
    magnitude, sign, room = _l1_terms(x.gather(1, order), delta.gather(1, order))
    rows = torch.zeros_like(delta).scatter_(1, order, room)
    shrink = rows.sum(dim=1, keepdim=True) > eps_col
    lam = torch.zeros_like(eps_col)
    if bool(shrink.any()):
        smallest = top[:, -1:] if width == _FIRST_HEAD else lam  # the _FIRST_HEAD head's smallest |delta|
        unsure = (_l1_mass(top, room, smallest) < eps_col * (1 + _SUM_ORDER_SLACK)) & shrink
        if bool(unsure.any()) and not _root_above_first_head(x, delta, abs_delta, eps_col, unsure.view(-1)):
            return None
        lam = torch.where(shrink, _l1_breakpoints(top, room, eps_col).clamp_min_(smallest).clamp_min(0.0), lam)
    # the head covers every nonzero room of `rows`, so writing the answer over it leaves zeros elsewhere
    return rows.scatter_(1, order, _l1_step(magnitude, room, sign, lam))


def _root_above_first_head(x: torch.Tensor, delta: torch.Tensor, magnitude: torch.Tensor, eps_col: torch.Tensor,
                           flagged: torch.Tensor) -> bool:
    """The whole rows' check that the root lies above the _FIRST_HEAD head, for the `flagged` rows (N,) only, bit
    for bit: each row's selection is its own, and its sum is taken as a row of an (N, _FIRST_HEAD) tensor, as there
    (other rows' terms 0). A few rows cost a fraction of the whole call's selection."""
    rows = flagged.nonzero().squeeze(1)
    top, order = magnitude[rows].topk(_FIRST_HEAD, dim=1)
    _, _, room = _l1_terms(x[rows].gather(1, order), delta[rows].gather(1, order))
    shape = (x.shape[0], _FIRST_HEAD)
    mass = _l1_mass(top.new_zeros(shape).index_copy_(0, rows, top), room.new_zeros(shape).index_copy_(0, rows, room),
                    top.new_zeros(shape[0], 1).index_copy_(0, rows, top[:, -1:]))
    return bool((mass[rows] >= eps_col[rows]).all())


def distance_to_face(x: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Per coordinate, the distance from x in [0, 1] to the box face a move reaches: 1 - x where `up` (0/1 floats
    shaped like x, overwritten) is 1, else x. Written as |up - x|, exact on the box (1 - x >= 0, |0 - x| = x; an x of
    -0.0 gives +0.0): on the CPU three cheap passes, where a lerp or a `where` by the mask costs 1.5-5x (issue 54)."""
    return torch.sub(up, x, out=up).abs_()


def _l1_terms(x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, sign, c) of `project_l1_ball_box` for x and delta of one shape: |delta|, its sign, and the room
    min(a, distance from x to the box face delta points at)."""
    magnitude, sign = delta.abs(), torch.sign(delta)
    face = distance_to_face(x, torch.gt(delta, 0, out=torch.empty_like(x)))
    return magnitude, sign, torch.minimum(magnitude, face, out=face)  # both >= +0: so is the room


def _l1_step(magnitude: torch.Tensor, room: torch.Tensor, sign: torch.Tensor, lam: torch.Tensor | float
             ) -> torch.Tensor:
    """sign * clamp(a - lam, 0, c): the projection for threshold lam (magnitude is overwritten)."""
    projected = magnitude.sub_(lam).clamp_min_(0.0)
    return torch.minimum(projected, room, out=projected).mul_(sign)


def solved_on_the_head(pixels: int, moving: int) -> bool:
    """Whether `project_l1_ball_box` on the CPU solves rows of `pixels` pixels, at most `moving` of them nonzero, on
    its head's breakpoints, as `project_l1_values` does (then the two give the same bits): a row's head (up to
    _HEAD_SHARE of it) then holds every nonzero."""
    return pixels * _HEAD_SHARE > max(_FIRST_HEAD, moving)


def project_l1_values(x: torch.Tensor, delta: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """`project_l1_ball_box` for a delta that is 0 outside K known pixels per row, given their values x and delta
    (N, K): the projected delta there. The caller vouches for the pixels (Square-L1 knows them: its best iterate's
    few nonzero pixels and the window it rewrites, read as cached columns and slices, no whole-image pass), so
    nothing scans whole rows: the root is solved on their breakpoints (`_l1_breakpoints`; every other pixel is 0 and
    never moves). Entries with delta = 0 (padding, any x in [0, 1]) weigh nothing and come out 0. The same values as
    `project_l1_ball_box` wherever that solves the same head (`solved_on_the_head`); the sum deciding whether a row
    needs shrinking adds the same terms in another order (last bits, the agreement allowance of spec §6.3)."""
    n = x.shape[0]
    eps_col = per_sample(eps, x).view(n, 1)
    magnitude, sign, room = _l1_terms(x, delta)
    shrink = room.sum(dim=1, keepdim=True) > eps_col
    if x.shape[1] == 0 or (common.host_reads_are_free(x.device) and not bool(shrink.any())):
        lam = 0.0
    else:
        lam = torch.where(shrink, _l1_breakpoints(magnitude, room, eps_col).clamp_min_(0.0), 0.0)
    return _l1_step(magnitude, room, sign, lam)
