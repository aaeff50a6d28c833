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
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import numpy as np

from veritrain.core import locks
from veritrain.core.errors import RunFailed
from veritrain.core.hashing import DATA_HASH_ALGORITHM, sha256_json
from veritrain.core.memory import give_back
from veritrain.core.source_registry import TEXT_SOURCES
from veritrain.core.version import __version__
from veritrain.data import identity, text_prepare
from veritrain.data.grouping import (
    SPLIT_PRIORITY,
    apply_policy,
    assign_splits,
    check_balance,
    count_leakage_pairs,
    duplicates_and_units,
    former_version,
    label_issues_and_outliers,
    mark_former_splits,
    measure_achieved_split,
    test_from_outcome,
)
from veritrain.data.identity import (
    BOUND_FILES,
    BOUND_INFO,
    BOUND_INFO_SINCE,
    CARD_FILE,
    FIELDS_FOLDER,
    FIELDS_SINCE,
    FORMAT_VERSION,
    INPUT_FIELDS,
    SHARD_STORE,
    DataVersion,
    carried_test_from,
    check_version,
    content_hash,
    decoder_versions,
    earlier_recipe_hint,
    listing_sha256,
    load_version,
    preprocessing_config,
    recipe_of,
    stored_recipe,
    version_id,
    version_id_of_manifest,
)
from veritrain.data.shards import array_of
from veritrain.data.sources import FILES_OF, FileListing, load_source
from veritrain.data.split import SPLITS, Placement, Units
from veritrain.data.store import (
    ARRAY_CHUNK,
    MANIFEST_COLUMNS,
    made_from,
    merged_card,
    normalization_stats,
    picture_lookup,
    prepare_fingerprint,
    remember,
    seal_version,
    write_arrays,
    write_data_card,
    write_fields,
    write_version,
)
from veritrain.data.table import (
    IMAGE_EXTENSIONS,
    NEAR_DUPLICATE_MIN_SIDE,
    Finding,
    Table,
    array_target,
    check_labels,
    is_image_name,
    sample_table,
    validate_files,
)
from veritrain.data.validate import default_workers

if TYPE_CHECKING:
    from veritrain.core.config import DataConfig
    from veritrain.data.sources import Source

# The stage's entry points are `run`, `plan`, `version_now` and `raw_data_check`; the names of its parts (identity,
# table, grouping, store) that callers use are importable from here too
__all__ = [
    "ARRAY_CHUNK", "BOUND_FILES", "BOUND_INFO", "BOUND_INFO_SINCE", "CARD_FILE", "FORMAT_VERSION", "IGNORED_SHOWN", "IMAGE_EXTENSIONS",
    "MANIFEST_COLUMNS", "NEAR_DUPLICATE_MIN_SIDE", "SPLIT_PRIORITY", "DataVersion", "Finding", "RawCheck", "carried_test_from",
    "check_version", "content_hash", "decoder_versions", "earlier_recipe_hint", "former_version", "is_image_name", "listing_sha256",
    "load_source", "load_version", "merged_card", "normalization_stats", "plan", "preprocessing_config", "raw_data_check", "recipe_of",
    "run", "stored_recipe", "version_id", "version_id_of_manifest", "version_now",
]

log = logging.getLogger("veritrain")


IGNORED_SHOWN = 1000  # ignored file names kept in version.json and the report (the count is always whole)


def version_now(data_cfg: DataConfig, paths: dict[str, Path], scratch_state: Path, versions: Optional[Path] = None) -> str:
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
    grown: int = 0  # samples in the raw data now that the version does not hold (added since): growth, not a change
    basis: str = "(decoders unchanged): not re-decoded"  # what else was compared, so preparing again would give the same

    @property
    def unchanged(self) -> bool:
        return self.changed is None and self.undecided is None


