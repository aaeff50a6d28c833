"""Driving a search: its folder and spec.json, the Optuna study (which this process alone writes), trials
proposed one at a time and each run as a recorded run (a process of its own, or a Ray task), their epochs
judged by the pruner, the summary and its seal rewritten as trials finish, and `--resume`, which reconciles
the study with the run records under the search's lock."""

from __future__ import annotations

import json
import logging
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, cast

from veritrain.core.config import load_config
from veritrain.core.errors import ConfigError, Interrupted, RunFailed, UserError, VeritrainError
from veritrain.core.files import write_atomic
from veritrain.core.signals import StopFlag, interruptible
from veritrain.orchestration.trials import samplers
from veritrain.orchestration.trials.backends import TrialBackend, run_trials
from veritrain.orchestration.trials.driving import malformed_is_user_error, opened, resumed_backend, smoke_first
from veritrain.orchestration.trials.planning import require_optuna
from veritrain.orchestration.trials.process import working_dir
from veritrain.orchestration.trials.search_plan import SearchPlan
from veritrain.orchestration.trials.search_summary import search_runs, write_summary
from veritrain.orchestration.trials.space import Space
from veritrain.orchestration.trials.state import SEARCH, Slot, driving, read_spec, record_code, trial_smoke
from veritrain.records.record import RUN_ID, read_record
from veritrain.records.workspace import Workspace

log = logging.getLogger("veritrain")

POLL_SECONDS = 0.05  # how often the driver looks for finished trials and epochs waiting for a verdict
STUDY_FILE = "study.jsonl"  # Optuna's journal storage (JournalFileBackend)
STUDY_NAME = "search"


@dataclass
class SearchOutcome:
    summary: dict[str, Any]  # what `--json` prints
    error: Optional[VeritrainError | Interrupted] = None


@dataclass
class Live:
    """A trial whose process runs: its backend handle, its run (once known), the step of the last validation given a
    verdict, and what the study holds of it (epochs or steps, `judged_at`)."""

    number: int
    handle: Any
    run_id: Optional[str] = None
    judged_step: int = 0
    reported: set[int] = field(default_factory=set)


class _HeldByDriver:
    """The journal's file lock: none is needed, since the driver holds the search's workspace lock
    (`.veritrain/locks/search-<id>.lock`) and is the one process that writes the study."""

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        pass


