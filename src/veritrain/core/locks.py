"""File locks the kernel releases when their process ends, however it ends (kill -9 included).

A lock is `fcntl.flock` on a file in `.veritrain/locks/`, taken through a descriptor kept open for as long as
the lock is held: a run's process holds `<run_id>.lock` while it writes the run, and the smoke test of a config,
the preparing of a data version and a sweep's driver hold locks of their own there. A process that wants the
same work waits for the holder, then reuses what it made.

Whether a lock is held is the kernel's answer, never the file's content: the file names its holder (pid, host)
for messages only. Within one process a lock is counted, so a process that takes a lock it already holds (an
amend inside a command that holds the run) never waits on itself. The holder removes the file as it lets go,
while still holding it; a process that opened the old file finds it replaced and takes the new one, so two
processes never hold one name at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

POLL_SECONDS = 0.05  # how often a waiting process tries again
FLOCK = "flock"  # the `lock` field of a holder file written by this module (files of older pid-file locks lack it)

_held: dict[str, list[int]] = {}  # path → [descriptor, times taken] of the locks this process holds
_guard = threading.RLock()


def holder(path: Path) -> dict[str, object]:
    """What the lock file says of its holder ({} when it is missing or unreadable): for messages only."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def holder_text(path: Path) -> str:
    """`pid N on HOST` of the process that holds `path`, for an error or waiting line."""
    found = holder(path)
    return f"pid {found.get('pid', '?')} on {found.get('host', '?')}"


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def try_acquire(path: Path) -> bool:
    """Take the lock at `path` if no other process holds it; True when this process now holds it."""
    key = str(path)
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, path):
                break
            os.close(fd)  # its last holder removed it between our open and our lock: take the file there now
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "lock": FLOCK}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
        _held[key] = [fd, 1]
        return True


def acquire(path: Path, wait_s: Optional[float] = None, on_wait: Optional[Callable[[str], None]] = None) -> bool:
    """Take the lock at `path`, waiting for its holder up to `wait_s` seconds (None: as long as it holds it).
    `on_wait` is called once, with the holder's `pid N on HOST`, when the lock is not free at once."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    told = False
    while not try_acquire(path):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if on_wait is not None and not told:
            on_wait(holder_text(path))
            told = True
        time.sleep(POLL_SECONDS)
    return True


def release(path: Path) -> None:
    """Let go of a lock this process took (once per take); the last release removes the file and frees it."""
    key = str(path)
    with _guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        try:
            if _same_file(entry[0], path):
                path.unlink()  # still holding it: nobody can take this file now, and a waiter on it moves to a new one
        finally:
            os.close(entry[0])


def is_held(path: Path) -> bool:
    """Whether any process (this one included) holds the lock at `path` now."""
    with _guard:
        if str(path) in _held:
            return True
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two processes looking never block each other
            except BlockingIOError:
                return True
            if _same_file(fd, path):
                return False
        finally:
            os.close(fd)  # a lock it took is released with the descriptor


def remove_if_free(path: Path) -> bool:
    """Remove the lock file at `path` when no process holds it (gc); True when it was removed."""
    with _guard:
        if str(path) in _held or not try_acquire(path):
            return False
        release(path)
        return True


@contextmanager
def held(path: Path, on_wait: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Hold the lock at `path` for the block, waiting for another holder first (see `acquire`)."""
    acquire(path, None, on_wait)
    try:
        yield
    finally:
        release(path)
