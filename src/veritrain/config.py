"""Run configuration: small typed sections composed into one `RunConfig`.

A config is a YAML file (read with `yaml.safe_load`) plus `--set key.path=value` overrides. Every
field is declared once below with its type, default, range and meaning; unknown keys, wrong types
and out-of-range values are refused with one line naming the file (or `--set`) and the key path:

    error: configs/x.yaml: train.epochs: expected an integer ≥ 1, got 'abc'

Try it: `veritrain config show configs/digits.yaml --set train.epochs=3`.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import annotated_types
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from veritrain.errors import ConfigError
from veritrain.hashing import sha256_json
from veritrain.secrets import ENV_REFERENCE, expand_env

# The built-in default config is the one shipped as configs/digits.yaml; its experiment name
# follows the same rule as a file's (the file name without extension).
DEFAULT_CONFIG_NAME = "digits"

PositiveInt = typing.Annotated[int, annotated_types.Ge(1)]

# data keys that name files or folders: relative values resolve against the config file's folder
DATA_PATH_KEYS = ("root", "csv", "labels", "split_dir", "test_split_file")


class Section(BaseModel):
    """Base for config sections: unknown keys are errors, numbers given for text fields are kept as text."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, validate_default=True)


class DataCard(Section):
    """Where the data comes from and on what terms; carried into the report and every run record.
    Editing the card never changes the data version."""

    origin: Optional[str] = Field(None, description="where the data comes from (a URL, a paper, a team)")
    license: Optional[str] = Field(None, description="license or terms of use of the data")
    collection: Optional[str] = Field(None, description="how the data was collected and labelled")
    limitations: Optional[str] = Field(None, description="known gaps, biases or label noise")
    contact: Optional[str] = Field(None, description="who answers questions about the data")


