"""What every attack shares: the attack protocol and its result, per-sample norms, eps broadcasting, RNG,
evaluation counting and the live-row bookkeeping of loops that drop finished points."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from rgb.core.errors import UserError
from rgb.core.threat import Norm, lp_norm  # lp_norm: re-exported, so rgb.attacks.common.lp_norm keeps working


@dataclass
class AttackResult:
    """What every attack returns. x_adv: the adversarial image where `fooled` (argmax != y within the budget),
    else exactly the clean image; forward_rows / backward_rows: model evaluations this call spent, in rows."""

    x_adv: torch.Tensor
    fooled: torch.Tensor
    forward_rows: int
    backward_rows: int


Progress = Callable[..., None]
"""An attack's progress hook, called as `progress(*position)` once per step with plain ints that locate the step,
outermost first: (step, n_steps), or (target, n_targets, step, n_steps) for a targeted attack. Positions only
grow during one call. Attacks never compute anything for it (no host sync); callers throttle it."""


def nested(progress: Progress | None, *outer: int) -> Progress | None:
    """The hook for an inner loop: its positions prefixed by the outer loop's `outer` ones."""
    return None if progress is None else functools.partial(progress, *outer)


class Attack(Protocol):
    """An attack: images x in [0,1] (N, ...) with labels y under an (norm, eps) budget -> AttackResult.

    Other keyword arguments are the attack's own; `counter`, if given, is also charged every evaluation, and
    `progress`, if given, hears every step (see `Progress`)."""

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, norm: str | Norm,
                 eps: float | torch.Tensor, counter: EvalCounter | None = None, progress: Progress | None = None,
                 **params) -> AttackResult: ...


class AttackError(UserError, RuntimeError):
    """A returned adversarial image breaks the threat model (budget, [0,1] box, NaN, or the cascade rule), or the
    model's logits are not finite."""


class AttackInputError(UserError, ValueError):
    """Images or labels an attack cannot take (not (N,C,H,W) in [0,1], no images, labels not one integer class
    index per image), or a batch size that is not a positive integer."""


