"""How AutoAttack's attacks call the model (its `input_format` and `capture` options): NHWC copies of the inputs
for a convolutional model on the CPU, and a TorchScript trace checked bit for bit against the model, each only
where a probe shows it is the same model; see `rgb.attacks.AutoAttack`."""

from __future__ import annotations

import sys
import time
import warnings
import weakref

import torch
from torch import nn

from rgb.attacks.common import EvalCounter
from rgb.attacks.options import AttackOptions, AttackOptionsError


def attack_model(model: nn.Module, x: torch.Tensor, clean_logits: torch.Tensor, options: AttackOptions,
                 device: torch.device, deterministic: bool, batch_rows: int | None = None
                 ) -> tuple[nn.Module, EvalCounter, str | None, str, str]:
    """The model the attacks call on images `x` (clean logits `clean_logits`) in batches of `batch_rows` (None: all at once), the rows
    its probes spent, why capture="auto" kept eager a model that a trace would blind (None otherwise), and the
    memory format of its inputs with the reason for it. `deterministic`: the version assumes a deterministic model
    (a randomised one is never traced)."""
    probes = EvalCounter()
    formatted, layout, why = _formatted(model, x if batch_rows is None else x[:max(batch_rows, 1)], clean_logits[:1], options.input_format,
                                        device, probes)
    captured, reason = _captured(model, formatted, x, options, device, deterministic, probes)
    return captured, probes, reason, layout, why


def decide_input_format(model: nn.Module, rows: torch.Tensor, device: torch.device) -> tuple[str, str]:
    """What input_format="auto" picks for `model` attacked on `device` in batches like `rows` (a run's first batch),
    and why (both timings, where it timed): decided once by rgb.runs and recorded, so that every worker and resume
    of a run attacks in one format (NHWC and NCHW round differently; a choice by timing noise must not split a run)."""
    probe = rows[:1].to(device)
    with torch.inference_mode():
        logits = model(probe).float().cpu() if len(probe) else probe
    _, layout, why = _formatted(model, rows, logits, "auto", device, EvalCounter())
    return layout, why


def _formatted(model: nn.Module, rows: torch.Tensor, probe_logits: torch.Tensor, input_format: str,
               device: torch.device, probes: EvalCounter) -> tuple[nn.Module, str, str]:
    """`model` in the memory format of `input_format`, checked on a one-image probe (the first of `rows`), with the
    format and why. "auto" on the CPU, for a model with 2-d convolutions that gives NHWC inputs the same logits,
    times a forward + input-gradient pass of both formats at the batch's rows (from 32 rows) and keeps NHWC unless the inputs as
    given are clearly faster (oneDNN's NHWC kernels usually win on the CPU; some models and sizes lose)."""
    wanted, probe = input_format, rows[:1]
    if wanted == "auto":
        convolutional = any(isinstance(module, nn.Conv2d) for module in model.modules())
        if not (device.type == "cpu" and convolutional):
            return model, "contiguous", "auto: NHWC is only tried for a model with 2-d convolutions on the CPU"
    if wanted == "contiguous" or probe.shape[0] == 0:
        return model, "contiguous", "as asked" if wanted == "contiguous" else "no images"
    nhwc = ChannelsLastInputs(model)
    probes.forward(1)
    try:
        with torch.inference_mode():
            logits = nhwc(probe.to(device)).float().cpu()
        agrees = torch.allclose(logits, probe_logits, rtol=1e-3, atol=1e-4)
    except RuntimeError as err:
        if input_format == "channels_last":
            raise AttackOptionsError(f"input_format='channels_last': the model refuses NHWC inputs ({err}); use "
                                     f"input_format='auto' or 'contiguous'") from err
        return model, "contiguous", f"auto: the model refuses NHWC inputs ({type(err).__name__})"
    if not agrees:
        if input_format == "channels_last":
            raise AttackOptionsError("input_format='channels_last': the model's logits change with the memory format; "
                                     "use input_format='auto' or 'contiguous'")
        return model, "contiguous", "auto: the model's logits change with the memory format"
    if input_format == "channels_last":
        return nhwc, "channels_last", "as asked"
    if len(rows) < _TIMED_FROM_ROWS:
        return nhwc, "channels_last", f"auto: NHWC, untimed below {_TIMED_FROM_ROWS} rows (where it wins on the CPU)"
    key = (tuple(rows.shape), str(device))
    timed = _TIMED_FORMATS.setdefault(model, {})
    if key not in timed:  # once per model, batch shape and device in a process (a run's later batches reuse it)
        rows = rows.to(device)
        seconds = {"channels_last": _step_seconds(nhwc, rows), "contiguous": _step_seconds(model, rows)}
        chosen = "contiguous" if seconds["contiguous"] * _NCHW_MARGIN < seconds["channels_last"] else "channels_last"
        times = " vs ".join(f"{layout} {1e3 * value:.3g} ms" for layout, value in seconds.items())
        timed[key] = chosen, (f"auto: per forward + input gradient of {len(rows)} rows {times} (best of "
                              f"{_TIMED_STEPS} after a warm-up; contiguous needs to be {_NCHW_MARGIN}x faster)")
    chosen, why = timed[key]
    return (nhwc if chosen == "channels_last" else model), chosen, why


