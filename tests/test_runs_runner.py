"""attack.py and its runner: resume after SIGKILL, shards + merge, refused resumes, progress, norm subsets, export.

Runs use a small ViT trained by the real training code (cached for the session) on the first images of the mini
test split, mostly with APGD-CE only so that a run takes seconds (the export test runs the whole standard cascade
at a budget APGD-CE wins at once; the cascade itself is tested in test_attacks_autoattack.py).
"""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch

from helpers import REPO, compose_config, head_of_test_split
from rgb.attacks.options import AttackOptionsError
from rgb.core.files import flock
from rgb.data import load_split
from rgb.data.mini import CLASS_NAMES, DATASET
from rgb.data.export import quantise_within_budget
from rgb.commands.attack import attack_from_config
from rgb.runs.request import shard_position
from rgb.runs.store import AttackRunError
from rgb.models import create_model, export_model

N_IMAGES, BATCH = 24, 6
N_BATCHES = N_IMAGES // BATCH
LINF_EPS = 16 / 255  # the test model is quite robust at 4/255; here APGD-CE leaves a few robust points, quickly


# The test model is the conftest fixture `surrogate` (helpers.trained_surrogate: a one-block ViT).
@pytest.fixture(scope="module")
def small_bench(mini_dir, tmp_path_factory):
    return head_of_test_split(mini_dir, tmp_path_factory.getbasetemp() / f"head{N_IMAGES}", N_IMAGES)


def overrides(run: Path, bench: Path, out: Path, *extra: str) -> list[str]:
    return [f"run={run}", f"paths.mini_dir={bench}", f"output_dir={out}", "attacks=[apgd-ce]", "norms=[linf]",
            f"data.budgets.linf={LINF_EPS}", f"batch_size={BATCH}", "progress=false", *extra]


def attack(items: list[str], threads: int = 1) -> dict:
    """attack.py's run in this process; `threads`: what the entry point would have configured (its `threads=`)."""
    summaries = attack_from_config(compose_config("attack", *items), threads=threads)
    return {name: summary.to_json() for name, summary in summaries.items()}


def results(out: Path, norm: str = "linf") -> pd.DataFrame:
    return pd.read_parquet(out / norm / "results.parquet")


def batch_files(out: Path, norm: str = "linf") -> list[Path]:
    return sorted((out / norm).glob("shard-*/batch-*.pt"))


@pytest.fixture(scope="module")
def reference(surrogate, small_bench, tmp_path_factory):
    """One uninterrupted, unsharded run: what every resumed or sharded run must reproduce exactly."""
    out = tmp_path_factory.mktemp("reference")
    summaries = attack(overrides(surrogate, small_bench, out))
    return out, summaries["linf"]


def test_reference_run_writes_the_documented_run_directory(reference):
    out, summary = reference
    table = results(out)
    assert list(table.columns) == ["image_id", "label", "clean_pred", "adv_pred", "clean_correct", "robust",
                                   "fooled_by", "perturbation_norm", "forward_rows", "backward_rows"]
    assert table["image_id"].tolist() == list(range(N_IMAGES))
    assert len(batch_files(out)) == N_BATCHES
    assert summary["complete"] and summary["n"] == N_IMAGES and summary["split"] == "test"
    assert summary["n_robust"] == int(table["robust"].sum()) and summary["attacks"] == ["apgd-ce"]
    assert summary["robust_accuracy"] == pytest.approx(table["robust"].mean())
    assert summary["accuracy_after"]["clean"] == pytest.approx(table["clean_correct"].mean())
    # a trained model that the attack partly breaks: the run measured something
    assert 0 < summary["robust_accuracy"] < summary["clean_accuracy"]
    assert (table["clean_pred"] == table["label"]).equals(table["clean_correct"])
    assert (table["adv_pred"] == table["label"]).equals(table["robust"])
    assert (table["perturbation_norm"] <= summary["eps"] + 1e-7).all()
    assert len(summary["weights_sha256"]) == 64 and summary["versions"]["torch"] == torch.__version__


