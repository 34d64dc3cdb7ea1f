"""The attack run store: the only code that knows the layout of a run directory and the summary.json schema, and
the names that attack and evaluation outputs get from the train run they score (`run_name_for`, `train_runs`).

One threat model's directory holds `run.json` (the identity of what its results depend on), per-batch tensor
files of every shard (`shard-<i>-of-<n>/batch-<start>.pt`, atomic; `locks/batch-<start>.lock` held by the process
attacking that batch, so several processes may share one shard), and after merging `results.parquet` plus
`summary.json`. A pooled run (rgb.runs.pooled) keeps its units until the merge in `pooled-<i>-of-<n>/`: `plan.json`,
`stage-0/batch-<start>.pt` (clean passes) and `stage-<k>/chunk-<j>.pt` (stage k's chunks of survivors). Evaluation reads results only through `read_run`, which checks what it reads.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rgb.attacks.options import AttackOptions
from rgb.attacks.registry import VERSIONS, is_standard
from rgb.core.files import atomic_write_bytes, atomic_write_json, file_sha256, flock, sha256_alias, stable_id
from rgb.core.jsonrecord import JsonRecord, RecordError, decode, read_json
from rgb.core.rundir import MANIFEST, IdentityManifest
from rgb.core.values import path_name
from rgb.core.exportfiles import META_FILE, WEIGHTS_FILE, model_record
from rgb.runs.errors import AttackRunError

if TYPE_CHECKING:
    import torch


LOCK_DIR = "locks"  # one flock file per batch (or pooled unit): which process is attacking it
POOLED_PLAN = "plan.json"  # the batches a shard's pooled run pools (rgb.runs.pooled)
RESULTS_FILE = "results.parquet"
SUMMARY_FILE = "summary.json"
COST_ESTIMATE_FILE = "cost_estimate.json"  # attack.py dry_run=true: beside the run's budget dirs
BATCH_SIZE_FILE = "batch_size.json"  # how batch_size=auto became the number in run.json (rgb.runs.runner)
BATCH_SIZE_LOCK = ".batch_size.lock"  # in a model's attack dir: one process at a time resolves batch_size=auto
INPUT_FORMAT_FILE = "input_format.json"  # what input_format=auto decided for the run, and why (rgb.runs.runner)
SATURATION_FILE = "saturation.json"  # schedule=pooled_by_need: the rows per call measured once for the run


@dataclass(frozen=True)
class OnceRecord:
    """A value decided once per run and recorded in each budget's directory, so that every worker, shard and resume
    reuses it instead of deciding again (a timing must never split a run; rgb.runs.runner's `decided_once`)."""

    file: str  # its JSON file in a budget's directory; decided under `locks/<stem>.lock` (batch size: see below)
    again: str  # what deleting a file that does not read leads to


# {"batch_size", "source", "device"}: how batch_size=auto became the number in run.json (decided under the attack
# dir's BATCH_SIZE_LOCK, since a budget's directory needs the number first).
BATCH_SIZE_RECORD = OnceRecord(BATCH_SIZE_FILE, "batch_size=auto probes again")
# {"input_format", "reason", "rows", "device"}: what input_format=auto decided.
INPUT_FORMAT_RECORD = OnceRecord(INPUT_FORMAT_FILE, "input_format=auto decides again")
# {"rows", "seconds_per_row", "within", "device", "input_format"}: where the model saturates (pooled_by_need).
SATURATION_RECORD = OnceRecord(SATURATION_FILE, "schedule=pooled_by_need measures again")

RESULT_COLUMNS = (
    "image_id", "label", "clean_pred", "adv_pred", "clean_correct", "robust", "fooled_by", "perturbation_norm",
    "forward_rows", "backward_rows",
)
SUMMARY_SCHEMA = 2
# What to do about a summary.json that does not read: merge the run again from its batch files.
MERGE_AGAIN = "re-run `python attack.py ... merge_only=true`"
# The reference reports only the final outcome per image: one pseudo-attack stands for its whole cascade.
REFERENCE_CASCADE = "autoattack-reference"


def standard_run(version: str, attacks: list[str], precision: str) -> bool:
    """The protocol's number, decided once for writing a summary and for scoring it: a standard version of the
    attack table run as its whole cascade (ours, in the table's order, or the reference's), in fp32 (bf16 is not
    equivalent, spec §6.3 item 10)."""
    if not is_standard(version) or precision != "fp32":
        return False
    return list(attacks) in (list(VERSIONS[version].attacks), [REFERENCE_CASCADE])


OUTPUT_KINDS = ("train", "models", "attack", "eval", "transfer")
SWEEPS_DIR = "multirun"  # train.py's and attack.py's multiruns, under a dataset's outputs of their kind
ADVERSARIAL_DIR = "adversarial"  # attack.py export_adversarial=true: the splits it writes, under its output dir
PARTIAL_DIR = "partial"  # a PARTIAL evaluation's record, beside the complete one
# evaluate.py's other reports: side folders of an evaluation (and of a leaderboard, for a pool's), shown by the site.
ZEROSHOT_REPORT_DIR = "zeroshot_report"
TEXT_ROBUSTNESS_DIR = "text_robustness"


def output_dir_for(root: str | Path, kind: str, dataset: str, name: str) -> Path:
    """Where one model's outputs of a kind live: `<root>/<kind>/<dataset id>/<name as one directory>` (attack
    runs, evaluations, transfer splits' attack runs). The configs spell it `${rgb.output_dir:ROOT,KIND,DATASET,NAME}`
    and rgb.benchmark calls it, so the layout is written here only (`models`: rgb.benchmark's exports)."""
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"output kind must be one of {OUTPUT_KINDS}, got {kind!r}")
    return Path(str(root)) / kind / str(dataset) / path_name(str(name))


