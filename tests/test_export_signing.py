"""An export signed with OpenSSF model signing (key mode): `model_signing verify key` passes with the public key, and a
changed, added or removed file, another key or a damaged signature fails it, by exit status and by its output."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from veritrain.core import signing_keys
from veritrain.results import export_signing

MODEL_SIGNING = Path(sys.executable).parent / "model_signing"


@pytest.fixture
def folder(tmp_path) -> Path:
    out = tmp_path / "export"
    out.mkdir()
    (out / "model.json").write_text('{"format_version": 1}\n')
    (out / "README.md").write_text("---\nlicense: mit\n---\n# a model\n")
    (out / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (out / "parity.json").write_text("{}\n")
    return out


@pytest.fixture
def key(tmp_path) -> signing_keys.PublicKey:
    return signing_keys.init(tmp_path / "keys" / "signing-key.pem")


def cli_verify(folder: Path, public: Path) -> tuple[int, str]:
    command = export_signing.VERIFY_COMMAND.format(folder=folder, public_key=public).split()
    done = subprocess.run([str(MODEL_SIGNING), *command[1:]], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def test_a_signed_folder_verifies_with_the_library_and_its_command(folder, key, tmp_path):
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    signature = export_signing.sign(folder, key.path.with_name("signing-key.pem"))
    assert signature == folder / "model.sig"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == sorted(before + ["export/model.sig"])
    assert export_signing.verify(folder, key.path) is None
    code, shown = cli_verify(folder, key.path)
    assert code == 0 and export_signing.SUCCESS_LINE in shown, shown
    assert export_signing.signed_files(folder) == {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                                                   for p in folder.iterdir() if p.name != "model.sig"}
    private = key.path.with_name("signing-key.pem").read_bytes()
    assert b"".join(private.splitlines()[1:-1])[:40] not in signature.read_bytes()


@pytest.mark.parametrize("change", ["model.json", "README.md", "model.safetensors", "added", "removed", "other key", "garbage",
                                    "json not a bundle", "truncated"])
def test_every_change_fails_both_checks(folder, key, tmp_path, change):
    export_signing.sign(folder, key.path.with_name("signing-key.pem"))
    public = key.path
    if change in ("model.json", "README.md", "model.safetensors"):
        data = bytearray((folder / change).read_bytes())
        data[len(data) // 2] ^= 1
        (folder / change).write_bytes(bytes(data))
    elif change == "added":
        (folder / "extra.bin").write_bytes(b"x")
    elif change == "removed":
        (folder / "parity.json").unlink()
    elif change == "other key":
        public = signing_keys.init(tmp_path / "other" / "signing-key.pem").path
    elif change == "garbage":
        (folder / "model.sig").write_bytes(b"\x00\xffnot json")
    elif change == "json not a bundle":
        (folder / "model.sig").write_text(json.dumps({"mediaType": "x", "dsseEnvelope": {"payload": "!!"}}))
    else:
        (folder / "model.sig").write_bytes((folder / "model.sig").read_bytes()[:100])
    problem = export_signing.verify(folder, public)
    assert problem is not None and "\n" not in problem and "Traceback" not in problem and problem.startswith(str(folder / "model.sig"))
    code, shown = cli_verify(folder, public)
    assert code != 0 and export_signing.SUCCESS_LINE not in shown, shown


def test_a_signed_export_of_a_run_verifies_and_a_changed_card_fails_verify(small_run_copy, tmp_path, monkeypatch, cli):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    key = signing_keys.init(signing_keys.default_key_path())
    workdir, run_dir = small_run_copy.workdir, small_run_copy.run_dir
    done = cli("export", run_dir.name, "--workdir", str(workdir))
    assert done.code == 0, done.stderr
    export = run_dir / "export"
    description = json.loads((export / "model.json").read_text())
    assert description["non_model_files"] == ["README.md", "model.sig"]
    code, shown = cli_verify(export, key.path)
    assert code == 0 and export_signing.SUCCESS_LINE in shown, shown
    assert "model.sig" not in [s["name"] for s in _subjects(run_dir)] and "export/README.md" in [s["name"] for s in _subjects(run_dir)]
    verified = cli("verify", run_dir.name, "--workdir", str(workdir), "--json")
    assert verified.code == 0 and not [n for n in verified.json()["not_checked"] if "signature" in n["check"]], verified.stdout
    (export / "README.md").write_text((export / "README.md").read_text() + "\nanother line\n")
    failed = cli("verify", run_dir.name, "--workdir", str(workdir), "--json")
    assert failed.code == 1 and {"changed", "export_signature"} <= {p["kind"] for p in failed.json()["problems"]}


def _subjects(run_dir: Path) -> list[dict]:
    import base64

    return json.loads(base64.b64decode(json.loads((run_dir / "provenance.intoto.jsonl").read_text())["payload"]))["subject"]