def is_worker(pid: int) -> bool:
    """A live worker process (forked or spawned): one that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
def test_sigkill_then_rerun_continues_and_equals_an_uninterrupted_run(surrogate, small_bench, reference, tmp_path):
    out = tmp_path / "killed"
    command = [sys.executable, str(REPO / "attack.py"), *overrides(surrogate, small_bench, out)]
    command[command.index("progress=false")] = "progress=true"
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    # two workers attack two batches at once: kill as the first is written, while the other is still running
    while len(batch_files(out)) < 1 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    workers = [int(p) for p in Path(f"/proc/{first.pid}/task/{first.pid}/children").read_text().split()]
    assert workers and all(map(is_worker, workers))  # the worker beside attack.py itself is running
    first.send_signal(signal.SIGKILL)
    first.wait()
    deadline = time.monotonic() + 30  # its worker processes die with it: none goes on beside the re-run
    while any(map(is_worker, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(is_worker, workers)), "a worker process outlived its killed attack.py"
    survivors = {p: p.stat().st_mtime_ns for p in batch_files(out)}
    assert 1 <= len(survivors) < N_BATCHES, "the run was not interrupted mid-way"
    assert not (out / "linf" / "results.parquet").exists()

    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in survivors} == survivors  # finished batches were not recomputed
    pd.testing.assert_frame_equal(results(out), results(reference[0]))
    assert "robust accuracy" in second.stdout and f"/{N_IMAGES})" in second.stdout  # the per-norm summary line
    assert "img/s" in second.stderr or "img]" in second.stderr  # the tqdm progress bar
    assert "robust" in second.stderr


def test_two_shards_merge_to_the_single_shard_result_and_merge_names_a_missing_shard(
    surrogate, small_bench, reference, tmp_path, caplog
):
    out = tmp_path / "sharded"
    caplog.set_level(logging.INFO, logger="rgb")
    assert attack(overrides(surrogate, small_bench, out, "shard.index=0", "shard.count=2")) == {}
    assert "merge waits for" in caplog.text
    with pytest.raises(AttackRunError, match=rf"shard 1 of 2 \({N_BATCHES // 2} batches"):
        attack(overrides(surrogate, small_bench, out, "merge_only=true", "shard.count=2"))
    assert not (out / "linf" / "results.parquet").exists()
    summaries = attack(overrides(surrogate, small_bench, out, "shard.index=1", "shard.count=2"))
    assert sorted(p.parent.name for p in batch_files(out)) == (
        ["shard-0-of-2"] * (N_BATCHES // 2) + ["shard-1-of-2"] * (N_BATCHES // 2))
    pd.testing.assert_frame_equal(results(out), results(reference[0]))
    timing = ("attack_seconds",)
    assert {k: v for k, v in summaries["linf"].items() if k not in timing} == {
        k: v for k, v in reference[1].items() if k not in timing}
    merged_again = attack(overrides(surrogate, small_bench, out, "merge_only=true"))  # any shard layout merges
    assert merged_again["linf"]["n_robust"] == reference[1]["n_robust"]


@pytest.mark.parametrize("devices", [1, 2])
def test_each_norm_is_merged_and_reported_when_its_batches_are_done(surrogate, small_bench, tmp_path, caplog, devices):
    """attack.py reports a norm as soon as it is done, not after the last norm: its summary.json is written before
    the next norm's first batch (one process, and a pool whose parent draws the bars)."""
    with caplog.at_level(logging.INFO):
        summaries = attack(overrides(surrogate, small_bench, tmp_path, "norms=[linf,l2]", "data.budgets.l2=1.0",
                                     f"shard.devices={devices}"), threads=devices)
    assert list(summaries) == ["linf", "l2"]
    linf_summary = (tmp_path / "linf" / "summary.json").stat().st_mtime_ns
    l2_batches = [p.stat().st_mtime_ns for p in batch_files(tmp_path, "l2")]
    if devices == 1:
        assert linf_summary < min(l2_batches)
    else:  # workers take the next task when done: l2's batches start while linf's last ones finish
        assert linf_summary < max(l2_batches)
    lines = [r.getMessage() for r in caplog.records]
    assert [i for i, m in enumerate(lines) if m.startswith("linf eps=")][0] < \
        [i for i, m in enumerate(lines) if m.startswith("l2 eps=")][0]


def test_max_images_attacks_the_first_images_in_a_run_of_their_own(surrogate, small_bench, reference, tmp_path,
                                                                   caplog):
    """attack.py max_images=N: a first look, in `first-N` beside (never mixed with) a whole-split run, logged PARTIAL;
    an evaluation of the first N reads it, and the whole run's when there is none."""
    from rgb.runs.store import attack_dir_read, first_images_dir

    with caplog.at_level(logging.WARNING):
        summary = attack(overrides(surrogate, small_bench, tmp_path, "max_images=8"))["linf"]
    first = first_images_dir(tmp_path, 8)
    assert summary["n"] == 8 and not (tmp_path / "linf").exists()
    assert results(first)["image_id"].tolist() == list(range(8))
    full = results(reference[0])
    assert results(first).head(BATCH).equals(full.head(BATCH))  # the same first batch, the same draws
    assert "linf: PARTIAL, the first 8 of 24 test images" in caplog.text
    assert attack_dir_read(tmp_path, 8) == first and attack_dir_read(tmp_path, None) == tmp_path
    assert attack_dir_read(reference[0], 8) == reference[0]


