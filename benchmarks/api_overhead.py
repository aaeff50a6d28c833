"""The cost of `veritrain.start` in a hand-written loop: the same loop on CIFAR-shaped data (the `cnn` of
veritrain.models, AdamW, a cosine schedule, batches of 128, 3 epochs, 2 threads), once with veritrain's API
(`run.batches`, `run.log` every step, `run.checkpoint` every epoch: atomic, synced, hashed, in the trajectory) and
once plain (a shuffled index per epoch, the loss kept in a list, `torch.save` of the same state every epoch),
alternately, and the median ratio of their loop times (first batch to the last checkpoint) over the pairs.

    .venv/bin/python benchmarks/api_overhead.py [--repeat 7] [--lightning]

With --lightning, the same model and data in a LightningModule, fitted by a Trainer that saves a checkpoint every
epoch (ModelCheckpoint, every one kept), with veritrain.lightning (its Callback, CheckpointIO, loader and ckpt_path:
a replayable run) and plain (torch's DataLoader, shuffled); the ratio is of the whole `fit` (the run's start and
seal included).

The data (10,000 random 32×32×3 images, 10 classes) is generated once into an .npy file, which the API run binds
as its input (hashed before the loop, outside the timed part); both loops read it into memory before the loop.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EPOCHS, BATCH, THREADS, IMAGES = 3, 128, 2, 10_000


def loop(mode: str, data: Path, out: Path) -> None:
    """One training run in `mode` ("api" or "plain"); prints {"loop_seconds"}."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from veritrain import models

    torch.set_num_threads(THREADS)
    arrays = np.load(data)
    x = torch.from_numpy(arrays["x"]).float().permute(0, 3, 1, 2).contiguous() / 255.0
    y = torch.from_numpy(arrays["y"]).long()
    config = {"seed": 0, "lr": 0.003, "epochs": EPOCHS, "batch_size": BATCH}

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        model = models.build("cnn", (3, 32, 32), 10, [32, 64, 128], [256], 0.0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=5e-4)
        steps = math.ceil(len(y) / BATCH) * EPOCHS
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
        return model, optimizer, schedule

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, schedule: torch.optim.lr_scheduler.LambdaLR, rows: object) -> float:
        loss = F.cross_entropy(model(x[rows]), y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        return loss.item()

    if mode == "api":
        import veritrain as vt

        with vt.start(config=config, name="api-overhead", inputs=[str(data)], workdir=str(out)) as run:
            model, optimizer, schedule = build()
            run.resume(model=model, optimizer=optimizer, scheduler=schedule)
            started = time.perf_counter()
            for index, rows in run.batches(n=len(y), batch_size=BATCH, epochs=EPOCHS):
                run.log(index, loss=step(model, optimizer, schedule, rows))
                run.checkpoint(index, every="epoch")
            seconds = time.perf_counter() - started
    else:
        torch.manual_seed(0)
        torch.use_deterministic_algorithms(True)
        model, optimizer, schedule = build()
        losses = []
        started = time.perf_counter()
        for epoch in range(EPOCHS):
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch)).numpy()
            for start in range(0, len(y), BATCH):
                losses.append(step(model, optimizer, schedule, order[start:start + BATCH]))
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                        "rng": torch.get_rng_state(), "epoch": epoch + 1}, out / f"epoch-{epoch + 1}.pt")
        seconds = time.perf_counter() - started
    print(json.dumps({"loop_seconds": seconds}))


def lightning_loop(mode: str, data: Path, out: Path) -> None:
    """One Lightning fit in `mode` ("lightning-api": with veritrain's Callback and CheckpointIO, or "lightning-plain");
    prints {"loop_seconds"}: the whole fit."""
    import lightning as L
    import numpy as np
    import torch
    import torch.nn.functional as F
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from veritrain import models

    torch.set_num_threads(THREADS)
    arrays = np.load(data)
    x = torch.from_numpy(arrays["x"]).float().permute(0, 3, 1, 2).contiguous() / 255.0
    y = torch.from_numpy(arrays["y"]).long()

    class Module(L.LightningModule):
        def __init__(self, lr: float = 0.003):
            super().__init__()
            self.save_hyperparameters()
            self.net = models.build("cnn", (3, 32, 32), 10, [32, 64, 128], [256], 0.0)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
            loss = F.cross_entropy(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, on_epoch=True, on_step=False)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"], weight_decay=5e-4)

    L.seed_everything(0, verbose=False)
    checkpoints = ModelCheckpoint(dirpath=None if mode == "lightning-api" else str(out / "checkpoints"), every_n_epochs=1, save_top_k=-1)
    extra: dict = {}
    if mode == "lightning-api":
        import veritrain as vt

        extra = {"plugins": [vt.lightning.CheckpointIO()]}
        loader = vt.lightning.loader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
        start_from = vt.lightning.ckpt_path(None)
    else:
        loader, start_from = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True), None
    callbacks = [checkpoints] + ([vt.lightning.Callback(inputs=[str(data)], workdir=str(out))] if mode == "lightning-api" else [])
    trainer = L.Trainer(max_epochs=EPOCHS, deterministic=True, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(out), callbacks=callbacks, **extra)
    started = time.perf_counter()
    trainer.fit(Module(), loader, ckpt_path=start_from)
    print(json.dumps({"loop_seconds": time.perf_counter() - started}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--lightning", action="store_true", help="Lightning with and without veritrain.lightning")
    parser.add_argument("--mode", choices=["api", "plain", "lightning-api", "lightning-plain"], help=argparse.SUPPRESS)  # one run
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        (lightning_loop if args.mode.startswith("lightning") else loop)(args.mode, args.data, args.out)
        return
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "cifar-shaped.npz"
        rng = np.random.default_rng(0)
        np.savez(data, x=rng.integers(0, 256, size=(IMAGES, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, size=IMAGES))
        ratios = []
        for pair in range(args.repeat):  # interleaved A/B, each in a fresh process and folder
            seconds = {}
            for mode in (("lightning-api", "lightning-plain") if args.lightning else ("api", "plain")):
                out = Path(tmp) / f"{mode}-{pair}"
                out.mkdir()
                done = subprocess.run([sys.executable, __file__, "--mode", mode, "--data", str(data), "--out", str(out)],
                                      capture_output=True, text=True, cwd=tmp)
                if done.returncode != 0:
                    sys.exit(f"{mode} exited with {done.returncode}:\n{done.stderr[-3000:]}")
                seconds[mode] = json.loads(done.stdout.strip().splitlines()[-1])["loop_seconds"]
            api, plain = (seconds["lightning-api"], seconds["lightning-plain"]) if args.lightning else (seconds["api"], seconds["plain"])
            ratios.append(api / plain)
            print(f"  pair {pair + 1}: with veritrain {api:.2f}s, plain {plain:.2f}s, {ratios[-1]:.3f}×", flush=True)
        what = "Lightning fit with veritrain / plain" if args.lightning else "api loop / plain loop"
        print(f"{what}: {statistics.median(ratios):.3f}× (median of {args.repeat} pairs, {min(ratios):.3f}–{max(ratios):.3f})")


if __name__ == "__main__":
    main()
