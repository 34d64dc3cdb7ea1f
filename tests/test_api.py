"""The public API: `from rgb import AutoAttack, benchmark, load_model`, and `rgb.benchmark` scoring a plain user
nn.Module (not timm) on the mini benchmark through the same run store and records as attack.py / evaluate.py."""

import json

import pytest

import rgb
from rgb.evaluation.model_eval import EvaluationError
from rgb.models.io import ExportConflictError
from user_models import trained_small_cnn

# A budget the standard cascade settles within APGD-CE on this CNN (at 4/255 its robust points cost Square's
# 5000 queries each: minutes on a shared CPU); the protocol is the same, only eps differs.
BUDGET = {"linf": 0.2}


def test_public_names():
    from rgb import AutoAttack, benchmark, load_model

    assert AutoAttack is rgb.attacks.AutoAttack and load_model is rgb.models.load and callable(benchmark)


@pytest.fixture(scope="module")
def user_model(mini_dir):
    return trained_small_cnn(mini_dir)


def test_benchmark_scores_a_user_module_and_resumes(user_model, mini_dir, tmp_path):
    rgb.benchmark(user_model, "mini", source=str(mini_dir), settings=("test", "common", "linf"), name="cnn",
                  output_dir=tmp_path, progress=False, budgets=BUDGET)
    scores = json.loads((tmp_path / "eval" / "digits" / "cnn" / "scores.json").read_text())
    settings = scores["white_box"]["settings"]
    assert settings["test"]["total"] == 200 and settings["common"]["total"] == 200
    clean, robust = settings["test"]["accuracy"], settings["autoattack_linf"]["accuracy"]
    assert clean > 0.5 and robust < clean  # a trained model that the attack partly breaks
    assert settings["autoattack_l1"] is None and "autoattack_l1" in scores["white_box"]["missing"]
    summary = json.loads((tmp_path / "attack" / "digits" / "cnn" / "linf" / "summary.json").read_text())
    assert summary["standard"] and summary["model_family"] == "python" and summary["n"] == 200
    assert summary["n_robust"] == settings["autoattack_linf"]["correct"]
    batches = sorted((tmp_path / "attack" / "digits" / "cnn" / "linf").glob("shard-*/batch-*.pt"))
    stamps = [p.stat().st_mtime_ns for p in batches]
    rgb.benchmark(user_model, "digits", source=str(mini_dir), settings=("test", "common", "linf"), name="cnn",
                  output_dir=tmp_path, progress=False, budgets=BUDGET)  # the dataset id works too; nothing redone
    assert [p.stat().st_mtime_ns for p in batches] == stamps


def test_benchmark_refuses_changed_weights_in_an_old_run(user_model, mini_dir, tmp_path):
    kwargs = dict(source=str(mini_dir), settings=("linf",), name="cnn", output_dir=tmp_path, progress=False,
                  budgets=BUDGET)
    rgb.benchmark(user_model, "mini", **kwargs)
    changed = trained_small_cnn(mini_dir, epochs=1, seed=1)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ExportConflictError, match="holds an export of other weights"):
        rgb.benchmark(changed, "mini", **kwargs)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # refused before any write


def test_benchmark_bad_arguments_are_one_line(user_model, mini_dir, tmp_path):
    with pytest.raises(EvaluationError, match="unknown dataset 'imagenet'"):
        rgb.benchmark(user_model, "imagenet", output_dir=tmp_path)
    with pytest.raises(EvaluationError, match="settings must be a non-empty subset"):
        rgb.benchmark(user_model, "mini", settings=("linf", "l3"), output_dir=tmp_path)


def test_benchmark_attacks_in_one_forked_worker_per_thread_on_the_cpu(user_model, mini_dir, tmp_path, monkeypatch):
    """With two threads on the CPU the attack runs in two single-threaded processes (this one and a fork holding the
    model), as attack.py does, with the results of one process; the caller's thread count is left as it was."""
    import torch

    from rgb.runs import runner

    pools, attack_in_workers = [], runner.attack_in_workers
    monkeypatch.setattr(runner, "attack_in_workers",
                        lambda *args, **kwargs: pools.append(args[2]) or attack_in_workers(*args, **kwargs))
    summaries = {}
    for threads in (1, 2):
        rgb.benchmark(user_model, "mini", source=str(mini_dir), settings=("linf",), name=f"cnn-{threads}",
                      output_dir=tmp_path, progress=False, budgets=BUDGET, n_examples=50, batch_size=25,
                      threads=threads)
        assert torch.get_num_threads() == threads
        summaries[threads] = json.loads(
            (tmp_path / "attack" / "digits" / f"cnn-{threads}" / "first-50" / "linf" / "summary.json").read_text())
    assert pools == [2]  # one thread: attacked in this process alone
    assert summaries[2]["results_sha256"] == summaries[1]["results_sha256"]
