"""Data-parallel training over several processes, launched by PyTorch's torchrun.

Two ways in, one loop (`veritrain.train.loop.run` with `ranks`):

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
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Optional

from veritrain.errors import Interrupted, RunFailed, UserError

log = logging.getLogger("veritrain")

# How long a rank waits in a collective for the others. Long enough for rank 0 to prepare a large
# data version while the others wait for `announce`; a dead peer is noticed at once (its socket closes).
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
RESULT_FILE = "result.json"  # rank 0's TrainResult, in the hand-off folder


class RankLost(RunFailed):
    """A rank died (killed, out of memory, node lost): the run stops as `interrupted` (resumable from its
    newest scheduled checkpoint), with the exit code of the signal that killed the rank when it was
    SIGINT/SIGTERM (130/143), else 1."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class PeerLost(RuntimeError):
    """Raised in a rank whose collective failed because another rank is gone."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks, from torchrun's environment variables, or `ONE_PROCESS`. The loop
    calls the collectives through it; with one process they are no-ops (a reduce returns its input, a broadcast
    its value, a gather `[value]`), so the loop reads the same with one process as with several."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: Optional[str] = "gloo"  # None: one process, no collectives

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def reduce(self, values: list[float]) -> list[float]:
        """`values` summed over the ranks (`reduce_batch`)."""
        return values if self.world_size == 1 else reduce_batch(values)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        return value if self.world_size == 1 else broadcast(value)

    def gather(self, value: Any) -> Optional[list[Any]]:
        """Every rank's `value`, in rank order, on rank 0 (None elsewhere)."""
        return [value] if self.world_size == 1 else gather(value, self)

    def barrier(self) -> None:
        """Wait until every rank is here."""
        if self.world_size > 1:
            import torch.distributed as dist

            collective("barrier")(dist.barrier)

    def shard(self, rows: Any) -> Any:
        """This rank's share of a global batch (`shard`)."""
        return rows if self.world_size == 1 else shard(rows, self)

    def any_signal(self, signum: Optional[int]) -> Optional[int]:
        """SIGINT or SIGTERM when any rank got one (every rank gets the same answer), else None."""
        return signum if self.world_size == 1 else agreed_signal(reduce_batch(signal_slots(signum)))


ONE_PROCESS = Ranks(rank=0, world_size=1, local_rank=0, local_world_size=1, backend=None)


# What torchrun sets in each rank; set in a shell without torchrun (left over from an earlier job), they would make
# a process wait for ranks that never start
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"  # torchrun (and torch.distributed.run) sets it in every rank it starts
NPROC_MARKER = "VERITRAIN_NPROC_LAUNCH"  # set by `launch` (--nproc N) for the ranks it starts through torchrun


