"""The field types a run's record and its amendments share (veritrain.records.record, veritrain.records.amendments):
strict pydantic parts, the shapes of ids, hashes, paths and times, and the canonical bytes both are sealed as."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field


def record_bytes(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


RUN_ID = re.compile(r"\d{8}-\d{6}-\d{3}-[0-9a-f]{6}")  # workspace.new_run_dir: UTC time to the millisecond, 6 random hex digits

SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _sha256(value: str) -> str:
    if not SHA256_HEX.fullmatch(value):
        raise ValueError("must be a SHA-256 in hex (64 lowercase hex digits)")
    return value


def _run_id(value: str) -> str:
    if not RUN_ID.fullmatch(value):
        raise ValueError("must be a run id (YYYYMMDD-HHMMSS-mmm-xxxxxx)")
    return value


Sha256 = Annotated[str, AfterValidator(_sha256)]
DataVersionId = Sha256  # data.prepare.version_id; it names a folder, so never a path
RunId = Annotated[str, AfterValidator(_run_id)]


def _inside_run(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError("must be a relative path inside the run folder")
    return path


RunPath = Annotated[str, AfterValidator(_inside_run)]


def _value_needed(value: Any) -> Any:
    if value is None:
        raise ValueError("null where the writer always puts a value (the field may be absent in older records, never null)")
    return value


def _iso_time(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("not an ISO 8601 time such as 2026-01-31T12:00:00.000Z") from None
    return value


# a field that older records may lack but that no writer sets to null: readers use its value when it is there
NOT_NULL = BeforeValidator(_value_needed)
IsoTime = Annotated[str, AfterValidator(_iso_time)]


class Part(BaseModel):
    """A part of a record. Strict JSON types (no "1" for 1, no true for 1); fields added by a later
    record_version are kept (extra="allow"), so this reader keeps working on newer records."""

    model_config = ConfigDict(strict=True, extra="allow")


class Artifact(Part):
    sha256: Sha256
    size: Annotated[int, Field(ge=0)]


class Event(Part):
    kind: str
    step: Optional[int] = None
    detail: Any = None
    at: Optional[str] = None


class ProvenanceRef(Part):
    """The run's provenance statement (veritrain.records.provenance) and the key that signed it (null: unsigned)."""

    file: Literal["provenance.intoto.jsonl"]
    key_fingerprint: Optional[Sha256]
