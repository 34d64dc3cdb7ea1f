"""Resumable, shardable AutoAttack runs over a benchmark's clean test split (the runner behind attack.py).

Kept outside `rgb.attacks` (pure PyTorch) because it ties the attack to files, configs, models and data.
Results are stored per batch in atomic tensor files, so an interrupted or requeued job continues where it
stopped and loses nothing. Batches start at multiples of `batch_size` from image 0 whatever the sharding, so a
batch always holds the same images and a result never depends on how the work was split or resumed.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from rgb.attacks.autoattack import AutoAttack, within_budget
from rgb.data.benchmark import ImageSplit
from rgb.data.snapshot import png_bytes, write_readme, write_split
from rgb.models import WEIGHTS_FILE, apply_speed_options, library_versions, load_with_meta

# Run-directory names of the norms -> rgb.attacks names.
NORMS = {"linf": "Linf", "l2": "L2", "l1": "L1"}
RESULT_COLUMNS = (
    "image_id", "label", "clean_pred", "adv_pred", "clean_correct", "robust", "fooled_by", "perturbation_norm",
    "forward_rows", "backward_rows",
)
# Exported 8-bit images must satisfy the budget up to the float32 precision of the stored eps (relative).
QUANTISED_TOLERANCE = 1e-6
MANIFEST = "run.json"


class AttackRunError(RuntimeError):
    """A one-line problem with an attack run: bad settings, a directory made for another run, missing shards."""


def run_name_for(path: str | Path) -> str:
    """Run name from where the model lives: the train run dir's name, or the stem of an exported weights file."""
    path = Path(str(path))
    if path.suffix == ".safetensors":
        return path.parent.name if path.name == WEIGHTS_FILE else path.stem
    return path.name


