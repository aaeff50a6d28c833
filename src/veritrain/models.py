"""Built-in networks, written with plain torch (no torchvision), and user models.

`cnn`: blocks of Conv3×3 (no bias) → BatchNorm → ReLU → MaxPool(2), then global average pooling and
a linear head. `mlp`: flatten → (Linear → ReLU)* → Linear. `resnet18`: ResNet-18 in its CIFAR form
(3×3 stem with stride 1, no max-pool; four stages of two basic blocks, widths 64–512).
A user model is `model.target: "package.module:factory"`, called with the input shape, the number of
outputs and `model.kwargs`; which file that module comes from is the command's code session (veritrain.records.usercode).
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import torch
from torch import nn

from veritrain.core.errors import UserError
from veritrain.core.secrets import expand_env_values


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
        raise UserError(f"model.target: expected 'package.module:factory', got {target!r}")
    try:  # the command's code session (veritrain.records.usercode) decides where user modules come from
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise UserError(f"model.target: cannot import {target!r} ({err}); put the module beside the config, in the working "
                        "directory, or on PYTHONPATH") from None

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


# ---------------------------------------------------------------- description for export

SUMMARIES = {
    MLP: "mlp: flatten the C×H×W input, then (Linear → ReLU) per hidden width, dropout, and a Linear output layer",
    ConvNet: "cnn: per width a block of Conv3×3 (padding 1, no bias) → BatchNorm → ReLU → MaxPool 2×2 (ceil mode); "
    "then the mean over H and W (global average pooling), dropout and a Linear head",
    ResNet18: "resnet18 in its CIFAR form: stem Conv3×3 (64, stride 1, padding 1, no bias) → BatchNorm → ReLU, no max-pool; "
    "four stages of two basic blocks with 64, 128, 256, 512 channels (the first block of stages 2–4 has stride 2 and a "
    "Conv1×1 (stride 2, no bias) → BatchNorm shortcut, every other shortcut is the identity); a basic block is "
    "relu(BN(Conv3×3(relu(BN(Conv3×3(x))))) + shortcut(x)); then the mean over H and W, dropout and a Linear head",
}


def describe(model: nn.Module) -> dict[str, Any] | None:
    """The inference-time computation of a built-in model as plain operations, each naming the state_dict
    keys it reads, so it can be rebuilt without veritrain (see examples/rebuild_from_export.py); None for a
    user model. Read from the built module itself, so the description cannot drift from the code."""
    if isinstance(model, MLP):
        layers = _ops(model.net, "net.")
    elif isinstance(model, ConvNet):
        layers = [*_ops(model.features, "features."), _GLOBAL_AVG_POOL, *_op(model.dropout, "dropout."), *_op(model.head, "head.")]
    elif isinstance(model, ResNet18):
        layers = [*_ops(model.stem, "stem."), *_ops(model.layers, "layers."), _GLOBAL_AVG_POOL,
                  *_op(model.dropout, "dropout."), *_op(model.head, "head.")]
    else:
        return None
    return {"summary": SUMMARIES[type(model)], "layers": layers, "layer_list": [layer["text"] for layer in layers]}


_GLOBAL_AVG_POOL = {"op": "global_avg_pool", "text": "GlobalAvgPool (mean over H and W: N×C×H×W → N×C)"}


def _ops(sequence: nn.Module, prefix: str) -> list[dict[str, Any]]:
    return [op for name, child in sequence.named_children() for op in _op(child, f"{prefix}{name}.")]


def _op(module: nn.Module, prefix: str) -> list[dict[str, Any]]:
    """One module as a list of operations (empty for the identity); `prefix` is its state_dict key prefix."""
    if isinstance(module, nn.Flatten):
        return [{"op": "flatten", "start_dim": module.start_dim, "text": "Flatten"}]
    if isinstance(module, nn.Linear):
        return [{"op": "linear", "in_features": module.in_features, "out_features": module.out_features,
                 "weight": prefix + "weight", "bias": prefix + "bias" if module.bias is not None else None,
                 "text": f"Linear({module.in_features}→{module.out_features})"}]
    if isinstance(module, nn.Conv2d):
        kernel, stride, padding = list(module.kernel_size), list(module.stride), list(module.padding)
        return [{"op": "conv2d", "in_channels": module.in_channels, "out_channels": module.out_channels,
                 "kernel_size": kernel, "stride": stride, "padding": padding, "dilation": list(module.dilation), "groups": module.groups,
                 "weight": prefix + "weight", "bias": prefix + "bias" if module.bias is not None else None,
                 "text": f"Conv2d({module.in_channels}→{module.out_channels}, {kernel[0]}×{kernel[1]}, stride {stride[0]}, padding {padding[0]}"
                 + (")" if module.bias is not None else ", no bias)")}]
    if isinstance(module, nn.BatchNorm2d):
        # inference: (x - running_mean) / sqrt(running_var + eps) * weight + bias, per channel
        return [{"op": "batch_norm2d", "num_features": module.num_features, "eps": module.eps,
                 "weight": prefix + "weight", "bias": prefix + "bias", "running_mean": prefix + "running_mean",
                 "running_var": prefix + "running_var", "num_batches_tracked": prefix + "num_batches_tracked",
                 "text": f"BatchNorm2d({module.num_features}, eps {module.eps:g})"}]
    if isinstance(module, nn.ReLU):
        return [{"op": "relu", "text": "ReLU"}]
    if isinstance(module, nn.MaxPool2d):
        return [{"op": "max_pool2d", "kernel_size": module.kernel_size, "stride": module.stride, "padding": module.padding,
                 "ceil_mode": module.ceil_mode, "text": f"MaxPool2d({module.kernel_size}, stride {module.stride}"
                 + (", ceil mode)" if module.ceil_mode else ")")}]
    if isinstance(module, nn.Dropout):
        return [{"op": "dropout", "p": module.p, "text": f"Dropout(p={module.p:g}; identity at inference)"}]
    if isinstance(module, nn.Identity):
        return []
    if isinstance(module, nn.Sequential):
        return _ops(module, prefix)
    if isinstance(module, BasicBlock):
        body = [*_op(module.conv1, prefix + "conv1."), *_op(module.bn1, prefix + "bn1."), {"op": "relu", "text": "ReLU"},
                *_op(module.conv2, prefix + "conv2."), *_op(module.bn2, prefix + "bn2.")]
        shortcut = _op(module.shortcut, prefix + "shortcut.")
        conv1 = module.conv1
        return [{"op": "residual", "body": body, "shortcut": shortcut, "after_add": "relu",
                 "text": f"BasicBlock({conv1.in_channels}→{conv1.out_channels}, stride {conv1.stride[0]}, "
                 + ("identity shortcut)" if not shortcut else "Conv1×1+BatchNorm shortcut)")}]
    raise ValueError(f"cannot describe {type(module).__name__} at {prefix!r}")
