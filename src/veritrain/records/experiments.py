"""`experiments.md` in the workspace: the experiment log, regenerated from the registry after every
run and every note — one entry per run, failed and interrupted ones included with their reason.

Each entry shows the hypothesis stated before the run, the data version, the config keys that differ
from its reference run (`--parent RUN`, else the previous run of the same exp_name), so "one change
at a time" is visible, the metrics (with the seed spread of a `--repeat` group), notes and conclusion.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from veritrain.core.task_registry import spec_of_record
from veritrain.records import registry
from veritrain.records.registry import flatten  # noqa: F401  (a name of this module too: `experiments.flatten`)

SHOWN = 3  # the metrics a line about a run names: the first its task declares (veritrain.core.task_spec)


def shown_metrics(row: Mapping[str, Any]) -> list[str]:
    """The names of the metrics a line about this run (a record or an index row) shows: the first SHOWN its task
    declares; none when this process knows no declaration of its task."""

    spec = spec_of_record(dict(row))
    return spec.names(SHOWN) if spec is not None else []


def config_diff(reference: Optional[dict[str, Any]], config: Optional[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    a, b = flatten(reference), flatten(config)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def config_changes(reference: Optional[dict[str, Any]], config: Optional[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """The keys two run configs differ in, each read whole (veritrain.core.config.completed): a key added later, or a key
    of the flat model section an earlier veritrain recorded for every task, is no change where it holds its default."""
    from veritrain.core.config import completed

    return config_diff(completed(reference) if isinstance(reference, dict) else reference, completed(config) if isinstance(config, dict) else config)




def compare(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Runs side by side against the first: the config keys that differ (registry.differing_params: the runs table's
    rule, every run's value, a setting a run does not use left out), every numeric metric
    with its delta from the first run (`headline` and its `goal` for the ones the runs' task declares: what `runs
    compare` prints and the page colours), the data versions, and the
    environment keys that differ from the first run's. The one comparison behind `veritrain runs compare` and the
    web compare page."""
    base = records[0]
    config_rows = registry.differing_params([r.get("config") for r in records])
    flat_metrics = [{k: v for k, v in flatten(r.get("metrics")).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                    for r in records]
    goals = _declared_goals(records)
    metric_rows = []
    for k in sorted(set().union(*flat_metrics)):
        first = flat_metrics[0].get(k)
        goal = goals.get(k.split(".")[-1]) if "per_class" not in k.split(".") else None
        metric_rows.append({"key": k, "headline": goal is not None, "goal": goal,
                            "values": [{"value": m.get(k), "delta": (m[k] - first) if k in m and first is not None else None}
                                       for m in flat_metrics]})
    env_rows = [{"run_id": other["run_id"], "key": k, "base": a, "this": b}
                for other in records[1:] for k, (a, b) in config_diff(base.get("env"), other.get("env")).items()]
    return {"run_ids": [r["run_id"] for r in records], "config": config_rows, "metrics": metric_rows, "env": env_rows,
            "data_versions": [(r.get("data") or {}).get("version") for r in records]}


def _declared_goals(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Metric name → max or min, as the runs' tasks declare it (veritrain.core.task_spec); a name the tasks of these
    runs declare with different goals, or that no task known here declares, has none."""

    found: dict[str, set[str]] = {}
    for record in records:
        spec = spec_of_record(dict(record))
        for metric in spec.metrics if spec is not None else ():
            found.setdefault(metric.name, set()).add(metric.goal)
    return {name: next(iter(goals)) for name, goals in found.items() if len(goals) == 1}


def comparison_by_run(comparison: dict[str, Any]) -> dict[str, Any]:
    """`compare`'s result keyed by run (what `runs compare --json` prints): for each run after the first its config and
    environment differences ({key: {base, this}}), for each run its metrics ({key: {value, delta}}) and data version."""
    run_ids = comparison["run_ids"]
    by_run: dict[str, Any] = {"runs": run_ids, "config": {}, "metrics": {}, "data_version": {}, "env": {}}
    for index, run_id in enumerate(run_ids):
        by_run["data_version"][run_id] = comparison["data_versions"][index]
        by_run["metrics"][run_id] = {row["key"]: row["values"][index] for row in comparison["metrics"] if row["values"][index]["value"] is not None}
        if index:
            by_run["config"][run_id] = {row["key"]: {"base": row["values"][0], "this": row["values"][index]}
                                        for row in comparison["config"] if row["values"][index] != row["values"][0]}
            by_run["env"][run_id] = {row["key"]: {"base": row["base"], "this": row["this"]} for row in comparison["env"] if row["run_id"] == run_id}
    return by_run


def reference_of(row: dict[str, Any], by_id: dict[str, dict[str, Any]], ordered: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The run an entry is compared with: its `--parent`, the run it reproduces, else the previous run of
    its exp_name (by start time, so a resumed run keeps the reference it started with)."""
    for named in ("parent", "reproduced_from"):
        if row.get(named) and row[named] in by_id:
            return by_id[row[named]]
    # `or ""`: an index built before records were checked for nulls may still hold a row without a start time
    earlier = [r for r in ordered if r["exp_name"] == row["exp_name"] and (r["started_at"] or "") < (row["started_at"] or "")]
    return earlier[-1] if earlier else None


def _short(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def write(state_dir: Path, runs_dir: Path, out: Path) -> Path:
    rows = registry.query(state_dir, runs_dir)
    ordered = sorted(rows, key=lambda r: r["started_at"] or "")
    by_id = {r["run_id"]: r for r in rows}
    spreads = _repeat_spreads(state_dir)
    lines = ["# Experiments", "",
             "Generated by veritrain from the run records in `runs/` after every run and note; do not edit by hand",
             "(add notes with `veritrain runs note RUN \"text\" [--conclusion]`).", ""]
    lines.extend(sweep_sections(state_dir))
    lines.extend(search_sections(state_dir))
    for row in reversed(ordered):  # newest first
        lines.append(f"## {row['run_id']} — {row['exp_name']} ({row['status']})")
        lines.append("")
        lines.append(f"- date: {row['started_at']}; kind: {row['kind']}; seed: {row['seed']}")
        if row["status"] in ("failed", "interrupted") and row["error"]:
            lines.append(f"- **{row['status']}:** {row['error']}")
        if row["status"] == "pruned":
            lines.append("- **pruned** by its search after a validation (not evaluated): see its record's `pruned`")
        lines.append(f"- hypothesis: {row['hypothesis'] or '_none stated_'}")
        lines.append(f"- data version: `{(row['data_version'] or '-')[:12]}`")
        reference = reference_of(row, by_id, ordered)
        if reference is None:
            lines.append("- changes: _first run of this experiment_")
        else:
            diff = config_changes(reference["config"], row["config"])
            shown = ", ".join(f"`{k}` {_short(a)} → {_short(b)}" for k, (a, b) in diff.items()) or "_none (same config)_"
            lines.append(f"- changes vs {reference['run_id']}: {shown}" + (" (**more than one change**)" if len(diff) > 1 else ""))
            if row.get("reproduced_from") == reference["run_id"]:
                same = row["final_state_sha256"] and row["final_state_sha256"] == reference["final_state_sha256"]
                lines.append(f"- reproduces {reference['run_id']}: final weights {'identical' if same else 'differ'}"
                             f" (`veritrain runs compare {reference['run_id']} {row['run_id']}`)")
        names = shown_metrics(row)
        for split, metrics in (row["metrics"] or {}).items():
            shown = ", ".join(f"{k} {metrics[k]:.4f}" for k in names if isinstance(metrics.get(k), (int, float)))
            if shown:
                spread_split, spread = spreads.get(row.get("repeat_group") or "", (None, None))
                spread = spread if spread_split in (None, split) else None  # a group's spread is of one split
                extra = ""
                if spread and names[0] in spread:  # the task's headline metric
                    s = spread[names[0]]
                    extra = (f" — group of {s['n']} seeds: {names[0]} {s['mean']:.4f} ± {s['std']:.4f} "
                             f"(95% [{s['ci95'][0]:.4f}, {s['ci95'][1]:.4f}])")
                else:
                    extra = " (single seed)"
                lines.append(f"- {split}: {shown}{extra}")
        for note in row["notes"] or []:
            label = "conclusion" if note.get("conclusion") else "note"
            lines.append(f"- {label} ({note.get('at', '')[:19]}): {note['text']}")
        lines.append("")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # runs finishing at once each write their own
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(out)
    return out


def _repeat_spreads(state_dir: Path) -> dict[str, tuple[Optional[str], dict[str, Any]]]:
    """Repeat group → (the split its spread is of, the spread)."""
    spreads = {}
    folder = state_dir / "repeats"
    if folder.exists():
        for path in folder.glob("*.json"):
            try:
                data = json.loads(path.read_text())
                spreads[data["group"]] = (data.get("split"), data["summary"])
            except (OSError, json.JSONDecodeError, KeyError):
                continue
    for summary in sweep_summaries(state_dir):  # the seeds of a sweep's trial (--repeat) are a group too
        for group in (summary.get("parent") or {}, *(summary.get("trials") or [])):
            if isinstance(group, dict) and group.get("group") and group.get("spread"):
                spreads[group["group"]] = (summary.get("split"), group["spread"])
    return spreads


def sweep_summaries(state_dir: Path) -> list[dict[str, Any]]:
    """`.veritrain/sweeps/<id>/summary.json`, newest sweep first; one that cannot be read is left out."""
    summaries = []
    for path in sorted((state_dir / "sweeps").glob("*/summary.json"), reverse=True):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict) and isinstance(summary.get("trials"), list) and isinstance(summary.get("parent"), dict):
            summaries.append(summary)
    return summaries


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def sweep_sections(state_dir: Path) -> list[str]:
    """One section per `veritrain sweep`, newest first: each trial's change, runs, status and headline metric with
    its delta against the parent run, the best trial marked, failed ones with their reason."""
    lines: list[str] = []
    for s in sweep_summaries(state_dir):
        try:
            lines.extend(_sweep_section(s))
        except (KeyError, TypeError, ValueError):  # a summary of another shape: the runs are still listed below
            continue
    return lines


def search_summaries(state_dir: Path) -> list[dict[str, Any]]:
    """`.veritrain/searches/<id>/summary.json`, newest search first; one that cannot be read is left out."""
    summaries = []
    for path in sorted((state_dir / "searches").glob("*/summary.json"), reverse=True):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict) and isinstance(summary.get("trials"), list) and isinstance(summary.get("selection"), dict):
            summaries.append(summary)
    return summaries


def search_sections(state_dir: Path) -> list[str]:
    """One section per `veritrain search`, newest first: each trial's change, run, state and val metric, the best
    (chosen on val) with its test result labelled, pruned trials with the validation (epoch or step) they were stopped after."""
    lines: list[str] = []
    for s in search_summaries(state_dir):
        try:
            lines.extend(_search_section(s))
        except (KeyError, TypeError, ValueError, AttributeError):  # a summary of another shape: the runs are still listed below
            continue
    return lines


def _search_section(s: dict[str, Any]) -> list[str]:
    selection, best, counts = s["selection"], s.get("best") or {}, s["counts"]
    metric = f"{selection['split']} {selection['metric']}"
    lines = [f"## Search {s['id']} — {s['exp_name']} ({s['status']})", "",
             f"- {s['sampler']['name']} sampler (seed {s['sampler']['seed']}), {s['pruner']['name']} pruner, over "
             f"{', '.join('`' + p['key'] + '`' for p in s['space']['params'])}; base config {s['config']['path'] or '<default>'} "
             f"(`{s['config']['hash'][:12]}`); {counts['trials']} of {counts['planned']} trials: {counts['completed']} completed, "
             f"{counts['pruned']} pruned, {counts['failed']} failed"]
    if best:
        report = best.get("test") or {}
        tested = (f"; test {selection['metric']} {report['metrics'][selection['metric']]:.4f} ({report.get('label')})"
                  if selection["metric"] in (report.get("metrics") or {}) else "")
        change = ", ".join(f"`{k}`={_short(v)}" for k, v in best["change"].items())
        lines.append(f"- best: trial {best['number']} ({change}), chosen on {metric}: {best['value']:.4f}{tested}")
    lines += ["", f"| trial | change | run | state | {metric} |", "|---|---|---|---|---|"]
    for t in s["trials"]:
        marker = " **best**" if best.get("number") == t["number"] else ""
        change = ", ".join(f"`{k}`={_short(v)}" for k, v in t["change"].items())
        unit = "step" if s.get("judged_at") == "step" else "epoch"
        state = t["state"] + (f" after {unit} {t['pruned'].get(unit)}" if t["state"] == "pruned" and t.get("pruned") else "")
        state += f": {t['error'][:160]}" if t["state"] == "failed" and t.get("error") else ""
        value = f"{t['value']:.4f}" if isinstance(t.get("value"), (int, float)) else "-"
        lines.append(f"| {t['number']}{marker} | {_cell(change)} | {_cell(t.get('run_id') or '-')} | {_cell(state)} | {value} |")
    lines.append("")
    return lines


def _sweep_section(s: dict[str, Any]) -> list[str]:
    metric = (s.get("headline") or {}).get("metric")
    parent, best = s["parent"], (s.get("best") or {})
    config = s["config"]
    seeds = f"{s['repeat']} seeds per run (mean shown)" if s["repeat"] > 1 else "one seed per run"
    lines = [f"## Sweep {s['id']} — {s['exp_name']} ({s['status']})", "",
             f"- {s['mode']} over {', '.join(f'`{key}`' for key in s['varied'])}; base config {config['path'] or '<default>'} "
             f"(`{config['hash'][:12]}`); train.threads {s['threads']}; {seeds}",
             f"- parent: {', '.join(parent['run_ids']) or '-'} ({parent['status']})"
             + (f", {s['split']} {metric} {parent['metrics'][metric]:.4f}" if metric in parent["metrics"] else "")]
    if best:
        delta = f" ({best['delta']:+.4f} vs parent)" if best.get("delta") is not None else ""
        change = ", ".join(f"`{k}`={_short(v)}" for k, v in best["change"].items())
        report = best.get("test") or {}
        tested = (f"; test {metric} {report['metrics'][metric]:.4f} ({report.get('label', 'not used for selection')})"
                  if metric in (report.get("metrics") or {}) else "")
        lines.append(f"- best: trial {best['trial']} ({change}), chosen on {s['split']} {metric}: {best['value']:.4f}{delta}{tested}")
    lines += ["", f"| trial | change | runs | status | {s['split']} {metric or 'metric'} | Δ vs parent |", "|---|---|---|---|---|---|"]
    for t in s["trials"]:
        marker = " **best**" if best.get("trial") == t["index"] else ""
        change = ", ".join(f"`{k}`={_short(v)}" for k, v in t["change"].items())
        status = t["status"] + (f": {t['error'][:160]}" if t["status"] != "completed" and t.get("error") else "")
        value = f"{t['metrics'][metric]:.4f}" if metric in t["metrics"] else "-"
        delta = f"{t['deltas'][metric]:+.4f}" if metric in t.get("deltas", {}) else "-"
        lines.append(f"| {t['index']}{marker} | {_cell(change)} | {_cell(', '.join(t['run_ids']) or '-')} | {_cell(status)} | {value} | {delta} |")
    lines.append("")
    return lines
