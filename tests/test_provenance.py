"""Every sealed run states its provenance (provenance.intoto.jsonl: DSSE, in-toto Statement v1, SLSA Provenance v1):
signed with the signing key or unsigned, written again at every re-seal, checked by verify, and checkable with the
standard tools docs/provenance.md gives (here with the packages of this environment; tests/test_standard_tools.py
runs them in a venv without veritrain)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import FAST_OVERRIDES, in_process_run

ROOT = Path(__file__).resolve().parents[1]
FILE = "provenance.intoto.jsonl"


def doc_script(tmp_path: Path) -> Path:
    """The 15-line check of docs/provenance.md, exactly as printed there."""
    text = (ROOT / "docs" / "provenance.md").read_text(encoding="utf-8")
    code = text.split("<!-- provenance-script -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 15
    path = tmp_path / "check_provenance.py"
    path.write_text(code, encoding="utf-8")
    return path


def standard_check(run_dir: Path, public_key: Path, script: Path) -> tuple[int, str]:
    """The doc's commands: the script (signature), then `sha256sum -c` over what it prints; (exit status, output)."""
    listed = subprocess.run([sys.executable, str(script), FILE, str(public_key)], cwd=run_dir, capture_output=True, text=True)
    if listed.returncode != 0:
        return listed.returncode, listed.stderr
    checked = subprocess.run(["sha256sum", "-c", "-"], cwd=run_dir, input=listed.stdout, capture_output=True, text=True)
    return checked.returncode, checked.stdout + checked.stderr


def envelope(run_dir: Path) -> dict:
    return json.loads((run_dir / FILE).read_text())


def statement(run_dir: Path) -> dict:
    return json.loads(base64.b64decode(envelope(run_dir)["payload"]))


@pytest.fixture
def key(tmp_path, monkeypatch):
    """A signing key of this test's own, where veritrain looks by default."""
    from veritrain.core import signing_keys

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = signing_keys.default_key_path()
    signing_keys.init(path)
    return path


def reseal(run_dir: Path, workdir: Path) -> str:
    """Seal the run again with the key that is set now, as the run's end seals it (its statement is written again)."""
    from veritrain.records.record import read_record, thawed, write_record

    return write_record(run_dir, thawed(read_record(run_dir)))


def verified(run_dir: Path, workdir: Path, public_key: bytes | None = None) -> dict:
    from veritrain.trust.policy import Policy
    from veritrain.trust.verify import verify_run

    return verify_run(run_dir, workdir / ".veritrain", Policy(public_key=public_key), rehash_data=False, check_states=False)


def kinds(result: dict) -> list[str]:
    return [p["kind"] for p in result["problems"]]


def test_an_unsigned_run_states_what_it_made_from_what(small_run_copy, cli):
    run_dir, record = small_run_copy.run_dir, json.loads((small_run_copy.run_dir / "record.json").read_text())
    assert record["provenance"] == {"file": FILE, "key_fingerprint": None}
    assert FILE not in record["artifacts"] and envelope(run_dir)["signatures"] == []
    stated = statement(run_dir)
    assert stated["_type"] == "https://in-toto.io/Statement/v1" and stated["predicateType"] == "https://slsa.dev/provenance/v1"
    final = f"checkpoints/step-{record['trajectory'][-1]['step']}.pt"
    names = [s["name"] for s in stated["subject"]]
    assert names == sorted(n for n in record["artifacts"] if n.startswith("export/")) + [final]
    for subject in stated["subject"]:
        assert subject["digest"]["sha256"] == hashlib.sha256((run_dir / subject["name"]).read_bytes()).hexdigest()
    build, details = stated["predicate"]["buildDefinition"], stated["predicate"]["runDetails"]
    assert build["externalParameters"]["config"] == record["config"] and build["externalParameters"]["command"] == record["argv"]
    version = record["data"]["version"]
    dependencies = {d["name"]: d for d in build["resolvedDependencies"]}
    version_dir = small_run_copy.workdir / ".veritrain" / "data" / version
    for rel in ("version.json", "manifest.csv", "splits/train.txt", "splits/test.txt"):  # version.json binds the shards
        entry = dependencies[f".veritrain/data/{version}/{rel}"]
        assert entry["digest"]["sha256"] == hashlib.sha256((version_dir / rel).read_bytes()).hexdigest()
        assert entry["annotations"] == {"role": "data", "data_version": version}
    assert dependencies["env/requirements.lock"]["digest"]["sha256"] == record["artifacts"]["env/requirements.lock"]["sha256"]
    assert details["builder"]["id"] == "https://veritrain.dev/builder" and details["metadata"]["invocationId"] == record["run_id"]
    assert details["metadata"]["startedOn"] == record["started_at"] and details["metadata"]["finishedOn"] == record["ended_at"]
    byproducts = {b["name"]: b["digest"]["sha256"] for b in details["byproducts"]}
    assert byproducts["record.json"] == (run_dir / "record.sha256").read_text().strip() == small_run_copy.seal
    assert byproducts["metrics.jsonl"] == record["artifacts"]["metrics.jsonl"]["sha256"]
    assert verified(run_dir, small_run_copy.workdir)["ok"]
    rows = {r["id"]: r for r in cli("check", run_dir.name, "--workdir", str(small_run_copy.workdir), "--json").json()["items"]}
    assert rows["provenance_signed"]["status"] == "n/a" and rows["provenance_signed"]["detail"].startswith("unsigned:")


