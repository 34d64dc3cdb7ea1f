"""Foundation of the house: the threat-model vocabulary, atomic files and hashes, the identity a run directory is
bound to (`rgb.core.rundir`), devices and threads, the class-wise metrics (`rgb.core.classwise`), the JSON record
codec (`rgb.core.jsonrecord`) and the rules of caption/prompt templates (`rgb.core.templates`).

Imports nothing from other rgb packages, so every layer (attacks included) may use it. The device and thread
helpers import torch, so they load on first use: `rgb.core.configs` (read by every command's `--help`) stays light.
"""

from rgb.core.files import atomic_write_bytes, atomic_write_json, file_sha256, read_jsonl
from rgb.core.threat import NORMS, Norm, ThreatModel, parse_norm

_MACHINE = ("DeviceError", "available_cpus", "configure_threads", "resolve_device")

__all__ = [
    "NORMS",
    "Norm",
    "ThreatModel",
    "atomic_write_bytes",
    "atomic_write_json",
    "file_sha256",
    "parse_norm",
    "read_jsonl",
    *_MACHINE,
]


def __getattr__(name: str):
    if name in _MACHINE:
        from rgb.core import machine

        return getattr(machine, name)
    raise AttributeError(f"module 'rgb.core' has no attribute {name!r}")
