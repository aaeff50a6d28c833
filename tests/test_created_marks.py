"""Which runs this user started, and so may build without --trust-code, is said by marks in the user's state folder
(`$XDG_STATE_HOME/veritrain/created/`), never by the workspace: whoever hands over or writes a workspace could write
anything in it.

One tiny run trains a user model (`model.target`) whose activation module is imported only while it trains, so the
mark must hold the code as recorded at the run's end. The attack the marks close: the run folder deleted, a forged one
with the same id and config but other recorded code put in its place (sealed again, as a forger would), and audit or
eval building it without --trust-code; or `.veritrain/created/<id>` written into the workspace by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import in_process_run, veritrain_process

from veritrain.core import user_dirs
from veritrain.core.errors import UserError
from veritrain.records.workspace import Workspace
from veritrain.trust import opening

NET = '''import torch
from torch import nn


class Act(nn.Module):
    def forward(self, x):
        from vtmarks_act import act  # imported while the run trains: recorded at its end

        return act(x)


def make(input_shape, num_outputs, hidden=16):
    size = 1
    for d in input_shape:
        size *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(size, hidden), Act(), nn.Linear(hidden, num_outputs))
'''
ACT = "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n"
# the forger's module: the same model, and a line that leaves a trace when it is imported
# the forged module's extra line: it writes the module its process runs as __main__ to the file named here (an audit's
# child, which sees no variable of the test's, runs veritrain.trust.replay_child)
CANARY = '\nimport sys as _sys\nopen({path!r}, "w").write(str(getattr(_sys.modules["__main__"].__spec__, "name", None)))\n'
TINY = ["train.epochs=1", "eval.baselines=false", "export.formats=[safetensors]"]


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """(workspace folder, run folder) of a run this user started there: the module's one training."""
    root = tmp_path_factory.mktemp("marks")
    project = root / "project"
    project.mkdir()
    (project / "vtmarks_net.py").write_text(NET)
    (project / "vtmarks_act.py").write_text(ACT)
    config = project / "cfg.yaml"
    config.write_text('model:\n  target: "vtmarks_net:make"\n')
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        outcome = in_process_run(root / "ws", TINY, config=config)
    assert outcome.error is None, outcome.summary
    run_dir = Path(outcome.summary["run_dir"])
    listed = {entry["module"] for entry in outcome.record["code"]["user_files"]}
    assert listed == {"vtmarks_net", "vtmarks_act"}  # the activation's module was recorded at the run's end
    return root / "ws", run_dir


def mark_of(workdir: Path, run_id: str) -> Path:
    key = hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:16]
    return user_dirs.state_dir() / "created" / key / f"{run_id}.json"


def record_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "record.json").read_text())


def reseal_as_a_forger(run_dir: Path) -> None:
    """The record lists the forged module's hash, its artifact table and seal match, its statement is made again:
    the forged run verifies as well as the user's did (the seal is a hash, not a signature)."""
    from veritrain.records.record import artifact_table, record_bytes, statement_bytes

    shutil.rmtree(run_dir / "amendments", ignore_errors=True)  # they extend the user's seal: a forger drops them
    record = record_of(run_dir)
    digest = hashlib.sha256((run_dir / "code" / "vtmarks_net.py").read_bytes()).hexdigest()
    for entry in record["code"]["user_files"]:
        if entry["module"] == "vtmarks_net":
            entry["sha256"] = digest
    record["code"]["model_source"]["sha256"] = digest
    record["artifacts"] = artifact_table(run_dir)
    data = record_bytes(record)
    (run_dir / "record.json").write_bytes(data)
    seal = hashlib.sha256(data).hexdigest()
    (run_dir / "record.sha256").write_text(seal + "\n")
    (run_dir / "provenance.intoto.jsonl").write_bytes(statement_bytes(record, seal, run_dir, None))


@pytest.fixture
def forged(started, tmp_path, monkeypatch):
    """The user's run deleted and a forged one of the same id and config put in its place (its model module has one
    more line, which runs when it is imported); the user's run is put back afterwards."""
    workdir, run_dir = started
    kept = tmp_path / "kept"
    shutil.move(str(run_dir), kept)
    shutil.copytree(kept, run_dir)
    canary = tmp_path / "ran"
    with open(run_dir / "code" / "vtmarks_net.py", "a") as module:
        module.write(CANARY.format(path=str(canary)))
    reseal_as_a_forger(run_dir)
    yield workdir, run_dir, canary
    shutil.rmtree(run_dir)
    shutil.move(str(kept), run_dir)


def test_a_run_started_here_is_audited_and_evaluated_without_trust_code(cli, started):
    workdir, run_dir = started
    audited = cli("audit", run_dir.name, "--workdir", str(workdir))
    assert audited.code == 0, audited.stdout + audited.stderr
    evaluated = cli("eval", run_dir.name, "--workdir", str(workdir))
    assert evaluated.code == 0, evaluated.stderr
    assert Workspace.open(workdir).created_here(run_dir, record_of(run_dir))  # eval amended it: the code is the same


