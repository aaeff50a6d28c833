"""One assessment of a run: every fact the views show, computed once, as typed values.

`verify`, `check`, audit's pre-check, the run page and `publish` are views of an `Assessment`; none of them computes
a predicate of its own, so two of them cannot disagree (`check` said "auditable" where `audit` refused the same run
while each had its own rule). What it covers:

- the seal, every file, the trajectory and each result's entry, the data version, the code and the provenance
  statement, under the checker's policy (veritrain.trust.verify, veritrain.trust.policy), with the record format it was
  judged under (veritrain.trust.formats) and who signed it;
- whether the run can be replayed by `audit`, and if not why (`replayability`);
- whether its test result beats its baseline (veritrain.core.baselines).

Nothing is taken from the workspace on trust: the verdict is computed here (a kept verdict is only shown by the views
that never hash: `runs list`, the runs table, marked stale or not).
"""

from __future__ import annotations

import math
import platform
import shlex
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Optional

from veritrain.core.baselines import Judgement, judge
from veritrain.core.errors import RunFailed, UserError
from veritrain.core.task_registry import task_spec
from veritrain.records.record import cpu_name, package_list, read_record
from veritrain.records.usercode import CODE_DIR, recorded_listing
from veritrain.train import trajectory
from veritrain.trust.policy import Policy
from veritrain.userloop import replay


@dataclass(frozen=True)
class Replayability:
    """Whether `veritrain audit` can replay every segment of the run's trajectory, on this machine."""

    status: str  # "auditable", "n/a" (no trajectory), "not_auditable" (the run itself cannot be replayed exactly),
    #              "incomplete" (something a replay needs is not here), "broken" (the kept checkpoints break the keep rule),
    #              "not_here" (this machine differs from the recorded one)
    reason: str  # why, in one line (for audit's refusal and check's detail)
    fix: Optional[str] = None  # the command or step that makes it auditable
    notes: tuple[str, ...] = ()  # differences of this machine that do not block a replay
    longest: Optional[tuple[int, int]] = None  # the longest replay a segment needs: (segments, steps)

    @property
    def can_start(self) -> bool:
        return self.status == "auditable"


@dataclass
class Assessment:
    """The facts of one run. `verified` is verify's answer (seal, problems, drift, not_checked, format, signer)."""

    run_dir: Path
    record: Optional[dict[str, Any]]
    policy: Policy
    verified: dict[str, Any]
    replay: Replayability
    baseline: Judgement
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def ok(self) -> bool:
        return bool(self.verified.get("ok"))


def assess(run_dir: Path, state_dir: Path, policy: Optional[Policy] = None, *, verified: Optional[dict[str, Any]] = None,
           keep: bool = True, use_cache: bool = True, progress: Any = None) -> Assessment:
    """The assessment of the run in `run_dir` under `policy`. `verified`: verify's answer when the caller has just
    computed it under the same policy (it is not computed twice); `keep`: keep the verdict for the views that never
    hash; `use_cache` False loads every checkpoint (audit reads no cache)."""
    from veritrain.trust.verify import state_cache_dir, verify_and_keep, verify_run

    policy = policy or Policy()
    if verified is None:
        if keep and use_cache:
            verified = verify_and_keep(run_dir, state_dir, policy, progress=progress)
        else:
            verified = verify_run(run_dir, state_dir, policy, progress=progress, state_cache=state_cache_dir() if use_cache else None)
    try:
        record: Optional[dict[str, Any]] = dict(read_record(run_dir))
    except RunFailed:
        record = None
    if record is None:
        return Assessment(run_dir, None, policy, verified, Replayability("n/a", "the record cannot be read"), judge(None, None))
    return Assessment(run_dir, record, policy, verified, replayability(run_dir, record, state_dir), baseline_of(record))


def baseline_of(record: Mapping[str, Any]) -> Judgement:
    """The judgement of the run's test metrics against its baselines."""

    try:  # the installed declaration of the run's task, never the record's copy of it
        declared = task_spec(str((record.get("config") or {}).get("task"))).baseline_rule()
    except UserError:
        declared = None
    return judge((record.get("metrics") or {}).get("test"), record.get("baselines"), declared)


AUDIT_EVERY_FIX = 1  # the fix for a run a segment of which has no start keeps every scheduled checkpoint for audit


