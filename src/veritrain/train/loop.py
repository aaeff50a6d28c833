"""The training stage, with the loop written out.

Seeds python, numpy and torch, uses only deterministic kernels, and draws each epoch's data order
from a generator seeded by (seed, epoch), so the same config and seed on the same machine give the
same weights bit for bit. Validation runs after every epoch; `checkpoints/last.pt` is saved every
epoch and `checkpoints/best.pt` whenever the task's best metric improves.

    veritrain run --set train.epochs=5      # prepare → train → evaluate, recorded in runs/<id>/
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from veritrain.errors import RunFailed
from veritrain.evaluate import forward_split
from veritrain.hashing import state_dict_sha256
from veritrain.signals import StopFlag
from veritrain.train import checkpoint

log = logging.getLogger("veritrain")


@dataclass
class TrainResult:
    final_state_sha256: str
    epochs: list[dict[str, Any]]  # the rows of metrics.jsonl
    best_epoch: int
    best_value: Optional[float]
    steps: int
    seconds: float
    device: str
    threads: int
    extra: dict[str, Any] = field(default_factory=dict)


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


def epoch_generator(seed: int, epoch: int, stream: int) -> torch.Generator:
    """A generator for one epoch and purpose (0: data order, 1: augmentation), independent of how
    many random numbers earlier epochs drew."""
    state = np.random.SeedSequence([seed % 2**63, epoch, stream]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def build_optimizer(cfg: Any, model: torch.nn.Module) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov and cfg.momentum > 0
        )
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.momentum, 0.999), weight_decay=cfg.weight_decay)


def build_schedule(cfg: Any, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per optimizer step: linear warmup over `warmup_steps`, then cosine to 0 or constant."""
    warmup = cfg.warmup_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.name == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def batch_starts(n: int, batch_size: int) -> list[int]:
    """Start offsets of the batches of one epoch. A last batch of a single sample is dropped:
    BatchNorm cannot normalise one sample, and a one-sample step would be noise anyway."""
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return starts


def run(cfg: Any, data: Any, task: Any, run_dir: Path, stop: StopFlag, console: Optional[Console] = None) -> TrainResult:
    """Stage entry: train `cfg.model` on `data` for `cfg.train.epochs`; writes metrics.jsonl and checkpoints/."""
    started = time.perf_counter()
    tcfg = cfg.train
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    seed_everything(cfg.seed, tcfg.deterministic)
    device = resolve_device(tcfg.device)

    model = task.build_model(cfg.model, data).to(device)
    optimizer = build_optimizer(cfg.optim, model)
    train_rows = data.splits["train"]
    starts = batch_starts(len(train_rows), tcfg.batch_size)
    total_steps = len(starts) * tcfg.epochs
    schedule = build_schedule(cfg.schedule, optimizer, total_steps)
    best_key, best_mode = task.best_metric
    has_val = len(data.splits["val"]) > 0
    if not has_val:
        best_key = "train_" + best_key.removeprefix("val_")
        log.warning("train: the val split is empty; best.pt follows %s on the train split", best_key)

    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "train: %s (%s parameters) on %s, %d threads, %d samples, %d steps/epoch × %d epochs",
        cfg.model.name, f"{n_params:,}", device, torch.get_num_threads(), len(train_rows), len(starts), tcfg.epochs,
    )
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    metrics_path = run_dir / "metrics.jsonl"
    history: list[dict[str, Any]] = []
    best_value: Optional[float] = None
    best_epoch = 0
    step = 0

    progress = Progress(
        TextColumn("[bold]epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  {task.fields[rate]} samples/s"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        bar = progress.add_task("train", total=len(starts), epoch="", loss="-", rate="-")
        for epoch in range(1, tcfg.epochs + 1):
            epoch_started = time.perf_counter()
            order = train_rows[torch.randperm(len(train_rows), generator=epoch_generator(cfg.seed, epoch, 0)).numpy()]
            augment_generator = epoch_generator(cfg.seed, epoch, 1)
            with stop.deferred():  # a signal takes effect at the next step boundary, never mid-save
                progress.reset(bar, total=len(starts), epoch=f"{epoch}/{tcfg.epochs}", loss="-", rate="-")
                model.train()
                loss_sum, seen = 0.0, 0
                stat_sums = {name: 0.0 for name in task.epoch_metrics}
                for start in starts:
                    rows = order[start : start + tcfg.batch_size]
                    x, y = task.batch(data, rows, device, True, augment_generator)
                    outputs = model(x)
                    loss = task.loss(outputs, y)
                    loss_value = loss.detach().item()
                    if not math.isfinite(loss_value):
                        raise RunFailed(
                            f"train: loss became {loss_value} at step {step + 1} (epoch {epoch}); lower optim.lr or check the data"
                        )
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    schedule.step()
                    step += 1

                    loss_sum += loss_value * len(rows)
                    seen += len(rows)
                    for name, value in task.batch_stats(outputs.detach(), y).items():
                        stat_sums[name] += value
                    elapsed = time.perf_counter() - epoch_started
                    progress.update(bar, advance=1, loss=f"{loss_value:.4f}", rate=f"{seen / max(elapsed, 1e-9):,.0f}")
                    stop.check()

                row: dict[str, Any] = {"epoch": epoch, "step": step, "train_loss": loss_sum / seen}
                row.update({f"train_{name}": total / seen for name, total in stat_sums.items()})
                if has_val:
                    val_out, val_y = forward_split(model, task, data, "val", device, cfg.eval.batch_size)
                    row["val_loss"] = float(task.loss(val_out, val_y))
                    row.update({f"val_{name}": total / len(val_y) for name, total in task.batch_stats(val_out, val_y).items()})
                row["lr"] = optimizer.param_groups[0]["lr"]
                row["seconds"] = round(time.perf_counter() - epoch_started, 4)
                history.append(row)
                with open(metrics_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")

                value = row[best_key]
                improved = best_value is None or (value > best_value if best_mode == "max" else value < best_value)
                state = _checkpoint_state(cfg, data, model, optimizer, schedule, epoch, step, best_value if not improved else value)
                save_started = time.perf_counter()
                checkpoint.save(state, run_dir / "checkpoints" / "last.pt")
                if improved:
                    best_value, best_epoch = value, epoch
                    checkpoint.save(state, run_dir / "checkpoints" / "best.pt")
                log.info(
                    "epoch %d/%d  %s  (%.1fs, checkpoint %.2fs%s)",
                    epoch, tcfg.epochs,
                    "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k not in ("epoch", "step", "seconds", "lr")) + f"  lr {row['lr']:.2e}",
                    row["seconds"], time.perf_counter() - save_started, ", best" if improved else "",
                )
                stop.check()

    return TrainResult(
        final_state_sha256=state_dict_sha256(model.state_dict()),
        epochs=history,
        best_epoch=best_epoch,
        best_value=best_value,
        steps=step,
        seconds=time.perf_counter() - started,
        device=str(device),
        threads=torch.get_num_threads(),
    )


def rng_state() -> dict[str, Any]:
    """Global RNG states in types `torch.load(weights_only=True)` accepts (dropout draws from torch's)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _checkpoint_state(cfg: Any, data: Any, model: torch.nn.Module, optimizer: Any, schedule: Any, epoch: int, step: int, best: Optional[float]) -> dict[str, Any]:
    from veritrain.config import config_hash

    return {
        "format_version": checkpoint.FORMAT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "epoch": epoch,
        "global_step": step,
        "best_metric": best,
        "rng": rng_state(),
        "config_hash": config_hash(cfg),
        "data_version": data.version,
    }
