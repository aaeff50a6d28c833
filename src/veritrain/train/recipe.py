"""The built-in training, written out top to bottom over the engine users' scripts get (veritrain.train.engine):
set up, resume, then one optimizer step at a time for `train.epochs` (or exactly `train.max_steps` steps), with
validation, best.pt, early stopping and a search's verdict at every validation (`Validations`: each epoch's end, or
every `eval.every_steps` steps) and the saves the checkpoint schedule asks for.

What it draws is a pure function of the config: step k trains on rows `Order.rows(k)` (a permutation per epoch,
seeded by (seed, epoch)) with augmentation from `engine.generator(k)` (seeded by (seed, k)), so a run killed at any
moment and resumed from its newest checkpoint ends bit-identical, and an audit replays any stretch from its start.
The same makes `train.num_workers` change nothing but speed: worker processes build the steps' batches ahead of them
(`StepBatches`, veritrain.data.loader), each exactly what this process would have built.
Everything else the steps carry (weights, optimizer, schedule, gradient scaler, the RNG states, the epoch's partial
sums, the best metric) is registered with the engine and saved in every checkpoint.

With several processes (torchrun, or `--nproc N`) every rank trains on its share of each batch
(`Ranks.shard`) of a DistributedDataParallel model; the batch's loss and statistics, a signal and rank 0's
clock are summed over the ranks in one all-reduce (`sum_batch`), so every decision is the same on every rank;
rank 0 validates, logs and writes.

The record names this engine (`training.engine: recipe-2`). Runs of `recipe-1`, made before validation could fall
inside an epoch, are trained on by it alike, saving their best metric's state without its step (`SCHEMES`); runs
without an engine were trained by veritrain's earlier loop (veritrain.train.loop), which stays for them.

    veritrain train configs/digits.yaml                 # train only (prepares the data version if needed)
    veritrain train --resume latest                     # continue an interrupted run
"""

from __future__ import annotations

import contextlib
import logging
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import numpy as np
import torch
from rich.console import Console

from veritrain.core.config import config_hash
from veritrain.core.errors import Interrupted, RunFailed
from veritrain.core.hashing import state_dict_sha256
from veritrain.core.seeding import seed_everything
from veritrain.core.signals import StopFlag
from veritrain.data.loader import Feeder
from veritrain.records.record import RECORD_FORMAT
from veritrain.tasks import split_rows
from veritrain.train import ranks as rank_group, steplog as steplog_files
from veritrain.train.checkpointer import ReplayDone
from veritrain.train.engine import Best, Engine, Guard, HandBack
from veritrain.train.order import Order, StepRows
from veritrain.train.parts import (
    EpochJudge,
    EpochSums,
    TrainResult,
    batches_of,
    best_metric,
    build_optimizer,
    data_parallel,
    order_of,
    resolve_device,
    schedule_factor,
)
from veritrain.train.steplog import StepLog

if TYPE_CHECKING:
    from veritrain.core.config import RunConfig
    from veritrain.data.identity import DataVersion
    from veritrain.tasks import Task

log = logging.getLogger("veritrain")

ENGINE = "recipe-2"
# the recipe's engines, oldest first: recipe-1 validated at epoch ends only and saved no step with its best metric
SCHEMES = ("recipe-1", ENGINE)


@dataclass(frozen=True)
class Validations:
    """When the recipe validates: after every `every` optimizer steps (`eval.every_steps`), or at each epoch's end
    (`every` 0), and after the run's last step (which `train.max_steps` may put inside an epoch)."""

    every: int
    per_epoch: int
    total: int

    def due(self, done: int) -> bool:
        """Whether the recipe validates after `done` optimizer steps."""
        return done == self.total or done % (self.every or self.per_epoch) == 0

    @property
    def unit(self) -> str:
        """What a row of metrics.jsonl stands for: an `epoch`, or a `step` validated inside one."""
        return "step" if self.every else "epoch"


@dataclass
class Where:
    """Where the recipe is, for the progress bar and steps.jsonl."""

    step: int
    epoch: int
    batch_index: int
    seen: int


