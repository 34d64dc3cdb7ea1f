"""The distribution as users get it: a wheel (not an editable install) carries the configs, and its console
scripts answer --help from a fresh virtual environment, away from the repository."""

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from helpers import REPO

SCRIPTS = ("rgb-train", "rgb-attack", "rgb-evaluate", "rgb-transfer")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(out), str(REPO)], check=True, capture_output=True)
    (found,) = out.glob("robustgenbench-*.whl")
    return found


@pytest.mark.slow
def test_wheel_carries_the_configs_built_from_conf(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for config in REPO.joinpath("conf").rglob("*.yaml"):
        relative = config.relative_to(REPO / "conf").as_posix()
        if not relative.startswith("local/"):
            assert f"rgb/conf/{relative}" in names, relative
    assert not any(n.startswith("rgb/conf/local/") and not n.endswith("README.md") for n in names)
    assert "rgb/commands/main.py" in names and not any(n.startswith("tests/") for n in names)


@pytest.mark.slow
def test_wheel_carries_the_site_templates_and_the_licence(wheel):
    """evaluate.py site=true renders templates shipped as package data; the MIT licence is in the metadata."""
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    for asset in REPO.joinpath("rgb/evaluation/site_templates").iterdir():
        assert f"rgb/evaluation/site_templates/{asset.name}" in names, asset.name
    metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License: MIT" in metadata or "License-Expression: MIT" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)


@pytest.mark.slow
def test_console_scripts_of_a_non_editable_install(wheel, tmp_path):
    """A fresh venv gets the wheel (no deps); the dependencies come from this environment's site-packages, added
    as a plain path so that the editable install of the checkout stays invisible."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
                    str(wheel)], check=True, capture_output=True)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    where = subprocess.run([str(python), "-c", "import rgb, rgb.core.configs as c; print(rgb.__file__); "
                            "print(c.config_dir())"], cwd=away, env=env, check=True, capture_output=True, text=True)
    module_file, config_dir = where.stdout.split()
    assert Path(module_file).is_relative_to(site) and Path(config_dir) == site / "rgb" / "conf"
    for script in SCRIPTS:
        shown = subprocess.run([str(env_dir / "bin" / script), "--help"], cwd=away, env=env, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr[-1500:]
        assert "== Configuration groups (group=option) ==" in shown.stdout and "data:" in shown.stdout
    refused = subprocess.run([str(env_dir / "bin" / "rgb-attack")], cwd=away, env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.strip().count("\n") == 0 and "run=" in refused.stderr
