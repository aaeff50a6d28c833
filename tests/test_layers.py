"""Every module in its layer (docs/architecture.md): a module imports only from its own layer and the layers below
it, and no import cycle joins modules, counting imports made inside functions. Exempt: imports under `if
TYPE_CHECKING:` from cycles (they never run), the front ends' lazy imports (the CLI imports a command's modules
inside the command so that `--help` stays fast, and they are the top layer anyway).

Run `python tests/test_layers.py` to print the layer map, every import that breaks it and the longest functions."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Iterator, Optional

SRC = Path(__file__).resolve().parents[1] / "src"

# low → high; a module's layer is that of the longest prefix listed
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("veritrain.core",)),
    ("records", ("veritrain.records",)),
    # veritrain.models stays where exported model.json files name it (architecture.rebuild: veritrain.models.build)
    ("stages", ("veritrain.data", "veritrain.tasks", "veritrain.train", "veritrain.results", "veritrain.models", "veritrain.userloop")),
    ("trust", ("veritrain.trust",)),
    ("orchestration", ("veritrain.orchestration",)),
    ("front ends", ("veritrain.cli", "veritrain.cli_reference", "veritrain.web", "veritrain.__main__", "veritrain")),
]
LEVEL = {name: level for level, (name, _) in enumerate(LAYERS)}
MAX_FUNCTION_LINES = 120  # apart from the CLI's command bodies


def layer_of(module: str) -> Optional[str]:
    best: Optional[tuple[int, str]] = None
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), name)
    return best[1] if best else None


def module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def imports_of(path: Path, modules: set[str], root: Path = SRC) -> Iterator[tuple[str, int, bool]]:
    """(imported veritrain module, line, under TYPE_CHECKING) for every import in the file, at any depth."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    typing_only = _type_checking_lines(tree)
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # `from veritrain.train import loop` imports the module veritrain.train.loop
                targets.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        for target in targets:
            if target.split(".")[0] == "veritrain" and target != own:
                yield target, node.lineno, node.lineno in typing_only


