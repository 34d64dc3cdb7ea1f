"""Write splits in the RobustGenBench snapshot layout: parquet under data/<dataset>/ + README.md YAML configs.

Used by the mini benchmark builder, the mini transfer splits and the export of adversarial images, so that
everything the suite writes is read back by the same `load_split` as the real benchmark.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from rgb.data.catalog import MINI


def benchmark_features(class_names: list[str]) -> datasets.Features:
    """The card's "Data fields", in its order."""
    return datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=list(class_names)),
            "image_id": datasets.Value("int32"),
            "perturbation": datasets.Value("string"),
            "surrogate": datasets.Value("string"),
            "norm": datasets.Value("string"),
            "epsilon": datasets.Value("float32"),
            "corruption": datasets.Value("string"),
            "is_modified": datasets.Value("bool"),
        }
    )


def png_bytes(image: np.ndarray) -> bytes:
    """uint8 HxWx3 -> PNG bytes (lossless, and byte-identical for identical pixels)."""
    buffer = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


def write_split(path: Path, class_names: list[str], columns: dict[str, list]) -> None:
    """Write one split atomically (temp file + rename): an interrupted write never leaves a half file."""
    features = benchmark_features(class_names)
    n = len(columns["image_id"])
    full = {name: columns.get(name, [None] * n) for name in features}
    full["image"] = [{"bytes": b, "path": None} for b in full["image"]]
    table = pa.Table.from_pydict(full, schema=features.arrow_schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp, row_group_size=256)
    os.replace(tmp, path)


def write_readme(root: Path, title: str) -> None:
    """Declare every config found on disk: data/<dataset>/<split>.parquet and data/<dataset>/<surrogate>/<split>.parquet."""
    lines = ["---", "configs:"]
    for dataset_dir in sorted(p for p in (root / "data").iterdir() if p.is_dir()):
        groups = [(dataset_dir.name, dataset_dir)] + [
            (f"{dataset_dir.name}-{sub.name}", sub) for sub in sorted(dataset_dir.iterdir()) if sub.is_dir()
        ]
        for config, folder in groups:
            files = sorted(folder.glob("*.parquet"))
            if not files:
                continue
            lines += [f"- config_name: {config}", "  data_files:"]
            for file in files:
                lines += [f"  - split: {file.stem}", f"    path: {file.relative_to(root).as_posix()}"]
    lines += ["---", "", f"# {title}", "", "A RobustGenBench-format benchmark written by `rgb` (same layout and fields).", ""]
    tmp = root / "README.md.tmp"
    tmp.write_text("\n".join(lines))
    os.replace(tmp, root / "README.md")


def readme_title(root: Path) -> str | None:
    """The title (first `# ` line) of a snapshot's README.md; kept when its config list is rewritten."""
    readme = Path(root) / "README.md"
    if readme.is_file():
        for line in readme.read_text(errors="replace").splitlines():
            if line.startswith("# "):
                return line[2:]
    return None


def is_mini_build(root: Path) -> bool:
    """Whether `root` was written by the mini benchmark builder (transfer splits added later included)."""
    return readme_title(root) == MINI.title and (Path(root) / "data" / MINI.name).is_dir()
