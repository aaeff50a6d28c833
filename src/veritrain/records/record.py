"""The run record: `runs/<run_id>/record.json` (schema in docs/record.md) and its seal `record.sha256`.

`record.json` is written in canonical form (sorted keys, 2-space indent, UTF-8, trailing newline);
`record.sha256` holds the hex SHA-256 of its exact bytes. `artifacts` lists every other file of the
run with its SHA-256 and size, so a changed, missing or added file can be detected.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import Field, ValidationError

from veritrain.core.errors import RunFailed
from veritrain.core.files import write_atomic
from veritrain.core.hashing import sha256_file
from veritrain.core.signing_keys import sealing_key
from veritrain.core.version import __version__
from veritrain.records import amendments, provenance
from veritrain.records.fields import (
    NOT_NULL,
    RUN_ID,
    Artifact,
    DataVersionId,
    Event,
    IsoTime,
    Part,
    ProvenanceRef,
    RunId,
    RunPath,
    Sha256,
    record_bytes,
)

RECORD_VERSION = 1
# What a record must carry, numbered (docs/record.md, "Formats"): set when a run starts and kept by resumes and amends;
# a record without the field is format 0, made before records named their format. veritrain.trust.formats judges it.
RECORD_FORMAT = 2
RECORD_FILE = "record.json"
SEAL_FILE = "record.sha256"
NOTES_FILE = "notes.jsonl"
OMITTED_FILE = "archive_omitted.json"  # written by import: audit checkpoints an archive left out on purpose
PROVENANCE_FILE = provenance.PROVENANCE_FILE  # a detached statement about the seal, like the seal itself
# notes are added after the run, on purpose outside the seal; so is the list of what an archive left out
UNSEALED = frozenset({RECORD_FILE, SEAL_FILE, NOTES_FILE, OMITTED_FILE, PROVENANCE_FILE})


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def artifact_table(run_dir: Path) -> dict[str, dict[str, Any]]:
    """relative path → {sha256, size} for every file except the record, its seal, the notes and the amendments (each
    seals its own files)."""
    table = {}
    for path in sorted(run_dir.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(run_dir).as_posix()
        if rel in UNSEALED or rel.startswith(amendments.AMENDMENTS_DIR + "/"):
            continue
        table[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return table


def write_record(run_dir: Path, record: dict[str, Any], run: bool = True) -> str:
    """Refresh `artifacts`, write record.json atomically, then its seal; returns the seal (hex SHA-256).
    A run's record is validated against `RunRecord` first, as its readers will: a record they would
    refuse is never written. A run that has ended gets its provenance statement (veritrain.records.provenance),
    written before the record it describes, so a kill leaves no new record without it. (`run` False: another
    folder's record, such as a smoke test's.)"""
    ended = run and record.get("status") != "running"
    key = sealing_key() if ended else None
    if ended:
        record["provenance"] = provenance.field(key)
    else:
        record.pop("provenance", None)  # a resumed run: its statement is written again when it ends
    record["artifacts"] = artifact_table(run_dir)
    data = record_bytes(record)
    if run:
        RunRecord.model_validate_json(data)  # a ValidationError here is a bug in the writer, never the user's
    seal = hashlib.sha256(data).hexdigest()
    if ended:
        write_atomic(run_dir / PROVENANCE_FILE, statement_bytes(record, seal, run_dir, key), sync_folder=False)
    write_atomic(run_dir / RECORD_FILE, data, sync_folder=False)  # the seal's rename below syncs the folder for all
    write_atomic(run_dir / SEAL_FILE, (seal + "\n").encode())
    return seal


def statement_bytes(record: dict[str, Any], seal: str, run_dir: Path, key: Any) -> bytes:
    """The provenance file of the run in `run_dir` (a folder of the workspace's runs/) sealed as `record`."""
    state_dir = run_dir.parent.parent / ".veritrain"
    return provenance.envelope_bytes(provenance.statement(record, seal, state_dir), key)


def sealed_bytes(record: dict[str, Any], files: dict[str, Path]) -> tuple[bytes, str]:
    """The bytes of record.json with `artifacts` listing `files` (path in the run → where that file's content is
    now: an amend seals the run as it will be, before switching it), and their seal. Validated against
    `RunRecord` first, as in `write_record`. Re-sealing a finished run goes through veritrain.records.journal."""
    record["artifacts"] = {rel: {"sha256": sha256_file(path), "size": path.stat().st_size} for rel, path in sorted(files.items())}
    data = record_bytes(record)
    RunRecord.model_validate_json(data)  # a ValidationError here is a bug in the writer, never the user's
    return data, hashlib.sha256(data).hexdigest()


class SealEntry(Part):
    seal: Sha256
    replaced_at: str
    by: str


class Resume(Part):
    at: str
    argv: list[str]
    previous_status: Optional[str] = None


class RunError(Part):
    type: str
    message: str


class Repeat(Part):
    group: str
    index: Annotated[int, Field(ge=0)]
    of: Annotated[int, Field(ge=1)]


class Distributed(Part):
    world_size: Annotated[int, Field(ge=1)]
    nodes: Annotated[int, Field(ge=1)]
    backend: str
    devices: list[str]
    launch: list[str]


class SweepLink(Part):
    id: str
    trial: Optional[int] = None  # null for the sweep's parent run; a search's trial number
    change: dict[str, Any] = {}
    kind: Literal["sweep", "search"] = "sweep"  # written for a search's trials only (`.veritrain/searches/<id>/`)


class PrunedInfo(Part):
    """Why a search stopped a trial early (status `pruned`): the epoch its verdict was on and the value judged."""

    epoch: Annotated[int, Field(ge=0)]
    step: Annotated[int, Field(ge=0)]
    value: Optional[float] = None  # the metrics.jsonl value the pruner judged; null when the row lacked it
    reason: str
    search: Optional[str] = None  # the search's id
    trial: Optional[int] = None  # the trial's number in it


class Picked(Part):
    """A metrics.jsonl key that chose something during training, the split it is computed on and its direction."""

    split: Optional[Literal["train", "val", "test"]] = None  # null: the key names no split
    metric: str
    mode: Literal["max", "min"]


class EarlyStopping(Picked):
    patience: Annotated[int, Field(ge=1)]  # epochs without improvement


class SweepSelection(Part):
    """What the sweep a run belongs to picks its best trial by: a metric of eval/<split>/metrics.json."""

    id: str
    split: Literal["train", "val", "test"]
    metric: Optional[str] = None  # null: the sweep's headline metric (its task's headline; an earlier sweep: the first of a fixed list its runs report)
    mode: Optional[Literal["max", "min"]] = None


class DeclaredMetric(Part):
    """A metric as its task declares it (veritrain.core.task_spec.MetricSpec)."""

    name: str
    goal: Literal["max", "min"]
    bounds: Annotated[list[Optional[float]], Field(min_length=2, max_length=2)]
    epoch_key: Optional[str] = None
    headline: bool = False


class DeclaredBaseline(Part):
    """The metric and baseline that judge whether the model beats its baseline (veritrain.core.task_spec.BaselineRule)."""

    metric: str
    baseline: str


class DeclaredTask(Part):
    """What the run's task declares about its metrics (veritrain.core.task_spec.TaskSpec), as it trained."""

    name: str
    metrics: list[DeclaredMetric]
    baseline: Optional[DeclaredBaseline] = None


class Selection(Part):
    """Which split selected what (veritrain.core.selection); absent in records made before it."""

    best_checkpoint: Optional[Picked] = None  # null: checkpoint.best is off, nothing picks best.pt
    early_stopping: Optional[EarlyStopping] = None  # null: training runs every epoch
    sweep: Optional[SweepSelection] = None  # null: not a run of a sweep


class TrajectoryEntry(Part):
    step: Annotated[int, Field(ge=0)]
    epoch: Annotated[int, Field(ge=0)]
    state_sha256: Sha256
    model_sha256: Sha256
    chain: Sha256
    kept: bool = False
    kept_for_audit: bool = False
    file: Optional[RunPath] = None  # a checkpoint a framework wrote (a script's run through veritrain.lightning or veritrain.hf)


class OtherSave(Part):
    step: Annotated[int, Field(ge=0)]
    reason: str
    state_sha256: Sha256
    after_step: Optional[int] = None  # the step of the trajectory entry it follows (absent in older records)


class EntryRef(Part):
    """A trajectory entry a result came from: its index, step and state hash (verify checks all three)."""

    index: Annotated[int, Field(ge=0)]
    step: Annotated[int, Field(ge=0)]
    state_sha256: Sha256


class FileRef(Part):
    file: RunPath
    sha256: Sha256


class ModelSource(FileRef):
    target: str


class UserFile(Part):
    """One user module the run imported, copied to `code/<path>` (its package layout)."""

    module: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", max_length=1000)]
    path: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*\.py$", max_length=1000)]
    sha256: Sha256


class Code(Part):
    veritrain: Optional[str] = None
    git_commit: Optional[str] = None
    git_dirty: Optional[bool] = None
    diff_patch: Optional[FileRef] = None
    untracked: Optional[list[str]] = None
    model_source: Optional[ModelSource] = None
    user_files: Optional[Annotated[list[UserFile], Field(max_length=10_000)]] = None  # None: a record from before the full listing (model_source only)


class ConfigSource(Part):
    path: Optional[str] = None
    overrides: list[str] = []
    data_root: Optional[str] = None
    data_root_resolved: Optional[str] = None
    data_paths_resolved: dict[str, str] = {}


class DataInfo(Part):
    version: Optional[DataVersionId] = None
    path: Optional[str] = None
    source: Optional[str] = None
    counts: Optional[dict[str, Annotated[int, Field(ge=0)]]] = None
    classes: Optional[list[str]] = None
    quarantined: Optional[int] = None
    findings_by_kind: Optional[dict[str, int]] = None
    leakage_pairs: Optional[int] = None
    hash_algorithm: Optional[str] = None
    version_json_sha256: Optional[Sha256] = None
    recipe: Optional[int] = None
    summary: Optional[dict[str, Any]] = None
    card: Optional[dict[str, Any]] = None
    config: Optional[dict[str, Any]] = None  # a script's run (veritrain.data): the data section it was prepared with
    tokenizer: Optional[dict[str, Any]] = None  # a text data version's tokenizer (its file's SHA-256 among them)
    tokens: Optional[dict[str, int]] = None  # a text data version's tokens per split


class Training(Part):
    epochs: int
    steps: int
    best_epoch: Optional[int] = None
    best_step: Optional[Annotated[int, Field(ge=0)]] = None  # the steps done at the best validation (required from format 2)
    best_metric: Optional[dict[str, Any]] = None
    last_epoch: Optional[dict[str, Any]] = None  # the last row of metrics.jsonl
    peak_memory_mb: Optional[float] = None
    loop_seconds: Optional[float] = None
    settings: Optional[dict[str, Any]] = None
    engine: Optional[str] = None  # what trained the run (veritrain.train.engines); absent: veritrain's earlier loop


class ExportInfo(Part):
    files: Optional[dict[str, FileRef]] = None
    parity: Optional[dict[str, Any]] = None
    checkpoint: Optional[str] = None  # the checkpoint exported, as model.json names it
    trajectory_entry: Optional[EntryRef] = None  # the trajectory entry it holds (absent in older records)


class InputCheckpoint(FileRef):
    """An `eval`/`export` run's checkpoint from outside the parent's trajectory, copied into the run."""

    source: str  # the path it was given as
    state_sha256: Sha256


class ScriptInfo(Part):
    """A script's run (kind `script`, veritrain.userloop): the script and how it was started, and the checkpoint rule."""

    file: Optional[RunPath] = None  # null: no script file could be recorded (stdin, -c, a notebook)
    sha256: Optional[Sha256] = None
    path: Optional[str] = None
    argv: Optional[list[str]] = None
    orig_argv: Optional[list[str]] = None
    executable: Optional[str] = None
    cwd: Optional[str] = None
    reads_file: Optional[bool] = None
    deterministic: bool
    checkpoints: dict[str, int]
    api: Optional[dict[str, Any]] = None  # what the script used: batches, checkpoints (count), state_registered
    integration: Optional[str] = None  # lightning, hf: a framework's callback made the run, and owns its loop and checkpoints
    state_recipe: Annotated[Optional[int], Field(ge=1), NOT_NULL] = None  # hf: how its checkpoint folders are hashed (absent: 1)


class InputsInfo(Part):
    """A script's inputs, bound by content: the manifest `inputs.json` in the run."""

    file: RunPath
    manifest_sha256: Sha256
    paths: list[str]
    files: Annotated[int, Field(ge=0)]
    bytes: Annotated[int, Field(ge=0)]


class Guarantee(Part):
    """What a script's run can prove (veritrain.userloop.levels) and why it is not more."""

    level: Literal["replayable", "bound", "logged"]
    reasons: list[str]


class RunRecord(Part):
    """record.json, field by field (docs/record.md documents each; a test keeps the two in step). The
    writer validates every record before writing it and every reader validates what it reads, so a record
    from an archive, a copy or a hand edit is refused in one line before any field of it is trusted."""

    record_version: Annotated[int, Field(ge=1)]
    record_format: Annotated[Optional[int], Field(ge=1), NOT_NULL] = None  # absent: format 0, made before records named their format
    run_id: RunId
    kind: Annotated[Optional[str], NOT_NULL] = None
    stages: Annotated[Optional[list[str]], NOT_NULL] = None
    status: Literal["running", "completed", "failed", "interrupted", "pruned"]
    started_at: IsoTime  # every record has it: experiments.md and the UI order runs by it
    ended_at: Optional[IsoTime] = None  # null while running
    argv: Annotated[Optional[list[str]], NOT_NULL] = None
    exp_name: Optional[str] = None
    task: Annotated[Optional[str], NOT_NULL] = None
    seed: Annotated[Optional[int], NOT_NULL] = None
    config: dict[str, Any]
    config_recorded: Annotated[Optional[str], NOT_NULL] = None  # "as_given"; absent in records that replaced values under secret-looking keys by "***"
    config_hash: Annotated[Optional[Sha256], NOT_NULL] = None
    config_source: Annotated[Optional[ConfigSource], NOT_NULL] = None
    code: Annotated[Optional[Code], NOT_NULL] = None
    env: Optional[dict[str, Any]] = None
    data: Optional[DataInfo] = None
    training: Optional[Training] = None
    metrics: Annotated[Optional[dict[str, dict[str, Any]]], NOT_NULL] = None
    baselines: Annotated[Optional[dict[str, Any]], NOT_NULL] = None
    export: Annotated[Optional[ExportInfo], NOT_NULL] = None
    smoke: Optional[dict[str, Any]] = None
    hypothesis: Optional[str] = None
    parent: Optional[str] = None
    reproduced_from: Optional[str] = None
    repeat: Optional[Repeat] = None
    sweep: Optional[SweepLink] = None
    pruned: Optional[PrunedInfo] = None  # status pruned only: the search's verdict
    selection: Optional[Selection] = None  # absent in records made before it
    task_spec: Annotated[Optional[DeclaredTask], NOT_NULL] = None  # runs of a task (not a script's); absent in records made before it
    distributed: Optional[Distributed] = None
    final_state_sha256: Optional[Sha256] = None
    trajectory: Annotated[Optional[list[TrajectoryEntry]], NOT_NULL] = None
    other_saves: Annotated[Optional[list[OtherSave]], NOT_NULL] = None
    timings: Annotated[Optional[dict[str, float]], NOT_NULL] = None
    events: Annotated[Optional[list[Event]], NOT_NULL] = None
    resumes: Annotated[Optional[list[Resume]], NOT_NULL] = None
    seal_history: Annotated[Optional[list[SealEntry]], NOT_NULL] = None
    artifacts: Annotated[Optional[dict[RunPath, Artifact]], NOT_NULL] = None
    error: Optional[RunError] = None
    input_checkpoint: Annotated[Optional[InputCheckpoint], NOT_NULL] = None  # kinds eval and export: the outside checkpoint, not from the audited training
    script: Annotated[Optional[ScriptInfo], NOT_NULL] = None  # kind script: the user's own training script
    inputs: Optional[InputsInfo] = None  # kind script: null when no inputs were bound
    guarantee: Annotated[Optional[Guarantee], NOT_NULL] = None  # kind script: replayable, bound or logged
    provenance: Annotated[Optional[ProvenanceRef], NOT_NULL] = None  # absent in runs sealed before statements were written


def record_problem(record: Any, folder_name: Optional[str]) -> Optional[str]:
    """Why a record read from `runs/<folder_name>/` cannot be trusted to describe a run (one line), or None.
    Records arrive from archives and copies, so every reader validates them against `RunRecord` first.
    With `folder_name` None only the record itself is checked (verify, which also answers for copied run folders)."""
    return _validated(record, folder_name)[1]


def _validated(record: Any, folder_name: Optional[str]) -> tuple[Optional[RunRecord], Optional[str]]:
    """(the typed record, None), or (None, why it cannot be trusted)."""
    if not isinstance(record, dict):
        return None, "not a JSON object"
    if folder_name is not None and not RUN_ID.fullmatch(folder_name):
        return None, f"the folder name {folder_name[:40]!r} is not a run id"
    if folder_name is not None and record.get("run_id") != folder_name:
        return None, f"its run_id {str(record.get('run_id'))[:40]!r} is not its folder's name"
    try:
        return RunRecord.model_validate(record), None
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"] if part != "[key]") or "record"
        message = first["msg"].removeprefix("Value error, ")
        return None, f"{where[:80]}: {message} (found {_short(first.get('input'))})"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str) if not isinstance(value, (dict, list)) else type(value).__name__.replace("dict", "an object").replace("list", "a list")
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- a record as read: validated, typed, read-only

