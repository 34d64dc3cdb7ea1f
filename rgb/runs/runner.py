"""Resumable, shardable AutoAttack runs over a benchmark's clean test split (the loop behind attack.py).

Results are stored per batch in atomic tensor files (rgb.runs.store), so an interrupted or requeued job
continues where it stopped and loses nothing. Batches start at multiples of `batch_size` from image 0 whatever
the sharding, so a batch always holds the same images and a result never depends on how the work was split.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import dataclass

import hydra
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from rgb.attacks.autoattack import within_budget
from rgb.core.configs import describe_data_config
from rgb.core.files import file_sha256
from rgb.core.machine import configure_threads
from rgb.data.benchmark import ImageSplit
from rgb.data.export import export_adversarial_split, quantise_within_budget
from rgb.data.fingerprint import split_sha256
from rgb.models import WEIGHTS_FILE, apply_speed_options, library_versions, load_with_meta
from rgb.models.checks import check_model_fits
from rgb.runs.implementations import attack_implementation
from rgb.runs.settings import AttackRunError, AttackSettings, Budget, white_box_budgets
from rgb.runs.store import RESULT_COLUMNS, RunDirectory, RunSummary, run_name_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InMemoryModel:
    """A model handed over in Python (rgb.benchmark) with the record of its exported weights."""

    module: torch.nn.Module
    meta: dict


@dataclass
class Target:
    """The model under attack (with its export record and weights hash) and the split it is attacked on."""

    model: torch.nn.Module
    meta: dict
    weights_sha256: str
    datamodule: object
    split: ImageSplit
    split_sha256: str

    @classmethod
    def open(cls, settings: AttackSettings, device: str, model: InMemoryModel | None = None) -> Target:
        """The model of `settings.run`; or an in-memory model (the Python API) whose weights `settings.run`
        holds, so results are tied to the exact weights attacked."""
        if model is None:
            try:
                model, meta = load_with_meta(settings.run)
            except FileNotFoundError as err:
                raise AttackRunError(str(err)) from err
        else:
            model, meta = model.module, model.meta
        if not isinstance(model, torch.nn.Module):  # e.g. family `api`: answers, but no gradients to attack
            raise AttackRunError(f"{settings.run} holds a model of family {meta.get('family')!r}, which cannot be "
                                 f"white-box attacked: score it with evaluate.py run={settings.run} protocol=black_box")
        weights = settings.run / WEIGHTS_FILE if settings.run.is_dir() else settings.run
        datamodule = hydra.utils.instantiate(settings.data)
        if meta.get("dataset") != datamodule.dataset:
            trained, given = describe_data_config(meta.get("dataset")), describe_data_config(datamodule.dataset)
            raise AttackRunError(
                f"{settings.run} was trained on dataset {meta.get('dataset')!r} ({trained}) but the data config is "
                f"{given} (dataset {datamodule.dataset!r}): pass {trained} or leave data= out"
            )
        split = datamodule.split("test")
        model = model.to(device).eval()
        check_model_fits(model, meta, split, datamodule.image_size, device, AttackRunError, str(settings.run))
        if device.startswith("cuda"):  # TF32 perturbs the numerics of an attack (spec §6.3 item 10): off, recorded
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        model = apply_speed_options(model, channels_last=settings.channels_last,
                                    compile=settings.compile, dynamic=True)
        return cls(model, meta, file_sha256(weights), datamodule, split, split_sha256(split))

    def identity(self, settings: AttackSettings, budget: Budget) -> dict:
        """What the results of one budget depend on; a run directory only ever holds one identity."""
        identity = {
            "weights_sha256": self.weights_sha256, "dataset": self.datamodule.dataset, "split": "test",
            "split_sha256": self.split_sha256, "n_images": self.n_images(settings), "norm": budget.threat.norm.key,
            "eps": budget.threat.eps, "version": settings.version, "seed": settings.seed,
            "attacks": None if settings.attacks is None else list(settings.attacks),
            "precision": settings.precision, "batch_size": settings.batch_size, "export_adversarial": settings.export,
        }
        if settings.impl != "ours":  # added only when set, so directories of earlier runs keep their identity
            identity["impl"] = settings.impl
        if settings.tail_rows:  # APGD-T then draws other random starts
            identity["tail_rows"] = settings.tail_rows
        if settings.max_images is not None:
            identity["max_images"] = settings.max_images
        return identity

    def n_images(self, settings: AttackSettings) -> int:
        """The images attacked: the whole test split, or its first `max_images`."""
        return len(self.split) if settings.max_images is None else min(settings.max_images, len(self.split))


def batch_record(result, x, y, image_id, budget: Budget, seconds: float, keep_images: bool) -> dict:
    """Tensors of one finished batch (checked against the budget and the cascade rule before they are kept)."""
    threat = budget.threat
    robust = result.robust.bool()
    if not torch.equal(result.y_adv == y, robust) or bool((robust & ~result.clean_correct).any()):
        raise AttackRunError("AutoAttack result is inconsistent: robust != (prediction on x_adv is correct)")
    if not bool(within_budget(result.x_adv - x, threat.norm.value, threat.eps).all()):
        raise AttackRunError(f"AutoAttack returned an image outside {threat}")
    record = {
        "image_id": image_id.long(), "label": y.long(),
        # Clean-wrong points are never attacked (x_adv = x), so their prediction on x_adv is the clean one.
        "clean_pred": torch.where(result.clean_correct, y, result.y_adv).long(), "adv_pred": result.y_adv.long(),
        "clean_correct": result.clean_correct.bool(), "robust": robust, "fooled_by": result.fooled_by.long(),
        "perturbation_norm": result.perturbation_norm.float(),
        # Model evaluations (rows) spent per image: a batch's cost shared by the images it was spent on.
        "forward_rows": torch.as_tensor(result.forward_rows).double(),
        "backward_rows": torch.as_tensor(result.backward_rows).double(),
        "seconds": torch.tensor([seconds], dtype=torch.float64),
        "attacks": torch.tensor(list(json.dumps(list(result.attacks)).encode()), dtype=torch.uint8),
        "warnings": torch.tensor(list(json.dumps(list(result.warnings)).encode()), dtype=torch.uint8),
    }
    for name in ("forward_rows", "backward_rows"):
        if record[name].shape != y.shape:
            shape = tuple(record[name].shape)
            raise AttackRunError(f"AutoAttackResult.{name} must hold one value per image, got shape {shape}")
    if keep_images:
        record["adversarial"] = quantise_within_budget(x, result.x_adv, threat.norm.key, threat.eps)
        record["modified"] = (record["adversarial"] != torch.round(x * 255).to(torch.uint8)).flatten(1).any(dim=1)
    return record


def attack_shard(target: Target, settings: AttackSettings, budget: Budget, run: RunDirectory,
                 index: int, count: int, device: str) -> None:
    """Attack the unfinished batches of shard `index` of `count`, saving each batch as soon as it is done.

    Each batch is claimed first (RunDirectory.claim_batch): a second process on the same run takes the batches
    nobody holds, then waits for the ones another process is attacking and takes over those whose holder died.
    A batch's result does not depend on which process attacked it."""
    mine = run.shard_starts(index, count)
    done = run.batch_files()
    todo = [s for s in mine if s not in done]
    n = run.identity["n_images"]
    sizes = {s: min(settings.batch_size, n - s) for s in mine}
    robust = sum(int(run.load(done[s], s)["robust"].sum()) for s in mine if s in done)
    finished = sum(sizes[s] for s in mine if s in done)
    bar = tqdm(total=sum(sizes.values()), initial=finished, unit="img", disable=not settings.progress,
               desc=f"{budget.name} eps={budget.threat.eps:.4g} shard {index}/{count}", dynamic_ncols=True)

    def show(stage: str = "") -> None:
        accuracy = f"{robust / finished:.1%}" if finished else "-"
        bar.set_postfix_str(f"robust {accuracy} ({robust}/{finished})" + (f" | {stage}" if stage else ""))

    def progress(name: str, *position) -> None:
        show(name if not position else f"{name} {'/'.join(str(p) for p in position)}")

    def batches(starts: list[int]):
        indices = [i for s in starts for i in range(s, s + sizes[s])]
        loader = DataLoader(Subset(target.split, indices), batch_size=settings.batch_size, shuffle=False,
                            num_workers=target.datamodule.num_workers)
        return zip(starts, loader)

    implementation = attack_implementation(settings.impl)

    def attack_claimed(start: int, load) -> None:
        """The batch at `start`, under its lock: attacked and saved, or counted if another process saved it
        meanwhile. `load()`: its (x, y, image_id)."""
        nonlocal robust, finished
        other = run.finished(start)
        if other is not None:
            record = run.load(other, start)
        else:
            x, y, image_id = load()
            began = time.perf_counter()
            result = implementation.run(target.model, x, y, budget.threat, settings, device, progress)
            seconds = time.perf_counter() - began
            record = batch_record(result, x, y, image_id, budget, seconds, settings.export)
            run.save(index, count, start, record)
        robust, finished = robust + int(record["robust"].sum()), finished + sizes[start]
        bar.update(sizes[start])
        show()

    show()
    held_by_others = []
    with bar:
        for start, batch in batches(todo):
            claim = run.claim_batch(start)
            if claim is None:
                held_by_others.append(start)
                continue
            with claim:
                attack_claimed(start, lambda batch=batch: batch)
        for start in held_by_others:  # wait for their holders; a holder that died leaves the batch to us
            with run.claim_batch(start, wait=True):
                attack_claimed(start, lambda start=start: next(batches([start]))[1])


