"""Evaluation metrics are the same number at any thread count and in any sample order (integer counts and exactly
rounded float64 sums), and equal scikit-learn's definitions within rounding."""

from __future__ import annotations

import numpy as np
import torch

from veritrain.tasks import classification_eval
from veritrain.tasks.classification import class_probabilities, mean_loss

CLASSES = [str(k) for k in range(10)]


def _split(seed: int = 0, n: int = 4000):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, len(CLASSES), generator=generator) * 3
    targets = torch.randint(0, len(CLASSES), (n,), generator=generator)
    return logits, targets


def _metrics(logits: torch.Tensor, targets: torch.Tensor) -> dict:
    metrics = classification_eval.compute(class_probabilities(logits), targets.numpy(), CLASSES)
    metrics["loss"] = mean_loss(logits, targets)
    return metrics


def test_metrics_are_identical_at_one_and_two_threads_and_in_any_sample_order():
    logits, targets = _split()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _metrics(logits, targets)
        torch.set_num_threads(2)
        two = _metrics(logits, targets)
    finally:
        torch.set_num_threads(threads)
    assert one == two
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(1))
    shuffled = _metrics(logits[order], targets[order])
    assert shuffled == one  # exact sums: no order to depend on (a plain float sum differs in the last bits here)
    plain = float(torch.nn.functional.cross_entropy(logits[order], targets[order]))
    assert abs(plain - one["loss"]) < 1e-5  # the float32 mean the loss replaced, to float32's rounding


def test_metrics_follow_scikit_learns_definitions():
    from sklearn.metrics import log_loss, precision_recall_fscore_support, top_k_accuracy_score

    logits, targets = _split(seed=2, n=600)
    probabilities, labels = class_probabilities(logits), targets.numpy()
    ours = classification_eval.compute(probabilities, labels, CLASSES)
    indices = list(range(len(CLASSES)))
    assert abs(ours["log_loss"] - log_loss(labels, probabilities, labels=indices)) < 1e-12
    assert ours["top5_accuracy"] == top_k_accuracy_score(labels, probabilities, k=5, labels=indices)
    for average in ("macro", "weighted"):
        precision, recall, f1, _ = precision_recall_fscore_support(labels, probabilities.argmax(1), labels=indices, average=average, zero_division=0)
        assert abs(ours[f"precision_{average}"] - precision) < 1e-12 and abs(ours[f"recall_{average}"] - recall) < 1e-12
        assert abs(ours["macro_f1" if average == "macro" else "f1_weighted"] - f1) < 1e-12
    confidence, correct = probabilities.max(1), probabilities.argmax(1) == labels
    which = np.clip(np.searchsorted(np.linspace(0, 1, 16), confidence, side="left") - 1, 0, 14)
    naive = sum((which == k).mean() * abs(correct[which == k].mean() - confidence[which == k].mean()) for k in range(15) if (which == k).any())
    assert abs(ours["ece"] - naive) < 1e-12


def test_a_one_channel_batch_is_the_same_decoded_afresh_or_from_the_kept_copy():
    """`veritrain eval` in a new process decodes each batch; training keeps a decoded copy. Both must give the model
    the same tensor, strides included: a one-channel view with channel stride 1 makes the conv kernels round otherwise."""
    from types import SimpleNamespace

    import numpy as np

    from veritrain import models
    from veritrain.core.config import load_config
    from veritrain.tasks.classification import ClassificationTask

    cfg = load_config(None, []).config
    rng = np.random.default_rng(0)
    data = SimpleNamespace(version="v", info={"normalization": {"mean": [0.3], "std": [0.2]}, "input_shape": [8, 8, 1]},
                           inputs=rng.integers(0, 256, (40, 8, 8, 1), dtype=np.uint8), targets=rng.integers(0, 10, 40), classes=CLASSES)
    rows, device, generator = np.arange(40), torch.device("cpu"), torch.Generator()
    afresh = ClassificationTask(cfg)
    fresh_x, _ = afresh.batch(data, rows, device, False, generator)
    kept = ClassificationTask(cfg)
    kept.prepare(data)
    kept_x, _ = kept.batch(data, rows, device, False, generator)
    assert torch.equal(fresh_x, kept_x) and fresh_x.stride() == kept_x.stride() == (64, 64, 8, 1)
    torch.manual_seed(0)
    model = models.build("cnn", (1, 8, 8), 10, [8, 16], [32], 0.0).eval()
    with torch.no_grad():
        assert torch.equal(model(fresh_x), model(kept_x))
