#!/usr/bin/env bash
# Wheels that the lent H200 image lacks (it has torch, timm, lightning, torchmetrics, safetensors, pytest, pyarrow),
# and the authors' AutoAttack (pyautoattack, for gpu_attack.py's ours-vs-authors part) without its 44 MB examples/,
# for Python 3.12 on x86-64, into .whl/ (git-ignored). Then, on the device:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   benchmarks/gpu_check.sh "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
py=${PYTHON:-.venv/bin/python}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
  imagecorruptions-imaug==1.1.5
# antlr4-python3-runtime 4.9.3 (hydra's parser runtime) is published as source only: build its pure-Python wheel.
"$py" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
# The authors' AutoAttack: its wheel (42 MB) is almost all examples/ (a test model and TF weights); the copy kept
# drops that folder and its RECORD lines (pure Python, 0.1 MB), so .whl travels to the device under its size limit.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$py" -m pip download -q --no-deps -d "$scratch" pyautoattack==0.2.0
"$py" - "$scratch"/pyautoattack-0.2.0-py3-none-any.whl .whl/pyautoattack-0.2.0-py3-none-any.whl <<'PY'
import sys
import zipfile

source, target = sys.argv[1:]
with zipfile.ZipFile(source) as wheel, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as kept:
    for item in wheel.infolist():
        if item.filename.startswith("pyautoattack/examples/"):
            continue
        data = wheel.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"".join(line for line in data.splitlines(keepends=True)
                            if not line.startswith(b"pyautoattack/examples/"))
        kept.writestr(item, data)
PY
ls -1 .whl
