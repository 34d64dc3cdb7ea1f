"""benchmarks/demo_time.py: the steps it times are `make demo`'s, on a copy that holds no data or outputs (run as a
user runs it, with no step run: --steps 0)."""

import json
import subprocess
import sys

import pytest
from helpers import REPO



@pytest.mark.slow
def test_the_timed_steps_are_make_demos_on_a_fresh_copy(tmp_path):
    venv, copy, out = tmp_path / "venv", tmp_path / "copy", tmp_path / "demo_time.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "demo_time.py"), "--venv", str(venv), "--steps", "0",
                    "--keep", str(copy), "--out", str(out)], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    assert (copy / "Makefile").is_file() and (copy / "rgb" / "runs" / "runner.py").is_file()
    assert not (copy / "data").exists() and not (copy / "outputs").exists()  # built as on a fresh clone
    steps = json.loads(out.read_text())["planned"]
    assert steps[0] == f"{venv}/bin/python -m rgb.data.mini data/mini"  # the venv counts as installed
    assert not any("pip install" in step for step in steps)
    commands = [step.split(f"{venv}/bin/python ")[1].split()[0] for step in steps]
    assert commands.count("attack.py") == 2 and commands.count("train.py") == 2 and commands[-1] == "evaluate.py"
    assert any("text_robustness=true" in step and "template_synonym]" in step for step in steps)  # continuation joined
