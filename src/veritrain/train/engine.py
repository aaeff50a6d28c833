"""The training engine: the one implementation of what a training run carries from step to step and proves.

It serves the built-in recipe (`veritrain.train.recipe`), users' scripts (`veritrain.start`, whose `Run` is a record
around an Engine) and the Lightning and Hugging Face callbacks (`Engine.enter`):

- the registered state (`register`): the model, optimizer, scheduler, scaler and any `extra` object with
  `state_dict()`/`load_state_dict()`, restored on resume and saved in every checkpoint with the RNG states;
- the data order (`batches`): a pure function of (seed, epoch, batch), so a resumed run needs no loader state,
  and per-step generators (`generator`) for augmentation, a pure function of (seed, step, stream);
- the trajectory (`commit`): each scheduled save is hashed and chained (veritrain.train.trajectory); saves that
  depend on timing (a signal, a clock) are listed apart in `other_saves`;
- checkpoint files (`save`, `save_final`): atomic, with their keep rule (veritrain.train.checkpoint);
- resume (`newest`, `restore`): the newest valid checkpoint of the run's own config and inputs;
- the non-finite guard (`guard`): skip the batch, stop, or roll back to the last scheduled save with a lower
  learning rate, as `train.on_nonfinite` says;
- best and early stopping (`Best`, a state object users register like any other);
- audit replays (`HandBack`): every state entered in the trajectory is handed back to the auditor, which
  hashes and judges it; the replay stops where the auditor asked;
- ranks (`Ranks`, several processes started by torchrun): every rank gathers its state at each save and rank 0
  writes it with every rank's RNG states (`distributed`), enters it in the trajectory and keeps the files; on
  resume every rank restores the checkpoint rank 0 chose, with its own RNG states. Decisions that must agree
  (a non-finite loss, a signal, the clock) are made on numbers every rank holds alike (veritrain.train.ranks).

A checkpoint holds `{format_version, engine?, record_format?, reason, model, optimizer, scheduler, scaler, extra,
rng, loop: {step, epochs_done, order, trajectory, other_saves, guard?}, settings, config_hash, data_version,
distributed?: {world_size, ranks: [{rng}, ...]}}`;
docs/record.md describes it. Runs of veritrain's earlier loop keep theirs (veritrain.train.loop).
"""

from __future__ import annotations

import io
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from veritrain.core import selection
from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import state_dict_sha256
from veritrain.train import checkpoint as checkpoint_files, trajectory
from veritrain.train.checkpointer import rng_state, set_rng_state
from veritrain.train.order import Order
from veritrain.train.ranks import ONE_PROCESS, Ranks

log = logging.getLogger("veritrain")

FORMAT_VERSION = 1  # the checkpoint format of the engine (and of every script's run)
POLICIES = ("stop", "skip_batch", "rollback")


class UsageError(UserError):
    """A call of the API that cannot work as made (one line: what and how to fix it); exit 2 when a script leaves it uncaught."""


@dataclass(frozen=True)
class Guard:
    """What the engine does the step a loss or gradient norm is NaN or infinite (`Engine.guard`): `skip_batch` goes on
    without it; `stop` fails the run; `rollback` goes back to the last scheduled save (or the start) with every learning
    rate multiplied by `rollback_lr_factor`, at most `max_rollbacks` times, and then stops."""

    on_nonfinite: str = "stop"
    max_rollbacks: int = 3
    rollback_lr_factor: float = 0.5

    def __post_init__(self) -> None:
        if self.on_nonfinite not in POLICIES:
            raise UsageError(f"on_nonfinite={self.on_nonfinite!r}; give one of {', '.join(POLICIES)}")
        if type(self.max_rollbacks) is not int or self.max_rollbacks < 0:
            raise UsageError(f"max_rollbacks={self.max_rollbacks!r}; give a whole number ≥ 0")
        if not isinstance(self.rollback_lr_factor, (int, float)) or not 0 < self.rollback_lr_factor <= 1:
            raise UsageError(f"rollback_lr_factor={self.rollback_lr_factor!r}; give a number in (0, 1]")

    def as_dict(self) -> dict[str, Any]:
        return {"on_nonfinite": self.on_nonfinite, "max_rollbacks": self.max_rollbacks, "rollback_lr_factor": float(self.rollback_lr_factor)}


