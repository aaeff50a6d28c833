"""How a split is evaluated, for every task: the task's Evaluator sees the model's outputs one batch at a time
(`update`), gives the metrics (`compute`) and writes the files of its own (`write`); `stream` feeds it the split's
rows in order, in batches of `eval.batch_size`, so that only one batch of outputs is held unless the evaluator keeps
them. The defaults a task calls are here too: `OutputsEvaluator` (keeps every output, then one function of them all)
and `validate_with_criterion` (metrics.jsonl's val_loss and val_<stat> after every epoch).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol

import numpy as np
import torch

from veritrain.core.errors import RunFailed
from veritrain.data.loader import Feeder

if TYPE_CHECKING:
    from veritrain.data.identity import DataVersion
    from veritrain.tasks import Task


class Evaluator(Protocol):
    def update(self, outputs: torch.Tensor, targets: torch.Tensor, rows: np.ndarray) -> None:
        """One batch: the model's outputs (float32, on the model's device) for these rows of the split, in order."""
        ...

    def compute(self) -> dict[str, Any]:
        """The split's metrics (eval/<split>/metrics.json), once every batch was seen."""
        ...

    def write(self, out_dir: Path, metrics: dict[str, Any]) -> None:
        """The evaluation's files of its own in `out_dir` (predictions, per-class tables, bad cases, samples)."""
        ...


def split_batches(task: Task, data: DataVersion, rows: np.ndarray, device: torch.device, batch_size: int,
                  workers: int = 0) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """`rows` in order, `batch_size` at a time, as the task builds them for evaluation (no augmentation): (the rows,
    inputs, targets) on `device`, built ahead by `workers` worker processes (veritrain.data.loader) or here."""
    generator = torch.Generator().manual_seed(0)  # unused without augmentation; required by the protocol
    built_on = device if workers == 0 else torch.device("cpu")
    count = -(-len(rows) // batch_size)

    def build(index: int) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
        chunk = rows[index * batch_size : (index + 1) * batch_size]
        yield (chunk, *task.batch(data, chunk, built_on, False, generator))

    with Feeder(build, count, workers, pin=device.type == "cuda") as feed:
        for index in range(count):
            for chunk, x, y in feed.get(index):
                yield chunk, x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def stream(model: torch.nn.Module, task: Task, data: DataVersion, split: str, device: torch.device, batch_size: int,
           evaluator: Evaluator, where: str, limit: Optional[int] = None, workers: int = 0) -> int:
    """Every row of `split` (its first `limit`) through the model in eval mode, batch by batch into `evaluator`;
    the number of rows. A batch with NaN or inf outputs is not given to it: once every batch is through, RunFailed
    says how many rows had them (`where`: the checkpoint, for the message), since no metric of them means anything.
    `workers`: processes that build the batches ahead (`split_batches`)."""
    model.eval()
    rows = task.rows(data, split)[:limit]
    bad = 0
    with torch.no_grad():
        for chunk, x, y in split_batches(task, data, rows, device, batch_size, workers):
            outputs = model(x).float()
            found = int((~torch.isfinite(outputs.reshape(len(outputs), -1))).any(dim=1).sum()) if outputs.numel() else 0
            bad += found
            if not bad:
                evaluator.update(outputs, y, chunk)
    if bad:
        raise RunFailed(f"eval: the model gives non-finite outputs (NaN or inf) for {bad} of {len(rows)} {split} samples at "
                        f"{where}; training likely diverged: lower optim.lr (or, with optim.name=sgd, set train.grad_clip)")
    return len(rows)


class OutputsEvaluator:
    """Keeps every batch's outputs and targets (on the CPU), then `metrics(outputs, targets)` of them all: for a task
    whose metrics need the whole split at once (a ranking, a calibration) or that has no streaming form yet."""

    def __init__(self, metrics: Callable[[torch.Tensor, torch.Tensor], dict[str, Any]]) -> None:
        self.metrics = metrics
        self.outputs: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def update(self, outputs: torch.Tensor, targets: torch.Tensor, rows: np.ndarray) -> None:
        self.outputs.append(outputs.cpu())
        self.targets.append(targets.cpu())

    def gathered(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.outputs:
            return torch.empty(0), torch.empty(0)
        return torch.cat(self.outputs), torch.cat(self.targets)

    def compute(self) -> dict[str, Any]:
        return self.metrics(*self.gathered())

    def write(self, out_dir: Path, metrics: dict[str, Any]) -> None:
        pass


@torch.no_grad()
def forward_split(model: torch.nn.Module, task: Task, data: DataVersion, split: str, device: torch.device, batch_size: int,
                  limit: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All outputs and targets of one split (its first `limit` rows) in eval mode, in split order, on the CPU; NaN and
    inf kept (what reads them decides)."""
    model.eval()
    outputs, targets = [], []
    for _, x, y in split_batches(task, data, task.rows(data, split)[:limit], device, batch_size):
        outputs.append(model(x).float().cpu())
        targets.append(y.cpu())
    if not outputs:
        return torch.empty(0), torch.empty(0)
    return torch.cat(outputs), torch.cat(targets)


def validate_with_criterion(task: Task, model: torch.nn.Module, data: DataVersion, device: torch.device, batch_size: int) -> dict[str, float]:
    """Task.validation_metrics's default: the task's training criterion over val (`val_loss`) and each of its
    `batch_stats` divided by the rows (`val_<stat>`)."""
    val_out, val_y = forward_split(model, task, data, "val", device, batch_size)
    row = {"val_loss": float(task.loss(val_out, val_y))}
    row.update({f"val_{name}": total / len(val_y) for name, total in task.batch_stats(val_out, val_y).items()})
    return row
