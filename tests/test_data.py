"""The digits data version: content hashes, a seeded split by key hash, train-only stats, stable version id."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from veritrain.core.config import DataConfig
from veritrain.data import prepare
from veritrain.data.split import Unit, assign, split_of_keys
from veritrain.core.errors import RunFailed


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return prepare.run(DataConfig(), {}, tmp_path_factory.mktemp("state"))


def test_digits_samples_and_scaling(digits):
    from sklearn.datasets import load_digits

    raw = load_digits()
    assert digits.inputs.shape == (1797, 8, 8, 1) and digits.inputs.dtype == np.uint8
    assert np.array_equal(digits.inputs[..., 0], np.rint(raw.images * 255 / 16).astype(np.uint8))
    assert digits.inputs.max() == 255  # 16 → 255
    assert digits.sample_ids[42] == "digits#00042"
    assert digits.classes == [str(i) for i in range(10)]


def test_png_written_from_stored_array_decodes_identically(digits):
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(digits.inputs[7, :, :, 0])).save(buffer, format="PNG")
    buffer.seek(0)
    assert np.array_equal(np.asarray(Image.open(buffer)), digits.inputs[7, :, :, 0])


def test_split_files_partition_samples_each_class_within_chance(digits):
    counts = digits.counts
    assert sum(counts.values()) == 1797
    assert counts == {"train": 1437, "val": 189, "test": 171}  # data recipe 4: each sample placed by the hash of its key
    all_rows = np.concatenate(list(digits.splits.values()))
    assert len(np.unique(all_rows)) == 1797  # a partition: no sample in two splits
    class_sizes = np.bincount(digits.targets, minlength=10)
    for split, rows in digits.splits.items():
        p = {"train": 0.8, "val": 0.1, "test": 0.1}[split]
        fraction = np.bincount(digits.targets[rows], minlength=10) / class_sizes
        assert np.all(np.abs(fraction - p) <= np.maximum(0.03, 3 * np.sqrt(p * (1 - p) / class_sizes)))  # each class within 3σ
    ids = (digits.path / "splits" / "test.txt").read_text().split()
    assert ids == [digits.sample_ids[i] for i in digits.splits["test"]]


def test_manifest_has_one_content_hash_per_sample(digits):
    import blake3

    with open(digits.path / "manifest.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["sample_id", "size", "blake3", "label", "split", "status", "key", "unit"]
    assert rows[3]["key"] == rows[3]["unit"] == ""  # placed by its own content hash
    assert len(rows) == 1797
    assert rows[3]["blake3"] == blake3.blake3(np.asarray(digits.inputs[3]).tobytes()).hexdigest()
    assert rows[3]["label"] == digits.classes[digits.targets[3]]


def test_normalization_uses_train_split_only(digits):
    train = digits.inputs[digits.splits["train"]].astype(np.float64) / 255
    stats = digits.info["normalization"]
    assert stats["mean"] == pytest.approx([train.mean()])
    assert stats["std"] == pytest.approx([train.std()])
    everything = np.asarray(digits.inputs, dtype=np.float64) / 255
    assert stats["mean"][0] != pytest.approx(everything.mean(), abs=1e-9)


def test_version_is_stable_and_reused(digits, tmp_path):
    again = prepare.run(DataConfig(), {}, digits.path.parent.parent)
    assert again.version == digits.version and again.path == digits.path and again.reused
    elsewhere = prepare.run(DataConfig(), {}, tmp_path)  # another workspace, same data → same id
    assert elsewhere.version == digits.version


@pytest.mark.parametrize("change", [{"split_seed": 1}, {"split_ratios": (0.7, 0.15, 0.15)}])
def test_version_changes_with_split(digits, tmp_path, change):
    other = prepare.run(DataConfig(**change), {}, tmp_path)
    assert other.version != digits.version


def test_version_changes_with_a_relabel_or_a_changed_byte(digits, tmp_path, monkeypatch):
    from veritrain.data import sources

    original = sources.load_digits_source

    def tampered(kind):
        def load(cfg, paths):
            data = original(cfg, paths)
            if kind == "label":
                data.targets[5] = (data.targets[5] + 1) % 10
            else:
                data.inputs[5, 0, 0, 0] ^= 1
                data.content_hashes = sources.array_sample_hashes(data.inputs)
            return data

        return load

    versions = set()
    for kind in ("label", "byte"):
        monkeypatch.setitem(sources.SOURCES, "digits", tampered(kind))
        versions.add(prepare.run(DataConfig(), {}, tmp_path / kind).version)
    assert len(versions) == 2 and digits.version not in versions


def test_split_is_seeded():
    keys = [f"sample-{i}" for i in range(100)]
    assert split_of_keys(keys, (0.8, 0.1, 0.1), 3) == split_of_keys(keys, (0.8, 0.1, 0.1), 3)
    assert split_of_keys(keys, (0.8, 0.1, 0.1), 3) != split_of_keys(keys, (0.8, 0.1, 0.1), 4)


def test_a_class_with_no_train_sample_is_an_error_and_one_without_val_or_test_is_not():
    keys = [f"k{i}" for i in range(400)]
    placed = split_of_keys(keys, (0.8, 0.1, 0.1), 0)
    elsewhere = [k for k, s in zip(keys, placed) if s != "train"][:2]
    trained = [k for k, s in zip(keys, placed) if s == "train"]
    units = [Unit([i], [0], key=k) for i, k in enumerate(trained[:10])]
    small = [Unit([10 + i], [1], key=k) for i, k in enumerate(elsewhere)]
    with pytest.raises(RunFailed, match="class 1 has 2 sample.*none of them placed in train.*too_small"):
        assign(units + small, (0.8, 0.1, 0.1), 0)
    assert assign(units, (0.8, 0.1, 0.1), 0) == ["train"] * 10  # no val or test sample: fine


def test_test_split_file_applies_to_array_sources(digits, tmp_path):
    listed = ["digits#00000", "digits#00001", "digits#01000"]
    ids_file = tmp_path / "test_ids.txt"
    ids_file.write_text("\n".join(listed) + "\n", encoding="utf-8")
    data = prepare.run(DataConfig(test_split_file=str(ids_file)), {"test_split_file": ids_file}, tmp_path / "state")
    test_ids = {data.sample_ids[row] for row in data.splits["test"]}
    assert set(listed) <= test_ids
    assert data.version != digits.version


def test_digits_are_read_as_load_digits_reads_them_without_importing_scikit_learn():
    from sklearn.datasets import load_digits

    from veritrain.data.sources import bundled_digits

    values, labels, version = bundled_digits()
    bunch = load_digits()
    assert np.array_equal(values, bunch.images) and values.dtype == bunch.images.dtype
    assert np.array_equal(labels, bunch.target) and list(bunch.target_names) == list(range(10))
    import sklearn

    assert version == sklearn.__version__
    probe = "import sys; from veritrain.data.sources import load_digits_source; load_digits_source(None, {}); print('sklearn' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "False"


def _manifest(folder, header, rows, algorithm="blake3"):
    """A data version folder holding only what `data diff` reads (version.json names the hash column)."""
    import json

    folder.mkdir()
    (folder / "version.json").write_text(json.dumps({"hash_algorithm": algorithm}), encoding="utf-8")
    (folder / "manifest.csv").write_text("\n".join([",".join(header), *(",".join(r) for r in rows)]) + "\n", encoding="utf-8")
    return folder


def test_data_diff_reads_the_content_hash_column_version_json_names(tmp_path):
    from veritrain.data import report

    old = _manifest(tmp_path / "old", ["sample_id", "size", "blake3", "label", "split", "status"],
                    [["a", "1", "h1", "cat", "train", "ok"], ["b", "1", "h2", "dog", "val", "ok"]])
    new = _manifest(tmp_path / "new", ["sample_id", "label", "split", "status", "size", "blake3"],  # same data, columns reordered
                    [["a", "cat", "train", "ok", "1", "h1"], ["b", "dog", "val", "ok", "1", "h9"]])
    result = report.diff(old, new)
    assert result["content_changed"] == ["b"] and result["content_hash"] == "blake3" and result["content_compared"]
    assert not result["relabelled"] and not result["moved"]
    other = _manifest(tmp_path / "other", ["sample_id", "size", "sha256", "label", "split", "status"],
                      [["a", "1", "x1", "cat", "train", "ok"], ["b", "1", "x2", "dog", "val", "ok"]], algorithm="sha256")
    result = report.diff(old, other)
    assert result["content_compared"] is False and result["content_changed"] == [] and result["content_hash"] == "blake3 → sha256"
    (other / "version.json").write_text("{}")  # names no algorithm
    with pytest.raises(RunFailed, match=r"other: not a readable data version \(KeyError"):
        report.diff(old, other)


def test_digits_fall_back_to_load_digits_when_the_bundled_file_reads_otherwise(monkeypatch):
    from sklearn.datasets import load_digits

    from veritrain.data import sources

    monkeypatch.setattr(sources, "_read_digits_csv", lambda path: np.zeros((3, 7)))  # not the layout load_digits() reads
    values, labels, _ = sources.bundled_digits()
    bunch = load_digits()
    assert np.array_equal(values, bunch.images) and np.array_equal(labels, bunch.target)


def test_a_move_under_one_split_rule_is_put_down_to_its_group_not_the_rule(tmp_path):
    """A text version's manifest holds no units: a test sample pulled into train by a new near-copy moved with its group,
    and the split rule (unchanged) is not named as the cause."""
    from veritrain.data import report

    header = ["sample_id", "size", "blake3", "label", "split", "status"]
    old = _manifest(tmp_path / "old", header, [["a", "1", "h1", "", "test", "ok"], ["b", "1", "h2", "", "train", "ok"]])
    new = _manifest(tmp_path / "new", header, [["a", "1", "h1", "", "train", "ok"], ["b", "1", "h2", "", "train", "ok"],
                                               ["a2", "1", "h3", "", "train", "ok"]])
    result = report.diff(old, new)
    assert result["split_rule_changed"] == {} and result["moved_by_cause"] == {"key": 0, "group": 1, "quarantine": 0, "placement": 0}