READ_ONLY = ("a run record as read is read-only: change a run through veritrain.records.recorder "
             "(Recorder while it runs, amending() once it is sealed), or take a copy with thawed()")


class FrozenDict(dict):
    """A JSON object of a record as read: it reads like a dict (json.dumps, `**`, `dict(...)` work) and refuses changes."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(READ_ONLY)

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = __ior__ = _refuse  # type: ignore[assignment]

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return thawed(self)

    def __reduce__(self) -> Any:
        return (frozen, (thawed(self),))


class FrozenList(list):
    """A JSON array of a record as read: it reads like a list and refuses changes."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(READ_ONLY)

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return thawed(self)

    def __reduce__(self) -> Any:
        return (frozen, (thawed(self),))


def frozen(value: Any) -> Any:
    """A read-only copy of a JSON value (FrozenDict, FrozenList; numbers and strings as they are)."""
    if isinstance(value, dict):
        return FrozenDict((key, frozen(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return FrozenList(frozen(item) for item in value)
    return value


def thawed(value: Any) -> Any:
    """A plain, changeable deep copy of a JSON value (of a frozen one too)."""
    if isinstance(value, dict):
        return {key: thawed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thawed(item) for item in value]
    return value


class Record(FrozenDict):
    """A run's record as read and validated: its record.json with its sealed amendments applied (veritrain.records.amendments),
    read-only, like every mapping and list in it, and typed (`typed`, the validated RunRecord). `artifacts` lists every
    file of the run as it is now, by its name in the run; `path(name)` is where that file lies (an amendment's files
    lie in its folder). Only veritrain.records.recorder writes records."""

    run_dir: Path
    typed: RunRecord

    def __new__(cls, fields: dict[str, Any], run_dir: Path, typed: RunRecord, chain: Any = None, applied: Any = None) -> Record:
        return super().__new__(cls)

    def __init__(self, fields: dict[str, Any], run_dir: Path, typed: RunRecord, chain: Any = None, applied: Any = None) -> None:
        dict.__init__(self, ((key, frozen(item)) for key, item in fields.items()))
        self.run_dir = run_dir
        self.typed = typed
        self.chain = chain  # veritrain.records.amendments.Chain; None for a record not read from a run folder
        self.applied = applied  # veritrain.records.amendments.Applied when the run has amendments

    def __reduce__(self) -> Any:
        return (Record, (thawed(self), self.run_dir, self.typed, self.chain, self.applied))

    @property
    def run_id(self) -> str:
        return self.typed.run_id

    @property
    def status(self) -> str:
        return self.typed.status

    @property
    def data_version(self) -> Optional[str]:
        return self.typed.data.version if self.typed.data is not None else None

    @property
    def seal(self) -> Optional[str]:
        """The newest seal: the last amendment's, else the record's own."""
        return self.chain.newest if self.chain is not None else None

    @property
    def amendments(self) -> tuple[Any, ...]:
        """The run's amendments in order (veritrain.records.amendments.Link)."""
        return self.chain.links if self.chain is not None else ()

    def path(self, rel: str) -> Path:
        """Where the run's file `rel` lies: in the run folder, or in the folder of the amendment that added it."""
        if self.applied is not None and rel in self.applied.files:
            return Path(self.applied.files[rel])
        return self.run_dir / rel

    def source(self, result: str) -> Any:
        """The amendment a result (`metrics.<split>`, `baselines`, `export`) comes from; None when the run's own seal covers it."""
        return self.applied.sources.get(result) if self.applied is not None else None


def read_record(run_dir: Path) -> Record:
    """The run's record, validated, with its amendments applied, read-only; a missing or damaged one, or a broken chain of
    amendments, is a RunFailed that says how to look closer."""
    path = run_dir / RECORD_FILE
    try:
        data = path.read_bytes()
        fields = json.loads(data.decode("utf-8"))
    except OSError as err:
        raise RunFailed(f"{path}: cannot read it ({err.strerror}); `veritrain verify {run_dir.name}` checks the whole run") from None
    except (ValueError, RecursionError) as err:  # JSON or UTF-8, or nested past Python's limit
        raise RunFailed(f"{path}: not a valid record ({err}); `veritrain verify {run_dir.name}` checks the whole run") from None
    typed, problem = _validated(fields, run_dir.name)
    if typed is None:
        raise RunFailed(f"{path}: not a valid record ({problem}); `veritrain verify {run_dir.name}` checks the whole run")
    chain = amendments.read_chain(run_dir, hashlib.sha256(data).hexdigest(), typed.run_id)
    if chain.problems:
        first = chain.problems[0]
        raise RunFailed(f"{run_dir / first['path']}: {first['detail']}; `veritrain verify {run_dir.name}` checks the whole run")
    if not chain.links:
        return Record(fields, run_dir, typed, chain)
    applied = amendments.apply(fields, run_dir, chain.links)
    typed, problem = _validated(applied.fields, run_dir.name)
    if typed is None:
        raise RunFailed(f"{run_dir / amendments.AMENDMENTS_DIR}: the run as amended is not a valid record ({problem}); "
                        f"`veritrain verify {run_dir.name}` checks the whole run")
    return Record(applied.fields, run_dir, typed, chain, applied)


# ---------------------------------------------------------------- environment and code


def package_list() -> str:
    """The installed Python packages, one sorted `name==version` line each (read once per import path in a process:
    every distribution's metadata is parsed, about half a second)."""
    return _package_list(tuple(sys.path))


@functools.lru_cache(maxsize=4)
def _package_list(path: tuple[str, ...]) -> str:
    found = set()
    for distribution in metadata.distributions():
        fields = distribution.metadata  # parsed on every access: once per distribution (its version is fields["Version"])
        if fields.get("Name"):  # pyright: ignore[reportAttributeAccessIssue]  # an email Message, which has get()
            found.add(f"{fields['Name']}=={fields['Version']}")
    return "".join(p + "\n" for p in sorted(found, key=str.lower))


def capture_env(device: Optional[str] = None) -> tuple[dict[str, Any], str]:
    """The environment summary for the record, and the installed package list (`name==version` lines)."""
    packages = package_list()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "packages_sha256": hashlib.sha256(packages.encode()).hexdigest(),
        "device": device,
    }
    if "torch" in sys.modules:
        import torch

        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
        env["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
        env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        env["mkldnn"] = torch.backends.mkldnn.is_available()
        if torch.cuda.is_available():
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            env["gpu_driver"] = _gpu_driver()
    return env, packages


def _gpu_driver() -> Optional[str]:
    """The NVIDIA driver version, from nvidia-smi when it is installed."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def capture_code(workspace_root: Path) -> dict[str, Any]:
    """veritrain's version and the git state of the workspace (null outside git).

    The workspace's own `runs/`, `.veritrain/` and `experiments.md` never count as dirty.
    """
    code: dict[str, Any] = {"veritrain": __version__, "git_commit": None, "git_dirty": None}
    try:
        commit = subprocess.run(
            ["git", "-C", str(workspace_root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return code
        status = subprocess.run(
            ["git", "-C", str(workspace_root), "status", "--porcelain", "--",
             ":(exclude)runs", ":(exclude).veritrain", ":(exclude)experiments.md"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return code
    code["git_commit"] = commit.stdout.strip()
    code["git_dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    return code


def save_code(code: dict[str, Any], workspace_root: Path, run_dir: Path) -> None:
    """When the checkout is dirty, `code/diff.patch` (the uncommitted changes, against HEAD) and the
    names of untracked files. The user modules the run imports are copied by its code session
    (veritrain.records.usercode), which also lists them in `code.user_files`."""
    excludes = [":(exclude)runs", ":(exclude).veritrain", ":(exclude)experiments.md"]
    if code.get("git_dirty"):
        diff = subprocess.run(["git", "-C", str(workspace_root), "diff", "HEAD", "--binary", "--", ".", *excludes],
                              capture_output=True, timeout=60)
        untracked = subprocess.run(["git", "-C", str(workspace_root), "ls-files", "--others", "--exclude-standard", "--", ".", *excludes],
                                   capture_output=True, text=True, timeout=60)
        (run_dir / "code").mkdir(exist_ok=True)
        (run_dir / "code" / "diff.patch").write_bytes(diff.stdout)
        code["diff_patch"] = {"file": "code/diff.patch", "sha256": hashlib.sha256(diff.stdout).hexdigest()}
        code["untracked"] = untracked.stdout.split()
