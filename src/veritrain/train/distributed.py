"""Data-parallel training over several processes, launched by PyTorch's torchrun.

Two ways in, one training (the engine the run's record names, `veritrain.train.engines.train` with `ranks`):

- `veritrain run|train CONFIG --nproc N`: this process prepares the data and owns the run record, then
  starts `python -m torch.distributed.run --standalone --nproc-per-node N -m veritrain.train.distributed`
  for the training stage only (`launch`). It shows rank 0's log while the ranks train, and when they
  stop it decides the run's status and exit code: a rank that dies takes the others down (torchrun
  stops them), and the run ends `interrupted` with one line naming the lost rank.
- `torchrun --nnodes M --nproc-per-node N … -m veritrain train CONFIG` (several machines): every rank
  runs the command; rank 0 creates the run and tells the others where it is (`announce`/`follow`).

What stays exact: the data order of an epoch is one global permutation drawn from (seed, epoch), each
global batch is split into world-size contiguous shares (`shard`), and the loss, sample count and task
statistics of every batch are summed over the ranks (`reduce_batch`), so the loss, metrics, best
epoch, early stopping and non-finite handling are the same on every rank and mean what they mean with
one process. Gradients are averaged by DistributedDataParallel. Every checkpoint holds each rank's RNG
states, gathered by rank 0, which alone writes files (besides each rank's own `train.rank<k>.log`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from veritrain.core import logs
from veritrain.core.errors import Interrupted, RunFailed, UserError
from veritrain.core.signals import interruptible
from veritrain.records import usercode
from veritrain.records.record import read_record
from veritrain.tasks import get_task
from veritrain.train.ranks import (  # noqa: F401  (the ranks' names, used through this module by the launch side and its callers)
    COLLECTIVE_TIMEOUT,
    LOST_PEER_SIGNS,
    NPROC_MARKER,
    ONE_PROCESS,
    RANK_VARIABLES,
    RESULT_FILE,
    TORCHRUN_MARKER,
    BatchSums,
    PeerLost,
    RankLost,
    Ranks,
    agreed_signal,
    broadcast,
    collective,
    config_problem,
    describe,
    from_environment,
    gather,
    join_for_training,
    join_from_environment,
    lost_peer,
    reduce_batch,
    refuse_stray_rank_variables,
    resolve_backend,
    shard,
    signal_slots,
    start,
    stop_group,
    stray_rank_variables,
    sum_batch,
    torchrun_command,
)

if TYPE_CHECKING:
    from veritrain.core.signals import StopFlag

log = logging.getLogger("veritrain")


def launch(run_dir: Path, state_dir: Path, data_path: Path, nproc: int, resume: bool, stop: StopFlag,
           threads: Optional[int]) -> dict[str, Any]:
    """Train the run in `run_dir` with `nproc` processes on this machine through torchrun; returns rank 0's
    result (TrainResult fields, events, devices, launch command). Raises RankLost, RunFailed, UserError or
    Interrupted with one line when the ranks did not all finish."""
    handoff = state_dir / "distributed" / run_dir.name
    shutil.rmtree(handoff, ignore_errors=True)
    handoff.mkdir(parents=True)
    (handoff / "data_path").write_text(str(data_path), encoding="utf-8")  # the data version the launcher prepared
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc-per-node={nproc}",
               "--max-restarts=0", "--monitor-interval=0.1", "-m", "veritrain.train.distributed", str(run_dir), str(handoff)]
    if resume:
        command.append("--resume")
    env = dict(os.environ)
    # torchrun would set 1 with a banner; the loop sets train.threads itself when given
    env.setdefault("OMP_NUM_THREADS", str(threads or 1))
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "10")  # seconds a rank gets to stop before SIGKILL
    env["PYTHONUNBUFFERED"] = "1"
    env[NPROC_MARKER] = "1"
    log_path = run_dir / "train.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    torchrun_log = handoff / "torchrun.log"
    log.debug("launch: %s", " ".join(command))
    with open(torchrun_log, "wb") as out:
        # its own session: a Ctrl-C in the terminal reaches this process only, which passes exactly one
        # signal on to torchrun, which passes one to each rank (two would stop a rank mid-step)
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        forwarded = False
        with stop.deferred():
            while process.poll() is None:
                offset = _echo_new_lines(log_path, offset)
                if stop.signum is not None and not forwarded:
                    process.send_signal(stop.signum)
                    forwarded = True
                time.sleep(0.2)
        _echo_new_lines(log_path, offset)
    try:
        return _outcome(run_dir, handoff, nproc, process.returncode, stop.signum, command)
    finally:
        if process.returncode == 0:
            shutil.rmtree(handoff, ignore_errors=True)


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(.*)$")


def _echo_new_lines(path: Path, offset: int) -> int:
    """Show the INFO and higher lines rank 0 appended to train.log since `offset` (this process's own log
    handler must not see them: they are in the file already)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return offset
    complete = chunk[: chunk.rfind(b"\n") + 1]
    level = "INFO"
    for line in complete.decode("utf-8", errors="replace").splitlines():
        match = LOG_LINE.match(line)
        if match:
            level, line = match.group(1), match.group(2)
        if level == "DEBUG":
            continue
        prefix = f"{level.lower()}: " if level in ("WARNING", "ERROR", "CRITICAL") else ""
        sys.stderr.write(f"{prefix}{line}\n")
    sys.stderr.flush()
    return offset + len(complete)


