"""The cost model: each attack's declared worst case equals the rows it spends on images it never fools, and
attack.py dry_run=true estimates a run from it without attacking anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO, compose_config
from rgb.attacks import AutoAttack
from rgb.attacks.options import AttackOptions
from rgb.commands.attack import attack_from_config
from rgb.data import BenchmarkData
from rgb.data.mini import DATASET
from rgb.models import load_with_meta
from rgb.runs.records import load_images
from rgb.runs.cost import ROBUST_SHARES, Throughput, budget_cost
from rgb.runs.store import COST_ESTIMATE_FILE

N_CLASSES = 10


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, N_CLASSES)

    def forward(self, x):
        return self.layer(x.flatten(1))


@pytest.mark.parametrize("norm", ["Linf", "L2", "L1"])
@pytest.mark.parametrize("version", ["standard", "plus", "fast", "rand"])
def test_worst_case_rows_are_what_a_never_fooled_image_costs(norm, version):
    """At an eps far too small to fool anything every image costs the worst case: the model's count must be exact
    (few steps and queries, so that the cascade runs in a second)."""
    torch.manual_seed(0)
    model = Linear().eval()
    x = torch.rand(4, 3, 8, 8)
    with torch.no_grad():
        y = model(x).argmax(1)
    attack = AutoAttack(model, norm, 1e-6, AttackOptions(version=version, steps=6, queries=30, capture="eager"),
                        device="cpu", batch_size=4)
    result = attack.run(x, y)
    assert bool(result.robust.all())
    assert set(result.forward_rows.tolist()) == {attack.worst_case_rows(N_CLASSES)[0]}
    assert set(result.backward_rows.tolist()) == {attack.worst_case_rows(N_CLASSES)[1]}


def test_the_protocol_worst_case_matches_the_documented_one():
    """docs/performance.md: a robust image costs ~7.8k forward and 1,910 backward rows at Linf/L2 (standard)."""
    attack = AutoAttack(Linear(), "Linf", 4 / 255)
    assert attack.worst_case_rows(N_CLASSES) == (7825, 1910)


def test_budget_cost_scales_with_the_robust_share():
    speed = Throughput(batch_size=8, forward_s=0.01, backward_s=0.02)
    cost = budget_cost(100, 1.0, (1000, 500), (13, 11), speed, workers=2, name="linf")
    assert cost.rows["0"] == (1300, 1100) and cost.rows["1"] == (100_000, 50_000)
    assert cost.seconds["1"] == pytest.approx((100_000 * 0.01 + 50_000 * 0.02) / 2)
    assert list(cost.seconds) == [f"{s:g}" for s in ROBUST_SHARES]
    assert all(a < b for a, b in zip(list(cost.seconds.values()), list(cost.seconds.values())[1:]))


def test_only_the_correctly_classified_images_are_attacked():
    """A misclassified image costs its clean forward alone: at 45% clean accuracy, 0% robust, the run is about
    1/0.45 = 2.2x cheaper than with every image attacked (what the dry run predicted before)."""
    speed = Throughput(batch_size=8, forward_s=0.01, backward_s=0.02)
    everyone = budget_cost(100, 1.0, (1000, 500), (13, 11), speed, workers=1, name="linf")
    cost = budget_cost(100, 0.45, (1000, 500), (13, 11), speed, workers=1, name="linf")
    assert cost.rows["0"] == pytest.approx((45 * 13 + 55 * 1, 45 * 11))
    assert cost.rows["1"] == pytest.approx((45 * 1000 + 55 * 1, 45 * 500))
    assert everyone.seconds["0"] / cost.seconds["0"] == pytest.approx(2.2, abs=0.1)


def test_dry_run_estimates_without_attacking(surrogate, mini_dir, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO):
        summaries = attack_from_config(compose_config(
            "attack", f"run={surrogate}", f"paths.mini_dir={mini_dir}", f"output_dir={tmp_path}", "dry_run=true",
            "norms=[linf,l1]", "progress=false"))
    assert summaries == {}
    assert not (tmp_path / "linf").exists() and not (tmp_path / "l1").exists()  # nothing claimed
    record = json.loads((tmp_path / COST_ESTIMATE_FILE).read_text())
    assert [b["budget"] for b in record["budgets"]] == ["linf", "l1"] and record["n_classes"] == N_CLASSES
    assert record["budgets"][0]["robust_rows"] == [7825, 1910]
    assert record["throughput"]["forward_s"] > 0 and record["throughput"]["backward_s"] >= 0
    assert "| linf | 200 |" in caplog.text and "100% of correct robust" in caplog.text
    model, _ = load_with_meta(surrogate)
    x, y, _ = load_images(BenchmarkData.for_dataset(DATASET, str(mini_dir)).split("test"), range(200))
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    assert record["clean_accuracy"] == pytest.approx(accuracy) and record["clean_sample"] == 200
    assert f"clean accuracy {accuracy:.1%} on 200 images" in caplog.text
    linf = record["budgets"][0]
    assert linf["rows"]["0"][1] == pytest.approx(200 * accuracy * (record["fooled_steps"] + 1))


@pytest.fixture(scope="module")
def measured_on_cpu(tmp_path_factory):
    """A gpu_attack.py report of this machine (its throughput part at --cpu sizes), written by the script itself."""
    out = tmp_path_factory.mktemp("measured") / "gpu_attack_cpu.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_attack.py", "--cpu", "--parts", "throughput_test_resnet",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.slow
def test_dry_run_forecasts_from_measured_utilisation_else_states_the_bound(surrogate, mini_dir, tmp_path, caplog,
                                                                           measured_on_cpu, monkeypatch):
    import logging

    from rgb.runs import cost
    from rgb.runs.forecast import measured_utilisation

    utilisation = measured_utilisation("cpu", 50, path=measured_on_cpu)
    assert utilisation["batch"] == 2 and utilisation["models"] == ["test_resnet"] and utilisation["flop_per_s"] > 0
    assert measured_utilisation("NVIDIA H200", 50, path=measured_on_cpu) is None  # another device: no forecast
    wrapped = tmp_path / "gpu_check.json"  # gpu_check.sh's JSON holds gpu_attack.py's report as its part
    wrapped.write_text(json.dumps({"gpu_attack": {"result": json.loads(measured_on_cpu.read_text())}}))
    assert measured_utilisation("cpu", 50, path=wrapped) == utilisation
    config = ["attack", f"run={surrogate}", f"paths.mini_dir={mini_dir}", "dry_run=true", "norms=[linf]",
              "progress=false"]
    records = {}
    for kind, measured in [("forecast", measured_on_cpu), ("bound", tmp_path / "absent.json")]:
        monkeypatch.setattr(cost, "MEASURED_UTILISATION", measured)
        with caplog.at_level(logging.INFO):
            attack_from_config(compose_config(*config, f"output_dir={tmp_path / kind}"))
        records[kind] = json.loads((tmp_path / kind / COST_ESTIMATE_FILE).read_text())
        assert records[kind]["time_basis"]["kind"] == kind
        assert f"time: {records[kind]['time_basis']['label']}" in caplog.text
    assert records["forecast"]["time_basis"]["label"].startswith("forecast from measured utilisation (cpu, 20")
    assert records["bound"]["time_basis"]["label"].startswith("bound: the model's plain passes")
    model, _ = load_with_meta(surrogate)
    x, _, _ = load_images(BenchmarkData.for_dataset(DATASET, str(mini_dir)).split("test"), range(1))
    forward, backward = cost.evaluation_flops(model, x)
    assert records["forecast"]["throughput"]["forward_s"] == pytest.approx(forward / utilisation["flop_per_s"])
    assert records["forecast"]["throughput"]["backward_s"] == pytest.approx(backward / utilisation["flop_per_s"])


@pytest.mark.slow
def test_benchmark_cost_forecasts_from_the_measured_device_and_labels_the_bound_elsewhere(measured_on_cpu, tmp_path):
    for device, basis in [("cpu", "forecast from measured utilisation (cpu, 20"), ("NVIDIA H200", "bound")]:
        out = tmp_path / f"{device}.json"
        done = subprocess.run([sys.executable, "benchmarks/benchmark_cost.py", "--out", str(out), "--measured",
                               str(measured_on_cpu), "--device", device], cwd=REPO, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
        rows = json.loads(out.read_text())["rows"]
        assert all(row["time_basis"].startswith(basis) for row in rows) and basis[:8] in done.stdout
        forecast = [row["hours_forecast"] for row in rows]
        assert all(h > 0 for h in forecast) if device == "cpu" else forecast == [None] * len(rows)


def test_dry_run_on_the_cpu_measures_as_its_single_thread_workers_run(surrogate, mini_dir, tmp_path, monkeypatch):
    """attack.py on the CPU runs one single-threaded worker per thread (rgb.runs.pool.worker_threads): the dry run
    measures the model with a worker's threads and divides by the workers, never with all the threads at once
    (which made its time 4.6x the measured run's)."""
    from rgb.runs import cost

    seen = []

    def measured(model, x, device, repeats=3):
        seen.append(torch.get_num_threads())
        return Throughput(len(x), 0.01, 0.02)

    monkeypatch.setattr(cost, "measure_throughput", measured)
    threads = torch.get_num_threads()
    torch.set_num_threads(4)  # this process's threads, as attack.py threads=4 sets them
    try:
        attack_from_config(compose_config(
            "attack", f"run={surrogate}", f"paths.mini_dir={mini_dir}", f"output_dir={tmp_path}", "dry_run=true",
            "norms=[linf]", "progress=false", "batch_size=50"), threads=4)
        assert torch.get_num_threads() == 4  # given back after the measurement
    finally:
        torch.set_num_threads(threads)
    record = json.loads((tmp_path / COST_ESTIMATE_FILE).read_text())
    assert seen == [1] and record["workers"] == 4 and record["threads"] == 4
    linf = record["budgets"][0]
    forward, backward = linf["rows"]["1"]
    assert linf["seconds"]["1"] == pytest.approx((forward * 0.01 + backward * 0.02) / 4)
