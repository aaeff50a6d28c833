"""Chaos tests: kill training at random moments (and inside saves), damage checkpoints, blow up the
loss — every time the resumed run ends bit-identical to one never interrupted, or fails cleanly.

The kill schedule comes from a seed printed on failure; `benchmarks/chaos_resume.py` runs the long
version (20 kills).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import in_process_run, veritrain
from veritrain.train import checkpoint

# small, but with everything that carries state: dropout (torch RNG), augmentation (epoch generator),
# momentum, a cosine schedule, step checkpoints mid-epoch, gradient accumulation
CHAOS = [
    "--set", "model.name=mlp", "--set", "model.hidden=[64]", "--set", "model.dropout=0.2",
    "--set", "augment.crop_padding=1", "--set", "augment.hflip=true",
    "--set", "optim.name=sgd", "--set", "optim.lr=0.05", "--set", "train.accumulate_steps=2",
    "--set", "train.batch_size=32", "--set", "train.epochs=10", "--set", "checkpoint.every_steps=5",
    "--set", "logging.every_steps=3", "--set", "train.threads=1",
]


def overrides(args: list[str]) -> list[str]:
    return [a for a in args if a != "--set"]


def start(workdir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "veritrain", *extra, "--workdir", str(workdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def comparable(run_dir: Path) -> tuple[str, list[dict], list[dict], list[dict]]:
    """Final weights hash, metrics.jsonl and steps.jsonl without their wall-clock fields, and the committed
    trajectory (without which step files happen to be kept): a resume replays into the same chain."""
    record = json.loads((run_dir / "record.json").read_text())
    metrics = [{k: v for k, v in json.loads(l).items() if k != "seconds"} for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [{k: v for k, v in json.loads(l).items() if k != "samples_per_s"} for l in (run_dir / "steps.jsonl").read_text().splitlines()]
    trajectory = [{k: v for k, v in e.items() if k not in ("kept", "kept_for_audit")} for e in record["trajectory"]]
    assert len(trajectory) > 1
    return record["final_state_sha256"], metrics, steps, trajectory


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The chaos run never interrupted: the same `veritrain train` command, in this process (the runs it is
    compared with are killed and resumed in processes of their own; a run is bit-identical in either)."""
    workdir = tmp_path_factory.mktemp("reference")
    result = veritrain("train", *CHAOS, "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    return comparable(Path(result.json()["run_dir"]))


def kill_and_resume(workdir: Path, seed: int, kills: int) -> Path:
    """Start the chaos run, SIGKILL it `kills` times at random moments, resume until it completes."""
    rng = random.Random(seed)
    proc = start(workdir, "train", *CHAOS)
    for _ in range(kills):
        deadline = time.monotonic() + 120
        while not list(workdir.glob("runs/*/checkpoints/*.pt")):  # let it get going
            assert proc.poll() is None or proc.returncode == 0, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.0))
        proc.kill()  # SIGKILL: no handler runs, no save, the record says `running`
        proc.wait()
        (run_dir,) = (workdir / "runs").iterdir()
        if json.loads((run_dir / "record.json").read_text())["status"] == "completed":
            return run_dir  # it finished before the kill landed
        proc = start(workdir, "train", "--resume", run_dir.name)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"seed {seed}: {err}"
    (run_dir,) = (workdir / "runs").iterdir()
    return run_dir


@pytest.mark.slow  # processes killed at random moments: checked in `make test-slow`
@pytest.mark.parametrize("seed", [11, 29])
def test_kill_9_at_random_moments_then_resume_is_bit_identical(reference, tmp_path, seed):
    run_dir = kill_and_resume(tmp_path, seed, kills=2)
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "completed"
    assert comparable(run_dir) == reference, f"kill schedule seed {seed}"
    assert verified_here(run_dir)  # the keep rule holds whatever the kills left behind
    assert any(e["kind"] == "resume" for e in record["events"]) or not record["resumes"]


