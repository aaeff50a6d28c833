"""The sample table: every sample of a source in sample-id order with its content hash, label, group, fixed
split and timestamp, and the findings that exclude some of them. File sources are hashed (stat cache first) and
decoded once per distinct content to check them; array sources give their features directly."""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from veritrain.core.errors import UserError
from veritrain.core.hashing import StatCache, hash_files
from veritrain.core.secrets import expand_env
from veritrain.data import dedup, identity, validate
from veritrain.data.columns import Codes, Digests, Joined, Names, Texts
from veritrain.data.row_images import RowImages
from veritrain.data.sources import FileListing, Source, SourceData, WalkedFolder
from veritrain.data.validate import FINDING_SEVERITY, UNUSABLE, Check, CheckCache, CheckParams

if TYPE_CHECKING:
    from veritrain.core.config import DataConfig

IMAGE_EXTENSIONS = frozenset((".bmp", ".gif", ".jfif", ".jpe", ".jpeg", ".jpg", ".pbm", ".pgm", ".png", ".pnm", ".ppm",
                              ".tif", ".tiff", ".webp"))  # compared lower-cased; a fixed list, not Pillow's plugins of the day


HASH_BATCH = 8192  # files stat-ed and hashed at a time (bounds the stat results held)
NEAR_DUPLICATE_MIN_SIDE = 16  # px: below this a perceptual hash says little (digits are 8×8)

log = logging.getLogger("veritrain")


@dataclass
class Finding:
    kind: str  # one of validate.FINDING_SEVERITY (the names are the contract)
    samples: list[str]  # sample ids concerned (paths relative to data.root for files)
    reason: str
    severity: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # label_issue, outlier: suggested label, score, rank, split

    def __post_init__(self) -> None:
        self.severity = self.severity or FINDING_SEVERITY.get(self.kind, "warning")

    def as_dict(self) -> dict[str, Any]:
        found = {"kind": self.kind, "severity": self.severity, "samples": self.samples, "reason": self.reason}
        return {**found, **self.details}


@dataclass
class Table:
    """Every sample of the source, in sample-id order, as the stage works on it."""

    # columns (veritrain.data.columns): indexed like lists, kept as a few flat buffers each
    ids: Names
    paths: Union[Texts, Joined]  # absolute, as text (see FileSample.path); None for array sources
    sizes: np.ndarray  # int64 bytes per sample
    hashes: Digests
    labels: Codes
    groups: Texts
    fixed: Codes
    timestamps: Texts
    source_ids: Texts  # the source's own id per sample (csv `id` column); None: placed by content hash
    keep_usable: bool = False  # data.on_bad_file: warn — only samples that cannot be used are excluded
    findings: list[Finding] = field(default_factory=list)
    excluded: dict[int, Finding] = field(default_factory=dict)  # sample index → the finding that removed it
    units_of: dict[int, str] = field(default_factory=dict)  # sample index → why it is tied to others (for split_skew)
    ignored: list[str] = field(default_factory=list)  # files under data.root that are not images (recipe 5 on), by relpath
    timestamp_formats: Counter[str] = field(default_factory=Counter)  # data.split_by: time: values parsed per format

    def __post_init__(self) -> None:
        self.keep_features_in(None)

    def keep_features_in(self, scratch: Optional[Path]) -> None:
        """Where the samples' pictures and thumbnails go as they are checked: files in `scratch` (a folder the stage
        removes after it), not memory. None: nowhere, for a table whose features are never taken."""
        n = len(self.ids)
        self.phash = np.zeros(n, dtype=np.uint64)  # near-duplicate search: perceptual hash per sample (where it has a picture)
        self.pictures = RowImages(scratch / "pictures.u8" if scratch else None, n)  # near-duplicates: dedup.comparison_image
        self.thumbs = RowImages(scratch / "thumbs.u8" if scratch else None, n)  # label issues and outliers: dedup.thumbnail

    def close(self) -> None:
        self.pictures.close()
        self.thumbs.close()

    def add(self, kind: str, indices: list[int], reason: str, exclude: bool = False) -> Finding:
        finding = Finding(kind, [self.ids[i] for i in indices], reason)
        if exclude and self.keep_usable and kind not in UNUSABLE | {"leak_duplicate"}:
            exclude, finding.severity = False, "warning"
        self.findings.append(finding)
        if exclude:
            for i in indices:
                self.excluded.setdefault(i, finding)
        return finding

    def included(self) -> list[int]:
        return [i for i in range(len(self.ids)) if i not in self.excluded]

    def key(self, i: int) -> str:
        """What places sample `i` in a split: the source's own id, else its content hash ("" when unreadable)."""
        return self.source_ids[i] or self.hashes[i] or ""

    def content_hash(self, i: int) -> str:
        """The content hash of sample `i`, one still included: a sample without one (unreadable) is excluded."""
        digest = self.hashes[i]
        assert digest is not None, f"{self.ids[i]}: included without a content hash"
        return digest

    def label(self, i: int) -> str:
        """The label of sample `i`, one still included: with data.classes, check_labels excludes the unlabelled;
        array sources label every sample."""
        label = self.labels[i]
        assert label is not None, f"{self.ids[i]}: included without a label"
        return label


