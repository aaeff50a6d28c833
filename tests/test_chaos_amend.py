"""Kill -9 during eval, export, baseline, gc, data prepare and import, 10 times each (benchmarks/chaos_amend.py):
every run verifies right after the kill (an amendment is in the run whole or not at all), the next command succeeds,
and nothing staged is left after it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_no_kill_leaves_a_run_that_does_not_verify():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos_amend.py"), "--trials", "10"],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("0 failure(s)"), done.stdout
    for kind in ("eval", "export", "baseline", "gc", "prepare", "import"):  # every command was killed, 10 times
        assert any(line.startswith(f"{kind}: 10 kills") for line in lines), done.stdout
