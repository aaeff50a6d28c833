"""`veritrain sweep`: runs that each change the base config in one key (or, with `--grid`, in every
combination of the values given), each compared with one parent run of the base config.

    veritrain sweep configs/digits.yaml --vary optim.lr=0.01,0.001 --vary train.batch_size=32,128 --parallel 2
    veritrain sweep --resume latest

The plan goes to `.veritrain/sweeps/<id>/spec.json` before anything runs. The parent run of the base config
runs first, then the trials, up to `--parallel` at once, each in a fresh process (`veritrain.sweep_trial`) or as
a Ray task. Every one is a normal run whose record names the sweep (`sweep`: id, trial, change), its parent and
a hypothesis. Every run evaluates the val and the test split from the same checkpoint (the one it would ship).
`summary.json` beside the spec is rewritten as runs finish: each trial's val metrics with their deltas against the
parent, the seed spread with `--repeat`, the best trial (chosen on val, by `--metric` or the headline) with its
test result, which is reported and never used for selection, and the failed trials with their reason.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol, cast

from veritrain.config import ResolvedConfig, load_config, without_added_defaults
from veritrain.errors import ConfigError, Interrupted, RunFailed, UserError, VeritrainError
from veritrain.files import write_atomic
from veritrain.record import now_iso, read_record
from veritrain.selection import NOT_USED_FOR_SELECTION, REPORT_SPLIT, SELECTION_SPLIT, has_validation_share, sweep_metric
from veritrain.signals import StopFlag, interruptible
from veritrain.sweep_trial import working_dir
from veritrain.workspace import Workspace, by_prefix

log = logging.getLogger("veritrain")

SWEEP_VERSION = 1  # of spec.json and summary.json
# The metric that picks the best trial without --metric: the first of these the runs report on val, with the
# direction that is better.
HEADLINE = (("accuracy", "max"), ("macro_f1", "max"), ("rmse", "min"), ("mae", "min"), ("log_loss", "min"))
POLL_SECONDS = 0.2  # how often the driver looks for finished runs; a signal is acted on within this time
ONE_AT_A_TIME, GRID = "one-at-a-time", "grid"


# ---------------------------------------------------------------- the plan


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
    chosen = sweep_metric(metric) if metric is not None else (None, None)
    if backend == "ray":
        require_ray()
    base = load_config(config, overrides)
    if not has_validation_share(base.config.data):
        origin = "--set" if any(o.split("=", 1)[0].strip() in ("data", "data.split_ratios") for o in overrides) else (config or "<default>")
        raise ConfigError(origin, "data.split_ratios", f"{list(base.config.data.split_ratios)} gives the val split no samples, and a sweep "
                          "picks its best trial on val (the test split is for the final report only); give val a share, e.g. "
                          "--set data.split_ratios=[0.8,0.1,0.1]")
    parent_record = _given_parent(workspace, parent) if parent else None
    threads, threads_reason = _pinned_threads(base, parallel, parent_record)
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
        selection={"split": SELECTION_SPLIT, "metric": chosen[0], "mode": chosen[1]},
    )



def _seeded(config: Optional[str], overrides: list[str], resolved: ResolvedConfig, repeat: int) -> tuple[list[int], list[str]]:
    """The seeds a trial (or the parent) runs with --repeat, and the config hash of each."""
    if repeat == 1:
        return [resolved.config.seed], [resolved.hash]
    seeds = [resolved.config.seed + index for index in range(repeat)]
    return seeds, [load_config(config, [*overrides, f"seed={seed}"]).hash for seed in seeds]


def _pinned_threads(base: ResolvedConfig, parallel: int, parent_record: Optional[dict[str, Any]]) -> tuple[int, str]:
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
    from veritrain.experiments import config_diff

    diff = config_diff(without_added_defaults(record.get("config") or {}), without_added_defaults(base.as_dict()))
    diff.pop("train.threads", None)
    if diff:
        shown = ", ".join(f"{key} ({_shown(a)} → {_shown(b)})" for key, (a, b) in list(diff.items())[:4]) + (", ..." if len(diff) > 4 else "")
        raise UserError(f"--parent {ref}: its config differs from the sweep's base config in {shown}; deltas against it would mix those "
                        f"changes in: sweep its own config (runs/{record['run_id']}/config.yaml), or leave --parent out")


def require_ray() -> None:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise UserError("--backend ray: the ray package is not installed; pip install 'veritrain[ray]'")


# ---------------------------------------------------------------- running


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


@dataclass
class SweepOutcome:
    summary: dict[str, Any]  # what `--json` prints
    error: Optional[VeritrainError | Interrupted] = None


def start(sweep_plan: SweepPlan, workspace: Workspace, argv: list[str], smoke: bool, ray_address: Optional[str] = None) -> SweepOutcome:
    """Run a planned sweep: the smoke test of the base config (unless --no-smoke, or a --parent run stands in
    for the base config), the parent run, then the trials."""
    from veritrain.pipeline import refuse_secrets

    refuse_secrets(argv)  # spec.json keeps the command line as given
    smoke_result: dict[str, Any]
    if sweep_plan.parent_run:
        smoke_result = {"status": "skipped", "reason": f"the parent run {sweep_plan.parent_run} was given with --parent"}
    elif smoke:
        from veritrain import smoke as smoke_module

        passed = smoke_module.ensure(sweep_plan.base, workspace)  # fails fast (exit 1) before any run starts
        smoke_result = {"key": passed["key"], "status": passed["status"], "cached": passed["cached"]}
    else:
        smoke_result = {"status": "skipped"}
    sweep_id, folder = _new_sweep_folder(workspace)
    with _driving(workspace, sweep_id, ""):
        return _start_driving(sweep_plan, workspace, argv, ray_address, smoke_result, sweep_id, folder)


def _start_driving(sweep_plan: SweepPlan, workspace: Workspace, argv: list[str], ray_address: Optional[str],
                   smoke_result: dict[str, Any], sweep_id: str, folder: Path) -> SweepOutcome:
    spec = {"sweep_version": SWEEP_VERSION, "id": sweep_id, "created_at": now_iso(), "argv": argv,
            "workspace": str(workspace.root), "smoke": smoke_result, **sweep_plan.as_dict()}
    try:
        spec["code"] = _record_code(folder, sweep_plan)
        backend = _open_backend(sweep_plan.backend, spec, folder, sweep_plan.parallel, ray_address)
    except UserError:
        shutil.rmtree(folder, ignore_errors=True)  # nothing ran: no sweep to resume
        raise
    write_atomic(folder / "spec.json", _json_bytes(spec))
    log.info("sweep %s: %d trial(s) (%s) of %s, %d seed(s) each, threads %d; plan in %s", sweep_id, len(sweep_plan.trials),
             sweep_plan.mode, ", ".join(sweep_plan.varied), sweep_plan.repeat, sweep_plan.threads, folder / "spec.json")
    for note in sweep_plan.skipped:
        log.info("sweep: left out %s", note)
    overrides = {None: sweep_plan.base_overrides, **{t.index: t.overrides for t in sweep_plan.trials}}
    return _drive(workspace, spec, folder, argv, overrides, {}, backend, sweep_plan.parallel)


def _record_code(folder: Path, sweep_plan: SweepPlan) -> dict[str, Any]:
    """Copy the user code the sweep's configs name (every `model.target` of the base and the trials, and what it
    imports) into the sweep's `code/` folder, as a run does: every trial runs these copies, so an edit during the
    sweep never reaches its later trials. A missing module is exit 2 here, before any run starts."""
    from veritrain import usercode

    targets = [sweep_plan.base.config.model.target, *(trial.change.get("model.target") for trial in sweep_plan.trials)]
    listed: dict[str, Any] = {"user_files": []}
    with usercode.fresh(Path(sweep_plan.config_path) if sweep_plan.config_path else None, Path(sweep_plan.cwd)) as session:
        for target in sorted({str(t) for t in targets if t}):
            session.import_target(target)
        session.save(folder, listed)
    return {"user_files": listed["user_files"], "sha256": usercode.listing_sha256(listed["user_files"])}


def resume(workspace: Workspace, ref: str, argv: list[str], parallel: Optional[int], backend: Optional[str],
           ray_address: Optional[str] = None, trust_code: bool = False) -> SweepOutcome:
    """Continue a sweep: completed and failed runs are kept, interrupted ones resume in their own folders, the
    runs that never started start. spec.json is workspace state that may come from a copied workspace: its
    id must be its folder's name, and a planned config that names code needs `trust_code`."""
    folder = resolve_sweep(workspace, ref)
    try:
        spec = json.loads((folder / "spec.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} cannot be read ({err}); the sweep cannot be resumed") from None
    if not isinstance(spec, dict) or spec.get("sweep_version") != SWEEP_VERSION:
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} is not a sweep plan of format {SWEEP_VERSION} this veritrain reads")
    try:
        return _resume(workspace, spec, folder, ref, argv, parallel, backend, ray_address, trust_code)
    except (KeyError, TypeError, AttributeError, IndexError) as err:  # a hand-edited or damaged plan: never a traceback
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} is malformed ({err.__class__.__name__}: {str(err)[:80]}); start a new sweep") from None


