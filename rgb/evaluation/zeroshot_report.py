"""evaluate.py's `zeroshot_report=true`: the CPE seed's Table 2 for one zero-shot run: every prompt ensemble side
by side (overall accuracy, worst@k for the configured `worst_k`, HM, GM on the test split) and each template's
weight and kept flag; with `pool=[...]`, the rows averaged over the runs' datasets as the seed's Table 2 does.

Rows: `clip (class names)` (template `{}`: the seed's CLIP baseline), `single` (the run's single template), one
per ensemble labelled by what ran (`mean`, `zpe (test debias)`, `zpe (median+2*MAD, ...)`, `cpe (weights)`), and
with a descriptions file `descriptor` (Menon & Vondrick: every described class, single template) and
`cpe (+descriptions)` (CPE's weights, its worst classes by pseudo-Cmm described). A last row scores the exported
head itself. The header names the unlabelled split the weights came from, CPE's Cmm units and the ZPE variant.

Everything is rebuilt from the run itself: its image tower gives the test features and the unlabelled features
(the split its prompts config named, never its labels), its CLIP text tower the text features of its recorded
templates and class names (cached like the training run's, so usually read from disk), its record the logit scale,
k, tau, Cmm units, ZPE's t and pretraining features, and the single template. `rgb.zeroshot.comparison_table` does
the rest. Outputs under `<output_dir>/zeroshot_report/`: comparison.md, ensembles.csv, templates.csv,
comparison.json; the pool's average under `zeroshot_report_options.pool_dir`.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rgb.core import atomic_write_bytes, atomic_write_json, file_sha256
from rgb.core.classwise import DEFAULT_WORST_K, check_worst_k
from rgb.core.configs import describe_data_config
from rgb.evaluation.leaderboard import markdown_table
from rgb.evaluation.model_eval import EvaluationError, zeroshot_record
from rgb.evaluation.request import RunOutputs
from rgb.runs.store import ZEROSHOT_REPORT_DIR
from rgb.models import export_paths, load_with_meta, register_architecture
from rgb.models.openclip import load_clip_of
from rgb.zeroshot import (
    ENSEMBLES,
    EnsembleError,
    PromptError,
    TextFeatureCache,
    average_rows,
    check_class_names,
    comparison_table,
    features_of,
    head_row,
    load_descriptions,
    row_metrics,
)
from rgb.zeroshot.ensembles import cmm_scale, ensemble_label, ensemble_weights
from rgb.zeroshot.settings import CMM_UNITS
from rgb.zeroshot.head import describe_classes, described_label, enrich_worst_classes, load_pretraining_features

log = logging.getLogger(__name__)

# What needs a zero-shot run, as the refusal of another model says (rgb.evaluation.model_eval.zeroshot_record).
REPORT = "zeroshot_report=true (comparing the prompt ensembles)"
EXPORTED = "exported"  # the row of the run's own head, as model.safetensors holds it
CLASS_NAMES = "clip (class names)"  # the seed's CLIP row: the class name alone (template `{}`)
DESCRIPTOR = "descriptor"


@dataclass(frozen=True)
class ZeroShotReportOptions:
    """The `zeroshot_report_options` block of conf/evaluate.yaml (and evaluate's `worst_k`; rgb.commands.zeroshot_report
    reads them); None: the run's own."""

    ensembles: tuple[str, ...]
    unlabelled_split: str | None  # None: the split the run's prompts config named
    cache_dir: Path | None
    device: str = "cpu"
    worst_k: tuple = DEFAULT_WORST_K
    cmm_units: str | None = None
    mad_t: float | None = None
    zpe_pretraining_features: Path | None = None
    descriptions: Path | None = None
    pool_dir: Path | None = None

    def __post_init__(self):
        unknown = [m for m in self.ensembles if m not in ENSEMBLES]
        if unknown or not self.ensembles:
            raise EvaluationError(f"zeroshot_report_options.ensembles: unknown or none ({', '.join(unknown)}); "
                                  f"choose from {', '.join(ENSEMBLES)}")
        if self.cmm_units is not None and self.cmm_units not in CMM_UNITS:
            raise EvaluationError(f"zeroshot_report_options.cmm_units: {self.cmm_units!r} is none of "
                                  f"{', '.join(CMM_UNITS)}")
        try:
            check_worst_k(self.worst_k)
        except ValueError as error:
            raise EvaluationError(f"worst_k: {error}") from None


