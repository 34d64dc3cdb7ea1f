"""The house's layers, read from the imports themselves, every one of them (at module level, inside functions,
under TYPE_CHECKING): no package of rgb imports one above its own, and no module of rgb imports itself back
through others (an import cycle).

The table is the one place the allowed arrows are written down, each one in use; docs/design.md draws the same
picture.
Also: no test module imports another test module (shared functions live in tests/helpers.py, shared fixtures in
tests/conftest.py), and no benchmark imports from tests/.
"""

import ast
import sys
from pathlib import Path

import pytest
from helpers import RGB, TESTS


# Each package and the rgb packages it may import (the top-level `rgb` package, which holds only the version and
# lazy names, may be imported from anywhere).
ALLOWED = {
    "core": set(),
    "data": {"core"},
    # the chat-completions protocol (client, cache, prices, Batch, answer parser), apart from any model
    "endpoints": {"core"},
    "models": {"core", "data", "endpoints"},
    "attacks": {"core"},
    "zeroshot": {"core", "data", "models"},
    "brittleness": {"core"},
    "runs": {"core", "data", "models", "attacks"},
    "training": {"core", "data", "endpoints", "models", "attacks", "zeroshot"},
    "evaluation": {"core", "data", "endpoints", "models", "zeroshot", "brittleness", "runs"},
    # an entry room: rgb-serve's server (a ServeRequest), imported by the command layer, never importing it but
    # through its door (`python -m rgb.serve`)
    "serve": {"core", "data", "endpoints", "models"},
    # the command layer: the console scripts' mains and each command's config half
    "commands": {"core", "data", "endpoints", "models", "attacks", "zeroshot", "brittleness", "runs", "training",
                 "evaluation", "serve"},
}
# The doors: modules a user or `python -m` enters by, which may import any layer (the command layer included) and
# which no module of rgb imports but the top-level package's lazy names: rgb/api.py (`rgb.benchmark`) and each
# package's __main__.py (`python -m rgb.serve` imports its command plainly).
DOORS = ("api.py", "*/__main__.py")
# Hydra and OmegaConf live at the edge: rgb/commands/ (each command's config becomes one typed request) and the
# thin train.py / attack.py / evaluate.py outside rgb/.
CONFIG_PACKAGE = "rgb/commands/"


def _package_of(path: Path) -> str:
    relative = path.relative_to(RGB).with_suffix("")
    return relative.parts[0]


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    """(rgb package, line) for every import of rgb in the file, relative imports resolved."""
    module_parts = ("rgb",) + path.relative_to(RGB).with_suffix("").parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module_parts[: len(module_parts) - node.level]
                names = [".".join(base + ((node.module,) if node.module else ()))]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "rgb" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


def _is_door(path: Path) -> bool:
    relative = path.relative_to(RGB)
    return relative == Path("__init__.py") or any(relative.match(door) for door in DOORS)


def _package_arrows() -> dict[tuple[str, str], list[str]]:
    """{(package, imported package): ["path:line", ...]} of every import of one rgb package by another (a door's
    imports are no arrows: it is no layer's)."""
    arrows = {}
    for path in sorted(RGB.rglob("*.py")):
        if _is_door(path):
            continue
        package = _package_of(path)
        for imported, line in _imported_packages(path):
            if imported != package:
                arrows.setdefault((package, imported), []).append(f"{path.relative_to(RGB.parent)}:{line}")
    return arrows


def _violations() -> list[str]:
    bad = []
    for path in sorted(RGB.rglob("*.py")):
        if path.parent == RGB and _is_door(path):
            continue
        package = _package_of(path)
        if package not in ALLOWED:
            bad.append(f"{path.relative_to(RGB.parent)}: package {package!r} is not in the layer table")
    for (package, imported), places in sorted(_package_arrows().items()):
        if package in ALLOWED and imported not in ALLOWED[package]:
            bad += [f"{place} ({package}) imports rgb.{imported}" for place in sorted(places)]
    return bad


