"""`veritrain.start`: a run of the user's own training script, recorded and sealed like a run of veritrain's loop.

    with vt.start(config=cfg, name="my-exp", inputs=["data/train.csv"], workdir=".", resume=None) as run:
        model, opt = build(run.config)
        run.resume(model=model, optimizer=opt, scheduler=sched)
        for step, rows in run.batches(n=len(ds), batch_size=64, epochs=run.config["epochs"]):
            loss = train_step(model, opt, ds[rows])
            run.log(step, loss=loss)
            run.checkpoint(step, every=100)
        run.finish(metrics={"test_accuracy": evaluate(model)})

A step is the 0-based index of a batch over the whole run; `run.checkpoint(step)` saves the state after training
on batch `step`, as entry `step + 1` (batches trained) of the trajectory. Leaving the block normally seals the run
(`finish` with no metrics, if the script did not call it); an exception ends it failed, its traceback in
`train.log`; Ctrl-C or SIGTERM ends it interrupted (exit 130 or 143). Under a replay (`VERITRAIN_REPLAY`, set by
`veritrain reproduce`, `audit` and `train --resume`) the same calls reproduce, check or continue the recorded run.

Under torchrun (`torchrun --nproc-per-node N script.py`) every rank calls the same functions: rank 0 keeps the run
(its folder, record and files), `run.batches` gives each rank its share of every batch, `run.guard` judges the
loss summed over the ranks (so every rank skips, rolls back or stops alike), and `run.checkpoint` saves every
rank's RNG states in rank 0's checkpoint, from which every rank resumes (`vt.start(resume=...)` under the same
torchrun command). The script wraps its model in DistributedDataParallel as usual.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Optional, Protocol, Union

import numpy as np
import torch

from veritrain.core import logs
from veritrain.core.errors import Interrupted, RunFailed, VeritrainError
from veritrain.core.files import remove_unfinished, write_atomic
from veritrain.core.hashing import sha256_json
from veritrain.core.secrets import REDACTED, allowed_environment, config_secret, is_credential_key, secret_in_command_line, text_secret
from veritrain.core.seeding import seed_everything
from veritrain.data.for_scripts import Data
from veritrain.data.loader import Feeder
from veritrain.records import experiments, registry
from veritrain.records.experiments import config_diff
from veritrain.records.record import capture_code, capture_env, frozen, read_record, save_code, thawed
from veritrain.records.recorder import Recorder
from veritrain.records.workspace import Workspace
from veritrain.train import checkpoint as checkpoint_files, ranks as rank_group, trajectory
from veritrain.train.engine import Best as Best, Engine, Guard, HandBack, UsageError as UsageError
from veritrain.train.order import Order, StepRows
from veritrain.userloop import frameworks, inputs as inputs_module, script as script_module
from veritrain.userloop.canonical import canonical_config
from veritrain.userloop.levels import Facts, level_of
from veritrain.userloop.replay_spec import ReplaySpec, ReplayStop

log = logging.getLogger("veritrain")

KIND = "script"
METRICS = "metrics.jsonl"
Every = Union[int, str, None]  # run.checkpoint(every=): a number of steps, "epoch", or None (every call)

_active: dict[str, Run] = {}  # the run this process has started and not yet ended (one at a time)
_lock = threading.Lock()


class Stateful(Protocol):
    """What run.resume registers besides the model: anything with state_dict() and load_state_dict() (an optimizer, an
    LR scheduler, a GradScaler, an EMA of the user's)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


def start(config: object, name: Optional[str] = None, inputs: Optional[list[Union[str, Path, Data]]] = None, workdir: Union[str, Path] = ".",
          resume: Optional[str] = None, deterministic: bool = True, tensorboard: bool = False, keep_last: int = 2,
          audit_every: int = 0, on_nonfinite: Optional[str] = None, max_rollbacks: int = 3, rollback_lr_factor: float = 0.5) -> Run:
    """Start (or, with `resume`, continue) a recorded run of this script. `resume`: None (a new run), "auto" (the newest
    interrupted or killed run of this script and config, else a new one) or a run id. `keep_last`: the newest step
    checkpoints kept; `audit_every` K: every K-th trajectory entry also keeps its checkpoint, for `veritrain audit`.
    `inputs`: paths (files and folders, hashed into a manifest), and at most one data version from `veritrain.data`.
    `on_nonfinite`: what `run.guard(loss)` does with a NaN or infinite value, as the built-in loop's `train.on_nonfinite`
    ("stop", "skip_batch", or "rollback" to the last checkpoint with the learning rates × `rollback_lr_factor`, at most
    `max_rollbacks` times); None: stop, and the checkpoints hold no guard state."""
    install_excepthook()
    guard = Guard(on_nonfinite, max_rollbacks, rollback_lr_factor) if on_nonfinite is not None else None
    return _begin(Run(config, name, inputs, Path(workdir), resume, deterministic, tensorboard, keep_last, audit_every, guard=guard))


def start_for(integration: str, config: object, name: Optional[str], inputs: Optional[list[Union[str, Path, Data]]], workdir: Union[str, Path],
              resume: Optional[str], deterministic: bool) -> Run:
    """The run of a training framework's callback (veritrain.lightning, veritrain.hf): the framework owns the loop, the
    checkpoints (entered by `Run.enter_checkpoint`) and the seeding, so nothing is seeded here."""
    install_excepthook()
    return _begin(Run(config, name, inputs, Path(workdir), resume, deterministic, False, 2, 0, integration=integration))


def active() -> Optional[Run]:
    """The run this process has started and not yet ended, if any."""
    return _active.get("run")


def release() -> None:
    """Forget the active run without ending it: an audit replay, which writes nothing, stops where the parent asked."""
    _active.clear()


def _begin(run: Run) -> Run:
    with _lock:
        if _active:
            other = next(iter(_active.values()))
            raise UsageError(f"vt.start: run {other.id or '(a replay)'} is still active in this process; "
                             "end it (leave its `with` block or call run.finish()) before starting another")
        _active["run"] = run
    try:
        run._begin()
    except BaseException:
        _active.clear()
        raise
    return run


class Run:
    """One run of a script (see the module's docstring). `id` and `dir` name it (None in an audit replay, which
    writes nothing); `level` is the guarantee it can prove, final once it is sealed; `config` the canonical config."""

    def __init__(self, config: object, name: Optional[str], inputs: Optional[list[Union[str, Path, Data]]], workdir: Path, resume: Optional[str],
                 deterministic: bool, tensorboard: bool, keep_last: int, audit_every: int, integration: Optional[str] = None,
                 guard: Optional[Guard] = None) -> None:
        self._config = canonical_config(config)
        # a replay, or a resume, runs a config recorded already: rules added since it was recorded never refuse it
        found = config_secret(self._config) if ReplaySpec.from_environment() is None and resume is None else None
        if found is not None:
            keys, kind = found
            raise UsageError(f"config: {'.'.join(keys)}: holds a secret ({kind}); a run records its config as given, "
                             "so pass the secret through the environment instead")
        if name is not None and not isinstance(name, str):
            raise UsageError(f"vt.start: name={name!r}; give a string")
        if resume is not None and not isinstance(resume, str):
            raise UsageError(f"vt.start: resume={resume!r}; give None, \"auto\" or a run id")
        for label, value, least in (("keep_last", keep_last, 1), ("audit_every", audit_every, 0)):
            if type(value) is not int or value < least:
                raise UsageError(f"vt.start: {label}={value!r}; give a whole number ≥ {least}")
        if tensorboard:  # before anything is written

            if importlib.util.find_spec("tensorboard") is None:
                raise UsageError("vt.start: tensorboard=True, but the tensorboard package is not installed; "
                                 "`pip install tensorboard` or leave it off")
        self.config_hash = sha256_json(self._config)
        self.name, self.deterministic, self.tensorboard = name, deterministic, tensorboard
        self.keep_last, self.audit_every = keep_last, audit_every
        self.replay = ReplaySpec.from_environment()
        # under a replay, the workspace of the command that replays (a reproduction's run goes there)
        self.workspace = Workspace.open(self.replay.workspace if self.replay is not None and self.replay.workspace else workdir)
        self.cwd = Path.cwd()
        self._requested_resume = resume
        given = [inputs] if isinstance(inputs, Data) else list(inputs or [])
        versions = [item for item in given if isinstance(item, Data)]
        if len(versions) > 1:
            raise UsageError("vt.start: inputs holds several veritrain data versions; a run binds one (list the others' files as paths)")
        self._data: Optional[Data] = versions[0] if versions else None
        self._input_paths = [item for item in given if not isinstance(item, Data)]
        seed = self._config.get("seed", 0)
        if type(seed) is not int:
            raise UsageError(f"config: seed: {seed!r}; give a whole number (vt.start seeds Python, NumPy and torch from it)")
        self.seed = seed
        self.id: Optional[str] = None
        self.dir: Optional[Path] = None
        self._record: Optional[Recorder] = None
        self.integration = integration  # "lightning", "hf": a framework's callback made this run (start_for)
        self.state_recipe = 1  # how a framework's checkpoint folders are hashed: set when the run begins or is resumed
        self._facts = Facts(deterministic=deterministic, integration=integration)
        self.guard_policy = guard
        # the state, order, trajectory and checkpoints; its binding (what the chain binds besides the config: the
        # inputs manifest or the data version) and folder are set when the run begins
        # torchrun's ranks, joined when the run begins; a framework's callback (its own launcher) and a plain process are one
        under_torchrun = integration is None and rank_group.TORCHRUN_MARKER in os.environ
        self.ranks = (rank_group.from_environment() if under_torchrun else None) or rank_group.ONE_PROCESS
        self.engine = Engine(seed, self.config_hash, "None", None, keep_last, audit_every, guard=guard)
        self._resumed_from: Optional[dict[str, Any]] = None  # the checkpoint run.resume restores (a resumed run)
        self._started = time.perf_counter()
        self._log_file: Optional[logging.Handler] = None
        self._board: Any = None
        self._finished = False
        self._previous_signal: Any = None
        self._redacted_keys: set[str] = set()  # run.log keys whose secret was written as *** (each warned about once)

    # ------------------------------------------------------------ reading

    @property
    def config(self) -> dict[str, Any]:
        """The canonical config, read-only."""
        return frozen(self._config)

    @property
    def level(self) -> str:
        return level_of(self._facts)[0]

    @property
    def level_reasons(self) -> list[str]:
        return level_of(self._facts)[1]

    # ------------------------------------------------------------ start

    def _begin(self) -> None:
        logs.setup_console_logging()
        argv = list(sys.argv)
        found = secret_in_command_line(argv) if self.replay is None and self._requested_resume is None else None
        if found is not None:
            raise UsageError(f"{found}: a run records its command line as given; leave the secret out")
        script, not_recorded = script_module.main_script()
        if script is not None and (why := script_module.ran_code_mismatch(script)):
            self._facts.other.append(why)  # the file __main__ names is not the code that runs: replaying it would prove nothing
        self._script = script
        self._facts.code_not_recorded = not_recorded
        manifest = inputs_module.hash_inputs(self._input_paths, self.cwd) if self._input_paths else None
        self._manifest = manifest
        if manifest is not None:
            self._facts.inputs_bound = True
            self.engine.binding = inputs_module.manifest_sha256(manifest)
        if self._data is not None:  # the chain binds the data version, as a run of veritrain's loop does
            self._facts.inputs_bound = True
            self.engine.binding = self._data.version
        if self.ranks.world_size > 1:
            self._begin_ranks(argv)
        elif self.replay is not None and self.replay.mode == "audit":
            self._begin_audit()
        elif self.replay is not None and self.replay.mode == "resume":
            self._continue(self.replay.run)
        elif self.replay is None and self._requested_resume is not None:
            target = self._resume_target()
            if target is not None:
                self._continue(target)
            else:
                self._new(argv)
        else:
            if self.replay is None:
                self._say_if_interrupted_exists()
            self._new(argv)
        if self.integration is None:  # a framework seeds as its user told it to; ranks after the first draw their own dropout
            seed_everything(rank_group.rank_seed(self.seed, self.ranks.rank), self.deterministic)  # the compiler's flag too when loaded

    def _begin_ranks(self, argv: list[str]) -> None:
        """Under torchrun: join the ranks; rank 0 starts or continues the run as one process would and tells the others
        which it is, and every rank then restores the same checkpoint (a collective)."""
        self.ranks = _join(self.ranks)
        self._facts.other.append(f"it was trained by {self.ranks.world_size} processes (torchrun), and a replay runs one; check it by running "
                                 "the same torchrun command again and comparing the runs (`veritrain runs compare`)")
        if self.replay is not None:
            raise UsageError("vt.start: a replay runs in one process, and torchrun started several; run the replay without torchrun")
        claim: dict[str, Any] = {}
        if self.ranks.is_main:
            try:
                target = self._resume_target() if self._requested_resume is not None else None
                if target is not None:
                    self._claim(target)
                else:
                    self._say_if_interrupted_exists()
                    self._new(argv)
                assert self._record is not None and self.dir is not None
                self._record.set(distributed={"world_size": self.ranks.world_size, "nodes": self.ranks.nodes, "backend": self.ranks.backend,
                                              "devices": [], "launch": ["torchrun", f"--nnodes={self.ranks.nodes}",
                                                                        f"--nproc-per-node={self.ranks.local_world_size}", *argv]})
                self._record.write()
                claim = {"id": self.id, "dir": str(self.dir), "continues": target is not None, "keep_last": self.keep_last,
                         "audit_every": self.audit_every, "guard": self.guard_policy.as_dict() if self.guard_policy else None}
            except BaseException as err:
                self.ranks.broadcast({"error": f"{type(err).__name__}: {err}"})
                raise
        claim = self.ranks.broadcast(claim)
        if "error" in claim:
            raise RunFailed(f"vt.start: rank 0 could not start the run ({claim['error']})")
        if not self.ranks.is_main:
            self.id, self.dir = claim["id"], Path(claim["dir"])
            self.keep_last, self.audit_every = claim["keep_last"], claim["audit_every"]
            self.guard_policy = Guard(**claim["guard"]) if claim["guard"] else None
        self.engine = Engine(self.seed, self.config_hash, self.engine.binding, Path(claim["dir"]) / "checkpoints", self.keep_last,
                             self.audit_every, guard=self.guard_policy, ranks=self.ranks)
        if claim["continues"]:
            self._find_resume_point()

    def _new(self, argv: list[str]) -> None:
        workspace = self.workspace
        run_id, run_dir = workspace.new_run_dir()
        self.id, self.dir = run_id, run_dir
        workspace.lock_run(run_id)
        self.engine.folder = run_dir / "checkpoints"
        # a reproduction runs a copy of the script: it records where the original was
        origin = Path(str((read_record(self.replay.run).get("script") or {}).get("path"))) if self.replay is not None else self._script
        where = origin.parent if origin is not None and origin.parent.is_dir() else self.cwd
        code = capture_code(where)
        section: dict[str, Any] = {"checkpoints": {"keep_last": self.keep_last, "audit_every": self.audit_every},
                                   "deterministic": self.deterministic}
        if self.guard_policy is not None:
            section["guard"] = self.guard_policy.as_dict()
        if self.integration is not None:  # its checkpoints are the framework's files, kept by the framework's rule
            section.update(integration=self.integration, checkpoints={"keep_last": 0, "audit_every": 0})
        if self.integration == "hf":  # how its checkpoint folders are hashed (veritrain.userloop.frameworks)
            section["state_recipe"] = self.state_recipe = frameworks.HF_STATE_RECIPE
        if self._script is not None:
            section.update(script_module.record_script(run_dir, self._script, argv, self.cwd, recorded_path=origin))
            self._facts.reads_file_variable = section["reads_file"]
            save_code(code, where, run_dir)
            script_module.save_modules(run_dir, code)
        inputs_section = self._write_inputs(run_dir)
        self._record = Recorder.start(
            run_dir, run_id=run_id, kind=KIND, stages=["train"], argv=argv, exp_name=self.name, seed=self.seed,
            config=self._config, config_recorded="as_given", config_hash=self.config_hash, code=code,
            reproduced_from=self.replay.original if self.replay is not None else None,
            script=section, inputs=inputs_section, guarantee=self._guarantee(),
            **({"data": {**self._data.summary, "config": self._data.config},
                "config_source": {"data_paths_resolved": self._data.recorded_paths}} if self._data is not None else {}))
        workspace.mark_created(run_dir, self._record)  # this user started it here, with the script and modules just recorded
        self._open_files(run_dir)
        log.info("run %s: started (%s)", run_id, f"script {self._script.name}" if self._script else "no script file")
        self._write_env()
        self._record.write()

    def _write_inputs(self, run_dir: Path) -> Optional[dict[str, Any]]:
        if self._manifest is None:
            return None
        data = json.dumps(self._manifest, indent=2, sort_keys=True).encode() + b"\n"
        (run_dir / inputs_module.FILE).write_bytes(data)
        return {"file": inputs_module.FILE, "manifest_sha256": self.engine.binding, "paths": list(self._manifest["paths"]),
                "files": len(self._manifest["files"]), "bytes": self._manifest["bytes"]}

    def _write_env(self) -> None:
        assert self._record is not None and self.dir is not None
        env, packages = capture_env()
        env["variables"] = allowed_environment()
        self._record.set(env=env)
        (self.dir / "env").mkdir(exist_ok=True)
        (self.dir / "env" / "requirements.lock").write_text(packages, encoding="utf-8")

    def _open_files(self, run_dir: Path) -> None:
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        self._log_file = logs.attach_file(run_dir / "train.log")
        if self.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._board = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if threading.current_thread() is threading.main_thread():
            self._previous_signal = signal.signal(signal.SIGTERM, _raise_interrupted)

    def _guarantee(self) -> dict[str, Any]:
        level, reasons = level_of(self._facts)
        return {"level": level, "reasons": reasons}

    # ------------------------------------------------------------ continuing a run

    def _resume_target(self) -> Optional[Path]:
        """The run `resume=` names: a run id (or prefix, or folder), or with "auto" the newest interrupted or killed run
        of this script and config (None: there is none, and a new run starts)."""
        ref = self._requested_resume
        assert ref is not None
        if ref != "auto":
            return self.workspace.resolve_run(ref)
        found = self._interrupted_runs()
        if not found:
            log.info("resume=\"auto\": no interrupted run of this script and config; starting a new run")
            return None
        return found[0]

    def _interrupted_runs(self) -> list[Path]:
        """Runs of this script and config that ended interrupted or whose process died (free lock), newest first."""
        runs_dir = self.workspace.runs_dir
        if not runs_dir.is_dir() or self._script is None:
            return []
        found = []
        for run_dir in self._candidates():
            if not (run_dir / "record.json").is_file():
                continue
            try:
                record = read_record(run_dir)
            except RunFailed:
                continue
            section = record.get("script") or {}
            if record.get("kind") != KIND or record.get("config_hash") != self.config_hash or section.get("path") != str(self._script):
                continue
            if record.status == "interrupted" or (record.status == "running" and self.workspace.lock_is_stale(run_dir.name)):
                found.append(run_dir)
        return found

    def _candidates(self) -> list[Path]:
        """Run folders that may be an unfinished run of this config, newest first: from the workspace's index, which
        reads only the runs changed since it last looked (every folder when it cannot be used)."""
        runs_dir = self.workspace.runs_dir
        if os.environ.get("VERITRAIN_DEFER_INDEX") != "1":  # a sweep's trial: only its driver writes the index

            try:
                db = registry.sync(self.workspace.state_dir, runs_dir)
                rows = db.execute("SELECT run_id FROM runs WHERE kind = ? AND config_hash = ? AND status IN ('interrupted', 'running') "
                                  "ORDER BY run_id DESC", (KIND, self.config_hash)).fetchall()
                db.close()
                return [runs_dir / str(row[0]) for row in rows]
            except Exception as err:  # the index is a cache: the folders are the truth
                log.debug("resume: the run index could not be read (%s); reading the run folders", err)
        return sorted(runs_dir.iterdir(), reverse=True)

    def _say_if_interrupted_exists(self) -> None:
        found = self._interrupted_runs()
        if found:
            log.info("run %s of this script and config was interrupted; resume=\"auto\" (or resume=%r) continues it",
                     found[0].name, found[0].name)

    def _continue(self, run_dir: Path) -> None:
        """Continue the run in `run_dir`: the same config and code, from its newest valid checkpoint (run.resume)."""
        self._claim(run_dir)
        self.engine = Engine(self.seed, self.config_hash, self.engine.binding, run_dir / "checkpoints", self.keep_last, self.audit_every,
                             guard=self.guard_policy)
        if self.integration is not None:  # the framework restores its own checkpoint (continue_trajectory)
            assert self._record is not None
            self._record.add_events([{"kind": "resume", "step": None, "detail": f"from a checkpoint of {self.integration}"}])
            self._write_env()
            self._record.write()
            return
        self._find_resume_point()

    def _claim(self, run_dir: Path) -> None:
        """Take the run in `run_dir` over for continuing it, refusing another config, code or inputs, a completed run,
        or one another process writes; its keep rule and guard are the ones it began with."""
        record = read_record(run_dir)
        if record.get("kind") != KIND:
            raise UsageError(f"vt.start: resume={run_dir.name!r}: run {run_dir.name} is a {record.get('kind')} run, not a script's; "
                             f"continue it with `veritrain train --resume {run_dir.name}`")
        if record.get("config_hash") != self.config_hash:
            raise UsageError(f"vt.start: resume={run_dir.name!r}: the config differs from the run's ({_config_difference(record['config'], self._config)}); "
                             "resume with the run's own config, or start a new run")
        if self.replay is None and self._script is not None:
            changed = script_module.code_difference(thawed(record), run_dir, self._script)
            if changed:
                raise UsageError(f"vt.start: resume={run_dir.name!r}: the code differs from the run's ({changed}); resume with the "
                                 f"recorded code (`veritrain train --resume {run_dir.name}`), or start a new run")
        if self._inputs_differ(record):
            raise UsageError(f"vt.start: resume={run_dir.name!r}: the inputs differ from those the run bound ({self._inputs_differ(record)}); "
                             f"`veritrain verify {run_dir.name}` names the files")
        if record.status == "completed":
            raise UsageError(f"vt.start: resume={run_dir.name!r}: run {run_dir.name} is completed; start a new run (resume=None)")
        if not self.workspace.lock_is_stale(run_dir.name):
            raise UsageError(f"vt.start: resume={run_dir.name!r}: another process is writing run {run_dir.name}; wait for it to end")
        self.workspace.lock_run(run_dir.name)
        self.id, self.dir = run_dir.name, run_dir

        remove_unfinished(run_dir)
        self._record = Recorder.resume(record, list(sys.argv))
        self._facts.reads_file_variable = bool((record.get("script") or {}).get("reads_file"))
        section = record.get("script") or {}
        self.state_recipe = int(section.get("state_recipe") or 1)  # a run goes on hashing as it began
        self.keep_last = int((section.get("checkpoints") or {}).get("keep_last", self.keep_last))
        self.audit_every = int((section.get("checkpoints") or {}).get("audit_every", self.audit_every))
        if section.get("guard"):  # the guard the run began with
            self.guard_policy = Guard(**section["guard"])
        self._open_files(run_dir)

    def _find_resume_point(self) -> None:
        """The newest valid checkpoint run.resume restores (every rank the one rank 0 chose), said in the record."""
        run_dir = self.dir
        assert run_dir is not None
        found = self.engine.newest()
        path, saved = found if found is not None else (None, None)
        if saved is not None and path is not None:
            self._resumed_from = {"path": path, "state": saved}
            log.info("run %s: resuming from checkpoints/%s (step %d)", run_dir.name, path.name, int(saved["loop"]["step"]))
        else:
            log.info("run %s: no checkpoint was saved yet; training from the beginning", run_dir.name)
        if self._record is None:  # another rank: rank 0 keeps the record
            return
        self._record.add_events([{"kind": "resume", "step": int(saved["loop"]["step"]) if saved else 0,
                                  "detail": f"from checkpoints/{path.name}" if saved and path else "no checkpoint yet: from the beginning"}])
        self._write_env()
        self._record.write()

    def _inputs_differ(self, record: Mapping[str, Any]) -> Optional[str]:
        """How this start's inputs differ from those the run in `record` bound, or None."""
        manifest = (record.get("inputs") or {}).get("manifest_sha256")
        now = inputs_module.manifest_sha256(self._manifest) if self._manifest is not None else None
        if manifest != now:
            return "the files hash differently" if manifest and now else "files bound by one and not the other"
        version = (record.get("data") or {}).get("version")
        mine = self._data.version if self._data is not None else None
        if version != mine:
            return f"data version {str(version)[:12]} recorded, {str(mine)[:12]} now" if version and mine else "a data version bound by one and not the other"
        return None

    def _begin_audit(self) -> None:
        """An audit replay: nothing is written but the states handed back (the parent judges them); a config that
        hashes otherwise than the run's stops it at once, saying so."""
        replay = self.replay
        assert replay is not None and replay.out is not None
        if replay.config_hash is not None and replay.config_hash != self.config_hash:
            raise RunFailed(f"audit: the replayed script's config hashes to {self.config_hash[:12]}, the run's to {replay.config_hash[:12]}")
        self.engine.hand_back = HandBack(Path(replay.out), lambda index, step: index > replay.end or (index >= replay.end and not replay.to_finish),
                                         lambda entries, state: ReplayStop())

    # ------------------------------------------------------------ the calls in the loop

    def resume(self, model: torch.nn.Module, optimizer: Optional[Stateful] = None, scheduler: Optional[Stateful] = None,
               scaler: Optional[Stateful] = None, extra: Optional[dict[str, Stateful]] = None) -> bool:
        """Register every piece of training state `run.checkpoint` saves, and restore it when the run continues (a
        resume, or a replay from a checkpoint). Returns whether state was restored. On a new run the initial state
        is hashed as trajectory entry 0."""
        if self.engine.state is not None:
            raise UsageError("run.resume: called twice; register all state (model, optimizer, scheduler, scaler, extra) in one call")
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"run.resume: model is a {type(model).__name__}; give the torch.nn.Module being trained")
        self.engine.register(model, optimizer, scheduler, scaler, extra)
        self._facts.state_registered = True
        self.engine.record_format = self._record.get("record_format") if self._record is not None else None
        if self.dir is not None and self.ranks.is_main:  # a restored state's later rows are logged again
            metrics = self.dir / METRICS
            self.engine.on_restore.append(lambda saved: _truncate_metrics(metrics, int(saved["loop"]["step"])))
        return self.engine.start(self._start_state())

    def _start_state(self) -> Optional[dict[str, Any]]:
        """The state to restore: the resumed run's checkpoint, or an audit replay's start (None: from the beginning)."""
        if self._resumed_from is not None:
            return self._resumed_from["state"]
        if self.engine.hand_back is not None and self.replay is not None and self.replay.start_file is not None:
            path = Path(self.replay.start_file)  # the parent's copy, which it found to hold the start's state
            return checkpoint_files.decode(path, path.read_bytes())
        return None

    def batches(self, n: int, batch_size: int, epochs: int, drop_last: bool = False, build: Optional[Callable[[int, np.ndarray], Any]] = None,
                num_workers: int = 0) -> Iterator[tuple[int, Any]]:
        """(step, row indices) for every batch of the run from the resumed position: the order is a pure function of
        (seed, epoch, batch) (veritrain.train.order), so a run resumed mid-epoch draws what it would have drawn. After
        a rollback (`run.guard`) the next batch is the first after the restored checkpoint. Under torchrun each rank
        gets its share of every batch (contiguous, near-equal parts of `batch_size` rows).

        With `build`, (step, build(step, rows)) instead: the batch itself, built by `num_workers` worker processes
        ahead of the step (0: here, when the step comes). Draw its randomness from `run.generator(step)`, a function of
        the step alone, and the results are the same for any number of workers."""
        if type(num_workers) is not int or num_workers < 0 or (num_workers and build is None):
            raise UsageError(f"run.batches: num_workers={num_workers!r}; give a whole number ≥ 0, and a `build` for the workers to call")
        rows = self._rows(n, batch_size, epochs, drop_last)
        if build is None:
            return rows
        return self._built(rows, build, num_workers)

    def _built(self, rows: Iterator[tuple[int, np.ndarray]], build: Callable[[int, np.ndarray], Any], workers: int) -> Iterator[tuple[int, Any]]:
        order = self.engine.order
        assert order is not None  # set by engine.batches
        step_rows = StepRows(order)
        share = self.ranks.shard

        def built(step: int) -> Iterator[Any]:
            yield build(step, share(step_rows(step)))

        with Feeder(built, order.total, workers) as feed:
            for step, _ in rows:
                yield step, next(iter(feed.get(step)))

    def _rows(self, n: int, batch_size: int, epochs: int, drop_last: bool) -> Iterator[tuple[int, np.ndarray]]:
        order = Order(n, batch_size, epochs, bool(drop_last), self.seed)
        saved = self.engine.saved_order
        if saved is not None and order.difference(saved):
            raise UsageError(f"run.batches: the run was saved with other batches ({order.difference(saved)}); "
                             "give the same n, batch_size, epochs and drop_last")
        if self._resumed_from is not None and self.engine.state is None:
            raise UsageError("run.batches: the run continues from a checkpoint; call run.resume(model=..., ...) before run.batches")
        self._facts.batches_used = True
        if self.ranks.world_size == 1:
            return self.engine.batches(order)
        world = self.ranks.world_size
        if batch_size < 2 * world or (not drop_last and 0 < n % batch_size < 2 * world and n > batch_size):
            raise UsageError(f"run.batches: batch_size={batch_size} with n={n} leaves a rank of {world} fewer than two samples of a batch; "
                             f"give batch_size ≥ {2 * world}" + ("" if batch_size < 2 * world else " and drop_last=True"))
        return ((step, self.ranks.shard(rows)) for step, rows in self.engine.batches(order))

    def generator(self, step: int, stream: int = 1) -> torch.Generator:
        """A torch.Generator for batch `step` (augmentation, sampling), seeded from (seed, step, stream) alone: a resumed
        run or a replay draws what the uninterrupted run drew. Stream 0 is the data order's."""
        return self.engine.generator(_whole(step, "run.generator: step"), stream)

    def guard(self, value: Any, what: str = "loss") -> bool:
        """True when `value` (the loss, a gradient norm: a number or one-element tensor) is finite; otherwise what
        `vt.start(on_nonfinite=...)` says: "skip_batch" returns False (leave the batch out), "stop" (the default) fails
        the run, "rollback" restores the last checkpoint with lower learning rates and returns False, and run.batches
        goes on from there. Call it before backward():

            if not run.guard(loss):
                continue

        Under torchrun every rank calls it each step (it sums the value over the ranks).
        """
        if self.engine.state is None and (self.guard_policy is not None and self.guard_policy.on_nonfinite == "rollback"):
            raise UsageError("run.guard: a rollback needs the training state; call run.resume(model=..., optimizer=...) first")
        if self.ranks.world_size > 1:  # summed over the ranks: non-finite on one rank is non-finite on all, and they act alike
            value = self.ranks.reduce([float(value.item() if isinstance(value, torch.Tensor) else value)])[0]
        return self.engine.guard(value, what)

    def log(self, step: int, **metrics: Any) -> None:
        """Append {"step", **metrics} to metrics.jsonl (and TensorBoard when asked). Values: numbers, bools, strings,
        or one-element tensors and NumPy scalars (read with .item()); a non-finite number is written as null and named
        in the row's "non_finite"."""
        if self.dir is None or not self.ranks.is_main:
            return  # an audit replay writes nothing, and rank 0 alone writes a run of several ranks
        row: dict[str, Any] = {"step": _whole(step, "run.log: step")}
        bad, hidden = [], []
        for key, value in metrics.items():
            value = _plain(value, f"run.log: {key}")
            if isinstance(value, float) and not np.isfinite(value):
                bad.append(key)
                value = None
            if isinstance(value, str) and (text_secret(value) or (is_credential_key(key) and value.strip())):
                hidden.append(key)  # metrics.jsonl is sealed, archived and published: the secret never reaches it
                value = REDACTED
            row[key] = value
        if bad:
            row["non_finite"] = bad
        if hidden:
            row["redacted"] = hidden
            for key in sorted(set(hidden) - self._redacted_keys):
                log.warning("run.log: %s holds a secret; it is written as %s in metrics.jsonl (log no credentials)", key, REDACTED)
            self._redacted_keys |= set(hidden)
        with open(self.dir / METRICS, "a", encoding="utf-8") as out:
            out.write(json.dumps(row, sort_keys=True, allow_nan=False) + "\n")
        if self._board is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._board.add_scalar(key, value, row["step"])

    def checkpoint(self, step: int, every: Every = None) -> bool:
        """Save the training state after batch `step` when it is due (`every` steps, every "epoch" of run.batches, or
        always): atomic, hashed, entered in the trajectory. Returns whether it saved."""
        step = _whole(step, "run.checkpoint: step")
        engine = self.engine
        if engine.state is None:
            raise UsageError("run.checkpoint: no training state is registered; call run.resume(model=..., optimizer=...) first")
        if engine.current is not None and step != engine.current:
            raise UsageError(f"run.checkpoint: step {step}, but run.batches last gave step {engine.current}; pass the step it gave")
        if engine.rewound:
            raise UsageError(f"run.checkpoint: step {step} was rolled back by run.guard; skip the rest of that step (continue)")
        position = step + 1
        if not self._due(position, every):
            return False
        saved_here = bool(engine.entries) and engine.entries[-1]["step"] == position  # rank 0 keeps the trajectory
        if self.ranks.broadcast(saved_here) if self.ranks.world_size > 1 else saved_here:
            return False  # saved at this step already
        engine.position = position
        self._facts.checkpoints += 1
        engine.save("step")
        return True

    def _due(self, position: int, every: Every) -> bool:
        if every is None:
            return True
        if every == "epoch":
            if self.engine.order is None:
                raise UsageError("run.checkpoint: every=\"epoch\" needs run.batches (it knows where an epoch ends); give every=<steps>")
            return position % self.engine.order.per_epoch == 0
        if type(every) is not int or every < 1:
            raise UsageError(f"run.checkpoint: every={every!r}; give a number of steps, \"epoch\" or None")
        return position % every == 0

    def enter_checkpoint(self, file: Optional[Path], state_sha256: str, model_sha256: str, step: int, epoch: int,
                         write: Optional[Callable[[Path], Any]] = None, suffix: str = ".ckpt") -> dict[str, Any]:
        """Enter a checkpoint a framework wrote (`file`, already complete) in the trajectory: its training state's hash
        (veritrain.train.trajectory.state_sha256 of what the framework saved), its weights' hash, and where the loop
        was. The file is named in the entry when it lies in the run folder, whose seal then covers its bytes. In an
        audit replay `write(path)` writes that state for the parent to hash (`suffix`: the file's kind)."""
        entry = self.engine.enter(file, self.dir, state_sha256, model_sha256, step, epoch)
        self._facts.checkpoints += 1
        if self.engine.hand_back is not None and write is not None:  # an audit replay: the state goes to the parent, which judges it
            self.engine.hand_back_entry(write, suffix)
        return entry

    def continue_trajectory(self, entries: list[dict[str, Any]], step: int) -> None:
        """A framework resumed from one of this run's checkpoints: the trajectory up to it, and the step it holds (the
        metrics logged after it are logged again)."""
        self.engine.entries = [dict(entry) for entry in entries]
        self.engine.position = step
        if self.dir is not None:
            _truncate_metrics(self.dir / METRICS, step + 1)

    @property
    def facts(self) -> Facts:
        """What the guarantee level is judged from (veritrain.userloop.levels); a framework's callback sets what it saw."""
        return self._facts

    @property
    def finished(self) -> bool:
        return self._finished

    def record_progress(self) -> None:
        """Write what a continuation after a kill needs to know (the API used, the guarantee so far) into the record,
        which is sealed at the end."""
        if self._record is not None:
            self._record.update_section("script", api=self._api())
            self._record.set(guarantee=self._guarantee())
            self._record.write()

    def abandon(self, error: BaseException) -> None:
        """End the run `failed`, or `interrupted` for Ctrl-C and SIGTERM, by `error`: a framework's exception hook,
        where no `with` block ends it."""
        if not self._finished:
            stopped = isinstance(error, (KeyboardInterrupt, Interrupted)) or rank_group.lost_peer(error) is not None
            self._end("interrupted" if stopped else "failed", error=error)

    def _api(self) -> dict[str, Any]:
        return {"batches": self._facts.batches_used, "checkpoints": self._facts.checkpoints, "state_registered": self._facts.state_registered}

    @property
    def epochs_done(self) -> int:
        """Completed epochs, when a framework's loop (not run.batches) keeps count."""
        return self.engine.epochs_done

    @epochs_done.setter
    def epochs_done(self, value: int) -> None:
        self.engine.epochs_done = value

    @property
    def replaying_audit(self) -> bool:
        """Whether this is an audit replay (its states go back to the auditor, and nothing is written)."""
        return self.engine.hand_back is not None

    # ------------------------------------------------------------ the end

    def finish(self, metrics: Optional[dict[str, Any]] = None) -> None:
        """End the run: save the final state (checkpoints/last.pt, the trajectory's last entry), record `metrics` as
        coming from it, and seal. Called by leaving the `with` block when the script did not."""
        if self._finished:
            raise UsageError("run.finish: the run is already finished")
        values = {key: _plain(value, f"run.finish: metrics[{key!r}]") for key, value in (metrics or {}).items()}
        engine = self.engine
        if engine.current is not None and not engine.rewound:
            engine.position = max(engine.position, engine.current + 1)
        if engine.state is not None:
            engine.save_final()
        if engine.hand_back is not None:  # an audit replay that went on to the end: the metrics go to the parent, which compares them
            assert self.replay is not None
            if self.replay.to_finish:
                (engine.hand_back.out / "finish.json").write_text(json.dumps({"metrics": values}, allow_nan=True) + "\n", encoding="utf-8")
            raise ReplayStop()
        self._end("completed", values)

    def _end(self, status: str, metrics: Optional[dict[str, Any]] = None, error: Optional[BaseException] = None) -> None:
        """Record how the run ended and seal it."""
        self._finished = True
        _active.clear()
        record = self._record
        if record is None or self.dir is None:
            return
        signals_held = _hold_signals()  # a signal now (torchrun's SIGTERM after a lost rank, a second Ctrl-C) must not leave it unsealed
        try:
            self._facts.deterministic = self.deterministic and torch.are_deterministic_algorithms_enabled()
            self._facts.cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
            if self.engine.events:  # what the guard did (skips, rollbacks, the stop)
                record.add_events(self.engine.events)
                self.engine.events = []
            if self._script is not None:
                marked = self.workspace.created_here(self.dir, record)  # a mark grows with the code only when it held the code so far
                script_module.save_modules(self.dir, record.code)  # modules imported while it ran
                if marked:
                    self.workspace.mark_created(self.dir, record)
            entries = self.engine.entries
            if entries:
                record.set(trajectory=trajectory.for_record(entries, self.dir / "checkpoints", self.audit_every), other_saves=[],
                           training={"epochs": self.engine.epoch_of_position(), "steps": self.engine.position,
                                     "loop_seconds": round(time.perf_counter() - self._started, 3)},
                           final_state_sha256=entries[-1]["model_sha256"])
            if status == "completed":
                if metrics is not None:
                    last = len(entries) - 1
                    ref = {"index": last, "step": entries[last]["step"], "state_sha256": entries[last]["state_sha256"]} if entries else None
                    # the file holding that state: veritrain's last.pt, or the framework's own checkpoint
                    held = (entries[last].get("file") if self.integration else "checkpoints/last.pt") if entries else None
                    record.set_metrics("final", {**metrics, **({"trajectory_entry": ref} if ref else {}), **({"checkpoint": held} if held else {})})
                record.completed()
            elif status == "interrupted":
                record.interrupted(type(error).__name__, str(error) or "interrupted")
            else:
                assert error is not None
                log.error("run %s failed: %s: %s", self.id, type(error).__name__, error, extra=logs.FILE_ONLY)
                log.debug("traceback:\n%s", "".join(traceback.format_exception(error)))
                record.failed(error)
            record.update_section("script", api=self._api())
            record.set(guarantee=self._guarantee())
            record.finish(time.perf_counter() - self._started)
        finally:
            try:
                self._close_files()
                seal = record.write()
                self.workspace.unlock_run(record.run_id)
                _update_experiments(self.workspace)
            finally:
                _release_signals(signals_held)
                self._restore_signal()
        log.info("run %s: %s, level %s; seal %s", self.id, record.status, self.level, seal)

    def _close_files(self) -> None:
        if self._board is not None:
            self._board.close()
            self._board = None
        if self._log_file is not None:
            logs.detach(self._log_file)
            self._log_file = None

    def _restore_signal(self) -> None:
        """SIGTERM's handler as it was before the run installed its own."""
        if self._previous_signal is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_signal)
            self._previous_signal = None

    # ------------------------------------------------------------ the `with` block

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException], tb: Optional[TracebackType]) -> bool:
        if isinstance(error, ReplayStop):
            _active.clear()
            raise SystemExit(0)
        if self.engine.hand_back is not None:  # the script ended or failed before the stretch's end: the parent sees what came back
            _active.clear()
            return False
        if self._finished:
            return False
        if error is None:
            self.finish()
            return False
        if isinstance(error, (KeyboardInterrupt, Interrupted)) or rank_group.lost_peer(error) is not None:  # a lost rank: resumable
            self._end("interrupted", error=error)
            if isinstance(error, Interrupted):
                raise SystemExit(error.exit_code)
            return False
        self._end("failed", error=error)
        return False


