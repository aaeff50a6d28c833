"""`veritrain run --repeat N`: the same config with seeds seed, seed+1, …, as linked runs, and the
spread of their test metrics (mean, standard deviation, 95% interval from Student's t): a final report,
which selects nothing (no seed or run is picked; every run evaluates the test split).

The group summary is written to `.veritrain/repeats/<group>.json`; each run's record names its
group, index and count under `repeat`.
"""

from __future__ import annotations

import json
import math
import secrets
import statistics
from typing import Any, Optional

from veritrain.core.baselines import judge, rule_of
from veritrain.core.config import ResolvedConfig
from veritrain.core.selection import REPORT_SPLIT
from veritrain.core.task_registry import task_spec
from veritrain.orchestration import pipeline
from veritrain.records.workspace import Workspace


def spread(values: list[float], valid: tuple[float, float] = (-math.inf, math.inf)) -> dict[str, Any]:
    """Mean, sample standard deviation and the 95% interval mean ± t(0.975, n − 1) · std / √n, clipped to
    `valid`, the range the metric can take (its task declares it: `MetricSpec.range`).

    Why clip: Student's t interval is symmetric because it assumes the metric is normally distributed
    across seeds. A metric bounded by 0 or 1 is not, least of all near its bound: with few seeds and a
    mean close to 0 (log loss, ECE of a good model) or 1 (accuracy), mean ± half reaches values no run can
    ever give, such as a negative log loss. Clipping keeps the interval to the possible values; it stays
    the same t interval wherever it already lay inside the range.
    """
    from scipy.stats import t

    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    half = t.ppf(0.975, n - 1) * std / math.sqrt(n) if n > 1 else 0.0
    low, high = valid
    return {"mean": mean, "std": std, "ci95": [max(mean - half, low), min(mean + half, high)], "n": n, "values": values}


def run(resolved: ResolvedConfig, workspace: Workspace, argv: list[str], count: int, nproc: int = 1,
        hypothesis: Optional[str] = None, parent: Optional[str] = None, smoke: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """`count` runs of `resolved` with seeds seed, seed+1, …; each run's record keeps the hypothesis, the parent
    and the smoke result given, as a single run's does."""
    group = secrets.token_hex(4)
    base_seed = resolved.config.seed
    outcomes = []
    for index in range(count):
        config = resolved.config.model_copy(update={"seed": base_seed + index})
        seeded = ResolvedConfig(config=config, path=resolved.path, overrides=[*resolved.overrides, f"seed={base_seed + index}"],
                                data_paths=resolved.data_paths)
        outcome = pipeline.run(seeded, workspace, argv, repeat={"group": group, "index": index, "of": count}, nproc=nproc,
                               hypothesis=hypothesis, parent=parent, smoke=smoke)
        outcomes.append(outcome)
    completed = [o for o in outcomes if o.record["status"] == "completed"]
    split = REPORT_SPLIT  # each seed's run evaluates test (pipeline.evaluation_splits), whatever eval.split says
    summary = {}
    for metric in task_spec(resolved.config.task).metrics:  # what the task declares, clipped to the bounds it declares
        values = [o.record["metrics"][split][metric.name] for o in completed
                  if isinstance(o.record["metrics"].get(split, {}).get(metric.name), float)]
        if values:
            summary[metric.name] = spread(values, metric.range)
    baselines = {}
    first = completed[0].record.get("baselines") if completed else None
    if first:
        declared = task_spec(resolved.config.task).names()
        baselines = {name: {k: v for k, v in r.items() if k in declared} for name, r in first["results"].items()}
    warning = None
    rule = rule_of(first, task_spec(resolved.config.task).baseline_rule()) if first else None
    if rule is not None and rule["metric"] in summary:  # the whole interval must beat the baseline, by the one judgement
        name, interval = rule["metric"], summary[rule["metric"]]["ci95"]
        worst = interval[0] if rule["goal"] == "max" else interval[1]
        judged = judge({name: worst}, first, rule)
        if judged.status == "does_not_beat":
            warning = f"the 95% interval of {name} reaches {worst:.4f}: {judged.detail}"
    result = {
        "group": group,
        "split": split,
        "selection": None,  # the spread is reported; no seed is chosen
        "report": "final: the spread over seeds on the test split; no seed or run is selected",
        "runs": [{**o.summary, "seed": o.record["seed"]} for o in outcomes],
        "summary": summary,
        "baselines": baselines,
        "warning": warning,
        "failed": [o.summary["run_id"] for o in outcomes if o.record["status"] != "completed"],
    }
    folder = workspace.state_dir / "repeats"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{group}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    pipeline.update_experiments(workspace)  # the group's seed spread exists only now
    return result