@pytest.mark.parametrize(
    "change, field",
    [("seed=1", "seed 0 -> 1"), ("data.budgets.linf=0.03", "eps"), ("batch_size=4", "batch_size"),
     ("export_adversarial=true", "export_adversarial"), ("tail_rows=64", "tail_rows"),
     ("schedule=pooled", "schedule")],
)
def test_resume_into_a_directory_of_another_run_is_refused_and_loses_nothing(
    surrogate, small_bench, reference, change, field
):
    out = reference[0]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    with pytest.raises(AttackRunError, match="was made for another run: .*" + re.escape(field)):
        attack(overrides(surrogate, small_bench, out, change))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_resume_with_other_weights_is_refused(small_bench, reference, tmp_path):
    other = create_model("vit_tiny_patch16_224", 10, pretrained=False, img_size=32, patch_size=16, embed_dim=64,
                         depth=1, num_heads=1, global_pool="avg", class_token=False)
    export_model(other, tmp_path / "vit_mlp", {"dataset": DATASET, "image_size": 32, "class_names": CLASS_NAMES})
    with pytest.raises(AttackRunError, match="weights_sha256"):
        attack(overrides(tmp_path / "vit_mlp", small_bench, reference[0]))


def test_model_of_another_dataset_is_refused_before_anything_is_written(surrogate, tmp_path):
    with pytest.raises(AttackRunError, match=r"on dataset 'digits' \(data=mini\) but the data config is data=flowers102"):
        attack([f"run={surrogate}", "data=flowers102", f"output_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ~80 s: the six attacks of "plus" through attack.py
def test_plus_version_runs_through_attack_py(surrogate, small_bench, tmp_path):
    out = tmp_path / "plus"
    summary = attack(overrides(surrogate, small_bench, out, "version=plus", "attacks=[apgd-ce,apgd-dlr,fab]"))["linf"]
    assert summary["version"] == "plus" and summary["attacks"] == ["apgd-ce", "apgd-dlr", "fab"]
    assert list(summary["accuracy_after"]) == ["clean", "apgd-ce", "apgd-dlr", "fab"]
    assert summary["robust_accuracy"] <= summary["accuracy_after"]["apgd-ce"] <= summary["clean_accuracy"]


def test_targets_side_by_side_keep_the_fab_t_flags_and_are_recorded(surrogate, small_bench, tmp_path):
    """tail_rows (spec §6.3 item 8) through attack.py: FAB-T's flags stay, and the summary records the setting."""
    runs = {rows: attack(overrides(surrogate, small_bench, tmp_path / f"tail-{rows}", "attacks=[apgd-ce,fab-t]",
                                   f"tail_rows={rows}"))["linf"] for rows in (0, 1000)}
    assert runs[1000]["tail_rows"] == 1000 and runs[0]["tail_rows"] == 0 and runs[1000]["standard"] is False
    assert results(tmp_path / "tail-1000")["robust"].equals(results(tmp_path / "tail-0")["robust"])
    assert runs[0]["input_format"] == "auto" and runs[0]["capture"] == "auto"
    with pytest.raises(AttackOptionsError, match="input_format must be one of"):
        attack(overrides(surrogate, small_bench, tmp_path / "bad", "input_format=nhwc"))
    with pytest.raises(AttackOptionsError, match="capture must be one of"):
        attack(overrides(surrogate, small_bench, tmp_path / "bad", "capture=script", "impl=reference"))
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_compiled_channels_last_model_gives_the_flags_of_the_plain_run(surrogate, small_bench, reference, tmp_path):
    """compile / channels_last change float rounding only: same robust flags, recorded in the summary."""
    out = tmp_path / "compiled"
    summary = attack(overrides(surrogate, small_bench, out, "compile=true", "channels_last=true"))["linf"]
    assert summary["compile"] is True and summary["channels_last"] is True
    assert reference[1]["compile"] is False
    plain, compiled = results(reference[0]), results(out)
    assert compiled["robust"].equals(plain["robust"]) and compiled["clean_pred"].equals(plain["clean_pred"])


def test_norm_subset_and_export_round_trip(surrogate, small_bench, tmp_path):
    out = tmp_path / "export"
    eps = 4.0  # large enough that APGD-CE fools every correctly classified image
    summaries = attack(overrides(surrogate, small_bench, out, "norms=[l2]", f"data.budgets.l2={eps}",
                                 "export_adversarial=true", "attacks=null"))  # the whole standard cascade
    assert list(summaries) == ["l2"] and sorted(p.name for p in out.iterdir()) == ["adversarial", "l2"]
    table = results(out, "l2")
    split = f"l2_{eps:g}"  # no transfer split of the mini config has this budget
    adversarial = load_split(str(out / "adversarial"), DATASET, split, surrogate="vit_mlp")  # validated against test
    clean = load_split(str(small_bench), DATASET, "test")
    assert summaries["l2"]["export"].endswith(f"{DATASET}/vit_mlp/{split}.parquet")
    assert set(adversarial["perturbation"]) == {"transfer_autoattack"} and set(adversarial["norm"]) == {"l2"}
    assert set(adversarial["surrogate"]) == {"vit_mlp"} and np.allclose(adversarial["epsilon"], eps)
    stored = adversarial.cast_column("image", datasets.Image(decode=False))["image"]
    originals = clean.cast_column("image", datasets.Image(decode=False))["image"]
    for i, row in enumerate(adversarial):
        delta = (np.asarray(row["image"], dtype=np.float64) - np.asarray(clean[i]["image"], dtype=np.float64)) / 255
        assert np.sqrt((delta**2).sum()) <= eps * (1 + 1e-6)  # within budget after 8-bit quantisation
        assert row["is_modified"] == bool(np.any(delta != 0))
        if not row["is_modified"]:
            assert stored[i]["bytes"] == originals[i]["bytes"]  # copied unchanged, byte for byte
    assert adversarial["is_modified"] == table["clean_correct"].tolist()  # everything attacked was fooled
    assert not table["robust"].any()
    assert summaries["l2"]["attacks"] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert set(table["fooled_by"]) <= {0, 1}  # APGD-CE fooled everything: the later attacks had nothing left


def test_quantised_images_stay_within_the_budget_where_plain_rounding_does_not():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 8, 8), generator=g).float() / 255
    direction = torch.randn(x.shape, generator=g)
    for norm, eps in (("l1", 0.9), ("l2", 0.12), ("linf", 4.6 / 255)):
        flat = direction.flatten(1)
        size = {"l1": flat.abs().sum(1), "l2": flat.norm(dim=1), "linf": flat.abs().amax(1)}[norm]
        x_adv = (x + eps * direction / size.view(-1, 1, 1, 1)).clamp(0, 1)  # on (or inside) the sphere
        rounded = torch.round(x_adv * 255)
        q = quantise_within_budget(x, x_adv, norm, eps)
        assert q.dtype == torch.uint8 and q.shape == x.shape
        for candidate, must_fit in ((q.double(), True), (rounded.double(), False)):
            delta = (candidate - torch.round(x.double() * 255)).flatten(1) / 255
            measured = {"l1": delta.abs().sum(1), "l2": delta.norm(dim=1), "linf": delta.abs().amax(1)}[norm]
            fits = bool((measured <= eps * (1 + 1e-6)).all())
            assert fits == must_fit, (norm, must_fit)
        assert (q.double() - rounded).abs().max() <= 1  # at most one grey level from the nearest rounding


