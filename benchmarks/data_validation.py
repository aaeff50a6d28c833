"""Image validation (full decode, checks, perceptual hash) throughput with 1 vs 2 worker processes.

    .venv/bin/python benchmarks/data_validation.py [--images 3000] [--size 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from data_reprepare import make_images

from veritrain.core.hashing import hash_files
from veritrain.data import validate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/vt-validation-bench")
    args = parser.parse_args()
    root = Path(args.dir) / "images"
    make_images(root, args.images, args.size)
    paths = sorted(root.rglob("*.png"))
    digests = hash_files(paths)
    files = list({digests[p].digest: str(p) for p in paths}.items())
    params = validate.CheckParams(args.size, args.size, 3, False, 50_000_000, True)
    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeat):
        for workers in (1, 2):  # interleaved
            with tempfile.TemporaryDirectory() as scratch:  # an empty check cache: every file is read and checked
                cache = validate.CheckCache(Path(scratch) / "images.sqlite")
                started = time.perf_counter()
                validate.header_counts(files, cache, workers)
                for _ in validate.checks_for(files, params, cache, workers):
                    pass
                rates[workers].append(len(files) / (time.perf_counter() - started))
                cache.close()
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"{len(files)} images {args.size}×{args.size}: 1 process {one:,.0f} images/s, 2 processes {two:,.0f} images/s → {two / one:.2f}×")


if __name__ == "__main__":
    main()
