"""The committed trajectory of a run: one entry per scheduled checkpoint, hash-chained.

Every checkpoint saved on the schedule (`checkpoint.every_steps`, `every_epochs`, the epoch that
improves `best.pt`, the end of training) adds `{step, epoch, state_sha256, model_sha256, chain}`, and
the initial state adds an entry at step 0. Saves that depend on timing (a signal, `every_minutes`) are
listed apart, in `other_saves`, so a resumed run's trajectory equals an uninterrupted run's. The
trajectory travels inside every checkpoint (loop state, outside the hashed part) and ends in the
record, where the seal covers it. `veritrain audit` replays segments between entries and demands
the same state hash; `veritrain verify` checks the chain and that every checkpoint on disk is in it.

Byte encodings (docs/record.md repeats them):

- `chain_0 = SHA-256("veritrain-trajectory-1\\n" ‖ config_hash ‖ "\\n" ‖ data_version ‖ "\\n")` (ASCII hex);
- `chain_i = SHA-256(chain_{i-1} ‖ step_i ‖ state_sha256_i)`: the previous chain's 32 raw bytes, the step as
  8 bytes unsigned big-endian, the state hash's 32 raw bytes; `chain` is written in hex.
- `state_sha256` (`state_sha256` below): SHA-256 over the checkpoint's training state, walked in a fixed
  order, independent of the machine, of torch.save's container format and of tensor memory layout.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Iterator, Optional

CHAIN_LABEL = b"veritrain-trajectory-1\n"
# Parts of a checkpoint that are not training state: why it was saved, the device and thread settings
# (the environment, compared on resume), the format number, and the trajectory itself.
NOT_STATE = ("reason", "settings", "format_version")
NOT_LOOP_STATE = ("trajectory", "other_saves")


def chain_start(config_hash: str, data_version: str) -> str:
    return hashlib.sha256(CHAIN_LABEL + config_hash.encode() + b"\n" + data_version.encode() + b"\n").hexdigest()


def chain_next(previous: str, step: int, state_sha256: str) -> str:
    return hashlib.sha256(bytes.fromhex(previous) + struct.pack(">Q", step) + bytes.fromhex(state_sha256)).hexdigest()


def hashed_parts(state: dict[str, Any]) -> dict[str, Any]:
    """The training state a checkpoint holds, without what is not state (NOT_STATE, the trajectory), and
    without the CUDA generators of a run trained on the CPU (present only when the saving machine had a GPU)."""
    parts = {key: value for key, value in state.items() if key not in NOT_STATE}
    if isinstance(parts.get("loop"), dict):
        parts["loop"] = {key: value for key, value in parts["loop"].items() if key not in NOT_LOOP_STATE}
    on_cuda = str((state.get("settings") or {}).get("device", "cpu")).startswith("cuda")

    def drop_cuda(rng: Any) -> Any:
        return {k: v for k, v in rng.items() if k != "cuda"} if isinstance(rng, dict) and not on_cuda else rng

    if "rng" in parts:
        parts["rng"] = drop_cuda(parts["rng"])
    if isinstance(parts.get("distributed"), dict):
        parts["distributed"] = {**parts["distributed"],
                                "ranks": [{**r, "rng": drop_cuda(r.get("rng"))} for r in parts["distributed"].get("ranks", [])]}
    return parts


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs: dict keys in sorted order of their text, list and tuple items in order."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from leaves(value[key], f"{path}/{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}/{index}")
    else:
        yield path, value


def leaf_bytes(value: Any) -> tuple[bytes, bytes]:
    """(tag, payload) of one leaf. Floats are written exactly (float.hex), tensors as dtype, shape and
    their bytes in C order (little-endian on every machine veritrain runs on)."""
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        header = f"{tensor.dtype}\0{','.join(str(d) for d in tensor.shape)}\0".encode()
        return b"T", header + tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    if value is None:
        return b"N", b""
    if isinstance(value, bool):
        return b"B", b"1" if value else b"0"
    if isinstance(value, int):
        return b"I", str(value).encode()
    if isinstance(value, float):
        return b"F", value.hex().encode()
    if isinstance(value, str):
        return b"S", value.encode()
    if isinstance(value, bytes):
        return b"Y", value
    raise TypeError(f"a checkpoint holds a {type(value).__name__}, which the state hash does not cover")


def state_sha256(state: dict[str, Any]) -> str:
    """The state hash: for each leaf of `hashed_parts(state)`, the path (UTF-8), NUL, a one-letter tag
    (T tensor, N none, B bool, I int, F float, S string, Y bytes), NUL, the payload's length in decimal,
    NUL, the payload."""
    digest = hashlib.sha256()
    for path, value in leaves(hashed_parts(state)):
        tag, payload = leaf_bytes(value)
        digest.update(path.encode() + b"\0" + tag + b"\0" + str(len(payload)).encode() + b"\0")
        digest.update(payload)
    return digest.hexdigest()


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> Optional[str]:
    """The path of the first leaf (in hashing order) where two states differ, or None."""
    left, right = dict(leaves(hashed_parts(a))), dict(leaves(hashed_parts(b)))
    for path in sorted(set(left) | set(right)):
        if path not in left or path not in right:
            return f"{path} (only in the {'replayed' if path in left else 'recorded'} state)"
        if leaf_bytes(left[path]) != leaf_bytes(right[path]):
            return path
    return None


def entry(trajectory: list[dict[str, Any]], config_hash: str, data_version: str, step: int, epoch: int,
          state_hash: str, model_sha256: str) -> dict[str, Any]:
    previous = trajectory[-1]["chain"] if trajectory else chain_start(config_hash, data_version)
    return {"step": step, "epoch": epoch, "state_sha256": state_hash, "model_sha256": model_sha256,
            "chain": chain_next(previous, step, state_hash)}


def chain_problem(trajectory: list[dict[str, Any]], config_hash: str, data_version: str) -> Optional[str]:
    """Why a recorded trajectory's chain does not hold (one line), or None."""
    previous = chain_start(config_hash, data_version)
    last_step = -1
    for index, item in enumerate(trajectory):
        try:
            step, state_hash, chain = int(item["step"]), str(item["state_sha256"]), str(item["chain"])
            expected = chain_next(previous, step, state_hash)
        except (KeyError, TypeError, ValueError, struct.error):
            return f"entry {index} is malformed"
        if step < last_step:
            return f"entry {index} (step {step}) comes after step {last_step}"
        if chain != expected:
            return f"entry {index} (step {step}): chain {chain[:12]} is not SHA-256(previous chain ‖ step ‖ state hash) = {expected[:12]}"
        previous, last_step = chain, step
    return None


