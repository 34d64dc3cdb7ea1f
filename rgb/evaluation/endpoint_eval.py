"""Predictions of an API model (rgb.models.chat) on a benchmark split: from the split's own PNG bytes, through the
answer cache, with the raw answer and the parsed class kept per image for audit (predictions.parquet)."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from rgb.evaluation.records import EndpointUsage
from rgb.evaluation.request import EvalRequest
from rgb.models.chat import ChatClassifier
from rgb.endpoints.cache import AnswerCache
from rgb.endpoints.client import RequestBudget, RequestStats
from rgb.endpoints.cost import model_price

ABSTAINED = -1  # the prediction of an answer that names no class (or several): never equal to a label


def split_images(split, n: int) -> list[bytes]:
    """The first n stored PNG files of an ImageSplit, byte for byte (never decoded or re-encoded)."""
    return pc.struct_field(split.rows.data.column("image"), "bytes").to_pylist()[:n]


def cache_path(cache_dir: Path, model: ChatClassifier) -> Path:
    """One answer cache per model identity."""
    return Path(cache_dir) / f"{model.identity_sha256}.jsonl"


def request_budget(model: ChatClassifier, request: EvalRequest) -> RequestBudget:
    """What the evaluation may spend (its caps, priced by model.price or conf/prices.yaml): made before anything is
    asked, so a cap it cannot honour (max_cost, no price) is refused first."""
    price = model_price(model.client_settings.price, model.settings.api_model, request.prices)
    return RequestBudget.of(request.caps, price)


class EndpointPredictor:
    """Evaluation's view of an API model: per split the answered prefix of predictions (all of it unless
    max_requests ran out), request counts per split, and the answer columns of predictions.parquet."""

    white_box_na = "API model"

    def __init__(self, model: ChatClassifier, request: EvalRequest):
        self.model, self.request = model, request
        self.cache = AnswerCache(cache_path(request.api_cache_dir, model))
        self.budget = request_budget(model, request)
        self.per_split: dict[str, RequestStats] = {}
        self.priced: set[str] = set()  # the request keys whose answers a split has counted the money of
        self.columns: dict[str, list] = {}

    def identity(self, weights_path) -> str:
        return self.model.identity_sha256

    def __call__(self, split, desc: str) -> dict[str, np.ndarray]:
        n = len(split) if self.request.max_images is None else min(self.request.max_images, len(split))
        images = split_images(split, n)
        answers, stats = self.model.answer(images, self.cache, self.budget, desc)
        self.per_split[desc] = replace(stats, **self.money(images))
        names = self.model.class_names
        key = desc.replace("/", "_")
        self.columns[f"answer_{key}"] = [a.text if a else None for a in answers]
        self.columns[f"parsed_{key}"] = [names[a.pred] if a and a.pred is not None else None for a in answers]
        answered = next((i for i, a in enumerate(answers) if a is None), n)  # max_requests: the answered prefix
        preds = [ABSTAINED if a.pred is None else a.pred for a in answers[:answered]]
        return {"pred": np.asarray(preds, dtype=np.int64), "label": split.labels.numpy()[:answered],
                "image_id": np.asarray(split.rows.data.column("image_id").to_numpy()[:answered], dtype=np.int64)}

    def money(self, images: list[bytes]) -> dict[str, float]:
        """`spent` and `list_cost` of the answers this split is the first of the evaluation to use: each answer
        once, whichever split or run asked it, priced from its cache record ({}: no price)."""
        price = self.budget.price
        if price is None:
            return {}
        keys = [k for k in dict.fromkeys(map(self.model.request_key, images)) if k in self.cache]
        records = [self.cache.get(k) for k in keys if k not in self.priced]
        self.priced.update(keys)
        return {"spent": sum(map(price.spent, records)), "list_cost": sum(map(price.list_cost, records))}

    def usage(self) -> EndpointUsage:
        price = self.budget.price
        return EndpointUsage(self.model.settings.base_url, self.model.settings.api_model, dict(self.per_split),
                        self.request.caps.max_requests, self.model.parser.version,
                        None if price is None else asdict(price), self.model.parser.name, self.budget.stopped_by,
                        self.answer_format_used(), self.model.settings.clarify)

    def answer_format_used(self) -> str:
        """The configured answer format, or "text" when some answers were asked in text instead (the endpoint
        refused choice's response_format)."""
        fell_back = any(stats.answered_in_text for stats in self.per_split.values())
        return "text" if fell_back else self.model.settings.answer_format

    def close(self) -> None:
        self.cache.close()
