"""veritrain's training with its batches built by worker processes, against a hand loop with torch's DataLoader and the
same workers and transforms, on an augmentation-heavy config: 96-px images, a random resized crop and a flip; the cnn.

    .venv/bin/python benchmarks/loader.py [--pairs 5] [--workers 2] [--images 3000]

Both read the same prepared data version (uint8 images in memory-mapped arrays). veritrain augments each batch with
tensor ops in its workers (`train.num_workers`, `augment.resized_crop`, `augment.hflip`); the hand loop augments each
sample in the DataLoader's workers, as a torchvision-style pipeline does (crop the box, resize it with
`F.interpolate`, flip), then trains and validates the same model with the same optimizer. Prints the median ratio of
samples/s over interleaved pairs (veritrain / the hand loop; ≥ 1 is veritrain faster), with the spread.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

AREA = (0.35, 1.0)


def write_images(root: Path, count: int, side: int = 96) -> None:
    """`count` PNGs in 4 class folders: smooth random patterns, seeded."""
    from PIL import Image

    rng = np.random.default_rng(0)
    grid = np.linspace(0, 1, side)
    for i in range(count):
        label = i % 4
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        fx, fy, phase = rng.uniform(1, 6, 3)
        wave = np.sin(2 * np.pi * (fx * grid[None, :] + fy * grid[:, None] * (label + 1) / 2) + phase)
        rgb = np.stack([wave, np.roll(wave, label * 7, axis=0), wave.T], axis=-1)
        pixels = ((rgb * 0.4 + 0.5 + rng.normal(0, 0.05, rgb.shape)) * 255).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:05d}.png")


def hand_loop(data_dir: Path, workers: int, batch_size: int, epochs: int, seed: int) -> float:
    """The hand loop: a Dataset whose samples are augmented one by one in the DataLoader's workers; the loop's seconds."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset

    from veritrain import models

    torch.manual_seed(seed)
    torch.set_num_threads(2)
    from reference_loop import version_arrays

    info = json.loads((data_dir / "version.json").read_text())
    inputs, targets = version_arrays(data_dir, info)
    with open(data_dir / "manifest.csv", newline="", encoding="utf-8") as f:
        ids = [entry["sample_id"] for entry in csv.DictReader(f) if entry["status"] == "ok"]
    row = {sid: i for i, sid in enumerate(ids)}
    split = {s: np.array([row[i] for i in (data_dir / "splits" / f"{s}.txt").read_text().split()]) for s in ("train", "val")}
    mean = torch.tensor(info["normalization"]["mean"]).view(-1, 1, 1)
    std = torch.tensor(info["normalization"]["std"]).view(-1, 1, 1)
    h, w, c = info["input_shape"]

    class Samples(Dataset):
        def __init__(self, rows: np.ndarray, train: bool) -> None:
            self.rows, self.train = rows, train

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            image = torch.from_numpy(np.array(inputs[self.rows[i]])).float().permute(2, 0, 1) / 255.0
            if self.train:
                fraction, ratio = np.random.uniform(*AREA), math.exp(np.random.uniform(math.log(3 / 4), math.log(4 / 3)))
                bw, bh = min(w, max(1, round(w * math.sqrt(fraction * ratio)))), min(h, max(1, round(h * math.sqrt(fraction / ratio))))
                left, top = np.random.randint(0, w - bw + 1), np.random.randint(0, h - bh + 1)
                box = image[:, top : top + bh, left : left + bw]
                image = F.interpolate(box[None], size=(h, w), mode="bilinear", align_corners=False)[0]
                if np.random.rand() < 0.5:
                    image = image.flip(2)
            return (image - mean) / std, int(targets[self.rows[i]])

    model = models.build("cnn", (c, h, w), len(info["classes"]), [32, 64, 128], [], 0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=5e-4)
    train = DataLoader(Samples(split["train"], True), batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    val = DataLoader(Samples(split["val"], False), batch_size=512, num_workers=workers)
    started = time.perf_counter()
    for _ in range(epochs):
        model.train()
        for x, y in train:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val:
                model(x)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--hand", default=None, help=argparse.SUPPRESS)  # internal: run the hand loop on this data version
    args = parser.parse_args()
    if args.hand:
        print(json.dumps({"loop_seconds": hand_loop(Path(args.hand), args.workers, 64, args.epochs, 0)}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_images(root / "images", args.images)
        config = root / "loader.yaml"
        config.write_text(f"data:\n  source: imagefolder\n  root: {root / 'images'}\n  near_duplicates: 'off'\n"
                          "model:\n  name: cnn\n  widths: [32, 64, 128]\n"
                          f"augment:\n  resized_crop: [{AREA[0]}, {AREA[1]}]\n  hflip: true\n"
                          f"train:\n  epochs: {args.epochs}\n  batch_size: 64\n  threads: 2\n  num_workers: {args.workers}\n"
                          "eval:\n  baselines: false\n")
        workspace = root / "ws"
        prepared = subprocess.run([sys.executable, "-m", "veritrain", "data", "prepare", str(config), "--workdir", str(workspace), "--json"],
                                  check=True, capture_output=True, text=True).stdout
        data_dir = Path(json.loads(prepared)["split_files"]["train"]).parent.parent
        ratios = []
        for _ in range(args.pairs):  # interleaved: veritrain, then the hand loop
            done = subprocess.run([sys.executable, "-m", "veritrain", "train", str(config), "--workdir", str(workspace), "--json"],
                                  check=True, capture_output=True, text=True)
            ours = json.loads((Path(json.loads(done.stdout)["run_dir"]) / "record.json").read_text())["training"]["loop_seconds"]
            done = subprocess.run([sys.executable, __file__, "--hand", str(data_dir), "--workers", str(args.workers), "--epochs", str(args.epochs)],
                                  check=True, capture_output=True, text=True)
            theirs = json.loads(done.stdout)["loop_seconds"]
            ratios.append(theirs / ours)
            print(f"  veritrain {ours:.1f}s, the hand loop {theirs:.1f}s", flush=True)
        print(f"{args.workers} workers, 96-px images, resized crop and flip, the cnn: veritrain's samples/s {statistics.median(ratios):.3f}× "
              f"the hand loop's (median of {args.pairs} pairs, {min(ratios):.2f}–{max(ratios):.2f})")


if __name__ == "__main__":
    main()
