"""AutoAttack orchestration (spec §1): the versions of `rgb.attacks.registry.VERSIONS` (the standard cascade
of APGD-CE, APGD-T, FAB-T and Square; `plus`, `rand`) run as a cascade.

The reported number is the point-wise worst case: a point is robust only if every attack fails on it. Each
attack starts from the clean image and only sees the points still robust after the previous one, re-batched, so
batches stay full as points drop out. Every success is re-verified in fp32 and every returned image is checked
against the budget and the [0,1] box with errors that hold under `python -O`, not hoped.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from rgb.attacks.common import AttackError, AttackInputError, EvalCounter, Progress, lp_norm
from rgb.attacks.model_calls import TracedModel, attack_model
from rgb.attacks.options import AttackOptions
from rgb.attacks.registry import ATTACKS, VERSIONS
from rgb.core.machine import matmul_numerics
from rgb.core.threat import Norm, ThreatModel, parse_norm
from rgb.core.values import POSITIVE_INT, require

# Budget tolerances of spec §8.1 (float32 rounding of the projections).
RELATIVE_TOLERANCE = {Norm.L1: 1e-5, Norm.L2: 1e-5}
LINF_TOLERANCE = 1e-7
# A black-box attack that lowers the accuracy by more than this below every other attack hints at masking.
MASKING_MARGIN = 0.002
# Seconds between two step reports to the `progress` callback (the start of each attack is always reported).
PROGRESS_INTERVAL = 0.5
# Norms whose attacks keep their state NHWC under input_format="channels_last" (checked bit for bit against NHWC
# copies per call; L1's projections are not checked yet, so its attacks copy per call as before).
_NHWC_STATE_NORMS = (Norm.LINF, Norm.L2)


class FooledBy:
    """The per-image code of `AutoAttackResult.fooled_by` and of a run's `fooled_by` column: ROBUST survived the
    whole cascade, CLEAN_WRONG was misclassified before any attack, k >= 1 fell to the k-th attack of the cascade."""

    ROBUST = -1
    CLEAN_WRONG = 0

    @staticmethod
    def correct_after(fooled_by: torch.Tensor, k: int) -> torch.Tensor:
        """The images still classified correctly after the first k attacks (k = 0: the clean pass)."""
        return (fooled_by == FooledBy.ROBUST) | (fooled_by > k)


@dataclass
class AutoAttackResult:
    """Per-sample outcome of one AutoAttack run (tensors on the CPU); see docs/design.md."""

    x_adv: torch.Tensor
    y_adv: torch.Tensor
    clean_correct: torch.Tensor
    robust: torch.Tensor
    fooled_by: torch.Tensor
    perturbation_norm: torch.Tensor
    attacks: list[str]
    accuracy_after: dict[str, float]
    evaluations: dict[str, dict[str, int]]
    forward_rows: torch.Tensor
    backward_rows: torch.Tensor
    norm: str
    eps: float
    version: str
    seed: int
    precision: str
    warnings: list[str] = field(default_factory=list)
    capture: str = "eager"  # how the attacks called the model: "trace" or "eager" (see AutoAttack's `capture`)
    input_format: str = "contiguous"  # the memory format of the attacks' inputs (see AutoAttack's `input_format`)
    input_format_reason: str = ""  # why: "as asked", or what input_format="auto" measured or found

    @property
    def robust_accuracy(self) -> float:
        return float(self.robust.float().mean()) if self.robust.numel() else 0.0


@dataclass
class CascadeState:
    """The per-image bookkeeping of one cascade between its stages (`AutoAttack.clean_pass`, `attack_stage`,
    `finish`): the images and their clean logits, each attack's parameters, and what the stages found so far."""

    x: torch.Tensor
    y: torch.Tensor
    clean_logits: torch.Tensor
    params: dict[str, dict]
    warnings: list[str]
    y_adv: torch.Tensor
    clean_correct: torch.Tensor
    robust: torch.Tensor
    fooled_by: torch.Tensor
    x_adv: torch.Tensor
    accuracy_after: dict[str, float]
    evaluations: dict[str, dict[str, int]]
    forward_rows: torch.Tensor
    backward_rows: torch.Tensor

    def survivors(self) -> torch.Tensor:
        """Indices of the images no stage has fooled yet, in image order."""
        return self.robust.nonzero().squeeze(1)


