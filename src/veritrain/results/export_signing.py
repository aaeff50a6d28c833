"""The export's OpenSSF model signature, `export/model.sig`, made with the model-signing library in key mode (offline).

model.sig is a Sigstore bundle (JSON): a DSSE envelope around an in-toto statement that lists every file of the folder,
model.sig excepted and hidden and .git files included, with its SHA-256, signed by the ECDSA P-256 key of
veritrain.core.signing_keys. Signing the same files twice states the same files and digests, but model.sig's bytes differ:
ECDSA draws a fresh nonce, and the statement's JSON keys come out in a different order each process.
Anyone checks it without veritrain (model-signing 1.1.1 prints SUCCESS_LINE and exits 0; on any failure it prints
`Verification failed with error: ...` to stderr and exits 1):

    model_signing verify key export --no-ignore-git-paths --signature export/model.sig --public_key signing-key.pub.pem
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional

from veritrain.core.errors import UserError

SIGNATURE_FILE = "model.sig"
# --no-ignore-git-paths: by default the command ignores .git, .github, .gitignore and .gitattributes, so one of those
# added to the folder would pass unseen; veritrain signs and checks them like any other file
VERIFY_COMMAND = "model_signing verify key {folder} --no-ignore-git-paths --signature {folder}/model.sig --public_key {public_key}"
SUCCESS_LINE = "Verification succeeded"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _library() -> Any:
    try:
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError:  # model-signing 1.1.1 also needs pyOpenSSL, which it imports without declaring it
        raise UserError("signing exports needs model-signing and pyOpenSSL: pip install 'veritrain[provenance]'") from None
    return model_signing


def _hashing(model_signing: Any) -> Any:
    # one SHA-256 per file (the library's default, no shards); the only path left out is the signature itself
    return model_signing.hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE], ignore_git_paths=False)


def _one_line(err: BaseException) -> str:
    said = " ".join(str(err).split())[:200]
    return f"{err.__class__.__name__}: {said}" if said else err.__class__.__name__


def sign(folder: Path, private_key: Path) -> Path:
    """Sign every file of `folder` (the model files, model.json, parity.json, README.md) into folder/model.sig."""
    model_signing = _library()
    signature = folder / SIGNATURE_FILE
    try:
        (model_signing.signing.Config().use_elliptic_key_signer(private_key=private_key)
         .set_hashing_config(_hashing(model_signing)).sign(folder, signature))
    except Exception as err:  # a key it cannot read, a symlink or a special file in the folder
        raise UserError(f"{folder}: cannot sign the export with {private_key} ({_one_line(err)})") from None
    return signature


def _statement(folder: Path) -> dict[str, Any]:
    """The in-toto statement inside folder/model.sig, parsed but not verified."""
    path = folder / SIGNATURE_FILE
    try:
        bundle = json.loads(path.read_text(encoding="utf-8"))
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"], validate=True))
        if not isinstance(statement, dict) or not isinstance(statement.get("predicate"), dict):
            raise TypeError("the signed statement has no predicate")
        return statement
    except FileNotFoundError:
        raise ValueError(f"{path}: no signature here") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read the signature ({_one_line(err)})") from None
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a model signature bundle ({_one_line(err)})") from None


def signed_files(folder: Path) -> dict[str, str]:
    """relative path → SHA-256 as folder/model.sig states them (read, not verified); ValueError when malformed."""
    statement = _statement(folder)
    resources = statement["predicate"].get("resources")
    if not isinstance(resources, list):
        raise ValueError(f"{folder / SIGNATURE_FILE}: not a model signature bundle (no list of signed files)")
    files: dict[str, str] = {}
    for item in resources:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and item.get("algorithm") == "sha256"
                and isinstance(item.get("digest"), str) and _SHA256.fullmatch(item["digest"])):
            raise ValueError(f"{folder / SIGNATURE_FILE}: not a file and its SHA-256 in the signed list: {str(item)[:120]}")
        files[item["name"]] = item["digest"]
    return files


def _files_now(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).as_posix() != SIGNATURE_FILE}


def _differences(signed: dict[str, str], now: dict[str, str]) -> str:
    parts = [f"{what} {', '.join(names)}" for what, names in (
        ("changed", sorted(n for n in signed.keys() & now.keys() if signed[n] != now[n])),
        ("added", sorted(now.keys() - signed.keys())),
        ("missing", sorted(signed.keys() - now.keys()))) if names]
    return "; ".join(parts)


@contextlib.contextmanager
def _key_file(public_key_pem: bytes | Path) -> Iterator[Path]:
    """A path the library can read the key from: the file itself, or for PEM bytes a pipe (/dev/fd: nothing on disk)."""
    if isinstance(public_key_pem, Path):
        yield public_key_pem
        return
    if len(public_key_pem) > 16384:  # a P-256 public key PEM is 178 bytes; a pipe holds 64 KiB before writing blocks
        raise ValueError("not a public key PEM (over 16 KiB)")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, public_key_pem)
        os.close(write_end)
        yield Path(f"/dev/fd/{read_end}")
    finally:
        with contextlib.suppress(OSError):
            os.close(write_end)
        os.close(read_end)


def verify(folder: Path, public_key_pem: bytes | Path) -> Optional[str]:
    """None when folder/model.sig verifies with this public key over the folder's files as they are now; else one line."""
    model_signing = _library()
    path = folder / SIGNATURE_FILE
    try:
        signed = signed_files(folder)  # a malformed bundle is said as such, not as the library's parse error
    except ValueError as err:
        return str(err)
    config = model_signing.verifying.Config().set_hashing_config(_hashing(model_signing))
    try:
        with _key_file(public_key_pem) as key:
            config.use_elliptic_key_verifier(public_key=key)
    except Exception as err:  # missing, unreadable, not a PEM public key, not a curve the library supports
        where = public_key_pem if isinstance(public_key_pem, Path) else "the public key given"
        return f"{path}: cannot check it: {where} is not a usable EC public key ({_one_line(err)})"
    try:
        # an old-format bundle makes the library print a warning: never onto veritrain's own output (--json)
        with contextlib.redirect_stdout(io.StringIO()):
            config.verify(folder, path)
    except Exception as err:  # ValueError, cryptography's InvalidSignature, pydantic's errors: all mean "does not verify"
        message = str(err)
        if message.startswith("Signature mismatch"):  # the signature is good, the files differ from those it lists
            return f"{path}: the folder is not as signed: {_differences(signed, _files_now(folder)) or message[:200]}"
        if message.startswith("Key mismatch"):
            return f"{path}: signed with another key than the one given"
        if err.__class__.__name__ == "InvalidSignature":
            return f"{path}: the signature does not match the statement it signs (altered, or made with another key)"
        return f"{path}: does not verify ({_one_line(err)})"
    unsigned = sorted(_files_now(folder).keys() - signed.keys())  # files the signer chose to leave out (ignore paths)
    if unsigned:
        return f"{path}: leaves {', '.join(unsigned)} unsigned"
    return None
