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
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from rgb.core.classwise import class_wise_summary
from rgb.core.errors import UserError
from rgb.core.files import atomic_write_bytes, file_sha256
from rgb.core.machine import matmul_numerics
from rgb.data import BenchmarkData
from rgb.data.benchmark import BenchmarkError, decode_image, is_local, to_tensor
from rgb.data.catalog import (BLACK_BOX, CONTROL_SPLIT, CORRUPTIONS, DATASETS, TRANSFER_SPLITS, WHITE_BOX,
                              transfer_coverage)
from rgb.data.protocol import Protocol
from rgb.data.corruptions import apply_corruption
from rgb.data.fingerprint import split_sha256
from rgb.evaluation import plots
from rgb.evaluation.endpoint_eval import EndpointPredictor, cache_path, split_images
from rgb.evaluation.records import (ATTACK_SETTING_NORMS, WHITE_BOX_SETTINGS, Accuracy, AttackSummary,
                                    ModelIdentity, ProtocolScore, ScoresRecord, TrainRun, attack_setting)
from rgb.evaluation.request import EvalRequest
from rgb.evaluation.scores import OTHER_PROTOCOL, black_box_score
from rgb.endpoints.cache import AnswerCache
from rgb.endpoints.cost import model_price
from rgb.models.checks import check_model_fits
from rgb.models.families import family_of_record
from rgb.models.io import result_versions
from rgb.runs.store import AttackRunError
from rgb.runs.store import RunResult, budget_dir, read_run, standard_run
from rgb.zeroshot.head import check_class_names
from rgb.zeroshot.prompts import PromptError

log = logging.getLogger(__name__)
# The attacked norms in the order of the record's white-box settings.
SCORED_NORMS = tuple(ATTACK_SETTING_NORMS[s].key for s in WHITE_BOX_SETTINGS if s in ATTACK_SETTING_NORMS)


class EvaluationError(UserError, RuntimeError):
    """Results that must not be scored (another model, dataset, split size or budget; partial without consent)."""


def zeroshot_record(meta: dict, run: str | Path, needed_by: str) -> dict:
    """The `zeroshot` section of a zero-shot run's model.json (its prompt-built head), for the report `needed_by`
    names (text robustness, the prompt ensembles' comparison); any other model is refused in one line."""
    family = family_of_record(meta)
    if family.text_tower and "zeroshot" in meta:
        return meta["zeroshot"]
    what = (f"an {family.name} model without a prompt-built head (train it with strategy=zeroshot)"
            if family.text_tower else f"a {family.name} model")
    raise EvaluationError(f"{needed_by} needs a zero-shot (openclip) run; {run} is {what}")


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
def predict(model, split, request: EvalRequest, desc: str) -> dict[str, np.ndarray]:
    """Predictions over a split (in order, nothing dropped), with labels and image ids. Refuses a model whose
    logits are not finite, as AutoAttack does: an argmax over NaN is not a prediction. Strict fp32 (TF32 off)."""
    data = _subset(split, request.max_images)
    loader = DataLoader(data, batch_size=request.batch_size, shuffle=False, drop_last=False)
    preds, labels, ids = [], [], []
    for x, y, image_id in tqdm(loader, desc=desc, unit="batch", leave=False):
        with matmul_numerics("fp32"):  # the record's accuracies are fp32: no TF32 on CUDA (cuDNN's default)
            logits = model(x.to(request.device)).float()
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


class TensorPredictor:
    """Evaluation's view of an nn.Module on [0,1] images: predictions over decoded batches."""

    white_box_na = None
    columns: dict = {}

    def __init__(self, model, request: EvalRequest):
        self.model, self.request = model.to(request.device).eval(), request

    def identity(self, weights_path: Path) -> str:
        return file_sha256(weights_path)

    def __call__(self, split, desc: str) -> dict[str, np.ndarray]:
        return predict(self.model, split, self.request, desc)

    def usage(self) -> None:
        return None

    def close(self) -> None:
        pass


