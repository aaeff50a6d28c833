"""Checkpoints kept for audit (checkpoint.audit_every) through archive, import, gc, check and the run page:
an archive leaves them out unless --with-audit and says so, the import still verifies, a listing that would
excuse any other missing file is refused, gc keeps them and keeps the record's `kept` flags true to the
files, check counts the auditable segments, and the run page shows the trajectory and the audits."""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
import warnings
from pathlib import Path

import pytest

from veritrain.records.record import read_record

from conftest import in_process_run, veritrain
from veritrain.trust import archive
from veritrain.records.workspace import Workspace

# 2 epochs of 23 steps, a checkpoint every 10 steps and at each epoch's end: entries at steps
# 0, 10, 20, 23, 30, 40, 46 (6 segments). audit_every=2 keeps entries 2, 4, 6 (steps 20, 30, 46) for
# audit; keep_last=2 keeps steps 40 and 46; so steps 20 and 30 are kept only for audit.
AUDITED = ["train.epochs=2", "model.name=mlp", "model.hidden=[16]", "export.formats=[onnx]",
           "checkpoint.every_steps=10", "checkpoint.audit_every=2"]
STEPS = [0, 10, 20, 23, 30, 40, 46]
AUDIT_ONLY = ["checkpoints/step-20.pt", "checkpoints/step-30.pt"]
AUDIT_ONLY_FILES = sorted([*AUDIT_ONLY, *(name + ".sha256" for name in AUDIT_ONLY)])


def record_of(run_dir: Path) -> dict:
    """The run as its amendments leave it (what every reader sees)."""
    from veritrain.records.record import read_record, thawed

    return thawed(read_record(run_dir))


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """One run with audit checkpoints, and its archive made without --with-audit (through the CLI, for its --json)."""
    workdir = tmp_path_factory.mktemp("audited")
    outcome = in_process_run(workdir, AUDITED)
    run_dir = Path(outcome.summary["run_dir"])
    assert [e["step"] for e in record_of(run_dir)["trajectory"]] == STEPS
    out = tmp_path_factory.mktemp("archives") / "run.tar.gz"
    made = veritrain("archive", run_dir.name, "-o", str(out), "--json", "--workdir", str(workdir))
    assert made.code == 0, made.stderr
    return {"workdir": workdir, "run_dir": run_dir, "archive": out, "made": made.json()}


def names_in(path: Path) -> set[str]:
    with tarfile.open(path, "r:gz") as tar:
        return {member.name for member in tar.getmembers()}


def test_archive_leaves_out_audit_only_checkpoints_and_the_import_verifies(audited, tmp_path):
    from veritrain.trust.check import check_run
    from veritrain.trust.verify import omitted_for_audit, verify_run

    run_dir, run = audited["run_dir"], audited["run_dir"].name
    assert audited["made"]["left_out"] == AUDIT_ONLY_FILES and audited["made"]["with_audit"] is False
    members = names_in(audited["archive"])
    assert not {f"runs/{run}/{name}" for name in AUDIT_ONLY_FILES} & members
    assert {f"runs/{run}/checkpoints/{name}" for name in ("best.pt", "last.pt", "step-40.pt", "step-46.pt", "step-46.pt.sha256")} <= members
    assert f"runs/{run}/archive_omitted.json" in members
    # archive and verify agree on what may be left out: verify, given a listing of every step file, excuses exactly these
    record = record_of(run_dir)
    assert archive.audit_only_checkpoints(record) == AUDIT_ONLY
    scratch = tmp_path / "listing"
    scratch.mkdir()
    (scratch / "archive_omitted.json").write_text(json.dumps({"files": [f"checkpoints/step-{s}.pt" for s in STEPS] + ["checkpoints/best.pt"]}))
    assert omitted_for_audit(scratch, record) == set(AUDIT_ONLY_FILES)

    target = Workspace.open(tmp_path / "elsewhere")
    imported = archive.import_archive(audited["archive"], target)
    assert imported["left_out"] == AUDIT_ONLY_FILES
    copy = target.runs_dir / run
    assert not any((copy / name).exists() for name in AUDIT_ONLY_FILES) and (copy / "checkpoints" / "step-40.pt").is_file()
    assert json.loads((copy / "archive_omitted.json").read_text())["files"] == AUDIT_ONLY
    verified = verify_run(copy, target.state_dir, rehash_data=False)
    assert verified["ok"], verified["problems"]
    assert verified["seal"] == (run_dir / "record.sha256").read_text().strip()
    # imported without its data version: no replay can run here, and the row says what to bring
    row = next(i for i in check_run(copy, target.state_dir, verified)["items"] if i["id"] == "auditable")
    assert row["status"] == "missing" and "the data version" in row["detail"] and "--with-data" in row["fix"]
    # the imported run archives again (the same files left out), but not --with-audit: it has not got them
    again = archive.create(copy, target.state_dir, tmp_path / "again.tar.gz", with_data=False)
    assert again["left_out"] == AUDIT_ONLY_FILES
    refused = veritrain("archive", run, "-o", str(tmp_path / "all.tar.gz"), "--with-audit", "--workdir", str(target.root))
    assert refused.code == 2 and refused.stderr.startswith("error: --with-audit: 4 file(s) of") and len(refused.stderr.strip().splitlines()) == 1


