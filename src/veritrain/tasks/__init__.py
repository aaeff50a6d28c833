"""Tasks: what is learned. The rest of veritrain (workspace, records, data versions, training loop, evaluation,
export, CLI) talks to a task only through the `Task` protocol below and reads what it declares (its TaskSpec), so a
new task is one module registered with `register_task`.

Every member of the protocol is required: where most tasks do the same thing, a plain function here or in
veritrain.tasks.evaluation does it, and the task calls it (`sample_split`, `sample_rows`, `sample_slice`,
`validate_with_criterion`, `OutputsEvaluator`). This package loads no torch; the task modules do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from veritrain.core.errors import UserError
from veritrain.core.task_registry import SPECS, TASKS, task_spec as task_spec  # the one registry, shared with config validation
from veritrain.core.task_spec import MetricSpec as MetricSpec, TaskSpec

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np
    import torch

    from veritrain.data.prepare import DataVersion
    from veritrain.tasks.evaluation import Evaluator


@dataclass
class ExportSpec:
    """What an export of the task's model is (Task.export_spec): what model.json says of it and how it is traced.
    A field left None is the default for a model that takes a float32 batch like `example` and gives logits: its
    architecture from the model config, input and output named `input` and `logits` with a dynamic batch, the data
    version's normalization as its preprocessing."""

    example: Any  # a batch of real inputs (two test rows) the export is traced and named with
    architecture: Optional[dict[str, Any]] = None  # model.json's `architecture`: what rebuilds the model
    input: Optional[dict[str, Any]] = None  # model.json's `input`: name, shape (null: dynamic), dtype
    output: Optional[dict[str, Any]] = None  # model.json's `output`
    dynamic_axes: Optional[dict[str, dict[int, str]]] = None  # the ONNX dynamic axes of `input` and `logits`
    preprocessing: Optional[dict[str, Any]] = None  # how a raw input becomes the model's input
    source_mapping: Optional[dict[str, Any]] = None  # how the source's raw values became what preprocessing starts from
    companions: dict[str, Any] = field(default_factory=dict)  # files the model is used with (name in export/ → path), hashed
    # the parity rule: every exported form's outputs within export.parity_atol/rtol of the trained model's, and, when
    # the outputs are scores of classes or tokens, the same largest one for export.parity_min_agreement of them
    agreement: bool = True


