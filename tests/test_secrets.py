"""Secret canaries never reach a run's files, the registry or experiments.md: a run records its config and
command line as given, so a literal secret is refused before anything runs, and one given as `${env:NAME}` is
used but recorded as the reference. Logs and error lines redact secrets by their shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import FAST_OVERRIDES, in_process_run, veritrain as cli_run
from veritrain.core import secrets
from veritrain.core.config import config_dict, config_from_record, load_config
from veritrain.data.cifar10 import write_fake_cifar10
from veritrain.core.errors import ConfigError, UserError
from veritrain.core.secrets import find_secret, redact_text

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
    assert redact_text("valid keys in optim: name, lr") == "valid keys in optim: name, lr"
    # by the shape of the value only: a key name says nothing (max_tokens=512 is a number, api_key=abc123 no token)
    for line in ["model.kwargs.max_tokens=512 key_dim=8 pad_token=0 token_count=12", "--set model.kwargs.api_key=abc123",
                 "keep_last=2 secret_sauce: on"]:
        assert redact_text(line) == line


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

    for name in ("URL_TOKEN", "AUTH_HEADER", "BEARER", "TOKEN", "PRIVATE_KEY"):
        monkeypatch.setattr(secrets, name, Untouchable())
    for line in ["epoch 3/10 train_loss=0.4123 val_loss=0.5012 val_acc=0.8734 lr=0.001000 time=12.3s",
                 "step 1200/5000 loss 0.4123 grad_norm 1.23 throughput 5123.4 samples/s",
                 "prepared data version 3f2a9c1d: 1797 samples, 10 classes (train 1257, val 270, test 270)",
                 "saved runs/20240101-120000-123-abcdef/checkpoints/step_000100.pt",
                 "model.kwargs: max_tokens=512 key_dim=8 api_key=${env:MY_KEY} secret_sauce=3"]:
        assert redact_text(line) == line
        assert find_secret(line) is None


def test_every_token_prefix_and_header_word_takes_the_slow_path():
    for text in [HF, GHP, GHO, PAT, SK, AKIA, "xoxb-123456789012-abcdef", f"AIza{'B' * 35}", "glpat-abcdefghij0123456789",
                 f"npm_{'a1' * 18}", f"pypi-{'Q' * 60}", f"rk_live_{'a' * 24}", "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0.",
                 f"Bearer {BEARER}", "AUTHORIZATION: x", "https://u:p@h", "-----BEGIN PRIVATE KEY-----\nabc"]:
        assert secrets.SECRET_HINT.search(text.lower()), text
        assert redact_text(text) != text, text
        assert find_secret(text) is not None, text


def test_canaries_appear_nowhere(tmp_path, monkeypatch):
    data_dir = tmp_path.parent / f"{tmp_path.name}-{CANARIES[5]}"  # outside the workspace, which is searched whole
    write_fake_cifar10(data_dir, per_batch=20)
    env = {**os.environ, "VT_CANARY_TOKEN": CANARIES[0], "VT_CONTACT": CANARIES[1], "VT_PASSWORD": CANARIES[2],
           "VT_EXPECTED_KEY": CANARIES[4], "VT_DATA_DIR": str(data_dir), "PYTHONWARNINGS": "ignore"}
    start = [sys.executable, "-m", "veritrain", "run", "--workdir", str(tmp_path),
             "--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "export.formats=[safetensors]"]
    outputs = []

    # each literal secret is refused before anything runs: one line naming where it is and the fix, no run folder
    for where, given in [
        ("--set: data.card.origin:", ["--set", f"data.card.origin=https://data:{CANARIES[2]}/{URL_PASSWORD}@example.org/digits"]),
        ("--set: data.card.collection:", ["--set", f"data.card.collection='copied from s3://{AKIA}:{S3_SECRET}@bucket/raw with {HF}'"]),
        ("--set: data.card.limitations:", ["--set", f"data.card.limitations='fetched with Authorization: Bearer {BEARER} and {GHP}'"]),
        ("--set: data.card.license:", ["--set", f"data.card.license='{PAT}, {SK}, {GHO}; Authorization: Basic {BASIC}'"]),
        ("--set: model.kwargs.api_key:", ["--set", f"model.kwargs={{hidden: 4, api_key: {CANARIES[4]}}}"]),
        ("--hypothesis (a URL password", ["--hypothesis", f"{CANARIES[3]} makes no difference; {EVERY_SHAPE}"]),
    ]:
        with monkeypatch.context() as patched:  # refused before anything runs: in this process, with the same environment
            for name, value in env.items():
                patched.setenv(name, value)
            refused = cli_run(*start[3:], *given)
        assert refused.code == 2, refused.stderr
        (line,) = refused.stderr.splitlines()
        assert line.startswith(f"error: {where}") and "${env:NAME}" in line, line
        outputs.extend([refused.stdout, refused.stderr])
    assert not (tmp_path / "runs").exists()

    # given through the environment, the same secrets are used and recorded as their references
    args = start + [
        "--set", "data.source=cifar10", "--set", "data.root=${env:VT_DATA_DIR}",
        "--set", "data.card.contact=${env:VT_CONTACT}",
        "--set", "data.card.origin=https://data:${env:VT_PASSWORD}@example.org/digits",
        "--set", "model.target=secret_model:checking_factory",
        "--set", "model.kwargs={hidden: 4, api_key: '${env:VT_EXPECTED_KEY}', token: '${env:VT_CANARY_TOKEN}'}",
        "--hypothesis", "token=plain makes no difference",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, env={**env, "PYTHONPATH": str(Path(__file__).parent)})
    assert proc.returncode == 0, proc.stderr  # the factory saw the real values (it checks them)
    outputs.extend([proc.stdout, proc.stderr])
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "record.json").read_text())
    assert record["config_recorded"] == "as_given"
    assert record["config"]["data"]["card"]["contact"] == "${env:VT_CONTACT}"  # the reference is recorded
    assert record["config"]["data"]["card"]["origin"] == "https://data:${env:VT_PASSWORD}@example.org/digits"
    assert record["config"]["model"]["kwargs"] == {"hidden": 4, "api_key": "${env:VT_EXPECTED_KEY}", "token": "${env:VT_CANARY_TOKEN}"}
    assert "VT_CANARY_TOKEN" not in json.dumps(record["env"])
    assert record["config_source"]["data_root_resolved"] == "${env:VT_DATA_DIR}"
    assert record["hypothesis"] == "token=plain makes no difference"  # as given: no key-name rule
    assert record["argv"] == ["veritrain", *args[3:]]

    def veritrain(*command: str, code: int = 0) -> None:  # commands that import no code of the run: in this process
        with monkeypatch.context() as patched:
            for name, value in env.items():
                patched.setenv(name, value)
            done = cli_run(*command, "--workdir", str(tmp_path))
        assert done.code == code, done.stderr
        outputs.extend([done.stdout, done.stderr])

    veritrain("runs", "note", "latest", f"conclusion: no leak; {EVERY_SHAPE}", "--conclusion", code=2)  # refused, not rewritten
    assert outputs[-1].startswith("error: TEXT holds a URL password") and len(outputs[-1].splitlines()) == 1
    veritrain("runs", "note", "latest", "conclusion: no leak", "--conclusion")
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


# ---------------------------------------------------------------- configs recorded as given

KWARGS = ["model.target=kwargs_model:make", "model.kwargs={hidden: 8, max_tokens: 512, key_dim: 8}"]


def test_keys_that_only_contain_secret_letters_are_values_hashed_and_built_as_given():
    small = load_config(None, KWARGS)
    large = load_config(None, [*KWARGS, "model.kwargs.max_tokens=4096"])
    assert small.hash != large.hash  # "***" for both once hid the difference
    assert config_dict(small.config)["model"]["kwargs"] == {"hidden": 8, "max_tokens": 512, "key_dim": 8}
    assert config_dict(large.config)["model"]["kwargs"]["max_tokens"] == 4096
    for key in ("pad_token", "token_count", "secret_sauce"):
        assert load_config(None, [f"model.kwargs.{key}=3"]).config.model.kwargs == {key: 3}

    from veritrain import models

    model = models.from_target("kwargs_model:make", [1, 8, 8], 10, large.config.model.kwargs)  # kwargs_model asserts ints
    assert model[1].out_features == 8


@pytest.mark.parametrize("written, override, key", [
    (None, 'model.kwargs.auth="Bearer abcdefghijklmnopqrstuvwxyz012345"', "model.kwargs.auth"),
    (None, "model.kwargs.hub=hf_" + "A1b2C3d4E5" * 3 + "f6G7", "model.kwargs.hub"),
    (None, "data.root=https://ann:hunter2@example.org/data", "data.root"),
    (None, "model.kwargs={headers: ['Accept: */*', 'Authorization: token abc123']}", "model.kwargs.headers.1"),
    (None, "model.kwargs={keys: ['-----BEGIN PRIVATE KEY-----\nMIIE']}", "model.kwargs.keys.0"),
    ("model:\n  kwargs:\n    api_key: abc\n", None, "model.kwargs.api_key"),
    ("model:\n  kwargs:\n    Password: hunter2\n", None, "model.kwargs.Password"),
    ("model:\n  kwargs:\n    db_password: 1234\n", None, "model.kwargs.db_password"),
    ("model:\n  kwargs:\n    client: {access_token: abc, name: x}\n", None, "model.kwargs.client.access_token"),
    ("data:\n  root: s3://AKIAIOSFODNN7EXAMPL:wJalrXUtnFEMI@bucket/raw\n", None, "data.root"),
])
def test_a_literal_secret_in_a_config_is_refused_naming_the_key_and_the_fix(tmp_path, written, override, key):
    path = None
    if written is not None:
        path = tmp_path / "secret.yaml"
        path.write_text(written, encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(path, [override] if override else [])
    message = str(refused.value)
    assert message.startswith(f"{'--set' if override else path}: {key}: holds ") and "${env:NAME}" in message, message
    assert len(message.splitlines()) == 1
    for secret in ("abcdefghijklmnop", "A1b2C3", "hunter2", "abc123", "MIIE", "1234", "wJalr"):
        assert secret not in message  # the message says where, never what


def test_a_refused_secret_is_one_line_and_exit_2_on_the_command_line(tmp_path):
    result = cli_run("run", "--set", "model.kwargs.auth=Bearer abcdefghijklmnopqrstuvwxyz012345", "--workdir", str(tmp_path))
    assert result.code == 2
    assert result.stderr.splitlines() == ["error: --set: model.kwargs.auth: holds a bearer token, and a run records its config as written; "
                                          "write the secret as ${env:NAME} and export NAME before running"]
    result = cli_run("run", "--hypothesis", "uses hf_" + "x1" * 17, "--dry-run", "--workdir", str(tmp_path))
    assert result.code == 2 and result.stderr.splitlines() == [
        "error: --hypothesis (a token of a known shape): a run records its command line as given; leave the secret out "
        "(a config value can be ${env:NAME}, read when it is used)"]
    assert not (tmp_path / "runs").exists()


def test_references_are_accepted_and_kept(tmp_path):
    path = tmp_path / "ref.yaml"
    path.write_text("model:\n  kwargs:\n    api_key: ${env:MY_KEY}\n    secret: ''\n    auth: 'Bearer ${env:MY_TOKEN}'\n"
                    "data:\n  card:\n    origin: https://ann:${env:MY_PASSWORD}@example.org/data\n", encoding="utf-8")
    resolved = load_config(path)
    recorded = config_dict(resolved.config)
    assert recorded["model"]["kwargs"] == {"api_key": "${env:MY_KEY}", "secret": "", "auth": "Bearer ${env:MY_TOKEN}"}
    assert recorded["data"]["card"]["origin"] == "https://ann:${env:MY_PASSWORD}@example.org/data"


def test_a_run_records_its_overrides_and_kwargs_as_given(tmp_path):
    overrides = [*FAST_OVERRIDES, "train.threads=1", *KWARGS, "model.kwargs.max_tokens=4096"]
    outcome = in_process_run(tmp_path, overrides)
    assert outcome.error is None, outcome.error
    record = outcome.record
    assert record["config_recorded"] == "as_given"
    assert record["argv"] == ["veritrain", "run", *overrides]
    assert record["config_source"]["overrides"] == overrides
    assert record["config"]["model"]["kwargs"] == {"hidden": 8, "max_tokens": 4096, "key_dim": 8}
    assert config_from_record(record).model.kwargs["max_tokens"] == 4096
    model_json = json.loads((Path(outcome.summary["run_dir"]) / "export" / "model.json").read_text())
    assert model_json["architecture"]["kwargs"] == {"hidden": 8, "max_tokens": 4096, "key_dim": 8}


def test_a_record_whose_config_lost_values_cannot_be_rebuilt():
    config = config_dict(load_config(None, KWARGS).config)
    config["model"]["kwargs"].update(max_tokens="***", key_dim="***")
    with pytest.raises(UserError) as refused:
        config_from_record({"run_id": "20261201-094118-928-779001", "config": config})
    assert str(refused.value).startswith('run 20261201-094118-928-779001: model.kwargs.key_dim, model.kwargs.max_tokens: recorded as "***"')
    # a value given as "***" in a record of this veritrain is a value like any other
    assert config_from_record({"config": config, "config_recorded": "as_given"}).model.kwargs["max_tokens"] == "***"
    # and an old record without "***" rebuilds as it always did
    assert config_from_record({"config": config_dict(load_config(None).config)}).model.name == "cnn"
