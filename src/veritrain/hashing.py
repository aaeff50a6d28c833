"""Content hashing: files (read in chunks), canonical JSON and model state.

SHA-256 everywhere in run records, so anyone can re-check a record with standard tools
(`sha256sum`). Canonical JSON (sorted keys, fixed separators, UTF-8) makes a hash of a structure
independent of dict order and formatting.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20  # 1 MiB reads: big files never sit whole in memory


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def canonical_json(obj: Any) -> bytes:
    """The exact bytes hashed for a structure: sorted keys, no whitespace, UTF-8, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def state_dict_sha256(state_dict: Any) -> str:
    """SHA-256 over a model `state_dict`, buffers included (documented in docs/record.md).

    For each entry in sorted-name order: the UTF-8 name, a NUL, the dtype (e.g. `torch.float32`),
    a NUL, the shape as comma-separated integers, a NUL, then the tensor's bytes in C order on the
    CPU. Independent of device and of how the tensors were laid out in memory.
    """
    import torch

    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name]
        if not isinstance(tensor, torch.Tensor):
            tensor = torch.as_tensor(tensor)
        tensor = tensor.detach().to("cpu").contiguous()
        shape = ",".join(str(d) for d in tensor.shape)
        digest.update(f"{name}\0{tensor.dtype}\0{shape}\0".encode())
        # view as bytes: works for every dtype, including bfloat16 which numpy lacks
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
