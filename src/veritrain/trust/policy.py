"""What the person who checks a run decides in advance, never read from the run: the seal they expect, the keys
they trust to have signed it, whether a signature is required, and the oldest record format they accept.

SLSA and in-toto verify against such a policy (the expected builder and key), never against what an attestation
says of itself; the verifier here does the same. Built from the options of `verify`, `check` and `audit`
(`--expect`, `--public-key`, `--trusted-keys`, `--require-signature`, `--min-format`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from veritrain.core import signing_keys, trusted_keys as trusted_module
from veritrain.core.errors import UserError
from veritrain.core.trusted_keys import TrustedKeys
from veritrain.records.record import RECORD_FORMAT


@dataclass(frozen=True)
class KnownKey:
    pem: bytes
    source: str  # "--public-key", "trusted keys (NAME)", "the local key pair"


@dataclass(frozen=True)
class Policy:
    expect: Optional[str] = None  # the published seal
    public_key: Optional[bytes] = None  # --public-key: the run must be signed by this key
    trusted: TrustedKeys = field(default_factory=lambda: TrustedKeys(None, (), False))  # names signers; enforced when given
    require_signature: bool = False  # any signature that verifies with a key known here
    min_format: int = 0
    strict: bool = False  # drift fails too

    @property
    def signature_required(self) -> bool:
        return self.public_key is not None or self.trusted.enforced or self.require_signature

    def required_signer(self) -> str:
        """The signer this policy asks for, in words (for messages)."""
        if self.public_key is not None:
            return f"the key given with --public-key ({_fingerprint(self.public_key)[:16]}…)"
        if self.trusted.enforced:
            return f"a key listed in {self.trusted.source}"
        return "a key known here (--public-key, --trusted-keys or the local key pair)"

    def key_for(self, fingerprint: str) -> Optional[KnownKey]:
        """The public key with `fingerprint` that this policy knows: the one given, a PEM entry of the trusted keys,
        or the local key pair's public key."""
        if self.public_key is not None and _fingerprint(self.public_key) == fingerprint:
            return KnownKey(self.public_key, "--public-key")
        listed = self.trusted.named(fingerprint)
        if listed is not None and listed.pem is not None:
            return KnownKey(listed.pem, f"trusted keys ({listed.name})")
        local = local_public_key(fingerprint)
        return KnownKey(local, "the local key pair") if local is not None else None


def local_public_key(fingerprint: str) -> Optional[bytes]:
    """The public key with `fingerprint` when it is the local key pair's (beside the signing key), else None."""
    try:
        pem = signing_keys.public_path(signing_keys.key_path()).read_bytes()
        return pem if signing_keys.public_key_fingerprint(pem) == fingerprint else None
    except (OSError, ValueError, UserError):
        return None


def _fingerprint(pem: bytes) -> str:
    try:
        return signing_keys.public_key_fingerprint(pem)
    except (ValueError, TypeError):
        return "?" * 64


def read_public_key(path: str) -> bytes:
    """The PEM public key at `path` (--public-key), checked; UserError in one line otherwise."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            pem = f.read(1 << 16)  # a PEM public key is a few hundred bytes
    except OSError as err:
        raise UserError(f"--public-key: {path}: cannot be read ({err.strerror})") from None
    try:
        signing_keys.public_key_fingerprint(pem)
    except (ValueError, TypeError):
        raise UserError(f"--public-key: {path}: not a PEM public key; give the .pub.pem that `veritrain keys show` prints") from None
    return pem


def from_options(expect: Optional[str] = None, public_key: Optional[str] = None, trusted_keys: Optional[str] = None,
                 require_signature: bool = False, min_format: Optional[int] = None, strict: bool = False) -> Policy:
    """The policy the command-line options give (UserError for one that cannot be used)."""


    if expect is not None and not re.fullmatch(r"[0-9a-f]{64}", expect.strip().lower()):
        raise UserError(f"--expect: {expect!r} is not a seal; give the 64 hex digits printed at the end of the run (record.sha256)")
    if min_format is not None and not 0 <= min_format <= RECORD_FORMAT:
        raise UserError(f"--min-format: {min_format}; give a record format from 0 to {RECORD_FORMAT} (this veritrain writes {RECORD_FORMAT})")
    return Policy(expect=expect.strip().lower() if expect else None, public_key=read_public_key(public_key) if public_key else None,
                  trusted=trusted_module.load(trusted_keys), require_signature=require_signature, min_format=min_format or 0,
                  strict=strict)
