"""Image classification: uint8 N×H×W×C images → normalized C×H×W tensors → class logits.

Loss is cross-entropy; per epoch it tracks accuracy, and the final evaluation reports accuracy,
macro-F1 and loss on the chosen split.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from veritrain import models


class ClassificationTask:
    name = "classification"
    epoch_metrics = ("acc",)
    best_metric = ("val_acc", "max")

    def build_model(self, cfg: Any, data: Any) -> torch.nn.Module:
        if not data.classes:
            raise ValueError("classification needs a data source with class labels")
        h, w, c = data.info["input_shape"]
        return models.build(cfg.name, (c, h, w), len(data.classes), cfg.widths, cfg.hidden, cfg.dropout)

    def batch(self, data: Any, rows: np.ndarray, device: torch.device, train: bool, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        stats = data.info["normalization"]
        images = torch.from_numpy(np.ascontiguousarray(data.inputs[rows])).to(device)
        mean = torch.tensor(stats["mean"], dtype=torch.float32, device=device)
        std = torch.tensor(stats["std"], dtype=torch.float32, device=device)
        x = (images.float() / 255.0 - mean) / std  # N×H×W×C, per-channel statistics of the train split
        x = x.permute(0, 3, 1, 2).contiguous()  # → N×C×H×W
        y = torch.from_numpy(np.ascontiguousarray(data.targets[rows])).to(device)
        return x, y

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        return {"acc": float((outputs.argmax(dim=1) == targets).sum())}

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor, data: Any) -> dict[str, Any]:
        n_classes = len(data.classes)
        predicted = outputs.argmax(dim=1).cpu().numpy()
        truth = targets.cpu().numpy()
        confusion = np.zeros((n_classes, n_classes), dtype=np.int64)  # rows: true class, columns: predicted
        np.add.at(confusion, (truth, predicted), 1)
        return {
            "accuracy": float(np.trace(confusion) / max(1, len(truth))),
            "macro_f1": macro_f1(confusion),
            "loss": float(F.cross_entropy(outputs.float(), targets)),
            "samples": int(len(truth)),
        }


def macro_f1(confusion: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over classes present in truth or predictions (scikit-learn's
    `f1_score(average="macro")` with labels from the data; F1 is 0 where precision + recall is 0)."""
    true_pos = np.diag(confusion).astype(np.float64)
    predicted = confusion.sum(axis=0)
    actual = confusion.sum(axis=1)
    present = (predicted + actual) > 0
    denominator = predicted + actual
    f1 = np.divide(2 * true_pos, denominator, out=np.zeros_like(true_pos), where=denominator > 0)
    return float(f1[present].mean()) if present.any() else 0.0
