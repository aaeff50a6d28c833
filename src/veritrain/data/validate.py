"""Content validation of image files: every file is fully decoded before it may be trained on.

A check reads the header (format, size, mode), refuses decompression bombs before decoding, decodes
every pixel (Pillow's LOAD_TRUNCATED_IMAGES stays off, so a truncated file is an error, not a grey
stripe), compares the format with the file extension, and converts the image to the target size and
channels when asked. Results that depend only on a file's content are cached by content hash in
`.veritrain/cache/images.sqlite`, so re-preparing unchanged data decodes nothing.

Runs in worker processes; this module must stay importable without torch.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from array import array
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

import numpy as np

from veritrain.core.hashing import open_cache_db, rows_where_in
from veritrain.data import dedup
from veritrain.data.parallel import in_parallel

FINDING_SEVERITY = {
    # kind → what happens to the sample (the names are part of the public contract)
    "empty": "quarantine",
    "unreadable": "quarantine",
    "undecodable": "quarantine",
    "bomb": "quarantine",
    "format_mismatch": "warning",
    "bad_shape": "quarantine",
    "missing_label": "quarantine",
    "unknown_label": "quarantine",
    "duplicate": "warning",
    "conflicting_duplicate": "quarantine",
    "near_duplicate": "warning",
    "conflicting_near_duplicate": "quarantine",
    "near_duplicate_cluster_capped": "warning",
    "split_skew": "warning",
    "test_from_leak": "warning",
    "label_issue": "warning",
    "outlier": "warning",
    "leak_duplicate": "quarantine",
    "bad_timestamp": "quarantine",
    "imbalance": "warning",
    "too_small": "error",
    "duplicate_entry": "warning",
}
# kinds that make a sample impossible to train on, whatever `data.on_bad_file` says
UNUSABLE = {"empty", "unreadable", "undecodable", "bomb", "bad_shape", "missing_label", "unknown_label"}


@dataclass(frozen=True)
class CheckParams:
    """Everything besides the file's bytes that decides a check's result (part of its cache key)."""

    height: int
    width: int
    channels: int  # 1 → Pillow mode "L", 3 → "RGB"
    convert: bool
    max_pixels: int
    near_duplicates: bool  # also the perceptual hash and the comparison picture


    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class Header:
    format: Optional[str]
    width: int
    height: int
    mode: str
    error: Optional[str] = None  # why the header could not be read


@dataclass
class Check:
    findings: list[tuple[str, str]] = field(default_factory=list)  # (kind, reason); reasons never name the file
    phash: Optional[int] = None
    picture: Optional[np.ndarray] = None  # dedup.comparison_image, when near-duplicates are searched
    thumb: Optional[np.ndarray] = None  # dedup.thumbnail, for label issues and outliers (every usable image)
    array: Optional[np.ndarray] = None  # uint8 H×W×C at the target shape, only when decoding for the arrays

    @property
    def usable(self) -> bool:
        return not any(kind in UNUSABLE for kind, _ in self.findings)


def _hash_key(content_hash: str) -> bytes:
    """A content hash as the check cache keys it: its 32 bytes (a hex SHA-256), else its text."""
    try:
        return bytes.fromhex(content_hash) if len(content_hash) == 64 else content_hash.encode()
    except ValueError:
        return content_hash.encode()


def _params_key(params: CheckParams) -> bytes:
    return hashlib.sha256(params.key().encode()).digest()


def _image_bytes(array: Optional[np.ndarray]) -> Optional[bytes]:
    """A small uint8 image (H×W or H×W×C) as the check cache keeps it: one byte of rank, two bytes per side, the pixels."""
    if array is None:
        return None
    return bytes([array.ndim]) + b"".join(int(n).to_bytes(2, "big") for n in array.shape) + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def _image_of(data: Optional[bytes]) -> Optional[np.ndarray]:
    if data is None:
        return None
    rank = data[0]
    shape = tuple(int.from_bytes(data[1 + 2 * i:3 + 2 * i], "big") for i in range(rank))
    return np.frombuffer(data, dtype=np.uint8, offset=1 + 2 * rank).reshape(shape)


def _without_path(message: str, path: str) -> str:
    """An error message without the file's path: results are shared by every file with the same bytes, and
    each finding names its own sample."""
    return message.replace(repr(path), "the file").replace(path, "the file")


def _pillow():
    from PIL import Image, ImageFile

    ImageFile.LOAD_TRUNCATED_IMAGES = False  # never accept a truncated image as valid
    # data.max_pixels judges bombs (check_file, before decoding). Pillow's own limit would make
    # Image.open refuse a file over twice its default, so the header read would call it
    # `undecodable` instead of `bomb`.
    Image.MAX_IMAGE_PIXELS = None
    return Image


def read_header(path: str, content: Optional[bytes] = None) -> Header:
    """The header of the file at `path`, or of its `content` when the bytes were read already."""
    Image = _pillow()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bombs are judged by data.max_pixels, not Pillow's warning
            with Image.open(path if content is None else io.BytesIO(content)) as img:
                return Header(img.format, img.width, img.height, img.mode)
    except Exception as err:  # Pillow raises many types for garbage input; all mean "not an image"
        return Header(None, 0, 0, "", _without_path(f"{err.__class__.__name__}: {err}", path))


def expected_formats(path: str) -> set[str]:
    Image = _pillow()
    ext = os.path.splitext(path)[1].lower()
    return {fmt for e, fmt in Image.registered_extensions().items() if e == ext}


def check_file(path: str, header: Header, params: CheckParams, keep_array: bool, content: Optional[bytes] = None) -> Check:
    """Full check of one file whose header was read: bomb, format, complete decode, shape, hash; of `content`
    (the file's bytes, read already) when given."""
    Image = _pillow()
    check = Check()
    if header.error is not None:
        check.findings.append(("undecodable", f"not a readable image ({header.error})"))
        return check
    pixels = header.width * header.height
    if pixels > params.max_pixels:
        check.findings.append(("bomb", f"{header.width}×{header.height} = {pixels:,} pixels > data.max_pixels {params.max_pixels:,}"))
        return check
    formats = expected_formats(path)
    if header.format not in formats:
        ext = os.path.splitext(path)[1] or "(none)"
        check.findings.append(("format_mismatch", f"extension {ext} but the content is {header.format}"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path if content is None else io.BytesIO(content)) as img:
                img.load()  # decodes every pixel: truncation and corrupt data raise here
                image = img.copy()
    except Exception as err:
        check.findings.append(("undecodable", _without_path(f"decoding failed ({err.__class__.__name__}: {err})", path)))
        return check

    target_mode = "L" if params.channels == 1 else "RGB"
    size_ok = (image.height, image.width) == (params.height, params.width)
    mode_ok = image.mode == target_mode
    if not (size_ok and mode_ok):
        if not params.convert:
            check.findings.append(
                ("bad_shape", f"{image.width}×{image.height} {image.mode}, expected {params.width}×{params.height} {target_mode}; "
                 "set data.convert: true to convert")
            )
            return check
        image = image.convert(target_mode) if image.mode != target_mode else image
        if not size_ok:
            image = image.resize((params.width, params.height), Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, np.newaxis]
    if keep_array:  # decoding for the version's arrays: the features were taken when the file was checked
        check.array = array
        return check

    if params.near_duplicates:
        check.phash = dedup.perceptual_hash(array)
        check.picture = dedup.comparison_image(array)
    check.thumb = dedup.thumbnail(array)
    return check


def _check_batch(items: list[tuple[int, str, Header]], params: CheckParams) -> list[tuple[int, Check]]:
    return [(k, check_file(path, header, params, keep_array=False)) for k, path, header in items]


def _in_parallel(func: Callable[..., Iterable[Any]], items: Iterable[Any], workers: int, *args: Any, total: Optional[int] = None) -> Iterable[Any]:
    """parallel.in_parallel with batches sized by the item count (16-256): serial for small inputs (process start-up
    costs ~0.3 s)."""
    count = len(items) if total is None else total  # type: ignore[arg-type]
    size = max(16, min(256, count // (max(workers, 1) * 4)))
    return in_parallel(func, items, workers if count >= 200 else 1, *args, size=size)


class CheckCache:
    """Header and check results by content hash (files with equal bytes get equal results). A check is one row of
    plain columns: its findings (JSON, usually `[]`), the perceptual hash (8 bytes) and the comparison picture and
    thumbnail as raw bytes behind their shape (`_image_bytes`): about 2.1 KiB an image with a 32×32 picture and a
    16×16×3 thumbnail, where the earlier JSON with hex pixels took 4.5 KiB. The earlier table is dropped, and the
    file compacted, the first time it is opened."""

    def __init__(self, db_path: Path):
        self.db = open_cache_db(
            db_path,
            "CREATE TABLE IF NOT EXISTS headers (hash TEXT PRIMARY KEY, json TEXT)",
            # keyed by the content hash's 32 bytes and the SHA-256 of the parameters' key
            "CREATE TABLE IF NOT EXISTS check_rows (hash BLOB, params BLOB, findings TEXT, phash BLOB, picture BLOB, thumb BLOB, "
            "PRIMARY KEY (hash, params))",
        )
        if self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'checks'").fetchone():
            with self.db:
                self.db.execute("DROP TABLE checks")
            self.db.execute("VACUUM")

    def headers(self, hashes: list[str]) -> dict[str, Header]:
        rows = rows_where_in(self.db, "SELECT hash, json FROM headers WHERE hash IN ({marks})", hashes)
        return {h: Header(**json.loads(j)) for h, j in rows}

    def checks(self, hashes: list[str], params: CheckParams) -> dict[str, Check]:
        keys = {_hash_key(h): h for h in hashes}
        rows = rows_where_in(self.db, "SELECT hash, findings, phash, picture, thumb FROM check_rows WHERE params = ? AND hash IN ({marks})",
                             list(keys), (_params_key(params),))
        return {keys[h]: Check([tuple(f) for f in json.loads(findings)], None if phash is None else int.from_bytes(phash, "big"),  # type: ignore[misc]
                               _image_of(picture), _image_of(thumb))
                for h, findings, phash, picture, thumb in rows}

    def store_headers(self, rows: dict[str, Header]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO headers VALUES (?, ?)", [(h, json.dumps(asdict(v))) for h, v in rows.items()])

    def store_checks(self, rows: dict[str, Check], params: CheckParams) -> None:
        key = _params_key(params)
        with self.db:
            self.db.executemany(  # a generator: one row's bytes at a time, not the whole data set's
                "INSERT OR REPLACE INTO check_rows VALUES (?, ?, ?, ?, ?, ?)",
                ((_hash_key(h), key, json.dumps(c.findings), None if c.phash is None else c.phash.to_bytes(8, "big"), _image_bytes(c.picture),
                  _image_bytes(c.thumb)) for h, c in rows.items()),
            )

    def close(self) -> None:
        self.db.close()


CACHE_BATCH = 4096  # headers or checks read from or written to the check cache at once


class Pairs(Protocol):
    """Pairs of texts by position ((content hash, path), or (path, content hash)): a list of them, or a view that
    reads each from a table as it is asked for."""

    def __len__(self) -> int: ...

    def __getitem__(self, k: int) -> tuple[str, str]: ...


@dataclass
class HeaderCounts:
    """What the headers of the distinct files say, counted (`header_counts`): (height, width), channels as the
    target would take them (1 or 3), mode and format of each readable one."""

    sizes: Counter[tuple[int, int]] = field(default_factory=Counter)
    channels: Counter[int] = field(default_factory=Counter)
    modes: Counter[str] = field(default_factory=Counter)
    formats: Counter[str] = field(default_factory=Counter)

    def add(self, header: Header) -> None:
        if header.error is None:
            self.sizes[(header.height, header.width)] += 1
            self.channels[1 if header.mode in ("L", "1", "I", "I;16", "F") else 3] += 1
            self.modes[header.mode] += 1
            self.formats[str(header.format)] += 1


def header_counts(files: Pairs, cache: CheckCache, workers: int) -> HeaderCounts:
    """The headers of `files` ((content hash, path) per distinct content) counted, CACHE_BATCH at a time: those the
    cache lacks are read (in threads: a header is a few hundred bytes, and threads cost no process start-up) and
    stored, so `checks_for` finds every one there."""
    counts = HeaderCounts()
    with ThreadPoolExecutor(max(workers, 1)) as pool:
        for start in range(0, len(files), CACHE_BATCH):
            batch = [files[k] for k in range(start, min(start + CACHE_BATCH, len(files)))]
            found = cache.headers([h for h, _ in batch])
            todo = [(h, p) for h, p in batch if h not in found]
            fresh = dict(pool.map(lambda item: (item[0], read_header(item[1])), todo)) if workers > 1 and len(todo) > 200 \
                else {h: read_header(p) for h, p in todo}
            if fresh:
                cache.store_headers(fresh)
            for h, _ in batch:
                counts.add(found.get(h) or fresh[h])
    return counts


def checks_for(files: Pairs, params: CheckParams, cache: CheckCache, workers: int) -> Iterator[tuple[int, Check]]:
    """(k, check of files[k]) for every (content hash, path) of `files`, as they come: those the cache holds first,
    CACHE_BATCH at a time, then the others as the workers check them (their headers read from the cache, where
    `header_counts` put them), stored in the cache a batch at a time; so memory holds a batch of checks, never all
    of them. The decoded pixels are not kept (they are decoded again, row by row, straight into the version's
    fields by `decoded`)."""
    todo = array("q")  # positions in `files` of those to check: 8 bytes each
    for start in range(0, len(files), CACHE_BATCH):
        position = {files[k][0]: k for k in range(start, min(start + CACHE_BATCH, len(files)))}
        for digest, check in cache.checks(list(position), params).items():
            yield position.pop(digest), check
        todo.extend(sorted(position.values()))

    def work() -> Iterator[tuple[int, str, Header]]:
        for start in range(0, len(todo), CACHE_BATCH):
            batch = [(k, *files[k]) for k in todo[start:start + CACHE_BATCH]]
            headers = cache.headers([h for _, h, _ in batch])
            for k, h, path in batch:
                yield k, path, headers.get(h) or read_header(path)

    fresh: dict[str, Check] = {}
    for k, check in _in_parallel(_check_batch, work(), workers, params, total=len(todo)):
        yield k, check
        fresh[files[k][0]] = check
        if len(fresh) >= CACHE_BATCH:
            cache.store_checks(fresh, params)
            fresh = {}
    if fresh:
        cache.store_checks(fresh, params)


def decode_into(out: np.ndarray, files: Pairs, params: CheckParams, workers: int) -> list[int]:
    """Decode each row's (path, BLAKE3 content hash) into `out[row]` (a memory-mapped array), in worker
    processes that hand back one batch at a time. The bytes decoded are the bytes hashed: returns the rows
    whose file changed since it was listed, or no longer decodes."""
    failed = []
    for row, pixels in enumerate(decoded(files, params, workers)):
        if pixels is None:
            failed.append(row)
        else:
            out[row] = pixels
    return failed


def decoded(files: Pairs, params: CheckParams, workers: int) -> Iterator[Optional[np.ndarray]]:
    """Each (path, BLAKE3 content hash) decoded as `decode_into` decodes it, in the order given (None: the file changed
    since it was listed, or no longer decodes), so a writer can take the rows as they come."""
    items = ((row, *files[row]) for row in range(len(files)))
    for _, pixels in _in_parallel(_decode_batch, items, workers, params, total=len(files)):
        yield pixels


def _decode_batch(items: list[tuple[int, str, str]], params: CheckParams) -> list[tuple[int, Optional[np.ndarray]]]:
    import blake3

    decoded = []
    for row, path, digest in items:
        try:
            with open(path, "rb") as f:
                content = f.read()
        except OSError:
            decoded.append((row, None))
            continue
        if blake3.blake3(content).hexdigest() != digest:  # changed since it was hashed: not the sample the manifest names
            decoded.append((row, None))
            continue
        decoded.append((row, check_file(path, read_header(path, content), params, keep_array=True, content=content).array))
    return decoded


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
