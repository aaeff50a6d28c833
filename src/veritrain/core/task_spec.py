"""What a task declares about its numbers, torch-free, so that shared code reads the declaration instead of keeping
tables of metric names (`veritrain.tasks.register_task` takes it; the built-in tasks declare theirs beside their
code). A metric is named as its task writes it in `eval/<split>/metrics.json`.

    from veritrain.core.task_spec import MetricSpec, TaskSpec
    SPEC = TaskSpec("regression", metrics=(MetricSpec("rmse", "min", bounds=(0.0, None), headline=True),
                                           MetricSpec("mae", "min", bounds=(0.0, None))))
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

Goal = Literal["max", "min"]


@dataclass(frozen=True)
class MetricSpec:
    name: str  # its key in eval/<split>/metrics.json
    goal: Goal  # which direction is better
    bounds: tuple[Optional[float], Optional[float]] = (None, None)  # the values it can take (None: unbounded)
    epoch_key: Optional[str] = None  # the metrics.jsonl key holding the same quantity on val after every epoch
    headline: bool = False  # what picks a sweep's best trial when no --metric is given (one per task)

    def __post_init__(self) -> None:
        if self.goal not in ("max", "min"):
            raise ValueError(f"metric {self.name!r}: goal must be 'max' or 'min', got {self.goal!r}")

    @property
    def range(self) -> tuple[float, float]:
        """bounds with -inf/inf for the open ends."""
        low, high = self.bounds
        return (-math.inf if low is None else low, math.inf if high is None else high)


@dataclass(frozen=True)
class BaselineRule:
    """What judges whether a model beats its baseline: one of the task's metrics (its goal is the metric's) against
    the baseline of this name in the baselines document (`eval/baselines.json`), by `eval.baseline_margin`."""

    metric: str
    baseline: str


@dataclass(frozen=True)
class TaskSpec:
    name: str
    # the metrics its evaluation writes that a selection may read, in the order they are shown (a line about a run
    # names the first few)
    metrics: tuple[MetricSpec, ...]
    baseline: Optional[BaselineRule] = None  # None: its runs fit no baseline

    def __post_init__(self) -> None:
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"task {self.name!r}: a metric is declared twice in {names}")
        if sum(m.headline for m in self.metrics) != 1:
            raise ValueError(f"task {self.name!r}: declare exactly one headline metric (MetricSpec(..., headline=True))")
        if self.baseline is not None and self.baseline.metric not in names:
            raise ValueError(f"task {self.name!r}: its baseline is judged by {self.baseline.metric!r}, which it does not declare")

    def baseline_rule(self) -> Optional[dict[str, str]]:
        """The baselines document's `judged_by` (veritrain.core.baselines): metric, goal and baseline."""
        if self.baseline is None:
            return None
        metric = self.metric(self.baseline.metric)
        assert metric is not None  # checked when declared
        return {"metric": metric.name, "goal": metric.goal, "baseline": self.baseline.baseline}

    def names(self, limit: Optional[int] = None) -> list[str]:
        """The declared metrics' names in their order, the first `limit` of them."""
        return [m.name for m in self.metrics][:limit]

    def metric(self, name: str) -> Optional[MetricSpec]:
        return next((m for m in self.metrics if m.name == name), None)

    @property
    def headline(self) -> MetricSpec:
        return next(m for m in self.metrics if m.headline)

    def to_json(self) -> dict[str, Any]:
        """What a run record keeps as `task_spec` (docs/record.md)."""
        return {"name": self.name, "metrics": [{**asdict(m), "bounds": list(m.bounds)} for m in self.metrics],
                "baseline": asdict(self.baseline) if self.baseline is not None else None}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> TaskSpec:
        """The declaration a record kept (`to_json`); ValueError when it is not one."""
        try:
            metrics = tuple(MetricSpec(m["name"], m["goal"], (m["bounds"][0], m["bounds"][1]), m.get("epoch_key"), bool(m.get("headline")))
                            for m in document["metrics"])
            kept = document.get("baseline")
            baseline = BaselineRule(str(kept["metric"]), str(kept["baseline"])) if isinstance(kept, dict) else None
            return cls(str(document["name"]), metrics, baseline)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise ValueError(f"not a task declaration: {err}") from None

    def epoch_metrics(self) -> tuple[MetricSpec, ...]:
        """The metrics also measured on val after every epoch (a pruner can judge them)."""
        return tuple(m for m in self.metrics if m.epoch_key is not None)
