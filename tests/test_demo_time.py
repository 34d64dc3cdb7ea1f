"""benchmarks/demo_time.py: the steps it times are `make demo`'s, on a copy that holds no data or outputs."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def demo_time():
    spec = importlib.util.spec_from_file_location("demo_time", REPO / "benchmarks" / "demo_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_timed_steps_are_make_demos_on_a_fresh_copy(tmp_path):
    bench = demo_time()
    copy = bench.fresh_copy(tmp_path / "copy")
    assert (copy / "Makefile").is_file() and (copy / "rgb" / "runs" / "runner.py").is_file()
    assert not (copy / "data").exists() and not (copy / "outputs").exists()  # built as on a fresh clone
    venv = tmp_path / "venv"
    steps = bench.demo_steps(copy, venv)
    assert steps[0] == f"{venv}/bin/python -m rgb.data.mini data/mini"  # the venv counts as installed
    assert not any("pip install" in step for step in steps)
    commands = [step.split(f"{venv}/bin/python ")[1].split()[0] for step in steps]
    assert commands.count("attack.py") == 2 and commands.count("train.py") == 2 and commands[-1] == "evaluate.py"
    assert any("text_robustness=true" in step and "template_synonym]" in step for step in steps)  # continuation joined