def _csv(rows: list[dict]) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def _cell(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def report_markdown(title: str, header: list[str], rows: list[dict], templates: list[str]) -> str:
    """The ensembles table (metrics, kept count), then one row per template: weight and kept flag per ensemble.
    `header` lines (what the weights came from, Cmm units, ZPE variant) go between the title and the table."""
    weighted = [r for r in rows if r["templates"]]
    metrics = [row_metrics(r) for r in rows]
    columns = list(metrics[0])
    table_header = ["ensemble", *columns, "templates kept"]
    lines = [f"# Zero-shot prompt ensembles: {title}", "", *(f"- {line}" for line in header), ""]
    lines += markdown_table(table_header, [[r["ensemble"], *(_cell(m[c]) for c in columns),
                                            f"{sum(t['kept'] for t in r['templates'])}/{len(r['templates'])}"
                                            if r["templates"] else ""] for r, m in zip(rows, metrics)],
                            ["---"] + ["---:"] * (len(table_header) - 1))
    lines += ["", "worst@k: n/a where the split has fewer classes than k.", "",
              "## Template weights (* = kept)", ""]
    table_header = ["template", *(r["ensemble"] for r in weighted)]
    body = [[f"`{template}`", *(f"{r['templates'][i]['weight']:.4f}{'*' if r['templates'][i]['kept'] else ''}"
                                for r in weighted)] for i, template in enumerate(templates)]
    lines += markdown_table(table_header, body, ["---"] + ["---:"] * len(weighted))
    return "\n".join(lines) + "\n"


def _run_params(record: dict, options: ZeroShotReportOptions) -> tuple[dict, dict | None]:
    """The ensemble parameters the report uses (the run's, or the options' where given) and the pretraining
    feature file's record (None: no pretraining term)."""
    params = record["params"]
    pretraining_path = options.zpe_pretraining_features
    recorded = params.get("zpe_pretraining_features")
    if pretraining_path is None and recorded is not None:
        pretraining_path = Path(recorded["file"])
    pretraining, pretraining_record = None, None
    if pretraining_path is not None:
        pretraining, digest = load_pretraining_features(pretraining_path)
        if pretraining_path == options.zpe_pretraining_features or recorded is None or recorded["sha256"] == digest:
            pretraining_record = {"file": str(pretraining_path), "sha256": digest, "images": len(pretraining)}
        else:
            raise EvaluationError(f"the zpe pretraining features file {pretraining_path} changed since the run "
                                  "used it (another sha256); name the file to use in "
                                  "zeroshot_report_options.zpe_pretraining_features")
    return {"logit_scale": record["logit_scale"], "k": params["k"], "tau": params["tau"],
            "cmm_units": options.cmm_units or params.get("cmm_units", "logit"),
            "mad_t": params.get("mad_t", 2.0) if options.mad_t is None else options.mad_t,
            "pretraining_features": pretraining}, pretraining_record


def _single_template(record: dict) -> str:
    """The run's single template (older records name it only by its index in the pool)."""
    recorded = record["params"].get("single_template")
    if recorded is not None:
        return recorded
    index = record.get("single_template_index")
    return "a photo of a {}." if index is None else record["templates"][index]["template"]


def zeroshot_report(model, meta: dict, weights_path: Path, datamodule, options: ZeroShotReportOptions,
                    out_dir: Path) -> dict:
    """Every row of the module docstring for one zero-shot run on its dataset's test split; writes the report files
    under out_dir/zeroshot_report and returns the JSON record."""
    run_name = str(meta.get("run_name", Path(weights_path).parent.name))
    record = zeroshot_record(meta, Path(weights_path).parent, REPORT)
    if meta.get("dataset") not in (None, datamodule.dataset):
        raise EvaluationError(f"{run_name} was made for dataset {meta['dataset']!r}, the data config is "
                              f"{datamodule.dataset!r}")
    test = datamodule.split("test")
    unlabelled_split = options.unlabelled_split or record["params"]["split"]
    descriptions_path = options.descriptions or record["params"].get("descriptions")
    timings, started = {}, time.perf_counter()
    try:
        check_class_names(record, test.class_names)
        params, pretraining_record = _run_params(record, options)
        names = record["class_names"]
        descriptions = load_descriptions(descriptions_path, names) if descriptions_path else None
        model = model.to(options.device).eval()
        test_features = features_of(model, datamodule.eval_dataloader("test"), options.device)
        unlabelled = (test_features if unlabelled_split == "test"
                      else features_of(model, datamodule.eval_dataloader(unlabelled_split), options.device))
        timings["image_features_s"] = time.perf_counter() - started
        started = time.perf_counter()
        register_architecture(model.recipe["name"], model.recipe["open_clip_config"])
        cache = TextFeatureCache(load_clip_of(model), options.cache_dir, options.device)
        templates = [t["template"] for t in record["templates"]]
        text = cache.prompt_features(templates, names)
        single_template = _single_template(record)
        single = cache.prompt_features([single_template], names)
        heads = {CLASS_NAMES: cache.prompt_features(["{}"], names)[0]}
        if "single" in options.ensembles:
            heads["single"] = single[0]
        if descriptions:
            heads[DESCRIPTOR] = describe_classes(cache, single, [single_template], names, descriptions,
                                                 [c for c in names if c in descriptions])[0]
        timings["text_features_s"] = time.perf_counter() - started
        methods = [m for m in options.ensembles if m != "single"]
        rows = comparison_table(test_features, test.labels, text, templates, unlabelled_features=unlabelled,
                                methods=methods, worst_k=options.worst_k, heads=heads, template_index=None,
                                **params)
        if descriptions and "cpe" in methods:
            weights, kept = ensemble_weights(unlabelled, text, "cpe", template_index=None, **params)
            head, *_ = enrich_worst_classes(cache, unlabelled, text, templates, names, weights, kept, "cpe",
                                            descriptions, int(record["params"].get("enrich_worst", 10)),
                                            cmm_scale(params["logit_scale"], params["cmm_units"]))
            rows.append(head_row(described_label(ensemble_label("cpe", **params)), head, test_features,
                                 test.labels, options.worst_k, templates, weights, kept))
    except (PromptError, EnsembleError) as error:
        raise EvaluationError(str(error)) from error
    exported = model.classifier.weight.detach().float().cpu()
    bias = model.classifier.bias.detach().float().cpu()
    rows.append(head_row(f"{EXPORTED} ({record.get('label') or record['ensemble']})", exported, test_features,
                         test.labels, options.worst_k, bias=bias))

    zpe_variants = [r["ensemble"] for r in rows if r["ensemble"].startswith("zpe")]
    header = [f"ensemble weights from {len(unlabelled)} unlabelled `{unlabelled_split}` images (labels never read)",
              f"cpe: Cmm in {params['cmm_units']} units, k = {params['k']}, tau = {params['tau']}, weights from "
              f"the `{unlabelled_split}` split",
              f"zpe variants: {', '.join(zpe_variants) or 'none'}"
              + (f"; pretraining features {pretraining_record['file']} ({pretraining_record['images']} images)"
                 if pretraining_record else ""),
              f"run's own head: {record.get('label') or record['ensemble']}"
              + (f"; descriptions {descriptions_path}" if descriptions_path else "")]
    out = Path(out_dir) / ZEROSHOT_REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "model": run_name, "weights_sha256": file_sha256(weights_path), "dataset": datamodule.dataset,
        "split": "test", "n_images": len(test), "unlabelled_split": unlabelled_split,
        "unlabelled_images": len(unlabelled), "run_ensemble": record["ensemble"],
        "run_label": record.get("label") or record["ensemble"],
        "enriched_classes": record.get("enriched_classes", []), "logit_scale": record["logit_scale"],
        "k": params["k"], "tau": params["tau"], "cmm_units": params["cmm_units"], "cpe_weights_split": unlabelled_split,
        "mad_t": params["mad_t"], "zpe_variants": zpe_variants, "zpe_pretraining_features": pretraining_record,
        "descriptions": None if descriptions_path is None else str(descriptions_path),
        "worst_k": [str(k) for k in options.worst_k], "texts_encoded": cache.computed,
        "header": header, "rows": [{**r, "class_wise": r["class_wise"].to_json()} for r in rows],
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    markdown = report_markdown(f"{run_name} on {datamodule.dataset}/test ({len(test)} images)", header, rows,
                               templates)
    atomic_write_bytes(out / "comparison.md", markdown.encode())
    atomic_write_bytes(out / "ensembles.csv", _csv([{"ensemble": r["ensemble"], **row_metrics(r),
                                                     "templates_kept": sum(t["kept"] for t in r["templates"])}
                                                    for r in rows]))
    atomic_write_bytes(out / "templates.csv", _csv([{"ensemble": r["ensemble"], **t}
                                                    for r in rows for t in r["templates"]]))
    atomic_write_json(out / "comparison.json", result)
    log.info("%s", markdown.rstrip("\n"))
    log.info("zero-shot report in %s", out)
    return result


def pool_markdown(reports: list[dict], rows: list[dict]) -> str:
    """The rows averaged over the reports' datasets, and what each dataset's report was."""
    columns = [c for c in rows[0] if c not in ("ensemble", "datasets")]
    lines = [f"# Zero-shot prompt ensembles averaged over {len(reports)} reports", ""]
    lines += [f"- {r['model']} on {r['dataset']}: weights from {r['unlabelled_images']} `{r['unlabelled_split']}` "
              f"images, Cmm in {r['cmm_units']} units" for r in reports]
    lines += ["", *markdown_table(["ensemble", *columns, "datasets"],
                                  [[r["ensemble"], *(_cell(r[c]) for c in columns), f"{r['datasets']}/{len(reports)}"]
                                   for r in rows], ["---"] + ["---:"] * (len(columns) + 1))]
    lines += ["", "n/a: a row missing from a report, or a worst@k some dataset has fewer classes for."]
    return "\n".join(lines) + "\n"


def write_pool(reports: list[dict], pool_dir: Path) -> list[dict]:
    """The seed's Table 2 over several reports: comparison.md / .csv / .json in pool_dir."""
    rows = average_rows([r["rows"] for r in reports])
    pool_dir.mkdir(parents=True, exist_ok=True)
    markdown = pool_markdown(reports, rows)
    atomic_write_bytes(pool_dir / "comparison.md", markdown.encode())
    atomic_write_bytes(pool_dir / "comparison.csv", _csv(rows))
    atomic_write_json(pool_dir / "comparison.json", {
        "reports": [{k: r[k] for k in ("model", "dataset", "weights_sha256", "unlabelled_split", "cmm_units")}
                    for r in reports], "worst_k": reports[0]["worst_k"], "rows": rows})
    log.info("%s", markdown.rstrip("\n"))
    log.info("averaged zero-shot report in %s", pool_dir)
    return rows


@dataclass(frozen=True)
class ZeroShotReportRequest:
    """evaluate.py zeroshot_report=true: one zero-shot run, or a pool of runs and earlier reports averaged.

    `zeroshot_reports` runs it.

    Args:
        options: What the report measures.
        entries: Runs (reported where evaluate writes their outputs), or earlier reports' comparison.json files.
        data: Builds the data module (rgb.data.BenchmarkData).
        pool_dir: A pool: where the average goes; None: one run.
    """

    options: ZeroShotReportOptions
    entries: tuple[RunOutputs | Path, ...]  # runs (where evaluate writes their outputs), or comparison.json files
    data: Callable[[], object]  # the data config's module (rgb.data.BenchmarkData)
    pool_dir: Path | None  # a pool: the average goes here; None: one run


def _report_run(target: RunOutputs, options: ZeroShotReportOptions, data: Callable[[], object]) -> dict:
    """One run's report, written where evaluate writes that run's outputs."""
    model, meta = load_with_meta(target.run)
    zeroshot_record(meta, target.run, REPORT)
    meta.setdefault("run_name", target.run_name)
    return zeroshot_report(model, meta, export_paths(target.run)[0], data(), options, target.output_dir)


def _pool_member(entry: RunOutputs | Path, options: ZeroShotReportOptions, datamodule) -> dict:
    """A pool entry: an earlier report's comparison.json (any dataset), or a run of the configured dataset."""
    if isinstance(entry, Path):
        if not entry.is_file():
            raise EvaluationError(f"zero-shot report {entry} does not exist")
        try:
            report = json.loads(entry.read_text())
        except json.JSONDecodeError as error:
            raise EvaluationError(f"zero-shot report {entry} is not JSON ({error})") from None
        if not isinstance(report, dict) or not {"rows", "dataset", "model"} <= set(report):
            raise EvaluationError(f"{entry} is not a zero-shot report's comparison.json")
        return report
    dataset = load_with_meta(entry.run)[1].get("dataset")
    if dataset not in (None, datamodule.dataset):
        raise EvaluationError(f"{entry.run} was made for dataset {dataset!r}, not {datamodule.dataset!r}: report it "
                              f"with {describe_data_config(dataset)} first and give its zeroshot_report/comparison.json "
                              "in pool=")
    return _report_run(entry, options, lambda: datamodule)


def zeroshot_reports(request: ZeroShotReportRequest) -> None:
    """One zero-shot run reported; a pool (runs or earlier reports' comparison.json): each reported, then the rows
    averaged over them; anything else in one line."""
    if request.pool_dir is not None:
        datamodule = request.data()
        reports = [_pool_member(entry, request.options, datamodule) for entry in request.entries]
        write_pool(reports, request.pool_dir)
        return
    if not request.entries:
        raise EvaluationError("zeroshot_report=true compares the ensembles of a zero-shot run: give run=DIR, or "
                              "pool=[DIR or comparison.json, ...] to average several")
    _report_run(request.entries[0], request.options, request.data)


__all__ = ["ZeroShotReportOptions", "ZeroShotReportRequest", "report_markdown", "write_pool",
           "zeroshot_report", "zeroshot_reports"]
