"""Rules for the numbers and names a user types into a config, checked in one place before anything runs: a bad
value is one line naming the key, the rule and the value (never a traceback from deep inside a command).

A rule is (predicate, what it says); `problems` checks a flat {dotted key: value} against {key: rule}; keys that
are absent are skipped (an absent key is the composition's to report). Plain Python: no Hydra, no torch.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from rgb.core.errors import UserError
from rgb.core.secrets import redact
from rgb.core.threat import parse_norm

Rule = tuple[Callable[[object], bool], str]

# The longest file name most filesystems take (ext4, xfs, btrfs: 255 bytes).
NAME_MAX = 255


class ConfigValueError(UserError, ValueError):
    """A config value that breaks its rule (or a name that would leave its output tree)."""


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


POSITIVE: Rule = (lambda v: number(v) and v > 0, "a finite number > 0")
NON_NEGATIVE: Rule = (lambda v: number(v) and v >= 0, "a finite number >= 0")
POSITIVE_INT: Rule = (lambda v: integer(v) and v >= 1, "an integer >= 1")
NON_NEGATIVE_INT: Rule = (lambda v: integer(v) and v >= 0, "an integer >= 0")
INT: Rule = (integer, "an integer")
BOOL: Rule = (lambda v: isinstance(v, bool), "true or false")
TEXT: Rule = (lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string")
FRACTION_OPEN: Rule = (lambda v: number(v) and 0 < v < 1, "a number in (0, 1)")
AUTO_OR_COUNT: Rule = (lambda v: v == "auto" or (integer(v) and v >= 1), "auto or an integer >= 1")


# How the data config's images are read, one table: BenchmarkData checks it when made, the commands' schemas under
# `data.` before anything runs.
DATA_LOADING: dict[str, Rule] = {"image_size": POSITIVE_INT, "batch_size": POSITIVE_INT,
                                 "eval_batch_size": POSITIVE_INT, "num_workers": NON_NEGATIVE_INT}


def _norm(value) -> bool:
    try:
        parse_norm(value)
    except ValueError:
        return False
    return True


NORM: Rule = (_norm, "Linf, L2 or L1 (any case)")


def one_of(choices) -> Rule:
    """An enum: one of `choices` (its text names them all)."""
    choices = tuple(choices)
    return (lambda v: isinstance(v, str) and v in choices, f"one of {', '.join(map(str, choices))}")


def list_of(rule: Rule) -> Rule:
    """A non-empty list (`[a,b]` on the command line; a tuple, as a frozen dataclass holds it) whose every item
    keeps `rule`: a bare string is refused, never iterated over as its characters."""
    ok, what = rule
    return (lambda v: isinstance(v, list | tuple) and bool(v) and all(ok(x) for x in v),
            f"a non-empty list ([a,b,...]), each {what}")


def _existing(value) -> bool:
    return isinstance(value, str | Path) and bool(str(value)) and Path(value).expanduser().exists()


EXISTING_PATH: Rule = (_existing, "an existing file or directory")
EXISTING_FILE: Rule = (lambda v: _existing(v) and Path(v).expanduser().is_file(), "an existing file")
# A model to load: a train run dir (model.safetensors + model.json) or an exported weights file (its record beside).
EXISTING_RUN: Rule = (_existing, "a run directory or exported .safetensors file that exists")


def flatten(node, prefix: str = "") -> dict:
    """{"a.b": leaf}; lists and empty mappings are leaves."""
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    flat = {}
    for key, value in node.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def optional(rule: Rule) -> Rule:
    ok, what = rule
    return (lambda v: v is None or ok(v), f"null or {what}")


class Unshown(tuple):
    """A rule whose broken value is named, never shown (`unshown`)."""


def unshown(rule: Rule) -> Rule:
    """`rule`, its broken value left out of the line: where a secret typed by mistake would sit (a token given for
    a variable's name, or for a whole mapping of headers)."""
    return Unshown(rule)


def problems(flat: dict, rules: dict[str, Rule]) -> list[str]:
    """`key must be <rule>, got <value>` for every key of `rules` (a dotted key, or `a.*`: every key under `a`)
    whose value in `flat` breaks its rule; the value shown redacted (rgb.core.secrets), and not at all for an
    `unshown` rule."""
    found = []
    for pattern, rule in rules.items():
        ok, what = rule
        keys = [k for k in flat if k.startswith(pattern[:-1])] if pattern.endswith(".*") else [pattern]
        found += [f"{key} must be {what}" + ("" if isinstance(rule, Unshown) else f", got {redact(flat[key])!r}")
                  for key in keys if key in flat and not ok(flat[key])]
    return found


def require(values: dict, rules: dict[str, Rule], error: type[UserError] = ConfigValueError) -> None:
    """Raise `error` naming every value of `values` that breaks its rule of `rules` (see `problems`), in one line."""
    found = problems(values, rules)
    if found:
        raise error("; ".join(found))


def unknown_name(what: str, name: str, known: list[str]) -> str:
    """`<what> 'name' is unknown; did you mean 'x'? known: a, b, c, ... (N)`: a name refused in one line, with
    the closest known one and a few of the others, never the whole list of a 196-class dataset."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = ", ".join(str(k) for k in known[:5]) + (f", ... ({len(known)} in all)" if len(known) > 5 else "")
    return f"{what} {name!r} is unknown; {hint}known: {shown}"


_UNSAFE = re.compile(r"[/\\\x00]")


def name_problem(name) -> str | None:
    """Why `name` cannot be one directory inside an output tree (None when it can)."""
    text = str(name)
    if not text.strip() or text in (".", "..") or _UNSAFE.search(text):
        return "it must be non-empty, not '.' or '..', and hold no '/', '\\' or NUL"
    if len(text.encode()) > NAME_MAX:
        return f"it is {len(text.encode())} bytes, longer than a file name may be ({NAME_MAX})"
    return None


PATH_NAME: Rule = (lambda v: name_problem(v) is None,
                   f"one directory name (non-empty, no '/', not '..', at most {NAME_MAX} bytes)")


def name_part(name) -> str:
    """A model name as a piece of a default run name: hub names hold '/' and ':' (`hf-hub:timm/vit_base`), which
    become `--` and `_` (`hf-hub_timm--vit_base`), the way the Hub cache spells a repo as one directory name."""
    return str(name).replace("/", "--").replace(":", "_")


def url_host(url) -> str:
    """The host (and port) of an endpoint URL, a piece of an API run's default name: one model name served by two
    endpoints gets two run dirs. Credentials a URL may carry (`user:key@host`) are left out of the name."""
    return urlsplit(str(url)).netloc.rpartition("@")[2] or str(url)


def path_name(name) -> str:
    """`name` when it is one directory name inside an output tree, else ConfigValueError: a run name must never
    write outside its tree (`../x`, `a/b`) nor fail deep inside a command for its length."""
    problem = name_problem(name)
    if problem:
        raise ConfigValueError(f"run name {shown_name(name)} cannot name a directory: {problem}; choose another "
                               f"run_name")
    return str(name)


def shown_name(name) -> str:
    """`name` quoted for a one-line message: its first 60 characters, any character that would not print (NUL, a
    combining accent) escaped, so that two names that look alike read apart."""
    text = str(name)
    return ascii(text if len(text) <= 60 else f"{text[:60]}...")
