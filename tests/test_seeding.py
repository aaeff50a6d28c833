"""The one seeding function: deterministic kernels without loading torch's compiler, whose import costs seconds in
every process that trains; the compiler's own switch only for a run that compiles."""

from __future__ import annotations

import subprocess
import sys

PROBE = ("import sys, torch\n"
         "from veritrain.core.seeding import seed_everything\n"
         "seed_everything(3, {deterministic}, compiler={compiler})\n"
         "a = torch.rand(2).tolist()\n"
         "inductor = 'torch._inductor.config' in sys.modules\n"
         "flag = sys.modules['torch._inductor.config'].deterministic if inductor else None\n"
         "print(torch.are_deterministic_algorithms_enabled(), inductor, flag, a)\n")


def probe(deterministic: bool, compiler: bool) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE.format(deterministic=deterministic, compiler=compiler)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_deterministic_kernels_are_set_without_loading_the_compiler():
    import torch

    torch.manual_seed(3)
    drawn = torch.rand(2).tolist()
    assert probe(True, False) == f"True False None {drawn}"
    assert probe(False, False) == f"False False None {drawn}"
    assert probe(True, True) == f"True True True {drawn}"  # train.compile: the compiler's own switch as well
