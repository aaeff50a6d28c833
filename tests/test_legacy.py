"""Runs made by an earlier veritrain (tests/fixtures/legacy, see its README) keep verifying,
reproducing and resuming with this one, with the data version their old recipe prepared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import veritrain_process

from veritrain.data.identity import FORMAT_VERSION
from veritrain.records.record import RECORD_FORMAT

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
COMPLETED = "20261130-064052-598-fd2b78"
INTERRUPTED = "20261130-064101-650-a3203a"


def imported(cli, workdir: Path, archive: str) -> dict:
    result = cli("import", str(LEGACY / archive), "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    return result.json()


def test_a_completed_run_of_the_previous_code_verifies_and_reproduces_identically(cli, tmp_path):
    info = imported(cli, tmp_path, "legacy-completed.tar.gz")
    assert info["run_id"] == COMPLETED
    recorded = json.loads((tmp_path / "runs" / COMPLETED / "record.json").read_text())
    verified = cli("verify", COMPLETED, "--workdir", str(tmp_path), "--json")
    assert verified.code == 0, verified.stdout + verified.stderr
    assert verified.json()["ok"] and not verified.json()["problems"]
    assert verified.json()["format"]["effective"] == 0  # made before records named their format, and judged as such
    assert "judged under record format 0" in cli("verify", COMPLETED, "--workdir", str(tmp_path)).stdout

    checked = {i["item"]: i for i in cli("check", COMPLETED, "--workdir", str(tmp_path), "--json").json()["items"]}
    skew_row = checked["data: achieved split follows the ratios (no split_skew)"]
    assert skew_row["status"] == "missing" and "earlier data recipe" in skew_row["detail"]
    assert checked["archive: data, config, logs and model present and verified"]["status"] == "pass"

    reproduced = cli("reproduce", COMPLETED, "--workdir", str(tmp_path), "--json")
    comparison = reproduced.json()
    checks = {c["what"].split(" (")[0]: c for c in comparison["checks"]}
    if checks["metrics.jsonl"]["verdict"] == "within tolerance":
        # every epoch's metrics within 1e-6 but not bit-equal: another kind of CPU than the one that made the fixture
        # (bit-identity is promised on the same kind of machine); the record's compatibility was checked above
        pytest.skip(f"this machine's kernels round unlike the fixture's: {checks['metrics.jsonl'].get('first_divergence')}")
    assert reproduced.code == 0, reproduced.stderr
    assert checks["final_state_sha256"]["verdict"] == "identical" and checks["metrics.jsonl"]["verdict"] == "identical", comparison
    # evaluation now sums exactly in float64 where that veritrain summed in float32: its final metrics match within tolerance
    assert all(c["verdict"] in ("identical", "within tolerance") for what, c in checks.items() if what.startswith("metrics.")), comparison
    new_run = tmp_path / "runs" / comparison["reproduction"]
    new_record = json.loads((new_run / "record.json").read_text())
    assert new_record["data"]["version"] == recorded["data"]["version"]  # the old recipe's version, reused
    assert new_record["final_state_sha256"] == recorded["final_state_sha256"]


def test_an_interrupted_run_of_the_previous_code_resumes_to_completion(cli, tmp_path):
    imported(cli, tmp_path, "legacy-interrupted.tar.gz")
    before = json.loads((tmp_path / "runs" / INTERRUPTED / "record.json").read_text())
    assert before["status"] == "interrupted"
    resumed = cli("train", "--resume", INTERRUPTED, "--workdir", str(tmp_path), "--json")
    assert resumed.code == 0, resumed.stderr
    after = json.loads((tmp_path / "runs" / INTERRUPTED / "record.json").read_text())
    assert after["status"] == "completed"
    assert after["data"]["version"] == before["data"]["version"]
    assert len((tmp_path / "runs" / INTERRUPTED / "metrics.jsonl").read_text().splitlines()) == 30
    verified = cli("verify", INTERRUPTED, "--workdir", str(tmp_path), "--json")
    assert verified.code == 0, verified.stdout

    # a new run of the same config prepares with today's recipe, to a new version; the old run kept its own
    fresh = cli("train", str(tmp_path / "runs" / INTERRUPTED / "config.yaml"), "--set", "train.epochs=1", "--workdir", str(tmp_path), "--json")
    assert fresh.code == 0, fresh.stderr
    fresh_record = json.loads((Path(fresh.json()["run_dir"]) / "record.json").read_text())
    assert fresh_record["data"]["recipe"] == FORMAT_VERSION and fresh_record["data"]["version"] != after["data"]["version"]
    assert after["data"]["recipe"] == 2


def test_a_run_of_the_previous_code_without_its_stored_version_says_what_to_bring(cli, tmp_path):
    imported(cli, tmp_path, "legacy-completed.tar.gz")
    import shutil

    recorded = json.loads((tmp_path / "runs" / COMPLETED / "record.json").read_text())["data"]["version"]
    shutil.rmtree(tmp_path / ".veritrain" / "data" / recorded)
    result = cli("reproduce", COMPLETED, "--workdir", str(tmp_path))
    assert result.code == 2
    (line,) = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert "an earlier data recipe" in line and "--with-data" in line


REDACTED_COMPLETED = "20261201-094118-928-779001"
REDACTED_INTERRUPTED = "20261201-094140-540-259ab6"


def refusal(result) -> str:
    assert result.code == 2, result.stdout + result.stderr
    (line,) = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    return line


@pytest.mark.slow  # two imports and five commands: compatibility, checked in `make test-slow`
def test_runs_whose_config_was_recorded_with_stars_verify_but_are_not_rebuilt(cli, tmp_path):
    # the previous veritrain recorded model.kwargs max_tokens and key_dim as "***": the run is still what its seal
    # says, but its model cannot be built again from the record, so nothing pretends to (exit 2, the keys named),
    # whether or not its code is trusted
    completed, interrupted = tmp_path / "completed", tmp_path / "interrupted"
    imported(cli, completed, "redacted-kwargs-completed.tar.gz")
    imported(cli, interrupted, "redacted-kwargs-interrupted.tar.gz")
    for workdir, run in ((completed, REDACTED_COMPLETED), (interrupted, REDACTED_INTERRUPTED)):
        verified = cli("verify", run, "--workdir", str(workdir), "--json")
        assert verified.code == 0 and verified.json()["ok"], verified.stdout + verified.stderr
        assert verified.json()["format"]["effective"] == 0
    for trust in ((), ("--trust-code",)):
        for command in (["reproduce", REDACTED_COMPLETED, "--workdir", str(completed)],
                        ["train", "--resume", REDACTED_INTERRUPTED, "--workdir", str(interrupted)],
                        ["eval", REDACTED_COMPLETED, "--workdir", str(completed)]):
            line = refusal((veritrain_process if trust else cli)(*command, *trust))  # trusted: could import the run's code
            assert "model.kwargs.key_dim, model.kwargs.max_tokens: recorded as \"***\" by an earlier veritrain" in line, line
    assert len(list((completed / "runs").iterdir())) == 1  # reproduce started no run
    after = json.loads((interrupted / "runs" / REDACTED_INTERRUPTED / "record.json").read_text())
    assert after["status"] == "interrupted" and not after.get("resumes")


@pytest.mark.parametrize("archive, run_id", [
    ("trajectory-completed.tar.gz", "20261201-094044-364-7c21c2"), ("trajectory-resumed.tar.gz", "20261201-094204-361-6d6672")])
@pytest.mark.slow  # an import and a full audit each: compatibility, checked in `make test-slow`
def test_a_run_with_a_trajectory_of_the_previous_code_verifies_and_audits_and_says_what_was_not_checked(cli, tmp_path, archive, run_id):
    """Made before results named their trajectory entry: the keep rule, best.pt's and last.pt's entries and the chain
    hold and are checked; the results' entries are not, and verify, check and audit say so. The second run was
    interrupted by a signal (a timing save at step 51), resumed, then evaluated and exported."""
    imported(cli, tmp_path, archive)
    verified = cli("verify", run_id, "--workdir", str(tmp_path), "--json")
    assert verified.code == 0, verified.stdout + verified.stderr
    assert verified.json()["format"] == {"declared": 0, "witnessed": 0, "witnesses": [], "effective": 0, "minimum": 0, "current": RECORD_FORMAT,
                                         "unchecked": list(verified.json()["format"]["unchecked"])}
    assert "each result's trajectory entry" in verified.json()["format"]["unchecked"]
    not_checked = [n["check"] for n in verified.json()["not_checked"]]
    assert "metrics.test from the trajectory" in not_checked and "export from the trajectory" in not_checked
    row = next(i for i in cli("check", run_id, "--workdir", str(tmp_path), "--json").json()["items"] if i["id"] == "results_from_trajectory")
    assert row["status"] == "n/a" and row["detail"].startswith("not checked: metrics.test, export name no trajectory entry")
    audited = cli("audit", run_id, "--segments", "100", "--workdir", str(tmp_path), "--json")
    result = audited.json()
    if audited.code == 2 and "this machine cannot replay the run exactly" in audited.stderr:
        # audit refuses by design on another kind of CPU than the recorded one (kernels may round differently)
        pytest.skip(f"this machine is not the kind the fixture was made on: {audited.stderr.strip().splitlines()[-1]}")
    if result.get("segments") and result["segments"][0]["verdict"] != "identical":
        # even the first steps from the initial state differ: this machine's kernels round unlike the one that made
        # the fixture (bit-exact replay is promised on the same kind of machine); nothing here is a forgery verdict
        pytest.skip(f"this machine replays the fixture's first segment differently: {result['segments'][0].get('detail')}")
    assert audited.code == 0, audited.stdout + audited.stderr
    assert result["verdict"] == "identical" and result["segments_audited"] == result["segments_total"]
    assert [(r["what"], r["verdict"]) for r in result["results"]] == [("baselines", "unchecked")]  # fitted by that veritrain
    assert "not checked: metrics.test from the trajectory" in audited.stderr
