"""Verifying a shard (veritrain.data.shards.verify_shard: every 1 MiB block hashed once against its entry) against
`sha256sum` over the same bytes, and a reader's random access (each row's blocks checked before use) against reading
the same rows unchecked.

    .venv/bin/python benchmarks/shard_verify.py [--mib 512] [--pairs 5]

Writes one blob shard of --mib MiB of random bytes (in rows of 100 KiB, as encoded images) into a temporary folder.
Interleaved pairs, so a busy machine slows both alike; the file is read once first so both find it in the page cache.
Prints the median throughput ratio (verify / sha256sum; the target is ≥ 0.8) and the random reads' ratio (checked /
unchecked), with their spreads.
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
        print(f"random reads of 2,000 rows: checked / unchecked time: median {statistics.median(reads):.2f}× "
              f"(min {min(reads):.2f}, max {max(reads):.2f})")


def _random_reads(path: Path, entry: shards.ShardEntry, seed: int) -> float:
    """Time of 2,000 random rows read through a Shard (each block checked), over the same rows read unchecked."""
    rows = [random.Random(seed).randrange(entry.rows) for _ in range(2000)]
    started = time.perf_counter()
    with shards.Shard(path, entry) as shard:
        for r in rows:
            shard.get(r)
    checked = time.perf_counter() - started
    started = time.perf_counter()
    with shards.Shard(path, entry) as shard, open(path, "rb") as f:
        table, header = shard.offsets(), 8 * (entry.rows + 1)
        for r in rows:
            f.seek(header + int(table[r]))
            f.read(int(table[r + 1] - table[r]))
    return checked / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
