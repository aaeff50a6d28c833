"""`veritrain run` and `veritrain train`: prepare → train (→ evaluate), recorded in `runs/<run_id>/`.

Each stage is a plain function in its own module; this one only wires them together and keeps the
run record honest: `record.json` is written when the run starts (status `running`), after each stage,
and at the end with `completed`, `failed` (and the error) or `interrupted`. A resumed run continues in
its own folder with its own recorded config and data version.

    veritrain run                          # the built-in default (configs/digits.yaml)
    veritrain run configs/digits.yaml --set train.epochs=5 --json
    veritrain train --resume latest
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from os import environ
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from veritrain.core import config as config_module, display, logs, selection
from veritrain.core.baselines import judge
from veritrain.core.config import CONFIG_AS_GIVEN, ResolvedConfig, RunConfig, config_hash, resolved_from_record
from veritrain.core.errors import Interrupted, RunFailed, UserError, VeritrainError
from veritrain.core.files import remove_unfinished
from veritrain.core.hashing import sha256_file
from veritrain.core.secrets import allowed_environment, secret_in_command_line, text_secret
from veritrain.core.signals import StopFlag, interruptible
from veritrain.core.signing_keys import sealing_key
from veritrain.core.task_registry import task_spec
from veritrain.data import prepare
from veritrain.data.identity import data_summary, tokenizer_difference
from veritrain.records import experiments, journal, usercode
from veritrain.records.record import Record, capture_code, capture_env, now_iso, read_record, save_code, thawed
from veritrain.records.recorder import Amendment, Recorder, amending
from veritrain.records.workspace import Workspace
from veritrain.results import export
from veritrain.train import distributed, trajectory
from veritrain.train.distributed import RankLost
from veritrain.trust.assessment import selected_checkpoints
from veritrain.trust.opening import OpenRun, code_session, open_run, refuse_untrusted_code, require_checkpoint
from veritrain.userloop import replay

if TYPE_CHECKING:  # imported for types only: the data and task modules load torch and numpy
    from veritrain.data.prepare import DataVersion
    from veritrain.tasks import Task
    from veritrain.train.loop import EpochJudge

log = logging.getLogger("veritrain")

STAGES = {
    "run": ("prepare", "train", "baselines", "eval", "export"),
    "train": ("prepare", "train"),
    "baseline": ("prepare", "baselines"),
}


@dataclass
class RunOutcome:
    summary: dict[str, Any]  # what `--json` prints
    record: Record  # as sealed at the end
    seal: str
    seconds: float
    error: Optional[VeritrainError | Interrupted] = None  # set when the run did not complete


def run(resolved: ResolvedConfig, workspace: Workspace, argv: list[str], kind: str = "run",
        repeat: Optional[dict[str, Any]] = None, reproduced_from: Optional[str] = None,
        hypothesis: Optional[str] = None, parent: Optional[str] = None, smoke: Optional[dict[str, Any]] = None,
        data_version: Optional[str] = None, sweep: Optional[dict[str, Any]] = None, nproc: int = 1,
        code: Optional[usercode.CodeSession] = None, sweep_selection: Optional[dict[str, Any]] = None,
        epoch_judge: Optional[EpochJudge] = None, engine: Optional[str] = None) -> RunOutcome:
    """Start a new run of `kind` ("run": prepare, train, baselines, evaluate, export; "train":
    prepare, train). `repeat` links the runs of `veritrain run --repeat N` (group, index, of).
    `data_version` is the version the run must train on (reproduce): the data must still prepare to it,
    or it is the stored version of an earlier recipe. `sweep` links a trial of `veritrain sweep` (id, trial,
    change); `sweep_selection` is what that sweep picks its best trial by (metric, mode; the record's
    `selection.sweep`). `nproc` > 1 trains with that many processes through torchrun (veritrain.train.distributed).
    `code` is where user modules come from (reproduce: the original's copies; a sweep's trial: the sweep's);
    by default the config file's folder, the working directory, then sys.path (veritrain.records.usercode).
    `epoch_judge` is a search's verdict on each validation (veritrain.train.parts.EpochJudge): a pruning one ends the run
    after that epoch with status `pruned`, neither evaluated nor exported. `engine`: what trains it
    (veritrain.train.engines; reproduce: the original's); None: the engine of a new run."""
    session = code or usercode.fresh(resolved.path)
    with session:
        return _start(resolved, workspace, argv, kind, repeat, reproduced_from, hypothesis, parent, smoke, data_version, sweep, nproc, session,
                      sweep_selection, epoch_judge, engine)


def _start(resolved: ResolvedConfig, workspace: Workspace, argv: list[str], kind: str, repeat: Optional[dict[str, Any]],
           reproduced_from: Optional[str], hypothesis: Optional[str], parent: Optional[str], smoke: Optional[dict[str, Any]],
           data_version: Optional[str], sweep: Optional[dict[str, Any]], nproc: int, code: usercode.CodeSession,
           sweep_selection: Optional[dict[str, Any]] = None, epoch_judge: Optional[EpochJudge] = None,
           engine: Optional[str] = None) -> RunOutcome:
    from veritrain.train import engines

    cfg = resolved.config
    refuse_to_start(argv, hypothesis)
    code.import_config(cfg)  # a module or factory that is missing is a config problem: exit 2 before a run exists
    if parent is not None:
        parent = workspace.resolve_run(parent).name  # fails before anything starts when it does not exist
    ranks = distributed.join_from_environment()  # rank 0 of `torchrun … -m veritrain run|train` (the others `follow`)
    if ranks is not None and nproc > 1:
        raise UserError(f"--nproc {nproc}: torchrun already started {ranks.world_size} ranks; drop --nproc")
    if nproc > 1:  # a config that cannot run with that many ranks fails here, before a run exists (exit 2)
        import torch

        device_type = "cuda" if cfg.train.device == "cuda" or (cfg.train.device == "auto" and torch.cuda.is_available()) else "cpu"
        problem = distributed.config_problem(cfg.train, nproc, device_type)
        if problem:
            raise UserError(f"--nproc {nproc}: {problem}")
    engine = engine or engines.for_new_run()
    run_id, run_dir = workspace.new_run_dir()
    (run_dir / "config.yaml").write_text(config_module.to_yaml(cfg), encoding="utf-8")
    record = Recorder.start(
        run_dir,
        run_id=run_id,
        kind=kind,
        stages=list(STAGES[kind]),
        argv=argv,
        exp_name=cfg.exp_name,
        task=cfg.task,
        seed=cfg.seed,
        config=resolved.as_dict(),
        config_recorded=CONFIG_AS_GIVEN,  # every value as given: resume and reproduce rebuild from it
        config_hash=resolved.hash,
        config_source={
            "path": str(resolved.path) if resolved.path else None,
            "overrides": list(resolved.overrides),
            "data_root": cfg.data.root,
            "data_root_resolved": resolved.recorded_data_paths().get("root"),
            "data_paths_resolved": resolved.recorded_data_paths(),
        },
        code=capture_code(workspace.root),
        data={"version": data_version} if data_version else None,
        repeat=repeat,
        sweep=sweep,
        # what selects what (veritrain.core.selection): completed once the task is known; the sweep's part is planned
        selection={"sweep": {"id": sweep["id"], "split": selection.SELECTION_SPLIT, **(sweep_selection or {})}} if sweep else None,
        distributed=None,  # several processes: world size, nodes, backend, devices, launch command
        reproduced_from=reproduced_from,
        hypothesis=hypothesis or None,  # stated before the run, sealed with it
        parent=parent,  # the reference run experiments.md compares the config with
        smoke=smoke,  # the smoke test this run relied on, or {"status": "skipped"} with --no-smoke
    )
    if engines.recorded(engine):  # what trains it, from the start: a resume, an audit and a reproduction use the same
        record.set(training={**engines.recorded(engine), "epochs": 0, "steps": 0})  # the counts are set when training ends
    if nproc > 1:  # completed by the launch with the backend and each rank's device
        record.set(distributed={"world_size": nproc, "nodes": 1, "backend": cfg.train.backend, "devices": [], "launch": []})
    elif ranks is not None:
        record.set(distributed=distributed.describe(ranks, [], distributed.torchrun_command(ranks, argv)))
    save_code(record.code, workspace.root, run_dir)
    code.save(run_dir, record.code, cfg.model.target)  # what the target imported; training adds any it imports later
    workspace.mark_created(run_dir, record)  # this user started it here, with this config and code (user_dirs.state_dir)
    return _execute(record, run_dir, resolved, workspace, resume=False, code=code, epoch_judge=epoch_judge)


def resume(workspace: Workspace, ref: str, argv: list[str], match: Optional[ResolvedConfig] = None, trust_code: bool = False,
           nproc: Optional[int] = None, use_current_code: bool = False, epoch_judge: Optional[EpochJudge] = None) -> RunOutcome:
    """Continue a run in its own folder from its newest valid checkpoint, with the user code recorded with it.
    `ref` is a RUN reference or `auto`: the newest interrupted (or stale running) run whose config hash and data
    version match `match`. A run trained by several processes resumes with as many (`nproc`, when given, must be
    that number). `use_current_code` continues in a new run (parent: the run) built from today's code instead."""
    refuse_to_start(argv)
    ranks = distributed.join_from_environment()  # rank 0 of `torchrun … -m veritrain train --resume RUN`
    run_dir = _auto_resume_target(workspace, match) if ref == "auto" else workspace.resolve_run(ref, "resumable")
    journal.recover(workspace, run_dir)  # an amend (eval, export) a kill interrupted: completed or rolled back first
    record = read_record(run_dir)
    if replay.is_script_run(record):
        return _resume_script(workspace, record, trust_code, use_current_code, nproc)
    resolved = resolved_from_record(record)
    cfg = resolved.config
    refuse_untrusted_code(workspace, run_dir, record, trust_code)
    status = record.get("status")
    if status == "completed":
        raise UserError(f"--resume {ref}: run {run_dir.name} already completed; start a new run instead")
    if status == "pruned":
        raise UserError(f"--resume {ref}: run {run_dir.name} was pruned by its search after step {(record.get('pruned') or {}).get('step')}, "
                        "which ends it; start a new run of its config to train it further: "
                        f"veritrain run runs/{run_dir.name}/config.yaml")
    if status == "running" and not workspace.lock_is_stale(run_dir.name):
        raise UserError(f"--resume {ref}: run {run_dir.name} is still running (its lock is held by a live process)")
    recorded = record.get("distributed") or {}
    world_size = int(recorded.get("world_size", 1))
    if ranks is not None and ranks.world_size != world_size:
        raise UserError(f"--resume {ref}: run {run_dir.name} was trained by {world_size} process(es) and torchrun started {ranks.world_size}; "
                        "resume with the same number: each rank's random state and share of the data are in its checkpoints")
    if ranks is None and int(recorded.get("nodes", 1)) > 1:
        raise UserError(f"--resume {ref}: run {run_dir.name} was trained on {recorded['nodes']} machines; resume it with the same torchrun "
                        f"command: {' '.join(recorded.get('launch') or ['torchrun'])} (with --resume {run_dir.name} instead of the config)")
    if nproc is not None and nproc != world_size:
        raise UserError(f"--nproc {nproc}: run {run_dir.name} was trained by {world_size} process(es); resume it with the same number "
                        f"(--nproc {world_size}, or leave --nproc out): each rank's random state and share of the data are in its checkpoints")
    if config_hash(cfg) != record["config_hash"]:
        raise RunFailed(f"--resume {ref}: the recorded config of {run_dir.name} no longer hashes to its config_hash; this veritrain cannot resume it")
    if use_current_code:
        return _resume_in_new_run(workspace, run_dir, record, resolved, argv)
    with code_session(workspace, run_dir, record, "resume") as code:
        code.import_config(cfg)
        return _execute(Recorder.resume(record, argv), run_dir, resolved, workspace, resume=True, code=code, epoch_judge=epoch_judge)


def _resume_script(workspace: Workspace, record: Record, trust_code: bool, use_current_code: bool, nproc: Optional[int]) -> RunOutcome:
    """`--resume RUN` of a script's run (veritrain.userloop): its recorded command, with its recorded code, continues it."""
    run_dir = record.run_dir
    if use_current_code:
        raise UserError(f"--use-current-code: run {run_dir.name} is a script's run, which resumes only with its recorded code; "
                        "for a run with the current code, run the script again (resume=\"auto\" continues with it when the code is unchanged)")
    if nproc not in (None, 1):
        raise UserError(f"--nproc {nproc}: run {run_dir.name} is a script's run; its script starts its own processes")
    refuse_untrusted_code(workspace, run_dir, record, trust_code)
    if record.status == "running" and not workspace.lock_is_stale(run_dir.name):
        raise UserError(f"--resume {run_dir.name}: the run is still running (its lock is held by a live process)")
    started = time.perf_counter()
    code = replay.resume(workspace, run_dir)
    after = read_record(run_dir)
    error: Optional[VeritrainError] = None
    if after.status != "completed":
        error = RunFailed(f"run {run_dir.name} {after.status} (the script exited {code}); `veritrain runs show {run_dir.name}` says more")
    seal = (run_dir / "record.sha256").read_text().strip()
    summary = {"run_id": run_dir.name, "run_dir": str(run_dir), "status": after.status, "data_version": None,
               "final_state_sha256": after.get("final_state_sha256"), "metrics": thawed(after.get("metrics") or {})}
    if error is not None:
        summary["error"] = str(error)
    return RunOutcome(summary=summary, record=after, seal=seal, seconds=time.perf_counter() - started, error=error)


def _resume_in_new_run(workspace: Workspace, old_dir: Path, old_record: Record, resolved: ResolvedConfig, argv: list[str]) -> RunOutcome:
    """`--resume RUN --use-current-code`: a new run (parent RUN) that starts from a copy of RUN's checkpoints and
    logs and trains on with the current user code, recorded as its own; RUN is left byte for byte as it was."""

    cfg = resolved.config
    with code_session(workspace, old_dir, old_record, "resume", use_current=True) as code:
        code.import_config(cfg)
        run_id, run_dir = workspace.new_run_dir()
        for source in sorted(old_dir.rglob("*")):
            relative = source.relative_to(old_dir)
            if relative.parts[0] in (usercode.CODE_DIR, "record.json", "record.sha256") or not source.is_file():
                continue
            (run_dir / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, run_dir / relative)
        event = {"kind": "current_code", "step": None, "at": now_iso(),
                 "detail": f"continues run {old_dir.name} from its newest checkpoint, built with the current code"}
        record = Recorder.continue_in(run_dir, old_record, argv, {**capture_code(workspace.root), "user_files": []}, event,
                                      dropped=("seal_history", "artifacts"))
        save_code(record.code, workspace.root, run_dir)
        code.save(run_dir, record.code, cfg.model.target)
        workspace.mark_created(run_dir, record)
        log.warning("resume: run %s continues in a new run %s with the current code; %s is left as it was", old_dir.name, run_id, old_dir.name)
        return _execute(record, run_dir, resolved, workspace, resume=True, code=code)


def _auto_resume_target(workspace: Workspace, match: Optional[ResolvedConfig]) -> Path:
    """`--resume auto`: without a config, the newest interrupted run of the workspace (named on the console);
    with one, the newest interrupted run of that config and data version."""
    if match is None:
        try:
            run_dir = workspace.resolve_run("latest", "resumable")
        except UserError:
            raise UserError("--resume auto: no interrupted run in this workspace; start one with `veritrain train`") from None
        log.info("resume: the newest interrupted run is %s", run_dir.name)
        return run_dir

    data_version = prepare.run(match.config.data, match.data_paths, workspace.state_dir).version
    candidates = []
    for run_dir in sorted(workspace.runs_dir.glob("*"), reverse=True) if workspace.runs_dir.exists() else []:
        try:
            record = read_record(run_dir)
        except RunFailed:
            continue
        resumable = record.get("status") == "interrupted" or (
            record.get("status") == "running" and workspace.lock_is_stale(run_dir.name)
        )
        # a run killed before its data was prepared has no version yet: it prepares this config's when it continues
        if resumable and record.get("config_hash") == match.hash and (record.get("data") or {}).get("version") in (data_version, None):
            candidates.append(run_dir)
    if not candidates:
        raise UserError("--resume auto: no interrupted run with this config and data version; start one with `veritrain train`")
    return candidates[0]


def _execute(record: Recorder, run_dir: Path, resolved: ResolvedConfig, workspace: Workspace, resume: bool,
             code: Optional[usercode.CodeSession] = None, epoch_judge: Optional[EpochJudge] = None) -> RunOutcome:
    started = time.perf_counter()
    cfg = resolved.config
    run_id = record.run_id
    workspace.lock_run(run_id)  # UserError when another live process holds it: then nothing here has changed
    if resume:
        _refuse_resumed_meanwhile(run_dir, record, workspace)
    file_log = logs.attach_file(run_dir / "train.log")
    if resume:  # before anything re-seals the run: a kill may have left a write's temp file anywhere in it
        unfinished = remove_unfinished(run_dir)
        if unfinished:
            log.info("resume: removed %s, left by a write that was interrupted", ", ".join(unfinished))
    error: Optional[VeritrainError | Interrupted] = None
    ranks = distributed.from_environment()
    announced = {"done": ranks is None}  # under torchrun, the other ranks wait for rank 0 to say where the run is
    try:
        with interruptible() as stop:
            import torch  # noqa: F401  (imported here so the environment below names its version)

            from veritrain.core.seeding import seed_everything
            from veritrain.data import prepare
            from veritrain.tasks import get_task

            # every entry point (run, train, resume, reproduce) sets the deterministic environment
            # (CUBLAS_WORKSPACE_CONFIG) before recording it, so their records compare equal
            seed_everything(cfg.seed, cfg.train.deterministic, compiler=cfg.train.compile)
            env, package_list = capture_env()
            if resume and record.get("env"):
                drift = {k: (record["env"].get(k), v) for k, v in env.items() if k in ("python", "torch", "packages_sha256") and record["env"].get(k) != v}
                if drift:
                    log.warning("resume: environment differs from the run's start (%s)", ", ".join(f"{k} {a} → {b}" for k, (a, b) in drift.items()))
            env["variables"] = allowed_environment()  # only the allowlist: never the whole environment
            record.set(env=env)
            (run_dir / "env").mkdir(exist_ok=True)
            (run_dir / "env" / "requirements.lock").write_text(package_list, encoding="utf-8")
            record.set(selection=selection.for_run(cfg, get_task(cfg).best_metric, record["stages"], (record.get("selection") or {}).get("sweep")))
            record.set(task_spec=task_spec(cfg.task).to_json())  # what its task declares, so readers need not load the task
            _log_header(record, resolved, run_dir, resume)
            record.write()

            t = time.perf_counter()
            recorded_version = (record.get("data") or {}).get("version")
            data = prepare.run(cfg.data, resolved.data_paths, workspace.state_dir, recorded=recorded_version)
            tokenizer = tokenizer_difference(record.get("data"), data) if recorded_version is not None else None
            if tokenizer:  # checkpoints and results are in the recorded tokenizer's ids: never continued or compared under others
                raise RunFailed(f"{'resume' if resume else 'reproduce'}: {tokenizer}; restore the data and its tokenizer, or start a new run")
            if recorded_version is not None and data.version != recorded_version:
                raise RunFailed(f"{'resume' if resume else 'reproduce'}: the data now prepares to version {data.version[:12]}, the run used "
                                f"{(record.get('data') or {}).get('version', '?')[:12]}; restore the data or start a new run"
                                + (prepare.earlier_recipe_hint(record.get("data")) if resume else ""))
            record.time("prepare", time.perf_counter() - t)
            record.set(data=data_summary(data))
            log.info("data: version %s  %s", data.version[:12], "  ".join(f"{k} {v}" for k, v in data.counts.items()))
            record.write()

            task = get_task(cfg)
            selection.require_validation(record["selection"], data.counts.get("val", 0))  # before training, which would select on it
            pruned = None
            if "train" in record["stages"]:
                pruned = _train_stage(record, run_dir, cfg, data, task, stop, resume, workspace.state_dir, ranks, announced, epoch_judge)
            if pruned is not None:  # its search stopped it: trained this far, never evaluated on test
                record.pruned(pruned)
            else:
                _evaluation_stages(record, run_dir, cfg, data, task)
                record.completed()
    except Interrupted as err:
        error = err
        record.interrupted("Interrupted", str(err))
        log.warning("run %s interrupted (%s)", run_id, err, extra=logs.FILE_ONLY)
    except RankLost as err:  # resumable like a signal: the newest scheduled checkpoint is the resume point
        error = err
        record.interrupted("RankLost", str(err))
        log.warning("run %s interrupted: %s", run_id, err, extra=logs.FILE_ONLY)
    except VeritrainError as err:
        error = err if isinstance(err, UserError) else RunFailed(f"run {run_id} failed: {err}")
        _record_failure(record, err)
    except Exception as err:  # a bug or an environment problem: keep the traceback in train.log
        error = RunFailed(f"run {run_id} failed: {err.__class__.__name__}: {err} (traceback in {run_dir / 'train.log'})")
        _record_failure(record, err)
    finally:
        if not announced["done"]:  # stopped before training: release the waiting ranks
            try:
                distributed.broadcast(None)
            except distributed.PeerLost:
                pass
        seconds = time.perf_counter() - started
        record.finish(seconds, env=capture_env()[0] if record.get("env") is None else None)
        if code is not None and record.code.get("user_files") is not None:  # modules imported while it ran, however it ended
            marked = workspace.created_here(run_dir, record)  # a mark grows with the code only when it held the code so far
            try:
                code.save(run_dir, record.code, cfg.model.target)
            except VeritrainError as err:
                if error is None:
                    error = err
                    _record_failure(record, err)
            if marked:
                workspace.mark_created(run_dir, record)
        if record.status == "completed":
            log.info("run %s completed in %.1fs", run_id, seconds)
        logs.detach(file_log)  # the log is complete before it is hashed into the record
        seal = record.write()
        workspace.unlock_run(run_id)
        update_experiments(workspace)

    summary = {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "status": record.status,
        "data_version": (record["data"] or {}).get("version"),
        "final_state_sha256": record["final_state_sha256"],
        "metrics": thawed(record["metrics"]),
    }
    if error is not None:
        summary["error"] = str(error)
    return RunOutcome(summary=summary, record=record.snapshot(), seal=seal, seconds=seconds, error=error)


def _refuse_resumed_meanwhile(run_dir: Path, record: Recorder, workspace: Workspace) -> None:
    """With the run's lock held: the record on disk must still be the one this resume read (its resumes, less the
    one just added). Another resume may have taken the lock, continued the run and let go in between."""
    if not (run_dir / "record.json").exists():
        return  # --use-current-code: a new run, whose first record is yet to be written
    try:
        now = read_record(run_dir)
    except RunFailed:
        now = {}
    previous = (record.get("resumes") or [{}])[-1].get("previous_status")  # the status this resume read: failed, interrupted, running
    if now.get("status") != previous or len(now.get("resumes") or []) != len(record.get("resumes") or []) - 1:
        workspace.unlock_run(run_dir.name)
        raise UserError(f"--resume {run_dir.name}: another process resumed the run while this one started "
                        f"(it is {now.get('status', 'unreadable')} now); see `veritrain runs show {run_dir.name}`")


def follow() -> int:
    """A rank other than 0 of `torchrun … -m veritrain run|train`: wait for rank 0 to say where the run is,
    train this rank's share of every batch (`distributed.train_rank`), and return the exit code. Rank 0 keeps
    the record and the console; this rank logs to `train.rank<k>.log` in the run."""
    logs.silence_console()
    ranks = distributed.join_from_environment()
    assert ranks is not None and not ranks.is_main
    try:
        announced = distributed.broadcast(None)
    except Exception as err:
        lost = distributed.lost_peer(err)
        if lost is None:
            raise
        log.debug("rank %d: another rank is gone (%s)", ranks.rank, lost)
        return 1
    if announced is None:  # rank 0 stopped before training and reports why
        return 0
    run_dir = Path(announced["run_dir"])
    file_log = logs.attach_file(run_dir / f"train.rank{ranks.rank}.log")
    try:
        _, code = distributed.train_rank(ranks, run_dir, Path(announced["data_path"]), announced["resume"], [])
    finally:
        logs.detach(file_log)
    if code == 0:  # never under a traceback that may hold the DDP wrapper (see distributed.worker)
        distributed.stop_group()
    return code


def _train_stage(record: Recorder, run_dir: Path, cfg: RunConfig, data: DataVersion, task: Task, stop: StopFlag, resume: bool,
                 state_dir: Path, ranks: Optional[distributed.Ranks] = None, announced: Optional[dict[str, bool]] = None,
                 epoch_judge: Optional[EpochJudge] = None) -> Optional[dict[str, Any]]:
    """Train (one process, torchrun's rank 0, or --nproc ranks) and record what training made; returns the
    search's verdict when it pruned the run, else None."""
    from veritrain.train import engines
    from veritrain.train.parts import TrainResult

    t = time.perf_counter()
    world_size = int((record.get("distributed") or {}).get("world_size", 1))
    if ranks is not None:  # rank 0 under torchrun: tell the other ranks where the run is, then train with them
        distributed.broadcast({"run_dir": str(run_dir), "data_path": str(data.path), "resume": resume})
        if announced is not None:
            announced["done"] = True
        try:
            result = engines.train(engines.of_record(record), cfg, data, task, run_dir, stop, logs.console, resume=resume,
                                   events=record.events, ranks=ranks, record_format=record.get("record_format"))
        except Exception as err:
            lost = distributed.lost_peer(err)
            if lost is None:
                raise
            raise RankLost(f"another rank was lost ({lost}); the ranks stopped without it. The run is interrupted at its newest "
                           f"scheduled checkpoint; resume with the same torchrun command and `veritrain train --resume {run_dir.name}`") from None
        record.update_section("distributed", backend=result.backend, devices=result.devices)
    elif world_size > 1:  # `--nproc N`: torchrun starts the ranks; this process keeps the record
        try:
            payload = distributed.launch(run_dir, state_dir, data.path, world_size, resume, stop, cfg.train.threads)
        except BaseException as err:
            # what rank 0 recorded before it stopped; no train timing, as for one process: a stage without one is
            # the stage the run stopped in (require_checkpoint)
            record.add_events(getattr(err, "train_events", []))
            raise
        record.add_events(payload.pop("events"))
        launch_command = [str(Path(part).relative_to(state_dir.parent)) if part.startswith(str(state_dir.parent) + "/") else part
                          for part in payload.pop("launch")]  # workspace paths relative to the workspace
        result = TrainResult(**payload)
        record.set(distributed={"world_size": world_size, "nodes": 1, "backend": result.backend or "gloo",
                                "devices": result.devices or [], "launch": launch_command})
    else:
        result = engines.train(engines.of_record(record), cfg, data, task, run_dir, stop, logs.console, resume=resume, events=record.events,
                               epoch_judge=epoch_judge, record_format=record.get("record_format"))
    record.time("train", time.perf_counter() - t, add=True)
    record.update_section("env", device=result.device, torch_threads=result.threads)

    record.set(final_state_sha256=result.final_state_sha256,
               trajectory=trajectory.for_record(result.trajectory or [], run_dir / "checkpoints", cfg.checkpoint.audit_every),
               other_saves=result.other_saves or [])
    record.set(training={
        "epochs": result.epochs_trained if result.epochs_trained is not None else len(result.epochs),
        "steps": result.steps,
        "best_epoch": result.best_epoch,
        **({"best_step": result.best_step} if result.best_step is not None else {}),
        "best_metric": {"name": result.best_metric[0], "mode": result.best_metric[1], "value": result.best_value},
        "last_epoch": result.epochs[-1] if result.epochs else None,
        "peak_memory_mb": result.peak_memory_mb,
        "loop_seconds": result.loop_seconds,
        "settings": {"device": result.device, "threads": result.threads, "num_workers": cfg.train.num_workers},
        **engines.recorded(engines.of_record(record)),
    })
    record.write()
    return result.pruned


def _evaluation_stages(record: Recorder, run_dir: Path, cfg: RunConfig, data: DataVersion, task: Task) -> None:
    """Baselines, evaluation and export, as far as the run's kind has them."""
    from veritrain.results import evaluate
    from veritrain.train.loop import resolve_device

    stages = record["stages"]
    baselines = None
    if "baselines" in stages and (cfg.eval.baselines or "train" not in stages) and task.spec.baseline is not None:
        t = time.perf_counter()
        baselines = fit_baselines(run_dir, cfg, data, task)
        record.set(baselines=baselines)
        record.time("baselines", time.perf_counter() - t)
        names = task_spec(cfg.task).names()
        log.info("baselines: %s", "  ".join(f"{name} {display.headline(r, names)}" for name, r in baselines["results"].items()))
    if "eval" in stages:
        t = time.perf_counter()
        for split in evaluation_splits(record, cfg, run_dir.parent):  # each from the same checkpoint: the one export ships
            metrics = evaluate.run(cfg, data, task, run_dir, resolve_device(cfg.train.device), split=split, baselines=baselines)
            metrics["trajectory_entry"] = result_entry(record, metrics["checkpoint"], metrics["checkpoint_state_sha256"])
            record.set_metrics(split, metrics)
        record.time("eval", time.perf_counter() - t)
        verdict = baseline_verdict(record["metrics"].get(cfg.eval.split, metrics), baselines)
        if verdict and baselines is not None:
            baselines["warning"] = verdict
            record.set(baselines=baselines)
            log.warning("eval: %s", verdict)
    if "export" in stages:
        t = time.perf_counter()
        try:
            description = export.run(cfg, data, task, run_dir, record=record.snapshot())
        except export.ParityFailed as err:
            record.set(export={"parity": err.parity})
            raise
        record.set(export=export_record(record, description))
        record.time("export", time.perf_counter() - t)


def evaluation_splits(record: Mapping[str, Any] | Recorder, cfg: RunConfig, runs_dir: Path) -> list[str]:
    """The splits a run evaluates, all from the same checkpoint: `eval.split`; for a run of a sweep both val (the
    sweep selects its best trial on it) and test (the selected trial's final report); for a seed of a `--repeat`
    group test too (the group's final report); for a reproduction also those its original evaluated, so that
    every result compares."""
    splits = [selection.SELECTION_SPLIT, selection.REPORT_SPLIT] if record.get("sweep") else [cfg.eval.split]
    if record.get("repeat") and selection.REPORT_SPLIT not in splits:
        splits.append(selection.REPORT_SPLIT)
    if record.get("reproduced_from"):
        try:
            original = read_record(runs_dir / record["reproduced_from"]).get("metrics") or {}
        except RunFailed:  # gone or damaged since reproduce read it: the run's own splits
            original = {}
        splits += [split for split in (selection.SELECTION_SPLIT, selection.REPORT_SPLIT) if split in original and split not in splits]
    return splits


# Set (to 1) in the processes of a sweep's or search's trials (veritrain.orchestration.trials.process): their runs write only their own folders,
# and the sweep's driver, the one process that opens the workspace's SQLite index, refreshes it and experiments.md
# as they finish. SQLite must not be written from several hosts over a network filesystem.
DEFER_INDEX_VARIABLE = "VERITRAIN_DEFER_INDEX"


def update_experiments(workspace: Workspace) -> None:
    """Regenerate experiments.md; a failure here is reported, never fatal to the run."""


    if environ.get(DEFER_INDEX_VARIABLE) == "1":
        return
    try:
        experiments.write(workspace.state_dir, workspace.runs_dir, workspace.root / "experiments.md")
    except Exception as err:  # the run itself is sealed; the log can be rebuilt any time
        log.warning("experiments.md not updated (%s: %s); `veritrain runs reindex` rebuilds it", err.__class__.__name__, err)


def fit_baselines(run_dir: Path, cfg: RunConfig, data: DataVersion, task: Task) -> dict[str, Any]:
    """The task's baselines on the run's splits, written to eval/baselines.json (with the margin and the rule that
    judges them) below `run_dir` (a new run, or the staging folder of an amend)."""
    baselines = task.baselines(data, cfg)
    if baselines is None:
        raise RunFailed(f"baselines: task {cfg.task} declares the baseline rule {task.spec.baseline_rule()} but fits no baselines "
                        "(Task.baselines gave None); return its baselines document, or declare no baseline in its TaskSpec")
    baselines["margin"] = cfg.eval.baseline_margin
    baselines["judged_by"] = task_spec(cfg.task).baseline_rule()  # the rule its task declares (veritrain.core.baselines)
    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / "baselines.json").write_text(json.dumps(baselines, indent=2) + "\n", encoding="utf-8")
    return baselines


def baseline_verdict(metrics: dict[str, Any], baselines: Optional[dict[str, Any]]) -> Optional[str]:
    """A warning when the model does not beat its baseline by the margin (veritrain.core.baselines: the one judgement
    `check` and the reports read too)."""

    return judge(metrics, baselines).warning


def _log_header(record: Recorder, resolved: ResolvedConfig, run_dir: Path, resume: bool) -> None:
    import torch

    cfg, code, env = resolved.config, record["code"], record["env"]
    verb = "resuming" if resume else "starting"
    log.info("%s %s %s (%s) in %s", verb, record["kind"], record["run_id"], cfg.exp_name, run_dir)
    log.info("command: %s", " ".join(record["argv"]))
    log.info("config %s (%s):\n%s", resolved.hash[:12], resolved.source_label, config_module.compact(cfg))
    log.info(
        "code: veritrain %s, git %s%s | torch %s, CUDA %s | threads %d",
        code["veritrain"], (code["git_commit"] or "-")[:12], " (dirty)" if code["git_dirty"] else "",
        torch.__version__, torch.version.cuda or "-", torch.get_num_threads(),
    )
    log.debug("env: %s", env)


def _record_failure(record: Recorder, err: BaseException) -> None:
    record.failed(err)
    log.error("run %s failed: %s", record.run_id, err, extra=logs.FILE_ONLY)  # the CLI shows the one-line error
    log.debug("traceback:\n%s", "".join(traceback.format_exception(err)))


def python_argv() -> list[str]:
    """The command line as the user typed it (program name shortened to `veritrain`)."""
    return ["veritrain", *sys.argv[1:]]


def refuse_to_start(argv: list[str], hypothesis: Optional[str] = None) -> None:
    """What stops a run before it exists (UserError). A record keeps its command line and hypothesis as given: one
    holding a secret by its shape is refused, and a hypothesis also when it writes out a credential under its key name
    (`secrets.text_secret`). A signing key that is there but unusable is refused too, not found at the final seal."""
    sealing_key()
    found = secret_in_command_line(argv)
    if found is None and hypothesis and (kind := text_secret(hypothesis)):
        found = f"--hypothesis ({kind})"
    if found is not None:
        raise UserError(f"{found}: a run records its command line as given; leave the secret out (a config value can be "
                        "${env:NAME}, read when it is used)")


def amend(opened: OpenRun, workspace: Workspace, change: Amendment, kind: str, detail: str) -> str:
    """Record an event on a finished run and seal it again with the files `change` staged (veritrain.records.recorder.amending);
    returns the new seal."""
    if opened.drift:
        change.add_event("data_drift", opened.drift + " (--allow-data-drift)")
    change.add_event(kind, detail)
    seal = change.commit(by=kind)
    update_experiments(workspace)  # new metrics or export results show there too
    return seal


def baselines_run(opened: OpenRun, workspace: Workspace) -> dict[str, Any]:
    """`veritrain baseline RUN`: fit the task's baselines on the run's splits and amend the run with them."""
    with amending(workspace, opened.record) as change:
        result = fit_baselines(change.new, opened.config, opened.data, opened.task)
        change.set_baselines(result)
        names = task_spec(opened.config.task).names()
        amend(opened, workspace, change, "baselines", ", ".join(f"{k} {display.headline(v, names)}" for k, v in result["results"].items()))
    return result


def baselines(workspace: Workspace, ref: str, overrides: tuple[str, ...] = (), trust_code: bool = False) -> dict[str, Any]:
    """`veritrain baseline RUN|CONFIG`: the baselines of a config in a new run of kind `baseline`, or of a run's
    splits, amending the run; the result names the run (`run_id`)."""
    if Path(ref).is_file():
        outcome = run(config_module.load_config(ref, overrides), workspace, python_argv(), kind="baseline")
        if outcome.error is not None:
            raise outcome.error
        return {**thawed(outcome.record["baselines"]), "run_id": outcome.summary["run_id"]}
    if overrides:
        raise UserError("--set: a run's baselines use its recorded config; drop --set")
    opened = open_run(workspace, ref, trust_code=trust_code)
    if task_spec(opened.config.task).baseline is None:
        raise UserError(f"{ref}: the task {opened.config.task!r} declares no baseline (its TaskSpec's `baseline`)")
    with code_session(workspace, opened.run_dir, opened.record, "baseline") as code:  # the task's code as the run recorded it
        code.import_config(opened.config)
        return {**baselines_run(opened, workspace), "run_id": opened.run_dir.name}


# ---------------------------------------------------------------- results of an existing run, and outside checkpoints


def result_entry(record: Mapping[str, Any], checkpoint_shown: str, state_hash: str) -> Optional[dict[str, Any]]:
    """The trajectory entry a result's checkpoint holds ({index, step, state_sha256}); None for a run without a
    trajectory (made before it, or interrupted: its record has none yet). RunFailed when the run has a trajectory
    and the state is not in it: a timing save (signal, every_minutes) is a resume point, never a result."""

    entries = record.get("trajectory") or []
    if not entries:
        return None
    index = trajectory.entry_with_state(entries, state_hash)
    if index is None:
        raise UserError(f"--checkpoint {checkpoint_shown}: its state ({state_hash[:12]}) is not an entry of the run's trajectory "
                        "(a timing save, or a state the run never committed to); no result comes from it: give best, last or "
                        "a step file of the trajectory")
    return {"index": index, "step": entries[index]["step"], "state_sha256": state_hash}


def export_record(record: Mapping[str, Any], description: dict[str, Any]) -> dict[str, Any]:
    """What the record keeps of an export: its files, parity, the checkpoint and the trajectory entry it holds."""
    return {"files": description["files"], "parity": description["parity"], "checkpoint": description["checkpoint"],
            "trajectory_entry": result_entry(record, description["checkpoint"], description["checkpoint_state_sha256"])}


@dataclass
class Amended:
    """What `evaluate_run` and `export_run` did: `run_dir` is the run amended, or the new run of an outside
    checkpoint (`outside` True: kind eval or export, parent the run asked for)."""

    run_dir: Path
    seal: str
    result: dict[str, Any]  # the metrics, or the export's description
    outside: bool = False
    parent: Optional[str] = None  # with `outside`: the run whose checkpoint was not used
    why: Optional[str] = None  # with `outside`: outside_checkpoint, current_code or not_selected


def _in_run_checkpoint(opened: OpenRun, which: Optional[str]) -> tuple[Optional[str], Optional[Path]]:
    """(the checkpoint as a path inside the run, the outside file) for `--checkpoint which`. A path outside the run
    whose state is a trajectory entry that a checkpoint of the run holds counts as that checkpoint."""
    from veritrain.results.evaluate import checkpoint_path
    from veritrain.train import checkpoint, trajectory

    given = Path(which).expanduser() if which not in (None, "best", "last") else None
    if given is not None and not given.is_absolute() and given.exists():  # as the shell gave it: relative to the current folder
        which = str(given.absolute())
    path = checkpoint_path(opened.config, opened.run_dir, which)  # else relative to the run, as checkpoints/step-N.pt
    if not path.exists():
        raise UserError(f"--checkpoint: {path}: no such checkpoint; give best, last or the path of a .pt file")
    run_dir = opened.run_dir.resolve()
    real = path.resolve()
    artifacts = opened.record.get("artifacts") or {}
    if real.is_relative_to(run_dir / "checkpoints") and real.relative_to(run_dir).as_posix() in artifacts:
        return real.relative_to(run_dir).as_posix(), None
    entries = opened.record.get("trajectory") or []
    if entries:
        try:
            _, state = checkpoint.load_outside(real)
        except checkpoint.CheckpointError as err:
            raise UserError(f"--checkpoint: {err}") from None
        index = trajectory.entry_with_state(entries, trajectory.state_sha256(state))
        if index is not None:  # the run keeps this state itself: use its own file (verify has matched its state)
            candidates = [f"checkpoints/step-{entries[index]['step']}.pt"]
            if index == len(entries) - 1:
                candidates.append("checkpoints/last.pt")
            if index == trajectory.best_entry(entries, opened.record.get("training")):
                candidates.append("checkpoints/best.pt")
            for name in candidates:
                if name in artifacts and (opened.run_dir / name).is_file():
                    return name, None
    return None, real


def evaluate_run(workspace: Workspace, ref: str, which: Optional[str], split: Optional[str], argv: list[str],
                 allow_data_drift: bool = False, trust_code: bool = False, use_current_code: bool = False) -> Amended:
    """`veritrain eval RUN`: evaluate a checkpoint of the run (default best.pt, or last.pt) and amend the run, after
    a full verify. The model is built from the code recorded with the run. The result names the trajectory entry it
    came from. A checkpoint outside the run's trajectory, or `use_current_code`, never changes the run: the
    checkpoint is evaluated in a new run of kind `eval` whose parent is RUN."""
    from veritrain.results import evaluate
    from veritrain.train.loop import resolve_device

    opened = open_run(workspace, ref, allow_data_drift, trust_code=trust_code, need="model")
    require_checkpoint(opened, which)
    inside, outside = _in_run_checkpoint(opened, which)
    device = resolve_device(opened.config.train.device)
    chosen = selected_checkpoints(opened.record)
    # test is the final report of the model validation selected: another checkpoint of it is evaluated in a child run
    unselected = (split or opened.config.eval.split) == "test" and inside is not None and bool(chosen) and inside not in chosen
    with code_session(workspace, opened.run_dir, opened.record, "eval", use_current_code) as code:
        code.import_config(opened.config)
        if outside is not None or use_current_code or unselected:
            def stage(run_dir: Path, record: Recorder) -> dict[str, Any]:
                metrics = evaluate.run(opened.config, opened.data, opened.task, run_dir, device, INPUT_CHECKPOINT, split)
                record.set_metrics(metrics["split"], metrics)
                return metrics

            why = "current_code" if use_current_code else "not_selected" if outside is None else "outside_checkpoint"
            return _outside_run(workspace, opened, outside or opened.run_dir / str(inside), "eval", argv, stage, code, why=why)
        with amending(workspace, opened.record) as change:  # eval/<split>/ is written beside the run
            metrics = evaluate.run(opened.config, opened.data, opened.task, opened.run_dir, device, inside, split,
                                   baselines=thawed(opened.record.get("baselines")), out_root=change.new)
            metrics["trajectory_entry"] = result_entry(opened.record, metrics["checkpoint"], metrics["checkpoint_state_sha256"])
            change.set_metrics(metrics["split"], metrics)
            seal = amend(opened, workspace, change, "eval",
                         f"{metrics['checkpoint']} on {metrics['split']}: {display.headline(metrics, task_spec(opened.config.task).names())}")
    return Amended(opened.run_dir, seal, metrics)


def export_run(workspace: Workspace, ref: str, which: Optional[str], formats: Optional[list[str]], argv: list[str],
               trust_code: bool = False, use_current_code: bool = False) -> Amended:
    """`veritrain export RUN`: export a checkpoint of the run and amend the run, after a full verify; an outside
    checkpoint, or `use_current_code`, is exported in a new run of kind `export` (see `evaluate_run`). Raises
    export.ParityFailed after recording the failed parity."""

    opened = open_run(workspace, ref, trust_code=trust_code, need="model")
    require_checkpoint(opened, which)
    inside, outside = _in_run_checkpoint(opened, which)
    with code_session(workspace, opened.run_dir, opened.record, "export", use_current_code) as code:
        code.import_config(opened.config)
        if outside is not None or use_current_code:
            def stage(run_dir: Path, record: Recorder) -> dict[str, Any]:
                try:
                    description = export.run(opened.config, opened.data, opened.task, run_dir, INPUT_CHECKPOINT, formats, record=record.snapshot())
                except export.ParityFailed as err:
                    record.set(export={"parity": err.parity})
                    raise
                record.set(export={"files": description["files"], "parity": description["parity"], "checkpoint": description["checkpoint"]})
                return description

            return _outside_run(workspace, opened, outside or opened.run_dir / str(inside), "export", argv, stage, code,
                                why="current_code" if use_current_code else "outside_checkpoint")
        with amending(workspace, opened.record) as change:  # the new export/ is written beside the run
            try:
                description = export.run(opened.config, opened.data, opened.task, opened.run_dir, inside, formats,
                                         out_dir=change.replace_folder("export"), record=opened.record)
            except export.ParityFailed as err:
                change.set_export({"parity": err.parity})
                amend(opened, workspace, change, "export", f"parity FAILED: {err.parity['reason']}")
                raise
            change.set_export(export_record(opened.record, description))
            seal = amend(opened, workspace, change, "export", f"{', '.join(description['files'])}; parity passed")
    return Amended(opened.run_dir, seal, description)


INPUT_CHECKPOINT = "checkpoints/input.pt"  # an eval or export run's outside checkpoint, copied in


def _outside_run(workspace: Workspace, opened: OpenRun, source: Path, kind: str, argv: list[str],
                 stage: Callable[[Path, Recorder], dict[str, Any]],
                 code: usercode.CodeSession, why: str = "outside_checkpoint") -> Amended:
    """A new run of `kind` (eval or export) with `parent` = the opened run, for a checkpoint outside its trajectory
    (or, with `current_code`, any checkpoint of it built with today's code): the checkpoint is copied in
    (checkpoints/input.pt, hashed) and the code it is built with is recorded (`code`), so the new run verifies on its
    own, and the opened run is left byte for byte as it was. Its results are not from the audited training (or not
    from the recorded code), and say so."""
    from veritrain.train import checkpoint, trajectory

    current_code = why == "current_code"
    try:
        data, state = checkpoint.load_outside(source)
    except checkpoint.CheckpointError as err:
        raise UserError(f"--checkpoint: {err}") from None
    state_hash = trajectory.state_sha256(state)
    cfg = opened.config
    parent = opened.run_dir.name
    run_id, run_dir = workspace.new_run_dir()
    workspace.lock_run(run_id)
    (run_dir / "config.yaml").write_text(config_module.to_yaml(cfg), encoding="utf-8")
    (run_dir / "checkpoints").mkdir()
    checkpoint.write(run_dir / "checkpoints", data, ["input.pt"], keep_last=1)
    env, package_list = capture_env()
    (run_dir / "env").mkdir()
    (run_dir / "env" / "requirements.lock").write_text(package_list, encoding="utf-8")
    if current_code:
        event = {"kind": "current_code", "step": None, "at": now_iso(),
                 "detail": f"{source} (state {state_hash[:12]}) of run {parent}, built with the current code rather than the code recorded with it"}
    elif why == "not_selected":
        event = {"kind": "not_selected", "step": None, "at": now_iso(),
                 "detail": f"{source} (state {state_hash[:12]}) of run {parent} on test: not the selected model (validation selected "
                           f"{', '.join(sorted(selected_checkpoints(opened.record)))}); test is the final report of that one only"}
    else:
        event = {"kind": "outside_checkpoint", "step": None, "at": now_iso(),
                 "detail": f"{source} (state {state_hash[:12]}) is not a state of the trajectory of run {parent}: not from the audited training"}
    described = {key: opened.record[key] for key in ("config_recorded",) if key in opened.record}  # fields of the parent's that describe its config
    record = Recorder.start(
        run_dir,
        run_id=run_id,
        kind=kind,
        stages=[kind],
        argv=argv,
        exp_name=opened.record.get("exp_name"),
        task=opened.record.get("task"),
        seed=opened.record.get("seed"),
        config=opened.record["config"],
        config_hash=opened.record["config_hash"],
        config_source=opened.record.get("config_source"),
        code={**capture_code(workspace.root), "user_files": []},
        env=env,
        data=data_summary(opened.data),
        events=[event],
        parent=parent,
        input_checkpoint={"file": INPUT_CHECKPOINT, "sha256": sha256_file(run_dir / INPUT_CHECKPOINT), "source": str(source),
                          "state_sha256": state_hash},
        **described,
    )
    save_code(record.code, workspace.root, run_dir)
    code.save(run_dir, record.code, cfg.model.target)
    workspace.mark_created(run_dir, record)
    if current_code:
        log.warning("%s: run %s is built with the current code in a new run %s (kind %s), and %s is left as it was",
                    kind, parent, run_id, kind, parent)
    elif why == "not_selected":
        log.warning("%s: %s is not the checkpoint validation selected, and test is the final report of that one only; it is "
                    "evaluated on test in a new run %s (kind %s, not the selected model), and %s is left as it was", kind, source, run_id, kind, parent)
    else:
        log.warning("%s: %s is not a state of run %s's trajectory; it is evaluated in a new run %s (kind %s, not from the audited "
                    "training), and %s is left as it was", kind, source, parent, run_id, kind, parent)
    started = time.perf_counter()
    error: Optional[BaseException] = None
    result: dict[str, Any] = {}
    try:
        result = stage(run_dir, record)
        code.save(run_dir, record.code, cfg.model.target)  # modules the stage imported
        workspace.mark_created(run_dir, record)  # and the mark holds them too
        record.completed()
    except VeritrainError as err:
        error = err
        _record_failure(record, err)
    finally:
        record.time(kind, time.perf_counter() - started)
        record.end()
        seal = record.write()
        workspace.unlock_run(run_id)
        update_experiments(workspace)
    if error is not None:
        raise error
    return Amended(run_dir, seal, result, outside=True, parent=parent, why=why)
