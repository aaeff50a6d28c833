"""Compact columns for the sample table: a million sample ids, paths and hashes as a few flat buffers rather than a
million Python strings each (a string object costs about 50 bytes beyond its text, a list slot 8 more).

Each column reads like the list it replaces (`column[i]`, `len`, iteration, a slice gives a list), so the stage's
code indexes it as before; only what is stored differs.

- `Texts`: optional strings as one UTF-8 buffer with an offset per row (none at all when every row is None), and
  `Names` for those never None;
- `Codes`: optional strings from a few distinct values (labels, fixed splits) as an int32 code per row, settable;
- `Digests`: optional hex SHA-256/BLAKE3 digests as 32 bytes per row, settable (any other text is kept as it is).
"""

from __future__ import annotations

from array import array
from typing import Iterable, Iterator, Optional, Union, overload

import numpy as np


class Texts:
    """Optional strings, immutable: UTF-8 bytes of every row in one buffer, row i at offsets[i]:offsets[i + 1]."""

    def __init__(self, values: Iterable[Optional[str]]):
        blob, offsets, nulls, length = bytearray(), array("q", [0]), array("q"), 0
        for i, value in enumerate(values):
            if value is None:
                nulls.append(i)
            else:
                blob += value.encode("utf-8", "surrogatepass")
            offsets.append(len(blob))
            length = i + 1
        self._blob, self._length = bytes(blob), length
        self._offsets: Optional[array] = offsets if len(nulls) < length else None  # every row None: nothing to keep
        self._null = np.zeros(length, dtype=bool) if nulls else None
        if self._null is not None:
            self._null[np.frombuffer(nulls, dtype=np.int64)] = True

    def __len__(self) -> int:
        return self._length

    def _at(self, i: int) -> Optional[str]:
        if self._offsets is None or (self._null is not None and self._null[i]):
            return None
        return self._blob[self._offsets[i]:self._offsets[i + 1]].decode("utf-8", "surrogatepass")

    @overload
    def __getitem__(self, index: int) -> Optional[str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[Optional[str]]: ...
    def __getitem__(self, index: Union[int, slice]) -> Union[Optional[str], list[Optional[str]]]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(index)
        return self._at(index)

    def __iter__(self) -> Iterator[Optional[str]]:
        return (self._at(i) for i in range(self._length))


class Names(Texts):
    """Strings, none missing (sample ids, paths): `Texts` typed as such."""

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: Union[int, slice]) -> Union[str, list[str]]:
        return super().__getitem__(index)  # type: ignore[return-value]

    def __iter__(self) -> Iterator[str]:
        return super().__iter__()  # type: ignore[return-value]


class Joined:
    """Strings made as they are read: `prefix` + each of `names` (the paths of files found under a folder, from their
    relative paths), so they take no memory of their own."""

    def __init__(self, prefix: str, names: Names):
        self.prefix, self.names = prefix, names

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: Union[int, slice]) -> Union[str, list[str]]:
        if isinstance(index, slice):
            return [self.prefix + name for name in self.names[index]]
        return self.prefix + self.names[index]

    def __iter__(self) -> Iterator[str]:
        return (self.prefix + name for name in self.names)


