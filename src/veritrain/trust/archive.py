"""Archive a sealed run (optionally with its prepared data version) as one .tar.gz, and import it
into another workspace — checking every hash before anything is accepted.

Import reads the archive as data only: no path outside the target, no links, devices or other
special members, nothing that the run's record does not list, and nothing is ever unpickled. It
unpacks no more than the archive declares: the record comes first and sizes the run's files, the
data version's version.json comes next and sizes its files, so a gzip bomb is refused before it
is written (the limits below). An archive that is cut short or is not a .tar.gz is exit 2.

Checkpoints a run keeps only for audit (`checkpoint.audit_every`) travel only with `--with-audit`:
without it the archive leaves them out and says so in `runs/<run_id>/archive_omitted.json`, which
import accepts only for files the run's record keeps for audit, and writes into the imported run, so
`veritrain verify` accepts their absence there (and `veritrain audit` replays from what is present).

    veritrain archive latest -o run.tar.gz --with-data
    veritrain import run.tar.gz --workdir elsewhere/
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import tarfile
import tempfile
import time
import uuid
import zlib
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import sha256_file
from veritrain.data.identity import FIELDS_FOLDER, data_version_problems, field_specs, has_fields
from veritrain.data.shards import ShardError
from veritrain.records import amendments
from veritrain.records.record import (
    NOTES_FILE,
    OMITTED_FILE,
    PROVENANCE_FILE,
    RECORD_FILE,
    SEAL_FILE,
    UNSEALED,
    read_record,
    record_problem,
)
from veritrain.records.workspace import Workspace
from veritrain.train.trajectory import audit_only_checkpoints as audit_only
from veritrain.trust.policy import Policy
from veritrain.trust.verify import state_cache_dir, verify_run

# what an archive's archive_omitted.json says about the files it lists
OMITTED_REASON = "checkpoints kept only for audit (checkpoint.audit_every), left out by `veritrain archive` without --with-audit"

# What import unpacks, at most. A file's allowance is the size the archive declares for it: the
# record for the run's files, version.json `files` for a data version's bound files (both come
# first in the archive), each exact. A member whose tar header claims more is refused before a byte
# is written, and the bytes written are counted too. Files that nothing sizes share a margin.
MAX_RECORD_BYTES = 16 << 20  # record.json: real ones are tens of KB (one entry per file of the run)
MAX_SEAL_BYTES = 1 << 10  # record.sha256: one hex digest
MAX_OMITTED_BYTES = 1 << 20  # archive_omitted.json: one name per checkpoint left out (~40 bytes each)
UNSIZED_FILE_BYTES = 64 << 20  # each of notes.jsonl, provenance.intoto.jsonl, version.json, card.json and a data report (nothing sizes them)
UNSIZED_BYTES = 256 << 20  # all of those together: the margin over the declared sizes
# a data version whose version.json does not come first with sizes (archives before it did, recipe 2)
# may hold max(16 × the run's declared bytes, 1 GiB) in all; the ratio cap below still stops a bomb
DATA_FALLBACK_FACTOR, DATA_FALLBACK_MIN = 16, 1 << 30
DATA_MEMBERS = 1_000  # files a data version may add to the member cap (a real one has ~15)
PRE_RECORD_MEMBERS = 64  # directory entries before the record (`tar -C dir .` adds ./, ./runs/, ...)
MAX_MEMBERS = 100_000  # the member cap is 2 × (the files the record allows) + 64, and never above this
MAX_RATIO = 100  # unpacked bytes per compressed byte read so far; real archives are 1.5–10, zeros 1000
RATIO_SLACK = 16 << 20  # ...judged after the first 16 MiB, so a small archive of text is not judged on its first blocks
MEMBER_OVERHEAD = 4 << 10  # tar and pax header blocks and padding per member, for the cap on the whole stream
TRAILING_BYTES = 1 << 20  # zeros after the tar's end-of-archive blocks (tar pads to 10 KiB)


def audit_only_checkpoints(record: dict[str, Any]) -> list[str]:
    """The checkpoints a record keeps only for audit (veritrain.train.trajectory.audit_only_checkpoints, which
    verify uses too): what an archive made without --with-audit leaves out."""

    return audit_only(record)


def _with_sidecars(names: list[str]) -> list[str]:
    return sorted({*names, *(name + ".sha256" for name in names)})


def create(run_dir: Path, state_dir: Path, out: Path, with_data: bool, with_audit: bool = False) -> dict[str, Any]:
    """Pack the run's sealed files (and with `with_data` its data version) into `out`; a run that
    does not verify is refused, so an archive never holds files its own record would reject. Without
    `with_audit` the checkpoints kept only for audit (and their sidecars) are left out, and the archive
    lists them in the run's archive_omitted.json."""
    run_id = run_dir.name
    verified = verify_run(run_dir, state_dir, rehash_data=False)
    # the data version only travels with --with-data (a missing one is the UserError below)
    refused = [p for p in verified["problems"] if not p["kind"].startswith("data_") or (with_data and p["kind"] == "data_version_changed")]
    if refused:
        first = refused[0]
        raise RunFailed(f"archive {run_id}: {first['path']}: {first['kind']}" + (f" ({first['detail']})" if first.get("detail") else "")
                        + (f", and {len(refused) - 1} more problem(s)" if len(refused) > 1 else "")
                        + f"; the run does not verify, see `veritrain verify {run_id}`")
    if verified.get("interrupted_amend"):  # verify judged the run as it was; its files are half switched
        raise RunFailed(f"archive {run_id}: {verified['interrupted_amend']}; archive it after that")
    record = read_record(run_dir)  # verified just above; read through its validation like every record
    own = json.loads((run_dir / RECORD_FILE).read_bytes()).get("artifacts") or {}  # the files the run's own seal lists
    retired = record.applied.retired if record.applied is not None else set()
    audit_only = [name for name in audit_only_checkpoints(record) if name in own]
    absent = [rel for rel in sorted(own) if not (run_dir / rel).is_file() and rel not in retired]  # only what verify excused: audit-only checkpoints
    if with_audit and absent:
        raise UserError(f"--with-audit: {len(absent)} file(s) of {run_id} kept for audit are not in this workspace (first: {absent[0]}); "
                        "the run was imported from an archive made without --with-audit: archive it without --with-audit, or where the run was trained")
    left_out = [] if with_audit else audit_only
    skipped = set(_with_sidecars(left_out))
    # the record's own files (those an amendment retired travel only while they are here), then each amendment whole
    files = [RECORD_FILE, SEAL_FILE, *(rel for rel in sorted(own) if rel not in skipped and (rel not in retired or (run_dir / rel).is_file()))]
    for unsealed in (PROVENANCE_FILE, NOTES_FILE):  # statements about the run outside its seal, as in the run
        if (run_dir / unsealed).exists():
            files.append(unsealed)
    for link in record.amendments:
        prefix = link.folder.relative_to(run_dir).as_posix()
        files += [f"{prefix}/{name}" for name in (amendments.AMENDMENT_FILE, amendments.AMENDMENT_SEAL, PROVENANCE_FILE)]
        files += [f"{prefix}/{amendments.FILES_DIR}/{rel}" for rel in sorted(link.doc["files"])]
    members: list[tuple[Any, str]] = [(run_dir / rel, f"runs/{run_id}/{rel}") for rel in files]
    if left_out:  # right after the seal: what was left out on purpose, checked against the record by import
        listing = json.dumps({"files": left_out, "reason": OMITTED_REASON}, indent=2).encode() + b"\n"
        members.insert(2, (listing, f"runs/{run_id}/{OMITTED_FILE}"))
    version = (record.get("data") or {}).get("version")
    if with_data and not version:  # a script's run reads its own inputs (inputs.json names them): there is no version to carry
        raise UserError(f"--with-data: run {run_id} has no data version (a script's run names its inputs in inputs.json); "
                        "archive it without --with-data")
    if with_data:
        folder = state_dir / "data" / str(version)
        if not (folder / "version.json").exists():
            raise UserError(f"--with-data: the data version {str(version)[:12]} of {run_id} is not in this workspace; prepare it first")
        # version.json first: import sizes the version's files from it before unpacking them
        data_files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: (p.name != "version.json" or p.parent != folder, p))
        members += [(p, f".veritrain/data/{version}/{p.relative_to(folder).as_posix()}") for p in data_files]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for source, name in members:
                if isinstance(source, bytes):  # written by this function, not a file of the run
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(source), int(time.time()), 0o644
                    tar.addfile(info, io.BytesIO(source))
                    continue
                info = tar.gettarinfo(str(source), arcname=name)
                # an export's kept file may be a hard link to the one before: stored whole, as a regular file
                info.type, info.linkname, info.size = tarfile.REGTYPE, "", Path(source).stat().st_size
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(source, "rb") as f:
                    tar.addfile(info, f)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"archive": str(out), "run_id": run_id, "files": len(members), "with_data": with_data, "with_audit": with_audit,
            "left_out": _with_sidecars(left_out), "sha256": sha256_file(out)}


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if (path.is_absolute() or name.startswith("/") or "\\" in name or any(part in ("..", "") for part in path.parts)
            or (path.parts and ":" in path.parts[0])):  # no parts: `.`, as `tar -C dir .` names the top folder
        raise RunFailed(f"import: refused member {name!r}: its path leaves the workspace")
    return path


