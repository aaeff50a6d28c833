"""Manifest hashing throughput against a bare SHA-256 loop and against `cat`.

    .venv/bin/python benchmarks/data_hashing.py [--dir /tmp/vt-hash-bench] [--repeat 5]

Generates 1,000 × 1 MiB and 50,000 × 4 KiB files once (about 1.2 GB), warms the page cache, then
interleaves the three readers and prints the median time of each and the ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import time
from pathlib import Path

from veritrain.core.hashing import hash_files


def make_tree(root: Path) -> tuple[list[Path], list[Path]]:
    large_dir, small_dir = root / "large", root / "small"
    if not (root / ".done").exists():
        large_dir.mkdir(parents=True, exist_ok=True)
        for i in range(1000):
            (large_dir / f"{i:04d}.bin").write_bytes(os.urandom(1 << 20))
        for i in range(50_000):
            folder = small_dir / f"{i // 1000:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:05d}.bin").write_bytes(os.urandom(4096))
        (root / ".done").touch()
    return sorted(large_dir.glob("*.bin")), sorted(small_dir.rglob("*.bin"))


def sha256_loop(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb") as f:
            hashlib.file_digest(f, "sha256")


def cat(files: list[Path]) -> None:
    listing = b"\0".join(str(p).encode() for p in files)
    subprocess.run(["xargs", "-0", "cat"], input=listing, stdout=subprocess.DEVNULL, check=True)


def veritrain(files: list[Path]) -> None:
    hash_files(files, cache=None)  # no stat cache: every byte is read and hashed


def timed(func, files) -> float:
    started = time.perf_counter()
    func(files)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp/vt-hash-bench")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    large, small = make_tree(Path(args.dir))
    for name, files in (("large (1,000 × 1 MiB)", large), ("small (50,000 × 4 KiB)", small)):
        cat(files)  # warm the page cache
        times: dict[str, list[float]] = {"veritrain": [], "sha256": [], "cat": []}
        for _ in range(args.repeat):  # interleaved, so drift affects all three alike
            times["veritrain"].append(timed(veritrain, files))
            times["sha256"].append(timed(sha256_loop, files))
            times["cat"].append(timed(cat, files))
        med = {k: statistics.median(v) for k, v in times.items()}
        total = sum(p.stat().st_size for p in files)
        print(f"{name}: veritrain {med['veritrain']:.3f}s ({total / med['veritrain'] / 1e9:.2f} GB/s, {len(files) / med['veritrain']:,.0f} files/s)"
              f"  sha256 loop {med['sha256']:.3f}s  cat {med['cat']:.3f}s")
        print(f"  speed vs sha256 loop: {med['sha256'] / med['veritrain']:.2f}×   files/s vs cat: {med['cat'] / med['veritrain']:.2f}×")


if __name__ == "__main__":
    main()
