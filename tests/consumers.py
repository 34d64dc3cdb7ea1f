"""The readers of rgb's exports, as their own packages ship them: RobustBench 1.1.1 and CLIP_benchmark 1.6.2 from
PyPI, installed without their dependencies into the test-only folder `<venv>/test-only` (Makefile install-dev),
never on rgb's own import path."""

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

TEST_ONLY = Path(sys.prefix) / "test-only"


def _test_only_path() -> None:
    if not TEST_ONLY.is_dir():
        pytest.skip(f"no {TEST_ONLY}: `make install-dev` installs the exports' readers (RobustBench, CLIP_benchmark)")
    if str(TEST_ONLY) not in sys.path:
        sys.path.append(str(TEST_ONLY))  # last: the venv's own packages win


def robustbench(module: str):
    """`robustbench.<module>` from RobustBench's own files. Its package `__init__` is not run: it imports the attack
    runner `autoattack.state`, which is on no package index (RobustBench installs it from git) and which nothing
    that reads model_info files uses."""
    _test_only_path()
    if "robustbench" not in sys.modules:
        spec = importlib.util.find_spec("robustbench")
        if spec is None:
            pytest.skip(f"robustbench is not in {TEST_ONLY}: run `make install-dev`")
        sys.modules["robustbench"] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"robustbench.{module}")


def clip_benchmark_cli():
    """CLIP_benchmark's `clip_benchmark.cli` (the `clip_benchmark` command: `build` is its `main_build`)."""
    _test_only_path()
    return importlib.import_module("clip_benchmark.cli")
