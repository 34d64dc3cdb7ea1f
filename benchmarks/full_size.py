"""Full-size rehearsal (issue 36): the card's image size and class count end to end, through the user's commands.

    python benchmarks/full_size.py --out full_size.json            # Stanford Cars shape, vit_base + resnet50 (GPU)
    python benchmarks/full_size.py --quick --out quick.json        # UC Merced shape, resnet18, a few CPU minutes
    python benchmarks/full_size.py --attack-workers 1 2 --out f.json  # also attack with 2 workers on one GPU
    python benchmarks/full_size.py --schedule pooled --out f.json  # ours pools each attack's survivors

It writes a card-shaped snapshot with the suite's own writer (rgb.data.snapshot: PNG in parquet, the card's split
sizes, `common`, `random_linf_30` and every transfer split of the card's coverage for that dataset), from synthetic
class-coloured patterns (so a few training steps learn something), then runs `train.py`, `attack.py` and
`evaluate.py` (white-box, then `protocol=black_box`) as a user does, on a real-size backbone from random init.
Per stage it records wall time, images/s, model evaluations per image (summary.json's forward/backward rows), the
peak resident memory of its process and of its workers, peak GPU memory (CUDA), and the data path's PNG decode
throughput, in one JSON.

The transfer splits are written as the card's surrogates' configs, but their images are the test images moved by
whole grey levels inside each split's budget, not a surrogate's AutoAttack: the rehearsal measures reading and
scoring them.
`--quick` shortens the attack (`version=fast`, few steps) and evaluates the first images of each split
(PARTIAL): its numbers are of the data path and the commands, not of the protocol; the JSON says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rgb.data.catalog import DATASETS, TRANSFER_BUDGETS, transfer_coverage  # noqa: E402
from rgb.data.snapshot import clean_columns, png_bytes, write_dataset, write_readme, write_split  # noqa: E402

IMAGE_SIZE = 224
# Each mode: the card dataset whose shape is rebuilt, its data config, the backbones (timm names, random init),
# training steps, attacked images, attack and evaluation overrides, and what departs from the card's protocol.
MODES = {
    "quick": {
        "dataset": "uc-merced-land-use-dataset", "data_config": "uc_merced", "models": ["resnet18"],
        "train_steps": 8, "batch_size": 16, "attack_images": 8,
        "attack": ["version=fast", "steps=10", "norms=[linf,l2,l1]"], "eval_max_images": 8,
        "not_protocol": "version=fast with steps=10 on 8 images; evaluation over the first 8 images of each split "
                        "(PARTIAL); 8 training steps; transfer splits are the test images moved inside each budget, "
                        "not a surrogate's AutoAttack",
    },
    "full": {
        "dataset": "stanford_cars", "data_config": "stanford_cars",
        "models": ["vit_base_patch16_224", "resnet50"],
        "train_steps": 20, "batch_size": 64, "attack_images": 64,
        "attack": ["norms=[linf,l2,l1]"], "eval_max_images": None,
        "not_protocol": "64 attacked images (PARTIAL), 20 training steps from random init; transfer splits are the "
                        "test images moved inside each budget, not a surrogate's AutoAttack",
    },
}


def class_images(labels: np.ndarray, num_classes: int, seed: int) -> np.ndarray:
    """uint8 N x 224 x 224 x 3: per class a colour and a stripe orientation/frequency, plus per-image noise."""
    rng = np.random.default_rng(seed)
    palette = np.random.default_rng(12345).integers(40, 216, size=(num_classes, 3))
    grid = np.arange(IMAGE_SIZE, dtype=np.float32)
    yy, xx = np.meshgrid(grid, grid, indexing="ij")
    out = np.empty((len(labels), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, c in enumerate(labels):
        angle, freq = np.pi * (c % 7) / 7, 0.03 + 0.02 * (c // 7 % 5)
        stripes = 30 * np.sin(freq * (np.cos(angle) * xx + np.sin(angle) * yy) + rng.uniform(0, 2 * np.pi))
        noise = rng.normal(0, 12, size=(IMAGE_SIZE, IMAGE_SIZE, 3))
        out[i] = np.clip(palette[c][None, None, :] + stripes[..., None] + noise, 0, 255).astype(np.uint8)
    return out


def split_labels(n: int, num_classes: int) -> np.ndarray:
    return np.arange(n) % num_classes


def budget_noise_split(args: tuple) -> str:
    """One transfer split of the card's coverage: the test images moved by whole grey levels inside the split's
    budget (Linf: every value by floor(eps*255) levels; L2/L1: as many values by one level as the budget holds),
    written by the snapshot writer."""
    root, dataset, class_names, surrogate, split, images, labels = args
    norm, eps = TRANSFER_BUDGETS[split]
    rng = np.random.default_rng(sorted(TRANSFER_BUDGETS).index(split) + 100 * len(surrogate))
    values = images[0].size
    steps = {"linf": int(np.floor(eps * 255)), "l2": 1, "l1": 1}[norm]
    moved = {"linf": values, "l2": min(values, int(np.floor((eps * 255) ** 2))), "l1": min(values, int(eps * 255))}
    delta = rng.choice([-steps, steps], size=images.shape).reshape(len(images), -1)
    for row in delta:
        row[rng.permutation(values)[moved[norm]:]] = 0
    adversarial = np.clip(images.astype(np.int64) + delta.reshape(images.shape), 0, 255).astype(np.uint8)
    n = len(labels)
    columns = {"image": [png_bytes(a) for a in adversarial], "label": labels.tolist(), "image_id": list(range(n)),
               "perturbation": ["transfer_autoattack"] * n, "surrogate": [surrogate] * n, "norm": [norm] * n,
               "epsilon": [float(eps)] * n, "is_modified": [True] * n}
    write_split(Path(root) / "data" / dataset / surrogate / f"{split}.parquet", class_names, columns)
    return f"{surrogate}/{split}"


def clean_split(args: tuple) -> str:
    """A clean split (train or validation) of the snapshot, written by the snapshot writer in a worker process."""
    root, dataset, class_names, split, n, seed = args
    labels = split_labels(n, len(class_names))
    write_split(Path(root) / "data" / dataset / f"{split}.parquet", class_names,
                clean_columns(class_images(labels, len(class_names), seed), labels))
    return split


def build_snapshot(root: Path, dataset: str, workers: int) -> dict:
    """The card's shape of `dataset` at 224x224 under `root`, written by rgb's own snapshot writer: `test` with
    its `common` and `random_linf_30` here, train, validation and the transfer splits in `workers` processes."""
    info = DATASETS[dataset]
    began = time.perf_counter()
    class_names = [f"class_{c:03d}" for c in range(info.num_classes)]
    sizes = {"train": info.train_size, "validation": info.validation_size, "test": info.test_size}
    title = f"{info.title}-shaped rehearsal snapshot (synthetic)"
    test_labels = split_labels(info.test_size, info.num_classes)
    test_images = class_images(test_labels, info.num_classes, seed=2)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        clean = [pool.submit(clean_split, (str(root), dataset, class_names, split, sizes[split], seed))
                 for seed, split in enumerate(("train", "validation"))]
        transfer = [pool.submit(budget_noise_split, (str(root), dataset, class_names, surrogate, split, test_images,
                                                   test_labels))
                    for surrogate, covered in transfer_coverage(dataset).items() for split in covered]
        write_dataset(root, dataset, class_names, {"test": (test_images, test_labels)}, title)
        written = [job.result() for job in clean + transfer][2:]
    write_readme(root, title)
    files = [p for p in root.rglob("*.parquet")]
    images = sum(sizes.values()) + 2 * info.test_size + len(written) * info.test_size
    return {"dataset": dataset, "classes": info.num_classes, "image_size": IMAGE_SIZE, "splits": sizes,
            "transfer_splits": written, "images_written": images, "workers": workers,
            "bytes": sum(p.stat().st_size for p in files), "seconds": round(time.perf_counter() - began, 1)}


def decode_throughput(root: Path, dataset: str, split: str, surrogate: str | None = None) -> dict:
    """PNG decode of one whole split as the data module reads it (rgb.data.load_split, then PIL per image)."""
    from rgb.data import load_split

    began = time.perf_counter()
    rows = load_split(str(root), dataset, split, surrogate=surrogate)
    loaded = time.perf_counter() - began
    began = time.perf_counter()
    for image in rows["image"]:
        image.convert("RGB").load()
    seconds = time.perf_counter() - began
    return {"split": f"{surrogate + '/' if surrogate else ''}{split}", "images": len(rows),
            "load_seconds": round(loaded, 2), "decode_seconds": round(seconds, 2),
            "decode_images_per_s": round(len(rows) / seconds, 1)}


def command(stage: str, args: list[str], log: Path, timeout: int) -> dict:
    """Run one of the suite's commands as a user does; its output goes to `log`."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "1"}
    began, offset = time.perf_counter(), log.stat().st_size if log.is_file() else 0
    with open(log, "a") as out:
        out.write(f"\n===== {stage}: {' '.join(args)}\n")
        out.flush()
        try:
            done = subprocess.run([sys.executable, __file__, "--run", *args], cwd=REPO, stdout=out,
                                  stderr=subprocess.STDOUT,
                                  env=env, timeout=timeout)
            code, error = done.returncode, None
        except subprocess.TimeoutExpired:
            code, error = None, f"timed out after {timeout}s"
    entry = {"stage": stage, "returncode": code, "wall_seconds": round(time.perf_counter() - began, 1),
             "peak_rss_mib": stage_peak(log, offset, "PEAK_RSS_MIB"),
             "workers_peak_rss_mib": stage_peak(log, offset, "WORKERS_PEAK_RSS_MIB"),
             "peak_gpu_mib": stage_peak(log, offset, "GPU_PEAK_MIB")}
    if error:
        entry["error"] = error
    return entry


