"""Data-parallel training with several processes (gloo on the CPU): `--nproc N` through torchrun, the
same guarantees as one process (determinism, verify, reproduce, exact resume), a lost rank, and how
close N=2 comes to N=1 with the same global batch (docs/distributed.md states the tolerance)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import veritrain

from veritrain.train import recipe

# 4 epochs of 23 steps, a checkpoint every 10 steps: room to kill a rank mid-epoch after a checkpoint
LONG = ["--set", "train.epochs=4", "--set", "checkpoint.every_steps=10"]


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "record.json").read_text())


def start_training(workdir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "veritrain", "train", "--nproc", "2", *LONG, *extra, "--workdir", str(workdir), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(pattern: str, workdir: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(workdir.glob(pattern)):
            return
        time.sleep(0.01)
    raise AssertionError(f"{pattern} never appeared")


def rank_pid(rank: int) -> int:
    """The process of one rank started by the launcher (torchrun's worker, not torchrun itself)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            command = Path(f"/proc/{name}/cmdline").read_bytes()
            environment = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"veritrain.train.distributed" in command and b"torch.distributed.run" not in command and f"RANK={rank}".encode() in environment:
            return int(name)
    raise AssertionError(f"no process for rank {rank}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The reference: a 2-rank run of LONG, never interrupted."""
    workdir = tmp_path_factory.mktemp("reference")
    result = veritrain("train", "--nproc", "2", *LONG, "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    return Path(result.json()["run_dir"])


@pytest.mark.slow  # two-rank runs end to end: checked in `make test-slow`
def test_two_process_run_completes_verifies_reproduces_and_records_world_size(tmp_path):
    result = veritrain("run", "--nproc", "2", "--no-smoke", "--set", "train.epochs=2", "--workdir", str(tmp_path), "--json")
    assert result.code == 0, result.stderr
    run_dir = Path(result.json()["run_dir"])
    described = record(run_dir)["distributed"]
    assert described["world_size"] == 2 and described["nodes"] == 1 and described["backend"] == "gloo"
    assert described["devices"] == ["cpu", "cpu"] and described["launch"][0] == "torchrun"
    assert record(run_dir)["training"]["engine"] == recipe.ENGINE  # the recipe trains several processes as it trains one
    import torch

    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert saved["distributed"]["world_size"] == 2 and len(saved["distributed"]["ranks"]) == 2  # every rank's RNG states
    assert "train.rank1.log" in record(run_dir)["artifacts"]  # the other rank's log is sealed with the run
    assert "rank 1 of 2" in (run_dir / "train.rank1.log").read_text()
    assert not (tmp_path / ".veritrain" / "distributed" / run_dir.name).exists()  # the hand-off folder is gone

    verified = veritrain("verify", run_dir.name, "--workdir", str(tmp_path), "--json")
    assert verified.code == 0 and verified.json()["ok"], verified.stdout
    checked = veritrain("check", run_dir.name, "--workdir", str(tmp_path), "--json")
    rows = {row["id"]: row["status"] for row in checked.json()["items"]}
    assert rows["checkpoint_with_optimizer"] == "pass" and rows["run_verifies"] == "pass" and rows["test_metrics"] == "pass"
    assert record(run_dir)["metrics"]["test"]["checkpoint"]  # the run's own evaluation read rank 0's checkpoint

    # the same config and world size give the same final state: reproduce re-runs it with 2 ranks
    reproduced = veritrain("reproduce", run_dir.name, "--workdir", str(tmp_path), "--json")
    assert reproduced.code == 0, reproduced.stderr
    assert reproduced.json()["verdict"] == "identical"
    copy = tmp_path / "runs" / reproduced.json()["reproduction"]
    assert record(copy)["distributed"]["world_size"] == 2
    assert record(copy)["final_state_sha256"] == record(run_dir)["final_state_sha256"]


@pytest.mark.slow  # two-rank runs end to end: checked in `make test-slow`
def test_killing_a_rank_interrupts_the_run_and_resume_ends_bit_identical(uninterrupted, tmp_path):
    process = start_training(tmp_path)
    wait_for("runs/*/checkpoints/step-20.pt", tmp_path)
    os.kill(rank_pid(1), signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rank 1 of 2 was lost (killed by SIGKILL)" in errors[0], stderr
    assert "Traceback" not in stderr and "ChildFailedError" not in stderr  # torchrun's own report stays out of sight
    run_dir = Path(json.loads(stdout)["run_dir"])
    assert record(run_dir)["status"] == "interrupted" and record(run_dir)["error"]["type"] == "RankLost"
    assert veritrain("verify", run_dir.name, "--workdir", str(tmp_path)).code == 0  # an interrupted run is sealed too

    refused = veritrain("train", "--resume", run_dir.name, "--nproc", "1", "--workdir", str(tmp_path))
    assert refused.code == 2 and "trained by 2 process(es)" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1

    resumed = veritrain("train", "--resume", run_dir.name, "--workdir", str(tmp_path), "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["final_state_sha256"] == record(uninterrupted)["final_state_sha256"]
    reference_rows = (uninterrupted / "metrics.jsonl").read_text().splitlines()
    resumed_rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    strip = lambda rows: [{k: v for k, v in json.loads(r).items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(resumed_rows) == strip(reference_rows)
    assert record(run_dir)["resumes"] and record(run_dir)["distributed"]["world_size"] == 2


@pytest.mark.slow  # two-rank runs end to end: checked in `make test-slow`
def test_ranks_that_build_batches_in_workers_and_validate_inside_epochs_train_the_same_weights(uninterrupted, tmp_path):
    """Each rank's batches built by a worker process, and a validation every 10 steps (rank 0's, inside epochs): the
    weights are those of the same ranks building their own batches and validating at epoch ends."""
    result = veritrain("train", "--nproc", "2", *LONG, "--set", "train.num_workers=1", "--set", "eval.every_steps=10",
                       "--workdir", str(tmp_path), "--json", timeout=600)
    assert result.code == 0, result.stderr
    run_dir = Path(result.json()["run_dir"])
    assert record(run_dir)["final_state_sha256"] == record(uninterrupted)["final_state_sha256"]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [10, 20, 30, 40, 50, 60, 70, 80, 90, 92]
    assert veritrain("verify", run_dir.name, "--workdir", str(tmp_path)).code == 0


@pytest.mark.slow
def test_sigterm_to_the_launcher_saves_on_every_rank_and_resume_is_identical(uninterrupted, tmp_path):
    process = start_training(tmp_path)
    wait_for("runs/*/checkpoints/step-20.pt", tmp_path)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    run_dir = Path(json.loads(stdout)["run_dir"])
    assert record(run_dir)["status"] == "interrupted"
    resumed = veritrain("train", "--resume", run_dir.name, "--workdir", str(tmp_path), "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["final_state_sha256"] == record(uninterrupted)["final_state_sha256"]


@pytest.mark.slow
def test_a_nonfinite_loss_rolls_back_every_rank_alike_and_then_stops(tmp_path):
    """The guard judges the loss of the whole batch, summed over the ranks, so every rank rolls back at the same step
    (a rank that went on alone would leave the others waiting in a collective)."""
    result = veritrain("train", "--nproc", "2", "--set", "optim.lr=1e6", "--set", "model.name=mlp", "--workdir", str(tmp_path), "--json")
    assert result.code == 1, result.stderr
    assert "stopped after 3 rollback(s)" in result.stderr.strip().splitlines()[-1]
    (run_dir,) = (tmp_path / "runs").iterdir()
    kinds = [e["kind"] for e in record(run_dir)["events"]]
    assert kinds == ["rollback", "rollback", "rollback", "nonfinite_stop"] and record(run_dir)["status"] == "failed"


def test_two_ranks_agree_with_one_process_at_the_same_global_batch(tmp_path):
    """With a model without BatchNorm the only difference is the order of float additions (the ranks'
    gradients are averaged): weights agree to 1e-4 and the epoch losses to 1e-5 relative, as documented.
    (BatchNorm per rank normalises each half batch on its own: a different model, compared in the docs.)"""
    import torch

    common = ["--set", "train.epochs=3", "--set", "model.name=mlp", "--set", "train.threads=1", "--workdir", str(tmp_path), "--json"]
    runs = []
    for nproc in ("1", "2"):
        result = veritrain("train", "--nproc", nproc, *common)
        assert result.code == 0, result.stderr
        runs.append(Path(result.json()["run_dir"]))
    one, two = (torch.load(r / "checkpoints" / "last.pt", weights_only=True)["model"] for r in runs)
    assert record(runs[0])["final_state_sha256"] != record(runs[1])["final_state_sha256"]  # not bit-identical, and not claimed to be
    for name in one:
        assert torch.allclose(one[name].float(), two[name].float(), atol=1e-4, rtol=0), name
    rows = [[json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in runs]
    for a, b in zip(*rows):
        for key in ("train_loss", "val_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-5)
        assert a["val_acc"] == b["val_acc"]


@pytest.mark.slow
def test_torchrun_started_by_hand_trains_the_same_run(tmp_path):
    """`torchrun --nproc-per-node 2 -m veritrain train` (the multi-machine form) gives the same final state as --nproc 2."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "veritrain", "train",
               "--set", "train.epochs=2", "--workdir", str(tmp_path), "--json"]
    by_hand = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert by_hand.returncode == 0, by_hand.stderr
    documents = json.loads(by_hand.stdout)  # one JSON document: the other rank prints nothing
    launched = veritrain("train", "--nproc", "2", "--set", "train.epochs=2", "--workdir", str(tmp_path), "--json")
    assert launched.code == 0, launched.stderr
    assert documents["final_state_sha256"] == launched.json()["final_state_sha256"]
    described = record(Path(documents["run_dir"]))["distributed"]
    assert described["world_size"] == 2 and described["launch"][:3] == ["torchrun", "--nnodes=1", "--nproc-per-node=2"]


# ---------------------------------------------------------------- pieces, without processes


def test_batches_split_into_contiguous_shares_and_tiny_last_batches_are_dropped():
    import numpy as np

    from veritrain.train.distributed import Ranks, shard
    from veritrain.train.loop import batch_starts

    rows = np.arange(7)
    shares = [shard(rows, Ranks(rank, 2, rank, 2)).tolist() for rank in (0, 1)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6]]
    assert batch_starts(10, 4) == [0, 4, 8]  # one process: a last batch of 2 stays
    assert batch_starts(9, 4) == [0, 4]  # … of 1 is dropped (as before)
    assert batch_starts(11, 4, world_size=2) == [0, 4]  # 3 samples: fewer than 2 per rank, dropped
    assert batch_starts(12, 4, world_size=2) == [0, 4, 8]


@pytest.mark.parametrize("statuses, torchrun_report, expected, code", [
    ({0: {"status": "peer_lost", "message": "x"}}, "rank       : 1 (local_rank: 1)\n  exitcode   : -9 (pid: 7)", "killed by SIGKILL", 1),
    ({0: {"status": "peer_lost", "message": "x"}}, "rank       : 1 (local_rank: 1)\n  exitcode   : -15 (pid: 7)", "killed by SIGTERM", 143),
    ({0: {"status": "peer_lost", "message": "x"}}, "", "exited without reporting", 1),
    ({0: {"status": "failed", "message": "train: loss became nan"}, 1: {"status": "failed", "message": "other"}}, "", "loss became nan", 1),
    ({0: {"status": "user_error", "message": "resume: saved by 4"}, 1: {"status": "user_error", "message": "y"}}, "", "saved by 4", 2),
    ({0: {"status": "interrupted", "signum": 2}, 1: {"status": "interrupted", "signum": 2}}, "", "interrupted by SIGINT", 130),
])
def test_rank_exits_map_onto_the_exit_code_contract(tmp_path, statuses, torchrun_report, expected, code):
    from veritrain.core.errors import Interrupted, VeritrainError
    from veritrain.train import distributed

    for rank, status in statuses.items():
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(status))
    (tmp_path / "torchrun.log").write_text(torchrun_report)
    with pytest.raises((VeritrainError, Interrupted)) as raised:
        distributed._outcome(tmp_path / "runs" / "20261130-000000-000-abcdef", tmp_path, 2, 1, None, [])
    assert expected in str(raised.value) and raised.value.exit_code == code
    if "lost" in expected or "killed" in expected or "reporting" in expected:
        assert isinstance(raised.value, distributed.RankLost)


def test_a_config_that_cannot_run_on_n_ranks_is_refused_before_a_run_exists(tmp_path):
    result = veritrain("train", "--nproc", "4", "--set", "train.batch_size=6", "--workdir", str(tmp_path))
    assert result.code == 2 and not (tmp_path / "runs").exists()
    assert result.stderr.strip().splitlines() == ["error: --nproc 4: train.batch_size: 6 gives fewer than 2 samples to each of 4 ranks; "
                                                  "use at least 8 (it is the global batch, split over the ranks)"]


# ---------------------------------------------------------------- a user's script under torchrun (vt.start)

SCRIPT = Path(__file__).parent / "scripts" / "ddp_loop.py"


def torchrun_script(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(SCRIPT), *args]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture()
def script_folder(tmp_path) -> Path:
    import numpy as np

    generator = np.random.default_rng(0)
    x = generator.normal(size=(96, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1)
    np.savetxt(tmp_path / "data.csv", np.c_[x, y], delimiter=",", fmt="%.6f")
    return tmp_path


@pytest.mark.slow
def test_a_script_under_torchrun_is_one_run_that_a_killed_rank_resumes_bit_identical(script_folder):
    """Every rank runs the script; rank 0 keeps the run. A rank killed mid-run interrupts it, and the same torchrun
    command with resume="auto" ends at the weights of an uninterrupted launch, which a second launch also reaches."""
    done = torchrun_script(script_folder)
    assert done.returncode == 0, done.stderr
    (reference,) = (script_folder / "runs").iterdir()
    assert record(reference)["status"] == "completed" and record(reference)["distributed"]["world_size"] == 2
    assert record(reference)["guarantee"]["level"] == "bound" and "2 processes" in record(reference)["guarantee"]["reasons"][0]
    assert len((reference / "metrics.jsonl").read_text().splitlines()) == 18  # rank 0 alone logs: 3 epochs of 6 steps
    import torch

    saved = torch.load(reference / "checkpoints" / "last.pt", weights_only=True)
    assert [set(part) for part in saved["distributed"]["ranks"]] == [{"rng"}, {"rng"}]  # every rank's RNG states, on rank 0
    assert veritrain("verify", reference.name, "--workdir", str(script_folder)).code == 0
    for command in ("audit", "reproduce"):  # a replay runs one process: refused, naming what checks it instead
        refused = veritrain(command, reference.name, "--workdir", str(script_folder))
        assert refused.code == 2 and "2 processes (torchrun)" in refused.stderr, refused.stderr

    killed = torchrun_script(script_folder, env={"DDP_KILL_AT": "10"})
    assert killed.returncode != 0
    (interrupted,) = [run for run in (script_folder / "runs").iterdir() if run != reference]
    assert record(interrupted)["status"] == "interrupted", (record(interrupted)["status"], record(interrupted).get("error"), killed.stderr[-6000:-2000])
    refused = veritrain("train", "--resume", interrupted.name, "--workdir", str(script_folder))
    assert refused.code == 2 and "under the same torchrun command" in refused.stderr, refused.stderr
    resumed = torchrun_script(script_folder, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert record(interrupted)["status"] == "completed" and record(interrupted)["resumes"]
    assert record(interrupted)["final_state_sha256"] == record(reference)["final_state_sha256"]


@pytest.mark.slow
def test_a_script_under_torchrun_rolls_back_on_every_rank_when_one_ranks_loss_turns_nonfinite(script_folder):
    done = torchrun_script(script_folder, "--guard", "rollback", "--nan-at", "4")
    assert done.returncode == 0, done.stderr
    (run_dir,) = (script_folder / "runs").iterdir()
    assert [e["kind"] for e in record(run_dir)["events"]] == ["rollback"] and record(run_dir)["status"] == "completed"
    assert record(run_dir)["events"][0]["step"] == 5  # the step after the checkpoint at 3, on both ranks
