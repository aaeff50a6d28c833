"""Kill commands that change a workspace with SIGKILL at random moments, and check that nothing is left that no
command can repair: eval, export, baseline, gc, data prepare and import, `--trials` kills each.

    .venv/bin/python benchmarks/chaos_amend.py [--trials 10] [--seed 0] [--keep DIR]

One tiny run is trained once (with its eval, export, baselines, step checkpoints and an archive). Each trial copies
that workspace (an empty one for prepare and import), starts the command and kills it: after a random delay within
the command's measured duration, as soon as its staged amendment (or temp folder) appears, or as soon as it commits
(the amendment renamed into the run, the renamed store entry, the imported run). Then:

1. without writing, every run verifies (an amendment is in the run whole or not at all: nothing is half visible),
   every stored data version passes its check, and every run the registry lists is there;
2. the same command again exits 0 (import: or says the run is already there);
3. afterwards every run verifies, nothing staged or journaled is left, and the data version loads.

Prints one line per command (how the kills landed, what the next command did) and exits 1 on any failure, naming the
trial, its seed and its log. Commands run as forked children of this process, which imports veritrain and torch once
and never runs torch itself (no threads exist at a fork), so a trial costs the command's work, not a Python start.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

TRAIN = ["--set", "train.epochs=2", "--set", "model.name=mlp", "--set", "model.hidden=[32]", "--set", "checkpoint.every_steps=5",
         "--set", "checkpoint.keep_last=3", "--set", "train.threads=1", "--set", "eval.baseline_max_samples=300",
         "--set", "eval.baseline_max_iter=30", "--no-smoke"]  # a small baseline: `baseline RUN` refits it in every trial
KINDS = ("eval", "export", "baseline", "gc", "prepare", "import")
MODES = ("started", "committed", "random")  # when a trial kills: see kill_point
TERMINAL = 1  # the fd the result lines go to (main keeps a copy of stdout: children point fd 1 at their logs)


def child(work: Callable[[], int], log: Path) -> int:
    """Fork; the child runs `work` with stdout and stderr in `log` and exits with its code. Returns the pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = work()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def command(argv: list[str]) -> Callable[[], int]:
    def work() -> int:
        from veritrain.cli import main

        main(argv)
        return 0

    return work


def wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run(argv: list[str], log: Path) -> int:
    return wait(child(command(argv), log))


def argv_of(kind: str, ws: Path, run_id: str, archive: Path) -> list[str]:
    return {"eval": ["eval", run_id], "export": ["export", run_id], "baseline": ["baseline", run_id], "gc": ["gc"],
            "prepare": ["data", "prepare"], "import": ["import", str(archive)]}[kind] + ["--workdir", str(ws)]


def started(kind: str, ws: Path, run_id: str) -> bool:
    """The command has begun writing: its staged amendment, the prepare's temp folder, the import's staging folder."""
    state = ws / ".veritrain"
    if kind == "prepare":
        return any((state / "data").glob(".tmp-*"))
    if kind == "import":
        return any(state.glob("import-*"))
    return any((state / "amending").glob("*/files"))


def committed(kind: str, ws: Path, run_id: str) -> bool:
    """The command's one atomic step has happened: the amendment in the run, the store entry, the imported run."""
    state = ws / ".veritrain"
    if kind == "prepare":
        return any(p.is_dir() and not p.name.startswith(".") for p in (state / "data").glob("*")) if (state / "data").exists() else False
    if kind == "import":
        return (ws / "runs" / run_id).exists()
    return any((ws / "runs" / run_id / "amendments").glob("*/amendment.json"))


def kill_point(pid: int, mode: str, kind: str, ws: Path, run_id: str, duration: float, rng: random.Random) -> str:
    """Kill the command `pid` as `mode` says; returns how it landed (or that it finished first)."""
    if mode == "random":
        time.sleep(rng.uniform(0.05, 1.0) * duration)
    else:
        test = started if mode == "started" else committed
        while not test(kind, ws, run_id):
            if os.waitpid(pid, os.WNOHANG) != (0, 0):  # it finished (and is reaped) before the point came
                return "finished before the kill"
            time.sleep(0.0005)
        if mode == "started":
            time.sleep(rng.uniform(0.0, 0.2))
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    code = wait(pid)
    return "killed" if code == -signal.SIGKILL else "finished before the kill"