def test_shard_defaults_come_from_a_slurm_array(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "5")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    assert shard_position(None, None) == (2, 4)
    assert shard_position(0, 1) == (0, 1)
    with pytest.raises(AttackRunError, match="shard.index"):
        shard_position(4, 4)


def test_presets_compose(compose):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")  # attack=slurm: the launcher's config
    slurm = compose("attack", "attack=slurm", "run=outputs/train/digits/x", "shard.count=8", return_hydra_config=True)
    node = compose("attack", "attack=node", "run=outputs/train/digits/x")
    assert slurm.hydra.sweeper.params["shard.index"] == "range(0,8)"
    assert slurm.hydra.launcher._target_.endswith("SlurmLauncher") and slurm.hydra.launcher.array_parallelism == 8
    assert slurm.output_dir.endswith("attack/digits/x") and node.shard.devices == "auto"


@pytest.mark.slow
@pytest.mark.parametrize("threads", [2, 4])
def test_worker_processes_equal_one_process(surrogate, small_bench, reference, tmp_path, threads):
    """shard.devices=2 on the CPU: attack.py and one more worker (forked with one thread each, spawned with two)
    take the batches as they come and write the node's shard layout; the results equal one process's, batch for
    batch."""
    out = tmp_path / "workers"
    attack(overrides(surrogate, small_bench, out, "shard.devices=2"), threads=threads)
    assert {p.parent.name for p in batch_files(out)} == {"shard-0-of-1"} and len(batch_files(out)) == N_BATCHES
    pd.testing.assert_frame_equal(results(out), results(reference[0]))


