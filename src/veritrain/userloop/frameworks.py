"""The training state inside a framework's own checkpoint file, as the trajectory hashes it: what veritrain.lightning
and veritrain.hf enter for each checkpoint the framework writes, and what `veritrain verify` computes again from the
file to check that it holds its entry's state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from veritrain.core.hashing import state_dict_sha256
from veritrain.train import trajectory

KEY = "veritrain"  # veritrain's part of a Lightning checkpoint
# what a Lightning checkpoint holds of the training state (the rest names files, versions, callbacks' bookkeeping)
LIGHTNING_STATE = ("state_dict", "optimizer_states", "lr_schedulers", "loops", "epoch", "global_step")


def lightning_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The training state of a Lightning checkpoint: the weights, optimizers, schedulers, the loops' progress, and
    veritrain's RNG states and position."""
    state = {key: checkpoint[key] for key in LIGHTNING_STATE if key in checkpoint}
    mine = checkpoint.get(KEY) or {}
    state[KEY] = {"rng": mine.get("rng"), "position": mine.get("position")}
    return state


def lightning_hashes(checkpoint: dict[str, Any]) -> tuple[str, str]:
    """(state_sha256, model_sha256) of a Lightning checkpoint; TypeError for a value the state hash does not cover."""
    return trajectory.state_sha256(lightning_state(checkpoint)), state_dict_sha256(checkpoint.get("state_dict") or {})


def file_hashes(integration: str, path: Path) -> tuple[str, str]:
    """(state_sha256, model_sha256) of the checkpoint file a framework wrote, loaded as data (weights_only): what its
    trajectory entry must say. ValueError when the file cannot be read as one."""
    import torch

    if integration != "lightning":
        raise ValueError(f"no checkpoint format known for {integration!r}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # not a checkpoint a framework could have written: a finding, never a crash
        raise ValueError(f"cannot be read as a Lightning checkpoint ({str(err)[:120]})") from None
    if not isinstance(checkpoint, dict):
        raise ValueError("not a Lightning checkpoint (a dict)")
    try:
        return lightning_hashes(checkpoint)
    except TypeError as err:
        raise ValueError(str(err)) from None
