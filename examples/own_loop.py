"""A hand-written training loop in nanoGPT's style (argparse config, a plain `for` loop, no framework), made
verifiable with the lines marked `# vt`. It trains a small MLP on scikit-learn's copy of the UCI digits.

    python examples/own_loop.py                  # a new run in ./runs/
    python examples/own_loop.py --resume auto    # continue the newest interrupted run of this script and config
    veritrain verify latest && veritrain audit latest && veritrain reproduce latest
"""

import argparse
from pathlib import Path

import numpy as np
import sklearn.datasets
import torch
import torch.nn.functional as F
from torch import nn

import veritrain as vt  # vt

DIGITS = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"  # 1,797 8×8 images, 64 pixels + label a row

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--checkpoint_every", type=int, default=10)
parser.add_argument("--resume", default=None)  # None, "auto" or a run id
parser.add_argument("--workdir", default=".")
parser.add_argument("--data", default=str(DIGITS))  # the digits table (CSV, gzipped or not)
args = parser.parse_args()
config = {k: v for k, v in vars(args).items() if k not in ("resume", "workdir", "data")}


def load_digits():
    table = np.loadtxt(args.data, delimiter=",", dtype=np.float32)
    x, y = torch.from_numpy(table[:, :64] / 16.0), torch.from_numpy(table[:, 64]).long()
    test = torch.arange(len(y)) % 5 == 0  # a fixed split: every fifth row is test
    return x[~test], y[~test], x[test], y[test]


def build(cfg):
    model = nn.Sequential(nn.Linear(64, cfg["hidden"]), nn.ReLU(), nn.Dropout(0.1), nn.Linear(cfg["hidden"], 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    return model, optimizer


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return accuracy


with vt.start(config=config, name="own-loop", inputs=[args.data], workdir=args.workdir, resume=args.resume) as run:  # vt
    x_train, y_train, x_test, y_test = load_digits()
    model, optimizer = build(run.config)
    steps = -(-len(y_train) // run.config["batch_size"]) * run.config["epochs"]
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    run.resume(model=model, optimizer=optimizer, scheduler=schedule)  # vt
    for step, rows in run.batches(n=len(y_train), batch_size=run.config["batch_size"], epochs=run.config["epochs"]):  # vt
        loss = F.cross_entropy(model(x_train[rows]), y_train[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        run.log(step, loss=loss.item(), lr=schedule.get_last_lr()[0])  # vt
        run.checkpoint(step, every=run.config["checkpoint_every"])  # vt
    run.finish(metrics={"test_accuracy": evaluate(model, x_test, y_test)})  # vt
print(run.id, run.level)
