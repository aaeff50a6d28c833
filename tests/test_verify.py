"""verify detects every kind of tampering; reproduce gives an identical run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from veritrain.trust.policy import Policy

from veritrain.trust.verify import verify_run



@pytest.fixture(scope="module")
def sealed(small_run):
    return small_run.workdir, small_run.run_dir, small_run.seal


@pytest.fixture
def copy_of(sealed, tmp_path):
    """A fresh copy of the sealed run in the same workspace (so its data version resolves)."""
    workdir, run_dir, seal = sealed
    target = workdir / "runs" / f"{run_dir.name}-copy-{tmp_path.name[-12:]}"
    shutil.copytree(run_dir, target)
    yield workdir, target, seal
    shutil.rmtree(target, ignore_errors=True)


@pytest.fixture
def damageable_data_version(copy_of, tmp_path):
    """(workdir, run_dir, version id, its folder) of a copied run; whatever a test does to the data
    version's files is undone afterwards (the version is shared by the module's runs)."""
    workdir, run_dir, _ = copy_of
    version = json.loads((run_dir / "record.json").read_text())["data"]["version"]
    version_dir = workdir / ".veritrain" / "data" / version
    backup = tmp_path / "backup"
    shutil.copytree(version_dir, backup)
    yield workdir, run_dir, version, version_dir
    shutil.rmtree(version_dir)
    shutil.copytree(backup, version_dir)


def test_untouched_run_verifies(cli, sealed):
    workdir, run_dir, seal = sealed
    result = cli("verify", run_dir.name, "--expect", seal, "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["ok"] and payload["seal"] == seal and payload["problems"] == []
    assert set(payload) >= {"ok", "seal", "problems", "drift"}
    # the raw digits are told unchanged from their hashes; nothing is prepared (or said to be written) again
    assert payload["raw_data"] == "1,797 raw samples hash as recorded (decoders unchanged): not re-decoded"
    assert "data: 1,797 raw samples hash as recorded" in result.stderr and "writing" not in result.stderr
    from veritrain.records import verdicts

    kept = verdicts.latest(run_dir, workdir / ".veritrain")  # verify keeps its verdict outside the run and the workspace
    assert kept["ok"] is True and kept["seal"] == seal and kept["expect"] == seal and kept["stale"] is False
    assert kept["verified_at"] == payload["verified_at"] and not (run_dir / "verdicts").exists()
    import os

    assert verdicts.path_of(workdir / ".veritrain", run_dir.name).is_relative_to(Path(os.environ["XDG_STATE_HOME"]) / "veritrain" / "verdicts")
    assert not (workdir / ".veritrain" / "verdicts").exists()


def test_a_kept_verdict_is_stale_once_the_seal_or_a_file_it_covered_changes(damageable_data_version):
    """Notes are outside what verify reads: adding one leaves the verdict fresh. A changed file of the run, of its
    data version or an edited record (a new seal) makes it stale, saying why."""
    from veritrain.records import verdicts
    from veritrain.trust.verify import verify_and_keep

    workdir, run_dir, version, version_dir = damageable_data_version
    state = workdir / ".veritrain"
    assert verdicts.latest(run_dir, state) is None
    result = verify_and_keep(run_dir, state)
    kept = verdicts.latest(run_dir, state)
    assert result["ok"] and kept["ok"] and kept["stale"] is False and kept["stale_reasons"] == []
    assert kept["seal"] == result["seal"] and kept["verified_at"] == result["verified_at"] and kept["expect"] is None
    assert {e[0] for e in kept["fingerprint"]["run"]} >= {"record.json", "train.log", "checkpoints/best.pt"}
    assert kept["fingerprint"]["data_version"]["count"] > 0 and kept["fingerprint"]["raw_data"]["count"] == 0  # digits: no raw files

    with (run_dir / "notes.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "a note", "at": "2026-01-01T00:00:00"}) + "\n")
    assert verdicts.latest(run_dir, state)["stale"] is False

    with (version_dir / "data_report.json").open("a", encoding="utf-8") as f:
        f.write(" ")
    assert verdicts.latest(run_dir, state)["stale_reasons"] == ["a file of the run's data version changed since"]

    with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write("\n")
    (run_dir / "record.json").write_text((run_dir / "record.json").read_text() + " ")
    stale = verdicts.latest(run_dir, state)
    assert stale["stale"] is True and stale["ok"] is True  # the verdict kept as it was computed
    assert stale["stale_reasons"][0].startswith("the seal changed: record.json now hashes to ")
    assert stale["stale_reasons"][1] == "1 file(s) of the run changed since: metrics.jsonl"  # record.json is said once, as the seal


def test_verify_answers_when_its_verdict_cannot_be_kept(copy_of, monkeypatch):
    from veritrain.records import verdicts
    from veritrain.trust.verify import verify_and_keep

    workdir, run_dir, seal = copy_of

    def read_only(path, data, fsync=True, sync_folder=True):
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(verdicts, "write_atomic", read_only)
    result = verify_and_keep(run_dir, workdir / ".veritrain", Policy(expect=seal))
    assert result["ok"] and result["seal"] == seal
    assert verdicts.latest(run_dir, workdir / ".veritrain") is None


KINDS = ["config.yaml", "train.log", "metrics.jsonl", "checkpoints/best.pt", "checkpoints/step-46.pt.sha256",
         "eval/test/predictions.csv", "eval/test/bad_cases.png", "export/model.onnx", "export/model.json", "env/requirements.lock"]


@pytest.mark.parametrize("rel", KINDS)
def test_one_changed_byte_in_any_artifact_is_named(copy_of, rel):
    workdir, run_dir, _ = copy_of
    path = run_dir / rel
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    result = verify_run(run_dir, workdir / ".veritrain", rehash_data=False)
    assert not result["ok"]
    assert {"path": rel, "kind": "changed"} in [{"path": p["path"], "kind": p["kind"]} for p in result["problems"]]


def test_removed_added_and_edited_record_are_detected(cli, copy_of):
    workdir, run_dir, seal = copy_of
    (run_dir / "eval" / "test" / "per_class.csv").unlink()
    (run_dir / "extra.txt").write_text("sneaked in")
    result = verify_run(run_dir, workdir / ".veritrain", rehash_data=False)
    kinds = {(p["path"], p["kind"]) for p in result["problems"]}
    assert ("eval/test/per_class.csv", "missing") in kinds and ("extra.txt", "added") in kinds

    record = json.loads((run_dir / "record.json").read_text())
    record["metrics"]["test"]["accuracy"] = 1.0
    (run_dir / "record.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    result = cli("verify", str(run_dir), "--workdir", str(workdir))
    assert result.code == 1
    assert "seal_mismatch: record.json" in result.stdout  # the verdict is the report, on stdout
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: verify {run_dir.name}: ")


def restate(run_dir: Path, record: dict, seal: str) -> None:
    """Write the run's unsigned provenance statement again for a record rewritten by hand (as a forger could)."""
    from veritrain.records.record import statement_bytes

    (run_dir / "provenance.intoto.jsonl").write_bytes(statement_bytes(record, seal, run_dir, None))


