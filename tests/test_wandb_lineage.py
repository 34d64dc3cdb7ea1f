"""W&B lineage and what a model's records carry about its training run, read back from the offline run files W&B
writes (the .wandb transaction log) and from model.json / scores.json: parameter counts, the model card, the train
run's `model` artifact (weights by reference), the inputs an evaluation and a pool declare, paths relative to the
output root and only W&B ids that exist."""

from __future__ import annotations

import json

import pytest
from helpers import FAST, compose_config, record, save_pool, wandb_records

from rgb.commands.train import train
from rgb.core.errors import UserError
from rgb.evaluation.leaderboard import find_records, write_leaderboard
from rgb.evaluation.records import TrainRun
from rgb.evaluation.wandb_report import log_evaluation, log_leaderboard
from rgb.models import create_model, export_model, parameter_counts
from rgb.models.card import model_card
from rgb.runs.store import train_reference


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    import wandb

    yield
    wandb.teardown()


def _logged(folder) -> bytes:
    import wandb

    wandb.teardown()
    return b"".join(f.read_bytes() for f in folder.rglob("*.wandb"))


def test_a_train_run_records_its_parameters_and_card_and_logs_its_export_as_an_artifact(tmp_path, mini_dir, offline):
    card_file = tmp_path / "card.yaml"
    card_file.write_text("title: Tiny robust digits\nauthors: A. Author\nvenue: arXiv\n")
    run_dir = tmp_path / "run"
    train(compose_config("train", f"run_dir={run_dir}", f"data.source={mini_dir}", "logger=wandb", "debug=limit",
                         "trainer.max_epochs=1", *FAST, f"model_card={card_file}", "card.venue=NeurIPS 2024",
                         "card.additional_data=true"))
    meta = json.loads((run_dir / "model.json").read_text())
    expected = parameter_counts(create_model("test_resnet", num_classes=10, pretrained=False))
    assert meta["parameters"] == expected and expected["trainable"] == expected["total"] > 0
    assert meta["card"] == {"title": "Tiny robust digits", "authors": "A. Author", "venue": "NeurIPS 2024",
                            "additional_data": True}
    assert meta["wandb"]["artifact"].startswith("model-") and meta["wandb"]["id"]
    # the artifact's metadata is model.json's (9 of its 12 fields were null: the request's names were passed)
    (artifact,) = [r.artifact for r in wandb_records(run_dir / "wandb") if r.HasField("artifact")]
    metadata = json.loads(artifact.metadata)
    assert artifact.name == meta["wandb"]["artifact"] and artifact.type == "model"
    for key in ("run_name", "dataset", "num_classes", "image_size", "family", "loss", "strategy", "epochs", "seed",
                "weights", "parameters", "card"):
        assert metadata[key] == meta[key] and meta[key] not in (None, ""), key
    logged = _logged(run_dir / "wandb")
    for key in (b"model/params/total", b"model/params/trainable", b"model/params/non_trainable",
                meta["wandb"]["artifact"].encode(), b"sha256-", (run_dir / "model.safetensors").resolve().as_uri()
                .encode()):
        assert key in logged, key
    # the scores record of this model carries what the site shows, relative to the output root
    reference = train_reference(run_dir, "ab" * 32, root=tmp_path)
    carried = TrainRun.of(reference, meta)
    assert (carried.run_dir, carried.wandb_id, carried.epochs) == ("run", meta["wandb"]["id"], meta["epochs"])
    assert carried.model_artifact == f"{meta['wandb']['artifact']}:sha256-{'ab' * 6}"
    assert carried.parameters == expected and carried.card["venue"] == "NeurIPS 2024"
    assert TrainRun.from_json(json.loads(json.dumps(carried.to_json()))) == carried


def test_a_card_with_an_unknown_key_or_an_unreadable_file_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="unknown"):
        model_card(None, {"paper": "x"})
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(UserError, match="mapping"):
        model_card(tmp_path / "bad.yaml", None)


def test_a_model_trained_without_wandb_has_no_wandb_id_and_a_relative_run_dir(tmp_path, offline):
    run_dir = tmp_path / "outputs" / "train" / "d1" / "ce"
    export_model(create_model("test_resnet", num_classes=10, pretrained=False), run_dir,
                 {"dataset": "d1", "run_name": "ce", "image_size": 32})
    reference = train_reference(run_dir, "0" * 64, root=tmp_path / "outputs")
    assert reference["run_dir"] == "train/d1/ce" and reference["wandb_id"] is None
    assert reference["model_artifact"] is None
    scored = record("ce", "d1", [0.9, 0.8, 0.0, 0.1, 0.0])
    save_pool([scored], tmp_path / "eval")
    logged = _logged(log_evaluation(scored, tmp_path / "eval" / "d1" / "ce", project="rgb-tests", train=reference))
    assert b"train/d1/ce" in logged and str(run_dir.resolve()).encode() not in logged


def test_an_evaluation_declares_the_model_artifact_it_scored_and_a_pool_the_scores_it_read(tmp_path, offline):
    scored = record("ce", "d1", [0.9, 0.8, 0.0, 0.1, 0.0])
    save_pool([scored], tmp_path / "eval")
    folder = tmp_path / "eval" / "d1" / "ce"
    train_ref = {"run_dir": "train/d1/ce", "wandb_id": "abc", "model_artifact": "model-ce-0123456789:sha256-0"}
    run_dir = log_evaluation(scored, folder, project="rgb-tests", train=train_ref)
    runs = [r.run for r in wandb_records(run_dir) if r.HasField("run")]
    assert runs and all(list(run.tags) == ["d1", "white_box", "timm"] for run in runs)  # dataset, protocol, family
    logged = _logged(run_dir)
    assert b"inputs" in logged and b"model-ce-0123456789:sha256-0" in logged
    out = tmp_path / "leaderboard"
    records = find_records([tmp_path / "eval"])
    board = write_leaderboard(records, out, datasets=["d1"])
    other = write_leaderboard(records, tmp_path / "other", "black_box", datasets=["d1"])
    from rgb.evaluation.wandb_report import logged_scores

    inputs = logged_scores(records)
    assert len(inputs) == 1 and inputs[0].startswith("scores-ce-d1-")
    logged = _logged(log_leaderboard(board, out, project="rgb-tests", others=[other], inputs=inputs))
    for key in (b"leaderboard", b"boards/black_box", b"black_box/ce/status", inputs[0].encode(), b"inputs"):
        assert key in logged, key
    assert b"leaderboard" in logged and b"white_box" in logged and b"d1" in logged  # group and tags


@pytest.mark.parametrize("text", ["[1, 2]", '{"family": "timm", "num_classes": 2, "class_names": ["a"], "wandb": "x"}',
                                  "{"])
def test_the_export_logged_to_wandb_reads_model_json_by_its_one_reader(tmp_path, offline, text):
    """A malformed model.json under log_export (a list, `wandb` a string, invalid JSON) is one ExportFileError
    naming the file (before: a bare json.loads, an AttributeError or TypeError traceback)."""
    from lightning.pytorch.loggers import WandbLogger

    from rgb.models import META_FILE
    from rgb.models.io import ExportFileError
    from rgb.training.wandb_export import log_export

    (tmp_path / META_FILE).write_text(text)
    with pytest.raises(ExportFileError, match=META_FILE):
        log_export([WandbLogger(save_dir=str(tmp_path), offline=True)], tmp_path, log_weights=False)