class DataConfig(Section):
    source: str = Field(
        "digits",
        description="where samples come from: `digits` (scikit-learn's bundled 8×8 digits), `imagefolder` "
        "(root/<class>/<images>), `csv` (data.csv with path,label), `labelmap` (data.labels JSON), `cifar10` (python batches in root)",
    )
    root: Optional[str] = Field(
        None,
        description="folder of the raw data; relative paths resolve against the config file's folder "
        "(against the current directory when given with --set). Unused by `digits`",
    )
    csv: Optional[str] = Field(
        None, description="csv source: file with columns path,label (paths relative to root) and optional group, split, timestamp; relative to the config's folder like root"
    )
    labels: Optional[str] = Field(None, description="labelmap source: JSON file mapping relpath → label; relative to the config's folder like root")
    split_dir: Optional[str] = Field(
        None, description="labelmap source: folder with train.txt, val.txt, test.txt (one relpath per line) fixing the split"
    )
    test_split_file: Optional[str] = Field(
        None, description="file with one sample id (relpath) per line that forms a fixed test split, kept across runs"
    )
    classes: Optional[list[str]] = Field(
        None, description="the class names in order; null: discovered (folder names or sorted labels). Labels outside the list are `unknown_label`"
    )
    image_size: Optional[tuple[PositiveInt, PositiveInt]] = Field(  # type: ignore[valid-type]
        None, description="[height, width] every image must have (pixels); null: the most common size in the data"
    )
    channels: Optional[Literal[1, 3]] = Field(None, description="1 (grey) or 3 (RGB); null: the most common in the data")
    convert: bool = Field(
        False, description="resize (bilinear) and convert images whose size or mode differs, instead of quarantining them as `bad_shape`"
    )
    max_pixels: int = Field(
        50_000_000, ge=1, description="images with more pixels (width × height) are quarantined as `bomb` before decoding"
    )
    on_bad_file: Literal["quarantine", "fail", "warn"] = Field(
        "quarantine",
        description="`quarantine`: exclude bad samples from every split and list them in quarantine.csv; `fail`: stop (exit 1) listing them; "
        "`warn`: keep every sample that can still be used (unusable ones are quarantined regardless)",
    )
    near_duplicates: Literal["auto", "on", "off"] = Field(
        "auto", description="near-duplicate search (YAML true/false mean on/off); `auto`: on for images of 16 px and larger (off for 8×8 digits)"
    )
    near_duplicate_distance: int = Field(
        4, ge=0, le=64, description="largest Hamming distance (of 64 bits) between perceptual hashes that makes a pair a near-duplicate "
        "candidate (shifted copies are also found by nearest spectrum); a candidate counts only when its pixels confirm it"
    )
    near_duplicate_difference: float = Field(
        0.1, ge=0.0, le=2.0, description="largest pixel difference that confirms a candidate pair as one picture: ‖a − b‖ / max(‖a‖, ‖b‖) "
        "of the mean-removed grey images (≤ 32 px a side) at their best alignment within ±1 px; copies, brightness ±2 and 1-px shifts "
        "measure below 0.05, distinct MNIST digits above 0.19"
    )
    max_cluster_size: int = Field(
        50, ge=2, description="near-duplicate groups larger than this are still kept in one split but reported as a finding with example pairs"
    )
    imbalance_ratio: float = Field(10.0, ge=1.0, description="warn when the largest class has this many times the samples of the smallest, or more (whole set and each split)")
    split_tolerance: float = Field(
        0.03, ge=0.0, le=1.0, description="largest gap between a class's achieved train/val/test fraction and data.split_ratios "
        "(at least one sample in small classes) before the split is `split_skew`"
    )
    on_split_skew: Literal["fail", "warn"] = Field(
        "fail", description="`fail`: a `split_skew` stops the prepare (exit 1) naming the class and its cause; `warn`: report it and go on"
    )
    on_label_issue: Literal["warn", "quarantine"] = Field(
        "warn", description="`warn`: report samples whose label the rest of the data contradicts (`label_issue`); `quarantine`: also remove "
        "those in train and val (test-split ones are only reported, so test accuracy is not inflated)"
    )
    group_regex: Optional[str] = Field(
        None, description="regex with one capture group over the relpath; samples with the same group stay in one split (e.g. '^(patient_\\d+)/')"
    )
    split_by: Literal["random", "time"] = Field(
        "random", description="`random`: stratified by class and seeded; `time`: chronological by the csv timestamp column (test = latest)"
    )
    split_seed: int = Field(
        0, description="seed of the train/val/test split; separate from `seed` so a new training seed keeps the data version"
    )
    split_ratios: tuple[float, float, float] = Field(
        (0.8, 0.1, 0.1), description="fractions of each class in train, val and test; must sum to 1"
    )
    workers: Optional[int] = Field(None, ge=1, description="processes that decode and validate images; null: one per CPU core")
    card: DataCard = Field(default_factory=DataCard, description="data card: origin, license, collection, limitations, contact")

    @field_validator("near_duplicates", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        # YAML reads true/false, and unquoted on/off too, as booleans
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        from veritrain.data.sources import SOURCES

        return _registered(value, SOURCES)

    @field_validator("split_by")
    @classmethod
    def _time_needs_timestamps(cls, value: str, info: ValidationInfo) -> str:
        from veritrain.data.sources import TIMESTAMPED_SOURCES

        source = info.data.get("source")  # absent when data.source itself was refused
        if value == "time" and source is not None and source not in TIMESTAMPED_SOURCES:
            raise ValueError(f"'time' needs data.source: csv with a timestamp column; data.source {source!r} has no timestamps, use split_by: random")
        return value

    @field_validator("split_ratios")
    @classmethod
    def _ratios_sum_to_one(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(r < 0 for r in value) or value[0] <= 0:
            raise ValueError(f"expected three fractions ≥ 0 with train > 0, got {list(value)}")
        if abs(sum(value) - 1.0) > 1e-6:
            raise ValueError(f"expected fractions that sum to 1, got {list(value)} (sum {sum(value):g})")
        return value

    @field_validator("group_regex")
    @classmethod
    def _one_capture_group(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        try:
            pattern = re.compile(value)
        except re.error as err:
            raise ValueError(f"expected a regular expression, got {value!r} ({err})") from None
        if pattern.groups != 1:
            raise ValueError(f"expected a regular expression with exactly one capture group, got {value!r} ({pattern.groups} groups)")
        return value


class ModelConfig(Section):
    name: Literal["mlp", "cnn", "resnet18"] = Field(
        "cnn", description="`cnn`: blocks of Conv3×3 (no bias) → BatchNorm → ReLU → MaxPool(2), global average pooling, linear head; "
        "`mlp`: fully connected layers on flattened inputs; `resnet18`: ResNet-18, CIFAR variant (3×3 stem, no max-pool). Ignored when `target` is set"
    )
    target: Optional[str] = Field(
        None, description="a user model as `package.module:factory`; called as factory(input_shape=[C, H, W], num_outputs=N, **kwargs)"
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the `target` factory")
    widths: list[PositiveInt] = Field(
        [32, 64, 128], min_length=1, description="cnn: output channels of each conv block, one entry per block"
    )
    hidden: list[PositiveInt] = Field(
        [256], description="mlp: widths of the hidden layers (empty list: a linear model)"
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout probability before the output layer")


class OptimConfig(Section):
    name: Literal["sgd", "adamw"] = Field("adamw", description="optimizer")
    lr: float = Field(3e-3, gt=0.0, description="peak learning rate (reached after warmup)")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sgd: momentum; adamw: beta1")
    weight_decay: float = Field(5e-4, ge=0.0, description="decoupled for adamw, L2 for sgd")
    nesterov: bool = Field(False, description="sgd: use Nesterov momentum")


class ScheduleConfig(Section):
    name: Literal["cosine", "constant", "step"] = Field(
        "cosine", description="learning-rate schedule over all optimizer steps: `cosine` decays to 0, `constant` keeps lr, "
        "`step` multiplies lr by `gamma` every `step_epochs` epochs"
    )
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warmup from 0 to lr, before the schedule (warmup + cosine: set both)")
    step_epochs: int = Field(10, ge=1, description="`step`: epochs between lr drops")
    gamma: float = Field(0.1, gt=0.0, le=1.0, description="`step`: factor applied to lr at each drop")


class TrainConfig(Section):
    epochs: int = Field(15, ge=1, description="passes over the train split")
    batch_size: int = Field(64, ge=1, description="samples per forward pass (an optimizer step sees batch_size × accumulate_steps)")
    accumulate_steps: int = Field(1, ge=1, description="batches whose gradients are summed before one optimizer step")
    grad_clip: Optional[float] = Field(None, gt=0.0, description="clip the gradient's global L2 norm to this value; null: no clipping")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="`bf16`: autocast to bfloat16 (CPU or GPU); `fp16`: autocast to float16 with a gradient scaler (CUDA only)"
    )
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="classification: label smoothing of the cross-entropy")
    early_stopping_patience: Optional[int] = Field(
        None, ge=1, description="stop after this many epochs without improvement of the best metric; null: never"
    )
    on_nonfinite: Literal["stop", "rollback", "skip_batch"] = Field(
        "rollback", description="when the loss (or, with check_grad_norm, the gradient norm) is NaN/inf: `stop` fails the run, "
        "`rollback` restores the last step-scheduled snapshot and lowers lr, `skip_batch` drops that batch's update"
    )
    rollback_lr_factor: float = Field(0.5, gt=0.0, le=1.0, description="lr multiplier applied at each rollback")
    max_rollbacks: int = Field(3, ge=0, description="rollbacks allowed before the run stops as failed")
    check_grad_norm: bool = Field(False, description="also check the gradient norm for NaN/inf every step")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="`auto` takes CUDA when available, else the CPU"
    )
    threads: Optional[int] = Field(
        None, ge=1, description="CPU threads for torch (intra-op); null leaves torch's default. Results are bit-exact only for the same value"
    )
    num_workers: int = Field(0, ge=0, description="recorded for comparison across resumes; batches are built in the training process from the prepared arrays")
    deterministic: bool = Field(
        True, description="use only deterministic kernels (`torch.use_deterministic_algorithms`); same seed → same weights"
    )
    compile: bool = Field(False, description="`torch.compile` the model (outside the bit-exact promise)")
    channels_last: bool = Field(False, description="channels-last memory format for image models")


class AugmentConfig(Section):
    crop_padding: int = Field(0, ge=0, description="random crop after zero-padding each side by this many pixels; 0: off")
    hflip: bool = Field(False, description="random horizontal flip with probability 0.5")
    mixup_alpha: float = Field(0.0, ge=0.0, description="mixup Beta(α, α) mixing of batch pairs; 0: off")
    cutmix_alpha: float = Field(0.0, ge=0.0, description="cutmix Beta(α, α) box mixing; 0: off (with mixup too, each batch picks one at random)")


class CheckpointConfig(Section):
    every_epochs: int = Field(1, ge=0, description="save at the end of every N-th epoch; 0: never by epoch")
    every_steps: int = Field(0, ge=0, description="save every N optimizer steps (also the rollback targets); 0: never by step")
    every_minutes: Optional[float] = Field(None, gt=0.0, description="save when this many minutes passed since the last save; null: off")
    last: bool = Field(True, description="write checkpoints/last.pt, a copy of the newest checkpoint, when training stops (completed, early stop, signal)")
    best: bool = Field(True, description="keep checkpoints/best.pt, the epoch with the best `best_metric`")
    best_metric: Optional[str] = Field(None, description="metrics.jsonl key that picks best.pt; null: the task's (val_acc for classification)")
    best_mode: Optional[Literal["max", "min"]] = Field(None, description="whether a larger or smaller best_metric is better; null: the task's")
    keep_last: int = Field(2, ge=1, description="step-<N>.pt files kept (the newest); older ones are deleted")


class LoggingConfig(Section):
    every_steps: int = Field(50, ge=0, description="write a steps.jsonl line (step, loss, lr, grad norm, samples/s) every N steps; 0: off")
    tensorboard: bool = Field(False, description="also write TensorBoard event files to tensorboard/ in the run (needs the tensorboard package)")


class EvalConfig(Section):
    split: Literal["test", "val"] = Field("test", description="split the final evaluation reports on")
    batch_size: int = Field(512, ge=1, description="samples per forward pass during validation and evaluation")
    bad_cases: int = Field(25, ge=0, description="how many of the most confident wrong predictions bad_cases.csv/png show")
    baselines: bool = Field(True, description="`veritrain run` also fits the majority-class and logistic-regression baselines on the same splits")
    baseline_margin: float = Field(
        0.01, ge=0.0, description="warn when the model's accuracy does not beat the logistic-regression baseline by at least this much"
    )
    baseline_max_samples: int = Field(10_000, ge=10, description="logistic regression trains on at most this many train samples (a seeded, recorded subsample)")
    baseline_max_iter: int = Field(200, ge=1, description="iterations cap of the logistic-regression solver")


class ExportConfig(Section):
    formats: list[Literal["onnx", "torchscript", "safetensors"]] = Field(
        ["onnx", "torchscript", "safetensors"], description="what `veritrain export` and `veritrain run` write to export/"
    )
    parity_samples: int = Field(256, ge=1, description="real test samples the parity check runs through every exported form")
    parity_atol: float = Field(1e-4, gt=0.0, description="largest allowed absolute difference of logits between the trained model and an export")
    parity_min_agreement: float = Field(1.0, ge=0.0, le=1.0, description="smallest allowed fraction of samples whose predicted class agrees")
    opset: int = Field(17, ge=7, description="ONNX opset version")


class RunConfig(Section):
    exp_name: Optional[str] = Field(
        None, description="experiment family this run belongs to; null: the config file's name (`digits` for the built-in default)"
    )
    seed: int = Field(0, description="seed of model init, data order and augmentation")
    task: str = Field("classification", description="what is learned: `classification`")
    data: DataConfig = Field(default_factory=DataConfig, description="data source, split and preprocessing")
    model: ModelConfig = Field(default_factory=ModelConfig, description="network architecture")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimizer")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="learning-rate schedule")
    train: TrainConfig = Field(default_factory=TrainConfig, description="training loop")
    augment: AugmentConfig = Field(default_factory=AugmentConfig, description="batch augmentation (images)")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="when and what to save")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="step logs")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="evaluation")
    export: ExportConfig = Field(default_factory=ExportConfig, description="exported model formats and their parity check")

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        from veritrain.tasks import TASKS

        return _registered(value, TASKS)




