"""benchmarks/full_size.py --quick end to end (issue 36): the card's image size and a real class count through
train.py, attack.py and evaluate.py, as a user runs them; the JSON holds every stage's measurements."""

import json
import subprocess
import sys

import pytest
from helpers import REPO



@pytest.mark.slow
def test_full_size_quick_rehearsal_finishes_every_stage(tmp_path):
    out = tmp_path / "quick.json"
    done = subprocess.run([sys.executable, "benchmarks/full_size.py", "--quick", "--out", str(out),
                           "--work", str(tmp_path / "work"), "--attack-workers", "1", "2", "--schedule", "pooled"],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    report = json.loads(out.read_text())
    assert done.returncode == 0 and report["finished"], report.get("commands_log_tail") or done.stderr[-3000:]
    assert report["mode"] == "quick" and report["schedule"] == "pooled" and "load average" in report["machine"]["uptime"] and report["protocol_departures"]
    snapshot = report["snapshot"]
    assert (snapshot["classes"], snapshot["image_size"]) == (21, 224)
    assert snapshot["splits"] == {"train": 1428, "validation": 252, "test": 420}
    assert len(snapshot["transfer_splits"]) == 4 * 7 + 1  # the card's coverage of UC Merced
    assert all(d["images"] == 420 and d["decode_images_per_s"] > 0 for d in report["decode"])
    stages = [s["stage"] for s in report["stages"]]
    assert stages == ["train resnet18", "attack resnet18 ours", "attack resnet18 ours x2",
                      "evaluate resnet18 white_box", "evaluate resnet18 black_box"]
    for stage in report["stages"]:
        assert stage["returncode"] == 0 and stage["wall_seconds"] > 0 and stage["images_per_s"] > 0
        assert stage["peak_rss_mib"] > 0 and stage["peak_gpu_mib"] is None  # CPU: no GPU peak
    for attack in report["stages"][1:3]:
        assert [n["norm"] for n in attack["norms"]] == ["l1", "l2", "linf"]
        for norm in attack["norms"]:
            assert norm["images"] == 8 and 0 <= norm["robust"] <= norm["clean_correct"] <= 8
            assert norm["forward_rows_per_image"] >= 1 and norm["backward_rows_per_image"] >= 0
    assert report["stages"][2]["workers"] == 2  # 2 workers sharing the machine, 2 batches of 4 images


def test_loader_workers_never_exceed_the_cpus_this_process_may_use(mini_dir):
    """The card configs ask for 8 decoding workers; at full size each holds the split, so a 2-CPU machine gets 2."""
    from helpers import datamodule
    from rgb.core.machine import available_cpus

    dm = datamodule(mini_dir)
    dm.num_workers = 64
    assert dm.loader_workers() == available_cpus()
    dm.num_workers = 0
    assert dm.loader_workers() == 0 and dm.eval_dataloader("test").num_workers == 0