@pytest.mark.gpu
@pytest.mark.slow
def test_more_workers_than_gpus_share_them_round_robin(surrogate, small_bench, tmp_path):
    """shard.devices=2 on one GPU: two spawned workers on cuda:0 take the batches as they come; same batches, same
    kernels, so the same results as one worker."""
    one, two = tmp_path / "one", tmp_path / "two"
    attack(overrides(surrogate, small_bench, one, "device=cuda", "shard.devices=1"))
    attack(overrides(surrogate, small_bench, two, "device=cuda", f"shard.devices={torch.cuda.device_count() + 1}"))
    assert len(batch_files(two)) == N_BATCHES
    pd.testing.assert_frame_equal(results(two), results(one))


def test_a_failing_worker_stops_the_parent_at_its_next_report():
    """On the CPU the parent attacks too while a thread draws the workers' reports: a worker's error (or a worker
    that died without a word) ends the pump and the parent's own attack at its next progress report."""
    import queue
    import threading
    from types import SimpleNamespace

    from rgb.runs import pool

    drawn = []
    bars = SimpleNamespace(stage=lambda *args: drawn.append(args))
    for events, alive, message in [
        ([("stage", (0, 1, "apgd-ce")), ("error", (1, "AttackRunError: broken model", None))], True,
         "attack worker 1: AttackRunError: broken model"),
        ([("stage", (0, 1, "apgd-ce"))], False, "attack worker 1 stopped (exit code -9)"),
    ]:
        drawn.clear()
        inbox = queue.Queue()
        for event in events:
            inbox.put(event)
        shared = pool._SharedBars(bars)
        worker = SimpleNamespace(is_alive=lambda alive=alive: alive, exitcode=-9)
        pool.pump_events(inbox, {1: worker}, shared, threading.Event())
        assert drawn == [(0, 1, "apgd-ce")] and message in str(shared.failure)
        with pytest.raises(AttackRunError, match="attack worker 1"):
            shared.stage(0, 0, "square")  # the parent's own report
        assert len(drawn) == 1

    def broken(*args):
        raise OSError("terminal gone")

    inbox = queue.Queue()
    inbox.put(("stage", (0, 1, "apgd-ce")))
    shared = pool._SharedBars(SimpleNamespace(stage=broken))
    pool.pump_events(inbox, {1: SimpleNamespace(is_alive=lambda: True)}, shared, threading.Event())
    with pytest.raises(AttackRunError, match="progress failed: OSError: terminal gone"):  # never a quiet end
        shared.check()


def test_a_worker_whose_exit_arrives_after_the_wait_ended_is_not_a_failure():
    """A worker flushes its last report and exits between the parent's empty wait and its liveness check: the pump
    reads what is in the pipe before calling the worker stopped (a worker of test_each_norm_is_merged... was)."""
    import threading
    from queue import Empty
    from types import SimpleNamespace

    from rgb.runs import pool

    class LateExit:
        def __init__(self):
            self.waits = 0

        def get(self, timeout):
            self.waits += 1
            if self.waits == 1:
                raise Empty  # the wait ended just before the worker's exit reached the pipe
            return "exit", (1,)

    shared = pool._SharedBars(SimpleNamespace())
    pool.pump_events(LateExit(), {1: SimpleNamespace(is_alive=lambda: False, exitcode=0)}, shared, threading.Event())
    assert shared.failure is None


@pytest.mark.parametrize(("device", "threads", "method"), [("cpu", 2, "fork"), ("cpu", 4, "spawn"),
                                                          ("cuda", 2, "spawn")])
def test_single_threaded_cpu_workers_are_forked_with_the_model(device, threads, method):
    """Forked CPU workers start with the parent's model at once; CUDA and multi-threaded OpenMP are not fork-safe."""
    from types import SimpleNamespace

    from rgb.runs.pool import worker_start_method

    assert worker_start_method(SimpleNamespace(device=device, threads=threads), 2) == method


