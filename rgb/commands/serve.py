"""rgb-serve's config half: conf/serve.yaml's values handed to rgb.serve's server (the API key read from the
environment variable the config names)."""

from __future__ import annotations

import logging
import os

from omegaconf import DictConfig

from rgb.core.machine import resolve_device
from rgb.serve import Faults, ServeError, make_server

log = logging.getLogger("rgb.serve")


def serve_from_config(cfg: DictConfig) -> None:
    """rgb-serve: serve `cfg.run` until interrupted."""
    key = os.environ.get(str(cfg.api_key_env)) if cfg.get("api_key_env") else None
    if cfg.get("api_key_env") and not key:
        raise ServeError(f"api_key_env={cfg.api_key_env} is set but the environment has no {cfg.api_key_env}")
    server = make_server(str(cfg.run), str(cfg.host), int(cfg.port), str(cfg.served_name),
                         Faults(**dict(cfg.faults)), key, resolve_device(str(cfg.device)), cfg.get("image_size"))
    log.info("serving %s as model %r at %s/chat/completions (Ctrl-C stops)", cfg.run, server.served_name,
             server.base_url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopped after %d requests", server.requests.count())
    finally:
        server.server_close()
