"""Built-in networks, written with plain torch (no torchvision).

`cnn`: blocks of Conv3×3 (no bias) → BatchNorm → ReLU → MaxPool(2), then global average pooling and
a linear head. `mlp`: flatten → (Linear → ReLU)* → Linear.
"""

from __future__ import annotations

from typing import Sequence

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


def build(name: str, input_shape: Sequence[int], num_outputs: int, widths: Sequence[int], hidden: Sequence[int], dropout: float) -> nn.Module:
    """`input_shape` is one sample's tensor shape as the model receives it: C×H×W for images."""
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