# Batches of fewer rows keep NHWC untimed: there oneDNN's NHWC kernels win (1.1x-1.5x on small CNNs at 1-8 rows)
# and a step is too short to time reliably on a shared CPU.
_TIMED_FROM_ROWS = 32
# Timed passes per memory format when input_format="auto" chooses (after one warm-up pass).
_TIMED_STEPS = 2
# How much faster the inputs as given must be to replace NHWC (the choice before timing): timing noise on a
# shared CPU must not flip a close call (measured here: NHWC 1.07-1.35x faster on small CNNs at 8-200 rows).
_NCHW_MARGIN = 1.15
# model -> {(batch shape, device): (format, why)}: what input_format="auto" measured.
_TIMED_FORMATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_seconds(model: nn.Module, rows: torch.Tensor) -> float:
    """Best process CPU seconds of a forward + input-gradient pass on `rows` (the attacks' step), after a warm-up.
    Not charged to the images (like `batch_size=auto`'s probe): made once per process, it would make an image's
    rows depend on which worker took its batch, and the results of several workers differ from one process's."""
    best = float("inf")
    for timed in range(-1, _TIMED_STEPS):
        image = rows.detach().clone().requires_grad_(True)
        began = time.process_time()
        torch.autograd.grad(model(image).float().sum(), image)
        if timed >= 0:
            best = min(best, time.process_time() - began)
    return best


def _captured(original: nn.Module, model: nn.Module, x: torch.Tensor, options: AttackOptions, device: torch.device,
              deterministic: bool, probes: EvalCounter) -> tuple[nn.Module, str | None]:
    """`model` (the call path of `original`) as a checked trace where `capture` asks for one (see AutoAttack's
    docstring), else as it is; and why capture="auto" kept eager a model that a trace would blind, or None."""
    wanted = options.capture
    if wanted == "auto":
        dynamo = sys.modules.get("torch._dynamo")  # only loaded once something was torch.compile'd
        compiled = dynamo is not None and isinstance(original, dynamo.eval_frame.OptimizedModule)
        usual = device.type == "cpu" and options.precision == "fp32" and deterministic
        wanted = "trace" if usual and not compiled else "eager"
    if wanted == "eager" or x.shape[0] == 0:
        return model, None
    example = x[torch.arange(2) % len(x)].to(device)
    # The check's images are noisy copies, never the example: a value the trace baked in from its example (a
    # per-batch statistic, a branch on pixel values) shows as a difference on them.
    noise = torch.rand((3, *x.shape[1:]), generator=torch.Generator().manual_seed(0)) * 0.2 - 0.1
    probe = (x[torch.arange(3) % len(x)] + noise).clamp(0, 1).to(device)
    blind = _hooks_named(model)  # a trace calls no hook: the user's hooks would stop seeing the attack
    if blind is None:
        before = _python_state(model)  # the trace and its check call the model 3 times
        try:
            traced = TracedModel.trace(model, example, probes)
            problem = _trace_problem(model, traced, probe, probes)
        except Exception as err:  # noqa: BLE001 - whatever stops a trace (dict outputs, untraceable ops)
            problem = f"the model cannot be traced ({type(err).__name__}: {err})"
        blind = _state_changes(before, _python_state(model))
    if blind is not None:
        problem = blind
    elif problem is None:
        return traced, None
    if options.capture == "trace":
        raise AttackOptionsError(f"capture='trace': {problem}; use capture='auto' or 'eager' for this model")
    return model, blind


