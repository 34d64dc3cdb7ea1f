"""The README's SLURM workflow against a live cluster (CI: the one-node cluster of .ci/slurm_up.sh): a 2-job
training sweep with one job requeued mid-training, the sweep's attack array (2 models x 2 shards) with one shard
requeued mid-shard, and the sweep's evaluation pool. Small on purpose: the mini benchmark, a few short epochs,
Linf only (at eps 0.2, where the cascade settles within APGD-CE)."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# One CPU task per job, no GPU: what a one-node CPU cluster can run two of at a time.
LAUNCHER = ["hydra.launcher.gpus_per_node=0", "hydra.launcher.tasks_per_node=1", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=20"]
EPOCHS = 6
ATTACK = ["norms=[linf]", "data.budgets.linf=0.2", "batch_size=16", "device=cpu", "progress=false"]
SWEEP_NAME = f"test_resnet-ce-full_finetune-e{EPOCHS}"


def cluster_problem() -> str | None:
    if shutil.which("sinfo") is None:
        return "SLURM is not available (no sinfo on PATH); .ci/slurm_up.sh starts a one-node cluster"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "no SLURM cluster answers (sinfo timed out after 30s)"
    if done.returncode != 0 or not done.stdout.strip():
        reason = (done.stderr.strip().splitlines() or ["no node"])[-1]
        return f"no SLURM cluster answers (sinfo: {reason}); .ci/slurm_up.sh starts a one-node cluster"
    return None


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="hydra-submitit-launcher is not installed (pip install 'robustgenbench[slurm]')")
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)


def launch(script: str, *args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RGB_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.Popen([sys.executable, str(REPO / script), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, timeout: float = 900) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-4000:]
    return output


@contextlib.contextmanager
def cancelled_on_failure(process: subprocess.Popen, submitit: Path):
    """A failing check leaves no launcher and no SLURM job behind (they would take the next test's CPUs)."""
    try:
        yield
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
            arrays = {p.name.split("_")[0] for p in submitit.glob("*_*") if p.is_dir()}
            if arrays:
                subprocess.run(["scancel", *sorted(arrays)], capture_output=True, timeout=60)


def scontrol(*args: str) -> None:
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"scontrol {' '.join(args)}: {done.stderr}"


def requeue_mid_work(process: subprocess.Popen, submitit: Path, task: int, started, finished,
                     timeout: float = 600) -> None:
    """Once `started()`, stop array task `task` (suspend), check that it is not `finished()`, and requeue it at
    once: the job starts over from its submission, as after a preemption."""
    deadline = time.monotonic() + timeout
    while not started():
        assert process.poll() is None, process.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "the job never got going"
        time.sleep(0.1)
    (job,) = [p.name for p in submitit.glob(f"*_{task}") if p.is_dir()]
    scontrol("suspend", job)
    assert not finished(), "the job finished before it could be requeued: give it more work"
    scontrol("requeue", job)
    while squeue_state(job) != "PENDING":  # killed first (COMPLETING), then pending again
        assert time.monotonic() < deadline, f"{job} was never requeued"
        time.sleep(0.2)
    while on_the_node(job):  # pending while the killed incarnation's step daemon still holds its spool dir: a
        assert time.monotonic() < deadline, f"{job} never left the node"  # launch then fails and is held for good
        time.sleep(0.2)
    scontrol("release", job)  # a requeued suspended job is held, with a begin time two minutes out
    scontrol("update", f"jobid={job}", "StartTime=now")


def on_the_node(job: str) -> bool:
    """Whether processes of `job` (an array task, `<array>_<task>`) still run on this (the one) node: its steps'
    processes (`scontrol listpids` fails once there are none) or their step daemons (`slurmstepd: [<id>.<step>]`)."""
    done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%A"], capture_output=True, text=True, timeout=60)
    job_id = done.stdout.strip()
    if not job_id:
        return False
    pids = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True, timeout=60)
    daemons = subprocess.run(["pgrep", "-f", rf"slurmstepd: \[{job_id}\."], capture_output=True, timeout=60)
    return pids.returncode == 0 or daemons.returncode == 0


def squeue_state(job: str) -> str:
    done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=60)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, mini_dir):
    root = tmp_path_factory.mktemp("slurm")
    return root, [f"paths.root_dir={root}", f"data.source={mini_dir}"]


@pytest.fixture(scope="module")
def train_sweep(cluster, workspace):
    root, paths = workspace
    sweep = root / "outputs" / "train" / "digits" / "multirun" / SWEEP_NAME
    # named: an unnamed sweep's directory carries its start time (conf/train.yaml), and a sweep is resumed by name
    process = launch("train.py", "-m", "hydra/launcher=slurm", "seed=0,1", f"sweep_name={SWEEP_NAME}", "trainer=cpu",
                     "debug=limit",
                     f"trainer.max_epochs={EPOCHS}", "data.batch_size=16", "data.eval_batch_size=32",
                     "callbacks.progress_bar.refresh_rate=0", *paths, *LAUNCHER, cwd=root)
    job = sweep / "0"
    with cancelled_on_failure(process, sweep / ".submitit"):
        requeue_mid_work(process, sweep / ".submitit", 0, finished=lambda: (job / "model.json").is_file(),
                         started=lambda: (job / "checkpoints" / "last.ckpt").is_file())
        finish(process)
    return sweep


