"""schedule=pooled (rgb.runs.pooled) through attack.py: each attack runs over the survivors of all batches re-cut into
full chunks; a run resumes per unit without redoing one, workers share the units, and what it writes are the batch
schedule's files.

The cascade here (APGD-CE and APGD-T at one step, Square, at 4/255) leaves the later stages something to fool and
runs in seconds on the conftest's small ViT."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from helpers import REPO, compose_config, head_of_test_split
from rgb.attacks import AttackOptions, AutoAttack
from rgb.commands.attack import attack_from_config, attack_request, data_factory
from rgb.data import BenchmarkData
from rgb.data.mini import DATASET
from rgb.models import load_with_meta
from rgb.runs import runner
from rgb.runs.pooled import PooledShard
from rgb.runs.records import load_images
from rgb.runs.request import white_box_budgets
from rgb.runs.store import MANIFEST, AttackRunError

N_IMAGES, BATCH = 24, 6
CASCADE = ["attacks=[apgd-ce,apgd-t,square]", "steps=1", "queries=500", f"data.budgets.linf={4 / 255}"]


@pytest.fixture(scope="module")
def small_bench(mini_dir, tmp_path_factory):
    return head_of_test_split(mini_dir, tmp_path_factory.getbasetemp() / f"head{N_IMAGES}", N_IMAGES)


def attack(run: Path, bench: Path, out: Path, *extra: str, threads: int = 1) -> dict:
    config = compose_config("attack", f"run={run}", f"paths.mini_dir={bench}", f"output_dir={out}", "norms=[linf]",
                            f"batch_size={BATCH}", "progress=false", "shard.devices=1", *CASCADE, *extra)
    return {name: summary.to_json() for name, summary in attack_from_config(config, threads=threads).items()}


def results(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "linf" / "results.parquet")


@pytest.fixture(scope="module")
def pooled(surrogate, small_bench, tmp_path_factory):
    """One uninterrupted pooled run in one process: what resumed and multi-worker pooled runs must reproduce."""
    out = tmp_path_factory.mktemp("pooled")
    return out, attack(surrogate, small_bench, out, "schedule=pooled")["linf"]


def test_with_one_batch_the_pooled_schedule_is_the_batch_schedule_and_records_itself(surrogate, small_bench, tmp_path):
    """One batch holds every image: the same chunks, the same draws, the same results and exported adversarial
    images bit for bit; only the identity and summary say which schedule ran (the batch schedule's keep their
    earlier bytes)."""
    runs = {}
    for schedule in ("batch", "pooled"):
        out = tmp_path / schedule
        runs[schedule] = out, attack(surrogate, small_bench, out, f"schedule={schedule}", f"batch_size={N_IMAGES}",
                                     "export_adversarial=true")
    pd.testing.assert_frame_equal(results(runs["pooled"][0]), results(runs["batch"][0]))
    exported = {s: pq.read_table(next(runs[s][0].glob("adversarial/**/*.parquet"))).to_pandas() for s in runs}
    pd.testing.assert_frame_equal(exported["pooled"], exported["batch"])  # the adversarial images themselves
    batch, pooled = runs["batch"][1]["linf"], runs["pooled"][1]["linf"]
    assert pooled["schedule"] == "pooled" and "schedule" not in batch and pooled["standard"] == batch["standard"]
    assert pooled["accuracy_after"] == batch["accuracy_after"] and pooled["results_sha256"] == batch["results_sha256"]
    assert json.loads((runs["pooled"][0] / "linf" / MANIFEST).read_text())["schedule"] == "pooled"
    assert "schedule" not in json.loads((runs["batch"][0] / "linf" / MANIFEST).read_text())


def test_each_stage_attacks_its_survivors_in_full_chunks_and_the_batch_files_stay(surrogate, small_bench, pooled,
                                                                                    monkeypatch, tmp_path):
    chunks = []
    original = PooledShard.chunk

    def chunk(self, stage, unit):
        survivors = [int(i) for part in self.chunks(stage) for i in part]
        chunks.append((stage, [int(i) for i in self.chunks(stage)[unit]], survivors))
        return original(self, stage, unit)

    monkeypatch.setattr(PooledShard, "chunk", chunk)
    out = tmp_path / "pooled"
    summary = attack(surrogate, small_bench, out, "schedule=pooled")["linf"]
    table = results(out)
    for stage, ids, survivors in chunks:
        alive = table["clean_correct"] & ((table["fooled_by"] == -1) | (table["fooled_by"] >= stage))
        assert survivors == table["image_id"][alive].tolist()  # every survivor of the stages before, in image order
        position = survivors.index(ids[0])
        assert position % BATCH == 0 and ids == survivors[position : position + BATCH]  # full but for the last
    assert {stage for stage, *_ in chunks} == {1, 2, 3}
    assert len([c for c in chunks if c[0] == 1]) == -(-int(table["clean_correct"].sum()) // BATCH)
    assert sorted(p.name for p in (out / "linf").glob("shard-0-of-1/*")) == [f"batch-{s:06d}.pt"
                                                                             for s in range(0, N_IMAGES, BATCH)]
    assert not list((out / "linf").glob("pooled-*"))  # the units go once their batches are merged
    pd.testing.assert_frame_equal(table, results(pooled[0]))
    assert summary["n_robust"] == pooled[1]["n_robust"] and 0 < summary["n_robust"] < summary["n_clean_correct"]


def test_an_interrupted_pooled_run_resumes_without_redoing_a_unit(surrogate, small_bench, pooled, monkeypatch,
                                                                  tmp_path):
    """A failure in the second chunk of stage 1: the clean passes and the first chunk are saved and never redone, no
    batch file is written before the last stage, and the resumed run equals the uninterrupted one."""
    done = []
    original_chunk, original_clean = PooledShard.chunk, PooledShard.clean_pass

    def failing_chunk(self, stage, unit):
        if done:
            raise RuntimeError("killed")
        done.append((stage, unit))
        return original_chunk(self, stage, unit)

    monkeypatch.setattr(PooledShard, "chunk", failing_chunk)
    out = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="killed"):
        attack(surrogate, small_bench, out, "schedule=pooled")
    saved = sorted(str(p.relative_to(out / "linf")) for p in (out / "linf").glob("pooled-0-of-1/stage-*/*.pt"))
    assert saved == [f"pooled-0-of-1/stage-0/batch-{s:06d}.pt" for s in range(0, N_IMAGES, BATCH)] + [
        "pooled-0-of-1/stage-1/chunk-000000.pt"]
    assert not list((out / "linf").glob("shard-*/batch-*.pt"))
    with pytest.raises(AttackRunError, match="was made for another run: .*schedule"):  # its units are kept from a
        attack(surrogate, small_bench, out)                                              # run of the batch schedule

    redone = []
    monkeypatch.setattr(PooledShard, "chunk", lambda self, *unit: redone.append(unit) or original_chunk(self, *unit))
    monkeypatch.setattr(PooledShard, "clean_pass", lambda self, *unit: redone.append(unit) or original_clean(self, *unit))
    attack(surrogate, small_bench, out, "schedule=pooled")
    assert (1, 0) not in redone and not [unit for unit in redone if len(unit) == 1]
    pd.testing.assert_frame_equal(results(out), results(pooled[0]))


def test_two_pooled_workers_share_the_units_and_equal_one_process(surrogate, small_bench, pooled, tmp_path):
    out = tmp_path / "workers"
    attack(surrogate, small_bench, out, "schedule=pooled", "shard.devices=2", threads=2)
    pd.testing.assert_frame_equal(results(out), results(pooled[0]))


def test_two_pooled_shards_merge_and_each_pools_its_own_batches(surrogate, small_bench, tmp_path):
    out = tmp_path / "shards"
    for index in (0, 1):
        attack(surrogate, small_bench, out, "schedule=pooled", f"shard.index={index}", "shard.count=2")
    table = results(out)
    assert table["image_id"].tolist() == list(range(N_IMAGES)) and not list((out / "linf").glob("pooled-*"))


def test_a_pooled_shard_is_one_autoattack_run_over_its_images(surrogate, small_bench, pooled):
    """What `AutoAttack.run` does on a tensor (each attack over all survivors, cut at batch_size) is what the pooled
    runner does over a shard's batches: the same outcome image by image, so the agreement benchmarks of AutoAttack
    against the reference (benchmarks/reference_agreement.py, which attacks a tensor) speak for this schedule."""
    model, _ = load_with_meta(surrogate)
    x, y, _ = load_images(BenchmarkData.for_dataset(DATASET, str(small_bench)).split("test"), range(N_IMAGES))
    options = AttackOptions(attacks=("apgd-ce", "apgd-t", "square"), steps=1, queries=500)
    result = AutoAttack(model, "linf", 4 / 255, options).run(x, y, batch_size=BATCH)
    table = results(pooled[0])
    assert table["fooled_by"].tolist() == result.fooled_by.tolist()
    assert table["adv_pred"].tolist() == result.y_adv.tolist()
    assert table["perturbation_norm"].tolist() == result.perturbation_norm.tolist()


@pytest.mark.slow
def test_sigkill_of_a_pooled_run_then_rerun_equals_an_uninterrupted_run(surrogate, small_bench, tmp_path):
    """attack.py killed (-9, workers and all) once Square's first chunk is saved, while the rest of that stage runs;
    the same command then finishes from the saved units to the uninterrupted run's results."""
    slow_square = ["queries=5000", "schedule=pooled"]  # Square's chunks take seconds: a window to kill in
    uninterrupted = tmp_path / "uninterrupted"
    attack(surrogate, small_bench, uninterrupted, *slow_square)
    out = tmp_path / "killed"
    command = [sys.executable, str(REPO / "attack.py"), f"run={surrogate}", f"paths.mini_dir={small_bench}",
               f"output_dir={out}", "norms=[linf]", f"batch_size={BATCH}", "progress=false", *CASCADE, *slow_square]
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not list(out.glob("linf/pooled-0-of-1/stage-3/chunk-*.pt")) and first.poll() is None:
        if time.monotonic() > deadline:
            first.kill()
            pytest.fail("no chunk of the last stage was saved in 300 s")
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert list(out.glob("linf/pooled-0-of-1/stage-0/batch-*.pt")), "the run was not interrupted mid-way"
    assert not list(out.glob("linf/shard-*/batch-*.pt")) and not (out / "linf" / "results.parquet").exists()
    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    pd.testing.assert_frame_equal(results(out), results(uninterrupted))


