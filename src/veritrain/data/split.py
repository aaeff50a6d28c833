"""Seeded, stratified train/val/test assignment, written as files rather than by moving data."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from veritrain.errors import RunFailed

SPLITS = ("train", "val", "test")


def stratified_split(
    strata: Optional[Sequence[int]], n: int, ratios: Sequence[float], seed: int, names: Optional[Sequence[str]] = None
) -> list[str]:
    """Assign each of `n` samples to a split name.

    Within each stratum (class), samples are shuffled with a generator seeded by `seed` and cut by
    `ratios` (train, val, test); rounding gives val and test their share first so a small class still
    reaches every split whose ratio is > 0. With `strata=None` all samples form one stratum.
    """
    rng = np.random.default_rng(seed)
    labels = np.zeros(n, dtype=np.int64) if strata is None else np.asarray(strata)
    assignment = np.empty(n, dtype=object)
    for stratum in np.unique(labels):
        shown = repr(names[stratum]) if names is not None else f"{int(stratum)!r}"
        members = np.flatnonzero(labels == stratum)
        needed = 1 + sum(1 for r in ratios[1:] if r > 0)
        if len(members) < needed:
            raise RunFailed(
                f"data: class {shown} has {len(members)} sample(s), too few for a split with ratios {list(ratios)}; "
                "add samples or set data.split_ratios"
            )
        members = members[rng.permutation(len(members))]
        n_val = max(1, round(len(members) * ratios[1])) if ratios[1] > 0 else 0
        n_test = max(1, round(len(members) * ratios[2])) if ratios[2] > 0 else 0
        n_train = len(members) - n_val - n_test
        if n_train < 1:
            raise RunFailed(
                f"data: class {shown} has {len(members)} sample(s), none left for train with ratios {list(ratios)}; "
                "add samples or raise the train ratio in data.split_ratios"
            )
        assignment[members[:n_train]] = "train"
        assignment[members[n_train : n_train + n_val]] = "val"
        assignment[members[n_train + n_val :]] = "test"
    return [str(s) for s in assignment]
