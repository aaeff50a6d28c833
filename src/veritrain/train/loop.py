"""The training stage, with the loop written out.

Seeds python, numpy and torch, uses only deterministic kernels, and draws each epoch's data order
and augmentation from generators seeded by (seed, epoch). Everything the loop carries from one step
to the next — weights, optimizer, schedule, gradient scaler, RNG states, position in the epoch,
partial-epoch sums, best metric, rollback count — is in every checkpoint, so a run killed at any
moment and resumed ends with bit-identical weights and metrics on the same machine.

Checkpoints are saved on an explicit schedule (`checkpoint.every_epochs`, `every_steps`,
`every_minutes`) and when SIGINT/SIGTERM arrives (after the current step). A NaN/inf loss is caught
the step it happens and handled by `train.on_nonfinite`.

`run` reads top to bottom: setup, resume, then for each epoch `_train_epoch` (its optimizer steps and the
saves inside it) and `_end_epoch` (validation, metrics, best, early stopping, the epoch's save). The parts
it calls on its schedule sit beside it: `checkpointer` (what a checkpoint holds, saving, resuming),
`guard` (train.on_nonfinite), `steplog` (progress bar, steps.jsonl, metrics.jsonl, TensorBoard) and
`rank_group.Ranks` (the collectives; no-ops with one process).

    veritrain train configs/digits.yaml                 # train only (prepares the data version if needed)
    veritrain train --resume latest                     # continue an interrupted run
"""

from __future__ import annotations

import contextlib
import logging
import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
import torch
from rich.console import Console

from veritrain.core.errors import Interrupted, RunFailed
from veritrain.core.hashing import state_dict_sha256
from veritrain.core.seeding import seed_everything
from veritrain.core.signals import StopFlag
from veritrain.records.record import RECORD_FORMAT
from veritrain.tasks import split_rows
from veritrain.train import parts, ranks as rank_group
from veritrain.train.checkpointer import Checkpointer, LoopState, ReplayDone as ReplayDone, Trained
from veritrain.train.guard import NonFiniteGuard, RolledBack
from veritrain.train.order import epoch_generator as epoch_generator
from veritrain.train.parts import (
    EpochJudge as EpochJudge,
    TrainResult as TrainResult,
    build_optimizer as build_optimizer,
    resolve_device as resolve_device,
    schedule_factor as schedule_factor,
)
from veritrain.train.steplog import StepLog, read_metrics

if TYPE_CHECKING:
    from veritrain.core.config import RunConfig
    from veritrain.data.identity import DataVersion
    from veritrain.tasks import Task

log = logging.getLogger("veritrain")


def batch_starts(n: int, batch_size: int, world_size: int = 1) -> list[int]:
    """Start offsets of the (global) batches of one epoch. A last batch with fewer than 2 samples per
    rank is dropped: BatchNorm cannot normalise one sample, and a one-sample step would be noise anyway."""
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] < 2 * world_size:
        starts.pop()
    return starts


def step_rows(seed: int, train_rows: np.ndarray, batch_size: int, accumulate_steps: int, step: int,
              world_size: int = 1) -> tuple[int, list[np.ndarray]]:
    """(epoch, the global batches of rows) of optimizer step `step` (0-based over the run), as `_train_epoch` and
    `_train_step` draw them: epoch e permutes the train rows with `epoch_generator(seed, e, 0)` alone, and step j of it
    takes batches j·accumulate_steps … of `batch_starts`. A function of (seed, step) and the sizes only, so a
    resumed run or an audit replay needs no loader state (a rollback of `train.on_nonfinite` is not modelled)."""
    starts = batch_starts(len(train_rows), batch_size, world_size)
    per_epoch = math.ceil(len(starts) / accumulate_steps)
    epoch, within = divmod(step, per_epoch)
    epoch += 1
    order = train_rows[torch.randperm(len(train_rows), generator=epoch_generator(seed, epoch, 0)).numpy()]
    group = range(within * accumulate_steps, min(len(starts), (within + 1) * accumulate_steps))
    return epoch, [order[starts[b] : starts[b] + batch_size] for b in group]