def test_a_stage_that_leaves_no_survivors_ends_the_cascade_as_the_batch_schedule_does(surrogate, small_bench,
                                                                                     tmp_path):
    """At a budget the first attack fools every image (as the demo CNN at Linf and L2), the later stages have no
    chunk to attack: the run finishes, not with an IndexError; with one batch (the same chunks) its results are the
    batch schedule's, with several every image is fooled all the same."""
    wide = "data.budgets.linf=0.5"
    tables = {}
    for schedule in ("batch", "pooled"):
        out = tmp_path / schedule
        summary = attack(surrogate, small_bench, out, f"schedule={schedule}", f"batch_size={N_IMAGES}", wide)["linf"]
        assert summary["n_robust"] == 0 < summary["n_clean_correct"]
        tables[schedule] = results(out)
    pd.testing.assert_frame_equal(tables["pooled"], tables["batch"])
    assert set(tables["pooled"]["fooled_by"]) <= {0, 1}  # clean-wrong or fooled by the first attack: none left after
    several = attack(surrogate, small_bench, tmp_path / "several", "schedule=pooled", wide)["linf"]
    assert several["n_robust"] == 0 and several["n_clean_correct"] == summary["n_clean_correct"]


# -- schedule=pooled_by_need (issue 54.3) -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def batch_run(surrogate, small_bench, tmp_path_factory):
    """The batch schedule's results and exported adversarial images: what pooled_by_need keeps bit for bit."""
    out = tmp_path_factory.mktemp("batch")
    summary = attack(surrogate, small_bench, out, "export_adversarial=true")["linf"]
    return results(out), exported_images(out), summary


