"""Score one model on one dataset: the five white-box settings, optionally the black-box protocol, class-wise
metrics, a corruption severity sweep, plots, and one typed record (rgb.evaluation.records.ScoresRecord).

Integrity first: attack results are accepted only for this model's weights, this dataset's test split, the
data config's budget and this model's own clean predictions; results of another AutoAttack version, precision or
attack subset are shown beside the score, never in it; accuracies are over whole splits unless the user asked
for a partial evaluation, which is then marked partial everywhere it appears.
"""

from __future__ import annotations

import logging
import math
import platform
import re
from dataclasses import dataclass, replace
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from rgb.attacks.registry import VERSIONS, is_standard
from rgb.core.classwise import class_wise_summary
from rgb.core.files import atomic_write_bytes, file_sha256
from rgb.core.threat import Norm
from rgb.data import RGBDataModule
from rgb.data.benchmark import BenchmarkError, decode_image, is_local, to_tensor
from rgb.data.catalog import CORRUPTIONS, DATASETS, TRANSFER_SPLITS, transfer_coverage
from rgb.data.corruptions import apply_corruption
from rgb.data.fingerprint import split_sha256
from rgb.evaluation import plots
from rgb.evaluation.records import SCORES_FILE, Accuracy, AttackSummary, ModelIdentity, ProtocolScore, ScoresRecord
from rgb.evaluation.scores import black_box_score
from rgb.models.checks import check_model_fits
from rgb.models.io import library_versions
from rgb.runs.implementations import REFERENCE_CASCADE
from rgb.runs.settings import AttackRunError
from rgb.runs.store import RunResult, read_run
from rgb.zeroshot.head import check_class_names
from rgb.zeroshot.prompts import PromptError

log = logging.getLogger(__name__)
NORMS = tuple(n.key for n in (Norm.L1, Norm.L2, Norm.LINF))
# The attack lists of standard runs: the cascade of a standard version of the table, or the reference's.
STANDARD_CASCADES = [list(VERSIONS[v].attacks) for v in VERSIONS if is_standard(v)] + [[REFERENCE_CASCADE]]


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
    worst_k: tuple = (1, 5, 10)
    device: str = "cpu"
    batch_size: int = 256


@dataclass(frozen=True)
class AttackExpectation:
    """What an attack run must have been made for to be scored with this evaluation."""

    weights_sha256: str
    dataset: str
    split_sha256: str
    eps: dict[str, float]
    n_test: int
    clean_pred: np.ndarray  # this model's own predictions on (the evaluated prefix of) test


@dataclass(frozen=True)
class AttackReading:
    """One norm's checked attack run: its summary and per-image robust flags; `standard` says whether it may
    enter the score (otherwise it is shown beside it)."""

    summary: AttackSummary
    robust: np.ndarray
    standard: bool


def _subset(split, max_images):
    return split if max_images is None else Subset(split, range(min(max_images, len(split))))


@torch.inference_mode()
def predict(model, split, options: EvalOptions, desc: str) -> dict[str, np.ndarray]:
    """Predictions over a split (in order, nothing dropped), with labels and image ids. Refuses a model whose
    logits are not finite, as AutoAttack does: an argmax over NaN is not a prediction."""
    data = _subset(split, options.max_images)
    loader = DataLoader(data, batch_size=options.batch_size, shuffle=False, drop_last=False)
    preds, labels, ids = [], [], []
    for x, y, image_id in tqdm(loader, desc=desc, unit="batch", leave=False):
        logits = model(x.to(options.device)).float()
        finite = torch.isfinite(logits).all(dim=1).cpu()
        if not finite.all():
            first = int(image_id[~finite][0])
            raise EvaluationError(f"the model returned NaN/inf logits on {desc} (first at image_id {first}); "
                                  f"it cannot be scored")
        preds.append(logits.argmax(dim=1).cpu())
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


