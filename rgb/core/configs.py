"""Where the Hydra configs live and what the data configs are called.

A checkout uses the repository's `conf/`; an installed wheel carries a copy built from it as `rgb/conf`
(see setup.py), so the console scripts work without the repository. Plain YAML reads only: no Hydra import.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

_PACKAGE = Path(__file__).resolve().parents[1]


def config_dir() -> Path:
    packaged = _PACKAGE / "conf"
    return packaged if (packaged / "attack.yaml").is_file() else _PACKAGE.parent / "conf"


@cache
def data_configs() -> dict[str, str]:
    """Dataset id -> data config name (`flowers-102` -> `flowers102`), from conf/data/*.yaml."""
    found = {}
    for path in sorted((config_dir() / "data").glob("[!_]*.yaml")):
        dataset = (yaml.safe_load(path.read_text()) or {}).get("dataset")
        if dataset and dataset != "???":  # `custom` names no dataset: the user gives data.dataset
            found[str(dataset)] = path.stem
    return found


def data_config_for(dataset: str | None) -> str | None:
    return data_configs().get(str(dataset)) if dataset else None


def describe_data_config(dataset: str | None) -> str:
    """`data=flowers102` for a dataset id, or the id itself when no config names it."""
    name = data_config_for(dataset)
    return f"data={name}" if name else f"a data config with dataset {dataset!r}"
