"""Archive round trip, and crafted archives refused with nothing written outside the target."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import shutil
import tarfile
import time
from pathlib import Path

import pytest

from veritrain.trust import archive as archive_module


@pytest.fixture(scope="module")
def archived(small_run, tmp_path_factory):
    """The shared small run, archived with its data version."""
    out = tmp_path_factory.mktemp("out") / "run.tar.gz"
    from veritrain.trust import archive

    archive.create(small_run.run_dir, small_run.workdir / ".veritrain", out, with_data=True)
    return small_run.workdir, small_run.run_dir, out


def test_round_trip_verifies(cli, archived, tmp_path):
    _, run_dir, out = archived
    target = tmp_path / "elsewhere"
    result = cli("import", str(out), "--workdir", str(target), "--json")
    assert result.code == 0, result.stderr
    assert result.json()["run_id"] == run_dir.name and result.json()["with_data"]
    verified = cli("verify", run_dir.name, "--workdir", str(target), "--json")
    assert verified.code == 0, verified.stderr
    assert verified.json()["seal"] == (run_dir / "record.sha256").read_text().strip()
    again = cli("import", str(out), "--workdir", str(target))
    assert again.code == 2 and "already exists" in again.stderr


def crafted(tmp_path: Path, archived, add) -> Path:
    """A copy of the good archive with one extra member made by `add(tar)`."""
    _, _, out = archived
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(out, "r:gz") as source, tarfile.open(bad, "w:gz") as tar:
        for member in source.getmembers():
            tar.addfile(member, source.extractfile(member))
        add(tar)
    return bad


def regular(name: str, data: bytes = b"x"):
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return add


def special(name: str, kind: bytes, linkname: str = ""):
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        tar.addfile(info)
    return add


@pytest.mark.parametrize("label, make, message", [
    ("dotdot", lambda run: regular(f"runs/{run}/../../x"), "leaves the workspace"),
    ("absolute", lambda run: regular("/tmp/vt-abs-evil"), "leaves the workspace"),
    ("symlink", lambda run: special(f"runs/{run}/link", tarfile.SYMTYPE, "/etc/passwd"), "a link"),
    ("hardlink", lambda run: special(f"runs/{run}/hard", tarfile.LNKTYPE, "/etc/passwd"), "a link"),
    ("device", lambda run: special(f"runs/{run}/dev", tarfile.CHRTYPE), "a special file"),
    ("unlisted", lambda run: regular(f"runs/{run}/extra.txt"), "not listed in the run's record"),
    ("dot file", lambda run: regular("."), "refused member '.': it names no file"),
])
def test_crafted_archives_are_refused(cli, archived, tmp_path, label, make, message):
    _, run_dir, _ = archived
    bad = crafted(tmp_path, archived, make(run_dir.name))
    target = tmp_path / "target"
    before = set(tmp_path.rglob("*"))
    result = cli("import", str(bad), "--workdir", str(target))
    assert result.code == 1, result.stderr
    assert message in result.stderr and result.stderr.startswith("error: import: ")
    assert not (target / "runs").exists()
    created = set(tmp_path.rglob("*")) - before
    assert all(p == target or target in p.parents for p in created), created  # nothing outside the target
    assert not Path("/tmp/vt-abs-evil").exists() and not (tmp_path / "x").exists()
    assert not any(p.name.startswith("import-") for p in (target / ".veritrain").glob("*")) if (target / ".veritrain").exists() else True


def test_tampered_member_is_refused(cli, archived, tmp_path):
    _, run_dir, out = archived
    bad = tmp_path / "tampered.tar.gz"
    with tarfile.open(out, "r:gz") as source, tarfile.open(bad, "w:gz") as tar:
        for member in source.getmembers():
            data = source.extractfile(member).read()
            if member.name.endswith("metrics.jsonl"):
                data = data.replace(b"0", b"1", 1)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    result = cli("import", str(bad), "--workdir", str(tmp_path / "t"))
    assert result.code == 1 and "does not match its hash" in result.stderr


def rewritten(tmp_path: Path, archived, change) -> Path:
    """A copy of the good archive with each member renamed or replaced by `change(name, data)`
    (None drops the member)."""
    _, _, out = archived
    bad = tmp_path / "rewritten.tar.gz"
    with tarfile.open(out, "r:gz") as source, tarfile.open(bad, "w:gz") as tar:
        for member in source.getmembers():
            changed = change(member.name, source.extractfile(member).read())
            if changed is not None:
                member.name, data = changed
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    return bad


def test_archive_made_with_tar_dot_imports(cli, archived, tmp_path):
    """`tar -C dir -czf run.tar.gz .` names every member ./… and adds a `.` directory first."""
    bad = rewritten(tmp_path, archived, lambda name, data: (f"./{name}", data))
    with_dot = tmp_path / "dot.tar.gz"
    with tarfile.open(bad, "r:gz") as source, tarfile.open(with_dot, "w:gz") as tar:
        top = tarfile.TarInfo(".")
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        for member in source.getmembers():
            tar.addfile(member, source.extractfile(member))
    result = cli("import", str(with_dot), "--workdir", str(tmp_path / "t"), "--json")
    assert result.code == 0, result.stderr
    assert cli("verify", result.json()["run_id"], "--workdir", str(tmp_path / "t")).code == 0


@pytest.mark.parametrize("label, change", [
    ("no manifest", lambda name, data: None if name.endswith("/manifest.csv") else (name, data)),
    ("version.json not JSON", lambda name, data: (name, b"{broken" if name.endswith("/version.json") else data)),
    ("version.json lacks fields", lambda name, data: (name, b"{}" if name.endswith("/version.json") else data)),
    ("shard changed", lambda name, data: (name, data[:-1] + bytes([data[-1] ^ 1]) if name.endswith(IMAGE_SHARD) else data)),
    ("shard cut short", lambda name, data: (name, data[:-1] if name.endswith(IMAGE_SHARD) else data)),
])
def test_damaged_data_version_in_archive_is_refused(cli, archived, tmp_path, label, change):
    bad = rewritten(tmp_path, archived, change)
    target = tmp_path / "t"
    result = cli("import", str(bad), "--workdir", str(target))
    assert result.code == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: import: the archived data version ") and len(result.stderr.strip().splitlines()) == 1
    assert not (target / "runs").exists()


@pytest.mark.parametrize("label, record, message", [
    ("not json", b"\xff not a record", "is not JSON"),
    ("a list", b"[1, 2]", "is not a run's record: not a JSON object"),
    ("no run id", b'{"artifacts": [1]}', "is not a run's record: its run_id 'None' is not its folder's name"),
    ("another run id", b'{"run_id": "20261130-000000-000-abcdef"}', "its run_id '20261130-000000-000-abcdef' is not its folder's name"),
])
def test_record_and_seal_forged_together_are_refused_in_one_line(cli, archived, tmp_path, label, record, message):
    def forge(name: str, data: bytes):
        if name.endswith("/record.json"):
            return name, record
        if name.endswith("/record.sha256"):
            return name, (hashlib.sha256(record).hexdigest() + "\n").encode()  # the seal matches the forged record
        return name, data
    result = cli("import", str(rewritten(tmp_path, archived, forge)), "--workdir", str(tmp_path / "t"))
    assert result.code == 1, result.stderr
    assert result.stderr.startswith("error: import: ") and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "t" / "runs").exists()


def test_archive_of_a_run_missing_a_file_is_refused(cli, archived, tmp_path):
    import shutil

    workdir, run_dir, _ = archived
    copy = tmp_path / "runs" / run_dir.name
    shutil.copytree(run_dir, copy)
    (copy / "metrics.jsonl").unlink()
    out = tmp_path / "out.tar.gz"
    result = cli("archive", str(copy), "-o", str(out), "--workdir", str(workdir))
    assert result.code == 1, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"error: archive {run_dir.name}: metrics.jsonl: missing")
    assert f"veritrain verify {run_dir.name}" in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.tar.gz.*"))


def test_archive_is_hashed_as_a_stream(archived, tmp_path, monkeypatch):
    """The archive can be far larger than memory: its sha256 is computed in chunks."""
    from veritrain.trust import archive

    workdir, run_dir, _ = archived
    out = tmp_path / "run.tar.gz"
    real = Path.read_bytes

    def read_bytes(self):
        assert self != out, "the whole archive was read into memory"
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    result = archive.create(run_dir, workdir / ".veritrain", out, with_data=False)
    with open(out, "rb") as f:
        assert result["sha256"] == hashlib.sha256(f.read()).hexdigest()


# Hostile archives: bombs, too many members, damaged or foreign files. Each is built here from the
# good archive; each must be refused in one line, quickly, leaving no staging folder and no run.

BOMB = 128 << 20  # bytes of zeros: gzip packs them into ~130 KB (1000:1); never held in memory


class Zeros:
    """`size` zero bytes as a stream, for tarfile.addfile."""

    def __init__(self, size: int):
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def rebuilt(tmp_path: Path, archived, edit, first=(), last=()) -> Path:
    """A copy of the good archive whose members pass through `edit(info, data)`, which returns the
    (TarInfo, file object) pairs to write instead; `first` and `last` add such pairs around them."""
    _, _, out = archived
    bad = tmp_path / "attack.tar.gz"
    with tarfile.open(out, "r:gz") as source, tarfile.open(bad, "w:gz") as tar:
        for info, data in first:
            tar.addfile(info, data)
        for member in source.getmembers():
            for info, data in edit(member, source.extractfile(member).read()):
                tar.addfile(info, data)
        for info, data in last:
            tar.addfile(info, data)
    return bad


def file_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def keep(member, data):
    return [(member, io.BytesIO(data))]


# the shard of the digits' pixels (data recipe 7): the largest file of the data version
IMAGE_SHARD = "fields/ce/ce42b4e60411911ea5037d3606748a6930c1bba694233b8dc34984332ea529f4"


def zeros_for(suffix: str):
    """`suffix`'s member replaced by BOMB zero bytes under a truthful tar header."""
    def edit(member, data):
        return [(file_info(member.name, BOMB), Zeros(BOMB))] if member.name.endswith(suffix) else keep(member, data)
    return edit


