"""Checkpoint files, written atomically: temp file in the same folder, fsync, rename, fsync the folder.

A crash during a save leaves the previous checkpoint whole; a reader never sees a half-written file
under the final name. A `<name>.sha256` sidecar is written last and checked on load, which uses
`torch.load(weights_only=True)` so a checkpoint cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

FORMAT_VERSION = 1


def save(state: dict[str, Any], path: Path) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    _write_atomic(path, data)
    _write_atomic(path.with_name(path.name + ".sha256"), (hashlib.sha256(data).hexdigest() + "\n").encode())


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    data = path.read_bytes()
    sidecar = path.with_name(path.name + ".sha256")
    if sidecar.exists():
        expected = sidecar.read_text().strip()
        if hashlib.sha256(data).hexdigest() != expected:
            raise ValueError(f"{path}: content does not match {sidecar.name}; the checkpoint is damaged")
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
