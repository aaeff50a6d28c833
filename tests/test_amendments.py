"""Seals that never go stale: eval, export, baseline and gc add sealed amendments beside a run's record, never
rewriting it, so every seal ever printed keeps verifying and says exactly what it vouches for."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from veritrain.core.errors import RunFailed
from veritrain.records import amendments, recorder
from veritrain.records.record import read_record, record_bytes, thawed, write_record
from veritrain.records.workspace import Workspace
from veritrain.trust.policy import Policy
from veritrain.trust.verify import verify_run


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def amend(workdir: Path, run_dir: Path, by: str = "eval", files: dict[str, bytes] | None = None, **metrics: dict) -> str:
    with recorder.amending(Workspace.open(workdir), read_record(run_dir)) as change:
        for rel, data in (files or {}).items():
            (change.new / rel).parent.mkdir(parents=True, exist_ok=True)
            (change.new / rel).write_bytes(data)
        for split, values in metrics.items():
            change.set_metrics(split, values)
        change.add_event(by, "by a test")
        return change.commit(by=by)


def test_a_sealed_run_never_changes_and_its_first_seal_keeps_verifying(cli, small_run_copy):
    run_dir, workdir, first = small_run_copy.run_dir, str(small_run_copy.workdir), small_run_copy.seal
    before = files_of(run_dir)
    assert cli("eval", run_dir.name, "--workdir", workdir).code == 0
    assert cli("export", run_dir.name, "--workdir", workdir, "--format", "safetensors").code == 0
    after = files_of(run_dir)
    assert {rel: after[rel] for rel in before} == before  # not one byte of the sealed run changed
    assert all(rel.startswith("amendments/0001/") or rel.startswith("amendments/0002/") for rel in set(after) - set(before))

    newest = cli("verify", run_dir.name, "--workdir", workdir, "--json").json()
    assert newest["ok"] and newest["base_seal"] == first and [a["by"] for a in newest["amendments"]] == ["eval", "export"]
    assert newest["seal"] == newest["amendments"][-1]["seal"] and all(a["covered"] for a in newest["amendments"])

    shown = cli("verify", run_dir.name, "--workdir", workdir, "--expect", first)
    assert shown.code == 0, shown.stdout + shown.stderr
    assert shown.stdout.count("(NOT covered by the seal you expect)") == 2 and "2 later amendment(s)" in shown.stdout
    middle = cli("verify", run_dir.name, "--workdir", workdir, "--expect", newest["amendments"][0]["seal"], "--json").json()
    assert middle["ok"] and [a["covered"] for a in middle["amendments"]] == [True, False]

    record = read_record(run_dir)  # every reader sees the run as amended
    assert record.seal == newest["seal"] and [link.by for link in record.amendments] == ["eval", "export"]
    assert record.path("export/model.safetensors") == run_dir / "amendments/0002/files/export/model.safetensors"
    assert record.path("config.yaml") == run_dir / "config.yaml"
    listed = cli("runs", "list", "--workdir", workdir, "--json").json()["runs"]
    assert listed[0]["seal"] == newest["seal"]


def test_an_amendment_by_another_key_is_not_covered_and_check_flags_its_results(cli, small_run_copy, tmp_path, monkeypatch):
    from veritrain.core import signing_keys
    from veritrain.trust.check import check_run

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    owner, other = tmp_path / "owner" / "key.pem", tmp_path / "other" / "key.pem"
    owner_public, other_public = signing_keys.init(owner), signing_keys.init(other)
    monkeypatch.setenv("VERITRAIN_SIGNING_KEY", str(owner))
    first = write_record(run_dir, thawed(read_record(run_dir)))  # the run sealed and signed by its owner
    monkeypatch.setenv("VERITRAIN_SIGNING_KEY", str(other))
    inflated = {**thawed(read_record(run_dir)["metrics"]["test"]), "accuracy": 1.0}
    amend(workdir, run_dir, test=inflated)

    pem = signing_keys.public_path(owner).read_bytes()
    covered = verify_run(run_dir, workdir / ".veritrain", Policy(expect=first, public_key=pem))
    assert covered["ok"], covered["problems"]
    row = covered["amendments"][0]
    assert not row["covered"] and row["signer"]["fingerprint"] == other_public.fingerprint and row["results"] == ["metrics.test"]
    whole = verify_run(run_dir, workdir / ".veritrain", Policy(public_key=pem))  # the newest seal: the owner's key must sign all of it
    assert not whole["ok"] and any(p["kind"] == "provenance_signature" and p["path"].startswith("amendments/0001/") for p in whole["problems"])

    checked = {i["id"]: i for i in check_run(run_dir, workdir / ".veritrain", covered)["items"]}
    flagged = checked["results_amended"]
    assert flagged["status"] == "fail" and "metrics.test from amendment 0001" in flagged["detail"] and owner_public.fingerprint[:16] in flagged["detail"]
    text = cli("verify", run_dir.name, "--workdir", str(workdir), "--expect", first)
    assert text.code == 0 and f"key {other_public.fingerprint}" in text.stdout and "NOT covered" in text.stdout


def _forge(run_dir: Path, index: int, change) -> None:
    """Rewrite amendment `index`'s amendment.json with `change` applied, its seal made to match (as a forger would)."""
    folder = run_dir / amendments.AMENDMENTS_DIR / amendments.folder_name(index)
    doc = json.loads((folder / amendments.AMENDMENT_FILE).read_text())
    change(doc)
    data = record_bytes(doc)
    (folder / amendments.AMENDMENT_FILE).write_bytes(data)
    (folder / amendments.AMENDMENT_SEAL).write_text(hashlib.sha256(data).hexdigest() + "\n")


