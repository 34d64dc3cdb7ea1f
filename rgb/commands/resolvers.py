"""Every `${rgb.*:...}` interpolation of conf/: registered with OmegaConf by the entry points (and by tests that
compose configs) before a config is resolved. The values come from the library (the data catalog's budgets, the
run store's names and places, the value rules); only the registration lives here.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from rgb.core.values import name_part, path_name, url_host


def _run_name(path) -> str:
    from rgb.runs.store import run_name_for

    return run_name_for(path)


def _output_dir(root, kind, dataset, name) -> str:
    from rgb.runs.store import output_dir_for

    return str(output_dir_for(root, kind, dataset, name))


def _side_dir(folder: str):
    """The resolver of `<parent>/<the run store's folder named by the constant `folder`>` (rgb.runs.store.side_dir):
    the configs name the store's folders (multirun, adversarial, the reports') through it, never by their names."""

    def resolve(parent) -> str:
        from rgb.runs import store

        return store.side_dir(parent, getattr(store, folder))

    return resolve


# The resolvers whose value the machine decides (they import torch): a command's schema resolves them last.
MACHINE_RESOLVERS = ("rgb.auto_on_cuda",)


def _auto_on_cuda(device, fixed):
    """attack.py's default batch size: `auto` where `device` resolves to CUDA (rgb.runs.batch_probe), else `fixed`
    (the data config's eval_batch_size: the CPU's runs, and their identities, keep the size they always had)."""
    from rgb.core.machine import DeviceError, resolve_device

    try:
        return "auto" if resolve_device(str(device)).startswith("cuda") else fixed
    except DeviceError:  # cuda asked for where none is visible: the request says so in one line
        return fixed


def _data_resolvers() -> dict:
    """The data configs' budgets and a local snapshot's shape (rgb.data.resolvers), so no number is written twice."""
    from rgb.data.resolvers import (card_surrogates, catalog_classes, snapshot_classes, snapshot_image_size,
                                    transfer_budget, white_box_budget)

    return {"rgb.budget": white_box_budget, "rgb.transfer_budget": transfer_budget, "rgb.num_classes": catalog_classes,
            "rgb.card_surrogates": card_surrogates,
            "rgb.snapshot_classes": snapshot_classes, "rgb.snapshot_image_size": snapshot_image_size}


def register_resolvers() -> None:
    """Register every `rgb.*` resolver (idempotent)."""
    resolvers = {"rgb.run_name": _run_name, "rgb.path_name": path_name, "rgb.output_dir": _output_dir,
                 "rgb.multirun_dir": _side_dir("SWEEPS_DIR"), "rgb.adversarial_dir": _side_dir("ADVERSARIAL_DIR"),
                 "rgb.text_robustness_dir": _side_dir("TEXT_ROBUSTNESS_DIR"),
                 "rgb.zeroshot_report_dir": _side_dir("ZEROSHOT_REPORT_DIR"),
                 "rgb.name_part": name_part, "rgb.url_host": url_host, "rgb.auto_on_cuda": _auto_on_cuda, **_data_resolvers()}
    for name, resolver in resolvers.items():
        OmegaConf.register_new_resolver(name, resolver, replace=True)
