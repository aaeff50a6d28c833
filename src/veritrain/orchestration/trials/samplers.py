"""How a set of trials chooses its changes. Fixed samplers plan every trial in advance from each key's values:
`one-at-a-time` (one trial per value, the other keys at the base config's) and `grid` (every combination). Optuna's
samplers (`random`, `tpe`) propose one trial at a time, seeded by the trial's number so that a seed proposes the
same configurations again; a search over a grid takes the grid sampler's points, shuffled by its seed."""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any, Optional, TypeVar

ONE_AT_A_TIME, GRID = "one-at-a-time", "grid"
SEARCH_SAMPLERS = ("tpe", "random", GRID)  # `veritrain search --sampler`
PRUNERS = ("median", "none")
# Optuna's MedianPruner: no trial is pruned before this many have completed, and every validation is judged
MEDIAN_STARTUP_TRIALS = 5
MEDIAN_WARMUP_EPOCHS = 0

Value = TypeVar("Value")


def one_at_a_time(options: dict[str, list[Value]]) -> list[dict[str, Value]]:
    """One change per value of each key, in the order given: {lr: [a, b], bs: [c]} → [{lr: a}, {lr: b}, {bs: c}]."""
    return [{key: value} for key, values in options.items() for value in values]


def grid(options: dict[str, list[Value]], shuffle_seed: Optional[int] = None) -> list[dict[str, Value]]:
    """Every combination of the keys' values, the last key varying fastest; with `shuffle_seed`, shuffled by it (a
    search cut short has then sampled the grid evenly rather than its first corner)."""
    points = [dict(zip(options, values)) for values in itertools.product(*options.values())]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(points)
    return points


def fixed(name: str, options: dict[str, list[Value]]) -> list[dict[str, Value]]:
    """The changes of a fixed sampler, by name (a sweep's: `--grid` or not)."""
    return grid(options) if name == GRID else one_at_a_time(options)


def trial_seed(seed: int, number: int) -> int:
    """The seed of the sampler that proposes trial `number`: the same for a resumed search, in any process."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{number}".encode()).digest()[:4], "big")


def optuna_sampler(name: str, seed: int, number: int) -> Any:
    """The Optuna sampler that proposes trial `number` (a grid's points are enqueued: its sampler only fills in
    what no point gives)."""
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=trial_seed(seed, number))
    return optuna.samplers.RandomSampler(seed=trial_seed(seed, number))


def pruner_spec(name: str, judged_at: str = "epoch") -> dict[str, Any]:
    """The pruner as spec.json keeps it; `judged_at`: what its steps count (epochs, or optimizer steps)."""
    if name == "median":
        return {"name": "median", "n_startup_trials": MEDIAN_STARTUP_TRIALS, "n_warmup_steps": MEDIAN_WARMUP_EPOCHS,
                "interval_steps": 1, "step": judged_at}
    return {"name": "none"}


def optuna_pruner(pruner: dict[str, Any]) -> Any:
    """Optuna's pruner of a spec.json's `pruner`."""
    import optuna

    if pruner["name"] == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruner["n_startup_trials"], n_warmup_steps=pruner["n_warmup_steps"],
                                           interval_steps=pruner["interval_steps"])
    return optuna.pruners.NopPruner()
