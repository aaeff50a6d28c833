"""The key reference: (key path, type, default, meaning) for every leaf key of `RunConfig`, the source of
docs/config.md and `veritrain config keys`."""

from __future__ import annotations

import json
import typing
from typing import Annotated, Any

from pydantic import BaseModel

from veritrain.core.config.messages import describe_field
from veritrain.core.config.schema import Limit, ModelConfig, RunConfig, declared_sections, section_type


def reference_rows(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key path, type, default, meaning) for every leaf key: the source of docs/config.md. The model section lists its
    shared keys, then each task's own (`model_rows`)."""
    rows = []
    for name, info in model.model_fields.items():
        path = prefix + name
        sub = section_type(info.annotation)
        if sub is ModelConfig:
            rows.extend(model_rows(path + "."))
            continue
        if sub is not None:
            rows.extend(reference_rows(sub, path + "."))
            continue
        default = info.get_default(call_default_factory=True)
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        limits = _limits(info.annotation) + [item for item in info.metadata if isinstance(item, Limit)]
        meaning = "; ".join([info.description or ""] + [("each " if _is_list(info.annotation) else "") + limit.describe() for limit in limits])
        rows.append((path, describe_field(info), shown, meaning))
    return rows


def model_rows(prefix: str) -> list[tuple[str, str, str, str]]:
    """The keys every model section has (ModelConfig), then, for each section the tasks declare (veritrain.core.config.
    schema.declared_sections), the keys it adds or declares anew, its meaning led by the tasks that read it. A key two
    sections declare has a row for each."""
    rows = reference_rows(ModelConfig, prefix)
    readers: dict[type[ModelConfig], list[str]] = {}
    for task, section in declared_sections():
        readers.setdefault(section, []).append(task)
    for section, tasks in readers.items():
        own = [name for name in section.model_fields if name not in ModelConfig.model_fields or name in _declared_in(section)]
        lead = f"task {tasks[0]}" if len(tasks) == 1 else f"tasks {', '.join(tasks)}"
        rows.extend((key, kind, default, f"{lead}: {meaning}") for key, kind, default, meaning in reference_rows(section, prefix)
                    if key.removeprefix(prefix) in own)
    return rows


def _declared_in(section: type[BaseModel]) -> set[str]:
    """The fields a section's own classes declare, below ModelConfig (not those it inherits from it)."""
    return {name for cls in section.__mro__ if cls is not ModelConfig and issubclass(cls, ModelConfig) for name in cls.__dict__.get("__annotations__", {})}


def _limits(annotation: Any) -> list[Limit]:
    """The Limits inside a type: Optional[Annotated[int, Limit(n)]], list[Width], ..."""
    args = typing.get_args(annotation)
    own = [a for a in args[1:] if isinstance(a, Limit)] if typing.get_origin(annotation) is Annotated else []
    inner = args[:1] if typing.get_origin(annotation) is Annotated else args
    found = own + [limit for arg in inner for limit in _limits(arg)]
    return list(dict.fromkeys(found))  # tuple[Side, Side]: once


def _is_list(annotation: Any) -> bool:
    return any(typing.get_origin(a) in (list, tuple) for a in (annotation, *typing.get_args(annotation)))


def reference_markdown() -> str:
    lines = [
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for key, kind, default, meaning in reference_rows():
        lines.append(f"| `{key}` | {kind} | `{default}` | {meaning} |")
    return "\n".join(lines) + "\n"
