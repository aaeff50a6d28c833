"""What image classification (veritrain.tasks.classification) declares about its numbers, torch-free: read by shared
code through `veritrain.core.task_registry.task_spec("classification")`."""

from __future__ import annotations

from veritrain.core.task_spec import BaselineRule, CardText, MetricSpec, TaskSpec
from veritrain.tasks.image_models import ImageModelConfig

UNIT = (0.0, 1.0)
MACRO = (("average", "macro"),)

SPEC = TaskSpec("classification", metrics=(
    MetricSpec("accuracy", "max", UNIT, epoch_key="val_acc", headline=True),
    # written f1_macro as well by an earlier veritrain's evaluation, and only so by its baselines
    MetricSpec("macro_f1", "max", UNIT, label="macro F1", aliases=("f1_macro",), hub_type="f1", hub_args=MACRO),
    # val_loss after every epoch is the training criterion (with label smoothing when set), not the log loss: no epoch key
    MetricSpec("log_loss", "min", (0.0, None), label="log loss (nats per sample)"),
    MetricSpec("top5_accuracy", "max", UNIT, label="top-5 accuracy", hub_type="top_5_accuracy"),
    MetricSpec("f1_weighted", "max", UNIT, label="weighted F1", hub_type="f1", hub_args=(("average", "weighted"),)),
    MetricSpec("precision_macro", "max", UNIT, label="macro precision", hub_type="precision", hub_args=MACRO),
    MetricSpec("recall_macro", "max", UNIT, label="macro recall", hub_type="recall", hub_args=MACRO),
    MetricSpec("ece", "min", UNIT, label="expected calibration error"),
), baseline=BaselineRule("accuracy", "logistic_regression"),
    fields=("image", "label"), models=("cnn", "mlp", "resnet18"), model_section=ImageModelConfig,
    model_settings=(("cnn", ("model.widths", "model.dropout")), ("mlp", ("model.hidden", "model.dropout")), ("resnet18", ("model.dropout",))),
    settings=("augment", "train.label_smoothing", "eval.baseline_max_samples", "eval.baseline_max_iter"), serves_with="predict", bad_cases="bad_cases.csv",
    card=CardText("An image classifier", "it takes float32 input{input} (`model.json` says how an image becomes it) and gives logits{classes}",
                  "image-classification", "Image Classification"))
