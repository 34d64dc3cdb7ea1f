"""The factory family: any user `nn.Module` on [0,1] images, rebuilt by calling `module:function(**kwargs)`; and the
`python` family of modules handed over in memory (rgb.benchmark), which records no way to rebuild them."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from torch import nn

from rgb.models.factory import ModelLoadError, ModelSpecError

REBUILD_HINT = ("to load it by path, export the module with rgb.models.export_factory_model(model, out_dir, "
                "factory='module:function') and pass that directory")


def resolve_factory(spec: str):
    """`"package.module:function"` -> the function, or one line saying what is wrong."""
    module_name, sep, function_name = str(spec).partition(":")
    if not sep or not module_name or not function_name:
        raise ModelSpecError(f"factory {spec!r} must be 'module:function' (e.g. 'mypkg.models:build')")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelSpecError(f"factory {spec!r}: cannot import {module_name!r} ({err})") from err
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ModelSpecError(f"factory {spec!r}: {module_name!r} has no callable {function_name!r}")
    return function


def build_from_factory(spec: str, kwargs: dict | None = None) -> nn.Module:
    model = resolve_factory(spec)(**(kwargs or {}))
    if not isinstance(model, nn.Module):
        raise ModelSpecError(f"factory {spec!r} returned {type(model).__name__}, not an nn.Module")
    return model


@dataclass(frozen=True)
class FactoryFamily:
    """The `factory` family: any user `nn.Module` on [0,1] images, rebuilt by calling `module:function(**kwargs)`.
    """

    name: str = "factory"
    weights: bool = True
    text_tower: bool = False

    def describe(self, model: nn.Module) -> dict:
        """Refused: factory models carry no recipe; `export_factory_model` is told the factory instead.

        Args:
            model: Any module.

        Returns:
            Never returns.

        Raises:
            ModelSpecError: Always, saying to export with `rgb.models.export_factory_model`.
        """
        raise ModelSpecError("a factory model is exported with rgb.models.export_factory_model(model, out_dir, factory=...)")

    def rebuild(self, record: dict) -> nn.Module:
        """The module `factory(**kwargs)` builds, weights not loaded.

        Args:
            record: A factory model.json (`factory`: "module:function", `kwargs`).

        Returns:
            The module the factory returns.

        Raises:
            ModelSpecError: The factory is not "module:function", does not import, is not callable, or returns no
                `nn.Module`.
        """
        return build_from_factory(record["factory"], record.get("kwargs") or {})

    def model_name(self, record: dict) -> str | None:
        """The record's `factory`.

        Args:
            record: A factory model.json.

        Returns:
            The "module:function" spec.
        """
        return record.get("factory")

    def num_classes(self, model: nn.Module) -> int:
        """The `out_features` of the model's `classifier`.

        Args:
            model: A factory model.

        Returns:
            The number of logits.

        Raises:
            ModelSpecError: The model has no `classifier` submodule, or it has no integer `out_features`.
        """
        classes = getattr(self.head(model), "out_features", None)
        if not isinstance(classes, int):
            raise ModelSpecError(f"factory model {type(model).__name__}: its `classifier` has no `out_features` (an "
                             "nn.Linear head says how many classes the model tells apart)")
        return classes

    def head(self, model: nn.Module) -> nn.Module:
        """The model's `classifier` submodule.

        Args:
            model: A factory model.

        Returns:
            The head module.

        Raises:
            ModelSpecError: The model declares no `classifier` submodule.
        """
        head = getattr(model, "classifier", None)
        if not isinstance(head, nn.Module):
            raise ModelSpecError(f"factory model {type(model).__name__} declares no head (a `classifier` submodule)")
        return head

    def backbone(self, model: nn.Module) -> nn.Module:
        """The whole module: a user model has no normalisation of ours outside it.

        Args:
            model: A factory model.

        Returns:
            `model` itself.
        """
        return model


FAMILY = FactoryFamily()


@dataclass(frozen=True)
class InMemoryFamily(FactoryFamily):
    """The `python` family: a module handed to rgb.benchmark in memory.

    Its export ties the results to the weights, but no code that rebuilds the module is recorded, so loading it by
    path says how to make an export that can be loaded. Otherwise as the factory family.
    """

    name: str = "python"

    def model_name(self, record: dict) -> str | None:
        """`module.Class` of the module handed over (rgb.benchmark records it as `name`).

        Args:
            record: A `python` model.json.

        Returns:
            The class's qualified name.
        """
        return record.get("name")

    def rebuild(self, record: dict) -> nn.Module:
        """Refused: no code that rebuilds the module is recorded.

        Args:
            record: A `python` model.json.

        Returns:
            Never returns.

        Raises:
            ModelLoadError: Always, saying how to make an export that can be loaded.
        """
        raise ModelLoadError(f"{record.get('name') or 'this model'} was handed to rgb.benchmark in memory and its "
                             f"export records no code to rebuild it; {REBUILD_HINT}")


IN_MEMORY_FAMILY = InMemoryFamily()
