"""The building blocks the built-in training is made of, shared by the recipe (veritrain.train.recipe) and the
earlier loop (veritrain.train.loop): the device, the optimizer, the learning-rate schedule, the metric best.pt follows,
what training hands back to the pipeline (`TrainResult`), and the recipe's data order (`order_of`, `batches_of`,
`step_rows`) and epoch sums (`EpochSums`)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch

from veritrain.core.errors import RunFailed
from veritrain.core.seeding import seed_everything
from veritrain.core.signals import StopFlag
from veritrain.tasks import split_rows
from veritrain.train.order import Order
from veritrain.train.ranks import Ranks, rank_seed

if TYPE_CHECKING:
    from veritrain.core.config import OptimConfig, RunConfig, ScheduleConfig
    from veritrain.data.identity import DataVersion
    from veritrain.tasks import Task

log = logging.getLogger("veritrain")


@dataclass
class TrainResult:
    final_state_sha256: str
    epochs: list[dict[str, Any]]  # the rows of metrics.jsonl
    best_epoch: int  # the epoch of the best validation (in progress, when validations fall inside epochs)
    best_value: Optional[float]
    best_metric: tuple[str, str]
    steps: int
    device: str
    threads: int
    peak_memory_mb: float
    loop_seconds: float = 0.0  # the epochs alone (no setup, data or model building): what overhead is measured on
    trajectory: Optional[list[dict[str, Any]]] = None  # one entry per scheduled checkpoint (and the initial state)
    pruned: Optional[dict[str, Any]] = None  # the search's verdict that stopped training after a validation (see EpochJudge)
    other_saves: Optional[list[dict[str, Any]]] = None  # signal and every_minutes saves: {step, reason, state_sha256}
    devices: Optional[list[str]] = None  # with several ranks: each rank's device, in rank order
    backend: Optional[str] = None  # with several ranks: the collective backend
    engine: Optional[str] = None  # the engine that trained the run (the record's training.engine); None: the earlier loop
    best_step: Optional[int] = None  # the optimizer steps done at the best validation (the recipe); None: not counted
    epochs_trained: Optional[int] = None  # epochs trained in, whole or in part (the recipe); None: one per row of `epochs`


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise RunFailed("train.device: 'cuda' requested but no CUDA device is available; set train.device=cpu or auto")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def build_optimizer(cfg: OptimConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov and cfg.momentum > 0
        )
    # a model that says which of its parameters decay (the GPT: Linear weights, not biases, norms or embeddings)
    asks = getattr(getattr(model, "module", model), "optimizer_groups", None)  # a DDP wrapper holds it as .module
    params: Any = asks(cfg.weight_decay) if callable(asks) else model.parameters()
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.momentum, 0.999), weight_decay=cfg.weight_decay)


def schedule_factor(cfg: ScheduleConfig, steps_per_epoch: int, total_steps: int):
    """lr multiplier per optimizer step: linear warmup over `warmup_steps`, then cosine to 0, constant,
    or a drop by `gamma` every `step_epochs` epochs."""
    warmup, name, gamma = cfg.warmup_steps, cfg.name, cfg.gamma
    drop_every = cfg.step_epochs * steps_per_epoch
    cosine_steps = max(1, total_steps - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if name == "constant":
            return 1.0
        if name == "step":
            return gamma ** (step // drop_every)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / cosine_steps)))

    return factor


# A search's judge of each validation (`veritrain search`, veritrain.orchestration.trials.search): called with the run
# folder, the validation's row (already in metrics.jsonl) and the stop flag; it waits for the search driver's verdict and
# returns it when the driver prunes the trial ({epoch, step, value, reason, ...}), else None. Training then stops after
# that validation's save, so a pruned run ends at the validation that was judged, never evaluated further.
EpochJudge = Callable[[Path, dict[str, Any], StopFlag], Optional[dict[str, Any]]]


def best_metric(cfg: RunConfig, task: Task, data: DataVersion) -> tuple[str, str]:
    key = cfg.checkpoint.best_metric or task.best_metric[0]
    mode = cfg.checkpoint.best_mode or task.best_metric[1]
    if len(split_rows(task, data, "val")) == 0 and key.startswith("val_"):
        key = "train_" + key.removeprefix("val_")
        log.warning("train: the val split is empty; best.pt follows %s on the train split", key)
    return key, mode


def order_of(cfg: RunConfig, n: int, world_size: int = 1) -> Order:
    """The data order of `n` training rows: step k takes `batch_size × accumulate_steps` rows of the epoch's permutation,
    for `train.epochs` epochs or `train.max_steps` steps.
    A last step that would give a rank fewer than two samples is dropped: BatchNorm cannot normalise one, and it would
    be noise anyway."""
    per_step = cfg.train.batch_size * cfg.train.accumulate_steps
    drop_last = 0 < n % per_step < 2 * world_size and n > per_step
    if cfg.train.max_steps:
        return Order.of_steps(n, per_step, cfg.train.max_steps, drop_last, cfg.seed)
    return Order(n, per_step, cfg.train.epochs, drop_last, cfg.seed)


def batches_of(cfg: RunConfig, train_rows: np.ndarray, rows: np.ndarray, world_size: int = 1) -> list[np.ndarray]:
    """The batches of one step (`rows`: positions in the train split, as `order_of` gives them), `train.batch_size`
    each, whose gradients accumulate; a last batch that would give a rank fewer than two samples is dropped."""
    size = cfg.train.batch_size
    parts = [train_rows[rows[i:i + size]] for i in range(0, len(rows), size)]
    if len(parts) > 1 and len(parts[-1]) < 2 * world_size:
        parts.pop()
    return parts


def step_rows(cfg: RunConfig, train_rows: np.ndarray, step: int, world_size: int = 1) -> tuple[int, list[np.ndarray]]:
    """(epoch, the batches of rows) of step `step` (0-based over the run), as the recipe draws them (every rank's
    share together)."""
    order = order_of(cfg, len(train_rows), world_size)
    return order.epoch_of(step)[0], batches_of(cfg, train_rows, order.rows(step), world_size)


def data_parallel(model: torch.nn.Module, ranks: Ranks, cfg: RunConfig, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the model, what the training forward runs). With several ranks, a DistributedDataParallel wrapper: it gives
    every rank rank 0's initial weights, and rank 0's buffers (BatchNorm statistics) before every forward; the other
    ranks' global generators are reseeded, so that their dropout differs from rank 0's."""
    if ranks.world_size == 1:
        return model, model
    if cfg.train.batchnorm == "sync":
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    trainer = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if not ranks.is_main:
        seed_everything(rank_seed(cfg.seed, ranks.rank), cfg.train.deterministic, compiler=cfg.train.compile)
    return model, trainer


@dataclass
class EpochSums:
    """The epoch so far: loss × samples, samples, and the task's statistics (registered, so a resume mid-epoch goes on)."""

    names: tuple[str, ...]
    loss_sum: float = 0.0
    seen: int = 0
    stats: dict[str, float] = field(default_factory=dict)

    def add(self, loss: float, rows: int, stats: dict[str, float]) -> None:
        self.loss_sum += loss * rows
        self.seen += rows
        for name, value in stats.items():
            self.stats[name] = self.stats.get(name, 0.0) + value

    def row(self) -> dict[str, float]:
        return {"train_loss": self.loss_sum / max(1, self.seen), **{f"train_{n}": self.stats.get(n, 0.0) / max(1, self.seen) for n in self.names}}

    def state_dict(self) -> dict[str, Any]:
        return {"loss_sum": self.loss_sum, "seen": self.seen, "stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_sum, self.seen, self.stats = float(state["loss_sum"]), int(state["seen"]), dict(state["stats"])
