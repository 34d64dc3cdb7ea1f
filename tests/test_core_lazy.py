"""Lazy package names (rgb.core.lazy) read as an eager __init__ gave them, whatever was imported first."""

import importlib
import sys

import pytest


@pytest.fixture
def package(tmp_path, monkeypatch):
    """`lazypkg`, whose lazy name `thing` is also its submodule's name (as `rgb.attacks.square`)."""
    root = tmp_path / "lazypkg"
    root.mkdir()
    (root / "__init__.py").write_text("from rgb.core.lazy import lazy_names\n"
                                      "__getattr__ = lazy_names(__name__, {'thing': 'lazypkg.thing', "
                                      "'other': 'lazypkg.parts'})\n")
    (root / "thing.py").write_text("def thing():\n    return 'the function'\n")
    (root / "parts.py").write_text("other = 'a value'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [name for name in sys.modules if name == "lazypkg" or name.startswith("lazypkg.")]:
        del sys.modules[name]


def test_a_name_shared_with_its_submodule_is_the_name_after_the_submodule_is_imported(package):
    """Importing the submodule first (`import rgb.attacks.square`, as a test file does) must not turn the package's
    `square` into the module: `from rgb.attacks import square` is the function either way."""
    module = importlib.import_module("lazypkg.thing")
    from lazypkg import thing

    assert callable(thing) and thing() == "the function"
    assert sys.modules["lazypkg.thing"] is module and module.thing is thing


def test_other_names_and_submodules_read_as_before(package):
    import lazypkg

    assert lazypkg.other == "a value"
    assert lazypkg.parts is sys.modules["lazypkg.parts"]
    with pytest.raises(AttributeError):
        lazypkg.missing  # noqa: B018


def test_rgb_attacks_square_is_the_attack_after_its_module_is_imported():
    importlib.import_module("rgb.attacks.square")
    from rgb.attacks import square

    assert callable(square) and square.__module__ == "rgb.attacks.square"
