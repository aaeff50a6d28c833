"""The rule for imports made inside functions: they stay only where they keep a heavy package out of commands that do
not need it. Everywhere else an import is at the top of its module, where a reader sees what the module needs.

A function-level import is kept when it
- imports a package that is optional or heavy (`torch`, `numpy`, and every third-party package outside the light
  ones every command loads: click, rich, pydantic, yaml), which may be missing or takes time to load; or
- imports a veritrain module that, through the imports at the top of its modules, brings such a package the module
  holding the import does not already load at its top; or
- sits under `try:` (an optional module, whose absence is handled).

The front ends (`veritrain.cli`, `veritrain.web`, `veritrain.__init__`) are exempt: they import a command's modules
inside the command, so that `--help` and the light commands start fast (tests/test_layers.py exempts them too).
Import cycles are ruled out by tests/test_layers.py, counting imports made inside functions, so moving an import to
the top never changes the order modules load in."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LIGHT = {"click", "rich", "pydantic", "pydantic_core", "yaml", "typing_extensions"}
FRONT_ENDS = ("veritrain.cli", "veritrain.web", "veritrain.__main__", "veritrain.cli_reference")


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "veritrain").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


@functools.lru_cache(None)
def _imports(module: str) -> tuple[frozenset[str], tuple[tuple[int, tuple[str, ...]], ...]]:
    """(what the module imports at its top, the function-level imports outside `try:` as (line, targets))."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    top: set[str] = set()
    local: list[tuple[int, tuple[str, ...]]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # never runs
            elif isinstance(child, ast.Try) and in_function:
                continue  # an optional module, its absence handled
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.ImportFrom) and child.module == "__future__":
                    continue
                if in_function:
                    local.append((child.lineno, tuple(_targets(child, module, is_package))))
                else:
                    top.update(_targets(child, module, is_package))
            else:
                visit(child, in_function)

    visit(tree, False)
    return frozenset(top), tuple(local)


def _heavy_root(name: str) -> bool:
    root = name.split(".")[0]
    return root != "veritrain" and root not in sys.stdlib_module_names and root not in LIGHT


@functools.lru_cache(None)
def heavy_packages(module: str) -> frozenset[str]:
    """The heavy packages importing `module` loads, through the imports at the top of it and of what it imports."""
    seen, stack, found = set(), [module], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in MODULES:
            parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
            stack.extend([*_imports(name)[0], *parents])
        elif _heavy_root(name):
            found.add(name.split(".")[0])
    return frozenset(found)


def needless_local_imports() -> list[str]:
    found = []
    for module in sorted(MODULES):
        if module == "veritrain" or module.startswith(FRONT_ENDS):
            continue
        for line, targets in _imports(module)[1]:
            kept = [t for t in targets if _heavy_root(t) or (t in MODULES and heavy_packages(t) - heavy_packages(module))]
            if not kept:
                found.append(f"{module}:{line} imports {', '.join(targets)} inside a function; it loads no heavy package the module "
                             f"lacks ({', '.join(sorted(heavy_packages(module))) or 'none'}): import it at the top")
    return found


def test_function_level_imports_only_keep_heavy_packages_out():
    found = needless_local_imports()
    assert not found, "\n".join(found)


def test_the_rule_sees_a_heavy_import_and_a_needless_one():
    assert "torch" in heavy_packages("veritrain.train.engine") and "torch" not in heavy_packages("veritrain.records.registry")
    assert _heavy_root("torch.nn") and _heavy_root("optuna") and not _heavy_root("json") and not _heavy_root("rich.table")


if __name__ == "__main__":
    print("\n".join(needless_local_imports()) or "none")
