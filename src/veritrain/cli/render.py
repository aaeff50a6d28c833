"""What the `veritrain` commands print: the one JSON document of `--json`, the error line (and its JSON document),
and the reports for people (tables, summaries, verdicts). Tables and reports go through `logs` (stdout, or stderr
under `--json`); plain result lines through `click.echo`. Each function imports what it draws with (rich's tables,
the library's formatters) when it runs, so that importing the CLI stays fast."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from veritrain.core import logs
from veritrain.core.display import headline
from veritrain.core.task_registry import serving_command

if TYPE_CHECKING:
    from pathlib import Path

    from veritrain.core.config import ResolvedConfig
    from veritrain.data.identity import DataVersion
    from veritrain.orchestration.housekeeping import StagePlan
    from veritrain.orchestration.pipeline import Amended, RunOutcome
    from veritrain.orchestration.trials.sweep_plan import SweepPlan

JSON_WRITTEN = {"done": False}  # whether this command printed its JSON document (a failure after it adds none)



def emit_json(payload: dict[str, Any]) -> None:
    """The command's one JSON document on stdout. NaN and ±Infinity, which JSON has no words for, are null, and the
    document's `nonfinite` lists their paths (e.g. `results[0].top[0].prob`)."""
    from veritrain.core.display import finite_json

    payload, nonfinite = finite_json(payload)
    if nonfinite and isinstance(payload, dict):
        payload = {**payload, "nonfinite": nonfinite}
    text = json.dumps(payload, indent=2, sort_keys=False, allow_nan=False)
    JSON_WRITTEN["done"] = True
    click.echo(text)


def error(message: str, code: int, as_json: bool = False) -> NoReturn:
    """The one error line on stderr; with --json, also `{"error": {"message", "exit_code"}}` on stdout, unless the
    command already printed its JSON document (a failed check prints its result, then fails). Exits with `code`."""
    from veritrain.core.secrets import redact_text

    shown = redact_text(message)  # a message may quote a value given on the command line
    if as_json and not JSON_WRITTEN["done"]:
        click.echo(json.dumps({"error": {"message": shown, "exit_code": code}}, indent=2))
    sys.stdout.flush()
    print(f"error: {shown}", file=sys.stderr)
    sys.exit(code)


# ---------------------------------------------------------------- run, train, sweep


def stage_plan(stages: list[StagePlan]) -> None:
    """`run --dry-run`: each stage with run/reuse and the reason."""
    for s in stages:
        click.echo(f"{s.stage:<9} {s.action:<6} {s.reason}")


def run_outcome(outcome: RunOutcome) -> None:
    """A finished run: its summary, then what to do with it, or how to resume it when it was interrupted."""
    run_summary(outcome)
    if outcome.error is None:
        next_steps(outcome)
    if outcome.error is not None:
        if outcome.record["status"] == "interrupted":
            run_id = outcome.summary["run_id"]
            logs.console.print(f"run {run_id} interrupted and saved; resume with: veritrain train --resume {run_id}", markup=False, soft_wrap=True)


