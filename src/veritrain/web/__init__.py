"""A read-only view of the workspace: `veritrain ui` serves it locally, `veritrain publish` writes it as
a static site. Both render the same templates from the same page data (views.py); neither writes
anything under runs/ or a data version.

    veritrain ui --port 8765
    veritrain publish latest --out site/ --with-archives
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
TEMPLATES_DIR = HERE / "templates"


def environment() -> jinja2.Environment:
    """The Jinja2 environment: autoescape on for every template, a field a record lacks renders empty."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), autoescape=True,
                             undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(sig4=significant, duration=duration_text, cell=table_cell, num=number_text, val=value_text)
    return env


def number_text(value: Any) -> str:
    """A metric as a table cell shows it (the `num` macro, as a filter: the runs table calls it a thousand times a page)."""
    if value is None:
        return "-"
    return significant(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def value_text(value: Any) -> str:
    """A config value as a table cell shows it (the `val` macro, as a filter): text as is, a float to 4 significant
    digits, anything else as JSON."""
    import json

    if isinstance(value, str):
        return value
    if value is None:
        return "-"
    if isinstance(value, float):
        return significant(value)
    return json.dumps(value)


def significant(value: Any, digits: int = 4) -> str:
    """A number as a page shows it: an integer exactly, a float to `digits` significant digits (0.9444444 → 0.9444,
    12345.6 → 12350, 1.5e-05 stays 1.5e-05). The JSON API keeps the raw value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    text = f"{value:.{digits}g}"
    if "e+" in text:  # a large float: its rounded digits, not an exponent
        text = f"{float(text):.0f}"
    return text


def duration_text(seconds: Any) -> str:
    """Seconds as `42.1 s`, `4 min 12 s` or `2 h 05 min`."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds != seconds or seconds < 0:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def table_cell(text: Any) -> str:
    """A cell of a CSV table (the per-class table): a number in it shown as `significant` shows it, other text as is."""
    cell = str(text)
    try:
        return str(int(cell)) if cell.strip().lstrip("+-").isdigit() else significant(float(cell))
    except ValueError:
        return cell


def page_context(depth: int, static: bool) -> dict[str, Any]:
    """Links relative to a page `depth` folders below the site root, so the same pages work when served
    and when opened from disk (file://); the static site names pages with `.html`."""
    root = "../" * depth
    return {"root": root, "ext": ".html" if static else "", "static": static,
            "static_url": f"{root}static"}
