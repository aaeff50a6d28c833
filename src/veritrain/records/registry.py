"""The run registry: an SQLite index (`.veritrain/registry.sqlite`, WAL) of the run folders.

The folders are the truth; the index is a cache, refreshed from any run whose record or notes
changed (by mtime) each time it is read, and rebuilt from scratch by `veritrain runs reindex`.
This module must not import torch: `veritrain runs list` stays fast.

    veritrain runs list --status completed --sort test.accuracy
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import logging
import os
import re
import sqlite3
from pathlib import Path
from typing import Any, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.files import MAX_READ_BYTES, read_regular
from veritrain.core.task_registry import built_in_model_keys
from veritrain.records.amendments import AMENDMENTS_DIR
from veritrain.records.record import NOTES_FILE, RECORD_FILE, read_record, record_problem, thawed
from veritrain.records.run_query import COLUMNS, Where, order_by

# `params`: the config's leaves that differ from the default config, {"optim.lr": 0.01}: the runs table finds the keys
# that differ among thousands of runs from these few values instead of every run's whole config
JSON_COLUMNS = ("metrics", "config", "notes", "params")
SCHEMA_VERSION = 5  # 2: world_size, sweep, sweep_kind and params; 3: params without the settings a run does not use; 4: the
# built-in models' settings as the tasks declare them (model.context among them); 5: params of configs read whole (core.config.completed)

log = logging.getLogger("veritrain")


def connect(state_dir: Optional[Path]) -> sqlite3.Connection:
    """The index in `state_dir`/registry.sqlite; with None, a fresh one in memory."""
    if state_dir is None:
        db = sqlite3.connect(":memory:")
    else:
        state_dir.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(state_dir / "registry.sqlite", timeout=60)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=60000")
    columns = ", ".join(f"{c} {'INTEGER' if c == 'world_size' else 'TEXT'}" for c in COLUMNS[1:]) + ", " + ", ".join(f"{c} TEXT" for c in JSON_COLUMNS)
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    if _schema_of(db) != _schema():  # another layout, or other defaults behind `params`: made again (it is a cache)
        db.execute("BEGIN IMMEDIATE")  # one process at a time; the next one finds it done
        if _schema_of(db) != _schema():
            db.execute("DROP TABLE IF EXISTS runs")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (_schema(),))
        db.commit()
    db.execute(f"CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, {columns}, stamp TEXT)")
    db.execute("CREATE INDEX IF NOT EXISTS runs_by_start ON runs (started_at, run_id)")  # the runs table's default order
    return db


def flatten(config: Optional[dict[str, Any]], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 0.1}} → {"optim.lr": 0.1}; a list is one leaf."""
    flat: dict[str, Any] = {}
    for key, value in (config or {}).items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


@functools.lru_cache(maxsize=1)
def default_leaves() -> dict[str, Any]:
    """The default config's leaves, which `params` is relative to ({} when the defaults cannot be built here)."""
    try:
        from veritrain.core.config import RunConfig, completed

        return flatten(completed(RunConfig().model_dump(mode="json")))
    except Exception:  # a default that cannot be built here (a plugin missing): every leaf counts as changed
        return {}


def generation(db: sqlite3.Connection) -> str:
    """A value that changes whenever a sync changes the index's rows."""
    found = db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
    return str(found[0]) if found else "0"


def _schema_of(db: sqlite3.Connection) -> Optional[str]:
    """The index's recorded layout; None when it has none, or when its table's columns are not this layout's."""
    found = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    names = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
    if names and names != ["run_id", *COLUMNS[1:], *JSON_COLUMNS, "stamp"]:
        return None
    return found[0] if found else None


