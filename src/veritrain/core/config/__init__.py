"""Run configuration: small typed sections composed into one `RunConfig`.

A config is a YAML file (read with `yaml.safe_load`) plus `--set key.path=value` overrides. Every
field is declared once (config/schema.py) with its type, default, range and meaning; unknown keys, wrong types
and out-of-range values are refused with one line naming the file (or `--set`) and the key path:

    error: configs/x.yaml: train.epochs: expected an integer ≥ 1, got 'abc'

Try it: `veritrain config show configs/digits.yaml --set train.epochs=3`.

The package: `schema` (the sections), `safe_yaml` (the hardened reader), `overrides` (`--set`), `messages` (error
text), `load` (`load_config`), `resolved` (the resolved config, its hash, rebuilt from a record), `reference`
(the key table of docs/config.md). The names below are its public face; import them from `veritrain.core.config`.
"""

from veritrain.core.config.load import DATA_PATH_KEYS, DEFAULT_CONFIG_NAME, load_config
from veritrain.core.config.messages import describe_field
from veritrain.core.config.reference import reference_markdown, reference_rows
from veritrain.core.config.resolved import (
    CONFIG_AS_GIVEN,
    FLAT_MODEL_SECTION,
    KEYS_ADDED_LATER,
    NOT_RECORDED,
    ResolvedConfig,
    as_hashed,
    compact,
    completed,
    config_dict,
    config_from_record,
    config_hash,
    paths_from_record,
    resolved_from_record,
    to_yaml,
    without_added_defaults,
)
from veritrain.core.config.safe_yaml import MAX_CONFIG_BYTES, MAX_NESTING, MAX_VALUES
from veritrain.core.config.schema import (
    INT64,
    MANY,
    AugmentConfig,
    CheckpointConfig,
    DataCard,
    DataConfig,
    EvalConfig,
    ExportConfig,
    GenerationConfig,
    Limit,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    Section,
    Side,
    TrainConfig,
    Width,
)

__all__ = [
    "AugmentConfig", "CONFIG_AS_GIVEN", "CheckpointConfig", "FLAT_MODEL_SECTION", "DATA_PATH_KEYS", "DEFAULT_CONFIG_NAME", "DataCard", "DataConfig",
    "EvalConfig", "ExportConfig", "GenerationConfig", "INT64", "KEYS_ADDED_LATER", "Limit", "LoggingConfig", "MANY", "MAX_CONFIG_BYTES", "MAX_NESTING",
    "MAX_VALUES", "ModelConfig", "NOT_RECORDED", "OptimConfig", "ResolvedConfig", "RunConfig", "ScheduleConfig", "Section", "Side",
    "TrainConfig", "Width", "as_hashed", "compact", "completed", "config_dict", "config_from_record", "config_hash", "describe_field", "load_config",
    "paths_from_record", "reference_markdown", "reference_rows", "resolved_from_record", "to_yaml", "without_added_defaults",
]
