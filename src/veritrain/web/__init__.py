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

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), autoescape=True,
                              undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True)


def page_context(depth: int, static: bool) -> dict[str, Any]:
    """Links relative to a page `depth` folders below the site root, so the same pages work when served
    and when opened from disk (file://); the static site names pages with `.html`."""
    root = "../" * depth
    return {"root": root, "ext": ".html" if static else "", "static": static,
            "static_url": f"{root}static"}
