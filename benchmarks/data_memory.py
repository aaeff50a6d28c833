"""Peak memory of `veritrain data prepare` against the number of images: what each extra image costs.

    .venv/bin/python benchmarks/data_memory.py [--sizes 5000 10000 20000] [--dir /tmp/vt-memory-bench]

Writes an imagefolder of distinct 32×32 RGB PNGs per size (tests/realdata.py `write_png_dataset`, kept in
--dir and reused by later runs), then for each size runs `python -m veritrain data prepare CONFIG --workdir
<fresh temporary workspace> --json` in a child process, with a config that names only the source and the
folder. Prints per size: images, their decoded pixels (MiB), the peak resident memory of the main process
and of the largest worker process, the peak of all of them together, and the wall time; then the least-squares
slope of peak memory per extra image in KiB, next to the 3 KiB (32·32·3 bytes) of pixels per image.

How memory is measured. The child is `python -c` with a few lines that register an atexit hook and then call
veritrain's CLI: at exit the hook reads VmHWM (the kernel's high-water mark of resident memory for that
process alone) from /proc/self/status into a file, so the main-process peak is exact and not mixed up with
other processes. getrusage(RUSAGE_CHILDREN) would not do: it reports the largest of all children ever reaped
by this script. The worker processes prepare starts (multiprocessing spawn) do not run that hook, so while
the child runs this script walks /proc every 50 ms, finds the child's descendants by parent pid, and keeps
each one's latest VmHWM (its own peak so far, so a sample needs to land only before it exits, not at its
peak) and the largest sum of VmRSS over the whole tree seen at one sample (that sum can miss a short spike).
To measure another checkout, run with PYTHONPATH=<checkout>/src: the child inherits the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from realdata import write_png_dataset  # noqa: E402

SIDE = 32  # px
PIXEL_BYTES = SIDE * SIDE * 3  # uint8 RGB per image once decoded
POLL_SECONDS = 0.05
MIB = 1 << 20

# The child: veritrain's CLI with an exit hook that records this process's own peak resident memory.
CHILD = """
import atexit, sys
def _peak():
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(sys.argv[1], "w") as out:
        out.write(str(kib * 1024))
atexit.register(_peak)
from veritrain.cli import main
main(sys.argv[2:])
"""


@dataclass
class Measurement:
    images: int
    seconds: float
    main_peak: int  # bytes: VmHWM of the prepare process itself
    worker_peaks: dict[int, int] = field(default_factory=dict)  # pid → bytes: last VmHWM seen of each descendant
    tree_peak: int = 0  # bytes: the largest sum of VmRSS over the process and its descendants at one sample
    samples: int = 0  # how many rows of data the version holds (train + val + test)


def _status_bytes(pid: int, keys: tuple[str, ...]) -> dict[str, int]:
    found = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name = line.split(":", 1)[0]
                if name in keys:
                    found[name] = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass  # it exited between the listing and the read
    return found


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    parents[int(entry.name)] = int(stat.read().rsplit(")", 1)[1].split()[1])  # field 4: ppid
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, ppid in parents.items() if ppid in frontier]
        found += children
        frontier = children
    return found


def measure(root: Path, images: int) -> Measurement:
    """One `veritrain data prepare` of `root` into a fresh workspace, watched until it exits."""
    scratch = Path(tempfile.mkdtemp(prefix="vt-memory-"))
    try:
        config = scratch / "data.yaml"
        # labels carry no meaning here, and a class's split may stray past 3σ by chance (5,000 images: class_7's val at
        # +4σ): the skew is reported, not a reason to stop measuring memory
        config.write_text(f"data: {{source: imagefolder, root: {json.dumps(str(root))}, on_split_skew: warn}}\n")
        peak_file = scratch / "main_peak"
        stdout, stderr = scratch / "stdout", scratch / "stderr"
        command = [sys.executable, "-c", CHILD, str(peak_file), "data", "prepare", str(config), "--workdir", str(scratch / "ws"), "--json"]
        worker_peaks: dict[int, int] = {}
        tree_peak = 0
        started = time.perf_counter()
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            child = subprocess.Popen(command, stdout=out, stderr=err)
            while True:
                pid, status, _ = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    child.returncode = os.waitstatus_to_exitcode(status)
                    break
                tree = _status_bytes(child.pid, ("VmRSS",)).get("VmRSS", 0)
                for worker in _descendants(child.pid):
                    memory = _status_bytes(worker, ("VmRSS", "VmHWM"))
                    tree += memory.get("VmRSS", 0)
                    if "VmHWM" in memory:
                        worker_peaks[worker] = memory["VmHWM"]
                tree_peak = max(tree_peak, tree)
                time.sleep(POLL_SECONDS)
        seconds = time.perf_counter() - started
        if child.returncode != 0:
            sys.exit(f"error: veritrain data prepare exited {child.returncode} on {images} images:\n{stderr.read_text()[-3000:]}")
        result = json.loads(stdout.read_text())
        return Measurement(images, seconds, int(peak_file.read_text()), worker_peaks, tree_peak, sum(result["counts"].values()))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def dataset(folder: Path, images: int) -> Path:
    """The PNG folder of that size, written once and reused (a marker beside it says it is complete)."""
    root, done = folder / f"png_{images}", folder / f"png_{images}.done"
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        started = time.perf_counter()
        write_png_dataset(root, images, size=SIDE)
        done.touch()
        print(f"wrote {images} PNGs to {root} in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return root


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 10000, 20000])
    parser.add_argument("--dir", default="/tmp/vt-memory-bench")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'images':>7} {'pixels MiB':>10} {'main peak MiB':>13} {'worker peak MiB':>15} {'all peak MiB':>12} {'workers':>7} {'seconds':>7}")
    for images in sorted(args.sizes):
        m = measure(dataset(folder, images), images)
        if m.samples != images:
            print(f"note: the data version holds {m.samples} of {images} images", file=sys.stderr)
        worker_peak = max(m.worker_peaks.values(), default=0)
        print(
            f"{images:>7} {images * PIXEL_BYTES / MIB:>10.1f} {m.main_peak / MIB:>13.1f} {worker_peak / MIB:>15.1f}"
            f" {m.tree_peak / MIB:>12.1f} {len(m.worker_peaks):>7} {m.seconds:>7.1f}"
        )
        rows.append(m)
    if len(rows) < 2:
        return
    sizes = np.array([m.images for m in rows], dtype=np.float64)
    for name, peaks in (("main process", [m.main_peak for m in rows]), ("all processes", [m.tree_peak for m in rows])):
        slope, intercept = np.polyfit(sizes, np.array(peaks, dtype=np.float64), 1)
        print(
            f"{name}: {slope / 1024:.1f} KiB per extra image (least squares; {intercept / MIB:.0f} MiB at 0 images)"
            f" = {slope / PIXEL_BYTES:.1f}× the {PIXEL_BYTES / 1024:.0f} KiB of pixels per image"
        )


if __name__ == "__main__":
    main()
