"""The run record: `runs/<run_id>/record.json` (schema in docs/record.md) and its seal `record.sha256`.

`record.json` is written in canonical form (sorted keys, 2-space indent, UTF-8, trailing newline);
`record.sha256` holds the hex SHA-256 of its exact bytes. `artifacts` lists every other file of the
run with its SHA-256 and size, so a changed, missing or added file can be detected.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from veritrain import __version__
from veritrain.errors import RunFailed
from veritrain.files import write_atomic
from veritrain.hashing import sha256_file

RECORD_VERSION = 1
RECORD_FILE = "record.json"
SEAL_FILE = "record.sha256"
NOTES_FILE = "notes.jsonl"
UNSEALED = frozenset({RECORD_FILE, SEAL_FILE, NOTES_FILE})  # notes are added after the run, on purpose outside the seal


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def record_bytes(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


def artifact_table(run_dir: Path) -> dict[str, dict[str, Any]]:
    """relative path → {sha256, size} for every file except the record, its seal and the notes."""
    table = {}
    for path in sorted(run_dir.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(run_dir).as_posix()
        if rel in UNSEALED:
            continue
        table[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return table


def write_record(run_dir: Path, record: dict[str, Any]) -> str:
    """Refresh `artifacts`, write record.json atomically, then its seal; returns the seal (hex SHA-256)."""
    record["artifacts"] = artifact_table(run_dir)
    data = record_bytes(record)
    write_atomic(run_dir / RECORD_FILE, data, sync_folder=False)  # the seal's rename below syncs the folder for both
    seal = hashlib.sha256(data).hexdigest()
    write_atomic(run_dir / SEAL_FILE, (seal + "\n").encode())
    return seal


DATA_VERSION = re.compile(r"[0-9a-f]{64}")  # a SHA-256 in hex (data.prepare.version_id)
RUN_ID = re.compile(r"\d{8}-\d{6}-\d{3}-[0-9a-f]{6}")  # workspace.new_run_dir: UTC time to the millisecond, 6 random hex digits
# the fields every reader relies on, with the JSON types they may have (None: the field may be null or absent)
RECORD_SHAPE: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "status": (str,), "kind": (str, type(None)), "config": (dict,), "config_hash": (str, type(None)),
    "metrics": (dict, type(None)), "data": (dict, type(None)), "repeat": (dict, type(None)), "error": (dict, type(None)),
    "events": (list, type(None)), "resumes": (list, type(None)), "artifacts": (dict, type(None)), "seal_history": (list, type(None)),
    "exp_name": (str, type(None)), "hypothesis": (str, type(None)), "parent": (str, type(None)), "reproduced_from": (str, type(None)),
}


def record_problem(record: Any, folder_name: Optional[str]) -> Optional[str]:
    """Why a record read from `runs/<folder_name>/` cannot be trusted to describe a run, or None. Records
    arrive from archives and copies, so listing, indexing and import check their shape before reading them.
    With `folder_name` None only the shape is checked (verify, which also answers for copied run folders)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if folder_name is not None and not RUN_ID.fullmatch(folder_name):
        return f"the folder name {folder_name[:40]!r} is not a run id"
    if folder_name is not None and record.get("run_id") != folder_name:
        return f"its run_id {str(record.get('run_id'))[:40]!r} is not its folder's name"
    for key, kinds in RECORD_SHAPE.items():
        if not isinstance(record.get(key), kinds):
            return f"{key} is a {type(record.get(key)).__name__}, expected {' or '.join('null' if k is type(None) else {dict: 'object', list: 'list', str: 'text'}[k] for k in kinds)}"
    if not all(isinstance(m, dict) for m in (record.get("metrics") or {}).values()):
        return "metrics must map each split to an object"
    version = (record.get("data") or {}).get("version")
    if version is not None and not (isinstance(version, str) and DATA_VERSION.fullmatch(version)):
        return f"data.version {str(version)[:40]!r} is not a data version id"  # it names a folder: never a path
    return None


