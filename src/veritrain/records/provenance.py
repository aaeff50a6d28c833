"""`provenance.intoto.jsonl`: what a sealed run's seal states, as a standard in-toto attestation anyone can check.

One line: a DSSE envelope (payloadType `application/vnd.in-toto+json`) of an in-toto Statement v1 whose predicate is
SLSA Provenance v1. Its `subject` is what the run produced (every export/ file but model.sig, and the checkpoint of
the final trajectory entry; a `baseline` run's eval/baselines.json); `buildDefinition` holds the resolved config and
the command (externalParameters) and what the result depends on (resolvedDependencies: the data version's bound
files, the code, the lock file); `runDetails` names the builder (veritrain and its version), the invocation (the run
id) with its times, and the byproducts: record.json (its SHA-256 is the seal), record.sha256 and metrics.jsonl.

Like record.sha256 the file is a detached statement about the seal, so it is not in `artifacts`; the record names it
(`provenance: {file, key_fingerprint}`, covered by the seal). It is signed with the signing key
(veritrain.core.signing_keys: `keyid` is the key's fingerprint, the signature is DER ECDSA P-256 over the DSSE
pre-authentication encoding) or, without one, written unsigned (no signatures). The run's final `write_record` writes
it; each sealed amendment (veritrain.records.amendments) has its own (`amendment_statement`), about the amendment's seal.

Names of files in the run are relative to the run folder (`sha256sum -c` there checks them); a data version's
files are named `.veritrain/data/<version>/<file>`, relative to the workspace, with their absolute location as `uri`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from veritrain.core.signing_keys import SigningKey
from veritrain.core.version import __version__

PROVENANCE_FILE = "provenance.intoto.jsonl"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://veritrain.dev/provenance/run/v1"
AMENDMENT_BUILD_TYPE = "https://veritrain.dev/provenance/amendment/v1"
AMENDMENT_FILE, AMENDMENT_SEAL = "amendment.json", "amendment.sha256"
BUILDER_ID = "https://veritrain.dev/builder"
SIGNATURE_FILE = "export/model.sig"  # the export's own signature (OpenSSF model signing): a statement about the export, not a product
RECORD_FILE, SEAL_FILE, METRICS_FILE, LOCK_FILE = "record.json", "record.sha256", "metrics.jsonl", "env/requirements.lock"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what a signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def _file(name: str, sha256: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "digest": {"sha256": sha256}, **extra}


def subjects(record: Mapping[str, Any], seal: str) -> list[dict[str, Any]]:
    """What the run produced, with the digests its record lists (the artifact table was just hashed)."""
    artifacts = record.get("artifacts") or {}
    names = [rel for rel in sorted(artifacts) if rel.startswith("export/") and rel != SIGNATURE_FILE]
    trajectory = record.get("trajectory") or []
    if len(trajectory) > 1:  # the initial entry is the untrained state
        final = trajectory[-1]
        checkpoint = str(final.get("file") or f"checkpoints/step-{final.get('step')}.pt")
        if checkpoint in artifacts:
            names.append(checkpoint)
    if record.get("kind") == "baseline" and "eval/baselines.json" in artifacts:
        names.append("eval/baselines.json")
    if not names:  # a run that produced nothing to ship (failed, or eval only): the statement attests its record
        return [_file(RECORD_FILE, seal)]
    return [_file(rel, artifacts[rel]["sha256"]) for rel in names]


def _data_dependencies(record: Mapping[str, Any], state_dir: Path) -> list[dict[str, Any]]:
    """The bound files of the run's data version, as its version.json lists them (hashed when it was sealed;
    verify re-hashes them)."""
    version = (record.get("data") or {}).get("version")
    if not version:
        return []
    folder = state_dir / "data" / str(version)
    try:
        info = json.loads((folder / "version.json").read_text(encoding="utf-8"))
        files = info.get("files") if isinstance(info, dict) else None
    except (OSError, ValueError):
        files = None  # not in this workspace (an imported run without its data): the version id still binds them
    annotations = {"role": "data", "data_version": version}
    found = [_file(f".veritrain/data/{version}/version.json", digest, uri=(folder / "version.json").resolve().as_uri(), annotations=annotations)
             for digest in [(record.get("data") or {}).get("version_json_sha256")] if digest]
    if not isinstance(files, dict):
        files = None
    for rel, entry in sorted((files or {}).items()):
        if isinstance(entry, Mapping) and isinstance(entry.get("sha256"), str):
            found.append(_file(f".veritrain/data/{version}/{rel}", entry["sha256"], uri=(folder / rel).resolve().as_uri(), annotations=annotations))
    if not files:  # the version's own files unknown here: the version id, which binds every sample, stands for them
        found.append({"name": f".veritrain/data/{version}/", "digest": {"sha256": version}, "annotations": annotations})
    return found


def _code_dependencies(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    code = record.get("code") or {}
    artifacts = record.get("artifacts") or {}
    found: list[dict[str, Any]] = []
    if code.get("git_commit"):
        found.append({"name": "git", "digest": {"gitCommit": code["git_commit"]},
                      "annotations": {"role": "code", "dirty": bool(code.get("git_dirty"))}})
    patch = (code.get("diff_patch") or {}).get("file")
    if patch and patch in artifacts:
        found.append(_file(patch, artifacts[patch]["sha256"], annotations={"role": "code", "what": "uncommitted changes (git diff)"}))
    for user_file in code.get("user_files") or []:
        rel = f"code/{user_file['path']}"
        found.append(_file(rel, artifacts[rel]["sha256"] if rel in artifacts else user_file["sha256"],
                           annotations={"role": "code", "module": user_file["module"]}))
    script = (record.get("script") or {}).get("file")
    if script and script in artifacts:
        found.append(_file(script, artifacts[script]["sha256"], annotations={"role": "code", "what": "the training script"}))
    if LOCK_FILE in artifacts:
        found.append(_file(LOCK_FILE, artifacts[LOCK_FILE]["sha256"], annotations={"role": "environment"}))
    return found


def statement(record: Mapping[str, Any], seal: str, state_dir: Path) -> dict[str, Any]:
    """The in-toto Statement (SLSA Provenance v1) of the run whose sealed record is `record` with seal `seal`."""
    artifacts = record.get("artifacts") or {}
    byproducts = [_file(RECORD_FILE, seal, mediaType="application/json"),
                  _file(SEAL_FILE, hashlib.sha256((seal + "\n").encode()).hexdigest(), mediaType="text/plain")]
    if METRICS_FILE in artifacts:
        byproducts.append(_file(METRICS_FILE, artifacts[METRICS_FILE]["sha256"], mediaType="application/jsonl"))
    metadata = {"invocationId": record["run_id"], "startedOn": record["started_at"]}
    if record.get("ended_at"):
        metadata["finishedOn"] = record["ended_at"]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects(record, seal),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"config": record.get("config"), "config_hash": record.get("config_hash"),
                                       "command": record.get("argv"), "kind": record.get("kind"), "stages": record.get("stages")},
                "internalParameters": {"task": record.get("task"), "seed": record.get("seed"), "status": record.get("status")},
                "resolvedDependencies": _data_dependencies(record, state_dir) + _code_dependencies(record),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"veritrain": __version__}},
                "metadata": metadata,
                "byproducts": byproducts,
            },
        },
    }


def envelope_bytes(document: dict[str, Any], key: Optional[SigningKey]) -> bytes:
    """The file's one line: the DSSE envelope of `document`, signed with `key` (no signatures without one)."""
    payload = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    signatures = []
    if key is not None:
        signature = key.sign(pae(PAYLOAD_TYPE, payload))
        signatures.append({"keyid": key.public.fingerprint, "sig": base64.b64encode(signature).decode("ascii")})
    envelope = {"payload": base64.b64encode(payload).decode("ascii"), "payloadType": PAYLOAD_TYPE, "signatures": signatures}
    return (json.dumps(envelope, sort_keys=True, separators=(",", ":")) + "\n").encode()


