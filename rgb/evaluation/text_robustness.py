"""evaluate.py's `text_robustness=true`: how far small, meaning-preserving edits of text queries reorder the images
a zero-shot (openclip) model retrieves, and what they do to its classifier (zeroshot-spec section 4).

One model (`run=DIR`): queries = the run's prompts (every recorded template filled with every class name) or a
JSONL file of free-text queries; collection = the images of one split. The collection's image features are
computed once per (weights, split) and cached on disk; the text tower encodes each distinct text once (cached per
text tower). Outputs under `<output_dir>/text_robustness/`: per-query table (parquet + CSV), summary per
(perturbation class, type) (CSV + markdown), the classification view, plots and a JSON record.

Several models (`pool=[DIR,...]`): each is measured as above (its own outputs), then put side by side: a model x
perturbation-type heatmap of mean instability and mean finite B, and a CSV, under `text_robustness_options.pool_dir`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import safetensors.torch
import torch
from torch.utils.data import DataLoader

from rgb.core import atomic_write_bytes, atomic_write_json, file_sha256
from rgb.core.files import read_cached_tensors
from rgb.core.files import read_jsonl
from rgb.core.values import unknown_name
from rgb.data.fingerprint import split_sha256
from rgb.evaluation import plots
from rgb.evaluation.leaderboard import markdown_table
from rgb.evaluation.model_eval import EvaluationError, zeroshot_record
from rgb.evaluation.request import RunOutputs
from rgb.evaluation.text_robustness_options import TextRobustnessOptions
from rgb.runs.store import TEXT_ROBUSTNESS_DIR
from rgb.models import export_paths, load_with_meta, register_architecture
from rgb.models.openclip import load_clip_of
from rgb.brittleness.metrics import classification_view, query_table, summarize
from rgb.zeroshot.ensembles import ensemble_head
from rgb.zeroshot.head import check_class_names, features_of
from rgb.brittleness.perturb import (
    Perturbation,
    PerturbationError,
    Query,
    drop_non_edits,
    generate,
    load_user_edits,
    template_queries,
)
from rgb.zeroshot.prompts import PromptError
from rgb.zeroshot.text import TextFeatureCache

log = logging.getLogger(__name__)

# What needs a zero-shot run, as the refusal of another model says (rgb.evaluation.model_eval.zeroshot_record).
REPORT = "text robustness"
QUERY_FILE_FIELDS = ("query", "class_name")  # class_name optional: it enables class_name_only and keeps its words
POOL_METRICS = {"instability_mean": "mean instability", "brittleness_mean": "mean finite B"}


def load_queries(path: Path, class_names: list[str]) -> list[Query]:
    """Free-text queries, one JSON object per line: {"query": text, "class_name": optional class name}; blank
    lines skipped. A malformed or repeated line is named, and so is a class name that is none of `class_names`
    (the model's, as its prompts spell them; `_` read as a space): a misspelt class would silently lose its
    class-name edits."""
    queries, first_line = [], {}
    for number, record in read_jsonl(path, EvaluationError, "query file"):
        class_name = record.get("class_name") if isinstance(record, dict) else None
        if (not isinstance(record, dict) or set(record) - set(QUERY_FILE_FIELDS)
                or not isinstance(record.get("query"), str) or not record["query"].strip()
                or not (class_name is None or isinstance(class_name, str) and class_name.strip())):
            raise EvaluationError(f"{path}:{number}: expected {{\"query\": non-empty text, \"class_name\": optional "
                                  f"non-empty text}}, got {json.dumps(record)[:80]}")
        if class_name is not None:
            class_name = class_name.replace("_", " ")
            if class_name not in class_names:
                raise EvaluationError(f"{path}:{number}: " + unknown_name("class_name", class_name, class_names))
        if record["query"] in first_line:
            raise EvaluationError(f"{path}:{number}: repeats the query of line {first_line[record['query']]}")
        first_line[record["query"]] = number
        queries.append(Query(record["query"], class_name))
    if not queries:
        raise EvaluationError(f"empty query set: {path} holds no query")
    return queries


def _clip_of(model):
    """The whole CLIP (text tower included) of a zero-shot export, its architecture registered from the record."""
    register_architecture(model.recipe["name"], model.recipe["open_clip_config"])
    return load_clip_of(model)


def cached_image_features(model, split, weights_sha256: str,
                          options: TextRobustnessOptions) -> tuple[torch.Tensor, bool]:
    """(N, D) L2-normalised features of the split's images, and whether they came from the cache. The cache key is
    (weights sha256, split fingerprint): other weights or other images never reuse them."""
    fingerprint = split_sha256(split)
    path = None
    if options.cache_dir is not None:
        key = hashlib.sha256(f"{weights_sha256}:{fingerprint}".encode()).hexdigest()
        path = options.cache_dir / "images" / f"{key}.safetensors"
        cached = read_cached_tensors(path, "image-feature cache entry")
        if cached is not None and "features" in cached:
            return cached["features"], True
    loader = DataLoader(split, batch_size=options.batch_size, shuffle=False)
    features = features_of(model, loader, options.device)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"weights_sha256": weights_sha256, "split_sha256": fingerprint, "split": split.name}
        atomic_write_bytes(path, safetensors.torch.save({"features": features.contiguous()}, metadata=metadata))
    return features, False


def curve_ks(n_images: int, ks: Sequence[int]) -> list[int]:
    """The configured ks plus a 1-2-5 grid up to the collection size (for the overlap@k curves)."""
    grid = {m * 10**e for e in range(int(math.log10(max(n_images, 1))) + 1) for m in (1, 2, 5)}
    return sorted({k for k in grid if k <= n_images} | {n_images} | set(ks))


def _prompt_heads(record: dict, text: torch.Tensor, perturbations: Sequence[Perturbation],
                  perturbed: torch.Tensor) -> tuple[torch.Tensor, dict[tuple[str, int], tuple[torch.Tensor, int]]]:
    """The run's head rebuilt from its template features and recorded weights, and per (type, seed) the head when
    every class prompt got that edit (prompts the edit does not apply to stay as they are), with the edit count."""
    templates = record["templates"]
    weights = torch.tensor([t["weight"] for t in templates], dtype=text.dtype)
    kept = torch.tensor([t["kept"] for t in templates])
    shape = (len(templates), len(record["class_names"]), text.shape[-1])
    head = ensemble_head(text.view(shape), weights, kept, record["ensemble"])
    rows: dict[tuple[str, int], list[int]] = {}
    for row, item in enumerate(perturbations):
        rows.setdefault((item.type, item.seed), []).append(row)
    heads = {}
    for key, index in rows.items():
        edited = text.clone()
        index = torch.tensor(index)
        edited[torch.tensor([perturbations[i].query_index for i in index])] = perturbed[index]
        heads[key] = ensemble_head(edited.view(shape), weights, kept, record["ensemble"]), len(index)
    return head, heads


def classification_rows(record: dict, model, image_features: torch.Tensor, labels: torch.Tensor,
                        text: torch.Tensor, perturbations: Sequence[Perturbation],
                        perturbed: torch.Tensor) -> tuple[list[dict], float]:
    """One row per (type, seed): accuracy before / after, flip rate; and the share of images on which the rebuilt
    head predicts what the exported model does (1 unless descriptions enriched some classes' prompts)."""
    head, heads = _prompt_heads(record, text, perturbations, perturbed)
    model_head = model.classifier.weight.detach().float().cpu()
    rebuilt, exported = ((image_features @ matrix.T).argmax(1) for matrix in (head, model_head))
    agreement = float((rebuilt == exported).double().mean())
    classes = {item.type: item.perturbation_class for item in perturbations}
    rows = [{"perturbation_class": classes[type_name], "perturbation_type": type_name, "seed": seed,
             "edited_prompts": count, "prompts": text.shape[0],
             **classification_view(image_features, head, edited_head, labels)}
            for (type_name, seed), (edited_head, count) in heads.items()]
    return rows, agreement


@dataclass
class TextRobustnessResult:
    """What one model's measurement produced (also written to text_robustness.json)."""

    model: str
    summary: list[dict]
    classification: list[dict]
    record: dict
    out_dir: Path
    plots: list[Path]


def _write_table(columns: dict[str, np.ndarray], stem: Path) -> None:
    """parquet and CSV of the same columns, each written whole."""
    table = pa.table({name: pa.array(list(values) if values.dtype == object else values)
                      for name, values in columns.items()})
    for write, suffix in ((pq.write_table, ".parquet"), (pa_csv.write_csv, ".csv")):
        sink = pa.BufferOutputStream()
        write(table, sink)
        atomic_write_bytes(stem.with_suffix(suffix), sink.getvalue().to_pybytes())


def _rows_table(rows: list[dict]) -> dict[str, np.ndarray]:
    return {name: np.array([row[name] for row in rows], dtype=object if isinstance(rows[0][name], str) else None)
            for name in rows[0]}


def _cell(value) -> str:
    if isinstance(value, float):
        return "undef" if math.isnan(value) else "-inf" if value == -math.inf else f"{value:.4f}"
    return str(value)


def summary_markdown(title: str, summary: list[dict], classification: list[dict]) -> str:
    """The summary per (perturbation class, type) and, when measured, the classification view."""
    header = ["class", "type", "n", "no-op", "same tokens", "instab. mean", "instab. median",
              *[name.removesuffix("_mean") for name in summary[0] if name.startswith("overlap@")],
              "intra mean", "B mean", "B median", "B stable (-inf)", "B undefined"]
    keys = ["perturbation_class", "perturbation_type", "n", "n_noop", "n_same_tokens", "instability_mean",
            "instability_median", *[name for name in summary[0] if name.startswith("overlap@")], "intra_mean",
            "brittleness_mean", "brittleness_median", "brittleness_stable", "brittleness_undefined"]
    lines = [f"# Text robustness: {title} (inter-query distance {summary[0]['inter']:.4f})", "",
             "n counts the edits measured; no-op (text unchanged) and same-tokens (the tokenizer reads the query) "
             "edits are left out. B mean is over finite B; a stable ranking (instability 0, text moved) is the least "
             "brittle case, B = -inf, counted apart and in the median; undefined: intra distance 0.", ""]
    lines += markdown_table(header, [[_cell(row[k]) for k in keys] for row in summary],
                            ["---", "---"] + ["---:"] * (len(header) - 2))
    if classification:
        lines += ["", "## Classification view (every class prompt edited the same way)", ""]
        keys = ["perturbation_class", "perturbation_type", "seed", "edited_prompts", "accuracy",
                "perturbed_accuracy", "flip_rate"]
        lines += markdown_table(["class", "type", "seed", "edited prompts", "accuracy", "edited accuracy", "flip rate"],
                                [[_cell(row[k]) for k in keys] for row in classification],
                                ["---", "---"] + ["---:"] * 5)
    return "\n".join(lines) + "\n"


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _figures(table: dict[str, np.ndarray], summary: list[dict], name: str, out: Path) -> list[Path]:
    """The overlap curves, the scatter and the heatmap of the measured types (a type whose edits were all left out
    as no edits has no cell: the tables count it)."""
    types = list(dict.fromkeys(table["perturbation_type"]))
    by_type = {t: table["perturbation_type"] == t for t in types}
    overlap_ks = sorted(int(c.split("@")[1]) for c in table if c.startswith("overlap@"))
    curves = {t: (overlap_ks, [float(np.nanmean(table[f"overlap@{k}"][rows])) for k in overlap_ks])
              for t, rows in by_type.items()}
    normalised = table["intra"] / table["inter"]
    points = {t: (normalised[rows], table["instability"][rows]) for t, rows in by_type.items()}
    panels = {label: {name: {row["perturbation_type"]: row[key] for row in summary if row["n"]}}
              for key, label in POOL_METRICS.items()}
    return [
        plots.save(plots.overlap_curves_figure(curves, f"mean overlap@k per perturbation type: {name}"),
                   out / "overlap_at_k.png"),
        plots.save(plots.instability_distance_figure(points, f"instability vs intra / inter distance: {name}"),
                   out / "instability_vs_distance.png"),
        plots.save(plots.brittleness_heatmap_figure(panels, f"text brittleness: {name}"),
                   out / "brittleness_heatmap.png"),
    ]


def measure_text_robustness(model, meta: dict, weights_path: Path, datamodule, options: TextRobustnessOptions,
                            out_dir: Path) -> TextRobustnessResult:
    """Everything about one zero-shot model's text robustness on one split; writes it under out_dir/text_robustness."""
    run_name = str(meta.get("run_name", Path(weights_path).parent.name))
    record = zeroshot_record(meta, Path(weights_path).parent, REPORT)
    timings, started = {}, time.perf_counter()
    if meta.get("dataset") not in (None, datamodule.dataset):
        raise EvaluationError(f"{run_name} was made for dataset {meta['dataset']!r}, the data config is "
                              f"{datamodule.dataset!r}")
    from_templates = options.queries is None
    templates = [t["template"] for t in record["templates"]]
    queries = (template_queries(templates, record["class_names"]) if from_templates
               else load_queries(options.queries, record["class_names"]))
    user_edits = load_user_edits(options.user_edits) if options.user_edits else None
    generated = generate(queries, options.types, options.seeds, user_edits)
    if not generated:
        raise EvaluationError(f"empty query set: none of the types {', '.join(options.types)} applies to the "
                              f"{len(queries)} queries")
    clip = _clip_of(model)
    perturbations, dropped = drop_non_edits(generated, clip.tokenizer)
    if not perturbations:
        raise EvaluationError(f"no perturbation to measure: every edit of the types {', '.join(options.types)} leaves "
                              "the text or its tokens as they were")
    timings["generation_s"] = time.perf_counter() - started

    split = datamodule.split(options.split)
    if len(split) < 2:
        raise EvaluationError(f"the {options.split} split holds {len(split)} image(s): ranking instability needs a "
                              "collection of at least 2")
    check_class_names(record, split.class_names)
    model = model.to(options.device).eval()
    weights_sha256 = file_sha256(weights_path)
    started = time.perf_counter()
    image_features, from_cache = cached_image_features(model, split, weights_sha256, options)
    timings["image_features_s"] = time.perf_counter() - started

    started = time.perf_counter()
    texts = list(dict.fromkeys([q.text for q in queries] + [p.text for p in perturbations]))
    cache = TextFeatureCache(clip, None if options.cache_dir is None else options.cache_dir / "texts",
                             options.device)
    features = cache.features(texts)
    row_of = {text: i for i, text in enumerate(texts)}
    query_features = features[[row_of[q.text] for q in queries]]
    perturbed_features = features[[row_of[p.text] for p in perturbations]]
    timings["text_features_s"] = time.perf_counter() - started

    started = time.perf_counter()
    table = query_table(image_features, query_features, perturbed_features, perturbations,
                        ks=curve_ks(len(split), options.ks), p=options.p, batch_size=options.batch_size)
    timings["query_table_s"] = time.perf_counter() - started
    reported = {name: values for name, values in table.items()
                if not name.startswith("overlap@") or int(name.split("@")[1]) in options.ks}
    summary = summarize(reported, dropped)

    classification, agreement = [], None
    if from_templates:
        started = time.perf_counter()
        classification, agreement = classification_rows(record, model, image_features, split.labels,
                                                         query_features, perturbations, perturbed_features)
        timings["classification_s"] = time.perf_counter() - started

    out = Path(out_dir) / TEXT_ROBUSTNESS_DIR
    out.mkdir(parents=True, exist_ok=True)
    _write_table(reported, out / "queries")
    _write_table(_rows_table(summary), out / "summary")
    if classification:
        _write_table(_rows_table(classification), out / "classification")
    markdown = summary_markdown(f"{run_name} on {datamodule.dataset}/{options.split} ({len(split)} images)",
                                summary, classification)
    atomic_write_bytes(out / "summary.md", markdown.encode())
    figures = _figures(table, summary, run_name, out)
    result_record = {
        "model": run_name, "weights_sha256": weights_sha256, "dataset": datamodule.dataset, "split": options.split,
        "split_sha256": split_sha256(split), "n_images": len(split),
        "queries": "templates" if from_templates else str(options.queries), "n_queries": len(queries),
        "n_perturbations": len(perturbations), "n_generated": len(generated), "distinct_texts": len(texts), "texts_encoded": cache.computed,
        "types": list(options.types), "seeds": list(options.seeds), "ks": list(options.ks), "p": options.p,
        "image_features": "cache" if from_cache else "computed", "head_agreement": agreement,
        "summary": [{k: _finite_or_none(v) for k, v in row.items()} for row in summary],
        "classification": classification, "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "files": sorted(p.name for p in out.iterdir() if not p.name.endswith(".json")),
    }
    atomic_write_json(out / "text_robustness.json", result_record)
    log.info("%s", markdown.rstrip("\n"))
    if agreement is not None and agreement < 1:
        log.info("the head rebuilt from the recorded template weights predicts as the exported model on %.4f of the "
                 "images (described classes are not re-described under edits)", agreement)
    return TextRobustnessResult(run_name, summary, classification, result_record, out, figures)


@dataclass(frozen=True)
class TextRobustnessRequest:
    """evaluate.py text_robustness=true: one zero-shot run, or a pool of them side by side, and how to measure them.

    Each run is measured where evaluate writes its outputs. `text_robustness` runs it.

    Args:
        options: How to measure (split, perturbation types, seeds, ks, ...).
        models: The zero-shot runs to measure.
        data: Builds the data module (rgb.data.BenchmarkData).
        pool_dir: A pool: where the side-by-side comparison goes; None: one model.
        wandb_project: Log the results to this W&B project; None: nothing logged.
    """

    options: TextRobustnessOptions
    models: tuple[RunOutputs, ...]
    data: Callable[[], object]  # the data config's module (rgb.data.BenchmarkData)
    pool_dir: Path | None  # a pool: the side-by-side comparison goes here; None: one model
    wandb_project: str | None  # None: nothing logged to W&B


def _measure_run(target: RunOutputs, datamodule, options: TextRobustnessOptions,
                 wandb_project: str | None) -> TextRobustnessResult:
    model, meta = load_with_meta(target.run)
    zeroshot_record(meta, target.run, REPORT)
    meta.setdefault("run_name", target.run_name)
    result = measure_text_robustness(model, meta, export_paths(target.run)[0], datamodule, options,
                                     target.output_dir)
    if wandb_project is not None:
        from rgb.evaluation.wandb_report import log_text_robustness

        log_text_robustness(result, wandb_project)
    return result


def pool_rows(results: Sequence[TextRobustnessResult]) -> list[dict]:
    """One row per (model, perturbation type): the summary numbers the comparison shows."""
    return [{"model": r.model, "perturbation_class": row["perturbation_class"],
             "perturbation_type": row["perturbation_type"], "n": row["n"],
             **{key: row[key] for key in ("instability_mean", "instability_median", "brittleness_mean",
                                          "brittleness_median", "brittleness_stable", "brittleness_undefined",
                                          "n_noop", "n_same_tokens")}}
            for r in results for row in r.summary]


def pool_markdown(results: Sequence[TextRobustnessResult]) -> str:
    """Perturbation types as rows, per model its mean instability and mean finite B (with the undefined count)."""
    types = list(dict.fromkeys(row["perturbation_type"] for r in results for row in r.summary))
    by_model = [{row["perturbation_type"]: row for row in r.summary} for r in results]
    header = ["type", *[f"{r.model} {what}" for r in results for what in ("instab.", "B (stable, undef.)")]]
    rows = [[name, *[cell for found in by_model for cell in (
        (_cell(found[name]["instability_mean"]),
         f"{_cell(found[name]['brittleness_mean'])} ({found[name]['brittleness_stable']}, "
         f"{found[name]['brittleness_undefined']})")
        if name in found else ("missing", "missing"))]] for name in types]
    lines = ["# Text robustness side by side: mean instability, mean finite B (stable -inf count, undefined count)",
             ""]
    return "\n".join(lines + markdown_table(header, rows, ["---"] + ["---:"] * (len(header) - 1))) + "\n"


def compare_models(results: Sequence[TextRobustnessResult], out: Path) -> list[Path]:
    """The pool's CSV (and parquet) and the model x perturbation-type heatmaps."""
    out.mkdir(parents=True, exist_ok=True)
    _write_table(_rows_table(pool_rows(results)), out / "pool")
    atomic_write_bytes(out / "pool.md", pool_markdown(results).encode())
    panels = {label: {r.model: {row["perturbation_type"]: row[key] for row in r.summary if row["n"]}
                      for r in results}
              for key, label in POOL_METRICS.items()}
    return [plots.save(plots.brittleness_heatmap_figure(panels, "text brittleness per model and perturbation type"),
                       out / "brittleness_heatmap.png")]


def text_robustness(request: TextRobustnessRequest) -> None:
    """One model measured, or a pool measured and put side by side; user errors in one line."""
    try:
        if not request.models:
            raise EvaluationError("text robustness needs run=<zero-shot run dir> or pool=[DIR,...]")
        names = [target.run_name for target in request.models]
        if len(set(names)) != len(names):
            raise EvaluationError(f"pool models need distinct run names (their output dirs), got {', '.join(names)}")
        datamodule = request.data()
        results = [_measure_run(target, datamodule, request.options, request.wandb_project)
                   for target in request.models]
    except (PerturbationError, PromptError) as error:
        raise EvaluationError(str(error)) from error
    for result in results:
        log.info("text robustness of %s in %s", result.model, result.out_dir)
    if request.pool_dir is not None:
        compare_models(results, request.pool_dir)
        log.info("%s", pool_markdown(results).rstrip("\n"))
        log.info("models side by side in %s", request.pool_dir)


__all__ = ["TextRobustnessOptions", "TextRobustnessRequest", "TextRobustnessResult", "compare_models", "load_queries",
           "measure_text_robustness", "text_robustness"]
