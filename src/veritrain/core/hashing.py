"""Content hashing: files (read in chunks), canonical JSON, model state, and raw data files.

SHA-256 in run records, so anyone can re-check a record with standard tools (`sha256sum`); BLAKE3
for raw data files, where speed matters (hashed in parallel, with a stat cache so unchanged files are
not read again). Canonical JSON (sorted keys, fixed separators, UTF-8) makes a hash of a structure
independent of dict order and formatting.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

if TYPE_CHECKING:
    import sqlite3

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
    """SHA-256 of `canonical_json(obj)`. A `JsonRows` anywhere in `obj` (under dicts) is hashed as the list of its rows,
    a batch at a time, so a million rows are never one list or one string: the digest is the one of the whole list."""
    digest = hashlib.sha256()
    _feed_json(digest, obj)
    return digest.hexdigest()


class JsonRows:
    """A list that `sha256_json` reads row by row from `rows()` (called once), never holding them all."""

    def __init__(self, rows: Callable[[], Iterable[Any]]):
        self.rows = rows


JSON_ROWS_AT_ONCE = 4096


def _feed_json(digest: Any, obj: Any) -> None:
    if isinstance(obj, JsonRows):
        digest.update(b"[")
        first, batch = True, []
        for row in obj.rows():
            batch.append(row)
            if len(batch) == JSON_ROWS_AT_ONCE:
                digest.update((b"" if first else b",") + canonical_json(batch)[1:-1])
                first, batch = False, []
        if batch:
            digest.update((b"" if first else b",") + canonical_json(batch)[1:-1])
        digest.update(b"]")
    elif isinstance(obj, dict) and _holds_rows(obj):
        digest.update(b"{")
        for k, key in enumerate(sorted(obj)):
            digest.update((b"," if k else b"") + canonical_json(key) + b":")
            _feed_json(digest, obj[key])
        digest.update(b"}")
    else:
        digest.update(canonical_json(obj))


def _holds_rows(obj: Any) -> bool:
    return isinstance(obj, JsonRows) or (isinstance(obj, dict) and any(_holds_rows(v) for v in obj.values()))


def state_dict_sha256(state_dict: Mapping[str, object]) -> str:
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


# ---------------------------------------------------------------- data files: BLAKE3, parallel, stat cache

DATA_HASH_ALGORITHM = "blake3"  # ~2.5× SHA-256's speed on one core; 256-bit, collision resistant


SMALL_FILE_BYTES = 1 << 16  # 64 KiB: read in one call; larger files stream through a reused buffer


def blake3_file(path: str | Path, buffer: Optional[bytearray] = None) -> str:
    """BLAKE3 of a file read in 1 MiB chunks (never the whole file in memory)."""
    import blake3

    digest = blake3.blake3()
    buffer = buffer if buffer is not None else bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def _blake3_small(path: str) -> str:
    """A small file in one read: per-file overhead, not bandwidth, is what costs here."""
    import blake3

    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, SMALL_FILE_BYTES + 1)
        digest = blake3.blake3(data)
        while len(data) > SMALL_FILE_BYTES:  # it grew since stat: keep reading
            data = os.read(fd, CHUNK_BYTES)
            digest.update(data)
    finally:
        os.close(fd)
    return digest.hexdigest()


SQLITE_MAX_PARAMS = 900  # below SQLite's smallest default limit on bound parameters (999)


def open_cache_db(db_path: Path, *create_tables: str) -> sqlite3.Connection:
    """A cache database under `.veritrain/cache/`, in WAL mode so parallel prepares can share it."""

    db_path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(db_path, timeout=60)
    db.execute("PRAGMA journal_mode=WAL")
    for statement in create_tables:
        db.execute(statement)
    return db


def rows_where_in(db: sqlite3.Connection, query: str, keys: list[Any], params: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The rows of `query` (whose last condition is `IN ({marks})`) for all `keys`, in chunks that
    keep the number of bound parameters under SQLite's limit; `params` are bound before the keys."""
    for start in range(0, len(keys), SQLITE_MAX_PARAMS):
        chunk = keys[start : start + SQLITE_MAX_PARAMS]
        yield from db.execute(query.format(marks=",".join("?" * len(chunk))), [*params, *chunk])