def rederivation(record: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(the results an audit computes again and compares, the others each with why not): one answer for audit's
    results and check's row. A run of veritrain's loop: every metric set and the exports' parity, from the entry's
    checkpoint; a script's replayable run: metrics.final, by replaying on to run.finish. A result bound to no
    trajectory entry, or a run that is not replayed, is not re-derived."""

    results = [(f"metrics.{split}", m) for split, m in (record.get("metrics") or {}).items() if isinstance(m, dict)]
    if (record.get("export") or {}).get("files"):
        results.append(("export parity", record["export"]))
    script = replay.is_script_run(record)
    level = ((record.get("guarantee") or {}).get("level")) if script else None
    done, not_done = [], []
    for what, result in results:
        why = ("it names no trajectory entry" if not result.get("trajectory_entry")
               else f"a {level or 'unknown'} run is not replayed" if script and level != "replayable"
               else "the script's run did not complete" if script and record.get("status") != "completed"
               else "a script's run re-derives only the metrics passed to run.finish" if script and what != "metrics.final" else None)
        if why:
            not_done.append(f"{what} ({why})")
        else:
            done.append(what)
    return done, not_done


def selected_entry(record: Mapping[str, Any]) -> Optional[int]:
    """The trajectory entry the run's test report must come from: the one validation selected (best.pt's, the best
    validation's entry), else the final one; None for a run without a trajectory."""

    entries = record.get("trajectory") or []
    if len(entries) < 2:
        return None
    if isinstance((record.get("selection") or {}).get("best_checkpoint"), Mapping) or (record.get("training") or {}).get("best_epoch"):
        best = trajectory.best_entry(entries, record.get("training"))
        if best is not None:
            return best
    return len(entries) - 1


def selected_checkpoints(record: Mapping[str, Any]) -> set[str]:
    """The names of the run's checkpoints that hold the entry validation selected (`selected_entry`); empty without one."""
    entries = record.get("trajectory") or []
    selected = selected_entry(record)
    if selected is None:
        return set()
    names = {f"checkpoints/step-{entries[selected]['step']}.pt"}
    if isinstance((record.get("selection") or {}).get("best_checkpoint"), Mapping) or (record.get("training") or {}).get("best_epoch"):
        names.add("checkpoints/best.pt")
    if selected == len(entries) - 1:
        names.add("checkpoints/last.pt")
    if entries[selected].get("file"):
        names.add(str(entries[selected]["file"]))
    return names


def test_history(record: Mapping[str, Any]) -> tuple[list[str], Optional[str]]:
    """Every evaluation of the test split over the run's life (its own, and each `eval` of it since, as its events
    say), in words, and why they break "test: final report only", or None: the test metrics must come from the entry
    validation selected (`selected_entry`), and no other checkpoint may have been evaluated on test (threat: evaluate
    several checkpoints on test and keep the best; each is in the run's history, which its seals keep)."""
    entries = record.get("trajectory") or []
    selected = selected_entry(record)
    if selected is None:
        return [], None
    allowed = selected_checkpoints(record)
    history = []
    for event in record.get("events") or []:
        detail = str(event.get("detail") or "") if isinstance(event, Mapping) else ""
        if event.get("kind") == "eval" and " on test: " in detail:
            history.append(detail.split(" on test: ", 1)[0])
    test = (record.get("metrics") or {}).get("test")
    entry = (test.get("trajectory_entry") or {}).get("index") if isinstance(test, Mapping) else None
    shown = [f"test evaluated on {name}" for name in history]
    others = sorted({name for name in history if name not in allowed})
    if isinstance(entry, int) and entry != selected:
        return shown, (f"metrics.test come from trajectory entry {entry} (step {entries[entry]['step']}), but validation selected "
                       f"entry {selected} (step {entries[selected]['step']})")
    if others:
        return shown, f"test was evaluated on {', '.join(others)} too, a checkpoint validation did not select"
    return shown, None


def replayability(run_dir: Path, record: Mapping[str, Any], state_dir: Path, with_notes: bool = False,
                  inputs_root: Optional[Path] = None) -> Replayability:
    """Whether audit can replay every segment of the trajectory here: each from the nearest earlier state the run keeps
    (the initial state always counts), exactly. The run itself must allow it (deterministic kernels, no torch.compile,
    one process, a script at the `replayable` level); what a replay needs must be here (the data version, the recorded
    code, the checkpoints the keep rule keeps); and this machine must be like the recorded one."""

    run = run_dir.name
    entries = record.get("trajectory") or []
    new_run = new_run_fix(run_dir, record)
    if len(entries) < 2:
        return Replayability("n/a", f"{run}: the record has no trajectory to replay (a baseline run, a run of an outside checkpoint, one made "
                                    "before trajectories, or one stopped before its first checkpoint)")
    if replay.is_script_run(record):
        why = replay.refusal(record, "audit")
        if why:
            return Replayability("not_auditable", why, "make the run replayable (docs/api.md: guarantee levels) in a new run")
        cwd = inputs_root or (record.get("script") or {}).get("cwd")
        if not cwd or not Path(str(cwd)).is_dir():  # the replay of a script reads its inputs in its recorded working directory
            return Replayability("incomplete", f"{run}: the {'--inputs-root' if inputs_root else 'recorded working directory'} {cwd} is not here; "
                                 "the replay reads the inputs there",
                                 f"audit it where the script ran (`veritrain runs show {run}`), or give --inputs-root DIR where its inputs are")
    blockers = intrinsic_blockers(record)
    world_size = int((record.get("distributed") or {}).get("world_size", 1))
    if blockers or world_size > 1:  # the message names the check that works instead
        fix = f"{new_run} --set train.deterministic=true --set train.compile=false" if blockers else f"veritrain reproduce {run}"
        return Replayability("not_auditable", cannot_replay(run, record, blockers + (machine_blockers(record, run_dir, False)[0] if world_size > 1 else [])) or "", fix)
    from veritrain.trust.verify import omitted_for_audit

    present = {p.relative_to(run_dir).as_posix() for p in (run_dir / "checkpoints").glob("*") if p.is_file()} if (run_dir / "checkpoints").is_dir() else set()
    broken = trajectory.keep_rule_problems(dict(record), present, omitted_for_audit(run_dir, dict(record)))
    if broken:
        return Replayability("broken", f"{run}: the kept checkpoints do not follow the keep rule: {broken[0]['path']}: {broken[0]['detail']}",
                             f"restore the run's checkpoints (import its archive again); `veritrain verify {run}` lists them")
    version = (record.get("data") or {}).get("version")
    if not replay.is_script_run(record) and (not version or not (state_dir / "data" / str(version) / "version.json").is_file()):
        return Replayability("incomplete", f"{run}: the data version {str(version)[:12]} is not here: a replay needs it",
                             f"veritrain data prepare {config_path(run_dir)} (or import the run's archive made --with-data)")
    absent = [entry["path"] for entry in recorded_listing(dict(record))[0] if not (run_dir / CODE_DIR / str(entry["path"])).is_file()]
    if absent:
        return Replayability("incomplete", f"{run}: the recorded code {CODE_DIR}/{absent[0]} is not here: a replay runs it",
                             f"import the run's archive again; `veritrain verify {run}` lists what is missing")
    longest = trajectory.longest_stretch(entries, set(trajectory.start_points(entries, trajectory.kept_checkpoints(run_dir, dict(record)))))
    if longest is None:
        return Replayability("incomplete", f"{run}: a segment has no earlier state to replay from (the trajectory does not start at the initial state)",
                             f"{new_run} --set checkpoint.audit_every={AUDIT_EVERY_FIX}")
    here, notes = machine_blockers(record, run_dir, with_notes)
    if here:
        return Replayability("not_here", cannot_replay(run, record, here) or "", f"audit it on a machine like the recorded one (`veritrain runs show {run}`)",
                             tuple(notes), longest)
    segments, steps = longest
    detail = f"all {len(entries) - 1} segments auditable; the longest replay a segment needs: {segments} segment(s), {steps} steps"
    if segments > 1 and not any(e.get("kept_for_audit") for e in entries):
        detail += " (checkpoint.audit_every keeps more start points)"
    return Replayability("auditable", detail, f"{new_run} --set checkpoint.audit_every={AUDIT_EVERY_FIX}", tuple(notes), longest)


def config_path(run_dir: Path) -> str:
    """The run's config.yaml as a command typed here can name it: relative to the current directory when the run is
    below it, else absolute (with --workdir the workspace is elsewhere)."""

    path = run_dir / "config.yaml"
    try:
        return shlex.quote(path.resolve().relative_to(Path.cwd().resolve()).as_posix())
    except ValueError:
        return shlex.quote(str(path.resolve()))


def new_run_fix(run_dir: Path, record: Mapping[str, Any]) -> str:
    """The command that starts a new run of this run's config, of the same kind."""
    command = {"train": "train", "baseline": "baseline"}.get(record.get("kind") or "run", "run")
    return f"veritrain {command} {config_path(run_dir)}"


# packages whose version decides the numbers of a replay; any other difference is shown, not blocking
DECISIVE_PACKAGES = ("torch", "numpy", "veritrain")


def escape_probability(total: int, forged: int, covered: int) -> float:
    """The chance that F forged segments, placed anywhere among N, all lie outside the c segments an audit checked:
    C(N−c, F) / C(N, F)."""
    if covered > total or forged > total:
        return 0.0
    return math.comb(total - covered, forged) / math.comb(total, forged)


def intrinsic_blockers(record: Mapping[str, Any]) -> list[str]:
    """Why the run itself cannot be replayed bit for bit, on any machine: how it was trained."""
    cfg = record.get("config") or {}
    train_cfg = cfg.get("train") if record.get("kind") != "script" else None  # a script's config is the user's own: its level says
    train_cfg = train_cfg if isinstance(train_cfg, dict) else {}
    blockers = []
    if not train_cfg.get("deterministic", True):
        blockers.append("train.deterministic is false: the run used non-deterministic kernels")
    if train_cfg.get("compile"):
        blockers.append("train.compile is true: torch.compile is outside the bit-exact promise")
    return blockers


def machine_blockers(record: Mapping[str, Any], run_dir: Path, with_notes: bool = True) -> tuple[list[str], list[str]]:
    """(why this machine cannot replay the run exactly, differences shown but not blocking; with `with_notes` False the
    second is empty, and only the packages that decide a replay's numbers are compared)."""

    env, training = record.get("env") or {}, record.get("training") or {}
    blockers, notes = [], []
    device = str((training.get("settings") or {}).get("device") or env.get("device") or "cpu")
    if device.startswith("cuda"):
        import torch  # only for a CUDA run: the checklist and the run page never import torch for a CPU one

        if not torch.cuda.is_available():
            blockers.append(f"the run trained on {device}; this machine has no CUDA device")
    for key, now in (("python", platform.python_version()), ("machine", platform.machine())):
        if env.get(key) and env[key] != now:
            blockers.append(f"{key} {env[key]} recorded, {now} here")
    recorded_cpu = env.get("cpu")
    if recorded_cpu and recorded_cpu != cpu_name() and not device.startswith("cuda"):
        blockers.append(f"CPU {recorded_cpu!r} recorded, {cpu_name()!r} here (kernels may round differently)")
    lock = run_dir / "env" / "requirements.lock"
    if lock.exists():
        recorded = _versions(lock.read_text(encoding="utf-8"))
        # every package's metadata takes about 0.4 s to read: only an audit, which shows the notes, reads them all
        here = _versions(package_list()) if with_notes else {name: version for name in DECISIVE_PACKAGES if (version := _installed(name))}
        for name in sorted(set(recorded) | set(here)) if with_notes else DECISIVE_PACKAGES:
            if recorded.get(name) == here.get(name):
                continue
            text = f"{name} {recorded.get(name, 'absent')} recorded, {here.get(name, 'absent')} here"
            (blockers if name in DECISIVE_PACKAGES else notes).append(text)
    return blockers, notes


def _installed(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def replay_blockers(record: Mapping[str, Any], run_dir: Path) -> tuple[list[str], list[str]]:
    """(why the run cannot be replayed exactly here: how it was trained, then how this machine differs; differences
    shown but not blocking)."""
    blockers, notes = machine_blockers(record, run_dir)
    return intrinsic_blockers(record) + blockers, notes


def cannot_replay(run_id: str, record: Mapping[str, Any], blockers: list[str]) -> Optional[str]:
    """Why the audit cannot start here, in one line that says what would work; None when it can.

    A run trained by several processes cannot be audited anywhere, not only on another machine: audit replays
    a segment in one process, and one process does not sum a step's gradients in the order the ranks' all-reduce
    did, so it cannot give the recorded states bit for bit. `reproduce` trains the run again with as many
    processes and compares the weights and metrics: on this kind of machine, that is the check there is."""
    distributed = record.get("distributed") or {}
    world_size, nodes = int(distributed.get("world_size", 1)), int(distributed.get("nodes", 1))
    if world_size <= 1:
        if not blockers:
            return None
        inherent = [b for b in blockers if b in intrinsic_blockers(record)]
        if inherent:
            return (f"{run_id}: the run itself cannot be replayed bit for bit, on any machine: {'; '.join(inherent)}; "
                    "a run trained with train.deterministic=true and train.compile=false can be audited")
        return (f"{run_id}: this machine cannot replay the run exactly: {'; '.join(blockers[:4])}; "
                f"audit it on a machine like the recorded one (`veritrain runs show {run_id}`)")
    where = f"on {nodes} machines " if nodes > 1 else ""
    reason = (f"{run_id}: the run was trained by {world_size} processes {where}and audit replays a segment in one process, "
              f"which cannot give a {world_size}-process step bit for bit")
    if nodes > 1:
        return (f"{reason}; check it with a reproduction instead: the same torchrun launch ({world_size} ranks) of "
                f"`veritrain train runs/{run_id}/config.yaml`, then `veritrain runs compare {run_id} NEW_RUN`")
    if blockers:
        return (f"{reason}; check it with `veritrain reproduce {run_id}` on a machine like the recorded one (this one differs: "
                f"{'; '.join(blockers[:4])}), which trains it again with {world_size} processes and compares the weights and metrics")
    return (f"{reason}; check it with `veritrain reproduce {run_id}`, which trains it again with {world_size} processes on this machine "
            "and compares the weights and metrics (identical on the same kind of machine)")


def _versions(lines: str) -> dict[str, str]:
    found = {}
    for line in lines.splitlines():
        name, _, version = line.partition("==")
        if version:
            found[name.strip().lower()] = version.strip()
    return found