def bomb_the_record_declares(member, data):
    """A record and seal forged together that declare metrics.jsonl as BOMB bytes: its tar header
    then matches the record, so only the compression ratio can tell."""
    if member.name.endswith("/record.json"):
        record = json.loads(data)
        record["artifacts"]["metrics.jsonl"]["size"] = BOMB
        forged = json.dumps(record).encode()
        seal = (hashlib.sha256(forged).hexdigest() + "\n").encode()
        return [(file_info(member.name, len(forged)), io.BytesIO(forged)),
                (file_info(member.name.replace("record.json", "record.sha256"), len(seal)), io.BytesIO(seal))]
    if member.name.endswith("/record.sha256"):
        return []  # written with the forged record
    if member.name.endswith("/metrics.jsonl"):
        return [(file_info(member.name, BOMB), Zeros(BOMB))]
    return keep(member, data)


def version_json_last(edit):
    """As archives made before version.json came first (and tests/fixtures/legacy): its size table
    then arrives too late to size the data version's other files."""
    held = []

    def reorder(member, data):
        if member.name.endswith("/version.json"):
            held.append((member, data))
            return []
        out = edit(member, data)
        if member.name.endswith("/splits/val.txt"):  # the last data file before version.json
            out += keep(*held[0])
        return out
    return reorder