def sample_table(cfg: DataConfig, source: Source, paths: dict[str, Path], cache_dir: Optional[Path], rehash: bool,
                  timings: dict[str, float], recipe: Optional[int] = None, scratch: Optional[Path] = None) -> Table:
    """Every sample of the source with its content hash (as `recipe` lists them), and the fixed test split of data.test_split_file.
    `scratch`: the folder its checked samples' pictures and thumbnails are kept in (`Table.keep_features_in`)."""
    table = _list_files(cfg, source, cache_dir, rehash, timings, recipe) if isinstance(source, FileListing) else _table_from_arrays(source)
    table.keep_features_in(scratch)
    if cfg.split_by == "time" and table.ids and not any(table.timestamps):  # config refuses known sources; this catches registered ones
        raise UserError(f"data.split_by: 'time' needs data.source: csv with a timestamp column; data.source {cfg.source!r} gave no timestamps, use split_by: random")
    if cfg.test_split_file is not None:
        # paths holds it resolved by the config (config folder, ${env:}); a config built in code has only the text
        _apply_test_split_file(paths.get("test_split_file") or Path(expand_env(cfg.test_split_file)).expanduser().resolve(), table)
    return table


def _table_from_arrays(source: SourceData) -> Table:
    n = len(source.sample_ids)
    table = Table(
        ids=Names(source.sample_ids),
        paths=Texts([None] * n),
        sizes=np.array(source.sizes, dtype=np.int64),
        hashes=Digests.of(source.content_hashes),
        labels=Codes(source.label_names()),
        groups=Texts([None] * n),
        fixed=Codes(source.fixed_split if source.fixed_split else [None] * n),
        timestamps=Texts([None] * n),
        source_ids=Texts([None] * n),
    )
    return table


