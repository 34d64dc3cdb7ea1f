"""Every config under conf/ for training composes, resolves and instantiates; each experiment runs once."""

import hashlib
import json
import math
from pathlib import Path

import hydra
import pytest
import timm
import torch
from lightning.pytorch import Trainer
from omegaconf import OmegaConf

from helpers import CONF, FAST, compose_config
from rgb.models import NormalizedClassifier, check_model_name
from rgb.commands.train import train, training_request
from rgb.training import LOSSES

# Presets small enough to build (random init) in a test; the others only have their timm name checked.
BUILDABLE = {"tiny", "efficientnet_b0", "regnetx_004", "mobilenetv3", "resnet50", "deit_s", "vit_s16", "convnext_t"}
PAPER_OPTIM = dict(backbone_lr=1.2165e-4, head_lr=3.996e-3, backbone_weight_decay=1.001e-6, head_weight_decay=1.619e-5)


def options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))


def test_plain_train_defaults_are_the_tiny_demo_with_paper_optimiser():
    cfg = compose_config("train")
    assert (cfg.model.name, cfg.model.pretrained) == ("test_resnet", False)
    assert (cfg.loss.name, cfg.strategy.name) == ("ce", "full_finetune")
    assert {k: cfg.optim[k] for k in PAPER_OPTIM} == PAPER_OPTIM
    assert list(cfg.optim.betas) == [0.9, 0.95] and cfg.optim.scheduler is None
    assert (cfg.monitor.metric, cfg.monitor.mode, cfg.ckpt_path) == ("val/loss", "min", "auto")


def test_run_dir_is_stable_and_named_after_model_loss_strategy():
    cfg = compose_config("train", "loss=trades", "strategy=linear_probe", return_hydra_config=True)
    # the run store's layout (rgb.runs.store.output_dir_for): <outputs>/train/<dataset id>/<run name>
    assert Path(cfg.hydra.run.dir) == Path("outputs/train/digits/test_resnet-trades-linear_probe-e10-s0")
    assert OmegaConf.to_container(cfg.hydra.sweep)["subdir"] == "${hydra.job.num}"


def timm_presets():
    """Model presets of the timm family (the open_clip ones are tested in tests/test_zeroshot_openclip.py)."""
    return [o for o in options("model") if compose_config("train", f"model={o}").model.get("_target_") == "rgb.models.create_model"]


@pytest.mark.parametrize("preset", timm_presets())
def test_model_preset_names_a_timm_model(preset):
    cfg = compose_config("train", f"model={preset}")
    check_model_name(cfg.model.name)
    assert cfg.model.num_classes == 10 and cfg.model.weights is None
    if preset == "clip_vit_b16":  # CLIP statistics come from timm's config, not from the name
        assert timm.models.get_pretrained_cfg(cfg.model.name).mean == pytest.approx((0.4815, 0.4578, 0.4082), abs=1e-4)
    if preset in BUILDABLE:
        model = hydra.utils.instantiate(cfg.model, pretrained=False)
        assert isinstance(model, NormalizedClassifier)
        with torch.no_grad():
            assert model.eval()(torch.rand(1, 3, 32, 32)).shape == (1, 10)


@pytest.mark.parametrize(
    "group, option", [(g, o) for g in ("loss", "strategy", "optim", "callbacks", "logger", "debug") for o in options(g)]
)
def test_group_option_composes_and_instantiates(group, option, tmp_path):
    cfg = compose_config("train", f"{group}={option}", f"run_dir={tmp_path}")
    OmegaConf.resolve(cfg)
    for node in list((cfg.callbacks or {}).values()) + list((cfg.logger or {}).values()):
        hydra.utils.instantiate(node)
    assert cfg.loss.name in LOSSES and cfg.strategy.name == (option if group == "strategy" else "full_finetune")


