"""Prepare a data version: read the source, hash every sample, split, compute train-only statistics,
and store the result once under `.veritrain/data/<version>/`.

The version id is the SHA-256 of (sample ids, content hashes, labels, split assignment) and the
preprocessing config, so the same data prepared the same way anywhere gets the same id, and any
changed byte, label or split gives a new one. A stored version is never modified; later runs reuse it.

    veritrain run            # prepares (or reuses) the data version, then trains
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import numpy as np

from veritrain.data.sources import load_source
from veritrain.data.split import SPLITS, stratified_split
from veritrain.errors import RunFailed
from veritrain.hashing import sha256_json

log = logging.getLogger("veritrain")

FORMAT_VERSION = 1  # layout of a stored data version; part of the version id
HASH_ALGORITHM = "sha256"


@dataclass
class DataVersion:
    """A prepared data version as training reads it (arrays are memory-mapped, read-only)."""

    version: str
    path: Path
    info: dict[str, Any]  # the content of version.json
    inputs: np.ndarray
    targets: np.ndarray
    splits: dict[str, np.ndarray]  # split name → row indices into inputs/targets
    sample_ids: list[str]

    @property
    def classes(self) -> Optional[list[str]]:
        return self.info.get("classes")

    @property
    def counts(self) -> dict[str, int]:
        return {name: int(len(rows)) for name, rows in self.splits.items()}


def preprocessing_config(data_cfg: Any, source_preprocessing: dict[str, Any]) -> dict[str, Any]:
    """Everything besides the samples that decides the prepared arrays and the split."""
    cfg = data_cfg.model_dump(mode="json")
    cfg.pop("root", None)  # where the data lives is not what the data is
    return {"format": FORMAT_VERSION, "data": cfg, "source": source_preprocessing}


def run(data_cfg: Any, data_root: Optional[Path], store_dir: Path) -> DataVersion:
    """Stage entry: prepare (or reuse) the data version for `data_cfg`; returns it loaded."""
    started = time.perf_counter()
    source = load_source(data_cfg, data_root)
    n = len(source.sample_ids)
    if n == 0:
        raise RunFailed(f"data: source {data_cfg.source!r} has no samples; check data.root")
    strata = source.targets.tolist() if source.classes is not None else None
    split_names = stratified_split(strata, n, data_cfg.split_ratios, data_cfg.split_seed, source.classes)
    labels = source.label_names()
    preprocessing = preprocessing_config(data_cfg, source.preprocessing)

    version = sha256_json(
        {
            "preprocessing": preprocessing,
            "hash_algorithm": HASH_ALGORITHM,
            "samples": sorted(zip(source.sample_ids, source.content_hashes, labels, split_names)),
        }
    )
    target = store_dir / version
    if (target / "version.json").exists():
        log.info("data: reusing data version %s (%d samples)", version[:12], n)
        return load_version(target)

    log.info("data: preparing data version %s from %s (%d samples)", version[:12], data_cfg.source, n)
    tmp = store_dir / f".tmp-{uuid.uuid4().hex}"
    (tmp / "splits").mkdir(parents=True)
    try:
        _write_version(tmp, version, source, labels, split_names, preprocessing, time.perf_counter() - started)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "version.json").exists():  # not a lost race with a parallel prepare
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_version(target)


def _write_version(
    out: Path,
    version: str,
    source: Any,
    labels: list[str],
    split_names: list[str],
    preprocessing: dict[str, Any],
    seconds: float,
) -> None:
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sample_id", "size", HASH_ALGORITHM, "label", "split", "status"])
        for row in zip(source.sample_ids, source.sizes, source.content_hashes, labels, split_names):
            writer.writerow([*row, "ok"])
    for split in SPLITS:
        ids = [sid for sid, s in zip(source.sample_ids, split_names) if s == split]
        (out / "splits" / f"{split}.txt").write_text("".join(i + "\n" for i in ids), encoding="utf-8")
    np.save(out / "inputs.npy", np.ascontiguousarray(source.inputs))
    np.save(out / "targets.npy", np.ascontiguousarray(source.targets))

    split_array = np.asarray(split_names)
    train_inputs = source.inputs[split_array == "train"]
    counts = {s: int((split_array == s).sum()) for s in SPLITS}
    per_class = None
    if source.classes is not None:
        per_class = {
            s: {c: int(((split_array == s) & (source.targets == i)).sum()) for i, c in enumerate(source.classes)} for s in SPLITS
        }
    info = {
        "data_version": version,
        "format": FORMAT_VERSION,
        "hash_algorithm": HASH_ALGORITHM,
        "preprocessing": preprocessing,
        "classes": source.classes,
        "counts": counts,
        "counts_per_class": per_class,
        "input_shape": list(source.inputs.shape[1:]),
        "input_dtype": str(source.inputs.dtype),
        "target_dtype": str(source.targets.dtype),
        "normalization": normalization_stats(train_inputs),
        "origin": source.origin,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "prepare_seconds": round(seconds, 3),
    }
    (out / "version.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


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
        sample_ids = [row["sample_id"] for row in csv.DictReader(f)]
    row_of = {sid: i for i, sid in enumerate(sample_ids)}
    splits = {}
    for split in SPLITS:
        ids = (path / "splits" / f"{split}.txt").read_text(encoding="utf-8").split("\n")
        splits[split] = np.array([row_of[i] for i in ids if i], dtype=np.int64)
    return DataVersion(
        version=info["data_version"],
        path=path,
        info=info,
        inputs=np.load(path / "inputs.npy", mmap_mode="r"),
        targets=np.load(path / "targets.npy", mmap_mode="r"),
        splits=splits,
        sample_ids=sample_ids,
    )
