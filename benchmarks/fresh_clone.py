"""What a newcomer waits for: a fresh clone, `make demo` (install, then the run), and `veritrain verify latest`,
each part in wall and CPU seconds (user + system of the child processes).

    python benchmarks/fresh_clone.py            # clones this checkout's HEAD into a temporary folder

The install reads the same package sources as `make` does (a local torch wheel when pip is set up with one);
wall seconds on a shared machine depend on its load, which is printed with them.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(command: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one command; its output goes to a log beside the clone."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(cwd.parent / "log.txt", "a") as log:
        done = subprocess.run(command, cwd=cwd, stdout=log, stderr=log)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(command)} exited {done.returncode}; see {cwd.parent / 'log.txt'}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="veritrain-clone-") as tmp:
        clone = Path(tmp) / "veritrain"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        parts = {
            "install": timed(["make", "install"], clone),
            "run": timed(["make", "demo"], clone),  # installed already: `veritrain run`
            "verify": timed([str(clone / ".venv" / "bin" / "veritrain"), "verify", "latest"], clone),
        }
        wall, cpu = sum(w for w, _ in parts.values()), sum(c for _, c in parts.values())
        shown = ", ".join(f"{name} {w:.1f} s (CPU {c:.1f} s)" for name, (w, c) in parts.items())
        print(f"fresh clone → make demo → verified run: {wall:.1f} s (CPU {cpu:.1f} s): {shown}; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
