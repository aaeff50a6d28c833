"""Replays of a script's run: `veritrain reproduce` (a new run of the recorded command), `audit` (segments of the
trajectory checked, nothing written) and `train --resume` (the run continued). Each starts a child process
(veritrain.core.child: the auditor's interpreter and veritrain, `-P -s`, an environment built from nothing but the
run's allowlisted variables) that runs a copy of the recorded script as `__main__`, with the recorded command line,
copies of its recorded modules first on the import path (`veritrain.userloop.launch`), in the recorded working
directory (or `--inputs-root`), which is never on the import path; `VERITRAIN_REPLAY` says what `veritrain.start`
is to do (`replay_spec`).

An audit's child gets copies (of the code and of the checkpoint it starts from), never the run's folder, and hands
back every state it reaches; this process loads each as data, hashes it and compares it with the trajectory, and
reads no verdict from the child. What that proves: the recorded code and the bound inputs give this trajectory; the
recorded code can still read files it names by path, so it is not proof that the code is honest (read it).

Only a `replayable` run is replayed: `refusal` gives the reason for any other, and there is no partial replay (a
recorded copy that fails its hash, or inputs missing or changed, stop it before it starts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Optional

from veritrain.core import child
from veritrain.core.errors import RunFailed, UserError
from veritrain.records import usercode
from veritrain.records.record import Record, read_record
from veritrain.records.workspace import Workspace
from veritrain.userloop import frameworks, inputs as inputs_module
from veritrain.userloop.replay_spec import REPLAY_VARIABLE, ReplaySpec

log = logging.getLogger("veritrain")

KIND = "script"


def is_script_run(record: Mapping[str, Any]) -> bool:
    return record.get("kind") == KIND


def refusal(record: Mapping[str, Any], command: str) -> Optional[str]:
    """Why `command` (reproduce, audit, train --resume) cannot replay this script's run, in one line; None when it can."""
    guarantee = record.get("guarantee") or {}
    level = guarantee.get("level")
    world_size = int((record.get("distributed") or {}).get("world_size", 1))
    if command == "train --resume" and world_size > 1:
        return (f"{record.get('run_id')}: it was trained by {world_size} processes (torchrun); continue it under the same torchrun "
                f"command, with vt.start(resume={str(record.get('run_id'))!r}) or resume=\"auto\"")
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


def _inputs_problem(record: Record, cwd: Path) -> Optional[str]:
    section = record.get("inputs")
    if not section:
        return None
    manifest = inputs_module.read_manifest(record.run_dir)
    found = inputs_module.problems(manifest, cwd)
    if found:
        first = found[0]
        return f"{record.run_id}: input {first['path']}: {first['kind']} ({first['detail']}); the replay needs the inputs the run bound"
    return None


# metrics.json fields that say where a result came from, not what it is
PROVENANCE = ("checkpoint", "trajectory_entry", "predictions")


