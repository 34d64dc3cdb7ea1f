"""`model=api_chat` (strategy `api`): a run dir for a model behind an API, made without training, the way a
zero-shot CLIP run is: model.json only (family `api`), with the data's class names the prompt will list.

The dir follows the rule of every run dir (rgb.core.rundir): written under its lock, bound by `run.json` to the
identity of its model.json, so a re-run under the same name with another endpoint, decoding or prompt is refused in
one line instead of overwriting the record that earlier scores and answer caches were made for."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rgb.core.rundir import MANIFEST, IdentityManifest
from rgb.core.values import flatten
from rgb.models import META_FILE, export_meta, export_model
from rgb.endpoints.settings import split_config
from rgb.models.chat import ChatClassifier
from rgb.training.config import TrainingConfigError, TrainingError
from rgb.training.rundir import locked
from rgb.training.settings import ENDPOINT_STRATEGY

log = logging.getLogger(__name__)

TASK = "api"  # run.json's task of such a run dir (a format)
# The strategy of a model behind an endpoint (conf/model_strategy/api_chat.yaml): no fit, model.json only. train.py
# dispatches it here; a TrainRequest runs the others (rgb.training.request.STRATEGY_NAMES).
STRATEGY = ENDPOINT_STRATEGY


@dataclass(frozen=True)
class EndpointRunRequest:
    """One `model=api_chat` run dir to write: the resolved model config (endpoint, decoding, prompt, client), the
    data whose class names the prompt lists, the run's names and seed."""

    model: dict
    data: Callable[[], object]  # the data config's own class (rgb.data.BenchmarkData)
    run_dir: str  # as given: the log line names it for evaluate.py's run=
    names: dict  # run_name and sweep, recorded in model.json (rgb.runs.store.run_name_for)
    seed: int | None
    card: dict = field(default_factory=dict)  # the model card (rgb.models.card.model_card), recorded in model.json


def _api_identity_in(record) -> dict | None:
    if isinstance(record, dict) and record.get("task") == TASK and "identity" in record:
        return record["identity"]
    return None


def api_identity(made: dict, model: ChatClassifier) -> dict:
    """What model.json says about the answers to score, as {dotted key: value}: the data and the model's record
    without its client settings (concurrency, rate limits, retries change no answer, so they may change)."""
    described = {key: value for key, value in model.describe().items() if key != "client"}
    return dict(sorted(flatten({**made, **described}).items()))


def claim_api_run(run_dir: Path, identity: dict) -> None:
    """Bind `run_dir` to `identity` (held under its lock): refused when its model.json was made for another one,
    or when a model.json is there that no run.json describes (a dir from before run.json, or another run's)."""
    manifest = IdentityManifest(run_dir, "an API run", _api_identity_in, TrainingError,
                                "was made for another API model", "another run_name")
    made = (run_dir / META_FILE).is_file()
    if made and not manifest.path.is_file():
        raise TrainingError(f"{run_dir} holds a {META_FILE} but no {MANIFEST}, so the config that made it is "
                            f"unknown; {manifest.start_over}")
    manifest.claim({"task": TASK, "identity": identity}, holds_results=made)


def export_api_run(request: EndpointRunRequest) -> None:
    """Write `<run_dir>/model.json` for the requested endpoint; the API key stays in its environment variable."""
    try:  # first: a refused setting (a typed secret) stops the run before any work
        settings, client = split_config(request.model)
    except (TypeError, ValueError) as err:  # a key the settings do not know, a value that breaks its rule
        raise TrainingConfigError(f"model=api_chat: {err}") from None
    datamodule = request.data()
    model = ChatClassifier(settings, client, datamodule.class_names, datamodule.dataset)
    if request.model.get("check_endpoint", True):  # GET /models answers and lists api_model (false: offline)
        model.endpoint.check_served()
    made = export_meta(datamodule, {}, loss=None, strategy=STRATEGY, epochs=0, seed=request.seed, weights=None)
    run_dir = Path(request.run_dir)
    with locked(run_dir):
        claim_api_run(run_dir, api_identity(made, model))
        exported = export_model(model, run_dir, {**request.names, **made, "card": request.card})
    log.info("exported %s: %s at %s (no weights; score it with evaluate.py run=%s protocol=black_box)", exported,
             settings.api_model, settings.base_url, request.run_dir)
