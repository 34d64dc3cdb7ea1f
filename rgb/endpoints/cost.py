"""What an API model's answers cost: a price per million tokens (prompt, completion, cached prompt), from the model
config (`model.price`) or, when that is null, from a table of public prices (conf/prices.yaml); and the tokens of a
request estimated without a tokenizer (evaluate.py dry_run, the caps' reservations, and rgb-serve's usage); what the
provider billed for an answer (`spent`: online or Batch rate, its prompt cache) beside its list price."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from rgb.core.values import NON_NEGATIVE, ConfigValueError, optional, problems

PER_TOKENS = 1_000_000
BATCH_RATE = 0.5  # the Batch API's share of the online price (OpenAI: half, cached input included)


@dataclass(frozen=True)
class Price:
    """USD per 1M tokens. `cached_input`: prompt tokens served from the provider's prompt cache (None: billed as
    input)."""

    input: float
    output: float
    cached_input: float | None = None

    def __post_init__(self):
        rules = {"input": NON_NEGATIVE, "output": NON_NEGATIVE, "cached_input": optional(NON_NEGATIVE)}
        found = problems({k: getattr(self, k) for k in rules}, rules)
        if found:
            raise ConfigValueError(f"invalid model.price: {found[0]} (USD per 1M tokens)")

    @classmethod
    def of(cls, value: dict | None) -> Price | None:
        """The price of a config mapping {input, output, cached_input?} (None: unknown)."""
        if value is None:
            return None
        unknown = set(value) - {"input", "output", "cached_input"}
        if unknown or not {"input", "output"} <= set(value):
            raise ConfigValueError(f"invalid model.price {dict(value)}: {{input: USD, output: USD, cached_input: USD "
                                   f"(optional)}} per 1M tokens, or null")
        return cls(**value)

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """USD of one or many requests; `cached_tokens` are part of `prompt_tokens`."""
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return ((prompt_tokens - cached_tokens) * self.input + cached_tokens * cached_rate
                + completion_tokens * self.output) / PER_TOKENS

    def billed(self, billed: dict) -> float:
        """USD the provider charges for a `billed_usage`: its prompt cache at `cached_input`, at the Batch rate
        when it came by a batch."""
        usd = self.cost(billed["prompt_tokens"], billed["completion_tokens"], billed["cached_tokens"])
        return usd * (BATCH_RATE if billed["batch"] else 1.0)

    def spent(self, record: dict) -> float:
        """USD an answer cache record was billed (every request it took); a record written before `billed` was
        kept: its usage, online, nothing cached."""
        return self.billed(record.get("billed") or billed_usage(record["usage"]))

    def list_cost(self, record: dict) -> float:
        """USD of an answer cache record at list price: its answer's tokens online, no prompt cache."""
        return self.cost(record["usage"]["prompt_tokens"], record["usage"]["completion_tokens"])


def billed_usage(usage: dict | None, batch: bool = False) -> dict:
    """What the provider bills for one response, from its OpenAI `usage`: prompt and completion tokens, the prompt
    tokens its prompt cache served (`prompt_tokens_details.cached_tokens`), and whether by the Batch API."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0),
            "cached_tokens": int(details.get("cached_tokens") or 0), "batch": batch}


def combined(first: dict, second: dict) -> dict:
    """The `billed_usage` of two requests for one answer (a cut answer asked again)."""
    return {k: second[k] if k == "batch" else first[k] + second[k] for k in first}


def model_price(configured: dict | None, api_model: str, table: dict) -> Price | None:
    """`model.price` when set, else the table's entry for `api_model` (None: unknown)."""
    return Price.of(configured if configured is not None else table.get(api_model))


def text_tokens(text: str) -> int:
    """Tokens of a text, tokenizer-free: ceil(characters / 4), OpenAI's rule of thumb for English."""
    return math.ceil(len(text) / 4)


def image_tokens(width: int, height: int, detail: str = "auto") -> int:
    """OpenAI's published GPT-4o image cost: 85 with detail low, else 85 + 170 per 512-px tile of the image
    fitted into 2048x2048, then its shorter side into 768 (downscaling only)."""
    if detail == "low":
        return 85
    scale = min(1.0, 2048 / max(width, height), 768 / min(width, height))
    return 85 + 170 * math.ceil(width * scale / 512) * math.ceil(height * scale / 512)


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) of a PNG from its IHDR chunk, without decoding it."""
    return struct.unpack(">II", png[16:24])
