"""The checkpoints of one training run: what a checkpoint holds, saving one (the files, its trajectory entry, the
keep rule) and going back to one (resume, and the rollback snapshot).

A checkpoint holds everything the loop carries from one step to the next — weights, optimizer, schedule,
gradient scaler, RNG states and `LoopState` — so a run resumed from it ends bit-identical. Rank 0 alone writes
files; with several ranks it gathers every rank's generators into each checkpoint. Files and their atomic writes
are `veritrain.train.checkpoint`; the hash chain of saved states is `veritrain.train.trajectory`.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

import numpy as np
import torch

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import state_dict_sha256
from veritrain.train import checkpoint, steplog, trajectory
from veritrain.train.ranks import Ranks

if TYPE_CHECKING:
    from veritrain.core.config import RunConfig

log = logging.getLogger("veritrain")

SCHEDULED = ("step", "epoch")  # saves in the trajectory; "signal" and "minutes" depend on timing


@dataclass
class LoopState:
    """Where the loop is; saved in every checkpoint under "loop"."""

    epoch: int = 1  # the epoch in progress, 1-based
    batch_index: int = 0  # batches of that epoch already trained on
    step: int = 0  # optimizer steps taken
    epochs_done: int = 0  # completed epochs (= rows in metrics.jsonl)
    loss_sum: float = 0.0  # partial-epoch sums (loss × samples, samples, task statistics)
    seen: int = 0
    stat_sums: dict[str, float] = field(default_factory=dict)
    best_value: Optional[float] = None
    best_epoch: int = 0
    bad_epochs: int = 0  # epochs since the best metric last improved (early stopping)
    rollbacks: int = 0
    lr_factor: float = 1.0  # product of rollback_lr_factor over the rollbacks so far
    stopped_early: bool = False
    # the committed trajectory (veritrain.train.trajectory) and the saves outside it; carried, not hashed
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    other_saves: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Trained:
    """What a checkpoint holds besides the loop's state: the model and what trains it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler


class ReplayDone(Exception):
    """`run(stop_at_step=N)` (an audit replay) reached the scheduled checkpoint at step N: carries the
    trajectory so far and the state that checkpoint would hold."""

    def __init__(self, trajectory: list[dict[str, Any]], state: dict[str, Any]):
        super().__init__(f"replayed to step {trajectory[-1]['step']}")
        self.trajectory, self.state = trajectory, state


