"""attack.py's progress (issue 53 item 4): a bar per norm and one per stage of its cascade, each counting what
reaches it with a clock of its own, in the batch and the pooled schedule, in one process and from forked workers;
the results are those of a run without bars, byte for byte."""

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from helpers import compose_config, head_of_test_split
from rgb.commands.attack import attack_from_config

N_IMAGES, BATCH = 12, 4
# Three attacks, cheap: APGD-CE leaves some robust points at this budget for APGD-T and Square to try.
CASCADE = ["norms=[linf]", "attacks=[apgd-ce,apgd-t,square]", "steps=1", "queries=50", f"data.budgets.linf={4 / 255}",
           f"batch_size={BATCH}"]


@pytest.fixture(scope="module")
def small_bench(mini_dir, tmp_path_factory):
    return head_of_test_split(mini_dir, tmp_path_factory.getbasetemp() / f"head{N_IMAGES}", N_IMAGES)


def attack(run: Path, bench: Path, out: Path, *extra: str, threads: int = 1) -> dict:
    config = compose_config("attack", f"run={run}", f"paths.mini_dir={bench}", f"output_dir={out}", *CASCADE, *extra)
    return {name: summary.to_json() for name, summary in attack_from_config(config, threads=threads).items()}


@pytest.fixture(scope="module")
def quiet(surrogate, small_bench, tmp_path_factory):
    """Each schedule's run without bars, made when first asked for: what a run with them must write, byte for byte."""
    runs = {}

    def run(schedule: str):
        if schedule not in runs:
            out = tmp_path_factory.mktemp(f"quiet-{schedule}")
            runs[schedule] = out, attack(surrogate, small_bench, out, "progress=false", f"schedule={schedule}",
                                         "shard.devices=1")["linf"]
        return runs[schedule]

    return run


@pytest.mark.parametrize(("schedule", "devices"), [  # one case in the fast suite; CI runs all four
    ("batch", 1), *(pytest.param(*case, marks=pytest.mark.slow) for case in [("pooled", 1), ("batch", 2), ("pooled", 2)])])
def test_each_stage_has_a_bar_counting_the_images_that_reach_it(surrogate, small_bench, quiet, tmp_path, capsys,
                                                               caplog, schedule, devices):
    """A bar per stage under the norm's bar (`  linf apgd-t: ... 5/5`), made when the stage first takes images,
    counting the survivors of the stages before it (the only total known); when the norm is done each leaves one
    line with its own count, time and rate, also from forked workers (their parent draws); the results are those
    of the run without bars."""
    with caplog.at_level(logging.INFO, logger="rgb"):
        summary = attack(surrogate, small_bench, tmp_path, "progress=true", f"schedule={schedule}",
                         f"shard.devices={devices}", threads=devices)["linf"]
    stderr = capsys.readouterr().err
    lines = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in
             (re.match(r"linf (\S+): (\d+) images in \S+ \(.*\), (\d+) (?:fooled|misclassified)$", r.getMessage())
              for r in caplog.records) if m}
    n, after = summary["n"], summary["accuracy_after"]
    reached = {"clean": n, **{stage: round(after[before] * n) for before, stage in
                              zip(["clean", "apgd-ce", "apgd-t"], ["apgd-ce", "apgd-t", "square"])}}
    left = {stage: reached[stage] - round(after[stage] * n) for stage in reached}
    assert lines == {stage: (reached[stage], left[stage]) for stage in reached if reached[stage]}
    assert reached["apgd-t"] > 0  # the cascade goes past its first attack: a later stage's bar is tested
    for stage in lines:
        assert f"  linf {stage}: " in stderr  # its live bar, under the norm's
    assert "linf eps=" in stderr
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "linf" / "results.parquet"),
                                  pd.read_parquet(quiet(schedule)[0] / "linf" / "results.parquet"))
    assert summary["results_sha256"] == quiet(schedule)[1]["results_sha256"]


class FakeRun:
    """A budget's run directory as Bars reads it: `n` images in batches of 10, none saved yet."""

    def __init__(self, n=20):
        self.identity = {"n_images": n}

    def shard_starts(self, index, count):
        return list(range(0, self.identity["n_images"], 10))

    def batch_files(self):
        return {}


def test_a_stages_clock_runs_only_while_the_stage_does(monkeypatch):
    """In the batch schedule a batch's stages run in turn, then the next batch's: APGD-T's elapsed time and rate
    are its own minutes, never APGD-CE's nor the clean passes' before or between them; its count is the images
    that reached it, batch by batch."""
    from rgb.runs.runner import Bars

    now = [1000.0]
    monkeypatch.setattr("tqdm.std.time", lambda: now[0])  # every bar's clock
    budgets = [SimpleNamespace(name="linf", threat=SimpleNamespace(eps=0.1))]
    bars = Bars(SimpleNamespace(budgets=budgets, batch_size=10, progress=True), [FakeRun()], 0, 1)
    seen = {}
    try:
        for batch, (clean_wrong, ce_fooled, t_fooled) in enumerate([(2, 5, 1), (1, 6, 0)]):
            bars.rows(0, 0, "clean", 10)
            now[0] += 10
            bars.rows(0, 0, "clean", 0, 10, clean_wrong)
            bars.rows(0, 0, "apgd-ce", 10 - clean_wrong)
            now[0] += 60
            bars.rows(0, 0, "apgd-ce", 0, 10 - clean_wrong, ce_fooled)
            survivors = 10 - clean_wrong - ce_fooled
            bars.rows(0, 0, "apgd-t", survivors)
            now[0] += 30  # half way through APGD-T on this batch: nothing attacked yet, all of its images reached it
            seen[batch] = bars.stage_bars[0, "apgd-t"].format_dict
            now[0] += 90
            bars.rows(0, 0, "apgd-t", 0, survivors, t_fooled)
            now[0] += 5  # the final checks
            bars.batch_done(0, 0, 10, survivors - t_fooled)
            if batch == 0:
                seen["after"] = {stage: bar.format_dict for (_, stage), bar in bars.stage_bars.items()}
        assert (seen[0]["n"], seen[0]["total"], seen[0]["elapsed"]) == (0, 3, 30)
        assert (seen[1]["n"], seen[1]["total"], seen[1]["elapsed"]) == (3, 6, 120 + 30)  # not the 70 s between
        assert {stage: (shown["n"], shown["elapsed"]) for stage, shown in seen["after"].items()} == {
            "clean": (10, 10), "apgd-ce": (8, 60), "apgd-t": (3, 120)}
        assert seen[1]["rate"] is None or seen[1]["rate"] == pytest.approx(3 / 120)
    finally:
        bars.close()