def _resume(workspace: Workspace, spec: dict[str, Any], folder: Path, ref: str, argv: list[str], parallel: Optional[int],
            backend: Optional[str], ray_address: Optional[str], trust_code: bool) -> SweepOutcome:
    sweep_id = spec["id"]
    if sweep_id != folder.name:
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} names sweep {str(sweep_id)[:40]!r}, not its folder's {folder.name}; start a new sweep")
    if not all(isinstance(t, dict) and t.get("index") == i for i, t in enumerate(spec["trials"])):
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} lists its trials out of order; start a new sweep")
    with _driving(workspace, sweep_id, f"--resume {ref}: "):
        return _resume_driving(workspace, spec, folder, ref, argv, parallel, backend, ray_address, trust_code)


@contextmanager
def _driving(workspace: Workspace, sweep_id: str, prefix: str) -> Iterator[None]:
    """Hold the sweep's lock (`.veritrain/locks/sweep-<id>.lock`) while this process drives it: taken at once or
    not at all, so two drivers of one sweep (two `--resume`s started together) never both start its pending runs."""
    try:
        workspace.lock_run(_lock_name(sweep_id))
    except UserError:
        raise UserError(f"{prefix}sweep {sweep_id} is still running (a live process holds "
                        f".veritrain/locks/{_lock_name(sweep_id)}.lock); wait for it, its summary is "
                        f".veritrain/sweeps/{sweep_id}/summary.json") from None
    try:
        yield
    finally:
        workspace.unlock_run(_lock_name(sweep_id))


