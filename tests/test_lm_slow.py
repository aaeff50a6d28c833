"""The language model's acceptance on the default config, configs/tiny-lm.yaml as it ships (make test-slow): the whole
run completes and verifies, its test bits per byte are at least 20% below the interpolated byte bigram's, it
reproduces bit-identically, `audit --segments 2` replays identically, and a training killed with SIGKILL at ten
random moments, resumed after each, ends with the uninterrupted run's final state, metrics and trajectory."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, veritrain_process

pytestmark = pytest.mark.slow

CONFIG = str(ROOT / "configs" / "tiny-lm.yaml")
KILLS = 10


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    workspace = tmp_path_factory.mktemp("tiny-lm")
    done = veritrain_process("run", CONFIG, "--json", "--workdir", str(workspace), timeout=1200)
    assert done.code == 0, done.stderr[-3000:]
    return workspace, Path(done.json()["run_dir"])


def _record(run_dir: Path) -> dict:
    return json.loads((run_dir / "record.json").read_text())


def test_the_default_config_completes_verifies_and_beats_the_byte_bigram_by_a_fifth(default_run):
    workspace, run_dir = default_run
    record = _record(run_dir)
    model = record["metrics"]["test"]["bits_per_byte"]
    bigram = record["baselines"]["results"]["bigram"]["bits_per_byte"]
    print(f"tiny-lm: test {model:.4f} bits per byte, byte bigram {bigram:.4f}, unigram "
          f"{record['baselines']['results']['unigram']['bits_per_byte']:.4f}; {1 - model / bigram:.1%} below the bigram; "
          f"{record['training']['steps']} steps, train {record['timings']['train']:.0f} s, whole run {record['timings']['total']:.0f} s")
    assert model <= 0.8 * bigram, (model, bigram)
    assert record["export"]["parity"]["passed"] and record["smoke"]["status"] == "completed"
    assert veritrain_process("verify", run_dir.name, "--workdir", str(workspace)).code == 0
    rows = {row["id"]: row["status"] for row in veritrain_process("check", run_dir.name, "--json", "--workdir", str(workspace)).json()["items"]}
    assert rows["beats_baseline"] == "pass" and rows["bad_cases"] == "pass", rows


def test_the_default_config_reproduces_bit_identically(default_run):
    workspace, run_dir = default_run
    done = veritrain_process("reproduce", run_dir.name, "--json", "--workdir", str(workspace), timeout=1200)
    assert done.code == 0 and done.json()["verdict"] == "identical", done.stdout[-2000:] + done.stderr[-2000:]


def test_two_audited_segments_replay_identically(default_run):
    workspace, run_dir = default_run
    done = veritrain_process("audit", run_dir.name, "--segments", "2", "--seed", "1", "--json", "--workdir", str(workspace), timeout=900)
    assert done.code == 0, done.stderr[-2000:]
    result = done.json()
    assert result["verdict"] == "identical" and result["segments_audited"] >= 2, result


def _outcome(run_dir: Path) -> tuple[str, list[dict], list[dict]]:
    """Final weights, metrics without their timings, and the committed trajectory (which step files remain may differ)."""
    record = _record(run_dir)
    metrics = [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trajectory = [{k: v for k, v in entry.items() if k not in ("kept", "kept_for_audit")} for entry in record.get("trajectory") or []]
    return record["final_state_sha256"], metrics, trajectory


def test_ten_kills_at_random_moments_each_resumed_end_bit_identical(default_run, tmp_path):
    """One training of the default config, killed with SIGKILL ten times (each at a random moment of the process's
    life, after it had time to reach a new epoch checkpoint more often than not) and resumed after each kill."""
    _, reference_dir = default_run
    reference = _record(reference_dir)
    per_epoch = reference["training"]["loop_seconds"] / reference["training"]["epochs"]
    rng = random.Random(27)
    command = [sys.executable, "-m", "veritrain", "train", CONFIG, "--workdir", str(tmp_path)]
    kills, resumes, proc = 0, 0, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 1500
    while True:
        if kills < KILLS:
            time.sleep(rng.uniform(0.3, 1.6) * per_epoch + 3.0)  # the start-up (imports, data reuse) is about 3 s
            if proc.poll() is None:
                proc.kill()
                kills += 1
        code = proc.wait()
        started = sorted((tmp_path / "runs").glob("*/record.json")) if (tmp_path / "runs").exists() else []
        if not started:  # killed before the run had a record: start it again
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            continue
        (run_dir,) = [path.parent for path in started]
        if _record(run_dir)["status"] == "completed":
            break
        assert time.monotonic() < deadline, f"no completion after {kills} kills and {resumes} resumes"
        assert code != 0 or kills >= KILLS
        resumes += 1
        proc = subprocess.Popen([sys.executable, "-m", "veritrain", "train", "--resume", run_dir.name, "--workdir", str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"tiny-lm chaos: {kills} kills, {resumes} resumes")
    assert kills == KILLS and resumes >= KILLS
    assert _outcome(run_dir) == _outcome(reference_dir)
    assert len(_record(run_dir).get("resumes") or []) == resumes
