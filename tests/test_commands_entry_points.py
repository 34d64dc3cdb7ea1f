"""attack.py and evaluate.py on a user model named by a factory model.json (not timm), `impl=reference` through
the same run store (accepted and labelled by evaluate.py), and one-line errors from every entry point."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rgb.models import export_factory_model
from user_models import trained_small_cnn
from helpers import REPO, TESTS



def run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1200)


@pytest.fixture(scope="module")
def factory_run(mini_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("factory") / "small_cnn"
    export_factory_model(trained_small_cnn(mini_dir), out, factory="user_models:small_cnn",
                         meta={"dataset": "digits", "num_classes": 10, "image_size": 32})
    return out


@pytest.mark.slow
def test_factory_model_through_attack_and_evaluate_with_both_implementations(factory_run, mini_dir, tmp_path):
    # eps 0.2: the cascade settles within APGD-CE here (at 4/255 the robust points cost minutes on a shared CPU)
    common = [f"run={factory_run}", f"paths.mini_dir={mini_dir}", f"paths.output_dir={tmp_path}", "norms=[linf]",
              "progress=false", "data.budgets.linf=0.2"]
    ours = run("attack.py", *common, cwd=tmp_path)  # no data=: read from the model's model.json
    assert ours.returncode == 0, ours.stderr[-2000:]
    reference_dir = tmp_path / "reference"
    theirs = run("attack.py", *common, "impl=reference", f"output_dir={reference_dir}", cwd=tmp_path)
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    mine = json.loads((tmp_path / "attack" / "digits" / "small_cnn" / "linf" / "summary.json").read_text())
    ref = json.loads((reference_dir / "linf" / "summary.json").read_text())
    assert mine["impl"] == "ours" and ref["impl"] == "reference" and ref["impl_version"].startswith("0.")
    assert mine["model_family"] == ref["model_family"] == "factory" and ref["standard"]
    assert ref["forward_rows_per_image"] > 1 and ref["backward_rows_per_image"] > 0  # counted by rgb
    assert abs(mine["n_robust"] - ref["n_robust"]) <= 2  # the same standard attack, two implementations
    log = (tmp_path / "attack" / "digits" / "small_cnn" / "logs")
    logged = [p.read_text() for p in log.rglob("attack.log")]
    assert any("robust accuracy" in text for text in logged)  # output reaches the log file ...
    assert any("composed config:" in text and "accuracy after clean" in text for text in logged)  # ... all of it
    for attack_dir, label in ((tmp_path / "attack" / "digits" / "small_cnn", "ours"), (reference_dir, "reference")):
        shown = run("evaluate.py", f"run={factory_run}", f"paths.mini_dir={mini_dir}", f"paths.output_dir={tmp_path}",
                    "data.budgets.linf=0.2", f"attack_dir={attack_dir}", f"output_dir={tmp_path / 'eval' / label}",
                    cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr[-2000:]
        scores = json.loads((tmp_path / "eval" / label / "scores.json").read_text())
        assert scores["attacks"]["linf"]["impl"] == label
        if label == "reference":
            assert "reference" in shown.stdout


@pytest.mark.parametrize("script, args, message", [
    ("attack.py", [], "no model given: pass run="),
    ("evaluate.py", [], "nothing to evaluate"),
    ("attack.py", ["run=/nonexistent/run"], "run must be a run directory or exported .safetensors file that exists"),
    ("attack.py", ["run=RUN", "data=flowers102"], "trained on dataset 'digits' (data=mini) but the data config is "
                                                  "data=flowers102"),
    ("attack.py", ["run=RUN", "norms=[l3]"], "norms must be a non-empty list ([a,b,...]), each Linf, L2 or L1"),
    ("attack.py", ["run=RUN", "impl=other"], "impl must be one of"),
    ("attack.py", ["run=RUN", "threads=0"], "threads must be auto or an integer >= 1, got 0"),
])
@pytest.mark.slow
def test_user_errors_are_one_line(script, args, message, factory_run, mini_dir, tmp_path):
    args = [a.replace("RUN", str(factory_run)) for a in args]
    if args:
        args += [f"paths.mini_dir={mini_dir}", f"paths.output_dir={tmp_path}"]
    shown = run(script, *args, cwd=tmp_path)
    lines = [line for line in (shown.stdout + shown.stderr).splitlines() if line.strip()]
    assert shown.returncode != 0 and len(lines) == 1 and message in lines[0], lines[-5:]
