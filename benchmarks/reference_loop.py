"""A minimal hand-written PyTorch training loop: the yardstick for veritrain's overhead.

Does the same work as `veritrain train` — same prepared arrays, model, optimizer, cosine schedule,
batch size, epochs, batch augmentation, the same per-epoch numbers (train loss and accuracy from the
training batches, validation loss and accuracy) and one checkpoint per epoch — the way a hand-written
loop usually does it, with nothing else: no records, no hashing, no progress bar, no guards. Like
veritrain it decodes the images into memory once before the first epoch (normalized already when
the augmentation only flips) and takes each batch from there.

    .venv/bin/python benchmarks/reference_loop.py DATA_VERSION_DIR CONFIG.yaml OUT_DIR [DEVICE]

DEVICE (default cpu): where the model trains; batches are built on the CPU and moved there, as veritrain's are.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from veritrain import models
from veritrain.core.config import load_config


def version_arrays(data_dir: Path, info: dict) -> tuple[np.ndarray, np.ndarray]:
    """A data version's inputs and targets read as anyone would without veritrain: `inputs.npy` and `targets.npy`
    (data recipe 6 and before), or the shards of its `image` (or `features`) and `label` fields, one after another
    (docs/shards.md), their blocks unchecked."""
    if "fields" not in info:
        return np.load(data_dir / "inputs.npy", mmap_mode="r"), np.load(data_dir / "targets.npy", mmap_mode="r")

    def field(name: str) -> np.ndarray:
        spec = info["fields"][name]
        return np.concatenate([np.fromfile(data_dir / "fields" / e["id"][:2] / e["id"], dtype=spec["dtype"]).reshape(e["rows"], *spec["shape"])
                               for e in spec["shards"]])
    return field("image" if "image" in info["fields"] else "features"), field("label")


def main() -> None:
    data_dir, config_path, out_dir = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    device = torch.device(sys.argv[4] if len(sys.argv) > 4 else "cpu")
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs
    cfg = load_config(config_path).config
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    info = json.loads((data_dir / "version.json").read_text())
    inputs, targets = version_arrays(data_dir, info)
    with open(data_dir / "manifest.csv", newline="", encoding="utf-8") as f:  # the rows of the arrays: the samples whose status is ok
        ids = [entry["sample_id"] for entry in csv.DictReader(f) if entry["status"] == "ok"]
    row = {sid: i for i, sid in enumerate(ids)}
    split = {s: np.array([row[i] for i in (data_dir / "splits" / f"{s}.txt").read_text().split()]) for s in ("train", "val")}
    mean = torch.tensor(info["normalization"]["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(info["normalization"]["std"]).view(1, -1, 1, 1)
    h, w, c = info["input_shape"]
    model = models.build(cfg.model.name, (c, h, w), len(info["classes"]), cfg.model.widths, cfg.model.hidden, cfg.model.dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=(cfg.optim.momentum, 0.999), weight_decay=cfg.optim.weight_decay)
    bs, epochs = cfg.train.batch_size, cfg.train.epochs
    steps = math.ceil(len(split["train"]) / bs) * epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    pad = cfg.augment.crop_padding
    decoded = torch.from_numpy(np.array(inputs)).float().permute(0, 3, 1, 2).contiguous() / 255.0
    if not pad:
        decoded = (decoded - mean) / std
    labels = torch.from_numpy(np.array(targets))

    def batch(rows: np.ndarray, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(rows)
        x = decoded[index]
        if train and pad:
            n = x.shape[0]
            padded = F.pad(x, (pad, pad, pad, pad))
            dy, dx = torch.randint(0, 2 * pad + 1, (n,)), torch.randint(0, 2 * pad + 1, (n,))
            r = (dy[:, None] + torch.arange(h))[:, None, :, None]
            q = (dx[:, None] + torch.arange(w))[:, None, None, :]
            x = padded[torch.arange(n)[:, None, None, None], torch.arange(c)[None, :, None, None], r, q]
        if train and cfg.augment.hflip:
            x = torch.where((torch.rand(x.shape[0]) < 0.5)[:, None, None, None], x.flip(3), x)
        if pad:
            x = (x - mean) / std
        return x.contiguous().to(device), labels[index].to(device)

    loop_started = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        order = split["train"][torch.randperm(len(split["train"])).numpy()]
        train_loss = train_correct = 0.0
        for start in range(0, len(order), bs):
            x, y = batch(order[start : start + bs], True)
            outputs = model(x)
            loss = F.cross_entropy(outputs, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            train_loss += loss.item() * len(y)
            train_correct += int((outputs.argmax(1) == y).sum())
        model.eval()
        with torch.no_grad():
            val_loss = val_correct = 0.0
            for start in range(0, len(split["val"]), cfg.eval.batch_size):
                x, y = batch(split["val"][start : start + cfg.eval.batch_size], False)
                outputs = model(x)
                val_loss += float(F.cross_entropy(outputs, y, reduction="sum"))
                val_correct += int((outputs.argmax(1) == y).sum())
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, out_dir / "checkpoint.pt")
    if device.type == "cuda":
        torch.cuda.synchronize()
    loop_seconds = time.perf_counter() - loop_started
    print(json.dumps({"loop_seconds": loop_seconds, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
