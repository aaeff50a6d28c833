"""Driving a sweep: its folder and spec.json, the smoke test, the parent run first and then the trials, up to
--parallel at once on a backend, the summary rewritten as each run finishes, signals passed on to the runs, and
`--resume`, which keeps finished runs, resumes interrupted ones and starts the rest, refusing a plan that changed."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from veritrain.core.config import load_config
from veritrain.core.errors import ConfigError, Interrupted, RunFailed, UserError, VeritrainError
from veritrain.core.signals import interruptible
from veritrain.orchestration.trials.backends import TrialBackend, one_line, run_trials
from veritrain.orchestration.trials.driving import malformed_is_user_error, opened, resumed_backend, smoke_first
from veritrain.orchestration.trials.planning import change_text
from veritrain.orchestration.trials.process import working_dir
from veritrain.orchestration.trials.state import SWEEP, Slot, driving, read_spec, record_code, trial_smoke
from veritrain.orchestration.trials.sweep_plan import SlotState, SweepPlan, planned_hashes, slot_overrides
from veritrain.orchestration.trials.sweep_summary import planned_selection, runs_of, write_summary
from veritrain.records.workspace import Workspace

log = logging.getLogger("veritrain")


POLL_SECONDS = 0.2  # how often the driver looks for finished runs; a signal is acted on within this time


@dataclass
class SweepOutcome:
    summary: dict[str, Any]  # what `--json` prints
    error: Optional[VeritrainError | Interrupted] = None


def start(sweep_plan: SweepPlan, workspace: Workspace, argv: list[str], smoke: bool, ray_address: Optional[str] = None) -> SweepOutcome:
    """Run a planned sweep: the smoke test of the base config (unless --no-smoke, or a --parent run stands in
    for the base config), the parent run, then the trials."""
    given_parent = f"the parent run {sweep_plan.parent_run} was given with --parent" if sweep_plan.parent_run else None
    smoke_result = smoke_first(sweep_plan.base.config, workspace, argv, smoke, skipped_because=given_parent)
    targets = [sweep_plan.base.config.config.model.target, *(trial.change.get("model.target") for trial in sweep_plan.trials)]
    with opened(SWEEP, workspace, argv, smoke_result, sweep_plan.as_dict(), sweep_plan.backend, sweep_plan.parallel, ray_address,
                lambda folder: record_code(folder, sweep_plan.base.config_path, sweep_plan.base.cwd, sweep_plan.base.config.config, targets)) as (spec, folder, backend):
        log.info("sweep %s: %d trial(s) (%s) of %s, %d seed(s) each, threads %d; plan in %s", spec["id"], len(sweep_plan.trials),
                 sweep_plan.mode, ", ".join(sweep_plan.varied), sweep_plan.repeat, sweep_plan.base.threads, folder / "spec.json")
        for note in sweep_plan.skipped:
            log.info("sweep: left out %s", note)
        overrides = {None: sweep_plan.base.overrides, **{t.index: t.overrides for t in sweep_plan.trials}}
        return _drive(workspace, spec, folder, argv, overrides, {}, backend, sweep_plan.parallel)


def resume(workspace: Workspace, ref: str, argv: list[str], parallel: Optional[int], backend: Optional[str],
           ray_address: Optional[str] = None, trust_code: bool = False) -> SweepOutcome:
    """Continue a sweep: completed and failed runs are kept, interrupted ones resume in their own folders, the
    runs that never started start. spec.json is workspace state that may come from a copied workspace: its
    id must be its folder's name, and a planned config that names code needs `trust_code`."""
    folder, spec = read_spec(workspace, SWEEP, ref)
    with driving(workspace, SWEEP, folder.name, f"--resume {ref}: "), malformed_is_user_error(SWEEP, folder, ref):
        if not all(isinstance(t, dict) and t.get("index") == i for i, t in enumerate(spec["trials"])):
            raise UserError(f"--resume {ref}: {folder / 'spec.json'} lists its trials out of order; start a new sweep")
        found = runs_of(workspace, spec)
        for record in found.values():
            if record["status"] == "running" and not workspace.lock_is_stale(record["run_id"]):
                raise UserError(f"--resume {ref}: run {record['run_id']} of the sweep is still running (its lock is held by a live process); wait for it")
        overrides = {None: spec["config"]["overrides"], **{t["index"]: t["overrides"] for t in spec["trials"]}}
        _check_unchanged(spec, found, overrides, ref, trust_code)
        finished = sum(1 for record in found.values() if record["status"] in ("completed", "failed"))
        if finished == len(planned_hashes(spec)):
            log.info("sweep %s: every run has finished (failed runs are kept: they would fail the same way); nothing to resume", spec["id"])
        else:
            log.info("sweep %s: resuming (%d of its %d runs have finished)", spec["id"], finished, len(planned_hashes(spec)))
        backend_, parallel = resumed_backend(spec, folder, ref, parallel, backend, ray_address)
        return _drive(workspace, spec, folder, argv, overrides, found, backend_, parallel)


