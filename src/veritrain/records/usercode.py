"""The user's Python code a run imports: found, copied into the run, and imported again from those copies.

A *user module* is one whose file lies outside the interpreter's standard library, its site-packages and
veritrain itself: a model factory (`model.target`) and everything of the user's it imports. A fresh run looks
them up in the config file's folder, then the working directory, then `sys.path`, and copies each one it loaded
to `runs/<id>/code/` in its package layout (`code.user_files` in the record: module, path, sha256). Every later
command that builds the model (eval, export, reproduce, resume, audit, a sweep's trials) imports those copies
from a scratch folder placed first on `sys.path`, so a later edit of the user's files never changes a result;
`--use-current-code` makes a new run with today's code instead.

    with usercode.fresh(config_path) as code:      # a new run
        code.import_target("mymodels:make")        # exit 2, one line, when it does not import
        ...train...
        code.save(run_dir, record["code"])         # copies + code.user_files
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.machinery
import logging
import os
import re
import shutil
import site
import sys
import sysconfig
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.task_registry import ENTRY_POINTS, task_target

log = logging.getLogger("veritrain")

CODE_DIR = "code"  # in a run folder (and a sweep's): the copies, in their package layout
STATE_SCRATCH = ".veritrain/tmp"  # in a workspace: the folders copies are imported from, removed after use
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


# ---------------------------------------------------------------- what counts as the user's code


def _system_dirs() -> list[Path]:
    """Folders whose modules are not the user's: the standard library, site-packages, veritrain's own."""
    paths = sysconfig.get_paths()
    found = [paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        found += site.getsitepackages()
    except AttributeError:  # some virtualenv builds lack it
        pass
    found.append(site.getusersitepackages() if site.ENABLE_USER_SITE else None)
    found.append(str(Path(__file__).resolve().parents[1]))  # veritrain itself (an editable install lies outside site-packages)
    return [Path(p).resolve() for p in found if p]


_SYSTEM = tuple(str(p) + os.sep for p in _system_dirs())


def is_user_file(path: Path) -> bool:
    return _is_user_path(str(path))


@functools.lru_cache(maxsize=None)
def _is_user_path(path: str) -> bool:
    """Cached: sys.modules holds thousands of modules once torch is imported, and their files do not move."""
    return not os.path.realpath(path).startswith(_SYSTEM)


_SOURCE_SUFFIXES = tuple(importlib.machinery.SOURCE_SUFFIXES)


def _module_origin(module: ModuleType) -> Optional[str]:
    """The Python source file a module was loaded from, None for built-in, frozen, namespace or compiled ones."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
    return origin if isinstance(origin, str) and origin.endswith(_SOURCE_SUFFIXES) else None


def _module_file(module: ModuleType) -> Optional[Path]:
    origin = _module_origin(module)
    return Path(origin) if origin is not None and os.path.isfile(origin) else None


def layout_path(module: str, file: Path) -> Optional[str]:
    """The file's path relative to its import root, from its dotted name: `pkg.layers` → `pkg/layers.py`,
    package `pkg` → `pkg/__init__.py`; None when the file does not sit where its name says (a module loaded
    under another name), since it could not be imported from a copy by that name."""
    parts = module.split(".")
    relative = "/".join(parts) + "/__init__.py" if file.name == "__init__.py" else "/".join(parts[:-1] + [file.name])
    if file.name != "__init__.py" and file.stem != parts[-1]:
        return None
    return relative if file.as_posix().endswith("/" + relative) else None


def _user_namespace(module: ModuleType) -> bool:
    """A namespace package (no __init__.py) all of whose folders are the user's."""
    spec = getattr(module, "__spec__", None)
    if spec is None or spec.origin not in (None, "namespace") or not spec.submodule_search_locations:
        return False
    return all(_is_user_path(str(folder)) for folder in spec.submodule_search_locations)


def _forget(name: str) -> None:
    """Drop a module from sys.modules and from its parent package's attributes, so the next import runs it again."""
    module = sys.modules.pop(name, None)
    parent, _, child = name.rpartition(".")
    if parent and module is not None and getattr(sys.modules.get(parent), child, None) is module:
        try:
            delattr(sys.modules[parent], child)
        except AttributeError:
            pass


