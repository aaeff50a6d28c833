"""Page data for the run browser (`veritrain ui`) and the static site (`veritrain publish`).

Plain functions from a Workspace to dicts that the templates render; they only read the run folders,
the data versions and the index (`.veritrain/registry.sqlite`, a cache). No torch import.
"""

from __future__ import annotations

import csv
import hashlib
import heapq
import io
import json
import logging
import math
import os
import re
import sqlite3
import statistics
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from veritrain.core.errors import UserError
from veritrain.core.files import MAX_READ_BYTES, read_regular
from veritrain.records import registry
from veritrain.records.record import RUN_ID  # the id shape every reader of a record enforces

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
DURATION_SQL = "ROUND((julianday(ended_at) - julianday(started_at)) * 86400.0, 1)"  # seconds
VERSION_ID = re.compile(r"[0-9a-f]{8,64}")
METRIC_KEY = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
EVAL_IMAGES = ("confusion_matrix.png", "confusion_matrix_normalized.png", "bad_cases.png", "curves.png")
NOT_CURVES = ("epoch", "step", "seconds")  # metrics.jsonl keys that are no curve: every other number in it is one
STEP_KEYS = ("loss", "lr", "grad_norm")  # the columns of steps.jsonl the charts draw (samples_per_s is in the file)
OUTSIDE_KINDS = ("eval", "export")  # runs of a checkpoint from outside the run (`eval/export --checkpoint FILE`): not from the audited training
MAX_CSV_ROWS = 1000  # per-class rows shown on a page
# seconds: the index is brought up to date with the run folders at most this often, in a thread (see _index).
# Refreshing reads two file stats per run (about 0.15 s at 10,000 runs), too slow for every sort and filter; a
# new run shows within this time without a restart (the live table asks for a refresh when it sees one).
INDEX_REFRESH_SECONDS = 3.0
_refreshed: dict[Path, float] = {}  # state folder → when its index was last brought up to date (monotonic)
# (workspace, the index's generation, filter) → (parameter keys, filter choices)
_listing_cache: dict[tuple[Any, ...], tuple[list[str], dict[str, list[Any]], list[str]]] = {}


def run_dir_of(workspace: Workspace, run_id: str) -> Path:
    """The folder of a run named by its exact id (never a path or a prefix: ids come from URLs)."""
    if not RUN_ID.fullmatch(run_id or "") or not (workspace.runs_dir / run_id / "record.json").is_file():
        raise UserError(f"{run_id}: no such run in {workspace.runs_dir}")
    return workspace.runs_dir / run_id


def safe_source(root: Path, rel: str) -> Path | None:
    """The regular file `rel` names under root/runs or root/.veritrain/data, after following links;
    None for anything else (`..`, absolute paths, links out, folders, devices)."""
    parts = rel.replace("\\", "/").split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in rel:
        return None
    if not (parts[0] == "runs" or parts[:2] == [".veritrain", "data"]):
        return None
    try:
        real = (root / rel).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    allowed = [(root / "runs").resolve(), (root / ".veritrain" / "data").resolve()]
    if not any(real.is_relative_to(base) for base in allowed) or not real.is_file():
        return None
    return real


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
    where: list[str] = []
    args: list[Any] = []
    for column in FILTER_COLUMNS:
        value = (params.get(column) or "").strip()
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    metric = (params.get("metric") or "").strip()
    low, high = _number(params.get("min"), "min"), _number(params.get("max"), "max")
    if metric:
        if not METRIC_KEY.fullmatch(metric):
            raise UserError(f"metric: {metric!r} is not a metric path such as test.accuracy")
        if low is not None:
            where.append("CAST(json_extract(metrics, ?) AS REAL) >= ?")
            args += [f"$.{metric}", low]
        if high is not None:
            where.append("CAST(json_extract(metrics, ?) AS REAL) <= ?")
            args += [f"$.{metric}", high]
    q = (params.get("q") or "").strip()
    if q:
        like = "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where.append("(" + " OR ".join(f"IFNULL({c}, '') LIKE ? ESCAPE '\\'" for c in ("run_id", "exp_name", "hypothesis", "notes")) + ")")
        args += [like] * 4
    if only is not None:
        where.append(f"run_id IN ({', '.join('?' * len(only))})")
        args += list(only)
    return ("WHERE " + " AND ".join(where)) if where else "", args


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
        return runs - own_models if any(key == k or key.startswith(k + ".") for k in registry.BUILT_IN_MODEL_KEYS) else runs

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
        if not key:
            order = "started_at DESC, run_id DESC"
        elif key in SORT_COLUMNS:
            order = f"{key} IS NULL, {key} {direction}, run_id DESC"
        elif key == "duration":
            order = f"{DURATION_SQL} IS NULL, {DURATION_SQL} {direction}, run_id DESC"
        elif key in param_keys:  # a parameter column: its value where the run changed it, else the default
            value = "IFNULL(json_extract(params, ?), json_extract(?, '$'))"
            order = f"{value} {direction}, run_id DESC"
            order_args = [f'$."{key}"', _canonical(registry.default_leaves().get(key))]
        elif METRIC_KEY.fullmatch(key):
            order = f"json_extract(metrics, ?) IS NULL, json_extract(metrics, ?) {direction}, started_at DESC"
            order_args = [f"$.{key}", f"$.{key}"]
        else:
            raise UserError(f"sort: {sort!r} is not a column or a metric path")
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
            if _finite(value) is not None:
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
            "loss": _finite((step_row or {}).get("loss"))}


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


def _read_json(path: Path) -> Any:
    found = read_regular(path)
    if found is None or found[2] > MAX_READ_BYTES:
        return None
    try:
        return json.loads(found[0].decode("utf-8"))
    except (ValueError, RecursionError):
        return None


