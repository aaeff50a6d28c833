"""What is shown to people and scripts from records that may come from anywhere (an imported archive, a hand
edit): text with its terminal control characters escaped, tables whose cells are never read as rich markup,
and JSON that stays JSON when a value is NaN or infinite.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Optional, Sequence

from rich.text import Text

if TYPE_CHECKING:
    from rich.table import Table

# C0 controls (ESC starts the sequences that move the cursor, retitle the window or hide text), DEL, C1 controls
# (a one-byte CSI), and the bidirectional overrides and isolates that reorder what a line appears to say
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """`text` with each control character written as its Python escape (`\\x1b`, `\\n`, `\\u202e`): one line,
    printed as it reads."""
    if not CONTROL.search(text):
        return text
    return CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def plain_table(table: Table) -> Table:
    """A rich Table with its title and every text cell escaped (`terminal_safe`) and made literal: a hypothesis
    holding `[/]` or an escape sequence is shown as written, never interpreted. Returns the same table."""

    if isinstance(table.title, str):
        table.title = Text(terminal_safe(table.title))
    for column in table.columns:  # rich keeps a column's cells in `_cells` and has no public way to replace them
        column._cells = [Text(terminal_safe(cell)) if isinstance(cell, str) else cell for cell in column._cells]
    return table


def finite_json(payload: Any) -> tuple[Any, list[str]]:
    """(`payload` with every NaN and ±Infinity replaced by null, the paths of those values as
    `results[0].top[0].prob`): JSON has no such numbers, and `json.dumps` would write bare `NaN`."""
    found: list[str] = []

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            found.append(path or "$")
            return None
        if isinstance(value, dict):
            return {key: walk(item, f"{path}.{key}" if path else str(key)) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(item, f"{path}[{index}]") for index, item in enumerate(value)]
        return value

    return walk(payload, ""), found


def headline_key(result: Any, names: Sequence[str]) -> Optional[str]:
    """The number that sums up a result (metrics, a baseline): the first of `names` (what the run's task declares,
    headline first; a baselines document's `judged_by` metric) it holds as a number, else its first number (a task
    not known here), else None."""
    if not isinstance(result, dict):
        return None
    numbers = [k for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return next((k for k in names if k in numbers), numbers[0] if numbers else None)


def headline(result: Any, names: Sequence[str]) -> str:
    """`accuracy 0.9444` or `bits_per_byte 2.3712` (headline_key and its value), or `-`."""
    key = headline_key(result, names)
    return f"{key} {result[key]:.4f}" if key is not None else "-"


def rows_axis(rows: Sequence[Any]) -> tuple[str, list[Any]]:
    """How the rows of metrics.jsonl are placed on a curve's x axis: ("epoch", their epochs), or ("step", their steps)
    when two rows share an epoch (a run that validates every `eval.every_steps` steps)."""
    epochs = [row.get("epoch") for row in rows]
    if len(set(map(repr, epochs))) < len(epochs) and all(isinstance(row.get("step"), int) for row in rows):
        return "step", [row["step"] for row in rows]
    return "epoch", epochs