CASES = {
    "a file of an amendment changed": (lambda d: (d / "amendments/0001/files/eval/test/metrics.json").write_text("{}"), "changed"),
    "the first amendment removed": (lambda d: shutil.rmtree(d / "amendments/0001"), "amendment_chain"),
    "an amendment that rewrites the trajectory": (lambda d: _forge(d, 2, lambda doc: doc["set"].update(trajectory=[])), "amendment_chain"),
    "an amendment written on another seal": (lambda d: _forge(d, 1, lambda doc: doc.update(extends="0" * 64)), "amendment_chain"),
    "inflated metrics with the seal made to match": (lambda d: _forge(d, 2, lambda doc: doc["set"]["metrics"]["test"].update(accuracy=1.0)),
                                                     "provenance_stale"),
    "a file planted among the amendments": (lambda d: (d / "amendments/0002/files/export").mkdir(parents=True) or
                                            (d / "amendments/0002/files/export/extra.onnx").write_bytes(b"x"), "added"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_tampered_chain_does_not_verify_and_is_not_read(small_run_copy, case):
    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    test = thawed(read_record(run_dir)["metrics"]["test"])
    amend(workdir, run_dir, test={**test, "accuracy": 0.5}, files={"eval/test/metrics.json": b'{"accuracy": 0.5}'})
    amend(workdir, run_dir, test={**test, "accuracy": 0.6})
    assert verify_run(run_dir, workdir / ".veritrain")["ok"]
    tamper, kind = CASES[case]
    tamper(run_dir)
    result = verify_run(run_dir, workdir / ".veritrain", Policy(expect=small_run_copy.seal))
    assert not result["ok"] and kind in {p["kind"] for p in result["problems"]}, result["problems"]
    if kind == "amendment_chain":
        with pytest.raises(RunFailed, match="amendments"):
            read_record(run_dir)


def test_a_kill_before_the_rename_leaves_the_run_as_it_was_and_gc_clears_the_rest(small_run_copy, monkeypatch):
    from veritrain.orchestration import housekeeping

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    before = files_of(run_dir)

    def killed(*args, **kwargs):
        raise SystemExit(137)

    monkeypatch.setattr(amendments.os, "rename", killed)
    monkeypatch.setattr(amendments.Draft, "discard", lambda self: None)  # a kill runs no clean-up
    with pytest.raises(SystemExit):
        amend(workdir, run_dir, test={"accuracy": 1.0})
    monkeypatch.undo()
    assert files_of(run_dir) == before and verify_run(run_dir, workdir / ".veritrain")["ok"]
    left = list((workdir / ".veritrain" / amendments.STAGING_DIR).iterdir())
    assert len(left) == 1 and (left[0] / amendments.AMENDMENT_FILE).is_file()
    monkeypatch.setattr(housekeeping, "LEFTOVER_AGE", -1.0)
    planned = housekeeping.gc(Workspace.open(workdir), dry_run=True)
    assert any(f".veritrain/{amendments.STAGING_DIR}/" in line for line in planned["removed"])
    housekeeping.gc(Workspace.open(workdir), dry_run=False)
    assert not left[0].exists() and verify_run(run_dir, workdir / ".veritrain")["ok"]


def test_gc_retires_step_files_in_an_amendment_and_the_first_seal_still_verifies(cli, small_run_copy):
    run_dir, workdir = small_run_copy.run_dir, str(small_run_copy.workdir)
    steps = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    assert cli("gc", "--workdir", workdir).code == 0
    gone = [p for p in steps if not p.exists()]
    assert gone, "the small run keeps step files gc removes"
    record = read_record(run_dir)
    link = record.amendments[-1]
    assert link.by == "gc" and set(link.doc["retires"]) >= {p.relative_to(run_dir).as_posix() for p in gone}
    assert not any(e["kept"] for e in record["trajectory"] if f"checkpoints/step-{e['step']}.pt" in link.doc["retires"])
    assert json.loads((run_dir / "record.json").read_text())["artifacts"].keys() >= set(link.doc["retires"])  # the record is as sealed
    first = cli("verify", run_dir.name, "--workdir", workdir, "--expect", small_run_copy.seal, "--json").json()
    assert first["ok"], first["problems"]


def test_an_archive_carries_the_chain_and_import_checks_it(cli, small_run_copy, tmp_path):
    run_dir, workdir = small_run_copy.run_dir, str(small_run_copy.workdir)
    assert cli("export", run_dir.name, "--workdir", workdir, "--format", "safetensors").code == 0
    archive = tmp_path / "run.tar.gz"
    assert cli("archive", run_dir.name, "--workdir", workdir, "-o", str(archive)).code == 0
    imported = cli("import", str(archive), "--workdir", str(tmp_path / "elsewhere"))
    assert imported.code == 0, imported.stderr
    there = cli("verify", run_dir.name, "--workdir", str(tmp_path / "elsewhere"), "--expect", small_run_copy.seal, "--json").json()
    assert there["ok"] and [a["by"] for a in there["amendments"]] == ["export"] and not there["amendments"][0]["covered"]

    forged = tmp_path / "forged.tar.gz"  # the export's amendment rewritten onto another seal, its own seal made to match
    with tarfile.open(archive) as source, tarfile.open(forged, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else b""
            if member.name.endswith("amendments/0001/amendment.json"):
                doc = json.loads(data)
                doc["extends"] = "0" * 64
                data = record_bytes(doc)
                seal = hashlib.sha256(data).hexdigest()
            elif member.name.endswith("amendments/0001/amendment.sha256"):
                data = (seal + "\n").encode()
            member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    refused = cli("import", str(forged), "--workdir", str(tmp_path / "third"))
    assert refused.code == 1 and "amendments/0001" in refused.stderr and "extends the seal" in refused.stderr, refused.stderr
    assert not (tmp_path / "third" / "runs" / run_dir.name).exists()


def test_an_amendment_may_set_only_results(small_run_copy):
    with pytest.raises(ValueError, match="may not change"):
        amendments.AmendmentRecord.model_validate({
            "amendment_format": 1, "run_id": small_run_copy.run_dir.name, "index": 1, "by": "eval", "at": "2026-01-01T00:00:00+00:00",
            "extends": "0" * 64, "set": {"config": {}}, "events": [], "files": {}, "retires": [],
            "provenance": {"file": "provenance.intoto.jsonl", "key_fingerprint": None}})


def test_an_amendments_own_statement_passes_the_standard_check_in_its_folder(small_run_copy, tmp_path, monkeypatch):
    from test_provenance import doc_script, standard_check

    from veritrain.core import signing_keys

    key = tmp_path / "owner" / "key.pem"
    signing_keys.init(key)
    monkeypatch.setenv("VERITRAIN_SIGNING_KEY", str(key))
    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    amend(workdir, run_dir, files={"eval/test/metrics.json": b'{"accuracy": 0.5}', "eval/test/report.md": b"# report\n"})
    folder = read_record(run_dir).amendments[-1].folder
    code, shown = standard_check(folder, signing_keys.public_path(key), doc_script(tmp_path))
    assert code == 0 and shown.count(": OK") == 4, shown  # its two files, amendment.json (its seal) and amendment.sha256
    (folder / "files" / "eval" / "test" / "report.md").write_text("# another report\n")
    code, shown = standard_check(folder, signing_keys.public_path(key), doc_script(tmp_path))
    assert code != 0 and "files/eval/test/report.md: FAILED" in shown, shown


def test_the_run_page_shows_the_chain_and_the_amended_eval(cli, small_run_copy):
    pytest.importorskip("starlette")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    from veritrain.web.server import create_app

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    assert cli("eval", run_dir.name, "--split", "val", "--workdir", str(workdir)).code == 0
    link = read_record(run_dir).amendments[-1]
    client = TestClient(create_app(Workspace.open(workdir)), base_url="http://127.0.0.1:8765")
    html = client.get(f"/runs/{run_dir.name}").text
    assert "amendment 0001" in html and link.seal in html and "gives metrics.val" in html and small_run_copy.seal in html
    assert 'id="provenance"><code>provenance.intoto.jsonl</code>, unsigned' in html  # words, not a raw object
    image = f"runs/{run_dir.name}/amendments/0001/files/eval/val/confusion_matrix.png"
    assert image in html and client.get(f"/files/{image}").status_code == 200


def test_a_staging_folder_that_is_a_link_is_refused(small_run_copy, tmp_path):
    from veritrain.core.errors import UserError

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    (tmp_path / "elsewhere").mkdir()
    (workdir / ".veritrain" / amendments.STAGING_DIR).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="a link, not a folder"):
        amend(workdir, run_dir, test={"accuracy": 1.0})
    assert not list((tmp_path / "elsewhere").iterdir()) and not (run_dir / amendments.AMENDMENTS_DIR).exists()
