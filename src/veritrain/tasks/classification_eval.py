"""Classification evaluation: metrics from class probabilities, the predictions file, per-class table,
confusion matrices, bad cases and the report.

Every metric is computed from integer counts and exactly rounded float64 sums (`math.fsum`), each in a fixed
order, so it is the same number whatever the thread count, the memory layout or the order of the samples, and
`eval --predictions` on the written file reproduces it exactly. The definitions are scikit-learn's (precision,
recall and F1 with zero_division=0, log loss with probabilities clipped to [eps, 1 − eps]; a test holds them
equal to scikit-learn's within rounding). Expected calibration error uses 15 equal-width confidence bins:
ECE = Σ_b (|b| / n) · |accuracy(b) − mean confidence(b)|, bins (0, 1/15], (1/15, 2/15], …
"""

from __future__ import annotations

import csv
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, cast

import numpy as np

from veritrain.core.baselines import judge
from veritrain.core.display import rows_axis
from veritrain.tasks import classification_spec

if TYPE_CHECKING:
    from veritrain.data.identity import DataVersion

ECE_BINS = 15
EXACT_SUMS = "exact"  # metrics["sums"]: computed as this module computes them; absent in metrics of an earlier veritrain


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    probabilities = np.asarray(probabilities, dtype=np.float64)
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    # a sample with confidence c falls in the bin (edges[k], edges[k + 1]]; c = 0 joins the first bin
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
    n = len(labels)
    gaps = []
    for k in range(bins):  # bin by bin: counts are integers, the confidences' sum is exactly rounded
        members = which == k
        count = int(members.sum())
        if count:
            right = int(correct[members].sum())
            gaps.append(count / n * abs(right / count - math.fsum(confidence[members].tolist()) / count))
    return math.fsum(gaps)


