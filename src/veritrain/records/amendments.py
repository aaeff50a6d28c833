"""Sealed amendments: how eval, export, baseline and gc add to a sealed run without changing it (docs/record.md, "Amendments").

A run's `record.json` and the files it lists are never rewritten once the run is sealed. A later command writes an
amendment instead, `runs/<run_id>/amendments/<NNNN>/` (NNNN from 0001, in order):

- `amendment.json`: what the command changed: the record fields it sets (`set`, among `AMENDABLE`), the events it adds,
  the files it adds (`files`, laid out under `files/` as in the run, with their SHA-256 and size), the files of the run
  it retires (`retires`: gc removed them, or a new export replaced them), who wrote it (`by`) and when (`at`), and
  `extends`: the seal it was written on, the run's own seal for the first, the previous amendment's for the next.
- `amendment.sha256`: the SHA-256 of amendment.json's exact bytes, the amendment's seal.
- `provenance.intoto.jsonl`: its own signed statement about that seal (veritrain.records.provenance.amendment_statement).

The run as every reader sees it is the base record with its amendments applied in order (`apply`): fields replaced,
events appended, files added or retired, the trajectory's `kept` cleared for a retired step file. A seal therefore
vouches forever for exactly what it sealed, and `verify --expect` of any seal in the chain says which amendments came
after it and who signed them.

An amendment is written whole in `.veritrain/amending/` and made visible by one rename into `amendments/`, so a kill
leaves either the amendment or nothing in the run; what a kill leaves in `.veritrain/amending/` is removed by the next
amend or gc.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional

from pydantic import Field, ValidationError

from veritrain.core.errors import RunFailed
from veritrain.core.files import sync_folder, sync_tree
from veritrain.core.hashing import sha256_file
from veritrain.records.fields import Artifact, Event, IsoTime, Part, ProvenanceRef, RunId, RunPath, Sha256, record_bytes

AMENDMENTS_DIR = "amendments"
AMENDMENT_FILE = "amendment.json"
AMENDMENT_SEAL = "amendment.sha256"
FILES_DIR = "files"
STAGING_DIR = "amending"  # under the workspace's state folder (.veritrain/)
AMENDMENT_FORMAT = 1
AMENDABLE = ("metrics", "baselines", "export", "timings")  # the record fields an amendment may set, whole
FOLDER = re.compile(r"\d{4,}")
MAX_AMENDMENT_BYTES = 64 << 20  # an amendment lists digests and results only


def thawed(value: Any) -> Any:
    """A plain, deep copy of a record's value (a record as read is read-only)."""
    return json.loads(json.dumps(value))


def _amendable(value: dict[str, Any]) -> dict[str, Any]:
    odd = sorted(set(value) - set(AMENDABLE))
    if odd:
        raise ValueError(f"sets {odd[0]!r}, which an amendment may not change (only {', '.join(AMENDABLE)})")
    return value


class AmendmentRecord(Part):
    """amendment.json, field by field (docs/record.md, "Amendments")."""

    amendment_format: Literal[1]
    run_id: RunId
    index: Annotated[int, Field(ge=1)]
    by: Annotated[str, Field(min_length=1)]
    at: IsoTime
    extends: Sha256
    set: Annotated[dict[str, Any], Field()]
    events: list[Event]
    files: dict[RunPath, Artifact]
    retires: list[RunPath]
    provenance: ProvenanceRef

    def model_post_init(self, context: Any) -> None:
        _amendable(self.set)


@dataclass(frozen=True)
class Link:
    """One amendment of the chain, as read and found intact (its seal matches, it extends the seal before it)."""

    index: int
    folder: Path
    seal: str
    doc: Mapping[str, Any]

    @property
    def by(self) -> str:
        return str(self.doc["by"])

    @property
    def at(self) -> str:
        return str(self.doc["at"])

    @property
    def signer(self) -> Optional[str]:
        """The fingerprint of the key that signed it, None when unsigned."""
        return self.doc["provenance"].get("key_fingerprint")

    def file(self, rel: str) -> Path:
        return self.folder / FILES_DIR / rel


@dataclass(frozen=True)
class Chain:
    """A run's amendments: the intact ones in order (`links`), and what is wrong past them (`problems`: verify's
    problem rows; a chain with problems is followed up to the first break only)."""

    base_seal: str
    links: tuple[Link, ...] = ()
    problems: tuple[dict[str, Any], ...] = ()

    @property
    def newest(self) -> str:
        return self.links[-1].seal if self.links else self.base_seal

    def seals(self) -> list[str]:
        return [self.base_seal, *(link.seal for link in self.links)]


def folder_name(index: int) -> str:
    return f"{index:04d}"


