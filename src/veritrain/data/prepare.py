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

from veritrain.data import split as splitting
from veritrain.data.sources import FileListing, SourceData, load_source
from veritrain.data.split import SPLITS
from veritrain.data.validate import FINDING_SEVERITY, UNUSABLE
from veritrain.errors import RunFailed, UserError
from veritrain.hashing import DATA_HASH_ALGORITHM, sha256_file, sha256_json
from veritrain.secrets import expand_env

log = logging.getLogger("veritrain")

FORMAT_VERSION = 2  # layout of a stored data version; part of the version id
NEAR_DUPLICATE_MIN_SIDE = 16  # px: below this a perceptual hash says little (digits are 8×8)


@dataclass
class Finding:
    kind: str  # one of validate.FINDING_SEVERITY (the names are the contract)
    samples: list[str]  # sample ids concerned
    reason: str
    severity: str = ""

    def __post_init__(self) -> None:
        self.severity = self.severity or FINDING_SEVERITY.get(self.kind, "warning")

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "samples": self.samples, "reason": self.reason}


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
        card_file = self.path / "card.json"
        if card_file.exists():
            report["card"] = json.loads(card_file.read_text(encoding="utf-8"))
            report["card_warnings"] = card_warnings(report["card"])
        return report


@dataclass
class _Table:
    """Every sample of the source, in sample-id order, as the stage works on it."""

    ids: list[str]
    paths: list[Optional[Path]]
    sizes: list[int]
    hashes: list[Optional[str]]
    labels: list[Optional[str]]
    groups: list[Optional[str]]
    fixed: list[Optional[str]]
    timestamps: list[Optional[str]]
    keep_usable: bool = False  # data.on_bad_file: warn — only samples that cannot be used are excluded
    findings: list[Finding] = field(default_factory=list)
    excluded: dict[int, Finding] = field(default_factory=dict)  # sample index → the finding that removed it
    phash: dict[int, int] = field(default_factory=dict)
    arrays: dict[int, np.ndarray] = field(default_factory=dict)  # decoded images kept from validation

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


def version_id(preprocessing: dict[str, Any], hash_algorithm: str, samples: Any) -> str:
    """The data version id: SHA-256 over the preprocessing config, the hash algorithm and every
    (sample id, content hash or None, label, split or "quarantined"), sorted by sample id."""
    return sha256_json({"preprocessing": preprocessing, "hash_algorithm": hash_algorithm, "samples": sorted(tuple(s) for s in samples)})


def version_id_of_manifest(info: dict[str, Any], rows: list[dict[str, str]]) -> str:
    """`version_id` recomputed from a stored version.json and its manifest.csv rows (verify, import)."""
    key = info["hash_algorithm"]
    return version_id(info["preprocessing"], key, (
        (r["sample_id"], r[key] or None, r["label"], r["split"] if r["status"] == "ok" else "quarantined") for r in rows))


