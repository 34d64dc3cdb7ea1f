"""The attack run's process pool: the (budget, batch start) tasks of a run go to several processes (a GPU each, or
CPU cores sharing the threads) that each take the next task from a queue when done, and report their progress to
this process, which draws the bars; the first failure stops them all. What a task is belongs to the caller
(rgb.runs.runner)."""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Callable
from queue import Empty

import torch

from rgb.core.errors import UserError
from rgb.core.machine import configure_threads, die_with_parent, keep_freed_memory
from rgb.runs.request import AttackRequest
from rgb.runs.store import AttackRunError

log = logging.getLogger(__name__)


class _Events:
    """A worker's bars (rgb.runs.runner.Bars): the same calls, sent to the parent process that draws the bars."""

    def __init__(self, queue):
        self.queue = queue

    def __getattr__(self, method: str):
        return lambda *args: self.queue.put((method, args))


def next_tasks(tasks, check: Callable[[], None]):
    """The queue's tasks until its None; `check()` runs while none comes (it raises when the run must stop: a worker
    killed while reading the queue leaves its lock held for good)."""
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except Empty:
            check()
            continue
        if task is None:
            return
        yield task


def worker_threads(request: AttackRequest, device: str, workers: int) -> int:
    """A worker's torch threads: on the CPU its share (one each by default: single-threaded processes cannot
    spin-wait on each other the way OpenMP threads of processes sharing cores do); on a GPU the run's."""
    return request.threads if device.startswith("cuda") else max(1, request.threads // workers)


def _worker(rank: int, workers: int, request: AttackRequest, tasks, events, job: Callable, inherited=None) -> None:
    """Worker `rank` of `workers`: `job(rank, device, request, tasks, bars, inherited)` on GPU `rank` (modulo the
    visible GPUs: workers beyond their count share them) or on the CPU
    with its share of the threads, its progress and its end reported to the parent."""
    die_with_parent()
    keep_freed_memory()  # a forked worker may have it already (attack.py's parent sets it; rgb.benchmark's does not)
    try:
        device = f"cuda:{rank % max(torch.cuda.device_count(), 1)}" if request.device.startswith("cuda") else request.device
        configure_threads(worker_threads(request, device, workers))
        job(rank, device, request, tasks, _Events(events), inherited)
        events.put(("exit", (rank,)))
    except Exception as err:  # the parent names it and stops the other workers
        user = isinstance(err, UserError)  # AttackRunError, AttackError, an option a model refuses, ...
        events.put(("error", (rank, f"{type(err).__name__}: {err}", None if user else traceback.format_exc())))


def worker_start_method(request: AttackRequest, workers: int) -> str:
    """`fork` for single-threaded CPU workers on Linux: the child has the parent's model and split at once, where a
    spawned one re-imports torch and reloads both (seconds each, on every core). `spawn` for GPUs (CUDA is not
    fork-safe) and for multi-threaded CPU workers (a forked child must not enter OpenMP regions the parent ran)."""
    single = not request.device.startswith("cuda") and worker_threads(request, request.device, workers) == 1
    return "fork" if single and sys.platform.startswith("linux") else "spawn"


class _SharedBars:
    """The parent's bars while it is a worker too: drawn one call at a time from its two threads, and once a worker
    failed (`failure`) the parent's own attack stops at its next report (its batch is left unsaved, for the re-run)."""

    def __init__(self, bars):
        self.bars, self.lock = bars, threading.Lock()
        self.failure: AttackRunError | None = None

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def __getattr__(self, method: str):
        def call(*args):
            self.check()
            with self.lock:
                getattr(self.bars, method)(*args)
        return call


def pump_events(events, processes: dict, bars: _SharedBars, stopping: threading.Event) -> None:
    """Draw the workers' reports on the bars until every worker has exited; the first failure (a worker's error, a
    worker that stopped without a word, or this thread's own error) goes to `bars.failure` and ends the pump."""
    try:
        _pump(events, processes, bars, stopping)
    except BaseException as err:  # never end quietly: the run would look finished with batches missing
        bars.failure = AttackRunError(f"the thread drawing the workers' progress failed: {type(err).__name__}: {err}")


def _pump(events, processes: dict, bars: _SharedBars, stopping: threading.Event) -> None:
    running = set(processes)
    while running and bars.failure is None and not stopping.is_set():
        try:
            method, args = events.get(timeout=0.2)
        except Empty:
            stopped = [rank for rank in sorted(running) if not processes[rank].is_alive()]
            if not stopped:
                continue
            try:  # its last words may have reached the pipe after the wait above ended (it flushes them, then exits)
                method, args = events.get(timeout=0.2)
            except Empty:
                bars.failure = AttackRunError(f"attack worker {stopped[0]} stopped (exit code "
                                              f"{processes[stopped[0]].exitcode}) before its batches were done; "
                                              f"re-run to continue")
                continue
        if method == "exit":
            running.discard(args[0])
        elif method == "error":
            rank, message, trace = args
            if trace:
                log.error("attack worker %d failed:\n%s", rank, trace)
            bars.failure = AttackRunError(f"attack worker {rank}: {message}")
        else:
            getattr(bars, method)(*args)


def attack_in_workers(request: AttackRequest, tasks: list[tuple[int, int]], workers: int, bars, job: Callable,
                      own_share: Callable | None = None, inherited=None) -> None:
    """Attack `tasks` (budget number, batch start) in `workers` processes that each take the next task when done (a
    batch of robust images costs 100x one that falls at once, so a fixed split would leave cores idle); the results
    are those of one process, batch for batch. Each worker runs `job` (a module-level function: a spawned worker
    imports it). With `own_share(tasks, bars, check)` (the CPU) this process is worker 0 with the model it already
    holds, so batches start at once; the others are forked from it with `inherited` (its model) where they may be
    (worker_start_method), else spawned. This process draws the bars."""
    method = worker_start_method(request, workers)
    context = torch.multiprocessing.get_context(method)
    queue, events = context.Queue(), context.Queue()
    for task in [*tasks, *[None] * workers]:
        queue.put(task)
    inherited = inherited if method == "fork" else None
    processes = {rank: context.Process(target=_worker, args=(rank, workers, request, queue, events, job, inherited),
                                       name=f"rgb-attack-{rank}")
                 for rank in range(int(own_share is not None), workers)}
    for process in processes.values():
        process.start()
    shared, stopping = _SharedBars(bars), threading.Event()
    pump = threading.Thread(target=pump_events, args=(events, processes, shared, stopping), name="rgb-attack-events",
                            daemon=True)
    pump.start()
    try:
        if own_share is not None:  # this process's own threads come back after its share (rgb.benchmark's caller)
            threads = torch.get_num_threads()
            configure_threads(worker_threads(request, request.device, workers))
            try:
                own_share(queue, shared, shared.check)
            finally:
                torch.set_num_threads(threads)
        pump.join()
        if shared.failure is not None:
            raise shared.failure
    finally:
        stopping.set()
        for process in processes.values():
            if process.is_alive():
                process.terminate()
            process.join()
        pump.join()

