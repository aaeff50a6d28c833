"""The export's OpenSSF model signature (veritrain.results.export_signing): signed and checked in key mode, offline,
through the library and through its own command as a third party runs it, on small fake export folders."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from veritrain.core import signing_keys
from veritrain.core.errors import UserError
from veritrain.results import export_signing

COMMAND = Path(sys.executable).with_name("model_signing")  # the library's own command, in this environment
FILES = {"model.onnx": b"\x08\x07onnx" * 300, "model.safetensors": b"\x10\x00\x00\x00{}      " + bytes(range(256)) * 8,
         "model.json": b'{"architecture": "mlp", "classes": 10}\n', "parity.json": b'{"max_abs_diff": 0.0}\n',
         "README.md": b"# Model card\n\nA small model.\n"}


@pytest.fixture
def keys(tmp_path):
    """(private key, its public key, the public key of another pair), made by `veritrain keys init`'s code."""
    signing_keys.init(tmp_path / "keys" / "signing-key.pem")
    other = signing_keys.init(tmp_path / "keys" / "other-key.pem")
    return tmp_path / "keys" / "signing-key.pem", tmp_path / "keys" / "signing-key.pub.pem", other.path


@pytest.fixture
def folder(tmp_path, keys):
    export = tmp_path / "export"
    export.mkdir()
    for name, data in FILES.items():
        (export / name).write_bytes(data)
    export_signing.sign(export, keys[0])
    return export


def third_party(folder: Path, public: Path) -> tuple[int, str]:
    """The check anyone runs without veritrain: exit status and everything it printed."""
    command = export_signing.VERIFY_COMMAND.format(folder=folder, public_key=public).split()
    assert command[0] == "model_signing"
    done = subprocess.run([str(COMMAND), *command[1:]], capture_output=True, text=True, timeout=120, cwd=folder.parent)
    return done.returncode, done.stdout + done.stderr


