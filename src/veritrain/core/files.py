"""Atomic file replacement, shared by checkpoints and run records (no torch import).

A temp file in the same folder (`.<name>.tmp`) is written (+ its data synced) and renamed over the target
(+ fsync of the folder), so a crash leaves either the previous file or the complete new one under the
final name — and possibly the temp file, which `remove_unfinished` clears away.
"""

from __future__ import annotations

import os
import stat
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


def replace_in(dir_fd: int, name: str, data: bytes, fsync: bool = True) -> None:
    """The atomic replacement of `name` in the open folder `dir_fd`: a new `.<name>.tmp` is written
    (+ its data synced) and renamed over it, so a reader sees the old file or the new one, never a mix.
    The folder's own fsync is the caller's, once for several files."""
    tmp = f".{name}{TEMP_SUFFIX}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
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


def sync_tree(folder: Path) -> None:
    """Flush every file below `folder`, and the folders, to disk (before the rename that makes them visible)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for path in sorted({p.parent for p in folder.rglob("*")} | {folder}):
        sync_folder(path)


def sync_folder(path: Path) -> None:
    """fsync a folder, so the renames in it are on disk; best effort (some filesystems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


MAX_READ_BYTES = 32 << 20  # what one read of a run's file for a page or a listing takes at most: far above a long run's logs


def read_regular(path: Path, start: int = 0, limit: int = MAX_READ_BYTES, tail: bool = False) -> Optional[tuple[bytes, int, int]]:
    """(bytes, the offset they start at, the file's size) of the regular file `path`, from `start`, at most `limit` of
    them (with `tail`, the last `limit` from `start` on); None for anything else. The file is opened without following a
    link and without blocking, and refused before a byte is read when it is not a regular file, so a FIFO or a device
    planted in a run never hangs the reader, and no file is read whole into memory past `limit`."""

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        begin = max(start, info.st_size - limit) if tail else start
        os.lseek(fd, begin, os.SEEK_SET)
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), begin, info.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def output_file_problem(path: Path) -> Optional[str]:
    """Why `path` cannot take a file a command writes (`--out FILE`), or None: what is there must be a regular file (a
    FIFO would block the write, a device would be written into), and the folder it goes in must not be a file."""

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        parent = path.parent
        return f"{parent} is not a folder" if parent.exists() and not parent.is_dir() else None
    except OSError as err:
        return f"cannot be checked ({err.strerror})"
    if stat.S_ISDIR(mode):
        return "a folder; give a file"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, socket or device); give a file"
    return None
