"""Amends journaled in `.veritrain/journal/<run_id>/`, as an earlier veritrain wrote them; the next amending command or
`gc` finishes one a kill interrupted.

`eval`, `export`, `baseline RUN` and `gc` now add sealed amendments beside a run (veritrain.records.amendments) and
never rewrite it. An earlier veritrain re-sealed the run in place, through a journal; a workspace may still hold one
that a kill left, so this module still completes or rolls it back, and judges it as hostile input. How such an amend
was made, none of which writes into the run until the whole new state lies beside it:

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

Whoever can write the workspace can write a journal, so `plan.json`, `new/` and `old/` are read as hostile
input: before anything is moved, `_plan_problem` confines the plan to the run (every path relative, plain, below
no link in the run, `new/` or `old/`; the journal and the run folder real folders; the plan as `_stage_record`
writes it). A plan that fails is refused as a whole (RunFailed, nothing changed) with the way out:
`veritrain gc --drop-journal RUN` (`discard`) removes a journal without applying it, never following a link.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.files import sync_folder, sync_tree, write_atomic
from veritrain.core.signing_keys import sealing_key
from veritrain.records import provenance
from veritrain.records.record import PROVENANCE_FILE, RECORD_FILE, SEAL_FILE, UNSEALED, now_iso, sealed_bytes, statement_bytes
from veritrain.records.workspace import Workspace

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
PLAN_KEYS = ("plan_version", "run_id", "by", "seal", "previous_seal", "write", "remove", "existed")  # as _stage_record writes them
PATH_LISTS = ("write", "remove", "existed")
MAX_PLAN_ENTRIES = 1_000_000  # per list: far above any run's file count, far below what would exhaust memory
MAX_PLAN_BYTES = 256 * 2**20  # plan.json larger than this is not read
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
REFUSED = ("{where}: {problem}; the journal was refused and nothing was changed. If this workspace's journal is not to be "
           "trusted, remove it without applying it: `veritrain gc --drop-journal {run}` (the run then stays as its files are now; "
           "check it with `veritrain verify {run}`)")


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
        problem = _plan_problem(self.folder, self.run_dir, plan)  # a run or journal holding links: never written through
        if problem:
            raise RunFailed(f"{_printable(self.run_dir.name)}: {problem}; the amend was not applied and the run is as it was")
        sync_tree(self.new)
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
    if not os.path.lexists(folder):
        return None
    shown = _shown(workspace.state_dir, run_id)
    if not workspace.lock_is_stale(run_id):
        raise UserError(f"{run_id}: {UNDER_WAY.format(journal=shown)}; wait for it to finish")
    plan = _read_plan(folder, run_dir)  # RunFailed, nothing changed, for a plan that reaches outside the run
    if plan is None or not run_dir.is_dir():
        _drop(folder)
        log.warning("%s: an interrupted amend was rolled back (journal %s removed); the run is as it was before it", run_id, shown)
        return "rolled back"
    _apply(run_dir, folder, plan)
    _drop(folder)
    log.warning("%s: an interrupted amend (%s) was completed from its journal (%s); the run is as that command would have left it", run_id, plan["by"], shown)
    return "completed"


def recover_all(workspace: Workspace) -> dict[str, str]:
    """`recover` for every journal of the workspace whose run is not being amended right now: run id → what was done.
    Every journal is checked first (`check_all`): one that is refused stops it before any journal, run or leftover is
    touched, so the refusal means that nothing was changed."""
    names = check_all(workspace)
    journals = workspace.state_dir / JOURNAL_DIR
    for entry in sorted(journals.iterdir()) if journals.is_dir() else []:
        if _is_leftover(entry.name):
            _remove_entry(entry)  # a finished journal whose deletion a kill interrupted (a link: the link alone)
    done: dict[str, str] = {}
    for name in names:
        outcome = recover(workspace, workspace.runs_dir / name)
        if outcome:
            done[name] = outcome
    return done


def check_all(workspace: Workspace) -> list[str]:
    """The run ids of the workspace's journals that `recover_all` would complete or roll back (those of amends
    under way left out), after checking each as `recover` does; reads only. RunFailed for the first one refused."""
    journals = workspace.state_dir / JOURNAL_DIR
    if os.path.islink(journals):
        raise RunFailed(f"{_shown_dir(workspace.state_dir)}: a link, not a folder; the journals were refused and nothing was changed. "
                        "veritrain never makes it a link: remove the link itself (not what it points to) and run the command again")
    names: list[str] = []
    for entry in sorted(journals.iterdir()) if journals.is_dir() else []:
        if _is_leftover(entry.name) or not workspace.lock_is_stale(entry.name):
            continue  # a deleted journal's remains; an amend under way, left alone
        _read_plan(entry, workspace.runs_dir / entry.name)
        names.append(entry.name)
    return names


def discard(workspace: Workspace, run_id: str, dry_run: bool = False) -> str:
    """Remove the journal of `run_id` without applying it (`veritrain gc --drop-journal RUN`), whatever it holds, a
    malformed or hostile plan included: the run stays as its files are now, for `veritrain verify` to judge. Nothing
    is followed: a journal that is a link, and any link in it, is removed itself, never what it points to. Returns
    the journal as shown; UserError when there is none or a live process holds the run's lock (an amend under way)."""
    journals = workspace.state_dir / JOURNAL_DIR
    folder = folder_of(workspace.state_dir, run_id)
    shown = _shown(workspace.state_dir, run_id)
    if os.path.islink(journals):  # journal/<run_id> would lie wherever the link points
        raise UserError(f"{_shown_dir(workspace.state_dir)}: a link, not a folder; veritrain never makes it a link: remove the link "
                        "itself (not what it points to)")
    if not os.path.lexists(folder):
        raise UserError(f"{_printable(run_id)}: no journal {shown}; nothing to remove")
    if not workspace.lock_is_stale(run_id):
        raise UserError(f"{_printable(run_id)}: {UNDER_WAY.format(journal=shown)}; wait for it to finish")
    if dry_run:
        return shown
    workspace.lock_run(run_id)  # no amend of the run starts while its journal is removed
    try:
        _remove_entry(folder)
    finally:
        workspace.unlock_run(run_id)
    return shown


