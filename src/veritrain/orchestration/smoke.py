"""The smoke test: a tiny slice of a config through every stage, in seconds, before a long run.

Prepare (the real data version), then on ≤ 64 train samples (taken class by class in turn, so every class is
in the slice however the files sort; see `veritrain.tasks.stratified`): 2 optimizer steps with a checkpoint
after each, a resume from the first checkpoint that must end bit-identical to the uninterrupted
2 steps, evaluation on ≤ 64 test samples, and export with its parity check. The result is recorded
(sealed) in `.veritrain/smoke/<key>/`, where the key is the config hash, data version and code
version: `veritrain run` runs the smoke first and skips it when one already passed for that key. One process at
a time runs the smoke test of a key; concurrent runs of one config wait for it and reuse its result.
The folder keeps its own `train.log` (debug lines included, and the traceback of a failure).

    veritrain smoke configs/digits.yaml
"""

from __future__ import annotations

import logging
import shutil
import time
import traceback
from typing import TYPE_CHECKING, Any, Optional

from veritrain.core import locks, logs
from veritrain.core.config import ResolvedConfig
from veritrain.core.errors import RunFailed
from veritrain.core.signals import interruptible
from veritrain.core.task_registry import task_target
from veritrain.records.record import RECORD_VERSION, capture_code, now_iso
from veritrain.records.recorder import write_smoke_record
from veritrain.records.smoke_results import passed_before, smoke_key
from veritrain.records.usercode import current_listing, fresh
from veritrain.records.workspace import Workspace
from veritrain.tasks import get_task

if TYPE_CHECKING:

    from veritrain.data.identity import DataVersion

log = logging.getLogger("veritrain")