@dataclass
class Training:
    """What setup builds for the epochs: the model and what trains it, the batches of an epoch, the loop's state."""

    cfg: RunConfig
    data: DataVersion
    task: Task
    ranks: rank_group.Ranks
    device: torch.device
    trained: Trained  # the model, optimizer, schedule and gradient scaler (what a checkpoint holds)
    forward: Any  # what the training forward runs: the model, its DDP wrapper, or torch.compile of either
    factor: Callable[[int], float]  # the schedule's lr multiplier per optimizer step (before the rollbacks' factor)
    params: list[torch.nn.Parameter]  # the trained parameters, for gradient clipping
    train_rows: np.ndarray  # the train split
    starts: list[int]  # start offsets of an epoch's global batches
    steps_per_epoch: int
    state: LoopState
    best_metric: tuple[str, str]  # the metrics.jsonl key best.pt and early stopping follow, and "max" or "min"
    autocast_dtype: Optional[torch.dtype]  # train.precision bf16/fp16; None: fp32
    judge: Optional[EpochJudge] = None
    pruned: Optional[dict[str, Any]] = None  # the judge's verdict: no epoch follows (a pruned run is never resumed)

    def autocast(self) -> Any:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


@dataclass
class Step:
    """One optimizer step, for the step log and the saves after it."""

    loss: float = 0.0  # the mean loss over the step's batches (of all ranks)
    stepped: bool = False  # False: every batch was skipped, or the update was (train.on_nonfinite skip_batch)
    grad_norm: Optional[float] = None  # computed for clipping, train.check_grad_norm or a logged step
    signum: Optional[int] = None  # several ranks: the signal any rank got, agreed in the step's last batch
    minutes_due: bool = False  # several ranks: rank 0's every_minutes clock, agreed likewise


def run(cfg: RunConfig, data: DataVersion, task: Task, run_dir: Path, stop: StopFlag, console: Optional[Console] = None,
        resume: bool = False, events: Optional[list[dict[str, Any]]] = None,
        ranks: Optional[rank_group.Ranks] = None, stop_at_step: Optional[int] = None,
        epoch_judge: Optional[EpochJudge] = None, record_format: Optional[int] = RECORD_FORMAT, hand_back: Optional[Path] = None) -> TrainResult:
    """Stage entry: train on `data` for `cfg.train.epochs`; writes metrics.jsonl, steps.jsonl and
    checkpoints/. With `resume`, continue from the newest valid checkpoint in `run_dir`.

    With `ranks` (one of several processes started by torchrun, see veritrain.train.distributed) each
    rank trains on its share of every global batch of `train.batch_size` samples; only rank 0 writes.
    With `stop_at_step` (an audit replay, `veritrain.trust.audit`) it raises ReplayDone at the scheduled
    checkpoint of that step instead of writing it, and with `hand_back` writes every state it enters in the trajectory
    there (entry-<index>.pt) for the auditor to hash. With `epoch_judge` (one process only) every epoch waits for
    its verdict, and a pruning one ends training after that epoch. `record_format`: the format of the run's record,
    written into every checkpoint's state (None for a run of format 0, whose checkpoints never held it)."""
    started = time.perf_counter()
    events = events if events is not None else []
    t = _setup(cfg, data, task, ranks or rank_group.ONE_PROCESS)
    if epoch_judge is not None and t.ranks.world_size > 1:
        raise RunFailed("a search's trial trains in one process; drop torchrun and --nproc for it")
    t.judge = epoch_judge
    state = t.state
    checkpointer = Checkpointer(cfg, data.version, run_dir, t.ranks, t.trained, state, t.device, stop_at_step, record_format, hand_back)
    resumed, augment_state = checkpointer.resume(events) if resume else (False, None)
    history = read_metrics(run_dir)  # the rows of metrics.jsonl so far
    guard = NonFiniteGuard(cfg.train, checkpointer, t.factor, events)
    guard.snapshot = checkpointer.first_snapshot(resumed, _generator_with(cfg.seed, state.epoch, augment_state, t.ranks.rank))
    _log_start(t)
    checkpointer.start_clock()
    steplog = StepLog(cfg, run_dir, console, t.ranks.is_main, len(t.starts))
    if resumed and history and t.judge is not None:  # the last epoch before the stop may not have had its verdict
        with stop.deferred():
            _judge(t, run_dir, history[-1], events, stop)
    loop_started = time.perf_counter()
    with steplog:
        while state.epoch <= cfg.train.epochs and not state.stopped_early and t.pruned is None:
            augment = _generator_with(cfg.seed, state.epoch, augment_state, t.ranks.rank)
            augment_state = None
            try:
                with stop.deferred():  # a signal takes effect at the next step boundary, never mid-save
                    _train_epoch(t, augment, stop, checkpointer, guard, steplog)
                    _end_epoch(t, history, events, stop, checkpointer, guard, steplog, run_dir)
            except RolledBack as back:  # the snapshot is restored: train its epoch again from there
                augment_state = back.augment_state
                del history[state.epochs_done :]
    loop_seconds = time.perf_counter() - loop_started
    steplog.close()
    return _result(t, history, started, loop_seconds)