def array_target(cfg: DataConfig, source: SourceData, table: Table, cache_dir: Path,
                  timings: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    shape = list(source.inputs.shape[1:])
    if source.inputs.dtype == np.uint8 and source.inputs.ndim == 4:
        t = time.perf_counter()
        _array_features(source.inputs, table, _near_duplicates_on(cfg, shape), cache_dir)
        timings["features"] = time.perf_counter() - t
    return {"shape": shape, "dtype": str(source.inputs.dtype)}, {"shape": {"×".join(map(str, shape)): len(table.ids)}}


def _array_features(inputs: np.ndarray, table: Table, near_duplicates: bool, cache_dir: Path) -> None:
    """Perceptual hash, comparison picture and thumbnail of each array sample, cached by content hash."""

    params = CheckParams(0, 0, 0, False, 0, near_duplicates)  # arrays: nothing but the features is checked
    cache = CheckCache(cache_dir / "images.sqlite")
    first: dict[str, int] = {}  # content hash → the first row with it: a copy takes that row's features
    try:
        for start in range(0, len(table.hashes), validate.CACHE_BATCH):  # a batch of checks in memory at a time
            batch = range(start, min(start + validate.CACHE_BATCH, len(table.hashes)))
            known = cache.checks(sorted(set(h for h in table.hashes[start:batch.stop] if h)), params)
            fresh: dict[str, Check] = {}
            for i in batch:
                h = table.hashes[i]
                assert h is not None  # an array source hashes every sample (SourceData.content_hashes)
                if h in first and h not in known and h not in fresh:
                    _copy_features(table, first[h], i)
                    continue
                first.setdefault(h, i)
                check = known.get(h) or fresh.get(h)
                if check is None:
                    image = np.asarray(inputs[i])
                    check = fresh[h] = Check(thumb=dedup.thumbnail(image))
                    if near_duplicates:
                        check.phash, check.picture = dedup.perceptual_hash(image), dedup.comparison_image(image)
                _take_features(table, i, check)
            cache.store_checks(fresh, params)
    finally:
        cache.close()


def _copy_features(table: Table, source: int, row: int) -> None:
    """Row `row` takes the features of `source`, a row with the same content."""
    picture, thumb = table.pictures.get(source), table.thumbs.get(source)
    if picture is not None:
        table.phash[row] = table.phash[source]
        table.pictures.put(row, picture)
    if thumb is not None:
        table.thumbs.put(row, thumb)


def _take_features(table: Table, i: int, check: Check) -> None:
    if check.picture is not None and check.phash is not None:
        table.phash[i] = check.phash
        table.pictures.put(i, check.picture)
    if check.thumb is not None:
        table.thumbs.put(i, check.thumb)


def _near_duplicates_on(cfg: DataConfig, shape: list[int]) -> bool:
    if cfg.near_duplicates == "auto":  # note: YAML true/false arrive as "on"/"off"
        return len(shape) >= 2 and min(shape[0], shape[1]) >= NEAR_DUPLICATE_MIN_SIDE
    return cfg.near_duplicates == "on"


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _list_files(cfg: DataConfig, source: FileListing, cache_dir: Optional[Path], rehash: bool, timings: dict[str, float],
                recipe: Optional[int] = None) -> Table:
    """The sample table of a file source with every file hashed (stat cache first; none when `cache_dir` is None:
    every byte is read). Under `recipe` (default: this one) 5 on, files found by walking data.root that are not
    images are left out."""

    recipe = identity.FORMAT_VERSION if recipe is None else recipe
    if isinstance(source.samples, WalkedFolder):
        table = _walked_table(source.samples, recipe)
    else:
        ignored = sorted(s.sample_id for s in source.samples if recipe >= 5 and s.walked and not is_image_name(s.sample_id))
        skipped = set(ignored)
        samples = sorted((s for s in source.samples if s.sample_id not in skipped), key=lambda s: s.sample_id)
        n = len(samples)
        table = Table(
            ids=Names(s.sample_id for s in samples),
            paths=Names(s.path for s in samples),
            sizes=np.zeros(n, dtype=np.int64),
            hashes=Digests(n),
            labels=Codes(s.label for s in samples),
            groups=Texts(s.group for s in samples),
            fixed=Codes(s.fixed_split for s in samples),
            timestamps=Texts(s.timestamp for s in samples),
            source_ids=Texts(s.source_id for s in samples),
            ignored=ignored,
        )
    n, ignored = len(table.ids), table.ignored
    file_paths: Union[Names, Joined] = table.paths  # type: ignore[assignment]  # a file's path is never None
    if ignored:
        log.info("data: %d file(s) under data.root are not images and are ignored (%s%s); see the data report",
                 len(ignored), ", ".join(ignored[:3]), ", …" if len(ignored) > 3 else "")
    index_of = {sid: i for i, sid in enumerate(table.ids)} if source.findings else {}
    for kind, ids, reason in source.findings:
        if kind == "unreadable":  # listed (e.g. in a label map) but not on disk: nothing to quarantine
            table.findings.append(Finding(kind, ids, reason))
        else:
            table.add(kind, [index_of[i] for i in ids if i in index_of], reason)
    del index_of
    source.samples = []  # the table holds them now, in columns: a million listed samples are not kept twice

    t = time.perf_counter()
    stat_cache = StatCache(cache_dir / "files.sqlite") if cache_dir is not None else None
    cached = 0
    try:
        for start in range(0, n, HASH_BATCH):  # a batch of stat results and digests in memory at a time
            paths = file_paths[start:start + HASH_BATCH]
            hashed = hash_files(paths, stat_cache, rehash=rehash or stat_cache is None)
            for i, path in enumerate(paths, start):
                result = hashed[path]
                cached += result.cached
                table.sizes[i] = result.size
                if result.digest is None:
                    table.add("unreadable", [i], f"cannot be read ({result.error})", exclude=True)
                else:
                    table.hashes[i] = result.digest
                    if result.size == 0:
                        table.add("empty", [i], "zero-byte file", exclude=True)
    finally:
        if stat_cache is not None:
            stat_cache.close()
    timings["hash"] = time.perf_counter() - t
    timings["hash_cached_files"] = cached
    return table


def _walked_table(walked: WalkedFolder, recipe: int) -> Table:
    """The table of a walked folder's files, from its columns (sorted already): under recipe 5 on, files that are
    not images are left out; a file's path is the folder's joined with its relative path, made as it is read."""
    names, labels = walked.names, walked.labels
    ignored = [name for name in names if not is_image_name(name)] if recipe >= 5 else []
    if ignored:
        names = Names(name for name in walked.names if is_image_name(name))
        labels = Codes(label for name, label in zip(walked.names, walked.labels) if is_image_name(name))
    n = len(names)
    nothing = Texts(itertools.repeat(None, n))
    return Table(ids=names, paths=Joined(os.path.join(str(walked.root), ""), names), sizes=np.zeros(n, dtype=np.int64), hashes=Digests(n),
                 labels=labels, groups=nothing, fixed=Codes(itertools.repeat(None, n)), timestamps=nothing, source_ids=nothing, ignored=ignored)


class ContentGroups:
    """Some rows of a table (in ascending order) grouped by their content hash, by sorting the hashes' bytes rather than a dict of
    strings: `firsts[k]` is the first row of the k-th content (contents in the order of their first row) and
    `members(k)` its rows, in order."""

    def __init__(self, table: Table, rows: np.ndarray):
        rows = np.asarray(rows, dtype=np.int64)
        keys = table.hashes.raw(rows) if table.hashes.all_hex(rows) else np.array([table.content_hash(int(i)) for i in rows])
        self._rows, self._order = rows, np.argsort(keys, kind="stable")
        ordered = keys[self._order]
        del keys
        starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]])) if len(rows) else np.zeros(0, np.int64)
        del ordered
        ends = np.concatenate([starts[1:], [len(rows)]]).astype(np.int64)
        by_row = np.argsort(rows[self._order[starts]], kind="stable")  # stable: the first of a content is its first row
        self._starts, self._ends = starts[by_row], ends[by_row]
        self.firsts = rows[self._order[self._starts]]

    def __len__(self) -> int:
        return len(self.firsts)

    def members(self, k: int) -> list[int]:
        return self._rows[self._order[self._starts[k]:self._ends[k]]].tolist()

    def copied(self) -> list[int]:
        """The k of every content that two or more rows share."""
        return np.flatnonzero(self._ends - self._starts > 1).tolist()


