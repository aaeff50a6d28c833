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
import math
import os
import re
import stat
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import annotated_types
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError, core_schema

from veritrain.errors import ConfigError, UserError
from veritrain.hashing import canonical_json, sha256_json
from veritrain.secrets import ENV_REFERENCE, config_secret, expand_env
from veritrain.selection import test_key_problem, validation_problem
from veritrain.task_registry import TASKS

# The built-in default config is the one shipped as configs/digits.yaml; its experiment name
# follows the same rule as a file's (the file name without extension).
DEFAULT_CONFIG_NAME = "digits"

# What a config file may be and make. A config is a few KiB with a few levels of nesting; these limits refuse,
# before anything is built, what only a mistake or an attack produces: a device or FIFO given as the file, a
# huge file, nesting that exhausts the stack, an alias bomb ("billion laughs") that expands to gigabytes.
MAX_CONFIG_BYTES = 1 << 20  # 1 MiB
MAX_NESTING = 32  # levels of mappings and lists, aliases expanded; configs use 2-4 (model.kwargs may use more)
MAX_VALUES = 20_000  # keys and values in a file or --set value, aliases expanded (a class list of 10,000 fits)


@dataclass(frozen=True)
class Limit:
    """Sanity range of an integer key, as `Annotated[int, Limit(most)]`: far beyond any real use, so that a typo or
    a hostile value (batch_size=10**30) stops at the config instead of deep in a run. It is listed in the key's
    meaning (docs/config.md) and in the message when exceeded, not in the type, which keeps everyday messages
    short: `expected an integer ≥ 1, got 'abc'`."""

    most: int
    least: Optional[int] = None

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: int) -> int:
        if value > self.most or (self.least is not None and value < self.least):
            raise PydanticCustomError("out_of_limit", "outside {least} to {most}", {"least": self.least, "most": self.most})
        return value

    def describe(self) -> str:
        return f"at most {self.most:,}" if self.least is None else f"from {self.least:,} to {self.most:,}"


Width = Annotated[int, annotated_types.Ge(1), Limit(65_536)]  # channels or units of one layer
Side = Annotated[int, annotated_types.Ge(1), Limit(65_536)]  # pixels
MANY = 10**9  # limit of things counted over a whole run: samples, steps
INT64 = Limit(2**63 - 1, least=-(2**63))  # what torch and numpy take as a seed

# data keys that name files or folders: relative values resolve against the config file's folder
DATA_PATH_KEYS = ("root", "csv", "labels", "split_dir", "test_split_file")


