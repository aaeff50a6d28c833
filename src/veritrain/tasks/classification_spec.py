"""What image classification (veritrain.tasks.classification) declares about its numbers, torch-free: read by shared
code through `veritrain.core.task_registry.task_spec("classification")`."""

from __future__ import annotations

from veritrain.core.task_spec import BaselineRule, MetricSpec, TaskSpec

UNIT = (0.0, 1.0)

SPEC = TaskSpec("classification", metrics=(
    MetricSpec("accuracy", "max", UNIT, epoch_key="val_acc", headline=True),
    MetricSpec("macro_f1", "max", UNIT),
    # val_loss after every epoch is the training criterion (with label smoothing when set), not the log loss: no epoch key
    MetricSpec("log_loss", "min", (0.0, None)),
    MetricSpec("top5_accuracy", "max", UNIT),
    MetricSpec("f1_weighted", "max", UNIT),
    MetricSpec("ece", "min", UNIT),
), baseline=BaselineRule("accuracy", "logistic_regression"))