class Codes:
    """Optional strings from few distinct values: an int32 code per row (-1: None) and the values; settable."""

    def __init__(self, values: Iterable[Optional[str]]):
        self.values: list[str] = []
        code_of: dict[str, int] = {}
        codes = array("i")
        for value in values:
            codes.append(-1 if value is None else code_of.setdefault(value, len(code_of)))
            if value is not None and len(code_of) > len(self.values):
                self.values.append(value)
        self._codes, self._code_of = np.frombuffer(codes, dtype=np.int32).copy() if codes else np.zeros(0, np.int32), code_of

    def __len__(self) -> int:
        return len(self._codes)

    @overload
    def __getitem__(self, index: int) -> Optional[str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[Optional[str]]: ...
    def __getitem__(self, index: Union[int, slice]) -> Union[Optional[str], list[Optional[str]]]:
        if isinstance(index, slice):
            return [self.values[c] if c >= 0 else None for c in self._codes[index].tolist()]
        code = int(self._codes[index])
        return self.values[code] if code >= 0 else None

    def __setitem__(self, index: int, value: Optional[str]) -> None:
        if value is not None and value not in self._code_of:
            self._code_of[value] = len(self.values)
            self.values.append(value)
        self._codes[index] = -1 if value is None else self._code_of[value]

    def __iter__(self) -> Iterator[Optional[str]]:
        values = self.values
        return (values[c] if c >= 0 else None for c in self._codes.tolist())

    def mapped(self, rows: np.ndarray, to: dict[str, int]) -> np.ndarray:
        """`to[value]` of each of `rows` as int32 (-1: None, or a value `to` lacks)."""
        lookup = np.array([to.get(v, -1) for v in self.values] + [-1], dtype=np.int32)  # code -1 reads the last
        return lookup[self._codes[rows]]


class Digests:
    """Optional hex digests: 32 bytes a row for a 64-digit lowercase hex one, any other text kept aside; settable."""

    def __init__(self, rows: int):
        self._bytes = np.zeros((rows, 32), dtype=np.uint8)
        self._kind = np.zeros(rows, dtype=np.int8)  # 0: None, 1: hex in _bytes, 2: text in _other
        self._other: dict[int, str] = {}

    @classmethod
    def of(cls, values: Iterable[Optional[str]]) -> Digests:
        listed = values if isinstance(values, (list, tuple)) else list(values)
        column = cls(len(listed))
        for i, value in enumerate(listed):
            column[i] = value
        return column

    def __len__(self) -> int:
        return len(self._kind)

    def __setitem__(self, index: int, value: Optional[str]) -> None:
        index = int(index)
        self._other.pop(index, None)
        if value is None:
            self._kind[index] = 0
        elif len(value) == 64 and value == value.lower() and _is_hex(value):
            self._bytes[index] = np.frombuffer(bytes.fromhex(value), dtype=np.uint8)
            self._kind[index] = 1
        else:
            self._other[index] = value
            self._kind[index] = 2

    def _at(self, i: int) -> Optional[str]:
        kind = self._kind[i]
        if kind == 1:
            return self._bytes[i].tobytes().hex()
        return self._other[i] if kind == 2 else None

    @overload
    def __getitem__(self, index: int) -> Optional[str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[Optional[str]]: ...
    def __getitem__(self, index: Union[int, slice]) -> Union[Optional[str], list[Optional[str]]]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._at(index)

    def __iter__(self) -> Iterator[Optional[str]]:
        return (self._at(i) for i in range(len(self)))

    def raw(self, rows: np.ndarray) -> np.ndarray:
        """The 32 bytes of each row's hex digest as one `S32` array (rows without one: 32 zero bytes, which no
        digest a search looks up equals), for sorting and searching without a string a row."""
        return np.ascontiguousarray(self._bytes[rows]).view("S32").ravel()

    def all_hex(self, rows: np.ndarray) -> bool:
        """Whether each of `rows` holds a hex digest (so `raw` tells their contents apart)."""
        return bool((self._kind[rows] == 1).all())


def hex_digests(values: Iterable[str]) -> np.ndarray:
    """64-digit hex digests as an `S32` array of their bytes (compare `Digests.raw`)."""
    return np.array([bytes.fromhex(v) for v in values], dtype="S32")


def _is_hex(value: str) -> bool:
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


class GrowingNames:
    """Strings appended one at a time, kept as one UTF-8 buffer with an offset a row (the text gate's document ids
    and groups, read while more are added)."""

    def __init__(self) -> None:
        self._blob, self._offsets = bytearray(), array("q", [0])

    def append(self, value: str) -> None:
        self._blob += value.encode("utf-8", "surrogatepass")
        self._offsets.append(len(self._blob))

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def raw(self, index: int) -> bytes:
        """Row `index` as UTF-8: in the order of the strings (code point order is UTF-8's byte order)."""
        return bytes(self._blob[self._offsets[index]:self._offsets[index + 1]])

    def __getitem__(self, index: int) -> str:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._blob[self._offsets[index]:self._offsets[index + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))


class GrowingDigests:
    """Fixed-size digests (raw bytes) appended one at a time: `hex(i)`, and all of them as one `S<size>` array."""

    def __init__(self, size: int = 32) -> None:
        self.size, self._blob = size, bytearray()

    def append(self, digest: bytes) -> None:
        if len(digest) != self.size:
            raise ValueError(f"a digest of {len(digest)} bytes; this column holds {self.size}")
        self._blob += digest

    def __len__(self) -> int:
        return len(self._blob) // self.size

    def hex(self, index: int) -> str:
        return self._blob[index * self.size:(index + 1) * self.size].hex()

    def raw(self) -> np.ndarray:
        return np.frombuffer(bytes(self._blob), dtype=f"S{self.size}")
