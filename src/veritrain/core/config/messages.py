"""Error text of a refused config: a pydantic validation error turned into one `ConfigError` naming the file
(or `--set`) and the key path, and the words for what a key expects (`an integer ≥ 1`, `one of 'sgd', 'adamw'`)."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from veritrain.core.config.quoting import key_text, quoted_list, shown_value
from veritrain.core.config.schema import Limit, ModelConfig, RunConfig, model_key_owner, model_section, section_type
from veritrain.core.errors import ConfigError
from veritrain.core.task_registry import DEFAULT_TASK


def config_error(err: ValidationError, raw: dict[str, Any], source: str, overridden: set[str]) -> ConfigError:
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"]]  # a YAML key can be a number; list indices come after a non-section and stop the walk
    # report at the level of a declared field: `model.widths`, not `model.widths.1`
    model: type[BaseModel] = RunConfig
    field_path: list[str] = []
    field_info = None
    task = raw.get("task", DEFAULT_TASK)
    for part in loc:
        if field_info is not None:
            sub = section_type(field_info.annotation)
            if sub is None:
                break
            model = model_section(task) if sub is ModelConfig else sub  # `model` is read with its task's section
        if part not in model.model_fields:
            field_path.append(part)
            field_info = None
            break
        field_path.append(part)
        field_info = model.model_fields[part]
    dotted = ".".join(field_path)
    origin = "--set" if any(dotted == o or dotted.startswith(o + ".") or o.startswith(dotted + ".") for o in overridden) else source
    key = key_text(field_path) or "(top level)"

    if first["type"] in ("extra_forbidden", "invalid_key"):
        valid = list(model.model_fields)
        scope = key_text(field_path[:-1]) or "the top level"
        if first["type"] == "invalid_key":  # YAML reads `1:`, `true:` and `~:` as a number, a boolean and null
            key = key_text(field_path[:-1] + [shown_value(first["input"])])
            return ConfigError(origin, key, f"expected a key name, got {shown_value(first['input'])}; valid keys in {scope}: {', '.join(valid)}")
        owner = model_key_owner(field_path[-1], task) if model is not RunConfig and issubclass(model, ModelConfig) else None
        if owner is not None:
            return ConfigError(origin, key, f"a setting of task {owner}, which task {task} does not read; remove it (or set task: {owner})")
        close = difflib.get_close_matches(field_path[-1], valid, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return ConfigError(origin, key, f"unknown key; {hint}valid keys in {scope}: {', '.join(valid)}")

    value = _lookup(raw, field_path)
    if field_info is not None and first["type"] == "value_error":
        message = str(first["ctx"]["error"]) if "ctx" in first else first["msg"]
        return ConfigError(origin, key, message)
    if field_info is not None and first["type"] == "out_of_limit":
        return ConfigError(origin, key, f"expected {describe_field(field_info, limits=True)}, got {shown_value(value)}")
    if field_info is not None and first["type"] == "finite_number":
        return ConfigError(origin, key, f"expected {describe_field(field_info).replace('number', 'finite number', 1)}, got {shown_value(value)}")
    if field_info is not None and section_type(field_info.annotation) is ModelConfig:
        return ConfigError(origin, key, f"expected a section (mapping) with keys {', '.join(model_section(task).model_fields)}, got {shown_value(value)}")
    if field_info is not None:
        return ConfigError(origin, key, f"expected {describe_field(field_info)}, got {shown_value(value)}")
    return ConfigError(origin, key, first["msg"])


def _lookup(raw: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(raw, dict) or part not in raw:
            return None
        raw = raw[part]
    return raw


def describe_field(info: FieldInfo, limits: bool = False) -> str:
    """Human description of a field's type and range, e.g. 'an integer ≥ 1'; with `limits`, its Limit too."""
    annotation = info.annotation
    optional = typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(annotation)
    if optional:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    text = _describe(annotation, limits) + _constraints(info.metadata, limits)
    if any(getattr(item, "min_length", None) == 1 for item in info.metadata) and text.startswith("a list"):
        text = "a non-empty list" + text[len("a list"):]
    return text + (" or null" if optional else "")


def _constraints(metadata: list[Any], limits: bool = False) -> str:
    words = []
    for item in metadata:
        if limits and isinstance(item, Limit):
            words.extend(([f"≥ {item.least}"] if item.least is not None else []) + [f"≤ {item.most}"])
        for attr, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(item, attr, None)
            if bound is not None:
                words.append(f"{symbol} {bound:g}" if isinstance(bound, float) else f"{symbol} {bound}")
        min_length = getattr(item, "min_length", None) or 0
        if min_length > 1:
            words.append(f"with at least {min_length} items")
    return (" " + " and ".join(words)) if words else ""


def _describe(annotation: Any, limits: bool = False) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _describe(args[0], limits) + _constraints(list(args[1:]), limits)
    if origin is Literal:
        return f"one of {quoted_list(args)}"
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(_describe(a, limits) for a in inner)
        return text + " or null" if len(inner) < len(args) else text
    if origin is list:
        return f"a list of {_plural(args[0], limits)}"
    if origin is tuple:
        return f"a list of {len(args)} {_plural(args[0], limits)}"
    if section_type(annotation):
        return f"a section (mapping) with keys {', '.join(annotation.model_fields)}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(annotation, str(annotation))


def _plural(annotation: Any, limits: bool = False) -> str:
    text = _describe(annotation, limits)
    for article in ("an ", "a "):
        if text.startswith(article):
            noun, _, rest = text[len(article):].partition(" ")
            return f"{noun}s {rest}".strip()
    return text
