"""Train/val/test assignment, written as files rather than by moving data.

Samples are split as *units*: a unit is one sample, or everything that must stay together (a group
from `data.group_regex` or the csv `group` column, exact duplicates, near-duplicate clusters). Units
with a fixed split (official test set, csv `split`, `data.test_split_file`) keep it; the others are
assigned per class, shuffled by `data.split_seed` and cut by `data.split_ratios` — or, with
`data.split_by: time`, chronologically so the test split holds the latest samples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from veritrain.errors import RunFailed

SPLITS = ("train", "val", "test")


@dataclass
class Unit:
    members: list[int]  # sample indices
    labels: list[Optional[int]] = field(default_factory=list)  # class index per member (None: no classes)
    fixed: Optional[str] = None  # a split the data itself prescribes
    timestamp: Optional[str] = None  # latest member timestamp, for time splits

    @property
    def stratum(self) -> int:
        """The unit's class for stratification: its most common label (ties: the smallest index)."""
        counts = Counter(label for label in self.labels if label is not None)
        if not counts:
            return -1
        best = max(counts.values())
        return min(label for label, n in counts.items() if n == best)


def free_ratios(ratios: Sequence[float], fixed_present: set[str]) -> list[float]:
    """Ratios for samples without a fixed split: the splits the data already fixes get none of them
    (e.g. with CIFAR-10's official test batch, the other samples go to train and val only)."""
    open_splits = [s for s in SPLITS if s not in fixed_present]
    if not open_splits or "train" not in open_splits:
        return list(ratios)  # every split (or train) is fixed somewhere: the rest follows the plain ratios
    kept = [r if s in open_splits else 0.0 for s, r in zip(SPLITS, ratios)]
    total = sum(kept)
    return [r / total for r in kept]


def assign(units: list[Unit], ratios: Sequence[float], seed: int, by_time: bool = False,
           class_names: Optional[Sequence[str]] = None) -> list[str]:
    """A split name per unit."""
    result: list[Optional[str]] = [u.fixed for u in units]
    fixed_present = {u.fixed for u in units if u.fixed}
    ratios = free_ratios(ratios, fixed_present)  # type: ignore[arg-type]
    free = [i for i, u in enumerate(units) if u.fixed is None]
    if by_time:
        _assign_by_time(units, free, ratios, result)
    else:
        rng = np.random.default_rng(seed)
        by_stratum: dict[int, list[int]] = {}
        for i in free:
            by_stratum.setdefault(units[i].stratum, []).append(i)
        for stratum in sorted(by_stratum):
            members = by_stratum[stratum]
            if stratum < 0:
                shown = "(all samples)"
            else:
                shown = repr(class_names[stratum]) if class_names is not None else str(stratum)
            _assign_stratum([members[j] for j in rng.permutation(len(members))], units, ratios, result, shown)
    return [r or "train" for r in result]


def _targets(total: int, ratios: Sequence[float]) -> tuple[int, int]:
    """Samples wanted in val and test: their share, at least one each when the ratio is > 0."""
    n_val = max(1, round(total * ratios[1])) if ratios[1] > 0 else 0
    n_test = max(1, round(total * ratios[2])) if ratios[2] > 0 else 0
    return n_val, n_test


def _assign_stratum(order: list[int], units: list[Unit], ratios: Sequence[float], result: list[Optional[str]], shown: str) -> None:
    sizes = [len(units[i].members) for i in order]
    total = sum(sizes)
    needed = 1 + sum(1 for r in ratios[1:] if r > 0)
    if len(order) < needed:
        raise RunFailed(
            f"data: class {shown} has {total} sample(s) in {len(order)} unit(s) that can be split, too few for "
            f"ratios {[round(r, 4) for r in ratios]}; add samples or change data.split_ratios (too_small)"
        )
    n_val, n_test = _targets(total, ratios)
    if total - n_val - n_test < 1:
        raise RunFailed(
            f"data: class {shown} has {total} sample(s), none left for train with ratios {[round(r, 4) for r in ratios]}; "
            "add samples or raise the train ratio in data.split_ratios (too_small)"
        )
    targets = {"val": n_val, "test": n_test}
    counts = {"val": 0, "test": 0}
    *rest, last = order
    result[last] = "train"  # train always gets a unit
    def closer(split: str, size: int) -> bool:
        """Whether adding a unit of `size` brings the split nearer its target (a single sample: while it is short)."""
        return counts[split] + size - targets[split] < targets[split] - counts[split]

    for k, i in enumerate(rest):
        remaining = len(rest) - k
        size = len(units[i].members)
        still_empty = [s for s in ("val", "test") if targets[s] > 0 and counts[s] == 0]
        if remaining <= len(still_empty):  # the last units go where a split would stay empty
            split = still_empty[0]
        elif closer("val", size):
            split = "val"
        elif closer("test", size):
            split = "test"
        else:
            split = "train"
        result[i] = split
        if split != "train":
            counts[split] += len(units[i].members)


def _assign_by_time(units: list[Unit], free: list[int], ratios: Sequence[float], result: list[Optional[str]]) -> None:
    """Chronological: the latest samples form test, the ones before them val, the rest train."""
    order = sorted(free, key=lambda i: (units[i].timestamp or "", i), reverse=True)
    total = sum(len(units[i].members) for i in order)
    n_val, n_test = _targets(total, ratios)
    filled = 0
    for i in order:
        if filled < n_test:
            result[i] = "test"
        elif filled < n_test + n_val:
            result[i] = "val"
        else:
            result[i] = "train"
        filled += len(units[i].members)


def stratified_split(
    strata: Optional[Sequence[int]], n: int, ratios: Sequence[float], seed: int, names: Optional[Sequence[str]] = None
) -> list[str]:
    """A split name per sample when every sample is its own unit (no groups, duplicates or fixed splits)."""
    labels = [None] * n if strata is None else [int(s) for s in strata]
    units = [Unit([i], [labels[i]]) for i in range(n)]
    return assign(units, ratios, seed, class_names=names)