def pax_bomb(run_id: str):
    info = file_info(f"runs/{run_id}/record.json", 0)
    info.pax_headers = {"comment": "0" * (64 << 20)}  # read whole into memory by tarfile, were nothing below it counting
    return info


# label → (how to build it from (tmp_path, archived, run_id), exit code, a part of the message)
ATTACKS = {
    "bomb in a file the record lists": (lambda t, a, run: rebuilt(t, a, zeros_for("/metrics.jsonl")), 1, "bytes the record lists for it"),
    "bomb the record declares": (lambda t, a, run: rebuilt(t, a, bomb_the_record_declares), 1, "(a gzip bomb)"),
    "bomb in a data file": (lambda t, a, run: rebuilt(t, a, zeros_for(IMAGE_SHARD)), 1, "bytes its version.json lists"),
    "bomb in a data file before version.json": (lambda t, a, run: rebuilt(t, a, version_json_last(zeros_for(IMAGE_SHARD))), 1, "(a gzip bomb)"),
    "bomb in a pax header": (lambda t, a, run: rebuilt(t, a, keep, first=[(pax_bomb(run), io.BytesIO())]), 1, "import: refused"),
    "bomb after the end of the tar": (lambda t, a, run: gzipped(t, tar_bytes(a) + bytes(BOMB // 8)), 2, "data after the end of its tar archive"),
    "many members": (lambda t, a, run: rebuilt(t, a, keep, last=[(dir_info(f"d/{i}"), None) for i in range(5000)]), 1, "members, more than the files its record allows"),
    "many members before the record": (lambda t, a, run: rebuilt(t, a, keep, first=[(dir_info(f"d/{i}"), None) for i in range(100)]), 1, "more than 66 members"),
    "random bytes": (lambda t, a, run: written(t, random.Random(0).randbytes(1 << 16)), 2, "is damaged, cut short or not a .tar.gz archive"),
    "empty file": (lambda t, a, run: written(t, b""), 2, "(empty file)"),
    "gzip cut in half": (lambda t, a, run: written(t, a[2].read_bytes()[: a[2].stat().st_size // 2]), 2, "Compressed file ended"),
    "gzip cut near its end": (lambda t, a, run: written(t, a[2].read_bytes()[: int(a[2].stat().st_size * 0.98)]), 2, "Compressed file ended"),
    "gzip without its last 4 bytes": (lambda t, a, run: written(t, a[2].read_bytes()[:-4]), 2, "Compressed file ended"),
    "gzip then garbage": (lambda t, a, run: written(t, a[2].read_bytes() + b"garbage"), 2, "Not a gzipped file"),
    "tar cut in half": (lambda t, a, run: gzipped(t, tar_bytes(a)[: len(tar_bytes(a)) // 2]), 2, "is damaged, cut short"),
    "tar cut at a member boundary": (lambda t, a, run: gzipped(t, tar_bytes(a)[: last_header_offset(a)]), 2, "the end of its tar archive is missing"),
    "tar not gzipped": (lambda t, a, run: written(t, tar_bytes(a)), 2, "Not a gzipped file"),
    "gzip of random bytes": (lambda t, a, run: gzipped(t, random.Random(1).randbytes(1 << 16)), 2, "is damaged, cut short"),
}


def written(tmp_path: Path, data: bytes) -> Path:
    bad = tmp_path / "attack.tar.gz"
    bad.write_bytes(data)
    return bad


def gzipped(tmp_path: Path, data: bytes) -> Path:
    return written(tmp_path, gzip.compress(data))


def tar_bytes(archived) -> bytes:
    return gzip.decompress(archived[2].read_bytes())


def last_header_offset(archived) -> int:
    with tarfile.open(archived[2], "r:gz") as tar:
        return tar.getmembers()[-1].offset  # the tar ends just before the last member: no end-of-archive blocks


def leftovers(target: Path) -> list[Path]:
    state = target / ".veritrain"
    return sorted(state.rglob("*")) if state.exists() else []


@pytest.mark.parametrize("label", list(ATTACKS))
def test_hostile_archive_is_refused_in_one_line_and_leaves_nothing(cli, archived, tmp_path, label):
    _, run_dir, _ = archived
    build, code, message = ATTACKS[label]
    bad = build(tmp_path, archived, run_dir.name)
    target = tmp_path / "t"
    started = time.monotonic()
    result = cli("import", str(bad), "--workdir", str(target))
    elapsed = time.monotonic() - started
    assert result.code == code, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: import: ") and message in result.stderr, result.stderr
    assert not (target / "runs").exists() and leftovers(target) == []  # no staging folder, no data version, nothing
    assert elapsed < 5, f"{label}: {elapsed:.1f} s"  # loose: a bomb must be stopped early, not unpacked


@pytest.mark.parametrize("label, member, stopped_by", [
    ("bomb in a file the record lists", "metrics.jsonl", "header"),  # its tar header claims more than the record lists
    ("bomb in a data file", IMAGE_SHARD, "header"),  # ... than version.json's size table lists
    ("bomb the record declares", "metrics.jsonl", "ratio"),  # a forged record declares BOMB bytes
    ("bomb in a data file before version.json", IMAGE_SHARD, "ratio"),  # under the fixed data allowance
])
def test_bomb_is_stopped_before_it_is_written(archived, tmp_path, monkeypatch, label, member, stopped_by):
    """What the staging folder held when import gave up, measured as it is removed: none of the
    bomb when its header claims more than was declared, never more than 2 × the declared size,
    and in all never more than MAX_RATIO × the archive's compressed size + RATIO_SLACK."""
    from veritrain.core.errors import RunFailed
    from veritrain.records.workspace import Workspace

    _, run_dir, out = archived
    bad = ATTACKS[label][0](tmp_path, archived, run_dir.name)
    sizes: dict[str, int] = {}
    real_rmtree = shutil.rmtree

    def measured_rmtree(path, *args, **kwargs):
        sizes.update({p.relative_to(path).as_posix(): p.stat().st_size for p in Path(path).rglob("*") if p.is_file()})
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", measured_rmtree)
    with pytest.raises(RunFailed):
        archive_module.import_archive(bad, Workspace.open(tmp_path / "t"))
    assert sizes, "nothing was unpacked, or the staging folder was not removed"
    assert not (tmp_path / "t" / ".veritrain").exists() and not (tmp_path / "t" / "runs").exists()
    bomb = sum(size for name, size in sizes.items() if name.endswith("/" + member))
    with tarfile.open(out, "r:gz") as tar:
        declared = next(m.size for m in tar.getmembers() if m.name.endswith("/" + member)) if stopped_by == "header" else BOMB
    if stopped_by == "header":
        assert bomb == 0  # refused on the header's claim, before a byte was written
    assert bomb <= 2 * declared and bomb < BOMB // 2  # stopped well before the end of the bomb
    assert sum(sizes.values()) <= archive_module.MAX_RATIO * bad.stat().st_size + archive_module.RATIO_SLACK


def test_create_puts_the_record_first_and_version_json_first_of_its_data(archived):
    with tarfile.open(archived[2], "r:gz") as tar:
        names = tar.getnames()
    assert names[0].endswith("/record.json") and names[1].endswith("/record.sha256")
    data = [n for n in names if n.startswith(".veritrain/data/")]
    assert data[0].endswith("/version.json") and len(data) > 1


def test_archive_with_version_json_last_still_imports(cli, archived, tmp_path):
    """Archives made before version.json came first: their data version gets the fixed allowance."""
    bad = rebuilt(tmp_path, archived, version_json_last(keep))
    with tarfile.open(bad, "r:gz") as tar:
        assert tar.getnames()[-1].endswith("/version.json")
    result = cli("import", str(bad), "--workdir", str(tmp_path / "t"), "--json")
    assert result.code == 0, result.stderr
    assert result.json()["with_data"]


def test_record_not_first_is_refused(cli, archived, tmp_path):
    _, run_dir, _ = archived
    notes = f"runs/{run_dir.name}/notes.jsonl"
    bad = rebuilt(tmp_path, archived, keep, first=[(file_info(notes, 2), io.BytesIO(b"{}"))])
    result = cli("import", str(bad), "--workdir", str(tmp_path / "t"))
    assert result.code == 1, result.stderr
    assert result.stderr.strip() == f"error: import: refused {bad}: its first file is {notes!r}, not a run's record (runs/<run_id>/record.json) as `veritrain archive` writes it"


@pytest.mark.parametrize("change, message", [
    (lambda record: record.__setitem__("metrics", [1, 2]), "metrics: Input should be a valid dictionary (found a list)"),
    (lambda record: record.__setitem__("artifacts", [1]), "artifacts: Input should be a valid dictionary"),
    (lambda record: record["artifacts"].__setitem__("config.yaml", {"sha256": 5, "size": 1}), "artifacts.config.yaml.sha256: Input should be a valid string"),
    (lambda record: record.__setitem__("artifacts", None), "artifacts: null where the writer always puts a value"),
    (lambda record: record.__setitem__("seed", "1"), "seed: Input should be a valid integer"),
    (lambda record: record["artifacts"].__setitem__("../../outside", {"sha256": "0" * 64, "size": 1}), "must be a relative path inside the run folder"),
])
def test_a_record_of_the_right_run_but_the_wrong_shape_is_refused(cli, archived, tmp_path, change, message):
    forged = {}

    def forge(name: str, data: bytes):  # record.json comes first, then its seal, made to match as a forger would
        if name.endswith("/record.json"):
            record = json.loads(data)
            change(record)
            forged["record"] = json.dumps(record).encode()
            return name, forged["record"]
        if name.endswith("/record.sha256"):
            return name, (hashlib.sha256(forged["record"]).hexdigest() + "\n").encode()
        return name, data

    result = cli("import", str(rewritten(tmp_path, archived, forge)), "--workdir", str(tmp_path / "t"))
    assert result.code == 1, result.stderr
    assert result.stderr.startswith("error: import: ") and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "t" / "runs").exists()
