"""Where the runs of a set of trials execute: `LocalTrials` starts each in a fresh process
(`veritrain.orchestration.trials.process`), in a session of its own; `RayTrials` submits each as a Ray task. Both
take a job, report its result, and pass a signal on. `run_trials` keeps up to `--parallel` of them going."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from veritrain.core.errors import Interrupted, UserError
from veritrain.core.signals import StopFlag
from veritrain.orchestration.trials import process as trial_process
from veritrain.orchestration.trials.state import Slot
from veritrain.records.record import now_iso

if TYPE_CHECKING:
    from ray import ObjectRef

log = logging.getLogger("veritrain")


class TrialBackend(Protocol):
    """Where the runs of a set of trials execute: each `start` returns a handle; `finished` returns the results of those
    that ended within `timeout` seconds; `interrupt` passes a signal on (`again`: the second, which stops at once)."""

    def start(self, slot: Slot, job: dict[str, Any]) -> Any: ...

    def finished(self, running: dict[Slot, Any], timeout: float) -> list[tuple[Slot, dict[str, Any]]]: ...

    def interrupt(self, running: dict[Slot, Any], signum: int, again: bool) -> None: ...

    def prune(self, handle: Any) -> None: ...

    def close(self) -> None: ...


def _trial_environment(threads: int) -> dict[str, str]:
    from veritrain.orchestration.pipeline import DEFER_INDEX_VARIABLE

    # OMP_NUM_THREADS as Ray sets it for a task of `threads` CPUs; set on both backends so their records agree
    return {"OMP_NUM_THREADS": str(threads), DEFER_INDEX_VARIABLE: "1"}


def kind_name(spec: dict[str, Any]) -> str:
    return "search" if "search_version" in spec else "sweep"


def open_backend(name: str, spec: dict[str, Any], folder: Path, parallel: int, ray_address: Optional[str]) -> TrialBackend:
    if name == "ray":
        return RayTrials(spec, parallel, ray_address)
    return LocalTrials(spec, folder)


# `python -m` would put the folder the trial starts in (the sweep's working folder) first on sys.path, where a
# `yaml.py` or a `veritrain/` folder would be imported instead of the real ones; `veritrain run` does not do that
TRIAL_ENTRY = "import sys; sys.path.pop(0); from veritrain.orchestration.trials.process import main; sys.exit(main())"


class LocalTrials:
    """Each run in a fresh `veritrain.orchestration.trials.process` process, in a session of its own (so a Ctrl-C reaches
    the driver alone, which passes it on once). Its console output goes to `.veritrain/sweeps/<id>/logs/`."""

    def __init__(self, spec: dict[str, Any], folder: Path):
        self.repeat, self.kind = spec["repeat"], kind_name(spec)
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
        log.info("%s: %s %s (pid %d, console in %s)", self.kind, name, what, process.pid, log_path)
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

    def prune(self, handle: Any) -> None:
        """A search pruned this trial (its verdict file is written): SIGTERM, which its epoch judge waits for."""
        try:
            handle[0].send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        pass  # every process has ended (or was passed the signal) by now


def one_line(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no console output"
    return one_line(lines[-1], 200) if lines else "no console output"


class RayTrials:
    """Each run as a Ray task (`veritrain.orchestration.trials.process.run_trial`, in a fresh worker process: max_calls=1) with
    `train.threads` CPUs and OMP_NUM_THREADS set to them. Every node must see the workspace at the same path.
    Ray's own logging stays off the driver's stdout and stderr (log_to_driver=False, level ERROR)."""

    def __init__(self, spec: dict[str, Any], parallel: int, address: Optional[str]):
        import ray


        self.ray, self.repeat, self.kind = ray, spec["repeat"], kind_name(spec)
        address = address or os.environ.get("RAY_ADDRESS")
        options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
        try:
            if address:
                ray.init(address=address, **options)
            else:  # a local Ray with room for `parallel` runs of `threads` CPUs each, reporting no usage statistics
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(num_cpus=parallel * spec["threads"], include_dashboard=False, **options)
        except Exception as err:  # a cluster that cannot be reached, a local Ray that cannot start
            raise UserError(f"--backend ray: Ray did not start{' at ' + address if address else ''} ({one_line(str(err), 200)})") from None
        self.task = ray.remote(
            num_cpus=spec["threads"], max_calls=1, max_retries=0,  # a retried task would start a second run of the slot
            runtime_env={"env_vars": _trial_environment(spec["threads"])},
        )(trial_process.run_trial)

    def start(self, slot: Slot, job: dict[str, Any]) -> Any:
        what = f"resuming run {job['resume_run']}" if job.get("resume_run") else "started"
        log.info("%s: %s %s as a Ray task", self.kind, slot.name(self.repeat), what)
        return self.task.remote(job)

    def finished(self, running: dict[Slot, Any], timeout: float) -> list[tuple[Slot, dict[str, Any]]]:
        if not running:
            return []
        by_ref = {ref: slot for slot, ref in running.items()}
        ready, _ = self.ray.wait(list(by_ref), num_returns=len(by_ref), timeout=timeout)
        return [(by_ref[ref], self._result(ref)) for ref in ready]

    def _result(self, ref: ObjectRef) -> dict[str, Any]:
        from ray import exceptions

        try:
            return self.ray.get(ref)
        except exceptions.TaskCancelledError:
            return {"run_id": None, "status": "interrupted", "error": "its Ray task was cancelled"}
        except exceptions.RayError as err:
            return {"run_id": None, "status": "failed", "error": f"its Ray task failed: {one_line(str(err), 300)}"}

    def interrupt(self, running: dict[Slot, Any], signum: int, again: bool) -> None:
        for ref in running.values():
            self.ray.cancel(ref, force=again)  # first a KeyboardInterrupt in the task (the run checkpoints), then a kill

    def prune(self, handle: Any) -> None:
        pass  # a task's process is not ours to signal: its epoch judge reads the verdict file (the workspace is shared)

    def close(self) -> None:
        self.ray.shutdown()


def run_trials(backend: TrialBackend, parallel: int, stop: StopFlag, poll: float, next_job: Callable[[], Optional[tuple[Slot, dict[str, Any]]]],
               started: Callable[[Slot, dict[str, Any], Any], None], finished: Callable[[Slot, dict[str, Any]], None],
               between: Callable[[dict[Slot, Any]], None] = lambda running: None) -> None:
    """Up to `parallel` runs at once: `next_job` gives the next (None: none now), `started` and `finished` are told of
    each, `between` sees the running ones after every poll. The first SIGINT/SIGTERM is passed on to the running runs
    (each checkpoints and ends as `interrupted`) and nothing new starts; a second one passes it on again and stops
    waiting (Interrupted)."""
    running: dict[Slot, Any] = {}
    passed_on = False
    try:
        while True:
            if stop.signum is not None and not passed_on:
                backend.interrupt(running, stop.signum, again=False)
                passed_on = True
            while stop.signum is None and len(running) < parallel:
                job = next_job()
                if job is None:
                    break
                slot, spec = job
                running[slot] = backend.start(slot, spec)
                started(slot, spec, running[slot])
            if not running:
                break
            for slot, result in backend.finished(running, poll):
                del running[slot]
                finished(slot, result)
            between(running)
    except Interrupted as err:  # the second signal
        backend.interrupt(running, err.signum, again=True)
        raise
    if stop.signum is not None:
        raise Interrupted(stop.signum)
