"""Write splits in the RobustGenBench snapshot layout: parquet under data/<dataset>/ + README.md YAML configs.

Used by the mini benchmark builder, the ImageFolder importer (rgb.data.import_folder), the mini transfer splits and
the export of adversarial images, so that everything the suite writes is read back by the same `load_split` as the
real benchmark. `write_dataset` writes a whole dataset config from its clean images (the model-independent splits
generated as the card does); `build_staged` puts a build in place only once it is complete.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from tqdm import tqdm

from rgb.core.files import atomic_output, atomic_write_bytes, replaced_whole
from rgb.core.threat import Norm
from rgb.data.catalog import CONTROL_LINF, CONTROL_SPLIT, CORRUPTION_SEVERITY
from rgb.data.corruptions import apply_corruption, corruption_of_row
from rgb.data.errors import DataConfigError
from rgb.data.layout import DATA_DIR, README, split_file

if TYPE_CHECKING:
    import datasets


def benchmark_features(class_names: list[str]) -> datasets.Features:
    """The card's "Data fields", in its order."""
    import datasets  # it imports torch: deferred, so that a command's schema (data.protocol) reads before torch

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
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp, row_group_size=256)


def write_readme(root: Path, title: str) -> None:
    """Declare every config found on disk: data/<dataset>/<split>.parquet and data/<dataset>/<surrogate>/<split>.parquet."""
    lines = ["---", "configs:"]
    for dataset_dir in sorted(p for p in (root / DATA_DIR).iterdir() if p.is_dir()):
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
    atomic_write_bytes(root / README, "\n".join(lines).encode())


def snapshot_shape(root: str | Path, dataset: str) -> tuple[int, int]:
    """(classes, image side) of config `dataset` in a local snapshot, from its test split (what `data=custom`
    fills in, so an imported dataset needs no numbers on the command line)."""
    path = split_file(Path(root).expanduser(), dataset, "test")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: data=custom needs data.source=<snapshot folder> and "
                                f"data.dataset=<its config>, as written by python -m rgb.data.import_folder")
    import datasets

    features = datasets.Features.from_arrow_schema(pq.read_schema(path))
    first = pq.ParquetFile(path).read_row_group(0, columns=["image"]).column("image")[0].as_py()
    with Image.open(io.BytesIO(first["bytes"])) as image:
        width, height = image.size
    if width != height:
        raise DataConfigError(f"{path}: images are {width}x{height}, the benchmark's are square: write the snapshot "
                              f"with python -m rgb.data.import_folder (it resizes them to --size x --size)")
    return len(features["label"].names), width


def clean_columns(images: np.ndarray, labels: np.ndarray) -> dict[str, list]:
    n = len(labels)
    return {
        "image": [png_bytes(im) for im in images],
        "label": labels.tolist(),
        "image_id": list(range(n)),
        "perturbation": ["clean"] * n,
        "is_modified": [False] * n,
    }


def common_columns(images: np.ndarray, labels: np.ndarray, seed: int = 0) -> dict[str, list]:
    """The card's `common` split: the 11 corruptions at severity 3 in contiguous blocks (rgb.data.corruptions)."""
    names = [corruption_of_row(i, len(images)) for i in range(len(images))]
    rows = tqdm(enumerate(zip(images, names)), total=len(images), desc="common corruptions", leave=False)
    corrupted = [apply_corruption(im, name, CORRUPTION_SEVERITY, seed + i) for i, (im, name) in rows]
    columns = clean_columns(np.stack(corrupted), labels)
    columns["perturbation"] = [f"common_corruption_severity{CORRUPTION_SEVERITY}"] * len(images)
    columns["corruption"] = names
    columns["is_modified"] = [bool((c != im).any()) for c, im in zip(corrupted, images)]
    return columns


def random_linf_columns(images: np.ndarray, labels: np.ndarray, seed: int = 0) -> dict[str, list]:
    """Uniform noise of at most 30/255 per pixel, drawn in whole grey levels so PNG storage keeps the bound exact."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(-CONTROL_LINF, CONTROL_LINF + 1, size=images.shape)
    noisy = np.clip(images.astype(np.int64) + noise, 0, 255).astype(np.uint8)
    columns = clean_columns(noisy, labels)
    n = len(images)
    columns.update(
        perturbation=["random_uniform"] * n,
        norm=[Norm.LINF.key] * n,
        epsilon=[CONTROL_LINF / 255] * n,
        is_modified=[bool((a != b).any()) for a, b in zip(noisy, images)],
    )
    return columns


def write_dataset(root: Path, dataset: str, class_names: list[str], splits: dict[str, tuple[np.ndarray, np.ndarray]],
                  title: str, seed: int = 0) -> None:
    """Config `dataset` from clean (uint8 NxHxWx3 images, labels) per split: the clean splits, then `common` and
    `random_linf_30` made from `test`, then the README that declares them (deterministic for a given seed)."""
    for split, (images, labels) in splits.items():
        write_split(split_file(root, dataset, split), class_names, clean_columns(images, labels))
    images, labels = splits["test"]
    write_split(split_file(root, dataset, "common"), class_names, common_columns(images, labels, seed))
    write_split(split_file(root, dataset, CONTROL_SPLIT), class_names, random_linf_columns(images, labels, seed))
    write_readme(Path(root), title)


def build_staged(out_dir: Path, write: Callable[[Path], None], replaceable: Callable[[Path], bool]) -> Path:
    """Run `write(staging folder)` next to `out_dir`, then move the finished build into place (rgb.core.files'
    `replaced_whole`, from an empty folder): nothing half-written is ever at `out_dir`. A build another process
    finished there first is kept where `replaceable` says it is one."""
    out_dir = Path(out_dir).expanduser()
    with replaced_whole(out_dir, start_empty=True, keep_theirs=replaceable) as staging:
        write(staging)
    return out_dir
