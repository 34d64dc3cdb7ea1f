"""Mini transfer splits (rgb.runs.transfer): written into the benchmark, loadable through `load_split`, aligned
with test, within their budgets after PNG quantisation, and modified exactly where the attack succeeded."""

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from helpers import compose_config, head_of_test_split
from rgb.data import ImageSplit, load_split
from rgb.data.catalog import TRANSFER_SPLITS, split_budget
from rgb.data.mini import DATASET
from rgb.runs.store import AttackRunError
from rgb.commands.transfer import transfer_from_config as make_transfer_summaries
from rgb.models import load

N_IMAGES = 24
# Two splits whose attack is quick on the test surrogate; L1 (5 restarts x 103 steps on every robust point) and the
# small budgets are in the slow test of all seven.
FAST_SPLITS = ("l2_8", "linf_30")


def make_transfer_splits(cfg) -> dict:
    return {name: summary.to_json() for name, summary in make_transfer_summaries(cfg).items()}


@pytest.fixture(scope="module")
def made(mini_dir, surrogate, tmp_path_factory):
    """Transfer splits of the test surrogate written into a fresh small copy of the mini benchmark."""
    bench = head_of_test_split(mini_dir, tmp_path_factory.mktemp("transfer") / "bench", N_IMAGES)
    out = tmp_path_factory.mktemp("transfer_runs")
    items = [f"run={surrogate}", f"paths.mini_dir={bench}", f"output_dir={out}", "attacks=[apgd-ce]",
             f"batch_size={N_IMAGES}"]
    cfg = compose_config("transfer", *items, f"splits=[{','.join(FAST_SPLITS)}]")
    return bench, surrogate, out, items, make_transfer_splits(cfg)


def readme_configs(bench) -> dict[str, list[str]]:
    header = (bench / "README.md").read_text().split("---")[1]
    return {c["config_name"]: [f["split"] for f in c["data_files"]] for c in yaml.safe_load(header)["configs"]}


def test_readme_declares_the_surrogate_config_next_to_test(made):
    configs = readme_configs(made[0])
    assert sorted(configs[f"{DATASET}-vit_mlp"]) == sorted(FAST_SPLITS) and configs[DATASET] == ["test"]


@pytest.mark.parametrize("split", FAST_SPLITS)
def test_split_loads_aligned_within_budget_and_modified_where_the_attack_succeeded(made, split):
    bench, surrogate, out, items, summaries = made
    check_split(bench, surrogate, out, split, summaries[split])


@pytest.mark.slow
def test_all_seven_transfer_budgets(made):
    bench, surrogate, out, items, _ = made
    summaries = make_transfer_splits(compose_config("transfer", *items))  # the three above are reused, not recomputed
    assert sorted(readme_configs(bench)[f"{DATASET}-vit_mlp"]) == sorted(TRANSFER_SPLITS)
    for split in TRANSFER_SPLITS:
        check_split(bench, surrogate, out, split, summaries[split])


def check_split(bench, surrogate, out, split: str, summary: dict) -> None:
    adversarial = load_split(str(bench), DATASET, split, surrogate="vit_mlp")  # raises unless aligned with test
    test = load_split(str(bench), DATASET, "test")
    norm, eps = split_budget(split, 3 * 32 * 32)  # the real budget, scaled to 32x32
    assert summary["eps"] == pytest.approx(eps, rel=1e-12) and summary["norm"] == norm
    assert set(adversarial["perturbation"]) == {"transfer_autoattack"} and set(adversarial["surrogate"]) == {"vit_mlp"}
    assert set(adversarial["norm"]) == {norm} and np.allclose(adversarial["epsilon"], eps)

    # Independent of the attack run: where is the surrogate right on the clean image?
    clean = ImageSplit(test, image_size=32)
    with torch.no_grad():
        correct = (load(surrogate)(torch.stack([clean[i][0] for i in range(N_IMAGES)])).argmax(1) == clean.labels)
    table = pd.read_parquet(out / split / "results.parquet")
    assert table["clean_correct"].tolist() == correct.tolist()

    modified = adversarial["is_modified"]
    for i in range(N_IMAGES):
        pixels = [np.asarray(ds[i]["image"], np.float64).ravel() for ds in (adversarial, test)]
        delta = (pixels[0] - pixels[1]) / 255
        size = {"l1": np.abs(delta).sum(), "l2": np.sqrt((delta**2).sum()), "linf": np.abs(delta).max()}[norm]
        assert size <= eps * (1 + 1e-6), (i, size, eps)  # the stored 8-bit image respects the budget
        assert modified[i] == bool(delta.any())
    fooled = (table["clean_correct"] & ~table["robust"]).tolist()
    assert modified == fooled  # never where the surrogate was wrong; wherever the attack succeeded
    assert not any(m and not c for m, c in zip(modified, correct.tolist()))
    if split == "linf_30":  # a budget this large fools everything: unmodified exactly where the surrogate was wrong
        assert modified == correct.tolist()
    assert summary["export"].endswith(f"{DATASET}/vit_mlp/{split}.parquet")


def test_rerun_recomputes_nothing_and_rejects_unknown_splits(made):
    bench, surrogate, out, items, summaries = made
    before = {p: p.stat().st_mtime_ns for p in out.rglob("batch-*.pt")}
    again = make_transfer_splits(compose_config("transfer", *items, f"splits=[{','.join(FAST_SPLITS)}]"))
    assert {p: p.stat().st_mtime_ns for p in out.rglob("batch-*.pt")} == before
    assert {s: again[s]["n_robust"] for s in again} == {s: summaries[s]["n_robust"] for s in summaries}
    with pytest.raises(AttackRunError, match="unknown transfer splits"):
        make_transfer_splits(compose_config("transfer", f"run={surrogate}", f"paths.mini_dir={bench}", "splits=[linf_5]"))