def merge(target: Target, settings: AttackSettings, budget: Budget, run: RunDirectory, shard_count: int
          ) -> RunSummary:
    """Concatenate every batch into results.parquet + summary.json; refuses (naming them) while any is missing."""
    records = run.load_all(shard_count)
    attacks = {bytes(r["attacks"].tolist()).decode() for r in records}
    if len(attacks) != 1:
        raise AttackRunError(f"{run.directory}: batches were attacked with different attack lists: {sorted(attacks)}")
    attacks = json.loads(attacks.pop())
    warnings = sorted({w for r in records if "warnings" in r for w in json.loads(bytes(r["warnings"].tolist()))})
    columns = {name: torch.cat([r[name] for r in records]) for name in RESULT_COLUMNS}
    if not torch.equal(columns["label"], target.split.labels[: target.n_images(settings)]):
        raise AttackRunError(f"{run.directory}: stored labels differ from the test split")
    results_sha256 = run.write_results(columns)

    n, fooled_by = len(columns["label"]), columns["fooled_by"]
    accuracy_after = {"clean": float((fooled_by != 0).float().mean())}
    for k, name in enumerate(attacks, start=1):
        accuracy_after[name] = float(((fooled_by == -1) | (fooled_by > k)).float().mean())
    meta = target.meta
    implementation = attack_implementation(settings.impl)
    summary = RunSummary(
        run=str(settings.run), run_name=settings.run_name, weights_sha256=target.weights_sha256,
        model_family=meta.get("family", "timm"), model_name=meta.get("timm_name") or meta.get("name"),
        loss=meta.get("loss"), strategy=meta.get("strategy"),
        dataset=target.datamodule.dataset, source=str(target.datamodule.source), split="test",
        split_sha256=target.split_sha256, n=n, norm=budget.threat.norm.key, eps=budget.threat.eps,
        impl=settings.impl, impl_version=implementation.version(),
        version=settings.version, standard=implementation.is_standard(settings), attacks=attacks,
        seed=settings.seed, precision=settings.precision, tf32=False, compile=settings.compile,
        channels_last=settings.channels_last, batch_size=settings.batch_size, threads=settings.threads,
        tail_rows=settings.tail_rows, input_format=settings.input_format,
        clean_accuracy=accuracy_after["clean"], n_clean_correct=int(columns["clean_correct"].sum()),
        robust_accuracy=float(columns["robust"].float().mean()), n_robust=int(columns["robust"].sum()),
        accuracy_after=accuracy_after,
        attack_seconds=float(sum(float(r["seconds"][0]) for r in records)),
        forward_rows_per_image=float(columns["forward_rows"].double().mean()),
        backward_rows_per_image=float(columns["backward_rows"].double().mean()),
        results_sha256=results_sha256,
        versions={**library_versions(), "python": platform.python_version()},
        complete=True, warnings=warnings,
    )
    if settings.export:
        summary.export = str(export_adversarial_split(
            target.split, dataset=target.datamodule.dataset, image_size=target.datamodule.image_size,
            root=settings.export_dir, surrogate=settings.surrogate, threat=budget.threat,
            split_name=budget.export_split, adversarial=torch.cat([r["adversarial"] for r in records]),
            modified=torch.cat([r["modified"] for r in records]).tolist(),
        ))
    run.write_summary(summary)
    return summary


