"""The typed run record (`veritrain.records.record.RunRecord`): docs/record.md documents exactly its fields, the
writer never writes a record its readers would refuse, and every reader refuses a forged field in one line
while the other runs keep listing."""

from __future__ import annotations

import json
import re
import shutil
import tarfile
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from veritrain.core.errors import RunFailed
from veritrain.records.record import RunRecord, record_problem, write_record
from veritrain.trust.verify import compare_runs

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "tests" / "fixtures" / "legacy"
LEGACY_COMPLETED = "20261130-064052-598-fd2b78"  # legacy-completed.tar.gz: the oldest completed run


def documented_rows() -> dict[str, tuple[str, str]]:
    """Field name → (type column, meaning column) of the fields table in docs/record.md."""
    text = (ROOT / "docs" / "record.md").read_text(encoding="utf-8")
    table = text.split("## Fields", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        names, kind, meaning = (cell.strip() for cell in line.strip().strip("|").split("|", 2))
        for name in names.replace("`", "").replace(" ", "").split(","):
            rows[name] = (kind, meaning)
    return rows


def json_kind(annotation) -> set[str]:
    """The words docs/record.md uses for the JSON types an annotation admits."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        return set().union(*(json_kind(a) for a in typing.get_args(annotation) if a is not type(None)))
    if origin is typing.Annotated:
        return json_kind(typing.get_args(annotation)[0])
    if origin is typing.Literal or annotation is str:
        return {"string"}
    if annotation is int:
        return {"int"}
    if annotation is float:
        return {"number"}
    if origin is list:
        return {"list"}
    if origin is dict or annotation is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return {"object"}
    raise AssertionError(f"no documented JSON type for {annotation!r}")


def part_model(annotation):
    """The sub-model a field holds (itself, or its list items; not a dict's values), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union):
        for arg in typing.get_args(annotation):
            found = part_model(arg)
            if found is not None:
                return found
    return None


def test_docs_record_md_documents_exactly_the_fields_of_the_record_model():
    rows = documented_rows()
    fields = RunRecord.model_fields
    assert set(rows) == set(fields), (f"fields without a row in docs/record.md: {sorted(set(fields) - set(rows))}; "
                                      f"rows without a field: {sorted(set(rows) - set(fields))}")
    for name, field in fields.items():
        kind, meaning = rows[name]
        assert kind.split()[0] in json_kind(field.annotation), f"{name}: documented as {kind!r}, the model says {json_kind(field.annotation)}"
        part = part_model(field.annotation)
        if part is not None:  # each field of a part is named in its row
            missing = [sub for sub in part.model_fields if f"`{sub}`" not in meaning]
            assert not missing, f"docs/record.md: the row of `{name}` does not name {missing}"


def test_a_field_documented_without_or_null_refuses_null_and_the_others_take_it():
    """docs/record.md's "or null" is the model's: a reader can use a field's value whenever the field is there."""
    minimal = {"record_version": 1, "run_id": LEGACY_COMPLETED, "status": "completed", "started_at": "2026-01-01T00:00:00.000Z", "config": {}}
    assert record_problem(minimal, LEGACY_COMPLETED) is None
    for name, (kind, _) in documented_rows().items():
        problem = record_problem({**minimal, name: None}, LEGACY_COMPLETED if name != "run_id" else None)
        assert (problem is None) == ("or null" in kind), f"{name} ({kind}): {problem}"


def legacy_records(tmp_path: Path) -> list[Path]:
    for archive in sorted(LEGACY.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path, filter="data")
    return sorted(tmp_path.glob("runs/*/record.json"))


def test_records_made_by_earlier_code_are_valid(tmp_path):
    records = legacy_records(tmp_path)
    assert records
    for path in records:
        assert record_problem(json.loads(path.read_text()), path.parent.name) is None, path


def test_the_writer_never_writes_a_record_its_readers_would_refuse(tmp_path):
    [source] = legacy_records(tmp_path)[:1]
    record = json.loads(source.read_text())
    run_dir = tmp_path / "new" / record["run_id"]
    run_dir.mkdir(parents=True)
    record["training"] = {"epochs": "2", "steps": 46}  # a bug in a writer: a count written as text
    with pytest.raises(ValidationError):
        write_record(run_dir, record)
    assert not (run_dir / "record.json").exists() and not (run_dir / "record.sha256").exists()
    record["training"] = {"epochs": 2, "steps": 46}
    seal = write_record(run_dir, record)
    assert (run_dir / "record.sha256").read_text().strip() == seal


FORGERIES = {  # what a forger changes → the words the refusal names
    "seed as text": (lambda r: r.__setitem__("seed", "0"), "seed"),
    "unknown status": (lambda r: r.__setitem__("status", "verified"), "status"),
    "a hash that is not one": (lambda r: r.__setitem__("final_state_sha256", "../../etc/passwd"), "final_state_sha256"),
    "an artifact outside the run": (lambda r: r["artifacts"].__setitem__("../outside.txt", {"sha256": "0" * 64, "size": 1}), "artifacts"),
    "a negative size": (lambda r: next(iter(r["artifacts"].values())).__setitem__("size", -1), "size"),
    "a seal history of text": (lambda r: r.__setitem__("seal_history", ["abc"]), "seal_history"),
    "events as an object": (lambda r: r.__setitem__("events", {"kind": "x"}), "events"),
    "a repeat index below zero": (lambda r: r.__setitem__("repeat", {"group": "g", "index": -1, "of": 2}), "repeat.index"),
    "a float for the epochs": (lambda r: r.__setitem__("training", {**(r["training"] or {}), "epochs": 1.5}), "training.epochs"),
    "an error without a message": (lambda r: r.__setitem__("error", {"type": "X"}), "error.message"),
}


@pytest.fixture
def forged_workspace(tmp_path):
    """A workspace holding the legacy fixture's completed run and, beside it, one forged copy per forgery."""
    legacy_records(tmp_path)
    [good] = [p.parent for p in tmp_path.glob("runs/*/record.json") if p.parent.name == LEGACY_COMPLETED]
    for other in tmp_path.glob("runs/*"):
        if other != good:
            shutil.rmtree(other)
    planted = {}
    for number, (label, (change, _)) in enumerate(FORGERIES.items(), start=1):
        run_id = f"20261130-000000-000-{number:06x}"
        record = json.loads((good / "record.json").read_text())
        record["run_id"] = run_id
        change(record)
        (tmp_path / "runs" / run_id).mkdir()
        (tmp_path / "runs" / run_id / "record.json").write_text(json.dumps(record))
        planted[label] = run_id
    return tmp_path, good.name, planted


def test_every_reader_refuses_each_forged_field_in_one_line(cli, forged_workspace):
    workdir, good, planted = forged_workspace
    listed = cli("runs", "list", "--json", "--workdir", str(workdir))
    assert listed.code == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert [r["run_id"] for r in listed.json()["runs"]] == [good]
    warnings = [line for line in listed.stderr.splitlines() if "not listed" in line]
    assert len(warnings) == len(FORGERIES), listed.stderr
    for label, run_id in planted.items():
        words = FORGERIES[label][1]
        [line] = [w for w in warnings if run_id in w]
        assert words in line, (label, line)
        for command in (["runs", "show", run_id, "--json"], ["runs", "compare", good, run_id, "--json"]):
            shown = cli(*command, "--workdir", str(workdir))
            errors = [e for e in shown.stderr.splitlines() if e.startswith("error:")]
            assert shown.code == 1 and len(errors) == 1 and words in errors[0] and "Traceback" not in shown.stderr, (label, command, shown.stderr)
        # the comparison reproduce makes reads both records through their validation too
        with pytest.raises(RunFailed, match=re.escape(words)):
            compare_runs(workdir / "runs" / good, workdir / "runs" / run_id)
        archived = cli("archive", run_id, "-o", str(workdir / f"{run_id}.tar.gz"), "--workdir", str(workdir))
        errors = [e for e in archived.stderr.splitlines() if e.startswith("error:")]
        assert archived.code == 1 and len(errors) == 1 and "Traceback" not in archived.stderr, (label, archived.stderr)
        assert not (workdir / f"{run_id}.tar.gz").exists()
    reindexed = cli("runs", "reindex", "--workdir", str(workdir))
    assert reindexed.code == 0 and "Traceback" not in reindexed.stderr
    experiments = (workdir / "experiments.md").read_text() if (workdir / "experiments.md").exists() else ""
    assert not any(run_id in experiments for run_id in planted.values())
