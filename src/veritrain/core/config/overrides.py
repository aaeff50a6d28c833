"""`--set key.path=value` overrides: each parsed as a YAML value (text when it is not YAML) and applied to the
raw config before validation, refusing a path that runs through a value instead of a section."""

from __future__ import annotations

import typing
from typing import Any, Optional

import yaml
from pydantic import BaseModel

from veritrain.core.config.safe_yaml import parse_yaml
from veritrain.core.config.schema import RunConfig, section_type
from veritrain.core.errors import ConfigError


def parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError("--set", item, "expected KEY.PATH=VALUE, e.g. --set train.epochs=5")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes on the command line
        raise ConfigError("--set", key, "unknown key with bytes that are not UTF-8; see `veritrain config keys` for the keys") from None
    try:
        value = parse_yaml(text, "--set", key.split(".")) if text.strip() else ""
    except yaml.YAMLError:
        value = text  # not YAML: keep the text; validation says what was expected
    return key, value


def apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    schema: Optional[type[BaseModel]] = RunConfig  # None once the path leaves the declared sections
    for depth, part in enumerate(parts[:-1]):
        prefix = ".".join(parts[: depth + 1])
        info = schema.model_fields.get(part) if schema else None
        schema = section_type(info.annotation) if info else None
        mapping = info is not None and typing.get_origin(info.annotation) is dict  # model.kwargs.max_tokens=512
        child = node.get(part)
        if (info is not None and schema is None and not mapping) or (child is not None and not isinstance(child, dict)):
            raise ConfigError("--set", key, f"{prefix} is a value, not a section; set {prefix}=... instead")
        if child is None:
            child = node[part] = {}
        node = child
    node[parts[-1]] = value
