"""The one seeding function of every process that trains (run, train, smoke test, sweep trial, replay, rank, a
user's loop): Python's, NumPy's and torch's generators, and deterministic kernels when asked.

Deterministic kernels are set with torch's own switch (`torch._C._set_deterministic_algorithms`, what
`torch.use_deterministic_algorithms` sets besides the compiler's flag). The public function also imports
`torch._inductor` to set that flag, about 1.5–2.8 s in every process, for code that is never compiled: the
compiler's flag is set only for a run that compiles (`train.compile`), or when the compiler is already loaded.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np


def seed_everything(seed: int, deterministic: bool, compiler: bool = False) -> None:
    """Seed Python's, NumPy's and torch's generators (torch's seeds every CUDA device too) with `seed`; with
    `deterministic`, only deterministic kernels (cuBLAS's fixed workspace set before its first use, cuDNN's
    autotuner off), and the compiler's deterministic mode when `compiler` or when torch._inductor is loaded."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch._C._set_deterministic_algorithms(True)
        if compiler or "torch._inductor.config" in sys.modules:
            import torch._inductor.config as inductor_config

            inductor_config.deterministic = True
        torch.backends.cudnn.benchmark = False