def _resume_driving(workspace: Workspace, spec: dict[str, Any], folder: Path, ref: str, argv: list[str], parallel: Optional[int],
                    backend: Optional[str], ray_address: Optional[str], trust_code: bool) -> SweepOutcome:
    sweep_id = spec["id"]
    backend = cast(str, backend or spec["backend"])  # the sweep's own backend, recorded in its spec
    if backend == "ray":
        require_ray()
    parallel = parallel or spec["parallel"]
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise UserError(f"--resume {ref}: spec.json says parallel {str(parallel)[:20]}; give --parallel K (K ≥ 1)")
    found = _runs_of(workspace, spec)
    for slot, record in found.items():
        if record["status"] == "running" and not workspace.lock_is_stale(record["run_id"]):
            raise UserError(f"--resume {ref}: run {record['run_id']} of the sweep is still running (its lock is held by a live process); wait for it")
    overrides = {None: spec["config"]["overrides"], **{t["index"]: t["overrides"] for t in spec["trials"]}}
    _check_unchanged(spec, found, overrides, ref, trust_code)
    finished = sum(1 for record in found.values() if record["status"] in ("completed", "failed"))
    if finished == len(_planned_hashes(spec)):
        log.info("sweep %s: every run has finished (failed runs are kept: they would fail the same way); nothing to resume", sweep_id)
    else:
        log.info("sweep %s: resuming (%d of its %d runs have finished)", sweep_id, finished, len(_planned_hashes(spec)))
    return _drive(workspace, spec, folder, argv, overrides, found, _open_backend(backend, spec, folder, parallel, ray_address), parallel)


def _check_unchanged(spec: dict[str, Any], found: dict[Slot, dict[str, Any]], overrides: dict[Optional[int], list[str]], ref: str,
                     trust_code: bool) -> None:
    """Runs that start now must get the config the sweep planned: the config file may have changed since. A
    planned config that names code (model.target) is code: building its model runs it, so it needs trust_code."""
    cwd = spec["config"]["cwd"]
    if not Path(cwd).is_dir():
        raise UserError(f"--resume {ref}: {cwd}, the folder the sweep started in, is gone; relative paths of its config resolve against it")
    for slot, expected in _planned_hashes(spec).items():
        if slot in found:
            continue
        with working_dir(cwd):
            try:
                resolved = load_config(spec["config"]["path"], _slot_overrides(spec, overrides, slot))
            except ConfigError as err:
                raise UserError(f"--resume {ref}: the sweep's config no longer loads ({err}); start a new sweep") from None
        target = resolved.config.model.target
        if target and not trust_code:
            raise UserError(f"--resume {ref}: {slot.name(spec['repeat'])}'s planned config names code (model.target {str(target)[:80]!r}); "
                            "building its model would run that code: read spec.json and that code, then pass --trust-code")
        if resolved.hash != expected:
            raise UserError(f"--resume {ref}: {slot.name(spec['repeat'])}'s config now hashes to {resolved.hash[:12]}, the sweep planned "
                            f"{expected[:12]}: {spec['config']['path'] or 'the built-in default'} changed since the sweep started; start a new sweep")


def _planned_hashes(spec: dict[str, Any]) -> dict[Slot, str]:
    hashes = {Slot(None, i): h for i, h in enumerate(spec["parent"]["config_hashes"])}
    for trial in spec["trials"]:
        hashes.update({Slot(trial["index"], i): h for i, h in enumerate(trial["config_hashes"])})
    return hashes


def _slot_overrides(spec: dict[str, Any], overrides: dict[Optional[int], list[str]], slot: Slot) -> list[str]:
    seeds = spec["parent"]["seeds"] if slot.trial is None else spec["trials"][slot.trial]["seeds"]
    return [*overrides[slot.trial], *([f"seed={seeds[slot.seed_index]}"] if spec["repeat"] > 1 else [])]


def _lock_name(sweep_id: str) -> str:
    return f"sweep-{sweep_id}"  # in .veritrain/locks/ beside the run locks: `gc` clears it when stale


