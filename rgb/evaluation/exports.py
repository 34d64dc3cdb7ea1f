"""Exports for other boards: a record in the formats their communities submit, beside rgb's own model_info.

- RobustBench (github.com/RobustBench/robustbench, `model_info/<dataset>/<threat model>/<model>.json`, read by
  its `robustbench/leaderboard/template.py` and `robustbench.utils`): one file per (model, dataset, norm) that
  has a clean and an AutoAttack number; accuracies in % as strings with 2 decimals, eps as the paper writes it
  ("4/255", "0.5"), paper fields from the model card (RobustBench's conventions where the card is silent: venue
  "N/A", authors ""). rgb also writes L1, a norm RobustBench has no board for yet.
- CLIP_benchmark (github.com/LAION-AI/CLIP_benchmark, the JSON `clip_benchmark eval` dumps and `clip_benchmark
  build` reads): one file per zero-shot (model, dataset), metrics as fractions. `acc5` is left out: a record keeps
  whether each image's top-1 answer was right, not its top 5.

A PARTIAL record (a setting over part of its split) is never exported; a record under another protocol than the
card's is exported with what differs in RobustBench's `footnote` (the board shows it under the name) and not to
CLIP_benchmark (no field to say so). What was not exported, and why, is listed in exports.json.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rgb.core.files import atomic_write_json, safe_name
from rgb.core.threat import NORMS
from rgb.data.catalog import WHITE_BOX
from rgb.data.protocol import budget_text
from rgb.evaluation.records import CLEAN_SETTING, ScoresRecord, attack_setting, percent_text
from rgb.evaluation.scores import OTHER_PROTOCOL, record_sum
from rgb.zeroshot import ZEROSHOT

MODEL_INFO_DIR = "model_info"
CLIP_BENCHMARK_DIR = "clip_benchmark"
MANIFEST = "exports.json"
ZEROSHOT_TASK = "zeroshot_classification"  # CLIP_benchmark's task name
PROMPT_LANGUAGE = "en"  # the language of rgb's prompt templates (CLIP_benchmark's `language`)


def export_refusal(record: ScoresRecord) -> str | None:
    """Why no setting of `record` may be exported (None: it may): a PARTIAL record is no board entry."""
    if record.white_box_na:
        return f"white-box settings n/a ({record.white_box_na})"
    status = record_sum(record, WHITE_BOX).status
    return f"{status}: scored over part of a split" if status == "PARTIAL" else None


def robustbench_entries(record: ScoresRecord) -> tuple[dict[str, dict], list[str]]:
    """RobustBench model_info records of `record` by threat model ("Linf", "L2", "L1"), and the norms left out
    with the reason."""
    refusal = export_refusal(record)
    if refusal:
        return {}, [refusal]
    settings = record.white_box.settings
    if settings.get(CLEAN_SETTING) is None:
        return {}, ["no clean test accuracy"]
    status = record_sum(record, WHITE_BOX)
    card = record.train.card if record.train else {}
    # what the run started from, when it started from something (`pretrained: false` is a model trained from scratch)
    pretraining = {k: v for k, v in (record.train.pretraining if record.train else {}).items() if v is not False}
    notes = [f"Not RobustGenBench's card protocol ({status.protocol_label()})."] if not status.card_protocol else []
    if "additional_data" not in card:
        notes.append(f"Extra data from its pretraining ({', '.join(f'{k} {v}' for k, v in pretraining.items())})."
                     if pretraining else "Extra data not stated in a model card.")
    entries, skipped = {}, []
    for norm in NORMS:
        robust = settings.get(attack_setting(norm))
        if robust is None:
            skipped.append(f"{norm.value}: no AutoAttack number")
            continue
        attack = record.attacks.get(norm.key)
        evaluated = (f"Evaluated by RobustGenBench: AutoAttack standard ({attack.impl} {attack.impl_version}), "
                     f"{robust.total} test images." if attack else f"Evaluated by RobustGenBench on {robust.total} "
                                                                   f"test images.")
        entries[norm.value] = {
            "link": card.get("url", ""),
            "name": card.get("title", record.model.run_name),
            "authors": card.get("authors", ""),
            "additional_data": card.get("additional_data", bool(pretraining)),
            "number_forward_passes": 1,
            "dataset": record.dataset,
            "venue": card.get("venue", "N/A"),
            "architecture": record.model.name or record.model.family or "",
            "eps": budget_text(norm, record.protocol.budgets[norm.key]),
            "clean_acc": percent_text(settings[CLEAN_SETTING].value),
            "reported": percent_text(robust.value),  # no paper number in the card: the measured one
            "autoattack_acc": percent_text(robust.value),
            "footnote": " ".join([*notes, evaluated]),
            "unreliable": False,
        }
    return entries, skipped


def clip_benchmark_result(record: ScoresRecord) -> tuple[dict | None, str | None]:
    """The CLIP_benchmark result of a zero-shot record (None and why not otherwise)."""
    if record.model.strategy != ZEROSHOT:
        return None, None
    refusal = export_refusal(record)
    test = record.white_box.settings.get(CLEAN_SETTING)
    if refusal or test is None:
        return None, refusal or "no clean test accuracy"
    if record.protocol.input_differences():
        return None, f"{OTHER_PROTOCOL}: {'; '.join(record.protocol.input_differences())}"
    pretraining = record.train.pretraining if record.train else {}
    metrics = {"acc1": test.value}
    if CLEAN_SETTING in record.class_wise:
        metrics["mean_per_class_recall"] = record.class_wise[CLEAN_SETTING].mean  # over the classes in the split
    return {
        "dataset": record.dataset,
        "model": record.model.name or "",
        "pretrained": str(pretraining.get("pretrained") or pretraining.get("pretrained_tag")
                          or pretraining.get("weights") or ""),
        "task": ZEROSHOT_TASK,
        "metrics": metrics,
        "language": PROMPT_LANGUAGE,
    }, None


def clip_benchmark_file_name(result: dict) -> str:
    """CLIP_benchmark's default output name, `{dataset}_{pretrained}_{model}_{language}_{task}.json`, each part a
    safe file name (a hf-hub: tag holds slashes)."""
    parts = (result["dataset"], result["pretrained"], result["model"], result["language"], result["task"])
    return "_".join(map(safe_name, parts)) + ".json"


def write_exports(records: Iterable[ScoresRecord], out_dir: Path) -> dict:
    """RobustBench's model_info files under `out_dir/model_info/<dataset>/<norm>/`, CLIP_benchmark's under
    `out_dir/clip_benchmark/<model>/`, and exports.json listing what was written and what was not (and why)."""
    manifest: dict[str, list[str]] = {"robustbench": [], "clip_benchmark": [], "not_exported": []}

    def write(path: Path, data: dict) -> str:
        (out_dir / path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out_dir / path, data)
        return path.as_posix()

    for record in records:
        name = record.model.run_name or "?"
        entries, skipped = robustbench_entries(record)
        for threat_model, entry in entries.items():
            manifest["robustbench"].append(
                write(Path(MODEL_INFO_DIR) / record.dataset / threat_model / f"{safe_name(name)}.json", entry))
        manifest["not_exported"] += [f"RobustBench {name}@{record.dataset}: {why}" for why in skipped]
        result, why = clip_benchmark_result(record)
        if result:
            manifest["clip_benchmark"].append(
                write(Path(CLIP_BENCHMARK_DIR) / safe_name(name) / clip_benchmark_file_name(result), result))
        elif why:
            manifest["not_exported"].append(f"CLIP_benchmark {name}@{record.dataset}: {why}")
    write(Path(MANIFEST), manifest)
    return manifest


__all__ = ["CLIP_BENCHMARK_DIR", "MANIFEST", "MODEL_INFO_DIR", "clip_benchmark_result", "robustbench_entries",
           "write_exports"]
