"""Content validation on a fault-injection fixture: every bad file quarantined with the right kind,
duplicates kept in one split, no leakage; the version id is stable and sensitive."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from datafixtures import FAULTY_CONFIG, faulty_imagefolder, good_imagefolder, save, structured_image
from veritrain.core.config import load_config
from veritrain.data import prepare
from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import blake3_file
from veritrain.data.split import SPLITS


def prepare_config(config_text: str, tmp_path: Path, overrides=(), name="data.yaml", rehash=False):
    path = tmp_path / name
    path.write_text(config_text, encoding="utf-8")
    resolved = load_config(path, list(overrides))
    return prepare.run(resolved.config.data, resolved.data_paths, tmp_path / "ws" / ".veritrain", rehash=rehash)


def raw_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): blake3_file(p) for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faulty")
    root = tmp / "raw"
    expected = faulty_imagefolder(root)
    before = raw_hashes(root)
    data = prepare_config(FAULTY_CONFIG.format(root=root), tmp)
    return tmp, root, expected, data, before


def splits_of(data) -> dict[str, str]:
    return {data.sample_ids[row]: name for name, rows in data.splits.items() for row in rows}


def test_every_bad_file_is_quarantined_with_its_kind(faulty):
    _, _, expected, data, _ = faulty
    report = data.report()
    quarantined = {q["sample_id"]: q["kind"] for q in report["quarantined"]}
    for sample_id, kind in expected.items():
        if kind in ("format_mismatch", "duplicate", "near_duplicate"):
            continue  # warnings: kept
        assert quarantined.get(sample_id) == kind, (sample_id, quarantined.get(sample_id))
    in_splits = splits_of(data)
    assert not set(quarantined) & set(in_splits)  # none of them is in a split
    with open(data.path / "quarantine.csv", newline="") as f:
        assert {row["sample_id"]: row["kind"] for row in csv.DictReader(f)} == quarantined


def test_warnings_are_reported_and_samples_kept(faulty):
    _, _, _, data, _ = faulty
    report = data.report()
    kinds = {f["kind"]: f for f in report["findings"]}
    assert kinds["format_mismatch"]["samples"] == ["cat/really_a_jpeg.png"]
    assert kinds["format_mismatch"]["severity"] == "warning"
    in_splits = splits_of(data)
    assert "cat/really_a_jpeg.png" in in_splits
    assert sorted(kinds["duplicate"]["samples"]) == ["dog/dog_03.png", "dog/dog_03_copy.png"]
    assert sorted(kinds["near_duplicate"]["samples"]) == ["cat/near_a.png", "cat/near_b.png"]


def test_duplicates_share_a_split_and_nothing_leaks(faulty):
    _, _, _, data, _ = faulty
    in_splits = splits_of(data)
    assert in_splits["dog/dog_03.png"] == in_splits["dog/dog_03_copy.png"]
    assert in_splits["cat/near_a.png"] == in_splits["cat/near_b.png"]
    assert data.report()["leakage"] == {"cross_split_duplicate_pairs": 0, "required": 0, "ok": True}


def test_raw_data_is_never_modified(faulty):
    _, root, _, _, before = faulty
    assert raw_hashes(root) == before


def test_report_files_and_manifest(faulty):
    _, _, _, data, _ = faulty
    for name in ("data_report.json", "data_report.md", "manifest.csv", "quarantine.csv", "card.json",
                 "class_distribution_train.png", "class_distribution_test.png"):
        assert (data.path / name).is_file(), name
    assert (data.path / "class_distribution_train.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(data.path / "manifest.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["sample_id", "size", "blake3", "label", "split", "status", "key", "unit"]
    statuses = {r["sample_id"]: r["status"] for r in rows}
    assert statuses["cat/empty.png"] == "quarantined" and statuses["cat/cat_00.png"] == "ok"
    report = data.report()
    assert report["card"]["license"] == "CC0" and report["card_warnings"] == []
    assert report["hash_algorithm"] == "blake3"
    text = (data.path / "data_report.md").read_text()
    assert "leakage check: 0" in text and "undecodable" in text


def test_fail_policy_exits_naming_the_files(faulty, tmp_path):
    _, root, _, _, _ = faulty
    with pytest.raises(RunFailed) as info:
        prepare_config(FAULTY_CONFIG.format(root=root), tmp_path, ["data.on_bad_file=fail"])
    message = str(info.value)
    assert "data.on_bad_file: fail" in message and "cat/empty.png: empty" in message


def test_fail_policy_through_the_cli(cli, faulty, tmp_path):
    _, root, _, _, _ = faulty
    config = tmp_path / "c.yaml"
    config.write_text(FAULTY_CONFIG.format(root=root))
    result = cli("data", "prepare", str(config), "--set", "data.on_bad_file=fail", "--workdir", str(tmp_path))
    assert result.code == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: data: ")
    assert "empty" in result.stderr and "Traceback" not in result.stderr


def test_prepare_json_contract(cli, faulty, tmp_path):
    _, root, _, _, _ = faulty
    config = tmp_path / "c.yaml"
    config.write_text(FAULTY_CONFIG.format(root=root))
    result = cli("data", "prepare", str(config), "--workdir", str(tmp_path), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert {"data_version", "counts", "quarantined", "findings", "leakage_pairs", "split_files", "report"} <= set(payload)
    assert set(payload["counts"]) == {"train", "val", "test"} and payload["leakage_pairs"] == 0
    assert set(payload["quarantined"][0]) == {"sample_id", "path", "kind", "reason"}
    assert set(payload["findings"][0]) == {"kind", "severity", "samples", "reason"}
    for name, path in payload["split_files"].items():
        assert Path(path).is_absolute() and Path(path).name == f"{name}.txt"


def test_convert_turns_bad_shape_into_usable(faulty, tmp_path):
    _, root, _, _, _ = faulty
    data = prepare_config(FAULTY_CONFIG.format(root=root), tmp_path, ["data.convert=true"])
    quarantined = {q["sample_id"] for q in data.report()["quarantined"]}
    assert "dog/grey.png" not in quarantined and "cat/wrong_size.png" not in quarantined
    assert data.inputs.shape[1:] == (32, 32, 3)


def test_version_stable_under_touch_copy_and_rehash(tmp_path):
    root = good_imagefolder(tmp_path / "raw")
    config = "data:\n  source: imagefolder\n  root: {root}\n"
    first = prepare_config(config.format(root=root), tmp_path).version
    for p in root.rglob("*.png"):
        os.utime(p, None)  # touch: new mtimes, same bytes
    assert prepare_config(config.format(root=root), tmp_path).version == first
    copy = tmp_path / "elsewhere" / "raw"
    shutil.copytree(root, copy)
    assert prepare_config(config.format(root=copy), tmp_path / "elsewhere").version == first
    assert prepare_config(config.format(root=root), tmp_path, rehash=True).version == first


def test_version_changes_on_byte_label_ratio_seed(tmp_path):
    root = good_imagefolder(tmp_path / "raw")
    config = "data:\n  source: imagefolder\n  root: {root}\n".format(root=root)
    base = prepare_config(config, tmp_path).version
    versions = {
        prepare_config(config, tmp_path, ["data.split_seed=1"]).version,
        prepare_config(config, tmp_path, ["data.split_ratios=[0.5,0.25,0.25]"]).version,
    }
    target = root / "cat" / "cat_01.png"
    data = bytearray(target.read_bytes())
    data[-20] ^= 0x01  # one flipped bit in the last chunk
    flipped_root = tmp_path / "flipped"
    shutil.copytree(root, flipped_root)
    (flipped_root / "cat" / "cat_01.png").write_bytes(bytes(data))
    versions.add(prepare_config(config.replace(str(root), str(flipped_root)), tmp_path).version)
    relabelled = tmp_path / "relabelled"
    shutil.copytree(root, relabelled)
    shutil.move(relabelled / "cat" / "cat_02.png", relabelled / "dog" / "cat_02.png")
    versions.add(prepare_config(config.replace(str(root), str(relabelled)), tmp_path).version)
    assert base not in versions and len(versions) == 4


def test_csv_fixed_split_and_leak_duplicate(tmp_path):
    root = good_imagefolder(tmp_path / "raw")
    shutil.copy(root / "cat" / "cat_00.png", root / "cat" / "cat_00_again.png")
    rows = [("cat/cat_00.png", "cat", "test"), ("cat/cat_00_again.png", "cat", "train")]
    rows += [(f"{c}/{c}_{i:02d}.png", c, "") for c in ("cat", "dog") for i in range(1, 12)]
    with open(tmp_path / "list.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "split"])
        writer.writerows(rows)
    data = prepare_config(f"data:\n  source: csv\n  root: raw\n  csv: list.csv\n", tmp_path)
    quarantined = {q["sample_id"]: q["kind"] for q in data.report()["quarantined"]}
    assert quarantined == {"cat/cat_00_again.png": "leak_duplicate"}
    assert splits_of(data)["cat/cat_00.png"] == "test"
    assert data.report()["leakage"]["cross_split_duplicate_pairs"] == 0


def _labels_csv(tmp_path: Path, rows: list[tuple[str, str]]) -> Path:
    (tmp_path / "raw").mkdir(exist_ok=True)  # the listing fails before any file is read
    with open(tmp_path / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        writer.writerows(rows)
    config = tmp_path / "data.yaml"
    config.write_text("data:\n  source: csv\n  root: raw\n  csv: labels.csv\n", encoding="utf-8")
    return config


@pytest.mark.parametrize("typo", ["dgo", "Dog"])
def test_a_mistyped_csv_label_is_refused_at_its_file_and_line(tmp_path, capsys, typo):
    from veritrain.cli import main

    rows = [(f"{c}/{c}_{i:02d}.png", c) for c in ("cat", "dog") for i in range(12)]
    rows.insert(15, ("dog/extra.png", typo))  # line 17: the header is line 1
    config = _labels_csv(tmp_path, rows)
    with pytest.raises(SystemExit) as exited:
        main(["data", "prepare", str(config), "--workdir", str(tmp_path / "ws")])
    out, err = capsys.readouterr()
    assert exited.value.code == 1 and out == "" and "Traceback" not in err  # bad data: exit 1, as the csv's other line errors
    assert err.splitlines()[-1] == (f"error: data.csv: {tmp_path / 'labels.csv'}: line 17: label {typo!r} is on 1 row(s), 'dog' on 12; "
                                    f"a typo of 'dog'? fix it, or list every class in data.classes to keep {typo!r} as a class of its own")


def test_a_rare_csv_label_is_a_class_when_declared_or_unlike_the_others(tmp_path):
    from veritrain.data.sources import load_source

    rows = [(f"{c}/{c}_{i:02d}.png", c) for c in ("cat", "dog") for i in range(12)] + [("owl/owl_00.png", "owl"), ("x/dgo.png", "dgo")]
    config = _labels_csv(tmp_path, rows)
    declared = load_config(config, ["data.classes=[cat,dog,owl,dgo]"])
    assert load_source(declared.config.data, declared.data_paths).classes == ["cat", "dog", "owl", "dgo"]
    _labels_csv(tmp_path, rows[:-1])  # 'owl' on one row looks like no other label: a small class, judged by the split
    plain = load_config(config, [])
    assert load_source(plain.config.data, plain.data_paths).classes == ["cat", "dog", "owl"]


def test_group_regex_keeps_groups_together(tmp_path):
    root = tmp_path / "raw"
    for c, name in enumerate(("a", "b")):
        for patient in range(6):
            for shot in range(3):
                save(structured_image(c * 1000 + patient * 10 + shot), root / name / f"p{c}{patient}" / f"{shot}.png")
    # every sample sits in a group of 3, so 6 per class cannot follow 80/10/10: reported as split_skew, not refused
    data = prepare_config("data:\n  source: imagefolder\n  root: raw\n  group_regex: '^[ab]/(p\\d+)/'\n  on_split_skew: warn\n", tmp_path)
    where: dict[str, set] = {}
    for sid, split in splits_of(data).items():
        where.setdefault(sid.rsplit("/", 1)[0], set()).add(split)
    assert all(len(s) == 1 for s in where.values())
    assert {next(iter(s)) for s in where.values()} == {"train", "val", "test"}


def test_time_split_puts_latest_in_test(tmp_path):
    root = good_imagefolder(tmp_path / "raw", per_class=10)
    with open(tmp_path / "list.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "timestamp"])
        for c in ("cat", "dog"):
            for i in range(10):
                writer.writerow([f"{c}/{c}_{i:02d}.png", c, f"2024-01-{i + 1:02d}T00:00:0{0 if c == 'cat' else 1}"])
    data = prepare_config("data:\n  source: csv\n  root: raw\n  csv: list.csv\n  split_by: time\n", tmp_path)
    in_splits = splits_of(data)
    latest_train = max(sid for sid, s in in_splits.items() if s == "train").split("_")[-1]
    earliest_test = min(sid.split("_")[-1] for sid, s in in_splits.items() if s == "test")
    assert latest_train < earliest_test


# (timestamp as written, the instant it names in UTC, the format recorded): mixed formats and offsets, listed in
# an order that text comparison would get wrong
TIMESTAMPS = [
    ("2024-01-05T10:00:00+02:00", "2024-01-05T08:00:00", "iso8601_offset"),
    ("1704445200", "2024-01-05T09:00:00", "epoch_seconds"),
    ("2024-01-05T07:30:00Z", "2024-01-05T07:30:00", "iso8601_offset"),
    ("2024-01-05", "2024-01-05T00:00:00", "date"),
    ("2024-01-04T23:00:00-05:00", "2024-01-05T04:00:00", "iso8601_offset"),
    ("2024-01-05 06:00:00", "2024-01-05T06:00:00", "iso8601_no_offset"),
    ("1704412800.5", "2024-01-05T00:00:00.500000", "epoch_seconds"),
    ("2024-01-04T20:00:00+00:00", "2024-01-04T20:00:00", "iso8601_offset"),
    ("2024-01-06T01:00:00+09:00", "2024-01-05T16:00:00", "iso8601_offset"),
]


@pytest.mark.parametrize("written, instant, kind", TIMESTAMPS)
def test_timestamps_parse_to_the_instant_they_name(written, instant, kind):
    from datetime import datetime, timezone

    from veritrain.data.split import parse_instant

    micros, parsed_kind = parse_instant(written)
    expected = datetime.fromisoformat(instant).replace(tzinfo=timezone.utc)
    assert (micros, parsed_kind) == (round(expected.timestamp() * 1_000_000), kind)


@pytest.mark.parametrize("written", ["yesterday", "2024-13-01", "5 Jan 2024", "1e9", "", "99999999999999"])
def test_what_is_not_a_timestamp_is_refused_with_the_formats(written):
    from veritrain.data.split import parse_instant

    with pytest.raises(ValueError, match=r"give ISO 8601 .* a date \(2024-01-05\) or epoch seconds"):
        parse_instant(written)


def test_a_time_split_orders_mixed_formats_by_instant_and_quarantines_what_is_not_a_timestamp(tmp_path):
    from veritrain.data.split import parse_instant

    good_imagefolder(tmp_path / "raw", per_class=10)
    stamps = [written for written, _, _ in TIMESTAMPS]
    stamps += [f"2024-01-0{day}T12:00:00+01:00" for day in range(1, 10)] + ["yesterday", "1704470401"]
    rows = [(f"{c}/{c}_{i:02d}.png", c) for c in ("cat", "dog") for i in range(10)]
    with open(tmp_path / "list.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "timestamp"])
        writer.writerows([path, label, stamp] for (path, label), stamp in zip(rows, stamps))
    data = prepare_config("data:\n  source: csv\n  root: raw\n  csv: list.csv\n  split_by: time\n  split_ratios: [0.6, 0.2, 0.2]\n", tmp_path)
    written = dict((path, stamp) for (path, _), stamp in zip(rows, stamps))
    in_splits = splits_of(data)
    assert "dog/dog_08.png" not in in_splits  # "yesterday"
    (bad,) = [f for f in data.report()["findings"] if f["kind"] == "bad_timestamp"]
    assert bad["samples"] == ["dog/dog_08.png"] and "'yesterday' is not a timestamp" in bad["reason"]
    instant = {sid: parse_instant(written[sid])[0] for sid in in_splits}
    latest = {name: max((instant[s] for s, n in in_splits.items() if n == name), default=None) for name in SPLITS}
    earliest = {name: min((instant[s] for s, n in in_splits.items() if n == name), default=None) for name in SPLITS}
    assert latest["train"] < earliest["val"] and latest["val"] < earliest["test"]
    assert sorted(in_splits, key=written.__getitem__) != sorted(in_splits, key=instant.__getitem__)  # text order is not time
    assert data.info["achieved_split"]["timestamps"]["formats"] == {"date": 1, "epoch_seconds": 3, "iso8601_no_offset": 1, "iso8601_offset": 14}


def test_too_small_class_exits_1(tmp_path):
    from veritrain.data.split import place

    root = good_imagefolder(tmp_path / "raw", per_class=40)
    # keep two dogs that the hash of their content places outside train: the class has nothing to learn from
    dogs = sorted((root / "dog").glob("*.png"))
    kept = [p for p in dogs if place(blake3_file(p), (0.8, 0.1, 0.1), 0) != "train"][:2]
    for p in set(dogs) - set(kept):
        p.unlink()
    with pytest.raises(RunFailed, match="class 'dog' has 2 sample.*none of them placed in train"):
        prepare_config("data:\n  source: imagefolder\n  root: raw\n", tmp_path)


def test_imbalance_is_a_warning(tmp_path):
    root = good_imagefolder(tmp_path / "raw", per_class=12)
    for i in range(12, 40):
        save(structured_image(5000 + i), root / "cat" / f"extra_{i}.png")
    data = prepare_config("data:\n  source: imagefolder\n  root: raw\n  imbalance_ratio: 2\n", tmp_path)
    (finding,) = [f for f in data.report()["findings"] if f["kind"] == "imbalance" and f["reason"].startswith("all splits:")]
    assert finding["severity"] == "warning" and "'cat' has 40" in finding["reason"]


def test_missing_root_is_a_usage_error(tmp_path):
    with pytest.raises(UserError, match="data.root: .*no such folder"):
        prepare_config("data:\n  source: imagefolder\n  root: nowhere\n", tmp_path)


def test_card_warning_when_origin_or_license_missing(tmp_path):
    good_imagefolder(tmp_path / "raw")
    data = prepare_config("data:\n  source: imagefolder\n  root: raw\n", tmp_path)
    warnings = data.report()["card_warnings"]
    assert any("origin" in w for w in warnings) and any("license" in w for w in warnings)
    # editing the card keeps the version
    other = prepare_config("data:\n  source: imagefolder\n  root: raw\n  card: {origin: x, license: y}\n", tmp_path)
    assert other.version == data.version
    assert json.loads((other.path / "card.json").read_text())["origin"] == "x"


def test_labelmap_source(tmp_path):
    root = good_imagefolder(tmp_path / "raw")
    mapping = {p.relative_to(root).as_posix(): p.parent.name for p in root.rglob("*.png")}
    unlabelled = sorted(mapping)[0]
    del mapping[unlabelled]
    (tmp_path / "labels.json").write_text(json.dumps(mapping))
    data = prepare_config("data:\n  source: labelmap\n  root: raw\n  labels: labels.json\n", tmp_path)
    quarantined = {q["sample_id"]: q["kind"] for q in data.report()["quarantined"]}
    assert quarantined == {unlabelled: "missing_label"}


def test_stat_cache_skips_unchanged_files_and_notices_changes(tmp_path):
    from veritrain.core.hashing import StatCache, hash_files

    files = [tmp_path / f"f{i}.bin" for i in range(3)]
    for i, f in enumerate(files):
        f.write_bytes(bytes([i]) * (100 + i * 100_000))  # small and large files
    cache = StatCache(tmp_path / "cache.sqlite")
    first = hash_files(files, cache)
    assert not any(r.cached for r in first.values())
    second = hash_files(files, cache)
    assert all(r.cached for r in second.values()) and second[files[2]].digest == first[files[2]].digest
    files[1].write_bytes(b"changed")
    third = hash_files(files, cache)
    assert not third[files[1]].cached and third[files[1]].digest == blake3_file(files[1])
    assert not any(r.cached for r in hash_files(files, cache, rehash=True).values())
    cache.close()


def test_warn_policy_keeps_usable_samples(faulty, tmp_path):
    _, root, _, _, _ = faulty
    data = prepare_config(FAULTY_CONFIG.format(root=root), tmp_path, ["data.on_bad_file=warn", "data.on_split_skew=warn"])
    quarantined = {q["sample_id"]: q["kind"] for q in data.report()["quarantined"]}
    assert "dog/cat_05_as_dog.png" not in quarantined  # conflicting labels kept, with a warning
    assert quarantined["cat/empty.png"] == "empty"  # what cannot be used stays out
    in_splits = splits_of(data)
    assert in_splits["dog/cat_05_as_dog.png"] == in_splits["cat/cat_05.png"]
    assert data.report()["leakage"]["cross_split_duplicate_pairs"] == 0


# ---------------------------------------------------------------- data.test_split_file, split_by, split_dir, bombs


def test_test_split_file_resolves_against_the_config_folder(tmp_path, monkeypatch):
    good_imagefolder(tmp_path / "raw")
    listed = ["cat/cat_00.png", "dog/dog_00.png"]
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits" / "test_ids.txt").write_text("\n".join(listed) + "\n", encoding="utf-8")
    data = prepare_config("data:\n  source: imagefolder\n  root: raw\n  test_split_file: splits/test_ids.txt\n", tmp_path)
    in_splits = splits_of(data)
    assert all(in_splits[sid] == "test" for sid in listed)
    monkeypatch.setenv("VT_SPLITS", str(tmp_path / "splits"))
    again = prepare_config("data:\n  source: imagefolder\n  root: raw\n  test_split_file: ${env:VT_SPLITS}/test_ids.txt\n", tmp_path)
    assert again.version == data.version


def test_test_split_file_missing_or_not_utf8_is_a_usage_error(tmp_path):
    good_imagefolder(tmp_path / "raw")
    config = "data:\n  source: imagefolder\n  root: raw\n  test_split_file: ids.txt\n"
    with pytest.raises(UserError, match=r"^data.test_split_file: .*ids.txt: file not found; give a file with one sample id per line"):
        prepare_config(config, tmp_path)
    (tmp_path / "ids.txt").write_bytes(b"cat/cat_00.png\n\xff\xfe\n")
    with pytest.raises(UserError, match=r"^data.test_split_file: .*ids.txt: not UTF-8 text .*; save it as UTF-8"):
        prepare_config(config, tmp_path)
    (tmp_path / "ids.txt").unlink()
    (tmp_path / "ids.txt").mkdir()
    with pytest.raises(UserError, match=r"^data.test_split_file: .*ids.txt: cannot read it"):
        prepare_config(config, tmp_path)


@pytest.mark.parametrize("config_text, expected", [
    ("data:\n  source: imagefolder\n  root: raw\n  test_split_file: ids.txt\n",
     "error: data.test_split_file: {tmp}/ids.txt: file not found; give a file with one sample id per line "
     "(relative paths start at the config file's folder)"),
    ("data:\n  split_by: time\n",
     "error: {tmp}/c.yaml: data.split_by: 'time' needs data.source: csv with a timestamp column; "
     "data.source 'digits' has no timestamps, use split_by: random"),
], ids=["missing test_split_file", "time split without timestamps"])
def test_data_config_mistakes_through_the_cli(cli, tmp_path, config_text, expected):
    good_imagefolder(tmp_path / "raw")
    config = tmp_path / "c.yaml"
    config.write_text(config_text)
    result = cli("data", "prepare", str(config), "--workdir", str(tmp_path))
    assert result.code == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == expected.format(tmp=tmp_path)


@pytest.mark.parametrize("source", ["digits", "imagefolder", "labelmap", "cifar10"])
def test_time_split_needs_timestamps(tmp_path, source):
    from veritrain.core.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(None, [f"data.source={source}", "data.split_by=time"])
    assert str(info.value) == (f"--set: data.split_by: 'time' needs data.source: csv with a timestamp column; "
                               f"data.source {source!r} has no timestamps, use split_by: random")


def test_time_split_on_a_registered_source_without_timestamps(tmp_path, monkeypatch):
    from veritrain.core import source_registry
    from veritrain.core.config import DataConfig
    from veritrain.data import sources

    root = good_imagefolder(tmp_path / "raw")
    monkeypatch.setitem(sources.SOURCES, "stamped", sources.load_imagefolder_source)
    monkeypatch.setattr(source_registry, "TIMESTAMPED_SOURCES", {*source_registry.TIMESTAMPED_SOURCES, "stamped"})
    cfg = DataConfig(source="stamped", split_by="time")  # declared to have timestamps, gives none
    with pytest.raises(UserError, match=r"^data.split_by: 'time' needs data.source: csv with a timestamp column; .*'stamped'"):
        prepare.run(cfg, {"root": root}, tmp_path / "ws")


def labelmap_fixture(tmp_path: Path) -> Path:
    root = good_imagefolder(tmp_path / "raw")
    mapping = {p.relative_to(root).as_posix(): p.parent.name for p in root.rglob("*.png")}
    (tmp_path / "labels.json").write_text(json.dumps(mapping))
    return root


LABELMAP_SPLITS = "data:\n  source: labelmap\n  root: raw\n  labels: labels.json\n  split_dir: lists\n"


def test_labelmap_split_dir_fixes_the_split(tmp_path):
    labelmap_fixture(tmp_path)
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "test.txt").write_text("cat/cat_03.png\ndog/dog_04.png\n", encoding="utf-8")
    in_splits = splits_of(prepare_config(LABELMAP_SPLITS, tmp_path))
    assert in_splits["cat/cat_03.png"] == in_splits["dog/dog_04.png"] == "test"


def test_labelmap_split_dir_missing_or_unreadable_is_a_usage_error(tmp_path):
    labelmap_fixture(tmp_path)
    with pytest.raises(UserError, match=r"^data.split_dir: .*lists: no such folder; give the folder holding train.txt, val.txt, test.txt"):
        prepare_config(LABELMAP_SPLITS, tmp_path)
    (tmp_path / "lists").mkdir()
    with pytest.raises(UserError, match=r"^data.split_dir: .*lists: none of train.txt, val.txt, test.txt in it"):
        prepare_config(LABELMAP_SPLITS, tmp_path)
    (tmp_path / "lists" / "train.txt").write_bytes(b"cat/cat_00.png\n\xff\n")
    with pytest.raises(UserError, match=r"^data.split_dir: .*train.txt: not UTF-8 text .*; save it as UTF-8"):
        prepare_config(LABELMAP_SPLITS, tmp_path)
    (tmp_path / "lists" / "train.txt").unlink()
    (tmp_path / "lists" / "test.txt").mkdir()  # a folder where a file should be: reading it fails
    with pytest.raises(UserError, match=r"^data.split_dir: .*test.txt: cannot read it"):
        prepare_config(LABELMAP_SPLITS, tmp_path)


def huge_png(path: Path, width: int, height: int) -> Path:
    """A valid 1-bit PNG of width × height pixels, a few kilobytes on disk (rows of zeros compress well)."""
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    compressor = zlib.compressobj(9)
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


def test_huge_image_is_a_bomb_even_in_a_fresh_process(tmp_path, monkeypatch):
    from PIL import Image

    from veritrain.data import validate

    # 200 M pixels: over twice Pillow's default limit, where Image.open itself refuses the file
    path = str(huge_png(tmp_path / "huge.png", 20_000, 10_000))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)  # Pillow's default, as in a fresh process
    header = validate.read_header(path)
    assert header.error is None and (header.width, header.height) == (20_000, 10_000)
    check = validate.check_file(path, header, validate.CheckParams(32, 32, 1, False, 50_000_000, False), False)
    assert [kind for kind, _ in check.findings] == ["bomb"]
    assert "data.max_pixels 50,000,000" in check.findings[0][1]


def test_cache_lookups_of_more_keys_than_sqlite_binds_at_once(tmp_path):
    from veritrain.core.hashing import SQLITE_MAX_PARAMS, StatCache

    cache = StatCache(tmp_path / "files.sqlite")
    rows = [(f"/data/{i}.png", i, i * 10, i, "blake3", f"{i:064x}") for i in range(2 * SQLITE_MAX_PARAMS + 7)]
    cache.store(rows)
    wanted = [r[0] for r in rows] + ["/data/missing.png"]
    found = cache.lookup(wanted)
    assert found == {path: tuple(rest) for path, *rest in rows}
    cache.close()


def test_the_check_cache_keeps_each_image_in_compact_rows_and_drops_the_earlier_json_table(tmp_path):
    import sqlite3

    from veritrain.data.validate import Check, CheckCache, CheckParams

    old = sqlite3.connect(tmp_path / "images.sqlite")  # the earlier layout: JSON with hex pixels
    old.execute("CREATE TABLE checks (hash TEXT, params TEXT, json TEXT, PRIMARY KEY (hash, params))")
    old.execute("INSERT INTO checks VALUES ('h', 'p', ?)", ("x" * 4500,))
    old.commit()
    old.close()
    rng = np.random.default_rng(0)
    checks = {f"{i:064x}": Check([("grayscale", "one channel")] if i % 2 else [], (1 << 64) - 1 - i,
                                 rng.integers(0, 256, size=(32, 32), dtype=np.uint8), rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8))
              for i in range(1000)}
    checks["f" * 64] = Check([("undecodable", "cannot be decoded")])  # no pictures, no hash
    params = CheckParams(8, 8, 1, False, 50_000_000, True)
    cache = CheckCache(tmp_path / "images.sqlite")
    assert cache.db.execute("SELECT name FROM sqlite_master WHERE name = 'checks'").fetchone() is None
    cache.store_checks(checks, params)
    back = cache.checks(list(checks), params)
    cache.close()
    for key, check in checks.items():
        got = back[key]
        assert (got.findings, got.phash) == (check.findings, check.phash)
        for a, b in ((got.picture, check.picture), (got.thumb, check.thumb)):
            assert (a is None and b is None) or np.array_equal(a, b)
    per_image = (tmp_path / "images.sqlite").stat().st_size / len(checks)
    assert per_image < 2.5 * 1024, per_image  # the JSON with hex pixels took about 4.5 KiB