def test_sigterm_saves_and_resume_is_identical(reference, tmp_path):
    proc = start(tmp_path, "train", *CHAOS)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("runs/*/steps.jsonl")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"resume with: veritrain train --resume {run_dir.name}" in err
    assert err.strip().splitlines()[-1] == "error: interrupted by SIGTERM"
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "interrupted"
    saved = checkpoint.load(run_dir / "checkpoints" / "last.pt")
    assert saved["reason"] in ("signal", "epoch")

    resumed = start(tmp_path, "train", "--resume", "auto", *CHAOS)  # auto finds it by config + data version
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert comparable(run_dir) == reference
    record = json.loads((run_dir / "record.json").read_text())
    assert not record["other_saves"] or all(o["after_step"] is not None for o in record["other_saves"])
    assert verified_here(run_dir)  # a signal save is a resume point the keep rule and verify accept


def verified_here(run_dir: Path) -> bool:
    from veritrain.trust.verify import verify_run

    result = verify_run(run_dir, run_dir.parent.parent / ".veritrain")
    assert not result["problems"], result["problems"]
    return result["ok"]


CRASHING_SAVE = """
import os, sys
from pathlib import Path
real_replace, calls = os.replace, {"n": 0}
def dying_replace(src, dst, **folders):
    folder = os.readlink(f"/proc/self/fd/{folders['dst_dir_fd']}") if folders.get("dst_dir_fd") is not None else os.path.dirname(dst)
    if Path(folder).name == "checkpoints" and Path(dst).name.startswith("step-"):
        calls["n"] += 1
        if calls["n"] == int(sys.argv[1]):
            os._exit(137)  # the process dies here, as under SIGKILL: no cleanup, no handler
    return real_replace(src, dst, **folders)
os.replace = dying_replace
from veritrain.cli import main
main(sys.argv[2:])
"""


