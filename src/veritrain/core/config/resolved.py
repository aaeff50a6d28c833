"""The resolved config: a validated `RunConfig` with where it came from and its data paths made absolute; its
canonical dict and hash (keys added later hash only when they differ from their default); how it reads in a run
(one line per section, YAML); and the config rebuilt from a run's record."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from veritrain.core.config.quoting import key_text
from veritrain.core.config.schema import RunConfig
from veritrain.core.errors import UserError
from veritrain.core.hashing import sha256_json
from veritrain.core.secrets import ENV_REFERENCE, expand_env


@dataclass
class ResolvedConfig:
    """A validated config together with where it came from."""

    config: RunConfig
    path: Optional[Path]  # the YAML file, None for the built-in default
    overrides: list[str] = field(default_factory=list)  # the --set arguments, as given
    # data.root, data.csv, data.labels, data.split_dir, data.test_split_file made absolute (see DataConfig.root)
    data_paths: dict[str, Path] = field(default_factory=dict)

    @property
    def data_root(self) -> Optional[Path]:
        return self.data_paths.get("root")

    def recorded_data_paths(self) -> dict[str, str]:
        """The data paths as a record keeps them: absolute, except values built from `${env:NAME}`,
        which keep the reference (the value may be private; it is read again when the run is reused)."""
        recorded = {}
        for name, path in self.data_paths.items():
            raw = getattr(self.config.data, name)
            recorded[name] = raw if raw and ENV_REFERENCE.search(raw) else str(path)
        return recorded


    @property
    def source_label(self) -> str:
        return str(self.path) if self.path else "<default>"

    def as_dict(self) -> dict[str, Any]:
        return config_dict(self.config)

    @property
    def hash(self) -> str:
        return config_hash(self.config)


def paths_from_record(recorded: dict[str, str]) -> dict[str, Path]:
    """Data paths recorded by `recorded_data_paths`, with `${env:NAME}` read now."""
    return {name: Path(expand_env(value)).expanduser().resolve() for name, value in recorded.items()}


def config_dict(config: RunConfig) -> dict[str, Any]:
    """The config as recorded: every value as given (`load_config` refuses secrets, see veritrain.core.secrets)."""
    return config.model_dump(mode="json")


# `config_recorded` of a record whose config holds every value as given; records without it come from a
# veritrain that replaced values under secret-looking keys (`max_tokens`, `api_key`) by "***"
CONFIG_AS_GIVEN = "as_given"
NOT_RECORDED = "***"


def config_from_record(record: dict[str, Any]) -> RunConfig:
    """The config a run recorded, to build its model or train it again (resume, reproduce, eval, export, the
    ranks of a multi-process run). A record of an earlier veritrain whose config holds "***" lost those values:
    nothing rebuilt from it would be the run, so it is refused naming the keys (verify still checks such a run)."""
    if record.get("kind") == "script":  # veritrain.start: the config is the user's own, and so is the model
        run = record.get("run_id")
        raise UserError(f"run {run} is a script's run (veritrain.start): veritrain does not build its model, so eval, export and "
                        f"baseline do not apply; evaluate it in the script (run.finish metrics), and check it with "
                        f"`veritrain verify {run}`, `reproduce` or `audit`")
    config = record["config"]
    if record.get("config_recorded") != CONFIG_AS_GIVEN:
        lost = sorted(_values_not_recorded(config, []))
        if lost:
            raise UserError(f"run {record.get('run_id')}: {', '.join(lost[:5])}: recorded as \"***\" by an earlier veritrain, which did not "
                            "keep the value, so the run cannot be rebuilt from its record; start a new run with the value given "
                            "(a secret as ${env:NAME})")
    return RunConfig.model_validate(config)


def resolved_from_record(record: dict[str, Any]) -> ResolvedConfig:
    """The resolved config of a recorded run: its config (`config_from_record`, which refuses values an earlier
    veritrain did not keep) and its data paths as recorded, with `${env:NAME}` read now. Every command that
    rebuilds a run from its record starts here: resume, reproduce, eval, export, audit and the ranks of a run."""
    config = config_from_record(record)
    recorded = (record.get("config_source") or {}).get("data_paths_resolved") or {}
    return ResolvedConfig(config=config, path=None, overrides=[], data_paths=paths_from_record(recorded))


def _values_not_recorded(value: Any, path: list[str]) -> list[str]:
    """Key paths of the strings in a recorded config that are or hold "***"."""
    if isinstance(value, dict):
        return [key for name, item in value.items() for key in _values_not_recorded(item, path + [str(name)])]
    if isinstance(value, list):
        return [key for i, item in enumerate(value) for key in _values_not_recorded(item, path + [str(i)])]
    return [key_text(path)] if isinstance(value, str) and NOT_RECORDED in value else []


# Keys added after runs were first recorded, with the default each was added at. A config that leaves such a
# key at that default hashes as it did before the key existed, so older runs keep their config hash (and stay
# reproducible and resumable). Every key added from now on goes here.
KEYS_ADDED_LATER: dict[str, Any] = {
    "data.near_duplicate_difference": 0.1,
    "data.split_tolerance": 0.03,
    "data.on_split_skew": "fail",
    "data.on_label_issue": "warn",
    "data.test_from": None,
    "export.parity_rtol": 1e-5,
    "train.backend": "auto",
    "train.batchnorm": "per_rank",
    "checkpoint.audit_every": 0,
    "augment.resized_crop": None,
    "train.max_steps": 0,
    "eval.every_steps": 0,
    "model.layers": 2,
    "model.width": 128,
    "model.heads": 4,
    "model.context": 128,
    "model.tied_embeddings": True,
    # whole sections: dropped when every key in them is at its default
    "data.text": {"split_documents": "file", "max_chars": 1_000_000,
                  "fields": {"text": "text", "id": "id", "split": "split", "group": "group", "timestamp": "timestamp"},
                  "near_duplicates": {"shingle_words": 2, "threshold": 0.6, "bands": 32, "rows": 4, "min_words": 20},
                  "ngram_words": 13, "on_contamination": "quarantine"},
    "data.tokenizer": {"kind": "byte_level", "vocab_size": 2048},
    "eval.generation": {"prompts": [], "prompt_chars": 32, "tokens": 64, "temperature": 0.8, "top_k": None, "seed": 0},
}


def without_added_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict (or one of its sections, keys given from the top) without the later keys at their default."""
    trimmed = json.loads(json.dumps(values))
    for dotted, default in KEYS_ADDED_LATER.items():
        *parents, leaf = dotted.split(".")
        section = trimmed
        for name in parents:
            section = section.get(name) if isinstance(section, dict) else None
        if isinstance(section, dict) and leaf in section and section[leaf] == default:
            del section[leaf]
    return trimmed


