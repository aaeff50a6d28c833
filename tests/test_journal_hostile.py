"""A journal is input from whoever can write the workspace: a hand-written `.veritrain/journal/<run>/plan.json` that names
paths outside the run, goes through a link or is not a plan veritrain wrote is refused as a whole (exit 1, one line,
nothing changed anywhere, a folder outside the workspace included), and `veritrain gc --drop-journal RUN` removes it
without applying it or following a link, after which the run is as its files are. Runs are hand-made (no training)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from veritrain.core.errors import RunFailed
from veritrain.records import journal
from veritrain.records.record import write_record
from veritrain.records.workspace import Workspace

RUN_ID = "20260101-000000-000-abcdef"
OTHER_ID = "20260102-000000-000-fedcba"
SHOWN = f".veritrain/journal/{RUN_ID}/"
ESCAPE = "../../../victim/x"  # from runs/<run>/ (and from the journal's new/ and old/ below .veritrain/): out of the workspace


def make_run(workspace: Workspace, run_id: str = RUN_ID) -> Path:
    """A small sealed run, as test_journal.py makes it: a few files and a record, no training."""
    run_dir = workspace.runs_dir / run_id
    for rel, text in {"config.yaml": "seed: 0\n", "eval/test/metrics.json": '{"accuracy": 0.5}\n',
                      "checkpoints/step-1.pt": "weights\n"}.items():
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_text(text)
    write_record(run_dir, {"record_version": 1, "run_id": run_id, "status": "completed", "started_at": "2026-01-01T00:00:00+00:00",
                           "config": {}, "events": []})
    return run_dir


@pytest.fixture
def site(tmp_path: Path) -> tuple[Workspace, Path, Path]:
    """(workspace, run folder, victim): a folder outside the workspace holding a file a forged plan aims at."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "x").write_text("the victim's file\n")
    workspace = Workspace.open(tmp_path / "ws")
    return workspace, make_run(workspace), victim


def forge(workspace: Workspace, of: str = RUN_ID, **changes: Any) -> Path:
    """A journal of the run `of` with a plan as `_stage_record` writes it, changed by `changes`, and a file in new/ for
    each path."""
    folder = journal.folder_of(workspace.state_dir, of)
    (folder / journal.NEW).mkdir(parents=True)
    plan: dict[str, Any] = {"plan_version": 1, "run_id": of, "by": "eval", "seal": "0" * 64, "previous_seal": None,
                            "write": ["eval/test/metrics.json"], "remove": [], "existed": ["eval/test/metrics.json"]}
    plan.update(changes)
    for rel in plan["write"] if isinstance(plan["write"], list) else []:
        if isinstance(rel, str) and not rel.startswith("/") and ".." not in rel:
            try:
                (folder / journal.NEW / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / journal.NEW / rel).write_text("forged\n")
            except OSError:
                pass  # a path below another path's file
    (folder / journal.PLAN_FILE).write_text(json.dumps(plan))
    return folder


def snapshot(root: Path) -> dict[str, Any]:
    """Everything below `root`, links not followed: each folder, each file's bytes and each link's target, with mtimes."""
    found: dict[str, Any] = {}
    for here, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(here) / name
            info = path.lstat()
            if path.is_symlink():
                found[path.relative_to(root).as_posix()] = ("link", os.readlink(path))
            elif path.is_dir():
                found[path.relative_to(root).as_posix()] = ("folder", info.st_mtime_ns)
            else:
                found[path.relative_to(root).as_posix()] = ("file", path.read_bytes(), info.st_mtime_ns)
    return found


def refused(root: Path, action: Callable[[], Any]) -> str:
    """Run `action`, which must refuse with RunFailed and change nothing below `root`; returns the message."""
    before = snapshot(root)
    with pytest.raises(RunFailed) as caught:
        action()
    assert snapshot(root) == before
    message = str(caught.value)
    assert "\n" not in message and "nothing was changed" in message and f"veritrain gc --drop-journal {RUN_ID}" in message, message
    return message


