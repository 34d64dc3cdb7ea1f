"""Our AutoAttack against the reference implementation (fra31/auto-attack, on PyPI as `pyautoattack`, the optional
extra `robustgenbench[reference]`) on the same model, images, budget and seed: the robust flags, the accuracy after
each attack of the cascade, and a per-image comparison. The spec (§8.10) asks for agreement within noise, not
bit-identity (the two draw different random numbers). benchmarks/reference_agreement.py runs it at scale,
tests/test_runs_agreement.py on a toy model."""

from __future__ import annotations

import logging
import re
import time

import torch

from rgb.attacks.autoattack import AutoAttack
from rgb.attacks.common import lp_norm
from rgb.core.threat import parse_norm

_AFTER = re.compile(r"robust accuracy after (\S+): ([0-9.]+)%")


class _AccuracyLog(logging.Handler):
    """Collects the reference's 'robust accuracy after X: Y%' lines as {attack: accuracy}."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.after: dict[str, float] = {}

    def emit(self, record):
        match = _AFTER.search(record.getMessage())
        if match:
            self.after[match.group(1).lower()] = float(match.group(2)) / 100


def run_reference(model, x, y, norm: str, eps: float, seed: int, batch_size: int, device: str,
                  version: str = "standard") -> dict:
    from pyautoattack import AutoAttack as ReferenceAutoAttack

    log = _AccuracyLog()
    logger = logging.getLogger("auto-attack")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(log)
    try:
        attack = ReferenceAutoAttack(model, norm=parse_norm(norm).value, eps=eps, version=version, seed=seed,
                                     device=device)
        start = time.perf_counter()
        x_adv, _ = attack.run_standard_evaluation(x, y, batch_size=batch_size)
        seconds = time.perf_counter() - start
    finally:
        logger.removeHandler(log)
    robust = predictions(model, x_adv, batch_size, device) == y
    max_norm = lp_norm(x_adv - x, norm).max()
    return {"robust": robust, "accuracy_after": log.after, "seconds": seconds, "max_perturbation_norm": float(max_norm)}


def run_ours(model, x, y, norm: str, eps: float, seed: int, batch_size: int, device: str,
             version: str = "standard") -> dict:
    start = time.perf_counter()
    result = AutoAttack(model, norm, eps, version=version, seed=seed, device=device).run(x, y, batch_size=batch_size)
    seconds = time.perf_counter() - start
    return {
        "robust": result.robust, "accuracy_after": result.accuracy_after, "seconds": seconds,
        "max_perturbation_norm": float(result.perturbation_norm.max()),
        "forward_rows_per_image": float(result.forward_rows.mean()),
        "backward_rows_per_image": float(result.backward_rows.mean()),
    }


@torch.inference_mode()
def predictions(model, x, batch_size: int, device: str) -> torch.Tensor:
    return torch.cat([model(x[i: i + batch_size].to(device)).argmax(1).cpu() for i in range(0, len(x), batch_size)])


def compare(ours: torch.Tensor, reference: torch.Tensor) -> dict:
    return {
        "both_robust": int((ours & reference).sum()), "both_fooled": int((~ours & ~reference).sum()),
        "only_ours_robust": int((ours & ~reference).sum()), "only_reference_robust": int((~ours & reference).sum()),
    }