def test_rewritten_seal_is_caught_only_against_the_published_one(copy_of):
    import hashlib

    workdir, run_dir, seal = copy_of
    record = json.loads((run_dir / "record.json").read_text())
    record["seed"] = 12345
    data = (json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    (run_dir / "record.json").write_bytes(data)
    (run_dir / "record.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    stale = verify_run(run_dir, workdir / ".veritrain", rehash_data=False)  # the unsigned statement names the old seal
    assert [p["kind"] for p in stale["problems"]] == ["provenance_stale"]
    restate(run_dir, record, hashlib.sha256(data).hexdigest())
    assert verify_run(run_dir, workdir / ".veritrain", rehash_data=False)["ok"]  # a consistent forgery: only a signature or the published seal stops it
    result = verify_run(run_dir, workdir / ".veritrain", Policy(expect=seal), rehash_data=False)
    assert not result["ok"] and result["problems"][0]["kind"] == "seal_differs_from_expected"


def test_tampered_data_version_is_detected(damageable_data_version):
    workdir, run_dir, _, version_dir = damageable_data_version
    manifest = (version_dir / "manifest.csv").read_text().splitlines()
    manifest[1] = manifest[1].replace(",train,", ",test,") if ",train," in manifest[1] else manifest[1].replace(",test,", ",train,").replace(",val,", ",train,")
    (version_dir / "manifest.csv").write_text("\n".join(manifest) + "\n")
    result = verify_run(run_dir, workdir / ".veritrain", rehash_data=False)
    assert ("data_version_changed" in {p["kind"] for p in result["problems"]})


def test_environment_drift_fails_only_with_strict(copy_of):
    import hashlib

    workdir, run_dir, _ = copy_of
    record = json.loads((run_dir / "record.json").read_text())
    record["env"]["python"] = "2.7.18"
    data = (json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    (run_dir / "record.json").write_bytes(data)
    (run_dir / "record.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    restate(run_dir, record, hashlib.sha256(data).hexdigest())
    relaxed = verify_run(run_dir, workdir / ".veritrain", rehash_data=False)
    assert relaxed["ok"] and {"what": "env.python", "recorded": "2.7.18", "now": relaxed["drift"][0]["now"]} in relaxed["drift"]
    assert not verify_run(run_dir, workdir / ".veritrain", Policy(strict=True), rehash_data=False)["ok"]


def test_reproduce_is_identical(cli, sealed):
    workdir, run_dir, _ = sealed
    result = cli("reproduce", run_dir.name, "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["verdict"] == "identical" and payload["original"] == run_dir.name
    assert all(c["verdict"] == "identical" for c in payload["checks"])
    new = json.loads((workdir / "runs" / payload["reproduction"] / "record.json").read_text())
    old = json.loads((run_dir / "record.json").read_text())
    assert new["reproduced_from"] == run_dir.name and new["final_state_sha256"] == old["final_state_sha256"]
    assert "identical" in result.stderr


def test_compare_names_the_first_divergence(sealed, tmp_path):
    from veritrain.trust.verify import compare_runs

    workdir, run_dir, _ = sealed
    other = tmp_path / run_dir.name  # a folder named by its record's run id, as every record reader requires
    shutil.copytree(run_dir, other)
    rows = [json.loads(l) for l in (other / "metrics.jsonl").read_text().splitlines()]
    rows[1]["val_loss"] += 0.5
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = compare_runs(run_dir, other)
    assert result["verdict"] == "differs"
    epochs = next(c for c in result["checks"] if c["what"].startswith("metrics.jsonl"))
    assert epochs["first_divergence"]["where"] == f"metrics.jsonl step {rows[1]['step']} (epoch 2)" and epochs["first_divergence"]["key"] == "val_loss"


@pytest.mark.parametrize("damage", ["manifest.csv missing", "version.json not JSON", "version.json lacks fields", "version.json a list"])
def test_damaged_data_version_is_a_problem_not_a_crash(cli, damageable_data_version, damage):
    workdir, run_dir, version, version_dir = damageable_data_version
    if damage == "manifest.csv missing":
        (version_dir / "manifest.csv").unlink()
    else:
        text = {"version.json not JSON": "{not json", "version.json lacks fields": "{}", "version.json a list": "[]"}[damage]
        (version_dir / "version.json").write_text(text)
    result = verify_run(run_dir, workdir / ".veritrain", rehash_data=False)
    assert not result["ok"]
    assert "data_version_changed" in {p["kind"] for p in result["problems"]}
    assert all(p["path"].startswith(f".veritrain/data/{version}/") for p in result["problems"])
    for command in ("verify", "check"):
        ran = cli(command, str(run_dir), "--workdir", str(workdir))
        assert ran.code == 1, ran.stderr
        assert "Traceback" not in ran.stderr
        assert ran.stderr.strip().splitlines()[-1].startswith(f"error: {command} {run_dir.name}: ")


def test_data_version_check_is_shared_by_verify_and_import():
    """One check of a data version: the same problems whether its files are in a folder or an archive."""
    from veritrain.trust import archive, verify
    from veritrain.data import identity

    assert archive.data_version_problems is verify.data_version_problems is identity.data_version_problems
    files = {"version.json": b"{}"}
    problems = identity.data_version_problems("0" * 64, files.__getitem__, lambda name: "")
    assert [(p["path"], p["kind"]) for p in problems] == [("manifest.csv", "data_version_changed"), ("version.json", "data_version_changed")]


@pytest.mark.parametrize("text", ["{broken", "[]", ""])
def test_corrupt_record_is_reported_by_check_and_verify(cli, copy_of, text):
    workdir, run_dir, _ = copy_of
    (run_dir / "record.json").write_text(text)
    result = verify_run(run_dir, workdir / ".veritrain", rehash_data=False)
    assert not result["ok"] and ("record.json", "unreadable") in {(p["path"], p["kind"]) for p in result["problems"]}
    from veritrain.trust.check import check_run

    checked = check_run(run_dir, workdir / ".veritrain")
    assert not checked["ok"] and checked["items"][0]["status"] == "fail" and checked["items"][0]["fix"] == f"veritrain verify {run_dir.name}"
    for command in ("check", "verify"):
        ran = cli(command, str(run_dir), "--workdir", str(workdir))
        assert ran.code == 1, ran.stderr
        assert "Traceback" not in ran.stderr
        assert ran.stderr.strip().splitlines()[-1].startswith(f"error: {command} {run_dir.name}: ")


def test_verify_decodes_nothing_when_the_raw_data_hashes_as_recorded(sealed, monkeypatch):
    from veritrain.data import identity, prepare

    workdir, run_dir, _ = sealed
    monkeypatch.setattr(prepare, "version_now", lambda *a, **k: pytest.fail("the raw data was prepared again"))
    result = verify_run(run_dir, workdir / ".veritrain")
    assert result["ok"] and result["raw_data"].endswith("hash as recorded (decoders unchanged): not re-decoded")
    monkeypatch.undo()  # other decoders: the raw data is prepared again to compare (this recipe can)
    monkeypatch.setattr(identity, "decoder_versions", lambda: {"pillow": "0.0", "numpy": "0.0"})
    again = verify_run(run_dir, workdir / ".veritrain")
    assert again["ok"] and again["raw_data"].startswith("raw data prepared again to compare (decoders changed: pillow")


def test_state_hashes_are_kept_by_the_checkpoint_file_hash_and_audit_reads_only_the_users_cache(sealed, tmp_path, monkeypatch):
    import torch

    from veritrain.trust import audit, verify
    from veritrain.records.workspace import Workspace

    workdir, run_dir, _ = sealed
    cache = tmp_path / "states"
    assert verify_run(run_dir, workdir / ".veritrain", check_data=False, state_cache=cache)["ok"]
    record = json.loads((run_dir / "record.json").read_text())
    last = record["artifacts"]["checkpoints/last.pt"]["sha256"]
    kept = json.loads((cache / f"{last}.json").read_text())
    assert kept["state_sha256"] == record["trajectory"][-1]["state_sha256"]
    assert (cache / f"{record['artifacts']['export/model.safetensors']['sha256']}.json").exists()

    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or pytest.fail("a checkpoint was loaded"))
    assert verify_run(run_dir, workdir / ".veritrain", check_data=False, state_cache=cache)["ok"]  # every state a hit
    monkeypatch.undo()

    # an entry is found only under the file's own hash: a poisoned one is used (this is a cache, audit never reads
    # it), one under any other hash (a changed file) is not
    (cache / f"{last}.json").write_text(json.dumps({**kept, "state_sha256": "0" * 64}))
    (cache / f"{'f' * 64}.json").write_text(json.dumps({**kept, "step": 1, "state_sha256": "0" * 64}))
    poisoned = verify_run(run_dir, workdir / ".veritrain", check_data=False, state_cache=cache)
    assert not poisoned["ok"] and "checkpoints/last.pt" in {p["path"] for p in poisoned["problems"]}
    shutil.copytree(cache, workdir / ".veritrain" / "cache" / "states", dirs_exist_ok=True)
    try:
        assert verify_run(run_dir, workdir / ".veritrain", check_data=False)["ok"]  # the default, as audit calls it
        seen = []

        def spy(*args, **kwargs):
            seen.append(kwargs)
            raise KeyboardInterrupt  # stop the audit right after its verify

        monkeypatch.setattr(verify, "verify_run", spy)
        with pytest.raises(KeyboardInterrupt):
            audit.run(Workspace.open(workdir), run_dir.name)
        # the user's own cache folder, never the workspace's
        assert seen and seen[0]["state_cache"] == verify.state_cache_dir()
        assert not seen[0]["state_cache"].resolve().is_relative_to(workdir.resolve())
    finally:
        shutil.rmtree(workdir / ".veritrain" / "cache" / "states")