FAILURE_BLOCK = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def _outcome(run_dir: Path, handoff: Path, nproc: int, returncode: int, launcher_signal: Optional[int], command: list[str]) -> dict[str, Any]:
    statuses: dict[int, dict[str, Any]] = {}
    for rank in range(nproc):
        path = handoff / f"rank{rank}.json"
        if path.exists():
            try:
                statuses[rank] = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                pass
    result_path = handoff / RESULT_FILE
    if returncode == 0 and result_path.exists() and all(statuses.get(r, {}).get("status") == "completed" for r in range(nproc)):
        result = json.loads(result_path.read_text(encoding="utf-8"))
        result["launch"] = ["torchrun", *command[3:]]  # `python -m torch.distributed.run` is torchrun
        return result
    events = statuses.get(0, {}).get("events") or []
    if launcher_signal is not None:
        raise _with_events(Interrupted(launcher_signal), events)
    # torchrun's report names each failed rank with its exit code (negative: the signal that killed it)
    reported = {int(rank): int(code) for rank, code in FAILURE_BLOCK.findall(_tail(handoff / "torchrun.log"))}
    lost = [rank for rank in range(nproc) if rank not in statuses]
    for rank in range(nproc):  # a rank's own verdict comes first: a config problem, a failed run
        status = statuses.get(rank, {})
        if status.get("status") == "user_error":
            raise _with_events(UserError(status["message"]), events)
        if status.get("status") == "failed":
            raise _with_events(RunFailed(status["message"]), events)
    if lost:
        rank = lost[0]
        code = reported.get(rank)
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 and -code in signal.valid_signals() else (
            f"exit code {code}" if code is not None else "it exited without reporting")
        exit_code = 128 - code if code in (-signal.SIGINT, -signal.SIGTERM) else 1
        raise _with_events(RankLost(f"rank {rank} of {nproc} was lost ({how}); the other ranks stopped without it. "
                                    f"The run is interrupted at its newest scheduled checkpoint; resume with: veritrain train --resume {run_dir.name}",
                                    exit_code), events)
    interrupted = next((s for s in statuses.values() if s.get("status") == "interrupted"), None)
    if interrupted is not None:
        raise _with_events(Interrupted(int(interrupted.get("signum") or signal.SIGTERM)), events)
    crashed = next(((r, s) for r, s in sorted(statuses.items()) if s.get("status") == "error"), None)
    if crashed is not None:
        rank, status = crashed
        where = "train.log" if rank == 0 else f"train.rank{rank}.log"
        raise _with_events(RunFailed(f"rank {rank}: {status['message']} (traceback in {run_dir / where})"), events)
    raise _with_events(RunFailed(f"the ranks stopped with exit code {returncode}; see {handoff / 'torchrun.log'}"), events)


def _with_events(err: BaseException, events: list[dict[str, Any]]) -> BaseException:
    err.train_events = events  # type: ignore[attr-defined]  # what rank 0 recorded before it stopped
    return err


