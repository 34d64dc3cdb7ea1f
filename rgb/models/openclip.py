"""The openclip family: an open_clip image tower as a classifier on [0,1] images.

`OpenCLIPClassifier` = resize + normalisation with the CLIP model's own preprocessing config, the image tower, L2
normalisation of the features and one linear head (logits = s * f(x) . W[c] for a zero-shot head, see
rgb.zeroshot). The export records the open_clip config itself, so a model rebuilds without the text tower and
without open_clip's registry (a custom architecture such as the embedded mini CLIP loads like a built-in one).
open_clip is imported only when a CLIP model is made: importing rgb.models stays cheap.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rgb.core.files import corrupt_file_named
from rgb.models.factory import Normalize, WeightsMismatchError

INTERPOLATIONS = {"bicubic": "bicubic", "bilinear": "bilinear", "random": "bicubic"}


class OpenCLIPWeightsError(FileNotFoundError):
    """Pretrained CLIP weights that are not on this machine (offline) or not at the given path."""


class ClipPreprocess(nn.Module):
    """Resize to the tower's input size (only when the images differ) and normalise: open_clip's preprocessing,
    inside the model so attacks work on [0,1] pixels. Square inputs are assumed (every benchmark split is)."""

    def __init__(self, size: tuple[int, int], mean, std, interpolation: str):
        super().__init__()
        self.size = tuple(int(s) for s in size)
        self.mode = INTERPOLATIONS[interpolation]
        self.normalize = Normalize(tuple(mean), tuple(std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode=self.mode, align_corners=False, antialias=True).clamp(0, 1)
        return self.normalize(x)


class ImageTowerClassifier(nn.Module):
    """Image tower -> L2-normalised features -> linear head. The optimiser sees it as `backbone` (head inside, as
    in a timm model), so fine-tuning treats CLIP and timm models alike."""

    def __init__(self, visual: nn.Module, embed_dim: int, num_classes: int):
        super().__init__()
        self.visual = visual
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.normalize(self.visual(x), dim=-1))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.visual(x), dim=-1)

    def no_weight_decay(self) -> set[str]:
        skip = self.visual.no_weight_decay() if hasattr(self.visual, "no_weight_decay") else set()
        return {f"visual.{name}" for name in skip}


class OpenCLIPClassifier(nn.Module):
    """[0,1] images -> logits through an open_clip image tower; `recipe` rebuilds it (see `describe`)."""

    family = "openclip"

    def __init__(self, visual: nn.Module, num_classes: int, recipe: dict):
        super().__init__()
        pre = recipe["preprocess"]
        self.preprocess = ClipPreprocess(pre["size"], pre["mean"], pre["std"], pre["interpolation"])
        self.backbone = ImageTowerClassifier(visual, int(recipe["open_clip_config"]["embed_dim"]), num_classes)
        self.recipe = {**recipe, "num_classes": int(num_classes)}

    @property
    def classifier(self) -> nn.Linear:
        return self.backbone.head

    @property
    def mean(self) -> list[float]:
        return self.preprocess.normalize.mean.flatten().tolist()

    @property
    def std(self) -> list[float]:
        return self.preprocess.normalize.std.flatten().tolist()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.preprocess(x))

    def image_features(self, x: torch.Tensor) -> torch.Tensor:
        """L2-normalised image features f(x) of [0,1] images (what the head multiplies)."""
        return self.backbone.features(self.preprocess(x))

    @torch.no_grad()
    def set_head(self, weight: torch.Tensor) -> None:
        """Head = `weight` (C, D) (already scaled by the logit scale), zero bias."""
        self.classifier.weight.copy_(weight)
        self.classifier.bias.zero_()


def register_architecture(name: str, config: dict) -> None:
    """Make a custom open_clip model config known by name (open_clip's public `add_model_config` reads files, so
    the dict goes through a temporary JSON file; open_clip keeps the parsed config)."""
    import open_clip

    if name in open_clip.list_models():
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.json"
        path.write_text(json.dumps(config))
        open_clip.add_model_config(path)


def check_architecture(name: str, pretrained: str | None) -> None:
    """Unknown architecture or pretrained tag: one line with the close matches."""
    import open_clip

    models = open_clip.list_models()
    if name not in models:
        close = difflib.get_close_matches(name, models, n=5, cutoff=0.5)
        raise ValueError(f"unknown open_clip architecture {name!r}; close matches: {', '.join(close) or 'none'}")
    if pretrained:
        tags = open_clip.list_pretrained_tags_by_model(name)
        if pretrained not in tags:
            close = difflib.get_close_matches(pretrained, tags, n=5, cutoff=0.0)
            raise ValueError(
                f"unknown pretrained tag {pretrained!r} for open_clip {name!r}; close matches: {', '.join(close) or 'none'}"
            )


def _tag_source(name: str, tag: str) -> str:
    import open_clip

    cfg = open_clip.get_pretrained_cfg(name, tag)
    if cfg.get("hf_hub"):
        repo, filename = os.path.split(cfg["hf_hub"])
        return f"hub repo {repo}, file {filename or 'open_clip_pytorch_model.bin'}"
    return cfg.get("url") or "no download source"


def _tag_checkpoint(name: str, tag: str) -> str:
    """Local file of a pretrained tag (cached download), or one line naming it and how to fetch it."""
    import open_clip

    cfg = open_clip.get_pretrained_cfg(name, tag)
    try:
        path = open_clip.download_pretrained(cfg)
    except Exception as err:  # offline hub / no network: open_clip raises several kinds
        raise OpenCLIPWeightsError(
            f"weights of open_clip {name} pretrained={tag} are not on this machine ({_tag_source(name, tag)}): "
            f"fetch them where the hub is reachable (python -c \"import open_clip; open_clip.create_model('{name}', "
            f"pretrained='{tag}')\") or download the file and pass model.weights=PATH ({type(err).__name__})"
        ) from None
    if not path:
        raise OpenCLIPWeightsError(f"open_clip {name} pretrained={tag}: no file ({_tag_source(name, tag)})")
    return path


def _preprocess_of(clip_model, name: str, tag: str | None) -> dict:
    import open_clip

    cfg = open_clip.get_model_preprocess_cfg(clip_model)
    if tag:  # the tag's own mean/std, also when its weights come from a local file
        tag_cfg = open_clip.get_pretrained_cfg(name, tag)
        cfg.update({k: tag_cfg[k] for k in ("mean", "std", "interpolation") if k in tag_cfg})
    size = cfg["size"]
    size = (size, size) if isinstance(size, int) else tuple(size)
    return {"size": list(size), "mean": list(cfg["mean"]), "std": list(cfg["std"]),
            "interpolation": cfg.get("interpolation", "bicubic")}


@dataclass
class LoadedCLIP:
    """A whole open_clip model (both towers) with what the zero-shot head needs from it."""

    model: nn.Module
    tokenizer: object
    name: str
    pretrained: str | None
    weights: str | None
    config: dict
    preprocess: dict

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())

    def recipe(self) -> dict:
        return {"name": self.name, "pretrained": self.pretrained, "weights": self.weights,
                "open_clip_config": self.config, "preprocess": self.preprocess}


@contextlib.contextmanager
def _quiet_root_logger():
    """open_clip reports every model build as INFO on the root logger (about ten lines per load, in every command's
    output); only its warnings are kept."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        root.setLevel(level)


