"""The building blocks the built-in training is made of, shared by the recipe (veritrain.train.recipe) and the
earlier loop (veritrain.train.loop): the device, the optimizer, the learning-rate schedule, the metric best.pt follows,
and what training hands back to the pipeline (`TrainResult`)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from veritrain.core.errors import RunFailed
from veritrain.core.signals import StopFlag
from veritrain.tasks import split_rows

if TYPE_CHECKING:
    from veritrain.core.config import OptimConfig, RunConfig, ScheduleConfig
    from veritrain.data.identity import DataVersion
    from veritrain.tasks import Task

log = logging.getLogger("veritrain")


@dataclass
class TrainResult:
    final_state_sha256: str
    epochs: list[dict[str, Any]]  # the rows of metrics.jsonl
    best_epoch: int
    best_value: Optional[float]
    best_metric: tuple[str, str]
    steps: int
    device: str
    threads: int
    peak_memory_mb: float
    loop_seconds: float = 0.0  # the epochs alone (no setup, data or model building): what overhead is measured on
    trajectory: Optional[list[dict[str, Any]]] = None  # one entry per scheduled checkpoint (and the initial state)
    pruned: Optional[dict[str, Any]] = None  # the search's verdict that stopped training after an epoch (see EpochJudge)
    other_saves: Optional[list[dict[str, Any]]] = None  # signal and every_minutes saves: {step, reason, state_sha256}
    devices: Optional[list[str]] = None  # with several ranks: each rank's device, in rank order
    backend: Optional[str] = None  # with several ranks: the collective backend
    engine: Optional[str] = None  # the engine that trained the run (the record's training.engine); None: the earlier loop


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


# A search's judge of each epoch (`veritrain search`, veritrain.orchestration.search): called with the run folder, the
# epoch's row (already in metrics.jsonl) and the stop flag; it waits for the search driver's verdict and returns it
# when the driver prunes the trial ({epoch, step, value, reason, ...}), else None. Training then stops after that
# epoch's save, so a pruned run ends at the epoch that was judged, never evaluated further.
EpochJudge = Callable[[Path, dict[str, Any], StopFlag], Optional[dict[str, Any]]]


def best_metric(cfg: RunConfig, task: Task, data: DataVersion) -> tuple[str, str]:
    key = cfg.checkpoint.best_metric or task.best_metric[0]
    mode = cfg.checkpoint.best_mode or task.best_metric[1]
    if len(split_rows(task, data, "val")) == 0 and key.startswith("val_"):
        key = "train_" + key.removeprefix("val_")
        log.warning("train: the val split is empty; best.pt follows %s on the train split", key)
    return key, mode
