"""The plan of a sweep, checked before anything runs: the --vary values parsed and each loaded as a config, one
trial per change (or per combination with --grid) with the seeds of --repeat and their config hashes, the pinned
train.threads, a --parent run checked against the base config; and the slots (one run each) the plan names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from veritrain.core.config import ResolvedConfig, load_config
from veritrain.core.errors import ConfigError, RunFailed, UserError
from veritrain.core.selection import REPORT_SPLIT, SELECTION_SPLIT, has_validation_share, selection_name, sweep_metric
from veritrain.core.task_registry import task_spec
from veritrain.orchestration.trials import samplers
from veritrain.orchestration.trials.planning import MISSING, Base, change_text, parse_vary, plan_base, require_ray, shown, value_at
from veritrain.orchestration.trials.state import SWEEP, Slot
from veritrain.records.experiments import config_changes
from veritrain.records.record import read_record
from veritrain.records.workspace import Workspace


@dataclass
class PlannedTrial:
    index: int
    change: dict[str, Any]  # config key → the trial's value (as its recorded config holds it)
    overrides: list[str]  # the --set arguments of the trial's config: the base ones, then the change
    config_hashes: list[str]  # one per seed (seed, seed+1, … with --repeat)
    seeds: list[int]
    hypothesis: str

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "change": self.change, "overrides": self.overrides,
                "config_hashes": self.config_hashes, "seeds": self.seeds, "hypothesis": self.hypothesis}


@dataclass
class SweepPlan:
    base: Base  # the config every trial changes, with the pinned threads
    mode: str
    varied: dict[str, list[Any]]
    trials: list[PlannedTrial]
    skipped: list[str]  # values left out, with the reason
    repeat: int
    parallel: int
    backend: str
    parent_run: Optional[str]  # --parent RUN (resolved), else the sweep runs the base config first
    parent_seeds: list[int] = field(default_factory=list)
    parent_hashes: list[str] = field(default_factory=list)
    # what picks the best trial: a metric of each trial's eval/val/metrics.json (metric None: the headline)
    selection: dict[str, Any] = field(default_factory=lambda: {"split": SELECTION_SPLIT, "metric": None, "mode": None})

    def as_dict(self) -> dict[str, Any]:
        """The plan as spec.json keeps it (and `--dry-run --json` prints it)."""
        return {
            **self.base.as_spec(),
            "split": SELECTION_SPLIT,  # the split the trials' metrics and deltas come from
            "selection": self.selection,
            "report_split": REPORT_SPLIT,  # evaluated from the same checkpoint, shown for the best trial only
            "mode": self.mode,
            "varied": self.varied,
            "repeat": self.repeat,
            "parallel": self.parallel,
            "backend": self.backend,
            "parent": {"run": self.parent_run, "seeds": self.parent_seeds, "config_hashes": self.parent_hashes},
            "trials": [t.as_dict() for t in self.trials],
            "skipped": self.skipped,
        }


def _load_varied(config: Optional[str], overrides: list[str]) -> ResolvedConfig:
    """A trial's config; a problem with it is a problem of --vary (the base config and --set loaded already)."""
    try:
        return load_config(config, overrides)
    except ConfigError as err:
        raise ConfigError("--vary", err.key, err.problem) from None