def load_clip(name: str, pretrained: str | None = None, weights: str | None = None,
              image_size: int | None = None) -> LoadedCLIP:
    """Any open_clip architecture by name, weights from a pretrained tag or a local checkpoint (`weights`), or
    random init (seed 0) when neither is given. `image_size` resizes the tower's input (position embeddings resampled)."""
    import open_clip

    check_architecture(name, pretrained)
    if weights is not None:
        if not Path(weights).is_file():
            raise OpenCLIPWeightsError(f"CLIP weights file {weights} does not exist")
        checkpoint = str(weights)
    else:
        checkpoint = _tag_checkpoint(name, pretrained) if pretrained else None
    config = open_clip.get_model_config(name)
    if image_size is not None:
        config["vision_cfg"]["image_size"] = int(image_size)
    reading = corrupt_file_named(Path(checkpoint), "CLIP weights file") if checkpoint else contextlib.nullcontext()
    try:
        with reading, torch.random.fork_rng(devices=[]), _quiet_root_logger():
            torch.manual_seed(0)  # random init (no weights) is reproducible: a reload has the same text tower
            model = open_clip.create_model(
                name, pretrained=checkpoint, force_image_size=image_size, pretrained_text=False, pretrained_image=False
            )
    except RuntimeError as err:
        if "Error(s) in loading state_dict" not in str(err):
            raise
        detail = " ".join(str(err).split("\n", 1)[-1].split())
        raise WeightsMismatchError(f"weights {checkpoint} do not fit open_clip {name!r}: {detail[:2000]}") from err
    with _quiet_root_logger():
        tokenizer = open_clip.get_tokenizer(name)
    return LoadedCLIP(model.eval(), tokenizer, name, pretrained,
                      None if weights is None else str(weights), config, _preprocess_of(model, name, pretrained))


