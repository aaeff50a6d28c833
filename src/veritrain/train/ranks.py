"""The ranks of a run and what they do together: who this process is (`Ranks`; `ONE_PROCESS` for a run of one
process, whose collectives return their input), joining the process group torchrun set up, and the collectives
the training loop calls on every run (sharding a global batch, summing a batch's sums, broadcasting, gathering
RNG states, agreeing on a signal). Launching the ranks and the rank worker are in veritrain.train.distributed.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Mapping, Optional, TypeVar

from veritrain.core.errors import RunFailed, UserError

if TYPE_CHECKING:
    import numpy as np
    import torch

    from veritrain.core.config import TrainConfig

log = logging.getLogger("veritrain")
_T = TypeVar("_T")  # what a collective passes between the ranks

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

    def broadcast(self, value: _T) -> _T:
        """Rank 0's `value` on every rank."""
        return value if self.world_size == 1 else broadcast(value)

    def gather(self, value: _T) -> Optional[list[_T]]:
        """Every rank's `value`, in rank order, on rank 0 (None elsewhere)."""
        return [value] if self.world_size == 1 else gather(value, self)

    def barrier(self) -> None:
        """Wait until every rank is here."""
        if self.world_size > 1:
            import torch.distributed as dist

            collective("barrier")(dist.barrier)

    def shard(self, rows: np.ndarray) -> np.ndarray:
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


def config_problem(train_cfg: TrainConfig, world_size: int, device_type: str) -> Optional[str]:
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


def join_for_training(ranks: Ranks, train_cfg: TrainConfig, device: torch.device) -> tuple[Ranks, torch.device]:
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


def rank_seed(seed: int, rank: int) -> int:
    """The seed of a rank's global generators (its dropout): the run's seed on rank 0, one drawn from (seed, rank) on the others."""
    if rank == 0:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed % 2**63, rank]).generate_state(1, dtype=np.uint64)[0] % 2**63)


def shard(rows: np.ndarray, ranks: Ranks) -> np.ndarray:
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


def broadcast(value: _T) -> _T:
    """Rank 0's `value` on every rank (pickled; small objects only)."""
    import torch.distributed as dist

    box = [value]
    collective("broadcast")(lambda: dist.broadcast_object_list(box, src=0))
    return box[0]


def gather(value: _T, ranks: Ranks) -> Optional[list[_T]]:
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
