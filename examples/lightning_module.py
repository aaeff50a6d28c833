"""A LightningModule trained by a Lightning Trainer, recorded by veritrain with the lines marked `# vt`. It trains a
small MLP on scikit-learn's copy of the UCI digits, with a checkpoint every 8 steps.

    pip install 'veritrain[lightning]'
    python examples/lightning_module.py                          # a new run in ./runs/
    python examples/lightning_module.py --ckpt runs/<id>/checkpoints/<file>.ckpt   # continue that run
    veritrain train --resume latest                              # or: continue it with its recorded command and code
    veritrain verify latest && veritrain audit latest && veritrain reproduce latest

The training batches come from vt.lightning.loader and the fit starts from vt.lightning.ckpt_path(...), so the run
is `replayable` (docs/api.md). With --torch-loader (a DataLoader of torch's) it is `bound`: every byte is verified,
and reproduce and audit say why they cannot replay it.
"""

import argparse
from pathlib import Path

import lightning as L
import numpy as np
import sklearn.datasets
import torch
import torch.nn.functional as F
from torch import nn
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import veritrain as vt  # vt

DIGITS = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--ckpt", default=None)
parser.add_argument("--data", default=str(DIGITS))
parser.add_argument("--workdir", default=".")
parser.add_argument("--torch-loader", action="store_true", help="torch's DataLoader for training: a bound run")
args = parser.parse_args()


class Digits(L.LightningModule):
    def __init__(self, lr: float, hidden: int = 64):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 10))

    def training_step(self, batch, batch_index):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False)
        return loss

    def validation_step(self, batch, batch_index):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)]


L.seed_everything(args.seed)
table = np.loadtxt(args.data, delimiter=",", dtype=np.float32)
x, y = torch.from_numpy(table[:, :64] / 16.0), torch.from_numpy(table[:, 64]).long()
test = torch.arange(len(y)) % 5 == 0
train_set = TensorDataset(x[~test], y[~test])
if args.torch_loader:
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
else:
    train_loader = vt.lightning.loader(train_set, batch_size=64, shuffle=True)  # vt
val_loader = DataLoader(TensorDataset(x[test], y[test]), batch_size=256)
trainer = L.Trainer(max_epochs=args.epochs, deterministic=True, logger=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=args.workdir,
                    callbacks=[ModelCheckpoint(every_n_train_steps=8, save_top_k=-1),
                               vt.lightning.Callback(inputs=[args.data], name="lightning-digits", workdir=args.workdir)],  # vt
                    plugins=[vt.lightning.CheckpointIO()])  # vt
trainer.fit(Digits(lr=args.lr), train_loader, val_loader, ckpt_path=vt.lightning.ckpt_path(args.ckpt))  # vt