def field(key: Optional[SigningKey]) -> dict[str, Any]:
    """The record's `provenance` field for a seal made with `key` (None: unsigned)."""
    return {"file": PROVENANCE_FILE, "key_fingerprint": key.public.fingerprint if key is not None else None}


def amendment_seal(doc: Mapping[str, Any]) -> str:
    """The seal of an amendment whose amendment.json is `doc`: the SHA-256 of its canonical bytes."""
    data = (json.dumps(dict(doc), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()
    return hashlib.sha256(data).hexdigest()


def amendment_statement(doc: Mapping[str, Any], seal: str) -> dict[str, Any]:
    """The in-toto Statement (SLSA Provenance v1) of a sealed amendment (veritrain.records.amendments): its subjects are
    the files it adds (every one but export/model.sig; amendment.json itself when it adds none), its one dependency is
    the seal it extends, and its byproducts are amendment.json (whose SHA-256 is its seal) and amendment.sha256. Names
    are relative to the amendment's folder (`sha256sum -c` there checks them): its files are under `files/`."""
    files = doc.get("files") or {}
    subject = [_file(f"files/{rel}", files[rel]["sha256"]) for rel in sorted(files) if rel != SIGNATURE_FILE] or [_file(AMENDMENT_FILE, seal)]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subject,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": AMENDMENT_BUILD_TYPE,
                "externalParameters": {"command": doc.get("by"), "run_id": doc.get("run_id"), "index": doc.get("index")},
                "internalParameters": {"sets": sorted(doc.get("set") or {}), "retires": list(doc.get("retires") or [])},
                "resolvedDependencies": [{"name": "extends", "digest": {"sha256": str(doc.get("extends"))},
                                          "annotations": {"role": "the seal this amendment extends"}}],
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"veritrain": __version__}},
                "metadata": {"invocationId": f"{doc.get('run_id')}/amendments/{int(doc.get('index') or 0):04d}", "startedOn": doc.get("at")},
                "byproducts": [_file(AMENDMENT_FILE, seal, mediaType="application/json"),
                               _file(AMENDMENT_SEAL, hashlib.sha256((seal + "\n").encode()).hexdigest(), mediaType="text/plain")],
            },
        },
    }

