"""Checkpoint files, written atomically: temp file in the same folder, flush + fsync (fdatasync where the
system has it), rename, fsync the folder, then a `<name>.sha256` sidecar, written last.

A crash at any moment leaves either the previous file or the complete new one under the final name;
a file whose sidecar does not match (killed between rename and sidecar) is detected on load, and the
resume falls back to an older checkpoint. Loading uses `torch.load(weights_only=True)`, so a
checkpoint cannot run code.

Files: `checkpoints/step-<N>.pt` (the newest `checkpoint.keep_last` are kept), `last.pt` (a copy of
the newest, written when training stops: completed, stopped early or interrupted by a signal) and
`best.pt` — all real files, never links.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import logging
import os
import queue
import re
import threading
from pathlib import Path
from typing import Any, Optional

import torch

from veritrain.errors import RunFailed
from veritrain.files import replace_in

log = logging.getLogger("veritrain")

FORMAT_VERSION = 1
STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


class CheckpointError(RunFailed):
    """A checkpoint file that is missing, truncated or does not match its sidecar."""


def encode(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def write_into(dir_fd: int, name: str, data: bytes, digest: str, reuse: Optional[str] = None) -> None:
    """Write checkpoint bytes under `name` in the open folder `dir_fd` atomically (synced), then its
    SHA-256 sidecar. The folder's fsync is left to the caller (one for several files). `reuse`: an
    unwanted step file whose disk blocks the new file takes over (see `files.replace_in`).

    The sidecar is renamed into place but not fsynced: after a power loss a missing or stale sidecar
    only makes the loader fall back to an older checkpoint.
    """
    replace_in(dir_fd, name, data, reuse=reuse)
    replace_in(dir_fd, name + ".sha256", (digest + "\n").encode(), fsync=False)


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
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # a matching hash makes this unlikely; refuse anything odd all the same
        raise CheckpointError(f"{path}: cannot be loaded ({err.__class__.__name__}: {err})") from None


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


class BackgroundWriter:
    """Hashes and writes encoded checkpoints into `folder` on one long-lived background thread, so the
    SHA-256, disk writes and fsyncs overlap the next training steps (hashing and file I/O release the
    GIL), and keeps the newest `keep_last` step files.

    One write at a time: `submit` first waits for the previous one; `wait` returns when the last write
    is on disk and raises its error (an OSError such as a full disk, or whatever else stopped the
    write), with `.step` set to the step it was for; `close` ends the thread.

    Kept cheap because it competes with training for the CPU and the disk: every system call hands the
    GIL to this thread and back, and each hand-over can make the training thread wait for a wake-up;
    so the folder stays open (names are looked up relative to it), the step files on disk are listed
    once and then tracked here, and a new step file reuses the disk blocks of the one it replaces.
    """

    def __init__(self, folder: Path, keep_last: int) -> None:
        self.folder, self.keep_last = folder, keep_last
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[tuple[int, Exception]] = None
        self._dir_fd: Optional[int] = None
        self._steps: Optional[list[int]] = None  # global steps of the step-<N>.pt files on disk, oldest first; None: list the folder

    def submit(self, data: bytes, names: list[str], step: int) -> None:
        """Write `data` under each of `names` (in that order) in the folder, then prune the step files."""
        self.wait()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="checkpoint-writer", daemon=True)
            self._thread.start()
        self._idle.clear()
        self._jobs.put((data, names, step))

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            data, names, step = job
            try:
                self._write(data, names)
            except Exception as err:  # kept for `wait` to raise: a dead writer would leave the next save waiting forever
                self._error = (step, err)
            finally:
                self._idle.set()

    def _write(self, data: bytes, names: list[str]) -> None:
        """A new step file takes over the oldest one's disk blocks when that one is due for pruning.
        The newer step files stay in place meanwhile, so a failed or killed write still leaves a
        previous checkpoint: they were all finished by this writer, or are the one a resume started
        from (resume removes the broken files after it, `discard_after`) and older ones."""
        if self._dir_fd is None:
            self._dir_fd = os.open(self.folder, os.O_RDONLY)
        if self._steps is None:
            self._steps = sorted(step for step, _ in step_files(self.folder))
        steps = self._steps
        try:
            digest = hashlib.sha256(data).hexdigest()
            for name in names:  # best.pt first: a crash after it replays the epoch and rewrites it identically
                match = STEP_FILE.match(name)
                step = int(match.group(1)) if match else None
                reuse = None
                if step is not None and step not in steps and len(steps) >= self.keep_last >= 2:
                    reuse = f"step-{steps.pop(0)}.pt"
                    self._unlink(reuse + ".sha256")
                write_into(self._dir_fd, name, data, digest, reuse)
                if step is not None and step not in steps:
                    bisect.insort(steps, step)
            os.fsync(self._dir_fd)
            while len(steps) > self.keep_last:
                name = f"step-{steps.pop(0)}.pt"
                self._unlink(name)
                self._unlink(name + ".sha256")
        except BaseException:
            self._steps = None  # whatever the failure left on disk, the next write lists it afresh
            raise

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._dir_fd)
        except FileNotFoundError:
            pass

    def wait(self) -> None:
        self._idle.wait()
        if self._error is not None:
            step, err = self._error
            self._error = None
            err.step = step  # type: ignore[attr-defined]
            raise err

    def close(self) -> None:
        """Wait for the last write (raising its error) and end the thread."""
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread.join()
                self._thread = None
            if self._dir_fd is not None:
                os.close(self._dir_fd)
                self._dir_fd = None
