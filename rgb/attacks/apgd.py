"""Auto-PGD (Croce & Hein 2020) for Linf/L2 and its L1 variant (Croce & Hein 2021), spec §2-§3.

The algorithm follows the reference step for step. Speed-ups are from the exact class of spec §6.3: clean
logits are reusable, and with `early_stop` a point is frozen at its first adversarial iterate and dropped
from the batch every few iterations (one host sync each time; none inside the step itself).
Dropping rows assumes samples are independent, i.e. the model is in eval mode.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import torch
from torch import nn

from rgb.attacks import common
from rgb.attacks.common import (AttackResult, EvalCounter, LiveRows, Progress, as_column, check_eps, first_success,
                                kth_largest, make_generator, nested, per_sample, runner_up_targets, side_by_side,
                                unfinished)
from rgb.attacks.losses import ce_loss, dlr_loss, targeted_dlr_loss
from rgb.attacks.projections import linf_box, project_l1_ball_box, project_l2, project_linf
from rgb.core.threat import Norm, parse_norm

LOSSES = ("ce", "dlr", "dlr-targeted")
# Iterations between host syncs that drop fooled points (early_stop) and stop once all are fooled.
COMPACT_EVERY = 5


@dataclass
class APGDResult(AttackResult):
    """x_best: highest-loss iterate per sample (the training inner attack's output), loss_best its loss."""

    x_best: torch.Tensor
    loss_best: torch.Tensor


def checkpoint_schedule(n_iter: int) -> list[int]:
    """0-based iterations at which Linf/L2 APGD checks its step size ({21,40,56,69,79,86,92,98} for 100)."""
    length, min_length, decrement = max(int(0.22 * n_iter), 1), max(int(0.06 * n_iter), 1), max(int(0.03 * n_iter), 1)
    checkpoints, i = [], length - 1
    while i < n_iter:
        checkpoints.append(i)
        length = max(length - decrement, min_length)
        i += length
    return checkpoints


def l1_check_period(n_iter: int) -> int:
    """Iterations between L1 sparsity/step checks (1 for the 30/40-iteration stages of the eps schedule)."""
    return max(int(0.04 * n_iter), 1)


def l1_eps_stages(n_iter: int) -> list[tuple[float, int]]:
    """'largereps' schedule: (eps multiplier, iterations) = [(3, 30), (2, 30), (1, 40)] for n_iter = 100."""
    first = math.ceil(0.3 * n_iter)
    return [(3.0, first), (2.0, first), (1.0, n_iter - 2 * first)]


class _Objective:
    """Model + loss: logits, per-sample loss and input gradient, counting evaluations.

    With `eot_iter` > 1 (randomised defences) the gradient is averaged over that many forward/backward
    passes (Expectation over Transformation); logits and loss are those of the last pass, as in the reference.
    """

    def __init__(self, model: nn.Module, loss: str, counter: EvalCounter, eot_iter: int = 1):
        self.model, self.loss, self.counter, self.eot_iter = model, loss, counter, eot_iter

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        self.counter.forward(x.shape[0])
        with torch.no_grad():
            return self.model(x).float()

    def loss_and_grad(self, x: torch.Tensor, y: torch.Tensor, y_target: torch.Tensor | None):
        self.counter.forward(x.shape[0] * self.eot_iter)
        self.counter.backward(x.shape[0] * self.eot_iter)
        x = x.detach().requires_grad_(True)
        grad = None
        for _ in range(self.eot_iter):
            with torch.enable_grad():
                logits = self.model(x).float()
                if self.loss == "ce":
                    loss = ce_loss(logits, y)
                elif self.loss == "dlr":
                    loss = dlr_loss(logits, y)
                else:
                    loss = targeted_dlr_loss(logits, y, y_target)
                pass_grad = torch.autograd.grad(loss.sum(), x)[0]
            grad = pass_grad if grad is None else grad + pass_grad
        return logits.detach(), loss.detach(), grad if self.eot_iter == 1 else grad / self.eot_iter


class _Ball:
    """What one norm means to APGD: its random start, its projection onto the ball intersected with the [0, 1] box,
    its ascent direction, and (in `steps`) the step rule and step-size schedule of its algorithm."""

    first_step = 2.0  # the default first step size, in units of eps
    eps_schedules: tuple[str, ...] = ()  # eps schedules other than None that this norm runs

    def random_start(self, x: torch.Tensor, eps: torch.Tensor, generator) -> torch.Tensor:
        raise NotImplementedError

    def project(self, x: torch.Tensor, x_new: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, s: dict[str, torch.Tensor]) -> None:
        """Add per-row tensors that make `project_rows` cheap (computed once per run, dropped with the rows)."""

    def project_rows(self, s: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        """`project` for the live rows of state `s` (may work in place on v, a fresh iterate)."""
        return self.project(s["x"], v, s["eps"])

    def ascent(self, s: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def steps(self, n_iter: int, first_step: float, momentum: float, rho: float) -> _Steps:
        """A run's step rule: Linf and L2 share APGD's momentum steps and checkpoint schedule."""
        return _MomentumSteps(self, n_iter, momentum, rho)


class _LinfBall(_Ball):
    """Linf: uniform-direction start on the sphere, the sign of the gradient, a clip onto a box computed once."""

    def random_start(self, x, eps, generator):
        t = 2 * torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype) - 1
        t = t / (as_column(t.flatten(1).abs().amax(dim=1), x) + 1e-12)
        return (x + per_sample(eps, x) * t).clamp(0.0, 1.0)

    def project(self, x, x_new, eps):
        return project_linf(x, x_new, eps)

    def prepare(self, s):
        s["lower"], s["upper"] = linf_box(s["x"], s["eps"])

    def project_rows(self, s, v):
        return v.clamp_(s["lower"], s["upper"])

    def ascent(self, s):
        return torch.sign(s["grad"])


class _L2Ball(_Ball):
    """L2: Gaussian-direction start on the sphere, the normalised gradient."""

    def random_start(self, x, eps, generator):
        t = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        t = t / (as_column(t.flatten(1).norm(dim=1), x) + 1e-12)
        return (x + per_sample(eps, x) * t).clamp(0.0, 1.0)

    def project(self, x, x_new, eps):
        return project_l2(x, x_new, eps)

    def ascent(self, s):
        return s["grad"] / (as_column(s["grad"].flatten(1).norm(dim=1), s["x"]) + 1e-12)


class _L1Ball(_Ball):
    """L1 (spec §3): a projected Gaussian start, a sparse ascent on the top-q share of the gradient's coordinates."""

    first_step = 1.0
    eps_schedules = ("largereps",)

    def random_start(self, x, eps, generator):
        t = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return x + project_l1_ball_box(x, t, eps)

    def project(self, x, x_new, eps):
        return x + project_l1_ball_box(x, x_new - x, eps)

    def ascent(self, s):
        grad = s["grad"]
        n_features = grad[0].numel()
        # The gradient's rows read in its memory order (NHWC from a channels_last model call: no copy): the
        # threshold is a value, the selection elementwise and the count of selected signs exact in any order.
        order = [0] + sorted(range(1, grad.dim()), key=grad.stride, reverse=True)
        laid_out = grad.permute(order)
        rows = laid_out.reshape(grad.shape[0], n_features)
        magnitude = rows.abs()
        # The entry at sorted position (1 - q) * n_features, ascending: the k-th largest.
        position = ((1 - s["q"]) * n_features).long().clamp(0, n_features - 1)
        threshold = kth_largest(magnitude, n_features - position)
        # The selected coordinates as a 0/1 float mask: on the CPU a comparison writing floats costs a quarter of
        # one writing bools, and sign * 1.0 / sign * 0.0 are the bits of sign * True / sign * False.
        selected = torch.ge(magnitude, threshold, out=torch.empty_like(magnitude))
        direction = torch.sign(rows).mul_(selected)
        direction = direction.div_(direction.abs().sum(dim=1, keepdim=True).add_(1e-10))
        return direction.view(laid_out.shape).permute([order.index(d) for d in range(grad.dim())])

    def steps(self, n_iter, first_step, momentum, rho):
        return _SparseSteps(self, n_iter, first_step)


class _Steps:
    """One run's step rule and step-size schedule: `start` adds its state, `step` proposes the next iterate,
    `adapt` updates the step sizes after iteration i."""

    def start(self, s: dict[str, torch.Tensor], loss: torch.Tensor, sparse_from_init: bool) -> None:
        raise NotImplementedError

    def step(self, s: dict[str, torch.Tensor], i: int) -> torch.Tensor:
        raise NotImplementedError

    def adapt(self, s: dict[str, torch.Tensor], i: int, loss: torch.Tensor) -> None:
        raise NotImplementedError


class _MomentumSteps(_Steps):
    """Linf/L2 APGD (spec §2): momentum steps; the step size halves at the checkpoints where the loss oscillates
    or stalls."""

    def __init__(self, ball: _Ball, n_iter: int, momentum: float, rho: float):
        self.ball, self.n_iter, self.momentum, self.rho = ball, n_iter, momentum, rho
        checkpoints = checkpoint_schedule(n_iter)
        self.lengths = dict(zip(checkpoints,
                                [checkpoints[0] + 1] + [b - a for a, b in zip(checkpoints, checkpoints[1:])]))

    def start(self, s, loss, sparse_from_init):
        # Column m + 1 holds the loss after step m; column 0 stays 0 (the reference's first-checkpoint quirk).
        s["loss_history"] = torch.zeros(s["x"].shape[0], self.n_iter + 1, dtype=loss.dtype, device=s["x"].device)
        s["reduced_last"] = torch.ones_like(s["fooled"])
        s["loss_best_last"] = loss.clone()

    def step(self, s, i):
        x_k, step_col = s["x_k"], per_sample(s["step"], s["x"])
        z = self.ball.project_rows(s, torch.addcmul(x_k, step_col, self.ball.ascent(s)))
        a = 1.0 if i == 0 else self.momentum
        return self.ball.project_rows(s, torch.add(x_k, z - x_k, alpha=a).add_(x_k - s["x_prev"], alpha=1 - a))

    def adapt(self, s, i, loss):
        s["loss_history"][:, i + 1] = loss
        if i in self.lengths:
            k = self.lengths[i]
            history = s["loss_history"]
            increases = (history[:, i + 2 - k: i + 2] > history[:, i + 1 - k: i + 1]).sum(dim=1)
            oscillating = increases <= self.rho * k
            stalled = ~s["reduced_last"] & (s["loss_best_last"] >= s["loss_best"])
            reduce = oscillating | stalled
            s["reduced_last"], s["loss_best_last"] = reduce, s["loss_best"].clone()
            s["step"] = torch.where(reduce, s["step"] / 2, s["step"])
            _restart_from_best(s, reduce)


class _SparseSteps(_Steps):
    """L1 APGD (spec §3): plain projected steps; every few iterations the sparsity of the best iterate sets q and
    the step size (reset where it fell, else divided by 1.5)."""

    def __init__(self, ball: _Ball, n_iter: int, first_step: float):
        self.ball, self.first_step = ball, first_step
        self.checks = set(range(l1_check_period(n_iter) - 1, n_iter, l1_check_period(n_iter)))

    def start(self, s, loss, sparse_from_init):
        x, eps = s["x"], s["eps"]
        n_features = x[0].numel()
        if sparse_from_init:
            s["sparsity_old"] = _changed_pixels(s["x_k"], x)
            s["q"] = s["sparsity_old"] / (1.5 * n_features)
        else:
            s["sparsity_old"], s["q"] = torch.full_like(eps, n_features), torch.full_like(eps, 0.2)

    def step(self, s, i):
        return self.ball.project_rows(s, s["x_k"] + per_sample(s["step"], s["x"]) * self.ball.ascent(s))

    def adapt(self, s, i, loss):
        if i not in self.checks:
            return
        x, eps = s["x"], s["eps"]
        sparsity = _changed_pixels(s["x_best"], x)
        reset = sparsity < 0.95 * s["sparsity_old"]
        s["q"] = sparsity / (1.5 * x[0].numel())
        s["step"] = torch.where(reset, self.first_step * eps, s["step"] / 1.5).clamp(
            min=self.first_step * eps / 10, max=self.first_step * eps)
        s["sparsity_old"] = sparsity
        _restart_from_best(s, reset)


def _changed_pixels(x_adv: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """How many pixels of each row of x_adv differ from x, in x's dtype (N,): counted from a 0/1 float mask, a
    quarter of a bool mask's cost on the CPU (a sum of integers below 2^24, exact in any order)."""
    x_adv, x = x_adv.flatten(1), x.flatten(1)
    return torch.ne(x_adv, x, out=torch.empty_like(x)).sum(dim=1)


# The one place a norm name picks APGD's behaviour.
_BALLS: dict[Norm, _Ball] = {Norm.LINF: _LinfBall(), Norm.L2: _L2Ball(), Norm.L1: _L1Ball()}


def _run(
    objective: _Objective,
    state: dict[str, torch.Tensor],
    *,
    ball: _Ball,
    n_iter: int,
    first_step: float,
    momentum: float,
    rho: float,
    early_stop: bool,
    sparse_from_init: bool,
    trace: list | None,
    stage: int,
    progress: Progress | None,
    done_before: int,
    total: int,
) -> dict[str, torch.Tensor]:
    """One APGD run from state["x_k"] (the start point). `state` holds per-row tensors: x, y, eps, x_k,
    pre_fooled (rows never attacked: returned clean) and optionally y_target, rows (indices for the trace) and
    group (rows of one point, which leave the batch together).
    `progress` hears (done_before + iterations of this run, total) after every iteration.
    Returns x_best, loss_best, fooled and x_adv for every input row."""
    s = dict(state)
    x, eps = s["x"], s["eps"]
    logits, loss, grad = objective.loss_and_grad(s["x_k"], s["y"], s.get("y_target"))
    if objective.loss != "ce" and bool((grad.flatten(1).abs().sum(dim=1) == 0).any()):
        warnings.warn("APGD: zero gradient at the initial point for some samples (DLR loss)", stacklevel=3)
    wrong = logits.argmax(dim=1) != s["y"]
    s.update(
        x_prev=s["x_k"].clone(), grad=grad, x_best=s["x_k"].clone(), grad_best=grad.clone(), loss_best=loss,
        fooled=s["pre_fooled"] | wrong, x_adv=torch.where(as_column(wrong & ~s["pre_fooled"], x), s["x_k"], x),
        step=first_step * eps,
    )
    steps = ball.steps(n_iter, first_step, momentum, rho)
    steps.start(s, loss, sparse_from_init)
    ball.prepare(s)
    live = LiveRows(s, outputs=("x_best", "loss_best", "fooled", "x_adv"))
    s = live.state

    for i in range(n_iter):
        if early_stop and i % COMPACT_EVERY == 0:
            if live.keep(unfinished(live["fooled"], live.state.get("group"))) == 0:
                break
            s = live.state
        x = s["x"]
        x_new = steps.step(s, i)
        s["x_prev"] = s["x_k"]
        logits, loss, grad = objective.loss_and_grad(x_new, s["y"], s.get("y_target"))
        s["x_k"], s["grad"] = x_new, grad

        wrong = (logits.argmax(dim=1) != s["y"]) & ~s["pre_fooled"]
        active = ~s["fooled"] if early_stop else torch.ones_like(wrong)
        take_adv = wrong & active
        s["x_adv"] = common.rows_into(take_adv, x_new, s["x_adv"])
        s["fooled"] = s["fooled"] | wrong
        improved = (loss > s["loss_best"]) & active
        # x_adv, x_best and grad_best are the run's own (made at the start, copied by LiveRows, never handed out):
        # updated in place, they never share memory with x_k or grad (see `_restart_from_best`).
        s["x_best"] = common.rows_into(improved, x_new, s["x_best"])
        s["grad_best"] = common.rows_into(improved, grad, s["grad_best"])
        s["loss_best"] = torch.where(improved, loss, s["loss_best"])

        steps.adapt(s, i, loss)
        if progress is not None:
            progress(done_before + i + 1, total)
        if trace is not None:
            trace.append({
                "stage": stage, "iteration": i, "rows": s["rows"].clone(), "step_size": s["step"].clone(),
                "loss": loss.clone(), "loss_best": s["loss_best"].clone(), "fooled": s["fooled"].clone(),
            })
    return live.sync()


def _restart_from_best(s: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """Move flagged rows back to their best iterate and its gradient (no pass where no row or every row is
    flagged, on the CPU: L1 checks every iteration of its short stages, and rarely restarts). x_k is then this
    iteration's model input, which no other state tensor shares (the best rows and x_adv are copied out of it):
    written in place, it never comes to share x_best's memory (the next step's x_prev would change with x_best's
    in-place updates). grad may be autograd's expanded view (not writable) and may share grad_best's memory: it is
    replaced before grad_best next changes."""
    s["x_k"] = common.rows_into(mask, s["x_best"], s["x_k"])
    s["grad"] = common.rows_where(mask, s["grad_best"], s["grad"])


def apgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    norm: str,
    eps: float | torch.Tensor,
    loss: str = "ce",
    n_iter: int = 100,
    n_restarts: int = 1,
    y_target: torch.Tensor | None = None,
    random_start: bool = True,
    first_step: float | None = None,
    momentum: float = 0.75,
    rho: float = 0.75,
    eps_schedule: str | None = None,
    early_stop: bool = True,
    generator: torch.Generator | int | None = None,
    clean_logits: torch.Tensor | None = None,
    counter: EvalCounter | None = None,
    trace: list | None = None,
    eot_iter: int = 1,
    progress: Progress | None = None,
    groups: torch.Tensor | None = None,
) -> APGDResult:
    """APGD with `loss` in {"ce", "dlr", "dlr-targeted"} (the last needs `y_target`), all maximised.

    Success always means argmax != y. The first restart attacks every row (so x_best exists for all, as the
    training inner attack needs); later restarts only rows not yet fooled. Rows the clean model already
    misclassifies (known from `clean_logits`, from a clean pass when `random_start`, or from the start
    point otherwise) count as fooled with x_adv = x. `first_step` defaults to 2 (Linf/L2) or 1 (L1) times eps.
    `eps_schedule="largereps"` (L1 only) runs stages at 3, 2, 1 x eps; only the last stage decides `fooled`.
    `eot_iter` averages each gradient over that many passes (the `rand` version for randomised models).
    `generator` is a torch.Generator on x.device or an int seed; `trace`, if a list, receives one dict per
    iteration (stage, iteration, rows, step_size, loss, loss_best, fooled) for diagnostics and tests.
    `progress` hears (iterations done, n_restarts * n_iter) over restarts and eps stages. `groups` (N,), a point
    id per row where several rows attack one point (`apgd_over_targets`' side-by-side targets), makes all rows
    of a point leave the batch once one of them is fooled (with `early_stop`).
    The model's train/eval mode is left alone and parameter .grad is never touched.
    """
    norm = parse_norm(norm)
    ball = _BALLS[norm]
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if (loss == "dlr-targeted") != (y_target is not None):
        raise ValueError("y_target must be given exactly when loss='dlr-targeted'")
    if eps_schedule is not None and eps_schedule not in ball.eps_schedules:
        raise ValueError(f"eps_schedule must be None, or 'largereps' with norm L1, got {eps_schedule!r} ({norm})")
    if n_iter < 1 or n_restarts < 1:
        raise ValueError(f"n_iter and n_restarts must be >= 1, got {n_iter} and {n_restarts}")
    if eps_schedule == "largereps" and n_iter < 3:
        raise ValueError(f"eps_schedule='largereps' needs n_iter >= 3 (three stages), got {n_iter}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
    if bool(((x < 0) | (x > 1)).any()):
        raise ValueError("x must lie in [0, 1] (normalisation belongs inside the model)")
    check_eps(eps)
    x = x.detach().float()
    eps = per_sample(eps, x).reshape(-1).clone()
    first_step = first_step if first_step is not None else ball.first_step
    generator = make_generator(generator, x.device)
    call_counter = EvalCounter(parent=counter)
    if eot_iter < 1:
        raise ValueError(f"eot_iter must be >= 1, got {eot_iter}")
    objective = _Objective(model, loss, call_counter, eot_iter)
    if clean_logits is None and random_start:
        clean_logits = objective.logits(x)
    if clean_logits is not None:
        pre_fooled = clean_logits.argmax(dim=1) != y
    else:
        pre_fooled = torch.zeros_like(y, dtype=torch.bool)

    n = x.shape[0]
    x_best, x_adv = x.clone(), x.clone()
    loss_best = torch.full((n,), -torch.inf, device=x.device)
    fooled = pre_fooled.clone()
    settings = dict(ball=ball, first_step=first_step, momentum=momentum, rho=rho, trace=trace, progress=progress,
                    total=n_restarts * n_iter)
    for restart in range(n_restarts):
        rows = torch.arange(n, device=x.device) if restart == 0 else (~fooled).nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        state = {"x": x[rows], "y": y[rows], "eps": eps[rows], "pre_fooled": pre_fooled[rows], "rows": rows}
        if y_target is not None:
            state["y_target"] = y_target[rows]
        if groups is not None:
            state["group"] = groups[rows]
        done_before = restart * n_iter
        if eps_schedule == "largereps":
            start = ball.random_start(state["x"], 3 * state["eps"], generator) if random_start else state["x"]
            for stage, (multiplier, stage_iter) in enumerate(l1_eps_stages(n_iter)):
                stage_eps = multiplier * state["eps"]
                state_s = dict(state, eps=stage_eps, x_k=ball.project(state["x"], start, stage_eps))
                last = stage == 2
                run = _run(objective, state_s, n_iter=stage_iter, early_stop=early_stop and last,
                           sparse_from_init=True, stage=stage, done_before=done_before, **settings)
                start = run["x_best"]
                done_before += stage_iter
        else:
            start = ball.random_start(state["x"], state["eps"], generator) if random_start else state["x"]
            run = _run(objective, dict(state, x_k=start), n_iter=n_iter, early_stop=early_stop,
                       sparse_from_init=False, stage=0, done_before=done_before, **settings)
        newly = run["fooled"] & ~fooled[rows]
        x_adv[rows] = torch.where(as_column(newly, x), run["x_adv"], x_adv[rows])
        fooled[rows] = fooled[rows] | run["fooled"]
        better = run["loss_best"] > loss_best[rows]
        x_best[rows] = torch.where(as_column(better, x), run["x_best"], x_best[rows])
        loss_best[rows] = torch.where(better, run["loss_best"], loss_best[rows])
    return APGDResult(x_adv=x_adv, fooled=fooled, forward_rows=call_counter.forward_rows,
                      backward_rows=call_counter.backward_rows, x_best=x_best, loss_best=loss_best)


def apgd_targeted(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    norm: str,
    eps: float | torch.Tensor,
    n_targets: int = 9,
    clean_logits: torch.Tensor | None = None,
    generator: torch.Generator | int | None = None,
    counter: EvalCounter | None = None,
    progress: Progress | None = None,
    **apgd_kwargs,
) -> APGDResult:
    """APGD-T (spec §2.5): the targets are the clean-logit ranks 2..n_targets+1, tried in that order by
    `apgd_over_targets`. Remaining keyword arguments go to `apgd` (n_iter, eps_schedule, early_stop, ...)."""
    x = x.detach().float()
    call_counter = EvalCounter(parent=counter)
    if clean_logits is None:
        clean_logits = _Objective(model, "ce", call_counter).logits(x)
    n_classes = clean_logits.shape[1]
    _check_targeted_classes(n_classes)
    targets = runner_up_targets(clean_logits, n_targets)
    result = apgd_over_targets(model, x, y, targets, norm=norm, eps=eps, clean_logits=clean_logits,
                               generator=generator, counter=call_counter, progress=progress, **apgd_kwargs)
    return replace(result, forward_rows=call_counter.forward_rows, backward_rows=call_counter.backward_rows)


def apgd_over_targets(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    targets: torch.Tensor,
    *,
    norm: str,
    eps: float | torch.Tensor,
    clean_logits: torch.Tensor,
    generator: torch.Generator | int | None = None,
    counter: EvalCounter | None = None,
    progress: Progress | None = None,
    tail_rows: int = 0,
    **apgd_kwargs,
) -> APGDResult:
    """Targeted-DLR APGD against each column of `targets` (N, k) in turn, each run only on the points no earlier
    run fooled. Success means argmax != y. x_best/loss_best come from the last run on each point.
    `progress` hears (target, k, iterations done, iterations).

    `tail_rows` > 0: once the still-robust points times the targets left fit in that many rows, the targets left
    run side by side in one batch, and a point leaves with all its rows when one target fools it (spec §6.3
    item 8: statistically equivalent, the random starts are drawn differently; robust points cost the same
    evaluations, points that fall cost more). It pays where a batch of few points leaves the device idle."""
    if "n_restarts" in apgd_kwargs or "loss" in apgd_kwargs or "y_target" in apgd_kwargs:
        raise ValueError("targeted APGD fixes loss='dlr-targeted', one restart per target and the targets itself")
    _check_targeted_classes(clean_logits.shape[1])
    if targets.dim() != 2 or targets.shape[0] != x.shape[0]:
        raise ValueError(f"targets must have shape ({x.shape[0]}, k), got {tuple(targets.shape)}")
    x = x.detach().float()
    call_counter = EvalCounter(parent=counter)
    generator = make_generator(generator, x.device)
    fooled = clean_logits.argmax(dim=1) != y
    eps = per_sample(eps, x).reshape(-1)
    x_best, x_adv = x.clone(), x.clone()
    loss_best = torch.full((x.shape[0],), -torch.inf, device=x.device)
    n_targets = targets.shape[1]
    for column in range(n_targets):
        rows = (~fooled).nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        stacked, groups, copies = side_by_side(rows, n_targets - column, tail_rows)
        run = apgd(model, x[stacked], y[stacked], norm=norm, eps=eps[stacked], loss="dlr-targeted",
                   y_target=targets[rows, column:column + copies].T.reshape(-1), clean_logits=clean_logits[stacked],
                   generator=generator, counter=call_counter, progress=nested(progress, column + 1, n_targets),
                   groups=groups, **apgd_kwargs)
        point_fooled, first = first_success(run.fooled, copies)
        last = torch.arange(len(stacked) - rows.numel(), len(stacked), device=x.device)  # the last target's rows
        x_adv[rows], fooled[rows] = run.x_adv[first], point_fooled
        x_best[rows], loss_best[rows] = run.x_best[last], run.loss_best[last]
        if copies > 1:  # every target left has run
            break
    return APGDResult(x_adv=x_adv, fooled=fooled, forward_rows=call_counter.forward_rows,
                      backward_rows=call_counter.backward_rows, x_best=x_best, loss_best=loss_best)


def _check_targeted_classes(n_classes: int) -> None:
    if n_classes < 4:
        raise ValueError(f"targeted DLR loss needs at least 4 classes, got {n_classes}")