def raw_data_check(data_cfg: DataConfig, paths: dict[str, Path], folder: Path, versions: Path) -> Optional[RawCheck]:
    """Whether the raw data is what the stored version in `folder` was prepared from, told from hashes alone: the
    source is listed as the version's recipe lists it, every sample's bytes are hashed (never a stat cache) and
    compared with the manifest's id, hash, label and key, the listing's groups, fixed splits, timestamps and findings
    with `listing_sha256` (recipe 5 on), and the decoders with those recorded. When all hold, preparing again would
    give the same version (preparing is a function of these), so nothing needs to be decoded. Nothing is written."""

    if data_cfg.source in TEXT_SOURCES:
        return _text_raw_check(data_cfg, paths, folder)
    info = json.loads((folder / "version.json").read_text(encoding="utf-8"))
    recipe = recipe_of(info) or 0
    former_dir = former_version(data_cfg, versions)
    if former_dir is not None:
        data_cfg = data_cfg.model_copy(update={"test_from": former_dir.name})
    source = load_source(data_cfg, paths)
    table = sample_table(data_cfg, source, paths, None, True, {}, recipe)
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
        elif row is None:  # added since: the version's own samples are what is compared
            found.grown += 1
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
    elif found.grown:  # the listing now covers the new samples too: its hash cannot be compared
        found.not_compared = (f"groups, fixed splits, timestamps and listing findings: the raw data holds {found.grown} sample(s) "
                              "added since the version was prepared")
    elif recipe >= BOUND_INFO_SINCE["listing_sha256"]:
        if info.get("listing_sha256") != listing_sha256(table, source):
            found.changed = "the listing's groups, fixed splits, timestamps or findings differ from those recorded (listing_sha256)"
    elif any(table.groups) or any(table.fixed) or any(table.timestamps) or getattr(source, "findings", None):
        found.not_compared = f"groups, fixed splits, timestamps and listing findings (data recipe {recipe} did not record them)"
    if found.changed is None and info.get("decoders") != identity.decoder_versions():
        recorded = info.get("decoders") or {}
        found.undecided = "decoders changed: " + ", ".join(f"{name} {recorded.get(name)} → {version}" for name, version in identity.decoder_versions().items()
                                                           if recorded.get(name) != version)
    return found


def _text_raw_check(data_cfg: DataConfig, paths: dict[str, Path], folder: Path) -> Optional[RawCheck]:
    """raw_data_check of a text data version: its raw files by their hashes (text_prepare.raw_files_check)."""

    files = text_prepare.raw_files_check(data_cfg, paths, folder)
    if files is None:
        return None
    return RawCheck(files.files, True, changed=files.changed, undecided=files.undecided, grown=files.grown, basis="(source settings and tokenizer library unchanged): not prepared again")


def run(data_cfg: DataConfig, paths: dict[str, Path], workspace_state: Path, rehash: bool = False, recorded: Optional[str] = None,
        id_only: bool = False, versions: Optional[Path] = None) -> DataVersion:
    """`_prepare`, one process at a time per data config and paths (`.veritrain/locks/prepare-<key>.lock`):
    concurrent runs of one config wait for the one that prepares, then reuse its version. `id_only` (verify,
    in a scratch folder) writes nothing to the workspace and takes no lock."""

    if data_cfg.source in TEXT_SOURCES:  # documents for a language model: the text data gate
        kept = _stored_by_an_earlier_recipe(workspace_state, recorded) if recorded is not None and not id_only else None
        if kept is not None:
            return kept
        if id_only:
            return text_prepare.prepare(data_cfg, paths, workspace_state, id_only=True)
        key = sha256_json({"data": data_cfg.model_dump(mode="json"), "paths": {k: str(v) for k, v in sorted(paths.items())}})[:32]
        with locks.held(workspace_state / "locks" / f"prepare-{key}.lock",
                        lambda by: log.info("data: waiting for %s, which prepares this data", by)):
            return text_prepare.prepare(data_cfg, paths, workspace_state)
    if id_only:
        return _prepare(data_cfg, paths, workspace_state, rehash, recorded, id_only, versions)
    key = sha256_json({"data": data_cfg.model_dump(mode="json"), "paths": {k: str(v) for k, v in sorted(paths.items())}})[:32]
    with locks.held(workspace_state / "locks" / f"prepare-{key}.lock",
                    lambda by: log.info("data: waiting for %s, which prepares this data", by)):
        return _prepare(data_cfg, paths, workspace_state, rehash, recorded, id_only, versions)