# How each kind of model is asked (`inputs` of the model: tensors, or the split's PNG bytes for API models).
PREDICTORS = {"tensor": TensorPredictor, "png": EndpointPredictor}


def predictor_for(model, request: EvalRequest):
    return PREDICTORS[getattr(model, "inputs", "tensor")](model, request)


def _accuracy(flags: np.ndarray, full_size: int, request: EvalRequest, what: str) -> Accuracy | None:
    if len(flags) == 0 and request.caps.capped:
        return None  # nothing of this split answered yet: missing, never 0
    partial = len(flags) < full_size
    if partial and not request.allow_partial:
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


def read_attack(norm: str, request: EvalRequest, expected: AttackExpectation) -> AttackReading | None:
    """The merged AutoAttack result of one norm, checked against what this evaluation is about; None if absent."""
    folder = budget_dir(request.attack_dir, norm)
    try:
        found = read_run(folder)
    except AttackRunError as err:
        raise EvaluationError(str(err)) from err
    if found is None:
        return None
    _check_identity(found, norm, expected)
    summary = found.summary
    standard = summary.standard and standard_run(summary.version, summary.attacks, summary.precision)
    robust = found.columns["robust"].astype(bool)
    if request.max_images is not None:
        robust = robust[: request.max_images]
    accuracy = _accuracy(robust, expected.n_test, request, f"AutoAttack {norm}")
    if summary.n != expected.n_test and not request.allow_partial:
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


def transfer_splits_found(datamodule: BenchmarkData) -> dict[str, list[str]]:
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


def severity_sweep(model, datamodule: BenchmarkData, request: EvalRequest) -> dict[str, dict[int, Accuracy]]:
    """Accuracy under each of the 11 corruptions at severities 1-5, generated on the fly from the clean test split."""
    test = datamodule.split("test")
    n = len(test) if request.max_images is None else min(request.max_images, len(test))
    clean = [np.asarray(decode_image(test.rows[i]["image"], datamodule.image_size))  # a wait of its own, shown
             for i in tqdm(range(n), desc="severity sweep: decoding the test split", unit="img", leave=False)]
    labels = test.labels[:n]
    out: dict[str, dict[int, Accuracy]] = {}
    with tqdm(total=len(CORRUPTIONS) * 5, desc="severity sweep", unit="setting") as bar:
        for name in CORRUPTIONS:
            out[name] = {}
            for severity in (1, 2, 3, 4, 5):
                images = torch.stack([to_tensor(apply_corruption(im, name, severity, seed=i)) for i, im in enumerate(clean)])
                with torch.inference_mode():
                    preds = torch.cat([model(images[s : s + request.batch_size].to(request.device)).argmax(1).cpu()
                                       for s in range(0, n, request.batch_size)])
                out[name][severity] = _accuracy((preds == labels).numpy(), len(test), request, "severity sweep")
                bar.update(1)
    return out


def evaluate_model(model, meta: dict, weights_path: Path, datamodule: BenchmarkData, request: EvalRequest,
                   train: Callable[[str], TrainRun] | None = None) -> ScoresRecord:
    """Everything about one (model, dataset): writes scores.json, predictions.parquet and plots to the request's
    output dir (resolved by rgb.evaluation.run.evaluate). `model`: any nn.Module mapping [0,1] images to logits, or
    an API model (black-box protocol only); `meta`: its model.json (run_name, dataset, ...); `train`: the model's
    training run, carried into the record, from the hash of the weights scored (None: unknown)."""
    predictor = predictor_for(model, request)
    try:
        return _evaluate(predictor, meta, weights_path, datamodule, request, train)
    finally:
        predictor.close()


