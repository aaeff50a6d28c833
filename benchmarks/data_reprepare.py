"""Re-preparing unchanged data against a cold prepare.

    .venv/bin/python benchmarks/data_reprepare.py [--images 5000] [--size 64] [--repeat 3]

Writes an imagefolder of PNGs once, then alternates: a cold prepare (empty workspace: every file
hashed, decoded, validated, written) and a warm one (stat cache and check cache hit, version
reused). Prints the medians and the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from veritrain.core.config import load_config
from veritrain.data import prepare


def make_images(root: Path, count: int, size: int) -> None:
    if (root / ".done").exists():
        return
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class_{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        blocks = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        image = np.kron(blocks, np.ones((size // 8, size // 8, 1), dtype=np.uint8))
        Image.fromarray(image).save(folder / f"{i:06d}.png")
    (root / ".done").touch()


def prepare_once(root: Path, workspace: Path) -> float:
    resolved = load_config(None, ["data.source=imagefolder", f"data.root={root}"])
    started = time.perf_counter()
    prepare.run(resolved.config.data, resolved.data_paths, workspace / ".veritrain")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/vt-reprepare-bench")
    args = parser.parse_args()
    root = Path(args.dir) / "images"
    make_images(root, args.images, args.size)
    cold, warm = [], []
    for _ in range(args.repeat):
        workspace = Path(tempfile.mkdtemp(prefix="vt-ws-"))
        try:
            cold.append(prepare_once(root, workspace))
            warm.append(prepare_once(root, workspace))
        finally:
            shutil.rmtree(workspace)
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"{args.images} images {args.size}×{args.size}: cold prepare {c:.2f}s, unchanged re-prepare {w:.3f}s → {c / w:.1f}× faster")


if __name__ == "__main__":
    main()
