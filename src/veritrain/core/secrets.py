"""Keep secrets out of runs: refuse them where they would be recorded, redact them by shape where text is only
shown, `${env:NAME}` references, and the short allowlist of environment variables a record may name.

A config is recorded exactly as written (record.json, config.yaml, argv, sweep plans), so `find_secret` and
`config_secret` tell `config.load_config` and the commands what to refuse: a value holding a secret by its
shape (the password of a URL, the credential of an `Authorization:` header or after `Bearer`, tokens of
well-known shapes: Hugging Face, GitHub, GitLab, OpenAI/Anthropic, AWS access key ids, Slack, Google, Stripe,
npm, PyPI, JWTs, PEM private keys), or a literal under a key named as a credential (`password`, `api_key`, ...).
Key names that merely contain such letters (`max_tokens`, `key_dim`) mean nothing. Secrets belong in the
environment: a config value `${env:NAME}` is recorded as that reference and read when it is used, so a run can
still be reproduced by whoever has the variable. Logs, the console and error lines redact the same shapes
(`redact_text`): `scheme://user:***@host`, `Bearer ***`, `***` for a token.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from types import TracebackType
from typing import Any, Optional

from veritrain.core.errors import UserError

REDACTED = "***"
# keys whose value is a credential, whatever it looks like: these exact names, and names ending in the suffixes
CREDENTIAL_KEYS = frozenset({"password", "passwd", "secret", "api_key", "apikey", "access_key", "secret_key", "access_token", "auth_token",
                             "private_key", "credential", "credentials", "client_secret"})
CREDENTIAL_SUFFIXES = ("_password", "_passwd", "_secret", "_api_key", "_apikey", "_access_key", "_secret_key", "_access_token",
                       "_auth_token", "_private_key", "_credential", "_credentials")
# `<service>_key` / `<service>_token` of services whose keys are credentials (`wandb_key`); `label_key`, `sort_key` are not
SERVICE_KEY = re.compile(r"(?:wandb|openai|anthropic|hf|huggingface|github|gitlab|aws|azure|gcp|google|comet|neptune|slack|"
                         r"stripe|mlflow|clearml|dagshub|replicate|cohere|pinecone)_(?:key|token)")
CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# Any run of non-space characters holding `://`; its userinfo is redacted by `_url_password_redacted`.
URL_TOKEN = re.compile(r"(?<!\S)\S*://\S*")  # starts only where a run starts: each run is scanned once
# `Authorization: Bearer x`, `'Authorization': 'Basic x'`, `authorization=x`: the credential after the scheme word
AUTH_HEADER = re.compile(r"(?P<head>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:[a-z][a-z0-9-]*\s+)?)(?P<credential>[^\s\"',;]+)",
                         re.IGNORECASE)
# RFC 6750 b64token: 16 characters or more, or 6 or more that look random (a digit, a mid-word `._~+/`, a lowercase
# letter before an uppercase one): "Bearer hunter2" and "Bearer abc.def" are credentials, "the bearer of" is a word
BEARER = re.compile(r"(?P<head>\bbearer\s+)(?P<credential>[A-Za-z0-9._~+/-]{16,}=*"
                    r"|(?=[A-Za-z0-9._~+/-]*(?:[0-9]|[._~+/][A-Za-z0-9]|(?-i:[a-z][A-Z])))[A-Za-z0-9._~+/-]{6,}=*)", re.IGNORECASE)
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
SECRET_HINT = re.compile(r"://|private key|authorization|bearer|hf_|gh[pousr]_|github_pat_|glpat-|sk-|akia|asia|xox|aiza|k_live_|k_test_|npm_|pypi-|eyj")
# A literal under a credential-named key in free text, in any form a note or hypothesis may hold: `password=x`,
# `api_key: x`, JSON `{"api_key": "x"}`, `secret:"two words"`. The key is checked with `is_credential_key`.
CREDENTIAL_ASSIGNMENT = re.compile(
    r"""(?<![A-Za-z0-9_])(?:--?)?(?:"(?P<double>[^"\n]{1,64})"|'(?P<single>[^'\n]{1,64})'|(?P<bare>[A-Za-z][A-Za-z0-9_-]*))\s*[:=]\s*"""
    r"""(?P<value>\$\{env:[A-Za-z_][A-Za-z0-9_]*\}|"(?:[^"\\]|\\.)*"?|'[^']*'?|[^\s"',;)}\]]+)""")
