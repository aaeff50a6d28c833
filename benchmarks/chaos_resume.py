"""The long chaos run: kill training with SIGKILL 20 times at random moments, resume each time, and
check that the final weights, metrics and committed trajectory equal an uninterrupted run's. Then the same,
10 times, for a user's own script (examples/own_loop.py, through `veritrain.start`): killed, and re-run with
`--resume auto` until it completes; and for a LightningModule (examples/lightning_module.py, through
`veritrain.lightning`): killed, and continued with `veritrain train --resume` until it completes (needs the
lightning extra; 0 by default).

    .venv/bin/python benchmarks/chaos_resume.py [--kills 20] [--script-kills 10] [--lightning-kills 10] [--seed 0]
    .venv/bin/python benchmarks/chaos_resume.py --kills 10 --script-kills 0 --workers 2   # batches built by 2 workers
    .venv/bin/python benchmarks/chaos_resume.py --kills 10 --script-kills 0 --steps      # validations inside epochs

Prints `N/20 identical`, `N/10 identical (script)` and `N/10 identical (lightning)` (one line per kill-and-resume
cycle before each). The kill schedule comes from --seed, so a failure can be replayed. A Lightning run is compared
by its final weights and committed trajectory (every checkpoint's state hash): the metrics Lightning averages over
an epoch start again at a resume inside it. With `--workers N` the built-in training (the reference and every killed
run) builds its batches in N worker processes (`train.num_workers`), which a SIGKILL leaves to exit on their own.
With `--steps` the built-in training stops at `train.max_steps` inside its last epoch and validates every
`eval.every_steps` steps (best.pt, early stopping and the rows of metrics.jsonl at those steps), checkpoints saved
between them.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHAOS = [
    "--set", "model.name=cnn", "--set", "model.widths=[16,32]", "--set", "model.dropout=0.2",
    "--set", "augment.crop_padding=1", "--set", "augment.hflip=true",
    "--set", "optim.name=sgd", "--set", "optim.lr=0.05", "--set", "train.accumulate_steps=2",
    "--set", "train.batch_size=32", "--set", "train.epochs=8", "--set", "checkpoint.every_steps=5",
    "--set", "logging.every_steps=3", "--set", "train.threads=1",
]


def start(workdir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "veritrain", *args, "--workdir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def outcome(run_dir: Path) -> tuple[str, list[dict], list[dict]]:
    """Final weights, metrics without timings, and the committed trajectory (which step files remain may differ)."""
    record = json.loads((run_dir / "record.json").read_text())
    metrics = [{k: v for k, v in json.loads(l).items() if k != "seconds"} for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trajectory = [{k: v for k, v in e.items() if k not in ("kept", "kept_for_audit")} for e in record.get("trajectory") or []]
    return record["final_state_sha256"], metrics, trajectory


def run_once(workdir: Path, rng: random.Random, duration: float) -> tuple[str, list[dict], list[dict], int]:
    """One training run, SIGKILLed at a random moment of its expected `duration` and resumed."""
    proc = start(workdir, "train", *CHAOS)
    kills = 0
    while True:
        if kills == 0:
            time.sleep(rng.uniform(0.2, 0.9) * duration)
            if proc.poll() is None:
                proc.kill()
                kills += 1
        proc.wait()
        made = list((workdir / "runs").iterdir()) if (workdir / "runs").is_dir() else []
        if not made or not (made[0] / "record.json").exists():  # killed before anything was recorded: start over
            for run_dir in made:
                shutil.rmtree(run_dir)
            proc = start(workdir, "train", *CHAOS)
            continue
        (run_dir,) = made
        status = json.loads((run_dir / "record.json").read_text())["status"]
        if status == "completed":
            return (*outcome(run_dir), kills)
        if status == "failed":
            raise SystemExit(f"run {run_dir} failed on resume; see its train.log")
        proc = start(workdir, "train", "--resume", run_dir.name)


SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "own_loop.py"
SCRIPT_ARGS = ["--epochs", "3", "--checkpoint_every", "7"]


def start_script(workdir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), *SCRIPT_ARGS, "--workdir", str(workdir), *args], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def script_once(workdir: Path, rng: random.Random, duration: float) -> tuple[str, list[dict], list[dict], int]:
    """The script, SIGKILLed at a random moment of its expected `duration`, then re-run with --resume auto until done."""
    workdir.mkdir(parents=True)
    proc = start_script(workdir)
    time.sleep(rng.uniform(0.2, 0.9) * duration)
    kills = 0
    if proc.poll() is None:
        proc.kill()
        kills = 1
    proc.wait()
    for _ in range(5):
        done = [r for r in (workdir / "runs").glob("*/record.json") if json.loads(r.read_text())["status"] == "completed"]
        if done:
            return (*outcome(done[0].parent), kills)
        if subprocess.run([sys.executable, str(SCRIPT), *SCRIPT_ARGS, "--workdir", str(workdir), "--resume", "auto"], cwd=workdir,
                          capture_output=True).returncode != 0:
            raise SystemExit(f"the script failed on resume in {workdir}")
    raise SystemExit(f"the script did not complete in {workdir}")


def script_chaos(tmp: Path, rng: random.Random, kills: int, seed: int) -> None:
    reference_dir = tmp / "script-reference"
    reference_dir.mkdir()
    started = time.perf_counter()
    subprocess.run([sys.executable, str(SCRIPT), *SCRIPT_ARGS, "--workdir", str(reference_dir)], cwd=reference_dir, check=True, capture_output=True)
    duration = time.perf_counter() - started
    (ref_run,) = (reference_dir / "runs").iterdir()
    reference = outcome(ref_run)
    identical = killed = 0
    for i in range(kills):
        final, metrics, trajectory, kill = script_once(tmp / f"script-{i}", rng, duration)
        same = (final, metrics, trajectory) == reference
        identical += same
        killed += kill
        print(f"script cycle {i + 1}: {'killed and resumed' if kill else 'finished before the kill'}, {'identical' if same else 'DIFFERENT'}", flush=True)
    print(f"{identical}/{kills} identical (script; {killed} of them killed mid-run; seed {seed})")


LIGHTNING = Path(__file__).resolve().parents[1] / "examples" / "lightning_module.py"
LIGHTNING_ARGS = ["--epochs", "12"]


def start_lightning(workdir: Path) -> tuple[subprocess.Popen, float]:
    """The Lightning example started in `workdir`, and the seconds until its first checkpoint (Lightning's import
    and setup take most of a short run: the kill is timed within the training after it)."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(LIGHTNING), *LIGHTNING_ARGS], cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not list(workdir.glob("runs/*/checkpoints/*.ckpt")):
        time.sleep(0.02)
    return proc, time.perf_counter() - started


def lightning_once(workdir: Path, rng: random.Random, training: float) -> tuple[str, list[dict], int]:
    """The Lightning example, SIGKILLed at a random moment of its `training` seconds after the first checkpoint, then
    continued with `veritrain train --resume` (its recorded command and code) until it completes."""
    workdir.mkdir(parents=True)
    proc, _ = start_lightning(workdir)
    time.sleep(rng.uniform(0.05, 0.95) * training)
    kills = 0
    if proc.poll() is None:
        proc.kill()
        kills = 1
    proc.wait()
    for _ in range(5):
        (record,) = list((workdir / "runs").glob("*/record.json"))
        if json.loads(record.read_text())["status"] == "completed":
            final, _, trajectory = outcome(record.parent)
            return final, [{k: v for k, v in e.items() if k != "file"} for e in trajectory], kills
        done = subprocess.run([sys.executable, "-m", "veritrain", "train", "--resume", record.parent.name], cwd=workdir, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the Lightning run failed on resume in {workdir}: {done.stderr.strip().splitlines()[-1:]}")
    raise SystemExit(f"the Lightning run did not complete in {workdir}")


def lightning_chaos(tmp: Path, rng: random.Random, kills: int, seed: int) -> None:
    reference_dir = tmp / "lightning-reference"
    reference_dir.mkdir()
    started = time.perf_counter()
    proc, startup = start_lightning(reference_dir)
    if proc.wait() != 0:
        raise SystemExit("the Lightning example failed")
    training = time.perf_counter() - started - startup
    (ref_run,) = (reference_dir / "runs").iterdir()
    final, _, trajectory = outcome(ref_run)
    reference = (final, [{k: v for k, v in e.items() if k != "file"} for e in trajectory])
    identical = killed = 0
    for i in range(kills):
        final, trajectory, kill = lightning_once(tmp / f"lightning-{i}", rng, training)
        same = (final, trajectory) == reference
        identical += same
        killed += kill
        print(f"lightning cycle {i + 1}: {'killed and resumed' if kill else 'finished before the kill'}, {'identical' if same else 'DIFFERENT'}", flush=True)
    print(f"{identical}/{kills} identical (lightning; {killed} of them killed mid-run; seed {seed})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--script-kills", type=int, default=10)
    parser.add_argument("--lightning-kills", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="train.num_workers of the built-in training's runs")
    parser.add_argument("--steps", action="store_true", help="train.max_steps inside the last epoch, eval.every_steps validations")
    args = parser.parse_args()
    CHAOS.extend(["--set", f"train.num_workers={args.workers}"])
    if args.steps:  # 130 steps of 23 an epoch (32 × 2 rows a step), the last inside epoch 6; validations every 7 and at 130
        CHAOS.extend(["--set", "train.max_steps=130", "--set", "eval.every_steps=7", "--set", "train.early_stopping_patience=6"])
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        if args.lightning_kills:
            lightning_chaos(Path(tmp), rng, args.lightning_kills, args.seed)
        if args.script_kills:
            script_chaos(Path(tmp), rng, args.script_kills, args.seed)
        if not args.kills:
            return
        reference_dir = Path(tmp) / "reference"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "veritrain", "train", *CHAOS, "--workdir", str(reference_dir)],
                       check=True, capture_output=True)
        duration = time.perf_counter() - started
        (ref_run,) = (reference_dir / "runs").iterdir()
        reference = outcome(ref_run)
        identical = killed = 0
        for i in range(args.kills):
            workdir = Path(tmp) / f"chaos-{i}"
            final, metrics, trajectory, kills = run_once(workdir, rng, duration)
            same = (final, metrics, trajectory) == reference
            identical += same
            killed += kills
            print(f"cycle {i + 1}: {'killed and resumed' if kills else 'finished before the kill'}, {'identical' if same else 'DIFFERENT'}", flush=True)
        workers = (f", {args.workers} workers" if args.workers else "") + (", steps as the unit" if args.steps else "")
        print(f"{identical}/{args.kills} identical ({killed} of them killed mid-run; seed {args.seed}{workers})")


if __name__ == "__main__":
    main()