def plan(config: Optional[str], overrides: tuple[str, ...] | list[str], varies: tuple[str, ...] | list[str], grid: bool,
         repeat: int, parallel: int, backend: str, parent: Optional[str], workspace: Workspace, metric: Optional[str] = None) -> SweepPlan:
    """Everything a sweep will run, checked before anything runs: a bad --vary, --metric (a test metric), config,
    --parent, a config without a val split to select on, or a missing Ray is a UserError (exit 2) here. The
    trials are the changes of a fixed sampler (`samplers.fixed`: one-at-a-time, or grid with --grid) over the
    texts given, less those that give a config already planned."""
    if not varies:
        raise UserError("sweep: give at least one --vary KEY=V1,V2,..., e.g. --vary optim.lr=0.01,0.001")
    options = dict(parse_vary(varies))
    if metric is not None:
        selection_name(metric)  # --metric test.* is refused here, before anything else
    if backend == "ray":
        require_ray()
    parent_record = _given_parent(workspace, parent) if parent else None
    planned = plan_base(SWEEP, config, list(overrides), parallel, parent_record)
    base, base_overrides = planned.config, planned.overrides
    spec = task_spec(base.config.task)
    chosen = sweep_metric(metric, spec) if metric is not None else spec.headline  # without --metric: the task's headline
    varied: dict[str, list[Any]] = {}
    for key, texts in options.items():  # each value on its own first, so an error names the value, not a combination
        for text in texts:
            value = value_at(_load_varied(config, [*base_overrides, f"{key}={text}"]).as_dict(), key)
            varied.setdefault(key, []).append(None if value is MISSING else value)
    if parent and parent_record is not None:  # parent_record is None without a parent
        _check_parent_config(parent, parent_record, base)

    base_dict = base.as_dict()
    seen = {base.hash: "the base config (the parent run)"}
    trials: list[PlannedTrial] = []
    skipped: list[str] = []
    for point in samplers.fixed(samplers.GRID if grid else samplers.ONE_AT_A_TIME, options):
        trial_overrides = [*base_overrides, *(f"{key}={text}" for key, text in point.items())]
        resolved = _load_varied(config, trial_overrides)
        given = ", ".join(f"{key}={text}" for key, text in point.items())
        if not has_validation_share(resolved.config.data):
            raise ConfigError("--vary", "data.split_ratios", f"{given} gives the val split no samples ({list(resolved.config.data.split_ratios)}), "
                              "and a sweep picks its best trial on val (the test split is for the final report only); give every value a val share")
        if resolved.hash in seen:
            skipped.append(f"{given}: the same config as {seen[resolved.hash]}")
            continue
        trial_dict = resolved.as_dict()
        change = {key: value_at(trial_dict, key) for key in point if value_at(trial_dict, key) != value_at(base_dict, key)}
        change = {key: (None if value is MISSING else value) for key, value in change.items()}
        index = len(trials)
        seen[resolved.hash] = f"trial {index}"
        seeds, hashes = _seeded(config, trial_overrides, resolved, repeat)
        trials.append(PlannedTrial(index, change, trial_overrides, hashes, seeds, f"{change_text(change)} vs parent"))
    if not trials:
        raise UserError(f"--vary: every value given is the base config's own ({'; '.join(skipped)}); give values that differ from it")
    parent_seeds, parent_hashes = ([], []) if parent_record is not None else _seeded(config, base_overrides, base, repeat)
    return SweepPlan(
        base=planned, mode=samplers.GRID if grid else samplers.ONE_AT_A_TIME, varied=varied,
        trials=trials, skipped=skipped, repeat=repeat, parallel=parallel,
        backend=backend, parent_run=parent_record["run_id"] if parent_record else None, parent_seeds=parent_seeds, parent_hashes=parent_hashes,
        selection={"split": SELECTION_SPLIT, "metric": chosen.name, "mode": chosen.goal},
    )


def _seeded(config: Optional[str], overrides: list[str], resolved: ResolvedConfig, repeat: int) -> tuple[list[int], list[str]]:
    """The seeds a trial (or the parent) runs with --repeat, and the config hash of each."""
    if repeat == 1:
        return [resolved.config.seed], [resolved.hash]
    seeds = [resolved.config.seed + index for index in range(repeat)]
    return seeds, [load_config(config, [*overrides, f"seed={seed}"]).hash for seed in seeds]


def _given_parent(workspace: Workspace, ref: str) -> dict[str, Any]:
    try:
        run_dir = workspace.resolve_run(ref)
    except UserError as err:
        raise UserError(f"--parent {err}") from None
    try:
        record = read_record(run_dir)
    except RunFailed as err:
        raise UserError(f"--parent {ref}: {err}") from None
    if record.get("status") != "completed":
        raise UserError(f"--parent {ref}: run {run_dir.name} is {record.get('status')}; trials are compared with a completed run: "
                        "give another, or leave --parent out and the sweep runs the base config first")
    return record


def _check_parent_config(ref: str, record: dict[str, Any], base: ResolvedConfig) -> None:
    """A --parent run must be the base config (threads aside): else every delta would mix other changes in."""

    diff = config_changes(record.get("config") or {}, base.as_dict())
    diff.pop("train.threads", None)
    if diff:
        listed = ", ".join(f"{key} ({shown(a)} → {shown(b)})" for key, (a, b) in list(diff.items())[:4]) + (", ..." if len(diff) > 4 else "")
        raise UserError(f"--parent {ref}: its config differs from the sweep's base config in {listed}; deltas against it would mix those "
                        f"changes in: sweep its own config (runs/{record['run_id']}/config.yaml), or leave --parent out")


@dataclass
class SlotState:
    run_id: Optional[str] = None
    status: str = "pending"  # until a run exists: pending, running, failed or interrupted (before its run started)
    error: Optional[str] = None


def planned_hashes(spec: dict[str, Any]) -> dict[Slot, str]:
    hashes = {Slot(None, i): h for i, h in enumerate(spec["parent"]["config_hashes"])}
    for trial in spec["trials"]:
        hashes.update({Slot(trial["index"], i): h for i, h in enumerate(trial["config_hashes"])})
    return hashes


def slot_overrides(spec: dict[str, Any], overrides: dict[Optional[int], list[str]], slot: Slot) -> list[str]:
    seeds = spec["parent"]["seeds"] if slot.trial is None else spec["trials"][slot.trial]["seeds"]
    return [*overrides[slot.trial], *([f"seed={seeds[slot.seed_index]}"] if spec["repeat"] > 1 else [])]
