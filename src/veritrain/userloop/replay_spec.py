"""What a replay asks of `veritrain.start` in the script it runs: the `VERITRAIN_REPLAY` variable, a JSON object
that `veritrain reproduce`, `audit` and `train --resume` set (veritrain.userloop.replay).

- `{"mode": "reproduce", "run": DIR}`: a new run of the recorded script (`reproduced_from` the run in DIR);
- `{"mode": "resume", "run": DIR}`: continue the run in DIR from its newest valid checkpoint;
- `{"mode": "audit", "run": DIR, "start": I, "start_file": PATH|null, "end": J, "out": PATH}`: restore entry I's
  state (from PATH, or the initial state when null), check every entry up to J, write the verdicts to `out` and
  stop; nothing else is written.

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
    run_dir: Path
    start: int = 0
    start_file: Optional[str] = None
    end: int = 0
    out: Optional[str] = None
    workspace: Optional[Path] = None  # where a reproduction's new run goes (the workspace of the command that replays)

    @property
    def original(self) -> str:
        return self.run_dir.name

    def to_environment(self) -> str:
        return json.dumps({"mode": self.mode, "run": str(self.run_dir), "start": self.start, "start_file": self.start_file,
                           "end": self.end, "out": self.out,
                           "workspace": str(self.workspace) if self.workspace else None})

    @classmethod
    def from_environment(cls) -> Optional[ReplaySpec]:
        text = os.environ.get(REPLAY_VARIABLE)
        if not text:
            return None
        try:
            found = json.loads(text)
            spec = cls(mode=found["mode"], run_dir=Path(found["run"]), start=int(found.get("start") or 0),
                       start_file=found.get("start_file"), end=int(found.get("end") or 0), out=found.get("out"),
                       workspace=Path(found["workspace"]) if found.get("workspace") else None)
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{REPLAY_VARIABLE}: not a replay veritrain set; unset it to run the script normally") from None
        if spec.mode not in MODES:
            raise UserError(f"{REPLAY_VARIABLE}: mode {spec.mode!r} is none of {', '.join(MODES)}; unset it to run the script normally")
        return spec