def classifier_from_clip(clip: LoadedCLIP, num_classes: int) -> OpenCLIPClassifier:
    """The image tower of `clip` (its weights, copied) with a fresh `num_classes` head."""
    return OpenCLIPClassifier(copy.deepcopy(clip.model.visual), num_classes, clip.recipe())


def create_openclip_classifier(name: str, num_classes: int, pretrained: str | None = None,
                               weights: str | None = None, image_size: int | None = None) -> OpenCLIPClassifier:
    """Hydra target of the openclip presets: the image tower of `name` with a fresh head (see rgb.zeroshot for
    a head built from prompts). `image_size` = the tower's input size (null: its own; inputs are resized to it)."""
    return classifier_from_clip(load_clip(name, pretrained, weights, image_size), num_classes)


def load_clip_of(model: OpenCLIPClassifier) -> LoadedCLIP:
    """The whole CLIP (text tower included) that `model`'s image tower came from, from its recipe."""
    recipe = model.recipe
    return load_clip(recipe["name"], recipe["pretrained"], recipe["weights"],
                     recipe["open_clip_config"]["vision_cfg"]["image_size"])


def _vision_tower(config: dict) -> nn.Module:
    """The image tower alone from an open_clip config (open_clip's own builder: no text tower is made)."""
    from open_clip.model import _build_vision_tower

    return _build_vision_tower(config["embed_dim"], config["vision_cfg"], config.get("quick_gelu", False))


@dataclass(frozen=True)
class OpenCLIPFamily:
    name: str = "openclip"

    def describe(self, model: OpenCLIPClassifier) -> dict:
        import open_clip

        recipe = model.recipe
        return {
            "openclip_name": recipe["name"], "pretrained": recipe["pretrained"], "clip_weights": recipe["weights"],
            "num_classes": recipe["num_classes"], "open_clip_config": recipe["open_clip_config"],
            "preprocess": recipe["preprocess"], "mean": model.mean, "std": model.std,
            "open_clip_version": open_clip.__version__,
        }

    def rebuild(self, record: dict) -> OpenCLIPClassifier:
        recipe = {"name": record["openclip_name"], "pretrained": record.get("pretrained"),
                  "weights": record.get("clip_weights"), "open_clip_config": record["open_clip_config"],
                  "preprocess": record["preprocess"]}
        return OpenCLIPClassifier(_vision_tower(record["open_clip_config"]), record["num_classes"], recipe)

    def head(self, model: OpenCLIPClassifier) -> nn.Module:
        return model.classifier


FAMILY = OpenCLIPFamily()
