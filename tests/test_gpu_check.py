"""benchmarks/gpu_check.sh end to end at tiny CPU sizes, so the GPU script cannot rot between GPU sessions."""

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers import REPO



@pytest.mark.slow
def test_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(tmp_path), "--cpu"], cwd=REPO,
                          env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["mode"] == "cpu" and report["environment"]["torch"]
    assert report["gpu_tests"]["returncode"] == 0 and report["gpu_tests"]["tests"] >= 4
    assert report["gpu_tests"]["skipped"] == report["gpu_tests"]["tests"]  # no CUDA here: all skipped, none broken
    throughput = report["train_throughput"]
    assert len(throughput) == 2 and all(t["returncode"] == 0 for t in throughput)
    first = throughput[0]["result"]
    assert [r["loss"] for r in first["results"]] == ["ce", "pgd_at", "trades"]
    assert all(r["images_per_s"] > 0 for r in first["results"])
    attacks = report["autoattack"]
    assert [(a["variant"], a["batch_size"]) for a in attacks] == [("bs2", 2), ("bs4", 4)]
    assert [a["result"]["channels_last"] for a in attacks] == [False, True]
    assert all(a["result"]["steps"] == 5 and a["result"]["image_size"] == 16 for a in attacks)  # tiny, not minutes
    for entry in attacks:
        norms = entry["result"]["norms"]
        assert [n["norm"] for n in norms] == ["linf", "l2", "l1"]
        assert all(n["wall_seconds"] > 0 and n["forward_rows_per_image"] >= 1 for n in norms)
    assert report["gpu_attack"] == {"skipped": "the --cpu plan leaves benchmarks/gpu_attack.py --cpu to its own test"}
    assert report["full_size"] == {"skipped": "the --cpu plan leaves the rehearsal to tests/test_full_size.py"}
    assert report["pooled_schedule"] == {"skipped": "the --cpu plan leaves the schedule to its tests"}
    assert (tmp_path / "gpu_check.log").stat().st_size > 0


@pytest.mark.slow
def test_gpu_attack_runs_every_part_on_cpu(tmp_path):
    out = tmp_path / "gpu_attack_cpu.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_attack.py", "--out", str(out), "--cpu"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert list(parts) == ["fixture_test_resnet", "fixture_test_vit", "throughput_test_resnet", "throughput_test_vit",
                           "versus_authors", "pooled_vs_batch", "dry_run_forecast"]
    assert all(part["returncode"] == 0 and part["seconds"] > 0 for part in parts.values())
    vit = parts["fixture_test_vit"]["result"]
    assert vit["input_contraction"] == 20 and vit["survived"] == 1.0  # the ViT fixture survives APGD-CE
    for model in ("test_resnet", "test_vit"):
        throughput = parts[f"throughput_{model}"]["result"]
        assert throughput["flop_per_row"] > 0 and throughput["largest_batch_that_fits"] == 2
        assert [(r["batch"], r["precision"]) for r in throughput["rows"]] == [(2, "fp32"), (2, "bf16")]
        assert all(r["rows_per_s"] > 0 and r["flop_per_s"] > 0 and r["share_of_peak"] is None
                   for r in throughput["rows"])
    versus = parts["versus_authors"]["result"]
    assert versus["ours"]["seconds"] > 0 and versus["ours"]["robust_accuracy"] == 1.0
    assert "seconds" in versus["authors"] or "skipped" in versus["authors"]
    schedules = parts["pooled_vs_batch"]["result"]  # both schedules through rgb.runs, on the same 8 images
    assert schedules["images"] == 8 and sum(schedules["robust_by_design"]) == 2
    for schedule in ("batch", "pooled"):
        run = schedules["schedules"][schedule]
        assert run["wall_seconds"] > 0 and len(run["robust"]) == 8 and run["n_robust"] == sum(run["robust"])
    assert schedules["flags_agree"] == (schedules["schedules"]["batch"]["robust"]
                                        == schedules["schedules"]["pooled"]["robust"])
    assert sum(schedules["agreement"].values()) <= 8 and schedules["pooled_speedup"] > 0
    forecast = parts["dry_run_forecast"]["result"]  # from the throughput rows this run measured on the CPU
    assert forecast["time_basis"]["kind"] == "forecast" and forecast["time_basis"]["utilisation"]["device"] == "cpu"
    assert forecast["robust_share_source"].startswith("measured by pooled_vs_batch")
    assert forecast["forecast_seconds"] > 0
    walls = forecast["measured_wall_seconds"]
    assert walls == {s: schedules["schedules"][s]["wall_seconds"] for s in ("batch", "pooled")}
    assert forecast["measured_over_forecast"] == {s: walls[s] / forecast["forecast_seconds"] for s in walls}


@pytest.mark.slow
def test_gpu_check_refuses_clearly_without_arguments_or_gpu(tmp_path):
    usage = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=REPO, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr
    import torch

    if not torch.cuda.is_available():
        no_gpu = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(tmp_path)], cwd=REPO, capture_output=True,
                                text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
        assert no_gpu.returncode == 4 and "no CUDA device visible; use --cpu" in no_gpu.stderr
        assert "Traceback" not in no_gpu.stderr


@pytest.mark.slow
def test_gpu_check_fits_a_lent_gpu_command(tmp_path):
    """Every part of the GPU run at its time limit still ends inside 9 minutes (a device command may run 10)."""
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", str(tmp_path), "--worst-case"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) <= 540
    plans = {}
    for name in ("gpu_attack", "gpu_check"):  # gpu_attack.py's parts at their limits end inside its part's limit
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        plans[name] = module
    attack = plans["gpu_attack"]
    assert sum(limit for _, limit in attack.parts(attack.GPU_PLAN)) < plans["gpu_check"].GPU_PLAN["gpu_attack"]["limit"]