def _check_identity(found: RunResult, norm: str, expected: AttackExpectation) -> None:
    """Refuse a run made for another model, dataset, test split or budget, or whose clean predictions are not
    this model's (its summary's numbers against its own results are checked by rgb.runs.store.read_run)."""
    summary, columns = found.summary, found.columns
    checks = {
        "weights_sha256": (summary.weights_sha256 == expected.weights_sha256, "another model's weights"),
        "dataset": (summary.dataset == expected.dataset, f"dataset {summary.dataset!r}"),
        "split": (summary.split == "test", f"split {summary.split!r}"),
        "split_sha256": (summary.split_sha256 == expected.split_sha256, "other test images"),
        "eps": (math.isclose(summary.eps, expected.eps[norm], rel_tol=1e-6),
                f"eps {summary.eps} instead of {expected.eps[norm]}"),
    }
    for name, (ok, what) in checks.items():
        if not ok:
            raise EvaluationError(f"refusing {found.directory}: it was made for {what} ({name} mismatch)")
    ours = expected.clean_pred
    theirs = columns["clean_pred"][: len(ours)]
    differ = np.flatnonzero(theirs != ours[: len(theirs)])
    if differ.size:
        i = int(differ[0])
        raise EvaluationError(
            f"refusing {found.directory}: its clean predictions differ from this model's on {differ.size} of "
            f"{len(theirs)} test images (first: image_id {i}, attack run {int(theirs[i])}, now {int(ours[i])}); "
            f"it was not made with this model as evaluated now: re-run attack.py"
        )


def read_attack(norm: str, options: EvalOptions, expected: AttackExpectation) -> AttackReading | None:
    """The merged AutoAttack result of one norm, checked against what this evaluation is about; None if absent."""
    folder = options.attack_dir / norm
    try:
        found = read_run(folder)
    except AttackRunError as err:
        raise EvaluationError(str(err)) from err
    if found is None:
        return None
    _check_identity(found, norm, expected)
    summary = found.summary
    standard = (summary.standard and is_standard(summary.version) and summary.precision == "fp32"
                and summary.attacks in STANDARD_CASCADES)
    robust = found.columns["robust"].astype(bool)
    if options.max_images is not None:
        robust = robust[: options.max_images]
    accuracy = _accuracy(robust, expected.n_test, options, f"AutoAttack {norm}")
    if summary.n != expected.n_test and not options.allow_partial:
        raise EvaluationError(f"refusing {folder}: {summary.n} images attacked, test has {expected.n_test}")
    return AttackReading(AttackSummary.of(summary, accuracy), robust, standard)


def corruption_key(name) -> str:
    """One spelling of a corruption ("Shot Noise", "shot-noise" -> "shot_noise"); unknown names are refused."""
    key = re.sub(r"[\s\-]+", "_", str(name).strip().lower())
    if key not in CORRUPTIONS:
        raise EvaluationError(f"unknown corruption {name!r} in the common split; the benchmark's are "
                              f"{', '.join(CORRUPTIONS)}")
    return key


def corruption_keys(values) -> np.ndarray:
    """The common split's corruption column in one spelling (each distinct value normalised once)."""
    keys = {value: corruption_key(value) for value in set(values)}
    return np.asarray([keys[value] for value in values])


def _resolved_source(source: str) -> str:
    return str(Path(source).expanduser().resolve()) if is_local(source) else source


def transfer_splits_found(datamodule: RGBDataModule) -> dict[str, list[str]]:
    """Surrogate -> the transfer splits its config `<dataset>-<surrogate>` has in the source."""
    path = _resolved_source(datamodule.source)
    prefix = datamodule.dataset + "-"
    try:
        configs = [c for c in datasets.get_dataset_config_names(path) if c.startswith(prefix)]
        return {c[len(prefix):]: [s for s in datasets.get_dataset_split_names(path, c) if s in TRANSFER_SPLITS]
                for c in sorted(configs)}
    except Exception as err:  # same breadth as the loader: any failure means "cannot list this source"
        raise BenchmarkError(f"cannot list the transfer configs of {datamodule.source}: "
                             f"{str(err).splitlines()[0]}") from err