class ChannelsLastInputs(nn.Module):
    """`model` called on a channels_last (NHWC) copy of its (N, C, H, W) input; gradients flow back to the input
    as given. Mode switches reach the wrapped model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.contiguous(memory_format=torch.channels_last))


class TracedModel(nn.Module):
    """A TorchScript trace of a model, always run without graph optimisations, so that its calls are the eager
    model's ATen calls, in order, and its numbers and gradients the eager model's (see AutoAttack's `capture`)."""

    def __init__(self, traced: torch.jit.ScriptModule):
        super().__init__()
        self.traced = traced

    @classmethod
    def trace(cls, model: nn.Module, example: torch.Tensor, counter: EvalCounter) -> TracedModel:
        counter.forward(len(example))
        with warnings.catch_warnings(), torch.jit.optimized_execution(False):
            warnings.simplefilter("ignore")  # deprecation and tracer warnings: the trace is compared instead
            return cls(torch.jit.trace(model, example, check_trace=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.jit.optimized_execution(False):
            return self.traced(x)


def _trace_problem(model: nn.Module, traced: nn.Module, probe: torch.Tensor, counter: EvalCounter) -> str | None:
    """Why `traced` (taken at 2 other images) is not `model`, or None: bitwise equal logits at 1 and 3 images
    (batch sizes other than the trace's) and input gradients at 1 image (2 backward rows per batch, not 6)."""
    for rows in (probe[2:], probe):
        outputs = []
        for candidate in (model, traced):
            image = rows.detach().clone().requires_grad_(len(rows) == 1)
            with torch.set_grad_enabled(len(rows) == 1):
                logits = candidate(image)
                mix = torch.linspace(-1, 1, logits.shape[1], device=logits.device, dtype=logits.dtype)
                gradient = torch.autograd.grad((logits * mix).sum(), image)[0] if len(rows) == 1 else None
            counter.forward(len(rows))
            counter.backward(len(rows) if gradient is not None else 0)
            outputs.append((logits.detach(), gradient))
        (logits, gradient), (traced_logits, traced_gradient) = outputs
        same_gradient = gradient is None or torch.equal(gradient, traced_gradient)
        if not (torch.equal(logits, traced_logits) and same_gradient):
            return f"the traced model's logits or gradients differ from the model's at a batch of {len(rows)}"
    return None


# Module hooks by the attribute that holds them (a module's, and with "_global" in front, torch's for every module).
HOOKS = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook",
         "_backward_pre_hooks": "backward pre-hook", "_backward_hooks": "backward hook"}
# A module's own bookkeeping, not state its forward keeps (parameters and buffers are tensors a trace also updates).
MODULE_INTERNALS = ("_parameters", "_buffers", "_modules")


def _hooks_named(model: nn.Module) -> str | None:
    """Why a trace of `model` would skip hooks (the modules holding them, or torch's global ones), or None."""
    found = [f"{kind} on {name!r}" for name, module in model.named_modules() for attribute, kind in HOOKS.items()
             if getattr(module, attribute, None)]
    registry = torch.nn.modules.module
    found += [f"global {kind}" for attribute, kind in HOOKS.items() if getattr(registry, "_global" + attribute, None)]
    if not found:
        return None
    return f"the model has a {', a '.join(found[:3])}{' and more' if len(found) > 3 else ''} (a trace runs no hook)"


def _python_state(model: nn.Module) -> tuple[dict[str, object], list[object]]:
    """Each module attribute but its parameters, buffers and submodules, comparable after a call: containers
    walked, a tensor by identity (kept alive with the snapshot, so no identity is reused), anything else by repr."""
    held: list[object] = []

    def value(item: object) -> object:
        if isinstance(item, (torch.Tensor, nn.Module)):
            held.append(item)
            return type(item).__name__, id(item)
        if isinstance(item, (list, tuple)):
            return type(item).__name__, [value(element) for element in item]
        if isinstance(item, dict):
            return type(item).__name__, [(repr(key), value(element)) for key, element in item.items()]
        return repr(item)

    state = {f"{name}.{key}" if name else key: value(item) for name, module in model.named_modules()
             for key, item in vars(module).items() if key not in MODULE_INTERNALS}
    return state, held


def _state_changes(before: tuple[dict, list], after: tuple[dict, list]) -> str | None:
    """Why `model` keeps Python-side state across calls (the attributes its calls changed), or None."""
    changed = sorted(key for key in before[0].keys() | after[0].keys() if before[0].get(key) != after[0].get(key))
    if not changed:
        return None
    named = ", ".join(repr(key) for key in changed[:3]) + (" and more" if len(changed) > 3 else "")
    return f"the model's calls change its Python attributes {named} (a trace runs none of its Python)"