def _drive(workspace: Workspace, spec: dict[str, Any], folder: Path, argv: list[str], overrides: dict[Optional[int], list[str]],
           found: dict[Slot, dict[str, Any]], backend: TrialBackend, parallel: int) -> SweepOutcome:
    from veritrain import pipeline

    repeat = spec["repeat"]
    states: dict[Slot, SlotState] = {slot: SlotState() for slot in _planned_hashes(spec)}
    for slot, record in found.items():
        if slot in states:  # a run the plan does not name (a hand-made link) is not the sweep's
            states[slot] = SlotState(run_id=record["run_id"], status=record["status"])
    if spec["parent"]["run"]:
        states[Slot(None, 0)] = SlotState(run_id=spec["parent"]["run"], status="completed")
    workspace.lock_run(_lock_name(spec["id"]))
    error: Optional[VeritrainError | Interrupted] = None

    def on_started(slot: Slot) -> None:
        states[slot].status = "running"
        _write_summary(workspace, spec, folder, states, "running")

    def on_finished(slot: Slot, result: dict[str, Any]) -> None:
        state = states[slot]
        state.run_id = result.get("run_id") or state.run_id
        state.status, state.error = result["status"], result.get("error")
        line = f"sweep {spec['id']}: {slot.name(repeat)} {state.status}" + (f" (run {state.run_id})" if state.run_id else "")
        if state.status == "completed":
            log.info(line)
        else:
            log.warning("%s: %s", line, state.error or "see its train.log")
        _write_summary(workspace, spec, folder, states, "running")
        pipeline.update_experiments(workspace)  # the trials leave the index to this process

    try:
        with interruptible() as stop, stop.deferred():
            parent_slots = [slot for slot in states if slot.trial is None]
            _run_slots(_jobs(spec, states, overrides, argv, parent_slots, workspace=workspace), backend, parallel, stop, on_started, on_finished)
            parent_states = [states[slot] for slot in sorted(parent_slots, key=lambda s: s.seed_index)]
            unfinished = next((state for state in parent_states if state.status != "completed"), None)
            if unfinished is not None:  # nothing to compare the trials with: they do not start
                error = _parent_unfinished(spec["id"], unfinished)
            else:
                trial_slots = [slot for slot in states if slot.trial is not None]
                jobs = _jobs(spec, states, overrides, argv, trial_slots, [state.run_id for state in parent_states], workspace=workspace)
                _run_slots(jobs, backend, parallel, stop, on_started, on_finished)
    except Interrupted as err:
        error = err
    finally:
        backend.close()
        workspace.unlock_run(_lock_name(spec["id"]))
    for slot, record in _runs_of(workspace, spec).items():  # runs whose process never reported back (a second signal)
        if slot in states and (states[slot].run_id is None or states[slot].status == "running"):
            states[slot] = SlotState(run_id=record["run_id"], status=record["status"])
    summary = _write_summary(workspace, spec, folder, states, "interrupted" if isinstance(error, Interrupted) else None)
    pipeline.update_experiments(workspace)
    if error is None:
        error = _trial_failures(summary)
    if summary["status"] == "interrupted":
        log.warning("sweep %s interrupted; continue with: veritrain sweep --resume %s", spec["id"], spec["id"])
    return SweepOutcome(summary=summary, error=error)


def _parent_unfinished(sweep_id: str, state: SlotState) -> RunFailed:
    what = f"the parent run {state.run_id}" if state.run_id else "the parent run's process"
    if state.status == "interrupted":
        return RunFailed(f"sweep {sweep_id}: {what} was interrupted, so no trial started; continue with: veritrain sweep --resume {sweep_id}")
    return RunFailed(f"sweep {sweep_id}: {what} {state.status} ({_one_line(state.error or 'see its train.log', 300)}), so no trial started; "
                     "fix the base config and start a new sweep")


def _trial_failures(summary: dict[str, Any]) -> Optional[RunFailed]:
    trials = summary["trials"]
    failed = [t for t in trials if t["status"] == "failed"]
    unfinished = [t for t in trials if t["status"] not in ("completed", "failed")]
    if failed:
        reasons = "; ".join(f"trial {t['index']} ({change_text(t['change'])})" + (f", run {', '.join(t['run_ids'])}" if t["run_ids"] else "")
                            + f": {_one_line(t['error'] or 'failed', 160)}" for t in failed[:3])
        return RunFailed(f"sweep {summary['id']}: {len(failed)} of {len(trials)} trials failed: {reasons}" + ("; ..." if len(failed) > 3 else ""))
    if unfinished:
        return RunFailed(f"sweep {summary['id']}: {len(unfinished)} of {len(trials)} trials did not finish ({unfinished[0]['status']}); "
                         f"continue with: veritrain sweep --resume {summary['id']}")
    return None


