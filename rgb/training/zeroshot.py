"""Heads built from prompts instead of gradients: `strategy=zeroshot` (the whole run) and `head_init=zeroshot`
(fine-tuning starts from the prompt-built head). The prompts are the request's PromptSettings (rgb.zeroshot, from the
`prompts` config group); labels are read only to report the validation accuracy of the finished head."""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from rgb.core import resolve_device
from rgb.core.exportfiles import read_model_record
from rgb.models import META_FILE, WEIGHTS_FILE, export_meta, export_model, family_of, load_clip_of, parameter_counts
from rgb.training.config import TrainingConfigError
from rgb.training.module import VAL_ACC, VAL_LOSS
from rgb.training.request import ModelSection, TrainRequest
from rgb.training.rundir import RunManifest, start_record
from rgb.zeroshot import ZEROSHOT
from rgb.zeroshot.head import PromptSettings, ZeroShotHead, build_zeroshot_head, features_of

log = logging.getLogger(__name__)


def check_zeroshot_capable(model: torch.nn.Module) -> None:
    # a plain module (no family: a user's factory model) has no text tower either; how to export it is beside the point
    family = family_of(model) if getattr(model, "family", None) is not None else None
    if family is None or not family.text_tower:
        owner = f"model family {family.name!r}" if family is not None else f"{type(model).__name__} (no model family)"
        raise TrainingConfigError(
            f"a zero-shot head needs a CLIP text tower: {owner} has none "
            "(use an open_clip model, e.g. model=openclip_vit_b16 or model=openclip_mini)"
        )


def prompt_head(model, settings: PromptSettings, datamodule, device: str = "cpu") -> ZeroShotHead:
    """The head that `settings` build for `model`'s CLIP on the data's class names (unlabelled split images)."""
    check_zeroshot_capable(model)
    unlabelled = features_of(model, datamodule.eval_dataloader(settings.split), device)
    return build_zeroshot_head(load_clip_of(model), datamodule.class_names, settings, datamodule.dataset,
                               unlabelled, device)


def log_head(head: ZeroShotHead) -> None:
    """The ensemble's template weights, the kept templates and the worst classes by pseudo-Cmm."""
    log.info("zero-shot head: %s over %d templates, %d kept, %d classes, logit scale %.2f",
             head.label, len(head.templates), int(head.kept.sum()), len(head.class_names), head.logit_scale)
    ranked = sorted(zip(head.templates, head.weights.tolist(), head.kept.tolist()), key=lambda r: -r[1])
    for template, weight, kept in ranked:
        log.info("  template weight %.4f %s %r", weight, "kept   " if kept else "dropped", template)
    if head.pseudo_cmm is not None:
        cmm = dict(zip(head.class_names, head.pseudo_cmm))
        log.info("worst classes by pseudo-Cmm (%d unlabelled images): %s", head.unlabelled_images,
                 ", ".join(f"{c} ({cmm[c]:.3f})" for c in head.worst_classes))
        without = sum(math.isnan(v) for v in head.pseudo_cmm)
        if without:
            log.info("%d classes have no pseudo-labelled image (left out of Cmm)", without)
        for name, question in head.questions.items():
            log.info("  ask a language model for %r: %s", name, question)
    if head.enriched:
        log.info("described classes: %s", ", ".join(head.enriched))


def init_head_from_prompts(model, settings: PromptSettings, datamodule) -> ZeroShotHead:
    """`head_init=zeroshot`: the image tower's head = logit_scale * W from the prompts, bias 0."""
    head = prompt_head(model, settings, datamodule, resolve_device("auto"))
    model.set_head(head.logit_scale * head.head)
    log_head(head)
    return head


HEAD_INITS = {"zeroshot": init_head_from_prompts}


def initialise_head(model, settings: ModelSection, datamodule) -> None:
    """Apply the model's `head_init` (config group conf/head_init/; None = the model's own fresh head)."""
    if settings.head_init is None:
        return
    if settings.head_init not in HEAD_INITS:
        raise TrainingConfigError(f"unknown head_init {settings.head_init!r}; choose one of {', '.join(HEAD_INITS)}")
    HEAD_INITS[settings.head_init](model, settings.prompts, datamodule)


def validation_metrics(model, datamodule, device: str) -> dict[str, float]:
    """val/acc and val/loss (cross-entropy) of the finished head, for the log and for sweepers."""
    model = model.to(device).eval()
    correct, loss, count = 0, 0.0, 0
    with torch.inference_mode():
        for x, y, *_ in datamodule.eval_dataloader("validation"):
            logits = model(x.to(device)).float().cpu()
            correct += int((logits.argmax(1) == y).sum())
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            count += len(y)
    return {VAL_ACC: correct / count, VAL_LOSS: loss / count}


# What strategy=zeroshot reports on the validation split (monitor.metric must be one of them).
ZEROSHOT_METRICS = (VAL_ACC, VAL_LOSS)


def check_zeroshot_metric(metric: str) -> None:
    """Before the run dir is claimed: the monitored metric must be one the zero-shot head reports."""
    if metric not in ZEROSHOT_METRICS:
        raise TrainingConfigError(f"monitored metric {metric!r} is not reported by strategy=zeroshot: "
                                  f"set monitor.metric to one of {list(ZEROSHOT_METRICS)}")


def train_zeroshot(request: TrainRequest, threads: int, manifest: RunManifest, record: dict) -> float:
    """`strategy=zeroshot`: build the head (no gradient step), export the run dir like a trained run, return the
    monitored validation metric. Called under the run dir's lock, once run.json accepted the config: a re-run of
    an exported head changes nothing (attack runs of its weights stay valid)."""
    run_dir, metric = request.run_dir, request.logging.monitor
    meta_file = run_dir / META_FILE
    if record["starts"] and meta_file.is_file() and (run_dir / WEIGHTS_FILE).is_file():
        log.info("%s already holds this zero-shot head: %s unchanged", run_dir, META_FILE)
        return float(read_model_record(meta_file)["monitor_value"])
    datamodule = request.data.build()
    model = request.model.build()
    device = resolve_device("auto")
    record = manifest.add_start(record, start_record(threads, device.split(":")[0], 1, 1, "32-true", None))
    head = init_head_from_prompts(model, request.model.prompts, datamodule)
    metrics = validation_metrics(model, datamodule, device)
    meta = export_meta(
        datamodule, request.run_names,
        loss=None,
        strategy=ZEROSHOT,
        epochs=0,
        seed=request.seed,
        weights=ZEROSHOT,
        monitor=metric,
        monitor_value=metrics[metric],
        zeroshot=head.record(),
        training={"identity": record["identity"], "starts": record["starts"]},
        parameters=parameter_counts(model, trained=False),  # a head from prompts: no parameter trained
        card=request.model.card,
    )
    exported = export_model(model.cpu().eval(), run_dir, meta)
    log.info("exported %s (%s %.4f, %s %.4f)", exported, VAL_ACC, metrics[VAL_ACC], VAL_LOSS, metrics[VAL_LOSS])
    return metrics[metric]
