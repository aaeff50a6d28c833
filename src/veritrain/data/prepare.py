"""The data stage: list the source, hash every sample, validate its content, split without leakage,
and store the result once as an immutable data version under `.veritrain/data/<version>/`.

The version id is the SHA-256 of (sample ids, content hashes, labels, split assignment incl.
quarantine) and the preprocessing config, so the same data prepared the same way anywhere gets the
same id, and any changed byte, label or split gives a new one. Later runs reuse a stored version.

    veritrain data prepare configs/digits.yaml --json
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import shutil
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import numpy as np

from veritrain import locks
from veritrain.data import split as splitting
from veritrain.data.sources import FileListing, SourceData, load_source
from veritrain.data.split import SPLITS
from veritrain.data.validate import FINDING_SEVERITY, UNUSABLE
from veritrain.errors import RunFailed, UserError
from veritrain.hashing import DATA_HASH_ALGORITHM, sha256_file, sha256_json
from veritrain.secrets import expand_env

log = logging.getLogger("veritrain")

# The data recipe: how a data version is prepared and laid out; part of the version id. 3: near-duplicates
# confirmed by pixels, achieved-split check, label issues and outliers, exact normalization, every file of the
# version bound to its id. 4: stable splits (each unit placed by the hash of its key, see data/split.py), the
# achieved-split check against 3σ of chance, data.test_from, the manifest's `key` and `unit` columns. 5: a file
# found by walking data.root (imagefolder; labelmap, unless the map labels it) is a sample only when its name ends
# in one of IMAGE_EXTENSIONS, the rest are listed as ignored (README.txt, Thumbs.db); version.json binds
# `listing_sha256`, so `verify` can tell unchanged raw data from its hashes alone. Runs made with an earlier recipe
# keep the version it prepared (see `run`'s `recorded`).
FORMAT_VERSION = 5
IMAGE_EXTENSIONS = frozenset((".bmp", ".gif", ".jfif", ".jpe", ".jpeg", ".jpg", ".pbm", ".pgm", ".png", ".pnm", ".ppm",
                              ".tif", ".tiff", ".webp"))  # compared lower-cased; a fixed list, not Pillow's plugins of the day
MANIFEST_COLUMNS = ("sample_id", "size", DATA_HASH_ALGORITHM, "label", "split", "status", "key", "unit")
NEAR_DUPLICATE_MIN_SIDE = 16  # px: below this a perceptual hash says little (digits are 8×8)
BOUND_FILES = ("manifest.csv", "quarantine.csv", "splits/train.txt", "splits/val.txt", "splits/test.txt", "inputs.npy", "targets.npy")
BOUND_INFO = ("classes", "counts", "counts_per_class", "input_shape", "input_dtype", "target_dtype", "normalization", "files", "achieved_split")
BOUND_INFO_SINCE = {"listing_sha256": 5}  # parts of version.json bound from a recipe on (earlier versions keep their ids)
IGNORED_SHOWN = 1000  # ignored file names kept in version.json and the report (the count is always whole)
ARRAY_CHUNK = 4096  # rows copied or summed at a time (bounds memory)
CARD_FILE = "card.json"  # the data card: beside the version, editable, outside every hash


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
class DataVersion:
    """A prepared data version as training reads it (arrays are memory-mapped, read-only)."""

    version: str
    path: Path
    info: dict[str, Any]  # the content of version.json
    inputs: np.ndarray
    targets: np.ndarray
    splits: dict[str, np.ndarray]  # split name → row indices into inputs/targets
    sample_ids: list[str]  # per row (quarantined samples have no row)
    reused: bool = False

    @property
    def classes(self) -> Optional[list[str]]:
        return self.info.get("classes")

    @property
    def counts(self) -> dict[str, int]:
        return {name: int(len(rows)) for name, rows in self.splits.items()}

    def report(self) -> dict[str, Any]:
        """The data report, with the data card as it is now (the card may be edited after preparing)."""
        from veritrain.data.report import card_warnings

        report = json.loads((self.path / "data_report.json").read_text(encoding="utf-8"))
        if "achieved_split" in self.info and isinstance(report.get("summary"), dict):
            report["summary"]["achieved_split"] = self.info["achieved_split"]  # the bound copy, not the report's
        card_file = self.path / CARD_FILE
        if card_file.exists():
            report["card"] = json.loads(card_file.read_text(encoding="utf-8"))
            report["card_warnings"] = card_warnings(report["card"])
        return report


@dataclass
class _Table:
    """Every sample of the source, in sample-id order, as the stage works on it."""

    ids: list[str]
    paths: list[Optional[str]]  # absolute, as text (see FileSample.path); None for array sources
    sizes: list[int]
    hashes: list[Optional[str]]
    labels: list[Optional[str]]
    groups: list[Optional[str]]
    fixed: list[Optional[str]]
    timestamps: list[Optional[str]]
    source_ids: list[Optional[str]]  # the source's own id per sample (csv `id` column); None: placed by content hash
    keep_usable: bool = False  # data.on_bad_file: warn — only samples that cannot be used are excluded
    findings: list[Finding] = field(default_factory=list)
    excluded: dict[int, Finding] = field(default_factory=dict)  # sample index → the finding that removed it
    phash: dict[int, int] = field(default_factory=dict)  # near-duplicate search: perceptual hash per sample
    pictures: dict[int, np.ndarray] = field(default_factory=dict)  # near-duplicate search: dedup.comparison_image
    thumbs: dict[int, np.ndarray] = field(default_factory=dict)  # label issues and outliers: dedup.thumbnail
    units_of: dict[int, str] = field(default_factory=dict)  # sample index → why it is tied to others (for split_skew)
    ignored: list[str] = field(default_factory=list)  # files under data.root that are not images (recipe 5 on), by relpath

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
        """The label of sample `i`, one still included: with data.classes, _check_labels excludes the unlabelled;
        array sources label every sample."""
        label = self.labels[i]
        assert label is not None, f"{self.ids[i]}: included without a label"
        return label


def version_id(preprocessing: dict[str, Any], hash_algorithm: str, samples: Any, content: Optional[str] = None) -> str:
    """The data version id: SHA-256 over the preprocessing config, the hash algorithm and every
    (sample id, content hash or None, label, split or "quarantined"), sorted by sample id; from recipe 3 on
    also over `content`, the hash of what was written (`content_hash`: every file's SHA-256, the classes,
    counts and normalization), so nothing training reads can change without changing the id."""
    bound = {"preprocessing": preprocessing, "hash_algorithm": hash_algorithm, "samples": sorted(tuple(s) for s in samples)}
    if content is not None:
        bound["content"] = content
    return sha256_json(bound)


def content_hash(info: dict[str, Any]) -> str:
    """SHA-256 of the parts of version.json that the id binds (BOUND_INFO, and BOUND_INFO_SINCE from its recipe on)."""
    recipe = recipe_of(info) or 0
    keys = BOUND_INFO + tuple(key for key, since in BOUND_INFO_SINCE.items() if recipe >= since)
    return sha256_json({key: info.get(key) for key in keys})


def listing_sha256(table: Any, source: Any) -> str:
    """SHA-256 of what the listing gives each sample beyond the manifest's columns (group, fixed split, timestamp)
    and of the listing's own findings: with the manifest and the source's preprocessing it binds every input of
    preparing (recipe 5 on), so that unchanged raw data can be told from its hashes without decoding it again."""
    return sha256_json({"samples": [[table.ids[i], table.groups[i], table.fixed[i], table.timestamps[i]] for i in range(len(table.ids))],
                        "findings": [[kind, ids, reason] for kind, ids, reason in getattr(source, "findings", [])]})


def recipe_of(info: Any) -> Optional[int]:
    """The data recipe (version.json `format`) of a stored version: a whole number, else None. The one reader of
    it, so that no check can read "3" as recipe 3 while another reads it as an earlier one."""
    recipe = info.get("format") if isinstance(info, dict) else None
    return recipe if isinstance(recipe, int) and not isinstance(recipe, bool) else None


def version_id_of_manifest(info: dict[str, Any], rows: list[dict[str, str]]) -> str:
    """`version_id` recomputed from a stored version.json and its manifest.csv rows (verify, import)."""
    key = info["hash_algorithm"]
    recipe = recipe_of(info)
    if recipe is None:
        raise ValueError(f"format {info.get('format')!r} is not a data recipe")
    content = content_hash(info) if recipe >= 3 else None
    return version_id(info["preprocessing"], key, (
        (r["sample_id"], r[key] or None, r["label"], r["split"] if r["status"] == "ok" else "quarantined") for r in rows), content)


def preprocessing_config(data_cfg: Any, source_preprocessing: dict[str, Any], target: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Everything besides the samples that decides the prepared arrays and the split: the data config
    without file locations, the data card or worker count, plus what the source and decoder did."""
    from veritrain.config import without_added_defaults

    cfg = without_added_defaults({"data": data_cfg.model_dump(mode="json")})["data"]
    # locations, the card and workers do not shape the data; on_split_skew only decides whether to stop on it
    for key in ("root", "csv", "labels", "split_dir", "test_split_file", "card", "workers", "on_split_skew"):
        cfg.pop(key, None)
    return {"format": FORMAT_VERSION, "data": cfg, "source": source_preprocessing, "target": target}