def open_study(folder: Path, spec: dict[str, Any]) -> Any:
    """The search's Optuna study in `folder/study.jsonl`. A torn last line (the driver killed mid-write) is cut off
    first: Optuna would refuse the file, and the line's operation is redone when the trial is reconciled."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its own per-trial lines would repeat ours on stderr
    path = folder / STUDY_FILE
    if path.exists():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(path, "r+b") as journal:
                journal.truncate(data.rfind(b"\n") + 1)
    storage = JournalStorage(JournalFileBackend(str(path), lock_obj=cast(Any, _HeldByDriver())))
    direction = "maximize" if spec["metric"]["mode"] == "max" else "minimize"
    return optuna.create_study(storage=storage, study_name=STUDY_NAME, direction=direction, pruner=samplers.optuna_pruner(spec["pruner"]),
                               sampler=_sampler(spec, 0), load_if_exists=True)


def _sampler(spec: dict[str, Any], number: int) -> Any:
    return samplers.optuna_sampler(spec["sampler"]["name"], int(spec["sampler"]["seed"]), number)


def start(search_plan: SearchPlan, workspace: Workspace, argv: list[str], smoke: bool, ray_address: Optional[str] = None) -> SearchOutcome:
    """Run a planned search: the smoke test of the base config (unless --no-smoke), then the trials."""
    smoke_result = smoke_first(search_plan.base.config, workspace, argv, smoke)
    targets = [search_plan.base.config.config.model.target]  # and every model.target the space may choose
    targets += [choice for param in search_plan.space.params if param.key == "model.target" for choice in param.choices or ()]
    with opened(SEARCH, workspace, argv, smoke_result, search_plan.as_dict(), search_plan.backend, search_plan.parallel, ray_address,
                lambda folder: record_code(folder, search_plan.base.config_path, search_plan.base.cwd, search_plan.base.config.config, targets)) as (spec, folder, backend):
        (folder / "verdicts").mkdir()
        log.info("search %s: %d trial(s), %s sampler (seed %d), %s pruner, of %s; threads %d; plan in %s", spec["id"], search_plan.trials,
                 search_plan.sampler, search_plan.seed, search_plan.pruner, ", ".join(p.key for p in search_plan.space.params),
                 search_plan.base.threads, folder / "spec.json")
        if not spec["reproducible"]["proposals"]:
            log.warning("search %s: %s", spec["id"], spec["reproducible"]["reason"])
        study = open_study(folder, spec)
        return _drive(workspace, spec, folder, argv, study, backend, search_plan.parallel, [])


def resume(workspace: Workspace, ref: str, argv: list[str], parallel: Optional[int], backend: Optional[str],
           ray_address: Optional[str] = None, trust_code: bool = False) -> SearchOutcome:
    """Continue a search: trials whose run finished but were not told are told, interrupted runs resume from
    their checkpoints with the same parameters, a trial asked but never started starts, and new trials are
    proposed until --trials is reached; no trial number is proposed twice."""
    from veritrain.orchestration.pipeline import refuse_to_start

    refuse_to_start(argv)
    require_optuna()
    folder, spec = read_spec(workspace, SEARCH, ref)
    with driving(workspace, SEARCH, folder.name, f"--resume {ref}: "), malformed_is_user_error(SEARCH, folder, ref):
        return _resume_driving(workspace, spec, folder, ref, argv, parallel, backend, ray_address, trust_code)


def _resume_driving(workspace: Workspace, spec: dict[str, Any], folder: Path, ref: str, argv: list[str], parallel: Optional[int],
                    backend: Optional[str], ray_address: Optional[str], trust_code: bool) -> SearchOutcome:
    import optuna

    if not Path(spec["config"]["cwd"]).is_dir():
        raise UserError(f"--resume {ref}: {spec['config']['cwd']}, the folder the search started in, is gone; relative paths of its config resolve against it")
    study = open_study(folder, spec)
    records = search_runs(workspace, spec)
    jobs: list[tuple[int, dict[str, Any]]] = []
    told = 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        number, record = trial.number, records.get(trial.number)
        if record is not None and record["status"] == "running" and not workspace.lock_is_stale(record["run_id"]):
            raise UserError(f"--resume {ref}: run {record['run_id']} of the search is still running (its lock is held by a live process); wait for it")
        if record is not None and record["status"] in ("completed", "pruned", "failed"):
            _tell_from_record(study, spec, workspace, number, record)  # it finished while the driver was gone
            told += 1
            continue
        change = Space.from_dict(spec["space"]).change(trial.params)
        job = _trial_job(workspace, spec, folder, argv, number, change, trust_code=trust_code)
        if record is not None:  # interrupted, or `running` with a dead process: it continues from its checkpoint
            job["resume_run"] = record["run_id"]
        jobs.append((number, job))
    counts = _state_counts(study)
    log.info("search %s: resuming (%d of %d trials finished, %d told now, %d to continue)", spec["id"], counts["finished"], spec["trials"], told, len(jobs))
    trials, parallel = resumed_backend(spec, folder, ref, parallel, backend, ray_address)
    return _drive(workspace, spec, folder, argv, study, trials, parallel, jobs)


def _state_counts(study: Any) -> dict[str, int]:
    import optuna

    states = [t.state for t in study.get_trials(deepcopy=False)]
    finished = sum(1 for s in states if s in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL))
    return {"finished": finished, "asked": sum(1 for s in states if s != optuna.trial.TrialState.WAITING)}


def _trial_job(workspace: Workspace, spec: dict[str, Any], folder: Path, argv: list[str], number: int, change: dict[str, Any],
               trust_code: bool = True) -> dict[str, Any]:
    """What the trial process runs (veritrain.orchestration.trials.process.run_trial): the base config with the trial's
    change, linked to the search, judged after every validation when the search prunes."""
    space = Space.from_dict(spec["space"])
    overrides = [*spec["config"]["overrides"], *space.overrides(change)]
    with working_dir(spec["config"]["cwd"]):
        try:
            resolved = load_config(spec["config"]["path"], overrides)
        except ConfigError as err:
            raise UserError(f"search {spec['id']}: trial {number}'s config does not load ({err}); the config file changed since the search started") from None
    if resolved.config.model.target and not trust_code:
        raise UserError(f"--resume: trial {number}'s config names code (model.target {str(resolved.config.model.target)[:80]!r}); building its "
                        "model would run that code: read spec.json and that code, then pass --trust-code")
    slot = Slot(number, 0).name(1)
    shown = ", ".join(f"{key}={_shown(value)}" for key, value in change.items())
    return {
        "workspace": str(workspace.root), "cwd": spec["config"]["cwd"], "argv": argv, "driver_pid": os.getpid(),
        "sweep_id": spec["id"], "state_folder": "searches", "code": spec.get("code"), "slot": slot,
        "config_path": spec["config"]["path"], "overrides": overrides, "config_hash": resolved.hash,
        "hypothesis": f"{shown}: trial {number} of search {spec['id']} ({spec['sampler']['name']} sampler)",
        "parent": None, "smoke": trial_smoke(SEARCH, spec, "its trials"), "repeat": None,
        "sweep": {"id": spec["id"], "trial": number, "change": change, "kind": "search"},
        "selection": {"split": spec["metric"]["split"], "metric": spec["metric"]["name"], "mode": spec["metric"]["mode"]},
        "judge": ({"folder": str(folder / "verdicts"), "slot": slot, "signalled": spec["backend"] == "local"}
                  if spec["pruner"]["name"] != "none" else None),
    }


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else json.dumps(value)


def _ask(study: Any, spec: dict[str, Any]) -> Optional[tuple[int, dict[str, Any]]]:
    """The next trial (number, config change), or None when --trials have been asked for. An enqueued
    configuration (or a grid point) goes into the study just before the trial that takes it is asked for."""
    import optuna

    counts = _state_counts(study)
    number = counts["asked"]
    if number >= spec["trials"]:
        return None
    space = Space.from_dict(spec["space"])
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    if not waiting:
        fixed: Optional[dict[str, Any]] = None
        index = number - spec["enqueue_after"]
        if 0 <= index < len(spec["enqueue"]):
            fixed = {p.key: p.encoded(spec["enqueue"][index][p.key]) for p in space.params}
        elif spec["sampler"]["name"] == "grid":
            points = space.grid_points("spec.json", int(spec["sampler"]["seed"]))
            fixed = points[(number - _enqueued_before(spec, number)) % len(points)]
        if fixed is not None:
            study.enqueue_trial(fixed)
    study.sampler = _sampler(spec, number)  # seeded by (seed, number): the same proposal in a resumed search
    trial = study.ask(space.distributions())
    change = space.change(trial.params)
    trial.set_user_attr("change", change)
    return trial.number, change


def _enqueued_before(spec: dict[str, Any], number: int) -> int:
    return max(0, min(len(spec["enqueue"]), number - spec["enqueue_after"]))


def _drive(workspace: Workspace, spec: dict[str, Any], folder: Path, argv: list[str], study: Any, backend: TrialBackend,
           parallel: int, jobs: list[tuple[int, dict[str, Any]]]) -> SearchOutcome:
    from veritrain.orchestration import pipeline

    error: Optional[VeritrainError | Interrupted] = None
    errors: dict[int, str] = {}  # trial number → why its process failed before its run reported (this driver's only)
    running: dict[int, Live] = {}
    write_summary(workspace, spec, folder, study, errors, "running")
    try:
        with interruptible() as stop, stop.deferred():
            _loop(workspace, spec, folder, argv, study, backend, parallel, jobs, running, errors, stop)
    except Interrupted as err:
        error = err
    except optuna_errors() as err:  # a study file damaged by hand: one line, never a traceback
        error = RunFailed(f"search {spec['id']}: {folder / STUDY_FILE}: {err}")
    finally:
        backend.close()
    summary = write_summary(workspace, spec, folder, study, errors, "interrupted" if isinstance(error, Interrupted) else None)
    pipeline.update_experiments(workspace)
    if error is None:
        error = _all_failed(summary)
    if summary["status"] == "interrupted":
        log.warning("search %s interrupted; continue with: veritrain search --resume %s", spec["id"], spec["id"])
    return SearchOutcome(summary=summary, error=error)


def optuna_errors() -> tuple[type[BaseException], ...]:
    import optuna

    return (optuna.exceptions.OptunaError,)


def _loop(workspace: Workspace, spec: dict[str, Any], folder: Path, argv: list[str], study: Any, backend: TrialBackend, parallel: int,
          jobs: list[tuple[int, dict[str, Any]]], running: dict[int, Live], errors: dict[int, str], stop: StopFlag) -> None:
    """Up to `parallel` trials at once (`run_trials`): the trials to continue first, then new ones asked of the
    study until --trials have been; after every poll the epochs waiting for a verdict are judged."""
    from veritrain.orchestration import pipeline

    pending = list(jobs)

    def next_job() -> Optional[tuple[Slot, dict[str, Any]]]:
        if pending:
            number, job = pending.pop(0)
        else:
            asked = _ask(study, spec)
            if asked is None:
                return None
            number, change = asked
            job = _trial_job(workspace, spec, folder, argv, number, change)
            log.info("search %s: trial %d: %s", spec["id"], number, job["hypothesis"].split(": trial")[0])
        (folder / "verdicts" / f"{job['slot']}.verdict.json").unlink(missing_ok=True)
        return Slot(number, 0), job

    def started(slot: Slot, job: dict[str, Any], handle: Any) -> None:
        running[cast(int, slot.trial)] = Live(cast(int, slot.trial), handle, job.get("resume_run"))
        write_summary(workspace, spec, folder, study, errors, "running")

    def finished(slot: Slot, result: dict[str, Any]) -> None:
        _finished(workspace, spec, study, running.pop(cast(int, slot.trial)), result, errors)
        write_summary(workspace, spec, folder, study, errors, "running")
        pipeline.update_experiments(workspace)

    def judge(handles: dict[Slot, Any]) -> None:
        for live in running.values():
            _judge_waiting(workspace, spec, folder, study, live, backend)

    run_trials(backend, parallel, stop, POLL_SECONDS, next_job, started, finished, judge)


def _judge_waiting(workspace: Workspace, spec: dict[str, Any], folder: Path, study: Any, live: Live, backend: TrialBackend) -> None:
    """A trial waiting after a validation: report its val metric to the study (at the row's epoch, or its step when the
    search's trials validate inside epochs: `judged_at`), ask the pruner, write the verdict for that step (and SIGTERM
    the trial when it is pruned, which it waits for)."""
    import optuna

    slot = Slot(live.number, 0).name(1)
    try:
        waiting = json.loads((folder / "verdicts" / f"{slot}.wait.json").read_text(encoding="utf-8"))
        run_id, step = str(waiting["run_id"]), waiting["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if not RUN_ID.fullmatch(run_id) or not isinstance(step, int) or step <= live.judged_step:
        return
    live.run_id = run_id
    key, unit = spec["metric"]["epoch_key"], judged_at(spec)
    trial_id = _trial_id(study, live.number)
    trial = optuna.trial.Trial(study, trial_id)
    if not live.reported:  # a resumed trial: the validations reported before the driver stopped
        live.reported = set(study._storage.get_trial(trial_id).intermediate_values)
        trial.set_user_attr("run_id", run_id)
    value: Optional[float] = None
    at = waiting.get(unit) if isinstance(waiting.get(unit), int) else step
    for row in _validation_rows(workspace.runs_dir / run_id, unit):
        if row["step"] <= step and isinstance(row.get(key), (int, float)) and row[unit] not in live.reported:
            trial.report(float(row[key]), step=row[unit])
            live.reported.add(row[unit])
        if row["step"] == step and isinstance(row.get(key), (int, float)):
            value, at = float(row[key]), row[unit]
    prune = value is not None and bool(trial.should_prune())  # numpy.bool_ from the median pruner
    reason = _prune_reason(study, spec, at, value) if prune and value is not None else None
    if value is None:
        log.warning("search %s: trial %d: metrics.jsonl has no %s at step %d, so the pruner cannot judge it", spec["id"], live.number, key, step)
    verdict = {"epoch": waiting.get("epoch"), "step": step, "prune": prune, "value": value, "reason": reason, "search": spec["id"], "trial": live.number}
    write_atomic(folder / "verdicts" / f"{slot}.verdict.json", (json.dumps(verdict) + "\n").encode())
    live.judged_step = step
    if prune:
        log.info("search %s: trial %d pruned after %s %d: %s", spec["id"], live.number, unit, at, reason)
        backend.prune(live.handle)


def judged_at(spec: dict[str, Any]) -> str:
    """What the study's steps count for a search (spec.json's `metric.judged_at`): `epoch`, or `step` when its trials
    validate every `eval.every_steps` steps; searches planned before it judged epochs."""
    return "step" if spec["metric"].get("judged_at") == "step" else "epoch"


def _prune_reason(study: Any, spec: dict[str, Any], at: int, value: float) -> str:
    import optuna

    unit = judged_at(spec)
    others = [t.intermediate_values[at] for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
              if at in t.intermediate_values]
    median = statistics.median(others) if others else float("nan")
    worse = "below" if spec["metric"]["mode"] == "max" else "above"
    return (f"{spec['metric']['epoch_key']} {value:.4g} at {unit} {at} is {worse} the median {median:.4g} of the {len(others)} "
            f"completed trial(s) at that {unit} (median pruner)")


def _trial_id(study: Any, number: int) -> int:
    # Optuna's storage is addressed by trial id, its public face by number; the study's storage is the way between
    return study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)


def _validation_rows(run_dir: Path, unit: str) -> list[dict[str, Any]]:
    """metrics.jsonl's whole lines with an integer step and `unit` (epoch or step; a line being written is not one yet)."""
    try:
        text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    rows = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and all(isinstance(row.get(k), int) and not isinstance(row.get(k), bool) for k in {"step", unit}):
            rows.append(row)
    return rows


