"""evaluate.py text_robustness=true on the mini benchmark: a zero-shot run built from a tiny random-weight CLIP
(the way strategy=zeroshot exports one), every default perturbation type end to end, no-op edits left out and
counted,
the feature caches, the pool comparison, and bad input in one line."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import safetensors.torch
import torch

from helpers import REPO, TESTS, compose_config, raises_one_line
from rgb.evaluation.model_eval import EvaluationError, zeroshot_record
from rgb.commands.evaluate import run_evaluation
from rgb.evaluation.text_robustness import (
    REPORT,
    TextRobustnessOptions,
    load_queries,
    measure_text_robustness,
)
from rgb.models import export_factory_model, export_model, load_clip, load_with_meta, register_architecture
from rgb.zeroshot.head import PromptSettings, build_zeroshot_head, zeroshot_classifier
from rgb.brittleness.perturb import DEFAULT_TYPES, LEXICAL, SEMANTIC, SYNTACTIC

TINY_ARCH = "rgb-test-tiny-clip"
TINY_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "mlp_ratio": 2.0},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1, "mlp_ratio": 2.0},
}
TEMPLATES = ("a photo of a {}.", "a drawing of the {}!", "itap of my {}")
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def zero_shot_run(root: Path, name: str, seed: int) -> Path:
    """A random-weight CLIP checkpoint, its mean-ensemble head over TEMPLATES, exported as strategy=zeroshot does."""
    register_architecture(TINY_ARCH, TINY_CONFIG)
    torch.manual_seed(seed)
    checkpoint = root / f"{name}.clip.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in load_clip(TINY_ARCH).model.state_dict().items()},
                                str(checkpoint))
    clip = load_clip(TINY_ARCH, weights=str(checkpoint))
    settings = PromptSettings(ensemble="mean", pool="none", templates=TEMPLATES, single_template=TEMPLATES[0])
    head = build_zeroshot_head(clip, DIGITS, settings, "digits")
    export_model(zeroshot_classifier(clip, head), root / name,
                 {"dataset": "digits", "class_names": DIGITS, "num_classes": 10, "image_size": 32,
                  "strategy": "zeroshot", "zeroshot": head.record()})
    return root / name


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("zeroshot")
    return zero_shot_run(root, "clip_a", seed=0), zero_shot_run(root, "clip_b", seed=1)


def evaluate_config(mini_dir: Path, out: Path, *overrides: str):
    return compose_config("evaluate", f"paths.mini_dir={mini_dir}", f"paths.output_dir={out}",
                          f"paths.data_dir={out / 'data'}", "text_robustness=true", *overrides)


def test_every_default_type_end_to_end(tiny_runs, mini_dir, tmp_path):
    run = tiny_runs[0]
    run_evaluation(evaluate_config(mini_dir, tmp_path, f"run={run}"))
    out = tmp_path / "eval" / "digits" / "clip_a" / "text_robustness"
    for name in ("queries.parquet", "queries.csv", "summary.csv", "summary.md", "classification.csv",
                 "overlap_at_k.png", "instability_vs_distance.png", "brittleness_heatmap.png", "text_robustness.json"):
        assert (out / name).stat().st_size > 0, name
    record = json.loads((out / "text_robustness.json").read_text())
    queries = pq.read_table(out / "queries.parquet").to_pydict()
    assert record["n_queries"] == len(TEMPLATES) * 10 and record["n_images"] == 200
    summary = {row["perturbation_type"]: row for row in record["summary"]}
    assert set(summary) == set(DEFAULT_TYPES) and "template_synonym" in summary
    assert {row["perturbation_class"] for row in record["summary"]} == {LEXICAL, SYNTACTIC, SEMANTIC}
    assert [c for c in queries if c.startswith("overlap@")] == ["overlap@10", "overlap@50", "overlap@100"]

    # CLIP's tokenizer lowercases: the case edits are no edits (lowercase: the prompts are lowercase already);
    # they are left out of the statistics and counted per type
    assert (summary["lowercase"]["n"], summary["lowercase"]["n_noop"]) == (0, 30)
    for case in ("uppercase", "title_case"):
        assert (summary[case]["n"], summary[case]["n_noop"], summary[case]["n_same_tokens"]) == (0, 0, 30)
        assert summary[case]["instability_mean"] is None and summary[case]["brittleness_mean"] is None
    assert not set(queries["perturbation_type"]) & {"lowercase", "uppercase", "title_case"}
    assert summary["char_swap"]["n_noop"] == summary["char_swap"]["n_same_tokens"] == 0
    # what is measured changes the tokens: every B is defined or a stable ranking (-inf), counted apart
    brittleness = np.array(queries["brittleness"], dtype=float)
    assert len(brittleness) == record["n_perturbations"] == sum(row["n"] for row in record["summary"])
    assert record["n_generated"] == record["n_perturbations"] + 90
    assert int(np.isneginf(brittleness).sum()) == sum(row["brittleness_stable"] for row in record["summary"])
    assert int(np.isnan(brittleness).sum()) == sum(row["brittleness_undefined"] for row in record["summary"]) == 0
    assert "| no-op | same tokens |" in (out / "summary.md").read_text()
    csv = pa_csv.read_csv(out / "summary.csv").to_pydict()
    assert csv["perturbation_type"] == [row["perturbation_type"] for row in record["summary"]]

    # the classification view: the rebuilt head is the model's; a no-op edit flips nothing
    assert record["head_agreement"] == 1.0
    model, _ = load_with_meta(run)
    from rgb.data import BenchmarkData

    test = BenchmarkData(str(mini_dir), "digits", 32, 10, {"linf": 4 / 255}).split("test")
    with torch.inference_mode():
        predicted = model(torch.stack([test[i][0] for i in range(len(test))])).argmax(1)
    own = float((predicted == test.labels).double().mean())
    views = {row["perturbation_type"]: row for row in record["classification"]}
    assert set(views) == set(DEFAULT_TYPES) - {"lowercase", "uppercase", "title_case"}
    assert all(math.isclose(v["accuracy"], own) for v in views.values())
    assert views["class_name_only"]["edited_prompts"] == len(TEMPLATES) * 10
    assert views["class_name_only"]["flip_rate"] > 0

    # a second evaluation reads both feature caches (no image, no text through the model again), logged to W&B
    run_evaluation(evaluate_config(mini_dir, tmp_path, f"run={run}", "wandb.enabled=true", "wandb.project=rgb-tests"))
    again = json.loads((out / "text_robustness.json").read_text())
    assert again["image_features"] == "cache" and again["texts_encoded"] == 0 and record["image_features"] == "computed"
    assert again["summary"] == record["summary"]
    import wandb

    wandb.teardown()  # the service may still be writing the record file after finish() under load
    logged = next(out.rglob("*.wandb")).read_bytes()
    assert b"text_robustness/char_swap/instability_mean" in logged and b"text_robustness/classification" in logged
    assert len(list(out.rglob("media/images/text_robustness/plots/*.png"))) == 3


def test_pool_of_models_on_free_text_queries_and_user_edits(tiny_runs, mini_dir, tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"query": "a handwritten seven", "class_name": "seven"}\n\n'
                       '{"query": "Two ducks on a lake."}\n{"query": "the digit zero", "class_name": "zero"}\n')
    edits = tmp_path / "edits.jsonl"
    edits.write_text('{"query": "seven", "type": "synonym", "perturbed": "7"}\n')
    run_evaluation(evaluate_config(
        mini_dir, tmp_path, f"pool=[{tiny_runs[0]},{tiny_runs[1]}]", f"text_robustness_options.queries={queries}",
        f"text_robustness_options.user_edits={edits}",
        "text_robustness_options.types=[class_name_only,synonym,char_swap]",
        "text_robustness_options.seeds=[0,1]", "text_robustness_options.split=validation"))
    pool = pa_csv.read_csv(tmp_path / "leaderboard" / "text_robustness" / "pool.csv").to_pydict()
    assert pool["model"] == ["clip_a"] * 3 + ["clip_b"] * 3
    assert pool["perturbation_type"] == ["class_name_only", "synonym", "char_swap"] * 2
    # class_name_only: the 2 queries that name a class; synonym: 1 query x 2 seeds; char_swap: 3 queries x 2 seeds
    assert pool["n"] == [2, 2, 6] * 2
    for name in ("brittleness_heatmap.png", "pool.parquet", "pool.md"):
        assert (tmp_path / "leaderboard" / "text_robustness" / name).stat().st_size > 0
    assert "| char_swap |" in (tmp_path / "leaderboard" / "text_robustness" / "pool.md").read_text()
    for name in ("clip_a", "clip_b"):
        out = tmp_path / "eval" / "digits" / name / "text_robustness"
        record = json.loads((out / "text_robustness.json").read_text())
        assert record["queries"] == str(queries) and record["split"] == "validation" and record["classification"] == []
        assert not (out / "classification.csv").exists()
        texts = pq.read_table(out / "queries.parquet").to_pydict()["perturbed"]
        assert "a handwritten 7" in texts and "seven" in texts


def one_line_error(call) -> str:
    with raises_one_line(EvaluationError) as caught:
        call()
    return str(caught.value)


QUERY_FILE = ["text_robustness_options.queries=QUERIES"]


@pytest.mark.parametrize("lines, overrides, expected", [
    (['{"query": "a seven"}', '{"text": "a one"}'], QUERY_FILE, "queries.jsonl:2: expected"),
    (['{"query": "a seven"}', "not json"], QUERY_FILE, "queries.jsonl:2: not valid JSON"),
    (['{"query": "a 7"}', "", '{"query": "a 7"}'], QUERY_FILE, "queries.jsonl:3: repeats the query of line 1"),
    (['{"query": "a seven"}', '{"query": "a sevn", "class_name": "sevn"}'], QUERY_FILE,
     "queries.jsonl:2: class_name 'sevn' is unknown; did you mean 'seven'? known: zero, one, two, three, four, ... "
     "(10 in all)"),
    (["", "  "], QUERY_FILE, "empty query set"),
    (['{"query": "123"}'], [*QUERY_FILE, "text_robustness_options.types=[class_name_only,keyboard_typo]"],
     "empty query set: none of the types"),
    (None, ["text_robustness_options.types=[lowercase,typo]"],
     "unknown perturbation type 'typo'; known: lowercase, uppercase"),
    (None, ["text_robustness_options.types=[synonym]"], "come from a user file"),
    (None, ["text_robustness_options.types=[]"], "types and .seeds must not be empty"),
    (None, ["pool=[RUN,RUN]"], "distinct run names"),
])
def test_bad_input_is_one_line(lines, overrides, expected, tiny_runs, mini_dir, tmp_path):
    queries = tmp_path / "queries.jsonl"
    if lines is not None:
        queries.write_text("\n".join(lines) + "\n")
    items = [item.replace("QUERIES", str(queries)).replace("RUN", str(tiny_runs[0])) for item in overrides]
    if not any(item.startswith("pool=") for item in items):
        items.append(f"run={tiny_runs[0]}")
    assert expected in one_line_error(lambda: run_evaluation(evaluate_config(mini_dir, tmp_path, *items)))
    assert not (tmp_path / "eval").exists()  # refused before anything is written


def test_only_zero_shot_runs(mini_dir, tmp_path):
    from user_models import small_cnn

    run = tmp_path / "cnn"
    export_factory_model(small_cnn(), run, factory="user_models:small_cnn",
                         meta={"dataset": "digits", "num_classes": 10, "image_size": 32})
    message = one_line_error(lambda: run_evaluation(evaluate_config(mini_dir, tmp_path, f"run={run}")))
    assert message == f"text robustness needs a zero-shot (openclip) run; {run} is a factory model"
    assert "is a timm model" in one_line_error(lambda: zeroshot_record({}, Path("r"), REPORT))
    assert "without a prompt-built head" in one_line_error(lambda: zeroshot_record({"family": "openclip"}, Path("r"),
                                                                                   REPORT))


def test_a_collection_needs_two_images(tiny_runs, mini_dir, tmp_path):
    from rgb.data import BenchmarkData
    from rgb.data.benchmark import ImageSplit

    class OneImage(BenchmarkData):
        def split(self, split, surrogate=None):
            found = super().split(split)
            return ImageSplit(found.rows.select([0]), found.image_size)

    model, meta = load_with_meta(tiny_runs[0])
    options = TextRobustnessOptions(split="test", queries=None, types=("char_swap",), seeds=(0,), user_edits=None)
    data = OneImage(str(mini_dir), "digits", 32, 10, {"linf": 4 / 255})
    message = one_line_error(lambda: measure_text_robustness(model, meta, tiny_runs[0] / "model.safetensors", data,
                                                             options, tmp_path))
    assert message.startswith("the test split holds 1 image(s): ranking instability needs a collection of at least 2")
    no_edits = TextRobustnessOptions(split="test", queries=None, types=("uppercase", "lowercase"), seeds=(0,),
                                     user_edits=None)
    message = one_line_error(lambda: measure_text_robustness(model, meta, tiny_runs[0] / "model.safetensors", data,
                                                             no_edits, tmp_path))
    assert message == ("no perturbation to measure: every edit of the types uppercase, lowercase leaves the text or "
                       "its tokens as they were")


def test_load_queries_keeps_order_and_class_names(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"query": "b seven", "class_name": "seven"}\n{"query": "a cat"}\n')
    assert [(q.text, q.class_name) for q in load_queries(path, DIGITS)] == [("b seven", "seven"), ("a cat", None)]


@pytest.mark.slow
def test_the_command_line_prints_one_line(tiny_runs, mini_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    shown = subprocess.run([sys.executable, str(REPO / "evaluate.py"), f"run={tiny_runs[0]}", "text_robustness=true",
                            "text_robustness_options.types=[typo]", f"paths.mini_dir={mini_dir}",
                            f"paths.output_dir={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    lines = [line for line in (shown.stdout + shown.stderr).splitlines() if line.strip()]
    # refused by evaluate's config schema before any work (exit 1, as every config error), naming the allowed types
    assert shown.returncode == 1 and len(lines) == 1, lines[-5:]
    assert "text_robustness_options.types must be null or a non-empty list" in lines[0] and "got ['typo']" in lines[0]
