"""Duplicate detection: a stable perceptual hash, a BK-tree that agrees with brute force, and clusters."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from veritrain.data.dedup import (
    COSINE_SCALE,
    BKTree,
    Cluster,
    exact_duplicate_groups,
    hamming,
    near_duplicate_clusters,
    perceptual_hash,
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


# --- BK-tree -----------------------------------------------------------------------------------------


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


def all_distances(hashes: list[int]) -> np.ndarray:
    values = np.array(hashes, dtype=np.uint64)
    return np.bitwise_count(values[:, None] ^ values[None, :]).astype(np.int64)


@pytest.fixture(scope="module")
def tree_and_hashes():
    hashes = random_hashes(2500, planted=500, seed=1)
    tree = BKTree()
    for i, h in enumerate(hashes):
        tree.add(i, h)
    return tree, hashes, all_distances(hashes)


@pytest.mark.parametrize("radius", [0, 2, 4, 8])
def test_query_equals_brute_force(tree_and_hashes, radius):
    tree, hashes, distances = tree_and_hashes
    n = len(hashes)
    rng = random.Random(radius)
    for q in rng.sample(range(n), 20):
        near = np.flatnonzero(distances[q] <= radius).tolist()
        expected = sorted(((i, int(distances[q, i])) for i in near), key=lambda hit: (hit[1], hit[0]))
        before = tree.distance_calls
        assert tree.query(hashes[q], radius) == expected
        if radius <= 4:
            assert tree.distance_calls - before < n / 4  # the triangle inequality prunes most of the tree


@pytest.mark.parametrize("radius", [0, 2, 4, 8])
def test_pairs_equal_brute_force(tree_and_hashes, radius):
    tree, hashes, distances = tree_and_hashes
    n = len(hashes)
    a, b = np.nonzero(np.triu(distances <= radius, k=1))
    expected = sorted(zip(a.tolist(), b.tolist(), distances[a, b].tolist()))
    before = tree.distance_calls
    found = tree.pairs(radius)
    assert found == expected
    if radius >= 2:
        assert len(found) >= 100  # the planted near-duplicates are there to be found
    if radius <= 4:
        assert tree.distance_calls - before < 0.25 * n * n / 2  # far below comparing all pairs


def test_tree_keeps_exact_repeats_in_one_node():
    tree = BKTree()
    for item, h in enumerate([5, 7, 5, 2**64 - 1, 5]):
        tree.add(item, h)
    assert len(tree) == 5
    assert tree.query(5, 0) == [(0, 0), (2, 0), (4, 0)]
    assert tree.query(5, 1) == [(0, 0), (2, 0), (4, 0), (1, 1)]
    assert tree.pairs(1) == [(0, 1, 1), (0, 2, 0), (0, 4, 0), (1, 2, 1), (1, 4, 1), (2, 4, 0)]
    assert BKTree().query(5, 64) == [] and BKTree().pairs(64) == []
    with pytest.raises(ValueError, match="not a 64-bit unsigned integer"):
        tree.add(9, 2**64)


# --- clusters ----------------------------------------------------------------------------------------


def brute_force_clusters(hashes: list[int], max_distance: int) -> list[Cluster]:
    """Connected components over all pairs, and for each the smallest radius that connects it."""
    distances = all_distances(hashes)

    def components(radius: int) -> list[list[int]]:
        seen, found = set(), []
        for start in range(len(hashes)):
            if start in seen:
                continue
            component, frontier = {start}, [start]
            while frontier:
                i = frontier.pop()
                for j in np.flatnonzero(distances[i] <= radius).tolist():
                    if j not in component:
                        component.add(j)
                        frontier.append(j)
            seen |= component
            found.append(sorted(component))
        return found

    clusters = []
    for members in components(max_distance):
        if len(members) < 2:
            continue
        joined = next(r for r in range(max_distance + 1) if any(c == members for c in components(r)))
        clusters.append(Cluster(members, joined))
    return sorted(clusters, key=lambda c: c.members[0])


@pytest.mark.parametrize("max_distance", [0, 3, 6])
def test_clusters_equal_brute_force_components(max_distance):
    hashes = random_hashes(150, planted=60, seed=7)
    hashes += hashes[:5]  # exact repeats
    clusters, capped = near_duplicate_clusters(hashes, max_distance)
    assert clusters == brute_force_clusters(hashes, max_distance)
    assert len(clusters) >= 5 and capped == []
    assert any(c.max_distance > 0 for c in clusters) == (max_distance > 0)


def test_oversize_clusters_are_kept_and_reported():
    rng = random.Random(3)
    chain = [rng.getrandbits(64)]
    for _ in range(5):  # six hashes, each 2 bits from the one before
        chain.append(chain[-1] ^ (0b11 << rng.randrange(62)))
    pair = [rng.getrandbits(64)] * 2
    hashes = [rng.getrandbits(64)] + chain + pair
    clusters, capped = near_duplicate_clusters(hashes, max_distance=2, max_cluster_size=5)
    assert clusters == [Cluster([1, 2, 3, 4, 5, 6], 2), Cluster([7, 8], 0)]
    assert capped == [clusters[0]]
    _, capped = near_duplicate_clusters(hashes, max_distance=2, max_cluster_size=6)
    assert capped == []


def test_clusters_edge_cases():
    assert near_duplicate_clusters([], 4) == ([], [])
    assert near_duplicate_clusters([123], 4) == ([], [])
    with pytest.raises(ValueError, match="max_distance"):
        near_duplicate_clusters([1, 2], -1)
    with pytest.raises(ValueError, match="max_cluster_size"):
        near_duplicate_clusters([1, 2], 4, max_cluster_size=1)


def test_clusters_of_real_hashes():
    darker = np.clip(scene(1).astype(np.int64) - 3, 0, 255).astype(np.uint8)
    variants = [scene(0), jpeg(scene(0), 60), scene(1), scene(2), darker]
    clusters, _ = near_duplicate_clusters([perceptual_hash(v) for v in variants], 4)
    assert [c.members for c in clusters] == [[0, 1], [2, 4]]


def test_exact_duplicate_groups():
    assert exact_duplicate_groups(["a", "b", "a", "c", "b", "a"]) == [[0, 2, 5], [1, 4]]
    assert exact_duplicate_groups(["a", "b"]) == []
    assert exact_duplicate_groups([]) == []