def preprocessing_config(data_cfg: Any, source_preprocessing: dict[str, Any], target: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Everything besides the samples that decides the prepared arrays and the split: the data config
    without file locations, the data card or worker count, plus what the source and decoder did."""
    cfg = data_cfg.model_dump(mode="json")
    for key in ("root", "csv", "labels", "split_dir", "test_split_file", "card", "workers"):
        cfg.pop(key, None)
    return {"format": FORMAT_VERSION, "data": cfg, "source": source_preprocessing, "target": target}


def run(data_cfg: Any, paths: dict[str, Path], workspace_state: Path, rehash: bool = False) -> DataVersion:
    """Stage entry: prepare (or reuse) the data version for `data_cfg`; returns it loaded.

    `paths` are the config's data paths made absolute; `workspace_state` is the workspace's
    `.veritrain/` (data versions in `data/`, hash and decode caches in `cache/`).
    """
    timings: dict[str, float] = {}
    started = time.perf_counter()
    source = load_source(data_cfg, paths)
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
        _write_card(final, merged_card(data_cfg.card.model_dump(), getattr(source, "card", {})))
        log.info("data: reusing data version %s (%d samples, unchanged)", remembered[:12], len(table.ids))
        loaded = load_version(final)
        loaded.reused = True
        return loaded

    if isinstance(source, FileListing):
        target, headers = _validate_files(data_cfg, table, cache_dir, workers, timings)
    else:
        target, headers = _array_target(data_cfg, source, table, cache_dir, timings)
    origin = source.origin
    source_preprocessing = source.preprocessing

    t = time.perf_counter()
    table.keep_usable = data_cfg.on_bad_file == "warn"
    _check_labels(table, classes)
    units = _duplicates_and_units(data_cfg, table, classes, target)
    _apply_policy(data_cfg, table)
    assigned = _split(data_cfg, table, units, classes)
    leakage_pairs = _leakage_pairs(table, assigned)
    if leakage_pairs:  # cannot happen by construction; refuse rather than train on a leaking split
        raise RunFailed(f"data: {leakage_pairs} duplicate pair(s) cross splits after splitting; this is a bug, please report it")
    _check_balance(data_cfg, table, assigned, classes)
    timings["validate_split"] = time.perf_counter() - t

    preprocessing = preprocessing_config(data_cfg, source_preprocessing, target)
    split_of = [assigned.get(i, "quarantined") for i in range(len(table.ids))]
    version = version_id(preprocessing, DATA_HASH_ALGORITHM, zip(table.ids, table.hashes, [l or "" for l in table.labels], split_of))
    store = workspace_state / "data"
    store.mkdir(parents=True, exist_ok=True)
    final = store / version
    card = merged_card(data_cfg.card.model_dump(), getattr(source, "card", {}))
    _write_card(final, card)
    if (final / "version.json").exists():
        _remember(memo, version)
        log.info("data: reusing data version %s (%d samples)", version[:12], len(table.ids))
        loaded = load_version(final)
        loaded.reused = True
        return loaded

    log.info("data: writing data version %s from %s (%d samples)", version[:12], data_cfg.source, len(table.ids))
    t = time.perf_counter()
    rows = [i for i in range(len(table.ids)) if i in assigned]
    inputs = _inputs_for(rows, table, source, data_cfg, target, cache_dir, workers)
    timings["decode"] = time.perf_counter() - t
    tmp = store / f".tmp-{uuid.uuid4().hex}"
    (tmp / "splits").mkdir(parents=True)
    try:
        _write_version(tmp, version, data_cfg, table, classes, assigned, rows, inputs, preprocessing, origin, headers, leakage_pairs, timings, started, card)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "version.json").exists():  # not a lost race with a parallel prepare
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _write_card(final, card)
    _remember(memo, version)
    return load_version(final)


def _default_workers() -> int:
    from veritrain.data.validate import default_workers

    return default_workers()


# ---------------------------------------------------------------- building the sample table


def _sample_table(cfg: Any, source: Any, paths: dict[str, Path], cache_dir: Path, rehash: bool, timings: dict[str, float]) -> _Table:
    """Every sample of the source with its content hash, and the fixed test split of data.test_split_file."""
    table = _list_files(cfg, source, cache_dir, rehash, timings) if isinstance(source, FileListing) else _table_from_arrays(source)
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
        labels=source.label_names(),
        groups=[None] * n,
        fixed=list(source.fixed_split) if source.fixed_split else [None] * n,
        timestamps=[None] * n,
    )
    for i in range(n):
        table.arrays[i] = source.inputs[i]
    return table


def _array_target(cfg: Any, source: SourceData, table: _Table, cache_dir: Path, timings: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    shape = list(source.inputs.shape[1:])
    if _near_duplicates_on(cfg, shape) and source.inputs.dtype == np.uint8 and source.inputs.ndim == 4:
        t = time.perf_counter()
        table.phash.update(_array_phashes(source.inputs, source.content_hashes, cache_dir))
        timings["perceptual_hash"] = time.perf_counter() - t
    return {"shape": shape, "dtype": str(source.inputs.dtype)}, {"shape": {"×".join(map(str, shape)): len(table.ids)}}


def _fingerprint(cfg: Any, source: Any, table: _Table) -> str:
    """Hash of every input of the stage: data config (minus locations and card), the source's
    preprocessing, each sample's id, content hash, label, group, fixed split and timestamp, the
    listing's findings, and the versions of veritrain and the decoders."""
    import PIL

    from veritrain import __version__

    return sha256_json({
        "config": preprocessing_config(cfg, source.preprocessing),
        "samples": list(zip(table.ids, table.hashes, table.labels, table.groups, table.fixed, table.timestamps)),
        "findings": [f.as_dict() for f in table.findings],
        "versions": {"veritrain": __version__, "pillow": PIL.__version__, "numpy": np.__version__},
    })


def _remember(memo: Path, version: str) -> None:
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{uuid.uuid4().hex}")
    tmp.write_text(version + "\n")
    os.replace(tmp, memo)


def _array_phashes(inputs: np.ndarray, hashes: list[str], cache_dir: Path) -> dict[int, int]:
    """Perceptual hashes of array samples, cached by content hash."""
    from veritrain.data.dedup import perceptual_hash
    from veritrain.data.validate import Check, CheckCache, CheckParams

    params = CheckParams(0, 0, 0, False, 0, True)  # arrays: only the hash matters
    cache = CheckCache(cache_dir / "images.sqlite")
    try:
        known = cache.checks(sorted(set(hashes)), params)
        fresh: dict[str, Check] = {}
        result = {}
        for i, h in enumerate(hashes):
            if h in known:
                result[i] = known[h].phash
            else:
                if h not in fresh:
                    fresh[h] = Check(phash=perceptual_hash(np.asarray(inputs[i])))
                result[i] = fresh[h].phash
        cache.store_checks(fresh, params)
    finally:
        cache.close()
    return result


def _near_duplicates_on(cfg: Any, shape: list[int]) -> bool:
    if cfg.near_duplicates == "auto":
        return len(shape) >= 2 and min(shape[0], shape[1]) >= NEAR_DUPLICATE_MIN_SIDE
    return cfg.near_duplicates == "on"


def _list_files(cfg: Any, source: FileListing, cache_dir: Path, rehash: bool, timings: dict[str, float]) -> _Table:
    """The sample table of a file source with every file hashed (stat cache first)."""
    from veritrain.hashing import StatCache, hash_files

    samples = sorted(source.samples, key=lambda s: s.sample_id)
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
    )
    index_of = {sid: i for i, sid in enumerate(table.ids)}
    for kind, ids, reason in source.findings:
        if kind == "unreadable":  # listed (e.g. in a label map) but not on disk: nothing to quarantine
            table.findings.append(Finding(kind, ids, reason))
        else:
            table.add(kind, [index_of[i] for i in ids if i in index_of], reason)

    t = time.perf_counter()
    stat_cache = StatCache(cache_dir / "files.sqlite")
    try:
        hashed = hash_files([s.path for s in samples], stat_cache, rehash=rehash)
    finally:
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
        files.setdefault(table.hashes[i], str(table.paths[i]))
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
        checks = validate.checks_for(files, headers, params, check_cache, workers, keep_arrays=True)
    finally:
        check_cache.close()
    timings["validate"] = time.perf_counter() - t
    for i in table.included():
        check = checks[table.hashes[i]]
        for kind, reason in check.findings:
            table.add(kind, [i], reason, exclude=kind in UNUSABLE)
        if check.phash is not None and check.usable:
            table.phash[i] = check.phash
        if check.array is not None:
            table.arrays[i] = check.array
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


