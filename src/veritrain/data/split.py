"""Train/val/test assignment, written as files rather than by moving data.

Samples are split as *units*: a unit is one sample, or everything that must stay together (a group
from `data.group_regex` or the csv `group` column, exact duplicates, near-duplicate clusters). Units
with a fixed split (official test set, csv `split`, `data.test_split_file`) keep it. Every other unit
is placed by its key alone (data recipe 4, "stable splits"): u = the first 8 bytes of
SHA-256(split_seed ‖ key) / 2⁶⁴ against the cumulative `data.split_ratios` (train, val, test), where a
sample's key is its content hash or the source's explicit id and a unit's key is its smallest member
key. So adding or removing samples moves no other sample, except members of groups the change merges
or splits. With `data.split_by: time` the test split holds the latest samples instead, ordered by the instant
each timestamp parses to (`parse_instant`: ISO 8601 with or without an offset, a date, or epoch seconds).

    from veritrain.data.split import place
    place("9f2c…", (0.8, 0.1, 0.1), seed=0)   # 'train', 'val' or 'test'
"""

from __future__ import annotations

import hashlib
import math
import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from veritrain.core.errors import RunFailed

SPLITS = ("train", "val", "test")
PLACEMENT_SCALE = 2**64  # u = placement value / 2⁶⁴, in [0, 1)


@dataclass(slots=True)  # one a sample, for most samples: no per-object dict
class Unit:
    members: list[int]  # sample indices
    labels: list[Optional[int]] = field(default_factory=list)  # class index per member (None: no classes)
    fixed: Optional[str] = None  # a split the data itself prescribes
    timestamp: Optional[int] = None  # the latest member instant (parse_instant: µs since the epoch), for time splits
    key: str = ""  # the smallest member key: what places the unit
    former: frozenset[str] = frozenset()  # data.test_from: the splits its members had in that version


class Units:
    """The units of a split, read as a list of `Unit` would be (`units[u]`, iteration, `len`; each Unit made as it
    is read, so setting a field of one changes nothing: `set_former`), kept as arrays: a million units that are one
    sample each are not a million objects. Units are in the order of their first member.

    `members`, `labels` (class index per member, -1: none) and `fixed` (SPLITS index per unit, -1: none) are
    arrays; a unit's members are members[starts[u]:starts[u + 1]]. Keys and timestamps are kept only where given
    (`keys`, `timestamps`); a lone sample's key is `key_of(row)`."""

    def __init__(self, samples: int, members: np.ndarray, starts: np.ndarray, labels: np.ndarray, fixed: np.ndarray,
                 keys: dict[int, str], timestamps: dict[int, int], key_of: Callable[[int], str]):
        self.members, self.starts, self.labels, self.fixed = members, starts, labels, fixed
        self._keys, self._timestamps, self._key_of = keys, timestamps, key_of
        self._former: dict[int, frozenset[str]] = {}
        self.unit_of_row = np.full(samples, -1, dtype=np.int32 if len(starts) < 2**31 else np.int64)
        self.unit_of_row[members] = np.repeat(np.arange(len(starts) - 1), np.diff(starts))

    def __len__(self) -> int:
        return len(self.starts) - 1

    def size(self, u: int) -> int:
        return int(self.starts[u + 1] - self.starts[u])

    def __getitem__(self, u: int) -> Unit:
        if not 0 <= u < len(self):
            raise IndexError(u)
        a, b = int(self.starts[u]), int(self.starts[u + 1])
        members = self.members[a:b].tolist()
        fixed = int(self.fixed[u])
        return Unit(members=members, labels=[None if label < 0 else label for label in self.labels[a:b].tolist()],
                    fixed=SPLITS[fixed] if fixed >= 0 else None, timestamp=self._timestamps.get(u),
                    key=self._keys[u] if u in self._keys else self._key_of(members[0]), former=self._former.get(u, frozenset()))

    def __iter__(self) -> Iterator[Unit]:
        return (self[u] for u in range(len(self)))

    def multi(self) -> Iterator[Unit]:
        """The units of two or more members."""
        return (self[u] for u in np.flatnonzero(np.diff(self.starts) > 1).tolist())

    @classmethod
    def of(cls, units: Sequence[Unit]) -> Units:
        """The units of a list, in its order (each key kept: no table reads them)."""
        sizes = [len(unit.members) for unit in units]
        members = np.array([i for unit in units for i in unit.members], dtype=np.int64)
        made = cls(int(members.max()) + 1 if len(members) else 0, members, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                   np.array([-1 if label is None else label for unit in units for label in unit.labels] or np.zeros(0), dtype=np.int32)
                   if all(len(unit.labels) == len(unit.members) for unit in units) else np.full(len(members), -1, dtype=np.int32),
                   np.array([SPLITS.index(unit.fixed) if unit.fixed else -1 for unit in units], dtype=np.int8),
                   {u: unit.key for u, unit in enumerate(units)},
                   {u: unit.timestamp for u, unit in enumerate(units) if unit.timestamp is not None}, lambda row: "")
        for u, unit in enumerate(units):
            made.set_former(u, unit.former)
        return made

    def fixed_names(self) -> list[Optional[str]]:
        return [SPLITS[code] if code >= 0 else None for code in self.fixed.tolist()]

    def key(self, u: int) -> str:
        return self._keys[u] if u in self._keys else self._key_of(int(self.members[self.starts[u]]))

    def former(self, u: int) -> frozenset[str]:
        return self._former.get(u, frozenset())

    def timestamp(self, u: int) -> Optional[int]:
        return self._timestamps.get(u)

    def set_former(self, u: int, former: frozenset[str]) -> None:
        if former:
            self._former[u] = former
        else:
            self._former.pop(u, None)


