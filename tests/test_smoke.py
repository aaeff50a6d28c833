"""The smoke test: every stage on a tiny slice, cached per config/data/code, run before `veritrain run`."""

from __future__ import annotations

import json
from pathlib import Path

FAST = ["--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "model.hidden=[16]", "--set", "export.formats=[onnx]"]


def test_smoke_passes_every_stage(cli, tmp_path):
    result = cli("smoke", *FAST, "--workdir", str(tmp_path), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert set(payload["checks"]) == {"train", "checkpoint_resume", "eval", "export_parity"}
    assert all(c["passed"] for c in payload["checks"].values())
    folder = Path(payload["folder"])
    assert folder.parent == tmp_path / ".veritrain" / "smoke"
    record = json.loads((folder / "record.json").read_text())
    assert record["kind"] == "smoke" and record["status"] == "completed"
    assert cli("verify", str(folder), "--workdir", str(tmp_path)).code in (0, 1)  # sealed like a run
    assert not (tmp_path / "runs").exists()  # smoke runs stay out of runs/


def test_run_smokes_first_then_reuses_and_records_it(cli, tmp_path):
    first = cli("run", *FAST, "--workdir", str(tmp_path), "--json")
    assert first.code == 0, first.stderr
    assert "smoke: a tiny slice through every stage first" in first.stderr
    second = cli("run", *FAST, "--workdir", str(tmp_path), "--json")
    assert "smoke: passed before" in second.stderr
    records = [json.loads((Path(r.json()["run_dir"]) / "record.json").read_text()) for r in (first, second)]
    assert records[0]["smoke"]["cached"] is False and records[1]["smoke"]["cached"] is True
    assert records[0]["smoke"]["key"] == records[1]["smoke"]["key"]
    skipped = cli("run", *FAST, "--no-smoke", "--workdir", str(tmp_path), "--json")
    assert json.loads((Path(skipped.json()["run_dir"]) / "record.json").read_text())["smoke"] == {"status": "skipped"}


def test_failing_smoke_stops_before_the_run(cli, tmp_path):
    result = cli("run", *FAST, "--set", "optim.name=sgd", "--set", "optim.lr=1e30", "--set", "train.on_nonfinite=stop",
                 "--workdir", str(tmp_path))
    assert result.code == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: smoke: ")
    assert not (tmp_path / "runs").exists()


def test_check_passes_on_a_plain_run_and_names_the_fix_when_something_is_missing(cli, default_run_copy):
    tmp_path, run_id = default_run_copy.workdir, default_run_copy.run_dir.name  # `veritrain run` of the plain default config
    result = cli("check", run_id, "--workdir", str(tmp_path), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["ok"] and len(payload["items"]) >= 14 and all(i["status"] == "pass" for i in payload["items"] if i["id"] != "provenance_signed")
    assert {i["id"]: i["status"] for i in payload["items"]}["provenance_signed"] == "n/a"  # no signing key in the tests: unsigned, said so
    skipped = cli("run", *FAST, "--no-smoke", "--set", "eval.baselines=false", "--workdir", str(tmp_path), "--json").json()["run_id"]
    result = cli("check", skipped, "--workdir", str(tmp_path), "--json")
    assert result.code == 1
    items = {i["item"]: i for i in result.json()["items"]}
    assert items["environment: smoke test passed for this config"]["status"] == "missing"
    assert items["environment: smoke test passed for this config"]["fix"] == f"veritrain smoke {(tmp_path / 'runs' / skipped / 'config.yaml').resolve()}"
    assert items["environment: baseline on the same splits"]["fix"] == f"veritrain baseline {skipped}"
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: check {skipped}: 3 item(s) not passed")


def test_uncommitted_changes_are_never_vouched_for_by_an_earlier_smoke(cli, tmp_path):
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "model.py").write_text("WIDTH = 16\n")
    git("add", "model.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "model")
    (tmp_path / "model.py").write_text("WIDTH = 32\n")  # the same commit, other code
    runs = [cli("run", *FAST, "--workdir", str(tmp_path), "--json") for _ in range(2)]
    assert all(r.code == 0 for r in runs), runs[-1].stderr
    assert "uncommitted changes" in runs[1].stderr and "passed before" not in runs[1].stderr
    record = json.loads((Path(runs[1].json()["run_dir"]) / "record.json").read_text())
    assert record["smoke"]["cached"] is False