def read_chain(run_dir: Path, base_seal: str, run_id: str) -> Chain:
    """The amendments of the run in `run_dir` whose record hashes to `base_seal`. Reads only; every file read as
    hostile: an amendment whose bytes do not match its seal, that does not extend the seal before it, that is not
    valid, or that is out of order breaks the chain there (a problem; the amendments after it are not followed)."""
    top = run_dir / AMENDMENTS_DIR
    if not os.path.lexists(top):
        return Chain(base_seal)
    if top.is_symlink() or not top.is_dir():
        return Chain(base_seal, (), ({"path": AMENDMENTS_DIR, "kind": "amendment_chain", "detail": "not a folder"},))
    names = sorted(os.listdir(top))
    links: list[Link] = []
    previous = base_seal
    for expected, name in enumerate(names, 1):
        where = f"{AMENDMENTS_DIR}/{name}"
        if not FOLDER.fullmatch(name) or int(name) != expected or name != folder_name(expected):
            return Chain(base_seal, tuple(links), ({"path": where, "kind": "amendment_chain",
                                                    "detail": f"not amendment {folder_name(expected)}: amendments are numbered from 0001 without a gap"},))
        problem, link = _read_link(top / name, expected, previous, run_id)
        if problem is not None:
            return Chain(base_seal, tuple(links), ({"path": where, "kind": "amendment_chain", "detail": problem},))
        assert link is not None
        links.append(link)
        previous = link.seal
    return Chain(base_seal, tuple(links))


def _read_link(folder: Path, index: int, previous: str, run_id: str) -> tuple[Optional[str], Optional[Link]]:
    if folder.is_symlink() or not folder.is_dir():
        return "not a folder", None
    try:
        path = folder / AMENDMENT_FILE
        if path.is_symlink() or path.stat().st_size > MAX_AMENDMENT_BYTES:
            return f"{AMENDMENT_FILE} is a link or larger than {MAX_AMENDMENT_BYTES} bytes", None
        data = path.read_bytes()
    except OSError:
        return f"no {AMENDMENT_FILE}", None
    seal = hashlib.sha256(data).hexdigest()
    try:
        stored = (folder / AMENDMENT_SEAL).read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        return f"no {AMENDMENT_SEAL}", None
    if stored != seal:
        return f"{AMENDMENT_FILE} hashes to {seal[:16]}…, {AMENDMENT_SEAL} says {stored[:16]}…", None
    try:
        doc = json.loads(data)
        typed = AmendmentRecord.model_validate(doc)
    except (ValueError, RecursionError, ValidationError) as err:
        first = err.errors(include_url=False)[0] if isinstance(err, ValidationError) else None
        shown = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg'].removeprefix('Value error, ')}" if first else str(err)[:120]
        return f"not a valid amendment ({shown})", None
    if typed.index != index:
        return f"its index {typed.index} is not its folder's, {index}", None
    if typed.run_id != run_id:
        return f"its run_id {typed.run_id} is not the run's, {run_id}", None
    if typed.extends != previous:
        return f"it extends the seal {typed.extends[:16]}…, not {previous[:16]}… (the seal before it): not written on this run as it was", None
    return None, Link(index, folder, seal, doc)


@dataclass
class Applied:
    """The run as its amendments leave it: the record's fields (artifacts = every file of the run as it is now, by its
    name in the run), where each file lies, and which results each amendment gave."""

    fields: dict[str, Any]
    files: dict[str, Path]
    retired: set[str] = field(default_factory=set)
    sources: dict[str, Link] = field(default_factory=dict)  # "metrics.<split>", "baselines", "export" → the amendment


def apply(base: Mapping[str, Any], run_dir: Path, links: tuple[Link, ...]) -> Applied:
    """The record `base` of the run in `run_dir` with `links` applied in order."""
    fields = thawed(base)
    artifacts: dict[str, Any] = dict(fields.get("artifacts") or {})
    files = {rel: run_dir / rel for rel in artifacts}
    out = Applied(fields, files)
    for link in links:
        doc = link.doc
        for rel in doc["retires"]:
            artifacts.pop(rel, None)
            files.pop(rel, None)
            out.retired.add(rel)
        for rel, entry in doc["files"].items():
            artifacts[rel] = thawed(entry)
            files[rel] = link.file(rel)
            out.retired.discard(rel)
        for key, value in doc["set"].items():
            for name in _results_changed(key, fields.get(key), value):
                out.sources[name] = link
            fields[key] = thawed(value)
        if doc["events"]:
            fields["events"] = [*(fields.get("events") or []), *thawed(doc["events"])]
    for entry in fields.get("trajectory") or []:  # `kept`: the entry's step file is in the run
        if entry.get("kept") and f"checkpoints/step-{entry.get('step')}.pt" in out.retired:
            entry["kept"] = False
    if links or "artifacts" in fields:
        fields["artifacts"] = artifacts
    return out


