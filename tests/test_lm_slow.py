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


def _last_logged_step(run_dir: Path, since: float) -> int:
    """The step of steps.jsonl's last line when the file was written after `since` (by the process started then), else -1."""
    path = run_dir / "steps.jsonl"
    try:
        if path.stat().st_mtime < since:
            return -1
        lines = path.read_text().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else -1
    except (OSError, ValueError, KeyError):  # not there yet, or caught mid-write
        return -1


def test_ten_kills_at_random_moments_each_resumed_end_bit_identical(default_run, tmp_path):
    """One training of the default config, killed with SIGKILL ten times and resumed after each kill: kill k comes a
    random 0-1.5 s after the process has logged a randomly drawn step (10 of the steps.jsonl rows, in order), so the kills
    fall across the epochs, mid-epoch and around checkpoint writes, whatever the machine's speed."""
    _, reference_dir = default_run
    reference = _record(reference_dir)
    rng = random.Random(27)
    every = 50  # configs/tiny-lm.yaml logs a steps.jsonl row every 50 steps (logging.every_steps)
    targets = sorted(rng.sample(range(every, reference["training"]["steps"], every), KILLS))
    train = [sys.executable, "-m", "veritrain", "train", CONFIG, "--workdir", str(tmp_path)]
    run_dir, kills, resumes = None, 0, 0
    deadline = time.monotonic() + 1500
    for target in [*targets, None]:  # the last process runs to the end
        if run_dir is None:
            command = train
        else:
            command = [sys.executable, "-m", "veritrain", "train", "--resume", run_dir.name, "--workdir", str(tmp_path)]
            resumes += 1
        started = time.time()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while target is not None and proc.poll() is None:
            if run_dir is None:
                found = sorted((tmp_path / "runs").glob("*/record.json")) if (tmp_path / "runs").exists() else []
                run_dir = found[0].parent if found else None
            if run_dir is not None and _last_logged_step(run_dir, started) >= target:
                break
            assert time.monotonic() < deadline, f"step {target} not reached after {kills} kills"
            time.sleep(0.05)
        if target is not None:
            time.sleep(rng.uniform(0.0, 1.5))
            if proc.poll() is None:
                proc.kill()
                kills += 1
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert run_dir is not None
    print(f"tiny-lm chaos: {kills} kills at steps ≥ {targets}, {resumes} resumes")
    assert kills == KILLS and _record(run_dir)["status"] == "completed"
    assert _outcome(run_dir) == _outcome(reference_dir)
    assert len(_record(run_dir).get("resumes") or []) == resumes


def _small_corpus(folder: Path) -> list[str]:
    """Eight help topics as .txt files in `folder`/docs, and the overrides of a small GPT that trains on them in seconds."""
    from veritrain.data.text_corpus import embedded_topics

    docs = folder / "docs"
    docs.mkdir()
    topics = embedded_topics()
    for name in ["assert", "break", "continue", "del", "global", "if", "pass", "while"]:
        (docs / f"{name}.txt").write_text(topics[name], encoding="utf-8")
    return ["--set", "data.source=text", "--set", f"data.root={docs}", "--set", "data.split_ratios=[0.6,0.2,0.2]",
            "--set", "model.layers=1", "--set", "model.width=32", "--set", "model.heads=2", "--set", "model.context=64",
            "--set", "train.batch_size=16", "--set", "schedule.warmup_steps=2"]


def test_two_processes_train_a_language_model_and_reproduce_it_bit_identically(tmp_path):
    """--nproc 2 (DDP, gloo): each rank trains its share of every batch of windows; the run reproduces with 2 processes."""
    small = [*_small_corpus(tmp_path), "--set", "train.epochs=2", "--set", "export.formats=[onnx]", "--set", "eval.generation.tokens=8"]
    done = veritrain_process("run", CONFIG, *small, "--nproc", "2", "--no-smoke", "--json", "--workdir", str(tmp_path), timeout=900)
    assert done.code == 0, done.stderr[-3000:]
    run_dir = Path(done.json()["run_dir"])
    record = _record(run_dir)
    assert record["distributed"]["world_size"] == 2 and record["export"]["parity"]["passed"]
    reproduced = veritrain_process("reproduce", run_dir.name, "--json", "--workdir", str(tmp_path), timeout=900)
    assert reproduced.code == 0 and reproduced.json()["verdict"] == "identical", reproduced.stdout[-2000:] + reproduced.stderr[-2000:]


def test_a_sweep_selects_its_best_trial_by_val_bits_per_byte_and_repeats_summarize_it(tmp_path):
    """Sweeps and --repeat of a language model: the best trial is the one with the fewest val bits per byte (never test),
    and the seed spread is of bits per byte, beside the byte baselines."""
    args = [*_small_corpus(tmp_path), "--set", "train.epochs=1", "--set", "export.formats=[safetensors]", "--set", "eval.generation.tokens=4"]
    config = CONFIG
    done = veritrain_process("sweep", config, *args, "--vary", "optim.lr=0.0003,0.01", "--no-smoke", "--workdir", str(tmp_path / "sweep"),
                     "--json", timeout=900)
    assert done.code == 0, done.stderr
    summary = done.json()
    assert summary["headline"] == {"metric": "bits_per_byte", "mode": "min"} and summary["split"] == "val"
    best = min(summary["trials"], key=lambda t: t["metrics"]["bits_per_byte"])
    assert summary["best"]["trial"] == best["index"] and summary["best"]["test"]["used_for_selection"] is False
    repeated = veritrain_process("run", config, *args, "--repeat", "2", "--no-smoke", "--workdir", str(tmp_path / "repeat"), "--json", timeout=900)
    assert repeated.code == 0, repeated.stderr
    payload = repeated.json()
    spread = payload["summary"]["bits_per_byte"]
    assert len(spread["values"]) == 2 and spread["values"][0] != spread["values"][1] and spread["ci95"][0] >= 0.0
    assert set(payload["baselines"]) == {"unigram", "bigram"} and "bits_per_byte" in payload["baselines"]["bigram"]
