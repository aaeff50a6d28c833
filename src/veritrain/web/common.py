"""What the pages of the run browser and the published site share: where a run is, safe file reads, numbers and text as pages show them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from veritrain.core.errors import UserError
from veritrain.core.files import MAX_READ_BYTES, read_regular
from veritrain.records.record import RUN_ID  # the id shape every reader of a record enforces

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace

VERSION_ID = re.compile(r"[0-9a-f]{8,64}")
OUTSIDE_KINDS = ("eval", "export")  # runs of a checkpoint from outside the run (`eval/export --checkpoint FILE`): not from the audited training


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


def read_json(path: Path) -> Any:
    found = read_regular(path)
    if found is None or found[2] > MAX_READ_BYTES:
        return None
    try:
        return json.loads(found[0].decode("utf-8"))
    except (ValueError, RecursionError):
        return None


def lines_from(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int, bool]:
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


def visible_text(value: Any) -> str:
    """A model's or a document's text as a page shows it: line breaks and tabs kept, every other control character
    (a byte-level model samples any byte) written as its escape (`\\x02`, `\\r`), so that nothing is hidden or reordered."""
    from veritrain.core.display import CONTROL

    text = value if isinstance(value, str) else ""
    return CONTROL.sub(lambda m: m[0] if m[0] in "\n\t" else m[0].encode("unicode_escape").decode("ascii"), text)


def listed_rows(value: Any, key: Optional[str] = None, limit: int = 50) -> list[dict[str, Any]]:
    """The objects of a JSON list (or of `value[key]`), at most `limit`, anything else dropped: these files are shown, never trusted."""
    items = value.get(key) if key and isinstance(value, dict) else value
    return [item for item in items[:limit] if isinstance(item, dict)] if isinstance(items, list) else []


def finite_number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


MAX_DATA_ROWS = 500  # rows of a long table shown on a page


def first_rows(rows: list[Any], limit: int = MAX_DATA_ROWS) -> dict[str, Any]:
    """The first `limit` rows and how many more there are."""
    return {"rows": rows[:limit], "more": max(0, len(rows) - limit), "total": len(rows)}


def shown_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)