def import_graph(root: Path = SRC) -> dict[str, list[tuple[str, int, bool]]]:
    paths = sorted((root / "veritrain").rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    return {module_name(p, root): list(imports_of(p, modules, root)) for p in paths}


def upward_imports(graph: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    found = []
    for module, imports in sorted(graph.items()):
        here = layer_of(module)
        if here is None:
            found.append(f"{module}: in no layer (add it to a layer's package)")
            continue
        for target, line, _ in imports:
            there = layer_of(target)
            if there is not None and LEVEL[there] > LEVEL[here]:
                found.append(f"{module}:{line} imports {target}: {here} → {there}, a layer above")
    return found


def cycles(graph: dict[str, list[tuple[str, int, bool]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), over imports that run."""
    edges = {m: sorted({t for t, _, typing_only in imports if not typing_only and t in graph}) for m, imports in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _without_front_ends(graph: dict[str, list[tuple[str, int, bool]]]) -> dict[str, list[tuple[str, int, bool]]]:
    """Cycles through a front end are its lazy imports (a package __init__ re-exporting its API, the CLI)."""
    return {m: [(t, line, tc) for t, line, tc in imports if layer_of(t) != "front ends"] for m, imports in graph.items()
            if layer_of(m) != "front ends"}


def long_functions(root: Path = SRC, limit: int = MAX_FUNCTION_LINES) -> list[tuple[int, str]]:
    """(lines, where) of every function longer than `limit` lines, apart from the CLI's command bodies."""
    found = []
    for path in sorted((root / "veritrain").rglob("*.py")):
        in_cli = module_name(path, root).split(".")[:2] == ["veritrain", "cli"]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                command = in_cli and any("command" in ast.unparse(d) or "group" in ast.unparse(d) for d in node.decorator_list)
                if lines > limit and not command:
                    found.append((lines, f"{path.relative_to(root)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


ARCHITECTURE = SRC.parent / "docs" / "architecture.md"
MAP_START = "<!-- the module map: generated from the code by `python tests/test_layers.py --write-map` -->"
MAP_END = "<!-- end of the module map -->"


def summary_of(path: Path) -> str:
    """A module's docstring's first sentence, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    sentence = first.split(". ")[0].rstrip(".")
    return sentence.replace("|", "\\|")


def module_map(root: Path = SRC) -> str:
    """docs/architecture.md's module map: every module by layer (top layer first), with what its docstring says."""
    by_layer: dict[str, list[str]] = {name: [] for name, _ in LAYERS}
    for path in sorted((root / "veritrain").rglob("*.py")):
        module = module_name(path, root)
        layer = layer_of(module)
        if layer is not None:
            by_layer[layer].append(f"| `{module}` | {summary_of(path) or '-'} |")
    parts = []
    for name, _ in reversed(LAYERS):
        parts.append(f"### {name}\n\n| module | what it is |\n|---|---|\n" + "\n".join(by_layer[name]) + "\n")
    return "\n".join(parts)


def documented_map() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    return text.split(MAP_START, 1)[1].split(MAP_END, 1)[0].strip("\n") + "\n" if MAP_START in text and MAP_END in text else ""


def test_the_architecture_map_is_the_code():
    """Every module, in its layer, with its docstring's first sentence: docs/architecture.md says what is there."""
    assert documented_map() == module_map(), "docs/architecture.md's module map is out of date: run python tests/test_layers.py --write-map"


def test_the_layers_table_names_every_layers_packages():
    rows = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in LEVEL:
            rows[cells[0]] = cells[1]
    assert list(rows) == [name for name, _ in reversed(LAYERS)]
    for name, prefixes in LAYERS:
        assert all(f"`{prefix}`" in rows[name] for prefix in prefixes), (name, rows[name])


def private_imports(root: Path = SRC) -> list[str]:
    """`from veritrain.x import _name`: a private name used outside its module."""
    found = []
    for path in sorted((root / "veritrain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("veritrain") and not node.level:
                found += [f"{path.relative_to(root)}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_is_imported_from_another_module():
    found = private_imports()
    assert not found, "a private name used outside its module (make it public, or keep the code in its module):\n" + "\n".join(found)


def test_every_module_says_what_it_is():
    missing = [module_name(p) for p in sorted((SRC / "veritrain").rglob("*.py")) if not summary_of(p)]
    assert not missing, "modules without a docstring: " + ", ".join(missing)


def test_every_module_is_in_a_layer_and_imports_only_from_below():
    problems = upward_imports(import_graph())
    assert not problems, "\n".join(problems)


def test_no_import_cycle():
    found = cycles(_without_front_ends(import_graph()))
    assert not found, "\n".join(" ↔ ".join(c) for c in found)


def test_a_deliberate_upward_import_or_cycle_is_caught(tmp_path):
    package = tmp_path / "veritrain"
    for rel, text in {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/hashing.py": "def f():\n    from veritrain.trust import verify  # upward, inside a function\n",
        "trust/__init__.py": "",
        "trust/verify.py": "from veritrain.trust.audit import x\n",
        "trust/audit.py": "def g():\n    from veritrain.trust import verify\n",
    }.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == ["veritrain.core.hashing:2 imports veritrain.trust.verify: base → trust, a layer above"]
    assert cycles(graph) == [["veritrain.trust.audit", "veritrain.trust.verify"]]


def test_no_function_is_longer_than_120_lines():
    found = long_functions()
    print(f"longest functions (limit {MAX_FUNCTION_LINES} lines, CLI command bodies apart):")
    for lines, where in found[:10]:
        print(f"  {lines:4d}  {where}")
    assert not found, "\n".join(f"{lines} lines: {where}" for lines, where in found)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-map"]:
        text = ARCHITECTURE.read_text(encoding="utf-8")
        head, _, rest = text.partition(MAP_START)
        _, _, tail = rest.partition(MAP_END)
        ARCHITECTURE.write_text(f"{head}{MAP_START}\n\n{module_map()}\n{MAP_END}{tail}", encoding="utf-8")
        sys.exit(0)
    graph = import_graph()
    for module in sorted(graph):
        print(f"{layer_of(module) or '?':14s} {module}")
    print("\n".join(upward_imports(graph)) or "no upward import")
    print("\n".join(" ↔ ".join(c) for c in cycles(_without_front_ends(graph))) or "no cycle")
    for lines, where in long_functions()[:15]:
        print(f"{lines:4d}  {where}")
    sys.exit(0)
