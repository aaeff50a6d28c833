"""Content validation of image files: every file is fully decoded before it may be trained on.

A check reads the header (format, size, mode), refuses decompression bombs before decoding, decodes
every pixel (Pillow's LOAD_TRUNCATED_IMAGES stays off, so a truncated file is an error, not a grey
stripe), compares the format with the file extension, and converts the image to the target size and
channels when asked. Results that depend only on a file's content are cached by content hash in
`.veritrain/cache/images.sqlite`, so re-preparing unchanged data decodes nothing.

Runs in worker processes; this module must stay importable without torch.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np

from veritrain.core.hashing import open_cache_db, rows_where_in
from veritrain.data import dedup

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

    def as_json(self) -> dict[str, Any]:
        return {"findings": self.findings, "phash": self.phash, "picture": _pack(self.picture), "thumb": _pack(self.thumb)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> "Check":
        return cls([tuple(f) for f in value["findings"]], value["phash"], _unpack(value.get("picture")), _unpack(value.get("thumb")))  # type: ignore[misc]

    @property
    def usable(self) -> bool:
        return not any(kind in UNUSABLE for kind, _ in self.findings)


def _pack(array: Optional[np.ndarray]) -> Optional[list[Any]]:
    """A small uint8 array as JSON: [shape, hex bytes]."""
    return None if array is None else [list(array.shape), array.tobytes().hex()]


def _unpack(packed: Optional[list[Any]]) -> Optional[np.ndarray]:
    return None if packed is None else np.frombuffer(bytes.fromhex(packed[1]), dtype=np.uint8).reshape(packed[0])


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


def _check_batch(items: list[tuple[str, str, Header]], params: CheckParams) -> list[tuple[str, Check]]:
    return [(digest, check_file(path, header, params, keep_array=False)) for digest, path, header in items]


def _header_batch(items: list[tuple[str, str]]) -> list[tuple[str, Header]]:
    return [(digest, read_header(path)) for digest, path in items]


_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _in_parallel(func: Callable[..., Iterable[Any]], items: list[Any], workers: int, *args: Any) -> Iterable[Any]:
    """Run `func(batch, *args)` over batches of items; serial for small inputs (process start-up costs ~0.3 s)."""
    if workers <= 1 or len(items) < 200:
        yield from func(items, *args)
        return
    size = max(16, min(256, len(items) // (workers * 4)))
    batches = [items[i : i + size] for i in range(0, len(items), size)]
    # spawn: a clean interpreter, safe even when the parent has torch and its thread pools loaded.
    # One BLAS thread per worker: the workers already use every core, and oversubscribed BLAS
    # threads (numpy's matmul in the perceptual hash) made 2 workers slower than 1.
    saved = {k: os.environ.get(k) for k in _THREAD_VARIABLES}
    os.environ.update({k: "1" for k in _THREAD_VARIABLES})
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            for result in pool.map(func, batches, *([a] * len(batches) for a in args)):
                yield from result
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class CheckCache:
    """Header and check results by content hash (files with equal bytes get equal results)."""

    def __init__(self, db_path: Path):
        self.db = open_cache_db(
            db_path,
            "CREATE TABLE IF NOT EXISTS headers (hash TEXT PRIMARY KEY, json TEXT)",
            "CREATE TABLE IF NOT EXISTS checks (hash TEXT, params TEXT, json TEXT, PRIMARY KEY (hash, params))",
        )

    def _get(self, table: str, hashes: list[str], params: Optional[str] = None) -> dict[str, dict[str, Any]]:
        if params is None:
            rows = rows_where_in(self.db, f"SELECT hash, json FROM {table} WHERE hash IN ({{marks}})", hashes)
        else:
            rows = rows_where_in(self.db, f"SELECT hash, json FROM {table} WHERE params = ? AND hash IN ({{marks}})", hashes, (params,))
        return {h: json.loads(j) for h, j in rows}

    def headers(self, hashes: list[str]) -> dict[str, Header]:
        return {h: Header(**v) for h, v in self._get("headers", hashes).items()}

    def checks(self, hashes: list[str], params: CheckParams) -> dict[str, Check]:
        return {h: Check.from_json(v) for h, v in self._get("checks", hashes, params.key()).items()}

    def store_headers(self, rows: dict[str, Header]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO headers VALUES (?, ?)", [(h, json.dumps(asdict(v))) for h, v in rows.items()])

    def store_checks(self, rows: dict[str, Check], params: CheckParams) -> None:
        key = params.key()
        with self.db:
            self.db.executemany(  # a generator: the JSON of one row at a time, not of the whole data set
                "INSERT OR REPLACE INTO checks VALUES (?, ?, ?)",
                ((h, key, json.dumps(c.as_json())) for h, c in rows.items()),
            )

    def close(self) -> None:
        self.db.close()


def headers_for(files: dict[str, str], cache: Optional[CheckCache], workers: int) -> dict[str, Header]:
    """content hash → header, for one path per distinct content. Headers are a few hundred bytes:
    threads suffice (and cost no process start-up)."""

    found = cache.headers(list(files)) if cache else {}
    todo = [(h, p) for h, p in files.items() if h not in found]
    if workers > 1 and len(todo) > 200:
        with ThreadPoolExecutor(workers) as pool:
            fresh = dict(pool.map(lambda item: (item[0], read_header(item[1])), todo))
    else:
        fresh = dict(_header_batch(todo))
    if cache and fresh:
        cache.store_headers(fresh)
    return {**found, **fresh}


def checks_for(files: dict[str, str], headers: dict[str, Header], params: CheckParams, cache: Optional[CheckCache], workers: int) -> dict[str, Check]:
    """content hash → check, without the decoded pixels (those are decoded again, row by row, straight into
    the version's arrays by `decode_into`, so memory never holds the whole data set)."""
    found = cache.checks(list(files), params) if cache else {}
    todo = [(h, p, headers[h]) for h, p in files.items() if h not in found]
    fresh = dict(_in_parallel(_check_batch, todo, workers, params))
    if cache and fresh:
        cache.store_checks(fresh, params)
    return {**found, **fresh}


def decode_into(out: np.ndarray, files: list[tuple[str, str]], params: CheckParams, workers: int) -> list[int]:
    """Decode each row's (path, BLAKE3 content hash) into `out[row]` (a memory-mapped array), in worker
    processes that hand back one batch at a time. The bytes decoded are the bytes hashed: returns the rows
    whose file changed since it was listed, or no longer decodes."""
    failed = []
    for row, array in _in_parallel(_decode_batch, [(row, path, digest) for row, (path, digest) in enumerate(files)], workers, params):
        if array is None:
            failed.append(row)
        else:
            out[row] = array
    return failed


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
