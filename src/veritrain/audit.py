"""`veritrain audit RUN`: check that a run's weights came from its recorded training without redoing it.

`verify` proves the files are the recorded ones; whoever can train can also write a consistent record.
The trajectory (veritrain.train.trajectory) commits to the training state at every scheduled
checkpoint. The audit draws S segments at random among those it can replay (from the initial state,
or from a checkpoint the run kept), replays each with the recorded config and data version on this
machine, and demands the recorded state hash at the segment's end, bit for bit. Training is exact on
the same kind of machine, so a difference is evidence, not noise. The auditor draws a fresh seed
(printed) unless `--seed` repeats an earlier audit, so the trainer cannot know the segments in advance.

    veritrain audit latest --segments 2
    veritrain audit RUN --segments 5 --seed 1234 --out audit.json --json

Exit codes: 0 every segment identical; 1 a segment differs (or the run does not verify); 2 the audit
cannot start (no auditable segments, or this machine cannot replay the run exactly: the difference is
named, and it is never a forgery verdict).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import platform
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from veritrain.errors import RunFailed, UserError
from veritrain.record import now_iso, read_record
from veritrain.workspace import Workspace

log = logging.getLogger("veritrain")

# packages whose version decides the numbers of a replay; any other difference is shown, not blocking
DECISIVE_PACKAGES = ("torch", "numpy", "veritrain")


def escape_probability(total: int, forged: int, sampled: int) -> float:
    """The chance that S segments drawn without replacement among N all miss F forged ones: C(N−F, S) / C(N, S)."""
    if sampled > total or forged > total:
        return 0.0
    return math.comb(total - forged, sampled) / math.comb(total, sampled)


def replay_blockers(record: dict[str, Any], run_dir: Path) -> tuple[list[str], list[str]]:
    """(why this machine cannot replay the run exactly, differences shown but not blocking)."""
    import torch

    from veritrain.record import _cpu_name, package_list

    env, training, cfg = record.get("env") or {}, record.get("training") or {}, record.get("config") or {}
    blockers, notes = [], []
    train_cfg = cfg.get("train") or {}
    if not train_cfg.get("deterministic", True):
        blockers.append("train.deterministic is false: the run used non-deterministic kernels")
    if train_cfg.get("compile"):
        blockers.append("train.compile is true: torch.compile is outside the bit-exact promise")
    distributed = record.get("distributed") or {}
    if int(distributed.get("world_size", 1)) > 1:
        blockers.append(f"the run was trained by {distributed['world_size']} processes; audit replays with one")
    device = str((training.get("settings") or {}).get("device") or env.get("device") or "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        blockers.append(f"the run trained on {device}; this machine has no CUDA device")
    for key, now in (("python", platform.python_version()), ("machine", platform.machine())):
        if env.get(key) and env[key] != now:
            blockers.append(f"{key} {env[key]} recorded, {now} here")
    recorded_cpu = env.get("cpu")
    if recorded_cpu and recorded_cpu != _cpu_name() and not device.startswith("cuda"):
        blockers.append(f"CPU {recorded_cpu!r} recorded, {_cpu_name()!r} here (kernels may round differently)")
    lock = run_dir / "env" / "requirements.lock"
    if lock.exists():
        recorded = _versions(lock.read_text(encoding="utf-8"))
        here = _versions(package_list())
        for name in sorted(set(recorded) | set(here)):
            if recorded.get(name) == here.get(name):
                continue
            text = f"{name} {recorded.get(name, 'absent')} recorded, {here.get(name, 'absent')} here"
            (blockers if name in DECISIVE_PACKAGES else notes).append(text)
    return blockers, notes


def _versions(lines: str) -> dict[str, str]:
    found = {}
    for line in lines.splitlines():
        name, _, version = line.partition("==")
        if version:
            found[name.strip().lower()] = version.strip()
    return found


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The replayed loop's own lines (epochs, checkpoints) stay out of the audit's output."""
    previous = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(previous)


