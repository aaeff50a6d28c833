"""`veritrain gc` and `veritrain run --dry-run / --reuse-completed`: what work can be reused, and
what disk space can be given back without losing anything a record still needs.

    veritrain gc --dry-run
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from veritrain.core import locks
from veritrain.core.config import ResolvedConfig
from veritrain.core.errors import RunFailed, UserError
from veritrain.core.task_registry import task_target
from veritrain.records import amendments, journal, registry
from veritrain.records.record import OMITTED_FILE, Record, capture_code, read_record
from veritrain.records.recorder import amending
from veritrain.records.smoke_results import passed_before, smoke_key
from veritrain.records.usercode import current_listing
from veritrain.records.workspace import Workspace
from veritrain.trust.opening import code_session, refuse_unverified

log = logging.getLogger("veritrain")


def identical_completed(resolved: ResolvedConfig, workspace: Workspace, data_version: Optional[str]) -> Optional[dict[str, Any]]:
    """A completed `run` with the same config hash, data version, code version and user model code, if any."""

    code = capture_code(workspace.root)
    now = current_listing(resolved.path, resolved.config.model.target, task_target(resolved.config.task))  # what importing the target loads today
    for row in registry.query(workspace.state_dir, workspace.runs_dir, status=("completed",)):
        if row["kind"] != "run" or row["config_hash"] != resolved.hash or row["data_version"] != data_version:
            continue
        recorded = read_record(workspace.runs_dir / row["run_id"])["code"]
        if recorded.get("user_files") is None and resolved.config.model.target:
            continue  # a run from before the full listing: its model code cannot be compared
        # the run may list more (modules its model imported while training), never a different copy of these
        listed = {(e["module"], e["path"], e["sha256"]) for e in recorded.get("user_files") or []}
        same_user_code = all((e["module"], e["path"], e["sha256"]) in listed for e in now)
        if same_user_code and all(recorded.get(k) == code.get(k) for k in ("veritrain", "git_commit", "git_dirty")) and not code.get("git_dirty"):
            return row
    return None


@dataclass(frozen=True)
class StagePlan:
    """What `veritrain run` would do for one stage: `action` run, reuse or skip, `run_id` the completed
    run that would be reused (None otherwise), and the reason in words."""

    stage: str
    action: str
    reason: str
    run_id: Optional[str] = None


def dry_run(resolved: ResolvedConfig, workspace: Workspace, smoke: bool, reuse_completed: bool) -> list[StagePlan]:
    """Each stage of `veritrain run` with run/reuse/skip and the reason."""
    from veritrain.data import prepare

    action, reason, version = prepare.plan(resolved.config.data, resolved.data_paths, workspace.state_dir)
    if not smoke:
        stages = [StagePlan("smoke", "skip", "--no-smoke")]
    elif version and passed_before(workspace.state_dir, smoke_key(resolved.hash, version, capture_code(workspace.root))):
        stages = [StagePlan("smoke", "reuse", "a smoke test passed for this config hash, data version and code")]
    else:
        stages = [StagePlan("smoke", "run", "no smoke test passed yet for this config hash, data version and code")]
    stages.append(StagePlan("prepare", action, reason))
    same = identical_completed(resolved, workspace, version) if (reuse_completed and version) else None
    for stage in ("train", "baselines", "eval", "export"):
        if same:
            stages.append(StagePlan(stage, "reuse", f"--reuse-completed: run {same['run_id']} has the same config, data and code", same["run_id"]))
        elif reuse_completed:
            stages.append(StagePlan(stage, "run", "no completed run with this config hash, data version and code version"))
        else:
            stages.append(StagePlan(stage, "run", "every veritrain run is a new run (--reuse-completed returns an identical completed one)"))
    return stages


LEFTOVER_AGE = 60.0  # seconds: a temp folder or record-less run folder younger than this may still be in use


def _leftovers(workspace: Workspace) -> list[tuple[Path, float]]:
    """(folder, age in seconds) of what killed commands leave: the temp folders of prepares and of gc's own
    removals (`.veritrain/data/.tmp-*`), the staging folders of imports (`.veritrain/import-*`) and of amendments
    (`.veritrain/amending/`), the scratch
    folders of audits and recorded code (`.veritrain/tmp/`) whose process is gone, and run folders that never
    got a record.json, older than a minute, not locked."""
    now = time.time()
    found = []
    data = workspace.state_dir / "data"
    temporary = (sorted(data.glob(".tmp-*")) if data.exists() else []) + (sorted(workspace.state_dir.glob("import-*")) if workspace.state_dir.exists() else [])
    for folder in temporary:
        age = now - folder.stat().st_mtime
        if folder.is_dir() and age > LEFTOVER_AGE:
            found.append((folder, age))
    staging = workspace.state_dir / amendments.STAGING_DIR  # amendments a kill stopped before they were added to their run
    for folder in sorted(staging.iterdir()) if staging.is_dir() and not staging.is_symlink() else []:
        age = now - folder.lstat().st_mtime
        if age > LEFTOVER_AGE and workspace.lock_is_stale(folder.name.split(".", 1)[0]):
            found.append((folder, age))
    scratch = workspace.state_dir / "tmp"  # audit replays (audit-<pid>-*), imported code copies (code-<pid>-*), data prepare features (prepare-<pid>-*)
    for folder in sorted(scratch.iterdir()) if scratch.is_dir() else []:
        age = now - folder.lstat().st_mtime
        if folder.is_dir() and not folder.is_symlink() and _scratch_orphaned(folder.name, age):
            found.append((folder, age))
    for folder in sorted(workspace.runs_dir.glob("*")) if workspace.runs_dir.exists() else []:
        age = now - folder.stat().st_mtime
        if (folder.is_dir() and not folder.is_symlink() and not (folder / "record.json").exists() and age > LEFTOVER_AGE
                and workspace.lock_is_stale(folder.name)):
            found.append((folder, age))
    return found


SCRATCH_NAME = re.compile(r"^(?:audit-eval|audit|code|prepare)-(?:(?P<pid>[0-9]+)-)?")
UNNAMED_SCRATCH_AGE = 86_400.0  # seconds: a scratch folder that names no process (older veritrain) is kept a day


def _scratch_orphaned(name: str, age: float) -> bool:
    """Whether a `.veritrain/tmp` folder was left by a command that is gone: its name holds the pid of the process
    that made it, and no process of that pid is alive (a pid in use again keeps it: the safe way to be wrong)."""
    match = SCRATCH_NAME.match(name)
    if match is None or age <= LEFTOVER_AGE:
        return False
    if match["pid"] is None:
        return age > UNNAMED_SCRATCH_AGE
    try:
        os.kill(int(match["pid"]), 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    except (OverflowError, ValueError):  # a number no process can have
        return True
    return False


def _step_file_of(path: Path) -> str:
    """`step-<N>.pt` for a step checkpoint or its sidecar (`step-<N>.pt.sha256`)."""
    return path.name.removesuffix(".sha256")


def _kept_step_files(run_dir: Path, record: dict[str, Any]) -> set[str]:
    """The step files gc keeps: those of trajectory entries kept for audit (checkpoint.audit_every) and those a
    result came from. In a run
    imported without them (archive_omitted.json), also the newest keep_last kept entries': verify excuses the
    missing audit checkpoints only beside those (archive.audit_only_checkpoints), so removing them, and
    clearing their `kept`, would make the run stop verifying."""
    from veritrain.trust.archive import audit_only_checkpoints

    entries = record.get("trajectory") or []
    kept = {f"step-{e['step']}.pt" for e in entries if e.get("kept_for_audit")}
    # a result's checkpoint (`veritrain eval RUN --checkpoint checkpoints/step-N.pt`): verify checks it holds the result's entry
    results = [m for m in (record.get("metrics") or {}).values() if isinstance(m, dict)] + [record.get("export") or {}]
    kept |= {str(r["checkpoint"]).removeprefix("checkpoints/") for r in results if str(r.get("checkpoint", "")).startswith("checkpoints/step-")}
    if (run_dir / OMITTED_FILE).exists():
        audit_only = {name.removeprefix("checkpoints/") for name in audit_only_checkpoints(record)}
        kept |= {f"step-{e['step']}.pt" for e in entries if e.get("kept")} - audit_only
    return kept


def _test_splits_carried_over(store: Path, versions: set[str]) -> set[str]:
    """The data versions whose test split `versions` carried over (data.test_from), and theirs in turn: re-preparing
    a kept version (verify, resume, reproduce) reads them."""
    from veritrain.data.prepare import carried_test_from

    found: set[str] = set()
    todo = list(versions)
    while todo:
        carried = carried_test_from(store / todo.pop())
        if carried is not None and carried not in found and carried not in versions:
            found.add(carried)
            todo.append(carried)
    return found


def _remove_and_reseal(workspace: Workspace, run_dir: Path, record: Record, steps: list[Path]) -> None:
    """Retire `steps` in a sealed amendment of the run (veritrain.records.recorder.amending), then remove them. Files an
    earlier gc retired but a kill left behind are removed without another amendment."""
    artifacts = record.get("artifacts") or {}
    to_retire = [path for path in steps if path.relative_to(run_dir).as_posix() in artifacts]
    if to_retire:
        with amending(workspace, record) as change:
            for path in to_retire:
                change.remove(path.relative_to(run_dir).as_posix())
            change.add_event("gc", f"removed {len(to_retire)} step checkpoint file(s); best.pt, last.pt and the checkpoints kept for audit kept")
            change.commit(by="gc")
    for path in steps:  # retired by a sealed amendment now: no longer part of the run
        path.unlink(missing_ok=True)


def _held_locks(workspace: Workspace) -> list[Path]:
    """The lock files in `.veritrain/locks/` that a live process holds (veritrain.core.locks)."""
    folder = workspace.state_dir / "locks"
    return [lock for lock in sorted(folder.glob("*.lock")) if not workspace.lock_is_stale(lock.stem)] if folder.exists() else []


def gc(workspace: Workspace, dry_run: bool) -> dict[str, Any]:
    """Remove step checkpoints of completed runs (best/last and the checkpoints kept for audit stay), data
    versions no run references, and stale locks; a run that loses files gets a sealed amendment retiring them, with a
    `gc` event (its trajectory's `kept` flags read cleared for them), before they are removed. Amends an earlier veritrain
    began and a kill interrupted are completed or rolled back first (veritrain.records.journal), and a data version is renamed to a temp
    folder before it is deleted, so a killed gc never leaves half a version that later commands would trust.
    A journal whose plan reaches outside its run (or is not one veritrain wrote) stops gc before it changes
    anything, with or without `dry_run` (RunFailed naming the journal; `drop_journal` is the way out)."""

    if dry_run:
        journal.check_all(workspace)  # what gc would refuse, it refuses here too
    else:
        journal.recover_all(workspace)

    removed: list[str] = []
    resealed: list[str] = []
    unverified: list[str] = []  # runs that do not verify: neither pruned nor re-sealed
    referenced: set[str] = set()
    freed = 0
    # a run whose record cannot be read, or one in progress (its record may not name its data version
    # yet), might need any data version: then none is removed
    keep_data: Optional[str] = None
    for run_dir in sorted(workspace.runs_dir.glob("*")) if workspace.runs_dir.exists() else []:
        if not run_dir.is_dir():
            continue
        if not workspace.lock_is_stale(run_dir.name):  # a live process writes it: gc leaves it alone
            keep_data = f"run {run_dir.name} is in progress"
            continue
        try:
            record = read_record(run_dir)
        except RunFailed:
            keep_data = f"the record of {run_dir.name} cannot be read"
            continue
        if (record.get("data") or {}).get("version"):
            referenced.add(record["data"]["version"])
        if record.get("status") not in ("completed", "pruned"):  # a pruned trial has ended: it is never resumed
            continue  # an interrupted or failed run may still be resumed from its step files
        kept = _kept_step_files(run_dir, record)
        steps = [p for p in sorted((run_dir / "checkpoints").glob("step-*.pt*")) if _step_file_of(p) not in kept]
        if not steps:
            continue
        try:  # removing files and re-sealing would launder a change to the run: leave such a run alone
            refuse_unverified(run_dir, workspace, "gc leaves it alone")
        except RunFailed as err:
            unverified.append(str(err))
            continue
        size = sum(path.stat().st_size for path in steps)
        if not dry_run:
            try:
                _remove_and_reseal(workspace, run_dir, record, steps)
            except UserError as err:  # another command is amending the run right now
                log.warning("gc: %s; left alone", err)
                continue
        freed += size
        removed += [str(path.relative_to(workspace.root)) for path in steps]
        resealed.append(run_dir.name)  # with --dry-run: the runs that would be re-sealed
    held = _held_locks(workspace)
    if held and not keep_data:  # a prepare, smoke test or sweep under way may be about to name a version no run names yet
        keep_data = f"a command holds {held[0].relative_to(workspace.root)}"
    preparing = any(lock.name.startswith("prepare-") for lock in held)  # its temp folder may be older than a minute
    leftovers = [(path, age) for path, age in _leftovers(workspace) if not (preparing and path.parent == workspace.state_dir / "data")]
    for path, age in leftovers:
        freed += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        removed.append(f"{path.relative_to(workspace.root)} (left by a killed command {age / 60:.0f} min ago)")
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
    referenced |= _test_splits_carried_over(workspace.state_dir / "data", referenced)
    if keep_data:
        log.warning("gc: keeping every data version: %s", keep_data)
    from veritrain.data.identity import FIELDS_FOLDER, SHARD_STORE  # numpy, which the rest of gc does not load

    versions = sorted(v for v in (workspace.state_dir / "data").glob("*") if not v.name.startswith(".")) if (workspace.state_dir / "data").exists() else []
    doomed_versions = [] if keep_data else [v for v in versions if v.name not in referenced]
    kept_shards = {shard.name for v in versions if v not in doomed_versions for shard in (v / FIELDS_FOLDER).glob("*/*")}
    store = workspace.state_dir / SHARD_STORE
    for version_dir in doomed_versions:
        # a shard another version holds frees nothing; one the store keeps is counted when the store's copy goes
        freed += sum(p.stat().st_size for p in version_dir.rglob("*") if p.is_file() and not (
            p.parent.parent.name == FIELDS_FOLDER and (p.name in kept_shards or (store / p.parent.name / p.name).exists())))
        removed.append(str(version_dir.relative_to(workspace.root)))
        if not dry_run:  # gone at once under its name; a kill during the deletion leaves a temp folder for the next gc
            doomed = version_dir.with_name(f".tmp-gc-{uuid.uuid4().hex}")
            version_dir.rename(doomed)
            shutil.rmtree(doomed)
    # the store's shards that no version kept holds (a version links each shard it holds from the store)
    for shard in sorted(store.glob("*/*")) if store.exists() and not keep_data else []:
        if shard.name not in kept_shards:
            freed += shard.stat().st_size
            removed.append(str(shard.relative_to(workspace.root)))
            if not dry_run:
                shard.unlink(missing_ok=True)
    for lock in sorted((workspace.state_dir / "locks").glob("*.lock")) if (workspace.state_dir / "locks").exists() else []:
        if workspace.lock_is_stale(lock.stem):  # removed only while gc holds it itself: never one a process takes meanwhile
            if dry_run or locks.remove_if_free(lock):
                removed.append(str(lock.relative_to(workspace.root)))
    return {"dry_run": dry_run, "removed": removed, "resealed": resealed, "bytes_freed": freed, "data_versions_kept_because": keep_data,
            "unverified": unverified}


def drop_journal(workspace: Workspace, ref: str, dry_run: bool) -> dict[str, Any]:
    """`veritrain gc --drop-journal RUN`: remove the run's amend journal without applying it (veritrain.records.journal.discard),
    for a journal that is refused or not to be trusted; the run stays as its files are now. RUN is resolved as elsewhere
    (id, unique prefix, `latest`, a run folder); a journal whose run folder is gone is named by its exact run id.
    Returns gc's document with the journal in `removed` and the run in `dropped_journal`."""
    run_id = ref if _journal_named(workspace, ref) else workspace.resolve_run(ref).name
    shown = journal.discard(workspace, run_id, dry_run)
    return {"dry_run": dry_run, "removed": [shown], "resealed": [], "bytes_freed": 0, "data_versions_kept_because": None,
            "unverified": [], "dropped_journal": run_id}


def _journal_named(workspace: Workspace, ref: str) -> bool:
    """Whether `ref` is exactly the run id of a journal of the workspace (a plain name: no folder, nothing hidden)."""
    if not ref or "/" in ref or "\\" in ref or ref.startswith("."):
        return False
    return os.path.lexists(journal.folder_of(workspace.state_dir, ref))


def data_order(workspace: Workspace, opened: Any, first: int, last: int) -> dict[str, Any]:
    """`veritrain data order RUN --steps A:B`: the training rows of optimizer steps A … B−1 of the run, recomputed from
    its recorded seed, data and sizes, as its engine drew them (veritrain.train.engines.step_rows), shown as the task shows its rows (Task.show_rows:
    sample ids, a language model's window starts); and the SHA-256 of the rows as little-endian int64, in order."""

    with code_session(workspace, opened.run_dir, opened.record, "data order") as code:  # the task's code as the run recorded it
        code.import_config(opened.config)
        return _data_order(opened, opened.task, first, last)


def _data_order(opened: Any, task: Any, first: int, last: int) -> dict[str, Any]:
    import numpy as np

    from veritrain.train import engines

    cfg, data = opened.config, opened.data
    train = task.rows(data, "train")
    world = int(((opened.record.get("distributed") or {}).get("world_size")) or 1)
    total = int((opened.record.get("training") or {}).get("steps") or 0)
    engine = engines.of_record(opened.record)
    if first < 0 or last <= first:
        raise UserError(f"--steps {first}:{last}: give A:B with 0 ≤ A < B (optimizer steps, 0-based, B excluded)")
    if total and first >= total:
        raise UserError(f"--steps {first}:{last}: the run trained {total} optimizer steps (0 … {total - 1}); give A below {total}")
    if total and last > total:  # clamped to the run: steps it never trained have no rows to show
        log.warning("data order: steps %d … %d were never trained (the run has %d); showing %d … %d", total, last - 1, total, first, total - 1)
        last = total
    steps, digest = [], hashlib.sha256()
    for step in range(first, last):
        epoch, batches = engines.step_rows(engine, cfg, train, step, world)
        rows = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
        digest.update(np.ascontiguousarray(rows, dtype="<i8").tobytes())
        _, shown = task.show_rows(data, rows)
        steps.append({"step": step, "epoch": epoch, "rows": len(rows), **shown})
    return {"run_id": opened.run_dir.name, "steps": steps, "sha256": digest.hexdigest(), "trained_steps": total,
            "unit": task.show_rows(data, np.zeros(0, dtype=np.int64))[0]}
