"""Concurrency: OS file locks that the kernel releases on kill -9, concurrent runs of one config (one smoke test,
one prepare, every run in the registry), concurrent sweep resumes that run each slot once, a run killed early that
`--resume auto` continues, and the stratified smoke slice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import veritrain
from veritrain.core import locks
from veritrain.core.errors import UserError
from veritrain.tasks import stratified
from veritrain.records.workspace import Workspace, process_identity

# the smallest digits run with every stage of `veritrain run`: 2 optimizer steps (1,437 train samples, batches of 1,024)
TWO_STEPS = ["--set", "train.epochs=1", "--set", "train.batch_size=1024", "--set", "model.name=mlp", "--set", "model.hidden=[8]",
             "--set", "eval.baselines=false", "--set", "export.formats=[safetensors]", "--set", "train.threads=1"]  # processes side by side

HOLD = "import sys, time; from pathlib import Path; from veritrain.core import locks; assert locks.try_acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)"


def start(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "200", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, "-m", "veritrain", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)


def records(workdir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (workdir / "runs").glob("*/record.json")}


def test_a_lock_is_held_while_its_process_lives_and_free_once_it_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr("veritrain.records.workspace.LOCK_GRACE_S", 0.1)  # how long lock_run waits for a holder to let go
    workspace = Workspace.open(tmp_path)
    path = workspace.lock_path("20260101-000000-000-abcdef")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert locks.is_held(path) and not workspace.lock_is_stale(path.stem)
        assert not locks.try_acquire(path)  # another process holds it
        with pytest.raises(UserError, match=r"another process \(pid \d+ on .*\) holds"):
            workspace.lock_run(path.stem)
        assert locks.holder(path)["pid"] == holder.pid  # the file names its holder, for messages
    finally:
        holder.kill()  # SIGKILL: no handler runs; the kernel closes its descriptors and so releases the lock
        holder.wait()
    assert path.exists() and not locks.is_held(path) and workspace.lock_is_stale(path.stem)  # the file stays, nobody holds it
    assert workspace.lock_run(path.stem) == path
    workspace.unlock_run(path.stem)
    assert not path.exists()


def test_a_lock_taken_again_by_its_holder_is_counted_and_removed_at_the_last_release(tmp_path):
    workspace = Workspace.open(tmp_path)
    run_id = "20260101-000000-000-abcdef"
    workspace.lock_run(run_id)
    workspace.lock_run(run_id)  # an amend inside a command that holds the run: no wait on itself
    workspace.unlock_run(run_id)
    probe = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from veritrain.core import locks; "
                            "print(locks.is_held(Path(sys.argv[1])))", str(workspace.lock_path(run_id))], capture_output=True, text=True)
    assert probe.stdout.strip() == "True", probe.stderr  # still held, as another process sees it
    workspace.unlock_run(run_id)
    assert not workspace.lock_path(run_id).exists() and workspace.lock_is_stale(run_id)


def test_a_pid_file_lock_of_an_older_veritrain_is_judged_by_its_process(tmp_path):
    import socket

    if process_identity(os.getpid()) is None:
        pytest.skip("process start times are read from /proc (Linux)")
    workspace = Workspace.open(tmp_path)
    run_id = "20260101-000000-000-abcdef"
    lock = workspace.lock_path(run_id)
    lock.parent.mkdir(parents=True)
    pid_file = {"pid": os.getpid(), "host": socket.gethostname(), "process": process_identity(os.getpid())}
    lock.write_text(json.dumps(pid_file))  # no OS lock: what an older veritrain wrote for a run it is writing
    assert not workspace.lock_is_stale(run_id)  # its process lives, with the start time it recorded
    lock.write_text(json.dumps({**pid_file, "process": pid_file["process"].rsplit(":", 1)[0] + ":1"}))
    assert workspace.lock_is_stale(run_id)  # the pid now belongs to another process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(json.dumps({**pid_file, "pid": dead.pid}))
    assert workspace.lock_is_stale(run_id)
    lock.write_text("not json")
    assert workspace.lock_is_stale(run_id)


def test_the_smoke_slice_takes_every_class_in_turn():
    targets = np.repeat(np.arange(3), 50)  # a folder sorted by class: the first 64 rows hold two classes only
    rows = np.arange(150)
    picked = stratified(rows, targets, 64, ["a", "b", "c"])
    assert list(picked[:6]) == [0, 50, 100, 1, 51, 101]  # class by class in turn, each in the split's order
    assert np.bincount(targets[picked]).tolist() == [22, 21, 21]
    assert list(stratified(rows, targets, 64, ["a", "b", "c"])) == list(picked)  # deterministic
    scarce = np.array([0] * 60 + [1] * 2)
    assert np.bincount(scarce[stratified(np.arange(62), scarce, 10, ["a", "b"])]).tolist() == [8, 2]  # a class that runs out drops out
    assert list(stratified(rows, targets.astype(np.float32), 5, None)) == [0, 1, 2, 3, 4]  # no classes: the first rows
    assert list(stratified(rows[:4], targets[:4], 64, ["a", "b", "c"])) == [0, 1, 2, 3]


@pytest.mark.slow  # concurrent processes: checked in `make test-slow`
def test_two_concurrent_runs_of_one_config_share_one_smoke_test_and_both_complete(tmp_path):
    procs = [start("run", *TWO_STEPS, "--workdir", str(tmp_path), "--json") for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    summaries = [json.loads(out) for out, _ in outputs]
    assert all(s["status"] == "completed" for s in summaries)
    assert sum("smoke: a tiny slice through every stage first" in err for _, err in outputs) == 1  # the other waited, then reused it
    assert sum("smoke: passed before" in err for _, err in outputs) == 1
    from veritrain.records import registry

    listed = registry.query(tmp_path / ".veritrain", tmp_path / "runs", status=("completed",))
    assert {r["run_id"] for r in listed} == {s["run_id"] for s in summaries}
    assert not list((tmp_path / ".veritrain" / "locks").glob("*.lock"))  # every holder let go


@pytest.mark.slow
def test_four_concurrent_runs_of_one_config_all_complete_and_verify(tmp_path):
    procs = [start("run", *TWO_STEPS, "--workdir", str(tmp_path), "--json") for _ in range(4)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outputs]
    ids = {json.loads(out)["run_id"] for out, _ in outputs}
    assert len(ids) == 4
    for _, err in outputs:  # each run's own update of the index and experiments.md went through: no "database is locked"
        assert "experiments.md not updated" not in err and "cannot be written" not in err, err[-2000:]
    assert sum("smoke: a tiny slice through every stage first" in err for _, err in outputs) == 1
    assert len({r["data"]["version"] for r in records(tmp_path).values()}) == 1
    assert len(list((tmp_path / ".veritrain" / "data").glob("[0-9a-f]*"))) == 1  # prepared once
    listed = veritrain("runs", "list", "--status", "completed", "--workdir", str(tmp_path), "--json")
    assert {r["run_id"] for r in listed.json()["runs"]} == ids
    for run_id in ids:
        verified = veritrain("verify", run_id, "--workdir", str(tmp_path))
        assert verified.code == 0, verified.stderr


KILLED_IN_PREPARE = ("import os, signal, sys; sys.path.pop(0); from veritrain.data import prepare; "
                     "prepare.run = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL); "
                     "from veritrain.cli import main; sys.argv[0] = 'veritrain'; main()")


@pytest.mark.slow
def test_a_run_killed_before_its_data_was_recorded_is_continued_by_resume_auto(tmp_path):
    killed = subprocess.run([sys.executable, "-c", KILLED_IN_PREPARE, "train", *TWO_STEPS, "--workdir", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    ((run_id, record),) = records(tmp_path).items()
    assert record["status"] == "running" and record["data"] is None  # killed before it prepared its data
    resumed = veritrain("train", *TWO_STEPS, "--resume", "auto", "--workdir", str(tmp_path), "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["run_id"] == run_id and "no checkpoint was saved yet" in resumed.stderr  # from its initial state
    record = records(tmp_path)[run_id]
    assert record["status"] == "completed" and record["resumes"][0]["previous_status"] == "running"
    assert len(records(tmp_path)) == 1
    assert veritrain("verify", run_id, "--workdir", str(tmp_path)).code == 0


SWEEP = ["--set", "train.epochs=1", "--set", "train.batch_size=512", "--set", "model.name=mlp", "--set", "model.hidden=[8]",
         "--set", "eval.baselines=false", "--set", "export.formats=[safetensors]"]


@pytest.mark.slow
def test_two_concurrent_sweep_resumes_run_each_slot_once(tmp_path):
    driver = start("sweep", *SWEEP, "--vary", "optim.lr=0.1,0.05,0.02", "--workdir", str(tmp_path))
    deadline = time.monotonic() + 300
    while not any(r.get("sweep") for r in records(tmp_path).values()) if (tmp_path / "runs").exists() else True:
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
        time.sleep(0.05)
    driver.kill()  # kill -9 while the parent run trains: its process stops itself, interrupted
    driver.communicate()
    (sweep_id,) = [p.name for p in (tmp_path / ".veritrain" / "sweeps").iterdir()]
    time.sleep(2.0)  # the orphaned trial notices within a second
    resumes = [start("sweep", "--resume", sweep_id, "--workdir", str(tmp_path), "--json") for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in resumes]
    codes = sorted(p.returncode for p in resumes)
    assert codes in ([0, 0], [0, 2]), [err[-2000:] for _, err in outputs]
    if codes == [0, 2]:
        refused = next(err for p, (_, err) in zip(resumes, outputs) if p.returncode == 2)
        assert f"sweep {sweep_id} is still running" in refused.strip().splitlines()[-1]
    slots = [((r["sweep"] or {}).get("trial"), (r.get("repeat") or {}).get("index", 0)) for r in records(tmp_path).values() if r.get("sweep")]
    assert sorted(slots, key=str) == sorted([(None, 0), (0, 0), (1, 0), (2, 0)], key=str)  # each slot once
    assert all(r["status"] == "completed" for r in records(tmp_path).values() if r.get("sweep"))


def test_a_trial_whose_slot_already_has_a_run_reports_that_run_and_starts_none(tmp_path):
    """The slot's claim: a trial process that finds a run of its slot (made by a trial of a killed driver) reports
    or continues that run; it never starts a second one. Its claim is let go as it returns."""
    import tarfile

    from veritrain.orchestration.trials.process import run_trial

    with tarfile.open(Path(__file__).parent / "fixtures" / "legacy" / "legacy-completed.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    (run_dir,) = [p.parent for p in (tmp_path / "runs").glob("*/record.json")]
    sweep_id = run_dir.name[:15] + "-abcdef"
    record = json.loads((run_dir / "record.json").read_text())
    record.update(sweep={"id": sweep_id, "trial": 1, "change": {"optim.lr": 0.1}}, repeat=None)
    (run_dir / "record.json").write_text(json.dumps(record))
    job = {"workspace": str(tmp_path), "cwd": str(tmp_path), "argv": ["veritrain", "sweep"], "driver_pid": os.getpid(), "sweep_id": sweep_id,
           "code": None, "slot": "trial-001", "config_path": None, "overrides": [], "config_hash": record["config_hash"], "hypothesis": "h",
           "parent": None, "smoke": {"status": "skipped"}, "repeat": None, "sweep": record["sweep"], "selection": None}
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert run_trial(job) == {"run_id": run_dir.name, "status": "completed", "error": None}
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before  # no second run of the slot
    assert not (tmp_path / ".veritrain" / "locks" / f"sweep-{sweep_id}-trial-001.lock").exists()
    other = run_trial({**job, "slot": "trial-002", "sweep": {**record["sweep"], "trial": 2}, "config_path": str(tmp_path / "missing.yaml")})
    assert other["status"] == "failed" and other["run_id"] is None  # another slot has no run: this one would start it


def test_gc_leaves_a_run_whose_lock_is_held_alone_and_a_prepare_under_way(tmp_path):
    import shutil
    import tarfile

    from veritrain.orchestration.housekeeping import gc

    with tarfile.open(Path(__file__).parent / "fixtures" / "legacy" / "legacy-completed.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    workspace = Workspace.open(tmp_path)
    (run_dir,) = [p.parent for p in (tmp_path / "runs").glob("*/record.json")]
    steps = sorted(run_dir.glob("checkpoints/step-*.pt"))
    seal = (run_dir / "record.sha256").read_text()
    unfinished = tmp_path / ".veritrain" / "data" / ".tmp-0123"  # a prepare's temp folder, older than gc's minute
    unfinished.mkdir()
    os.utime(unfinished, (time.time() - 3600, time.time() - 3600))
    holders = [subprocess.Popen([sys.executable, "-c", HOLD, str(workspace.lock_path(name))], stdout=subprocess.PIPE, text=True)
               for name in (run_dir.name, "prepare-0123")]
    try:
        assert all(h.stdout is not None and h.stdout.readline() == "held\n" for h in holders)
        result = gc(workspace, dry_run=False)
        assert sorted(run_dir.glob("checkpoints/step-*.pt")) == steps and (run_dir / "record.sha256").read_text() == seal  # untouched
        assert result["resealed"] == [] and unfinished.is_dir() and workspace.lock_path("prepare-0123").exists()
        assert result["data_versions_kept_because"] == f"run {run_dir.name} is in progress"
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert workspace.lock_is_stale("prepare-0123")
    shutil.rmtree(run_dir)  # out of the second pass, which would verify it in full
    gc(workspace, dry_run=False)
    assert not unfinished.exists() and not workspace.lock_path("prepare-0123").exists()  # its holder is gone: both go


def test_a_resume_that_finds_the_run_resumed_meanwhile_refuses_and_lets_go(tmp_path):
    """Two resumes of one run started together: the second takes the lock once the first let go, finds a record that
    is no longer the one it read, and stops (exit 2) rather than continue the run a second time."""
    import tarfile

    from veritrain.orchestration.pipeline import _refuse_resumed_meanwhile
    from veritrain.records.record import read_record
    from veritrain.records.recorder import Recorder

    with tarfile.open(Path(__file__).parent / "fixtures" / "legacy" / "legacy-interrupted.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    workspace = Workspace.open(tmp_path)
    (run_dir,) = [p.parent for p in (tmp_path / "runs").glob("*/record.json")]
    read = Recorder.resume(read_record(run_dir), [])  # the record as this resume holds it
    workspace.lock_run(run_dir.name)
    _refuse_resumed_meanwhile(run_dir, read, workspace)  # unchanged since it was read: the resume goes on
    assert not workspace.lock_is_stale(run_dir.name)
    workspace.unlock_run(run_dir.name)
    on_disk = json.loads((run_dir / "record.json").read_text())
    (run_dir / "record.json").write_text(json.dumps({**on_disk, "status": "completed", "resumes": read["resumes"]}))
    workspace.lock_run(run_dir.name)
    with pytest.raises(UserError, match="another process resumed the run while this one started"):
        _refuse_resumed_meanwhile(run_dir, read, workspace)
    assert workspace.lock_is_stale(run_dir.name)  # let go before refusing
