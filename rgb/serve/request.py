"""What rgb-serve is asked to serve, and how: `ServeRequest` (with its `Limits` and `Faults` sections), declared
once, as AttackOptions and RequestCaps are: a setting is its field here, whose metadata `rule` is both what the
request checks when made and what conf/serve.yaml's schema checks before anything runs (`ServeRequest.rules()`);
the command builds the request from the YAML by field name. So a new server option is its field here and its key in
conf/serve.yaml. Plain Python (no FastAPI, no torch): the command's schema reads it without the `[serve]` extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from rgb.core.errors import UserError
from rgb.core.values import (
    EXISTING_RUN,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    TEXT,
    Rule,
    integer,
    optional,
    problems,
)

PORT: Rule = (lambda v: integer(v) and 0 <= v <= 65535, "an integer from 0 (any free one) to 65535")
DIRECTORY: Rule = (lambda v: isinstance(v, str | Path) and bool(str(v).strip()), "a directory path")
RUN: Rule = (lambda v: isinstance(v, str | Path) and EXISTING_RUN[0](str(v)), EXISTING_RUN[1])


class ServeError(UserError, ValueError):
    """A model or setting rgb-serve cannot serve (one line)."""


def _setting(default=None, rule: Rule | None = None, **kwargs):
    return field(default=default, metadata={"rule": rule} if rule else {}, **kwargs)


def _section(kind):
    return field(default_factory=kind, metadata={"section": kind})


class _Ruled:
    """The rules of a settings dataclass, read off its fields' metadata (a section's under its prefix), and the
    check every one of them runs when made."""

    @classmethod
    def rules(cls, prefix: str = "") -> dict[str, Rule]:
        """{dotted key: its rule}: what the dataclass checks when made and what the command checks first."""
        found = {}
        for f in fields(cls):
            if "section" in f.metadata:
                found |= f.metadata["section"].rules(f"{prefix}{f.name}.")
            elif "rule" in f.metadata:
                found[prefix + f.name] = f.metadata["rule"]
        return found

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def _check(self, prefix: str = "") -> None:
        """ServeError naming each value that breaks its rule, by its key in conf/serve.yaml."""
        values = {prefix + f.name: getattr(self, f.name) for f in fields(self) if "rule" in f.metadata}
        found = problems(values, type(self).rules(prefix))
        if found:
            raise ServeError("; ".join(found))


@dataclass(frozen=True)
class Faults(_Ruled):
    """Misbehaviour on every k-th request (0: never), counted over all requests; the first that applies wins."""

    rate_limit_every: int = _setting(0, NON_NEGATIVE_INT)  # 429 with Retry-After: retry_after_s
    retry_after_s: float = _setting(1.0, NON_NEGATIVE)
    error_every: int = _setting(0, NON_NEGATIVE_INT)  # 500
    slow_every: int = _setting(0, NON_NEGATIVE_INT)  # answer after slow_s seconds
    slow_s: float = _setting(2.0, NON_NEGATIVE)
    malformed_every: int = _setting(0, NON_NEGATIVE_INT)  # 200 whose answer names no class

    def __post_init__(self):
        self._check("faults.")

    def pick(self, number: int) -> str | None:
        """The fault request `number` gets (None: an honest answer)."""
        for name, every in (("rate_limit", self.rate_limit_every), ("error", self.error_every),
                            ("slow", self.slow_every), ("malformed", self.malformed_every)):
            if every and number % every == 0:
                return name
        return None


@dataclass(frozen=True)
class Limits(_Ruled):
    """Requests worked on at once, and how many more may wait for a turn (beyond both: 429)."""

    max_concurrency: int = _setting(8, POSITIVE_INT)
    max_queue: int = _setting(1024, NON_NEGATIVE_INT)

    def __post_init__(self):
        self._check("limits.")


@dataclass(frozen=True)
class ServeRequest(_Ruled):
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

    run: str | Path | None = _setting(None, optional(RUN))
    host: str = _setting("127.0.0.1", TEXT)
    port: int = _setting(0, PORT)
    served_name: str | None = _setting(None, optional(TEXT))
    api_key: str | None = _setting(None, optional(TEXT), repr=False)
    device: str = _setting("cpu", TEXT)
    image_size: int | None = _setting(None, optional(POSITIVE_INT))
    batch_dir: str | Path | None = _setting(None, optional(DIRECTORY))
    log_interval_s: float = _setting(10.0, NON_NEGATIVE)
    limits: Limits = _section(Limits)
    faults: Faults = _section(Faults)

    def __post_init__(self):
        for f in fields(self):  # a section given as its mapping (the YAML's) becomes its type
            if "section" in f.metadata and isinstance(value := getattr(self, f.name), dict):
                object.__setattr__(self, f.name, f.metadata["section"](**value))
        self._check()