def through_link_in_the_run(workspace: Workspace, run_dir: Path, victim: Path) -> str:
    (run_dir / "eval" / "test").rename(run_dir / "eval" / "kept")
    (run_dir / "eval" / "test").symlink_to(victim, target_is_directory=True)
    forge(workspace, write=["eval/test/x"], existed=["eval/test/x"])
    return f"runs/{RUN_ID}/eval/test is a link"


def through_link_in_old(workspace: Workspace, run_dir: Path, victim: Path) -> str:
    folder = forge(workspace, write=[], remove=["checkpoints/step-1.pt"], existed=["checkpoints/step-1.pt"])
    (folder / journal.OLD).mkdir()
    (folder / journal.OLD / "checkpoints").symlink_to(victim, target_is_directory=True)  # the run's file would land in victim/
    return f"{SHOWN}old/checkpoints is a link"


HOSTILE: dict[str, Callable[[Workspace, Path, Path], str]] = {
    "write": lambda ws, run, victim: (forge(ws, write=[ESCAPE], existed=[]), f'write entry "{ESCAPE}"')[1],
    "remove": lambda ws, run, victim: (forge(ws, write=[], remove=[ESCAPE], existed=[ESCAPE]), f'remove entry "{ESCAPE}"')[1],
    "existed": lambda ws, run, victim: (forge(ws, existed=[ESCAPE]), f'existed entry "{ESCAPE}"')[1],
    "absolute": lambda ws, run, victim: (forge(ws, write=[str(victim / "x")], existed=[]), f'write entry "{victim / "x"}": an absolute path')[1],
    "link in the run": through_link_in_the_run,
    "link in old/": through_link_in_old,
    "another run": lambda ws, run, victim: (forge(ws, run_id=OTHER_ID), f'run_id "{OTHER_ID}"')[1],
    "not a list": lambda ws, run, victim: (forge(ws, write="record.json", existed=[]), "write is a JSON str, not a list")[1],
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_plan_reaching_outside_the_run_is_refused_and_nothing_changes(site, case):
    workspace, run_dir, victim = site
    named = HOSTILE[case](workspace, run_dir, victim)
    root = workspace.root.parent
    for action in (lambda: journal.recover(workspace, run_dir), lambda: journal.recover_all(workspace),
                   lambda: journal.check_all(workspace), lambda: journal.interrupted(run_dir, workspace.state_dir)):
        message = refused(root, action)
        assert message.startswith(SHOWN) and named in message, message
    assert (victim / "x").read_text() == "the victim's file\n"

    journal.discard(workspace, RUN_ID)
    assert not os.path.lexists(journal.folder_of(workspace.state_dir, RUN_ID))
    assert journal.recover(workspace, run_dir) is None
    assert sorted(p.name for p in victim.iterdir()) == ["x"] and (victim / "x").read_text() == "the victim's file\n"


def test_the_commands_refuse_in_one_line_and_drop_journal_makes_the_run_usable(site, cli):
    workspace, run_dir, victim = site
    forge(workspace, write=["eval/test/metrics.json", ESCAPE], remove=[ESCAPE], existed=[])
    root, where = workspace.root.parent, ["--workdir", str(workspace.root)]
    before = snapshot(root)
    for command in (["gc"], ["gc", "--dry-run"], ["eval", RUN_ID], ["export", RUN_ID]):
        done = cli(*command, *where)
        assert done.code == 1, (command, done.stdout, done.stderr)
        error = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert error == [line for line in done.stderr.splitlines() if "drop-journal" in line] and len(error) == 1, done.stderr
        assert error[0].startswith(f"error: {SHOWN}plan.json: write entry \"{ESCAPE}\": has a '..' part;"), error
        assert "nothing was changed" in error[0] and f"`veritrain gc --drop-journal {RUN_ID}`" in error[0]
        assert "Traceback" not in done.stderr
        assert snapshot(root) == before, command

    done = cli("gc", "--drop-journal", RUN_ID[:8], "--dry-run", *where)  # a prefix, as any RUN
    assert done.code == 0 and done.stdout.startswith("would remove the journal") and snapshot(root) == before, done.stderr
    done = cli("gc", "--drop-journal", "latest", *where)
    assert done.code == 0, done.stderr
    assert done.stdout.splitlines() == [f"removed the journal {SHOWN} without applying it; run {RUN_ID} is as its files are now: "
                                        f"check it with `veritrain verify {RUN_ID}`"]
    assert not journal.folder_of(workspace.state_dir, RUN_ID).exists() and (victim / "x").read_text() == "the victim's file\n"
    verified = cli("verify", RUN_ID, *where)
    assert verified.code == 0, verified.stdout + verified.stderr
    assert cli("gc", *where).code == 0

    again = cli("gc", "--drop-journal", RUN_ID, *where)  # nothing left to remove
    assert again.code == 2 and again.stderr.splitlines()[-1] == f"error: {RUN_ID}: no journal {SHOWN}; nothing to remove"


def test_gc_refuses_before_touching_any_journal_and_json_says_why(site, cli):
    workspace, run_dir, victim = site
    make_run(workspace, OTHER_ID)
    honest = journal.folder_of(workspace.state_dir, OTHER_ID)
    (honest / journal.NEW).mkdir(parents=True)  # an amend killed before its commit point: rolled back once gc may run
    (honest / journal.NEW / "config.yaml").write_text("seed: 1\n")
    leftover = workspace.state_dir / "journal" / f".{OTHER_ID}.0.done"
    leftover.mkdir()
    linked = workspace.state_dir / "journal" / f".{OTHER_ID}.1.done"  # a leftover that is a link: the link goes, never its target
    linked.symlink_to(victim, target_is_directory=True)
    forge(workspace, remove=[ESCAPE], existed=[])
    root = workspace.root.parent
    before = snapshot(root)
    done = cli("gc", "--json", "--workdir", str(workspace.root))
    assert done.code == 1 and snapshot(root) == before
    assert json.loads(done.stdout)["error"]["message"].startswith(f"{SHOWN}plan.json: remove entry \"{ESCAPE}\"")

    dropped = cli("gc", "--drop-journal", RUN_ID, "--json", "--workdir", str(workspace.root))
    assert dropped.code == 0 and dropped.json()["dropped_journal"] == RUN_ID and dropped.json()["removed"] == [SHOWN]
    assert honest.is_dir() and leftover.is_dir()  # the other journal is gc's, not --drop-journal's
    assert cli("gc", "--workdir", str(workspace.root)).code == 0
    assert not honest.exists() and not leftover.exists() and not os.path.lexists(linked)
    assert (victim / "x").read_text() == "the victim's file\n"
    assert (workspace.runs_dir / OTHER_ID / "config.yaml").read_text() == "seed: 0\n"


def test_drop_journal_never_follows_a_link(site, tmp_path):
    workspace, run_dir, victim = site
    folder = forge(workspace, plan_version="not a number")  # malformed: dropped all the same
    outside = tmp_path / "outside"
    (outside / "checkpoints").mkdir(parents=True)
    (outside / "checkpoints" / "step-1.pt").write_text("keep me\n")
    (folder / journal.OLD).symlink_to(outside, target_is_directory=True)
    (folder / journal.NEW / "to-victim").symlink_to(victim / "x")
    refused(tmp_path, lambda: journal.recover(workspace, run_dir))
    journal.discard(workspace, RUN_ID)
    assert not os.path.lexists(folder)
    assert (outside / "checkpoints" / "step-1.pt").read_text() == "keep me\n" and (victim / "x").read_text() == "the victim's file\n"

    # the journal folder itself a link to an outside folder that holds a plan: the link goes, the folder stays
    planted = tmp_path / "planted"
    (planted / journal.NEW).mkdir(parents=True)
    (planted / journal.PLAN_FILE).write_text("{}")
    folder.symlink_to(planted, target_is_directory=True)
    message = refused(tmp_path, lambda: journal.recover(workspace, run_dir))
    assert message.startswith(f"{SHOWN}: .veritrain/journal/{RUN_ID} is a link, not a folder"), message
    journal.discard(workspace, RUN_ID)
    assert not os.path.lexists(folder) and (planted / journal.PLAN_FILE).read_text() == "{}"


def test_drop_journal_of_a_run_that_is_gone_or_under_way(site, cli):
    workspace, run_dir, victim = site
    forge(workspace, OTHER_ID, write=[ESCAPE], existed=[])  # no run folder of that id: named by its exact id
    assert cli("gc", "--drop-journal", OTHER_ID[:8], "--workdir", str(workspace.root)).code == 2  # a prefix names runs only
    done = cli("gc", "--drop-journal", OTHER_ID, "--workdir", str(workspace.root))
    assert done.code == 0 and not journal.folder_of(workspace.state_dir, OTHER_ID).exists(), done.stderr

    forge(workspace, write=[ESCAPE], existed=[])
    workspace.lock_run(RUN_ID)  # a live process amends the run
    try:
        busy = cli("gc", "--drop-journal", RUN_ID, "--workdir", str(workspace.root))
        assert busy.code == 2 and "under way" in busy.stderr.splitlines()[-1], busy.stderr
        assert journal.folder_of(workspace.state_dir, RUN_ID).is_dir()
    finally:
        workspace.unlock_run(RUN_ID)


def test_an_honest_plan_still_passes_and_odd_paths_are_named():
    """The confinement accepts every path `_stage_record` writes and names what is wrong with the others."""
    for rel in ("record.json", "eval/test/metrics.json", "export/model.onnx", "checkpoints/step-10.pt.sha256", "a b/ü.txt"):
        assert journal._path_problem(rel) is None, rel
    for rel, problem in {"": "empty", "/etc/passwd": "an absolute path", "a//b": "has an empty part", "a/./b": "has a '.' part",
                         "a/../b": "has a '..' part", "a/": "has an empty part", "a\\b": "holds a backslash",
                         "a\x00b": "holds a control character", "a\nb": "holds a control character", 3: "not a string",
                         "x" * 5000: "longer than 4096 characters"}.items():
        assert journal._path_problem(rel) == problem, rel


def test_the_plan_must_be_as_veritrain_writes_it(site):
    workspace, run_dir, victim = site
    for changes, named in (({"plan_version": True}, "plan_version true"), ({"by": None}, "by null"),
                           ({"previous_seal": 3}, "previous_seal 3"), ({"extra": 1}, 'at "extra"'),
                           ({"existed": ["config.yaml"]}, 'existed entry "config.yaml" is in neither'),
                           ({"write": ["eval", "eval/test/metrics.json"], "existed": []}, 'lies below "eval"'),
                           ({"remove": list(range(3))}, "remove entry 0: not a string")):
        folder = forge(workspace, **changes)
        message = refused(workspace.root.parent, lambda: journal.recover(workspace, run_dir))
        assert named in message, message
        journal.discard(workspace, RUN_ID)
        assert not folder.exists()
    folder = forge(workspace)
    (folder / journal.PLAN_FILE).write_text("[" * 100_000)  # nested past the parser's depth
    assert "not JSON" in refused(workspace.root.parent, lambda: journal.recover(workspace, run_dir))
    (folder / journal.PLAN_FILE).unlink()
    (folder / journal.PLAN_FILE).symlink_to(workspace.root.parent / "victim" / "x")
    assert "plan.json: a link, not a file" in refused(workspace.root.parent, lambda: journal.recover(workspace, run_dir))
