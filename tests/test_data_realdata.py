"""The data gate on real MNIST digits (500 per class) with the default config: the split it achieves, the
near-duplicates it links, and every injected fault found with its kind (tests/realdata.py injects them)."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from realdata import FAULT_COUNTS, write_faulty_mnist, write_mnist_imagefolder
from conftest import Result
from veritrain.core.config import load_config
from veritrain.core.hashing import sha256_file
from veritrain.data import prepare


def prepare_folder(root: Path, workdir: Path, *overrides: str):
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "data.yaml"
    config.write_text(f"data:\n  source: imagefolder\n  root: {root}\n", encoding="utf-8")
    resolved = load_config(config, list(overrides))
    return prepare.run(resolved.config.data, resolved.data_paths, workdir / ".veritrain")


def findings(data, kind: str) -> list[dict]:
    return [f for f in data.report()["findings"] if f["kind"] == kind]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mnist")
    return prepare_folder(write_mnist_imagefolder(tmp / "raw"), tmp)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faulty-mnist")
    faults = write_faulty_mnist(tmp / "raw", seed=0)
    return faults, prepare_folder(tmp / "raw", tmp)


def test_clean_mnist_splits_every_class_as_asked_and_links_almost_nothing(clean):
    # the old hash-only search chained a third of these digits into clusters and gave class "1" 43 train images
    report = clean.report()
    per_class = report["summary"]["achieved_split"]["per_class"]
    assert len(per_class) == 10 and not report["summary"]["achieved_split"]["skewed"]
    for name, achieved in per_class.items():  # data recipe 4: each class within max(split_tolerance, 3σ) of each ratio
        for split, p in (("train", 0.8), ("val", 0.1), ("test", 0.1)):
            allowed = max(0.03, 3 * (p * (1 - p) / achieved["samples"]) ** 0.5)
            assert abs(achieved[split] - p) <= allowed and abs(achieved["gap_sigma"][split]) <= 3, (name, split, achieved)
    whole = report["summary"]["achieved_split"]["whole"]
    assert whole["samples"] == 5000 and all(abs(whole[s] - p) <= 0.03 for s, p in (("train", 0.8), ("val", 0.1), ("test", 0.1))), whole
    linked = {s for f in findings(clean, "near_duplicate") for s in f["samples"]}
    assert len(linked) <= 0.01 * 5000
    assert report["leakage"]["cross_split_duplicate_pairs"] == 0
    assert report["data_version"] == clean.version and clean.info["format"] == prepare.FORMAT_VERSION


def test_faulty_mnist_every_injected_fault_is_found_with_its_kind(faulty):
    faults, data = faulty
    quarantined = {q["sample_id"]: q["kind"] for q in data.report()["quarantined"]}
    for path in faults.truncated + faults.non_image:
        assert quarantined.get(path) == "undecodable", path
    for path in faults.empty:
        assert quarantined.get(path) == "empty", path

    duplicate_groups = [set(f["samples"]) for f in findings(data, "duplicate")]
    assert sum(any({copy, original} <= g for g in duplicate_groups) for copy, original in faults.duplicates) == FAULT_COUNTS["duplicates"]
    conflicting = [set(f["samples"]) for f in findings(data, "conflicting_duplicate")]
    assert sum(any({c, o} <= g for g in conflicting) for c, o in faults.cross_class_duplicates) == FAULT_COUNTS["cross_class_duplicates"]
    near_groups = [set(f["samples"]) for f in findings(data, "near_duplicate")]
    found = sum(any({n.copy, n.original} <= g for g in near_groups) for n in faults.near_duplicates)
    assert found >= 9, f"near-duplicates found {found}/10"

    flagged = findings(data, "label_issue")
    caught = {f["samples"][0] for f in flagged} & {e.path for e in faults.label_errors}
    assert len(caught) >= 20 and len(flagged) <= 60, f"label errors {len(caught)}/25 with {len(flagged)} flagged"
    outliers = findings(data, "outlier")
    assert set(faults.noise) <= {f["samples"][0] for f in outliers} and len(outliers) <= 25

    assert findings(data, "imbalance"), "one class cut to 40 of 500: 12.5 ≥ 10"
    assert not findings(data, "split_skew")
    # messages name their own file: no absolute path in any stored file
    for name in ("manifest.csv", "quarantine.csv", "data_report.json", "data_report.md", "version.json"):
        assert str(data.path.parents[3]) not in (data.path / name).read_text(encoding="utf-8"), name


def test_a_moved_data_root_prepares_to_the_same_version_with_the_same_files(tmp_path):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=30, classes=range(3))
    (root / "0" / "broken.png").write_bytes(b"")
    first = prepare_folder(root, tmp_path / "a")
    moved = root.rename(tmp_path / "elsewhere")
    second = prepare_folder(moved, tmp_path / "b")
    assert first.version == second.version
    for name in ("manifest.csv", "quarantine.csv", "version.json"):
        a, b = (first.path / name).read_text(), (second.path / name).read_text()
        if name == "version.json":
            a, b = (json.dumps({k: v for k, v in json.loads(t).items() if k not in ("created_at", "reports")}) for t in (a, b))
        assert a == b, name


def test_two_identical_broken_files_each_get_a_message_naming_nobody_else(tmp_path):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=20, classes=range(2))
    for name in ("0/bad_a.png", "1/bad_b.png"):
        (root / name).write_bytes(b"not an image at all")
    data = prepare_folder(root, tmp_path)
    bad = {q["sample_id"]: q["reason"] for q in data.report()["quarantined"]}
    assert set(bad) == {"0/bad_a.png", "1/bad_b.png"}
    for reason in bad.values():
        assert "bad_a" not in reason and "bad_b" not in reason and str(tmp_path) not in reason


def test_an_exact_ten_to_one_imbalance_is_reported_overall_and_per_split(tmp_path):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=500, classes=[0])
    write_mnist_imagefolder(root, per_class=50, classes=[1])
    data = prepare_folder(root, tmp_path)
    reasons = [f["reason"] for f in findings(data, "imbalance")]
    assert any(r.startswith("all splits: class '0' has 500") and "ratio 10.0 ≥" in r for r in reasons), reasons
    # within each split the ratio is what the hash placement gave (train 396 / 41 = 9.7, val 43 / 3, test 61 / 6):
    # exactly the splits at 10 or more are reported
    per_class = data.info["counts_per_class"]
    for split, counts in per_class.items():
        reported = any(r.startswith(f"{split}:") for r in reasons)
        assert reported == (counts["0"] >= 10 * counts["1"]), (split, counts, reasons)
    assert any(r.startswith(("val:", "test:")) for r in reasons)


def test_a_group_that_forces_a_split_skew_fails_with_its_cause_or_warns(tmp_path):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=60, classes=range(2))
    # most of class 0 is one patient: it must stay in one split, so that class cannot follow 80/10/10
    for path in sorted((root / "0").iterdir())[:50]:
        path.rename(path.with_name(f"patient7_{path.name}"))
    from veritrain.core.errors import RunFailed

    with pytest.raises(RunFailed, match=r"split_skew: class '0'.*a unit of 50 samples that must stay together \(group 'patient7'") as info:
        prepare_folder(root, tmp_path / "fail", "data.group_regex=(patient\\d+)_")
    assert "data.on_split_skew: warn" in str(info.value)
    data = prepare_folder(root, tmp_path / "warn", "data.group_regex=(patient\\d+)_", "data.on_split_skew=warn")
    # the hash of the group's smallest key puts all 50 in test: class 0 is 10 / 0 / 50, and the whole set tips with it
    class_skew, whole_skew = findings(data, "split_skew")
    assert class_skew["reason"].startswith("class '0': train/val/test 0.17 / 0.00 / 0.83 of 60 samples") and "+18.9σ" in class_skew["reason"]
    assert whole_skew["reason"].startswith("all classes together: train/val/test 0.50 / 0.03 / 0.47 of 120 samples")
    assert data.report()["summary"]["achieved_split"]["skewed"]
    assert (data.path / "data_report.md").read_text().splitlines()[2] == "## What matters"


def test_label_issues_quarantined_from_train_and_val_only(tmp_path):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=300, classes=range(4))
    faults = []
    for k, path in enumerate(sorted((root / "0").iterdir())[:10]):  # ten 0s filed as 1s
        target = root / "1" / f"x{k}_{path.name}"
        path.rename(target)
        faults.append(f"1/{target.name}")
    warned = prepare_folder(root, tmp_path / "warn")
    flagged = {f["samples"][0]: f for f in findings(warned, "label_issue")}
    # recall is judged on the full faulty MNIST above; here (1,200 digits) enough must be flagged to test quarantine
    assert len(set(faults) & set(flagged)) >= 4, len(set(faults) & set(flagged))
    assert all(f["suggested"] == "0" for p, f in flagged.items() if p in faults)
    quarantined = prepare_folder(root, tmp_path / "q", "data.on_label_issue=quarantine")
    assert quarantined.version != warned.version  # quarantine changes the split: part of the id
    report = quarantined.report()
    removed = {q["sample_id"] for q in report["quarantined"] if q["kind"] == "label_issue"}
    assert len(removed & set(faults)) >= 4
    before = {warned.sample_ids[r]: name for name, rows in warned.splits.items() for r in rows}
    assert {before[s] for s in removed} <= {"train", "val"}  # the same split, less what was removed from train and val
    placed = set(quarantined.sample_ids)
    assert not removed & placed and placed == set(before) - removed
    with open(quarantined.path / "manifest.csv", newline="") as f:
        status = {row["sample_id"]: (row["status"], row["split"]) for row in csv.DictReader(f)}
    assert all(status[s] == ("quarantined", "") for s in removed)
    assert quarantined.info["quarantined"] == len(report["quarantined"]) == report["summary"]["label_issues"]["quarantined"]  # nothing else is quarantined here
    in_test = {f["samples"][0] for f in findings(quarantined, "label_issue") if f["split"] == "test"}
    assert all(before[s] == "test" and s in placed for s in in_test)  # reported, never removed from test
    assert report["summary"]["label_issues"]["in_test"] == len(in_test)
    assert not findings(quarantined, "split_skew")  # judged on the split's own placement

    kept = prepare_folder(root, tmp_path / "keep", "data.on_label_issue=quarantine", "data.on_bad_file=warn")
    assert set(kept.sample_ids) == set(before)  # on_bad_file: warn keeps every usable sample, label issues included
    assert not kept.report()["quarantined"] and kept.report()["summary"]["label_issues"]["quarantined"] == 0


def test_a_flipped_byte_in_a_stored_version_stops_the_next_run_before_training(cli, tmp_path):
    prepared = cli("data", "prepare", "--workdir", str(tmp_path), "--json")
    assert prepared.code == 0, prepared.stderr
    version = prepared.json()["data_version"]
    folder = tmp_path / ".veritrain" / "data" / version
    shard = json.loads((folder / "version.json").read_text())["fields"]["image"]["shards"][0]["id"]
    pixels = folder / "fields" / shard[:2] / shard
    data = bytearray(pixels.read_bytes())
    data[-100] ^= 0x01
    pixels.unlink()  # a new file: the store's copy, a hard link of the old one, stays as it was
    pixels.write_bytes(bytes(data))
    result = cli("run", "--set", "train.epochs=1", "--set", "model.name=mlp", "--workdir", str(tmp_path))
    assert result.code == 1
    (line,) = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert shard in line and "block 0" in line and "damaged" in line and "prepare it again" in line
    assert not list(tmp_path.glob("runs/*/checkpoints/*.pt"))  # nothing trained on it
    # without the smoke test, training reads the pixels (every block checked) before its first step
    again = cli("run", "--set", "train.epochs=1", "--set", "model.name=mlp", "--no-smoke", "--workdir", str(tmp_path))
    assert again.code == 1 and shard in again.stderr and not list(tmp_path.glob("runs/*/checkpoints/*.pt"))
    pixels.write_bytes(bytes(data[:-1]))  # cut short: opening the version sees it by its size
    cut = cli("data", "prepare", "--workdir", str(tmp_path))
    assert cut.code == 1 and shard in cut.stderr and "holds" in cut.stderr and "damaged" in cut.stderr


def test_a_file_added_to_a_stored_version_is_refused(cli, tmp_path):
    prepared = cli("data", "prepare", "--workdir", str(tmp_path), "--json")
    folder = tmp_path / ".veritrain" / "data" / prepared.json()["data_version"]
    (folder / "splits" / "extra.txt").write_text("digits#00001\n")
    result = cli("data", "prepare", "--workdir", str(tmp_path))
    assert result.code == 1 and "extra.txt" in result.stderr and "not part of the data version" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_faulty_mnist_other_injection_seeds(tmp_path, seed):
    # the same checks as seed 0 above, on other draws of the faults and of the small class
    faults = write_faulty_mnist(tmp_path / "raw", seed=seed)
    data = prepare_folder(tmp_path / "raw", tmp_path)
    flagged = findings(data, "label_issue")
    caught = {f["samples"][0] for f in flagged} & {e.path for e in faults.label_errors}
    assert len(caught) >= 20 and len(flagged) <= 60, f"seed {seed}: label errors {len(caught)}/25 with {len(flagged)} flagged"
    outliers = findings(data, "outlier")
    assert set(faults.noise) <= {f["samples"][0] for f in outliers} and len(outliers) <= 25
    near_groups = [set(f["samples"]) for f in findings(data, "near_duplicate")]
    assert sum(any({n.copy, n.original} <= g for g in near_groups) for n in faults.near_duplicates) >= 9
    assert not findings(data, "split_skew") and findings(data, "imbalance")


def test_near_duplicates_with_other_labels_and_oversized_groups(tmp_path):
    from realdata import mnist_arrays, png_bytes

    images, labels = mnist_arrays()
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=30, classes=range(3))
    zero = int(next(i for i in range(5000) if labels[i] == 0))
    brighter = np.clip(images[zero].astype(np.int16) + 2, 0, 255).astype(np.uint8)
    (root / "1" / "relabelled.png").write_bytes(png_bytes(brighter))  # the same picture, filed as a 1
    one = int(np.flatnonzero(labels == 1)[100])  # a 1 not among the 30 written
    for k in range(1, 56):  # 55 copies of one digit, each brighter by k grey levels: one group of 56 pictures
        (root / "2" / f"bright_{k:02d}.png").write_bytes(png_bytes(np.clip(images[one].astype(np.int16) + k, 0, 255).astype(np.uint8)))
    (root / "2" / "original.png").write_bytes(png_bytes(images[one]))
    data = prepare_folder(root, tmp_path, "data.on_split_skew=warn")
    (conflict,) = findings(data, "conflicting_near_duplicate")
    assert set(conflict["samples"]) == {f"0/{zero:05d}.png", "1/relabelled.png"} and conflict["severity"] == "quarantine"
    quarantined = {q["sample_id"]: q["kind"] for q in data.report()["quarantined"]}
    assert quarantined["1/relabelled.png"] == quarantined[f"0/{zero:05d}.png"] == "conflicting_near_duplicate"
    (capped,) = findings(data, "near_duplicate_cluster_capped")
    assert len(capped["samples"]) == 56 and "a near-duplicate group of 56 samples" in capped["reason"]
    assert capped["reason"].count(" ~ ") == 2  # two example pairs
    assert len({s for s in splits_of(data, capped["samples"])}) == 1  # kept in one split


def splits_of(data, sample_ids) -> list[str]:
    where = {data.sample_ids[row]: name for name, rows in data.splits.items() for row in rows}
    return [where[s] for s in sample_ids]


def _pyarrow_footprint() -> int:
    """Bytes that importing pyarrow adds to a process that imports scikit-learn, as prepare does: scikit-learn imports
    pandas, and pandas 3 imports pyarrow whenever it is installed. Measured as the peak resident memory of those imports
    with pyarrow against the same with pyarrow made unimportable."""
    import subprocess
    import sys

    code = ("import sys\nif sys.argv[1] == 'blocked': sys.modules['pyarrow'] = None\nimport sklearn.utils.fixes, pandas\n"
            "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])")
    peaks = [int(subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, check=True).stdout) * 1024
             for how in ("installed", "blocked")]
    return max(0, peaks[0] - peaks[1])


@pytest.mark.slow
def test_prepare_memory_grows_by_less_than_twice_the_pixels_per_image(tmp_path):
    # 32×32 RGB PNGs: 3 KiB of pixels each. Before the arrays were written through a memory map, the prepare
    # process peaked at 1.05 GB for 20,000 of them (49.5 KiB per extra image). benchmarks/data_memory.py
    # prints the full table, with the worker processes.
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from data_memory import measure
    from realdata import write_png_dataset

    root = write_png_dataset(tmp_path / "png", 20_000)
    small = write_png_dataset(tmp_path / "png_small", 5_000)
    peak_small, peak = measure(small, 5_000).main_peak, measure(root, 20_000).main_peak
    libraries = _pyarrow_footprint()  # not veritrain's: a library pandas loads whenever it is installed (mlflow brings it)
    assert peak <= 350 * 2**20 + libraries, f"peak {peak / 2**20:.0f} MiB ({libraries / 2**20:.0f} MiB of them pyarrow's import)"
    assert (peak - peak_small) / 15_000 <= 2 * 32 * 32 * 3, f"{(peak - peak_small) / 15_000 / 1024:.1f} KiB per image"


def tampered(cli, workdir: Path, change) -> Result:
    """Prepare digits, change the stored version with `change(folder, info)`, prepare again."""
    prepared = cli("data", "prepare", "--workdir", str(workdir), "--json")
    assert prepared.code == 0, prepared.stderr
    folder = workdir / ".veritrain" / "data" / prepared.json()["data_version"]
    info = json.loads((folder / "version.json").read_text())
    change(folder, info)
    (folder / "version.json").write_text(json.dumps(info))
    return cli("data", "prepare", "--workdir", str(workdir))


def _test_into_train(folder: Path, info: dict) -> None:
    train = folder / "splits" / "train.txt"
    train.write_text(train.read_text() + (folder / "splits" / "test.txt").read_text())


@pytest.mark.parametrize("change, named", [
    # a bound file swapped, its new hash slipped into the unbound table of reports
    (lambda folder, info: (_test_into_train(folder, info),
                           info["reports"].__setitem__("splits/train.txt", sha256_file(folder / "splits/train.txt"))), "splits/train.txt"),
    # the recipe written as text, so that a lax reader would skip the file checks
    (lambda folder, info: info.__setitem__("format", "3"), "version.json"),
    # a shard's entry edited: the version id binds the table of fields
    (lambda folder, info: info["fields"]["label"].__setitem__("rows", 5), "manifest.csv"),
    (lambda folder, info: info.__setitem__("fields", {}), "manifest.csv"),
    # the split verdict that gates training
    (lambda folder, info: info["achieved_split"].__setitem__("skewed", ["class '3' is skewed"]), "manifest.csv"),
    (lambda folder, info: info["normalization"]["mean"].__setitem__(0, 0.5), "manifest.csv"),
    (lambda folder, info: info["reports"].__setitem__("bad\u0000name", "0" * 64), "version.json"),
    (lambda folder, info: info["reports"].__setitem__("../outside.txt", "0" * 64), "version.json"),
])
def test_edits_of_a_stored_version_json_are_refused_in_one_line(cli, tmp_path, change, named):
    result = tampered(cli, tmp_path, change)
    assert result.code == 1, result.stderr
    (line,) = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert named in line and "damaged" in line and "Traceback" not in result.stderr


def test_a_file_changed_between_hashing_and_decoding_is_never_stored(tmp_path, monkeypatch):
    from realdata import mnist_arrays, png_bytes
    from veritrain.core.errors import RunFailed

    root = write_mnist_imagefolder(tmp_path / "raw", per_class=20, classes=range(2))
    victim = sorted((root / "0").iterdir())[3]
    write_fields = prepare.write_fields

    def changing_first(*args, **kwargs):
        victim.write_bytes(png_bytes(mnist_arrays()[0][4999]))  # another digit, after the manifest hashed the file
        return write_fields(*args, **kwargs)

    monkeypatch.setattr(prepare, "write_fields", changing_first)
    with pytest.raises(RunFailed, match=f"0/{victim.name} changed while preparing"):
        prepare_folder(root, tmp_path)
    assert not list((tmp_path / ".veritrain" / "data").glob("[0-9a-f]*"))


def test_a_cache_entry_pointing_at_another_version_is_not_trusted(tmp_path):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=30, classes=range(2))
    first = prepare_folder(root, tmp_path)
    other = prepare_folder(root, tmp_path, "data.split_seed=1")
    assert other.version != first.version
    memos = list((tmp_path / ".veritrain" / "cache" / "prepared").iterdir())
    for memo in memos:  # every input fingerprint now names the split_seed=1 version
        memo.write_text(other.version + "\n")
    again = prepare_folder(root, tmp_path)
    assert again.version == first.version


def test_near_duplicates_are_searched_once_per_distinct_content(tmp_path, monkeypatch):
    from realdata import png_bytes
    from veritrain.data import grouping

    root = write_mnist_imagefolder(tmp_path / "raw", per_class=30, classes=range(2))
    blank = png_bytes(np.zeros((28, 28), dtype=np.uint8))
    for k in range(300):  # many copies of one blank frame: linked by their hash, not compared pairwise
        (root / "0" / f"blank_{k:03d}.png").write_bytes(blank)
    seen = []
    search = grouping.near_duplicates

    def counting(phashes, pictures, *args):
        seen.append(len(phashes))
        return search(phashes, pictures, *args)

    monkeypatch.setattr(grouping, "near_duplicates", counting)
    data = prepare_folder(root, tmp_path, "data.near_duplicates=true", "data.on_split_skew=warn")
    assert seen == [61]  # 60 digits and one blank
    (group,) = [f for f in findings(data, "duplicate") if "0/blank_000.png" in f["samples"]]
    assert len(group["samples"]) == 300
