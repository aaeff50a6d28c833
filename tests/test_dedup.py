"""Duplicate detection: a stable perceptual hash, exact hash pairs, and near-duplicates proven by pixels on real
images (MNIST digits, photo patches): copies are linked, distinct pictures never."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from veritrain.data.dedup import (
    COSINE_SCALE,
    candidate_pairs,
    comparison_image,
    difference,
    exact_duplicate_groups,
    hamming,
    hash_pairs,
    near_duplicates,
    perceptual_hash,
    thumbnail,
)


def scene(kind: int, size: int = 96) -> np.ndarray:
    """A structured synthetic RGB image: a gradient with shapes, different for each kind."""
    y, x = np.mgrid[0:size, 0:size] / (size - 1)
    if kind == 0:  # diagonal gradient, bright disc, dark bar
        grey = 60 + 60 * (x + y)
        grey = np.where((x - 0.65) ** 2 + (y - 0.35) ** 2 < 0.04, 230, grey)
        grey = np.where((0.15 < x) & (x < 0.45) & (0.6 < y) & (y < 0.8), 20, grey)
    elif kind == 1:  # vertical gradient, dark disc lower left, bright square upper right
        grey = 200 - 150 * y
        grey = np.where((x - 0.3) ** 2 + (y - 0.7) ** 2 < 0.05, 30, grey)
        grey = np.where((0.6 < x) & (x < 0.9) & (0.1 < y) & (y < 0.4), 250, grey)
    else:  # horizontal stripes and a dark ring
        grey = 128 + 80 * np.sin(6 * np.pi * y)
        radius = (x - 0.5) ** 2 + (y - 0.5) ** 2
        grey = np.where((0.06 < radius) & (radius < 0.1), 0, grey)
    grey = np.rint(grey).astype(np.int64)
    return np.clip(np.stack([grey, grey + 20, grey - 30], axis=-1), 0, 255).astype(np.uint8)


def jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    buffer.seek(0)
    return np.asarray(Image.open(buffer).convert("RGB"))


# --- perceptual hash ---------------------------------------------------------------------------------


def test_hash_is_pinned():
    # The hash recipe is part of the data version (near-duplicate clusters decide splits): a change to it
    # must be deliberate and bump the version, never happen silently. These values must not change.
    assert perceptual_hash(scene(0)) == 0x9912666EC69D3DC4
    assert perceptual_hash(scene(1)[:, :, 0]) == 0xB794C63B48C8873D
    assert perceptual_hash(scene(2)[5:50, 3:73]) == 0xDCE38E90632E6595  # 45×70: cells cut through pixels
    assert perceptual_hash(scene(0)) == perceptual_hash(scene(0).copy())


def test_cosine_table_is_far_from_rounding_boundaries():
    # The fixed-point cosines are rounded once; if any sat near x.5, a libm differing in the last bit could
    # round it the other way on another machine and change hashes.
    u, x = np.arange(8)[:, None], np.arange(32)[None, :]
    scaled = COSINE_SCALE * np.cos(np.pi * (2 * x + 1) * u / 64)
    assert np.min(np.abs(scaled % 1 - 0.5)) > 1e-6


@pytest.mark.parametrize("kind", [0, 1])
def test_hash_survives_small_changes(kind):
    image = scene(kind)
    h = perceptual_hash(image)
    brighter = np.clip(image.astype(np.int64) + 3, 0, 255).astype(np.uint8)
    round_trip = np.asarray(Image.fromarray(image).resize((48, 48), Image.BOX).resize((96, 96), Image.BILINEAR))
    enlarged = np.asarray(Image.fromarray(image).resize((150, 150), Image.BILINEAR))
    noisy = image.copy()
    rng = np.random.default_rng(0)
    for i, j in rng.integers(0, 96, size=(5, 2)):
        noisy[i, j] = 255 - noisy[i, j]
    for changed in (brighter, round_trip, enlarged, noisy, jpeg(image, 75), jpeg(image, 50)):
        assert not np.array_equal(changed, image)
        assert hamming(h, perceptual_hash(changed)) <= 4


def test_hash_separates_different_images():
    hashes = [perceptual_hash(scene(kind)) for kind in range(3)]
    for a in range(3):
        for b in range(a + 1, 3):
            assert hamming(hashes[a], hashes[b]) > 10


def test_exact_integer_enlargement_gives_the_same_hash():
    image = scene(1, size=40)
    assert perceptual_hash(image.repeat(3, axis=0).repeat(3, axis=1)) == perceptual_hash(image)  # area filter


def test_grey_and_rgb_inputs():
    grey = scene(0)[:, :, 0]
    h = perceptual_hash(grey)
    assert perceptual_hash(grey[:, :, np.newaxis]) == h
    assert perceptual_hash(np.stack([grey] * 3, axis=-1)) == h  # equal channels: luma equals the grey value
    rgb = scene(1)
    as_grey = np.asarray(Image.fromarray(rgb).convert("L"))  # Pillow also uses the ITU-R 601 weights
    assert hamming(perceptual_hash(rgb), perceptual_hash(as_grey)) <= 2
    small = scene(2, size=8)  # smaller than 32×32: enlarged by the same area rule
    assert 0 <= perceptual_hash(small) < 2**64


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((16, 16), dtype=np.float32), "expected a uint8 image"),
        (np.zeros((16, 16, 4), dtype=np.uint8), "C = 1 or 3"),
        (np.zeros((16,), dtype=np.uint8), "C = 1 or 3"),
        (np.zeros((0, 16), dtype=np.uint8), "empty"),
    ],
)
def test_hash_rejects_bad_images(bad, message):
    with pytest.raises(ValueError, match=message):
        perceptual_hash(bad)


def test_hamming():
    assert hamming(0, 0) == 0
    assert hamming(0, 2**64 - 1) == 64
    assert hamming(0b1011, 0b0110) == 3


# --- hash pairs ---------------------------------------------------------------------------------------


def random_hashes(n: int, planted: int, seed: int) -> list[int]:
    """Random 64-bit hashes plus `planted` copies of earlier ones with 0-6 bits flipped."""
    rng = random.Random(seed)
    hashes = [rng.getrandbits(64) for _ in range(n)]
    for _ in range(planted):
        h = rng.choice(hashes)
        for _ in range(rng.randint(0, 6)):
            h ^= 1 << rng.randrange(64)
        hashes.append(h)
    return hashes


BRUTE_FORCE_HASHES = random_hashes(1500, planted=300, seed=5) + [7, 7]  # more than one block, with exact repeats


@pytest.fixture(scope="module")
def all_pair_distances() -> np.ndarray:
    """The brute force: the Hamming distance of every pair of BRUTE_FORCE_HASHES (XOR, then a popcount), once."""
    hashes = np.array(BRUTE_FORCE_HASHES, dtype=np.uint64)
    return np.bitwise_count(hashes[:, None] ^ hashes[None, :])


@pytest.mark.parametrize("radius", [0, 2, 4, 8])
def test_hash_pairs_equal_brute_force(radius, all_pair_distances):
    hashes = BRUTE_FORCE_HASHES
    found = {tuple(p) for p in hash_pairs(np.array(hashes, dtype=np.uint64), radius).tolist()}
    expected = {(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(all_pair_distances <= radius, k=1)))}
    assert found == expected
    assert (len(hashes) - 2, len(hashes) - 1) in found
    if radius >= 2:
        assert len(found) >= 100  # the planted near-duplicates are there to be found


def test_hash_pairs_of_long_runs_of_one_band_value_are_all_found_in_order(monkeypatch):
    """Hashes that share a band's value beyond LONG_RUN (600 blank frames, say) are paired a block at a time; the
    pairs come out sorted, each once, whichever band found them first."""
    from veritrain.data import dedup

    monkeypatch.setattr(dedup, "HASH_BLOCK_CELLS", 1 << 14)  # several blocks
    monkeypatch.setattr(dedup, "LONG_RUN", 256)
    rng = np.random.default_rng(5)
    hashes = np.concatenate([np.zeros(600, dtype=np.uint64), np.uint64(1) << rng.integers(0, 64, 40).astype(np.uint64),
                             rng.integers(0, 2**63, 500, dtype=np.uint64)])
    found = hash_pairs(hashes, 1)
    distances = dedup._popcount(hashes[:640, None] ^ hashes[None, :640])
    expected = np.argwhere(np.triu(distances <= 1, k=1))
    assert np.array_equal(found[found[:, 1] < 640], expected)
    assert np.array_equal(found, found[np.lexsort((found[:, 1], found[:, 0]))]) and len(np.unique(found, axis=0)) == len(found)


# --- near-duplicates on real images ------------------------------------------------------------------


def shifted(image: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """The picture moved by (dx, dy) pixels, the uncovered edge filled with black."""
    out = np.zeros_like(image)
    h, w = image.shape[:2]
    out[max(0, dy) : h + min(0, dy), max(0, dx) : w + min(0, dx)] = image[max(0, -dy) : h + min(0, -dy), max(0, -dx) : w + min(0, -dx)]
    return out


def brighter(image: np.ndarray, by: int) -> np.ndarray:
    return np.clip(image.astype(np.int64) + by, 0, 255).astype(np.uint8)


def features(images: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([perceptual_hash(i) for i in images], dtype=np.uint64), np.stack([comparison_image(i) for i in images]))


@pytest.fixture(scope="module")
def mnist():
    from realdata import mnist_arrays

    return mnist_arrays()


def test_distinct_mnist_digits_are_never_linked_but_their_copies_are(mnist):
    # 2,000 real digits (chained into clusters of hundreds by the old hash-only search) plus 40 copies:
    # brightness ±2 and 1-px shifts each way. Every copy is found, and nothing else is linked.
    images, _ = mnist
    originals = list(images[:2000])
    changes = [lambda x: brighter(x, 2), lambda x: brighter(x, -2), lambda x: shifted(x, 1, 0), lambda x: shifted(x, 0, -1)]
    copies = [changes[k % 4](originals[k * 37]) for k in range(40)]
    phashes, pictures = features(originals + copies)
    found = near_duplicates(phashes, pictures, max_hash_distance=4, max_difference=0.1)
    expected = {(k * 37, 2000 + k) for k in range(40)}
    assert {tuple(p) for p in found.pairs.tolist()} == expected
    assert sorted(map(tuple, found.components)) == sorted(expected)
    assert found.differences.max() < 0.05  # the copies are far inside the threshold ...
    sample = candidate_pairs(phashes[:2000], pictures[:2000], 4)
    assert difference(pictures[sample[:, 0]], pictures[sample[:, 1]]).min() > 0.15  # ... and distinct digits far outside it


def test_beyond_the_brute_force_search_hashed_neighbours_still_find_every_copy(mnist, monkeypatch):
    """Past EXACT_NEIGHBOURS_UP_TO pictures the nearest spectra come from hashed buckets (whole-number arithmetic):
    the same 2,000 digits and 40 copies as above, searched that way, give the same confirmed pairs, and the same
    candidates on every call."""
    from veritrain.data import dedup

    images, _ = mnist
    originals = list(images[:2000])
    changes = [lambda x: brighter(x, 2), lambda x: brighter(x, -2), lambda x: shifted(x, 1, 0), lambda x: shifted(x, 0, -1)]
    copies = [changes[k % 4](originals[k * 37]) for k in range(40)]
    phashes, pictures = features(originals + copies)
    monkeypatch.setattr(dedup, "EXACT_NEIGHBOURS_UP_TO", 0)
    monkeypatch.setattr(dedup, "SPECTRUM_BUCKET", 16)  # buckets as full as a million pictures' would be, relatively
    found = near_duplicates(phashes, pictures, max_hash_distance=4, max_difference=0.1)
    assert {tuple(p) for p in found.pairs.tolist()} == {(k * 37, 2000 + k) for k in range(40)}
    spectra = dedup._spectra(pictures)
    first, again = dedup.hashed_neighbours(spectra, 5), dedup.hashed_neighbours(spectra, 5)
    assert np.array_equal(first, again) and len(first) <= 5 * len(spectra) and (first[:, 0] != first[:, 1]).all()


def test_distinct_photo_patches_are_never_linked_but_their_copies_are():
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    patches = [photo[y : y + 32, x : x + 32] for photo in photos for y in range(0, 400, 40) for x in range(0, 600, 40)]
    # copies: brightness ±2, and the same scene cut one pixel further right or down (a 1-px shift with no black edge)
    copies, expected = [], set()
    for k, index in enumerate(range(0, len(patches) // 2, 23)):
        photo, y, x = photos[0], (index // 15) * 40, (index % 15) * 40
        copy = [brighter(patches[index], 2), brighter(patches[index], -2), photo[y + 1 : y + 33, x : x + 32], photo[y : y + 32, x + 1 : x + 33]][k % 4]
        expected.add((index, len(patches) + len(copies)))
        copies.append(copy)
    found = near_duplicates(*features(patches + copies), max_hash_distance=4, max_difference=0.1)
    assert {tuple(p) for p in found.pairs.tolist()} == expected


def test_difference_is_exact_and_symmetric():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, size=(50, 28, 28), dtype=np.uint8)
    b = rng.integers(0, 256, size=(50, 28, 28), dtype=np.uint8)
    assert np.array_equal(difference(a, b), difference(b, a))
    assert np.array_equal(difference(a, a), np.zeros(50))
    assert np.array_equal(difference(a, shifted(a.transpose(1, 2, 0), 1, 1).transpose(2, 0, 1)), np.zeros(50))
    assert (difference(a, b) > 0.9).all()  # unrelated noise: about √2
    flat = np.full((1, 28, 28), 40, dtype=np.uint8)
    assert difference(flat, flat + 1)[0] == 0.0  # flat pictures: the floor keeps the value defined


def test_thumbnail_and_comparison_picture():
    image = scene(0, size=64)
    small = thumbnail(image)
    assert small.shape == (16, 16, 3) and small.dtype == np.uint8
    assert np.array_equal(thumbnail(image.repeat(2, axis=0).repeat(2, axis=1)), small)  # area rule: exact
    assert comparison_image(image).shape == (32, 32)
    digit = np.arange(28 * 28, dtype=np.uint8).reshape(28, 28)
    assert np.array_equal(comparison_image(digit), digit)  # small pictures keep their pixels
    assert comparison_image(np.stack([digit] * 3, axis=-1)).tolist() == digit.tolist()  # equal channels: luma is the grey value


def test_exact_duplicate_groups():
    assert exact_duplicate_groups(["a", "b", "a", "c", "b", "a"]) == [[0, 2, 5], [1, 4]]
    assert exact_duplicate_groups(["a", "b"]) == []
    assert exact_duplicate_groups([]) == []


def test_candidates_come_in_disjoint_blocks_that_near_duplicates_compares_as_they_come(mnist, monkeypatch):
    """near_duplicates never holds every candidate pair (their number grows faster than the pictures'): the blocks
    of candidate_blocks are disjoint, together they are candidate_pairs, whatever the block size, and the pairs,
    differences and candidate count near_duplicates gives do not depend on it."""
    from veritrain.data import dedup

    images, _ = mnist
    originals = list(images[:1500])
    copies = [brighter(originals[k * 31], 2) for k in range(30)]
    phashes, pictures = features(originals + copies)
    n = len(phashes)
    expected = candidate_pairs(phashes, pictures, 6)
    reference = near_duplicates(phashes, pictures, max_hash_distance=6, max_difference=0.1)
    monkeypatch.setattr(dedup, "HASH_BLOCK_CELLS", 64)
    blocks = list(dedup.candidate_blocks(phashes, pictures, 6))
    codes = np.concatenate(blocks)
    assert len(blocks) > 10 and len(np.unique(codes)) == len(codes) == len(expected)
    assert np.array_equal(np.sort(codes), expected[:, 0] * n + expected[:, 1])
    small = near_duplicates(phashes, pictures, max_hash_distance=6, max_difference=0.1)
    assert np.array_equal(small.pairs, reference.pairs) and np.array_equal(small.differences, reference.differences)
    assert small.candidates == reference.candidates == len(expected) and len(small.pairs) >= 30
