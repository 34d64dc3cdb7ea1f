"""rgb-serve's config half: conf/serve.yaml made into a `ServeRequest` (rgb.serve.request) by field name, the API
key read from the environment variable the config names, and the server run until interrupted."""

from __future__ import annotations

import logging
import os
from importlib.util import find_spec

from omegaconf import DictConfig

from rgb.commands.schema import MACHINE, RUN
from rgb.core.errors import UserError
from rgb.core.values import TEXT, optional
from rgb.serve.request import ServeError, ServeRequest

log = logging.getLogger("rgb.serve")


class ServeExtraMissing(UserError, ImportError):
    """rgb-serve's server framework is not installed (one line: the pip command)."""


# conf/serve.yaml's schema (rgb.commands.schema): the request's own rules, `run=` as every command checks it, and
# the one key that is no field of the request (the key's variable; the request holds the key itself).
SCHEMA = {**MACHINE, **ServeRequest.rules(), **RUN, "api_key_env": optional(TEXT)}


def serve_request(cfg: DictConfig) -> ServeRequest:
    """The request conf/serve.yaml's values make, each key to the field of its name."""
    from rgb.core.machine import resolve_device  # torch: not before the config is checked

    key_env = cfg.get("api_key_env")
    key = os.environ.get(str(key_env)) if key_env else None
    if key_env and not key:
        raise ServeError(f"api_key_env={key_env} is set but the environment has no {key_env}")
    return ServeRequest.from_config(cfg, run=str(cfg.run), device=resolve_device(str(cfg.device)), api_key=key)


def serve_from_config(cfg: DictConfig) -> None:
    """rgb-serve: serve `cfg.run` until interrupted."""
    if find_spec("fastapi") is None or find_spec("uvicorn") is None or find_spec("prometheus_client") is None:
        raise ServeExtraMissing("rgb-serve runs on FastAPI, uvicorn and prometheus_client: "
                                "pip install 'robustgenbench[serve]'")
    request = serve_request(cfg)
    from rgb.serve.app import make_server

    server = make_server(request)
    root = server.base_url.removesuffix("/v1")
    log.info("serving %s as model %r at %s/chat/completions (health: %s/health, metrics: %s/metrics; Ctrl-C stops)",
             cfg.run, server.served_name, server.base_url, root, root)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        log.info("stopped after %d requests", server.requests.count())
        server.server_close()
