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

# What the training engine writes for every task, whatever it learns (steps.jsonl: loss, lr, grad_norm; metrics.jsonl:
# train_loss, val_loss: the task's criterion on val, lr): shared code may name these; a task's metric may use one as
# its epoch key (a language model's criterion is its loss) but names its own metrics otherwise.
ENGINE_KEYS = ("loss", "train_loss", "val_loss", "lr", "grad_norm", "epoch", "step", "seconds", "samples_per_s")


@dataclass(frozen=True)
class MetricSpec:
    name: str  # its key in eval/<split>/metrics.json
    goal: Goal  # which direction is better
    bounds: tuple[Optional[float], Optional[float]] = (None, None)  # the values it can take (None: unbounded)
    epoch_key: Optional[str] = None  # the metrics.jsonl key holding the same quantity on val after every epoch
    headline: bool = False  # what picks a sweep's best trial when no --metric is given (one per task)
    label: str = ""  # how pages and the model card name it ("" : the name, underscores as spaces)
    aliases: tuple[str, ...] = ()  # names older records hold the same value under (read, never written)
    # the Hugging Face model-index metric `type` and `args` the model card reports it as (None: the name, no args)
    hub_type: Optional[str] = None
    hub_args: Optional[tuple[tuple[str, str], ...]] = None

    def __post_init__(self) -> None:
        if self.goal not in ("max", "min"):
            raise ValueError(f"metric {self.name!r}: goal must be 'max' or 'min', got {self.goal!r}")

    @property
    def shown(self) -> str:
        return self.label or self.name.replace("_", " ")

    def value(self, metrics: Any) -> Any:
        """This metric's value in a metrics mapping (a split's metrics.json, a baseline's result): under its name, or
        under an older name a record of an earlier veritrain holds it by; None when neither is there."""
        if not isinstance(metrics, dict):
            return None
        for key in (self.name, *self.aliases):
            if key in metrics:
                return metrics[key]
        return None

    @property
    def range(self) -> tuple[float, float]:
        """bounds with -inf/inf for the open ends."""
        low, high = self.bounds
        return (-math.inf if low is None else low, math.inf if high is None else high)


@dataclass(frozen=True)
class BaselineRule:
    """What judges whether a model beats its baseline: one of the task's metrics (its goal is the metric's) against
    the baseline of this name in the baselines document (`eval/baselines.json`), by `eval.baseline_margin`, whose
    value where a config leaves it out is `margin` (in the metric's units)."""

    metric: str
    baseline: str
    margin: float = 0.01


@dataclass(frozen=True)
class CardText:
    """What a model card (export/README.md) says a task's model is: `what` its noun ("An image classifier"), `gives`
    what it does, where {input} becomes the export's input shape (" of shape `[...]`") and {classes} its classes
    (" over N classes"); `pipeline_tag` and `hub_name` the Hugging Face task it is listed under."""

    what: str
    gives: str
    pipeline_tag: Optional[str] = None
    hub_name: Optional[str] = None