class Best:
    """The best value of a metric so far, and early stopping: `update(value, epoch, step)` says whether it improved,
    `stop` whether `patience` validations went by without it (`bad_epochs` counts them). Register it in
    `run.resume(extra={"best": best})` so a resumed run goes on counting where it stopped. `step`, the optimizer step
    validated, is kept (and saved) once given: the recipe gives it, so a best inside an epoch is named exactly."""

    def __init__(self, mode: str = "max", patience: Optional[int] = None) -> None:
        if mode not in ("max", "min"):
            raise UsageError(f"Best: mode={mode!r}; give \"max\" or \"min\"")
        self.mode, self.patience = mode, patience
        self.value: Optional[float] = None
        self.epoch = 0
        self.step: Optional[int] = None
        self.bad_epochs = 0

    def update(self, value: float, epoch: int, step: Optional[int] = None) -> bool:
        improved = selection.improves(value, self.value, self.mode)
        if improved:
            self.value, self.epoch, self.bad_epochs = float(value), int(epoch), 0
            if step is not None:
                self.step = int(step)
        else:
            self.bad_epochs += 1
        return improved

    @property
    def stop(self) -> bool:
        return bool(self.patience) and self.bad_epochs >= int(self.patience or 0)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"value": self.value, "epoch": self.epoch, "bad_epochs": self.bad_epochs}
        return state if self.step is None else {**state, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.epoch, self.bad_epochs = state["value"], int(state["epoch"]), int(state["bad_epochs"])
        self.step = int(state["step"]) if state.get("step") is not None else None


@dataclass
class HandBack:
    """An audit replay: each state entered in the trajectory is written to `out` as entry-<index>.pt (whole or not at
    all) for the auditor to hash; after entry `index` at `step`, `done(index, step)` says whether the replay is over,
    and `stop(trajectory, state)` is the exception that ends it."""

    out: Path
    done: Callable[[int, int], bool]
    stop: Callable[[list[dict[str, Any]], dict[str, Any]], BaseException]


class Engine:
    """One run's training state, order, trajectory and checkpoints (see the module's docstring). `folder`: where
    checkpoints go (None: nothing is written, as in an audit replay). `binding`: what the trajectory's chain binds
    besides the config (the data version, or the inputs manifest's hash). `name`: the engine name written into every
    state (the built-in recipe's; None for a script's run, whose states never held one). `ranks`: this process's place
    among several (rank 0 alone writes and keeps the trajectory)."""

    def __init__(self, seed: int, config_hash: str, binding: str, folder: Optional[Path], keep_last: int = 2, audit_every: int = 0,
                 guard: Optional[Guard] = None, events: Optional[list[dict[str, Any]]] = None, name: Optional[str] = None,
                 settings: Optional[dict[str, Any]] = None, ranks: Ranks = ONE_PROCESS) -> None:
        self.seed, self.config_hash, self.binding, self.folder = seed, config_hash, binding, folder
        self.ranks = ranks
        self.keep_last, self.audit_every = keep_last, audit_every
        self.guard_policy = guard  # None: a non-finite value stops the run, and the state holds no guard part
        self.events = events if events is not None else []
        self.name = name
        self.extra_settings = dict(settings or {})
        self.record_format: Optional[int] = None  # the run record's format, written into every state (outside its hash)
        self.hand_back: Optional[HandBack] = None
        self.state: Optional[dict[str, Any]] = None  # what `register` was given
        self.order: Optional[Order] = None
        self.saved_order: Optional[dict[str, Any]] = None  # the order a restored state was saved with
        self.position = 0  # steps trained
        self.current: Optional[int] = None  # the step `batches` last gave
        self.entries: list[dict[str, Any]] = []  # the trajectory so far
        self.other_saves: list[dict[str, Any]] = []
        self.epochs_done = 0  # completed epochs, when a framework's loop (not `batches`) keeps count
        self.snapshot: Optional[bytes] = None  # the rollback target: the last scheduled save's encoded state
        self.rollbacks, self.lr_factor = 0, 1.0
        self.rewound = False  # a rollback happened since `batches` gave its last step
        self.on_restore: list[Callable[[dict[str, Any]], None]] = []  # called after a state is restored (files to cut back)
        self.last_save = time.monotonic()  # the every-minutes clock

    # ------------------------------------------------------------ state

    def register(self, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None, scaler: Any = None,
                 extra: Optional[dict[str, Any]] = None) -> None:
        parts: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
        for name, value in {**{k: v for k, v in parts.items() if k != "model"}, **(extra or {})}.items():
            if value is not None and not (callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))):
                raise UsageError(f"run.resume: {name} is a {type(value).__name__} without state_dict()/load_state_dict(); "
                                 "give an object that has both")
        self.state = {**parts, "extra": dict(extra or {})}

    def start(self, saved: Optional[dict[str, Any]]) -> bool:
        """Restore `saved` (a resume, or a replay's start), or enter the initial state as trajectory entry 0."""
        rolls_back = self.guard_policy is not None and self.guard_policy.on_nonfinite == "rollback"
        if saved is not None:
            self.restore(saved)
            self.snapshot = checkpoint_files.encode(saved) if rolls_back else None
            return True
        initial = self.gather("initial")
        if self.ranks.is_main:
            self.commit(initial, scheduled=True)
        self.snapshot = checkpoint_files.encode(initial) if rolls_back else None
        return False

    def epoch_of_position(self) -> int:
        if self.order is None:
            return self.epochs_done  # a framework's loop says (0 when nothing does)
        done, within = divmod(self.position, self.order.per_epoch)
        return done if within == 0 else done + 1

    def gather(self, reason: str) -> dict[str, Any]:
        """The state a checkpoint holds now; with several ranks a collective, which gives rank 0 every rank's RNG
        states (`distributed`) and the other ranks their own state."""
        assert self.state is not None
        state = self.state
        order = self.order.as_dict() if self.order is not None else self.saved_order
        epochs_done = self.position // self.order.per_epoch if self.order is not None else 0
        loop: dict[str, Any] = {"step": self.position, "epochs_done": epochs_done, "order": order,
                                "trajectory": list(self.entries), "other_saves": list(self.other_saves)}
        if self.guard_policy is not None:
            loop["guard"] = {"rollbacks": self.rollbacks, "lr_factor": self.lr_factor}
        gathered = {
            "format_version": FORMAT_VERSION,
            **({"engine": self.name} if self.name else {}),
            # the record's format, outside the state hash: it witnesses the format the record is judged under
            **({"record_format": self.record_format} if self.record_format else {}),
            "reason": reason,
            "model": state["model"].state_dict(),
            "optimizer": state["optimizer"].state_dict() if state["optimizer"] is not None else None,
            "scheduler": state["scheduler"].state_dict() if state["scheduler"] is not None else None,
            "scaler": state["scaler"].state_dict() if state["scaler"] is not None else None,
            "extra": {name: value.state_dict() for name, value in state["extra"].items()},
            "rng": rng_state(),
            "loop": loop,
            "settings": {"device": _device_of(state["model"]), "threads": torch.get_num_threads(), **self.extra_settings},
            "config_hash": self.config_hash,
            "data_version": self.binding,
        }
        if self.ranks.world_size > 1:
            every = self.ranks.gather({"rng": gathered["rng"]})
            if every is not None:
                gathered["distributed"] = {"world_size": self.ranks.world_size, "ranks": every}
        return gathered

    def restore(self, saved: dict[str, Any], rollback: bool = False) -> None:
        """Put the registered state, the RNG states and the position back as `saved` holds them; later checkpoint files
        go (on resume they failed their check, since the newest valid one is restored; after a rollback they belong to a
        future this run no longer has)."""
        assert self.state is not None
        state = self.state
        state["model"].load_state_dict(saved["model"])
        for name in ("optimizer", "scheduler", "scaler"):
            if state[name] is not None:
                if saved.get(name) is None:
                    raise RunFailed(f"resume: the checkpoint holds no {name} state, and run.resume was given one; register the same state as the run did")
                state[name].load_state_dict(saved[name])
        for name, value in state["extra"].items():
            if name not in (saved.get("extra") or {}):
                raise RunFailed(f"resume: the checkpoint holds no extra[{name!r}]; register the same state as the run did")
            value.load_state_dict(saved["extra"][name])
        # a checkpoint rank 0 wrote holds every rank's RNG states; a rank's own rollback snapshot only its own
        set_rng_state((saved["distributed"]["ranks"][self.ranks.rank] if "distributed" in saved else saved)["rng"])
        loop = saved["loop"]
        self.position = int(loop["step"])
        self.saved_order = loop.get("order")
        self.entries = list(loop.get("trajectory") or [])
        self.other_saves = list(loop.get("other_saves") or [])
        guard = loop.get("guard") or {}
        self.rollbacks, self.lr_factor = int(guard.get("rollbacks", 0)), float(guard.get("lr_factor", 1.0))
        if self.folder is not None and self.ranks.is_main:
            for name in checkpoint_files.discard_after(self.folder, self.position):
                log.warning("checkpoint: removed %s, which %s", name,
                            "lies after the rollback's target" if rollback else "failed its check and lies after the resume point")
        for hook in self.on_restore:
            hook(saved)

    def newest(self) -> Optional[tuple[Path, dict[str, Any]]]:
        """The newest valid checkpoint of this run (None: none was saved yet); one of another config, other inputs,
        another engine or another number of ranks is refused. With several ranks, rank 0 chooses and every rank
        reads that file."""
        folder, ranks = self.folder, self.ranks
        path, saved, problems = (checkpoint_files.newest_valid(folder) if folder is not None and folder.is_dir() and ranks.is_main
                                 else (None, None, []))
        for problem in problems:
            log.warning("checkpoint: %s; falling back to an older one", problem)
        if ranks.world_size > 1:
            chosen, problems = ranks.broadcast((path.name if path is not None and saved is not None else None, list(problems)))
            if not ranks.is_main and chosen is not None and folder is not None:
                path = folder / chosen
                saved = checkpoint_files.load(path)
        if saved is None or path is None:
            if problems:  # files were saved, and none holds a state: starting over would hide the damage
                raise RunFailed(f"resume: no valid checkpoint in {folder}; start a new run instead")
            return None
        if saved.get("config_hash") != self.config_hash or saved.get("data_version") != self.binding:
            raise RunFailed(f"resume: {path.name} was saved with another config or other inputs; resume with the run's own config, or start a new run")
        if saved.get("engine") != self.name:
            raise RunFailed(f"resume: {path.name} was saved by the {saved.get('engine') or 'script'} engine, not {self.name or 'a script'}; "
                            "resume the run with the command that started it")
        saved_world = int((saved.get("distributed") or {}).get("world_size", 1))
        if saved_world != ranks.world_size:
            raise UserError(f"resume: {path.name} was saved by {saved_world} process(es) and this resume has {ranks.world_size}; resume with "
                            f"the same number (--nproc {saved_world}): each rank's random state and share of the data are in the checkpoint")
        return path, saved

    # ------------------------------------------------------------ order and randomness

    def batches(self, order: Order) -> Iterator[tuple[int, np.ndarray]]:
        """(step, row indices) for every step of the run from the current position; after a rollback the next step is
        the restored one."""
        self.order = order
        return self._iterate(order)

    def _iterate(self, order: Order) -> Iterator[tuple[int, np.ndarray]]:
        permutation, permuted_epoch = None, None
        while self.position < order.total:
            step = self.position
            epoch = step // order.per_epoch
            if permuted_epoch != epoch:
                permutation, permuted_epoch = order.permutation(epoch + 1), epoch
            self.current, self.rewound = step, False
            yield step, order.rows(step, permutation)
            if not self.rewound:
                self.position = max(self.position, step + 1)

    def generator(self, step: int, stream: int = 1) -> torch.Generator:
        """A generator for step `step` and a purpose (`stream`; 0 is the data order's), a function of (seed, step, stream)
        alone: a resumed run or a replay draws what the uninterrupted run drew, with no generator state saved. Ranks after
        the first draw their own (rank 0 draws what one process draws)."""
        entropy = [self.seed % 2**63, 1 << 32 | stream, step] + ([self.ranks.rank] if self.ranks.rank else [])
        return torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] % 2**63))

    # ------------------------------------------------------------ the trajectory and the files

    def commit(self, state: dict[str, Any], scheduled: bool) -> dict[str, Any]:
        """Enter `state` in the trajectory (a scheduled save, or the initial state) or in other_saves (a save that depends
        on timing: a resume point, never a result); in an audit replay, hand the entered state back."""
        try:
            digest = trajectory.state_sha256(state)
        except TypeError as err:
            raise UsageError(f"run.checkpoint: {err}; give state_dict()s of tensors, numbers and strings") from None
        if scheduled:
            entry = trajectory.entry(self.entries, self.config_hash, self.binding, self.position, self.epoch_of_position(),
                                     digest, state_dict_sha256(state["model"]))
            self.entries.append(entry)
        else:
            entry = {"step": self.position, "reason": state["reason"], "state_sha256": digest,
                     "after_step": self.entries[-1]["step"] if self.entries else None}
            self.other_saves.append(entry)
        state["loop"] = {**state["loop"], "trajectory": list(self.entries), "other_saves": list(self.other_saves)}
        if scheduled and self.hand_back is not None:
            self.hand_back_entry(lambda path: path.write_bytes(checkpoint_files.encode(state)), ".pt", state)
        return entry

    def hand_back_entry(self, write: Callable[[Path], Any], suffix: str, state: Optional[dict[str, Any]] = None) -> None:
        """An audit replay reached the entry just appended: `write(path)` puts its state into the auditor's folder as
        entry-<index><suffix>, and the replay stops when the hand-back says it is done."""
        back = self.hand_back
        assert back is not None
        index = len(self.entries) - 1
        partial = back.out / f".entry-{index}{suffix}.partial"
        write(partial)
        partial.replace(back.out / f"entry-{index}{suffix}")
        if back.done(index, self.entries[-1]["step"]):
            raise back.stop(list(self.entries), state or {})

    def save(self, reason: str, scheduled: bool = True, best: bool = False, final: bool = False) -> bytes:
        """A checkpoint of the state now: step-<N>.pt (and best.pt, last.pt when asked); a scheduled save also becomes
        the rollback target. Returns its encoded bytes."""
        state = self.gather(reason)
        if self.ranks.is_main:
            self.commit(state, scheduled)
        data = checkpoint_files.encode(state)
        if scheduled:
            self.snapshot = data
        self.write(data, (["best.pt"] if best else []) + [f"step-{self.position}.pt"] + (["last.pt"] if final else []))
        return data

    def save_final(self, last: bool = True) -> None:
        """The state at the end: a new trajectory entry, unless the last entry already holds this very state (then
        only last.pt is written)."""
        state = self.gather("final")
        if not self.ranks.is_main:
            return
        held = self.entries[-1] if len(self.entries) > 1 else None
        if held is not None and held["step"] == self.position and held["state_sha256"] == trajectory.state_sha256(state):
            state["loop"] = {**state["loop"], "trajectory": list(self.entries), "other_saves": list(self.other_saves)}
            if last:
                self.write(checkpoint_files.encode(state), ["last.pt"], extra_keep={self.position})
            return
        self.commit(state, scheduled=True)
        self.write(checkpoint_files.encode(state), [f"step-{self.position}.pt"] + (["last.pt"] if last else []))

    def write(self, data: bytes, names: list[str], extra_keep: frozenset[int] | set[int] = frozenset()) -> None:
        self.last_save = time.monotonic()
        if self.folder is None or not self.ranks.is_main:
            return
        try:
            checkpoint_files.write(self.folder, data, names, self.keep_last,
                                   keep=trajectory.audit_steps(self.entries, self.audit_every) | set(extra_keep))
        except OSError as err:
            raise RunFailed(f"checkpoint: saving at step {self.position} failed ({err.strerror or err}); the previous checkpoint is intact") from None

    def minutes_due(self, minutes: Optional[float]) -> bool:
        """Whether `minutes` have passed since the last save (or the start); rank 0's clock (False on the other ranks,
        which learn it from rank 0)."""
        return self.ranks.is_main and bool(minutes) and time.monotonic() - self.last_save >= float(minutes or 0) * 60

    def enter(self, file: Optional[Path], run_dir: Optional[Path], state_sha256: str, model_sha256: str, step: int, epoch: int) -> dict[str, Any]:
        """Enter a checkpoint a framework wrote (`file`, already complete) in the trajectory; the file is named in the
        entry when it lies in `run_dir`, whose seal then covers its bytes."""
        self.position = step
        entry = trajectory.entry(self.entries, self.config_hash, self.binding, step, epoch, state_sha256, model_sha256)
        if file is not None and run_dir is not None and file.resolve().is_relative_to(run_dir.resolve()):
            entry["file"] = file.resolve().relative_to(run_dir.resolve()).as_posix()
        self.entries.append(entry)
        return entry

    # ------------------------------------------------------------ the guard

    def guard(self, value: Any, what: str = "loss") -> bool:
        """True when `value` (a number or a one-element tensor) is finite. Otherwise, by the policy: skip_batch returns
        False (leave the batch out); stop raises RunFailed; rollback restores the last scheduled save with a lower
        learning rate and returns False, and `batches` goes on from the restored step."""
        number = float(value.item() if isinstance(value, torch.Tensor) else value)
        if math.isfinite(number):
            return True
        policy = self.guard_policy or Guard()
        epoch, batch = self.order.epoch_of(self.position) if self.order is not None else (self.epoch_of_position() + 1, 0)
        detail = f"{what} became {number} at step {self.position + 1} (epoch {epoch}, batch {batch + 1})"
        if policy.on_nonfinite == "skip_batch":
            self.events.append({"kind": "skip_batch", "step": self.position + 1, "detail": detail})
            log.warning("train: %s; batch skipped", detail)
            return False
        if policy.on_nonfinite == "stop" or self.rollbacks >= policy.max_rollbacks:
            why = "on_nonfinite is stop" if policy.on_nonfinite == "stop" else f"after {self.rollbacks} rollback(s) (max_rollbacks)"
            self.events.append({"kind": "nonfinite_stop", "step": self.position + 1, "detail": detail})
            raise RunFailed(f"train: {detail}; stopped {why}; lower the learning rate or check the data")
        self._roll_back(policy, detail)
        return False

    def _roll_back(self, policy: Guard, detail: str) -> None:
        assert self.snapshot is not None and self.state is not None
        rollbacks, lr_factor, failed_step = self.rollbacks + 1, self.lr_factor * policy.rollback_lr_factor, self.position + 1
        saved = torch.load(io.BytesIO(self.snapshot), weights_only=True)
        self.restore(saved, rollback=True)
        scale = lr_factor / self.lr_factor  # the snapshot's rates hold its own factor
        self.rollbacks, self.lr_factor = rollbacks, lr_factor
        optimizer, scheduler = self.state["optimizer"], self.state["scheduler"]
        if optimizer is not None:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * scale
        if scheduler is not None and isinstance(getattr(scheduler, "base_lrs", None), list):
            scheduler.base_lrs = [base * scale for base in scheduler.base_lrs]
        self.rewound = True
        self.events.append({"kind": "rollback", "step": failed_step, "detail": f"{detail}; restored step {self.position}, lr × {lr_factor:g}"})
        log.warning("train: %s; rolled back to step %d, lr factor %g (rollback %d of %d)", detail, self.position, lr_factor,
                    rollbacks, policy.max_rollbacks)


def _device_of(model: torch.nn.Module) -> str:
    for parameter in model.parameters():
        return str(parameter.device)
    return "cpu"