class FileRows:
    """The (content hash, path) of some rows of a table, or (path, content hash) with `path_first`, read as they are
    asked for (validate.Pairs): a million rows are not a million tuples."""

    def __init__(self, table: Table, rows: np.ndarray, path_first: bool = False):
        self.table, self.rows, self.path_first = table, rows, path_first

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> tuple[str, str]:
        i = int(self.rows[k])
        digest, path = self.table.content_hash(i), str(self.table.paths[i])
        return (path, digest) if self.path_first else (digest, path)


def validate_files(cfg: DataConfig, table: Table, cache_dir: Path, workers: int,
                    timings: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Decode and check every distinct content once (cached by content hash); returns the target
    shape and a summary of sizes, modes and formats. Contents are told apart by sorting the rows' digests, and
    headers and checks stream through the check cache, so memory holds a few arrays of the rows, not an object each."""

    t = time.perf_counter()
    contents = ContentGroups(table, np.array(table.included(), dtype=np.int64))  # every included file has its BLAKE3
    files = FileRows(table, contents.firsts)
    check_cache = validate.CheckCache(cache_dir / "images.sqlite")
    try:
        counts = validate.header_counts(files, check_cache, workers)
        if cfg.image_size is not None:
            height, width = cfg.image_size
        elif counts.sizes:
            (height, width), _ = counts.sizes.most_common(1)[0]
        else:
            height, width = 0, 0
        channels = cfg.channels or (counts.channels.most_common(1)[0][0] if counts.channels else 3)
        target = {"shape": [height, width, channels], "dtype": "uint8", "convert": cfg.convert,
                  "resize": "bilinear" if cfg.convert else None, "image_size_from": "config" if cfg.image_size else "most common in data",
                  "exif_orientation": "not applied"}
        params = validate.CheckParams(height, width, channels, cfg.convert, cfg.max_pixels, _near_duplicates_on(cfg, [height, width]))
        found: dict[int, list[tuple[str, str]]] = {}  # row → its findings: few rows, added in row order below
        for k, check in validate.checks_for(files, params, check_cache, workers):
            for i in contents.members(k):  # the content's rows: one, but for exact copies
                if check.findings:
                    found[i] = check.findings
                if check.usable:
                    _take_features(table, i, check)
    finally:
        check_cache.close()
    for i in sorted(found):
        for kind, reason in found[i]:
            table.add(kind, [i], reason, exclude=kind in UNUSABLE)
    timings["validate"] = time.perf_counter() - t
    summary = {
        "sizes": {f"{w}×{h}": n for (h, w), n in counts.sizes.most_common(10)},
        "modes": dict(counts.modes.most_common()),
        "formats": dict(counts.formats.most_common()),
    }
    return target, summary


def _apply_test_split_file(path: Path, table: Table) -> None:
    """Fix the samples listed in `path` (the resolved data.test_split_file) to the test split."""
    try:
        listed = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        raise UserError(f"data.test_split_file: {path}: file not found; give a file with one sample id per line (relative paths start at the config file's folder)") from None
    except UnicodeDecodeError as err:
        raise UserError(f"data.test_split_file: {path}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8 with one sample id per line") from None
    except OSError as err:
        raise UserError(f"data.test_split_file: {path}: cannot read it ({err.strerror or err}); give a readable file with one sample id per line") from None
    index_of = {sid: i for i, sid in enumerate(table.ids)}
    unknown = [sid for sid in listed if sid not in index_of]
    if unknown:
        log.warning("data: %d sample id(s) in %s are not in the data (first: %s)", len(unknown), path.name, unknown[0])
    for sid in listed:
        if sid in index_of:
            table.fixed[index_of[sid]] = "test"


def check_labels(table: Table, classes: Optional[list[str]]) -> None:
    if classes is None:
        return
    known = set(classes)
    for i in table.included():
        label = table.labels[i]
        if label is None:
            table.add("missing_label", [i], "no label (outside any class folder, or not in the label file)", exclude=True)
        elif label not in known:
            table.add("unknown_label", [i], f"label {label!r} is not one of data.classes", exclude=True)
