"""The command-line entry points (`rgb-train`, `rgb-attack`, `rgb-evaluate`, `rgb-transfer`, `rgb-serve`, and the thin
train.py / attack.py / evaluate.py of the repository): one place that registers the config resolvers, sets the
CPU threads, fills `data=` from the model when it is not given, and turns every user-facing error into one line.

Each command's body (rgb/commands/<command>.py) turns the composed config into the typed values the library takes.
Heavy libraries (torch, Lightning, timm, datasets) are imported inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from rgb.commands import schema
from rgb.commands.resolvers import register_resolvers
from rgb.core.configs import config_dir, data_config_for, data_configs
from rgb.core.errors import UserError, one_line
from rgb.core.files import unwritable
from rgb.core.secrets import redact
from rgb.core.values import ConfigValueError

log = logging.getLogger("rgb")
CONFIG_DIR = str(config_dir())

# Before torch loads libgomp: an OpenMP thread waiting at a barrier spins 300,000 times by default, so beside other
# CPU-bound jobs a 2-thread process spends its time slices spinning for a descheduled partner (the demo's training:
# 15 s alone, 145 s beside two busy loops). 3,000 spins keep the speed alone and give 30 s there
# (docs/performance.md, issue 24). A user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")


HELP_FLAGS = ("--help", "-h", "--hydra-help")
INSPECTION_FLAGS = ("--cfg", "-c", "--info", "-i")


def _asks_for_help(argv: list[str]) -> bool:
    """Hydra's help does not resolve interpolations: the resolvers' imports are skipped then."""
    return any(a in HELP_FLAGS for a in argv)


# OSErrors that are the user's machine, not a bug: shown as one line with what to do.
OS_ERRORS = {
    errno.ENOSPC: "the disk is full: free space or point paths.output_dir elsewhere",
    errno.EDQUOT: "the disk quota is used up: free space or point paths.output_dir elsewhere",
    errno.EROFS: "a read-only filesystem: point paths.output_dir (or output_dir) to a writable place",
    errno.EACCES: "no permission: point paths.output_dir (or output_dir) to a writable place",
    errno.EPERM: "not permitted: point paths.output_dir (or output_dir) to a writable place",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EISDIR: "a directory where a file is expected",
    errno.ENAMETOOLONG: "a name too long for the filesystem: choose a shorter run_name",
}


def os_error_line(err: OSError) -> str | None:
    """One line for an OSError the user can act on (full disk, read-only or unwritable place), else None."""
    hint = OS_ERRORS.get(err.errno)
    if hint is None:
        return None
    where = " -> ".join(str(f) for f in (err.filename, err.filename2) if f)
    return f"{err.strerror}{f': {where}' if where else ''} ({hint})"


def _error_line(err: Exception) -> str | None:
    """The one line for an exception that is the user's to fix; None for a bug (it keeps its traceback)."""
    if isinstance(err, (UserError, FileNotFoundError)):
        return one_line(err)
    if isinstance(err, OSError):
        return os_error_line(err)
    cause = _user_error_in(err)
    return one_line(cause) if cause is not None else None


def program(default: str) -> str:
    """The command as the user typed it: `rgb-attack` or `attack.py`."""
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else default


# Overrides (and environment variables) that choose where the data is read from: the user's choice beats the run's.
# The paths.* keys (and RGB_ROOT) move only a data config whose source reads ${paths...} (mini), RGB_BENCHMARK only
# one whose source reads it (the card's datasets): naming another dataset's path keeps the run's recorded source.
SOURCE_KEYS = ("data.source", "paths.mini_dir", "paths.data_dir", "paths.root_dir")
SOURCE_ENV = ("RGB_BENCHMARK", "RGB_ROOT")


