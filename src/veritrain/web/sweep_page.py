"""The experiments page and a sweep's or search's page: its trials, the best one and the parallel coordinates.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from veritrain.core.errors import UserError
from veritrain.records import registry
from veritrain.web.common import finite_number, listed_rows, read_json, run_dir_of, shown_text

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace



def experiments_page(workspace: Workspace, only: Optional[list[str]] = None) -> dict[str, Any]:
    """The experiment log (what experiments.md shows), built from the index: newest first, each entry with
    its hypothesis, config changes against its reference run, headline metrics and notes."""
    from veritrain.records.experiments import config_changes, reference_of, shown_metrics

    rows = registry.query(workspace.state_dir, workspace.runs_dir)
    if only is not None:
        rows = [r for r in rows if r["run_id"] in set(only)]
    ordered = sorted(rows, key=lambda r: r["started_at"] or "")
    by_id = {r["run_id"]: r for r in rows}
    entries = []
    for row in reversed(ordered):
        reference = reference_of(row, by_id, ordered)
        changed = config_changes(reference["config"], row["config"]) if reference else {}
        shown = shown_metrics(row)
        metrics = [(f"{split}.{name}", value) for split, values in (row["metrics"] or {}).items()
                   for name, value in values.items() if name in shown]
        entries.append({"row": row, "reference": reference["run_id"] if reference else None,
                        "changed": [{"key": k, "reference": a, "value": b} for k, (a, b) in changed.items()],
                        "metrics": metrics, "notes": row["notes"] or []})
    return {"entries": entries, "sweeps": sweeps_of(workspace.state_dir, only), "searches": searches_of(workspace.state_dir, only)}


def searches_of(state_dir: Path, only: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """Each search as the experiments page lists it, newest first (its page shows the rest); with `only`, a search
    only when all its runs are among them."""
    from veritrain.records.experiments import search_summaries

    shown = []
    for summary in search_summaries(state_dir):
        trials = listed_rows(summary, "trials", limit=10_000)
        run_ids = [t["run_id"] for t in trials if isinstance(t.get("run_id"), str)]
        if only is not None and not set(run_ids) <= set(only):
            continue
        best = summary.get("best") if isinstance(summary.get("best"), dict) else {}
        selection: dict[str, Any] = summary["selection"] if isinstance(summary.get("selection"), dict) else {}
        shown.append({"id": shown_text(summary.get("id")), "exp_name": shown_text(summary.get("exp_name")), "status": shown_text(summary.get("status")),
                      "trials": len(trials), "metric": f"{shown_text(selection.get('split'))} {shown_text(selection.get('metric'))}",
                      "best": {"number": best.get("number"), "value": _metric_value(best.get("value"))} if best else None})
    return shown


def sweeps_of(state_dir: Path, only: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """Each sweep's summary.json as the experiments page shows it, newest first: the trials with their val metric and
    delta, the best trial (chosen on val) and its test result, labelled as not used for selection. With `only` (what
    `publish` includes), a sweep only when all its runs are among them; a summary of another shape is left out."""
    from veritrain.records.experiments import sweep_summaries

    shown = []
    for summary in sweep_summaries(state_dir):
        try:
            shown.append(_sweep_view(summary))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if only is not None and not set(shown[-1]["run_ids"]) <= set(only):
            shown.pop()
    return shown


def _metric_value(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sweep_view(summary: dict[str, Any]) -> dict[str, Any]:
    metric = (summary.get("headline") or {}).get("metric")
    split = shown_text(summary.get("split"))
    best = summary.get("best") or {}
    trials, run_ids = [], list(summary["parent"].get("run_ids") or [])
    for trial in summary["trials"]:
        run_ids += trial.get("run_ids") or []
        trials.append({"index": trial["index"], "change": ", ".join(f"{k}={shown_text(v)}" for k, v in (trial.get("change") or {}).items()),
                       "runs": ", ".join(trial.get("run_ids") or []) or "-", "status": shown_text(trial.get("status")),
                       "value": _metric_value((trial.get("metrics") or {}).get(metric)), "delta": _metric_value((trial.get("deltas") or {}).get(metric)),
                       "best": best.get("trial") == trial["index"]})
    report = best.get("test") or {}
    chosen = None
    if best:
        chosen = {"trial": best["trial"], "change": ", ".join(f"{k}={shown_text(v)}" for k, v in (best.get("change") or {}).items()),
                  "value": _metric_value(best.get("value")), "delta": _metric_value(best.get("delta")),
                  "test": _metric_value((report.get("metrics") or {}).get(metric)), "label": shown_text(report.get("label") or "not used for selection")}
    return {"id": shown_text(summary["id"]), "exp_name": shown_text(summary.get("exp_name")), "status": shown_text(summary.get("status")),
            "split": split, "metric": shown_text(metric), "trials": trials, "best": chosen, "run_ids": run_ids,
            "parent": {"runs": ", ".join(summary["parent"].get("run_ids") or []) or "-", "status": shown_text(summary["parent"].get("status")),
                       "value": _metric_value((summary["parent"].get("metrics") or {}).get(metric))}}


SWEEP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def recomputed_best(workspace: Workspace, trials: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any]:
    """The best trial computed again from the trials' own run records (the val metric of each completed run, the mean
    over a trial's seeds; the first of equals), never from summary.json, and whether the summary agrees: {"best", "value",
    "agrees", "detail"} (threat: a summary edited, and its SHA256SUMS made again, to name another winner)."""
    from veritrain.core.errors import RunFailed
    from veritrain.records.record import read_record

    values: dict[Any, float] = {}
    for trial in trials:
        if trial["state"] != "completed" or not trial["run_ids"]:
            continue
        found = []
        for run_id in trial["run_ids"]:
            try:
                record = read_record(run_dir_of(workspace, run_id))
            except (RunFailed, UserError):
                continue
            value = finite_number(((record.get("metrics") or {}).get("val") or {}).get(metric))
            if record.status == "completed" and value is not None:
                found.append(value)
        if found and len(found) == len(trial["run_ids"]):
            values[trial["number"]] = statistics.fmean(found)
    if not values:
        return {"best": None, "value": None, "agrees": True, "detail": "no completed trial's run record is here to recompute it from"}
    best = (max if mode == "max" else min)(values, key=lambda number: values[number])
    named = next((t for t in trials if t["best"]), None)
    disagree = [f"summary.json names trial {named['number'] if named else 'none'} as the best, the trials' run records give trial "
                f"{best} (val {metric} {values[best]:.4f})"] if named is None or named["number"] != best else []
    disagree += [f"trial {t['number']}: summary.json says {t['value']:.4f}, its run records {values[t['number']]:.4f}" for t in trials
                 if t["number"] in values and t["value"] is not None and not math.isclose(t["value"], values[t["number"]], rel_tol=1e-9, abs_tol=1e-12)]
    return {"best": best, "value": values[best], "agrees": not disagree,
            "detail": "; ".join(disagree[:4]) if disagree else f"trial {best}, recomputed from the trials' run records"}


def _summary_of(workspace: Workspace, sweep_id: str) -> tuple[str, Path, dict[str, Any]]:
    """("search" or "sweep", its folder, its summary.json) for a sweep or search named by its exact id."""
    if SWEEP_ID.fullmatch(sweep_id or ""):
        for kind, parent in (("search", "searches"), ("sweep", "sweeps")):
            folder = workspace.state_dir / parent / sweep_id
            summary = read_json(folder / "summary.json")
            if isinstance(summary, dict) and isinstance(summary.get("trials"), list):
                return kind, folder, summary
    raise UserError(f"{sweep_id}: no such sweep or search in {workspace.state_dir}")


def _axis(key: str, values: list[Any]) -> dict[str, Any]:
    """A parallel-coordinates axis of one varied key: numeric (log-scaled when its positive values span over two
    decades, as a learning rate's do) or categorical (each distinct value, as text, in the order met)."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if values and len(numbers) == len(values):
        low, high = min(numbers), max(numbers)
        return {"key": key, "kind": "log" if low > 0 and high / low >= 100 else "linear", "min": low, "max": high}
    labels = list(dict.fromkeys(shown_text(v) for v in values))
    return {"key": key, "kind": "category", "labels": labels}


def _space_axis(param: dict[str, Any]) -> dict[str, Any]:
    """A parallel-coordinates axis over what a search's space allows (not only the values its trials took)."""
    kind = param.get("kind")
    if kind == "choice" and isinstance(param.get("choices"), list):
        return {"key": param["key"], "kind": "category", "labels": [shown_text(c) for c in param["choices"]]}
    low, high = finite_number(param.get("low")), finite_number(param.get("high"))
    if low is None or high is None:
        return {"key": param["key"], "kind": "category", "labels": []}
    scale = "log" if str(kind).startswith("log") and low > 0 else "linear"
    return {"key": param["key"], "kind": scale, "min": low, "max": high}


def _pruned_at(pruned: Optional[dict[str, Any]], summary: dict[str, Any]) -> Optional[str]:
    """Where a trial was pruned, in the unit its search judged (`epoch 3`, or `step 400`); None when it was not."""
    unit = "step" if summary.get("judged_at") == "step" else "epoch"
    at = pruned.get(unit) if pruned else None
    return f"{unit} {at}" if isinstance(at, int) and not isinstance(at, bool) else None


def sweep_page(workspace: Workspace, sweep_id: str) -> dict[str, Any]:
    """A sweep's or a search's page: every trial with the val metric that selected and the test metric beside it
    (not used for selection), the best trial, the data of a parallel-coordinates plot of the varied keys against the
    val metric, the seed spread of repeated trials, and whether the search's seal (SHA256SUMS) still holds."""
    kind, folder, summary = _summary_of(workspace, sweep_id)
    selection: dict[str, Any] = summary["selection"] if isinstance(summary.get("selection"), dict) else {}
    metric = shown_text(selection.get("metric") or (summary.get("headline") or {}).get("metric"))
    mode = shown_text(selection.get("mode") or (summary.get("headline") or {}).get("mode") or "max")
    trials = []
    for t in listed_rows(summary, "trials", limit=10_000):
        change = t.get("change") if isinstance(t.get("change"), dict) else {}
        if kind == "search":
            number, state, run_ids = t.get("number"), shown_text(t.get("state")), [t["run_id"]] if isinstance(t.get("run_id"), str) else []
            value = _metric_value(t.get("value"))
            test = _metric_value(((t.get("test") or {}).get("metrics") or {}).get(metric))
            spread = None
        else:
            number, state, run_ids = t.get("index"), shown_text(t.get("status")), [r for r in t.get("run_ids") or [] if isinstance(r, str)]
            value = _metric_value((t.get("metrics") or {}).get(metric))
            test = None  # a sweep reads the test split of its best trial only
            s = ((t.get("spread") or {}).get(metric)) if isinstance(t.get("spread"), dict) else None
            spread = {"mean": finite_number(s.get("mean")), "std": finite_number(s.get("std")), "n": s.get("n"),
                      "values": [finite_number(v) for v in s.get("values") or []],
                      "ci95": [finite_number(v) for v in s.get("ci95") or []]} if isinstance(s, dict) else None
        pruned = t.get("pruned") if isinstance(t.get("pruned"), dict) else None
        trials.append({"number": number, "state": state, "change": change, "run_ids": run_ids, "value": value, "test": test,
                       "spread": spread, "pruned_at": _pruned_at(pruned, summary), "error": shown_text(t.get("error")) or None,
                       "intermediate": [p for p in t.get("intermediate") or [] if isinstance(p, list) and len(p) == 2]})
    best = summary.get("best") if isinstance(summary.get("best"), dict) else None
    best_number = (best or {}).get("number", (best or {}).get("trial"))
    if best is not None and kind == "sweep":  # the one test result a sweep reads: its best trial's
        for t in trials:
            if t["number"] == best_number:
                t["test"] = _metric_value(((best.get("test") or {}).get("metrics") or {}).get(metric))
    for t in trials:
        t["best"] = best is not None and t["number"] == best_number
    space: dict[str, Any] = summary["space"] if isinstance(summary.get("space"), dict) else {}
    declared = {p["key"]: p for p in space.get("params") or [] if isinstance(p, dict) and isinstance(p.get("key"), str)}
    keys = list(dict.fromkeys([*declared, *(k for t in trials for k in t["change"])]))
    axes = [_space_axis(declared[k]) if k in declared else _axis(k, [t["change"].get(k) for t in trials if k in t["change"]])
            for k in keys]
    scored = [t["value"] for t in trials if t["value"] is not None]
    plot = {"axes": axes, "metric": f"{shown_text(selection.get('split') or 'val')} {metric}", "mode": mode,
            "range": [min(scored), max(scored)] if scored else None,
            "trials": [{"number": t["number"], "state": t["state"], "best": t["best"], "value": t["value"],
                        "values": [t["change"].get(k) if isinstance(t["change"].get(k), (int, float)) and not isinstance(t["change"].get(k), bool)
                                   else shown_text(t["change"].get(k)) if k in t["change"] else None for k in keys]} for t in trials]}
    seal = None
    if kind == "search":
        from veritrain.orchestration.trials.search_summary import check_seal

        problems = check_seal(folder)
        seal = {"ok": not problems, "problems": problems}
    return {"id": sweep_id, "kind": kind, "recomputed": recomputed_best(workspace, trials, metric, mode), "exp_name": shown_text(summary.get("exp_name")), "status": shown_text(summary.get("status")),
            "split": shown_text(selection.get("split") or "val"), "metric": metric, "mode": mode, "trials": trials, "varied": keys,
            "best": next((t for t in trials if t["best"]), None), "plot": plot, "seal": seal, "counts": summary.get("counts") or {},
            "sampler": (summary.get("sampler") or {}) if kind == "search" else None,
            "pruner": (summary.get("pruner") or {}) if kind == "search" else None,
            "reproducible": summary.get("reproducible"), "repeat": summary.get("repeat"),
            "space": [p for p in space.get("params") or [] if isinstance(p, dict)],
            "created_at": shown_text(summary.get("created_at")), "updated_at": shown_text(summary.get("updated_at"))}
