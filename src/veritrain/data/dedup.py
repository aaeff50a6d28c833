"""Duplicate detection for the data stage: exact copies by content hash, near-duplicates by proof in pixels.

Near-duplicates (re-encoded, resized, brightened or shifted copies of one picture) are proposed by two indexes,
a 64-bit DCT perceptual hash within a Hamming radius and nearest neighbours by a shift-tolerant spectrum, and a
pair counts only when the two pictures match pixel for pixel after aligning them (`difference`). The data
stage keeps each connected group of confirmed pairs in one split. numpy, scipy and scikit-learn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from veritrain.data.row_images import Images, RowImages, RowView

HASH_BITS = 64
HASH_SIDE = 32  # the grey image is resized to 32×32 before the DCT
LOW_FREQUENCIES = 8  # the top-left 8×8 DCT coefficients make the 64 bits
COSINE_SCALE = 1 << 14  # fixed-point DCT: cosines rounded to multiples of 1/16384 (integer arithmetic, exact)
LUMA_PER_MILLE = (299, 587, 114)  # ITU-R BT.601 weights for R, G, B, in thousandths (grey is 1000× its value)

# cos(π(2x+1)u / 64) for u < 8, x < 32, rounded to integers: integer maths makes the hash bit-identical on any
# machine or BLAS. No entry lies within 1e-6 of a rounding boundary (tested), so libm differences cannot move it.
_COSINES = np.array(
    [[round(COSINE_SCALE * math.cos(math.pi * (2 * x + 1) * u / (2 * HASH_SIDE))) for x in range(HASH_SIDE)]
     for u in range(LOW_FREQUENCIES)],
    dtype=np.int64,
)


def perceptual_hash(image: np.ndarray) -> int:
    """A 64-bit DCT perceptual hash (pHash) of a uint8 image, H×W or H×W×C with C = 1 or 3.

    Close images get hashes a few bits apart; different images differ in about half of the 64 bits.
    The recipe is part of the data version, so it is exact integer arithmetic, identical on every machine:

    1. Grey, in thousandths: 1000·v for one channel, 299·R + 587·G + 114·B for three (ITU-R BT.601).
    2. Area (box) resize to 32×32: output pixel (i, j) is the mean of the grey image over the source rectangle
       [i·H/32, (i+1)·H/32) × [j·W/32, (j+1)·W/32), each source pixel weighted by its overlap (so images smaller
       than 32 px are enlarged by the same rule); the mean is rounded half up to an integer.
    3. Unnormalised 2-D DCT-II of the low frequencies in fixed point: coefficient (u, v) for u, v < 8 is
       Σ_y Σ_x C[u, y]·P[y, x]·C[v, x] with C[u, x] = round(16384·cos(π(2x+1)u/64)), in int64 (no overflow:
       magnitudes are at most 255000·2^38 < 2^56). Up to a common factor and the rounding of the cosines, this is scipy's
       `dct(dct(P, axis=0), axis=1)[:8, :8]` with norm=None.
    4. The median is the 32nd smallest of the 63 coefficients other than the DC term (0, 0); bit k of the 64,
       for coefficient (u, v) with k = 8u + v, is 1 where that coefficient is strictly greater than the median
       (the DC bit included, so it is 1 for any image that is not all black).
    5. The hash is the bits read as a big-endian integer: coefficient (0, 0) is the most significant bit.
    """
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise ValueError(f"perceptual_hash: expected a uint8 image, got dtype {array.dtype}")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim == 2:
        grey = array.astype(np.float64) * 1000
    elif array.ndim == 3 and array.shape[2] == 3:
        rgb = array.astype(np.float64)
        grey = LUMA_PER_MILLE[0] * rgb[:, :, 0] + LUMA_PER_MILLE[1] * rgb[:, :, 1] + LUMA_PER_MILLE[2] * rgb[:, :, 2]
    else:
        raise ValueError(f"perceptual_hash: expected an H×W or H×W×C image with C = 1 or 3, got shape {array.shape}")
    height, width = grey.shape
    pixels = height * width
    if pixels == 0:
        raise ValueError(f"perceptual_hash: the image is empty (shape {array.shape})")
    if 255_000 * pixels >= 2**53:
        raise ValueError(f"perceptual_hash: image of {pixels} pixels is too large to hash exactly")

    # float64 holding integers below 2^53: every product and partial sum is exact, whatever the BLAS order
    area_sums = _box_weights(height) @ grey @ _box_weights(width).T
    small = (2 * area_sums.astype(np.int64) + pixels) // (2 * pixels)  # the area mean, rounded half up
    coefficients = (_COSINES @ small @ _COSINES.T).ravel()
    median = np.sort(coefficients[1:])[(coefficients.size - 1) // 2]
    bits = coefficients > median
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def _box_weights(n: int, side: int = HASH_SIDE) -> np.ndarray:
    """Overlap of each source pixel with each of the `side` output cells, in units of 1/side pixel: shape (side, n).

    Output cell i spans [i·n, (i+1)·n) and source pixel r spans [side·r, side·r + side) on that scale; each row sums to n.
    """
    cell = np.arange(side)[:, None]
    source = np.arange(n)[None, :]
    start = np.maximum(cell * n, source * side)
    stop = np.minimum((cell + 1) * n, (source + 1) * side)
    return np.maximum(stop - start, 0).astype(np.float64)


THUMBNAIL_SIDE = 16  # px: the small picture near-duplicates are confirmed on and label issues are judged from


def thumbnail(image: np.ndarray, side: int = THUMBNAIL_SIDE) -> np.ndarray:
    """A uint8 side×side×C area (box) resize of a uint8 image (H×W or H×W×C), exact on every machine.

    Output pixel (i, j) of each channel is the mean over the source rectangle [i·H/side, (i+1)·H/side) ×
    [j·W/side, (j+1)·W/side), each source pixel weighted by its overlap, rounded half up (the rule the
    perceptual hash resizes by). Integer sums held in float64 below 2^53 make it independent of BLAS order.
    """
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise ValueError(f"thumbnail: expected a uint8 image, got dtype {array.dtype}")
    if array.ndim == 2:
        array = array[:, :, np.newaxis]
    if array.ndim != 3 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"thumbnail: expected an H×W or H×W×C image, got shape {np.asarray(image).shape}")
    height, width, channels = array.shape
    pixels = height * width
    if 255 * pixels * side * side >= 2**53:
        raise ValueError(f"thumbnail: image of {pixels} pixels is too large to resize exactly")
    rows, cols = _box_weights(height, side), _box_weights(width, side)
    values = array.astype(np.float64)
    out = np.empty((side, side, channels), dtype=np.uint8)
    for c in range(channels):
        sums = (rows @ values[:, :, c] @ cols.T).astype(np.int64)  # in units of 1/side² of a pixel
        out[:, :, c] = (2 * sums + pixels) // (2 * pixels)
    return out


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two hashes."""
    return (a ^ b).bit_count()


