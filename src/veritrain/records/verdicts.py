"""The last verify verdict of each run, kept in the user's state folder (`~/.local/state/veritrain/verdicts/<workspace>/
<run_id>.json`, veritrain.core.user_dirs), never in the workspace: a verdict planted by whoever controls the
workspace must not show a forged run as verified.

A verdict is what `verify_run` answered, when, for which seal, and a fingerprint of what it covered (every
file of the run, of its data version and of its raw data: path, size and mtime_ns, never a hash). The run
browser, the run page and `check` show a kept verdict instead of verifying on every view; `latest` marks it
stale when the seal or any covered file has changed since. It is kept outside the run folder: writing into
the run would change the run. No torch import.

    veritrain verify latest     # computes a verdict and keeps it here
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

from veritrain.core.files import write_atomic
from veritrain.core.secrets import expand_env
from veritrain.core.user_dirs import state_dir as user_state
from veritrain.records.record import NOTES_FILE, RECORD_FILE, now_iso

VERDICTS_DIR = "verdicts"  # under the user's state folder, one folder per workspace
Entry = tuple[str, int, int]  # (path relative to its section's root, size in bytes, mtime_ns)


def path_of(state_dir: Path, run_id: str) -> Path:
    """Where the verdict of the workspace's run (`state_dir`: the workspace's .veritrain/) is kept: below the user's
    state folder, in a folder named by the SHA-256 of the workspace's resolved path."""

    workspace = hashlib.sha256(str(state_dir.parent.resolve()).encode()).hexdigest()[:32]
    return user_state() / VERDICTS_DIR / workspace / f"{run_id}.json"


def fingerprint(run_dir: Path, state_dir: Path) -> dict[str, Any]:
    """What a verify of `run_dir` reads, by stat only: {"run": [[path, size, mtime_ns], ...] (every file of the
    run but its notes, which verify does not read), "data_version" and "raw_data": {"count", "sha256"} over the
    same entries of `.veritrain/data/<version>/` and of every recorded data path (absent: count 0)}."""
    record = _record(run_dir)
    data: dict[str, Any] = record["data"] if isinstance(record.get("data"), dict) else {}
    version = data.get("version")
    version_entries = _entries(state_dir / "data" / version) if isinstance(version, str) and "/" not in version and version not in ("", ".", "..") else []
    source: dict[str, Any] = record["config_source"] if isinstance(record.get("config_source"), dict) else {}
    recorded: dict[str, Any] = source["data_paths_resolved"] if isinstance(source.get("data_paths_resolved"), dict) else {}
    raw: list[Entry] = []
    for name, value in sorted(recorded.items()):
        raw += [(f"{name}:{rel}", size, mtime) for rel, size, mtime in _entries(_data_path(value), skip=state_dir)]
    return {"run": [list(e) for e in _entries(run_dir) if e[0] != NOTES_FILE],
            "data_version": _summary(version_entries), "raw_data": _summary(raw)}


def store(run_dir: Path, state_dir: Path, result: dict[str, Any], covered: dict[str, Any],
          verified_at: Optional[str] = None, expect: Optional[str] = None, strict: bool = False) -> dict[str, Any]:
    """Keep `result` (a `verify_run` answer) as the run's last verdict, written atomically; `covered` is the
    fingerprint taken before that verify began, so a file changed while it ran makes the verdict stale."""
    verdict = {"run_id": run_dir.name, "verified_at": verified_at or now_iso(), "seal": result.get("seal"), "ok": bool(result.get("ok")),
               "problems": result.get("problems") or [], "drift": result.get("drift") or [], "expect": expect, "strict": strict,
               "fingerprint": covered, "format": result.get("format"), "signer": result.get("signer"),
               "not_checked": result.get("not_checked") or [], "amendments": result.get("amendments"),
               "base_seal": result.get("base_seal")}
    path = path_of(state_dir, run_dir.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(verdict, indent=1, sort_keys=True, default=str) + "\n").encode())
    return verdict


def latest(run_dir: Path, state_dir: Path) -> Optional[dict[str, Any]]:
    """The run's last kept verdict with "stale" (bool) and "stale_reasons" (why it no longer describes the run:
    the seal changed, a file of the run, of its data version or of its raw data changed); None when none is
    kept (or the kept file is not one this module wrote)."""
    try:
        verdict = json.loads(path_of(state_dir, run_dir.name).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not _well_formed(verdict, run_dir.name):
        return None
    reasons = []
    try:
        seal_now: Optional[str] = hashlib.sha256((run_dir / RECORD_FILE).read_bytes()).hexdigest()
    except OSError:
        seal_now = None
    judged = verdict.get("base_seal") if isinstance(verdict.get("base_seal"), str) else verdict["seal"]  # record.json's own seal
    if seal_now != judged:
        reasons.append(f"the seal changed: record.json now hashes to {seal_now[:16]}…" if seal_now else "the seal changed: record.json is missing")
    now, then = fingerprint(run_dir, state_dir), verdict["fingerprint"]
    before = {e[0]: e[1:] for e in then.get("run") or [] if isinstance(e, list) and len(e) == 3}
    after = {e[0]: e[1:] for e in now["run"]}
    skip = {RECORD_FILE} if seal_now != judged else set()  # already said
    changed = sorted(rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel) and rel not in skip)
    if changed:
        reasons.append(f"{len(changed)} file(s) of the run changed since: {', '.join(changed[:3])}" + (", …" if len(changed) > 3 else ""))
    if now["data_version"] != then.get("data_version"):
        reasons.append("a file of the run's data version changed since")
    if now["raw_data"] != then.get("raw_data"):
        reasons.append("a file of the run's raw data changed since")
    return {**verdict, "stale": bool(reasons), "stale_reasons": reasons}


def _well_formed(verdict: Any, run_id: str) -> bool:
    return (isinstance(verdict, dict) and verdict.get("run_id") == run_id and isinstance(verdict.get("ok"), bool)
            and isinstance(verdict.get("verified_at"), str) and isinstance(verdict.get("seal"), (str, type(None)))
            and isinstance(verdict.get("problems"), list) and all(isinstance(p, dict) for p in verdict["problems"])
            and isinstance(verdict.get("drift"), list) and isinstance(verdict.get("fingerprint"), dict))


def _record(run_dir: Path) -> dict[str, Any]:
    try:
        record = json.loads((run_dir / RECORD_FILE).read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _data_path(value: Any) -> Optional[Path]:
    if not isinstance(value, str):
        return None
    try:
        return Path(expand_env(value)).expanduser()
    except Exception:  # an ${env:...} path whose variable is not set here: nothing to stat
        return None


def _entries(top: Optional[Path], skip: Optional[Path] = None) -> list[Entry]:
    """(relative path, size, mtime_ns) of every file and link below `top` (or of `top` itself when it is a file),
    sorted; links are not followed, and nothing below `skip` is listed (a data root that holds the workspace
    must not list the verdicts kept in it). Empty when `top` is absent."""
    if top is None:
        return []
    skipped = os.path.realpath(skip) if skip is not None else None
    try:
        info = os.stat(top)
    except OSError:
        return []
    if not os.path.isdir(top):
        return [(".", info.st_size, info.st_mtime_ns)]
    found = []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if skipped is None or os.path.realpath(os.path.join(folder, d)) != skipped)
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            found.append((Path(path).relative_to(top).as_posix(), st.st_size, st.st_mtime_ns))
    return sorted(found)


def _summary(entries: list[Entry]) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).hexdigest()
    return {"count": len(entries), "sha256": digest}
