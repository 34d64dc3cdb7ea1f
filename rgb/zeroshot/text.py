"""Text features of prompts, computed once per (text tower, texts) and cached on disk.

The cache key hashes the text tower's own tensors (not a file name: the same tag or path may hold other weights),
its open_clip config and open_clip version (the tokenizer), and the texts; the file holds the (n, D) L2-normalised
features. Random-init towers hash like any other, so tests use the same path.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import safetensors.torch
import torch
import torch.nn.functional as F

from rgb.core.files import atomic_write_bytes, read_cached_tensors
from rgb.models.openclip import LoadedCLIP

ENCODE_BATCH = 256


def text_tower_digest(clip: LoadedCLIP) -> str:
    """sha256 of every tensor of the model outside the image tower, its text config and the open_clip version."""
    import open_clip

    digest = hashlib.sha256(json.dumps([clip.config.get("text_cfg"), open_clip.__version__], sort_keys=True).encode())
    for name, tensor in sorted(clip.model.state_dict().items()):
        if name.startswith("visual."):
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@torch.no_grad()
def encode_texts(clip: LoadedCLIP, texts: list[str], device: str | torch.device = "cpu",
                 progress: bool = True) -> torch.Tensor:
    """(n, D) float32 L2-normalised text features, in batches; a bar counts the texts when there is more than one
    batch (a head over 80 templates x 196 classes, or the perturbed queries of text robustness, take minutes
    on a large text tower)."""
    from tqdm import tqdm

    model = clip.model.to(device).eval()
    chunks = []
    with tqdm(total=len(texts), unit="text", desc="text features", dynamic_ncols=True, leave=False,
              disable=not progress or len(texts) <= ENCODE_BATCH) as bar:
        for s in range(0, len(texts), ENCODE_BATCH):
            chunks.append(model.encode_text(clip.tokenizer(texts[s : s + ENCODE_BATCH]).to(device)).float())
            bar.update(len(texts[s : s + ENCODE_BATCH]))
    return F.normalize(torch.cat(chunks), dim=-1).cpu()


class TextFeatureCache:
    """Text features of one CLIP text tower, memoised in `cache_dir` (None: computed every time)."""

    def __init__(self, clip: LoadedCLIP, cache_dir: str | Path | None, device: str | torch.device = "cpu"):
        self.clip, self.device = clip, device
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.tower = text_tower_digest(clip) if cache_dir is not None else ""
        self.computed = 0  # texts encoded by this cache (0 when everything came from disk)

    def features(self, texts: list[str]) -> torch.Tensor:
        if self.cache_dir is None:
            self.computed += len(texts)
            return encode_texts(self.clip, texts, self.device)
        key = hashlib.sha256(json.dumps([self.tower, texts]).encode()).hexdigest()
        path = self.cache_dir / f"{key}.safetensors"
        cached = read_cached_tensors(path, "text-feature cache entry")
        if cached is not None and "features" in cached:
            return cached["features"]
        features = encode_texts(self.clip, texts, self.device)
        self.computed += len(texts)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, safetensors.torch.save({"features": features.contiguous()}))
        return features

    def prompt_features(self, templates: list[str], class_names: list[str]) -> torch.Tensor:
        """(M, C, D): e[t, c] = features of template t filled with class c."""
        from rgb.core.templates import fill

        texts = [fill(t, c) for t in templates for c in class_names]
        return self.features(texts).view(len(templates), len(class_names), -1)
