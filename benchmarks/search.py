"""What `veritrain search` adds per trial over a bare Optuna loop that runs the same trainings.

    .venv/bin/python benchmarks/search.py [--trials 4] [--repeat 3]

Both sides train the same configurations of a small MLP (1 epoch on 300 digits PNGs), each trial a
`veritrain run` in a fresh process, proposed by Optuna's RandomSampler with the same seed:

- A: `veritrain search --sampler random --pruner none --no-smoke` (the plan, the study in its journal
  file, one trial process each with its judge, summary, seal and experiments.md rewritten per trial);
- B: a bare loop: an in-memory Optuna study, `study.ask`, `veritrain run --set ... --no-smoke
  --set eval.split=val`, `study.tell` with the val accuracy.

A's trials evaluate val and test (a search reports the best trial's test result), B's val only: the
figure includes that test evaluation. Runs alternate A, B, A, B, ...; printed: the median of the
pairs' (A - B) / trials, in seconds per trial, and the ratio A / B.
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

TINY = """\
data: {source: imagefolder, root: digits300}
model: {name: mlp, hidden: [32]}
train: {epochs: 1, batch_size: 32, threads: 2}
eval: {baselines: false}
export: {formats: [safetensors]}
"""
SPACE = "optim.lr: {log_uniform: [1.0e-3, 0.05]}\nmodel.hidden: {choice: [[32], [64]]}\n"


def write_digits(root: Path, count: int = 300) -> None:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for index in range(count):
        folder = root / str(digits.target[index])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.round(digits.images[index] * 255 / 16).astype("uint8"), "L").save(folder / f"{index:04d}.png")


def veritrain(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "veritrain", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"veritrain {args[0]} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc


def with_search(folder: Path, workdir: Path, trials: int) -> float:
    started = time.perf_counter()
    veritrain("search", "tiny.yaml", "--space", "space.yaml", "--trials", str(trials), "--metric", "val.accuracy", "--sampler", "random",
              "--pruner", "none", "--no-smoke", "--workdir", str(workdir), cwd=folder)
    return time.perf_counter() - started


def bare_loop(folder: Path, workdir: Path, trials: int) -> float:
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    space = {"optim.lr": FloatDistribution(1e-3, 0.05, log=True), "model.hidden": CategoricalDistribution(["[32]", "[64]"])}
    for _ in range(trials):
        trial = study.ask(space)
        out = veritrain("run", "tiny.yaml", "--set", f"optim.lr={trial.params['optim.lr']!r}", "--set", f"model.hidden={trial.params['model.hidden']}",
                        "--set", "eval.split=val", "--no-smoke", "--workdir", str(workdir), "--json", cwd=folder)
        study.tell(trial, json.loads(out.stdout)["metrics"]["val"]["accuracy"])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_digits(folder / "digits300")
        (folder / "tiny.yaml").write_text(TINY)
        (folder / "space.yaml").write_text(SPACE)
        veritrain("data", "prepare", "tiny.yaml", "--workdir", str(folder / "warm"), cwd=folder)  # the data cache, for neither side
        pairs = []
        for index in range(args.repeat):
            a = with_search(folder, folder / f"a{index}", args.trials)
            b = bare_loop(folder, folder / f"b{index}", args.trials)
            pairs.append((a, b))
            print(f"pair {index + 1}: search {a:.1f} s, bare Optuna loop {b:.1f} s", file=sys.stderr)
    per_trial = statistics.median((a - b) / args.trials for a, b in pairs)
    ratio = statistics.median(a / b for a, b in pairs)
    print(f"veritrain search over a bare Optuna loop, {args.trials} trials, median of {args.repeat} pairs: "
          f"{per_trial:+.2f} s per trial, ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
