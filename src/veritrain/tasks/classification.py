"""Image classification: uint8 N×H×W×C images → normalized C×H×W tensors → class logits.

Augmentation works on whole batches with tensor ops (random crop after zero padding, horizontal
flip, mixup/cutmix), drawing from the epoch's augmentation generator, so it replays exactly on
resume. Loss is cross-entropy (with optional label smoothing); per epoch it tracks accuracy, and the
final evaluation reports accuracy, macro-F1 and loss.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, cast

import numpy as np
import torch
import torch.nn.functional as F

from veritrain import models
from veritrain.core.task_spec import TaskSpec
from veritrain.tasks import ExportSpec, classification_eval, classification_eval as ce, sample_rows, sample_slice, sample_split
from veritrain.tasks.classification_eval import fit_baselines, plot_curves, report_markdown
from veritrain.tasks.classification_spec import SPEC
from veritrain.tasks.evaluation import Evaluator, OutputsEvaluator, validate_with_criterion
from veritrain.tasks.image_models import ImageModelConfig

if TYPE_CHECKING:
    from pathlib import Path

    from veritrain.core.config import RunConfig
    from veritrain.data.identity import DataVersion

# For training, a data version up to this size as float32 is decoded once and kept in memory
# (CIFAR-10: 0.7 GiB); a larger one, and every other use, converts batch by batch from the
# memory-mapped uint8 array. A batch holds the same values either way: the choice never changes a result.
DECODED_CACHE_BYTES = 1 << 30
DECODE_CHUNK_ROWS = 4096  # rows converted at a time while decoding, to bound the temporaries


def class_probabilities(outputs: torch.Tensor) -> np.ndarray:
    """N×K logits → N×K float64 class probabilities. torch's softmax subtracts each row's largest logit
    before exponentiating, so finite logits of any size (1e30 apart) give probabilities in [0, 1] that
    sum to 1; non-finite outputs are refused before this (veritrain.tasks.evaluation.stream). The formula is the
    one every recorded run was evaluated with, so re-evaluations and reproductions stay bit-identical."""
    return torch.softmax(outputs.double(), dim=1).numpy()


def _standard_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def mean_loss(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean cross-entropy of N×K logits, each sample's in float64 (row by row, whatever the thread count) and their
    sum exactly rounded (`math.fsum`), so the figure does not depend on threads or the order of summation. Logits
    more than float32's range apart (a diverging model) give a large number, not inf."""
    per_sample = F.cross_entropy(outputs.double(), targets, reduction="none")
    return math.fsum(per_sample.tolist()) / max(1, len(per_sample))


