"""The training stage, with the loop written out.

Seeds python, numpy and torch, uses only deterministic kernels, and draws each epoch's data order
and augmentation from generators seeded by (seed, epoch). Everything the loop carries from one step
to the next — weights, optimizer, schedule, gradient scaler, RNG states, position in the epoch,
partial-epoch sums, best metric, rollback count — is in every checkpoint, so a run killed at any
moment and resumed ends with bit-identical weights and metrics on the same machine.

Checkpoints are saved on an explicit schedule (`checkpoint.every_epochs`, `every_steps`,
`every_minutes`) and when SIGINT/SIGTERM arrives (after the current step). A NaN/inf loss is caught
the step it happens and handled by `train.on_nonfinite`.

    veritrain train configs/digits.yaml                 # train only (prepares the data version if needed)
    veritrain train --resume latest                     # continue an interrupted run
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import random
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, cast

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from veritrain.core.errors import Interrupted, RunFailed, UserError
from veritrain.core.files import write_atomic
from veritrain.core.hashing import state_dict_sha256
from veritrain.core.signals import StopFlag
from veritrain.results.evaluate import forward_split
from veritrain.train import checkpoint, distributed, trajectory

log = logging.getLogger("veritrain")


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
class TrainResult:
    final_state_sha256: str
    epochs: list[dict[str, Any]]  # the rows of metrics.jsonl
    best_epoch: int
    best_value: Optional[float]
    best_metric: tuple[str, str]
    steps: int
    device: str
    threads: int
    peak_memory_mb: float
    loop_seconds: float = 0.0  # the epochs alone (no setup, data or model building): what overhead is measured on
    trajectory: Optional[list[dict[str, Any]]] = None  # one entry per scheduled checkpoint (and the initial state)
    other_saves: Optional[list[dict[str, Any]]] = None  # signal and every_minutes saves: {step, reason, state_sha256}
    devices: Optional[list[str]] = None  # with several ranks: each rank's device, in rank order
    backend: Optional[str] = None  # with several ranks: the collective backend


class _RolledBack(Exception):
    """Raised inside the epoch to restart the loop from the restored snapshot."""


class ReplayDone(Exception):
    """`run(stop_at_step=N)` (an audit replay) reached the scheduled checkpoint at step N: carries the
    trajectory so far and the state that checkpoint would hold."""

    def __init__(self, trajectory: list[dict[str, Any]], state: dict[str, Any]):
        super().__init__(f"replayed to step {trajectory[-1]['step']}")
        self.trajectory, self.state = trajectory, state


SCHEDULED = ("step", "epoch")  # saves in the trajectory; "signal" and "minutes" depend on timing


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise RunFailed("train.device: 'cuda' requested but no CUDA device is available; set train.device=cpu or auto")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        # cuBLAS needs a fixed workspace for deterministic results; must be set before its first use
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def epoch_generator(seed: int, epoch: int, stream: int, rank: int = 0) -> torch.Generator:
    """A generator for one epoch and purpose (0: data order, 1: augmentation), independent of how
    many random numbers earlier epochs drew — so an epoch can be replayed from its number alone.
    Ranks after the first draw their own augmentation (`rank`); rank 0 draws what one process draws."""
    entropy = [seed % 2**63, epoch, stream] + ([rank] if rank else [])
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def build_optimizer(cfg: Any, model: torch.nn.Module) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov and cfg.momentum > 0
        )
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.momentum, 0.999), weight_decay=cfg.weight_decay)


def schedule_factor(cfg: Any, steps_per_epoch: int, total_steps: int):
    """lr multiplier per optimizer step: linear warmup over `warmup_steps`, then cosine to 0, constant,
    or a drop by `gamma` every `step_epochs` epochs."""
    warmup, name, gamma = cfg.warmup_steps, cfg.name, cfg.gamma
    drop_every = cfg.step_epochs * steps_per_epoch
    cosine_steps = max(1, total_steps - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if name == "constant":
            return 1.0
        if name == "step":
            return gamma ** (step // drop_every)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / cosine_steps)))

    return factor


def batch_starts(n: int, batch_size: int, world_size: int = 1) -> list[int]:
    """Start offsets of the (global) batches of one epoch. A last batch with fewer than 2 samples per
    rank is dropped: BatchNorm cannot normalise one sample, and a one-sample step would be noise anyway."""
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] < 2 * world_size:
        starts.pop()
    return starts


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


def _truncate_jsonl(path: Path, keep) -> None:
    """Rewrite a .jsonl file with only the rows `keep(row)` accepts (rows after a checkpoint are
    replayed on resume and written again)."""
    if not path.exists():
        return
    rows = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip() and keep(json.loads(line))]
    write_atomic(path, "".join(r + "\n" for r in rows).encode())


def run(cfg: Any, data: Any, task: Any, run_dir: Path, stop: StopFlag, console: Optional[Console] = None,
        resume: bool = False, events: Optional[list[dict[str, Any]]] = None,
        ranks: Optional[distributed.Ranks] = None, stop_at_step: Optional[int] = None) -> TrainResult:
    """Stage entry: train on `data` for `cfg.train.epochs`; writes metrics.jsonl, steps.jsonl and
    checkpoints/. With `resume`, continue from the newest valid checkpoint in `run_dir`.

    With `ranks` (one of several processes started by torchrun, see veritrain.train.distributed) each
    rank trains on its share of every global batch of `train.batch_size` samples; only rank 0 writes.
    With `stop_at_step` (an audit replay, `veritrain.trust.audit`) it raises ReplayDone at the scheduled
    checkpoint of that step instead of writing it."""
    started = time.perf_counter()
    tcfg, ccfg = cfg.train, cfg.checkpoint
    events = events if events is not None else []
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    seed_everything(cfg.seed, tcfg.deterministic)
    device = resolve_device(tcfg.device)
    main = ranks is None or ranks.is_main  # the process that writes metrics, logs of steps and checkpoints
    world_size = ranks.world_size if ranks else 1
    if ranks is not None:
        if device.type == "cuda":
            device = torch.device("cuda", ranks.local_rank)
        problem = distributed.config_problem(tcfg, world_size, device.type)  # `--nproc` checks it before the run starts
        if problem:
            raise RunFailed(problem)
        ranks = distributed.start(ranks, tcfg.backend, device.type)
    if tcfg.precision == "fp16" and device.type != "cuda":
        raise RunFailed("train.precision: 'fp16' needs a CUDA device (gradient scaling); use bf16 on the CPU")
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tcfg.precision)

    from veritrain.core.config import config_hash

    model = task.build_model(cfg.model, data).to(device)
    if hasattr(task, "prepare"):
        task.prepare(data)
    if tcfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    trainer: torch.nn.Module = model  # what the training forward runs: the model, or its DDP wrapper
    if ranks is not None:
        if tcfg.batchnorm == "sync":
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        # rank 0's initial weights go to every rank; its buffers (BatchNorm statistics) before every forward
        trainer = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if not ranks.is_main:  # dropout differs per rank (the weights are rank 0's): reseed the global generators
            seed_everything(int(np.random.SeedSequence([cfg.seed % 2**63, ranks.rank]).generate_state(1, dtype=np.uint64)[0] % 2**63),
                            tcfg.deterministic)
    optimizer = build_optimizer(cfg.optim, model)
    train_rows = data.splits["train"]
    starts = batch_starts(len(train_rows), tcfg.batch_size, world_size)
    steps_per_epoch = math.ceil(len(starts) / tcfg.accumulate_steps)
    state = LoopState(stat_sums={name: 0.0 for name in task.epoch_metrics})
    factor = schedule_factor(cfg.schedule, steps_per_epoch, steps_per_epoch * tcfg.epochs)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor(step) * state.lr_factor)
    scaler = torch.amp.GradScaler(device.type, enabled=tcfg.precision == "fp16")  # passes values through when disabled

    def autocast() -> Any:
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=autocast_dtype)

    best_key = ccfg.best_metric or task.best_metric[0]
    best_mode = ccfg.best_mode or task.best_metric[1]
    has_val = len(data.splits["val"]) > 0
    if not has_val and best_key.startswith("val_"):
        best_key = "train_" + best_key.removeprefix("val_")
        log.warning("train: the val split is empty; best.pt follows %s on the train split", best_key)
    ckpt_dir = run_dir / "checkpoints"
    if main:
        ckpt_dir.mkdir(exist_ok=True)
    metrics_path, steps_path = run_dir / "metrics.jsonl", run_dir / "steps.jsonl"
    settings = {"device": str(device), "threads": torch.get_num_threads(), "num_workers": tcfg.num_workers}
    run_config_hash = config_hash(cfg)

    def full_state(reason: str, augment: Optional[torch.Generator]) -> dict[str, Any]:
        return {
            "format_version": checkpoint.FORMAT_VERSION,
            "reason": reason,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rng_state(),
            "augment_rng": augment.get_state() if augment is not None else None,
            # a copy: the loop goes on mutating it
            "loop": {**vars(state), "stat_sums": dict(state.stat_sums), "trajectory": list(state.trajectory), "other_saves": list(state.other_saves)},
            "settings": settings,
            "config_hash": run_config_hash,
            "data_version": data.version,
        }

    history: list[dict[str, Any]] = []  # the rows of metrics.jsonl so far

    def restore(saved: dict[str, Any]) -> Optional[torch.Tensor]:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        scaler.load_state_dict(saved["scaler"])
        for key, value in saved["loop"].items():
            setattr(state, key, value)
        # a checkpoint written by rank 0 holds every rank's generators; a rank's own rollback snapshot only its own
        own = saved["distributed"]["ranks"][ranks.rank] if ranks is not None and "distributed" in saved else saved
        set_rng_state(own["rng"])
        if main:
            _truncate_jsonl(metrics_path, lambda row: row["epoch"] <= state.epochs_done)
            _truncate_jsonl(steps_path, lambda row: row["step"] <= state.step)
        del history[state.epochs_done :]
        return own["augment_rng"]

    augment_resume: Optional[torch.Tensor] = None
    has_checkpoint = any(ckpt_dir.glob("*.pt")) if main else None
    if ranks is not None:
        has_checkpoint = distributed.broadcast(has_checkpoint)
    if resume and not has_checkpoint:
        # stopped before its first checkpoint: starting over is the same run, bit for bit
        log.info("resume: no checkpoint was saved yet; training from the beginning")
        events.append({"kind": "resume", "step": 0, "detail": "no checkpoint yet: from the beginning"})
        if main:
            _truncate_jsonl(metrics_path, lambda row: False)
            _truncate_jsonl(steps_path, lambda row: False)
        resume = False
    if resume:
        path, saved, problems = checkpoint.newest_valid(ckpt_dir) if main else (None, None, [])
        for problem in problems:
            log.warning("checkpoint: %s; falling back to an older one", problem)
        if ranks is not None:  # every rank resumes from the file rank 0 chose
            chosen = distributed.broadcast(path.name if path is not None and saved is not None else None)
            if not main and chosen is not None:
                path = ckpt_dir / chosen
                saved = checkpoint.load(path)
        if saved is None or path is None:
            raise RunFailed(f"resume: no valid checkpoint in {ckpt_dir}; start a new run instead")
        if saved["config_hash"] != run_config_hash or saved["data_version"] != data.version:
            raise RunFailed(f"resume: {path.name} was saved with another config or data version; resume with the run's own config.yaml")
        saved_world = int((saved.get("distributed") or {}).get("world_size", 1))
        if saved_world != world_size:
            raise UserError(f"resume: {path.name} was saved by {saved_world} process(es) and this resume has {world_size}; "
                            f"resume with the same number (--nproc {saved_world}): each rank's random state and share of the data are in the checkpoint")
        if main:
            for name in checkpoint.discard_after(ckpt_dir, int(saved["loop"]["step"])):
                log.warning("checkpoint: removed %s, which failed its check and lies after the resume point", name)
        changed = {k: (saved["settings"].get(k), v) for k, v in settings.items() if saved["settings"].get(k) != v}
        if changed:
            log.warning("resume: settings differ from the saved run (%s); the result may not be bit-identical",
                        ", ".join(f"{k} {a} → {b}" for k, (a, b) in changed.items()))
        augment_resume = restore(saved)
        events.append({"kind": "resume", "step": state.step, "detail": f"from checkpoints/{path.name} (epoch {state.epoch}, batch {state.batch_index})"})
        log.info("resume: from %s at step %d (epoch %d, batch %d)", path.name, state.step, state.epoch, state.batch_index)
    if metrics_path.exists():
        history.extend(json.loads(line) for line in metrics_path.read_text().splitlines())

    def complete_state(reason: str, augment: Optional[torch.Generator]) -> tuple[Optional[dict[str, Any]], dict[str, Any]]:
        """(what rank 0 writes: with every rank's generators; None on the other ranks, this rank's own state)."""
        own = full_state(reason, augment)
        if ranks is None:
            return own, own
        parts = distributed.gather({"rng": own["rng"], "augment_rng": own["augment_rng"]}, ranks)
        return ({**own, "distributed": {"world_size": world_size, "ranks": parts}} if main else None), own

    def commit(written: dict[str, Any], reason: str, epoch: int) -> None:
        """Enter a state rank 0 is about to write into the trajectory (or other_saves), and into the state itself."""
        state_hash = trajectory.state_sha256(written)
        if reason in SCHEDULED or reason == "initial":
            state.trajectory.append(trajectory.entry(state.trajectory, run_config_hash, data.version, state.step, epoch,
                                                     state_hash, state_dict_sha256(written["model"])))
        else:
            # a timing save names the chain entry it follows: it is a resume point, never a result
            state.other_saves.append({"step": state.step, "reason": reason, "state_sha256": state_hash,
                                      "after_step": state.trajectory[-1]["step"] if state.trajectory else None})
        written["loop"] = {**written["loop"], "trajectory": list(state.trajectory), "other_saves": list(state.other_saves)}
        if stop_at_step is not None and reason in SCHEDULED and state.step >= stop_at_step:
            raise ReplayDone(list(state.trajectory), written)

    rank = ranks.rank if ranks is not None else 0
    # the rollback target: the initial (or resumed) state, then every step-scheduled checkpoint
    if resume:
        snapshot = checkpoint.encode(full_state("snapshot", _generator_with(cfg.seed, state.epoch, augment_resume, rank)))
    else:  # the trajectory starts with the initial state, which an audit rebuilds from the config alone
        written, own = complete_state("snapshot", _generator_with(cfg.seed, state.epoch, None, rank))
        if written is not None:
            commit(written, "initial", 0)
        snapshot = checkpoint.encode(written if written is not None else own)
    forward = torch.compile(trainer) if tcfg.compile else trainer
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "train: %s (%s parameters) on %s, %d threads, precision %s, %d samples, %d batches (%d steps)/epoch × %d epochs",
        cfg.model.target or cfg.model.name, f"{n_params:,}", device, torch.get_num_threads(), tcfg.precision,
        len(train_rows), len(starts), steps_per_epoch, tcfg.epochs,
    )
    if ranks is not None:
        log.info("train: rank %d of %d (%d node(s), backend %s); each global batch of %d is split over the ranks",
                 ranks.rank, world_size, ranks.nodes, ranks.backend, tcfg.batch_size)

    last_save = time.monotonic()
    board = _tensorboard(run_dir) if cfg.logging.tensorboard and main else None

    def save(reason: str, augment: Optional[torch.Generator], best: bool = False, final: bool = False) -> bytes:
        """One checkpoint: step-<N>.pt, plus best.pt when it improved and last.pt when training stops
        (during training the newest step file is the latest state; resume looks at both)."""
        nonlocal last_save
        t = time.perf_counter()
        written, own = complete_state(reason, augment)
        if written is None:  # not rank 0: rank 0 writes the file; this rank keeps its own state as its rollback snapshot
            last_save = time.monotonic()
            return checkpoint.encode(own)
        commit(written, reason, state.epochs_done if augment is None else state.epoch)
        data_bytes = checkpoint.encode(written)
        targets = (["best.pt"] if best else []) + [f"step-{state.step}.pt"]
        if final and ccfg.last:
            targets.append("last.pt")
        # checkpoint.audit_every K: every K-th entry of the trajectory stays for `veritrain audit`
        kept_for_audit = {e["step"] for i, e in enumerate(state.trajectory) if ccfg.audit_every and i and i % ccfg.audit_every == 0}
        try:
            checkpoint.write(ckpt_dir, data_bytes, targets, ccfg.keep_last, keep=kept_for_audit)
        except OSError as err:
            raise RunFailed(f"checkpoint: saving at step {state.step} failed ({err.strerror or err}); "
                            "the previous checkpoint is intact") from None
        last_save = time.monotonic()
        log.debug("checkpoint: %s (%s) in %.3fs, %d bytes", ", ".join(targets), reason,
                  time.perf_counter() - t, len(data_bytes))
        return data_bytes

    def nonfinite(what: str, value: float) -> None:
        """Apply train.on_nonfinite; returns to skip the batch, raises to stop or roll back."""
        nonlocal augment_resume
        detail = f"{what} became {value} at step {state.step + 1} (epoch {state.epoch}, batch {state.batch_index + 1})"
        if tcfg.on_nonfinite == "skip_batch":
            events.append({"kind": "skip_batch", "step": state.step + 1, "detail": detail})
            log.warning("train: %s; batch skipped", detail)
            return
        if tcfg.on_nonfinite == "stop" or state.rollbacks >= tcfg.max_rollbacks:
            why = "on_nonfinite is stop" if tcfg.on_nonfinite == "stop" else f"after {state.rollbacks} rollback(s) (train.max_rollbacks)"
            events.append({"kind": "nonfinite_stop", "step": state.step + 1, "detail": detail})
            raise RunFailed(f"train: {detail}; stopped {why}; lower optim.lr or check the data")
        rollbacks, lr_factor, failed_step = state.rollbacks + 1, state.lr_factor * tcfg.rollback_lr_factor, state.step + 1
        augment_resume = restore(torch.load(io.BytesIO(snapshot), weights_only=True))
        state.rollbacks, state.lr_factor = rollbacks, lr_factor
        for group, base in zip(optimizer.param_groups, schedule.base_lrs):
            group["lr"] = base * factor(schedule.last_epoch) * state.lr_factor
        events.append({"kind": "rollback", "step": failed_step, "detail": f"{detail}; restored step {state.step}, lr × {lr_factor:g}"})
        log.warning("train: %s; rolled back to step %d, lr factor %g (rollback %d of %d)", detail, state.step, lr_factor, rollbacks, tcfg.max_rollbacks)
        raise _RolledBack()

    progress = Progress(
        TextColumn("[bold]epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[rate]} samples/s"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=console is None or not console.is_terminal,  # nobody sees a bar in a pipe or file
    )
    params = [p for p in model.parameters() if p.requires_grad]
    log_every = cfg.logging.every_steps
    loop_started = time.perf_counter()
    next_progress = 0.0
    with progress:
        bar = progress.add_task("train", total=len(starts), epoch="", loss="-", lr="-", rate="-")
        while state.epoch <= tcfg.epochs and not state.stopped_early:
            epoch = state.epoch
            order = train_rows[torch.randperm(len(train_rows), generator=epoch_generator(cfg.seed, epoch, 0)).numpy()]
            augment = _generator_with(cfg.seed, epoch, augment_resume, rank)
            augment_resume = None
            epoch_started = time.perf_counter()
            seen_at_start = state.seen
            progress.reset(bar, total=len(starts), completed=state.batch_index, epoch=f"{epoch}/{tcfg.epochs}", loss="-", lr="-", rate="-")
            try:
                with stop.deferred():  # a signal takes effect at the next step boundary, never mid-save
                    model.train()
                    while state.batch_index < len(starts):
                        first = state.batch_index
                        group = range(first, min(len(starts), (first // tcfg.accumulate_steps + 1) * tcfg.accumulate_steps))
                        optimizer.zero_grad(set_to_none=True)
                        step_loss, stepped = 0.0, False
                        for b in group:
                            rows = order[starts[b] : starts[b] + tcfg.batch_size]
                            batch_rows = len(rows)  # of the global batch, all ranks together
                            if ranks is not None:
                                rows = distributed.shard(rows, ranks)
                            x, y = task.batch(data, rows, device, True, augment)
                            if tcfg.channels_last and x.dim() == 4:
                                x = x.contiguous(memory_format=torch.channels_last)
                            with autocast():
                                outputs = forward(x)
                                loss = task.loss(outputs, y)
                            loss_value = loss.item()  # the batch loss as a Python float: the non-finite check and the epoch sums
                            if ranks is None:
                                loss_total = loss_value * len(rows)
                                stats = None
                            else:  # the global batch's loss and statistics, the same on every rank (so are all decisions)
                                local_stats = task.batch_stats(outputs.detach().float(), y)
                                names = sorted(local_stats)
                                minutes_due = main and bool(ccfg.every_minutes) and time.monotonic() - last_save >= ccfg.every_minutes * 60
                                sums = distributed.reduce_batch([loss_value * len(rows), float(len(rows)), *(float(local_stats[k]) for k in names),
                                                                 *distributed.signal_slots(stop.signum), float(minutes_due)])
                                loss_total, loss_value = sums[0], sums[0] / sums[1]
                                stats = dict(zip(names, sums[2 : 2 + len(names)]))
                                agreed_signum = distributed.agreed_signal(sums[2 + len(names) : 4 + len(names)])
                                agreed_minutes = sums[-1] > 0
                            if not math.isfinite(loss_value):
                                nonfinite("loss", loss_value)
                                continue  # skip_batch
                            if ranks is not None and len(rows) * world_size != batch_rows:
                                # DDP averages the ranks' gradients; weigh an unequal share so the result is the global mean
                                loss = loss * (len(rows) * world_size / batch_rows)
                            if len(group) > 1:  # the mean over the accumulated batches; a single batch needs no extra graph node
                                loss = loss / len(group)
                            scaler.scale(loss).backward()
                            stepped = True
                            step_loss += loss_value / len(group)
                            state.loss_sum += loss_total
                            state.seen += batch_rows
                            if stats is None:
                                stats = task.batch_stats(outputs.detach().float(), y)  # float32 (from bf16) for the sums
                            for name, value in stats.items():
                                state.stat_sums[name] = state.stat_sums.get(name, 0.0) + value
                        grad_norm = None
                        if stepped:
                            norm_for_log = log_every and (state.step + 1) % log_every == 0
                            if tcfg.grad_clip or tcfg.check_grad_norm or norm_for_log:
                                scaler.unscale_(optimizer)
                                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip or float("inf")))
                                if tcfg.check_grad_norm and not math.isfinite(grad_norm):
                                    nonfinite("gradient norm", grad_norm)
                                    stepped = False
                        if stepped:
                            scaler.step(optimizer)
                            scaler.update()
                            schedule.step()
                            state.step += 1
                        state.batch_index = group[-1] + 1

                        now = time.perf_counter()
                        logging_step = stepped and log_every and state.step % log_every == 0
                        show = now >= next_progress or state.batch_index == len(starts)  # ≤ 10 bar updates/s
                        if logging_step or show:
                            lr = optimizer.param_groups[0]["lr"]
                            rate = (state.seen - seen_at_start) / max(now - epoch_started, 1e-9)
                        if show:
                            next_progress = now + 0.1
                            progress.update(bar, completed=state.batch_index, loss=f"{step_loss:.4f}", lr=f"{lr:.2e}", rate=f"{rate:,.0f}")
                        if logging_step and main:
                            with open(steps_path, "a", encoding="utf-8") as f:
                                f.write(json.dumps({"step": state.step, "epoch": epoch, "loss": step_loss, "lr": lr,
                                                    "grad_norm": grad_norm, "samples_per_s": round(rate, 1)}) + "\n")
                            if board is not None:
                                board.add_scalar("step/loss", step_loss, state.step)
                                board.add_scalar("step/lr", lr, state.step)
                        if state.batch_index < len(starts):  # the epoch's end saves below
                            # with several ranks, the clock and the signals are rank 0's and any rank's, agreed in the batch's reduction
                            minutes = agreed_minutes if ranks is not None else (
                                ccfg.every_minutes and time.monotonic() - last_save >= ccfg.every_minutes * 60)
                            signum = agreed_signum if ranks is not None else stop.signum
                            if stepped and ccfg.every_steps and state.step % ccfg.every_steps == 0:
                                snapshot = save("step", augment)
                            elif minutes:
                                save("minutes", augment)
                            if signum is not None:
                                save("signal", augment, final=True)
                                raise Interrupted(signum)

                    # ---- end of epoch: validate, log, checkpoint
                    row: dict[str, Any] = {"epoch": epoch, "step": state.step, "train_loss": state.loss_sum / max(1, state.seen)}
                    row.update({f"train_{name}": total / max(1, state.seen) for name, total in state.stat_sums.items()})
                    if has_val and main:
                        val_out, val_y = forward_split(model, task, data, "val", device, cfg.eval.batch_size)
                        row["val_loss"] = float(task.loss(val_out, val_y))
                        row.update({f"val_{name}": total / len(val_y) for name, total in task.batch_stats(val_out, val_y).items()})
                    row["lr"] = optimizer.param_groups[0]["lr"]
                    row["seconds"] = round(time.perf_counter() - epoch_started, 4)
                    epoch_signum = stop.signum
                    if ranks is not None:  # rank 0 validates (its model and statistics are the run's); every rank decides alike
                        row = distributed.broadcast(row)
                        epoch_signum = distributed.agreed_signal(distributed.reduce_batch(distributed.signal_slots(stop.signum)))
                    if best_key not in row:
                        raise RunFailed(f"checkpoint.best_metric: {best_key!r} is not in metrics.jsonl (keys: {', '.join(row)}); pick one of them")
                    value = row[best_key]
                    improved = state.best_value is None or (value > state.best_value if best_mode == "max" else value < state.best_value)
                    if improved:
                        state.best_value, state.best_epoch, state.bad_epochs = value, epoch, 0
                    else:
                        state.bad_epochs += 1
                    state.epochs_done, state.epoch, state.batch_index = epoch, epoch + 1, 0
                    state.loss_sum, state.seen, state.stat_sums = 0.0, 0, {name: 0.0 for name in task.epoch_metrics}
                    if tcfg.early_stopping_patience and state.bad_epochs >= tcfg.early_stopping_patience:
                        state.stopped_early = True
                        events.append({"kind": "early_stop", "step": state.step,
                                       "detail": f"{best_key} did not improve for {state.bad_epochs} epochs (best {state.best_value:.4f} at epoch {state.best_epoch})"})
                    history.append(row)
                    if main:
                        with open(metrics_path, "a", encoding="utf-8") as f:
                            f.write(json.dumps(row) + "\n")
                    if board is not None:
                        for key, value in row.items():
                            if key not in ("epoch", "step"):
                                board.add_scalar(f"epoch/{key}", value, epoch)
                        board.flush()
                    save_now = (ccfg.every_epochs and epoch % ccfg.every_epochs == 0) or epoch == tcfg.epochs or state.stopped_early
                    save_started = time.perf_counter()
                    stops = epoch == tcfg.epochs or state.stopped_early or epoch_signum is not None
                    if save_now or (improved and ccfg.best) or stops:
                        scheduled = save_now or (improved and ccfg.best) or epoch == tcfg.epochs or state.stopped_early
                        snapshot = save("epoch" if scheduled else "signal", None, best=improved and ccfg.best, final=stops)
                    log.info(
                        "epoch %d/%d  %s  lr %.2e  (%.1fs, checkpoint %.2fs%s)",
                        epoch, tcfg.epochs,
                        "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k not in ("epoch", "step", "seconds", "lr")),
                        row["lr"], row["seconds"], time.perf_counter() - save_started, ", best" if improved else "",
                    )
                    if state.stopped_early:
                        log.info("train: early stop, %s", events[-1]["detail"])
                    if epoch_signum is not None:
                        raise Interrupted(epoch_signum)
            except _RolledBack:
                continue
    loop_seconds = time.perf_counter() - loop_started

    if board is not None:
        board.close()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    log.info("train: %d steps in %.1fs, peak memory %.0f MB", state.step, time.perf_counter() - started, peak_mb)
    devices = distributed.gather(str(device), ranks) if ranks is not None else None
    return TrainResult(
        final_state_sha256=state_dict_sha256(model.state_dict()),
        epochs=history,
        best_epoch=state.best_epoch,
        best_value=state.best_value,
        best_metric=(best_key, best_mode),
        steps=state.step,
        device=str(device),
        threads=torch.get_num_threads(),
        peak_memory_mb=round(peak_mb, 1),
        loop_seconds=round(loop_seconds, 4),
        devices=devices,
        backend=ranks.backend if ranks is not None else None,
        trajectory=list(state.trajectory) if main else None,
        other_saves=list(state.other_saves) if main else None,
    )


def _tensorboard(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise RunFailed("logging.tensorboard: the tensorboard package is not installed; `pip install tensorboard` or set logging.tensorboard=false") from None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def _generator_with(seed: int, epoch: int, saved_state: Optional[torch.Tensor], rank: int = 0) -> torch.Generator:
    generator = epoch_generator(seed, epoch, 1, rank)
    if saved_state is not None:
        generator.set_state(saved_state)
    return generator