def _is_leftover(name: str) -> bool:
    return name.startswith(".") and name.endswith(DONE_SUFFIX)


@dataclass(frozen=True)
class Interrupted:
    message: str
    files: dict[str, Path]  # every path of the run (relative) → where its content as before the amend is now


def interrupted(run_dir: Path, state_dir: Path) -> Optional[Interrupted]:
    """The journal of an amend of the workspace's run `run_dir` that has not finished, with the run's files as
    they were before it; None when there is none. Reads only."""
    folder = folder_of(state_dir, run_dir.name)
    try:
        if not os.path.lexists(folder) or run_dir.resolve().parent != (state_dir.parent / "runs").resolve():
            return None
    except OSError:
        return None
    plan = _read_plan(folder, run_dir)  # RunFailed for a plan that reaches outside the run: nothing is read through it
    files = {path.relative_to(run_dir).as_posix(): path for path in sorted(run_dir.rglob("*"))}
    if plan is not None:  # switching may have begun: what was there before is in old/, or not yet moved
        existed = set(plan["existed"])
        for rel in [*plan["remove"], *plan["write"]]:
            backup = folder / OLD / rel
            if backup.is_file():
                files[rel] = backup
            elif rel not in existed:
                files.pop(rel, None)  # a file this amend adds

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


def _read_plan(folder: Path, run_dir: Path) -> Optional[dict[str, Any]]:
    """The plan of the journal `folder` of the run in `run_dir`, None when it has none (the amend never reached its
    commit point). Reads only. RunFailed (`REFUSED`: what is wrong, with the path, and the way out) when the journal
    or its plan is not one that `_apply` may follow (`_plan_problem`)."""
    where = _printable(_shown(folder.parent.parent, folder.name))
    problem = _folder_problem(folder, run_dir)
    if problem:
        raise RunFailed(REFUSED.format(where=where, problem=problem, run=_printable(folder.name)))
    where += PLAN_FILE
    try:
        plan, problem = _load_plan(folder / PLAN_FILE)
    except FileNotFoundError:  # never written, or the journal was removed meanwhile (an amend under way finished)
        return None
    problem = problem or _plan_problem(folder, run_dir, plan)
    if problem:
        raise RunFailed(REFUSED.format(where=where, problem=problem, run=_printable(folder.name)))
    return plan


