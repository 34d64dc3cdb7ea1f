"""What a benchmark snapshot folder is: where its splits' files go (`split_file`), its README's title and whether
the mini benchmark builder wrote it. A leaf that both the loader (rgb.data.benchmark) and the writers (snapshot,
mini, export) use, so the loader does not import the writer."""

from __future__ import annotations

from pathlib import Path

from rgb.data.catalog import MINI

README = "README.md"  # its YAML `configs:` block declares every split file under DATA_DIR
DATA_DIR = "data"


def split_file(root: str | Path, dataset: str, split: str, surrogate: str | None = None) -> Path:
    """The parquet file of split `split` of config `dataset` (or of `<dataset>-<surrogate>`, a surrogate's
    transfer splits) in the snapshot `root`: `data/<dataset>/[<surrogate>/]<split>.parquet`."""
    folder = Path(root) / DATA_DIR / dataset
    return (folder if surrogate is None else folder / surrogate) / f"{split}.parquet"


def readme_title(root: Path) -> str | None:
    """The title (first `# ` line) of a snapshot's README.md; kept when its config list is rewritten."""
    readme = Path(root) / README
    if readme.is_file():
        for line in readme.read_text(errors="replace").splitlines():
            if line.startswith("# "):
                return line[2:]
    return None


def is_mini_build(root: Path) -> bool:
    """Whether `root` was written by the mini benchmark builder (transfer splits added later included)."""
    return readme_title(root) == MINI.title and (Path(root) / DATA_DIR / MINI.name).is_dir()


__all__ = ["DATA_DIR", "README", "is_mini_build", "readme_title", "split_file"]
