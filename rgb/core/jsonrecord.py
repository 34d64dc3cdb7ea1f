"""Dataclasses that go to JSON and back through one codec driven by their field types (scores records, class-wise
metrics): a new field reaches the file and the reader without further code."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, fields
from typing import Any, ClassVar

from rgb.core.errors import UserError


class RecordError(UserError, ValueError):
    """A scores record that cannot be read (another schema, a missing field)."""


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


def _decode(kind: Any, value: Any) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _decode(next(a for a in args if a is not type(None)), value)
    if value is None:
        return None
    if origin is dict:
        return {_decode(args[0], k): _decode(args[1], v) for k, v in value.items()}
    if origin in (list, tuple):
        return [_decode(args[0], v) for v in value]
    if isinstance(kind, type) and issubclass(kind, JsonRecord):
        return kind.from_json(value)
    if kind in (int, float):
        return kind(value)
    return value


class JsonRecord:
    """to_json / from_json for the dataclasses below; `DERIVED` properties are written too (for readers of the
    file) and recomputed, never trusted, when read back."""

    DERIVED: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict:
        out = {f.name: _encode(getattr(self, f.name)) for f in fields(self)}
        out.update({name: _encode(getattr(self, name)) for name in self.DERIVED})
        return out

    @classmethod
    def from_json(cls, data: dict):
        hints = typing.get_type_hints(cls)
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        absent = [name for name in required if name not in data]
        if absent:
            raise RecordError(f"{cls.__name__} record lacks {absent}")
        return cls(**{f.name: _decode(hints[f.name], data[f.name]) for f in fields(cls) if f.name in data})
