"""The runs table (the browser's front page): one page of the index's runs, filtered, sorted and grouped in SQL, and the live rows.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import os
import re
import sqlite3
import statistics
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from veritrain.core.errors import UserError
from veritrain.core.files import read_regular
from veritrain.core.task_registry import built_in_model_keys
from veritrain.records import registry
from veritrain.records.record import RUN_ID  # the id shape every reader of a record enforces
from veritrain.records.run_query import DURATION_SQL, METRIC_KEY, Where, order_by
from veritrain.web.common import OUTSIDE_KINDS, finite_number

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace

PAGE_SIZE = 100
TABLE_METRICS = 3  # metric columns of the most common task among the listed runs until the user picks others (and each other task's headline)
MAX_METRIC_COLUMNS = 12
FILTER_COLUMNS = ("status", "exp_name", "kind", "data_version", "sweep", "repeat_group")
SORT_COLUMNS = ("run_id", "exp_name", "kind", "status", "started_at", "ended_at", "seed", "data_version", "world_size")
GROUPS = ("exp_name", "sweep", "repeat_group")  # what the runs table groups by (experiment, sweep or search, --repeat group)
MAX_GROUPS = 500
OWN_COLUMNS = ("exp_name",)  # config keys the table shows in a column of their own, never as a parameter column
# seconds: the index is brought up to date with the run folders at most this often, in a thread (see _index).
# Refreshing reads two file stats per run (about 0.15 s at 10,000 runs), too slow for every sort and filter; a
# new run shows within this time without a restart (the live table asks for a refresh when it sees one).
INDEX_REFRESH_SECONDS = 3.0
_refreshed: dict[Path, float] = {}  # state folder → when its index was last brought up to date (monotonic)
# (workspace, the index's generation, filter) → (parameter keys, filter choices)
_listing_cache: dict[tuple[Any, ...], tuple[list[str], dict[str, list[Any]], list[str]]] = {}


def _number(text: Optional[str], name: str) -> Optional[float]:
    if text in (None, ""):
        return None
    try:
        return float(text)  # type: ignore[arg-type]
    except ValueError:
        raise UserError(f"{name}: {text!r} is not a number") from None


def metric_columns(text: Optional[str]) -> list[str]:
    """The metric columns a user picked (`cols=test.accuracy,val.accuracy` in the URL); none: the listed runs' tasks'
    (`default_columns`)."""
    picked = [m.strip() for m in (text or "").split(",") if m.strip()]
    for m in picked:
        if not METRIC_KEY.fullmatch(m) or "." not in m:
            raise UserError(f"cols: {m!r} is not a metric path such as test.accuracy; list them with commas")
    if len(picked) > MAX_METRIC_COLUMNS:
        raise UserError(f"cols: {len(picked)} metric columns; pick at most {MAX_METRIC_COLUMNS}")
    return list(dict.fromkeys(picked))


def default_columns(db: sqlite3.Connection, clause: str, args: list[Any]) -> list[str]:
    """The test metrics the runs table shows until the user picks: the first TABLE_METRICS the most common task among
    the listed runs declares, then each other task's headline (veritrain.core.task_spec)."""
    from veritrain.core.task_registry import spec_of_record

    tasks = db.execute(f"SELECT json_extract(config, '$.task') AS task, COUNT(*) AS n FROM runs {clause} "
                       "GROUP BY task ORDER BY n DESC, task LIMIT 20", args).fetchall()
    columns: list[str] = []
    for rank, (task, _) in enumerate(tasks):
        spec = spec_of_record({"config": {"task": task}}) if isinstance(task, str) else None
        if spec is not None:
            columns += [f"test.{name}" for name in (spec.names(TABLE_METRICS) if rank == 0 else [spec.headline.name])]
    return list(dict.fromkeys(columns))[:MAX_METRIC_COLUMNS]


