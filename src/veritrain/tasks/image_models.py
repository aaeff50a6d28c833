"""The config section of the built-in image models (`cnn`, `mlp`, `resnet18` of veritrain.models), torch-free: the
`model` section of image classification and of every task that declares none (TaskSpec.model_section)."""

from __future__ import annotations

from pydantic import Field

from veritrain.core.config import ModelConfig, Width


class ImageModelConfig(ModelConfig):
    name: str = Field(
        "cnn", description="`cnn`: blocks of Conv3×3 (no bias) → BatchNorm → ReLU → MaxPool(2), global average pooling, linear head; "
        "`mlp`: fully connected layers on flattened inputs; `resnet18`: ResNet-18, CIFAR variant (3×3 stem, no max-pool); "
        "the models a task declares (TaskSpec.models; its first when the config names none). Ignored when `target` is set"
    )
    widths: list[Width] = Field([32, 64, 128], min_length=1, description="cnn: output channels of each conv block, one entry per block")
    hidden: list[Width] = Field([256], description="mlp: widths of the hidden layers (empty list: a linear model)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout probability before the output layer")
