"""One call to score any classifier under the benchmark's protocol, as RobustBench users expect:

    import rgb
    record = rgb.benchmark(my_model, dataset="flowers102", source="/data/RobustGenBench")
    print(record.white_box)  # "2.3000 / 5", or the partial sum over the settings scored "of 5" and why

`my_model` is any `nn.Module` mapping [0,1] images (N,3,H,W) to logits. Its weights are exported next to the
results (so the run store ties every result to them), the white-box attacks go through the same resumable run
store as attack.py, and the record is the one evaluate.py writes. Re-running the call resumes; a changed model
is a new set of weights and is refused under the old name before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict
from torch import nn

from rgb.cli import CONFIG_DIR, register_resolvers
from rgb.core.configs import data_config_for, data_configs
from rgb.core.machine import configure_threads, resolve_device
from rgb.core.values import path_name
from rgb.evaluation.model_eval import EvalOptions, EvaluationError, evaluate_model
from rgb.evaluation.records import ATTACK_SETTING_NORMS, RecordError, white_box_setting
from rgb.models import export_meta, write_export
from rgb.models.checks import check_model_fits
from rgb.models.user_factory import IN_MEMORY_FAMILY
from rgb.runs.runner import InMemoryModel, execute
from rgb.runs.settings import AttackSettings, white_box_budgets

SETTINGS = ("test", "common", "l1", "l2", "linf")


def _data_config_name(dataset: str) -> str:
    """`flowers102` (a config name) or `flowers-102` (a dataset id) -> the data config name."""
    names = set(data_configs().values())
    if dataset in names:
        return dataset
    name = data_config_for(dataset)
    if name is None:
        raise EvaluationError(f"unknown dataset {dataset!r}; data configs: {sorted(names)}")
    return name


def _compose(config: str, overrides: list[str]):
    register_resolvers()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config, overrides=overrides)


def benchmark(
    model: nn.Module,
    dataset: str = "mini",
    *,
    source: str | None = None,
    settings: Sequence[str] = SETTINGS,
    name: str | None = None,
    output_dir: str | Path = "outputs",
    seed: int = 0,
    device: str = "auto",
    batch_size: int | None = None,
    threads: int | str = "auto",
    progress: bool = True,
    overrides: Sequence[str] = (),
    n_examples: int | None = None,
):
    """Score `model` on one dataset: clean and common accuracy, and standard AutoAttack at the norms named in
    `settings` (any of l1, l2, linf; any case, as rgb.core.threat reads norms), over whole splits. Returns the
    scores record that evaluate.py writes (`<output_dir>/eval/<dataset>/<name>/scores.json`); settings left out
    are reported missing, never guessed.
    `n_examples`: score only the first N images of each split (attacked in a run directory of their own), to
    iterate fast: the record is PARTIAL (no Sum, ranked apart) and goes to `.../<name>/partial/scores.partial.json`,
    beside a complete one. `overrides`: further Hydra overrides of the attack and evaluate configs (e.g.
    "data.eval_batch_size=64")."""
    try:
        chosen = {white_box_setting(s) for s in settings}
    except RecordError:
        chosen = set()
    if not chosen:
        raise EvaluationError(f"settings must be a non-empty subset of {SETTINGS} (any case), got {list(settings)}")
    if n_examples is not None and (isinstance(n_examples, bool) or not isinstance(n_examples, int) or n_examples < 1):
        raise EvaluationError(f"n_examples must be a positive integer (the first N images of each split), got "
                              f"{n_examples!r}")
    norms = [norm.key for setting, norm in ATTACK_SETTING_NORMS.items() if setting in chosen]
    data = _data_config_name(dataset)
    name = path_name(name or type(model).__name__)  # a directory name inside output_dir, never `../x` or `a/b`
    configure_threads(threads)
    common = [f"data={data}", f"paths.output_dir={output_dir}", f"device={device}"]
    common += [f"data.source={source}"] if source else []
    common += [f"batch_size={batch_size}"] if batch_size else []
    eval_cfg = _compose("evaluate", [*common, f"run={Path(output_dir) / 'models' / data / name}", *overrides])
    datamodule = instantiate(eval_cfg.data)
    test = datamodule.split("test")
    run_dir = Path(str(eval_cfg.run))
    meta = export_meta(datamodule, {"run_name": name}, family=IN_MEMORY_FAMILY.name,
                       name=type(model).__module__ + "." + type(model).__qualname__, loss=None, strategy=None)
    run_device = resolve_device(device)
    model = model.to(run_device).eval()
    check_model_fits(model, meta, test, datamodule.image_size, run_device, EvaluationError, name)  # before any write
    weights = write_export(model, run_dir, meta, replace=False)
    attack_dir = Path(str(eval_cfg.attack_dir))
    if n_examples is not None:
        attack_dir = attack_dir / f"first-{n_examples}"  # never mixed with (nor refused by) a whole-split run
    if norms:
        attack_cfg = _compose("attack", [*common, f"run={run_dir}", f"norms=[{','.join(norms)}]", f"seed={seed}",
                                         f"progress={str(progress).lower()}", f"output_dir={attack_dir}",
                                         *overrides])
        with open_dict(attack_cfg):
            attack_cfg.data = OmegaConf.to_container(eval_cfg.data, resolve=True)
        budgets = white_box_budgets(attack_cfg.norms, attack_cfg.data)
        attack = AttackSettings.from_config(attack_cfg, budgets, surrogate=name, threads=torch.get_num_threads())
        execute(replace(attack, max_images=n_examples), model=InMemoryModel(model, meta))
    options = EvalOptions(
        attack_dir=attack_dir, out_dir=Path(str(eval_cfg.output_dir)),
        worst_k=tuple(OmegaConf.to_container(eval_cfg.worst_k)), device=run_device,
        batch_size=int(eval_cfg.batch_size), allow_partial=n_examples is not None, max_images=n_examples,
    )
    return evaluate_model(model, meta, weights, datamodule, options)
