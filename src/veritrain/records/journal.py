"""Amends of a finished run as one recoverable step, journaled in `.veritrain/journal/<run_id>/`.

`eval`, `export`, `baseline RUN` and `gc` change a sealed run and seal it again. None of them writes into
the run until the whole new state lies beside it, so a kill at any moment leaves the run as it was or as
it is after the command:

1. `amending` takes the run's lock and creates the journal folder (exclusively: one amend of a run at a
   time). The command writes its files into `new/`, laid out as in the run.
2. `Amend.commit` writes the new `record.json` and `record.sha256` into `new/` too (its artifact table is
   the run as it will be), syncs `new/` to disk, then writes `plan.json` atomically. Its presence is the
   commit point: it lists every path to write or remove and which of them the run has now.
3. apply: each file the plan replaces or removes is moved from the run to `old/`, then the new one is moved
   in from `new/` (renames on one filesystem); `record.json` and then `record.sha256` last.
4. the journal folder is renamed away (one atomic step: the amend is done) and deleted.

`recover` (run by every amending command first) finishes what a kill interrupted: without `plan.json`
nothing in the run was touched, and the journal is removed (rolled back); with it the plan is applied
again (rolled forward: a step that was done is recognised and skipped). `interrupted` is what `verify`
reads: the message, and the files of the run as they were before the amend (the copy in `old/` of each
file already switched), so verify judges the run as it was and writes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.files import write_atomic
from veritrain.core.signing_keys import sealing_key
from veritrain.records import provenance
from veritrain.records.record import PROVENANCE_FILE, RECORD_FILE, SEAL_FILE, UNSEALED, now_iso, sealed_bytes, statement_bytes

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace

log = logging.getLogger("veritrain")

JOURNAL_DIR = "journal"  # under the workspace's state folder (.veritrain/)
PLAN_FILE = "plan.json"  # written last, atomically: the commit point
NEW, OLD = "new", "old"  # the files the amend writes; the run's files it replaced or removed
PLAN_VERSION = 1
INTERRUPTED = "an amend of this run was interrupted (journal {journal}); any amending command completes or rolls it back"
DONE_SUFFIX = ".done"  # a journal renamed away to be deleted
UNDER_WAY = "an amend of this run is under way (journal {journal}) by a live process"


def folder_of(state_dir: Path, run_id: str) -> Path:
    return state_dir / JOURNAL_DIR / run_id


def _shown(state_dir: Path, run_id: str) -> str:
    return f".veritrain/{JOURNAL_DIR}/{run_id}/" if state_dir.name == ".veritrain" else f"{folder_of(state_dir, run_id)}/"


@dataclass
class Amend:
    """One amend of `run_dir` under way: the command writes into `new` (the run's layout), names the run's
    folders that its staged folders replace whole (`replace_folder`) and the files it removes (`remove`),
    then `commit`s the new record."""

    run_dir: Path
    folder: Path
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    committed: bool = False
    key: Any = None  # the signing key, loaded (and checked) before anything is staged

    @property
    def new(self) -> Path:
        return self.folder / NEW

    def replace_folder(self, rel: str) -> Path:
        """The staging folder for the run's folder `rel`, whose files it replaces: any file there that the
        command does not write again is removed (export/: formats not kept)."""
        self.replaced.append(rel.strip("/"))
        staged = self.new / rel
        staged.mkdir(parents=True, exist_ok=True)
        return staged

    def remove(self, rel: str) -> None:
        self.removed.append(rel)

    def commit(self, record: dict[str, Any], by: str) -> str:
        """Seal `record` as the run after this amend (the seal it replaces goes to `seal_history`), switch the
        run to it and remove the journal; returns the new seal."""
        plan = _stage_record(self, record, by)
        _sync_tree(self.new)
        write_atomic(self.folder / PLAN_FILE, (json.dumps(plan, indent=1) + "\n").encode())  # the commit point
        self.committed = True
        _apply(self.run_dir, self.folder, plan)
        _drop(self.folder)
        return plan["seal"]


@contextmanager
def amending(workspace: Workspace, run_dir: Path, record: dict[str, Any]) -> Iterator[Amend]:
    """An amend of the finished run in `run_dir`, whose record as the command read it is `record`. An
    interrupted amend is completed or rolled back first; a record that changed since it was read (another
    command re-sealed the run meanwhile) is refused. Leaving the block without `commit` rolls back."""
    run_id = run_dir.name
    key = sealing_key()  # an unusable key stops the command before it does any work
    recover(workspace, run_dir)
    folder = folder_of(workspace.state_dir, run_id)
    folder.parent.mkdir(parents=True, exist_ok=True)
    if os.stat(folder.parent).st_dev != os.stat(run_dir).st_dev:
        raise UserError(f"{folder.parent}: not on the filesystem of {run_dir}; an amend switches files by renaming them, "
                        "so keep runs/ and .veritrain/ in one filesystem")
    workspace.lock_run(run_id)
    try:
        try:
            folder.mkdir()
        except FileExistsError:
            raise UserError(f"{run_id}: {UNDER_WAY.format(journal=_shown(workspace.state_dir, run_id))}; wait for it to finish") from None
        change = Amend(run_dir, folder, key=key)
        try:
            if _read_json(run_dir / RECORD_FILE) != _without_changes(record):
                raise RunFailed(f"{run_id}: the run was re-sealed by another command since this one read it; run this command again")
            (folder / NEW).mkdir()
            yield change
        finally:
            if not change.committed:
                _drop(folder)  # nothing in the run was touched
    finally:
        workspace.unlock_run(run_id)


def recover(workspace: Workspace, run_dir: Path) -> Optional[str]:
    """Complete (plan.json present) or roll back (absent) an interrupted amend of the run, saying so in one line;
    returns "completed", "rolled back" or None (no journal). UserError while a live process holds the run's lock."""
    run_id = run_dir.name
    folder = folder_of(workspace.state_dir, run_id)
    if not folder.is_dir():
        return None
    shown = _shown(workspace.state_dir, run_id)
    if not workspace.lock_is_stale(run_id):
        raise UserError(f"{run_id}: {UNDER_WAY.format(journal=shown)}; wait for it to finish")
    plan = _read_plan(folder)
    if plan is None or not run_dir.is_dir():
        _drop(folder)
        log.warning("%s: an interrupted amend was rolled back (journal %s removed); the run is as it was before it", run_id, shown)
        return "rolled back"
    _apply(run_dir, folder, plan)
    _drop(folder)
    log.warning("%s: an interrupted amend (%s) was completed from its journal (%s); the run is as that command would have left it", run_id, plan["by"], shown)
    return "completed"


def recover_all(workspace: Workspace) -> dict[str, str]:
    """`recover` for every journal of the workspace whose run is not being amended right now: run id → what was done."""
    done: dict[str, str] = {}
    journals = workspace.state_dir / JOURNAL_DIR
    for folder in sorted(journals.iterdir()) if journals.is_dir() else []:
        if folder.name.startswith(".") and folder.name.endswith(DONE_SUFFIX):
            shutil.rmtree(folder, ignore_errors=True)  # a finished journal whose deletion a kill interrupted
        elif folder.is_dir() and workspace.lock_is_stale(folder.name):
            outcome = recover(workspace, workspace.runs_dir / folder.name)
            if outcome:
                done[folder.name] = outcome
    return done


@dataclass(frozen=True)
class Interrupted:
    message: str
    files: dict[str, Path]  # every path of the run (relative) → where its content as before the amend is now


def interrupted(run_dir: Path, state_dir: Path) -> Optional[Interrupted]:
    """The journal of an amend of the workspace's run `run_dir` that has not finished, with the run's files as
    they were before it; None when there is none. Reads only."""
    folder = folder_of(state_dir, run_dir.name)
    try:
        if not folder.is_dir() or run_dir.resolve().parent != (state_dir.parent / "runs").resolve():
            return None
    except OSError:
        return None
    files = {path.relative_to(run_dir).as_posix(): path for path in sorted(run_dir.rglob("*"))}
    plan = _read_plan(folder)
    if plan is not None:  # switching may have begun: what was there before is in old/, or not yet moved
        existed = set(plan["existed"])
        for rel in [*plan["remove"], *plan["write"]]:
            backup = folder / OLD / rel
            if backup.is_file():
                files[rel] = backup
            elif rel not in existed:
                files.pop(rel, None)  # a file this amend adds
    from veritrain.records.workspace import Workspace

    live = not Workspace(state_dir.parent).lock_is_stale(run_dir.name)  # the amend may still finish: said so, judged the same
    return Interrupted((UNDER_WAY if live else INTERRUPTED).format(journal=_shown(state_dir, run_dir.name)), files)


# ---------------------------------------------------------------- the steps


def _without_changes(record: dict[str, Any]) -> Any:
    return json.loads(json.dumps(record))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_plan(folder: Path) -> Optional[dict[str, Any]]:
    if not (folder / PLAN_FILE).exists():
        return None
    plan = _read_json(folder / PLAN_FILE)
    if not isinstance(plan, dict) or plan.get("plan_version") != PLAN_VERSION:
        raise RunFailed(f"{folder / PLAN_FILE}: not a plan this veritrain wrote; the run's files as before the amend are in "
                        f"{folder / OLD}, the new ones in {folder / NEW}")
    return plan


def _files_below(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def _stage_record(change: Amend, record: dict[str, Any], by: str) -> dict[str, Any]:
    """Write the sealed record of the run as it will be into new/; returns the plan."""
    run_dir, new = change.run_dir, change.new
    staged = [rel for rel in _files_below(new) if rel not in UNSEALED]
    current = [rel for rel in _files_below(run_dir)]
    gone = set(change.removed) | {rel for rel in current for folder in change.replaced
                                  if rel.startswith(folder + "/") and rel not in staged}
    future = {rel: run_dir / rel for rel in current if rel not in UNSEALED and rel not in gone}
    future.update({rel: new / rel for rel in staged})
    try:
        previous = (run_dir / SEAL_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        previous = None
    if previous:  # `verify --expect` an older seal then says what re-sealed the run
        record.setdefault("seal_history", []).append({"seal": previous, "replaced_at": now_iso(), "by": by})
    key = change.key
    record["provenance"] = provenance.field(key)  # a re-seal without the private key: an unsigned statement, said so
    data, seal = sealed_bytes(record, future)
    (new / PROVENANCE_FILE).write_bytes(statement_bytes(record, seal, run_dir, key))
    (new / RECORD_FILE).write_bytes(data)
    (new / SEAL_FILE).write_bytes((seal + "\n").encode())
    write = [*staged, PROVENANCE_FILE, RECORD_FILE, SEAL_FILE]  # the statement, the record and then its seal last
    remove = sorted(gone - set(staged))
    return {"plan_version": PLAN_VERSION, "run_id": run_dir.name, "by": by, "seal": seal, "previous_seal": previous,
            "write": write, "remove": remove, "existed": sorted(set(write + remove) & set(current))}


def _apply(run_dir: Path, folder: Path, plan: dict[str, Any]) -> None:
    """Switch the run to the plan's new state; every step is done once, however often this runs."""
    new, old = folder / NEW, folder / OLD
    touched: set[Path] = set()
    for rel in plan["remove"]:
        _move_aside(run_dir / rel, old / rel, touched)
    for rel in plan["write"]:
        if not os.path.lexists(new / rel):
            continue  # moved in before
        target = run_dir / rel
        _move_aside(target, old / rel, touched)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(new / rel, target)
        touched.add(target.parent)
    for path in sorted(touched):
        _sync_folder(path)


def _move_aside(path: Path, backup: Path, touched: set[Path]) -> None:
    if os.path.lexists(backup) or not os.path.lexists(path):
        return  # moved before, or never there
    backup.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, backup)
    touched.update({path.parent, backup.parent})


def _drop(folder: Path) -> None:
    """Remove a journal: renamed away at once (a hidden `.<run_id>.<random>.done` beside it, which nothing reads
    and `recover_all` clears), then deleted."""
    done = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}{DONE_SUFFIX}")
    os.replace(folder, done)
    _sync_folder(folder.parent)
    shutil.rmtree(done, ignore_errors=True)


def _sync_tree(folder: Path) -> None:
    """Flush every file below `folder`, and the folders, to disk (what other modules wrote there did not)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for path in sorted({p.parent for p in folder.rglob("*")} | {folder}):
        _sync_folder(path)


def _sync_folder(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
