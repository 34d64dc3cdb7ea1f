"""A zero-shot head from prompts: templates x class names -> text features -> ensemble -> (C, D) head, and the
classifier it makes (image tower + one matmul). Ground-truth labels are never read here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rgb.models.openclip import LoadedCLIP, OpenCLIPClassifier, classifier_from_clip
from rgb.zeroshot.ensembles import ensemble_head, ensemble_weights, matching_margins, pseudo_labels
from rgb.zeroshot.prompts import (
    PromptError,
    check_templates,
    described,
    description_question,
    load_descriptions,
    prompt_class_names,
    template_pool,
)
from rgb.zeroshot.text import TextFeatureCache

NEEDS_IMAGES = ("zpe", "cpe")


@dataclass(frozen=True)
class PromptSettings:
    """The `prompts` config group: ensemble and its parameters, the template pool, descriptions."""

    ensemble: str = "cpe"
    pool: str = "imagenet80"
    templates: tuple[str, ...] = ()  # the user's extra templates
    dataset_templates: dict = field(default_factory=dict)  # dataset -> extra templates where they matter
    single_template: str = "a photo of a {}."
    k: float = 0.1
    tau: float = 1.0
    split: str = "validation"  # unlabelled images for zpe / cpe (and the pseudo-Cmm report)
    descriptions: str | None = None  # JSON class name -> descriptors (Menon & Vondrick enrichment)
    enrich_worst: int = 10  # K: classes with the lowest pseudo-Cmm that get descriptions / questions
    cache_dir: str | None = None

    @classmethod
    def from_config(cls, config: dict) -> PromptSettings:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(config) - known)
        if unknown:
            raise PromptError(f"unknown prompts key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = dict(config)
        values["templates"] = tuple(values.get("templates") or ())
        values["dataset_templates"] = dict(values.get("dataset_templates") or {})
        return cls(**values)

    def template_list(self, dataset: str) -> tuple[list[str], int]:
        """(the pool + this dataset's extras + the user's, index of `single_template` in it (appended if absent))."""
        templates = [*template_pool(self.pool), *self.dataset_templates.get(dataset, ()), *self.templates]
        if self.ensemble == "single" and self.single_template not in templates:
            templates.append(self.single_template)  # `single` alone needs no pool
        templates = check_templates(templates)
        if self.single_template not in templates:
            templates = check_templates([*templates, self.single_template])
        return templates, templates.index(self.single_template)


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
    template_index: int
    params: dict
    pseudo_cmm: list[float] | None = None  # per class under the final head (NaN: no pseudo-labelled image)
    worst_classes: list[str] = field(default_factory=list)
    questions: dict[str, str] = field(default_factory=dict)
    enriched: list[str] = field(default_factory=list)
    unlabelled_images: int = 0

    def record(self) -> dict:
        """The `zeroshot` section of model.json (plain JSON values)."""
        return {
            "ensemble": self.ensemble, "class_names": self.class_names, "logit_scale": self.logit_scale,
            "templates": [{"template": t, "weight": float(w), "kept": bool(k)}
                          for t, w, k in zip(self.templates, self.weights, self.kept)],
            "params": self.params, "single_template_index": self.template_index,
            "pseudo_cmm": self.pseudo_cmm, "worst_classes": self.worst_classes, "description_questions": self.questions,
            "enriched_classes": self.enriched, "unlabelled_images": self.unlabelled_images,
        }


def _worst_classes(image_features, head, labeller_features, class_names, logit_scale, count):
    """Per-class pseudo-Cmm of `head` (pseudo-labels from the mean ensemble) and the `count` lowest classes."""
    labels = pseudo_labels(image_features, labeller_features)
    cmm, present = matching_margins(image_features, head, labels, logit_scale)
    per_class = [math.nan] * len(class_names)
    for c, value in zip(present.tolist(), cmm.tolist()):
        per_class[c] = value
    order = sorted(present.tolist(), key=lambda c: per_class[c])
    return per_class, [class_names[c] for c in order[:count]]


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
    cache = TextFeatureCache(clip, settings.cache_dir, device)
    text = cache.prompt_features(templates, class_names)
    scale = clip.logit_scale
    params = {"logit_scale": scale, "k": settings.k, "tau": settings.tau, "template_index": template_index}
    if unlabelled_features is None:
        unlabelled_features = torch.zeros(0, text.shape[-1])
    weights, kept = ensemble_weights(unlabelled_features, text, settings.ensemble, **params)
    head = ensemble_head(text, weights, kept, settings.ensemble)
    result = ZeroShotHead(settings.ensemble, templates, class_names, weights, kept, head, scale, template_index,
                          {"k": settings.k, "tau": settings.tau, "pool": settings.pool, "split": settings.split},
                          unlabelled_images=len(unlabelled_features))
    if len(unlabelled_features) == 0:
        return result
    result.pseudo_cmm, result.worst_classes = _worst_classes(
        unlabelled_features, head, text, class_names, scale, settings.enrich_worst)
    result.questions = {c: description_question(c) for c in result.worst_classes}
    if descriptions:
        result.enriched = [c for c in result.worst_classes if c in descriptions]
        for name in result.enriched:
            c = class_names.index(name)
            prompts = [described(t, name, d) for t in templates for d in descriptions[name]]
            text[:, c] = cache.features(prompts).view(len(templates), len(descriptions[name]), -1).mean(1)
        result.head = ensemble_head(text, weights, kept, settings.ensemble)
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


__all__ = ["PromptSettings", "ZeroShotHead", "build_zeroshot_head", "check_class_names", "features_of",
           "zeroshot_classifier"]
