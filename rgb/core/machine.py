"""Where computations run: the device, and how many CPU threads this process may really use.

torch's default intra-op thread count is the machine's core count, which oversubscribes a shared node or a
cgroup-limited container (an attack batch measured 70x slower under load). Every entry point calls
`configure_threads` first.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch

from rgb.core.errors import UserError


class DeviceError(UserError, RuntimeError):
    """A one-line problem with the requested device or thread count."""


def resolve_device(device: str) -> str:
    """`auto` -> cuda when visible, else cpu; an explicit cuda device without CUDA is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"device={device!r} names no torch device; use auto, cpu, cuda or cuda:N") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"device={device} but no CUDA device is visible")
    return device


def _cgroup_cpus() -> float | None:
    """CPU quota of this process's cgroup (v2 `cpu.max`, or v1 quota/period), None when unlimited."""
    v2 = Path("/sys/fs/cgroup/cpu.max")
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota_file, period_file = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
        if quota_file.is_file() and period_file.is_file():
            quota = int(quota_file.read_text())
            return None if quota <= 0 else quota / int(period_file.read_text())
    except (OSError, ValueError):
        return None
    return None


def available_cpus() -> int:
    """CPUs this process may use: the smallest of its affinity mask, its cgroup quota and SLURM_CPUS_PER_TASK."""
    limits = [len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)]
    quota = _cgroup_cpus()
    if quota is not None:
        limits.append(max(1, int(quota)))
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit() and int(slurm) > 0:
        limits.append(int(slurm))
    return max(1, min(limits))


def configure_threads(threads: int | str | None = "auto") -> int:
    """Set torch's intra-op threads (`auto` = available_cpus(), or RGB_THREADS / an explicit count); returns it."""
    if threads in (None, "auto"):
        threads = os.environ.get("RGB_THREADS", "auto")
    if threads == "auto":
        count = available_cpus()
    else:
        try:
            count = int(threads)
        except (TypeError, ValueError):
            raise DeviceError(f"threads must be a positive integer or 'auto', got {threads!r}") from None
        if count < 1:
            raise DeviceError(f"threads must be a positive integer or 'auto', got {threads!r}")
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


# glibc's malloc gives a freed block above its mmap threshold (128 KiB, then rising to the largest block freed)
# back to the kernel, and trims the heap's free top above twice that, so the next tensor of the same size
# page-faults all its memory afresh. Attacks and training allocate the same activation sizes thousands of times:
# a robust small CNN's forward+backward of 62 images took 19 ms where 10 ms is its cost (docs/performance.md).
# Blocks up to this size come from (and return to) the heap; older glibc (2.30, say) refuses more than 32 MiB.
KEPT_BLOCK_BYTES = (256 << 20, 32 << 20)
KEPT_TOP_BYTES = 1 << 30  # free memory at the heap's top is handed back to the kernel only above this


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory for the next tensor instead of returning it to the kernel (see above); True
    when both thresholds were set. A user's own malloc settings (any MALLOC_* variable, glibc.malloc tunables, a
    preloaded allocator) win, and other C libraries are left alone. Memory the process freed stays counted in its
    RSS, up to what it used at its peak."""
    if not sys.platform.startswith("linux") or os.environ.get("LD_PRELOAD"):
        return False
    if any(name.startswith("MALLOC_") for name in os.environ) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
        ctypes.CDLL(None).gnu_get_libc_version  # glibc's: musl's mallopt does nothing
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    blocks = any(mallopt(m_mmap_threshold, size) for size in KEPT_BLOCK_BYTES)
    return bool(mallopt(m_trim_threshold, KEPT_TOP_BYTES)) and blocks


def die_with_parent() -> None:
    """In a spawned worker: the kernel kills this process when its parent dies (Linux's PR_SET_PDEATHSIG), so the
    workers of a killed command (kill -9, a preempted job) never go on beside its re-run. Elsewhere a no-op."""
    import multiprocessing
    import signal
    import sys

    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent.pid:  # the parent died before the request took effect
        os._exit(1)


@contextlib.contextmanager
def matmul_numerics(precision: str = "fp32"):
    """TF32 for CUDA convolutions and matrix products exactly when `precision` is "tf32", torch's flags restored
    afterwards. PyTorch lets cuDNN use TF32 for convolutions by default, so a number recorded as fp32 (the clean
    pass, every success's re-check, the protocol's attacks, evaluation's accuracies) is computed under this with
    "fp32". The CPU has no TF32: there the flags change nothing."""
    backends = torch.backends
    saved = backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32
    backends.cuda.matmul.allow_tf32 = backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32 = saved