def rng_state() -> dict[str, Any]:
    """Global RNG states in types `torch.load(weights_only=True)` accepts (dropout draws from torch's)."""
    # the legacy form, a tuple (typed as that or the dict form)
    name, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        # as one tensor, not a tuple of 625 ints: torch.save visits every pickled object (slow)
        "python": {"version": version, "internal": torch.from_numpy(np.array(internal, dtype=np.int64)), "gauss": gauss},
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    random.setstate((python["version"], tuple(int(v) for v in python["internal"].tolist()), python["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """The checkpoints of the run in `run_dir` (`checkpoints/`), by the config's `checkpoint` section: the
    files, the trajectory entry of each save, the every_minutes clock, and the resume."""

    def __init__(self, cfg: RunConfig, data_version: str, run_dir: Path, ranks: Ranks, trained: Trained, state: LoopState,
                 device: torch.device, stop_at_step: Optional[int] = None, record_format: Optional[int] = None,
                 hand_back: Optional[Path] = None):
        from veritrain.core.config import config_hash

        self.cfg = cfg.checkpoint
        self.data_version = data_version
        self.run_dir, self.folder = run_dir, run_dir / "checkpoints"
        self.ranks, self.trained, self.state = ranks, trained, state
        self.stop_at_step = stop_at_step  # an audit replay: raise ReplayDone at the scheduled save of this step
        self.hand_back = hand_back  # an audit replay: where each state entered in the trajectory is written for the auditor
        # the run's record format, inside every state (outside its hash): content that witnesses the format the record
        # must be judged under (veritrain.trust.formats); None for a run of format 0, whose states never held it
        self.record_format = record_format
        # the environment, compared on resume (not hashed: it may change without changing the result)
        self.settings = {"device": str(device), "threads": torch.get_num_threads(), "num_workers": cfg.train.num_workers}
        self.config_hash = config_hash(cfg)
        self.last_save = time.monotonic()  # the every_minutes clock
        if ranks.is_main:
            self.folder.mkdir(exist_ok=True)

    def own_state(self, reason: str, augment: Optional[torch.Generator]) -> dict[str, Any]:
        """This rank's training state (`augment`: the epoch's augmentation generator; None at an epoch's end)."""
        trained, state = self.trained, self.state
        return {
            "format_version": checkpoint.FORMAT_VERSION,
            **({"record_format": self.record_format} if self.record_format else {}),
            "reason": reason,
            "model": trained.model.state_dict(),
            "optimizer": trained.optimizer.state_dict(),
            "schedule": trained.schedule.state_dict(),
            "scaler": trained.scaler.state_dict(),
            "rng": rng_state(),
            "augment_rng": augment.get_state() if augment is not None else None,
            # a copy: the loop goes on mutating it
            "loop": {**vars(state), "stat_sums": dict(state.stat_sums), "trajectory": list(state.trajectory), "other_saves": list(state.other_saves)},
            "settings": self.settings,
            "config_hash": self.config_hash,
            "data_version": self.data_version,
        }

    def complete_state(self, reason: str, augment: Optional[torch.Generator]) -> tuple[Optional[dict[str, Any]], dict[str, Any]]:
        """(what rank 0 writes: with every rank's generators; None on the other ranks, this rank's own state)."""
        own = self.own_state(reason, augment)
        if self.ranks.world_size == 1:
            return own, own
        parts = self.ranks.gather({"rng": own["rng"], "augment_rng": own["augment_rng"]})
        return ({**own, "distributed": {"world_size": self.ranks.world_size, "ranks": parts}} if self.ranks.is_main else None), own

    def commit(self, written: dict[str, Any], reason: str, epoch: int) -> None:
        """Enter a state rank 0 is about to write into the trajectory (or other_saves), and into the state itself."""
        state = self.state
        state_hash = trajectory.state_sha256(written)
        if reason in SCHEDULED or reason == "initial":
            state.trajectory.append(trajectory.entry(state.trajectory, self.config_hash, self.data_version, state.step, epoch,
                                                     state_hash, state_dict_sha256(written["model"])))
        else:
            # a timing save names the chain entry it follows: it is a resume point, never a result
            state.other_saves.append({"step": state.step, "reason": reason, "state_sha256": state_hash,
                                      "after_step": state.trajectory[-1]["step"] if state.trajectory else None})
        written["loop"] = {**written["loop"], "trajectory": list(state.trajectory), "other_saves": list(state.other_saves)}
        if self.hand_back is not None and (reason in SCHEDULED or reason == "initial"):
            partial = self.hand_back / f".entry-{len(state.trajectory) - 1}.partial"
            partial.write_bytes(checkpoint.encode(written))
            partial.replace(self.hand_back / f"entry-{len(state.trajectory) - 1}.pt")
        if self.stop_at_step is not None and reason in SCHEDULED and state.step >= self.stop_at_step:
            raise ReplayDone(list(state.trajectory), written)

    def first_snapshot(self, resumed: bool, augment: torch.Generator) -> bytes:
        """The first rollback target: the resumed state, or the initial state, which starts the trajectory (an audit
        rebuilds it from the config alone)."""
        if resumed:
            return checkpoint.encode(self.own_state("snapshot", augment))
        written, own = self.complete_state("snapshot", augment)
        if written is not None:
            self.commit(written, "initial", 0)
        return checkpoint.encode(written if written is not None else own)

    def start_clock(self) -> None:
        """checkpoint.every_minutes counts from here (the start of training) and from each save."""
        self.last_save = time.monotonic()

    def minutes_due(self) -> bool:
        """Whether rank 0's clock says an every_minutes checkpoint is due (always False on the other ranks)."""
        return self.ranks.is_main and bool(self.cfg.every_minutes) and time.monotonic() - self.last_save >= self.cfg.every_minutes * 60

    def save(self, reason: str, augment: Optional[torch.Generator], best: bool = False, final: bool = False) -> bytes:
        """One checkpoint: step-<N>.pt, plus best.pt when it improved and last.pt when training stops
        (during training the newest step file is the latest state; resume looks at both). Returns this rank's
        encoded state, the rollback snapshot it may become."""
        t = time.perf_counter()
        state = self.state
        written, own = self.complete_state(reason, augment)
        if written is None:  # not rank 0: rank 0 writes the file; this rank keeps its own state as its rollback snapshot
            self.last_save = time.monotonic()
            return checkpoint.encode(own)
        self.commit(written, reason, state.epochs_done if augment is None else state.epoch)
        data_bytes = checkpoint.encode(written)
        targets = (["best.pt"] if best else []) + [f"step-{state.step}.pt"]
        if final and self.cfg.last:
            targets.append("last.pt")
        try:
            checkpoint.write(self.folder, data_bytes, targets, self.cfg.keep_last, keep=trajectory.audit_steps(state.trajectory, self.cfg.audit_every))
        except OSError as err:
            raise RunFailed(f"checkpoint: saving at step {state.step} failed ({err.strerror or err}); "
                            "the previous checkpoint is intact") from None
        self.last_save = time.monotonic()
        log.debug("checkpoint: %s (%s) in %.3fs, %d bytes", ", ".join(targets), reason,
                  time.perf_counter() - t, len(data_bytes))
        return data_bytes

    def restore(self, saved: dict[str, Any]) -> Optional[torch.Tensor]:
        """Put the training state back as `saved` holds it, and cut metrics.jsonl and steps.jsonl back to it;
        returns the augmentation generator's saved state (None: saved at an epoch's end)."""
        trained, state = self.trained, self.state
        trained.model.load_state_dict(saved["model"])
        trained.optimizer.load_state_dict(saved["optimizer"])
        trained.schedule.load_state_dict(saved["schedule"])
        trained.scaler.load_state_dict(saved["scaler"])
        for key, value in saved["loop"].items():
            setattr(state, key, value)
        # a checkpoint written by rank 0 holds every rank's generators; a rank's own rollback snapshot only its own
        own = saved["distributed"]["ranks"][self.ranks.rank] if "distributed" in saved else saved
        set_rng_state(own["rng"])
        if self.ranks.is_main:
            steplog.rewind(self.run_dir, state.step, state.epochs_done)
        return own["augment_rng"]

    def resume(self, events: list[dict[str, Any]]) -> tuple[bool, Optional[torch.Tensor]]:
        """Continue from the newest valid checkpoint, every rank from the one rank 0 chose. Returns (whether a
        checkpoint was restored, the augmentation generator's saved state); a run stopped before its first
        checkpoint starts over, which is the same run, bit for bit."""
        ranks, folder = self.ranks, self.folder
        if not ranks.broadcast(any(folder.glob("*.pt")) if ranks.is_main else None):
            log.info("resume: no checkpoint was saved yet; training from the beginning")
            events.append({"kind": "resume", "step": 0, "detail": "no checkpoint yet: from the beginning"})
            if ranks.is_main:
                steplog.clear(self.run_dir)
            return False, None
        path, saved, problems = checkpoint.newest_valid(folder) if ranks.is_main else (None, None, [])
        for problem in problems:
            log.warning("checkpoint: %s; falling back to an older one", problem)
        chosen = ranks.broadcast(path.name if path is not None and saved is not None else None)
        if not ranks.is_main and chosen is not None:
            path = folder / chosen
            saved = checkpoint.load(path)
        if saved is None or path is None:
            raise RunFailed(f"resume: no valid checkpoint in {folder}; start a new run instead")
        if "engine" in saved:  # a state of another engine (veritrain.train.engine) under a record that names none
            raise RunFailed(f"resume: {path.name} was saved by the {saved['engine']} engine, and the run's record names none (the earlier loop); "
                            "`veritrain verify` names the mismatch")
        if saved["config_hash"] != self.config_hash or saved["data_version"] != self.data_version:
            raise RunFailed(f"resume: {path.name} was saved with another config or data version; resume with the run's own config.yaml")
        saved_world = int((saved.get("distributed") or {}).get("world_size", 1))
        if saved_world != ranks.world_size:
            raise UserError(f"resume: {path.name} was saved by {saved_world} process(es) and this resume has {ranks.world_size}; "
                            f"resume with the same number (--nproc {saved_world}): each rank's random state and share of the data are in the checkpoint")
        if ranks.is_main:
            for name in checkpoint.discard_after(folder, int(saved["loop"]["step"])):
                log.warning("checkpoint: removed %s, which failed its check and lies after the resume point", name)
        changed = {k: (saved["settings"].get(k), v) for k, v in self.settings.items() if saved["settings"].get(k) != v}
        if changed:
            log.warning("resume: settings differ from the saved run (%s); the result may not be bit-identical",
                        ", ".join(f"{k} {a} → {b}" for k, (a, b) in changed.items()))
        augment = self.restore(saved)
        state = self.state
        events.append({"kind": "resume", "step": state.step, "detail": f"from checkpoints/{path.name} (epoch {state.epoch}, batch {state.batch_index})"})
        log.info("resume: from %s at step %d (epoch %d, batch %d)", path.name, state.step, state.epoch, state.batch_index)
        return True, augment