def test_no_package_imports_a_layer_above_its_own():
    assert _violations() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: an attack module importing rgb.evaluation is reported."""
    fake = tmp_path / "rgb"
    (fake / "attacks").mkdir(parents=True)
    (fake / "attacks" / "bad.py").write_text("from rgb.evaluation import records\nfrom . import common\n")
    monkeypatch.setattr(sys.modules[__name__], "RGB", fake)
    assert _violations() == ["rgb/attacks/bad.py:1 (attacks) imports rgb.evaluation"]


def test_a_door_may_import_the_command_layer_the_same_import_elsewhere_is_an_arrow_up(tmp_path, monkeypatch):
    fake = tmp_path / "rgb"
    (fake / "serve").mkdir(parents=True)
    (fake / "serve" / "__main__.py").write_text("from rgb.commands.main import serve_main\n")
    (fake / "serve" / "app.py").write_text("from rgb.commands import main\n")
    monkeypatch.setattr(sys.modules[__name__], "RGB", fake)
    assert _violations() == ["rgb/serve/app.py:1 (serve) imports rgb.commands"]


def test_no_module_imports_a_door_but_the_top_level_package():
    doors = {_module_name(path) for path in RGB.rglob("*.py") if _is_door(path) and path.name != "__init__.py"}
    assert "rgb.serve.__main__" in doors
    assert sorted(f"{module} imports {target}" for module, targets in _module_graph().items() if module != "rgb"
                  for target in targets if target in doors) == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_every_layer_is_a_package(package):
    assert (RGB / package / "__init__.py").is_file()


def test_every_allowed_arrow_is_in_use():
    """The table says what the layers do, not what they might: an arrow no import uses is left out."""
    used = set(_package_arrows())
    assert sorted((package, imported) for package, allowed in ALLOWED.items() for imported in allowed
                  if (package, imported) not in used) == []


# -- import cycles: no module of rgb imports itself back, through any import ----------------------------------


def _module_name(path: Path) -> str:
    parts = ("rgb",) + path.relative_to(RGB).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _every_import(tree: ast.Module):
    """Every import of the module: at module level, inside functions (deferred, yet an arrow all the same) and
    under `if TYPE_CHECKING:` (an annotation's dependency is a dependency)."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def _module_graph() -> dict[str, list[str]]:
    """{rgb module: the rgb modules it imports, by any import} (`from rgb.a import b` names module rgb.a.b when
    there is one, else rgb.a; relative imports resolved)."""
    modules = {_module_name(path): path for path in sorted(RGB.rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in _every_import(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
                continue
            base = node.module
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = sorted(t for t in targets if t in modules and t != name)
    return graph


def _cycles() -> list[str]:
    """Each import cycle, as `a -> b -> a` (found by a depth-first walk)."""
    graph, state, found = _module_graph(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "on the path"
        path.append(module)
        for imported in graph[module]:
            if state.get(imported) == "on the path":
                found.append(" -> ".join(path[path.index(imported):] + [imported]))
            elif imported not in state:
                visit(imported, path)
        path.pop()
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [])
    return found


def test_no_import_cycle():
    assert _cycles() == []


def test_the_check_sees_an_import_cycle(tmp_path, monkeypatch):
    """The checker itself: a cycle through a relative import is reported, and so are those closed by an import
    deferred into a function or made under TYPE_CHECKING."""
    fake = tmp_path / "rgb"
    (fake / "data").mkdir(parents=True)
    (fake / "data" / "__init__.py").write_text("")
    (fake / "data" / "a.py").write_text("from rgb.data.b import f\n")
    (fake / "data" / "b.py").write_text("from . import c\n")
    (fake / "data" / "c.py").write_text("import rgb.data.a\n")
    (fake / "data" / "d.py").write_text("def g():\n    from rgb.data import e\n")
    (fake / "data" / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from rgb.data.d import g\n")
    monkeypatch.setattr(sys.modules[__name__], "RGB", fake)
    assert _cycles() == ["rgb.data.a -> rgb.data.b -> rgb.data.c -> rgb.data.a",
                         "rgb.data.d -> rgb.data.e -> rgb.data.d"]


def _api_names(root: Path) -> list[str]:
    """Modules and packages of rgb whose name says "api" other than rgb/api.py (the public `rgb.benchmark` door):
    the chat-completions protocol is rgb.endpoints, its model family rgb.models.chat."""
    return sorted({str(p.relative_to(root.parent)) for p in root.rglob("*.py")
                   if "api" in str(p.relative_to(root).with_suffix("")) and p != root / "api.py"})


def test_only_rgb_api_says_api_in_its_name():
    assert _api_names(RGB) == []


def test_the_check_sees_a_module_named_api(tmp_path):
    (tmp_path / "rgb" / "models").mkdir(parents=True)
    for name in ("api.py", "models/api_client.py", "models/chat.py"):
        (tmp_path / "rgb" / name).write_text("")
    assert _api_names(tmp_path / "rgb") == ["rgb/models/api_client.py"]


# -- tests/ and benchmarks/: test modules import no test module and no benchmark; benchmarks nothing of tests/ ---

BENCHMARKS = TESTS.parent / "benchmarks"


def _top_level_imports(path: Path) -> set[tuple[str, int]]:
    """(top-level module, line) of every absolute import in the file, at any depth (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def _cross_imports(tests: Path, benchmarks: Path) -> list[str]:
    """A file of tests/ importing a test module (`test_*`), conftest (shared fixtures come from conftest by
    name, shared functions from helpers) or a benchmark script (what both use is in rgb; a script is tested as
    a user runs it), and a file of benchmarks/ importing any module of tests/."""
    bad = []
    of_benchmarks = {p.stem for p in benchmarks.glob("*.py")}
    for path in sorted(tests.glob("*.py")):
        for module, line in sorted(_top_level_imports(path), key=lambda found: found[1]):
            if module.startswith("test_") or module == "conftest":
                bad.append(f"{path.parent.name}/{path.name}:{line} imports {module}")
            elif module in of_benchmarks:
                bad.append(f"{path.parent.name}/{path.name}:{line} imports {module} of benchmarks/")
    of_tests = {p.stem for p in tests.glob("*.py")}
    for path in sorted(benchmarks.glob("*.py")):
        for module, line in sorted(_top_level_imports(path), key=lambda found: found[1]):
            if module in of_tests:
                bad.append(f"{path.parent.name}/{path.name}:{line} imports {module} of tests/")
        if "/ \"tests\"" in path.read_text():
            bad.append(f"{path.parent.name}/{path.name} puts tests/ on its path")
    return bad


def test_no_test_module_imports_another_and_no_benchmark_imports_tests():
    assert _cross_imports(TESTS, BENCHMARKS) == []


def test_the_check_sees_a_test_importing_a_test_and_a_benchmark_importing_tests(tmp_path):
    tests, benchmarks = tmp_path / "tests", tmp_path / "benchmarks"
    tests.mkdir()
    benchmarks.mkdir()
    (tests / "helpers.py").write_text("X = 1\n")
    (tests / "test_a.py").write_text("import os\n\n\ndef test_x():\n    from test_b import y\n")
    (tests / "test_b.py").write_text("from helpers import X\nfrom conftest import REPO\ny = X\n\n\n"
                                     "def test_y():\n    from bench import main\n")
    (benchmarks / "bench.py").write_text("import json\nfrom helpers import X\n")
    assert _cross_imports(tests, benchmarks) == [
        "tests/test_a.py:5 imports test_b", "tests/test_b.py:2 imports conftest",
        "tests/test_b.py:7 imports bench of benchmarks/", "benchmarks/bench.py:2 imports helpers of tests/"]


def _config_imports(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n.split(".")[0] in ("hydra", "omegaconf") for n in names):
            lines.append(node.lineno)
    return lines


def test_hydra_only_at_the_edges():
    """No library module (attacks, models, the attack runner, rgb.benchmark, ...) imports Hydra or OmegaConf."""
    found = {str(p.relative_to(RGB.parent)): _config_imports(p) for p in sorted(RGB.rglob("*.py"))}
    assert {name: lines for name, lines in found.items() if lines and not name.startswith(CONFIG_PACKAGE)} == {}



def _config_calls(path: Path) -> list[int]:
    """Lines that compose or instantiate a config (`OmegaConf.merge`, `instantiate(`, however imported): the
    commands' job, so a library function takes the typed value the command built."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            owner = getattr(called.value, "id", "") if isinstance(called, ast.Attribute) else ""
            if name == "instantiate" or (owner == "OmegaConf" and name == "merge"):
                lines.append(node.lineno)
    return lines


def test_no_config_composed_or_instantiated_below_the_commands():
    found = {str(p.relative_to(RGB.parent)): _config_calls(p) for p in sorted(RGB.rglob("*.py"))}
    assert {name: lines for name, lines in found.items() if lines and not name.startswith(CONFIG_PACKAGE)} == {}
    assert any(found[name] for name in found if name.startswith(CONFIG_PACKAGE))  # the check sees the commands' own


def test_the_check_sees_a_config_composed_or_instantiated(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import hydra\nfrom omegaconf import OmegaConf\n\nc = OmegaConf.merge({}, {})\n"
                    "m = hydra.utils.instantiate(c)\nOmegaConf.create({})\n")
    assert _config_calls(path) == [4, 5]

# -- tests that start processes are marked slow (RGB_FAST=1 skips them) --------------------------------------

# What starts a process, as names in code: a subprocess, a multiprocessing context or process, the interpreter.
PROCESS_NAMES = {"subprocess", "Popen", "multiprocessing"}
PROCESS_ATTRIBUTES = {"Popen", "get_context", "Process", "executable"}


def _starts_process(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id in PROCESS_NAMES
               or isinstance(n, ast.Attribute) and n.attr in PROCESS_ATTRIBUTES for n in ast.walk(node))


def _unmarked_process_tests(path: Path) -> list[str]:
    """Test functions of `path` that start a process, themselves or through a function or fixture of the same
    module, without the slow mark (their own or the module's `pytestmark`)."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    starting = {name for name, node in functions.items() if _starts_process(node)}
    while True:  # through the module's own helpers and fixtures, by name (calls and fixture arguments)
        more = {name for name, node in functions.items() if name not in starting
                and ({n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                     | {a.arg for a in node.args.args}) & starting}
        if not more:
            break
        starting |= more
    module_slow = any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
                      and "slow" in ast.get_source_segment(source, node) for node in tree.body)
    return [f"{path.name}:{node.lineno} {name}" for name, node in functions.items()
            if name.startswith("test_") and name in starting and not module_slow
            and not any("mark.slow" in ast.get_source_segment(source, d) for d in node.decorator_list)]


def test_tests_that_start_processes_are_marked_slow():
    assert [found for path in sorted(TESTS.glob("test_*.py")) for found in _unmarked_process_tests(path)] == []


def test_the_check_sees_an_unmarked_test_that_starts_a_process(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text("import subprocess\nimport pytest\n\n\ndef started():\n    return subprocess.run(['true'])\n\n\n"
                    "@pytest.fixture\ndef server():\n    return started()\n\n\ndef test_a(server):\n    pass\n\n\n"
                    "@pytest.mark.slow\ndef test_b():\n    started()\n\n\ndef test_c():\n    pass\n")
    assert _unmarked_process_tests(path) == ["test_x.py:14 test_a"]
