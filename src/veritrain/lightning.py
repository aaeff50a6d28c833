"""veritrain for Lightning (`pip install veritrain[lightning]`): a Trainer's run recorded and sealed as a script's run.

    trainer = L.Trainer(max_epochs=3, callbacks=[vt.lightning.Callback(inputs=["data/train.csv"])],
                        plugins=[vt.lightning.CheckpointIO()])
    trainer.fit(model, loader)                      # trainer.fit(model, loader, ckpt_path=...) continues the same run

- `Callback` starts the run when fitting starts: the config is the module's hparams and the Trainer settings that
  change the result, the inputs are hashed, the script and its modules recorded; the metrics Lightning logs go to
  metrics.jsonl; `on_save_checkpoint` adds veritrain's part to each checkpoint (the run id, the RNG states, the loop's
  position and the trajectory so far); leaving `fit` seals the run, an exception ends it failed or interrupted.
  Checkpoints go to the run's `checkpoints/` unless the ModelCheckpoint names a folder of its own.
- `CheckpointIO` writes each checkpoint as Lightning does, then hashes it and enters it in the trajectory (no
  Callback hook runs after the write).

A Lightning run is `bound` (docs/api.md): every byte is verified, but the loop and its data order are Lightning's,
and a kill -9 resume or a replay through Lightning is not proven bit-identical, so `reproduce` and `audit` refuse it.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from veritrain.core.hashing import state_dict_sha256
from veritrain.train import trajectory
from veritrain.train.checkpointer import rng_state, set_rng_state
from veritrain.userloop import frameworks, run as run_module
from veritrain.userloop.canonical import canonical_config
from veritrain.userloop.frameworks import KEY
from veritrain.userloop.run import Run, UsageError

__all__ = ["Callback", "CheckpointIO"]

# the Trainer settings that change what is trained, recorded with the hparams
TRAINER_SETTINGS = ("max_epochs", "max_steps", "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm",
                    "precision", "limit_train_batches", "limit_val_batches", "val_check_interval", "check_val_every_n_epoch")


def state_hashes(checkpoint: dict[str, Any]) -> tuple[str, str]:
    """(state_sha256, model_sha256) of a Lightning checkpoint (veritrain.userloop.frameworks)."""
    try:
        return frameworks.lightning_hashes(checkpoint)
    except TypeError as err:
        raise UsageError(f"vt.lightning: the checkpoint's training state holds a value the state hash does not cover ({err})") from None


class Callback(pl.Callback):
    """Records the Trainer's fit as a veritrain run (see the module docstring). `config`: the config to record instead
    of the module's hparams and the Trainer settings."""

    def __init__(self, inputs: Optional[list[Union[str, Path, Any]]] = None, name: Optional[str] = None, workdir: Union[str, Path] = ".",
                 config: Optional[object] = None) -> None:
        self.inputs, self.name, self.workdir, self.config = inputs, name, workdir, config
        self.run: Optional[Run] = None
        run_module.install_excepthook()  # a veritrain error the script leaves uncaught: one line, its exit code
        self._loaded: Optional[dict[str, Any]] = None  # veritrain's part of the checkpoint Lightning resumed from

    def _config(self, trainer: pl.Trainer, module: pl.LightningModule) -> dict[str, Any]:
        if self.config is not None:
            return canonical_config(self.config)
        settings = {name: _plain(getattr(trainer, name, None)) for name in TRAINER_SETTINGS}
        return {"hparams": dict(module.hparams), "trainer": settings, "seed": int(torch.initial_seed() % 2**63)}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and not isinstance(trainer.strategy.checkpoint_io, CheckpointIO):
            raise UsageError("vt.lightning.Callback: the Trainer's checkpoints are not hashed; add plugins=[vt.lightning.CheckpointIO()]")

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Resuming through ckpt_path (Lightning loads it before fitting starts): veritrain's part of it says which run
        continues, from which trajectory; its RNG states are put back."""
        mine = checkpoint.get(KEY)
        if isinstance(mine, dict):
            state_hash, model_hash = state_hashes(checkpoint)
            self._loaded = {"run_id": mine.get("run_id"), "trajectory": list(mine.get("trajectory") or []), "state_sha256": state_hash,
                            "model_sha256": model_hash, "step": int(checkpoint.get("global_step", 0)), "epoch": int(checkpoint.get("epoch", 0))}
            if mine.get("rng") is not None:
                set_rng_state(mine["rng"])

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the run (or continue the one the checkpoint Lightning resumed from belongs to); its checkpoints go into it."""
        if self.run is not None or not trainer.is_global_zero:
            return
        loaded = self._loaded
        resume = str(loaded["run_id"]) if loaded and loaded.get("run_id") else None
        self.run = run = run_module.start_for("lightning", self._config(trainer, pl_module), self.name, self.inputs, self.workdir, resume,
                                              torch.are_deterministic_algorithms_enabled())
        assert run.dir is not None
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath in (None, _default_dirpath(trainer)):
                callback.dirpath = str(run.dir / "checkpoints")  # into the run, whose seal then covers them
        if resume and loaded:
            entry = trajectory.entry(loaded["trajectory"], run.config_hash, run._binding, loaded["step"], loaded["epoch"],
                                     loaded["state_sha256"], loaded["model_sha256"])
            path = Path(str(trainer.ckpt_path)).resolve() if trainer.ckpt_path else None
            if path is not None and path.is_relative_to(run.dir.resolve()):
                entry["file"] = path.relative_to(run.dir.resolve()).as_posix()
            run.continue_trajectory(loaded["trajectory"] + [entry], loaded["step"])
        elif not run._entries:  # a new run: the initial state is entry 0
            weights = pl_module.state_dict()
            run.enter_checkpoint(None, trajectory.state_sha256({"state_dict": weights}), state_dict_sha256(weights), 0, 0)
            run._facts.checkpoints -= 1  # the initial state is no save

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.run is not None:
            checkpoint[KEY] = {"run_id": self.run.id, "rng": rng_state(), "trajectory": list(self.run._entries),
                               "position": {"global_step": trainer.global_step, "epoch": trainer.current_epoch}}

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log(trainer, "train")

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log(trainer, "validation")

    def _log(self, trainer: pl.Trainer, phase: str) -> None:
        if self.run is not None:
            self.run.log(trainer.global_step, epoch=trainer.current_epoch, phase=phase, **_scalars(trainer.callback_metrics))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = self.run
        if run is None or not trainer.is_global_zero:
            return
        if not run._entries or run._entries[-1]["step"] != trainer.global_step:  # the final state, as the trajectory's last entry
            assert run.dir is not None
            trainer.save_checkpoint(str(run.dir / "checkpoints" / "last.ckpt"))
        run.epochs_done = trainer.current_epoch
        run.finish(metrics=_scalars(trainer.callback_metrics))
        self.run = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        run, self.run = self.run, None
        if run is not None and not run._finished:
            run._end("interrupted" if isinstance(exception, KeyboardInterrupt) else "failed", error=exception)


class CheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save checkpoints, each hashed after it is written and entered in the run's trajectory."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        run = run_module.active()
        if run is not None and run.integration == "lightning":
            state_hash, model_hash = state_hashes(checkpoint)
            run.enter_checkpoint(Path(str(path)), state_hash, model_hash, int(checkpoint.get("global_step", 0)), int(checkpoint.get("epoch", 0)))


def _default_dirpath(trainer: pl.Trainer) -> str:
    """Where Lightning puts checkpoints when the ModelCheckpoint names no folder and there is no logger."""
    import os

    return os.path.join(trainer.default_root_dir, "checkpoints")


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics Lightning holds, as numbers."""
    found = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            found[str(key)] = value.item()
        elif isinstance(value, numbers.Number) and not isinstance(value, bool):
            found[str(key)] = float(value)  # type: ignore[arg-type]
    return found
