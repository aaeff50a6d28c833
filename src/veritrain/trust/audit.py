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
import random
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from veritrain.core import child
from veritrain.core.errors import RunFailed, UserError
from veritrain.core.files import output_file_problem, write_atomic
from veritrain.core.task_registry import spec_of_record, task_spec, task_target
from veritrain.records import usercode
from veritrain.records.record import Record, now_iso, read_record
from veritrain.records.workspace import Workspace
from veritrain.train import trajectory as trajectory_module
from veritrain.trust import formats
from veritrain.trust.assessment import (
    cannot_replay as cannot_replay,
    escape_probability,
    rederivation,
    replay_blockers as replay_blockers,
    replayability,
)
from veritrain.trust.policy import Policy
from veritrain.userloop import replay

log = logging.getLogger("veritrain")

def run(workspace: Workspace, ref: str, segments: int = 2, seed: Optional[int] = None, out: Optional[Path] = None,
        trust_code: bool = False, policy: Optional[Policy] = None, python: Optional[str] = None,
        inputs_root: Optional[Path] = None) -> dict[str, Any]:
    """Audit a run; returns the result (also written to `out` and to .veritrain/audits/<run>/). Raises
    UserError (exit 2) when the audit cannot start, RunFailed (exit 1) when the run does not verify under `policy`.
    Whether it can start is the assessment's `replayability`, the same fact `check`'s auditable row shows."""

    run_dir = workspace.resolve_run(ref, "model")
    record = read_record(run_dir)
    if out is not None and (out.resolve().is_relative_to(run_dir.resolve())):
        raise UserError(f"--out {out}: inside the run folder; the audit never writes into the run (it would no longer verify)")
    if out is not None and (problem := output_file_problem(out)) is not None:
        raise UserError(f"--out {out}: {problem}")
    script_run = replay.is_script_run(record)
    replay_facts = replayability(run_dir, record, workspace.state_dir, with_notes=True, inputs_root=inputs_root)
    if replay_facts.status in ("n/a", "not_auditable"):  # nothing a verify could change
        raise UserError(replay_facts.reason)
    with contextlib.ExitStack() as stack:
        # a run of veritrain's loop: its replay's child starts now, so that its imports overlap the verify (it is
        # given its job only once the run verifies, and ended unused otherwise)
        waiting = stack.enter_context(_waiting_child(workspace, record, python)) if not script_run and replay_facts.can_start else None
        return _audit(workspace, run_dir, record, replay_facts, segments, seed, out, trust_code, policy, python, inputs_root, waiting)


def _audit(workspace: Workspace, run_dir: Path, record: Record, replay_facts: Any, segments: int, seed: Optional[int], out: Optional[Path],
           trust_code: bool, policy: Optional[Policy], python: Optional[str], inputs_root: Optional[Path],
           waiting: Optional[tuple[Any, Path]]) -> dict[str, Any]:
    from veritrain.trust.verify import state_cache_dir, verify_run

    entries = record.get("trajectory") or []
    script_run = replay.is_script_run(record)
    # the full `veritrain verify` first (checkpoint states, keep rule, results, data and provenance included, under the
    # auditor's policy): a run that does not verify has nothing an audit could vouch for. Only the state hashes this
    # user's veritrain kept in its own cache folder are reused, by the SHA-256 of each checkpoint's bytes
    checked = verify_run(run_dir, workspace.state_dir, policy, state_cache=state_cache_dir())
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

    chosen = sorted(random.Random(seed).sample(range(1, total + 1), min(segments, total)))
    plan = trajectory_module.stretches(chosen, set(starts))
    started = time.perf_counter()
    if script_run:
        verdicts, replays, results = _replay_script(workspace, record, plan, starts, trust_code, python, inputs_root)
    else:
        assert waiting is not None
        verdicts, replays, results = _replay_loop(workspace, record, plan, starts, trust_code, waiting)
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


@contextlib.contextmanager
def _waiting_child(workspace: Workspace, record: Record, python: Optional[str]) -> Iterator[tuple[Any, Path]]:
    """(the child that will replay a run of veritrain's loop, started now and waiting for its job; its scratch folder)."""

    root = workspace.state_dir / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"audit-{os.getpid()}-", dir=root) as folder, \
            child.Waiting(child.interpreter(python), "veritrain.trust.replay_child", Path(folder),
                          (record.get("env") or {}).get("variables") or {}) as waiting:
        yield waiting, Path(folder)


