"""Verifying a shard (veritrain.data.shards.verify_shard: every 1 MiB block hashed once against its entry) against
`sha256sum` over the same bytes, and a reader's random access (each row's blocks checked before use) against reading
the same rows unchecked.

    .venv/bin/python benchmarks/shard_verify.py [--mib 512] [--pairs 5]

Writes one blob shard of --mib MiB of random bytes (in rows of 100 KiB, as encoded images) into a temporary folder.
Interleaved pairs, so a busy machine slows both alike; the file is read once first so both find it in the page cache.
Prints the median throughput ratio (verify / sha256sum; the target is ≥ 0.8), with its spread, and what a random row
costs checked and unchecked.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from veritrain.data import shards  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    row = 100 * 1024
    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder)
        entry = shards.write_blob(store, (rng.randbytes(row) for _ in range(args.mib * (1 << 20) // row)))
        path = shards.path_of(store, entry.id)
        path.read_bytes()  # into the page cache, for both
        ratios, reads = [], []
        for _ in range(args.pairs):
            started = time.perf_counter()
            assert not shards.verify_shard(path, entry)
            ours = time.perf_counter() - started
            started = time.perf_counter()
            subprocess.run(["sha256sum", str(path)], check=True, capture_output=True)
            theirs = time.perf_counter() - started
            ratios.append(theirs / ours)
            reads.append(_random_reads(path, entry, rng.randrange(1 << 30)))
        mib = entry.size / (1 << 20)
        print(f"verify: {mib:.0f} MiB; throughput against sha256sum: median {statistics.median(ratios):.3f}× "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {args.pairs} pairs; target ≥ 0.8)")
        checked, unchecked = statistics.median(r[0] for r in reads), statistics.median(r[1] for r in reads)
        print(f"random reads of 100 KiB rows: {checked * 1e6:.0f} µs a row checked (its 1 MiB block, or two, read and hashed), "
              f"{unchecked * 1e6:.0f} µs unchecked (medians of {args.pairs} runs of 2,000 rows)")


def _random_reads(path: Path, entry: shards.ShardEntry, seed: int) -> tuple[float, float]:
    """Seconds per row of 2,000 random rows read through a Shard (each block a row touches read and checked), and of
    the same rows read unchecked with positioned reads."""
    import os

    draw = random.Random(seed)
    rows = [draw.randrange(entry.rows) for _ in range(2000)]
    with shards.Shard(path, entry) as shard:
        table, header = shard.offsets(), 8 * (entry.rows + 1)
        spans = [(header + int(table[r]), int(table[r + 1] - table[r])) for r in rows]
    fd = os.open(path, os.O_RDONLY)
    started = time.perf_counter()
    for start, length in spans:
        os.pread(fd, length, start)
    unchecked = time.perf_counter() - started
    os.close(fd)
    started = time.perf_counter()
    with shards.Shard(path, entry) as shard:
        for r in rows:
            shard.get(r)
    checked = time.perf_counter() - started
    return checked / len(rows), unchecked / len(rows)


if __name__ == "__main__":
    main()
