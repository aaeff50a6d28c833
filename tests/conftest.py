"""Shared helpers: run the real `veritrain` command (in this process, or in a new one where it must be), and
tiny in-process runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _one_blas_thread() -> None:
    """One BLAS thread for the numpy and scipy work of this process's commands (the baselines' logistic
    regression, the data checks), as veritrain's own label-issue search already limits itself: the suite runs a
    worker per core, and OpenBLAS threads that spin-wait for a core another worker holds made a 0.1 s fit take
    2-8 s. The environment is left alone, so records, and the processes the tests start, are as `veritrain`
    makes them; a baseline's figures agree with a two-thread fit to within rounding (1e-12)."""
    import numpy  # noqa: F401 - threadpoolctl limits the BLAS libraries loaded so far: numpy's and scipy's
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


_one_blas_thread()


def _torch_threads_for_a_share_of_the_cores() -> None:
    """Under pytest-xdist (`make test`: a worker per core) torch's threads in each worker for its share of the
    cores, one each here, where torch would take every core in every worker: OpenMP threads that spin-wait for
    a core another process holds made the default config's run take 56-164 s instead of 12-23 s beside one busy process. The runs of a
    config that leaves train.threads unset record the count they trained with (training.settings.threads), and
    the processes the tests start keep torch's default. Without xdist nothing changes."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


_torch_threads_for_a_share_of_the_cores()


def _passive_openmp_waits() -> None:
    """Under pytest-xdist, the veritrain processes the tests start wait for their OpenMP threads passively
    (OMP_WAIT_POLICY=PASSIVE, unless set): torch's threads that spin for a core another worker holds made a language
    model's epoch 10-30 times slower. Waiting changes no result, and records do not name the variable."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


_passive_openmp_waits()


def _no_signing_key_of_the_user() -> None:
    """The tests never see the user's own signing key (in ~/.config/veritrain or $VERITRAIN_SIGNING_KEY): runs
    are sealed unsigned unless a test makes a key of its own, and nothing a test does can sign with, or read, the
    user's key. An empty config folder per session stands in for theirs, for this process and the ones it starts."""
    import tempfile

    os.environ.pop("VERITRAIN_SIGNING_KEY", None)
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="veritrain-test-config-")
    # the user's cache and state folders (verify's state hashes, the marks of runs started here) likewise
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="veritrain-test-cache-")
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="veritrain-test-state-")


_no_signing_key_of_the_user()