# The model section every task shared before each task declared its own (TaskSpec.model_section), which held every
# model's keys: a config hashes with the keys its task's section lacks at these values, as it did then.
FLAT_MODEL_SECTION: dict[str, Any] = {"target": None, "kwargs": {}, "widths": [32, 64, 128], "hidden": [256], "dropout": 0.0, "layers": 2,
                                      "width": 128, "heads": 4, "context": 128, "tied_embeddings": True}


def as_hashed(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict as its hash reads it: its model section completed with FLAT_MODEL_SECTION's keys it lacks, then
    without the keys added later at their default (`without_added_defaults`). Two configs that differ only in what
    this leaves out are the same config."""
    model = values.get("model")
    completed = {**values, "model": {**FLAT_MODEL_SECTION, **model}} if isinstance(model, dict) else values
    return without_added_defaults(completed)


def completed(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict with every key a config of earlier or other veritrains may lack filled in at the value it had:
    the flat model section's keys its task's section lacks, and each key added later at its default (KEYS_ADDED_LATER).
    Two configs are the same config when their completed forms are equal, as when their hashes are (`as_hashed`); what
    compares runs' configs reads this form, which shows every value."""
    full = json.loads(json.dumps(values))
    if isinstance(full.get("model"), dict):
        full["model"] = {**FLAT_MODEL_SECTION, **full["model"]}
    for dotted, default in KEYS_ADDED_LATER.items():
        *parents, leaf = dotted.split(".")
        section = full
        for name in parents:
            section = section.get(name) if isinstance(section, dict) else None
        if isinstance(section, dict) and leaf not in section:
            section[leaf] = json.loads(json.dumps(default))
    return full


def config_hash(config: RunConfig) -> str:
    """SHA-256 of the resolved config in canonical JSON: equal configs hash equal, however written; keys added
    later hash only when they differ from their default (`as_hashed`)."""
    return sha256_json(as_hashed(config_dict(config)))


def compact(config: RunConfig) -> str:
    """One line per section, for the start of a run: `train: epochs=15 batch_size=64 ...`; keys left
    null are omitted (config.yaml in the run has every key)."""
    data = config_dict(config)

    def items(section: dict[str, Any]) -> str:
        return " ".join(f"{k}={_short(v)}" for k, v in section.items() if v is not None and not isinstance(v, dict))

    lines = [items(data)]
    for name, section in data.items():
        if isinstance(section, dict):
            nested = [f"{name}.{k}: {items(v)}" for k, v in section.items() if isinstance(v, dict) and items(v)]
            lines.append(f"{name}: {items(section)}")
            lines.extend(nested)
    return "\n".join(lines)


def _short(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


class _FlowListDumper(yaml.SafeDumper):
    """Sections as block mappings, lists on one line: `widths: [32, 64, 128]`."""


_FlowListDumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def to_yaml(config: RunConfig) -> str:
    return yaml.dump(config_dict(config), Dumper=_FlowListDumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
