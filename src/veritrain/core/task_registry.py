"""The registry of tasks by name: name → factory(run config) → Task (the protocol in `veritrain.tasks`).

A leaf module, so that config validation (`task:` must name a registered task) and the tasks package
share one registry without importing each other. Add a task with `veritrain.tasks.register_task`; what it declares
about its metrics (its TaskSpec) is read with `task_spec`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Callable, Optional

from veritrain.core.errors import UserError
from veritrain.core.task_spec import TaskSpec

if TYPE_CHECKING:  # the config's validation imports this module
    from veritrain.core.config.schema import RunConfig


def _builtin(target: str) -> Callable[[Any], Any]:
    """A factory that imports the task's module when a run builds the task (so torch loads only then), by the
    module path in `target` ("module:Class"); this registry imports nothing, as config validation needs only names."""

    def factory(cfg: RunConfig) -> Any:
        module, _, name = target.partition(":")
        built: Any = importlib.import_module(module)
        for part in name.split("."):
            built = getattr(built, part)
        return built(cfg)

    factory.__qualname__ = f"task {target}"
    return factory


# name → factory(run config) → Task; the built-in tasks are added below, from veritrain.tasks.builtin
TASKS: dict[str, Callable[[Any], Any]] = {}

# Each task's TaskSpec (veritrain.core.task_spec), by task name: the object, or where a built-in declares it
# ("module:NAME", imported when first asked for: the declarations are torch-free)
SPECS: dict[str, Any] = {}

BUILT_IN = "veritrain.tasks.builtin"  # the table of the tasks veritrain ships (names and where their code is)

# The entry-point group an installed package names its tasks in, as `NAME = "module:Class"` (pyproject.toml:
# [project.entry-points."veritrain.tasks"]); the class carries its TaskSpec as `spec`. Read once, the first time a
# name is not registered otherwise (a registered or built-in name wins).
ENTRY_POINTS = "veritrain.tasks"
FROM_ENTRY_POINTS: dict[str, str] = {}  # name → "module:Class" of the tasks found there
_entry_points_read = False


def _read_entry_points() -> None:
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True

    for point in entry_points(group=ENTRY_POINTS):
        if point.name not in TASKS and ":" in point.value:
            add_task_target(point.name, point.value)


def add_task_target(name: str, target: str) -> None:
    """Register task `name` as the class "module:Class" names (imported when first built or asked for its `spec`), as
    an entry point of that name does."""
    TASKS[name] = _builtin(target)
    SPECS.setdefault(name, f"{target}.spec")
    FROM_ENTRY_POINTS[name] = target


def known(name: str) -> bool:
    """Whether `task: NAME` names a task: built in, registered, or an installed package's entry point."""
    if name not in TASKS:
        _read_entry_points()
    return name in TASKS


def task_names() -> list[str]:
    _read_entry_points()
    return sorted(TASKS)


def task_target(name: str) -> Optional[str]:
    """"module:Class" of a task an entry point names (its module is the user's code when its file is the user's:
    a run imports it in its code session, which records it), None for any other task."""
    known(name)
    return FROM_ENTRY_POINTS.get(name)


def task_spec(name: str) -> Any:
    """The TaskSpec task `name` declares: given to `register_task`, the factory's own `spec` attribute (a task class
    declaring it), or a built-in's declaration. A task that declares none is a UserError naming the fix."""

    known(name)
    found = SPECS.get(name)
    if isinstance(found, str):
        module, _, attribute = found.partition(":")
        try:
            found = importlib.import_module(module)
        except Exception as err:  # an installed package's module that does not import: one line, not a traceback
            raise UserError(f"task {name!r}: importing {module} for its TaskSpec failed: {type(err).__name__}: {' '.join(str(err).split())[:300]}") from None
        for part in attribute.split("."):
            found = getattr(found, part, None)
        SPECS[name] = found
    if found is None:
        found = getattr(TASKS.get(name), "spec", None)
    if found is None:
        raise UserError(f"task {name!r} declares no TaskSpec: give register_task(name, factory, spec=TaskSpec(...)) or a `spec` "
                        "attribute on the task class (veritrain.core.task_spec)")
    return found


