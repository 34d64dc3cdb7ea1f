"""A zero-shot head from prompts: templates x class names -> text features -> ensemble -> (C, D) head, and the
classifier it makes (image tower + one matmul). Ground-truth labels are never read here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError

from rgb.core import file_sha256
from rgb.core.templates import PromptError, prompt_class_names
from rgb.data.catalog import DATASET_IDS  # the keys `dataset_templates` may use
from rgb.models.openclip import LoadedCLIP, OpenCLIPClassifier, classifier_from_clip
from rgb.zeroshot.ensembles import (
    EnsembleError,
    cmm_scale,
    ensemble_head,
    ensemble_label,
    ensemble_weights,
    matching_margins,
    pseudo_labels,
)
from rgb.zeroshot.prompts import (
    described,
    description_question,
    load_descriptions,
)
from rgb.zeroshot.settings import PromptSettings
from rgb.zeroshot.text import TextFeatureCache

NEEDS_IMAGES = ("zpe", "zpe_select", "cpe")


def load_pretraining_features(path: str | Path) -> tuple[torch.Tensor, str]:
    """(features (N, D), sha256) of a safetensors file whose tensor `features` holds image features of unlabelled
    pretraining-like images (ZPE's pretraining debias term), made with the same image tower."""
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"zpe pretraining features file {path} does not exist")
    try:
        tensors = safetensors.torch.load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise PromptError(f"zpe pretraining features file {path} is not a readable safetensors file "
                          f"({error})") from None
    features = tensors.get("features")
    if features is None or features.ndim != 2 or features.shape[0] == 0 or not features.dtype.is_floating_point:
        raise PromptError(f"zpe pretraining features file {path} needs a float tensor 'features' of shape (images "
                          f">= 1, dim); it holds {', '.join(f'{k} {tuple(v.shape)}' for k, v in tensors.items())}")
    return features.float(), file_sha256(path)


@dataclass
class ZeroShotHead:
    """What was built and why: the head, the template weights, and the classes CPE's pseudo-Cmm ranks worst."""

    ensemble: str
    templates: list[str]
    class_names: list[str]
    weights: torch.Tensor
    kept: torch.Tensor
    head: torch.Tensor  # (C, D) W of the spec; the classifier's weight is logit_scale * W
    logit_scale: float
    template_index: int | None
    params: dict
    label: str = ""  # what ran (`zpe (test debias)`, `cpe (+descriptions)`, ...)
    pseudo_cmm: list[float] | None = None  # per class under the final head (NaN: no pseudo-labelled image)
    worst_classes: list[str] = field(default_factory=list)
    questions: dict[str, str] = field(default_factory=dict)
    enriched: list[str] = field(default_factory=list)
    unlabelled_images: int = 0

    def record(self) -> dict:
        """The `zeroshot` section of model.json (plain JSON values)."""
        return {
            "ensemble": self.ensemble, "label": self.label, "class_names": self.class_names,
            "logit_scale": self.logit_scale,
            "templates": [{"template": t, "weight": float(w), "kept": bool(k)}
                          for t, w, k in zip(self.templates, self.weights, self.kept)],
            "params": self.params, "single_template_index": self.template_index,
            "pseudo_cmm": self.pseudo_cmm, "worst_classes": self.worst_classes, "description_questions": self.questions,
            "enriched_classes": self.enriched, "unlabelled_images": self.unlabelled_images,
        }


def described_label(label: str) -> str:
    """The label of an ensemble whose worst classes got descriptions: `cpe (weights)` -> `cpe (+descriptions)`."""
    return f"{label.removesuffix(' (weights)')} (+descriptions)"


def worst_classes(image_features, head, labeller_features, class_names, scale, count):
    """Per-class pseudo-Cmm of `head` (pseudo-labels from the mean ensemble of `labeller_features`; similarities
    times `scale`, see `cmm_scale`) and the `count` lowest classes."""
    labels = pseudo_labels(image_features, labeller_features)
    cmm, present = matching_margins(image_features, head, labels, scale)
    per_class = [math.nan] * len(class_names)
    for c, value in zip(present.tolist(), cmm.tolist()):
        per_class[c] = value
    order = sorted(present.tolist(), key=lambda c: per_class[c])
    return per_class, [class_names[c] for c in order[:count]]


def describe_classes(cache: TextFeatureCache, text: torch.Tensor, templates: list[str], class_names: list[str],
                     descriptions: dict[str, list[str]], classes: list[str]) -> torch.Tensor:
    """A copy of `text` (M, C, D) where each class of `classes` has, per template, the mean feature of its
    described prompts `"{filled template}, which has {descriptor}"` (Menon & Vondrick; spec §2)."""
    text = text.clone()
    for name in classes:
        c = class_names.index(name)
        prompts = [described(t, name, d) for t in templates for d in descriptions[name]]
        text[:, c] = cache.features(prompts).view(len(templates), len(descriptions[name]), -1).mean(1)
    return text