# --------------------------------------------------------------------- near-duplicates: candidates, then proof

COMPARISON_SIDE = 32  # px: images larger than this are area-resized to 32×32 grey before they are compared
SPECTRUM_SIDE = 8  # the lowest 8×8 spatial frequencies of the Fourier magnitude make the translation-tolerant feature
SHIFT_RADIUS = 1  # px: pixel comparisons try every offset within ±1 px in each direction
CONFIRM_CHUNK = 1024  # candidate pairs compared at once (bounds memory: 2 × 1024 × 32 × 32 × 8 bytes = 16 MiB)
HASH_BLOCK_CELLS = 1 << 20  # hash pairs XORed at once: 1 Mi pairs, 8 MiB of uint64 (with its temporaries about 40 MiB)
LONG_RUN = 2048  # hashes sharing a band's value beyond which their pairs are made a block of rows at a time
KNN_WORKING_MEMORY = 32  # MiB scikit-learn may use for each chunk of neighbour distances (its default is 1 GiB)
EXACT_NEIGHBOURS_UP_TO = 50_000  # pictures up to which each one's nearest spectra are found by brute force (beyond: hashed_neighbours)
SPECTRUM_TABLES, SPECTRUM_BUCKET, MAX_BUCKET = 4, 64, 1024  # hashed_neighbours: tables, rows a bucket holds on average, at most
SPECTRUM_SCALE = 1 << 12  # unit spectra rounded to multiples of 1/4096 for whole-number arithmetic
SPECTRUM_SEED = 20261207  # the random ±1 vectors of hashed_neighbours' buckets