def stray_rank_variables(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The torchrun variables set in an environment that no torchrun launch made, in `RANK_VARIABLES` order."""
    environ = os.environ if environ is None else environ
    if TORCHRUN_MARKER in environ or NPROC_MARKER in environ:
        return []
    return [name for name in RANK_VARIABLES if name in environ]


def refuse_stray_rank_variables() -> None:
    """Exit 2 when torchrun variables are set without a torchrun launch: a lone `RANK=1 WORLD_SIZE=2` would wait
    for rank 0 forever, and a lone `WORLD_SIZE=2` would fail inside torch.distributed."""
    stray = stray_rank_variables()
    if stray:
        raise UserError(f"environment: {', '.join(stray)} {'is' if len(stray) == 1 else 'are'} set but no torchrun launch was found; "
                        "unset them or start with torchrun")


def from_environment() -> Optional[Ranks]:
    """The ranks torchrun describes in the environment, or None for a single process."""
    refuse_stray_rank_variables()
    try:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    except ValueError:
        raise UserError("WORLD_SIZE, RANK, LOCAL_RANK: not integers; start the ranks with torchrun") from None
    if world_size <= 1:
        return None
    return Ranks(rank, world_size, local_rank, local_world_size)


def resolve_backend(name: str, device_type: str) -> str:
    if name == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if name == "nccl" and device_type != "cuda":
        raise RunFailed("train.backend: 'nccl' needs CUDA devices; use gloo (or auto) on the CPU")
    return name


def config_problem(train_cfg: Any, world_size: int, device_type: str) -> Optional[str]:
    """Why a train config cannot run with `world_size` ranks (one line naming the key and the fix), or None."""
    if train_cfg.batchnorm == "sync" and device_type != "cuda":
        return "train.batchnorm: 'sync' (SyncBatchNorm) needs CUDA devices; use per_rank on the CPU"
    if train_cfg.batch_size < 2 * world_size:
        return (f"train.batch_size: {train_cfg.batch_size} gives fewer than 2 samples to each of {world_size} ranks; "
                f"use at least {2 * world_size} (it is the global batch, split over the ranks)")
    if train_cfg.backend == "nccl" and device_type != "cuda":
        return "train.backend: 'nccl' needs CUDA devices; use gloo (or auto) on the CPU"
    return None


def start(ranks: Ranks, backend_name: str, device_type: str) -> Ranks:
    """Join the process group (once per process); returns `ranks` with the backend in use."""
    import torch
    import torch.distributed as dist

    backend = resolve_backend(backend_name, device_type)
    if device_type == "cuda":
        torch.cuda.set_device(ranks.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    elif dist.get_backend() != backend:
        raise RunFailed(f"train.backend: the ranks joined with {dist.get_backend()} before the config was read (torchrun starts "
                        f"them with `auto`); set train.backend to auto or {dist.get_backend()}")
    return Ranks(ranks.rank, ranks.world_size, ranks.local_rank, ranks.local_world_size, backend)


def join_for_training(ranks: Ranks, train_cfg: Any, device: Any) -> tuple[Ranks, Any]:
    """(the ranks with the process group joined, this rank's torch device: cuda:<local rank> on GPUs); raises RunFailed
    when the train config cannot run on them. One process is returned as it is."""
    if ranks.world_size == 1:
        return ranks, device
    import torch

    if device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
    problem = config_problem(train_cfg, ranks.world_size, device.type)  # `--nproc` checks it before the run starts
    if problem:
        raise RunFailed(problem)
    return start(ranks, train_cfg.backend, device.type), device


def join_from_environment() -> Optional[Ranks]:
    """Under `torchrun … -m veritrain run|train`: join the ranks at once (before the config is read, which
    rank 0 alone does for `--resume`) with the `auto` backend; None for a single process."""
    ranks = from_environment()
    if ranks is None:
        return None
    import torch

    return start(ranks, "auto", "cuda" if torch.cuda.is_available() else "cpu")


def torchrun_command(ranks: Ranks, argv: list[str]) -> list[str]:
    """The command that started the ranks, as the record shows it (torchrun's rendezvous options are not
    visible to the ranks: the node count and ranks per node are)."""
    return ["torchrun", f"--nnodes={ranks.nodes}", f"--nproc-per-node={ranks.local_world_size}", "-m", "veritrain", *argv[1:]]


def stop_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a group whose peer is gone may refuse a clean shutdown; the process ends anyway
            pass


def collective(what: str):
    """Run a collective, turning a failure caused by a lost peer into PeerLost."""

    def wrap(call):
        try:
            return call()
        except RuntimeError as err:  # gloo: "Connection closed by peer", NCCL: DistBackendError (a RuntimeError)
            raise PeerLost(f"{what}: {str(err).splitlines()[0][:200]}") from None

    return wrap


LOST_PEER_SIGNS = ("gloo", "nccl", "connection reset", "connection closed", "broken pipe")


def lost_peer(err: BaseException) -> Optional[PeerLost]:
    """PeerLost for an error of a collective that veritrain does not call itself (DDP's gradient all-reduce in
    backward, its buffer broadcast in forward) when a rank is gone; None for any other error."""
    if isinstance(err, PeerLost):
        return err
    import torch.distributed as dist

    text = str(err)
    if isinstance(err, getattr(dist, "DistBackendError", ())) or (
            isinstance(err, RuntimeError) and any(sign in text.lower() for sign in LOST_PEER_SIGNS)):
        return PeerLost(text.splitlines()[0][:200] if text else err.__class__.__name__)
    return None


def shard(rows: Any, ranks: Ranks) -> Any:
    """This rank's share of a global batch: the rank-th of world-size contiguous, near-equal parts."""
    import numpy as np

    return np.array_split(rows, ranks.world_size)[ranks.rank]


def reduce_batch(values: list[float]) -> list[float]:
    """Sum per-rank numbers over the ranks (float64, one all-reduce); every rank gets the same sums."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    collective("all_reduce")(lambda: dist.all_reduce(tensor))
    return tensor.tolist()


def broadcast(value: Any) -> Any:
    """Rank 0's `value` on every rank (pickled; small objects only)."""
    import torch.distributed as dist

    box = [value]
    collective("broadcast")(lambda: dist.broadcast_object_list(box, src=0))
    return box[0]


def gather(value: Any, ranks: Ranks) -> Optional[list[Any]]:
    """Every rank's `value`, in rank order, on rank 0 (None elsewhere)."""
    import torch.distributed as dist

    out: Optional[list[Any]] = [None] * ranks.world_size if ranks.is_main else None
    collective("gather")(lambda: dist.gather_object(value, out, dst=0))
    return out


def signal_slots(signum: Optional[int]) -> list[float]:
    """Two numbers for `reduce_batch` that tell every rank whether any rank got SIGINT or SIGTERM."""
    return [1.0 if signum == signal.SIGINT else 0.0, 1.0 if signum == signal.SIGTERM else 0.0]


def agreed_signal(slots: list[float]) -> Optional[int]:
    if slots[0] > 0:
        return int(signal.SIGINT)
    if slots[1] > 0:
        return int(signal.SIGTERM)
    return None


@dataclass
class BatchSums:
    """One batch's numbers summed over the ranks, the same on every rank (so are all decisions made from them)."""

    loss: float  # the mean loss over the global batch
    loss_total: float  # loss × samples
    stats: dict[str, float]  # the task's statistics (`batch_stats`), summed
    signum: Optional[int]  # SIGINT or SIGTERM when any rank got one
    minutes_due: bool  # rank 0's clock says an every_minutes checkpoint is due


def sum_batch(loss: float, rows: int, stats: dict[str, float], signum: Optional[int], minutes_due: bool) -> BatchSums:
    """A batch's loss, sample count and statistics summed over the ranks, with their signals and rank 0's clock: one all-reduce."""
    names = sorted(stats)
    sums = reduce_batch([loss * rows, float(rows), *(float(stats[k]) for k in names), *signal_slots(signum), float(minutes_due)])
    return BatchSums(loss=sums[0] / sums[1], loss_total=sums[0], stats=dict(zip(names, sums[2 : 2 + len(names)])),
                     signum=agreed_signal(sums[2 + len(names) : 4 + len(names)]), minutes_due=sums[-1] > 0)


def describe(ranks: Ranks, devices: list[str], launch_command: list[str]) -> dict[str, Any]:
    """The record's `distributed` field."""
    return {"world_size": ranks.world_size, "nodes": ranks.nodes, "backend": ranks.backend, "devices": devices, "launch": launch_command}


# ---------------------------------------------------------------- `--nproc N`: this process launches torchrun


def launch(run_dir: Path, state_dir: Path, data_path: Path, nproc: int, resume: bool, stop: Any, threads: Optional[int]) -> dict[str, Any]:
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
    (`veritrain.pipeline.follow`). Trains the run's recorded config on the data version at `data_path`, building the
    model from the run's recorded copies of the user's code; rank 0 writes its TrainResult and `events` to
    `result_file` when given. Returns this rank's status (as `rank<k>.json` holds it) and exit code; a failure is
    logged here in one line (a bug's traceback at DEBUG, in the rank's log)."""
    from veritrain import usercode
    from veritrain.config import resolved_from_record
    from veritrain.data import prepare
    from veritrain.record import read_record
    from veritrain.signals import interruptible
    from veritrain.tasks import get_task
    from veritrain.train import loop

    try:
        with interruptible() as stop:
            record = read_record(run_dir)
            cfg = resolved_from_record(record).config
            data = prepare.load_version(data_path)
            if data.version != record["data"]["version"]:
                raise RunFailed(f"data version {data.version[:12]} is not the run's {record['data']['version'][:12]}")
            with usercode.recorded(run_dir, record, run_dir.parent.parent / usercode.STATE_SCRATCH, "train"):
                result = loop.run(cfg, data, get_task(cfg), run_dir, stop, None, resume=resume, events=events, ranks=ranks)
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
    from veritrain import logs

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