def _source_choices(name: str) -> tuple[list[str], list[str]]:
    """(override keys, environment variables) that choose data config `name`'s source (its yaml's, else the
    `_benchmark` default's `source` value read as text)."""
    source = ""
    for stem in (name, "_benchmark"):
        path = config_dir() / "data" / f"{stem}.yaml"
        source = str((yaml.safe_load(path.read_text()) or {}).get("source", "")) if path.is_file() else ""
        if source:
            break
    by_paths = "${paths." in source  # paths.mini_dir follows paths.data_dir, paths.root_dir and $RGB_ROOT
    keys = [k for k in SOURCE_KEYS if k == "data.source" or by_paths]
    return keys, [v for v in SOURCE_ENV if v in source or (v == "RGB_ROOT" and by_paths)]


# What the last _infer_from_run decided about the data source, logged once the command runs.
_source_note: list[str] = []


def _infer_from_run(argv: list[str]) -> list[str]:
    """`data=` and `data.source=` from the run's model.json when the user names a run but not those (attack,
    evaluate, transfer): a model trained on `paths.mini_dir=DIR` is attacked on DIR, not on the default. The
    overrides go next to `run=`, so Hydra's flags (`--cfg job --resolve`) may come before or after them."""
    _source_note.clear()
    keys = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a and not a.startswith("-")}
    position = next((i for i, a in enumerate(argv) if a.startswith("run=")), None)
    if position is None:
        return argv
    from rgb.core.exportfiles import ExportFileError, export_paths, read_model_record

    _, meta_file = export_paths(argv[position].split("=", 1)[1].split(",")[0])  # runs= a sweep over models: one dataset
    try:
        record = read_model_record(meta_file)
    except ExportFileError:  # absent or unreadable: the command names it when it loads the model
        return argv
    dataset, source = record.get("dataset"), record.get("data_source")
    name = data_config_for(dataset)
    given = next((a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].lstrip("+~") == "data"), None)
    if name is None and given is None and dataset and source and Path(source).expanduser().is_dir():
        # an imported dataset (rgb.data.import_folder): its snapshot names the classes and the image size
        added = ["data=custom", f"data.source={_quoted(source)}", f"data.dataset={dataset}"]
        return [*argv[:position + 1], *added, *argv[position + 1:]]
    added = [f"data={name}"] if given is None and name else []
    if source and name and (given or name) == name:
        source_keys, source_env = _source_choices(name)
        chosen = [k for k in source_keys if k in keys] + [f"${v}" for v in source_env if v in os.environ]
        if chosen:
            _source_note.append(f"given by {', '.join(chosen)} (the run was trained on {source})")
        else:
            added.append(f"data.source={_quoted(source)}")
            _source_note.append(f"recorded in {meta_file}")
    return [*argv[:position + 1], *added, *argv[position + 1:]]


