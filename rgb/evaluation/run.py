"""What evaluate.py does once its config is a request (rgb.commands.evaluate builds them): score one model
(`evaluate(EvalRequest)`), or rank a pool of scored models (`evaluate_pool(PoolRequest)`).

What it reports goes through `logging` (Hydra writes it to the console and to evaluate.log alike).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from rgb.core.files import atomic_write_json, replaced_whole
from rgb.core.machine import resolve_device
from rgb.data.catalog import BLACK_BOX
from rgb.endpoints.client import RequestCaps
from rgb.evaluation.endpoint_eval import cache_path, request_budget
from rgb.evaluation.leaderboard import (
    Leaderboard,
    LeaderboardError,
    build_leaderboard,
    find_records,
    seed_spread,
    seed_spread_markdown,
    to_markdown,
    write_leaderboard,
    write_seed_spread,
)
from rgb.evaluation.model_eval import (
    EvaluationError,
    evaluate_model,
    format_table,
    partial_reason,
    plan_table,
    request_plan,
)
from rgb.evaluation.records import PROTOCOLS, SCORES_FILE, RecordError, ScoresRecord, TrainRun
from rgb.evaluation.request import EvalRequest
from rgb.evaluation.site import SITE_DIR, SiteEntry, write_site
from rgb.models import InMemoryModel, export_paths, family_of_record, load_with_meta
from rgb.models.io import origin_line
from rgb.runs.store import attack_dir_read, train_reference

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolRequest:
    """evaluate.py pool=[...]: each entry's scores, then the leaderboard (and mean +- std over seeds).

    A trained model of an entry is evaluated first (one EvalRequest each, as run=DIR would be); a dir of
    scores.json files (a Path) is taken as it is. `evaluate_pool` runs it.

    Args:
        entries: EvalRequests of trained models, or dirs of scores.json files.
        protocol: The protocol the board ranks ("white_box" or "black_box").
        leaderboard_dir: Where the leaderboard is written (replaced whole).
        datasets: The datasets of the board; None: the card's six.
        rank_by: How complete entries are ranked ("borda" or "sum", rgb.evaluation.leaderboard).
        site: Also write the static site (rgb.evaluation.site) in `<leaderboard_dir>/site`.
        wandb_project: Log the board's table and files to this W&B project; None: nothing logged.
        missing_jobs: Sweep jobs without a model: no mean +- std over part of a sweep.
    """

    entries: tuple[EvalRequest | Path, ...]
    protocol: str
    leaderboard_dir: Path
    datasets: tuple[str, ...] | None  # None: the card's six
    rank_by: str
    site: bool = False  # also the static site (rgb.evaluation.site) in <leaderboard_dir>/site
    wandb_project: str | None = None  # the leaderboard's table and files to W&B; None: nothing logged
    missing_jobs: tuple[Path, ...] = ()  # sweep jobs without a model: no mean +- std over a sweep's part


def evaluate_pool(request: PoolRequest) -> None:
    """The pool's models evaluated, then the leaderboard, and mean +- std over seeds when the trained models of the
    pool differ in their seed only; with `site`, the static site of both protocols' boards."""
    sources, trained, runs = [], [], {}
    for entry in request.entries:
        if isinstance(entry, Path):
            sources.append(entry)
            continue
        record, meta = evaluate(entry)
        if record is None:  # dry_run
            continue
        sources.append(entry.model.output_dir)
        trained.append((record, meta))
        runs[(record.folder(entry.model.output_dir) / record.file_name).resolve()] = (entry, meta)
    spread = seed_spread([record for record, _ in trained], [meta for _, meta in trained], request.protocol)
    if request.missing_jobs:
        spread = None  # seeds.md (and one an earlier pool wrote) would describe part of the sweep as all of it
        log.warning("sweep jobs without a model (failed, running or removed): %s; no mean +- std over seeds "
                    "(seeds.md / seeds.json removed) until they are there", ", ".join(map(str, request.missing_jobs)))
    try:
        records = find_records(sources)
        with replaced_whole(request.leaderboard_dir) as staging:  # all files new, or all as they were
            board = write_leaderboard(records, staging, request.protocol,
                                      None if request.datasets is None else list(request.datasets), request.rank_by)
            write_seed_spread(spread, staging)
            boards = both_boards(board, records) if request.site or request.wandb_project else [board]
            if request.site:
                site = write_pool_site(boards, records, runs, staging / SITE_DIR)
    except (LeaderboardError, RecordError) as err:
        raise EvaluationError(str(err)) from err
    log.info("%s", to_markdown(board).rstrip("\n"))
    if spread is not None:
        log.info("%s", seed_spread_markdown(spread).rstrip("\n"))
    log.info("leaderboard written to %s", request.leaderboard_dir)
    if request.wandb_project is not None:
        from rgb.evaluation.wandb_report import log_leaderboard, logged_scores

        log_leaderboard(board, request.leaderboard_dir, request.wandb_project,
                        others=[b for b in boards if b is not board], inputs=logged_scores(records))
    if request.site:
        index = (request.leaderboard_dir / site.relative_to(staging)).resolve()
        log.info("leaderboard site written to %s (open %s in a browser; it needs no server)", index.parent,
                 index.as_uri())