def enrich_worst_classes(cache: TextFeatureCache, unlabelled_features: torch.Tensor, text: torch.Tensor,
                         templates: list[str], class_names: list[str], weights: torch.Tensor, kept: torch.Tensor,
                         method: str, descriptions: dict[str, list[str]] | None, count: int, scale: float):
    """(head, per-class pseudo-Cmm, the `count` worst classes, the described ones): the ensemble's head with the
    worst classes by pseudo-Cmm under it described where `descriptions` has them (same template weights)."""
    head = ensemble_head(text, weights, kept, method)
    pseudo_cmm, worst = worst_classes(unlabelled_features, head, text, class_names, scale, count)
    enriched = [c for c in worst if c in descriptions] if descriptions else []
    if enriched:
        head = ensemble_head(describe_classes(cache, text, templates, class_names, descriptions, enriched), weights,
                             kept, method)
    return head, pseudo_cmm, worst, enriched


def build_zeroshot_head(clip: LoadedCLIP, dataset_class_names: list[str], settings: PromptSettings,
                        dataset: str, unlabelled_features: torch.Tensor | None = None,
                        device: str | torch.device = "cpu") -> ZeroShotHead:
    """Templates -> cached text features -> ensemble weights (from `unlabelled_features`, never labels) -> head.
    With `descriptions`, the K classes of lowest pseudo-Cmm under that head get described prompts (same weights).
    """
    class_names = prompt_class_names(dataset_class_names)
    templates, template_index = settings.template_list(dataset)
    descriptions = load_descriptions(settings.descriptions, class_names) if settings.descriptions else None
    if settings.ensemble in NEEDS_IMAGES and (unlabelled_features is None or len(unlabelled_features) == 0):
        raise PromptError(f"{settings.ensemble} needs unlabelled images: the {settings.split} split has none")
    pretraining, pretraining_record = None, None
    if settings.zpe_pretraining_features is not None:
        pretraining, digest = load_pretraining_features(settings.zpe_pretraining_features)
        pretraining_record = {"file": str(settings.zpe_pretraining_features), "sha256": digest,
                              "images": len(pretraining)}
    cache = TextFeatureCache(clip, settings.cache_dir, device)
    text = cache.prompt_features(templates, class_names)
    scale = clip.logit_scale
    params = {"logit_scale": scale, "k": settings.k, "tau": settings.tau, "template_index": template_index,
              "cmm_units": settings.cmm_units, "mad_t": settings.mad_t, "pretraining_features": pretraining}
    if unlabelled_features is None:
        unlabelled_features = torch.zeros(0, text.shape[-1])
    try:
        weights, kept = ensemble_weights(unlabelled_features, text, settings.ensemble, **params)
    except EnsembleError as error:
        raise PromptError(str(error)) from None
    head = ensemble_head(text, weights, kept, settings.ensemble)
    record_params = {"k": settings.k, "tau": settings.tau, "pool": settings.pool, "split": settings.split,
                     "cmm_units": settings.cmm_units, "mad_t": settings.mad_t,
                     "single_template": settings.single_template, "descriptions": settings.descriptions,
                     "enrich_worst": settings.enrich_worst,
                     "zpe_pretraining_features": pretraining_record}
    result = ZeroShotHead(settings.ensemble, templates, class_names, weights, kept, head, scale, template_index,
                          record_params, label=ensemble_label(settings.ensemble, **params),
                          unlabelled_images=len(unlabelled_features))
    if len(unlabelled_features) == 0:
        return result
    result.head, result.pseudo_cmm, result.worst_classes, result.enriched = enrich_worst_classes(
        cache, unlabelled_features, text, templates, class_names, weights, kept, settings.ensemble, descriptions,
        settings.enrich_worst, cmm_scale(scale, settings.cmm_units))
    result.questions = {c: description_question(c) for c in result.worst_classes}
    if result.enriched:
        result.label = described_label(result.label)
    return result


def zeroshot_classifier(clip: LoadedCLIP, head: ZeroShotHead) -> OpenCLIPClassifier:
    """The image tower of `clip` with logits = s * f(x) . W[c]: the head holds s * W, the bias is zero."""
    model = classifier_from_clip(clip, len(head.class_names))
    model.set_head(head.logit_scale * head.head)
    return model.eval()


def check_class_names(zeroshot_record: dict, dataset_class_names: list[str]) -> None:
    """A zero-shot export scores only the dataset whose class names built its head (one line otherwise)."""
    built = zeroshot_record["class_names"]
    expected = prompt_class_names(dataset_class_names)
    if built != expected:
        differ = [f"{a!r} != {b!r}" for a, b in zip(built, expected) if a != b][:3]
        raise PromptError(
            f"the zero-shot head was built for other class names than the dataset's ({len(built)} vs "
            f"{len(expected)} classes; {', '.join(differ) or 'different count'})"
        )


def features_of(model: OpenCLIPClassifier, loader, device: str | torch.device = "cpu") -> torch.Tensor:
    """L2-normalised image features of every batch of `loader` ((x, ...) batches; labels, if any, ignored)."""
    model = model.to(device).eval()
    with torch.inference_mode():
        return torch.cat([model.image_features(batch[0].to(device)).float().cpu() for batch in loader])


__all__ = ["DATASET_IDS", "PromptSettings", "ZeroShotHead", "build_zeroshot_head", "check_class_names",
           "describe_classes", "described_label", "enrich_worst_classes", "features_of", "load_pretraining_features", "worst_classes",
           "zeroshot_classifier"]