CREDENTIAL_HINT = re.compile(r"passw|secret|api[ _-]?key|access_key|access_token|auth_token|private|credential|token|_key")  # in text.lower()
NO_LITERAL = frozenset({"", "null", "none", "~", "true", "false", REDACTED})  # values that hold no credential
ENV_REFERENCE = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}")

# environment variables a record may name: they change results or their speed, and are not secret
ENV_ALLOWLIST = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED",
                 "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE")


def redact_text(text: str) -> str:
    """URL passwords, Authorization/Bearer credentials, known token shapes and private keys in free text (logs,
    the console, error lines): by the shape of the value, never by a key name (`max_tokens=512` stays)."""
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
    return text


def find_secret(text: str) -> Optional[str]:
    """What secret `text` holds by its shape, as a message names it ("a URL password", ...), or None. A
    `${env:NAME}` reference in the place of a secret is none: it is recorded as written and read when used."""
    if not SECRET_HINT.search(text.lower()):
        return None
    text = ENV_REFERENCE.sub("\0", text)  # a reference is one character that no secret pattern takes for a secret
    if "://" in text and "@" in text:
        for match in URL_TOKEN.finditer(text):
            span = _url_password(match[0])
            if span is not None and match[0][span[0]: span[1]].strip("\0"):
                return "a URL password (scheme://user:password@host)"
    if any(m["credential"].strip("\0") for m in AUTH_HEADER.finditer(text)):
        return "an Authorization credential"
    if BEARER.search(text):
        return "a bearer token"
    if TOKEN.search(text):
        return "a token of a known shape"
    if PRIVATE_KEY.search(text):
        return "a private key"
    return None


def text_secret(text: str) -> Optional[str]:
    """What secret free text (a note, a hypothesis, an experiment name) holds by the config rule, as a message names
    it, or None: a secret by its shape (`find_secret`), or a literal under a credential-named key in any form
    (`password=x`, JSON `{"api_key": "x"}`, `secret:"two words"`). A key with no literal after it ("the password
    field was removed") and key names that merely contain such letters ("max_tokens 512") are none."""
    kind = find_secret(text)
    if kind is not None:
        return kind
    if not CREDENTIAL_HINT.search(text.lower()):
        return None
    for match in CREDENTIAL_ASSIGNMENT.finditer(text):
        value = match["value"].strip("\"'").strip()
        key = match["double"] or match["single"] or match["bare"]  # a quoted key may hold spaces: "password "
        if is_credential_key(key) and value.lower() not in NO_LITERAL and not ENV_REFERENCE.fullmatch(value):
            return "a credential written out (its key names one)"
    return None


def normalized_key(key: str) -> str:
    """A key name as the credential rules read it: camelCase split, lower case, every run of separators (`-`, `.`,
    spaces) one `_`, none at the ends: `clientSecret` → `client_secret`, `"api-key "` → `api_key`."""
    return re.sub(r"[^a-z0-9]+", "_", CAMEL_BOUNDARY.sub("_", key.strip()).lower()).strip("_")


def is_credential_key(key: str) -> bool:
    """`password`, `api_key`, `db_password`, `clientSecret`, `api-key`, `"password "`, `private_key`, `credentials`,
    `wandb_key`, ... (any case and spelling of separators); `max_tokens`, `key_dim`, `label_key`, `sort_key` or
    `primary_key_column` are not."""
    key = normalized_key(key)
    return key in CREDENTIAL_KEYS or key.endswith(CREDENTIAL_SUFFIXES) or SERVICE_KEY.fullmatch(key) is not None


