"""A set of trials' own state: its folder under `.veritrain/` (`sweeps/<id>/` or `searches/<id>/`) with spec.json,
the lock its driver holds, the user code copied at its start, and the runs whose records name it (the records are
the truth, whatever a summary written by a killed process says). Light: a trial's own process reads it too."""

from __future__ import annotations

import json
import secrets
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.records import usercode
from veritrain.records.record import read_record
from veritrain.records.workspace import Workspace, by_prefix


@dataclass(frozen=True)
class Kind:
    """Sweep or search: the name its messages use, its folder under `.veritrain/`, and its spec.json's version key."""

    name: str
    folder: str
    version_key: str
    version: int


SWEEP = Kind("sweep", "sweeps", "sweep_version", 1)
SEARCH = Kind("search", "searches", "search_version", 1)


@dataclass(frozen=True)
class Slot:
    """One run of the set: a trial (None: a sweep's parent) with one of its seeds (a search's trials have one)."""

    trial: Optional[int]
    seed_index: int

    def name(self, repeat: int) -> str:
        who = "parent" if self.trial is None else f"trial-{self.trial:03d}"
        return who if repeat == 1 else f"{who}-seed{self.seed_index}"


def json_bytes(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def new_folder(workspace: Workspace, kind: Kind) -> tuple[str, Path]:
    """A new id (its start time, then six random hex digits) and its empty folder."""
    root = workspace.state_dir / kind.folder
    root.mkdir(parents=True, exist_ok=True)
    while True:
        set_id = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        try:
            (root / set_id).mkdir()
        except FileExistsError:
            continue
        return set_id, root / set_id


def resolve(workspace: Workspace, kind: Kind, ref: str) -> Path:
    """A folder by id, unique id prefix, or `latest` (the newest)."""
    root = workspace.state_dir / kind.folder
    found = sorted(p for p in root.glob("*") if (p / "spec.json").exists()) if root.exists() else []
    if ref == "latest" and found:
        return found[-1]
    return by_prefix(found, ref, f"--resume {ref}: no such {kind.name} in {root}; give a {kind.name} id (its folder name there), a unique "
                     "prefix or `latest`", f"--resume {ref}: matches {{count}} {kind.folder} ({{names}}, ...); give a longer prefix")


def read_spec(workspace: Workspace, kind: Kind, ref: str) -> tuple[Path, dict[str, Any]]:
    """The folder and spec.json of the set `--resume REF` names. spec.json is workspace state that may come from a
    copied workspace: it must be a plan of the format this veritrain reads, and name its own folder."""
    folder = resolve(workspace, kind, ref)
    try:
        spec = json.loads((folder / "spec.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} cannot be read ({err}); the {kind.name} cannot be resumed") from None
    if not isinstance(spec, dict) or spec.get(kind.version_key) != kind.version:
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} is not a {kind.name} plan of format {kind.version} this veritrain reads")
    if spec.get("id") != folder.name:
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} names {kind.name} {str(spec.get('id'))[:40]!r}, not its folder's "
                        f"{folder.name}; start a new {kind.name}")
    return folder, spec


def lock_name(kind: Kind, set_id: str) -> str:
    return f"{kind.name}-{set_id}"  # in .veritrain/locks/ beside the run locks: `gc` clears it when stale


@contextmanager
def driving(workspace: Workspace, kind: Kind, set_id: str, prefix: str) -> Iterator[None]:
    """Hold the set's lock while this process drives it: taken at once or not at all, so that two drivers (two
    `--resume`s started together) never both start its pending runs or write its study."""
    name = lock_name(kind, set_id)
    try:
        workspace.lock_run(name)
    except UserError:
        raise UserError(f"{prefix}{kind.name} {set_id} is still running (a live process holds .veritrain/locks/{name}.lock); "
                        f"wait for it, its summary is .veritrain/{kind.folder}/{set_id}/summary.json") from None
    try:
        yield
    finally:
        workspace.unlock_run(name)


def record_code(folder: Path, config_path: Optional[str], cwd: str, base_config: Any, targets: list[Any]) -> dict[str, Any]:
    """Copy the user code the set's configs name (the base config's, and every `model.target` a trial may take,
    with what it imports) into its `code/` folder, as a run does: every trial runs these copies, so an edit made
    meanwhile never reaches a later trial. A missing module is exit 2 here, before any run starts."""
    listed: dict[str, Any] = {"user_files": []}
    with usercode.fresh(Path(config_path) if config_path else None, Path(cwd)) as session:
        session.import_config(base_config)  # its task's code too, when an entry point names the task
        for target in sorted({str(t) for t in targets if t}):
            session.import_target(target)
        session.save(folder, listed)
    return {"user_files": listed["user_files"], "sha256": usercode.listing_sha256(listed["user_files"])}


def trial_smoke(kind: Kind, spec: dict[str, Any], before: str) -> dict[str, Any]:
    """What a trial's record says of the smoke test: the set runs one, of the base config, not one per trial."""
    ran = spec["smoke"]
    if ran.get("key"):
        return {"status": "skipped", "reason": f"{kind.name} {spec['id']}: one smoke test, of the base config ({ran['key'][:12]}), before {before}"}
    return {"status": "skipped", "reason": f"{kind.name} {spec['id']}: " + (ran.get("reason") or "--no-smoke")}


# Of several runs of one slot, the one that got furthest counts
_FURTHEST = {"completed": 3, "pruned": 3, "interrupted": 2, "running": 2, "failed": 1}


def linked_runs(workspace: Workspace, set_id: str, accept: Callable[[Slot, dict[str, Any]], bool]) -> dict[Slot, dict[str, Any]]:
    """The records of the runs that name this set (their `sweep` link), one per slot that `accept` takes (a copied
    or imported run claiming a slot is refused there), the furthest of several. Run ids begin with their start
    time: only runs that started after the set (less an hour, for the clocks of other Ray nodes) are read."""
    if not workspace.runs_dir.exists():
        return {}
    try:
        since = (datetime.strptime(set_id[:15], "%Y%m%d-%H%M%S") - timedelta(hours=1)).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        since = ""
    found: dict[Slot, dict[str, Any]] = {}
    for run_dir in sorted(workspace.runs_dir.glob("*")):
        if run_dir.name[:15] < since or not (run_dir / "record.json").exists():
            continue
        try:
            record = read_record(run_dir)
        except RunFailed:
            continue
        link = record.get("sweep") or {}
        if link.get("id") != set_id:
            continue
        index = (record.get("repeat") or {}).get("index", 0)
        slot = Slot(link.get("trial"), index if isinstance(index, int) else 0)
        if not accept(slot, record):
            continue
        if slot not in found or _FURTHEST.get(record["status"], 0) >= _FURTHEST.get(found[slot]["status"], 0):
            found[slot] = record
    return found
