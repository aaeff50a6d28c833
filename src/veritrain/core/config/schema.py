"""The config schema: small typed sections (data, model, optim, schedule, train, augment, checkpoint, logging,
eval, export) composed into one `RunConfig`. Every key is declared once with its type, default, range and
meaning; unknown keys, wrong types and out-of-range values are refused (see `Section` and `Limit`)."""

from __future__ import annotations

import functools
import importlib
import math
import re
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, SerializeAsAny, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError, core_schema

from veritrain.core import source_registry
from veritrain.core.config.quoting import key_text, quoted_list, shown_value
from veritrain.core.errors import UserError
from veritrain.core.hashing import canonical_json
from veritrain.core.selection import test_key_problem
from veritrain.core.task_registry import (
    DEFAULT_MODEL_SECTION,
    DEFAULT_TASK,
    TASKS,
    available_specs,
    declared_models,
    known,
    task_names,
    task_spec,
)


@dataclass(frozen=True)
class Limit:
    """Sanity range of an integer key, as `Annotated[int, Limit(most)]`: far beyond any real use, so that a typo or
    a hostile value (batch_size=10**30) stops at the config instead of deep in a run. It is listed in the key's
    meaning (docs/config.md) and in the message when exceeded, not in the type, which keeps everyday messages
    short: `expected an integer ≥ 1, got 'abc'`."""

    most: int
    least: Optional[int] = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
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
    if section_type(annotation):
        return value  # the section checks its own keys
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"expected text, got {shown_value(value)}, which has bytes that are not UTF-8; fix the encoding") from None
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


class JsonlFieldsConfig(Section):
    """The field names of a `jsonl` source's lines."""

    text: str = Field("text", description="the field holding a document's text (a string)")
    id: str = Field("id", description="the field holding a document's stable id (optional; it places the document instead of its content)")
    split: str = Field("split", description="the field fixing a document's split: train, val or test (optional)")
    group: str = Field("group", description="the field naming a document's group, kept in one split (optional)")
    timestamp: str = Field("timestamp", description="the field holding a document's timestamp (optional)")


class TextNearDuplicatesConfig(Section):
    """How text sources find near-duplicate documents: MinHash with LSH bands over word shingles, each candidate
    confirmed by the exact Jaccard similarity of its shingle sets."""

    shingle_words: int = Field(2, ge=1, le=16, description="words per shingle (of the lowercased, punctuation-stripped words)")
    threshold: float = Field(0.6, gt=0.0, le=1.0, description="a pair is a near duplicate when the Jaccard similarity of its shingle sets "
                             "is at least this; 2-word shingles at 0.6 keep every copy with 5% of its words edited (docs/data.md)")
    bands: int = Field(32, ge=1, le=1024, description="LSH bands: two documents are a candidate when all rows of one band agree")
    rows: int = Field(4, ge=1, le=64, description="MinHash values per band (bands × rows hash functions)")
    min_words: Annotated[int, Limit(10**6)] = Field(20, ge=1, description="documents with fewer words are not compared (a few shared words are no evidence)")


class TextDataConfig(Section):
    """Text sources (`text`, `jsonl`, `pydoc_topics`): how documents are read and checked."""

    split_documents: Literal["file", "paragraph"] = Field(
        "file", description="`file`: each .txt file (or JSONL line, or help topic) is a document; `paragraph`: each paragraph "
        "(text between blank lines) of it is")
    max_chars: int = Field(1_000_000, ge=1, le=2**40, description="longer documents are `too_long`: a file larger than 4 × this many bytes, "
                           "or a JSONL line, is refused before it is read into memory")
    fields: JsonlFieldsConfig = Field(default_factory=JsonlFieldsConfig, description="jsonl source: the field names")  # pyright: ignore[reportArgumentType]
    near_duplicates: TextNearDuplicatesConfig = Field(default_factory=TextNearDuplicatesConfig,  # pyright: ignore[reportArgumentType]
                                                      description="near-duplicate documents: grouped into one split and reported")
    ngram_words: int = Field(13, ge=1, le=100, description="decontamination: the words per n-gram shared by a val/test document and a "
                             "train document that make the train document contaminated")
    on_contamination: Literal["quarantine", "warn", "fail"] = Field(
        "quarantine", description="a train document sharing an n-gram with a val or test document: `quarantine` removes it from "
        "train (val and test documents are never removed, so their numbers stay honest); `warn`: report it and train on it; "
        "`fail`: stop (exit 1)")