AMENDMENT_MEMBER = re.compile(r"amendments/[0-9]{4,}/(amendment\.json|amendment\.sha256|provenance\.intoto\.jsonl)")


def _amendment_files(run_staging: Path, seal_member: str, run_id: str) -> dict[str, dict[str, Any]]:
    """The files of the amendment whose amendment.sha256 was just unpacked (its amendment.json before it), by their path
    in the run, once amendment.json matches that seal and is an amendment's; RunFailed otherwise. The chain itself (each
    amendment extends the seal before it) is checked once the whole run is unpacked."""
    folder = run_staging / PurePosixPath(seal_member).parent
    try:
        data = _read_back(folder / amendments.AMENDMENT_FILE)
        seal = _read_back(folder / amendments.AMENDMENT_SEAL).decode("ascii").strip()
        doc = amendments.AmendmentRecord.model_validate(json.loads(data))
    except (OSError, ValueError, RecursionError):  # not there first, not ASCII, not JSON, not an amendment
        raise RunFailed(f"import: refused {seal_member!r}: its amendment.json is missing, comes after it, or is not an amendment") from None
    if hashlib.sha256(data).hexdigest() != seal or doc.run_id != run_id:
        raise RunFailed(f"import: the amendment {folder.name} of {run_id} does not match its seal")
    prefix = f"{PurePosixPath(seal_member).parent.as_posix()}/{amendments.FILES_DIR}/"
    return {prefix + rel: entry.model_dump() for rel, entry in doc.files.items()}