def comparison_image(image: np.ndarray) -> np.ndarray:
    """The grey uint8 picture two near-duplicate candidates are compared on: the image itself when neither side
    exceeds 32 px (so a 1-px shift of a 28×28 digit stays a whole-pixel shift), else its 32×32 area resize.

    Grey is the integer BT.601 luma round((299·R + 587·G + 114·B) / 1000), exact on every machine.
    """
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[2] == 3:
        luma = array.astype(np.int64) @ np.array(LUMA_PER_MILLE, dtype=np.int64)
        array = ((luma + 500) // 1000).astype(np.uint8)
    elif array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim != 2 or array.dtype != np.uint8:
        raise ValueError(f"comparison_image: expected a uint8 H×W or H×W×C image with C = 1 or 3, got {array.dtype} {np.asarray(image).shape}")
    if max(array.shape) <= COMPARISON_SIDE:
        return np.ascontiguousarray(array)
    return thumbnail(array, COMPARISON_SIDE)[:, :, 0]


def _spectra(pictures: Images) -> np.ndarray:
    """Unit-length low-frequency Fourier magnitudes of each picture with its mean removed: a shift of the
    picture leaves them (nearly) unchanged, so a shifted copy is among an image's nearest neighbours here."""
    spectra = np.empty((len(pictures), SPECTRUM_SIDE * SPECTRUM_SIDE))
    for start in range(0, len(pictures), CONFIRM_CHUNK):  # in chunks: a float64 copy and its FFT take ~17 KB a picture
        grey = pictures[start : start + CONFIRM_CHUNK].astype(np.float64)
        grey -= grey.mean(axis=(1, 2), keepdims=True)
        magnitudes = np.abs(np.fft.rfft2(grey))[:, :SPECTRUM_SIDE, :SPECTRUM_SIDE].reshape(len(grey), -1)
        spectra[start : start + CONFIRM_CHUNK] = magnitudes / np.maximum(np.linalg.norm(magnitudes, axis=1, keepdims=True), 1e-9)
    return spectra


def candidate_pairs(phashes: np.ndarray, pictures: Images, max_hash_distance: int, neighbours: int = 5) -> np.ndarray:
    """Pairs (i < j) worth comparing pixel by pixel, as an int64 array P×2, sorted, without repeats.

    Two indexes feed it: perceptual hashes within `max_hash_distance` bits (re-encodes, resizes, brightness),
    and each picture's `neighbours` nearest pictures by translation-tolerant spectrum (scikit-learn's
    NearestNeighbors), which finds shifted copies whose perceptual hash moves 14–22 bits on 28×28 digits.
    Candidates are only proposals: `near_duplicates` keeps a pair only when its pixels prove it.
    """
    n = len(phashes)
    found = list(candidate_blocks(phashes, pictures, max_hash_distance, neighbours))
    codes = np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    return np.stack([codes // n, codes % n], axis=1)


def candidate_blocks(phashes: np.ndarray, pictures: Images, max_hash_distance: int, neighbours: int = 5) -> Iterator[np.ndarray]:
    """The pairs of `candidate_pairs` as int64 codes i · n + j, a block at a time, no pair in two blocks: the hash
    pairs as `hash_code_blocks` finds them, then the spectrum neighbours that are not hash pairs. So a caller can
    compare each block as it comes, never holding every candidate (their number grows faster than the pictures')."""
    from sklearn import config_context
    from sklearn.neighbors import NearestNeighbors

    n = len(phashes)
    if n < 2:
        return
    hashes = np.asarray(phashes, dtype=np.uint64)
    yield from hash_code_blocks(hashes, max_hash_distance)
    k = min(neighbours + 1, n)
    if n <= EXACT_NEIGHBOURS_UP_TO:
        spectra = _spectra(pictures)
        with config_context(working_memory=KNN_WORKING_MEMORY):
            nearest = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(spectra).kneighbors(spectra, return_distance=False)
        near = np.stack([np.repeat(np.arange(n), k), nearest.ravel()], axis=1)
    else:
        near = _hashed_neighbours(_rounded_spectra(pictures), neighbours)
    first, second = np.minimum(near[:, 0], near[:, 1]).astype(np.int64), np.maximum(near[:, 0], near[:, 1]).astype(np.int64)
    del near
    fresh = (first != second) & (_popcount(hashes[first] ^ hashes[second]) > max_hash_distance)  # hash pairs came first
    codes = np.unique(first[fresh] * n + second[fresh])
    if len(codes):
        yield codes


def _rounded_spectra(pictures: Images) -> Images:
    """The unit spectra (`_spectra`) rounded to multiples of 1/SPECTRUM_SCALE, int16 N × SPECTRUM_SIDE², a chunk of
    pictures at a time: in a scratch file beside the pictures when they are read from one (row_images), else in memory."""
    n = len(pictures)
    if isinstance(pictures, RowView) and pictures.images.path is not None:
        stored = RowImages(pictures.images.path.with_name("spectra.i16"), n, dtype=np.int16)
        for start in range(0, n, CONFIRM_CHUNK):
            stored.put_rows(start, np.rint(_spectra(pictures[start : start + CONFIRM_CHUNK]) * SPECTRUM_SCALE))
        return stored.of(np.arange(n))
    return np.rint(_spectra(pictures) * SPECTRUM_SCALE).astype(np.int16)


def hashed_neighbours(spectra: np.ndarray, neighbours: int) -> np.ndarray:
    """Each row's `neighbours` nearest other rows among those that share one of SPECTRUM_TABLES buckets with it, as
    pairs (row, neighbour): an approximate nearest-neighbour search for more pictures than a brute-force one affords.

    The rows are rounded to whole numbers (SPECTRUM_SCALE) and centred; each table's bucket is the signs of their
    products with fixed random ±1 vectors (a seeded generator), as many bits as put SPECTRUM_BUCKET rows in a bucket on
    average; within a bucket, squared distances are compared, ties by row. Whole-number arithmetic throughout (products
    of numbers this small are exact in float64 too, which BLAS computes fast), so the buckets and the neighbours are
    the same on every machine and BLAS. Two spectra a few degrees apart, as a picture's
    and its shifted copy's are, share a bucket in at least one of four tables with a probability above 0.99."""
    return _hashed_neighbours(np.rint(np.asarray(spectra) * SPECTRUM_SCALE).astype(np.int16), neighbours)


def _hashed_neighbours(rows: Images, neighbours: int) -> np.ndarray:
    """`hashed_neighbours` of spectra rounded already (int16, `_rounded_spectra`), read CONFIRM_CHUNK rows at a time
    for the buckets and a bucket block at a time for the distances; each row's nearest so far are kept as they come
    (`_merge_nearest`), so memory holds them and one block's distances, not every table's candidates at once."""
    n = len(rows)
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    total = np.zeros(rows.shape[1], dtype=np.int64)
    for start in range(0, n, CONFIRM_CHUNK):
        total += rows[start : start + CONFIRM_CHUNK].astype(np.int64).sum(axis=0)
    mean = np.rint(total / n).astype(np.int64)  # the exact sum over n: as the whole array's mean, since every partial sum is exact
    bits = int(min(62, max(1, np.ceil(np.log2(n / SPECTRUM_BUCKET)))))
    signs = np.random.default_rng(SPECTRUM_SEED).integers(0, 2, size=(SPECTRUM_TABLES, rows.shape[1], bits)) * 2 - 1
    weights = np.int64(1) << np.arange(bits, dtype=np.int64)
    # whole numbers below 2^53 in float64, so BLAS products of them are exact whatever the order of summing
    signs = signs.astype(np.float64)
    best_j = np.full((n, neighbours), -1, dtype=np.int32 if n < 2**31 else np.int64)
    best_d = np.full((n, neighbours), np.iinfo(np.int64).max, dtype=np.int64)
    for table in range(SPECTRUM_TABLES):
        codes = np.empty(n, dtype=np.int64)
        for start in range(0, n, CONFIRM_CHUNK):
            centred = (rows[start : start + CONFIRM_CHUNK].astype(np.int64) - mean).astype(np.float64)
            codes[start : start + len(centred)] = ((centred @ signs[table]) > 0).astype(np.int64) @ weights
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        del codes
        starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
        ends = np.concatenate([starts[1:], [n]])
        del ordered
        # an overfull bucket is taken in blocks of consecutive rows; blocks of one length are compared together
        blocks = [(block, min(block + MAX_BUCKET, end)) for start, end in zip(starts.tolist(), ends.tolist())
                  for block in range(start, end, MAX_BUCKET)]
        begins = np.array([a for a, _ in blocks], dtype=np.int64)
        lengths = np.array([b - a for a, b in blocks], dtype=np.int64)
        for length in np.unique(lengths[lengths > 1]).tolist():
            take = min(neighbours, length - 1)
            same = begins[lengths == length]
            at_once = max(1, (1 << 20) // (length * length))  # about 8 MiB of distances at once
            for chunk in range(0, len(same), at_once):
                members = order[same[chunk:chunk + at_once, None] + np.arange(length)]  # B × length
                x = rows[members.ravel()].reshape(*members.shape, -1).astype(np.int64)
                squared = (x * x).sum(axis=2)
                gram = np.matmul(x.astype(np.float64), x.transpose(0, 2, 1).astype(np.float64)).astype(np.int64)  # exact: see above
                distance = squared[:, :, None] + squared[:, None, :] - 2 * gram
                distance[:, np.arange(length), np.arange(length)] = np.iinfo(np.int64).max
                nearest = np.argsort(distance, axis=2, kind="stable")[:, :, :take]
                _merge_nearest(best_j, best_d, members.ravel(), np.take_along_axis(members[:, None, :], nearest, axis=2).reshape(-1, take),
                               np.take_along_axis(distance, nearest, axis=2).reshape(-1, take))
    i = np.repeat(np.arange(n, dtype=np.int64), neighbours)
    j = best_j.ravel().astype(np.int64)
    return np.stack([i[j >= 0], j[j >= 0]], axis=1)


def _merge_nearest(best_j: np.ndarray, best_d: np.ndarray, rows: np.ndarray, found_j: np.ndarray, found_d: np.ndarray) -> None:
    """Rows `rows` (distinct) keep their `best_j.shape[1]` nearest of what they had and what was `found`: nearest
    first, ties by neighbour, a neighbour found twice (by two tables, at one distance) once."""
    k = best_j.shape[1]
    j = np.concatenate([best_j[rows].astype(np.int64), found_j], axis=1)
    d = np.concatenate([best_d[rows], found_d], axis=1)
    j = np.where(j < 0, np.iinfo(np.int64).max, j)  # empty places last
    row = np.repeat(np.arange(len(rows)), j.shape[1])
    order = np.lexsort((j.ravel(), d.ravel(), row))
    j, d, row = j.ravel()[order], d.ravel()[order], row[order]
    again = np.concatenate([[False], (row[1:] == row[:-1]) & (j[1:] == j[:-1])])
    j, d, row = j[~again], d[~again], row[~again]
    rank = np.arange(len(row)) - np.searchsorted(row, row, side="left")
    keep = rank < k
    j = np.where(j[keep] == np.iinfo(np.int64).max, -1, j[keep])
    best_j[rows[row[keep]], rank[keep]] = j
    best_d[rows[row[keep]], rank[keep]] = d[keep]


def hash_pairs(hashes: np.ndarray, max_distance: int) -> np.ndarray:
    """`hash_pair_codes` as pairs: an int64 array P×2 sorted by i then j."""
    codes = hash_pair_codes(hashes, max_distance)
    n = len(hashes)
    return np.stack([codes // n, codes % n], axis=1) if len(codes) else np.zeros((0, 2), dtype=np.int64)


def hash_pair_codes(hashes: np.ndarray, max_distance: int) -> np.ndarray:
    """Every pair (i < j) of 64-bit hashes within `max_distance` differing bits, exactly, each as the int64 code
    i · n + j, sorted (so by i, then j). Two hashes that differ in at most d bits agree exactly on at least one of d + 1 disjoint bands of
    their bits (pigeonhole), so each band's hashes are sorted by the band's value and only those sharing it are
    compared: about n²/2^b pairs a band for bands of b bits (13 for d = 4), where XORing every pair took 0.2 s for
    10,000 hashes and 5 s for 40,000 (and a day for a million). A pair is kept at the first band it agrees on."""
    found = list(hash_code_blocks(hashes, max_distance))
    return np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def hash_code_blocks(hashes: np.ndarray, max_distance: int) -> Iterator[np.ndarray]:
    """The codes of `hash_pair_codes`, a block at a time as they are found (about HASH_BLOCK_CELLS pairs compared a
    block), unsorted; no pair in two blocks."""
    hashes = np.asarray(hashes, dtype=np.uint64)
    n = len(hashes)
    if n < 2:
        return
    bands = min(max_distance + 1, HASH_BITS)
    widths = [HASH_BITS // bands + (1 if b < HASH_BITS % bands else 0) for b in range(bands)]
    shifts = np.cumsum([0] + widths[:-1])
    for band, (shift, width) in enumerate(zip(shifts.tolist(), widths)):
        keys = (hashes >> np.uint64(shift)) & np.uint64((1 << width) - 1)
        order = np.argsort(keys, kind="stable")
        for a, b in _pairs_within_runs(order, keys[order]):
            x = hashes[a] ^ hashes[b]
            keep = _popcount(x) <= max_distance
            for earlier in range(band):  # agreeing on an earlier band: found there already
                mask = np.uint64(((1 << widths[earlier]) - 1) << int(shifts[earlier]))
                keep &= (x & mask) != 0
            a, b = a[keep].astype(np.int64), b[keep].astype(np.int64)
            if len(a):
                yield np.minimum(a, b) * n + np.maximum(a, b)  # one int64 a pair: half of two columns


def _pairs_within_runs(order: np.ndarray, sorted_keys: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Every pair of positions whose keys are equal (`order` sorts the keys to `sorted_keys`), as indices into the
    unsorted array, about HASH_BLOCK_CELLS pairs at a time: runs of one length together, a long run in blocks."""
    starts = np.flatnonzero(np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]]))
    lengths = np.diff(np.concatenate([starts, [len(sorted_keys)]]))
    for length in np.unique(lengths[lengths > 1]).tolist():
        runs = starts[lengths == length]
        if length > LONG_RUN:  # rows of the run against the rows after them, a block of rows at a time
            rows_at_once = max(1, HASH_BLOCK_CELLS // length)
            for run in runs.tolist():
                for first in range(0, length - 1, rows_at_once):
                    rows = np.arange(first, min(first + rows_at_once, length))
                    cols = np.arange(first, length)
                    later = cols[None, :] > rows[:, None]
                    a, b = np.broadcast_to(rows[:, None], later.shape)[later], np.broadcast_to(cols[None, :], later.shape)[later]
                    yield order[run + a], order[run + b]
            continue
        left, right = np.triu_indices(length, k=1)
        per_chunk = max(1, HASH_BLOCK_CELLS // len(left))
        for begin in range(0, len(runs), per_chunk):
            base = runs[begin:begin + per_chunk, None]
            yield order[(base + left).ravel()], order[(base + right).ravel()]


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(x)
    per_byte = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
    return per_byte[x.reshape(-1, 1).view(np.uint8)].sum(axis=1, dtype=np.uint8).reshape(x.shape)


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How unlike two batches of grey pictures (P×S×S uint8) are, after the best alignment within ±1 px:
    for each offset, over the overlapping pixels, ‖a' − b'‖ / max(‖a'‖, ‖b'‖, 4·√pixels) where ' removes the
    mean (so brightness offsets do not count; the floor, a spread of 4 grey levels, keeps nearly flat pictures
    from amplifying noise; two distinct patches of plain sky, spread 2, measure 0.18 under it); the
    smallest value over offsets. 0 for a lossless copy or an exact shift, about 0.2 and more between distinct
    MNIST digits of the same class. The sums are exact integers, so the value is the same on every machine.
    """
    a = a.astype(np.int64)
    b = b.astype(np.int64)
    best = np.full(len(a), np.inf)
    height, width = a.shape[1:]
    r = SHIFT_RADIUS
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            part_a = a[:, max(0, dy) : height + min(0, dy), max(0, dx) : width + min(0, dx)]
            part_b = b[:, max(0, -dy) : height + min(0, -dy), max(0, -dx) : width + min(0, -dx)]
            pixels = part_a.shape[1] * part_a.shape[2]
            sum_a, sum_b = part_a.sum(axis=(1, 2)), part_b.sum(axis=(1, 2))
            # with x' = pixels·x − Σx (the mean removed, scaled to stay an integer): Σx'² = pixels·(pixels·Σx² − (Σx)²)
            # and Σ(a' − b')² = Σa'² + Σb'² − 2·pixels·(pixels·Σab − Σa·Σb); every term is below 2^63
            spread_a = pixels * (pixels * np.einsum("pij,pij->p", part_a, part_a) - sum_a * sum_a)
            spread_b = pixels * (pixels * np.einsum("pij,pij->p", part_b, part_b) - sum_b * sum_b)
            shared = pixels * (pixels * np.einsum("pij,pij->p", part_a, part_b) - sum_a * sum_b)
            apart = spread_a + spread_b - 2 * shared
            scale = np.maximum(np.maximum(spread_a, spread_b), 16 * pixels**3)
            best = np.minimum(best, np.sqrt(apart / scale))
    return best


@dataclass
class NearDuplicates:
    pairs: np.ndarray  # P×2 confirmed pairs (i < j) of item indices, sorted
    differences: np.ndarray  # P: `difference` of each confirmed pair
    components: list[list[int]]  # connected components of the confirmed pairs, two or more items each, sorted
    candidates: int  # pairs proposed by the indexes and compared


def near_duplicates(phashes: np.ndarray, pictures: Images, max_hash_distance: int, max_difference: float) -> NearDuplicates:
    """Near-duplicate pairs proven by pixels: candidates from the indexes, kept when their `difference` is at
    most `max_difference`; items are grouped by scipy's connected components of the kept pairs only, so a
    chain of merely similar images never joins a group."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(phashes)
    kept, values, candidates = [], [], 0
    for codes in candidate_blocks(phashes, pictures, max_hash_distance):  # compared as they come: never all held
        candidates += len(codes)
        for start in range(0, len(codes), CONFIRM_CHUNK):
            chunk = codes[start : start + CONFIRM_CHUNK]
            found = difference(pictures[chunk // n], pictures[chunk % n])
            close = found <= max_difference
            kept.append(chunk[close])
            values.append(found[close])
    confirmed = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    order = np.argsort(confirmed)
    pairs = np.stack([confirmed[order] // n, confirmed[order] % n], axis=1) if len(confirmed) else np.zeros((0, 2), dtype=np.int64)
    differences = np.concatenate(values)[order] if values else np.zeros(0)
    components: list[list[int]] = []
    if len(pairs):
        graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
        _, label_of = connected_components(graph, directed=False)
        members: dict[int, list[int]] = {}
        for item in np.unique(pairs):
            members.setdefault(int(label_of[item]), []).append(int(item))
        components = sorted(members.values())
    return NearDuplicates(pairs, differences, components, candidates)


def exact_duplicate_groups(content_hashes: Sequence[str]) -> list[list[int]]:
    """Indices that share a content hash: groups of two or more, each sorted, ordered by first index."""
    by_hash: dict[str, list[int]] = {}
    for index, digest in enumerate(content_hashes):
        by_hash.setdefault(digest, []).append(index)
    return [group for group in by_hash.values() if len(group) >= 2]
