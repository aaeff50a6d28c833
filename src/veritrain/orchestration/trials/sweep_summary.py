"""summary.json of a sweep, from its spec and the runs' records (the records are the truth): each trial's val
metrics with their deltas against the parent and the seed spread, the best trial chosen on val with its test
result beside it (reported, never used for selection), and the failed trials with their reason."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.files import write_atomic
from veritrain.core.selection import NOT_USED_FOR_SELECTION, REPORT_SPLIT, SELECTION_SPLIT
from veritrain.core.task_registry import spec_of_record, task_spec
from veritrain.orchestration.trials.state import SWEEP, Slot, json_bytes, linked_runs
from veritrain.orchestration.trials.sweep_plan import SlotState, planned_hashes
from veritrain.records.record import now_iso, read_record
from veritrain.records.workspace import Workspace


def runs_of(workspace: Workspace, spec: dict[str, Any]) -> dict[Slot, dict[str, Any]]:
    """The runs whose record names this sweep, one per slot (`state.linked_runs`): a record counts only with the
    config hash planned for its slot, so a copied or imported run that claims the slot does not."""
    planned = planned_hashes(spec)
    return linked_runs(workspace, spec["id"], lambda slot, record: planned.get(slot) == record.get("config_hash"))


def write_summary(workspace: Workspace, spec: dict[str, Any], folder: Path, states: dict[Slot, SlotState], status: Optional[str]) -> dict[str, Any]:
    summary = summarize(workspace, spec, states, status)
    write_atomic(folder / "summary.json", json_bytes(summary))
    return summary


def planned_selection(spec: dict[str, Any]) -> dict[str, Any]:
    """What the sweep picks its best trial by: spec.json's `selection` (a sweep planned before it had one: the
    headline on val)."""
    planned = spec.get("selection")
    if not isinstance(planned, dict):
        return {"split": SELECTION_SPLIT, "metric": None, "mode": None}
    return {"split": SELECTION_SPLIT, "metric": planned.get("metric"), "mode": planned.get("mode")}


def summarize(workspace: Workspace, spec: dict[str, Any], states: dict[Slot, SlotState], status: Optional[str] = None) -> dict[str, Any]:
    """summary.json from the spec and the runs' records (see `summary_from_records`)."""
    records: dict[str, dict[str, Any]] = {}
    for state in states.values():
        if state.run_id and state.run_id not in records:
            try:
                record = read_record(workspace.runs_dir / state.run_id)
            except (RunFailed, UserError):
                continue
            if record["status"] == "running" and state.status != "running" and workspace.lock_is_stale(state.run_id):
                record = {**record, "status": "interrupted"}  # its process is gone (killed): resumable like an interrupted run
            records[state.run_id] = record
    return summary_from_records(spec, states, records, status, str(workspace.state_dir / SWEEP.folder / spec["id"]))


def summary_from_records(spec: dict[str, Any], states: dict[Slot, SlotState], records: dict[str, dict[str, Any]],
                         status: Optional[str], folder: str) -> dict[str, Any]:
    """summary.json from the spec and the runs' records (run id → record): per trial its runs, status, the metrics of
    its val split with deltas against the parent and the seed spread; then the best trial, chosen on val only, with
    its test result beside it, reported and not used for selection; then the failed trials. `status` None: decided
    from the trials (completed, failed, or running while any is pending)."""
    parent_slots = sorted((s for s in states if s.trial is None), key=lambda s: s.seed_index)
    parent = _group(spec, [states[s] for s in parent_slots], records)
    if spec["parent"]["run"] and parent["status"] == "completed" and not parent["metrics"]:
        parent["note"] = (f"the --parent run has no val metrics, so the trials have no deltas; add them: "
                          f"veritrain eval {spec['parent']['run']} --split val")
    trials, by_index = [], {}
    for trial in spec["trials"]:
        slots = sorted((s for s in states if s.trial == trial["index"]), key=lambda s: s.seed_index)
        group_states = [states[s] for s in slots]
        entry = {"index": trial["index"], "change": trial["change"], "hypothesis": trial["hypothesis"],
                 "config_hash": trial["config_hashes"][0], **_group(spec, group_states, records)}
        entry["group"] = f"sweep-{spec['id']}-{trial['index']}" if spec["repeat"] > 1 else None
        entry["deltas"] = {name: value - parent["metrics"][name] for name, value in entry["metrics"].items()
                           if parent["status"] == "completed" and name in parent["metrics"]}
        if entry["data_version"] and parent["data_version"] and entry["data_version"] != parent["data_version"]:
            entry["note"] = "; ".join(filter(None, [entry.get("note"), "trained and evaluated on another data version than the parent: "
                                                    "its deltas compare different val sets"]))
        trials.append(entry)
        by_index[trial["index"]] = group_states
    parent["group"] = f"sweep-{spec['id']}-parent" if spec["repeat"] > 1 and not spec["parent"]["run"] else None
    planned = planned_selection(spec)
    headline = (planned["metric"], planned["mode"]) if planned["metric"] else _headline(records)
    best = None
    top = select_best(trials, *headline) if headline else None
    if top is not None and headline:
        name, mode = headline
        report = _group(spec, by_index[top["index"]], records, REPORT_SPLIT)  # read only now that the trial is chosen
        best = {"trial": top["index"], "change": top["change"], "split": SELECTION_SPLIT, "metric": name, "mode": mode,
                "value": top["metrics"][name], "delta": top["deltas"].get(name), "run_ids": top["run_ids"],
                "test": {"split": REPORT_SPLIT, "used_for_selection": False, "label": NOT_USED_FOR_SELECTION,
                         "metrics": report["metrics"], "spread": report["spread"]}}
    counts = {key: sum(1 for t in trials if t["status"] == key) for key in ("completed", "failed", "interrupted", "running", "pending")}
    if status is None:
        statuses = {parent["status"], *(t["status"] for t in trials)}
        status = ("failed" if "failed" in statuses else "completed" if statuses == {"completed"}
                  else "interrupted" if "interrupted" in statuses else "running")
    return {
        SWEEP.version_key: SWEEP.version,
        "id": spec["id"],
        "status": status,
        "created_at": spec["created_at"],
        "updated_at": now_iso(),
        "folder": folder,
        "exp_name": spec["exp_name"],
        "config": spec["config"],
        "mode": spec["mode"],
        "varied": spec["varied"],
        "threads": spec["threads"],
        "threads_reason": spec["threads_reason"],
        "repeat": spec["repeat"],
        "backend": spec["backend"],
        "split": SELECTION_SPLIT,
        "selection": {"split": SELECTION_SPLIT, "metric": headline[0] if headline else None, "mode": headline[1] if headline else None,
                      "given": bool(planned["metric"]), "report_split": REPORT_SPLIT},
        "headline": {"metric": headline[0], "mode": headline[1]} if headline else None,
        "parent": {**parent, "given": bool(spec["parent"]["run"])},
        "trials": trials,
        "best": best,
        "failed": [{"trial": t["index"], "change": t["change"], "run_ids": t["run_ids"], "error": t["error"]} for t in trials if t["status"] == "failed"],
        "skipped": spec["skipped"],
        "counts": {"trials": len(trials), **counts},
    }


