"""The cost of `veritrain audit` against `veritrain reproduce` on the same run, measured side by side.

    .venv/bin/python benchmarks/audit.py [--segments 2] [--repeat 3]

One training run of the `cnn` on CIFAR-shaped data (a generated CIFAR-10 batch set of 10,000 images,
8,889 of them train), 2 threads, 8 epochs of 70 steps (batch 128) with a checkpoint every 28 steps
(every 2nd epoch's end is one of them; no best.pt): a trajectory of 20 segments, every checkpoint kept for
audit (`checkpoint.audit_every: 1`). About a minute of training on an idle 2-core machine: both commands
also pay the same fixed costs (start-up, imports, the environment's package list), so a shorter
training would measure those rather than the replay. Then, in
alternation, `--repeat` times each: `veritrain audit RUN --segments S` and `veritrain reproduce RUN`
(whole processes: start-up, checks and data loading included). Prints the medians and their ratio;
the target is audit ≤ 15% of reproduce for S = 2 of 20 segments. Last, the cost of the state hand-back (the
audit's child writes every state it reaches, which the auditor loads as data and hashes): one kept checkpoint
encoded and written, then loaded and hashed, timed over 20 rounds, times the states an audit hands back.
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

CONFIG = (
    "data:\n  source: cifar10\n  root: {cifar}\n  near_duplicates: 'off'\n"
    "model:\n  name: cnn\n  widths: [32, 64, 128]\n"
    "augment:\n  crop_padding: 4\n  hflip: true\n"
    "train:\n  epochs: 8\n  batch_size: 128\n  threads: 2\n"
    # 70 steps per epoch, 560 in all: a checkpoint every 28 steps is 20 checkpoints; the ends of epochs 2, 4, 6 and 8
    # fall on them (every_epochs 2), the other epoch ends save nothing (no best.pt)
    "checkpoint:\n  every_steps: 28\n  every_epochs: 2\n  best: false\n  audit_every: 1\n"
)


def veritrain(*args: str) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "veritrain", *args, "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"veritrain {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--segments", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from veritrain.data.cifar10 import write_fake_cifar10

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        write_fake_cifar10(tmp_path / "cifar", per_batch=2000)
        config = tmp_path / "cifar.yaml"
        config.write_text(CONFIG.format(cifar=tmp_path / "cifar"))
        workspace = str(tmp_path / "workspace")
        train_seconds, trained = veritrain("train", str(config), "--workdir", workspace)
        run_id = trained["run_id"]
        record = json.loads((Path(trained["run_dir"]) / "record.json").read_text())
        segments = len(record["trajectory"]) - 1
        print(f"trained {run_id} in {train_seconds:.1f}s: {segments} segments in the trajectory", flush=True)
        audits, reproductions, verdicts = [], [], set()
        for i in range(args.repeat):  # alternate, so a slow spell of the machine hits both
            seconds, audited = veritrain("audit", run_id, "--segments", str(args.segments), "--seed", str(i), "--workdir", workspace)
            audits.append(seconds)
            seconds, reproduced = veritrain("reproduce", run_id, "--workdir", workspace)
            reproductions.append(seconds)
            verdicts |= {audited["verdict"], reproduced["verdict"]}
            print(f"pair {i + 1}: audit {audits[-1]:.1f}s (replay {audited['replay_seconds']:.1f}s, "
                  f"{audited['cost_fraction']:.1%} of the recorded training), reproduce {reproductions[-1]:.1f}s", flush=True)
        audit, reproduce = statistics.median(audits), statistics.median(reproductions)
        print(f"audit of {args.segments} of {segments} segments: median {audit:.1f}s; reproduce: median {reproduce:.1f}s; "
              f"ratio {audit / reproduce:.3f} (target ≤ 0.15); verdicts {sorted(verdicts)}")
        per_state, size = hand_back_cost(Path(trained["run_dir"]) / "checkpoints" / f"step-{record['trajectory'][1]['step']}.pt", tmp_path)
        print(f"state hand-back: {size / 1e6:.1f} MB a state, {per_state * 1000:.0f} ms to encode, write, load and hash it; "
              f"an audit of {args.segments} segments hands back about {args.segments + 1} states: {per_state * (args.segments + 1):.2f}s "
              f"({per_state * (args.segments + 1) / audit:.1%} of the audit)")


def hand_back_cost(checkpoint_file: Path, scratch: Path, rounds: int = 20) -> tuple[float, int]:
    """(seconds per state, bytes per state) of what the hand-back adds: the child's encoding and write, the auditor's
    load (weights_only) and state hash."""
    from veritrain.train import checkpoint
    from veritrain.userloop import frameworks

    state = checkpoint.load(checkpoint_file)
    target = scratch / "entry-1.pt"
    started = time.perf_counter()
    for _ in range(rounds):
        target.write_bytes(checkpoint.encode(state))
        frameworks.handed_back(None, target)
    return (time.perf_counter() - started) / rounds, target.stat().st_size


if __name__ == "__main__":
    main()