def severity_sweep(model, datamodule: RGBDataModule, options: EvalOptions) -> dict[str, dict[int, Accuracy]]:
    """Accuracy under each of the 11 corruptions at severities 1-5, generated on the fly from the clean test split."""
    test = datamodule.split("test")
    n = len(test) if options.max_images is None else min(options.max_images, len(test))
    clean = [np.asarray(decode_image(test.rows[i]["image"], datamodule.image_size)) for i in range(n)]
    labels = test.labels[:n]
    out: dict[str, dict[int, Accuracy]] = {}
    with tqdm(total=len(CORRUPTIONS) * 5, desc="severity sweep", unit="setting") as bar:
        for name in CORRUPTIONS:
            out[name] = {}
            for severity in (1, 2, 3, 4, 5):
                images = torch.stack([to_tensor(apply_corruption(im, name, severity, seed=i)) for i, im in enumerate(clean)])
                with torch.inference_mode():
                    preds = torch.cat([model(images[s : s + options.batch_size].to(options.device)).argmax(1).cpu()
                                       for s in range(0, n, options.batch_size)])
                out[name][severity] = _accuracy((preds == labels).numpy(), len(test), options, "severity sweep")
                bar.update(1)
    return out


def evaluate_model(model, meta: dict, weights_path: Path, datamodule: RGBDataModule,
                   options: EvalOptions) -> ScoresRecord:
    """Everything about one (model, dataset): writes scores.json, predictions.parquet and plots to out_dir.
    `model`: any nn.Module mapping [0,1] images to logits; `meta`: its model.json (run_name, dataset, ...)."""
    model = model.to(options.device).eval()
    if meta.get("dataset") not in (None, datamodule.dataset):
        raise EvaluationError(f"the model was trained on {meta['dataset']!r}, the data config is {datamodule.dataset!r}")
    test = datamodule.split("test")
    names = test.class_names
    check_model_fits(model, meta, test, datamodule.image_size, options.device, EvaluationError,
                     f"{meta.get('run_name', 'the model')} on {datamodule.dataset}")
    if "zeroshot" in meta:
        try:
            check_class_names(meta["zeroshot"], names)
        except PromptError as err:
            raise EvaluationError(str(err)) from err

    clean = predict(model, test, options, "test")
    expected = AttackExpectation(file_sha256(weights_path), datamodule.dataset, split_sha256(test),
                                 datamodule.budgets, len(test), clean["pred"])
    common_split = datamodule.split("common")
    common = predict(model, common_split, options, "common")
    corruption_of = corruption_keys(common_split.rows.data.column("corruption").to_pylist()[: len(common["pred"])])
    settings = {
        "test": _accuracy(clean["pred"] == clean["label"], len(test), options, "test"),
        "common": _accuracy(common["pred"] == common["label"], len(common_split), options, "common"),
    }
    per_sample = {"test": clean["pred"] == clean["label"], "common": common["pred"] == common["label"]}
    attacks, non_standard = {}, {}
    for norm in NORMS:
        found = read_attack(norm, options, expected)
        settings[f"autoattack_{norm}"] = found.summary.robust if found and found.standard else None
        if found and found.standard:
            attacks[norm], per_sample[f"autoattack_{norm}"] = found.summary, found.robust
        elif found:
            non_standard[norm] = found.summary
            log.warning("autoattack_%s: %s holds a non-standard result (%s); shown beside, not in the score",
                        norm, options.attack_dir / norm, found.summary.label())
    black_box = _black_box(model, datamodule, options, settings, per_sample) if options.transfer else None
    record = ScoresRecord(
        model=ModelIdentity.of(meta, expected.weights_sha256), dataset=datamodule.dataset,
        source=datamodule.source, n_test=len(test), eps=dict(datamodule.budgets),
        white_box=ProtocolScore("white_box", settings),
        common_by_corruption={c: Accuracy.of(per_sample["common"][corruption_of == c], settings["common"].partial)
                              for c in CORRUPTIONS if (corruption_of == c).any()},
        class_wise={setting: class_wise_summary(clean["label"][: len(flags)], flags, len(names), options.worst_k)
                    for setting, flags in per_sample.items()},
        attacks=attacks, non_standard=non_standard, black_box=black_box,
        severity_sweep=severity_sweep(model, datamodule, options) if options.severity_sweep else None,
        versions={**library_versions(), "python": platform.python_version()}, max_images=options.max_images,
    )
    return _write(record, clean, common, per_sample, names, options)


