"""The `veritrain` command: parse arguments, call one library function, render, exit.

Exit codes: 0 success; 1 the command ran and found a problem (failed run); 2 it could not start
(bad usage, config or missing input); 130/143 interrupted by SIGINT/SIGTERM. Errors are one line on
stderr (`error: ...`). Reports (tables, summaries, verdicts) go to stdout, progress and warnings to stderr;
`--json` prints exactly one JSON document on stdout (the reports then go to stderr).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import re
import sqlite3
import sys
from typing import Any, Optional

import click

from veritrain.core import logs
from veritrain.core.errors import Interrupted, RunFailed, UserError, VeritrainError
from veritrain.core.version import __version__

workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Workspace folder holding runs/ and .veritrain/ (default: the current directory).",
)
def _reports_where(ctx: click.Context, param: click.Parameter, as_json: bool) -> bool:
    logs.reports_to_stderr(as_json)  # stdout holds the one JSON document; tables and verdicts go to stderr with the progress
    return as_json


json_option = click.option("--json", "as_json", is_flag=True, callback=_reports_where,
                           help="Print one JSON document on stdout; tables, progress and warnings go to stderr.")
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a config value, e.g. --set train.epochs=5 (repeatable; values are YAML).",
)
nproc_option = click.option(
    "--nproc", type=click.IntRange(min=1, max=1024), default=None, metavar="N",
    help="Train with N processes on this machine (data parallel through torchrun; train.batch_size is the global batch). See docs/distributed.md.",
)
config_argument = click.argument("config", required=False, type=click.Path(dir_okay=True))


# options that several commands take, spelled once
TRUST_CODE_HELP = "Build the model even when the run names code (model.target) and this workspace did not start it (read that code first)."
USE_CURRENT_CODE_HELP = "Build the model from the current user code instead of the copies recorded with the run, in a new run (the run itself is left as it is)."


def trust_code_option(help: str = TRUST_CODE_HELP):
    return click.option("--trust-code", is_flag=True, help=help)


def use_current_code_option(help: str = USE_CURRENT_CODE_HELP):
    return click.option("--use-current-code", is_flag=True, help=help)


hypothesis_option = click.option("--hypothesis", default=None, help="What this run is expected to show, stated before it runs (sealed in its record).")
parent_option = click.option("--parent", default=None, metavar="RUN", help="The reference run experiments.md compares this config with.")


_JSON_WRITTEN = {"done": False}  # whether this command printed its JSON document (a failure after it adds none)


def emit_json(payload: Any) -> None:
    """The command's one JSON document on stdout. NaN and ±Infinity, which JSON has no words for, are null, and the
    document's `nonfinite` lists their paths (e.g. `results[0].top[0].prob`)."""
    from veritrain.core.display import finite_json

    payload, nonfinite = finite_json(payload)
    if nonfinite and isinstance(payload, dict):
        payload = {**payload, "nonfinite": nonfinite}
    text = json.dumps(payload, indent=2, sort_keys=False, allow_nan=False)
    _JSON_WRITTEN["done"] = True
    click.echo(text)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="veritrain", message="%(prog)s %(version)s")
def cli() -> None:
    """veritrain: verifiable training for PyTorch.

    Every run is recorded in runs/<run_id>/ with its config, data version, environment, logs,
    metrics, checkpoints and a record.json that lists every file with its SHA-256.
    """


@cli.command("run")
@config_argument
@set_option
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Train N seeds (seed, seed+1, …) as linked runs and report mean ± std and a 95% interval.")
@hypothesis_option
@parent_option
@click.option("--no-smoke", is_flag=True, help="Skip the smoke test that runs first (recorded in the run).")
@click.option("--dry-run", is_flag=True, help="Print each stage with run/reuse and the reason; run nothing.")
@click.option("--reuse-completed", is_flag=True, help="Return an identical completed run (same config hash, data version, code version) instead of running.")
@nproc_option
@workdir_option
@json_option
def run_command(config: Optional[str], overrides: tuple[str, ...], repeat: int, hypothesis: Optional[str], parent: Optional[str],
                no_smoke: bool, dry_run: bool, reuse_completed: bool, nproc: Optional[int], workdir: Optional[str], as_json: bool) -> int:
    """Prepare data, train and evaluate: one recorded run.

    CONFIG is a YAML run config; without it the built-in default runs (scikit-learn's bundled digits,
    the same as configs/digits.yaml).

    \b
    Example:
      veritrain run configs/digits.yaml --set train.epochs=5
    """
    from veritrain.core.config import load_config
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace

    if _torchrun_follower():  # rank 1… of `torchrun … -m veritrain run`: rank 0 runs the command, this one trains along
        return pipeline.follow()
    resolved = load_config(config, overrides)
    pipeline.refuse_secrets(pipeline.python_argv(), hypothesis)  # before the smoke test: the record keeps them as given
    workspace = Workspace.open(workdir)
    if dry_run or reuse_completed:
        from veritrain.orchestration import housekeeping

        stages = housekeeping.dry_run(resolved, workspace, not no_smoke, reuse_completed)
        reused = next((s.run_id for s in stages if s.stage == "train" and s.action == "reuse"), None)
        if dry_run:
            if as_json:
                emit_json({"stages": [dataclasses.asdict(s) for s in stages]})
            else:
                for s in stages:
                    click.echo(f"{s.stage:<9} {s.action:<6} {s.reason}")
            return 0
        if reused:
            from veritrain.records.record import read_record

            record = read_record(workspace.runs_dir / reused)
            logs.report(f"reusing completed run {reused} (same config hash, data version and code)")
            if as_json:
                emit_json({"run_id": reused, "run_dir": str(workspace.runs_dir / reused), "status": record["status"],
                           "data_version": record["data"]["version"], "final_state_sha256": record["final_state_sha256"],
                           "metrics": record["metrics"], "reused": True})
            return 0
    if no_smoke:
        smoke_result: dict[str, Any] = {"status": "skipped"}
    else:
        from veritrain.orchestration import smoke

        passed = smoke.ensure(resolved, workspace)  # fails fast (exit 1) before the long run starts
        smoke_result = {"key": passed["key"], "status": passed["status"], "cached": passed["cached"]}
    if repeat == 1:
        outcome = pipeline.run(resolved, workspace, pipeline.python_argv(), hypothesis=hypothesis, parent=parent, smoke=smoke_result,
                               nproc=nproc or 1)
        return _finish_run(outcome, as_json)
    from veritrain.orchestration import repeats

    result = repeats.run(resolved, workspace, pipeline.python_argv(), repeat, nproc=nproc or 1, hypothesis=hypothesis, parent=parent,
                         smoke=smoke_result)
    if as_json:
        emit_json(result)
    _render_repeat_summary(result)
    if result["failed"]:
        raise RunFailed(f"{len(result['failed'])} of {repeat} runs failed: {', '.join(result['failed'])}")
    return 0


@cli.command("train")
@config_argument
@set_option
@click.option("--resume", "resume_ref", metavar="RUN|auto", help="Continue RUN (id, prefix, folder, or `latest`: the newest interrupted run) from its newest valid checkpoint; "
              "`auto`: the newest interrupted run (of CONFIG and its data version when given).")
