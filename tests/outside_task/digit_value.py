"""A task written outside veritrain, in this one file: the value an 8×8 digit image shows (0 … 9), learned as a number
(regression). Its package names it in the entry-point group `veritrain.tasks` (digit_value = digit_value:DigitValueTask)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from veritrain import models
from veritrain.core.task_spec import BaselineRule, MetricSpec, TaskSpec
from veritrain.tasks import ExportSpec, plain_report, sample_rows, sample_slice, sample_split
from veritrain.tasks.evaluation import OutputsEvaluator, validate_with_criterion

SPEC = TaskSpec("digit_value", metrics=(
    MetricSpec("rmse", "min", (0.0, None), epoch_key="val_rmse", headline=True, label="RMSE (digits)"),
    MetricSpec("mae", "min", (0.0, None), label="MAE (digits)"),
), baseline=BaselineRule("rmse", "train_mean", margin=0.05), fields=("image", "label"), models=("cnn", "mlp"))


def scores(predicted: np.ndarray, values: np.ndarray) -> dict[str, Any]:
    error = np.asarray(predicted, dtype=np.float64) - np.asarray(values, dtype=np.float64)
    return {"rmse": float(np.sqrt(np.mean(error ** 2))), "mae": float(np.mean(np.abs(error))), "samples": int(len(error))}


class DigitValueTask:
    name = "digit_value"
    spec = SPEC
    epoch_metrics: tuple[str, ...] = ()
    best_metric = ("val_rmse", "min")

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def rows(self, data: Any, split: str) -> np.ndarray:
        return sample_split(data, split)

    def prepare(self, data: Any) -> None:
        pass

    def show_rows(self, data: Any, rows: np.ndarray) -> tuple[str, dict[str, list[Any]]]:
        return sample_rows(data, rows)

    def smoke_slice(self, data: Any, counts: dict[str, int]) -> Any:
        return sample_slice(data, counts)

    def build_model(self, cfg: Any, data: Any) -> torch.nn.Module:
        h, w, c = data.info["input_shape"]
        return models.build(cfg.name, (c, h, w), 1, cfg.widths, cfg.hidden, cfg.dropout)

    def batch(self, data: Any, rows: np.ndarray, device: torch.device, train: bool, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        stats = data.info["normalization"]
        images = torch.from_numpy(np.ascontiguousarray(data.inputs[rows])).float().permute(0, 3, 1, 2) / 255.0
        x = (images - torch.tensor(stats["mean"]).view(1, -1, 1, 1)) / torch.tensor(stats["std"]).view(1, -1, 1, 1)
        y = torch.from_numpy(np.asarray(data.targets[rows], dtype=np.float32))
        return x.contiguous().to(device), y.to(device)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(outputs.squeeze(1), targets)

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        return {}

    def validation_metrics(self, model: torch.nn.Module, data: Any, device: torch.device, batch_size: int) -> dict[str, float]:
        row = validate_with_criterion(self, model, data, device, batch_size)  # val_loss: the mean squared error
        return {**row, "val_rmse": float(np.sqrt(row["val_loss"]))}

    def evaluator(self, model: torch.nn.Module, data: Any, split: str, cfg: Any) -> Any:
        return Predictions(data, split)

    def write_report(self, path: Path, metrics: dict[str, Any], baselines: Optional[dict[str, Any]], run_id: str) -> None:
        plain_report(path, metrics, SPEC, run_id)

    def plot_curves(self, path: Path, history: list[dict[str, Any]]) -> None:
        pass

    def baselines(self, data: Any, cfg: Any) -> dict[str, Any]:
        """Every sample predicted as the mean value of the train split."""
        rows = data.splits[cfg.eval.split]
        mean = float(np.mean(np.asarray(data.targets[data.splits["train"]], dtype=np.float64)))
        return {"split": cfg.eval.split, "results": {"train_mean": {**scores(np.full(len(rows), mean), data.targets[rows]), "mean": mean}}}

    def export_spec(self, cfg: Any, model: torch.nn.Module, data: Any, example: torch.Tensor) -> ExportSpec:
        stats = data.info["normalization"]
        preprocessing = {"layout": "NCHW", "scale": "x / 255", "mean": stats["mean"], "std": stats["std"],
                         "output": "the digit's value, a float"}
        return ExportSpec(example, preprocessing=preprocessing, agreement=False)  # one output: no largest one to agree on


class Predictions(OutputsEvaluator):
    """rmse and mae over the split; predictions.csv holds every sample's value and prediction."""

    def __init__(self, data: Any, split: str) -> None:
        super().__init__(lambda outputs, targets: scores(outputs.squeeze(1).double().numpy(), targets.numpy()))
        self.data, self.split = data, split

    def write(self, out_dir: Path, metrics: dict[str, Any]) -> None:
        outputs, targets = self.gathered()
        with open(out_dir / "predictions.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sample_id", "value", "predicted"])
            for row, value, predicted in zip(self.data.splits[self.split], targets.tolist(), outputs.squeeze(1).tolist()):
                writer.writerow([self.data.sample_ids[int(row)], value, repr(predicted)])
