"""Small images of one shape kept per sample row in a scratch file rather than in memory: the comparison pictures and
thumbnails that the near-duplicate search and the label-issue pass read, a few chunks of rows at a time.

Each image is written once with `os.pwrite` at its row's offset, and rows are read back through a memory map made for
that read and closed after it, so the process holds only what one read returns: a million 32×32 pictures are 1 GB on
disk and a chunk's worth in memory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np


class RowImages:
    """Images (uint8, or arrays of another `dtype`) of one shape, at most one per row of `rows`, in the file `path`
    (made at the first `put`; None: a table whose features are never taken, so a `put` is a bug)."""

    def __init__(self, path: Optional[Path], rows: int, dtype: np.dtype | type = np.uint8):
        self.path, self.rows, self.dtype = path, rows, np.dtype(dtype)
        self.shape: Optional[tuple[int, ...]] = None
        self.present = np.zeros(rows, dtype=bool)
        self._fd: Optional[int] = None

    def put(self, row: int, image: np.ndarray) -> None:
        self.put_rows(row, np.asarray(image)[None])

    def put_rows(self, first: int, images: np.ndarray) -> None:
        """`images[k]` as row `first + k`'s, in one write."""
        images = np.ascontiguousarray(images, dtype=self.dtype)
        if self.path is None:
            raise RuntimeError("row images: this table keeps no features (it was made without a scratch folder)")
        if self.shape is None:
            self.shape = tuple(images.shape[1:])
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(self._fd, self.rows * self._size)  # sparse: rows never written take no disk
        elif tuple(images.shape[1:]) != self.shape:
            raise ValueError(f"row images: rows from {first} are {images.shape[1:]}, the others {self.shape}")
        assert self._fd is not None
        os.pwrite(self._fd, images.tobytes(), first * self._size)
        self.present[first:first + len(images)] = True

    @property
    def _size(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize if self.shape is not None else 0

    def __contains__(self, row: object) -> bool:
        return bool(isinstance(row, (int, np.integer)) and 0 <= row < self.rows and self.present[row])

    def get(self, row: int) -> Optional[np.ndarray]:
        """Row `row`'s image, or None when it has none."""
        if row not in self:
            return None
        assert self._fd is not None and self.shape is not None
        return np.frombuffer(os.pread(self._fd, self._size, row * self._size), dtype=self.dtype).reshape(self.shape).copy()

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The images of `rows` (each present), stacked in their order: a copy, read through a map closed after it."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.shape is None:
            if len(rows):
                raise KeyError(f"row images: row {int(rows[0])} has none")
            return np.zeros((0,), dtype=self.dtype)
        if len(rows) and not self.present[rows].all():
            raise KeyError(f"row images: row {int(rows[~self.present[rows]][0])} has none")
        assert self.path is not None
        mapped = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.rows, *self.shape))
        taken = np.array(mapped[rows])  # a copy: the map, and the pages read through it, go with `mapped`
        del mapped
        return taken

    def of(self, rows: Union[list[int], np.ndarray]) -> RowView:
        return RowView(self, np.asarray(rows, dtype=np.int64))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RowView:
    """The images of some rows, in a given order, indexed as an array of them would be (an int, a slice or an index
    array): what the near-duplicate search and the label-issue pass take instead of a stacked array."""

    def __init__(self, images: RowImages, rows: np.ndarray):
        self.images, self.rows = images, rows
        self.shape = (len(rows), *(images.shape or ()))
        self.dtype = images.dtype
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: Union[int, slice, np.ndarray]) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            return self.images.take(self.rows[[index]])[0]
        return self.images.take(self.rows[index])

    def chunks(self, size: int) -> Iterator[np.ndarray]:
        for start in range(0, len(self.rows), size):
            yield self[start:start + size]


Images = Union[np.ndarray, RowView]  # images N×… as an array, or read from a scratch file as they are indexed
