"""Secret canaries never reach a run's files, the registry or experiments.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from veritrain import secrets
from veritrain.data.cifar10 import write_fake_cifar10
from veritrain.secrets import redact, redact_text

# canary-dir is a folder named only through ${env:VT_DATA_DIR}: the record keeps the reference
CANARIES = ("canary-env-4411", "canary-ref-5522", "canary-pass-6633", "canary-hyp-7744", "canary-key-8855", "canary-dir-9966")

# Fake secrets of real shapes (lengths and alphabets as the services issue them), each with a piece to grep for.
HF = "hf_CanaryHf7766" + "a" * 22  # hf_ + 34
GHP = "ghp_CanaryGhp7788" + "b" * 23  # ghp_ + 36
GHO = "gho_CanaryGho7790" + "c" * 23
PAT = "github_pat_11CanaryPat7799_" + "d" * 59  # github_pat_ + 82
SK = "sk-proj-CanarySk7800" + "e" * 40
AKIA = "AKIACANARY7722QWERTY"  # AWS access key id: exactly 20
BEARER = "CanaryBearer7744.abcdef-ghijkl"
BASIC = "Q2FuYXJ5QmFzaWM3NzU1OnB3"  # base64 of a user:password
URL_PASSWORD = "slash-7711/x@at-7712"  # a URL password with `/` and `@`, unescaped
S3_SECRET = "s3sec-7733/y@z:w"
SHAPED = ("CanaryHf7766", "CanaryGhp7788", "CanaryGho7790", "CanaryPat7799", "CanarySk7800", "CANARY7722QWERTY",
          "CanaryBearer7744", "Q2FuYXJ5QmFzaWM3NzU1", "slash-7711", "at-7712", "s3sec-7733")
EVERY_SHAPE = (f"pushed via https://ci:{URL_PASSWORD}@github.com/org/repo.git and s3://{AKIA}:{S3_SECRET}@bucket/raw, "
               f"curl -H 'Authorization: Bearer {BEARER}' -H \"Authorization: Basic {BASIC}\", tokens {HF} {GHP} {GHO} {PAT} {SK}")


def test_redaction_rules():
    assert redact_text("see https://ann:hunter2@example.org/x") == "see https://ann:***@example.org/x"
    assert redact_text("--set model.kwargs.api_key=abc123") == "--set model.kwargs.api_key=***"
    assert redact({"api_token": "abc", "keep_last": 2, "ref": "${env:X}", "password": "${env:PW}"}) == {
        "api_token": "***", "keep_last": 2, "ref": "${env:X}", "password": "${env:PW}"}
    assert redact_text("valid keys in optim: name, lr") == "valid keys in optim: name, lr"


@pytest.mark.parametrize("text, expected", [
    # the userinfo runs to the last `@`: a password may hold `/`, `@` and `:` unescaped
    ("https://user:p@ss/w0rd@host/path", "https://user:***@host/path"),
    (f"s3://{AKIA}:secret/x@bucket/key", "s3://***:***@bucket/key"),
    ("postgresql://app:p@ss:w/rd@db:5432/x?sslmode=require", "postgresql://app:***@db:5432/x?sslmode=require"),
    ("redis://:only-password@cache:6379", "redis://:***@cache:6379"),
    ("clone https://me@example.org:pw@git.example.org/r.git, then", "clone https://me@example.org:***@git.example.org/r.git, then"),
    ("https://web.archive.org/web/2020/https://u:pw@h/x", "https://web.archive.org/web/2020/https://u:***@h/x"),  # a user with `/` is a path
    ("mirrors=https://example.org/p,https://u:pw@h", "mirrors=https://example.org/p,https://u:***@h"),
    # Authorization headers and bearer tokens
    ("curl -H 'Authorization: Bearer abc.def' https://x", "curl -H 'Authorization: Bearer ***' https://x"),
    ("{'Authorization': 'Basic dXNlcjpwYXNz', 'Accept': '*/*'}", "{'Authorization': 'Basic ***', 'Accept': '*/*'}"),
    ('{"Proxy-Authorization": "token abc"}', '{"Proxy-Authorization": "token ***"}'),
    ("authorization=abc123&x=1", "authorization=***"),
    (f"sent bearer {BEARER} to the api", "sent bearer *** to the api"),
    # token shapes, anywhere in the text
    (f"HF_TOKEN={HF} HF_HOME=/cache", "HF_TOKEN=*** HF_HOME=/cache"),
    (f"use {GHP}, {GHO} or {PAT}", "use ***, *** or ***"),
    (f"git push https://{GHP}@github.com/o/r", "git push https://***@github.com/o/r"),
    (f"openai {SK}; anthropic sk-ant-api03-{'x1' * 20}", "openai ***; anthropic ***"),
    (f"aws {AKIA} and ASIAY34FZKBOKMUTVV7A.", "aws *** and ***."),
    ("slack xoxb-123456789012-abcdefghij, gitlab glpat-abcdefghij0123456789", "slack ***, gitlab ***"),
    (f"google AIza{'B1' * 17}x stripe sk_live_{'4eC39HqLyjWDarjtT1zdp7dc'}", "google *** stripe ***"),
    (f"npm_{'a1' * 18} pypi-AgEIcHlwaS5vcmc{'Q' * 60}", "*** ***"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U ok", "jwt *** ok"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----\nafter", "***\nafter"),
])
def test_secret_shapes_in_free_text_are_redacted(text, expected):
    assert redact_text(text) == expected


@pytest.mark.parametrize("text", [
    "https://medium.com/@ann/post and ssh://git@github.com/org/repo",  # an `@` with no password before it
    "Bearer bonds are instruments; the bearer of this letter",  # the word, not a credential
    "Authorization failed for user ann",
    "risk-free hf_home sk-learn-compatible-estimator-wrapper task-sk-1234567890abcdefghij ASIAN AKIA sk-8",
    "the ghp_ prefix and hf_ prefix name tokens; AKIAIOSFODNN7EXAMPLEX is 21 characters",
    "epoch 3/10 train_loss=0.4123 val_loss=0.5012 val_acc=0.8734 lr=0.001000",
])
def test_ordinary_text_is_kept(text):
    assert redact_text(text) == text


def test_ordinary_log_lines_skip_the_slow_patterns(monkeypatch):
    class Untouchable:
        def sub(self, *args):
            raise AssertionError("an ordinary line reached a slow pattern")

        search = sub

    for name in ("URL_TOKEN", "AUTH_HEADER", "BEARER", "TOKEN", "PRIVATE_KEY", "ASSIGNMENT", "SECRET_KEY"):
        monkeypatch.setattr(secrets, name, Untouchable())
    for line in ["epoch 3/10 train_loss=0.4123 val_loss=0.5012 val_acc=0.8734 lr=0.001000 time=12.3s",
                 "step 1200/5000 loss 0.4123 grad_norm 1.23 throughput 5123.4 samples/s",
                 "prepared data version 3f2a9c1d: 1797 samples, 10 classes (train 1257, val 270, test 270)",
                 "saved runs/20240101-120000-123-abcdef/checkpoints/step_000100.pt"]:
        assert redact_text(line) == line


def test_every_token_prefix_and_header_word_takes_the_slow_path():
    for text in [HF, GHP, GHO, PAT, SK, AKIA, "xoxb-123456789012-abcdef", f"AIza{'B' * 35}", "glpat-abcdefghij0123456789",
                 f"npm_{'a1' * 18}", f"pypi-{'Q' * 60}", f"rk_live_{'a' * 24}", "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0.",
                 f"Bearer {BEARER}", "AUTHORIZATION: x", "https://u:p@h", "-----BEGIN PRIVATE KEY-----\nabc"]:
        assert secrets.SECRET_HINT.search(text.lower()), text
        assert redact_text(text) != text, text


def test_canaries_appear_nowhere(tmp_path):
    data_dir = tmp_path.parent / f"{tmp_path.name}-{CANARIES[5]}"  # outside the workspace, which is searched whole
    write_fake_cifar10(data_dir, per_batch=20)
    env = {**os.environ, "VT_CANARY_TOKEN": CANARIES[0], "VT_CONTACT": CANARIES[1], "VT_EXPECTED_KEY": CANARIES[4], "VT_DATA_DIR": str(data_dir),
           "PYTHONWARNINGS": "ignore"}
    args = [
        sys.executable, "-m", "veritrain", "run", "--workdir", str(tmp_path),
        "--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "export.formats=[safetensors]",
        "--set", "data.source=cifar10", "--set", "data.root=${env:VT_DATA_DIR}",
        "--set", "data.card.contact=${env:VT_CONTACT}",
        "--set", f"data.card.origin=https://data:{CANARIES[2]}/{URL_PASSWORD}@example.org/digits",
        "--set", f"data.card.collection='copied from s3://{AKIA}:{S3_SECRET}@bucket/raw with {HF}'",
        "--set", f"data.card.limitations='fetched with Authorization: Bearer {BEARER} and {GHP}'",
        "--set", f"data.card.license='{PAT}, {SK}, {GHO}; Authorization: Basic {BASIC}'",
        "--set", "model.target=secret_model:checking_factory",
        "--set", f"model.kwargs={{hidden: 4, api_key_unused: {CANARIES[4]}, token: '${{env:VT_CANARY_TOKEN}}'}}",
        "--hypothesis", f"token={CANARIES[3]} makes no difference; {EVERY_SHAPE}",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, env={**env, "PYTHONPATH": str(Path(__file__).parent)})
    assert proc.returncode == 0, proc.stderr  # the factory saw the real values (it checks them)
    outputs = [proc.stdout, proc.stderr]
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "record.json").read_text())
    assert record["config"]["data"]["card"]["contact"] == "${env:VT_CONTACT}"  # the reference is recorded
    assert record["config"]["model"]["kwargs"]["token"] == "${env:VT_CANARY_TOKEN}"
    assert "VT_CANARY_TOKEN" not in json.dumps(record["env"])
    assert record["config_source"]["data_root_resolved"] == "${env:VT_DATA_DIR}"
    assert record["config"]["data"]["card"]["origin"] == "https://data:***@example.org/digits"  # still says where
    assert record["hypothesis"].startswith("token=*** makes no difference; pushed via https://ci:***@github.com/org/repo.git")

    def veritrain(*command: str) -> None:
        done = subprocess.run([sys.executable, "-m", "veritrain", *command, "--workdir", str(tmp_path)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        outputs.extend([done.stdout, done.stderr])

    veritrain("runs", "note", "latest", f"conclusion: no leak; {EVERY_SHAPE}", "--conclusion")
    veritrain("runs", "list")
    veritrain("runs", "show", "latest")
    veritrain("data", "report", record["data"]["version"])
    veritrain("archive", "latest", "-o", str(tmp_path / "run.tar.gz"), "--with-data")
    with tarfile.open(tmp_path / "run.tar.gz") as tar:
        archived = {member.name: tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}
    assert "runs/" + run_dir.name + "/notes.jsonl" in archived

    checked = {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != "run.tar.gz"}  # run, registry, data, experiments.md
    checked |= {f"run.tar.gz:{name}": data for name, data in archived.items()}
    checked |= {f"output {i}": text.encode() for i, text in enumerate(outputs)}
    assert any(p.endswith("experiments.md") for p in checked) and any(p.endswith("card.json") for p in checked)
    for where, data in checked.items():
        for canary in CANARIES + SHAPED:
            assert canary.encode() not in data, f"{canary} in {where}"
