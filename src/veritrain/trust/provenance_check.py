"""Check a run's provenance statement (veritrain.records.provenance) against the run as it is, for `veritrain verify`.

The file must be there when the record names it; it must be one DSSE envelope of an in-toto Statement v1 with the SLSA
Provenance v1 predicate; its signature must be by the key the record names (checked when that public key is given
with `--public-key` or is the local key pair's); its record.json byproduct must be the current seal (else the
statement is `provenance_stale`: about another seal); and every subject, dependency and parameter must be what the
run's record and files say, with no subject missing or added. Dependencies are compared by name and digest, never by
location, so a run imported from another workspace still verifies.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from veritrain.core import signing_keys
from veritrain.core.errors import UserError
from veritrain.records import provenance
from veritrain.records.provenance import PAYLOAD_TYPE, PREDICATE_TYPE, PROVENANCE_FILE, STATEMENT_TYPE
from veritrain.results import export_signing
from veritrain.trust.policy import local_public_key

if TYPE_CHECKING:
    from veritrain.trust.policy import Policy

SIGNED_EXPORT = "export/model.sig"
MAX_STATEMENT_BYTES = 64 << 20  # a statement lists digests only; far more than any run's
SHA256_HEX = frozenset("0123456789abcdef")


class Malformed(ValueError):
    pass


@dataclass(frozen=True)
class Signer:
    """Who signed the run's provenance statement, as the verifier found it."""

    status: str  # "signed", "unsigned" (a statement without a signature), "no_statement" (the record names none)
    fingerprint: Optional[str] = None  # of the key the record names
    name: Optional[str] = None  # that key's name in the trusted keys
    checked: bool = False  # its signature verified with a public key known here
    key_source: Optional[str] = None  # where that public key came from
    required: bool = False  # the policy requires a signature

    def line(self) -> str:
        """One line for the console: who signed, and whether that was checked."""
        if self.status == "no_statement":
            return "signer: none (the record names no provenance statement)"
        if self.status == "unsigned":
            return "signer: none (the provenance statement is unsigned)"
        who = f"{self.name} ({self.fingerprint})" if self.name else f"key {self.fingerprint} (not in your trusted keys)"
        how = f"signature checked with {self.key_source}" if self.checked else "signature not checked: its public key is not known here"
        return f"signer: {who}; {how}"

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "fingerprint": self.fingerprint, "name": self.name, "checked": self.checked,
                "key_source": self.key_source, "required": self.required}