# Prefixed ids: conftest would read a bare "gpu" id as the gpu mark and skip it without CUDA.
@pytest.mark.parametrize("option", options("trainer"), ids=lambda o: f"trainer_{o}")
def test_trainer_option_instantiates(option, tmp_path):
    cfg = compose_config("train", f"trainer={option}", f"run_dir={tmp_path}")  # on the CPU: a test default
    trainer = hydra.utils.instantiate(cfg.trainer)
    assert isinstance(trainer, Trainer) and not cfg.trainer.inference_mode
    if option in ("gpu", "ddp"):
        assert cfg.trainer.precision == "bf16-mixed"


def test_linear_probe_strategy_sets_the_paper_lp_head_values():
    cfg = compose_config("train", "strategy=linear_probe")
    assert (cfg.optim.head_lr, cfg.optim.head_weight_decay) == (1.2165e-4, 7.61e-4)
    assert compose_config("train", "strategy=linear_probe", "optim.head_lr=0.5").optim.head_lr == 0.5


def test_slurm_launcher_lets_submitit_requeue_with_one_task_per_gpu():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")  # hydra/launcher=slurm: the launcher's config
    site = "++local.slurm.partition=gpu-long"  # what conf/local/default.yaml (git-ignored) provides
    cfg = compose_config("train", "hydra/launcher=slurm", "trainer=ddp", "trainer.devices=8", site, return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.max_num_timeout > 0
    assert launcher.tasks_per_node == launcher.gpus_per_node == 8
    assert launcher.partition == "gpu-long"


def test_optuna_overlay_minimises_the_validation_loss():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    cfg = compose_config("train", "hparams_search=optuna", return_hydra_config=True)
    assert cfg.hydra.sweeper.direction == "minimize" and cfg.monitor.metric == "val/loss"
    assert "optim.backbone_lr" in cfg.hydra.sweeper.params


def test_robust_optuna_overlay_maximises_the_clean_robust_score():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    cfg = compose_config("train", "hparams_search=optuna_robust", "callbacks.robust_val.every_n_epochs=2", return_hydra_config=True)
    assert cfg.hydra.sweeper.direction == "maximize" and (cfg.monitor.metric, cfg.monitor.mode) == ("val/robust_score", "max")
    assert cfg.callbacks.robust_val._target_.endswith("RobustValidation") and "optim.head_lr" in cfg.hydra.sweeper.params
    assert cfg.callbacks.best_checkpoint.every_n_epochs == 2  # checkpoints only where the robust score is fresh


EXPERIMENTS = {
    "fft50_trades": ("trades", "full_finetune", 50),
    "fft50_pgd_at": ("pgd_at", "full_finetune", 50),
    "fft5_trades": ("trades", "full_finetune", 5),
    "lp50_trades": ("trades", "linear_probe", 50),
}


def test_every_experiment_is_listed():
    assert set(options("experiment")) == set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
def test_experiment_runs_once_with_fast_dev_run(experiment, tmp_path, mini_dir):
    cfg = compose_config("train", f"experiment={experiment}", f"run_dir={tmp_path}", f"data.source={mini_dir}", "debug=fdr",
                        *FAST)
    assert (cfg.loss.name, cfg.strategy.name, cfg.trainer.max_epochs) == EXPERIMENTS[experiment]
    assert cfg.effective_batch_size == 1024
    assert math.isfinite(train(cfg))


# sha256 of json.dumps(identity) of `make demo`'s two train runs, computed by rgb.training.config.training_identity
# before the request became typed sections (issue 45): the run dirs of before must keep resuming.
DEMO_IDENTITIES = {
    ("run_name=demo",): "6482a3016e37a42c56598ec7eddb5e7954e800ed35a96570a21022045e62e0cd",
    ("model=openclip_mini", "strategy=zeroshot", "prompts=cpe", "run_name=demo_zeroshot"):
        "dde27cba19fa2baa3be71679309f4807a6a1869bb6ddeb37deef8b8d06e7c4a3",
}


@pytest.mark.parametrize("overrides", list(DEMO_IDENTITIES))
def test_the_identity_of_the_demo_runs_is_unchanged(overrides):
    identity = training_request(compose_config("train", "run_dir=outputs/demo", *overrides)).identity
    assert hashlib.sha256(json.dumps(identity).encode()).hexdigest() == DEMO_IDENTITIES[overrides]
