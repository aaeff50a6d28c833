"""A script's config in canonical form: a dict, a dataclass, a pydantic model or an argparse Namespace becomes
a plain JSON object, hashed as `core.hashing.sha256_json` hashes it (sorted keys, no whitespace, UTF-8).

Only values JSON holds exactly are taken: None, bool, int, float (finite), str, lists and tuples of them (a
tuple is stored as a list), and mappings with string keys. A `pathlib` path is taken as its string. Anything
else (a set, a tensor, a NumPy scalar, an object) is refused with the key it sits under, never converted:
two different configs must never store, or hash, the same."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from veritrain.core.errors import UserError


def canonical_config(config: object) -> dict[str, Any]:
    """The config as a JSON object; UserError (one line naming the key) for a value JSON cannot hold exactly."""
    top = _as_mapping(config)
    if top is None:
        raise UserError(f"config: a {type(config).__name__} is not a config; pass a dict, a dataclass, a pydantic model "
                        "or an argparse Namespace")
    return {str(key): _value(value, str(key)) for key, value in _items(top, "config")}


def _as_mapping(value: object) -> Mapping[Any, Any] | None:
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, argparse.Namespace):
        return vars(value)
    dump = getattr(type(value), "model_dump", None)  # pydantic 2; its own types stay as they are (mode="python")
    if callable(dump) and hasattr(type(value), "model_fields"):
        dumped = dump(value)
        return dumped if isinstance(dumped, Mapping) else None
    return None


def _items(mapping: Mapping[Any, Any], where: str) -> list[tuple[str, Any]]:
    for key in mapping:
        if not isinstance(key, str):
            raise UserError(f"config: {where}: the key {key!r} is a {type(key).__name__}; config keys must be strings")
    return list(mapping.items())


def _value(value: Any, key: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and type(value) is int:
        return value
    if isinstance(value, float) and type(value) is float:
        if not math.isfinite(value):
            raise UserError(f"config: {key}: {value} is not a finite number; JSON cannot hold it (use None or a string)")
        return value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_value(item, f"{key}[{index}]") for index, item in enumerate(value)]
    nested = _as_mapping(value)
    if nested is not None:
        return {name: _value(item, f"{key}.{name}") for name, item in _items(nested, key)}
    kind = type(value).__qualname__ if type(value).__module__ == "builtins" else f"{type(value).__module__}.{type(value).__qualname__}"
    raise UserError(f"config: {key}: a {kind} cannot be recorded exactly; "
                    "give it as a number, string, bool, list or dict (for example float(x) or x.tolist())")