def _sealed_record_parts(record_bytes: bytes, run_id: str) -> tuple[dict[str, dict[str, Any]], Optional[str]]:
    """(artifact table, data version) of a record whose seal matched. A seal only proves the
    two files belong together, so a record and seal forged as a pair are checked for shape here."""
    try:
        record = json.loads(record_bytes)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past Python's limit
        raise RunFailed(f"import: the record of {run_id} is not JSON") from None

    problem = record_problem(record, run_id)  # the same shape every reader relies on, and run_id = its folder
    if problem is not None:
        raise RunFailed(f"import: the record of {run_id[:40]!r} is not a run's record: {problem}")
    artifacts = record.get("artifacts")
    if artifacts is None:  # the model admits a record still being written; an archived run lists its files
        raise RunFailed(f"import: the record of {run_id} has no artifact table (path → sha256, size)")
    return artifacts, (record.get("data") or {}).get("version")  # a version id, validated with the record


class _MeteredGzip:
    """The archive's decompressed bytes as tarfile reads them, headers included: refuses to inflate
    more than `limit` bytes in all or more than MAX_RATIO bytes per compressed byte read so far,
    so a bomb is stopped below tarfile, before it buffers a header or hands a member its data."""

    def __init__(self, raw: BinaryIO, archive: Path):
        self.raw, self.archive = raw, archive
        self.gzip = gzip.GzipFile(fileobj=raw, mode="rb")
        self.inflated = 0  # bytes
        self.limit = MAX_RECORD_BYTES + MAX_SEAL_BYTES + (PRE_RECORD_MEMBERS + 2) * MEMBER_OVERHEAD  # until the record sizes the rest

    def read(self, size: Optional[int] = -1) -> bytes:
        room = self.limit - self.inflated + 1  # one byte past the limit shows it was passed
        try:
            data = self.gzip.read(room if size is None or size < 0 else min(size, room))
        except (EOFError, zlib.error, OSError) as err:  # cut short, not gzip, bad CRC (gzip.BadGzipFile is an OSError)
            raise _damaged(self.archive, err) from None
        self.inflated += len(data)
        if self.inflated > self.limit:
            raise RunFailed(f"import: refused {self.archive}: it unpacks to more than {self.limit} bytes, more than its record and version.json declare")
        if self.inflated > MAX_RATIO * self.raw.tell() + RATIO_SLACK:
            raise RunFailed(f"import: refused {self.archive}: it unpacks to more than {MAX_RATIO} times the compressed bytes read so far (a gzip bomb)")
        return data


