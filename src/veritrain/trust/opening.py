"""Opening a finished run for a command that works on it (eval, export, baseline, audit, reproduce): its record, config,
task and data version, after checking that it verifies and that the code its config names may run.

A run this workspace did not start is data until the user trusts its code (`--trust-code`); a run that does not
verify is never re-sealed (`refuse_unverified`), so no command launders a change to it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from veritrain.core.config import RunConfig, resolved_from_record
from veritrain.core.errors import RunFailed, UserError
from veritrain.records import journal, usercode
from veritrain.records.record import Record, read_record
from veritrain.records.workspace import Workspace
from veritrain.tasks import get_task

if TYPE_CHECKING:  # imported for types only: the data and task modules load torch and numpy
    from veritrain.data.prepare import DataVersion
    from veritrain.tasks import Task

log = logging.getLogger("veritrain")


@dataclass
class OpenRun:
    run_dir: Path
    record: Record
    config: RunConfig
    data: DataVersion
    drift: Optional[str] = None  # why the data differs from the recorded version, when allowed
    built: Optional[Task] = None

    @property
    def task(self) -> Task:
        """The run's task, built when first asked for: a command asks inside the run's code session, after importing
        the code the config names, so a task an entry point names is the recorded copy."""
        if self.built is None:
            self.built = get_task(self.config)
        return self.built


def open_run(workspace: Workspace, ref: str, allow_data_drift: bool = False, trust_code: bool = False, need: str = "any",
             verified: bool = False) -> OpenRun:
    """A finished run with its config, task and recorded data version, for eval/export/baseline.

    The data is prepared again from the raw files when they are present (fast when unchanged) and must
    give the recorded version; without raw files the stored version is used as it is.
    """
    run_dir = workspace.resolve_run(ref, need)  # `need`: what `latest` must have (workspace.LATEST)
    if not verified:  # an amend a kill interrupted is completed or rolled back before anything reads the run
        journal.recover(workspace, run_dir)
    record = read_record(run_dir)
    if record.get("status") == "running" and not workspace.lock_is_stale(run_dir.name):
        raise UserError(f"{ref}: run {run_dir.name} is still running; wait for it to finish")
    resolved = resolved_from_record(record)
    cfg = resolved.config
    if not verified:  # the caller (audit) has just verified the run itself
        # raw data that now prepares to another version is judged just below: refused, or recorded with --allow-data-drift
        refuse_unverified(run_dir, workspace, "it is not changed or re-sealed", decided_next=("data_changed",))
    refuse_untrusted_code(workspace, run_dir, record, trust_code)
    data, drift = open_data(workspace, record, ref, allow_data_drift)
    return OpenRun(run_dir, record, cfg, data, drift)


def open_data(workspace: Workspace, record: Record, ref: str, allow_data_drift: bool = False) -> tuple[DataVersion, Optional[str]]:
    """(the run's data version, why the data differs from the recorded version when allowed): prepared again from the
    raw files when they are present (fast when unchanged), which must give the recorded version; without raw files
    the stored version as it is. Imports no user code."""
    from veritrain.data import prepare
    from veritrain.data.identity import tokenizer_difference

    resolved = resolved_from_record(record)
    cfg = resolved.config
    recorded = (record.get("data") or {}).get("version")
    stored = workspace.state_dir / "data" / str(recorded)
    paths = resolved.data_paths
    raw_present = "root" not in paths or paths["root"].exists()
    drift = None
    if raw_present:
        data = prepare.run(cfg.data, paths, workspace.state_dir, recorded=recorded)
        tokenizer = tokenizer_difference(record.get("data"), data)
        if tokenizer:  # the model's ids mean nothing under other bytes: refused even with --allow-data-drift
            raise UserError(f"{ref}: {tokenizer}; restore the data and its tokenizer config, or train a new run")
        if data.version != recorded:
            drift = f"the data now prepares to version {data.version[:12]}, the run used {str(recorded)[:12]}"
            if not allow_data_drift:
                raise UserError(f"{ref}: {drift}; restore the data, or pass --allow-data-drift to evaluate on the new version (recorded)"
                                + prepare.earlier_recipe_hint(record.get("data")))
    elif (stored / "version.json").exists():
        log.warning("data: raw data not found at %s; using the stored data version %s", paths.get("root"), str(recorded)[:12])
        data = prepare.load_version(stored)
        tokenizer = tokenizer_difference(record.get("data"), data)
        if tokenizer:
            raise UserError(f"{ref}: {tokenizer}; the stored data version was changed: prepare it again from the raw data")
    else:
        raise UserError(f"{ref}: neither the raw data ({paths.get('root')}) nor the stored data version {str(recorded)[:12]} is here")
    return data, drift


def require_checkpoint(opened: OpenRun, which: Optional[str]) -> None:
    """Before eval or export without --checkpoint: a run whose default checkpoint does not exist gets the
    real cause (a baseline run, a run that failed or was interrupted before its first checkpoint), not a
    complaint about a --checkpoint the user never gave. A given --checkpoint is checked where it is loaded."""
    from veritrain.results.evaluate import checkpoint_path

    if which is not None or checkpoint_path(opened.config, opened.run_dir, None).exists():
        return
    run, record = opened.run_dir.name, opened.record
    status, error = record.get("status"), record.get("error") or {}
    if record.get("kind") == "baseline":
        raise RunFailed(f"{run}: a baseline run trains no model, so it has no checkpoint; "
                        "give a trained run (`latest` names the newest one with a checkpoint)")
    stage = next((s for s in record.get("stages") or () if s not in (record.get("timings") or {})), "train")
    steps = (record.get("training") or {}).get("steps", 0)
    if status == "failed":
        raise RunFailed(f"{run}: the run failed in its {stage} stage before writing a checkpoint ({error.get('type')}: "
                        f"{str(error.get('message'))[:200]}); fix that and start a new run: veritrain {record.get('kind') or 'run'} runs/{run}/config.yaml")
    if status == "interrupted":
        raise RunFailed(f"{run}: the run was interrupted in its {stage} stage before its first checkpoint; "
                        f"resume it: veritrain train --resume {run}")
    kept = "checkpoints/best.pt" if opened.config.checkpoint.best else "checkpoints/last.pt"
    raise RunFailed(f"{run}: {kept} is missing although the run {status} after {steps} steps; "
                    f"`veritrain verify {run}` says what else changed, or give --checkpoint with a step file of the run")


def code_session(workspace: Workspace, run_dir: Path, record: Mapping[str, Any], command: str, use_current: bool = False) -> usercode.CodeSession:
    """Where a command on an existing run imports user modules from: the copies recorded with the run (saying in
    one line which of the user's files now differ), or with `use_current` the current code, as a new run would."""
    config_path = (record.get("config_source") or {}).get("path")
    config_path = Path(config_path) if config_path and Path(config_path).is_file() else None
    if use_current:
        return usercode.fresh(config_path)
    return usercode.recorded(run_dir, record, workspace.root / usercode.STATE_SCRATCH, command, usercode.fresh(config_path).roots)


def refuse_untrusted_code(workspace: Workspace, run_dir: Path, record: Mapping[str, Any], trust_code: bool) -> None:
    """A run's config that names code (`model.target`) is code: building its model imports and runs it. Configs
    you write are trusted; a run this user did not start in this workspace (imported, copied, a folder given as RUN,
    or one whose recorded code or config is no longer what this user's run of that id recorded) is data, and is
    refused (UserError, one line) unless the user passes --trust-code after reading that code. Whether this user
    started it is their mark's to say, kept in their own state folder (Workspace.not_created_here), never the
    workspace's: whoever hands over or writes a workspace could write anything in it."""
    script = (record.get("script") or {}).get("file") if record.get("kind") == "script" else None
    # a script's config is the user's own (veritrain.userloop): its code is the script
    target = None if record.get("kind") == "script" else ((record.get("config") or {}).get("model") or {}).get("target")
    files = ((record.get("code") or {}).get("user_files") or [])
    if not (target or files or script) or trust_code:
        return
    why = workspace.not_created_here(run_dir, record)
    if why is not None:
        named = (f"its config names code (model.target {str(target)[:80]!r})" if target
                 else f"it is a script's run (its recorded script {str(script)[:80]} is code)" if script
                 else f"its record names code ({len(files)} recorded module(s), e.g. {str(files[0].get('module'))[:80]})")
        consequence = "replaying it would run that code" if script else "building its model would run that code"
        raise UserError(f"{run_dir.name}: {named} and {why}: {consequence}; read it, then pass --trust-code")


def refuse_unverified(run_dir: Path, workspace: Workspace, consequence: str, decided_next: tuple[str, ...] = ()) -> None:
    """RunFailed (exit 1) naming the first problem when the run does not verify: re-sealing it would launder the
    change. This is the full `veritrain verify` (its defaults: checkpoint states, the data version and the raw data
    included), so no command re-seals a run that `verify` fails. Problems of the kinds in `decided_next` are left to
    the caller, which checks them itself right after (open_run: raw data that prepares to another version)."""
    from veritrain.trust.verify import verify_run

    found = [p for p in verify_run(run_dir, workspace.state_dir)["problems"] if p["kind"] not in decided_next]
    if found:
        first = found[0]
        raise RunFailed(f"{run_dir.name}: {first['path']}: {first['kind']}" + (f" ({first['detail']})" if first.get("detail") else "")
                        + f"; the run does not verify, so {consequence}: see `veritrain verify {run_dir.name}`")
