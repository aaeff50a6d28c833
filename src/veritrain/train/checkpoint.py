"""Checkpoint files, written atomically with `veritrain.core.files.write_atomic`: a new temp file in the same
folder, its data synced (fdatasync where the system has it) and renamed over the final name; then a
`<name>.sha256` sidecar, written last; then the folder is fsynced. A file once in place is never
written to again: a newer checkpoint is always a new file, and old step files are only ever deleted.

A crash at any moment leaves either the previous file or the complete new one under the final name;
a file whose sidecar does not match (killed between rename and sidecar) is detected on load, and the
resume falls back to an older checkpoint. Loading uses `torch.load(weights_only=True)`, so a
checkpoint cannot run code.

Files: `checkpoints/step-<N>.pt` (the newest `checkpoint.keep_last` are kept), `last.pt` (a copy of
the newest, written when training stops: completed, stopped early or interrupted by a signal) and
`best.pt` — all real files, never links.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import Any, Optional

import torch

from veritrain.core.errors import RunFailed
from veritrain.core.files import write_atomic

FORMAT_VERSION = 1
STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


class CheckpointError(RunFailed):
    """A checkpoint file that is missing, truncated or does not match its sidecar."""


def encode(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def load(path: Path) -> dict[str, Any]:
    """The checkpoint's state on the CPU, after its sidecar hash matched."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read it ({err.strerror})") from None
    sidecar = path.with_name(path.name + ".sha256")
    try:
        expected = sidecar.read_text().strip()
    except OSError:
        raise CheckpointError(f"{path}: its {sidecar.name} is missing; the save did not finish") from None
    if hashlib.sha256(data).hexdigest() != expected:
        raise CheckpointError(f"{path}: content does not match {sidecar.name} (truncated or changed)")
    return decode(path, data)


def decode(path: Path, data: bytes) -> dict[str, Any]:
    """The training state in a checkpoint's bytes (`path` names it in errors): a dict with the model's state and the
    loop's, as veritrain writes it; anything else (another pickle, a bare state_dict) is a CheckpointError."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # a matching hash makes this unlikely; refuse anything odd all the same
        raise CheckpointError(f"{path}: cannot be loaded ({err.__class__.__name__}: {str(err)[:200]})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict) or not isinstance(state.get("loop"), dict) \
            or not isinstance(state["loop"].get("epochs_done"), int):
        raise CheckpointError(f"{path}: not a veritrain checkpoint (a training state with `model` and `loop`, as checkpoints/*.pt hold)")
    return state


def load_outside(path: Path) -> tuple[bytes, dict[str, Any]]:
    """(bytes, state) of a checkpoint from outside a run, which has no sidecar to check: it is hashed and copied
    into the run that uses it."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read it ({err.strerror})") from None
    return data, decode(path, data)


def step_files(folder: Path) -> list[tuple[int, Path]]:
    """(global step, path) of the step-<N>.pt files, newest first."""
    found = []
    for name in os.listdir(folder):
        match = STEP_FILE.match(name)
        if match:
            found.append((int(match.group(1)), folder / name))
    return sorted(found, reverse=True)


def newest_valid(folder: Path) -> tuple[Optional[Path], Optional[dict[str, Any]], list[str]]:
    """The newest checkpoint that loads and matches its sidecar: last.pt and the step files, by
    global step. Returns (path, state, warnings about the files skipped)."""
    candidates: list[tuple[int, int, Path]] = [(step, 1, path) for step, path in step_files(folder)]
    last = folder / "last.pt"
    problems: list[str] = []
    states: dict[Path, dict[str, Any]] = {}
    if last.exists():
        try:
            states[last] = load(last)
            candidates.append((int(states[last]["loop"]["step"]), 2, last))  # last.pt wins a tie: same state
        except CheckpointError as err:
            problems.append(str(err))
    for _, _, path in sorted(candidates, key=lambda c: (c[0], c[1]), reverse=True):
        if path in states:
            return path, states[path], problems
        try:
            return path, load(path), problems
        except CheckpointError as err:
            problems.append(str(err))
    return None, None, problems


def discard_after(folder: Path, step: int) -> list[str]:
    """Delete the step files after global step `step` (and their sidecars); returns their names.

    Resuming from a checkpoint at `step` means every step file after it failed its check (the newest
    valid one is chosen): the replay writes whatever it saves again, and a broken file left in place
    would count as one of the `keep_last` and so crowd out a whole one."""
    removed = []
    for found, path in step_files(folder):
        if found > step:
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".sha256").unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def write(folder: Path, data: bytes, names: list[str], keep_last: int, keep: frozenset[int] | set[int] = frozenset()) -> None:
    """Write the encoded checkpoint `data` under each of `names` in `folder` (in that order), each a new
    file with its SHA-256 sidecar, then delete the step files older than the newest `keep_last`, except
    the steps in `keep` (kept for `veritrain audit`, checkpoint.audit_every).

    The old step files are deleted only once the new one is in place and the folder synced, so a
    failed or killed save always leaves the previous checkpoint whole (also with `keep_last` 1).

    Runs on the training thread. Writing on a background thread instead took about 1 s of waiting
    per run off the loop for resnet18 in `benchmarks/overhead.py` (3 saves of 134 MB), yet the loop
    was no faster: 1.01× the time (median of 7 interleaved pairs); the writer competes with torch for
    the two cores. For the cnn it was 1.11× (pairs 0.77–1.20), for 0.02 s of waiting per run.
    """
    digest = hashlib.sha256(data).hexdigest()
    for name in names:  # best.pt first: a crash after it replays the epoch and rewrites it identically
        write_atomic(folder / name, data, sync_folder=False)
        # the sidecar's data is not synced (after a power loss a missing or stale sidecar only makes the
        # loader fall back to an older checkpoint); the last one syncs the folder, once for all the renames
        write_atomic(folder / f"{name}.sha256", (digest + "\n").encode(), fsync=False, sync_folder=name == names[-1])
    for step, path in step_files(folder)[keep_last:]:
        if step in keep:
            continue
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".sha256").unlink(missing_ok=True)
