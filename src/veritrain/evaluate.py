"""The evaluation stage: restore a checkpoint and compute the task's metrics on a fixed split.

Writes `eval/<split>/metrics.json`. Run as part of `veritrain run`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from veritrain.train import checkpoint

log = logging.getLogger("veritrain")


@torch.no_grad()
def forward_split(model: torch.nn.Module, task: Any, data: Any, split: str, device: torch.device, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All outputs and targets of one split in eval mode, in split-file order."""
    model.eval()
    rows = data.splits[split]
    outputs, targets = [], []
    generator = torch.Generator().manual_seed(0)  # unused without augmentation; required by the protocol
    for start in range(0, len(rows), batch_size):
        x, y = task.batch(data, rows[start : start + batch_size], device, False, generator)
        outputs.append(model(x).float().cpu())
        targets.append(y.cpu())
    if not outputs:
        return torch.empty(0), torch.empty(0)
    return torch.cat(outputs), torch.cat(targets)


def run(cfg: Any, data: Any, task: Any, run_dir: Path, device: torch.device, checkpoint_name: str = "best") -> dict[str, Any]:
    """Stage entry: evaluate `checkpoints/<checkpoint_name>.pt` on `cfg.eval.split`; returns the metrics."""
    split = cfg.eval.split
    if len(data.splits[split]) == 0:
        raise ValueError(f"the {split} split is empty; set data.split_ratios so it gets samples")
    ckpt_path = run_dir / "checkpoints" / f"{checkpoint_name}.pt"
    state = checkpoint.load(ckpt_path)
    model = task.build_model(cfg.model, data).to(device)
    model.load_state_dict(state["model"])
    outputs, targets = forward_split(model, task, data, split, device, cfg.eval.batch_size)
    metrics = task.metrics(outputs, targets, data)
    metrics["checkpoint"] = f"checkpoints/{checkpoint_name}.pt"
    metrics["checkpoint_epoch"] = state["loop"]["epochs_done"]
    out_dir = run_dir / "eval" / split
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    log.info(
        "eval: %s split, %s (epoch %d): %s",
        split,
        metrics["checkpoint"],
        state["loop"]["epochs_done"],
        "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)),
    )
    return metrics