class Placement:
    """sample index → its split, read and written as a dict of them would be (iterated in the order placed), kept as
    a byte a sample and the order: a million placed samples are not a million dict entries."""

    def __init__(self, samples: int):
        self._split = np.full(samples, -1, dtype=np.int8)  # SPLITS index, -1: not placed
        self._order = array("q")

    def __setitem__(self, i: int, split: str) -> None:
        if self._split[i] < 0:
            self._order.append(int(i))
        self._split[i] = SPLITS.index(split)

    def __contains__(self, i: object) -> bool:
        return bool(isinstance(i, (int, np.integer)) and 0 <= i < len(self._split) and self._split[i] >= 0)

    def __getitem__(self, i: int) -> str:
        code = int(self._split[i]) if 0 <= i < len(self._split) else -1
        if code < 0:
            raise KeyError(i)
        return SPLITS[code]

    def get(self, i: int, default: Optional[str] = None) -> Optional[str]:
        return self[i] if i in self else default

    def __delitem__(self, i: int) -> None:
        if i not in self:
            raise KeyError(i)
        self._split[i] = -1  # its place in the order is skipped from now on

    def __iter__(self) -> Iterator[int]:
        split = self._split
        return (i for i in self._order if split[i] >= 0)

    def keys(self) -> Iterator[int]:
        return iter(self)

    def items(self) -> Iterator[tuple[int, str]]:
        split = self._split
        return ((i, SPLITS[split[i]]) for i in self._order if split[i] >= 0)

    def values(self) -> Iterator[str]:
        return (split for _, split in self.items())

    def __len__(self) -> int:
        return int((self._split >= 0).sum())

    def codes(self, rows: np.ndarray) -> np.ndarray:
        """The SPLITS index of each of `rows` (-1: not placed)."""
        return self._split[rows]


TIMESTAMP_FORMATS = {
    "iso8601_offset": "ISO 8601 date and time with a UTC offset or Z",
    "iso8601_no_offset": "ISO 8601 date and time without an offset, read as UTC",
    "date": "ISO 8601 date (YYYY-MM-DD), read as its midnight UTC",
    "epoch_seconds": "seconds since 1970-01-01T00:00:00Z (digits only, an optional fraction)",
}
TIMESTAMP_HELP = ("give ISO 8601 (2024-01-05T10:00:00+02:00 or …Z; without an offset it is read as UTC), a date "
                  "(2024-01-05) or epoch seconds (1704448800)")