def _quoted(value: str) -> str:
    """A path as a Hydra override value (quoted when it holds characters the override grammar reads)."""
    if all(c.isalnum() or c in "._-/:@+~" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Jobs of a sweep run by this process that failed with a user error: the other jobs still run, then these are named.
_failed_jobs: list[str] = []
_ENTRY_PID = os.getpid()


def _in_local_sweep() -> bool:
    """A multirun job of this very process (the basic launcher): its failure must not end the other jobs."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN and os.getpid() == _ENTRY_PID


def _sweeper_needs_values() -> bool:
    """A sweeper that chooses the next job from the values of the last (Optuna): a failed job leaves its trial
    without one, so the study cannot go on (it would fail later, with a traceback, on a study without a value)."""
    from hydra.core.hydra_config import HydraConfig

    return not str(HydraConfig.get().sweeper.get("_target_", "")).endswith("BasicSweeper")


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
        raise ConfigValueError("runs= attacks every model of a sweep as one multirun: add -m (and attack=slurm for SLURM)")
    from rgb.core.exportfiles import model_record
    from rgb.runs.store import sweep_dir_for, train_runs

    runs = train_runs(given[-1])
    if not runs:
        raise ConfigValueError(f"runs={given[-1]} names no trained model (no model.json in it or in its job dirs)")
    odd = [str(r) for r in runs if not re.fullmatch(r"[\w./-]+", str(r))]  # one Hydra sweep value each
    if odd:
        raise ConfigValueError(f"runs=: rename {odd[0]}: a run path may hold letters, digits, '/', '-', '_' and '.'")
    sweep = (model_record(runs[0]) or {}).get("sweep") or {}
    label = sweep.get("name") or Path(given[-1].rstrip("/*")).name
    return [*argv, "run=" + ",".join(str(r) for r in runs),
            f"sweep_dir={sweep_dir_for('${paths.output_dir}', '${data.dataset}', label)}"]


# Libraries that log every request at INFO (the api family's HTTP client: the `openai` SDK on httpx2, and httpx);
# `hydra.verbose=httpx2` (or `[httpx2,openai]`) shows them.
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "openai")


def _log_to_files(cfg: DictConfig) -> None:
    """A command's log file (Hydra's <job>.log) holds all it said: warnings, Lightning's lines (Lightning keeps
    them to itself when it was imported before Hydra set up logging, as in a SLURM job) and, file only so that
    the console stays short, the composed config."""
    logging.captureWarnings(True)
    for name in QUIET_LOGGERS:  # one line per HTTP request (2,000 for the mini benchmark), unless asked for
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
    lightning_through_root()
    try:
        container = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation only the command itself can report (it will): the config as written
        container = OmegaConf.to_container(cfg)
    composed = OmegaConf.to_yaml(OmegaConf.create(redact(container)))  # secrets redacted as data, headers too
    record = logging.LogRecord(log.name, logging.INFO, __file__, 0, "composed config:\n%s", (composed,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def lightning_through_root() -> None:
    """Lightning's lines once, through the root logger (Hydra's console and the log file): the `lightning` package
    gives its logger a console handler of its own on import ("INFO: ..."), and `lightning.pytorch`/`.fabric` do too
    when imported before logging is set up (then their lines never reach the log file), so each line was printed
    twice, or only to the console. Called once logging is set up and again once the command imported Lightning."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:  # their console handlers; never a file handler
                logger.removeHandler(handler)
        logger.propagate = True


def _command(name: str, config_name: str, body: Callable[[DictConfig, int], object], infer_data: bool):
    """A Hydra main for `body(cfg, threads)` with the shared start-up and one-line errors."""

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)
    def main(cfg: DictConfig):
        from rgb.core.machine import configure_threads, keep_freed_memory

        _log_to_files(cfg)
        try:
            schema.check(config_name, cfg)
            if _source_note:
                log.info("data source: %s (%s)", cfg.data.source, _source_note[0])
            keep_freed_memory()
            threads = configure_threads(cfg.get("threads", "auto"))
            return body(cfg, threads)
        except Exception as raised:
            err = _user_error_in(raised) or raised
            if not isinstance(err, (UserError, OSError, InterpolationResolutionError)):
                raise
            line = _error_line(err)
            if line is None:
                raise
            if not _in_local_sweep():
                log.error("%s: error: %s", program(name), line)
                sys.exit(2)
            from hydra.core.hydra_config import HydraConfig

            job = HydraConfig.get().job
            if _sweeper_needs_values():  # SystemExit passes Hydra's job runner and the sweeper: the study ends here
                log.error("%s: error: job %s (%s) failed, so the study ends: %s", program(name), job.num,
                          job.override_dirname or "no overrides", line)
                sys.exit(2)
            log.error("%s: error: %s", program(name), line)
            _failed_jobs.append(f"job {job.num} ({job.override_dirname or 'no overrides'}): {line}")
            return None

    def entry() -> None:
        dashed = _dashed_option(sys.argv[1:])
        if dashed:
            sys.exit(f"{program(name)}: error: {dashed}")
        missing = _missing_extra(sys.argv[1:])
        if missing:
            sys.exit(f"{name}: error: {missing}")
        if config_name == "attack":
            try:
                sys.argv[1:] = _expand_runs(sys.argv[1:])
            except ValueError as err:
                sys.exit(f"{name}: error: {err}")
        if infer_data:
            sys.argv[1:] = _infer_from_run(sys.argv[1:])
        argv = sys.argv[1:]
        if any(a in ("--help", "-h") for a in argv):
            print(command_help(config_name, program(name)))
            return
        if not _asks_for_help(argv):
            register_resolvers()
            inspecting = any(a in INSPECTION_FLAGS for a in argv)
            problem = None if inspecting else _missing_required(config_name, argv) or _compose_error(config_name, argv)
            if problem:
                sys.exit(f"{program(name)}: error: {problem}")
        _failed_jobs.clear()
        main()
        if _failed_jobs:
            sys.exit(f"{program(name)}: error: {len(_failed_jobs)} job(s) of the sweep failed, the others ran: "
                     + "; ".join(_failed_jobs))

    entry.__name__ = name.replace("-", "_")
    return entry