# ---------------------------------------------------------------- loading


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
    """The config as recorded: secret-looking values redacted (see veritrain.secrets)."""
    from veritrain.secrets import redact

    return redact(config.model_dump(mode="json"))


# Keys added after runs were first recorded, with the default each was added at. A config that leaves such a
# key at that default hashes as it did before the key existed, so older runs keep their config hash (and stay
# reproducible and resumable). Every key added from now on goes here.
KEYS_ADDED_LATER: dict[str, Any] = {
    "data.near_duplicate_difference": 0.1,
    "data.split_tolerance": 0.03,
    "data.on_split_skew": "fail",
    "data.on_label_issue": "warn",
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


def config_hash(config: RunConfig) -> str:
    """SHA-256 of the resolved config in canonical JSON: equal configs hash equal, however written; keys added
    later hash only when they differ from their default (KEYS_ADDED_LATER)."""
    return sha256_json(without_added_defaults(config_dict(config)))


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> ResolvedConfig:
    """Read a YAML config (or the built-in default), apply `--set` overrides, validate.

    Raises ConfigError with a one-line, located message on any problem.
    """
    source = str(path) if path is not None else "<default>"
    raw: dict[str, Any] = {}
    file_path: Optional[Path] = None
    if path is not None:
        file_path = Path(path)
        raw = _read_yaml(file_path)

    overridden: set[str] = set()
    for item in overrides:
        key, value = _parse_override(item)
        _apply_override(raw, key, value)
        overridden.add(key)

    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as err:
        raise _config_error(err, raw, source, overridden) from None

    if config.exp_name is None:
        name = file_path.stem if file_path else DEFAULT_CONFIG_NAME
        config = config.model_copy(update={"exp_name": name})

    data_paths = {}
    for name in DATA_PATH_KEYS:
        value = getattr(config.data, name)
        if value is None:
            continue
        path = Path(expand_env(value)).expanduser()
        if not path.is_absolute():
            from_set = bool({"data", f"data.{name}"} & overridden)
            base = Path.cwd() if (from_set or file_path is None) else file_path.resolve().parent
            path = base / path
        data_paths[name] = path.resolve()
    return ResolvedConfig(config=config, path=file_path, overrides=list(overrides), data_paths=data_paths)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(str(path), None, "file not found; give the path of a YAML config, or none for the built-in default")
    if path.is_dir():
        raise ConfigError(str(path), None, "is a folder; give the path of a YAML config file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(str(path), None, f"cannot read the file ({err.__class__.__name__}: {err}); check its permissions and encoding (UTF-8)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(str(path), where, f"invalid YAML: {problem}; fix the syntax there") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), None, f"expected a mapping of keys (seed, data, model, ...) at the top level, got {_kind(data)}")
    return data


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError("--set", item, "expected KEY.PATH=VALUE, e.g. --set train.epochs=5")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text  # not YAML: keep the text; validation says what was expected
    return key, value


