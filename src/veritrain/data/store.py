"""The content-addressed store `.veritrain/data/<version>/`: the arrays, manifest, quarantine list and split
files of a version written into a temporary folder and sealed with version.json, the data card beside it, and the
memo that maps a prepare's inputs to the version it made (so unchanged data is never prepared twice)."""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

import numpy as np

from veritrain.core.errors import RunFailed
from veritrain.core.hashing import DATA_HASH_ALGORITHM, JsonRows, sha256_file, sha256_json
from veritrain.core.secrets import redact_text
from veritrain.core.version import __version__
from veritrain.data import croissant, identity, shards, split as splitting, validate
from veritrain.data.columns import hex_digests
from veritrain.data.identity import CARD_FILE, FIELDS_FOLDER, DataVersion, preprocessing_config
from veritrain.data.shards import FieldSpec
from veritrain.data.sources import FileListing, Source
from veritrain.data.split import SPLITS, Placement
from veritrain.data.table import FileRows, Table

if TYPE_CHECKING:
    from veritrain.core.config import DataConfig

SHARD_BYTES = 8 << 20  # about this many bytes of an array field per shard (rows per shard: SHARD_BYTES // the bytes of a row)
TEXT_ROWS_PER_SHARD = 1 << 16  # rows per shard of a text field (group, timestamp)

MANIFEST_COLUMNS = ("sample_id", "size", DATA_HASH_ALGORITHM, "label", "split", "status", "key", "unit")


ARRAY_CHUNK = 4096  # rows copied or summed at a time (bounds memory)


def prepare_fingerprint(cfg: DataConfig, source: Source, table: Table) -> str:
    """Hash of every input of the stage: data config (minus locations and card), the source's
    preprocessing, each sample's id, content hash, label, group, fixed split and timestamp, the
    listing's findings, and the versions of veritrain and the decoders."""
    import PIL


    return sha256_json({
        "config": preprocessing_config(cfg, source.preprocessing),
        "samples": JsonRows(lambda: zip(table.ids, table.hashes, table.labels, table.groups, table.fixed, table.timestamps, table.source_ids)),
        "findings": [f.as_dict() for f in table.findings],
        "versions": {"veritrain": __version__, "pillow": PIL.__version__, "numpy": np.__version__},
    })


def remember(memo: Path, version: str) -> None:
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{uuid.uuid4().hex}")
    tmp.write_text(version + "\n")
    os.replace(tmp, memo)


def made_from(data: DataVersion, data_cfg: DataConfig, source: Source, table: Table) -> bool:
    """Whether a stored version was prepared from this config and these samples (the cache that maps inputs to
    a version is a file in the workspace, so what it names is checked against the version's bound manifest)."""
    stored = data.info["preprocessing"]
    wanted = preprocessing_config(data_cfg, source.preprocessing)
    if stored.get("data") != wanted["data"] or stored.get("source") != wanted["source"] or stored.get("format") != wanted["format"]:
        return False
    with open(data.path / "manifest.csv", newline="", encoding="utf-8") as f:  # row by row: neither side is held whole
        rows = ((row["sample_id"], row[DATA_HASH_ALGORITHM] or None, row["label"] or None, row.get("key") or None) for row in csv.DictReader(f))
        return all(a == b for a, b in itertools.zip_longest(rows, zip(table.ids, table.hashes, table.labels, table.source_ids)))


def picture_lookup(inputs: Any, table: Table, rows: list[int]) -> Callable[[str], Optional[np.ndarray]]:
    """sample id → its picture for the report's gallery: the decoded row of `inputs` (the version's inputs, row by
    placed sample), or the thumbnail of a quarantined one."""
    index_of: dict[str, int] = {}  # only for a source whose ids are not in order (a registered one may give them so)

    def picture(sample_id: str) -> Optional[np.ndarray]:  # found by bisection: a file table is in id order, `rows` ascending
        i = bisect.bisect_left(table.ids, sample_id)  # type: ignore[arg-type]  # a sequence of ids
        if i == len(table.ids) or table.ids[i] != sample_id:
            if not index_of:
                index_of.update((sid, k) for k, sid in enumerate(table.ids))
            if sample_id not in index_of:
                return None
            i = index_of[sample_id]
        k = bisect.bisect_left(rows, i)
        if k < len(rows) and rows[k] == i and inputs.dtype == np.uint8 and inputs.ndim == 4:
            return np.asarray(inputs[k])
        return table.thumbs.get(i)
    return picture


