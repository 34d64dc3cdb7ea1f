"""evaluate.py's `zeroshot_report=true`: the CPE seed's Table 2 for one zero-shot run: every prompt ensemble side
by side (overall accuracy, worst@1/5/10, HM, GM on the test split) and each template's weight and kept flag.

Everything is rebuilt from the run itself: its image tower gives the test features and the unlabelled features
(the split its prompts config named, never its labels), its CLIP text tower the text features of its recorded
templates and class names (cached like the training run's, so usually read from disk), its record the logit scale,
k, tau and single template. `rgb.zeroshot.comparison_table` does the rest. An extra row scores the exported head
itself: it equals the row of the run's own ensemble unless descriptions enriched some classes' prompts.
Outputs under `<output_dir>/zeroshot_report/`: comparison.md, ensembles.csv, templates.csv, comparison.json.
"""

from __future__ import annotations

import csv
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rgb.core import atomic_write_bytes, atomic_write_json, file_sha256, resolve_device
from rgb.evaluation.leaderboard import markdown_table
from rgb.evaluation.model_eval import EvaluationError
from rgb.models import load_with_meta, register_architecture
from rgb.models.io import WEIGHTS_FILE
from rgb.models.openclip import load_clip_of
from rgb.zeroshot import (
    ENSEMBLES,
    WORST_K,
    EnsembleError,
    PromptError,
    TextFeatureCache,
    check_class_names,
    class_wise_metrics,
    comparison_table,
    features_of,
)

log = logging.getLogger(__name__)

REPORT_DIR = "zeroshot_report"
METRICS = ("overall", *(f"worst@{k}" for k in WORST_K), "hm", "gm")
EXPORTED = "exported"  # the row of the run's own head, as model.safetensors holds it


@dataclass(frozen=True)
class ZeroShotReportOptions:
    """The `zeroshot_report_options` block of conf/evaluate.yaml."""

    ensembles: tuple[str, ...]
    unlabelled_split: str | None  # None: the split the run's prompts config named
    cache_dir: Path | None
    device: str = "cpu"

    def __post_init__(self):
        unknown = [m for m in self.ensembles if m not in ENSEMBLES]
        if unknown or not self.ensembles:
            raise EvaluationError(f"zeroshot_report_options.ensembles: unknown or none ({', '.join(unknown)}); "
                                  f"choose from {', '.join(ENSEMBLES)}")

    @classmethod
    def from_config(cls, cfg: DictConfig) -> ZeroShotReportOptions:
        block = OmegaConf.to_container(cfg.zeroshot_report_options, resolve=True)
        return cls(ensembles=tuple(str(m) for m in block["ensembles"]),
                   unlabelled_split=None if block["unlabelled_split"] is None else str(block["unlabelled_split"]),
                   cache_dir=None if block["cache_dir"] is None else Path(str(block["cache_dir"])),
                   device=resolve_device(str(cfg.device)))


def zeroshot_record_of(meta: dict, run: Path) -> dict:
    """The `zeroshot` section of a zero-shot run's model.json; any other model is refused in one line."""
    family = meta.get("family", "timm")
    what = "an openclip model without a prompt-built head" if family == "openclip" else f"a {family} model"
    if family != "openclip" or "zeroshot" not in meta:
        raise EvaluationError(f"zeroshot_report=true compares the prompt ensembles of a zero-shot run "
                              f"(strategy=zeroshot); {run} is {what}")
    return meta["zeroshot"]


def _csv(rows: list[dict]) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def report_markdown(title: str, rows: list[dict], templates: list[str]) -> str:
    """The ensembles table (metrics, kept count), then one row per template: weight and kept flag per ensemble."""
    weighted = [r for r in rows if r["templates"]]
    header = ["ensemble", *METRICS, "templates kept"]
    lines = [f"# Zero-shot prompt ensembles: {title}", ""]
    lines += markdown_table(header, [[r["ensemble"], *(f"{r[m]:.4f}" for m in METRICS),
                                      f"{sum(t['kept'] for t in r['templates'])}/{len(r['templates'])}"
                                      if r["templates"] else ""] for r in rows],
                            ["---"] + ["---:"] * (len(header) - 1))
    lines += ["", "## Template weights (* = kept)", ""]
    header = ["template", *(r["ensemble"] for r in weighted)]
    body = [[f"`{template}`", *(f"{r['templates'][i]['weight']:.4f}{'*' if r['templates'][i]['kept'] else ''}"
                                for r in weighted)] for i, template in enumerate(templates)]
    lines += markdown_table(header, body, ["---"] + ["---:"] * len(weighted))
    return "\n".join(lines) + "\n"


