"""Shared code reads what tasks declare: no module outside veritrain/tasks names, as a literal, a task or a metric
that a task declares (its name, its older names, its per-epoch key). A new task is then one module, and no shared
table has to learn its metrics. The engine's own keys (core.task_spec.ENGINE_KEYS: loss, lr, ...) are the engine's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from veritrain.core.task_registry import task_spec
from veritrain.core.task_spec import ENGINE_KEYS
from veritrain.tasks import builtin

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "veritrain"
WORD = re.compile(r"[A-Za-z0-9_]+")
NAME_LIKE = re.compile(r"[\w.\-/:]+")  # a key, a path or a dotted name: prose (with spaces) is not looked at


def declared_names() -> set[str]:
    """The built-in tasks' names and every name their declarations give a metric (tasks registered by tests aside)."""
    names = set(builtin.TASKS) | set(builtin.SPECS)
    for task in builtin.SPECS:
        for metric in task_spec(task).metrics:
            names |= {metric.name, *metric.aliases, *([metric.epoch_key] if metric.epoch_key else [])}
    return names - set(ENGINE_KEYS)


def literals_naming(names: set[str], source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant in `source` that is not a docstring and, read as a key or dotted path,
    holds one of `names` as a word."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if NAME_LIKE.fullmatch(node.value) and set(WORD.findall(node.value)) & names:
                found.append((node.lineno, node.value))
    return found


def test_shared_code_names_no_task_and_no_declared_metric():
    names = declared_names()
    assert {"classification", "lm", "accuracy", "macro_f1", "f1_macro", "val_acc", "bits_per_byte", "val_bits_per_byte"} <= names
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "tasks":
            continue
        found += [f"{path.relative_to(PACKAGE)}:{line}: {text!r}" for line, text in literals_naming(names, path.read_text(encoding="utf-8"))]
    assert not found, "shared code names what a task declares; read the TaskSpec instead:\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for():
    names = {"accuracy", "lm", "val_acc"}
    source = ('"""accuracy in a docstring is prose"""\n'
              'A = ("test.accuracy", "val_acc")\n'
              'B = {"task": "lm"}\n'
              'C = "the accuracy of a model"  # prose\n'
              'D = f"val_{name}"\n')
    assert literals_naming(names, source) == [(2, "test.accuracy"), (2, "val_acc"), (3, "lm")]
