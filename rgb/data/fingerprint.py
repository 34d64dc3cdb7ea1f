"""Content fingerprints of benchmark splits: a result is only ever reused for the very images it was made on."""

from __future__ import annotations

import hashlib

import numpy as np


def split_sha256(split) -> str:
    """sha256 over an ImageSplit's labels, image ids and PNG bytes (in row order)."""
    digest = hashlib.sha256()
    table = split.rows.data
    for column in ("label", "image_id"):
        digest.update(np.ascontiguousarray(table.column(column).to_numpy(), dtype=np.int64).tobytes())
    for image in table.column("image").to_pylist():
        digest.update(len(image["bytes"]).to_bytes(8, "little"))
        digest.update(image["bytes"])
    return digest.hexdigest()