def exported_images(out: Path) -> pd.DataFrame:
    return pq.read_table(next(out.glob("adversarial/**/*.parquet"))).to_pandas()


def saturating_at(monkeypatch, rows: int) -> None:
    """The run's measurement of the rows per call at which the model saturates, fixed at `rows` (it is a timing)."""
    monkeypatch.setattr("rgb.runs.runner.saturation_rows",
                        lambda model, x, largest: {"rows": rows, "seconds_per_row": {}, "within": 1.15})


@pytest.mark.parametrize("faster", ["channels_last", "contiguous"])
def test_pooled_by_need_measures_where_the_model_saturates_in_the_format_the_run_attacks_in(
        surrogate, small_bench, monkeypatch, tmp_path, faster):
    """input_format=auto is decided first (here timing says `faster`), then the saturation probe times the model on
    the first batch in that memory format, as the attacks call it, and its record names the format."""
    from rgb.attacks import model_calls

    monkeypatch.setattr(model_calls, "_TIMED_FROM_ROWS", 1)
    monkeypatch.setattr(model_calls, "_step_seconds", lambda model, rows: 0.1 if faster == (
        "channels_last" if isinstance(model, model_calls.ChannelsLastInputs) else "contiguous") else 1.0)
    probed = []

    def probe(model, x, largest):
        probed.append("channels_last" if x.is_contiguous(memory_format=torch.channels_last)
                      and not x.is_contiguous() else "contiguous")
        return {"rows": 1, "seconds_per_row": {}, "within": 1.15}

    monkeypatch.setattr("rgb.runs.runner.saturation_rows", probe)
    summary = attack(surrogate, small_bench, tmp_path / "run", "schedule=pooled_by_need", "attacks=[apgd-ce]")["linf"]
    assert summary["input_format_auto"]["input_format"] == faster == summary["saturation"]["input_format"]
    assert probed == [faster]
    # resolve_saturation on its own, with input_format still auto, decides the format before it probes
    config = compose_config("attack", f"run={surrogate}", f"paths.mini_dir={small_bench}", f"batch_size={BATCH}",
                            f"output_dir={tmp_path / 'alone'}", "norms=[linf]", "schedule=pooled_by_need")
    data = data_factory(config.data)
    request = attack_request(config, data, white_box_budgets(["linf"], data().budgets, {}), surrogate="s")
    assert request.options.input_format == "auto"
    runner.resolve_saturation(request, runner.Target.open(request, "cpu"))
    assert probed == [faster, faster]
    assert json.loads((tmp_path / "alone" / "linf" / "saturation.json").read_text())["input_format"] == faster
    assert json.loads((tmp_path / "alone" / "linf" / "input_format.json").read_text())["input_format"] == faster


