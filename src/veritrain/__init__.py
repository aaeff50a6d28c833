"""veritrain: verifiable training for PyTorch.

Every run is recorded (config, data version, environment, logs, metrics, checkpoints) and hashed,
so that it can later be verified or reproduced. Start with `veritrain run` or read the README.
"""

from veritrain.core.version import __version__

__all__ = ["__version__"]