def problems(ws: Path, final: bool, version: str) -> list[str]:
    """What is wrong in the workspace: a run that does not verify, a damaged data version or one other than `version`
    (the one the config prepares to), a registry row without its run; with `final` also an amendment still staged or a
    journal, or `version` missing after a prepare. Reads only (the registry, a cache of the run folders, is brought up
    to date)."""
    from veritrain.data.prepare import load_version
    from veritrain.records import registry
    from veritrain.trust.verify import verify_run

    found = []
    runs, state = ws / "runs", ws / ".veritrain"
    for run_dir in sorted(runs.glob("*")) if runs.exists() else []:
        result = verify_run(run_dir, state, rehash_data=False)  # the stored data version is checked; the raw data is not the command's
        if result["problems"]:
            found.append(f"{run_dir.name} does not verify: {result['problems'][:3]}")
        if final and result.get("interrupted_amend"):
            found.append(f"{run_dir.name}: {result['interrupted_amend']}")
    stored = [p for p in sorted((state / "data").glob("*")) if p.is_dir() and not p.name.startswith(".")] if (state / "data").exists() else []
    for folder in stored:
        if folder.name != version:
            found.append(f"a data version {folder.name[:12]} that is not the config's {version[:12]}")
        try:
            load_version(folder)
        except Exception as err:
            found.append(f"data version {folder.name[:12]}: {err}")
    if final and not runs.exists() and version not in {p.name for p in stored}:
        found.append(f"no data version {version[:12]} after the next prepare")
    if runs.exists():
        for row in registry.query(state, runs):
            if not (runs / row["run_id"] / "record.json").exists():
                found.append(f"the registry lists {row['run_id']}, which is not in runs/")
    if final and any((state / "journal").glob("[!.]*")):
        found.append(f"a journal is left: {sorted(p.name for p in (state / 'journal').iterdir())}")
    if final and any((state / "amending").glob("*")):
        found.append(f"a staged amendment is left: {sorted(p.name for p in (state / 'amending').iterdir())}")
    return found


def checked(ws: Path, final: bool, log: Path, version: str) -> list[str]:
    """`problems` in a forked child (verify loads checkpoints: torch runs there, never here)."""
    out = log.with_suffix(".problems.json")

    def work() -> int:
        out.write_text(json.dumps(problems(ws, final, version)))
        return 0

    code = run_work(work, log)
    return json.loads(out.read_text()) if code == 0 and out.exists() else [f"the check itself failed (exit {code}), see {log}"]


def run_work(work: Callable[[], int], log: Path) -> int:
    return wait(child(work, log))


def base_workspace(root: Path) -> tuple[Path, str, Path]:
    """The trained workspace, its run id and its archive."""
    base = root / "base"
    if run(["run", *TRAIN, "--workdir", str(base)], root / "base.log") != 0:
        raise SystemExit(f"training the base run failed; see {root / 'base.log'}")
    (run_dir,) = (base / "runs").iterdir()
    archive = root / "run.tar.gz"
    if run(["archive", run_dir.name, "-o", str(archive), "--with-data", "--workdir", str(base)], root / "base.log") != 0:
        raise SystemExit(f"archiving the base run failed; see {root / 'base.log'}")
    return base, run_dir.name, archive


def fresh(root: Path, base: Path, kind: str, name: str) -> Path:
    ws = root / f"{kind}-{name}"
    shutil.rmtree(ws, ignore_errors=True)
    if kind in ("prepare", "import"):
        ws.mkdir()
    else:
        shutil.copytree(base, ws, symlinks=True)
    return ws


