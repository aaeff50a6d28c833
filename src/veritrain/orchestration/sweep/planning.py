"""The plan of a sweep, checked before anything runs: the --vary values parsed and each loaded as a config, one
trial per change (or per combination with --grid) with the seeds of --repeat and their config hashes, the pinned
train.threads, a --parent run checked against the base config; and the slots (one run each) the plan names."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from veritrain.core.config import ResolvedConfig, load_config, without_added_defaults
from veritrain.core.errors import ConfigError, RunFailed, UserError
from veritrain.core.selection import REPORT_SPLIT, SELECTION_SPLIT, has_validation_share, selection_name, sweep_metric
from veritrain.core.task_registry import task_spec
from veritrain.records.experiments import config_diff
from veritrain.records.record import read_record
from veritrain.records.workspace import Workspace

SWEEP_VERSION = 1  # of spec.json and summary.json


ONE_AT_A_TIME, GRID = "one-at-a-time", "grid"


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
    config_path: Optional[str]  # absolute; None for the built-in default
    cwd: str  # relative data paths given with --set resolve against it
    base: ResolvedConfig  # with the pinned threads
    base_overrides: list[str]
    mode: str
    varied: dict[str, list[Any]]
    trials: list[PlannedTrial]
    skipped: list[str]  # values left out, with the reason
    threads: int
    threads_reason: str
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
        cfg = self.base.config
        return {
            "config": {"path": self.config_path, "overrides": self.base_overrides, "hash": self.base.hash, "cwd": self.cwd},
            "exp_name": cfg.exp_name,
            "split": SELECTION_SPLIT,  # the split the trials' metrics and deltas come from
            "selection": self.selection,
            "report_split": REPORT_SPLIT,  # evaluated from the same checkpoint, shown for the best trial only
            "mode": self.mode,
            "varied": self.varied,
            "threads": self.threads,
            "threads_reason": self.threads_reason,
            "repeat": self.repeat,
            "parallel": self.parallel,
            "backend": self.backend,
            "parent": {"run": self.parent_run, "seeds": self.parent_seeds, "config_hashes": self.parent_hashes},
            "trials": [t.as_dict() for t in self.trials],
            "skipped": self.skipped,
        }


def split_values(text: str) -> list[str]:
    """`0.1,0.01` → ['0.1', '0.01']; commas inside brackets, braces or quotes belong to the value, so
    `[32,32],[64]` is two lists."""
    values, depth, quote, start = [], 0, "", 0
    for position, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            values.append(text[start:position].strip())
            start = position + 1
    values.append(text[start:].strip())
    return values


def parse_vary(items: tuple[str, ...] | list[str]) -> list[tuple[str, list[str]]]:
    """`--vary KEY=V1,V2,…` options as (key, [value texts]), in the order given."""
    parsed: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError("--vary", item, "expected KEY.PATH=V1,V2,..., e.g. --vary optim.lr=0.01,0.001")
        if any(key == seen for seen, _ in parsed):
            raise ConfigError("--vary", key, "given in two --vary options; list all its values in one: --vary KEY=V1,V2,...")
        if not text.strip():
            raise ConfigError("--vary", key, "no values; give one or more, comma-separated, e.g. --vary optim.lr=0.01,0.001")
        values = split_values(text)
        if any(not value for value in values):
            raise ConfigError("--vary", key, f"an empty value in {text!r}; give values separated by single commas")
        parsed.append((key, values))
    return parsed


def _load_varied(config: Optional[str], overrides: list[str]) -> ResolvedConfig:
    """A trial's config; a problem with it is a problem of --vary (the base config and --set loaded already)."""
    try:
        return load_config(config, overrides)
    except ConfigError as err:
        raise ConfigError("--vary", err.key, err.problem) from None


_MISSING = object()