@hypothesis_option
@parent_option
@trust_code_option()
@use_current_code_option(help="With --resume: continue in a new run built from the current user code (the interrupted run is left as it is).")
@nproc_option
@workdir_option
@json_option
def train_command(config: Optional[str], overrides: tuple[str, ...], resume_ref: Optional[str], hypothesis: Optional[str],
                  parent: Optional[str], trust_code: bool, use_current_code: bool, nproc: Optional[int], workdir: Optional[str], as_json: bool) -> int:
    """Train only (preparing the data version if needed), or resume an interrupted run.

    A run killed at any moment and resumed ends with the same weights as one never interrupted.

    \b
    Examples:
      veritrain train configs/digits.yaml --set checkpoint.every_steps=50
      veritrain train --resume latest
    """
    from veritrain.core.config import load_config
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace

    if _torchrun_follower():  # rank 1… of `torchrun … -m veritrain train`: rank 0 runs the command, this one trains along
        return pipeline.follow()
    workspace = Workspace.open(workdir)
    if use_current_code and not resume_ref:
        raise UserError("--use-current-code: a new run always uses the current code; the flag goes with --resume RUN")
    if resume_ref and resume_ref != "auto":
        if config or overrides:
            raise UserError(f"--resume {resume_ref}: a resumed run keeps its own recorded config; drop CONFIG and --set")
        outcome = pipeline.resume(workspace, resume_ref, pipeline.python_argv(), trust_code=trust_code, nproc=nproc,
                                  use_current_code=use_current_code)
    elif resume_ref == "auto":  # with a config: the newest interrupted run of it; without: the newest of the workspace
        match = load_config(config, overrides) if (config or overrides) else None
        outcome = pipeline.resume(workspace, "auto", pipeline.python_argv(), match=match, trust_code=trust_code, nproc=nproc,
                                  use_current_code=use_current_code)
    else:
        outcome = pipeline.run(load_config(config, overrides), workspace, pipeline.python_argv(), kind="train",
                               hypothesis=hypothesis, parent=parent, nproc=nproc or 1)
    return _finish_run(outcome, as_json)


def _torchrun_follower() -> bool:
    from veritrain.train.distributed import from_environment

    ranks = from_environment()
    return ranks is not None and not ranks.is_main


def _finish_run(outcome: Any, as_json: bool) -> int:
    if as_json:
        emit_json(outcome.summary)
    _render_run_summary(outcome)
    if outcome.error is None:
        _print_next_steps(outcome)
    if outcome.error is not None:
        if outcome.record["status"] == "interrupted":
            run_id = outcome.summary["run_id"]
            logs.console.print(f"run {run_id} interrupted and saved; resume with: veritrain train --resume {run_id}", markup=False, soft_wrap=True)
        raise outcome.error
    return 0


HEADLINE_METRICS = ("accuracy", "top5_accuracy", "macro_f1", "log_loss", "ece", "mae", "rmse")


