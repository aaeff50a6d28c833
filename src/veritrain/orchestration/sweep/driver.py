"""Driving a sweep: its folder and spec.json, the smoke test, the parent run first and then the trials, up to
--parallel at once on a backend, the summary rewritten as each run finishes, signals passed on to the runs, and
`--resume`, which keeps finished runs, resumes interrupted ones and starts the rest, refusing a plan that changed."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, cast

from veritrain.core.config import load_config
from veritrain.core.errors import ConfigError, Interrupted, RunFailed, UserError, VeritrainError
from veritrain.core.files import write_atomic
from veritrain.core.signals import StopFlag, interruptible
from veritrain.orchestration import smoke as smoke_module
from veritrain.orchestration.sweep.backends import TrialBackend, one_line, open_backend
from veritrain.orchestration.sweep.planning import (
    SWEEP_VERSION,
    Slot,
    SlotState,
    SweepPlan,
    change_text,
    planned_hashes,
    require_ray,
    slot_overrides,
)
from veritrain.orchestration.sweep.summary import json_bytes, planned_selection, runs_of, write_summary
from veritrain.orchestration.sweep_trial import working_dir
from veritrain.records import usercode
from veritrain.records.record import now_iso
from veritrain.records.workspace import Workspace, by_prefix

log = logging.getLogger("veritrain")


POLL_SECONDS = 0.2  # how often the driver looks for finished runs; a signal is acted on within this time


@dataclass
class SweepOutcome:
    summary: dict[str, Any]  # what `--json` prints
    error: Optional[VeritrainError | Interrupted] = None


def start(sweep_plan: SweepPlan, workspace: Workspace, argv: list[str], smoke: bool, ray_address: Optional[str] = None) -> SweepOutcome:
    """Run a planned sweep: the smoke test of the base config (unless --no-smoke, or a --parent run stands in
    for the base config), the parent run, then the trials."""
    from veritrain.orchestration.pipeline import refuse_to_start

    refuse_to_start(argv)  # spec.json keeps the command line as given
    smoke_result: dict[str, Any]
    if sweep_plan.parent_run:
        smoke_result = {"status": "skipped", "reason": f"the parent run {sweep_plan.parent_run} was given with --parent"}
    elif smoke:
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
        backend = open_backend(sweep_plan.backend, spec, folder, sweep_plan.parallel, ray_address)
    except UserError:
        shutil.rmtree(folder, ignore_errors=True)  # nothing ran: no sweep to resume
        raise
    write_atomic(folder / "spec.json", json_bytes(spec))
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

    targets = [sweep_plan.base.config.model.target, *(trial.change.get("model.target") for trial in sweep_plan.trials)]
    listed: dict[str, Any] = {"user_files": []}
    with usercode.fresh(Path(sweep_plan.config_path) if sweep_plan.config_path else None, Path(sweep_plan.cwd)) as session:
        session.import_config(sweep_plan.base.config)  # its task's code too, when an entry point names the task
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
    found = runs_of(workspace, spec)
    for slot, record in found.items():
        if record["status"] == "running" and not workspace.lock_is_stale(record["run_id"]):
            raise UserError(f"--resume {ref}: run {record['run_id']} of the sweep is still running (its lock is held by a live process); wait for it")
    overrides = {None: spec["config"]["overrides"], **{t["index"]: t["overrides"] for t in spec["trials"]}}
    _check_unchanged(spec, found, overrides, ref, trust_code)
    finished = sum(1 for record in found.values() if record["status"] in ("completed", "failed"))
    if finished == len(planned_hashes(spec)):
        log.info("sweep %s: every run has finished (failed runs are kept: they would fail the same way); nothing to resume", sweep_id)
    else:
        log.info("sweep %s: resuming (%d of its %d runs have finished)", sweep_id, finished, len(planned_hashes(spec)))
    return _drive(workspace, spec, folder, argv, overrides, found, open_backend(backend, spec, folder, parallel, ray_address), parallel)


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


def _lock_name(sweep_id: str) -> str:
    return f"sweep-{sweep_id}"  # in .veritrain/locks/ beside the run locks: `gc` clears it when stale


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
    workspace.lock_run(_lock_name(spec["id"]))
    error: Optional[VeritrainError | Interrupted] = None

    def on_started(slot: Slot) -> None:
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
                smoke = _trial_smoke(spec)
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
