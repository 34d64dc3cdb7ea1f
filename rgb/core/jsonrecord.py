"""Dataclasses that go to JSON and back through one codec driven by their field types (scores records, class-wise
metrics): a new field reaches the file and the reader without further code. Reading is strict: every JSON file rgb
reads back goes through `read_json` (a directory, invalid JSON or another kind of value than the file's is one
line naming the file and what to do) and every typed record through `decode` (a list where an object belongs, a
null, a string where a number belongs is named by its field, never coerced into a wrong number)."""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, ClassVar

from rgb.core.errors import UserError


class RecordError(UserError, ValueError):
    """A record that cannot be read (another schema, a missing field, a value of the wrong type)."""


def _kind_of(value: Any) -> str:
    """How a JSON value is named in a message ("a list", "null", "a string")."""
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def read_json(path: str | Path, error: type[Exception] = RecordError, fix: str = "write it again",
              kind: type = dict) -> Any:
    """The JSON value of the file `path`, a `kind` (an object unless told); anything else (absent, a directory, not
    UTF-8, invalid JSON, a list where an object belongs) raises `error` in one line naming the file and `fix`."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path} is a directory where a JSON file belongs; {fix}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"cannot read {path} ({getattr(err, 'strerror', None) or err}); {fix}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{path} is not valid JSON ({err.msg}: line {err.lineno} column {err.colno}); {fix}") from None
    if not isinstance(value, kind):
        raise error(f"{path} holds {_kind_of(value)} where {_kind_of(kind())} belongs; {fix}")
    return value


def load_record(cls, path: str | Path, error: type[Exception] = RecordError, fix: str = "write it again"):
    """`cls.from_json` of the JSON object in `path`; any malformation is `error` naming the file (and the field)."""
    data = read_json(path, error, fix)
    try:
        return cls.from_json(data)
    except (ValueError, TypeError) as err:  # RecordError, or a dataclass's own check (Accuracy's counts)
        raise error(f"{path}: {err}; {fix}") from None


def _encode(value: Any) -> Any:
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN: an absent class is null
    return value


def decode(kind: Any, value: Any, where: str = "value") -> Any:
    """`value` read as the type `kind` (a field's annotation), strictly: an int is an int (a float only when
    whole), a float any number, a str a string, a dict an object, a list a list, a JsonRecord its object; `where`
    (the field's path) names what is wrong."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:
            try:
                return decode(option, value, where)
            except RecordError:
                continue
        return decode(options[-1], value, where)
    if kind is Any or kind is object:
        return value
    expected = origin or kind
    if value is None:
        raise RecordError(f"{where} is null where {_expected(expected)} belongs")
    if expected is dict:
        _check(value, dict, where)
        key, item = args or (Any, Any)
        return {_key(key, k, where): decode(item, v, f"{where}.{k}") for k, v in value.items()}
    if expected in (list, tuple):
        _check(value, list, where)
        item = args[0] if args else Any
        return [decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(kind, type) and issubclass(kind, JsonRecord):
        _check(value, dict, where)
        return kind.from_json(value, f"{where}.")
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(kind, type):
        _check(value, kind, where)
    return value


def check_fields(value: Any, types: dict[str, Any], where: str = "", required: tuple[str, ...] = ()) -> dict:
    """`value` as an object whose keys named in `types` hold their types (those in `required` present): the check
    of a record kept as a dict (model.json, an answer cache line); RecordError names the field under `where`."""
    _check(value, dict, where or "the record")
    lacking = [k for k in required if k not in value]
    if lacking:
        raise RecordError(f"{where or 'the record'} lacks {', '.join(lacking)}")
    for name, kind in types.items():
        if name in value:
            decode(kind, value[name], f"{where}.{name}" if where else name)
    return value


def _key(kind: Any, key: str, where: str) -> Any:
    """An object's key as its type: JSON keys are strings, an int key ("3": a severity) is read back."""
    if kind is int:
        try:
            return int(key)
        except ValueError:
            raise RecordError(f"{where} has the key {key!r} where a whole number belongs") from None
    return key


def _expected(kind: type) -> str:
    return {int: "a number", float: "a number", str: "a string", bool: "a boolean", dict: "an object",
            list: "a list"}.get(kind, getattr(kind, "__name__", str(kind)))


def _check(value: Any, kind: type, where: str) -> None:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise RecordError(f"{where} is {_kind_of(value)} where {_expected(kind)} belongs")


class JsonRecord:
    """to_json / from_json for the dataclasses below; `DERIVED` properties are written too (for readers of the
    file) and recomputed, never trusted, when read back."""

    DERIVED: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict:
        out = {f.name: _encode(getattr(self, f.name)) for f in fields(self)}
        out.update({name: _encode(getattr(self, name)) for name in self.DERIVED})
        return out

    @classmethod
    def from_json(cls, data: dict, where: str = ""):
        """The record of `data`, its fields checked against their types (RecordError naming the field, prefixed
        with `where`, the record's place in the file)."""
        _check(data, dict, where.rstrip(".") or cls.__name__)
        hints = typing.get_type_hints(cls)
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        absent = [name for name in required if name not in data]
        if absent:
            raise RecordError(f"{where.rstrip('.') or cls.__name__} record lacks {absent}")
        return cls(**{f.name: decode(hints[f.name], data[f.name], f"{where}{f.name}") for f in fields(cls)
                      if f.name in data})
