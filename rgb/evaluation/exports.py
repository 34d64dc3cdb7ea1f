"""Exports for other boards: a record in the formats their communities submit, beside rgb's own model_info.

- RobustBench (github.com/RobustBench/robustbench, `model_info/<dataset>/<threat model>/<stem>.json`, read by
  `robustbench.utils` where its enums know the dataset and threat model): one file per (model, dataset, norm)
  that has a clean and an AutoAttack number; accuracies in % as strings with 2 decimals, eps as the paper writes
  it ("4/255", "0.5"), paper fields from the model card (RobustBench's conventions where the card is silent:
  venue "N/A", authors ""). The stem has no `_` (RobustBench's model id is the stem before the first one). rgb
  also writes L1, a norm RobustBench has no board for yet, and beside each folder's files `index.html`, the folder
  as RobustBench's board lays it out (its own renderer takes only its enums' datasets).
- CLIP_benchmark (github.com/LAION-AI/CLIP_benchmark, the JSON `clip_benchmark eval` dumps and `clip_benchmark
  build <folder>` reads from the folder's top level): one file per zero-shot (model, dataset), flat in
  `clip_benchmark/`, metrics as fractions, `pretrained` never empty. `acc5` is left out: a record keeps whether
  each image's top-1 answer was right, not its top 5.

Every file is named by rgb.core.files.distinct_name and claimed before any is written (DistinctFiles).
A PARTIAL record (a setting over part of its split) is never exported; a record under another protocol than the
card's is exported with what differs in RobustBench's `footnote` (the board shows it under the name) and not to
CLIP_benchmark (no field to say so). What was not exported, and why, is listed in exports.json.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from rgb.core.files import DistinctFiles, atomic_write_bytes, atomic_write_json, distinct_name
from rgb.core.threat import NORMS
from rgb.core.values import shown_name
from rgb.data.catalog import WHITE_BOX
from rgb.data.protocol import budget_text
from rgb.evaluation.records import CLEAN_SETTING, ScoresRecord, attack_setting, percent_text
from rgb.evaluation.scores import OTHER_PROTOCOL, record_sum
from rgb.zeroshot import ZEROSHOT

MODEL_INFO_DIR = "model_info"
CLIP_BENCHMARK_DIR = "clip_benchmark"
MANIFEST = "exports.json"
ROBUSTBENCH_BOARD = "index.html"  # beside each RobustBench folder's files: its board
TEMPLATES = Path(__file__).with_name("site_templates")  # package data: the pages' templates and assets
ROBUSTBENCH_BOARD_TEMPLATE = "robustbench_board.html.j2"
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


def clip_benchmark_pretrained(record: ScoresRecord) -> str:
    """CLIP_benchmark's `pretrained` of a zero-shot record: the open_clip tag of the weights it scored unchanged,
    else `rgb-<the first 8 hex digits of the weights' sha256>` (rgb's own weights: the embedded CLIP, a local
    checkpoint); never "" (`clip_benchmark build` names a row `model + " " + pretrained`)."""
    pretraining = record.train.pretraining if record.train else {}
    tag = pretraining.get("pretrained_tag") or pretraining.get("pretrained")
    if "weights" not in pretraining and isinstance(tag, str) and tag:
        return tag
    return f"rgb-{record.model.weights_sha256[:8]}"


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
    metrics = {"acc1": test.value}
    if CLEAN_SETTING in record.class_wise:
        metrics["mean_per_class_recall"] = record.class_wise[CLEAN_SETTING].mean  # over the classes in the split
    return {
        "dataset": record.dataset,
        "model": record.model.name or record.model.run_name or "",
        "pretrained": clip_benchmark_pretrained(record),
        "task": ZEROSHOT_TASK,
        "metrics": metrics,
        "language": PROMPT_LANGUAGE,
    }, None


def templates() -> jinja2.Environment:
    """The Jinja2 templates of the pages rgb writes (package data: the site's and RobustBench's boards)."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def robustbench_board(dataset: str, threat_model: str, entries: Iterable[dict]) -> str:
    """The board of one RobustBench folder (`model_info/<dataset>/<threat model>/index.html`): the columns and
    order of RobustBench's own leaderboard.html.j2 (its `generate_leaderboard` renders only the datasets and threat
    models of its enums, and its wheel lacks that template), best AutoAttack accuracy first."""
    rows = sorted(entries, key=lambda e: -float(e.get("external") or e["autoattack_acc"]))
    template = templates().get_template(ROBUSTBENCH_BOARD_TEMPLATE)
    return template.render(dataset=dataset, threat_model=threat_model, models=rows)


@dataclass
class ExportPlan:
    """What a pool exports, planned whole before anything is written (a name clash stops it with nothing
    written): JSON files and RobustBench boards by their path under the output dir, and exports.json."""

    files: dict[str, dict] = field(default_factory=dict)
    boards: dict[str, str] = field(default_factory=dict)
    manifest: dict[str, list[str]] = field(default_factory=lambda: {
        "robustbench": [], "robustbench_boards": [], "clip_benchmark": [], "not_exported": []})

    def write(self, out_dir: Path) -> dict:
        for path, data in self.files.items():
            (out_dir / path).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out_dir / path, data)
        for path, html in self.boards.items():
            atomic_write_bytes(out_dir / path, html.encode())
        atomic_write_json(out_dir / MANIFEST, self.manifest)
        return self.manifest


def plan_exports(records: Iterable[ScoresRecord], names: DistinctFiles | None = None) -> ExportPlan:
    """RobustBench's model_info files `model_info/<dataset>/<norm>/<stem>.json` (a stem without `_`, which
    RobustBench's readers take as the end of the model id) and a board beside them, CLIP_benchmark's files flat in
    `clip_benchmark/`, each named by distinct_name and claimed in `names` (the output tree's other files)."""
    names = names or DistinctFiles()
    plan = ExportPlan()
    folders: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        name = record.model.run_name or "?"
        owner = f"model {shown_name(name)} on {record.dataset}"
        entries, skipped = robustbench_entries(record)
        for threat_model, entry in entries.items():
            path = names.claim(f"{MODEL_INFO_DIR}/{record.dataset}/{threat_model}/{distinct_name(name)}.json", owner)
            plan.files[path] = entry
            plan.manifest["robustbench"].append(path)
            folders.setdefault((record.dataset, threat_model), []).append(entry)
        plan.manifest["not_exported"] += [f"RobustBench {name}@{record.dataset}: {why}" for why in skipped]
        result, why = clip_benchmark_result(record)
        if result:
            parts = (result["dataset"], result["pretrained"], result["model"], result["language"], result["task"])
            path = names.claim(f"{CLIP_BENCHMARK_DIR}/{distinct_name(*parts, name)}.json", owner)
            plan.files[path] = result
            plan.manifest["clip_benchmark"].append(path)
        elif why:
            plan.manifest["not_exported"].append(f"CLIP_benchmark {name}@{record.dataset}: {why}")
    for (dataset, threat_model), entries in sorted(folders.items()):
        path = names.claim(f"{MODEL_INFO_DIR}/{dataset}/{threat_model}/{ROBUSTBENCH_BOARD}", "RobustBench's board")
        plan.boards[path] = robustbench_board(dataset, threat_model, entries)
        plan.manifest["robustbench_boards"].append(path)
    return plan


__all__ = ["CLIP_BENCHMARK_DIR", "MANIFEST", "MODEL_INFO_DIR", "ROBUSTBENCH_BOARD", "ExportPlan",
           "clip_benchmark_pretrained", "clip_benchmark_result", "plan_exports", "robustbench_board",
           "robustbench_entries", "templates"]