def run_directories(settings: AttackSettings, target: Target) -> dict[str, RunDirectory]:
    return {b.name: RunDirectory(settings.output_dir / b.name, target.identity(settings, b)) for b in settings.budgets}


def _spawned_shard(rank: int, settings: AttackSettings) -> None:
    """Process `rank` of `settings.processes` on this node: shard index * processes + rank, on GPU `rank`. On the
    CPU the processes share the threads: more threads than cores makes every process spin-wait (measured: two
    2-thread attack processes on 2 cores ran 4.5x slower than one thread each)."""
    device = f"cuda:{rank}" if settings.device.startswith("cuda") else settings.device
    shared_cpu = not device.startswith("cuda")
    configure_threads(max(1, settings.threads // settings.processes) if shared_cpu else settings.threads)
    target = Target.open(settings, device)
    count = settings.shard_count * settings.processes
    for budget, run in zip(settings.budgets, run_directories(settings, target).values()):
        attack_shard(target, settings, budget, run, settings.shard_index * settings.processes + rank, count, device)


def execute(settings: AttackSettings, model: InMemoryModel | None = None) -> dict[str, RunSummary]:
    """Attack this node's shard(s) of every budget (unless merge_only), then merge every budget whose batches
    are all there. Returns the merged summaries by budget name and logs one line per budget. `model`: an
    in-memory model whose weights `settings.run` holds (rgb.benchmark), attacked in this process."""
    spawn = settings.processes > 1 and not settings.merge_only and model is None
    target = Target.open(settings, "cpu" if spawn else settings.device, model)
    runs = run_directories(settings, target)
    if not settings.merge_only:
        implementation = attack_implementation(settings.impl)
        for budget in settings.budgets:
            implementation.check(target.model, budget.threat, settings)
    for run in runs.values():
        run.claim(create=not settings.merge_only)
    if not settings.merge_only:
        if spawn:
            torch.multiprocessing.spawn(_spawned_shard, args=(settings,), nprocs=settings.processes, join=True)
        else:
            for budget in settings.budgets:
                attack_shard(target, settings, budget, runs[budget.name], settings.shard_index,
                             settings.shard_count, settings.device)
    count = settings.shard_count * settings.processes
    summaries = {}
    for budget in settings.budgets:
        run = runs[budget.name]
        missing = run.missing_batches()
        if missing and not settings.merge_only:
            log.info("%s: this shard is done; merge waits for %s", budget.name, run.describe_missing(missing, count))
            continue
        summaries[budget.name] = merge(target, settings, budget, run, count)
        log.info("%s", summaries[budget.name].line())
        log.info("%s", summaries[budget.name].stages())
    return summaries


def attack_from_config(cfg: DictConfig, threads: int = 1) -> dict[str, RunSummary]:
    """attack.py: white-box AutoAttack of `cfg.run` at the data config's budgets for `cfg.norms`."""
    budgets = white_box_budgets(cfg.norms, cfg.data)
    settings = AttackSettings.from_config(cfg, budgets, surrogate=run_name_for(cfg.run), threads=threads)
    summaries = execute(settings)
    tracking = cfg.get("wandb") or {}
    if tracking.get("enabled") and summaries:  # the shard that merges logs the run
        from rgb.runs.wandb_report import log_attack

        log_attack(summaries, settings.output_dir, str(tracking.get("project", "robustgenbench")))
    return summaries
