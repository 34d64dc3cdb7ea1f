"""The command-line entry points (`rgb-train`, `rgb-attack`, `rgb-evaluate`, `rgb-transfer`, and the thin
train.py / attack.py / evaluate.py of the repository): one place that registers the config resolvers, sets the
CPU threads, fills `data=` from the model when it is not given, and turns every user-facing error into one line.

Heavy libraries (torch, Lightning, timm, datasets) are imported inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from rgb.core.configs import config_dir, data_config_for, data_configs

log = logging.getLogger("rgb")
CONFIG_DIR = str(config_dir())


def _run_name(path) -> str:
    from rgb.runs.store import run_name_for

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
    ("rgb.models.factory", "WeightsMismatchError"), ("rgb.models.factory", "ModelLoadError"),
    ("rgb.core.files", "CorruptFileError"), ("rgb.zeroshot.prompts", "PromptError"),
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
    path = Path(run.split(",")[0])  # a sweep over models (runs=): they share a dataset
    meta_file = path / "model.json" if path.is_dir() else path.with_suffix(".json")
    try:
        dataset = json.loads(meta_file.read_text()).get("dataset")
    except (OSError, ValueError):
        return argv
    name = data_config_for(dataset)
    return argv + [f"data={name}"] if name else argv


# Config choices that need an optional extra: (group, option or None for any) -> (plugin module, extra).
EXTRAS = {
    ("hydra/launcher", "slurm"): ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    ("hydra/launcher", "submitit_slurm"): ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    ("hydra/launcher", "submitit_local"): ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    ("attack", "slurm"): ("hydra_plugins.hydra_submitit_launcher", "slurm"),
    ("hparams_search", None): ("hydra_plugins.hydra_optuna_sweeper", "sweep"),
}


def _missing_extra(argv: list[str]) -> str | None:
    """A launcher or sweeper that is not installed: the pip line, instead of Hydra's "Could not load" report."""
    from importlib.util import find_spec

    for arg in argv:
        group, _, option = arg.lstrip("+~").partition("=")
        needed = EXTRAS.get((group, option)) or EXTRAS.get((group, None))
        if needed and option not in ("", "null") and find_spec(needed[0]) is None:
            return f"{group}={option} needs the optional extra: pip install 'robustgenbench[{needed[1]}]'"
    return None


def _expand_runs(argv: list[str]) -> list[str]:
    """attack.py `runs=SWEEP_DIR` (or a glob of run dirs): one multirun job per model, as `run=A,B,...` (times
    the shards under attack=slurm: one array), its logs in one sweep dir named after the train sweep."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("runs=")]
    if not given:
        return argv
    if not any(a in ("-m", "--multirun") for a in argv):
        raise ValueError("runs= attacks every model of a sweep as one multirun: add -m (and attack=slurm for SLURM)")
    from rgb.runs.store import model_record, train_runs

    runs = train_runs(given[-1])
    if not runs:
        raise ValueError(f"runs={given[-1]} names no trained model (no model.json in it or in its job dirs)")
    odd = [str(r) for r in runs if not re.fullmatch(r"[\w./-]+", str(r))]  # one Hydra sweep value each
    if odd:
        raise ValueError(f"runs=: rename {odd[0]}: a run path may hold letters, digits, '/', '-', '_' and '.'")
    sweep = (model_record(runs[0]) or {}).get("sweep") or {}
    label = sweep.get("name") or Path(given[-1].rstrip("/*")).name
    return [*argv, "run=" + ",".join(str(r) for r in runs),
            f"sweep_dir=${{paths.output_dir}}/attack/${{data.dataset}}/multirun/{label}"]


def _log_to_files(cfg: DictConfig) -> None:
    """A command's log file (Hydra's <job>.log) holds all it said: warnings, Lightning's lines (Lightning keeps
    them to itself when it was imported before Hydra set up logging, as in a SLURM job) and, file only so that
    the console stays short, the composed config."""
    logging.captureWarnings(True)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if not logger.propagate:
            logger.handlers.clear()
            logger.propagate = True
    try:
        composed = OmegaConf.to_yaml(cfg, resolve=True)
    except Exception:  # an interpolation only the command itself can report (it will): the config as written
        composed = OmegaConf.to_yaml(cfg)
    record = logging.LogRecord(log.name, logging.INFO, __file__, 0, "composed config:\n%s", (composed,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _command(name: str, config_name: str, body: Callable[[DictConfig, int], object], infer_data: bool):
    """A Hydra main for `body(cfg, threads)` with the shared start-up and one-line errors."""

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)
    def main(cfg: DictConfig):
        from rgb.core.machine import configure_threads

        _log_to_files(cfg)
        errors = user_errors()
        try:
            threads = configure_threads(cfg.get("threads", "auto"))
            return body(cfg, threads)
        except errors as err:
            log.error("%s: error: %s", name, _one_line(err))
            sys.exit(2)

    def entry() -> None:
        missing = _missing_extra(sys.argv[1:])
        if missing:
            sys.exit(f"{name}: error: {missing}")
        if config_name == "attack":
            try:
                sys.argv[1:] = _expand_runs(sys.argv[1:])
            except ValueError as err:
                sys.exit(f"{name}: error: {err}")
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