def log_loss(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """Mean −log p(true class), p clipped to [eps, 1 − eps] (float64 eps, as scikit-learn clips), summed exactly."""
    eps = float(np.finfo(np.float64).eps)
    true = np.asarray(probabilities, dtype=np.float64)[np.arange(len(labels)), labels]
    return math.fsum(-math.log(min(max(p, eps), 1 - eps)) for p in true.tolist()) / len(labels)


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0  # scikit-learn's zero_division=0


def compute(probabilities: np.ndarray, labels: np.ndarray, classes: Sequence[str]) -> dict[str, Any]:
    """All metrics of one split from N×K probabilities and N true class indices (see the module's note on arithmetic)."""
    k = len(classes)
    labels = np.asarray(labels, dtype=np.int64)
    predicted = probabilities.argmax(axis=1)
    n = int(len(labels))
    # confusion[t, p]: samples of true class t predicted as p, counted exactly
    confusion = np.bincount(labels * k + predicted, minlength=k * k).reshape(k, k).tolist()
    tp = [confusion[c][c] for c in range(k)]
    support = [sum(confusion[c]) for c in range(k)]
    predicted_as = [sum(row[c] for row in confusion) for c in range(k)]
    precision = [_ratio(tp[c], predicted_as[c]) for c in range(k)]
    recall = [_ratio(tp[c], support[c]) for c in range(k)]
    f1 = [_ratio(2 * tp[c], support[c] + predicted_as[c]) for c in range(k)]  # 2·tp / (2·tp + fp + fn)
    metrics: dict[str, Any] = {"samples": n, "accuracy": _ratio(sum(tp), n)}
    if k >= 5:
        # the true class among the 5 largest probabilities; ties broken as scikit-learn does (a stable sort)
        top = np.argsort(probabilities, axis=1, kind="stable")[:, ::-1][:, :5]
        metrics["top5_accuracy"] = _ratio(int((top == labels[:, None]).any(axis=1).sum()), n)
    for average in ("macro", "weighted"):
        for name, values in (("precision", precision), ("recall", recall), ("f1", f1)):
            metrics[f"{name}_{average}"] = math.fsum(values) / k if average == "macro" else _weighted(values, support)
    # macro F1 has one name, the one its task declares (an earlier veritrain also wrote it f1_macro)
    metrics["macro_f1"] = metrics.pop("f1_macro")
    metrics["log_loss"] = log_loss(probabilities, labels)
    metrics["ece"] = expected_calibration_error(probabilities, labels)
    metrics["per_class"] = {
        name: {"precision": precision[c], "recall": recall[c], "f1": f1[c], "support": support[c]} for c, name in enumerate(classes)
    }
    metrics["sums"] = EXACT_SUMS
    return metrics


def _weighted(values: list[float], support: list[int]) -> float:
    total = sum(support)
    return math.fsum(v * s for v, s in zip(values, support)) / total if total else 0.0


# ---------------------------------------------------------------- files


def write_predictions(path: Path, sample_ids: Sequence[str], labels: np.ndarray, probabilities: np.ndarray, classes: Sequence[str]) -> None:
    """sample_id, label, prediction, confidence, then p_<class> for every class, at full precision
    (`repr` of a float64 round-trips exactly)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sample_id", "label", "prediction", "confidence", *(f"p_{c}" for c in classes)])
        for sid, label, row in zip(sample_ids, labels, probabilities):
            best = int(row.argmax())
            writer.writerow([sid, classes[int(label)], classes[best], repr(float(row[best])), *(repr(float(p)) for p in row)])


def read_predictions(path: Path) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    """(sample ids, label indices, probabilities, classes) from a predictions.csv."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        rows = list(reader)
    if header[:4] != ["sample_id", "label", "prediction", "confidence"] or not all(h.startswith("p_") for h in header[4:]) or len(header) < 6:
        raise ValueError("expected columns sample_id,label,prediction,confidence,p_<class>... (a veritrain predictions.csv)")
    short = next((n for n, r in enumerate(rows, start=2) if len(r) != len(header)), None)
    if short is not None:
        raise ValueError(f"line {short} has not {len(header)} columns like the header")
    if not rows:
        raise ValueError("no predictions after the header")
    classes = [h[2:] for h in header[4:]]
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({r[1] for r in rows} - set(index))
    if unknown:
        raise ValueError(f"label(s) {', '.join(map(repr, unknown[:3]))} have no p_<class> column")
    try:
        probabilities = np.array([[float(v) for v in r[4:]] for r in rows], dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"a p_<class> value is not a number ({err})") from None
    not_finite = np.flatnonzero(~np.isfinite(probabilities).all(axis=1))
    if len(not_finite):
        raise ValueError(f"line {int(not_finite[0]) + 2} has a p_<class> value that is NaN or inf ({len(not_finite)} line(s) in all)")
    labels = np.array([index[r[1]] for r in rows], dtype=np.int64)
    return [r[0] for r in rows], labels, probabilities, classes


def write_per_class(path: Path, per_class: dict[str, dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["class", "precision", "recall", "f1", "support"])
        for name, m in per_class.items():
            writer.writerow([name, repr(m["precision"]), repr(m["recall"]), repr(m["f1"]), m["support"]])


def bad_cases(sample_ids: Sequence[str], labels: np.ndarray, probabilities: np.ndarray, classes: Sequence[str], count: int) -> list[dict[str, Any]]:
    """The most confident wrong predictions, most confident first."""
    predicted = probabilities.argmax(axis=1)
    confidence = probabilities.max(axis=1)
    wrong = np.flatnonzero(predicted != labels)
    order = wrong[np.argsort(-confidence[wrong], kind="stable")][:count]
    return [
        {"sample_id": sample_ids[i], "row": int(i), "label": classes[int(labels[i])], "prediction": classes[int(predicted[i])],
         "confidence": float(confidence[i]), "p_label": float(probabilities[i, labels[i]])}
        for i in order
    ]


def write_bad_cases_csv(path: Path, cases: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sample_id", "label", "prediction", "confidence", "p_label"])
        for c in cases:
            writer.writerow([c["sample_id"], c["label"], c["prediction"], repr(c["confidence"]), repr(c["p_label"])])


# ---------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(path: Path, labels: np.ndarray, predicted: np.ndarray, classes: Sequence[str], normalized: bool) -> None:
    plt = _pyplot()
    k = len(classes)
    matrix = np.zeros((k, k), dtype=np.float64)
    np.add.at(matrix, (labels, predicted), 1)
    if normalized:
        matrix = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    size = max(4.0, 0.45 * k + 2)
    fig, ax = plt.subplots(figsize=(size, size), dpi=100)
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(k), classes, rotation=45 if k > 8 else 0, ha="right" if k > 8 else "center")
    ax.set_yticks(range(k), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("confusion matrix" + (" (rows normalized)" if normalized else ""))
    if k <= 20:
        top = matrix.max() or 1
        for i in range(k):
            for j in range(k):
                text = f"{matrix[i, j]:.2f}" if normalized else str(int(matrix[i, j]))
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if matrix[i, j] > top / 2 else "black")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def plot_bad_cases(path: Path, cases: list[dict[str, Any]], images: Optional[np.ndarray]) -> None:
    """An image grid of the bad cases, each titled `true → predicted (confidence)`, five to a row. The grid is
    drawn on one axes (one image and one title per case): a grid of axes, one per case, took matplotlib about
    20 ms each to lay out and draw, most of an evaluation's time on a small run."""
    plt = _pyplot()
    n = max(1, len(cases))
    cols = min(5, n)
    rows = (n + cols - 1) // cols
    width, height = 2.4 * cols, 2.6 * rows  # inches: a 2.4 × 2.6 cell per case
    band = 0.35  # inches at the top for the figure's title
    fig = plt.figure(figsize=(width, height + band), dpi=100)
    fig.text(0.5, 1 - band / 2 / (height + band), "most confident wrong predictions: true → predicted (confidence)",
             ha="center", va="center", fontsize=10)
    ax = fig.add_axes((0.0, 0.0, 1.0, height / (height + band)))
    ax.set_axis_off()
    cell_height = 2.6 / 2.4  # in units of a cell's width, so the images keep square pixels
    ax.set_xlim(0, cols)
    ax.set_ylim(rows * cell_height, 0)  # row 0 at the top
    if not cases:
        ax.text(0.5, cell_height / 2, "no wrong predictions", ha="center", va="center")
    for i, case in enumerate(cases):
        row, col = divmod(i, cols)
        top = row * cell_height
        ax.text(col + 0.5, top + 0.12, f"{case['label']} → {case['prediction']}\n({case['confidence']:.2f})",
                ha="center", va="center", fontsize=9)
        if images is None:
            continue
        image = np.asarray(images[case["row"]])
        h, w = image.shape[:2]
        side = 0.82  # of a cell's width, centred below the title
        tile_w, tile_h = side * w / max(h, w), side * h / max(h, w)
        left, upper = col + 0.5 - tile_w / 2, top + 0.235 + (side - tile_h) / 2
        gray = image.shape[-1] == 1
        ax.imshow(image[:, :, 0] if gray else image, cmap="gray" if gray else None, vmin=0, vmax=255,
                  interpolation="nearest", extent=(left, left + tile_w, upper + tile_h, upper), aspect="auto")
    ax.set_xlim(0, cols)  # imshow resets the limits to its own extent
    ax.set_ylim(rows * cell_height, 0)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def plot_curves(path: Path, history: list[dict[str, Any]]) -> None:
    """Loss and accuracy per epoch (or per validation step) from metrics.jsonl, as curves.png."""
    plt = _pyplot()
    fig = curves_figure(history)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def curves_figure(history: list[dict[str, Any]]) -> Any:
    """The figure of `plot_curves` (train/val loss left, accuracy right), not yet saved; the caller closes it."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=100)
    unit, xs = rows_axis(history)
    for key, ax in (("loss", left), ("acc", right)):
        for split in ("train", "val"):
            values = [row.get(f"{split}_{key}") for row in history]
            if any(v is not None for v in values):
                ax.plot(xs, values, marker="o", markersize=3, label=split)
        ax.set_xlabel(unit)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and steps are whole: no tick at 1.5
        ax.set_title("loss" if key == "loss" else "accuracy")
        ax.legend()
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- report

HEADLINE = ("accuracy", "top5_accuracy", "macro_f1", "f1_weighted", "precision_macro", "recall_macro", "log_loss", "ece", "loss")


def report_markdown(metrics: dict[str, Any], baselines: Optional[dict[str, Any]], run_id: str) -> str:
    lines = [
        f"# Evaluation of run {run_id}: {metrics['split']} split",
        "",
        f"- checkpoint: `{metrics['checkpoint']}` (epoch {metrics['checkpoint_epoch']}, sha256 `{metrics['checkpoint_sha256'][:16]}…`)",
        f"- data version: `{metrics['data_version']}`, {metrics['samples']} samples",
        "",
        "## Metrics",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {name} | {metrics[name]:.4f} |" for name in HEADLINE if name in metrics]
    if baselines:
        lines += ["", "## Model vs baselines (same splits)", "", "| model | accuracy | macro F1 |", "|---|---|---|"]
        lines.append(f"| this run | {metrics['accuracy']:.4f} | {metrics['macro_f1']:.4f} |")
        macro_f1 = classification_spec.SPEC.metric("macro_f1")
        assert macro_f1 is not None
        for name, result in baselines.get("results", {}).items():  # an earlier veritrain's baselines name it f1_macro
            lines.append(f"| {name} | {result['accuracy']:.4f} | {macro_f1.value(result):.4f} |")

        warning = judge(metrics, baselines, classification_spec.SPEC.baseline_rule()).warning
        if warning:
            lines += ["", f"**warning:** {warning}"]
    lines += ["", "## Per class", "", "| class | precision | recall | F1 | support |", "|---|---|---|---|---|"]
    for name, m in metrics["per_class"].items():
        lines.append(f"| {name} | {m['precision']:.4f} | {m['recall']:.4f} | {m['f1']:.4f} | {m['support']} |")
    lines += [
        "",
        "## Plots and files",
        "",
        "- [confusion matrix](confusion_matrix.png), [normalized](confusion_matrix_normalized.png)",
        "- [loss and accuracy per epoch](curves.png)",
        "- [bad cases](bad_cases.png) ([csv](bad_cases.csv)): the most confident wrong predictions",
        "- [predictions.csv](predictions.csv), [per_class.csv](per_class.csv), [metrics.json](metrics.json)",
        "",
        "![confusion matrix](confusion_matrix.png)",
        "",
        "![bad cases](bad_cases.png)",
        "",
        "![curves](curves.png)",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- baselines


def fit_baselines(data: DataVersion, split: str, seed: int, max_samples: int, max_iter: int) -> dict[str, Any]:
    """Majority class and logistic regression on flattened, normalized pixels, trained on the train
    split (a seeded subsample of at most `max_samples`) and scored on `split` like the model."""

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    classes = cast(list[str], data.classes)  # a classification data version has classes
    train_rows, eval_rows = data.splits["train"], data.splits[split]
    subsampled = len(train_rows) > max_samples
    if subsampled:
        rng = np.random.default_rng(seed)
        train_rows = np.sort(rng.choice(train_rows, size=max_samples, replace=False))
    stats = data.info["normalization"]

    def features(rows: np.ndarray) -> np.ndarray:
        x = np.asarray(data.inputs[rows], dtype=np.float64)
        if data.inputs.dtype == np.uint8:
            x = x / 255.0
        x = (x - np.asarray(stats["mean"])) / np.asarray(stats["std"])
        return x.reshape(len(rows), -1)

    y_train = np.asarray(data.targets[train_rows])
    y_eval = np.asarray(data.targets[eval_rows])
    k = len(classes)
    prior = np.bincount(y_train, minlength=k) / len(y_train)
    majority = np.tile(prior, (len(eval_rows), 1))  # always the most frequent class, with its frequency as confidence

    model = LogisticRegression(max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(features(train_rows), y_train)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    probabilities = np.zeros((len(eval_rows), k))
    probabilities[:, model.classes_] = model.predict_proba(features(eval_rows))

    def summary(p: np.ndarray) -> dict[str, Any]:
        m = compute(p, y_eval, classes)
        return {key: m[key] for key in ("accuracy", "macro_f1", "f1_weighted", "log_loss", "samples") if key in m}

    return {
        "split": split,
        "results": {"majority_class": summary(majority), "logistic_regression": summary(probabilities)},
        "logistic_regression": {
            "train_samples": int(len(train_rows)),
            "subsampled": subsampled,
            "subsample_seed": seed if subsampled else None,
            "max_iter": max_iter,
            "converged": converged,
            "features": "flattened pixels, scaled to [0, 1] and normalized with the train split's mean/std",
        },
    }