def _setup(cfg: RunConfig, data: DataVersion, task: Task, ranks: rank_group.Ranks) -> Training:
    """Seed, choose the device, join the ranks, and build the model, optimizer, schedule and gradient scaler."""
    tcfg = cfg.train
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    seed_everything(cfg.seed, tcfg.deterministic, compiler=tcfg.compile)
    ranks, device = rank_group.join_for_training(ranks, tcfg, resolve_device(tcfg.device))
    if tcfg.precision == "fp16" and device.type != "cuda":
        raise RunFailed("train.precision: 'fp16' needs a CUDA device (gradient scaling); use bf16 on the CPU")
    model = task.build_model(cfg.model, data).to(device)
    task.prepare(data)
    if tcfg.channels_last:
        # Module.to takes memory_format (documented), which its typed overloads leave out
        model = model.to(memory_format=torch.channels_last)  # pyright: ignore[reportCallIssue]
    model, trainer = parts.data_parallel(model, ranks, cfg, device)
    optimizer = build_optimizer(cfg.optim, model)
    train_rows = split_rows(task, data, "train")
    starts = batch_starts(len(train_rows), tcfg.batch_size, ranks.world_size)
    steps_per_epoch = math.ceil(len(starts) / tcfg.accumulate_steps)
    state = LoopState(stat_sums={name: 0.0 for name in task.epoch_metrics})
    factor = schedule_factor(cfg.schedule, steps_per_epoch, steps_per_epoch * tcfg.epochs)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor(step) * state.lr_factor)
    scaler = torch.amp.GradScaler(device.type, enabled=tcfg.precision == "fp16")  # passes values through when disabled
    best_metric = parts.best_metric(cfg, task, data)
    return Training(cfg=cfg, data=data, task=task, ranks=ranks, device=device, trained=Trained(model, optimizer, schedule, scaler),
                    forward=torch.compile(trainer) if tcfg.compile else trainer, factor=factor,
                    params=[p for p in model.parameters() if p.requires_grad], train_rows=train_rows, starts=starts,
                    steps_per_epoch=steps_per_epoch, state=state, best_metric=best_metric,
                    autocast_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}.get(tcfg.precision))


def _log_start(t: Training) -> None:
    tcfg, ranks = t.cfg.train, t.ranks
    n_params = sum(p.numel() for p in t.trained.model.parameters())
    log.info(
        "train: %s (%s parameters) on %s, %d threads, precision %s, %d samples, %d batches (%d steps)/epoch × %d epochs",
        t.cfg.model.target or t.cfg.model.name, f"{n_params:,}", t.device, torch.get_num_threads(), tcfg.precision,
        len(t.train_rows), len(t.starts), t.steps_per_epoch, tcfg.epochs,
    )
    if ranks.world_size > 1:
        log.info("train: rank %d of %d (%d node(s), backend %s); each global batch of %d is split over the ranks",
                 ranks.rank, ranks.world_size, ranks.nodes, ranks.backend, tcfg.batch_size)


def _train_epoch(t: Training, augment: torch.Generator, stop: StopFlag, checkpointer: Checkpointer, guard: NonFiniteGuard,
                 steplog: StepLog) -> None:
    """Train the rest of epoch `t.state.epoch`, an optimizer step at a time, with the saves the schedule makes
    inside the epoch (`_end_epoch` makes the epoch's own) and the one a signal asks for."""
    state, ccfg = t.state, t.cfg.checkpoint
    order = t.train_rows[torch.randperm(len(t.train_rows), generator=epoch_generator(t.cfg.seed, state.epoch, 0)).numpy()]
    steplog.start_epoch(state.epoch, state.batch_index, state.seen)
    t.trained.model.train()
    while state.batch_index < len(t.starts):
        step = _train_step(t, order, augment, stop, checkpointer, guard, steplog.logs_step(state.step + 1))
        steplog.step(state, step.loss, t.trained.optimizer.param_groups[0]["lr"], step.grad_norm, step.stepped)
        if state.batch_index == len(t.starts):
            break  # the end of the epoch saves in _end_epoch
        # one process reads its signal flag and its clock now; several ranks agreed on them (any rank's signal,
        # rank 0's clock) in the step's last batch reduction
        signum, minutes = (step.signum, step.minutes_due) if t.ranks.world_size > 1 else (stop.signum, checkpointer.minutes_due())
        if step.stepped and ccfg.every_steps and state.step % ccfg.every_steps == 0:
            guard.snapshot = checkpointer.save("step", augment)
        elif minutes:
            checkpointer.save("minutes", augment)
        if signum is not None:
            checkpointer.save("signal", augment, final=True)
            raise Interrupted(signum)


