"""Build hook: the wheel carries a copy of the repository's `conf/` as `rgb/conf`, so an installed package has a
working CLI (`rgb-train`, `rgb-attack`, ...). `conf/` stays the one source of truth; nothing is kept in sync by
hand. Site settings (`conf/local/`, git-ignored) are never packaged."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithConfigs(build_py):
    def run(self):
        super().run()
        source = Path(__file__).resolve().parent / "conf"
        target = Path(self.build_lib) / "rgb" / "conf"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, ignore=lambda folder, names: [
            n for n in names if Path(folder).name == "local" and n != "README.md"
        ] + [n for n in names if n == "__pycache__"])


setup(cmdclass={"build_py": BuildPyWithConfigs})
