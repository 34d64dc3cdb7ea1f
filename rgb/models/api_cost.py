"""What an API model's answers cost in money: a price per million tokens (prompt, completion, cached prompt),
from the model config (`model.price`) or, when that is null, from a table of public prices (conf/prices.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

from rgb.core.values import NON_NEGATIVE, ConfigValueError, optional, problems

PER_TOKENS = 1_000_000


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


def model_price(configured: dict | None, api_model: str, table: dict) -> Price | None:
    """`model.price` when set, else the table's entry for `api_model` (None: unknown)."""
    return Price.of(configured if configured is not None else table.get(api_model))
