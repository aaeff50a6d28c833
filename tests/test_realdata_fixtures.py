"""The real-image fixtures of realdata.py write what they say: counts, the faults and their ground truth."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from realdata import (
    FAULT_COUNTS,
    SMALL_CLASS_SIZE,
    mnist_arrays,
    write_faulty_mnist,
    write_mnist_imagefolder,
    write_photo_near_duplicates,
    write_png_dataset,
    write_sample_photos,
)


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image)


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    root = tmp_path_factory.mktemp("faulty")
    return root, write_faulty_mnist(root, seed=3)


def test_mnist_arrays_are_the_5000_digit_subset():
    images, labels = mnist_arrays()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    assert images.max() == 255 and not images.flags.writeable  # shared by the cache: nobody may change it


def test_clean_mnist_imagefolder_is_named_by_mnist_index(tmp_path):
    write_mnist_imagefolder(tmp_path, per_class=3, classes=[1, 7])
    images, labels = mnist_arrays()
    written = sorted(files_under(tmp_path))
    assert len(written) == 6 and {name.split("/")[0] for name in written} == {"1", "7"}
    for name in written:
        index = int(Path(name).stem)
        assert str(labels[index]) == name.split("/")[0]
        with Image.open(tmp_path / name) as image:
            assert image.mode == "L"
        assert np.array_equal(pixels(tmp_path / name), images[index])


def test_faulty_mnist_writes_each_fault_kind_the_number_of_times_asked(faulty):
    root, faults = faulty
    for kind, count in FAULT_COUNTS.items():
        assert len(getattr(faults, kind)) == count, kind
    on_disk = files_under(root)
    assert on_disk == set(faults.sources) | set(faults.empty) | set(faults.non_image) | set(faults.noise)
    assert len(on_disk) == 9 * 500 + SMALL_CLASS_SIZE + 32  # 32 extra files: copies, near copies, empty, text, noise
    folders = collections.Counter(name.split("/")[0] for name in on_disk)
    assert sorted(folders) == [str(d) for d in range(10)]


def test_the_small_class_has_40_files_and_no_fault(faulty):
    root, faults = faulty
    small = faults.small_class
    in_small = {name for name in files_under(root) if name.split("/")[0] == small}
    assert len(in_small) == SMALL_CLASS_SIZE
    assert not in_small & faults.injected()
    assert all(faults.true_labels[name] == small for name in in_small)
    assert all(error.true_label != small and error.given_label != small for error in faults.label_errors)


def test_label_errors_sit_in_a_wrong_folder_under_their_mnist_name(faulty):
    root, faults = faulty
    images, labels = mnist_arrays()
    for error in faults.label_errors:
        folder, name = error.path.split("/")
        index = int(Path(name).stem)
        assert index == faults.sources[error.path] and str(labels[index]) == error.true_label
        assert folder == error.given_label != error.true_label
        assert np.array_equal(pixels(root / error.path), images[index])


def test_duplicates_are_byte_identical_copies(faulty):
    root, faults = faulty
    for copy, original in faults.duplicates:
        assert (root / copy).read_bytes() == (root / original).read_bytes()
        assert copy.split("/")[0] == original.split("/")[0]
    for copy, original in faults.cross_class_duplicates:
        assert (root / copy).read_bytes() == (root / original).read_bytes()
        assert copy.split("/")[0] != original.split("/")[0]


def test_near_duplicates_differ_from_their_original_only_by_the_named_change(faulty):
    root, faults = faulty
    for near in faults.near_duplicates:
        copy, original = pixels(root / near.copy).astype(int), pixels(root / near.original).astype(int)
        assert near.copy.split("/")[0] == near.original.split("/")[0]
        assert copy.shape == original.shape == (28, 28) and not np.array_equal(copy, original)
        if near.change.startswith("brightness"):
            assert np.array_equal(copy, np.clip(original + int(near.change[-2:]), 0, 255))
        else:
            axis, step = (1 if near.change[6] == "x" else 0), int(near.change[-2:])
            moved = np.moveaxis(copy, axis, 0)[1:-1]  # the rows inside: the shifted picture, edges excluded
            assert np.array_equal(moved, np.moveaxis(original, axis, 0)[1 - step : 27 - step])


def test_unusable_files_fail_to_decode_and_noise_decodes(faulty):
    root, faults = faulty
    for name in faults.truncated:
        assert 0 < (root / name).stat().st_size
        with pytest.raises(OSError):  # PIL.UnidentifiedImageError is an OSError too
            with Image.open(root / name) as image:
                image.load()
    for name in faults.empty:
        assert (root / name).stat().st_size == 0
    for name in faults.non_image + faults.empty:
        with pytest.raises(OSError):
            Image.open(root / name)
    for name in faults.noise:
        noise = pixels(root / name)
        assert noise.shape == (28, 28) and noise.std() > 60  # uniform on 0..255: std ≈ 74


def test_faulty_mnist_is_deterministic_from_its_seed(faulty, tmp_path):
    root, faults = faulty
    again = write_faulty_mnist(tmp_path, seed=3)
    assert again == faults
    assert all((tmp_path / name).read_bytes() == (root / name).read_bytes() for name in sorted(files_under(root))[::97])


def test_sample_photos_are_patches_with_near_duplicate_variants(tmp_path):
    write_sample_photos(tmp_path)
    patches = files_under(tmp_path)
    assert collections.Counter(name.split("/")[0] for name in patches) == {"china": 260, "flower": 260}
    pairs = write_photo_near_duplicates(tmp_path, count=6, seed=1)
    assert len(pairs) == 6 and {p.copy for p in pairs}.isdisjoint(patches) and {p.original for p in pairs} <= patches
    for pair in pairs:
        copy, original = pixels(tmp_path / pair.copy).astype(int), pixels(tmp_path / pair.original).astype(int)
        assert copy.shape == original.shape == (32, 32, 3)
        assert 0 < np.abs(copy - original).mean() <= (2 if pair.change.startswith("brightness") else 40)

    fewer = tmp_path / "fewer"
    write_sample_photos(fewer, size=64, per_photo=10)
    assert len(files_under(fewer)) == 20 and pixels(fewer / "china/r00c00.png").shape == (64, 64, 3)


def test_png_dataset_images_are_distinct_and_a_prefix_of_larger_ones(tmp_path):
    write_png_dataset(tmp_path / "big", 300)
    write_png_dataset(tmp_path / "small", 40)
    names = sorted(files_under(tmp_path / "big"))
    assert len(names) == 300 and names[0] == "class_0/000000.png"
    assert all((tmp_path / "small" / n).read_bytes() == (tmp_path / "big" / n).read_bytes() for n in files_under(tmp_path / "small"))
    images = np.stack([pixels(tmp_path / "big" / n) for n in names]).astype(np.float64)
    assert images.shape == (300, 32, 32, 3)
    grey = images.mean(axis=3).reshape(300, -1)
    grey -= grey.mean(axis=1, keepdims=True)  # a brightness change alone does not make two pictures distinct
    squared = (grey**2).sum(axis=1)
    apart = np.maximum(squared[:, None] + squared[None, :] - 2 * grey @ grey.T, 0)
    relative = np.sqrt(apart / np.maximum(squared[:, None], squared[None, :]))  # ‖a − b‖ / max(‖a‖, ‖b‖)
    np.fill_diagonal(relative, np.inf)
    assert relative.min() > 0.2  # 0.254 when written; a brightness ±2 copy is 0, a copy with fresh ±3 noise at most 0.2
