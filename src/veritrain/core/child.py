"""The child process of a replay (`audit`, `reproduce`, `train --resume`): how the verifier starts the code a run
recorded without trusting anything the run says about how to start it.

- **The auditor's interpreter**: `sys.executable`, or the one the auditor names (`--python PATH`, for a verifier
  installed apart from the training environment). The interpreter a record names is shown, never run: a forger
  writes the record.
- **The verifier's veritrain**: the child imports veritrain from a folder that holds only a link to the package
  running here, placed first on its import path; nothing else of the verifier's site is added.
- **No import path from the run's places**: `-P` (Python 3.11+; the boot drops an empty first entry on 3.10) keeps
  the working directory off the import path, `-s` the user's site folder; the working directory is where the
  inputs are read, never where modules come from. Not `-I`, which would drop PYTHONHASHSEED, a variable the record
  may set.
- **An environment built from nothing**: PATH, HOME, TMPDIR, the locale, the user's own XDG folders (keys, marks and
  caches, as the README names them), the variables the run recorded from its allowlist (PYTHONHASHSEED among
  them), and what the replay itself passes. No PYTHONPATH, PYTHONSTARTUP or PYTHONHOME reaches it.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from veritrain.core.errors import UserError
from veritrain.core.secrets import ENV_ALLOWLIST

# variables of the auditor's own session the child keeps: where things are, the locale, the user's own folders
KEPT = ("PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ",
        "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME")

# the boot: the folder given first on the import path, no empty (working directory) entry, then the module as __main__
BOOT = ("import sys, runpy; root = sys.argv.pop(1); sys.path[:] = [root] + [p for p in sys.path if p not in ('', '.')]; "
        "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def interpreter(python: Optional[str]) -> str:
    """The interpreter a replay starts: `python` (the auditor's --python) or this one. UserError when it cannot run."""
    if python is None:
        return sys.executable
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UserError(f"--python {python}: not an executable file; give the interpreter of the environment to replay in")
    return str(path.absolute())


@functools.lru_cache(maxsize=8)
def _has_safe_path(python: str) -> bool:
    """Whether `python` knows -P (3.11+)."""
    if python == sys.executable:
        return sys.version_info >= (3, 11)
    try:
        done = subprocess.run([python, "-s", "-c", "import sys; print(sys.version_info >= (3, 11))"], capture_output=True,
                              text=True, timeout=60, env=environment({}))
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UserError(f"--python {python}: it does not start ({err}); give a working Python 3.10+ interpreter") from None
    if done.returncode != 0:
        raise UserError(f"--python {python}: it does not start (exit {done.returncode}); give a working Python 3.10+ interpreter")
    return done.stdout.strip() == "True"


def package_link(folder: Path) -> Path:
    """A folder holding only `veritrain`, a link to the package running here: the child's first import path entry."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "veritrain"
    if not link.exists():
        link.symlink_to(Path(__file__).resolve().parents[1], target_is_directory=True)
    return folder


def command(python: str, module: str, boot_folder: Path, *args: str) -> list[str]:
    """The child's command line: `python [-P] -s -c BOOT <folder with veritrain> <module> args…`."""
    flags = ["-P", "-s"] if _has_safe_path(python) else ["-s"]
    return [python, *flags, "-c", BOOT, str(package_link(boot_folder)), module, *args]


def environment(recorded: Mapping[str, object], extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The child's environment: the kept variables of this session, the allowlisted ones the run `recorded` (its
    values, not this session's), and `extra`."""
    env = {name: os.environ[name] for name in KEPT if name in os.environ}
    env.update({name: str(value) for name, value in recorded.items() if name in ENV_ALLOWLIST and value is not None})
    env.update(extra or {})
    return env


class Waiting:
    """A child started before its job is known, so that its start (the interpreter, torch, veritrain) overlaps the
    parent's own checks: the module is given `-` for its job and reads the job file's path from its stdin.
    `send(job)` gives it (the child writes little to its pipes until `wait` collects them: its log says warnings
    only); `close()` ends a child never given one (a run that did not verify, a refusal). A context manager:
    leaving it closes the child."""

    def __init__(self, python: str, module: str, scratch: Path, recorded: Mapping[str, object]):
        self.process = subprocess.Popen(command(python, module, scratch / "boot", "-"), cwd=scratch, env=environment(recorded),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def send(self, job: Path) -> None:
        """Give the child its job; it starts at once (`wait` collects it)."""
        assert self.process.stdin is not None
        self.process.stdin.write(str(job) + "\n")
        self.process.stdin.flush()  # one line is all it reads; `wait` closes the pipe

    def wait(self) -> subprocess.CompletedProcess[str]:
        out, err = self.process.communicate()
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, out, err)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()

    def __enter__(self) -> Waiting:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
