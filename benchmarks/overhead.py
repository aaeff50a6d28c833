"""veritrain's training-loop overhead against the minimal hand-written loop in `reference_loop.py`.

    .venv/bin/python benchmarks/overhead.py [--repeat 7] [--only cnn|resnet18|mlp]

For three workloads — the `cnn` on CIFAR-shaped data (a generated CIFAR-10 batch set), 2 threads;
a fixed number of `resnet18` steps on CIFAR-shaped data (39 steps of 32 images: 3 epochs of 13
batches, 2 threads; about 25 s of training on an idle 2-core machine, with a 134 MB checkpoint per
epoch); and the `mlp` on digits, 1 thread (and again with 2) — runs `veritrain train` (records,
logging, per-epoch synced checkpoints with hashes) and the reference loop alternately, each run
≥ 10 s, and prints the median ratio of the training loop time and of the whole process over the
pairs, with the spread of the pairs and the ratio of the fastest runs (the figure least disturbed by
other load on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The mlp's target is measured with one thread: at this size torch's second intra-op thread makes
# neither loop faster, only busy-waits between tiny kernels, which makes the reference alone take
# anywhere from 9 to 14 s from run to run on a 2-core machine. The 2-thread figure is printed too.
MLP = "model:\n  name: mlp\n  hidden: [256]\ntrain:\n  epochs: 600\n  batch_size: 64\n  threads: {threads}\n"
WORKLOADS = {
    "cnn on CIFAR-shaped data": (
        "data:\n  source: cifar10\n  root: {cifar}\n  near_duplicates: 'off'\n"
        "model:\n  name: cnn\n  widths: [32, 64, 128]\n"
        "augment:\n  crop_padding: 4\n  hflip: true\n"
        "train:\n  epochs: 3\n  batch_size: 128\n  threads: 2\n"
    ),
    # 90 images per batch file: 450 to split, 400 of them train (13 batches of 32, the last of 16), 50 val
    "resnet18 on CIFAR-shaped data": (
        "data:\n  source: cifar10\n  root: {cifar_small}\n  near_duplicates: 'off'\n"
        "model:\n  name: resnet18\n"
        "augment:\n  crop_padding: 4\n  hflip: true\n"
        "train:\n  epochs: 3\n  batch_size: 32\n  threads: 2\n"
    ),
    "mlp on digits": MLP.format(threads=1),
    "mlp on digits, 2 threads": MLP.format(threads=2),
}


def timed(cmd: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:  # say why, not only that it failed
        sys.exit(f"{' '.join(cmd[:2])} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", choices=["cnn", "resnet18", "mlp"], default=None, help="run only the workloads whose name starts with this")
    parser.add_argument("--epochs", type=int, default=None, help="train this many epochs instead of the workload's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        from veritrain.data.cifar10 import write_fake_cifar10

        write_fake_cifar10(tmp_path / "cifar", per_batch=2000)
        write_fake_cifar10(tmp_path / "cifar-small", per_batch=90)
        for number, (name, template) in enumerate(WORKLOADS.items()):
            if args.only and not name.startswith(args.only):
                continue
            config = tmp_path / "bench.yaml"
            text = template.format(cifar=tmp_path / "cifar", cifar_small=tmp_path / "cifar-small")
            if args.epochs:
                text = re.sub(r"epochs: [0-9]+", f"epochs: {args.epochs}", text)
            config.write_text(text)
            workspace = tmp_path / f"ws-{number}"
            prepared = subprocess.run([sys.executable, "-m", "veritrain", "data", "prepare", str(config), "--workdir", str(workspace), "--json"],
                                      check=True, capture_output=True, text=True).stdout
            data_dir = Path(json.loads(prepared)["split_files"]["train"]).parent.parent
            loop_ratio, process_ratio, vt_loops, ref_loops, vt_outside, ref_outside = [], [], [], [], [], []
            for _ in range(args.repeat):  # interleaved A/B
                vt_total, out = timed([sys.executable, "-m", "veritrain", "train", str(config), "--workdir", str(workspace), "--json"])
                record = json.loads((Path(json.loads(out)["run_dir"]) / "record.json").read_text())
                vt_loop = record["training"]["loop_seconds"]
                ref_total, out = timed([sys.executable, str(HERE / "reference_loop.py"), str(data_dir), str(config), tmp])
                ref_loop = json.loads(out)["loop_seconds"]
                loop_ratio.append(vt_loop / ref_loop)
                vt_loops.append(vt_loop)
                ref_loops.append(ref_loop)
                process_ratio.append(vt_total / ref_total)
                vt_outside.append(vt_total - vt_loop)  # the process outside its epochs: start, imports, data, setup, seal, exit
                ref_outside.append(ref_total - ref_loop)
                print(f"  {name}: veritrain loop {vt_loop:.1f}s / process {vt_total:.1f}s, reference loop {ref_loop:.1f}s / process {ref_total:.1f}s", flush=True)
            print(f"{name}: training loop {statistics.median(loop_ratio):.3f}× (pairs {min(loop_ratio):.2f}–{max(loop_ratio):.2f}, "
                  f"fastest runs {min(vt_loops) / min(ref_loops):.3f}×), whole process {statistics.median(process_ratio):.3f}× (median of {args.repeat}); "
                  f"outside the epochs: veritrain {statistics.median(vt_outside):.2f}s, the hand loop {statistics.median(ref_outside):.2f}s "
                  f"(medians; veritrain's own {statistics.median(v - r for v, r in zip(vt_outside, ref_outside)):.2f}s)")


if __name__ == "__main__":
    main()