def _where(params: Mapping[str, str], only: Optional[list[str]]) -> tuple[str, list[Any]]:
    where = Where()
    for column in FILTER_COLUMNS:
        value = (params.get(column) or "").strip()
        if value:
            where.column(column, value)
    metric = (params.get("metric") or "").strip()
    low, high = _number(params.get("min"), "min"), _number(params.get("max"), "max")
    if metric:
        where.metric_range(metric, low, high)
    q = (params.get("q") or "").strip()
    if q:
        where.text(q)
    if only is not None:
        where.run_ids(only)
    return where.clause, where.args


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def differing_keys(db: sqlite3.Connection, clause: str, args: list[Any]) -> list[str]:
    """The config keys whose value is not the same in every run the table lists (all its pages) that uses them, from
    each run's `params` (its leaves that differ from the defaults, registry.changed_params): a key no run changed has
    the default everywhere, and a key some runs changed and others did not differs (registry.differing_params is
    the same rule in Python)."""
    runs, own_models = db.execute(f"SELECT COUNT(*), COUNT(json_extract(params, '$.\"model.target\"')) FROM runs {clause}", args).fetchone()
    counted = db.execute(f"SELECT j.key, COUNT(*), COUNT(DISTINCT j.type || ':' || j.value) "
                         f"FROM (SELECT params FROM runs {clause}) AS r, json_each(r.params) AS j GROUP BY j.key", args)

    def using(key: str) -> int:  # a run of a user's model does not use the built-in models' settings (registry.changed_params)
        return runs - own_models if any(key == k or key.startswith(k + ".") for k in built_in_model_keys()) else runs

    return sorted(key for key, present, distinct in counted if (distinct > 1 or present < using(key)) and key not in OWN_COLUMNS)


param_value = registry.param_value