def test_with_audit_includes_every_file(audited, tmp_path):
    run_dir = audited["run_dir"]
    out = tmp_path / "all.tar.gz"
    made = archive.create(run_dir, audited["workdir"] / ".veritrain", out, with_data=False, with_audit=True)
    assert made["left_out"] == [] and made["with_audit"] is True
    members = names_in(out)
    assert {f"runs/{run_dir.name}/{rel}" for rel in record_of(run_dir)["artifacts"]} <= members
    assert f"runs/{run_dir.name}/archive_omitted.json" not in members
    target = Workspace.open(tmp_path / "t")
    assert archive.import_archive(out, target)["left_out"] == []
    assert not (target.runs_dir / run_dir.name / "archive_omitted.json").exists()


def relisted(audited, tmp_path: Path, listed: list[str], drop: list[str], listing: bytes | None = None, add: tuple[str, ...] = ()) -> Path:
    """The archive with the files in `drop` taken out, those in `add` put in from the run folder, and its
    archive_omitted.json replaced by one listing `listed`."""
    run = audited["run_dir"].name
    bad = tmp_path / "relisted.tar.gz"
    body = listing if listing is not None else json.dumps({"files": listed}).encode()
    with tarfile.open(audited["archive"], "r:gz") as source, tarfile.open(bad, "w:gz") as tar:
        for member in source.getmembers():
            rel = member.name.removeprefix(f"runs/{run}/")
            if rel in drop:
                continue
            data = body if rel == "archive_omitted.json" else source.extractfile(member).read()
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        for rel in add:
            tar.add(audited["run_dir"] / rel, arcname=f"runs/{run}/{rel}")
    return bad


@pytest.mark.parametrize("listed, drop, message, add", [
    (["checkpoints/best.pt"], ["checkpoints/best.pt", "checkpoints/best.pt.sha256"], "names 'checkpoints/best.pt', which the run's record does not keep only for audit", ()),
    (["metrics.jsonl"], ["metrics.jsonl"], "names 'metrics.jsonl', which the run's record does not keep only for audit", ()),
    (["checkpoints/step-46.pt"], ["checkpoints/step-46.pt", "checkpoints/step-46.pt.sha256"], "names 'checkpoints/step-46.pt'", ()),  # kept for audit, and by keep_last
    (["checkpoints/step-40.pt"], ["checkpoints/step-40.pt"], "names 'checkpoints/step-40.pt'", ()),  # kept by keep_last only
    ([], [], "names 'checkpoints/step-20.pt', which the archive holds", ("checkpoints/step-20.pt",)),
])
def test_a_listing_that_excuses_any_other_file_is_refused(audited, tmp_path, listed, drop, message, add):
    bad = relisted(audited, tmp_path, [*AUDIT_ONLY, *listed], drop, add=add)
    target = Workspace.open(tmp_path / "t")
    with pytest.raises(Exception) as refused:
        archive.import_archive(bad, target)
    assert message in str(refused.value) and str(refused.value).startswith("import: refused ")
    assert not (target.runs_dir / audited["run_dir"].name).exists()


def test_a_hostile_listing_fails_in_one_line_through_the_cli_and_verify_never_excuses_best(audited, tmp_path):
    from veritrain.trust.verify import verify_run

    bad = relisted(audited, tmp_path, [*AUDIT_ONLY, "checkpoints/best.pt"], ["checkpoints/best.pt", "checkpoints/best.pt.sha256"])
    result = veritrain("import", str(bad), "--workdir", str(tmp_path / "t"))
    assert result.code == 1 and result.stderr.startswith("error: import: refused ") and "archive_omitted.json names 'checkpoints/best.pt'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "t" / "runs").exists()
    shaped = relisted(audited, tmp_path, [], [], listing=b'{"files": "checkpoints/best.pt"}')
    with pytest.raises(Exception, match="is not .*as `veritrain archive` writes it"):
        archive.import_archive(shaped, Workspace.open(tmp_path / "u"))
    # a listing written into a run folder by hand excuses no best.pt either
    target = Workspace.open(tmp_path / "v")
    copy = Path(archive.import_archive(audited["archive"], target)["run_dir"])
    (copy / "archive_omitted.json").write_text(json.dumps({"files": [*AUDIT_ONLY, "checkpoints/best.pt"]}))
    (copy / "checkpoints" / "best.pt").unlink()
    problems = verify_run(copy, target.state_dir, rehash_data=False)["problems"]
    assert {"path": "checkpoints/best.pt", "kind": "missing", "detail": ""} in problems


