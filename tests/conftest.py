"""Shared helpers: run the real `veritrain` command in a subprocess, and tiny in-process runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A fast digits config for tests: the pipeline is the real one, only smaller.
FAST = ["--set", "train.epochs=2", "--set", "model.name=mlp", "--set", "model.hidden=[32]"]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def veritrain(*args: str, cwd: Path | None = None, timeout: float = 300) -> Result:
    env = {**os.environ, "COLUMNS": "200", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "veritrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return veritrain


def in_process_run(workdir: Path, overrides: list[str], config: str | Path | None = None, kind: str = "run"):
    """Run the pipeline in this process (no torch import per test), as `veritrain run` does."""
    import torch

    from veritrain import pipeline
    from veritrain.config import load_config
    from veritrain.workspace import Workspace

    threads = torch.get_num_threads()
    resolved = load_config(config, overrides)
    try:
        return pipeline.run(resolved, Workspace.open(workdir), ["veritrain", kind, *overrides], kind=kind)
    finally:
        torch.set_num_threads(threads)  # train.threads must not leak into later tests


FAST_OVERRIDES = ["train.epochs=2", "model.name=mlp", "model.hidden=[32]"]