def _evaluate(predictor, meta: dict, weights_path: Path, datamodule: BenchmarkData, request: EvalRequest,
              train: Callable[[str], TrainRun] | None) -> ScoresRecord:
    if meta.get("dataset") not in (None, datamodule.dataset):
        raise EvaluationError(f"the model was trained on {meta['dataset']!r}, the data config is {datamodule.dataset!r}")
    test = datamodule.split("test")
    names = test.class_names
    where = f"{meta.get('run_name', 'the model')} on {datamodule.dataset}"
    if predictor.white_box_na is None:
        check_model_fits(predictor.model, meta, test, datamodule.image_size, request.device, EvaluationError, where)
    elif meta.get("class_names", names) != names or meta.get("num_classes", len(names)) != len(names):
        raise EvaluationError(f"{where}: the model's class names are not those of the test split in "
                              f"{datamodule.source}")
    if "zeroshot" in meta:
        try:
            check_class_names(meta["zeroshot"], names)
        except PromptError as err:
            raise EvaluationError(str(err)) from err
    if predictor.white_box_na and request.severity_sweep:
        raise EvaluationError(f"severity_sweep corrupts images on the fly: not for an {predictor.white_box_na}, "
                              f"which sees only the benchmark's stored images")

    clean = predictor(test, "test")
    weights_sha256 = predictor.identity(weights_path)
    common_split = datamodule.split("common")
    common = predictor(common_split, "common")
    corruption_of = corruption_keys(common_split.rows.data.column("corruption").to_pylist()[: len(common["pred"])])
    settings = {
        "test": _accuracy(clean["pred"] == clean["label"], len(test), request, "test"),
        "common": _accuracy(common["pred"] == common["label"], len(common_split), request, "common"),
    }
    per_sample = {"test": clean["pred"] == clean["label"], "common": common["pred"] == common["label"]}
    attacks, non_standard = {}, {}
    if predictor.white_box_na is None:
        expected = AttackExpectation(weights_sha256, datamodule.dataset, split_sha256(test), datamodule.budgets,
                                     len(test), clean["pred"])
        for norm in SCORED_NORMS:
            found = read_attack(norm, request, expected)
            settings[attack_setting(norm)] = found.summary.robust if found and found.standard else None
            if found and found.standard:
                attacks[norm], per_sample[attack_setting(norm)] = found.summary, found.robust
            elif found:
                non_standard[norm] = found.summary
                log.warning("%s: %s holds a non-standard result (%s); shown beside, not in the score",
                            attack_setting(norm), budget_dir(request.attack_dir, norm), found.summary.label())
    else:
        settings.update({attack_setting(norm): None for norm in SCORED_NORMS})
    transfer = request.transfer or predictor.white_box_na is not None
    own = [meta["run_name"]] if meta.get("run_name") else []
    black_box = _black_box(predictor, datamodule, request, settings, per_sample, own) if transfer else None
    control_split = datamodule.split(CONTROL_SPLIT)  # asked last: an API model's budget goes to scored settings first
    control = predictor(control_split, CONTROL_SPLIT)
    per_sample[CONTROL_SPLIT] = control["pred"] == control["label"]
    labels = test.labels.numpy()
    record = ScoresRecord(
        model=ModelIdentity.of(meta, weights_sha256), dataset=datamodule.dataset,
        source=datamodule.source, n_test=len(test), eps=dict(datamodule.budgets),
        white_box=ProtocolScore(WHITE_BOX, settings),
        common_by_corruption={c: Accuracy.of(per_sample["common"][corruption_of == c], settings["common"].partial)
                              for c in CORRUPTIONS if (corruption_of == c).any()},
        class_wise={setting: class_wise_summary(labels[: len(flags)], flags, len(names), request.worst_k)
                    for setting, flags in per_sample.items() if len(flags)},
        attacks=attacks, non_standard=non_standard, black_box=black_box,
        severity_sweep=severity_sweep(predictor.model, datamodule, request) if request.severity_sweep else None,
        versions=result_versions(), max_images=request.max_images,
        white_box_na=predictor.white_box_na, api=predictor.usage(),
        protocol=Protocol.of(datamodule.dataset, datamodule.image_size, datamodule.budgets,
                             source=_resolved_source(datamodule.source)),
        control=_accuracy(per_sample[CONTROL_SPLIT], len(control_split), request, CONTROL_SPLIT),
        train=train(weights_sha256) if train else None,
    )
    record = replace(record, protocol=replace(record.protocol, whole_splits=not record.partial))
    n_rows = len(test) if request.max_images is None else min(request.max_images, len(test))
    return _write(record, n_rows, labels, clean, common, per_sample, predictor.columns, names, request)


