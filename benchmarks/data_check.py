"""What checking a stored data version costs each time a command opens it, against one training epoch.

    .venv/bin/python benchmarks/data_check.py [--per-batch 10000] [--steps 30]

Prepares a CIFAR-10-sized data version (a generated set of the six official batch files, 10,000 32×32
RGB images each: 180 MiB of arrays) in a temporary workspace, then measures in this process:

- the check every command runs before it reads a stored version (`prepare.check_version`: every file
  re-hashed with SHA-256 against what the version id binds), with the page cache warm (the usual case: the
  version was just written or read), best of 5;
- one epoch of the `cnn` (widths 32, 64, 128; batch 128; 2 threads) on its train split, taken as the time of
  `--steps` optimizer steps on the version's own arrays times the steps of an epoch (a whole epoch takes
  minutes on 2 cores and the steps are uniform).

Prints both and the check as a share of the epoch (the target is below 5%).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-batch", type=int, default=10_000, help="images in each of the six batch files")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps timed to estimate an epoch")
    args = parser.parse_args()

    import numpy as np
    import torch

    from veritrain import models
    from veritrain.core.config import load_config
    from veritrain.data import identity, prepare
    from veritrain.data.cifar10 import write_fake_cifar10

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cifar"
        write_fake_cifar10(root, per_batch=args.per_batch, seed=0)
        resolved = load_config(None, ["data.source=cifar10", f"data.root={root}", "data.near_duplicates=false"])
        t = time.perf_counter()
        data = prepare.run(resolved.config.data, resolved.data_paths, Path(tmp) / ".veritrain")
        print(f"prepared {sum(data.counts.values())} images ({data.inputs.nbytes / 2**20:.0f} MiB of arrays) in {time.perf_counter() - t:.1f} s")

        checks = []
        for _ in range(5):
            identity._checked.clear()  # forget this process's memo: measure the full re-hash
            t = time.perf_counter()
            prepare.check_version(data.path)
            checks.append(time.perf_counter() - t)
        check = min(checks)

        torch.manual_seed(0)
        torch.set_num_threads(2)
        model = models.build("cnn", [3, 32, 32], 10, [32, 64, 128], [256], 0.0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        train = data.splits["train"]
        batch = 128
        mean = torch.tensor(data.info["normalization"]["mean"]).view(1, 3, 1, 1)
        std = torch.tensor(data.info["normalization"]["std"]).view(1, 3, 1, 1)
        rng = np.random.default_rng(0)
        timed = []
        for step in range(args.steps + 3):  # three warm-up steps, not timed
            rows = np.sort(rng.choice(train, batch, replace=False))
            t = time.perf_counter()
            x = (torch.from_numpy(np.asarray(data.inputs[rows])).permute(0, 3, 1, 2).float() / 255 - mean) / std
            y = torch.from_numpy(np.asarray(data.targets[rows]))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step >= 3:
                timed.append(time.perf_counter() - t)
        epoch = sum(timed) / len(timed) * (len(train) // batch)
        print(f"check of the stored version: {check:.3f} s (best of 5; {', '.join(f'{c:.3f}' for c in checks)})")
        print(f"cnn epoch on {len(train)} train images: about {epoch:.0f} s ({len(train) // batch} steps at {1000 * sum(timed) / len(timed):.0f} ms)")
        print(f"check / epoch: {100 * check / epoch:.2f}% (target < 5%)")


if __name__ == "__main__":
    main()