def test_the_mark_is_in_the_users_state_folder_and_binds_the_code(started):
    workdir, run_dir = started
    mark = mark_of(workdir, run_dir.name)
    assert mark.is_file() and not mark.resolve().is_relative_to(workdir.resolve())
    assert mark.resolve().is_relative_to(Path(os.environ["XDG_STATE_HOME"]).resolve())
    assert stat.S_IMODE(mark.stat().st_mode) == 0o600
    assert stat.S_IMODE(mark.parent.stat().st_mode) == 0o700 and stat.S_IMODE(mark.parent.parent.stat().st_mode) == 0o700
    held = json.loads(mark.read_text())
    record = record_of(run_dir)
    assert held["workspace"] == str(workdir.resolve()) and held["run_id"] == run_dir.name
    assert held["config_hash"] == record["config_hash"] and held["model_target"] == "vtmarks_net:make"
    assert {(e["module"], e["sha256"]) for e in held["user_files"]} == {
        (m, hashlib.sha256((run_dir / "code" / f"{m}.py").read_bytes()).hexdigest()) for m in ("vtmarks_net", "vtmarks_act")}
    assert not (workdir / ".veritrain" / "created").exists()  # nothing of it in the workspace


def test_a_forged_run_in_place_of_the_users_needs_trust_code(cli, forged):
    from veritrain.trust.verify import verify_run

    workdir, run_dir, canary = forged
    assert verify_run(run_dir, workdir / ".veritrain", rehash_data=False, check_states=False)["ok"]  # a well-made forgery
    for command in (["audit", run_dir.name], ["eval", run_dir.name]):
        refused = cli(*command, "--workdir", str(workdir))
        assert refused.code == 2, (command, refused.stdout, refused.stderr)
        line = one_error_line(refused)
        assert "the recorded code differs from what this user's run recorded (code/vtmarks_net.py)" in line, line
        assert "--trust-code" in line
        assert not canary.exists(), command  # the forged code never ran
    trusted = veritrain_process("audit", run_dir.name, "--trust-code", "--workdir", str(workdir))
    assert trusted.code == 0, trusted.stdout + trusted.stderr
    # passed --trust-code: the user chose to run it, and it ran in the audit's child, never in the verifier's process
    assert canary.read_text() == "veritrain.trust.replay_child"


def test_a_mark_written_into_the_workspace_waives_nothing(cli, started, tmp_path):
    workdir, run_dir = started
    archive = tmp_path / "run.tar.gz"
    assert cli("archive", run_dir.name, "-o", str(archive), "--workdir", str(workdir)).code == 0
    other = tmp_path / "other"
    imported = cli("import", str(archive), "--workdir", str(other))
    assert imported.code == 0, imported.stderr
    planted = other / ".veritrain" / "created" / run_dir.name  # what older versions believed
    planted.parent.mkdir(parents=True)
    planted.write_text(record_of(run_dir)["config_hash"] + "\n")
    refused = cli("eval", run_dir.name, "--workdir", str(other))
    assert refused.code == 2, refused.stdout + refused.stderr
    line = one_error_line(refused)
    assert "this workspace did not start the run" in line and "--trust-code" in line, line


def test_a_copied_workspace_or_a_changed_record_is_not_started_here(started, tmp_path):
    workdir, run_dir = started
    record = record_of(run_dir)
    copy = Workspace.open(tmp_path / "copy")
    shutil.copytree(run_dir, copy.runs_dir / run_dir.name)
    assert not copy.created_here(copy.runs_dir / run_dir.name, record)  # the mark binds the workspace's path
    workspace = Workspace.open(workdir)
    assert workspace.created_here(run_dir, record)
    other_config = {**record, "config_hash": "0" * 64}
    assert "its config differs" in str(workspace.not_created_here(run_dir, other_config))
    other_target = {**record, "config": {**record["config"], "model": {**record["config"]["model"], "target": "vtmarks_act:act"}}}
    assert "its config differs" in str(workspace.not_created_here(run_dir, other_target))
    fewer = {**record, "code": {**record["code"], "user_files": [e for e in record["code"]["user_files"] if e["module"] != "vtmarks_act"]}}
    assert "the recorded code differs" in str(workspace.not_created_here(run_dir, fewer))


def test_a_script_runs_mark_binds_its_recorded_script(tmp_path):
    """A script's run (veritrain.start): the recorded copy of the script is its code, hashed as it is now."""
    workspace = Workspace.open(tmp_path / "ws")
    run_id, run_dir = workspace.new_run_dir()
    (run_dir / "code" / "script").mkdir(parents=True)
    script = run_dir / "code" / "script" / "train.py"
    script.write_text("print('training')\n")
    (run_dir / "code" / "helper.py").write_text("X = 1\n")
    record = {"run_id": run_id, "kind": "script", "config": {"lr": 0.1}, "config_hash": "1" * 64,
              "script": {"file": "code/script/train.py", "sha256": hashlib.sha256(script.read_bytes()).hexdigest()},
              "code": {"user_files": [{"module": "helper", "path": "helper.py",
                                       "sha256": hashlib.sha256(b"X = 1\n").hexdigest()}]}}
    workspace.mark_created(run_dir, record)
    opening.refuse_untrusted_code(workspace, run_dir, record, trust_code=False)
    script.write_text("print('something else')\n")
    forged = {**record, "script": {**record["script"], "sha256": hashlib.sha256(script.read_bytes()).hexdigest()}}
    assert workspace.not_created_here(run_dir, forged) == \
        "the recorded code differs from what this user's run recorded (code/script/train.py)"
    with pytest.raises(UserError, match=r"it is a script's run .* the recorded code differs .* pass --trust-code"):
        opening.refuse_untrusted_code(workspace, run_dir, forged, trust_code=False)
    opening.refuse_untrusted_code(workspace, run_dir, forged, trust_code=True)
