"""The options and arguments that several `veritrain` commands take, spelled once: the workspace (--workdir),
--json, --set, --nproc, the CONFIG argument, --trust-code, --use-current-code, --hypothesis and --parent."""

from __future__ import annotations

import click

from veritrain.core import logs

workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Workspace folder holding runs/ and .veritrain/ (default: the current directory).",
)


def _reports_where(ctx: click.Context, param: click.Parameter, as_json: bool) -> bool:
    logs.reports_to_stderr(as_json)  # stdout holds the one JSON document; tables and verdicts go to stderr with the progress
    return as_json


json_option = click.option("--json", "as_json", is_flag=True, callback=_reports_where,
                           help="Print one JSON document on stdout; tables, progress and warnings go to stderr.")
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Override a config value, e.g. --set train.epochs=5 (repeatable; values are YAML).",
)
nproc_option = click.option(
    "--nproc", type=click.IntRange(min=1, max=1024), default=None, metavar="N",
    help="Train with N processes on this machine (data parallel through torchrun; train.batch_size is the global batch). See docs/distributed.md.",
)
config_argument = click.argument("config", required=False, type=click.Path(dir_okay=True))


TRUST_CODE_HELP = "Build the model even when the run names code (model.target) and this workspace did not start it (read that code first)."
USE_CURRENT_CODE_HELP = "Build the model from the current user code instead of the copies recorded with the run, in a new run (the run itself is left as it is)."


def trust_code_option(help: str = TRUST_CODE_HELP):
    return click.option("--trust-code", is_flag=True, help=help)


def use_current_code_option(help: str = USE_CURRENT_CODE_HELP):
    return click.option("--use-current-code", is_flag=True, help=help)


hypothesis_option = click.option("--hypothesis", default=None, help="What this run is expected to show, stated before it runs (sealed in its record).")
parent_option = click.option("--parent", default=None, metavar="RUN", help="The reference run experiments.md compares this config with.")


def policy_options(func):
    """What the person checking a run requires, decided in advance (veritrain.trust.policy): the published seal, the
    signer, the oldest record format; `verify`, `check` and `audit` take the same options and judge alike."""
    options = [
        click.option("--expect", metavar="SEAL", help="The seal published for this run; fails when record.json does not hash to it."),
        click.option("--public-key", "public_key", metavar="FILE",
                     help="Require a signature by this public key (PEM); an unsigned run, or one signed by another key, fails."),
        click.option("--trusted-keys", "trusted_keys", metavar="FILE",
                     help="Require a signature by a key listed in FILE (NAME FINGERPRINT lines or PEM entries); "
                          "default: ~/.config/veritrain/trusted-keys names signers without requiring one."),
        click.option("--require-signature", is_flag=True, help="Require a signature that verifies with a key known here (given, trusted or the local pair's)."),
        click.option("--min-format", "min_format", type=click.IntRange(min=0), default=None, metavar="N",
                     help="Require a record format of at least N: a record presented as older fails (docs/threat-model.md)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def replay_options(func):
    """Where a replay runs (`audit`, `reproduce`): the auditor's interpreter, and where a script's inputs are read."""
    options = [
        click.option("--python", "python", metavar="PATH", default=None,
                     help="The interpreter the replay runs in (default: the one running veritrain); the one a record names is never run."),
        click.option("--inputs-root", "inputs_root", metavar="DIR", default=None, type=click.Path(file_okay=False),
                     help="A script's run: read its bound inputs from DIR instead of the recorded working directory."),
    ]
    for option in reversed(options):
        func = option(func)
    return func