@dataclass(frozen=True)
class TaskSpec:
    name: str
    # the metrics its evaluation writes that a selection may read, in the order they are shown (a line about a run
    # names the first few)
    metrics: tuple[MetricSpec, ...]
    baseline: Optional[BaselineRule] = None  # None: its runs fit no baseline
    # the data fields a sample must give it (checked against data.source's at config validation); empty: not checked
    fields: tuple[str, ...] = ()
    # the built-in model names (model.name) it trains, the first by default; empty: any. user_models: model.target too
    models: tuple[str, ...] = ()
    user_models: bool = True
    # the config keys each built-in model reads besides model.name, as (model, keys) pairs: ("cnn", ("model.widths",
    # "model.dropout")); a run of a user's model (model.target) reads none of them
    model_settings: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the class its config's `model` section is read with: a subclass of veritrain.core.config.ModelConfig adding its
    # models' keys with their types and defaults; None: the built-in image models' (veritrain.tasks.image_models)
    model_section: Optional[type] = None
    # the config keys only it reads ("augment": a whole section, "train.label_smoothing": one key): a config of another
    # task that sets one away from its default is refused, since nothing would read it
    settings: tuple[str, ...] = ()
    # the veritrain command that uses its export (predict, generate), named in a run's next steps; None: none does
    serves_with: Optional[str] = None
    card: Optional[CardText] = None  # what the model card says the model is
    # the file of eval/<split>/ its evaluation writes the worst-scored samples to (check's "bad cases recorded");
    # None: it writes none
    bad_cases: Optional[str] = None

    def __post_init__(self) -> None:
        names = [m.name for m in self.metrics]
        known = [*names, *(a for m in self.metrics for a in m.aliases)]
        if len(set(known)) != len(known):
            raise ValueError(f"task {self.name!r}: a metric name or alias is declared twice in {known}")
        if sum(m.headline for m in self.metrics) != 1:
            raise ValueError(f"task {self.name!r}: declare exactly one headline metric (MetricSpec(..., headline=True))")
        if self.baseline is not None and self.baseline.metric not in names:
            raise ValueError(f"task {self.name!r}: its baseline is judged by {self.baseline.metric!r}, which it does not declare")
        for model, keys in self.model_settings:
            if model not in self.models or any(not key.startswith("model.") for key in keys):
                raise ValueError(f"task {self.name!r}: model_settings names {model!r}, which is not among its models {list(self.models)}, "
                                 "or a key outside model.*")
            section_keys = getattr(self.model_section, "model_fields", None)
            if section_keys is not None and any(key.removeprefix("model.").split(".")[0] not in section_keys for key in keys):
                raise ValueError(f"task {self.name!r}: model_settings names a key of {model!r} that its model_section "
                                 f"{getattr(self.model_section, '__name__', self.model_section)} does not declare: {list(keys)}")

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
        """The metric declared as `name` or, for a record of an earlier veritrain, holding it as an alias."""
        return next((m for m in self.metrics if m.name == name), None) or next((m for m in self.metrics if name in m.aliases), None)

    def as_recorded(self, again: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
        """Metrics computed now (`again`), also under the older names `recorded` (a record of an earlier veritrain)
        holds them by, so that audit and reproduce compare them under the names that run recorded."""
        out = dict(again)
        for metric in self.metrics:
            for alias in metric.aliases:
                if alias in recorded and alias not in out and metric.name in out:
                    out[alias] = out[metric.name]
        return out

    @property
    def headline(self) -> MetricSpec:
        return next(m for m in self.metrics if m.headline)

    def to_json(self) -> dict[str, Any]:
        """What a run record keeps as `task_spec` (docs/record.md)."""
        return {"name": self.name, "metrics": [_metric_json(m) for m in self.metrics],
                "baseline": asdict(self.baseline) if self.baseline is not None else None, "bad_cases": self.bad_cases}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> TaskSpec:
        """The declaration a record kept (`to_json`); ValueError when it is not one."""
        try:
            metrics = tuple(MetricSpec(m["name"], m["goal"], (m["bounds"][0], m["bounds"][1]), m.get("epoch_key"), bool(m.get("headline")),
                                       str(m.get("label") or ""), tuple(str(a) for a in m.get("aliases") or ()))
                            for m in document["metrics"])
            kept = document.get("baseline")
            baseline = BaselineRule(str(kept["metric"]), str(kept["baseline"]), float(kept.get("margin", 0.01))) if isinstance(kept, dict) else None
            bad_cases = document.get("bad_cases")
            return cls(str(document["name"]), metrics, baseline, bad_cases=str(bad_cases) if isinstance(bad_cases, str) else None)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise ValueError(f"not a task declaration: {err}") from None

    def epoch_metrics(self) -> tuple[MetricSpec, ...]:
        """The metrics also measured on val after every epoch (a pruner can judge them)."""
        return tuple(m for m in self.metrics if m.epoch_key is not None)


def _metric_json(metric: MetricSpec) -> dict[str, Any]:
    """A metric as the record keeps it: what reads records needs (not how the model card reports it)."""
    return {"name": metric.name, "goal": metric.goal, "bounds": list(metric.bounds), "epoch_key": metric.epoch_key,
            "headline": metric.headline, "label": metric.label, "aliases": list(metric.aliases)}