def user_modules() -> dict[str, tuple[ModuleType, Path]]:
    """The user modules in `sys.modules` now, by name, with their files."""
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or name == "__main__":
            continue
        origin = _module_origin(module)
        if origin is not None and _is_user_path(origin) and os.path.isfile(origin):
            found[name] = (module, Path(origin))
    return found


def shadowed(name: str) -> Optional[str]:
    """What a top-level module name also names outside the user's code: the standard-library, veritrain or an
    installed module (with its file), or None. A user module by such a name would silently replace it, or be replaced."""
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return f"the standard-library module {top}"
    if top == "veritrain":
        return "veritrain itself"
    system_entries = [entry for entry in sys.path if entry and not is_user_file(Path(entry))]
    spec = importlib.machinery.PathFinder.find_spec(top, system_entries)
    if spec is not None:
        return f"the installed module {top} ({spec.origin or ', '.join(spec.submodule_search_locations or [])})"
    return None


def _imported_names(file: Path) -> set[str]:
    """Top-level names a source file imports absolutely (relative imports stay inside its package)."""
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def _top_level_names(root: Path) -> set[str]:
    """Module and package names directly in an import root."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return set()
    names = set()
    for entry in entries:
        stem, suffix = os.path.splitext(entry.name)
        if entry.is_dir() and entry.name.isidentifier() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
            names.add(entry.name)  # a folder without __init__.py never wins over another module of its name
        elif suffix in importlib.machinery.SOURCE_SUFFIXES and stem.isidentifier():
            names.add(stem)
    return names


def first_difference(recorded: bytes, current: bytes) -> str:
    """`line N (`text`)`: the first line where two versions of a file differ."""
    a, b = recorded.decode("utf-8", "replace").splitlines(), current.decode("utf-8", "replace").splitlines()
    for number, (left, right) in enumerate(zip(a, b), start=1):
        if left != right:
            return f"line {number} (now `{right.strip()[:80]}`, recorded `{left.strip()[:80]}`)"
    if len(a) != len(b):
        number = min(len(a), len(b)) + 1
        return f"line {number} ({'added' if len(b) > len(a) else 'removed'})"
    return "line endings or bytes past the text"


# ---------------------------------------------------------------- a session: where user modules come from, for a while


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Loads a user module from its source file, never from bytecode. Python trusts a `__pycache__` file whose
    recorded mtime (in whole seconds) and size match the source, so an edit within the same second that keeps the
    size would run the old code while veritrain hashes and copies the new file."""

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)