def per_sample(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`value` (a float or a (N,) tensor) as a tensor that broadcasts against `like` sample by sample."""
    value = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if value.dim() == 0:
        value = value.expand(like.shape[0])
    if value.shape != (like.shape[0],):
        raise ValueError(f"expected a scalar or a ({like.shape[0]},) tensor, got shape {tuple(value.shape)}")
    return as_column(value, like)


def as_column(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """View per-sample `values` (N,) as (N, 1, ..., 1) to broadcast against `like`."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def host_reads_are_free(device: torch.device) -> bool:
    """Whether a loop may read a device value on the host (a Python bool of a tensor) at no cost: only on the
    CPU. Elsewhere each read waits for the device to drain its queue, so attack iterations never read there
    (tests/test_attacks_syncs.py counts the reads with this set to False)."""
    return device.type == "cpu"


def rows_where(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The rows of `new` where `mask` (N,) holds, of `old` elsewhere. On the CPU, where a host read is free, a
    uniform mask (on robust points no row turns adversarial at most steps) returns one of the two as it is, without
    a pass over the images, so the caller must not update either in place afterwards."""
    if host_reads_are_free(new.device):
        if not bool(mask.any()):
            return old
        if bool(mask.all()):
            return new
    return torch.where(as_column(mask, new), new, old)


def rows_into(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """`rows_where(mask, new, old)`, written into `old` on the CPU: only the flagged rows are copied (a `where` passes
    over every image; a loop keeping a best iterate replaces a few rows per step). `old` must share memory with no
    tensor that is read later, and the answer is always `old` there, never `new`. Elsewhere a `where` (no host read)."""
    if not host_reads_are_free(new.device):
        return torch.where(as_column(mask, new), new, old)
    rows = mask.nonzero().squeeze(1)
    if rows.numel() == mask.numel():
        return old.copy_(new)
    if rows.numel():
        old[rows] = new[rows]
    return old


def largest_first(values: torch.Tensor, enough: Callable[[torch.Tensor, torch.Tensor], bool], first: int = 64):
    """The largest entries of each row of `values` (N, D) in decreasing order with their indices, (N, k) each,
    for the smallest k in first, 4 * first, ... , D at which `enough(top, order)` (a Python bool: a host read)
    holds (`first`: the head a caller usually needs, so that most calls select once).

    A loop that needs only the head of each row's order stops early: on the CPU a partial selection of the top
    k is several times cheaper than sorting the whole row, and host reads cost nothing there. On other devices
    the whole row is sorted at once (no host sync). Tied values may come in either order.
    """
    width = values.shape[1]
    if not host_reads_are_free(values.device):
        return values.sort(dim=1, descending=True)
    k = min(width, first)
    while True:
        top, order = values.topk(k, dim=1)
        if k == width or enough(top, order):
            return top, order
        k = min(width, 4 * k)


# Entries per block of kth_largest on the CPU: the blocks' maxima cost about one pass, and the selection then looks
# at this many entries per wanted rank instead of the whole row (APGD-L1 wants 3-21 of 3072 at 3x32x32; 8 and 32
# were slower on its calls). Rows whose width it does not divide (3x299x299) take the whole-row selection.
_KTH_BLOCK = 16


def kth_largest(values: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k-th largest entry of each row of `values` (N, D), k (N,) in [1, D]: shape (N, 1).

    A value, not a position, so any selection gives the same bits. On the CPU one selection of exactly what is
    needed: a quickselect (`kthvalue`) where every row wants the same k (APGD-L1's first steps, q = 0.2 of a row,
    about a quarter of a full `topk` loop's time), else one `topk` of the largest k; where k is a small share of the
    row, over the entries of the blocks with the largest maxima only (APGD-L1's later steps: 0.25 -> 0.19 ms per call
    at 31 x 3072, issue 54); elsewhere a sort (no host sync).
    """
    if not host_reads_are_free(values.device):
        return values.sort(dim=1, descending=True)[0].gather(1, (k - 1)[:, None])
    if values.shape[0] == 0:
        return values.new_empty(0, 1)
    smallest, largest = (int(v) for v in k.aminmax())
    n, width = values.shape
    if width % _KTH_BLOCK == 0 and 4 * _KTH_BLOCK * largest <= width:
        # The `largest` blocks with the largest maxima hold k entries at or above the row's k-th largest v (k <=
        # largest): the row's top k entries are all in them, or one is in a block left out, whose maximum (>= v) is at
        # most each chosen block's, so the chosen maxima are k entries >= v. Their entries, a subset of the row, have
        # the same k-th largest. Block j holds the entries j, j + D / B, ... (B = _KTH_BLOCK): the maxima are then B - 1
        # elementwise maxima of contiguous slices, about one pass, and the selection looks at B entries per rank.
        blocks = values.reshape(n, _KTH_BLOCK, width // _KTH_BLOCK)
        chosen = blocks.amax(dim=1).topk(largest, dim=1)[1]
        values = blocks.gather(2, chosen[:, None, :].expand(-1, _KTH_BLOCK, -1)).view(n, -1)
    if smallest == largest:
        return values.kthvalue(values.shape[1] - largest + 1, dim=1, keepdim=True)[0]
    return values.topk(largest, dim=1)[0].gather(1, (k - 1)[:, None])


def runner_up_targets(clean_logits: torch.Tensor, n_targets: int) -> torch.Tensor:
    """The targets of APGD-T and FAB-T (spec §2.5): (N, n_targets) classes of clean-logit ranks 2..n_targets+1,
    in that order. One tie rule for both: of equal logits the higher class index ranks first, as the reference
    ranks them (it reads `logits.sort()[1][:, -rank]`, an ascending sort from the end) wherever its sort keeps
    equal logits in class order (torch's CPU sort does on short rows; on 100+ classes its order is unspecified)."""
    n_classes = clean_logits.shape[1]
    if not 1 <= n_targets <= n_classes - 1:
        raise ValueError(f"n_targets must be in [1, {n_classes - 1}] for {n_classes} classes, got {n_targets}")
    return clean_logits.argsort(dim=1, stable=True).flip(1)[:, 1:n_targets + 1]


def check_eps(eps: float | torch.Tensor) -> None:
    """Reject negative budgets (a host sync, so call it once per attack, not per step)."""
    if bool((torch.as_tensor(eps) < 0).any()):
        raise ValueError(f"eps must be >= 0, got {eps}")


def make_generator(generator: torch.Generator | int | None, device: torch.device) -> torch.Generator | None:
    """A generator on `device`: pass one through, seed a fresh one from an int, or None for the global RNG."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    seeded = torch.Generator(device=device)
    seeded.manual_seed(int(generator))
    return seeded


@dataclass
class EvalCounter:
    """Model evaluations spent by attacks, in rows (one row = one image through the model).

    Attacks call `forward(n)` for every forward pass over n rows and `backward(n)` for every backward pass,
    so a caller can report the cost per attacked image. A counter with a `parent` also charges the parent:
    an attack counts its own call while the caller's counter keeps the running total.
    """

    forward_rows: int = 0
    backward_rows: int = 0
    parent: EvalCounter | None = None

    def forward(self, n_rows: int) -> None:
        self.forward_rows += int(n_rows)
        if self.parent is not None:
            self.parent.forward(n_rows)

    def backward(self, n_rows: int) -> None:
        self.backward_rows += int(n_rows)
        if self.parent is not None:
            self.parent.backward(n_rows)

    def per_image(self, n_images: int) -> dict[str, float]:
        """Forward and backward rows per attacked image."""
        if n_images <= 0:
            raise ValueError(f"n_images must be positive, got {n_images}")
        return {"forward": self.forward_rows / n_images, "backward": self.backward_rows / n_images}


def unfinished(finished: torch.Tensor, groups: torch.Tensor | None) -> torch.Tensor:
    """Rows to keep working on: those not finished, or, with `groups` (a point id per row, when several rows
    attack one point side by side), those whose point has no finished row: a point leaves with all its rows."""
    if groups is None:
        return ~finished
    return ~torch.isin(groups, groups[finished])


def side_by_side(points: torch.Tensor, targets_left: int, tail_rows: int
                 ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """The rows of the next targeted run over `points` (spec §6.3 item 8): one target, or, once the points times
    the targets left fit in `tail_rows`, all of them side by side, run-major. Returns (the point of each row,
    the group id of each row, its position in `points`, or None for one target; the number of targets run)."""
    if targets_left < 2 or points.numel() * targets_left > tail_rows:
        return points, None, 1
    groups = torch.arange(points.numel(), device=points.device).repeat(targets_left)
    return points.repeat(targets_left), groups, targets_left


def first_success(success: torch.Tensor, copies: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For run-major rows of `copies` runs per point (`side_by_side`) and their success flags (copies * m,):
    (did any run succeed, per point (m,); the row of its first successful run, or of its first run (m,))."""
    by_run = success.view(copies, -1)
    points = torch.arange(by_run.shape[1], device=success.device)
    return by_run.any(dim=0), by_run.int().argmax(dim=0) * by_run.shape[1] + points


class LiveRows:
    """The rows of a batch that an attack loop still works on: drop finished points without losing their results.

    `state` maps names to per-row tensors of the live rows only; `results` holds the tensors named in `outputs`
    for every row of the batch, brought up to date by `sync`. Dropping rows assumes the model treats samples
    independently (eval mode).
    """

    def __init__(self, state: dict[str, torch.Tensor], outputs: Iterable[str]):
        self.state = dict(state)
        first = next(iter(self.state.values()))
        self.positions = torch.arange(first.shape[0], device=first.device)
        self.results = {name: self.state[name].clone() for name in outputs}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.state[name]

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self.state[name] = value

    def __len__(self) -> int:
        return self.positions.numel()

    def sync(self) -> dict[str, torch.Tensor]:
        """Write the live rows' outputs into `results` (which is returned)."""
        for name, full in self.results.items():
            full[self.positions] = self.state[name]
        return self.results

    def keep(self, mask: torch.Tensor) -> int:
        """Keep only the live rows where `mask` holds (one host sync), the dropped rows' outputs written into
        `results` first (the kept rows' wait for `sync`: a check that drops nothing copies nothing); returns how many
        remain."""
        kept = mask.nonzero().squeeze(1)
        if kept.numel() < self.positions.numel():
            dropped = mask.logical_not().nonzero().squeeze(1)
            for name, full in self.results.items():
                full[self.positions[dropped]] = self.state[name][dropped]
            self.state = {name: value[kept] for name, value in self.state.items()}
            self.positions = self.positions[kept]
        return kept.numel()

