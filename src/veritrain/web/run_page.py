"""A run's page: its overview, curves, evaluation, trajectory, audits and trust verdict, and the live updates of a running run.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from veritrain.core.errors import UserError
from veritrain.core.files import read_regular
from veritrain.records import registry
from veritrain.records.record import RUN_ID  # the id shape every reader of a record enforces
from veritrain.web.common import (
    OUTSIDE_KINDS,
    finite_number,
    first_rows,
    lines_from,
    listed_rows,
    read_json,
    run_dir_of,
    shown_text,
    visible_text,
)

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace

EVAL_IMAGES = ("confusion_matrix.png", "confusion_matrix_normalized.png", "bad_cases.png", "curves.png")
NOT_CURVES = ("epoch", "step", "seconds")  # metrics.jsonl keys that are no curve: every other number in it is one
STEP_KEYS = ("loss", "lr", "grad_norm")  # the columns of steps.jsonl the charts draw (samples_per_s is in the file)
MAX_CSV_ROWS = 1000  # per-class rows shown on a page


def epoch_points(rows: list[dict[str, Any]], by: str = "epoch") -> dict[str, Any]:
    """The rows of metrics.jsonl as chart points, placed by their `by` (`rows_by`): "epochs" holds those x values."""
    rows = [r for r in rows if type(r.get(by)) in (int, float)]
    keys = dict.fromkeys(k for r in rows for k, v in r.items() if k not in NOT_CURVES and type(v) in (int, float))
    return {"epochs": [r[by] for r in rows], "rows_by": by, "series": {k: _series(rows, k) for k in keys}}


def rows_by(record: Any) -> str:
    """What a run's rows of metrics.jsonl are drawn by: its epochs, or its steps when it validates every
    `eval.every_steps` steps (several rows in one epoch)."""
    config = record.get("config") if isinstance(record, Mapping) else None
    every = (config.get("eval") or {}).get("every_steps") if isinstance(config, Mapping) and isinstance(config.get("eval"), Mapping) else None
    return "step" if type(every) is int and every > 0 else "epoch"


def step_points(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in rows if type(r.get("step")) in (int, float)]
    return {"steps": [r["step"] for r in rows], "step_series": {k: _series(rows, k) for k in STEP_KEYS}}


def _series(rows: list[dict[str, Any]], key: str) -> list[Optional[float]]:
    """Each row's `key` as a finite float, None where it is missing, not a number (a bool is not) or not finite."""
    values: list[Any] = [r.get(key) for r in rows]
    return [float(v) if type(v) in (int, float) and math.isfinite(v) else None for v in values]


