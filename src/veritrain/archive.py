"""Archive a sealed run (optionally with its prepared data version) as one .tar.gz, and import it
into another workspace — checking every hash before anything is accepted.

Import reads the archive as data only: no path outside the target, no links, devices or other
special members, nothing that the run's record does not list, and nothing is ever unpickled.

    veritrain archive latest -o run.tar.gz --with-data
    veritrain import run.tar.gz --workdir elsewhere/
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import uuid
import zlib
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from veritrain.errors import RunFailed, UserError
from veritrain.hashing import sha256_file
from veritrain.record import NOTES_FILE, RECORD_FILE, SEAL_FILE, UNSEALED
from veritrain.verify import data_version_problems, verify_run

MAX_MEMBER_BYTES = 64 << 30  # refuse absurd member sizes before reading them


def create(run_dir: Path, state_dir: Path, out: Path, with_data: bool) -> dict[str, Any]:
    """Pack the run's sealed files (and with `with_data` its data version) into `out`; a run that
    does not verify is refused, so an archive never holds files its own record would reject."""
    run_id = run_dir.name
    verified = verify_run(run_dir, state_dir, rehash_data=False)
    # the data version only travels with --with-data (a missing one is the UserError below)
    refused = [p for p in verified["problems"] if not p["kind"].startswith("data_") or (with_data and p["kind"] == "data_version_changed")]
    if refused:
        first = refused[0]
        raise RunFailed(f"archive {run_id}: {first['path']}: {first['kind']}" + (f" ({first['detail']})" if first.get("detail") else "")
                        + (f", and {len(refused) - 1} more problem(s)" if len(refused) > 1 else "")
                        + f"; the run does not verify, see `veritrain verify {run_id}`")
    record = json.loads((run_dir / RECORD_FILE).read_text(encoding="utf-8"))
    files = [RECORD_FILE, SEAL_FILE, *sorted(record.get("artifacts") or {})]
    if (run_dir / NOTES_FILE).exists():
        files.append(NOTES_FILE)
    members = [(run_dir / rel, f"runs/{run_id}/{rel}") for rel in files]
    version = (record.get("data") or {}).get("version")
    if with_data:
        folder = state_dir / "data" / str(version)
        if not (folder / "version.json").exists():
            raise UserError(f"--with-data: the data version {str(version)[:12]} of {run_id} is not in this workspace; prepare it first")
        members += [(p, f".veritrain/data/{version}/{p.relative_to(folder).as_posix()}") for p in sorted(folder.rglob("*")) if p.is_file()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for path, name in members:
                info = tar.gettarinfo(str(path), arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"archive": str(out), "run_id": run_id, "files": len(members), "with_data": with_data,
            "sha256": sha256_file(out)}


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if (path.is_absolute() or name.startswith("/") or "\\" in name or any(part in ("..", "") for part in path.parts)
            or (path.parts and ":" in path.parts[0])):  # no parts: `.`, as `tar -C dir .` names the top folder
        raise RunFailed(f"import: refused member {name!r}: its path leaves the workspace")
    return path


def _sealed_record_parts(record_bytes: bytes, run_id: str) -> tuple[dict[str, dict[str, Any]], Optional[str]]:
    """(artifact table, data version) of a record whose seal matched. A seal only proves the
    two files belong together, so a record and seal forged as a pair are checked for shape here."""
    try:
        record = json.loads(record_bytes)
    except ValueError:  # not UTF-8, or not JSON
        raise RunFailed(f"import: the record of {run_id} is not JSON") from None
    artifacts = record.get("artifacts") if isinstance(record, dict) else None
    if not isinstance(artifacts, dict) or not all(
        isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("size"), int) for entry in artifacts.values()
    ):
        raise RunFailed(f"import: the record of {run_id} has no valid artifact table (path → sha256, size)")
    data = record.get("data")
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, str) or "/" in version or version in ("", ".", ".."):
        version = None  # the run then imports without a data version: no archived data member is accepted
    return artifacts, version


def _unpack_checked(archive: Path, staging: Path) -> dict[str, tuple[str, int]]:
    """Unpack the archive's regular files into `staging` as one pass over the stream, hashing each
    on the way; returns member name → (sha256, size). Refuses what the module docstring forbids."""
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as err:
        raise RunFailed(f"import: {archive} is not a .tar.gz archive ({err})") from None
    digests: dict[str, tuple[str, int]] = {}
    with tar:
        try:
            for member in tar:  # in stream order: the compressed file is read once
                path = _safe_name(member.name)
                if member.isdir():
                    continue
                if not path.parts:
                    raise RunFailed(f"import: refused member {member.name!r}: it names no file")
                if not member.isreg():
                    kind = "link" if (member.issym() or member.islnk()) else "special file"
                    raise RunFailed(f"import: refused member {member.name!r}: a {kind}; archives hold regular files only")
                if member.size > MAX_MEMBER_BYTES:
                    raise RunFailed(f"import: refused member {member.name!r}: {member.size} bytes")
                destination = staging / path
                try:
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    digest, size = hashlib.sha256(), 0
                    with tar.extractfile(member) as source, open(destination, "wb") as out:  # type: ignore[union-attr]
                        while chunk := source.read(1 << 20):
                            digest.update(chunk)
                            size += len(chunk)
                            out.write(chunk)
                except OSError as err:  # e.g. a file where another member needs a folder, or a full disk
                    raise RunFailed(f"import: cannot unpack member {member.name!r} ({err.strerror or err})") from None
                digests[path.as_posix()] = (digest.hexdigest(), size)
        except (tarfile.TarError, EOFError, zlib.error) as err:  # truncated or corrupt after the first block
            raise RunFailed(f"import: {archive} is damaged ({err})") from None
    return digests


def import_archive(archive: Path, workspace: Any) -> dict[str, Any]:
    """Check every member, then move the run (and data version) into the workspace. Members are
    unpacked (and hashed) into a staging folder under `.veritrain/`, never held in memory; nothing
    leaves the staging folder unless every check passed."""
    if not archive.is_file():
        raise UserError(f"{archive}: no such archive file")
    staging = workspace.state_dir / f"import-{uuid.uuid4().hex}"
    try:
        digests = _unpack_checked(archive, staging)
        runs = {PurePosixPath(n).parts[1] for n in digests if n.startswith("runs/") and len(PurePosixPath(n).parts) > 2}
        if len(runs) != 1:
            raise RunFailed(f"import: expected exactly one run under runs/ in the archive, found {len(runs)}")
        run_id = runs.pop()
        prefix = f"runs/{run_id}/"
        seal = (staging / prefix / SEAL_FILE).read_bytes().decode(errors="replace").strip() if prefix + SEAL_FILE in digests else ""
        if prefix + RECORD_FILE not in digests or digests[prefix + RECORD_FILE][0] != seal:  # hashed while unpacking
            raise RunFailed(f"import: the record of {run_id} is missing or does not match its seal")
        artifacts, version = _sealed_record_parts((staging / prefix / RECORD_FILE).read_bytes(), run_id)
        data_prefix = f".veritrain/data/{version}/"
        for name, (digest, size) in digests.items():
            if name.startswith(prefix):
                rel = name[len(prefix):]
                if rel in UNSEALED:
                    continue
                entry = artifacts.get(rel)
                if entry is None:
                    raise RunFailed(f"import: refused {name!r}: not listed in the run's record")
                if digest != entry["sha256"] or size != entry["size"]:
                    raise RunFailed(f"import: {name!r} does not match its hash in the record")
            elif not (version and name.startswith(data_prefix)):
                raise RunFailed(f"import: refused {name!r}: neither part of the run nor of its data version")
        missing = [rel for rel in artifacts if prefix + rel not in digests]
        if missing:
            raise RunFailed(f"import: {len(missing)} file(s) of the record are missing from the archive (first: {missing[0]})")
        data_files = {n[len(data_prefix):] for n in digests if version and n.startswith(data_prefix)}

        def read_data_file(name: str) -> bytes:
            if name not in data_files:
                raise KeyError(name)
            return (staging / data_prefix / name).read_bytes()

        if data_files:
            damaged = data_version_problems(version, read_data_file, lambda name: digests[data_prefix + name][0], sorted(data_files))
            if damaged:
                raise RunFailed(f"import: the archived data version {version[:12]}: {damaged[0]['path']}: {damaged[0]['detail']}")

        target = workspace.runs_dir / run_id
        if target.exists():
            raise UserError(f"import: run {run_id} already exists in {workspace.runs_dir}")
        workspace.runs_dir.mkdir(parents=True, exist_ok=True)
        (staging / prefix).rename(target)
        data_target = workspace.state_dir / "data" / str(version)
        if data_files and not data_target.exists():
            data_target.parent.mkdir(parents=True, exist_ok=True)
            (staging / data_prefix).rename(data_target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"run_id": run_id, "run_dir": str(target), "data_version": version, "with_data": bool(data_files)}
