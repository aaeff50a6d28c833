"""The plan of a search, checked before anything runs: the space file against the config, the metric (val only),
the sampler and pruner, the enqueued configurations, the pinned train.threads; and how each trial's sampler is
seeded, so that a seed proposes the same configurations again."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from veritrain.core.config import ResolvedConfig, load_config
from veritrain.core.errors import ConfigError, UserError
from veritrain.core.selection import REPORT_SPLIT, SELECTION_SPLIT, has_validation_share, selection_name, sweep_metric
from veritrain.core.task_registry import task_spec
from veritrain.orchestration.search.space import Space, enqueued, load_space
from veritrain.orchestration.sweep.planning import pinned_threads, require_ray

log = logging.getLogger("veritrain")

SEARCH_VERSION = 1  # of spec.json and summary.json
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "none")
# Optuna's MedianPruner: no trial is pruned before this many have completed, and every epoch is judged
MEDIAN_STARTUP_TRIALS = 5
MEDIAN_WARMUP_EPOCHS = 0


@dataclass
class SearchPlan:
    config_path: Optional[str]  # absolute; None for the built-in default
    cwd: str  # relative data paths given with --set resolve against it
    base: ResolvedConfig  # with the pinned threads
    base_overrides: list[str]
    space: Space
    trials: int
    metric: str  # a val metric of eval/val/metrics.json, e.g. accuracy
    mode: str  # max or min
    epoch_key: Optional[str]  # the metrics.jsonl key of the same quantity after every epoch (the task declares it)
    sampler: str
    pruner: str
    parallel: int
    backend: str
    seed: int
    threads: int
    threads_reason: str
    enqueue: list[dict[str, Any]] = field(default_factory=list)  # configurations to try, config key → value
    enqueue_after: int = 0  # the first enqueued one is trial number enqueue_after

    def reproducible(self) -> dict[str, Any]:
        """Whether the same seed proposes the same configurations, and why (the record says so)."""
        if self.sampler == "tpe" and self.parallel > 1:
            return {"proposals": False, "reason": f"TPE with --parallel {self.parallel}: each proposal depends on which trials have finished "
                    "when it is asked for, which the timing of parallel runs decides; use --parallel 1 or --sampler random for the same "
                    "proposals again"}
        return {"proposals": True, "reason": f"{self.sampler} with --parallel {self.parallel}: trial n's sampler is seeded with "
                "(seed, n), and " + ("it proposes from the trials told before it, in order" if self.sampler == "tpe" and self.parallel == 1
                                     else "its proposal depends on the seed and n alone")}

    def as_dict(self) -> dict[str, Any]:
        """The plan as spec.json keeps it."""
        return {
            "config": {"path": self.config_path, "overrides": self.base_overrides, "hash": self.base.hash, "cwd": self.cwd},
            "exp_name": self.base.config.exp_name,
            "space": self.space.as_dict(),
            "trials": self.trials,
            "metric": {"split": SELECTION_SPLIT, "name": self.metric, "mode": self.mode, "epoch_key": self.epoch_key},
            "report_split": REPORT_SPLIT,  # evaluated from the same checkpoint, never used for selection
            "sampler": {"name": self.sampler, "seed": self.seed, "seeding": "sha256(seed:trial number)"},
            "pruner": ({"name": "median", "n_startup_trials": MEDIAN_STARTUP_TRIALS, "n_warmup_steps": MEDIAN_WARMUP_EPOCHS,
                        "interval_steps": 1, "step": "epoch"} if self.pruner == "median" else {"name": "none"}),
            "enqueue": self.enqueue,
            "enqueue_after": self.enqueue_after,
            "parallel": self.parallel,
            "backend": self.backend,
            "threads": self.threads,
            "threads_reason": self.threads_reason,
            "repeat": 1,  # one seed per trial (LocalTrials names its slots by it)
            "reproducible": self.reproducible(),
        }


def plan(config: Optional[str], overrides: list[str], space_path: str, trials: int, metric: str, sampler: str, pruner: str,
         parallel: int, backend: str, seed: int, enqueue: list[str], enqueue_after: Optional[int]) -> SearchPlan:
    """Everything a search will run, checked first: a test metric, a bad space, a grid over a continuous range,
    an enqueued configuration outside the space, a config without a val split, or a missing Optuna is exit 2."""

    selection_name(metric)  # --metric test.* is refused here, before anything else
    require_optuna()
    if backend == "ray":
        require_ray()
    if sampler not in SAMPLERS:
        raise ConfigError("--sampler", sampler, f"unknown; give one of {', '.join(SAMPLERS)}")
    if pruner not in PRUNERS:
        raise ConfigError("--pruner", pruner, f"unknown; give one of {', '.join(PRUNERS)}")
    base = load_config(config, overrides)
    spec = task_spec(base.config.task)
    declared = sweep_metric(metric, spec)
    name, mode = declared.name, declared.goal
    if pruner == "median" and declared.epoch_key is None:
        raise ConfigError("--pruner", "median", f"val.{name} is computed once, at evaluation, not after every epoch, so the pruner has "
                          f"nothing to judge; prune on {', '.join('val.' + m.name for m in spec.epoch_metrics())}, or give --pruner none")
    if not has_validation_share(base.config.data):
        raise ConfigError(config or "<default>", "data.split_ratios", f"{list(base.config.data.split_ratios)} gives the val split no samples, "
                          "and a search selects on val (the test split is for the final report only); give val a share, e.g. "
                          "--set data.split_ratios=[0.8,0.1,0.1]")
    threads, threads_reason = pinned_threads(base, parallel, None)
    base_overrides = list(overrides)
    if base.config.train.threads is None:
        base_overrides.append(f"train.threads={threads}")
        base = load_config(config, base_overrides)
    space = load_space(space_path, config, base_overrides)
    if sampler == "grid":
        space.grid(space_path)  # a continuous range is exit 2 here
        if trials > space.grid_size():
            log.info("search: the grid has %d point(s); %d trial(s) instead of --trials %d", space.grid_size(), space.grid_size(), trials)
            trials = space.grid_size()
    configurations = [enqueued("--enqueue", text, space) for text in enqueue]
    for configuration in configurations:  # each loads as a config, before any trial runs
        try:
            load_config(config, [*base_overrides, *space.overrides(configuration)])
        except ConfigError as err:
            raise ConfigError("--enqueue", err.key, err.problem) from None
    after = enqueue_after if enqueue_after is not None else (MEDIAN_STARTUP_TRIALS if pruner == "median" else 0)
    if configurations and after + len(configurations) > trials:
        raise UserError(f"--enqueue-after {after}: {len(configurations)} enqueued configuration(s) after trial {after} need --trials "
                        f"{after + len(configurations)} or more (given {trials})")
    return SearchPlan(config_path=str(Path(config).resolve()) if config else None, cwd=os.getcwd(), base=base, base_overrides=base_overrides,
                      space=space, trials=trials, metric=name, mode=mode, epoch_key=declared.epoch_key, sampler=sampler, pruner=pruner, parallel=parallel, backend=backend,
                      seed=seed, threads=threads, threads_reason=threads_reason, enqueue=configurations, enqueue_after=after)


def require_optuna() -> None:
    if importlib.util.find_spec("optuna") is None:
        raise UserError("search: the optuna package is not installed; pip install 'veritrain[search]'")


def trial_seed(seed: int, number: int) -> int:
    """The seed of the sampler that proposes trial `number`: the same for a resumed search, in any process."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{number}".encode()).digest()[:4], "big")


def sampler_for(spec: dict[str, Any], number: int) -> Any:
    """The Optuna sampler that proposes trial `number` of the search `spec` describes (a grid's trials are fixed
    in advance, `grid_point`: their sampler only fills in what no point gives)."""
    import optuna

    seed = trial_seed(int(spec["sampler"]["seed"]), number)
    if spec["sampler"]["name"] == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def grid_points(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every point of a grid search, in the order its trials take them: the product of the keys' values,
    shuffled by the seed (so that a search cut short has sampled the grid evenly rather than its first corner).
    Optuna's own GridSampler is not used: it stops the study from inside `tell`, which only an `optimize` loop allows."""

    space = Space.from_dict(spec["space"])
    grid = space.grid("spec.json")
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    random.Random(int(spec["sampler"]["seed"])).shuffle(points)
    return points


def pruner_for(spec: dict[str, Any]) -> Any:
    import optuna

    pruner = spec["pruner"]
    if pruner["name"] == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruner["n_startup_trials"], n_warmup_steps=pruner["n_warmup_steps"],
                                           interval_steps=pruner["interval_steps"])
    return optuna.pruners.NopPruner()