def _prepare(data_cfg: DataConfig, paths: dict[str, Path], workspace_state: Path, rehash: bool = False, recorded: Optional[str] = None,
             id_only: bool = False, versions: Optional[Path] = None) -> DataVersion:
    """Stage entry: prepare (or reuse) the data version for `data_cfg`; returns it loaded and checked.

    `paths` are the config's data paths made absolute; `workspace_state` is the workspace's
    `.veritrain/` (data versions in `data/`, hash and decode caches in `cache/`). `recorded` is the version
    a run already used (resume, reproduce, eval, export): when an earlier recipe prepared it and it is
    stored here, it is the one returned, since this recipe would prepare the same data to another id.
    `versions` is where data.test_from's version is looked up (default: `workspace_state/data`)."""
    kept = _stored_by_an_earlier_recipe(workspace_state, recorded) if recorded is not None else None
    if kept is not None:
        return kept
    files_memo = None if id_only else _files_memo(data_cfg, paths, workspace_state / "cache")
    if files_memo is not None and not rehash and (same_files := _version_of_files(files_memo, data_cfg, workspace_state)) is not None:
        return same_files
    scratch_root = workspace_state / "tmp"  # the checked samples' pictures and thumbnails, on disk while the stage runs
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"prepare-{os.getpid()}-", dir=scratch_root) as scratch:
        return _prepare_in(data_cfg, paths, workspace_state, rehash, id_only, versions, files_memo, Path(scratch))


def _prepare_in(data_cfg: DataConfig, paths: dict[str, Path], workspace_state: Path, rehash: bool, id_only: bool, versions: Optional[Path],
                files_memo: Optional[tuple[Path, dict[str, str]]], scratch: Path) -> DataVersion:
    """`_prepare` past the memos that name a stored version: the gate itself, its features kept in `scratch`."""
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

    table = sample_table(data_cfg, source, paths, cache_dir, rehash, timings, scratch=scratch)
    try:
        return _gate(data_cfg, paths, workspace_state, id_only, files_memo, source, table, timings, started, former_dir, workers)
    finally:
        table.close()