def _lines_from(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int, bool]:
    """The JSON objects of the complete lines of `path` after byte `offset`, the offset after the last complete line,
    and whether the file was cut below `offset` (a resumed run rewinds its logs): then it is read from the start."""
    found = read_regular(path, max(0, offset), tail=True)  # a regular file only, at most its last MAX_READ_BYTES
    reset = found is not None and found[2] < offset
    if reset:  # cut below the offset (a resumed run rewinds its logs): read again from the start
        found = read_regular(path, 0, tail=True)
    if found is None:
        return [], offset, False
    data, start, _ = found
    if start > (0 if reset else offset):  # only the tail was read: its first line is cut
        cut = data.find(b"\n") + 1
        data, start = data[cut:], start + cut
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    text = data[:end].decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    try:  # one parse for the whole chunk (a 20,000-step log is read in a few milliseconds)
        parsed = json.loads("[" + ",".join(lines) + "]")
    except (ValueError, RecursionError):  # a damaged line: the others are still read, one by one
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except (ValueError, RecursionError):
                continue
    return [row for row in parsed if isinstance(row, dict)], start + end, reset


def epoch_points(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in rows if type(r.get("epoch")) in (int, float)]
    keys = dict.fromkeys(k for r in rows for k, v in r.items() if k not in NOT_CURVES and type(v) in (int, float))
    return {"epochs": [r["epoch"] for r in rows], "series": {k: _series(rows, k) for k in keys}}


def step_points(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in rows if type(r.get("step")) in (int, float)]
    return {"steps": [r["step"] for r in rows], "step_series": {k: _series(rows, k) for k in STEP_KEYS}}


def _series(rows: list[dict[str, Any]], key: str) -> list[Optional[float]]:
    """Each row's `key` as a finite float, None where it is missing, not a number (a bool is not) or not finite."""
    values: list[Any] = [r.get(key) for r in rows]
    return [float(v) if type(v) in (int, float) and math.isfinite(v) else None for v in values]