def _apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    schema: Optional[type[BaseModel]] = RunConfig  # None once the path leaves the declared sections
    for depth, part in enumerate(parts[:-1]):
        prefix = ".".join(parts[: depth + 1])
        info = schema.model_fields.get(part) if schema else None
        schema = _section_type(info.annotation) if info else None
        child = node.get(part)
        if (info is not None and schema is None) or (child is not None and not isinstance(child, dict)):
            raise ConfigError("--set", key, f"{prefix} is a value, not a section; set {prefix}=... instead")
        if child is None:
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


# ---------------------------------------------------------------- error messages


def _config_error(err: ValidationError, raw: dict[str, Any], source: str, overridden: set[str]) -> ConfigError:
    first = err.errors()[0]
    loc = [p for p in first["loc"] if isinstance(p, str)]
    # report at the level of a declared field: `model.widths`, not `model.widths.1`
    model: type[BaseModel] = RunConfig
    field_path: list[str] = []
    field_info = None
    for part in loc:
        if field_info is not None:
            sub = _section_type(field_info.annotation)
            if sub is None:
                break
            model = sub
        if part not in model.model_fields:
            field_path.append(part)
            field_info = None
            break
        field_path.append(part)
        field_info = model.model_fields[part]
    key = ".".join(field_path) if field_path else "(top level)"
    origin = "--set" if any(key == o or key.startswith(o + ".") or o.startswith(key + ".") for o in overridden) else source

    if first["type"] == "extra_forbidden":
        valid = list(model.model_fields)
        close = difflib.get_close_matches(field_path[-1], valid, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        scope = ".".join(field_path[:-1]) or "the top level"
        return ConfigError(origin, key, f"unknown key; {hint}valid keys in {scope}: {', '.join(valid)}")

    value = _lookup(raw, field_path)
    if field_info is not None and first["type"] == "value_error":
        message = str(first["ctx"]["error"]) if "ctx" in first else first["msg"]
        return ConfigError(origin, key, message)
    if field_info is not None:
        return ConfigError(origin, key, f"expected {describe_field(field_info)}, got {_shown(value)}")
    return ConfigError(origin, key, first["msg"])


def _section_type(annotation: Any) -> Optional[type[BaseModel]]:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _lookup(raw: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(raw, dict) or part not in raw:
            return None
        raw = raw[part]
    return raw


def describe_field(info: Any) -> str:
    """Human description of a field's type and range, e.g. 'an integer ≥ 1'."""
    annotation = info.annotation
    optional = typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(annotation)
    if optional:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    text = _describe(annotation) + _constraints(info.metadata)
    if any(getattr(item, "min_length", None) == 1 for item in info.metadata) and text.startswith("a list"):
        text = "a non-empty list" + text[len("a list"):]
    return text + (" or null" if optional else "")


def _constraints(metadata: list[Any]) -> str:
    words = []
    for item in metadata:
        for attr, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(item, attr, None)
            if bound is not None:
                words.append(f"{symbol} {bound:g}" if isinstance(bound, float) else f"{symbol} {bound}")
        if (getattr(item, "min_length", None) or 0) > 1:
            words.append(f"with at least {item.min_length} items")
    return (" " + " and ".join(words)) if words else ""


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _describe(args[0]) + _constraints(list(args[1:]))
    if origin is Literal:
        return f"one of {_quoted(args)}"
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(_describe(a) for a in inner)
        return text + " or null" if len(inner) < len(args) else text
    if origin is list:
        return f"a list of {_plural(args[0])}"
    if origin is tuple:
        return f"a list of {len(args)} {_plural(args[0])}"
    if _section_type(annotation):
        return f"a section (mapping) with keys {', '.join(annotation.model_fields)}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(annotation, str(annotation))


def _plural(annotation: Any) -> str:
    text = _describe(annotation)
    for article in ("an ", "a "):
        if text.startswith(article):
            noun, _, rest = text[len(article):].partition(" ")
            return f"{noun}s {rest}".strip()
    return text


def _registered(value: str, registry: dict[str, Any]) -> str:
    """Names that plugins can add to (sources, tasks) are checked against the registry, not a Literal."""
    if value not in registry:
        raise ValueError(f"expected one of {_quoted(sorted(registry))}, got {value!r}")
    return value


def _quoted(values: Any) -> str:
    return ", ".join(repr(v) for v in values)


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


# ---------------------------------------------------------------- display


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


def reference_rows(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key path, type, default, meaning) for every leaf key: the source of docs/config.md."""
    rows = []
    for name, info in model.model_fields.items():
        path = prefix + name
        sub = _section_type(info.annotation)
        if sub is not None:
            rows.extend(reference_rows(sub, path + "."))
            continue
        default = info.get_default(call_default_factory=True)
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        rows.append((path, describe_field(info), shown, info.description or ""))
    return rows


def reference_markdown() -> str:
    lines = [
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for key, kind, default, meaning in reference_rows():
        lines.append(f"| `{key}` | {kind} | `{default}` | {meaning} |")
    return "\n".join(lines) + "\n"
