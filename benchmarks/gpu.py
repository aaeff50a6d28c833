"""The GPU check, for a machine with CUDA: what veritrain promises there, and what its loop costs.

    .venv/bin/python benchmarks/gpu.py                 # CUDA: resnet18 on CIFAR-shaped data (12,000 images)
    .venv/bin/python benchmarks/gpu.py --device cpu    # the same checks, smaller, where no GPU is at hand

1. Two runs of one config (fp32, deterministic kernels) end with the same final state.
2. A run killed with SIGKILL in the middle of an epoch and resumed ends as the uninterrupted run did: in fp32 with
   channels-last, and in fp16 with its gradient scaler (AMP; CUDA only).
3. Its batches built by 2 worker processes (pinned memory on CUDA): the same final state as built in the process.
4. Throughput: the training loop's samples/s against the hand loop (benchmarks/reference_loop.py) on the same device,
   in interleaved pairs.

Prints one line per check and exits 1 when a check differs.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from chaos_resume import outcome  # noqa: E402  (a script beside this one)


def config(root: Path, device: str, model: str, extra: str = "", frequent: bool = True) -> str:
    """The run's config; `frequent`: a checkpoint every 20 steps and a step log line every step (for the kills to land
    between saves), else the defaults (a checkpoint per epoch, as the hand loop saves)."""
    small = device == "cpu"
    return (f"data:\n  source: cifar10\n  root: {root}\n  near_duplicates: 'off'\n"
            f"model:\n  name: {'cnn' if small else model}\n" + ("  widths: [16, 32]\n" if small else "")
            + "augment:\n  crop_padding: 4\n  hflip: true\n"
            f"train:\n  epochs: 2\n  batch_size: {64 if small else 128}\n  device: {device}\n  threads: 2\n{extra}"
            + ("checkpoint:\n  every_steps: 20\nlogging:\n  every_steps: 1\n" if frequent else ""))


def train(workdir: Path, config_path: Path, *more: str) -> Path:
    done = subprocess.run([sys.executable, "-m", "veritrain", "train", str(config_path), "--workdir", str(workdir), "--json", *more],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"veritrain train exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return Path(json.loads(done.stdout)["run_dir"])


def killed_and_resumed(workdir: Path, config_path: Path, at_step: int) -> Path:
    """SIGKILL once steps.jsonl has `at_step` lines, then `train --resume` until the run completes."""
    proc = subprocess.Popen([sys.executable, "-m", "veritrain", "train", str(config_path), "--workdir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None:
        logs = list((workdir / "runs").glob("*/steps.jsonl")) if (workdir / "runs").is_dir() else []
        if logs and len(logs[0].read_text().splitlines()) >= at_step:
            proc.kill()
            break
        time.sleep(0.05)
    proc.wait()
    (run_dir,) = (workdir / "runs").iterdir()
    for _ in range(5):
        if json.loads((run_dir / "record.json").read_text())["status"] == "completed":
            return run_dir
        subprocess.run([sys.executable, "-m", "veritrain", "train", "--resume", run_dir.name, "--workdir", str(workdir)], capture_output=True)
    sys.exit(f"{run_dir} did not complete after five resumes; see its train.log")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    from veritrain.data.cifar10 import write_fake_cifar10

    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_fake_cifar10(root / "cifar", per_batch=200 if args.device == "cpu" else 2000)
        variants = {"fp32, channels-last": "  channels_last: true\n"}
        if args.device != "cpu":
            variants["fp16 with a gradient scaler"] = "  precision: fp16\n"
        for number, (name, extra) in enumerate(variants.items()):
            path = root / f"{number}.yaml"
            path.write_text(config(root / "cifar", args.device, args.model, extra))
            first, second = outcome(train(root / f"a{number}", path)), outcome(train(root / f"b{number}", path))
            resumed = outcome(killed_and_resumed(root / f"k{number}", path, at_step=37))
            for check, same in ((f"{name}: two runs", first == second), (f"{name}: killed mid-epoch and resumed", resumed == first)):
                print(f"{check}: {'identical' if same else 'DIFFERENT'}", flush=True)
                failed |= not same
        path = root / "workers.yaml"
        path.write_text(config(root / "cifar", args.device, args.model, "  num_workers: 2\n"))
        with_workers = outcome(train(root / "w", path))[0]  # the final weights: the two configs (and so trajectories) differ
        path0 = root / "workers0.yaml"
        path0.write_text(config(root / "cifar", args.device, args.model, "  num_workers: 0\n"))
        same = with_workers == outcome(train(root / "w0", path0))[0]
        print(f"2 workers against none: final state {'identical' if same else 'DIFFERENT'}", flush=True)
        failed |= not same

        ratios = []
        data_dir = next((root / "a0" / ".veritrain" / "data").iterdir())
        plain = root / "plain.yaml"  # what the hand loop does: fp32, the default memory format, a checkpoint per epoch
        plain.write_text(config(root / "cifar", args.device, args.model, frequent=False))
        for _ in range(args.pairs):  # interleaved: veritrain, then the hand loop
            record = json.loads((train(root / "t", plain) / "record.json").read_text())
            ours = record["training"]["loop_seconds"]
            done = subprocess.run([sys.executable, str(HERE / "reference_loop.py"), str(data_dir), str(plain), tmp, args.device],
                                  capture_output=True, text=True, check=True)
            ratios.append(json.loads(done.stdout)["loop_seconds"] / ours)
        print(f"throughput on {args.device}: veritrain's loop {statistics.median(ratios):.3f}× the hand loop's samples/s "
              f"(median of {args.pairs} pairs, {min(ratios):.2f}–{max(ratios):.2f})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
