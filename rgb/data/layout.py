"""What a benchmark snapshot folder is, read from the folder: its README's title and whether the mini benchmark
builder wrote it. A leaf that both the loader (rgb.data.benchmark) and the writers (snapshot, mini, export) use,
so the loader does not import the writer."""

from __future__ import annotations

from pathlib import Path

from rgb.data.catalog import MINI


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


__all__ = ["is_mini_build", "readme_title"]
