"""Duplicate detection for the data stage: exact copies by content hash, near-duplicates by perceptual hash.

Near-duplicates (re-encoded, resized, slightly brightened or noisy copies of one picture) get a 64-bit DCT
perceptual hash each; pairs within a Hamming radius are found through a BK-tree, never by comparing all
pairs, and joined into clusters that the data stage keeps in one split. Pure Python and numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

HASH_BITS = 64
HASH_SIDE = 32  # the grey image is resized to 32×32 before the DCT
LOW_FREQUENCIES = 8  # the top-left 8×8 DCT coefficients make the 64 bits
COSINE_SCALE = 1 << 14  # fixed-point DCT: cosines rounded to multiples of 1/16384 (integer arithmetic, exact)
LUMA_PER_MILLE = (299, 587, 114)  # ITU-R BT.601 weights for R, G, B, in thousandths (grey is 1000× its value)
JOIN_CHUNK = 4096  # queries walked through the tree together when joining it with itself (bounds memory)

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


def _box_weights(n: int) -> np.ndarray:
    """Overlap of each source pixel with each of the 32 output cells, in units of 1/32 pixel: shape (32, n).

    Output cell i spans [i·n, (i+1)·n) and source pixel r spans [32r, 32r + 32) on that scale; each row sums to n.
    """
    cell = np.arange(HASH_SIDE)[:, None]
    source = np.arange(n)[None, :]
    start = np.maximum(cell * n, source * HASH_SIDE)
    stop = np.minimum((cell + 1) * n, (source + 1) * HASH_SIDE)
    return np.maximum(stop - start, 0).astype(np.float64)


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two hashes."""
    return (a ^ b).bit_count()


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64, as int64."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(x).astype(np.int64)
    per_byte = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)
    return per_byte[x.reshape(-1, 1).view(np.uint8)].sum(axis=1).reshape(x.shape)


def _check_hash(h: int) -> int:
    h = int(h)
    if not 0 <= h < 1 << HASH_BITS:
        raise ValueError(f"hash {h} is not a 64-bit unsigned integer")
    return h


