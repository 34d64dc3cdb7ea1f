"""Where a model meets a dataset: its record and its logits must fit the split before anything is computed or
written (an argmax over 5 logits on a 10-class split is a wrong number, not an error)."""

from __future__ import annotations

import torch
from torch import nn


def _record_problem(meta: dict, split, image_size: int) -> str | None:
    names = list(split.class_names)
    for key, expected in (("num_classes", len(names)), ("image_size", image_size), ("class_names", names)):
        if key in meta and meta[key] != expected:
            if key == "class_names" and len(meta[key]) == len(names):
                i = next(i for i, (a, b) in enumerate(zip(meta[key], names)) if a != b)
                return (f"the model's class {i} is {meta[key][i]!r}, the test split's is {names[i]!r} "
                        f"(class_names differ)")
            return f"model {key} {meta[key]!r} != the test split's {expected!r}"
    return None


@torch.inference_mode()
def check_model_fits(model: nn.Module, meta: dict, split, image_size: int, device: str | torch.device,
                     error: type[Exception], where: str) -> None:
    """Raise `error` ("<where>: ...") unless the export record (num_classes, image_size, class_names) matches the
    split and the model gives one finite logit per class of the split on its first image (one forward pass)."""
    problem = _record_problem(meta, split, image_size)
    if problem is None:
        x, _, image_id = split[0]
        logits = model(x.unsqueeze(0).to(device))
        classes = len(split.class_names)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != classes:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            problem = f"the model gives logits of shape {shape} for one image, the test split has {classes} classes"
        elif not bool(torch.isfinite(logits).all()):
            problem = f"the model returned NaN/inf logits (image_id {image_id}); it cannot be scored"
    if problem is not None:
        raise error(f"{where}: {problem}")
