"""`veritrain audit RUN`: check that a run's weights and results came from its recorded training without redoing it.

`verify` proves the files are the recorded ones; whoever can train can also write a consistent record.
The trajectory (veritrain.train.trajectory) commits to the training state at every scheduled
checkpoint. The audit first runs the full `verify`, then draws S segments at random among all N of the
trajectory and replays each from the nearest earlier state it can start from (the initial state, rebuilt
from the config, or a checkpoint the run kept), with the recorded config and data version on this machine,
demanding the recorded state hash at every entry on the way, bit for bit. Segments that share a start share
one replay, so any audit costs at most one pass over the run; `checkpoint.audit_every` K bounds a replay to
K segments. Then every result the record binds to an entry (metrics, export parity) is computed again from
it and compared. Training is exact on the same kind of machine, so a difference is evidence, not noise. The
auditor draws a fresh seed (printed) unless `--seed` repeats an earlier audit, so the trainer cannot know
the segments in advance. A trajectory with F forged segments escapes an audit that checked c of N segments
with probability C(N−c, F) / C(N, F).

    veritrain audit latest --segments 2
    veritrain audit RUN --segments 5 --seed 1234 --out audit.json --json

Exit codes: 0 every segment and result identical; 1 one differs (or the run does not verify); 2 the audit
cannot start (this machine cannot replay the run exactly, or the run was trained by several processes, which
a one-process replay cannot match: the reason and the check that works instead are named, and it is never
a forgery verdict).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.records.record import Record, now_iso, read_record
from veritrain.records.workspace import Workspace
from veritrain.trust.assessment import cannot_replay as cannot_replay, escape_probability, replay_blockers as replay_blockers
from veritrain.trust.policy import Policy
from veritrain.userloop import replay

if TYPE_CHECKING:
    from veritrain.trust.opening import OpenRun

log = logging.getLogger("veritrain")

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
        trust_code: bool = False, policy: Optional[Policy] = None, python: Optional[str] = None,
        inputs_root: Optional[Path] = None) -> dict[str, Any]:
    """Audit a run; returns the result (also written to `out` and to .veritrain/audits/<run>/). Raises
    UserError (exit 2) when the audit cannot start, RunFailed (exit 1) when the run does not verify under `policy`.
    Whether it can start is the assessment's `replayability`, the same fact `check`'s auditable row shows."""
    from veritrain.train import trajectory as trajectory_module
    from veritrain.trust.assessment import replayability
    from veritrain.trust.verify import verify_run

    run_dir = workspace.resolve_run(ref, "model")
    record = read_record(run_dir)
    if out is not None and (out.resolve().is_relative_to(run_dir.resolve())):
        raise UserError(f"--out {out}: inside the run folder; the audit never writes into the run (it would no longer verify)")
    entries = record.get("trajectory") or []
    script_run = replay.is_script_run(record)
    replay_facts = replayability(run_dir, record, workspace.state_dir, with_notes=True)
    if replay_facts.status in ("n/a", "not_auditable"):  # nothing a verify could change
        raise UserError(replay_facts.reason)
    # the full `veritrain verify` first (checkpoint states, keep rule, results, data and provenance included, under the
    # auditor's policy), reading no cache: a run that does not verify has nothing an audit could vouch for
    checked = verify_run(run_dir, workspace.state_dir, policy)
    if checked["problems"]:
        first = checked["problems"][0]
        raise RunFailed(f"{run_dir.name}: {first['path']}: {first['kind']} ({first.get('detail', '')}); the run does not verify, "
                        f"so its trajectory cannot be trusted: see `veritrain verify {run_dir.name}`")
    if not replay_facts.can_start:
        raise UserError(replay_facts.reason)
    notes = list(replay_facts.notes)
    starts = trajectory_module.start_points(entries, trajectory_module.kept_checkpoints(run_dir, record))
    total = len(entries) - 1
    if seed is None:
        seed = secrets.randbits(63)  # the auditor's own randomness: the trainer cannot know the segments
    import random

    chosen = sorted(random.Random(seed).sample(range(1, total + 1), min(segments, total)))
    plan = trajectory_module.stretches(chosen, set(starts))
    started = time.perf_counter()
    if script_run:
        verdicts, replays, results = _replay_script(workspace, record, plan, starts, trust_code, python, inputs_root)
    else:
        verdicts, replays, results = _replay_loop(workspace, record, plan, starts, trust_code)
    seconds = time.perf_counter() - started
    training_seconds = float((record.get("timings") or {}).get("train") or 0.0)
    checked_segments = [v for v in verdicts if v["verdict"] in ("identical", "differs")]
    differs = [v for v in verdicts if v["verdict"] == "differs"] + [r for r in results if r["verdict"] == "differs"]
    covered = len(checked_segments)
    result = {
        "run_id": run_dir.name,
        "audited_at": now_iso(),
        "seed": seed,
        "segments_total": total,
        "segments_auditable": total,  # every segment: each is replayed from the nearest earlier kept state
        "segments_drawn": chosen,
        "segments_audited": covered,  # every segment checked on the way, drawn or not
        "verdict": "differs" if differs else "identical",
        "segments": verdicts,
        "replays": replays,
        "results": results,
        "replay_seconds": round(seconds, 3),
        "training_seconds": training_seconds,
        "cost_fraction": round(seconds / training_seconds, 4) if training_seconds else None,
        # the chance that a trajectory with F forged segments escapes an audit that checked c of its N segments
        "escape_probability": {str(f): escape_probability(total, f, covered) for f in (1, 2, 5) if f <= total},
        "environment_notes": notes,
        "not_checked": checked.get("not_checked", []),
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


def _replay_loop(workspace: Workspace, record: Record, plan: list[tuple[int, int]], starts: dict[int, Any],
                 trust_code: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(segment verdicts, replays, results) of a run of veritrain's loop, each stretch replayed here."""
    from veritrain.trust import opening

    run_dir, entries = record.run_dir, record.get("trajectory") or []
    opened = opening.open_run(workspace, run_dir.name, trust_code=trust_code, need="model", verified=True)
    threads = int(((record.get("training") or {}).get("settings") or {}).get("threads") or 0)
    verdicts: list[dict[str, Any]] = []
    replays = []
    with opening.code_session(workspace, run_dir, record, "audit") as code:  # replayed with the code the run recorded
        if opened.config.model.target:
            code.import_target(opened.config.model.target)
        for start, end in plan:
            t = time.perf_counter()
            verdicts.extend(_replay_stretch(opened, entries, start, end, starts[start], threads, workspace))
            replays.append({"from_step": entries[start]["step"], "to_step": entries[end]["step"], "segments": end - start,
                            "seconds": round(time.perf_counter() - t, 3)})
        results = _check_results(opened, entries, workspace)
    return verdicts, replays, results