# A fast digits config for tests: the pipeline is the real one, only smaller.
FAST = ["--set", "train.epochs=2", "--set", "model.name=mlp", "--set", "model.hidden=[32]"]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def veritrain_process(*args: str, cwd: Path | None = None, timeout: float = 300) -> Result:
    """`python -m veritrain ARGS` in a new process: for commands that take signals, import recorded user code
    (its import root changes sys.path and sys.modules) or must show what the process itself does."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "veritrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


# what an in-process command may not take: it would import the user's code into this process
_NEEDS_PROCESS = ("--trust-code", "model.target=", "task.target=")


def veritrain(*args: str, cwd: Path | None = None, timeout: float = 300) -> Result:
    """`veritrain ARGS` run in this process through the CLI's own entry point, as `python -m veritrain` runs it,
    without a torch import per call. File descriptors 1 and 2 are captured, so the output of the processes a
    command starts (ranks, sweep trials) is caught as a subprocess would show it. An uncaught exception prints
    its traceback and gives exit 1, as the process would. The environment, the working directory, torch's thread
    count and the logging handlers are put back afterwards. `timeout` is only honoured by `veritrain_process`."""
    if any(arg.startswith(_NEEDS_PROCESS) for arg in args):
        raise AssertionError(f"{args}: commands that import user code run in a process: use veritrain_process")
    import tempfile
    import warnings

    import torch

    from veritrain.core import logs
    from veritrain.cli import main
    from veritrain.core.secrets import redacting_excepthook

    saved_env, saved_cwd, saved_argv, saved_threads = dict(os.environ), os.getcwd(), sys.argv, torch.get_num_threads()
    saved_handlers, saved_stdin = list(logs.log.handlers), sys.stdin
    saved_streams = sys.stdout, sys.stderr
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        for stream in saved_streams:
            stream.flush()
        saved_fds = os.dup(1), os.dup(2)
        os.dup2(out_file.fileno(), 1)
        os.dup2(err_file.fileno(), 2)
        sys.stdout = open(os.dup(1), "w", encoding="utf-8", errors="backslashreplace", closefd=True)
        sys.stderr = open(os.dup(2), "w", encoding="utf-8", errors="backslashreplace", closefd=True)
        sys.stdin = open(os.devnull, encoding="utf-8")
        sys.argv = [str(ROOT / "src" / "veritrain" / "__main__.py"), *args]
        code: int = 0
        try:
            if cwd is not None:
                os.chdir(cwd)
            os.environ["COLUMNS"] = "200"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # noqa: BLE001 - a bug: the process would print its traceback and exit 1
            redacting_excepthook(*sys.exc_info())  # type: ignore[arg-type]
            code = 1
        finally:
            sys.stdout.close()
            sys.stderr.close()
            sys.stdin.close()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            sys.stdout, sys.stderr = saved_streams
            sys.stdin, sys.argv = saved_stdin, saved_argv
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            torch.set_num_threads(saved_threads)
            for handler in [h for h in logs.log.handlers if h not in saved_handlers]:
                logs.log.removeHandler(handler)
                handler.close()
        out_file.seek(0)
        err_file.seek(0)
        stdout = out_file.read().decode("utf-8", errors="backslashreplace")
        stderr = err_file.read().decode("utf-8", errors="backslashreplace")
    return Result(code, stdout, stderr)


def need_extra(available: bool, why: str) -> None:
    """Skip a test whose extra (a browser, Playwright, Ray) is not installed here; under `make test-slow`
    (VERITRAIN_TEST_EXTRAS=required) fail instead, so CI never passes a long check it did not run."""
    if available:
        return
    if os.environ.get("VERITRAIN_TEST_EXTRAS") == "required":
        pytest.fail(f"{why} (make test-slow installs it)")
    pytest.skip(why)


@pytest.fixture
def cli():
    return veritrain


def in_process_run(workdir: Path, overrides: list[str], config: str | Path | None = None, kind: str = "run"):
    """Run the pipeline in this process (no torch import per test), as `veritrain run` does."""
    import torch

    from veritrain.orchestration import pipeline
    from veritrain.core.config import load_config
    from veritrain.records.workspace import Workspace

    threads = torch.get_num_threads()
    resolved = load_config(config, overrides)
    try:
        return pipeline.run(resolved, Workspace.open(workdir), ["veritrain", kind, *overrides], kind=kind)
    finally:
        torch.set_num_threads(threads)  # train.threads must not leak into later tests


FAST_OVERRIDES = ["train.epochs=2", "model.name=mlp", "model.hidden=[32]"]


# ---------------------------------------------------------------- the shared small run


@dataclass(frozen=True)
class SmallRun:
    """A sealed run of FAST_OVERRIDES on the embedded digits (default data, eval, baselines and exports) and
    its workspace."""

    workdir: Path
    run_dir: Path
    seal: str
    record: dict[str, Any]


def _copy_workspace(source: SmallRun, target: Path) -> SmallRun:
    import shutil

    shutil.copytree(source.workdir, target)
    return SmallRun(target, target / "runs" / source.run_dir.name, source.seal, source.record)


def _made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], tuple[Path, str]]) -> SmallRun:
    """A workspace with one sealed run that `make(workdir)` trains, returning its run folder and seal: made once
    for the whole session. Under pytest-xdist the workers share the folder above their own temporary folders;
    the first to get here makes it while the others wait on the lock, then all read it."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, made = root / f"shared-{name}", root / f"shared-{name}" / "made.json"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            run_dir, seal = make(folder / "ws")
            made.write_text(json.dumps({"run": run_dir.name, "seal": seal}))
        info = json.loads(made.read_text())
    run_dir = folder / "ws" / "runs" / info["run"]
    return SmallRun(folder / "ws", run_dir, info["seal"], json.loads((run_dir / "record.json").read_text()))


@pytest.fixture(scope="session")
def small_run_pristine(tmp_path_factory) -> SmallRun:
    """The small run, trained once per session. Never use it directly: take `small_run` (a copy of the
    workspace per module) or `small_run_copy` (a copy per test), so no test sees what another one did."""

    def make(workdir: Path) -> tuple[Path, str]:
        outcome = in_process_run(workdir, FAST_OVERRIDES)
        assert outcome.error is None, outcome.error
        return Path(outcome.summary["run_dir"]), outcome.seal

    return _made_once(tmp_path_factory, "small-run", make)


@pytest.fixture(scope="session")
def default_run_pristine(tmp_path_factory) -> SmallRun:
    """`veritrain run` of the default config (smoke test first), as `make demo` runs it, made once per session;
    take `default_run_copy`."""

    def make(workdir: Path) -> tuple[Path, str]:
        result = veritrain("run", "--workdir", str(workdir), "--json")
        assert result.code == 0, result.stderr
        run_dir = workdir / "runs" / result.json()["run_id"]
        return run_dir, (run_dir / "record.sha256").read_text().strip()

    return _made_once(tmp_path_factory, "default-run", make)


@pytest.fixture
def default_run_copy(default_run_pristine, tmp_path) -> SmallRun:
    """The default config's run in a workspace of this test's own."""
    return _copy_workspace(default_run_pristine, tmp_path / "default-ws")


@pytest.fixture(scope="module")
def small_run(small_run_pristine, tmp_path_factory) -> SmallRun:
    """The small run in a workspace of this module's own: its tests may add runs to it or read it, not damage it."""
    return _copy_workspace(small_run_pristine, tmp_path_factory.mktemp("small-run-module") / "ws")


@pytest.fixture
def small_run_copy(small_run_pristine, tmp_path) -> SmallRun:
    """The small run in a workspace of this test's own, free to damage."""
    return _copy_workspace(small_run_pristine, tmp_path / "ws")