def _finished(workspace: Workspace, spec: dict[str, Any], study: Any, live: Live, result: dict[str, Any], errors: dict[int, str]) -> None:
    """A trial's process ended: tell the study what its run record says (completed with its val metric, pruned,
    failed); an interrupted trial stays RUNNING in the study, for --resume to continue."""
    run_id = result.get("run_id") or live.run_id
    record = None
    if run_id and RUN_ID.fullmatch(str(run_id)):
        try:
            record = read_record(workspace.runs_dir / str(run_id))
        except (RunFailed, UserError):
            record = None
    if record is not None and record["status"] in ("completed", "pruned", "failed"):
        _tell_from_record(study, spec, workspace, live.number, record)
        line = f"search {spec['id']}: trial {live.number} {record['status']} (run {record['run_id']})"
        (log.info if record["status"] != "failed" else log.warning)("%s%s", line, "" if record["status"] != "failed"
                                                                     else f": {(record.get('error') or {}).get('message') or result.get('error')}")
        return
    if result.get("status") == "failed":  # it could not start (no run folder): a failed trial, the search goes on
        import optuna

        errors[live.number] = str(result.get("error") or "its process failed")
        study.tell(live.number, state=optuna.trial.TrialState.FAIL)
        log.warning("search %s: trial %d failed: %s", spec["id"], live.number, errors[live.number])
        return
    log.warning("search %s: trial %d interrupted%s; --resume continues it", spec["id"], live.number, f" (run {run_id})" if run_id else "")