def zeroshot_report(model, meta: dict, weights_path: Path, datamodule, options: ZeroShotReportOptions,
                    out_dir: Path) -> dict:
    """Every ensemble of `options` for one zero-shot run on its dataset's test split; writes the report files
    under out_dir/zeroshot_report and returns the JSON record."""
    run_name = str(meta.get("run_name", Path(weights_path).parent.name))
    record = zeroshot_record_of(meta, Path(weights_path).parent)
    if meta.get("dataset") not in (None, datamodule.dataset):
        raise EvaluationError(f"{run_name} was made for dataset {meta['dataset']!r}, the data config is "
                              f"{datamodule.dataset!r}")
    test = datamodule.split("test")
    params = record["params"]
    unlabelled_split = options.unlabelled_split or params["split"]
    timings, started = {}, time.perf_counter()
    try:
        check_class_names(record, test.class_names)
        model = model.to(options.device).eval()
        test_features = features_of(model, datamodule.eval_dataloader("test"), options.device)
        unlabelled = (test_features if unlabelled_split == "test"
                      else features_of(model, datamodule.eval_dataloader(unlabelled_split), options.device))
        timings["image_features_s"] = time.perf_counter() - started
        started = time.perf_counter()
        register_architecture(model.recipe["name"], model.recipe["open_clip_config"])
        cache = TextFeatureCache(load_clip_of(model), options.cache_dir, options.device)
        templates = [t["template"] for t in record["templates"]]
        text = cache.prompt_features(templates, record["class_names"])
        timings["text_features_s"] = time.perf_counter() - started
        rows = comparison_table(test_features, test.labels, text, templates, logit_scale=record["logit_scale"],
                                unlabelled_features=unlabelled, methods=options.ensembles, k=params["k"],
                                tau=params["tau"], template_index=record["single_template_index"])
    except (PromptError, EnsembleError) as error:
        raise EvaluationError(str(error)) from error
    exported = model.classifier.weight.detach().float().cpu()
    bias = model.classifier.bias.detach().float().cpu()
    predictions = (test_features @ exported.T + bias).argmax(1)
    rows.append({"ensemble": f"{EXPORTED} ({record['ensemble']})",
                 **class_wise_metrics(predictions, test.labels, len(record["class_names"])), "templates": []})

    out = Path(out_dir) / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "model": run_name, "weights_sha256": file_sha256(weights_path), "dataset": datamodule.dataset,
        "split": "test", "n_images": len(test), "unlabelled_split": unlabelled_split,
        "unlabelled_images": len(unlabelled), "run_ensemble": record["ensemble"],
        "enriched_classes": record.get("enriched_classes", []), "logit_scale": record["logit_scale"],
        "k": params["k"], "tau": params["tau"], "texts_encoded": cache.computed, "rows": rows,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    markdown = report_markdown(f"{run_name} on {datamodule.dataset}/test ({len(test)} images; weights from "
                               f"{len(unlabelled)} unlabelled {unlabelled_split} images)", rows, templates)
    atomic_write_bytes(out / "comparison.md", markdown.encode())
    atomic_write_bytes(out / "ensembles.csv", _csv([{"ensemble": r["ensemble"], **{m: r[m] for m in METRICS},
                                                     "templates_kept": sum(t["kept"] for t in r["templates"])}
                                                    for r in rows]))
    atomic_write_bytes(out / "templates.csv", _csv([{"ensemble": r["ensemble"], **t}
                                                    for r in rows for t in r["templates"]]))
    atomic_write_json(out / "comparison.json", result)
    log.info("%s", markdown.rstrip("\n"))
    log.info("zero-shot report in %s", out)
    return result


def run_zeroshot_report(cfg: DictConfig) -> None:
    """`zeroshot_report=true run=DIR`: one zero-shot run; anything else in one line."""
    if cfg.run is None or cfg.pool:
        raise EvaluationError("zeroshot_report=true compares the ensembles of one zero-shot run: give run=DIR "
                              "(not pool=)")
    options = ZeroShotReportOptions.from_config(cfg)
    run = Path(str(cfg.run))
    model, meta = load_with_meta(run)
    zeroshot_record_of(meta, run)
    meta.setdefault("run_name", str(cfg.run_name))
    zeroshot_report(model, meta, run / WEIGHTS_FILE if run.is_dir() else run, instantiate(cfg.data), options,
                    Path(str(cfg.output_dir)))


__all__ = ["ZeroShotReportOptions", "report_markdown", "run_zeroshot_report", "zeroshot_record_of",
           "zeroshot_report"]
