"""The `veritrain` command: parse arguments, call one library function, render, exit.

Exit codes: 0 success; 1 the command ran and found a problem (failed run); 2 it could not start
(bad usage, config or missing input); 130/143 interrupted by SIGINT/SIGTERM. Errors are one line on
stderr (`error: ...`); `--json` prints exactly one JSON document on stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import click

from veritrain import __version__, logs
from veritrain.errors import Interrupted, RunFailed, UserError, VeritrainError

workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Workspace folder holding runs/ and .veritrain/ (default: the current directory).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; progress goes to stderr.")
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a config value, e.g. --set train.epochs=5 (repeatable; values are YAML).",
)
config_argument = click.argument("config", required=False, type=click.Path(dir_okay=True))


def emit_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, sort_keys=False))


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
@workdir_option
@json_option
def run_command(config: Optional[str], overrides: tuple[str, ...], repeat: int, workdir: Optional[str], as_json: bool) -> int:
    """Prepare data, train and evaluate: one recorded run.

    CONFIG is a YAML run config; without it the built-in default runs (scikit-learn's bundled digits,
    the same as configs/digits.yaml).

    \b
    Example:
      veritrain run configs/digits.yaml --set train.epochs=5
    """
    from veritrain import pipeline
    from veritrain.config import load_config
    from veritrain.workspace import Workspace

    resolved = load_config(config, overrides)
    workspace = Workspace.open(workdir)
    if repeat == 1:
        outcome = pipeline.run(resolved, workspace, pipeline.python_argv())
        return _finish_run(outcome, as_json)
    from veritrain import repeats

    result = repeats.run(resolved, workspace, pipeline.python_argv(), repeat)
    if as_json:
        emit_json(result)
    _render_repeat_summary(result)
    if result["failed"]:
        raise RunFailed(f"{len(result['failed'])} of {repeat} runs failed: {', '.join(result['failed'])}")
    return 0


@cli.command("train")
@config_argument
@set_option
@click.option("--resume", "resume_ref", metavar="RUN|auto", help="Continue RUN (id, prefix, latest or folder) from its newest valid checkpoint; "
              "`auto`: the newest interrupted run of this config and data version.")
@workdir_option
@json_option
def train_command(config: Optional[str], overrides: tuple[str, ...], resume_ref: Optional[str], workdir: Optional[str], as_json: bool) -> int:
    """Train only (preparing the data version if needed), or resume an interrupted run.

    A run killed at any moment and resumed ends with the same weights as one never interrupted.

    \b
    Examples:
      veritrain train configs/digits.yaml --set checkpoint.every_steps=50
      veritrain train --resume latest
    """
    from veritrain import pipeline
    from veritrain.config import load_config
    from veritrain.workspace import Workspace

    workspace = Workspace.open(workdir)
    if resume_ref and resume_ref != "auto":
        if config or overrides:
            raise UserError(f"--resume {resume_ref}: a resumed run keeps its own recorded config; drop CONFIG and --set")
        outcome = pipeline.resume(workspace, resume_ref, pipeline.python_argv())
    elif resume_ref == "auto":
        outcome = pipeline.resume(workspace, "auto", pipeline.python_argv(), match=load_config(config, overrides))
    else:
        outcome = pipeline.run(load_config(config, overrides), workspace, pipeline.python_argv(), kind="train")
    return _finish_run(outcome, as_json)


def _finish_run(outcome: Any, as_json: bool) -> int:
    if as_json:
        emit_json(outcome.summary)
    _render_run_summary(outcome)
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
    logs.console.print(table)


def _render_repeat_summary(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{len(result['runs'])} seeds (group {result['group']})", title_justify="left")
    for column in ("metric", "mean ± std", "95% interval", "seeds"):
        table.add_column(column)
    for name, s in result["summary"].items():
        table.add_row(name, f"{s['mean']:.4f} ± {s['std']:.4f}", f"[{s['ci95'][0]:.4f}, {s['ci95'][1]:.4f}]", str(s["n"]))
    for name, s in result.get("baselines", {}).items():
        table.add_row(f"baseline {name}", f"{s['accuracy']:.4f}", "-", "-")
    if result.get("warning"):
        table.add_row("warning", result["warning"], "", "", style="yellow")
    logs.console.print(table)
    for run in result["runs"]:
        logs.console.print(f"  {run['run_id']}  seed {run['seed']}  {run['status']}", markup=False)


# ---------------------------------------------------------------- stages on a finished run


@cli.command("eval")
@click.argument("ref", metavar="RUN", required=False)
@click.option("--checkpoint", "which", default="best", show_default=True, metavar="best|last|PATH", help="Checkpoint to evaluate.")
@click.option("--split", type=click.Choice(["test", "val"]), default=None, help="Split to evaluate on (default: the run's eval.split).")
@click.option("--predictions", type=click.Path(dir_okay=False), default=None, help="Recompute every metric from a predictions.csv alone (no RUN).")
@click.option("--allow-data-drift", is_flag=True, help="Evaluate even when the data no longer matches the run's data version (recorded).")
@workdir_option
@json_option
def eval_command(ref: Optional[str], which: str, split: Optional[str], predictions: Optional[str], allow_data_drift: bool,
                 workdir: Optional[str], as_json: bool) -> int:
    """Evaluate a run's checkpoint on its fixed split; writes eval/<split>/ and re-seals the run.

    \b
    Examples:
      veritrain eval latest --checkpoint best --split test
      veritrain eval --predictions runs/<id>/eval/test/predictions.csv --json
    """
    from pathlib import Path

    from veritrain import evaluate

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
        from veritrain import pipeline
        from veritrain.train.loop import resolve_device
        from veritrain.workspace import Workspace

        workspace = Workspace.open(workdir)
        opened = pipeline.open_run(workspace, ref, allow_data_drift)
        baselines = opened.record.get("baselines")
        metrics = evaluate.run(opened.config, opened.data, opened.task, opened.run_dir, resolve_device(opened.config.train.device),
                               which, split, baselines=baselines)
        opened.record.setdefault("metrics", {})[metrics["split"]] = metrics
        seal = pipeline.amend(opened, workspace, "eval", f"{metrics['checkpoint']} on {metrics['split']}: accuracy {metrics.get('accuracy', float('nan')):.4f}")
        logs.console.print(f"eval written to {opened.run_dir / 'eval' / metrics['split']}; run re-sealed: {seal}", markup=False)
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
    logs.console.print(table)


@cli.command("baseline")
@click.argument("ref", metavar="RUN|CONFIG")
@set_option
@workdir_option
@json_option
def baseline_command(ref: str, overrides: tuple[str, ...], workdir: Optional[str], as_json: bool) -> int:
    """Majority-class and logistic-regression baselines on the same splits as a run (or a config).

    \b
    Examples:
      veritrain baseline latest
      veritrain baseline configs/digits.yaml --json
    """
    import json
    from pathlib import Path

    from veritrain import pipeline
    from veritrain.workspace import Workspace

    workspace = Workspace.open(workdir)
    if Path(ref).is_file():
        from veritrain.config import load_config

        outcome = pipeline.run(load_config(ref, overrides), workspace, pipeline.python_argv(), kind="baseline")
        if outcome.error is not None:
            raise outcome.error
        result = outcome.record["baselines"]
        result["run_id"] = outcome.summary["run_id"]
    else:
        if overrides:
            raise UserError("--set: a run's baselines use its recorded config; drop --set")
        opened = pipeline.open_run(workspace, ref)
        if not hasattr(opened.task, "baselines"):
            raise UserError(f"{ref}: the task {opened.config.task!r} has no baselines")
        result = opened.task.baselines(opened.data, opened.config)
        result["margin"] = opened.config.eval.baseline_margin
        (opened.run_dir / "eval").mkdir(exist_ok=True)
        (opened.run_dir / "eval" / "baselines.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        opened.record["baselines"] = result
        pipeline.amend(opened, workspace, "baselines", ", ".join(f"{k} {v['accuracy']:.4f}" for k, v in result["results"].items()))
        result["run_id"] = opened.run_dir.name
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
@click.option("--checkpoint", "which", default="best", show_default=True, metavar="best|last|PATH", help="Checkpoint to export.")
@workdir_option
@json_option
def export_command(ref: str, formats: tuple[str, ...], which: str, workdir: Optional[str], as_json: bool) -> int:
    """Export a run's model (ONNX, TorchScript, safetensors) with model.json and a parity check.

    Exits 1 when an exported model does not give the trained model's answers on real test samples.

    \b
    Example:
      veritrain export latest --format onnx
    """
    from veritrain import export, pipeline
    from veritrain.workspace import Workspace

    workspace = Workspace.open(workdir)
    opened = pipeline.open_run(workspace, ref)
    try:
        description = export.run(opened.config, opened.data, opened.task, opened.run_dir, which, formats or None)
    except RunFailed:
        import json

        parity = json.loads((opened.run_dir / "export" / "parity.json").read_text())
        opened.record["export"] = {"parity": parity}
        pipeline.amend(opened, workspace, "export", f"parity FAILED: {parity['reason']}")
        raise
    opened.record["export"] = {"files": description["files"], "parity": description["parity"]}
    pipeline.amend(opened, workspace, "export", f"{', '.join(description['files'])}; parity passed")
    if as_json:
        emit_json(description)
    else:
        click.echo(f"exported {', '.join(description['files'])} to {opened.run_dir / 'export'}; parity passed")
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

    from veritrain import export
    from veritrain.workspace import Workspace

    candidate = Path(ref)
    base = candidate if candidate.is_dir() and ((candidate / "model.json").exists() or (candidate / "export").is_dir()) else Workspace.open(workdir).resolve_run(ref)
    results = export.predict(export.find_export(base), files, top)
    if as_json:
        emit_json({"results": results})
    else:
        for r in results:
            shown = ", ".join(f"{t['label']} {t['prob']:.4f}" for t in r["top"]) if r["ok"] else f"error: {r['error']}"
            click.echo(f"{r['file']}: {shown}")
    failed = [r["file"] for r in results if not r["ok"]]
    if failed:
        raise RunFailed(f"{len(failed)} of {len(results)} file(s) could not be predicted: {', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}")
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
    from veritrain.config import load_config
    from veritrain.data import prepare
    from veritrain.workspace import Workspace

    resolved = load_config(config, overrides)
    workspace = Workspace.open(workdir)
    data = prepare.run(resolved.config.data, resolved.data_paths, workspace.state_dir, rehash=rehash)
    report = data.report()
    payload = {
        "data_version": data.version,
        "counts": data.counts,
        "quarantined": report["quarantined"],
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
    logs.console.print(table)


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
    from veritrain.workspace import Workspace

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

    \b
    Example:
      veritrain data diff 6ee98039 3fa1c2d4
    """
    from veritrain.data.report import diff
    from veritrain.workspace import Workspace

    workspace = Workspace.open(workdir)
    result = diff(workspace.resolve_data_version(old), workspace.resolve_data_version(new))
    if as_json:
        emit_json(result)
        return 0
    click.echo(f"{result['old'][:12]} → {result['new'][:12]}")
    for key in ("added", "removed", "content_changed"):
        click.echo(f"{key}: {len(result[key])}" + (f"  ({', '.join(result[key][:5])}{', ...' if len(result[key]) > 5 else ''})" if result[key] else ""))
    for key in ("relabelled", "moved"):
        items = result[key]
        shown = ", ".join(f"{item['sample_id']}: {item['old']} → {item['new']}" for item in items[:5])
        click.echo(f"{key}: {len(items)}" + (f"  ({shown}{', ...' if len(items) > 5 else ''})" if items else ""))
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
    from veritrain.config import load_config, to_yaml

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
    from veritrain.config import reference_markdown, reference_rows

    if as_json:
        emit_json({"keys": [dict(zip(("key", "type", "default", "meaning"), row)) for row in reference_rows()]})
    else:
        click.echo(reference_markdown(), nl=False)
    return 0


def main(argv: Optional[list[str]] = None) -> None:
    logs.setup_console_logging()
    try:
        code = cli.main(args=argv, prog_name="veritrain", standalone_mode=False)
    except click.exceptions.Exit as err:
        code = err.exit_code
    except click.UsageError as err:
        command = err.ctx.command_path if err.ctx else "veritrain"
        message = " ".join(err.format_message().split()).replace(". Did you mean", "; did you mean").rstrip(".")  # one line
        _error(f"{command}: {message} (see `{command} --help`)", UserError.exit_code)
    except click.Abort:
        _error("interrupted", 130)
    except (VeritrainError, Interrupted) as err:
        _error(str(err), err.exit_code)
    except KeyboardInterrupt:
        _error("interrupted by SIGINT", 130)
    sys.exit(code if isinstance(code, int) else 0)


def _error(message: str, code: int) -> None:
    sys.stdout.flush()
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)