@pytest.mark.parametrize(("device", "expected"), [("cpu", 2), ("cuda", 4)])
def test_workers_on_one_cpu_share_its_threads(monkeypatch, device, expected):
    """Workers on the CPU take threads / workers each (more threads than cores spin-wait); on GPUs their own."""
    import importlib
    from types import SimpleNamespace

    pool, runner = importlib.import_module("rgb.runs.pool"), importlib.import_module("rgb.runs.runner")
    chosen, events = [], []

    def refuse(*args):
        raise AttackRunError("opened")

    monkeypatch.setattr(pool, "configure_threads", chosen.append)
    monkeypatch.setattr(runner.Target, "open", refuse)
    pool._worker(0, 2, SimpleNamespace(threads=4, device=device), None, SimpleNamespace(put=events.append),
                 runner._attack_tasks)
    assert chosen == [expected]
    assert events == [("error", (0, "AttackRunError: opened", None))]  # a user error: one line, no traceback


def test_a_worker_reports_any_user_error_as_one_line(monkeypatch):
    """An option the model refuses (AttackOptionsError, a UserError of rgb.attacks) is one line from a worker too,
    as every UserError is; anything else keeps its traceback."""
    import importlib
    from types import SimpleNamespace

    from rgb.attacks.options import AttackOptionsError

    pool = importlib.import_module("rgb.runs.pool")
    monkeypatch.setattr(pool, "configure_threads", lambda threads: None)
    for raised, traced in ((AttackOptionsError("capture='trace' refused"), False), (KeyError("bug"), True)):
        events = []

        def job(*args, raised=raised):
            raise raised

        pool._worker(0, 1, SimpleNamespace(threads=1, device="cpu"), None, SimpleNamespace(put=events.append), job)
        (kind, (rank, line, trace)), = events
        assert (kind, rank, "\n" in line, trace is not None) == ("error", 0, False, traced), events


@pytest.mark.parametrize("holder", ["saves the batch", "dies"])
def test_a_batch_another_process_holds_is_waited_for_never_attacked_twice(
    surrogate, small_bench, reference, tmp_path, holder
):
    """Issue 19 item 24: two attack.py processes on one run both did all the work. A batch another process holds
    (its flock) is skipped, then waited for: taken from the holder's file, or attacked here once the holder died
    without one. The merged result equals the single-process run."""
    out = tmp_path / "claimed"
    locks = out / "linf" / "locks"
    locks.mkdir(parents=True)
    held = flock(locks / f"batch-{BATCH:06d}.lock")  # "the other process" is attacking batch 1
    summaries = {}
    worker = threading.Thread(target=lambda: summaries.update(attack(overrides(surrogate, small_bench, out))))
    worker.start()
    deadline = time.monotonic() + 600
    while len(batch_files(out)) < N_BATCHES - 1 and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.name for p in batch_files(out)] == [f"batch-{s:06d}.pt" for s in range(0, N_IMAGES, BATCH) if s != BATCH]
    time.sleep(0.5)
    assert worker.is_alive() and len(batch_files(out)) == N_BATCHES - 1  # waiting for batch 1, not attacking it
    theirs = out / "linf" / "shard-0-of-1" / f"batch-{BATCH:06d}.pt"
    if holder == "saves the batch":
        theirs.write_bytes((reference[0] / "linf" / "shard-0-of-1" / theirs.name).read_bytes())
        written = theirs.stat().st_mtime_ns
    held.close()
    worker.join(600)
    assert not worker.is_alive() and summaries["linf"]["n"] == N_IMAGES
    if holder == "saves the batch":
        assert theirs.stat().st_mtime_ns == written  # taken as the holder wrote it
    pd.testing.assert_frame_equal(results(out), results(reference[0]))


@pytest.mark.slow
def test_two_attack_processes_on_one_run_share_its_batches(surrogate, small_bench, reference, tmp_path):
    out = tmp_path / "two"
    command = [sys.executable, str(REPO / "attack.py"), *overrides(surrogate, small_bench, out)]
    both = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for process in both:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-2000:]
    assert len(batch_files(out)) == N_BATCHES
    pd.testing.assert_frame_equal(results(out), results(reference[0]))


def test_default_devices_on_the_cpu_are_one_worker_per_usable_core():
    from rgb.runs.request import process_count

    assert process_count("auto", "cpu", threads=3) == 3 and process_count("auto", "cpu", threads=1) == 1
    assert process_count(2, "cpu", threads=8) == 2
    assert compose_config("attack", "run=x").shard.devices == "auto"