class Replay:
    """The child processes that replay one script's run: copies of its recorded script and modules in a scratch
    folder of the workspace (checked against their recorded hashes), started with `python` (the auditor's --python;
    None: this interpreter) in the recorded working directory or `inputs_root`. A context manager: leaving it
    removes the copies."""

    def __init__(self, workspace: Workspace, record: Record, python: Optional[str] = None, inputs_root: Optional[Path] = None):
        self.workspace, self.record = workspace, record
        self.python = child.interpreter(python)
        section = record.get("script") or {}
        self.cwd = Path(inputs_root) if inputs_root is not None else Path(str(section.get("cwd")))
        if not self.cwd.is_dir():
            where = "--inputs-root" if inputs_root is not None else "the recorded working directory"
            raise UserError(f"{record.run_id}: {where} {self.cwd} is not here; the replay reads the inputs there "
                            "(give --inputs-root DIR where they are)")
        problem = _inputs_problem(record, self.cwd)
        if problem:
            raise UserError(problem)
        self.scratch: Optional[Path] = None
        self.launch_file: Optional[Path] = None

    def __enter__(self) -> Replay:
        root = self.workspace.state_dir / "tmp"
        root.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"replay-{os.getpid()}-", dir=root))
        try:
            self.launch_file = self._copy_code(self.scratch)
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        return self

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _copy_code(self, scratch: Path) -> Path:
        """Copies of the recorded script and modules in `scratch/code`, and the launch file naming them."""
        record, section = self.record, self.record.get("script") or {}
        code = scratch / "code"
        code.mkdir()
        usercode.copy_recorded(record.run_dir, usercode.recorded_listing(record)[0], code)
        content = (record.run_dir / str(section["file"])).read_bytes()
        if hashlib.sha256(content).hexdigest() != section.get("sha256"):
            raise RunFailed(f"{record.run_id}: {section['file']}: the recorded copy of the script does not match its recorded hash; "
                            f"see `veritrain verify {record.run_id}`")
        original = Path(str(section.get("path")))
        if original.is_file() and original.read_bytes() != content:
            log.warning("replay: %s differs from the copy recorded with run %s at %s; using the recorded copy", original,
                        record.run_id, usercode.first_difference(content, original.read_bytes()))
        script = code / (original.name if original.name.endswith(".py") else "script.py")
        script.write_bytes(content)
        launch = scratch / "launch.json"
        launch.write_text(json.dumps({"script": str(script), "code": str(code), "argv": list(section.get("argv") or [str(original)])}),
                          encoding="utf-8")
        return launch

    def run(self, spec: ReplaySpec, quiet: bool = False) -> subprocess.CompletedProcess[str]:
        """Start the child under `spec`; its console output passes through to stderr (captured with `quiet`)."""
        assert self.scratch is not None and self.launch_file is not None
        spec = dataclasses.replace(spec, workspace=self.workspace.root, launch=str(self.launch_file))
        recorded = (self.record.get("env") or {}).get("variables") or {}
        if spec.mode == "resume":  # the user continues their own run, in their own environment (a check starts from nothing)
            env = {**os.environ, REPLAY_VARIABLE: spec.to_environment()}
        else:
            env = child.environment(recorded, {REPLAY_VARIABLE: spec.to_environment()})
        command = child.command(self.python, "veritrain.userloop.launch", self.scratch / "boot")
        # the script's own output is progress here: stderr, so that a command's report (and --json) alone is on stdout
        return subprocess.run(command, cwd=self.cwd, env=env, text=True,
                              stdout=subprocess.PIPE if quiet else sys.stderr, stderr=subprocess.PIPE if quiet else None)

    def stretch(self, start: int, end: int, start_file: Optional[Path], to_finish: bool = False) -> tuple[list[dict[str, Any]], Optional[dict[str, Any]]]:
        """Replay entry `start` → `end` (and on to run.finish with `to_finish`): one verdict per segment start+1 … end,
        in the shape veritrain.trust.audit gives for every run, and with `to_finish` the result of re-deriving
        metrics.final (None otherwise)."""
        assert self.scratch is not None
        entries = self.record.get("trajectory") or []
        integration = (self.record.get("script") or {}).get("integration")
        out = Path(tempfile.mkdtemp(prefix="states-", dir=self.scratch))
        copy = None
        if start_file is not None:  # the child gets a copy of a start that holds the entry's state, never the run's file
            problem = holds(integration, start_file, entries[start])
            if problem:
                return [verdict(entries, start, start + 1, verdict="differs", detail=f"{start_file.name} {problem}")] \
                    + unchecked(entries, start, start + 2, end, "its start state is not the trajectory's"), None
            copy = out.parent / f"start-{start}{start_file.suffix}"
            shutil.copyfile(start_file, copy)
        spec = ReplaySpec("audit", None, start=start, start_file=str(copy) if copy else None, end=end, out=str(out),
                          config_hash=str(self.record.get("config_hash")), to_finish=to_finish)
        done = self.run(spec, quiet=True)
        stopped = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        verdicts = judge(entries, integration, out, start, end, stopped[0][:200] if done.returncode else None)
        result = _final_metrics(self.record, out, end, verdicts) if to_finish else None
        shutil.rmtree(out, ignore_errors=True)
        if copy is not None:
            copy.unlink(missing_ok=True)
        return verdicts, result


def holds(integration: Optional[str], path: Path, entry: Mapping[str, Any]) -> Optional[str]:
    """Why the checkpoint at `path` does not hold `entry`'s state (hashed here), or None."""
    try:
        state_hash, _model, step = frameworks.handed_back(integration, path)
    except ValueError as err:
        return str(err)
    if (state_hash, step) != (entry["state_sha256"], entry["step"]):
        return f"holds state {state_hash[:12]} at step {step}, not the entry's {str(entry['state_sha256'])[:12]} at step {entry['step']}"
    return None


def verdict(entries: list[dict[str, Any]], start: int, index: int, **fields: Any) -> dict[str, Any]:
    return {"segment": index, "from_step": entries[index - 1]["step"], "to_step": entries[index]["step"],
            "epoch": entries[index]["epoch"], "replayed_from_step": entries[start]["step"], **fields}


def unchecked(entries: list[dict[str, Any]], start: int, first: int, end: int, why: str) -> list[dict[str, Any]]:
    return [verdict(entries, start, i, verdict="unchecked", detail=why) for i in range(first, end + 1)]


