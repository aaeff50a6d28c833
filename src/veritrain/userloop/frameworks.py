"""The training state inside a framework's own checkpoint file, as the trajectory hashes it: what veritrain.lightning
and veritrain.hf enter for each checkpoint the framework writes, and what `veritrain verify` computes again from the
file to check that it holds its entry's state."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

from veritrain.core.hashing import sha256_file, state_dict_sha256
from veritrain.train import trajectory

KEY = "veritrain"  # veritrain's part of a Lightning checkpoint
# what a Lightning checkpoint holds of the training state (the rest names files, versions, callbacks' bookkeeping)
LIGHTNING_STATE = ("state_dict", "optimizer_states", "lr_schedulers", "loops", "epoch", "global_step")


# how a Lightning checkpoint's state is hashed, as veritrain's part of the checkpoint says (`recipe`): 1 (no recipe
# named: checkpoints of earlier runs) hashes the loops' progress counters too; 2 leaves them out, since Lightning counts
# differently after a resume from a checkpoint on an epoch's last batch (it skips that epoch's validation) while the
# weights, optimizers, schedulers, RNG states and position (global_step, epoch, veritrain's loader) are the same
LIGHTNING_STATE_RECIPE = 2


def lightning_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The training state of a Lightning checkpoint: the weights, optimizers, schedulers, the step and epoch (and,
    in recipe 1, the loops' progress), and veritrain's RNG states and position."""
    mine = checkpoint.get(KEY) or {}
    named = mine.get("recipe")
    recipe: int = named if isinstance(named, int) else 1
    state = {key: checkpoint[key] for key in LIGHTNING_STATE if key in checkpoint and not (recipe >= 2 and key == "loops")}
    state[KEY] = {"rng": mine.get("rng"), "position": mine.get("position"), **({"recipe": recipe} if recipe >= 2 else {})}
    return state


def lightning_hashes(checkpoint: dict[str, Any]) -> tuple[str, str]:
    """(state_sha256, model_sha256) of a Lightning checkpoint; TypeError for a value the state hash does not cover."""
    return trajectory.state_sha256(lightning_state(checkpoint)), state_dict_sha256(checkpoint.get("state_dict") or {})


# the files of a Hugging Face Trainer checkpoint folder (checkpoint-<step>/) that hold training state; rng_state.pth
# is the Trainer's own record of the RNG states, trainer_state.json the loop's progress and log
HF_STATE_FILES = ("model.safetensors", "pytorch_model.bin", "optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth", "trainer_state.json")
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
# HF state recipe 2 (the record's `script.state_recipe`; absent: 1): the files that decide what `from_pretrained` builds
# and how text becomes ids join the state, since an edited config.json (another activation, another epsilon) changes
# the logits of the same weights
HF_STATE_RECIPE = 2
HF_MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model", "tokenizer.model",
                  "sentencepiece.bpe.model", "preprocessor_config.json", "chat_template.jinja")


def hf_hashes(files: dict[str, Path], recipe: int = HF_STATE_RECIPE) -> tuple[str, str]:
    """(state_sha256, model_sha256) of a Trainer checkpoint folder (`files`: file name → path): the state hash is the
    SHA-256 of the sorted `name TAB sha256` lines of its state files (with `recipe` 2, its model and tokenizer files
    too), the weights hash that of its weights (`state_dict_sha256`). ValueError when it holds no weights."""


    named = HF_STATE_FILES + (HF_MODEL_FILES if recipe >= 2 else ())
    present = sorted(name for name in named if name in files)
    weights = next((name for name in HF_WEIGHTS if name in files), None)
    if weights is None:
        raise ValueError("not a Trainer checkpoint (no model.safetensors or pytorch_model.bin)")
    lines = "".join(f"{name}\t{sha256_file(files[name])}\n" for name in present)
    if weights == "model.safetensors":
        from safetensors.torch import load_file

        state_dict = load_file(str(files[weights]))
    else:
        import torch

        state_dict = torch.load(files[weights], map_location="cpu", weights_only=True)
    return hashlib.sha256(lines.encode()).hexdigest(), state_dict_sha256(state_dict)


def file_hashes(integration: str, path: Path, recipe: int = 1) -> tuple[str, str]:
    """(state_sha256, model_sha256) of the checkpoint a framework wrote (a file, or a Trainer's folder), loaded as data
    (weights_only): what its trajectory entry must say. `recipe`: a Trainer folder's state recipe, as the run's record
    names it. ValueError when it cannot be read as one."""
    import torch

    if integration == "hf":
        try:
            return hf_hashes({p.name: p for p in path.iterdir() if p.is_file()}, recipe)
        except (OSError, ValueError, RuntimeError) as err:
            raise ValueError(f"cannot be read as a Trainer checkpoint ({str(err)[:120]})") from None
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


def handed_back(integration: Optional[str], path: Path) -> tuple[str, str, int]:
    """(state_sha256, model_sha256, step) of a state a replay's child handed back in `path` (veritrain.userloop.replay),
    loaded here as data (weights_only) and hashed here: veritrain's checkpoint encoding (the script's own loop, and
    veritrain's loop), a Lightning checkpoint, or Lightning's initial state as {"state_dict": ...}. ValueError when
    it cannot be read as one; nothing the child says about the state is believed."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # the child's file is data: a finding, never a crash
        raise ValueError(f"cannot be loaded as a training state ({str(err)[:120]})") from None
    if not isinstance(state, dict):
        raise ValueError("not a training state (a dict)")
    try:
        if integration == "lightning" and set(state) == {"state_dict"}:  # the initial state (entry 0)
            return trajectory.state_sha256(state), state_dict_sha256(state["state_dict"]), 0
        if integration == "lightning":
            return (*lightning_hashes(state), int(state.get("global_step", -1)))
        model, loop = state.get("model"), state.get("loop")
        if not isinstance(model, dict) or not isinstance(loop, dict):
            raise ValueError("not a veritrain training state (`model` and `loop`)")
        return trajectory.state_sha256(state), state_dict_sha256(model), int(loop.get("step", -1))
    except (TypeError, KeyError) as err:
        raise ValueError(f"holds a value the state hash does not cover ({str(err)[:120]})") from None
