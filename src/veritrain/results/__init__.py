"""The evaluation and export stages: metrics, plots and bad cases of a checkpoint on a split (`evaluate`); the
model in ONNX, TorchScript and safetensors with its parity certificate (`export`)."""