def test_the_stage_lines_are_logged_when_the_norm_is_done(monkeypatch, caplog):
    """Each stage's last word is one plain log line (a log file gets no bar): its images, its own time and rate."""
    from rgb.runs.runner import Bars

    now = [0.0]
    monkeypatch.setattr("tqdm.std.time", lambda: now[0])
    budgets = [SimpleNamespace(name="l1", threat=SimpleNamespace(eps=12.0))]
    bars = Bars(SimpleNamespace(budgets=budgets, batch_size=10, progress=True), [FakeRun(n=10)], 0, 1)
    with caplog.at_level(logging.INFO, logger="rgb"):
        now[0] += 3600  # an hour of another norm before: none of this norm's stages counts it
        bars.rows(0, 0, "clean", 10)
        now[0] += 4
        bars.rows(0, 0, "clean", 0, 10, 2)
        bars.rows(0, 0, "apgd-ce", 8)
        now[0] += 80
        bars.rows(0, 0, "apgd-ce", 0, 8, 6)
        bars.batch_done(0, 0, 10, 2)
    assert [r.getMessage() for r in caplog.records] == [
        "l1 clean: 10 images in 00:04 (2.5 img/s), 2 misclassified",
        "l1 apgd-ce: 8 images in 01:20 (0.1 img/s), 6 fooled"]



def test_a_stage_no_image_reached_says_so(monkeypatch, caplog):
    """Every image fooled before apgd-t (the demo's plain model): its line says none was left, not '0 images in
    00:00 (0 img/s)'."""
    from rgb.runs.runner import Bars

    budgets = [SimpleNamespace(name="linf", threat=SimpleNamespace(eps=0.1))]
    bars = Bars(SimpleNamespace(budgets=budgets, batch_size=10, progress=True), [FakeRun(n=10)], 0, 1)
    with caplog.at_level(logging.INFO, logger="rgb"):
        bars.rows(0, 0, "apgd-ce", 10)
        bars.rows(0, 0, "apgd-ce", 0, 10, 10)
        bars.rows(0, 0, "apgd-t", 0)
        bars.batch_done(0, 0, 10, 0)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("linf apgd-ce: 10 images in ") and messages[0].endswith(", 10 fooled")
    assert messages[1:] == ["linf apgd-t: no image left to attack"]

def test_autoattack_reports_each_stages_images_as_it_takes_and_finishes_them():
    """`on_rows`: the clean pass takes every image, each attack the survivors of the ones before it; what a stage
    attacked sums to what it took, and what it fooled is what its accuracy_after took away."""
    from rgb import AutoAttack

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10)).eval()
    x = torch.rand(12, 3, 8, 8)
    y = model(x).argmax(1)
    y[:2] = (y[:2] + 1) % 10  # two images misclassified clean
    calls = []
    result = AutoAttack(model, "Linf", 1 / 255, seed=0, steps=2, queries=20,
                        on_rows=lambda *call: calls.append(call)).run(x, y, batch_size=5)
    stages = ["clean", *result.attacks]
    assert [call[0] for call in calls if call[1]] == stages  # each stage takes its images once, in order
    after = [result.accuracy_after[stage] * len(x) for stage in stages]
    for k, stage in enumerate(stages):
        entered = sum(call[1] for call in calls if call[0] == stage)
        attacked = sum(call[2] for call in calls if call[0] == stage)
        fooled = sum(call[3] for call in calls if call[0] == stage)
        assert entered == attacked == (len(x) if k == 0 else round(after[k - 1]))
        assert fooled == entered - round(after[k])
    assert [call for call in calls if call[0] == "clean"] == [("clean", 12, 0, 0), ("clean", 0, 12, 2)]


def test_the_batch_size_probe_says_what_it_waits_for_before_it_waits(tmp_path, monkeypatch, caplog):
    """batch_size=auto on a GPU probes doubling batches (seconds to minutes for a large model): a line first; a
    cached answer needs none."""
    from rgb.runs import batch_probe

    monkeypatch.setattr(batch_probe, "device_key", lambda device: "cuda:H200:1")
    heard = []
    monkeypatch.setattr(batch_probe, "largest_batch", lambda *args: heard.append(caplog.text) or 96)
    model = torch.nn.Linear(1, 1)
    with caplog.at_level(logging.INFO, logger="rgb"):
        batch_probe.auto_batch_size(model, "sha-a", (3, 8, 8), torch.device("meta"), tmp_path / "cache.json")
        said = len(caplog.records)
        batch_probe.auto_batch_size(model, "sha-a", (3, 8, 8), torch.device("meta"), tmp_path / "cache.json")
    assert "batch_size=auto: finding the largest batch an attack step fits on meta ..." in heard[0]
    assert said == len(caplog.records) == 1