def write_arrays(out: Path, rows: list[int], table: Table, source: Source, cfg: DataConfig, target: dict[str, Any],
                  classes: Optional[list[str]], workers: int) -> tuple[np.ndarray, np.ndarray]:
    """inputs.npy and targets.npy of the placed rows, written through a memory map: file samples are decoded
    straight into it by worker processes, array samples copied in chunks, so memory holds no second copy."""
    from numpy.lib.format import open_memmap

    if isinstance(source, FileListing):
        h, w, c = target["shape"]
        inputs = open_memmap(out / "inputs.npy", mode="w+", dtype=np.uint8, shape=(len(rows), h, w, c))
        params = validate.CheckParams(h, w, c, cfg.convert, cfg.max_pixels, near_duplicates=False)
        failed = validate.decode_into(inputs, FileRows(table, np.asarray(rows, dtype=np.int64), path_first=True), params, workers)
        if failed:
            raise RunFailed(f"data: {table.ids[rows[failed[0]]]} changed while preparing (its bytes or its decoding); prepare again, with --rehash if the file kept its size and time (`veritrain data prepare CONFIG --rehash`)")
    else:
        inputs = open_memmap(out / "inputs.npy", mode="w+", dtype=source.inputs.dtype, shape=(len(rows), *source.inputs.shape[1:]))
        for start in range(0, len(rows), ARRAY_CHUNK):
            inputs[start : start + ARRAY_CHUNK] = source.inputs[rows[start : start + ARRAY_CHUNK]]
    inputs.flush()
    del inputs
    if classes is not None:
        class_index = {c: k for k, c in enumerate(classes)}
        targets = np.array([class_index[table.label(i)] for i in rows], dtype=np.int64)
    else:
        targets = np.array([float(table.label(i)) for i in rows], dtype=np.float32)
    np.save(out / "targets.npy", targets)
    return np.load(out / "inputs.npy", mmap_mode="r"), targets