def _gate(data_cfg: DataConfig, paths: dict[str, Path], workspace_state: Path, id_only: bool, files_memo: Optional[tuple[Path, dict[str, str]]],
          source: Source, table: Table, timings: dict[str, float], started: float, former_dir: Optional[Path], workers: int) -> DataVersion:
    """The gate over the listed and hashed samples of `table`: reuse a version made from them, or check, split and
    write a new one."""
    cache_dir = workspace_state / "cache"
    classes = source.classes

    # Everything the version depends on is known now; a prepare of the same inputs that already
    # ran maps them to its version, so unchanged data skips decoding, deduplication and splitting.
    fingerprint = prepare_fingerprint(data_cfg, source, table)
    memo = cache_dir / "prepared" / fingerprint
    reused = _remembered_version(memo, data_cfg, source, table, workspace_state)
    if reused is not None:
        _remember_files(files_memo, reused.version, merged_card(data_cfg.card.model_dump(), getattr(source, "card", {})))
        return reused

    if isinstance(source, FileListing):
        target, headers = validate_files(data_cfg, table, cache_dir, workers, timings)
        give_back()
    else:
        target, headers = array_target(data_cfg, source, table, cache_dir, timings)
    origin = source.origin
    source_preprocessing = source.preprocessing

    t = time.perf_counter()
    table.keep_usable = data_cfg.on_bad_file == "warn"
    check_labels(table, classes)
    units, near_pairs = duplicates_and_units(data_cfg, table, classes)
    give_back()  # the near-duplicate search's temporaries, so the stages after it do not stack on them
    apply_policy(data_cfg, table)
    earlier = mark_former_splits(former_dir, table, units) if former_dir is not None else None
    assigned = assign_splits(data_cfg, table, units, classes)
    achieved = measure_achieved_split(data_cfg, table, units, assigned, classes)  # the split's own placement, before label quarantine
    if earlier is not None:
        achieved["test_from"] = test_from_outcome(data_cfg, earlier, table, units, assigned)
    timings["validate_split"] = time.perf_counter() - t
    t = time.perf_counter()
    label_method = label_issues_and_outliers(data_cfg, table, assigned, classes)
    give_back()
    timings["label_issues"] = time.perf_counter() - t
    leakage_pairs = count_leakage_pairs(table, assigned, near_pairs)
    if leakage_pairs:  # cannot happen by construction; refuse rather than train on a leaking split
        raise RunFailed(f"data: {leakage_pairs} duplicate pair(s) cross splits after splitting; this is a bug, please report it")
    check_balance(data_cfg, table, assigned, classes)

    preprocessing = preprocessing_config(data_cfg, source_preprocessing, target)
    if data_cfg.on_label_issue == "quarantine":  # the method then decides which samples train: part of the id
        preprocessing["label_issues"] = label_method

    def samples() -> Iterator[tuple[str, Optional[str], str, str]]:  # each sample's (id, content hash, label, split), made as read
        return ((table.ids[i], table.hashes[i], table.labels[i] or "", assigned[i] if i in assigned else "quarantined") for i in range(len(table.ids)))

    store = workspace_state / "data"
    store.mkdir(parents=True, exist_ok=True)
    card = merged_card(data_cfg.card.model_dump(), getattr(source, "card", {}))

    log.info("data: writing a data version from %s (%d samples)", data_cfg.source, len(table.ids))
    rows = [i for i in range(len(table.ids)) if i in assigned]  # the placed samples in id order: a version's rows
    if not rows:
        raise RunFailed("data: no usable samples; see the findings in the data report")
    tmp = store / f".tmp-{uuid.uuid4().hex}"
    (tmp / "splits").mkdir(parents=True)
    try:
        t = time.perf_counter()
        inputs, info = _write_data(tmp, workspace_state / SHARD_STORE, rows, assigned, table, source, data_cfg, target, classes, workers,
                                   (preprocessing, origin, units))
        timings["decode"] = time.perf_counter() - t  # with the manifest and split lists
        info["achieved_split"] = achieved
        if identity.FORMAT_VERSION >= BOUND_INFO_SINCE["listing_sha256"]:
            info["listing_sha256"] = listing_sha256(table, source)
        info["ignored"] = {"count": len(table.ignored), "files": table.ignored[:IGNORED_SHOWN]}  # not bound: no sample
        version = identity.id_of(info, samples())
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
                         picture_lookup(inputs, table, rows))
            seal_version(tmp, info, card)
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "version.json").exists():  # not a lost race with a parallel prepare
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_data_card(final, card)
    loaded = load_version(final)
    remember(memo, version)
    _remember_files(files_memo, version, card)
    _refuse_skew(data_cfg, loaded)
    if former_dir is None:  # without data.test_from: say when a test split moved
        _moved_out_of_test(store, version, preprocessing, samples())
    return loaded


def _write_data(out: Path, shard_store: Path, rows: list[int], assigned: Placement, table: Table, source: Source, data_cfg: DataConfig,
                target: dict[str, Any], classes: Optional[list[str]], workers: int,
                described: tuple[dict[str, Any], dict[str, Any], Units]) -> tuple[Any, dict[str, Any]]:
    """The placed rows' data as this recipe writes it, fields in shards (recipe 7 on) or the arrays inputs.npy and
    targets.npy, and the manifest and split lists beside it (`write_version`, given the preprocessing, origin and
    units `described`); returns the inputs as written, for reading back, and version.json's content so far."""
    if identity.FORMAT_VERSION < FIELDS_SINCE:  # an earlier recipe, as a test standing in for one sets it
        inputs, targets = write_arrays(out, rows, table, source, data_cfg, target, classes, workers)
        return inputs, write_version(out, data_cfg, table, classes, assigned, rows, *described, inputs, targets)
    train = assigned.codes(np.asarray(rows, dtype=np.int64)) == SPLITS.index("train")
    fields, histogram = write_fields(out, shard_store, rows, table, source, data_cfg, target, classes, workers, train)
    folder = out / FIELDS_FOLDER
    inputs = array_of(fields[next(name for name in INPUT_FIELDS if name in fields)], folder, 0)  # read back as rows are asked for
    info = write_version(out, data_cfg, table, classes, assigned, rows, *described, inputs, array_of(fields["label"], folder, 1 << 62, eager=True),
                         histogram.stats() if histogram is not None else None)
    info["fields"] = {name: spec.as_dict() for name, spec in fields.items()}
    return inputs, info


