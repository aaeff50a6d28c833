"""The registry of tasks by name: name → factory(run config) → Task (the protocol in `veritrain.tasks`).

A leaf module, so that config validation (`task:` must name a registered task) and the tasks package
share one registry without importing each other. Add a task with `veritrain.tasks.register_task`.
"""

from __future__ import annotations

from typing import Any, Callable


def _classification(cfg: Any) -> Any:
    from veritrain.tasks.classification import ClassificationTask  # torch only when a run builds the task

    return ClassificationTask(cfg)


TASKS: dict[str, Callable[[Any], Any]] = {"classification": _classification}