def _train_step(t: Training, order: np.ndarray, augment: torch.Generator, stop: StopFlag, checkpointer: Checkpointer,
                guard: NonFiniteGuard, norm_for_log: bool) -> Step:
    """One optimizer step: forward and backward over the step's batches (`train.accumulate_steps`), then the
    update. A non-finite loss or gradient norm goes to the guard."""
    tcfg, task, state, trained, world_size = t.cfg.train, t.task, t.state, t.trained, t.ranks.world_size
    first = state.batch_index
    group = range(first, min(len(t.starts), (first // tcfg.accumulate_steps + 1) * tcfg.accumulate_steps))
    trained.optimizer.zero_grad(set_to_none=True)
    step = Step()
    for b in group:
        rows = order[t.starts[b] : t.starts[b] + tcfg.batch_size]
        batch_rows = len(rows)  # of the global batch, all ranks together
        rows = t.ranks.shard(rows)
        x, y = task.batch(t.data, rows, t.device, True, augment)
        if tcfg.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with t.autocast():
            outputs = t.forward(x)
            loss = task.loss(outputs, y)
        loss_value = loss.item()  # the batch loss as a Python float: the non-finite check and the epoch sums
        if world_size > 1:  # the global batch's loss and statistics, the same on every rank (so are all decisions)
            sums = rank_group.sum_batch(loss_value, len(rows), task.batch_stats(outputs.detach().float(), y), stop.signum,
                                         checkpointer.minutes_due())
            loss_value, loss_total, stats = sums.loss, sums.loss_total, sums.stats
            step.signum, step.minutes_due = sums.signum, sums.minutes_due
        else:
            loss_total, stats = loss_value * len(rows), None
        if not math.isfinite(loss_value):
            guard.handle("loss", loss_value)
            continue  # skip_batch
        if len(rows) * world_size != batch_rows:
            # DDP averages the ranks' gradients; weigh an unequal share so the result is the global mean
            loss = loss * (len(rows) * world_size / batch_rows)
        if len(group) > 1:  # the mean over the accumulated batches; a single batch needs no extra graph node
            loss = loss / len(group)
        trained.scaler.scale(loss).backward()
        step.stepped = True
        step.loss += loss_value / len(group)
        state.loss_sum += loss_total
        state.seen += batch_rows
        if stats is None:
            stats = task.batch_stats(outputs.detach().float(), y)  # float32 (from bf16) for the sums
        for name, value in stats.items():
            state.stat_sums[name] = state.stat_sums.get(name, 0.0) + value
    if step.stepped and (tcfg.grad_clip or tcfg.check_grad_norm or norm_for_log):
        trained.scaler.unscale_(trained.optimizer)
        step.grad_norm = float(torch.nn.utils.clip_grad_norm_(t.params, tcfg.grad_clip or float("inf")))
        if tcfg.check_grad_norm and not math.isfinite(step.grad_norm):
            guard.handle("gradient norm", step.grad_norm)
            step.stepped = False
    if step.stepped:
        trained.scaler.step(trained.optimizer)
        trained.scaler.update()
        trained.schedule.step()
        state.step += 1
    state.batch_index = group[-1] + 1
    return step


def _end_epoch(t: Training, history: list[dict[str, Any]], events: list[dict[str, Any]], stop: StopFlag,
               checkpointer: Checkpointer, guard: NonFiniteGuard, steplog: StepLog, run_dir: Path) -> None:
    """The end of an epoch: validate, write its row, follow the best metric and early stopping, and save on the
    schedule; raises Interrupted after the save when a signal came during the epoch."""
    tcfg, ccfg, state, ranks = t.cfg.train, t.cfg.checkpoint, t.state, t.ranks
    epoch = state.epoch
    best_key, best_mode = t.best_metric
    row = ranks.broadcast(_epoch_row(t, steplog))  # rank 0 validates (its model and statistics are the run's)
    epoch_signum = ranks.any_signal(stop.signum)  # every rank decides alike
    if best_key not in row:
        raise RunFailed(f"checkpoint.best_metric: {best_key!r} is not in metrics.jsonl (keys: {', '.join(row)}); pick one of them")
    value = row[best_key]
    improved = state.best_value is None or (value > state.best_value if best_mode == "max" else value < state.best_value)
    if improved:
        state.best_value, state.best_epoch, state.bad_epochs = value, epoch, 0
    else:
        state.bad_epochs += 1
    state.epochs_done, state.epoch, state.batch_index = epoch, epoch + 1, 0
    state.loss_sum, state.seen, state.stat_sums = 0.0, 0, {name: 0.0 for name in t.task.epoch_metrics}
    if tcfg.early_stopping_patience and state.bad_epochs >= tcfg.early_stopping_patience:
        state.stopped_early = True
        events.append({"kind": "early_stop", "step": state.step,
                       "detail": f"{best_key} did not improve for {state.bad_epochs} epochs (best {state.best_value:.4f} at epoch {state.best_epoch})"})
    history.append(row)
    steplog.row(row)
    if t.judge is not None:  # one process: the verdict on the row just written; a signal may come while it waits
        _judge(t, run_dir, row, events, stop)
        epoch_signum = None if t.pruned is not None else stop.signum
    save_now = (ccfg.every_epochs and epoch % ccfg.every_epochs == 0) or epoch == tcfg.epochs or state.stopped_early
    save_started = time.perf_counter()
    stops = epoch == tcfg.epochs or state.stopped_early or epoch_signum is not None or t.pruned is not None
    if save_now or (improved and ccfg.best) or stops:
        scheduled = save_now or (improved and ccfg.best) or epoch == tcfg.epochs or state.stopped_early
        guard.snapshot = checkpointer.save("epoch" if scheduled else "signal", None, best=improved and ccfg.best, final=stops)
    log.info(
        "epoch %d/%d  %s  lr %.2e  (%.1fs, checkpoint %.2fs%s)",
        epoch, tcfg.epochs,
        "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k not in ("epoch", "step", "seconds", "lr")),
        row["lr"], row["seconds"], time.perf_counter() - save_started, ", best" if improved else "",
    )
    if state.stopped_early:
        log.info("train: early stop, %s", events[-1]["detail"])
    if t.pruned is not None:
        log.info("train: pruned by the search after epoch %d: %s", epoch, t.pruned.get("reason"))
    if epoch_signum is not None:
        raise Interrupted(epoch_signum)


def _judge(t: Training, run_dir: Path, row: dict[str, Any], events: list[dict[str, Any]], stop: StopFlag) -> None:
    assert t.judge is not None
    verdict = t.judge(run_dir, row, stop)
    if verdict is not None:
        t.pruned = {**verdict, "epoch": row["epoch"], "step": row["step"]}
        events.append({"kind": "pruned", "step": row["step"], "detail": str(verdict.get("reason"))})


def _epoch_row(t: Training, steplog: StepLog) -> dict[str, Any]:
    """The epoch's row of metrics.jsonl: the train loss and statistics, the validation split's (rank 0), lr, seconds."""
    state, task = t.state, t.task
    row: dict[str, Any] = {"epoch": state.epoch, "step": state.step, "train_loss": state.loss_sum / max(1, state.seen)}
    row.update({f"train_{name}": total / max(1, state.seen) for name, total in state.stat_sums.items()})
    if len(task.rows(t.data, "val")) > 0 and t.ranks.is_main:
        row.update(task.validation_metrics(t.trained.model, t.data, t.device, t.cfg.eval.batch_size))
    row["lr"] = t.trained.optimizer.param_groups[0]["lr"]
    row["seconds"] = steplog.epoch_seconds()
    return row


def _result(t: Training, history: list[dict[str, Any]], started: float, loop_seconds: float) -> TrainResult:
    state, ranks, device = t.state, t.ranks, t.device
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    log.info("train: %d steps in %.1fs, peak memory %.0f MB", state.step, time.perf_counter() - started, peak_mb)
    devices = ranks.gather(str(device)) if ranks.world_size > 1 else None  # each rank's device, on rank 0
    return TrainResult(
        final_state_sha256=state_dict_sha256(t.trained.model.state_dict()),
        epochs=history,
        best_epoch=state.best_epoch,
        best_value=state.best_value,
        best_metric=t.best_metric,
        steps=state.step,
        device=str(device),
        threads=torch.get_num_threads(),
        peak_memory_mb=round(peak_mb, 1),
        loop_seconds=round(loop_seconds, 4),
        devices=devices,
        backend=ranks.backend,
        trajectory=list(state.trajectory) if ranks.is_main else None,
        other_saves=list(state.other_saves) if ranks.is_main else None,
        pruned=t.pruned,
    )


def _generator_with(seed: int, epoch: int, saved_state: Optional[torch.Tensor], rank: int = 0) -> torch.Generator:
    generator = epoch_generator(seed, epoch, 1, rank)
    if saved_state is not None:
        generator.set_state(saved_state)
    return generator
