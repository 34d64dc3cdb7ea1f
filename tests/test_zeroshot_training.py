"""strategy=zeroshot and head_init=zeroshot through the real configs, on the mini benchmark with a tiny
random-weight open_clip model (the embedded architecture untrained: every path, seconds)."""

import logging

import hydra
import pytest
import torch

from helpers import compose_tiny_clip, raises_one_line, resolved
from rgb.models import load_with_meta
from rgb.commands.train import train, training_request
from rgb.training.zeroshot import initialise_head, validation_metrics



def test_zeroshot_strategy_exports_a_run_that_loads_and_logs_the_ensemble(tmp_path, mini_dir, caplog):
    cfg = compose_tiny_clip(tmp_path, mini_dir, "strategy=zeroshot", "prompts=cpe", "monitor.metric=val/acc")
    with caplog.at_level(logging.INFO, logger="rgb.training.zeroshot"):
        value = train(cfg)
    model, meta = load_with_meta(tmp_path / "run")
    assert isinstance(model, torch.nn.Module) and not model.training
    assert (meta["family"], meta["strategy"], meta["dataset"], meta["epochs"]) == ("openclip", "zeroshot", "digits", 0)
    record = meta["zeroshot"]
    assert record["ensemble"] == "cpe" and len(record["templates"]) == 80 + 2  # imagenet80 + the digits extras
    weights = torch.tensor([t["weight"] for t in record["templates"]])
    kept = torch.tensor([t["kept"] for t in record["templates"]])
    assert weights.sum().item() == pytest.approx(1.0, abs=1e-5) and torch.equal(kept, weights >= weights.quantile(0.5))  # even M: mean of the middle two
    assert record["unlabelled_images"] == 270 and record["worst_classes"]
    log = caplog.text
    assert record["label"] == "cpe (weights)"
    assert "cpe (weights) over 82 templates" in log and "worst classes by pseudo-Cmm" in log and "template weight" in log
    datamodule = hydra.utils.instantiate(cfg.data)
    assert validation_metrics(model, datamodule, "cpu")["val/acc"] == pytest.approx(value)


def test_head_init_zeroshot_gives_the_zeroshot_accuracy_at_step_0(tmp_path, mini_dir):
    zeroshot = compose_tiny_clip(tmp_path / "zs", mini_dir, "strategy=zeroshot", "prompts=mean", "monitor.metric=val/acc")
    zeroshot_acc = train(zeroshot)
    cfg = compose_tiny_clip(tmp_path / "ft", mini_dir, "strategy=linear_probe", "head_init=zeroshot", "prompts=mean")
    datamodule = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(cfg.model)
    initialise_head(model, training_request(cfg).model, datamodule)
    assert validation_metrics(model, datamodule, "cpu")["val/acc"] == zeroshot_acc
    exported, _ = load_with_meta(tmp_path / "zs" / "run")
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), exported(x))


def test_fine_tuning_from_the_zeroshot_head_trains_and_exports(tmp_path, mini_dir):
    cfg = compose_tiny_clip(tmp_path, mini_dir, "strategy=linear_probe", "head_init=zeroshot", "debug=fdr",
                        "data.batch_size=16")
    train(cfg)
    model, meta = load_with_meta(tmp_path / "run")
    assert meta["family"] == "openclip" and meta["strategy"] == "linear_probe"
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_head_init_zeroshot_on_a_timm_model_is_one_line(tmp_path, mini_dir, compose):
    cfg = compose("train", f"run_dir={tmp_path}", f"data.source={mini_dir}", "head_init=zeroshot")
    with raises_one_line(ValueError, match=r"zero-shot head needs a CLIP text tower: model family 'timm'") as err:
        initialise_head(hydra.utils.instantiate(cfg.model), training_request(cfg).model,
                        hydra.utils.instantiate(cfg.data))


def test_a_plain_module_is_refused_for_its_missing_text_tower_not_for_its_export():
    """A user's factory model under strategy=zeroshot: the line says what is missing (a CLIP text tower), not how to
    export the model."""
    import torch

    from rgb.training.config import TrainingConfigError
    from rgb.training.zeroshot import check_zeroshot_capable

    with raises_one_line(TrainingConfigError, match=r"CLIP text tower: Linear \(no model family\) has none"):
        check_zeroshot_capable(torch.nn.Linear(2, 2))