# ---------------------------------------------------------------- helpers


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _hold_signals() -> Optional[dict[int, Any]]:
    """Ignore SIGINT and SIGTERM while a run is sealed; returns what to put back (`_release_signals`)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}


def _release_signals(held: Optional[dict[int, Any]]) -> None:
    """Put back the handlers `_hold_signals` replaced."""
    if held is not None:
        for signum, handler in held.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _join(ranks: rank_group.Ranks) -> rank_group.Ranks:
    """The ranks torchrun started, in the process group the script joined already (its backend), else joined now with
    gloo on the CPU and nccl on GPUs."""
    import torch.distributed as dist

    if dist.is_initialized():
        return rank_group.Ranks(ranks.rank, ranks.world_size, ranks.local_rank, ranks.local_world_size, str(dist.get_backend()))
    return rank_group.start(ranks, "auto", "cuda" if torch.cuda.is_available() else "cpu")


def _whole(value: Any, what: str) -> int:
    if isinstance(value, (np.integer, torch.Tensor)) and getattr(value, "ndim", 0) == 0:
        value = int(value)
    if type(value) is not int or value < 0:
        raise UsageError(f"{what}={value!r}; give the step run.batches gave (a whole number ≥ 0)")
    return value


def _plain(value: Any, what: str) -> Any:
    """A metric as JSON holds it: a number, bool, string or None; a one-element tensor or NumPy value by its value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (np.ndarray, np.generic)) and value.size == 1:
        item = value.item()
        if isinstance(item, (bool, int, float)):
            return item
    raise UsageError(f"{what}: a {type(value).__name__} is not a metric; give a number (float(x)), a bool or a string")