def config_secret(value: Any, path: tuple[str, ...] = ()) -> Optional[tuple[list[str], str]]:
    """The first value of a config-like structure that would record a secret: (key path, what it is), or None.
    A string holding a secret by its shape anywhere, or a literal (text or a number, not a `${env:NAME}`
    reference) under a credential key; booleans, null and empty text are no secret."""
    named = bool(path) and is_credential_key(path[-1])
    if named and isinstance(value, (dict, list)) and _holds_literal(value):  # `credentials: [...]`: every leaf is one
        return list(path), "a credential written out (its key names one)"
    if isinstance(value, dict):
        for key, item in value.items():
            found = config_secret(item, (*path, str(key)))
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        return next((found for i, item in enumerate(value) if (found := config_secret(item, (*path, str(i)))) is not None), None)
    if isinstance(value, str):
        kind = text_secret(value)  # also a credential written inside the text (`{"api_key": "x"}` in exp_name)
        if kind is not None:
            return list(path), kind
        if named and value.strip() and not ENV_REFERENCE.search(value):
            return list(path), "a credential written out (its key names one)"
    elif named and isinstance(value, (int, float)) and not isinstance(value, bool):
        return list(path), "a credential written out (its key names one)"
    return None


def _holds_literal(value: Any) -> bool:
    """Whether a structure holds a value that could be a credential: text that is not empty nor a `${env:NAME}`
    reference, or a number."""
    if isinstance(value, dict):
        return any(_holds_literal(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_literal(item) for item in value)
    if isinstance(value, str):
        return bool(value.strip()) and value.strip().lower() not in NO_LITERAL and not ENV_REFERENCE.search(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _url_password_redacted(match: re.Match[str]) -> str:
    run = match[0]
    span = _url_password(run)
    return run if span is None else run[: span[0]] + REDACTED + run[span[1]:]


def _url_password(run: str) -> Optional[tuple[int, int]]:
    """Where the password of `scheme://user:password@host...` is in a run of non-space characters, or None: from
    the first `:` after `://` to the last `@` of the run, since it may hold `/`, `@` or `:` unescaped
    (`https://u:p@ss/w0rd@host`, `s3://KEYID:se/cr@et@bucket`). A user holding `/` is a path, so the next `://`
    is tried (`https://archive.org/web/https://u:p@h`). A URL with a port and an `@` in its path loses that
    stretch too, which is the safe way to be wrong."""
    at = run.rfind("@")
    start = run.find("://")
    while 0 <= start < at:  # each pass starts past the previous colon: linear in the run
        user_start = start + 3
        colon = run.find(":", user_start, at)
        if colon < 0:
            break
        if "/" not in run[user_start:colon]:
            return colon + 1, at
        start = run.find("://", user_start, at)
    return None


def secret_in_command_line(argv: list[str]) -> Optional[str]:
    """Where a command line that a record keeps holds a secret, as "--hypothesis (a bearer token)", or None: a secret
    by its shape anywhere, or a value given to a credential-named flag (`--api-key=x`, `--password x`)."""
    for index, argument in enumerate(argv):
        flag, equals, given = argument.partition("=")
        if argument.startswith("--") and is_credential_key(flag.lstrip("-")):
            value = given if equals else (argv[index + 1] if index + 1 < len(argv) else "")
            if value.strip() and not ENV_REFERENCE.fullmatch(value.strip()):
                return f"{flag} (a credential written out: the flag names one)"
        kind = find_secret(argument)
        if kind is None:
            continue
        option = argv[index - 1] if index > 0 and argv[index - 1].startswith("-") else ""
        if option == "--set" or (argument.startswith("--") and "=" in argument):
            option = f"{option} {argument.partition('=')[0]}".strip()
        return f"{option or f'argument {index}'} ({kind})"
    return None


def expand_env(text: str) -> str:
    """`${env:NAME}` → the variable's value, read now (a missing variable is a usage error)."""

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
        message = record.getMessage()
        if record.exc_info or record.stack_info:  # a logged exception: its traceback quotes values too
            formatter = logging.Formatter()
            if record.exc_info:
                message += "\n" + formatter.formatException(record.exc_info)
            if record.stack_info:
                message += "\n" + formatter.formatStack(record.stack_info)
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        record.msg, record.args = redact_text(message), ()  # formatted once, for every handler
        record._veritrain_redacted = True
        return True


def redacting_excepthook(kind: type[BaseException], err: BaseException, tb: Optional[TracebackType]) -> None:
    """`sys.excepthook` for the command: an unexpected error (a bug) still prints its traceback, redacted like every
    other line, since its values may quote the command line or a config."""

    sys.stderr.write(redact_text("".join(traceback.format_exception(kind, err, tb))))