def test_training_sweep_with_a_requeued_job_exports_the_same_identity(train_sweep):
    sweep = train_sweep
    assert sorted(p.name for p in sweep.parent.iterdir()) == [SWEEP_NAME]  # one sweep dir, the seed not in it
    assert (sweep / "multirun.yaml").is_file() and (sweep / ".submitit").is_dir()
    metas = [json.loads((sweep / str(job) / "model.json").read_text()) for job in (0, 1)]
    starts = [json.loads((sweep / str(job) / "run.json").read_text())["starts"] for job in (0, 1)]
    assert len(starts[1]) == 1 and len(starts[0]) == 2  # job 0 was requeued ...
    assert starts[0][1]["resumed_from"].endswith("last.ckpt")  # ... and resumed from its last checkpoint
    assert [m["epochs"] for m in metas] == [EPOCHS, EPOCHS]
    identities = [m["training"]["identity"] for m in metas]
    assert [i.pop("seed") for i in identities] == [0, 1] and identities[0] == identities[1]
    assert [m["run_name"] for m in metas] == [f"{SWEEP_NAME}-s0", f"{SWEEP_NAME}-s1"]
    assert [m["sweep"]["job"] for m in metas] == [0, 1] and metas[0]["sweep"]["name"] == SWEEP_NAME
    log = (sweep / "0" / "train.log").read_text()
    assert log.count("composed config:") == 2 and "resuming from" in log  # both starts, in one log file
    assert "max_epochs=6` reached" in log  # Lightning's own lines reach the file


@pytest.fixture(scope="module")
def attack_array(train_sweep, workspace):
    root, paths = workspace
    attack_dir = root / "outputs" / "attack" / "digits"
    process = launch("attack.py", "-m", "attack=slurm", f"runs={train_sweep}", "shard.count=2", *ATTACK, *paths,
                     *LAUNCHER, cwd=root)
    shard = attack_dir / f"{SWEEP_NAME}-j1" / "linf" / "shard-0-of-2"  # array task 1: model 1, shard 0
    before = {}

    def started() -> bool:
        before.update({p.name: p.stat().st_mtime_ns for p in shard.glob("batch-*.pt")})
        return bool(before)

    submitit = attack_dir / "multirun" / SWEEP_NAME / ".submitit"
    with cancelled_on_failure(process, submitit):
        requeue_mid_work(process, submitit, 1, started,
                         finished=lambda: len(list(shard.glob("batch-*.pt"))) >= 6)  # 13 batches of 16 (200 images): 6 in shard 0
        finish(process)
    return attack_dir, shard, before


def test_attack_array_over_the_sweep_resumes_a_requeued_shard(attack_array, train_sweep, workspace, compose):
    attack_dir, shard, before = attack_array
    root, paths = workspace
    assert sorted(p.name for p in attack_dir.iterdir()) == sorted(
        ["multirun", f"{SWEEP_NAME}-j0", f"{SWEEP_NAME}-j1"])  # named from the train record, never "0"
    after = {p.name: p.stat().st_mtime_ns for p in shard.glob("batch-*.pt")}
    assert len(after) == 6 and all(after[name] == mtime for name, mtime in before.items())  # none recomputed
    from rgb.commands.attack import attack_from_config

    single = root / "single"  # the same attack in one process, here (no SLURM, no shards)
    cfg = compose("attack", f"run={train_sweep / '1'}", f"output_dir={single}", *ATTACK, *paths)
    attack_from_config(cfg, threads=1)
    merged = pq.read_table(attack_dir / f"{SWEEP_NAME}-j1" / "linf" / "results.parquet")
    alone = pq.read_table(single / "linf" / "results.parquet")
    # Every result column is identical. The cost columns (forward_rows, backward_rows) include the capture probe's
    # rows, which a process spends or not by its own decision to trace: seen to differ on one batch, at 9c48283 too.
    cost = ["forward_rows", "backward_rows"]
    assert merged.num_rows == 200 and merged.drop_columns(cost).equals(alone.drop_columns(cost))
    summary = json.loads((attack_dir / f"{SWEEP_NAME}-j1" / "linf" / "summary.json").read_text())
    assert summary["run_name"] == f"{SWEEP_NAME}-j1" and summary["complete"]
    logs = list((attack_dir / "multirun" / SWEEP_NAME).glob("*/attack.log"))
    assert any("accuracy after clean" in p.read_text() for p in logs)  # the per-stage numbers reach the log


def test_evaluation_pool_of_the_sweep_ranks_both_seeds_with_their_spread(attack_array, train_sweep, workspace):
    root, paths = workspace
    output = finish(launch("evaluate.py", f"pool=[{train_sweep}]", "data.budgets.linf=0.2", *paths, cwd=root))
    board = root / "outputs" / "leaderboard"
    rows = json.loads((board / "leaderboard.json").read_text())["rows"]
    assert sorted(r["model"] for r in rows) == [f"{SWEEP_NAME}-j0", f"{SWEEP_NAME}-j1"]
    spread = json.loads((board / "seeds.json").read_text())
    assert spread["seeds"] == [0, 1] and spread["settings"]["autoattack_linf"]["std"] >= 0
    assert spread["settings"]["autoattack_l1"] is None  # not attacked: missing, never 0
    assert "Mean +- std over seeds 0, 1" in output and (board / "seeds.md").is_file()