_EPOCH_SECONDS = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_INSTANT_RANGE = ((datetime(1, 1, 2, tzinfo=timezone.utc) - _EPOCH) // timedelta(microseconds=1),
                  (datetime(9999, 12, 31, tzinfo=timezone.utc) - _EPOCH) // timedelta(microseconds=1))


def parse_instant(value: str) -> tuple[int, str]:
    """(microseconds since 1970-01-01T00:00:00Z, the format's name in TIMESTAMP_FORMATS) of a timestamp, so that
    values in different formats and offsets are ordered by the instant they name. A value of digits only is epoch
    seconds (write a date as 2024-01-05); anything else that is not ISO 8601 raises ValueError saying what is."""
    text = value.strip()
    if _EPOCH_SECONDS.fullmatch(text):
        micros, kind = int(Decimal(text) * 1_000_000), "epoch_seconds"
    else:
        try:
            moment, kind = datetime.combine(date.fromisoformat(text), datetime.min.time()), "date"
        except ValueError:
            try:  # Python 3.10's fromisoformat does not read Z
                moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
            except ValueError:
                raise ValueError(f"{value!r} is not a timestamp: {TIMESTAMP_HELP}") from None
            kind = "iso8601_no_offset" if moment.tzinfo is None else "iso8601_offset"
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        micros = (moment - _EPOCH) // timedelta(microseconds=1)
    if not _INSTANT_RANGE[0] <= micros <= _INSTANT_RANGE[1]:
        raise ValueError(f"{value!r} is outside the years 1 to 9999 (as {TIMESTAMP_FORMATS[kind]}): {TIMESTAMP_HELP}")
    return micros, kind


def placement_value(seed: int, key: str) -> int:
    """The first 8 bytes of SHA-256(split_seed as 8 bytes big-endian ‖ key as UTF-8), big-endian: u·2⁶⁴."""
    digest = hashlib.sha256(seed.to_bytes(8, "big") + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def thresholds(ratios: Sequence[float]) -> tuple[int, int]:
    """The cumulative ratios as placement values: train below the first, val below the second, test from there.

    Exact integers (a float times 2⁶⁴ is exact; ceil makes `value < bound` mean `u < ratio`), so every machine
    places alike; a split with ratio 0 gets nothing even when the other ratios sum to 1 only up to rounding."""
    train = math.ceil(ratios[0] * PLACEMENT_SCALE)
    val = train if ratios[1] == 0 else math.ceil((ratios[0] + ratios[1]) * PLACEMENT_SCALE)
    return train, (PLACEMENT_SCALE if ratios[2] == 0 else val)


def place(key: str, ratios: Sequence[float], seed: int) -> str:
    """Where the hash puts a sample (or unit) of this key: train, val or test."""
    value = placement_value(seed, key)
    train, val = thresholds(ratios)
    return "train" if value < train else "val" if value < val else "test"


def unit_key(member_keys: Iterable[str]) -> str:
    """A group is placed by its smallest member key (smallest as text, i.e. by code point)."""
    return min(member_keys)


def free_ratios(ratios: Sequence[float], fixed_present: set[str]) -> list[float]:
    """Ratios for samples without a fixed split: the splits the data already fixes get none of them
    (e.g. with CIFAR-10's official test batch, the other samples go to train and val only)."""
    open_splits = [s for s in SPLITS if s not in fixed_present]
    if not open_splits or "train" not in open_splits:
        return list(ratios)  # every split (or train) is fixed somewhere: the rest follows the plain ratios
    kept = [r if s in open_splits else 0.0 for s, r in zip(SPLITS, ratios)]
    total = sum(kept)
    return [r / total for r in kept]


def settled(unit: Unit, hashed: str) -> str:
    """Where a free unit goes, given where the hash puts it and data.test_from: a unit whose members were
    all test (of those the former version holds) stays in test; one with a former train or val member never
    enters test: when the hash says test it keeps its former split (train if it had members in both)."""
    return _settled(unit.former, hashed)


def _settled(former: frozenset[str], hashed: str) -> str:
    earlier_training = former & {"train", "val"}
    if "test" in former and not earlier_training:
        return "test"
    if earlier_training and hashed == "test":
        return "train" if "train" in earlier_training else "val"
    return hashed


def assign(units: Union[Sequence[Unit], Units], ratios: Sequence[float], seed: int, by_time: bool = False,
           class_names: Optional[Sequence[str]] = None) -> list[str]:
    """A split name per unit: fixed ones keep theirs, the others follow `place` on their key (and `settled`)."""
    view = units if isinstance(units, Units) else Units.of(units)
    result = view.fixed_names()
    ratios = free_ratios(ratios, {fixed for fixed in result if fixed})  # type: ignore[arg-type]
    free = [u for u, fixed in enumerate(result) if fixed is None]
    if by_time:
        _assign_by_time(view, free, ratios, result)
    else:
        for u in free:
            result[u] = _settled(view.former(u), place(view.key(u), ratios, seed))
        _refuse_classes_without_train(view, free, result, ratios, class_names)
    return [r or "train" for r in result]


def _refuse_classes_without_train(units: Units, free: list[int], result: list[Optional[str]], ratios: Sequence[float],
                                  class_names: Optional[Sequence[str]]) -> None:
    """A class the split was free to place but that got no train sample at all cannot be learned: too_small.
    (A small class may well get no val or test sample: the report's per-class counts show it.)"""
    unit_of_member = np.repeat(np.arange(len(units)), np.diff(units.starts))
    known = units.labels >= 0
    in_train = set(units.labels[known & np.array([r == "train" for r in result] + [False], dtype=bool)[unit_of_member]].tolist())
    is_free = np.zeros(len(units) + 1, dtype=bool)
    is_free[free] = True
    placed_freely = Counter(units.labels[known & is_free[unit_of_member]].tolist())
    for label in sorted(set(placed_freely) - in_train):
        shown = repr(class_names[label]) if class_names is not None else str(label)
        raise RunFailed(
            f"data: class {shown} has {placed_freely[label]} sample(s), none of them placed in train (each sample's split follows "
            f"the hash of its key with ratios {[round(r, 4) for r in ratios]}); add samples, raise the train ratio in "
            "data.split_ratios, or change data.split_seed, which places every sample anew (too_small)"
        )


def _targets(total: int, ratios: Sequence[float]) -> tuple[int, int]:
    """Samples wanted in val and test: their share, at least one each when the ratio is > 0."""
    n_val = max(1, round(total * ratios[1])) if ratios[1] > 0 else 0
    n_test = max(1, round(total * ratios[2])) if ratios[2] > 0 else 0
    return n_val, n_test


def _assign_by_time(units: Units, free: list[int], ratios: Sequence[float], result: list[Optional[str]]) -> None:
    """Chronological: the latest samples form test, the ones before them val, the rest train."""
    order = sorted(free, key=lambda i: (stamp if (stamp := units.timestamp(i)) is not None else -math.inf, i), reverse=True)
    total = sum(units.size(i) for i in order)
    n_val, n_test = _targets(total, ratios)
    filled = 0
    for i in order:
        if filled < n_test:
            result[i] = "test"
        elif filled < n_test + n_val:
            result[i] = "val"
        else:
            result[i] = "train"
        filled += units.size(i)


def split_of_keys(keys: Sequence[str], ratios: Sequence[float], seed: int) -> list[str]:
    """A split name per sample when every sample is its own unit (no groups, duplicates or fixed splits)."""
    return [place(key, ratios, seed) for key in keys]
