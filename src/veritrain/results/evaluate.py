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

from veritrain.core.errors import UserError
from veritrain.core.hashing import sha256_file
from veritrain.data.report import summary_lines
from veritrain.tasks import classification_eval, split_rows
from veritrain.tasks.evaluation import stream
from veritrain.train import checkpoint, trajectory

if TYPE_CHECKING:
    from veritrain.core.config import RunConfig
    from veritrain.data.identity import DataVersion
    from veritrain.tasks import Task

log = logging.getLogger("veritrain")


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
    evaluator = task.evaluator(model, data, split, cfg)
    stream(model, task, data, split, device, cfg.eval.batch_size, evaluator, shown_path, workers=cfg.train.num_workers)
    metrics = evaluator.compute()
    out_dir.mkdir(parents=True, exist_ok=True)
    evaluator.write(out_dir, metrics)
    metrics.update(
        split=split,
        data_version=data.version,
        checkpoint=shown_path,
        checkpoint_sha256=sha256_file(path),
        checkpoint_epoch=state["loop"]["epochs_done"],
        checkpoint_state_sha256=trajectory.state_sha256(state),  # which trajectory entry it is (record.json names it)
    )
    history_path = run_dir / "metrics.jsonl"
    if history_path.exists():
        history = [json.loads(l) for l in history_path.read_text().splitlines() if l.strip()]
        task.plot_curves(out_dir / "curves.png", history)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    task.write_report(out_dir / "report.md", metrics, baselines, run_dir.name)
    if (out_dir / "report.md").is_file():
        _lead_with_data(out_dir / "report.md", data)
    log.info(
        "eval: %s split, %s (epoch %d): %s",
        split, shown_path, metrics["checkpoint_epoch"],
        "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)),
    )
    return metrics


def from_predictions(path: Path) -> dict[str, Any]:
    """Every metric recomputed from a predictions.csv alone (classification)."""

    _, labels, probabilities, classes = classification_eval.read_predictions(path)
    metrics = classification_eval.compute(probabilities, labels, classes)
    metrics["predictions"] = str(path)
    return metrics


def _lead_with_data(report: Path, data: DataVersion) -> None:
    """Put what matters about the data (quarantine, achieved split, label issues, outliers) right under the
    report's title: a metric means little before the reader knows what the data was."""

    summary = (data.report() or {}).get("summary")
    if not summary or not report.exists():
        return
    title, _, rest = report.read_text(encoding="utf-8").partition("\n")
    lead = summary_lines(summary)
    lead[0] = f"## Data ({data.version[:12]})"
    report.write_text("\n".join([title, "", *lead, "", rest.lstrip("\n")]), encoding="utf-8")
