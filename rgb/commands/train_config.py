"""What a training config must satisfy before anything starts, and which of its keys identify the weights.

Both read the resolved config as plain values (rgb.commands.train resolves it). `validate_config` refuses nonsense
hyper-parameters in one line (they used to train and export: a negative learning rate gave val/loss 1.2e9 and exit
0). `training_identity` is the resolved config minus the keys listed in
`RESUMABLE_KEYS` (where things run and are written, how fast, how they are logged): a run dir keeps the identity
of its first start in `run.json`, and a resume under another identity is refused. The keys of the typed request
(rgb.training.request, RobustValSettings) declare their rules and identity on their fields; the tables here hold the
keys no type reads.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from rgb.commands.schema import DATA
from rgb.core.values import (
    BOOL,
    NORM,
    NON_NEGATIVE,
    PATH_NAME,
    POSITIVE,
    POSITIVE_INT,
    Rule,
    flatten,
    optional,
)
from rgb.core.values import problems as check
from rgb.training.config import TrainingConfigError
from rgb.training.request import TrainRequest
from rgb.training.settings import KEY as ROBUST_VAL
from rgb.training.settings import LINEAR_PROBE, RobustValSettings
from rgb.zeroshot.settings import KEY as PROMPTS
from rgb.zeroshot.settings import PromptSettings


# Keys that may differ between starts of one run: they change where a run runs, writes or logs, or how fast, never
# which weights it produces. Everything else is the run's identity. fnmatch patterns over dotted keys: the
# config-level ones here, then the typed request's fields declared identity=False.
RESUMABLE_KEYS = (
    "run_name",
    "sweep_name",
    "paths.*",
    "logger.*",
    "wandb.*",
    "model_card",  # the card describes the weights, never changes them
    "card.*",
    "data._target_",  # the class that reads the data config (rgb.data.RGBDataModule before BenchmarkData), not the data
    "data.num_workers",
    "data.pin_memory",
    "data.cache_dir",
    "data.eval_batch_size",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.strategy",
    "trainer.max_time",
    "trainer.default_root_dir",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "callbacks.progress_bar.*",
    "callbacks.*.dirpath",
    *TrainRequest.keys(identity=False),
    *RobustValSettings.keys(ROBUST_VAL, identity=False),
    *PromptSettings.keys(PROMPTS, identity=False),
)


def resumable(key: str) -> bool:
    return any(fnmatchcase(key, pattern) or key.startswith(f"{pattern}.") for pattern in RESUMABLE_KEYS)


def training_identity(config: dict) -> dict:
    """The resolved config without the resumable keys, as {dotted key: value}, sorted."""
    return {key: value for key, value in sorted(flatten(config).items()) if not resumable(key)}


# ---------------------------------------------------------------- validation

# key -> (rule, what the rule says): the typed request's and robust validation's, and rows for the keys no type
# reads. Missing keys are skipped: the instantiation names those.
RULES: dict[str, Rule] = {
    **DATA,
    **TrainRequest.rules(),
    **RobustValSettings.rules(ROBUST_VAL),
    # beta = 0 is plain CE on clean images (with a wasted inner attack): allowed, the limit of the family.
    "loss.beta": NON_NEGATIVE,
    "loss.attack.norm": NORM,
    "loss.attack.eps": POSITIVE,
    "loss.attack.n_iter": POSITIVE_INT,
    "loss.attack.step_size": optional(POSITIVE),
    "model.check_endpoint": BOOL,  # model=api_chat: ask GET /models before the run dir is made
    "trainer.max_epochs": POSITIVE_INT,
    "monitor.mode": (lambda v: v in ("min", "max"), "min or max"),
    "run_name": PATH_NAME,
    # The prompt ensembles (strategy=zeroshot, head_init=zeroshot).
    **PromptSettings.rules(PROMPTS),
}


def validate_config(config: dict) -> None:
    """Raise TrainingConfigError naming every key of the resolved config that breaks its rule (one line)."""
    from rgb.training.losses import LOSSES  # imports torch: train.py's schema (RULES) is read before it loads

    flat = flatten(config)
    problems = check(flat, RULES)
    batch, effective = flat.get("data.batch_size"), flat.get("effective_batch_size")
    if not problems and effective is not None and effective % batch:
        problems.append(f"effective_batch_size {effective} must be a multiple of data.batch_size {batch}")
    warmup, epochs = flat.get("optim.warmup_epochs"), flat.get("trainer.max_epochs")
    if not problems and flat.get("optim.scheduler") and warmup is not None and warmup > epochs:
        problems.append(f"optim.warmup_epochs {warmup} must not exceed trainer.max_epochs {epochs}")
    model_classes, data_classes = flat.get("model.num_classes"), flat.get("data.num_classes")
    if not problems and None not in (model_classes, data_classes) and model_classes != data_classes:
        problems.append(f"model.num_classes {model_classes} must equal data.num_classes {data_classes} (the classes of "
                        f"the data's labels): leave model.num_classes at its default ${{data.num_classes}}")
    loss = LOSSES.get(flat.get("loss.name"))
    if not problems and loss is not None and loss.needs_prompt_head:
        if flat.get("head_init") is None and "head_init.name" not in flat:
            problems.append(f"loss={loss.name} trains the image tower under the prompt-built head: add head_init=zeroshot")
        if flat.get("strategy.name") == LINEAR_PROBE:
            problems.append(f"loss={loss.name} keeps the head fixed, so strategy=linear_probe would train nothing: "
                            "use strategy=full_finetune")
    if problems:
        raise TrainingConfigError("invalid training config: " + "; ".join(problems))