def select_best(trials: list[dict[str, Any]], metric: str, mode: str) -> Optional[dict[str, Any]]:
    """The completed trial with the best `metric` of its val split (its mean over seeds); the first of equals. Test
    metrics are not an input: a summary's trials hold their val metrics only."""
    scored = [t for t in trials if t["status"] == "completed" and metric in t["metrics"]]
    if not scored:
        return None
    return (max if mode == "max" else min)(scored, key=lambda t: t["metrics"][metric])


def _group(spec: dict[str, Any], states: list[SlotState], records: dict[str, dict[str, Any]], split: str = SELECTION_SPLIT) -> dict[str, Any]:
    """The runs of one trial (or the parent), one per seed: status, metrics of `split` (the mean over seeds), spread,
    error. A run counts only when its val and test metrics come from the same checkpoint (the one it ships)."""
    from veritrain.orchestration.repeats import spread

    statuses, errors, values, versions, notes = [], [], {}, set(), []
    ranges: dict[str, tuple[float, float]] = {}
    for state in states:
        record = records.get(state.run_id) if state.run_id else None
        status = record["status"] if record and state.status != "running" else state.status  # a resumed run says so once it runs
        statuses.append(status)
        if record and record.get("error") and status != "completed":
            errors.append(record["error"]["message"])
        elif state.error and status != "completed":
            errors.append(state.error)
        if record and status == "completed":
            evaluated = record.get("metrics") or {}
            checkpoints = {(evaluated.get(s) or {}).get("checkpoint_sha256") for s in (SELECTION_SPLIT, REPORT_SPLIT) if s in evaluated}
            if len(checkpoints) > 1:
                notes.append(f"run {record['run_id']}: its val and test metrics come from different checkpoints, so it is left out; "
                             f"evaluate both from the one it ships: veritrain eval {record['run_id']} --split {SELECTION_SPLIT}")
                continue
            metrics = evaluated.get(split) or {}
            declared = spec_of_record(record)  # a task unknown here: every number of the split, unbounded
            for name in [m.name for m in declared.metrics] if declared else sorted(metrics):
                if isinstance(metrics.get(name), (int, float)) and not isinstance(metrics.get(name), bool):
                    values.setdefault(name, []).append(float(metrics[name]))
                    ranges[name] = declared.metric(name).range if declared else (float("-inf"), float("inf"))
            versions.add((record.get("data") or {}).get("version"))
    overall = ("completed" if statuses and all(s == "completed" for s in statuses) else "failed" if "failed" in statuses
               else "interrupted" if "interrupted" in statuses else "running" if "running" in statuses else "pending")
    entry: dict[str, Any] = {
        "run_ids": [s.run_id for s in states if s.run_id],
        "status": overall,
        "metrics": {name: statistics.fmean(v) for name, v in values.items()},
        "spread": {name: spread(v, ranges[name]) for name, v in values.items()} if spec["repeat"] > 1 else None,
        "data_version": next(iter(versions)) if len(versions) == 1 else None,
        "error": errors[0] if errors else None,
    }
    if notes:
        entry["note"] = "; ".join(notes)
    return entry


def _headline(records: dict[str, dict[str, Any]]) -> Optional[tuple[str, str]]:
    """What picks the best trial of a sweep planned before its spec named one: the headline metric its runs' task
    declares (None when no run of a known task is there)."""

    for record in records.values():
        task = (record.get("config") or {}).get("task")
        try:
            headline = task_spec(str(task)).headline if task else None
        except UserError:
            continue
        if headline is not None:
            return headline.name, headline.goal
    return None
