"""What rgb-serve is asked to serve, and how: `ServeRequest` (with its `Limits` and `Faults` sections), declared
once, as every option type is (rgb.core.options): a setting is its field here, whose `rule` is both what the
request checks when made and what conf/serve.yaml's schema checks before anything runs (`ServeRequest.rules()`);
the command builds the request from the YAML by field name. So a new server option is its field here and its key in
conf/serve.yaml. Plain Python (no FastAPI, no torch): the command's schema reads it without the `[serve]` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rgb.core.errors import UserError
from rgb.core.options import Ruled, ruled, section
from rgb.core.values import (
    EXISTING_RUN,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    TEXT,
    Rule,
    integer,
    optional,
)

PORT: Rule = (lambda v: integer(v) and 0 <= v <= 65535, "an integer from 0 (any free one) to 65535")
DIRECTORY: Rule = (lambda v: isinstance(v, str | Path) and bool(str(v).strip()), "a directory path")
RUN: Rule = (lambda v: isinstance(v, str | Path) and EXISTING_RUN[0](str(v)), EXISTING_RUN[1])


class ServeError(UserError, ValueError):
    """A model or setting rgb-serve cannot serve (one line)."""


@dataclass(frozen=True)
class Faults(Ruled):
    """Misbehaviour on every k-th request (0: never), counted over all requests; the first that applies wins."""

    rate_limit_every: int = ruled(0, NON_NEGATIVE_INT)  # 429 with Retry-After: retry_after_s
    retry_after_s: float = ruled(1.0, NON_NEGATIVE)
    error_every: int = ruled(0, NON_NEGATIVE_INT)  # 500
    slow_every: int = ruled(0, NON_NEGATIVE_INT)  # answer after slow_s seconds
    slow_s: float = ruled(2.0, NON_NEGATIVE)
    malformed_every: int = ruled(0, NON_NEGATIVE_INT)  # 200 whose answer names no class

    def __post_init__(self):
        self.check("faults.", ServeError)

    def pick(self, number: int) -> str | None:
        """The fault request `number` gets (None: an honest answer)."""
        for name, every in (("rate_limit", self.rate_limit_every), ("error", self.error_every),
                            ("slow", self.slow_every), ("malformed", self.malformed_every)):
            if every and number % every == 0:
                return name
        return None


@dataclass(frozen=True)
class Limits(Ruled):
    """Requests worked on at once, and how many more may wait for a turn (beyond both: 429)."""

    max_concurrency: int = ruled(8, POSITIVE_INT)
    max_queue: int = ruled(1024, NON_NEGATIVE_INT)

    def __post_init__(self):
        self.check("limits.", ServeError)


@dataclass(frozen=True)
class ServeRequest(Ruled):
    """What `rgb-serve` serves and how, checked once when made.

    `make_server(request)` loads `run` and serves it; a `ModelServer` serves a model given to it (then `image_size`
    and `served_name` must be set, and `run` is not read).

    Args:
        run: The train output dir or exported .safetensors file to serve (`make_server`).
        host: The address to listen on (0.0.0.0: other machines too).
        port: The TCP port (0: any free one, see `ModelServer.base_url`).
        served_name: The `model` a request must name (else 404); None: the run's directory name.
        api_key: The key requests must carry as `Authorization: Bearer <key>` (None: none needed). Not shown by
            repr: it is a secret.
        device: Where the model runs.
        image_size: The side images are resized to; None: the model.json's.
        batch_dir: Where the Batch API's files are kept (None: a temporary directory).
        log_interval_s: A throughput line this often while busy (0: none).
        limits: Requests worked on at once and waiting (`Limits`).
        faults: Misbehaviour on purpose, to test clients (`Faults`).

    Raises:
        ServeError: A value outside its rule (one line naming the key, its rule and the value).
    """

    run: str | Path | None = ruled(None, optional(RUN))
    host: str = ruled("127.0.0.1", TEXT)
    port: int = ruled(0, PORT)
    served_name: str | None = ruled(None, optional(TEXT))
    api_key: str | None = ruled(None, optional(TEXT), repr=False)
    device: str = ruled("cpu", TEXT)
    image_size: int | None = ruled(None, optional(POSITIVE_INT))
    batch_dir: str | Path | None = ruled(None, optional(DIRECTORY))
    log_interval_s: float = ruled(10.0, NON_NEGATIVE)
    limits: Limits = section(Limits)
    faults: Faults = section(Faults)

    def __post_init__(self):
        self.check(error=ServeError)  # a section given as its mapping (the YAML's) becomes its type
