"""One owner for the run record: only veritrain.records.record, veritrain.records.recorder and veritrain.records.journal write record.json
or record.sha256 or change a record; every other module reads records through read_record, which gives them
validated and read-only. The rule is checked on the source (an AST walk) and on the objects themselves."""

from __future__ import annotations

import ast
import copy
import json
import pickle
import re
from pathlib import Path

import pytest

from veritrain.records.record import FrozenList, Record, frozen, read_record, thawed

SRC = Path(__file__).resolve().parents[1] / "src" / "veritrain"
OWNERS = {"records/record.py", "records/recorder.py", "records/journal.py"}  # relative to src/veritrain
RECORD_NAME = re.compile(r"^(\w+_)?record$")  # record, old_record, opened.record …
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "remove", "sort", "reverse"}
RECORD_FILES = {"record.json", "record.sha256", "RECORD_FILE", "SEAL_FILE"}
WRITERS = {"write_record", "sealed_bytes"}  # veritrain.records.record's writers, for the owner's use


def _names_in(node: ast.AST) -> list[str]:
    """The identifiers along an expression's chain of subscripts and attributes: `opened.record["events"]` →
    ["events"?, "record", "opened"] (names and attributes only)."""
    names = []
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            break
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names


def _is_record(node: ast.AST) -> bool:
    return any(RECORD_NAME.match(name) for name in _names_in(node))


def _mentions_record_file(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value in RECORD_FILES:
            return True
        if isinstance(sub, ast.Name) and sub.id in RECORD_FILES:
            return True
    return False


def record_writes(source: str, filename: str = "<src>") -> list[str]:
    """Every place in `source` that writes a run record: an assignment or deletion into a record mapping, a
    mutating method called on one, a call of record.write_record/sealed_bytes, or a write to record.json/record.sha256."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Subscript) and _is_record(part.value):
                    found.append(f"{where}: assigns into a record ({ast.unparse(target)})")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in MUTATORS and _is_record(func.value):
                found.append(f"{where}: changes a record ({ast.unparse(func)})")
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in WRITERS:
                found.append(f"{where}: calls {name}, which only the record's owner may")
            if name in ("write_text", "write_bytes") and isinstance(func, ast.Attribute) and _mentions_record_file(func.value):
                found.append(f"{where}: writes a record file ({ast.unparse(func.value)})")
            if name in ("write_atomic", "replace", "rename") and node.args and _mentions_record_file(node.args[-1] if name != "write_atomic" else node.args[0]):
                found.append(f"{where}: writes a record file ({ast.unparse(node)[:80]})")
            if name == "open" and node.args and _mentions_record_file(node.args[0]):
                mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
                if isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+"):
                    found.append(f"{where}: opens a record file for writing")
    return found


def test_no_module_outside_the_owner_writes_a_record():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in OWNERS:
            continue
        found += record_writes(path.read_text(encoding="utf-8"), rel)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("snippet", [
    'record["status"] = "completed"',
    'opened.record["events"].append({"kind": "x"})',
    'record.setdefault("metrics", {})["test"] = metrics',
    'old_record.update(status="running")',
    'del record["artifacts"]',
    'record.code["user_files"] = []',
    'write_record(run_dir, record)',
    '(run_dir / "record.json").write_text("{}")',
    '(run_dir / SEAL_FILE).write_bytes(b"")',
    'write_atomic(run_dir / RECORD_FILE, data)',
    'open(run_dir / "record.json", "w")',
    'os.replace(tmp, run_dir / "record.sha256")',
])
def test_the_check_catches_each_kind_of_record_write(snippet):
    assert record_writes(snippet), snippet


@pytest.mark.parametrize("snippet", [
    'status = record["status"]',
    'record.set(data=summary)',
    'shown = {**record, "notes": notes}',
    'open(run_dir / "record.json", encoding="utf-8")',
    'rows["status"] = 1',
])
def test_reading_a_record_is_not_a_write(snippet):
    assert not record_writes(snippet), snippet


def test_a_record_as_read_is_read_only_and_typed(small_run_pristine):
    record = read_record(small_run_pristine.run_dir)
    assert isinstance(record, Record) and record.typed.run_id == record["run_id"] == record.run_id
    assert record.status == "completed" and record.data_version == record["data"]["version"]
    assert record["code"]["user_files"] == []  # a run of the built-in model imports no user module; veritrain's own are never listed
    for change in (lambda: record.__setitem__("status", "failed"), lambda: record["events"].append({}),
                   lambda: record["metrics"]["test"].update(accuracy=1.0), lambda: record.setdefault("x", 1),
                   lambda: record["trajectory"][0].__setitem__("kept", False), lambda: record.pop("error")):
        with pytest.raises(TypeError, match="read-only"):
            change()
    # it reads as the JSON it was read from, and copies of it can be changed
    on_disk = json.loads((small_run_pristine.run_dir / "record.json").read_text(encoding="utf-8"))
    assert json.loads(json.dumps(record)) == on_disk == thawed(record) == copy.deepcopy(record)
    mine = copy.deepcopy(record)
    mine["status"] = "failed"
    mine["events"].append({})
    assert record["status"] == "completed"
    again = pickle.loads(pickle.dumps(record))
    assert isinstance(again, Record) and again == record and again.run_dir == record.run_dir
    assert isinstance(frozen([1, [2]])[1], FrozenList) and record["events"] + [{}] == [*on_disk["events"], {}]
