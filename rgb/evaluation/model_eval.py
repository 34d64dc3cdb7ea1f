"""Score one fine-tuned model on one dataset: the five white-box settings, optionally the black-box protocol,
class-wise metrics, a corruption severity sweep, plots, and one JSON record in the spirit of RobustBench's.

Integrity first: attack results are accepted only for this model's weights, this dataset's test split, the
data config's budget and the full standard AutoAttack; accuracies are over whole splits unless the user asked
for a partial evaluation, which is then marked partial everywhere it appears.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from rgb.attacks.autoattack import ATTACK_ORDER
from rgb.data import RGBDataModule
from rgb.data.benchmark import BenchmarkError, decode_image, to_tensor
from rgb.data.catalog import CORRUPTIONS, DATASETS, TRANSFER_SPLITS, transfer_coverage
from rgb.data.corruptions import apply_corruption
from rgb.evaluation import plots
from rgb.evaluation.attack_run import atomic_write_bytes, file_sha256, split_sha256
from rgb.evaluation.metrics import Accuracy, class_wise_summary
from rgb.evaluation.scores import BLACK_BOX_SETTINGS, black_box_settings, dataset_score
from rgb.models.io import library_versions

NORMS = ("l1", "l2", "linf")


class EvaluationError(RuntimeError):
    """Results that must not be scored (another model, dataset, split size or budget; partial without consent)."""


@dataclass
class EvalOptions:
    attack_dir: Path
    out_dir: Path
    transfer: bool = False
    severity_sweep: bool = False
    allow_partial: bool = False
    max_images: int | None = None
    worst_k: tuple = (1, "10%")
    device: str = "cpu"
    batch_size: int = 256


def _subset(split, max_images):
    return split if max_images is None else Subset(split, range(min(max_images, len(split))))


@torch.inference_mode()
def predict(model, split, options: EvalOptions, desc: str) -> dict[str, np.ndarray]:
    """Predictions over a split (in order, nothing dropped), with labels and image ids."""
    data = _subset(split, options.max_images)
    loader = DataLoader(data, batch_size=options.batch_size, shuffle=False, drop_last=False)
    preds, labels, ids = [], [], []
    for x, y, image_id in tqdm(loader, desc=desc, unit="batch", leave=False):
        preds.append(model(x.to(options.device)).argmax(dim=1).cpu())
        labels.append(y)
        ids.append(image_id)
    out = {"pred": torch.cat(preds).numpy(), "label": torch.cat(labels).numpy(), "image_id": torch.cat(ids).numpy()}
    if not np.array_equal(out["image_id"], np.arange(len(data))):
        raise EvaluationError(f"{desc}: image ids are not 0..{len(data) - 1} in order")
    return out


def _accuracy(flags: np.ndarray, full_size: int, options: EvalOptions, what: str) -> Accuracy:
    partial = len(flags) < full_size
    if partial and not options.allow_partial:
        raise EvaluationError(f"{what}: {len(flags)} of {full_size} images; pass allow_partial=true to score it "
                              f"(it is then marked partial)")
    return Accuracy.of(flags, partial=partial)


def read_attack(norm: str, options: EvalOptions, expected: dict) -> tuple[Accuracy, dict, np.ndarray] | None:
    """The merged AutoAttack result of one norm, checked against what this evaluation is about; None if absent."""
    folder = options.attack_dir / norm
    summary_file, results_file = folder / "summary.json", folder / "results.parquet"
    if not summary_file.is_file():
        if folder.is_dir():
            raise EvaluationError(f"attack run {folder} is not merged/complete (no summary.json): finish it or run "
                                  f"`python attack.py ... merge_only=true`")
        return None
    try:
        summary = json.loads(summary_file.read_text())
        table = pq.read_table(results_file)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise EvaluationError(f"unreadable attack result in {folder}: {str(err).splitlines()[0]}") from err
    checks = {
        "weights_sha256": (summary.get("weights_sha256") == expected["weights_sha256"], "another model's weights"),
        "dataset": (summary.get("dataset") == expected["dataset"], f"dataset {summary.get('dataset')!r}"),
        "split": (summary.get("split") == "test", f"split {summary.get('split')!r}"),
        "split_sha256": (summary.get("split_sha256") == expected["split_sha256"], "other test images"),
        "eps": (math.isclose(summary.get("eps", -1), expected["eps"][norm], rel_tol=1e-6),
                f"eps {summary.get('eps')} instead of {expected['eps'][norm]}"),
        "attacks": (summary.get("version") == "standard" and summary.get("attacks") == list(ATTACK_ORDER),
                    f"not the standard AutoAttack ({summary.get('version')}: {summary.get('attacks')})"),
        "complete": (summary.get("complete") is True and table.num_rows == summary.get("n"), "an incomplete run"),
    }
    for field, (ok, what) in checks.items():
        if not ok:
            raise EvaluationError(f"refusing {folder}: it was made for {what} ({field} mismatch)")
    robust = np.asarray(table.column("robust").to_numpy(zero_copy_only=False), dtype=bool)
    ids = np.asarray(table.column("image_id").to_numpy())
    if not np.array_equal(ids, np.arange(len(ids))):
        raise EvaluationError(f"refusing {folder}: image ids are not 0..{len(ids) - 1} in order")
    if options.max_images is not None:
        robust = robust[: options.max_images]
    accuracy = _accuracy(robust, expected["n_test"], options, f"AutoAttack {norm}")
    if summary.get("n") != expected["n_test"] and not options.allow_partial:
        raise EvaluationError(f"refusing {folder}: {summary.get('n')} images attacked, test has {expected['n_test']}")
    return accuracy, summary, robust


def transfer_surrogates(datamodule: RGBDataModule) -> list[str]:
    """Surrogate configs the source has for this dataset (and, for a real dataset, the card says exist)."""
    path = datamodule.source
    try:
        configs = datasets.get_dataset_config_names(str(Path(path).expanduser()) if Path(path).exists() else path)
    except Exception as err:  # same breadth as the loader: any failure means "cannot list this source"
        raise BenchmarkError(f"cannot list configs of {path}: {str(err).splitlines()[0]}") from err
    prefix = datamodule.dataset + "-"
    found = [c[len(prefix):] for c in configs if c.startswith(prefix)]
    if datamodule.dataset in DATASETS:
        found = sorted(set(found) | set(transfer_coverage(datamodule.dataset)))
    return sorted(found)


def severity_sweep(model, datamodule: RGBDataModule, options: EvalOptions) -> dict[str, dict[int, dict]]:
    """Accuracy under each of the 11 corruptions at severities 1-5, generated on the fly from the clean test split."""
    test = datamodule.split("test")
    n = len(test) if options.max_images is None else min(options.max_images, len(test))
    clean = [np.asarray(decode_image(test.rows[i]["image"], datamodule.image_size)) for i in range(n)]
    labels = test.labels[:n]
    out: dict[str, dict[int, dict]] = {}
    with tqdm(total=len(CORRUPTIONS) * 5, desc="severity sweep", unit="setting") as bar:
        for name in CORRUPTIONS:
            out[name] = {}
            for severity in (1, 2, 3, 4, 5):
                images = torch.stack([to_tensor(apply_corruption(im, name, severity, seed=i)) for i, im in enumerate(clean)])
                with torch.inference_mode():
                    preds = torch.cat([model(images[s : s + options.batch_size].to(options.device)).argmax(1).cpu()
                                       for s in range(0, n, options.batch_size)])
                out[name][severity] = _accuracy((preds == labels).numpy(), len(test), options, "severity sweep").to_dict()
                bar.update(1)
    return out


def evaluate_model(model, meta: dict, weights_path: Path, datamodule: RGBDataModule, options: EvalOptions) -> dict:
    """Everything about one (model, dataset): writes scores.json, predictions.parquet and plots to out_dir."""
    model = model.to(options.device).eval()
    if meta.get("dataset") not in (None, datamodule.dataset):
        raise EvaluationError(f"the model was trained on {meta['dataset']!r}, the data config is {datamodule.dataset!r}")
    test = datamodule.split("test")
    names = test.class_names
    if len(names) != meta.get("num_classes", len(names)):
        raise EvaluationError(f"the model has {meta['num_classes']} classes, {datamodule.dataset} has {len(names)}")
    expected = {"weights_sha256": file_sha256(weights_path), "dataset": datamodule.dataset,
                "split_sha256": split_sha256(test), "eps": datamodule.budgets, "n_test": len(test)}

    clean = predict(model, test, options, "test")
    common_split = datamodule.split("common")
    common = predict(model, common_split, options, "common")
    corruption_of = np.asarray(common_split.rows["corruption"])[: len(common["pred"])]
    settings = {
        "test": _accuracy(clean["pred"] == clean["label"], len(test), options, "test"),
        "common": _accuracy(common["pred"] == common["label"], len(common_split), options, "common"),
    }
    per_sample = {"test": clean["pred"] == clean["label"], "common": common["pred"] == common["label"]}
    attack_summaries = {}
    for norm in NORMS:
        found = read_attack(norm, options, expected)
        settings[f"autoattack_{norm}"] = found[0] if found else None
        if found:
            attack_summaries[norm], per_sample[f"autoattack_{norm}"] = found[1], found[2]
    record = {
        "model": {"run_name": meta.get("run_name"), "timm_name": meta.get("timm_name"), "loss": meta.get("loss"),
                  "strategy": meta.get("strategy"), "weights_sha256": expected["weights_sha256"]},
        "dataset": datamodule.dataset, "source": datamodule.source, "n_test": len(test),
        "eps": datamodule.budgets,
        "white_box": {"settings": {k: v.to_dict() if v else None for k, v in settings.items()},
                      **dataset_score(settings, "white_box")},
        "common_by_corruption": {
            c: Accuracy.of(per_sample["common"][corruption_of == c]).to_dict()
            for c in CORRUPTIONS if (corruption_of == c).any()
        },
        "attacks": {norm: {k: s.get(k) for k in ("eps", "seed", "precision", "version", "attacks", "robust_accuracy",
                                                  "n_robust", "accuracy_after", "forward_rows_per_image",
                                                  "backward_rows_per_image", "versions")}
                    for norm, s in attack_summaries.items()},
        "versions": {**library_versions(), "python": platform.python_version()},
    }
    if options.transfer:
        record["black_box"] = _black_box(model, datamodule, options, settings, per_sample)
    record["class_wise"] = {
        setting: class_wise_summary(clean["label"][: len(flags)], flags, len(names), options.worst_k)
        for setting, flags in per_sample.items()
    }
    if options.severity_sweep:
        record["severity_sweep"] = severity_sweep(model, datamodule, options)
    _write(record, clean, common, per_sample, names, options)
    return record


def _black_box(model, datamodule, options, settings, per_sample) -> dict:
    transfer: dict[str, dict[str, Accuracy | None]] = {split: {} for split in TRANSFER_SPLITS}
    for surrogate in transfer_surrogates(datamodule):
        for split in TRANSFER_SPLITS:
            try:
                data = datamodule.split(split, surrogate)
            except BenchmarkError:
                transfer[split][surrogate] = None  # not in the card, or missing from this snapshot: reported
                continue
            found = predict(model, data, options, f"{surrogate}/{split}")
            flags = found["pred"] == found["label"]
            transfer[split][surrogate] = _accuracy(flags, len(data), options, f"{surrogate}/{split}")
            per_sample[f"{surrogate}/{split}"] = flags
    chosen_settings, chosen = black_box_settings(settings["test"], settings["common"], transfer)
    return {
        "settings": {k: v.to_dict() if v else None for k, v in chosen_settings.items()},
        "strongest_surrogate": chosen,
        "by_surrogate": {split: {s: a.to_dict() if a else None for s, a in by.items()} for split, by in transfer.items()},
        **dataset_score(chosen_settings, "black_box"),
    }


def _write(record, clean, common, per_sample, names, options: EvalOptions) -> None:
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    columns = {"image_id": clean["image_id"], "label": clean["label"], "pred_test": clean["pred"],
               "pred_common": common["pred"]}
    columns.update({f"correct_{k.replace('/', '_')}": v for k, v in per_sample.items() if len(v) == len(clean["pred"])})
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    atomic_write_bytes(out / "predictions.parquet", sink.getvalue().to_pybytes())
    title = f"{record['model']['run_name']} on {record['dataset']}"
    figures = [plots.settings_bars({record["dataset"]: {k: (v or {}).get("accuracy") for k, v in
                                                        record["white_box"]["settings"].items()}},
                                   out / "settings.png", f"five settings: {title}")]
    if record["attacks"]:
        figures.append(plots.attack_stages({n: a["accuracy_after"] for n, a in record["attacks"].items()},
                                           out / "attack_stages.png", f"AutoAttack stages: {title}"))
    figures.append(plots.class_accuracy({k: v["per_class"] for k, v in record["class_wise"].items()
                                         if k in ("test", "common") or k.startswith("autoattack")},
                                        names, out / "class_accuracy.png", f"per-class accuracy: {title}"))
    record["plots"] = [p.name for p in figures]
    atomic_write_bytes(out / "scores.json", (json.dumps(record, indent=2) + "\n").encode())


def format_table(record: dict) -> str:
    """The five-setting table of one record, with counts, as printed by evaluate.py and `make demo`."""
    wb = record["white_box"]
    lines = [f"{record['model']['run_name']} on {record['dataset']} (test n={record['n_test']})",
             f"{'setting':18s} {'accuracy':>9s} {'correct/total':>15s}"]
    for name, acc in wb["settings"].items():
        if acc is None:
            lines.append(f"{name:18s} {'missing':>9s}")
        else:
            mark = " PARTIAL" if acc["partial"] else ""
            lines.append(f"{name:18s} {acc['accuracy']:9.4f} {acc['correct']:>7d}/{acc['total']:<7d}{mark}")
    score = f"{wb['score']:.4f} / {wb['max']}" if wb["score"] is not None else (
        f"incomplete ({wb['partial_sum']:.4f} over {wb['max'] - len(wb['missing'])} of {wb['max']} settings; "
        f"missing: {', '.join(wb['missing'])})")
    lines.append(f"{'score':18s} {score}")
    if "black_box" in record:
        bb = record["black_box"]
        total = f"{bb['score']:.4f} / {bb['max']}" if bb["score"] is not None else f"incomplete (missing: {', '.join(bb['missing'])})"
        lines.append(f"{'black-box score':18s} {total}")
    return "\n".join(lines)


__all__ = ["BLACK_BOX_SETTINGS", "EvalOptions", "EvaluationError", "evaluate_model", "format_table"]