class BKTree:
    """Burkhard-Keller tree over 64-bit hashes with Hamming distance.

    Each node holds one hash (and the ids of every item added with exactly that hash); a child hangs under
    the edge equal to its distance from the parent. A query for radius r at a node at distance d only needs
    the children on edges d - r … d + r (triangle inequality), which prunes most of the tree for small r.
    `distance_calls` counts every Hamming distance computed, by `add`, `query` and `pairs`.
    """

    def __init__(self) -> None:
        self._hashes: list[int] = []  # per node, in insertion order: a child always comes after its parent
        self._ids: list[list[int]] = []  # per node: items with exactly this hash
        self._children: list[dict[int, int]] = []  # per node: edge distance → child node
        self._parents: list[tuple[int, int]] = []  # per node: (parent node, edge); (-1, 0) for the root
        self._frozen: tuple[np.ndarray, ...] | None = None  # array form of the tree, for `pairs`
        self.distance_calls = 0

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._ids)

    def add(self, item_id: int, h: int) -> None:
        h = _check_hash(h)
        self._frozen = None
        node = 0
        while self._hashes:
            distance = (self._hashes[node] ^ h).bit_count()
            self.distance_calls += 1
            if distance == 0:
                self._ids[node].append(item_id)
                return
            child = self._children[node].get(distance)
            if child is None:
                self._children[node][distance] = len(self._hashes)
                self._new_node(item_id, h, node, distance)
                return
            node = child
        self._new_node(item_id, h, -1, 0)

    def _new_node(self, item_id: int, h: int, parent: int, edge: int) -> None:
        self._hashes.append(h)
        self._ids.append([item_id])
        self._children.append({})
        self._parents.append((parent, edge))

    def query(self, h: int, max_distance: int) -> list[tuple[int, int]]:
        """Items within `max_distance` of `h`, as (item_id, distance) sorted by distance, then item_id."""
        h = _check_hash(h)
        found: list[tuple[int, int]] = []
        stack = [0] if self._hashes else []
        calls = 0
        while stack:
            node = stack.pop()
            distance = (self._hashes[node] ^ h).bit_count()
            calls += 1
            if distance <= max_distance:
                found.extend((item_id, distance) for item_id in self._ids[node])
            children = self._children[node]
            if children:
                for edge in range(max(1, distance - max_distance), distance + max_distance + 1):
                    child = children.get(edge)
                    if child is not None:
                        stack.append(child)
        self.distance_calls += calls
        found.sort(key=lambda hit: (hit[1], hit[0]))
        return found

    def pairs(self, max_distance: int) -> list[tuple[int, int, int]]:
        """Every pair of added items within `max_distance`: (item_a, item_b, distance) with item_a < item_b, sorted.

        The same answer as querying every stored hash, but each pair is searched for once (a node only looks
        at nodes added before it) and the tree is walked for many queries at a time with numpy.
        """
        found = []
        for ids in self._ids:  # items added with the same hash
            found.extend((a, b, 0) for k, a in enumerate(ids) for b in ids[k + 1 :])
        later, earlier, distances = self._node_pairs(max_distance)
        for node_a, node_b, distance in zip(later.tolist(), earlier.tolist(), distances.tolist()):
            found.extend((min(a, b), max(a, b), distance) for a in self._ids[node_a] for b in self._ids[node_b])
        found.sort()
        return found

    def _freeze(self) -> tuple[np.ndarray, ...]:
        """The tree as arrays: hashes, children grouped by parent and sorted by edge, and where each edge starts.

        `first[p]` is where node p's children start in `children`; `rank[p * 66 + e]` counts p's children on
        edges below e, so its children on edges lo … hi are
        `children[first[p] + rank[p * 66 + lo] : first[p] + rank[p * 66 + hi + 1]]`.
        """
        if self._frozen is None:
            n = len(self._hashes)
            hashes = np.array(self._hashes, dtype=np.uint64)
            parents = np.array([p for p, _ in self._parents[1:]], dtype=np.int64)
            edges = np.array([e for _, e in self._parents[1:]], dtype=np.int64)
            order = np.lexsort((edges, parents))
            children = (order + 1).astype(np.int32)  # node k + 1 is the k-th non-root node
            first = np.searchsorted(parents[order], np.arange(n)).astype(np.int64)
            counts = np.zeros((n, HASH_BITS + 2), dtype=np.uint8)
            counts[parents, edges + 1] = 1  # a parent has at most one child per edge
            rank = np.cumsum(counts, axis=1, dtype=np.uint8).ravel()
            self._frozen = (hashes, children, first, rank)
        return self._frozen

    def _node_pairs(self, max_distance: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pairs of nodes within `max_distance`: (later node, earlier node, distance), found through the tree."""
        if len(self._hashes) < 2:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        hashes, children, first, rank = self._freeze()
        width = HASH_BITS + 2
        results = []
        for start in range(1, len(hashes), JOIN_CHUNK):
            query = np.arange(start, min(start + JOIN_CHUNK, len(hashes)), dtype=np.int32)  # the querying node
            node = np.zeros_like(query)  # every query starts at the root, which precedes it
            while query.size:
                distance = _popcount(hashes[node] ^ hashes[query]).astype(np.int32)
                self.distance_calls += int(query.size)
                hit = distance <= max_distance
                results.append((query[hit], node[hit], distance[hit]))
                row = node.astype(np.int64) * width
                low = rank[row + np.maximum(distance - max_distance, 1)].astype(np.int32)
                count = rank[row + np.minimum(distance + max_distance + 1, HASH_BITS + 1)] - low
                has_children = count > 0
                query, count = query[has_children], count[has_children]
                begin = first[node[has_children]] + low[has_children]
                ends = np.cumsum(count, dtype=np.int64)
                if ends.size == 0:
                    break
                # each entry becomes its `count` children, at positions begin, begin + 1, … of `children`
                positions = np.arange(ends[-1], dtype=np.int64) + np.repeat(begin - (ends - count), count)
                query = np.repeat(query, count)
                node = children[positions]
                earlier = node < query  # nodes added after the query (and their subtrees) are not its pairs
                query, node = query[earlier], node[earlier]
        if not results:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        return tuple(np.concatenate(parts) for parts in zip(*results))  # type: ignore[return-value]


class UnionFind:
    """Disjoint sets over 0..n-1; the smaller root always wins, so the result does not depend on the
    order of the unions."""

    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]  # path halving
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> Optional[tuple[int, int]]:
        """Join the sets of `a` and `b`; returns (kept root, absorbed root), or None if already one set."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return None
        keep, drop = min(ra, rb), max(ra, rb)
        self.parent[drop] = keep
        return keep, drop


@dataclass
class Cluster:
    members: list[int]  # item indices, sorted
    max_distance: int  # the largest link needed to join them: smallest radius at which they are all connected


def near_duplicate_clusters(
    hashes: Sequence[int], max_distance: int, max_cluster_size: int = 50
) -> tuple[list[Cluster], list[Cluster]]:
    """Group items whose perceptual hashes are linked by chains of pairs within `max_distance` bits.

    Identical hashes are grouped first (a dict), so the BK-tree holds each distinct hash once; the tree then
    yields every pair of distinct hashes within `max_distance`, and the connected components of those links
    with two or more items are the clusters, sorted by their first member. A cluster's `max_distance` is the
    largest link on its minimum spanning tree (links joined shortest first), 0 for exact repeats only.
    Returns (clusters, capped): clusters larger than `max_cluster_size` are in both lists; the caller still
    keeps them together and reports them.
    """
    if not 0 <= max_distance <= HASH_BITS:
        raise ValueError(f"max_distance must be between 0 and {HASH_BITS}, got {max_distance}")
    if max_cluster_size < 2:
        raise ValueError(f"max_cluster_size must be at least 2, got {max_cluster_size}")
    by_hash: dict[int, list[int]] = {}
    for index, h in enumerate(hashes):
        by_hash.setdefault(_check_hash(h), []).append(index)
    groups = list(by_hash.values())  # in order of first appearance

    tree = BKTree()
    for group_index, h in enumerate(by_hash):
        tree.add(group_index, h)
    later, earlier, distances = tree._node_pairs(max_distance)
    group_of_node = np.array([ids[0] for ids in tree._ids], dtype=np.int64)  # one group per node: hashes are distinct
    a, b = group_of_node[later], group_of_node[earlier]

    sets = UnionFind(len(groups))
    joined_at = [0] * len(groups)  # per root: the largest link used so far

    order = np.lexsort((b, a, distances))  # shortest links first, ties by group: a deterministic spanning tree
    for x, y, distance in zip(a[order].tolist(), b[order].tolist(), distances[order].tolist()):
        joined = sets.union(x, y)
        if joined is not None:
            keep, drop = joined
            joined_at[keep] = max(joined_at[keep], joined_at[drop], distance)

    components: dict[int, list[int]] = {}
    for group_index, members in enumerate(groups):
        components.setdefault(sets.find(group_index), []).extend(members)
    clusters = [
        Cluster(sorted(members), joined_at[root]) for root, members in components.items() if len(members) >= 2
    ]
    clusters.sort(key=lambda cluster: cluster.members[0])
    capped = [cluster for cluster in clusters if len(cluster.members) > max_cluster_size]
    return clusters, capped


def exact_duplicate_groups(content_hashes: Sequence[str]) -> list[list[int]]:
    """Indices that share a content hash: groups of two or more, each sorted, ordered by first index."""
    by_hash: dict[str, list[int]] = {}
    for index, digest in enumerate(content_hashes):
        by_hash.setdefault(digest, []).append(index)
    return [group for group in by_hash.values() if len(group) >= 2]
