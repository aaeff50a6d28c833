"""A replayable Lightning run survives kill -9: examples/lightning_module.py killed at ten random moments of its
training, each time continued with `veritrain train --resume` until it completes, ends with the final weights and
the committed trajectory (every checkpoint's state hash) of the uninterrupted run (benchmarks/chaos_resume.py).
Needs the lightning extra (make test-slow)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, need_extra

pytestmark = pytest.mark.slow

try:
    import lightning  # noqa: F401
    HAVE_LIGHTNING = True
except ImportError:
    HAVE_LIGHTNING = False


def test_ten_kills_at_random_moments_each_continue_bit_identically():
    need_extra(HAVE_LIGHTNING, "the lightning extra (pip install 'veritrain[lightning]')")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos_resume.py"), "--kills", "0", "--script-kills", "0",
                           "--lightning-kills", "10", "--seed", "3"], capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "10/10 identical (lightning;" in done.stdout, done.stdout
    killed = int(done.stdout.split("(lightning; ")[1].split(" of them")[0])
    assert killed >= 5, done.stdout  # most cycles killed mid-training (on a loaded machine a fit can end before its kill)
