"""Atomic file replacement, shared by checkpoints and run records (no torch import).

A temp file in the same folder (`.<name>.tmp`) is written (+ fsync) and renamed over the target
(+ fsync of the folder), so a crash leaves either the previous file or the complete new one under the
final name — and possibly the temp file, which `remove_unfinished` clears away.
"""

from __future__ import annotations

import os
from pathlib import Path

TEMP_SUFFIX = ".tmp"  # `.<name>.tmp`: the hidden temp file a write goes to before its rename


def write_atomic(path: Path, data: bytes, fsync: bool = True, sync_folder: bool = True) -> None:
    """Temp file in the same folder, write (+ fsync), rename over `path` (+ fsync the folder).

    Plain `os` calls: each is one system call, and so one hand-over of the GIL when this runs on a
    background thread while training goes on.
    """
    tmp = path.with_name(f".{path.name}{TEMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # e.g. disk full: the previous file under `path` is untouched
        raise
    if sync_folder:
        sync_dir(path.parent)


def remove_unfinished(folder: Path) -> list[str]:
    """Delete, anywhere below `folder`, the temp files of writes that a kill interrupted: they are
    never read, and must not be sealed as a run's artifacts. Returns their paths relative to `folder`."""
    removed = []
    for path in sorted(folder.rglob(f".*{TEMP_SUFFIX}")):
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path.relative_to(folder).as_posix())
    return removed


def sync_dir(folder: Path) -> None:
    """fsync a folder so the renames in it survive a power loss."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