def own_peak_rss_kib() -> int:
    """This process's peak resident memory since its exec (VmHWM): ru_maxrss would carry the peak of the process
    that forked it (Linux keeps it across exec), here the rehearsal's own, with the snapshot's images."""
    status = Path("/proc/self/status")
    if status.is_file():
        found = re.search(r"^VmHWM:\s+(\d+) kB", status.read_text(), re.MULTILINE)
        if found:
            return int(found.group(1))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_entry_point(script: str, args: list[str]) -> None:
    """`python SCRIPT ARGS` in this process, then its peak resident memory (itself or its largest child: loader
    workers, attack workers) and peak CUDA memory (when CUDA was used) as lines of its log, so each stage's peaks
    are measured in the process that ran it."""
    import runpy

    sys.argv = [script, *args]
    try:
        runpy.run_path(str(REPO / script), run_name="__main__")
    finally:
        import torch

        print(f"PEAK_RSS_MIB={own_peak_rss_kib() / 1024:.1f}", flush=True)
        print(f"WORKERS_PEAK_RSS_MIB={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.1f}", flush=True)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            print(f"GPU_PEAK_MIB={torch.cuda.max_memory_allocated() / 2**20:.1f}", flush=True)


def stage_peak(log: Path, offset: int, name: str) -> float | None:
    """A peak the stage's process printed (run_entry_point's NAME=value line) in its part of the log; None when it
    printed none (no CUDA used, or killed)."""
    with open(log, "rb") as text:
        text.seek(offset)
        found = re.findall(rf"^{name}=([0-9.]+)", text.read().decode(errors="replace"), re.MULTILINE)
    return float(found[-1]) if found else None


