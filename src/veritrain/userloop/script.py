"""The code of a script's run: the calling script (`__main__`), the user modules it imported, the command line,
the interpreter and the working directory, so that a replay can run the same command with the same code.

The script is copied to `code/script/<name>` in the run, each user module to `code/<package layout>` (as for a
model target, `veritrain.records.usercode`), and the record's `script` section says where the script was, how
it was started and whether it reads `__file__` (a replay runs the copy, from elsewhere).
"""

from __future__ import annotations

import ast
import hashlib
import shutil
import sys
import threading
import types
from pathlib import Path
from typing import Any, Optional

from veritrain.records import usercode

SCRIPT_DIR = "code/script"  # in a run folder: the copy of the calling script


def main_script() -> tuple[Optional[Path], Optional[str]]:
    """(the file `__main__` was run from, None) or (None, why there is no script file to record)."""
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    if not file:
        if hasattr(sys, "ps1") or "ipykernel" in sys.modules or "IPython" in sys.modules:
            return None, "it runs in an interactive session (a notebook or the REPL)"
        return None, "the code came from stdin or `python -c`"
    path = Path(file).resolve()
    if not path.is_file() or path.suffix != ".py":
        return None, f"__main__ is {file}, not a .py file"
    return path, None


def ran_code_mismatch(script: Path) -> Optional[str]:
    """None when the code running as `__main__` is the file `script` compiled; else one short sentence saying
    why not (a script can point `__main__.__file__` at another file before it is recorded).

    The code running as `__main__` is that of the outermost module-level frame whose globals are
    `sys.modules["__main__"]`'s namespace, on this thread's stack or else the main thread's: the script's own
    frame under `python script.py`, `python -m pkg.mod` and `runpy.run_path(..., run_name="__main__")` (which
    puts a module of its own in `sys.modules["__main__"]` while the script runs). With no such frame (the
    script has finished, or a `multiprocessing` spawn child runs it as `__mp_main__`) there is nothing to
    compare: None. Under `python -c`, pytest or a notebook there is one, and it is not a recorded file.

    The file is compiled as Python compiled the script (its flags, the frame's file name), and the two code
    objects compare equal when their bytecode, constants, names and line tables do, nested functions included.
    This tells that what started is the recorded file, not what it does next: code the script runs with
    `exec()`, or after replacing `sys.modules["__main__"]` with another module, is not checked."""
    running = _main_module_code()
    if running is None:
        return None
    why = (f"the code running as __main__ is not the recorded file {script.name} (__main__.__file__ names a "
           "file whose compiled code differs from what runs), so a replay would run other code")
    try:
        compiled = compile(script.read_bytes(), running.co_filename, "exec", dont_inherit=True,
                           optimize=sys.flags.optimize)
    except (OSError, SyntaxError, ValueError):
        return why
    return None if compiled == running else why


def _main_module_code() -> Optional[types.CodeType]:
    """The code of the outermost module-level frame running in `__main__`'s namespace, on this thread's stack
    or else the main thread's, or None."""
    namespace = getattr(sys.modules.get("__main__"), "__dict__", None)
    stacks: list[Optional[types.FrameType]] = [sys._getframe(1)]
    if threading.current_thread() is not threading.main_thread():
        stacks.append(sys._current_frames().get(threading.main_thread().ident or 0))
    for frame in stacks:
        found = None
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_globals is namespace:
                found = frame.f_code
            frame = frame.f_back
        if found is not None:
            return found
    return None


def reads_file_variable(source: bytes) -> bool:
    """Whether a script's code reads `__file__` (anywhere, as a name)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True  # cannot tell: assume it does
    return any(isinstance(node, ast.Name) and node.id == "__file__" for node in ast.walk(tree))


def record_script(run_dir: Path, script: Path, argv: list[str], cwd: Path, recorded_path: Optional[Path] = None) -> dict[str, Any]:
    """Copy the script into the run; its `script` section (the copy, where it was, how it was started).
    `recorded_path`: where the script is said to be (a replay runs a copy of the original)."""
    content = script.read_bytes()
    named = recorded_path or script
    copy = run_dir / SCRIPT_DIR / named.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(content)
    return {
        "file": f"{SCRIPT_DIR}/{named.name}",
        "sha256": hashlib.sha256(content).hexdigest(),
        "path": str(named),
        "argv": list(argv),
        "orig_argv": list(getattr(sys, "orig_argv", [sys.executable, *argv])),
        "executable": sys.executable,
        "cwd": str(cwd),
        "reads_file": reads_file_variable(content),
    }


def save_modules(run_dir: Path, code: dict[str, Any]) -> None:
    """Copy every user module imported so far into `code/` (package layout) and list them in code["user_files"],
    added to those listed already."""
    listed = {entry["module"]: entry for entry in code.get("user_files") or []}
    for name, (_module, file) in sorted(usercode.user_modules().items()):
        if name in listed:
            continue
        relative = usercode.layout_path(name, file)
        if relative is None:
            continue  # loaded under another name than its file says: a replay could not import it by that name
        copy = run_dir / usercode.CODE_DIR / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, copy)
        listed[name] = {"module": name, "path": relative, "sha256": hashlib.sha256(copy.read_bytes()).hexdigest()}
    code["user_files"] = [listed[name] for name in sorted(listed)]


def code_difference(record: dict[str, Any], run_dir: Path, script: Path) -> Optional[str]:
    """How the script and its modules as they are now differ from the copies recorded with the run (one line: the
    file and its first differing line), or None."""
    section = record.get("script") or {}
    recorded = (run_dir / str(section.get("file", ""))).read_bytes() if section.get("file") else b""
    current = script.read_bytes()
    if hashlib.sha256(current).hexdigest() != section.get("sha256"):
        return f"{script}: {usercode.first_difference(recorded, current)}"
    for entry in (record.get("code") or {}).get("user_files") or []:
        module = sys.modules.get(entry["module"])
        file = getattr(module, "__file__", None)
        if file and Path(file).is_file() and hashlib.sha256(Path(file).read_bytes()).hexdigest() != entry["sha256"]:
            copy = run_dir / usercode.CODE_DIR / entry["path"]
            was = copy.read_bytes() if copy.is_file() else b""
            return f"{file}: {usercode.first_difference(was, Path(file).read_bytes())}"
    return None