def budget_dir(attack_dir: str | Path, budget: str) -> Path:
    """One threat model's run directory among a model's attack outputs: `<attack dir>/<budget>` (a norm key, or a
    transfer split's name), written by the attack run and read by evaluation."""
    return Path(str(attack_dir)) / budget


def first_images_dir(attack_dir: str | Path, n_images: int) -> Path:
    """The attack outputs of a model's first `n_images` test images (rgb.benchmark `n_examples`):
    `<attack dir>/first-<n>`, never mixed with (nor refused by) a whole-split run."""
    return Path(str(attack_dir)) / f"first-{n_images}"


def attack_dir_read(attack_dir: str | Path, max_images: int | None) -> Path:
    """The attack outputs an evaluation of the first `max_images` images reads: their own run (`first-<n>`, from
    attack.py max_images=N or rgb.benchmark n_examples=N) when there is one, else the whole split's, whose first
    rows are the same images."""
    first = None if max_images is None else first_images_dir(attack_dir, max_images)
    return first if first is not None and first.is_dir() else Path(str(attack_dir))


def side_dir(parent: str | Path, folder: str) -> str:
    """`<parent>/<folder>` for one of the folders above, spelled as `parent` is (a config's `./outputs` stays so):
    what the configs' `${rgb.multirun_dir:...}`, `${rgb.adversarial_dir:...}`, ... resolve to."""
    return os.path.join(str(parent), folder)


def multirun_dir(parent: str | Path) -> str:
    """Where the multiruns under `parent` (a dataset's train or attack outputs, one model's attack outputs) keep
    their sweep dirs: `<parent>/multirun`."""
    return side_dir(parent, SWEEPS_DIR)


def adversarial_dir(output_dir: str | Path) -> str:
    """Where attack.py writes the adversarial splits it exports unless told (`export_dir`): `<output dir>/adversarial`."""
    return side_dir(output_dir, ADVERSARIAL_DIR)