def _schema() -> str:
    """The index's layout version and a hash of the defaults its `params` were found against."""
    digest = hashlib.sha256(json.dumps(default_leaves(), sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{SCHEMA_VERSION}:{digest}"


def changed_params(config: Any) -> dict[str, Any]:
    """The leaves of `config` that differ from the default config (a key the defaults lack counts as changed), left
    out the settings its run does not use (a user's model ignores the built-in models' settings). The one rule of
    which config keys tell runs apart: the runs table's parameter columns and every comparison of runs read it."""
    from veritrain.core.config import completed  # a key added later, or of the flat model section, at its default is no change

    defaults, missing = default_leaves(), object()
    flat = flatten(completed(config) if isinstance(config, dict) else {})
    return {k: v for k, v in flat.items() if defaults.get(k, missing) != v and not _unused(k, flat)}


def _unused(key: str, changed: dict[str, Any]) -> bool:
    """Whether a run with these config leaves does not use setting `key` (a user's model and the built-in models' keys)."""
    return bool(changed.get("model.target")) and any(key == k or key.startswith(k + ".") for k in built_in_model_keys())


def param_value(changed: dict[str, Any], key: str) -> Any:
    """A run's value of config `key` from its changed_params: its own where it changed it, None for a setting it does
    not use, else the default."""
    if key in changed:
        return changed[key]
    return None if _unused(key, changed) else default_leaves().get(key)


def differing_params(configs: list[Any]) -> list[dict[str, Any]]:
    """The config keys whose value is not the same in all the configs that use them (changed_params: a key a config
    leaves out is at its default), sorted, each with every config's value as param_value shows it (None: not used):
    what the runs table's parameter columns show for these runs (views.differing_keys, the same rule in SQL)."""
    changed = [changed_params(config) for config in configs]
    rows = []
    for key in sorted(set().union(*changed)):
        compared = [c.get(key, default_leaves().get(key)) for c in changed if not _unused(key, c)]
        if len({json.dumps(v, sort_keys=True, default=str) for v in compared}) > 1:
            rows.append({"key": key, "values": [param_value(c, key) for c in changed]})
    return rows


def stamp(run_dir: Path | str) -> Optional[str]:
    """What changes when a run's indexed content changes: record, notes and amendments folder mtimes and sizes (an
    amendment is added by a rename into that folder). (Plain string paths: a sync stats every run folder, and
    pathlib's parsing would cost more than the stats.)"""
    folder = os.fspath(run_dir)
    try:
        record = os.stat(os.path.join(folder, RECORD_FILE))
    except FileNotFoundError:
        return None
    parts = [f"{record.st_mtime_ns}:{record.st_size}"]
    for name in (NOTES_FILE, AMENDMENTS_DIR):
        try:
            found = os.stat(os.path.join(folder, name))
            parts.append(f"{found.st_mtime_ns}:{found.st_size}")
        except FileNotFoundError:
            parts.append("-")
    return "|".join(parts)


def read_notes(run_dir: Path) -> list[dict[str, Any]]:
    """The run's notes, one JSON object with a `text` a line. People edit notes.jsonl by hand (it is
    outside the seal), so a line that is not a note is skipped with a warning, not fatal to the listing."""
    path = run_dir / NOTES_FILE
    if not os.path.lexists(path):
        return []
    found = read_regular(path)  # a regular file only: a FIFO planted there never hangs a listing
    if found is None or found[2] > MAX_READ_BYTES:
        log.warning("%s: not a regular file of at most %d bytes; the run is shown without notes", path, MAX_READ_BYTES)
        return []
    text = found[0].decode("utf-8", errors="replace")
    notes = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            note = json.loads(line)
        except json.JSONDecodeError as err:
            log.warning("%s: line %d: not valid JSON (%s); fix or delete the line", path, number, err.msg)
            continue
        if not isinstance(note, dict) or not isinstance(note.get("text"), str):
            log.warning("%s: line %d: not a note (a JSON object with a \"text\" string); fix or delete the line", path, number)
            continue
        notes.append(note)
    return notes


def _row(run_dir: Path, stamp: str) -> Optional[tuple[Any, ...]]:
    found, sealed = read_regular(run_dir / "record.json"), read_regular(run_dir / "record.sha256", limit=1024)
    try:
        if found is None or found[2] > MAX_READ_BYTES:
            raise ValueError("not a regular file of a record's size")  # a FIFO or a device never hangs the listing
        record = json.loads(found[0].decode("utf-8"))
        seal = sealed[0].decode("ascii").strip() if sealed is not None else None
    except (ValueError, RecursionError):
        return None  # a run being written right now, or damaged: `veritrain verify` is the place to say so
    problem = record_problem(record, run_dir.name)
    if problem is not None:  # a forged or damaged record: one line, and the other runs still list
        log.warning("%s: not listed: %s; `veritrain verify %s` says more", run_dir / "record.json", problem, run_dir.name)
        return None
    if os.path.lexists(run_dir / AMENDMENTS_DIR):  # the run as its amendments leave it
        try:
            amended = read_record(run_dir)
        except RunFailed as err:
            log.warning("%s: not listed: %s", run_dir, err)
            return None
        record, seal = thawed(amended), amended.seal
    values = {
        "run_id": run_dir.name,
        "exp_name": record.get("exp_name"),
        "kind": record.get("kind"),
        "status": record.get("status"),
        "started_at": record.get("started_at"),
        "ended_at": record.get("ended_at"),
        "seed": record.get("seed"),
        "config_hash": record.get("config_hash"),
        "data_version": (record.get("data") or {}).get("version"),
        "final_state_sha256": record.get("final_state_sha256"),
        "hypothesis": record.get("hypothesis"),
        "parent": record.get("parent"),
        "reproduced_from": record.get("reproduced_from"),
        "repeat_group": (record.get("repeat") or {}).get("group"),
        "error": (record.get("error") or {}).get("message"),
        "seal": seal,
        "world_size": (record.get("distributed") or {}).get("world_size") or 1,
        "sweep": (record.get("sweep") or {}).get("id"),
        "sweep_kind": (record.get("sweep") or {}).get("kind", "sweep") if record.get("sweep") else None,
    }
    metrics = listed_metrics(record)
    return (*(values[c] for c in COLUMNS), json.dumps(metrics), json.dumps(record.get("config")), json.dumps(read_notes(run_dir)),
            json.dumps(changed_params(record.get("config"))), stamp)


def listed_metrics(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The metrics the index keeps (and `runs list --json` shows): per split, the numbers of `metrics.<split>`
    (not the per-class tables, names or hashes beside them)."""
    return {split: {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            for split, m in (record.get("metrics") or {}).items()}


def sync(state_dir: Path, runs_dir: Path, rebuild: bool = False) -> sqlite3.Connection:
    """Bring the index up to date with the run folders (only changed runs are read). When the index cannot
    be opened or written (a full disk, a read-only workspace), the runs are read from their folders into an
    index in memory, with one warning line: the folders are the truth, the index only a cache."""
    try:
        return _sync(connect(state_dir), runs_dir, rebuild)
    except (sqlite3.OperationalError, sqlite3.DatabaseError, OSError) as err:
        log.warning("runs: the index %s cannot be written (%s); reading the run folders instead", state_dir / "registry.sqlite", err)
        return _sync(connect(None), runs_dir, rebuild=True)


def _sync(db: sqlite3.Connection, runs_dir: Path, rebuild: bool) -> sqlite3.Connection:
    known = {} if rebuild else dict(db.execute("SELECT run_id, stamp FROM runs"))
    upserts, seen = [], set()
    if runs_dir.exists():
        for entry in os.scandir(runs_dir):
            if not entry.is_dir():
                continue
            found = stamp(entry.path)
            if found is None:
                continue
            seen.add(entry.name)
            if known.get(entry.name) != found:
                row = _row(Path(entry.path), found)
                if row is not None:
                    upserts.append(row)
    with db:
        if rebuild:
            db.execute("DELETE FROM runs")
        marks = ", ".join("?" * (len(COLUMNS) + len(JSON_COLUMNS) + 1))
        db.executemany(f"INSERT OR REPLACE INTO runs VALUES ({marks})", upserts)
        gone = set(known) - seen
        db.executemany("DELETE FROM runs WHERE run_id = ?", [(g,) for g in gone])
        if upserts or gone or rebuild:  # readers that keep what they computed from the rows know it is out of date
            db.execute("INSERT INTO meta VALUES ('generation', '1') ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1")
    return db


def query(state_dir: Path, runs_dir: Path, status: tuple[str, ...] = (), sort: Optional[str] = None,
          filters: tuple[str, ...] = (), limit: Optional[int] = None) -> list[dict[str, Any]]:
    """Runs as dicts (newest first, or by `sort`: a metric path such as `test.accuracy`, or a column).

    `filters` are `key=value`: a column (status, exp_name, kind, seed, data_version, …) or a config
    path (`optim.lr=0.01`, compared as JSON values).
    """

    db = sync(state_dir, runs_dir)
    try:
        _refuse_unknown_keys(db, runs_dir, filters, sort)
    except Exception:
        db.close()
        raise
    where = Where().statuses(status)
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or not key:
            db.close()
            raise UserError(f"--filter {item}: expected KEY=VALUE, e.g. --filter status=completed or --filter optim.lr=0.01")
        if key in COLUMNS:
            where.column(key, value)
        else:
            where.config_value(key, value)
    try:
        order, order_args = order_by(sort or "")
    except UserError:
        db.close()
        raise
    sql = f"SELECT * FROM runs {where.clause} ORDER BY {order}"
    if limit:
        sql += f" LIMIT {int(limit)}"
    cursor = db.execute(sql, [*where.args, *order_args])
    names = [d[0] for d in cursor.description]
    rows = []
    for values in cursor:
        row = dict(zip(names, values))
        for c in JSON_COLUMNS:
            row[c] = json.loads(row[c]) if row[c] else None
        row.pop("stamp", None)
        row.pop("params", None)  # the runs table's shortcut: `config` has them all
        rows.append(row)
    db.close()
    return rows


STATUSES = ("running", "completed", "failed", "interrupted", "pruned")


def _refuse_unknown_keys(db: sqlite3.Connection, runs_dir: Path, filters: tuple[str, ...], sort: Optional[str]) -> None:
    """A filter or sort key that no indexed run has would match nothing, or sort nothing, without a word: refuse
    it (exit 2) with the keys there are. The keys are those of the runs themselves (columns, recorded config
    paths, metric paths), so a key of an older record still works. An empty workspace has nothing to check."""

    if not filters and not sort:
        return
    config_keys: set[str] = set()
    metric_keys: set[str] = set()
    count = 0
    for config, metrics in db.execute("SELECT config, metrics FROM runs"):
        count += 1
        config_keys.update(_paths(json.loads(config) if config else None, leaves_only=False))
        metric_keys.update(_paths(json.loads(metrics) if metrics else None, leaves_only=True))
    if count == 0:
        return
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or not key:
            continue  # the caller's message: expected KEY=VALUE
        if key == "status" and value not in STATUSES:
            raise UserError(f"--filter {item}: status is one of {', '.join(STATUSES)}")
        if key not in COLUMNS and re.sub(r"\[\d+\]", "", key) not in config_keys:  # an item of a list: model.hidden[0]
            raise UserError(f"--filter {item}: no run in {runs_dir} has a column or config key {key!r}{_did_you_mean(key, [*COLUMNS, *config_keys])}; "
                            f"filter on a column ({', '.join(COLUMNS)}) or a config key such as optim.lr (`veritrain config keys` lists them)")
    if sort:
        key = sort.lstrip("-")
        if key not in COLUMNS and key not in metric_keys:
            raise UserError(f"--sort {sort}: no run in {runs_dir} has a column or metric {key!r}{_did_you_mean(key, [*COLUMNS, *metric_keys])}; "
                            f"sort by a metric ({', '.join(sorted(metric_keys)) or 'none recorded yet'}) or a column ({', '.join(COLUMNS)}); "
                            "a leading - sorts smallest first")


def _paths(value: Any, leaves_only: bool, prefix: str = "") -> list[str]:
    """Dotted key paths of nested JSON objects (`optim.lr`); with leaves_only False, the objects' own paths too."""
    if not isinstance(value, dict):
        return [prefix] if prefix else []
    found = [] if leaves_only or not prefix else [prefix]
    for key, inner in value.items():
        found.extend(_paths(inner, leaves_only, f"{prefix}.{key}" if prefix else str(key)))
    return found


def _did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""