@dataclass
class Stepped:
    """What one optimizer step did: its mean loss (over every rank's rows), whether the weights were updated, the
    gradient norm when computed, and the signal and clock every rank agrees on after it."""

    loss: float
    updated: bool
    grad_norm: Optional[float]
    signum: Optional[int]
    minutes_due: bool


@dataclass
class Setup:
    """What the recipe trains with: built once by `_set_up`, read by the steps."""

    cfg: RunConfig
    data: DataVersion
    task: Task
    ranks: rank_group.Ranks
    device: torch.device
    model: torch.nn.Module
    forward: Any  # the model (its DistributedDataParallel wrapper with several ranks), or torch.compile of it
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    train_rows: np.ndarray
    order: Order
    engine: Engine
    sums: EpochSums
    best: Best
    best_key: str
    params: list[torch.nn.Parameter]
    feed: Feeder  # each step's batches, built by `train.num_workers` workers ahead of it, or here when it comes
    validations: Validations
    scheme: str  # the engine the run is trained by (one of SCHEMES)

    def autocast(self) -> Any:
        precision = self.cfg.train.precision
        if precision not in ("bf16", "fp16"):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def run(cfg: RunConfig, data: DataVersion, task: Task, run_dir: Path, stop: StopFlag, console: Optional[Console] = None,
        resume: bool = False, events: Optional[list[dict[str, Any]]] = None, stop_at_step: Optional[int] = None,
        epoch_judge: Optional[EpochJudge] = None, record_format: Optional[int] = RECORD_FORMAT,
        hand_back: Optional[Path] = None, ranks: Optional[rank_group.Ranks] = None, scheme: str = ENGINE) -> TrainResult:
    """Train on `data` for `cfg.train.epochs` (or `cfg.train.max_steps`), writing metrics.jsonl, steps.jsonl and
    checkpoints/ (see the module's docstring). `scheme`: the engine the run's record names (SCHEMES). `resume`: from the newest valid checkpoint. `stop_at_step` and `hand_back`: an audit replay, which hands
    every state it enters in the trajectory back and stops at the scheduled save of that step. `epoch_judge`: a search's
    verdict after every validation; a pruning one ends training there. `ranks`: this process's place among several."""
    started = time.perf_counter()
    events = events if events is not None else []
    ccfg = cfg.checkpoint
    if scheme not in SCHEMES:
        raise RunFailed(f"training.engine: {scheme!r} is not the recipe's ({', '.join(SCHEMES)})")
    s = _set_up(cfg, data, task, run_dir, events, record_format, ranks or rank_group.ONE_PROCESS, scheme)
    engine, order, sums, best, main = s.engine, s.order, s.sums, s.best, s.ranks.is_main
    if epoch_judge is not None and s.ranks.world_size > 1:
        raise RunFailed("a search's trial trains in one process; drop torchrun and --nproc for it")
    if hand_back is not None:
        engine.hand_back = HandBack(hand_back, lambda index, step: stop_at_step is not None and index > 0 and step >= stop_at_step, ReplayDone)
    history: list[dict[str, Any]] = []  # the rows of metrics.jsonl

    def rewind(saved: dict[str, Any]) -> None:  # a restored state (resume, rollback): its later rows are written again
        step = int(saved["loop"]["step"])
        if main:
            steplog_files.rewind(run_dir, step)
        history[:] = [row for row in history if row["step"] <= step]

    engine.on_restore.append(rewind)

    # ---- resume from the newest valid checkpoint, or start: the initial state is trajectory entry 0
    found = engine.newest() if resume else None
    if resume and found is None:
        log.info("resume: no checkpoint was saved yet; training from the beginning")
        events.append({"kind": "resume", "step": 0, "detail": "no checkpoint yet: from the beginning"})
        if main:
            steplog_files.clear(run_dir)
    engine.start(found[1] if found is not None else None)
    if found is not None:
        _say_resumed(found, engine, order, events, {"device": str(s.device), "threads": torch.get_num_threads(), "num_workers": cfg.train.num_workers})
    history[:] = steplog_files.read_metrics(run_dir)
    pruned = None
    if resume and history and epoch_judge is not None and history[-1]["step"] == engine.position:  # its verdict may be missing
        with stop.deferred():
            pruned = _judge(epoch_judge, run_dir, history[-1], events, stop, s.validations.unit)
    steplog = StepLog(cfg, run_dir, console, main, order.per_epoch, order.epochs, s.validations.unit)
    engine.last_save = time.monotonic()  # checkpoint.every_minutes counts from here

    # ---- the steps; a signal takes effect at the next step boundary, never mid-save
    loop_started, shown_epoch = time.perf_counter(), 0
    with steplog, stop.deferred(), s.feed:
        for step, rows in ([] if best.stop or pruned is not None else engine.batches(order)):
            epoch, within = order.epoch_of(step)
            if epoch != shown_epoch or within == 0:
                steplog.start_epoch(epoch, within, sums.seen)
                s.model.train()
                shown_epoch = epoch
            done = _train_step(s, step, rows, steplog.logs_step(step + 1), stop)
            if engine.rewound:  # rolled back: the next step is the restored one
                continue
            engine.position = step + 1
            steplog.step(Where(step + 1, epoch, within + 1, sums.seen), done.loss, s.optimizer.param_groups[0]["lr"], done.grad_norm, done.updated)
            if not s.validations.due(step + 1):  # between validations: the checkpoint schedule, the clock, a signal
                if _scheduled(s, epoch, step + 1):
                    engine.save("epoch" if within + 1 == order.per_epoch else "step")
                elif done.minutes_due:
                    engine.save("minutes", scheduled=False)
                if done.signum is not None:
                    engine.save("signal", scheduled=False, final=ccfg.last)
                    raise Interrupted(done.signum)
                continue
            row = s.ranks.broadcast(_validation_row(s, epoch, step, steplog))  # rank 0 validates: its row is every rank's
            history.append(row)
            steplog.row(row)
            pruned = _judge(epoch_judge, run_dir, row, events, stop, s.validations.unit) if epoch_judge is not None else None
            signum = s.ranks.any_signal(stop.signum) if pruned is None else None  # every rank decides alike
            if _validated(s, row, events, signum, pruned is not None):
                break
    loop_seconds = time.perf_counter() - loop_started
    steplog.close()
    device = s.device
    peak_mb = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log.info("train: %d steps in %.1fs, peak memory %.0f MB", engine.position, time.perf_counter() - started, peak_mb)
    several = s.ranks.world_size > 1
    return TrainResult(final_state_sha256=state_dict_sha256(s.model.state_dict()), epochs=history, best_epoch=best.epoch,
                       best_step=_best_step(s, history), epochs_trained=-(-engine.position // order.per_epoch), best_value=best.value, best_metric=(s.best_key, best.mode), steps=engine.position, device=str(device),
                       threads=torch.get_num_threads(), peak_memory_mb=round(peak_mb, 1), loop_seconds=round(loop_seconds, 4),
                       devices=s.ranks.gather(str(device)) if several else None, backend=s.ranks.backend,
                       trajectory=list(engine.entries) if main else None, other_saves=list(engine.other_saves) if main else None,
                       pruned=pruned, engine=ENGINE)


def _set_up(cfg: RunConfig, data: DataVersion, task: Task, run_dir: Path, events: list[dict[str, Any]], record_format: Optional[int],
            ranks: rank_group.Ranks, scheme: str) -> Setup:
    """Seeds, device, the ranks joined, model, optimizer, schedule, and the engine that carries them and the recipe's
    own state."""
    tcfg, ccfg = cfg.train, cfg.checkpoint
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    seed_everything(cfg.seed, tcfg.deterministic, compiler=tcfg.compile)
    ranks, device = rank_group.join_for_training(ranks, tcfg, resolve_device(tcfg.device))
    if tcfg.precision == "fp16" and device.type != "cuda":
        raise RunFailed("train.precision: 'fp16' needs a CUDA device (gradient scaling); use bf16 on the CPU")
    model = task.build_model(cfg.model, data).to(device)
    task.prepare(data)
    if tcfg.channels_last:
        model = model.to(memory_format=torch.channels_last)  # pyright: ignore[reportCallIssue]
    model, trainer = data_parallel(model, ranks, cfg, device)
    optimizer = build_optimizer(cfg.optim, model)
    train_rows = split_rows(task, data, "train")
    order = order_of(cfg, len(train_rows), ranks.world_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_factor(cfg.schedule, order.per_epoch, order.total))
    if cfg.schedule.warmup_steps >= order.total and ranks.is_main:
        log.warning("train: schedule.warmup_steps %d is not below the run's %d steps: the learning rate never reaches optim.lr "
                    "(%g); lower the warmup or train longer", cfg.schedule.warmup_steps, order.total, cfg.optim.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=tcfg.precision == "fp16")  # passes values through when disabled
    best_key, best_mode = best_metric(cfg, task, data)
    best, sums = Best(best_mode, tcfg.early_stopping_patience), EpochSums(tuple(task.epoch_metrics))
    engine = Engine(cfg.seed, config_hash(cfg), data.version, run_dir / "checkpoints", ccfg.keep_last, ccfg.audit_every,
                    Guard(tcfg.on_nonfinite, tcfg.max_rollbacks, tcfg.rollback_lr_factor), events, scheme, {"num_workers": tcfg.num_workers},
                    ranks)
    engine.record_format = record_format
    if ranks.is_main:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    engine.register(model, optimizer, schedule, scaler, extra={"sums": sums, "best": best})
    params = [p for p in model.parameters() if p.requires_grad]
    log.info("train: %s (%s parameters) on %s, %d threads, precision %s, %d samples, %d steps/epoch × %d epochs%s",
             cfg.model.target or cfg.model.name, f"{sum(p.numel() for p in model.parameters()):,}", device, torch.get_num_threads(),
             tcfg.precision, len(train_rows), order.per_epoch, order.epochs, f" ({order.total} steps)" if tcfg.max_steps else "")
    if ranks.world_size > 1:
        log.info("train: rank %d of %d (%d node(s), backend %s); each batch of %d is split over the ranks",
                 ranks.rank, ranks.world_size, ranks.nodes, ranks.backend, tcfg.batch_size)
    built_on = device if tcfg.num_workers == 0 else torch.device("cpu")  # a worker builds on the CPU; the step moves it
    feed = Feeder(StepBatches(cfg, data, task, ranks, train_rows, order, engine, built_on), order.total, tcfg.num_workers, pin=device.type == "cuda")
    return Setup(cfg=cfg, data=data, task=task, ranks=ranks, device=device, model=model, forward=torch.compile(trainer) if tcfg.compile else trainer,
                 optimizer=optimizer, schedule=schedule, scaler=scaler, train_rows=train_rows, order=order, engine=engine, sums=sums,
                 best=best, best_key=best_key, params=params, feed=feed,
                 validations=Validations(cfg.eval.every_steps, order.per_epoch, order.total), scheme=scheme)


class StepBatches:
    """Step k → its batches, as (rows of this rank's share, rows of the whole batch, inputs, targets), one per batch whose
    gradients the step accumulates: the rows of `Order.rows(k)`, built by the task with the engine's generator for k.
    A pure function of k, so it gives the same in a worker process as here (veritrain.data.loader)."""

    def __init__(self, cfg: RunConfig, data: DataVersion, task: Task, ranks: rank_group.Ranks, train_rows: np.ndarray, order: Order,
                 engine: Engine, device: torch.device) -> None:
        self.cfg, self.data, self.task, self.ranks, self.train_rows, self.rows = cfg, data, task, ranks, train_rows, StepRows(order)
        self.engine, self.device = engine, device

    def __call__(self, step: int) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
        augment = self.engine.generator(step)
        for part in batches_of(self.cfg, self.train_rows, self.rows(step), self.ranks.world_size):
            share = self.ranks.shard(part)
            x, y = self.task.batch(self.data, share, self.device, True, augment)
            yield len(share), len(part), x, y


def _train_step(s: Setup, step: int, rows: np.ndarray, norm_for_log: bool, stop: StopFlag) -> Stepped:
    """One optimizer step: forward and backward over its batches, then the update. With several ranks each trains on its
    share of every batch, and the batch's numbers are summed over the ranks. A non-finite loss or gradient norm goes to
    the engine's guard (after a rollback `s.engine.rewound` is set and nothing more happens)."""
    tcfg, engine, task, ranks = s.cfg.train, s.engine, s.task, s.ranks
    done = Stepped(0.0, False, None, stop.signum, False)
    s.optimizer.zero_grad(set_to_none=True)
    count = len(batches_of(s.cfg, s.train_rows, rows, ranks.world_size))  # the step's batches: each one's loss counts 1/count
    for share, part, x, y in s.feed.get(step):
        if x.device != s.device:  # built by a worker
            x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
        if tcfg.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with s.autocast():
            outputs = s.forward(x)
            batch_loss = task.loss(outputs, y)
        value, stats = batch_loss.item(), task.batch_stats(outputs.detach().float(), y)
        if ranks.world_size > 1:  # the whole batch's numbers, the same on every rank (so are all decisions)
            summed = rank_group.sum_batch(value, share, stats, stop.signum, engine.minutes_due(s.cfg.checkpoint.every_minutes))
            value, stats, done.signum, done.minutes_due = summed.loss, summed.stats, summed.signum, summed.minutes_due
            if share * ranks.world_size != part:  # DDP averages the ranks' gradients: weigh an unequal share
                batch_loss = batch_loss * (share * ranks.world_size / part)
        if not engine.guard(value, "loss"):
            if engine.rewound:
                return done
            continue
        s.scaler.scale(batch_loss / count if count > 1 else batch_loss).backward()
        done.updated, done.loss = True, done.loss + value / count
        s.sums.add(value, part, stats)
    if done.updated and (tcfg.grad_clip or tcfg.check_grad_norm or norm_for_log):
        s.scaler.unscale_(s.optimizer)
        done.grad_norm = float(torch.nn.utils.clip_grad_norm_(s.params, tcfg.grad_clip or float("inf")))
        if tcfg.check_grad_norm and not engine.guard(done.grad_norm, "gradient norm"):
            done.updated = False
    if done.updated:
        s.scaler.step(s.optimizer)
        s.scaler.update()
        s.schedule.step()
    if ranks.world_size == 1:  # one process reads its signal flag and its clock now
        done.signum, done.minutes_due = stop.signum, engine.minutes_due(s.cfg.checkpoint.every_minutes)
    return done


def _validation_row(s: Setup, epoch: int, step: int, steplog: StepLog) -> dict[str, Any]:
    """A row of metrics.jsonl: the epoch in progress and the steps done, the train loss and statistics since the last
    validation, the validation split's, lr, seconds."""
    row = {"epoch": epoch, "step": step + 1, **s.sums.row()}
    if len(s.task.rows(s.data, "val")) > 0 and s.ranks.is_main:
        row.update(s.task.validation_metrics(s.model, s.data, s.device, s.cfg.eval.batch_size))
        s.model.train()  # validation left it in eval mode; the steps after it, inside the epoch, train
    row.update(lr=s.optimizer.param_groups[0]["lr"], seconds=steplog.row_seconds())
    if s.ranks.is_main and s.best_key not in row:  # the other ranks take rank 0's row
        raise RunFailed(f"checkpoint.best_metric: {s.best_key!r} is not in metrics.jsonl (keys: {', '.join(row)}); pick one of them")
    return row


def _scheduled(s: Setup, epoch: int, done: int) -> bool:
    """Whether the checkpoint schedule saves after `done` steps: every `every_steps` steps, every `every_epochs`-th
    epoch's end, and the last step."""
    ccfg, per_epoch = s.cfg.checkpoint, s.order.per_epoch
    return bool(ccfg.every_steps and done % ccfg.every_steps == 0) or done == s.order.total \
        or bool(ccfg.every_epochs and done % per_epoch == 0 and epoch % ccfg.every_epochs == 0)


def _validated(s: Setup, row: dict[str, Any], events: list[dict[str, Any]], signum: Optional[int], pruned: bool) -> bool:
    """Follow the best metric and early stopping, and save as scheduled (or because training stops here). Returns
    whether training ends after this validation; raises Interrupted after the save when a signal came."""
    ccfg, best, engine, by_step = s.cfg.checkpoint, s.best, s.engine, s.validations.unit == "step"
    epoch, position = row["epoch"], row["step"]
    improved = best.update(row[s.best_key], epoch, position if s.scheme != "recipe-1" else None)
    s.sums.loss_sum, s.sums.seen, s.sums.stats = 0.0, 0, {}
    if best.stop:
        where = f"step {best.step}" if by_step else f"epoch {best.epoch}"
        events.append({"kind": "early_stop", "step": position, "detail": f"{s.best_key} did not improve for {best.bad_epochs} "
                       f"{'validations' if by_step else 'epochs'} (best {best.value:.4f} at {where})"})
    last = position == s.order.total
    scheduled = _scheduled(s, epoch, position) or best.stop or (improved and ccfg.best)
    ends = last or best.stop or pruned or signum is not None
    if scheduled or ends:
        engine.save("epoch" if scheduled and position % s.order.per_epoch == 0 else "step" if scheduled else "signal", scheduled=scheduled,
                    best=improved and ccfg.best, final=ends and ccfg.last)
    shown = "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k not in ("epoch", "step", "seconds", "lr"))
    if by_step:
        log.info("step %d/%d (epoch %d)  %s  lr %.2e  (%.1fs%s)", position, s.order.total, epoch, shown, row["lr"], row["seconds"], ", best" if improved else "")
    else:
        log.info("epoch %d/%d  %s  lr %.2e  (%.1fs%s)", epoch, s.order.epochs, shown, row["lr"], row["seconds"], ", best" if improved else "")
    if best.stop or pruned:
        log.info("train: %s", events[-1]["detail"])
        return True
    if signum is not None:
        raise Interrupted(signum)
    return False


def _best_step(s: Setup, history: list[dict[str, Any]]) -> Optional[int]:
    """The step of the validation with the best metric (`training.best_step`): the recipe's own count, or for a run of
    recipe-1, which counted only epochs, the step of that epoch's row."""
    if s.best.step is not None or s.scheme != "recipe-1":
        return s.best.step
    return next((row["step"] for row in history if row["epoch"] == s.best.epoch), None)


def _say_resumed(found: tuple[Path, dict[str, Any]], engine: Engine, order: Order, events: list[dict[str, Any]], now: dict[str, Any]) -> None:
    path, saved = found
    epoch, batch = order.epoch_of(engine.position)
    changed = {k: (v, now[k]) for k, v in (saved.get("settings") or {}).items() if k in now and now[k] != v}
    if changed:
        log.warning("resume: settings differ from the saved run (%s); the result may not be bit-identical",
                    ", ".join(f"{k} {a} → {b}" for k, (a, b) in changed.items()))
    events.append({"kind": "resume", "step": engine.position, "detail": f"from checkpoints/{path.name} (epoch {epoch}, batch {batch})"})
    log.info("resume: from %s at step %d (epoch %d, batch %d)", path.name, engine.position, epoch, batch)


def _judge(judge: EpochJudge, run_dir: Path, row: dict[str, Any], events: list[dict[str, Any]], stop: StopFlag, unit: str) -> Optional[dict[str, Any]]:
    verdict = judge(run_dir, row, stop)
    if verdict is None:
        return None
    where = f"step {row['step']} (epoch {row['epoch']})" if unit == "step" else f"epoch {row['epoch']}"
    events.append({"kind": "pruned", "step": row["step"], "detail": f"pruned by the search after {where}: {verdict.get('reason')}"})
    return {**verdict, "epoch": row["epoch"], "step": row["step"]}
