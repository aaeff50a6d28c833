"""A tiny training script with veritrain's API, for the tests (tests/test_api.py): 96 rows of data/train.csv,
a two-layer MLP, 6 batches an epoch, a checkpoint every 3 steps.

Options pick what the script does: --own-order (its own shuffling: a `bound` run), --no-inputs (a `logged` run),
--vt-data (96 training rows of veritrain's digits data version instead of the CSV), --bad-config, --nested,
--hashed (the loss depends on hash() of a string, so on PYTHONHASHSEED), --guard POLICY (vt.start's on_nonfinite;
the loss goes through run.guard) with --nan-at STEP (the loss of that step is NaN while the learning rate is above
half the configured one, as a diverging run's would be), --workers N (run.batches builds each batch, with noise from
run.generator(step), in N worker processes). Environment variables (never recorded, so a replay does not see them) plant faults:
TINY_KILL_AT=STEP kills the process (SIGKILL) after that step, TINY_FAIL_AT=STEP raises, TINY_NOISE=1 (or a file
TINY_NOISE in the working directory, which a replay's child, whose environment is built from nothing, sees) changes
the training (an audit or reproduction must then differ), TINY_PAUSE_AT=STEP writes `paused` beside the script and
sleeps there (for a signal to arrive)."""

import argparse
import os
import signal
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import veritrain as vt

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--resume", default=None)
parser.add_argument("--own-order", action="store_true")
parser.add_argument("--no-inputs", action="store_true")
parser.add_argument("--bad-config", action="store_true")
parser.add_argument("--nested", action="store_true")
parser.add_argument("--vt-data", action="store_true")
parser.add_argument("--hashed", action="store_true")  # the training depends on str hashes: PYTHONHASHSEED decides it
parser.add_argument("--guard", default=None)
parser.add_argument("--nan-at", type=int, default=None)
parser.add_argument("--workers", type=int, default=None)
args = parser.parse_args()
config = {"epochs": args.epochs, "lr": args.lr, "seed": args.seed, "own_order": args.own_order}
if args.nan_at is not None:
    config["nan_at"] = args.nan_at
if args.bad_config:
    config["layers"] = {16, 32}  # a set: not recordable
kill_at = int(os.environ.get("TINY_KILL_AT", -1))
fail_at = int(os.environ.get("TINY_FAIL_AT", -1))
pause_at = int(os.environ.get("TINY_PAUSE_AT", -1))

if args.vt_data:
    data = vt.data()  # the built-in digits, validated, split and stored as a data version
    rows = data.splits["train"][:96]
    x = torch.from_numpy(np.asarray(data.inputs[rows], dtype=np.float32).reshape(96, -1)[:, 20:28] / 16)
    y = torch.from_numpy(np.asarray(data.targets[rows]) % 3).long()
    inputs = [data]
else:
    table = np.loadtxt("data/train.csv", delimiter=",", dtype=np.float32)
    x, y = torch.from_numpy(table[:, :8]), torch.from_numpy(table[:, 8]).long()
    inputs = None if args.no_inputs else ["data/train.csv"]

with vt.start(config=config, name="tiny", inputs=inputs, resume=args.resume,
              keep_last=2, audit_every=2, on_nonfinite=args.guard) as run:
    if args.nested:
        vt.start(config=config)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=run.config["lr"], momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    run.resume(model=model, optimizer=optimizer, scheduler=schedule)
    if args.own_order:
        batches = enumerate(torch.randperm(96).reshape(-1, 16).repeat(run.config["epochs"], 1))
    elif args.workers is not None:
        def build(step, rows):  # in a worker process: noise from the step's generator, a function of the step alone
            return x[rows] + 0.05 * torch.randn(len(rows), 8, generator=run.generator(step)), y[rows]
        batches = run.batches(n=len(y), batch_size=16, epochs=run.config["epochs"], build=build, num_workers=args.workers)
    else:
        batches = run.batches(n=len(y), batch_size=16, epochs=run.config["epochs"])
    for step, rows in batches:
        inputs_, targets = rows if isinstance(rows, tuple) else (x[rows], y[rows])
        loss = F.cross_entropy(model(inputs_), targets)
        if args.hashed:
            loss = loss * (1 + hash("veritrain") % 97 / 1000)
        if os.environ.get("TINY_NOISE") or os.path.exists("TINY_NOISE"):
            loss = loss * 1.01
        if step == args.nan_at and optimizer.param_groups[0]["lr"] > run.config["lr"] / 2 * 1.01:
            loss = loss * float("nan")
        if args.guard and not run.guard(loss):
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        run.log(step, loss=loss.item())
        run.checkpoint(step, every=3)
        if step == fail_at:
            raise RuntimeError(f"planted failure at step {step}")
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == pause_at:
            open("paused", "w").close()
            time.sleep(60)
    with torch.no_grad():
        accuracy = (model.eval()(x).argmax(1) == y).float().mean().item()
    run.finish(metrics={"train_accuracy": accuracy})
print(run.id, run.level)