class Section(BaseModel):
    """Base for config sections: unknown keys are errors, numbers given for text fields are kept as text, numbers
    are finite (no .inf or .nan anywhere), and integers are integers (see `_plain_values`)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return _plain_values(cls.model_fields[info.field_name].annotation, value)


def _plain_values(annotation: Any, value: Any) -> Any:
    """`value` given for a key of type `annotation`, with what pydantic's lax mode would quietly turn into a number
    refused: a boolean (YAML's true, yes, on) where a number is expected, and text or 3.5 where an integer is (3.0
    is 3). Text anywhere must be valid Unicode: a lone surrogate (from undecodable bytes) can't be recorded."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _plain_values(args[0], value)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return value if value is None or len(inner) != 1 else _plain_values(inner[0], value)
    if _section_type(annotation):
        return value  # the section checks its own keys
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"expected text, got {_shown(value)}, which has bytes that are not UTF-8; fix the encoding") from None
    if annotation is int or (origin is Literal and all(type(a) is int for a in args)):
        if isinstance(value, (bool, str)) or (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
            raise PydanticCustomError("int_type", "not an integer")
        return int(value) if isinstance(value, float) else value
    if annotation is float and isinstance(value, bool):
        raise PydanticCustomError("float_type", "not a number")
    if isinstance(value, list) and origin in (list, tuple):
        if origin is tuple and len(args) == len(value) and Ellipsis not in args:
            return [_plain_values(a, v) for a, v in zip(args, value)]
        return [_plain_values(args[0] if args else Any, v) for v in value]
    if isinstance(value, dict):
        value_type = args[1] if origin is dict and len(args) == 2 else Any
        return {_plain_values(str, k) if isinstance(k, str) else k: _plain_values(value_type, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_values(Any, v) for v in value]
    return value


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
        None, description="csv source: file with columns path,label (paths relative to root) and optional group, split, timestamp, id "
        "(a stable id that places the sample instead of its content hash); relative to the config's folder like root"
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
    image_size: Optional[tuple[Side, Side]] = Field(
        None, description="[height, width] every image must have (pixels); null: the most common size in the data"
    )
    channels: Optional[Literal[1, 3]] = Field(None, description="1 (grey) or 3 (RGB); null: the most common in the data")
    convert: bool = Field(
        False, description="resize (bilinear) and convert images whose size or mode differs, instead of quarantining them as `bad_shape`"
    )
    max_pixels: Annotated[int, Limit(10**12)] = Field(
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
    max_cluster_size: Annotated[int, Limit(MANY)] = Field(
        50, ge=2, description="near-duplicate groups larger than this are still kept in one split but reported as a finding with example pairs"
    )
    imbalance_ratio: float = Field(10.0, ge=1.0, description="warn when the largest class has this many times the samples of the smallest, or more (whole set and each split)")
    split_tolerance: float = Field(
        0.03, ge=0.0, le=1.0, description="largest gap between a class's achieved train/val/test fraction and data.split_ratios "
        "before the split is `split_skew`; a class (or the whole set) is allowed max(tolerance, 3σ), σ = √(p(1−p)/n) for ratio p and n samples, "
        "since each sample's split follows the hash of its key (data recipe 3 and before: at least one sample)"
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
        "random", description="`random`: each sample (or group) placed by the hash of data.split_seed and its key, so adding samples moves "
        "no others; `time`: chronological by the csv timestamp column (test = latest)"
    )
    split_seed: Annotated[int, Limit(2**63 - 1)] = Field(
        0, ge=0, description="seed of the train/val/test split; separate from `seed` so a new training seed keeps the data version"
    )
    split_ratios: tuple[float, float, float] = Field(
        (0.8, 0.1, 0.1), description="fractions in train, val and test, of the whole set and of each class (within chance: each sample's "
        "split follows the hash of data.split_seed and its key); must sum to 1"
    )
    test_from: Optional[str] = Field(
        None, description="a data version of this workspace (id or unique prefix, at least 4 hex digits) whose test split carries over: "
        "its test samples still here (same key) stay in test, its train/val samples never enter test (where the hash says test they keep "
        "their former split); a group mixing both is a `test_from_leak`, handled as data.on_split_skew says. Needs split_by: random"
    )
    workers: Optional[Annotated[int, Limit(4096)]] = Field(None, ge=1, description="processes that decode and validate images; null: one per CPU core")
    # pyright counts only `default=` as a field default, not Field's positional one, so it reads these sections as having
    # required fields; every field of every section has a default
    card: DataCard = Field(default_factory=DataCard, description="data card: origin, license, collection, limitations, contact")  # pyright: ignore[reportArgumentType]

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

    @field_validator("test_from")
    @classmethod
    def _version_id(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        if value is None:
            return value
        if not re.fullmatch(r"[0-9a-f]{4,64}", value):
            raise ValueError(f"expected a data version id or a prefix of it (4 to 64 lowercase hex digits), got {_shown(value)}")
        if info.data.get("split_by") == "time":
            raise ValueError("carries a test split over by sample key, which a chronological split does not follow; use split_by: random or drop data.test_from")
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
            with warnings.catch_warnings():  # a FutureWarning would be a second line before the verdict
                warnings.simplefilter("ignore")
                pattern = re.compile(value)
        except (re.error, RecursionError, OverflowError) as err:  # 5,000 nested groups; (a){4294967295}
            raise ValueError(f"expected a regular expression, got {_shown(value)} ({err})") from None
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
    widths: list[Width] = Field(
        [32, 64, 128], min_length=1, description="cnn: output channels of each conv block, one entry per block"
    )
    hidden: list[Width] = Field(
        [256], description="mlp: widths of the hidden layers (empty list: a linear model)"
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout probability before the output layer")

    @field_validator("kwargs")
    @classmethod
    def _recordable(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = _unrecordable(value, [])  # the config hash and the run record keep kwargs as JSON
        if found is not None:
            where, what = found  # only the offending part is shown: the rest may hold a token
            raise ValueError(f"expected text, finite numbers, true/false, null, lists and mappings with text keys; {_key_text(where) or 'a value'} is {what}")
        return value


def _unrecordable(value: Any, path: list[str]) -> Optional[tuple[list[str], str]]:
    """Where `value` holds something canonical JSON cannot keep exactly, and what: (key path, description)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):  # JSON would turn 1 into "1", next to a "1" perhaps
                return path, f"a mapping with the key {_shown(key)}"
            found = _unrecordable(item, path + [key])
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        return next((f for i, item in enumerate(value) if (f := _unrecordable(item, path + [str(i)])) is not None), None)
    try:
        canonical_json(value)
    except (TypeError, ValueError):  # .inf, .nan, a date, bytes, a set, an integer of thousands of digits
        return path, {bytes: "binary data", set: "a set"}.get(type(value)) or _shown(value)
    return None


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
    warmup_steps: Annotated[int, Limit(MANY)] = Field(0, ge=0, description="optimizer steps of linear warmup from 0 to lr, before the schedule (warmup + cosine: set both)")
    step_epochs: Annotated[int, Limit(10**6)] = Field(10, ge=1, description="`step`: epochs between lr drops")
    gamma: float = Field(0.1, gt=0.0, le=1.0, description="`step`: factor applied to lr at each drop")


class TrainConfig(Section):
    epochs: Annotated[int, Limit(10**6)] = Field(15, ge=1, description="passes over the train split")
    batch_size: Annotated[int, Limit(2**20)] = Field(64, ge=1, description="samples per forward pass (an optimizer step sees batch_size × accumulate_steps)")
    accumulate_steps: Annotated[int, Limit(10**6)] = Field(1, ge=1, description="batches whose gradients are summed before one optimizer step")
    grad_clip: Optional[float] = Field(None, gt=0.0, description="clip the gradient's global L2 norm to this value; null: no clipping")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="`bf16`: autocast to bfloat16 (CPU or GPU); `fp16`: autocast to float16 with a gradient scaler (CUDA only)"
    )
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="classification: label smoothing of the cross-entropy")
    early_stopping_patience: Optional[Annotated[int, Limit(10**6)]] = Field(
        None, ge=1, description="stop after this many epochs without improvement of the best metric; null: never"
    )
    on_nonfinite: Literal["stop", "rollback", "skip_batch"] = Field(
        "rollback", description="when the loss (or, with check_grad_norm, the gradient norm) is NaN/inf: `stop` fails the run, "
        "`rollback` restores the last step-scheduled snapshot and lowers lr, `skip_batch` drops that batch's update"
    )
    rollback_lr_factor: float = Field(0.5, gt=0.0, le=1.0, description="lr multiplier applied at each rollback")
    max_rollbacks: Annotated[int, Limit(10**6)] = Field(3, ge=0, description="rollbacks allowed before the run stops as failed")
    check_grad_norm: bool = Field(False, description="also check the gradient norm for NaN/inf every step")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="`auto` takes CUDA when available, else the CPU"
    )
    threads: Optional[Annotated[int, Limit(4096)]] = Field(
        None, ge=1, description="CPU threads for torch (intra-op); null leaves torch's default. Results are bit-exact only for the same value"
    )
    num_workers: Annotated[int, Limit(4096)] = Field(0, ge=0, description="recorded for comparison across resumes; batches are built in the training process from the prepared arrays")
    deterministic: bool = Field(
        True, description="use only deterministic kernels (`torch.use_deterministic_algorithms`); same seed → same weights"
    )
    compile: bool = Field(False, description="`torch.compile` the model (outside the bit-exact promise)")
    channels_last: bool = Field(False, description="channels-last memory format for image models")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="collective backend when training with several processes (`--nproc N` or torchrun): `auto` takes NCCL on CUDA, gloo on the CPU"
    )
    batchnorm: Literal["per_rank", "sync"] = Field(
        "per_rank", description="BatchNorm with several processes: `per_rank` normalises each rank's share of the batch (rank 0's running statistics are kept); "
        "`sync` uses SyncBatchNorm over the whole batch (CUDA only)"
    )


class AugmentConfig(Section):
    crop_padding: Annotated[int, Limit(1024)] = Field(0, ge=0, description="random crop after zero-padding each side by this many pixels; 0: off")
    hflip: bool = Field(False, description="random horizontal flip with probability 0.5")
    mixup_alpha: float = Field(0.0, ge=0.0, description="mixup Beta(α, α) mixing of batch pairs; 0: off")
    cutmix_alpha: float = Field(0.0, ge=0.0, description="cutmix Beta(α, α) box mixing; 0: off (with mixup too, each batch picks one at random)")


class CheckpointConfig(Section):
    every_epochs: Annotated[int, Limit(10**6)] = Field(1, ge=0, description="save at the end of every N-th epoch; 0: never by epoch")
    every_steps: Annotated[int, Limit(MANY)] = Field(0, ge=0, description="save every N optimizer steps (also the rollback targets); 0: never by step")
    every_minutes: Optional[float] = Field(None, gt=0.0, description="save when this many minutes passed since the last save; null: off")
    last: bool = Field(True, description="write checkpoints/last.pt, a copy of the newest checkpoint, when training stops (completed, early stop, signal)")
    best: bool = Field(True, description="keep checkpoints/best.pt, the epoch with the best `best_metric`")
    best_metric: Optional[str] = Field(
        None, description="metrics.jsonl key that picks best.pt (and early stopping); null: the task's (val_acc for classification); never a test key"
    )
    best_mode: Optional[Literal["max", "min"]] = Field(None, description="whether a larger or smaller best_metric is better; null: the task's")
    keep_last: Annotated[int, Limit(10**6)] = Field(2, ge=1, description="step-<N>.pt files kept (the newest); older ones are deleted")
    audit_every: Annotated[int, Limit(10**6)] = Field(
        0, ge=0, description="also keep every N-th scheduled checkpoint of the trajectory, so `veritrain audit` can replay the segments after them "
        "(`gc` keeps them too); 0: only keep_last"
    )

    @field_validator("best_metric")
    @classmethod
    def _not_on_test(cls, value: Optional[str]) -> Optional[str]:
        problem = None if value is None else test_key_problem(value)  # selection reads validation only (veritrain.selection)
        if problem:
            raise ValueError(problem)
        return value


class LoggingConfig(Section):
    every_steps: Annotated[int, Limit(MANY)] = Field(50, ge=0, description="write a steps.jsonl line (step, loss, lr, grad norm, samples/s) every N steps; 0: off")
    tensorboard: bool = Field(False, description="also write TensorBoard event files to tensorboard/ in the run (needs the tensorboard package)")


class EvalConfig(Section):
    split: Literal["test", "val"] = Field("test", description="split the final evaluation reports on")
    batch_size: Annotated[int, Limit(2**20)] = Field(512, ge=1, description="samples per forward pass during validation and evaluation")
    bad_cases: Annotated[int, Limit(10**6)] = Field(25, ge=0, description="how many of the most confident wrong predictions bad_cases.csv/png show")
    baselines: bool = Field(True, description="`veritrain run` also fits the majority-class and logistic-regression baselines on the same splits")
    baseline_margin: float = Field(
        0.01, ge=0.0, description="warn when the model's accuracy does not beat the logistic-regression baseline by at least this much"
    )
    baseline_max_samples: Annotated[int, Limit(MANY)] = Field(10_000, ge=10, description="logistic regression trains on at most this many train samples (a seeded, recorded subsample)")
    baseline_max_iter: Annotated[int, Limit(10**7)] = Field(200, ge=1, description="iterations cap of the logistic-regression solver")


class ExportConfig(Section):
    formats: list[Literal["onnx", "torchscript", "safetensors"]] = Field(
        ["onnx", "torchscript", "safetensors"], description="what `veritrain export` and `veritrain run` write to export/"
    )
    parity_samples: Annotated[int, Limit(10**7)] = Field(256, ge=1, description="real test samples the parity check runs through every exported form")
    parity_atol: float = Field(1e-4, gt=0.0, description="largest allowed absolute difference of logits between the trained model and an export")
    parity_rtol: float = Field(1e-5, ge=0.0, le=1.0, description="added to parity_atol for large logits: the allowed difference is parity_atol + parity_rtol × the largest absolute logit of the trained model (float32 rounding grows with the values)")
    parity_min_agreement: float = Field(1.0, ge=0.0, le=1.0, description="smallest allowed fraction of samples whose predicted class agrees")
    opset: Annotated[int, Limit(1000)] = Field(17, ge=7, description="ONNX opset version")


class RunConfig(Section):
    # `default=` by keyword: pyright then knows `RunConfig()` needs no argument
    exp_name: Optional[str] = Field(
        default=None, description="experiment family this run belongs to; null: the config file's name (`digits` for the built-in default)"
    )
    seed: Annotated[int, INT64] = Field(default=0, description="seed of model init, data order and augmentation")
    task: str = Field(default="classification", description="what is learned: `classification`")
    # default_factory: pyright reads Field's positional defaults as required fields (see DataConfig.card)
    data: DataConfig = Field(default_factory=DataConfig, description="data source, split and preprocessing")  # pyright: ignore[reportArgumentType]
    model: ModelConfig = Field(default_factory=ModelConfig, description="network architecture")  # pyright: ignore[reportArgumentType]
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimizer")  # pyright: ignore[reportArgumentType]
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="learning-rate schedule")  # pyright: ignore[reportArgumentType]
    train: TrainConfig = Field(default_factory=TrainConfig, description="training loop")  # pyright: ignore[reportArgumentType]
    augment: AugmentConfig = Field(default_factory=AugmentConfig, description="batch augmentation (images)")  # pyright: ignore[reportArgumentType]
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="when and what to save")  # pyright: ignore[reportArgumentType]
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="step logs")  # pyright: ignore[reportArgumentType]
    eval: EvalConfig = Field(default_factory=EvalConfig, description="evaluation")  # pyright: ignore[reportArgumentType]
    export: ExportConfig = Field(default_factory=ExportConfig, description="exported model formats and their parity check")  # pyright: ignore[reportArgumentType]

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
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
    """The config as recorded: every value as given (`load_config` refuses secrets, see veritrain.secrets)."""
    return config.model_dump(mode="json")


# `config_recorded` of a record whose config holds every value as given; records without it come from a
# veritrain that replaced values under secret-looking keys (`max_tokens`, `api_key`) by "***"
CONFIG_AS_GIVEN = "as_given"
NOT_RECORDED = "***"


def config_from_record(record: dict[str, Any]) -> RunConfig:
    """The config a run recorded, to build its model or train it again (resume, reproduce, eval, export, the
    ranks of a multi-process run). A record of an earlier veritrain whose config holds "***" lost those values:
    nothing rebuilt from it would be the run, so it is refused naming the keys (verify still checks such a run)."""
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
    return [_key_text(path)] if isinstance(value, str) and NOT_RECORDED in value else []


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
    try:
        return _load_config(path, overrides)
    except ConfigError as err:
        if all(_one_line(part) == part for part in (err.source, err.key or "", err.problem)):
            raise
        # a file name, key or value can hold a newline or a lone surrogate: the message stays one printable line
        raise ConfigError(_one_line(err.source), _one_line(err.key) if err.key else None, _one_line(err.problem, 1000)) from None


def _one_line(text: str, width: int = 200) -> str:
    return _key_text([text], width) if not text.isprintable() or len(text) > width else text


def _load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...]) -> ResolvedConfig:
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

    secret = config_secret(raw)  # before validation, whose messages quote values
    if secret is not None:
        where, kind = secret
        dotted = ".".join(where)
        origin = "--set" if any(dotted == o or dotted.startswith(o + ".") for o in overridden) else source
        raise ConfigError(origin, _key_text(where), f"holds {kind}, and a run records its config as written; write the secret "
                          "as ${env:NAME} and export NAME before running")

    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as err:
        raise _config_error(err, raw, source, overridden) from None

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
            raise ConfigError("--set" if from_set else source, f"data.{name}", f"expected a path, got {_shown(value)} ({err}); fix the path") from None
    return ResolvedConfig(config=config, path=file_path, overrides=list(overrides), data_paths=data_paths)


def _read_yaml(path: Path) -> dict[str, Any]:
    where = str(path)
    try:
        info = os.stat(path)  # follows a symlink: what counts is what would be read
    except FileNotFoundError:
        raise ConfigError(where, None, "file not found; give the path of a YAML config, or none for the built-in default") from None
    except (OSError, ValueError) as err:
        raise ConfigError(where, None, f"cannot read the file ({err.__class__.__name__}: {err}); check the path and its permissions") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(where, None, "is a folder; give the path of a YAML config file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(where, None, f"is {_file_kind(info.st_mode)}, not a regular file; give the path of a YAML config file")
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(where, None, f"is {info.st_size:,} bytes; a config is at most {MAX_CONFIG_BYTES:,} bytes (1 MiB), keep data out of it")
    try:
        # O_NONBLOCK: should a FIFO replace the file after the stat, opening it must not wait for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ConfigError(where, None, "is not a regular file; give the path of a YAML config file")
            content = file.read(MAX_CONFIG_BYTES + 1)
        text = content.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(where, None, f"cannot read the file ({err.__class__.__name__}: {err}); check its permissions and encoding (UTF-8)") from None
    if len(content) > MAX_CONFIG_BYTES:
        raise ConfigError(where, None, f"is larger than {MAX_CONFIG_BYTES:,} bytes (1 MiB); a config is a few KiB, keep data out of it")
    try:
        data = _parse_yaml(text, where, [])
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        location = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(where, location, f"invalid YAML: {problem}; fix the syntax there") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(where, None, f"expected a mapping of keys (seed, data, model, ...) at the top level, got {_kind(data)}")
    return data


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError("--set", item, "expected KEY.PATH=VALUE, e.g. --set train.epochs=5")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes on the command line
        raise ConfigError("--set", key, "unknown key with bytes that are not UTF-8; see `veritrain config keys` for the keys") from None
    try:
        value = _parse_yaml(text, "--set", key.split(".")) if text.strip() else ""
    except yaml.YAMLError:
        value = text  # not YAML: keep the text; validation says what was expected
    return key, value


class _ConfigLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses what a config never needs and an attack uses, before it is built: nesting
    deeper than MAX_NESTING (the composer recurses), more than MAX_VALUES nodes (after alias expansion: an alias
    bomb), a key given twice in one mapping (YAML would keep the last silently), a value Python cannot hold (an
    integer of 5,000 digits, a date that does not exist). Each refusal is a ConfigError naming the key path."""

    def __init__(self, text: str, source: str, prefix: list[str]):
        super().__init__(text)
        self.config_source, self.key_prefix = source, prefix
        self.key_path: list[str] = []  # keys and list indices from the value's root to the node being composed
        self.composed_nodes = 0

    def refuse(self, path: list[str], problem: str) -> ConfigError:
        return ConfigError(self.config_source, _key_text(self.key_prefix + path) or None, problem)

    def compose_node(self, parent: Optional[yaml.Node], index: Any) -> Optional[yaml.Node]:
        if parent is None:
            return super().compose_node(parent, index)
        self.composed_nodes += 1
        self.key_path.append(index.value if isinstance(index, yaml.ScalarNode) else "?" if index is None else str(index))
        try:
            if len(self.key_prefix) + len(self.key_path) > MAX_NESTING and self.check_event(yaml.CollectionStartEvent):
                raise self.refuse(self.key_path, f"nested deeper than {MAX_NESTING} levels; a config needs a few (section, key, value)")
            if self.composed_nodes > MAX_VALUES:
                raise self.refuse(self.key_path, f"more than {MAX_VALUES:,} keys and values; a config is a few hundred, keep data out of it")
            # the stubs type `index` as int; PyYAML passes the key node of a mapping value, an int in a sequence, None at the root
            return super().compose_node(parent, index)  # pyright: ignore[reportArgumentType]
        finally:
            self.key_path.pop()

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # e.g. int() past 4,300 digits, a date that does not exist
            mark = node.start_mark
            reason = str(err).partition(";")[0]
            location = f"line {mark.line + 1}, column {mark.column + 1}" if self.config_source != "--set" else _key_text(self.key_prefix)
            raise ConfigError(self.config_source, location, f"cannot read {_shown(str(node.value))} as {node.tag.rpartition(':')[2]} ({reason}); fix the value, or quote it if it is text") from None

    def check_tree(self, node: yaml.Node) -> None:
        """Walk the composed nodes as the built value will be, aliases expanded, within the limits."""
        budget = MAX_VALUES

        def visit(node: yaml.Node, path: list[str]) -> None:
            nonlocal budget
            budget -= 1
            if budget < 0:
                raise self.refuse(path, f"more than {MAX_VALUES:,} keys and values once aliases (*name) are expanded; write the values out")
            if len(self.key_prefix) + len(path) > MAX_NESTING and isinstance(node, yaml.CollectionNode):
                raise self.refuse(path, f"nested deeper than {MAX_NESTING} levels once aliases (*name) are expanded; a config needs a few")
            if isinstance(node, yaml.ScalarNode):
                try:
                    node.value.encode("utf-8")
                except UnicodeEncodeError:  # "\ud800" is a valid YAML escape but no character
                    raise self.refuse(path, f"{_shown(node.value)} is not text: an escape makes a lone surrogate; write the character itself") from None
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key, value in node.value:
                    name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                    if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                        if (key.tag, key.value) in seen:
                            raise self.refuse(path + [name], "key given twice in one mapping; keep one (YAML would silently use the last)")
                        seen.add((key.tag, key.value))
                    visit(key, path + [name])
                    visit(value, path + [name])
            elif isinstance(node, yaml.SequenceNode):
                for index, item in enumerate(node.value):
                    visit(item, path + [str(index)])

        visit(node, [])


def _parse_yaml(text: str, source: str, prefix: list[str]) -> Any:
    """yaml.safe_load within the limits of _ConfigLoader; `prefix` is the key path of a --set value."""
    loader = _ConfigLoader(text, source, prefix)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        loader.check_tree(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    schema: Optional[type[BaseModel]] = RunConfig  # None once the path leaves the declared sections
    for depth, part in enumerate(parts[:-1]):
        prefix = ".".join(parts[: depth + 1])
        info = schema.model_fields.get(part) if schema else None
        schema = _section_type(info.annotation) if info else None
        mapping = info is not None and typing.get_origin(info.annotation) is dict  # model.kwargs.max_tokens=512
        child = node.get(part)
        if (info is not None and schema is None and not mapping) or (child is not None and not isinstance(child, dict)):
            raise ConfigError("--set", key, f"{prefix} is a value, not a section; set {prefix}=... instead")
        if child is None:
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


# ---------------------------------------------------------------- error messages


def _config_error(err: ValidationError, raw: dict[str, Any], source: str, overridden: set[str]) -> ConfigError:
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"]]  # a YAML key can be a number; list indices come after a non-section and stop the walk
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
    dotted = ".".join(field_path)
    origin = "--set" if any(dotted == o or dotted.startswith(o + ".") or o.startswith(dotted + ".") for o in overridden) else source
    key = _key_text(field_path) or "(top level)"

    if first["type"] in ("extra_forbidden", "invalid_key"):
        valid = list(model.model_fields)
        scope = _key_text(field_path[:-1]) or "the top level"
        if first["type"] == "invalid_key":  # YAML reads `1:`, `true:` and `~:` as a number, a boolean and null
            key = _key_text(field_path[:-1] + [_shown(first["input"])])
            return ConfigError(origin, key, f"expected a key name, got {_shown(first['input'])}; valid keys in {scope}: {', '.join(valid)}")
        close = difflib.get_close_matches(field_path[-1], valid, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return ConfigError(origin, key, f"unknown key; {hint}valid keys in {scope}: {', '.join(valid)}")

    value = _lookup(raw, field_path)
    if field_info is not None and first["type"] == "value_error":
        message = str(first["ctx"]["error"]) if "ctx" in first else first["msg"]
        return ConfigError(origin, key, message)
    if field_info is not None and first["type"] == "out_of_limit":
        return ConfigError(origin, key, f"expected {describe_field(field_info, limits=True)}, got {_shown(value)}")
    if field_info is not None and first["type"] == "finite_number":
        return ConfigError(origin, key, f"expected {describe_field(field_info).replace('number', 'finite number', 1)}, got {_shown(value)}")
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


def describe_field(info: Any, limits: bool = False) -> str:
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
        return f"one of {_quoted(args)}"
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(_describe(a, limits) for a in inner)
        return text + " or null" if len(inner) < len(args) else text
    if origin is list:
        return f"a list of {_plural(args[0], limits)}"
    if origin is tuple:
        return f"a list of {len(args)} {_plural(args[0], limits)}"
    if _section_type(annotation):
        return f"a section (mapping) with keys {', '.join(annotation.model_fields)}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(annotation, str(annotation))


def _plural(annotation: Any, limits: bool = False) -> str:
    text = _describe(annotation, limits)
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


def _shown(value: Any, width: int = 80) -> str:
    """A value as a message quotes it: JSON-like, on one line, cut to about `width` characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"  # str() refuses past 4,300 digits, and nobody reads them
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):  # a date, bytes, a set (repr is only for the message), or a huge integer inside
        try:
            text = repr(value)
        except ValueError:
            text = f"a {type(value).__name__}"
    return text if len(text) <= width else f"{text[: width - 20]}… ({len(text):,} characters)"


def _key_text(parts: list[str], width: int = 60) -> str:
    """A key path for a message: non-printable characters escaped, each part cut to `width` characters."""
    shown = []
    for part in parts:
        part = part if part.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in part)
        shown.append(part if len(part) <= width else part[: width - 1] + "…")
    return ".".join(shown)


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
        limits = _limits(info.annotation) + [item for item in info.metadata if isinstance(item, Limit)]
        meaning = "; ".join([info.description or ""] + [("each " if _is_list(info.annotation) else "") + limit.describe() for limit in limits])
        rows.append((path, describe_field(info), shown, meaning))
    return rows


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