def _truncate_metrics(path: Path, position: int) -> None:
    """Keep the metrics.jsonl rows of the batches before `position` (those after it are logged again)."""
    if not path.exists():
        return

    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not (isinstance(step := json.loads(line).get("step"), int) and step >= position)]
    write_atomic(path, "".join(line + "\n" for line in kept).encode())


def _config_difference(recorded: Mapping[str, Any], now: dict[str, Any]) -> str:
    changed = config_diff(thawed(recorded), now)
    items = [f"{key}: {a!r} → {b!r}" for key, (a, b) in list(changed.items())[:3]]
    return ", ".join(items) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "") if items else "it hashes differently"


def _update_experiments(workspace: Workspace) -> None:
    if os.environ.get("VERITRAIN_DEFER_INDEX") == "1":
        return
    try:
        experiments.write(workspace.state_dir, workspace.runs_dir, workspace.root / "experiments.md")
    except Exception as err:  # the run is sealed; the log can be rebuilt any time
        log.warning("experiments.md not updated (%s: %s); `veritrain runs reindex` rebuilds it", err.__class__.__name__, err)


_hook_installed = {"done": False}


def install_excepthook() -> None:
    """A veritrain error a script leaves uncaught is one line on stderr with its exit code (2: could not start, 1:
    ran and failed), as the CLI reports it, not a traceback. Other exceptions keep Python's report."""
    if _hook_installed["done"]:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: Optional[TracebackType]) -> None:
        run = _active.get("run")
        if run is not None and not run._finished and run._record is not None:  # a run not ended by its block (a framework's)
            stopped = isinstance(error, (KeyboardInterrupt, Interrupted)) or rank_group.lost_peer(error) is not None
            run._end("interrupted" if stopped else "failed", error=error)
        if isinstance(error, VeritrainError):
            print(f"error: {error}", file=sys.stderr)
            sys.exit(error.exit_code)
        previous(kind, error, tb)

    sys.excepthook = hook
    _hook_installed["done"] = True