def sweep_dir_for(root: str | Path, dataset: str, label: str) -> Path:
    """attack.py's sweep dir of a `runs=` multirun (its logs, .submitit): `<root>/attack/<dataset>/multirun/<label>`,
    `label` the train sweep's name."""
    return Path(multirun_dir(Path(str(root)) / "attack" / str(dataset))) / str(label)


def partial_dir(out_dir: str | Path) -> Path:
    """Where a PARTIAL evaluation (max_images) writes its record: `<eval dir>/partial`, so it never replaces the
    complete record nor enters a pool unasked."""
    return Path(str(out_dir)) / PARTIAL_DIR


def run_name_for(path: str | Path) -> str:
    """The name of a model's attack and evaluation outputs, from the train run's own record (model.json): a sweep
    job is `<sweep name>-j<job>` (unique within its sweep, and sweeps never share a directory), any other run its
    recorded run_name. Only a model without a record is named by where it lives (its dir, or its file's stem)."""
    path = Path(str(path))
    record = model_record(path) or {}
    sweep = record.get("sweep")
    if isinstance(sweep, dict) and sweep.get("name") and sweep.get("job") is not None:
        return f"{sweep['name']}-j{sweep['job']}"
    if record.get("run_name"):
        return str(record["run_name"])
    if path.suffix == ".safetensors":
        return path.parent.name if path.name == WEIGHTS_FILE else path.stem
    return path.name


def wandb_run_under(directory: Path) -> str | None:
    """The id of the W&B run a command logged from `directory` (its id derives from the directory: stable_id),
    when that run's files are there; None when nothing was logged from it."""
    derived = stable_id(directory)
    return derived if any((Path(directory) / "wandb").glob(f"*run-*-{derived}")) else None


def relative_path(path: Path, root: Path | None) -> str:
    """`path` as records that leave this machine hold it: relative to the output root (absolute only when no root
    is known), so a W&B record or a scores.json names no machine's directories."""
    path = Path(path).resolve()
    if root is None:
        return str(path)
    return os.path.relpath(path, Path(root).resolve())


def train_wandb_id(run_dir: Path, record: dict) -> str | None:
    """The id of the train run's W&B run when there is one: recorded in model.json (`wandb.id`), or, for exports
    made before it was recorded, the stable id of the run dir when a W&B run of that id sits under it."""
    recorded = (record.get("wandb") or {}).get("id")
    return str(recorded) if recorded else wandb_run_under(run_dir)


def train_reference(path: str | Path, weights_sha256: str, root: Path | None = None) -> dict:
    """What ties an attack or evaluation to the training run of its model (W&B config): the run dir (relative to
    the output `root` when given), the id of its W&B run and its `model` artifact (only when they exist), its
    recorded name and sweep, and the hash of the weights scored."""
    path = Path(str(path))
    run_dir = path if path.is_dir() else path.parent
    record = model_record(path) or {}
    sweep = record.get("sweep")
    if isinstance(sweep, dict) and sweep.get("dir"):
        sweep = {**sweep, "dir": relative_path(Path(sweep["dir"]), root)}
    artifact = (record.get("wandb") or {}).get("artifact")
    return {"run_dir": relative_path(run_dir, root), "wandb_id": train_wandb_id(run_dir, record),
            "model_artifact": f"{artifact}:{sha256_alias(weights_sha256)}" if artifact else None,
            "run_name": record.get("run_name"), "sweep": sweep, "weights_sha256": weights_sha256}


def train_runs(pattern: str | Path) -> list[Path]:
    """The models a `runs=` / `pool=` entry names: a train run dir, a sweep dir (its job dirs holding model.json,
    in job order) or a glob of run dirs. Empty when it names none (an eval dir of scores.json, say)."""
    pattern = str(pattern)
    found = [Path(p) for p in sorted(glob.glob(pattern))] if glob.has_magic(pattern) else [Path(pattern)]
    runs = []
    for path in found:
        if (path / META_FILE).is_file():
            runs.append(path)
        elif path.is_dir():
            jobs = [p.parent for p in path.glob(f"*/{META_FILE}") if p.parent.name.isdigit()]
            runs.extend(sorted(jobs, key=lambda p: int(p.name)))
    return runs


