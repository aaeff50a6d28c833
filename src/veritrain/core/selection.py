"""Which split selects what. Everything that chooses — `checkpoints/best.pt`, early stopping, a sweep's best
trial — reads the val split; the test split is read only for the final report, after everything is chosen.

A run records what selected what in `selection` (docs/record.md); `veritrain check`'s
`selection_on_validation` row reads it. A leaf module (it imports no other veritrain module but the errors and the
task declarations' types), so the config's validation, the pipeline, the sweep and the checks share one set of rules.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Optional

from veritrain.core.errors import ConfigError, RunFailed
from veritrain.core.task_spec import MetricSpec, TaskSpec

if TYPE_CHECKING:  # the config's validation imports this module
    from veritrain.core.config.schema import DataConfig, RunConfig

SPLITS = ("train", "val", "test")
SELECTION_SPLIT = "val"  # what every selection reads
REPORT_SPLIT = "test"  # what only the final report reads

NOT_USED_FOR_SELECTION = "not used for selection"  # the label of every test result shown beside a selection


def improves(value: float, best: Optional[float], mode: str) -> bool:
    """Whether a validation's `value` is a new best after `best` (None: the first validation): strictly larger (max) or
    smaller (min), so the first of equal values stays the best and a NaN never improves on a number. The one rule for
    best.pt and early stopping (veritrain.train.engine.Best) and for verify, which finds the best row again."""
    return best is None or (value > best if mode == "max" else value < best)


def best_row(rows: list[Any], key: str, mode: str) -> Optional[dict[str, Any]]:
    """The row of metrics.jsonl that `improves` makes the best of `key`; None when no row holds a number for it."""
    chosen: Optional[dict[str, Any]] = None
    for row in rows:
        value = row.get(key) if isinstance(row, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and improves(float(value), None if chosen is None else float(chosen[key]), mode):
            chosen = row
    return chosen


def metric_split(key: str) -> Optional[str]:
    """The split a metric key is computed on, by its first word: `val_acc`, `val.accuracy` → val, `test_loss` → test,
    `train_loss` → train; None for a key that names no split (`lr`, `epoch`)."""
    head = re.split(r"[._/\-]", key.strip(), maxsplit=1)[0].lower()
    return head if head in SPLITS else None


def test_key_problem(key: str) -> Optional[str]:
    """Why `checkpoint.best_metric` may not be `key` (a test key), or None."""
    if metric_split(key) != REPORT_SPLIT:
        return None
    return (f"{key!r} is computed on the test split, which is for the final report only, never for selection; "
            "pick best.pt on validation: val_acc (best_mode: max) or val_loss (best_mode: min)")


def has_validation_share(data: DataConfig) -> bool:
    """Whether the data config gives the val split samples by its ratio (data.split_ratios), or fixes the split
    in files that may hold val samples (data.split_dir). A csv `split` column can fix val samples too, but only
    the data shows that: with a val ratio of 0 it is refused like the rest (a val ratio does not move a fixed sample)."""
    return data.split_ratios[1] > 0 or data.split_dir is not None


def validation_problem(config: RunConfig) -> Optional[tuple[str, str]]:
    """(key, problem) when the config selects on the val split (best.pt or early stopping by a val metric) and
    gives it no samples; None otherwise. Checked when a config is loaded, before anything runs (exit 2)."""
    if has_validation_share(config.data):
        return None
    key = config.checkpoint.best_metric
    if key is not None and metric_split(key) != SELECTION_SPLIT:
        return None  # picked on another split (train): nothing reads val
    shown = key or "the task's val metric (val_acc for classification)"
    ratios = list(config.data.split_ratios)
    if config.train.early_stopping_patience:
        return ("data.split_ratios", f"{ratios} gives the val split no samples, and train.early_stopping_patience stops training on "
                f"{shown}; give val a share, e.g. [0.8, 0.1, 0.1], or train every epoch (train.early_stopping_patience: null)")
    if config.checkpoint.best:
        return ("data.split_ratios", f"{ratios} gives the val split no samples, and checkpoint.best picks best.pt on {shown}; give val "
                "a share, e.g. [0.8, 0.1, 0.1], or keep no best.pt (checkpoint.best: false: the last checkpoint is evaluated)")
    return None


def selection_name(text: str) -> str:
    """The metric name of `--metric val.NAME` (or `NAME`); a test or train metric is a ConfigError (exit 2) that names
    the fix. Checked before anything else: which names a task declares is for `sweep_metric`."""
    split, dot, name = text.strip().partition(".")
    if not dot:
        split, name = SELECTION_SPLIT, split
    if split == REPORT_SPLIT:
        raise ConfigError("--metric", text, f"the test split is for the final report only, never for selection; select on validation: --metric val.{name}")
    if split != SELECTION_SPLIT:
        raise ConfigError("--metric", text, f"a sweep selects its best trial on the val split; give --metric val.{name}")
    return name


def sweep_metric(text: str, spec: TaskSpec) -> MetricSpec:
    """`--metric val.accuracy` (or `accuracy`) → the task's declaration of it (name, goal, epoch key); a test or train
    metric, or one the task does not declare, is a ConfigError (exit 2) that names the fix."""
    name = selection_name(text)
    declared = spec.metric(name)
    if declared is None:
        raise ConfigError("--metric", text, f"task {spec.name} declares no such metric; give one of "
                          f"{', '.join('val.' + m.name for m in spec.metrics)}")
    return declared


def for_run(config: RunConfig, task_best_metric: tuple[str, str], stages: list[str],
            sweep: Optional[dict[str, Any]] = None) -> Optional[dict[str, Any]]:
    """The record's `selection`: what picks best.pt and what stops training early (each a metrics.jsonl key, the split
    it is computed on and its direction) and, for a run of a sweep, what the sweep picks its best trial by (`sweep`:
    id, split, metric, mode, as the sweep planned it). None for a run that trains nothing."""
    if "train" not in stages:
        return None
    key = config.checkpoint.best_metric or task_best_metric[0]
    picked = {"split": metric_split(key), "metric": key, "mode": config.checkpoint.best_mode or task_best_metric[1]}
    patience = config.train.early_stopping_patience
    return {
        "best_checkpoint": picked if config.checkpoint.best else None,
        "early_stopping": {**picked, "patience": patience} if patience else None,
        "sweep": {"id": sweep["id"], "split": SELECTION_SPLIT, "metric": sweep.get("metric"), "mode": sweep.get("mode")} if sweep else None,
    }


def require_validation(selection: Optional[dict[str, Any]], val_samples: int) -> None:
    """RunFailed, before training, when something selects on a val split without samples: the config gave val a
    share, but the prepared data has none there (a fixed split without val files, say). Exit 1: found by preparing."""
    if not selection or val_samples > 0:
        return
    selects = [f"{shown} ({split} {metric})" for shown, split, metric in selected_on(selection) if split == SELECTION_SPLIT]
    if selects:
        fix = "" if selection.get("sweep") else ", or select nothing (checkpoint.best: false, train.early_stopping_patience: null)"
        raise RunFailed(f"data: the val split has no samples, and {' and '.join(selects)} select(s) on it; give it samples "
                        f"(data.split_ratios, or a val file in data.split_dir){fix}")


def selected_on(selection: dict[str, Any]) -> list[tuple[str, Optional[str], str]]:
    """(what, split, metric) of each selection a record's `selection` names."""
    found = []
    for what, shown in (("best_checkpoint", "best.pt"), ("early_stopping", "early stopping"), ("sweep", "the sweep's best trial")):
        part = selection.get(what)
        if isinstance(part, dict):
            found.append((shown, part.get("split"), str(part.get("metric") or "its headline metric")))
    return found
