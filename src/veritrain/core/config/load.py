"""`load_config`: read a YAML config (or the built-in default), apply `--set` overrides, refuse secrets, validate,
and resolve the data paths against the config file's folder. Every problem is one located `ConfigError`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from veritrain.core.config.messages import config_error
from veritrain.core.config.overrides import apply_override, parse_override
from veritrain.core.config.quoting import key_text, one_line, shown_value
from veritrain.core.config.resolved import ResolvedConfig
from veritrain.core.config.safe_yaml import read_yaml
from veritrain.core.config.schema import RunConfig
from veritrain.core.errors import ConfigError, UserError
from veritrain.core.secrets import config_secret, expand_env
from veritrain.core.selection import validation_problem
from veritrain.core.task_registry import foreign_setting

# The built-in default config is the one shipped as configs/digits.yaml; its experiment name
# follows the same rule as a file's (the file name without extension).
DEFAULT_CONFIG_NAME = "digits"


# data keys that name files or folders: relative values resolve against the config file's folder
DATA_PATH_KEYS = ("root", "csv", "labels", "split_dir", "test_split_file")


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> ResolvedConfig:
    """Read a YAML config (or the built-in default), apply `--set` overrides, validate.

    Raises ConfigError with a one-line, located message on any problem.
    """
    try:
        return _load_config(path, overrides)
    except ConfigError as err:
        if all(one_line(part) == part for part in (err.source, err.key or "", err.problem)):
            raise
        # a file name, key or value can hold a newline or a lone surrogate: the message stays one printable line
        raise ConfigError(one_line(err.source), one_line(err.key) if err.key else None, one_line(err.problem, 1000)) from None


def _leaves(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"augment": {"hflip": True}} → {"augment.hflip": True}; a list is one leaf."""
    found: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            found.update(_leaves(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def _load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...]) -> ResolvedConfig:
    source = str(path) if path is not None else "<default>"
    raw: dict[str, Any] = {}
    file_path: Optional[Path] = None
    if path is not None:
        file_path = Path(path)
        raw = read_yaml(file_path)

    overridden: set[str] = set()
    for item in overrides:
        key, value = parse_override(item)
        apply_override(raw, key, value)
        overridden.add(key)

    secret = config_secret(raw)  # before validation, whose messages quote values
    if secret is not None:
        where, kind = secret
        dotted = ".".join(where)
        origin = "--set" if any(dotted == o or dotted.startswith(o + ".") for o in overridden) else source
        raise ConfigError(origin, key_text(where), f"holds {kind}, and a run records its config as written; write the secret "
                          "as ${env:NAME} and export NAME before running")

    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as err:
        raise config_error(err, raw, source, overridden) from None

    # a setting only another task reads, away from its default, would be silently ignored
    foreign = foreign_setting(_leaves(raw), _leaves(RunConfig().model_dump(mode="json")), config.task)
    if foreign is not None:
        key, owner = foreign
        from_set = any(key == o or key.startswith(o + ".") or o.startswith(key + ".") for o in overridden)
        raise ConfigError("--set" if from_set else source, key, f"a setting of task {owner}, which task {config.task} does not read; "
                          f"remove it (or set task: {owner})")

    no_validation = validation_problem(config)  # best.pt or early stopping on a val split the ratios leave empty
    if no_validation is not None:
        key, problem = no_validation
        involved = {"data", "data.split_ratios", "data.split_dir", "checkpoint", "checkpoint.best", "checkpoint.best_metric",
                    "train", "train.early_stopping_patience"}
        raise ConfigError("--set" if overridden & involved else source, key, problem)

    if config.exp_name is None:
        name = file_path.stem if file_path else DEFAULT_CONFIG_NAME
        config = config.model_copy(update={"exp_name": name})

    data_paths = {}
    for name in DATA_PATH_KEYS:
        value = getattr(config.data, name)
        if value is None:
            continue
        from_set = bool({"data", f"data.{name}"} & overridden)
        try:
            path = Path(expand_env(value)).expanduser()
            if not path.is_absolute():
                base = Path.cwd() if (from_set or file_path is None) else file_path.resolve().parent
                path = base / path
            data_paths[name] = path.resolve()
        except UserError as err:  # ${env:NAME} of a variable that is not set
            raise ConfigError("--set" if from_set else source, f"data.{name}", str(err)) from None
        except (ValueError, OSError, RuntimeError) as err:  # a NUL byte, an unknown ~user, a name too long
            raise ConfigError("--set" if from_set else source, f"data.{name}", f"expected a path, got {shown_value(value)} ({err}); fix the path") from None
    return ResolvedConfig(config=config, path=file_path, overrides=list(overrides), data_paths=data_paths)