def within_budget(delta: torch.Tensor, norm: str | Norm, eps: float) -> torch.Tensor:
    """Per-sample: is ||delta||_p <= eps up to the float32 tolerance of spec §8.1?"""
    norm = parse_norm(norm)
    limit = eps + LINF_TOLERANCE if norm == Norm.LINF else eps * (1 + RELATIVE_TOLERANCE[norm])
    return lp_norm(delta, norm) <= limit


def check_threat_model(x: torch.Tensor, x_adv: torch.Tensor, norm: str | Norm, eps: float,
                       unchanged: torch.Tensor | None = None) -> None:
    """Raise AttackError unless every x_adv is free of NaN, inside [0,1] and within the budget around x, and
    (where `unchanged` (N,) is True) exactly x. An error, not an assert: it must hold under `python -O`."""
    if torch.isnan(x_adv).any():
        raise AttackError("x_adv contains NaN")
    if x_adv.numel() and (x_adv.min() < 0 or x_adv.max() > 1):
        raise AttackError("x_adv leaves [0, 1]")
    outside = ~within_budget(x_adv - x, norm, eps)
    if outside.any():
        raise AttackError(f"x_adv exceeds the {parse_norm(norm)} budget {eps:g} at {int(outside.sum())} image(s)")
    if unchanged is not None and not torch.equal(x_adv[unchanged], x[unchanged]):
        raise AttackError("a robust point was returned perturbed")


