"""How a value and a key path read inside a one-line config message: quoted like JSON, on one line, cut to
a readable width, non-printable characters escaped (a file name, key or value can hold anything)."""

from __future__ import annotations

import json
from typing import Any, Iterable


def quoted_list(values: Iterable[object]) -> str:
    return ", ".join(repr(v) for v in values)


def kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(type(value), type(value).__name__)


def shown_value(value: Any, width: int = 80) -> str:
    """A value as a message quotes it: JSON-like, on one line, cut to about `width` characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"  # str() refuses past 4,300 digits, and nobody reads them
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):  # a date, bytes, a set (repr is only for the message), or a huge integer inside
        try:
            text = repr(value)
        except ValueError:
            text = f"a {type(value).__name__}"
    return text if len(text) <= width else f"{text[: width - 20]}… ({len(text):,} characters)"


def key_text(parts: list[str], width: int = 60) -> str:
    """A key path for a message: non-printable characters escaped, each part cut to `width` characters."""
    shown = []
    for part in parts:
        part = part if part.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in part)
        shown.append(part if len(part) <= width else part[: width - 1] + "…")
    return ".".join(shown)


def one_line(text: str, width: int = 200) -> str:
    return key_text([text], width) if not text.isprintable() or len(text) > width else text
