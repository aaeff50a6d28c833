"""The signing key pair: an ECDSA P-256 key that signs what veritrain states about a run, kept outside every workspace.

Where the private key is, in order: `--key FILE`, the `VERITRAIN_SIGNING_KEY` variable, else `signing-key.pem` in the
user's config directory (`$XDG_CONFIG_HOME/veritrain/`, by default `~/.config/veritrain/`). The public key is beside it,
`<name>.pub.pem`. The private key is PKCS#8 PEM, unencrypted, written with mode 0600 in a folder of mode 0700; its
fingerprint is the SHA-256 of the public key's DER SubjectPublicKeyInfo, in hex. Needs `pip install 'veritrain[provenance]'`
(the `cryptography` package).

    veritrain keys init            # creates the pair; refuses to replace one
    veritrain keys show --json     # the public key and its fingerprint
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from veritrain.core.errors import UserError
from veritrain.core.user_dirs import config_dir

KEY_VARIABLE = "VERITRAIN_SIGNING_KEY"
KEY_NAME = "signing-key.pem"
ALGORITHM = "ECDSA P-256 (SHA-256)"


@dataclass(frozen=True)
class PublicKey:
    path: Path  # the .pub.pem file
    pem: str  # SubjectPublicKeyInfo, PEM
    fingerprint: str  # hex SHA-256 of the DER SubjectPublicKeyInfo


def default_key_path() -> Path:
    return config_dir() / KEY_NAME


def key_path(given: Optional[str | Path] = None) -> Path:
    """The private key's path: `given` (--key), else $VERITRAIN_SIGNING_KEY, else the default."""
    if given:
        return Path(given).expanduser()
    if os.environ.get(KEY_VARIABLE):
        return Path(os.environ[KEY_VARIABLE]).expanduser()
    return default_key_path()


def public_path(private: Path) -> Path:
    return private.with_name(private.name.removesuffix(".pem") + ".pub.pem")


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        raise UserError("signing keys need the cryptography package: pip install 'veritrain[provenance]'") from None
    return serialization, ec


def fingerprint_of(public_der: bytes) -> str:
    return hashlib.sha256(public_der).hexdigest()


def init(path: Path) -> PublicKey:
    """Create a new key pair at `path` (private, 0600) and beside it (public); refuses to replace an existing file."""
    serialization, ec = _crypto()
    public_file = public_path(path)
    for existing in (path, public_file):
        if existing.exists() or existing.is_symlink():
            raise UserError(f"{existing}: a key is already there; keep it (`veritrain keys show`), or remove it yourself first: "
                            "what it signed can then no longer be checked against it")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    # O_EXCL: never through a file (or a link) that appeared meanwhile; 0600 from the start, not after a chmod
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = private.public_key()
    public_pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(public_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(public_pem)
    return show(path)


def show(path: Path) -> PublicKey:
    """The public key of the pair at `path` (read from the private key, so a swapped .pub.pem cannot mislead)."""
    return load(path).public


@dataclass(frozen=True)
class SigningKey:
    """A loaded private key: signs bytes with ECDSA P-256 over SHA-256 (DER signature). Held in memory only."""

    public: PublicKey
    _private: Any
    private_path: Path  # the file it was read from (OpenSSF model signing reads the key itself)

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._private.sign(data, ec.ECDSA(hashes.SHA256()))

    def __repr__(self) -> str:  # never the key's bytes, whatever prints it
        return f"SigningKey(fingerprint={self.public.fingerprint[:16]}...)"


def load(path: Path) -> SigningKey:
    """The private key at `path`, checked: mode (no group or other access), unencrypted PKCS#8/PEM, ECDSA P-256."""
    serialization, ec = _crypto()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no signing key here; create one with `veritrain keys init`, or name yours with --key FILE or "
                        f"${KEY_VARIABLE}") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read the signing key ({err.strerror})") from None
    if path.stat().st_mode & 0o077:
        raise UserError(f"{path}: the private key is readable by others (mode {oct(path.stat().st_mode & 0o777)}); chmod 600 {path}")
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise UserError(f"{path}: the private key is encrypted with a passphrase, which veritrain cannot ask for while it seals a run; "
                        f"store it unencrypted with mode 0600 (`openssl pkcs8 -topk8 -nocrypt -in {path} -out NEW.pem`)") from None
    except ValueError as err:
        raise UserError(f"{path}: not an unencrypted PEM private key ({' '.join(str(err).split())[:120]}); create one with `veritrain keys init`") from None
    if not isinstance(private, ec.EllipticCurvePrivateKey) or not isinstance(private.curve, ec.SECP256R1):
        raise UserError(f"{path}: not an ECDSA P-256 key; veritrain signs with P-256 (`veritrain keys init` makes one)")
    public = private.public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")
    return SigningKey(PublicKey(path=public_path(path), pem=pem, fingerprint=fingerprint_of(der)), private, path)


def sealing_key() -> Optional[SigningKey]:
    """The key that signs what a run's seal states, or None (statements are then written unsigned): the file
    $VERITRAIN_SIGNING_KEY names (which must then exist), else the default key when there is one. A key that is
    there but unusable (others can read it, wrong format, a passphrase) is a UserError: never a silent unsigned run."""
    named = os.environ.get(KEY_VARIABLE)
    path = Path(named).expanduser() if named else default_key_path()
    if not named and not (path.exists() or path.is_symlink()):
        return None
    try:
        stat = path.stat()
        stamp = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_mode)
    except OSError:
        stamp = None
    if stamp is not None and stamp in _loaded:
        return _loaded[stamp]
    key = load(path)
    if stamp is not None:
        _loaded.clear()
        _loaded[stamp] = key
    return key


_loaded: dict[tuple[Any, ...], SigningKey] = {}  # one key parsed once per process (a run seals several times)


def public_key_fingerprint(pem: bytes) -> str:
    """The fingerprint of a public key given as PEM (SubjectPublicKeyInfo); ValueError when it is not one."""
    serialization, _ec = _crypto()
    public = serialization.load_pem_public_key(pem)
    return fingerprint_of(public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def verify_signature(public_pem: bytes, signature: bytes, data: bytes) -> bool:
    """Whether `signature` (DER ECDSA) over `data` verifies with the P-256 public key `public_pem`."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes

    serialization, ec = _crypto()
    public = serialization.load_pem_public_key(public_pem)
    if not isinstance(public, ec.EllipticCurvePublicKey):
        return False
    try:
        public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):  # ValueError: bytes that are not a DER signature at all
        return False
    return True