def run(workspace: Workspace, ref: str, segments: int = 2, seed: Optional[int] = None, out: Optional[Path] = None,
        trust_code: bool = False) -> dict[str, Any]:
    """Audit a run; returns the result (also written to `out` and to .veritrain/audits/<run>/). Raises
    UserError (exit 2) when the audit cannot start."""
    from veritrain import pipeline
    from veritrain.train import trajectory as trajectory_module
    from veritrain.verify import verify_run

    run_dir = workspace.resolve_run(ref, "model")
    record = read_record(run_dir)
    if out is not None and (out.resolve().is_relative_to(run_dir.resolve())):
        raise UserError(f"--out {out}: inside the run folder; the audit never writes into the run (it would no longer verify)")
    entries = record.get("trajectory") or []
    if not entries:
        raise UserError(f"{run_dir.name}: the record has no trajectory (a baseline run, or a run made before trajectories); nothing to audit")
    # the files, the chain and its endpoint; the start checkpoints' states are matched with the trajectory below
    checked = verify_run(run_dir, workspace.state_dir, rehash_data=False, check_states=False)
    if checked["problems"]:
        first = checked["problems"][0]
        raise RunFailed(f"{run_dir.name}: {first['path']}: {first['kind']} ({first.get('detail', '')}); the run does not verify, "
                        f"so its trajectory cannot be trusted: see `veritrain verify {run_dir.name}`")
    blockers, notes = replay_blockers(record, run_dir)
    if blockers:
        raise UserError(f"{run_dir.name}: this machine cannot replay the run exactly: {'; '.join(blockers[:4])}; audit it on a machine like the recorded one (`veritrain runs show {run_dir.name}`)")
    available = {e["step"] for e in entries if (run_dir / "checkpoints" / f"step-{e['step']}.pt").is_file()}
    auditable = trajectory_module.auditable_segments(entries, available)
    if not auditable:
        raise UserError(f"{run_dir.name}: no auditable segment (no checkpoint of the trajectory is kept); "
                        "train with checkpoint.audit_every to keep them")
    if seed is None:
        seed = secrets.randbits(63)  # the auditor's own randomness: the trainer cannot know the segments
    import random

    chosen = sorted(random.Random(seed).sample(auditable, min(segments, len(auditable))))
    opened = pipeline.open_run(workspace, run_dir.name, trust_code=trust_code, need="model", verified=True)
    threads = int(((record.get("training") or {}).get("settings") or {}).get("threads") or 0)
    verdicts = []
    started = time.perf_counter()
    for index in chosen:
        verdicts.append(_replay_segment(opened, entries, index, threads, workspace))
    seconds = time.perf_counter() - started
    training_seconds = float((record.get("timings") or {}).get("train") or 0.0)
    differs = [v for v in verdicts if v["verdict"] != "identical"]
    result = {
        "run_id": run_dir.name,
        "audited_at": now_iso(),
        "seed": seed,
        "segments_total": len(entries) - 1,
        "segments_auditable": len(auditable),
        "segments_audited": len(chosen),
        "verdict": "differs" if differs else "identical",
        "segments": verdicts,
        "replay_seconds": round(seconds, 3),
        "training_seconds": training_seconds,
        "cost_fraction": round(seconds / training_seconds, 4) if training_seconds else None,
        # the chance that an audit like this one misses a trajectory with F forged auditable segments
        "escape_probability": {str(f): escape_probability(len(auditable), f, len(chosen)) for f in (1, 2, 5) if f <= len(auditable)},
        "environment_notes": notes,
        "command": f"veritrain audit {run_dir.name} --segments {segments} --seed {seed}",
    }
    text = json.dumps(result, indent=2) + "\n"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    kept = workspace.state_dir / "audits" / run_dir.name
    kept.mkdir(parents=True, exist_ok=True)
    (kept / f"{result['audited_at'].replace(':', '').replace('-', '')[:15]}-{seed % 10**6:06d}.json").write_text(text, encoding="utf-8")
    return result


def _replay_segment(opened: Any, entries: list[dict[str, Any]], index: int, threads: int, workspace: Workspace) -> dict[str, Any]:
    """Replay entry index−1 → entry index in a scratch folder and compare the state hash."""
    import torch

    from veritrain.errors import VeritrainError
    from veritrain.signals import StopFlag
    from veritrain.train import checkpoint, loop, trajectory as trajectory_module

    start, end = entries[index - 1], entries[index]
    verdict: dict[str, Any] = {"segment": index, "from_step": start["step"], "to_step": end["step"], "epoch": end["epoch"]}
    scratch_root = workspace.state_dir / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    previous_threads = torch.get_num_threads()
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="audit-", dir=scratch_root) as scratch:
        run_dir = Path(scratch)
        resume = not trajectory_module.starts_at_initial_state(entries, index)
        if resume:  # start from the kept checkpoint (its sidecar is checked when it loads), which must hold the entry's state
            name = f"step-{start['step']}.pt"
            held = trajectory_module.state_sha256(checkpoint.load(opened.run_dir / "checkpoints" / name))
            if held != start["state_sha256"]:
                verdict.update(verdict="differs", seconds=round(time.perf_counter() - t, 3),
                               detail=f"checkpoints/{name} holds state {held[:12]}, not the trajectory's {start['state_sha256'][:12]}")
                return verdict
            (run_dir / "checkpoints").mkdir()
            for suffix in ("", ".sha256"):
                shutil.copyfile(opened.run_dir / "checkpoints" / (name + suffix), run_dir / "checkpoints" / (name + suffix))
        replayed: Optional[loop.ReplayDone] = None
        failure = None
        try:
            if threads:
                torch.set_num_threads(threads)
            with _quiet():
                loop.run(opened.config, opened.data, opened.task, run_dir, StopFlag(), None, resume=resume, events=[],
                         stop_at_step=end["step"])
        except loop.ReplayDone as done:
            replayed = done
        except VeritrainError as err:
            failure = str(err)
        finally:
            torch.set_num_threads(previous_threads)
    verdict["seconds"] = round(time.perf_counter() - t, 3)
    if replayed is None:
        verdict.update(verdict="differs", detail=failure or f"the replay ended without a scheduled checkpoint at step {end['step']}")
        return verdict
    got = replayed.trajectory[-1]
    verdict["replayed_state_sha256"] = got["state_sha256"]
    if not resume and replayed.trajectory[0]["state_sha256"] != entries[0]["state_sha256"]:
        verdict.update(verdict="differs", detail="the initial state rebuilt from the config is not the recorded one (model init or seeding differ)")
        return verdict
    if got["step"] == end["step"] and got["state_sha256"] == end["state_sha256"]:
        verdict["verdict"] = "identical"
        return verdict
    verdict["verdict"] = "differs"
    recorded_file = opened.run_dir / "checkpoints" / f"step-{end['step']}.pt"
    if got["step"] != end["step"]:
        verdict["detail"] = f"the replay reached its checkpoint at step {got['step']}, the trajectory says {end['step']}"
    elif recorded_file.is_file():
        where = trajectory_module.first_difference(replayed.state, checkpoint.load(recorded_file))
        verdict["detail"] = f"first differing tensor or value: {where}" if where else "the states differ in what the hash covers"
        verdict["first_difference"] = where
    else:
        verdict["detail"] = f"state hash {got['state_sha256'][:12]} replayed, {end['state_sha256'][:12]} recorded (the end checkpoint is not kept, so no tensor can be named)"
    return verdict
