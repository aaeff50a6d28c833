"""imagefolder, csv and cifar10 data prepare and train end to end through `veritrain run`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from datafixtures import good_imagefolder
from veritrain.data.cifar10 import write_fake_cifar10

TINY = "model:\n  name: cnn\n  widths: [8, 16]\ntrain:\n  epochs: 1\n  batch_size: 8\n"


def run_config(cli, tmp_path: Path, data_yaml: str) -> dict:
    config = tmp_path / "exp.yaml"
    config.write_text(data_yaml + TINY, encoding="utf-8")
    result = cli("run", str(config), "--workdir", str(tmp_path / "ws"), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    record = json.loads((Path(payload["run_dir"]) / "record.json").read_text())
    assert record["status"] == "completed"
    assert record["data"]["leakage_pairs"] == 0
    return record


def test_imagefolder_end_to_end(cli, tmp_path):
    good_imagefolder(tmp_path / "images", classes=("cat", "dog", "owl"), per_class=10)
    record = run_config(cli, tmp_path, "data:\n  source: imagefolder\n  root: images\n")
    assert record["data"]["classes"] == ["cat", "dog", "owl"]
    assert sum(record["data"]["counts"].values()) == 30
    assert record["config_source"]["data_root"] == "images"
    assert record["config_source"]["data_root_resolved"] == str((tmp_path / "images").resolve())
    assert "accuracy" in record["metrics"]["test"]


def test_csv_end_to_end(cli, tmp_path):
    root = good_imagefolder(tmp_path / "images", per_class=15)
    with open(tmp_path / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "group"])
        for p in sorted(root.rglob("*.png")):
            rel = p.relative_to(root).as_posix()
            writer.writerow([rel, "left" if p.parent.name == "cat" else "right", f"{p.parent.name}{int(p.stem[-2:]) // 2}"])  # pairs share a group
    # 15 pairs, each placed whole by the hash of its smaller key: 23 / 3 / 4, within chance of 80/10/10 (no split_skew);
    # with 10 pairs the val split would get none, which training refuses since best.pt selects on it
    record = run_config(cli, tmp_path, "data:\n  source: csv\n  root: images\n  csv: labels.csv\n")
    assert record["data"]["classes"] == ["left", "right"]
    assert record["data"]["counts"] == {"train": 23, "val": 3, "test": 4}


def test_cifar10_end_to_end(cli, tmp_path):
    write_fake_cifar10(tmp_path / "cifar", per_batch=20)
    record = run_config(cli, tmp_path, "data:\n  source: cifar10\n  root: cifar\n")
    assert record["data"]["counts"]["test"] == 20  # the official test batch, unchanged
    assert record["data"]["counts"]["train"] + record["data"]["counts"]["val"] == 100
    assert len(record["data"]["classes"]) == 10


def test_cifar10_missing_folder_is_one_line_exit_2(cli, tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text("data:\n  source: cifar10\n  root: nowhere\n")
    result = cli("data", "prepare", str(config), "--workdir", str(tmp_path))
    assert result.code == 2
    assert result.stderr.startswith(f"error: data.root: {tmp_path / 'nowhere'}: CIFAR-10 not found")
    assert result.stderr.count("\n") == 1


def test_data_report_and_diff_commands(cli, tmp_path):
    good_imagefolder(tmp_path / "images", per_class=10)
    config = tmp_path / "d.yaml"
    config.write_text("data:\n  source: imagefolder\n  root: images\n")
    first = cli("data", "prepare", str(config), "--workdir", str(tmp_path), "--json").json()
    second = cli("data", "prepare", str(config), "--set", "data.split_seed=7", "--workdir", str(tmp_path), "--json").json()
    assert first["data_version"] != second["data_version"]
    again = cli("data", "prepare", str(config), "--workdir", str(tmp_path), "--json").json()
    assert again["data_version"] == first["data_version"] and again["reused"] is True

    report = cli("data", "report", first["data_version"][:10], "--workdir", str(tmp_path), "--json")
    assert report.code == 0 and report.json()["data_version"] == first["data_version"]
    text = cli("data", "report", first["data_version"], "--workdir", str(tmp_path))
    assert text.stdout.startswith("# Data report")

    diff = cli("data", "diff", first["data_version"], second["data_version"], "--workdir", str(tmp_path), "--json").json()
    assert diff["added"] == [] and diff["removed"] == [] and diff["relabelled"] == []
    assert diff["moved"] and all(m["old"] != m["new"] for m in diff["moved"])

    missing = cli("data", "report", "ffff0000", "--workdir", str(tmp_path))
    assert missing.code == 2 and missing.stderr.startswith("error: ffff0000: neither a data version")
