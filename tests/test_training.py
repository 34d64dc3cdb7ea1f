"""rgb.training on the REAL configs (Hydra compose API) with tiny timm models and the mini benchmark."""

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import hydra
import lightning as L
import pytest
import safetensors.torch
import timm
import torch
import torch.nn.functional as F
import yaml

from helpers import FAST, REPO, compose_config, compose_train, raises_one_line
from rgb.commands.train import train
from rgb.core.files import stable_id as stable_run_id
from rgb.models import create_model, load, load_with_meta
from rgb.training import (
    InnerAttack,
    RobustFinetuneModule,
    TrainingConfigError,
    accumulation_steps,
    build_loss,
    parameter_groups,
    resume_path,
    warmup_cosine,
)

AT_LOSSES = ("pgd_at", "trades")


def read_metrics(run_dir, version=0):
    with open(run_dir / "csv" / f"version_{version}" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def tiny_module(strategy, loss="ce"):
    torch.manual_seed(0)
    model = create_model("test_resnet", 10, pretrained=False)
    loss_cfg = {"name": loss} if loss == "ce" else {"name": loss, "attack": {"n_iter": 2}}
    optim = dict(backbone_lr=1e-4, head_lr=1e-3, backbone_weight_decay=1e-6, head_weight_decay=1e-5)
    return RobustFinetuneModule(model, loss=loss_cfg, strategy=strategy, optim=optim)


# ---------------------------------------------------------------- units


def test_losses_follow_the_paper_definitions():
    torch.manual_seed(0)
    y, clean, adv = torch.tensor([0, 2, 1]), torch.randn(3, 4), torch.randn(3, 4)
    ce, pgd_at, trades = build_loss("ce"), build_loss("pgd_at"), build_loss("trades", beta=2.0)
    torch.testing.assert_close(ce(y, clean, None), F.cross_entropy(clean, y))
    torch.testing.assert_close(pgd_at(y, None, adv), F.cross_entropy(adv, y))
    p, q = clean.softmax(1), adv.softmax(1)
    kl = (p * (p.log() - q.log())).sum(1).mean()
    torch.testing.assert_close(trades(y, clean, adv), F.cross_entropy(clean, y) + 2.0 * kl)
    torch.testing.assert_close(trades(y, clean, clean), F.cross_entropy(clean, y))
    assert pgd_at.attack == InnerAttack(norm="Linf", eps=4 / 255, n_iter=10) and not pgd_at.uses_clean
    assert ce.attack is None
    with pytest.raises(ValueError, match="unknown loss 'mart'"):
        build_loss("mart")


def test_each_loss_name_the_schema_reads_has_its_class():
    """The loss names train.py's schema accepts (rgb.training.settings, read before torch loads) are the losses that
    build, in their order."""
    from rgb.training.losses import LOSSES
    from rgb.training.settings import LOSS_NAMES

    assert tuple(LOSSES) == LOSS_NAMES


@pytest.mark.parametrize("strategy", ["full_finetune", "linear_probe"])
def test_inner_attack_crafts_in_eval_mode_and_restores_train_mode(strategy):
    module = tiny_module(strategy, loss="trades")
    seen = []

    def spy(model, x, y):
        seen.append([m.training for m in module.model.modules()])
        return x

    module.training_loss.attack = spy
    module.loss_and_logits(torch.rand(4, 3, 32, 32), torch.tensor([0, 1, 2, 3]))
    assert seen and not any(seen[0])
    bn = [m for m in module.model.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert module.training and module.model.classifier.training
    assert {m.training for m in bn} == ({True} if strategy == "full_finetune" else {False})


@pytest.mark.parametrize("strategy", ["full_finetune", "linear_probe"])
def test_parameter_groups_split_lr_and_skip_decay_on_bias_and_norm(strategy):
    module = tiny_module(strategy)
    groups = {g["name"]: g for g in parameter_groups(module.model, 1e-4, 1e-3, 0.1, 0.2)}
    expected = {"head", "head_no_decay"} | ({"backbone", "backbone_no_decay"} if strategy == "full_finetune" else set())
    assert set(groups) == expected
    assert groups["head"]["lr"] == 1e-3 and groups["head"]["weight_decay"] == 0.2
    assert all(p.ndim == 1 for p in groups["head_no_decay"]["params"]) and groups["head_no_decay"]["weight_decay"] == 0
    if strategy == "full_finetune":
        assert groups["backbone"]["lr"] == 1e-4 and groups["backbone"]["weight_decay"] == 0.1
        assert all(p.ndim > 1 for p in groups["backbone"]["params"])
        n_trainable = sum(p.numel() for p in module.model.parameters())
    else:
        n_trainable = sum(p.numel() for p in module.model.classifier.parameters())
    assert sum(p.numel() for g in groups.values() for p in g["params"]) == n_trainable


def test_warmup_cosine_schedule():
    factor = warmup_cosine(total_steps=10, warmup_steps=2)
    assert [factor(s) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert factor(6) == pytest.approx(0.5) and factor(10) == pytest.approx(0.0)


def test_accumulation_steps_reach_the_effective_batch():
    assert accumulation_steps(None, 64, 4) == 1
    assert accumulation_steps(1024, 64, 2) == 8
    with pytest.raises(ValueError, match="not a multiple of batch_size x devices = 96"):
        accumulation_steps(1024, 48, 2)


def test_resume_path_modes(tmp_path):
    last = tmp_path / "last.ckpt"
    assert resume_path("auto", last) is None and resume_path(None, last) is None
    with pytest.raises(FileNotFoundError, match="ckpt_path=last"):
        resume_path("last", last)
    last.write_bytes(b"")
    assert resume_path("auto", last) == resume_path("last", last) == str(last)
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        resume_path(str(tmp_path / "nope.ckpt"), last)


# ---------------------------------------------------------------- fits through train()


@pytest.mark.parametrize("strategy", ["full_finetune", "linear_probe"])
@pytest.mark.parametrize("loss", ["ce", "pgd_at", "trades"])
def test_fit_every_loss_and_strategy(tmp_path, mini_dir, loss, strategy):
    monitor = ["monitor.metric=val/adv_acc", "monitor.mode=max"] if loss in AT_LOSSES else []
    layout = f"channels_last={loss == 'trades'}"  # TRADES runs channels_last, the others contiguous
    cfg = compose_train(tmp_path, mini_dir, f"loss={loss}", f"strategy={strategy}", "debug=fdr", layout, *monitor,
                        *FAST)
    value = train(cfg)
    assert 0.0 <= value <= 1.0 if loss in AT_LOSSES else math.isfinite(value)
    _, meta = load_with_meta(tmp_path)
    assert (meta["loss"]["name"], meta["strategy"], meta["dataset"]) == (loss, strategy, "digits")
    assert meta["weights"] == "final"  # fast_dev_run writes no checkpoint


def test_unlogged_monitor_metric_is_a_clear_error(tmp_path, mini_dir):
    cfg = compose_train(tmp_path, mini_dir, "debug=fdr", *FAST, "monitor.metric=val/adv_acc")
    with pytest.raises(TrainingConfigError, match="'val/adv_acc' was never logged; logged: .*val/loss"):
        train(cfg)


@pytest.mark.parametrize("strategy", ["linear_probe", "full_finetune"])
def test_linear_probe_leaves_backbone_parameters_and_bn_buffers_unchanged(tmp_path, mini_dir, strategy):
    torch.manual_seed(3)
    source = timm.create_model("test_resnet", pretrained=False).state_dict()
    weights = tmp_path / "backbone.safetensors"
    safetensors.torch.save_file(source, str(weights))
    run_dir = tmp_path / "run"
    cfg = compose_train(
        run_dir, mini_dir, f"strategy={strategy}", "loss=trades", "loss.attack.n_iter=2", "debug=limit",
        "trainer.max_epochs=1", "model.pretrained=true", f"model.weights={weights}", *FAST,
    )
    train(cfg)
    trained = load(run_dir).backbone.state_dict()
    backbone_keys = [k for k in source if not k.startswith("fc.")]
    unchanged = [k for k in backbone_keys if torch.equal(trained[k], source[k])]
    bn_stats = [k for k in backbone_keys if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    if strategy == "linear_probe":
        assert unchanged == backbone_keys
        L.seed_everything(cfg.seed)
        initial_head = create_model("test_resnet", 10, weights=str(weights)).classifier.weight
        assert not torch.equal(trained["fc.weight"], initial_head)
    else:  # the same check fails for full fine-tuning: it can tell
        assert not set(bn_stats) & set(unchanged)


def test_wandb_offline_writes_run_files_and_always_closes(tmp_path, mini_dir, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_train(tmp_path, mini_dir, "logger=wandb", "debug=limit", "trainer.max_epochs=1", *FAST)
    train(cfg)
    assert wandb.run is None
    wandb.teardown()  # the service may still be writing the record file after finish() under load
    run_id = stable_run_id(tmp_path)
    (run_file,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    record = run_file.read_bytes()
    for key in (b"effective_batch_size", b"val/acc", b"best/val/loss"):  # config, metrics, final summary
        assert key in record, key
    assert read_metrics(tmp_path)

    failing = compose_train(tmp_path / "failing", mini_dir, "logger=wandb", "debug=fdr", *FAST, "monitor.metric=typo")
    with pytest.raises(TrainingConfigError, match="typo"):
        train(failing)
    assert wandb.run is None


@pytest.mark.slow
def test_compiled_model_trains_and_exports_plain_keys(tmp_path, mini_dir):
    train(compose_train(tmp_path, mini_dir, "compile=true", "debug=fdr", *FAST))
    assert load(tmp_path).recipe["name"] == "test_resnet"  # strict load: no _orig_mod key prefixes


# ---------------------------------------------------------------- processes


def run_train_py(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_ddp_on_two_cpu_processes(tmp_path, mini_dir):
    run_dir = tmp_path / "ddp"
    run_train_py(
        "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true", "debug=limit",
        "effective_batch_size=64", f"data.source={mini_dir}", f"paths.root_dir={tmp_path}",
        f"hydra.run.dir={run_dir}", *FAST,
    )
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    # 3 batches of 16 per process and epoch, 2 processes: 64 images = 2 micro-batches, so 2 steps per epoch
    # (one process would accumulate 4 micro-batches: 1 step per epoch).
    assert (ckpt["epoch"], ckpt["global_step"]) == (1, 4)
    assert (run_dir / "model.safetensors").is_file()


@pytest.mark.slow
def test_multirun_through_submitit_local(tmp_path, mini_dir):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    run_train_py(
        "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", "loss=ce,pgd_at", "debug=fdr",
        f"data.source={mini_dir}", f"paths.root_dir={tmp_path}", f"hydra.sweep.dir={sweep}", *FAST,
    )
    losses = [json.loads((sweep / str(job) / "model.json").read_text())["loss"]["name"] for job in (0, 1)]
    assert losses == ["ce", "pgd_at"]


# ---------------------------------------------------------------- learning checks


def split_accuracy(model, loader, attack=None):
    """Accuracy over a whole split, optionally under `attack`."""
    correct = total = 0
    for x, y, _ in loader:
        if attack is not None:
            x = attack(model, x, y)
        with torch.no_grad():
            correct += (model(x).argmax(1) == y).sum().item()
        total += len(y)
    return correct / total


def mini_test_loader(mini_dir):
    data = compose_config("train", f"data.source={mini_dir}").data
    return hydra.utils.instantiate(data).eval_dataloader("test")


@pytest.mark.slow
def test_default_ce_run_reaches_90_percent_clean_test_accuracy(tmp_path, mini_dir):
    train(compose_train(tmp_path, mini_dir))
    accuracy = split_accuracy(load(tmp_path), mini_test_loader(mini_dir))
    print(f"default CE run: clean test accuracy {accuracy:.3f}")
    assert accuracy >= 0.9


@pytest.mark.slow
def test_trades_is_robust_to_its_inner_attack(tmp_path, mini_dir):
    train(compose_train(tmp_path, mini_dir, "loss=trades"))
    model, loader = load(tmp_path), mini_test_loader(mini_dir)
    clean = split_accuracy(model, loader)
    robust = split_accuracy(model, loader, attack=InnerAttack())
    print(f"TRADES run: clean test accuracy {clean:.3f}, under the inner attack {robust:.3f}")
    assert robust >= 0.2  # the same attack leaves a CE-trained model at 0.0


@pytest.mark.slow
@pytest.mark.parametrize("overlay, metric, best_of, extra", [
    ("optuna", "val/loss", min, []),
    ("optuna_robust", "val/robust_score", max, ["callbacks.robust_val.n_images=16", "callbacks.robust_val.n_iter=10"]),
])
def test_optuna_sweep_runs_trials_and_reports_the_best_monitored_value(tmp_path, mini_dir, overlay, metric, best_of,
                                                                     extra):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "sweep"
    run_train_py(
        "-m", f"hparams_search={overlay}", "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.n_startup_trials=2",
        "debug=limit", f"data.source={mini_dir}", f"paths.root_dir={tmp_path}", f"hydra.sweep.dir={sweep}", *FAST,
        *extra,
    )
    trials = [json.loads((sweep / str(i) / "model.json").read_text()) for i in range(2)]
    assert trials[0]["optim"]["backbone_lr"] != trials[1]["optim"]["backbone_lr"]  # the sampler chose each trial
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    chosen = best_of(trials, key=lambda t: t["monitor_value"])
    assert all(t["monitor"] == metric for t in trials)
    assert best["best_value"] == pytest.approx(chosen["monitor_value"])  # what train() returned is what was optimised
    assert best["best_params"]["optim.backbone_lr"] == pytest.approx(chosen["optim"]["backbone_lr"])


# ---------------------------------------------------------------- robust validation (issue 12 items 2 and 3)

ROBUST = ["callbacks=robust_val", "callbacks.robust_val.n_images=16", "callbacks.robust_val.n_iter=10", "debug=limit",
          "trainer.max_epochs=3", *FAST]


def subset_robust_accuracy(model, mini_dir, eps, n_images, n_iter, seed=0):
    """AutoAttack APGD-CE at Linf `eps` on the callback's seeded validation subset, recomputed here."""
    from rgb.attacks.autoattack import AutoAttack

    data = hydra.utils.instantiate(compose_config("train", f"data.source={mini_dir}").data)
    split = data.split("validation")
    picked = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))[:n_images].sort().values
    x = torch.stack([split[int(i)][0] for i in picked])
    y = torch.tensor([split[int(i)][1] for i in picked])
    attack = AutoAttack(model, "Linf", eps, attacks=["apgd-ce"], seed=seed, steps=n_iter)
    return attack.run(x, y).robust_accuracy


def test_robust_validation_logs_its_metric_and_selects_the_checkpoint(tmp_path, mini_dir):
    # A small budget and more batches per epoch: robust accuracy moves between epochs, so the choice is a real one.
    cfg = compose_train(tmp_path, mini_dir, *ROBUST, "monitor.metric=val/robust_acc_linf", "monitor.mode=max",
                        "data.budgets.linf=0.002", "trainer.limit_train_batches=8")
    value = train(cfg)
    rows = [row for row in read_metrics(tmp_path) if row.get("val/robust_acc_linf")]
    assert [row["epoch"] for row in rows] == ["0", "1", "2"]
    robust = [float(row["val/robust_acc_linf"]) for row in rows]
    for row, acc in zip(rows, robust):
        assert 0 <= acc <= 1 and float(row["val/robust_seconds"]) > 0
        assert float(row["val/robust_score"]) == pytest.approx(0.5 * float(row["val/acc"]) + 0.5 * acc)
    assert len(set(robust)) > 1, robust
    model, meta = load_with_meta(tmp_path)
    best_epoch = robust.index(max(robust))
    assert value == meta["monitor_value"] == pytest.approx(max(robust))
    assert (meta["monitor"], Path(meta["checkpoint"]).name) == ("val/robust_acc_linf", f"best-epoch{best_epoch:03d}.ckpt")
    assert subset_robust_accuracy(model, mini_dir, 0.002, 16, 10) == pytest.approx(max(robust))  # exported = selected epoch


def test_robust_validation_every_n_epochs_and_a_mismatched_checkpoint_cadence(tmp_path, mini_dir):
    train(compose_train(tmp_path, mini_dir, *ROBUST, "callbacks.robust_val.every_n_epochs=2"))
    logged = [row["epoch"] for row in read_metrics(tmp_path) if row.get("val/robust_acc_linf")]
    assert logged == ["1"]  # epochs 0 and 2 skipped; val/loss still selects among epoch 1 only
    with pytest.raises(TrainingConfigError, match="runs every 1 epoch.*robust validation every 2"):
        train(compose_train(tmp_path / "mismatch", mini_dir, *ROBUST, "callbacks.robust_val.every_n_epochs=2",
                            "callbacks.best_checkpoint.every_n_epochs=1", "monitor.metric=val/robust_acc_linf",
                            "monitor.mode=max"))
    assert not (tmp_path / "mismatch").exists()


@pytest.mark.slow
def test_robust_validation_fast_version_on_two_norms(tmp_path, mini_dir):
    cfg = compose_train(tmp_path, mini_dir, *ROBUST, "trainer.max_epochs=1", "callbacks.robust_val.version=fast",
                        "callbacks.robust_val.attacks=null", "callbacks.robust_val.norms=[linf,l2]",
                        "callbacks.robust_val.n_images=8")
    train(cfg)
    (row,) = [row for row in read_metrics(tmp_path) if row.get("val/robust_acc_linf")]
    assert 0 <= float(row["val/robust_acc_l2"]) <= 1


@pytest.mark.parametrize("override, message", [
    ("callbacks.robust_val.version=bogus", "version must be one of"),
    ("callbacks.robust_val.attacks=[square-x]", "must be a non-empty subset"),
    ("callbacks.robust_val.n_images=0", "n_images must be an integer >= 1"),
    ("callbacks.robust_val.norms=[l3]", "norm must be one of"),
    ("callbacks.robust_val.clean_weight=2", "clean_weight must be a number in"),
])
def test_robust_validation_settings_are_refused_in_one_line(tmp_path, mini_dir, override, message):
    with raises_one_line(TrainingConfigError, match=message) as err:
        train(compose_train(tmp_path, mini_dir, *ROBUST, override))
    assert not (tmp_path / "run.json").exists()
