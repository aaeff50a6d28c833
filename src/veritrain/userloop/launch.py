"""The child process of a replay (veritrain.userloop.replay), started by veritrain.core.child with the auditor's
interpreter and veritrain: it runs the copy of the recorded script the parent made as `__main__`, with the recorded
command line and the copies of the recorded modules first on the import path. What it is to do is
`VERITRAIN_REPLAY` (veritrain.userloop.replay_spec), whose `launch` file the parent wrote beside the copies; it
checks nothing itself (the parent checked every copy against its recorded hash and judges what comes back).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from veritrain.core import logs
from veritrain.core.errors import VeritrainError
from veritrain.records import usercode
from veritrain.userloop.replay_spec import ReplaySpec, ReplayStop


def main() -> int:
    logs.setup_console_logging()
    spec = ReplaySpec.from_environment()
    if spec is None or spec.launch is None:
        print("error: veritrain.userloop.launch runs only under a replay (veritrain reproduce, audit, train --resume)", file=sys.stderr)
        return 2
    plan = json.loads(Path(spec.launch).read_text(encoding="utf-8"))
    sys.argv = [str(item) for item in plan["argv"]]
    try:
        with usercode.CodeSession([Path(plan["code"])], describe="the code recorded with the run"):
            runpy.run_path(str(plan["script"]), run_name="__main__")
    except ReplayStop:  # an audit replay reached its segment's end inside a framework's loop, which passed it on
        pass
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except VeritrainError as err:
        print(f"error: {err}", file=sys.stderr)
        code = err.exit_code
    except SystemExit as stop:  # the script's own exit, or vt.start's at the end of an audit's stretch
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    spec = ReplaySpec.from_environment()
    if spec is not None and spec.mode == "audit":  # the states handed back are written and closed: skip the teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