def _load_plan(path: Path) -> tuple[Any, Optional[str]]:
    """plan.json's content, read without following a link, or why it cannot be; FileNotFoundError when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as err:
        return None, "a link, not a file" if os.path.islink(path) else f"cannot be read ({err.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > MAX_PLAN_BYTES:
            return None, f"{info.st_size} bytes, more than the {MAX_PLAN_BYTES} a plan may have"
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_PLAN_BYTES + 1)
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    finally:
        os.close(fd)
    try:
        return json.loads(data.decode("utf-8")), None
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None, "not JSON: not a plan this veritrain wrote"


def _folder_problem(folder: Path, run_dir: Path) -> Optional[str]:
    """Why the journal `folder`, or the run folder it is applied to, may not be used (each must be a real folder, as
    must the journal's `new/` and `old/`: a link would carry every rename elsewhere), or None. One that is not there
    is no problem here: a journal removed meanwhile has no plan to follow."""
    root = folder.parent.parent.parent
    for path in (folder.parent, folder, run_dir, folder / NEW, folder / OLD):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as err:
            return f"{_on_disk(path, root)} cannot be read ({err.strerror})"
        if stat.S_ISLNK(mode):
            return f"{_on_disk(path, root)} is a link, not a folder"
        if not stat.S_ISDIR(mode):
            return f"{_on_disk(path, root)} is not a folder"
    return None


def _plan_problem(folder: Path, run_dir: Path, plan: Any) -> Optional[str]:
    """Why `plan`, of the journal `folder` of the run in `run_dir`, may not be applied, naming the offending entry; None
    when it may. The plan must be as `_stage_record` writes it: exactly its keys, of their types, `run_id` the journal
    folder's name, each of `write`, `remove` and `existed` a list of at most MAX_PLAN_ENTRIES paths (`existed` among the
    other two), and every path confined to the run: relative, POSIX, without empty, `.` or `..` parts, backslashes or
    control characters (NUL included), no path a folder of another, and no part of it, in the run, in `new/` or in
    `old/`, a link (checked with lstat, part by part) or, above the last part, anything but a folder. This is what
    lets `_apply` join a plan's path to the run, `new/` and `old/` and rename: nothing it names lies outside them."""
    problem = _folder_problem(folder, run_dir)
    if problem:
        return problem
    if not isinstance(plan, dict):
        return f"a JSON {type(plan).__name__}, not an object: not a plan this veritrain wrote"
    keys = list(plan)
    if sorted(keys) != sorted(PLAN_KEYS):
        odd = sorted(set(keys) ^ set(PLAN_KEYS))
        return f"its keys differ from a plan's (at {_quoted(str(odd[0]))}): not a plan this veritrain wrote"
    if type(plan["plan_version"]) is not int or plan["plan_version"] != PLAN_VERSION:
        return f"plan_version {_quoted(plan['plan_version'])}, not {PLAN_VERSION}: not a plan this veritrain wrote"
    if plan["run_id"] != folder.name:
        return f"run_id {_quoted(plan['run_id'])} is not the journal's run, {_quoted(folder.name)}"
    for key in ("by", "seal"):
        if not isinstance(plan[key], str) or not plan[key]:
            return f"{key} {_quoted(plan[key])} is not a non-empty string: not a plan this veritrain wrote"
    if plan["previous_seal"] is not None and not isinstance(plan["previous_seal"], str):
        return f"previous_seal {_quoted(plan['previous_seal'])} is neither a string nor null"
    for key in PATH_LISTS:
        entries = plan[key]
        if not isinstance(entries, list):
            return f"{key} is a JSON {type(entries).__name__}, not a list"
        if len(entries) > MAX_PLAN_ENTRIES:
            return f"{key} has {len(entries)} entries, more than the {MAX_PLAN_ENTRIES} a plan may have"
        for rel in entries:
            problem = _path_problem(rel)
            if problem:
                return f"{key} entry {_quoted(rel)}: {problem}"
    named = set(plan["write"]) | set(plan["remove"])
    for rel in plan["existed"]:
        if rel not in named:
            return f"existed entry {_quoted(rel)} is in neither write nor remove"
    for rel in sorted(named):
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in named:
                return f"entry {_quoted(rel)} lies below {_quoted('/'.join(parts[:depth]))}, another entry"
    root = folder.parent.parent.parent
    checked: set[Path] = set()  # folders already found to be real folders
    for base in (run_dir, folder / NEW, folder / OLD):
        for rel in sorted(named):
            problem = _link_on_the_way(base, rel, checked, root)
            if problem:
                return f"entry {_quoted(rel)}: {problem}"
    return None


