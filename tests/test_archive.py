"""Archive round trip, and crafted archives refused with nothing written outside the target."""

from __future__ import annotations

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