def _replay_script(workspace: Workspace, record: Record, plan: list[tuple[int, int]], starts: dict[int, Any],
                   trust_code: bool, python: Optional[str] = None, inputs_root: Optional[Path] = None,
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(segment verdicts, replays, results) of a script's run (veritrain.userloop): each stretch replayed by a child
    running the recorded script, which hands back the states it reaches for this process to hash. metrics.final is
    re-derived by replaying on to run.finish from the last start before the final state."""
    from veritrain.trust import opening

    opening.refuse_untrusted_code(workspace, record.run_dir, record, trust_code)
    entries = record.get("trajectory") or []
    last = len(entries) - 1
    final = (record.get("metrics") or {}).get("final")
    finish_at = None
    if isinstance(final, dict) and final.get("trajectory_entry") and record.get("status") == "completed":
        finish_at = next((start for start, end in plan if end == last), None)
        if finish_at is None:  # the shortest replay to the end: from the last start (the final state itself, when kept)
            finish_at = max(k for k in starts if k <= last)
            plan = sorted({start: end for start, end in [*plan, (finish_at, last)]}.items())  # one stretch per start, on to the end
    verdicts: list[dict[str, Any]] = []
    replays, results = [], []
    with replay.Replay(workspace, record, python, inputs_root) as replaying:
        for start, end in plan:
            t = time.perf_counter()
            found, result = replaying.stretch(start, end, starts[start], to_finish=(start, end) == (finish_at, last))
            verdicts.extend(found)
            if result is not None:
                results.append(result)
            replays.append({"from_step": entries[start]["step"], "to_step": entries[end]["step"], "segments": end - start,
                            "seconds": round(time.perf_counter() - t, 3)})
    if isinstance(final, dict) and not results:
        results.append({"what": "metrics.final", "entry": None, "step": None, "verdict": "unchecked",
                        "detail": "not re-derived: the record binds it to no entry of the trajectory, or the run did not complete"})
    return verdicts, replays, results


def _replay_stretch(opened: OpenRun, entries: list[dict[str, Any]], start: int, end: int, start_file: Optional[Path], threads: int,
                    workspace: Workspace) -> list[dict[str, Any]]:
    """Replay entry `start` → entry `end` once in a scratch folder (from the initial state when `start_file` is None)
    and compare the state hash of every entry on the way: one verdict per segment start+1 … end."""
    import torch

    from veritrain.core.errors import VeritrainError
    from veritrain.core.signals import StopFlag
    from veritrain.train import checkpoint, loop, trajectory as trajectory_module

    def verdict(index: int, **fields: Any) -> dict[str, Any]:
        return {"segment": index, "from_step": entries[index - 1]["step"], "to_step": entries[index]["step"], "epoch": entries[index]["epoch"],
                "replayed_from_step": entries[start]["step"], **fields}

    def unchecked(after: int, why: str) -> list[dict[str, Any]]:
        return [verdict(i, verdict="unchecked", detail=why) for i in range(after, end + 1)]

    scratch_root = workspace.state_dir / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    previous_threads = torch.get_num_threads()
    resume = start_file is not None
    carried = 1  # entries the replay starts with: the initial state's, or those the start checkpoint carries
    with tempfile.TemporaryDirectory(prefix=f"audit-{os.getpid()}-", dir=scratch_root) as scratch:
        run_dir = Path(scratch)
        if resume:  # the kept checkpoint (its sidecar is checked when it loads) must hold the entry's state
            saved = checkpoint.load(start_file)
            held = trajectory_module.state_sha256(saved)
            if held != entries[start]["state_sha256"]:
                return [verdict(start + 1, verdict="differs", detail=f"checkpoints/{start_file.name} holds state {held[:12]}, not entry {start}'s "
                                                                     f"{entries[start]['state_sha256'][:12]}")] + unchecked(start + 2, "its start state is not the trajectory's")
            carried = len(saved["loop"].get("trajectory") or [])
            name = f"step-{entries[start]['step']}.pt"
            (run_dir / "checkpoints").mkdir()
            shutil.copyfile(start_file, run_dir / "checkpoints" / name)
            shutil.copyfile(start_file.with_name(start_file.name + ".sha256"), run_dir / "checkpoints" / (name + ".sha256"))
        replayed: Optional[loop.ReplayDone] = None
        failure = None
        try:
            if threads:
                torch.set_num_threads(threads)
            with _quiet():
                loop.run(opened.config, opened.data, opened.task, run_dir, StopFlag(), None, resume=resume, events=[],
                         stop_at_step=entries[end]["step"])
        except loop.ReplayDone as done:
            replayed = done
        except VeritrainError as err:
            failure = str(err)
        finally:
            torch.set_num_threads(previous_threads)
    if replayed is None:
        return [verdict(start + 1, verdict="differs", detail=failure or f"the replay ended without a scheduled checkpoint at step {entries[end]['step']}")] \
            + unchecked(start + 2, "the replay stopped")
    if not resume and replayed.trajectory[0]["state_sha256"] != entries[0]["state_sha256"]:
        return [verdict(1, verdict="differs", detail="the initial state rebuilt from the config is not the recorded one (model init or seeding differ)")] \
            + unchecked(2, "the replay started from another initial state")
    new = replayed.trajectory[carried:]
    verdicts = []
    for index in range(start + 1, end + 1):
        got = new[index - start - 1] if index - start - 1 < len(new) else None
        recorded = entries[index]
        if got is None or got["step"] != recorded["step"]:
            where = "ended" if got is None else f"reached its checkpoint at step {got['step']}"
            verdicts.append(verdict(index, verdict="differs", detail=f"the replay {where}, the trajectory says step {recorded['step']}"))
        elif got["state_sha256"] == recorded["state_sha256"]:
            verdicts.append(verdict(index, verdict="identical", replayed_state_sha256=got["state_sha256"]))
            continue
        else:
            found = verdict(index, verdict="differs", replayed_state_sha256=got["state_sha256"])
            recorded_file = opened.run_dir / "checkpoints" / f"step-{recorded['step']}.pt"
            if index == end and recorded_file.is_file():
                where_first = trajectory_module.first_difference(replayed.state, checkpoint.load(recorded_file))
                found.update(detail=f"first differing tensor or value: {where_first}" if where_first else "the states differ in what the hash covers",
                             first_difference=where_first)
            else:
                found["detail"] = f"state hash {got['state_sha256'][:12]} replayed, {recorded['state_sha256'][:12]} recorded"
            verdicts.append(found)
        # every later entry of this stretch follows from the differing state: the replay cannot judge it
        return verdicts + unchecked(index + 1, f"follows segment {index}, which differs")
    return verdicts


# metrics.json fields that say where a result came from, not what it is: the rest must be equal, bit for bit
PROVENANCE = ("checkpoint", "trajectory_entry", "predictions")


def _check_results(opened: OpenRun, entries: list[dict[str, Any]], workspace: Workspace) -> list[dict[str, Any]]:
    """Every result the record binds to a trajectory entry, computed again here: each metric set re-evaluated from
    the entry's checkpoint on the recorded split and compared exactly (evaluation is order-exact), and the exports'
    parity check re-run against the entry's model."""
    import torch

    from veritrain.results import evaluate, export
    from veritrain.train.loop import resolve_device

    record, run_dir = opened.record, opened.run_dir
    found = []
    scratch_root = workspace.state_dir / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    for split, metrics in sorted((record.get("metrics") or {}).items()):
        ref = metrics.get("trajectory_entry") if isinstance(metrics, dict) else None
        if not ref:
            continue
        item = {"what": f"metrics.{split}", "entry": ref["index"], "step": ref["step"]}
        if metrics.get("data_version") not in (None, opened.data.version):
            found.append({**item, "verdict": "unchecked", "detail": f"evaluated on data version {str(metrics.get('data_version'))[:12]} (--allow-data-drift)"})
            continue
        with tempfile.TemporaryDirectory(prefix=f"audit-eval-{os.getpid()}-", dir=scratch_root) as scratch, _quiet():
            again = evaluate.run(opened.config, opened.data, opened.task, Path(scratch), resolve_device(opened.config.train.device),
                                 str(run_dir / metrics["checkpoint"]), split)
        left = json.loads(json.dumps({k: v for k, v in metrics.items() if k not in PROVENANCE}))
        right = json.loads(json.dumps({k: v for k, v in again.items() if k not in PROVENANCE}))
        keys = [k for k in sorted(set(left) | set(right)) if left.get(k) != right.get(k)]
        if "sums" not in left and "sums" in right:  # evaluated before metrics were summed exactly: reproduce's tolerance holds
            from veritrain.trust.verify import _compare

            keys = [k for k in keys if k != "sums" and _compare(k, left.get(k), right.get(k))["verdict"] == "differs"]
        found.append({**item, "verdict": "differs" if keys else "identical",
                      "detail": f"{len(keys)} value(s) differ, first {keys[0]}: recorded {str(left.get(keys[0]))[:40]}, now {str(right.get(keys[0]))[:40]}"
                      if keys else f"{len(left)} values equal" + ("" if "sums" in left else " (within 1e-6: evaluated before exact sums)")})
    found.extend(_check_baselines(opened))
    exported = record.get("export") or {}
    ref = exported.get("trajectory_entry")
    if ref and exported.get("files"):
        item = {"what": "export parity", "entry": ref["index"], "step": ref["step"]}
        model, _ = evaluate.load_model(opened.config, opened.data, opened.task, run_dir / exported["checkpoint"], torch.device("cpu"))
        files = {name: entry["file"] for name, entry in exported["files"].items()}
        with _quiet():
            parity = export.check_parity(opened.config, opened.data, opened.task, model.float().eval(), run_dir / "export", files, write=False)
        found.append({**item, "verdict": "identical" if parity["passed"] else "differs",
                      "detail": ", ".join(f"{k} max |Δlogit| {v['max_abs_diff']:.2e}" for k, v in parity["formats"].items())
                      + ("" if parity["passed"] else f"; {parity['reason']}")})
    return found


BASELINE_TOLERANCE = 1e-9  # relative: a baseline's fit sums in BLAS, whose thread count may round the last bits


def _check_baselines(opened: OpenRun) -> list[dict[str, Any]]:
    """The baselines the record compares the model with (`beats_baseline`), fitted again on the run's data version and
    compared value by value: a forger who lowers a baseline to make a model beat it is caught here."""
    recorded = opened.record.get("baselines")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("results"), dict):
        return []
    item: dict[str, Any] = {"what": "baselines", "entry": None, "step": None}
    from veritrain.trust import formats

    if formats.declared(opened.record) < 1:  # an earlier veritrain may have fitted them another way: no forgery verdict
        return [{**item, "verdict": "unchecked", "detail": "fitted by a veritrain before record format 1, which this one may not fit alike"}]
    fit = getattr(opened.task, "baselines", None)
    if fit is None:
        return [{**item, "verdict": "unchecked", "detail": f"the task {opened.record.get('task')} fits no baselines of its own"}]
    with _quiet():
        again = fit(opened.data, opened.config)
    differing = []
    for name in sorted(set(recorded["results"]) | set(again.get("results") or {})):
        left, right = recorded["results"].get(name) or {}, (again.get("results") or {}).get(name) or {}
        for key in sorted(set(left) | set(right)):
            a, b = left.get(key), right.get(key)
            close = isinstance(a, float) and isinstance(b, float) and abs(a - b) <= BASELINE_TOLERANCE * max(1.0, abs(a), abs(b))
            if a != b and not close:
                differing.append(f"{name}.{key}: recorded {str(a)[:24]}, fitted again {str(b)[:24]}")
    margin_now = opened.config.eval.baseline_margin
    if recorded.get("margin") not in (None, margin_now):
        differing.append(f"margin: recorded {recorded.get('margin')}, the config's eval.baseline_margin {margin_now}")
    return [{**item, "verdict": "differs" if differing else "identical",
             "detail": f"{len(differing)} value(s) differ, first {differing[0]}" if differing
             else f"{sum(len(v) for v in recorded['results'].values() if isinstance(v, dict))} values equal (fitted again on the data version)"}]