def reseal(run_dir: Path, record: dict[str, Any], by: str) -> str:
    """Seal a finished run again after `by` (eval, export, baseline, gc) changed it, first adding the seal it
    replaces to `seal_history` ({seal, replaced_at, by}): `verify --expect` an older seal then says what
    re-sealed the run. The history is written by whoever writes the record, so it explains, never proves."""
    try:
        previous = (run_dir / SEAL_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        previous = None
    if previous:
        record.setdefault("seal_history", []).append({"seal": previous, "replaced_at": now_iso(), "by": by})
    return write_record(run_dir, record)


def read_record(run_dir: Path) -> dict[str, Any]:
    """The run's record.json; a missing or damaged one is a RunFailed that says how to look closer."""
    path = run_dir / RECORD_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise RunFailed(f"{path}: cannot read it ({err.strerror}); `veritrain verify {run_dir.name}` checks the whole run") from None
    except (ValueError, RecursionError) as err:  # JSON or UTF-8, or nested past Python's limit
        raise RunFailed(f"{path}: not a valid record ({err}); `veritrain verify {run_dir.name}` checks the whole run") from None
    problem = record_problem(record, run_dir.name)
    if problem is not None:
        raise RunFailed(f"{path}: not a valid record ({problem}); `veritrain verify {run_dir.name}` checks the whole run")
    return record


# ---------------------------------------------------------------- environment and code


def package_list() -> str:
    """The installed Python packages, one sorted `name==version` line each."""
    packages = sorted(
        {f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata.get("Name")},
        key=str.lower,
    )
    return "".join(p + "\n" for p in packages)


def capture_env(device: Optional[str] = None) -> tuple[dict[str, Any], str]:
    """The environment summary for the record, and the installed package list (`name==version` lines)."""
    packages = package_list()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "packages_sha256": hashlib.sha256(packages.encode()).hexdigest(),
        "device": device,
    }
    if "torch" in sys.modules:
        import torch

        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
        env["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
        env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        env["mkldnn"] = torch.backends.mkldnn.is_available()
        if torch.cuda.is_available():
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            env["gpu_driver"] = _gpu_driver()
    return env, packages


def _gpu_driver() -> Optional[str]:
    """The NVIDIA driver version, from nvidia-smi when it is installed."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def capture_code(workspace_root: Path) -> dict[str, Any]:
    """veritrain's version and the git state of the workspace (null outside git).

    The workspace's own `runs/`, `.veritrain/` and `experiments.md` never count as dirty.
    """
    code: dict[str, Any] = {"veritrain": __version__, "git_commit": None, "git_dirty": None}
    try:
        commit = subprocess.run(
            ["git", "-C", str(workspace_root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return code
        status = subprocess.run(
            ["git", "-C", str(workspace_root), "status", "--porcelain", "--",
             ":(exclude)runs", ":(exclude).veritrain", ":(exclude)experiments.md"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return code
    code["git_commit"] = commit.stdout.strip()
    code["git_dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    return code


def save_code(code: dict[str, Any], workspace_root: Path, run_dir: Path, model_target: Optional[str]) -> None:
    """When the checkout is dirty, `code/diff.patch` (the uncommitted changes, against HEAD) and the
    names of untracked files; for a user model (`model.target`), a copy of its source file."""
    excludes = [":(exclude)runs", ":(exclude).veritrain", ":(exclude)experiments.md"]
    if code.get("git_dirty"):
        diff = subprocess.run(["git", "-C", str(workspace_root), "diff", "HEAD", "--binary", "--", ".", *excludes],
                              capture_output=True, timeout=60)
        untracked = subprocess.run(["git", "-C", str(workspace_root), "ls-files", "--others", "--exclude-standard", "--", ".", *excludes],
                                   capture_output=True, text=True, timeout=60)
        (run_dir / "code").mkdir(exist_ok=True)
        (run_dir / "code" / "diff.patch").write_bytes(diff.stdout)
        code["diff_patch"] = {"file": "code/diff.patch", "sha256": hashlib.sha256(diff.stdout).hexdigest()}
        code["untracked"] = untracked.stdout.split()
    if model_target:
        import importlib.util
        import shutil

        module = model_target.partition(":")[0]
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            (run_dir / "code").mkdir(exist_ok=True)
            target = run_dir / "code" / (module.replace(".", "/") + ".py")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(spec.origin, target)
            code["model_source"] = {"target": model_target, "file": target.relative_to(run_dir).as_posix(), "sha256": sha256_file(target)}