def version_now(data_cfg: Any, paths: dict[str, Path], scratch_state: Path, versions: Optional[Path] = None) -> str:
    """The id the raw data prepares to now, every file hashed again (`veritrain verify`): the whole gate runs in
    `scratch_state`, but no report, chart or version folder is written, since only the id is compared. `versions`
    is the workspace's folder of data versions, where data.test_from's version is read."""
    return run(data_cfg, paths, scratch_state, rehash=True, id_only=True, versions=versions)  # type: ignore[return-value]


@dataclass
class RawCheck:
    """The raw data against a stored version's manifest, every byte hashed again (`raw_data_check`)."""

    samples: int  # raw files (file sources) or samples (array sources) hashed
    files: bool  # a file source: `samples` counts files
    changed: Optional[str] = None  # the first difference, naming the sample or file; None: as recorded
    undecided: Optional[str] = None  # why the hashes cannot decide (decoders or hash algorithm differ): decode again to compare
    not_compared: Optional[str] = None  # what the version's recipe did not record, so was not compared

    @property
    def unchanged(self) -> bool:
        return self.changed is None and self.undecided is None


def decoder_versions() -> dict[str, str]:
    """What turns raw bytes into the prepared arrays, as version.json records it (`decoders`)."""
    import PIL

    return {"pillow": PIL.__version__, "numpy": np.__version__}


def raw_data_check(data_cfg: Any, paths: dict[str, Path], folder: Path, versions: Path) -> RawCheck:
    """Whether the raw data is what the stored version in `folder` was prepared from, told from hashes alone: the
    source is listed as the version's recipe lists it, every sample's bytes are hashed (never a stat cache) and
    compared with the manifest's id, hash, label and key, the listing's groups, fixed splits, timestamps and findings
    with `listing_sha256` (recipe 5 on), and the decoders with those recorded. When all hold, preparing again would
    give the same version (preparing is a function of these), so nothing needs to be decoded. Nothing is written."""
    info = json.loads((folder / "version.json").read_text(encoding="utf-8"))
    recipe = recipe_of(info) or 0
    former_dir = former_version(data_cfg, versions)
    if former_dir is not None:
        data_cfg = data_cfg.model_copy(update={"test_from": former_dir.name})
    source = load_source(data_cfg, paths)
    table = _sample_table(data_cfg, source, paths, None, True, {}, recipe)
    found = RawCheck(len(table.ids), isinstance(source, FileListing))
    algorithm = info.get("hash_algorithm")
    if algorithm != DATA_HASH_ALGORITHM:
        found.undecided = f"the manifest hashes samples with {algorithm!r}, this veritrain with {DATA_HASH_ALGORITHM}"
        return found
    with open(folder / "manifest.csv", newline="", encoding="utf-8") as f:
        rows = {row["sample_id"]: row for row in csv.DictReader(f)}
    now = {sid: i for i, sid in enumerate(table.ids)}
    for sid in sorted(set(rows) | set(now)):  # the first difference in sample-id order
        row, i = rows.get(sid), now.get(sid)
        if i is None:
            found.changed = f"{sid}: in the manifest, no longer in the raw data"
        elif row is None:
            found.changed = f"{sid}: new in the raw data, not in the manifest"
        elif (row[algorithm] or None) != table.hashes[i]:
            recorded = row[algorithm][:12] or "no hash (it could not be read then)"
            found.changed = (f"{sid}: its bytes hash to {str(table.hashes[i])[:12]}, the manifest records {recorded}"
                             if table.hashes[i] else f"{sid}: cannot be read now, the manifest records {recorded}")
        elif (row["label"] or None) != table.labels[i]:
            found.changed = f"{sid}: labelled {table.labels[i]!r} now, {row['label']!r} in the manifest"
        elif "key" in row and (row["key"] or None) != table.source_ids[i]:
            found.changed = f"{sid}: its id is {table.source_ids[i]!r} now, {row['key']!r} in the manifest"
        if found.changed:
            return found
    if (info.get("preprocessing") or {}).get("source") != source.preprocessing:
        found.changed = "the source describes its preprocessing differently now"
    elif recipe >= BOUND_INFO_SINCE["listing_sha256"]:
        if info.get("listing_sha256") != listing_sha256(table, source):
            found.changed = "the listing's groups, fixed splits, timestamps or findings differ from those recorded (listing_sha256)"
    elif any(table.groups) or any(table.fixed) or any(table.timestamps) or getattr(source, "findings", None):
        found.not_compared = f"groups, fixed splits, timestamps and listing findings (data recipe {recipe} did not record them)"
    if found.changed is None and info.get("decoders") != decoder_versions():
        recorded = info.get("decoders") or {}
        found.undecided = "decoders changed: " + ", ".join(f"{name} {recorded.get(name)} → {version}" for name, version in decoder_versions().items()
                                                           if recorded.get(name) != version)
    return found


def run(data_cfg: Any, paths: dict[str, Path], workspace_state: Path, rehash: bool = False, recorded: Optional[str] = None,
        id_only: bool = False, versions: Optional[Path] = None) -> DataVersion:
    """`_prepare`, one process at a time per data config and paths (`.veritrain/locks/prepare-<key>.lock`):
    concurrent runs of one config wait for the one that prepares, then reuse its version. `id_only` (verify,
    in a scratch folder) writes nothing to the workspace and takes no lock."""
    if id_only:
        return _prepare(data_cfg, paths, workspace_state, rehash, recorded, id_only, versions)
    key = sha256_json({"data": data_cfg.model_dump(mode="json"), "paths": {k: str(v) for k, v in sorted(paths.items())}})[:32]
    with locks.held(workspace_state / "locks" / f"prepare-{key}.lock",
                    lambda by: log.info("data: waiting for %s, which prepares this data", by)):
        return _prepare(data_cfg, paths, workspace_state, rehash, recorded, id_only, versions)