def both_boards(board: Leaderboard, records: dict[Path, ScoresRecord]) -> list[Leaderboard]:
    """`board` (what leaderboard.json holds) and the board of the other protocol from the same records, in
    PROTOCOLS order."""
    other = next(p for p in PROTOCOLS if p != board.protocol)
    boards = [board, build_leaderboard(records, other, board.datasets, board.rank_by)]
    return sorted(boards, key=lambda b: list(PROTOCOLS).index(b.protocol))


def write_pool_site(boards: list[Leaderboard], records: dict[Path, ScoresRecord], runs: dict, out: Path) -> Path:
    """The site of a pool's boards (both_boards); each record with its train run, model.json and attack dir when
    the pool evaluated it."""
    entries = []
    for file, record in records.items():
        entry, meta = runs.get(file.resolve(), (None, None))
        entries.append(SiteEntry(file, record, entry and entry.model.run, meta, entry and entry.attack_dir))
    return write_site(boards, entries, out)


def train_run(run: Path, meta: dict, root: Path | None, weights_sha256: str) -> TrainRun:
    """The training run of the model in `run` as its scores record carries it."""
    return TrainRun.of(train_reference(run, weights_sha256, root), meta)


def evaluate(request: EvalRequest, model: InMemoryModel | None = None) -> tuple[ScoresRecord | None, dict]:
    """Evaluate the requested model (its scores record, None for a dry run, and model.json), named as its run
    record says. `model`: an in-memory model whose export `request.model.run` holds (rgb.benchmark), scored as
    it is rather than loaded back (as rgb.runs.runner.execute attacks it)."""
    if request.max_images is not None and not request.allow_partial:
        raise EvaluationError("max_images scores part of each split: add allow_partial=true to accept that")
    run = request.model.run
    model, meta = load_with_meta(run) if model is None else (model.module, dict(model.meta))
    meta["run_name"] = request.model.run_name  # rgb.runs.store.run_name_for: a sweep job's unique name
    origin = origin_line(meta)
    if origin:
        log.info("model %s: %s", meta["run_name"], origin)
    api_model = getattr(model, "inputs", "tensor") != "tensor"
    request = replace(  # resolved once, then read as it is by every step of the scoring
        request, attack_dir=attack_dir_read(request.attack_dir, request.max_images),
        transfer=request.transfer or request.protocol == BLACK_BOX, device=resolve_device(request.device),
    )
    if (request.dry_run or request.caps.capped) and not api_model:
        raise EvaluationError(f"dry_run, {', '.join(RequestCaps.names())} count API requests; {run} holds "
                              f"a model of family {family_of_record(meta).name!r}")
    request = replace(request, allow_partial=request.allow_partial or request.caps.capped)  # capped: may be partial
    out_dir = request.model.output_dir
    if api_model:
        request_budget(model, request)  # a cap it cannot honour is refused before anything is asked
    if request.dry_run:
        plan = request_plan(model, request.data(), request)
        path = cache_path(request.api_cache_dir, model).with_suffix(".dry_run.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, plan, indent=1)
        log.info("dry run of %s on %s: %d distinct requests to send (%d images: %d answered by the cache, %d "
                 "duplicates of other images), asking nothing; tokens estimated without a tokenizer (text: characters"
                 " / 4, image: OpenAI's tile rule; completion: its limit)%s\n%s\nwritten to %s", meta["run_name"],
                 meta["dataset"], plan["requests"], plan["images"], plan["answered_by_cache"], plan["duplicates"],
                 "" if plan["price"] is not None else "; no price known (model.price, conf/prices.yaml): no USD",
                 plan_table(plan), path)
        return None, meta
    with replaced_whole(out_dir) as staging:  # all outputs written, then they replace the previous ones together
        weights, _ = export_paths(run)
        train = partial(train_run, run, meta, request.output_root)
        staged = replace(request, model=replace(request.model, output_dir=staging))
        record = evaluate_model(model, meta, weights, request.data(), staged, train=train)
    if record.partial:  # named once the staging copy has replaced out_dir: a path that exists
        log.warning("PARTIAL evaluation (%s): written to %s; %s", partial_reason(record),
                    record.folder(out_dir) / record.file_name, "the whole-split record beside it is kept"
                    if (out_dir / SCORES_FILE).is_file() else "not a leaderboard entry")
    log.info("%s", format_table(record))
    log.info("results in %s", record.folder(out_dir))
    if request.wandb_project is not None:
        from rgb.evaluation.wandb_report import log_evaluation

        log_evaluation(record, record.folder(out_dir), request.wandb_project,
                       train=train_reference(run, record.model.weights_sha256, request.output_root))
    return record, meta
