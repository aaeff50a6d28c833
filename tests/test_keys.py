"""`veritrain keys init|show` (veritrain.core.signing_keys): an ECDSA P-256 pair outside the workspace, the private key
created with mode 0600 and never replaced, its fingerprint the SHA-256 of the public key's DER form."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess

import pytest

from conftest import veritrain


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("VERITRAIN_SIGNING_KEY", raising=False)
    return tmp_path / "config" / "veritrain"


def test_init_creates_a_private_key_only_its_owner_reads_and_show_gives_its_fingerprint(config_home, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    done = veritrain("keys", "init", "--json", cwd=tmp_path)
    assert done.code == 0, done.stderr
    created = done.json()
    private = config_home / "signing-key.pem"
    assert created["private_key_file"] == str(private) and created["created"] is True
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and stat.S_IMODE(config_home.stat().st_mode) == 0o700
    key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    shown = veritrain("keys", "show", "--json", cwd=tmp_path).json()
    assert shown["fingerprint"] == created["fingerprint"] == hashlib.sha256(der).hexdigest()
    assert shown["public_key"] == (config_home / "signing-key.pub.pem").read_text()
    assert "PRIVATE" not in done.stdout + shown["public_key"] and not list(tmp_path.glob("runs"))  # nothing in the workspace
    if subprocess.run(["openssl", "version"], capture_output=True).returncode == 0:  # the standard tool agrees
        der_by_openssl = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(config_home / "signing-key.pub.pem"), "-outform", "DER"],
                                        capture_output=True, check=True).stdout
        assert hashlib.sha256(der_by_openssl).hexdigest() == shown["fingerprint"]
    text = veritrain("keys", "show", cwd=tmp_path)
    assert text.code == 0 and text.stdout.startswith(f"fingerprint {shown['fingerprint']} ") and "BEGIN PUBLIC KEY" in text.stdout


def test_an_existing_key_is_never_replaced(config_home, tmp_path):
    assert veritrain("keys", "init", cwd=tmp_path).code == 0
    before = (config_home / "signing-key.pem").read_bytes()
    again = veritrain("keys", "init", cwd=tmp_path)
    assert again.code == 2 and again.stderr.startswith("error: ") and len(again.stderr.strip().splitlines()) == 1
    assert "a key is already there" in again.stderr and (config_home / "signing-key.pem").read_bytes() == before


def test_out_key_and_the_variable_name_other_places(config_home, tmp_path, monkeypatch):
    out = tmp_path / "elsewhere"
    made = veritrain("keys", "init", "--out", str(out), "--json", cwd=tmp_path).json()
    assert made["private_key_file"] == str(out / "signing-key.pem") and not config_home.exists()
    assert veritrain("keys", "show", "--key", str(out / "signing-key.pem"), "--json", cwd=tmp_path).json()["fingerprint"] == made["fingerprint"]
    monkeypatch.setenv("VERITRAIN_SIGNING_KEY", str(out / "signing-key.pem"))
    assert veritrain("keys", "show", "--json", cwd=tmp_path).json()["fingerprint"] == made["fingerprint"]


@pytest.mark.parametrize("content, mode, message", [
    (None, None, "no signing key here; create one with `veritrain keys init`"),
    (b"not a key", 0o600, "not an unencrypted PEM private key"),
    ("rsa", 0o600, "not an ECDSA P-256 key"),
    ("p256", 0o644, "the private key is readable by others (mode 0o644); chmod 600"),
])
def test_a_missing_unreadable_wrong_or_exposed_key_is_one_line_exit_2(config_home, tmp_path, content, mode, message):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    path = tmp_path / "key.pem"
    if content is not None:
        if content in ("rsa", "p256"):
            key = rsa.generate_private_key(65537, 2048) if content == "rsa" else ec.generate_private_key(ec.SECP256R1())
            content = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        path.write_bytes(content)
        os.chmod(path, mode)
    done = veritrain("keys", "show", "--key", str(path), cwd=tmp_path)
    assert done.code == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
