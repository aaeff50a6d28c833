"""`veritrain verify` of a run on 5,000 PNGs whose raw data is unchanged: whole-process time and its parts.

    .venv/bin/python benchmarks/verify_cost.py [--images 5000] [--size 16] [--repeat 3]

Writes an imagefolder of small PNGs once, trains one tiny run on it (mlp, 1 epoch, no smoke test), then
times `python -m veritrain verify latest` as a whole process (the first call fills the state-hash cache,
the later ones hit it), and the parts: the imports of that process (`python -X importtime`, and whether
torch is among them), hashing every raw file's bytes, the whole raw-data check against preparing the raw data
again (what verify did before), and the checkpoint state checks without the cache.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image


def make_images(root: Path, count: int, size: int) -> None:
    if (root / ".done").exists():
        return
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class_{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        blocks = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        image = np.kron(blocks, np.ones((size // 4, size // 4, 1), dtype=np.uint8))
        Image.fromarray(image).save(folder / f"{i:06d}.png")
    (root / ".done").touch()


def veritrain(workdir: Path, *args: str, importtime: bool = False) -> tuple[float, subprocess.CompletedProcess]:
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "veritrain", *args]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return time.perf_counter() - started, done


def import_seconds(stderr: str) -> tuple[float, bool]:
    """Total import time of a `-X importtime` process (the top-level modules' cumulative µs) and whether torch is imported."""
    total, torch = 0, False
    for line in stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if match and match.group(2) == "":  # a top-level import (nested ones are indented)
            total += int(match.group(1))
        if match and match.group(3).strip() == "torch":
            torch = True
    return total / 1e6, torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/vt-verify-bench")
    args = parser.parse_args()
    root = Path(args.dir) / f"images-{args.images}-{args.size}"
    make_images(root, args.images, args.size)
    with tempfile.TemporaryDirectory(prefix="vt-verify-ws-") as tmp:
        workdir = Path(tmp)
        seconds, done = veritrain(workdir, "run", "--no-smoke", "--set", "data.source=imagefolder", "--set", f"data.root={root}",
                                  "--set", "model.name=mlp", "--set", "model.hidden=[16]", "--set", "train.epochs=1",
                                  "--set", "train.threads=1", "--set", "data.on_split_skew=warn")
        if done.returncode != 0:
            sys.exit(f"the run failed:\n{done.stderr[-3000:]}")
        print(f"trained one run on {args.images} PNGs of {args.size}×{args.size} in {seconds:.1f}s")
        first, done = veritrain(workdir, "verify", "latest")
        if done.returncode != 0:
            sys.exit(f"verify failed:\n{done.stdout}\n{done.stderr[-3000:]}")
        said = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line.startswith("data:")]
        times = [veritrain(workdir, "verify", "latest")[0] for _ in range(args.repeat)]
        floor = statistics.median(veritrain(workdir, "--version")[0] for _ in range(args.repeat))
        _, traced = veritrain(workdir, "verify", "latest", importtime=True)
        imports, torch = import_seconds(traced.stderr)

        from veritrain.core.config import load_config
        from veritrain.core.hashing import hash_files
        from veritrain.data import prepare
        from veritrain.records.workspace import Workspace
        from veritrain.trust.verify import verify_run

        listing = prepare.load_source(load_config(None, ["data.source=imagefolder", f"data.root={root}"]).config.data,
                                      {"root": root})
        started = time.perf_counter()
        hash_files([Path(s.path) for s in listing.samples], None, rehash=True)
        hashing = time.perf_counter() - started
        run_dir = Workspace.open(workdir).resolve_run("latest")
        import json

        record = json.loads((run_dir / "record.json").read_text())
        cfg = load_config(None, ["data.source=imagefolder", f"data.root={root}", "data.on_split_skew=warn"]).config.data
        folder = workdir / ".veritrain" / "data" / record["data"]["version"]
        started = time.perf_counter()
        assert prepare.raw_data_check(cfg, {"root": root}, folder, workdir / ".veritrain" / "data").unchanged
        raw_check = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as scratch:  # what verify did before: prepare the raw data again, decoding all
            started = time.perf_counter()
            assert prepare.version_now(cfg, {"root": root}, Path(scratch), versions=workdir / ".veritrain" / "data") == folder.name
            again = time.perf_counter() - started
        started = time.perf_counter()
        verify_run(run_dir, workdir / ".veritrain", check_data=False, check_states=False)
        files_only = time.perf_counter() - started
        started = time.perf_counter()
        verify_run(run_dir, workdir / ".veritrain", check_data=False, check_states=True)  # no cache: as audit checks
        states = time.perf_counter() - started - files_only
    print(f"verify latest, whole process: first {first:.2f}s (fills the state cache), then median {statistics.median(times):.2f}s of {args.repeat}")
    print(f"  python + veritrain --version alone: {floor:.2f}s; imports of verify: {imports:.2f}s (torch imported: {torch})")
    print(f"  hashing the {len(listing.samples)} raw files: {hashing:.2f}s; the whole raw-data check (list, hash, compare): {raw_check:.2f}s, "
          f"against {again:.2f}s to prepare it again ({again / raw_check:.0f}×)")
    print(f"  checkpoint states without the cache (as audit checks them): {states:.2f}s")
    print("  " + "\n  ".join(said))


if __name__ == "__main__":
    main()