def _damaged(archive: Path, err: BaseException) -> UserError:
    detail = " ".join(str(err).split()) or type(err).__name__  # one line
    return UserError(f"import: {archive} is damaged, cut short or not a .tar.gz archive ({detail}); copy it again or make it with `veritrain archive`")


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, destination: Path, allowance: int, over: str) -> tuple[str, int]:
    """Copy one member into `destination`, hashing it on the way; refuses with `over` before writing
    a byte past `allowance`. Returns (sha256, bytes written)."""
    digest, written = hashlib.sha256(), 0
    source = tar.extractfile(member)
    assert source is not None  # a regular member
    try:  # reading raises the archive's errors (TarError, or the meter's), never OSError: an OSError here is the disk's
        destination.parent.mkdir(parents=True, exist_ok=True)
        with source, open(destination, "wb") as out:
            while chunk := source.read(min(1 << 20, allowance - written + 1)):
                written += len(chunk)
                if written > allowance:
                    raise RunFailed(over)
                digest.update(chunk)
                out.write(chunk)
    except OSError as err:  # e.g. a file where another member needs a folder, or a full disk
        raise RunFailed(f"import: cannot unpack member {member.name!r} ({err.strerror or err})") from None
    return digest.hexdigest(), written


def _read_back(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise RunFailed(f"import: cannot read back {path.name} from the staging folder ({err.strerror or err})") from None


def _declared_data_sizes(version_json: bytes) -> Optional[dict[str, int]]:
    """A data version's bound files → the size its version.json declares (recipe 3 on), or None when
    it declares none in a usable form. Only a budget: the files are checked against the version id later."""
    try:
        info = json.loads(version_json)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past Python's limit
        return None
    files = info.get("files") if isinstance(info, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) and isinstance(e.get("size"), int) and e["size"] >= 0 for e in files.values()):
        return None
    sizes = {name: entry["size"] for name, entry in files.items()}
    if has_fields(info):  # its shards, sized by their entries (checked whole against the id after unpacking)
        try:
            sizes |= {f"{FIELDS_FOLDER}/{e.id[:2]}/{e.id}": e.size for spec in field_specs(info).values() for e in spec.shards}
        except ShardError:
            return None
    return sizes