def _prepare(data_cfg: Any, paths: dict[str, Path], workspace_state: Path, rehash: bool = False, recorded: Optional[str] = None,
             id_only: bool = False, versions: Optional[Path] = None) -> DataVersion:
    """Stage entry: prepare (or reuse) the data version for `data_cfg`; returns it loaded and checked.

    `paths` are the config's data paths made absolute; `workspace_state` is the workspace's
    `.veritrain/` (data versions in `data/`, hash and decode caches in `cache/`). `recorded` is the version
    a run already used (resume, reproduce, eval, export): when an earlier recipe prepared it and it is
    stored here, it is the one returned, since this recipe would prepare the same data to another id.
    `versions` is where data.test_from's version is looked up (default: `workspace_state/data`).
    """
    if recorded is not None:
        stored = workspace_state / "data" / recorded
        recipe = stored_recipe(stored)
        if recipe is not None and recipe < FORMAT_VERSION:
            log.info("data: using the stored data version %s, prepared by data recipe %d (this veritrain prepares with recipe %d)",
                     recorded[:12], recipe, FORMAT_VERSION)
            loaded = load_version(stored)
            loaded.reused = True
            return loaded
    timings: dict[str, float] = {}
    started = time.perf_counter()
    former_dir = former_version(data_cfg, versions or workspace_state / "data")
    if former_dir is not None:  # recorded (and hashed) by its full id, however the config abbreviates it
        data_cfg = data_cfg.model_copy(update={"test_from": former_dir.name})
    source = load_source(data_cfg, paths)
    if id_only:
        rehash = True
    timings["list"] = time.perf_counter() - started
    cache_dir = workspace_state / "cache"
    workers = data_cfg.workers or _default_workers()

    table = _sample_table(data_cfg, source, paths, cache_dir, rehash, timings)
    classes = source.classes

    # Everything the version depends on is known now; a prepare of the same inputs that already
    # ran maps them to its version, so unchanged data skips decoding, deduplication and splitting.
    fingerprint = _fingerprint(data_cfg, source, table)
    memo = cache_dir / "prepared" / fingerprint
    remembered = memo.read_text().strip() if memo.exists() else None
    if remembered and (workspace_state / "data" / remembered / "version.json").exists():
        final = workspace_state / "data" / remembered
        loaded = load_version(final)
        if _made_from(loaded, data_cfg, source, table):
            log.info("data: reusing data version %s (%d samples, unchanged)", remembered[:12], len(table.ids))
            _write_card(final, merged_card(data_cfg.card.model_dump(), getattr(source, "card", {})))
            loaded.reused = True
            _refuse_skew(data_cfg, loaded)
            return loaded
        log.warning("data: the cache named version %s for these inputs, but it was made from others; preparing anew", remembered[:12])

    if isinstance(source, FileListing):
        target, headers = _validate_files(data_cfg, table, cache_dir, workers, timings)
    else:
        target, headers = _array_target(data_cfg, source, table, cache_dir, timings)
    origin = source.origin
    source_preprocessing = source.preprocessing

    t = time.perf_counter()
    table.keep_usable = data_cfg.on_bad_file == "warn"
    _check_labels(table, classes)
    units, near_pairs = _duplicates_and_units(data_cfg, table, classes)
    _apply_policy(data_cfg, table)
    earlier = _mark_former_splits(former_dir, table, units) if former_dir is not None else None
    assigned = _split(data_cfg, table, units, classes)
    achieved = _achieved_split(data_cfg, table, units, assigned, classes)  # the split's own placement, before label quarantine
    if earlier is not None:
        achieved["test_from"] = _test_from_outcome(data_cfg, earlier, table, units, assigned)
    timings["validate_split"] = time.perf_counter() - t
    t = time.perf_counter()
    label_method = _label_issues_and_outliers(data_cfg, table, assigned, classes)
    timings["label_issues"] = time.perf_counter() - t
    leakage_pairs = _leakage_pairs(table, assigned, near_pairs)
    if leakage_pairs:  # cannot happen by construction; refuse rather than train on a leaking split
        raise RunFailed(f"data: {leakage_pairs} duplicate pair(s) cross splits after splitting; this is a bug, please report it")
    _check_balance(data_cfg, table, assigned, classes)

    preprocessing = preprocessing_config(data_cfg, source_preprocessing, target)
    if data_cfg.on_label_issue == "quarantine":  # the method then decides which samples train: part of the id
        preprocessing["label_issues"] = label_method
    split_of = [assigned.get(i, "quarantined") for i in range(len(table.ids))]
    samples = list(zip(table.ids, table.hashes, [l or "" for l in table.labels], split_of))
    store = workspace_state / "data"
    store.mkdir(parents=True, exist_ok=True)
    card = merged_card(data_cfg.card.model_dump(), getattr(source, "card", {}))

    log.info("data: writing a data version from %s (%d samples)", data_cfg.source, len(table.ids))
    rows = [i for i in range(len(table.ids)) if i in assigned]
    if not rows:
        raise RunFailed("data: no usable samples; see the findings in the data report")
    tmp = store / f".tmp-{uuid.uuid4().hex}"
    (tmp / "splits").mkdir(parents=True)
    try:
        t = time.perf_counter()
        _write_arrays(tmp, rows, table, source, data_cfg, target, classes, workers)
        timings["decode"] = time.perf_counter() - t
        info = _write_version(tmp, data_cfg, table, classes, assigned, rows, preprocessing, origin, units)
        info["achieved_split"] = achieved
        if FORMAT_VERSION >= BOUND_INFO_SINCE["listing_sha256"]:
            info["listing_sha256"] = listing_sha256(table, source)
        info["ignored"] = {"count": len(table.ignored), "files": table.ignored[:IGNORED_SHOWN]}  # not bound: no sample
        version = version_id(preprocessing, DATA_HASH_ALGORITHM, samples, content_hash(info))
        info["data_version"] = version
        if id_only:  # version_now: the id is all that is asked
            return version  # type: ignore[return-value]
        final = store / version
        if (final / "version.json").exists():
            log.info("data: reusing data version %s (%d samples)", version[:12], len(table.ids))
        else:
            from veritrain.data import report

            timings["total"] = time.perf_counter() - started
            report.write(tmp, info, [f.as_dict() for f in table.findings],
                         [{"sample_id": table.ids[i], "kind": f.kind, "reason": f.reason} for i, f in sorted(table.excluded.items())],
                         headers, leakage_pairs, achieved, label_method, {k: round(v, 4) for k, v in timings.items()}, card,
                         _picture_lookup(tmp, table, rows))
            _seal_version(tmp, info)
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "version.json").exists():  # not a lost race with a parallel prepare
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _write_card(final, card)
    loaded = load_version(final)
    _remember(memo, version)
    _refuse_skew(data_cfg, loaded)
    return loaded


def _made_from(data: DataVersion, data_cfg: Any, source: Any, table: _Table) -> bool:
    """Whether a stored version was prepared from this config and these samples (the cache that maps inputs to
    a version is a file in the workspace, so what it names is checked against the version's bound manifest)."""
    stored = data.info["preprocessing"]
    wanted = preprocessing_config(data_cfg, source.preprocessing)
    if stored.get("data") != wanted["data"] or stored.get("source") != wanted["source"] or stored.get("format") != wanted["format"]:
        return False
    with open(data.path / "manifest.csv", newline="", encoding="utf-8") as f:
        rows = [(row["sample_id"], row[DATA_HASH_ALGORITHM] or None, row["label"] or None, row.get("key") or None) for row in csv.DictReader(f)]
    return rows == list(zip(table.ids, table.hashes, table.labels, table.source_ids))


def _refuse_skew(data_cfg: Any, data: DataVersion) -> None:
    """data.on_split_skew: fail stops here (the version stays stored, with its report, for a look)."""
    achieved = data.info.get("achieved_split") or {}
    skewed = achieved.get("skewed") or []
    if skewed and data_cfg.on_split_skew == "fail":
        raise RunFailed(f"data: split_skew: {skewed[0]}" + (f" (and {len(skewed) - 1} more)" if len(skewed) > 1 else "")
                        + f"; see {data.path / 'data_report.md'}; fix the data, or set data.on_split_skew: warn to train on it anyway")
    leaks = (achieved.get("test_from") or {}).get("leaks") or []
    if leaks and data_cfg.on_split_skew == "fail":
        raise RunFailed(f"data: test_from_leak: {leaks[0]}" + (f" (and {len(leaks) - 1} more)" if len(leaks) > 1 else "")
                        + f"; see {data.path / 'data_report.md'}; separate the group's members, or set data.on_split_skew: warn to go on with it out of test")


def _picture_lookup(folder: Path, table: _Table, rows: list[int]) -> Any:
    """sample id → its picture for the report's gallery: the decoded row, or the thumbnail of a quarantined one."""
    inputs = np.load(folder / "inputs.npy", mmap_mode="r")
    row_of = {table.ids[i]: k for k, i in enumerate(rows)}
    index_of = {sid: i for i, sid in enumerate(table.ids)}

    def picture(sample_id: str) -> Optional[np.ndarray]:
        if sample_id in row_of and inputs.dtype == np.uint8 and inputs.ndim == 4:
            return np.asarray(inputs[row_of[sample_id]])
        return table.thumbs.get(index_of.get(sample_id, -1))
    return picture