def _results_changed(key: str, before: Any, after: Any) -> list[str]:
    if key == "metrics":
        before = before if isinstance(before, dict) else {}
        return [f"metrics.{split}" for split in sorted(after or {}) if before.get(split) != after[split]]
    if key in ("baselines", "export") and before != after:
        return [key]
    return []


# ---------------------------------------------------------------- writing


def staging_root(state_dir: Path) -> Path:
    return state_dir / STAGING_DIR


class Draft:
    """An amendment being written (veritrain.records.recorder.Amendment drives it): its files go under `files`, laid out
    as in the run; `commit` writes amendment.json, its seal and statement, and renames the folder into the run."""

    def __init__(self, state_dir: Path, run_dir: Path, run_id: str, chain: Chain, artifacts: Mapping[str, Any]) -> None:
        self.run_dir, self.run_id, self.chain = run_dir, run_id, chain
        self.artifacts = dict(artifacts)  # the run's files as the command read it
        self.folder = staging_root(state_dir) / f"{run_id}.{uuid.uuid4().hex}"
        (self.folder / FILES_DIR).mkdir(parents=True)
        self.retired: set[str] = set()
        self.replaced: list[str] = []
        self.events: list[dict[str, Any]] = []

    @property
    def files(self) -> Path:
        return self.folder / FILES_DIR

    def staged(self) -> list[str]:
        return sorted(p.relative_to(self.files).as_posix() for p in self.files.rglob("*") if p.is_file())

    def document(self, by: str, at: str, changed: dict[str, Any], key_field: dict[str, Any]) -> dict[str, Any]:
        """amendment.json as it will be written (its files hashed now)."""

        staged = self.staged()
        retires = set(self.retired) | {rel for rel in self.artifacts for folder in self.replaced
                                       if rel.startswith(folder + "/") and rel not in staged}
        return {"amendment_format": AMENDMENT_FORMAT, "run_id": self.run_id, "index": len(self.chain.links) + 1, "by": by, "at": at,
                "extends": self.chain.newest, "set": changed, "events": self.events,
                "files": {rel: {"sha256": sha256_file(self.files / rel), "size": (self.files / rel).stat().st_size} for rel in staged},
                "retires": sorted(retires & set(self.artifacts)), "provenance": key_field}

    def commit(self, doc: dict[str, Any], statement: bytes) -> str:
        """Seal `doc` and make the amendment part of the run in one rename; returns its seal. RunFailed when another
        command amended the run since this one read it."""

        AmendmentRecord.model_validate(doc)  # a ValidationError here is a bug in the writer, never the user's
        data = record_bytes(doc)
        seal = hashlib.sha256(data).hexdigest()
        (self.folder / AMENDMENT_FILE).write_bytes(data)
        (self.folder / AMENDMENT_SEAL).write_bytes((seal + "\n").encode())
        (self.folder / "provenance.intoto.jsonl").write_bytes(statement)
        sync_tree(self.folder)
        top = self.run_dir / AMENDMENTS_DIR
        if not top.is_dir():
            top.mkdir()
            sync_folder(self.run_dir)
        try:
            base = hashlib.sha256((self.run_dir / "record.json").read_bytes()).hexdigest()
        except OSError:
            base = None
        current = read_chain(self.run_dir, self.chain.base_seal, self.run_id)
        if base != self.chain.base_seal or current.newest != self.chain.newest or current.problems:
            raise RunFailed(f"{self.run_id}: the run was amended by another command since this one read it; run this command again")
        try:
            os.rename(self.folder, top / folder_name(doc["index"]))  # the commit point: the whole amendment, or nothing
        except OSError:
            raise RunFailed(f"{self.run_id}: the run was amended by another command since this one read it; run this command again") from None
        sync_folder(top)
        return seal

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def clear_staging(state_dir: Path, is_stale: Any, run_id: Optional[str] = None) -> list[str]:
    """Remove what a kill left in `.veritrain/amending/` (of `run_id`, or of every run whose lock `is_stale(run_id)`
    says no live process holds); returns the folders removed."""
    root = staging_root(state_dir)
    removed = []
    for entry in sorted(root.iterdir()) if root.is_dir() and not root.is_symlink() else []:
        owner = entry.name.split(".", 1)[0]
        if (run_id is None or owner == run_id) and is_stale(owner):
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink(missing_ok=True)
            else:
                shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed

