"""One run of a `veritrain sweep` or `veritrain search`, in a process of its own: the driver starts it for every
trial (and seed, and a sweep's parent run), as a local process or as a Ray task, and reads back one small JSON result.

The run itself is a normal `pipeline.run` (or `pipeline.resume` of an interrupted one) with the sweep link,
hypothesis and parent the driver planned. It writes only its run folder: the driver, the one process that
opens the workspace's SQLite index, refreshes the index and experiments.md as runs finish
(`pipeline.DEFER_INDEX_VARIABLE`), so trials on other hosts never touch a database over a network filesystem.

    python -m veritrain.orchestration.trials.process --result PATH < TRIAL.json     # what the local backend runs
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from veritrain.core import locks, logs
from veritrain.core.errors import Interrupted, RunFailed, VeritrainError
from veritrain.core.files import write_atomic
from veritrain.orchestration.trials.state import linked_runs
from veritrain.records import usercode
from veritrain.records.workspace import Workspace


@contextmanager
def working_dir(path: Optional[str]) -> Iterator[None]:
    """Relative data paths given with --set resolve against the directory the sweep started in."""
    if not path:
        yield
        return
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def run_trial(spec: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) one run of the sweep; returns {run_id, status, error}. Never raises for a run that failed
    or was interrupted: that is the run's status, which the driver reports."""
    from veritrain.core.config import load_config
    from veritrain.orchestration import pipeline

    logs.setup_console_logging()
    claim: Optional[Path] = None
    try:
        workspace = Workspace.open(spec["workspace"])
        if spec.get("slot"):  # the slot's claim, held while this process runs it (the kernel lets go if it is killed)
            claim = workspace.lock_path(f"sweep-{spec['sweep_id']}-{spec['slot']}")
            locks.acquire(claim, on_wait=lambda by: logging.getLogger("veritrain").info(
                "sweep: waiting for %s, an earlier process of %s, to stop", by, spec["slot"]))
            earlier = None if spec.get("resume_run") else _earlier_run(workspace, spec)
            if earlier is not None and earlier["status"] in ("completed", "failed"):
                return {"run_id": earlier["run_id"], "status": earlier["status"], "error": (earlier.get("error") or {}).get("message")}
            if earlier is not None:  # interrupted, or killed while `running`: it continues, no second run of the slot starts
                spec = {**spec, "resume_run": earlier["run_id"]}
        judge = epoch_judge(spec["judge"]) if spec.get("judge") else None  # a search's trial, judged after every validation
        if spec.get("resume_run"):
            outcome = pipeline.resume(workspace, spec["resume_run"], spec["argv"], epoch_judge=judge)
        else:
            with working_dir(spec.get("cwd")):
                resolved = load_config(spec["config_path"], spec["overrides"])
            if resolved.hash != spec["config_hash"]:  # the driver planned another config: the file changed since
                return {"run_id": None, "status": "failed",
                        "error": f"the config now hashes to {resolved.hash[:12]}, the sweep planned {spec['config_hash'][:12]}: "
                                 f"{spec['config_path'] or 'the built-in default'} changed since the sweep started"}
            outcome = pipeline.run(resolved, workspace, spec["argv"], kind="run", hypothesis=spec["hypothesis"],
                                   parent=spec["parent"], smoke=spec["smoke"], repeat=spec["repeat"], sweep=spec["sweep"],
                                   sweep_selection=spec.get("selection"), code=_sweep_code(spec, workspace), epoch_judge=judge)
    except (Interrupted, KeyboardInterrupt) as err:  # before the run folder existed: the trial starts again on resume
        return {"run_id": None, "status": "interrupted", "error": str(err) or "interrupted"}
    except VeritrainError as err:  # could not start (the parent vanished, the data is gone, ...)
        return {"run_id": None, "status": "failed", "error": str(err)}
    finally:
        if claim is not None:
            locks.release(claim)
    return {"run_id": outcome.summary["run_id"], "status": outcome.record["status"],
            "error": str(outcome.error) if outcome.error is not None else None}