def _dashed_option(argv: list[str]) -> str | None:
    """`--port 8000` or `--port=8000` (argparse's way): not a flag of Hydra's, whose overrides are key=value; said
    in one line naming the override meant (Hydra's own answer is a lexer error on the value)."""
    from hydra._internal.utils import get_args_parser

    unknown = get_args_parser().parse_known_args(argv)[1]
    dashed = next((a for a in unknown if a.startswith("-") and a.lstrip("-")), None)
    if dashed is None:
        return None
    key, given, value = dashed.lstrip("-").partition("=")
    at = argv.index(dashed) + 1
    if not given and at < len(argv) and "=" not in argv[at] and not argv[at].startswith("-"):
        value = argv[at]
    shown = f"{dashed} {value}" if value and not given else dashed
    return (f"'{shown}' is not an option: options are key=value overrides (Hydra's syntax), here "
            f"{key.replace('-', '_')}={value or '<value>'}")


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
    try:
        cfg = _compose(config_name, overrides)
        unknown = _unknown_keys(config_name, overrides, cfg)
        if unknown:
            return unknown
        if "data" in cfg:  # rgb-serve has none
            OmegaConf.to_container(cfg.data, resolve=True)
        run_dir = Path(str(cfg.hydra.run.dir))
        for key in OUTPUT_KEYS:  # a run name that cannot name a directory fails here, before anything is written
            OmegaConf.select(cfg, key)
        schema.check(config_name, cfg)
    except Exception as err:  # any composition failure is the user's config: shown, not raised
        broken = _import_error_in(err)
        if broken is not None:  # a resolver's module that does not import is the install's fault, not the config's
            raise broken
        refused = schema.refused_override(err)
        if refused:
            return schema.unknown_key(config_name, refused, _compose(config_name, _group_choices(overrides)))
        cause = _user_error_in(err)
        return one_line(cause) if cause else f"config: {one_line(err).split(' Config search path:')[0]}"
    return unwritable(run_dir)


def command_help(config_name: str, program_name: str) -> str:
    """`--help`: the usage lines of conf/<command>.yaml, the config groups its defaults list takes, and its config
    (Hydra's own help lists every group of conf/, train's included; `--hydra-help` still shows Hydra's flags)."""
    text = (config_dir() / f"{config_name}.yaml").read_text()
    lines = text.splitlines()
    header = [line.removeprefix("#").removeprefix(" ")
              for line in lines[: next((i for i, line in enumerate(lines) if not line.startswith("#")), 0)]]
    groups = []
    for entry in yaml.safe_load(text).get("defaults", []):
        group = next(iter(entry)).removeprefix("optional ") if isinstance(entry, dict) else None
        if group and group != "hydra" and (config_dir() / group).is_dir():
            options = sorted(p.stem for p in (config_dir() / group).glob("*.yaml") if not p.stem.startswith("_"))
            groups += [f"{group}: {', '.join(options)}"] if options else []
    cfg = _compose(config_name, [])
    body = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"]))
    return "\n".join([f"{program_name}: {header[0] if header else config_name}", *header[1:], "",
                      "== Configuration groups (group=option) ==", *groups, "",
                      "== Config (override any key: key=value; --hydra-help: Hydra's flags) ==", body])


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name=config_name):
        return compose(config_name, overrides=overrides, return_hydra_config=True)


