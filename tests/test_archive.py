"""Archive round trip, and crafted archives refused with nothing written outside the target."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from conftest import in_process_run

FAST = ["train.epochs=1", "model.name=mlp", "model.hidden=[16]", "export.formats=[onnx]"]


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("src")
    outcome = in_process_run(workdir, FAST)
    out = tmp_path_factory.mktemp("out") / "run.tar.gz"
    from veritrain import archive

    archive.create(Path(outcome.summary["run_dir"]), workdir / ".veritrain", out, with_data=True)
    return workdir, Path(outcome.summary["run_dir"]), out


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
    ("array changed", lambda name, data: (name, data + b"x" if name.endswith(".npy") else data)),
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
    ("a list", b"[1, 2]", "no valid artifact table"),
    ("artifacts a list", b'{"artifacts": [1]}', "no valid artifact table"),
    ("entry without a hash", b'{"artifacts": {"config.yaml": {"sha256": 5, "size": 1}}}', "no valid artifact table"),
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


@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_truncated_archive_is_one_line_and_leaves_nothing(cli, archived, tmp_path, keep):
    _, _, out = archived
    data = out.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: int(len(data) * keep)])  # a copy that stopped part-way
    target = tmp_path / "t"
    result = cli("import", str(cut), "--workdir", str(target))
    assert result.code == 1, result.stderr
    assert result.stderr.startswith("error: import: ") and "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (target / "runs").exists()
    assert not list((target / ".veritrain").glob("import-*")) if (target / ".veritrain").exists() else True


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
    from veritrain import archive

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