@pytest.mark.slow  # processes killed at random moments: checked in `make test-slow`
@pytest.mark.parametrize("moment", ["before_rename", "before_sidecar"])
def test_crash_inside_a_save_never_loads_a_broken_checkpoint(reference, tmp_path, moment):
    # renames alternate step-N.pt, step-N.pt.sha256: in the 4th save, die with the temp file written
    # but not renamed (call 7), or with the new step file in place but no sidecar yet (call 8)
    call = 7 if moment == "before_rename" else 8
    crashed = subprocess.run([sys.executable, "-c", CRASHING_SAVE, str(call), "train", *CHAOS, "--workdir", str(tmp_path)],
                             capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 137, crashed.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    path, state, problems = checkpoint.newest_valid(run_dir / "checkpoints")
    assert state is not None
    if moment == "before_sidecar":
        assert any("sha256 is missing" in p for p in problems)  # detected, and an older file is used
    else:
        assert list((run_dir / "checkpoints").glob(".step-*.pt.tmp"))  # the interrupted write's temp file
    # the replay rewrites (and so renames) that temp file; one from a save the replay does not repeat
    # (every_minutes, a signal) would stay and be sealed unless resume removes it
    (run_dir / "checkpoints" / ".step-12345.pt.tmp").write_bytes(b"half a checkpoint")
    (run_dir / ".metrics.jsonl.tmp").write_bytes(b'{"epoch": 1')  # a record or jsonl rewrite dies the same way
    resumed = subprocess.run([sys.executable, "-m", "veritrain", "train", "--resume", run_dir.name, "--workdir", str(tmp_path)],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    if moment == "before_sidecar":  # the file without a sidecar lies after the resume point: removed, not left to count as kept
        assert "which failed its check and lies after the resume point" in resumed.stderr
    assert comparable(run_dir) == reference
    assert not list(run_dir.rglob(".*.tmp"))  # removed on resume, so never sealed
    assert not [name for name in json.loads((run_dir / "record.json").read_text())["artifacts"] if name.endswith(".tmp")]


def test_truncated_and_bitflipped_checkpoints_fall_back(reference, tmp_path):
    # weights and metrics do not depend on keep_last; with 4 kept, whole step files remain after the two
    # newest are damaged below, even when the kill lands between a new step file and its sidecar
    proc = start(tmp_path, "train", *CHAOS, "--set", "checkpoint.keep_last=4")
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("runs/*/checkpoints/step-*.pt"))) < 3:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    time.sleep(0.2)
    proc.kill()
    proc.wait()
    (run_dir,) = (tmp_path / "runs").iterdir()
    folder = run_dir / "checkpoints"
    newest, second = checkpoint.step_files(folder)[0][1], checkpoint.step_files(folder)[1][1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    flipped = bytearray(second.read_bytes())
    flipped[len(flipped) // 2] ^= 0x10
    second.write_bytes(bytes(flipped))  # one bit flipped
    resumed = start(tmp_path, "train", "--resume", run_dir.name)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    # the newest may also have lost its sidecar to the kill (killed between the two writes): skipped either way
    assert f"{newest.name}: content does not match" in err or f"{newest.name}: its {newest.name}.sha256 is missing" in err, err
    assert f"{second.name}: content does not match" in err
    final, metrics, steps, trajectory = comparable(run_dir)
    assert (final, metrics, steps) == reference[:3]
    # keep_last is part of the config, whose hash the states and the chain include: the weights along the way are the same
    assert [(e["step"], e["model_sha256"]) for e in trajectory] == [(e["step"], e["model_sha256"]) for e in reference[3]]


def test_no_valid_checkpoint_exits_1(cli, small_run_copy):
    """An interrupted run (the small run, marked interrupted as a kill leaves it) whose every checkpoint is damaged."""
    from veritrain.records.record import write_record

    workdir, run_dir = small_run_copy.workdir, small_run_copy.run_dir
    record = json.loads((run_dir / "record.json").read_text())
    record.update(status="interrupted", error={"type": "Interrupted", "message": "interrupted by SIGKILL"})
    write_record(run_dir, record)
    for path in (run_dir / "checkpoints").glob("*.pt"):
        path.write_bytes(b"garbage")
    resumed = cli("train", "--resume", "latest", "--workdir", str(workdir))
    assert resumed.code == 1
    assert resumed.stderr.strip().splitlines()[-1] == f"error: run {run_dir.name} failed: resume: no valid checkpoint in {run_dir / 'checkpoints'}; start a new run instead"


def test_resume_refuses_a_completed_run(cli, small_run_copy):
    run_id, workdir = small_run_copy.run_dir.name, small_run_copy.workdir
    again = cli("train", "--resume", run_id, "--workdir", str(workdir))
    assert again.code == 2
    assert again.stderr == f"error: --resume {run_id}: run {run_id} already completed; start a new run instead\n"


def test_huge_learning_rate_rolls_back_then_stops(cli, tmp_path):
    result = cli("run", "--set", "optim.lr=1e6", "--no-smoke", "--workdir", str(tmp_path))
    assert result.code == 1
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: run ") and "stopped after 3 rollback(s)" in last_line
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "record.json").read_text())
    kinds = [e["kind"] for e in record["events"]]
    assert kinds == ["rollback", "rollback", "rollback", "nonfinite_stop"]
    assert record["status"] == "failed"
    assert all(e["step"] <= 10 for e in record["events"])  # caught within a step of going non-finite


@pytest.mark.parametrize("policy, expected", [("stop", ["nonfinite_stop"]), ("skip_batch", "skip")])
def test_nonfinite_policies(tmp_path, policy, expected, monkeypatch):
    import torch

    from veritrain.tasks.classification import ClassificationTask

    original = ClassificationTask.loss
    calls = {"n": 0}

    def sometimes_nan(self, outputs, targets):
        calls["n"] += 1
        loss = original(self, outputs, targets)
        return loss * float("nan") if calls["n"] == 4 else loss

    monkeypatch.setattr(ClassificationTask, "loss", sometimes_nan)
    outcome = in_process_run(tmp_path, ["train.epochs=1", "model.name=mlp", f"train.on_nonfinite={policy}"])
    kinds = [e["kind"] for e in outcome.record["events"]]
    if expected == "skip":
        assert outcome.record["status"] == "completed" and kinds == ["skip_batch"]
    else:
        assert outcome.record["status"] == "failed" and kinds == expected
        assert "on_nonfinite is stop" in outcome.record["error"]["message"]