def survivors_per_batch(table: pd.DataFrame, stage: int) -> list[int]:
    alive = table["clean_correct"] & ((table["fooled_by"] == -1) | (table["fooled_by"] >= stage))
    return [int(alive[start : start + BATCH].sum()) for start in range(0, N_IMAGES, BATCH)]


@pytest.mark.slow  # ~60 s: two whole runs
def test_pooled_by_need_with_no_batch_below_its_rows_is_the_batch_schedule_bit_for_bit(surrogate, small_bench,
                                                                                       batch_run, monkeypatch,
                                                                                       tmp_path):
    """Saturated at one row, no batch is pooled: every result and exported adversarial image is the batch
    schedule's; the measurement is recorded once and a rerun keeps it (a timing never splits a run)."""
    saturating_at(monkeypatch, 1)
    out = tmp_path / "need"
    summary = attack(surrogate, small_bench, out, "schedule=pooled_by_need", "export_adversarial=true")["linf"]
    pd.testing.assert_frame_equal(results(out), batch_run[0])
    pd.testing.assert_frame_equal(exported_images(out), batch_run[1])
    assert summary["schedule"] == "pooled_by_need" and "saturation" not in batch_run[2]
    assert json.loads((out / "linf" / "saturation.json").read_text()) == summary["saturation"]
    assert summary["saturation"]["rows"] == 1 and summary["saturation"]["device"] == "cpu"

    def measured_again(*args):
        raise AssertionError("the recorded measurement was not reused")

    monkeypatch.setattr("rgb.runs.runner.saturation_rows", measured_again)
    assert attack(surrogate, small_bench, out, "schedule=pooled_by_need", "export_adversarial=true")["linf"] == summary


def test_pooled_by_need_pools_only_batches_below_its_rows_and_keeps_the_others_bit_for_bit(
        surrogate, small_bench, batch_run, monkeypatch, tmp_path):
    """Saturated at the most survivors any batch keeps entering the last attack: that batch is attacked alone at
    every stage, as the batch schedule attacks it; a batch is pooled at a stage it enters with fewer survivors. Every
    image of a batch never pooled has the batch schedule's result and adversarial image bit for bit; a shared chunk
    draws other random starts (per chunk, from the seed), so its images' results are another draw of the same
    attacks."""
    rows = max(survivors_per_batch(batch_run[0], 3))
    assert rows > 0, "no batch keeps a robust image: nothing is attacked alone to the end"
    saturating_at(monkeypatch, rows)
    chunks = []
    original = PooledShard.chunk
    monkeypatch.setattr(PooledShard, "chunk",
                        lambda self, stage, unit: chunks.append((stage, self.chunks(stage)[unit].tolist()))
                        or original(self, stage, unit))
    out = tmp_path / "need"
    attack(surrogate, small_bench, out, "schedule=pooled_by_need", "export_adversarial=true")
    table, images = results(out), exported_images(out)
    pooled = set()
    for stage, ids in chunks:
        entering = survivors_per_batch(table, stage)
        batches = {i // BATCH for i in ids}
        if len(batches) > 1 or entering[ids[0] // BATCH] < rows:  # pooled: only batches below the rows
            assert all(entering[b] < rows for b in batches) and len(ids) <= BATCH
            pooled |= batches
        else:  # alone: the batch's every survivor, as the batch schedule attacks it
            alive = table["clean_correct"] & ((table["fooled_by"] == -1) | (table["fooled_by"] >= stage))
            assert ids == [i for i in table["image_id"][alive] if i // BATCH in batches]
    kept = [i for i in range(N_IMAGES) if i // BATCH not in pooled]
    assert any(i in ids for _, ids in chunks for i in kept)  # some image attacked alone to the end
    pd.testing.assert_frame_equal(table.iloc[kept], batch_run[0].iloc[kept])
    pd.testing.assert_frame_equal(images.iloc[kept], batch_run[1].iloc[kept])
    assert table["clean_correct"].tolist() == batch_run[0]["clean_correct"].tolist()
