"""The compare page: two to six runs side by side, what changed, their metrics and curves.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from veritrain.core.errors import UserError
from veritrain.web.common import run_dir_of
from veritrain.web.run_page import curves, task_charts
from veritrain.web.runs_table import OWN_COLUMNS

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace



def compare_page(workspace: Workspace, run_ids: list[str]) -> dict[str, Any]:
    """2–6 runs side by side: config and environment differences against the first, metrics with deltas,
    data versions and every run's curves."""
    from veritrain.records.experiments import compare
    from veritrain.records.record import read_record

    run_ids = [r for r in dict.fromkeys(run_ids) if r]
    if not 2 <= len(run_ids) <= 6:
        raise UserError("compare: give 2 to 6 runs, e.g. ?runs=RUN1,RUN2")
    records = [read_record(run_dir_of(workspace, r)) for r in run_ids]
    comparison = compare(records)
    labels = change_labels(comparison)
    comparison["labels"] = labels
    comparison["curves"] = {"runs": {r["run_id"]: curves(workspace.runs_dir / r["run_id"], r) for r in records}, "labels": labels,
                            "charts": task_charts(records)}
    comparison["headline_metrics"] = [m for m in comparison["metrics"] if ".per_class." not in f".{m['key']}." and "per_class" not in m["key"]]
    comparison["per_class_metrics"] = [m for m in comparison["metrics"] if m not in comparison["headline_metrics"]]
    return comparison


LABEL_KEYS = 3  # config keys a curve's label names, before `…`


def change_labels(comparison: dict[str, Any]) -> dict[str, str]:
    """Each compared run named by its values of the config keys that differ (`optim.lr=0.01, seed=2`), so the
    curves say what changed; a run whose config is the same as the others' keeps its id. Two runs that would read
    the same get their id added."""
    rows = [r for r in comparison["config"] if r["key"] not in OWN_COLUMNS] or comparison["config"]
    labels = {}
    for index, run_id in enumerate(comparison["run_ids"]):
        parts = [f"{r['key']}={_label_value(r['values'][index])}" for r in rows[:LABEL_KEYS]]
        labels[run_id] = (", ".join(parts) + (", …" if len(rows) > LABEL_KEYS else "")) if parts else run_id
    seen: dict[str, int] = {}
    for label in labels.values():
        seen[label] = seen.get(label, 0) + 1
    return {r: (f"{label} ({r[-6:]})" if seen[label] > 1 and label != r else label) for r, label in labels.items()}


def _label_value(value: Any) -> str:
    from veritrain.web import significant

    if isinstance(value, float):
        return significant(value)
    return value if isinstance(value, str) else json.dumps(value)