def test_batch_size_auto_is_resolved_once_recorded_and_kept_by_later_shards(surrogate, small_bench, tmp_path,
                                                                          monkeypatch):
    from rgb.runs import batch_probe

    out = tmp_path / "auto"
    auto = [item for item in overrides(surrogate, small_bench, out) if not item.startswith("batch_size=")]
    monkeypatch.setattr(batch_probe, "CPU_BATCH", 12)
    assert attack([*auto, "batch_size=auto", "shard.index=0", "shard.count=2"]) == {}
    record = {"batch_size": 12, "source": "cpu default", "device": "cpu"}
    assert json.loads((out / "linf" / "run.json").read_text())["batch_size"] == 12
    assert json.loads((out / "linf" / "batch_size.json").read_text()) == record
    monkeypatch.setattr(batch_probe, "CPU_BATCH", 8)  # another machine's answer: the run's recorded number wins
    summary = attack([*auto, "batch_size=auto", "shard.index=1", "shard.count=2"])["linf"]
    assert summary["batch_size"] == 12 and summary["batch_size_auto"] == record and summary["n"] == N_IMAGES
    assert len(batch_files(out)) == N_IMAGES // 12
    assert "batch_size_auto" not in attack(overrides(surrogate, small_bench, tmp_path / "fixed"))["linf"]


def time_and_log_formats(monkeypatch, log: Path, faster) -> None:
    """input_format=auto times at the test's 6-row batches, `faster(pid)` ("contiguous" or "channels_last") wins
    each timing, and every choice of the attacks' model format is logged as "pid asked chosen"."""
    from rgb.attacks import model_calls

    monkeypatch.setattr(model_calls, "_TIMED_FROM_ROWS", 1)
    monkeypatch.setattr(model_calls, "_step_seconds", lambda model, rows: 0.1 if faster(os.getpid()) == (
        "channels_last" if isinstance(model, model_calls.ChannelsLastInputs) else "contiguous") else 1.0)
    formatted = model_calls._formatted

    def logged(model, rows, logits, input_format, device, probes):
        chosen = formatted(model, rows, logits, input_format, device, probes)
        with log.open("a") as lines:
            lines.write(f"{os.getpid()} {input_format} {chosen[1]}\n")
        return chosen

    monkeypatch.setattr(model_calls, "_formatted", logged)


def logged_formats(log: Path) -> list[tuple[int, str, str]]:
    return [(int(pid), asked, chosen) for pid, asked, chosen in map(str.split, log.read_text().splitlines())]


def test_input_format_auto_is_decided_once_recorded_and_kept_by_later_shards(surrogate, small_bench, tmp_path,
                                                                            monkeypatch):
    """The first start decides on its first batch (here timing says NCHW) and records why; a later shard whose
    timing says NHWC attacks in the recorded format, and the summary holds the record; a format given is used
    as asked and records nothing."""
    out, log = tmp_path / "auto", tmp_path / "formats.log"
    time_and_log_formats(monkeypatch, log, lambda pid: "contiguous")
    assert attack(overrides(surrogate, small_bench, out, "shard.index=0", "shard.count=2")) == {}
    record = json.loads((out / "linf" / "input_format.json").read_text())
    assert record["input_format"] == "contiguous" and record["rows"] == BATCH and record["device"] == "cpu"
    assert record["reason"].startswith(f"auto: per forward + input gradient of {BATCH} rows channels_last 1e+03 ms "
                                       f"vs contiguous 100 ms")
    assert logged_formats(log)[0][1:] == ("auto", "contiguous")  # the decision, then the batches as recorded
    assert {line[1:] for line in logged_formats(log)[1:]} == {("contiguous", "contiguous")}
    log.unlink()
    time_and_log_formats(monkeypatch, log, lambda pid: "channels_last")  # a resume whose timing says otherwise
    summary = attack(overrides(surrogate, small_bench, out, "shard.index=1", "shard.count=2"))["linf"]
    assert {line[1:] for line in logged_formats(log)} == {("contiguous", "contiguous")}
    assert summary["input_format"] == "auto" and summary["input_format_auto"] == record
    assert json.loads((out / "linf" / "summary.json").read_text())["input_format_auto"] == record
    log.unlink()
    given = attack(overrides(surrogate, small_bench, tmp_path / "given", "input_format=channels_last"))["linf"]
    assert "input_format_auto" not in given and not (tmp_path / "given" / "linf" / "input_format.json").exists()
    assert {line[1:] for line in logged_formats(log)} == {("channels_last", "channels_last")}


