"""A training script under torchrun, for the tests (tests/test_distributed.py): DistributedDataParallel over a small
MLP on data.csv (8 features and a class in 0..2 per row, in the working directory), run.batches giving each rank its
share of 16 rows, a checkpoint every 3 steps, the loss through run.guard when --guard is given.

--nan-at STEP makes that step's loss NaN on rank 1 only while the learning rate is above half the configured one (a
rank whose share diverges); DDP_KILL_AT=STEP (never recorded) kills rank DDP_KILL_RANK (default 1) with SIGKILL after
that step."""

import argparse
import os
import signal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import veritrain as vt

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--resume", default=None)
parser.add_argument("--guard", default=None)
parser.add_argument("--nan-at", type=int, default=None)
args = parser.parse_args()
config = {"epochs": args.epochs, "lr": args.lr, "seed": 0, "nan_at": args.nan_at}
kill_at, kill_rank = int(os.environ.get("DDP_KILL_AT", -1)), int(os.environ.get("DDP_KILL_RANK", 1))
table = np.loadtxt("data.csv", delimiter=",", dtype=np.float32)
x, y = torch.from_numpy(table[:, :8]), torch.from_numpy(table[:, 8]).long()

with vt.start(config=config, name="ddp", inputs=["data.csv"], resume=args.resume, keep_last=2, on_nonfinite=args.guard) as run:
    rank = int(os.environ["RANK"])
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    trainer = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
    run.resume(model=model, optimizer=optimizer)
    loss = torch.tensor(0.0)
    for step, rows in run.batches(n=len(y), batch_size=16, epochs=run.config["epochs"]):
        loss = F.cross_entropy(trainer(x[rows]), y[rows])
        if step == args.nan_at and rank == 1 and optimizer.param_groups[0]["lr"] > run.config["lr"] / 2 * 1.01:
            loss = loss * float("nan")
        if args.guard and not run.guard(loss):
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log(step, loss=loss)
        run.checkpoint(step, every=3)
        if step == kill_at and rank == kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
    run.finish(metrics={"last_loss": float(loss.detach())})