def _render_run_summary(outcome: Any) -> None:
    from rich.table import Table

    summary, record = outcome.summary, outcome.record
    table = Table(title=f"run {summary['run_id']}", show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("status", summary["status"])
    table.add_row("experiment", str(record.get("exp_name")))
    seeds = "single seed" if not record.get("repeat") else f"seed {record['seed']}, {record['repeat']['index'] + 1} of {record['repeat']['of']}"
    for split, metrics in summary["metrics"].items():
        for name in HEADLINE_METRICS:
            if isinstance(metrics.get(name), float):
                table.add_row(f"{split} {name}", f"{metrics[name]:.4f} ({seeds})")
    for name, result in ((record.get("baselines") or {}).get("results") or {}).items():
        table.add_row(f"baseline {name}", f"accuracy {result['accuracy']:.4f}")
    if (record.get("baselines") or {}).get("warning"):
        table.add_row("warning", record["baselines"]["warning"], style="yellow")
    parity = (record.get("export") or {}).get("parity")
    if parity:
        table.add_row("export parity", ("passed" if parity["passed"] else "FAILED: " + str(parity["reason"]))
                      + f" ({', '.join(parity['formats'])} on {parity['samples']} samples)")
    training = record.get("training") or {}
    if training:
        best = training["best_metric"]
        table.add_row("best epoch", f"{training['best_epoch']} ({best['name']} {best['value']:.4f})")
    table.add_row("data version", summary["data_version"] or "-")
    table.add_row("final state", summary["final_state_sha256"] or "-")
    table.add_row("duration", f"{outcome.seconds:.1f}s")
    table.add_row("run dir", summary["run_dir"])
    table.add_row("record", f"{summary['run_dir']}/record.json")
    table.add_row("seal", outcome.seal)
    logs.print_table(table)


def _print_next_steps(outcome: Any) -> None:
    """What to do with a finished run, with its real id: check it, see what is missing, use and compare it."""
    run_id, record = outcome.summary["run_id"], outcome.record
    steps = [(f"veritrain verify {run_id} --expect {outcome.seal}", "re-hash every file against this seal (publish the seal with the result)"),
             (f"veritrain check {run_id}", "the completion checklist, with the fix for each missing row")]
    if (record.get("export") or {}).get("files", {}).get("onnx"):
        steps.append((f"veritrain predict {run_id} IMAGE.png --top 3", "classify your own image files with the exported model"))
    elif "train" in (record.get("stages") or ()):
        steps.append((f"veritrain eval {run_id}", "evaluate it on the fixed test split"))
    steps.append((f"veritrain runs compare {run_id} OTHER_RUN", "config, metrics and environment against another run (`veritrain runs list`)"))
    logs.report("next steps:")
    for command, why in steps:
        logs.report(f"  {command}")
        logs.report(f"      {why}", style="dim")


def _render_repeat_summary(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{len(result['runs'])} seeds (group {result['group']}): {result['split']} split, a final report; no seed is selected",
                  title_justify="left")
    for column in ("metric", "mean ± std", "95% interval", "seeds"):
        table.add_column(column)
    for name, s in result["summary"].items():
        table.add_row(name, f"{s['mean']:.4f} ± {s['std']:.4f}", f"[{s['ci95'][0]:.4f}, {s['ci95'][1]:.4f}]", str(s["n"]))
    for name, s in result.get("baselines", {}).items():
        table.add_row(f"baseline {name}", f"{s['accuracy']:.4f}", "-", "-")
    if result.get("warning"):
        table.add_row("warning", result["warning"], "", "", style="yellow")
    logs.print_table(table)
    for run in result["runs"]:
        logs.report(f"  {run['run_id']}  seed {run['seed']}  {run['status']}")


@cli.command("sweep")
@config_argument
@set_option
@click.option("--vary", "varies", multiple=True, metavar="KEY.PATH=V1,V2,...",
              help="A key and the values to try (YAML, as --set; commas inside [] or quotes stay in the value). Repeatable.")
@click.option("--grid", is_flag=True, help="Every combination of the --vary values, instead of one change at a time.")
@click.option("--parallel", type=click.IntRange(min=1), default=None, help="Runs at once (default 1; with --resume, the sweep's own).")
@click.option("--backend", type=click.Choice(["local", "ray"]), default=None, help="Local processes (default) or Ray tasks (needs the ray extra).")
@click.option("--ray-address", default=None, metavar="ADDR", help="The Ray cluster to use (default: $RAY_ADDRESS, else a local Ray).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="Seeds per trial and parent (seed, seed+1, …).")
@click.option("--parent", default=None, metavar="RUN", help="A completed run of the base config to compare with, instead of running it first.")
@click.option("--metric", default=None, metavar="val.NAME",
              help="The val metric that picks the best trial, e.g. val.log_loss (default: val accuracy); never a test metric.")
@click.option("--no-smoke", is_flag=True, help="Skip the smoke test of the base config that runs first.")
@click.option("--dry-run", is_flag=True, help="Print the planned trials; run nothing.")
@click.option("--resume", "resume_id", default=None, metavar="SWEEP_ID", help="Continue an interrupted sweep (id, unique prefix or `latest`).")
@trust_code_option(help="With --resume: start runs whose planned config names code (model.target) (read spec.json and that code first).")
@workdir_option
@json_option
def sweep_command(config: Optional[str], overrides: tuple[str, ...], varies: tuple[str, ...], grid: bool, parallel: Optional[int],
                  backend: Optional[str], ray_address: Optional[str], repeat: int, parent: Optional[str], metric: Optional[str], no_smoke: bool,
                  dry_run: bool, resume_id: Optional[str], trust_code: bool, workdir: Optional[str], as_json: bool) -> int:
    """Runs that each change the config in one key, compared with a parent run of the base config.

    Each --vary value is a trial (one change at a time; --grid: every combination); the parent
    runs first. Every run evaluates val and test from the same checkpoint; the best trial is chosen
    on val (--metric), and its test result is reported, never used for selection. Summary in
    .veritrain/sweeps/<id>/summary.json and experiments.md; see docs/sweep.md.

    \b
    Examples:
      veritrain sweep configs/digits.yaml --vary optim.lr=0.01,0.001 --vary train.batch_size=32,128 --parallel 2
      veritrain sweep --resume latest
    """
    from veritrain.orchestration import pipeline, sweep
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    if resume_id:
        given = [name for name, value in (("CONFIG", config), ("--set", overrides), ("--vary", varies), ("--grid", grid), ("--repeat", repeat != 1),
                                          ("--parent", parent), ("--metric", metric), ("--no-smoke", no_smoke), ("--dry-run", dry_run)) if value]
        if given:
            raise UserError(f"--resume {resume_id}: a resumed sweep keeps its plan; drop {', '.join(given)}")
        outcome = sweep.resume(workspace, resume_id, pipeline.python_argv(), parallel, backend, ray_address, trust_code=trust_code)
    else:
        plan = sweep.plan(config, overrides, varies, grid, repeat, parallel or 1, backend or "local", parent, workspace, metric=metric)
        if dry_run:
            if as_json:
                emit_json(plan.as_dict())
            else:
                _render_sweep_plan(plan)
            return 0
        outcome = sweep.start(plan, workspace, pipeline.python_argv(), smoke=not no_smoke, ray_address=ray_address)
    if as_json:
        emit_json(outcome.summary)
    _render_sweep_summary(outcome.summary)
    if outcome.error is not None:
        raise outcome.error
    return 0


def _render_sweep_plan(plan: Any) -> None:
    from rich.table import Table

    from veritrain.orchestration.sweep import change_text

    table = Table(title=f"sweep plan: {len(plan.trials)} trial(s), {plan.mode}, threads {plan.threads}, {plan.repeat} seed(s) each", title_justify="left")
    for column in ("trial", "change", "config hash", "hypothesis"):
        table.add_column(column)
    for trial in plan.trials:
        table.add_row(str(trial.index), change_text(trial.change), trial.config_hashes[0][:12], trial.hypothesis)
    logs.print_table(table)
    for note in plan.skipped:
        logs.report(f"left out {note}")


def _render_sweep_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    from veritrain.orchestration.sweep import change_text

    headline = (summary.get("headline") or {}).get("metric")
    split = summary["split"]  # the trials' metrics: the split the best trial is chosen on
    names = [n for n in dict.fromkeys([headline, "accuracy", "macro_f1", "log_loss", "rmse"]) if n and
             any(n in g["metrics"] for g in (summary["parent"], *summary["trials"]))][:3]
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


# ---------------------------------------------------------------- stages on a finished run


@cli.command("eval")
@click.argument("ref", metavar="RUN", required=False)
@click.option("--checkpoint", "which", default=None, metavar="best|last|PATH", help="Checkpoint to evaluate (default: best, or last when the run kept no best.pt).")
@click.option("--split", type=click.Choice(["test", "val"]), default=None, help="Split to evaluate on (default: the run's eval.split).")
@click.option("--predictions", type=click.Path(dir_okay=False), default=None, help="Recompute every metric from a predictions.csv alone (no RUN).")
@click.option("--allow-data-drift", is_flag=True, help="Evaluate even when the data no longer matches the run's data version (recorded).")
@trust_code_option()
@use_current_code_option()
@workdir_option
@json_option
def eval_command(ref: Optional[str], which: Optional[str], split: Optional[str], predictions: Optional[str], allow_data_drift: bool,
                 trust_code: bool, use_current_code: bool, workdir: Optional[str], as_json: bool) -> int:
    """Evaluate a run's checkpoint on its fixed split; writes eval/<split>/ and re-seals the run.

    \b
    Examples:
      veritrain eval latest --checkpoint best --split test
      veritrain eval --predictions runs/<id>/eval/test/predictions.csv --json
    """
    from pathlib import Path

    from veritrain.results import evaluate

    if predictions:
        if ref:
            raise UserError("--predictions: give either RUN or --predictions FILE, not both")
        try:
            metrics = evaluate.from_predictions(Path(predictions))
        except FileNotFoundError:
            raise UserError(f"--predictions {predictions}: no such file") from None
        except ValueError as err:
            raise UserError(f"--predictions {predictions}: {err}") from None
    else:
        if not ref:
            raise UserError("veritrain eval: give a RUN (id, prefix, latest or folder) or --predictions FILE")
        from veritrain.orchestration import pipeline
        from veritrain.records.workspace import Workspace

        workspace = Workspace.open(workdir)
        done = pipeline.evaluate_run(workspace, ref, which, split, pipeline.python_argv(), allow_data_drift, trust_code, use_current_code)
        metrics = done.result
        if done.outside and use_current_code:
            logs.report(f"eval written to new run {done.run_dir.name} (kind eval, parent {done.parent}: "
                        f"built with the current code, not the code recorded with {done.parent}); seal {done.seal}")
        elif done.outside:
            logs.report(f"eval written to new run {done.run_dir.name} (kind eval, parent {done.parent}: "
                        f"not from the audited training); seal {done.seal}")
        else:
            logs.report(f"eval written to {done.run_dir / 'eval' / metrics['split']}; run re-sealed: {done.seal}")
    if as_json:
        emit_json(metrics)
    else:
        _render_metrics(metrics)
    return 0


def _render_metrics(metrics: dict[str, Any]) -> None:
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


@cli.command("baseline")
@click.argument("ref", metavar="RUN|CONFIG")
@set_option
@trust_code_option()
@workdir_option
@json_option
def baseline_command(ref: str, overrides: tuple[str, ...], trust_code: bool, workdir: Optional[str], as_json: bool) -> int:
    """Majority-class and logistic-regression baselines on the same splits as a run (or a config).

    \b
    Examples:
      veritrain baseline latest
      veritrain baseline configs/digits.yaml --json
    """
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace

    result = pipeline.baselines(Workspace.open(workdir), ref, overrides, trust_code)
    if as_json:
        emit_json(result)
    else:
        for name, r in result["results"].items():
            click.echo(f"{name}: accuracy {r['accuracy']:.4f}, macro F1 {r['f1_macro']:.4f} ({r['samples']} {result['split']} samples)")
    return 0


@cli.command("export")
@click.argument("ref", metavar="RUN")
@click.option("--format", "formats", multiple=True, type=click.Choice(["onnx", "torchscript", "safetensors"]),
              help="Format to write (repeatable; default: the run's export.formats, all three).")
@click.option("--checkpoint", "which", default=None, metavar="best|last|PATH", help="Checkpoint to export (default: best, or last when the run kept no best.pt).")
@trust_code_option()
@use_current_code_option()
@workdir_option
@json_option
def export_command(ref: str, formats: tuple[str, ...], which: Optional[str], trust_code: bool, use_current_code: bool,
                   workdir: Optional[str], as_json: bool) -> int:
    """Export a run's model (ONNX, TorchScript, safetensors) with model.json and a parity check.

    Exits 1 when an exported model does not give the trained model's answers on real test samples.

    \b
    Example:
      veritrain export latest --format onnx
    """
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    done = pipeline.export_run(workspace, ref, which, list(formats) or None, pipeline.python_argv(), trust_code, use_current_code)
    description = done.result
    if done.outside and use_current_code:
        logs.report(f"exported into new run {done.run_dir.name} (kind export, built with the current code, not the code "
                    f"recorded with {done.parent}); seal {done.seal}")
    elif done.outside:
        logs.report(f"exported into new run {done.run_dir.name} (kind export, not from the audited training); seal {done.seal}")
    if as_json:
        emit_json(description)
    else:
        kept, removed = description.get("kept", []), description.get("removed", [])
        written = [name for name in description["files"] if name not in kept]
        click.echo(f"exported {', '.join(written)} to {done.run_dir / 'export'}"
                   + (f"; kept {', '.join(kept)} (same checkpoint)" if kept else "")
                   + (f"; removed {', '.join(r['file'] for r in removed)}" if removed else "") + "; parity passed")
    return 0


@cli.command("predict")
@click.argument("ref", metavar="RUN|EXPORT_DIR")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--top", type=click.IntRange(min=1), default=1, show_default=True, help="How many classes to show per file.")
@workdir_option
@json_option
def predict_command(ref: str, files: tuple[str, ...], top: int, workdir: Optional[str], as_json: bool) -> int:
    """Classify image files with an exported model (ONNX) and its recorded preprocessing.

    A file that cannot be read or decoded gets its own error; the others are still predicted (exit 1
    if any failed).

    \b
    Example:
      veritrain predict latest cat.png dog.jpg --top 3
    """
    from pathlib import Path

    from veritrain.records.workspace import Workspace
    from veritrain.results import export

    candidate = Path(ref)
    base = candidate if candidate.is_dir() and ((candidate / "model.json").exists() or (candidate / "export").is_dir()) else Workspace.open(workdir).resolve_run(ref, "export")
    results = export.predict(export.find_export(base), files, top)
    if as_json:
        emit_json({"results": results})
    else:
        from veritrain.core.display import terminal_safe

        for r in results:
            shown = ", ".join(f"{t['label']} {t['prob']:.4f}" for t in r["top"]) if r["ok"] else f"error: {r['error']}"
            click.echo(terminal_safe(f"{r['file']}: {shown}"))  # class names come from model.json, which may come from anywhere
    failed = [r["file"] for r in results if not r["ok"]]
    if failed:
        raise RunFailed(f"{len(failed)} of {len(results)} file(s) could not be predicted: {', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}")
    return 0


@cli.command("smoke")
@config_argument
@set_option
@workdir_option
@json_option
def smoke_command(config: Optional[str], overrides: tuple[str, ...], workdir: Optional[str], as_json: bool) -> int:
    """A tiny slice of a config through every stage (prepare, 2 training steps, checkpoint save +
    load + resume, eval, export + parity) in seconds; recorded in .veritrain/smoke/.

    \b
    Example:
      veritrain smoke configs/digits.yaml
    """
    from veritrain.core.config import load_config
    from veritrain.orchestration import smoke
    from veritrain.records.workspace import Workspace

    result = smoke.run(load_config(config, overrides), Workspace.open(workdir))
    if as_json:
        emit_json(result)
    else:
        for name, check in result["checks"].items():
            click.echo(f"{name}: {'passed' if check['passed'] else 'FAILED'}")
        click.echo(f"smoke passed in {result['seconds']:.1f}s ({result['folder']})")
    return 0


@cli.command("verify")
@click.argument("ref", metavar="RUN")
@click.option("--expect", metavar="SEAL", help="The seal published for this run; verify fails when record.json does not hash to it.")
@click.option("--strict", is_flag=True, help="Also fail on environment drift and on raw data that is not present.")
@workdir_option
@json_option
def verify_command(ref: str, expect: Optional[str], strict: bool, workdir: Optional[str], as_json: bool) -> int:
    """Re-hash every file of a run against its sealed record, check the seal and the data version.

    Exit 0 only when everything holds; 1 names every mismatching file.

    \b
    Example:
      veritrain verify latest --expect 63a6a0c8...
    """
    from veritrain.records.workspace import Workspace
    from veritrain.trust.verify import verify_and_keep

    if expect is not None and not re.fullmatch(r"[0-9a-f]{64}", expect.strip().lower()):
        raise UserError(f"--expect: {expect!r} is not a seal; give the 64 hex digits printed at the end of the run (record.sha256)")
    workspace = Workspace.open(workdir)
    run_dir = workspace.resolve_run(ref)
    result = {"run_id": run_dir.name, **verify_and_keep(run_dir, workspace.state_dir, expect=expect, strict=strict)}  # kept for `ui` and `check`
    if as_json:
        emit_json(result)
    for p in result["problems"]:
        logs.report(f"{p['kind']}: {p['path']}" + (f" ({p['detail']})" if p.get("detail") else ""), style="red")
    for d in result["drift"]:
        logs.report(f"drift: {d['what']}: recorded {d['recorded']}, now {d['now']}", style="yellow")
    if result.get("raw_data"):  # which check the raw data had: its hashes, or preparing it again
        logs.report(f"data: {result['raw_data']}")
    if not result["ok"]:
        raise RunFailed(f"verify {run_dir.name}: {len(result['problems'])} problem(s)" + (f", {len(result['drift'])} drift(s) with --strict" if strict and result["drift"] else "")
                        + (f": {', '.join(p['path'] for p in result['problems'][:3])}" if result["problems"] else ""))
    judged = " as it was before the interrupted amend" if result.get("interrupted_amend") else ""
    logs.report(f"run {run_dir.name} verified{judged}: seal {result['seal']}")
    return 0


@cli.command("check")
@click.argument("ref", metavar="RUN")
@workdir_option
@json_option
def check_command(ref: str, workdir: Optional[str], as_json: bool) -> int:
    """The completion checklist of a run: data, environment, training, evaluation, export, archive.

    One row per item with pass / fail / missing / n/a / waived and the fix that clears it; exit 1 if
    any item fails or is missing. A row that cannot pass for a stated reason is waived with a note:
    `veritrain runs note RUN --waive ROW "reason"`.

    \b
    Example:
      veritrain check latest
    """
    from veritrain.records.workspace import Workspace
    from veritrain.trust.check import PASSING, check_run

    workspace = Workspace.open(workdir)
    result = check_run(workspace.resolve_run(ref), workspace.state_dir)
    if as_json:
        emit_json(result)
    from rich.table import Table

    table = Table(title=f"check {result['run']}", title_justify="left")
    for column in ("row", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for i in result["items"]:
        table.add_row(f"{i['item']}\n({i['id']})", i["status"], i["detail"], i["fix"] or "",
                      style=None if i["status"] in PASSING else "yellow")
    logs.print_table(table)
    bad = [i["item"] for i in result["items"] if i["status"] not in PASSING]
    if bad:
        raise RunFailed(f"check {result['run']}: {len(bad)} item(s) not passed: {'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}")
    return 0


@cli.command("gc")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@workdir_option
@json_option
def gc_command(dry_run: bool, workdir: Optional[str], as_json: bool) -> int:
    """Remove step checkpoints of completed runs (best/last and those kept for audit stay), data versions no run references
    and stale locks; runs that lose files are re-sealed with a `gc` event.

    \b
    Example:
      veritrain gc --dry-run
    """
    from veritrain.orchestration import housekeeping
    from veritrain.records.workspace import Workspace

    result = housekeeping.gc(Workspace.open(workdir), dry_run)
    if as_json:
        emit_json(result)
    else:
        for path in result["removed"]:
            click.echo(("would remove " if dry_run else "removed ") + path)
        click.echo(f"{'would free' if dry_run else 'freed'} {result['bytes_freed'] / 2**20:.1f} MiB; "
                   f"{'would re-seal' if dry_run else 're-sealed'} {len(result['resealed'])} run(s)")
    if result["unverified"]:
        raise RunFailed(f"gc: {len(result['unverified'])} run(s) left alone because they do not verify; the first: {result['unverified'][0]}")
    return 0


@cli.command("archive")
@click.argument("ref", metavar="RUN")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False), help="The .tar.gz file to write.")
@click.option("--with-data", is_flag=True, help="Include the prepared data version (manifest, splits, arrays).")
@click.option("--with-audit", is_flag=True, help="Include the checkpoints kept only for audit (checkpoint.audit_every); without it they are left out, and listed.")
@workdir_option
@json_option
def archive_command(ref: str, output: str, with_data: bool, with_audit: bool, workdir: Optional[str], as_json: bool) -> int:
    """Pack a sealed run (and optionally its data version) into one .tar.gz.

    Checkpoints kept only for audit travel with --with-audit; without it the archive lists them as
    left out, the import still verifies, and `veritrain audit` there replays from what remains.

    \b
    Example:
      veritrain archive latest -o run.tar.gz --with-data
    """
    from pathlib import Path

    from veritrain.records.workspace import Workspace
    from veritrain.trust import archive

    workspace = Workspace.open(workdir)
    result = archive.create(workspace.resolve_run(ref), workspace.state_dir, Path(output), with_data, with_audit=with_audit)
    if as_json:
        emit_json(result)
    else:
        left_out = [name for name in result["left_out"] if name.endswith(".pt")]
        click.echo(f"archived {result['run_id']} ({result['files']} files) to {result['archive']}; sha256 {result['sha256']}"
                   + (f"; left out {len(left_out)} checkpoint(s) kept only for audit (--with-audit includes them)" if left_out else ""))
    return 0


@cli.command("import")
@click.argument("archive_file", metavar="FILE")
@workdir_option
@json_option
def import_command(archive_file: str, workdir: Optional[str], as_json: bool) -> int:
    """Import an archived run: every hash is checked before anything is accepted; paths outside the
    workspace, links, devices and files the record does not list are refused.

    \b
    Example:
      veritrain import run.tar.gz --workdir elsewhere/
    """
    from pathlib import Path

    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace
    from veritrain.trust import archive

    workspace = Workspace.open(workdir)
    result = archive.import_archive(Path(archive_file), workspace)
    pipeline.update_experiments(workspace)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"imported run {result['run_id']} into {result['run_dir']}" + (" with its data version" if result["with_data"] else "")
                   + (f"; the archive left out {len(result['left_out'])} file(s) kept only for audit (`veritrain audit` cannot start from them)"
                      if result.get("left_out") else ""))
    for target in result["code"]:
        logs.console.print(f"warning: import: the run carries code, {target}; commands that build its model need --trust-code, "
                           "after you have read it", style="yellow", markup=False, soft_wrap=True)
    return 0