def for_record(entries: list[dict[str, Any]], checkpoints: Any, audit_every: int) -> list[dict[str, Any]]:
    """The record's trajectory: each entry with `kept` (its checkpoints/step-<N>.pt is in the run) and
    `kept_for_audit` (kept by checkpoint.audit_every beyond keep_last; an archive may leave those out)."""
    return [{**item, "kept": index > 0 and (checkpoints / f"step-{item['step']}.pt").exists(),
             "kept_for_audit": bool(audit_every) and index > 0 and index % audit_every == 0}
            for index, item in enumerate(entries)]


def auditable_segments(trajectory: list[dict[str, Any]], available: Optional[set[int]] = None) -> list[int]:
    """Indices i of the entries whose segment (entry i−1 → entry i) can be replayed: entry i−1 is the
    initial state (index 0, rebuilt from the config) or its checkpoint is there (`available` steps, else
    the record's `kept`)."""
    def start_present(item: dict[str, Any]) -> bool:
        return item["step"] in available if available is not None else bool(item.get("kept"))

    return [i for i in range(1, len(trajectory)) if starts_at_initial_state(trajectory, i) or start_present(trajectory[i - 1])]


def starts_at_initial_state(trajectory: list[dict[str, Any]], index: int) -> bool:
    """Whether segment `index` starts at the initial state (a run resumed from a checkpoint made before
    trajectories has no entry for it)."""
    return index == 1 and trajectory[0]["step"] == 0 and trajectory[0]["epoch"] == 0


def audit_only_checkpoints(record: dict[str, Any]) -> list[str]:
    """The `checkpoints/step-<N>.pt` files a record keeps only for audit: entries marked `kept_for_audit`,
    less the newest `checkpoint.keep_last` entries of the trajectory (by position: the resume points
    keep_last keeps in any case). An archive made without --with-audit leaves exactly these out, and
    verify excuses exactly these when import listed them; best.pt and last.pt are never among them."""
    entries = [e for e in record.get("trajectory") or [] if isinstance(e, dict)]
    try:
        keep_last = int(((record.get("config") or {}).get("checkpoint") or {}).get("keep_last", 2))
    except (TypeError, ValueError, AttributeError):  # no usable keep_last: nothing counts as audit-only
        return []
    if keep_last < 1:
        return []
    newest = {f"checkpoints/step-{e.get('step')}.pt" for e in entries[1:][-keep_last:]}
    return sorted({f"checkpoints/step-{e.get('step')}.pt" for e in entries[1:] if e.get("kept_for_audit") is True} - newest)
