"""Data versions whose inputs and labels are fields in shards (data recipe 7): versions share the shards they have in
common, readers check every block they read, verify hashes every block, and gc keeps what a kept version holds."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from realdata import mnist_arrays, png_bytes, write_mnist_imagefolder
from veritrain.core.config import load_config
from veritrain.core.hashing import sha256_file
from veritrain.data import identity, prepare, store
from veritrain.data.shards import FieldArray, ShardError

SHARD_ROWS = 8  # 28×28 grey images a shard in these tests (8 MiB a shard by default)


def prepare_folder(root: Path, workdir: Path, *overrides: str):
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "data.yaml"
    config.write_text(f"data:\n  source: imagefolder\n  root: {root}\n", encoding="utf-8")
    resolved = load_config(config, list(overrides))
    return prepare.run(resolved.config.data, resolved.data_paths, workdir / ".veritrain")


def shard_ids(version) -> dict[str, list[str]]:
    return {name: [entry["id"] for entry in spec["shards"]] for name, spec in version.info["fields"].items()}


def splits_of(version) -> dict[str, str]:
    with open(version.path / "manifest.csv", newline="", encoding="utf-8") as f:
        return {row["sample_id"]: row["split"] for row in csv.DictReader(f)}


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(store, "SHARD_BYTES", 28 * 28 * SHARD_ROWS)


def test_an_added_image_adds_about_one_shard_per_field_and_moves_no_sample(tmp_path, small_shards, monkeypatch):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=30, classes=range(3))
    first = prepare_folder(root, tmp_path)
    images, labels = mnist_arrays()
    index = int(np.flatnonzero(labels == 2)[45])  # a digit the folder does not hold yet
    (root / "2" / f"{index:05d}.png").write_bytes(png_bytes(images[index]))
    from veritrain.data import validate

    decoded, real_decoded = [], validate.decoded
    monkeypatch.setattr(validate, "decoded", lambda files, *args: decoded.extend(files) or real_decoded(files, *args))
    second = prepare_folder(root, tmp_path)
    assert [Path(path).name for path, _ in decoded] == [f"{index:05d}.png"]  # the rest read from the first version's shards
    assert prepare_folder(root, tmp_path / "afresh").version == second.version  # as if every image were decoded again

    assert first.info["format"] == second.info["format"] == identity.FORMAT_VERSION >= identity.FIELDS_SINCE
    assert second.version != first.version and len(second.sample_ids) == len(first.sample_ids) + 1
    before, after = shard_ids(first), shard_ids(second)
    assert set(before) == set(after) == {"image", "label"}
    assert len(before["image"]) >= 5  # enough shards for the count below to mean something
    for name in after:  # one new shard per field, every other one shared
        assert len(set(after[name]) - set(before[name])) == 1, name
        assert len(set(before[name]) - set(after[name])) == 1, name
    moved = {sid: (split, splits_of(second)[sid]) for sid, split in splits_of(first).items() if splits_of(second)[sid] != split}
    assert moved == {}
    # one copy on disk: each version's shard file is a link to the store's
    for version in (first, second):
        for shard in after["image"] if version is second else before["image"]:
            held = version.path / "fields" / shard[:2] / shard
            assert held.stat().st_ino == (tmp_path / ".veritrain" / "shards" / shard[:2] / shard).stat().st_ino
    # the rows read back are the pixels of the files, in manifest order
    row = second.sample_ids.index(f"2/{index:05d}.png")
    assert np.array_equal(np.asarray(second.inputs[row])[:, :, 0], images[index]) and int(second.targets[row]) == 2


def test_a_large_field_is_read_row_by_row_with_every_block_checked(tmp_path, small_shards, monkeypatch):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=20, classes=range(2))
    prepared = prepare_folder(root, tmp_path)
    monkeypatch.setattr(identity, "IN_MEMORY_BYTES", 0)  # read as rows are asked for, as a field too large for memory is
    identity._checked.clear()
    opened = identity.load_version(prepared.path)
    assert isinstance(opened.inputs, FieldArray) and opened.inputs.shape == prepared.inputs.shape
    rows = np.array([5, 0, 31, 5], dtype=np.int64)
    assert np.array_equal(opened.inputs[rows], np.asarray(prepared.inputs)[rows])

    spec = prepared.info["fields"]["image"]["shards"]
    damaged = spec[1]["id"]
    file = prepared.path / "fields" / damaged[:2] / damaged
    data = bytearray(file.read_bytes())
    data[3] ^= 0x10
    file.unlink()  # a new file under the version: the store's copy keeps its bytes
    file.write_bytes(bytes(data))
    identity._checked.clear()
    opened = identity.load_version(prepared.path)  # opening checks presence and size: the bytes are checked when read
    first_rows = np.arange(spec[0]["rows"])
    assert np.array_equal(opened.inputs[first_rows], np.asarray(prepared.inputs)[first_rows])
    with pytest.raises(ShardError, match=f"{damaged}: block 0 is not the one its entry names"):
        opened.inputs[spec[0]["rows"]]
    problems = identity.data_version_problems(prepared.version, lambda name: (prepared.path / name).read_bytes(),
                                              lambda name: sha256_file(prepared.path / name), None)
    assert [p["path"] for p in problems] == [f"fields/{damaged[:2]}/{damaged}"] and "block 0" in problems[0]["detail"]


def test_a_missing_shard_or_an_unlisted_file_stops_opening(tmp_path, small_shards):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=10, classes=range(2))
    prepared = prepare_folder(root, tmp_path)
    shard = prepared.info["fields"]["label"]["shards"][0]["id"]
    held = prepared.path / "fields" / shard[:2] / shard
    held.rename(prepared.path / "label.bak")
    identity._checked.clear()
    with pytest.raises(Exception, match=f"fields/{shard[:2]}/{shard} is missing"):
        identity.load_version(prepared.path)
    (prepared.path / "label.bak").rename(held)
    (prepared.path / "fields" / "00").mkdir(exist_ok=True)
    (prepared.path / "fields" / "00" / ("0" * 64)).write_bytes(b"planted")
    identity._checked.clear()
    with pytest.raises(Exception, match="is not part of the data version"):
        identity.load_version(prepared.path)


def test_gc_removes_the_shards_no_kept_version_holds(small_run_copy, tmp_path, small_shards):
    from veritrain.orchestration.housekeeping import gc
    from veritrain.records.workspace import Workspace

    workdir = small_run_copy.workdir
    kept = small_run_copy.record["data"]["version"]
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=10, classes=range(2))
    other = prepare_folder(root, workdir)  # no run names it
    shards = workdir / ".veritrain" / "shards"
    other_shards = {s for ids in shard_ids(other).values() for s in ids}
    kept_shards = {s for ids in shard_ids(identity.load_version(workdir / ".veritrain" / "data" / kept)).values() for s in ids}
    assert other_shards and not other_shards & kept_shards
    preview = gc(Workspace.open(workdir), dry_run=True)
    assert {f".veritrain/shards/{s[:2]}/{s}" for s in other_shards} <= set(preview["removed"])
    assert not {f".veritrain/shards/{s[:2]}/{s}" for s in kept_shards} & set(preview["removed"])
    done = gc(Workspace.open(workdir), dry_run=False)
    assert done["bytes_freed"] == preview["bytes_freed"] > 0
    assert {p.name for p in shards.glob("*/*")} == kept_shards and not other.path.exists()
    identity._checked.clear()
    assert len(identity.load_version(workdir / ".veritrain" / "data" / kept).inputs) == 1797


def test_a_fields_table_is_bound_by_the_version_id(tmp_path, small_shards):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=20, classes=range(3))
    prepared = prepare_folder(root, tmp_path)
    info = json.loads((prepared.path / "version.json").read_text())
    assert len(info["fields"]["image"]["shards"]) > 1
    # the shards of two versions swapped in a hand-edited table: every entry well formed, the id no longer the version's
    info["fields"]["image"]["shards"] = list(reversed(info["fields"]["image"]["shards"]))
    (prepared.path / "version.json").write_text(json.dumps(info))
    problems = identity.data_version_problems(prepared.version, lambda name: (prepared.path / name).read_bytes(),
                                              lambda name: sha256_file(prepared.path / name), None)
    assert problems and problems[0]["path"] == "manifest.csv" and "not to the version id" in problems[0]["detail"]


def test_a_placement_that_disagrees_with_the_manifest_is_found_by_the_whole_check(tmp_path, small_shards):
    """The threat: a version re-hashed to a new id whose placed rows put a test sample in train. Opening trusts the
    bound placement (it never parses the manifest); verify and import parse the manifest and compare."""
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=10, classes=range(3))
    prepared = prepare_folder(root, tmp_path)
    info = json.loads((prepared.path / "version.json").read_text())
    placed = bytearray((prepared.path / identity.PLACED_FILE).read_bytes())
    moved = placed.index(2)  # a test row
    placed[moved] = 0
    forged = prepared.path.parent / "forged"
    import shutil

    shutil.copytree(prepared.path, forged)
    (forged / identity.PLACED_FILE).write_bytes(bytes(placed))
    info["files"][identity.PLACED_FILE]["sha256"] = sha256_file(forged / identity.PLACED_FILE)
    info["data_version"] = identity.id_of(info, ())
    (forged / "version.json").write_text(json.dumps(info))
    forged = forged.rename(forged.with_name(info["data_version"]))

    def problems(size_of):
        return identity.data_version_problems(forged.name, lambda name: (forged / name).read_bytes(),
                                              lambda name: sha256_file(forged / name), None, size_of=size_of)

    assert problems(lambda name: (forged / name).stat().st_size) == []  # what opening checks holds
    (found,) = problems(None)
    assert found["path"] == identity.PLACED_FILE and "otherwise than the manifest" in found["detail"]
    identity._checked.clear()
    opened = identity.load_version(forged)
    assert moved in opened.splits["train"] and moved not in prepared.splits["train"]


def test_opening_reads_the_placement_and_the_ids_only_when_asked(tmp_path, small_shards, monkeypatch):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=10, classes=range(2))
    prepared = prepare_folder(root, tmp_path)
    identity._checked.clear()
    reads = []
    real_reader = csv.DictReader

    def counting_reader(*args, **kwargs):
        reads.append(args)
        return real_reader(*args, **kwargs)

    monkeypatch.setattr(csv, "DictReader", counting_reader)
    opened = identity.load_version(prepared.path)
    assert reads == [] and len(opened.sample_ids) == 20  # the manifest hashed, never parsed as a table
    assert opened.sample_ids[0] == "0/" + sorted(p.name for p in (root / "0").iterdir())[0] and len(reads) == 1
    assert list(opened.sample_ids)[0] == opened.sample_ids[0] and len(reads) == 1  # read once, then kept
    ordered = [sid for split in ("train", "val", "test") for sid in (prepared.path / "splits" / f"{split}.txt").read_text().split()]
    assert sorted(opened.sample_ids) == sorted(ordered)
    assert {name: len(rows) for name, rows in opened.splits.items()} == prepared.counts
