#!/usr/bin/env bash
# One command for a lent GPU: environment, GPU-gated tests, training throughput and AutoAttack speed.
#   benchmarks/gpu_check.sh OUT_DIR          on a CUDA machine (about 6-8 minutes on an H200)
#   benchmarks/gpu_check.sh OUT_DIR --cpu    tiny sizes on the CPU (run by the test suite)
# Writes OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.log. Uses $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [--cpu]" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x .venv/bin/python ]; then py=.venv/bin/python
else py=python3
fi
exec "$py" benchmarks/gpu_check.py "$@"
