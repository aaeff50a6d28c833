"""What the training loop does the step a loss or a gradient norm is NaN or infinite (`train.on_nonfinite`):

- `skip_batch`: go on without that batch (or, for the gradient norm, without that optimizer step);
- `stop`: the run fails, with one line saying where and what to change;
- `rollback`: go back to the rollback snapshot — the state at the start of training (or of the resume), then
  of each step-scheduled and end-of-epoch checkpoint — with the learning rate multiplied by
  `train.rollback_lr_factor`, at most `train.max_rollbacks` times; after that the run stops.

Each case adds an event to the run record. With several ranks every rank sees the same summed loss, so all
of them decide alike.
"""

from __future__ import annotations

import io
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from veritrain.core.errors import RunFailed
from veritrain.train.checkpointer import Checkpointer

if TYPE_CHECKING:
    from veritrain.core.config import TrainConfig

log = logging.getLogger("veritrain")


class RolledBack(Exception):
    """Raised inside the epoch once the snapshot is restored: the loop starts the restored epoch again, its
    augmentation generator in the saved state."""

    def __init__(self, augment_state: Optional[torch.Tensor]):
        super().__init__("rolled back")
        self.augment_state = augment_state


class NonFiniteGuard:
    """train.on_nonfinite for one run; `snapshot` is the rollback target, set by the loop as it saves."""

    def __init__(self, train_cfg: TrainConfig, checkpointer: Checkpointer, factor: Callable[[int], float], events: list[dict[str, Any]]):
        self.cfg = train_cfg
        self.checkpointer = checkpointer
        self.factor = factor  # the schedule's lr multiplier per optimizer step, before the rollbacks' factor
        self.events = events
        self.snapshot = b""  # a checkpoint's encoded state (checkpoint.encode)

    def handle(self, what: str, value: float) -> None:
        """`what` ("loss", "gradient norm") became `value`: returns to skip the batch; raises RunFailed to stop,
        or RolledBack once the snapshot is restored."""
        cfg, state = self.cfg, self.checkpointer.state
        detail = f"{what} became {value} at step {state.step + 1} (epoch {state.epoch}, batch {state.batch_index + 1})"
        if cfg.on_nonfinite == "skip_batch":
            self.events.append({"kind": "skip_batch", "step": state.step + 1, "detail": detail})
            log.warning("train: %s; batch skipped", detail)
            return
        if cfg.on_nonfinite == "stop" or state.rollbacks >= cfg.max_rollbacks:
            why = "on_nonfinite is stop" if cfg.on_nonfinite == "stop" else f"after {state.rollbacks} rollback(s) (train.max_rollbacks)"
            self.events.append({"kind": "nonfinite_stop", "step": state.step + 1, "detail": detail})
            raise RunFailed(f"train: {detail}; stopped {why}; lower optim.lr or check the data")
        rollbacks, lr_factor, failed_step = state.rollbacks + 1, state.lr_factor * cfg.rollback_lr_factor, state.step + 1
        augment_state = self.checkpointer.restore(torch.load(io.BytesIO(self.snapshot), weights_only=True))
        state.rollbacks, state.lr_factor = rollbacks, lr_factor
        optimizer, schedule = self.checkpointer.trained.optimizer, self.checkpointer.trained.schedule
        for group, base in zip(optimizer.param_groups, schedule.base_lrs):
            group["lr"] = base * self.factor(schedule.last_epoch) * state.lr_factor
        self.events.append({"kind": "rollback", "step": failed_step, "detail": f"{detail}; restored step {state.step}, lr × {lr_factor:g}"})
        log.warning("train: %s; rolled back to step %d, lr factor %g (rollback %d of %d)", detail, state.step, lr_factor, rollbacks, cfg.max_rollbacks)
        raise RolledBack(augment_state)