def _stored_by_an_earlier_recipe(workspace_state: Path, recorded: str) -> Optional[DataVersion]:
    """The stored version a run used, when an earlier data recipe prepared it (this recipe would give another id)."""
    stored = workspace_state / "data" / recorded
    recipe = stored_recipe(stored)
    try:  # a text version has recipes of its own
        current = identity.TEXT_RECIPE if json.loads((stored / "version.json").read_text(encoding="utf-8")).get("kind") == "text" \
            else identity.FORMAT_VERSION
    except (OSError, ValueError, AttributeError):
        return None
    if recipe is None or recipe >= current:
        return None
    log.info("data: using the stored data version %s, prepared by data recipe %d (this veritrain prepares with recipe %d)",
             recorded[:12], recipe, current)
    loaded = load_version(stored)
    loaded.reused = True
    return loaded


def _moved_out_of_test(store: Path, version: str, preprocessing: dict[str, Any], samples: Iterable[tuple[str, Any, str, str]]) -> Optional[str]:
    """One line, logged and returned, when samples that the newest earlier version of the same data config had in test
    are in train or val now (matched by the hash of their bytes; new samples, or a new near-copy of one, can move them),
    with the fix; None otherwise. Without data.test_from a test split is only as stable as the data: this says when it moved."""
    earlier = []
    for folder in store.iterdir() if store.is_dir() else []:
        if folder.name == version or folder.name.startswith(".") or not (folder / "version.json").is_file():
            continue
        try:
            info = json.loads((folder / "version.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and (info.get("preprocessing") or {}).get("data") == preprocessing.get("data"):
            earlier.append(((folder / "version.json").stat().st_mtime_ns, folder))
    if not earlier:
        return None
    previous = max(earlier)[1]
    try:
        with open(previous / "manifest.csv", newline="", encoding="utf-8") as f:
            tested = {row[DATA_HASH_ALGORITHM] for row in csv.DictReader(f) if row.get("split") == "test" and row.get(DATA_HASH_ALGORITHM)}
    except (OSError, KeyError, csv.Error):
        return None
    moved = sorted({sid for sid, digest, _, split in samples if digest in tested and split in ("train", "val")})
    if not moved:
        return None
    said = (f"{len(moved)} sample(s) that data version {previous.name[:12]} of this data config had in test are in train or val now "
            f"(first: {moved[0]}; new samples, or a new near-copy of one, moved them): a model trained on this version has seen "
            f"them; to keep that test split, set data.test_from: {previous.name[:12]}")
    log.warning("data: %s", said)
    return said


def _remembered_version(memo: Path, data_cfg: DataConfig, source: Source, table: Table, workspace_state: Path) -> Optional[DataVersion]:
    """The stored version the memo names for these inputs, when it was made from them (see `made_from`), loaded
    and marked reused; None when there is none, so the data is prepared."""
    remembered = memo.read_text().strip() if memo.exists() else None
    if remembered and (workspace_state / "data" / remembered / "version.json").exists():
        final = workspace_state / "data" / remembered
        loaded = load_version(final)
        if made_from(loaded, data_cfg, source, table):
            log.info("data: reusing data version %s (%d samples, unchanged)", remembered[:12], len(table.ids))
            write_data_card(final, merged_card(data_cfg.card.model_dump(), getattr(source, "card", {})))
            loaded.reused = True
            _refuse_skew(data_cfg, loaded)
            return loaded
        log.warning("data: the cache named version %s for these inputs, but it was made from others; preparing anew", remembered[:12])
    return None

def _files_memo(data_cfg: DataConfig, paths: dict[str, Path], cache_dir: Path) -> Optional[tuple[Path, dict[str, str]]]:
    """For a source whose samples are made from a fixed set of files (sources.FILES_OF: cifar10), the memo naming the
    version this config prepared from those files' bytes, and their SHA-256s. None for any other source, and with
    data.test_from or data.test_split_file, whose inputs are elsewhere."""
    files_of = FILES_OF.get(data_cfg.source)
    if files_of is None or data_cfg.test_from is not None or data_cfg.test_split_file is not None:
        return None
    files = files_of(data_cfg, paths)
    if files is None:
        return None
    key = sha256_json({"data": data_cfg.model_dump(mode="json", exclude={"workers"}), "files": files,
                       "versions": {"veritrain": __version__, **decoder_versions()}})
    return cache_dir / "prepared" / f"files-{key}", files


def _version_of_files(files_memo: tuple[Path, dict[str, str]], data_cfg: DataConfig, workspace_state: Path) -> Optional[DataVersion]:
    """The stored version the memo names, when its origin's files are these bytes: a prepare of this config from them
    (deterministic) would make it again, so it is reused without parsing, listing or hashing the samples. What train
    and run gain is the time to read the source; verify never comes here (it prepares from the raw data)."""
    memo, files = files_memo
    try:
        remembered = json.loads(memo.read_text(encoding="utf-8")) if memo.exists() else None
    except (OSError, ValueError):
        return None
    if not isinstance(remembered, dict) or not isinstance(version := remembered.get("version"), str) or not version.isalnum():
        return None
    final = workspace_state / "data" / version
    if not (final / "version.json").exists():
        return None
    loaded = load_version(final)
    if (loaded.info.get("origin") or {}).get("files_sha256") != files:
        return None
    log.info("data: reusing data version %s (the source's files unchanged)", version[:12])
    card = remembered.get("card")
    write_data_card(final, card if isinstance(card, dict) else merged_card(data_cfg.card.model_dump(), {}))
    loaded.reused = True
    _refuse_skew(data_cfg, loaded)
    return loaded


def _remember_files(files_memo: Optional[tuple[Path, dict[str, str]]], version: str, card: dict[str, Any]) -> None:
    if files_memo is not None:
        memo, _ = files_memo
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps({"version": version, "card": card}), encoding="utf-8")
        os.replace(tmp, memo)


def _refuse_skew(data_cfg: DataConfig, data: DataVersion) -> None:
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


def _default_workers() -> int:
    return default_workers()


def plan(data_cfg: DataConfig, paths: dict[str, Path], workspace_state: Path) -> tuple[str, str, Optional[str]]:
    """What `run` would do, without decoding or writing a version: ("reuse" | "run", reason, version)."""
    former_dir = former_version(data_cfg, workspace_state / "data")
    if former_dir is not None:
        data_cfg = data_cfg.model_copy(update={"test_from": former_dir.name})
    source = load_source(data_cfg, paths)
    timings: dict[str, float] = {}
    table = sample_table(data_cfg, source, paths, workspace_state / "cache", False, timings)
    fingerprint = prepare_fingerprint(data_cfg, source, table)
    memo = workspace_state / "cache" / "prepared" / fingerprint
    remembered = memo.read_text().strip() if memo.exists() else None
    if remembered and (workspace_state / "data" / remembered / "version.json").exists():
        return "reuse", f"data version {remembered[:12]}: samples, labels and data config unchanged", remembered
    changed = int(timings.get("hash_cached_files", 0))
    return "run", (f"inputs changed since the last prepare ({len(table.ids)} samples, {len(table.ids) - changed} (re)hashed)"
                   if isinstance(source, FileListing) else f"no stored data version for these {len(table.ids)} samples and this data config"), None
