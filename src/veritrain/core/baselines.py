"""Whether a model beats its baseline: one judgement, read by the run's evaluation (its warning), the evaluation
reports, `check`'s `beats_baseline` row and the run page, so none of them can say otherwise than another.

A baselines document (`eval/baselines.json`, the record's `baselines`) names the rule that judges it in `judged_by`:
the metric, its goal (`max` or `min`) and the baseline it is compared with, as the run's task declares them
(veritrain.core.task_spec.BaselineRule). Where the task's code is installed, its declaration judges (`declared`, given
by the caller), whatever the document names; the document's own rule judges the runs of a task not loaded here. A
document judged by neither is `unknown`, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class Judgement:
    status: str  # "beats", "does_not_beat", "missing" (no metrics or no baselines), "unknown" (no rule judges them)
    detail: str
    metric: Optional[str] = None
    goal: Optional[str] = None
    value: Optional[float] = None
    baseline: Optional[str] = None
    baseline_value: Optional[float] = None
    margin: float = 0.0

    @property
    def warning(self) -> Optional[str]:
        """The line a run logs and a report shows when the model does not beat its baseline."""
        if self.status != "does_not_beat":
            return None
        relation = "above" if self.goal == "max" else "below"
        return (f"the model's {self.metric} {self.value:.4f} is not {self.margin:g} {relation} the {self.baseline} baseline's "
                f"{self.baseline_value:.4f} (eval.baseline_margin)")


def rule_of(baselines: Mapping[str, Any], declared: Optional[Mapping[str, str]] = None) -> Optional[dict[str, str]]:
    """The rule that judges a baselines document: the one the run's task declares in the installed code (`declared`,
    TaskSpec.baseline_rule) when the document holds that baseline, so a document that names a weaker baseline is not
    believed; else the one it names (a task whose code is not loaded here)."""
    for rule in (declared, baselines.get("judged_by")):
        if isinstance(rule, Mapping) and rule.get("goal") in ("max", "min") and isinstance(rule.get("metric"), str) \
                and isinstance(rule.get("baseline"), str):
            found = baselines.get("results")
            if rule is declared and not (isinstance(found, Mapping) and isinstance(found.get(rule["baseline"]), Mapping)):
                return None
            return {"metric": rule["metric"], "goal": rule["goal"], "baseline": rule["baseline"]}
    return None


def judge(metrics: Optional[Mapping[str, Any]], baselines: Optional[Mapping[str, Any]],
          declared: Optional[Mapping[str, str]] = None) -> Judgement:
    """The judgement of `metrics` (one split's) against `baselines`, by the document's rule (else the one the run's
    task declares, `declared`) and margin."""
    if not metrics or not baselines:
        return Judgement("missing", "no test metrics" if not metrics else "no baselines")
    rule = rule_of(baselines, declared)
    if rule is None:
        return Judgement("unknown", "the baselines name no rule that judges them (judged_by), and the run's task declares none they hold")
    margin = baselines.get("margin", 0.0)
    margin = float(margin) if isinstance(margin, (int, float)) and not isinstance(margin, bool) else 0.0
    found = metrics.get(rule["metric"])
    recorded = ((baselines.get("results") or {}).get(rule["baseline"]) or {}).get(rule["metric"])
    if not isinstance(found, (int, float)) or not isinstance(recorded, (int, float)) or not _number(found) or not _number(recorded):
        return Judgement("unknown", f"the {rule['metric']} of the model or of the {rule['baseline']} baseline is not recorded",
                         rule["metric"], rule["goal"], baseline=rule["baseline"], margin=margin)
    value, reference = float(found), float(recorded)
    beats = value >= reference + margin if rule["goal"] == "max" else value <= reference - margin
    # a baseline fit that stopped before it converged is weaker than it should be: the comparison says so
    unconverged = ((baselines.get("results") or {}).get(rule["baseline"]) or {}).get("converged") is False
    return Judgement("beats" if beats else "does_not_beat", f"{rule['metric']} {value:.4f} vs {rule['baseline']} {reference:.4f}"
                     + (f" (margin {margin:g})" if margin else "")
                     + (f"; the {rule['baseline']} baseline did not converge (raise eval.baseline_max_iter): a stronger one may score better"
                        if unconverged else ""), rule["metric"], rule["goal"], value, rule["baseline"], reference, margin)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