def missing_sweep_jobs(pattern: str | Path) -> list[Path]:
    """The jobs of a sweep dir that hold no model (failed, still running, or removed): numbered job dirs without
    model.json, and numbers missing below the highest one. Empty for anything but a sweep dir."""
    path = Path(str(pattern))
    if glob.has_magic(str(pattern)) or (path / META_FILE).is_file() or not path.is_dir():
        return []
    numbers = {int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit()}
    if not any((path / str(n) / META_FILE).is_file() for n in numbers):
        return []  # not a train sweep (an eval dir, say)
    return [path / str(n) for n in range(max(numbers) + 1) if not (path / str(n) / META_FILE).is_file()]


@dataclass
class RunSummary(JsonRecord):
    """summary.json of one merged threat-model run (schema 2), through JsonRecord's codec (each field checked
    against its type when read back); `from_json` refuses records of another schema or missing a field.

    The attack options (`rgb.attacks.options.AttackOptions`) declared here are written always, at their places of
    schema 2 (`attacks` is the cascade that ran); any other option only when set to another value than its
    default, after them, in `options`, so summaries of runs that leave it alone, and older ones, keep their bytes
    and read back."""

    run: str
    run_name: str
    weights_sha256: str
    model_family: str | None
    model_name: str | None
    loss: str | dict | None  # model.json's: a train run's loss config ({"name": ..., ...}), or a name
    strategy: str | None
    dataset: str
    source: str
    split: str
    split_sha256: str
    n: int
    norm: str
    eps: float
    impl: str
    impl_version: str
    version: str
    standard: bool
    attacks: list[str]
    seed: int
    precision: str
    tf32: bool
    compile: bool
    channels_last: bool
    batch_size: int
    threads: int
    clean_accuracy: float
    n_clean_correct: int
    robust_accuracy: float
    n_robust: int
    accuracy_after: dict[str, float]
    attack_seconds: float
    forward_rows_per_image: float
    backward_rows_per_image: float
    results_sha256: str
    versions: dict[str, str]
    complete: bool
    schema: int = SUMMARY_SCHEMA
    export: str | None = None
    warnings: list[str] = field(default_factory=list)
    tail_rows: int = AttackOptions.tail_rows
    input_format: str = AttackOptions.input_format
    capture: str = AttackOptions.capture
    options: dict[str, object] = field(default_factory=dict)  # the other options, where not at their defaults
    # batch_size=auto: how the number was found ({"batch_size", "source", "device"}); absent for a number given
    batch_size_auto: dict | None = None
    # input_format=auto: what the run decided once and every worker and resume used ({"input_format", "reason",
    # "rows", "device"}); absent for a format given
    input_format_auto: dict | None = None
    # schedule=pooled_by_need: the rows per call at which the model saturates, measured once for the run
    # (saturation.json: {"rows", "seconds_per_row", "within", "device", "input_format"}); absent for other schedules
    saturation: dict | None = None

    @classmethod
    def recording(cls, options: AttackOptions, **values) -> RunSummary:
        """The summary of a run made with `options` and the other `values`."""
        declared = {f.name for f in fields(cls)}
        written = {name: getattr(options, name) for name in options.names() if name in declared and name not in values}
        others = {name: value for name, value in options.changed().items() if name not in declared}
        return cls(**values, **written, options=others)

    def to_json(self) -> dict:
        """JsonRecord's record, the other options after the fields (not under `options`), the auto records only
        when there is one (other summaries keep their bytes)."""
        record = super().to_json()
        others = record.pop("options")
        for name in ("batch_size_auto", "input_format_auto", "saturation"):
            if record[name] is None:
                del record[name]
        return {**record, **others}

    @classmethod
    def from_json(cls, record: dict, where: Path | str = SUMMARY_FILE) -> RunSummary:
        """The summary of `record` (read from `where`): JsonRecord's reader, after the schema's check; the keys that
        are options of AttackOptions but no field go back under `options`."""
        names = {f.name for f in fields(cls)} - {"options"}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - set(record))
        if missing or record.get("schema") != SUMMARY_SCHEMA:
            raise AttackRunError(f"{where}: not a summary of this rgb version (schema {record.get('schema')}, "
                                 f"missing {missing}); {MERGE_AGAIN}")
        others = {k: v for k, v in record.items() if k in AttackOptions.names() and k not in names}
        try:
            return super().from_json({**{k: v for k, v in record.items() if k in names}, "options": others})
        except RecordError as err:
            raise AttackRunError(f"{where}: {err}; {MERGE_AGAIN}") from None

    def line(self) -> str:
        label = "" if self.standard else f" [{self.version}: not standard]"
        impl = "" if self.impl == "ours" else f" [impl {self.impl} {self.impl_version}]"
        return (
            f"{self.norm} eps={self.eps:.6g}: robust accuracy {self.robust_accuracy:.2%} ({self.n_robust}/{self.n}), "
            f"clean {self.clean_accuracy:.2%}, {self.attack_seconds:.1f}s wall time (sum over batches), "
            f"{self.forward_rows_per_image:.0f} forward + {self.backward_rows_per_image:.0f} backward rows "
            f"per image{label}{impl}"
        )


    def stages(self) -> str:
        """Accuracy after each stage of the cascade (what each attack took away)."""
        steps = ", ".join(f"{stage} {value:.2%}" for stage, value in self.accuracy_after.items())
        return f"{self.norm} eps={self.eps:.6g}: accuracy after {steps}"

    def throughput(self) -> float:
        """Images per second of attack wall time (summed over batches)."""
        return self.n / self.attack_seconds if self.attack_seconds > 0 else float("nan")


