"""The evaluation stage: restore a checkpoint and evaluate it on a fixed split of the run's data
version; writes `eval/<split>/` (metrics.json, the task's files such as predictions.csv, plots,
bad cases, curves.png and report.md).

    veritrain eval latest --checkpoint best --split test
    veritrain eval --predictions runs/<id>/eval/test/predictions.csv
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import sha256_file
from veritrain.tasks import split_rows
from veritrain.train import checkpoint, trajectory

if TYPE_CHECKING:
    from veritrain.core.config import RunConfig
    from veritrain.data.identity import DataVersion
    from veritrain.tasks import Task

log = logging.getLogger("veritrain")


@torch.no_grad()
def forward_split(model: torch.nn.Module, task: Task, data: DataVersion, split: str, device: torch.device, batch_size: int,
                  limit: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All outputs and targets of one split (its first `limit` samples) in eval mode, in split-file order."""
    model.eval()
    rows = split_rows(task, data, split)[:limit]
    outputs, targets = [], []
    generator = torch.Generator().manual_seed(0)  # unused without augmentation; required by the protocol
    for start in range(0, len(rows), batch_size):
        x, y = task.batch(data, rows[start : start + batch_size], device, False, generator)
        outputs.append(model(x).float().cpu())
        targets.append(y.cpu())
    if not outputs:
        return torch.empty(0), torch.empty(0)
    return torch.cat(outputs), torch.cat(targets)


def require_finite(outputs: torch.Tensor, split: str, checkpoint_shown: str) -> None:
    """RunFailed when any sample's outputs hold NaN or inf: no metric of such outputs means anything,
    and the libraries that compute them would fail with a message about their own input instead."""
    if outputs.numel() == 0:
        return
    bad = int((~torch.isfinite(outputs.reshape(len(outputs), -1))).any(dim=1).sum())
    if bad:
        raise RunFailed(f"eval: the model gives non-finite outputs (NaN or inf) for {bad} of {len(outputs)} {split} samples at "
                        f"{checkpoint_shown}; training likely diverged: lower optim.lr (or, with optim.name=sgd, set train.grad_clip)")


def checkpoint_path(cfg: RunConfig, run_dir: Path, which: Optional[str]) -> Path:
    """`best`, `last`, or a path (absolute, or relative to the run directory); None: best.pt when
    the run keeps one (`checkpoint.best`), else last.pt; in a run of an outside checkpoint, its input.pt."""
    outside = run_dir / "checkpoints" / "input.pt"  # a run of an outside checkpoint (kind eval or export) holds only that
    if which is None and outside.is_file() and not any((run_dir / "checkpoints" / f"{n}.pt").exists() for n in ("best", "last")):
        return outside
    which = which or ("best" if cfg.checkpoint.best else "last")
    if which in ("best", "last"):
        return run_dir / "checkpoints" / f"{which}.pt"
    path = Path(which)
    return path if path.is_absolute() else run_dir / path


def load_model(cfg: RunConfig, data: DataVersion, task: Task, path: Path, device: torch.device) -> tuple[torch.nn.Module, dict[str, Any]]:
    if not path.exists():
        raise UserError(f"--checkpoint: {path}: no such checkpoint; give best, last or the path of a .pt file of the run")
    state = checkpoint.load(path)
    model = task.build_model(cfg.model, data).to(device)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, TypeError, ValueError, KeyError, AttributeError) as err:  # a state of another model or none
        detail = " ".join(str(err).split())[:300]
        raise checkpoint.CheckpointError(f"{path}: its weights do not fit the run's model ({detail}); "
                                         "give a checkpoint of this run (best, last or checkpoints/step-N.pt)") from None
    model.eval()
    return model, state


def run(cfg: RunConfig, data: DataVersion, task: Task, run_dir: Path, device: torch.device, which: Optional[str] = None,
        split: Optional[str] = None, baselines: Optional[dict[str, Any]] = None, out_root: Optional[Path] = None) -> dict[str, Any]:
    """Stage entry: evaluate a checkpoint on `split` (default `eval.split`); returns the metrics. The files go to
    `eval/<split>/` below `out_root` (default `run_dir`; an amend of a finished run stages them beside it)."""
    split = split or cfg.eval.split
    if len(split_rows(task, data, split)) == 0:
        raise UserError(f"eval.split: the {split} split of the data version is empty; evaluate another split (--split) or give it samples (data.split_ratios)")
    path = checkpoint_path(cfg, run_dir, which)
    model, state = load_model(cfg, data, task, path, device)
    try:
        shown_path = path.relative_to(run_dir).as_posix()
    except ValueError:
        shown_path = str(path)
    out_dir = (out_root or run_dir) / "eval" / split
    evaluate_split = getattr(task, "evaluate_split", None)  # optional: a task that scores a split without holding its outputs
    write_files = getattr(task, "write_evaluation", None)  # optional: a task that writes files of its own from the outputs
    if evaluate_split is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        metrics = evaluate_split(model, data, split, device, cfg, out_dir)
    else:
        outputs, targets = forward_split(model, task, data, split, device, cfg.eval.batch_size)
        require_finite(outputs, split, shown_path)
        out_dir.mkdir(parents=True, exist_ok=True)
        metrics = write_files(out_dir, outputs, targets, data, split, cfg) if write_files is not None else task.metrics(outputs, targets, data)
    metrics.update(
        split=split,
        data_version=data.version,
        checkpoint=shown_path,
        checkpoint_sha256=sha256_file(path),
        checkpoint_epoch=state["loop"]["epochs_done"],
        checkpoint_state_sha256=trajectory.state_sha256(state),  # which trajectory entry it is (record.json names it)
    )
    history_path = run_dir / "metrics.jsonl"
    if history_path.exists() and hasattr(task, "plot_curves"):
        history = [json.loads(l) for l in history_path.read_text().splitlines() if l.strip()]
        task.plot_curves(out_dir / "curves.png", history)  # pyright: ignore[reportAttributeAccessIssue]  # optional Task method: checked with hasattr
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if hasattr(task, "write_report"):
        task.write_report(out_dir / "report.md", metrics, baselines, run_dir.name)  # pyright: ignore[reportAttributeAccessIssue]  # optional Task method: checked with hasattr
        _lead_with_data(out_dir / "report.md", data)
    log.info(
        "eval: %s split, %s (epoch %d): %s",
        split, shown_path, metrics["checkpoint_epoch"],
        "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)),
    )
    return metrics


def from_predictions(path: Path) -> dict[str, Any]:
    """Every metric recomputed from a predictions.csv alone (classification)."""
    from veritrain.tasks import classification_eval

    _, labels, probabilities, classes = classification_eval.read_predictions(path)
    metrics = classification_eval.compute(probabilities, labels, classes)
    metrics["predictions"] = str(path)
    return metrics


def _lead_with_data(report: Path, data: DataVersion) -> None:
    """Put what matters about the data (quarantine, achieved split, label issues, outliers) right under the
    report's title: a metric means little before the reader knows what the data was."""
    from veritrain.data.report import summary_lines

    summary = (data.report() or {}).get("summary")
    if not summary or not report.exists():
        return
    title, _, rest = report.read_text(encoding="utf-8").partition("\n")
    lead = summary_lines(summary)
    lead[0] = f"## Data ({data.version[:12]})"
    report.write_text("\n".join([title, "", *lead, "", rest.lstrip("\n")]), encoding="utf-8")
