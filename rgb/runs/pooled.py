"""The pooled schedule of an attack run (`schedule=pooled`): the cascade runs stage by stage over the survivors of
all of a shard's batches, re-cut into full chunks of `batch_size` in image order, as the reference does within one
call, so every stage attacks full batches to its end (on a GPU, the few survivors of one batch leave it idle).

Resumable work is a unit: the clean pass of one batch (stage 0) or one chunk of a stage's survivors, each saved by
the store as soon as it is done, under its lock, and never redone. A stage's chunks are fixed by the outcomes of the
stages before it, so every process cuts the same chunks, and a stage starts once every unit of the one before is
saved (a barrier; a process that meets one attacks another budget meanwhile). Each attack draws its random starts
from `seed` afresh per chunk, as per batch, so a result depends on the chunk's images only, never on which process
ran it, nor when. Once the last stage is done, each batch is finished (the final checks) and saved as an ordinary
batch file: merging, evaluation and directories of the batch schedule see no difference.

`schedule=pooled_by_need` pools by need: a batch whose survivors entering a stage are at least the rows per call at
which the model saturates (measured once per run, `saturation.json`) is that stage's chunk alone, as the batch
schedule attacks it, so its images' results are the batch schedule's bit for bit; only the batches whose survivors
fall below it share chunks (and, once below, they stay below: survivors only shrink).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch

from rgb.attacks.autoattack import AutoAttack, CascadeState, FooledBy
from rgb.attacks.registry import describe_stage
from rgb.runs.records import batch_record, load_images
from rgb.runs.store import SATURATION_RECORD, RunDirectory

POLL_SECONDS = 0.2  # how often a process whose next units other processes hold looks again
FINISH = -1  # the unit kind that finishes a batch once every stage is done (its unit: the batch start)


class PooledShard:
    """One budget's pooled cascade over the batches of this shard, as this process sees it: per-image tables of the
    stages complete so far, the units left, and doing one of them."""

    def __init__(self, target, request, b: int, run: RunDirectory, device: str, bars, worker: int = 0):
        self.target, self.request, self.b, self.run, self.bars, self.worker = target, request, b, run, bars, worker
        self.index, self.count = request.shard_index, request.shard_count
        self.batch_size = request.batch_size
        n = run.identity["n_images"]
        unfinished = [s for s in run.shard_starts(self.index, self.count) if run.finished(s) is None]
        self.starts = run.pooled_plan(self.index, self.count, unfinished)
        self.batches = {s: torch.arange(s, min(s + self.batch_size, n)) for s in self.starts}
        self.ids = torch.cat(list(self.batches.values())) if self.starts else torch.empty(0, dtype=torch.long)
        self.row = {image_id: row for row, image_id in enumerate(self.ids.tolist())}
        threat = request.budgets[b].threat
        self.attack = AutoAttack(target.model, threat.norm.value, threat.eps, request.options, device=device,
                                 progress=lambda name, *at: bars.stage(b, worker, describe_stage(name, at)),
                                 on_leave=lambda left: bars.left(b, left),
                                 on_rows=lambda *counts: bars.rows(b, worker, *counts))
        self.n_stages = len(self.attack.attacks)
        # pooled_by_need: a batch with fewer survivors than this is pooled (None: every batch is, schedule=pooled)
        by_need = request.options.schedule == "pooled_by_need"
        self.pool_below = run.read_record(SATURATION_RECORD)["rows"] if by_need else None
        rows = len(self.ids)
        self.folded = -1  # the last stage whose outcomes are in the tables below
        self.chunk_ids: dict[int, list[torch.Tensor]] = {}
        self.clean_logits = torch.empty(0)
        self.clean_correct = torch.zeros(rows, dtype=torch.bool)
        self.fooled_by = torch.full((rows,), FooledBy.ROBUST)
        self.y_adv = torch.zeros(rows, dtype=torch.long)
        self.forward_rows = torch.zeros(rows, dtype=torch.float64)
        self.backward_rows = torch.zeros(rows, dtype=torch.float64)
        self.seconds = torch.zeros(rows, dtype=torch.float64)  # each unit's wall time, shared by its images
        self.warnings: dict[int, list[str]] = {}
        self.adversarial: dict[int, tuple[int, int, int]] = {}  # row -> (stage, chunk, row of that chunk's x_adv)

    # -- what is left ------------------------------------------------------------------------------------
    def next_units(self) -> list[tuple[int, int]]:
        """(stage, unit) of the first stage with units unsaved (stage 0: batch starts, later: chunk numbers), or
        once every stage is saved (FINISH, batch start) of the batches not finished; [] when all are (then
        the units may be gone: the run merges and removes them)."""
        if all(self.run.finished(s) is not None for s in self.starts):
            return []
        while self.folded < self.n_stages:
            stage = self.folded + 1
            missing = [u for u in self.units(stage) if not self.saved(stage, u)]
            if missing:
                return [(stage, u) for u in missing]
            self.fold(stage)
        return [(FINISH, s) for s in self.starts if self.run.finished(s) is None]

    def units(self, stage: int) -> list[int]:
        return self.starts if stage == 0 else list(range(len(self.chunks(stage))))

    def saved(self, stage: int, unit: int) -> bool:
        return self.run.unit_path(self.index, self.count, stage, unit).is_file()

    def chunks(self, stage: int) -> list[torch.Tensor]:
        """Image ids of each chunk of `stage` (asked once the stages before it are folded): the survivors of those
        stages in image order, cut at batch_size; by need, first each batch keeping at least `pool_below` survivors
        alone, then the others' survivors so cut. None once no image survives (`split` of an empty tensor would give
        one empty chunk)."""
        if stage not in self.chunk_ids:
            if self.folded != stage - 1:
                raise RuntimeError(f"chunks of stage {stage} asked with stage {self.folded} folded")
            alive = self.clean_correct & (self.fooled_by == FooledBy.ROBUST)
            parts = [self.ids[self.rows(s)][alive[self.rows(s)]] for s in self.starts]
            alone = [p for p in parts if self.pool_below is not None and len(p) >= self.pool_below]
            pooled = [p for p in parts if self.pool_below is None or len(p) < self.pool_below]
            survivors = torch.cat(pooled) if pooled else torch.empty(0, dtype=torch.long)
            self.chunk_ids[stage] = alone + (list(survivors.split(self.batch_size)) if len(survivors) else [])
        return self.chunk_ids[stage]

    def unit_ids(self, stage: int, unit: int) -> torch.Tensor:
        return self.batches[unit] if stage == 0 else self.chunks(stage)[unit]

    def left_before(self) -> int:
        """Images of the unfinished batches that already left the cascade in saved units (clean-wrong, fooled):
        where a resumed run's progress bar starts."""
        pending = self.next_units()
        unfinished = torch.zeros(len(self.ids), dtype=torch.bool)
        for s in self.starts:
            if self.run.finished(s) is None:
                unfinished[self.rows(s)] = True
        left = int((unfinished & (self.fooled_by != FooledBy.ROBUST)).sum())
        stage = self.folded + 1
        if pending and pending[0][0] != FINISH:
            for unit in self.units(stage):
                if self.saved(stage, unit):
                    record = self.load(stage, unit)
                    left += int((~record["clean_correct"] if stage == 0 else record["fooled"]).sum())
        return left

    # -- the tables of complete stages -------------------------------------------------------------------
    def rows(self, start: int) -> slice:
        first = self.row[int(self.batches[start][0])]
        return slice(first, first + len(self.batches[start]))

    def load(self, stage: int, unit: int) -> dict[str, torch.Tensor]:
        return self.run.load_unit(self.index, self.count, stage, unit, self.unit_ids(stage, unit))

    def fold(self, stage: int) -> None:
        """Read every unit of a stage (all saved) into the per-image tables."""
        for unit in self.units(stage):
            record = self.load(stage, unit)
            if stage == 0:
                rows = self.rows(unit)
                if not self.clean_logits.numel():
                    self.clean_logits = torch.empty(len(self.ids), record["clean_logits"].shape[1])
                self.clean_logits[rows] = record["clean_logits"]
                self.clean_correct[rows] = record["clean_correct"]
                self.y_adv[rows] = record["clean_logits"].argmax(dim=1)
                self.fooled_by[rows] = torch.where(record["clean_correct"], FooledBy.ROBUST, FooledBy.CLEAN_WRONG)
                self.warnings[unit] = json.loads(bytes(record["warnings"].tolist()))
            else:
                rows = torch.tensor([self.row[i] for i in record["image_id"].tolist()], dtype=torch.long)
                hit = rows[record["fooled"]]
                self.fooled_by[hit] = stage
                self.y_adv[hit] = record["y_adv"][record["fooled"]]
                for k, row in enumerate(hit.tolist()):
                    self.adversarial[row] = (stage, unit, k)
            self.forward_rows[rows] += record["forward_rows"]
            self.backward_rows[rows] += record["backward_rows"]
            self.seconds[rows] += float(record["seconds"][0]) / len(record["image_id"])
        self.folded = stage

    # -- doing a unit ------------------------------------------------------------------------------------
    def do(self, stage: int, unit: int) -> bool:
        """Do one unit under its claim and save it; False, with nothing done, while another process holds it."""
        if stage == FINISH:
            claim = self.run.claim_batch(unit)
            if claim is None:
                return False
            with claim:
                theirs = self.run.finished(unit)
                if theirs is not None:
                    record = self.run.load(theirs, unit)
                else:
                    record = self.finished_batch(unit)
                    self.run.save(self.index, self.count, unit, record)
                self.bars.batch_done(self.b, self.worker, len(record["robust"]), int(record["robust"].sum()))
            return True
        claim = self.run.claim_unit(self.index, self.count, stage, unit)
        if claim is None:
            return False
        with claim:
            if not self.saved(stage, unit):
                record = self.clean_pass(unit) if stage == 0 else self.chunk(stage, unit)
                self.run.save_unit(self.index, self.count, stage, unit, record)
        return True

    def clean_pass(self, start: int) -> dict[str, torch.Tensor]:
        x, y, image_id = load_images(self.target.split, self.batches[start].tolist())
        began = time.perf_counter()
        state = self.attack.clean_pass(x, y, self.batch_size)
        return {"image_id": image_id.long(), "clean_logits": state.clean_logits, "clean_correct": state.clean_correct,
                "forward_rows": state.forward_rows, "backward_rows": state.backward_rows,
                "seconds": torch.tensor([time.perf_counter() - began], dtype=torch.float64),
                "warnings": torch.tensor(list(json.dumps(state.warnings).encode()), dtype=torch.uint8)}

    def chunk(self, stage: int, unit: int) -> dict[str, torch.Tensor]:
        ids = self.chunks(stage)[unit]
        x, y, image_id = load_images(self.target.split, ids.tolist())
        began = time.perf_counter()
        rows = torch.tensor([self.row[i] for i in ids.tolist()], dtype=torch.long)
        state = self.attack.entering_stage(x.float(), y.long(), self.clean_logits[rows])
        self.attack.attack_stage(stage, state, torch.arange(len(ids)), self.batch_size)
        fooled = ~state.robust
        return {"image_id": image_id.long(), "fooled": fooled, "y_adv": state.y_adv, "x_adv": state.x_adv[fooled],
                "forward_rows": state.forward_rows, "backward_rows": state.backward_rows,
                "seconds": torch.tensor([time.perf_counter() - began], dtype=torch.float64)}

    def finished_batch(self, start: int) -> dict[str, torch.Tensor]:
        """The batch's record from the tables and the fooled images of the chunks: AutoAttack's final checks, then
        the same checks and columns as a batch of the batch schedule."""
        rows = self.rows(start)
        x, y, image_id = load_images(self.target.split, self.batches[start].tolist())
        x = x.float()
        x_adv = x.clone()
        chunks: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        for k in range(len(x)):
            if rows.start + k in self.adversarial:
                stage, unit, position = self.adversarial[rows.start + k]
                if (stage, unit) not in chunks:
                    chunks[stage, unit] = self.load(stage, unit)
                x_adv[k] = chunks[stage, unit]["x_adv"][position]
        fooled_by, clean_correct = self.fooled_by[rows].clone(), self.clean_correct[rows].clone()
        accuracy_after = {"clean": float(clean_correct.float().mean())}
        for stage, name in enumerate(self.attack.attacks, start=1):
            accuracy_after[name] = float(FooledBy.correct_after(fooled_by, stage).float().mean())
        state = CascadeState(
            x=x, y=y.long(), clean_logits=self.clean_logits[rows], params={}, warnings=self.warnings[start],
            y_adv=self.y_adv[rows].clone(), clean_correct=clean_correct,
            robust=clean_correct & (fooled_by == FooledBy.ROBUST), fooled_by=fooled_by, x_adv=x_adv,
            accuracy_after=accuracy_after, evaluations={}, forward_rows=self.forward_rows[rows].clone(),
            backward_rows=self.backward_rows[rows].clone(),
        )
        result = self.attack.finish(state, self.batch_size)
        return batch_record(result, x, y, image_id, self.request.budgets[self.b], float(self.seconds[rows].sum()),
                            self.request.export)


def attack_pooled(target, request, runs: list[RunDirectory], device: str, bars, worker: int = 0,
                  check: Callable[[], None] = lambda: None) -> None:
    """This process's share of the pooled cascades of every budget of this shard: the first unit no process holds,
    in budget order, until every batch is finished; while other processes hold every unit left (a stage's last
    chunks before its barrier), look again every POLL_SECONDS (`check()` raises when the run must stop)."""
    shards = [PooledShard(target, request, b, run, device, bars, worker) for b, run in enumerate(runs)]
    while True:
        pending = [(shard, unit) for shard in shards for unit in shard.next_units()]
        if not pending:
            return
        if not any(shard.do(*unit) for shard, unit in pending):
            check()
            time.sleep(POLL_SECONDS)


def images_left(target, request, runs: list[RunDirectory]) -> list[int]:
    """Per budget, the images of unfinished batches that left the cascade in units saved before this run."""
    return [PooledShard(target, request, b, run, "cpu", None).left_before() for b, run in enumerate(runs)]