def _replay_loop(workspace: Workspace, record: Record, plan: list[tuple[int, int]], starts: dict[int, Any], trust_code: bool,
                 waiting: tuple[Any, Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(segment verdicts, replays, results) of a run of veritrain's loop: one child process (veritrain.trust.replay_child,
    `waiting` for its job) replays every stretch and computes every result again from copies; the states it hands
    back are hashed here. The data version is the one the verify just checked, read by the child from the store."""
    from veritrain.trust import opening

    opening.refuse_untrusted_code(workspace, record.run_dir, record, trust_code)
    version = str((record.get("data") or {}).get("version"))
    child_process, scratch = waiting
    job = _loop_job(record, plan, starts, workspace.state_dir / "data" / version, scratch)
    t = time.perf_counter()
    child_process.send(scratch / "job.json")
    # while the child replays: each start checkpoint must hold its entry's state (the verify checked it too); a
    # stretch whose start does not is judged here, and what the child made of it is not read
    entries = record.get("trajectory") or []
    early = {start: [replay.verdict(entries, start, start + 1, verdict="differs", detail=f"checkpoints/{starts[start].name} {problem}")]
             + replay.unchecked(entries, start, start + 2, end, "its start state is not the trajectory's")
             for start, end in plan if starts[start] is not None and (problem := replay.holds(None, starts[start], entries[start]))}
    done = child_process.wait()
    seconds = time.perf_counter() - t
    lines = [str(line) for line in (done.stderr or "").strip().splitlines()]
    failure = lines[-1:] if done.returncode else []
    verdicts, replays = [], []
    for stretch in job["stretches"]:
        start, end = stretch["start"], stretch["end"]
        verdicts.extend(early.get(start) or _judge_stretch(record, stretch, failure))
        replays.append({"from_step": record["trajectory"][start]["step"], "to_step": record["trajectory"][end]["step"],
                        "segments": end - start, "seconds": round(seconds / max(1, len(job["stretches"])), 3)})
    results = [_judge_result(record, item, version, [line for line in lines if line.startswith(f"error: {item['what']}:")][-1:] or failure)
               for item in job["results"]]
    rederived, not_rederived = rederivation(record)
    computed = {item["what"] for item in job["results"]}
    results += [{"what": what, "entry": None, "step": None, "verdict": "unchecked", "detail": "not re-derived: the checkpoint it came from is not here"}
                for what in rederived if what not in computed]
    results += [{"what": what.split(" (")[0], "entry": None, "step": None, "verdict": "unchecked", "detail": f"not re-derived: {what}"}
                for what in not_rederived]
    return verdicts, replays, results


def _loop_job(record: Record, plan: list[tuple[int, int]], starts: dict[int, Any], data: Path, scratch: Path) -> dict[str, Any]:
    """The child's job (written to scratch/job.json), with copies of everything it reads."""

    run_dir, entries = record.run_dir, record.get("trajectory") or []
    listing, only_target = usercode.recorded_listing(record)
    usercode.copy_recorded(run_dir, listing, scratch / "code")
    roots = [str(scratch / "code")] + ([str(Path.cwd())] if only_target else [])
    (scratch / "recorded.json").write_bytes((run_dir / "record.json").read_bytes())  # a copy the child reads the config from
    threads = int(((record.get("training") or {}).get("settings") or {}).get("threads") or 0)
    # a task an installed package's entry point names: where its class is, as this process's installation says (the
    # child sees no import path but the copies, nor the packages' entry points outside its site-packages)
    task = str(record["config"].get("task"))
    job: dict[str, Any] = {"record": str(scratch / "recorded.json"), "data": str(data), "roots": roots, "threads": threads,
                           "task_target": task_target(task), "stretches": [], "results": []}
    for start, end in plan:
        stretch: dict[str, Any] = {"start": start, "end": end, "start_step": entries[start]["step"], "stop_step": entries[end]["step"],
                                   "run_dir": str(scratch / f"run-{start}"), "out": str(scratch / f"states-{start}"), "start_file": None}
        Path(stretch["out"]).mkdir()
        if starts[start] is not None:
            stretch["start_file"] = str(scratch / f"start-{start}.pt")
            shutil.copyfile(starts[start], stretch["start_file"])
        job["stretches"].append(stretch)
    results = scratch / "results"
    results.mkdir()
    for split, metrics in sorted((record.get("metrics") or {}).items()):
        ref = metrics.get("trajectory_entry") if isinstance(metrics, dict) else None
        if not ref or not (run_dir / str(metrics.get("checkpoint"))).is_file():
            continue
        copy = results / f"{split}.pt"
        _copy_checkpoint(run_dir / str(metrics["checkpoint"]), copy)
        job["results"].append({"kind": "metrics", "what": f"metrics.{split}", "split": split, "checkpoint": str(copy), "out": str(results / f"{split}.json"),
                               "entry": ref["index"], "step": ref["step"]})
    baselines = record.get("baselines")
    if isinstance(baselines, dict) and isinstance(baselines.get("results"), dict):
        job["results"].append({"kind": "baselines", "what": "baselines", "out": str(results / "baselines.json"), "entry": None, "step": None,
                               "format": formats.declared(record)})
    exported = record.get("export") or {}
    if exported.get("trajectory_entry") and exported.get("files") and (run_dir / str(exported.get("checkpoint"))).is_file():
        shutil.copytree(record.path("export/model.json").parent, results / "export")  # the run's export/, or its amendment's
        _copy_checkpoint(run_dir / str(exported["checkpoint"]), results / "export.pt")
        job["results"].append({"kind": "export", "what": "export parity", "checkpoint": str(results / "export.pt"), "export_dir": str(results / "export"),
                               "files": {name: entry["file"] for name, entry in exported["files"].items()}, "out": str(results / "export.json"),
                               "entry": exported["trajectory_entry"]["index"], "step": exported["trajectory_entry"]["step"]})
    write_atomic(scratch / "job.json", json.dumps(job).encode())
    return job


def _copy_checkpoint(source: Path, target: Path) -> None:
    """A copy of one of the run's checkpoints with its sidecar (the child loads it as the run's own)."""
    shutil.copyfile(source, target)
    sidecar = source.with_name(source.name + ".sha256")
    if sidecar.is_file():
        shutil.copyfile(sidecar, target.with_name(target.name + ".sha256"))


def _judge_stretch(record: Record, stretch: dict[str, Any], failure: list[str]) -> list[dict[str, Any]]:
    """The verdicts on one stretch's states, handed back by the child and hashed here; the first difference named
    down to the tensor when the run kept that entry's checkpoint."""
    from veritrain.train import checkpoint, trajectory as trajectory_module

    out, entries = Path(stretch["out"]), record.get("trajectory") or []
    failed = out / "failed.txt"
    why = failed.read_text(encoding="utf-8").strip() if failed.is_file() else (failure[0][:200] if failure else None)
    verdicts = replay.judge(entries, None, out, stretch["start"], stretch["end"], why)
    kept = trajectory_module.kept_checkpoints(record.run_dir, record)
    for item in verdicts:
        index = item["segment"]
        if item["verdict"] == "differs" and item.get("replayed_state_sha256") and index in kept:
            try:
                where = trajectory_module.first_difference(checkpoint.decode(out / f"entry-{index}.pt", (out / f"entry-{index}.pt").read_bytes()),
                                                           checkpoint.load(kept[index]))
            except Exception:  # noqa: BLE001 - the detail is a courtesy; the verdict stands without it
                continue
            item.update(detail=f"first differing tensor or value: {where}" if where else "the states differ in what the hash covers",
                        first_difference=where)
    return verdicts


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
    finish_at = None
    if "metrics.final" in rederivation(record)[0]:
        latest = _finish_start(record, starts)
        finish_at = next((start for start, end in plan if end == last and start <= latest), None)
        if finish_at is None:  # the shortest replay that re-derives the results
            finish_at = latest
            plan = [(start, end) for start, end in plan if start < finish_at] + [(finish_at, last)]  # it covers every later stretch
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
    results += [{"what": what.split(" (")[0], "entry": None, "step": None, "verdict": "unchecked", "detail": f"not re-derived: {what}"}
                for what in rederivation(record)[1]]
    return verdicts, replays, results


def _finish_start(record: Record, starts: dict[int, Any]) -> int:
    """The latest start a replay that re-derives metrics.final can begin at: the final state itself (kept) for a script's
    own loop, whose run.finish metrics come after its training; for Lightning, whose metrics at the end of fit are the
    last epoch's (training and validation), a start no later than that epoch's first step."""
    entries = record.get("trajectory") or []
    bound = entries[-1]["step"]
    if (record.get("script") or {}).get("integration") == "lightning":
        training = record.get("training") or {}
        steps, epochs = int(training.get("steps") or 0), int(training.get("epochs") or 0)
        bound = steps - -(-steps // epochs) if epochs else 0
    return max((k for k in starts if entries[k]["step"] <= bound), default=min(starts))


# metrics.json fields that say where a result came from, not what it is: the rest must be equal, bit for bit
PROVENANCE = ("checkpoint", "trajectory_entry", "predictions")


def _judge_result(record: Record, item: dict[str, Any], version: str, failure: list[str]) -> dict[str, Any]:
    """A result the child computed again from a copy of its entry's checkpoint, compared here with the recorded one:
    a metric set exactly (evaluation is order-exact), the exports' parity, the baselines value by value."""
    found = {"what": item["what"], "entry": item["entry"], "step": item["step"]}
    out = Path(item["out"])
    if item["kind"] == "metrics" and (record["metrics"][item["split"]].get("data_version") not in (None, version)):
        data_version = str(record["metrics"][item["split"]].get("data_version"))
        return {**found, "verdict": "unchecked", "detail": f"evaluated on data version {data_version[:12]} (--allow-data-drift)"}
    if item["kind"] == "baselines" and item["format"] < 1:  # an earlier veritrain may have fitted them another way: no forgery verdict
        return {**found, "verdict": "unchecked", "detail": "fitted by a veritrain before record format 1, which this one may not fit alike"}
    if not out.is_file():
        return {**found, "verdict": "differs", "detail": f"not computed again{': ' + failure[0][:200] if failure else ''}"}
    again = json.loads(out.read_text(encoding="utf-8"))["result"]
    if item["kind"] == "metrics":
        recorded = record["metrics"][item["split"]]
        return {**found, **_compare_metrics(recorded, _as_recorded(record, again, recorded))}
    if item["kind"] == "export":
        return {**found, "verdict": "identical" if again["passed"] else "differs",
                "detail": ", ".join(f"{k} max |Δlogit| {v['max_abs_diff']:.2e}" for k, v in again["formats"].items())
                + ("" if again["passed"] else f"; {again['reason']}")}
    if again is None:
        return {**found, "verdict": "unchecked", "detail": f"the task {record.get('task')} fits no baselines of its own"}
    return {**found, **_compare_baselines(record, again)}


def _as_recorded(record: Record, again: dict[str, Any], recorded: Any) -> dict[str, Any]:
    """Metrics computed now under the older names the record holds them by (TaskSpec.as_recorded): a run of an
    earlier veritrain is compared under the names it recorded. The renames are the task's declaration (the
    installed one's first): they say which names mean the same number, and a forged value still differs."""

    spec = spec_of_record({"config": record.get("config")}) or spec_of_record(dict(record))
    return spec.as_recorded(again, recorded) if spec is not None and isinstance(recorded, dict) else again


def _compare_metrics(metrics: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    left = json.loads(json.dumps({k: v for k, v in metrics.items() if k not in PROVENANCE}))
    right = json.loads(json.dumps({k: v for k, v in again.items() if k not in PROVENANCE}))
    keys = [k for k in sorted(set(left) | set(right)) if left.get(k) != right.get(k)]
    before_exact_sums = "sums" not in left and "sums" in right
    if before_exact_sums:  # evaluated before metrics were summed exactly: reproduce's tolerance holds
        from veritrain.trust.verify import compare_values

        keys = [k for k in keys if k != "sums" and compare_values(k, left.get(k), right.get(k))["verdict"] == "differs"]
    return {"verdict": "differs" if keys else "identical",
            "detail": f"{len(keys)} value(s) differ, first {keys[0]}: recorded {str(left.get(keys[0]))[:40]}, now {str(right.get(keys[0]))[:40]}"
            if keys else f"{len(left)} values equal" + (" (within 1e-6: evaluated before exact sums)" if before_exact_sums else "")}


BASELINE_TOLERANCE = 1e-9  # relative: a baseline's fit sums in BLAS, whose thread count may round the last bits


def _declared_rule(record: Record) -> Any:
    """The baseline rule the run's task declares in the installed code (None when it declares none)."""

    return task_spec(str(record["config"].get("task"))).baseline_rule()


def _compare_baselines(record: Record, again: dict[str, Any]) -> dict[str, Any]:
    """The baselines the record compares the model with (`beats_baseline`), fitted again on the run's data version and
    compared value by value: a forger who lowers a baseline to make a model beat it is caught here."""
    from veritrain.core.config import resolved_from_record

    recorded = record["baselines"]
    differing = []
    for name in sorted(set(recorded["results"]) | set(again.get("results") or {})):
        left = recorded["results"].get(name) or {}
        right = _as_recorded(record, (again.get("results") or {}).get(name) or {}, left)
        for key in sorted(set(left) | set(right)):
            a, b = left.get(key), right.get(key)
            close = isinstance(a, float) and isinstance(b, float) and abs(a - b) <= BASELINE_TOLERANCE * max(1.0, abs(a), abs(b))
            if a != b and not close:
                differing.append(f"{name}.{key}: recorded {str(a)[:24]}, fitted again {str(b)[:24]}")
    margin_now = resolved_from_record(record).config.eval.baseline_margin
    declared = _declared_rule(record)
    if recorded.get("judged_by") is not None and recorded.get("judged_by") != declared:
        differing.append(f"judged_by: recorded {recorded.get('judged_by')}, the task declares {declared}")
    if recorded.get("margin") not in (None, margin_now):
        differing.append(f"margin: recorded {recorded.get('margin')}, the config's eval.baseline_margin {margin_now}")
    return {"verdict": "differs" if differing else "identical",
            "detail": f"{len(differing)} value(s) differ, first {differing[0]}" if differing
            else f"{sum(len(v) for v in recorded['results'].values() if isinstance(v, dict))} values equal (fitted again on the data version)"}
