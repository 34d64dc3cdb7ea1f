"""Load for the benchmarks that measure how a command holds up when other jobs share the CPU (issue 24)."""

from __future__ import annotations

import contextlib
import subprocess
import sys


@contextlib.contextmanager
def busy_loops(count: int):
    """`count` CPU-bound processes (pure-Python busy loops) beside the block; killed when it ends, however."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield busy
    finally:
        for process in busy:
            process.kill()
            process.wait()