def _handed(out: Path, index: int) -> Optional[Path]:
    return next((p for p in (out / f"entry-{index}.pt", out / f"entry-{index}.ckpt") if p.is_file()), None)


def judge(entries: list[dict[str, Any]], integration: Optional[str], out: Path, start: int, end: int,
           failure: Optional[str]) -> list[dict[str, Any]]:
    """The verdicts on the states the child handed back into `out`, each hashed here against the recorded entry
    (its state hash, weights hash and step); the first that differs or is missing ends the stretch."""
    verdicts: list[dict[str, Any]] = []
    for index in range(start if start == 0 else start + 1, end + 1):
        segment = max(index, 1)
        file = _handed(out, index)
        recorded = entries[index]
        if file is None:
            why = f"the replayed script stopped: {failure}" if failure else "the replayed script ended before it reached this entry"
            found = verdict(entries, start, segment, verdict="differs", detail=why)
        else:
            try:
                state_hash, model_hash, step = frameworks.handed_back(integration, file)
            except ValueError as err:
                state_hash, model_hash, step = "", "", -1
                why = f"the state handed back {err}"
            else:
                why = (f"the replay reached step {step}, the trajectory says step {recorded['step']}" if step != recorded["step"]
                       else f"state hash {state_hash[:12]} replayed, {str(recorded['state_sha256'])[:12]} recorded" if state_hash != recorded["state_sha256"]
                       else f"weights hash {model_hash[:12]} replayed, {str(recorded.get('model_sha256'))[:12]} recorded"
                       if recorded.get("model_sha256") and model_hash != recorded["model_sha256"] else "")
            if not why:
                if index > 0:
                    verdicts.append(verdict(entries, start, index, verdict="identical", replayed_state_sha256=state_hash))
                continue
            if index == 0:
                why = f"the replayed script's initial state is not the recorded one (model init or seeding differ): {why}"
            found = verdict(entries, start, segment, verdict="differs", detail=why,
                             **({"replayed_state_sha256": state_hash} if state_hash else {}))
        return verdicts + [found] + unchecked(entries, start, segment + 1, end, f"follows segment {segment}, which differs")
    return verdicts


def _final_metrics(record: Record, out: Path, end: int, verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics.final re-derived: the metrics the replayed script passed to run.finish after reaching the last entry,
    compared exactly with those recorded."""
    entries = record.get("trajectory") or []
    item: dict[str, Any] = {"what": "metrics.final", "entry": end, "step": entries[end]["step"]}
    if any(v["verdict"] != "identical" for v in verdicts):
        return {**item, "verdict": "unchecked", "detail": "the replay did not reach the final state identically"}
    if _handed(out, end + 1) is not None:
        return {**item, "verdict": "differs", "detail": "the replay saved a state past the recorded trajectory before run.finish"}
    finished = out / "finish.json"
    if not finished.is_file():
        return {**item, "verdict": "differs", "detail": "the replayed script did not reach run.finish"}
    try:
        again = json.loads(finished.read_text(encoding="utf-8"))["metrics"]
        assert isinstance(again, dict)
    except (ValueError, KeyError, AssertionError):
        return {**item, "verdict": "differs", "detail": "the replay handed back no metrics"}
    recorded = {k: v for k, v in ((record.get("metrics") or {}).get("final") or {}).items() if k not in PROVENANCE}
    recorded = json.loads(json.dumps(recorded))
    keys = [k for k in sorted(set(recorded) | set(again)) if recorded.get(k) != again.get(k)]
    if keys:
        return {**item, "verdict": "differs", "detail": f"{len(keys)} value(s) differ, first {keys[0]}: recorded {str(recorded.get(keys[0]))[:40]}, "
                                                         f"replayed {str(again.get(keys[0]))[:40]}"}
    return {**item, "verdict": "identical", "detail": f"{len(recorded)} values equal (passed to run.finish by the replay)"}


def reproduce(workspace: Workspace, run_dir: Path, python: Optional[str] = None, inputs_root: Optional[Path] = None) -> Path:
    """A new run of the recorded command (its record says `reproduced_from`); returns its folder."""
    record = read_record(run_dir)
    why = refusal(record, "reproduce")
    if why:
        raise UserError(why)
    before = set(workspace.runs_dir.iterdir()) if workspace.runs_dir.is_dir() else set()
    with Replay(workspace, record, python, inputs_root) as replay:
        done = replay.run(ReplaySpec("reproduce", run_dir))
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
    with Replay(workspace, record) as replay:
        return replay.run(ReplaySpec("resume", run_dir)).returncode
