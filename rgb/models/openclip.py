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
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rgb.core.errors import UserError
from rgb.core.files import atomic_write_json, corrupt_file_named
from rgb.models.factory import (ModelSpecError, Normalize, RecipeModelParts, WeightsMismatchError,
                                weights_must_fit)
from rgb.models.hub import HF_HUB, LOCAL_DIR, hub_file, hub_files, source_record, split_revision, split_source

INTERPOLATIONS = {"bicubic": "bicubic", "bilinear": "bilinear", "random": "bicubic"}
# open_clip's checkpoint format (open_clip.constants): a folder or hub repo of its config and its weights (the
# embedded CLIP writes it too, rgb.models.embedded_clip).
CONFIG_FILE = "open_clip_config.json"
CHECKPOINT_FILE = "open_clip_model.safetensors"
# What open_clip reads from a hub repo: config, safetensors or torch weights.
HUB_FILES = (CONFIG_FILE, CHECKPOINT_FILE, "open_clip_pytorch_model.bin")


class OpenCLIPWeightsError(UserError, FileNotFoundError):
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

    family = "openclip"  # model.json's `family`: OpenCLIPFamily.name reads it here (its one spelling)

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

    def tower_features(self, x: torch.Tensor) -> torch.Tensor:
        """The image tower's embeddings of [0,1] images before L2 normalisation (what FARE keeps close)."""
        return self.backbone.visual(self.preprocess(x))

    @torch.no_grad()
    def set_head(self, weight: torch.Tensor) -> None:
        """Head = `weight` (C, D) (already scaled by the logit scale), zero bias."""
        self.classifier.weight.copy_(weight)
        self.classifier.bias.zero_()


def register_architecture(name: str, config: dict) -> None:
    """Make a custom open_clip model config known by name (open_clip's public `add_model_config` reads files, so
    the dict goes through a temporary JSON file; open_clip keeps the parsed config)."""
    import open_clip

    if split_source(name)[0] is not None or name in open_clip.list_models():
        return  # hub / local-dir names: open_clip reads their config itself
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.json"
        atomic_write_json(path, config)
        open_clip.add_model_config(path)


def check_architecture(name: str, pretrained: str | None) -> None:
    """Unknown architecture or pretrained tag: one line with the close matches."""
    import open_clip

    models = open_clip.list_models()
    if name not in models:
        close = difflib.get_close_matches(name, models, n=5, cutoff=0.5)
        raise ModelSpecError(f"unknown open_clip architecture {name!r}; close matches: {', '.join(close) or 'none'}")
    if pretrained:
        tags = open_clip.list_pretrained_tags_by_model(name)
        if pretrained not in tags:
            close = difflib.get_close_matches(pretrained, tags, n=5, cutoff=0.0)
            raise ModelSpecError(
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
    """A whole open_clip model (both towers) with what the zero-shot head needs from it. `towers` says where each
    tower's weights came from (recorded in model.json, shown by evaluate)."""

    model: nn.Module
    tokenizer: object
    name: str
    pretrained: str | None
    weights: str | None
    config: dict
    preprocess: dict
    text_weights: str | None = None
    towers: dict | None = None
    source: dict | None = None

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())

    def recipe(self) -> dict:
        return {"name": self.name, "pretrained": self.pretrained, "weights": self.weights,
                "text_weights": self.text_weights, "towers": self.towers, "source": self.source,
                "open_clip_config": self.config, "preprocess": self.preprocess}


