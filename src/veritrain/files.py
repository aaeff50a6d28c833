"""Atomic file replacement, shared by checkpoints and run records (no torch import).

A temp file in the same folder (`.<name>.tmp`) is written (+ its data synced) and renamed over the target
(+ fsync of the folder), so a crash leaves either the previous file or the complete new one under the
final name — and possibly the temp file, which `remove_unfinished` clears away.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

TEMP_SUFFIX = ".tmp"  # `.<name>.tmp`: the hidden temp file a write goes to before its rename


def write_atomic(path: Path, data: bytes, fsync: bool = True, sync_folder: bool = True) -> None:
    """Temp file in the same folder, write (+ sync its data), rename over `path` (+ fsync the folder)."""
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        replace_in(dir_fd, path.name, data, fsync)
        if sync_folder:
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def replace_in(dir_fd: int, name: str, data: bytes, fsync: bool = True, reuse: Optional[str] = None) -> None:
    """The atomic replacement of `name` in the open folder `dir_fd`: `.<name>.tmp` is written
    (+ its data synced) and renamed over it. The folder's own fsync is the caller's, once for several files.

    `reuse` names a file in the folder that is no longer wanted (the oldest checkpoint): it is renamed
    to the temp name and overwritten in place, so its disk blocks are used again — nothing to free and
    allocate, and when the size is unchanged the data sync has no metadata to commit. If it is gone,
    a new temp file is made instead.

    Plain `os` calls relative to the open folder: each is one system call without a path walk, and
    one hand-over of the GIL when this runs on a background thread while training goes on.
    """
    tmp = f".{name}{TEMP_SUFFIX}"
    try:
        reused = False
        if reuse is not None:
            try:
                os.replace(reuse, tmp, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                reused = True
            except FileNotFoundError:
                pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | (0 if reused else os.O_TRUNC), 0o666, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if reused and os.fstat(fd).st_size > len(data):
                os.ftruncate(fd, len(data))  # the reused file was longer
            if fsync:
                sync_data(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # e.g. disk full: the previous file under `name` is untouched
        except FileNotFoundError:
            pass
        raise


def sync_data(fd: int) -> None:
    """Flush a file's data, and the metadata needed to read it back (its size, its blocks), to disk:
    fdatasync where the system has it (it skips timestamps, which need a journal commit), else fsync."""
    getattr(os, "fdatasync", os.fsync)(fd)


def remove_unfinished(folder: Path) -> list[str]:
    """Delete, anywhere below `folder`, the temp files of writes that a kill interrupted: they are
    never read, and must not be sealed as a run's artifacts. Returns their paths relative to `folder`."""
    removed = []
    for path in sorted(folder.rglob(f".*{TEMP_SUFFIX}")):
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path.relative_to(folder).as_posix())
    return removed
