"""Label issues and outliers for image classification data, judged from 16×16 thumbnails (`dedup.thumbnail`).

A label issue is a sample whose label the rest of the data contradicts: it lies much nearer to another class
than to its own. An outlier lies far from everything else, in its class and in the whole dataset. Both are
measured on blurred, unit-length thumbnails reduced by PCA, with scikit-learn nearest neighbours; no N×N matrix.

Label issues are calibrated against the data itself: a sample is flagged only when labels of this data rarely
disagree with the pixels as strongly as a random relabelling does, so data whose pixels barely predict their
labels (natural photos, shuffled labels) gets few or no flags. Deterministic; see `find_label_issues_and_outliers`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from veritrain.data.row_images import Images, RowImages, RowView

METHOD_NAME = "thumbnail-knn-v1"  # change it whenever a rule or default below changes (it is recorded)
BLUR_SIGMA = 0.7  # px of the 16×16 thumbnail: a light Gaussian blur makes 1-px shifts of a stroke count less
FEATURE_DIMS = 40  # principal components kept; a 41st coordinate holds the norm of the part they miss, ...
RESIDUAL_WEIGHT = 2.0  # ... doubled: energy off the data's main directions marks images unlike the rest (on MNIST,
# noise images reach outlier z ≥ 4.4 with it, 3.7 without; real digits stay ≤ 2.9 either way)
CLASS_NEIGHBOUR = 2  # distance from a sample to a class = to its 2nd nearest member (one odd member is not the class)
GLOBAL_NEIGHBOUR = 5  # an outlier's isolation = distance to its 5th nearest sample of any class
MIN_SAMPLES = 50  # below this, spreads and tails cannot be estimated: nothing is judged
MIN_CLASS_FOR_SPREAD = 10  # members a class needs before "far from its class" is judged within it
MIN_PRECISION = 0.65  # flag label issues while the estimated share of real errors among the flagged stays ≥ 65%
NOISE_QUANTILE = 0.25  # noise rate = share of samples above this quantile of the wrong-label scores, / (1 − it)
MAX_FLAGGED_FRACTION = 0.02  # never flag more than 2% of the samples as label issues, however noisy the labels look
OUTLIER_Z = 3.5  # robust z-score (median/MAD) of the log distance above which a sample is far, in class and overall
MIN_LOG_SPREAD = 0.1  # floor of that spread: where all samples are about equally far apart, 1.4× farther (e^0.35) is
# not yet far (MNIST's spread is 0.17-0.25, photo patches' 0.1-1.0)
MAX_REFERENCE_SAMPLES = 20_000  # neighbours are drawn from at most this many samples (a seeded sample beyond): cost ∝ N
MIN_CLASS_REFERENCE = 200  # ... but every class keeps at least this many of its members as references
DISTANCE_FLOOR = 1e-6  # feature-space distances below this are float error on unit-length vectors
WORKING_MEMORY_MB = 32  # scikit-learn's working memory for the distance chunks (bounds memory)
MAX_RELABELLINGS = 5_000_000  # wrong-label scores kept for the calibration (a seeded share beyond; bounds memory)
ROW_CHUNK = 1024  # thumbnails turned into features at a time (bounds memory)
QUERY_CHUNK = 65_536  # rows whose nearest references are asked for at once (bounds memory)
THREADS = 1  # BLAS/OpenMP threads: as fast as 2 on 5,000 thumbnails on an idle 2-core machine, and 8× faster
# than 2 when another process competes for the cores (OpenMP threads spin-wait for each other)


@dataclass(frozen=True)
class Flag:
    index: int  # row in thumbnails/labels
    score: float  # in [0, 1], higher = more suspicious; comparable within one kind (see Findings)
    suggested: Optional[int]  # label issue: the class the data points to; outlier: None


@dataclass
class Findings:
    label_issues: list[Flag]  # most suspicious first; score = estimated share of real errors among flags this strong
    outliers: list[Flag]  # most isolated first; score = 1 − 2^(−z / OUTLIER_Z), so flagged ⇔ score ≥ 0.5
    label_noise_estimate: Optional[float]  # share of labels the pixels contradict as much as random labels would:
    # near 0 for clean data, near 1 when labels do not follow the pixels at all; None when not judged
    method: dict[str, Any]  # JSON-able: the method and its parameters, for the data report


def find_label_issues_and_outliers(thumbnails: Images, labels: np.ndarray, num_classes: int, seed: int) -> Findings:
    """Label issues and outliers among N samples, ranked, from their thumbnails (uint8 N×16×16×C, C = 1 or 3,
    any side works) and labels (N class indices in [0, num_classes)).

    1. Features: each thumbnail blurred (σ = BLUR_SIGMA px), its mean removed, scaled to unit length; PCA to
       FEATURE_DIMS dims (exact eigendecomposition, no randomness) plus RESIDUAL_WEIGHT × the residual's norm.
    2. For every sample and class c, L[i, c] = log distance to the CLASS_NEIGHBOUR-th nearest member of c,
       leaving out the sample and its exact copies (identical thumbnails).
    3. Label issue evidence s_i = L[i, own] − min over other classes c of L[i, c] (> 0: another class is nearer).
       The same quantity for every sample under each wrong label is what label errors would score. R(s) = (share
       of samples with evidence ≥ s) / (share of wrong relabellings ≥ s); the noise rate η is R at the
       NOISE_QUANTILE-quantile of the relabellings. Score = min(η, MAX_FLAGGED_FRACTION · MIN_PRECISION) / R(s),
       the estimated share of real errors among all samples at least this suspicious (made non-decreasing in s);
       flagged when ≥ MIN_PRECISION and s > 0, so never more than MAX_FLAGGED_FRACTION of the samples. Shuffled
       labels score like the relabellings (R ≈ 1 everywhere), so nothing is flagged.
    4. Outlier: robust z-scores (spread at least MIN_LOG_SPREAD) of the log distance to the GLOBAL_NEIGHBOUR-th
       nearest sample (all data) and of L[i, own] (within the class, for classes of MIN_CLASS_FOR_SPREAD or more);
       flagged when both exceed OUTLIER_Z. An outlier's neighbours are far, so it is not also a label issue.

    `seed` picks which samples serve as neighbours when there are more than MAX_REFERENCE_SAMPLES (by a seeded
    hash of their content, so a reordering of the rows picks the same ones) and which wrong labels calibrate
    when N × (classes − 1) exceeds MAX_RELABELLINGS; below both nothing is random. Same inputs and seed give
    identical Findings. Cost on one core: about 0.25 s per 5,000 samples of 10 classes, quadratic in N up to
    MAX_REFERENCE_SAMPLES and linear beyond; each class adds a neighbour query over all N.
    """
    from threadpoolctl import threadpool_limits

    thumbnails, labels = _checked(thumbnails, labels, num_classes)
    method = _method(thumbnails, num_classes, seed)
    n = len(labels)
    if n < MIN_SAMPLES:
        method["skipped"] = f"{n} samples, fewer than the {MIN_SAMPLES} needed to judge spreads"
        return Findings([], [], None, method)
    with threadpool_limits(limits=THREADS):
        return _find(thumbnails, labels, num_classes, seed, method)


def _find(thumbnails: Images, labels: np.ndarray, num_classes: int, seed: int, method: dict[str, Any]) -> Findings:
    features = _features(thumbnails)
    copy_group = _copy_groups(thumbnails)
    reference = _reference_rows(thumbnails, labels, copy_group, seed)
    method["reference_samples"] = int(reference.sum())
    class_distance = _class_log_distances(features, labels, copy_group, reference, num_classes)
    global_distance = _global_log_distance(features, copy_group, reference)

    outlier_z = _outlier_z(class_distance, global_distance, labels)
    is_outlier = outlier_z > OUTLIER_Z
    outlier_score = 1.0 - np.exp2(-np.maximum(outlier_z, 0.0) / OUTLIER_Z)

    evidence, suggested, relabelled = _label_evidence(class_distance, labels, seed)
    precision, noise_estimate = _label_issue_precision(evidence, relabelled)
    is_issue = (precision >= MIN_PRECISION) & (evidence > 0) & ~is_outlier

    return Findings(
        label_issues=_ranked(np.flatnonzero(is_issue), precision, evidence, suggested),
        outliers=_ranked(np.flatnonzero(is_outlier), outlier_score, outlier_z, None),
        label_noise_estimate=noise_estimate,
        method=method,
    )


def _checked(thumbnails: Images, labels: np.ndarray, num_classes: int) -> tuple[Images, np.ndarray]:
    if not hasattr(thumbnails, "shape"):  # an array, or rows read a chunk at a time (row_images.RowView), are taken as they are
        thumbnails = np.asarray(thumbnails)
    labels = np.asarray(labels)
    if thumbnails.dtype != np.uint8 or thumbnails.ndim != 4 or thumbnails.shape[3] not in (1, 3):
        raise ValueError(f"label issues: expected uint8 thumbnails N×H×W×C with C = 1 or 3, got {thumbnails.dtype} {thumbnails.shape}")
    if labels.ndim != 1 or len(labels) != len(thumbnails) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"label issues: expected {len(thumbnails)} integer labels, got {labels.dtype} {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"label issues: labels must lie in [0, {num_classes}), got [{labels.min()}, {labels.max()}]")
    return thumbnails, labels.astype(np.int64)


def _method(thumbnails: Images, num_classes: int, seed: int) -> dict[str, Any]:
    return {
        "name": METHOD_NAME,
        "features": {"thumbnail": list(thumbnails.shape[1:]), "blur_sigma_px": BLUR_SIGMA, "normalize": "mean removed, unit length",
                     "pca_dims": FEATURE_DIMS, "residual_norm_weight": RESIDUAL_WEIGHT},
        "neighbours": {"class": CLASS_NEIGHBOUR, "global": GLOBAL_NEIGHBOUR, "excludes": "the sample and its exact copies",
                       "max_reference_samples": MAX_REFERENCE_SAMPLES, "min_class_reference": MIN_CLASS_REFERENCE},
        "label_issue": {"evidence": "log(distance to own class / distance to nearest other class)",
                        "calibration": "tail share of samples / tail share of all wrong relabellings",
                        "min_precision": MIN_PRECISION, "max_flagged_fraction": MAX_FLAGGED_FRACTION},
        "outlier": {"z": "robust (median, 1.4826·MAD) of log distance, overall and within class", "min_z": OUTLIER_Z,
                    "min_log_spread": MIN_LOG_SPREAD,
                    "min_class_for_spread": MIN_CLASS_FOR_SPREAD},
        "min_samples": MIN_SAMPLES,
        "num_classes": int(num_classes),
        "seed": int(seed),
    }


def _features(thumbnails: Images) -> Images:
    """N × (FEATURE_DIMS + 1): PCA coordinates of the normalized thumbnails and the norm of what PCA leaves out
    (noise and other images unlike the rest keep most of their energy there); float64, read a chunk of rows at a time."""
    n = len(thumbnails)
    width = int(np.prod(thumbnails.shape[1:]))
    total = np.zeros(width)
    scatter = np.zeros((width, width))
    for start in range(0, n, ROW_CHUNK):
        rows = _normalized(thumbnails[start : start + ROW_CHUNK])
        total += rows.sum(axis=0)
        scatter += rows.T @ rows
    mean = total / n
    covariance = scatter / n - np.outer(mean, mean)
    _, vectors = np.linalg.eigh(covariance)  # ascending eigenvalues; exact, so no seed is needed
    dims = min(FEATURE_DIMS, width)
    components = vectors[:, ::-1][:, :dims]
    # beside the thumbnails when they are read from a scratch file (row_images), else in memory
    stored = RowImages(thumbnails.images.path.with_name("features.f64"), n, dtype=np.float64) \
        if isinstance(thumbnails, RowView) and thumbnails.images.path is not None else None
    features = np.empty((n if stored is None else 0, dims + 1))
    for start in range(0, n, ROW_CHUNK):
        centred = _normalized(thumbnails[start : start + ROW_CHUNK]) - mean
        projected = centred @ components
        left_out = np.einsum("ij,ij->i", centred, centred) - np.einsum("ij,ij->i", projected, projected)
        chunk = np.empty((len(centred), dims + 1))
        chunk[:, :dims] = projected
        chunk[:, dims] = RESIDUAL_WEIGHT * np.sqrt(np.maximum(left_out, 0.0))
        if stored is None:
            features[start : start + len(centred)] = chunk
        else:
            stored.put_rows(start, chunk)
    return features if stored is None else stored.of(np.arange(n))


def _normalized(thumbnails: np.ndarray) -> np.ndarray:
    """Blurred thumbnails as rows with their mean removed and unit length (a flat image stays all zeros):
    brightness and contrast say little about the class."""
    from scipy.ndimage import gaussian_filter

    pixels = gaussian_filter(thumbnails.astype(np.float64), sigma=(0, BLUR_SIGMA, BLUR_SIGMA, 0), mode="nearest")
    rows = pixels.reshape(len(pixels), -1)
    rows -= rows.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-9)


def _copy_groups(thumbnails: Images) -> np.ndarray:
    """A group id per row; rows with identical thumbnails share it (they are never each other's evidence). Rows are
    told apart by a 16-byte BLAKE2b of their pixels, a chunk of rows at a time."""
    digests = np.empty(len(thumbnails), dtype=np.dtype((np.void, 16)))
    for start in range(0, len(thumbnails), ROW_CHUNK):
        rows = np.ascontiguousarray(thumbnails[start : start + ROW_CHUNK]).reshape(-1, int(np.prod(thumbnails.shape[1:])))
        digests[start : start + len(rows)] = [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in rows]
    _, group = np.unique(digests, return_inverse=True)
    return group.ravel().astype(np.int64)


def _reference_rows(thumbnails: Images, labels: np.ndarray, copy_group: np.ndarray, seed: int) -> np.ndarray:
    """Boolean mask of the rows neighbours are drawn from: one row per (copy group, label), and beyond
    MAX_REFERENCE_SAMPLES a per-class share of them chosen by a seeded hash of the thumbnail (order-independent)."""
    order = np.lexsort((np.arange(len(labels)), labels, copy_group))
    first = np.ones(len(order), dtype=bool)
    first[1:] = (copy_group[order][1:] != copy_group[order][:-1]) | (labels[order][1:] != labels[order][:-1])
    reference = np.zeros(len(labels), dtype=bool)
    reference[order[first]] = True
    total = int(reference.sum())
    if total <= MAX_REFERENCE_SAMPLES:
        return reference
    salt = int(seed).to_bytes(16, "little", signed=True)
    keys = np.zeros(len(labels), dtype=np.uint64)
    chosen = np.flatnonzero(reference)
    for start in range(0, len(chosen), ROW_CHUNK):
        rows = chosen[start : start + ROW_CHUNK]
        keys[rows] = [int.from_bytes(hashlib.blake2b(np.ascontiguousarray(picture).tobytes(), digest_size=8, salt=salt).digest(), "little")
                      for picture in thumbnails[rows]]
    for c in np.unique(labels[reference]):
        members = np.flatnonzero(reference & (labels == c))
        quota = max(int(np.ceil(MAX_REFERENCE_SAMPLES * len(members) / total)), min(len(members), MIN_CLASS_REFERENCE))
        ranked = members[np.lexsort((copy_group[members], keys[members]))]
        reference[ranked[quota:]] = False
    return reference


def _kth_log_distance(features: Images, copy_group: np.ndarray, pool: np.ndarray, k: int) -> np.ndarray:
    """For every row: log distance to its k-th nearest row of `pool` (indices), not counting its own copy group;
    the farthest available when the pool holds fewer than k others, +inf when it holds none. The rows ask QUERY_CHUNK
    at a time, so the neighbours found are held for a chunk, not for every row."""
    from sklearn import config_context
    from sklearn.neighbors import NearestNeighbors

    n = len(features)
    if len(pool) == 0:
        return np.full(n, np.inf)
    asked = min(k + 1, len(pool))  # one spare: a row's own copy group can be among its pool neighbours
    kth = np.empty(n)
    with config_context(working_memory=WORKING_MEMORY_MB):
        index = NearestNeighbors(n_neighbors=asked, algorithm="brute").fit(features[pool])
        for start in range(0, n, QUERY_CHUNK):
            distances, neighbours = index.kneighbors(features[start : start + QUERY_CHUNK])
            distances = np.where(copy_group[pool][neighbours] == copy_group[start : start + len(distances), None], np.inf, distances)
            distances.sort(axis=1)
            available = np.isfinite(distances).sum(axis=1)
            kth[start : start + len(distances)] = distances[np.arange(len(distances)), np.clip(np.minimum(available, k) - 1, 0, None)]
    return np.log(np.maximum(kth, DISTANCE_FLOOR))


def _class_log_distances(features: Images, labels: np.ndarray, copy_group: np.ndarray, reference: np.ndarray,
                         num_classes: int) -> np.ndarray:
    """N × num_classes: L[i, c] = log distance from row i to class c (its CLASS_NEIGHBOUR-th nearest member)."""
    distances = np.full((len(labels), num_classes), np.inf)
    for c in range(num_classes):
        pool = np.flatnonzero(reference & (labels == c))
        distances[:, c] = _kth_log_distance(features, copy_group, pool, CLASS_NEIGHBOUR)
    return distances


def _global_log_distance(features: Images, copy_group: np.ndarray, reference: np.ndarray) -> np.ndarray:
    pool = np.flatnonzero(reference)
    _, first = np.unique(copy_group[pool], return_index=True)  # a copy group labelled twice counts once
    return _kth_log_distance(features, copy_group, pool[np.sort(first)], GLOBAL_NEIGHBOUR)


def _robust_z(values: np.ndarray) -> np.ndarray:
    median = np.median(values)
    spread = 1.4826 * np.median(np.abs(values - median))  # the MAD scaled to a normal's standard deviation
    return (values - median) / max(spread, MIN_LOG_SPREAD)


def _outlier_z(class_distance: np.ndarray, global_distance: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """min(overall z, within-class z) per row; a class too small for a spread is judged overall only."""
    finite = np.isfinite(global_distance)
    overall = np.full(len(labels), -np.inf)
    if finite.sum() >= MIN_SAMPLES:
        overall[finite] = _robust_z(global_distance[finite])
    within = np.full(len(labels), np.inf)
    own = class_distance[np.arange(len(labels)), labels]
    for c in np.unique(labels):
        members = np.flatnonzero((labels == c) & np.isfinite(own))
        if len(members) >= MIN_CLASS_FOR_SPREAD:
            within[members] = _robust_z(own[members])
    return np.minimum(overall, within)


def _label_evidence(class_distance: np.ndarray, labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Evidence per row (NaN where its class has no other member), the nearest other class, and the evidence
    every row would show under each wrong label it could have (the scores of label errors, by construction).
    QUERY_CHUNK rows at a time (the seeded share of wrong labels drawn in the same order as for all rows at once)."""
    n, num_classes = class_distance.shape
    if num_classes < 2:
        return np.full(n, np.nan), np.zeros(n, dtype=np.int64), np.zeros(0)
    evidence, suggested, kept = np.empty(n), np.empty(n, dtype=np.int64), []
    sampled = n * (num_classes - 1) > MAX_RELABELLINGS  # many classes: a seeded share of the wrong labels is enough
    draw = np.random.default_rng(seed)
    for start in range(0, n, QUERY_CHUNK):
        distance, label = class_distance[start : start + QUERY_CHUNK], labels[start : start + QUERY_CHUNK]
        rows = np.arange(len(distance))
        order = np.argsort(distance, axis=1, kind="stable")  # ties: the smaller class index first
        nearest, second = order[:, 0], order[:, 1]
        nearest_distance, second_distance = distance[rows, nearest], distance[rows, second]
        own = distance[rows, label]
        found = np.where(nearest == label, second, nearest)
        other = distance[rows, found]
        with np.errstate(invalid="ignore"):
            evidence[start : start + len(rows)] = np.where(np.isfinite(own) & np.isfinite(other), own - other, np.nan)
            # label g ≠ own: distance to g minus distance to the nearest class other than g
            relabelled = distance - nearest_distance[:, None]
            relabelled[rows, nearest] = nearest_distance - second_distance
        suggested[start : start + len(rows)] = found
        wrong = np.ones_like(relabelled, dtype=bool)
        wrong[rows, label] = False
        if sampled:
            wrong &= draw.random(relabelled.shape) < MAX_RELABELLINGS / (n * (num_classes - 1))
        kept.append(relabelled[wrong & np.isfinite(relabelled)])
    return evidence, suggested, np.concatenate(kept)


def _label_issue_precision(evidence: np.ndarray, relabelled: np.ndarray) -> tuple[np.ndarray, Optional[float]]:
    """Estimated precision of flagging every row whose evidence is at least this strong (0 where unknown), and the
    noise rate estimate. Made non-decreasing in the evidence, so the flagged set is everything above one cut."""
    precision = np.zeros(len(evidence))
    known = np.isfinite(evidence)
    if known.sum() < MIN_SAMPLES or len(relabelled) == 0:
        return precision, None
    observed = np.sort(evidence[known])
    wrong = np.sort(relabelled)

    def tail(sorted_values: np.ndarray, at: np.ndarray) -> np.ndarray:
        return (len(sorted_values) - np.searchsorted(sorted_values, at, side="left")) / len(sorted_values)

    typical_error = wrong[int(NOISE_QUANTILE * (len(wrong) - 1))]
    noise_estimate = float(min(1.0, tail(observed, np.array([typical_error]))[0] / tail(wrong, np.array([typical_error]))[0]))
    believable = min(noise_estimate, MAX_FLAGGED_FRACTION * MIN_PRECISION)  # so flags never exceed the fraction
    values = evidence[known]
    ratio = tail(observed, values) / np.maximum(tail(wrong, values), 1e-300)
    raw = np.minimum(1.0, believable / ratio)
    by_evidence = np.argsort(values, kind="stable")
    raw[by_evidence] = np.maximum.accumulate(raw[by_evidence])
    precision[known] = raw
    return precision, noise_estimate


def _ranked(rows: np.ndarray, score: np.ndarray, tie_break: np.ndarray, suggested: Optional[np.ndarray]) -> list[Flag]:
    """Flags for `rows`, highest score first, then strongest raw evidence, then row index."""
    order = np.lexsort((rows, -tie_break[rows], -score[rows]))
    return [Flag(int(rows[i]), float(score[rows[i]]), None if suggested is None else int(suggested[rows[i]])) for i in order]
