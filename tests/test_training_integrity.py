"""A train run dir never mixes runs: config identity on resume, what model.json records, the run-dir lock, whole
checkpoints, and configs refused before anything starts (issue 13, training items)."""

import csv
import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rgb.core import file_sha256
from rgb.models import create_model, load_with_meta
from rgb.runs.store import RunDirectory
from rgb.commands.train_config import RESUMABLE_KEYS, training_identity, validate_config
from rgb.training import (
    AtomicCheckpointIO,
    RobustFinetuneModule,
    RunManifest,
    TrainingConfigError,
    TrainingError,
)
from rgb.commands.train import train

# FAST: one set of fast-run overrides for the training tests
from helpers import FAST, REPO, compose_train, raises_one_line, resolved

SHORT = ["debug=limit", "trainer.max_epochs=1", *FAST]


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """train() sets torch's thread count for the process; give the next test the session's."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def snapshot(run_dir):
    return {name: file_sha256(run_dir / name) for name in ("model.safetensors", "model.json", "checkpoints/last.ckpt")}


# ---------------------------------------------------------------- 1. resume under another config


def test_resume_with_another_training_config_is_refused_and_changes_nothing(tmp_path, mini_dir):
    train(compose_train(tmp_path, mini_dir, *SHORT))
    before = snapshot(tmp_path)
    with raises_one_line(TrainingError) as err:
        train(compose_train(tmp_path, mini_dir, *SHORT, "loss=trades", "optim.head_lr=0.5"))
    message = str(err.value)
    assert "loss.name 'ce' -> 'trades'" in message and "optim.head_lr 0.003996 -> 0.5" in message
    assert "loss.beta" in message and "another run_name" in message and str(tmp_path) in message
    assert snapshot(tmp_path) == before
    assert json.loads((tmp_path / "model.json").read_text())["loss"] == {"name": "ce"}


def test_resumable_keys_may_change_and_are_listed_once(tmp_path, mini_dir):
    cfg = compose_train(tmp_path, mini_dir, *SHORT)
    moved = compose_train(tmp_path / "elsewhere", mini_dir, *SHORT, "threads=1", "data.num_workers=1",
                          "data.eval_batch_size=8", "logger=wandb", "trainer.devices=1", "callbacks.progress_bar.refresh_rate=5")
    assert training_identity(resolved(cfg)) == training_identity(resolved(moved))
    assert "loss.name" in training_identity(resolved(cfg)) and "trainer.max_epochs" in training_identity(resolved(cfg))
    assert {"threads", "logger.*", "paths.*", "trainer.devices", "trainer.max_time"} <= set(RESUMABLE_KEYS)


def test_a_start_that_failed_before_training_does_not_bind_the_run_dir(tmp_path, mini_dir):
    typo = ["model.pretrained=true", f"model.weights={tmp_path / 'nowhere.safetensors'}"]
    with pytest.raises(Exception, match="nowhere"):
        train(compose_train(tmp_path, mini_dir, *SHORT, *typo))
    assert (tmp_path / "run.json").is_file()
    train(compose_train(tmp_path, mini_dir, *SHORT))  # the corrected command is not refused
    assert json.loads((tmp_path / "run.json").read_text())["identity"]["model.weights"] is None


def test_resume_from_a_checkpoint_of_another_config_is_refused(tmp_path, mini_dir):
    train(compose_train(tmp_path / "ce", mini_dir, *SHORT))
    foreign = tmp_path / "ce" / "checkpoints" / "last.ckpt"
    with raises_one_line(TrainingError) as err:
        train(compose_train(tmp_path / "other", mini_dir, *SHORT, "optim.head_lr=0.5", f"ckpt_path={foreign}"))
    assert "other hyper-parameters: optim.head_lr 0.003996 -> 0.5" in str(err.value)
    assert not (tmp_path / "other" / "model.json").exists()


def test_checkpoints_without_run_record_are_not_adopted(tmp_path, mini_dir):
    (tmp_path / "checkpoints").mkdir()
    torch.save({"epoch": 0}, tmp_path / "checkpoints" / "last.ckpt")
    with pytest.raises(TrainingError, match="holds checkpoints .*but no run.json"):
        train(compose_train(tmp_path, mini_dir, *SHORT))


def test_a_record_of_another_kind_or_unreadable_is_not_adopted(tmp_path):
    """run.json of an attack run (its identity itself) is no training record, and one that does not decode is
    named: either way the directory is refused in one line and its record left as it was."""
    RunDirectory(tmp_path, {"n_images": 2, "batch_size": 2}).claim()
    attack_record = (tmp_path / "run.json").read_bytes()
    with raises_one_line(TrainingError) as err:
        RunManifest(tmp_path).claim({"loss.name": "ce"})
    assert "run.json is not a training run record; use another run_name" in str(err.value)
    (tmp_path / "run.json").write_bytes(attack_record[:5])
    with raises_one_line(TrainingError) as err:
        RunManifest(tmp_path).claim({"loss.name": "ce"})
    assert f"{tmp_path / 'run.json'} is not valid JSON" in str(err.value) and f"delete {tmp_path}" in str(err.value)
    assert (tmp_path / "run.json").read_bytes() == attack_record[:5]


# ---------------------------------------------------------------- 2. model.json: what produced the weights


class Interrupted(Exception):
    pass


def train_interrupted(cfg, monkeypatch, at_epoch: int) -> None:
    """A job killed as epoch `at_epoch` starts: its last.ckpt holds epoch `at_epoch - 1`."""

    def stop(self):
        if self.current_epoch == at_epoch:
            raise Interrupted

    with monkeypatch.context() as patch:
        patch.setattr(RobustFinetuneModule, "on_train_epoch_start", stop, raising=False)
        with pytest.raises(Interrupted):
            train(cfg)


def test_resume_continues_at_the_right_epoch_and_checkpoints_are_weights_only(tmp_path, mini_dir, monkeypatch):
    overrides = ["debug=limit", "trainer.max_epochs=3", "optim.scheduler=cosine", "optim.warmup_epochs=1", *FAST]
    train_interrupted(compose_train(tmp_path, mini_dir, *overrides), monkeypatch, at_epoch=2)
    last = tmp_path / "checkpoints" / "last.ckpt"
    first = torch.load(last, weights_only=True)
    assert (first["epoch"], first["global_step"]) == (1, 6)
    primitive = (str, int, float, bool, type(None), list, dict)
    stack = [first["hyper_parameters"]]
    while stack:
        node = stack.pop()
        assert isinstance(node, primitive), type(node)
        stack.extend(node.values() if isinstance(node, dict) else node if isinstance(node, list) else [])

    train(compose_train(tmp_path, mini_dir, *overrides))  # ckpt_path=auto
    resumed = torch.load(last, weights_only=True)
    assert (resumed["epoch"], resumed["global_step"]) == (2, 9)
    val_epochs = []
    for version in (0, 1):
        with open(tmp_path / "csv" / f"version_{version}" / "metrics.csv") as f:
            val_epochs.append([row["epoch"] for row in csv.DictReader(f) if row["val/loss"]])
    assert val_epochs == [["0", "1"], ["2"]]  # the second start trained epoch 2 only

    model, meta = load_with_meta(tmp_path)
    best = torch.load(meta["checkpoint"], weights_only=True)["state_dict"]
    reference = create_model("test_resnet", 10, pretrained=False).eval()
    reference.load_state_dict({k.removeprefix("model."): v for k, v in best.items() if k.startswith("model.")})
    x = torch.rand(5, 3, 32, 32)
    assert torch.equal(model(x), reference(x))
    assert meta["epochs"] == 3 and meta["weights"] == "best"


def test_model_json_records_the_starts_that_trained_the_weights_not_a_later_command(tmp_path, mini_dir, monkeypatch):
    two_epochs = ["debug=limit", *FAST]
    train_interrupted(compose_train(tmp_path, mini_dir, *two_epochs, "threads=2"), monkeypatch, at_epoch=1)
    assert not (tmp_path / "model.json").exists()

    train(compose_train(tmp_path, mini_dir, *two_epochs, "threads=1"))  # the requeued job finishes epoch 1
    assert torch.get_num_threads() == 1
    meta = json.loads((tmp_path / "model.json").read_text())
    run = json.loads((tmp_path / "run.json").read_text())
    assert meta["training"]["identity"] == run["identity"]
    assert [s["threads"] for s in meta["training"]["starts"]] == [2, 1]
    assert meta["training"]["starts"][1]["resumed_from"].endswith("last.ckpt")
    assert meta["epochs"] == 2 and meta["loss"] == {"name": "ce"}

    exported = snapshot(tmp_path)
    train(compose_train(tmp_path, mini_dir, *two_epochs, "threads=2", "logger=wandb"))  # nothing left to train
    assert snapshot(tmp_path) == exported
    assert len(json.loads((tmp_path / "run.json").read_text())["starts"]) == 3


# ---------------------------------------------------------------- 3. one process per run dir


HOLD_LOCK = """
import sys, time
from pathlib import Path
from rgb.training import locked
with locked(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(120)
"""


@pytest.mark.slow
def test_second_run_on_a_locked_run_dir_refuses_naming_the_holder(tmp_path, mini_dir):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with raises_one_line(TrainingError) as err:
            train(compose_train(tmp_path, mini_dir, *SHORT))
        assert f"pid {holder.pid} on host {socket.gethostname()}" in str(err.value)
        assert not (tmp_path / "run.json").exists()
    finally:
        holder.kill()
        holder.wait()
    # The holder died without cleaning up: its lock file stays and is taken over.
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == holder.pid
    train(compose_train(tmp_path, mini_dir, *SHORT))
    assert (tmp_path / "model.json").is_file()


# ---------------------------------------------------------------- 4. whole checkpoints, unreadable ones named


def test_checkpoint_write_that_fails_midway_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"epoch": 0, "w": torch.ones(1000)}, path)

    def disk_full(self, data):
        with open(self, "wb") as handle:
            handle.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    with pytest.raises(OSError, match="No space"):
        io.save_checkpoint({"epoch": 1, "w": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path)["epoch"] == 0


def test_training_writes_checkpoints_through_the_atomic_io(tmp_path, mini_dir, monkeypatch):
    import rgb.training.rundir as rundir

    written = []
    original = rundir.atomic_write_bytes
    monkeypatch.setattr(rundir, "atomic_write_bytes", lambda path, data: (written.append(path.name),
                                                                           original(path, data)))
    train(compose_train(tmp_path, mini_dir, *SHORT))
    assert "last.ckpt" in written and any(name.startswith("best-epoch") for name in written)


def test_truncated_last_checkpoint_is_named_in_one_line(tmp_path, mini_dir):
    train(compose_train(tmp_path, mini_dir, *SHORT))
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with raises_one_line(TrainingError) as err:
        train(compose_train(tmp_path, mini_dir, *SHORT))
    assert f"cannot read checkpoint {last}" in str(err.value) and "delete it" in str(err.value)


class PickledThing:
    """A Python object in a checkpoint: what a weights-only load refuses."""


def test_a_checkpoint_that_pickles_objects_is_named_without_torchs_advice_to_unpickle_it(tmp_path):
    from rgb.training.rundir import load_checkpoint_file

    path = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}, "extra": PickledThing()}, path)
    with raises_one_line(TrainingError) as err:
        load_checkpoint_file(path)
    assert str(err.value) == (f"cannot read checkpoint {path} (it pickles Python objects, which a weights-only load "
                              f"refuses to run); it is truncated or not a checkpoint: delete it to start this run "
                              f"over, or pass ckpt_path=<another checkpoint of this run>")


# ---------------------------------------------------------------- 5. nonsense refused before anything starts


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["optim.head_lr=-0.1"], "optim.head_lr must be a finite number > 0"),
        (["optim.head_lr=0"], "optim.head_lr must be a finite number > 0"),
        (["optim.backbone_lr=-1e-4"], "optim.backbone_lr must be a finite number >= 0"),
        (["optim.backbone_weight_decay=-1"], "optim.backbone_weight_decay must be"),
        (["optim.head_weight_decay=nan"], "optim.head_weight_decay must be"),
        (["optim.betas=[0.9,1.5]"], "optim.betas must be two numbers in [0, 1)"),
        (["optim.scheduler=linear"], "optim.scheduler must be one of"),
        (["loss=trades", "loss.beta=-1"], "loss.beta must be a finite number >= 0"),
        (["loss=pgd_at", "loss.attack.eps=0"], "loss.attack.eps must be a finite number > 0"),
        (["loss=pgd_at", "loss.attack.n_iter=0"], "loss.attack.n_iter must be an integer >= 1"),
        (["loss=pgd_at", "loss.attack.norm=L3"], "loss.attack.norm must be Linf, L2 or L1"),
        (["data.batch_size=0"], "data.batch_size must be an integer >= 1"),
        (["trainer.max_epochs=0"], "trainer.max_epochs must be an integer >= 1"),
        (["effective_batch_size=100"], "effective_batch_size 100 must be a multiple of data.batch_size 16"),
        (["threads=0"], "threads must be auto or an integer >= 1"),
        (["monitor.mode=maximum"], "monitor.mode must be min or max"),
        (["model.num_classes=5"], "model.num_classes 5 must equal data.num_classes 10"),
    ],
)
def test_nonsense_hyperparameters_are_refused_before_anything_starts(tmp_path, mini_dir, overrides, key):
    with raises_one_line(TrainingConfigError) as err:
        train(compose_train(tmp_path / "run", mini_dir, *FAST, *overrides))
    assert key in str(err.value)
    assert not (tmp_path / "run").exists()


def test_every_problem_is_named_and_zero_backbone_lr_and_beta_are_allowed(tmp_path, mini_dir):
    with raises_one_line(TrainingConfigError) as err:
        validate_config(resolved(compose_train(tmp_path, mini_dir, "optim.head_lr=-1", "data.batch_size=0")))
    assert "optim.head_lr" in str(err.value) and "data.batch_size" in str(err.value)
    validate_config(resolved(compose_train(tmp_path, mini_dir, "optim.backbone_lr=0", "loss=trades", "loss.beta=0")))


def test_a_diverged_run_is_not_exported(tmp_path, mini_dir):
    with pytest.raises(TrainingError, match="training diverged: best val/loss is inf; nothing exported"):
        train(compose_train(tmp_path, mini_dir, *SHORT, "optim.head_lr=1e8", "optim.backbone_lr=1e8"))
    assert not (tmp_path / "model.json").exists()


# ---------------------------------------------------------------- threads


def test_threads_are_set_and_recorded(tmp_path, mini_dir, monkeypatch):
    monkeypatch.setenv("RGB_THREADS", "1")
    train(compose_train(tmp_path, mini_dir, *SHORT))  # threads=auto reads RGB_THREADS
    starts = json.loads((tmp_path / "model.json").read_text())["training"]["starts"]
    assert [s["threads"] for s in starts] == [1] and torch.get_num_threads() == 1
    assert starts[0]["host"] == socket.gethostname() and starts[0]["resumed_from"] is None
    assert time.strptime(starts[0]["started"], "%Y-%m-%dT%H:%M:%S")


# ---------------------------------------------------------------- zero-shot run dirs: the same identity and lock


from helpers import TINY_CLIP  # noqa: E402  (the tiny random open_clip of the zero-shot tests)

ZEROSHOT = ["strategy=zeroshot", "monitor.metric=val/acc", *TINY_CLIP]


def exported_files(run_dir):
    return {name: file_sha256(run_dir / name) for name in ("model.safetensors", "model.json", "run.json")}


def test_zeroshot_rerun_with_other_prompts_is_refused_and_keeps_the_export(tmp_path, mini_dir, caplog):
    """Issue 19 item 18: prompts=cpe under the run name of a prompts=mean head replaced its export silently."""
    extra = [f"paths.data_dir={tmp_path / 'data'}"]
    train(compose_train(tmp_path / "run", mini_dir, *ZEROSHOT, "prompts=mean", *extra))
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    meta = json.loads((tmp_path / "run" / "model.json").read_text())
    assert run["task"] == "train" and run["identity"]["prompts.ensemble"] == "mean" and len(run["starts"]) == 1
    assert meta["training"]["identity"] == run["identity"] and meta["training"]["starts"] == run["starts"]
    before = exported_files(tmp_path / "run")
    with raises_one_line(TrainingError) as err:
        train(compose_train(tmp_path / "run", mini_dir, *ZEROSHOT, "prompts=cpe", *extra))
    message = str(err.value)
    assert "was made by another training config" in message and "prompts.ensemble 'mean' -> 'cpe'" in message
    assert exported_files(tmp_path / "run") == before
    with caplog.at_level("INFO", logger="rgb.training.zeroshot"):  # the same config again: nothing to redo
        value = train(compose_train(tmp_path / "run", mini_dir, *ZEROSHOT, "prompts=mean", *extra))
    assert exported_files(tmp_path / "run") == before and value == meta["monitor_value"]
    assert "already holds this zero-shot head" in caplog.text


def test_zeroshot_weights_without_a_run_record_are_not_replaced(tmp_path, mini_dir):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model.safetensors").write_bytes(b"weights of an earlier rgb")
    with pytest.raises(TrainingError, match=r"holds model.safetensors but no run.json"):
        train(compose_train(tmp_path / "run", mini_dir, *ZEROSHOT, f"paths.data_dir={tmp_path / 'data'}"))
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == b"weights of an earlier rgb"


@pytest.mark.slow
def test_zeroshot_run_dir_is_locked_like_a_training_run(tmp_path, mini_dir):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TrainingError, match=f"in use by another training run: pid {holder.pid}"):
            train(compose_train(tmp_path, mini_dir, *ZEROSHOT, f"paths.data_dir={tmp_path / 'data'}"))
        assert not (tmp_path / "run.json").exists() and not (tmp_path / "model.json").exists()
    finally:
        holder.kill()
        holder.wait()


def test_default_run_names_tell_the_zeroshot_ensembles_apart(tmp_path, mini_dir):
    names = {p: compose_train(tmp_path, mini_dir, "strategy=zeroshot", "model=openclip_mini", f"prompts={p}").run_name
             for p in ("mean", "cpe", "zpe")}
    assert names == {p: f"rgb-mini-clip-zeroshot-{p}-s0" for p in ("mean", "cpe", "zpe")}
    assert compose_train(tmp_path, mini_dir).run_name == "test_resnet-ce-full_finetune-e10-s0"  # unchanged


@pytest.mark.parametrize("overrides, message", [
    (["monitor.metric=val/nothing"], "monitored metric 'val/nothing' is not reported by strategy=zeroshot"),
    (["prompts.tau=0"], "prompts.tau must be a finite number > 0, got 0"),
    (["prompts.k=abc"], "prompts.k must be a fraction in (0, 1], got 'abc'"),
    (["run_name=../x"], "run_name must be one directory name"),
])
def test_zeroshot_configs_are_validated_before_the_run_dir_is_claimed(tmp_path, mini_dir, overrides, message):
    with raises_one_line(TrainingConfigError) as err:
        train(compose_train(tmp_path / "run", mini_dir, *ZEROSHOT, *overrides))
    assert message in str(err.value)
    assert not (tmp_path / "run").exists()


def test_a_zeroshot_head_on_a_timm_model_is_a_training_error(tmp_path, mini_dir):
    with pytest.raises(TrainingConfigError, match="zero-shot head needs a CLIP text tower: model family 'timm'"):
        train(compose_train(tmp_path / "run", mini_dir, "strategy=zeroshot", "monitor.metric=val/acc", *FAST))
    assert not (tmp_path / "run" / "model.json").exists()


def test_a_monitored_metric_that_is_never_logged_is_one_line(tmp_path, mini_dir):
    with raises_one_line(TrainingConfigError) as err:
        train(compose_train(tmp_path, mini_dir, *SHORT, "monitor.metric=val/acc_typo"))
    assert "monitored metric 'val/acc_typo' was never logged" in str(err.value) and "'val/acc'" in str(err.value)
    assert not (tmp_path / "model.json").exists()


# ---------------------------------------------------------------- the .hydra record and sweeps, through train.py


def train_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RGB_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_a_refused_start_leaves_the_hydra_record_of_the_trained_config(tmp_path, mini_dir):
    """Issue 19 item 20: a refused re-run rewrote .hydra/config.yaml and overrides.yaml."""
    common = [f"paths.output_dir={tmp_path}", f"paths.mini_dir={mini_dir}", "run_name=r", *SHORT]
    first = train_command(*common, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    run_dir = tmp_path / "train" / "digits" / "r"
    record = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    assert sorted(record) == ["config.yaml", "hydra.yaml", "overrides.yaml"] and b"run_name=r" in record["overrides.yaml"]
    # train.log gets the refusal appended; run.lock names whoever holds (or last held) the lock, not the config.
    kept = [p for p in run_dir.rglob("*") if p.is_file() and p.name not in ("train.log", "run.lock")]
    files = {p: file_sha256(p) for p in kept}
    refused = train_command(*common, "optim.head_lr=0.5", cwd=tmp_path)
    assert refused.returncode == 2 and "was made by another training config" in refused.stderr + refused.stdout
    assert {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == record
    assert {p: file_sha256(p) for p in kept} == files
    assert {p for p in run_dir.rglob("*") if p.is_file() and p.name not in ("train.log", "run.lock")} == set(files)


@pytest.mark.slow
def test_a_sweep_runs_its_good_jobs_and_names_the_bad_one(tmp_path, mini_dir):
    swept = train_command("-m", f"paths.output_dir={tmp_path}", f"paths.mini_dir={mini_dir}", *SHORT,
                          "optim.head_lr=-1,0.004", cwd=tmp_path)
    assert swept.returncode == 1, swept.stderr[-2000:]
    last = swept.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: 1 job(s) of the sweep failed, the others ran: job 0 (")
    assert "optim.head_lr must be a finite number > 0, got -1" in last
    assert len(list((tmp_path / "train" / "digits" / "multirun").rglob("model.json"))) == 1