def _path_problem(rel: Any) -> Optional[str]:
    """Why `rel` is not a plain relative POSIX path of a file in the run, or None."""
    if not isinstance(rel, str):
        return "not a string"
    if not rel:
        return "empty"
    if len(rel) > MAX_PATH_CHARS:
        return f"longer than {MAX_PATH_CHARS} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return "holds a control character"
    if "\\" in rel:
        return "holds a backslash"
    if rel.startswith("/"):
        return "an absolute path"
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            return f"has {'an empty' if not part else f'a {part!r}'} part"
    return None


def _link_on_the_way(base: Path, rel: str, checked: set[Path], root: Path) -> Optional[str]:
    """Whether a part of `base/rel` (lstat, part by part, up to the first that does not exist) is a link, or a part
    above the last one is not a folder: a rename there would land outside `base`."""
    parts = rel.split("/")
    path = base
    for depth, part in enumerate(parts, 1):
        path = path / part
        if path in checked:
            continue
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"{_on_disk(path, root)} cannot be read ({err.strerror})"
        if stat.S_ISLNK(mode):
            return f"{_on_disk(path, root)} is a link"
        if depth < len(parts):
            if not stat.S_ISDIR(mode):
                return f"{_on_disk(path, root)} is not a folder"
            checked.add(path)
    return None


def _on_disk(path: Path, root: Path) -> str:
    """`path` as shown in a message: relative to the workspace when it is inside it, printable either way."""
    try:
        shown = path.relative_to(root).as_posix()
    except ValueError:
        shown = str(path)
    return _printable(shown)


def _quoted(value: Any) -> str:
    """`value` as JSON writes it (a string in double quotes, control characters escaped: the message stays one line),
    cut short."""
    try:
        quoted = json.dumps(value)
    except (ValueError, RecursionError):
        quoted = "(deeply nested)"
    return quoted if len(quoted) <= 200 else quoted[:196] + '..."'


def _printable(text: str) -> str:
    """`text` with control characters escaped, for a one-line message; a plain run id is left as it is."""
    return text if text.isprintable() else json.dumps(text)[1:-1]


def _shown_dir(state_dir: Path) -> str:
    return f".veritrain/{JOURNAL_DIR}" if state_dir.name == ".veritrain" else str(state_dir / JOURNAL_DIR)


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
        sync_folder(path)


def _move_aside(path: Path, backup: Path, touched: set[Path]) -> None:
    if os.path.lexists(backup) or not os.path.lexists(path):
        return  # moved before, or never there
    backup.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, backup)
    touched.update({path.parent, backup.parent})


def _drop(folder: Path) -> None:
    """Remove a journal: renamed away at once (a hidden `.<run_id>.<random>.done` beside it, which nothing reads
    and `recover_all` clears), then deleted. Renaming first matters: a kill during the deletion must never leave a
    plan.json whose `new/` is half gone, which the next command would roll forward."""
    done = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}{DONE_SUFFIX}")
    os.replace(folder, done)
    sync_folder(folder.parent)
    shutil.rmtree(done, ignore_errors=True)  # removes the links inside, never what they point to


def _remove_entry(path: Path) -> None:
    """Remove `path` without following a link: a link or a file is unlinked; a real folder is dropped (`_drop`)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        os.unlink(path)
        sync_folder(path.parent)
    elif _is_leftover(path.name):
        shutil.rmtree(path, ignore_errors=True)  # already renamed away: nothing reads it
    else:
        _drop(path)
