"""The `veritrain` command: parse arguments, call one library function, render, exit.

Exit codes: 0 success; 1 the command ran and found a problem (failed run); 2 it could not start
(bad usage, config or missing input); 130/143 interrupted by SIGINT/SIGTERM. Errors are one line on
stderr (`error: ...`). Reports (tables, summaries, verdicts) go to stdout, progress and warnings to stderr;
`--json` prints exactly one JSON document on stdout (the reports then go to stderr).

The package: this module holds the `veritrain` group and `main` (the entry point, which turns every error into
its one line and exit code); the commands live by what they work on, `training` (run, train, sweep), `stages`
(eval, baseline, export, predict, generate, smoke), `trust` (verify, check, reproduce, audit, archive, import), `runs` (the
runs group, gc, ui, publish) and `inputs` (the data and config groups); `options` spells the shared options once
and `render` turns results into text. A command imports the library modules it calls inside its body, so that
`veritrain --help` loads click and these modules only.
"""

from __future__ import annotations

import errno
import sqlite3
import sys
from typing import Optional

import click

from veritrain.cli import inputs, keys, render, runs, stages, training, trust
from veritrain.cli.render import emit_json
from veritrain.core import logs
from veritrain.core.errors import Interrupted, UserError, VeritrainError
from veritrain.core.version import __version__

__all__ = ["FULL_DISK", "cli", "emit_json", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="veritrain", message="%(prog)s %(version)s")
def cli() -> None:
    """veritrain: verifiable training for PyTorch.

    Every run is recorded in runs/<run_id>/ with its config, data version, environment, logs,
    metrics, checkpoints and a record.json that lists every file with its SHA-256.
    """


for _command in (
    training.run_command, training.train_command, training.sweep_command, training.search_command,
    stages.eval_command, stages.baseline_command, stages.export_command, stages.predict_command, stages.generate_command, stages.smoke_command,
    trust.verify_command, trust.check_command, runs.gc_command, trust.archive_command, trust.import_command,
    trust.reproduce_command, trust.audit_command,
    runs.runs_group, inputs.data_group, inputs.config_group, keys.keys_group, runs.ui_command, runs.publish_command,
):
    cli.add_command(_command)


def main(argv: Optional[list[str]] = None) -> None:
    from veritrain.core.secrets import redacting_excepthook

    if argv is None:  # the `veritrain` process itself (not a caller's): a bug's traceback is shown redacted
        sys.excepthook = redacting_excepthook
    logs.setup_console_logging()
    logs.reports_to_stderr(False)
    render.JSON_WRITTEN["done"] = False
    wants_json = "--json" in (sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(args=argv, prog_name="veritrain", standalone_mode=False)
    except click.exceptions.Exit as err:
        code = err.exit_code
    except click.UsageError as err:
        command = err.ctx.command_path if err.ctx else "veritrain"
        message = " ".join(err.format_message().split()).replace(". Did you mean", "; did you mean").rstrip(".")  # one line
        render.error(f"{command}: {message} (see `{command} --help`)", UserError.exit_code, wants_json)
    except click.Abort:
        render.error("interrupted", 130, wants_json)
    except (VeritrainError, Interrupted) as err:
        render.error(str(err), err.exit_code, wants_json)
    except KeyboardInterrupt:
        render.error("interrupted by SIGINT", 130, wants_json)
    except OSError as err:
        if err.errno not in FULL_DISK:
            raise
        render.error(f"{err.filename or 'a file'}: {err.strerror or 'no space left'}; free some space (or make it writable) and run the command again",
                     1, wants_json)
    except sqlite3.OperationalError as err:
        if "full" not in str(err) and "I/O" not in str(err) and "readonly" not in str(err):
            raise
        render.error(f"the workspace's index: {err}; free some space (or make it writable) and run the command again", 1, wants_json)
    sys.exit(code if isinstance(code, int) else 0)


FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # errors of the machine, not of veritrain: one line, exit 1
