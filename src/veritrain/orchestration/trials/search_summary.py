"""summary.json of a search, from its study and the trials' run records (the records are the truth for what a
run did; the study for what was proposed): each trial's change, state, val metric and its values at each validation, why
it was pruned, its test metrics (labelled: never used for selection); the best trial, chosen on val alone; and
SHA256SUMS, the seal over spec.json, the study and the summary (`sha256sum -c SHA256SUMS` checks it)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

from veritrain.core.files import write_atomic
from veritrain.core.selection import NOT_USED_FOR_SELECTION, REPORT_SPLIT, SELECTION_SPLIT
from veritrain.core.task_registry import spec_of_record
from veritrain.orchestration.trials.state import SEARCH, json_bytes, linked_runs
from veritrain.records.record import now_iso
from veritrain.records.workspace import Workspace

SEALED_FILES = ("spec.json", "study.jsonl", "summary.json")
SUMS_FILE = "SHA256SUMS"
STATES = ("completed", "pruned", "failed", "running", "interrupted", "waiting")


def search_runs(workspace: Workspace, spec: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The runs whose record names this search, by trial number (`state.linked_runs`)."""
    found = linked_runs(workspace, spec["id"], lambda slot, record: (record.get("sweep") or {}).get("kind") == "search" and
                        isinstance(slot.trial, int) and not isinstance(slot.trial, bool))
    return {slot.trial: record for slot, record in found.items() if slot.trial is not None}


def write_summary(workspace: Workspace, spec: dict[str, Any], folder: Path, study: Any, errors: dict[int, str],
                  status: Optional[str]) -> dict[str, Any]:
    records = search_runs(workspace, spec)
    stale = {number for number, record in records.items() if record["status"] == "running" and workspace.lock_is_stale(record["run_id"])}
    summary = summary_from_study(spec, _trials_of(study), records, errors, status, stale)
    summary["folder"] = str(folder)
    write_atomic(folder / "summary.json", json_bytes(summary))
    seal(folder)
    return summary


def _trials_of(study: Any) -> list[dict[str, Any]]:
    """The study's trials as plain data: number, Optuna state, params, user attributes, intermediate values."""
    return [{"number": t.number, "state": t.state.name, "user_attrs": dict(t.user_attrs), "intermediate": dict(t.intermediate_values),
             "value": t.value if t.state.name == "COMPLETE" else None} for t in study.get_trials(deepcopy=False)]


def summary_from_study(spec: dict[str, Any], trials: list[dict[str, Any]], records: dict[int, dict[str, Any]], errors: dict[int, str],
                       status: Optional[str], stale: Optional[set[int]] = None) -> dict[str, Any]:
    """summary.json from the spec, the study's trials (`_trials_of`) and the runs' records by trial number."""
    metric, split = spec["metric"]["name"], spec["metric"]["split"]
    entries = []
    for trial in trials:
        number, record = trial["number"], records.get(trial["number"])
        state = {"COMPLETE": "completed", "PRUNED": "pruned", "FAIL": "failed", "WAITING": "waiting"}.get(trial["state"], "running")
        if state == "running" and record is not None and (record["status"] == "interrupted" or number in (stale or set())):
            state = "interrupted"
        entry: dict[str, Any] = {
            "number": number, "state": state, "change": trial["user_attrs"].get("change") or {},
            "run_id": record["run_id"] if record else trial["user_attrs"].get("run_id"),
            "config_hash": record.get("config_hash") if record else None,
            "value": trial["value"],  # the val metric the study was told (the run's eval/val/metrics.json)
            "intermediate": [[at, value] for at, value in sorted(trial["intermediate"].items())],  # per validation (`judged_at`), from metrics.jsonl
            "pruned": record.get("pruned") if record else None,
            "error": ((record or {}).get("error") or {}).get("message") if state == "failed" else None,
        }
        if state == "failed" and not entry["error"]:
            entry["error"] = errors.get(number)
        test = ((record or {}).get("metrics") or {}).get(REPORT_SPLIT) if state == "completed" else None
        declared = spec_of_record(record)  # the metrics its task declares, in its order; every number for a task unknown here
        names = declared.names() if declared is not None else sorted(test or {})
        entry["test"] = ({"split": REPORT_SPLIT, "used_for_selection": False, "label": NOT_USED_FOR_SELECTION,
                          "metrics": {k: test[k] for k in names if isinstance(test.get(k), (int, float)) and not isinstance(test.get(k), bool)}}
                         if isinstance(test, dict) else None)
        entries.append(entry)
    best = select_best_trial(entries, spec["metric"]["mode"])
    counts = {key: sum(1 for e in entries if e["state"] == key) for key in STATES}
    if status is None:
        unfinished = counts["running"] + counts["interrupted"] + counts["waiting"] > 0 or len(entries) < spec["trials"]
        status = ("interrupted" if unfinished else "failed" if entries and counts["failed"] == len(entries) else "completed")
    return {
        SEARCH.version_key: SEARCH.version,
        "id": spec["id"],
        "status": status,
        "created_at": spec["created_at"],
        "updated_at": now_iso(),
        "exp_name": spec["exp_name"],
        "config": spec["config"],
        "space": spec["space"],
        "sampler": spec["sampler"],
        "pruner": spec["pruner"],
        "judged_at": "step" if spec["metric"].get("judged_at") == "step" else "epoch",  # what `intermediate` and a pruning count
        "reproducible": spec["reproducible"],
        "parallel": spec["parallel"],
        "backend": spec["backend"],
        "threads": spec["threads"],
        "selection": {"split": split, "metric": metric, "mode": spec["metric"]["mode"], "report_split": REPORT_SPLIT},
        "trials": entries,
        "best": None if best is None else {
            "number": best["number"], "change": best["change"], "run_id": best["run_id"], "split": SELECTION_SPLIT, "metric": metric,
            "mode": spec["metric"]["mode"], "value": best["value"], "test": best["test"]},
        "counts": {"planned": spec["trials"], "trials": len(entries), **counts},
    }


def select_best_trial(trials: list[dict[str, Any]], mode: str) -> Optional[dict[str, Any]]:
    """The completed trial with the best val metric (`value`); the first of equals. Each trial's test metrics sit
    beside it and are not read here."""
    scored = [t for t in trials if t["state"] == "completed" and isinstance(t.get("value"), (int, float))]
    if not scored:
        return None
    return (max if mode == "max" else min)(scored, key=lambda t: t["value"])


def seal(folder: Path) -> str:
    """Write SHA256SUMS over the search's files (sha256sum's format); returns the digest of that file."""
    lines = []
    for name in SEALED_FILES:
        path = folder / name
        if path.exists():
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {name}\n")
    data = "".join(lines).encode()
    write_atomic(folder / SUMS_FILE, data)
    return hashlib.sha256(data).hexdigest()


def check_seal(folder: Path) -> list[str]:
    """What no longer matches the search's seal (empty: it holds): a changed, missing or unlisted file."""
    try:
        listed = (folder / SUMS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return [f"{SUMS_FILE} is missing"]
    problems, seen = [], set()
    for line in listed:
        digest, _, name = line.partition("  ")
        if name not in SEALED_FILES:
            problems.append(f"{SUMS_FILE} lists {name[:60]!r}, not a file of a search")
            continue
        seen.add(name)
        try:
            actual = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        except OSError:
            problems.append(f"{name} is missing")
            continue
        if actual != digest:
            problems.append(f"{name} changed since the search sealed it")
    problems.extend(f"{name} is not sealed" for name in SEALED_FILES if name not in seen and (folder / name).exists())
    return problems
