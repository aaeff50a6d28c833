"""Rebuild an exported built-in model (mlp, cnn, resnet18) from its export folder alone — model.json and
model.safetensors — with torch, safetensors and numpy, no veritrain; run it, and compare its logits with
the ONNX model's (onnxruntime, when installed).

    python examples/rebuild_from_export.py runs/<id>/export
    python examples/rebuild_from_export.py runs/<id>/export --inputs batch.npy --json

`--inputs`: a .npy array N×C×H×W float32, already preprocessed as model.json's `preprocessing` says;
without it, 16 seeded standard-normal samples of the input shape. Prints the largest absolute logit
difference against the ONNX model (`--json`: one JSON object). Exit 1 when the export cannot be rebuilt.
"""

from __future__ import annotations

import hashlib  # standard library: checks model.safetensors is the file model.json describes
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

USAGE = "usage: rebuild_from_export.py EXPORT_DIR [--inputs INPUTS.npy] [--json]"


class Residual(nn.Module):
    """relu(body(x) + shortcut(x)); an empty shortcut is the identity."""

    def __init__(self, body: nn.Module, shortcut: nn.Module):
        super().__init__()
        self.body, self.shortcut = body, shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class GlobalAvgPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # N×C×H×W → N×C
        return x.mean(dim=(2, 3))


class Weights:
    """The safetensors tensors by state_dict key; remembers which were used, so none is left out."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors, self.used = tensors, set()

    def take(self, module: nn.Module, names: dict[str, str | None]) -> nn.Module:
        """Load the tensors named in `names` (module's own name → state_dict key) into `module`, strictly."""
        state = {own: self.tensors[key] for own, key in names.items() if key is not None}
        module.load_state_dict(state, strict=True)
        self.used.update(key for key in names.values() if key is not None)
        return module


def build(layers: list[dict], weights: Weights) -> nn.Sequential:
    """One torch module per operation of model.json's `architecture.layers`, weights loaded by their keys."""
    modules: list[nn.Module] = []
    for op in layers:
        kind = op["op"]
        if kind == "flatten":
            modules.append(nn.Flatten(op["start_dim"]))
        elif kind == "linear":
            layer = nn.Linear(op["in_features"], op["out_features"], bias=op["bias"] is not None)
            modules.append(weights.take(layer, {"weight": op["weight"], "bias": op["bias"]}))
        elif kind == "conv2d":
            layer = nn.Conv2d(op["in_channels"], op["out_channels"], op["kernel_size"], op["stride"], op["padding"],
                              op["dilation"], op["groups"], bias=op["bias"] is not None)
            modules.append(weights.take(layer, {"weight": op["weight"], "bias": op["bias"]}))
        elif kind == "batch_norm2d":
            layer = nn.BatchNorm2d(op["num_features"], eps=op["eps"])
            modules.append(weights.take(layer, {name: op[name] for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}))
        elif kind == "relu":
            modules.append(nn.ReLU())
        elif kind == "max_pool2d":
            modules.append(nn.MaxPool2d(op["kernel_size"], op["stride"], op["padding"], ceil_mode=op["ceil_mode"]))
        elif kind == "global_avg_pool":
            modules.append(GlobalAvgPool())
        elif kind == "dropout":
            modules.append(nn.Dropout(op["p"]))  # identity in eval mode
        elif kind == "residual":
            if op["after_add"] != "relu":
                raise ValueError(f"residual: after_add {op['after_add']!r} is not known here")
            modules.append(Residual(build(op["body"], weights), build(op["shortcut"], weights)))
        else:
            raise ValueError(f"operation {kind!r} is not known here")
    return nn.Sequential(*modules)


def rebuild(export_dir: Path) -> tuple[nn.Module, dict]:
    """The model of `export_dir` in eval mode, and its model.json."""
    description = json.loads((export_dir / "model.json").read_text(encoding="utf-8"))
    layers = (description.get("architecture") or {}).get("layers")
    if not layers:
        raise ValueError("model.json has no architecture.layers: not a built-in model (a model.target model is rebuilt by calling its factory)")
    entry = description["files"].get("safetensors")
    if entry is None:
        raise ValueError("this export has no model.safetensors; export it with --format safetensors")
    path = export_dir / Path(entry["file"]).name
    if hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
        raise ValueError(f"{path.name} is not the file model.json describes (SHA-256 differs)")
    weights = Weights(load_file(str(path)))
    model = build(layers, weights).eval()
    unused = sorted(set(weights.tensors) - weights.used)
    if unused:
        raise ValueError(f"model.json's layers do not use {len(unused)} tensor(s) of {path.name}, e.g. {unused[0]}")
    return model, description


def onnx_logits(path: Path, inputs: np.ndarray) -> np.ndarray | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: inputs})[0]


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    inputs_path = None
    if "--inputs" in argv:
        at = argv.index("--inputs")
        if at + 1 >= len(argv):
            print(USAGE, file=sys.stderr)
            return 2
        inputs_path = argv.pop(at + 1)
        argv.pop(at)
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    export_dir = Path(argv[0])
    try:
        model, description = rebuild(export_dir)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {export_dir}: cannot rebuild the model ({err})", file=sys.stderr)
        return 1
    shape = description["input"]["shape"][1:]
    if inputs_path is not None:
        inputs = np.load(inputs_path).astype(np.float32)
    else:
        inputs = np.random.default_rng(0).standard_normal((16, *shape)).astype(np.float32)
    with torch.no_grad():
        logits = model(torch.from_numpy(inputs)).numpy()
    result = {"model": description["architecture"]["name"], "samples": int(len(inputs)), "tensors": len(model.state_dict()),
              "predictions": [description["classes"][i] for i in logits.argmax(axis=1)], "max_abs_diff": None, "argmax_agreement": None}
    onnx_file = description["files"].get("onnx")
    reference = onnx_logits(export_dir / Path(onnx_file["file"]).name, inputs) if onnx_file else None
    if reference is not None:
        result["max_abs_diff"] = float(np.abs(logits.astype(np.float64) - reference.astype(np.float64)).max())
        result["argmax_agreement"] = float((logits.argmax(axis=1) == reference.argmax(axis=1)).mean())
    if as_json:
        print(json.dumps(result))
    elif reference is None:
        print(f"rebuilt {result['model']}: logits for {result['samples']} samples (no ONNX model or onnxruntime to compare with)")
    else:
        print(f"rebuilt {result['model']}: max |Δlogit| vs ONNX {result['max_abs_diff']:.3g} over {result['samples']} samples, "
              f"argmax agreement {result['argmax_agreement']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
