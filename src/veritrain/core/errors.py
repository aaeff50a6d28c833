"""Errors that the CLI turns into one-line messages and exit codes.

A `UserError` means the command could not start (bad usage, config or input: exit 2); a `RunFailed`
means it ran and found a problem (exit 1); `Interrupted` (not an Exception) carries the signal that stopped it
(exit 130 for SIGINT, 143 for SIGTERM). Anything else is a bug and is logged with its traceback.
"""

from __future__ import annotations

import signal


class VeritrainError(Exception):
    """Base class; `str(err)` is the one-line message shown after `error: `."""

    exit_code = 1


class UserError(VeritrainError):
    """The command could not start: bad usage, config or missing input."""

    exit_code = 2


class ConfigError(UserError):
    """A config problem, located as `<file or --set>: <key.path>: <problem and fix>`."""

    def __init__(self, source: str, key: str | None, problem: str):
        self.source, self.key, self.problem = source, key, problem
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {problem}")


class RunFailed(VeritrainError):
    """The command ran and found a problem: a failed run, check or bad data."""

    exit_code = 1


class Interrupted(BaseException):
    """Stopped by SIGINT or SIGTERM; exit code follows the shell convention 128 + signal number.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way (a logging
    handler, a library) can swallow it.
    """

    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