def _unpack_checked(archive: Path, staging: Path) -> tuple[str, dict[str, tuple[str, int]], dict[str, dict[str, Any]], Optional[str]]:
    """Unpack the archive's regular files into `staging` as one pass over the stream, hashing each on
    the way; returns (run id, member name → (sha256, size), the record's artifacts, its data version).
    Refuses what the module docstring forbids and anything past the limits above, as soon as it shows."""
    try:
        raw = open(archive, "rb")
    except OSError as err:
        raise UserError(f"import: cannot read {archive} ({err.strerror or err})") from None
    with raw:
        stream = _MeteredGzip(raw, archive)
        try:
            # the stubs ask any fileobj for write/seek/tell/close; a "r|" stream only reads
            with tarfile.open(fileobj=stream, mode="r|") as tar:  # pyright: ignore[reportCallIssue, reportArgumentType]
                unpacked = _unpack_members(tar, stream, archive, staging)
                _check_end(tar, archive)
        except (tarfile.TarError, EOFError, zlib.error) as err:  # truncated or corrupt: tarfile's view of it
            raise _damaged(archive, err) from None
    return unpacked


def _unpack_members(tar: tarfile.TarFile, stream: _MeteredGzip, archive: Path,
                    staging: Path) -> tuple[str, dict[str, tuple[str, int]], dict[str, dict[str, Any]], Optional[str]]:
    """The loop of _unpack_checked: each member's allowance comes from what the members before it
    declared (the record and seal first, then the data version's version.json)."""
    digests: dict[str, tuple[str, int]] = {}
    run_id, prefix, version, data_prefix = None, "", None, ""
    artifacts: dict[str, dict[str, Any]] = {}
    member_cap, members = PRE_RECORD_MEMBERS + 2, 0
    pools = {"unsized": UNSIZED_BYTES}  # bytes left for files that nothing sizes; "data": a data version without sizes
    data_sizes: Optional[dict[str, int]] = None
    stream_base = run_bytes = data_bytes = 0

    def set_stream_limit() -> None:
        stream.limit = stream_base + run_bytes + data_bytes + UNSIZED_BYTES + member_cap * MEMBER_OVERHEAD + TRAILING_BYTES

    for member in tar:  # in stream order: the compressed file is read once
        members += 1
        if members > member_cap:
            raise RunFailed(f"import: refused {archive}: more than {member_cap} members, more than the files its record allows")
        path = _safe_name(member.name)
        if member.isdir():
            continue
        if not path.parts:
            raise RunFailed(f"import: refused member {member.name!r}: it names no file")
        if not member.isreg():
            kind = "link" if (member.issym() or member.islnk()) else "special file"
            raise RunFailed(f"import: refused member {member.name!r}: a {kind}; archives hold regular files only")
        name = path.as_posix()
        if name in digests:
            raise RunFailed(f"import: refused member {member.name!r}: it appears twice in the archive")
        pool = None
        if run_id is None:  # the record comes first: every other limit is derived from it
            if len(path.parts) != 3 or path.parts[0] != "runs" or path.parts[2] != RECORD_FILE:
                raise RunFailed(f"import: refused {archive}: its first file is {member.name!r}, not a run's record (runs/<run_id>/record.json) as `veritrain archive` writes it")
            run_id, prefix = path.parts[1], f"runs/{path.parts[1]}/"
            allowance, over = MAX_RECORD_BYTES, f"import: refused member {member.name!r}: more than {MAX_RECORD_BYTES} bytes for a record"
        elif len(digests) == 1:  # then its seal
            if name != prefix + SEAL_FILE:
                raise RunFailed(f"import: the record of {run_id} is missing or does not match its seal")
            allowance, over = MAX_SEAL_BYTES, f"import: the record of {run_id} is missing or does not match its seal"
        elif name.startswith(prefix):
            rel = name[len(prefix):]
            if rel in (NOTES_FILE, OMITTED_FILE, PROVENANCE_FILE) or AMENDMENT_MEMBER.fullmatch(rel):
                cap = MAX_OMITTED_BYTES if rel == OMITTED_FILE else UNSIZED_FILE_BYTES
                pool, allowance = "unsized", min(cap, pools["unsized"])
                over = f"import: refused member {member.name!r}: more than the {allowance} bytes import accepts for a file whose size nothing declares"
            elif rel in artifacts:
                allowance = artifacts[rel]["size"]
                over = f"import: refused member {member.name!r}: more than the {allowance} bytes the record lists for it"
            else:
                raise RunFailed(f"import: refused {name!r}: not listed in the run's record")
        elif version and name.startswith(data_prefix):
            rel = name[len(data_prefix):]
            if data_sizes is not None and rel in data_sizes:
                allowance = data_sizes[rel]
                over = f"import: the archived data version {version[:12]}: {rel}: more than the {allowance} bytes its version.json lists"
            elif data_sizes is not None or (rel == "version.json" and "data" not in pools):  # card, reports; version.json first
                pool, allowance = "unsized", min(UNSIZED_FILE_BYTES, pools["unsized"])
                over = f"import: refused member {member.name!r}: more than the {allowance} bytes import accepts for a file whose size nothing declares"
            else:  # no version.json first: the whole version shares one fixed allowance
                pool, allowance = "data", pools.setdefault("data", data_bytes)
                over = f"import: refused member {member.name!r}: the data version's files add up to more than {data_bytes} bytes, the most import accepts when version.json does not come first with their sizes; archive the run again with `veritrain archive`"
        elif path.parts[0] == "runs" and len(path.parts) > 2:
            raise RunFailed(f"import: expected exactly one run under runs/ in the archive, found a second one in {name!r}")
        else:
            raise RunFailed(f"import: refused {name!r}: neither part of the run nor of its data version")
        if not 0 <= member.size <= allowance:  # the header's claim, before a byte is written
            raise RunFailed(over)
        digests[name] = _write_member(tar, member, staging / path, allowance, over)
        if pool:
            pools[pool] -= digests[name][1]

        if len(digests) == 2:  # record and seal: check the pair, then size everything else from the record
            seal = _read_back(staging / prefix / SEAL_FILE).decode(errors="replace").strip()
            if digests[prefix + RECORD_FILE][0] != seal:  # hashed while unpacking
                raise RunFailed(f"import: the record of {run_id} is missing or does not match its seal")
            artifacts, version = _sealed_record_parts(_read_back(staging / prefix / RECORD_FILE), run_id)
            data_prefix = f".veritrain/data/{version}/"
            run_bytes = sum(max(entry["size"], 0) for entry in artifacts.values())
            data_bytes = max(DATA_FALLBACK_FACTOR * run_bytes, DATA_FALLBACK_MIN) if version else 0  # until version.json sizes it
            member_cap = min(MAX_MEMBERS, 2 * (len(artifacts) + len(UNSEALED) + (DATA_MEMBERS if version else 0)) + PRE_RECORD_MEMBERS)
            stream_base = stream.inflated
            set_stream_limit()
        elif name.startswith(prefix) and name.endswith("/" + amendments.AMENDMENT_SEAL) and AMENDMENT_MEMBER.fullmatch(name[len(prefix):]):
            added = _amendment_files(staging / prefix, name[len(prefix):], run_id)  # sizes its files, which follow it
            artifacts.update(added)
            run_bytes += sum(entry["size"] for entry in added.values())
            member_cap = min(MAX_MEMBERS, member_cap + 2 * (len(added) + 3))
            set_stream_limit()
        elif version and name == data_prefix + "version.json" and data_sizes is None and "data" not in pools:
            data_sizes = _declared_data_sizes(_read_back(staging / path))
            if data_sizes is None:
                pools["data"] = data_bytes  # no usable sizes (recipe 2, or damaged: reported after unpacking)
            else:
                data_bytes = sum(data_sizes.values())
                member_cap = min(MAX_MEMBERS, member_cap + 2 * len(data_sizes))  # a version with many shards
                set_stream_limit()
    if run_id is None:
        raise RunFailed(f"import: refused {archive}: it holds no run (no runs/<run_id>/record.json)")
    if len(digests) == 1:
        raise RunFailed(f"import: the record of {run_id} is missing or does not match its seal")
    return run_id, digests, artifacts, version


