"""rgb-serve's config half: conf/serve.yaml's values handed to rgb.serve's server (the API key read from the
environment variable the config names)."""

from __future__ import annotations

import logging
import os
from importlib.util import find_spec

from omegaconf import DictConfig

from rgb.commands.schema import MACHINE, RUN
from rgb.core.errors import UserError
from rgb.core.machine import resolve_device
from rgb.core.values import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE_INT, TEXT, integer, optional

log = logging.getLogger("rgb.serve")


class ServeExtraMissing(UserError, ImportError):
    """rgb-serve's server framework is not installed (one line: the pip command)."""

# conf/serve.yaml's schema (rgb.commands.schema).
SCHEMA = {
    **MACHINE, **RUN, "host": TEXT, "port": (lambda v: integer(v) and 0 <= v <= 65535, "an integer in [0, 65535]"),
    "served_name": TEXT, "api_key_env": optional(TEXT), "image_size": optional(POSITIVE_INT), "batch_dir": optional(TEXT),
    "log_interval_s": NON_NEGATIVE,
    "limits.max_concurrency": POSITIVE_INT, "limits.max_queue": NON_NEGATIVE_INT,
    "faults.rate_limit_every": NON_NEGATIVE_INT, "faults.error_every": NON_NEGATIVE_INT,
    "faults.slow_every": NON_NEGATIVE_INT, "faults.malformed_every": NON_NEGATIVE_INT,
    "faults.retry_after_s": NON_NEGATIVE, "faults.slow_s": NON_NEGATIVE,
}


def serve_from_config(cfg: DictConfig) -> None:
    """rgb-serve: serve `cfg.run` until interrupted."""
    if find_spec("fastapi") is None or find_spec("uvicorn") is None:
        raise ServeExtraMissing("rgb-serve runs on FastAPI and uvicorn: pip install 'robustgenbench[serve]'")
    from rgb.serve import Faults, Limits, ServeError, make_server

    key = os.environ.get(str(cfg.api_key_env)) if cfg.get("api_key_env") else None
    if cfg.get("api_key_env") and not key:
        raise ServeError(f"api_key_env={cfg.api_key_env} is set but the environment has no {cfg.api_key_env}")
    server = make_server(str(cfg.run), str(cfg.host), cfg.port, str(cfg.served_name),
                         Faults(**dict(cfg.faults)), key, resolve_device(str(cfg.device)), cfg.get("image_size"),
                         Limits(**dict(cfg.limits)), cfg.get("batch_dir"), cfg.log_interval_s)
    log.info("serving %s as model %r at %s/chat/completions (health: %s/health; Ctrl-C stops)", cfg.run,
             server.served_name, server.base_url, server.base_url.removesuffix("/v1"))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        log.info("stopped after %d requests", server.requests.count())
        server.server_close()