def fails_both(folder: Path, public: Path, expected: str) -> None:
    problem = export_signing.verify(folder, public)
    assert problem is not None and expected in problem and "\n" not in problem and "Traceback" not in problem, problem
    code, shown = third_party(folder, public)
    # model-signing 1.1.1 exits 1 on every failure, `Verification failed with error: ...` on stderr
    assert code == 1 and export_signing.SUCCESS_LINE not in shown and "Verification failed" in shown, shown


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    return {p.relative_to(root).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_signed_folder_verifies_through_the_library_and_its_own_command(folder, keys):
    _, public, _ = keys
    assert export_signing.verify(folder, public) is None
    assert export_signing.verify(folder, public.read_bytes()) is None  # the PEM itself, as a record holds it
    code, shown = third_party(folder, public)
    assert code == 0 and shown.splitlines() == [export_signing.SUCCESS_LINE], shown
    assert export_signing.signed_files(folder) == {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}


def test_model_sig_is_a_sigstore_bundle_of_an_in_toto_statement_listing_each_file_without_the_private_key(folder, keys):
    from cryptography.hazmat.primitives import serialization

    private, public, _ = keys
    bundle = json.loads((folder / "model.sig").read_text())
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicate"]["serialization"] == {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                                       "ignore_paths": ["model.sig"]}
    assert sorted(r["name"] for r in statement["predicate"]["resources"]) == sorted(FILES)
    # the key hint is the SHA-256 of the public key's PEM (veritrain's fingerprint is that of its DER form)
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == hashlib.sha256(public.read_bytes()).hexdigest()
    key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    secret = key.private_numbers().private_value.to_bytes(32, "big")  # type: ignore[attr-defined]
    text = (folder / "model.sig").read_bytes()
    body = b"".join(private.read_bytes().splitlines()[1:-1])
    assert body not in text and secret not in text and base64.b64encode(secret) not in text and secret.hex().encode() not in text
    assert secret not in base64.b64decode(bundle["dsseEnvelope"]["payload"])


def test_signing_again_states_the_same_files_under_a_new_signature_and_never_lists_model_sig(folder, keys):
    before = (folder / "model.sig").read_bytes()
    export_signing.sign(folder, keys[0])  # the old model.sig is in the folder while it hashes: not signed
    after = (folder / "model.sig").read_bytes()
    assert before != after  # ECDSA draws a fresh nonce each time
    assert "model.sig" not in export_signing.signed_files(folder) and export_signing.verify(folder, keys[1]) is None


def test_nothing_is_written_outside_the_folder(tmp_path, keys):
    export = tmp_path / "export"
    export.mkdir()
    for name, data in FILES.items():
        (export / name).write_bytes(data)
    before = snapshot(tmp_path)
    export_signing.sign(export, keys[0])
    assert export_signing.verify(export, keys[1]) is None and export_signing.verify(export, keys[1].read_bytes()) is None
    assert export_signing.verify(export, keys[2]) is not None
    after = snapshot(tmp_path)
    assert set(after) - set(before) == {"export/model.sig"} and {k: after[k] for k in before} == before


@pytest.mark.parametrize("name", ["model.json", "README.md", "model.safetensors", "model.onnx", "parity.json"])
def test_one_changed_byte_in_any_file_fails(folder, keys, name):
    data = bytearray((folder / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / name).write_bytes(bytes(data))
    fails_both(folder, keys[1], f"the folder is not as signed: changed {name}")


@pytest.mark.parametrize("name", ["extra.onnx", ".hidden", ".gitignore", "sub/model.bin"])
def test_an_added_file_fails(folder, keys, name):
    # .gitignore too: the command's default would ignore it, VERIFY_COMMAND says --no-ignore-git-paths
    (folder / name).parent.mkdir(exist_ok=True)
    (folder / name).write_bytes(b"added")
    fails_both(folder, keys[1], f"the folder is not as signed: added {name}")


def test_a_removed_file_fails(folder, keys):
    (folder / "parity.json").unlink()
    fails_both(folder, keys[1], "the folder is not as signed: missing parity.json")


def test_another_key_fails(folder, keys):
    fails_both(folder, keys[2], "signed with another key")
    assert "signed with another key" in (export_signing.verify(folder, keys[2].read_bytes()) or "")


def test_a_signature_altered_to_match_the_files_or_stripped_of_its_key_hint_fails(folder, keys, capsys):
    bundle = json.loads((folder / "model.sig").read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "0" * 64
    (folder / "model.sig").write_text(json.dumps(dict(bundle, dsseEnvelope=dict(
        bundle["dsseEnvelope"], payload=base64.b64encode(json.dumps(statement).encode()).decode()))))
    fails_both(folder, keys[1], "the signature does not match the statement it signs")
    bundle["verificationMaterial"]["publicKey"] = {}  # an old-format bundle: the library prints a warning to stdout
    (folder / "model.sig").write_text(json.dumps(bundle))
    assert export_signing.verify(folder, keys[1]) is None
    assert "the signature does not match" in (export_signing.verify(folder, keys[2]) or "")
    assert capsys.readouterr().out == ""


def _altered(text: str) -> str:
    bundle = json.loads(text)
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(b'{"_type": "https://in-toto.io/Statement/v1"}').decode()
    return json.dumps(bundle)


@pytest.mark.parametrize("make", [lambda t: t[: len(t) // 2], lambda t: "garbage \x00", lambda t: "{}", lambda t: "[1, 2]",
                                  lambda t: '{"dsseEnvelope": {"payload": "not base64!"}}', _altered, lambda t: ""],
                         ids=["truncated", "garbage", "empty-object", "list", "bad-payload", "no-predicate", "empty"])
def test_a_malformed_signature_fails_with_one_line(folder, keys, make):
    (folder / "model.sig").write_text(make((folder / "model.sig").read_text()))
    fails_both(folder, keys[1], "model.sig: not a model signature bundle")
    with pytest.raises(ValueError, match="not a model signature bundle") as raised:
        export_signing.signed_files(folder)
    assert "\n" not in str(raised.value)


def test_no_signature_and_an_unusable_public_key_say_so(folder, keys):
    assert "not a usable EC public key" in (export_signing.verify(folder, keys[0]) or "")  # the private key file
    assert "not a usable EC public key" in (export_signing.verify(folder, b"not a key") or "")
    assert "not a usable EC public key" in (export_signing.verify(folder, folder / "absent.pem") or "")
    (folder / "model.sig").unlink()
    assert (export_signing.verify(folder, keys[1]) or "").endswith("model.sig: no signature here")


def test_a_file_the_signer_left_out_fails_here_though_the_command_accepts_it(folder, keys):
    import model_signing.hashing
    import model_signing.signing

    hashing = model_signing.hashing.Config().set_ignored_paths(paths=["model.sig", "model.onnx"], ignore_git_paths=False)
    model_signing.signing.Config().use_elliptic_key_signer(private_key=keys[0]).set_hashing_config(hashing).sign(
        folder, folder / "model.sig")
    assert export_signing.verify(folder, keys[1]) == f"{folder / 'model.sig'}: leaves model.onnx unsigned"
    assert third_party(folder, keys[1])[0] == 0  # the signature's own ignore list tells the command to skip it


def test_without_the_library_each_function_says_what_to_install(folder, keys, monkeypatch):
    for name in [m for m in sys.modules if m == "model_signing" or m.startswith("model_signing.")] or ["model_signing"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(UserError, match=r"pip install 'veritrain\[provenance\]'"):
        export_signing.sign(folder, keys[0])
    with pytest.raises(UserError, match="needs model-signing"):
        export_signing.verify(folder, keys[1])


def test_a_folder_named_relative_to_the_current_directory_signs_and_verifies(folder, keys, monkeypatch):
    monkeypatch.chdir(folder.parent)
    export_signing.sign(Path("export"), keys[0])  # model.sig is ignored by its name inside the folder, however it is named
    assert export_signing.verify(Path("export"), keys[1]) is None and export_signing.verify(folder, keys[1]) is None
    assert third_party(Path("export"), keys[1])[0] == 0


def test_the_model_card_gives_the_command_this_module_documents():
    from veritrain.results.model_card import VERIFY_SIGNATURE_COMMAND

    assert VERIFY_SIGNATURE_COMMAND == export_signing.VERIFY_COMMAND


def test_a_signed_export_of_a_run_verifies_and_a_changed_card_fails_verify(small_run_copy, tmp_path, monkeypatch, cli):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    key = signing_keys.init(signing_keys.default_key_path())
    workdir, run_dir = small_run_copy.workdir, small_run_copy.run_dir
    done = cli("export", run_dir.name, "--workdir", str(workdir))
    assert done.code == 0, done.stderr
    from veritrain.records.record import read_record

    amended = read_record(run_dir)
    export = amended.path("export/model.json").parent  # the export's amendment, signed with the key
    assert export == amended.amendments[-1].folder / "files" / "export"
    description = json.loads((export / "model.json").read_text())
    assert description["non_model_files"] == ["README.md", "model.sig"]
    code, shown = third_party(export, key.path)
    assert code == 0 and export_signing.SUCCESS_LINE in shown, shown
    subjects = [s["name"] for s in _subjects(amended.amendments[-1].folder)]
    assert "files/export/model.sig" not in subjects and "files/export/README.md" in subjects
    verified = cli("verify", run_dir.name, "--workdir", str(workdir), "--json")
    assert verified.code == 0 and not [n for n in verified.json()["not_checked"] if "signature" in n["check"]], verified.stdout
    (export / "README.md").write_text((export / "README.md").read_text() + "\nanother line\n")
    failed = cli("verify", run_dir.name, "--workdir", str(workdir), "--json")
    assert failed.code == 1 and {"changed", "export_signature"} <= {p["kind"] for p in failed.json()["problems"]}


def _subjects(run_dir: Path) -> list[dict]:
    return json.loads(base64.b64decode(json.loads((run_dir / "provenance.intoto.jsonl").read_text())["payload"]))["subject"]
