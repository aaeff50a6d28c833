"""The commands that check a run and carry it elsewhere: `verify`, `check`, `reproduce`, `audit`, `archive` and
`import`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from veritrain.cli import render
from veritrain.cli.options import json_option, policy_options, replay_options, trust_code_option, use_current_code_option, workdir_option
from veritrain.cli.render import emit_json
from veritrain.core.errors import RunFailed


@click.command("verify")
@click.argument("ref", metavar="RUN|ARCHIVE")
@policy_options
@click.option("--strict", is_flag=True, help="Also fail on environment drift and on raw data that is not present.")
@workdir_option
@json_option
def verify_command(ref: str, expect: Optional[str], public_key: Optional[str], trusted_keys: Optional[str], require_signature: bool,
                   min_format: Optional[int], strict: bool, workdir: Optional[str], as_json: bool) -> int:
    """Re-hash every file of a run against its sealed record, check the seal, the data version and the provenance statement.

    Exit 0 only when everything holds; 1 names every problem. It prints who signed the run and the record format it
    was judged under, with what that format leaves unchecked; the options say what you require in advance. An archive
    file (`veritrain archive`) is checked as `import` checks it and verified without importing it.

    \b
    Example:
      veritrain verify latest --expect 63a6a0c8...
      veritrain verify latest --public-key signing-key.pub.pem --min-format 1
      veritrain verify run.tar.gz --trusted-keys team-keys
    """
    from veritrain.records.workspace import Workspace
    from veritrain.trust.policy import from_options
    from veritrain.trust.verify import verify_and_keep

    policy = from_options(expect, public_key, trusted_keys, require_signature, min_format, strict)
    given = Path(ref).expanduser()
    if given.is_file():  # an archive: checked as import checks it and verified in a scratch workspace, nothing imported
        from veritrain.trust.archive import verify_archive

        result = verify_archive(given, policy)
        run_id = result["run_id"]
    else:
        workspace = Workspace.open(workdir)
        run_dir = workspace.resolve_run(ref)
        run_id = run_dir.name
        result = {"run_id": run_id, **verify_and_keep(run_dir, workspace.state_dir, policy)}  # kept for `ui` and `check`
    if as_json:
        emit_json(result)
    render.verify_findings(result)
    if not result["ok"]:
        raise RunFailed(f"verify {run_id}: {len(result['problems'])} problem(s)" + (f", {len(result['drift'])} drift(s) with --strict" if strict and result["drift"] else "")
                        + (f": {', '.join(p['path'] for p in result['problems'][:3])}" if result["problems"] else ""))
    render.verified(run_id, result)
    return 0


@click.command("check")
@click.argument("ref", metavar="RUN")
@policy_options
@workdir_option
@json_option
def check_command(ref: str, expect: Optional[str], public_key: Optional[str], trusted_keys: Optional[str], require_signature: bool,
                  min_format: Optional[int], workdir: Optional[str], as_json: bool) -> int:
    """The completion checklist of a run: data, environment, training, evaluation, export, archive.

    One row per item with pass / fail / missing / n/a / waived and the fix that clears it; exit 1 if
    any item fails or is missing. A row that cannot pass for a stated reason is waived with a note:
    `veritrain runs note RUN --waive ROW "reason"`. The policy options are verify's: the signer row fails when a
    required signature is missing or by another key.

    \b
    Example:
      veritrain check latest
      veritrain check latest --trusted-keys team-keys
    """
    from veritrain.records.workspace import Workspace
    from veritrain.trust.check import PASSING, check_run
    from veritrain.trust.policy import from_options

    policy = from_options(expect, public_key, trusted_keys, require_signature, min_format)
    workspace = Workspace.open(workdir)
    result = check_run(workspace.resolve_run(ref), workspace.state_dir, policy=policy)
    if as_json:
        emit_json(result)
    render.checklist(result)
    bad = [i["item"] for i in result["items"] if i["status"] not in PASSING]
    if bad:
        raise RunFailed(f"check {result['run']}: {len(bad)} item(s) not passed: {'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}")
    return 0


@click.command("archive")
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
        render.archived(result)
    return 0


@click.command("import")
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
        render.imported(result)
    render.imported_code(result)
    return 0


@click.command("reproduce")
@click.argument("ref", metavar="RUN")
@trust_code_option()
@use_current_code_option(help="Train the reproduction with the current user code instead of the copies recorded with the run.")
@replay_options
@workdir_option
@json_option
def reproduce_command(ref: str, trust_code: bool, use_current_code: bool, python: Optional[str], inputs_root: Optional[str],
                      workdir: Optional[str], as_json: bool) -> int:
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

    result = reproduce(Workspace.open(workdir), ref, pipeline.python_argv(), trust_code=trust_code, use_current_code=use_current_code,
                       python=python, inputs_root=inputs_root)
    if as_json:
        emit_json(result)
    render.reproduction(result)
    if result["error"]:
        raise RunFailed(f"reproduce: the new run did not complete: {result['error']}")
    if result["verdict"] == "differs":
        raise RunFailed(f"reproduce: run {result['reproduction']} differs from {result['original']}")
    return 0


@click.command("audit")
@click.argument("ref", metavar="RUN")
@click.option("--segments", type=click.IntRange(min=1), default=2, show_default=True, help="How many segments of the trajectory to replay, drawn at random.")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=None, help="Repeat an earlier audit's draw (default: a fresh random seed, printed).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the result (JSON) to this file, outside the run.")
@trust_code_option()
@policy_options
@replay_options
@workdir_option
@json_option
def audit_command(ref: str, segments: int, seed: Optional[int], out: Optional[str], trust_code: bool, expect: Optional[str],
                  public_key: Optional[str], trusted_keys: Optional[str], require_signature: bool, min_format: Optional[int],
                  python: Optional[str], inputs_root: Optional[str], workdir: Optional[str], as_json: bool) -> int:
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
    from veritrain.trust.policy import from_options

    policy = from_options(expect, public_key, trusted_keys, require_signature, min_format)
    result = audit.run(Workspace.open(workdir), ref, segments, seed, Path(out) if out else None, trust_code=trust_code, policy=policy,
                       python=python, inputs_root=Path(inputs_root) if inputs_root else None)
    if as_json:
        emit_json(result)
    render.audit(result)
    if result["verdict"] != "identical":
        bad = [str(v["segment"]) for v in result["segments"] if v["verdict"] == "differs"]
        results = [r["what"] for r in result["results"] if r["verdict"] == "differs"]
        raise RunFailed(f"audit {result['run_id']}: " + (f"segment(s) {', '.join(bad)} differ from the recorded trajectory: "
                        "the weights did not come from the recorded training on this data" if bad else
                        f"{', '.join(results)} differ from what the trajectory entry gives: the results did not come from the audited training"))
    return 0
