"""The embedded CLIP: a tiny open_clip-architecture model trained contrastively on the mini benchmark's train split,
so every zero-shot path (weights from a checkpoint file, text features, ensembles, attacks) runs offline.

`ensure_embedded_clip(dir)` builds it on first use (deterministic, well under a minute on 2 CPU cores) and writes
open_clip's checkpoint format: `open_clip_model.safetensors` + `open_clip_config.json` ({"model_cfg",
"preprocess_cfg"}, what open_clip's `local-dir:` loader reads). It then loads like real weights:
`load_clip(EMBEDDED_ARCH, weights=<dir>/open_clip_model.safetensors)`. Command line (next to the openclip family
it builds on): `python -m rgb.models.embedded_clip [OUT_DIR] [--mini DIR] [--alt-captions]`.

Captions are `template.format(class name)` over `CAPTION_TEMPLATES`; a variant trained on other captions (for the
text-brittleness comparison) is `ensure_embedded_clip(dir, templates=ALT_CAPTION_TEMPLATES)`. The template words
of the captions are replaced by random tokens at rate `token_noise`, so the text tower learns to read the class
name whatever words surround it: unseen templates (CLIP's 80) then still point at the right class.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rgb.core.files import CorruptFileError, atomic_output, atomic_write_json, tensor_file_problem
from rgb.core.templates import check_templates, fill, prompt_class_names
from rgb.models.factory import ModelSpecError
from rgb.models.openclip import CHECKPOINT_FILE, CONFIG_FILE, load_clip, quiet_root_logger, register_architecture

log = logging.getLogger(__name__)

EMBEDDED_ARCH = "rgb-mini-clip"
MINI_CLIP_CONFIG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8, "mlp_ratio": 2.0},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1, "mlp_ratio": 2.0},
}
CAPTION_TEMPLATES = ("a photo of the number {}.", "a handwritten {}.", "a drawing of a {}.", "the digit {}.")
ALT_CAPTION_TEMPLATES = ("{}", "an image showing {}.", "a scan of a {}", "{} written by hand.")
DEFAULTS = {"epochs": 30, "batch_size": 64, "lr": 2e-3, "token_noise": 0.3, "seed": 0}


def register_embedded_architecture() -> None:
    register_architecture(EMBEDDED_ARCH, MINI_CLIP_CONFIG)


def _train_images(mini_dir: Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    from rgb.data import ImageSplit, load_split
    from rgb.data.mini import DATASET, IMAGE_SIZE, ensure_mini

    ensure_mini(mini_dir)
    split = ImageSplit(load_split(str(mini_dir), DATASET, "train"), IMAGE_SIZE)
    images = torch.stack([split[i][0] for i in range(len(split))])
    return images, split.labels, prompt_class_names(split.class_names)


def _caption_tokens(tokenizer, templates, class_names) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens of every (template, class) caption (T, C, L) and a mask of the template's own word tokens (not the
    class name, start, end or padding): the positions that token noise may replace."""
    tokens = torch.stack([tokenizer([fill(t, c) for c in class_names]) for t in templates])
    bare = tokenizer(list(class_names))  # SOT, class name, EOT
    name_ids = [set(row[1:int(row.argmax())].tolist()) for row in bare]
    noisy = torch.zeros_like(tokens, dtype=torch.bool)
    for c, ids in enumerate(name_ids):
        row = tokens[:, c]
        end = row.argmax(-1, keepdim=True)  # EOT has the largest id
        position = torch.arange(row.shape[-1])
        word = (position > 0) & (position < end) & ~torch.isin(row, torch.tensor(sorted(ids)))
        noisy[:, c] = word
    return tokens, noisy


def _augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random shifts of up to 2 pixels (zero fill): the digits are centred scans."""
    padded = F.pad(images, (2, 2, 2, 2))
    dx, dy = torch.randint(0, 5, (2,), generator=generator).tolist()
    return padded[..., dy : dy + images.shape[-2], dx : dx + images.shape[-1]]


def train_embedded_clip(mini_dir: Path, templates=CAPTION_TEMPLATES, epochs: int = DEFAULTS["epochs"],
                        batch_size: int = DEFAULTS["batch_size"], lr: float = DEFAULTS["lr"],
                        token_noise: float = DEFAULTS["token_noise"], seed: int = DEFAULTS["seed"]):
    """Contrastive training on (train image, caption of its class): images of the same class are all positives of
    a caption (a batch holds many images per class), symmetric cross-entropy over the similarity matrix."""
    templates = check_templates(list(templates))
    register_embedded_architecture()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is faster (and the same bits on every machine size)
    try:
        return _train(Path(mini_dir), templates, epochs, batch_size, lr, token_noise, seed)
    finally:
        torch.set_num_threads(threads)


def _train(mini_dir: Path, templates, epochs, batch_size, lr, token_noise, seed):
    torch.manual_seed(seed)
    with quiet_root_logger(keep=logging.ERROR):  # open_clip's "initialized randomly": the start this training wants
        clip = load_clip(EMBEDDED_ARCH)
    model, tokenizer = clip.model.train(), clip.tokenizer
    images, labels, class_names = _train_images(mini_dir)
    images = (images - torch.tensor(clip.preprocess["mean"]).view(1, 3, 1, 1)) / torch.tensor(
        clip.preprocess["std"]).view(1, 3, 1, 1)
    tokens, noisy = _caption_tokens(tokenizer, templates, class_names)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    steps = epochs * -(-len(images) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=generator)
        for start in range(0, len(images), batch_size):
            index = order[start : start + batch_size]
            y = labels[index]
            which = torch.randint(0, len(templates), (len(index),), generator=generator)
            text = tokens[which, y].clone()
            replace = noisy[which, y] & (torch.rand(text.shape, generator=generator) < token_noise)
            text[replace] = torch.randint(0, tokenizer.vocab_size - 2, (int(replace.sum()),), generator=generator)
            image_features = F.normalize(model.encode_image(_augment(images[index], generator)), dim=-1)
            text_features = F.normalize(model.encode_text(text), dim=-1)
            logits = model.logit_scale.exp() * image_features @ text_features.T
            positives = (y[:, None] == y[None, :]).float()
            targets = positives / positives.sum(1, keepdim=True)
            loss = (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0, 4.6052)  # s <= 100, as CLIP
    return model.eval(), clip.preprocess


def save_checkpoint(model, preprocess: dict, out_dir: Path, training: dict) -> Path:
    """open_clip's checkpoint format (safetensors state_dict + open_clip_config.json), each file written whole."""
    import safetensors.torch

    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / CHECKPOINT_FILE
    with atomic_output(weights) as tmp:
        safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    preprocess_cfg = {"size": preprocess["size"], "mean": preprocess["mean"], "std": preprocess["std"],
                      "interpolation": preprocess["interpolation"], "resize_mode": "shortest"}
    atomic_write_json(out_dir / CONFIG_FILE, {"model_cfg": MINI_CLIP_CONFIG, "preprocess_cfg": preprocess_cfg,
                                              "rgb_training": training})
    return weights