class ClassificationTask:
    name: str = "classification"
    spec: TaskSpec = SPEC  # what it declares about its metrics (tasks/classification_spec.py, torch-free)
    epoch_metrics: tuple[str, ...] = ("acc",)
    best_metric: tuple[str, str] = ("val_acc", "max")

    def __init__(self, cfg: RunConfig):
        self.augment = cfg.augment
        self.label_smoothing = cfg.train.label_smoothing
        # normalizing before augmenting gives the same values when augmentation only moves pixels
        # (flip, cutmix); zero padding and mixup work on the [0, 1] scale, so they come first
        self._normalize_first = not self.augment.crop_padding and not self.augment.mixup_alpha
        aug = self.augment
        self._augments = bool(aug.resized_crop or aug.crop_padding or aug.hflip or aug.mixup_alpha > 0 or aug.cutmix_alpha > 0)
        self._version: Any = None  # the data version the tensors below belong to
        self._mean = self._std = torch.empty(0)
        self._images: Any = None  # decoded N×C×H×W float32 (normalized when _normalize_first), or None
        self._targets: Any = None

    def build_model(self, cfg: ImageModelConfig, data: DataVersion) -> torch.nn.Module:
        if not data.classes:
            raise ValueError("classification needs a data source with class labels")
        h, w, c = data.info["input_shape"]
        if cfg.target:
            return models.from_target(cfg.target, (c, h, w), len(data.classes), cfg.kwargs)
        return models.build(cfg.name, (c, h, w), len(data.classes), cfg.widths, cfg.hidden, cfg.dropout)

    def prepare(self, data: DataVersion) -> None:
        """Before many passes over `data` (training): keep its decoded copy in memory when it is small enough."""
        self._load(data, decode=True)

    def batch(self, data: DataVersion, rows: np.ndarray, device: torch.device, train: bool,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self._version != data.version:
            self._load(data, decode=False)
        if self._images is not None:
            index = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            # index_select: the same rows as `images[index]` at half the cost per call (the advanced
            # indexing path is general), which counts for small models that take many steps
            x, y = self._images.index_select(0, index), self._targets.index_select(0, index)
        else:
            x = self._decode(data.inputs[rows])
            y = torch.from_numpy(np.ascontiguousarray(data.targets[rows]))
            if self._normalize_first:
                x = self._normalize(x)
        if train and self._augments:
            x, y = self._augment(x, y, len(cast(list[str], data.classes)), generator)  # build_model refused data without classes
        if not self._normalize_first:
            x = self._normalize(x)
        x = x.contiguous()
        if x.stride() != _standard_strides(x.shape):
            # one channel: the decoded N×1×H×W view counts as contiguous with a channel stride of 1, which the conv
            # kernels take for channels-last and round differently; the kept decoded copy has standard strides, so a
            # batch decoded afresh (`veritrain eval` in a new process) gets them too and gives the same outputs
            x = x.clone(memory_format=torch.contiguous_format)
        if device.type == "cpu":  # already there: spare the two no-op calls every step
            return x, y
        return x.to(device), y.to(device)

    def _load(self, data: DataVersion, decode: bool) -> None:
        """Normalization tensors for this data version, and with `decode` its decoded copy when it is small enough."""
        stats = data.info["normalization"]  # per-channel statistics of the train split
        self._mean = torch.tensor(stats["mean"], dtype=torch.float32).view(1, -1, 1, 1)
        self._std = torch.tensor(stats["std"], dtype=torch.float32).view(1, -1, 1, 1)
        self._images = self._targets = None
        n, h, w, c = data.inputs.shape
        if decode and n * h * w * c * 4 <= DECODED_CACHE_BYTES:
            images = torch.empty((n, c, h, w), dtype=torch.float32)
            for start in range(0, n, DECODE_CHUNK_ROWS):
                chunk = self._decode(np.array(data.inputs[start : start + DECODE_CHUNK_ROWS]))  # a writable copy of the mapped rows
                images[start : start + len(chunk)] = self._normalize(chunk) if self._normalize_first else chunk
            self._images, self._targets = images, torch.from_numpy(np.array(data.targets))
        self._version = data.version

    @staticmethod
    def _decode(images: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(images)).float().permute(0, 3, 1, 2) / 255.0  # N×C×H×W in [0, 1]

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self._mean) / self._std

    def _augment(self, x: torch.Tensor, y: torch.Tensor, n_classes: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        aug = self.augment
        n, _, h, w = x.shape
        if aug.resized_crop:
            x = _resized_crop(x, aug.resized_crop, generator)
        if aug.crop_padding:
            p = aug.crop_padding
            padded = F.pad(x, (p, p, p, p))  # zeros: black borders, as in the usual CIFAR recipe
            dy = torch.randint(0, 2 * p + 1, (n,), generator=generator)
            dx = torch.randint(0, 2 * p + 1, (n,), generator=generator)
            rows = (dy[:, None] + torch.arange(h))[:, None, :, None]  # N×1×H×1
            cols = (dx[:, None] + torch.arange(w))[:, None, None, :]  # N×1×1×W
            x = padded[torch.arange(n)[:, None, None, None], torch.arange(x.shape[1])[None, :, None, None], rows, cols]
        if aug.hflip:
            flip = torch.rand(n, generator=generator) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
        mixers = [m for m, alpha in (("mixup", aug.mixup_alpha), ("cutmix", aug.cutmix_alpha)) if alpha > 0]
        if mixers:
            choice = mixers[int(torch.randint(0, len(mixers), (1,), generator=generator))]
            alpha = aug.mixup_alpha if choice == "mixup" else aug.cutmix_alpha
            # Beta(α, α) from two Gamma draws, so the generator (not numpy's global RNG) decides
            # (torch._standard_gamma is the one Gamma sampler that takes a generator; torch does not export it)
            g1 = torch._standard_gamma(torch.full((1,), alpha), generator=generator)  # pyright: ignore[reportPrivateImportUsage]
            g2 = torch._standard_gamma(torch.full((1,), alpha), generator=generator)  # pyright: ignore[reportPrivateImportUsage]
            lam = float(g1 / (g1 + g2))
            partner = torch.randperm(n, generator=generator)
            soft = F.one_hot(y, n_classes).float()
            if choice == "mixup":
                x = lam * x + (1 - lam) * x[partner]
            else:
                cut_h, cut_w = int(h * (1 - lam) ** 0.5), int(w * (1 - lam) ** 0.5)
                cy = int(torch.randint(0, h, (1,), generator=generator))
                cx = int(torch.randint(0, w, (1,), generator=generator))
                y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
                x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
                x = x.clone()
                x[:, :, y0:y1, x0:x1] = x[partner][:, :, y0:y1, x0:x1]
                lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)  # the share of the image that kept its label
            y = lam * soft + (1 - lam) * soft[partner]  # soft targets: N×classes
        return x, y

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets, label_smoothing=self.label_smoothing)

    def show_rows(self, data: DataVersion, rows: np.ndarray) -> tuple[str, dict[str, list[Any]]]:
        return sample_rows(data, rows)

    def rows(self, data: DataVersion, split: str) -> np.ndarray:
        return sample_split(data, split)

    def smoke_slice(self, data: DataVersion, counts: dict[str, int]) -> DataVersion:
        return sample_slice(data, counts)

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        hard = targets.argmax(dim=1) if targets.dim() == 2 else targets  # mixed batches: the dominant label
        return {"acc": float((outputs.argmax(dim=1) == hard).sum())}

    def validation_metrics(self, model: torch.nn.Module, data: DataVersion, device: torch.device, batch_size: int) -> dict[str, float]:
        return validate_with_criterion(self, model, data, device, batch_size)

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor, data: DataVersion) -> dict[str, Any]:
        """Every metric of a split's outputs (classification_eval.compute) and the mean loss without smoothing."""

        probabilities = class_probabilities(outputs)
        metrics = classification_eval.compute(probabilities, targets.cpu().numpy(), cast(list[str], data.classes))
        metrics["loss"] = mean_loss(outputs, targets)
        return metrics

    # ---- evaluation, baselines, export

    def evaluator(self, model: torch.nn.Module, data: DataVersion, split: str, cfg: RunConfig) -> Evaluator:
        return ClassificationEvaluation(self, data, split, cfg)

    def export_spec(self, cfg: RunConfig, model: torch.nn.Module, data: DataVersion, example: torch.Tensor) -> ExportSpec:
        """A float32 image batch in, logits out (the defaults), and how an image file becomes the input."""
        return ExportSpec(example, preprocessing=self.export_preprocessing(data))

    def export_preprocessing(self, data: DataVersion) -> dict[str, Any]:
        """How `veritrain predict` (or anyone with model.json) turns an image file into the model's input."""
        h, w, c = data.info["input_shape"]
        return {
            "layout": "NCHW",
            "decode": "Pillow, converted to mode " + ("L" if c == 1 else "RGB"),
            "resize": {"size": [h, w], "filter": "bilinear", "when": "the image is not already this size"},
            "scale": "x / 255",
            "mean": data.info["normalization"]["mean"],
            "std": data.info["normalization"]["std"],
            "order": "decode → resize → scale → (x - mean) / std → HWC to CHW",
            "output": "logits: unnormalized class scores; softmax gives probabilities",
        }

    def baselines(self, data: DataVersion, cfg: RunConfig) -> dict[str, Any]:
        """Majority class and logistic regression on the same splits (see classification_eval)."""

        return fit_baselines(data, cfg.eval.split, cfg.seed, cfg.eval.baseline_max_samples, cfg.eval.baseline_max_iter)

    def plot_curves(self, path: Path, history: list[dict[str, Any]]) -> None:
        plot_curves(path, history)

    def write_report(self, path: Path, metrics: dict[str, Any], baselines: Optional[dict[str, Any]], run_id: str) -> None:
        path.write_text(report_markdown(metrics, baselines, run_id), encoding="utf-8")