def test_gc_keeps_audit_checkpoints_and_the_kept_flags(audited, tmp_path):
    from veritrain.orchestration import housekeeping
    from veritrain.trust.verify import verify_run

    shutil.copytree(audited["workdir"], tmp_path / "ws")
    workspace = Workspace.open(tmp_path / "ws")
    run_dir = workspace.runs_dir / audited["run_dir"].name
    expected = [f"runs/{run_dir.name}/checkpoints/step-40.pt", f"runs/{run_dir.name}/checkpoints/step-40.pt.sha256"]
    planned = housekeeping.gc(workspace, dry_run=True)
    assert planned["removed"] == expected and planned["resealed"] == [run_dir.name]
    done = housekeeping.gc(workspace, dry_run=False)
    assert done["removed"] == expected and not done["unverified"]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*.pt")) == ["step-20.pt", "step-30.pt", "step-46.pt"]
    record = record_of(run_dir)
    for entry in record["trajectory"][1:]:
        assert entry["kept"] == (run_dir / "checkpoints" / f"step-{entry['step']}.pt").is_file(), entry["step"]
    assert record["events"][-1]["kind"] == "gc" and read_record(run_dir).amendments[-1].by == "gc"
    assert verify_run(run_dir, workspace.state_dir, rehash_data=False)["ok"]
    assert housekeeping.gc(workspace, dry_run=False)["removed"] == []  # the audit checkpoints stay for good

    # a run imported without its audit-only checkpoints: gc keeps the newest keep_last too, so it still verifies
    elsewhere = Workspace.open(tmp_path / "elsewhere")
    copy = Path(archive.import_archive(audited["archive"], elsewhere)["run_dir"])
    assert housekeeping.gc(elsewhere, dry_run=False)["removed"] == []
    assert verify_run(copy, elsewhere.state_dir, rehash_data=False)["ok"]


def test_check_counts_auditable_segments(audited):
    from veritrain.trust.assessment import replayability
    from veritrain.trust.check import check_run

    run_dir = audited["run_dir"]
    row = next(i for i in check_run(run_dir, audited["workdir"] / ".veritrain")["items"] if i["id"] == "auditable")
    # starts: the initial state and steps 20, 30, 40, 46 (step files here); segment 2 (10 → 20) replays from step 0
    assert row == {"id": "auditable", "item": "audit: auditable segments", "status": "pass",
                   "detail": "all 6 segments auditable; the longest replay a segment needs: 2 segment(s), 20 steps", "fix": None}
    record = record_of(run_dir)
    state_dir = audited["workdir"] / ".veritrain"
    plain = {**record, "trajectory": [{**e, "kept_for_audit": False} for e in record["trajectory"]]}
    facts = replayability(run_dir, plain, state_dir)  # flags that disagree with audit_every 2
    assert facts.status == "broken" and "kept_for_audit False, but checkpoint.audit_every 2 keeps it" in facts.reason
    for older in ({**record, "trajectory": None}, {k: v for k, v in record.items() if k != "trajectory"}):
        assert replayability(run_dir, older, state_dir).status == "n/a"


def test_run_page_shows_the_trajectory_and_the_audits(audited, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    from veritrain.trust import audit
    from veritrain.web.publish import publish
    from veritrain.web.server import create_app

    workspace = Workspace.open(audited["workdir"])
    run = audited["run_dir"].name
    result = audit.run(workspace, run, segments=1, seed=7)
    assert result["verdict"] == "identical"
    forged = {**result, "audited_at": "2999-01-01T00:00:00.000+00:00", "seed": 8, "verdict": "differs",
              "segments": [{"segment": 3, "from_step": 20, "to_step": 23, "epoch": 1, "verdict": "differs", "detail": "<script>alert(1)</script>"}]}
    (workspace.state_dir / "audits" / run / "29990101T000000-000008.json").write_text(json.dumps(forged))
    html = TestClient(create_app(workspace), base_url="http://127.0.0.1:8765").get(f"/runs/{run}").text
    section = html[html.index('<div id="trajectory">'):html.index('<div id="events">')]
    assert "6 of 6 segments auditable; 3 checkpoint(s) kept for audit" in section and "auditable from step 0" in section
    assert len(re.findall(r'<tr data-step="', section)) == len(STEPS)
    assert section.count("kept for audit</td>") == 3 and '<tr data-step="23" class=" segment-differs">' in section
    audits = re.findall(r'<tr class="audit verdict-row-(\w+)">.*?<code>(\d+)</code>', section)
    assert audits == [("differs", "8"), ("identical", "7")]  # newest first
    assert "<script>alert" not in section and "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    assert f"veritrain audit {run} --segments 1 --seed 7" in section
    published = publish(workspace, [audited["run_dir"]], tmp_path / "site")
    page = (tmp_path / "site" / "runs" / f"{run}.html").read_text(encoding="utf-8")
    assert published["runs"] == [run] and '<table id="trajectory-table">' in page and '<table id="audits-table">' in page