@contextlib.contextmanager
def quiet_root_logger(keep: int = logging.WARNING):
    """open_clip reports every model build as INFO on the root logger (about ten lines per load, in every command's
    output); only its warnings are kept (`keep`)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, keep))
    try:
        yield
    finally:
        root.setLevel(level)


VISUAL_PREFIX = "visual."


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint file's state dict, weights only: safetensors, or a torch file holding the dict itself or under
    `state_dict` (DDP's `module.` prefix removed), as RobustVLM and open_clip's trainer write them."""
    path = Path(path)
    if not path.is_file():
        raise OpenCLIPWeightsError(f"CLIP weights file {path} does not exist")
    if path.suffix == ".safetensors":
        import safetensors.torch

        return safetensors.torch.load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise OpenCLIPWeightsError(f"CLIP weights file {path} holds no state dict of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def image_tower_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The image tower's state dict (keys of `model.visual`) when `state` holds only that tower, with or without
    the `visual.` prefix; None for a whole-CLIP state dict (keys of both towers)."""
    visual = [k.startswith(VISUAL_PREFIX) for k in state]
    if all(visual):
        return {k.removeprefix(VISUAL_PREFIX): v for k, v in state.items()}
    if not any(visual):
        return dict(state)
    return None


def checkpoint_holds_image_tower_only(path: str | Path) -> bool:
    return image_tower_state(read_state_dict(path)) is not None


def _load_image_tower(model: nn.Module, state: dict[str, torch.Tensor], path: str, name: str) -> None:
    """Image-tower weights into `model.visual`, strictly (position embeddings resampled to the tower's size, as
    open_clip does for whole checkpoints); a mismatch names the keys in one line."""
    import open_clip.model

    prefixed = {f"{VISUAL_PREFIX}{k}": v for k, v in state.items()}
    open_clip.model.resize_pos_embed(prefixed, model)
    state = {k.removeprefix(VISUAL_PREFIX): v for k, v in prefixed.items()}
    try:
        model.visual.load_state_dict(state, strict=True)
    except RuntimeError as err:
        detail = " ".join(str(err).split("\n", 1)[-1].split())
        raise WeightsMismatchError(
            f"image-tower weights {path} do not fit the image tower of open_clip {name!r}: {detail[:2000]}"
        ) from err


def _check_source(name: str, pretrained: str | None, text_weights: str | None) -> tuple[str | None, str]:
    """A name with `hf-hub:` / `local-dir:` brings its own weights (both towers): no tag, no text file with it."""
    source, rest = split_source(name)
    if source is None:
        check_architecture(name, pretrained)
        return None, rest
    extra = {"model.pretrained": pretrained, "model.text_weights": text_weights}
    given = [f"{key}={value}" for key, value in extra.items() if value]
    if given:
        raise ModelSpecError(f"open_clip {name} brings both towers' weights: drop {', '.join(given)}")
    if source == HF_HUB and split_revision(rest)[1]:
        raise ModelSpecError(f"open_clip's hf-hub: loader takes no @revision ({name}); the revision loaded is recorded "
                         "in model.json")
    if source == LOCAL_DIR and not (Path(rest).expanduser() / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"open_clip {name}: {Path(rest) / CONFIG_FILE} not found (a local-dir: "
                                f"model is a folder with {CONFIG_FILE} and its weights)")
    return source, rest


def _hub_weights(name: str, repo: str) -> None:
    """Config and weights of an open_clip hub repo present (the cache, or downloaded): open_clip itself only
    warns when the weights are missing and builds random ones."""
    import open_clip.pretrained

    hub_file(name, repo, CONFIG_FILE)
    with hub_files(name, repo, HUB_FILES):
        open_clip.pretrained.download_pretrained_from_hf(repo)


def _weights_plan(name: str, source: str | None, pretrained: str | None, weights: str | None,
                  text_weights: str | None) -> tuple[str | None, dict | None, dict]:
    """(checkpoint open_clip loads whole, image-tower state loaded after, where each tower comes from)."""
    base = _tag_checkpoint(name, pretrained) if pretrained else None
    base_label = (f"open_clip pretrained={pretrained}" if pretrained else
                  f"{name} (its own weights)" if source else "random init (seed 0)")
    image_state = None
    if weights is not None:
        with corrupt_file_named(Path(weights), "CLIP weights file"):
            state = read_state_dict(weights)
        image_state = image_tower_state(state)
        if image_state is None:  # the whole CLIP
            if source is not None:
                raise ModelSpecError(f"{weights} holds both towers but open_clip {name} loads its own: give the "
                                 "architecture's name with model.weights, or an image-tower-only file")
            if text_weights:
                raise ModelSpecError(f"{weights} holds both towers: drop model.text_weights={text_weights}")
            return str(weights), None, {"image": f"file {weights}", "text": f"file {weights}"}
        if source is None and not pretrained and not text_weights:
            raise ModelSpecError(
                f"{weights} holds the image tower only: give the text tower with model.pretrained=TAG "
                f"(tags of {name}: {', '.join(_tags(name)) or 'none'}) or model.text_weights=PATH"
            )
    elif text_weights:
        raise ModelSpecError(f"model.text_weights={text_weights} needs model.weights=PATH (an image-tower checkpoint)")
    if text_weights:
        if not Path(text_weights).is_file():
            raise OpenCLIPWeightsError(f"CLIP text weights file {text_weights} does not exist")
        base, base_label = str(text_weights), f"file {text_weights}"
    image_label = base_label if weights is None else f"file {weights} (image tower only)"
    return base, image_state, {"image": image_label, "text": base_label}


def _tags(name: str) -> list[str]:
    import open_clip

    return open_clip.list_pretrained_tags_by_model(name)


def load_clip(name: str, pretrained: str | None = None, weights: str | None = None,
              image_size: int | None = None, text_weights: str | None = None) -> LoadedCLIP:
    """Any open_clip model by name (a registered architecture, or open_clip's `hf-hub:ORG/NAME` / `local-dir:PATH`,
    read by open_clip's own loader), weights from a pretrained tag or a local checkpoint (`weights`), or random
    init (seed 0) when neither is given. `weights` may hold the image tower only (keys of `model.visual`, with or
    without `visual.`): the text tower then comes from `pretrained`, `text_weights` (a whole-CLIP checkpoint) or
    the hub / local model. `image_size` resizes the tower's input (position embeddings resampled)."""
    import open_clip

    source, rest = _check_source(name, pretrained, text_weights)
    if source == HF_HUB:
        _hub_weights(name, rest)
    checkpoint, image_state, towers = _weights_plan(name, source, pretrained, weights, text_weights)

    def hub():  # around each read of a hub repo's files: a broken cache names the file
        return hub_files(name, rest, HUB_FILES) if source == HF_HUB else contextlib.nullcontext()

    with hub():
        config = open_clip.get_model_config(name)
    if image_size is not None:
        config["vision_cfg"]["image_size"] = int(image_size)
    reading = corrupt_file_named(Path(checkpoint), "CLIP weights file") if checkpoint else contextlib.nullcontext()
    fits = weights_must_fit(f"weights {checkpoint} do not fit open_clip {name!r}")
    with fits, reading, hub(), torch.random.fork_rng(devices=[]), quiet_root_logger():
        torch.manual_seed(0)  # random init (no weights) is reproducible: a reload has the same text tower
        model = open_clip.create_model(
            name, pretrained=checkpoint, force_image_size=image_size, pretrained_text=False,
            pretrained_image=False, require_pretrained=source is not None,
        )
    if image_state is not None:
        _load_image_tower(model, image_state, str(weights), name)
    with hub(), quiet_root_logger():
        tokenizer = open_clip.get_tokenizer(name)
    return LoadedCLIP(model.eval(), tokenizer, name, pretrained, None if weights is None else str(weights), config,
                      _preprocess_of(model, name, pretrained), None if text_weights is None else str(text_weights),
                      towers, source_record(name, CONFIG_FILE))


def classifier_from_clip(clip: LoadedCLIP, num_classes: int) -> OpenCLIPClassifier:
    """The image tower of `clip` (its weights, copied) with a fresh `num_classes` head."""
    return OpenCLIPClassifier(copy.deepcopy(clip.model.visual), num_classes, clip.recipe())


def create_openclip_classifier(name: str, num_classes: int, pretrained: str | None = None,
                               weights: str | None = None, image_size: int | None = None,
                               text_weights: str | None = None) -> OpenCLIPClassifier:
    """Hydra target of the openclip presets: the image tower of `name` with a fresh head (see rgb.zeroshot for
    a head built from prompts). `image_size` = the tower's input size (null: its own; inputs are resized to it).
    `weights` may be an image-tower-only checkpoint; see `load_clip`."""
    return classifier_from_clip(load_clip(name, pretrained, weights, image_size, text_weights), num_classes)


def load_clip_of(model: OpenCLIPClassifier) -> LoadedCLIP:
    """The whole CLIP (text tower included) that `model`'s image tower came from, from its recipe."""
    recipe = model.recipe
    return load_clip(recipe["name"], recipe["pretrained"], recipe["weights"],
                     recipe["open_clip_config"]["vision_cfg"]["image_size"], recipe.get("text_weights"))


def _vision_tower(config: dict) -> nn.Module:
    """The image tower alone from an open_clip config, through open_clip's public factory (the config registered
    under a name derived from its content; the text tower built alongside is dropped)."""
    import open_clip

    digest = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    name = f"rgb-rebuild-{digest}"
    register_architecture(name, config)
    with torch.random.fork_rng(devices=[]), quiet_root_logger(keep=logging.ERROR):  # "initialized randomly"
        return open_clip.create_model(name, pretrained=None, pretrained_text=False, pretrained_image=False).visual


@dataclass(frozen=True)
class OpenCLIPFamily(RecipeModelParts):
    """The `openclip` family: a CLIP image tower with a linear head; its text tower builds heads from prompts.
    """

    name: str = OpenCLIPClassifier.family  # the models' own word, written into model.json
    weights: bool = True
    text_tower: bool = True

    def describe(self, model: OpenCLIPClassifier) -> dict:
        """model.json fields of a CLIP classifier: open_clip name and config, weights, preprocessing, class count.

        The text tower's weights, the towers' origins and the source are added where recorded.

        Args:
            model: An `OpenCLIPClassifier`.

        Returns:
            The record's fields, with the open_clip version.
        """
        import open_clip

        recipe = model.recipe
        extra = {key: recipe[key] for key in ("text_weights", "towers", "source") if recipe.get(key)}
        return {
            **extra,
            "openclip_name": recipe["name"], "pretrained": recipe["pretrained"], "clip_weights": recipe["weights"],
            "num_classes": recipe["num_classes"], "open_clip_config": recipe["open_clip_config"],
            "preprocess": recipe["preprocess"], "mean": model.mean, "std": model.std,
            "open_clip_version": open_clip.__version__,
        }

    def rebuild(self, record: dict) -> OpenCLIPClassifier:
        """The image tower of the recorded open_clip config with a head of `num_classes`, weights not loaded.

        Args:
            record: An openclip model.json (`openclip_name`, `open_clip_config`, `preprocess`, `num_classes`).

        Returns:
            The `OpenCLIPClassifier`.
        """
        recipe = {"name": record["openclip_name"], "pretrained": record.get("pretrained"),
                  "weights": record.get("clip_weights"), "text_weights": record.get("text_weights"),
                  "towers": record.get("towers"), "source": record.get("source"),
                  "open_clip_config": record["open_clip_config"],
                  "preprocess": record["preprocess"]}
        return OpenCLIPClassifier(_vision_tower(record["open_clip_config"]), record["num_classes"], recipe)

    def model_name(self, record: dict) -> str | None:
        """The record's `openclip_name`.

        Args:
            record: An openclip model.json.

        Returns:
            The open_clip architecture's name.
        """
        return record.get("openclip_name")


FAMILY = OpenCLIPFamily()
