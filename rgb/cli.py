"""The command-line entry points (`rgb-train`, `rgb-attack`, `rgb-evaluate`, `rgb-transfer`, and the thin
train.py / attack.py / evaluate.py of the repository): one place that registers the config resolvers, sets the
CPU threads, fills `data=` from the model when it is not given, and turns every user-facing error into one line.

Heavy libraries (torch, Lightning, timm, datasets) are imported inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from rgb.core.configs import config_dir, data_config_for, data_configs

log = logging.getLogger("rgb")
CONFIG_DIR = str(config_dir())


def _run_name(path) -> str:
    from rgb.runs.settings import run_name_for

    return run_name_for(path)


def register_resolvers() -> None:
    """Every `${rgb.*:...}` interpolation of conf/ (idempotent; tests that compose configs call it too)."""
    from rgb.data.resolvers import register_resolvers as register_data_resolvers

    OmegaConf.register_new_resolver("rgb.run_name", _run_name, replace=True)
    register_data_resolvers()


HELP_FLAGS = ("--help", "-h", "--hydra-help")
INSPECTION_FLAGS = ("--cfg", "-c", "--info", "-i")


def _asks_for_help(argv: list[str]) -> bool:
    """Hydra's help does not resolve interpolations: the resolvers' imports are skipped then."""
    return any(a in HELP_FLAGS for a in argv)


# Exceptions that are the user's to fix (bad input, a refused result): shown as one line, never as a traceback.
USER_ERRORS = (
    ("rgb.core.machine", "DeviceError"), ("rgb.data.benchmark", "BenchmarkError"),
    ("rgb.runs.settings", "AttackRunError"), ("rgb.attacks.common", "AttackError"),
    ("rgb.models.factory", "WeightsMismatchError"), ("rgb.zeroshot.prompts", "PromptError"),
    ("rgb.zeroshot.ensembles", "EnsembleError"), ("rgb.zeroshot.perturb", "PerturbationError"),
    ("rgb.training.config", "TrainingError"), ("rgb.evaluation.model_eval", "EvaluationError"),
    ("rgb.evaluation.leaderboard", "LeaderboardError"), ("rgb.evaluation.records", "RecordError"),
)


def user_errors() -> tuple[type[BaseException], ...]:
    from importlib import import_module

    return (FileNotFoundError, *(getattr(import_module(module), name) for module, name in USER_ERRORS))


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _infer_data_override(argv: list[str]) -> list[str]:
    """`data=` from the run's model.json when the user names a run but no data config (attack/evaluate)."""
    if any(a.split("=", 1)[0].lstrip("+~") == "data" for a in argv):
        return argv
    run = next((a.split("=", 1)[1] for a in argv if a.startswith("run=")), None)
    if not run:
        return argv
    path = Path(run)
    meta_file = path / "model.json" if path.is_dir() else path.with_suffix(".json")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError):
        return argv
    dataset, source = meta.get("dataset"), meta.get("data_source")
    name = data_config_for(dataset)
    if name:
        return argv + [f"data={name}"]
    if dataset and source and Path(source).expanduser().is_dir():  # an imported dataset (rgb.data.import_folder)
        return argv + ["data=custom", f"data.source={source}", f"data.dataset={dataset}"]
    return argv


def _command(name: str, config_name: str, body: Callable[[DictConfig, int], object], infer_data: bool):
    """A Hydra main for `body(cfg, threads)` with the shared start-up and one-line errors."""

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)
    def main(cfg: DictConfig):
        from rgb.core.machine import configure_threads

        errors = user_errors()
        try:
            threads = configure_threads(cfg.get("threads", "auto"))
            return body(cfg, threads)
        except errors as err:
            log.error("%s: error: %s", name, _one_line(err))
            sys.exit(2)

    def entry() -> None:
        if infer_data:
            sys.argv[1:] = _infer_data_override(sys.argv[1:])
        argv = sys.argv[1:]
        if not _asks_for_help(argv):
            register_resolvers()
            inspecting = any(a in INSPECTION_FLAGS for a in argv)
            problem = None if inspecting else _missing_required(config_name, argv) or _compose_error(config_name, argv)
            if problem:
                sys.exit(f"{name}: error: {problem}")
        main()

    entry.__name__ = name.replace("-", "_")
    return entry


def _compose_error(config_name: str, argv: list[str]) -> str | None:
    """Compose the config once before Hydra runs it: an unknown option, a base config used as a dataset or a
    broken interpolation is one line here instead of Hydra's multi-line report or traceback."""
    if any(a in ("-m", "--multirun") or a.startswith(("--config", "-c", "-cp", "-cn")) for a in argv):
        return None  # sweeps and other config dirs: Hydra itself reports those
    overrides = [a for a in argv if not a.startswith("-")]
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == "data" and value.startswith("_"):
            return (f"data={value} holds the settings shared by the real datasets and is not one: use one of "
                    f"{', '.join(sorted(data_configs().values()))}")
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name=config_name):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        OmegaConf.to_container(cfg.data, resolve=True)
        str(cfg.hydra.run.dir)
    except Exception as err:  # any composition failure is the user's config: shown, not raised
        return f"config: {_one_line(err).split(' Config search path:')[0]}"
    return None


def _missing_required(config_name: str, argv: list[str]) -> str | None:
    """Hydra reports a missing `run=` as a 230-line traceback; say it in one line before it starts."""
    keys = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
    if config_name in ("attack", "transfer") and "run" not in keys:
        return "no model given: pass run=<train output dir or exported .safetensors file>"
    if config_name == "evaluate" and not keys & {"run", "pool"}:
        return "nothing to evaluate: give run=<train output dir or .safetensors> or pool=[DIR,...]"
    return None


def _train(cfg: DictConfig, threads: int):
    from rgb.training import train

    return train(cfg)


def _attack(cfg: DictConfig, threads: int):
    from rgb.runs.runner import attack_from_config

    summaries = attack_from_config(cfg, threads=threads)
    # For sweepers: the lowest robust accuracy over the merged norms (None while shards are still missing).
    return min((s.robust_accuracy for s in summaries.values()), default=None)


def _evaluate(cfg: DictConfig, threads: int):
    from rgb.evaluation.run import run_evaluation

    return run_evaluation(cfg)


def _transfer(cfg: DictConfig, threads: int):
    from rgb.runs.transfer import make_transfer_splits

    make_transfer_splits(cfg, threads=threads)


train_main = _command("train.py", "train", _train, infer_data=False)
attack_main = _command("attack.py", "attack", _attack, infer_data=True)
evaluate_main = _command("evaluate.py", "evaluate", _evaluate, infer_data=True)
transfer_main = _command("rgb-transfer", "transfer", _transfer, infer_data=True)
