"""The evaluation stage of a small digits run, with the bad-cases grid drawn as one axes (now) against one axes
per case (as before): interleaved A/B, in this process.

    .venv/bin/python benchmarks/eval_plots.py [--repeat 5]

Trains one small run (mlp [32], 2 epochs, no smoke test) in a temporary workspace, then times
`veritrain.results.evaluate.run` on it (val and test, every file it writes) with each renderer in turn, A B A B...,
and prints the median of each and their ratio. The "before" renderer is kept here only as the reference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def grid_of_axes(path: Path, cases: list[dict[str, Any]], images: Optional[np.ndarray]) -> None:
    """The renderer before: a subplot per case, then tight_layout."""
    from veritrain.tasks.classification_eval import _pyplot

    plt = _pyplot()
    n = max(1, len(cases))
    cols = min(5, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 2.6 * rows), dpi=100, squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    if not cases:
        axes[0, 0].text(0.5, 0.5, "no wrong predictions", ha="center", va="center")
    for ax, case in zip(axes.ravel(), cases):
        if images is not None:
            image = np.asarray(images[case["row"]])
            ax.imshow(image[:, :, 0] if image.shape[-1] == 1 else image, cmap="gray" if image.shape[-1] == 1 else None,
                      vmin=0, vmax=255, interpolation="nearest")
        ax.set_title(f"{case['label']} → {case['prediction']}\n({case['confidence']:.2f})", fontsize=9)
    fig.suptitle("most confident wrong predictions: true → predicted (confidence)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from veritrain.core.config import load_config
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace
    from veritrain.results import evaluate
    from veritrain.tasks import classification_eval
    from veritrain.train.loop import resolve_device
    from veritrain.trust import opening

    current = classification_eval.plot_bad_cases
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        resolved = load_config(None, ["train.epochs=2", "model.name=mlp", "model.hidden=[32]"])
        outcome = pipeline.run(resolved, Workspace.open(workdir), ["veritrain", "run"], kind="run")
        run_dir = Path(outcome.summary["run_dir"])
        opened = opening.open_run(Workspace.open(workdir), run_dir.name, need="model")
        device = resolve_device(opened.config.train.device)
        times: dict[str, list[float]] = {"one axes": [], "axes per case": []}
        for i in range(2 * args.repeat + 2):  # the first pair warms the caches and is not counted
            name = "one axes" if i % 2 == 0 else "axes per case"
            classification_eval.plot_bad_cases = current if name == "one axes" else grid_of_axes
            out = workdir / f"eval-{i}"
            started = time.perf_counter()
            for split in ("val", "test"):
                evaluate.run(opened.config, opened.data, opened.task, run_dir, device, split=split, out_root=out)
            if i >= 2:
                times[name].append(time.perf_counter() - started)
        classification_eval.plot_bad_cases = current
    a, b = statistics.median(times["one axes"]), statistics.median(times["axes per case"])
    print(f"evaluation stage (val and test), median of {args.repeat}: one axes {a:.3f} s, axes per case {b:.3f} s, "
          f"ratio {a / b:.3f}")


if __name__ == "__main__":
    main()
