"""What the training loop shows and logs as it goes: the progress bar (on a terminal), `steps.jsonl` (every
`logging.every_steps` optimizer steps), `metrics.jsonl` (one row per validation: each epoch's end, or every
`eval.every_steps` steps; every row names its `epoch` and `step`) and TensorBoard (`logging.tensorboard`). Only
rank 0 writes files; every rank draws its own (hidden) bar.

Rows after a checkpoint are trained again on resume or rollback, so the files are cut back to its step (`rewind`)
and written again, and a resumed run's files equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from veritrain.core.errors import RunFailed
from veritrain.core.files import write_atomic

if TYPE_CHECKING:
    from veritrain.core.config import RunConfig

METRICS, STEPS = "metrics.jsonl", "steps.jsonl"


class Position(Protocol):
    """Where training is (the earlier loop's LoopState, the recipe's Where)."""

    step: int  # optimizer steps taken
    epoch: int  # the epoch in progress, 1-based
    batch_index: int  # batches (steps, for the recipe) of it done
    seen: int  # samples of it trained


class StepLog:
    """The progress bar, steps.jsonl, metrics.jsonl and TensorBoard of one training run; a context manager
    around the epochs (the bar is shown inside it)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, console: Optional[Console], is_main: bool, batches: int,
                 epochs: Optional[int] = None, unit: str = "epoch"):
        self.every = cfg.logging.every_steps  # optimizer steps between rows of steps.jsonl (0: none)
        self.epochs = epochs or cfg.train.epochs
        self.unit = unit  # what a row of metrics.jsonl stands for: an epoch, or a step validated inside one
        self.batches = batches  # per epoch
        self.is_main = is_main
        self.steps_path, self.metrics_path = run_dir / STEPS, run_dir / METRICS
        self.board = _tensorboard(run_dir) if cfg.logging.tensorboard and is_main else None
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[rate]} samples/s"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=console is None or not console.is_terminal,  # nobody sees a bar in a pipe or file
        )
        self.bar = self.progress.add_task("train", total=batches, epoch="", loss="-", lr="-", rate="-")
        self.next_show = 0.0  # perf_counter time of the next bar update: ≤ 10 updates/s
        self.epoch_started = 0.0
        self.rate_from = 0.0  # perf_counter time the bar's samples/s counts from: the epoch's start or the last row
        self.seen_at_start = 0  # samples trained (as counted where the rate counts from) before it
        self.row_from = time.perf_counter()  # the last row of metrics.jsonl, or this process's start

    def __enter__(self) -> StepLog:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def start_epoch(self, epoch: int, batch_index: int, seen: int) -> None:
        self.epoch_started = self.rate_from = time.perf_counter()
        self.seen_at_start = seen
        self.progress.reset(self.bar, total=self.batches, completed=batch_index, epoch=f"{epoch}/{self.epochs}", loss="-", lr="-", rate="-")

    def epoch_seconds(self) -> float:
        return round(time.perf_counter() - self.epoch_started, 4)

    def row_seconds(self) -> float:
        """Seconds since the last row of metrics.jsonl (or since this process started training)."""
        return round(time.perf_counter() - self.row_from, 4)

    def logs_step(self, step: int) -> bool:
        """Whether optimizer step `step` gets a row in steps.jsonl (with its gradient norm)."""
        return bool(self.every) and step % self.every == 0

    def step(self, state: Position, loss: float, lr: float, grad_norm: Optional[float], stepped: bool) -> None:
        """After an optimizer step (`stepped` False: skipped by train.on_nonfinite): the bar, and its row."""
        now = time.perf_counter()
        logging_step = stepped and self.logs_step(state.step)
        show = now >= self.next_show or state.batch_index == self.batches
        if not (logging_step or show):
            return
        rate = (state.seen - self.seen_at_start) / max(now - self.rate_from, 1e-9)
        if show:
            self.next_show = now + 0.1
            self.progress.update(self.bar, completed=state.batch_index, loss=f"{loss:.4f}", lr=f"{lr:.2e}", rate=f"{rate:,.0f}")
        if logging_step and self.is_main:
            with open(self.steps_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": state.step, "epoch": state.epoch, "loss": loss, "lr": lr,
                                    "grad_norm": grad_norm, "samples_per_s": round(rate, 1)}) + "\n")
            if self.board is not None:
                self.board.add_scalar("step/loss", loss, state.step)
                self.board.add_scalar("step/lr", lr, state.step)
                if grad_norm is not None:
                    self.board.add_scalar("step/grad_norm", grad_norm, state.step)
                self.board.add_scalar("step/samples_per_s", round(rate, 1), state.step)

    def row(self, row: dict[str, Any]) -> None:
        """A validation's row of metrics.jsonl (TensorBoard: `epoch/<key>` by epoch, or `eval/<key>` by step when
        validations fall inside epochs). The samples counted since reset with it."""
        if self.is_main:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        self.row_from = self.rate_from = time.perf_counter()
        self.seen_at_start = 0
        if self.board is not None:
            for key, value in row.items():
                if key not in ("epoch", "step"):
                    self.board.add_scalar(f"{'eval' if self.unit == 'step' else 'epoch'}/{key}", value, row[self.unit])
            self.board.flush()

    def close(self) -> None:
        if self.board is not None:
            self.board.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl so far."""
    path = run_dir / METRICS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def rewind(run_dir: Path, step: int, epochs_done: Optional[int] = None) -> None:
    """Cut metrics.jsonl and steps.jsonl back to a checkpoint's step; the earlier loop's metrics.jsonl (`epochs_done`
    given) back to its epochs."""
    _truncate_jsonl(run_dir / METRICS, (lambda row: row["epoch"] <= epochs_done) if epochs_done is not None else (lambda row: row["step"] <= step))
    _truncate_jsonl(run_dir / STEPS, lambda row: row["step"] <= step)


def clear(run_dir: Path) -> None:
    """Empty metrics.jsonl and steps.jsonl: a run resumed before its first checkpoint starts over."""
    _truncate_jsonl(run_dir / METRICS, lambda row: False)
    _truncate_jsonl(run_dir / STEPS, lambda row: False)


def _truncate_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Rewrite a .jsonl file with only the rows `keep(row)` accepts."""
    if not path.exists():
        return
    rows = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip() and keep(json.loads(line))]
    write_atomic(path, "".join(r + "\n" for r in rows).encode())


def _tensorboard(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise RunFailed("logging.tensorboard: the tensorboard package is not installed; `pip install tensorboard` or set logging.tensorboard=false") from None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))
