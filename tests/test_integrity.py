"""Integrity with no way around it: a run that does not verify is never re-sealed, a published seal keeps
its meaning (`--expect` with a seal history), verify is read-only, and a run's seal covers its data version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def workspace_copy(small_run_copy):
    """A copy of the whole workspace of the small run (run and data version), free to damage."""
    return small_run_copy.workdir, small_run_copy.run_dir, small_run_copy.seal


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["eval", "{run}"], ["export", "{run}", "--format", "safetensors"], ["baseline", "{run}"], ["gc"]])
def test_a_tampered_run_is_never_re_sealed(cli, workspace_copy, command):
    workdir, run_dir, seal = workspace_copy
    (run_dir / "train.log").write_text((run_dir / "train.log").read_text() + "x\n")
    result = cli(*[part.format(run=run_dir.name) for part in command], "--workdir", str(workdir))
    assert result.code == 1
    line = one_error_line(result)
    assert "train.log" in line and "does not verify" in line
    assert (run_dir / "record.sha256").read_text().strip() == seal  # not re-sealed
    again = cli("verify", run_dir.name, "--workdir", str(workdir))
    assert again.code == 1 and "train.log" in again.stderr  # the change is still caught


def test_a_published_seal_keeps_holding_and_names_what_came_after_it(cli, workspace_copy):
    workdir, run_dir, seal = workspace_copy
    exported = cli("export", run_dir.name, "--format", "safetensors", "--workdir", str(workdir))
    assert exported.code == 0, exported.stderr
    assert (run_dir / "record.sha256").read_text().strip() == seal  # the run itself is never re-sealed
    old = cli("verify", run_dir.name, "--expect", seal, "--workdir", str(workdir), "--json").json()
    assert old["ok"] and old["base_seal"] == seal and [(a["by"], a["covered"]) for a in old["amendments"]] == [("export", False)]
    newest = old["seal"]
    assert newest != seal and newest == old["amendments"][0]["seal"]
    assert cli("verify", run_dir.name, "--expect", newest, "--workdir", str(workdir)).code == 0
    wrong = cli("verify", run_dir.name, "--expect", "a" * 64, "--workdir", str(workdir), "--json")
    (problem,) = wrong.json()["problems"]
    assert wrong.code == 1 and problem["kind"] == "seal_differs_from_expected" and newest in problem["detail"]


@pytest.mark.parametrize("expect", ["", "   ", "abc", "g" * 64, "0" * 63])
def test_an_empty_or_malformed_expected_seal_is_a_usage_error(cli, small_run, expect):
    workdir, run_dir = small_run.workdir, small_run.run_dir
    result = cli("verify", run_dir.name, "--expect", expect, "--workdir", str(workdir))
    assert result.code == 2
    assert "--expect" in one_error_line(result)


def test_verify_is_read_only_and_answers_the_same_twice(cli, workspace_copy, tmp_path):
    workdir, run_dir, _ = workspace_copy
    archive = tmp_path / "run.tar.gz"
    assert cli("archive", run_dir.name, "-o", str(archive), "--workdir", str(workdir)).code == 0  # without its data
    elsewhere = tmp_path / "elsewhere"
    assert cli("import", str(archive), "--workdir", str(elsewhere)).code == 0
    before = sorted(p.relative_to(elsewhere).as_posix() for p in elsewhere.rglob("*"))
    first = cli("verify", run_dir.name, "--workdir", str(elsewhere), "--json")
    second = cli("verify", run_dir.name, "--workdir", str(elsewhere), "--json")
    assert first.code == second.code == 0, first.stdout
    assert {**first.json(), "verified_at": None} == {**second.json(), "verified_at": None}
    assert any("not_present" in d["now"] for d in first.json()["drift"])
    # nothing written in the workspace: the verdict (the run browser shows it) and the cache of state hashes are kept in
    # the user's state and cache folders, where whoever controls the workspace cannot plant them
    after = sorted(p.relative_to(elsewhere).as_posix() for p in elsewhere.rglob("*"))
    assert after == before
    import os

    assert any((Path(os.environ["XDG_CACHE_HOME"]) / "veritrain" / "states").glob("*.json"))
    assert cli("verify", run_dir.name, "--strict", "--workdir", str(elsewhere)).code == 1


def test_the_run_seal_covers_its_data_versions_own_record(cli, workspace_copy):
    workdir, run_dir, seal = workspace_copy
    record = json.loads((run_dir / "record.json").read_text())
    folder = workdir / ".veritrain" / "data" / record["data"]["version"]
    # a report rewritten with its hash updated in version.json: consistent inside the version, not with the run
    report = folder / "data_report.md"
    report.write_text(report.read_text() + "\nall clear\n")
    info = json.loads((folder / "version.json").read_text())
    from veritrain.core.hashing import sha256_file

    info["reports"]["data_report.md"] = sha256_file(report)
    (folder / "version.json").write_text(json.dumps(info, indent=2) + "\n")
    result = cli("verify", run_dir.name, "--expect", seal, "--workdir", str(workdir), "--json")
    assert result.code == 1
    assert any(p["path"].endswith("version.json") and "the one the run recorded" in p["detail"] for p in result.json()["problems"])


CANARY_MODEL = '''
import os, pathlib, torch
pathlib.Path(os.environ["VT_CANARY_FILE"]).write_text("the model's code ran\\n")

def build(input_shape, num_outputs):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], num_outputs))
'''


def test_code_named_by_a_run_this_workspace_did_not_start_never_runs_without_trust(cli, tmp_path, monkeypatch):
    """The commands that import the run's code run in their own process; the refusals and predict (which import
    none of it) run in this one, where the code is not even on sys.path."""
    import os
    import subprocess
    import sys

    code = tmp_path / "code"
    code.mkdir()
    (code / "canary_model.py").write_text(CANARY_MODEL)
    canary = tmp_path / "ran"

    def veritrain(*args: str, workdir: Path):
        env = {**os.environ, "PYTHONPATH": str(code), "VT_CANARY_FILE": str(canary), "PYTHONWARNINGS": "ignore"}
        return subprocess.run([sys.executable, "-m", "veritrain", *args, "--workdir", str(workdir)], capture_output=True, text=True,
                              env=env, timeout=300)

    made = veritrain("run", "--set", "model.target=canary_model:build", "--set", "train.epochs=1", "--set", "eval.baselines=false",
                     "--no-smoke", "--json", workdir=tmp_path / "a")
    assert made.returncode == 0, made.stderr
    run_id = json.loads(made.stdout)["run_id"]
    assert canary.exists()  # the run built its model: the code ran
    canary.unlink()
    from veritrain.records.workspace import Workspace
    from veritrain.trust.opening import refuse_untrusted_code

    # its own workspace trusts what it started (eval, export, baseline and reproduce there run the code)
    started = tmp_path / "a" / "runs" / run_id
    refuse_untrusted_code(Workspace.open(tmp_path / "a"), started, json.loads((started / "record.json").read_text()), trust_code=False)
    monkeypatch.setenv("VT_CANARY_FILE", str(canary))
    assert cli("archive", run_id, "-o", str(tmp_path / "r.tar.gz"), "--with-data", "--workdir", str(tmp_path / "a")).code == 0
    imported = cli("import", str(tmp_path / "r.tar.gz"), "--json", "--workdir", str(tmp_path / "b"))
    assert imported.code == 0 and imported.json()["code"] == ["canary_model:build", "code/canary_model.py (canary_model)"]
    assert not canary.exists()  # archive and import copy the code, never run it
    for command in (["eval", run_id], ["export", run_id], ["baseline", run_id], ["reproduce", run_id]):
        refused = cli(*command, "--workdir", str(tmp_path / "b"))
        assert refused.code == 2, (command, refused.stderr)
        line = one_error_line(refused)
        assert "names code" in line and "--trust-code" in line
        assert not canary.exists(), command  # the code never ran
        assert "canary_model" not in sys.modules, command
    from PIL import Image

    Image.new("L", (8, 8), 40).save(tmp_path / "digit.png")
    predicted = cli("predict", run_id, str(tmp_path / "digit.png"), "--workdir", str(tmp_path / "b"))
    assert predicted.code == 0, predicted.stderr  # predict runs the ONNX export: no code of the run is imported
    assert not canary.exists() and "canary_model" not in sys.modules
    trusted = veritrain("eval", run_id, "--trust-code", workdir=tmp_path / "b")
    assert trusted.returncode == 0, trusted.stderr
    assert canary.exists()


def test_forged_records_are_one_line_each_and_the_other_runs_still_list(cli, workspace_copy):
    workdir, run_dir, _ = workspace_copy
    good = json.loads((run_dir / "record.json").read_text())
    forgeries = {  # folder name → the record planted in it
        "20261130-000000-000-000001": {**good, "run_id": "20261130-000000-000-000001", "metrics": [1, 2]},
        "20261130-000000-000-000002": {**good, "run_id": "20261130-000000-000-000002", "data": "x"},
        "20261130-000000-000-000003": {**good, "run_id": "20261130-000000-000-abcdef"},  # not its folder's id
        "latest": {**good, "run_id": "latest"},
        "-rf": {**good, "run_id": "-rf"},
        "20261130-000000-000-000004": [1, 2, 3],
    }
    for folder, record in forgeries.items():
        (workdir / "runs" / folder).mkdir()
        (workdir / "runs" / folder / "record.json").write_text(json.dumps(record))
    listed = cli("runs", "list", "--json", "--workdir", str(workdir))
    assert listed.code == 0 and "Traceback" not in listed.stderr, listed.stderr
    payload = listed.json()
    ids = [r["run_id"] for r in (payload["runs"] if isinstance(payload, dict) else payload)]
    assert ids == [run_dir.name]
    assert sum(1 for line in listed.stderr.splitlines() if "not listed" in line) == len(forgeries)
    reindexed = cli("runs", "reindex", "--workdir", str(workdir))
    assert reindexed.code == 0 and "Traceback" not in reindexed.stderr, reindexed.stderr


def test_gc_removes_what_killed_commands_leave_and_runs_list_ignores_it(cli, workspace_copy):
    import os
    import time

    workdir, run_dir, _ = workspace_copy
    stale = time.time() - 600
    leftovers = [workdir / ".veritrain" / "data" / ".tmp-0123abcd", workdir / "runs" / "20261130-000000-000-0000aa"]
    fresh = workdir / "runs" / "20261130-000000-000-0000bb"  # might still be starting: left alone
    for folder in (*leftovers, fresh):
        folder.mkdir(parents=True)
        (folder / "partial").write_bytes(b"x" * 100)
    for folder in leftovers:
        os.utime(folder, (stale, stale))
    listed = cli("runs", "list", "--json", "--workdir", str(workdir))
    assert listed.code == 0 and "not listed" not in listed.stderr
    dry = cli("gc", "--dry-run", "--json", "--workdir", str(workdir))
    assert dry.code == 0, dry.stderr
    shown = [line for line in dry.json()["removed"] if "killed command" in line]
    assert len(shown) == 2 and all("min ago" in line for line in shown)
    assert all(folder.exists() for folder in leftovers)
    assert cli("gc", "--workdir", str(workdir)).code == 0
    assert not any(folder.exists() for folder in leftovers) and fresh.exists() and run_dir.exists()


@pytest.mark.parametrize("break_index", ["a folder in its place", "garbage bytes"])
def test_runs_list_reads_the_folders_when_the_index_cannot_be_written(cli, workspace_copy, break_index):
    workdir, run_dir, _ = workspace_copy
    index = workdir / ".veritrain" / "registry.sqlite"
    for extra in workdir.glob(".veritrain/registry.sqlite*"):
        extra.unlink()
    if break_index == "a folder in its place":
        index.mkdir()
    else:
        index.write_bytes(b"this is not a database, and the disk is full" * 100)
    listed = cli("runs", "list", "--json", "--workdir", str(workdir))
    assert listed.code == 0 and "Traceback" not in listed.stderr, listed.stderr
    payload = listed.json()
    assert [r["run_id"] for r in (payload["runs"] if isinstance(payload, dict) else payload)] == [run_dir.name]
    assert sum(1 for line in listed.stderr.splitlines() if "cannot be written" in line) == 1


@pytest.mark.parametrize("failure", [
    OSError(28, "No space left on device", "/ws/.veritrain/data/.tmp-1/manifest.csv"),
    __import__("sqlite3").OperationalError("database or disk is full"),
])
def test_a_full_disk_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys, failure):
    from veritrain import cli
    from veritrain.data import prepare

    def full(*args, **kwargs):
        raise failure

    monkeypatch.setattr(prepare, "write_version", full)
    with pytest.raises(SystemExit) as exited:
        cli.main(["data", "prepare", "--workdir", str(tmp_path)])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "free some space" in lines[0] and "Traceback" not in err


@pytest.mark.parametrize("version", ["../../elsewhere", 5, "A" * 64])
def test_a_record_whose_data_version_is_not_an_id_is_refused_by_every_reader(cli, workspace_copy, version):
    workdir, run_dir, _ = workspace_copy
    record = json.loads((run_dir / "record.json").read_text())
    record["data"]["version"] = version
    (run_dir / "record.json").write_text(json.dumps(record))
    for command in (["verify", run_dir.name], ["eval", run_dir.name], ["runs", "show", run_dir.name]):
        result = cli(*command, "--workdir", str(workdir))
        assert result.code == 1, (command, result.stderr)
        assert "Traceback" not in result.stderr and "data.version" in result.stdout + result.stderr, (command, result.stderr)