def _duplicates_and_units(cfg: Any, table: _Table, classes: Optional[list[str]], target: dict[str, Any]) -> list[splitting.Unit]:
    from veritrain.data.dedup import exact_duplicate_groups, near_duplicate_clusters

    included = table.included()
    # exact duplicates: same content, same label → kept together; different labels → all quarantined
    links: list[list[int]] = []
    for group in exact_duplicate_groups([table.hashes[i] for i in included]):
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

    # near duplicates by perceptual hash, through a BK-tree index
    candidates = [i for i in table.included() if i in table.phash]
    if candidates:
        clusters, capped = near_duplicate_clusters([table.phash[i] for i in candidates], cfg.near_duplicate_distance, cfg.max_cluster_size)
        capped_sets = {tuple(c.members) for c in capped}
        for cluster in clusters:
            members = [candidates[k] for k in cluster.members]
            if len({table.hashes[i] for i in members}) == 1:
                continue  # all copies of one content: already a `duplicate`
            links.append(members)
            table.add("near_duplicate", members, f"{len(members)} images within perceptual-hash distance {cluster.max_distance}; kept together in one split")
            if tuple(cluster.members) in capped_sets:
                table.add("near_duplicate_cluster_capped", members,
                          f"a cluster of {len(members)} near-duplicates (more than data.max_cluster_size {cfg.max_cluster_size}); check the data or lower data.near_duplicate_distance")

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
    links.extend(members for members in by_group.values() if len(members) > 1)

    from veritrain.data.dedup import UnionFind

    uf = UnionFind(len(table.ids))
    for members in links:
        for other in members[1:]:
            uf.union(members[0], other)

    # a unit whose members have different fixed splits would leak: the most protected split wins and
    # the copies fixed elsewhere are quarantined as `leak_duplicate`
    components: dict[int, list[int]] = defaultdict(list)
    for i in table.included():
        components[uf.find(i)].append(i)
    class_index = {c: k for k, c in enumerate(classes)} if classes else {}
    units = []
    for members in components.values():
        fixed = {table.fixed[i] for i in members if table.fixed[i]}
        winner = min(fixed, key=SPLIT_PRIORITY.__getitem__) if fixed else None
        if len(fixed) > 1:
            keepers = [i for i in members if table.fixed[i] in (winner, None)]
            for i in members:
                if table.fixed[i] not in (winner, None):
                    table.add("leak_duplicate", [i],
                              f"a copy (or group member) of {table.ids[keepers[0]]} in the fixed {winner} split, fixed to {table.fixed[i]}; quarantined so nothing leaks",
                              exclude=True)
            members = keepers
        timestamps = [table.timestamps[i] for i in members if table.timestamps[i]]
        units.append(splitting.Unit(
            members=sorted(members),
            labels=[class_index.get(table.labels[i]) if classes else None for i in members],
            fixed=winner,
            timestamp=max(timestamps) if timestamps else None,
        ))
    units.sort(key=lambda u: u.members[0])
    return units