def black_box_splits(datamodule: BenchmarkData) -> list[tuple[str, str]]:
    """(surrogate, split) of every transfer split the black-box protocol scores, in order; splits outside the
    card's coverage table are named and left out."""
    card = transfer_coverage(datamodule.dataset) if datamodule.dataset in DATASETS else None
    found = []
    for surrogate, splits in transfer_splits_found(datamodule).items():
        for split in splits:
            if card is not None and surrogate in card and split not in card[surrogate]:
                log.warning("%s-%s/%s is outside the card's coverage table: not scored", datamodule.dataset,
                            surrogate, split)
                continue
            found.append((surrogate, split))
    return found


def _black_box(predict_split, datamodule, request, settings, per_sample, own):
    card = transfer_coverage(datamodule.dataset) if datamodule.dataset in DATASETS else None
    transfer: dict[str, dict[str, Accuracy | None]] = {split: {} for split in TRANSFER_SPLITS}
    for surrogate, split in black_box_splits(datamodule):
        data = datamodule.split(split, surrogate)  # a broken split is an error, never skipped
        found = predict_split(data, f"{surrogate}/{split}")
        flags = found["pred"] == found["label"]
        transfer[split][surrogate] = _accuracy(flags, len(data), request, f"{surrogate}/{split}")  # None: not asked
        per_sample[f"{surrogate}/{split}"] = flags
    return black_box_score(settings["test"], settings["common"], transfer, card, own)


def request_plan(model, datamodule: BenchmarkData, request: EvalRequest) -> dict:
    """dry_run: what the black-box evaluation of an API model would ask per split (after the cache and the images
    already asked for an earlier split), its tokens estimated without a tokenizer (ChatClassifier.estimate) and,
    when the model is priced, its money. Asks nothing."""
    cache = AnswerCache(cache_path(request.api_cache_dir, model))
    price = model_price(model.client_settings.price, model.settings.api_model, request.prices)
    splits = [("test", None), ("common", None)] + [(split, surrogate) for surrogate, split in black_box_splits(datamodule)]
    splits.append((CONTROL_SPLIT, None))  # asked last by the evaluation, as here
    asked: set[str] = set()
    rows, images, answered_by_cache = {}, 0, 0
    for split, surrogate in splits:
        data = datamodule.split(split, surrogate)
        n = len(data) if request.max_images is None else min(request.max_images, len(data))
        found = split_images(data, n)
        cached, todo = model.plan(found, cache)
        first = {model.request_key(b): b for b in reversed(found)}
        todo = [k for k in todo if k not in asked]
        asked.update(todo)
        estimates = [model.estimate(first[k]) for k in todo]
        prompt, completion = sum(e[0] for e in estimates), sum(e[1] for e in estimates)
        rows[split if surrogate is None else f"{surrogate}/{split}"] = {
            "images": n, "answered_by_cache": cached, "requests": len(todo), "prompt_tokens": prompt,
            "completion_tokens": completion, "usd": None if price is None else price.cost(prompt, completion)}
        images, answered_by_cache = images + n, answered_by_cache + cached
    total = {k: sum(r[k] for r in rows.values()) for k in ("requests", "prompt_tokens", "completion_tokens")}
    return {"api_model": model.settings.api_model, "price": None if price is None else asdict(price),
            "images": images, "answered_by_cache": answered_by_cache,
            "duplicates": images - answered_by_cache - total["requests"], "splits": rows, **total,
            "usd": None if price is None else price.cost(total["prompt_tokens"], total["completion_tokens"])}