def trial(root: Path, base: Path, kind: str, index: int, run_id: str, archive: Path, duration: float, seed: int) -> tuple[str, str, list[str], float]:
    """One kill and its repair: (how the kill landed, what the next command said, problems, the next command's
    duration: the command's whole work, which the random kills of later trials fall within)."""
    rng = random.Random(f"{seed}-{kind}-{index}")
    mode = MODES[index % len(MODES)]
    ws = fresh(root, base, kind, str(index))
    log = root / f"{kind}-{index}.log"
    argv = argv_of(kind, ws, run_id, archive)
    landed = kill_point(child(command(argv), log), mode, kind, ws, run_id, duration, rng)
    version = json.loads((base / "runs" / run_id / "record.json").read_text())["data"]["version"]
    found = [f"after the kill: {p}" for p in checked(ws, False, log, version)]
    mark = log.stat().st_size if log.exists() else 0
    staged = any((ws / ".veritrain" / "amending").glob("*"))
    started_at = time.perf_counter()
    code = run(argv, log)
    duration = time.perf_counter() - started_at
    said = log.read_text(errors="replace")[mark:]
    if code != 0 and not (kind == "import" and code == 2 and "already exists" in said):
        found.append(f"the next {kind} exited {code}")
    found += [f"after the next {kind}: {p}" for p in checked(ws, True, log, version)]
    repaired = "cleared a staged amendment" if staged else "nothing to clear"
    if not found:
        shutil.rmtree(ws, ignore_errors=True)
    return f"{mode}: {landed}", repaired, found, duration


def kill_trials(root: Path, base: Path, kind: str, run_id: str, archive: Path, trials: int, seed: int) -> list[str]:
    """`trials` kills of `kind`; prints its line, returns the failures."""
    landed: dict[str, int] = {}
    repaired: dict[str, int] = {}
    failures = []
    duration = 5.0  # seconds, until a trial has measured the command (the first trials do not kill at random)
    for index in range(trials):
        how, said, found, duration = trial(root, base, kind, index, run_id, archive, duration, seed)
        landed[how] = landed.get(how, 0) + 1
        repaired[said] = repaired.get(said, 0) + 1
        failures += [f"{kind} trial {index} (seed {seed}, {how}; log {root / f'{kind}-{index}.log'}): {p}" for p in found]
    os.write(TERMINAL, (f"{kind}: {trials} kills ({', '.join(f'{k} {n}' for k, n in sorted(landed.items()))}); "
                        f"next {kind}: {', '.join(f'{k} {n}' for k, n in sorted(repaired.items()))}\n").encode())
    return failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10, help="kills per command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (default: a temp folder, removed)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="commands to kill, comma-separated")
    parser.add_argument("--jobs", type=int, default=2, help="commands whose trials run side by side (one per core)")
    args = parser.parse_args()
    global TERMINAL
    TERMINAL = os.dup(1)  # this process's stdout, for the lines of forked orchestrators too
    os.environ.setdefault("COLUMNS", "200")
    import torch  # noqa: F401  imported once here, used only in the children

    import veritrain.cli  # noqa: F401
    import veritrain.results.evaluate  # noqa: F401
    import veritrain.results.export  # noqa: F401

    root = Path(args.keep or tempfile.mkdtemp(prefix="chaos-amend-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    started_at = time.perf_counter()
    base, run_id, archive = base_workspace(root)
    print(f"base run {run_id} trained, evaluated, exported and archived in {time.perf_counter() - started_at:.0f} s", flush=True)
    kinds = [k for k in args.kinds.split(",") if k]
    groups = [kinds[i::args.jobs] for i in range(min(args.jobs, len(kinds)))]  # each group's trials run one after another
    orchestrators = []
    for number, group in enumerate(groups):
        out = root / f"failures-{number}.json"

        def work(group: list[str] = group, out: Path = out) -> int:
            failures = []
            for kind in group:
                failures += kill_trials(root, base, kind, run_id, archive, args.trials, args.seed)
            out.write_text(json.dumps(failures))
            return 0

        orchestrators.append((child(work, Path(os.devnull)) if len(groups) > 1 else None, work, out))
    failures = []
    for pid, work, out in orchestrators:
        code = wait(pid) if pid is not None else work()
        failures += json.loads(out.read_text()) if code == 0 and out.exists() else [f"a group of trials failed (exit {code})"]
    for failure in failures:
        print("FAILED " + failure, flush=True)
    print(f"{len(failures)} failure(s) in {time.perf_counter() - started_at:.0f} s", flush=True)
    if not failures and args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