def run_summary(outcome: RunOutcome) -> None:
    from rich.table import Table

    summary, record = outcome.summary, outcome.record
    table = Table(title=f"run {summary['run_id']}", show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("status", summary["status"])
    table.add_row("experiment", str(record.get("exp_name")))
    seeds = "single seed" if not record.get("repeat") else f"seed {record['seed']}, {record['repeat']['index'] + 1} of {record['repeat']['of']}"
    for split, metrics in summary["metrics"].items():
        for name in _shown_metrics(record, metrics):
            if isinstance(metrics.get(name), float):
                table.add_row(f"{split} {name}", f"{metrics[name]:.4f} ({seeds})")
    for name, result in ((record.get("baselines") or {}).get("results") or {}).items():
        table.add_row(f"baseline {name}", headline(result, _shown_metrics(record, {})))
    if (record.get("baselines") or {}).get("warning"):
        table.add_row("warning", record["baselines"]["warning"], style="yellow")
    parity = (record.get("export") or {}).get("parity")
    if parity:
        table.add_row("export parity", ("passed" if parity["passed"] else "FAILED: " + str(parity["reason"]))
                      + f" ({', '.join(parity['formats'])} on {parity['samples']} samples)")
    training = record.get("training") or {}
    if training.get("best_metric"):
        best = training["best_metric"]
        table.add_row("best", f"{best_validation(record)} ({best['name']} {best['value']:.4f})")
    if record.get("guarantee"):
        table.add_row("guarantee", guarantee_text(record))
    table.add_row("data version", summary["data_version"] or "-")
    table.add_row("final state", summary["final_state_sha256"] or "-")
    table.add_row("duration", f"{outcome.seconds:.1f}s")
    table.add_row("run dir", summary["run_dir"])
    table.add_row("record", f"{summary['run_dir']}/record.json")
    table.add_row("seal", outcome.seal)
    logs.print_table(table)


# what each command that uses an export (a TaskSpec's serves_with) does with a run's, as a next step
SERVING = {"predict": ("veritrain predict {run} IMAGE.png --top 3", "classify your own image files with the exported model"),
           "generate": ("veritrain generate {run} \"PROMPT\" --tokens 64", "continue a text with the exported model")}


def next_steps(outcome: RunOutcome) -> None:
    """What to do with a finished run, with its real id: check it, see what is missing, use and compare it."""
    run_id, record = outcome.summary["run_id"], outcome.record
    steps = [(f"veritrain verify {run_id} --expect {outcome.seal}", "re-hash every file against this seal (publish the seal with the result)"),
             (f"veritrain check {run_id}", "the completion checklist, with the fix for each missing row")]
    serves = serving_command(record.get("task"))
    if (record.get("export") or {}).get("files", {}).get("onnx") and serves in SERVING:
        command, what = SERVING[serves]
        steps.append((command.format(run=run_id), what))
    elif "train" in (record.get("stages") or ()):
        steps.append((f"veritrain eval {run_id}", "evaluate it on the fixed test split"))
    steps.append((f"veritrain runs compare {run_id} OTHER_RUN", "config, metrics and environment against another run (`veritrain runs list`)"))
    logs.report("next steps:")
    for command, why in steps:
        logs.report(f"  {command}")
        logs.report(f"      {why}", style="dim")


def repeat_summary(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{len(result['runs'])} seeds (group {result['group']}): {result['split']} split, a final report; no seed is selected",
                  title_justify="left")
    for column in ("metric", "mean ± std", "95% interval", "seeds"):
        table.add_column(column)
    for name, s in result["summary"].items():
        table.add_row(name, f"{s['mean']:.4f} ± {s['std']:.4f}", f"[{s['ci95'][0]:.4f}, {s['ci95'][1]:.4f}]", str(s["n"]))
    for name, s in result.get("baselines", {}).items():
        table.add_row(f"baseline {name}", headline(s, list(result["summary"])), "-", "-")
    if result.get("warning"):
        table.add_row("warning", result["warning"], "", "", style="yellow")
    logs.print_table(table)
    for run in result["runs"]:
        logs.report(f"  {run['run_id']}  seed {run['seed']}  {run['status']}")


def sweep_plan(plan: SweepPlan) -> None:
    from rich.table import Table

    from veritrain.orchestration.trials.planning import change_text

    table = Table(title=f"sweep plan: {len(plan.trials)} trial(s), {plan.mode}, threads {plan.base.threads}, {plan.repeat} seed(s) each", title_justify="left")
    for column in ("trial", "change", "config hash", "hypothesis"):
        table.add_column(column)
    for trial in plan.trials:
        table.add_row(str(trial.index), change_text(trial.change), trial.config_hashes[0][:12], trial.hypothesis)
    logs.print_table(table)
    for note in plan.skipped:
        logs.report(f"left out {note}")


def _shown_metrics(record: dict[str, Any], metrics: dict[str, Any]) -> list[str]:
    """The metrics of a split a summary shows: those the run's task declares (veritrain.core.task_spec), in its order;
    every number of the split when this process knows no declaration of the task."""
    from veritrain.core.task_registry import spec_of_record

    spec = spec_of_record(record)
    if spec is not None:
        return [m.name for m in spec.metrics]
    return [k for k, v in metrics.items() if isinstance(v, float)]


def sweep_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    from veritrain.orchestration.trials.planning import change_text

    headline = (summary.get("headline") or {}).get("metric")
    split = summary["split"]  # the trials' metrics: the split the best trial is chosen on
    present = [n for g in (summary["parent"], *summary["trials"]) for n in g["metrics"]]  # in the order the task declares them
    names = [n for n in dict.fromkeys([headline, *present]) if n and n in present][:3]
    best = (summary.get("best") or {}).get("trial")

    def cells(group: dict[str, Any], with_delta: bool) -> list[str]:
        shown = []
        for name in names:
            if name not in group["metrics"]:
                shown.append("-")
                continue
            spread = (group.get("spread") or {}).get(name)
            text = f"{group['metrics'][name]:.4f}" + (f" ± {spread['std']:.4f}" if spread and spread["n"] > 1 else "")
            if with_delta and name in group.get("deltas", {}):
                text += f" ({group['deltas'][name]:+.4f})"
            shown.append(text)
        return shown

    def runs(group: dict[str, Any]) -> str:
        ids = group["run_ids"]
        return "-" if not ids else ids[0] + (f" +{len(ids) - 1}" if len(ids) > 1 else "")

    table = Table(title=f"sweep {summary['id']} ({summary['mode']}, threads {summary['threads']}, {summary['repeat']} seed(s); Δ vs parent)",
                  title_justify="left")
    for column in ("trial", "change", "run", "status", *(f"{split} {name}" for name in names)):
        table.add_column(column)
    parent = summary["parent"]
    table.add_row("parent", "-", runs(parent), parent["status"], *cells(parent, False))
    for trial in summary["trials"]:
        status = trial["status"] + (f": {trial['error']}" if trial["status"] != "completed" and trial.get("error") else "")
        table.add_row(f"{trial['index']}" + (" best" if trial["index"] == best else ""), change_text(trial["change"]), runs(trial),
                      status, *cells(trial, True), style="bold" if trial["index"] == best else None)
    logs.print_table(table)
    for who, group in (("parent", parent), *((f"trial {t['index']}", t) for t in summary["trials"])):
        if group.get("note"):
            logs.report(f"{who}: {group['note']}")
    if summary.get("best"):
        b = summary["best"]
        delta = f" ({b['delta']:+.4f} vs parent)" if b.get("delta") is not None else ""
        logs.report(f"best: trial {b['trial']} ({change_text(b['change'])}), chosen on {split} {b['metric']}: {b['value']:.4f}{delta}")
        report = b.get("test") or {}
        spread = report.get("spread") or {}
        shown = ", ".join(f"{name} {report['metrics'][name]:.4f}" + (f" ± {spread[name]['std']:.4f}" if name in spread and spread[name]["n"] > 1 else "")
                          for name in names if name in (report.get("metrics") or {}))
        if shown:
            logs.report(f"  its test result, {report['label']}: {shown}")
    logs.report(f"summary: {summary['folder']}/summary.json; the trials are in experiments.md")


def best_validation(record: dict[str, Any]) -> str:
    """The best validation of a run, in words: `epoch 3`, or `step 400 (epoch 2)` for a run that validates every
    `eval.every_steps` steps."""
    training = record.get("training") or {}
    every = ((record.get("config") or {}).get("eval") or {}).get("every_steps")
    if training.get("best_step") is not None and isinstance(every, int) and every > 0:
        return f"step {training['best_step']} (epoch {training.get('best_epoch')})"
    return f"epoch {training.get('best_epoch')}"


def search_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    selection = summary["selection"]
    best = (summary.get("best") or {}).get("number")
    table = Table(title=f"search {summary['id']} ({summary['sampler']['name']} sampler, seed {summary['sampler']['seed']}, "
                  f"{summary['pruner']['name']} pruner; chosen on {selection['split']} {selection['metric']})", title_justify="left")
    unit = "step" if summary.get("judged_at") == "step" else "epoch"
    for column in ("trial", "change", "run", "state", f"{selection['split']} {selection['metric']}", f"{unit}s judged"):
        table.add_column(column)
    for trial in summary["trials"]:
        change = ", ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={json.dumps(value)}" for key, value in trial["change"].items())
        state = trial["state"] + (f": {trial['error']}" if trial["state"] == "failed" and trial.get("error") else "")
        if trial["state"] == "pruned" and trial.get("pruned"):
            state += f" after {unit} {trial['pruned'].get(unit)}"
        value = f"{trial['value']:.4f}" if isinstance(trial.get("value"), (int, float)) else "-"
        table.add_row(f"{trial['number']}" + (" best" if trial["number"] == best else ""), change or "-", trial.get("run_id") or "-", state, value,
                      str(len(trial["intermediate"])), style="bold" if trial["number"] == best else None)
    logs.print_table(table)
    counts = summary["counts"]
    logs.report(f"{counts['trials']} of {counts['planned']} trial(s): {counts['completed']} completed, {counts['pruned']} pruned, "
                f"{counts['failed']} failed" + (f", {counts['interrupted'] + counts['running']} unfinished" if counts["interrupted"] + counts["running"] else ""))
    if summary.get("best"):
        b = summary["best"]
        logs.report(f"best: trial {b['number']} (run {b['run_id']}), chosen on {b['split']} {b['metric']}: {b['value']:.4f}")
        report = b.get("test") or {}
        shown = ", ".join(f"{name} {value:.4f}" for name, value in list((report.get("metrics") or {}).items())[:3])  # its task's first
        if shown:
            logs.report(f"  its test result, {report['label']}: {shown}")
    if not summary["reproducible"]["proposals"]:
        logs.report(f"note: {summary['reproducible']['reason']}")
    logs.report(f"summary: {summary['folder']}/summary.json, sealed by SHA256SUMS (sha256sum -c SHA256SUMS)")