def plan_table(plan: dict) -> str:
    """dry_run's table: per split the requests still to ask, their estimated tokens and money."""
    lines = [f"{'split':24s} {'images':>7s} {'cached':>7s} {'requests':>9s} {'prompt tok':>11s} {'compl. tok':>11s} "
             f"{'USD':>9s}"]
    for name, row in [*plan["splits"].items(), ("total", plan)]:
        usd = "?" if row["usd"] is None else f"{row['usd']:.4f}"
        lines.append(f"{name:24s} {row['images']:>7d} {row['answered_by_cache']:>7d} {row['requests']:>9d} "
                     f"{row['prompt_tokens']:>11d} {row['completion_tokens']:>11d} {usd:>9s}")
    return "\n".join(lines)


def _pad(values, n: int) -> pa.Array:
    """A column of n rows: the values of an answered prefix, then nulls (max_requests)."""
    values = list(values)
    return pa.array(values + [None] * (n - len(values)))


def _write(record: ScoresRecord, n_rows: int, labels, clean, common, per_sample, extra: dict, names,
           request: EvalRequest) -> ScoresRecord:
    """scores.json, predictions and plots in out_dir; a PARTIAL record's in out_dir/partial/ (its scores file
    named scores.partial.json), so a complete record already there is kept and a pool never collects it."""
    out = record.folder(request.model.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    columns = {"image_id": np.arange(n_rows), "label": labels[:n_rows], "pred_test": _pad(clean["pred"], n_rows),
               "pred_common": _pad(common["pred"], n_rows)}
    columns.update({f"correct_{k.replace('/', '_')}": _pad(v, n_rows) for k, v in per_sample.items()
                    if len(v) <= n_rows})
    columns.update({name: _pad(values, n_rows) for name, values in extra.items()})
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    atomic_write_bytes(out / "predictions.parquet", sink.getvalue().to_pybytes())
    figures = plots.record_figures(record, names, out)
    record = replace(record, plots=[p.name for p in figures])
    record.save(out / record.file_name)
    return record


def partial_reason(record: ScoresRecord) -> str:
    """What made a PARTIAL record partial: max_images, an API run's request/token/cost cap, or both."""
    reasons = [f"the first {record.max_images} images of each split"] if record.max_images is not None else []
    if record.api is not None and record.api.partial:
        reasons.append(record.api.waiting())
    return "; ".join(reasons)


def format_table(record: ScoresRecord) -> str:
    """The five-setting table of one record, with counts, as printed by evaluate.py and `make demo`; results
    that are not the protocol's (another version, precision or attack subset) follow, labelled, never scored.
    An API model's white-box settings are n/a; its nine black-box settings follow with their abstentions."""
    na = record.not_applicable(WHITE_BOX)
    part = f"; PARTIAL: {partial_reason(record)}" if record.partial else ""
    lines = [f"{record.model.run_name} on {record.dataset} (test n={record.n_test}{part})",
             f"{'setting':18s} {'accuracy':>9s} {'correct/total':>15s}"]
    for name, acc in record.white_box.settings.items():
        if acc is None:
            lines.append(f"{name:18s} {na if na and name in ATTACK_SETTING_NORMS else 'missing':>9s}")
            continue
        mark = " PARTIAL" if acc.partial else ""
        norm = ATTACK_SETTING_NORMS.get(name)
        attack = record.attacks.get(norm.key) if norm else None
        label = attack.label() if attack else ""
        mark += f" [{label}]" if label else ""
        lines.append(f"{name:18s} {acc.value:9.4f} {acc.correct:>7d}/{acc.total:<7d}{mark}")
    if record.control is not None:
        acc = record.control
        lines.append(f"{CONTROL_SPLIT:18s} {acc.value:9.4f} {acc.correct:>7d}/{acc.total:<7d}"
                     f"{' PARTIAL' if acc.partial else ''} [control: uniform noise, never in a score]")
    lines.append(f"{'score':18s} {na or _score_text(record, WHITE_BOX)}")
    differences = record.differences_for(WHITE_BOX)
    if differences and not na:
        lines.append(f"{'protocol':18s} not the card's ({'; '.join(differences)}): shown apart, never in a Sum "
                     f"or Borda of card entries")
    for norm, attack in record.non_standard.items():
        acc = attack.robust
        lines.append(f"{attack_setting(norm):18s} {acc.value:9.4f} {acc.correct:>7d}/{acc.total:<7d} "
                     f"[non-standard: {attack.label()}; not in the score]")
    if record.black_box is not None and record.api is not None:
        lines += _black_box_lines(record)
    if record.black_box is not None:
        lines.append(f"{'black-box score':18s} {_score_text(record, BLACK_BOX)}")
        differences = record.differences_for(BLACK_BOX)
        if differences:
            lines.append(f"{'black-box protocol':18s} not the card's ({'; '.join(differences)})")
    return "\n".join(lines)


def _score_text(record: ScoresRecord, protocol: str) -> str:
    """A protocol's score line: its `describe()` under the card's protocol; under another one no score, only the
    sum over the settings measured, said to be another protocol's."""
    score = record.score_under(protocol)
    if not record.differences_for(protocol):
        return score.describe()
    return (f"none: {OTHER_PROTOCOL} (sum {score.partial_sum:.4f} over {score.covered} of {score.max} settings, "
            f"not comparable with the card's)")


def _black_box_lines(record: ScoresRecord) -> list[str]:
    """The black-box settings of an API model with what each cost: requests sent, cached, retried, and the answers
    read as no class (unparsed: counted wrong, shown apart with their rate)."""
    bb, per_split = record.black_box, record.api.per_split
    lines = [f"{'black-box setting':18s} {'accuracy':>9s} {'correct/total':>15s} {'unparsed':>9s} {'sent':>6s} "
             f"{'cached':>6s} {'retried':>7s}  surrogate"]
    for name in bb.names:
        acc, surrogate = bb.settings.get(name), bb.strongest_surrogate.get(name)
        counts = per_split.get(name if surrogate is None else f"{surrogate}/{name}")
        if acc is None:
            unasked = bb.not_asked.get(name) or (counts is not None and counts.unanswered)
            lines.append(f"{name:18s} {'not asked yet' if unasked else 'missing':>9s}")
            continue
        cells = (f"{counts.unparsed:>9d} {counts.requests:>6d} {counts.cached:>6d} {counts.retries:>7d}"
                 if counts else f"{'':>9s} {'':>6s} {'':>6s} {'':>7s}")
        lines.append(f"{name:18s} {acc.value:9.4f} {acc.correct:>7d}/{acc.total:<7d} {cells}  {surrogate or ''}"
                     f"{' PARTIAL' if acc.partial else ''}")
    total = record.api.total
    lines.append(f"{'api requests':18s} {int(total['requests'])} sent, {int(total['cached'])} cached, "
                 f"{int(total['retries'])} retried, {record.api.unparsed_line()}, "
                 f"{int(total['prompt_tokens'])}+{int(total['completion_tokens'])} tokens new, "
                 f"{int(total['cached_prompt_tokens'])}+{int(total['cached_completion_tokens'])} cached"
                 + ("" if record.api.spent is None else f", ${record.api.spent:.4f} spent (list price "
                                                         f"${record.api.list_cost:.4f})")
                 + (f"; {int(total['answered_in_text'])} asked in text (the endpoint refused response_format)"
                    if total["answered_in_text"] else "")
                 + (f"; {int(total['clarified'])} asked to clarify" if total["clarified"] else "")
                 + (f"; PARTIAL: {record.api.waiting()}; re-run to continue" if record.api.partial else ""))
    return lines


__all__ = ["AttackExpectation", "EvaluationError", "evaluate_model", "format_table", "partial_reason",
           "read_attack"]
