"""Keep secrets out of runs: redaction of secret-looking values, `${env:NAME}` references, and the
short allowlist of environment variables a record may name.

A value is redacted (`***`) when its key looks secret (contains token, key, secret, password, passwd or
authorization). In free text (argv, logs, hypotheses, notes, data cards) the redacted parts are: the password
of a URL (`scheme://user:***@host`, whatever characters it holds), `key=value` pairs whose key looks secret,
the credentials of an `Authorization:` header or after `Bearer`, and tokens of well-known shapes (Hugging
Face, GitHub, GitLab, OpenAI/Anthropic, AWS access key ids, Slack, Google, Stripe, npm, PyPI, JWTs, PEM
private keys). Secrets belong in the environment: a config value `${env:NAME}` is recorded as that
reference and read when it is used, so a run can still be reproduced by whoever has the variable.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

REDACTED = "***"
SECRET_KEY = re.compile(r"token|key|secret|passw(or)?d|authorization", re.IGNORECASE)
# Any run of non-space characters holding `://`; its userinfo is redacted by `_url_password_redacted`.
URL_TOKEN = re.compile(r"(?<!\S)\S*://\S*")  # starts only where a run starts: each run is scanned once
# `Authorization: Bearer x`, `'Authorization': 'Basic x'`, `authorization=x`: the credential after the scheme word
AUTH_HEADER = re.compile(r"(?P<head>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:[a-z][a-z0-9-]*\s+)?)(?P<credential>[^\s\"',;]+)",
                         re.IGNORECASE)
BEARER = re.compile(r"(?P<head>\bbearer\s+)(?P<credential>[A-Za-z0-9._~+/-]{16,}=*)", re.IGNORECASE)  # RFC 6750 b64token
# Well-known token shapes, at their real lengths, so that ordinary words never match.
TOKEN = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"  # a token starts a run: a long run is then tried once, not at every `sk-` in it
    r"hf_[A-Za-z0-9]{30,}"  # Hugging Face (hf_ + 34)
    r"|gh[pousr]_[A-Za-z0-9]{30,}"  # GitHub classic, OAuth, user-to-server, server, refresh (prefix + 36)
    r"|github_pat_[A-Za-z0-9_]{30,}"  # GitHub fine-grained (github_pat_ + 82)
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab personal access token
    r"|sk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}"  # OpenAI (sk-, sk-proj-), Anthropic (sk-ant-): random, so it has a digit
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"  # AWS access key id (long-term, temporary): exactly 20
    r"|xox[abeprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|AIza[A-Za-z0-9_-]{35}"  # Google API key
    r"|[rs]k_(?:live|test)_[A-Za-z0-9]{20,}"  # Stripe
    r"|npm_[A-Za-z0-9]{36}"  # npm
    r"|pypi-[A-Za-z0-9_-]{50,}"  # PyPI upload token
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # JWT: base64url of {"alg"...}.{...}.signature
    r")"
)
PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.DOTALL)
# Every secret above contains one of these (lowercased); a line without any, as most log lines are, skips the
# patterns. Searched in `text.lower()`: about 1 µs for an epoch line, where re.IGNORECASE costs 14.
SECRET_HINT = re.compile(r"://|token|key|secret|passw|authorization|bearer|hf_|gh[pousr]_|github_pat_|glpat-|sk-|akia|asia|xox|aiza|k_live_|k_test_|npm_|pypi-|eyj")
ASSIGNMENT = re.compile(r"(?P<key>[\w.\-]*(token|key|secret|passw(?:or)?d)[\w.\-]*)(?P<sep>\s*[=:]\s*)(?P<value>[^\s,;&]+)", re.IGNORECASE)
ENV_REFERENCE = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}")

# environment variables a record may name: they change results or their speed, and are not secret
ENV_ALLOWLIST = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED",
                 "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE")


def redact_text(text: str) -> str:
    """URL passwords, `secretkey=value` pairs, Authorization/Bearer credentials and known token shapes in free text."""
    # an epoch line is redacted once per handler: most lines stop here
    if not SECRET_HINT.search(text.lower()):
        return text
    if "://" in text and "@" in text:
        text = URL_TOKEN.sub(_url_password_redacted, text)
    text = AUTH_HEADER.sub(lambda m: m["head"] + REDACTED, text)
    text = BEARER.sub(lambda m: m["head"] + REDACTED, text)
    text = TOKEN.sub(REDACTED, text)
    if "PRIVATE KEY-----" in text:
        text = PRIVATE_KEY.sub(REDACTED, text)
    if SECRET_KEY.search(text):
        text = ASSIGNMENT.sub(lambda m: m["key"] + m["sep"] + (m["value"] if ENV_REFERENCE.fullmatch(m["value"]) else REDACTED), text)
    return text


def _url_password_redacted(match: re.Match[str]) -> str:
    """`scheme://user:***@host...`: the password runs from the first `:` after `://` to the last `@` of the run,
    since it may hold `/`, `@` or `:` unescaped (`https://u:p@ss/w0rd@host`, `s3://KEYID:se/cr@et@bucket`). The
    user is kept; a user holding `/` is a path, so the next `://` is tried (`https://archive.org/web/https://u:p@h`).
    A URL with a port and an `@` in its path loses that stretch too, which is the safe way to be wrong."""
    run = match[0]
    at = run.rfind("@")
    start = run.find("://")
    while 0 <= start < at:  # each pass starts past the previous colon: linear in the run
        user_start = start + 3
        colon = run.find(":", user_start, at)
        if colon < 0:
            break
        if "/" not in run[user_start:colon]:
            return run[: colon + 1] + REDACTED + run[at:]
        start = run.find("://", user_start, at)
    return run


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
