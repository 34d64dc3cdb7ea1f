"""Foundation of the house: the threat-model vocabulary, atomic files and hashes, devices and threads.

Imports nothing from other rgb packages, so every layer (attacks included) may use it.
"""

from rgb.core.files import atomic_write_bytes, atomic_write_json, file_sha256
from rgb.core.machine import available_cpus, configure_threads, resolve_device
from rgb.core.threat import NORMS, Norm, ThreatModel, parse_norm

__all__ = [
    "NORMS",
    "Norm",
    "ThreatModel",
    "atomic_write_bytes",
    "atomic_write_json",
    "available_cpus",
    "configure_threads",
    "file_sha256",
    "parse_norm",
    "resolve_device",
]