def _check_unchanged(spec: dict[str, Any], found: dict[Slot, dict[str, Any]], overrides: dict[Optional[int], list[str]], ref: str,
                     trust_code: bool) -> None:
    """Runs that start now must get the config the sweep planned: the config file may have changed since. A
    planned config that names code (model.target) is code: building its model runs it, so it needs trust_code."""
    cwd = spec["config"]["cwd"]
    if not Path(cwd).is_dir():
        raise UserError(f"--resume {ref}: {cwd}, the folder the sweep started in, is gone; relative paths of its config resolve against it")
    for slot, expected in planned_hashes(spec).items():
        if slot in found:
            continue
        with working_dir(cwd):
            try:
                resolved = load_config(spec["config"]["path"], slot_overrides(spec, overrides, slot))
            except ConfigError as err:
                raise UserError(f"--resume {ref}: the sweep's config no longer loads ({err}); start a new sweep") from None
        target = resolved.config.model.target
        if target and not trust_code:
            raise UserError(f"--resume {ref}: {slot.name(spec['repeat'])}'s planned config names code (model.target {str(target)[:80]!r}); "
                            "building its model would run that code: read spec.json and that code, then pass --trust-code")
        if resolved.hash != expected:
            raise UserError(f"--resume {ref}: {slot.name(spec['repeat'])}'s config now hashes to {resolved.hash[:12]}, the sweep planned "
                            f"{expected[:12]}: {spec['config']['path'] or 'the built-in default'} changed since the sweep started; start a new sweep")