TRAIN_SAMPLES, EVAL_SAMPLES, STEPS = 64, 64, 2
def run(resolved: ResolvedConfig, workspace: Workspace, data: Optional[DataVersion] = None,
        code: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Run the smoke test of a config; returns its summary (raises RunFailed when a stage fails).
    `data` (the prepared data version) and `code` (`capture_code`) are reused when the caller has them. One
    process at a time runs the smoke test of a key (its lock in `.veritrain/locks/smoke-<key>.lock`)."""
    from veritrain.data import prepare

    started = time.perf_counter()
    cfg = resolved.config
    data = data if data is not None else prepare.run(cfg.data, resolved.data_paths, workspace.state_dir)
    code = code if code is not None else _code_now(resolved, workspace)
    key = smoke_key(resolved.hash, data.version, code)
    with locks.held(workspace.lock_path(f"smoke-{key}"), lambda by: log.info("smoke: waiting for %s, which runs this smoke test", by)):
        return _run(resolved, workspace, data, code, key, started)


def _run(resolved: ResolvedConfig, workspace: Workspace, data: DataVersion, code: dict[str, Any], key: str,
         started: float) -> dict[str, Any]:
    """The smoke test filed under `key`, with its lock held: its folder is this process's alone."""
    from veritrain.results import evaluate, export
    from veritrain.train import engines, parts

    cfg = resolved.config
    folder = workspace.state_dir / "smoke" / key
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log_path = folder / "train.log"
    file_log = logs.attach_file(log_path)
    log.debug("smoke %s: config %s, data version %s", key, resolved.hash, data.version)
    tiny = cfg.model_copy(deep=True, update={
        "train": cfg.train.model_copy(update={"epochs": 1, "max_steps": 0, "batch_size": min(cfg.train.batch_size, TRAIN_SAMPLES // STEPS),
                                              "accumulate_steps": 1, "early_stopping_patience": None, "compile": False}),
        "checkpoint": cfg.checkpoint.model_copy(update={"every_steps": 1, "keep_last": STEPS + 1, "every_minutes": None}),
        "logging": cfg.logging.model_copy(update={"every_steps": 1, "tensorboard": False}),
        "export": cfg.export.model_copy(update={"parity_samples": min(cfg.export.parity_samples, 16)}),
    })
    batch = tiny.train.batch_size
    sliced = get_task(tiny).smoke_slice(data, {"train": batch * STEPS, "val": EVAL_SAMPLES, "test": EVAL_SAMPLES})
    # the smoke folder's own record: the checks, how it ended; written by veritrain.records.recorder at the end
    outcome: dict[str, Any] = {
        "record_version": RECORD_VERSION, "run_id": key, "kind": "smoke", "status": "running", "started_at": now_iso(),
        "ended_at": None, "config_hash": resolved.hash, "data_version": data.version, "code": code, "checks": {}, "error": None,
    }
    checks = outcome["checks"]
    try:
        task = get_task(tiny)
        with interruptible() as stop, fresh(resolved.path):  # the user's model code, as a new run imports it
            (folder / "full").mkdir()
            engine = engines.for_new_run()  # what the run it checks trains with
            full = engines.train(engine, tiny, sliced, task, folder / "full", stop, logs.console)
            checks["train"] = {"passed": full.steps == STEPS, "steps": full.steps}
            # resume from the first checkpoint in a copy: it must end exactly where the full run ended
            shutil.copytree(folder / "full", folder / "resumed")
            for path in (folder / "resumed" / "checkpoints").iterdir():
                if not path.name.startswith("step-1.pt"):
                    path.unlink()
            resumed = engines.train(engine, tiny, sliced, task, folder / "resumed", stop, logs.console, resume=True)
            checks["checkpoint_resume"] = {"passed": resumed.final_state_sha256 == full.final_state_sha256,
                                           "final_state_sha256": full.final_state_sha256}
            device = parts.resolve_device(tiny.train.device)
            metrics = evaluate.run(tiny, sliced, task, folder / "full", device, "last")
            checks["eval"] = {"passed": True, "samples": metrics.get("samples")}
            description = export.run(tiny, sliced, task, folder / "full", "last")
            checks["export_parity"] = {"passed": description["parity"]["passed"], "formats": list(description["files"])}
        failed = [name for name, c in checks.items() if not c["passed"]]
        if failed:
            raise RunFailed(f"smoke: {', '.join(failed)} failed")
        outcome["status"] = "completed"
    except RunFailed as err:
        message = str(err) if str(err).startswith("smoke: ") else f"smoke: {err}"
        _log_failure(outcome, err, message)
        raise RunFailed(f"{message}; log in {log_path}") from None
    except Exception as err:  # a bug or an environment problem: the traceback goes to the smoke's train.log
        _log_failure(outcome, err, " ".join(str(err).split()))  # one line, however the exception wrote it
        raise RunFailed(f"smoke: {err.__class__.__name__}: {outcome['error']['message']}; traceback in {log_path}") from None
    finally:
        outcome["ended_at"] = now_iso()
        outcome["seconds"] = round(time.perf_counter() - started, 3)
        logs.detach(file_log)  # the log is complete before the record lists it with its hash
        write_smoke_record(folder, outcome)
    log.info("smoke: passed in %.1fs (%s)", outcome["seconds"], ", ".join(checks))
    return {"key": key, "folder": str(folder), "status": outcome["status"], "checks": checks, "seconds": outcome["seconds"]}


def _code_now(resolved: ResolvedConfig, workspace: Workspace) -> dict[str, Any]:
    """The code a run of this config would record: veritrain and git version, and the user's model files."""
    code = capture_code(workspace.root)
    code["user_files"] = current_listing(resolved.path, resolved.config.model.target, task_target(resolved.config.task))
    return code


def _log_failure(outcome: dict[str, Any], err: Exception, message: str) -> None:
    outcome.update(status="failed", error={"type": err.__class__.__name__, "message": message})
    log.error("smoke failed: %s", message, extra=logs.FILE_ONLY)  # the CLI shows the one-line error
    log.debug("traceback:\n%s", "".join(traceback.format_exception(err)))


def ensure(resolved: ResolvedConfig, workspace: Workspace) -> dict[str, Any]:
    """The smoke result for this config, data version and code: the one that passed before, or a new one."""
    from veritrain.data import prepare

    data = prepare.run(resolved.config.data, resolved.data_paths, workspace.state_dir)
    code = _code_now(resolved, workspace)
    key = smoke_key(resolved.hash, data.version, code)
    with locks.held(workspace.lock_path(f"smoke-{key}"), lambda by: log.info("smoke: waiting for %s, which runs this smoke test", by)):
        return _ensure(resolved, workspace, data, code, key)


def _ensure(resolved: ResolvedConfig, workspace: Workspace, data: DataVersion, code: dict[str, Any], key: str) -> dict[str, Any]:
    """`ensure` with the key's lock held: a smoke test that passed while this process waited is reused."""
    if code["git_dirty"]:  # uncommitted changes have no name a cached result could be filed under
        log.info("smoke: the checkout has uncommitted changes, so an earlier smoke result cannot vouch for this code")
    elif passed_before(workspace.state_dir, key):
        log.info("smoke: passed before for this config, data version and code (%s)", key[:12])
        return {"key": key, "status": "completed", "cached": True}
    log.info("smoke: a tiny slice through every stage first")
    result = run(resolved, workspace, data, code)
    result["cached"] = False
    return result