class StatCache:
    """path → (size, mtime_ns, inode, hash): an unchanged file is not read again.

    Stored in SQLite (`.veritrain/cache/files.sqlite`, WAL) so parallel prepares can share it. A file
    whose size, mtime or inode changed is hashed again; `rehash=True` ignores the cache.
    """

    def __init__(self, db_path: Path):
        self.db = open_cache_db(
            db_path, "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, inode INTEGER, algorithm TEXT, hash TEXT)"
        )

    def lookup(self, paths: list[str]) -> dict[str, tuple[int, int, int, str, str]]:
        query = "SELECT path, size, mtime_ns, inode, algorithm, hash FROM files WHERE path IN ({marks})"
        return {path: tuple(rest) for path, *rest in rows_where_in(self.db, query, paths)}  # type: ignore[misc]

    def store(self, rows: list[tuple[str, int, int, int, str, str]]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)", rows)

    def close(self) -> None:
        self.db.close()


@dataclass
class FileHash:
    size: int
    digest: Optional[str]  # None when the file could not be read
    error: Optional[str] = None
    cached: bool = False


def hash_files(paths: Sequence[str | Path], cache: Optional[StatCache] = None, rehash: bool = False) -> dict[str | Path, FileHash]:
    """BLAKE3 of many files, reusing the stat cache; keyed by the paths as given (text or Path).

    Small files are hashed in this thread (a thread pool's hand-offs cost more than the hashing);
    large ones in parallel threads, since reading and BLAKE3 release the GIL.
    """

    results: dict[str | Path, FileHash] = {}
    stats: dict[str | Path, os.stat_result] = {}
    for path in paths:
        try:
            stats[path] = os.stat(path)
        except OSError as err:
            results[path] = FileHash(0, None, f"{err.strerror or err.__class__.__name__}")
    known = cache.lookup([str(p) for p in stats]) if (cache and not rehash) else {}
    small, large = [], []
    for path, st in stats.items():
        hit = known.get(str(path))
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns and hit[2] == st.st_ino and hit[3] == DATA_HASH_ALGORITHM:
            results[path] = FileHash(st.st_size, hit[4], cached=True)
        elif st.st_size <= SMALL_FILE_BYTES:
            small.append(path)
        else:
            large.append(path)

    def hashed(path: str | Path, digest_of: Callable[[str | Path], str]) -> FileHash:
        try:
            return FileHash(stats[path].st_size, digest_of(path))
        except OSError as err:
            return FileHash(stats[path].st_size, None, f"{err.strerror or err.__class__.__name__}")

    fresh: dict[str | Path, FileHash] = {path: hashed(path, lambda p: _blake3_small(str(p))) for path in small}
    workers = min(4, os.cpu_count() or 1)
    if len(large) > 1 and workers > 1:
        local = threading.local()

        def hash_large(path: str | Path) -> str:
            if not hasattr(local, "buffer"):
                local.buffer = bytearray(CHUNK_BYTES)
            return blake3_file(path, local.buffer)

        with ThreadPoolExecutor(workers) as pool:
            fresh.update(zip(large, pool.map(lambda p: hashed(p, hash_large), large)))
    else:
        buffer = bytearray(CHUNK_BYTES)
        fresh.update((p, hashed(p, lambda q: blake3_file(q, buffer))) for p in large)

    rows = []
    for path, result in fresh.items():
        results[path] = result
        if result.digest is not None:
            st = stats[path]
            rows.append((str(path), st.st_size, st.st_mtime_ns, st.st_ino, DATA_HASH_ALGORITHM, result.digest))
    if cache and rows:
        cache.store(rows)
    return results
