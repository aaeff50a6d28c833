"""Keep secrets out of runs: redaction of secret-looking values, `${env:NAME}` references, and the
short allowlist of environment variables a record may name.

A value is redacted (`***`) when its key looks secret (contains token, key, secret, password or
passwd) or when it is the password part of a URL (`scheme://user:***@host`). Secrets belong in the
environment: a config value `${env:NAME}` is recorded as that reference and read when it is used, so
a run can still be reproduced by whoever has the variable.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

REDACTED = "***"
SECRET_KEY = re.compile(r"token|key|secret|passw(or)?d", re.IGNORECASE)
URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]+):(?P<password>[^/\s@]+)@")
ASSIGNMENT = re.compile(r"(?P<key>[\w.\-]*(token|key|secret|passw(?:or)?d)[\w.\-]*)(?P<sep>\s*[=:]\s*)(?P<value>[^\s,;&]+)", re.IGNORECASE)
ENV_REFERENCE = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}")

# environment variables a record may name: they change results or their speed, and are not secret
ENV_ALLOWLIST = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED",
                 "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE")


def redact_text(text: str) -> str:
    """URL passwords and `secretkey=value` pairs in free text."""
    # Both patterns need a literal that most lines lack; checking for it first spares every log line
    # the ASSIGNMENT scan (about 30 µs for an epoch line, which is redacted once per handler).
    if "://" in text:
        text = URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    if SECRET_KEY.search(text):
        text = ASSIGNMENT.sub(lambda m: m["key"] + m["sep"] + (m["value"] if ENV_REFERENCE.fullmatch(m["value"]) else REDACTED), text)
    return text


def redact(value: Any, key: str = "") -> Any:
    """A copy of a config-like structure with secret-looking values redacted (env references kept)."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        if ENV_REFERENCE.fullmatch(value.strip()):
            return value
        if key and SECRET_KEY.search(key) and value:
            return REDACTED
        return redact_text(value)
    if key and SECRET_KEY.search(key) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return REDACTED
    return value


def redact_argv(argv: list[str]) -> list[str]:
    return [redact_text(a) for a in argv]


def expand_env(text: str) -> str:
    """`${env:NAME}` → the variable's value, read now (a missing variable is a usage error)."""
    from veritrain.errors import UserError

    def value(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in os.environ:
            raise UserError(f"${{env:{name}}}: the environment variable {name} is not set; export it before running")
        return os.environ[name]

    return ENV_REFERENCE.sub(value, text)


def expand_env_values(value: Any) -> Any:
    """`expand_env` applied to every string in a structure (e.g. model.kwargs)."""
    if isinstance(value, dict):
        return {k: expand_env_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env_values(v) for v in value]
    return expand_env(value) if isinstance(value, str) else value


def allowed_environment() -> dict[str, str]:
    return {name: os.environ[name] for name in ENV_ALLOWLIST if name in os.environ}


class RedactingFilter(logging.Filter):
    """Redacts every log line on its way to the console and train.log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_veritrain_redacted", False):  # the console's and the file's filters see the same record
            return True
        record.msg, record.args = redact_text(record.getMessage()), ()  # formatted once, for every handler
        record._veritrain_redacted = True
        return True
