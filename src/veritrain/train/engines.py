"""Which engine trains a run, chosen from its record and never from a config default: the recipe
(veritrain.train.recipe, `training.engine: recipe-2`) for runs made now, in one process or several, the recipe's
first scheme (`recipe-1`) for the runs it trained, and veritrain's earlier loop (veritrain.train.loop: records
without the field) for everything that trained.
A run resumes, is audited and is reproduced by the engine that trained it: the two draw their randomness in a
different order and write different checkpoints, so neither can continue the other's run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np

from veritrain.core.errors import UserError
from veritrain.train import loop, parts, recipe
from veritrain.train.parts import TrainResult

if TYPE_CHECKING:
    from rich.console import Console

    from veritrain.core.config import RunConfig
    from veritrain.core.signals import StopFlag
    from veritrain.data.identity import DataVersion
    from veritrain.tasks import Task

LOOP = "loop"  # the earlier loop: what a record without training.engine was trained by
RECIPE = recipe.ENGINE
KNOWN = (LOOP, *recipe.SCHEMES)


def of_record(record: Mapping[str, Any]) -> str:
    """The engine that trained (or trains) the run of `record`."""
    named = (record.get("training") or {}).get("engine")
    if named is None:
        return LOOP
    if named not in KNOWN:
        raise UserError(f"training.engine: {named!r} is no engine this veritrain has ({', '.join(KNOWN)}); use the veritrain that trained the run")
    return str(named)


def for_new_run() -> str:
    """The engine a new run trains with."""
    return RECIPE


def recorded(engine: str) -> dict[str, Any]:
    """What the record's `training` section says about the engine (nothing for the earlier loop)."""
    return {} if engine == LOOP else {"engine": engine}


def step_rows(engine: str, cfg: RunConfig, train_rows: np.ndarray, step: int, world_size: int = 1) -> tuple[int, list[np.ndarray]]:
    """(epoch, the batches of rows) that optimizer step `step` (0-based) of a run of `engine` trained on."""
    if engine == LOOP:
        return loop.step_rows(cfg.seed, train_rows, cfg.train.batch_size, cfg.train.accumulate_steps, step, world_size)
    return parts.step_rows(cfg, train_rows, step, world_size)


def train(engine: str, cfg: RunConfig, data: DataVersion, task: Task, run_dir: Path, stop: StopFlag, console: Optional[Console] = None,
          **options: Any) -> TrainResult:
    """Train with `engine` (loop.run's and recipe.run's options: resume, events, stop_at_step, epoch_judge, record_format,
    hand_back, ranks)."""
    if engine == LOOP:
        return loop.run(cfg, data, task, run_dir, stop, console, **options)
    return recipe.run(cfg, data, task, run_dir, stop, console, scheme=engine, **options)