# ---------------------------------------------------------------- stages on a finished run


def eval_written(done: Amended, use_current_code: bool) -> None:
    """Where `eval` wrote its result: into a sealed amendment of the run, or into a new run of its own."""
    if done.outside and use_current_code:
        logs.report(f"eval written to new run {done.run_dir.name} (kind eval, parent {done.parent}: "
                    f"built with the current code, not the code recorded with {done.parent}); seal {done.seal}")
    elif done.outside and done.why == "not_selected":
        logs.report(f"eval written to new run {done.run_dir.name} (kind eval, parent {done.parent}: "
                    f"not the selected model); seal {done.seal}")
    elif done.outside:
        logs.report(f"eval written to new run {done.run_dir.name} (kind eval, parent {done.parent}: "
                    f"not from the audited training); seal {done.seal}")
    else:
        logs.report(f"eval of {done.result['split']} added to run {done.run_dir.name} as a sealed amendment; its seal: {done.seal}")


def metrics_table(metrics: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="metrics", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for name, value in metrics.items():
        if isinstance(value, float):
            table.add_row(name, f"{value:.4f}")
        elif isinstance(value, (int, str)) and name not in ("checkpoint_sha256",):
            table.add_row(name, str(value))
    logs.print_table(table)


def baselines(result: dict[str, Any]) -> None:
    judged = [result["judged_by"]["metric"]] if isinstance(result.get("judged_by"), dict) else []  # the rule's metric
    for name, r in result["results"].items():
        samples = f"{r['samples']} {result['split']} samples" if isinstance(r.get("samples"), int) else f"{result['split']} split"
        click.echo(f"{name}: {headline(r, judged)} ({samples})")


def export_written(done: Amended, use_current_code: bool) -> None:
    """Where `export` wrote when it could not write into the run: a new run of its own."""
    if done.outside and use_current_code:
        logs.report(f"exported into new run {done.run_dir.name} (kind export, built with the current code, not the code "
                    f"recorded with {done.parent}); seal {done.seal}")
    elif done.outside:
        logs.report(f"exported into new run {done.run_dir.name} (kind export, not from the audited training); seal {done.seal}")


def exported(description: dict[str, Any], export_dir: Path) -> None:
    kept, removed = description.get("kept", []), description.get("removed", [])
    written = [name for name in description["files"] if name not in kept]
    click.echo(f"exported {', '.join(written)} to {export_dir}"
               + (f"; kept {', '.join(kept)} (same checkpoint)" if kept else "")
               + (f"; removed {', '.join(r['file'] for r in removed)}" if removed else "") + "; parity passed")


def predictions(results: list[dict[str, Any]]) -> None:
    from veritrain.core.display import terminal_safe

    for r in results:
        shown = ", ".join(f"{t['label']} {t['prob']:.4f}" for t in r["top"]) if r["ok"] else f"error: {r['error']}"
        click.echo(terminal_safe(f"{r['file']}: {shown}"))  # class names come from model.json, which may come from anywhere


def smoke(result: dict[str, Any]) -> None:
    for name, check in result["checks"].items():
        click.echo(f"{name}: {'passed' if check['passed'] else 'FAILED'}")
    click.echo(f"smoke passed in {result['seconds']:.1f}s ({result['folder']})")


# ---------------------------------------------------------------- verdicts: verify, check, reproduce, audit


def verify_findings(result: dict[str, Any]) -> None:
    """What `verify` found: each mismatching file, each drift, and how the raw data was checked."""
    for p in result["problems"]:
        logs.report(f"{p['kind']}: {p['path']}" + (f" ({p['detail']})" if p.get("detail") else ""), style="red")
    for d in result["drift"]:
        logs.report(f"drift: {d['what']}: recorded {d['recorded']}, now {d['now']}", style="yellow")
    if result.get("raw_data"):  # which check the raw data had: its hashes, or preparing it again
        logs.report(f"data: {result['raw_data']}")
    fmt, signer = result.get("format"), result.get("signer")
    if fmt:
        from veritrain.trust.formats import line

        logs.report(line(fmt))
    if signer:
        from veritrain.trust.provenance_check import Signer

        logs.report(Signer(**signer).line())
    amendment_lines(result.get("amendments") or [])


def amendment_lines(rows: list[dict[str, Any]]) -> None:
    """One line per sealed amendment of the run: what wrote it, its seal, its signer, the results it gives, and whether
    the seal the user expects covers it."""
    from veritrain.trust.provenance_check import Signer

    for row in rows:
        gives = f"; gives {', '.join(row['results'])}" if row.get("results") else ""
        covered = "" if row["covered"] else " (NOT covered by the seal you expect)"
        logs.report(f"amendment {row['index']:04d} by {row['by']} at {row['at']}: seal {row['seal']}{gives}; "
                    f"{Signer(**row['signer']).line()}{covered}", style=None if row["covered"] else "yellow")


def verified(run_id: str, result: dict[str, Any]) -> None:
    later = [row for row in result.get("amendments") or [] if not row["covered"]]
    if later:
        covered = next((row["seal"] for row in reversed(result["amendments"]) if row["covered"]), result.get("base_seal"))
        logs.report(f"run {run_id} verified: seal {covered} (the one expected) vouches for the run up to it; {len(later)} later "
                    f"amendment(s), listed above, are not covered by it; newest seal {result['seal']}")
    else:
        logs.report(f"run {run_id} verified: seal {result['seal']}")


def checklist(result: dict[str, Any]) -> None:
    from rich.table import Table

    from veritrain.trust.check import PASSING

    table = Table(title=f"check {result['run']}", title_justify="left")
    for column in ("row", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for i in result["items"]:
        table.add_row(f"{i['item']} ({i['id']})", i["status"], i["detail"], i["fix"] or "",
                      style=None if i["status"] in PASSING else "yellow")
    logs.print_table(table)


def reproduction(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"reproduce {result['original']} → {result['reproduction']}: {result['verdict']}", title_justify="left")
    for column in ("check", "verdict", "first divergence"):
        table.add_column(column, overflow="fold")
    for check in result["checks"]:
        first = check.get("first_divergence")
        shown = "" if not first else (f"{first.get('where', first.get('what'))} {first.get('key', '')}: {first.get('original')} → {first.get('reproduction')}"
                                      if "original" in first else str(first.get("detail", "")))
        table.add_row(check["what"], check["verdict"], shown)
    logs.print_table(table)


def audit(result: dict[str, Any]) -> None:
    from rich.table import Table

    logs.report(f"audit {result['run_id']}: {len(result['segments_drawn'])} segment(s) drawn of {result['segments_total']}, "
                f"{result['segments_audited']} checked on the way, seed {result['seed']}")
    table = Table(title=f"audit: {result['verdict']}", title_justify="left")
    for column in ("segment", "steps", "replayed from step", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    for v in result["segments"]:
        table.add_row(str(v["segment"]), f"{v['from_step']} → {v['to_step']}", str(v["replayed_from_step"]), v["verdict"], v.get("detail", ""))
    for r in result["results"]:
        table.add_row(r["what"], f"entry {r['entry']} (step {r['step']})" if r.get("entry") is not None else "the data version", "",
                      r["verdict"], r.get("detail", ""))
    logs.print_table(table)
    cost = f" = {result['cost_fraction']:.1%} of the recorded training time" if result["cost_fraction"] is not None else ""
    logs.report(f"replay {result['replay_seconds']:.1f}s in {len(result['replays'])} stretch(es){cost}")
    for forged, chance in result["escape_probability"].items():
        logs.report(f"a trajectory with {forged} forged segment(s) among {result['segments_total']} escapes this audit "
                    f"(which checked {result['segments_audited']}) with probability {chance:.3f}")
    for item in result.get("not_checked") or []:
        logs.report(f"not checked: {item['check']}: {item['reason']}", style="dim")
    for note in result["environment_notes"]:
        logs.report(f"note: {note}", style="dim")
    logs.report(f"repeat: {result['command']}")


# ---------------------------------------------------------------- archives and housekeeping


def archived(result: dict[str, Any]) -> None:
    left_out = [name for name in result["left_out"] if name.endswith(".pt")]
    click.echo(f"archived {result['run_id']} ({result['files']} files) to {result['archive']}; sha256 {result['sha256']}"
               + (f"; left out {len(left_out)} checkpoint(s) kept only for audit (--with-audit includes them)" if left_out else ""))


def imported(result: dict[str, Any]) -> None:
    click.echo(f"imported run {result['run_id']} into {result['run_dir']}" + (" with its data version" if result["with_data"] else "")
               + (f"; the archive left out {len(result['left_out'])} file(s) kept only for audit (`veritrain audit` cannot start from them)"
                  if result.get("left_out") else ""))


def imported_code(result: dict[str, Any]) -> None:
    """The warning for each piece of code an imported run carries (with or without --json)."""
    for target in result["code"]:
        logs.console.print(f"warning: import: the run carries code, {target}; commands that build its model need --trust-code, "
                           "after you have read it", style="yellow", markup=False, soft_wrap=True)


def collected(result: dict[str, Any], dry_run: bool) -> None:
    """`gc`: each file removed (or that would be), the space freed and the runs amended."""
    for path in result["removed"]:
        click.echo(("would remove " if dry_run else "removed ") + path)
    click.echo(f"{'would free' if dry_run else 'freed'} {result['bytes_freed'] / 2**20:.1f} MiB; "
               f"{'would amend' if dry_run else 'amended'} {len(result['resealed'])} run(s)")


# ---------------------------------------------------------------- runs


def runs_table(rows: list[dict[str, Any]], runs_dir: Path) -> None:
    from rich.table import Table

    table = Table(title=f"{len(rows)} run(s) in {runs_dir}", title_justify="left")
    for column in ("run", "experiment", "kind", "status", "test result", "data", "started"):
        table.add_column(column, overflow="fold")
    for r in rows:
        test = ((r["metrics"] or {}).get("test") or {})
        result = headline(test, _shown_metrics(r, test)) if test else "-"  # its task's headline metric
        # a run of an outside checkpoint says so where its kind is: its result is not the audited training's
        kind = f"{r['kind']} (not from the audited training)" if r["kind"] in ("eval", "export") else str(r["kind"])
        table.add_row(r["run_id"], str(r["exp_name"]), kind, str(r["status"]), result, (r["data_version"] or "-")[:12], str(r["started_at"])[:19])
    logs.print_table(table)


def run_record(run_dir: Path, record: dict[str, Any], read: Any = None) -> None:
    """`runs show` for people: what the run was, what it asked, what it gave, and how to check it (`read`: the record as
    read, whose amendments are listed under its seal)."""
    from rich.table import Table

    from veritrain.core.config import RunConfig
    from veritrain.records.experiments import config_changes
    from veritrain.records.record import SEAL_FILE

    table = Table(title=f"run {record['run_id']} ({record.get('kind')}, {record['status']})", show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("experiment", str(record.get("exp_name")))
    table.add_row("started, ended", f"{record.get('started_at')}, {record.get('ended_at') or '-'}")
    table.add_row("hypothesis", record.get("hypothesis") or "-")
    if record.get("error"):
        table.add_row("error", f"{record['error'].get('type')}: {record['error'].get('message')}", style="yellow")
    if record.get("kind") == "script":
        script_rows(table, record)
    else:
        try:
            defaults = RunConfig().model_dump(mode="json")
        except Exception:  # a default that cannot be built here (a plugin missing): show the config hash alone
            defaults = None
        changed = config_changes(defaults, record.get("config")) if defaults is not None else {}
        table.add_row("config", f"{record.get('config_hash')} ({run_dir / 'config.yaml'})")
        for key, (default, value) in changed.items():
            table.add_row(f"  {key}", f"{json.dumps(value)} (default {json.dumps(default)})")
        data = record.get("data") or {}
        table.add_row("data version", f"{data.get('version') or '-'} ({data.get('source')}; "
                      + ", ".join(f"{k} {v}" for k, v in (data.get("counts") or {}).items()) + ")")
    training = record.get("training") or {}
    if training.get("steps"):
        best = training.get("best_metric") or {}
        table.add_row("training", f"{training.get('epochs')} epochs, {training.get('steps')} steps; best {best_validation(record)}"
                      + (f" ({best.get('name')} {best['value']:.4f})" if isinstance(best.get("value"), float) else ""))
    for split, metrics in (record.get("metrics") or {}).items():
        names = _shown_metrics(record, metrics) if record.get("kind") != "script" else [k for k, v in metrics.items() if isinstance(v, float)]
        shown = ", ".join(f"{name} {metrics[name]:.4f}" for name in names if isinstance(metrics.get(name), float))
        table.add_row(f"{split} metrics", shown or "-")
    for name, result in ((record.get("baselines") or {}).get("results") or {}).items():
        table.add_row(f"baseline {name}", headline(result, _shown_metrics(record, {})))
    parity = (record.get("export") or {}).get("parity")
    if parity:
        table.add_row("export", ", ".join((record.get("export") or {}).get("files") or {}) + f"; parity {'passed' if parity.get('passed') else 'FAILED'}")
    table.add_row("final state", record.get("final_state_sha256") or "-")
    try:
        seal = (run_dir / SEAL_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        seal = "- (no record.sha256)"
    table.add_row("seal", seal)
    for link in getattr(read, "amendments", ()):  # added after the seal, each sealed (and signed) on its own
        gives = [name for name, source in read.applied.sources.items() if source.index == link.index]
        table.add_row(f"  amendment {link.index:04d}", f"{link.seal} ({link.by} at {link.at}; "
                      f"{'signed by key ' + link.signer[:16] + '…' if link.signer else 'unsigned'}"
                      + (f"; gives {', '.join(sorted(gives))}" if gives else "") + ")")
        seal = link.seal
    for old in record.get("seal_history") or []:
        table.add_row("  replaced seal", f"{old['seal']} (re-sealed by {old['by']} at {old['replaced_at']})")
    for event in record.get("events") or []:
        table.add_row(f"event {event.get('kind')}", (f"step {event['step']}: " if event.get("step") is not None else "") + str(event.get("detail") or ""))
    for note in record.get("notes") or []:
        label = "conclusion" if note.get("conclusion") else ("waived " + note["waive"] if note.get("waive") else "note")
        table.add_row(label, f"{note['text']} ({str(note.get('at', ''))[:19]})")
    table.add_row("files", f"{len(record.get('artifacts') or {})} in {run_dir}; check them: veritrain verify {record['run_id']} --expect {seal}")
    logs.print_table(table)


def guarantee_text(record: dict[str, Any]) -> str:
    """A script's run's guarantee level and why it is not higher, in a line."""
    guarantee = record.get("guarantee") or {}
    reasons = guarantee.get("reasons") or []
    return str(guarantee.get("level")) + (f": {'; '.join(reasons)}" if reasons else ": reproduce and audit replay it")


def script_rows(table: Any, record: dict[str, Any]) -> None:
    """The rows of `runs show` that only a script's run (veritrain.start) has."""
    script, inputs = record.get("script") or {}, record.get("inputs") or {}
    table.add_row("guarantee", guarantee_text(record))
    table.add_row("script", f"{script.get('path') or '-'} (recorded as {script.get('file') or 'nothing'})")
    table.add_row("command", " ".join(script.get("orig_argv") or record.get("argv") or []) + f"  (in {script.get('cwd')})")
    table.add_row("config", f"{record.get('config_hash')}: " + json.dumps(record.get("config"), sort_keys=True)[:400])
    table.add_row("inputs", f"{inputs.get('files')} file(s), {inputs.get('bytes')} bytes of {', '.join(inputs.get('paths') or [])}; "
                  f"manifest {inputs.get('manifest_sha256')}" if inputs else "- (none bound)")


def run_comparison(comparison: dict[str, Any]) -> None:
    """`runs compare` for people: each run against the first, only what differs."""
    from veritrain.core.display import terminal_safe

    def echo(line: str) -> None:  # configs and environments come from the records: shown as written
        click.echo(terminal_safe(line))

    run_ids = comparison["run_ids"]
    for index, run_id in enumerate(run_ids[1:], start=1):
        echo(f"{run_ids[0]} → {run_id} (changes from the first run to this one):")
        for row in comparison["config"]:
            if row["values"][index] != row["values"][0]:
                echo(f"  config {row['key']}: {row['values'][0]} → {row['values'][index]}")
        for row in comparison["metrics"]:
            m = row["values"][index]
            if row["headline"] and isinstance(m["value"], float):
                delta = f" ({m['delta']:+.4f})" if m["delta"] is not None else ""
                echo(f"  metric {row['key']}: {m['value']:.4f}{delta}")
        same = comparison["data_versions"][index] == comparison["data_versions"][0]
        echo(f"  data version: {'same' if same else 'DIFFERENT'}")
        for row in comparison["env"]:
            if row["run_id"] == run_id:
                echo(f"  env {row['key']}: {row['base']} → {row['this']}")


def published(result: dict[str, Any]) -> None:
    click.echo(f"published {len(result['runs'])} run(s), {len(result['data_versions'])} data version(s) to {result['out']}/index.html"
               + (f" with {len(result['archives'])} archive(s)" if result["archives"] else ""))


def exported_to_mlflow(result: dict[str, Any]) -> None:
    """`runs export --to mlflow`: each run and its MLflow run, then how to browse them."""
    for run in result["runs"]:
        if run["exported"]:
            click.echo(f"exported {run['run_id']} as MLflow run {run['mlflow_run_id']} ({run['status']}: {run['params']} params, "
                       f"{run['metrics']} metrics, {run['artifacts']} files)"
                       + (f"; {len(run['omitted'])} value(s) MLflow cannot hold are whole in config_omitted.json" if run["omitted"] else ""))
        else:
            click.echo(f"{run['run_id']} is in {result['out']} already, with the same seal, as MLflow run {run['mlflow_run_id']}: left as it is")
    click.echo(f"experiment {result['experiment']['name']} in {result['tracking_uri']}; browse it: "
               f"mlflow ui --backend-store-uri {result['tracking_uri']}")


# ---------------------------------------------------------------- data versions and configs


def data_summary(data: DataVersion, report: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"data version {data.version[:12]}", show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("data version", data.version)
    table.add_row("samples", "  ".join(f"{k} {v}" for k, v in data.counts.items()))
    table.add_row("quarantined", str(len(report["quarantined"])))
    for kind, count in report["findings_by_kind"].items():
        table.add_row(f"finding: {kind}", str(count))
    table.add_row("leakage pairs", str(report["leakage"]["cross_split_duplicate_pairs"]))
    for warning in report["card_warnings"]:
        table.add_row("card", warning)
    others = [gap for gap in report.get("card_gaps") or [] if gap not in report["card_warnings"]]
    if others:
        table.add_row("card (Croissant)", "; ".join(others))
    table.add_row("report", str(data.path / "data_report.md"))
    logs.print_table(table)


def data_diff(result: dict[str, Any]) -> None:
    """`data diff` for people: the counts of each kind of change with a few examples, and why samples moved."""
    click.echo(f"{result['old'][:12]} → {result['new'][:12]}")
    for key in ("added", "removed", "content_changed"):
        if key == "content_changed" and not result["content_compared"]:
            click.echo(f"content_changed: not compared (content hashes by different algorithms: {result['content_hash']})")
            continue
        click.echo(f"{key}: {len(result[key])}" + (f"  ({', '.join(result[key][:5])}{', ...' if len(result[key]) > 5 else ''})" if result[key] else ""))
    for key in ("relabelled", "moved"):
        items = result[key]
        shown = ", ".join(f"{item['sample_id']}: {item['old']} → {item['new']}" for item in items[:5])
        click.echo(f"{key}: {len(items)}" + (f"  ({shown}{', ...' if len(items) > 5 else ''})" if items else ""))
    causes = result["moved_by_cause"]
    click.echo(f"moved because: its key changed {causes['key']}, its group merged or split {causes['group']}, "
               f"quarantined or released {causes['quarantine']}, the split rule changed {causes['placement']}")
    for name, change in result["split_rule_changed"].items():
        click.echo(f"split rule changed: {name} {change['old']} → {change['new']}")


def config_yaml(resolved: ResolvedConfig) -> None:
    """`config show`: where the config came from and its hash, then the resolved config as YAML."""
    from veritrain.core.config import to_yaml

    click.echo(f"# {resolved.source_label}, config_hash {resolved.hash}")
    click.echo(to_yaml(resolved.config), nl=False)


def data_order(result: dict[str, Any]) -> None:
    """`veritrain data order`: one row per step (its epoch, how many rows, the first of them), then the SHA-256."""
    from rich.table import Table

    key = "window_starts" if result["steps"] and "window_starts" in result["steps"][0] else "sample_ids"
    table = Table(title=f"run {result['run_id']}: training order ({result['unit']})", title_justify="left")
    for column in ("step", "epoch", "rows", "first rows"):
        table.add_column(column)
    for entry in result["steps"]:
        shown = ", ".join(str(v) for v in entry[key][:6]) + (" …" if len(entry[key]) > 6 else "")
        table.add_row(str(entry["step"]), str(entry["epoch"]), str(entry["rows"]), shown)
    logs.print_table(table)
    logs.report(f"sha256 of the rows (int64, in order): {result['sha256']}")
    if result["steps"] and result["steps"][-1]["step"] >= result["trained_steps"]:
        logs.report(f"(the run trained {result['trained_steps']} steps; later ones are the order it would have drawn)")
