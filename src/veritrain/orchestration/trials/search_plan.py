"""The plan of a search, checked before anything runs: the space file against the config, the metric (val only),
the sampler and pruner, the enqueued configurations, the pinned train.threads."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from veritrain.core.config import load_config
from veritrain.core.errors import ConfigError, UserError
from veritrain.core.selection import REPORT_SPLIT, SELECTION_SPLIT, selection_name, sweep_metric
from veritrain.core.task_registry import task_spec
from veritrain.orchestration.trials import samplers
from veritrain.orchestration.trials.planning import Base, plan_base, require_optuna, require_ray
from veritrain.orchestration.trials.space import Space, enqueued, load_space
from veritrain.orchestration.trials.state import SEARCH

log = logging.getLogger("veritrain")


@dataclass
class SearchPlan:
    base: Base  # the config every trial changes, with the pinned threads
    space: Space
    trials: int
    metric: str  # a val metric of eval/val/metrics.json, e.g. accuracy
    mode: str  # max or min
    epoch_key: Optional[str]  # the metrics.jsonl key of the same quantity after every validation (the task declares it)
    sampler: str
    pruner: str
    parallel: int
    backend: str
    seed: int
    enqueue: list[dict[str, Any]] = field(default_factory=list)  # configurations to try, config key → value
    enqueue_after: int = 0  # the first enqueued one is trial number enqueue_after
    judged_at: str = "epoch"  # what the study's steps count: `epoch`, or `step` when trials validate every eval.every_steps

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
            **self.base.as_spec(),
            "space": self.space.as_dict(),
            "trials": self.trials,
            "metric": {"split": SELECTION_SPLIT, "name": self.metric, "mode": self.mode, "epoch_key": self.epoch_key, "judged_at": self.judged_at},
            "report_split": REPORT_SPLIT,  # evaluated from the same checkpoint, never used for selection
            "sampler": {"name": self.sampler, "seed": self.seed, "seeding": "sha256(seed:trial number)"},
            "pruner": samplers.pruner_spec(self.pruner, self.judged_at),
            "enqueue": self.enqueue,
            "enqueue_after": self.enqueue_after,
            "parallel": self.parallel,
            "backend": self.backend,
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
    if sampler not in samplers.SEARCH_SAMPLERS:
        raise ConfigError("--sampler", sampler, f"unknown; give one of {', '.join(samplers.SEARCH_SAMPLERS)}")
    if pruner not in samplers.PRUNERS:
        raise ConfigError("--pruner", pruner, f"unknown; give one of {', '.join(samplers.PRUNERS)}")
    planned = plan_base(SEARCH, config, overrides, parallel, None)
    spec = task_spec(planned.config.config.task)
    declared = sweep_metric(metric, spec)
    if pruner == "median" and declared.epoch_key is None:
        raise ConfigError("--pruner", "median", f"val.{declared.name} is computed once, at evaluation, not after every epoch, so the pruner has "
                          f"nothing to judge; prune on {', '.join('val.' + m.name for m in spec.epoch_metrics())}, or give --pruner none")
    space = load_space(space_path, config, planned.overrides)
    if any(p.key == "eval.every_steps" for p in space.params):
        raise ConfigError(space_path, "eval.every_steps", "the trials of a search are judged at the same validations; set it in the config "
                          "(or --set), not in the space")
    if sampler == samplers.GRID:
        space.grid(space_path)  # a continuous range is exit 2 here
        if trials > space.grid_size():
            log.info("search: the grid has %d point(s); %d trial(s) instead of --trials %d", space.grid_size(), space.grid_size(), trials)
            trials = space.grid_size()
    configurations = [enqueued("--enqueue", text, space) for text in enqueue]
    for configuration in configurations:  # each loads as a config, before any trial runs
        try:
            load_config(config, [*planned.overrides, *space.overrides(configuration)])
        except ConfigError as err:
            raise ConfigError("--enqueue", err.key, err.problem) from None
    after = enqueue_after if enqueue_after is not None else (samplers.MEDIAN_STARTUP_TRIALS if pruner == "median" else 0)
    if configurations and after + len(configurations) > trials:
        raise UserError(f"--enqueue-after {after}: {len(configurations)} enqueued configuration(s) after trial {after} need --trials "
                        f"{after + len(configurations)} or more (given {trials})")
    return SearchPlan(base=planned, space=space, trials=trials, metric=declared.name, mode=declared.goal, epoch_key=declared.epoch_key, sampler=sampler,
                      pruner=pruner, parallel=parallel, backend=backend, seed=seed, enqueue=configurations, enqueue_after=after,
                      judged_at="step" if planned.config.config.eval.every_steps else "epoch")