def _black_box(model, datamodule, options, settings, per_sample):
    card = transfer_coverage(datamodule.dataset) if datamodule.dataset in DATASETS else None
    transfer: dict[str, dict[str, Accuracy]] = {split: {} for split in TRANSFER_SPLITS}
    for surrogate, splits in transfer_splits_found(datamodule).items():
        for split in splits:
            if card is not None and surrogate in card and split not in card[surrogate]:
                log.warning("%s-%s/%s is outside the card's coverage table: not scored", datamodule.dataset,
                            surrogate, split)
                continue
            data = datamodule.split(split, surrogate)  # a broken split is an error, never skipped
            found = predict(model, data, options, f"{surrogate}/{split}")
            flags = found["pred"] == found["label"]
            transfer[split][surrogate] = _accuracy(flags, len(data), options, f"{surrogate}/{split}")
            per_sample[f"{surrogate}/{split}"] = flags
    return black_box_score(settings["test"], settings["common"], transfer, card)


def _write(record: ScoresRecord, clean, common, per_sample, names, options: EvalOptions) -> ScoresRecord:
    """scores.json, predictions and plots in out_dir; a PARTIAL record's in out_dir/partial/ (its scores file
    named scores.partial.json), so a complete record already there is kept and a pool never collects it."""
    out = record.folder(options.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    columns = {"image_id": clean["image_id"], "label": clean["label"], "pred_test": clean["pred"],
               "pred_common": common["pred"]}
    columns.update({f"correct_{k.replace('/', '_')}": v for k, v in per_sample.items() if len(v) == len(clean["pred"])})
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    atomic_write_bytes(out / "predictions.parquet", sink.getvalue().to_pybytes())
    figures = plots.record_figures(record, names, out)
    record = replace(record, plots=[p.name for p in figures])
    record.save(out / record.file_name)
    if record.partial:
        log.warning("PARTIAL evaluation (max_images=%s): written to %s; %s", record.max_images,
                    out / record.file_name, "the whole-split record beside it is kept"
                    if (options.out_dir / SCORES_FILE).is_file() else "not a leaderboard entry")
    return record


def format_table(record: ScoresRecord) -> str:
    """The five-setting table of one record, with counts, as printed by evaluate.py and `make demo`; results
    that are not the protocol's (another version, precision or attack subset) follow, labelled, never scored."""
    part = f"; PARTIAL: the first {record.max_images} images of each split" if record.partial else ""
    lines = [f"{record.model.run_name} on {record.dataset} (test n={record.n_test}{part})",
             f"{'setting':18s} {'accuracy':>9s} {'correct/total':>15s}"]
    for name, acc in record.white_box.settings.items():
        if acc is None:
            lines.append(f"{name:18s} {'missing':>9s}")
            continue
        mark = " PARTIAL" if acc.partial else ""
        attack = record.attacks.get(name.removeprefix("autoattack_"))
        label = attack.label() if attack and name.startswith("autoattack_") else ""
        mark += f" [{label}]" if label else ""
        lines.append(f"{name:18s} {acc.value:9.4f} {acc.correct:>7d}/{acc.total:<7d}{mark}")
    lines.append(f"{'score':18s} {record.white_box.describe()}")
    for norm, attack in record.non_standard.items():
        acc = attack.robust
        lines.append(f"{'autoattack_' + norm:18s} {acc.value:9.4f} {acc.correct:>7d}/{acc.total:<7d} "
                     f"[non-standard: {attack.label()}; not in the score]")
    if record.black_box is not None:
        lines.append(f"{'black-box score':18s} {record.black_box.describe()}")
    return "\n".join(lines)


__all__ = ["AttackExpectation", "EvalOptions", "EvaluationError", "evaluate_model", "format_table", "read_attack"]
