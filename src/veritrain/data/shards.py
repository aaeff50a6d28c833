"""Shards: a field of a data version (one value per sample: an array of a fixed shape and dtype, or a byte string)
stored in files that hold content only, named by their content, read with every byte checked before it is used.
docs/shards.md describes the format for anyone who reads it without veritrain.

A shard file is bytes in one of two layouts; its entry (`ShardEntry`, kept in version.json and bound by the version
id) says which, and how many rows it holds:

- `array`: the rows one after another, each `shape` values of `dtype` (little-endian, C order): row i starts at
  i × row_bytes;
- `blob`: an offset table of rows + 1 little-endian uint64 (where each row's payload starts, counted from the end of
  the table, and where the last ends), then the payloads one after another.

The file is cut into blocks of BLOCK bytes (the last may be shorter; an empty file has none). The entry lists each
block's SHA-256, and the shard's id is the SHA-256 of those hex digests, each followed by a newline (`shard_id`), so
a shard is stored under its id (`path_of`) and two versions holding the same content hold the same file. Equal
values give equal bytes: nothing else (no time, no order of writing) goes into a shard.

A reader (`Shard`) reads the blocks a row touches with positioned reads into memory and checks each against its
digest before any of its bytes is used, so random access checks only what it touches and a damaged or replaced block
is an error, never a value; a few checked blocks are kept for the next reads. `verify_shard` hashes every byte once.
Which rows go into which shard is the caller's: `cuts` places the boundaries by the rows' keys, so that a row added
or removed changes the one shard it falls in.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from veritrain.core.errors import RunFailed

BLOCK = 1 << 20  # bytes per block
CACHE_BYTES = 64 << 20  # checked blocks a field's reader keeps for the next reads, all its shards together
LAYOUTS = ("array", "blob")
_HEX = re.compile(r"[0-9a-f]{64}")
_MAX_ROWS = 1 << 40


class ShardError(RunFailed):
    """A shard's bytes are not the ones its entry names (damaged, cut short, replaced), or its entry is not one a
    writer could have made."""


@dataclass(frozen=True)
class ShardEntry:
    """What version.json says of one shard: its id, layout, rows, size in bytes and block digests, and for an
    `array` the dtype (numpy's text, little-endian) and the shape of one row."""

    id: str
    layout: str
    rows: int
    size: int
    blocks: tuple[str, ...]
    dtype: Optional[str] = None
    shape: Optional[tuple[int, ...]] = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "layout": self.layout, "rows": self.rows, "size": self.size, "blocks": list(self.blocks)}
        if self.layout == "array":
            out.update(dtype=self.dtype, shape=list(self.shape or ()))
        return out

    @classmethod
    def from_dict(cls, entry: Any, where: str = "shard") -> ShardEntry:
        """An entry read from a file: every field checked (types, digests, the size against the blocks and the rows),
        so nothing below trusts a hand-edited or hostile one."""
        if not isinstance(entry, Mapping):
            raise ShardError(f"{where}: not an object")
        layout, rows, size, blocks = entry.get("layout"), _whole(entry.get("rows")), _whole(entry.get("size")), entry.get("blocks")
        if layout not in LAYOUTS:
            raise ShardError(f"{where}: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        if rows is None or size is None or rows > _MAX_ROWS:
            raise ShardError(f"{where}: rows and size must be whole numbers ≥ 0")
        if not isinstance(blocks, list) or not all(isinstance(b, str) and _HEX.fullmatch(b) for b in blocks) or len(blocks) != -(-size // BLOCK):
            raise ShardError(f"{where}: blocks must list one SHA-256 (64 lowercase hex digits) per {BLOCK} bytes of its {size}")
        if entry.get("id") != shard_id(blocks):
            raise ShardError(f"{where}: id {str(entry.get('id'))[:80]!r} is not the hash of its block list")
        dtype, shape = None, None
        if layout == "array":
            dtype, shape = _array_type(entry.get("dtype"), entry.get("shape"), where)
            if size != rows * _row_bytes(dtype, shape):
                raise ShardError(f"{where}: {rows} rows of {shape} {dtype} are not {size} bytes")
        elif size < 8 * (rows + 1):
            raise ShardError(f"{where}: {size} bytes cannot hold the offset table of {rows} rows")
        return cls(str(entry["id"]), str(layout), rows, size, tuple(blocks), dtype, shape)


def shard_id(blocks: Sequence[str]) -> str:
    """The id of a shard whose blocks hash to `blocks` (hex): SHA-256 of each digest followed by a newline."""
    return hashlib.sha256("".join(f"{b}\n" for b in blocks).encode()).hexdigest()


def path_of(store: Path, shard: str) -> Path:
    """Where the store keeps the shard of id `shard`."""
    return store / shard[:2] / shard


# ---------------------------------------------------------------- writing


def write_array(store: Path, values: np.ndarray) -> ShardEntry:
    """A shard of the rows of `values` (first axis: rows), stored in `store` under its id."""
    values = np.asarray(values)
    if values.ndim < 1 or values.dtype.kind not in "biuf" or values.dtype.hasobject:
        raise ValueError(f"an array shard holds rows of numbers, not {values.dtype} of shape {values.shape}")
    little = values.dtype.newbyteorder("<")
    entry = _store(store, np.ascontiguousarray(values.astype(little, copy=False)).tobytes())
    return ShardEntry(entry.id, "array", int(values.shape[0]), entry.size, entry.blocks, little.str, tuple(int(n) for n in values.shape[1:]))


def write_blob(store: Path, payloads: Iterable[bytes]) -> ShardEntry:
    """A shard of one byte string per row, stored in `store` under its id."""
    items = [bytes(p) for p in payloads]
    ends = np.cumsum([0] + [len(p) for p in items], dtype=np.uint64)
    data = ends.astype("<u8").tobytes() + b"".join(items)
    entry = _store(store, data)
    return ShardEntry(entry.id, "blob", len(items), entry.size, entry.blocks)


def _store(store: Path, data: bytes) -> ShardEntry:
    """`data` as the shard file of its id: written to a temporary file and renamed, unless the store already holds
    those exact bytes (a file under the id whose blocks differ, damaged say, is replaced)."""
    blocks = tuple(hashlib.sha256(data[k:k + BLOCK]).hexdigest() for k in range(0, len(data), BLOCK))
    ident = shard_id(blocks)
    entry = ShardEntry(ident, "blob", 0, len(data), blocks)
    target = path_of(store, ident)
    if target.is_file() and target.stat().st_size == len(data) and not verify_shard(target, entry):
        return entry
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{ident}.{uuid.uuid4().hex}.partial")
    with open(partial, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    partial.replace(target)
    return entry


def cuts(keys: Sequence[str], rows_per_shard: int) -> list[int]:
    """Where rows with these keys (in the order they are stored) are cut into shards, as `FieldWriter` cuts them:
    after each row whose key's SHA-256 (its first 8 bytes, big-endian) is 0 modulo `rows_per_shard`, and after
    4 × rows_per_shard rows without one. A boundary depends on the key before it alone, so adding or removing a row
    changes only the shard it falls in (and, rarely, its neighbour when the cap decides). Returns the end of each
    shard; the last is len(keys)."""
    _check_rows_per_shard(rows_per_shard)
    ends, since = [], 0
    for index, key in enumerate(keys):
        since += 1
        if _ends_shard(key, since, rows_per_shard):
            ends.append(index + 1)
            since = 0
    if keys and (not ends or ends[-1] != len(keys)):
        ends.append(len(keys))
    return ends


BLOCK_ROWS = 1024  # an array field's rows are gathered this many at a time before its shard is written


class FieldWriter:
    """A field written as its rows come, in the order of their keys: a shard is written at each cut (`cuts`), so
    memory holds one shard's rows at most. `close()` returns the field's entries in order."""

    def __init__(self, store: Path, layout: str, rows_per_shard: int) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}; give one of {', '.join(LAYOUTS)}")
        _check_rows_per_shard(rows_per_shard)
        self.store, self.layout, self.rows_per_shard = store, layout, rows_per_shard
        self.entries: list[ShardEntry] = []
        self._rows: list[Any] = []  # a blob field's values; an array field's blocks of rows (BLOCK_ROWS each)
        self._count = 0  # rows since the last shard

    def add(self, key: str, value: Any) -> None:
        """The next row (`value`: an array of the field's shape and dtype, or bytes) and the key it is stored by."""
        if self.layout == "blob":
            self._rows.append(value)
        else:  # into blocks of rows: a shard of a million small rows is not a million objects
            value = np.asarray(value)
            if not self._rows or self._count % BLOCK_ROWS == 0:
                if self._rows and (value.shape != self._rows[0].shape[1:] or value.dtype != self._rows[0].dtype):
                    self._refuse(value)
                self._rows.append(np.empty((BLOCK_ROWS, *value.shape), dtype=value.dtype))
            elif value.shape != self._rows[0].shape[1:] or value.dtype != self._rows[0].dtype:
                self._refuse(value)
            self._rows[-1][self._count % BLOCK_ROWS] = value
        self._count += 1
        if _ends_shard(key, self._count, self.rows_per_shard):
            self._flush()

    def _refuse(self, value: np.ndarray) -> None:
        first = self._rows[0]
        raise ValueError(f"an array field's rows share one shape and dtype ({first.shape[1:]} {first.dtype}, then {value.shape} {value.dtype}); "
                         "give a blob field otherwise")

    def close(self) -> list[ShardEntry]:
        if self._count:
            self._flush()
        return list(self.entries)

    def _flush(self) -> None:
        if self.layout == "blob":
            self.entries.append(write_blob(self.store, self._rows))
        else:
            self.entries.append(write_array(self.store, np.concatenate(self._rows)[:self._count]))
        self._rows, self._count = [], 0


class StreamWriter:
    """A token stream (one split's documents, in the order of their keys) written as chunk shards of an array field
    whose rows are tokens: a chunk ends after a document `cuts` would end a shard after, so a document added changes
    only its own chunk. `close()` returns the chunks' entries and where each document starts in the stream; a window
    is then `Field(store, entries).span(start, start + length)`, across chunks."""

    def __init__(self, store: Path, dtype: str, documents_per_chunk: int) -> None:
        _check_rows_per_shard(documents_per_chunk)
        if np.dtype(dtype).kind != "u":
            raise ValueError(f"dtype {dtype!r}; tokens are stored as unsigned whole numbers (e.g. '<u2')")
        self.store, self.dtype, self.per_chunk = store, np.dtype(dtype).newbyteorder("<"), documents_per_chunk
        self.entries: list[ShardEntry] = []
        self.starts = array("q")
        self._chunk: Optional[_GrowingShard] = None
        self._rows = 0  # documents in the chunk being written
        self._written = 0  # tokens written before it

    def add(self, key: str, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens)
        whole = tokens.dtype.kind in "iu" and (not tokens.size or 0 <= tokens.min() <= tokens.max() <= np.iinfo(self.dtype).max)
        if tokens.ndim != 1 or not whole:
            raise ValueError(f"a document's tokens are one row of whole numbers ≥ 0 that fit {self.dtype}")
        if self._chunk is None:
            self._chunk = _GrowingShard(self.store)
        self.starts.append(self._written + self._chunk.size // self.dtype.itemsize)
        self._chunk.write(tokens.astype(self.dtype, copy=False).tobytes())
        self._rows += 1
        if _ends_shard(key, self._rows, self.per_chunk):
            self._flush()

    def close(self) -> tuple[list[ShardEntry], list[int]]:
        if self._chunk is not None:
            self._flush()
        return list(self.entries), self.starts.tolist()

    def _flush(self) -> None:
        chunk = self._chunk if self._chunk is not None else _GrowingShard(self.store)
        entry = chunk.close()
        rows = entry.size // self.dtype.itemsize
        self.entries.append(ShardEntry(entry.id, "array", rows, entry.size, entry.blocks, self.dtype.str, ()))
        self._written += rows
        self._chunk, self._rows = None, 0


class _GrowingShard:
    """A shard written as its bytes come, in the same bytes `_store` would write: each whole block hashed as it fills
    and appended to a partial file in the store, renamed to the shard's id at `close` (or dropped when the store
    already holds those exact bytes). Memory holds one block."""

    def __init__(self, store: Path):
        store.mkdir(parents=True, exist_ok=True)
        self.store, self.size = store, 0
        self._partial = store / f".{uuid.uuid4().hex}.partial"
        self._file = open(self._partial, "wb")
        self._pending = bytearray()
        self._blocks: list[str] = []

    def write(self, data: bytes) -> None:
        self._pending += data
        self.size += len(data)
        if len(self._pending) >= BLOCK:
            whole = len(self._pending) - len(self._pending) % BLOCK
            view = memoryview(self._pending)
            for k in range(0, whole, BLOCK):
                self._blocks.append(hashlib.sha256(view[k:k + BLOCK]).hexdigest())
            self._file.write(view[:whole])
            view.release()
            del self._pending[:whole]

    def close(self) -> ShardEntry:
        try:
            if self._pending:
                self._blocks.append(hashlib.sha256(self._pending).hexdigest())
                self._file.write(self._pending)
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()
        entry = ShardEntry(shard_id(tuple(self._blocks)), "blob", 0, self.size, tuple(self._blocks))
        target = path_of(self.store, entry.id)
        if target.is_file() and target.stat().st_size == self.size and not verify_shard(target, entry):
            self._partial.unlink()
            return entry
        target.parent.mkdir(parents=True, exist_ok=True)
        self._partial.replace(target)
        return entry


def _ends_shard(key: str, since: int, rows_per_shard: int) -> bool:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % rows_per_shard == 0 or since >= 4 * rows_per_shard


def _check_rows_per_shard(rows_per_shard: int) -> None:
    if not isinstance(rows_per_shard, int) or rows_per_shard < 1:
        raise ValueError(f"rows_per_shard={rows_per_shard}; give a whole number ≥ 1")


def link(store: Path, entry: ShardEntry, folder: Path) -> None:
    """The shard of `entry`, kept in `store`, made part of `folder` (a data version being written) at `path_of(folder,
    id)`: a hard link, so versions that hold the same shard share its bytes on disk (a copy where the file system has
    no links). Nothing ever writes into a shard's file again: a store that replaces one writes a new file."""
    source, target = path_of(store, entry.id), path_of(folder, entry.id)
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


@dataclass(frozen=True)
class FieldSpec:
    """A field as version.json lists it: its layout (and for an `array` the dtype and shape of a row), how many rows
    it holds, and its shards in order (every one of the field's layout and type, their rows adding up)."""

    name: str
    layout: str
    rows: int
    shards: tuple[ShardEntry, ...]
    dtype: Optional[str] = None
    shape: Optional[tuple[int, ...]] = None

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.shards)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"layout": self.layout, "rows": self.rows}
        if self.layout == "array":
            out.update(dtype=self.dtype, shape=list(self.shape or ()))
        out["shards"] = [entry.as_dict() for entry in self.shards]
        return out

    @classmethod
    def of(cls, name: str, entries: Sequence[ShardEntry], layout: str, dtype: Optional[str] = None,
           shape: Optional[Sequence[int]] = None) -> FieldSpec:
        return cls(name, layout, sum(e.rows for e in entries), tuple(entries), dtype, None if shape is None else tuple(int(n) for n in shape))

    @classmethod
    def from_dict(cls, name: Any, spec: Any, where: str = "fields") -> FieldSpec:
        """A field read from a file, each shard entry checked (`ShardEntry.from_dict`) and every one agreeing with
        the field's layout, dtype and shape."""
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", name):
            raise ShardError(f"{where}: field name {str(name)[:40]!r} is not a lowercase word")
        where = f"{where}.{name}"
        if not isinstance(spec, Mapping) or not isinstance(spec.get("shards"), list):
            raise ShardError(f"{where}: not an object with a list of shards")
        layout, rows = spec.get("layout"), _whole(spec.get("rows"))
        if layout not in LAYOUTS or rows is None:
            raise ShardError(f"{where}: layout must be one of {', '.join(LAYOUTS)} and rows a whole number ≥ 0")
        dtype, shape = _array_type(spec.get("dtype"), spec.get("shape"), where) if layout == "array" else (None, None)
        entries = tuple(ShardEntry.from_dict(e, f"{where}.shards[{k}]") for k, e in enumerate(spec["shards"]))
        for k, entry in enumerate(entries):
            if (entry.layout, entry.dtype, entry.shape) != (layout, dtype, shape):
                raise ShardError(f"{where}.shards[{k}]: a {entry.layout} shard of {entry.shape} {entry.dtype} in a {layout} field "
                                 f"of {shape} {dtype}")
        if sum(e.rows for e in entries) != rows:
            raise ShardError(f"{where}: its shards hold {sum(e.rows for e in entries)} rows, not {rows}")
        return cls(name, str(layout), rows, entries, dtype, shape)

    def reader(self, folder: Path) -> Field:
        return Field(folder, self.shards)


def array_of(spec: FieldSpec, folder: Path, in_memory: int, eager: bool = False) -> Any:
    """An array field of a version in `folder`, for reading like an array: a `FieldArray` that reads the rows asked for,
    and reads the whole field into memory at its first read (every block checked once) when it is at most `in_memory`
    bytes; with `eager`, that whole read now, as a read-only array."""
    if spec.layout != "array":
        raise ShardError(f"field {spec.name} is a {spec.layout} field, not an array")
    if eager and spec.size <= in_memory:
        if not spec.shards:
            values = np.empty((0, *(spec.shape or ())), dtype=np.dtype(spec.dtype))
        else:
            field = spec.reader(folder)
            values = field.values()
            field.close()
        values.flags.writeable = False
        return values
    if not spec.shards:
        return np.empty((0, *(spec.shape or ())), dtype=np.dtype(spec.dtype))
    return FieldArray(spec.reader(folder), whole_up_to=in_memory)


# ---------------------------------------------------------------- reading


class CheckedBlocks:
    """The checked blocks a reader keeps, least recently used first out, up to `limit` bytes (shared by the shards of a
    field, so memory stays bounded however many shards it has)."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.limit, self.held = limit, 0
        self._blocks: OrderedDict[tuple[int, int], bytes] = OrderedDict()

    def get(self, key: tuple[int, int]) -> Optional[bytes]:
        block = self._blocks.get(key)
        if block is not None:
            self._blocks.move_to_end(key)
        return block

    def put(self, key: tuple[int, int], block: bytes) -> None:
        self._blocks[key] = block
        self.held += len(block)
        while self.held > self.limit and len(self._blocks) > 1:
            _, dropped = self._blocks.popitem(last=False)
            self.held -= len(dropped)

    def drop(self, owner: int) -> None:
        for key in [k for k in self._blocks if k[0] == owner]:
            self.held -= len(self._blocks.pop(key))


class Shard:
    """One shard's rows, read from `path` with every block checked against `entry` before it is used; the checked
    blocks are kept in `cache` (a field's readers share one) for the next reads."""

    def __init__(self, path: Path, entry: ShardEntry, cache: Optional[CheckedBlocks] = None) -> None:
        self.path, self.entry = path, entry
        self._fd: Optional[int] = None
        self._cache = cache if cache is not None else CheckedBlocks()
        self._table: Optional[np.ndarray] = None  # a blob's offset table, once read

    def __len__(self) -> int:
        return self.entry.rows

    def __enter__(self) -> Shard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._cache.drop(id(self))

    def get(self, row: int) -> Any:
        """Row `row`: an array of the entry's shape and dtype (a copy), or the bytes of a blob's row."""
        if not 0 <= row < self.entry.rows:
            raise IndexError(f"row {row} of a shard of {self.entry.rows}")
        if self.entry.layout == "array":
            width = _row_bytes(self.entry.dtype, self.entry.shape)
            data = self.read(row * width, (row + 1) * width)
            return np.frombuffer(data, dtype=np.dtype(self.entry.dtype)).reshape(self.entry.shape or ()).copy()
        table = self.offsets()
        start, end = int(table[row]), int(table[row + 1])
        header = 8 * (self.entry.rows + 1)
        return self.read(header + start, header + end)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows of an `array` shard at these positions (any order, repeats allowed), as one array: each block they
        touch is read and checked once, into a buffer the size of the shard (only those blocks are filled), which the
        rows are then gathered from."""
        shape, dtype = self._array_type()
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.entry.rows):
            raise IndexError(f"rows outside a shard of {self.entry.rows}")
        width = _row_bytes(dtype, shape)
        if not rows.size or not width:
            return np.zeros((len(rows), *shape), dtype=np.dtype(dtype))
        first, last = rows * width // BLOCK, ((rows + 1) * width - 1) // BLOCK
        needed = np.unique(np.concatenate([first, last]))
        if width > BLOCK:  # a row longer than a block: the blocks between its first and last too
            needed = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]))
        buffer = np.empty(self.entry.size, dtype=np.uint8)
        for index in needed.tolist():
            block = self._block(index)
            buffer[index * BLOCK:index * BLOCK + len(block)] = np.frombuffer(block, dtype=np.uint8)
        return buffer.view(np.dtype(dtype)).reshape(self.entry.rows, *shape)[rows]

    def values(self) -> np.ndarray:
        """Every row of an `array` shard, read front to back with each block checked (none kept for later reads)."""
        shape, dtype = self._array_type()
        out = np.empty(self.entry.size, dtype=np.uint8)
        for index in range(len(self.entry.blocks)):
            block = self._fetch(index)
            out[index * BLOCK:index * BLOCK + len(block)] = np.frombuffer(block, dtype=np.uint8)
        return out.view(np.dtype(dtype)).reshape(self.entry.rows, *shape)

    def _array_type(self) -> tuple[tuple[int, ...], str]:
        if self.entry.layout != "array" or self.entry.dtype is None:
            raise ShardError(f"{self.path}: a {self.entry.layout} shard holds bytes, not array rows")
        return self.entry.shape or (), self.entry.dtype

    def offsets(self) -> np.ndarray:
        """A blob's offset table (checked: it starts at 0, never decreases and ends at the file's end)."""
        if self._table is None:
            rows, header = self.entry.rows, 8 * (self.entry.rows + 1)
            table = np.frombuffer(self.read(0, header), dtype="<u8")
            if table[0] != 0 or np.any(np.diff(table.astype(np.int64)) < 0) or int(table[-1]) != self.entry.size - header:
                raise ShardError(f"{self.path}: the offset table of its {rows} rows does not cover its {self.entry.size} bytes")
            self._table = table
        return self._table

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the shard, from checked blocks only."""
        if not 0 <= start <= end <= self.entry.size:
            raise ShardError(f"{self.path}: bytes {start}–{end} lie outside its {self.entry.size}")
        if start == end:
            return b""
        first, last = start // BLOCK, (end - 1) // BLOCK
        if first == last:
            block = self._block(first)
            return block[start - first * BLOCK:end - first * BLOCK]
        joined = b"".join(self._block(k) for k in range(first, last + 1))
        return joined[start - first * BLOCK:end - first * BLOCK]

    def _block(self, index: int) -> bytes:
        held = self._cache.get((id(self), index))
        if held is not None:
            return held
        data = self._fetch(index)
        self._cache.put((id(self), index), data)
        return data

    def _fetch(self, index: int) -> bytes:
        """Block `index` read from the file and checked against its digest."""
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as err:
                raise ShardError(f"{self.path}: cannot be read ({err.strerror or err}): the data version that holds it is damaged; "
                                 "remove it and prepare it again (`veritrain data prepare CONFIG`)") from None
        want = min(BLOCK, self.entry.size - index * BLOCK)
        data = os.pread(self._fd, want, index * BLOCK)
        if len(data) != want or hashlib.sha256(data).hexdigest() != self.entry.blocks[index]:
            raise ShardError(f"{self.path}: block {index} is not the one its entry names: damaged or replaced; nothing was read from it: "
                             "remove the data version that holds it and prepare it again (`veritrain data prepare CONFIG`), or import its "
                             "run again with --with-data")
        return data


class Field:
    """A field's rows over its shards in order (a virtual concatenation): row i of the field is row i − start of the
    shard that holds it."""

    def __init__(self, store: Path, entries: Sequence[ShardEntry]) -> None:
        cache = CheckedBlocks()
        self.shards = [Shard(path_of(store, e.id), e, cache) for e in entries]
        self.ends = np.cumsum([len(s) for s in self.shards], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def get(self, row: int) -> Any:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} of a field of {len(self)}")
        index = int(np.searchsorted(self.ends, row, side="right"))
        start = int(self.ends[index - 1]) if index else 0
        return self.shards[index].get(row - start)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows at these positions of an array field, as one array, each shard's rows read together."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows outside a field of {len(self)}")
        owner = np.searchsorted(self.ends, rows, side="right")
        parts, where = [], []
        for index in np.unique(owner):
            chosen = np.nonzero(owner == index)[0]
            start = int(self.ends[index - 1]) if index else 0
            parts.append(self.shards[int(index)].take(rows[chosen] - start))
            where.append(chosen)
        if not parts:
            shape, dtype = self.shards[0]._array_type() if self.shards else ((), "|u1")
            return np.empty((0, *shape), dtype=np.dtype(dtype))
        out = np.empty((len(rows), *parts[0].shape[1:]), dtype=parts[0].dtype)
        for chosen, part in zip(where, parts):
            out[chosen] = part
        return out

    def span(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of an array field, across shard boundaries (a token stream's window): only the blocks
        that hold them are read."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows {start}–{stop} outside a field of {len(self)}")
        pieces = []
        first = int(np.searchsorted(self.ends, start, side="right"))
        for index in range(first, len(self.shards)):
            begin = int(self.ends[index - 1]) if index else 0
            if begin >= stop:
                break
            shard = self.shards[index]
            shape, dtype = shard._array_type()
            width = _row_bytes(dtype, shape)
            a, b = max(start, begin) - begin, min(stop, int(self.ends[index])) - begin
            pieces.append(np.frombuffer(shard.read(a * width, b * width), dtype=np.dtype(dtype)).reshape(b - a, *shape))
        if not pieces:
            return self.take(np.empty(0, dtype=np.int64))
        return pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces)

    def values(self) -> np.ndarray:
        """Every row of an array field in one array (a field that fits in memory, read once, every block checked)."""
        if not self.shards:
            return np.empty(0)
        if len(self.shards) == 1:
            return self.shards[0].values()
        shape, dtype = self.shards[0]._array_type()
        out = np.empty((len(self), *shape), dtype=np.dtype(dtype))  # filled shard by shard: one copy in memory, not two
        for shard, end in zip(self.shards, self.ends.tolist()):
            out[end - len(shard):end] = shard.values()
        return out

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


class FieldArray:
    """An array field read like the read-only array a data version's `inputs` was: `shape`, `dtype`, `ndim`, `len`,
    and indexing by a row, a slice of rows or an array of rows (each read from checked blocks), so a task that
    indexes `data.inputs[rows]` reads shards unchanged. A field of at most `whole_up_to` bytes is read whole at its
    first read (every block checked once) and served from memory after: small data trains as fast as from an array,
    and a process that never reads it (a prepare that reuses a version) never holds it."""

    def __init__(self, field: Field, whole_up_to: int = 0) -> None:
        if not field.shards:
            raise ShardError("an array field needs at least one shard (an empty one names its dtype and shape)")
        shape, dtype = field.shards[0]._array_type()
        if any(s._array_type() != (shape, dtype) for s in field.shards):
            raise ShardError(f"{field.shards[0].path}: the shards of one field differ in shape or dtype")
        self.field, self.dtype = field, np.dtype(dtype)
        self.shape = (len(field), *shape)
        self.ndim = len(self.shape)
        self.whole_up_to = whole_up_to
        self._whole: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return self.shape[0]

    def whole(self) -> Any:
        """The field as one read-only array when it is at most `whole_up_to` bytes (read now if not yet), else itself."""
        if self._whole is None and sum(s.entry.size for s in self.field.shards) <= self.whole_up_to:
            values = self.field.values()
            values.flags.writeable = False
            self._whole = values
            self.field.close()
        return self._whole if self._whole is not None else self

    def __getitem__(self, index: Any) -> np.ndarray:
        whole = self.whole()
        if whole is not self:
            return whole[index]
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            row = int(index) + (len(self) if index < 0 else 0)
            return self.field.take(np.array([row], dtype=np.int64))[0]
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return self.field.span(start, max(start, stop))
            return self.field.take(np.arange(start, stop, step, dtype=np.int64))
        rows = np.asarray(index)
        if rows.dtype == bool and rows.ndim == 1:
            rows = np.nonzero(rows)[0]
        if rows.dtype.kind not in "iu" or rows.dtype == bool:
            raise IndexError("index a field by a row, a slice of rows or an array of rows (a token stream's windows: one row of "
                             "positions each)")
        flat = rows.astype(np.int64).reshape(-1)
        taken = self.field.take(np.where(flat < 0, flat + len(self), flat))
        return taken.reshape(*rows.shape, *self.shape[1:])

    def __getattr__(self, name: str) -> Any:
        """What else an array has (`max`, `astype`, ...), from the whole field when it fits in memory."""
        if name.startswith("_") or name in ("field", "whole_up_to"):
            raise AttributeError(name)
        whole = self.whole()
        if whole is self:
            raise AttributeError(f"{name}: a field of {self.shape} {self.dtype} larger than {self.whole_up_to} bytes is read by rows "
                                 "(index it, or np.asarray(field) to read it all)")
        return getattr(whole, name)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.whole()
        values = whole if whole is not self else self.field.values()
        return values if dtype is None else values.astype(dtype)


def verify_shard(path: Path, entry: ShardEntry) -> list[str]:
    """Every block of the file at `path` against `entry`, each byte hashed once: the problems, one line each (none:
    the file holds exactly the entry's bytes)."""
    try:
        size = path.stat().st_size
    except OSError as err:
        return [f"{path}: missing ({err.strerror or err})"]
    problems = [f"{path}: {size} bytes, its entry says {entry.size}"] if size != entry.size else []
    with open(path, "rb", buffering=0) as f:
        for index, digest in enumerate(entry.blocks):
            data = f.read(BLOCK)
            if hashlib.sha256(data).hexdigest() != digest:
                problems.append(f"{path}: block {index} differs from its entry")
    return problems


# ---------------------------------------------------------------- helpers


def _count(value: Any) -> bool:
    return _whole(value) is not None


def _whole(value: Any) -> Optional[int]:
    """`value` when it is a whole number ≥ 0 (a bool is not), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _array_type(dtype: Any, shape: Any, where: str) -> tuple[str, tuple[int, ...]]:
    try:
        parsed = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        parsed = None
    if parsed is None or parsed.kind not in "biuf" or parsed.str != dtype or parsed.byteorder == ">":
        raise ShardError(f"{where}: dtype {str(dtype)[:40]!r} is not a little-endian number type as numpy writes it (e.g. '|u1', '<f4')")
    if not isinstance(shape, list) or len(shape) > 8 or not all(_count(n) and n <= 1 << 20 for n in shape):
        raise ShardError(f"{where}: shape must be a list of at most 8 whole numbers ≥ 0")
    return dtype, tuple(shape)


def _row_bytes(dtype: Optional[str], shape: Optional[tuple[int, ...]]) -> int:
    return int(np.dtype(dtype).itemsize * int(np.prod(shape or (), dtype=np.int64)))