@pytest.mark.parametrize("failing_save", [2, 3])  # the 3rd save is the first after which an old step file is deleted
def test_disk_full_during_save_fails_and_keeps_previous_checkpoint(tmp_path, monkeypatch, failing_save):
    calls = {"n": 0}

    def full_disk(real_sync):
        def sync(fd):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if Path(target).name.startswith(".step-") and target.endswith(".pt.tmp"):
                calls["n"] += 1
                if calls["n"] == failing_save:  # this checkpoint's bytes do not fit on the disk
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_sync(fd)
        return sync

    for name in ("fsync", "fdatasync"):  # whichever the write uses for the data
        if hasattr(os, name):
            monkeypatch.setattr(os, name, full_disk(getattr(os, name)))
    outcome = in_process_run(tmp_path, ["train.epochs=3", "model.name=mlp"])
    assert outcome.record["status"] == "failed"
    assert "No space left on device" in outcome.record["error"]["message"]
    assert "previous checkpoint is intact" in outcome.record["error"]["message"]
    run_dir = Path(outcome.summary["run_dir"])
    path, previous, problems = checkpoint.newest_valid(run_dir / "checkpoints")  # loads and matches its sidecar
    assert previous["loop"]["epochs_done"] == failing_save - 1 and not problems
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))


def test_checkpoint_holds_the_full_state(tmp_path):
    # `veritrain train`: the checkpoints are the training's (eval and export only read them)
    outcome = in_process_run(tmp_path, ["train.epochs=2", "model.name=mlp", "checkpoint.every_steps=10", "checkpoint.keep_last=2"], kind="train")
    assert outcome.record["status"] == "completed"
    folder = Path(outcome.summary["run_dir"]) / "checkpoints"
    state = checkpoint.load(folder / "last.pt")
    for key in ("model", "optimizer", "scheduler", "scaler", "extra", "rng", "loop", "settings", "config_hash", "data_version",
                "format_version", "engine"):
        assert key in state, key
    for key in ("step", "epochs_done", "order", "guard", "trajectory", "other_saves"):
        assert key in state["loop"], key
    assert set(state["extra"]["sums"]) == {"loss_sum", "seen", "stats"} and set(state["extra"]["best"]) == {"value", "epoch", "step", "bad_epochs"}
    assert set(state["loop"]["guard"]) == {"rollbacks", "lr_factor"}
    assert set(state["settings"]) == {"device", "threads", "num_workers"}
    assert len(checkpoint.step_files(folder)) == 2  # keep_last
    assert not any(p.is_symlink() for p in folder.iterdir())
    assert (folder / "best.pt.sha256").exists()


