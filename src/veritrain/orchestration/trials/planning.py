"""What every plan of a set of trials checks before anything runs: the base config, with a val split to select on
and `train.threads` pinned for every run; the engines it needs (Ray, Optuna); and the config values and
`--set`-style texts a trial's change is written in."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from veritrain.core.config import ResolvedConfig, load_config
from veritrain.core.errors import ConfigError, UserError
from veritrain.core.selection import has_validation_share
from veritrain.orchestration.trials.state import Kind


@dataclass
class Base:
    """The base config every trial changes: its file (absolute; None for the built-in default), the folder its
    relative paths resolve against, its `--set` overrides with the pinned threads, and why that count."""

    config_path: Optional[str]
    cwd: str
    config: ResolvedConfig
    overrides: list[str]
    threads: int
    threads_reason: str

    def as_spec(self) -> dict[str, Any]:
        """Its part of spec.json."""
        return {"config": {"path": self.config_path, "overrides": self.overrides, "hash": self.config.hash, "cwd": self.cwd},
                "exp_name": self.config.config.exp_name, "threads": self.threads, "threads_reason": self.threads_reason}


def plan_base(kind: Kind, config: Optional[str], overrides: list[str], parallel: int, parent_record: Optional[dict[str, Any]]) -> Base:
    """The base config, refused (exit 2) when it gives val no samples: the best trial is chosen on val, and the
    test split is for the final report only. `train.threads` is pinned unless the config sets it."""
    base = load_config(config, overrides)
    if not has_validation_share(base.config.data):
        origin = "--set" if any(o.split("=", 1)[0].strip() in ("data", "data.split_ratios") for o in overrides) else (config or "<default>")
        raise ConfigError(origin, "data.split_ratios", f"{list(base.config.data.split_ratios)} gives the val split no samples, and a "
                          f"{kind.name} picks its best trial on val (the test split is for the final report only); give val a share, e.g. "
                          "--set data.split_ratios=[0.8,0.1,0.1]")
    threads, reason = pinned_threads(base, parallel, parent_record)
    base_overrides = list(overrides)
    if base.config.train.threads is None:
        base_overrides.append(f"train.threads={threads}")
        base = load_config(config, base_overrides)
    return Base(config_path=str(Path(config).resolve()) if config else None, cwd=os.getcwd(), config=base, overrides=base_overrides,
                threads=threads, threads_reason=reason)


def pinned_threads(base: ResolvedConfig, parallel: int, parent_record: Optional[dict[str, Any]]) -> tuple[int, str]:
    """train.threads for every run of the set: a run's weights are bit-exact only for the same count, so a trial's
    final hash must not depend on which machine or worker ran it."""
    if base.config.train.threads is not None:
        return base.config.train.threads, "set in the base config"
    parent_threads = ((parent_record or {}).get("config") or {}).get("train", {}).get("threads")
    if isinstance(parent_threads, int):
        return parent_threads, "the --parent run's train.threads, so that the trials differ from it in their change only"
    if parallel > 1:
        return 1, f"--parallel {parallel}: one thread per run, so that parallel runs do not compete for cores"
    import torch  # only here: planning otherwise needs no torch

    return torch.get_num_threads(), "torch's default on the machine that made the plan"


def require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise UserError("--backend ray: the ray package is not installed; pip install 'veritrain[ray]'")


def require_optuna() -> None:
    if importlib.util.find_spec("optuna") is None:
        raise UserError("search: the optuna package is not installed; pip install 'veritrain[search]'")


MISSING = object()  # what `value_at` gives for a key the config does not hold


def value_at(config: dict[str, Any], key: str) -> Any:
    """The value of a dotted key in a config as a mapping, or MISSING."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def change_text(change: dict[str, Any]) -> str:
    """`optim.lr=0.05, train.batch_size=32`"""
    return ", ".join(f"{key}={shown(value)}" for key, value in change.items())


def override_text(value: Any) -> str:
    """`--set KEY=<this>` for a config value: JSON, which the config's YAML reads back to the same value
    (floats in Python's shortest round-trip form, with a dot or exponent)."""
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    return json.dumps(value)


def split_values(text: str) -> list[str]:
    """`0.1,0.01` → ['0.1', '0.01']; commas inside brackets, braces or quotes belong to the value, so
    `[32,32],[64]` is two lists."""
    values, depth, quote, start = [], 0, "", 0
    for position, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            values.append(text[start:position].strip())
            start = position + 1
    values.append(text[start:].strip())
    return values


def parse_vary(items: tuple[str, ...] | list[str]) -> list[tuple[str, list[str]]]:
    """`--vary KEY=V1,V2,…` options as (key, [value texts]), in the order given."""
    parsed: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError("--vary", item, "expected KEY.PATH=V1,V2,..., e.g. --vary optim.lr=0.01,0.001")
        if any(key == seen for seen, _ in parsed):
            raise ConfigError("--vary", key, "given in two --vary options; list all its values in one: --vary KEY=V1,V2,...")
        if not text.strip():
            raise ConfigError("--vary", key, "no values; give one or more, comma-separated, e.g. --vary optim.lr=0.01,0.001")
        values = split_values(text)
        if any(not value for value in values):
            raise ConfigError("--vary", key, f"an empty value in {text!r}; give values separated by single commas")
        parsed.append((key, values))
    return parsed
