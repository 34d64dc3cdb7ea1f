"""The commands' config schema, checked on the composed config before any work: every value that breaks its rule,
and every key the command's YAML does not have, is one line naming the key and what it may be.

A schema is a table {dotted key: rule} of `rgb.core.values` rules (types, enums `one_of`, lists `list_of`, paths
that must exist), one rule a line. Each command owns its table, `SCHEMA`, next to its request building
(rgb/commands/<command>.py; evaluate's reports add theirs); this module holds the sections several commands share
and the check. The YAML stays the owner of which keys exist: a key without a rule is still accepted (its own code
checks it), a key the YAML does not compose is refused with the closest one that it does.
"""

from __future__ import annotations

import difflib
import importlib
import re

from omegaconf import DictConfig, OmegaConf

from rgb.commands.resolvers import MACHINE_RESOLVERS
from rgb.core.values import (
    BOOL,
    EXISTING_RUN,
    DATA_LOADING,
    POSITIVE,
    TEXT,
    AUTO_OR_COUNT,
    ConfigValueError,
    Rule,
    flatten,
    optional,
    problems,
)

# The data config every command but rgb-serve reads.
DATA: dict[str, Rule] = {
    "data.budgets.*": POSITIVE, "data.transfer_budgets.*": POSITIVE,
    **{f"data.{key}": rule for key, rule in DATA_LOADING.items()},
}
# Where and how fast a command runs, and its W&B switch.
MACHINE: dict[str, Rule] = {"threads": AUTO_OR_COUNT, "device": TEXT}
WANDB: dict[str, Rule] = {"wandb.enabled": BOOL, "wandb.project": TEXT}
# The model a command loads: `run=` must name one that exists (never "does/not/exist.json not found" later).
RUN: dict[str, Rule] = {"run": EXISTING_RUN}


def command_schema(command: str) -> dict[str, Rule]:
    """The rules of conf/<command>.yaml: rgb.commands.<command>'s SCHEMA and those of the reports it runs instead
    (evaluate's REPORTS)."""
    module = importlib.import_module(f"rgb.commands.{command}")
    rules = dict(module.SCHEMA)
    for report, _ in getattr(module, "REPORTS", {}).values():
        rules.update(importlib.import_module(report).SCHEMA)
    return rules


def _values(cfg: DictConfig, rules: dict[str, Rule]) -> dict:
    """{dotted key: resolved value} of the keys the rules name (the rest of the config is not resolved here)."""
    flat = {}
    for key in rules:
        prefix = key.removesuffix(".*")
        node = OmegaConf.select(cfg, prefix, default=rules)  # `rules`: a marker for an absent (or missing) key
        if node is rules:
            continue
        value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        flat.update(flatten(value, prefix) if key.endswith(".*") else {key: value})
    return flat


def _machine_decided(cfg: DictConfig, key: str) -> bool:
    """Is the key's value a resolver's that asks the machine (rgb.commands.resolvers.MACHINE_RESOLVERS: torch)?"""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    raw = node._get_node(leaf)._value() if isinstance(node, DictConfig) and leaf in node.keys() else None
    return isinstance(raw, str) and any(f"${{{name}:" in raw for name in MACHINE_RESOLVERS)


def check(command: str, cfg: DictConfig) -> None:
    """ConfigValueError naming every value of the command's config that breaks its rule. The values the machine
    decides are resolved last, so that a mistake elsewhere is named before torch loads."""
    rules = command_schema(command)
    last = {key for key in rules if not key.endswith(".*") and _machine_decided(cfg, key)}
    for keys in ([k for k in rules if k not in last], [k for k in rules if k in last]):
        part = {key: rules[key] for key in keys}
        found = problems(_values(cfg, part), part)
        if found:
            raise ConfigValueError("invalid value: " + "; ".join(found))


# Hydra's refusal of `key=value` for a key the config has not: "Could not override 'key'".
_NOT_IN_CONFIG = re.compile(r"Could not override '([^']+)'")


def unknown_key(command: str, key: str, known: DictConfig) -> str:
    """The line for `key`, which the composed config `known` (the YAML and its groups) does not have: the closest
    key it has at that level, or all of them."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(known, parent) if parent else known
    keys = sorted(str(k) for k in node.keys() if k != "hydra") if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(leaf, keys, n=1, cutoff=0.6)
    where = f"{command}'s config" + (f" (under {parent})" if parent else "")
    hint = f"did you mean {'.'.join(filter(None, (parent, close[0])))}?" if close else f"its keys: {', '.join(keys)}"
    return f"unknown key {key}: {where} has no such key; {hint}"


def refused_override(error: Exception) -> str | None:
    """The key of Hydra's "Could not override" error (an override of a key the config has not), else None."""
    match = _NOT_IN_CONFIG.search(str(error))
    return match.group(1) if match else None


def added_keys(overrides: list[str], groups: set[str]) -> list[str]:
    """The keys `+key=` / `++key=` overrides add that are not config groups: each must be one the YAML has."""
    keys = []
    for override in overrides:
        key = override.split("=", 1)[0]
        if key.startswith("+") and key.lstrip("+") not in groups and "/" not in key and "@" not in key:
            keys.append(key.lstrip("+"))
    return keys


__all__ = ["DATA", "MACHINE", "RUN", "WANDB", "added_keys", "check", "command_schema", "refused_override",
           "unknown_key", "optional"]
