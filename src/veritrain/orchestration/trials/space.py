"""The space of `veritrain search`: a typed YAML file that maps config keys to ranges or choices,
validated like a config (one line, exit 2) before anything runs.

    optim.lr: {log_uniform: [1.0e-4, 1.0e-1]}     # a float, sampled on a log scale
    model.dropout: {uniform: [0.0, 0.5]}          # a float
    train.batch_size: {int: [16, 128], step: 16}  # an integer (with an optional step)
    model.hidden: {log_int: [16, 512]}            # an integer on a log scale
    model.widths: {choice: [[16, 32], [32, 64]]}  # one of these values, whatever their type

Each key must be a key of the config (the value at both ends of a range, and every choice, is loaded as the
config would load it, so a wrong type is refused here); `data.*` keys are refused, since the trials must
share one data version and its val split to be compared; `train.threads` is pinned by the search."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Optional

from veritrain.core.config import load_config
from veritrain.core.config.safe_yaml import load_yaml_text, read_yaml_file
from veritrain.core.errors import ConfigError
from veritrain.core.hashing import sha256_file
from veritrain.orchestration.trials import samplers
from veritrain.orchestration.trials.planning import MISSING, override_text, value_at

KINDS = ("uniform", "log_uniform", "int", "log_int", "choice")
CONTINUOUS = ("uniform", "log_uniform")
MAX_GRID_POINTS = 100_000  # a grid beyond this would be planned in memory for nothing: nobody runs it


@dataclass(frozen=True)
class Param:
    """One searched key: its kind and range (low, high, step) or its choices (as the config holds them)."""

    key: str
    kind: str
    low: Optional[float] = None
    high: Optional[float] = None
    step: Optional[int] = None
    choices: Optional[tuple[Any, ...]] = None

    def as_dict(self) -> dict[str, Any]:
        if self.kind == "choice":
            return {"key": self.key, "kind": self.kind, "choices": list(self.choices or ())}
        return {"key": self.key, "kind": self.kind, "low": self.low, "high": self.high, **({"step": self.step} if self.step else {})}

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> "Param":
        choices = entry.get("choices")
        return cls(key=entry["key"], kind=entry["kind"], low=entry.get("low"), high=entry.get("high"), step=entry.get("step"),
                   choices=tuple(choices) if choices is not None else None)

    # ---------------------------------------------------------------- as Optuna sees it

    def distribution(self) -> Any:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "choice":
            return CategoricalDistribution(self.encoded_choices())
        if self.kind in CONTINUOUS:
            return FloatDistribution(float(self.low or 0.0), float(self.high or 0.0), log=self.kind == "log_uniform")
        return IntDistribution(int(self.low or 0), int(self.high or 0), log=self.kind == "log_int", step=self.step or 1)

    def encoded_choices(self) -> list[Any]:
        """Optuna keeps categorical values as scalars: a key with a list or mapping among its choices has all of
        them as their JSON text (`[16, 32]`), which is also what its study and plots show."""
        choices = list(self.choices or ())
        if all(value is None or isinstance(value, (bool, int, float, str)) for value in choices):
            return choices
        return [json.dumps(value) for value in choices]

    def decoded(self, value: Any) -> Any:
        """The config value of an Optuna parameter value."""
        if self.kind == "choice" and self.encoded_choices() != list(self.choices or ()):
            return json.loads(value)
        return value

    def encoded(self, value: Any) -> Any:
        """The Optuna parameter value of a config value (an enqueued configuration)."""
        if self.kind == "choice" and self.encoded_choices() != list(self.choices or ()):
            return json.dumps(value)
        return value

    def grid_values(self) -> list[Any]:
        if self.kind == "choice":
            return self.encoded_choices()
        low, high = int(self.low or 0), int(self.high or 0)
        return list(range(low, high + 1, self.step or 1))

    def contains(self, value: Any) -> bool:
        if self.kind == "choice":
            return any(value == c and type(value) is type(c) for c in self.choices or ())
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind in ("int", "log_int") and not isinstance(value, int):
            return False
        inside = float(self.low or 0) <= value <= float(self.high or 0)
        return inside and (not self.step or (int(value) - int(self.low or 0)) % self.step == 0)


@dataclass
class Space:
    file: str  # the path given
    sha256: str  # of the file's bytes
    params: list[Param]

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "params": [p.as_dict() for p in self.params]}

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> "Space":
        return cls(file=entry["file"], sha256=entry["sha256"], params=[Param.from_dict(p) for p in entry["params"]])

    def distributions(self) -> dict[str, Any]:
        return {p.key: p.distribution() for p in self.params}

    def change(self, params: dict[str, Any]) -> dict[str, Any]:
        """Optuna's parameters of a trial → config key → config value, in the space's order."""
        return {p.key: p.decoded(params[p.key]) for p in self.params if p.key in params}

    def overrides(self, change: dict[str, Any]) -> list[str]:
        return [f"{key}={override_text(value)}" for key, value in change.items()]

    def grid(self, where: str) -> dict[str, list[Any]]:
        """The grid of `--sampler grid`: every value of each key; a continuous range has none (exit 2)."""
        continuous = [p.key for p in self.params if p.kind in CONTINUOUS]
        if continuous:
            raise ConfigError(where, continuous[0], "a continuous range has no grid; give --sampler tpe or random, or list the "
                              "values to try: {choice: [...]}")
        grid = {p.key: p.grid_values() for p in self.params}
        points = math.prod(len(values) for values in grid.values())
        if points > MAX_GRID_POINTS:
            raise ConfigError(where, "space", f"the grid has {points:,} points (at most {MAX_GRID_POINTS:,}); give --sampler tpe or random, "
                              "or fewer values")
        return grid

    def grid_size(self) -> int:
        return math.prod(len(p.grid_values()) for p in self.params)

    def grid_points(self, where: str, seed: int) -> list[dict[str, Any]]:
        """Every point of the grid (Optuna's parameter values), in the order a search's trials take them: the grid
        sampler's, shuffled by the search's seed."""
        return samplers.grid(self.grid(where), shuffle_seed=seed)


def load_space(path: str, config: Optional[str], overrides: list[str]) -> Space:
    """Read and check a space file against the config it searches (its path and --set overrides)."""
    where = str(path)
    document = read_yaml_file(path)  # the config reader's limits and one-line errors (not found, not a mapping, bad YAML)
    if not document:
        raise ConfigError(where, "space", "expected a mapping of config keys to ranges, e.g. optim.lr: {log_uniform: [1.0e-4, 1.0e-1]}")
    params = [_param(where, key, entry) for key, entry in document.items()]
    for param in params:
        _check_against_config(where, param, config, overrides)
    return Space(file=where, sha256=sha256_file(path), params=params)


def _param(where: str, key: Any, entry: Any) -> Param:
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise ConfigError(where, str(key), "expected a config key such as optim.lr")
    if key.split(".")[0] == "data":
        raise ConfigError(where, key, "a search compares its trials on one data version and its val split; data keys change them: "
                          "search the other keys, and give the data with --set or the config")
    if key == "train.threads":
        raise ConfigError(where, key, "the search pins train.threads for every trial (their weights are bit-exact for one count); "
                          "set it in the config or with --set")
    if not isinstance(entry, dict):
        raise ConfigError(where, key, f"expected a mapping with one of {', '.join(KINDS)}, e.g. {{log_uniform: [1.0e-4, 1.0e-1]}}")
    kinds = [k for k in entry if k in KINDS]
    unknown = [str(k) for k in entry if k not in KINDS and k != "step"]
    if unknown:
        raise ConfigError(where, f"{key}.{unknown[0]}", f"unknown; give one of {', '.join(KINDS)} (and step, for int)")
    if len(kinds) != 1:
        raise ConfigError(where, key, f"give exactly one of {', '.join(KINDS)}" + (f" (found {', '.join(kinds)})" if kinds else ""))
    kind = kinds[0]
    value = entry[kind]
    if "step" in entry and kind != "int":
        raise ConfigError(where, f"{key}.step", "only an int range takes a step")
    if kind == "choice":
        if not isinstance(value, list) or not value:
            raise ConfigError(where, f"{key}.choice", "expected a non-empty list of values, e.g. {choice: [32, 64]}")
        texts = [json.dumps(v, sort_keys=True) for v in value]
        if len(set(texts)) != len(texts):
            raise ConfigError(where, f"{key}.choice", f"{next(t for t in texts if texts.count(t) > 1)} is listed twice")
        return Param(key=key, kind=kind, choices=tuple(value))
    if not isinstance(value, list) or len(value) != 2 or not all(_number(v) for v in value):
        raise ConfigError(where, f"{key}.{kind}", "expected [low, high], two numbers")
    low, high = value
    if kind in ("int", "log_int"):
        if not all(isinstance(v, int) for v in value):
            raise ConfigError(where, f"{key}.{kind}", f"expected two integers, found {value}; use uniform for a float range")
        if low >= high:
            raise ConfigError(where, f"{key}.{kind}", f"the range [{low}, {high}] is empty; give low < high")
    elif not low < high:
        raise ConfigError(where, f"{key}.{kind}", f"the range [{low}, {high}] is empty; give low < high")
    if kind in ("log_uniform", "log_int") and low <= 0:
        raise ConfigError(where, f"{key}.{kind}", f"a log scale needs low > 0 (found {low})")
    step = entry.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 1 or (high - low) % step):
        raise ConfigError(where, f"{key}.step", f"expected a positive integer that divides high - low ({high - low}), found {step!r}")
    if kind in CONTINUOUS:
        return Param(key=key, kind=kind, low=float(low), high=float(high))
    return Param(key=key, kind=kind, low=low, high=high, step=step)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_against_config(where: str, param: Param, config: Optional[str], overrides: list[str]) -> None:
    """Every end of a range and every choice loads as this key of the config: an unknown key or a value of the
    wrong type is refused now, with the config's own message, not at the trial that draws it."""
    if param.kind == "choice":
        values = list(param.choices or ())
    elif param.kind in CONTINUOUS:  # and a value between: an integer key takes 1.0, never 1.37
        values = [param.low, param.high, round((param.low or 0.0) + 0.37 * ((param.high or 0.0) - (param.low or 0.0)), 6)]
    else:
        values = [int(param.low or 0), int(param.high or 0)]
    for value in values:
        try:
            resolved = load_config(config, [*overrides, f"{param.key}={override_text(value)}"])
        except ConfigError as err:
            raise ConfigError(where, param.key, f"{override_text(value)}: {err.problem}") from None
        if value_at(resolved.as_dict(), param.key) is MISSING:
            raise ConfigError(where, param.key, "not a key of the config; `veritrain config keys` lists them")


def enqueued(where: str, text: str, space: Space) -> dict[str, Any]:
    """`--enqueue '{optim.lr: 1.0e-5}'`: a configuration to try, as config key → value; every key of the space,
    each value inside its range or among its choices."""
    try:
        document = load_yaml_text(text, where)
    except ConfigError as err:
        raise ConfigError(where, text[:40], err.problem) from None
    if not isinstance(document, dict) or not document:
        raise ConfigError(where, text[:40], "expected a mapping of the space's keys to values, e.g. --enqueue '{optim.lr: 0.01}'")
    by_key = {p.key: p for p in space.params}
    for key, value in document.items():
        if key not in by_key:
            raise ConfigError(where, str(key), f"not a key of the space ({', '.join(by_key)})")
        if not by_key[key].contains(value):
            raise ConfigError(where, str(key), f"{override_text(value)} is outside the space ({_shown_range(by_key[key])}); "
                              "widen the space or give a value inside it")
    missing = [key for key in by_key if key not in document]
    if missing:
        raise ConfigError(where, missing[0], "missing: an enqueued configuration gives a value for every key of the space")
    return {key: document[key] for key in by_key}


def _shown_range(param: Param) -> str:
    if param.kind == "choice":
        return "one of " + ", ".join(override_text(v) for v in param.choices or ())
    return f"{param.kind} [{param.low}, {param.high}]" + (f" step {param.step}" if param.step else "")