@pytest.mark.slow  # processes killed at random moments: checked in `make test-slow`
def test_killed_before_the_first_checkpoint_resumes_from_the_beginning(reference, tmp_path):
    crashed = subprocess.run([sys.executable, "-c", CRASHING_SAVE, "1", "train", *CHAOS, "--workdir", str(tmp_path)],
                             capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 137, crashed.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not list((run_dir / "checkpoints").glob("*.pt"))
    resumed = subprocess.run([sys.executable, "-m", "veritrain", "train", "--resume", "latest", "--workdir", str(tmp_path)],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "no checkpoint was saved yet" in resumed.stderr
    assert comparable(run_dir) == reference


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_trace_of_itself(tmp_path, monkeypatch):
    checkpoint.write(tmp_path, b"first", ["step-1.pt"], keep_last=2)

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for name in ("fsync", "fdatasync"):  # whichever the write uses for the data
        if hasattr(os, name):
            monkeypatch.setattr(os, name, full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.write(tmp_path, b"second", ["step-2.pt"], keep_last=1)
    monkeypatch.undo()  # the disk has room again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1.pt", "step-1.pt.sha256"]  # no temp file, nothing pruned
    assert (tmp_path / "step-1.pt").read_bytes() == b"first"
    checkpoint.write(tmp_path, b"second", ["step-2.pt"], keep_last=1)  # the next save works as usual
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2.pt", "step-2.pt.sha256"]
    assert (tmp_path / "step-2.pt").read_bytes() == b"second"


def test_a_save_prunes_step_files_left_by_an_earlier_process(tmp_path):
    for step in (5, 10, 15):  # a resumed run's folder: keep_last was 3 then
        (tmp_path / f"step-{step}.pt").write_bytes(b"old")
        (tmp_path / f"step-{step}.pt.sha256").write_text("x\n")
    checkpoint.write(tmp_path, b"new", ["best.pt", "step-20.pt"], keep_last=2)
    checkpoint.write(tmp_path, b"newer", ["step-25.pt"], keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.pt", "best.pt.sha256", "step-20.pt", "step-20.pt.sha256", "step-25.pt", "step-25.pt.sha256"]
    assert (tmp_path / "step-25.pt.sha256").read_text().strip() == hashlib.sha256(b"newer").hexdigest()
    assert (tmp_path / "best.pt.sha256").read_text().strip() == hashlib.sha256(b"new").hexdigest()


def test_a_new_step_file_is_a_new_file_and_the_kept_ones_are_left_alone(tmp_path):
    checkpoint.write(tmp_path, b"a" * 5000, ["step-1.pt"], keep_last=2)
    checkpoint.write(tmp_path, b"b" * 5000, ["step-2.pt"], keep_last=2)
    oldest = (tmp_path / "step-1.pt").stat().st_ino
    kept = (tmp_path / "step-2.pt").stat()
    checkpoint.write(tmp_path, b"c" * 3000, ["step-3.pt"], keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2.pt", "step-2.pt.sha256", "step-3.pt", "step-3.pt.sha256"]
    assert (tmp_path / "step-3.pt").stat().st_ino != oldest  # created while the oldest still existed, then that one deleted
    assert (tmp_path / "step-3.pt").read_bytes() == b"c" * 3000
    assert (tmp_path / "step-3.pt.sha256").read_text().strip() == hashlib.sha256(b"c" * 3000).hexdigest()
    after = (tmp_path / "step-2.pt").stat()
    assert (after.st_ino, after.st_mtime_ns, (tmp_path / "step-2.pt").read_bytes()) == (kept.st_ino, kept.st_mtime_ns, b"b" * 5000)


def test_keep_last_1_writes_the_new_file_before_deleting_the_old(tmp_path, monkeypatch):
    checkpoint.write(tmp_path, b"first", ["step-1.pt"], keep_last=1)
    first_inode = (tmp_path / "step-1.pt").stat().st_ino
    seen = []
    real_write = checkpoint.write_atomic

    def watching(path, *args, **kwargs):
        seen.append(sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")))
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "write_atomic", watching)
    checkpoint.write(tmp_path, b"second", ["step-2.pt"], keep_last=1)
    # the only previous checkpoint stays until the new one and its sidecar are in place
    assert seen == [["step-1.pt", "step-1.pt.sha256"], ["step-1.pt", "step-1.pt.sha256", "step-2.pt"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2.pt", "step-2.pt.sha256"]
    assert (tmp_path / "step-2.pt").stat().st_ino != first_inode  # a new file, not the old one overwritten


def test_resume_clears_broken_step_files_after_its_start_so_they_never_crowd_out_a_whole_one(tmp_path, monkeypatch):
    def state(step):
        return checkpoint.encode({"model": {}, "loop": {"step": step, "epochs_done": 0}})

    (tmp_path / "step-32.pt").write_bytes(state(32))  # the newest valid one: where the resume starts
    (tmp_path / "step-32.pt.sha256").write_text(hashlib.sha256(state(32)).hexdigest() + "\n")
    (tmp_path / "step-33.pt").write_bytes(state(33)[:100])  # a signal save killed before its sidecar
    path, _, problems = checkpoint.newest_valid(tmp_path)
    assert path.name == "step-32.pt" and problems
    assert checkpoint.discard_after(tmp_path, 32) == ["step-33.pt"]
    real_write = checkpoint.write_atomic
    loadable_while_writing = []

    def watching(path, *args, **kwargs):
        found, _, _ = checkpoint.newest_valid(tmp_path)  # what a resume would find if the process died now
        loadable_while_writing.append((path.name, found.name if found else None))
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "write_atomic", watching)
    for step in (36, 40, 50):
        checkpoint.write(tmp_path, state(step), [f"step-{step}.pt"], keep_last=2)
    assert all(found is not None for _, found in loadable_while_writing), loadable_while_writing
    assert [p.name for _, p in checkpoint.step_files(tmp_path)] == ["step-50.pt", "step-40.pt"]