def _earlier_run(workspace: Workspace, spec: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The record of a run of this slot made by an earlier process (a trial of a killed driver, which stops itself
    within a second, may have started one): the slot's link, seed index and planned config hash."""
    link, index = spec["sweep"], (spec.get("repeat") or {}).get("index", 0)
    found = linked_runs(workspace, link["id"], lambda slot, record: (slot.trial, slot.seed_index, record.get("config_hash")) ==
                        (link["trial"], index, spec["config_hash"]))
    return next(iter(found.values()), None)


def _sweep_code(spec: dict[str, Any], workspace: Workspace) -> Optional[usercode.CodeSession]:
    """The code session of the copies the sweep made at its start (None for a sweep from before them, or one whose
    configs name no user code: the run then imports as any new run does)."""

    code = spec.get("code") or {}
    if not code.get("user_files"):
        return None
    if usercode.listing_sha256(code["user_files"]) != code.get("sha256"):
        raise RunFailed(f"sweep {spec['sweep_id']}: spec.json: code: its listing does not hash to the sha256 recorded at the start")
    folder = workspace.state_dir / spec.get("state_folder", "sweeps") / spec["sweep_id"]  # a search's: searches
    return usercode.from_folder(folder, code["user_files"], workspace.root / usercode.STATE_SCRATCH, f"sweep {spec['sweep_id']}")


# How often a trial waiting for its search's verdict looks for it (seconds); the driver answers within its own poll.
VERDICT_POLL_SECONDS = 0.02
# How long a trial pruned by a verdict file waits for the SIGTERM the local driver sends with it (seconds), so that
# the signal lands while training still defers signals, never later while the run is sealed.
PRUNE_SIGNAL_WAIT_SECONDS = 5.0


def epoch_judge(judge: dict[str, Any]):
    """The judge of a search's trial (veritrain.train.parts.EpochJudge) over the search's verdict folder: after each
    validation the trial writes `<slot>.wait.json` (its run, epoch and step) and waits; the driver reads the run's
    metrics.jsonl, asks its pruner, and writes `<slot>.verdict.json` for that step, followed by SIGTERM when it
    prunes. A signal without a pruning verdict for the step (the user's Ctrl-C passed on, a driver that died) is
    an interruption: None, and the loop stops as it does for any signal."""

    folder, slot = Path(judge["folder"]), judge["slot"]
    wait_path, verdict_path = folder / f"{slot}.wait.json", folder / f"{slot}.verdict.json"

    def verdict_for(step: int) -> Optional[dict[str, Any]]:
        try:
            verdict = json.loads(verdict_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return verdict if isinstance(verdict, dict) and verdict.get("step") == step else None

    def wait(run_dir: Path, row: dict[str, Any], stop: Any) -> Optional[dict[str, Any]]:
        step = row["step"]
        write_atomic(wait_path, (json.dumps({"run_id": run_dir.name, "epoch": row["epoch"], "step": step}) + "\n").encode())
        verdict = verdict_for(step)
        while verdict is None and stop.signum is None:
            time.sleep(VERDICT_POLL_SECONDS)
            verdict = verdict_for(step)
        if verdict is None:
            verdict = verdict_for(step)  # written just before the signal that woke us
        if verdict is None or not verdict.get("prune"):
            return None
        deadline = time.monotonic() + PRUNE_SIGNAL_WAIT_SECONDS
        while judge.get("signalled", True) and stop.signum is None and time.monotonic() < deadline:
            time.sleep(VERDICT_POLL_SECONDS)
        return {key: verdict.get(key) for key in ("value", "reason", "search", "trial")}

    return wait


def _stop_when_orphaned(driver_pid: int) -> None:
    """A trial whose sweep process died (kill -9, a closed terminal) ends its run as `interrupted`, resumable
    by `veritrain sweep --resume`, rather than go on with nobody to collect it: SIGTERM to itself, handled like any."""
    while os.getppid() == driver_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m veritrain.orchestration.trials.process", description="Run one trial of a veritrain sweep or search (spec JSON on stdin).")
    parser.add_argument("--result", required=True, help="file to write the JSON result to")
    args = parser.parse_args(argv)
    # a signal before the run installs its own handling (while torch loads) still ends in a result, not a bare exit
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    try:
        spec = json.load(sys.stdin)
        threading.Thread(target=_stop_when_orphaned, args=(spec["driver_pid"],), daemon=True).start()
        result = run_trial(spec)
    except Interrupted as err:
        result = {"run_id": None, "status": "interrupted", "error": str(err)}
    for signum in (signal.SIGINT, signal.SIGTERM):  # the run has ended: a late signal must not lose its result
        signal.signal(signum, signal.SIG_IGN)

    write_atomic(Path(args.result), (json.dumps(result) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
