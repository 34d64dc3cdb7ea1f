"""One way to declare an option: a dataclass field carrying its rule (`ruled`), or a section of such fields
(`section`), and the mixin `Ruled` that reads them. The rule is both what the type checks when made and what a
command's schema checks before anything runs (`rules`), and a command builds the type from its config by field name
(`from_config`): a new option is its field and its key in the YAML.

A field's metadata (a `ruled` field is read from the config; a plain field is built by the command):
  - `rule`: its value's rule (rgb.core.values);
  - `key`: its dotted key in the config when not `<prefix><name>` (a train section field read from a top-level key);
  - `identity`: False when the key may change between starts of one run (rgb.commands.train_config); types that
    record identity otherwise (AttackOptions) give it their own values;
  - `convert`: applied to a config value that is not None (`Path`, `tuple`) when built by `from_config`;
  - `section`: a nested Ruled type whose keys sit under the field's name (or under `key`; "" for the top level).
Plain Python: no Hydra, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, field, fields

from rgb.core.values import ConfigValueError, Rule, problems

_ABSENT = object()


def ruled(default=MISSING, rule: Rule | None = None, *, default_factory=MISSING, repr: bool = True, **metadata):
    """A dataclass field whose metadata carries `rule` and the rest of `metadata` (see the module)."""
    meta = {"option": True, **({"rule": rule} if rule else {}), **metadata}
    return field(default=default, default_factory=default_factory, repr=repr, metadata=meta)


def section(kind: type, *, default: bool = True, key: str | None = None, **metadata):
    """A field holding a Ruled `kind` whose keys sit under the field's name (`key`: elsewhere; "" the top level);
    `default`: made from its own defaults when not given."""
    meta = {"section": kind, **({} if key is None else {"key": key}), **metadata}
    return field(default_factory=kind, metadata=meta) if default else field(metadata=meta)


def _key(f, prefix: str) -> str:
    return f.metadata["key"] if "key" in f.metadata else prefix + f.name


def _section_prefix(f, prefix: str) -> str:
    key = _key(f, prefix)
    return f"{key}." if key else ""


def _is_option(f) -> bool:
    """A field read from the config: a `ruled` one, or any carrying a rule."""
    return "option" in f.metadata or "rule" in f.metadata


def _select(config: dict, key: str):
    node = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


class Ruled:
    """The rules, names and config keys of a dataclass of `ruled` fields (and `section`s), and its one check."""

    @classmethod
    def rules(cls, prefix: str = "") -> dict[str, Rule]:
        """{dotted key: its rule}: what the type checks when made and what a command's schema checks first."""
        found = {}
        for f in fields(cls):
            if "section" in f.metadata:
                found |= f.metadata["section"].rules(_section_prefix(f, prefix))
            elif "rule" in f.metadata:
                found[_key(f, prefix)] = f.metadata["rule"]
        return found

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The fields' names, in order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def keys(cls, prefix: str = "", identity: bool | None = None) -> tuple[str, ...]:
        """The dotted config keys the type reads (`identity` False: only those declared not part of a run's
        identity)."""
        found = []
        for f in fields(cls):
            if "section" in f.metadata:
                found += f.metadata["section"].keys(_section_prefix(f, prefix), identity)
            elif _is_option(f) and (
                    identity is None or f.metadata.get("identity", True) == identity):
                found.append(_key(f, prefix))
        return tuple(found)

    @classmethod
    def from_config(cls, config: dict, prefix: str = "", **built):
        """The type made from `config` (nested mappings): each ruled field from its key when present, each
        section likewise; `built` gives the fields that are no config value (factories, objects; a section's as a
        dict of its own)."""
        values = {}
        for f in fields(cls):
            if "section" in f.metadata and (f.name not in built or isinstance(built[f.name], dict)):
                inner = built.pop(f.name, {})  # a section's own built fields
                values[f.name] = f.metadata["section"].from_config(config, _section_prefix(f, prefix), **inner)
            elif f.name in built:
                continue
            elif _is_option(f):
                value = _select(config, _key(f, prefix))
                if value is not _ABSENT:
                    convert = f.metadata.get("convert")
                    values[f.name] = convert(value) if convert and value is not None else value
        return cls(**values, **built)

    def values(self, prefix: str = "") -> dict:
        """{dotted key: value} of the ruled fields, its sections' included."""
        found = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if "section" in f.metadata and isinstance(value, Ruled):
                found |= value.values(_section_prefix(f, prefix))
            elif "rule" in f.metadata:
                found[_key(f, prefix)] = value
        return found

    def problems(self, prefix: str = "") -> list[str]:
        """`key must be <rule>, got <value>` for each ruled value that breaks its rule, by its config key."""
        return problems(self.values(prefix), type(self).rules(prefix))

    def check(self, prefix: str = "", error: type[Exception] = ConfigValueError, lead: str = "") -> None:
        """`error` naming each ruled value that breaks its rule, by its config key, in one line (after `lead`); a
        section given as its mapping (the YAML's) becomes its type first."""
        for f in fields(self):
            if "section" in f.metadata and isinstance(value := getattr(self, f.name), dict):
                object.__setattr__(self, f.name, f.metadata["section"](**value))
        found = self.problems(prefix)
        if found:
            raise error(lead + "; ".join(found))