def spec_of_record(record: Any) -> Any:
    """The TaskSpec of a run record's task: the declaration the record keeps (`task_spec`), else the one this process
    knows by the task's name (records made before they kept it), else None (a task registered by code that is not
    loaded here): what reads records then shows their numbers without the task's goals."""

    kept = record.get("task_spec") if isinstance(record, dict) else None
    if isinstance(kept, dict):
        try:
            return TaskSpec.from_json(kept)
        except ValueError:
            pass
    task = ((record or {}).get("config") or {}).get("task") if isinstance(record, dict) else None
    if not isinstance(task, str):
        return None
    try:
        return task_spec(task)
    except UserError:
        return None


def serving_command(task: Any) -> Optional[str]:
    """The veritrain command that uses an export of task `task` (its TaskSpec's serves_with), None when no command
    does or the task is not known here (an export folder names its task: a name from anywhere)."""

    if not isinstance(task, str) or not known(task) and task not in SPECS:
        return None
    try:
        return task_spec(task).serves_with
    except UserError:
        return None


def _add_built_in() -> str:
    """The tasks veritrain ships, read from their table (a module of strings: importing it loads no task's code);
    the name of the default task."""
    table = importlib.import_module(BUILT_IN)
    for name, target in table.TASKS.items():
        TASKS.setdefault(name, _builtin(target))
    for name, target in table.SPECS.items():
        SPECS.setdefault(name, target)
    return str(table.DEFAULT)


DEFAULT_TASK = _add_built_in()  # the config's `task` when it names none
# "module:Class" of the model section of a task that declares none (TaskSpec.model_section): the built-in image models'
DEFAULT_MODEL_SECTION: str = importlib.import_module(BUILT_IN).MODEL_SECTION


def foreign_setting(written: dict[str, Any], defaults: dict[str, Any], task: str) -> Optional[tuple[str, str]]:
    """(key, the task it belongs to) of the first leaf of `written` (a config as the user wrote it, flattened to dotted
    keys) that another task declares as its own setting (TaskSpec.settings), that task `task` does not, and whose value
    is not its default (`defaults`, flattened): nothing would read it, so it would change nothing. The model section's
    keys are each task's own (TaskSpec.model_section), checked by the config's validation. Only declarations this
    process has without importing a task's module are consulted (`available_specs`)."""

    def covers(setting: str, key: str) -> bool:
        return key == setting or key.startswith(setting + ".")

    try:
        own = task_spec(task).settings
    except UserError:
        return None
    missing = object()
    for name in available_specs():
        if name == task:
            continue
        settings = task_spec(name).settings
        for key, value in written.items():
            if any(covers(s, key) for s in settings) and not any(covers(s, key) for s in own) and defaults.get(key, missing) != value:
                return key, name
    return None


def available_specs() -> list[str]:
    """The tasks, by name, whose TaskSpec this process has without importing a user's module: the built-in ones, those
    given to register_task (or declared by their class), and those already read; a task whose declaration fails to
    load is left out."""
    found = []
    for name in sorted(SPECS):
        declared = SPECS[name]
        if declared is None or isinstance(declared, str) and not declared.startswith("veritrain."):
            continue
        try:
            task_spec(name)
        except UserError:
            continue
        found.append(name)
    return found


def model_keys_by_model() -> dict[str, set[str]]:
    """Built-in model name → the config keys it reads (TaskSpec.model_settings), among the declarations this process has
    (`available_specs`)."""
    found: dict[str, set[str]] = {}
    for name in available_specs():
        for model, keys in task_spec(name).model_settings:
            found.setdefault(model, set()).update(keys)
    return found


def built_in_model_keys() -> tuple[str, ...]:
    """`model.name` and every config key a declared built-in model reads: the settings a run of a user's model
    (model.target) does not use."""
    return ("model.name", *sorted({key for keys in model_keys_by_model().values() for key in keys}))


def declared_models() -> set[str]:
    """The model names (model.name) the tasks declare (TaskSpec.models) among the declarations this process has
    (`available_specs`)."""
    return {model for name in available_specs() for model in task_spec(name).models}