def known_public_key(fingerprint: str) -> Optional[bytes]:
    """The public key with `fingerprint` when it is the local key pair's (beside the signing key), else None."""

    return local_public_key(fingerprint)


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise Malformed(f"{what} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise Malformed(f"{what} is not valid base64") from None


def read_envelope(data: bytes) -> tuple[dict[str, Any], bytes, list[dict[str, Any]]]:
    """(statement, payload bytes, signatures [{keyid, sig bytes}]) of a provenance file; Malformed with the reason."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    if len(lines) != 1:
        raise Malformed(f"holds {len(lines)} statements; veritrain writes exactly one line")
    try:
        envelope = json.loads(lines[0])
    except (ValueError, RecursionError):
        raise Malformed("not JSON") from None
    if not isinstance(envelope, dict) or envelope.get("payloadType") != PAYLOAD_TYPE:
        raise Malformed(f"not a DSSE envelope with payloadType {PAYLOAD_TYPE}")
    payload = _b64(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list):
        raise Malformed("signatures is not a list")
    found = []
    for entry in signatures:
        if not isinstance(entry, dict) or not isinstance(entry.get("keyid"), str):
            raise Malformed("a signature without a keyid")
        found.append({"keyid": entry["keyid"], "sig": _b64(entry.get("sig"), "a signature")})
    try:
        statement = json.loads(payload)
    except (ValueError, RecursionError):
        raise Malformed("its payload is not JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        raise Malformed(f"its payload is not an in-toto Statement ({STATEMENT_TYPE}) with predicate {PREDICATE_TYPE}")
    for key in ("subject",):
        if not isinstance(statement.get(key), list) or not all(_descriptor(item) for item in statement[key]):
            raise Malformed(f"{key}: not a list of {{name, digest}}")
    predicate = statement.get("predicate")
    if not isinstance(predicate, dict) or not isinstance(predicate.get("buildDefinition"), dict) or not isinstance(predicate.get("runDetails"), dict):
        raise Malformed("its predicate has no buildDefinition and runDetails")
    for part, key in (("buildDefinition", "resolvedDependencies"), ("runDetails", "byproducts")):
        items = predicate[part].get(key)
        if not isinstance(items, list) or not all(_descriptor(item) for item in items):
            raise Malformed(f"{part}.{key}: not a list of {{name, digest}}")
    return statement, payload, found


def _descriptor(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("digest"), dict) and bool(item["digest"]) \
        and all(isinstance(k, str) and isinstance(v, str) for k, v in item["digest"].items())


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {item["name"]: item["digest"] for item in items}


def _compare(what: str, stated: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[str]:
    """One line per difference between the stated and the expected descriptors, by name and digest."""
    have, want = _by_name(stated), _by_name(expected)
    lines = [f"{what} {name} is missing from the statement" for name in sorted(set(want) - set(have))]
    lines += [f"{what} {name} is in the statement but not in the run" for name in sorted(set(have) - set(want))]
    lines += [f"{what} {name}: the statement's digest {str(next(iter(have[name].values())))[:16]}… is not the run's "
              f"{str(next(iter(want[name].values())))[:16]}…" for name in sorted(set(have) & set(want)) if have[name] != want[name]]
    if len(stated) != len(have):
        lines.append(f"{what}: a name appears twice in the statement")
    return lines


def problems(listing: Mapping[str, Path], record: Mapping[str, Any], seal: str, state_dir: Path, policy: Policy,
             not_checked: list[dict[str, str]]) -> tuple[list[dict[str, str]], Signer]:
    """(the provenance problems, the signer) of the run whose files are `listing` (relative path → file) and whose record
    (sealed as `seal`) is `record`, judged under `policy` (the keys given or trusted, whether a signature is required).
    Whether the record must name a statement at all is its format's question (veritrain.trust.formats)."""
    required = policy.signature_required
    ref = record.get("provenance")
    if not isinstance(ref, Mapping):
        signer = Signer("no_statement", required=required)
        if required:  # threat: a forger strips the statement (and the signature with it) to be read as an older run
            return [{"path": PROVENANCE_FILE, "kind": "signature_required",
                     "detail": f"the record names no provenance statement, so nothing is signed; a signature by {policy.required_signer()} is required"}], signer
        return [], signer
    found: list[dict[str, str]] = []

    def problem(kind: str, detail: str) -> None:
        found.append({"path": PROVENANCE_FILE, "kind": kind, "detail": detail})

    fingerprint = ref.get("key_fingerprint")
    listed = policy.trusted.named(fingerprint) if fingerprint else None
    signer = Signer("signed" if fingerprint else "unsigned", fingerprint, listed.name if listed else None, required=required)
    if fingerprint is None and required:  # threat: a forger re-seals with no key at all
        problem("signature_required", f"the provenance statement is unsigned; a signature by {policy.required_signer()} is required")
    path = listing.get(PROVENANCE_FILE)
    if path is None or not path.is_file() or path.is_symlink():
        problem("provenance_missing", "the record names provenance.intoto.jsonl, which is not in the run")
        return found, signer
    try:
        if path.stat().st_size > MAX_STATEMENT_BYTES:
            raise Malformed(f"more than {MAX_STATEMENT_BYTES} bytes")
        statement, payload, signatures = read_envelope(path.read_bytes())
    except Malformed as err:
        problem("provenance_malformed", str(err))
        return found, signer
    except OSError as err:
        problem("provenance_malformed", f"cannot be read ({err.strerror})")
        return found, signer
    lines, signer = _signature_problems(signer, payload, signatures, policy, not_checked)
    found.extend({"path": PROVENANCE_FILE, "kind": "provenance_signature", "detail": line} for line in lines)
    known = policy.key_for(fingerprint) if fingerprint and signer.checked else None
    found.extend(_export_signature_problems(listing, fingerprint, known.pem if known else None, not_checked))
    predicate = statement["predicate"]
    stated_record = _by_name(predicate["runDetails"]["byproducts"]).get(provenance.RECORD_FILE, {}).get("sha256")
    if stated_record != seal:
        problem("provenance_stale", f"it states record.json {str(stated_record)[:16]}…, the run's seal is {seal[:16]}…: a statement about another seal")
        return found, signer
    expected = provenance.statement(dict(record), seal, state_dir)
    lines = _compare("subject", statement["subject"], expected["subject"])
    lines += _compare("byproduct", predicate["runDetails"]["byproducts"], expected["predicate"]["runDetails"]["byproducts"])
    lines += _dependency_lines(predicate["buildDefinition"]["resolvedDependencies"],
                               expected["predicate"]["buildDefinition"]["resolvedDependencies"], record, state_dir, not_checked)
    stated_build = {k: v for k, v in predicate["buildDefinition"].items() if k != "resolvedDependencies"}
    expected_build = {k: v for k, v in expected["predicate"]["buildDefinition"].items() if k != "resolvedDependencies"}
    lines += [f"buildDefinition.{key} is not the run's" for key in sorted(set(stated_build) | set(expected_build))
              if stated_build.get(key) != expected_build.get(key)]
    stated_run = predicate["runDetails"].get("metadata")
    if stated_run != expected["predicate"]["runDetails"]["metadata"]:
        lines.append("runDetails.metadata (run id, start and finish) is not the run's")
    found.extend({"path": PROVENANCE_FILE, "kind": "provenance_mismatch", "detail": line} for line in lines)
    return found, signer


def _dependency_lines(stated: list[dict[str, Any]], expected: list[dict[str, Any]], record: Mapping[str, Any], state_dir: Path,
                      not_checked: list[dict[str, str]]) -> list[str]:
    version = (record.get("data") or {}).get("version")
    if version and _listed_files(state_dir / "data" / str(version) / "version.json") is None:
        # the data version is not here (imported without it) or is damaged (the data check reports that): its files
        # cannot be listed, so only the run's own dependencies are compared
        prefix = f".veritrain/data/{version}/"
        stated = [item for item in stated if not item["name"].startswith(prefix)]
        expected = [item for item in expected if not item["name"].startswith(prefix)]
        not_checked.append({"check": "provenance data dependencies",
                            "reason": f"the data version {str(version)[:12]} is not in this workspace, or its version.json cannot be read"})
    return _compare("dependency", stated, expected)


def _listed_files(path: Path) -> Optional[dict[str, Any]]:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    files = info.get("files") if isinstance(info, dict) else None
    return files if isinstance(files, dict) else None


def _export_signature_problems(listing: Mapping[str, Path], fingerprint: Optional[str], pem: Optional[bytes],
                               not_checked: list[dict[str, str]]) -> list[dict[str, str]]:
    """export/model.sig checked with the library that made it (OpenSSF model signing), by the run's key (`pem`: its public
    key when known here and the statement's signature verified with it)."""
    signature = listing.get(SIGNED_EXPORT)
    if signature is None:
        return []
    folder = signature.parent
    if pem is None or fingerprint is None or signing_keys.public_key_fingerprint(pem) != fingerprint:
        not_checked.append({"check": "export signature", "reason": "the public key of the run's signing key is not known here; give it with --public-key FILE"})
        return []
    if any(listing.get(rel) != folder / Path(rel).name for rel in listing if rel.startswith("export/")):
        not_checked.append({"check": "export signature", "reason": "an amend of the run is unfinished: the export is judged file by file"})
        return []

    try:
        problem = export_signing.verify(folder, pem)
    except UserError as err:  # model-signing is not installed here
        not_checked.append({"check": "export signature", "reason": str(err)})
        return []
    return [{"path": SIGNED_EXPORT, "kind": "export_signature", "detail": problem.split(": ", 1)[-1]}] if problem else []


def _signature_problems(signer: Signer, payload: bytes, signatures: list[dict[str, Any]], policy: Policy,
                        not_checked: list[dict[str, str]]) -> tuple[list[str], Signer]:
    """The problems of the statement's signatures under `policy`, and the signer as found (checked or not)."""

    fingerprint = signer.fingerprint
    if fingerprint is None:
        return ([f"the record says the statement is unsigned, yet it carries {len(signatures)} signature(s)"] if signatures else []), signer
    lines = []
    if policy.public_key is not None:
        try:
            given = signing_keys.public_key_fingerprint(policy.public_key)
        except (ValueError, TypeError) as err:
            return [f"the public key given is not a PEM public key ({' '.join(str(err).split())[:80]})"], signer
        if given != fingerprint:  # threat: a forger re-signs with their own key
            lines.append(f"signed by key {fingerprint[:16]}… (the record's), not by the key given ({given[:16]}…)")
    if policy.trusted.enforced and signer.name is None:
        lines.append(f"signed by key {fingerprint[:16]}…, which is not listed in {policy.trusted.source}")
    mine = [entry for entry in signatures if entry["keyid"] == fingerprint]
    if not mine:
        return [*lines, f"no signature by key {fingerprint[:16]}… (the record's); it carries {len(signatures)} other(s)"], signer
    known = policy.key_for(fingerprint)
    if known is None:
        not_checked.append({"check": "provenance signature",
                            "reason": f"the public key {fingerprint[:16]}… is not known here; give it with --public-key FILE or list it in the trusted keys"})
        if policy.signature_required and not lines:
            lines.append(f"the signature by key {fingerprint[:16]}… cannot be checked: its public key is not known here "
                         "(give it with --public-key, or as a PEM entry of the trusted keys)")
        return lines, signer
    pae = provenance.pae(PAYLOAD_TYPE, payload)
    if not any(signing_keys.verify_signature(known.pem, entry["sig"], pae) for entry in mine):
        return [*lines, f"the signature does not verify with key {fingerprint[:16]}…: the statement or its signature was changed"], signer
    return lines, replace(signer, checked=True, key_source=known.source)


def amendment_problems(link: Any, files: Mapping[str, Path], policy: Policy,
                       not_checked: list[dict[str, str]]) -> tuple[list[dict[str, str]], Signer]:
    """(the problems, the signer) of a sealed amendment's statement (veritrain.records.provenance.amendment_statement):
    there, one DSSE envelope, signed by the key amendment.json names (judged under `policy` as a run's is), about the
    amendment's seal, and stating exactly what the amendment says. `files` are the amendment's own files, by their
    name in the run (export/model.sig is checked with them)."""
    where = f"amendments/{link.index:04d}/{PROVENANCE_FILE}"
    required = policy.signature_required
    fingerprint = link.signer
    listed = policy.trusted.named(fingerprint) if fingerprint else None
    signer = Signer("signed" if fingerprint else "unsigned", fingerprint, listed.name if listed else None, required=required)
    found: list[dict[str, str]] = []

    def problem(kind: str, detail: str) -> None:
        found.append({"path": where, "kind": kind, "detail": detail})

    if fingerprint is None and required:  # threat: an amendment appended with no key at all
        problem("signature_required", f"amendment {link.index} ({link.by}) is unsigned; a signature by {policy.required_signer()} is required")
    path = link.folder / PROVENANCE_FILE
    try:
        if path.is_symlink() or not path.is_file():
            problem("provenance_missing", f"amendment {link.index} has no provenance statement")
            return found, signer
        if path.stat().st_size > MAX_STATEMENT_BYTES:
            raise Malformed(f"more than {MAX_STATEMENT_BYTES} bytes")
        statement, payload, signatures = read_envelope(path.read_bytes())
    except Malformed as err:
        problem("provenance_malformed", str(err))
        return found, signer
    except OSError as err:
        problem("provenance_malformed", f"cannot be read ({err.strerror})")
        return found, signer
    lines, signer = _signature_problems(signer, payload, signatures, policy, not_checked)
    found.extend({"path": where, "kind": "provenance_signature", "detail": f"amendment {link.index}: {line}"} for line in lines)
    known = policy.key_for(fingerprint) if fingerprint and signer.checked else None
    found.extend(_export_signature_problems(files, fingerprint, known.pem if known else None, not_checked))
    expected = provenance.amendment_statement(link.doc, link.seal)
    if statement != expected:
        stated = _by_name(statement["predicate"]["runDetails"]["byproducts"]).get(provenance.AMENDMENT_FILE, {}).get("sha256")
        if stated != link.seal:
            problem("provenance_stale", f"it states amendment.json {str(stated)[:16]}…, the amendment's seal is {link.seal[:16]}…")
        else:
            problem("provenance_mismatch", f"amendment {link.index}: the statement does not state what amendment.json says")
    return found, signer
