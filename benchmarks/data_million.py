"""Data versions at a million images: prepare's peak memory and time per image against the same at 100,000, what
a re-prepare after one added image writes, the time from opening the version to its first batch, and `verify`'s
hashing throughput against `sha256sum` over the same bytes.

    .venv/bin/python benchmarks/data_million.py [--sizes 100000 1000000] [--dir /tmp/vt-million]

Expect, at 1,000,000: about 4 GB of PNGs (32×32 RGB, distinct crops of the sample photos, tests/realdata.py
`_distinct_photo_crop`; plus a file system's per-file overhead) and 3 GB of shards, so 10–15 GB of disk with the
caches, and well over an hour on 2 cores (writing the PNGs about 10 minutes, preparing them most of the rest). The PNG
folders are kept in --dir and reused by later runs; the workspaces are made afresh.

For each size, in order:

1. **prepare**: `veritrain data prepare` of the folder into a fresh workspace in a child process, watched as
   benchmarks/data_memory.py watches it (VmHWM of the process itself; the largest sum of VmRSS over it and its workers);
2. **one image added**: a new distinct image written into the folder, then prepare again, watched the same way;
   counts the shards the new version holds that the first did not (per field), the files the store gained, and the
   samples whose split moved (by the manifests); the image is removed again afterwards;
3. **open → first batch**: a fresh interpreter that imports veritrain's data and task modules, opens the version
   (`identity.load_version`: the small files hashed, every shard's presence and size) and reads the first batch of 128
   rows of a seeded permutation of the train rows (inputs and targets, every block they touch checked): interpreter
   start, imports, opening and the batch reported apart;
4. **verify**: the whole check `veritrain verify` makes of a data version (`identity.data_version_problems`, every
   block of every shard hashed) against `sha256sum` over the same files, page cache warm, 3 interleaved pairs.

Before each size's first prepare every PNG is read once (`find … -exec cat`), so both sizes read their files from the
page cache and the time per image compares the stage, not the disk.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_memory import CHILD, _descendants, _status_bytes  # noqa: E402

MIB = 1 << 20
CLASSES = 10
POLL = 0.1

FIRST_BATCH = """
import sys, time
started = time.perf_counter()
import numpy as np
from pathlib import Path
from veritrain.data import identity
import veritrain.tasks  # what a training process imports before its first batch
imported = time.perf_counter()
data = identity.load_version(Path(sys.argv[1]))
opened = time.perf_counter()
rows = np.random.default_rng(0).permutation(data.splits["train"])[:128]
x, y = np.asarray(data.inputs[rows]), np.asarray(data.targets[rows])
batch = time.perf_counter()
print(imported - started, opened - imported, batch - opened, x.shape[0], len(data.sample_ids))
"""


def _write_range(args: tuple[str, int, int]) -> None:
    from realdata import _distinct_photo_crop, _write, png_bytes

    import numpy as np

    root, start, stop = args
    for i in range(start, stop):
        rng = np.random.default_rng([0, i])
        _write(Path(root), f"class_{i % CLASSES}/{i:07d}.png", png_bytes(_distinct_photo_crop(rng, 32)))


def dataset(folder: Path, images: int) -> Path:
    """`images` PNGs (image i a function of i alone, as tests/realdata.py `write_png_dataset` makes them), written by
    as many processes as there are cores, once: a marker beside the folder says it is complete."""
    root, done = folder / f"png_{images}", folder / f"png_{images}.done"
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        started = time.perf_counter()
        step = 5000
        with multiprocessing.get_context("spawn").Pool(os.cpu_count() or 1) as pool:
            pool.map(_write_range, [(str(root), a, min(a + step, images)) for a in range(0, images, step)])
        done.touch()
        print(f"wrote {images} PNGs to {root} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return root


def prepare(root: Path, workspace: Path) -> dict:
    """`veritrain data prepare` of `root` into `workspace` in a child process: seconds, the process's own peak and the
    largest sum over it and its workers, and the version's id."""
    workspace.mkdir(parents=True, exist_ok=True)
    config = workspace / "data.yaml"
    config.write_text(f"data: {{source: imagefolder, root: {json.dumps(str(root))}, on_split_skew: warn}}\n")
    peak_file, out_file, err_file = workspace / ".main_peak", workspace / ".stdout", workspace / ".stderr"
    command = [sys.executable, "-c", CHILD, str(peak_file), "data", "prepare", str(config), "--workdir", str(workspace), "--json"]
    tree_peak, started = 0, time.perf_counter()
    with open(out_file, "wb") as out, open(err_file, "wb") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err)
        while True:
            pid, status, _ = os.wait4(child.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                break
            tree = _status_bytes(child.pid, ("VmRSS",)).get("VmRSS", 0)
            tree += sum(_status_bytes(w, ("VmRSS",)).get("VmRSS", 0) for w in _descendants(child.pid))
            tree_peak = max(tree_peak, tree)
            time.sleep(POLL)
    seconds = time.perf_counter() - started
    if code != 0:
        sys.exit(f"error: prepare exited {code}:\n{err_file.read_text()[-3000:]}")
    result = json.loads(out_file.read_text())
    report = workspace / ".veritrain" / "data" / result["data_version"] / "data_report.json"
    stages = json.loads(report.read_text()).get("timings_seconds", {})  # where the time went, by stage
    return {"seconds": seconds, "main_peak": int(peak_file.read_text()), "tree_peak": tree_peak, "version": result["data_version"],
            "stages": stages}


def fields_of(version_dir: Path) -> dict[str, set[str]]:
    info = json.loads((version_dir / "version.json").read_text())
    return {name: {e["id"] for e in spec["shards"]} for name, spec in info["fields"].items()}


def splits_of(version_dir: Path) -> dict[str, str]:
    import csv

    with open(version_dir / "manifest.csv", newline="", encoding="utf-8") as f:
        return {row["sample_id"]: row["split"] for row in csv.DictReader(f)}


def first_batch(version_dir: Path) -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    interpreter = time.perf_counter() - started
    out = subprocess.run([sys.executable, "-c", FIRST_BATCH, str(version_dir)], check=True, capture_output=True, text=True).stdout.split()
    imports, opened, batch = (float(v) for v in out[:3])
    return {"interpreter": interpreter, "imports": imports, "open": opened, "batch": batch, "open_to_batch": opened + batch}


def verify_throughput(version_dir: Path) -> dict:
    """The whole check of the version against `sha256sum` over the same files (shards and bound files), interleaved."""
    files = [p for p in version_dir.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    ours, theirs = [], []
    code = ("import sys; from pathlib import Path; from veritrain.core.hashing import sha256_file; from veritrain.data import identity; "
            "p = Path(sys.argv[1]); import time; t = time.perf_counter(); "
            "found = identity.data_version_problems(p.name, lambda n: (p / n).read_bytes(), lambda n: sha256_file(p / n), None); "
            "print(time.perf_counter() - t, len(found))")
    for _ in range(3):
        seconds, problems = subprocess.run([sys.executable, "-c", code, str(version_dir)], check=True, capture_output=True, text=True).stdout.split()
        assert problems == "0", problems
        ours.append(float(seconds))
        started = time.perf_counter()
        subprocess.run(["sha256sum", *map(str, files)], check=True, stdout=subprocess.DEVNULL)
        theirs.append(time.perf_counter() - started)
    return {"bytes": size, "ours": min(ours), "sha256sum": min(theirs), "ratio": min(theirs) / min(ours)}


def warm(root: Path) -> float:
    """Every PNG read once, so each size's prepare reads its files from the page cache (a million 32×32 PNGs are about
    4 GB): the figures per image then compare the stage, not the disk. Returns the seconds it took."""
    started = time.perf_counter()
    subprocess.run(["find", str(root), "-type", "f", "-exec", "cat", "{}", "+"], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def one_size(folder: Path, images: int, reprepare: bool = True) -> dict:
    root = dataset(folder, images)
    workspace = Path(tempfile.mkdtemp(prefix=f"vt-million-{images}-", dir=folder))
    try:
        print(f"{images} images: page cache warmed in {warm(root):.0f} s", flush=True)
        first = prepare(root, workspace)
        before = workspace / ".veritrain" / "data" / first["version"]
        timing = first_batch(before)
        verify = verify_throughput(before)
        if not reprepare:
            return {"images": images, "prepare": first, "first_batch": timing, "verify": verify, "reprepare": None}
        store_before = {p.name for p in (workspace / ".veritrain" / "shards").glob("*/*")}
        added = root / "class_0" / f"{images:07d}.png"
        _write_range((str(root), images, images + 1))
        try:
            second = prepare(root, workspace)
        finally:
            added.unlink()
        after = workspace / ".veritrain" / "data" / second["version"]
        new = {name: len(ids - fields_of(before).get(name, set())) for name, ids in fields_of(after).items()}
        gained = len({p.name for p in (workspace / ".veritrain" / "shards").glob("*/*")} - store_before)
        old_splits, new_splits = splits_of(before), splits_of(after)
        moved = sum(1 for sid, split in old_splits.items() if new_splits.get(sid) != split)
        return {"images": images, "prepare": first, "first_batch": timing, "verify": verify,
                "reprepare": {**second, "new_shards": new, "store_gained": gained, "moved": moved}}
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--dir", default="/tmp/vt-million")
    parser.add_argument("--reprepare-up-to", type=int, default=None, help="re-prepare after an added image only up to this size")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    results = []
    for images in sorted(args.sizes):
        r = one_size(folder, images, args.reprepare_up_to is None or images <= args.reprepare_up_to)
        results.append(r)
        p, b, v, a = r["prepare"], r["first_batch"], r["verify"], r["reprepare"]
        print(f"{images} images: prepare {p['seconds']:.0f} s ({p['seconds'] / images * 1e3:.2f} ms/image), peak {p['main_peak'] / MIB:.0f} MiB "
              f"(all processes {p['tree_peak'] / MIB:.0f} MiB); open {b['open']:.3f} s + first batch {b['batch']:.3f} s = "
              f"{b['open_to_batch']:.3f} s (interpreter {b['interpreter']:.2f} s, imports {b['imports']:.2f} s apart); verify "
              f"{v['bytes'] / MIB / v['ours']:.0f} MiB/s vs sha256sum {v['bytes'] / MIB / v['sha256sum']:.0f} MiB/s ({v['ratio']:.2f}×)"
              + (f"; one image added: re-prepare {a['seconds']:.0f} s, new shards {a['new_shards']}, store +{a['store_gained']}, "
                 f"moved {a['moved']}" if a else ""), flush=True)
        print(f"  stages of the first prepare (s): {p['stages']}" + (f"\n  stages of the second: {a['stages']}" if a else ""), flush=True)
    if len(results) > 1:
        small, large = results[0], results[-1]
        print(f"{large['images']} vs {small['images']}: peak memory {large['prepare']['main_peak'] / small['prepare']['main_peak']:.2f}× "
              f"(all processes {large['prepare']['tree_peak'] / small['prepare']['tree_peak']:.2f}×), time per image "
              f"{(large['prepare']['seconds'] / large['images']) / (small['prepare']['seconds'] / small['images']):.2f}×")
    print(json.dumps(results, indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
