"""What a replay asks of `veritrain.start` in the script it runs: the `VERITRAIN_REPLAY` variable, a JSON object
that `veritrain reproduce`, `audit` and `train --resume` set (veritrain.userloop.replay).

- `{"mode": "reproduce", "run": DIR}`: a new run of the recorded script (`reproduced_from` the run in DIR);
- `{"mode": "resume", "run": DIR}`: continue the run in DIR from its newest valid checkpoint;
- `{"mode": "audit", "start": I, "start_file": PATH|null, "end": J, "out": DIR, "to_finish": B}`: restore entry
  I's state (from PATH, a copy of the run's checkpoint, or the initial state when null), hand back every state it
  reaches up to entry J into DIR (`entry-<index>.pt`, or `.ckpt` from Lightning) and stop; with `to_finish` go on
  to `run.finish` and hand back the metrics passed there (`finish.json`). Nothing else is written, and the run's
  folder is not named: the parent (veritrain.userloop.replay) hashes what comes back and judges it.

Every mode names `launch`, the file (made by the parent, beside copies of the recorded code) that says which copy
of the script runs as `__main__`, with which command line and modules.

`vt.start` ignores its `resume=` argument under a replay.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from veritrain.core.errors import UserError

REPLAY_VARIABLE = "VERITRAIN_REPLAY"
MODES = ("reproduce", "resume", "audit")


class ReplayStop(BaseException):
    """An audit replay reached the end of its segment, or a state that differs: `run.checkpoint` stops the script
    here (a BaseException, so that no `except Exception` in the script catches it)."""


@dataclass(frozen=True)
class ReplaySpec:
    mode: str
    run_dir: Optional[Path]  # the run that resumes or is reproduced; None in an audit, whose child never sees the run
    start: int = 0
    start_file: Optional[str] = None
    end: int = 0
    out: Optional[str] = None
    workspace: Optional[Path] = None  # where a reproduction's new run goes (the workspace of the command that replays)
    launch: Optional[str] = None  # the parent's launch file (veritrain.userloop.launch)
    config_hash: Optional[str] = None  # an audit: the run's, so that a replay of another config stops at once, saying so
    to_finish: bool = False  # an audit: go on past entry `end` to run.finish and hand back its metrics

    @property
    def original(self) -> str:
        return self.run_dir.name if self.run_dir is not None else ""

    @property
    def run(self) -> Path:
        """The run a reproduction or a resume replays (an audit names none: from_environment refuses it there)."""
        assert self.run_dir is not None, "an audit's replay names no run"
        return self.run_dir

    def to_environment(self) -> str:
        return json.dumps({"mode": self.mode, "run": str(self.run_dir) if self.run_dir else None, "start": self.start,
                           "start_file": self.start_file, "end": self.end, "out": self.out,
                           "workspace": str(self.workspace) if self.workspace else None, "launch": self.launch,
                           "config_hash": self.config_hash, "to_finish": self.to_finish})

    @classmethod
    def from_environment(cls) -> Optional[ReplaySpec]:
        text = os.environ.get(REPLAY_VARIABLE)
        if not text:
            return None
        try:
            found = json.loads(text)
            spec = cls(mode=found["mode"], run_dir=Path(found["run"]) if found.get("run") else None, start=int(found.get("start") or 0),
                       start_file=found.get("start_file"), end=int(found.get("end") or 0), out=found.get("out"),
                       workspace=Path(found["workspace"]) if found.get("workspace") else None, launch=found.get("launch"),
                       config_hash=found.get("config_hash"), to_finish=bool(found.get("to_finish")))
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{REPLAY_VARIABLE}: not a replay veritrain set; unset it to run the script normally") from None
        if spec.mode not in MODES:
            raise UserError(f"{REPLAY_VARIABLE}: mode {spec.mode!r} is none of {', '.join(MODES)}; unset it to run the script normally")
        if (spec.mode == "audit") != (spec.out is not None) or (spec.mode != "audit" and spec.run_dir is None):
            raise UserError(f"{REPLAY_VARIABLE}: an incomplete {spec.mode} replay; unset it to run the script normally")
        return spec
