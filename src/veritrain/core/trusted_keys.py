"""The keys a user trusts to sign runs, by name: `trusted-keys` in the user's config folder
(`~/.config/veritrain/trusted-keys`), or a file given with `--trusted-keys FILE`.

One entry per key: a name, then either the key's fingerprint (64 hex digits, as `veritrain keys show` prints it) on
the same line, or its public key as a PEM block on the lines that follow. Blank lines and `#` comments are ignored.

    # name        fingerprint, or a PEM block below the name
    alice         3b1f0c…(64 hex digits)
    ci-signer
    -----BEGIN PUBLIC KEY-----
    MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE…
    -----END PUBLIC KEY-----

verify names the signer of every run from this file. The default file only names; a file the user gives with
`--trusted-keys` is enforced: a run signed by a key not listed there, or not signed, fails. A fingerprint entry names a
key without holding it: its signature is checked only when the public key is known too (`--public-key`, a PEM entry or
the local key pair).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from veritrain.core import signing_keys
from veritrain.core.errors import UserError
from veritrain.core.user_dirs import config_dir

FILE_NAME = "trusted-keys"
FINGERPRINT = re.compile(r"[0-9a-f]{64}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class TrustedKey:
    name: str
    fingerprint: str
    pem: Optional[bytes]  # None: a fingerprint entry


@dataclass(frozen=True)
class TrustedKeys:
    source: Optional[Path]  # the file read, or None when there is none
    keys: tuple[TrustedKey, ...]
    enforced: bool  # given by the user: a signer not listed fails

    def named(self, fingerprint: Optional[str]) -> Optional[TrustedKey]:
        return next((key for key in self.keys if fingerprint and key.fingerprint == fingerprint), None)


def default_path() -> Path:
    return config_dir() / FILE_NAME


def load(given: Optional[str | Path] = None) -> TrustedKeys:
    """The trusted keys: the file given (enforced; it must exist), else the default file when there is one (names only).
    UserError (one line, naming the line) for a file that cannot be read or parsed."""
    path = Path(given).expanduser() if given else default_path()
    if not given and not path.is_file():
        return TrustedKeys(None, (), False)
    shown = f"--trusted-keys {path}" if given else str(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"{shown}: cannot read the trusted keys ({err.strerror}); give a file of `NAME FINGERPRINT` lines") from None
    if len(data) > MAX_BYTES:
        raise UserError(f"{shown}: more than {MAX_BYTES} bytes; a trusted-keys file lists a few keys")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{shown}: not UTF-8 text; give a file of `NAME FINGERPRINT` lines") from None
    return TrustedKeys(path, tuple(_parse(text, shown)), bool(given))


def _parse(text: str, shown: str) -> list[TrustedKey]:
    keys: list[TrustedKey] = []
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        line = lines[number].split("#", 1)[0].strip() if not lines[number].lstrip().startswith("-----") else lines[number].strip()
        number += 1
        if not line:
            continue
        parts = line.split()
        if not NAME.fullmatch(parts[0]) or len(parts) > 2:
            raise UserError(f"{shown}: line {number}: expected `NAME FINGERPRINT`, or a NAME line followed by a PEM public key")
        name = parts[0]
        if len(parts) == 2:
            if not FINGERPRINT.fullmatch(parts[1].lower()):
                raise UserError(f"{shown}: line {number}: {parts[1][:20]!r} is not a fingerprint (64 hex digits, as `veritrain keys show` prints)")
            keys.append(TrustedKey(name, parts[1].lower(), None))
            continue
        block = []
        while number < len(lines) and lines[number].strip():
            block.append(lines[number].strip())
            number += 1
            if block[-1].startswith("-----END"):
                break
        if not block or not block[0].startswith("-----BEGIN PUBLIC KEY-----") or not block[-1].startswith("-----END PUBLIC KEY-----"):
            raise UserError(f"{shown}: line {number}: the entry {name!r} has neither a fingerprint nor a PEM public key below it")
        pem = ("\n".join(block) + "\n").encode("ascii", "replace")
        try:
            fingerprint = signing_keys.public_key_fingerprint(pem)
        except (ValueError, TypeError):
            raise UserError(f"{shown}: line {number}: the PEM block of {name!r} is not a public key") from None
        keys.append(TrustedKey(name, fingerprint, pem))
    names = [key.name for key in keys]
    if len(set(names)) != len(names):
        raise UserError(f"{shown}: the name {next(n for n in names if names.count(n) > 1)!r} is listed twice; give each key one name")
    return keys