def _tell_from_record(study: Any, spec: dict[str, Any], workspace: Workspace, number: int, record: dict[str, Any]) -> None:
    import optuna

    trial_id = _trial_id(study, number)
    trial = optuna.trial.Trial(study, trial_id)
    trial.set_user_attr("run_id", record["run_id"])
    frozen = study._storage.get_trial(trial_id)
    key, unit = spec["metric"]["epoch_key"], judged_at(spec)
    for row in _validation_rows(workspace.runs_dir / record["run_id"], unit) if key else []:  # every validation the pruner did not see (a resumed driver)
        if isinstance(row.get(key), (int, float)) and row[unit] not in frozen.intermediate_values:
            trial.report(float(row[key]), step=row[unit])
    if record["status"] == "pruned":
        study.tell(number, state=optuna.trial.TrialState.PRUNED)
        return
    value = ((record.get("metrics") or {}).get(spec["metric"]["split"]) or {}).get(spec["metric"]["name"])
    if record["status"] == "completed" and isinstance(value, (int, float)) and not isinstance(value, bool):
        study.tell(number, float(value))
    else:
        study.tell(number, state=optuna.trial.TrialState.FAIL)


def _all_failed(summary: dict[str, Any]) -> Optional[RunFailed]:
    trials = summary["trials"]
    if trials and all(t["state"] == "failed" for t in trials) and summary["status"] != "interrupted":
        first = trials[0]
        return RunFailed(f"search {summary['id']}: every trial failed; the first, trial {first['number']}: {first['error'] or 'see its train.log'}")
    if summary["status"] == "interrupted":
        return None
    if summary["counts"]["running"] or summary["counts"]["interrupted"]:
        return RunFailed(f"search {summary['id']}: {summary['counts']['interrupted'] + summary['counts']['running']} trial(s) did not finish; "
                         f"continue with: veritrain search --resume {summary['id']}")
    return None