def write_fields(out: Path, shard_store: Path, rows: list[int], table: Table, source: Source, cfg: DataConfig, target: dict[str, Any],
                 classes: Optional[list[str]], workers: int, train: np.ndarray) -> tuple[dict[str, FieldSpec], Optional[PixelHistogram]]:
    """The placed rows' fields (data recipe 7 on), written as their rows come into shards of `shard_store` and linked
    into `out/fields/` (`shards.link`): the inputs (`image`: decoded pixels, uint8 H×W×C; `features`: an array
    source's rows of another type), `label` (the class index, or the value of a regression target) and, where the
    source gives them, `group` and `timestamp` (UTF-8). Memory holds one shard per field. Returns the fields and, for
    uint8 inputs, the histogram of the pixels of the rows `train` marks (normalization_stats from it)."""
    def keys() -> Iterator[str]:  # the rows' sample ids, read as written
        return (table.ids[i] for i in rows)

    if isinstance(source, FileListing):
        name, dtype, shape = "image", np.dtype(np.uint8), tuple(target["shape"])
        h, w, c = shape
        params = validate.CheckParams(h, w, c, cfg.convert, cfg.max_pixels, near_duplicates=False)
        values: Iterable[Optional[np.ndarray]] = _decoded_or_kept(rows, table, params, workers, _decoded_before(out.parent, target))
    else:
        dtype, shape = source.inputs.dtype, tuple(source.inputs.shape[1:])
        name = "image" if dtype == np.uint8 and len(shape) == 3 else "features"
        values = (row for start in range(0, len(rows), ARRAY_CHUNK) for row in source.inputs[rows[start : start + ARRAY_CHUNK]])
    row_bytes = max(1, dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
    inputs = shards.FieldWriter(shard_store, "array", max(1, SHARD_BYTES // row_bytes))
    histogram = PixelHistogram(shape[-1] if shape else 1) if dtype == np.uint8 else None
    for k, (key, value) in enumerate(zip(keys(), values)):
        if value is None:
            raise RunFailed(f"data: {key} changed while preparing (its bytes or its decoding); prepare again, with --rehash if the file kept "
                            "its size and time (`veritrain data prepare CONFIG --rehash`)")
        inputs.add(key, value)
        if histogram is not None and train[k]:
            histogram.add(value)
    fields = {name: shards.FieldSpec.of(name, inputs.close(), "array", np.dtype(dtype).newbyteorder("<").str, shape)}
    placed = np.asarray(rows, dtype=np.int64)
    if classes is not None:
        labels = table.labels.mapped(placed, {c: k for k, c in enumerate(classes)}).astype(np.int64)
        assert (labels >= 0).all(), "a placed sample without a class"  # check_labels excluded them
    else:
        labels = np.fromiter((float(table.label(i)) for i in rows), dtype=np.float32, count=len(rows))
    fields["label"] = _array_field(shard_store, "label", keys(), labels)
    for text_name, column in (("group", table.groups), ("timestamp", table.timestamps)):
        if any(column[i] is not None for i in rows):
            writer = shards.FieldWriter(shard_store, "blob", TEXT_ROWS_PER_SHARD)
            for key, i in zip(keys(), rows):
                writer.add(key, (column[i] or "").encode("utf-8"))
            fields[text_name] = shards.FieldSpec.of(text_name, writer.close(), "blob")
    for spec in fields.values():
        for entry in spec.shards:
            shards.link(shard_store, entry, out / FIELDS_FOLDER)
    return fields, histogram


def _decoded_or_kept(rows: list[int], table: Table, params: validate.CheckParams, workers: int,
                     before: Optional[tuple[Any, np.ndarray, np.ndarray]]) -> Iterator[Optional[np.ndarray]]:
    """Each row's decoded pixels in order: a content a stored version decoded to this target by these decoders is
    read from its image field (every block checked), the rest is decoded (validate.decoded)."""
    placed = np.asarray(rows, dtype=np.int64)
    former_rows = np.full(len(placed), -1, dtype=np.int64)  # the row of each placed row's content in `before`, or -1
    if before is not None and len(before[1]):
        _, digests, row_of = before
        for start in range(0, len(placed), ARRAY_CHUNK):
            wanted = table.hashes.raw(placed[start:start + ARRAY_CHUNK])
            at = np.minimum(np.searchsorted(digests, wanted), len(digests) - 1)
            former_rows[start:start + len(wanted)] = np.where(digests[at] == wanted, row_of[at], -1)
    fresh = iter(validate.decoded(FileRows(table, placed[former_rows < 0], path_first=True), params, workers))
    for start in range(0, len(placed), ARRAY_CHUNK):  # the kept rows of a chunk read together: each block they touch once
        former = former_rows[start:start + ARRAY_CHUNK]
        wanted = former[former >= 0]
        kept = iter(np.asarray(before[0][wanted]) if before is not None and len(wanted) else ())
        for row in former.tolist():
            yield next(kept) if row >= 0 else next(fresh)


def _decoded_before(versions: Path, target: dict[str, Any]) -> Optional[tuple[Any, np.ndarray, np.ndarray]]:
    """The image field of the newest stored version that decoded images to `target` with today's decoders (data recipe
    7 on), opened and checked, with the content hashes of its rows sorted (`S32`) and the row of each: a re-prepare
    after an image was added decodes the new image alone. None when there is none. `verify` prepares in a scratch
    folder, so it never reads one."""
    candidates = []
    for folder in versions.iterdir() if versions.is_dir() else []:
        try:
            info = json.loads((folder / "version.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and identity.has_fields(info) and info.get("kind") != "text" and info.get("decoders") == identity.decoder_versions() \
                and info.get("hash_algorithm") == DATA_HASH_ALGORITHM and (info.get("preprocessing") or {}).get("target") == target \
                and "image" in (info.get("fields") or {}):
            candidates.append(((folder / "version.json").stat().st_mtime_ns, folder))
    if not candidates:
        return None
    folder = max(candidates)[1]
    former = identity.load_version(folder)
    with open(folder / "manifest.csv", newline="", encoding="utf-8") as f:
        digests = hex_digests(row[DATA_HASH_ALGORITHM] for row in csv.DictReader(f) if row["status"] == "ok")
    order = np.argsort(digests, kind="stable")
    return former.inputs, digests[order], order


def _array_field(shard_store: Path, name: str, keys: Iterable[str], values: np.ndarray) -> FieldSpec:
    writer = shards.FieldWriter(shard_store, "array", max(1, SHARD_BYTES // max(1, values[:1].nbytes)))
    for key, value in zip(keys, values):
        writer.add(key, value)
    return shards.FieldSpec.of(name, writer.close(), "array", values.dtype.newbyteorder("<").str, values.shape[1:])


class PixelHistogram:
    """How often each uint8 value occurs per channel (last axis) over the rows added: their sums, and so the mean and
    standard deviation, follow exactly, whatever order the rows come in. Rows are counted about 1 MiB at a time."""

    def __init__(self, channels: int) -> None:
        self.counts = np.zeros((channels, 256), dtype=np.int64)
        self._pending: list[np.ndarray] = []
        self._pending_bytes = 0

    def add(self, row: np.ndarray) -> None:
        self._pending.append(np.asarray(row))
        self._pending_bytes += row.nbytes
        if self._pending_bytes >= 1 << 20:
            self._count()

    def add_rows(self, rows: np.ndarray) -> None:
        self._pending.append(np.asarray(rows))
        self._count()

    def _count(self) -> None:
        if self._pending:
            values = np.concatenate([p.reshape(-1) for p in self._pending]).reshape(-1, len(self.counts))
            for c in range(len(self.counts)):
                self.counts[c] += np.bincount(values[:, c], minlength=256)
        self._pending, self._pending_bytes = [], 0

    def stats(self) -> dict[str, Any]:
        """Per-channel mean and std of the values scaled to [0, 1]: each one correctly rounded division and square root
        of exact integer sums, so the figures are equal on every machine."""
        self._count()
        values = np.arange(256, dtype=np.int64)
        total = [int(h @ values) for h in self.counts]
        squares = [int(h @ (values * values)) for h in self.counts]
        count = int(self.counts[0].sum()) if len(self.counts) else 0
        mean = [t / (255 * count) if count else 0.0 for t in total]
        std = [math.sqrt(count * q - t * t) / (255 * count) if count else 0.0 for t, q in zip(total, squares)]
        return {"scale": "x / 255", "mean": mean, "std": std, "computed_on": "train"}


def write_version(out: Path, cfg: DataConfig, table: Table, classes: Optional[list[str]], assigned: Placement,
                   rows: list[int], preprocessing: dict[str, Any], origin: dict[str, Any], units: splitting.Units,
                   inputs: Any, targets: np.ndarray, normalization: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """manifest.csv, quarantine.csv and the split lists beside the inputs and targets written (row by placed sample);
    returns version.json's content (without the id, which hashes it). `normalization`: the train statistics when
    they were counted while writing, else computed here from `inputs`."""
    unit_of = {i: unit.key for unit in units.multi() for i in unit.members}  # a lone sample's unit key is its own
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(MANIFEST_COLUMNS)
        for i, sid in enumerate(table.ids):
            status = "ok" if i in assigned else "quarantined"
            # key: the source's own id, empty when the content hash is the key; unit: the key that placed the sample
            # when that is another member's (its group's smallest), empty when its own or when quarantined
            unit = unit_of.get(i, "") if i in assigned else ""
            writer.writerow([sid, table.sizes[i], table.hashes[i] or "", table.labels[i] or "", assigned.get(i, ""), status,
                             table.source_ids[i] or "", "" if unit == table.key(i) else unit])
    with open(out / "quarantine.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sample_id", "kind", "reason"])
        for i, finding in sorted(table.excluded.items()):
            writer.writerow([table.ids[i], finding.kind, finding.reason])
    placed = assigned.codes(np.asarray(rows, dtype=np.int64))
    for n, name in enumerate(SPLITS):
        with open(out / "splits" / f"{name}.txt", "w", encoding="utf-8") as f:
            f.writelines(table.ids[i] + "\n" for i, code in zip(rows, placed.tolist()) if code == n)
    if identity.FORMAT_VERSION >= identity.FIELDS_SINCE:  # each placed row's split, which opening reads instead of the manifest
        (out / identity.PLACED_FILE).write_bytes(placed.astype(np.uint8).tobytes())

    row_splits = assigned.codes(np.asarray(rows, dtype=np.int64))
    counts = {s: int((row_splits == n).sum()) for n, s in enumerate(SPLITS)}
    per_class = None
    if classes is not None:
        per_class = {s: {c: int(((row_splits == n) & (targets == k)).sum()) for k, c in enumerate(classes)} for n, s in enumerate(SPLITS)}

    return {
        "data_version": None,
        "format": identity.FORMAT_VERSION,
        "hash_algorithm": DATA_HASH_ALGORITHM,
        "preprocessing": preprocessing,
        "classes": classes,
        "counts": counts,
        "counts_per_class": per_class,
        "quarantined": len(table.excluded),
        "input_shape": list(inputs.shape[1:]),
        "input_dtype": str(inputs.dtype),
        "target_dtype": str(targets.dtype),
        "normalization": normalization or normalization_stats(inputs, np.flatnonzero(row_splits == SPLITS.index("train"))),
        "origin": origin,
        "decoders": identity.decoder_versions(),
        # every file training reads, bound to the version id through `content_hash`
        "files": {name: {"size": (out / name).stat().st_size, "sha256": sha256_file(out / name)}
                  for name in identity.bound_files({"format": identity.FORMAT_VERSION})},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def seal_version(out: Path, info: dict[str, Any], card: dict[str, Any]) -> None:
    """version.json, with the table of the report files written beside the bound ones (checked on every open,
    though outside the id: reports hold timings and drawings that differ between machines)."""
    seal_reports(out, info, set(identity.bound_files(info)) | set(identity.shard_files(info)) | {"version.json", CARD_FILE}, card)


CROISSANT_FILE = "croissant.json"  # the version's MLCommons Croissant record, as the card was when it was prepared


def seal_reports(out: Path, info: dict[str, Any], bound: set[str], card: dict[str, Any]) -> None:
    """version.json with `reports`, the table of the files beside the bound ones; its Croissant record (written from
    version.json, so version.json is written once before it and once after with the record among the reports)."""

    def write_info() -> None:
        info["reports"] = {p.relative_to(out).as_posix(): sha256_file(p) for p in sorted(out.rglob("*"))
                           if p.is_file() and p.relative_to(out).as_posix() not in bound}
        (out / "version.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")

    write_info()
    croissant.write(out, out / CROISSANT_FILE, card)  # its file locations relative to the version: it moves with it
    write_info()


def merged_card(config_card: dict[str, Any], source_card: dict[str, Any]) -> dict[str, Any]:
    """data.card, with what the source knows of itself (digits, CIFAR-10) filling the keys left empty;
    URL credentials and the like are redacted by their shape (the config's card holds none: load_config refuses them)."""

    merged = {key: value if value else source_card.get(key) for key, value in config_card.items()}
    return {key: redact_text(value) if isinstance(value, str) else value for key, value in merged.items()}


def write_data_card(version_dir: Path, card: dict[str, Any]) -> None:
    """The data card sits beside the version (not inside its hash): editing it keeps the version."""
    if not version_dir.exists():
        return
    text = json.dumps(card, indent=2) + "\n"
    path = version_dir / CARD_FILE
    try:
        if path.read_text(encoding="utf-8") == text:
            return  # runs starting at once (a sweep's trials) each get here: none rewrites what others may be reading
    except (OSError, UnicodeDecodeError):
        pass
    # a temp file beside the version folder, not in it (where a check would count it), renamed over the card:
    # a parallel run reading the card sees the old one or the new one, never a half-written file
    tmp = version_dir.parent / f".tmp-card-{uuid.uuid4().hex}"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def normalization_stats(inputs: np.ndarray, train_rows: np.ndarray) -> dict[str, Any]:
    """Per-channel (last axis) mean and std over the train rows only; uint8 inputs are scaled to [0, 1].

    For uint8 the sums are exact integers (summed in chunks) and each statistic is one correctly rounded
    division and square root of them, so the figures, which the version id binds, are equal on every machine.
    """
    channels = inputs.shape[-1] if inputs.ndim > 1 else 1
    if inputs.dtype != np.uint8:
        values = np.asarray(inputs[train_rows], dtype=np.float64).reshape(-1, channels)
        return {"scale": "x", "mean": values.mean(axis=0).tolist(), "std": values.std(axis=0).tolist(), "computed_on": "train"}
    histogram = PixelHistogram(channels)  # how often each value occurs: the sums follow exactly
    rows_at_once = max(1, (1 << 20) // max(1, int(np.prod(inputs.shape[1:]))))  # 1 MiB of pixels (bincount copies them as int64)
    for start in range(0, len(train_rows), rows_at_once):
        histogram.add_rows(np.asarray(inputs[train_rows[start : start + rows_at_once]]))
    return histogram.stats()
