"""`veritrain.start` end to end (docs/api.md): a user's own training script (tests/scripts/tiny_loop.py) run as the
user runs it, then verified, reproduced, audited, killed and resumed; each guarantee level tried with every command
that could claim more than it. The pure parts are tests/test_userloop_units.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, veritrain

SCRIPT = ROOT / "tests" / "scripts" / "tiny_loop.py"


@dataclass
class Place:
    """A working directory with the script and its data: the workspace is the same folder."""

    root: Path

    @property
    def script(self) -> Path:
        return self.root / "tiny_loop.py"

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(self.script), *args], cwd=self.root, capture_output=True, text=True,
                              env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}, timeout=300)

    def record(self, run_id: str) -> dict:
        return json.loads((self.root / "runs" / run_id / "record.json").read_text())


def make_place(root: Path) -> Place:
    (root / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5)
    np.savetxt(root / "data" / "train.csv", np.column_stack([x, y]), delimiter=",", fmt="%.6f")
    shutil.copyfile(SCRIPT, root / "tiny_loop.py")
    return Place(root)


def run_id_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-2]


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Place:
    return make_place(tmp_path_factory.mktemp("own"))


@pytest.fixture(scope="module")
def own_run(place) -> str:
    """One replayable run of the script, made as the user makes it."""
    return run_id_of(place.run())


def test_a_run_records_the_config_script_inputs_and_trajectory_and_verifies(place, own_run):
    record = place.record(own_run)
    assert record["kind"] == "script" and record["status"] == "completed"
    assert record["guarantee"] == {"level": "replayable", "reasons": []}
    assert record["config"] == {"epochs": 2, "lr": 0.1, "seed": 0, "own_order": False}
    script = record["script"]
    assert script["file"] == "code/script/tiny_loop.py" and script["path"] == str(place.script)
    assert (place.root / "runs" / own_run / script["file"]).read_bytes() == place.script.read_bytes()
    assert script["argv"] == [str(place.script)] and script["cwd"] == str(place.root) and not script["reads_file"]
    assert record["inputs"]["paths"] == ["data/train.csv"] and record["inputs"]["files"] == 1
    steps = [entry["step"] for entry in record["trajectory"]]
    assert steps == [0, 3, 6, 9, 12]  # the initial state, every 3 steps, and the final state (step 12) once
    assert record["training"]["steps"] == 12 and record["final_state_sha256"] == record["trajectory"][-1]["model_sha256"]
    assert record["metrics"]["final"]["trajectory_entry"]["index"] == 4
    rows = [json.loads(line) for line in (place.root / "runs" / own_run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(12))
    done = veritrain("verify", own_run, "--json", cwd=place.root)
    assert done.code == 0, done.stdout
    assert "1 input file(s)" in done.json()["raw_data"]


def test_the_example_of_docs_api_md_runs_replayable_and_verifies(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "own_loop.py"), "--epochs", "1", "--workdir", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    run_id, level = done.stdout.split()[-2:]
    assert level == "replayable"
    assert veritrain("verify", run_id, "--workdir", str(tmp_path)).code == 0


def test_one_changed_byte_of_an_input_or_of_the_recorded_script_fails_verify(place, own_run):
    for path, named in ((place.root / "data" / "train.csv", "data/train.csv"),
                        (place.root / "runs" / own_run / "code" / "script" / "tiny_loop.py", "code/script/tiny_loop.py")):
        content = path.read_bytes()
        path.write_bytes(content[:10] + bytes([content[10] ^ 1]) + content[11:])
        try:
            done = veritrain("verify", own_run, "--json", cwd=place.root)
        finally:
            path.write_bytes(content)
        assert done.code == 1
        assert [p["path"] for p in done.json()["problems"]] == [named], done.stdout
    assert veritrain("verify", own_run, cwd=place.root).code == 0


def test_reproduce_replays_the_recorded_copy_and_names_an_edited_working_copy(place, own_run):
    original = place.script.read_text()
    place.script.write_text(original.replace("loss = loss * 1.01", "loss = loss * 1.5"))  # an edit after the run
    try:
        done = veritrain("reproduce", own_run, "--json", cwd=place.root)
    finally:
        place.script.write_text(original)
    assert done.code == 0, done.stderr
    assert done.json()["verdict"] == "identical"
    edited = [line for line in done.stderr.splitlines() if "differs from the copy recorded" in line]
    assert len(edited) == 1 and "tiny_loop.py" in edited[0] and "line" in edited[0], done.stderr
    new = done.json()["reproduction"]
    assert place.record(new)["reproduced_from"] == own_run


def test_audit_replays_segments_identically_and_finds_a_training_that_differs(place, own_run):
    os.environ["TINY_NOISE"] = "1"  # not the run's: the replay's environment is built from nothing but the recorded variables
    try:
        done = veritrain("audit", own_run, "--segments", "2", "--seed", "5", "--json", cwd=place.root)
    finally:
        del os.environ["TINY_NOISE"]
    assert done.code == 0, done.stderr
    result = done.json()
    assert result["verdict"] == "identical" and result["segments_audited"] >= 2
    assert {s["verdict"] for s in result["segments"]} == {"identical"}
    # the metrics passed to run.finish, re-derived by replaying on to it
    assert [(r["what"], r["verdict"]) for r in result["results"]] == [("metrics.final", "identical")]
    assert not list((place.root / "runs" / own_run).glob("**/*.tmp"))
    assert veritrain("verify", own_run, cwd=place.root).code == 0  # the audit wrote nothing into the run
    (place.root / "TINY_NOISE").touch()  # the replayed script now trains differently (it reads a file it names by path)
    try:
        differs = veritrain("audit", own_run, "--segments", "1", "--seed", "5", "--json", cwd=place.root)
    finally:
        (place.root / "TINY_NOISE").unlink()
    assert differs.code == 1 and differs.json()["verdict"] == "differs", differs.stdout


def test_kill_9_then_both_ways_of_continuing_end_bit_identical(place, own_run):
    killed = place.run(env={"TINY_KILL_AT": "4"})
    assert killed.returncode == -signal.SIGKILL
    run_id = sorted((place.root / "runs").iterdir())[-1].name
    assert place.record(run_id)["status"] == "running"
    new = place.run()  # resume=None: a new run, and one line names the interrupted one; two runs end in the same state
    assert f"run {run_id} of this script and config was interrupted" in new.stderr
    assert place.record(run_id_of(new))["final_state_sha256"] == place.record(own_run)["final_state_sha256"]
    again = place.run("--resume", "auto", env={"TINY_KILL_AT": "8"})  # continues the killed run, and is killed again
    assert again.returncode == -signal.SIGKILL, again.stderr
    assert f"run {run_id}: resuming from checkpoints/step-3.pt" in again.stderr
    done = veritrain("train", "--resume", run_id, cwd=place.root)  # the recorded command, with the recorded code
    assert done.code == 0, done.stderr
    resumed, original = place.record(run_id), place.record(own_run)
    assert resumed["status"] == "completed" and len(resumed["resumes"]) == 2
    assert resumed["final_state_sha256"] == original["final_state_sha256"]
    assert [e["chain"] for e in resumed["trajectory"]] == [e["chain"] for e in original["trajectory"]]
    assert (place.root / "runs" / run_id / "metrics.jsonl").read_text() == (place.root / "runs" / own_run / "metrics.jsonl").read_text()
    assert veritrain("verify", run_id, cwd=place.root).code == 0


@pytest.mark.slow  # several processes
def test_batches_a_script_builds_in_workers_are_the_same_for_any_number_of_them(tmp_path):
    """run.batches(build=..., num_workers=N): each batch (rows, and noise from run.generator(step)) is built ahead in N
    worker processes; the final state is the same for 0, 1 and 2, and the run verifies."""
    place = make_place(tmp_path)
    finals = set()
    for workers in ("0", "1", "2"):
        run_id = run_id_of(place.run("--workers", workers))
        finals.add(place.record(run_id)["final_state_sha256"])
    assert len(finals) == 1
    assert veritrain("verify", run_id, "--workdir", str(place.root)).code == 0
    assert place.record(run_id_of(place.run()))["final_state_sha256"] not in finals  # without the noise: another training


def test_a_script_whose_loss_turns_nonfinite_rolls_back_and_continues_as_the_built_in_loop_does(place):
    done = place.run("--guard", "rollback", "--nan-at", "3")
    run_id = run_id_of(done)
    record = place.record(run_id)
    assert record["status"] == "completed" and record["script"]["guard"]["on_nonfinite"] == "rollback"
    rollbacks = [e for e in record["events"] if e["kind"] == "rollback"]
    # the loss of step 3 was NaN: back to the checkpoint after step 2 (3 steps trained), every learning rate halved
    assert len(rollbacks) == 1 and rollbacks[0]["step"] == 4 and "restored step 3, lr × 0.5" in rollbacks[0]["detail"], record["events"]
    rows = [json.loads(line) for line in (place.root / "runs" / run_id / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(12)) and all(np.isfinite(row["loss"]) for row in rows)
    # the replay meets the same NaN and rolls back alike: every segment identical
    audit = veritrain("audit", run_id, "--segments", "6", "--json", cwd=place.root)
    assert audit.code == 0 and audit.json()["verdict"] == "identical", audit.stdout
    # killed after the rollback and resumed: the same run, bit for bit (the rollback count is in the checkpoint)
    killed = place.run("--guard", "rollback", "--nan-at", "3", env={"TINY_KILL_AT": "7"})
    assert killed.returncode == -signal.SIGKILL
    killed_id = sorted((place.root / "runs").iterdir())[-1].name
    assert veritrain("train", "--resume", killed_id, cwd=place.root).code == 0
    assert place.record(killed_id)["final_state_sha256"] == record["final_state_sha256"]
    # the other policies: a skipped batch, and a stop that fails the run with one line
    skipped = place.record(run_id_of(place.run("--guard", "skip_batch", "--nan-at", "3")))
    assert [e["kind"] for e in skipped["events"] if e["kind"] != "resume"] == ["skip_batch"]
    stopped = place.run("--guard", "stop", "--nan-at", "3")
    assert stopped.returncode == 1 and "loss became nan at step 4" in stopped.stderr and "Traceback" not in stopped.stderr


def test_sigterm_ends_the_run_interrupted_with_exit_143_and_it_resumes(place, own_run):
    proc = subprocess.Popen([sys.executable, str(place.script)], cwd=place.root, env={**os.environ, "TINY_PAUSE_AT": "5"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = place.root / "paused"
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    marker.unlink()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    run_id = sorted((place.root / "runs").iterdir())[-1].name
    record = place.record(run_id)
    assert record["status"] == "interrupted" and record["error"]["type"] == "Interrupted"
    done = place.run("--resume", run_id)
    assert done.returncode == 0, done.stderr
    assert place.record(run_id)["final_state_sha256"] == place.record(own_run)["final_state_sha256"]


def test_resume_with_other_code_is_refused_naming_the_file_and_line(place):
    killed = place.run(env={"TINY_KILL_AT": "1"})
    assert killed.returncode == -signal.SIGKILL
    run_id = sorted((place.root / "runs").iterdir())[-1].name
    original = place.script.read_text()
    place.script.write_text(original.replace("nn.Dropout(0.2)", "nn.Dropout(0.3)"))
    try:
        done = place.run("--resume", run_id)
    finally:
        place.script.write_text(original)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "the code differs from the run's" in last and "tiny_loop.py: line" in last and "Dropout(0.3)" in last, last


def test_resume_with_another_config_is_refused_with_the_difference(place, own_run):
    done = place.run("--resume", own_run, "--lr", "0.2")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (f"error: vt.start: resume={own_run!r}: the config differs from the run's (lr: 0.1 → 0.2); "
                                                    "resume with the run's own config, or start a new run")


def test_a_veritrain_data_version_as_input_is_bound_verified_and_replayed(place):
    run_id = run_id_of(place.run("--vt-data"))
    record = place.record(run_id)
    assert record["guarantee"]["level"] == "replayable" and record["inputs"] is None
    version = record["data"]["version"]
    assert record["data"]["config"]["source"] == "digits" and record["trajectory"][-1]["chain"]
    assert (place.root / ".veritrain" / "data" / version / "version.json").is_file()
    verified = veritrain("verify", run_id, "--json", cwd=place.root)
    assert verified.code == 0 and "raw" in str(verified.json()["raw_data"]), verified.stdout
    reproduced = veritrain("reproduce", run_id, "--json", cwd=place.root)
    assert reproduced.code == 0 and reproduced.json()["verdict"] == "identical", reproduced.stderr
    info = place.root / ".veritrain" / "data" / version / "version.json"
    content = info.read_bytes()
    info.write_bytes(content.replace(b'"format"', b'"formaT"', 1))
    try:
        assert veritrain("verify", run_id, cwd=place.root).code == 1
    finally:
        info.write_bytes(content)


@pytest.fixture(scope="module")
def bound_run(place) -> str:
    return run_id_of(place.run("--own-order"))


@pytest.fixture(scope="module")
def logged_run(place) -> str:
    return run_id_of(place.run("--no-inputs"))


REASONS = {"bound": "run.batches was not used", "logged": "no inputs were bound"}


@pytest.mark.parametrize("level", ["bound", "logged"])
def test_a_run_below_replayable_verifies_and_reproduce_and_audit_refuse_with_the_reason(place, bound_run, logged_run, level):
    run_id = {"bound": bound_run, "logged": logged_run}[level]
    record = place.record(run_id)
    assert record["guarantee"]["level"] == level and any(REASONS[level] in r for r in record["guarantee"]["reasons"])
    assert [e["step"] for e in record["trajectory"]] == [0, 3, 6, 9, 12]  # checkpoints are hashed and committed all the same
    assert veritrain("verify", run_id, cwd=place.root).code == 0
    for command in ("reproduce", "audit"):
        done = veritrain(command, run_id, cwd=place.root)
        assert done.code == 2, (command, done.stdout, done.stderr)
        assert f"a {level} run, so {command} cannot replay it" in done.stderr and REASONS[level] in done.stderr


@pytest.mark.parametrize("level", ["replayable", "bound", "logged"])
def test_every_command_on_each_level_claims_no_more_than_it(place, own_run, bound_run, logged_run, level, tmp_path):
    from veritrain.records.workspace import Workspace
    from veritrain.web import views

    run_id = {"replayable": own_run, "bound": bound_run, "logged": logged_run}[level]
    shown = veritrain("runs", "show", run_id, cwd=place.root)
    assert shown.code == 0 and f"{level}:" in shown.stdout
    listed = veritrain("runs", "list", "--json", cwd=place.root).json()
    assert run_id in json.dumps(listed)
    compared = veritrain("runs", "compare", own_run, run_id, "--json", cwd=place.root)
    assert compared.code == 0 and run_id in compared.stdout
    rows = {row["id"]: row for row in veritrain("check", run_id, "--json", cwd=place.root).json()["items"]}
    assert rows["run_verifies"]["status"] == "pass"
    assert rows["auditable"]["status"] == ("pass" if level == "replayable" else "missing")
    if level != "replayable":
        assert f"a {level} run" in rows["auditable"]["detail"] and REASONS[level] in rows["auditable"]["detail"]
    assert rows["data_versioned"]["status"] == ("missing" if level == "logged" else "pass")
    not_applicable = [row for row in rows.values() if row["status"] == "n/a" and row["id"] != "provenance_signed"]  # unsigned: no key here
    assert len(not_applicable) == 10 and all(row["detail"].startswith("a script's run: ") for row in not_applicable)
    page = views.run_page(Workspace.open(place.root), run_id)
    assert page["guarantee"]["level"] == level and page["script"]["file"] == "code/script/tiny_loop.py"
    for command in ("eval", "export", "baseline"):
        done = veritrain(command, run_id, cwd=place.root)
        assert done.code == 2 and "is a script's run" in done.stderr, (command, done.stderr)
    site = tmp_path / "site"
    assert veritrain("publish", run_id, "--out", str(site), cwd=place.root).code == 0
    assert f'data-level="{level}"' in (site / "runs" / f"{run_id}.html").read_text()
    archive = tmp_path / "run.tar.gz"
    assert veritrain("archive", run_id, "--output", str(archive), cwd=place.root).code == 0
    elsewhere = tmp_path / "elsewhere"
    assert veritrain("import", str(archive), "--workdir", str(elsewhere)).code == 0
    assert veritrain("verify", run_id, "--workdir", str(elsewhere)).code == 0
    assert (elsewhere / "runs" / run_id / "code" / "script" / "tiny_loop.py").read_bytes() == place.script.read_bytes()
    refused = veritrain("reproduce", run_id, "--workdir", str(elsewhere))
    assert refused.code == 2
    assert ("--trust-code" if level == "replayable" else f"a {level} run") in refused.stderr, refused.stderr
    assert veritrain("gc", "--workdir", str(elsewhere)).code == 0
    assert veritrain("verify", run_id, "--workdir", str(elsewhere)).code == 0


def test_a_failure_ends_the_run_failed_with_its_traceback_in_the_log(place):
    done = place.run(env={"TINY_FAIL_AT": "2"})
    assert done.returncode == 1 and "RuntimeError: planted failure at step 2" in done.stderr
    run_id = sorted((place.root / "runs").iterdir())[-1].name
    record = place.record(run_id)
    assert record["status"] == "failed" and record["error"]["type"] == "RuntimeError"
    assert "planted failure at step 2" in (place.root / "runs" / run_id / "train.log").read_text()
    assert veritrain("verify", run_id, cwd=place.root).code == 0


@pytest.mark.parametrize("flag, message", [
    ("--bad-config", "error: config: layers: a set cannot be recorded exactly"),
    ("--nested", "is still active in this process"),
])
def test_bad_use_is_one_line_and_exit_2(place, flag, message):
    done = place.run(flag)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert message in done.stderr.strip().splitlines()[-1]