def earlier_recipe_hint(recorded_data: Optional[dict[str, Any]]) -> str:
    """What to add when a run's data version no longer prepares: runs recorded before this recipe (no
    `recipe`, or another one) need the version they stored, since this recipe gives the same data another id."""
    recipe = (recorded_data or {}).get("recipe")
    if recipe == FORMAT_VERSION:
        return ""
    return (f"; the run's data was prepared by {'an earlier data recipe' if recipe is None else f'data recipe {recipe}'}, which this "
            f"veritrain (recipe {FORMAT_VERSION}) does not repeat: bring its stored version along (`veritrain archive RUN --with-data` "
            "where it was made, then `veritrain import`)")


def stored_recipe(folder: Path) -> Optional[int]:
    """The recipe (format) of a stored data version, None when it is not there or not readable."""
    try:
        return recipe_of(json.loads((folder / "version.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def carried_test_from(folder: Path) -> Optional[str]:
    """The data version a stored version took its test split from (data.test_from, recipe 4 on), if any;
    None when it names none or cannot be read."""
    try:
        carried = json.loads((folder / "version.json").read_text(encoding="utf-8"))["preprocessing"]["data"].get("test_from")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return carried if isinstance(carried, str) else None


def _default_workers() -> int:
    from veritrain.data.validate import default_workers

    return default_workers()


# ---------------------------------------------------------------- building the sample table


def _sample_table(cfg: Any, source: Any, paths: dict[str, Path], cache_dir: Optional[Path], rehash: bool, timings: dict[str, float],
                  recipe: Optional[int] = None) -> _Table:
    """Every sample of the source with its content hash (as `recipe` lists them), and the fixed test split of data.test_split_file."""
    table = _list_files(cfg, source, cache_dir, rehash, timings, recipe) if isinstance(source, FileListing) else _table_from_arrays(source)
    if cfg.split_by == "time" and table.ids and not any(table.timestamps):  # config refuses known sources; this catches registered ones
        raise UserError(f"data.split_by: 'time' needs data.source: csv with a timestamp column; data.source {cfg.source!r} gave no timestamps, use split_by: random")
    if cfg.test_split_file is not None:
        # paths holds it resolved by the config (config folder, ${env:}); a config built in code has only the text
        _apply_test_split_file(paths.get("test_split_file") or Path(expand_env(cfg.test_split_file)).expanduser().resolve(), table)
    return table


def _table_from_arrays(source: SourceData) -> _Table:
    n = len(source.sample_ids)
    table = _Table(
        ids=list(source.sample_ids),
        paths=[None] * n,
        sizes=list(source.sizes),
        hashes=list(source.content_hashes),
        labels=list(source.label_names()),
        groups=[None] * n,
        fixed=list(source.fixed_split) if source.fixed_split else [None] * n,
        timestamps=[None] * n,
        source_ids=[None] * n,
    )
    return table


def _array_target(cfg: Any, source: SourceData, table: _Table, cache_dir: Path, timings: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    shape = list(source.inputs.shape[1:])
    if source.inputs.dtype == np.uint8 and source.inputs.ndim == 4:
        t = time.perf_counter()
        _array_features(source.inputs, table, _near_duplicates_on(cfg, shape), cache_dir)
        timings["features"] = time.perf_counter() - t
    return {"shape": shape, "dtype": str(source.inputs.dtype)}, {"shape": {"×".join(map(str, shape)): len(table.ids)}}


def _fingerprint(cfg: Any, source: Any, table: _Table) -> str:
    """Hash of every input of the stage: data config (minus locations and card), the source's
    preprocessing, each sample's id, content hash, label, group, fixed split and timestamp, the
    listing's findings, and the versions of veritrain and the decoders."""
    import PIL

    from veritrain import __version__

    return sha256_json({
        "config": preprocessing_config(cfg, source.preprocessing),
        "samples": list(zip(table.ids, table.hashes, table.labels, table.groups, table.fixed, table.timestamps, table.source_ids)),
        "findings": [f.as_dict() for f in table.findings],
        "versions": {"veritrain": __version__, "pillow": PIL.__version__, "numpy": np.__version__},
    })


def _remember(memo: Path, version: str) -> None:
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{uuid.uuid4().hex}")
    tmp.write_text(version + "\n")
    os.replace(tmp, memo)


def _array_features(inputs: np.ndarray, table: _Table, near_duplicates: bool, cache_dir: Path) -> None:
    """Perceptual hash, comparison picture and thumbnail of each array sample, cached by content hash."""
    from veritrain.data import dedup
    from veritrain.data.validate import Check, CheckCache, CheckParams

    params = CheckParams(0, 0, 0, False, 0, near_duplicates)  # arrays: nothing but the features is checked
    cache = CheckCache(cache_dir / "images.sqlite")
    try:
        known = cache.checks(sorted(set(h for h in table.hashes if h)), params)
        fresh: dict[str, Check] = {}
        for i, h in enumerate(table.hashes):
            assert h is not None  # an array source hashes every sample (SourceData.content_hashes)
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


def _take_features(table: _Table, i: int, check: Any) -> None:
    if check.phash is not None:
        table.phash[i] = check.phash
    if check.picture is not None:
        table.pictures[i] = check.picture
    if check.thumb is not None:
        table.thumbs[i] = check.thumb


def _near_duplicates_on(cfg: Any, shape: list[int]) -> bool:
    if cfg.near_duplicates == "auto":  # note: YAML true/false arrive as "on"/"off"
        return len(shape) >= 2 and min(shape[0], shape[1]) >= NEAR_DUPLICATE_MIN_SIDE
    return cfg.near_duplicates == "on"


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _list_files(cfg: Any, source: FileListing, cache_dir: Optional[Path], rehash: bool, timings: dict[str, float],
                recipe: Optional[int] = None) -> _Table:
    """The sample table of a file source with every file hashed (stat cache first; none when `cache_dir` is None:
    every byte is read). Under `recipe` (default: this one) 5 on, files found by walking data.root that are not
    images are left out."""
    from veritrain.hashing import StatCache, hash_files

    recipe = FORMAT_VERSION if recipe is None else recipe
    ignored = sorted(s.sample_id for s in source.samples if recipe >= 5 and s.walked and not is_image_name(s.sample_id))
    skipped = set(ignored)
    samples = sorted((s for s in source.samples if s.sample_id not in skipped), key=lambda s: s.sample_id)
    n = len(samples)
    table = _Table(
        ids=[s.sample_id for s in samples],
        paths=[s.path for s in samples],
        sizes=[0] * n,
        hashes=[None] * n,
        labels=[s.label for s in samples],
        groups=[s.group for s in samples],
        fixed=[s.fixed_split for s in samples],
        timestamps=[s.timestamp for s in samples],
        source_ids=[s.source_id for s in samples],
        ignored=ignored,
    )
    if ignored:
        log.info("data: %d file(s) under data.root are not images and are ignored (%s%s); see the data report",
                 len(ignored), ", ".join(ignored[:3]), ", …" if len(ignored) > 3 else "")
    index_of = {sid: i for i, sid in enumerate(table.ids)}
    for kind, ids, reason in source.findings:
        if kind == "unreadable":  # listed (e.g. in a label map) but not on disk: nothing to quarantine
            table.findings.append(Finding(kind, ids, reason))
        else:
            table.add(kind, [index_of[i] for i in ids if i in index_of], reason)

    t = time.perf_counter()
    stat_cache = StatCache(cache_dir / "files.sqlite") if cache_dir is not None else None
    try:
        hashed = hash_files([s.path for s in samples], stat_cache, rehash=rehash or stat_cache is None)
    finally:
        if stat_cache is not None:
            stat_cache.close()
    timings["hash"] = time.perf_counter() - t
    timings["hash_cached_files"] = sum(1 for h in hashed.values() if h.cached)
    for i, s in enumerate(samples):
        result = hashed[s.path]
        table.sizes[i] = result.size
        if result.digest is None:
            table.add("unreadable", [i], f"cannot be read ({result.error})", exclude=True)
        else:
            table.hashes[i] = result.digest
            if result.size == 0:
                table.add("empty", [i], "zero-byte file", exclude=True)
    return table


def _validate_files(cfg: Any, table: _Table, cache_dir: Path, workers: int, timings: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Decode and check every distinct content once (cached by content hash); returns the target
    shape and a summary of sizes, modes and formats."""
    from veritrain.data import validate

    t = time.perf_counter()
    files: dict[str, str] = {}
    for i in table.included():
        files.setdefault(table.content_hash(i), str(table.paths[i]))
    check_cache = validate.CheckCache(cache_dir / "images.sqlite")
    try:
        headers = validate.headers_for(files, check_cache, workers)
        sizes = Counter((h.height, h.width) for h in headers.values() if h.error is None)
        modes = Counter(1 if h.mode in ("L", "1", "I", "I;16", "F") else 3 for h in headers.values() if h.error is None)
        if cfg.image_size is not None:
            height, width = cfg.image_size
        elif sizes:
            (height, width), _ = sizes.most_common(1)[0]
        else:
            height, width = 0, 0
        channels = cfg.channels or (modes.most_common(1)[0][0] if modes else 3)
        target = {"shape": [height, width, channels], "dtype": "uint8", "convert": cfg.convert,
                  "resize": "bilinear" if cfg.convert else None, "image_size_from": "config" if cfg.image_size else "most common in data",
                  "exif_orientation": "not applied"}
        params = validate.CheckParams(height, width, channels, cfg.convert, cfg.max_pixels, _near_duplicates_on(cfg, [height, width]))
        checks = validate.checks_for(files, headers, params, check_cache, workers)
    finally:
        check_cache.close()
    timings["validate"] = time.perf_counter() - t
    for i in table.included():
        check = checks[table.content_hash(i)]
        for kind, reason in check.findings:
            table.add(kind, [i], reason, exclude=kind in UNUSABLE)
        if check.usable:
            _take_features(table, i, check)
    summary = {
        "sizes": {f"{w}×{h}": n for (h, w), n in sizes.most_common(10)},
        "modes": dict(Counter(h.mode for h in headers.values() if h.error is None).most_common()),
        "formats": dict(Counter(h.format for h in headers.values() if h.error is None).most_common()),
    }
    return target, summary


def _apply_test_split_file(path: Path, table: _Table) -> None:
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


def _check_labels(table: _Table, classes: Optional[list[str]]) -> None:
    if classes is None:
        return
    known = set(classes)
    for i in table.included():
        label = table.labels[i]
        if label is None:
            table.add("missing_label", [i], "no label (outside any class folder, or not in the label file)", exclude=True)
        elif label not in known:
            table.add("unknown_label", [i], f"label {label!r} is not one of data.classes", exclude=True)


# ---------------------------------------------------------------- duplicates, groups, leakage


SPLIT_PRIORITY = {"test": 0, "val": 1, "train": 2}  # where copies disagree, the most protected split wins


def _duplicates_and_units(cfg: Any, table: _Table, classes: Optional[list[str]]) -> tuple[list[splitting.Unit], np.ndarray]:
    """Exact duplicates, confirmed near-duplicates and groups, joined into the units the split keeps whole.
    Returns the units and the confirmed near-duplicate pairs (sample indices), which the leakage count checks."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from veritrain.data.dedup import exact_duplicate_groups

    included = table.included()
    # exact duplicates: same content, same label → kept together; different labels → all quarantined
    links: list[list[int]] = []
    for group in exact_duplicate_groups([table.content_hash(i) for i in included]):
        members = [included[k] for k in group]
        labels = {table.labels[i] for i in members}
        if len(labels) > 1:
            shown = ", ".join(f"{table.ids[i]}={table.labels[i]}" for i in members[:6])
            table.add("conflicting_duplicate", members, f"same content, different labels ({shown})", exclude=True)
            if table.keep_usable:
                links.append(members)  # kept under on_bad_file: warn, but still in one split
        else:
            table.add("duplicate", members, f"{len(members)} identical copies; kept together in one split")
            links.append(members)
        for i in members:
            table.units_of[i] = "exact duplicates"

    near_pairs = _near_duplicates(cfg, table, links)

    # groups: the csv group column or data.group_regex over the relpath
    pattern = re.compile(cfg.group_regex) if cfg.group_regex else None
    by_group: dict[str, list[int]] = defaultdict(list)
    for i in table.included():
        group = table.groups[i]
        if pattern is not None:
            match = pattern.search(table.ids[i])
            group = match.group(1) if match else group
        if group is not None:
            by_group[group].append(i)
    for name, members in by_group.items():
        if len(members) > 1:
            links.append(members)
            for i in members:
                table.units_of[i] = f"group {name!r}"

    # units: connected components of every link (scipy), so one rule joins duplicates, near-duplicates and groups
    n = len(table.ids)
    heads = [members[0] for members in links for _ in members[1:]]
    tails = [other for members in links for other in members[1:]]
    graph = coo_matrix((np.ones(len(heads)), (heads, tails)), shape=(n, n))
    _, component_of = connected_components(graph, directed=False)

    # a unit whose members have different fixed splits would leak: the most protected split wins and
    # the copies fixed elsewhere are quarantined as `leak_duplicate`
    components: dict[int, list[int]] = defaultdict(list)
    for i in table.included():
        components[int(component_of[i])].append(i)
    class_index: dict[Optional[str], int] = {c: k for k, c in enumerate(classes)} if classes else {}  # get(None): None
    units = []
    for members in components.values():
        fixed = {split for split in (table.fixed[i] for i in members) if split}
        winner = min(fixed, key=SPLIT_PRIORITY.__getitem__) if fixed else None
        if len(fixed) > 1:
            keepers = [i for i in members if table.fixed[i] in (winner, None)]
            for i in members:
                if table.fixed[i] not in (winner, None):
                    table.add("leak_duplicate", [i],
                              f"a copy (or group member) of {table.ids[keepers[0]]} in the fixed {winner} split, fixed to {table.fixed[i]}; quarantined so nothing leaks",
                              exclude=True)
            members = keepers
        timestamps = [stamp for stamp in (table.timestamps[i] for i in members) if stamp]
        units.append(splitting.Unit(
            members=sorted(members),
            labels=[class_index.get(table.labels[i]) if classes else None for i in members],
            fixed=winner,
            timestamp=max(timestamps) if timestamps else None,
            key=splitting.unit_key(table.key(i) for i in members),
        ))
    units.sort(key=lambda u: u.members[0])
    return units, near_pairs


def _near_duplicates(cfg: Any, table: _Table, links: list[list[int]]) -> np.ndarray:
    """Confirmed near-duplicate pairs among the included samples with pictures (dedup.near_duplicates),
    reported one finding per group; groups with different labels are quarantined like conflicting
    duplicates. Appends each kept group to `links`; returns the confirmed pairs as sample indices."""
    from veritrain.data.dedup import near_duplicates

    # one picture per distinct content: exact copies are linked by their hash already, and 10,000 copies of one
    # blank frame would otherwise make 50 million candidate pairs
    copies: dict[str, list[int]] = defaultdict(list)
    for i in table.included():
        if i in table.pictures:
            copies[table.content_hash(i)].append(i)
    candidates = [members[0] for members in copies.values()]
    if len(candidates) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    found = near_duplicates(np.array([table.phash[i] for i in candidates], dtype=np.uint64),
                            np.stack([table.pictures[i] for i in candidates]), cfg.near_duplicate_distance, cfg.near_duplicate_difference)
    index = np.array(candidates, dtype=np.int64)
    pairs = index[found.pairs] if len(found.pairs) else np.zeros((0, 2), dtype=np.int64)
    difference_of = {(int(a), int(b)): float(d) for (a, b), d in zip(pairs, found.differences)}
    for component in found.components:
        members = sorted(i for k in component for i in copies[table.content_hash(candidates[k])])
        inside = [(int(a), int(b)) for a, b in pairs[np.isin(pairs[:, 0], members)][:2]]  # a pair never leaves its group (of representatives)
        examples = "; ".join(f"{table.ids[a]} ~ {table.ids[b]} (difference {difference_of[(a, b)]:.3f})" for a, b in inside[:2])
        labels = {table.labels[i] for i in members}
        if len(labels) > 1:
            shown = ", ".join(f"{table.ids[i]}={table.labels[i]}" for i in members[:6])
            table.add("conflicting_near_duplicate", members, f"the same picture with different labels ({shown}); e.g. {examples}", exclude=True)
            if not table.keep_usable:
                continue
        else:
            table.add("near_duplicate", members, f"{len(members)} copies of one picture (e.g. {examples}); kept together in one split")
        links.append(members)
        for i in members:
            table.units_of[i] = "near-duplicate group"
        if len(members) > cfg.max_cluster_size:
            table.add("near_duplicate_cluster_capped", members,
                      f"a near-duplicate group of {len(members)} samples (more than data.max_cluster_size {cfg.max_cluster_size}), e.g. {examples}; "
                      "check the data, or lower data.near_duplicate_difference")
    return pairs


def former_version(cfg: Any, versions: Path) -> Optional[Path]:
    """The stored data version data.test_from names (full id or unique prefix), checked like every open; None
    when the key is not set. A missing or ambiguous one is a usage error naming the key."""
    ref = getattr(cfg, "test_from", None)
    if ref is None:
        return None
    if not re.fullmatch(r"[0-9a-f]{4,64}", ref):  # the config checks it; a value set in code or read from a record may not be
        raise UserError(f"data.test_from: {ref!r}: expected a data version id or a prefix of it (4 to 64 lowercase hex digits)")
    stored = sorted(p for p in versions.glob(f"{ref}*") if (p / "version.json").is_file()) if versions.is_dir() else []
    if not stored:
        raise UserError(f"data.test_from: {ref!r}: no data version with this id or prefix in {versions}; give the id of a version "
                        "stored in this workspace (`veritrain data report ID` shows one), or import the run that used it with --with-data")
    if len(stored) > 1:
        raise UserError(f"data.test_from: {ref!r}: matches {len(stored)} data versions ({', '.join(p.name[:12] for p in stored[:3])}); give a longer prefix or the full id")
    check_version(stored[0])
    return stored[0]


@dataclass
class _Former:
    """What data.test_from's version says about today's samples."""

    version: str
    matched_by: str  # "key" (recipe 4 on: the manifest's key column) or the content hash (earlier recipes)
    split_of: dict[int, str]  # sample index → its split in that version (samples it placed; quarantined ones are new)


def _mark_former_splits(folder: Path, table: _Table, units: list[splitting.Unit]) -> _Former:
    """Give each unit the splits its members had in data.test_from's version (`Unit.former`), matching samples by
    key; a version of recipe 3 or before has no key column, so there the content hash matches (same algorithm)."""
    info = json.loads((folder / "version.json").read_text(encoding="utf-8"))
    if info.get("hash_algorithm") != DATA_HASH_ALGORITHM:
        raise UserError(f"data.test_from: {folder.name[:12]}: hashes samples with {info.get('hash_algorithm')!r}, not {DATA_HASH_ALGORITHM}; "
                        "its samples cannot be matched to these, give a version prepared by this veritrain")
    with open(folder / "manifest.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    by_key = bool(rows) and "key" in rows[0]
    former: dict[str, str] = {}
    for row in rows:
        if row["status"] == "ok" and row["split"] in SPLITS:
            key = (row["key"] if by_key else "") or row[DATA_HASH_ALGORITHM]
            # copies of one content share a key and a split; should they not, the most protected split counts
            if key not in former or SPLIT_PRIORITY[row["split"]] < SPLIT_PRIORITY[former[key]]:
                former[key] = row["split"]
    split_of = {}
    for unit in units:
        for i in unit.members:
            found = former.get(table.key(i) if by_key else table.hashes[i] or "")
            if found is not None:
                split_of[i] = found
        unit.former = frozenset(split_of[i] for i in unit.members if i in split_of)
    return _Former(folder.name, "key" if by_key else DATA_HASH_ALGORITHM, split_of)


def _test_from_outcome(cfg: Any, former: _Former, table: _Table, units: list[splitting.Unit], assigned: dict[int, str]) -> dict[str, Any]:
    """What data.test_from did, bound with the achieved split: former test samples kept in test, former train/val
    samples kept out of the test split the hash gave them, and each group that mixes the two (`test_from_leak`:
    kept out of test, so its former test members leave it; data.on_split_skew decides whether that stops)."""
    outcome: dict[str, Any] = {"version": former.version, "matched_by": former.matched_by,
                               "former_test_samples": 0, "kept_in_test": 0, "kept_out_of_test": 0, "leaks": []}
    ratios = splitting.free_ratios(cfg.split_ratios, {u.fixed for u in units if u.fixed})  # as splitting.assign places
    for unit in units:
        placed = [i for i in unit.members if i in assigned]
        earlier = [i for i in placed if i in former.split_of]
        outcome["former_test_samples"] += sum(1 for i in earlier if former.split_of[i] == "test")
        outcome["kept_in_test"] += sum(1 for i in earlier if former.split_of[i] == "test" and assigned[i] == "test")
        if unit.fixed is not None or not placed:
            continue
        if unit.former & {"train", "val"} and splitting.place(unit.key, ratios, cfg.split_seed) == "test":
            outcome["kept_out_of_test"] += len(placed)  # the hash said test; formerly trained on, so kept where it was
        if "test" in unit.former and unit.former & {"train", "val"}:
            tested = [i for i in unit.members if former.split_of.get(i) == "test"]
            trained = [i for i in unit.members if former.split_of.get(i) in ("train", "val")]
            why = table.units_of.get(unit.members[0], "tied samples")
            reason = (f"a unit of {len(unit.members)} samples kept together ({why}) holds {len(tested)} former test sample(s) of data "
                      f"version {former.version[:12]} (e.g. {table.ids[tested[0]]}) and {len(trained)} former train/val one(s) (e.g. {table.ids[trained[0]]}); it went to {assigned[placed[0]]}, "
                      "so no former training sample enters test and those test samples leave it")
            outcome["leaks"].append(reason)
            table.add("test_from_leak", tested + trained, reason)
    return outcome


def _split(cfg: Any, table: _Table, units: list[splitting.Unit], classes: Optional[list[str]]) -> dict[int, str]:
    splits = splitting.assign(units, cfg.split_ratios, cfg.split_seed, by_time=cfg.split_by == "time", class_names=classes)
    return {i: s for unit, s in zip(units, splits) for i in unit.members if i not in table.excluded}


def _leakage_pairs(table: _Table, assigned: dict[int, str], near_pairs: np.ndarray) -> int:
    """Pairs of identical samples, or confirmed near-duplicate pairs, that sit in different splits."""
    by_hash: dict[str, Counter] = defaultdict(Counter)
    for i, s in assigned.items():
        by_hash[table.content_hash(i)][s] += 1
    pairs = 0
    for counts in by_hash.values():
        values = list(counts.values())
        pairs += sum(a * b for k, a in enumerate(values) for b in values[k + 1 :])
    for a, b in near_pairs.tolist():
        if table.hashes[a] != table.hashes[b] and a in assigned and b in assigned and assigned[a] != assigned[b]:
            pairs += 1
    return pairs


def _achieved_split(cfg: Any, table: _Table, units: list[splitting.Unit], assigned: dict[int, str], classes: Optional[list[str]]) -> dict[str, Any]:
    """Each class's achieved train/val/test fractions over the samples the split was free to place, against the
    ratios they were meant to follow, and the same over all those samples together (`whole`). Each sample's place
    follows the hash of its key, so a class of n samples lands within a few σ = √(p(1−p)/n) of each ratio p by
    chance alone: a class further off than max(data.split_tolerance, 3σ) in some split is a `split_skew` finding
    that names what forced it, and so is the whole set further off than max(data.split_tolerance, 3σ) (the
    tolerance, once there are a few thousand samples). Every gap is also given in σ. Fixed splits and time splits
    are not judged."""
    fixed_present = {u.fixed for u in units if u.fixed}
    wanted = splitting.free_ratios(cfg.split_ratios, fixed_present)  # type: ignore[arg-type]
    result: dict[str, Any] = {"asked": dict(zip(SPLITS, cfg.split_ratios)), "wanted_for_free_samples": dict(zip(SPLITS, wanted)),
                              "judged": cfg.split_by == "random" and classes is not None, "per_class": {}, "whole": None, "skewed": [],
                              "bound": "max(data.split_tolerance, 3 sigma), sigma = sqrt(p (1 - p) / n)"}
    if not result["judged"]:
        return result
    unit_of = {i: unit for unit in units for i in unit.members}
    free: dict[str, list[int]] = defaultdict(list)
    for i in assigned:
        if unit_of.get(i) is not None and unit_of[i].fixed is None:
            free[table.labels[i] or ""].append(i)
    for name in classes or []:
        members = free.get(name, [])
        if not members:
            continue
        judged = _judged_fractions(cfg, [assigned[i] for i in members], wanted)
        result["per_class"][name] = judged
        if judged["skewed"]:
            # the biggest tied unit of this class in the split that got too many: what forced the skew
            over = max(SPLITS, key=lambda s: judged[s] - wanted[SPLITS.index(s)])
            tied = [unit_of[i] for i in members if assigned[i] == over and len(unit_of[i].members) > 1]
            biggest = max(tied, key=lambda u: len(u.members), default=None)
            cause = (f"a unit of {len(biggest.members)} samples that must stay together ({table.units_of.get(biggest.members[0], 'tied samples')}, "
                     f"e.g. {table.ids[biggest.members[0]]}) went to {over}") if biggest else "no group forced it: the hash of the keys placed them so by chance, another data.split_seed places every sample anew"
            reason = (f"class {name!r}: train/val/test {_shown_fractions(judged)} of {len(members)} samples, "
                      f"asked {' / '.join(f'{w:.2f}' for w in wanted)} ({_shown_gaps(judged)}; allowed max(data.split_tolerance "
                      f"{cfg.split_tolerance:g}, 3σ)); {cause}")
            result["skewed"].append(reason)
            table.add("split_skew", [], reason)
    everything = [i for members in free.values() for i in members]
    if everything:
        whole = result["whole"] = _judged_fractions(cfg, [assigned[i] for i in everything], wanted)
        if whole["skewed"]:
            reason = (f"all classes together: train/val/test {_shown_fractions(whole)} of {len(everything)} samples, "
                      f"asked {' / '.join(f'{w:.2f}' for w in wanted)} ({_shown_gaps(whole)}; allowed max(data.split_tolerance "
                      f"{cfg.split_tolerance:g}, 3σ)); large groups tip the whole split")
            result["skewed"].append(reason)
            table.add("split_skew", [], reason)
    for name, found in result["per_class"].items():
        found.pop("skewed")
    if result["whole"]:
        result["whole"].pop("skewed")
    return result


def _judged_fractions(cfg: Any, splits: list[str], wanted: list[float]) -> dict[str, Any]:
    """Achieved fractions of `splits` against `wanted`: per split the gap, σ = √(p(1−p)/n), the gap in σ and what is
    allowed, max(data.split_tolerance, 3σ); `largest_gap` and `allowed` are those of the split furthest past (or
    nearest to) its bound."""
    n = len(splits)
    counts = Counter(splits)
    fractions = {s: counts[s] / n for s in SPLITS}
    gap = {s: fractions[s] - w for s, w in zip(SPLITS, wanted)}
    sigma = {s: math.sqrt(w * (1 - w) / n) for s, w in zip(SPLITS, wanted)}
    allowed = {s: max(cfg.split_tolerance, 3 * sigma[s]) for s in SPLITS}
    worst = max(SPLITS, key=lambda s: abs(gap[s]) - allowed[s])
    return {"samples": n, **{s: round(fractions[s], 4) for s in SPLITS},
            "largest_gap": round(abs(gap[worst]), 4), "allowed": round(allowed[worst], 4),
            "gap_sigma": {s: round(gap[s] / sigma[s], 2) if sigma[s] > 0 else 0.0 for s in SPLITS},
            "skewed": any(abs(gap[s]) > allowed[s] + 1e-12 for s in SPLITS)}


def _shown_fractions(judged: dict[str, Any]) -> str:
    return " / ".join(f"{judged[s]:.2f}" for s in SPLITS)


def _shown_gaps(judged: dict[str, Any]) -> str:
    return "gaps " + " / ".join(f"{judged['gap_sigma'][s]:+.1f}σ" for s in SPLITS)


def _check_balance(cfg: Any, table: _Table, assigned: dict[int, str], classes: Optional[list[str]]) -> None:
    """`imbalance` when the largest class has at least data.imbalance_ratio times the samples of the smallest,
    over the whole set and within each split."""
    if not classes:
        return
    counts = Counter(table.labels[i] for i in assigned)
    empty = [c for c in classes if counts[c] == 0]
    if empty:
        raise RunFailed(f"data: class(es) {', '.join(map(repr, empty))} have no usable samples (too_small); add samples, fix the quarantined ones, or drop them from data.classes")
    scopes = [("all splits", counts)] + [(name, Counter(table.labels[i] for i, s in assigned.items() if s == name)) for name in SPLITS]
    for scope, found in scopes:
        present = [c for c in classes if found[c] > 0]
        if not present:
            continue
        big = max(present, key=lambda c: found[c])
        small = min(present, key=lambda c: found[c])
        ratio = found[big] / found[small]
        if ratio >= cfg.imbalance_ratio:
            table.add("imbalance", [], f"{scope}: class {big!r} has {found[big]} samples, {small!r} has {found[small]} "
                      f"(ratio {ratio:.1f} ≥ data.imbalance_ratio {cfg.imbalance_ratio:g})")


def _label_issues_and_outliers(cfg: Any, table: _Table, assigned: dict[int, str], classes: Optional[list[str]]) -> dict[str, Any]:
    """`label_issue` and `outlier` findings over the placed samples' thumbnails (data.label_issues).

    With data.on_label_issue: quarantine (and data.on_bad_file other than warn, which keeps every usable
    sample), label issues in train and val are removed, judged against train and val only, so no test label
    decides what is trained on; test-split label issues are judged against all the data and only reported,
    since removing them would inflate test accuracy. Returns the method as recorded.
    """
    from veritrain.data import label_issues

    placed = [i for i in sorted(assigned) if i in table.thumbs]
    if not classes or len(placed) < 2:
        return {"skipped": "no classes" if not classes else "fewer than two samples"}
    class_index = {c: k for k, c in enumerate(classes)}
    quarantine = cfg.on_label_issue == "quarantine" and not table.keep_usable

    def find(rows: list[int]) -> Any:
        return label_issues.find_label_issues_and_outliers(
            np.stack([table.thumbs[i] for i in rows]), np.array([class_index[table.label(i)] for i in rows], dtype=np.int64),
            len(classes), cfg.split_seed)

    found = find(placed)
    issues = [(placed[flag.index], flag) for flag in found.label_issues]
    if quarantine:  # train and val decided without the test split; the test split's own issues from the whole run
        training = [i for i in placed if assigned[i] != "test"]
        from_training = [(training[f.index], f) for f in find(training).label_issues] if len(training) >= 2 else []
        issues = sorted(from_training + [(i, f) for i, f in issues if assigned[i] == "test"], key=lambda item: -item[1].score)
    for rank, (i, flag) in enumerate(issues, 1):
        suggested = classes[flag.suggested] if flag.suggested is not None else "?"
        where = assigned[i]
        removed = quarantine and where != "test"
        # the reason is stored (quarantine.csv): no float-derived score or rank in it, those are details
        finding = table.add("label_issue", [i], f"labelled {table.labels[i]!r}, the data points to {suggested!r} ({where} split)", exclude=removed)
        finding.details = {"label": table.labels[i], "suggested": suggested, "score": round(flag.score, 6), "rank": rank, "split": where}
        if removed:
            finding.severity = "quarantine"
            del assigned[i]
    for rank, flag in enumerate(found.outliers, 1):
        i = placed[flag.index]
        finding = table.add("outlier", [i], f"far from everything else in class {table.labels[i]!r} and in the data")
        finding.details = {"label": table.labels[i], "score": round(flag.score, 6), "rank": rank, "split": assigned.get(i)}
    return found.method


def _apply_policy(cfg: Any, table: _Table) -> None:
    """data.on_bad_file: fail stops here, listing what would have been quarantined."""
    bad = [f for f in table.findings if f.severity == "quarantine"]
    if cfg.on_bad_file == "fail" and bad:
        listed = "; ".join(f"{', '.join(f.samples[:3])}: {f.kind}" for f in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise RunFailed(f"data: {len(bad)} bad sample finding(s) with data.on_bad_file: fail: {listed}{more}; fix or remove them, or use on_bad_file: quarantine")


# ---------------------------------------------------------------- writing and reading a version


def _write_arrays(out: Path, rows: list[int], table: _Table, source: Any, cfg: Any, target: dict[str, Any],
                  classes: Optional[list[str]], workers: int) -> None:
    """inputs.npy and targets.npy of the placed rows, written through a memory map: file samples are decoded
    straight into it by worker processes, array samples copied in chunks, so memory holds no second copy."""
    from numpy.lib.format import open_memmap

    if isinstance(source, FileListing):
        from veritrain.data import validate

        h, w, c = target["shape"]
        inputs = open_memmap(out / "inputs.npy", mode="w+", dtype=np.uint8, shape=(len(rows), h, w, c))
        params = validate.CheckParams(h, w, c, cfg.convert, cfg.max_pixels, near_duplicates=False)
        failed = validate.decode_into(inputs, [(str(table.paths[i]), str(table.hashes[i])) for i in rows], params, workers)
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


def _write_version(out: Path, cfg: Any, table: _Table, classes: Optional[list[str]], assigned: dict[int, str],
                   rows: list[int], preprocessing: dict[str, Any], origin: dict[str, Any], units: list[splitting.Unit]) -> dict[str, Any]:
    """manifest.csv, quarantine.csv and the split lists beside the arrays; returns version.json's content
    (without the id, which hashes it)."""
    unit_of = {i: unit.key for unit in units for i in unit.members}
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
    for name in SPLITS:
        ids = [table.ids[i] for i in rows if assigned[i] == name]
        (out / "splits" / f"{name}.txt").write_text("".join(i + "\n" for i in ids), encoding="utf-8")

    inputs = np.load(out / "inputs.npy", mmap_mode="r")
    targets = np.load(out / "targets.npy")
    row_splits = np.array([assigned[i] for i in rows])
    counts = {s: int((row_splits == s).sum()) for s in SPLITS}
    per_class = None
    if classes is not None:
        per_class = {s: {c: int(((row_splits == s) & (targets == k)).sum()) for k, c in enumerate(classes)} for s in SPLITS}

    return {
        "data_version": None,
        "format": FORMAT_VERSION,
        "hash_algorithm": DATA_HASH_ALGORITHM,
        "preprocessing": preprocessing,
        "classes": classes,
        "counts": counts,
        "counts_per_class": per_class,
        "quarantined": len(table.excluded),
        "input_shape": list(inputs.shape[1:]),
        "input_dtype": str(inputs.dtype),
        "target_dtype": str(targets.dtype),
        "normalization": normalization_stats(inputs, np.flatnonzero(row_splits == "train")),
        "origin": origin,
        "decoders": decoder_versions(),
        # every file training reads, bound to the version id through `content_hash`
        "files": {name: {"size": (out / name).stat().st_size, "sha256": sha256_file(out / name)} for name in BOUND_FILES},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _seal_version(out: Path, info: dict[str, Any]) -> None:
    """version.json, with the table of the report files written beside the bound ones (checked on every open,
    though outside the id: reports hold timings and drawings that differ between machines)."""
    bound = set(BOUND_FILES) | {"version.json", CARD_FILE}
    info["reports"] = {p.relative_to(out).as_posix(): sha256_file(p) for p in sorted(out.rglob("*"))
                       if p.is_file() and p.relative_to(out).as_posix() not in bound}
    (out / "version.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def merged_card(config_card: dict[str, Any], source_card: dict[str, Any]) -> dict[str, Any]:
    """data.card, with what the source knows of itself (digits, CIFAR-10) filling the keys left empty;
    URL credentials and the like are redacted by their shape (the config's card holds none: load_config refuses them)."""
    from veritrain.secrets import redact_text

    merged = {key: value if value else source_card.get(key) for key, value in config_card.items()}
    return {key: redact_text(value) if isinstance(value, str) else value for key, value in merged.items()}


def _write_card(version_dir: Path, card: dict[str, Any]) -> None:
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
    histogram = np.zeros((channels, 256), dtype=np.int64)  # how often each value occurs: the sums follow exactly
    rows_at_once = max(1, (1 << 20) // max(1, int(np.prod(inputs.shape[1:]))))  # 1 MiB of pixels (bincount copies them as int64)
    for start in range(0, len(train_rows), rows_at_once):
        chunk = np.asarray(inputs[train_rows[start : start + rows_at_once]]).reshape(-1, channels)
        for c in range(channels):
            histogram[c] += np.bincount(chunk[:, c], minlength=256)
    values = np.arange(256, dtype=np.int64)
    total = [int(h @ values) for h in histogram]
    squares = [int(h @ (values * values)) for h in histogram]
    count = len(train_rows) * (int(np.prod(inputs.shape[1:])) // channels)
    mean = [t / (255 * count) if count else 0.0 for t in total]
    std = [math.sqrt(count * q - t * t) / (255 * count) if count else 0.0 for t, q in zip(total, squares)]
    return {"scale": "x / 255", "mean": mean, "std": std, "computed_on": "train"}


_checked: dict[str, tuple] = {}  # version folder → file identities when last checked in this process


def check_version(path: Path) -> None:
    """Refuse a stored data version whose files do not match what its id binds (RunFailed, one line naming
    the file and the fix). Checked once per process while the files stay the same (inode, size, mtime)."""
    from veritrain.data.integrity import data_version_problems

    names = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != CARD_FILE)
    identity = tuple((name, *_identity(path / name)) for name in names)
    if _checked.get(str(path)) == identity:
        return
    problems = data_version_problems(path.name, lambda name: (path / name).read_bytes(), lambda name: sha256_file(path / name), names)
    if problems:
        first = problems[0]
        raise RunFailed(f"{path / first['path']}: data version {path.name[:12]} is damaged ({first['detail']}); nothing was trained on it: "
                        f"remove {path} and prepare it again (`veritrain data prepare CONFIG`), or import its run again with --with-data")
    _checked[str(path)] = identity


def _identity(file: Path) -> tuple[int, int, int, int]:
    stat = file.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns  # ctime: a restored mtime cannot hide an edit


def load_version(path: Path) -> DataVersion:
    """A stored data version, after `check_version`. The splits come from the manifest's split column, which
    every recipe binds to the id (recipe 2 and before did not bind the split lists)."""
    check_version(path)
    info = json.loads((path / "version.json").read_text(encoding="utf-8"))
    with open(path / "manifest.csv", newline="", encoding="utf-8") as f:
        placed = [(row["sample_id"], row["split"]) for row in csv.DictReader(f) if row["status"] == "ok"]
    inputs = np.load(path / "inputs.npy", mmap_mode="r")
    targets = np.load(path / "targets.npy", mmap_mode="r")
    if len(inputs) != len(placed) or len(targets) != len(placed) or any(split not in SPLITS for _, split in placed):
        raise RunFailed(f"{path / 'manifest.csv'}: data version {path.name[:12]} does not match its arrays ({len(placed)} placed samples, "
                        f"{len(inputs)} rows); remove {path} and prepare it again, or import its run again")
    splits = {name: np.array([row for row, (_, split) in enumerate(placed) if split == name], dtype=np.int64) for name in SPLITS}
    return DataVersion(
        version=info["data_version"],
        path=path,
        info=info,
        inputs=inputs,
        targets=targets,
        splits=splits,
        sample_ids=[sid for sid, _ in placed],
    )


def plan(data_cfg: Any, paths: dict[str, Path], workspace_state: Path) -> tuple[str, str, Optional[str]]:
    """What `run` would do, without decoding or writing a version: ("reuse" | "run", reason, version)."""
    former_dir = former_version(data_cfg, workspace_state / "data")
    if former_dir is not None:
        data_cfg = data_cfg.model_copy(update={"test_from": former_dir.name})
    source = load_source(data_cfg, paths)
    timings: dict[str, float] = {}
    table = _sample_table(data_cfg, source, paths, workspace_state / "cache", False, timings)
    fingerprint = _fingerprint(data_cfg, source, table)
    memo = workspace_state / "cache" / "prepared" / fingerprint
    remembered = memo.read_text().strip() if memo.exists() else None
    if remembered and (workspace_state / "data" / remembered / "version.json").exists():
        return "reuse", f"data version {remembered[:12]}: samples, labels and data config unchanged", remembered
    changed = int(timings.get("hash_cached_files", 0))
    return "run", (f"inputs changed since the last prepare ({len(table.ids)} samples, {len(table.ids) - changed} (re)hashed)"
                   if isinstance(source, FileListing) else f"no stored data version for these {len(table.ids)} samples and this data config"), None