def _split(cfg: Any, table: _Table, units: list[splitting.Unit], classes: Optional[list[str]]) -> dict[int, str]:
    splits = splitting.assign(units, cfg.split_ratios, cfg.split_seed, by_time=cfg.split_by == "time", class_names=classes)
    return {i: s for unit, s in zip(units, splits) for i in unit.members if i not in table.excluded}


def _leakage_pairs(table: _Table, assigned: dict[int, str]) -> int:
    """Pairs of identical (or near-identical, as linked above) samples in different splits."""
    by_hash: dict[str, Counter] = defaultdict(Counter)
    for i, s in assigned.items():
        by_hash[table.hashes[i]][s] += 1
    pairs = 0
    for counts in by_hash.values():
        values = list(counts.values())
        pairs += sum(a * b for k, a in enumerate(values) for b in values[k + 1 :])
    index = {sid: k for k, sid in enumerate(table.ids)}
    for finding in table.findings:
        if finding.kind == "near_duplicate":
            in_splits = Counter(assigned[index[sid]] for sid in finding.samples if index[sid] in assigned)
            values = list(in_splits.values())
            pairs += sum(a * b for k, a in enumerate(values) for b in values[k + 1 :])
    return pairs


def _check_balance(cfg: Any, table: _Table, assigned: dict[int, str], classes: Optional[list[str]]) -> None:
    if not classes:
        return
    counts = Counter(table.labels[i] for i in assigned)
    empty = [c for c in classes if counts[c] == 0]
    if empty:
        raise RunFailed(f"data: class(es) {', '.join(map(repr, empty))} have no usable samples (too_small); add samples, fix the quarantined ones, or drop them from data.classes")
    largest, smallest = max(counts.values()), min(counts.values())
    if smallest and largest / smallest > cfg.imbalance_ratio:
        big = max(classes, key=lambda c: counts[c])
        small = min(classes, key=lambda c: counts[c])
        table.add("imbalance", [], f"class {big!r} has {largest} samples, {small!r} has {smallest} (ratio {largest / smallest:.1f} > data.imbalance_ratio {cfg.imbalance_ratio:g})")