class _UserSourceFinder:
    """The path finder, except that a user module gets the source-only loader; placed just before
    `importlib.machinery.PathFinder` on sys.meta_path for the length of a session, so precedence is unchanged."""

    @classmethod
    def find_spec(cls, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader and spec.origin \
                and _is_user_path(spec.origin):
            spec.loader = _SourceOnlyLoader(fullname, spec.origin)
        return spec

    @classmethod
    def invalidate_caches(cls) -> None:
        importlib.machinery.PathFinder.invalidate_caches()


def _install_source_finder() -> bool:
    if _UserSourceFinder in sys.meta_path:  # a session inside a session: the outer one placed it
        return False
    where = next((i for i, finder in enumerate(sys.meta_path) if finder is importlib.machinery.PathFinder), len(sys.meta_path))
    sys.meta_path.insert(where, _UserSourceFinder)
    return True


class CodeSession:
    """A stretch of a command during which user modules are imported from `roots` (placed first on sys.path).

    Entering sets aside the user modules already imported whose names the roots provide, so they are imported
    afresh from the roots; leaving drops what was imported inside and restores what was set aside, so the rest
    of the process (a test session, a notebook) keeps its own modules. `scratch`, when set, is a folder of copies
    made for this session, removed on leaving."""

    def __init__(self, roots: list[Path], scratch: Optional[Path] = None, recorded: Optional[list[dict[str, Any]]] = None,
                 describe: str = "the current code"):
        self.roots = [Path(r) for r in dict.fromkeys(str(Path(r).resolve()) for r in roots)]
        self.scratch = scratch
        self.recorded = recorded  # the listing the copies came from (None: the user's own files)
        self.describe = describe
        self._set_aside: dict[str, ModuleType] = {}
        self._before: dict[str, ModuleType] = {}
        self._path_entries: list[str] = []
        self._placed_finder = False

    def __enter__(self) -> "CodeSession":
        provided = set().union(*(_top_level_names(root) for root in self.roots)) if self.roots else set()
        aside = [name for name in user_modules() if name.partition(".")[0] in provided]
        aside += [name for name, module in list(sys.modules.items())
                  if module is not None and _user_namespace(module) and name.partition(".")[0] in provided | set(aside)]
        for name in aside:
            self._set_aside[name] = sys.modules[name]
            _forget(name)
        self._path_entries = [str(root) for root in self.roots]
        sys.path[0:0] = self._path_entries
        self._placed_finder = _install_source_finder()
        importlib.invalidate_caches()
        self._before = dict(sys.modules)
        return self

    def __exit__(self, *exc: Any) -> None:
        for entry in self._path_entries:
            try:
                sys.path.remove(entry)
            except ValueError:
                pass
        if self._placed_finder and _UserSourceFinder in sys.meta_path:
            sys.meta_path.remove(_UserSourceFinder)
        for name, module in list(sys.modules.items()):
            if self._before.get(name) is not module and module is not None:
                file = _module_file(module)
                if (file is not None and is_user_file(file)) or _user_namespace(module):
                    _forget(name)
        sys.modules.update(self._set_aside)
        for name, module in self._set_aside.items():  # and their places in their parents, as they were
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, module)
        importlib.invalidate_caches()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def loaded(self) -> dict[str, tuple[ModuleType, Path]]:
        """User modules imported since the session began."""
        return {name: found for name, found in user_modules().items() if self._before.get(name) is not found[0]}

    def import_target(self, target: str, what: str = "model.target") -> Any:
        """The attribute `package.module:factory` names, imported now. UserError (exit 2, one line) when the
        module or attribute is missing, or when a user module's name shadows another module; `what` names where the
        target comes from in those messages (model.target, or a task's entry point)."""
        module_name, _, attribute = target.partition(":")
        if not MODULE_NAME.fullmatch(module_name) or not attribute.isidentifier():
            raise UserError(f"{what}: expected 'package.module:factory', got {target!r}")
        self._refuse_shadowing(module_name, what)
        top = module_name.partition(".")[0]
        for name, module in list(sys.modules.items()):  # imported before the session: import it afresh, to record it
            if (name == top or name.startswith(top + ".")) and module is not None and self._before.get(name) is module \
                    and (name in user_modules() or _user_namespace(module)):
                self._set_aside.setdefault(name, module)
                _forget(name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
                if self.scratch is not None:
                    raise UserError(f"{what}: no module {module_name!r} in {self.describe}; `veritrain verify` says what is "
                                    "missing, or pass --use-current-code to build it from the current code") from None
                raise UserError(f"{what}: no module {module_name!r} in {self._places()}; put {module_name.replace('.', '/')}.py "
                                "beside the config, in the working directory, or on PYTHONPATH") from None
            raise UserError(f"{what}: {module_name} imports {err.name!r}, which is not installed or not found in "
                            f"{self._places()}") from None
        except ImportError as err:
            raise UserError(f"{what}: importing {module_name} failed: {err}") from None
        except SyntaxError as err:
            raise UserError(f"{what}: {err.filename}:{err.lineno}: syntax error in the model code: {err.msg}") from None
        except Exception as err:  # the module's own code raised while it loaded
            raise UserError(f"{what}: importing {module_name} raised {type(err).__name__}: {' '.join(str(err).split())[:300]}") from None
        self._check_recorded()
        self.refuse_shadowing_loaded()
        if not hasattr(module, attribute):
            where = _module_file(module)
            raise UserError(f"{what}: {module_name} ({where or 'no file'}) has no {attribute!r}; name a function of it "
                            "that returns a torch.nn.Module" if what == "model.target" else f"{what}: {module_name} ({where or 'no file'}) "
                            f"has no {attribute!r}; name the task's class")
        return getattr(module, attribute)

    def import_config(self, cfg: Any) -> None:
        """The user code run config `cfg` names, imported now in this session (so a new run records it and a later
        command runs the recorded copies): its task's class when an installed package's entry point names the task
        (veritrain.core.task_registry.task_target), and model.target."""

        target = task_target(cfg.task)
        if target:
            self.import_target(target, f"task {cfg.task} (entry point {target} of {ENTRY_POINTS})")
        if cfg.model.target:
            self.import_target(cfg.model.target)

    def _check_recorded(self) -> None:
        """In a session of copies: every listed module must have come from the copies (RunFailed otherwise), so a
        regular package of the same name elsewhere on sys.path can never stand in for the recorded one."""
        if self.scratch is None or not self.recorded:
            return
        for entry in self.recorded:
            module = sys.modules.get(entry["module"])
            file = _module_file(module) if module is not None else None
            if file is not None and not file.resolve().is_relative_to(self.scratch.resolve()):
                raise RunFailed(f"code: {entry['module']} was imported from {file}, not from {self.describe}; another package of that "
                                "name is on sys.path (rename or uninstall it), or use --use-current-code")

    def _places(self) -> str:
        if self.scratch is not None:
            return self.describe
        return ", ".join(str(root) for root in self.roots) + (", or sys.path" if self.roots else "sys.path")

    def _refuse_shadowing(self, module_name: str, what: str = "model.target") -> None:
        """A target whose top-level name is also a standard-library or installed module would import that one."""
        top = module_name.partition(".")[0]
        other = shadowed(top)
        if other is None:
            return
        mine = next((root / name for root in self.roots for name in (f"{top}.py", f"{top}/__init__.py") if (root / name).exists()), None)
        if mine is not None:
            raise UserError(f"{what}: the user module {top} ({mine}) has the name of {other}; rename {mine.name} "
                            f"(and {what} with it)")

    def refuse_shadowing_loaded(self) -> None:
        """UserError when a loaded user module shadows another module, or when user code imports a name that both
        a file of the roots and the standard library (or an installed package) provide."""
        provided = {name: root for root in self.roots for name in _top_level_names(root)}
        for name, (_module, file) in self.loaded().items():
            if "." not in name:
                other = shadowed(name)
                if other is not None:
                    raise UserError(f"model.target: the user module {name} ({file}) has the name of {other}; rename it")
            for imported in _imported_names(file):
                if imported in provided and shadowed(imported) is not None:
                    mine = next((provided[imported] / n for n in (f"{imported}.py", f"{imported}/__init__.py") if (provided[imported] / n).exists()),
                                provided[imported])
                    raise UserError(f"model.target: {file.name} imports {imported}, and the user module {imported} ({mine}) has the "
                                    f"name of {shadowed(imported)}: Python would import only one of them; rename {mine.name}")

    def listing(self) -> list[dict[str, Any]]:
        """The user modules loaded so far as {module, path, sha256} (the files as they are now), without copying."""
        found = []
        for name, (_module, file) in sorted(self.loaded().items()):
            relative = layout_path(name, file)
            if relative is not None:
                found.append({"module": name, "path": relative, "sha256": hashlib.sha256(file.read_bytes()).hexdigest()})
        return found

    def save(self, run_dir: Path, code: dict[str, Any], model_target: Optional[str] = None) -> None:
        """Copy every user module loaded so far into `run_dir/code/` and list them in `code["user_files"]` (added to
        what is already listed); with `model_target`, `code["model_source"]` names the target's copy (as records
        before the full listing did)."""
        self.refuse_shadowing_loaded()  # a stray module beside the config or in the working directory, imported lazily
        listed = {entry["module"]: entry for entry in code.get("user_files") or []}
        for name, (_module, file) in sorted(self.loaded().items()):
            if name in listed:
                continue
            relative = layout_path(name, file)
            if relative is None:
                log.warning("code: %s (%s) is not where its name says; it is not recorded and would not be imported from the run", name, file)
                continue
            copy = run_dir / CODE_DIR / relative
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, copy)
            listed[name] = {"module": name, "path": relative, "sha256": hashlib.sha256(copy.read_bytes()).hexdigest()}
        code["user_files"] = [listed[name] for name in sorted(listed)]
        if model_target:
            module = model_target.partition(":")[0]
            if module in listed:
                code["model_source"] = {"target": model_target, "file": f"{CODE_DIR}/{listed[module]['path']}", "sha256": listed[module]["sha256"]}