@cli.command("reproduce")
@click.argument("ref", metavar="RUN")
@trust_code_option()
@use_current_code_option(help="Train the reproduction with the current user code instead of the copies recorded with the run.")
@workdir_option
@json_option
def reproduce_command(ref: str, trust_code: bool, use_current_code: bool, workdir: Optional[str], as_json: bool) -> int:
    """Re-run a completed run's recorded pipeline into a new run and compare weights and metrics.

    Same config, seed and data version (refused when the data changed); only the data version is
    reused. On the same kind of machine the verdict is `identical`.

    \b
    Example:
      veritrain reproduce latest
    """
    from veritrain.orchestration import pipeline
    from veritrain.orchestration.reproduce import reproduce
    from veritrain.records.workspace import Workspace

    result = reproduce(Workspace.open(workdir), ref, pipeline.python_argv(), trust_code=trust_code, use_current_code=use_current_code)
    if as_json:
        emit_json(result)
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
    if result["error"]:
        raise RunFailed(f"reproduce: the new run did not complete: {result['error']}")
    if result["verdict"] == "differs":
        raise RunFailed(f"reproduce: run {result['reproduction']} differs from {result['original']}")
    return 0


@cli.command("audit")
@click.argument("ref", metavar="RUN")
@click.option("--segments", type=click.IntRange(min=1), default=2, show_default=True, help="How many segments of the trajectory to replay, drawn at random.")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=None, help="Repeat an earlier audit's draw (default: a fresh random seed, printed).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the result (JSON) to this file, outside the run.")
@trust_code_option()
@workdir_option
@json_option
def audit_command(ref: str, segments: int, seed: Optional[int], out: Optional[str], trust_code: bool, workdir: Optional[str], as_json: bool) -> int:
    """Replay random segments of a run's trajectory and demand the recorded state hashes, bit for bit.

    Proves that the weights came from the recorded training at a fraction of `reproduce`'s cost.
    Needs a machine like the recorded one (exit 2 with the difference otherwise); exit 1 when a
    segment differs. Keep checkpoints for audit with checkpoint.audit_every.

    \b
    Example:
      veritrain audit latest --segments 2
    """
    from pathlib import Path

    from veritrain.records.workspace import Workspace
    from veritrain.trust import audit

    result = audit.run(Workspace.open(workdir), ref, segments, seed, Path(out) if out else None, trust_code=trust_code)
    if as_json:
        emit_json(result)
    from rich.table import Table

    logs.report(f"audit {result['run_id']}: {len(result['segments_drawn'])} segment(s) drawn of {result['segments_total']}, "
                f"{result['segments_audited']} checked on the way, seed {result['seed']}")
    table = Table(title=f"audit: {result['verdict']}", title_justify="left")
    for column in ("segment", "steps", "replayed from step", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    for v in result["segments"]:
        table.add_row(str(v["segment"]), f"{v['from_step']} → {v['to_step']}", str(v["replayed_from_step"]), v["verdict"], v.get("detail", ""))
    for r in result["results"]:
        table.add_row(r["what"], f"entry {r['entry']} (step {r['step']})", "", r["verdict"], r.get("detail", ""))
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
    if result["verdict"] != "identical":
        bad = [str(v["segment"]) for v in result["segments"] if v["verdict"] == "differs"]
        results = [r["what"] for r in result["results"] if r["verdict"] == "differs"]
        raise RunFailed(f"audit {result['run_id']}: " + (f"segment(s) {', '.join(bad)} differ from the recorded trajectory: "
                        "the weights did not come from the recorded training on this data" if bad else
                        f"{', '.join(results)} differ from what the trajectory entry gives: the results did not come from the audited training"))
    return 0


@cli.group("runs")
def runs_group() -> None:
    """List, show, compare and annotate runs (an index of the run folders)."""


@runs_group.command("list")
@click.option("--status", multiple=True, type=click.Choice(["running", "completed", "failed", "interrupted"]), help="Only runs with this status (repeatable).")
@click.option("--sort", default=None, metavar="METRIC", help="Sort by a metric such as test.accuracy (largest first; -test.log_loss for smallest).")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE", help="e.g. exp_name=digits or optim.lr=0.01 (repeatable).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many runs.")
@workdir_option
@json_option
def runs_list(status: tuple[str, ...], sort: Optional[str], filters: tuple[str, ...], limit: Optional[int], workdir: Optional[str], as_json: bool) -> int:
    """List the runs of the workspace, newest first.

    \b
    Example:
      veritrain runs list --status completed --sort test.accuracy
    """
    from veritrain.records import registry
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    rows = registry.query(workspace.state_dir, workspace.runs_dir, status, sort, filters, limit)
    if as_json:
        emit_json({"runs": rows})
        return 0
    from rich.table import Table

    table = Table(title=f"{len(rows)} run(s) in {workspace.runs_dir}", title_justify="left")
    for column in ("run", "experiment", "kind", "status", "test accuracy", "data", "started"):
        table.add_column(column, overflow="fold")
    for r in rows:
        accuracy = ((r["metrics"] or {}).get("test") or {}).get("accuracy")
        # a run of an outside checkpoint says so where its kind is: its accuracy is not the audited training's
        kind = f"{r['kind']} (not from the audited training)" if r["kind"] in ("eval", "export") else str(r["kind"])
        table.add_row(r["run_id"], str(r["exp_name"]), kind, str(r["status"]),
                      f"{accuracy:.4f}" if isinstance(accuracy, float) else "-", (r["data_version"] or "-")[:12], str(r["started_at"])[:19])
    logs.print_table(table)
    return 0


@runs_group.command("show")
@click.argument("ref", metavar="RUN")
@workdir_option
@json_option
def runs_show(ref: str, workdir: Optional[str], as_json: bool) -> int:
    """Show one run's record (and its notes).

    \b
    Example:
      veritrain runs show latest
    """
    from veritrain.records.journal import interrupted
    from veritrain.records.record import read_record
    from veritrain.records.registry import read_notes
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    run_dir = workspace.resolve_run(ref)
    if (pending := interrupted(run_dir, workspace.state_dir)) is not None:  # the record shown may be the old or the new one
        logs.log.warning("%s: %s", run_dir.name, pending.message)
    shown = {**read_record(run_dir), "notes": read_notes(run_dir)}  # the notes, kept outside the seal, shown with the record
    if as_json:
        emit_json(shown)
        return 0
    _render_record(run_dir, shown)
    return 0


def _render_record(run_dir: Any, record: dict[str, Any]) -> None:
    """`runs show` for people: what the run was, what it asked, what it gave, and how to check it."""
    from rich.table import Table

    from veritrain.core.config import RunConfig
    from veritrain.records.experiments import config_diff
    from veritrain.records.record import SEAL_FILE

    table = Table(title=f"run {record['run_id']} ({record.get('kind')}, {record['status']})", show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("experiment", str(record.get("exp_name")))
    table.add_row("started, ended", f"{record.get('started_at')}, {record.get('ended_at') or '-'}")
    table.add_row("hypothesis", record.get("hypothesis") or "-")
    if record.get("error"):
        table.add_row("error", f"{record['error'].get('type')}: {record['error'].get('message')}", style="yellow")
    try:
        defaults = RunConfig().model_dump(mode="json")
    except Exception:  # a default that cannot be built here (a plugin missing): show the config hash alone
        defaults = None
    changed = config_diff(defaults, record.get("config")) if defaults is not None else {}
    table.add_row("config", f"{record.get('config_hash')} ({run_dir / 'config.yaml'})")
    for key, (default, value) in changed.items():
        table.add_row(f"  {key}", f"{json.dumps(value)} (default {json.dumps(default)})")
    data = record.get("data") or {}
    table.add_row("data version", f"{data.get('version') or '-'} ({data.get('source')}; "
                  + ", ".join(f"{k} {v}" for k, v in (data.get("counts") or {}).items()) + ")")
    training = record.get("training") or {}
    if training:
        best = training.get("best_metric") or {}
        table.add_row("training", f"{training.get('epochs')} epochs, {training.get('steps')} steps; best epoch {training.get('best_epoch')}"
                      + (f" ({best.get('name')} {best['value']:.4f})" if isinstance(best.get("value"), float) else ""))
    for split, metrics in (record.get("metrics") or {}).items():
        shown = ", ".join(f"{name} {metrics[name]:.4f}" for name in HEADLINE_METRICS if isinstance(metrics.get(name), float))
        table.add_row(f"{split} metrics", shown or "-")
    for name, result in ((record.get("baselines") or {}).get("results") or {}).items():
        table.add_row(f"baseline {name}", f"accuracy {result.get('accuracy', float('nan')):.4f}")
    parity = (record.get("export") or {}).get("parity")
    if parity:
        table.add_row("export", ", ".join((record.get("export") or {}).get("files") or {}) + f"; parity {'passed' if parity.get('passed') else 'FAILED'}")
    table.add_row("final state", record.get("final_state_sha256") or "-")
    try:
        seal = (run_dir / SEAL_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        seal = "- (no record.sha256)"
    table.add_row("seal", seal)
    for old in record.get("seal_history") or []:
        table.add_row("  replaced seal", f"{old['seal']} (re-sealed by {old['by']} at {old['replaced_at']})")
    for event in record.get("events") or []:
        table.add_row(f"event {event.get('kind')}", (f"step {event['step']}: " if event.get("step") is not None else "") + str(event.get("detail") or ""))
    for note in record.get("notes") or []:
        label = "conclusion" if note.get("conclusion") else ("waived " + note["waive"] if note.get("waive") else "note")
        table.add_row(label, f"{note['text']} ({str(note.get('at', ''))[:19]})")
    table.add_row("files", f"{len(record.get('artifacts') or {})} in {run_dir}; check them: veritrain verify {record['run_id']} --expect {seal}")
    logs.print_table(table)


@runs_group.command("compare")
@click.argument("refs", nargs=-1, required=True, metavar="RUN RUN...")
@workdir_option
@json_option
def runs_compare(refs: tuple[str, ...], workdir: Optional[str], as_json: bool) -> int:
    """Config diff, metrics with deltas, data versions and environment differences between runs.

    \b
    Example:
      veritrain runs compare 20261129-1552 latest
    """
    from veritrain.records.experiments import compare, comparison_by_run
    from veritrain.records.record import read_record
    from veritrain.records.workspace import Workspace

    if len(refs) < 2:
        raise UserError("runs compare: give at least two runs")
    workspace = Workspace.open(workdir)
    comparison = compare([read_record(workspace.resolve_run(r)) for r in refs])
    if as_json:
        emit_json(comparison_by_run(comparison))
        return 0
    from veritrain.core.display import terminal_safe

    def echo(line: str) -> None:  # configs and environments come from the records: shown as written
        click.echo(terminal_safe(line))

    run_ids = comparison["run_ids"]
    for index, run_id in enumerate(run_ids[1:], start=1):
        echo(f"{run_id} vs {run_ids[0]}:")
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
    return 0


@runs_group.command("note")
@click.argument("ref", metavar="RUN")
@click.argument("text")
@click.option("--conclusion", is_flag=True, help="Mark the note as the run's conclusion.")
@click.option("--waive", "waive", default=None, metavar="ROW", help="Waive a `veritrain check` row (its id, e.g. beats_baseline) for the reason TEXT; it then shows as waived, never as pass.")
@workdir_option
@json_option
def runs_note(ref: str, text: str, conclusion: bool, waive: Optional[str], workdir: Optional[str], as_json: bool) -> int:
    """Add a note (or the conclusion) to a run; kept in runs/<id>/notes.jsonl, outside the seal.

    \b
    Examples:
      veritrain runs note latest "lr 3e-3 converges twice as fast" --conclusion
      veritrain runs note latest --waive beats_baseline "8x8 digits: the linear baseline is the ceiling"
    """
    from veritrain.orchestration import notes
    from veritrain.records.workspace import Workspace

    run_dir, note = notes.add(Workspace.open(workdir), ref, text, conclusion, waive)
    if as_json:
        emit_json({"run_id": run_dir.name, "note": note})
    logs.report(f"noted on {run_dir.name}")
    return 0


@runs_group.command("reindex")
@workdir_option
@json_option
def runs_reindex(workdir: Optional[str], as_json: bool) -> int:
    """Rebuild the run index and experiments.md from the run folders (the folders are the truth).

    \b
    Example:
      veritrain runs reindex
    """
    from veritrain.orchestration import pipeline
    from veritrain.records import registry
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    db = registry.sync(workspace.state_dir, workspace.runs_dir, rebuild=True)
    count = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    db.close()
    pipeline.update_experiments(workspace)
    if as_json:
        emit_json({"runs": count, "registry": str(workspace.state_dir / "registry.sqlite")})
    else:
        click.echo(f"indexed {count} run(s)")
    return 0


@cli.group("data")
def data_group() -> None:
    """Prepare, inspect and compare data versions."""


@data_group.command("prepare")
@config_argument
@set_option
@click.option("--rehash", is_flag=True, help="Hash every file again instead of trusting the stat cache.")
@workdir_option
@json_option
def data_prepare(config: Optional[str], overrides: tuple[str, ...], rehash: bool, workdir: Optional[str], as_json: bool) -> int:
    """Validate, split and store the data of a config as a data version (reused when unchanged).

    Bad files are quarantined (data.on_bad_file), duplicates kept in one split, and a report written
    beside the version in .veritrain/data/<version>/.

    \b
    Example:
      veritrain data prepare configs/digits.yaml --json
    """
    from veritrain.core.config import load_config
    from veritrain.data import prepare
    from veritrain.records.workspace import Workspace

    resolved = load_config(config, overrides)
    workspace = Workspace.open(workdir)
    data = prepare.run(resolved.config.data, resolved.data_paths, workspace.state_dir, rehash=rehash)
    report = data.report()
    root = resolved.data_paths.get("root") if resolved.config.data.source in ("imagefolder", "csv", "labelmap") else None
    payload = {
        "data_version": data.version,
        "counts": data.counts,
        # stored files name samples relative to data.root; what is printed also gives where they are now
        "quarantined": [{**q, "path": str(root / q["sample_id"]) if root else None} for q in report["quarantined"]],
        "findings": report["findings"],
        "leakage_pairs": report["leakage"]["cross_split_duplicate_pairs"],
        "split_files": {name: str(data.path / "splits" / f"{name}.txt") for name in data.splits},
        "report": {
            "json": str(data.path / "data_report.json"),
            "markdown": str(data.path / "data_report.md"),
            "charts": [str(data.path / c) for c in report["charts"]],
        },
        "reused": data.reused,
    }
    if as_json:
        emit_json(payload)
    _render_data_summary(data, report)
    return 0


def _render_data_summary(data: Any, report: dict[str, Any]) -> None:
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
    table.add_row("report", str(data.path / "data_report.md"))
    logs.print_table(table)


@data_group.command("report")
@click.argument("ref", metavar="VERSION|RUN")
@workdir_option
@json_option
def data_report(ref: str, workdir: Optional[str], as_json: bool) -> int:
    """Show the data report of a data version (id or prefix) or of the version a run used.

    \b
    Example:
      veritrain data report latest
    """
    from veritrain.records.workspace import Workspace

    path = Workspace.open(workdir).resolve_data_version(ref)
    if as_json:
        click.echo((path / "data_report.json").read_text(encoding="utf-8"), nl=False)
    else:
        click.echo((path / "data_report.md").read_text(encoding="utf-8"), nl=False)
    return 0


@data_group.command("diff")
@click.argument("old", metavar="V1")
@click.argument("new", metavar="V2")
@workdir_option
@json_option
def data_diff(old: str, new: str, workdir: Optional[str], as_json: bool) -> int:
    """Samples added, removed, relabelled or moved between splits from V1 to V2 (versions or runs).

    Samples are matched by key (content hash or the source's id), and each move is counted by its cause:
    under one split rule only samples whose key changed, whose group merged or split, or that were quarantined move.

    \b
    Example:
      veritrain data diff 6ee98039 3fa1c2d4
    """
    from veritrain.data.report import diff
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    result = diff(workspace.resolve_data_version(old), workspace.resolve_data_version(new))
    if as_json:
        emit_json(result)
        return 0
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
    return 0


@cli.group("config")
def config_group() -> None:
    """Inspect run configs."""


@config_group.command("show")
@config_argument
@set_option
@workdir_option
@json_option
def config_show(config: Optional[str], overrides: tuple[str, ...], workdir: Optional[str], as_json: bool) -> int:
    """Print the resolved config (defaults filled in, overrides applied, validated).

    \b
    Example:
      veritrain config show configs/digits.yaml --set optim.lr=0.01
    """
    from veritrain.core.config import load_config, to_yaml

    resolved = load_config(config, overrides)
    if as_json:
        emit_json({"config": resolved.as_dict(), "config_hash": resolved.hash, "source": resolved.source_label})
    else:
        click.echo(f"# {resolved.source_label}, config_hash {resolved.hash}")
        click.echo(to_yaml(resolved.config), nl=False)
    return 0


@config_group.command("keys")
@workdir_option
@json_option
def config_keys(workdir: Optional[str], as_json: bool) -> int:
    """List every config key with its type, default and meaning (the table in docs/config.md).

    \b
    Example:
      veritrain config keys
    """
    from veritrain.core.config import reference_markdown, reference_rows

    if as_json:
        emit_json({"keys": [dict(zip(("key", "type", "default", "meaning"), row)) for row in reference_rows()]})
    else:
        click.echo(reference_markdown(), nl=False)
    return 0


@cli.command("ui")
@workdir_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on; anything but a loopback address shows your runs to the network.")
@click.option("--port", type=click.IntRange(min=1, max=65535), default=8765, show_default=True, help="Port to listen on.")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in the default browser.")
def ui_command(workdir: Optional[str], host: str, port: int, open_browser: bool) -> int:
    """Browse the runs of the workspace in a local web page (read-only): the runs table, run pages with
    curves, evaluation images and the checklist, comparisons, data versions and the experiment log.

    \b
    Example:
      veritrain ui --port 8765
    """
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("install the ui extra: pip install 'veritrain[ui]'") from None
    from veritrain.records.workspace import Workspace
    from veritrain.web.server import serve

    workspace = Workspace.open(workdir)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: ui: listening on {host}, not a loopback address: anyone who can reach it can read every run of {workspace.root}", err=True)
    click.echo(f"veritrain ui: {url} (Ctrl-C stops it)", err=True)
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    serve(workspace, host, port)
    return 0


@cli.command("publish")
@click.argument("refs", nargs=-1, metavar="[RUN...]")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="The folder to write the site into.")
@click.option("--with-archives", is_flag=True, help="Write each run's archive (with its data version) beside its page.")
@workdir_option
@json_option
def publish_command(refs: tuple[str, ...], out: str, with_archives: bool, workdir: Optional[str], as_json: bool) -> int:
    """Write the run pages as a static site (relative links, no network): runs that do not verify are refused.

    Without RUN, every completed run is published.

    \b
    Example:
      veritrain publish latest --out site/ --with-archives
    """
    from pathlib import Path

    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise UserError("install the ui extra: pip install 'veritrain[ui]'") from None
    from veritrain.records import registry
    from veritrain.records.workspace import Workspace
    from veritrain.web.publish import publish

    workspace = Workspace.open(workdir)
    if refs:
        run_dirs = list(dict.fromkeys(workspace.resolve_run(r) for r in refs))
    else:
        rows = registry.query(workspace.state_dir, workspace.runs_dir, ("completed",))
        run_dirs = [workspace.runs_dir / r["run_id"] for r in sorted(rows, key=lambda r: r["started_at"] or "")]
    if not run_dirs:
        raise UserError(f"publish: no completed runs in {workspace.runs_dir}; name runs or start one with `veritrain run`")
    outside = [d.name for d in run_dirs if d.parent != workspace.runs_dir.resolve()]
    if outside:
        raise UserError(f"publish: {outside[0]} is not a run of this workspace; import it first (`veritrain import`) or pass --workdir")
    result = publish(workspace, run_dirs, Path(out), with_archives)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"published {len(result['runs'])} run(s), {len(result['data_versions'])} data version(s) to {result['out']}/index.html"
                   + (f" with {len(result['archives'])} archive(s)" if result["archives"] else ""))
    return 0


def main(argv: Optional[list[str]] = None) -> None:
    from veritrain.core.secrets import redacting_excepthook

    if argv is None:  # the `veritrain` process itself (not a caller's): a bug's traceback is shown redacted
        sys.excepthook = redacting_excepthook
    logs.setup_console_logging()
    logs.reports_to_stderr(False)
    _JSON_WRITTEN["done"] = False
    wants_json = "--json" in (sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(args=argv, prog_name="veritrain", standalone_mode=False)
    except click.exceptions.Exit as err:
        code = err.exit_code
    except click.UsageError as err:
        command = err.ctx.command_path if err.ctx else "veritrain"
        message = " ".join(err.format_message().split()).replace(". Did you mean", "; did you mean").rstrip(".")  # one line
        _error(f"{command}: {message} (see `{command} --help`)", UserError.exit_code, wants_json)
    except click.Abort:
        _error("interrupted", 130, wants_json)
    except (VeritrainError, Interrupted) as err:
        _error(str(err), err.exit_code, wants_json)
    except KeyboardInterrupt:
        _error("interrupted by SIGINT", 130, wants_json)
    except OSError as err:
        if err.errno not in FULL_DISK:
            raise
        _error(f"{err.filename or 'a file'}: {err.strerror or 'no space left'}; free some space (or make it writable) and run the command again", 1, wants_json)
    except sqlite3.OperationalError as err:
        if "full" not in str(err) and "I/O" not in str(err) and "readonly" not in str(err):
            raise
        _error(f"the workspace's index: {err}; free some space (or make it writable) and run the command again", 1, wants_json)
    sys.exit(code if isinstance(code, int) else 0)


FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # errors of the machine, not of veritrain: one line, exit 1


def _error(message: str, code: int, as_json: bool = False) -> None:
    """The one error line on stderr; with --json, also `{"error": {"message", "exit_code"}}` on stdout, unless the
    command already printed its JSON document (a failed check prints its result, then fails)."""
    from veritrain.core.secrets import redact_text

    shown = redact_text(message)  # a message may quote a value given on the command line
    if as_json and not _JSON_WRITTEN["done"]:
        click.echo(json.dumps({"error": {"message": shown, "exit_code": code}}, indent=2))
    sys.stdout.flush()
    print(f"error: {shown}", file=sys.stderr)
    sys.exit(code)
