"""The workspace: a folder holding `runs/<run_id>/`, and veritrain's own state in `.veritrain/`.

`.veritrain/data/<version>/` stores prepared data versions (content-addressed, immutable);
`.veritrain/locks/<run_id>.lock` is the OS lock (veritrain.core.locks) of a run that a live process is writing: the
kernel releases it when that process ends, so a `running` run whose lock is free is dead and resumable.

Which runs this user started in a workspace is not the workspace's to say: those marks live in the user's state
folder (`<state>/created/<workspace key>/<run_id>.json`, veritrain.core.user_dirs), each binding the workspace's
path, the run id, the config hash and the SHA-256 of every piece of code a later command would run from the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from veritrain.core import locks, user_dirs
from veritrain.core.errors import RunFailed, UserError
from veritrain.records.record import read_record
from veritrain.records.usercode import CODE_DIR, recorded_listing

log = logging.getLogger("veritrain")

LOCK_GRACE_S = 2.0  # seconds lock_run waits: another process may be looking at the lock (is_held takes it for a moment)


def process_identity(pid: int) -> Optional[str]:
    """`<boot id>:<start time in clock ticks>` of a live process on Linux, None elsewhere: a pid is
    reused, this pair is not."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
        start_ticks = stat[stat.rindex(")") + 2 :].split()[19]  # field 22; the name in (…) may hold spaces
    except (OSError, ValueError, IndexError):
        return None
    return f"{boot_id}:{start_ticks}"


MARKS_DIR = "created"  # in the user's state folder: one folder per workspace, one mark per run it started
MARK_VERSION = 1