def ensure_embedded_clip(out_dir: str | Path, mini_dir: str | Path = "data/mini", templates=CAPTION_TEMPLATES,
                         **training) -> Path:
    """The embedded CLIP's checkpoint file in `out_dir`, trained first if absent (or trained on other captions)."""
    out_dir = Path(out_dir)
    weights, config = out_dir / CHECKPOINT_FILE, out_dir / CONFIG_FILE
    settings = {**DEFAULTS, **training, "templates": list(templates)}
    if weights.is_file() and config.is_file():
        fix = f"delete {out_dir} to build it again"
        try:
            recorded = json.loads(config.read_text()).get("rgb_training", {})
        except ValueError as err:
            raise CorruptFileError(f"embedded CLIP config {config} is corrupt ({err}): {fix}") from None
        if recorded != settings:
            raise FileExistsError(f"{out_dir} holds an embedded CLIP trained with other settings; use another "
                                  f"directory")
        problem = tensor_file_problem(weights)
        if problem:
            raise CorruptFileError(f"embedded CLIP checkpoint {weights} is corrupt ({problem}): {fix}")
        register_embedded_architecture()
        return weights
    started = time.perf_counter()
    model, preprocess = train_embedded_clip(Path(mini_dir), **{**settings})
    save_checkpoint(model, preprocess, out_dir, settings)
    log.info("embedded CLIP trained in %.0f s -> %s", time.perf_counter() - started, weights)
    return weights


CAPTION_SETS = {"default": CAPTION_TEMPLATES, "alt": ALT_CAPTION_TEMPLATES}


def embedded_clip_classifier(name: str, num_classes: int, clip_dir: str, mini_dir: str = "data/mini",
                             captions: str = "default", random_init: bool = False, weights: str | None = None,
                             text_weights: str | None = None):
    """Hydra target of `model=openclip_mini`: the embedded CLIP (built first if absent) as an open_clip
    classifier with a fresh head, loaded through the same path as real weights (architecture + checkpoint).
    `name` labels the run only (run_name); the architecture is always EMBEDDED_ARCH. `random_init`: the same
    architecture untrained (seed 0), for fast tests of every path. `weights`: another checkpoint of the
    architecture (whole, or the image tower only: its text tower is then the embedded CLIP's unless
    `text_weights` names one), e.g. the embedded CLIP after robust fine-tuning."""
    from rgb.models.openclip import checkpoint_holds_image_tower_only, create_openclip_classifier

    if random_init:
        register_embedded_architecture()
        return create_openclip_classifier(EMBEDDED_ARCH, num_classes, weights=weights, text_weights=text_weights)
    if captions not in CAPTION_SETS:
        raise ModelSpecError(f"unknown embedded CLIP captions {captions!r}; choose one of {', '.join(CAPTION_SETS)}")
    embedded = str(ensure_embedded_clip(clip_dir, mini_dir, CAPTION_SETS[captions]))
    if weights is None:
        return create_openclip_classifier(EMBEDDED_ARCH, num_classes, weights=embedded, text_weights=text_weights)
    if text_weights is None and checkpoint_holds_image_tower_only(weights):
        text_weights = embedded
    return create_openclip_classifier(EMBEDDED_ARCH, num_classes, weights=str(weights), text_weights=text_weights)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the embedded mini CLIP (deterministic) if absent.")
    parser.add_argument("out_dir", nargs="?", default="data/mini_clip")
    parser.add_argument("--mini", default="data/mini", help="mini benchmark dir (built if absent)")
    parser.add_argument("--alt-captions", action="store_true", help="the variant trained on ALT_CAPTION_TEMPLATES")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    templates = ALT_CAPTION_TEMPLATES if args.alt_captions else CAPTION_TEMPLATES
    print(ensure_embedded_clip(args.out_dir, args.mini, templates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