class ClassificationEvaluation(OutputsEvaluator):
    """Keeps a split's outputs (the metrics rank and calibrate over all of them), then writes predictions.csv,
    per_class.csv, the confusion matrices and the bad cases."""

    def __init__(self, task: ClassificationTask, data: DataVersion, split: str, cfg: RunConfig) -> None:
        super().__init__(lambda outputs, targets: task.metrics(outputs, targets, data))
        self.data, self.split, self.cfg = data, split, cfg

    def write(self, out_dir: Path, metrics: dict[str, Any]) -> None:
        outputs, targets = self.gathered()
        data = self.data
        rows = data.splits[self.split]
        classes = cast(list[str], data.classes)  # build_model refused data without classes
        sample_ids = [data.sample_ids[r] for r in rows]
        probabilities = class_probabilities(outputs)
        labels = targets.cpu().numpy()
        ce.write_predictions(out_dir / "predictions.csv", sample_ids, labels, probabilities, classes)
        ce.write_per_class(out_dir / "per_class.csv", metrics["per_class"])
        predicted = probabilities.argmax(axis=1)
        ce.plot_confusion(out_dir / "confusion_matrix.png", labels, predicted, classes, normalized=False)
        ce.plot_confusion(out_dir / "confusion_matrix_normalized.png", labels, predicted, classes, normalized=True)
        cases = ce.bad_cases(sample_ids, labels, probabilities, classes, self.cfg.eval.bad_cases)
        ce.write_bad_cases_csv(out_dir / "bad_cases.csv", cases)
        images = np.asarray(data.inputs[rows]) if data.inputs.dtype == np.uint8 and data.inputs.ndim == 4 else None
        ce.plot_bad_cases(out_dir / "bad_cases.png", cases, images)


def _resized_crop(x: torch.Tensor, area: tuple[float, float], generator: torch.Generator) -> torch.Tensor:
    """Each image's random box (a fraction of its area drawn from `area`, an aspect ratio from 3/4 to 4/3 on a log scale,
    a place inside the image) resized back to the image's size, bilinear: one affine sampling grid for the whole batch."""
    n = x.shape[0]
    fraction = torch.empty(n).uniform_(area[0], area[1], generator=generator)
    ratio = torch.exp(torch.empty(n).uniform_(math.log(3 / 4), math.log(4 / 3), generator=generator))
    width, height = (fraction * ratio).sqrt().clamp(max=1.0), (fraction / ratio).sqrt().clamp(max=1.0)  # of the image's sides
    left, top = torch.rand(n, generator=generator) * (1 - width), torch.rand(n, generator=generator) * (1 - height)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = width, 2 * left + width - 1  # output [-1, 1] → the box's span of the input
    theta[:, 1, 1], theta[:, 1, 2] = height, 2 * top + height - 1
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