def created_mark(root: Path, run_dir: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    """What a mark of the run in `run_dir` binds, as the run's folder is now: the workspace's resolved root, the run id,
    the config hash, the model target (not for a script's run, whose config is the script's own), the recorded script
    (a script's run) and every recorded user module (module, path under code/), each with the SHA-256 of the file a
    later command would run, hashed here from the folder (None when missing) rather than taken from the record."""

    script_run = record.get("kind") == "script"
    model = None if script_run else (record.get("config") or {}).get("model")
    target = model.get("target") if isinstance(model, Mapping) else None
    file = (record.get("script") or {}).get("file") if script_run else None
    script = {"file": str(file), "sha256": _sha256_of(run_dir / str(file))} if file else None
    modules = [{"module": str(e.get("module")), "path": str(e.get("path")), "sha256": _sha256_of(run_dir / CODE_DIR / str(e.get("path")))}
               for e in _code_entries(record)]
    return {"version": MARK_VERSION, "workspace": str(root.resolve()), "run_id": run_dir.name, "config_hash": record.get("config_hash"),
            "model_target": None if target is None else str(target), "script": script,
            "user_files": sorted(modules, key=lambda e: (e["module"], e["path"]))}


def _code_entries(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The user modules a later command imports from the run's code/ (veritrain.records.usercode.recorded_listing)."""

    return [e for e in recorded_listing(record)[0] if isinstance(e, Mapping)]


def _sha256_of(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _code_problem(mark: Mapping[str, Any], now: dict[str, Any], record: Mapping[str, Any]) -> Optional[str]:
    """None when the code held by `mark` is the code of the run now (`now`, from created_mark), and the record lists
    those same hashes; otherwise the first file that differs (a path in the run), or "" when none can be named."""

    script = now["script"]
    if mark.get("script") != script or (script is not None and (script["sha256"] is None
                                                                or (record.get("script") or {}).get("sha256") != script["sha256"])):
        return str((script or mark.get("script") or {}).get("file") or "")
    held = {(e.get("module"), e.get("path")): e.get("sha256") for e in mark.get("user_files") or [] if isinstance(e, Mapping)}
    listed = {(e.get("module"), e.get("path")): e.get("sha256") for e in _code_entries(record)}
    for entry in now["user_files"]:
        key = (entry["module"], entry["path"])
        if entry["sha256"] is None or held.get(key) != entry["sha256"] or listed.get(key) != entry["sha256"]:
            return f"{CODE_DIR}/{entry['path']}"
    current = {(e["module"], e["path"]) for e in now["user_files"]}
    gone = sorted(str(path) for module, path in held if (module, path) not in current)  # listed then, not now
    return f"{CODE_DIR}/{gone[0]}" if gone else None


def _write_private(path: Path, data: bytes) -> None:
    """Replace `path` atomically with `data`, readable by this user alone (0600), in folders that are theirs alone (0700)."""
    state = user_dirs.state_dir()
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in (state / MARKS_DIR, path.parent):
        folder.mkdir(exist_ok=True, mode=0o700)
        os.chmod(folder, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# runs of an outside checkpoint (`eval`/`export --checkpoint FILE` with a state outside the run's trajectory):
# their results are not from the audited training, so `latest` never names one; name it by its id
OUTSIDE_KINDS = ("eval", "export")


def _has_model(workspace: "Workspace", record: dict) -> bool:
    if record.get("kind") == "script":  # veritrain.start: a trained state when its trajectory goes past the initial one
        return len(record.get("trajectory") or []) > 1
    return record.get("kind") not in OUTSIDE_KINDS and any(p.startswith("checkpoints/") and p.endswith(".pt") for p in record.get("artifacts") or {})


def _has_export(workspace: "Workspace", record: dict) -> bool:
    return record.get("kind") not in OUTSIDE_KINDS and "export/model.json" in (record.get("artifacts") or {})


def _resumable(workspace: "Workspace", record: dict) -> bool:
    return record.get("status") == "interrupted" or (record.get("status") == "running" and workspace.lock_is_stale(record["run_id"]))


# what `latest` means for each kind of command: (what it names, the test a run's record must pass)
LATEST = {
    "any": ("run", None),
    "model": ("run with a trained model", _has_model),
    "export": ("run with an exported model", _has_export),
    "resumable": ("interrupted run", _resumable),
}
LATEST_FIX = {
    "any": "start one with `veritrain run`",
    "model": "train one with `veritrain run` or `veritrain train`",
    "export": "export one with `veritrain export RUN`",
    "resumable": "every run finished; start a new one with `veritrain train`",
}


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def open(cls, workdir: str | Path | None) -> "Workspace":
        root = Path(workdir or ".").expanduser()
        if root.exists() and not root.is_dir():
            raise UserError(f"--workdir {root}: not a folder; give a folder for runs and .veritrain/")
        root.mkdir(parents=True, exist_ok=True)
        return cls(root.resolve())

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def state_dir(self) -> Path:
        return self.root / ".veritrain"

    def mark_created(self, run_dir: Path, record: Mapping[str, Any]) -> None:
        """Remember, in this user's state folder, that this workspace started the run in `run_dir` with the config and
        the code its record names now (`created_mark`). Called once the run's code is recorded, and again whenever its
        listing grows, so the mark always holds the code a later command would run. The user's folder, not the
        workspace: whoever writes a workspace (or hands one over) cannot write a mark. A mark that cannot be written
        is said in one line and the run goes on: later commands on it then ask for --trust-code."""
        mark = created_mark(self.root, run_dir, record)
        path = self._mark_path(run_dir.name)
        try:
            _write_private(path, json.dumps(mark, indent=1, sort_keys=True).encode() + b"\n")
        except OSError as err:
            log.warning("run %s: could not remember in %s that this workspace started it (%s); commands that build its model "
                        "will ask for --trust-code", run_dir.name, path, err.strerror or err)

    def created_here(self, run_dir: Path, record: Mapping[str, Any]) -> bool:
        """Whether this user started the run in `run_dir` in this workspace, with the config and code it names now."""
        return self.not_created_here(run_dir, record) is None

    def not_created_here(self, run_dir: Path, record: Mapping[str, Any]) -> Optional[str]:
        """Why the run in `run_dir` does not count as one this user started here (a phrase), or None when it does:
        this user's mark for this workspace and run id must exist, name the record's config hash and model target, and
        hold the SHA-256 of every file a later command would import or run from the run, hashed now from the run's
        folder (the recorded copies under code/, the recorded script). The workspace's own `.veritrain/created/`,
        which older versions wrote, is never read: anyone who writes the workspace could write it."""
        not_started = "this workspace did not start the run (imported, copied or given as a folder)"
        try:
            if run_dir.resolve().parent != self.runs_dir.resolve():
                return not_started
            mark = json.loads(self._mark_path(run_dir.name).read_bytes())
        except (OSError, ValueError, UserError):
            return not_started
        if not isinstance(mark, dict) or mark.get("version") != MARK_VERSION or mark.get("workspace") != str(self.root.resolve()) \
                or mark.get("run_id") != run_dir.name:
            return not_started
        now = created_mark(self.root, run_dir, record)
        if mark.get("config_hash") != now["config_hash"] or mark.get("model_target") != now["model_target"]:
            return "its config differs from the one this user's run of that id recorded (the run folder was replaced)"
        changed = _code_problem(mark, now, record)
        if changed is not None:
            return f"the recorded code differs from what this user's run recorded{f' ({changed})' if changed else ''}"
        return None

    def _mark_path(self, run_id: str) -> Path:
        """`<state folder>/created/<sha256 of the workspace's resolved root, 16 hex>/<run id>.json`."""
        if not run_id or run_id in (".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id:
            raise UserError(f"{run_id!r}: not a run id")
        key = hashlib.sha256(str(self.root.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return user_dirs.state_dir() / MARKS_DIR / key / f"{run_id}.json"

    def new_run_dir(self) -> tuple[str, Path]:
        """Create `runs/<run_id>/`; the id sorts by start time (UTC, milliseconds) and a random
        suffix keeps parallel starts apart (the folder is created exclusively, so never shared)."""
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        while True:
            now = datetime.now(timezone.utc)
            run_id = now.strftime("%Y%m%d-%H%M%S-") + f"{now.microsecond // 1000:03d}-" + secrets.token_hex(3)
            path = self.runs_dir / run_id
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return run_id, path

    def lock_path(self, name: str) -> Path:
        """`.veritrain/locks/<name>.lock`: a run's lock (its id), or another of veritrain.core.locks'."""
        return self.state_dir / "locks" / f"{name}.lock"

    def lock_run(self, run_id: str) -> Path:
        """Hold the run's OS lock (veritrain.core.locks) until `unlock_run` or the end of this process, however it ends:
        a process that holds it is writing the run. Only the process that keeps the record holds it (rank 0 under
        torchrun, the launcher with --nproc). Taken again by its holder, it is counted (an amend inside a command
        that holds the run). UserError when another live process holds it."""
        lock = self.lock_path(run_id)
        if self._legacy_holder_alive(lock) or not locks.acquire(lock, wait_s=LOCK_GRACE_S):
            raise UserError(f"run {run_id}: another process ({locks.holder_text(lock)}) holds {lock}; wait for it to finish")
        return lock

    def lock_is_stale(self, run_id: str) -> bool:
        """True when no live process holds the run's lock: the kernel releases it when its process ends, kill -9
        included. A lock file that no process holds is free; one written by an older veritrain (a pid file, no
        OS lock) still counts as held while its process runs on this host with the start time it recorded."""
        lock = self.lock_path(run_id)
        return not locks.is_held(lock) and not self._legacy_holder_alive(lock)

    @staticmethod
    def _legacy_holder_alive(lock: Path) -> bool:
        holder = locks.holder(lock)
        if not holder or holder.get("lock") == locks.FLOCK or holder.get("host") != socket.gethostname():
            return False
        try:
            pid = int(holder["pid"])  # type: ignore[arg-type]
            os.kill(pid, 0)
        except (ProcessLookupError, KeyError, ValueError, TypeError):
            return False
        except PermissionError:
            pass  # alive, another user's
        recorded, now = holder.get("process"), process_identity(pid)
        return not (recorded and now and recorded != now)  # alive, unless the pid now belongs to another process

    def unlock_run(self, run_id: str) -> None:
        """Let go of the run's lock taken by `lock_run`; a lock file that no process holds is removed too."""
        lock = self.lock_path(run_id)
        locks.release(lock)
        if not self._legacy_holder_alive(lock):
            locks.remove_if_free(lock)

    def resolve_run(self, ref: str, need: str = "any") -> Path:
        """A run by full id, unique id prefix, `latest`, or a run directory path. `latest` is the newest
        run that fits the command (`need`, a key of LATEST): the newest with a trained model for eval,
        export and reproduce, with an export for predict, the newest interrupted one for resume, and the
        newest of any kind otherwise. A line says so when that is not the newest run."""
        candidate = Path(ref).expanduser()
        if candidate.is_dir() and (candidate / "record.json").exists():
            return candidate.resolve()
        runs = sorted(p for p in self.runs_dir.glob("*") if (p / "record.json").exists()) if self.runs_dir.exists() else []
        if ref == "latest":
            return self._latest(runs, need)
        return by_prefix(runs, ref, f"{ref}: no such run in {self.runs_dir}; give a run id, a unique prefix, `latest` or a run folder",
                         f"{ref}: matches {{count}} runs ({{names}}, ...); give a longer prefix")

    def _latest(self, runs: list[Path], need: str) -> Path:
        what, fits = LATEST[need]
        if not runs:
            raise UserError(f"latest: no runs in {self.runs_dir}; start one with `veritrain run`")
        if fits is None:
            return runs[-1]
        newest_script = None
        for run_dir in reversed(runs):
            try:
                record = read_record(run_dir)
            except RunFailed:
                continue  # damaged or being written: `veritrain verify` is the place to say so
            if fits(self, record):
                if run_dir != runs[-1]:
                    log.info("latest: %s, the newest %s; the newest run of all, %s, is not one", run_dir.name, what, runs[-1].name)
                return run_dir
            newest_script = newest_script or (record if record.get("kind") == "script" else None)
        if need == "model" and newest_script is not None:  # the user's own script ran: say why it has no replayable model
            guarantee = newest_script.get("guarantee") or {}
            why = "; ".join(guarantee.get("reasons") or []) or "its trajectory holds no trained state"
            raise UserError(f"latest: no {what} in {self.runs_dir}: the newest script's run, {newest_script['run_id']}, is "
                            f"{guarantee.get('level', 'not replayable')} ({why}), so it cannot be replayed; `veritrain verify "
                            f"{newest_script['run_id']}` checks what it recorded")
        raise UserError(f"latest: no {what} in {self.runs_dir}; {LATEST_FIX[need]}")

    def resolve_data_version(self, ref: str) -> Path:
        """A data version folder by full id or unique prefix, or the version a run used (any RUN form)."""
        store = self.state_dir / "data"
        versions = sorted(p for p in store.glob("*") if (p / "version.json").exists()) if store.exists() else []
        matches = [p for p in versions if p.name.startswith(ref)] if len(ref) >= 4 else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UserError(f"{ref}: matches {len(matches)} data versions; give a longer prefix")
        try:
            run_dir = self.resolve_run(ref)
        except UserError:
            raise UserError(f"{ref}: neither a data version in {store} nor a run; give a version id (or prefix), a run id, `latest` or a run folder") from None

        try:
            version = read_record(run_dir).data_version
        except RunFailed as err:
            raise UserError(f"{ref}: {err}") from None
        if not version or not (store / version / "version.json").exists():
            raise UserError(f"{ref}: run {run_dir.name} used data version {version}, which is not in {store}; prepare it with `veritrain data prepare`")
        return store / version


def by_prefix(folders: list[Path], ref: str, none: str, several: str) -> Path:
    """The one folder whose name starts with `ref`; UserError `none`, or `several` (with {count} and {names}) otherwise."""
    matches = [p for p in folders if p.name.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserError(none)
    raise UserError(several.format(count=len(matches), names=", ".join(p.name for p in matches[:3])))