def _check_end(tar: tarfile.TarFile, archive: Path) -> None:
    """tarfile stops quietly at a header block that is missing, short or not a header; what follows
    the last member must be the end-of-archive blocks (zeros), then the gzip stream's own end, whose
    length and CRC are checked once it is read. A copy cut at a member boundary fails here."""
    rest = 0  # bytes
    while chunk := tar.fileobj.read(1 << 16):  # type: ignore[union-attr]
        rest += len(chunk)
        if chunk.strip(b"\0") or rest > TRAILING_BYTES:
            raise _damaged(archive, ValueError("there is data after the end of its tar archive"))
    if rest < tarfile.BLOCKSIZE:  # the stopping block was read already; a whole archive has a second zero block at least
        raise _damaged(archive, ValueError("the end of its tar archive is missing"))


def _accepted_omissions(archive: Path, run_staging: Path, artifacts: dict[str, Any], present: set[str]) -> set[str]:
    """The files the archive left out on purpose (its archive_omitted.json, with their sidecars), once every
    one is a checkpoint the (sealed) record keeps only for audit and none is in the archive after all; the
    listing is then written again in the form verify reads. A listing that names anything else (best.pt,
    last.pt, metrics) is refused: it would excuse a missing file."""
    path = run_staging / OMITTED_FILE
    if not path.exists():
        return set()
    shape = f"import: refused {archive}: its {OMITTED_FILE} is not {{\"files\": [\"checkpoints/step-<N>.pt\", ...]}} as `veritrain archive` writes it"
    try:
        listing = json.loads(_read_back(path))
    except (ValueError, RecursionError):
        raise RunFailed(shape) from None
    names = listing.get("files") if isinstance(listing, dict) else None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise RunFailed(shape)
    record = json.loads(_read_back(run_staging / RECORD_FILE))  # sealed and checked for shape while unpacking
    allowed = {name for name in audit_only_checkpoints(record) if name in artifacts}
    for name in names:
        if name not in allowed:
            raise RunFailed(f"import: refused {archive}: its {OMITTED_FILE} names {name[:80]!r}, which the run's record does not keep "
                            "only for audit; an archive may leave out only checkpoints kept for audit (checkpoint.audit_every)")
        if name in present or name + ".sha256" in present:
            raise RunFailed(f"import: refused {archive}: its {OMITTED_FILE} names {name[:80]!r}, which the archive holds")
    excused = _with_sidecars(sorted(set(names)))
    path.write_text(json.dumps({"files": sorted(set(names)), "reason": OMITTED_REASON}, indent=2) + "\n", encoding="utf-8")
    return set(excused)


