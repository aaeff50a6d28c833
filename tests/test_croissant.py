"""The Croissant 1.0 record of a data version (veritrain.data.croissant): `mlcroissant validate` passes on image,
text and earlier-recipe versions with warnings only for what the card leaves empty, mlcroissant loads the manifest's
rows back, every FileObject's sha256 is its file's, and card values, hostile ones included, are carried exactly."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import need_extra
from datafixtures import FAULTY_CONFIG, faulty_imagefolder

from veritrain.core.config import DataConfig, load_config
from veritrain.core.errors import UserError
from veritrain.data import croissant, prepare
from veritrain.data.report import card_warnings

pytestmark = pytest.mark.filterwarnings("ignore:ConjunctiveGraph is deprecated:DeprecationWarning")  # rdflib, under mlcroissant

LEGACY = Path(__file__).parent / "fixtures" / "legacy" / "legacy-completed.tar.gz"
EMPTY_CARD = {"origin": None, "license": None, "collection": None, "limitations": None, "contact": None}
SECRET_URL = "https://deploy:hunter2-Very-Secret@example.com/repo.git"
EMAIL = "alice.example@example.org"


@pytest.fixture(autouse=True)
def _mlcroissant():
    need_extra(importlib.util.find_spec("mlcroissant") is not None, "mlcroissant is not installed (pip install mlcroissant)")


def validate(path: Path) -> list[str]:
    """`mlcroissant validate --jsonld path`: asserts it passes without errors; returns the properties it warns are missing."""
    script = Path(sys.executable).parent / "mlcroissant"
    command = [str(script)] if script.exists() else [sys.executable, "-c", "import sys; from mlcroissant.scripts.cli import main; sys.exit(main())"]
    done = subprocess.run([*command, "validate", "--jsonld", str(path)], capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "error(s)" not in output, output[-4000:]
    missing = re.findall(r'Property "https://schema.org/(\w+)" is recommended, but does not exist', output)
    counted = re.findall(r"Found the following (\d+) warning\(s\)", output)
    assert sum(map(int, counted[:1])) == len(set(missing)), output[-4000:]  # nothing else is warned about
    return sorted(set(missing))


def records(path: Path, record_set: str) -> list[dict]:
    import mlcroissant as mlc

    return list(mlc.Dataset(jsonld=str(path)).records(record_set))  # a fresh Dataset: a second `records` of one yields nothing


def _str(value) -> str | None:
    return value.decode("utf-8") if isinstance(value, bytes) else None if value is None else str(value)


def manifest_rows(version_dir: Path) -> list[tuple]:
    with open(version_dir / "manifest.csv", newline="", encoding="utf-8") as f:
        # an empty cell comes back as None (pandas reads it as missing)
        return [(r["sample_id"], r["label"] or None, r["split"] or None, r["blake3"] or None, r["status"]) for r in csv.DictReader(f)]


def loaded_rows(path: Path) -> list[tuple]:
    return [(_str(r["manifest/sample_id"]), _str(r["manifest/label"]), _str(r["manifest/split"]), _str(r["manifest/blake3"]),
             _str(r["manifest/status"])) for r in records(path, "manifest")]


def assert_files_hash_to_their_sha256(doc: dict, version_dir: Path) -> None:
    for obj in doc["distribution"]:
        if obj["@type"] == "cr:FileSet":  # a field's shards: bound block by block in version.json
            info = json.loads((version_dir / "version.json").read_text(encoding="utf-8"))
            field = info["fields"][obj["name"].removeprefix("fields/")]
            named = [f"fields/{e['id'][:2]}/{e['id']}" for e in field["shards"]]  # under the document's base, if any
            assert len(obj["includes"]) == len(named) and all(i.endswith(n) for i, n in zip(obj["includes"], named))
            assert all((version_dir / name).stat().st_size == e["size"] for name, e in zip(named, field["shards"]))
            continue
        file = version_dir / obj["name"]
        assert obj["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest(), obj["name"]
        assert obj["contentSize"] == f"{file.stat().st_size} B"


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return prepare.run(DataConfig(), {}, tmp_path_factory.mktemp("state")).path


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("faulty")
    faulty_imagefolder(tmp / "raw")
    (tmp / "data.yaml").write_text(FAULTY_CONFIG.format(root=tmp / "raw"), encoding="utf-8")
    resolved = load_config(tmp / "data.yaml", [])
    return prepare.run(resolved.config.data, resolved.data_paths, tmp / "ws" / ".veritrain").path


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("text")
    rng = random.Random(0)
    vocabulary = [f"w{k}" for k in range(400)]
    rows = [{"id": f"doc-{k:02d}", "text": " ".join(rng.choice(vocabulary) for _ in range(80))} for k in range(40)]
    rows[3]["text"] += f" clone it from {SECRET_URL} now"
    rows[5]["text"] += f" write to {EMAIL} or bob@example.com"
    (tmp / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    resolved = load_config(None, ["task=lm", "model.name=gpt", "data.source=jsonl", f"data.root={tmp / 'docs.jsonl'}",
                                  "data.tokenizer.kind=byte_level"])
    return prepare.run(resolved.config.data, resolved.data_paths, tmp / ".veritrain").path


@pytest.fixture(scope="module")
def legacy(tmp_path_factory) -> Path:
    """The data version a run of an earlier veritrain prepared (recipe 2: no `files`, `reports` or manifest key/unit)."""
    tmp = tmp_path_factory.mktemp("legacy")
    with tarfile.open(LEGACY) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(".veritrain/data/")]
        archive.extractall(tmp, members=members, filter="data")
    (version,) = (tmp / ".veritrain" / "data").iterdir()
    return version


def test_an_image_version_validates_and_mlcroissant_loads_its_manifest_back(digits, tmp_path):
    before = sorted(p.relative_to(digits) for p in digits.rglob("*"))
    out = tmp_path / "elsewhere" / "digits.croissant.json"
    out.parent.mkdir()
    warnings = croissant.write(digits, out)
    assert warnings == ["data.card.contact is missing: say who answers questions about the data"]  # the shipped card gives no contact
    assert sorted(p.relative_to(digits) for p in digits.rglob("*")) == before  # nothing written inside the version
    assert validate(out) == []
    assert loaded_rows(out) == manifest_rows(digits)
    info = json.loads((digits / "version.json").read_text())
    assert {r["splits/name"]: r["splits/samples"] for r in records(out, "splits")} == info["counts"]
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["conformsTo"] == "http://mlcommons.org/croissant/1.0" and doc["@context"]["rai"] == "http://mlcommons.org/croissant/RAI/"
    assert doc["identifier"] == info["data_version"] and doc["version"] == f"0.0.0+{info['data_version']}"
    assert doc["datePublished"] == doc["dateCreated"] == info["created_at"]
    files = [o for o in doc["distribution"] if o["@type"] == "cr:FileObject"]
    assert [o["name"] for o in files] == list(info["files"])
    assert [o["name"] for o in doc["distribution"] if o["@type"] == "cr:FileSet"] == ["fields/image", "fields/label"]
    assert_files_hash_to_their_sha256(croissant.document(digits), digits)  # relative paths, inside the version
    assert all(o["contentUrl"] == str(digits.resolve() / o["name"]) for o in files)  # written elsewhere: absolute
    assert all(name.startswith(str(digits.resolve()) + "/fields/") for o in doc["distribution"] if o["@type"] == "cr:FileSet"
               for name in o["includes"])
    splits = {rs["@id"]: rs for rs in doc["recordSet"]}["splits"]
    assert splits["dataType"] == "cr:Split" and [r["splits/url"] for r in splits["data"]] == ["cr:TrainingSplit", "cr:ValidationSplit", "cr:TestSplit"]
    card = json.loads((digits / "card.json").read_text())
    assert doc["license"] == card["license"] and doc["isBasedOn"] == card["origin"] and doc["rai:dataCollection"] == card["collection"]
    assert "'3' 145 / 17 / 21" in doc["rai:dataBiases"] and "Quarantined: 0 of 1797." in doc["rai:dataBiases"]
    assert doc["rai:personalSensitiveInformation"].startswith("Not scanned")


def test_a_record_in_the_version_folder_uses_relative_paths_and_moves_with_it(digits, tmp_path):
    copy = tmp_path / "ws" / digits.name
    shutil.copytree(digits, copy)
    out = copy / "croissant.json"  # written by prepare, among the version's reports
    assert json.loads((copy / "version.json").read_text())["reports"]["croissant.json"] == hashlib.sha256(out.read_bytes()).hexdigest()
    with pytest.raises(UserError, match="a file of the data version"):
        croissant.write(copy, out)  # never replaced: write another one elsewhere
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert all(o["contentUrl"] == o["name"] for o in doc["distribution"] if o["@type"] == "cr:FileObject")
    assert all(name.startswith("fields/") for o in doc["distribution"] if o["@type"] == "cr:FileSet" for name in o["includes"])
    moved = tmp_path / "moved" / digits.name
    shutil.move(copy, moved)
    assert loaded_rows(moved / "croissant.json") == manifest_rows(digits)
    published = croissant.document(digits, base="https://data.example.org/v1/")
    assert published["distribution"][0]["contentUrl"] == "https://data.example.org/v1/manifest.csv"


def test_a_text_version_lists_its_tokens_and_what_the_scanner_flagged_by_count_only(text, tmp_path):
    out = tmp_path / "text.json"
    warnings = croissant.write(text, out)
    assert "data.card.license is missing: say under which license it may be used" in warnings  # a JSONL file knows no license
    assert validate(out) == ["license"]  # the card field the corpus left empty
    assert loaded_rows(out) == manifest_rows(text)
    doc = json.loads(out.read_text(encoding="utf-8"))
    names = [o["name"] for o in doc["distribution"]]
    streams = {f"fields/tokens_{split}" for split in ("train", "val", "test") if json.loads((text / "version.json").read_text())["tokens"][split]}
    assert "tokenizer.json" in names and "fields/tokens_train" in streams and streams <= set(names)
    assert_files_hash_to_their_sha256(doc, text)
    info = json.loads((text / "version.json").read_text())
    assert {r["splits/name"]: (r["splits/samples"], r["splits/tokens"]) for r in records(out, "splits")} == \
        {name: (info["counts"][name], info["tokens"][name]) for name in ("train", "val", "test")}
    sensitive = doc["rai:personalSensitiveInformation"]
    assert "1 document(s) hold a secret (a URL password (scheme://user:password@host): 1)" in sensitive
    # the URL's user:password@host is an e-mail address by its shape too: 2 documents, 3 addresses
    assert "2 document(s) hold 3 e-mail address(es)" in sensitive
    written = out.read_text(encoding="utf-8")
    assert "hunter2" not in written and EMAIL not in written and "bob@example.com" not in written


@pytest.mark.parametrize("card", [EMPTY_CARD, {}], ids=["fields-empty", "no-fields"])
def test_an_empty_card_gives_one_warning_per_field_and_still_validates(digits, tmp_path, card):
    out = tmp_path / "empty.json"
    warnings = croissant.write(digits, out, card=card)
    expected = card_warnings(card) + ([] if not card else [
        "data.card.collection is missing: say how the data was collected and labelled",
        "data.card.limitations is missing: say known gaps, biases or label noise",
        "data.card.contact is missing: say who answers questions about the data"])
    assert warnings == expected and warnings[:2] == [
        "data.card.origin is missing: say where the data comes from", "data.card.license is missing: say under which license it may be used"]
    assert validate(out) == ["license"]  # the one recommended property only the card can give
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert not {"license", "isBasedOn", "maintainer", "creator"} & set(doc)
    assert doc["rai:dataCollection"] == "Not given (data.card.collection is empty)."
    assert doc["rai:dataLimitations"] == "Not given (data.card.limitations is empty)."
    assert "data from" not in doc["citeAs"]


HOSTILE = {
    "origin": "line one\nline two \"quoted\" 'single' \\backslash\\ \t tab",
    "license": "<script>alert(\"x\")</script> &amp; </p>",
    "collection": "x" * 200_000,
    "limitations": "ünïcødé 日本語 العربية 🥐 \u2028 \u0000 end",
    "contact": "{\"@id\": \"not json-ld\"} ${env:HOME}",
    "name": "  a name with trailing spaces  ",
}


def test_hostile_card_values_are_carried_exactly(digits, tmp_path):
    out = tmp_path / "hostile.json"
    assert croissant.write(digits, out, card=HOSTILE) == []
    doc = json.loads(out.read_bytes().decode("utf-8"))
    assert doc["isBasedOn"] == HOSTILE["origin"] and doc["license"] == HOSTILE["license"]
    assert doc["rai:dataCollection"] == HOSTILE["collection"] and doc["rai:dataLimitations"] == HOSTILE["limitations"]
    assert doc["maintainer"] == HOSTILE["contact"] and doc["name"] == HOSTILE["name"]
    assert validate(out) == []
    surrogate = {**HOSTILE, "origin": "lone \udc80 surrogate"}  # valid JSON in a hand-edited card.json, not Unicode
    croissant.write(digits, out, card=surrogate)
    assert json.loads(out.read_bytes().decode("ascii"))["isBasedOn"] == surrogate["origin"]


def test_a_version_with_quarantined_samples_loads_back_and_reports_them(faulty, tmp_path):
    out = tmp_path / "faulty.json"
    croissant.write(faulty, out)
    assert validate(out) == []
    rows = manifest_rows(faulty)
    assert any(r[4] == "quarantined" and r[1] is None for r in rows)  # stray.png: no label, no split
    assert loaded_rows(out) == rows
    with open(faulty / "quarantine.csv", newline="", encoding="utf-8") as f:
        quarantined = [(r["sample_id"], r["kind"], r["reason"]) for r in csv.DictReader(f)]
    assert [(_str(r["quarantine/sample_id"]), _str(r["quarantine/kind"]), _str(r["quarantine/reason"]))
            for r in records(out, "quarantine")] == quarantined
    biases = json.loads(out.read_text(encoding="utf-8"))["rai:dataBiases"]
    assert f"Quarantined: {len(quarantined)} of {len(rows)} (" in biases and "missing_label 1" in biases and "bomb 1" in biases


def test_a_version_of_an_earlier_recipe_validates_with_its_files_hashed(legacy, tmp_path):
    out = tmp_path / "legacy.json"
    assert croissant.write(legacy, out) == ["data.card.contact is missing: say who answers questions about the data"]
    assert validate(out) == []
    assert loaded_rows(out) == manifest_rows(legacy)
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert [o["name"] for o in doc["distribution"]] == ["manifest.csv", "quarantine.csv", "splits/train.txt", "splits/val.txt",
                                                         "splits/test.txt", "inputs.npy", "targets.npy"]
    assert_files_hash_to_their_sha256(doc, legacy)
    assert "recipe 2" in doc["description"] and "Label issues and outliers: not checked" in doc["rai:dataBiases"]


def test_write_is_canonical_and_never_replaces_a_file_of_the_version(digits, tmp_path):
    out = tmp_path / "c.json"
    croissant.write(digits, out)
    first = out.read_bytes()
    croissant.write(digits, out)
    assert out.read_bytes() == first and first.endswith(b"}\n")
    doc = json.loads(first)
    assert first == (json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    assert doc == croissant.document(digits, base=str(digits.resolve()))
    for name in ("version.json", "card.json", "manifest.csv", "splits/train.txt", "data_report.json"):
        kept = (digits / name).read_bytes()
        with pytest.raises(UserError, match="a file of the data version"):
            croissant.write(digits, digits / name)
        assert (digits / name).read_bytes() == kept
    with pytest.raises(UserError, match="does not exist"):
        croissant.write(digits, tmp_path / "no" / "such" / "c.json")
    with pytest.raises(UserError, match="not a data version"):
        croissant.write(tmp_path, tmp_path / "x.json")


def test_the_card_given_replaces_the_versions_card(digits, tmp_path):
    doc = croissant.document(digits, card={"license": "CC0-1.0", "name": "digits, as we use them", "citation": "@misc{digits}"})
    assert doc["license"] == "CC0-1.0" and doc["name"] == "digits, as we use them" and doc["citeAs"] == "@misc{digits}"
    assert "isBasedOn" not in doc  # the version's card.json gives an origin; the card given does not
    # a hand-edited card.json may spell the origin out; its creator is schema.org's author (mlcroissant types `creator`)
    card = {"origin": {"source": "UCI ML Repository", "url": "https://archive.ics.uci.edu/dataset/80", "creator": "E. Alpaydin"},
            "license": "CC BY 4.0"}
    out = tmp_path / "spelled-out.json"
    croissant.write(digits, out, card=card)
    assert validate(out) == []
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["isBasedOn"] == ["UCI ML Repository", "https://archive.ics.uci.edu/dataset/80"] and doc["author"] == "E. Alpaydin"
    assert doc["citeAs"].endswith("; data from: UCI ML Repository; https://archive.ics.uci.edu/dataset/80.")


def test_the_data_report_names_every_card_field_the_record_leaves_out(digits, tmp_path):
    from veritrain.data.identity import load_version

    report = load_version(digits).report()
    warnings = croissant.write(digits, tmp_path / "c.json")
    assert warnings == report["card_gaps"] and "data.card.contact is missing: say who answers questions about the data" in warnings
    assert set(report["card_warnings"]) <= set(report["card_gaps"])