def _tail(path: Path, limit: int = 200_000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


# ---------------------------------------------------------------- one rank


def train_rank(ranks: Ranks, run_dir: Path, data_path: Path, resume: bool, events: list[dict[str, Any]],
               result_file: Optional[Path] = None) -> tuple[dict[str, Any], int]:
    """Train one rank's share of the run in `run_dir`, the rank of a torchrun launch: by `launch` (`worker`) or by hand
    (`veritrain.orchestration.pipeline.follow`). Trains the run's recorded config on the data version at `data_path`, building the
    model from the run's recorded copies of the user's code; rank 0 writes its TrainResult and `events` to
    `result_file` when given. Returns this rank's status (as `rank<k>.json` holds it) and exit code; a failure is
    logged here in one line (a bug's traceback at DEBUG, in the rank's log)."""
    from veritrain.core.config import resolved_from_record
    from veritrain.data import prepare
    from veritrain.train import engines

    try:
        with interruptible() as stop:
            record = read_record(run_dir)
            cfg = resolved_from_record(record).config
            data = prepare.load_version(data_path)
            if data.version != record["data"]["version"]:
                raise RunFailed(f"data version {data.version[:12]} is not the run's {record['data']['version'][:12]}")
            with usercode.recorded(run_dir, record, run_dir.parent.parent / usercode.STATE_SCRATCH, "train"):
                result = engines.train(engines.of_record(record), cfg, data, get_task(cfg), run_dir, stop, None, resume=resume, events=events,
                                       ranks=ranks, record_format=record.get("record_format"))
            if ranks.is_main and result_file is not None:
                result_file.write_text(json.dumps({**result.__dict__, "events": events}), encoding="utf-8")
            return {"status": "completed"}, 0
    except Interrupted as err:
        log.warning("rank %d: %s", ranks.rank, err)
        return {"status": "interrupted", "signum": err.signum, "message": str(err)}, err.exit_code
    except Exception as err:
        import traceback

        lost = lost_peer(err)
        if lost is not None:
            # DEBUG: the launcher's one line names the lost rank; this detail stays in the log
            log.debug("rank %d: another rank is gone (%s); stopping without a checkpoint", ranks.rank, lost)
            return {"status": "peer_lost", "message": str(lost)}, 1
        if isinstance(err, (UserError, RunFailed)):
            log.error("rank %d: %s", ranks.rank, err)
            return ({"status": "user_error", "message": str(err)}, 2) if isinstance(err, UserError) else ({"status": "failed", "message": str(err)}, 1)
        # a bug or the machine: the traceback stays in this rank's log
        message = f"{err.__class__.__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        log.error("rank %d failed: %s", ranks.rank, message)
        log.debug("traceback:\n%s", "".join(traceback.format_exception(err)))
        return {"status": "error", "message": message}, 1


def worker(run_dir: Path, handoff: Path, resume: bool) -> int:
    """One rank started by `launch` (`train_rank`). Writes `rank<k>.json` (its status) into the hand-off folder,
    and rank 0 also `result.json`; returns the exit code."""

    ranks = from_environment()
    if ranks is None:
        raise SystemExit("veritrain.train.distributed is started by `veritrain train --nproc N` through torchrun")
    file_log = logs.attach_file(run_dir / ("train.log" if ranks.is_main else f"train.rank{ranks.rank}.log"))
    log.propagate = False  # no console: rank 0's log reaches the user through the launcher
    events: list[dict[str, Any]] = []
    status: dict[str, Any] = {"status": "error", "message": "did not start"}
    code = 1
    try:
        data_path = Path((handoff / "data_path").read_text(encoding="utf-8").strip())  # the data version the launcher prepared
        status, code = train_rank(ranks, run_dir, data_path, resume, events, handoff / RESULT_FILE)
    finally:
        if ranks.is_main:
            status["events"] = events
        try:
            (handoff / f"rank{ranks.rank}.json").write_text(json.dumps(status), encoding="utf-8")
        finally:
            logs.detach(file_log)
            if code == 0:
                # only after a clean finish: on an error path the traceback may still hold the DDP wrapper, and
                # destroying the group under it can hang in gloo; the process ends next, which frees it all
                stop_group()
    return code


def main(argv: list[str]) -> int:
    run_dir, handoff = Path(argv[0]), Path(argv[1])
    return worker(run_dir, handoff, resume="--resume" in argv[2:])


if __name__ == "__main__":
    # run as `-m veritrain.train.distributed`: use the importable module, whose exception classes the loop raises
    from veritrain.train import distributed as this_module

    sys.exit(this_module.main(sys.argv[1:]))
