"""The public API's docstrings keep one layout (Google style, what users of timm and open_clip read): a summary line,
then `Args:` when it takes arguments, `Returns:` when it returns something, and `Raises:` when its body raises (never a
`Raises:` that says "Nothing"). A dataclass request lists every field under `Args:`, so a new field cannot go
undocumented. The front doors (`rgb.benchmark`, `rgb.load_model`, `rgb.AutoAttack`, `export_factory_model`) carry an
`Example:` that runs as written."""

from __future__ import annotations

import ast
import dataclasses
import doctest
import inspect
import io
import textwrap

import pytest

import rgb
from rgb.attacks.options import AttackOptions
from rgb.evaluation.run import EvalRequest, PoolRequest
from rgb.evaluation.text_robustness import TextRobustnessRequest
from rgb.evaluation.zeroshot_report import ZeroShotReportRequest
from rgb.models import chat, export_factory_model, openclip, timm_family, user_factory
from rgb.models.families import FAMILIES, ModelFamily
from rgb.runs.request import AttackRequest
from rgb.serve.request import ServeRequest
from rgb.training.request import TrainRequest

REQUEST_TYPES = [EvalRequest, PoolRequest, AttackRequest, TextRobustnessRequest, ZeroShotReportRequest, AttackOptions,
                 TrainRequest, ServeRequest]
FAMILY_CLASSES = [ModelFamily, timm_family.TimmFamily, openclip.OpenCLIPFamily, user_factory.FactoryFamily,
                  user_factory.InMemoryFamily, chat.ChatFamily]
FAMILY_METHODS = ("describe", "rebuild", "model_name", "num_classes", "head", "backbone")


def public_callables() -> dict[str, object]:
    """Every documented callable: rgb's __all__ (a class: itself and its public methods), the request types and
    the families' methods of the contract."""
    found: dict[str, object] = {}
    for name in rgb.__all__:
        value = getattr(rgb, name)
        if callable(value):
            found[f"rgb.{name}"] = value
            if inspect.isclass(value):
                for method, member in vars(value).items():
                    if not method.startswith("_") and inspect.isfunction(member):
                        found[f"rgb.{name}.{method}"] = member
    for cls in REQUEST_TYPES:
        found[cls.__qualname__] = cls
    found["AttackRequest.create"] = AttackRequest.create
    for cls in FAMILY_CLASSES:  # one instance each, made by its module: the class itself is not called by users
        for method in FAMILY_METHODS:
            found[f"{cls.__qualname__}.{method}"] = getattr(cls, method)
    return found


def documented(value) -> tuple[str, inspect.Signature]:
    """The docstring that documents how `value` is called, and its signature: a class's own `__init__` docstring when
    it has one, else the class's (dataclasses)."""
    if inspect.isclass(value):
        init = vars(value).get("__init__")
        if init is not None and init.__doc__:
            return inspect.cleandoc(init.__doc__), inspect.signature(init)
        return inspect.cleandoc(value.__doc__ or ""), inspect.signature(value)
    return inspect.cleandoc(value.__doc__ or ""), inspect.signature(value)


def takes_arguments(signature: inspect.Signature) -> bool:
    return any(name not in ("self", "cls") for name in signature.parameters)


def returns_something(value, signature: inspect.Signature) -> bool:
    """Classes return their instance (not documented); a function returns something unless annotated `-> None`."""
    if inspect.isclass(value):
        return False
    return signature.return_annotation not in (None, "None")


def raises_in_body(value) -> bool:
    """Whether the body that runs when `value` is called has a `raise`: a function's own, a class's `__init__` and
    `__post_init__` (a dataclass's generated `__init__` raises nothing of its own)."""
    if inspect.isclass(value):
        bodies = [vars(value).get("__post_init__")]
        if not dataclasses.is_dataclass(value):
            bodies.append(vars(value).get("__init__"))
        return any(raises_in_body(body) for body in bodies if body is not None)
    source = textwrap.dedent(inspect.getsource(value))
    return any(isinstance(node, ast.Raise) for node in ast.walk(ast.parse(source)))


def layout_problems(value) -> list[str]:
    doc, signature = documented(value)
    if not doc:
        return ["no docstring"]
    lines = doc.splitlines()
    problems = []
    if len(lines) > 1 and lines[1].strip():
        problems.append("the summary is not one line followed by a blank line")
    sections = {line.strip() for line in lines if line.strip().endswith(":") and not line.startswith(" ")}
    if takes_arguments(signature) and "Args:" not in sections:
        problems.append("no Args: section")
    if returns_something(value, signature) and "Returns:" not in sections:
        problems.append("no Returns: section")
    if raises_in_body(value) and "Raises:" not in sections:
        problems.append("its body raises but there is no Raises: section")
    first_raises = [lines[k + 1] for k, line in enumerate(lines[:-1]) if line.rstrip() == "Raises:"]
    if first_raises and first_raises[0].strip().startswith("Nothing"):
        problems.append("a Raises: section that says Nothing (leave it out)")
    return problems


@pytest.mark.parametrize("name", sorted(public_callables()))
def test_public_docstring_layout(name):
    assert layout_problems(public_callables()[name]) == [], name


@pytest.mark.parametrize("cls", [c for c in REQUEST_TYPES if dataclasses.is_dataclass(c)], ids=lambda c: c.__name__)
def test_request_fields_documented(cls):
    doc = documented(cls)[0]
    args = doc.split("Args:", 1)[1].split("\n\n", 1)[0]
    listed = {line.strip().split(":", 1)[0] for line in args.splitlines() if line.startswith("    ")
              and not line.startswith("     ")}
    assert {f.name for f in dataclasses.fields(cls)} - listed == set(), f"{cls.__name__}: fields missing from Args:"


@pytest.mark.parametrize("cls", FAMILY_CLASSES, ids=lambda c: c.__name__)
def test_family_summary(cls):
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    assert lines and (len(lines) == 1 or not lines[1].strip()), f"{cls.__name__}: no one-line summary"


def test_every_family_is_checked():
    assert {type(family) for family in FAMILIES.values()} <= set(FAMILY_CLASSES)


FRONT_DOORS = {"rgb.benchmark": lambda: rgb.benchmark, "rgb.load_model": lambda: rgb.load_model,
               "rgb.AutoAttack": lambda: rgb.AutoAttack, "rgb.models.export_factory_model": lambda: export_factory_model}


@pytest.mark.parametrize("name", sorted(FRONT_DOORS))
def test_front_doors_have_an_example_that_runs_as_written(name, mini_dir, tmp_path, monkeypatch):
    """Each `Example:` (the last section) runs in a fresh directory where `data/mini` is the mini benchmark, as
    after `make demo`, and prints what it says."""
    doc = documented(FRONT_DOORS[name]())[0]
    assert "\nExample:\n" in doc, f"{name}: no Example: section"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mini").symlink_to(mini_dir)
    example = doctest.DocTestParser().get_doctest(inspect.cleandoc(doc.split("\nExample:\n", 1)[1]), {}, name,
                                                  None, 0)
    assert example.examples, f"{name}: its Example: has no >>> lines"
    runner, out = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS), io.StringIO()
    runner.run(example, out=out.write)
    assert runner.failures == 0, out.getvalue()
