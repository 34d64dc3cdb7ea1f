"""Resumable, shardable AutoAttack runs over a benchmark's clean test split (the loop behind attack.py).

Results are stored per batch in atomic tensor files (rgb.runs.store), so an interrupted or requeued job
continues where it stopped and loses nothing. Batches start at multiples of `batch_size` from image 0 whatever
the sharding, so a batch always holds the same images and a result never depends on how the work was split.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from rgb.attacks.autoattack import FooledBy
from rgb.attacks.model_calls import decide_input_format
from rgb.attacks.options import ALWAYS, WHEN_SET
from rgb.attacks.registry import describe_stage
from rgb.core.configs import describe_data_config
from rgb.core.files import file_sha256, flock
from rgb.data.benchmark import ImageSplit
from rgb.data.export import export_adversarial_split
from rgb.data.fingerprint import split_sha256
from rgb.models import (InMemoryModel, apply_speed_options, export_paths, family_of_record, result_versions,
                        load_with_meta, model_name)
from rgb.models.checks import check_model_fits
from rgb.core.exportfiles import model_record
from rgb.runs.implementations import attack_implementation
from rgb.runs.records import batch_record, load_images
from rgb.runs.pooled import attack_pooled, images_left
from rgb.runs.pool import attack_in_workers, next_tasks, worker_start_method, worker_threads
from rgb.runs.batch_probe import auto_batch_size, saturation_rows
from rgb.runs.request import AUTO_BATCH, AttackRequest, Budget
from rgb.runs.store import (BATCH_SIZE_LOCK, BATCH_SIZE_RECORD, INPUT_FORMAT_RECORD, RESULT_COLUMNS, SATURATION_RECORD,
                            AttackRunError, OnceRecord, RunDirectory, RunSummary, budget_dir, recorded_batch_size,
                            standard_run)

log = logging.getLogger(__name__)


def _check_trained_on(request: AttackRequest, meta: dict, datamodule) -> None:
    """AttackRunError in one line when the data config is not the dataset the model was trained on."""
    if meta.get("dataset") != datamodule.dataset:
        trained, given = describe_data_config(meta.get("dataset")), describe_data_config(datamodule.dataset)
        raise AttackRunError(
            f"{request.run} was trained on dataset {meta.get('dataset')!r} ({trained}) but the data config is "
            f"{given} (dataset {datamodule.dataset!r}): pass {trained} or leave data= out"
        )


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
    def open(cls, request: AttackRequest, device: str, model: InMemoryModel | None = None) -> Target:
        """The model of `request.run`; or an in-memory model (the Python API) whose weights `request.run`
        holds, so results are tied to the exact weights attacked."""
        datamodule = request.data()  # the data config alone: its split is read below
        if model is None:
            record = model_record(request.run)
            if record is not None:  # a data config the model was not trained on is one line, before any wait
                _check_trained_on(request, record, datamodule)
            log.info("loading the model of %s ...", request.run)  # a large model: tens of seconds of silence
            try:
                model, meta = load_with_meta(request.run)
            except FileNotFoundError as err:
                raise AttackRunError(str(err)) from err
        else:
            model, meta = model.module, model.meta
        if not isinstance(model, torch.nn.Module):  # e.g. family `api`: answers, but no gradients to attack
            raise AttackRunError(f"{request.run} holds a model of family {family_of_record(meta).name!r}, which cannot be "
                                 f"white-box attacked: score it with evaluate.py run={request.run} protocol=black_box")
        _check_trained_on(request, meta, datamodule)
        weights, _ = export_paths(request.run)
        log.info("reading the test split ...")
        split = datamodule.split("test")
        model = model.to(device).eval()
        check_model_fits(model, meta, split, datamodule.image_size, device, AttackRunError, str(request.run))
        if device.startswith("cuda"):  # TF32 perturbs the numerics of an attack (spec §6.3 item 10): off, recorded
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        model = apply_speed_options(model, channels_last=request.channels_last,
                                    compile=request.compile, dynamic=True)
        return cls(model, meta, file_sha256(weights), datamodule, split, split_sha256(split))

    def identity(self, request: AttackRequest, budget: Budget) -> dict:
        """What the results of one budget depend on; a run directory only ever holds one identity."""
        identity = {
            "weights_sha256": self.weights_sha256, "dataset": self.datamodule.dataset, "split": "test",
            "split_sha256": self.split_sha256, "n_images": self.n_images(request), "norm": budget.threat.norm.key,
            "eps": budget.threat.eps, **request.options.identity(ALWAYS),
            "batch_size": request.batch_size, "export_adversarial": request.export,
        }
        if request.impl != "ours":  # added only when set, so directories of earlier runs keep their identity
            identity["impl"] = request.impl
        identity.update(request.options.identity(WHEN_SET))  # e.g. tail_rows: APGD-T draws other random starts
        if request.max_images is not None:
            identity["max_images"] = request.max_images
        return identity

    def n_images(self, request: AttackRequest) -> int:
        """The images attacked: the whole test split, or its first `max_images`."""
        return len(self.split) if request.max_images is None else min(request.max_images, len(self.split))


class StageBar(tqdm):
    """The bar of one stage of a budget's cascade (Bars): its clock runs only while some worker is in the stage, so
    its elapsed time, rate and ETA are the stage's own, although in the batch schedule the stages of one batch run
    in turn before those of the next (and in the pooled one a stage waits at its barrier)."""

    paused_at: float | None = None

    def pause(self) -> None:
        """No worker is in the stage now: its clock stops (drawn as it stands)."""
        if self.paused_at is None:
            self.paused_at = self._time()
            self.refresh()

    def resume(self) -> None:
        """A worker takes images into the stage: its clock goes on from where it stopped."""
        if self.paused_at is not None:
            gap, self.paused_at = self._time() - self.paused_at, None
            self.start_t += gap
            self.last_print_t += gap  # nor in the smoothed rate

    @property
    def format_dict(self):
        shown = super().format_dict
        if self.paused_at is not None:
            shown["elapsed"] = self.paused_at - self.start_t
        return shown


class Bars:
    """One progress bar per budget of this shard: images are counted as they leave a batch (fooled, misclassified
    or finished robust), so the bar and its ETA move within a batch; the postfix shows the robust share of the
    finished batches and what each worker is doing (`apgd-t target 3/9 step 59/100`). When a budget's last batch of
    this shard is done its bar closes (showing the real elapsed time) and `on_done(budget)` runs. The budgets are
    attacked one after the other, so each bar's clock (elapsed, rate, ETA) starts when its own first stage or image
    does, never at the bars' creation: the L1 bar does not count the time spent on Linf and L2.

    Under them, one bar per stage of the budgets being attacked (the clean pass, then each attack; a StageBar),
    made when the stage first takes images: it counts the images the stage has attacked out of those that have
    reached it so far (the survivors of the stages before it: a stage's total is only known as they arrive), and its
    clock runs only while the stage does. When its budget's bar closes, each stage's bar goes and leaves one log
    line (`linf apgd-t: 40 images in 01:10 (0.571 img/s), 2 fooled`), which also reads well in a log file."""

    def __init__(self, request: AttackRequest, runs: list[RunDirectory], index: int, count: int,
                 on_done: Callable[[int], None] = lambda budget: None):
        self.bars, self.robust, self.finished, self.stages = [], [], [], []
        self.on_done = on_done
        self.started: set[int] = set()
        self.names, self.progress = [budget.name for budget in request.budgets], request.progress
        self.stage_bars: dict[tuple[int, str], StageBar] = {}
        self.fooled: dict[tuple[int, str], int] = {}
        self.inside: dict[tuple[int, str], dict[int, int]] = {}  # the workers in a stage: their images not done
        for position, (budget, run) in enumerate(zip(request.budgets, runs)):
            mine, done, n = run.shard_starts(index, count), run.batch_files(), run.identity["n_images"]
            sizes = {s: min(request.batch_size, n - s) for s in mine}
            self.robust.append(sum(int(run.load(done[s], s)["robust"].sum()) for s in mine if s in done))
            self.finished.append(sum(sizes[s] for s in mine if s in done))
            self.stages.append({})
            self.bars.append(tqdm(total=sum(sizes.values()), initial=self.finished[-1], unit="img",
                                  position=position, disable=not request.progress, dynamic_ncols=True,
                                  desc=f"{budget.name} eps={budget.threat.eps:.4g} shard {index}/{count}"))
            self._show(position)

    def stage(self, budget: int, worker: int, text: str) -> None:
        self._start(budget)
        self.stages[budget][worker] = text
        self._show(budget)

    def rows(self, budget: int, worker: int, stage: str, entered: int, attacked: int = 0, fooled: int = 0) -> None:
        """Stage `stage` of budget `budget` took `entered` images on worker `worker`, or attacked and fooled some
        of them (AutoAttack's `on_rows`)."""
        self._start(budget)
        if not self.progress:
            return
        key = (budget, stage)
        bar = self.stage_bars.get(key) or self._stage_bar(key)
        inside = self.inside.setdefault(key, {})
        if entered:
            bar.resume()
            inside[worker] = inside.get(worker, 0) + entered
            bar.total += entered
            bar.refresh()
        if attacked:
            self.fooled[key] += fooled
            bar.set_postfix_str(self._fooled(key), refresh=False)
            bar.update(attacked)
            inside[worker] = inside.get(worker, attacked) - attacked
        if inside.get(worker, 1) <= 0:
            del inside[worker]
        if not inside:
            bar.pause()

    def _stage_bar(self, key: tuple[int, str]) -> StageBar:
        """A new stage's bar, on the first line under the budgets' bars that no other stage's bar holds; paused."""
        held = {abs(bar.pos) for bar in self.stage_bars.values()}  # tqdm keeps -position
        position = next(p for p in range(len(self.bars), len(self.bars) + len(held) + 1) if p not in held)
        self.fooled[key] = 0
        bar = self.stage_bars[key] = StageBar(total=0, unit="img", position=position, leave=False,
                                              dynamic_ncols=True, desc=f"  {self.names[key[0]]} {key[1]}")
        bar.pause()
        return bar

    def _fooled(self, key: tuple[int, str]) -> str:
        return f"{self.fooled[key]} {'misclassified' if key[1] == 'clean' else 'fooled'}"

    def _close_stages(self, budget: int) -> None:
        """Budget `budget` is done here: its stages' bars go, each leaving one line with its own time and rate."""
        for key in [key for key in self.stage_bars if key[0] == budget]:
            bar = self.stage_bars.pop(key)
            self.inside.pop(key, None)
            if bar.n == 0:  # every image had left before this stage: "0 images in 00:00 (0 img/s)" says less
                log.info("%s %s: no image left to attack", self.names[budget], key[1])
            else:
                elapsed = bar.format_dict["elapsed"]
                rate = f"{bar.n / elapsed:.3g} img/s" if elapsed > 0 else "-"
                log.info("%s %s: %d images in %s (%s), %s", self.names[budget], key[1], bar.n,
                         bar.format_interval(elapsed), rate, self._fooled(key))
            bar.close()

    def left(self, budget: int, n: int) -> None:
        self._start(budget)
        self.bars[budget].update(n)

    def resumed(self, budget: int, n: int) -> None:
        """`n` images a resumed run let go before this start: counted, but not in the bar's rate."""
        bar = self.bars[budget]
        bar.initial = getattr(bar, "initial", 0) + n  # a disabled bar (progress=false) has none
        bar.update(n)

    def _start(self, budget: int) -> None:
        """Budget `budget`'s work begins: its bar's clock starts now; what it holds already (resumed) is no rate."""
        if budget in self.started:
            return
        self.started.add(budget)
        bar = self.bars[budget]
        held = bar.n
        bar.reset(total=bar.total)
        bar.n = bar.last_print_n = bar.initial = held
        bar.refresh()

    def batch_done(self, budget: int, worker: int, n: int, robust: int) -> None:
        self.robust[budget] += robust
        self.finished[budget] += n
        self.stages[budget].pop(worker, None)
        for key, inside in self.inside.items():  # the batch is out of every stage (the reference reports none)
            if key[0] == budget and inside.pop(worker, None) is not None and not inside:
                self.stage_bars[key].pause()
        self._show(budget)
        if self.finished[budget] == self.bars[budget].total:
            self._close_stages(budget)
            self.bars[budget].close()
            self.on_done(budget)

    def _show(self, budget: int) -> None:
        robust, finished, stages = self.robust[budget], self.finished[budget], self.stages[budget]
        accuracy = f"{robust / finished:.1%}" if finished else "-"
        doing = [f"w{w} {text}" if len(stages) > 1 else text for w, text in sorted(stages.items())]
        self.bars[budget].set_postfix_str(" | ".join([f"robust {accuracy} ({robust}/{finished})", *doing]))

    def close(self) -> None:
        for budget in range(len(self.bars)):
            self._close_stages(budget)
        for bar in self.bars:
            bar.close()


def load_batch(target: Target, request: AttackRequest, run: RunDirectory, start: int):
    """(x, y, image_id) of the batch at `start`."""
    return load_images(target.split, range(start, min(start + request.batch_size, run.identity["n_images"])))


def attack_batch(target: Target, request: AttackRequest, b: int, run: RunDirectory, index: int, count: int,
                 start: int, load: Callable[[], tuple], device: str, bars, worker: int = 0, wait: bool = False) -> bool:
    """Attack the batch at `start` of budget number `b` (`load()`: its x, y, image_id) and save it (shard `index`
    of `count`), under the batch's claim (RunDirectory.claim_batch): two processes on one run never attack the same
    batch, and one that another process saved meanwhile is only counted. False, with nothing done, while another
    live process holds the batch and `wait` is false; with `wait`, a holder that died leaves the batch to us."""
    claim = run.claim_batch(start, wait=wait)
    if claim is None:
        return False
    with claim:
        theirs = run.finished(start)
        if theirs is not None:
            record = run.load(theirs, start)
            bars.left(b, len(record["robust"]))
        else:
            x, y, image_id = load()
            budget = request.budgets[b]
            began = time.perf_counter()
            result = attack_implementation(request.impl).run(
                target.model, x, y, budget.threat, request, device,
                progress=lambda name, *position: bars.stage(b, worker, describe_stage(name, position)),
                on_leave=lambda n: bars.left(b, n), on_rows=lambda *counts: bars.rows(b, worker, *counts))
            seconds = time.perf_counter() - began
            record = batch_record(result, x, y, image_id, budget, seconds, request.export)
            run.save(index, count, start, record)
        bars.batch_done(b, worker, len(record["robust"]), int(record["robust"].sum()))
    return True


def attack_held(target: Target, request: AttackRequest, runs: list[RunDirectory], held: list[tuple[int, int]],
                device: str, bars, worker: int = 0) -> None:
    """The (budget, batch start) tasks other processes held: waited for, then counted or attacked here."""
    for b, start in held:
        attack_batch(target, request, b, runs[b], request.shard_index, request.shard_count, start,
                     lambda b=b, start=start: load_batch(target, request, runs[b], start), device, bars, worker,
                     wait=True)


def unfinished(run: RunDirectory, index: int, count: int) -> list[int]:
    done = run.batch_files()
    return [s for s in run.shard_starts(index, count) if s not in done]


def attack_shard(target: Target, request: AttackRequest, runs: list[RunDirectory], bars: Bars) -> None:
    """Attack the unfinished batches of this shard of every budget in this process, saving each batch as soon as
    it is done; batches another process holds are left to the end, then waited for."""
    index, count = request.shard_index, request.shard_count
    held = []  # batches another process is attacking: waited for once the rest is done
    for b, run in enumerate(runs):
        todo = unfinished(run, index, count)
        n = run.identity["n_images"]
        indices = [i for s in todo for i in range(s, min(s + request.batch_size, n))]
        loader = DataLoader(Subset(target.split, indices), batch_size=request.batch_size, shuffle=False,
                            num_workers=target.datamodule.num_workers)
        for start, batch in zip(todo, loader):
            if not attack_batch(target, request, b, run, index, count, start, lambda batch=batch: batch,
                                request.device, bars):
                held.append((b, start))
    attack_held(target, request, runs, held, request.device, bars)


def take_tasks(target: Target, request: AttackRequest, runs: list[RunDirectory], tasks, device: str, bars,
               rank: int, check: Callable[[], None] = lambda: None) -> None:
    """Attack (budget, batch start) tasks from the queue `tasks` until a None, then the ones another process held."""
    held = []
    for b, start in next_tasks(tasks, check):
        if not attack_batch(target, request, b, runs[b], request.shard_index, request.shard_count, start,
                            lambda b=b, start=start: load_batch(target, request, runs[b], start), device, bars, rank):
            held.append((b, start))
    attack_held(target, request, runs, held, device, bars, rank)


def _attack_tasks(rank: int, device: str, request: AttackRequest, tasks, bars, target: Target | None) -> None:
    """A pool worker's job (rgb.runs.pool): a forked worker is handed the parent's `target`; a spawned one opens it."""
    target = target if target is not None else Target.open(request, device)
    take_tasks(target, request, list(run_directories(request, target).values()), tasks, device, bars, rank)


def _attack_pooled(rank: int, device: str, request: AttackRequest, tasks, bars, target: Target | None) -> None:
    """A pool worker's job under schedule=pooled (or pooled_by_need): its share of the units (rgb.runs.pooled; the queue is unused)."""
    target = target if target is not None else Target.open(request, device)
    attack_pooled(target, request, list(run_directories(request, target).values()), device, bars, rank)


def merge(target: Target, request: AttackRequest, budget: Budget, run: RunDirectory, shard_count: int
          ) -> RunSummary:
    """Concatenate every batch into results.parquet + summary.json; refuses (naming them) while any is missing."""
    records = run.load_all(shard_count)
    attacks = {bytes(r["attacks"].tolist()).decode() for r in records}
    if len(attacks) != 1:
        raise AttackRunError(f"{run.directory}: batches were attacked with different attack lists: {sorted(attacks)}")
    attacks = json.loads(attacks.pop())
    warnings = sorted({w for r in records if "warnings" in r for w in json.loads(bytes(r["warnings"].tolist()))})
    columns = {name: torch.cat([r[name] for r in records]) for name in RESULT_COLUMNS}
    if not torch.equal(columns["label"], target.split.labels[: target.n_images(request)]):
        raise AttackRunError(f"{run.directory}: stored labels differ from the test split")
    results_sha256 = run.write_results(columns)

    n, fooled_by = len(columns["label"]), columns["fooled_by"]
    accuracy_after = {name: float(FooledBy.correct_after(fooled_by, k).float().mean())
                      for k, name in enumerate(["clean", *attacks])}
    meta = target.meta
    implementation = attack_implementation(request.impl)
    options = request.options
    summary = RunSummary.recording(
        options, run=str(request.run), run_name=request.run_name, weights_sha256=target.weights_sha256,
        model_family=family_of_record(meta).name, model_name=model_name(meta),
        loss=meta.get("loss"), strategy=meta.get("strategy"),
        dataset=target.datamodule.dataset, source=str(target.datamodule.source), split="test",
        split_sha256=target.split_sha256, n=n, norm=budget.threat.norm.key, eps=budget.threat.eps,
        impl=request.impl, impl_version=implementation.version(),
        standard=standard_run(options.version, attacks, options.precision) and not options.off_protocol(),
        attacks=attacks, tf32=options.precision == "tf32", compile=request.compile,
        channels_last=request.channels_last, batch_size=request.batch_size, threads=request.threads,
        clean_accuracy=accuracy_after["clean"], n_clean_correct=int(columns["clean_correct"].sum()),
        robust_accuracy=float(columns["robust"].float().mean()), n_robust=int(columns["robust"].sum()),
        accuracy_after=accuracy_after,
        attack_seconds=float(sum(float(r["seconds"][0]) for r in records)),
        forward_rows_per_image=float(columns["forward_rows"].double().mean()),
        backward_rows_per_image=float(columns["backward_rows"].double().mean()),
        results_sha256=results_sha256,
        versions=result_versions(),
        complete=True, warnings=warnings, batch_size_auto=run.read_record(BATCH_SIZE_RECORD),
        input_format_auto=run.read_record(INPUT_FORMAT_RECORD) if options.input_format == "auto" else None,
        saturation=run.read_record(SATURATION_RECORD) if options.schedule == "pooled_by_need" else None,
    )
    if request.export:
        summary.export = str(export_adversarial_split(
            target.split, dataset=target.datamodule.dataset, image_size=target.datamodule.image_size,
            root=request.export_dir, surrogate=request.surrogate, threat=budget.threat,
            split_name=budget.export_split, adversarial=torch.cat([r["adversarial"] for r in records]),
            modified=torch.cat([r["modified"] for r in records]).tolist(),
        ))
    run.write_summary(summary)
    return summary


def batch_size_cache() -> Path:
    """Where batch_size=auto keeps its probes' answers (per model, image shape and device): $RGB_CACHE_DIR, else
    $XDG_CACHE_HOME/rgb, else ~/.cache/rgb."""
    root = os.environ.get("RGB_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rgb"
    return Path(root) / "batch_sizes.json"


@contextmanager
def on_request_device(request: AttackRequest, target: Target):
    """The target's model on the request's device for a probe, moved back after it (it waits on the CPU for its
    workers)."""
    where = next(target.model.parameters()).device
    try:
        yield target.model.to(request.device)
    finally:
        target.model.to(where)


def probe_batch_size(request: AttackRequest, target: Target) -> dict:
    """`auto` on the request's device for the target's model: {"batch_size", "source", "device"}
    (rgb.runs.batch_probe)."""
    x, _, _ = load_images(target.split, range(1))
    with on_request_device(request, target) as model:
        return auto_batch_size(model, target.weights_sha256, tuple(x.shape[1:]), torch.device(request.device),
                               batch_size_cache())


def decided_once(request: AttackRequest, target: Target, kind: OnceRecord,
                 measure: Callable[[torch.nn.Module, torch.Tensor], dict],
                 check: Callable[[list[dict]], None] = lambda recorded: None) -> dict:
    """The value `kind` records for the run, decided once per run before any batch so that no worker, shard or
    resume decides again (a timing must never split a run): the first one the run's budget directories record
    (`check` sees them all first, and raises where they cannot go together), else `measure(model, x)` on the first
    batch's rows `x` with the model on the request's device; written into every budget's directory that lacks it,
    all under the first budget's lock."""
    runs = run_directories(request, target)
    with next(iter(runs.values())).claim_record(kind):
        records = {name: run.read_record(kind) for name, run in runs.items()}
        check([record for record in records.values() if record is not None])
        record = next((record for record in records.values() if record is not None), None)
        if record is None:
            x, _, _ = load_images(target.split, range(min(request.batch_size, target.n_images(request))))
            with on_request_device(request, target) as model:
                record = measure(model, x)
        for name, run in runs.items():
            if records[name] is None:
                run.claim()
                run.write_record(kind, record)
    return record


def one_per_run(request: AttackRequest, option: str, what: str, values: set, fix: str) -> None:
    """AttackRunError where the run's norms recorded different `values` of an option decided once per run for all
    of them (its `what`: e.g. "formats"), naming the `fix` (give the option)."""
    if len(values) > 1:
        raise AttackRunError(f"{option}: the norms of {request.output_dir} were started with {what} {sorted(values)}; "
                             f"pass {fix}")


def resolve_input_format(request: AttackRequest, target: Target) -> AttackRequest:
    """`request` with input_format=auto made a format once per run (`decided_once`; NHWC and NCHW round
    differently): the one `decide_input_format` picks on the first batch's rows, recorded with its reason in every
    budget's `input_format.json`, then summary.json."""
    if request.options.input_format != "auto" or request.impl != "ours":  # other implementations ignore it
        return request

    def one_format(recorded: list[dict]) -> None:  # the run attacks all its budgets in one format
        one_per_run(request, "input_format=auto", "formats", {record["input_format"] for record in recorded},
                    "input_format=contiguous or channels_last")

    def decide(model: torch.nn.Module, x: torch.Tensor) -> dict:
        layout, why = decide_input_format(model, x, torch.device(request.device))
        log.info("input_format=auto: %s (%s)", layout, why)
        return {"input_format": layout, "reason": why, "rows": len(x), "device": request.device}

    record = decided_once(request, target, INPUT_FORMAT_RECORD, decide, one_format)
    return replace(request, options=replace(request.options, input_format=record["input_format"]))


def resolve_saturation(request: AttackRequest, target: Target) -> None:
    """Under schedule=pooled_by_need, the rows per call at which the model saturates, measured once per run
    (`decided_once`, so every worker, shard and resume pools the same batches) by
    rgb.runs.batch_probe.saturation_rows: forward + input gradient on the first batch's rows, with a worker's
    threads, in the memory format the run attacks in (input_format=auto is decided first: NHWC and NCHW calls
    saturate at other rows), recorded in every budget's `saturation.json`."""
    if request.options.schedule != "pooled_by_need":
        return
    request = resolve_input_format(request, target)  # a no-op where the format is given or already decided

    def measure(model: torch.nn.Module, x: torch.Tensor) -> dict:
        if request.options.input_format == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        threads = torch.get_num_threads()
        try:
            if request.device.startswith("cpu"):
                torch.set_num_threads(worker_threads(request, request.device, request.processes))
            record = saturation_rows(model, x.float().to(request.device), request.batch_size)
        finally:
            torch.set_num_threads(threads)
        log.info("schedule=pooled_by_need: the model saturates at %d rows per call", record["rows"])
        return {**record, "device": request.device, "input_format": request.options.input_format}

    decided_once(request, target, SATURATION_RECORD, measure)


def resolve_batch_size(request: AttackRequest, target: Target, record: bool = True) -> AttackRequest:
    """`request` with batch_size=auto made a number once per run, before any batch: the number the run's
    directories already name (every shard and resume of a run agrees, whatever its machine), else the probe's,
    written with its manifest and `batch_size.json` into every budget's directory (`record`) under one lock, so
    shards starting together take the first one's number."""
    if request.batch_size != AUTO_BATCH:
        return request

    def recorded() -> AttackRequest | None:
        sizes = {recorded_batch_size(budget_dir(request.output_dir, b.name)) for b in request.budgets} - {None}
        one_per_run(request, "batch_size=auto", "batch sizes", sizes, "batch_size=N")
        return replace(request, batch_size=sizes.pop()) if sizes else None

    if not record:
        return recorded() or replace(request, batch_size=probe_batch_size(request, target)["batch_size"])
    request.output_dir.mkdir(parents=True, exist_ok=True)
    with flock(request.output_dir / BATCH_SIZE_LOCK, wait=True):
        resumed = recorded()
        if resumed is not None:
            return resumed
        answer = probe_batch_size(request, target)
        resolved = replace(request, batch_size=answer["batch_size"])
        for run in run_directories(resolved, target).values():
            run.claim()
            run.write_record(BATCH_SIZE_RECORD, answer)
        log.info("batch_size=auto: %d (%s, %s)", answer["batch_size"], answer["source"], answer["device"])
        return resolved


def run_directories(request: AttackRequest, target: Target) -> dict[str, RunDirectory]:
    return {b.name: RunDirectory(budget_dir(request.output_dir, b.name), target.identity(request, b))
            for b in request.budgets}


def execute(request: AttackRequest, model: InMemoryModel | None = None) -> dict[str, RunSummary]:
    """Attack this node's shard of every budget (unless merge_only), then merge every budget whose batches are all
    there. Returns the merged summaries by budget name and logs one line per budget. With `request.processes`
    > 1 the batches go to that many workers (at most one per unfinished batch; a GPU each, or on the CPU their
    share of the threads; forked where single-threaded on the CPU, else spawned); under `schedule=pooled` (or
    `pooled_by_need`) they share the units of rgb.runs.pooled (a batch's clean pass, a chunk of a stage's survivors) instead of whole batches.
    `model`: an in-memory model whose weights `request.run` holds (rgb.benchmark), attacked in this process, and on
    the CPU also in workers forked with it (a spawned worker could not get it)."""
    pool = (request.processes > 1 and not request.merge_only
            and (model is None or worker_start_method(request, request.processes) == "fork"))
    target = Target.open(request, "cpu" if pool else request.device, model)
    request = resolve_batch_size(request, target, record=not request.merge_only)
    runs = run_directories(request, target)
    asked = request  # what the summary records: input_format=auto, with what it decided (merge)
    if not request.merge_only:
        implementation = attack_implementation(request.impl)
        for budget in request.budgets:
            implementation.check(target.model, budget.threat, request)
        request = resolve_input_format(request, target)
        resolve_saturation(request, target)
    for run in runs.values():
        run.claim(create=not request.merge_only)
    index, count = request.shard_index, request.shard_count
    summaries: dict[str, RunSummary] = {}

    def report(b: int) -> None:
        """Merge budget `b` once every shard's batches are there, and log its lines at once (not after the others)."""
        budget = request.budgets[b]
        run = runs[budget.name]
        missing = run.missing_batches()
        if missing and not request.merge_only:
            log.info("%s: this shard is done; merge waits for %s", budget.name, run.describe_missing(missing, count))
            return
        summary = summaries[budget.name] = merge(target, asked, budget, run, count)
        log.info("%s", summary.line())
        log.info("%s", summary.stages())
        if request.max_images is not None:
            log.warning("%s: PARTIAL, the first %d of %d test images (max_images): a first look, never the "
                        "benchmark's number", budget.name, summary.n, len(target.split))

    reported: set[int] = set()
    if not request.merge_only:
        ordered = list(runs.values())  # stale temp files of a killed process go when its batch is claimed
        tasks = [(b, start) for b, run in enumerate(ordered) for start in unfinished(run, index, count)]
        workers = min(request.processes, len(tasks)) if pool else 1

        def done(b: int) -> None:
            reported.add(b)
            report(b)

        bars = Bars(request, ordered, index, count, done)
        pooled = request.options.schedule != "batch"  # pooled, or pooled_by_need
        if pooled:  # a resumed pooled run's bars start after the images its saved units let go
            for b, left in enumerate(images_left(target, request, ordered)):
                bars.resumed(b, left)
        try:
            with logging_redirect_tqdm():  # a budget's lines while the other bars are drawn
                on_cpu = request.device.startswith("cpu")
                if pool and (workers > 1 or not on_cpu):

                    def own_share(queue, shared, check) -> None:  # on the CPU: worker 0, with the model it holds
                        if pooled:
                            attack_pooled(target, request, ordered, request.device, shared, 0, check)
                        else:
                            take_tasks(target, request, ordered, queue, request.device, shared, 0, check)

                    attack_in_workers(request, [] if pooled else tasks, workers, bars,
                                      _attack_pooled if pooled else _attack_tasks, own_share if on_cpu else None,
                                      target if on_cpu else None)
                elif pooled:
                    attack_pooled(target, request, ordered, request.device, bars)
                else:
                    attack_shard(target, request, ordered, bars)
        finally:
            bars.close()
    for b in range(len(request.budgets)):  # budgets done before this run started (resumed, merge_only)
        if b not in reported:
            report(b)
    for name in summaries:  # merged: the pooled units are spent (kept until every worker has stopped)
        runs[name].clear_pooled()
    return {b.name: summaries[b.name] for b in request.budgets if b.name in summaries}

