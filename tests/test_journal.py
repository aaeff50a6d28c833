"""Amends as transactions (veritrain.records.journal), on a small hand-made run: a kill at every step of a commit leaves
a run that verifies as it was, and that the next amending command completes or rolls back; verify only reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from veritrain.records import journal
from veritrain.records.record import read_record, thawed, write_record
from veritrain.trust.verify import verify_run
from veritrain.records.workspace import Workspace

RUN_ID = "20260101-000000-000-abcdef"


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no cleanup that catches Exception."""


def make_run(root: Path) -> tuple[Workspace, Path, str]:
    workspace = Workspace.open(root)
    run_dir = workspace.runs_dir / RUN_ID
    for rel, text in {"config.yaml": "seed: 0\n", "eval/test/metrics.json": '{"accuracy": 0.5}\n',
                      "eval/test/report.md": "old report\n", "checkpoints/step-1.pt": "weights\n",
                      "checkpoints/step-2.pt": "weights 2\n"}.items():
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_text(text)
    seal = write_record(run_dir, {"record_version": 1, "run_id": RUN_ID, "status": "completed", "started_at": "2026-01-01T00:00:00+00:00", "config": {}, "events": []})
    return workspace, run_dir, seal


def stage_amend(workspace: Workspace, run_dir: Path) -> journal.Amend:
    """An amend as a command stages it: a new eval/test/ (report.md not written again), one file removed."""
    folder = journal.folder_of(workspace.state_dir, RUN_ID)
    (folder / journal.NEW).mkdir(parents=True)
    change = journal.Amend(run_dir, folder)
    staged = change.replace_folder("eval/test")
    (staged / "metrics.json").write_text('{"accuracy": 0.9}\n')
    (staged / "predictions.csv").write_text("id,label\n")
    change.remove("checkpoints/step-1.pt")
    return change


def contents(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def commit_killed_after(monkeypatch: pytest.MonkeyPatch, change: journal.Amend, record: dict, renames: int) -> bool:
    """Commit, killed at the `renames`+1-th rename (the plan's, each switch, the journal's removal); True when it ran through."""
    real, count = os.replace, [0]

    def replace(*args, **kwargs):
        if count[0] == renames:
            raise Killed()
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    try:
        change.commit(record, by="eval")
        return True
    except Killed:
        return False
    finally:
        monkeypatch.setattr(os, "replace", real)


def test_a_kill_at_any_rename_fails_verify_until_the_next_amend_completes_or_rolls_back(tmp_path, monkeypatch, caplog):
    outcomes = []
    for renames in range(20):
        workspace, run_dir, old_seal = make_run(tmp_path / str(renames))
        before = contents(run_dir)
        record = thawed(read_record(run_dir))  # a changeable copy: what recorder.Amendment holds
        record["events"].append({"kind": "eval", "step": None, "detail": "again", "at": "x"})
        finished = commit_killed_after(monkeypatch, stage_amend(workspace, run_dir), record, renames)
        if finished:
            outcomes.append("finished")
            break
        judged = verify_run(run_dir, workspace.state_dir)  # the journal is a workspace file: never taken on trust
        assert not judged["ok"] and "amend_pending" in [p["kind"] for p in judged["problems"]]
        assert "veritrain gc" in judged["interrupted_amend"]
        outcome = journal.recover(workspace, run_dir)
        outcomes.append(outcome)
        assert not journal.folder_of(workspace.state_dir, RUN_ID).exists()
        after = verify_run(run_dir, workspace.state_dir)
        assert after["ok"] and after["interrupted_amend"] is None, after["problems"]
        now = contents(run_dir)
        if outcome == "rolled back":
            assert now == before and after["seal"] == old_seal
        else:
            assert outcome == "completed"
            assert now["eval/test/metrics.json"] == b'{"accuracy": 0.9}\n' and "eval/test/report.md" not in now
            assert "checkpoints/step-1.pt" not in now and "checkpoints/step-2.pt" in now
            assert read_record(run_dir)["seal_history"][-1] == {"seal": old_seal, "replaced_at": read_record(run_dir)["seal_history"][-1]["replaced_at"], "by": "eval"}
    # the plan's own rename is the commit point: before it a roll back, after it (each switch, the removal) a roll forward
    assert outcomes[0] == "rolled back" and set(outcomes[1:-1]) == {"completed"} and outcomes[-1] == "finished", outcomes
    # the plan; 2 removals (step-1.pt, report.md) moved aside; metrics.json aside and in, predictions.csv in; the provenance
    # statement in, record and seal aside and in; the journal's removal: 13 renames, each a kill point, then one commit that runs through
    assert len(outcomes) == 14
    assert "was completed from its journal" in caplog.text and "was rolled back" in caplog.text


def test_verify_only_reads_and_fails_while_an_amend_is_interrupted(tmp_path, monkeypatch):
    workspace, run_dir, old_seal = make_run(tmp_path)
    record = thawed(read_record(run_dir))
    assert not commit_killed_after(monkeypatch, stage_amend(workspace, run_dir), record, 3)  # half switched

    def snapshot() -> dict[str, tuple[bytes, int]]:
        return {p.relative_to(tmp_path).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    before = snapshot()
    judged = verify_run(run_dir, workspace.state_dir)
    assert not judged["ok"] and judged["problems"][0]["kind"] == "amend_pending" and judged["interrupted_amend"]
    assert snapshot() == before
    (run_dir / "config.yaml").write_text("seed: 1\n")  # a change to the run is still seen while the journal waits
    assert "config.yaml" in [p["path"] for p in verify_run(run_dir, workspace.state_dir)["problems"]]


def test_an_amend_left_without_commit_is_rolled_back_and_a_live_one_is_left_alone(tmp_path):
    workspace, run_dir, old_seal = make_run(tmp_path)
    before = contents(run_dir)
    with pytest.raises(RuntimeError):
        with journal.amending(workspace, run_dir, read_record(run_dir)) as change:
            (change.replace_folder("export") / "model.json").write_text("{}\n")
            raise RuntimeError("the stage failed")
    assert contents(run_dir) == before and not journal.folder_of(workspace.state_dir, RUN_ID).exists()

    stage_amend(workspace, run_dir)  # a journal whose process still holds the run's lock
    workspace.lock_run(RUN_ID)
    with pytest.raises(journal.UserError, match="is under way"):
        journal.recover(workspace, run_dir)
    workspace.unlock_run(RUN_ID)
    assert journal.recover(workspace, run_dir) == "rolled back" and contents(run_dir) == before


def test_the_journal_stays_in_the_records_layer():
    """verify (trust), the pipeline (orchestration) and gc use it: it imports only base and records modules."""
    import ast

    import veritrain.records.journal

    tree = ast.parse(Path(veritrain.records.journal.__file__).read_text(encoding="utf-8"))
    ours = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("veritrain")}
    assert ours == {"veritrain.core.errors", "veritrain.core.files", "veritrain.core.signing_keys", "veritrain.records",
                    "veritrain.records.record", "veritrain.records.workspace"}, ours