def test_input_format_auto_refuses_norms_that_recorded_different_formats(surrogate, small_bench, tmp_path):
    """The run attacks all its norms in one format: norms whose records disagree are one line before any batch,
    and no record is written or changed."""
    out = tmp_path / "mixed"
    recorded = {"linf": "contiguous", "l2": "channels_last"}
    for norm, layout in recorded.items():
        (out / norm).mkdir(parents=True)
        (out / norm / "input_format.json").write_text(json.dumps({"input_format": layout, "reason": "given"}))
    with pytest.raises(AttackRunError, match=re.escape(
            f"input_format=auto: the norms of {out} were started with formats ['channels_last', 'contiguous']; "
            f"pass input_format=contiguous or channels_last")):
        attack(overrides(surrogate, small_bench, out, "norms=[linf,l2]", "data.budgets.l2=1.0"))
    assert {norm: json.loads((out / norm / "input_format.json").read_text())["input_format"]
            for norm in recorded} == recorded
    assert not list(out.glob("*/shard-*"))


@pytest.mark.slow
def test_worker_processes_attack_in_the_format_the_parent_recorded(surrogate, small_bench, tmp_path, monkeypatch):
    """Timing says NCHW in attack.py's process and NHWC in any other: the forked worker still attacks in the
    format the parent decided and recorded before it started."""
    out, log, parent = tmp_path / "workers", tmp_path / "formats.log", os.getpid()
    time_and_log_formats(monkeypatch, log, lambda pid: "contiguous" if pid == parent else "channels_last")
    summary = attack(overrides(surrogate, small_bench, out, "shard.devices=2"), threads=2)["linf"]
    lines = logged_formats(log)
    assert lines[0] == (parent, "auto", "contiguous")
    assert {line[1:] for line in lines[1:]} == {("contiguous", "contiguous")} and len(lines) == 1 + N_BATCHES
    assert summary["input_format_auto"]["input_format"] == "contiguous"


# ---------------------------------------------------------------- honest progress (issue 53 item 4)


class FakeRun:
    """A budget's run directory as Bars reads it: `n` images in batches of 10, the batches at `done` saved."""

    def __init__(self, n=40, done=()):
        self.identity, self.done = {"n_images": n}, {start: f"batch-{start}" for start in done}

    def shard_starts(self, index, count):
        return list(range(0, self.identity["n_images"], 10))

    def batch_files(self):
        return self.done

    def load(self, path, start):
        return {"robust": torch.ones(10, dtype=torch.bool)}


def test_each_budgets_bar_counts_its_own_time_from_its_own_start():
    """The budgets run one after the other: the L1 bar's elapsed time, rate and ETA count from L1's first stage,
    not from when the bars were made (`L1 42/200 [10:01<37:42]` counted the time spent on Linf and L2); images a
    resumed run already holds are shown but are no part of the rate."""
    from types import SimpleNamespace

    from rgb.runs.runner import Bars

    budgets = [SimpleNamespace(name=name, threat=SimpleNamespace(eps=0.1)) for name in ("linf", "l2", "l1")]
    request = SimpleNamespace(budgets=budgets, batch_size=10, progress=True)
    now = [1000.0]
    bars = Bars(request, [FakeRun(), FakeRun(), FakeRun(done=(0,))], 0, 1)
    try:
        for bar in bars.bars:
            bar._time = lambda: now[0]
        bars.stage(0, 0, "apgd-ce step 1/100")
        now[0] += 600  # Linf: ten minutes
        bars.left(0, 40)
        now[0] += 300  # L2: five more
        bars.left(1, 40)
        now[0] += 60  # then L1 starts; a minute later 20 of its 30 images still to attack have left
        bars.stage(2, 0, "apgd-ce")
        now[0] += 60
        bars.left(2, 20)
        shown = bars.bars[2].format_dict
        assert shown["elapsed"] == 60 and shown["n"] == 30 and shown["initial"] == 10
        assert bars.bars[2].format_meter(**{**shown, "rate": None}).count("01:00") == 1  # [01:00<00:30]
        assert "00:30" in bars.bars[2].format_meter(**{**shown, "rate": None})
        assert bars.bars[0].format_dict["elapsed"] == 1020  # Linf's clock started with Linf
    finally:
        bars.close()