# `cfg` below is typed Any: config validation and this package never import each other, not even for types
# (veritrain.core.task_registry holds the registry they share); the task modules themselves type it.
class Task(Protocol):
    name: str
    spec: TaskSpec  # its metrics, their goals and bounds, its baseline rule, data fields and models (veritrain.core.task_spec)
    # per-epoch metrics besides the loss, summed by `batch_stats` and divided by the sample count;
    # logged as train_<name> and val_<name> in metrics.jsonl
    epoch_metrics: tuple[str, ...]
    # (metrics.jsonl key, "max" | "min") that picks checkpoints/best.pt
    best_metric: tuple[str, str]

    # ---- data

    def rows(self, data: DataVersion, split: str) -> np.ndarray:
        """The rows of `split` that the task trains or evaluates on (`sample_split`: the data version's samples; a
        language model: its windows)."""
        ...

    def prepare(self, data: DataVersion) -> None:
        """Called once before training, outside the timed loop: load what the batches need, refuse what cannot train."""
        ...

    def batch(self, data: DataVersion, rows: np.ndarray, device: torch.device, train: bool,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Model inputs and targets for these rows of the data version (augmented when `train`)."""
        ...

    def show_rows(self, data: DataVersion, rows: np.ndarray) -> tuple[str, dict[str, list[Any]]]:
        """What these training rows are, for `veritrain data order`: the unit in words and {key: a value per row}
        (`sample_rows`: their sample ids)."""
        ...

    def smoke_slice(self, data: DataVersion, counts: dict[str, int]) -> DataVersion:
        """The data version cut to about `counts[split]` rows of each split, for the smoke test (`sample_slice`)."""
        ...

    # ---- model and training

    def build_model(self, cfg: Any, data: DataVersion) -> torch.nn.Module:
        """The network for this data version; `cfg` is the run config's `model` section."""
        ...

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss over the batch: the training criterion."""
        ...

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """Sums over the batch for each of `epoch_metrics` (e.g. the number of correct predictions)."""
        ...

    def validation_metrics(self, model: torch.nn.Module, data: DataVersion, device: torch.device, batch_size: int) -> dict[str, float]:
        """metrics.jsonl's val_* after every epoch (`validate_with_criterion`: val_loss and val_<stat>)."""
        ...

    # ---- evaluation, baselines, export

    def evaluator(self, model: torch.nn.Module, data: DataVersion, split: str, cfg: Any) -> Evaluator:
        """What scores `split` of `model` (the run config `cfg`): it sees the outputs batch by batch, in order
        (veritrain.tasks.evaluation; `OutputsEvaluator` keeps them all)."""
        ...

    def write_report(self, path: Path, metrics: dict[str, Any], baselines: Optional[dict[str, Any]], run_id: str) -> None:
        """eval/<split>/report.md (`plain_report`)."""
        ...

    def plot_curves(self, path: Path, history: list[dict[str, Any]]) -> None:
        """eval/<split>/curves.png from metrics.jsonl's rows; a task that draws none does nothing."""
        ...

    def baselines(self, data: DataVersion, cfg: Any) -> Optional[dict[str, Any]]:
        """The baselines document (eval/baselines.json) fit on the same splits, whose judged metric is the TaskSpec's
        baseline rule; None for a task that declares no baseline."""
        ...

    def export_spec(self, cfg: Any, model: torch.nn.Module, data: DataVersion, example: torch.Tensor) -> ExportSpec:
        """What an export of `model` is; `example` is a batch of two real inputs (`ExportSpec(example)`: the defaults)."""
        ...


def split_rows(task: Task, data: DataVersion, split: str) -> np.ndarray:
    """The rows of `split` that `task` trains or evaluates on (Task.rows)."""
    return task.rows(data, split)


def sample_split(data: DataVersion, split: str) -> np.ndarray:
    """Task.rows for a task whose rows are the data version's samples."""
    return data.splits[split]


def sample_rows(data: DataVersion, rows: np.ndarray) -> tuple[str, dict[str, list[Any]]]:
    """Task.show_rows for a task whose rows are the data version's samples: their sample ids."""
    return "sample id", {"sample_ids": [data.sample_ids[int(r)] for r in rows]}


def sample_slice(data: DataVersion, counts: dict[str, int]) -> DataVersion:
    """Task.smoke_slice for a task whose rows are the data version's samples: `counts[split]` rows of each split
    named, spread over the classes (`stratified`)."""
    return dataclasses.replace(data, splits={name: stratified(data.splits[name], data.targets, count, data.classes)
                                             for name, count in counts.items()})


def stratified(rows: np.ndarray, targets: np.ndarray, count: int, classes: Optional[list[str]]) -> np.ndarray:
    """`count` of a split's rows, taken class by class in turn (class index order; within a class, the split's
    order), so a slice of a folder sorted by class still holds every class; a class that runs out drops out of
    the turn. Without classes (a regression or language-model task) the split's first `count` rows."""
    import numpy as np

    rows = np.asarray(rows)
    if not classes or len(rows) <= count or targets.ndim != 1 or not np.issubdtype(targets.dtype, np.integer):
        return rows[:count]
    labels = np.asarray(targets)[rows]
    by_class = [rows[labels == label] for label in np.unique(labels)]
    # round r takes the r-th row of every class that has one: sort the rows by (round, class)
    turn = np.concatenate([np.arange(len(group)) for group in by_class])
    order = np.lexsort((np.concatenate([np.full(len(g), i) for i, g in enumerate(by_class)]), turn))
    return np.concatenate(by_class)[order][:count]


def plain_report(path: Path, metrics: dict[str, Any], spec: TaskSpec, run_id: str) -> None:
    """Task.write_report's default: the split's declared metrics as a table."""
    rows = [f"| {m.shown} | {metrics[m.name]:.6g} |" for m in spec.metrics if isinstance(metrics.get(m.name), (int, float))]
    path.write_text(f"# Evaluation of run {run_id}: {metrics.get('split', '?')} split\n\n| metric | value |\n|---|---|\n"
                    + "\n".join(rows) + "\n", encoding="utf-8")


def register_task(name: str, factory: Callable[[Any], Task], spec: Optional[TaskSpec] = None) -> None:
    """Make `task: NAME` build its task with `factory(run config)`. `spec` is what the task declares about its metrics
    (veritrain.core.task_spec); without it, the factory's own `spec` attribute (a task class declaring it) is read."""
    TASKS[name] = factory
    SPECS[name] = spec


def protocol_members() -> tuple[str, ...]:
    """Every attribute and method a task must have (the Task protocol)."""
    methods = {name for name, value in vars(Task).items() if callable(value) and not name.startswith("_")}
    return tuple(sorted(set(Task.__annotations__) | methods))


def get_task(cfg: Any) -> Task:
    """The task of run config `cfg`, built by its registered factory; a UserError naming what it lacks when it does not
    have every member of the protocol (no member is optional: a missing one would fail a run halfway)."""

    task = TASKS[cfg.task](cfg)
    missing = [name for name in protocol_members() if not hasattr(task, name)]
    if missing:
        raise UserError(f"task: {cfg.task!r} ({type(task).__module__}.{type(task).__qualname__}) lacks {', '.join(missing)} of the Task "
                        "protocol (veritrain.tasks.Task); write each, calling the defaults where they fit (sample_split, sample_rows, "
                        "sample_slice, plain_report, veritrain.tasks.evaluation.validate_with_criterion and OutputsEvaluator)")
    return task
