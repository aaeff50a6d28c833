"""What a newcomer meets: `latest` that fits the command, messages that name the real cause, checklist
fixes that clear their rows, waivers, `--resume auto` without a config, and output that keeps run ids,
hashes and seals whole when piped."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from veritrain.records.record import read_record

from conftest import FAST

SMALL = ["--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "model.hidden=[16]"]
# plain SGD at this rate blows up in the second epoch (after the first epoch's checkpoint); a tenth of it trains
DIVERGES = ["--set", "optim.name=sgd", "--set", "optim.lr=1000", "--set", "train.on_nonfinite=stop", *FAST]
DIVERGES_AT_ONCE = ["--set", "optim.name=sgd", "--set", "optim.lr=1e6", "--set", "train.on_nonfinite=stop", *FAST]


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def rows(result) -> dict[str, dict]:
    return {item["id"]: item for item in result.json()["items"]}


@pytest.fixture(scope="module")
def trained_then_baseline(small_run):
    """A workspace where a run with a model (the shared small run) comes first and a baseline-only run (no
    model) after it."""
    from conftest import veritrain

    workdir = small_run.workdir
    config = workdir / "digits.yaml"
    config.write_text("model:\n  name: mlp\n  hidden: [16]\n")
    baseline = veritrain("baseline", str(config), "--workdir", str(workdir), "--json")
    assert baseline.code == 0, baseline.stderr
    return workdir, small_run.run_dir.name, baseline.json()["run_id"]


def test_latest_is_the_newest_run_that_fits_the_command(cli, trained_then_baseline, tmp_path):
    from PIL import Image

    workdir, trained, baseline = trained_then_baseline
    at = ["--workdir", str(workdir)]
    exported = cli("export", "latest", "--format", "onnx", *at, "--json")
    assert exported.code == 0, exported.stderr
    assert exported.json()["source_run"] == trained
    assert f"latest: {trained}, the newest run with a trained model; the newest run of all, {baseline}, is not one" in exported.stderr
    Image.new("L", (8, 8), 50).save(tmp_path / "digit.png")
    predicted = cli("predict", "latest", str(tmp_path / "digit.png"), *at, "--json")
    assert predicted.code == 0 and f"latest: {trained}" in predicted.stderr, predicted.stderr
    assert cli("verify", "latest", *at, "--json").json()["run_id"] == baseline  # about any run: the newest

    checked = cli("check", "latest", *at, "--json")  # the baseline run: its training rows do not apply
    assert checked.code == 0, checked.stdout
    items = rows(checked)
    assert {items[r]["status"] for r in ("log_complete", "checkpoint_with_optimizer", "test_metrics", "export_parity", "smoke_passed")} == {"n/a"}
    assert items["baseline_present"]["status"] == "pass" and "baseline run" in items["log_complete"]["detail"]

    refused = cli("eval", baseline, *at)
    line = error_line(refused)
    assert refused.code == 1 and "a baseline run trains no model" in line and "--checkpoint" not in line
    listed = cli("runs", "list", *at, "--json")
    assert {r["run_id"] for r in listed.json()["runs"]} == {trained, baseline}


def test_a_failed_run_says_why_it_has_no_checkpoint_and_check_suggests_a_new_run(cli, tmp_path):
    at = ["--workdir", str(tmp_path)]
    failed = cli("train", *DIVERGES_AT_ONCE, *at, "--json")
    assert failed.code == 1
    run_id = failed.json()["run_id"]
    refused = cli("eval", run_id, *at)
    line = error_line(refused)
    assert refused.code == 1 and "failed in its train stage before writing a checkpoint" in line and "became nan" in line
    assert not line.startswith("error: --checkpoint")
    given = cli("eval", run_id, "--checkpoint", "last", *at)  # the prefix belongs to a --checkpoint the user gave
    assert error_line(given).startswith("error: --checkpoint: ")


def test_every_fix_check_suggests_clears_its_row(cli, tmp_path):
    from veritrain.trust.check import fix_commands

    at = ["--workdir", str(tmp_path)]
    failed = cli("train", *DIVERGES, *at, "--json")
    assert failed.code == 1, failed.stderr
    first = failed.json()["run_id"]
    checked = cli("check", first, *at, "--json")
    fixes = {item["fix"] for item in checked.json()["items"] if item["status"] not in ("pass", "n/a")}
    # a failed run is never resumed: every open row points at one new run with a tenth of the rate
    assert fixes == {f"veritrain train {tmp_path / 'runs' / first / 'config.yaml'} --set optim.lr=100"}, fixes

    current = first
    for _ in range(4):  # run each suggested command, then check again, until nothing is suggested
        checked = cli("check", current, *at, "--json")
        commands = fix_commands(checked.json())
        if not commands:
            break
        for command in commands:
            done = cli(*command[1:], *at, "--json")
            assert done.code in (0, 1), (command, done.stderr)
            if command[1] == "train":
                assert done.code == 0, done.stderr
                current = done.json()["run_id"]
    items = rows(cli("check", current, *at, "--json"))
    # sealed without a signing key (the tests have none): said in its own row, which does not fail the check
    assert items["provenance_signed"]["status"] == "n/a" and items["provenance_signed"]["detail"].startswith("unsigned:")
    not_passed = {row: item for row, item in items.items() if item["status"] != "pass" and row != "provenance_signed"}
    # what no command can clear is a stated reason: beating the baseline after two epochs of SGD
    assert set(not_passed) <= {"beats_baseline"}, not_passed
    if not_passed:
        assert "--waive beats_baseline" in not_passed["beats_baseline"]["fix"]
        noted = cli("runs", "note", current, "--waive", "beats_baseline", "two epochs only: a plumbing check", *at)
        assert noted.code == 0, noted.stderr
        waived = cli("check", current, *at, "--json")
        assert waived.code == 0 and rows(waived)["beats_baseline"]["status"] == "waived"
        assert "two epochs only" in rows(waived)["beats_baseline"]["detail"]
    unknown = cli("runs", "note", current, "--waive", "no_such_row", "why", *at)
    assert unknown.code == 2 and "not a check row" in error_line(unknown)


def test_resume_auto_without_a_config_picks_the_newest_interrupted_run(cli, tmp_path):
    import shutil

    at = ["--workdir", str(tmp_path)]
    done = cli("train", *SMALL, *at, "--json")
    assert done.code == 0
    source = tmp_path / "runs" / done.json()["run_id"]
    record = json.loads((source / "record.json").read_text())
    nothing = cli("train", "--resume", "auto", *at)
    assert nothing.code == 2 and "no interrupted run" in error_line(nothing)
    # an interrupted run: a completed one rewound to its first checkpoint, as a kill leaves it
    interrupted = cli("train", *SMALL, "--set", "train.epochs=3", *at, "--json")
    run_id = interrupted.json()["run_id"]
    run_dir = tmp_path / "runs" / run_id
    record = json.loads((run_dir / "record.json").read_text())
    record.update(status="interrupted", error={"type": "Interrupted", "message": "interrupted by SIGTERM"})
    from veritrain.records.record import write_record

    for path in (run_dir / "checkpoints").glob("*"):
        if path.name not in ("step-23.pt", "step-23.pt.sha256"):
            path.unlink()
    shutil.rmtree(run_dir / "eval", ignore_errors=True)
    write_record(run_dir, record)
    resumed = cli("train", "--resume", "auto", *at, "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["run_id"] == run_id and f"the newest interrupted run is {run_id}" in resumed.stderr


def test_piped_output_keeps_ids_hashes_and_seals_whole(trained_then_baseline, tmp_path):
    workdir, trained, baseline = trained_then_baseline
    env = {**os.environ, "COLUMNS": "60", "PYTHONWARNINGS": "ignore"}  # a narrow terminal width must not matter in a pipe
    # the report is on stdout: a shell pipe into grep finds each run, and a redirect to a file holds the table
    veritrain = f"{shlex.quote(sys.executable)} -m veritrain runs list --workdir {shlex.quote(str(workdir))}"
    grepped = subprocess.run(f"{veritrain} | grep {trained}", shell=True, capture_output=True, text=True, env=env, timeout=120)
    assert grepped.returncode == 0 and trained in grepped.stdout and "completed" in grepped.stdout, grepped.stderr
    subprocess.run(f"{veritrain} > {shlex.quote(str(tmp_path / 'runs.txt'))}", shell=True, check=True, env=env, timeout=120)
    listed = (tmp_path / "runs.txt").read_text()
    assert all(any(run_id in line for line in listed.splitlines()) for run_id in (trained, baseline)), listed
    shown = subprocess.run([sys.executable, "-m", "veritrain", "runs", "show", trained, "--workdir", str(workdir)],
                           capture_output=True, text=True, env=env, timeout=120)
    seal = (workdir / "runs" / trained / "record.sha256").read_text().strip()
    newest = read_record(workdir / "runs" / trained).seal  # its last amendment's (the baseline's), which the check line names
    lines = shown.stdout.splitlines()
    assert any(seal in line for line in lines) and any(f"veritrain verify {trained} --expect {newest}" in line for line in lines), shown.stdout
    assert not shown.stdout.strip().startswith("{") and shown.stderr == ""  # a summary for people; --json gives the record
    hashes = {m for line in lines for m in re.findall(r"\b[0-9a-f]{64}\b", line)}
    record = json.loads((workdir / "runs" / trained / "record.json").read_text())
    assert {record["final_state_sha256"], record["data"]["version"], record["config_hash"], seal} <= hashes


def test_the_end_of_run_summary_keeps_the_seal_whole_and_says_what_is_next(tmp_path):
    env = {**os.environ, "COLUMNS": "60", "PYTHONWARNINGS": "ignore"}
    with open(tmp_path / "summary.txt", "w") as out:
        done = subprocess.run([sys.executable, "-m", "veritrain", "run", *SMALL, "--set", "export.formats=[onnx]", "--set", "eval.baselines=false", "--no-smoke",
                               "--workdir", str(tmp_path)], stdout=out, stderr=subprocess.DEVNULL, env=env, timeout=300)
    assert done.returncode == 0
    text = (tmp_path / "summary.txt").read_text()
    [run_dir] = (tmp_path / "runs").iterdir()
    seal = (run_dir / "record.sha256").read_text().strip()
    assert any(seal in line for line in text.splitlines())
    for step in (f"veritrain verify {run_dir.name} --expect {seal}", f"veritrain check {run_dir.name}",
                 f"veritrain predict {run_dir.name}", f"veritrain runs compare {run_dir.name}"):
        assert step in text, step


def test_a_reproduction_records_the_same_environment_and_is_compared_with_its_source(cli, trained_then_baseline):
    workdir, trained, _ = trained_then_baseline
    at = ["--workdir", str(workdir)]
    reproduced = cli("reproduce", trained, *at, "--json")
    assert reproduced.code == 0, reproduced.stderr
    copy = reproduced.json()["reproduction"]
    compared = cli("runs", "compare", trained, copy, *at, "--json").json()
    # deterministic runs set CUBLAS_WORKSPACE_CONFIG before recording their environment, whatever the entry point
    assert compared["env"][copy] == {}, compared["env"]
    for run_id in (trained, copy):
        record = json.loads((workdir / "runs" / run_id / "record.json").read_text())
        assert record["env"]["variables"].get("CUBLAS_WORKSPACE_CONFIG"), run_id
    entry = (workdir / "experiments.md").read_text().split(f"## {copy}")[1].split("\n## ")[0]
    assert f"changes vs {trained}: _none (same config)_" in entry and f"reproduces {trained}: final weights identical" in entry