def _drive(workspace: Workspace, spec: dict[str, Any], folder: Path, argv: list[str], overrides: dict[Optional[int], list[str]],
           found: dict[Slot, dict[str, Any]], backend: TrialBackend, parallel: int) -> SweepOutcome:
    from veritrain.orchestration import pipeline

    repeat = spec["repeat"]
    states: dict[Slot, SlotState] = {slot: SlotState() for slot in planned_hashes(spec)}
    for slot, record in found.items():
        if slot in states:  # a run the plan does not name (a hand-made link) is not the sweep's
            states[slot] = SlotState(run_id=record["run_id"], status=record["status"])
    if spec["parent"]["run"]:
        states[Slot(None, 0)] = SlotState(run_id=spec["parent"]["run"], status="completed")
    error: Optional[VeritrainError | Interrupted] = None

    def on_started(slot: Slot, job: dict[str, Any], handle: Any) -> None:
        states[slot].status = "running"
        write_summary(workspace, spec, folder, states, "running")

    def on_finished(slot: Slot, result: dict[str, Any]) -> None:
        state = states[slot]
        state.run_id = result.get("run_id") or state.run_id
        state.status, state.error = result["status"], result.get("error")
        line = f"sweep {spec['id']}: {slot.name(repeat)} {state.status}" + (f" (run {state.run_id})" if state.run_id else "")
        if state.status == "completed":
            log.info(line)
        else:
            log.warning("%s: %s", line, state.error or "see its train.log")
        write_summary(workspace, spec, folder, states, "running")
        pipeline.update_experiments(workspace)  # the trials leave the index to this process

    try:
        with interruptible() as stop, stop.deferred():
            parent_slots = [slot for slot in states if slot.trial is None]
            jobs = _jobs(spec, states, overrides, argv, parent_slots, workspace=workspace)
            run_trials(backend, parallel, stop, POLL_SECONDS, lambda: jobs.pop(0) if jobs else None, on_started, on_finished)
            parent_states = [states[slot] for slot in sorted(parent_slots, key=lambda s: s.seed_index)]
            unfinished = next((state for state in parent_states if state.status != "completed"), None)
            if unfinished is not None:  # nothing to compare the trials with: they do not start
                error = _parent_unfinished(spec["id"], unfinished)
            else:
                trial_slots = [slot for slot in states if slot.trial is not None]
                jobs = _jobs(spec, states, overrides, argv, trial_slots, [state.run_id for state in parent_states], workspace=workspace)
                run_trials(backend, parallel, stop, POLL_SECONDS, lambda: jobs.pop(0) if jobs else None, on_started, on_finished)
    except Interrupted as err:
        error = err
    finally:
        backend.close()
    for slot, record in runs_of(workspace, spec).items():  # runs whose process never reported back (a second signal)
        if slot in states and (states[slot].run_id is None or states[slot].status == "running"):
            states[slot] = SlotState(run_id=record["run_id"], status=record["status"])
    summary = write_summary(workspace, spec, folder, states, "interrupted" if isinstance(error, Interrupted) else None)
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
    return RunFailed(f"sweep {sweep_id}: {what} {state.status} ({one_line(state.error or 'see its train.log', 300)}), so no trial started; "
                     "fix the base config and start a new sweep")


def _trial_failures(summary: dict[str, Any]) -> Optional[RunFailed]:
    trials = summary["trials"]
    failed = [t for t in trials if t["status"] == "failed"]
    unfinished = [t for t in trials if t["status"] not in ("completed", "failed")]
    if failed:
        reasons = "; ".join(f"trial {t['index']} ({change_text(t['change'])})" + (f", run {', '.join(t['run_ids'])}" if t["run_ids"] else "")
                            + f": {one_line(t['error'] or 'failed', 160)}" for t in failed[:3])
        return RunFailed(f"sweep {summary['id']}: {len(failed)} of {len(trials)} trials failed: {reasons}" + ("; ..." if len(failed) > 3 else ""))
    if unfinished:
        return RunFailed(f"sweep {summary['id']}: {len(unfinished)} of {len(trials)} trials did not finish ({unfinished[0]['status']}); "
                         f"continue with: veritrain sweep --resume {summary['id']}")
    return None


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
                smoke = trial_smoke(SWEEP, spec, "its parent run")
                ids = parent_ids or [None]
                parent = ids[slot.seed_index] if slot.seed_index < len(ids) else ids[0]  # a --parent run: one for every seed
            job.update({
                "config_path": spec["config"]["path"], "overrides": slot_overrides(spec, overrides, slot), "config_hash": hashes[slot.seed_index],
                "hypothesis": hypothesis, "parent": parent, "smoke": smoke,
                "repeat": {"group": f"sweep-{spec['id']}-{'parent' if trial is None else trial['index']}", "index": slot.seed_index, "of": repeat}
                if repeat > 1 else None,
                "sweep": {"id": spec["id"], "trial": slot.trial, "change": {} if trial is None else trial["change"]},
                "selection": planned_selection(spec),  # the record's selection.sweep
            })
        jobs.append((slot, job))
    return jobs