def _one_line(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _jobs(spec: dict[str, Any], states: dict[Slot, SlotState], overrides: dict[Optional[int], list[str]],
          argv: list[str], slots: list[Slot], parent_ids: Optional[list[Optional[str]]] = None, *,
          workspace: Workspace) -> list[tuple[Slot, dict[str, Any]]]:
    """What each slot still needs: nothing when its run completed or failed (a failed run would fail the same
    way; its failure stays in the summary), a resume when it was interrupted, else a new run."""
    jobs = []
    repeat = spec["repeat"]
    for slot in sorted(slots, key=lambda s: (-1 if s.trial is None else s.trial, s.seed_index)):
        state = states[slot]
        if state.run_id and state.status in ("completed", "failed"):
            continue
        # this workspace, never a path from spec.json (a copied or moved workspace would write elsewhere)
        job: dict[str, Any] = {"workspace": str(workspace.root), "cwd": spec["config"]["cwd"], "argv": argv, "driver_pid": os.getpid(),
                               "sweep_id": spec["id"], "code": spec.get("code"), "slot": slot.name(repeat)}  # the code copied at the sweep's start
        if state.run_id:  # interrupted, or `running` with a dead process (resume checked that no live process holds it)
            job["resume_run"] = state.run_id
        else:
            trial = None if slot.trial is None else spec["trials"][slot.trial]
            hashes = spec["parent"]["config_hashes"] if trial is None else trial["config_hashes"]
            if trial is None:
                hypothesis = f"the base config of sweep {spec['id']}, the reference its trials are compared with"
                smoke, parent = spec["smoke"], None
            else:
                hypothesis = trial["hypothesis"]
                smoke = _trial_smoke(spec)
                ids = parent_ids or [None]
                parent = ids[slot.seed_index] if slot.seed_index < len(ids) else ids[0]  # a --parent run: one for every seed
            job.update({
                "config_path": spec["config"]["path"], "overrides": _slot_overrides(spec, overrides, slot), "config_hash": hashes[slot.seed_index],
                "hypothesis": hypothesis, "parent": parent, "smoke": smoke,
                "repeat": {"group": f"sweep-{spec['id']}-{'parent' if trial is None else trial['index']}", "index": slot.seed_index, "of": repeat}
                if repeat > 1 else None,
                "sweep": {"id": spec["id"], "trial": slot.trial, "change": {} if trial is None else trial["change"]},
                "selection": planned_selection(spec),  # the record's selection.sweep
            })
        jobs.append((slot, job))
    return jobs


def _trial_smoke(spec: dict[str, Any]) -> dict[str, Any]:
    """What a trial's record says of the smoke test: the sweep runs one, of the base config, not one per trial."""
    ran = spec["smoke"]
    if ran.get("key"):
        return {"status": "skipped", "reason": f"sweep {spec['id']}: one smoke test, of the base config ({ran['key'][:12]}), before its parent run"}
    return {"status": "skipped", "reason": f"sweep {spec['id']}: " + (ran.get("reason") or "--no-smoke")}


def _run_slots(jobs: list[tuple[Slot, dict[str, Any]]], backend: "TrialBackend", parallel: int, stop: StopFlag,
               on_started: Callable[[Slot], None], on_finished: Callable[[Slot, dict[str, Any]], None]) -> None:
    """Up to `parallel` runs at once. The first SIGINT/SIGTERM is passed on to the running ones (each checkpoints
    and ends as `interrupted`) and nothing new starts; a second one passes the signal on again and stops waiting."""
    pending = list(jobs)
    running: dict[Slot, Any] = {}
    passed_on = False
    try:
        while pending or running:
            if stop.signum is not None and not passed_on:
                backend.interrupt(running, stop.signum, again=False)
                passed_on, pending = True, []
            while pending and len(running) < parallel and stop.signum is None:
                slot, job = pending.pop(0)
                running[slot] = backend.start(slot, job)
                on_started(slot)
            for slot, result in backend.finished(running, POLL_SECONDS):
                del running[slot]
                on_finished(slot, result)
    except Interrupted as err:  # the second signal
        backend.interrupt(running, err.signum, again=True)
        raise
    if stop.signum is not None:
        raise Interrupted(stop.signum)


# ---------------------------------------------------------------- backends


class TrialBackend(Protocol):
    """Where the runs of a sweep execute: each `start` returns a handle; `finished` returns the results of those
    that ended within `timeout` seconds; `interrupt` passes a signal on (`again`: the second, which stops at once)."""

    def start(self, slot: Slot, job: dict[str, Any]) -> Any: ...

    def finished(self, running: dict[Slot, Any], timeout: float) -> list[tuple[Slot, dict[str, Any]]]: ...

    def interrupt(self, running: dict[Slot, Any], signum: int, again: bool) -> None: ...

    def close(self) -> None: ...


def _trial_environment(threads: int) -> dict[str, str]:
    from veritrain.pipeline import DEFER_INDEX_VARIABLE

    # OMP_NUM_THREADS as Ray sets it for a task of `threads` CPUs; set on both backends so their records agree
    return {"OMP_NUM_THREADS": str(threads), DEFER_INDEX_VARIABLE: "1"}


def _open_backend(name: str, spec: dict[str, Any], folder: Path, parallel: int, ray_address: Optional[str]) -> TrialBackend:
    if name == "ray":
        return RayTrials(spec, parallel, ray_address)
    return LocalTrials(spec, folder)


# `python -m` would put the folder the trial starts in (the sweep's working folder) first on sys.path, where a
# `yaml.py` or a `veritrain/` folder would be imported instead of the real ones; `veritrain run` does not do that
TRIAL_ENTRY = "import sys; sys.path.pop(0); from veritrain.sweep_trial import main; sys.exit(main())"


class LocalTrials:
    """Each run in a fresh `python -m veritrain.sweep_trial` process, in a session of its own (so a Ctrl-C reaches
    the driver alone, which passes it on once). Its console output goes to `.veritrain/sweeps/<id>/logs/`."""

    def __init__(self, spec: dict[str, Any], folder: Path):
        self.repeat = spec["repeat"]
        self.logs = folder / "logs"
        self.logs.mkdir(exist_ok=True)
        self.env = {**os.environ, **_trial_environment(spec["threads"])}

    def start(self, slot: Slot, job: dict[str, Any]) -> Any:
        name = slot.name(self.repeat)
        result_path, log_path = self.logs / f"{name}.result.json", self.logs / f"{name}.log"
        result_path.unlink(missing_ok=True)
        with open(log_path, "ab") as console:
            console.write(f"---- {now_iso()} {'resume ' + job['resume_run'] if job.get('resume_run') else 'start'}\n".encode())
            console.flush()
            process = subprocess.Popen([sys.executable, "-c", TRIAL_ENTRY, "--result", str(result_path)], stdin=subprocess.PIPE,
                                       stdout=console, stderr=console, env=self.env, cwd=job["cwd"], start_new_session=True)
        try:
            assert process.stdin is not None
            process.stdin.write(json.dumps(job).encode())
            process.stdin.close()
        except BrokenPipeError:  # it died at once; its exit code and log say why
            pass
        what = f"resuming run {job['resume_run']}" if job.get("resume_run") else "started"
        log.info("sweep: %s %s (pid %d, console in %s)", name, what, process.pid, log_path)
        return process, result_path, log_path

    def finished(self, running: dict[Slot, Any], timeout: float) -> list[tuple[Slot, dict[str, Any]]]:
        deadline = time.monotonic() + timeout
        while True:
            done = [(slot, self._result(*handle)) for slot, handle in running.items() if handle[0].poll() is not None]
            if done or time.monotonic() >= deadline:
                return done
            time.sleep(0.05)

    @staticmethod
    def _result(process: subprocess.Popen, result_path: Path, log_path: Path) -> dict[str, Any]:
        try:
            return json.loads(result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
        code = process.returncode
        if code in (-signal.SIGINT, -signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGTERM):
            return {"run_id": None, "status": "interrupted", "error": f"its process was stopped by a signal (exit {code})"}
        return {"run_id": None, "status": "failed", "error": f"its process exited with code {code} before reporting: {_last_line(log_path)} (console in {log_path})"}

    def interrupt(self, running: dict[Slot, Any], signum: int, again: bool) -> None:
        for process, _, _ in running.values():
            try:
                process.send_signal(signum)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        pass  # every process has ended (or was passed the signal) by now


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no console output"
    return _one_line(lines[-1], 200) if lines else "no console output"


class RayTrials:
    """Each run as a Ray task (`veritrain.sweep_trial.run_trial`, in a fresh worker process: max_calls=1) with
    `train.threads` CPUs and OMP_NUM_THREADS set to them. Every node must see the workspace at the same path.
    Ray's own logging stays off the driver's stdout and stderr (log_to_driver=False, level ERROR)."""

    def __init__(self, spec: dict[str, Any], parallel: int, address: Optional[str]):
        import ray

        from veritrain import sweep_trial

        self.ray, self.repeat = ray, spec["repeat"]
        address = address or os.environ.get("RAY_ADDRESS")
        options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
        try:
            if address:
                ray.init(address=address, **options)
            else:  # a local Ray with room for `parallel` runs of `threads` CPUs each, reporting no usage statistics
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(num_cpus=parallel * spec["threads"], include_dashboard=False, **options)
        except Exception as err:  # a cluster that cannot be reached, a local Ray that cannot start
            raise UserError(f"--backend ray: Ray did not start{' at ' + address if address else ''} ({_one_line(str(err), 200)})") from None
        self.task = ray.remote(
            num_cpus=spec["threads"], max_calls=1, max_retries=0,  # a retried task would start a second run of the slot
            runtime_env={"env_vars": _trial_environment(spec["threads"])},
        )(sweep_trial.run_trial)

    def start(self, slot: Slot, job: dict[str, Any]) -> Any:
        what = f"resuming run {job['resume_run']}" if job.get("resume_run") else "started"
        log.info("sweep: %s %s as a Ray task", slot.name(self.repeat), what)
        return self.task.remote(job)

    def finished(self, running: dict[Slot, Any], timeout: float) -> list[tuple[Slot, dict[str, Any]]]:
        if not running:
            return []
        by_ref = {ref: slot for slot, ref in running.items()}
        ready, _ = self.ray.wait(list(by_ref), num_returns=len(by_ref), timeout=timeout)
        return [(by_ref[ref], self._result(ref)) for ref in ready]

    def _result(self, ref: Any) -> dict[str, Any]:
        from ray import exceptions

        try:
            return self.ray.get(ref)
        except exceptions.TaskCancelledError:
            return {"run_id": None, "status": "interrupted", "error": "its Ray task was cancelled"}
        except exceptions.RayError as err:
            return {"run_id": None, "status": "failed", "error": f"its Ray task failed: {_one_line(str(err), 300)}"}

    def interrupt(self, running: dict[Slot, Any], signum: int, again: bool) -> None:
        for ref in running.values():
            self.ray.cancel(ref, force=again)  # first a KeyboardInterrupt in the task (the run checkpoints), then a kill

    def close(self) -> None:
        self.ray.shutdown()


# ---------------------------------------------------------------- finding runs, summarizing


def _new_sweep_folder(workspace: Workspace) -> tuple[str, Path]:
    root = workspace.state_dir / "sweeps"
    root.mkdir(parents=True, exist_ok=True)
    while True:
        sweep_id = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        try:
            (root / sweep_id).mkdir()
        except FileExistsError:
            continue
        return sweep_id, root / sweep_id


def resolve_sweep(workspace: Workspace, ref: str) -> Path:
    """A sweep folder by id, unique id prefix, or `latest` (the newest)."""
    root = workspace.state_dir / "sweeps"
    sweeps = sorted(p for p in root.glob("*") if (p / "spec.json").exists()) if root.exists() else []
    if ref == "latest" and sweeps:
        return sweeps[-1]
    return by_prefix(sweeps, ref, f"--resume {ref}: no such sweep in {root}; give a sweep id (its folder name there), a unique prefix or `latest`",
                     f"--resume {ref}: matches {{count}} sweeps ({{names}}, ...); give a longer prefix")


def _runs_of(workspace: Workspace, spec: dict[str, Any]) -> dict[Slot, dict[str, Any]]:
    """The runs whose record names this sweep, one per slot: the records are the truth, whatever summary.json
    (written by a process that may have been killed) says. A record counts only with the config hash planned for
    its slot (a copied or imported run that claims the slot does not). Of several runs of one slot the one that
    got furthest counts. Only runs that started after the sweep (less an hour, for the clocks of other Ray nodes)
    are read: run ids begin with their start time."""
    if not workspace.runs_dir.exists():
        return {}
    sweep_id, planned = spec["id"], _planned_hashes(spec)
    try:
        started = datetime.strptime(sweep_id[:15], "%Y%m%d-%H%M%S")
        since = (started - timedelta(hours=1)).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        since = ""
    rank = {"completed": 3, "interrupted": 2, "running": 2, "failed": 1}
    best: dict[Slot, dict[str, Any]] = {}
    for run_dir in sorted(workspace.runs_dir.glob("*")):
        if run_dir.name[:15] < since or not (run_dir / "record.json").exists():
            continue
        try:
            record = read_record(run_dir)
        except RunFailed:
            continue
        link = record.get("sweep") or {}
        if link.get("id") != sweep_id:
            continue
        slot = Slot(link.get("trial"), (record.get("repeat") or {}).get("index", 0))
        if planned.get(slot) != record.get("config_hash"):
            continue
        if slot not in best or rank.get(record["status"], 0) >= rank.get(best[slot]["status"], 0):
            best[slot] = record
    return best


def _write_summary(workspace: Workspace, spec: dict[str, Any], folder: Path, states: dict[Slot, SlotState], status: Optional[str]) -> dict[str, Any]:
    summary = summarize(workspace, spec, states, status)
    write_atomic(folder / "summary.json", _json_bytes(summary))
    return summary


def _json_bytes(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def planned_selection(spec: dict[str, Any]) -> dict[str, Any]:
    """What the sweep picks its best trial by: spec.json's `selection` (a sweep planned before it had one: the
    headline on val)."""
    planned = spec.get("selection")
    if not isinstance(planned, dict):
        return {"split": SELECTION_SPLIT, "metric": None, "mode": None}
    return {"split": SELECTION_SPLIT, "metric": planned.get("metric"), "mode": planned.get("mode")}


def summarize(workspace: Workspace, spec: dict[str, Any], states: dict[Slot, SlotState], status: Optional[str] = None) -> dict[str, Any]:
    """summary.json from the spec and the runs' records (see `summary_from_records`)."""
    records: dict[str, dict[str, Any]] = {}
    for state in states.values():
        if state.run_id and state.run_id not in records:
            try:
                record = read_record(workspace.runs_dir / state.run_id)
            except (RunFailed, UserError):
                continue
            if record["status"] == "running" and state.status != "running" and workspace.lock_is_stale(state.run_id):
                record = {**record, "status": "interrupted"}  # its process is gone (killed): resumable like an interrupted run
            records[state.run_id] = record
    return summary_from_records(spec, states, records, status, str(workspace.state_dir / "sweeps" / spec["id"]))


def summary_from_records(spec: dict[str, Any], states: dict[Slot, SlotState], records: dict[str, dict[str, Any]],
                         status: Optional[str], folder: str) -> dict[str, Any]:
    """summary.json from the spec and the runs' records (run id → record): per trial its runs, status, the metrics of
    its val split with deltas against the parent and the seed spread; then the best trial, chosen on val only, with
    its test result beside it, reported and not used for selection; then the failed trials. `status` None: decided
    from the trials (completed, failed, or running while any is pending)."""
    parent_slots = sorted((s for s in states if s.trial is None), key=lambda s: s.seed_index)
    parent = _group(spec, [states[s] for s in parent_slots], records)
    if spec["parent"]["run"] and parent["status"] == "completed" and not parent["metrics"]:
        parent["note"] = (f"the --parent run has no val metrics, so the trials have no deltas; add them: "
                          f"veritrain eval {spec['parent']['run']} --split val")
    trials, by_index = [], {}
    for trial in spec["trials"]:
        slots = sorted((s for s in states if s.trial == trial["index"]), key=lambda s: s.seed_index)
        group_states = [states[s] for s in slots]
        entry = {"index": trial["index"], "change": trial["change"], "hypothesis": trial["hypothesis"],
                 "config_hash": trial["config_hashes"][0], **_group(spec, group_states, records)}
        entry["group"] = f"sweep-{spec['id']}-{trial['index']}" if spec["repeat"] > 1 else None
        entry["deltas"] = {name: value - parent["metrics"][name] for name, value in entry["metrics"].items()
                           if parent["status"] == "completed" and name in parent["metrics"]}
        if entry["data_version"] and parent["data_version"] and entry["data_version"] != parent["data_version"]:
            entry["note"] = "; ".join(filter(None, [entry.get("note"), "trained and evaluated on another data version than the parent: "
                                                    "its deltas compare different val sets"]))
        trials.append(entry)
        by_index[trial["index"]] = group_states
    parent["group"] = f"sweep-{spec['id']}-parent" if spec["repeat"] > 1 and not spec["parent"]["run"] else None
    planned = planned_selection(spec)
    headline = (planned["metric"], planned["mode"]) if planned["metric"] else _headline([parent, *trials])
    best = None
    top = select_best(trials, *headline) if headline else None
    if top is not None and headline:
        name, mode = headline
        report = _group(spec, by_index[top["index"]], records, REPORT_SPLIT)  # read only now that the trial is chosen
        best = {"trial": top["index"], "change": top["change"], "split": SELECTION_SPLIT, "metric": name, "mode": mode,
                "value": top["metrics"][name], "delta": top["deltas"].get(name), "run_ids": top["run_ids"],
                "test": {"split": REPORT_SPLIT, "used_for_selection": False, "label": NOT_USED_FOR_SELECTION,
                         "metrics": report["metrics"], "spread": report["spread"]}}
    counts = {key: sum(1 for t in trials if t["status"] == key) for key in ("completed", "failed", "interrupted", "running", "pending")}
    if status is None:
        statuses = {parent["status"], *(t["status"] for t in trials)}
        status = ("failed" if "failed" in statuses else "completed" if statuses == {"completed"}
                  else "interrupted" if "interrupted" in statuses else "running")
    return {
        "sweep_version": SWEEP_VERSION,
        "id": spec["id"],
        "status": status,
        "created_at": spec["created_at"],
        "updated_at": now_iso(),
        "folder": folder,
        "exp_name": spec["exp_name"],
        "config": spec["config"],
        "mode": spec["mode"],
        "varied": spec["varied"],
        "threads": spec["threads"],
        "threads_reason": spec["threads_reason"],
        "repeat": spec["repeat"],
        "backend": spec["backend"],
        "split": SELECTION_SPLIT,
        "selection": {"split": SELECTION_SPLIT, "metric": headline[0] if headline else None, "mode": headline[1] if headline else None,
                      "given": bool(planned["metric"]), "report_split": REPORT_SPLIT},
        "headline": {"metric": headline[0], "mode": headline[1]} if headline else None,
        "parent": {**parent, "given": bool(spec["parent"]["run"])},
        "trials": trials,
        "best": best,
        "failed": [{"trial": t["index"], "change": t["change"], "run_ids": t["run_ids"], "error": t["error"]} for t in trials if t["status"] == "failed"],
        "skipped": spec["skipped"],
        "counts": {"trials": len(trials), **counts},
    }


def select_best(trials: list[dict[str, Any]], metric: str, mode: str) -> Optional[dict[str, Any]]:
    """The completed trial with the best `metric` of its val split (its mean over seeds); the first of equals. Test
    metrics are not an input: a summary's trials hold their val metrics only."""
    scored = [t for t in trials if t["status"] == "completed" and metric in t["metrics"]]
    if not scored:
        return None
    return (max if mode == "max" else min)(scored, key=lambda t: t["metrics"][metric])


def _group(spec: dict[str, Any], states: list[SlotState], records: dict[str, dict[str, Any]], split: str = SELECTION_SPLIT) -> dict[str, Any]:
    """The runs of one trial (or the parent), one per seed: status, metrics of `split` (the mean over seeds), spread,
    error. A run counts only when its val and test metrics come from the same checkpoint (the one it ships)."""
    from veritrain.repeats import RANGES, SUMMARIZED, spread

    statuses, errors, values, versions, notes = [], [], {}, set(), []
    for state in states:
        record = records.get(state.run_id) if state.run_id else None
        status = record["status"] if record and state.status != "running" else state.status  # a resumed run says so once it runs
        statuses.append(status)
        if record and record.get("error") and status != "completed":
            errors.append(record["error"]["message"])
        elif state.error and status != "completed":
            errors.append(state.error)
        if record and status == "completed":
            evaluated = record.get("metrics") or {}
            checkpoints = {(evaluated.get(s) or {}).get("checkpoint_sha256") for s in (SELECTION_SPLIT, REPORT_SPLIT) if s in evaluated}
            if len(checkpoints) > 1:
                notes.append(f"run {record['run_id']}: its val and test metrics come from different checkpoints, so it is left out; "
                             f"evaluate both from the one it ships: veritrain eval {record['run_id']} --split {SELECTION_SPLIT}")
                continue
            metrics = evaluated.get(split) or {}
            for name in SUMMARIZED:
                if isinstance(metrics.get(name), (int, float)) and not isinstance(metrics.get(name), bool):
                    values.setdefault(name, []).append(float(metrics[name]))
            versions.add((record.get("data") or {}).get("version"))
    overall = ("completed" if statuses and all(s == "completed" for s in statuses) else "failed" if "failed" in statuses
               else "interrupted" if "interrupted" in statuses else "running" if "running" in statuses else "pending")
    entry: dict[str, Any] = {
        "run_ids": [s.run_id for s in states if s.run_id],
        "status": overall,
        "metrics": {name: statistics.fmean(v) for name, v in values.items()},
        "spread": {name: spread(v, RANGES.get(name, (float("-inf"), float("inf")))) for name, v in values.items()} if spec["repeat"] > 1 else None,
        "data_version": next(iter(versions)) if len(versions) == 1 else None,
        "error": errors[0] if errors else None,
    }
    if notes:
        entry["note"] = "; ".join(notes)
    return entry


def _headline(groups: list[dict[str, Any]]) -> Optional[tuple[str, str]]:
    for name, mode in HEADLINE:
        if any(name in g["metrics"] for g in groups):
            return name, mode
    return None