def _config_groups() -> set[str]:
    return {path.name for path in config_dir().iterdir() if path.is_dir()}


def _group_choices(overrides: list[str]) -> list[str]:
    """The overrides that choose config groups (data=, +experiment=, ...): what decides which keys exist."""
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in _config_groups()]


def _unknown_keys(config_name: str, overrides: list[str], cfg: DictConfig) -> str | None:
    """A top-level key a `+key=` override adds that the command's YAML (with the chosen groups) has not: refused
    with the closest key it has (a typo would otherwise be carried along unread)."""
    added = [k for k in schema.added_keys(overrides, _config_groups()) if "." not in k]
    if not added:
        return None
    known = _compose(config_name, _group_choices(overrides))
    unknown = [k for k in added if k not in known]
    return schema.unknown_key(config_name, unknown[0], known) if unknown else None


# Output places of the commands' configs, resolved by the check before a command starts.
OUTPUT_KEYS = ("output_dir", "attack_dir", "leaderboard_dir")


def _user_error_in(err: BaseException) -> UserError | None:
    """The UserError behind a wrapping error, if any: an interpolation error (`${rgb.path_name:...}` refusing a
    run name), or Hydra's InstantiationException around a model or data class refusing its arguments."""
    while err is not None and not isinstance(err, UserError):
        err = err.__cause__ or err.__context__
    return err


def _import_error_in(err: BaseException) -> ImportError | None:
    """The ImportError behind a config error (a resolver importing a module that is broken or missing), if any."""
    while err is not None and not isinstance(err, ImportError):
        err = err.__cause__ or err.__context__
    return err


def _missing_required(config_name: str, argv: list[str]) -> str | None:
    """Hydra reports a missing `run=` as a 230-line traceback; say it in one line before it starts."""
    keys = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
    if config_name in ("attack", "transfer", "serve") and "run" not in keys:
        return "no model given: pass run=<train output dir or exported .safetensors file>"
    if config_name == "evaluate" and not keys & {"run", "pool"}:
        return "nothing to evaluate: give run=<train output dir or .safetensors> or pool=[DIR,...]"
    return None


def _train(cfg: DictConfig, threads: int):
    from rgb.commands.train import train  # imports Lightning, which brings its own console handlers

    lightning_through_root()
    return train(cfg)


def _attack(cfg: DictConfig, threads: int):
    from rgb.commands.attack import attack_from_config

    summaries = attack_from_config(cfg, threads=threads)
    # For sweepers: the lowest robust accuracy over the merged norms (None while shards are still missing).
    return min((s.robust_accuracy for s in summaries.values()), default=None)


def _evaluate(cfg: DictConfig, threads: int):
    from rgb.commands.evaluate import run_evaluation

    return run_evaluation(cfg)


def _transfer(cfg: DictConfig, threads: int):
    from rgb.commands.transfer import transfer_from_config

    transfer_from_config(cfg, threads=threads)


def _serve(cfg: DictConfig, threads: int):
    from rgb.commands.serve import serve_from_config

    serve_from_config(cfg)


train_main = _command("train.py", "train", _train, infer_data=False)
attack_main = _command("attack.py", "attack", _attack, infer_data=True)
evaluate_main = _command("evaluate.py", "evaluate", _evaluate, infer_data=True)
transfer_main = _command("rgb-transfer", "transfer", _transfer, infer_data=True)
serve_main = _command("rgb-serve", "serve", _serve, infer_data=False)
