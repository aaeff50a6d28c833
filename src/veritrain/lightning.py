"""veritrain for Lightning (`pip install veritrain[lightning]`): a Trainer's run recorded and sealed as a script's run.

    trainer = L.Trainer(max_epochs=3, deterministic=True, callbacks=[vt.lightning.Callback(inputs=["data/train.csv"])],
                        plugins=[vt.lightning.CheckpointIO()])
    trainer.fit(model, vt.lightning.loader(dataset, batch_size=64), ckpt_path=vt.lightning.ckpt_path(args.ckpt))

- `Callback` starts the run when fitting starts: the config is the module's hparams and the Trainer settings that
  change the result, the inputs are hashed, the script and its modules recorded; the metrics Lightning logs go to
  metrics.jsonl; `on_save_checkpoint` adds veritrain's part to each checkpoint (the run id, the RNG states, the loop's
  position and the trajectory so far); leaving `fit` seals the run, an exception ends it failed or interrupted.
  Checkpoints go to the run's `checkpoints/` unless the ModelCheckpoint names a folder of its own.
- `CheckpointIO` writes each checkpoint as Lightning does, then hashes it and enters it in the trajectory (no
  Callback hook runs after the write).
- `loader(dataset, batch_size)` gives the training batches in veritrain's order, a pure function of (seed, epoch,
  batch), and keeps its position in every checkpoint (`state_dict`/`load_state_dict`), so a fit resumed from a
  checkpoint taken mid-epoch draws what the uninterrupted fit drew.
- `ckpt_path(given)` is what `trainer.fit(..., ckpt_path=)` continues from: `given` normally, and under a replay
  (`veritrain audit`, `train --resume`, `reproduce`) the checkpoint the replay starts at.

A Lightning run is `replayable` when its training batches came from `loader`, `trainer.fit` took its ckpt_path from
`ckpt_path()`, deterministic algorithms were on and a checkpoint was saved: a kill -9 resume and an audit's replay
are then bit-identical (tests/test_lightning.py). Otherwise it is `bound`, with the reasons (docs/api.md).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterator, Sized
from pathlib import Path
from typing import Any, Callable, Optional, Union

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from veritrain.core.errors import RunFailed
from veritrain.core.hashing import state_dict_sha256
from veritrain.train import trajectory
from veritrain.train.checkpointer import rng_state, set_rng_state
from veritrain.train.order import Order
from veritrain.userloop import frameworks, run as run_module
from veritrain.userloop.canonical import canonical_config
from veritrain.userloop.frameworks import KEY
from veritrain.userloop.replay_spec import ReplaySpec
from veritrain.userloop.run import Run, UsageError

__all__ = ["Callback", "CheckpointIO", "Loader", "loader", "ckpt_path"]

# the Trainer settings that change what is trained, recorded with the hparams
TRAINER_SETTINGS = ("max_epochs", "max_steps", "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm",
                    "precision", "limit_train_batches", "limit_val_batches", "val_check_interval", "check_val_every_n_epoch")

# the fit this process is recording: "trainer"; "resume_at", the Loader position of the checkpoint it resumed from
# (taken by the training Loader when Lightning does not restore it, as after a checkpoint at an epoch's end);
# "ckpt_path", what ckpt_path() last answered
_fit: dict[str, Any] = {}


def state_hashes(checkpoint: dict[str, Any]) -> tuple[str, str]:
    """(state_sha256, model_sha256) of a Lightning checkpoint (veritrain.userloop.frameworks)."""
    try:
        return frameworks.lightning_hashes(checkpoint)
    except TypeError as err:
        raise UsageError(f"vt.lightning: the checkpoint's training state holds a value the state hash does not cover ({err})") from None


# ---------------------------------------------------------------- the data order


class Loader:
    """The training batches of a map-style `dataset` (len() and [i]) in veritrain's order: epoch e permutes the rows
    with a generator seeded from (seed, e) alone, as `run.batches` does (veritrain.train.order), and batch b is the
    b-th `batch_size` rows of it, collated by `collate_fn` (torch's default_collate). The position is (epoch,
    batches of it trained); `state_dict`/`load_state_dict` carry it through a checkpoint. `seed`: None takes the
    run's seed (the config's `seed`). One process: a Trainer on several devices needs its own sampler."""

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = True, drop_last: bool = False,
                 collate_fn: Optional[Callable[[list[Any]], Any]] = None, seed: Optional[int] = None) -> None:
        if not isinstance(dataset, Sized) or not callable(getattr(dataset, "__getitem__", None)):
            raise UsageError(f"vt.lightning.loader: a {type(dataset).__name__} has no len() and [index]; give a map-style dataset")
        for label, value in (("batch_size", batch_size), ("dataset length", len(dataset))):
            if type(value) is not int or value < 1:
                raise UsageError(f"vt.lightning.loader: {label} {value!r}; give a positive whole number")
        if seed is not None and type(seed) is not int:
            raise UsageError(f"vt.lightning.loader: seed={seed!r}; give a whole number, or None for the run's seed")
        if drop_last and len(dataset) < batch_size:
            raise UsageError(f"vt.lightning.loader: {len(dataset)} rows make no full batch of {batch_size} with drop_last=True")
        from torch.utils.data import default_collate

        self.dataset: Any = dataset
        self.batch_size, self.shuffle, self.drop_last = batch_size, bool(shuffle), bool(drop_last)
        self.collate_fn = collate_fn or default_collate
        self.seed = seed
        self._next: Optional[tuple[int, int]] = None  # (epoch 0-based, batch) the next pass starts at; None: not yet known
        self._epoch = 0  # the epoch the current pass draws
        self._trained = (0, 0)  # (epoch, batches of it trained), as the Callback counts them
        self._tracked = False  # a Callback counts the batches trained (set when training starts)

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _seed(self) -> int:
        if self.seed is not None:
            return self.seed
        run = run_module.active()
        return run.seed if run is not None else int(torch.initial_seed() % 2**63)

    def __iter__(self) -> Iterator[Any]:
        # a generator: nothing moves until the first batch is asked for (Lightning calls iter() once just to check)
        if self._next is None:  # the first pass of this process: where the resumed checkpoint was, else the start
            resume_at = _fit.pop("resume_at", None) if _training() else None
            if resume_at is not None:
                self.load_state_dict(resume_at)
        if self._tracked:  # the Callback counts the batches trained: a pass starts where training stands, so a second
            epoch, first = self._position()  # iter() for the same epoch (Lightning makes one after some resumes) repeats it
        else:
            epoch, first = self._next or (0, 0)
        self._next = (epoch + 1, 0)  # without the Callback, each pass is one epoch
        self._epoch, self._trained = epoch, (epoch, first)
        seed = self._seed()
        if self.shuffle:
            rows = Order(len(self.dataset), self.batch_size, 1, self.drop_last, seed).permutation(epoch + 1)
        else:
            rows = np.arange(len(self.dataset), dtype=np.int64)
        for batch in range(first, len(self)):
            yield self.collate_fn([self.dataset[int(i)] for i in rows[batch * self.batch_size:(batch + 1) * self.batch_size]])

    def _position(self) -> tuple[int, int]:
        """(epoch, batches of it trained), an epoch's end counted as the next epoch's start."""
        epoch, done = self._trained
        return (epoch + 1, 0) if done >= len(self) else (epoch, done)

    def _batch_trained(self) -> None:
        epoch, done = self._trained
        self._trained = (epoch, done + 1)

    def _epoch_ended(self) -> None:
        self._trained = (self._trained[0] + 1, 0)

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches trained so far, and what the order depends on."""
        epoch, done = self._position()
        return {"epoch": epoch, "batch": done, "n": len(self.dataset), "batch_size": self.batch_size, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "seed": self._seed()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        changed = [f"{key} {state.get(key)!r} → {mine[key]!r}" for key in ("n", "batch_size", "shuffle", "drop_last", "seed") if state.get(key) != mine[key]]
        if changed:
            raise UsageError(f"vt.lightning.loader: the checkpoint was saved with another order ({', '.join(changed)}); "
                             "give the same dataset, batch_size, shuffle, drop_last and seed")
        epoch, done = int(state["epoch"]), int(state["batch"])
        self._next, self._trained = (epoch, done), (epoch, done)


def loader(dataset: Any, batch_size: int, shuffle: bool = True, drop_last: bool = False,
           collate_fn: Optional[Callable[[list[Any]], Any]] = None, seed: Optional[int] = None) -> Loader:
    """The training batches of `dataset` in veritrain's order, resumable from any checkpoint (`Loader`): pass it to
    trainer.fit in place of a DataLoader."""
    return Loader(dataset, batch_size, shuffle, drop_last, collate_fn, seed)


def _training() -> bool:
    trainer = _fit.get("trainer")
    return trainer is not None and bool(trainer.training)


def _train_loaders(trainer: pl.Trainer) -> tuple[list[Loader], int]:
    """(the veritrain Loaders among the fit's training loaders, how many training loaders there are)."""
    found: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif value is not None:
            found.append(value)

    walk(trainer.train_dataloader)
    return [item for item in found if isinstance(item, Loader)], len(found)


# ---------------------------------------------------------------- where a fit continues from


def ckpt_path(given: Optional[Union[str, Path]] = None) -> Optional[str]:
    """The checkpoint for `trainer.fit(..., ckpt_path=)`: `given` (the script's own choice: None for a new run, or a
    checkpoint of the run to continue), except under a replay: `veritrain audit` gives the segment's start (None
    for the initial state), `train --resume` the run's newest readable checkpoint, `reproduce` None. A run whose fit
    does not start from this answer cannot be replayed (its level says so)."""
    spec = ReplaySpec.from_environment()
    if spec is None:
        answer = str(given) if given is not None else None
    elif spec.mode == "audit":
        answer = spec.start_file
    elif spec.mode == "resume":
        answer = _newest_checkpoint(spec.run)
    else:
        answer = None
    _fit["ckpt_path"] = {"answer": answer}
    return answer


def _newest_checkpoint(run_dir: Path) -> Optional[str]:
    """The newest checkpoint of the run in `run_dir` that loads and is the run's (a kill can leave a torn file)."""
    files = sorted((p for p in run_dir.rglob("*.ckpt") if p.is_file()), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for path in files:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            continue
        if isinstance(checkpoint, dict) and (checkpoint.get(KEY) or {}).get("run_id") == run_dir.name:
            return str(path)
    return None


def _same_path(a: Optional[str], b: Optional[str]) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return Path(a).resolve() == Path(b).resolve()


# ---------------------------------------------------------------- the callback


class Callback(pl.Callback):
    """Records the Trainer's fit as a veritrain run (see the module docstring). `config`: the config to record instead
    of the module's hparams and the Trainer settings."""

    def __init__(self, inputs: Optional[list[Union[str, Path, Any]]] = None, name: Optional[str] = None, workdir: Union[str, Path] = ".",
                 config: Optional[object] = None) -> None:
        self.inputs, self.name, self.workdir, self.config = inputs, name, workdir, config
        self.run: Optional[Run] = None
        run_module.install_excepthook()  # a veritrain error the script leaves uncaught: one line, its exit code
        self._loaded: Optional[dict[str, Any]] = None  # veritrain's part of the checkpoint Lightning resumed from
        # the RNG states after the last batch trained: each training batch starts from them, so that what runs between
        # two batches (validation: a DataLoader draws its seed from torch's RNG) never moves the training's random stream,
        # and a fit resumed where Lightning skips a validation draws what the uninterrupted fit drew
        self._rng_after_train: Optional[dict[str, Any]] = None

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
        continues, from which trajectory; its RNG states are put back when training starts."""
        mine = checkpoint.get(KEY)
        if isinstance(mine, dict):
            state_hash, model_hash = state_hashes(checkpoint)
            self._loaded = {"run_id": mine.get("run_id"), "trajectory": list(mine.get("trajectory") or []), "state_sha256": state_hash,
                            "model_sha256": model_hash, "step": int(checkpoint.get("global_step", 0)), "epoch": int(checkpoint.get("epoch", 0)),
                            "rng": mine.get("rng"), "loader": (mine.get("position") or {}).get("loader")}
            self._rng_after_train = mine.get("rng")  # put back when the first batch after the resume starts

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the run (or continue the one the checkpoint Lightning resumed from belongs to); its checkpoints go into it."""
        if self.run is not None or not trainer.is_global_zero:
            return
        loaded = self._loaded
        resume = str(loaded["run_id"]) if loaded and loaded.get("run_id") else None
        asked = _fit.pop("ckpt_path", None)
        _fit.clear()
        _fit["trainer"] = trainer
        self.run = run = run_module.start_for("lightning", self._config(trainer, pl_module), self.name, self.inputs, self.workdir, resume,
                                              torch.are_deterministic_algorithms_enabled())
        fit_from = str(trainer.ckpt_path) if trainer.ckpt_path else None
        run.facts.state_registered = asked is not None and _same_path(asked["answer"], fit_from)
        replay = run.replay
        if replay is not None and not run.facts.state_registered:
            raise RunFailed(f"replay: trainer.fit did not start from vt.lightning.ckpt_path()'s answer ({asked['answer'] if asked else 'never asked'}, "
                            f"fit from {fit_from}); the script must pass ckpt_path=vt.lightning.ckpt_path(...) for a replay")
        folder = run.dir / "checkpoints" if run.dir is not None else Path(str(replay.out)).parent / "checkpoints" if replay and replay.out else None
        for callback in trainer.checkpoint_callbacks:
            if folder is not None and isinstance(callback, ModelCheckpoint) and callback.dirpath in (None, _default_dirpath(trainer)):
                callback.dirpath = str(folder)  # into the run, whose seal then covers them (an audit: its scratch folder)
        if loaded and (resume or run.replaying_audit):
            entry = trajectory.entry(loaded["trajectory"], run.config_hash, run.engine.binding, loaded["step"], loaded["epoch"],
                                     loaded["state_sha256"], loaded["model_sha256"])
            path = Path(fit_from).resolve() if fit_from else None
            if path is not None and run.dir is not None and path.is_relative_to(run.dir.resolve()):
                entry["file"] = path.relative_to(run.dir.resolve()).as_posix()
                _discard_later_checkpoints(run.dir, loaded["trajectory"] + [entry])
            run.continue_trajectory(loaded["trajectory"] + [entry], loaded["step"])
            _fit["resume_at"] = loaded.get("loader")
        elif not run.engine.entries:  # a new run (or one continued before its first checkpoint): the initial state is entry 0
            if run.dir is not None and replay is not None and replay.mode == "resume":
                run.continue_trajectory([], 0)
                _discard_later_checkpoints(run.dir, [])
            weights = pl_module.state_dict()
            run.enter_checkpoint(None, trajectory.state_sha256({"state_dict": weights}), state_dict_sha256(weights), 0, 0,
                                 write=lambda path: torch.save({"state_dict": weights}, path), suffix=".pt")
            run.facts.checkpoints -= 1  # the initial state is no save

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = self.run
        if run is None:
            return
        loaders, count = _train_loaders(trainer)
        run.facts.batches_used = bool(loaders) and len(loaders) == count
        for item in loaders:
            item._tracked = True
        if loaders and trainer.world_size > 1:
            raise UsageError(f"vt.lightning.loader: the Trainer runs {trainer.world_size} processes; the loader orders the data for one")
        run.record_progress()  # what a continuation after a kill needs to know (the record is sealed at the end)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.run is not None and self._rng_after_train is not None:
            set_rng_state(self._rng_after_train)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        for item in _train_loaders(trainer)[0]:
            item._batch_trained()  # before ModelCheckpoint's hook (Lightning runs checkpoint callbacks last)
        if self.run is not None:
            self._rng_after_train = rng_state()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for item in _train_loaders(trainer)[0]:
            item._epoch_ended()
        self._log(trainer, "train")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.run is not None:
            loaders = _train_loaders(trainer)[0]
            position: dict[str, Any] = {"global_step": trainer.global_step, "epoch": trainer.current_epoch}
            if len(loaders) == 1:
                position["loader"] = loaders[0].state_dict()
            rng = self._rng_after_train if self._rng_after_train is not None else rng_state()  # what the next batch starts from
            checkpoint[KEY] = {"run_id": self.run.id, "rng": rng, "trajectory": list(self.run.engine.entries), "position": position,
                               "recipe": frameworks.LIGHTNING_STATE_RECIPE}

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
        if not run.engine.entries or run.engine.entries[-1]["step"] != trainer.global_step:  # the final state, as the trajectory's last entry
            folder = run.dir / "checkpoints" if run.dir is not None else Path(str(run.replay.out)).parent if run.replay and run.replay.out else None
            assert folder is not None
            trainer.save_checkpoint(str(folder / "last.ckpt"))
        run.epochs_done = trainer.current_epoch
        run.finish(metrics=_scalars(trainer.callback_metrics))
        self.run = None
        _fit.clear()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        run, self.run = self.run, None
        _fit.clear()
        if run is None:
            return
        if run.replaying_audit:  # an audit replay stops here (its stretch's end, or the fit's): the parent judges what came back
            run_module.release()
        else:
            run.abandon(exception)


def _discard_later_checkpoints(run_dir: Path, entries: list[dict[str, Any]]) -> None:
    """A run continued from a checkpoint: the checkpoint files written after it (or torn by the kill) are no part of
    the run that continues; they go, so that the continued run's saves do not sit beside them."""
    keep = {str(entry["file"]) for entry in entries if entry.get("file")}
    folder = run_dir / "checkpoints"
    for path in folder.rglob("*.ckpt") if folder.is_dir() else []:
        if path.relative_to(run_dir).as_posix() not in keep:
            path.unlink()


class CheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save checkpoints, each hashed after it is written and entered in the run's trajectory (an
    audit replay writes each into the auditor's folder instead, where the auditor hashes it)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        run = run_module.active()
        if run is None or run.integration != "lightning" or not run.replaying_audit:
            super().save_checkpoint(checkpoint, path, storage_options)
        if run is not None and run.integration == "lightning":
            state_hash, model_hash = state_hashes(checkpoint)

            def write(target: Path) -> None:
                TorchCheckpointIO.save_checkpoint(self, checkpoint, target, storage_options)

            run.enter_checkpoint(Path(str(path)), state_hash, model_hash, int(checkpoint.get("global_step", 0)), int(checkpoint.get("epoch", 0)),
                                 write=write)


def _default_dirpath(trainer: pl.Trainer) -> str:
    """Where Lightning puts checkpoints when the ModelCheckpoint names no folder and there is no logger."""
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
