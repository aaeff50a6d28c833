"""`python -m veritrain.userloop.launch`: the child process of a replay (veritrain.userloop.replay). It runs the
recorded copy of the script as `__main__`, with `sys.argv` as recorded and the recorded user modules first on
the import path, after checking every copy against its recorded hash. A working copy of the script that differs
from the recorded one is named in one line and not used.
"""

from __future__ import annotations

import hashlib
import logging
import runpy
import shutil
import sys
from pathlib import Path

from veritrain.core import logs
from veritrain.core.errors import RunFailed, VeritrainError
from veritrain.records import usercode
from veritrain.records.record import read_record
from veritrain.records.workspace import Workspace
from veritrain.userloop.replay_spec import ReplaySpec, ReplayStop

log = logging.getLogger("veritrain")


def main() -> int:
    logs.setup_console_logging()
    spec = ReplaySpec.from_environment()
    if spec is None:
        print("error: veritrain.userloop.launch runs only under a replay (veritrain reproduce, audit, train --resume)", file=sys.stderr)
        return 2
    record = read_record(spec.run_dir)
    section = record.get("script") or {}
    workspace = Workspace.open(spec.run_dir.parent.parent)
    scratch_parent = workspace.root / usercode.STATE_SCRATCH
    scratch_parent.mkdir(parents=True, exist_ok=True)
    session = usercode.recorded(spec.run_dir, record, scratch_parent, "replay")
    content = (spec.run_dir / str(section["file"])).read_bytes()
    if hashlib.sha256(content).hexdigest() != section.get("sha256"):
        raise RunFailed(f"{spec.run_dir.name}: {section['file']}: the recorded copy of the script does not match its recorded hash; "
                        f"see `veritrain verify {spec.run_dir.name}`")
    original = Path(str(section.get("path")))
    if original.is_file() and original.read_bytes() != content:
        log.warning("replay: %s differs from the copy recorded with run %s at %s; using the recorded copy", original,
                    spec.run_dir.name, usercode.first_difference(content, original.read_bytes()))
    folder = session.scratch or scratch_parent / f"script-{spec.run_dir.name}"
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / original.name
    copy.write_bytes(content)
    if sys.path and sys.path[0] in ("", str(Path.cwd())):
        sys.path.pop(0)  # `-m` put the working directory first; the recorded modules come from the copies instead
    sys.argv = list(section.get("argv") or [str(original)])
    try:
        with session:
            sys.path.insert(0, str(folder))
            runpy.run_path(str(copy), run_name="__main__")
    except ReplayStop:  # an audit replay reached its segment's end inside a framework's loop, which passed it on
        pass
    finally:
        if session.scratch is None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except VeritrainError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
