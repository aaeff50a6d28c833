"""Replays of a script's run: `veritrain reproduce` (a new run of the recorded command), `audit` (segments of the
trajectory checked, nothing written) and `train --resume` (the run continued), each by starting the recorded
interpreter on the recorded command line, in the recorded working directory, with the recorded copy of the script
as `__main__` and its recorded modules first on the import path (`veritrain.userloop.launch`), and
`VERITRAIN_REPLAY` saying what `veritrain.start` is to do (`replay_spec`).

Only a `replayable` run is replayed: `refusal` gives the reason for any other, and there is no partial replay (a
recorded copy that fails its hash, or inputs missing or changed, stop it before it starts).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.records.record import Record, read_record
from veritrain.records.workspace import Workspace
from veritrain.userloop import inputs as inputs_module
from veritrain.userloop.replay_spec import REPLAY_VARIABLE, ReplaySpec

KIND = "script"


def is_script_run(record: Mapping[str, Any]) -> bool:
    return record.get("kind") == KIND


def refusal(record: Mapping[str, Any], command: str) -> Optional[str]:
    """Why `command` (reproduce, audit, train --resume) cannot replay this script's run, in one line; None when it can."""
    guarantee = record.get("guarantee") or {}
    level = guarantee.get("level")
    if level == "replayable":
        return None
    reasons = "; ".join(guarantee.get("reasons") or ["its record states no guarantee level"])
    integration = (record.get("script") or {}).get("integration")
    if command == "train --resume" and integration == "lightning" and ((record.get("script") or {}).get("api") or {}).get("state_registered"):
        return None  # its fit starts from vt.lightning.ckpt_path(), which gives a continuation the run's newest checkpoint
    if command == "train --resume" and integration:
        return (f"{record.get('run_id')}: a run of {integration}'s own loop continues through it: run the script again with the run's newest "
                "checkpoint (Lightning: trainer.fit(..., ckpt_path=...), or ckpt_path=vt.lightning.ckpt_path(...) for `train --resume`; the Trainer: trainer.train(resume_from_checkpoint=...))")
    if command == "train --resume" and level == "bound" and (record.get("script") or {}).get("file"):
        return None  # continuing a bound run needs only its code and checkpoints
    return f"{record.get('run_id')}: a {level or 'unknown'} run, so {command} cannot replay it: {reasons}"


def _inputs_problem(record: Record) -> Optional[str]:
    section = record.get("inputs")
    if not section:
        return None
    manifest = inputs_module.read_manifest(record.run_dir)
    found = inputs_module.problems(manifest, Path(str((record.get("script") or {}).get("cwd") or manifest["root"])))
    if found:
        first = found[0]
        return f"{record.run_id}: input {first['path']}: {first['kind']} ({first['detail']}); the replay needs the inputs the run bound"
    return None


