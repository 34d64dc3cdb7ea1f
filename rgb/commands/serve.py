"""rgb-serve's config half: conf/serve.yaml's values handed to rgb.serve's server (the API key read from the
environment variable the config names)."""

from __future__ import annotations

import logging
import os
from importlib.util import find_spec

from omegaconf import DictConfig

from rgb.core.errors import UserError
from rgb.core.machine import resolve_device

log = logging.getLogger("rgb.serve")


class ServeExtraMissing(UserError, ImportError):
    """rgb-serve's server framework is not installed (one line: the pip command)."""


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
                         Limits(**dict(cfg.limits)), cfg.get("batch_dir"))
    log.info("serving %s as model %r at %s/chat/completions (Ctrl-C stops)", cfg.run, server.served_name,
             server.base_url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        log.info("stopped after %d requests", server.requests.count())
        server.server_close()
