"""The commands over what runs start from: the `data` group (prepare, report, croissant, diff, order) and the `config`
group (show, keys)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import click

from veritrain.cli import render
from veritrain.cli.options import config_argument, json_option, set_option, workdir_option
from veritrain.cli.render import emit_json
from veritrain.core.errors import UserError

log = logging.getLogger("veritrain")


@click.group("data")
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
    render.data_summary(data, report)
    return 0


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


@data_group.command("croissant")
@click.argument("ref", metavar="VERSION")
@click.option("--out", "out", required=True, metavar="FILE", help="Where to write the Croissant JSON-LD (outside the version folder).")
@click.option("--base", metavar="URL", help="Prefix of the files' contentUrl (where the version's files will be published); default: their local paths.")
@workdir_option
@json_option
def data_croissant(ref: str, out: str, base: Optional[str], workdir: Optional[str], as_json: bool) -> int:
    """Write the MLCommons Croissant record of a data version (id, prefix, or the version a run used), with its current card.

    Any version, those prepared before veritrain wrote Croissant records included; the version itself is never
    changed. `mlcroissant validate --jsonld FILE` checks it; it warns only for card fields left empty, listed here.

    \b
    Example:
      veritrain data croissant latest --out croissant.json
    """
    from veritrain.core.files import output_file_problem
    from veritrain.data import croissant
    from veritrain.data.identity import load_version
    from veritrain.records.workspace import Workspace

    path = Workspace.open(workdir).resolve_data_version(ref)
    load_version(path)  # a damaged version is refused before anything is written from it
    target = Path(out).expanduser()
    if target.resolve().is_relative_to(path.resolve()):
        raise UserError(f"--out: {out}: inside the data version's folder, which is never changed; write it elsewhere")
    if (problem := output_file_problem(target)) is not None:
        raise UserError(f"--out: {out}: {problem}")
    warnings = croissant.write(path, target, base=base)
    result = {"data_version": path.name, "out": str(target), "warnings": warnings}
    if as_json:
        emit_json(result)
    for warning in warnings:
        log.warning("croissant: %s", warning)
    click.echo(f"wrote {target} (Croissant 1.0 record of data version {path.name[:12]}); check it with: mlcroissant validate --jsonld {target}")
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
    render.data_diff(result)
    return 0


@data_group.command("order")
@click.argument("ref", metavar="RUN")
@click.option("--steps", "steps", required=True, metavar="A:B", help="Optimizer steps A … B−1 (0-based).")
@workdir_option
@json_option
def data_order(ref: str, steps: str, workdir: Optional[str], as_json: bool) -> int:
    """The training order of a run's steps: which windows (a language model) or samples each step trained on,
    recomputed from the recorded seed and sizes alone, and their SHA-256.

    \b
    Example:
      veritrain data order latest --steps 0:10
    """
    from veritrain.orchestration.housekeeping import data_order as order_of
    from veritrain.records.workspace import Workspace
    from veritrain.trust.opening import open_run

    first, sep, last = steps.partition(":")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit():
        raise UserError(f"--steps: {steps!r}; give A:B, two whole numbers (optimizer steps, 0-based, B excluded), e.g. 0:10")
    workspace = Workspace.open(workdir)
    result = order_of(workspace, open_run(workspace, ref), int(first), int(last))
    if as_json:
        emit_json(result)
        return 0
    render.data_order(result)
    return 0


@click.group("config")
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
    from veritrain.core.config import load_config

    resolved = load_config(config, overrides)
    if as_json:
        emit_json({"config": resolved.as_dict(), "config_hash": resolved.hash, "source": resolved.source_label})
    else:
        render.config_yaml(resolved)
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
