"""The commands over the workspace's runs: the `runs` group (list, show, compare, note, reindex, export), `gc`, the
run browser (`ui`) and the static site (`publish`)."""

from __future__ import annotations

from typing import Optional

import click

from veritrain.cli import render
from veritrain.cli.options import json_option, workdir_option
from veritrain.cli.render import emit_json
from veritrain.core import logs
from veritrain.core.errors import RunFailed, UserError


@click.group("runs")
def runs_group() -> None:
    """List, show, compare and annotate runs (an index of the run folders)."""


@runs_group.command("list")
@click.option("--status", multiple=True, type=click.Choice(["running", "completed", "failed", "interrupted", "pruned"]), help="Only runs with this status (repeatable).")
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
    render.runs_table(rows, workspace.runs_dir)
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
    record = read_record(run_dir)  # with its amendments applied
    shown = {**record, "notes": read_notes(run_dir),  # the notes, kept outside the seal, shown with the record
             "amendments": [{"index": link.index, "by": link.by, "at": link.at, "seal": link.seal, "key_fingerprint": link.signer}
                            for link in record.amendments]}
    if as_json:
        emit_json(shown)
        return 0
    render.run_record(run_dir, shown, record)
    return 0


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
    render.run_comparison(comparison)
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


def _export_target(ctx: click.Context, param: click.Parameter, value: tuple[str, str]) -> tuple[str, str]:
    if value[1].startswith("-"):  # click hands the next word to `--to` whatever it is: `--to mlflow --json` has no folder
        raise click.BadParameter(f"{value[0]} {value[1]}: give the folder after the format, e.g. --to mlflow out/")
    return value


@runs_group.command("export")
@click.argument("refs", nargs=-1, required=True, metavar="RUN...")
@click.option("--to", "target", nargs=2, required=True, type=(click.Choice(["mlflow"]), click.Path(file_okay=False)), metavar="FORMAT DIR",
              callback=_export_target,
              help="The format (mlflow: DIR/mlflow.db, the SQLite tracking store, and DIR/artifacts) and the folder to write it into.")
@workdir_option
@json_option
def runs_export(refs: tuple[str, ...], target: tuple[str, str], workdir: Optional[str], as_json: bool) -> int:
    """Export runs whose seal holds to MLflow: params, metrics per epoch and final, tags with the seal and data
    version, the record, evaluation and export as artifacts. A run already there with the same seal is left as it is.

    \b
    Example:
      veritrain runs export latest --to mlflow out/
    """
    from pathlib import Path

    from veritrain.records.record import read_record
    from veritrain.records.workspace import Workspace
    from veritrain.trust import mlflow_export

    workspace = Workspace.open(workdir)
    run_dirs = list(dict.fromkeys(workspace.resolve_run(r) for r in refs))
    result = mlflow_export.export(workspace, [read_record(d) for d in run_dirs], Path(target[1]))
    if as_json:
        emit_json(result)
    else:
        render.exported_to_mlflow(result)
    return 0


@click.command("gc")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--drop-journal", "drop_journal", default=None, metavar="RUN",
              help="Only remove the run's amend journal (.veritrain/journal/RUN/) without applying it, whatever it holds; the run stays "
                   "as its files are now (check it with `veritrain verify RUN`). For a journal that was refused or is not to be trusted.")
@workdir_option
@json_option
def gc_command(dry_run: bool, drop_journal: Optional[str], workdir: Optional[str], as_json: bool) -> int:
    """Remove step checkpoints of completed runs (best/last and those kept for audit stay), data versions no run references
    and stale locks; a run that loses files gets a sealed amendment that retires them, with a `gc` event.

    Amends an earlier veritrain began and a kill interrupted are completed or rolled back first; a journal whose plan reaches outside its run, or is not one
    veritrain wrote, stops gc (exit 1) before anything is changed: `--drop-journal RUN` removes it.

    \b
    Examples:
      veritrain gc --dry-run
      veritrain gc --drop-journal 20261129-1552
    """
    from veritrain.orchestration import housekeeping
    from veritrain.records.workspace import Workspace

    if drop_journal is not None:
        dropped = housekeeping.drop_journal(Workspace.open(workdir), drop_journal, dry_run)
        if as_json:
            emit_json(dropped)
        run_id = dropped["dropped_journal"]
        logs.report(f"{'would remove' if dry_run else 'removed'} the journal {dropped['removed'][0]} without applying it; "
                    f"run {run_id} is as its files are now: check it with `veritrain verify {run_id}`")
        return 0
    result = housekeeping.gc(Workspace.open(workdir), dry_run)
    if as_json:
        emit_json(result)
    else:
        render.collected(result, dry_run)
    if result["unverified"]:
        raise RunFailed(f"gc: {len(result['unverified'])} run(s) left alone because they do not verify; the first: {result['unverified'][0]}")
    return 0


@click.command("ui")
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


@click.command("publish")
@click.argument("refs", nargs=-1, metavar="[RUN...]")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="The folder to write the site into.")
@click.option("--with-archives", is_flag=True, help="Write each run's archive (with its data version) beside its page.")
@workdir_option
@json_option
def publish_command(refs: tuple[str, ...], out: str, with_archives: bool, workdir: Optional[str], as_json: bool) -> int:
    """Write the run pages as a static site (relative links, no network): runs that do not verify are left out.

    Without RUN, every completed run that verifies is published, each one that does not is named, and the
    command exits 1 if it skipped any; a RUN named that does not verify is refused.

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
    result = publish(workspace, run_dirs, Path(out), with_archives, named=bool(refs))
    if as_json:
        emit_json(result)
    else:
        render.published(result)
    for item in result["skipped"]:  # the whole workspace: the runs that do not verify are named, and the command fails
        click.echo(f"publish: skipped {item['run_id']}: {item['reason']}; the run does not verify, see `veritrain verify {item['run_id']}`", err=True)
    if result["skipped"]:
        raise RunFailed(f"publish: {len(result['skipped'])} run(s) skipped because they do not verify; the {len(result['runs'])} that verify are published")
    return 0