def test_a_re_seal_with_a_key_signs_and_the_standard_check_passes(small_run_copy, key, tmp_path, cli):
    from veritrain.core import signing_keys

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    seal = reseal(run_dir, workdir)
    public = signing_keys.show(key)
    record = json.loads((run_dir / "record.json").read_text())
    assert record["provenance"] == {"file": FILE, "key_fingerprint": public.fingerprint}
    assert [s["keyid"] for s in envelope(run_dir)["signatures"]] == [public.fingerprint]
    assert {b["name"]: b["digest"]["sha256"] for b in statement(run_dir)["predicate"]["runDetails"]["byproducts"]}["record.json"] == seal
    result = verified(run_dir, workdir)  # the local key pair's public key: the signature is checked
    assert result["ok"] and not [n for n in result["not_checked"] if n["check"] == "provenance signature"], result
    code, shown = standard_check(run_dir, signing_keys.public_path(key), doc_script(tmp_path))
    assert code == 0 and shown.count(": OK") == len(statement(run_dir)["subject"]) + 3, shown
    rows = {r["id"]: r for r in cli("check", run_dir.name, "--workdir", str(workdir), "--json").json()["items"]}
    assert rows["provenance_signed"]["status"] == "pass" and public.fingerprint[:16] in rows["provenance_signed"]["detail"]

    (key.parent / "signing-key.pub.pem").rename(tmp_path / "moved.pub.pem")
    unknown = verified(run_dir, workdir)
    assert unknown["ok"] and [n["check"] for n in unknown["not_checked"] if "provenance" in n["check"]] == ["provenance signature"]
    given = cli("verify", run_dir.name, "--public-key", str(tmp_path / "moved.pub.pem"), "--workdir", str(workdir), "--json")
    assert given.code == 0 and not given.json()["not_checked"], given.stdout


def test_a_run_sealed_with_a_key_is_signed_from_its_first_seal(tmp_path, key):
    outcome = in_process_run(tmp_path / "ws", [*FAST_OVERRIDES, "train.epochs=1", "eval.baselines=false"])
    assert outcome.error is None, outcome.error
    run_dir = Path(outcome.summary["run_dir"])
    from veritrain.core import signing_keys

    assert json.loads((run_dir / "record.json").read_text())["provenance"]["key_fingerprint"] == signing_keys.show(key).fingerprint
    assert verified(run_dir, tmp_path / "ws")["ok"]
    code, shown = standard_check(run_dir, signing_keys.public_path(key), doc_script(tmp_path))
    assert code == 0, shown


def _rewrite_payload(run_dir: Path, change) -> None:
    """Change the statement and sign it again with the same key, as only the key's holder could."""
    from veritrain.core import signing_keys
    from veritrain.records import provenance

    document = statement(run_dir)
    change(document)
    (run_dir / FILE).write_bytes(provenance.envelope_bytes(document, signing_keys.sealing_key()))


@pytest.mark.parametrize("tamper", ["subject byte", "statement byte", "signature byte", "another key", "extra subject",
                                    "missing subject", "changed config", "stale", "garbage", "two lines", "missing file"])
