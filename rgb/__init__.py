"""rgb: fine-tune, attack and score image classifiers on RobustGenBench.

    from rgb import AutoAttack, benchmark, load_model

The names are imported on first use, so `import rgb` (and every command's --help) stays fast.
"""

__version__ = "0.2.0"

_LAZY = {
    "AutoAttack": ("rgb.attacks", "AutoAttack"),
    "benchmark": ("rgb.api", "benchmark"),
    "load_model": ("rgb.models", "load"),
}

__all__ = ["AutoAttack", "__version__", "benchmark", "load_model"]


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        module, attribute = _LAZY[name]
        value = getattr(import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rgb' has no attribute {name!r}")
