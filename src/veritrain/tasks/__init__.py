"""Tasks: what is learned. The rest of veritrain (workspace, records, data versions, training loop,
CLI) only talks to a task through the `Task` protocol below, so a new task (regression, a language
model) plugs in with `register_task` without touching the core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from veritrain.core.task_registry import SPECS, TASKS, task_spec as task_spec  # the one registry, shared with config validation
from veritrain.core.task_spec import MetricSpec as MetricSpec, TaskSpec

if TYPE_CHECKING:
    import numpy as np
    import torch

    from veritrain.data.prepare import DataVersion


# `cfg` below is typed Any: config validation and this package never import each other, not even for types
# (veritrain.core.task_registry holds the registry they share); the task modules themselves type it.
class Task(Protocol):
    name: str
    spec: TaskSpec  # its metrics, their goals and bounds, which one is the headline (veritrain.core.task_spec)
    # per-epoch metrics besides the loss, summed by `batch_stats` and divided by the sample count;
    # logged as train_<name> and val_<name> in metrics.jsonl
    epoch_metrics: tuple[str, ...]
    # (metrics.jsonl key, "max" | "min") that picks checkpoints/best.pt
    best_metric: tuple[str, str]

    def build_model(self, cfg: Any, data: "DataVersion") -> "torch.nn.Module":
        """The network for this data version; `cfg` is the run config's `model` section."""
        ...

    def batch(
        self, data: "DataVersion", rows: "np.ndarray", device: "torch.device", train: bool, generator: "torch.Generator"
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Model inputs and targets for these rows of the data version (augmented when `train`)."""
        ...

    # optional: `rows(data, split)` gives the rows of a split when they are not the data version's samples (a
    # language model's windows; see `split_rows`)
    # optional: `prepare(data)` is called once before training, outside the timed loop, to load what
    # the batches need (classification keeps a decoded copy of a small data version in memory)

    def loss(self, outputs: "torch.Tensor", targets: "torch.Tensor") -> "torch.Tensor":
        """Mean loss over the batch."""
        ...

    def batch_stats(self, outputs: "torch.Tensor", targets: "torch.Tensor") -> dict[str, float]:
        """Sums over the batch for each of `epoch_metrics` (e.g. the number of correct predictions)."""
        ...

    def metrics(self, outputs: "torch.Tensor", targets: "torch.Tensor", data: "DataVersion") -> dict[str, Any]:
        """Final evaluation metrics from all outputs of a split (e.g. accuracy, macro_f1, loss)."""
        ...

    def show_rows(self, data: "DataVersion", rows: "np.ndarray") -> tuple[str, dict[str, list[Any]]]:
        """What these training rows are, for `veritrain data order`: the unit in words and {key: a value per row}
        (`sample_rows` for rows that are the data version's samples)."""
        ...


def sample_rows(data: "DataVersion", rows: "np.ndarray") -> tuple[str, dict[str, list[Any]]]:
    """Task.show_rows for a task whose rows are the data version's samples: their sample ids."""
    return "sample id", {"sample_ids": [data.sample_ids[int(r)] for r in rows]}


def split_rows(task: Task, data: "DataVersion", split: str) -> "np.ndarray":
    """The rows of `split` that the task trains or evaluates on: the data version's split (a sample per row), or
    what the task's optional `rows(data, split)` gives (a language model: its windows)."""
    rows = getattr(task, "rows", None)
    return rows(data, split) if rows is not None else data.splits[split]


def register_task(name: str, factory: Callable[[Any], Task], spec: Optional[TaskSpec] = None) -> None:
    """Make `task: NAME` build its task with `factory(run config)`. `spec` is what the task declares about its metrics
    (veritrain.core.task_spec); without it, the factory's own `spec` attribute (a task class declaring it) is read."""
    TASKS[name] = factory
    SPECS[name] = spec


def get_task(cfg: Any) -> Task:
    return TASKS[cfg.task](cfg)