def test_each_tampering_fails_verify_by_name_and_the_standard_check_where_it_can_see_it(small_run_copy, key, tmp_path, cli, tamper):
    from veritrain.core import signing_keys
    from veritrain.records import provenance

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    before = (run_dir / FILE).read_bytes()  # the unsigned statement of the first seal
    reseal(run_dir, workdir)
    public_file = signing_keys.public_path(key)
    line = (run_dir / FILE).read_bytes()
    if tamper == "subject byte":
        target = run_dir / "export" / "model.onnx"
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 1
        target.write_bytes(bytes(data))
        expected = "changed"
    elif tamper == "statement byte":  # one character of the payload's JSON, still valid base64 and JSON
        document = envelope(run_dir)
        payload = base64.b64decode(document["payload"]).replace(b'"train.log"', b'"train.loh"', 1)
        payload = payload if b"train.loh" in payload else base64.b64decode(document["payload"]).replace(b"veritrain", b"veritraim", 1)
        document["payload"] = base64.b64encode(payload).decode()
        (run_dir / FILE).write_text(json.dumps(document) + "\n")
        expected = "provenance_signature"
    elif tamper == "signature byte":
        document = envelope(run_dir)
        signature = bytearray(base64.b64decode(document["signatures"][0]["sig"]))
        signature[-1] ^= 1
        document["signatures"][0]["sig"] = base64.b64encode(bytes(signature)).decode()
        (run_dir / FILE).write_text(json.dumps(document) + "\n")
        expected = "provenance_signature"
    elif tamper == "another key":
        other = signing_keys.init(tmp_path / "other" / "signing-key.pem")
        document = statement(run_dir)
        signed = json.loads(provenance.envelope_bytes(document, signing_keys.load(tmp_path / "other" / "signing-key.pem")))
        signed["signatures"][0]["keyid"] = signing_keys.show(key).fingerprint  # claiming to be the run's key
        (run_dir / FILE).write_text(json.dumps(signed) + "\n")
        assert other.fingerprint != signing_keys.show(key).fingerprint
        expected = "provenance_signature"
    elif tamper == "extra subject":
        _rewrite_payload(run_dir, lambda d: d["subject"].append({"name": "train.log", "digest": {"sha256": hashlib.sha256((run_dir / "train.log").read_bytes()).hexdigest()}}))
        expected = "provenance_mismatch"
    elif tamper == "missing subject":
        _rewrite_payload(run_dir, lambda d: d["subject"].pop(0))
        expected = "provenance_mismatch"
    elif tamper == "changed config":
        _rewrite_payload(run_dir, lambda d: d["predicate"]["buildDefinition"]["externalParameters"]["config"]["optim"].update(lr=0.5))
        expected = "provenance_mismatch"
    elif tamper == "stale":  # the statement of the seal before
        (run_dir / FILE).write_bytes(before)
        expected = "provenance_stale"
    elif tamper == "garbage":
        (run_dir / FILE).write_bytes(line[: len(line) // 2])
        expected = "provenance_malformed"
    elif tamper == "two lines":
        (run_dir / FILE).write_bytes(line + line)
        expected = "provenance_malformed"
    else:
        (run_dir / FILE).unlink()
        expected = "provenance_missing"
    result = verified(run_dir, workdir)
    assert not result["ok"] and expected in kinds(result), result["problems"]
    detail = next(p["detail"] for p in result["problems"] if p["kind"] == expected)
    if tamper in ("extra subject", "missing subject"):
        assert ("train.log" if tamper == "extra subject" else "export/") in detail, detail
    ran = cli("verify", run_dir.name, "--workdir", str(workdir))
    assert ran.code == 1 and "Traceback" not in ran.stderr and ran.stderr.strip().splitlines()[-1].startswith(f"error: verify {run_dir.name}: ")
    if tamper in ("subject byte", "statement byte", "signature byte", "another key", "stale", "garbage", "missing file"):
        code, shown = standard_check(run_dir, public_file, doc_script(tmp_path))
        assert code != 0, (tamper, shown)


def test_a_wrong_public_key_given_fails_and_a_bad_one_is_a_usage_error(small_run_copy, key, tmp_path, cli):
    from veritrain.core import signing_keys

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    reseal(run_dir, workdir)
    other = signing_keys.init(tmp_path / "other" / "signing-key.pem")
    wrong = cli("verify", run_dir.name, "--public-key", str(other.path), "--workdir", str(workdir), "--json")
    assert wrong.code == 1 and "not by the key given" in json.dumps(wrong.json()["problems"])
    (tmp_path / "bad.pem").write_text("not a key\n")
    bad = cli("verify", run_dir.name, "--public-key", str(tmp_path / "bad.pem"), "--workdir", str(workdir))
    assert bad.code == 2 and bad.stderr.strip() == f"error: --public-key: {tmp_path / 'bad.pem'}: not a PEM public key; give the .pub.pem that `veritrain keys show` prints"


@pytest.mark.parametrize("problem", ["readable by others", "not a key", "another curve", "passphrase", "named but absent"])
def test_an_unusable_key_stops_a_run_before_it_exists(tmp_path, monkeypatch, cli, problem):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from veritrain.core import signing_keys

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = signing_keys.default_key_path()
    path.parent.mkdir(parents=True)
    if problem == "named but absent":
        monkeypatch.setenv("VERITRAIN_SIGNING_KEY", str(tmp_path / "nowhere.pem"))
        expected = "no signing key here"
    else:
        private = ec.generate_private_key(ec.SECP384R1() if problem == "another curve" else ec.SECP256R1())
        encryption = serialization.BestAvailableEncryption(b"secret") if problem == "passphrase" else serialization.NoEncryption()
        pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        path.write_bytes(b"hello\n" if problem == "not a key" else pem)
        path.chmod(0o644 if problem == "readable by others" else 0o600)
        expected = {"readable by others": "readable by others", "not a key": "not an unencrypted PEM private key",
                    "another curve": "not an ECDSA P-256 key", "passphrase": "encrypted with a passphrase"}[problem]
    result = cli("train", "--set", "train.epochs=1", "--workdir", str(tmp_path / "ws"))
    assert result.code == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "ws" / "runs").exists()


def test_an_imported_run_verifies_by_digest_in_another_workspace(small_run_copy, key, tmp_path, cli):
    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    reseal(run_dir, workdir)
    for with_data in (True, False):
        archive = tmp_path / f"run-{with_data}.tar.gz"
        made = cli("archive", run_dir.name, "--output", str(archive), *(["--with-data"] if with_data else []), "--workdir", str(workdir))
        assert made.code == 0, made.stderr
        elsewhere = tmp_path / f"elsewhere-{with_data}"
        assert cli("import", str(archive), "--workdir", str(elsewhere)).code == 0
        copied = elsewhere / "runs" / run_dir.name
        assert (copied / FILE).read_bytes() == (run_dir / FILE).read_bytes()  # its uris name the first workspace
        assert str(workdir) in json.dumps(statement(copied))
        result = verified(copied, elsewhere)
        assert result["ok"], result["problems"]
        unchecked = [n["check"] for n in result["not_checked"]]
        assert ("provenance data dependencies" in unchecked) == (not with_data), unchecked


def test_a_baseline_run_attests_its_baselines_and_a_failed_one_its_record():
    from veritrain.records import provenance

    record = {"run_id": "r", "kind": "baseline", "artifacts": {"eval/baselines.json": {"sha256": "a" * 64, "size": 3},
                                                              "config.yaml": {"sha256": "b" * 64, "size": 3}}}
    assert provenance.subjects(record, "c" * 64) == [{"name": "eval/baselines.json", "digest": {"sha256": "a" * 64}}]
    failed = {"run_id": "r", "kind": "run", "artifacts": {"train.log": {"sha256": "b" * 64, "size": 3}}, "trajectory": []}
    assert provenance.subjects(failed, "c" * 64) == [{"name": "record.json", "digest": {"sha256": "c" * 64}}]


def test_a_run_of_the_previous_code_has_no_provenance_and_check_says_so(cli, tmp_path):
    legacy = ROOT / "tests" / "fixtures" / "legacy"
    info = cli("import", str(legacy / "legacy-completed.tar.gz"), "--workdir", str(tmp_path), "--json").json()
    run_id = info["run_id"]
    assert "provenance" not in json.loads((tmp_path / "runs" / run_id / "record.json").read_text())
    assert cli("verify", run_id, "--workdir", str(tmp_path)).code == 0
    rows = {r["id"]: r for r in cli("check", run_id, "--workdir", str(tmp_path), "--json").json()["items"]}
    assert rows["provenance_signed"]["status"] == "n/a" and rows["provenance_signed"]["detail"].startswith("no provenance")


def test_the_private_key_never_leaves_its_file(small_run_copy, key, tmp_path, cli):
    """A canary key: its bytes (PEM, its base64 body, DER, the private number) appear in no file of the workspace,
    of an archive or of a published site, nor in what the commands print."""
    from cryptography.hazmat.primitives import serialization

    from veritrain.core import signing_keys

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    reseal(run_dir, workdir)
    loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
    pem = key.read_bytes()
    body = b"".join(pem.splitlines()[1:-1])
    der = loaded.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    number = loaded.private_numbers().private_value.to_bytes(32, "big")  # type: ignore[union-attr]
    canaries = [pem, body, body[:40], der, number, number.hex().encode(), base64.b64encode(number)]
    shown = ""
    for command in (["archive", run_dir.name, "--with-data", "--output", str(tmp_path / "run.tar.gz")],
                    ["publish", run_dir.name, "--out", str(tmp_path / "site"), "--with-archives"],
                    ["verify", run_dir.name, "--json"], ["keys", "show", "--json"], ["runs", "show", run_dir.name]):
        result = cli(*command, "--workdir", str(workdir))
        assert result.code == 0, (command, result.stderr)
        shown += result.stdout + result.stderr
    contents = [p.read_bytes() for p in [*workdir.rglob("*"), *(tmp_path / "site").rglob("*")] if p.is_file()]
    with tarfile.open(tmp_path / "run.tar.gz") as tar:
        contents += [tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()]  # type: ignore[union-attr]
    contents += [shown.encode()]
    assert len(contents) > 50
    for data in contents:
        for canary in canaries:
            assert canary not in data
    assert signing_keys.show(key).fingerprint in shown  # what may be shown: the public key and its fingerprint
