"""`python -P -s -c BOOT … veritrain.trust.replay_child JOB|-`: the child process of an audit of a run of veritrain's
loop (veritrain.trust.audit), started by veritrain.core.child with the auditor's interpreter and veritrain.

Building the run's model imports the code its config names (`model.target`, a user task): that code runs here,
from the copies the auditor made, never in the auditor's process. The job file (JSON, written by the auditor into
its scratch folder) names copies only (the record, the code, the checkpoints a replay starts from or a result is
computed from, the exported files) and the data version the auditor prepared and checked. For each stretch this
process trains from its start and writes every state it enters in the trajectory into the stretch's folder
(`entry-<index>.pt`); for each result it writes what it computed again (`<what>.json`). It judges nothing: the
auditor loads and hashes the states and compares the results.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from veritrain.core import logs
from veritrain.core.errors import VeritrainError
from veritrain.core.signals import StopFlag
from veritrain.core.task_registry import add_task_target
from veritrain.records import usercode
from veritrain.tasks import get_task


def main(job_file: str) -> int:
    """Run the job in `job_file`; `-`: import what a replay needs first, then read the job file's path from stdin
    (veritrain.core.child.Waiting: the auditor starts this process while it verifies the run)."""
    import torch

    from veritrain.core.config import resolved_from_record
    from veritrain.data import prepare
    from veritrain.results import evaluate, export  # noqa: F401  (imported before the job: their cost overlaps the auditor's checks)
    from veritrain.train import engines  # noqa: F401

    logs.setup_console_logging()
    logging.getLogger("veritrain").setLevel(logging.WARNING)  # the replayed loop's own lines stay out of the audit's output
    if job_file == "-":
        job_file = sys.stdin.readline().strip()
        if not job_file:  # the auditor ended without a job (the run did not verify, or the audit was refused)
            return 0
    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    record = json.loads(Path(job["record"]).read_text(encoding="utf-8"))
    data = prepare.load_version(Path(job["data"]))
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    with usercode.CodeSession([Path(p) for p in job["roots"]], describe="the code recorded with the run"):
        if job.get("task_target"):  # a task an entry point names: its class, imported from the copies
            add_task_target(str(record["config"]["task"]), str(job["task_target"]))
        cfg = resolved_from_record(record).config
        task = get_task(cfg)
        for stretch in job["stretches"]:
            _stretch(cfg, data, task, stretch, record)
        for item in job["results"]:
            try:
                _result(cfg, data, task, item)
            except Exception as err:  # this result is not computed again; the auditor names why
                print(f"error: {item['what']}: {type(err).__name__}: {err}"[:500], file=sys.stderr)
    return 0


def _stretch(cfg: Any, data: Any, task: Any, stretch: dict[str, Any], record: dict[str, Any]) -> None:
    """Train from the stretch's start (its checkpoint copy, or the initial state) to its stop step; every state entered
    on the way goes to its folder. A failure is one line in `failed.txt` there (the auditor names it)."""

    from veritrain.train import engines
    from veritrain.train.checkpointer import ReplayDone

    run_dir = Path(stretch["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    if stretch.get("start_file"):
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        name = f"step-{stretch['start_step']}.pt"
        shutil.copyfile(stretch["start_file"], run_dir / "checkpoints" / name)

        digest = hashlib.sha256((run_dir / "checkpoints" / name).read_bytes()).hexdigest()
        (run_dir / "checkpoints" / (name + ".sha256")).write_text(digest + "\n")
    out = Path(stretch["out"])
    try:
        engines.train(engines.of_record(record), cfg, data, task, run_dir, StopFlag(), None, resume=bool(stretch.get("start_file")), events=[],
                      stop_at_step=int(stretch["stop_step"]), hand_back=out,
                      record_format=record.get("record_format") if isinstance(record.get("record_format"), int) else None)
    except ReplayDone:
        pass
    except Exception as err:  # the recorded code's failure ends this stretch only; the auditor names it
        (out / "failed.txt").write_text(f"{type(err).__name__}: {err}"[:500] + "\n", encoding="utf-8")
    else:
        (out / "failed.txt").write_text(f"the replay ended without a scheduled checkpoint at step {stretch['stop_step']}\n", encoding="utf-8")


def _result(cfg: Any, data: Any, task: Any, item: dict[str, Any]) -> None:
    """One result computed again: a metric set evaluated from a checkpoint copy, the exports' parity, or the baselines."""

    import torch

    from veritrain.results import evaluate, export
    from veritrain.train.parts import resolve_device

    out = Path(item["out"])
    if item["kind"] == "metrics":
        with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
            again = evaluate.run(cfg, data, task, Path(scratch), resolve_device(cfg.train.device), item["checkpoint"], item["split"])
        found: Any = again
    elif item["kind"] == "export":
        model, _ = evaluate.load_model(cfg, data, task, Path(item["checkpoint"]), torch.device("cpu"))
        parity = export.check_parity(cfg, data, task, model.float().eval(), Path(item["export_dir"]), item["files"], write=False)
        found = {"passed": bool(parity["passed"]), "reason": parity.get("reason"),
                 "formats": {k: {"max_abs_diff": float(v["max_abs_diff"])} for k, v in parity["formats"].items()}}
    else:
        found = task.baselines(data, cfg) if task.spec.baseline is not None else None
    out.write_text(json.dumps({"result": found}, default=str) + "\n", encoding="utf-8")


if __name__ == "__main__":
    try:
        code = main(sys.argv[1])
    except VeritrainError as err:
        print(f"error: {err}", file=sys.stderr)
        code = err.exit_code
    # what the auditor reads is written and closed: the interpreter's teardown (about a second with torch) is skipped
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
