"""timm classifiers wrapped so they take [0,1] images: normalisation lives inside the model, never in the data."""

from __future__ import annotations

import contextlib
import difflib
import json
from pathlib import Path

import timm
import torch
from torch import nn

from rgb.core.errors import UserError
from rgb.core.files import CorruptFileError, corrupt_file_named
from rgb.models.hub import HF_HUB, hub_files, source_record, split_source

# What timm reads from a hub repo (config, then safetensors or torch weights): the files a failed load checks.
HUB_FILES = ("config.json", "model.safetensors", "pytorch_model.bin")


class WeightsMismatchError(UserError, ValueError):
    """Pretrained weights whose keys or shapes do not fit the model (never loaded silently)."""


class ModelSpecError(UserError, ValueError):
    """A model the user named that cannot be made: an unknown timm or open_clip name or tag, a factory spec that
    does not import or returns no model (or another than the one exported), weights that contradict the name, a
    module of no family given to `export_model`."""


class ModelLoadError(UserError, ValueError):
    """An export record that names no family this rgb can rebuild (unknown, or an in-memory `python` module)."""


class Normalize(nn.Module):
    """(x - mean) / std per channel, so every attack can work on [0,1] pixels."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class NormalizedClassifier(nn.Module):
    """[0,1] images -> logits: `Normalize` with the backbone's own pretrained mean/std, then the timm model.

    `recipe` (timm name, num_classes, timm kwargs) rebuilds the architecture for `rgb.models.load`.
    """

    family = "timm"  # model.json's `family`: TimmFamily.name reads it here (its one spelling)

    def __init__(self, backbone: nn.Module, mean: tuple[float, ...], std: tuple[float, ...], recipe: dict):
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.backbone = backbone
        self.recipe = dict(recipe)

    @property
    def classifier(self) -> nn.Module:
        """The head that a new task replaces (and the only part linear probing trains)."""
        return self.backbone.get_classifier()

    @property
    def mean(self) -> list[float]:
        return self.normalize.mean.flatten().tolist()

    @property
    def std(self) -> list[float]:
        return self.normalize.std.flatten().tolist()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.normalize(x))


class RecipeModelParts:
    """A family's `num_classes`, `head` and `backbone` for the models rgb wraps (NormalizedClassifier,
    rgb.models.openclip.OpenCLIPClassifier): each keeps its class count in `recipe`, its head as `classifier` and
    every trainable parameter in `backbone` (normalisation outside). The timm and openclip families inherit them."""

    def num_classes(self, model: nn.Module) -> int:
        """The recipe's class count.

        Args:
            model: A `NormalizedClassifier` or an `OpenCLIPClassifier`.

        Returns:
            The number of logits.
        """
        return model.recipe["num_classes"]

    def head(self, model: nn.Module) -> nn.Module:
        """The model's `classifier`.

        Args:
            model: A `NormalizedClassifier` or an `OpenCLIPClassifier`.

        Returns:
            The head module.
        """
        return model.classifier

    def backbone(self, model: nn.Module) -> nn.Module:
        """The model's `backbone` (head included, normalisation outside).

        The timm module of a `NormalizedClassifier`; the image tower and head of an `OpenCLIPClassifier`.

        Args:
            model: A `NormalizedClassifier` or an `OpenCLIPClassifier`.

        Returns:
            The module.
        """
        return model.backbone


def check_model_name(name: str) -> None:
    """Unknown timm names (or pretrained tags) fail at once, naming the closest registered ones. `hf-hub:` and
    `local-dir:` names are timm's own loader's to check (their config names the architecture)."""
    if split_source(name)[0] is not None:
        return
    architecture, _, tag = name.partition(".")
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        raise ModelSpecError(f"unknown timm model {name!r}; close matches: {', '.join(close) or 'none'}")
    if tag:
        tagged = timm.list_pretrained(f"{architecture}.*")
        if name not in tagged:
            close = difflib.get_close_matches(name, tagged, n=5, cutoff=0.0)
            raise ModelSpecError(f"unknown pretrained tag in {name!r}; close matches: {', '.join(close) or 'none'}")


def _weights_file_state_dict(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    with corrupt_file_named(path, "weights file"):
        return timm.models.load_state_dict(str(path))


def _head_rows(state_dict: dict, classifier_names: str | tuple | None) -> int:
    """Classes of the head stored in a weights file (0 for a headless file)."""
    names = (classifier_names,) if isinstance(classifier_names, str) else tuple(classifier_names or ())
    rows = [state_dict[f"{n}.weight"].shape[0] for n in names if f"{n}.weight" in state_dict]
    return rows[0] if rows else 0


@contextlib.contextmanager
def weights_must_fit(what: str):
    """torch's many-line state_dict mismatch inside the block as one WeightsMismatchError line: `what` (the weights
    and the model they do not fit), then the keys and shapes that differ."""
    try:
        yield
    except RuntimeError as err:
        if "Error(s) in loading state_dict" not in str(err):
            raise
        detail = " ".join(str(err).split("\n", 1)[-1].split())
        raise WeightsMismatchError(f"{what}: {detail[:2000]}") from err


def _strict_create(name: str, source: str, **create_kwargs) -> nn.Module:
    """timm.create_model with pretrained weights; a state_dict that does not fit is a one-line WeightsMismatchError."""
    with weights_must_fit(f"weights from {source} do not fit timm model {name!r}"):
        return timm.create_model(name, pretrained=True, **create_kwargs)


def _source_config(name: str) -> tuple[str, dict]:
    """(registry architecture, its model args) that an `hf-hub:` / `local-dir:` name's config.json gives: what
    rebuilds the model later without the hub (model.json records the name and revision beside it)."""
    source, rest = split_source(name)
    if source == HF_HUB:
        with hub_files(name, rest, HUB_FILES):
            _, architecture, model_args = timm.models.load_model_config_from_hf(rest)
    else:
        config_file = Path(rest).expanduser() / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"model {name}: {config_file} not found (a local-dir: model is a folder "
                                    "with timm's config.json and weights, as timm's push_to_hub / save writes it)")
        try:
            config = json.loads(config_file.read_text())  # timm's format: architecture, model_args, ...
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CorruptFileError(f"model {name}: {config_file} is not JSON ({err}): write it again") from None
        architecture, model_args = config["architecture"], config.get("model_args")
    return architecture, dict(model_args or {})


def _create_from_source(name: str, pretrained: bool, timm_kwargs: dict) -> tuple[nn.Module, dict]:
    """A hub / local-dir timm model through timm's own loader, its source head kept (so loading is strict), and
    the recipe that rebuilds it from the registry architecture."""
    architecture, model_args = _source_config(name)
    source, rest = split_source(name)
    with contextlib.ExitStack() as stack:
        if source == HF_HUB:
            stack.enter_context(hub_files(name, rest, HUB_FILES))
        if pretrained:
            backbone = _strict_create(name, name, **timm_kwargs)
        else:
            backbone = timm.create_model(name, pretrained=False, **timm_kwargs)
    # The config's num_classes is the source head's (timm's save_for_hf records it in model_args); the rebuild
    # passes the fine-tuned head's count itself, so the recipe must not carry it a second time.
    recipe_kwargs = {k: v for k, v in {**model_args, **timm_kwargs}.items() if k != "num_classes"}
    return backbone, {"architecture": architecture, "timm_kwargs": recipe_kwargs,
                      "source": source_record(name, "config.json")}


def _create_with_weights(name: str, weights: str | None, timm_kwargs: dict) -> nn.Module:
    """timm model with pretrained weights loaded STRICTLY, keeping the source head (replaced afterwards).

    timm relaxes strictness whenever num_classes differs from the weights' head; building with the source's
    own class count keeps every backbone key checked, so a wrong file is an error rather than a random init.
    """
    pretrained_cfg = timm.models.get_pretrained_cfg(name)
    if weights is None:
        source = f"the hub ({pretrained_cfg.hf_hub_id or pretrained_cfg.url})"
        overlay, num_classes = None, pretrained_cfg.num_classes
    else:
        source = str(weights)
        state_dict = _weights_file_state_dict(Path(weights))
        num_classes = _head_rows(state_dict, pretrained_cfg.classifier)
        overlay = dict(state_dict=state_dict, num_classes=num_classes)
    # hub weights not in the cache (offline, or the hub unreachable): one line naming the repo and how to fetch it
    hub = hub_files(name, pretrained_cfg.hf_hub_id, HUB_FILES) if weights is None and pretrained_cfg.hf_hub_id \
        else contextlib.nullcontext()
    with hub:
        backbone = _strict_create(name, source, num_classes=num_classes, pretrained_cfg_overlay=overlay,
                                  **timm_kwargs)
    backbone.pretrained_cfg.pop("state_dict", None)  # drop the reference to the loaded copy
    return backbone


def create_model(
    name: str, num_classes: int, pretrained: bool = True, weights: str | None = None, **timm_kwargs
) -> NormalizedClassifier:
    """Any timm model with a fresh `num_classes` head and `Normalize` first (mean/std from its pretrained_cfg).

    Pretrained weights come from the hub, or from the local file `weights` (safetensors or torch) when given;
    any missing, unexpected or mis-shaped key outside the replaced head raises `WeightsMismatchError`.
    `name` may be timm's `hf-hub:ORG/NAME[@REV]` or `local-dir:PATH`: config and weights then come from there
    (the recipe records the registry architecture, so a reload needs neither; `source` says what was loaded).
    """
    check_model_name(name)
    if weights is not None and not pretrained:
        raise ModelLoadError(f"weights={weights!r} given with pretrained=False; set pretrained=True to load them")
    if split_source(name)[0] is not None:
        if weights is not None:
            raise ModelSpecError(f"model {name} brings its own weights: drop weights={weights!r} (or use the architecture "
                             "name with the weights file)")
        backbone, sourced = _create_from_source(name, pretrained, timm_kwargs)
        backbone.reset_classifier(num_classes)
        recipe = dict(name=sourced["architecture"], num_classes=int(num_classes), timm_kwargs=sourced["timm_kwargs"],
                      source=sourced["source"])
        cfg = backbone.pretrained_cfg
        return NormalizedClassifier(backbone, tuple(cfg["mean"]), tuple(cfg["std"]), recipe)
    if pretrained:
        backbone = _create_with_weights(name, None if weights is None else str(weights), timm_kwargs)
        backbone.reset_classifier(num_classes)
    else:
        backbone = timm.create_model(name, pretrained=False, num_classes=num_classes, **timm_kwargs)
    recipe = dict(name=name, num_classes=int(num_classes), timm_kwargs=dict(timm_kwargs))
    cfg = backbone.pretrained_cfg
    return NormalizedClassifier(backbone, tuple(cfg["mean"]), tuple(cfg["std"]), recipe)


def apply_speed_options(model: nn.Module, *, channels_last: bool = False, compile: bool = False,
                        dynamic: bool | None = None) -> nn.Module:
    """channels_last weights and/or torch.compile, both in place: float rounding changes, results and state_dict
    keys do not. `dynamic=True` suits the shrinking batches of an attack; training keeps fixed shapes."""
    if channels_last:
        model.to(memory_format=torch.channels_last)
    if compile:
        model.compile(dynamic=dynamic)
    return model
