"""The training core stays plain: checkpoint files that are never written to once in place, and no import
cycle between the config and the tasks package."""

from __future__ import annotations

import ast
import hashlib
import os
from pathlib import Path

from conftest import in_process_run

from veritrain.train import checkpoint

SRC = Path(__file__).resolve().parent.parent / "src"


def _fingerprint(path: Path) -> tuple[int, int, str]:
    info = path.stat()
    return info.st_ino, info.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_step_file_once_written_is_never_changed_by_later_saves(tmp_path, monkeypatch):
    """After every save, each step file seen before is still the same file (inode) with the same
    bytes and modification time: a new checkpoint never takes over an old one's file."""
    real_write = checkpoint.write
    seen: dict[str, tuple[int, int, str]] = {}
    saves = []

    def watching(folder, data, names, keep_last, keep=frozenset()):
        real_write(folder, data, names, keep_last, keep)
        saves.append(names)
        now = {path.name: _fingerprint(path) for _, path in checkpoint.step_files(folder)}
        for name, before in seen.items():
            assert now[name] == before, f"{name} changed after saving {names}"
        seen.update(now)

    monkeypatch.setattr(checkpoint, "write", watching)
    # `veritrain train`: every save of a run is the training's (eval and export only read checkpoints)
    outcome = in_process_run(tmp_path, ["train.epochs=2", "model.name=mlp", "model.hidden=[32]",
                                        "checkpoint.every_steps=5", "checkpoint.keep_last=100"], kind="train")
    assert outcome.record["status"] == "completed"
    assert len(saves) >= 10 and "step-5.pt" in seen  # step-5.pt was checked after every later save
    inodes = [inode for inode, _, _ in seen.values()]
    assert len(set(inodes)) == len(inodes)  # every step file a file of its own


def test_pruning_keeps_the_newest_and_writes_new_files(tmp_path):
    for step in (1, 2):
        checkpoint.write(tmp_path, f"state {step}".encode(), [f"step-{step}.pt"], keep_last=2)
    kept = _fingerprint(tmp_path / "step-2.pt")
    oldest_inode = (tmp_path / "step-1.pt").stat().st_ino
    checkpoint.write(tmp_path, b"state 3", ["step-3.pt"], keep_last=2)
    assert sorted(os.listdir(tmp_path)) == ["step-2.pt", "step-2.pt.sha256", "step-3.pt", "step-3.pt.sha256"]
    assert _fingerprint(tmp_path / "step-2.pt") == kept
    assert (tmp_path / "step-3.pt").stat().st_ino != oldest_inode  # written before the oldest was deleted
    assert (tmp_path / "step-3.pt.sha256").read_text().strip() == hashlib.sha256(b"state 3").hexdigest()


def _imported_modules(path: Path, package: str) -> set[str]:
    """Every module an `import` statement anywhere in the file names (top level, functions,
    `if TYPE_CHECKING:`), relative imports resolved against `package`, plus string arguments of
    `importlib.import_module` / `__import__` calls."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from veritrain import config`
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__"):
                names.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def test_config_and_tasks_do_not_import_each_other():
    config_imports = set().union(*(_imported_modules(path, "veritrain.core.config") for path in (SRC / "veritrain" / "core" / "config").glob("*.py")))
    tasks_imports = _imported_modules(SRC / "veritrain" / "tasks" / "__init__.py", "veritrain.tasks")
    assert not [m for m in config_imports if m == "veritrain.tasks" or m.startswith("veritrain.tasks.")]
    assert "veritrain.core.config" not in tasks_imports and not [m for m in tasks_imports if m.startswith("veritrain.core.config.")]
    # the check itself sees imports in every form it looks for
    assert {"veritrain.core.task_registry", "veritrain.core.errors"} <= config_imports
    assert "veritrain.core.task_registry" in tasks_imports and "veritrain.data.prepare" in tasks_imports  # the latter under TYPE_CHECKING


def test_config_validation_and_the_tasks_package_share_one_registry(monkeypatch):
    from veritrain.core.config import load_config
    from veritrain.tasks import TASKS, register_task

    from veritrain.tasks import SPECS

    monkeypatch.setitem(TASKS, "other", lambda cfg: None)  # restored afterwards, as the declaration below
    monkeypatch.setitem(SPECS, "other", None)
    register_task("other", lambda cfg: None)
    assert load_config(None, ["task=other"]).config.task == "other"


# the base and records layers (docs/architecture.md): what the kept verdicts may import from veritrain
BASE_AND_RECORDS = {"veritrain", "veritrain.core.config", "veritrain.core.hashing", "veritrain.core.files", "veritrain.core.secrets", "veritrain.core.errors", "veritrain.core.user_dirs",
                    "veritrain.core.logs", "veritrain.records.record", "veritrain.records.workspace", "veritrain.records.registry", "veritrain.records.experiments"}


def test_kept_verdicts_stay_in_the_records_layer():
    """verdicts.py is read by the trust layer (verify, check) and the front ends: it imports from neither."""
    imported = _imported_modules(SRC / "veritrain" / "records" / "verdicts.py", "veritrain")
    ours = {m for m in imported if m == "veritrain" or m.startswith("veritrain.")}
    # `from veritrain.records.record import now_iso` also names veritrain.records.record.now_iso, a name in an allowed module;
    # `from veritrain.trust import verify` names veritrain.trust.verify, a module of its own
    modules = BASE_AND_RECORDS - {"veritrain"}
    upward = sorted(m for m in ours if m not in BASE_AND_RECORDS and m.rsplit(".", 1)[0] not in modules)
    assert not upward, upward
    assert {"veritrain.records.record", "veritrain.core.files"} <= ours  # the check sees its imports