def _apply_policy(cfg: Any, table: _Table) -> None:
    """data.on_bad_file: fail stops here, listing what would have been quarantined."""
    bad = [f for f in table.findings if f.severity == "quarantine"]
    if cfg.on_bad_file == "fail" and bad:
        listed = "; ".join(f"{', '.join(f.samples[:3])}: {f.kind}" for f in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise RunFailed(f"data: {len(bad)} bad sample finding(s) with data.on_bad_file: fail: {listed}{more}; fix or remove them, or use on_bad_file: quarantine")


# ---------------------------------------------------------------- writing and reading a version


def _inputs_for(rows: list[int], table: _Table, source: Any, cfg: Any, target: dict[str, Any], cache_dir: Path, workers: int) -> np.ndarray:
    missing = [i for i in rows if i not in table.arrays]
    if missing:  # the checks came from the cache: decode these files now
        from veritrain.data import validate

        h, w, c = target["shape"]
        params = validate.CheckParams(h, w, c, cfg.convert, cfg.max_pixels, perceptual_hash=False)  # only the pixels are wanted now
        files = {table.hashes[i]: str(table.paths[i]) for i in missing}
        headers = validate.headers_for(files, None, workers)
        checks = validate.checks_for(files, headers, params, None, workers, keep_arrays=True)
        for i in missing:
            array = checks[table.hashes[i]].array
            if array is None:
                raise RunFailed(f"data: {table.ids[i]} changed while preparing (no longer decodes); run again")
            table.arrays[i] = array
    if not rows:
        raise RunFailed("data: no usable samples; see the findings in the data report")
    return np.stack([np.asarray(table.arrays[i]) for i in rows])


def _write_version(out: Path, version: str, cfg: Any, table: _Table, classes: Optional[list[str]], assigned: dict[int, str],
                   rows: list[int], inputs: np.ndarray, preprocessing: dict[str, Any], origin: dict[str, Any],
                   image_summary: dict[str, Any], leakage_pairs: int, timings: dict[str, float], started: float,
                   card: dict[str, Any]) -> None:
    from veritrain.data import report

    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sample_id", "size", DATA_HASH_ALGORITHM, "label", "split", "status"])
        for i, sid in enumerate(table.ids):
            status = "ok" if i in assigned else "quarantined"
            writer.writerow([sid, table.sizes[i], table.hashes[i] or "", table.labels[i] or "", assigned.get(i, ""), status])
    quarantined = [(i, finding) for i, finding in sorted(table.excluded.items())]
    with open(out / "quarantine.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sample_id", "kind", "reason"])
        for i, finding in quarantined:
            writer.writerow([table.ids[i], finding.kind, finding.reason])
    for name in SPLITS:
        ids = [table.ids[i] for i in rows if assigned[i] == name]
        (out / "splits" / f"{name}.txt").write_text("".join(i + "\n" for i in ids), encoding="utf-8")
    np.save(out / "inputs.npy", np.ascontiguousarray(inputs))
    if classes is not None:
        class_index = {c: k for k, c in enumerate(classes)}
        targets = np.array([class_index[table.labels[i]] for i in rows], dtype=np.int64)
    else:
        targets = np.array([float(table.labels[i]) for i in rows], dtype=np.float32)
    np.save(out / "targets.npy", targets)

    row_splits = np.array([assigned[i] for i in rows])
    counts = {s: int((row_splits == s).sum()) for s in SPLITS}
    per_class = None
    if classes is not None:
        per_class = {s: {c: int(((row_splits == s) & (targets == k)).sum()) for k, c in enumerate(classes)} for s in SPLITS}
    import PIL

    info = {
        "data_version": version,
        "format": FORMAT_VERSION,
        "hash_algorithm": DATA_HASH_ALGORITHM,
        "preprocessing": preprocessing,
        "classes": classes,
        "counts": counts,
        "counts_per_class": per_class,
        "quarantined": len(quarantined),
        "input_shape": list(inputs.shape[1:]),
        "input_dtype": str(inputs.dtype),
        "target_dtype": str(targets.dtype),
        "normalization": normalization_stats(inputs[row_splits == "train"]),
        "origin": origin,
        "decoders": {"pillow": PIL.__version__, "numpy": np.__version__},
        # the arrays training reads; `veritrain verify` checks them against these
        "arrays_sha256": {name: sha256_file(out / name) for name in ("inputs.npy", "targets.npy")},
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (out / "version.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    timings["total"] = time.perf_counter() - started
    report.write(out, info, [f.as_dict() for f in table.findings],
                 [{"sample_id": table.ids[i], "path": str(table.paths[i]) if table.paths[i] else None, "kind": f.kind, "reason": f.reason}
                  for i, f in quarantined],
                 image_summary, leakage_pairs, {k: round(v, 4) for k, v in timings.items()}, card)


def merged_card(config_card: dict[str, Any], source_card: dict[str, Any]) -> dict[str, Any]:
    """data.card, with what the source knows of itself (digits, CIFAR-10) filling the keys left empty;
    URL credentials and the like are redacted (the card is free text)."""
    from veritrain.secrets import redact

    return redact({key: value if value else source_card.get(key) for key, value in config_card.items()})


def _write_card(version_dir: Path, card: dict[str, Any]) -> None:
    """The data card sits beside the version (not inside its hash): editing it keeps the version."""
    if version_dir.exists():
        (version_dir / "card.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")


def normalization_stats(train_inputs: np.ndarray) -> dict[str, Any]:
    """Per-channel (last axis) mean and std of the train split only; uint8 inputs are scaled to [0, 1] first."""
    values = train_inputs.astype(np.float64)
    if train_inputs.dtype == np.uint8:
        values /= 255.0
    channels = values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values.reshape(-1, 1)
    return {
        "scale": "x / 255" if train_inputs.dtype == np.uint8 else "x",
        "mean": channels.mean(axis=0).tolist(),
        "std": channels.std(axis=0).tolist(),
        "computed_on": "train",
    }


def load_version(path: Path) -> DataVersion:
    info = json.loads((path / "version.json").read_text(encoding="utf-8"))
    with open(path / "manifest.csv", newline="", encoding="utf-8") as f:
        sample_ids = [row["sample_id"] for row in csv.DictReader(f) if row["status"] == "ok"]
    row_of = {sid: i for i, sid in enumerate(sample_ids)}
    splits = {}
    for name in SPLITS:
        ids = (path / "splits" / f"{name}.txt").read_text(encoding="utf-8").split("\n")
        splits[name] = np.array([row_of[i] for i in ids if i], dtype=np.int64)
    return DataVersion(
        version=info["data_version"],
        path=path,
        info=info,
        inputs=np.load(path / "inputs.npy", mmap_mode="r"),
        targets=np.load(path / "targets.npy", mmap_mode="r"),
        splits=splits,
        sample_ids=sample_ids,
    )


def plan(data_cfg: Any, paths: dict[str, Path], workspace_state: Path) -> tuple[str, str, Optional[str]]:
    """What `run` would do, without decoding or writing a version: ("reuse" | "run", reason, version)."""
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
