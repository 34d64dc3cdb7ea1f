"""Square Attack (spec §5): score-based random search over square windows, Linf / L2 / L1, margin loss.

Each iteration draws one window position (shared by the whole batch), proposes a structured change of the
perturbation inside it, queries the model once per still-robust point and keeps the proposal when the margin
z_y - max_{j != y} z_j gets strictly lower or reaches <= 0. Randomness comes from a torch.Generator on the
input's device (spec §6.3 item 7), drawn in fixed shapes so that results do not depend on which points
have already dropped out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rgb.attacks import common
from rgb.attacks.common import (AttackInputError, AttackResult, EvalCounter, LiveRows, Progress, check_eps,
                                make_generator)
from rgb.attacks.projections import linf_box, project_l1_ball_box, project_l1_values, solved_on_the_head
from rgb.core.threat import Norm, parse_norm

# Iteration indices after which p halves (resc_schedule = False: the raw iteration index is used).
_P_HALVING_AFTER = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
# The L2/L1 initialisation tiles the image with pattern blocks of side min(h, w) // _INIT_GRID.
_INIT_GRID = 5
# Square-L1 projects onto a slightly smaller ball so that float rounding cannot exceed eps.
_L1_SHRINK = 1 - 1e-6
# Square-L1 on the CPU projects over best's support and the rewritten window while they are at most this many pixels
# per row, and whole rows would solve on their head too (so the bits are those of whole rows); past it the first
# queries' large windows make the two cost about the same (issue 54).
_SUPPORT_MOST = 512
# With early stopping, fooled rows leave the batch (and the loop may end) every this many iterations.
_COMPACT_EVERY = 10


@dataclass
class SquareResult(AttackResult):
    """n_queries_used: model queries spent on each point (initial query included, at most n_queries + 1)."""

    n_queries_used: torch.Tensor


def square_p(i: int, p_init: float = 0.8) -> float:
    """Fraction of pixels changed at (0-based) iteration i: p_init, halved after each of _P_HALVING_AFTER."""
    return p_init / 2 ** sum(i > threshold for threshold in _P_HALVING_AFTER)


def square_window(p: float, h: int, w: int, norm: str) -> int:
    """Window side for fraction p on an h x w image: round(sqrt(p*h*w)), at least 1 (Linf) or odd and at
    least 3 (L2/L1), capped at min(h, w)."""
    return min(_SQUARE_NORMS[parse_norm(norm)].window_side(round(math.sqrt(p * h * w))), h, w)


def _pyramid(rows: int, cols: int, power: int) -> torch.Tensor:
    """Nested centred rectangles: cell value sum_{k >= m}^{K-1} 1/(k+1)^power, m = Chebyshev distance to the
    centre (rows//2, cols//2), K = max(rows//2, cols//2) + 1."""
    levels = max(rows // 2, cols // 2) + 1
    weights = 1.0 / torch.arange(1, levels + 1, dtype=torch.float64) ** power
    tail = weights.flip(0).cumsum(0).flip(0)
    row_distance = (torch.arange(rows) - rows // 2).abs()
    col_distance = (torch.arange(cols) - cols // 2).abs()
    return tail[torch.maximum(row_distance[:, None], col_distance[None, :])]


def square_pattern(side: int, norm: str) -> torch.Tensor:
    """The (side, side) L2/L1 proposal: a pyramid on the top side//2 rows, its negative below, each half
    and the whole normalised to unit norm (weights 1/(r+1)^2 with L2, 1/(r+1)^4 with L1); float64, CPU."""
    weights = _SQUARE_NORMS[parse_norm(norm)].pattern_weights
    if weights is None:
        raise ValueError("square_pattern is only defined for L2 and L1")
    power, order = weights

    def unit(block: torch.Tensor) -> torch.Tensor:
        return block / torch.linalg.vector_norm(block, ord=order) if block.numel() else block

    top = unit(_pyramid(side // 2, side, power))
    bottom = unit(_pyramid(side - side // 2, side, power))
    return unit(torch.cat([top, -bottom]))


def _query(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, z_y - max_{j != y} z_j) for a batch, labels y as a column (N, 1); forward only. The logits are
    inference tensors; what is computed from them here is not (so the loop keeps no clone of either)."""
    with torch.inference_mode():
        logits = model(x)
    true_logit = logits.gather(1, y).squeeze(1)
    return logits, true_logit - logits.scatter(1, y, float("-inf")).amax(dim=1)


def _bar(margin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(attacking, bar): the rows still robust (margin > 0), and the margin a candidate must get strictly below to
    be kept: the margin where attacking, else -inf. A candidate margin m is then kept iff m < bar, which is spec §5's
    rule (attacking and (m < margin or m <= 0): m <= 0 < margin implies m < margin), in one comparison per query."""
    attacking = margin > 0
    return attacking, torch.where(attacking, margin, float("-inf"))


def _windows(uniforms: torch.Tensor, sides: list[int], h: int, w: int, count: int) -> list[list[tuple]]:
    """Per query, `count` side x side windows (side from `sides`) with corners floor(U * (h - side)),
    floor(U * (w - side)) from that query's uniforms (top, left, top, left, ...; h - side is never drawn), as
    index tuples. All queries' corners are read on the host at once (one device read per run, none per query),
    so every window operation touches the window only."""
    spans = torch.tensor([[h - side, w - side] * count for side in sides], dtype=uniforms.dtype,
                         device=uniforms.device).view(len(sides), 2 * count)
    corners = (uniforms[:, :2 * count] * spans).long().view(len(sides), count, 2).tolist()
    return [[(..., slice(top, top + side), slice(left, left + side)) for top, left in query]
            for query, side in zip(corners, sides)]


def _overlap(first: tuple, second: tuple) -> tuple | None:
    """The intersection of two windows as an index tuple, or None when they do not overlap."""
    rows = slice(max(first[1].start, second[1].start), min(first[1].stop, second[1].stop))
    cols = slice(max(first[2].start, second[2].start), min(first[2].stop, second[2].stop))
    return (..., rows, cols) if rows.start < rows.stop and cols.start < cols.stop else None


def _window_planes(windows: list[list[tuple]], side: int, w: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions in the image plane (row * w + column) of the first and the second window of K queries of one
    side, each (K, side, side) (made from host lists: for the CPU's runs of queries)."""
    corners = torch.tensor([[window[1].start, window[2].start] for query in windows for window in query[:2]],
                           device=device).view(len(windows), 2, 2, 1)
    steps = torch.arange(side, device=device)
    planes = (corners[:, :, 0] + steps).mul_(w).unsqueeze(-1) + (corners[:, :, 1] + steps).unsqueeze(-2)
    return planes[:, 0], planes[:, 1]


def _windows_of(plane: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    """The values of images laid out as (N, C, h * w) at the positions `planes` (K, side, side): (K, N, C, side,
    side), a view of one contiguous copy."""
    n, c, _ = plane.shape
    count, rows, cols = planes.shape
    return plane.index_select(2, planes.flatten()).view(n, c, count, rows, cols).permute(2, 0, 1, 3, 4)


def _signs(uniform: torch.Tensor) -> torch.Tensor:
    """Random +-1 from uniforms in [0, 1)."""
    return torch.where(uniform < 0.5, -1.0, 1.0)


class _Geometry:
    """What Square's loop asks of a norm: a run of queries' candidates (`proposals`) from a per-query `propose`."""

    def proposals(self, state: LiveRows, queries: range, draws: Sequence, windows: list[list[tuple]],
                  sides: list[int], eps: float) -> Iterator[torch.Tensor]:
        """The candidates of `queries` (`draws`: the norm's per-query draws, from its `draws`), one at a time, each
        proposed when it is taken (from best as it then is; the loop stops taking them once a row may have changed)."""
        for query in queries:
            yield self.propose(state, draws[query], windows[query], sides[query], eps)


class _SquareLinf(_Geometry):
    """Square-Linf: vertical stripes to start; per query one window set to x -/+ eps with a sign per channel
    (uniforms: the window's corner, then the channel signs)."""

    pattern_weights = None  # (power, order) of the L2/L1 proposal pattern
    windows_per_query = 1
    any_layout = True  # element-wise only: NHWC images give the same bits (L2/L1 sum windows: NCHW order kept)
    smallest_image = 0  # side below which the start cannot be made

    @staticmethod
    def window_side(side: int) -> int:
        return max(side, 1)

    @staticmethod
    def uniforms_per_query(n: int, c: int) -> int:
        return 2 + c

    @staticmethod
    def draws(uniforms: torch.Tensor, n: int, c: int, eps: float) -> torch.Tensor:
        """Per query, the window's step 2 * eps * sign per channel, for all queries in one pass."""
        return (2 * eps * _signs(uniforms[:, 2:])).view(len(uniforms), c, 1, 1)

    def init(self, x: torch.Tensor, eps: float, generator) -> torch.Tensor:
        """x + eps * sign(image, channel, column), clipped."""
        n, c, h, w = x.shape
        stripes = _signs(torch.rand(n, c, 1, w, generator=generator, device=x.device))
        return (x + eps * stripes).clamp(0.0, 1.0)

    def prepare(self, rows: dict[str, torch.Tensor], eps: float) -> None:
        """The budget's box, computed once (rows leave with their box), and the candidate image: a copy of `best`
        that differs from it only inside the window being tried (so a query copies the window, not the image)."""
        rows["lower"], rows["upper"] = linf_box(rows["x"], eps)
        rows["candidate"] = rows["best"].clone()

    def propose(self, state: LiveRows, step: torch.Tensor, windows: list[tuple], side: int,
                eps: float) -> torch.Tensor:
        """x_best with the window set to x -/+ eps by one sign per channel shared by the batch (after the clip to
        the budget's box [lower, upper])."""
        x_best, candidate, window = state["best"], state["candidate"], windows[0]
        candidate[window] = (x_best[window] + step).clamp_(state["lower"][window], state["upper"][window])
        return candidate

    @staticmethod
    def accept(best: torch.Tensor, candidate: torch.Tensor, accept: torch.Tensor, windows: list[tuple],
               changed: bool) -> torch.Tensor:
        """The accepted rows' window (all that a candidate changed) copied into `best`, in place (only when a row may
        have been accepted, `changed`), and the candidate's window back to `best`'s."""
        window = windows[0]
        if changed:
            best[window] = torch.where(accept[:, None, None, None], candidate[window], best[window])
        candidate[window] = best[window]
        return best


class _SquareLp(_Geometry):
    """Square-L2/L1: a tiled pattern start; per query a new pattern in one window, the old content of both
    (uniforms: two windows' corners, the pattern's orientation, then a sign per image and channel). A subclass
    says how its norm measures and rescales (`mass`: additive over disjoint pixel sets)."""

    windows_per_query = 2
    smallest_image = _INIT_GRID
    any_layout = False

    def __init__(self):
        self.patterns = {}  # side -> the patterns of `transposed_patterns`, made once per run
        self.best_known = False  # whether the state's entries about best (`know_best`) are up to date

    @staticmethod
    def window_side(side: int) -> int:
        side = max(side, 3)
        return side + 1 - side % 2

    @staticmethod
    def uniforms_per_query(n: int, c: int) -> int:
        return 5 + n * c

    def mass(self, values: torch.Tensor) -> torch.Tensor:
        """Per (image, channel) mass over the spatial dims (the last two), shape (..., C, 1, 1)."""
        raise NotImplementedError

    def norm_of_mass(self, mass: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def image_norms(self, values: torch.Tensor) -> torch.Tensor:
        """Per-image norm, shape (N, 1, 1, 1)."""
        raise NotImplementedError

    def unused_share(self, eps: float, image_norm: torch.Tensor, c: int) -> torch.Tensor:
        """Each channel's share of the budget an image of norm `image_norm` leaves unused (in units of mass)."""
        raise NotImplementedError

    def window_norm(self, share: torch.Tensor, windows_mass: torch.Tensor) -> torch.Tensor:
        """The per-channel norm the new window content is scaled to: the windows' mass (..., C, 1, 1) plus the unused
        share."""
        raise NotImplementedError

    def to_feasible(self, x: torch.Tensor, delta: torch.Tensor, eps: float) -> torch.Tensor:
        """Candidate image from a perturbation direction."""
        raise NotImplementedError

    def channel_norms(self, values: torch.Tensor) -> torch.Tensor:
        """Per (image, channel) norm over the spatial dims (the last two), shape (..., C, 1, 1)."""
        return self.norm_of_mass(self.mass(values))

    def scaled(self, proposal: torch.Tensor, share: torch.Tensor, windows_mass: torch.Tensor) -> torch.Tensor:
        """A window's proposal (..., C, side, side) scaled per channel to `window_norm`."""
        return proposal / (self.channel_norms(proposal) + 1e-12) * self.window_norm(share, windows_mass)

    @staticmethod
    def draws(uniforms: torch.Tensor, n: int, c: int, eps: float) -> list[tuple[bool, torch.Tensor]]:
        """Per query, whether the pattern is transposed (all read on the host at once) and its sign per image and
        channel, shaped (N, C, 1, 1) to scale the pattern (for all queries in one pass)."""
        return list(zip((uniforms[:, 4] < 0.5).tolist(), _signs(uniforms[:, 5:]).view(len(uniforms), n, c, 1, 1)))

    def prepare(self, rows: dict[str, torch.Tensor], eps: float) -> None:
        """Best is looked at when first needed (`know_best`)."""
        self.best_known = False

    def know_best(self, state: LiveRows, eps: float) -> None:
        """Best's perturbation and each channel's share of the budget it leaves unused, kept until a row changes (on
        robust points most queries change none)."""
        state["delta"] = state["best"] - state["x"]
        state["share"] = self.unused_share(eps, self.image_norms(state["delta"]), state["x"].shape[1])
        self.best_known = True

    def accept(self, best: torch.Tensor, candidate: torch.Tensor, accept: torch.Tensor, windows: list[tuple],
               changed: bool) -> torch.Tensor:
        """The accepted rows of `candidate`, the others of `best` (a rescale or projection changed whole images);
        `best` as it is when no row may have been accepted (`changed`). What is known about best is found again once
        a row may have changed."""
        if not changed:
            return best
        self.best_known = False
        return common.rows_where(accept, candidate, best)

    def init(self, x: torch.Tensor, eps: float, generator) -> torch.Tensor:
        """Blocks of side min(h,w)//5 tiled from offset (h - 5*side)//2 (5x5 of them at 224x224; the reference's
        h//side per axis, cut at the border, elsewhere), each a pattern with random orientation and a sign per
        (image, channel)."""
        n, c, h, w = x.shape
        side = min(h, w) // _INIT_GRID
        n_rows, n_cols = h // side, w // side
        pattern = square_pattern(side, self.norm).to(x)
        transpose = torch.rand(n_rows * n_cols, generator=generator, device=x.device) < 0.5
        blocks = torch.where(transpose[:, None, None], pattern.T, pattern)
        signs = _signs(torch.rand(n, c, n_rows * n_cols, generator=generator, device=x.device))
        tiles = (signs[..., None, None] * blocks).view(n, c, n_rows, n_cols, side, side)
        grid = tiles.permute(0, 1, 2, 4, 3, 5).reshape(n, c, n_rows * side, n_cols * side)
        top, left = (h - _INIT_GRID * side) // 2, (w - _INIT_GRID * side) // 2
        rows, cols = min(grid.shape[2], h - top), min(grid.shape[3], w - left)
        delta = torch.zeros_like(x)
        delta[:, :, top:top + rows, left:left + cols] = grid[:, :, :rows, :cols]
        return self.to_feasible(x, delta, eps)

    def propose(self, state: LiveRows, draw: tuple[bool, torch.Tensor], windows: list[tuple], side: int,
                eps: float) -> torch.Tensor:
        """Spec §5 L2/L1 step: new pattern plus the old window content on W1 with the mass of W1 and W2, W2
        zeroed."""
        return self.to_feasible(state["x"], self.direction(state, draw, windows, side, eps), eps)

    def direction(self, state: LiveRows, draw: tuple[bool, torch.Tensor], windows: list[tuple], side: int,
                  eps: float) -> torch.Tensor:
        """The step's perturbation before it is made feasible: best's, with the windows rewritten."""
        if not self.best_known:
            self.know_best(state, eps)
        first, second = windows
        content = self.rewrite(state, draw, windows, side)
        delta = state["delta"].clone()
        delta[second] = 0.0
        delta[first] = content
        return delta

    def rewrite(self, state: LiveRows, draw: tuple[bool, torch.Tensor], windows: list[tuple], side: int
                ) -> torch.Tensor:
        """The first window's new perturbation for one query, from best (N, C, side, side): a pattern plus best's old
        content there, with the mass of both windows and a share of the budget best leaves unused (state's `delta`
        and `share`, `know_best`). The oriented pattern is column-major in memory (a transposed view of
        `transposed_patterns`), so the proposal's norm sums in the window's column order. Windows as slices: for one
        query on whole images the index tensors of Square-L1's `rewrites` cost ~0.1 ms more (issue 54)."""
        transposed, signs = draw
        if len(state) < len(signs):
            signs = signs[state.positions]
        pattern = self.transposed_patterns(side, state["x"])[int(transposed)].mT  # random orientation
        first, second = windows
        delta = state["delta"]
        in_first = delta[first]
        first_mass = self.mass(in_first)
        overlap = _overlap(first, second)
        windows_mass = first_mass + self.mass(delta[second])
        if overlap is not None:  # the union's mass: the overlap counts once
            windows_mass = (windows_mass - self.mass(delta[overlap])).clamp_min_(0.0)
        return self.scaled(pattern * signs + in_first / (self.norm_of_mass(first_mass) + 1e-12), state["share"],
                           windows_mass)

    def transposed_patterns(self, side: int, like: torch.Tensor) -> torch.Tensor:
        """The pattern of `side` in a window's transposed frame, as drawn (index 0) and transposed (index 1),
        (2, side, side) on `like`'s device and dtype, made once per run."""
        if side not in self.patterns:
            pattern = square_pattern(side, self.norm).to(like)
            self.patterns[side] = torch.stack((pattern.T, pattern))
        return self.patterns[side]


class _SquareL2(_SquareLp):
    """Square-L2: sums of squares; candidates rescaled onto the L2 sphere, then clipped."""

    norm = Norm.L2
    pattern_weights = (2, 2)

    def mass(self, values):
        return values.square().sum(dim=(-2, -1), keepdim=True)

    def norm_of_mass(self, mass):
        return mass.sqrt()

    def image_norms(self, values):
        return self.channel_norms(values).square().sum(dim=1, keepdim=True).sqrt()

    def unused_share(self, eps, image_norm, c):
        return (eps**2 - image_norm.square()).clamp_min(0.0) / c

    def window_norm(self, share, windows_mass):
        return (share + windows_mass).sqrt()

    def to_feasible(self, x, delta, eps):
        return torch.addcmul(x, delta, eps / (self.image_norms(delta) + 1e-12)).clamp_(0.0, 1.0)


class _SquareL1(_SquareLp):
    """Square-L1: sums of magnitudes; candidates projected onto the L1 ball (radius eps * (1 - 1e-6)) intersected
    with the box."""

    norm = Norm.L1
    pattern_weights = (4, 1)

    def mass(self, values):
        return values.abs().sum(dim=(-2, -1), keepdim=True)

    def norm_of_mass(self, mass):
        return mass

    def image_norms(self, values):
        return self.channel_norms(values).sum(dim=1, keepdim=True)

    def unused_share(self, eps, image_norm, c):
        return (eps - image_norm).clamp_min(0.0) / c

    def window_norm(self, share, windows_mass):
        return windows_mass.shape[-3] * (share + windows_mass)

    def __init__(self):
        super().__init__()
        self.plane = None  # per flat pixel index (and the padding D), its position in the image plane (padding: h*w)
        self.on_support = False  # whether candidates are projected over best's support (on the CPU)

    def to_feasible(self, x, delta, eps):
        return project_l1_ball_box(x, delta, eps * _L1_SHRINK).add_(x).clamp_(0.0, 1.0)

    def prepare(self, rows: dict[str, torch.Tensor], eps: float) -> None:
        """`start`: what a projection that leaves a pixel 0 makes of it (0 + x, clipped: x's bits for x in [0, 1]
        with no -0); `radius`: the ball's radius per row."""
        x = rows["x"]
        rows["start"] = torch.zeros_like(x).add_(x).clamp_(0.0, 1.0)
        self.on_support = common.host_reads_are_free(x.device)
        if self.on_support:
            rows["radius"] = torch.full((len(x),), eps * _L1_SHRINK, dtype=x.dtype, device=x.device)
        super().prepare(rows, eps)

    def know_best(self, state: LiveRows, eps: float) -> None:
        """On the CPU also best's support (its columns padded with D, `_nonzero_columns`) and what a query reads there:
        x, best's perturbation and their positions in the image plane."""
        super().know_best(state, eps)
        x, delta = state["x"], state["delta"]
        if not self.on_support:
            return  # no support path there (finding the support reads on the host)
        n, c, h, w = x.shape
        if self.plane is None:
            positions = torch.arange(c * h * w, device=x.device) % (h * w)
            self.plane = torch.cat((positions, positions.new_full((1,), h * w)))
        padding = x.new_zeros(n, 1)
        support = _nonzero_columns(delta.view(n, -1))
        state["support"] = support
        state["support_x"] = torch.cat((x.view(n, -1), padding), dim=1).gather(1, support)
        state["support_delta"] = torch.cat((delta.view(n, -1), padding), dim=1).gather(1, support)
        state["support_plane"] = self.plane[support]

    def proposals(self, state: LiveRows, queries: range, draws: Sequence, windows: list[list[tuple]],
                  sides: list[int], eps: float) -> Iterator[torch.Tensor]:
        """The candidates of `queries` (the caller stops taking them once a row may have changed). On the CPU, runs
        of queries of one side are projected together over the pixels each candidate can have nonzero
        (`_on_support`); whole rows, one query at a time, where these are too many, or where whole rows would not
        solve on their head (`solved_on_the_head`: the same bits either way)."""
        if not self.on_support:
            yield from super().proposals(state, queries, draws, windows, sides, eps)
            return
        x = state["x"]
        n, c, h, w = x.shape
        query = queries.start
        while query < queries.stop:
            if not self.best_known:
                self.know_best(state, eps)
            side = sides[query]
            width = state["support"].shape[1] + c * side * side
            if width > _SUPPORT_MOST or not solved_on_the_head(c * h * w, width):
                yield super().propose(state, draws[query], windows[query], side, eps)
                query += 1
                continue
            end = query + 1
            while end < queries.stop and sides[end] == side:
                end += 1
            yield from self._on_support(state, draws[query:end], windows[query:end], side, eps)
            query = end

    def rewrites(self, state: LiveRows, draws: list[tuple[bool, torch.Tensor]], windows: list[list[tuple]],
                 side: int, planes: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """`rewrite` for each of K queries of one side (their windows' `_window_planes`: `planes`), all from best, in
        one pass (K, N, C, side, side), each with the bits of `rewrite`: masses are summed over the windows in their
        row order (a contiguous copy of a window sums as its slice does), the proposal's norm in the window's column
        order, so the proposal is made in the window's transposed frame and transposed back. CPU only (the support
        path): the planes are made from host lists, a copy that would wait for a GPU."""
        x, delta = state["x"], state["delta"]
        n, c, h, w = x.shape
        signs = torch.stack([signs for _, signs in draws])
        if n < signs.shape[1]:
            signs = signs[:, state.positions]
        patterns = self.transposed_patterns(side, x)[[int(transposed) for transposed, _ in draws]]
        first_planes, second_planes = planes
        plane = delta.view(n, c, h * w)
        first_mass = self.mass(_windows_of(plane, first_planes))
        windows_mass = first_mass + self.mass(_windows_of(plane, second_planes))
        in_first = _windows_of(plane, first_planes.transpose(1, 2))
        for query, (first, second) in enumerate(windows):
            overlap = _overlap(first, second)
            if overlap is not None:  # the union's mass: the overlap counts once
                windows_mass[query].sub_(self.mass(delta[overlap])).clamp_min_(0.0)
        proposal = patterns[:, None, None] * signs + in_first / (self.norm_of_mass(first_mass) + 1e-12)
        return self.scaled(proposal, state["share"], windows_mass).transpose(-2, -1)

    def _on_support(self, state: LiveRows, draws: list[tuple[bool, torch.Tensor]], windows: list[list[tuple]],
                    side: int, eps: float) -> Iterator[torch.Tensor]:
        """The L2/L1 step of K queries of one side from best, projected together on the CPU over the pixels each
        candidate can have nonzero: best's support (tens of pixels: each projection zeroes all below its threshold)
        outside both windows, and the first window, whose content is new (the second window's is now 0, so its pixels
        project to 0, as padding does). One projection of K x N rows (each row's bits are its own) instead of K. A
        candidate is `start` with its projected pixels written in, made when it is taken: no whole-image pass but one
        copy (the bits of the whole rows' projection plus x, clipped, where they solve the same head; tests pin
        it)."""
        x = state["x"]
        n, c, h, w = x.shape
        count, kept = len(windows), state["support"].shape[1]
        first_planes, second_planes = _window_planes(windows, side, w, x.device)
        content = self.rewrites(state, draws, windows, side, (first_planes, second_planes))
        covered = torch.zeros(count, h * w + 1, dtype=torch.bool, device=x.device)
        covered[:, -1] = True  # padding counts as covered by every query's windows
        covered.scatter_(1, first_planes.view(count, -1), True).scatter_(1, second_planes.view(count, -1), True)
        replaced = covered[:, state["support_plane"]]  # (K, N, kept): padding, or rewritten by the step
        # a replaced pixel's delta is 0 (its x then leaves its terms 0 too; its value is written over, see below)
        in_first = _windows_of(x.view(n, c, h * w), first_planes).reshape(count, n, -1)
        x_values = torch.cat((state["support_x"].expand(count, n, kept), in_first), dim=2).view(count * n, -1)
        delta_values = torch.cat((state["support_delta"].expand(count, n, kept).masked_fill(replaced, 0.0),
                                  content.reshape(count, n, -1)), dim=2).view(count * n, -1)
        values = project_l1_values(x_values, delta_values, state["radius"].repeat(count))
        values = values.add_(x_values).clamp_(0.0, 1.0).view(count, n, -1)
        # replaced columns write at the first window's corner: the window then overwrites it
        columns = torch.where(replaced, first_planes[:, :1, :1], state["support"])
        in_support, in_window = values[:, :, :kept].unbind(0), values[:, :, kept:].view(count, n, c, side, side)
        for (first, _), at, kept_values, window_values in zip(windows, columns.unbind(0), in_support,
                                                             in_window.unbind(0)):
            candidate = state["start"].clone()
            candidate.view(n, -1).scatter_(1, at, kept_values)
            candidate[first] = window_values
            yield candidate


def _nonzero_columns(values: torch.Tensor) -> torch.Tensor:
    """The columns of each row of `values` (N, D) that hold a nonzero, ascending, (N, K) for the largest count K,
    padded with D."""
    nonzero = values.bool()
    counts = nonzero.sum(dim=1)
    rows, columns = nonzero.nonzero().unbind(dim=1)
    width = int(counts.max()) if len(counts) else 0
    starts = counts.cumsum(dim=0).sub_(counts)
    found = torch.full((values.shape[0], width), values.shape[1], dtype=torch.long, device=values.device)
    found[rows, torch.arange(len(rows), device=values.device) - starts[rows]] = columns
    return found


# The one place a norm name picks Square's behaviour (a class: a run's instance keeps its pattern cache).
_SQUARE_NORMS: dict[Norm, type] = {Norm.LINF: _SquareLinf, Norm.L2: _SquareL2, Norm.L1: _SquareL1}


def square(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    norm: str,
    eps: float,
    n_queries: int = 5000,
    p_init: float = 0.8,
    generator: torch.Generator | int | None = None,
    early_stop: bool = True,
    counter: EvalCounter | None = None,
    progress: Progress | None = None,
) -> SquareResult:
    """Untargeted Square Attack (spec §5) on images x in [0,1] (N, C, H, W) with labels y.

    Every row is attacked; callers pass the points that are still correctly classified. `generator` is a
    torch.Generator on x's device, an int seed for a fresh one, or None for the device's global RNG.
    `early_stop` drops fooled points from the batch and ends the loop once all are fooled (a host sync
    every few iterations); without it the loop keeps fixed shapes. Results are identical. Either way the window
    corners of all queries are read on the host once, before the first query (windows are slices, not
    full-image masks), so no query waits for the device.
    `progress` hears (queries done, n_queries) after every query.
    """
    norm = parse_norm(norm)
    geometry = _SQUARE_NORMS[norm]()
    check_eps(eps)
    if x.dim() != 4:
        raise ValueError(f"square expects images of shape (N, C, H, W), got {tuple(x.shape)}")
    if y.dim() != 1 or x.shape[0] != y.shape[0]:
        raise AttackInputError(f"square expects labels y of shape (N,) for {x.shape[0]} images, got {tuple(y.shape)}")
    if n_queries < 0 or not 0 < p_init <= 1:
        raise ValueError(f"need n_queries >= 0 and 0 < p_init <= 1, got {n_queries} and {p_init}")
    n, c, h, w = x.shape
    if min(h, w) < geometry.smallest_image:
        raise ValueError(f"Square-{norm} needs images of at least {_INIT_GRID}x{_INIT_GRID}, got {h}x{w}")
    if isinstance(generator, torch.Generator) and generator.device.type != x.device.type:
        raise ValueError(f"the generator is on {generator.device.type}, the images on {x.device.type}")
    counter = EvalCounter(parent=counter)
    generator = make_generator(generator, x.device)
    x = x.detach() if geometry.any_layout else x.detach().contiguous()

    x_best = geometry.init(x, eps, generator)
    labels = y.view(-1, 1)
    logits, margin = _query(model, x_best, labels)
    counter.forward(n)
    attacking, bar = _bar(margin)
    queries = torch.ones(n, dtype=torch.long, device=x.device)
    rows = {"x": x, "y": labels, "best": x_best, "predicted": logits.argmax(dim=1), "queries": queries,
            "margin": margin, "attacking": attacking, "bar": bar}
    geometry.prepare(rows, eps)
    state = LiveRows(rows, outputs=("best", "predicted", "queries"))
    # Every query's random numbers are drawn before the loop: a whole draw gives the numbers of one draw per
    # query on the CPU (on other devices other numbers, as another batch would), and the window corners are read
    # on the host once (see _windows).
    sides = [square_window(square_p(iteration, p_init), h, w, norm) for iteration in range(n_queries)]
    uniforms = torch.rand(n_queries, geometry.uniforms_per_query(n, c), generator=generator, device=x.device)
    windows = _windows(uniforms, sides, h, w, geometry.windows_per_query)
    draws = geometry.draws(uniforms, n, c, eps)
    reads_are_free = common.host_reads_are_free(x.device)
    iteration = 0
    while iteration < n_queries:
        if early_stop and iteration % _COMPACT_EVERY == 0 and state.keep(state["attacking"]) == 0:
            break
        # The queries up to the next point where rows may leave are proposed as one run (Square-L1 on the CPU
        # projects them in one pass); it ends early once a row may have been accepted (the rest are from an old
        # best, unused). Runs are not shortened where rows are often accepted: Square-L1's runs cost ~3 ms each
        # plus ~0.1 ms per query, and shorter runs after an accepted row cost more than the proposals they saved
        # (issue 54: 1254 runs against 735, +0.4 s).
        queries = range(iteration, min(n_queries, iteration - iteration % _COMPACT_EVERY + _COMPACT_EVERY))
        for candidate in geometry.proposals(state, queries, draws, windows, sides, eps):
            logits, candidate_margin = _query(model, candidate, state["y"])
            counter.forward(len(state))
            accept = candidate_margin < state["bar"]
            # On the CPU one host read says whether any row was accepted (on robust points most queries accept
            # none: then best, its margin and its prediction stay as they are); elsewhere every update runs, with
            # no read.
            changed = not reads_are_free or bool(accept.any())
            state["best"] = geometry.accept(state["best"], candidate, accept, windows[iteration], changed)
            state["queries"] = state["queries"] + state["attacking"]
            if changed:
                state["margin"] = torch.where(accept, candidate_margin, state["margin"])
                state["predicted"] = torch.where(accept, logits.argmax(dim=1), state["predicted"])
                state["attacking"], state["bar"] = _bar(state["margin"])
            iteration += 1
            if progress is not None:
                progress(iteration, n_queries)
            if changed:
                break
    full = state.sync()

    fooled = full["predicted"] != y
    x_adv = torch.where(fooled[:, None, None, None], full["best"], x)
    return SquareResult(x_adv=x_adv, fooled=fooled, forward_rows=counter.forward_rows,
                        backward_rows=counter.backward_rows, n_queries_used=full["queries"])