def runs_table(workspace: Workspace, params: Mapping[str, str], page_size: int = PAGE_SIZE,
               only: Optional[list[str]] = None, fresh: bool = False) -> dict[str, Any]:
    """One page of the runs table: filtered, sorted and counted in SQL on the index.

    params: status, exp_name, kind, data_version, sweep, repeat_group (exact), metric with min/max (a metric path
    such as test.accuracy), q (text in run id, exp_name, hypothesis or notes), sort (a column, `duration`, a
    metric path or a config key, largest first as in `runs list`, smallest first with a leading `-`), page (from 1),
    cols (the metric columns, comma-separated), group (exp_name, sweep or repeat_group: one row per group with
    each metric column's mean ± sd). The parameter columns are the config keys that differ among the listed runs.
    `fresh`: bring the index up to date first (a live table that saw a run change).
    """
    clause, args = _where(params, only)
    columns = metric_columns(params.get("cols"))
    group = (params.get("group") or "").strip()
    if group and group not in GROUPS:
        raise UserError(f"group: {group!r} is not one of {', '.join(GROUPS)}")
    sort = (params.get("sort") or "").strip()
    key = sort.lstrip("-")
    descending = not sort.startswith("-")
    direction = "DESC" if descending else "ASC"
    order_args: list[Any] = []
    db = _index(workspace, fresh)
    try:
        # what depends on every listed run, not on the page, is kept until a sync changes the index
        # (an index in memory, made for this request alone, is never kept)
        in_memory = _in_memory(db)
        cache_key = (str(workspace.state_dir), in_memory, registry.generation(db), clause, tuple(args))
        if in_memory:
            _listing_cache.pop(cache_key, None)
        if cache_key not in _listing_cache:
            if len(_listing_cache) > 64:
                _listing_cache.clear()
            choices = {c: [v for (v,) in db.execute(f"SELECT DISTINCT {c} FROM runs WHERE {c} IS NOT NULL ORDER BY {c} LIMIT 200")]
                       for c in ("status", "exp_name")}
            _listing_cache[cache_key] = (differing_keys(db, clause, args), choices, default_columns(db, clause, args))
        param_keys, choices, defaults = _listing_cache[cache_key]
        columns = columns or defaults
        if key in param_keys and key not in SORT_COLUMNS:  # a parameter column: its value where the run changed it, else the default
            value = "IFNULL(json_extract(params, ?), json_extract(?, '$'))"
            order = f"{value} {direction}, run_id DESC"
            order_args = [f'$."{key}"', _canonical(registry.default_leaves().get(key))]
        else:
            order, order_args = order_by(sort)
        asked = (params.get("page") or "1").strip()
        if not re.fullmatch(r"[+-]?[0-9]+", asked):
            raise UserError(f"page: {params.get('page')!r} is not a page number")
        total = db.execute(f"SELECT COUNT(*) FROM runs {clause}", args).fetchone()[0]
        # clamped to the pages there are: SQLite's OFFSET is a 64-bit integer, and a page past the end shows nothing
        last_page = max(1, -(-total // page_size))
        page = 1 if asked.startswith("-") else min(last_page, int(asked) if len(asked) <= 18 else last_page)
        page = max(1, page)
        cursor = db.execute(f"SELECT run_id, exp_name, kind, status, started_at, data_version, hypothesis, seal, metrics, params, "
                            f"world_size, sweep, sweep_kind, repeat_group, {DURATION_SQL} FROM runs {clause} "
                            f"ORDER BY {order} LIMIT ? OFFSET ?", [*args, *order_args, page_size, (page - 1) * page_size])
        rows = []
        metric_names: set[str] = set()
        for (run_id, exp_name, kind, status, started_at, data_version, hypothesis, seal, metrics, changed, world_size, sweep,
             sweep_kind, repeat_group, duration) in cursor:
            values = json.loads(metrics) if metrics else {}
            changed_values = json.loads(changed) if changed else {}
            metric_names.update(f"{split}.{name}" for split, m in values.items() if isinstance(m, dict) for name in m)
            rows.append({"run_id": run_id, "exp_name": exp_name, "kind": kind, "outside": kind in OUTSIDE_KINDS, "status": status,
                         "started_at": started_at, "data_version": data_version, "hypothesis": hypothesis, "seal": seal,
                         "world_size": world_size, "sweep": sweep, "sweep_kind": sweep_kind, "repeat_group": repeat_group,
                         "duration": duration, "metrics": {m: _lookup(values, m) for m in columns},
                         "params": {k: param_value(changed_values, k) for k in param_keys},
                         "progress": progress(workspace.runs_dir / run_id) if status == "running" else None})
        groups = _groups(db, clause, args, group, columns) if group else None
    finally:
        db.close()
    return {"rows": rows, "total": total, "page": page, "pages": last_page, "page_size": page_size,
            "params": {k: params.get(k) or "" for k in ("sort", *FILTER_COLUMNS, "metric", "min", "max", "q", "cols", "group")},
            "metrics": columns, "param_keys": param_keys, "choices": choices, "groups": groups,
            "metric_names": sorted(metric_names | set(columns))}


def table_columns(table: dict[str, Any]) -> list[dict[str, str]]:
    """The runs table's columns, in order: {key (what a sort link sends), label, kind: column|param|metric}."""
    def columns(*pairs: tuple[str, str]) -> list[dict[str, str]]:
        return [{"key": k, "label": label, "kind": "column"} for k, label in pairs]

    # what a row is judged by comes first (its metrics, then what differs), the bookkeeping after
    return [*columns(("run_id", "run"), ("exp_name", "experiment"), ("status", "status")),
            *({"key": m, "label": m, "kind": "metric"} for m in table["metrics"]),
            *({"key": k, "label": k, "kind": "param"} for k in table["param_keys"]),
            *columns(("kind", "kind"), ("started_at", "started"), ("duration", "duration"), ("world_size", "ranks"),
                     ("data_version", "data"), ("hypothesis", "hypothesis"))]


def _groups(db: sqlite3.Connection, clause: str, args: list[Any], group: str, columns: list[str]) -> list[dict[str, Any]]:
    """One row per group of the listed runs (experiment, sweep or --repeat group), newest first: how many runs, how
    many completed, and each metric column's mean ± sample sd over the runs that have it."""
    where = f"{clause} {'AND' if clause else 'WHERE'} {group} IS NOT NULL"
    picked = ", ".join("json_extract(metrics, ?)" for _ in columns)
    found: dict[str, dict[str, Any]] = {}
    for name, status, started_at, *values in db.execute(f"SELECT {group}, status, started_at, {picked} FROM runs {where}",
                                                        [*[f"$.{m}" for m in columns], *args]):
        entry = found.setdefault(name, {"name": name, "runs": 0, "completed": 0, "last_started": "", "values": [[] for _ in columns]})
        entry["runs"] += 1
        entry["completed"] += status == "completed"
        entry["last_started"] = max(entry["last_started"], started_at or "")
        for column, value in zip(entry["values"], values):
            if finite_number(value) is not None:
                column.append(float(value))
    groups = sorted(found.values(), key=lambda g: g["last_started"], reverse=True)[:MAX_GROUPS]
    for g in groups:
        values = g.pop("values")
        g["stats"] = {m: {"mean": statistics.fmean(v) if v else None, "sd": statistics.stdev(v) if len(v) > 1 else None, "n": len(v)}
                      for m, v in zip(columns, values)}
    return groups


NEWEST_WATCHED = 8  # run folders (the newest by id, which starts with the time) whose records the live table watches


def table_live(workspace: Workspace, running: list[str]) -> dict[str, Any]:
    """What the live runs table polls: a token that changes when a run folder is added or removed or a listed running
    run's record changes (the table is then fetched again), and each listed running run's progress. Stats and the
    ends of two files per running run: nothing is read when nothing changed."""
    parts = []
    try:  # a folder added or removed changes runs/ itself; a new run's record appears in one of the newest folders
        parts.append(str(workspace.runs_dir.stat().st_mtime_ns))
        newest = heapq.nlargest(NEWEST_WATCHED, (e.name for e in os.scandir(workspace.runs_dir) if RUN_ID.fullmatch(e.name)))
        parts += [f"{name}:{registry.stamp(workspace.runs_dir / name)}" for name in newest]
    except OSError:
        parts.append("-")
    runs = {}
    for run_id in running:
        if not RUN_ID.fullmatch(run_id):
            continue
        run_dir = workspace.runs_dir / run_id
        stamp = registry.stamp(run_dir)
        parts.append(f"{run_id}:{stamp}")
        runs[run_id] = progress(run_dir) if stamp is not None else None
    return {"token": hashlib.sha256("|".join(parts).encode()).hexdigest()[:16], "runs": runs}


def progress(run_dir: Path) -> dict[str, Any]:
    """A running run's latest step and epoch: the last lines of steps.jsonl and metrics.jsonl (read from their ends)."""
    step_row, epoch_row = _last_line(run_dir / "steps.jsonl"), _last_line(run_dir / "metrics.jsonl")
    return {"step": (step_row or epoch_row or {}).get("step"), "epoch": (epoch_row or {}).get("epoch"),
            "loss": finite_number((step_row or {}).get("loss"))}


def _last_line(path: Path, window: int = 8192) -> Optional[dict[str, Any]]:
    found = read_regular(path, limit=window, tail=True)
    if found is None:
        return None
    for line in reversed(found[0].splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being written, or cut by the window
        if isinstance(row, dict):
            return row
    return None


def _in_memory(db: sqlite3.Connection) -> bool:
    """Whether `db` is the index in memory that a workspace whose index cannot be written falls back to."""
    return not any(row[2] for row in db.execute("PRAGMA database_list") if row[1] == "main")


def _index(workspace: Workspace, fresh: bool = False) -> sqlite3.Connection:
    """The run index. The first read in this process, or a `fresh` one, brings it up to date with the run folders
    first; after that a read older than INDEX_REFRESH_SECONDS starts that refresh in a thread and answers from the
    index as it is (a refresh stats every run folder: about 0.15 s at 10,000 runs, which no page should wait for)."""
    state_dir = workspace.state_dir
    last = _refreshed.get(state_dir)
    if not fresh and last is not None and (state_dir / "registry.sqlite").is_file():
        if time.monotonic() - last >= INDEX_REFRESH_SECONDS:
            _refresh_in_background(workspace)
        try:
            return registry.connect(state_dir)
        except sqlite3.Error:
            pass  # the index cannot be opened now: refresh (sync falls back to one in memory)
    started = time.monotonic()
    db = registry.sync(state_dir, workspace.runs_dir)
    _refreshed[state_dir] = started
    return db


_refreshing_lock = threading.Lock()


def _refresh_in_background(workspace: Workspace) -> None:
    """One refresh of the index at a time per workspace, in a thread; the next read after it sees its rows."""
    with _refreshing_lock:
        last = _refreshed.get(workspace.state_dir, 0.0)
        if time.monotonic() - last < INDEX_REFRESH_SECONDS:
            return  # another request started it
        _refreshed[workspace.state_dir] = time.monotonic()

    def refresh() -> None:
        try:
            registry.sync(workspace.state_dir, workspace.runs_dir).close()
        except Exception as err:  # the next foreground read says it; a page is never failed by a background refresh
            logging.getLogger("veritrain").warning("runs: refreshing the index failed (%s)", err)

    threading.Thread(target=refresh, name="veritrain-index", daemon=True).start()


def _lookup(values: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(values, dict):
            return None
        values = values.get(part)
    return values