class TokenizerConfig(Section):
    """The tokenizer of a text data version, stored in it and bound to its id by its bytes."""

    kind: Literal["byte_level", "bpe"] = Field(
        "byte_level", description="`byte_level`: the 256 bytes and <|endoftext|> (no training); `bpe`: byte-level BPE trained on the "
        "train split after decontamination (needs `pip install 'veritrain[lm]'`)")
    vocab_size: int = Field(2048, ge=257, le=2**32 - 1, description="bpe: the most tokens, the 256 bytes and <|endoftext|> included")


class DataConfig(Section):
    source: str = Field(
        "digits",
        description="where samples come from: `digits` (scikit-learn's bundled 8×8 digits), `imagefolder` "
        "(root/<class>/<images>), `csv` (data.csv with path,label), `labelmap` (data.labels JSON), `cifar10` (python batches in root); "
        "text: `text` (a folder of .txt files in root), `jsonl` (a .jsonl file or folder in root), `pydoc_topics` (the Python help "
        "topics veritrain ships)",
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
        "no others; `time`: chronological by the csv timestamp column, each value read as the instant it names (ISO 8601 with or "
        "without an offset, a date, or epoch seconds; anything else is a `bad_timestamp` finding), test = latest"
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
        "its test samples still here (same key or same content) stay in test, its train/val samples never enter test (where the hash says test they keep "
        "their former split); a group mixing both is a `test_from_leak`, handled as data.on_split_skew says. Needs split_by: random"
    )
    workers: Optional[Annotated[int, Limit(4096)]] = Field(None, ge=1, description="processes that decode and validate images, or take the first look at the documents of a text source of 8 MB or more; null: one per CPU core")
    # pyright counts only `default=` as a field default, not Field's positional one, so it reads these sections as having
    # required fields; every field of every section has a default
    card: DataCard = Field(default_factory=DataCard, description="data card: origin, license, collection, limitations, contact")  # pyright: ignore[reportArgumentType]
    text: TextDataConfig = Field(default_factory=TextDataConfig, description="text sources: documents and their checks")  # pyright: ignore[reportArgumentType]
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="text sources: the tokenizer")  # pyright: ignore[reportArgumentType]

    @field_validator("near_duplicates", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        # YAML reads true/false, and unquoted on/off too, as booleans
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        return _registered(value, source_registry.SOURCES)

    @field_validator("split_by")
    @classmethod
    def _time_needs_timestamps(cls, value: str, info: ValidationInfo) -> str:
        source = info.data.get("source")  # absent when data.source itself was refused
        if value == "time" and source is not None and source not in source_registry.TIMESTAMPED_SOURCES:
            raise ValueError(f"'time' needs data.source: csv with a timestamp column; data.source {source!r} has no timestamps, use split_by: random")
        return value

    @field_validator("test_from")
    @classmethod
    def _version_id(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        if value is None:
            return value
        if not re.fullmatch(r"[0-9a-f]{4,64}", value):
            raise ValueError(f"expected a data version id or a prefix of it (4 to 64 lowercase hex digits), got {shown_value(value)}")
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
            raise ValueError(f"expected a regular expression, got {shown_value(value)} ({err})") from None
        if pattern.groups != 1:
            raise ValueError(f"expected a regular expression with exactly one capture group, got {value!r} ({pattern.groups} groups)")
        return value


class ModelConfig(Section):
    """The keys every task's model section has: which model, or a user's. A task declares its section as a subclass
    with its models' own keys (TaskSpec.model_section: the image models' widths, hidden and dropout; the GPT's layers,
    width, heads, ...); `task` picks the section a config's `model` is read with (`model_section`)."""

    name: str = Field("", description="a model the task declares (its TaskSpec's `models`; the task's first when the config names none); "
                      "ignored when `target` is set")
    target: Optional[str] = Field(
        None, description="a user model as `package.module:factory`; called as factory(input_shape=[C, H, W], num_outputs=N, **kwargs)"
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the `target` factory")

    @field_validator("name")
    @classmethod
    def _a_declared_model(cls, value: str) -> str:
        names = declared_models()
        if names and value not in names:
            raise ValueError(f"expected one of {quoted_list(sorted(names))} (the models the tasks declare), got {value!r}")
        return value

    @field_validator("kwargs")
    @classmethod
    def _recordable(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = _unrecordable(value, [])  # the config hash and the run record keep kwargs as JSON
        if found is not None:
            where, what = found  # only the offending part is shown: the rest may hold a token
            raise ValueError(f"expected text, finite numbers, true/false, null, lists and mappings with text keys; {key_text(where) or 'a value'} is {what}")
        return value


def _unrecordable(value: Any, path: list[str]) -> Optional[tuple[list[str], str]]:
    """Where `value` holds something canonical JSON cannot keep exactly, and what: (key path, description)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):  # JSON would turn 1 into "1", next to a "1" perhaps
                return path, f"a mapping with the key {shown_value(key)}"
            found = _unrecordable(item, path + [key])
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        return next((f for i, item in enumerate(value) if (f := _unrecordable(item, path + [str(i)])) is not None), None)
    try:
        canonical_json(value)
    except (TypeError, ValueError):  # .inf, .nan, a date, bytes, a set, an integer of thousands of digits
        return path, {bytes: "binary data", set: "a set"}.get(type(value)) or shown_value(value)
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
    epochs: Annotated[int, Limit(10**6)] = Field(15, ge=1, description="passes over the train split (unless max_steps is set)")
    max_steps: Annotated[int, Limit(MANY)] = Field(0, ge=0, description="train exactly this many optimizer steps, over as many epochs as they "
                                                   "take (the last one may end mid-epoch), and not train.epochs; the schedule runs over them; 0: train.epochs decide")
    batch_size: Annotated[int, Limit(2**20)] = Field(64, ge=1, description="samples per forward pass (an optimizer step sees batch_size × accumulate_steps)")
    accumulate_steps: Annotated[int, Limit(10**6)] = Field(1, ge=1, description="batches whose gradients are summed before one optimizer step")
    grad_clip: Optional[float] = Field(None, gt=0.0, description="clip the gradient's global L2 norm to this value; null: no clipping")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="`bf16`: autocast to bfloat16 (CPU or GPU); `fp16`: autocast to float16 with a gradient scaler (CUDA only)"
    )
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="classification: label smoothing of the cross-entropy")
    early_stopping_patience: Optional[Annotated[int, Limit(10**6)]] = Field(
        None, ge=1, description="stop after this many validations without improvement of the best metric (epochs, or eval.every_steps "
        "stretches); null: never"
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
    num_workers: Annotated[int, Limit(4096)] = Field(0, ge=0, description="worker processes that build the training batches (and augment them) "
                                                     "ahead of the steps; 0: the training process builds each. Results are the same for any number: a "
                                                     "step's batches are a pure function of the step")
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
    resized_crop: Optional[tuple[float, float]] = Field(
        None, description="random resized crop: a box of [low, high] of the image's area (aspect ratio 3/4 to 4/3, inside the image) "
        "resized back to the image's size (bilinear), before the other augmentations; null: off")
    crop_padding: Annotated[int, Limit(1024)] = Field(0, ge=0, description="random crop after zero-padding each side by this many pixels; 0: off")
    hflip: bool = Field(False, description="random horizontal flip with probability 0.5")
    mixup_alpha: float = Field(0.0, ge=0.0, description="mixup Beta(α, α) mixing of batch pairs; 0: off")
    cutmix_alpha: float = Field(0.0, ge=0.0, description="cutmix Beta(α, α) box mixing; 0: off (with mixup too, each batch picks one at random)")

    @field_validator("resized_crop")
    @classmethod
    def _area_fractions(cls, value: Optional[tuple[float, float]]) -> Optional[tuple[float, float]]:
        if value is not None and not 0.0 < value[0] <= value[1] <= 1.0:
            raise ValueError(f"expected [low, high] fractions of the area with 0 < low ≤ high ≤ 1, got {list(value)}")
        return value


class CheckpointConfig(Section):
    every_epochs: Annotated[int, Limit(10**6)] = Field(1, ge=0, description="save at the end of every N-th epoch; 0: never by epoch")
    every_steps: Annotated[int, Limit(MANY)] = Field(0, ge=0, description="save every N optimizer steps (also the rollback targets); 0: never by step")
    every_minutes: Optional[float] = Field(None, gt=0.0, description="save when this many minutes passed since the last save; null: off")
    last: bool = Field(True, description="write checkpoints/last.pt, a copy of the newest checkpoint, when training stops (completed, early stop, signal)")
    best: bool = Field(True, description="keep checkpoints/best.pt, the state at the validation with the best `best_metric`")
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
        problem = None if value is None else test_key_problem(value)  # selection reads validation only (veritrain.core.selection)
        if problem:
            raise ValueError(problem)
        return value


class LoggingConfig(Section):
    every_steps: Annotated[int, Limit(MANY)] = Field(50, ge=0, description="write a steps.jsonl line (step, loss, lr, grad norm, samples/s) every N steps; 0: off")
    tensorboard: bool = Field(False, description="also write TensorBoard event files to tensorboard/ in the run (needs the tensorboard package)")


class GenerationConfig(Section):
    """task lm: the samples the evaluation draws and records (eval/<split>/generations.json)."""

    prompts: list[str] = Field([], description="the texts each sample continues; empty: the opening `prompt_chars` characters "
                               "of the first 3 documents of the evaluated split")
    prompt_chars: int = Field(32, ge=1, le=10_000, description="with `prompts` empty: the characters each prompt takes from its document")
    tokens: int = Field(64, ge=0, le=100_000, description="tokens drawn after each prompt")
    temperature: float = Field(0.8, ge=0.0, le=100.0, description="logits are divided by this before sampling; 0: always the most likely token")
    top_k: Optional[int] = Field(None, ge=1, le=2**32, description="sample among the k most likely tokens only; null: among all")
    seed: Annotated[int, INT64] = Field(0, description="seed of the sampling generator (prompt i uses seed + i)")


class EvalConfig(Section):
    split: Literal["test", "val"] = Field("test", description="split the final evaluation reports on")
    batch_size: Annotated[int, Limit(2**20)] = Field(512, ge=1, description="samples per forward pass during validation and evaluation")
    every_steps: Annotated[int, Limit(MANY)] = Field(0, ge=0, description="validate every N optimizer steps and at the last, each a row of "
                                                     "metrics.jsonl that best.pt, early stopping and a search's pruner judge; 0: at every epoch's end")
    bad_cases: Annotated[int, Limit(10**6)] = Field(25, ge=0, description="how many of the most confident wrong predictions bad_cases.csv/png show (task lm: the documents with the most bits per byte, bad_cases.json)")
    baselines: bool = Field(True, description="`veritrain run` also fits the majority-class and logistic-regression baselines on the same splits (task lm: a byte unigram and a byte bigram interpolated with it)")
    baseline_margin: float = Field(
        0.01, ge=0.0, description="warn when the model does not beat the baseline its task's rule names by at least this much, in that "
        "metric's units (classification: accuracy against logistic regression; lm: bits per byte below the bigram's); where a config leaves "
        "it out, the margin the task declares (0.01 for both)"
    )
    baseline_max_samples: Annotated[int, Limit(MANY)] = Field(10_000, ge=10, description="logistic regression trains on at most this many train samples (a seeded, recorded subsample)")
    baseline_max_iter: Annotated[int, Limit(10**7)] = Field(200, ge=1, description="iterations cap of the logistic-regression solver")
    generation: GenerationConfig = Field(default_factory=GenerationConfig,  # pyright: ignore[reportArgumentType]
                                         description="task lm: samples from fixed prompts, recorded with the evaluation")


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
    task: str = Field(default=DEFAULT_TASK, description="what is learned: `classification`, `lm` (a language model on a text data source), or a task "
                      "registered with veritrain.tasks.register_task or named by an installed package's entry point (group `veritrain.tasks`, docs/code.md)")
    # default_factory: pyright reads Field's positional defaults as required fields (see DataConfig.card)
    data: DataConfig = Field(default_factory=DataConfig, description="data source, split and preprocessing")  # pyright: ignore[reportArgumentType]
    # read with the section its task declares (`model_section`); SerializeAsAny: dumped with that section's keys
    model: SerializeAsAny[ModelConfig] = Field(default_factory=dict, description="the model: the keys of its task's section")  # pyright: ignore[reportArgumentType, reportAssignmentType]
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
        if not known(value):
            raise ValueError(f"expected one of {quoted_list(task_names())}, got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _task_defaults(cls, value: Any) -> Any:
        """The task's own defaults where the config leaves them out: its model (TaskSpec.models[0]: `task: lm` alone
        trains the GPT) and its baseline margin (its BaselineRule's, in its metric's units). Only what the config leaves
        out is filled, and the built-in tasks' defaults are the values these keys had for every task, so every
        existing config hashes as before."""
        spec = _declared(value.get("task")) if isinstance(value, dict) else None
        if spec is None:
            return value
        model, evaluation = value.get("model", {}), value.get("eval", {})
        if spec.models and isinstance(model, dict) and "name" not in model and "target" not in model:
            value = {**value, "model": {**model, "name": spec.models[0]}}
        if spec.baseline is not None and isinstance(evaluation, dict) and "baseline_margin" not in evaluation:
            value = {**value, "eval": {**evaluation, "baseline_margin": spec.baseline.margin}}
        return value

    @field_validator("data")
    @classmethod
    def _fields_the_task_learns_from(cls, value: DataConfig, info: ValidationInfo) -> DataConfig:
        task = info.data.get("task")
        spec = _declared(task)
        given = source_registry.FIELDS.get(value.source)
        if spec is None or not spec.fields or given is None or set(spec.fields) <= set(given):
            return value
        sources = sorted(name for name, fields in source_registry.FIELDS.items() if set(spec.fields) <= set(fields))
        tasks = sorted(name for name in TASKS if (other := _declared(name)) is not None and other.fields and set(other.fields) <= set(given))
        raise ValueError(f"task {task} learns from {' and '.join(spec.fields)}, but data.source {value.source!r} gives {' and '.join(given)}; "
                         f"use a source that gives them ({', '.join(sources) or 'none is registered'})"
                         + (f" or a task that learns from {' and '.join(given)} (task: {' or '.join(tasks)})" if tasks else ""))

    @field_validator("model", mode="before")
    @classmethod
    def _the_task_section(cls, value: Any, info: ValidationInfo) -> Any:
        """`model` read with its task's section (`model_section`). A key that only another task's section declares is
        left out where it holds that section's default: it changes nothing, and a record of the flat section every
        task shared before holds every model's keys. Set to anything else it stays, and is refused as a setting of
        that task (`model_key_owner`)."""
        task = info.data.get("task", DEFAULT_TASK)
        section = model_section(task)
        if isinstance(value, section):
            return value
        if isinstance(value, ModelConfig):  # another task's section, e.g. from model_copy(update={"task": ...})
            value = value.model_dump()
        if not isinstance(value, dict):
            return value  # the annotation says what was expected
        others = [other for name, other in declared_sections() if name != task and other is not section]
        kept = {key: item for key, item in value.items()
                if key in section.model_fields or not any(_holds_default(other, key, item) for other in others)}
        return section.model_validate(kept)

    @field_validator("model")
    @classmethod
    def _a_model_the_task_trains(cls, value: ModelConfig, info: ValidationInfo) -> ModelConfig:
        task = info.data.get("task")
        spec = _declared(task)
        if spec is not None and spec.models:
            names = " or ".join(spec.models) + (" (or a user model as model.target)" if spec.user_models else "")
            if value.target is not None and not spec.user_models:
                raise ValueError(f"task {task} trains model.name {names}, not a user model ({value.target!r}); remove model.target")
            if value.target is None and value.name not in spec.models:
                others = sorted(name for name in TASKS if (other := _declared(name)) is not None and value.name in other.models)
                trained_by = f"; model {value.name} is trained by task {' or '.join(others)}" if others else ""
                raise ValueError(f"task {task} trains model.name {names}, not {value.name!r}{trained_by}")
        return value


def model_section(task: Any) -> type[ModelConfig]:
    """The class task `task`'s config reads `model` with: the section its TaskSpec declares (`model_section`), else the
    built-in image models' (what a task that trains cnn, mlp or resnet18 reads; the name of the table's
    `MODEL_SECTION`). A name that is not a task gets the latter too (its own validator refuses it)."""

    spec = _declared(task)
    declared = spec.model_section if spec is not None and spec.model_section is not None else _default_section()
    if not (isinstance(declared, type) and issubclass(declared, ModelConfig)):
        raise UserError(f"task {task!r}: its TaskSpec's model_section is {declared!r}; give a subclass of veritrain.core.config.ModelConfig")
    return declared


@functools.cache
def _default_section() -> type[ModelConfig]:
    module, _, name = DEFAULT_MODEL_SECTION.partition(":")
    return getattr(importlib.import_module(module), name)


def declared_sections() -> list[tuple[str, type[ModelConfig]]]:
    """(task, its model section) of every task whose declaration this process has without importing a task's module
    (veritrain.core.task_registry.available_specs)."""
    found = []
    for name in available_specs():
        try:
            found.append((name, model_section(name)))
        except UserError:
            continue
    return found


def model_key_owner(key: str, task: Any) -> Optional[str]:
    """The first task (by name) whose model section declares `key` (a key of `model`) when task `task`'s does not: a
    config that sets it is refused as that task's setting."""
    if key in model_section(task).model_fields:
        return None
    return next((name for name, section in declared_sections() if name != task and key in section.model_fields), None)


def _holds_default(section: type[ModelConfig], key: str, value: Any) -> bool:
    info = section.model_fields.get(key)
    return info is not None and value == info.get_default(call_default_factory=True)


def _declared(task: Any) -> Any:
    """The TaskSpec of a registered task, None for a name that is not one (its own validator says so) or a task that
    declares none (its run fails when it starts)."""

    if not isinstance(task, str) or not known(task):
        return None
    try:
        return task_spec(task)
    except UserError:
        return None


def section_type(annotation: Any) -> Optional[type[BaseModel]]:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _registered(value: str, registry: dict[str, Any]) -> str:
    """Names that plugins can add to (sources, tasks) are checked against the registry, not a Literal."""
    if value not in registry:
        raise ValueError(f"expected one of {quoted_list(sorted(registry))}, got {value!r}")
    return value
