"""Console, reports and log file: reports (tables, summaries, verdicts) go to stdout, so they can be piped and
grepped; progress, logs and warnings go to stderr; `train.log` in the run keeps everything (debug included).

Under `--json` stdout holds the one JSON document alone: the reports then go to stderr with the progress.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from rich.console import Console

from veritrain.core.display import plain_table, terminal_safe
from veritrain.core.secrets import RedactingFilter

if TYPE_CHECKING:
    from rich.table import Table

console = Console(stderr=True, highlight=False)  # progress, logs and warnings
reports = Console(highlight=False)  # tables, summaries and verdicts: stdout (rich looks up sys.stdout on every print)
_REPORTS_TO_STDERR = {"on": False}  # set by `--json` (see `reports_to_stderr`)
log = logging.getLogger("veritrain")
FILE_ONLY = {"console": False}  # `log.x(..., extra=FILE_ONLY)`: keep a line out of the console


class ConsoleHandler(logging.Handler):
    """INFO and above to the console: through rich on a terminal (so progress bars stay intact),
    as plain lines otherwise."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self._checked_stream: object = None  # the stream `_is_terminal` was decided for
        self._is_terminal = False

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "console", True) is False:
            return
        try:
            message = self.format(record)
            prefix = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
            if console.file is not self._checked_stream:  # rich decides afresh on every call (env, isatty): once per stream here
                self._checked_stream, self._is_terminal = console.file, console.is_terminal
            if not self._is_terminal:  # a pipe or file: no live display to keep intact, no styling
                stream = console.file
                stream.write(f"{prefix}{message}\n")
                stream.flush()
                return
            console.print(f"{prefix}{message}", style="yellow" if prefix else None, markup=False, emoji=False, soft_wrap=True)
        except Exception:  # a logging failure must never end a run
            self.handleError(record)


def reports_to_stderr(on: bool) -> None:
    """Send the reports of this command to stderr (`--json`: stdout holds its one JSON document) or, by
    default, to stdout."""
    _REPORTS_TO_STDERR["on"] = on


def report_console() -> Console:
    """Where a report is printed now: stdout, or stderr under `--json`."""
    return console if _REPORTS_TO_STDERR["on"] else reports


def report(text: str, style: Optional[str] = None) -> None:
    """One line of a report (a verdict, a summary, a next step), printed as written: no markup, no emoji
    codes, never wrapped, so ids and seals stay whole. Its text may hold names from a run folder or a record,
    so each line has its terminal control characters escaped."""

    shown = "\n".join(terminal_safe(line) for line in text.split("\n"))
    report_console().print(shown, style=style, markup=False, emoji=False, highlight=False, soft_wrap=True)


def print_table(table: Table) -> None:
    """A rich table as a report that never splits a run id, hash, seal or path: on a terminal each
    column is at least as wide as the longest unbroken word in it; in a pipe or a file the table keeps
    its natural width (no wrapping at 80 columns), so every value can be copied whole from one line."""

    plain_table(table)  # cells from records are shown as written: control characters escaped, no markup
    out = report_console()
    if not out.is_terminal:
        plain = Console(file=out.file, width=100_000, highlight=False, color_system=None)
        title, table.title = table.title, None  # rich wraps a title at the table's width: a path in it would split
        if title:
            plain.print(title, markup=False, emoji=False, soft_wrap=True)
        plain.print(table)
        return
    for column in table.columns:
        longest = max((len(word) for cell in column.cells for word in str(cell).split()), default=0)
        column.min_width = max(column.min_width or 0, min(longest, 80))
    out.print(table)


def setup_console_logging() -> None:
    if any(isinstance(h, ConsoleHandler) for h in log.handlers):
        return

    handler = ConsoleHandler(level=logging.INFO)
    handler.addFilter(RedactingFilter())
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False


def silence_console() -> None:
    """No console lines from this process (a rank other than 0: rank 0 speaks for the run)."""
    for handler in [h for h in log.handlers if isinstance(h, ConsoleHandler)]:
        log.removeHandler(handler)
    log.propagate = False


def attach_file(path: Path) -> logging.Handler:
    """Send everything (DEBUG and up, with timestamps) to `path` until `detach` is called."""

    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    return handler


def detach(handler: logging.Handler) -> None:
    log.removeHandler(handler)
    handler.close()