def _identity_in(record) -> dict | None:
    """An attack run's manifest is its identity itself."""
    return record if isinstance(record, dict) else None


def describe_ids(image_ids: torch.Tensor) -> str:
    """Image ids in words: a range where they are one, else the first few."""
    ids = image_ids.tolist()
    if ids and ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(map(str, ids[:5])) + (f" ... ({len(ids)} images)" if len(ids) > 5 else "")


def attack_manifest(directory: Path) -> IdentityManifest:
    """The run.json of one threat model's run directory."""
    return IdentityManifest(Path(directory), "an attack run", _identity_in, AttackRunError, "was made for another run",
                            "another output_dir")


def recorded_batch_size(directory: Path) -> int | None:
    """The batch size a run directory's manifest names (None without one): what batch_size=auto resumes with."""
    record = attack_manifest(directory).read()
    return None if record is None else int(record["batch_size"])


class RunDirectory:
    """One threat model's run directory: manifest, per-batch result files of every shard, merged results."""

    def __init__(self, directory: Path, identity: dict):
        self.directory = Path(directory)
        self.identity = identity
        self.manifest = attack_manifest(self.directory)
        self.key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).digest()
        self.starts = list(range(0, identity["n_images"], identity["batch_size"]))

    def claim(self, create: bool = True) -> None:
        """Adopt the directory (writing its manifest if `create`), refusing one whose results were made for
        another model, dataset, budget, seed or version. A directory without results (a run that died before its
        first batch, e.g. on a broken model) is adopted by the next run whatever identity its manifest names (one
        that does not read is named, never overwritten: rgb.core.rundir); batch files carry the identity, so two runs
        can never mix."""
        self.manifest.claim(self.identity, self.holds_results(), write=create)

    def holds_results(self) -> bool:
        """A finished batch or pooled unit, or a merged result: what a manifest protects (without them it only records a start)."""
        return (bool(self.batch_files()) or any(self.directory.glob("pooled-*-of-*/stage-*/*.pt"))
                or any((self.directory / f).exists() for f in (RESULTS_FILE, SUMMARY_FILE)))

    def shard_starts(self, index: int, count: int) -> list[int]:
        """Contiguous batches of shard `index` of `count` (whole batches, so sharding never changes a batch)."""
        n = len(self.starts)
        return self.starts[index * n // count: (index + 1) * n // count]

    def shard_dir(self, index: int, count: int) -> Path:
        return self.directory / f"shard-{index}-of-{count}"

    def shard_of(self, start: int, count: int) -> int:
        return next(i for i in range(count) if start in self.shard_starts(i, count))

    def batch_files(self) -> dict[int, Path]:
        """Finished batches, whichever shard layout wrote them."""
        found: dict[int, Path] = {}
        for path in sorted(self.directory.glob("shard-*-of-*/batch-*.pt")):
            found.setdefault(int(path.stem.removeprefix("batch-")), path)
        return found

    def missing_batches(self) -> list[int]:
        files = self.batch_files()
        return [s for s in self.starts if s not in files]

    def finished(self, start: int) -> Path | None:
        """The result file of the batch at `start`, whichever shard layout wrote it (None while it is missing)."""
        return next(iter(sorted(self.directory.glob(f"shard-*-of-*/batch-{start:06d}.pt"))), None)

    def claim_batch(self, start: int, wait: bool = False):
        """The lock of the batch at `start` (a handle to close), so two processes on one run never attack the same
        batch: None while another process holds it (unless `wait`). Temp files of that batch left by a killed
        process are removed once the lock is held (a live writer's are never touched)."""
        return self._claim(f"batch-{start:06d}", f"shard-*-of-*/batch-{start:06d}.pt.tmp.*", wait)

    def _claim(self, name: str, temp_files: str, wait: bool):
        locks = self.directory / LOCK_DIR
        locks.mkdir(parents=True, exist_ok=True)
        try:
            handle = flock(locks / f"{name}.lock", wait=wait)
        except OSError as err:
            raise AttackRunError(f"cannot lock batches in {locks} ({err.strerror}): this filesystem has no flock; "
                                 f"run one attack process per shard") from err
        if handle is not None:
            for stale in self.directory.glob(temp_files):
                stale.unlink(missing_ok=True)
        return handle

    def claim_record(self, kind: OnceRecord):
        """The lock under which one process at a time decides `kind`'s value for a run (a handle to close)."""
        return self._claim(Path(kind.file).stem, f"{kind.file}.tmp.*", wait=True)

    def save(self, index: int, count: int, start: int, record: dict[str, torch.Tensor]) -> None:
        self._save(self.shard_dir(index, count) / f"batch-{start:06d}.pt", record)

    def _save(self, path: Path, record: dict[str, torch.Tensor]) -> None:
        import torch  # the run store's names and places load without it (the commands' config checks read them)

        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save({**record, "identity": torch.tensor(list(self.key), dtype=torch.uint8)}, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    def load(self, path: Path, start: int) -> dict[str, torch.Tensor]:
        import torch

        n = min(self.identity["batch_size"], self.identity["n_images"] - start)
        return self._load(path, torch.arange(start, start + n))

    def _load(self, path: Path, image_ids: torch.Tensor, mmap: bool = False) -> dict[str, torch.Tensor]:
        """A batch or unit file, checked: written under this identity, for images `image_ids`."""
        import torch

        try:
            record = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception as err:  # truncated or foreign file: name it, never guess
            raise AttackRunError(f"unreadable batch file {path}: {type(err).__name__}: {err}; delete it to "
                                 f"recompute that batch") from err
        if not isinstance(record, dict) or bytes(record.get("identity", torch.empty(0)).tolist()) != self.key:
            raise AttackRunError(f"{path} was written by another run than {self.directory / MANIFEST} describes")
        if not torch.equal(record["image_id"], image_ids):
            raise AttackRunError(f"{path} does not hold images {describe_ids(image_ids)}")
        return record

    # -- the pooled schedule's units (rgb.runs.pooled) ---------------------------------------------------
    def pooled_dir(self, index: int, count: int) -> Path:
        return self.directory / f"pooled-{index}-of-{count}"

    def pooled_plan(self, index: int, count: int, unfinished: list[int]) -> list[int]:
        """The batch starts whose images a pooled run of shard `index` of `count` pools: the shard's batches left
        unfinished when its first pooled run began, kept in `plan.json`, so every resumed run cuts the same chunks."""
        path = self.pooled_dir(index, count) / POOLED_PLAN
        if not path.exists():
            if not unfinished:
                return []
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, {"starts": list(unfinished)})
        restart = f"delete {path.parent} to restart its pooled stages"
        try:
            starts = decode(list[int], read_json(path, AttackRunError, restart).get("starts"), "starts")
        except RecordError as err:
            raise AttackRunError(f"{path}: {err}; {restart}") from None
        if not set(starts) <= set(self.shard_starts(index, count)):
            raise AttackRunError(f"{path} names batches outside shard {index} of {count}: delete {path.parent}")
        return starts

    def unit_path(self, index: int, count: int, stage: int, unit: int) -> Path:
        """Stage 0 (the clean pass) is saved per batch (`unit` its start), every later stage per chunk."""
        name = f"batch-{unit:06d}.pt" if stage == 0 else f"chunk-{unit:06d}.pt"
        return self.pooled_dir(index, count) / f"stage-{stage}" / name

    def claim_unit(self, index: int, count: int, stage: int, unit: int):
        """The lock of one pooled unit (as `claim_batch`): None while another process holds it."""
        path = self.unit_path(index, count, stage, unit)
        return self._claim(f"pooled-{index}-of-{count}-stage-{stage}-{unit:06d}",
                           str(path.relative_to(self.directory)) + ".tmp.*", wait=False)

    def save_unit(self, index: int, count: int, stage: int, unit: int, record: dict[str, torch.Tensor]) -> None:
        self._save(self.unit_path(index, count, stage, unit), record)

    def load_unit(self, index: int, count: int, stage: int, unit: int, image_ids: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
        """A saved unit, memory-mapped (its adversarial images are read only where used)."""
        return self._load(self.unit_path(index, count, stage, unit), image_ids, mmap=True)

    def clear_pooled(self) -> None:
        """Remove the pooled units once the batches they made are merged."""
        for directory in self.directory.glob("pooled-*-of-*"):
            shutil.rmtree(directory)

    def load_all(self, shard_count: int) -> list[dict[str, torch.Tensor]]:
        """Every batch in image order; refuses (naming the missing shards) while any is missing."""
        missing = self.missing_batches()
        if missing:
            raise AttackRunError(f"{self.directory}: cannot merge, {self.describe_missing(missing, shard_count)}")
        files = self.batch_files()
        return [self.load(files[s], s) for s in self.starts]

    def describe_missing(self, missing: list[int], count: int) -> str:
        by_shard: dict[int, list[int]] = {}
        for start in missing:
            by_shard.setdefault(self.shard_of(start, count), []).append(start)
        parts = [
            f"shard {i} of {count} ({len(starts)} batches, first {self.directory.name}/shard-{i}-of-{count}/"
            f"batch-{starts[0]:06d}.pt)"
            for i, starts in by_shard.items()
        ]
        return f"{len(missing)} of {len(self.starts)} batches missing: " + "; ".join(parts)

    def write_results(self, columns: dict[str, torch.Tensor]) -> str:
        """results.parquet (one row per image, RESULT_COLUMNS); returns its sha256 for the summary."""
        table = pa.table({name: columns[name].numpy() for name in RESULT_COLUMNS})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
        atomic_write_bytes(self.directory / RESULTS_FILE, data)
        return hashlib.sha256(data).hexdigest()

    def write_record(self, kind: OnceRecord, record: dict) -> None:
        atomic_write_json(self.directory / kind.file, record)

    def read_record(self, kind: OnceRecord) -> dict | None:
        """`kind`'s value for this run (None: not decided yet, or not decided by the run: e.g. the option was given)."""
        path = self.directory / kind.file
        return read_json(path, AttackRunError, f"delete {path} ({kind.again})") if path.exists() else None

    def write_summary(self, summary: RunSummary) -> None:
        atomic_write_json(self.directory / SUMMARY_FILE, summary.to_json())


@dataclass
class RunResult:
    """A merged run as evaluation sees it: the summary and the per-image columns, cross-checked."""

    directory: Path
    summary: RunSummary
    columns: dict[str, np.ndarray]


def read_run(directory: Path) -> RunResult | None:
    """The merged result of one threat-model run; None if there is none; AttackRunError if it is unfinished,
    unreadable, or its files disagree with each other (a hand-edited results file or summary)."""
    directory = Path(directory)
    summary_file, results_file = directory / SUMMARY_FILE, directory / RESULTS_FILE
    if not summary_file.exists():
        if directory.is_dir():
            raise AttackRunError(f"attack run {directory} is not merged/complete (no {SUMMARY_FILE}): finish it or "
                                 f"run `python attack.py ... merge_only=true`")
        return None
    try:
        summary = RunSummary.from_json(read_json(summary_file, AttackRunError, MERGE_AGAIN), summary_file)
        table = pq.read_table(results_file)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise AttackRunError(f"unreadable attack result in {directory}: {str(err).splitlines()[0]}") from err
    if file_sha256(results_file) != summary.results_sha256:
        raise AttackRunError(f"refusing {directory}: {RESULTS_FILE} is not the file its {SUMMARY_FILE} was written "
                             f"for (edited or replaced); re-run `python attack.py ... merge_only=true`")
    missing = [c for c in RESULT_COLUMNS if c not in table.column_names]
    if missing:
        raise AttackRunError(f"refusing {directory}: {RESULTS_FILE} lacks columns {missing}")
    columns = {c: np.asarray(table.column(c).to_numpy(zero_copy_only=False)) for c in RESULT_COLUMNS}
    problems = []
    if table.num_rows != summary.n or not summary.complete:
        problems.append(f"{table.num_rows} rows for n={summary.n} (complete={summary.complete})")
    if not np.array_equal(columns["image_id"], np.arange(table.num_rows)):
        problems.append("image ids are not 0..n-1 in order")
    robust, clean_correct = columns["robust"].astype(bool), columns["clean_correct"].astype(bool)
    if (robust & ~clean_correct).any():
        problems.append(f"{int((robust & ~clean_correct).sum())} images robust but misclassified clean")
    if not np.array_equal(clean_correct, columns["clean_pred"] == columns["label"]):
        problems.append("clean_correct disagrees with clean_pred == label")
    if not np.array_equal(robust, columns["adv_pred"] == columns["label"]):
        problems.append("robust disagrees with adv_pred == label")
    if int(robust.sum()) != summary.n_robust or int(clean_correct.sum()) != summary.n_clean_correct:
        problems.append(f"counts ({int(robust.sum())} robust, {int(clean_correct.sum())} clean) differ from the "
                        f"summary ({summary.n_robust}, {summary.n_clean_correct})")
    n = max(table.num_rows, 1)
    for name, count in (("robust_accuracy", int(robust.sum())), ("clean_accuracy", int(clean_correct.sum()))):
        if abs(getattr(summary, name) - count / n) > 1e-6:  # float32 means in older runs: 1e-6, not exact
            problems.append(f"{name} {getattr(summary, name)} is not {count}/{table.num_rows}")
    if problems:
        raise AttackRunError(f"refusing {directory}: {'; '.join(problems)}")
    return RunResult(directory, summary, columns)


__all__ = ["MANIFEST", "RESULT_COLUMNS", "RunDirectory", "RunResult", "RunSummary", "read_run",
           "missing_sweep_jobs", "run_name_for", "train_runs"]
