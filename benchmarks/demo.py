"""What `make demo` takes and reaches: `veritrain run` with the built-in default config (the cnn on
scikit-learn's digits, smoke test included) in a fresh workspace, whole process, repeated.

    .venv/bin/python benchmarks/demo.py [--repeat 3]

Prints each run's wall time, its stages' times from the record, and its test accuracy, then the median
time and the accuracy (identical across repeats: the run is deterministic on one machine). The README's
demo figures come from this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_demo() -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="veritrain-demo-") as workdir:
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "veritrain", "run", "--workdir", workdir, "--json"],
                             check=True, capture_output=True, text=True).stdout
        seconds = time.perf_counter() - started
        summary = json.loads(out)
        record = json.loads((Path(summary["run_dir"]) / "record.json").read_text())
    return seconds, {"accuracy": summary["metrics"]["test"]["accuracy"], "timings": record["timings"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    times, accuracies = [], set()
    for i in range(args.repeat):
        seconds, result = one_demo()
        times.append(seconds)
        accuracies.add(round(result["accuracy"], 4))
        stages = ", ".join(f"{k} {v:.1f}s" for k, v in result["timings"].items())
        print(f"run {i + 1}: {seconds:.1f} s whole process (record: {stages}); test accuracy {result['accuracy']:.4f}")
    print(f"demo: median {statistics.median(times):.1f} s (min {min(times):.1f}, max {max(times):.1f}) over {len(times)} runs; "
          f"test accuracy {', '.join(f'{a:.4f}' for a in sorted(accuracies))}")


if __name__ == "__main__":
    main()