def attack_rows(attack_dir: Path) -> list[dict]:
    """Per norm: wall time, images/s and forward/backward rows per image from the run's summary.json."""
    rows = []
    for summary_path in sorted(attack_dir.rglob("summary.json")):
        summary = json.loads(summary_path.read_text())
        rows.append({"path": str(summary_path.relative_to(attack_dir)), "norm": summary["norm"],
                     "eps": summary["eps"], "images": summary["n"], "robust": summary["n_robust"],
                     "clean_correct": summary["n_clean_correct"], "attack_seconds": summary["attack_seconds"],
                     "images_per_s": round(summary["n"] / summary["attack_seconds"], 3),
                     "forward_rows_per_image": summary["forward_rows_per_image"],
                     "backward_rows_per_image": summary["backward_rows_per_image"],
                     "batch_size": summary["batch_size"], "threads": summary["threads"]})
    return rows


def machine() -> dict:
    import torch

    info = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.cuda.is_available(),
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def rehearse(mode: str, out: Path, work: Path, impls: list[str], device: str, timeout: int,
             models: list[str] | None = None, attack_workers: tuple[int, ...] = (1,), schedule: str = "batch") -> dict:
    plan = {**MODES[mode], "models": models or MODES[mode]["models"]}
    dataset, data = plan["dataset"], plan["data_config"]
    report: dict = {"mode": mode, "protocol_departures": plan["not_protocol"], "schedule": schedule,
                    "machine": machine(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "stages": []}

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    snapshot, outputs, log = work / "snapshot", work / "outputs", work / "commands.log"
    if (snapshot / "README.md").is_file():  # a previous rehearsal's snapshot in --work: the same bytes
        report["snapshot"] = json.loads((work / "snapshot.json").read_text()) | {"reused": True}
    else:
        report["snapshot"] = build_snapshot(snapshot, dataset, workers=min(8, os.cpu_count() or 1))
        (work / "snapshot.json").write_text(json.dumps(report["snapshot"]))
    save()
    report["decode"] = [decode_throughput(snapshot, dataset, "test"),
                        decode_throughput(snapshot, dataset, "linf_4", surrogate="clip_vitb16")]
    save()
    info = DATASETS[dataset]
    common = [f"data={data}", f"data.source={snapshot}", f"paths.output_dir={outputs}", f"device={device}"]
    for model in plan["models"]:
        run_dir = outputs / "train" / dataset / model
        train = command(f"train {model}", [
            "train.py", *common[:3],
            f"model.name={model}", "model.pretrained=false", f"run_dir={run_dir}", "trainer.max_epochs=1",
            f"+trainer.limit_train_batches={plan['train_steps']}", "+trainer.limit_val_batches=2",
            f"data.batch_size={plan['batch_size']}", f"data.eval_batch_size={plan['batch_size']}",
            # from random init: a learning rate that learns the class colours in a few steps, no colour jitter
            "optim.backbone_lr=1e-3", "optim.head_lr=1e-3", "data.augment.color_jitter=0",
            "callbacks.progress_bar.refresh_rate=0", *(["trainer=cpu"] if device == "cpu" else [])], log, timeout)
        train["images_per_s"] = round(plan["train_steps"] * plan["batch_size"] / train["wall_seconds"], 2)
        report["stages"].append({"model": model, **train})
        save()
        if train["returncode"] != 0:
            continue  # nothing to attack; the report says which stage failed
        # each impl with attack.py's default workers (evaluation reads ours), then ours with N workers sharing the
        # device (one per GPU by default), the images cut into N batches
        runs = [(impl, 1) for impl in impls] + [("ours", w) for w in attack_workers if w > 1]
        for impl, workers in runs:
            attack_dir = outputs / "attack" / (f"{model}-{impl}" + (f"-{workers}workers" if workers > 1 else ""))
            attack = command(f"attack {model} {impl}" + (f" x{workers}" if workers > 1 else ""), [
                "attack.py", f"run={run_dir}", *common, f"impl={impl}", f"max_images={plan['attack_images']}",
                f"output_dir={attack_dir}", f"batch_size={-(-plan['attack_images'] // workers)}",
                *([f"shard.devices={workers}"] if workers > 1 else []),
                *([f"schedule={schedule}"] if impl == "ours" else []), *plan["attack"]], log, timeout)
            attack["norms"] = attack_rows(attack_dir)
            attack["images_per_s"] = round(plan["attack_images"] * max(1, len(attack["norms"]))
                                           / attack["wall_seconds"], 2)
            report["stages"].append({"model": model, "impl": impl, "workers": workers if workers > 1 else "auto",
                                     **attack})
            save()
        evaluation = ["evaluate.py", f"run={run_dir}", *common, f"attack_dir={outputs / 'attack' / f'{model}-ours'}",
                      f"batch_size={plan['batch_size']}", "allow_partial=true"]
        # White-box reads the attack's first-N run; black-box reads whole transfer splits unless the mode cuts them.
        limits = {"white_box": plan["attack_images"], "black_box": plan["eval_max_images"]}
        for protocol in ("white_box", "black_box"):
            limit = [f"max_images={limits[protocol]}"] if limits[protocol] else []
            entry = command(f"evaluate {model} {protocol}", [*evaluation, *limit, f"protocol={protocol}",
                                                             f"output_dir={outputs / 'eval' / model / protocol}"],
                            log, timeout)
            per_split = limits[protocol] or info.test_size
            splits = 3 + (len(report["snapshot"]["transfer_splits"]) if protocol == "black_box" else 0)
            entry["images"] = per_split * splits
            entry["images_per_s"] = round(entry["images"] / entry["wall_seconds"], 2)
            report["stages"].append({"model": model, "protocol": protocol, **entry})
            save()
    report["finished"] = all(stage["returncode"] == 0 for stage in report["stages"])
    report["machine"]["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    report["commands_log_tail"] = log.read_text()[-4000:] if not report["finished"] else None
    save()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="UC Merced shape, resnet18, minutes on a CPU")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--work", type=Path, default=None, help="snapshot and outputs (default: a temp folder)")
    parser.add_argument("--reference", action="store_true", help="also impl=reference (needs pyautoattack)")
    parser.add_argument("--models", nargs="+", default=None, help="timm names (default: the mode's backbones)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--attack-workers", nargs="+", type=int, default=[1],
                        help="also attack with N workers sharing the device (shard.devices=N), N > 1")
    parser.add_argument("--schedule", default="batch", choices=["batch", "pooled"],
                        help="ours: batch by batch, or each attack over the survivors of all batches (pooled)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per command")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run"]:  # one stage: a user command in this process (see `command`)
        run_entry_point(argv[1], argv[2:])
        return 0
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="rgb-full-size-"))
    impls = ["ours", "reference"] if args.reference else ["ours"]
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        report = rehearse("quick" if args.quick else "full", args.out, work, impls, device, args.timeout,
                          args.models, tuple(args.attack_workers), args.schedule)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"full_size: wrote {args.out} ({'all stages finished' if report['finished'] else 'a stage FAILED'})")
    return 0 if report["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