def _chain_checked(run_staging: Path, seal: str, run_id: str) -> set[str]:
    """The files of the run's own record that its amendments retired (they need not travel), once the unpacked amendments
    form an unbroken chain on the record's seal and the run as amended is a valid record; RunFailed otherwise."""
    chain = amendments.read_chain(run_staging, seal, run_id)
    if chain.problems:
        first = chain.problems[0]
        raise RunFailed(f"import: {first['path']} of {run_id}: {first['detail']}")
    if not chain.links:
        return set()
    try:
        return set(read_record(run_staging).applied.retired)
    except RunFailed as err:
        raise RunFailed(f"import: the run {run_id} as amended: {err}") from None


def import_archive(archive: Path, workspace: Workspace) -> dict[str, Any]:
    """Check every member, then move the run (and data version) into the workspace. Members are
    unpacked (and hashed) into a staging folder under `.veritrain/`, never held in memory; nothing
    leaves the staging folder unless every check passed."""
    if not archive.is_file():
        raise UserError(f"{archive}: no such archive file")
    staging = workspace.state_dir / f"import-{uuid.uuid4().hex}"
    state_dir_existed, accepted = workspace.state_dir.exists(), False
    try:
        run_id, digests, artifacts, version = _unpack_checked(archive, staging)  # the record matched its seal
        prefix, data_prefix = f"runs/{run_id}/", f".veritrain/data/{version}/"
        for name, (digest, size) in digests.items():  # unpacking took only the run's listed files and its data version
            rel = name[len(prefix):]
            if (name.startswith(prefix) and rel not in UNSEALED and not AMENDMENT_MEMBER.fullmatch(rel)
                    and (digest, size) != (artifacts[rel]["sha256"], artifacts[rel]["size"])):
                raise RunFailed(f"import: {name!r} does not match its hash in the record")
        retired = _chain_checked(staging / prefix, digests[prefix + RECORD_FILE][0], run_id)
        left_out = _accepted_omissions(archive, staging / prefix, artifacts, {n[len(prefix):] for n in digests if n.startswith(prefix)})
        missing = [rel for rel in artifacts if prefix + rel not in digests and rel not in left_out and rel not in retired]
        if missing:
            raise RunFailed(f"import: {len(missing)} file(s) of the record are missing from the archive (first: {missing[0]})")
        data_files = {n[len(data_prefix):] for n in digests if version and n.startswith(data_prefix)}

        def read_data_file(name: str) -> bytes:
            if name not in data_files:
                raise KeyError(name)
            return (staging / data_prefix / name).read_bytes()

        if data_files and version:  # data_files is empty without a version: the version only narrows the type
            damaged = data_version_problems(version, read_data_file, lambda name: digests[data_prefix + name][0], sorted(data_files))
            if damaged:
                raise RunFailed(f"import: the archived data version {version[:12]}: {damaged[0]['path']}: {damaged[0]['detail']}")

        target = workspace.runs_dir / run_id
        if target.exists():
            raise UserError(f"import: run {run_id} already exists in {workspace.runs_dir}")
        workspace.runs_dir.mkdir(parents=True, exist_ok=True)
        # each move is one rename, the data version first: a kill between the two leaves a version no run uses
        # (gc removes it), never a run without its data; a kill before them leaves only the staging folder (gc too)
        data_target = workspace.state_dir / "data" / str(version)
        if data_files and not data_target.exists():
            data_target.parent.mkdir(parents=True, exist_ok=True)
            try:
                (staging / data_prefix).rename(data_target)
            except OSError:
                if not (data_target / "version.json").exists():  # not a lost race with a prepare or import of the same version
                    raise
        (staging / prefix).rename(target)
        accepted = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not accepted and not state_dir_existed:
            try:
                workspace.state_dir.rmdir()  # made only for the staging folder: a refusal leaves the workspace as it was
            except OSError:
                pass
    imported = read_record(target)
    config = imported.get("config")
    code = [str(config["model"]["target"])] if isinstance(config, dict) and isinstance(config.get("model"), dict) and config["model"].get("target") else []
    files = (imported.get("code") or {}).get("user_files") or []
    code += [f"code/{entry.get('path')} ({entry.get('module')})" for entry in files if isinstance(entry, dict)]  # the copies it would import
    return {"run_id": run_id, "run_dir": str(target), "data_version": version, "with_data": bool(data_files),
            "left_out": sorted(left_out), "code": code}  # the code the run's config names: never run without --trust-code


def verify_archive(archive: Path, policy: Optional[Policy] = None) -> dict[str, Any]:
    """`veritrain verify ARCHIVE`: the archive checked as `import` checks it (every member hashed against the sealed
    record, nothing outside, no links, no bombs) and the run in it verified under `policy`, in a scratch workspace
    outside every workspace, removed afterwards: a reader checks what they were given without making a workspace.
    Returns verify's answer with "archive", "run_id" and "with_data". RunFailed (exit 1) when the archive is refused;
    UserError (exit 2) when it is no archive at all."""

    with tempfile.TemporaryDirectory(prefix="veritrain-verify-archive-") as scratch:
        workspace = Workspace(Path(scratch).resolve())
        imported = import_archive(archive, workspace)
        run_dir = Path(imported["run_dir"])

        result = verify_run(run_dir, workspace.state_dir, policy, state_cache=state_cache_dir())
    return {"archive": str(archive), "run_id": imported["run_id"], "with_data": imported["with_data"], **result}