def curves(run_dir: Path, record: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """{"epochs": [...], "series": {train_loss: [...], val_loss, lr, and every other number}} from metrics.jsonl,
    {"steps": [...], "step_series": {loss, lr, grad_norm}} from steps.jsonl (empty when the run wrote
    none), "offsets": the bytes of each file read, where a live page's next read starts, and "charts": the charts of
    the metrics the run's task measures after every epoch (`task_charts`)."""
    epoch_rows, metrics_offset, _ = _lines_from(run_dir / "metrics.jsonl")
    step_rows, steps_offset, _ = _lines_from(run_dir / "steps.jsonl")
    return {**epoch_points(epoch_rows), **step_points(step_rows), "offsets": {"metrics": metrics_offset, "steps": steps_offset},
            "charts": task_charts([record] if record is not None else [])}


ENGINE_CURVES = ("val_loss",)  # the epoch keys the engine's own loss chart draws (every task's criterion on val)
ENGINE_CHARTS = ("loss", "lr", "step_loss", "step_lr", "step_grad_norm")  # the charts charts.js draws for every run


def task_charts(records: Sequence[Optional[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One chart per metric the runs' tasks measure on val after every epoch (TaskSpec epoch keys), as charts.js
    draws them: the val line and, where the run logged it, the train line of the same quantity (`train_` for `val_`);
    the compare page draws one val line per run. `bounds` keep the axis within the values the metric can take."""
    from veritrain.core.task_registry import spec_of_record

    charts: dict[str, dict[str, Any]] = {}
    for record in records:
        spec = spec_of_record(dict(record)) if record is not None else None
        for metric in spec.epoch_metrics() if spec is not None else ():
            key = str(metric.epoch_key)
            chart = metric.name if metric.name not in ENGINE_CHARTS else f"task-{metric.name}"
            if key in ENGINE_CURVES or chart in charts:
                continue
            train = f"train_{key[4:]}" if key.startswith("val_") else None
            lines = ([[train, f"train {metric.shown}"]] if train else []) + [[key, f"val {metric.shown}"]]
            charts[chart] = {"id": chart, "title": f"{metric.shown} per epoch", "x": "epoch", "run": lines,
                             "compare": key, "bounds": list(metric.bounds)}
    return list(charts.values())


def live_stamp(run_dir: Path) -> Optional[str]:
    """What changes when a run's record, notes or seal change (file sizes and times); None when it has no record."""
    stamp = registry.stamp(run_dir)
    if stamp is None:
        return None
    try:
        seal = os.stat(run_dir / "record.sha256")
        return f"{stamp}|{seal.st_mtime_ns}:{seal.st_size}"  # the amendments folder is in the registry's stamp
    except OSError:
        return f"{stamp}|-"


def run_live(workspace: Workspace, run_id: str, metrics_offset: int, steps_offset: int, stamp: str) -> dict[str, Any]:
    """What a run page polls: the epoch and step rows written after the offsets it has, and the run's state: its
    status and seal (read again only when its record's stamp differs from `stamp`), or `deleted`."""
    if not RUN_ID.fullmatch(run_id or ""):
        raise UserError(f"{run_id}: not a run id")
    run_dir = workspace.runs_dir / run_id
    now = live_stamp(run_dir)
    if now is None:
        return {"state": "deleted", "run_id": run_id}
    answer: dict[str, Any] = {"run_id": run_id, "stamp": now}
    if now != stamp:
        record = _read_json(run_dir / "record.json")
        answer.update(state=record.get("status") if isinstance(record, dict) else "unreadable", seal=_seal(run_dir))
    epoch_rows, metrics_to, metrics_reset = _lines_from(run_dir / "metrics.jsonl", metrics_offset)
    step_rows, steps_to, steps_reset = _lines_from(run_dir / "steps.jsonl", steps_offset)
    answer.update(epochs=epoch_points(epoch_rows), steps=step_points(step_rows), offsets={"metrics": metrics_to, "steps": steps_to},
                  reset={"metrics": metrics_reset, "steps": steps_reset})
    return answer


def _headline_key(result: Any, names: list[str]) -> Optional[str]:
    """The number a baseline's result is shown by: the first the run's task declares that it holds (display.headline_key)."""
    from veritrain.core.display import headline_key

    return headline_key(result, names)


def visible_text(value: Any) -> str:
    """A model's or a document's text as a page shows it: line breaks and tabs kept, every other control character
    (a byte-level model samples any byte) written as its escape (`\\x02`, `\\r`), so that nothing is hidden or reordered."""
    from veritrain.core.display import CONTROL

    text = value if isinstance(value, str) else ""
    return CONTROL.sub(lambda m: m[0] if m[0] in "\n\t" else m[0].encode("unicode_escape").decode("ascii"), text)


def _listed(value: Any, key: Optional[str] = None, limit: int = 50) -> list[dict[str, Any]]:
    """The objects of a JSON list (or of `value[key]`), at most `limit`, anything else dropped: these files are shown, never trusted."""
    items = value.get(key) if key and isinstance(value, dict) else value
    return [item for item in items[:limit] if isinstance(item, dict)] if isinstance(items, list) else []


def _finite(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def _csv_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    found = read_regular(path)
    if found is None:
        return [], []
    reader = csv.reader(io.StringIO(found[0].decode("utf-8", errors="replace"), newline=""))
    try:
        header = next(reader, [])
        rows = [row for _, row in zip(range(MAX_CSV_ROWS), reader)]
    except csv.Error:
        return [], []
    return header, rows


def _served(record: Any, rel: str) -> str:
    """The workspace path of the run's file `rel` (in the run folder, or in the amendment that wrote it), as /files serves it."""
    return f"runs/{record.run_id}/{record.path(rel).relative_to(record.run_dir).as_posix()}"


def _seal(run_dir: Path) -> Optional[str]:
    """The run's newest seal: its last amendment's, else record.sha256 (as written: verify says whether it holds)."""
    from veritrain.records.amendments import AMENDMENT_SEAL, AMENDMENTS_DIR

    try:
        folder = run_dir / AMENDMENTS_DIR
        newest = max((p for p in folder.iterdir() if p.name.isdigit()), default=None) if folder.is_dir() else None
        return ((newest / AMENDMENT_SEAL) if newest is not None else (run_dir / "record.sha256")).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _reference_config(workspace: Workspace, record: dict[str, Any]) -> tuple[str, Optional[dict[str, Any]]]:
    if record.get("kind") == "script":  # the user's own config: every key is shown, against nothing
        return "script's own config (no defaults)", {}
    parent = record.get("parent")
    if parent and RUN_ID.fullmatch(str(parent)):
        parent_record = _read_json(workspace.runs_dir / str(parent) / "record.json")
        if isinstance(parent_record, dict) and isinstance(parent_record.get("config"), dict):
            return f"parent run {parent}", parent_record["config"]
    try:
        from veritrain.core.config import RunConfig

        return "defaults", RunConfig().model_dump(mode="json")
    except Exception:  # a default that cannot be built here (a plugin missing): no diff rather than no page
        return "defaults", None


MAX_TRAJECTORY_ROWS = 500  # entries of a trajectory shown on a run page (a long run with every_steps has thousands)
MAX_AUDITS = 50  # audit results shown on a run page, newest first


def trajectory(run_dir: Path, record: dict[str, Any], audited: Optional[list[dict[str, Any]]] = None) -> Optional[dict[str, Any]]:
    """The run's trajectory as table rows: step, epoch, short state hash, whether its step file is here, kept
    for audit or left out (an archive made without --with-audit), whether the segment ending at it can be
    replayed from what is on disk (as `veritrain audit` decides), and the newest verdict of the `audited`
    results (`audits`, newest first) on it. None for runs without a trajectory."""
    from veritrain.train.trajectory import kept_checkpoints, start_points  # no torch at import

    entries = record.get("trajectory") or []
    if not entries:
        return None
    available = {e["step"] for e in entries if (run_dir / "checkpoints" / f"step-{e['step']}.pt").is_file()}
    starts = set(start_points(entries, kept_checkpoints(run_dir, record)))
    # every segment with an earlier state to start from (as `veritrain audit` replays it), and that start's step
    replayed_from = {i: entries[max(k for k in starts if k <= i - 1)]["step"] for i in range(1, len(entries)) if any(k <= i - 1 for k in starts)}
    auditable = set(replayed_from)
    verdicts: dict[str, str] = {}
    for result in reversed(audited or []):  # oldest first: a newer audit's verdict replaces an older one
        verdicts.update({s["segment"]: s["verdict"] for s in result["segments"]})
    rows = []
    for index, e in enumerate(entries):
        here = index > 0 and e["step"] in available
        if index == 0:
            checkpoint = "initial state"
        elif e.get("kept_for_audit"):
            checkpoint = "kept for audit" if here else "kept for audit, not here"
        else:
            checkpoint = "kept" if here else "not kept"
        rows.append({"index": index, "step": e["step"], "epoch": e["epoch"], "state_sha256": e["state_sha256"],
                     "checkpoint": checkpoint, "here": here, "kept_for_audit": bool(e.get("kept_for_audit")),
                     "auditable": index in auditable, "replayed_from": replayed_from.get(index),
                     "audit": verdicts.get(str(index)) if index > 0 else None})
    return {"segments": len(entries) - 1, "auditable": len(auditable), "kept_for_audit": sum(r["kept_for_audit"] for r in rows),
            "entries": _first(rows, MAX_TRAJECTORY_ROWS)}


def audits(workspace: Workspace, run_id: str) -> list[dict[str, Any]]:
    """The results `veritrain audit` kept for this run (.veritrain/audits/<run_id>/*.json), newest first. They are
    the auditor's, outside the run's seal: each row names the command that repeats it."""
    folder = workspace.state_dir / "audits" / run_id
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        result = _read_json(path) if path.is_file() and not path.is_symlink() else None
        if not isinstance(result, dict) or result.get("run_id") != run_id:
            continue
        segments = [s for s in result.get("segments") or [] if isinstance(s, dict)] if isinstance(result.get("segments"), list) else []
        found.append({
            "audited_at": _text(result.get("audited_at")), "seed": _text(result.get("seed")), "verdict": _text(result.get("verdict")),
            "segments_audited": result.get("segments_audited") if isinstance(result.get("segments_audited"), int) else None,
            "segments_auditable": result.get("segments_auditable") if isinstance(result.get("segments_auditable"), int) else None,
            "segments_total": result.get("segments_total") if isinstance(result.get("segments_total"), int) else None,
            "cost_fraction": _finite(result.get("cost_fraction")), "command": _text(result.get("command")),
            "segments": [{"segment": _text(s.get("segment")), "from_step": _text(s.get("from_step")), "to_step": _text(s.get("to_step")),
                          "verdict": _text(s.get("verdict")), "detail": _text(s.get("detail"))} for s in segments],
            "differs": [_text(s.get("segment")) for s in segments if s.get("verdict") != "identical"],
            "file": path.name})
    found.sort(key=lambda a: (a["audited_at"], a["file"]), reverse=True)
    return found[:MAX_AUDITS]


def verdict_shown(run_dir: Path, state_dir: Path, verified: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The verify verdict a page shows: `verified` when the caller has just computed it (publish), else the one
    kept in the user's state folder (stale when the seal or a file it covered has changed since); never one
    computed for the page. {"state": "none" | "ok" | "failed" | "stale", "verdict": the verdict or None}."""
    from veritrain.records import verdicts

    verdict = {**verified, "stale": False, "stale_reasons": []} if verified is not None else verdicts.latest(run_dir, state_dir)
    if verdict is None:
        return {"state": "none", "verdict": None}
    shown = {k: verdict.get(k) for k in ("ok", "verified_at", "seal", "problems", "drift", "expect", "strict", "stale", "stale_reasons", "amendments")}
    shown["lines"] = trust_lines(verdict)
    return {"state": "stale" if verdict["stale"] else "ok" if verdict["ok"] else "failed", "verdict": shown}


def trust_lines(verdict: dict[str, Any]) -> list[str]:
    """The record format and the signer a verdict found, as `veritrain verify` prints them (kept verdicts of earlier
    versions have neither)."""
    from veritrain.trust.formats import line
    from veritrain.trust.provenance_check import Signer

    lines = []
    if isinstance(verdict.get("format"), dict):
        try:
            lines.append(line(verdict["format"]))
        except (KeyError, TypeError):
            pass
    if isinstance(verdict.get("signer"), dict):
        try:
            lines.append(Signer(**verdict["signer"]).line())
        except TypeError:
            pass
    return lines


def run_page(workspace: Workspace, run_id: str, with_check: bool = True, verified: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Everything the run page shows, from the run folder alone. `verified`: the verify result the caller
    computed for this page (publish); without it the page shows the verdict kept in the workspace, if any."""
    from veritrain.records.experiments import config_diff, flatten
    from veritrain.records.record import read_record
    from veritrain.trust.check import amendment_rows, signed_by

    run_dir = run_dir_of(workspace, run_id)
    record = read_record(run_dir)
    notes = registry.read_notes(run_dir)
    reference, ref_config = _reference_config(workspace, record)
    changed = config_diff(ref_config, record.get("config")) if ref_config is not None else {}
    evals = []
    splits = {rel.split("/")[1]: rel for rel in sorted(record.get("artifacts") or {}) if rel.startswith("eval/") and rel.count("/") == 2}
    for split, first in sorted(splits.items()):
        split_dir = record.path(first).parent  # in the run, or in the amendment that wrote it
        if split_dir.is_dir() and not split_dir.is_symlink():
            images = {name.removesuffix(".png"): _served(record, f"eval/{split}/{name}")
                      for name in EVAL_IMAGES if (split_dir / name).is_file() and not (split_dir / name).is_symlink()}
            header, rows = _csv_rows(split_dir / "per_class.csv")
            evals.append({"split": split, "images": images, "per_class_header": header, "per_class": rows,
                          "metrics": (record.get("metrics") or {}).get(split) or {},
                          # a language model's: the samples from the fixed prompts and the documents it scores worst
                          "generations": [{**g, "prompt": visible_text(g.get("prompt")), "text": visible_text(g.get("text"))}
                                          for g in _listed(_read_json(split_dir / "generations.json"), "samples")],
                          "bad_documents": [{**d, "excerpt": visible_text(d.get("excerpt"))} for d in _listed(_read_json(split_dir / "bad_cases.json"))]})
    from veritrain.records.experiments import shown_metrics

    names = shown_metrics(record)
    baselines = [{"name": name, "metric": _headline_key(result, names), "value": (result or {}).get(_headline_key(result, names) or "")}
                 for name, result in ((record.get("baselines") or {}).get("results") or {}).items()]
    export = record.get("export") or {}
    parity = export.get("parity") or None
    env = {k: v for k, v in flatten(record.get("env") if isinstance(record.get("env"), dict) else {}).items()}
    artifacts = [{"path": path, "size": (info or {}).get("size"), "sha256": (info or {}).get("sha256")}
                 for path, info in sorted((record.get("artifacts") or {}).items())]
    audited = audits(workspace, record["run_id"])
    interrupted = interrupted_amend(run_dir, workspace.state_dir)
    verdict = verdict_shown(run_dir, workspace.state_dir, verified)
    if verified is None and record.get("status") != "running":
        # what a look at the folder finds (a seal, a size, a file missing or added, a pending amend) is a problem verify
        # reports too: the page says the run does not verify rather than show a verdict kept before the damage
        from veritrain.trust.verify import quick_problems

        found = quick_problems(run_dir) + ([{"path": f".veritrain/journal/{run_dir.name}", "kind": "amend_pending", "detail": interrupted}]
                                           if interrupted else [])
        if found:
            verdict = {"state": "failed", "quick": True, "verdict": {
                "ok": False, "verified_at": None, "seal": _seal(run_dir), "problems": found, "drift": [], "expect": None,
                "strict": False, "stale": False, "stale_reasons": []}}
    check = None
    if with_check:
        from veritrain.trust.check import check_run

        if verdict.get("quick"):
            check = check_run(run_dir, workspace.state_dir, verdict["verdict"])
        elif verdict["state"] in ("ok", "failed"):  # a fresh verdict: the checklist shows it, computes none
            check = check_run(run_dir, workspace.state_dir, verdict["verdict"])
        else:
            why = ("stale: " + "; ".join(verdict["verdict"]["stale_reasons"]) if verdict["state"] == "stale"
                   else "not verified yet") + f" (Verify, or `veritrain verify {record['run_id']}`)"
            check = check_run(run_dir, workspace.state_dir, unverified=why)
    return {
        "run_id": record["run_id"], "record": record, "status": record.get("status"), "kind": record.get("kind"),
        "exp_name": record.get("exp_name"), "hypothesis": record.get("hypothesis"),
        "started_at": record.get("started_at"), "ended_at": record.get("ended_at"),
        "stamp": live_stamp(run_dir), "error": record.get("error"), "seal": _seal(run_dir), "seal_history": record.get("seal_history") or [],
        "base_seal": record.chain.base_seal if record.chain is not None else None,
        "amendments": [{**row, "signed": signed_by(row["signer"])} for row in amendment_rows(record, verdict.get("verdict") if verdict.get("state") in ("ok", "failed") else None)],
        "notes": [n for n in notes if not n.get("conclusion")], "conclusions": [n for n in notes if n.get("conclusion")],
        "reference": reference, "config_changed": [{"key": k, "reference": a, "value": b} for k, (a, b) in changed.items()],
        "config_hash": record.get("config_hash"), "data": record.get("data") or {},
        "metrics": {split: {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                    for split, m in (record.get("metrics") or {}).items() if isinstance(m, dict)},
        "training": record.get("training") or {}, "curves": curves(run_dir, record), "evals": evals, "baselines": baselines,
        "export_files": sorted(export.get("files") or {}), "parity": parity, "events": record.get("events") or [],
        "env": env, "code": record.get("code") or {}, "artifacts": artifacts, "check": check,
        "trajectory": trajectory(run_dir, record, audited), "audits": audited, "verdict": verdict,
        "outside": record.get("kind") in OUTSIDE_KINDS, "parent": record.get("parent"),
        "interrupted_amend": interrupted,
        "headline": headline(record), "duration": _duration(record.get("started_at"), record.get("ended_at")),
        "metric_texts": {split: {k: v for k, v in m.items() if isinstance(v, str)}
                         for split, m in (record.get("metrics") or {}).items() if isinstance(m, dict)},
        "live": record.get("status") == "running",
        # a script's run (veritrain.start): what it can prove, the script and how it was started, its inputs
        "guarantee": record.get("guarantee"), "script": record.get("script") if record.get("kind") == "script" else None,
        "inputs": record.get("inputs"),
    }


def headline(record: dict[str, Any]) -> dict[str, Any]:
    """The overview's metrics: for each split evaluated, the first metrics the run's task declares that it has, each
    beside every baseline's value of the same metric (baselines are scored on the test split)."""
    from veritrain.core.task_registry import spec_of_record
    from veritrain.records.experiments import SHOWN

    spec = spec_of_record(record)
    metrics = record.get("metrics") or {}
    results = ((record.get("baselines") or {}).get("results") or {}) if isinstance(record.get("baselines"), dict) else {}
    names = [n for n, r in results.items() if isinstance(r, dict)]
    rows = []
    for split, values in metrics.items():
        if not isinstance(values, dict):
            continue
        for declared in spec.metrics[:SHOWN] if spec is not None else ():  # the first metrics the run's task declares
            value = _finite(declared.value(values))
            if value is None:
                continue
            base = [_finite(declared.value(results[n])) if split == "test" else None for n in names]
            rows.append({"split": split, "key": declared.name, "value": value, "baselines": base})
    return {"rows": rows, "baselines": names}


def _duration(started: Any, ended: Any) -> Optional[float]:
    """Seconds from started_at to ended_at (ISO times), None when either is missing."""
    from datetime import datetime

    try:
        return round((datetime.fromisoformat(str(ended)) - datetime.fromisoformat(str(started))).total_seconds(), 1) if started and ended else None
    except ValueError:
        return None


def damaged_page(workspace: Workspace, run_id: str, problem: str) -> dict[str, Any]:
    """A run whose record cannot be read: its id, the problem and what a look at the folder finds."""
    from veritrain.trust.verify import quick_problems

    run_dir = run_dir_of(workspace, run_id)
    files = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink())
    return {"run_id": run_id, "problem": problem, "problems": quick_problems(run_dir), "files": files[:500], "seal": _seal(run_dir)}


def interrupted_amend(run_dir: Path, state_dir: Path) -> Optional[str]:
    """The problem `veritrain verify` reports while an amend of the run is pending (its journal is in the workspace), or None."""
    from veritrain.trust.verify import pending_amend

    return pending_amend(run_dir, state_dir)


def compare_page(workspace: Workspace, run_ids: list[str]) -> dict[str, Any]:
    """2–6 runs side by side: config and environment differences against the first, metrics with deltas,
    data versions and every run's curves."""
    from veritrain.records.experiments import compare
    from veritrain.records.record import read_record

    run_ids = [r for r in dict.fromkeys(run_ids) if r]
    if not 2 <= len(run_ids) <= 6:
        raise UserError("compare: give 2 to 6 runs, e.g. ?runs=RUN1,RUN2")
    records = [read_record(run_dir_of(workspace, r)) for r in run_ids]
    comparison = compare(records)
    labels = change_labels(comparison)
    comparison["labels"] = labels
    comparison["curves"] = {"runs": {r["run_id"]: curves(workspace.runs_dir / r["run_id"], r) for r in records}, "labels": labels,
                            "charts": task_charts(records)}
    comparison["headline_metrics"] = [m for m in comparison["metrics"] if ".per_class." not in f".{m['key']}." and "per_class" not in m["key"]]
    comparison["per_class_metrics"] = [m for m in comparison["metrics"] if m not in comparison["headline_metrics"]]
    return comparison


LABEL_KEYS = 3  # config keys a curve's label names, before `…`


def change_labels(comparison: dict[str, Any]) -> dict[str, str]:
    """Each compared run named by its values of the config keys that differ (`optim.lr=0.01, seed=2`), so the
    curves say what changed; a run whose config is the same as the others' keeps its id. Two runs that would read
    the same get their id added."""
    rows = [r for r in comparison["config"] if r["key"] not in OWN_COLUMNS] or comparison["config"]
    labels = {}
    for index, run_id in enumerate(comparison["run_ids"]):
        parts = [f"{r['key']}={_label_value(r['values'][index])}" for r in rows[:LABEL_KEYS]]
        labels[run_id] = (", ".join(parts) + (", …" if len(rows) > LABEL_KEYS else "")) if parts else run_id
    seen: dict[str, int] = {}
    for label in labels.values():
        seen[label] = seen.get(label, 0) + 1
    return {r: (f"{label} ({r[-6:]})" if seen[label] > 1 and label != r else label) for r, label in labels.items()}


def _label_value(value: Any) -> str:
    from veritrain.web import significant

    if isinstance(value, float):
        return significant(value)
    return value if isinstance(value, str) else json.dumps(value)


def data_dir_of(workspace: Workspace, version: str) -> Path:
    if not VERSION_ID.fullmatch(version or "") or not (workspace.state_dir / "data" / version / "version.json").is_file():
        raise UserError(f"{version}: no such data version in {workspace.state_dir / 'data'}")
    return workspace.state_dir / "data" / version


MAX_DATA_ROWS = 500  # rows of a data version's long tables shown on its page
SPLITS = ("train", "val", "test")


def _first(rows: list[Any], limit: int = MAX_DATA_ROWS) -> dict[str, Any]:
    """The first `limit` rows and how many more there are."""
    return {"rows": rows[:limit], "more": max(0, len(rows) - limit), "total": len(rows)}


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def data_page(workspace: Workspace, version: str) -> dict[str, Any]:
    """A data version: the achieved split against the asked ratios, the quarantine, findings counted by kind,
    label issues and outliers with the gallery of flagged samples, the other findings, the data card and charts.
    Every table is plain rows of text and numbers (the template renders them), the long ones cut at MAX_DATA_ROWS."""
    folder = data_dir_of(workspace, version)
    report = _read_json(folder / "data_report.json")
    report = report if isinstance(report, dict) else {}
    found = read_regular(folder / "data_report.md")
    report_md = found[0].decode("utf-8", errors="replace") if found is not None else None
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)] if isinstance(report.get("findings"), list) else []
    quarantined = [q for q in report.get("quarantined") or [] if isinstance(q, dict)] if isinstance(report.get("quarantined"), list) else []
    summary = report["summary"] if isinstance(report.get("summary"), dict) else {}

    gallery_name = report["gallery"] if isinstance(report.get("gallery"), str) else "flagged.png"
    gallery_path = folder / gallery_name
    gallery = (f".veritrain/data/{version}/{gallery_name}"
               if "/" not in gallery_name and gallery_path.is_file() and not gallery_path.is_symlink() else None)
    images = [f".veritrain/data/{version}/{p.name}" for p in sorted(folder.glob("*.png"))
              if p.is_file() and not p.is_symlink() and p.name != gallery_name]

    achieved = summary["achieved_split"] if isinstance(summary.get("achieved_split"), dict) else {}
    per_class = achieved["per_class"] if isinstance(achieved.get("per_class"), dict) else {}
    split_rows = [{"class": str(name), "samples": (s or {}).get("samples"), **{k: _finite((s or {}).get(k)) for k in SPLITS},
                   "largest_gap": _finite((s or {}).get("largest_gap")), "allowed": _finite((s or {}).get("allowed"))}
                  for name, s in per_class.items() if isinstance(s, dict) or s is None]
    asked = achieved["asked"] if isinstance(achieved.get("asked"), dict) else {}
    wanted = achieved["wanted_for_free_samples"] if isinstance(achieved.get("wanted_for_free_samples"), dict) else {}
    split = {"judged": bool(achieved.get("judged")), "asked": {k: _finite(v) for k, v in asked.items()},
             "wanted": {k: _finite(v) for k, v in wanted.items()}, "rows": split_rows,
             "skewed": [_text(r) for r in achieved.get("skewed") or []] if isinstance(achieved.get("skewed"), list) else [],
             "present": bool(achieved)}

    quarantine = [{"sample_id": _text(q.get("sample_id")), "kind": _text(q.get("kind")), "reason": _text(q.get("reason"))} for q in quarantined]
    flagged, others = [], []
    for f in findings:
        samples = [_text(s) for s in f.get("samples") or []] if isinstance(f.get("samples"), list) else []
        if f.get("kind") in ("label_issue", "outlier"):
            flagged.append({"kind": _text(f.get("kind")), "rank": f.get("rank") if isinstance(f.get("rank"), int) else None,
                            "sample_id": samples[0] if samples else "", "split": _text(f.get("split")),
                            "label": _text(f.get("label")), "suggested": _text(f.get("suggested")), "score": _finite(f.get("score")),
                            "severity": _text(f.get("severity"))})
        else:
            others.append({"kind": _text(f.get("kind")), "severity": _text(f.get("severity")), "samples": samples[:3],
                           "more_samples": max(0, len(samples) - 3), "reason": _text(f.get("reason"))})
    by_kind = report["findings_by_kind"] if isinstance(report.get("findings_by_kind"), dict) else {}
    q_by_kind = summary["quarantined_by_kind"] if isinstance(summary.get("quarantined_by_kind"), dict) else {}
    card = report["card"] if isinstance(report.get("card"), dict) else {}
    warnings = report["card_warnings"] if isinstance(report.get("card_warnings"), list) else []
    return {"version": version, "report": report, "report_md": report_md, "source": report.get("source"),
            "counts": report.get("counts") if isinstance(report.get("counts"), dict) else {},
            "classes": [_text(c) for c in report.get("classes") or []] if isinstance(report.get("classes"), list) else [],
            "findings_by_kind": {_text(k): v for k, v in by_kind.items()},
            "quarantined_by_kind": {_text(k): v for k, v in q_by_kind.items()},
            "achieved_split": split, "quarantine": _first(quarantine), "flagged": _first(flagged), "other_findings": _first(others),
            "card": [{"key": _text(k), "value": _text(v)} for k, v in card.items()], "card_warnings": [_text(w) for w in warnings],
            "gallery": gallery, "images": images}


def experiments_page(workspace: Workspace, only: Optional[list[str]] = None) -> dict[str, Any]:
    """The experiment log (what experiments.md shows), built from the index: newest first, each entry with
    its hypothesis, config changes against its reference run, headline metrics and notes."""
    from veritrain.records.experiments import config_diff, reference_of, shown_metrics

    rows = registry.query(workspace.state_dir, workspace.runs_dir)
    if only is not None:
        rows = [r for r in rows if r["run_id"] in set(only)]
    ordered = sorted(rows, key=lambda r: r["started_at"] or "")
    by_id = {r["run_id"]: r for r in rows}
    entries = []
    for row in reversed(ordered):
        reference = reference_of(row, by_id, ordered)
        changed = config_diff(reference["config"], row["config"]) if reference else {}
        shown = shown_metrics(row)
        metrics = [(f"{split}.{name}", value) for split, values in (row["metrics"] or {}).items()
                   for name, value in values.items() if name in shown]
        entries.append({"row": row, "reference": reference["run_id"] if reference else None,
                        "changed": [{"key": k, "reference": a, "value": b} for k, (a, b) in changed.items()],
                        "metrics": metrics, "notes": row["notes"] or []})
    return {"entries": entries, "sweeps": sweeps_of(workspace.state_dir, only), "searches": searches_of(workspace.state_dir, only)}


def searches_of(state_dir: Path, only: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """Each search as the experiments page lists it, newest first (its page shows the rest); with `only`, a search
    only when all its runs are among them."""
    from veritrain.records.experiments import search_summaries

    shown = []
    for summary in search_summaries(state_dir):
        trials = _listed(summary, "trials", limit=10_000)
        run_ids = [t["run_id"] for t in trials if isinstance(t.get("run_id"), str)]
        if only is not None and not set(run_ids) <= set(only):
            continue
        best = summary.get("best") if isinstance(summary.get("best"), dict) else {}
        selection: dict[str, Any] = summary["selection"] if isinstance(summary.get("selection"), dict) else {}
        shown.append({"id": _text(summary.get("id")), "exp_name": _text(summary.get("exp_name")), "status": _text(summary.get("status")),
                      "trials": len(trials), "metric": f"{_text(selection.get('split'))} {_text(selection.get('metric'))}",
                      "best": {"number": best.get("number"), "value": _metric_value(best.get("value"))} if best else None})
    return shown


def sweeps_of(state_dir: Path, only: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """Each sweep's summary.json as the experiments page shows it, newest first: the trials with their val metric and
    delta, the best trial (chosen on val) and its test result, labelled as not used for selection. With `only` (what
    `publish` includes), a sweep only when all its runs are among them; a summary of another shape is left out."""
    from veritrain.records.experiments import sweep_summaries

    shown = []
    for summary in sweep_summaries(state_dir):
        try:
            shown.append(_sweep_view(summary))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if only is not None and not set(shown[-1]["run_ids"]) <= set(only):
            shown.pop()
    return shown


def _metric_value(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sweep_view(summary: dict[str, Any]) -> dict[str, Any]:
    metric = (summary.get("headline") or {}).get("metric")
    split = _text(summary.get("split"))
    best = summary.get("best") or {}
    trials, run_ids = [], list(summary["parent"].get("run_ids") or [])
    for trial in summary["trials"]:
        run_ids += trial.get("run_ids") or []
        trials.append({"index": trial["index"], "change": ", ".join(f"{k}={_text(v)}" for k, v in (trial.get("change") or {}).items()),
                       "runs": ", ".join(trial.get("run_ids") or []) or "-", "status": _text(trial.get("status")),
                       "value": _metric_value((trial.get("metrics") or {}).get(metric)), "delta": _metric_value((trial.get("deltas") or {}).get(metric)),
                       "best": best.get("trial") == trial["index"]})
    report = best.get("test") or {}
    chosen = None
    if best:
        chosen = {"trial": best["trial"], "change": ", ".join(f"{k}={_text(v)}" for k, v in (best.get("change") or {}).items()),
                  "value": _metric_value(best.get("value")), "delta": _metric_value(best.get("delta")),
                  "test": _metric_value((report.get("metrics") or {}).get(metric)), "label": _text(report.get("label") or "not used for selection")}
    return {"id": _text(summary["id"]), "exp_name": _text(summary.get("exp_name")), "status": _text(summary.get("status")),
            "split": split, "metric": _text(metric), "trials": trials, "best": chosen, "run_ids": run_ids,
            "parent": {"runs": ", ".join(summary["parent"].get("run_ids") or []) or "-", "status": _text(summary["parent"].get("status")),
                       "value": _metric_value((summary["parent"].get("metrics") or {}).get(metric))}}


SWEEP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def recomputed_best(workspace: Workspace, trials: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any]:
    """The best trial computed again from the trials' own run records (the val metric of each completed run, the mean
    over a trial's seeds; the first of equals), never from summary.json, and whether the summary agrees: {"best", "value",
    "agrees", "detail"} (threat: a summary edited, and its SHA256SUMS made again, to name another winner)."""
    from veritrain.core.errors import RunFailed
    from veritrain.records.record import read_record

    values: dict[Any, float] = {}
    for trial in trials:
        if trial["state"] != "completed" or not trial["run_ids"]:
            continue
        found = []
        for run_id in trial["run_ids"]:
            try:
                record = read_record(run_dir_of(workspace, run_id))
            except (RunFailed, UserError):
                continue
            value = _finite(((record.get("metrics") or {}).get("val") or {}).get(metric))
            if record.status == "completed" and value is not None:
                found.append(value)
        if found and len(found) == len(trial["run_ids"]):
            values[trial["number"]] = statistics.fmean(found)
    if not values:
        return {"best": None, "value": None, "agrees": True, "detail": "no completed trial's run record is here to recompute it from"}
    best = (max if mode == "max" else min)(values, key=lambda number: values[number])
    named = next((t for t in trials if t["best"]), None)
    disagree = [f"summary.json names trial {named['number'] if named else 'none'} as the best, the trials' run records give trial "
                f"{best} (val {metric} {values[best]:.4f})"] if named is None or named["number"] != best else []
    disagree += [f"trial {t['number']}: summary.json says {t['value']:.4f}, its run records {values[t['number']]:.4f}" for t in trials
                 if t["number"] in values and t["value"] is not None and not math.isclose(t["value"], values[t["number"]], rel_tol=1e-9, abs_tol=1e-12)]
    return {"best": best, "value": values[best], "agrees": not disagree,
            "detail": "; ".join(disagree[:4]) if disagree else f"trial {best}, recomputed from the trials' run records"}


def _summary_of(workspace: Workspace, sweep_id: str) -> tuple[str, Path, dict[str, Any]]:
    """("search" or "sweep", its folder, its summary.json) for a sweep or search named by its exact id."""
    if SWEEP_ID.fullmatch(sweep_id or ""):
        for kind, parent in (("search", "searches"), ("sweep", "sweeps")):
            folder = workspace.state_dir / parent / sweep_id
            summary = _read_json(folder / "summary.json")
            if isinstance(summary, dict) and isinstance(summary.get("trials"), list):
                return kind, folder, summary
    raise UserError(f"{sweep_id}: no such sweep or search in {workspace.state_dir}")


def _axis(key: str, values: list[Any]) -> dict[str, Any]:
    """A parallel-coordinates axis of one varied key: numeric (log-scaled when its positive values span over two
    decades, as a learning rate's do) or categorical (each distinct value, as text, in the order met)."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if values and len(numbers) == len(values):
        low, high = min(numbers), max(numbers)
        return {"key": key, "kind": "log" if low > 0 and high / low >= 100 else "linear", "min": low, "max": high}
    labels = list(dict.fromkeys(_text(v) for v in values))
    return {"key": key, "kind": "category", "labels": labels}


def _space_axis(param: dict[str, Any]) -> dict[str, Any]:
    """A parallel-coordinates axis over what a search's space allows (not only the values its trials took)."""
    kind = param.get("kind")
    if kind == "choice" and isinstance(param.get("choices"), list):
        return {"key": param["key"], "kind": "category", "labels": [_text(c) for c in param["choices"]]}
    low, high = _finite(param.get("low")), _finite(param.get("high"))
    if low is None or high is None:
        return {"key": param["key"], "kind": "category", "labels": []}
    scale = "log" if str(kind).startswith("log") and low > 0 else "linear"
    return {"key": param["key"], "kind": scale, "min": low, "max": high}


def sweep_page(workspace: Workspace, sweep_id: str) -> dict[str, Any]:
    """A sweep's or a search's page: every trial with the val metric that selected and the test metric beside it
    (not used for selection), the best trial, the data of a parallel-coordinates plot of the varied keys against the
    val metric, the seed spread of repeated trials, and whether the search's seal (SHA256SUMS) still holds."""
    kind, folder, summary = _summary_of(workspace, sweep_id)
    selection: dict[str, Any] = summary["selection"] if isinstance(summary.get("selection"), dict) else {}
    metric = _text(selection.get("metric") or (summary.get("headline") or {}).get("metric"))
    mode = _text(selection.get("mode") or (summary.get("headline") or {}).get("mode") or "max")
    trials = []
    for t in _listed(summary, "trials", limit=10_000):
        change = t.get("change") if isinstance(t.get("change"), dict) else {}
        if kind == "search":
            number, state, run_ids = t.get("number"), _text(t.get("state")), [t["run_id"]] if isinstance(t.get("run_id"), str) else []
            value = _metric_value(t.get("value"))
            test = _metric_value(((t.get("test") or {}).get("metrics") or {}).get(metric))
            spread = None
        else:
            number, state, run_ids = t.get("index"), _text(t.get("status")), [r for r in t.get("run_ids") or [] if isinstance(r, str)]
            value = _metric_value((t.get("metrics") or {}).get(metric))
            test = None  # a sweep reads the test split of its best trial only
            s = ((t.get("spread") or {}).get(metric)) if isinstance(t.get("spread"), dict) else None
            spread = {"mean": _finite(s.get("mean")), "std": _finite(s.get("std")), "n": s.get("n"),
                      "values": [_finite(v) for v in s.get("values") or []],
                      "ci95": [_finite(v) for v in s.get("ci95") or []]} if isinstance(s, dict) else None
        pruned = t.get("pruned") if isinstance(t.get("pruned"), dict) else None
        trials.append({"number": number, "state": state, "change": change, "run_ids": run_ids, "value": value, "test": test,
                       "spread": spread, "pruned_epoch": pruned.get("epoch") if pruned else None, "error": _text(t.get("error")) or None,
                       "intermediate": [p for p in t.get("intermediate") or [] if isinstance(p, list) and len(p) == 2]})
    best = summary.get("best") if isinstance(summary.get("best"), dict) else None
    best_number = (best or {}).get("number", (best or {}).get("trial"))
    if best is not None and kind == "sweep":  # the one test result a sweep reads: its best trial's
        for t in trials:
            if t["number"] == best_number:
                t["test"] = _metric_value(((best.get("test") or {}).get("metrics") or {}).get(metric))
    for t in trials:
        t["best"] = best is not None and t["number"] == best_number
    space: dict[str, Any] = summary["space"] if isinstance(summary.get("space"), dict) else {}
    declared = {p["key"]: p for p in space.get("params") or [] if isinstance(p, dict) and isinstance(p.get("key"), str)}
    keys = list(dict.fromkeys([*declared, *(k for t in trials for k in t["change"])]))
    axes = [_space_axis(declared[k]) if k in declared else _axis(k, [t["change"].get(k) for t in trials if k in t["change"]])
            for k in keys]
    scored = [t["value"] for t in trials if t["value"] is not None]
    plot = {"axes": axes, "metric": f"{_text(selection.get('split') or 'val')} {metric}", "mode": mode,
            "range": [min(scored), max(scored)] if scored else None,
            "trials": [{"number": t["number"], "state": t["state"], "best": t["best"], "value": t["value"],
                        "values": [t["change"].get(k) if isinstance(t["change"].get(k), (int, float)) and not isinstance(t["change"].get(k), bool)
                                   else _text(t["change"].get(k)) if k in t["change"] else None for k in keys]} for t in trials]}
    seal = None
    if kind == "search":
        from veritrain.orchestration.search.summary import check_seal

        problems = check_seal(folder)
        seal = {"ok": not problems, "problems": problems}
    return {"id": sweep_id, "kind": kind, "recomputed": recomputed_best(workspace, trials, metric, mode), "exp_name": _text(summary.get("exp_name")), "status": _text(summary.get("status")),
            "split": _text(selection.get("split") or "val"), "metric": metric, "mode": mode, "trials": trials, "varied": keys,
            "best": next((t for t in trials if t["best"]), None), "plot": plot, "seal": seal, "counts": summary.get("counts") or {},
            "sampler": (summary.get("sampler") or {}) if kind == "search" else None,
            "pruner": (summary.get("pruner") or {}) if kind == "search" else None,
            "reproducible": summary.get("reproducible"), "repeat": summary.get("repeat"),
            "space": [p for p in space.get("params") or [] if isinstance(p, dict)],
            "created_at": _text(summary.get("created_at")), "updated_at": _text(summary.get("updated_at"))}
