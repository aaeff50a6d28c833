"""Built-in networks, written with plain torch (no torchvision), and user models.

`cnn`: blocks of Conv3×3 (no bias) → BatchNorm → ReLU → MaxPool(2), then global average pooling and
a linear head. `mlp`: flatten → (Linear → ReLU)* → Linear. `resnet18`: ResNet-18 in its CIFAR form
(3×3 stem with stride 1, no max-pool; four stages of two basic blocks, widths 64–512).
A user model is `model.target: "package.module:factory"`, called with the input shape, the number of
outputs and `model.kwargs`.
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import torch
from torch import nn


class ConvNet(nn.Module):
    def __init__(self, in_channels: int, widths: Sequence[int], num_outputs: int, dropout: float = 0.0):
        super().__init__()
        blocks: list[nn.Module] = []
        channels = in_channels
        for width in widths:
            blocks += [
                nn.Conv2d(channels, width, kernel_size=3, padding=1, bias=False),  # BatchNorm supplies the bias
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                # ceil_mode keeps a 1×1 map at 1×1, so small images can have more blocks than halvings
                nn.MaxPool2d(2, ceil_mode=True),
            ]
            channels = width
        self.features = nn.Sequential(*blocks)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(channels, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: N×C×H×W
        x = self.features(x)
        x = torch.flatten(x.mean(dim=(2, 3)), 1)  # global average pooling
        return self.head(self.dropout(x))


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: Sequence[int], num_outputs: int, dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        layers += [nn.Dropout(dropout), nn.Linear(width, num_outputs)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18: 3×3 stem, stride 1, no max-pool (small images keep their resolution)."""

    def __init__(self, in_channels: int, num_outputs: int, dropout: float = 0.0):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        layers: list[nn.Module] = []
        channels = 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(channels, width, stride), BasicBlock(width, width, 1)]
            channels = width
        self.layers = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(512, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(self.dropout(torch.flatten(x.mean(dim=(2, 3)), 1)))


def from_target(target: str, input_shape: Sequence[int], num_outputs: int, kwargs: dict[str, Any]) -> nn.Module:
    """Import `package.module:factory` and call it; errors name the target and what went wrong."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"model.target: expected 'package.module:factory', got {target!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"model.target: cannot import {target!r} ({err}); check the module is on PYTHONPATH") from None
    from veritrain.secrets import expand_env_values

    # `${env:NAME}` in kwargs is read now: the record keeps the reference, never the value
    model = factory(input_shape=list(input_shape), num_outputs=num_outputs, **expand_env_values(kwargs))
    if not isinstance(model, nn.Module):
        raise ValueError(f"model.target: {target} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def build(name: str, input_shape: Sequence[int], num_outputs: int, widths: Sequence[int], hidden: Sequence[int], dropout: float) -> nn.Module:
    """`input_shape` is one sample's tensor shape as the model receives it: C×H×W for images."""
    if name == "resnet18":
        if len(input_shape) != 3:
            raise ValueError(f"model.name 'resnet18' needs image inputs (C×H×W), got shape {list(input_shape)}")
        return ResNet18(input_shape[0], num_outputs, dropout)
    if name == "cnn":
        if len(input_shape) != 3:
            raise ValueError(f"model.name 'cnn' needs image inputs (C×H×W), got shape {list(input_shape)}")
        return ConvNet(input_shape[0], widths, num_outputs, dropout)
    if name == "mlp":
        features = 1
        for d in input_shape:
            features *= d
        return MLP(features, hidden, num_outputs, dropout)
    raise ValueError(f"unknown model {name!r}")