def fresh(config_path: Optional[Path], cwd: Optional[Path] = None) -> CodeSession:
    """For a new run: the config file's folder, then the working directory, then sys.path."""
    roots = ([Path(config_path).resolve().parent] if config_path else []) + [Path(cwd or os.getcwd())]
    return CodeSession(roots)


def recorded_listing(record: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """(the user files a record lists, whether that is only the target's file of a record from before the full
    listing). Entries are {module, path, sha256}; path is relative to the run's code/ folder."""
    code = record.get("code") or {}
    if code.get("user_files") is not None:
        return list(code["user_files"]), False
    source = code.get("model_source") or {}
    if source.get("file") and source.get("target"):
        module = str(source["target"]).partition(":")[0]
        path = str(source["file"]).removeprefix(CODE_DIR + "/")
        return [{"module": module, "path": path, "sha256": source.get("sha256")}], True
    return [], False


def check_listing(entries: list[dict[str, Any]]) -> Optional[str]:
    """What is wrong with a listing that arrived (a record is data): None when every entry is a dotted module
    name with a relative .py path in its layout, and no name shadows another module."""
    for entry in entries:
        module, path = str(entry.get("module", "")), str(entry.get("path", ""))
        if not MODULE_NAME.fullmatch(module):
            return f"{module!r} is not a module name"
        parts = path.split("/")
        if path.startswith("/") or ".." in parts or "" in parts or not path.endswith(".py"):
            return f"{path!r} is not a relative .py path"
        expected = module.split(".")
        if parts not in (expected + ["__init__.py"], expected[:-1] + [expected[-1] + ".py"]):
            return f"{path!r} is not where module {module} is imported from"
        other = shadowed(module) or _optional_name(module)
        if other is not None:
            return f"module {module} has the name of {other}"
    return None


# Modules that veritrain or its dependencies import when present (optional extras): a recorded copy by such a name
# would be imported by them, not by the model, so a listing that arrives with one is refused.
OPTIONAL_IMPORTS = ("tensorboard", "onnx", "onnxruntime", "safetensors", "ray", "lightning", "pytorch_lightning",
                    "transformers", "optuna", "matplotlib", "playwright", "tensorflow", "triton", "sympy")


def _optional_name(module: str) -> Optional[str]:
    top = module.partition(".")[0]
    return f"{top}, a package veritrain or its dependencies import when it is installed" if top in OPTIONAL_IMPORTS else None


def recorded(run_dir: Path, record: Mapping[str, Any], scratch_parent: Path, command: str,
             current_roots: Optional[list[Path]] = None) -> CodeSession:
    """For a command on an existing run: a session that imports the run's recorded copies. Each copy is checked
    against its recorded hash (RunFailed when it does not match: `veritrain verify` says more); a user module that
    imports differently today (edited, or missing) is named in one warning line per file, and the copy is used.
    A record that listed only the target's file says, in one line, that its other modules come from the current tree."""
    entries, only_target = recorded_listing(record)
    if not entries:
        model = (record.get("config") or {}).get("model") if record.get("kind") != "script" else None  # a script's config is its own
        target = model.get("target") if isinstance(model, dict) else None
        if target and (record.get("code") or {}).get("user_files") is None:  # [] : the target is an installed package
            log.warning("%s: run %s recorded no copy of its model code (%s); it is imported from the current tree",
                        command, run_dir.name, target)
        return CodeSession([], describe="the current code")
    scratch = scratch_parent / f"code-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        for entry, content in copy_recorded(run_dir, entries, scratch):
            _say_if_edited(entry, content, current_roots or [], command, run_dir.name)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if only_target:
        log.warning("%s: run %s recorded only %s; its other modules come from the current tree", command, run_dir.name, entries[0]["path"])
        return CodeSession([scratch, *(current_roots or [])], scratch=scratch, recorded=entries, describe=f"the code recorded with run {run_dir.name}")
    return CodeSession([scratch], scratch=scratch, recorded=entries, describe=f"the code recorded with run {run_dir.name}")


def copy_recorded(run_dir: Path, entries: list[dict[str, Any]], dest: Path) -> list[tuple[dict[str, Any], bytes]]:
    """Copy the run's recorded user modules (`entries`, its listing) into `dest` in their package layout, each checked
    against its recorded hash first; returns (entry, content) per module. RunFailed for a listing that is not one
    (a record is data) or a copy that does not match."""
    problem = check_listing(entries)
    if problem:
        raise RunFailed(f"{run_dir.name}: record.json: code.user_files: {problem}; the run's recorded code cannot be used")
    copied = []
    for entry in entries:
        content = _read_copy(run_dir, entry["path"], run_dir.name)
        if entry.get("sha256") and hashlib.sha256(content).hexdigest() != entry["sha256"]:
            raise RunFailed(f"{run_dir.name}: {CODE_DIR}/{entry['path']}: the recorded copy of {entry['module']} does not match "
                            f"its recorded hash; see `veritrain verify {run_dir.name}`")
        copy = dest / entry["path"]
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(content)
        copied.append((entry, content))
    return copied


def _read_copy(folder: Path, path: str, what: str) -> bytes:
    """The bytes of `folder/code/<path>`, refusing a link anywhere on the way (a copied folder is data)."""
    current = folder / CODE_DIR
    for part in [None, *path.split("/")]:
        if part is not None:
            current = current / part
        if current.is_symlink():
            raise RunFailed(f"{what}: {current}: a link in the recorded code; the copies must be plain files")
    try:
        return current.read_bytes()
    except OSError:
        raise RunFailed(f"{what}: {CODE_DIR}/{path}: the recorded copy is missing; `veritrain verify` lists what else is") from None


def _say_if_edited(entry: dict[str, Any], recorded_bytes: bytes, roots: list[Path], command: str, run: str) -> None:
    """One warning line when the file a fresh import would find differs from the recorded copy."""
    for root in [*roots, *(Path(p) for p in sys.path if p)]:
        candidate = root / entry["path"]
        if not candidate.is_file() or not is_user_file(candidate):
            continue
        current = candidate.read_bytes()
        if current != recorded_bytes:
            log.warning("%s: %s differs from the copy recorded with run %s at %s; using the recorded copy "
                        "(--use-current-code makes a new run with the current one)", command, candidate, run, first_difference(recorded_bytes, current))
        return


def from_folder(folder: Path, entries: list[dict[str, Any]], scratch_parent: Path, what: str) -> CodeSession:
    """A session over copies kept in `folder/code/` with their listing (a sweep's, made at its start)."""
    problem = check_listing(entries)
    if problem:
        raise RunFailed(f"{what}: code: {problem}")
    scratch = scratch_parent / f"code-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        for entry in entries:
            content = _read_copy(folder, entry["path"], what)
            if hashlib.sha256(content).hexdigest() != entry.get("sha256"):
                raise RunFailed(f"{what}: {CODE_DIR}/{entry['path']}: the copy of {entry['module']} does not match the hash recorded at the start")
            copy = scratch / entry["path"]
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(content)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return CodeSession([scratch], scratch=scratch, recorded=entries, describe=f"the code {what} recorded")


def listing_sha256(entries: list[dict[str, Any]]) -> str:
    """One hash for a listing: of its (module, path, sha256) lines, sorted."""
    lines = sorted(f"{e['module']}\t{e['path']}\t{e['sha256']}" for e in entries)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def current_listing(config_path: Optional[Path], model_target: Optional[str], task_target: Optional[str] = None) -> list[dict[str, Any]]:
    """The user files a new run of this config would record now (the model's target, a task's from an entry point,
    and what they import); [] without either. What --reuse-completed and the smoke test's cache compare, so an edit of
    the model or the task is never reused."""
    if not model_target and not task_target:
        return []
    with fresh(config_path) as session:
        if task_target:
            session.import_target(task_target, f"task (entry point {task_target})")
        if model_target:
            session.import_target(model_target)
        return session.listing()