OmegaConf.register_new_resolver("rgb.run_name", run_name_for, replace=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def split_sha256(split: ImageSplit) -> str:
    """Fingerprint of the attacked images (PNG bytes, labels, ids): resuming on other images is refused."""
    digest = hashlib.sha256()
    table = split.rows.data
    for column in ("label", "image_id"):
        digest.update(np.ascontiguousarray(table.column(column).to_numpy(), dtype=np.int64).tobytes())
    for image in table.column("image").to_pylist():
        digest.update(len(image["bytes"]).to_bytes(8, "little"))
        digest.update(image["bytes"])
    return digest.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a per-process temp file + rename: readers see the old file or the whole new one, never a part."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Budget:
    """One threat model: run-dir name, norm (linf/l2/l1), eps in [0,1] pixel units, and the export split name."""

    name: str
    norm: str
    eps: float
    export_split: str


@dataclass(frozen=True)
class AttackSettings:
    """Everything a run needs, validated, picklable (it travels to spawned per-GPU processes)."""

    run: Path
    run_name: str
    data: dict
    budgets: tuple[Budget, ...]
    version: str
    seed: int
    attacks: tuple[str, ...] | None
    precision: str
    batch_size: int
    device: str
    compile: bool
    channels_last: bool
    shard_index: int
    shard_count: int
    processes: int
    merge_only: bool
    export: bool
    export_dir: Path
    surrogate: str
    output_dir: Path
    progress: bool = True

    @classmethod
    def from_config(cls, cfg: DictConfig, budgets: tuple[Budget, ...], surrogate: str) -> AttackSettings:
        run = Path(str(cfg.run))
        if not run.exists():
            raise AttackRunError(f"run={run} does not exist (a train output dir or an exported .safetensors file)")
        batch_size = int(cfg.batch_size)
        if batch_size < 1:
            raise AttackRunError(f"batch_size must be >= 1, got {batch_size}")
        index, count = shard_position(cfg.shard.index, cfg.shard.count)
        attacks = None if cfg.attacks is None else tuple(str(a) for a in cfg.attacks)
        return cls(
            run=run, run_name=run_name_for(run), data=OmegaConf.to_container(cfg.data, resolve=True),
            budgets=budgets, version=str(cfg.version), seed=int(cfg.seed), attacks=attacks,
            precision=str(cfg.precision), batch_size=batch_size, device=resolve_device(str(cfg.device)),
            compile=bool(cfg.compile), channels_last=bool(cfg.channels_last),
            shard_index=index, shard_count=count, processes=process_count(cfg.shard.devices, str(cfg.device)),
            merge_only=bool(cfg.merge_only), export=bool(cfg.export_adversarial),
            export_dir=Path(str(cfg.export_dir)), surrogate=surrogate, output_dir=Path(str(cfg.output_dir)),
            progress=bool(cfg.progress),
        )


def shard_position(index, count) -> tuple[int, int]:
    """(index, count) of this shard; null values come from a SLURM array (task id - min id, task count)."""
    env = os.environ
    in_array = "SLURM_ARRAY_TASK_ID" in env
    if index is None:
        index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", 0)) if in_array else 0
    if count is None:
        count = int(env.get("SLURM_ARRAY_TASK_COUNT", 1)) if in_array else 1
    index, count = int(index), int(count)
    if count < 1 or not 0 <= index < count:
        raise AttackRunError(f"shard.index must be in [0, shard.count) and shard.count >= 1, got {index} of {count}")
    return index, count


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise AttackRunError(f"device={device} but no CUDA device is visible")
    return device


def process_count(devices, device: str) -> int:
    """Processes on this node: `auto` = one per visible GPU (1 without GPUs), or an explicit count."""
    gpus = torch.cuda.device_count() if resolve_device(device).startswith("cuda") else 0
    if devices == "auto":
        return max(gpus, 1)
    count = int(devices)
    if count < 1 or (gpus and count > gpus):
        raise AttackRunError(f"shard.devices={devices}: need 1 <= devices <= {gpus or 'any'} (visible GPUs: {gpus})")
    return count


def white_box_budgets(norms, data: DictConfig) -> tuple[Budget, ...]:
    """The data config's white-box budgets for the requested norms; exported as the matching transfer split."""
    norms = [str(n).lower() for n in norms]
    unknown = [n for n in norms if n not in NORMS]
    if not norms or unknown or len(set(norms)) != len(norms):
        raise AttackRunError(f"norms must be distinct names from {list(NORMS)}, got {norms}")
    budgets = []
    for norm in norms:
        eps = float(data.budgets[norm])
        matching = [s for s, e in (data.get("transfer_budgets") or {}).items()
                    if s.startswith(norm + "_") and math.isclose(float(e), eps, rel_tol=1e-9)]
        budgets.append(Budget(norm, norm, eps, matching[0] if matching else f"{norm}_{eps:.6g}"))
    return tuple(budgets)


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
    def open(cls, settings: AttackSettings, device: str) -> Target:
        try:
            model, meta = load_with_meta(settings.run)
        except FileNotFoundError as err:
            raise AttackRunError(str(err)) from err
        weights = settings.run / WEIGHTS_FILE if settings.run.is_dir() else settings.run
        datamodule = hydra.utils.instantiate(settings.data)
        if meta.get("dataset") != datamodule.dataset:
            raise AttackRunError(
                f"{settings.run} was trained on dataset {meta.get('dataset')!r} but the data config is "
                f"{datamodule.dataset!r}: pass the data config of {meta.get('dataset')!r} (data=...)"
            )
        split = datamodule.split("test")
        for key, expected in (("num_classes", len(split.class_names)), ("image_size", datamodule.image_size),
                              ("class_names", split.class_names)):
            if key in meta and meta[key] != expected:
                raise AttackRunError(f"{settings.run}: model {key} {meta[key]!r} != the test split's {expected!r}")
        if device.startswith("cuda"):  # TF32 perturbs the numerics of an attack (spec §6.3 item 10): off, recorded
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        model = apply_speed_options(model.to(device), channels_last=settings.channels_last,
                                    compile=settings.compile, dynamic=True)
        return cls(model, meta, file_sha256(weights), datamodule, split, split_sha256(split))

    def identity(self, settings: AttackSettings, budget: Budget) -> dict:
        """What the results of one budget depend on; a run directory only ever holds one identity."""
        return {
            "weights_sha256": self.weights_sha256, "dataset": self.datamodule.dataset, "split": "test",
            "split_sha256": self.split_sha256, "n_images": len(self.split), "norm": budget.norm, "eps": budget.eps,
            "version": settings.version, "seed": settings.seed,
            "attacks": None if settings.attacks is None else list(settings.attacks),
            "precision": settings.precision, "batch_size": settings.batch_size, "export_adversarial": settings.export,
        }


class RunDirectory:
    """One budget's run directory: manifest, per-batch result files of every shard, merged results."""

    def __init__(self, directory: Path, identity: dict):
        self.directory = Path(directory)
        self.identity = identity
        self.key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).digest()
        self.starts = list(range(0, identity["n_images"], identity["batch_size"]))

    def claim(self, create: bool = True) -> None:
        """Adopt the directory (writing its manifest if `create`), refusing one made for another model,
        dataset, budget, seed or version."""
        manifest = self.directory / MANIFEST
        if manifest.is_file():
            found = json.loads(manifest.read_text())
            differ = [f"{k} {found.get(k)!r} (this run: {v!r})" for k, v in self.identity.items() if found.get(k) != v]
            if differ:
                raise AttackRunError(
                    f"{self.directory} was made for another run: {'; '.join(differ)}; use another output_dir "
                    f"or delete it"
                )
        elif create:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(manifest, (json.dumps(self.identity, indent=2) + "\n").encode())

    def shard_starts(self, index: int, count: int) -> list[int]:
        """Contiguous batches of shard `index` of `count` (whole batches, so sharding never changes a batch)."""
        n = len(self.starts)
        return self.starts[index * n // count: (index + 1) * n // count]

    def shard_of(self, start: int, count: int) -> int:
        return next(i for i in range(count) if start in self.shard_starts(i, count))

    def batch_files(self) -> dict[int, Path]:
        """Finished batches, whichever shard layout wrote them."""
        found: dict[int, Path] = {}
        for path in sorted(self.directory.glob("shard-*-of-*/batch-*.pt")):
            found.setdefault(int(path.stem.removeprefix("batch-")), path)
        return found

    def save(self, shard_dir: Path, start: int, record: dict[str, torch.Tensor]) -> None:
        shard_dir.mkdir(parents=True, exist_ok=True)
        path = shard_dir / f"batch-{start:06d}.pt"
        tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
        torch.save(record, tmp)
        os.replace(tmp, path)

    def load(self, path: Path, start: int) -> dict[str, torch.Tensor]:
        try:
            record = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # truncated or foreign file: name it, never guess
            raise AttackRunError(f"unreadable batch file {path}: {type(err).__name__}: {err}") from err
        if not isinstance(record, dict) or bytes(record.get("identity", torch.empty(0)).tolist()) != self.key:
            raise AttackRunError(f"{path} was written by another run than {self.directory / MANIFEST} describes")
        n = min(self.identity["batch_size"], self.identity["n_images"] - start)
        if not torch.equal(record["image_id"], torch.arange(start, start + n)):
            raise AttackRunError(f"{path} does not hold images {start}..{start + n - 1}")
        return record

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


def quantise_within_budget(x: torch.Tensor, x_adv: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    """8-bit (uint8, same shape) version of x_adv that still satisfies ||q/255 - x||_p <= eps.

    Plain rounding can push an L1/L2 perturbation over the budget (and Linf by half a grey level). Each pixel
    is rounded to the nearest level; if that breaks the budget, the coordinates that rounding moved away from
    x are rounded towards x instead, largest norm gain first, until it fits. Needs 8-bit clean images.
    """
    clean = torch.round(x.double() * 255)
    if (clean - x.double() * 255).abs().max() > 1e-3:
        raise AttackRunError("clean images are not on the 8-bit grid; adversarial images cannot be exported as PNG")
    delta = (x_adv.double() * 255 - clean).flatten(1)
    nearest, towards_clean = torch.round(delta), torch.trunc(delta)
    limit = eps * 255 * (1 + QUANTISED_TOLERANCE)
    if norm == "linf":
        level = math.floor(limit)
        q = nearest.clamp(-level, level)
        size = q.abs().amax(dim=1)
    else:
        p = 1 if norm == "l1" else 2
        excess = nearest.abs().pow(p).sum(dim=1) - limit**p
        gain, order = (nearest.abs().pow(p) - towards_clean.abs().pow(p)).sort(dim=1, descending=True)
        count = torch.where(excess > 0, (gain.cumsum(dim=1) < excess[:, None]).sum(dim=1) + 1, 0)
        chosen = torch.arange(delta.shape[1])[None, :] < count[:, None]
        flip = torch.zeros_like(chosen).scatter(1, order, chosen)
        q = torch.where(flip, towards_clean, nearest)
        size = q.abs().pow(p).sum(dim=1).pow(1 / p)
    if bool((size > limit).any()):
        raise AttackRunError(f"cannot store an adversarial image within {norm} eps={eps} at 8 bits")
    return (clean.flatten(1) + q).clamp(0, 255).view_as(x).to(torch.uint8)


def batch_record(result, x, y, image_id, budget: Budget, seconds: float, key: bytes, keep_images: bool) -> dict:
    """Tensors of one finished batch (checked against the budget and the cascade rule before they are kept)."""
    norm = NORMS[budget.norm]
    robust = result.robust.bool()
    if not torch.equal(result.y_adv == y, robust) or bool((robust & ~result.clean_correct).any()):
        raise AttackRunError("AutoAttack result is inconsistent: robust != (prediction on x_adv is correct)")
    if not bool(within_budget(result.x_adv - x, norm, budget.eps).all()):
        raise AttackRunError(f"AutoAttack returned an image outside {norm} eps={budget.eps}")
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
        "identity": torch.tensor(list(key), dtype=torch.uint8),
        "attacks": torch.tensor(list(json.dumps(list(result.attacks)).encode()), dtype=torch.uint8),
    }
    for name in ("forward_rows", "backward_rows"):
        if record[name].shape != y.shape:
            shape = tuple(record[name].shape)
            raise AttackRunError(f"AutoAttackResult.{name} must hold one value per image, got shape {shape}")
    if keep_images:
        record["adversarial"] = quantise_within_budget(x, result.x_adv, budget.norm, budget.eps)
        record["modified"] = (record["adversarial"] != torch.round(x * 255).to(torch.uint8)).flatten(1).any(dim=1)
    return record


def attack_shard(target: Target, settings: AttackSettings, budget: Budget, run: RunDirectory,
                 index: int, count: int, device: str) -> None:
    """Attack the unfinished batches of shard `index` of `count`, saving each batch as soon as it is done."""
    mine = run.shard_starts(index, count)
    done = run.batch_files()
    todo = [s for s in mine if s not in done]
    shard_dir = run.directory / f"shard-{index}-of-{count}"
    for stale in shard_dir.glob("*.tmp.*"):  # left by a killed process of this shard
        stale.unlink()
    n = run.identity["n_images"]
    sizes = {s: min(settings.batch_size, n - s) for s in mine}
    robust = sum(int(run.load(done[s], s)["robust"].sum()) for s in mine if s in done)
    finished = sum(sizes[s] for s in mine if s in done)
    bar = tqdm(total=sum(sizes.values()), initial=finished, unit="img", disable=not settings.progress,
               desc=f"{budget.name} eps={budget.eps:.4g} shard {index}/{count}", dynamic_ncols=True)

    def show(attack: str = "") -> None:
        accuracy = f"{robust / finished:.1%}" if finished else "-"
        bar.set_postfix_str(f"robust {accuracy} ({robust}/{finished})" + (f" | {attack}" if attack else ""))

    show()
    indices = [i for s in todo for i in range(s, s + sizes[s])]
    loader = DataLoader(Subset(target.split, indices), batch_size=settings.batch_size, shuffle=False,
                        num_workers=target.datamodule.num_workers)
    with bar:
        for start, (x, y, image_id) in zip(todo, loader):
            began = time.perf_counter()
            attack = AutoAttack(  # a fresh instance per batch: no RNG state carries over between batches
                target.model, NORMS[budget.norm], budget.eps, version=settings.version, seed=settings.seed,
                device=device, attacks=None if settings.attacks is None else list(settings.attacks),
                precision=settings.precision, progress=lambda name, *_: show(name),
            )
            result = attack.run(x, y, batch_size=settings.batch_size)
            seconds = time.perf_counter() - began
            record = batch_record(result, x, y, image_id, budget, seconds, run.key, settings.export)
            run.save(shard_dir, start, record)
            robust, finished = robust + int(record["robust"].sum()), finished + len(y)
            bar.update(len(y))
            show()


def merge(target: Target, settings: AttackSettings, budget: Budget, run: RunDirectory, shard_count: int) -> dict:
    """Concatenate every batch into results.parquet + summary.json; refuses (naming them) while any is missing."""
    files = run.batch_files()
    missing = [s for s in run.starts if s not in files]
    if missing:
        raise AttackRunError(f"{run.directory}: cannot merge, {run.describe_missing(missing, shard_count)}")
    records = [run.load(files[s], s) for s in run.starts]
    attacks = {bytes(r["attacks"].tolist()).decode() for r in records}
    if len(attacks) != 1:
        raise AttackRunError(f"{run.directory}: batches were attacked with different attack lists: {sorted(attacks)}")
    attacks = json.loads(attacks.pop())
    columns = {name: torch.cat([r[name] for r in records]) for name in RESULT_COLUMNS}
    if not torch.equal(columns["label"], target.split.labels):
        raise AttackRunError(f"{run.directory}: stored labels differ from the test split")
    table = pa.table({name: columns[name].numpy() for name in RESULT_COLUMNS})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(run.directory / "results.parquet", sink.getvalue().to_pybytes())

    n, fooled_by = len(columns["label"]), columns["fooled_by"]
    accuracy_after = {"clean": float((fooled_by != 0).float().mean())}
    for k, name in enumerate(attacks, start=1):
        accuracy_after[name] = float(((fooled_by == -1) | (fooled_by > k)).float().mean())
    meta = target.meta
    summary = {
        "run": str(settings.run), "run_name": settings.run_name, "weights_sha256": target.weights_sha256,
        "timm_name": meta.get("timm_name"), "loss": meta.get("loss"), "strategy": meta.get("strategy"),
        "dataset": target.datamodule.dataset, "source": target.datamodule.source, "split": "test",
        "split_sha256": target.split_sha256, "n": n, "norm": budget.norm, "eps": budget.eps,
        "version": settings.version, "attacks": attacks, "seed": settings.seed, "precision": settings.precision,
        "tf32": False, "compile": settings.compile, "channels_last": settings.channels_last,
        "batch_size": settings.batch_size,
        "clean_accuracy": accuracy_after["clean"], "n_clean_correct": int(columns["clean_correct"].sum()),
        "robust_accuracy": float(columns["robust"].float().mean()), "n_robust": int(columns["robust"].sum()),
        "accuracy_after": accuracy_after,
        "attack_seconds": float(sum(float(r["seconds"][0]) for r in records)),
        "forward_rows_per_image": float(columns["forward_rows"].double().mean()),
        "backward_rows_per_image": float(columns["backward_rows"].double().mean()),
        "versions": {**library_versions(), "python": platform.python_version()},
        "complete": True,
    }
    if settings.export:
        summary["export"] = export_split(target, settings, budget, records)
    atomic_write_bytes(run.directory / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
    return summary


def export_split(target: Target, settings: AttackSettings, budget: Budget, records: list[dict]) -> str:
    """Write the 8-bit adversarial images as split `<export_split>` of config `<dataset>-<surrogate>`.

    Images identical to the clean one (misclassified clean, or not fooled) are copied byte for byte
    (is_modified = false); the snapshot gets a `test` split too if it has none, so `load_split` can check it.
    """
    rows = target.split.rows
    dataset, root = target.datamodule.dataset, settings.export_dir
    clean = [image["bytes"] for image in rows["image"]]
    size = Image.open(io.BytesIO(clean[0])).size
    if size != (target.datamodule.image_size,) * 2:
        raise AttackRunError(f"test images are {size}, not the attacked {target.datamodule.image_size}px: no export")
    images = torch.cat([r["adversarial"] for r in records])
    modified = torch.cat([r["modified"] for r in records]).tolist()
    n = len(rows)
    columns = {
        "image": [png_bytes(images[i].permute(1, 2, 0).numpy()) if modified[i] else clean[i] for i in range(n)],
        "label": rows["label"], "image_id": rows["image_id"], "perturbation": ["transfer_autoattack"] * n,
        "surrogate": [settings.surrogate] * n, "norm": [budget.norm] * n, "epsilon": [budget.eps] * n,
        "is_modified": modified,
    }
    names = target.split.class_names
    test_path = root / "data" / dataset / "test.parquet"
    if not test_path.is_file():
        write_split(test_path, names, {k: rows[k] for k in rows.column_names if k != "image"} | {"image": clean})
    path = root / "data" / dataset / settings.surrogate / f"{budget.export_split}.parquet"
    write_split(path, names, columns)
    write_readme(root, readme_title(root) or f"{dataset} adversarial images from {settings.surrogate}")
    return str(path)


def readme_title(root: Path) -> str | None:
    """The title of an existing snapshot README (kept when its config list is rewritten)."""
    readme = root / "README.md"
    if readme.is_file():
        for line in readme.read_text().splitlines():
            if line.startswith("# "):
                return line[2:]
    return None


def summary_line(summary: dict) -> str:
    return (
        f"{summary['norm']} eps={summary['eps']:.6g}: robust accuracy {summary['robust_accuracy']:.2%} "
        f"({summary['n_robust']}/{summary['n']}), clean {summary['clean_accuracy']:.2%}, "
        f"{summary['attack_seconds']:.1f}s wall time (sum over batches), "
        f"{summary['forward_rows_per_image']:.0f} forward + {summary['backward_rows_per_image']:.0f} backward rows "
        f"per image"
    )


def run_directories(settings: AttackSettings, target: Target) -> dict[str, RunDirectory]:
    return {b.name: RunDirectory(settings.output_dir / b.name, target.identity(settings, b)) for b in settings.budgets}


def check_attack_settings(settings: AttackSettings, target: Target) -> None:
    """Fail on a bad version, attack list or precision before any directory is written."""
    for budget in settings.budgets:
        try:
            AutoAttack(target.model, NORMS[budget.norm], budget.eps, version=settings.version, seed=settings.seed,
                       attacks=None if settings.attacks is None else list(settings.attacks),
                       precision=settings.precision)
        except ValueError as err:
            raise AttackRunError(f"{budget.name}: {err}") from err


def _spawned_shard(rank: int, settings: AttackSettings) -> None:
    """Process `rank` of `settings.processes` on this node: shard index * processes + rank, on GPU `rank`."""
    device = f"cuda:{rank}" if settings.device.startswith("cuda") else settings.device
    target = Target.open(settings, device)
    count = settings.shard_count * settings.processes
    for budget, run in zip(settings.budgets, run_directories(settings, target).values()):
        attack_shard(target, settings, budget, run, settings.shard_index * settings.processes + rank, count, device)


def execute(settings: AttackSettings) -> dict[str, dict]:
    """Attack this node's shard(s) of every budget (unless merge_only), then merge every budget whose batches
    are all there. Returns the merged summaries by budget name and prints one line per budget."""
    spawn = settings.processes > 1 and not settings.merge_only
    target = Target.open(settings, "cpu" if spawn else settings.device)
    runs = run_directories(settings, target)
    if not settings.merge_only:
        check_attack_settings(settings, target)
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
        missing = [s for s in run.starts if s not in run.batch_files()]
        if missing and not settings.merge_only:
            print(f"{budget.name}: this shard is done; merge waits for {run.describe_missing(missing, count)}")
            continue
        summaries[budget.name] = merge(target, settings, budget, run, count)
        print(summary_line(summaries[budget.name]), flush=True)
    return summaries


def attack_from_config(cfg: DictConfig) -> dict[str, dict]:
    """attack.py: white-box AutoAttack of `cfg.run` at the data config's budgets for `cfg.norms`."""
    budgets = white_box_budgets(cfg.norms, cfg.data)
    return execute(AttackSettings.from_config(cfg, budgets, surrogate=run_name_for(cfg.run)))