def checked_inputs(x, y) -> tuple[torch.Tensor, torch.Tensor]:
    """(x as fp32, y as int64, on the CPU) when x holds N >= 1 images (N,C,H,W) in [0,1] and y one integer class
    index per image; else AttackInputError in one line. Nothing is cast silently (a float label is not truncated)."""
    if not (torch.is_tensor(x) and torch.is_tensor(y)):
        raise AttackInputError(f"x and y must be torch tensors, got {type(x).__name__} and {type(y).__name__}")
    if x.dim() != 4 or y.shape != (x.shape[0],):
        raise AttackInputError(f"expected x (N,C,H,W) and y (N,), got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] == 0:
        raise AttackInputError("no images to attack: x holds 0 images")
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise AttackInputError(f"labels y must be integer class indices, got dtype {y.dtype}")
    if x.is_complex() or x.dtype == torch.bool:
        raise AttackInputError(f"images x must be real numbers in [0, 1], got dtype {x.dtype}")
    x, y = x.detach().float().cpu(), y.detach().long().cpu()
    if torch.isnan(x).any():
        raise AttackInputError("inputs must lie in [0, 1], got NaN (normalisation belongs inside the model)")
    if x.min() < 0 or x.max() > 1:
        raise AttackInputError(f"inputs must lie in [0, 1], got values in [{float(x.min()):.4g}, {float(x.max()):.4g}] "
                               f"(normalisation belongs inside the model)")
    return x, y


class AutoAttack:
    """AutoAttack of any model mapping [0,1] images to logits: `AutoAttack(model, norm, eps).run(x, y)`.

    What it runs is an `rgb.attacks.options.AttackOptions` (its fields may be given as keywords instead); the
    paragraphs below say what each option does.

    `version` names an entry of `rgb.attacks.registry.VERSIONS`: "standard" runs the spec's table for `norm`
    (L1: 5 APGD-CE restarts and 5 APGD-T targets with the 3-2-1 eps schedule, Square-L1 included); "plus" runs
    APGD-CE, APGD-DLR, untargeted FAB (5 restarts each), Square, APGD-T and FAB-T (9 targets each) without the
    L1 eps schedule, as the reference does; "rand" (randomised defences) runs APGD-CE and APGD-DLR with 20 EoT
    passes per gradient and skips the randomness check, so its flags are only as stable as the model's
    randomness allows. "fast" (screening, never the benchmark's number) runs APGD-CE as standard, then APGD-T
    over the MALT targets (`rgb.attacks.malt`), without FAB-T and Square. `attacks` picks a subset in the version's order (for diagnostics; a subset is not
    AutoAttack and is labelled as such by the caller). `precision="bf16"` runs the attacks under bf16 autocast,
    "tf32" with TF32 matrix products and convolutions on CUDA (fp32 on the CPU); either way a success only counts
    after an fp32 re-verification, which every success gets anyway, so a point the attack cannot verify stays
    robust; neither is the protocol's number (spec §6.3 item 10). `cudnn_benchmark` lets cudnn time its
    convolution algorithms per shape (float rounding only). `steps`: iterations
    of each gradient attack; `queries`: Square's query budget.

    `progress(name, *position)`, if given, hears `progress(name)` when attack `name` starts on a batch and then,
    at most every `progress_interval` seconds, the position of its current step (`rgb.attacks.common.Progress`:
    e.g. `("apgd-t", 3, 9, 40, 100)` for target 3 of 9, iteration 40 of 100), so a long batch is never silent.
    `on_leave(n)`, if given, hears how many images just left the cascade: misclassified clean ones after the clean
    pass, fooled ones after each attack's sub-batch, and the robust ones after the last attack (n sums to the
    batch), so a progress bar moves as images finish instead of once per batch. `on_rows(stage, entered, attacked,
    fooled)`, if given, follows each stage ("clean" for the clean pass, then each attack) on its own: it hears
    `entered` images come into the stage when it starts on them, then after each of its sub-batches how many it
    `attacked` and how many of those it `fooled` (misclassified, for "clean"), so a bar per stage can count the
    images that reach it, never more.

    `tail_rows` > 0 runs the targets left of APGD-T and FAB-T side by side once the batch's still-robust points
    times those targets fit in that many rows (spec §6.3 item 8; off by default): on a GPU a tail of a few
    points leaves the device idle. FAB-T's flags are unchanged; APGD-T draws its random starts differently
    (statistically equivalent), so the setting is part of a run's identity.

    `input_format="channels_last"` feeds the attacks' model calls NHWC copies of the images (spec §6.3 item 6:
    float rounding only); "auto" (the default) does so on the CPU for a model with 2-d convolutions that accepts
    them (not e.g. one that takes a `.view` of its input), unless a timed forward + input-gradient pass at the
    batch's rows (from 32) is 1.15x faster as given (oneDNN's NHWC kernels win at a few rows, 1.5x on a small CNN,
    and can lose on other models and sizes); `AutoAttackResult.input_format` and `input_format_reason` record the
    choice and the timings. The clean pass and the fp32 verification always see the images as given, so the
    reported predictions do not depend on the choice.

    `capture="trace"` has the attacks call a TorchScript trace of that model instead of its Python modules, run
    without graph optimisations: the same ATen calls in the same order, so the same numbers, without the Python of
    every module on every call, which is much of a call's time at the few rows of a batch's surviving points (a
    tiny ViT's forward 1.4-1.5x faster at 1-5 rows, forward+backward 1.1-1.3x; a small CNN's within noise;
    docs/performance.md). The trace is taken at 2 images of the batch and must reproduce the model's logits bit for
    bit at 1 and 3 noisy copies of its images (a trace that baked in a batch size, a per-batch statistic or a
    branch on its example fails that) and its input gradients at 1. "auto" (the default) traces on the CPU in fp32
    for a deterministic version, unless the model is torch.compile'd, and keeps the model as it is where tracing
    fails or differs (`AutoAttackResult.capture` says which ran); "eager" never traces. A trace runs none of the
    model's Python, so "auto" also keeps eager a model with module hooks (its own or global ones) or whose forward
    changes its modules' Python attributes between calls (counters, caches), and says why in the result's warnings
    (the user's instrumentation keeps seeing every call); "trace" refuses such a model with that reason.
    """

    def __init__(
        self,
        model: nn.Module,
        norm: str | Norm,
        eps: float,
        options: AttackOptions | None = None,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 500,
        progress: Callable[..., None] | None = None,
        progress_interval: float = PROGRESS_INTERVAL,
        on_leave: Callable[[int], None] | None = None,
        on_rows: Callable[[str, int, int, int], None] | None = None,
        **option_values,
    ):
        """Set up the cascade; nothing is run until `run` (or the stage API: `clean_pass`, `attack_stage`, `finish`).

        Args:
            model: An `nn.Module` mapping [0,1] images (N,C,H,W) to logits (normalisation inside the model).
            norm: "Linf", "L2" or "L1" (any case), or a `rgb.core.threat.Norm`.
            eps: The budget: a positive number in the norm's units on [0,1] images.
            options: What to run; None: `AttackOptions()` (standard AutoAttack).
            device: Where the attacks run; None: the device of the model's first parameter (the CPU without any).
            batch_size: Images per batch when `run` is given none.
            progress: Called as `progress(name)` when attack `name` starts on a batch, then `progress(name,
                *position)` at most every `progress_interval` seconds (see the class docstring).
            progress_interval: Seconds between two step reports to `progress`.
            on_leave: Called as `on_leave(n)` with how many images just left the cascade (see the class docstring).
            on_rows: Called as `on_rows(stage, entered, attacked, fooled)` as each stage takes and finishes images
                (see the class docstring).
            **option_values: Fields of `AttackOptions`, replacing those of `options`.

        Raises:
            ThreatModelError: `norm` names no norm.
            ValueError: `eps` is not a positive number.
            AttackOptionsError: An option in `**option_values` has a value AutoAttack cannot run.
            TypeError: A keyword that is not a field of `AttackOptions`.

        Example:
            >>> import torch
            >>> from rgb import AutoAttack
            >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10)).eval()
            >>> x, y = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
            >>> result = AutoAttack(model, "Linf", 8 / 255, seed=0).run(x, y)
            >>> result.attacks, result.robust_accuracy <= result.accuracy_after["clean"]
            (['apgd-ce', 'apgd-t', 'fab-t', 'square'], True)
        """
        self.model = model
        threat = ThreatModel(norm, eps)  # a finite eps > 0 and a known norm, or one line
        self.norm = threat.norm
        options = options or AttackOptions()
        self.options = replace(options, **option_values) if option_values else options
        self.spec = VERSIONS[self.options.version]
        chosen = self.options.attacks
        self.steps = [step for step in self.spec.steps if chosen is None or step.attack in chosen]
        self.attacks = [step.attack for step in self.steps]
        self.eps = threat.eps
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.batch_size = int(batch_size)
        self.progress = progress
        self.progress_interval = float(progress_interval)
        self.on_leave = on_leave
        self.on_rows = on_rows
        self.attack_model: nn.Module | None = None  # what the attacks call (the model, or its trace): `_prepare`
        self.capture_reason: str | None = None  # why capture="auto" kept a model eager that a trace would blind
        self.input_format, self.input_format_reason = "contiguous", ""  # what the attacks' inputs were, and why

    # -- the cascade -------------------------------------------------------------------------------------
    def run(self, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None) -> AutoAttackResult:
        """Run the whole cascade on images x with labels y; the model is put in eval mode and back as it was.

        Args:
            x: Images (N,C,H,W) in [0,1] on any device (read as fp32; the result is on the CPU).
            y: Integer class labels (N,), each in [0, number of logits).
            batch_size: Images per batch; None: the instance's `batch_size`.

        Returns:
            The per-image outcome (`AutoAttackResult`: adversarial images, robust flags, which attack fooled each
            image, the rows spent) with the warnings of the reference's checks, which are also issued with
            `warnings.warn`.

        Raises:
            AttackInputError: batch_size is not an integer >= 1, x is empty or not (N,C,H,W) in [0,1] without
                NaN, or y is not (N,) integer labels within the model's logits.
            ValueError: An attack of the cascade needs more classes than the model has.
            AttackOptionsError: The model refuses `input_format="channels_last"` / `capture="trace"`.
            AttackError: The model's logits are not finite, or a returned adversarial image breaks the threat
                model (budget, [0,1] box, NaN) or the cascade rule.
        """
        batch_size = self.batch_size if batch_size is None else batch_size
        require({"batch_size": batch_size}, {"batch_size": POSITIVE_INT}, AttackInputError)
        was_training = self.model.training
        self.model.eval()
        try:
            return self._run(x, y, batch_size)
        finally:
            self.model.train(was_training)

    def _step_params(self, n_classes: int, caught: list[str]) -> dict[str, dict]:
        """Each attack's keyword arguments at this norm; target counts capped at K-1 (with a warning)."""
        params = {}
        for step in self.steps:
            entry = ATTACKS[step.attack]
            if n_classes < entry.min_classes:
                raise ValueError(f"{step.attack} needs at least {entry.min_classes} classes, the model has "
                                 f"{n_classes}")
            params[step.attack] = step.params_at(self.norm)
            requested = params[step.attack].get("n_targets")
            if requested is not None and requested > n_classes - 1:
                params[step.attack]["n_targets"] = n_classes - 1
                message = f"only {n_classes} classes: target count capped at {n_classes - 1} (min({requested}, K-1))"
                if message not in caught:
                    caught.append(message)
        return params

    def worst_case_rows(self, n_classes: int) -> tuple[int, int]:
        """The (forward, backward) rows this AutoAttack spends on an image no attack fools.

        The clean pass and each attack's verification forward included: the cost model of docs/performance.md, from
        each attack's `worst_rows` (rgb.attacks.registry) at this norm, options and class count.

        Args:
            n_classes: The model's number of logits.

        Returns:
            (forward rows, backward rows) per image.

        Raises:
            ValueError: An attack of the cascade needs more classes than `n_classes`.
        """
        forward, backward = 1, 0
        for name, params in self._step_params(n_classes, []).items():
            entry = ATTACKS[name]
            inputs = {k: v for k, v in self.options.cascade_inputs(name).items() if k in entry.inputs}
            rows = entry.worst_rows({**inputs, **params}, n_classes)
            forward, backward = forward + rows[0] + 1, backward + rows[1]
        return forward, backward

    def _run(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> AutoAttackResult:
        """One schedule of the stage API: the clean pass, each attack over all of its survivors, the checks."""
        state = self.clean_pass(x, y, batch_size)
        for stage in range(1, len(self.attacks) + 1):
            self.attack_stage(stage, state, state.survivors(), batch_size)
        return self.finish(state, batch_size)

    @matmul_numerics("fp32")  # a stage's model calls: strict fp32 (cuDNN allows TF32 by default); `_attack_numerics` opts in
    def clean_pass(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> CascadeState:
        """The first stage: clean predictions, the model the attacks call, and the reference's pre-checks.

        Args:
            x: Images (N,C,H,W) in [0,1].
            y: Integer class labels (N,), each in [0, number of logits).
            batch_size: Images per batch.

        Returns:
            The state each `attack_stage` then advances (images misclassified clean are no longer robust).

        Raises:
            AttackInputError: As `run` raises: bad x or y.
            ValueError: Too few classes for an attack of the cascade.
            AttackOptionsError: The model refuses the chosen input format or capture.
            AttackError: The model's logits are not finite.
        """
        x, y = checked_inputs(x, y)
        caught: list[str] = []
        self._rows("clean", len(x))
        clean_logits = self._logits(x, batch_size)
        outside = ((y < 0) | (y >= clean_logits.shape[1])).nonzero().flatten()
        if outside.numel():  # a label no logit stands for would count as a clean miss, never as an error
            i = int(outside[0])
            raise AttackInputError(f"labels must lie in [0, {clean_logits.shape[1]}) (the model's logits): "
                                   f"y[{i}] = {int(y[i])}, {outside.numel()} label(s) outside")
        probe = self._prepare(x, clean_logits, caught, batch_size)
        caught += self._caveated(self._pre_checks(x[:batch_size], clean_logits[:batch_size],
                                                  self.spec.deterministic_model))
        params = self._step_params(clean_logits.shape[1], caught)
        if self.norm in self.spec.notes:
            caught.append(self.spec.notes[self.norm])
        y_adv = clean_logits.argmax(dim=1)
        clean_correct = y_adv == y
        self._rows("clean", 0, len(x), int((~clean_correct).sum()))
        self._left(int((~clean_correct).sum()))
        return CascadeState(
            x=x, y=y, clean_logits=clean_logits, params=params, warnings=caught, y_adv=y_adv,
            clean_correct=clean_correct, robust=clean_correct.clone(),
            fooled_by=torch.where(clean_correct, FooledBy.ROBUST, FooledBy.CLEAN_WRONG), x_adv=x.clone(),
            accuracy_after={"clean": float(clean_correct.float().mean())},
            evaluations={"clean": {"forward_rows": len(x) + probe.forward_rows,
                                   "backward_rows": probe.backward_rows}},
            # Per-image cost: each batch's evaluations are shared equally by the images of that batch.
            forward_rows=torch.full((len(x),), 1 + probe.forward_rows / max(len(x), 1), dtype=torch.float64),
            backward_rows=torch.full((len(x),), probe.backward_rows / max(len(x), 1), dtype=torch.float64),
        )

    def _prepare(self, x: torch.Tensor, clean_logits: torch.Tensor, caught: list[str], batch_rows: int):
        """Choose the model the attacks call (`input_format`, `capture`), probed on images x in batches of
        `batch_rows`; returns the probe's EvalCounter."""
        self.attack_model, probe, self.capture_reason, self.input_format, self.input_format_reason = attack_model(
            self.model, x, clean_logits, self.options, self.device, self.spec.deterministic_model, batch_rows)
        if self.capture_reason:
            caught.append(f"capture='auto' attacked the model eager, not a trace: {self.capture_reason}")
        return probe

    @matmul_numerics("fp32")
    def entering_stage(self, x: torch.Tensor, y: torch.Tensor, clean_logits: torch.Tensor) -> CascadeState:
        """The state of images that enter a stage still robust, gathered from the clean passes of other batches.

        The pooled schedule (rgb.runs.pooled) uses it: no clean pass again. The model the attacks call is prepared
        once per instance (a resumed process's first chunk); that probe's few rows are not counted, so a chunk's rows
        never depend on which process ran it.

        Args:
            x: Images (N,C,H,W) in [0,1], all still robust.
            y: Their labels (N,).
            clean_logits: Their clean logits (N, number of classes).

        Returns:
            A state in which every image is robust and no rows are spent yet.

        Raises:
            ValueError: An attack of the cascade needs more classes than the logits have.
            AttackOptionsError: The model refuses the chosen input format or capture.
        """
        caught: list[str] = []
        if self.attack_model is None:
            self._prepare(x, clean_logits, caught, self.batch_size)
        robust = torch.ones(len(x), dtype=torch.bool)
        return CascadeState(
            x=x, y=y, clean_logits=clean_logits, params=self._step_params(clean_logits.shape[1], caught),
            warnings=caught, y_adv=y.clone(), clean_correct=robust.clone(), robust=robust,
            fooled_by=torch.full((len(x),), FooledBy.ROBUST), x_adv=x.clone(), accuracy_after={}, evaluations={},
            forward_rows=torch.zeros(len(x), dtype=torch.float64), backward_rows=torch.zeros(len(x), dtype=torch.float64),
        )

    @matmul_numerics("fp32")
    def attack_stage(self, stage: int, state: CascadeState, rows: torch.Tensor, batch_size: int) -> None:
        """Run one attack of the cascade over some still-robust images of `state`, updating `state` in place.

        Every success is re-verified in fp32 before it is recorded in `state` (its code, x_adv, prediction and the
        rows it cost).

        Args:
            stage: The attack's number, 1-based, in cascade order.
            state: The cascade's state (from `clean_pass` or `entering_stage`).
            rows: Indices into `state` of images still robust, attacked in this order.
            batch_size: Images per batch.

        Raises:
            AttackError: `rows` holds an image an earlier attack already fooled, or the model's logits are not
                finite.
        """
        name = self.attacks[stage - 1]
        if not bool(state.robust[rows].all()):
            raise AttackError(f"{name} was given images that an earlier attack already fooled")
        counter = EvalCounter()
        self._rows(name, rows.numel())
        for start in range(0, rows.numel(), batch_size):
            part = rows[start : start + batch_size]
            if self.progress is not None:
                self.progress(name)
            spent = (counter.forward_rows, counter.backward_rows)
            candidate = self._attack(name, state.x[part], state.y[part], state.clean_logits[part], counter,
                                     state.params[name])
            pred = self._logits(candidate, batch_size)  # fp32 verification of every returned image
            counter.forward(len(part))
            state.forward_rows[part] += (counter.forward_rows - spent[0]) / len(part)
            state.backward_rows[part] += (counter.backward_rows - spent[1]) / len(part)
            fooled = (pred.argmax(dim=1) != state.y[part]) & within_budget(candidate - state.x[part], self.norm,
                                                                           self.eps)
            hit = part[fooled]
            state.x_adv[hit], state.y_adv[hit] = candidate[fooled], pred.argmax(dim=1)[fooled]
            state.robust[hit], state.fooled_by[hit] = False, stage
            self._rows(name, 0, len(part), len(hit))
            self._left(len(hit))
        spent = state.evaluations.setdefault(name, {"forward_rows": 0, "backward_rows": 0})
        spent["forward_rows"] += counter.forward_rows
        spent["backward_rows"] += counter.backward_rows
        state.accuracy_after[name] = float(state.robust.float().mean())

    @matmul_numerics("fp32")
    def finish(self, state: CascadeState, batch_size: int) -> AutoAttackResult:
        """The result once every stage has run: the masking checks, the final threat-model and cascade checks.

        Args:
            state: The cascade's state after its last `attack_stage`.
            batch_size: Images per batch of the fp32 re-evaluation.

        Returns:
            The per-image outcome; each warning of the checks is also issued with `warnings.warn`.

        Raises:
            AttackError: An adversarial image breaks the threat model (budget, [0,1] box, NaN), a robust image was
                returned perturbed, or the robust flags disagree with an fp32 re-evaluation (deterministic
                versions), or the model's logits are not finite.
        """
        caught = state.warnings + self._caveated(self._masking_checks(state.accuracy_after))
        x, x_adv = state.x, state.x_adv
        self._final_checks(x, state.y, x_adv, state.robust, batch_size)
        self._left(int(state.robust.sum()))
        for message in caught:
            warnings.warn(f"AutoAttack: {message}", stacklevel=4)
        return AutoAttackResult(
            x_adv=x_adv, y_adv=state.y_adv, clean_correct=state.clean_correct, robust=state.robust,
            fooled_by=state.fooled_by, perturbation_norm=lp_norm(x_adv - x, self.norm), attacks=list(self.attacks),
            accuracy_after=state.accuracy_after, evaluations=state.evaluations, forward_rows=state.forward_rows,
            backward_rows=state.backward_rows, norm=self.norm.value, eps=self.eps,
            version=self.options.version, seed=self.options.seed, precision=self.options.precision, warnings=caught,
            capture="trace" if isinstance(self.attack_model, TracedModel) else "eager",
            input_format=self.input_format, input_format_reason=self.input_format_reason,
        )

    def _attack(self, name, x, y, clean_logits, counter, params) -> torch.Tensor:
        """One attack on one batch of still-robust points; returns candidates on the CPU (clean where it failed)."""
        x, y, clean_logits = x.to(self.device), y.to(self.device), clean_logits.to(self.device)
        if self.input_format == "channels_last" and self.norm in _NHWC_STATE_NORMS:
            # The attack's state is derived from x element by element, so it stays NHWC: the model's inputs need
            # no copy per call, its input gradients none back (a flattening attack reads rows in NCHW order still).
            x = x.contiguous(memory_format=torch.channels_last)
        entry = ATTACKS[name]
        available = {"clean_logits": clean_logits, **self.options.cascade_inputs(name)}
        inputs = {key: value for key, value in available.items() if key in entry.inputs}
        with self._attack_numerics():
            out = entry.attack(self.attack_model, x, y, norm=self.norm, eps=self.eps, counter=counter,
                               progress=self._step_reporter(name), **inputs, **params)
        return torch.where(out.fooled.view(-1, 1, 1, 1), out.x_adv.float(), x).cpu().contiguous()

    # -- helpers -----------------------------------------------------------------------------------------
    def _rows(self, stage: str, entered: int, attacked: int = 0, fooled: int = 0) -> None:
        if self.on_rows is not None:
            self.on_rows(stage, entered, attacked, fooled)

    def _left(self, n: int) -> None:
        if self.on_leave is not None and n:
            self.on_leave(n)

    def _step_reporter(self, name: str) -> Progress | None:
        """The attack's step hook: forwards a position to `self.progress` at most every `progress_interval` s."""
        if self.progress is None:
            return None
        callback, interval, due = self.progress, self.progress_interval, time.monotonic() + self.progress_interval

        def report(*position: int) -> None:
            nonlocal due
            now = time.monotonic()
            if now >= due:
                due = now + interval
                callback(name, *position)

        return report

    def _caveated(self, found: list[str]) -> list[str]:
        """The version's caveat on each warning of the reference's checks (a cheap version cannot settle them)."""
        return [f"{message} ({self.spec.caveat})" if self.spec.caveat else message for message in found]

    @contextlib.contextmanager
    def _attack_numerics(self):
        """What the attacks run under (never the fp32 verification): bf16 autocast, TF32 matrix products and
        convolutions (CUDA only; the CPU has none, so there tf32 is fp32) or neither, and cudnn's benchmark mode;
        torch's flags are restored afterwards."""
        backends = torch.backends
        saved = backends.cudnn.benchmark
        backends.cudnn.benchmark = self.options.cudnn_benchmark
        try:
            with matmul_numerics(self.options.precision):
                if self.options.precision == "bf16":
                    with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                        yield
                else:
                    yield
        finally:
            backends.cudnn.benchmark = saved

    @torch.inference_mode()
    def _logits(self, x: torch.Tensor, batch_size: int) -> torch.Tensor:
        """fp32 logits in batches; NaN or inf logits are a hard error (nothing downstream would mean anything; an
        argmax over +inf is not a prediction), as they are to evaluation."""
        chunks = []
        for start in range(0, len(x), batch_size):
            logits = self.model(x[start : start + batch_size].to(self.device)).float().cpu()
            finite = torch.isfinite(logits).all(dim=1)
            if not finite.all():
                first = start + int((~finite).nonzero()[0])
                raise AttackError(f"the model returned NaN/inf logits (first at row {first} of {len(x)}); "
                                  f"AutoAttack cannot evaluate it")
            chunks.append(logits)
        return torch.cat(chunks)

    @torch.inference_mode()
    def _pre_checks(self, x: torch.Tensor, logits: torch.Tensor, check_randomness: bool) -> list[str]:
        """The reference's sanity checks (spec §1.2), as warnings: randomness and softmax outputs."""
        found = []
        xb = x.to(self.device)
        reference = torch.nn.functional.normalize(logits, dim=1)
        for _ in range(5 if check_randomness else 0):
            again = torch.nn.functional.normalize(self.model(xb).float().cpu(), dim=1)
            if (again - reference).norm(dim=1).max() > 1e-4 or not torch.equal(again.argmax(1), reference.argmax(1)):
                found.append("the model's output changes between identical forward passes (randomised "
                             "defence?); use version='rand' or make the model deterministic")
                break
        if logits.min() >= 0 and logits.max() <= 1 and torch.allclose(logits.sum(1), torch.ones(len(logits)), atol=1e-5):
            found.append("the model seems to output probabilities (softmax); attacks need logits")
        return found

    def _masking_checks(self, accuracy_after: dict[str, float]) -> list[str]:
        """The reference's check (spec §1.2): a black-box attack beating every other attack hints at masking."""
        found = []
        for name in self.attacks:
            if ATTACKS[name].black_box and len(accuracy_after) > 2:
                others = min(v for a, v in accuracy_after.items() if a != name)
                if accuracy_after[name] < others - MASKING_MARGIN:
                    found.append(f"{name} (black-box) lowered the accuracy below the white-box attacks: check "
                                 "for gradient masking")
        return found

    def _final_checks(self, x, y, x_adv, robust, batch_size) -> None:
        """Budget, box, NaN and the cascade rule: robust == (fp32 prediction on x_adv is correct)."""
        check_threat_model(x, x_adv, self.norm, self.eps, unchanged=robust)
        if not self.spec.deterministic_model:  # a randomised model may answer differently on a second look
            return
        correct = self._logits(x_adv, batch_size).argmax(dim=1) == y
        if not torch.equal(correct, robust):
            raise AttackError("robust flags disagree with an fp32 re-evaluation of x_adv")


def _model_device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")
