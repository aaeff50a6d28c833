"""`veritrain run`: prepare → train → evaluate, recorded in `runs/<run_id>/`.

Each stage is a plain function in its own module; this one only wires them together and keeps the
run record honest: `record.json` is written when the run starts (status `running`), after each stage,
and at the end with `completed`, `failed` (and the error) or `interrupted`.

    veritrain run                          # the built-in default (configs/digits.yaml)
    veritrain run configs/digits.yaml --set train.epochs=5 --json
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from veritrain import config as config_module
from veritrain import logs
from veritrain.config import ResolvedConfig
from veritrain.errors import Interrupted, RunFailed, UserError, VeritrainError
from veritrain.record import RECORD_VERSION, capture_code, capture_env, now_iso, write_record
from veritrain.signals import interruptible
from veritrain.workspace import Workspace

log = logging.getLogger("veritrain")


@dataclass
class RunOutcome:
    summary: dict[str, Any]  # what `--json` prints
    record: dict[str, Any]
    seal: str
    seconds: float
    error: Optional[VeritrainError | Interrupted] = None  # set when the run did not complete


def run(resolved: ResolvedConfig, workspace: Workspace, argv: list[str]) -> RunOutcome:
    """Execute one run of the pipeline; never raises for a run that started (see `RunOutcome.error`)."""
    started = time.perf_counter()
    cfg = resolved.config
    run_id, run_dir = workspace.new_run_dir()
    file_log = logs.attach_file(run_dir / "train.log")
    workspace.lock_run(run_id)
    (run_dir / "config.yaml").write_text(config_module.to_yaml(cfg), encoding="utf-8")
    record: dict[str, Any] = {
        "record_version": RECORD_VERSION,
        "run_id": run_id,
        "kind": "run",
        "status": "running",
        "started_at": now_iso(),
        "ended_at": None,
        "argv": argv,
        "exp_name": cfg.exp_name,
        "task": cfg.task,
        "seed": cfg.seed,
        "config": resolved.as_dict(),
        "config_hash": resolved.hash,
        "config_source": {
            "path": str(resolved.path) if resolved.path else None,
            "overrides": resolved.overrides,
            "data_root": cfg.data.root,
            "data_root_resolved": str(resolved.data_root) if resolved.data_root else None,
            "data_paths_resolved": {k: str(v) for k, v in resolved.data_paths.items()},
        },
        "code": capture_code(workspace.root),
        "env": None,
        "data": None,
        "training": None,
        "metrics": {},
        "final_state_sha256": None,
        "timings": {},
        "events": [],
        "error": None,
    }
    error: Optional[VeritrainError | Interrupted] = None
    try:
        with interruptible() as stop:
            import torch  # noqa: F401  (imported here so the environment below names its version)

            from veritrain import evaluate
            from veritrain.data import prepare
            from veritrain.tasks import get_task
            from veritrain.train import loop

            env, package_list = capture_env()
            record["env"] = env
            (run_dir / "env").mkdir()
            (run_dir / "env" / "requirements.lock").write_text(package_list, encoding="utf-8")
            log.info("run %s (%s) in %s", run_id, cfg.exp_name, run_dir)
            log.info("config %s (%s):\n%s", resolved.hash[:12], resolved.source_label, config_module.compact(cfg))
            log.debug("argv: %s", argv)
            log.debug("code: %s", record["code"])
            log.debug("env: %s", env)
            write_record(run_dir, record)

            t = time.perf_counter()
            data = prepare.run(cfg.data, resolved.data_paths, workspace.state_dir)
            record["timings"]["prepare"] = round(time.perf_counter() - t, 3)
            record["data"] = data_summary(data)
            log.info("data: version %s  %s", data.version[:12], "  ".join(f"{k} {v}" for k, v in data.counts.items()))
            write_record(run_dir, record)

            task = get_task(cfg.task)
            t = time.perf_counter()
            result = loop.run(cfg, data, task, run_dir, stop, logs.console)
            record["timings"]["train"] = round(time.perf_counter() - t, 3)
            record["env"]["device"] = result.device
            record["env"]["torch_threads"] = result.threads
            record["final_state_sha256"] = result.final_state_sha256
            best_key, _ = task.best_metric
            record["training"] = {
                "epochs": len(result.epochs),
                "steps": result.steps,
                "best_epoch": result.best_epoch,
                "best_metric": {"name": best_key, "value": result.best_value},
                "last_epoch": result.epochs[-1],
            }
            write_record(run_dir, record)

            t = time.perf_counter()
            device = loop.resolve_device(cfg.train.device)
            record["metrics"][cfg.eval.split] = evaluate.run(cfg, data, task, run_dir, device, "best")
            record["timings"]["eval"] = round(time.perf_counter() - t, 3)
            record["status"] = "completed"
    except Interrupted as err:
        error = err
        record["status"] = "interrupted"
        record["error"] = {"type": "Interrupted", "message": str(err)}
        log.warning("run %s interrupted (%s)", run_id, err, extra=logs.FILE_ONLY)
    except VeritrainError as err:
        error = err if isinstance(err, UserError) else RunFailed(f"run {run_id} failed: {err}")
        _record_failure(record, err)
    except Exception as err:  # a bug or an environment problem: keep the traceback in train.log
        error = RunFailed(f"run {run_id} failed: {err.__class__.__name__}: {err} (traceback in {run_dir / 'train.log'})")
        _record_failure(record, err)
    finally:
        seconds = time.perf_counter() - started
        record["ended_at"] = now_iso()
        record["timings"]["total"] = round(seconds, 3)
        if record["env"] is None:
            record["env"], _ = capture_env()
        if record["status"] == "completed":
            log.info("run %s completed in %.1fs", run_id, seconds)
        logs.detach(file_log)  # the log is complete before it is hashed into the record
        seal = write_record(run_dir, record)
        workspace.unlock_run(run_id)

    summary = {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "status": record["status"],
        "data_version": (record["data"] or {}).get("version"),
        "final_state_sha256": record["final_state_sha256"],
        "metrics": record["metrics"],
    }
    if error is not None:
        summary["error"] = str(error)
    return RunOutcome(summary=summary, record=record, seal=seal, seconds=seconds, error=error)


def data_summary(data: Any) -> dict[str, Any]:
    """What a run record says about its data: the version, counts, findings by kind, the card."""
    report = data.report()
    for kind, count in report["findings_by_kind"].items():
        log.debug("data finding: %s × %d", kind, count)
    quarantined = len(report["quarantined"])
    warnings = {k: n for k, n in report["findings_by_kind"].items() if k not in {q["kind"] for q in report["quarantined"]}}
    if quarantined:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(q["kind"] for q in report["quarantined"]).items()))
        log.warning("data: %d sample(s) quarantined (%s); see %s", quarantined, kinds, data.path / "data_report.md")
    if warnings:
        log.info("data: findings %s; see %s", ", ".join(f"{k} {n}" for k, n in warnings.items()), data.path / "data_report.md")
    for warning in report["card_warnings"]:
        log.warning("data: %s", warning)
    return {
        "version": data.version,
        "path": str(data.path),
        "source": report["source"],
        "counts": data.counts,
        "classes": data.classes,
        "quarantined": quarantined,
        "findings_by_kind": report["findings_by_kind"],
        "leakage_pairs": report["leakage"]["cross_split_duplicate_pairs"],
        "hash_algorithm": report["hash_algorithm"],
        "card": report["card"],
    }


def _record_failure(record: dict[str, Any], err: BaseException) -> None:
    record["status"] = "failed"
    record["error"] = {"type": err.__class__.__name__, "message": str(err)}
    log.error("run %s failed: %s", record["run_id"], err, extra=logs.FILE_ONLY)  # the CLI shows the one-line error
    log.debug("traceback:\n%s", "".join(traceback.format_exception(err)))


def python_argv() -> list[str]:
    """The command line as the user typed it (program name shortened to `veritrain`)."""
    return ["veritrain", *sys.argv[1:]]


def relative_to_cwd(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