def curves(run_dir: Path, record: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """{"epochs": [...], "series": {train_loss: [...], val_loss, lr, and every other number}} from metrics.jsonl,
    {"steps": [...], "step_series": {loss, lr, grad_norm}} from steps.jsonl (empty when the run wrote
    none), "offsets": the bytes of each file read, where a live page's next read starts, and "charts": the charts of
    the metrics the run's task measures after every epoch (`task_charts`)."""
    epoch_rows, metrics_offset, _ = lines_from(run_dir / "metrics.jsonl")
    step_rows, steps_offset, _ = lines_from(run_dir / "steps.jsonl")
    return {**epoch_points(epoch_rows, rows_by(record)), **step_points(step_rows), "offsets": {"metrics": metrics_offset, "steps": steps_offset},
            "charts": task_charts([record] if record is not None else [])}


ENGINE_CURVES = ("val_loss",)  # the epoch keys the engine's own loss chart draws (every task's criterion on val)
ENGINE_CHARTS = ("loss", "lr", "step_loss", "step_lr", "step_grad_norm")  # the charts charts.js draws for every run


def task_charts(records: Sequence[Optional[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One chart per metric the runs' tasks measure on val after every epoch (TaskSpec epoch keys), as charts.js
    draws them: the val line and, where the run logged it, the train line of the same quantity (`train_` for `val_`);
    the compare page draws one val line per run. `bounds` keep the axis within the values the metric can take."""
    from veritrain.core.task_registry import spec_of_record

    charts: dict[str, dict[str, Any]] = {}
    for record in records:
        spec = spec_of_record(dict(record)) if record is not None else None
        for metric in spec.epoch_metrics() if spec is not None else ():
            key = str(metric.epoch_key)
            chart = metric.name if metric.name not in ENGINE_CHARTS else f"task-{metric.name}"
            if key in ENGINE_CURVES or chart in charts:
                continue
            train = f"train_{key[4:]}" if key.startswith("val_") else None
            lines = ([[train, f"train {metric.shown}"]] if train else []) + [[key, f"val {metric.shown}"]]
            charts[chart] = {"id": chart, "title": f"{metric.shown} per epoch", "x": "epoch", "run": lines,
                             "compare": key, "bounds": list(metric.bounds)}
    return list(charts.values())


def live_stamp(run_dir: Path) -> Optional[str]:
    """What changes when a run's record, notes or seal change (file sizes and times); None when it has no record."""
    stamp = registry.stamp(run_dir)
    if stamp is None:
        return None
    try:
        seal = os.stat(run_dir / "record.sha256")
        return f"{stamp}|{seal.st_mtime_ns}:{seal.st_size}"  # the amendments folder is in the registry's stamp
    except OSError:
        return f"{stamp}|-"


def run_live(workspace: Workspace, run_id: str, metrics_offset: int, steps_offset: int, stamp: str) -> dict[str, Any]:
    """What a run page polls: the epoch and step rows written after the offsets it has, and the run's state: its
    status and seal (read again only when its record's stamp differs from `stamp`), or `deleted`."""
    if not RUN_ID.fullmatch(run_id or ""):
        raise UserError(f"{run_id}: not a run id")
    run_dir = workspace.runs_dir / run_id
    now = live_stamp(run_dir)
    if now is None:
        return {"state": "deleted", "run_id": run_id}
    answer: dict[str, Any] = {"run_id": run_id, "stamp": now}
    if now != stamp:
        record = read_json(run_dir / "record.json")
        answer.update(state=record.get("status") if isinstance(record, dict) else "unreadable", seal=_seal(run_dir))
    epoch_rows, metrics_to, metrics_reset = lines_from(run_dir / "metrics.jsonl", metrics_offset)
    step_rows, steps_to, steps_reset = lines_from(run_dir / "steps.jsonl", steps_offset)
    answer.update(epochs=epoch_points(epoch_rows, rows_by(read_json(run_dir / "record.json"))), steps=step_points(step_rows), offsets={"metrics": metrics_to, "steps": steps_to},
                  reset={"metrics": metrics_reset, "steps": steps_reset})
    return answer


def _headline_key(result: Any, names: list[str]) -> Optional[str]:
    """The number a baseline's result is shown by: the first the run's task declares that it holds (display.headline_key)."""
    from veritrain.core.display import headline_key

    return headline_key(result, names)


def _csv_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    found = read_regular(path)
    if found is None:
        return [], []
    reader = csv.reader(io.StringIO(found[0].decode("utf-8", errors="replace"), newline=""))
    try:
        header = next(reader, [])
        rows = [row for _, row in zip(range(MAX_CSV_ROWS), reader)]
    except csv.Error:
        return [], []
    return header, rows


def _served(record: Any, rel: str) -> str:
    """The workspace path of the run's file `rel` (in the run folder, or in the amendment that wrote it), as /files serves it."""
    return f"runs/{record.run_id}/{record.path(rel).relative_to(record.run_dir).as_posix()}"


def _seal(run_dir: Path) -> Optional[str]:
    """The run's newest seal: its last amendment's, else record.sha256 (as written: verify says whether it holds)."""
    from veritrain.records.amendments import AMENDMENT_SEAL, AMENDMENTS_DIR

    try:
        folder = run_dir / AMENDMENTS_DIR
        newest = max((p for p in folder.iterdir() if p.name.isdigit()), default=None) if folder.is_dir() else None
        return ((newest / AMENDMENT_SEAL) if newest is not None else (run_dir / "record.sha256")).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _reference_config(workspace: Workspace, record: dict[str, Any]) -> tuple[str, Optional[dict[str, Any]]]:
    if record.get("kind") == "script":  # the user's own config: every key is shown, against nothing
        return "script's own config (no defaults)", {}
    parent = record.get("parent")
    if parent and RUN_ID.fullmatch(str(parent)):
        parent_record = read_json(workspace.runs_dir / str(parent) / "record.json")
        if isinstance(parent_record, dict) and isinstance(parent_record.get("config"), dict):
            return f"parent run {parent}", parent_record["config"]
    try:
        from veritrain.core.config import RunConfig

        return "defaults", RunConfig().model_dump(mode="json")
    except Exception:  # a default that cannot be built here (a plugin missing): no diff rather than no page
        return "defaults", None


MAX_TRAJECTORY_ROWS = 500  # entries of a trajectory shown on a run page (a long run with every_steps has thousands)
MAX_AUDITS = 50  # audit results shown on a run page, newest first


def trajectory(run_dir: Path, record: dict[str, Any], audited: Optional[list[dict[str, Any]]] = None) -> Optional[dict[str, Any]]:
    """The run's trajectory as table rows: step, epoch, short state hash, whether its step file is here, kept
    for audit or left out (an archive made without --with-audit), whether the segment ending at it can be
    replayed from what is on disk (as `veritrain audit` decides), and the newest verdict of the `audited`
    results (`audits`, newest first) on it. None for runs without a trajectory."""
    from veritrain.train.trajectory import kept_checkpoints, start_points  # no torch at import

    entries = record.get("trajectory") or []
    if not entries:
        return None
    available = {e["step"] for e in entries if (run_dir / "checkpoints" / f"step-{e['step']}.pt").is_file()}
    starts = set(start_points(entries, kept_checkpoints(run_dir, record)))
    # every segment with an earlier state to start from (as `veritrain audit` replays it), and that start's step
    replayed_from = {i: entries[max(k for k in starts if k <= i - 1)]["step"] for i in range(1, len(entries)) if any(k <= i - 1 for k in starts)}
    auditable = set(replayed_from)
    verdicts: dict[str, str] = {}
    for result in reversed(audited or []):  # oldest first: a newer audit's verdict replaces an older one
        verdicts.update({s["segment"]: s["verdict"] for s in result["segments"]})
    rows = []
    for index, e in enumerate(entries):
        here = index > 0 and e["step"] in available
        if index == 0:
            checkpoint = "initial state"
        elif e.get("kept_for_audit"):
            checkpoint = "kept for audit" if here else "kept for audit, not here"
        else:
            checkpoint = "kept" if here else "not kept"
        rows.append({"index": index, "step": e["step"], "epoch": e["epoch"], "state_sha256": e["state_sha256"],
                     "checkpoint": checkpoint, "here": here, "kept_for_audit": bool(e.get("kept_for_audit")),
                     "auditable": index in auditable, "replayed_from": replayed_from.get(index),
                     "audit": verdicts.get(str(index)) if index > 0 else None})
    return {"segments": len(entries) - 1, "auditable": len(auditable), "kept_for_audit": sum(r["kept_for_audit"] for r in rows),
            "entries": first_rows(rows, MAX_TRAJECTORY_ROWS)}


def audits(workspace: Workspace, run_id: str) -> list[dict[str, Any]]:
    """The results `veritrain audit` kept for this run (.veritrain/audits/<run_id>/*.json), newest first. They are
    the auditor's, outside the run's seal: each row names the command that repeats it."""
    folder = workspace.state_dir / "audits" / run_id
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        result = read_json(path) if path.is_file() and not path.is_symlink() else None
        if not isinstance(result, dict) or result.get("run_id") != run_id:
            continue
        segments = [s for s in result.get("segments") or [] if isinstance(s, dict)] if isinstance(result.get("segments"), list) else []
        found.append({
            "audited_at": shown_text(result.get("audited_at")), "seed": shown_text(result.get("seed")), "verdict": shown_text(result.get("verdict")),
            "segments_audited": result.get("segments_audited") if isinstance(result.get("segments_audited"), int) else None,
            "segments_auditable": result.get("segments_auditable") if isinstance(result.get("segments_auditable"), int) else None,
            "segments_total": result.get("segments_total") if isinstance(result.get("segments_total"), int) else None,
            "cost_fraction": finite_number(result.get("cost_fraction")), "command": shown_text(result.get("command")),
            "segments": [{"segment": shown_text(s.get("segment")), "from_step": shown_text(s.get("from_step")), "to_step": shown_text(s.get("to_step")),
                          "verdict": shown_text(s.get("verdict")), "detail": shown_text(s.get("detail"))} for s in segments],
            "differs": [shown_text(s.get("segment")) for s in segments if s.get("verdict") != "identical"],
            "file": path.name})
    found.sort(key=lambda a: (a["audited_at"], a["file"]), reverse=True)
    return found[:MAX_AUDITS]


def verdict_shown(run_dir: Path, state_dir: Path, verified: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The verify verdict a page shows: `verified` when the caller has just computed it (publish), else the one
    kept in the user's state folder (stale when the seal or a file it covered has changed since); never one
    computed for the page. {"state": "none" | "ok" | "failed" | "stale", "verdict": the verdict or None}."""
    from veritrain.records import verdicts

    verdict = {**verified, "stale": False, "stale_reasons": []} if verified is not None else verdicts.latest(run_dir, state_dir)
    if verdict is None:
        return {"state": "none", "verdict": None}
    shown = {k: verdict.get(k) for k in ("ok", "verified_at", "seal", "problems", "drift", "expect", "strict", "stale", "stale_reasons", "amendments")}
    shown["lines"] = trust_lines(verdict)
    return {"state": "stale" if verdict["stale"] else "ok" if verdict["ok"] else "failed", "verdict": shown}


def trust_lines(verdict: dict[str, Any]) -> list[str]:
    """The record format and the signer a verdict found, as `veritrain verify` prints them (kept verdicts of earlier
    versions have neither)."""
    from veritrain.trust.formats import line
    from veritrain.trust.provenance_check import Signer

    lines = []
    if isinstance(verdict.get("format"), dict):
        try:
            lines.append(line(verdict["format"]))
        except (KeyError, TypeError):
            pass
    if isinstance(verdict.get("signer"), dict):
        try:
            lines.append(Signer(**verdict["signer"]).line())
        except TypeError:
            pass
    return lines


def run_page(workspace: Workspace, run_id: str, with_check: bool = True, verified: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Everything the run page shows, from the run folder alone. `verified`: the verify result the caller
    computed for this page (publish); without it the page shows the verdict kept in the workspace, if any."""
    from veritrain.records.experiments import config_changes, flatten
    from veritrain.records.record import read_record
    from veritrain.trust.check import amendment_rows, signed_by

    run_dir = run_dir_of(workspace, run_id)
    record = read_record(run_dir)
    notes = registry.read_notes(run_dir)
    reference, ref_config = _reference_config(workspace, record)
    changed = config_changes(ref_config, record.get("config")) if ref_config is not None else {}
    evals = []
    splits = {rel.split("/")[1]: rel for rel in sorted(record.get("artifacts") or {}) if rel.startswith("eval/") and rel.count("/") == 2}
    for split, first in sorted(splits.items()):
        split_dir = record.path(first).parent  # in the run, or in the amendment that wrote it
        if split_dir.is_dir() and not split_dir.is_symlink():
            images = {name.removesuffix(".png"): _served(record, f"eval/{split}/{name}")
                      for name in EVAL_IMAGES if (split_dir / name).is_file() and not (split_dir / name).is_symlink()}
            header, rows = _csv_rows(split_dir / "per_class.csv")
            evals.append({"split": split, "images": images, "per_class_header": header, "per_class": rows,
                          "metrics": (record.get("metrics") or {}).get(split) or {},
                          # a language model's: the samples from the fixed prompts and the documents it scores worst
                          "generations": [{**g, "prompt": visible_text(g.get("prompt")), "text": visible_text(g.get("text"))}
                                          for g in listed_rows(read_json(split_dir / "generations.json"), "samples")],
                          "bad_documents": [{**d, "excerpt": visible_text(d.get("excerpt"))} for d in listed_rows(read_json(split_dir / "bad_cases.json"))]})
    from veritrain.records.experiments import shown_metrics

    names = shown_metrics(record)
    baselines = [{"name": name, "metric": _headline_key(result, names), "value": (result or {}).get(_headline_key(result, names) or "")}
                 for name, result in ((record.get("baselines") or {}).get("results") or {}).items()]
    export = record.get("export") or {}
    parity = export.get("parity") or None
    env = {k: v for k, v in flatten(record.get("env") if isinstance(record.get("env"), dict) else {}).items()}
    artifacts = [{"path": path, "size": (info or {}).get("size"), "sha256": (info or {}).get("sha256")}
                 for path, info in sorted((record.get("artifacts") or {}).items())]
    audited = audits(workspace, record["run_id"])
    interrupted = interrupted_amend(run_dir, workspace.state_dir)
    verdict = verdict_shown(run_dir, workspace.state_dir, verified)
    if verified is None and record.get("status") != "running":
        # what a look at the folder finds (a seal, a size, a file missing or added, a pending amend) is a problem verify
        # reports too: the page says the run does not verify rather than show a verdict kept before the damage
        from veritrain.trust.verify import quick_problems

        found = quick_problems(run_dir) + ([{"path": f".veritrain/journal/{run_dir.name}", "kind": "amend_pending", "detail": interrupted}]
                                           if interrupted else [])
        if found:
            verdict = {"state": "failed", "quick": True, "verdict": {
                "ok": False, "verified_at": None, "seal": _seal(run_dir), "problems": found, "drift": [], "expect": None,
                "strict": False, "stale": False, "stale_reasons": []}}
    check = None
    if with_check:
        from veritrain.trust.check import check_run

        if verdict.get("quick"):
            check = check_run(run_dir, workspace.state_dir, verdict["verdict"])
        elif verdict["state"] in ("ok", "failed"):  # a fresh verdict: the checklist shows it, computes none
            check = check_run(run_dir, workspace.state_dir, verdict["verdict"])
        else:
            why = ("stale: " + "; ".join(verdict["verdict"]["stale_reasons"]) if verdict["state"] == "stale"
                   else "not verified yet") + f" (Verify, or `veritrain verify {record['run_id']}`)"
            check = check_run(run_dir, workspace.state_dir, unverified=why)
    return {
        "run_id": record["run_id"], "record": record, "status": record.get("status"), "kind": record.get("kind"),
        "exp_name": record.get("exp_name"), "hypothesis": record.get("hypothesis"),
        "started_at": record.get("started_at"), "ended_at": record.get("ended_at"),
        "stamp": live_stamp(run_dir), "error": record.get("error"), "seal": _seal(run_dir), "seal_history": record.get("seal_history") or [],
        "base_seal": record.chain.base_seal if record.chain is not None else None,
        "amendments": [{**row, "signed": signed_by(row["signer"])} for row in amendment_rows(record, verdict.get("verdict") if verdict.get("state") in ("ok", "failed") else None)],
        "notes": [n for n in notes if not n.get("conclusion")], "conclusions": [n for n in notes if n.get("conclusion")],
        "reference": reference, "config_changed": [{"key": k, "reference": a, "value": b} for k, (a, b) in changed.items()],
        "config_hash": record.get("config_hash"), "data": record.get("data") or {},
        "metrics": {split: {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                    for split, m in (record.get("metrics") or {}).items() if isinstance(m, dict)},
        "training": record.get("training") or {}, "curves": curves(run_dir, record), "evals": evals, "baselines": baselines,
        "export_files": sorted(export.get("files") or {}), "parity": parity, "events": record.get("events") or [],
        "env": env, "code": record.get("code") or {}, "artifacts": artifacts, "check": check,
        "trajectory": trajectory(run_dir, record, audited), "audits": audited, "verdict": verdict,
        "outside": record.get("kind") in OUTSIDE_KINDS, "parent": record.get("parent"),
        "interrupted_amend": interrupted,
        "headline": headline(record), "duration": _duration(record.get("started_at"), record.get("ended_at")),
        "metric_texts": {split: {k: v for k, v in m.items() if isinstance(v, str)}
                         for split, m in (record.get("metrics") or {}).items() if isinstance(m, dict)},
        "live": record.get("status") == "running",
        # a script's run (veritrain.start): what it can prove, the script and how it was started, its inputs
        "guarantee": record.get("guarantee"), "script": record.get("script") if record.get("kind") == "script" else None,
        "inputs": record.get("inputs"),
    }


def headline(record: dict[str, Any]) -> dict[str, Any]:
    """The overview's metrics: for each split evaluated, the first metrics the run's task declares that it has, each
    beside every baseline's value of the same metric (baselines are scored on the test split)."""
    from veritrain.core.task_registry import spec_of_record
    from veritrain.records.experiments import SHOWN

    spec = spec_of_record(record)
    metrics = record.get("metrics") or {}
    results = ((record.get("baselines") or {}).get("results") or {}) if isinstance(record.get("baselines"), dict) else {}
    names = [n for n, r in results.items() if isinstance(r, dict)]
    rows = []
    for split, values in metrics.items():
        if not isinstance(values, dict):
            continue
        for declared in spec.metrics[:SHOWN] if spec is not None else ():  # the first metrics the run's task declares
            value = finite_number(declared.value(values))
            if value is None:
                continue
            base = [finite_number(declared.value(results[n])) if split == "test" else None for n in names]
            rows.append({"split": split, "key": declared.name, "value": value, "baselines": base})
    return {"rows": rows, "baselines": names}


def _duration(started: Any, ended: Any) -> Optional[float]:
    """Seconds from started_at to ended_at (ISO times), None when either is missing."""
    from datetime import datetime

    try:
        return round((datetime.fromisoformat(str(ended)) - datetime.fromisoformat(str(started))).total_seconds(), 1) if started and ended else None
    except ValueError:
        return None


def damaged_page(workspace: Workspace, run_id: str, problem: str) -> dict[str, Any]:
    """A run whose record cannot be read: its id, the problem and what a look at the folder finds."""
    from veritrain.trust.verify import quick_problems

    run_dir = run_dir_of(workspace, run_id)
    files = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink())
    return {"run_id": run_id, "problem": problem, "problems": quick_problems(run_dir), "files": files[:500], "seal": _seal(run_dir)}


def interrupted_amend(run_dir: Path, state_dir: Path) -> Optional[str]:
    """The problem `veritrain verify` reports while an amend of the run is pending (its journal is in the workspace), or None."""
    from veritrain.trust.verify import pending_amend

    return pending_amend(run_dir, state_dir)
