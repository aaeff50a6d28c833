"""The registry of tasks by name: name → factory(run config) → Task (the protocol in `veritrain.tasks`).

A leaf module, so that config validation (`task:` must name a registered task) and the tasks package
share one registry without importing each other. Add a task with `veritrain.tasks.register_task`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the config's validation imports this module
    from veritrain.core.config.schema import RunConfig


def _builtin(target: str) -> Callable[[Any], Any]:
    """A factory that imports the task's module when a run builds the task (so torch loads only then), by the
    module path in `target` ("module:Class"); this registry imports nothing, as config validation needs only names."""

    def factory(cfg: RunConfig) -> Any:
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)(cfg)

    factory.__qualname__ = f"task {target}"
    return factory


TASKS: dict[str, Callable[[Any], Any]] = {"classification": _builtin("veritrain.tasks.classification:ClassificationTask"),
                                          "lm": _builtin("veritrain.tasks.lm:LanguageModelTask")}