def _value_at(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def change_text(change: dict[str, Any]) -> str:
    """`optim.lr=0.05, train.batch_size=32`"""
    return ", ".join(f"{key}={_shown(value)}" for key, value in change.items())


def plan(config: Optional[str], overrides: tuple[str, ...] | list[str], varies: tuple[str, ...] | list[str], grid: bool,
         repeat: int, parallel: int, backend: str, parent: Optional[str], workspace: Workspace, metric: Optional[str] = None) -> SweepPlan:
    """Everything a sweep will run, checked before anything runs: a bad --vary, --metric (a test metric), config,
    --parent, a config without a val split to select on, or a missing Ray is a UserError (exit 2) here."""
    if not varies:
        raise UserError("sweep: give at least one --vary KEY=V1,V2,..., e.g. --vary optim.lr=0.01,0.001")
    parsed = parse_vary(varies)
    if metric is not None:
        selection_name(metric)  # --metric test.* is refused here, before anything else
    if backend == "ray":
        require_ray()
    base = load_config(config, overrides)
    spec = task_spec(base.config.task)
    chosen = sweep_metric(metric, spec) if metric is not None else spec.headline  # without --metric: the task's headline
    if not has_validation_share(base.config.data):
        origin = "--set" if any(o.split("=", 1)[0].strip() in ("data", "data.split_ratios") for o in overrides) else (config or "<default>")
        raise ConfigError(origin, "data.split_ratios", f"{list(base.config.data.split_ratios)} gives the val split no samples, and a sweep "
                          "picks its best trial on val (the test split is for the final report only); give val a share, e.g. "
                          "--set data.split_ratios=[0.8,0.1,0.1]")
    parent_record = _given_parent(workspace, parent) if parent else None
    threads, threads_reason = pinned_threads(base, parallel, parent_record)
    base_overrides = list(overrides)
    if base.config.train.threads is None:
        base_overrides.append(f"train.threads={threads}")
        base = load_config(config, base_overrides)
    varied: dict[str, list[Any]] = {}
    for key, texts in parsed:  # each value on its own first, so an error names the value, not a combination
        for text in texts:
            value = _value_at(_load_varied(config, [*base_overrides, f"{key}={text}"]).as_dict(), key)
            varied.setdefault(key, []).append(None if value is _MISSING else value)
    if parent and parent_record is not None:  # parent_record is None without a parent
        _check_parent_config(parent, parent_record, base)

    base_dict = base.as_dict()
    combos = (list(itertools.product(*[[(key, text) for text in texts] for key, texts in parsed])) if grid
              else [[(key, text)] for key, texts in parsed for text in texts])
    seen = {base.hash: "the base config (the parent run)"}
    trials: list[PlannedTrial] = []
    skipped: list[str] = []
    for combo in combos:
        trial_overrides = [*base_overrides, *(f"{key}={text}" for key, text in combo)]
        resolved = _load_varied(config, trial_overrides)
        given = ", ".join(f"{key}={text}" for key, text in combo)
        if not has_validation_share(resolved.config.data):
            raise ConfigError("--vary", "data.split_ratios", f"{given} gives the val split no samples ({list(resolved.config.data.split_ratios)}), "
                              "and a sweep picks its best trial on val (the test split is for the final report only); give every value a val share")
        if resolved.hash in seen:
            skipped.append(f"{given}: the same config as {seen[resolved.hash]}")
            continue
        trial_dict = resolved.as_dict()
        change = {key: _value_at(trial_dict, key) for key, _ in combo if _value_at(trial_dict, key) != _value_at(base_dict, key)}
        change = {key: (None if value is _MISSING else value) for key, value in change.items()}
        index = len(trials)
        seen[resolved.hash] = f"trial {index}"
        seeds, hashes = _seeded(config, trial_overrides, resolved, repeat)
        trials.append(PlannedTrial(index, change, trial_overrides, hashes, seeds, f"{change_text(change)} vs parent"))
    if not trials:
        raise UserError(f"--vary: every value given is the base config's own ({'; '.join(skipped)}); give values that differ from it")
    parent_seeds, parent_hashes = ([], []) if parent_record is not None else _seeded(config, base_overrides, base, repeat)
    return SweepPlan(
        config_path=str(Path(config).resolve()) if config else None, cwd=os.getcwd(), base=base, base_overrides=base_overrides,
        mode=GRID if grid else ONE_AT_A_TIME, varied=varied,
        trials=trials, skipped=skipped, threads=threads, threads_reason=threads_reason, repeat=repeat, parallel=parallel,
        backend=backend, parent_run=parent_record["run_id"] if parent_record else None, parent_seeds=parent_seeds, parent_hashes=parent_hashes,
        selection={"split": SELECTION_SPLIT, "metric": chosen.name, "mode": chosen.goal},
    )


def _seeded(config: Optional[str], overrides: list[str], resolved: ResolvedConfig, repeat: int) -> tuple[list[int], list[str]]:
    """The seeds a trial (or the parent) runs with --repeat, and the config hash of each."""
    if repeat == 1:
        return [resolved.config.seed], [resolved.hash]
    seeds = [resolved.config.seed + index for index in range(repeat)]
    return seeds, [load_config(config, [*overrides, f"seed={seed}"]).hash for seed in seeds]


def pinned_threads(base: ResolvedConfig, parallel: int, parent_record: Optional[dict[str, Any]]) -> tuple[int, str]:
    """train.threads for every run of the sweep: a run's weights are bit-exact only for the same count, so a
    trial's final hash must not depend on which machine or worker ran it."""
    if base.config.train.threads is not None:
        return base.config.train.threads, "set in the base config"
    parent_threads = ((parent_record or {}).get("config") or {}).get("train", {}).get("threads")
    if isinstance(parent_threads, int):
        return parent_threads, "the --parent run's train.threads, so that the trials differ from it in their change only"
    if parallel > 1:
        return 1, f"--parallel {parallel}: one thread per run, so that parallel runs do not compete for cores"
    import torch  # only here: planning a sweep otherwise needs no torch

    return torch.get_num_threads(), "torch's default on the machine that planned the sweep"


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

    diff = config_diff(without_added_defaults(record.get("config") or {}), without_added_defaults(base.as_dict()))
    diff.pop("train.threads", None)
    if diff:
        shown = ", ".join(f"{key} ({_shown(a)} → {_shown(b)})" for key, (a, b) in list(diff.items())[:4]) + (", ..." if len(diff) > 4 else "")
        raise UserError(f"--parent {ref}: its config differs from the sweep's base config in {shown}; deltas against it would mix those "
                        f"changes in: sweep its own config (runs/{record['run_id']}/config.yaml), or leave --parent out")


def require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise UserError("--backend ray: the ray package is not installed; pip install 'veritrain[ray]'")


@dataclass(frozen=True)
class Slot:
    """One run of the sweep: a trial (None: the parent) with one of its seeds."""

    trial: Optional[int]
    seed_index: int

    def name(self, repeat: int) -> str:
        who = "parent" if self.trial is None else f"trial-{self.trial:03d}"
        return who if repeat == 1 else f"{who}-seed{self.seed_index}"


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
