"""Run identity across sweeps: one sweep dir per multirun, outputs named from the train run's record (never the job
number), whole sweeps as one attack/evaluate command, the pip line for a missing launcher, and the log file."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import CONF, compose_config
from rgb.commands import main as cli
from rgb.evaluation.leaderboard import seed_spread, seed_spread_markdown
from rgb.runs.store import run_name_for, train_runs


def job_dir(sweep: Path, job: int, run_name="m-ce-ff-e1-s0", sweep_name="m-ce-ff-e1") -> Path:
    directory = sweep / str(job)
    directory.mkdir(parents=True)
    record = {"run_name": run_name, "sweep": {"name": sweep_name, "dir": str(sweep), "job": job}, "dataset": "digits"}
    (directory / "model.json").write_text(json.dumps(record))
    return directory


def test_a_seed_sweep_shares_one_sweep_dir_without_the_seed():
    dirs = {str(compose_config("train", f"seed={seed}", return_hydra_config=True).hydra.sweep.dir).rsplit("-", 2)[0]
            for seed in (0, 1)}
    assert dirs == {"./outputs/train/digits/multirun/test_resnet-ce-full_finetune-e10"}  # then the start time
    named = compose_config("train", "sweep_name=lr_study", return_hydra_config=True)
    assert named.hydra.sweep.dir.endswith("/multirun/lr_study")


def test_outputs_are_named_from_the_train_record_not_the_directory(tmp_path):
    first, second = job_dir(tmp_path / "a", 0), job_dir(tmp_path / "b", 0, sweep_name="other")
    assert (run_name_for(first), run_name_for(second)) == ("m-ce-ff-e1-j0", "other-j0")  # job 0 of two sweeps
    assert run_name_for(first / "model.safetensors") == "m-ce-ff-e1-j0"
    single = tmp_path / "outputs" / "renamed_dir"
    single.mkdir(parents=True)
    (single / "model.json").write_text(json.dumps({"run_name": "recorded", "sweep": None}))
    assert run_name_for(single) == "recorded"
    assert run_name_for(tmp_path / "no_record") == "no_record"  # a model without a record: where it lives
    assert run_name_for(tmp_path / "exported.safetensors") == "exported"


def test_train_runs_of_a_sweep_in_job_order_and_of_a_glob(tmp_path):
    sweep = tmp_path / "sweep"
    jobs = [job_dir(sweep, job) for job in (10, 2, 0)]
    (sweep / ".submitit").mkdir()
    assert train_runs(sweep) == [jobs[2], jobs[1], jobs[0]]
    assert train_runs(f"{sweep}/1*") == [jobs[0]]
    assert train_runs(jobs[1]) == [jobs[1]]
    assert train_runs(tmp_path / "empty") == []


def test_runs_becomes_one_multirun_job_per_model(tmp_path):
    sweep = tmp_path / "sweep"
    jobs = [job_dir(sweep, job) for job in (0, 1)]
    argv = cli._expand_runs(["-m", "attack=slurm", f"runs={sweep}"])
    assert argv[-2] == f"run={jobs[0]},{jobs[1]}"
    assert argv[-1] == "sweep_dir=${paths.output_dir}/attack/${data.dataset}/multirun/m-ce-ff-e1"
    assert "data=mini" in cli._infer_from_run(argv)  # the dataset of the sweep's models
    with pytest.raises(ValueError, match="add -m"):
        cli._expand_runs([f"runs={sweep}"])
    with pytest.raises(ValueError, match="names no trained model"):
        cli._expand_runs(["-m", f"runs={tmp_path / 'nothing'}"])


def test_a_missing_launcher_names_the_extra_to_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert cli._missing_extra(["-m", "hydra/launcher=slurm"]) == (
        "hydra/launcher=slurm needs the optional extra: pip install 'robustgenbench[slurm]'")
    assert "robustgenbench[slurm]" in cli._missing_extra(["attack=slurm"])
    assert "robustgenbench[sweep]" in cli._missing_extra(["hparams_search=optuna_robust"])
    assert cli._missing_extra(["hydra/launcher=basic", "hparams_search=null", "attack=node"]) is None


def test_the_missing_extra_stops_the_entry_point(monkeypatch, capsys):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "hydra/launcher=slurm", "seed=0,1"])
    with pytest.raises(SystemExit) as stop:
        cli.train_main()
    assert str(stop.value) == ("train.py: error: hydra/launcher=slurm needs the optional extra: "
                               "pip install 'robustgenbench[slurm]'")


def test_no_config_names_the_old_distribution():
    assert not [p for p in CONF.rglob("*.yaml") if "rgb[" in p.read_text()]


def fake_record(name, values, score):
    settings = {s: (None if v is None else SimpleNamespace(value=v)) for s, v in values.items()}
    protocol = SimpleNamespace(settings=settings, score=score)
    return SimpleNamespace(dataset="digits", model=SimpleNamespace(run_name=name), score_under=lambda _: protocol)


def fake_meta(seed, lr=0.1):
    return {"training": {"identity": {"seed": seed, "optim.head_lr": lr}}}


def test_mean_and_std_over_seeds_only_when_the_seed_alone_differs():
    values = [{"test": 0.8, "common": 0.5, "autoattack_linf": 0.1, "autoattack_l2": None},
              {"test": 0.6, "common": 0.7, "autoattack_linf": 0.3, "autoattack_l2": None}]
    records = [fake_record(f"s-j{i}", v, None) for i, v in enumerate(values)]
    spread = seed_spread(records, [fake_meta(0), fake_meta(1)])
    assert spread["seeds"] == [0, 1] and spread["models"] == ["s-j0", "s-j1"]
    assert spread["settings"]["test"] == pytest.approx({"mean": 0.7, "std": 0.1414213562})  # sample std (n - 1)
    assert spread["settings"]["autoattack_l2"] is None and spread["sum"] is None  # missing stays missing
    assert "0.7000 +- 0.1414" in seed_spread_markdown(spread)
    assert seed_spread(records, [fake_meta(0), fake_meta(1, lr=0.2)]) is None  # another recipe: no spread
    assert seed_spread(records, [fake_meta(0), fake_meta(0)]) is None
    assert seed_spread(records[:1], [fake_meta(0)]) is None


def test_a_sweep_with_a_job_missing_gives_no_seed_spread_and_says_which(tmp_path, monkeypatch, caplog):
    """Jobs 0 and 2 of a seed sweep hold models, job 1 none (failed) and job 3's dir is gone below job 4: a mean +-
    std over part of the sweep read as all of it, and an earlier seeds.md stayed with no warning. Now the missing
    jobs are named, and seeds.md / seeds.json go."""
    import rgb.evaluation.run as run_module
    from rgb.commands.evaluate import pool_request
    from rgb.runs.store import missing_sweep_jobs

    sweep = tmp_path / "sweep"
    for job in (0, 2, 4):
        (sweep / str(job)).mkdir(parents=True)
        (sweep / str(job) / "model.json").write_text("{}")
    (sweep / "1").mkdir()
    assert missing_sweep_jobs(sweep) == [sweep / "1", sweep / "3"]
    assert missing_sweep_jobs(sweep / "0") == [] and missing_sweep_jobs(tmp_path / "nothing") == []
    monkeypatch.setattr("rgb.commands.evaluate.eval_request", lambda cfg: Path(str(cfg.run)))
    board = tmp_path / "board"
    request = pool_request(compose_config("evaluate", f"pool=[{sweep}]", f"leaderboard_dir={board}"))
    assert request.missing_jobs == (sweep / "1", sweep / "3")

    board.mkdir()
    (board / "seeds.md").write_text("# Mean +- std over seeds 0, 1, 2 (an earlier pool)")
    (board / "seeds.json").write_text("{}")
    monkeypatch.setattr(run_module, "seed_spread", lambda *args: {"a spread": "of jobs 0, 2, 4"})
    monkeypatch.setattr(run_module, "find_records", lambda sources: [])
    monkeypatch.setattr(run_module, "write_leaderboard", lambda *args: None)
    monkeypatch.setattr(run_module, "to_markdown", lambda board: "")
    with caplog.at_level("WARNING"):
        run_module.evaluate_pool(run_module.PoolRequest((), "white_box", board, None, "borda",
                                                        missing_jobs=request.missing_jobs))
    assert not (board / "seeds.md").exists() and not (board / "seeds.json").exists()
    assert f"sweep jobs without a model (failed, running or removed): {sweep / '1'}, {sweep / '3'}" in caplog.text


# ---------------------------------------------------------------- sweeps that repeat (issue 53 item 3)


def test_an_unnamed_sweep_gets_a_fresh_dir_and_a_named_one_keeps_its_own():
    """Two multiruns of one recipe (another sampler seed, another search) never land in one `multirun/<...>/0`: an
    unnamed one carries its start time; sweep_name= names a sweep to resume."""
    import re

    unnamed = compose_config("train", return_hydra_config=True)
    assert re.fullmatch(r"\./outputs/train/digits/multirun/test_resnet-ce-full_finetune-e10-\d{8}-\d{6}",
                        str(unnamed.hydra.sweep.dir))
    assert str(unnamed.sweep_name) == Path(str(unnamed.hydra.sweep.dir)).name  # one value: the sweep's name


def test_a_sweep_job_refused_by_its_dir_names_sweep_name(tmp_path):
    from rgb.training.rundir import RunManifest
    from rgb.training.run import SWEEP_ELSEWHERE
    from rgb.training.config import TrainingError

    job = tmp_path / "multirun" / "m-ce-ff-e1" / "0"
    RunManifest(job).claim({"optim.head_lr": 0.1})
    (job / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(TrainingError, match=r"start fresh with another sweep_name= \(a multirun without one gets"):
        RunManifest(job, SWEEP_ELSEWHERE).claim({"optim.head_lr": 0.2})


@pytest.mark.slow
def test_a_failed_optuna_trial_ends_the_study_in_one_line(tmp_path, mini_dir):
    """A trial whose job fails with a user error has no value: the study ends there with one line, instead of
    Optuna's traceback on a study without a completed trial."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    import subprocess

    done = subprocess.run(
        [sys.executable, str(CONF.parent / "train.py"), "-m", "hparams_search=optuna", "hydra.sweeper.n_trials=2",
         "trainer.max_epochs=0", f"data.source={mini_dir}", f"paths.root_dir={tmp_path}",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said[-2000:]
    assert "Traceback" not in said, said[-2000:]
    errors = [line for line in said.splitlines() if "error:" in line]
    assert len(errors) == 1 and "job 0 (" in errors[0] and "failed, so the study ends" in errors[0], said[-2000:]
    assert "trainer.max_epochs" in errors[0]
