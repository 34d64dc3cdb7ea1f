"""A package's names imported on first use (PEP 562), so that importing one module of a package (an option type that
a command's schema reads before torch loads) does not import the whole package with it. Plain Python."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from types import ModuleType


class _PackageWithSameNamedSubmodules(ModuleType):
    """A lazy package one of whose names is also its submodule's (`rgb.attacks.square`, the function of module
    `rgb.attacks.square`): importing that submodule binds the module on the package, which would hide the name from
    `__getattr__`; the name is bound instead, as an eager `from rgb.attacks.square import square` left it."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, ModuleType) and value.__name__ == f"{self.__name__}.{name}" \
                and name in self.__dict__.get("_same_named_submodules", ()):
            value = getattr(value, name)
        super().__setattr__(name, value)


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """The `__getattr__` of `package`: each name of `names` read from its module when first asked for; any other
    public name is a submodule (`rgb.runs.store` after `import rgb.runs`, as an eager __init__ gave it)."""

    def __getattr__(name: str):
        if name in names:
            value = getattr(import_module(names[name]), name)
        elif not name.startswith("_"):
            try:
                value = import_module(f"{package}.{name}")
            except ModuleNotFoundError as missing:
                if missing.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    same_named = {name for name, module in names.items() if module == f"{package}.{name}"}
    if same_named:
        module = sys.modules[package]
        module._same_named_submodules = frozenset(same_named)
        module.__class__ = _PackageWithSameNamedSubmodules
    return __getattr__
