"""impl=reference: the authors' AutoAttack package (`pyautoattack`, an optional extra) on one batch, its rows counted
and its verdicts re-checked by our own model calls (rgb.runs.implementations holds its entry)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from rgb.attacks.autoattack import AutoAttackResult, FooledBy
from rgb.attacks.common import lp_norm
from rgb.core.threat import ThreatModel
from rgb.runs.store import REFERENCE_CASCADE


class RowCounter(nn.Module):
    """Counts rows through the model: forward rows per call, backward rows whenever a gradient reaches the logits
    (for attacks that do not count their own evaluations, such as the reference)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.forward_rows = 0
        self.backward_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        self.forward_rows += x.shape[0]
        if logits.requires_grad:
            logits.register_hook(self._count_backward)
        return logits

    def _count_backward(self, grad: torch.Tensor) -> None:
        self.backward_rows += grad.shape[0]

    def rows(self) -> tuple[int, int]:
        return self.forward_rows, self.backward_rows


class _Log(logging.Handler):
    """Collects the reference's warnings (it logs them instead of raising)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def run_reference(model, x, y, threat: ThreatModel, request, device: str, progress, on_leave=None, on_rows=None
                  ) -> AutoAttackResult:
    """The reference package's cascade on one batch, read back as our result (its verdicts re-checked in fp32 by our
    own model calls; its rows counted by RowCounter). `on_rows` hears it as one stage."""
    from pyautoattack import AutoAttack as ReferenceAutoAttack

    counter = RowCounter(model)
    log = _Log()
    logger = logging.getLogger("auto-attack")
    logger.addHandler(log)
    try:
        progress(REFERENCE_CASCADE)
        if on_rows is not None:  # one stage: the reference's whole cascade
            on_rows(REFERENCE_CASCADE, len(x), 0, 0)
        options = request.options
        kwargs = {} if options.attacks is None else {"attacks": list(options.attacks)}
        attack = ReferenceAutoAttack(counter, norm=threat.norm.value, eps=threat.eps, version=options.version,
                                     seed=options.seed, device=device, **kwargs)
        x_adv, _ = attack.run_standard_evaluation(x.to(device), y.to(device), batch_size=request.batch_size)
    finally:
        logger.removeHandler(log)
    x_adv = x_adv.detach().cpu().float()
    with torch.no_grad():  # our own fp32 verdicts on the images it returned
        clean_pred = model(x.to(device)).argmax(1).cpu()
        adv_pred = model(x_adv.to(device)).argmax(1).cpu()
    clean_correct = clean_pred == y
    x_adv = torch.where(clean_correct.view(-1, 1, 1, 1), x_adv, x)  # clean-wrong points are not attacked
    y_adv = torch.where(clean_correct, adv_pred, clean_pred)
    robust = y_adv == y
    fooled_by = torch.where(robust, FooledBy.ROBUST, torch.where(clean_correct, 1, FooledBy.CLEAN_WRONG)).long()
    n = len(y)
    if on_rows is not None:
        on_rows(REFERENCE_CASCADE, 0, n, int((~robust).sum()))
    if on_leave is not None:  # the reference reports nothing until its whole cascade is done
        on_leave(n)
    norm = lp_norm(x_adv - x, threat.norm)
    return AutoAttackResult(
        x_adv=x_adv, y_adv=y_adv, clean_correct=clean_correct, robust=robust, fooled_by=fooled_by,
        perturbation_norm=norm, attacks=[REFERENCE_CASCADE],
        accuracy_after={"clean": float(clean_correct.float().mean()), REFERENCE_CASCADE: float(robust.float().mean())},
        evaluations={REFERENCE_CASCADE: {"forward_rows": counter.forward_rows,
                                         "backward_rows": counter.backward_rows}},
        forward_rows=torch.full((n,), counter.forward_rows / n, dtype=torch.float64),
        backward_rows=torch.full((n,), counter.backward_rows / n, dtype=torch.float64),
        norm=threat.norm.value, eps=threat.eps, version=options.version, seed=options.seed,
        precision=options.precision, warnings=log.messages,
    )
