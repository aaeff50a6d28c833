"""Queries over the run index (veritrain.records.registry): which runs (`Where`) and in what order (`order_by`), as
SQL with its arguments. `veritrain runs list` (registry.query) and the browser's runs table (web.runs_table) build
theirs here, so a filter, a metric range, a text search or a sort by a column or a metric means the same in both.
Values always travel as arguments; only names checked against `COLUMNS` or `METRIC_KEY` reach the SQL text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from veritrain.core.errors import UserError

COLUMNS = ("run_id", "exp_name", "kind", "status", "started_at", "ended_at", "seed", "config_hash", "data_version",
           "final_state_sha256", "hypothesis", "parent", "reproduced_from", "repeat_group", "error", "seal",
           "world_size", "sweep", "sweep_kind")
METRIC_KEY = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")  # a metric path such as test.accuracy
TEXT_COLUMNS = ("run_id", "exp_name", "hypothesis", "notes")  # what a text search looks in
DURATION_SQL = "ROUND((julianday(ended_at) - julianday(started_at)) * 86400.0, 1)"  # seconds


@dataclass
class Where:
    """The conditions of a query, ANDed; each method adds one."""

    parts: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)

    def column(self, name: str, value: Any) -> Where:
        """A column equals `value` (exactly, as stored)."""
        if name not in COLUMNS:
            raise UserError(f"{name}: not a column of the run index ({', '.join(COLUMNS)})")
        self.parts.append(f"{name} = ?")
        self.args.append(value)
        return self

    def statuses(self, values: tuple[str, ...]) -> Where:
        if values:
            self.parts.append(f"status IN ({', '.join('?' * len(values))})")
            self.args.extend(values)
        return self

    def config_value(self, path: str, text: str) -> Where:
        """The recorded config's value at `path` (dotted) equals `text` read as JSON (a bare word as a string)."""
        self.parts.append("json_extract(config, ?) = json_extract(?, '$')")
        self.args.extend([f"$.{path}", json_value(text)])
        return self

    def metric_range(self, metric: str, low: Optional[float], high: Optional[float]) -> Where:
        """A metric (`test.accuracy`) within [low, high]; a run without it is left out when a bound is given."""
        if not METRIC_KEY.fullmatch(metric):
            raise UserError(f"metric: {metric!r} is not a metric path such as test.accuracy")
        for bound, op in ((low, ">="), (high, "<=")):
            if bound is not None:
                self.parts.append(f"CAST(json_extract(metrics, ?) AS REAL) {op} ?")
                self.args += [f"$.{metric}", bound]
        return self

    def text(self, words: str) -> Where:
        """`words` (as typed, no wildcards) in the run id, experiment name, hypothesis or notes."""
        like = "%" + words.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        self.parts.append("(" + " OR ".join(f"IFNULL({c}, '') LIKE ? ESCAPE '\\'" for c in TEXT_COLUMNS) + ")")
        self.args += [like] * len(TEXT_COLUMNS)
        return self

    def run_ids(self, ids: list[str]) -> Where:
        self.parts.append(f"run_id IN ({', '.join('?' * len(ids))})")
        self.args += list(ids)
        return self

    @property
    def clause(self) -> str:
        return ("WHERE " + " AND ".join(self.parts)) if self.parts else ""


def order_by(sort: str, default: str = "started_at DESC, run_id DESC") -> tuple[str, list[Any]]:
    """(ORDER BY text, its arguments) for `sort`: a column, `duration` or a metric path, largest first, smallest first
    with a leading `-`; runs without the value come last, ties newest first. "" sorts by `default`."""
    key = sort.lstrip("-")
    direction = "ASC" if sort.startswith("-") else "DESC"
    if not key:
        return default, []
    if key in COLUMNS:
        return f"{key} IS NULL, {key} {direction}, run_id DESC", []
    if key == "duration":
        return f"{DURATION_SQL} IS NULL, {DURATION_SQL} {direction}, run_id DESC", []
    if METRIC_KEY.fullmatch(key):
        return f"json_extract(metrics, ?) IS NULL, json_extract(metrics, ?) {direction}, started_at DESC, run_id DESC", [f"$.{key}", f"$.{key}"]
    raise UserError(f"sort: {sort!r} is not a column or a metric path")


def json_value(text: str) -> str:
    """`text` as canonical JSON: itself when it is JSON (0.01, true, [16, 32]), else a JSON string."""
    try:
        return json.dumps(json.loads(text))
    except json.JSONDecodeError:
        return json.dumps(text)