def launch(record: Record, workspace: Workspace, spec: ReplaySpec, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the recorded command under `spec`; its console output passes through (captured with `quiet`)."""
    section = record.get("script") or {}
    problem = _inputs_problem(record)
    if problem:
        raise UserError(problem)
    cwd = Path(str(section.get("cwd")))
    if not cwd.is_dir():
        raise UserError(f"{record.run_id}: the recorded working directory {cwd} is not here; the replay runs there")
    executable = str(section.get("executable") or sys.executable)
    if not Path(executable).exists():
        executable = sys.executable  # another machine: the interpreter running veritrain (the environment check names the difference)
    spec = dataclasses.replace(spec, workspace=workspace.root)
    env = {**os.environ, REPLAY_VARIABLE: spec.to_environment()}
    src = str(Path(__file__).resolve().parents[2])  # veritrain itself, importable in the child as here
    env["PYTHONPATH"] = os.pathsep.join([src, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    # the script's own output is progress here: stderr, so that a command's report (and --json) alone is on stdout
    return subprocess.run([executable, "-m", "veritrain.userloop.launch"], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE if quiet else sys.stderr, stderr=subprocess.PIPE if quiet else None)


def reproduce(workspace: Workspace, run_dir: Path) -> Path:
    """A new run of the recorded command (its record says `reproduced_from`); returns its folder."""
    record = read_record(run_dir)
    why = refusal(record, "reproduce")
    if why:
        raise UserError(why)
    before = set(workspace.runs_dir.iterdir()) if workspace.runs_dir.is_dir() else set()
    done = launch(record, workspace, ReplaySpec("reproduce", run_dir))
    made = sorted(p for p in set(workspace.runs_dir.iterdir()) - before if (p / "record.json").is_file())
    made = [p for p in made if read_record(p).get("reproduced_from") == run_dir.name]
    if not made:
        raise RunFailed(f"reproduce: the recorded command of {run_dir.name} ended (exit {done.returncode}) without starting a run")
    return made[-1]


def resume(workspace: Workspace, run_dir: Path) -> int:
    """Continue the run with its recorded command and code; returns the command's exit code."""
    record = read_record(run_dir)
    if record.status == "completed":
        raise UserError(f"--resume {run_dir.name}: the run is completed; nothing to resume")
    why = refusal(record, "train --resume")
    if why:
        raise UserError(why)
    return launch(record, workspace, ReplaySpec("resume", run_dir)).returncode


def audit_stretch(workspace: Workspace, record: Record, start: int, end: int, start_file: Optional[Path],
                  said: Optional[set[str]] = None) -> list[dict[str, Any]]:
    """Replay entry `start` → `end` with the recorded script: one verdict per segment start+1 … end, in the shape
    veritrain.trust.audit gives for the built-in loop. The replay's warnings (an edited working copy) are passed on
    once each (`said`: those passed on already)."""
    entries = record.get("trajectory") or []

    def verdict(index: int, **fields: Any) -> dict[str, Any]:
        return {"segment": index, "from_step": entries[index - 1]["step"], "to_step": entries[index]["step"],
                "epoch": entries[index]["epoch"], "replayed_from_step": entries[start]["step"], **fields}

    scratch_root = workspace.state_dir / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"audit-{os.getpid()}-", dir=scratch_root) as scratch:
        out = Path(scratch) / "verdicts.json"
        spec = ReplaySpec("audit", record.run_dir, start=start, start_file=str(start_file) if start_file else None, end=end, out=str(out))
        done = launch(record, workspace, spec, quiet=True)
        checked = json.loads(out.read_text(encoding="utf-8"))["checked"] if out.is_file() else None
    for line in (done.stderr or "").splitlines():
        if "differs from the copy recorded" in line and line not in (said if said is not None else set()):
            print(line, file=sys.stderr)
            if said is not None:
                said.add(line)
    if checked is None:
        last = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return [verdict(i, verdict="differs" if i == start + 1 else "unchecked",
                        detail=f"the replayed script stopped: {last[0][:200]}" if i == start + 1 else "the replay stopped")
                for i in range(start + 1, end + 1)]
    by_entry = {item["entry"]: item for item in checked if "entry" in item}
    verdicts = []
    for index in range(start + 1, end + 1):
        item = by_entry.get(index)
        if item is None or item.get("verdict") == "ended":
            verdicts.append(verdict(index, verdict="differs", detail="the replayed script ended before it saved this entry"))
            break
        if item["verdict"] == "identical":
            verdicts.append(verdict(index, verdict="identical", replayed_state_sha256=item["state_sha256"]))
            continue
        verdicts.append(verdict(index, verdict="differs", replayed_state_sha256=item.get("state_sha256"),
                                detail=item.get("detail") or f"state hash {str(item.get('state_sha256'))[:12]} replayed, "
                                                              f"{str(item.get('recorded_sha256'))[:12]} recorded"))
        break
    initial = by_entry.get(0)
    if start == 0 and initial is not None and initial.get("verdict") == "differs":
        verdicts = [verdict(1, verdict="differs", detail="the replayed script's initial state is not the recorded one (model init or seeding differ)")]
    done_indices = {v["segment"] for v in verdicts}
    verdicts += [verdict(i, verdict="unchecked", detail="follows a segment that differs") for i in range(start + 1, end + 1) if i not in done_indices]
    return verdicts
