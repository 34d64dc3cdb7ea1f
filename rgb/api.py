"""One call to score any classifier under the benchmark's protocol, as RobustBench users expect:

    import rgb
    record = rgb.benchmark(my_model, dataset="flowers102", source="/data/RobustGenBench")
    print(record.white_box)  # "2.3000 / 5", or the partial sum over the settings scored "of 5" and why

`my_model` is any `nn.Module` mapping [0,1] images (N,3,H,W) to logits. Its weights are exported next to the
results (so the run store ties every result to them), the white-box attacks go through the same resumable run
store as attack.py, and the record is the one evaluate.py writes: the call builds the requests attack.py and
evaluate.py build (rgb.runs.AttackRequest, rgb.evaluation.EvalRequest) and runs them through the same functions,
except that the model is the one given (rgb.models.InMemoryModel; its class may not be rebuildable from its
export), never loaded back. Re-running the call resumes; a changed model is a new set of weights and is refused
under the old name before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from rgb.attacks.options import AttackOptions
from rgb.core.configs import data_configs
from rgb.core.files import unwritable
from rgb.core.machine import configure_threads, resolve_device
from rgb.core.values import POSITIVE_INT, optional, path_name, require
from rgb.data.benchmark_data import BenchmarkData
from rgb.data.catalog import DATASET_IDS
from rgb.evaluation.model_eval import EvaluationError
from rgb.evaluation.records import ATTACK_SETTING_NORMS, WHITE_BOX_SETTING_NAMES, RecordError, white_box_setting
from rgb.evaluation.request import EvalRequest, RunOutputs
from rgb.evaluation.run import evaluate
from rgb.models import InMemoryModel, export_meta, write_export
from rgb.models.checks import check_model_fits
from rgb.models.user_factory import IN_MEMORY_FAMILY
from rgb.runs.runner import execute
from rgb.runs.request import AttackRequest, white_box_budgets
from rgb.runs.store import AttackRunError, first_images_dir, output_dir_for

SETTINGS = WHITE_BOX_SETTING_NAMES


def _dataset_id(dataset: str) -> str:
    """`digits` / `flowers-102` (dataset ids) or `mini` / `flowers102` (the names of their data configs) -> the id."""
    by_config = {name: dataset_id for dataset_id, name in data_configs().items()}
    if dataset in DATASET_IDS:
        return dataset
    if dataset in by_config:
        return by_config[dataset]
    raise EvaluationError(f"unknown dataset {dataset!r}; dataset ids: {sorted(DATASET_IDS)} (or their data "
                          f"config names: {sorted(by_config)})")


def benchmark(
    model: nn.Module,
    dataset: str = "mini",
    *,
    source: str | None = None,
    settings: Sequence[str] = SETTINGS,
    name: str | None = None,
    output_dir: str | Path = "outputs",
    device: str = "auto",
    batch_size: int | None = None,
    threads: int | str = "auto",
    progress: bool = True,
    budgets: Mapping[str, float] | None = None,
    n_examples: int | None = None,
    **attack_options,
):
    """Score `model` on one dataset under the benchmark's protocol, as evaluate.py does.

    Clean and common-corruption accuracy, and standard AutoAttack at the norms named in `settings`, over whole
    splits. The model's weights are exported first (under `<output_dir>/models/<dataset id>/<name>`), so every
    result is tied to them; the attacks go through the same resumable run store as attack.py, so calling again
    resumes. Settings left out are reported missing, never guessed.

    Args:
        model: An `nn.Module` mapping [0,1] images (N,3,H,W) to logits (normalisation inside the model).
        dataset: A dataset id (`digits`, `flowers-102`, ...) or the name of its data config (`mini`,
            `flowers102`, ...).
        source: Where the benchmark data lies (a folder or hub dataset); None: the data config's default
            (data/mini for `mini`, else $RGB_BENCHMARK or the RobustGenBench hub dataset).
        settings: Which of "test", "common", "l1", "l2", "linf" to score (any case; at least one).
        name: The model's name in the results and its directory name; None: the class name of `model`.
        output_dir: The root under which models/, attack/ and eval/ are written.
        device: "auto", "cpu", "cuda" or "cuda:N".
        batch_size: The attack and evaluation batch (part of an attack run's identity); None: the data config's
            (50 for `mini`, 256 otherwise).
        threads: On the CPU, the single-threaded attack workers (this process and forks of it; "auto": the
            usable cores), afterwards this process's torch threads.
        progress: Show the attacks' progress bars.
        budgets: Other white-box eps for some norms (e.g. {"linf": 8/255}), which makes the record one of
            another threat model.
        n_examples: Score only the first N images of each split, attacked in a run directory of their own: the
            record is PARTIAL (no Sum, ranked apart) and goes to `.../<name>/partial/scores.partial.json`,
            beside a complete one.
        **attack_options: Fields of `rgb.attacks.AttackOptions`, e.g. `seed` or `capture` (how the attacks call
            the model: "auto", a checked TorchScript trace on the CPU; "eager" for a model that keeps Python-side
            state between calls; see `rgb.attacks.AutoAttack`).

    Returns:
        The scores record evaluate.py writes (`<output_dir>/eval/<dataset id>/<name>/scores.json`):
        `record.white_box` is e.g. "2.3000 / 5", or the partial sum over the settings scored and why.

    Raises:
        EvaluationError: `settings` is empty or names no known setting, `n_examples` is not a positive integer,
            the dataset is unknown or its data cannot be read, the model does not fit the dataset (class count,
            image size), the attack run cannot be set up, or its results must not be scored.
        AttackOptionsError: An attack option has a value AutoAttack cannot run.
        TypeError: A keyword that is neither a parameter here nor a field of `AttackOptions`.
        ConfigValueError: `name` cannot name a directory.
        DeviceError: `device` asks for CUDA where none is visible, or `threads` is not a positive integer or
            "auto".
        ExportConflictError: `<output_dir>/models/<dataset id>/<name>` holds an export of other weights (another
            model under the old name): give this one another `name`.
        AttackError: A returned adversarial image breaks the threat model, or the model's logits are not finite.

    Example:
        >>> import torch, rgb
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
        >>> record = rgb.benchmark(model, "mini", settings=["test"], n_examples=20, progress=False)
        >>> record.white_box.settings["test"].total
        20
    """
    try:
        chosen = {white_box_setting(s) for s in settings}
    except RecordError:
        chosen = set()
    if not chosen:
        raise EvaluationError(f"settings must be a non-empty subset of {SETTINGS} (any case), got {list(settings)}")
    if n_examples is not None and not POSITIVE_INT[0](n_examples):
        raise EvaluationError(f"n_examples must be a positive integer (the first N images of each split), got "
                              f"{n_examples!r}")
    require({"batch_size": batch_size}, {"batch_size": optional(POSITIVE_INT)}, EvaluationError)
    options = AttackOptions(**attack_options)
    norms = [norm.key for setting, norm in ATTACK_SETTING_NORMS.items() if setting in chosen]
    try:
        datamodule = BenchmarkData.for_dataset(_dataset_id(dataset), source, eval_batch_size=batch_size,
                                               budgets=budgets)
    except ValueError as err:
        raise EvaluationError(str(err)) from err
    name = path_name(name or type(model).__name__)  # a directory name inside output_dir, never `../x` or `a/b`
    unusable = unwritable(Path(output_dir))
    if unusable:
        raise EvaluationError(unusable)
    configure_threads(threads)
    test = datamodule.split("test")
    run_dir = output_dir_for(output_dir, "models", datamodule.dataset, name)
    meta = export_meta(datamodule, {"run_name": name}, family=IN_MEMORY_FAMILY.name,
                       name=type(model).__module__ + "." + type(model).__qualname__, loss=None, strategy=None)
    run_device = resolve_device(device)
    model = model.to(run_device).eval()
    check_model_fits(model, meta, test, datamodule.image_size, run_device, EvaluationError, name)  # before any write
    write_export(model, run_dir, meta, replace=False)
    given = InMemoryModel(model, meta)
    attack_dir = output_dir_for(output_dir, "attack", datamodule.dataset, name)
    if n_examples is not None:
        attack_dir = first_images_dir(attack_dir, n_examples)
    if norms:
        try:  # an in-memory model is attacked in this process (on the CPU with forked workers, one per thread, as
            # attack.py does: threads of one process spin-wait for each other on a shared machine)
            attack = AttackRequest.create(
                run_dir, lambda: datamodule, white_box_budgets(norms, datamodule.budgets, datamodule.transfer_budgets),
                batch_size=datamodule.eval_batch_size, output_dir=attack_dir, surrogate=name, run_name=name,
                options=options, device=device, progress=progress, threads=torch.get_num_threads(),
                devices="auto" if run_device.startswith("cpu") else 1, max_images=n_examples)
        except AttackRunError as err:
            raise EvaluationError(str(err)) from err
        execute(attack, model=given)
    # attack_dir is this call's own run dir (first-<n> with n_examples), as before: never a whole-split run's first
    # rows, which evaluate.py max_images=N would fall back to (rgb.runs.store.attack_dir_read)
    scoring = EvalRequest(
        RunOutputs(run_dir, name, output_dir_for(output_dir, "eval", datamodule.dataset, name)), attack_dir,
        lambda: datamodule, device=run_device, batch_size=datamodule.eval_batch_size,
        allow_partial=n_examples is not None, max_images=n_examples)
    return evaluate(scoring, model=given)[0]
