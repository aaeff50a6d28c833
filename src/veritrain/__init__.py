"""veritrain: verifiable training for PyTorch.

Every run is recorded (config, data version, environment, logs, metrics, checkpoints) and hashed,
so that it can later be verified or reproduced. Start with `veritrain run` or read the README; for your own
training script, `veritrain.start` (docs/api.md).

The names below are the public Python API; `import veritrain` stays light (no torch) until one is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from veritrain.core.version import __version__

if TYPE_CHECKING:
    from veritrain import data, hf, lightning
    from veritrain.data.for_scripts import Data
    from veritrain.train.engine import Best
    from veritrain.userloop.run import Run, UsageError, start

# `data`: the data stage's package, callable: veritrain.data(config) prepares a data version for a script
# `lightning`, `hf`: the framework integrations, imported on first use (their extras)
__all__ = ["__version__", "start", "Run", "Best", "UsageError", "data", "Data", "lightning", "hf"]

_LAZY = {"start": "veritrain.userloop.run", "Run": "veritrain.userloop.run", "UsageError": "veritrain.userloop.run",
         "Best": "veritrain.train.engine", "Data": "veritrain.data.for_scripts"}


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (PEP 562), so the CLI's `--help` does not pay for torch."""
    if name in ("data", "lightning", "hf"):  # the data stage (callable), and the framework integrations (extras)
        import importlib

        try:
            return importlib.import_module(f"veritrain.{name}")
        except ModuleNotFoundError as err:
            if name == "data" or (err.name or "").startswith("veritrain"):
                raise
            raise ImportError(f"veritrain.{name} needs the {name} extra, which is not installed ({err.name}): "
                              f"pip install 'veritrain[{name}]'") from None
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'veritrain' has no attribute {name!r}")
