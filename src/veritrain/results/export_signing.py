"""The export's OpenSSF model signature: `export/model.sig`, made with the `model-signing` library in key mode.

model.sig is a Sigstore bundle: a DSSE envelope whose in-toto statement lists every file of the export folder (itself
excluded) with its SHA-256, signed with the signing key (veritrain.core.signing_keys: ECDSA P-256). Nothing is sent
anywhere. Anyone checks it with the library's own command, no veritrain needed (docs/provenance.md):

    model_signing verify key export --signature export/model.sig --public_key signing-key.pub.pem

which prints SUCCESS_LINE and exits 0, or prints `Verification failed with error: …` and exits 1 (1.1.1: a failure
also exits non-zero; the tests check both the status and the line).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Optional

from veritrain.core.errors import UserError

SIGNATURE_FILE = "model.sig"
VERIFY_COMMAND = "model_signing verify key {folder} --signature {folder}/model.sig --public_key {public_key}"
SUCCESS_LINE = "Verification succeeded"
MISSING = "signing an export needs model-signing: pip install 'veritrain[provenance]'"


def _library() -> Any:
    try:
        import model_signing
    except ImportError:
        raise UserError(MISSING) from None
    return model_signing


def _hashing(model_signing: Any, folder: Path) -> Any:
    # file by file, SHA-256 (the library's default); the signature itself is never one of the files it covers
    return model_signing.hashing.Config().set_ignored_paths(paths=[folder / SIGNATURE_FILE], ignore_git_paths=True)


def sign(folder: Path, private_key: Path) -> Path:
    """Sign every file of `folder` (README.md, model.json, parity.json, the model files) into folder/model.sig."""
    model_signing = _library()
    signature = folder / SIGNATURE_FILE
    signature.unlink(missing_ok=True)
    (model_signing.signing.Config().use_elliptic_key_signer(private_key=private_key)
     .set_hashing_config(_hashing(model_signing, folder)).sign(folder, signature))
    return signature


def verify(folder: Path, public_key: Path) -> Optional[str]:
    """None when folder/model.sig verifies with `public_key` over the folder's files as they are; else one line."""
    model_signing = _library()
    signature = folder / SIGNATURE_FILE
    if not signature.is_file():
        return f"{signature}: no signature here"
    try:
        (model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public_key)
         .set_hashing_config(_hashing(model_signing, folder)).verify(folder, signature))
    except Exception as err:  # the library raises ValueError and its own errors alike: all mean "does not verify"
        said = " ".join(str(err).split())[:300]
        return f"{signature}: does not verify ({err.__class__.__name__}{': ' + said if said else ''})"
    return None


def signed_files(folder: Path) -> dict[str, str]:
    """relative path → SHA-256 as model.sig states them (read, not verified); ValueError with the reason when malformed."""
    try:
        bundle = json.loads((folder / SIGNATURE_FILE).read_text(encoding="utf-8"))
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"], validate=True))
        return {item["name"]: item["digest"] for item in statement["predicate"]["resources"] if item["algorithm"] == "sha256"}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{folder / SIGNATURE_FILE}: not a model signature bundle ({err.__class__.__name__}: {err})") from None
