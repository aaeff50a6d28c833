"""Export sealed runs into an MLflow tracking store that stock MLflow reads: `DIR/mlflow.db` (SQLite) and
`DIR/artifacts/` (the experiment's artifact root, a plain folder), written through MLflow's own client.

Each run becomes one MLflow run in the experiment named after the workspace folder: the flattened config as
params, metrics.jsonl per epoch and the final metrics (those `runs list --json` shows), its times and status, its
seal, data version and code version as tags, its record, evaluation and export as artifacts, its data version as
a dataset input. Only a run whose seal holds is exported, and only files whose SHA-256 is the sealed one; the
copies in DIR/artifacts are hashed again. Needs `pip install 'veritrain[mlflow]'`.

    veritrain runs export latest --to mlflow out/
    mlflow ui --backend-store-uri sqlite:///$PWD/out/mlflow.db
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional
from urllib.parse import unquote, urlparse

from veritrain.core import locks
from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import sha256_file
from veritrain.records import journal
from veritrain.records.record import RECORD_FILE, SEAL_FILE, Record
from veritrain.records.registry import listed_metrics
from veritrain.records.workspace import Workspace

if TYPE_CHECKING:  # MLflow is imported when an export runs, never with this module
    from mlflow.entities import DatasetInput, Metric
    from mlflow.tracking import MlflowClient

log = logging.getLogger("veritrain")

FORMATS = ("mlflow",)
DB_FILE, ARTIFACTS_DIR, LOCK_FILE = "mlflow.db", "artifacts", ".veritrain-export.lock"
OMITTED_FILE = "config_omitted.json"  # what MLflow cannot hold as a param, metric or tag, whole
PROVENANCE_FILE = "provenance.intoto.jsonl"
SEALED_FILES = ("config.yaml", "metrics.jsonl", PROVENANCE_FILE)  # besides record.json and record.sha256
SEALED_FOLDERS = ("eval/", "export/")
MAX_KEY, MAX_PARAM, MAX_TAG = 250, 6000, 8000  # characters: MLflow's limits on keys, param values and tag values
MAX_DIGEST = 36  # characters: the longest dataset digest MLflow stores (mlflow.utils.validation.MAX_DATASET_DIGEST_SIZE)
MAX_DATASET_NAME = 500  # characters (MAX_DATASET_NAME_SIZE)
KEY = re.compile(r"[\w.\- /:]+")  # the characters MLflow allows in a param, metric or tag key
PER_BATCH = {"params": 100, "metrics": 1000, "tags": 100}  # MLflow's caps per log_batch request
# running: RUNNING, or KILLED once its process is gone; pruned (stopped by its search on purpose): KILLED, MLflow has no nearer
STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "pruned": "KILLED"}
SEAL_TAG = "veritrain.seal"  # set last: an MLflow run with it was exported whole


@dataclass
class Checked:
    """A run whose seal holds, with the files to copy (path in the run → file) and the SHA-256 each must have."""

    record: Record
    seal: str
    files: dict[str, Path]
    sha256: dict[str, str]


def export(workspace: Workspace, records: list[Record], out: Path) -> dict[str, Any]:
    """Export the runs of `records` into the MLflow store in `out` (created when missing); returns the summary:
    `out`, `tracking_uri`, `experiment` {name, id}, `artifact_root` and per run `run_id`, `mlflow_run_id`,
    `exported` (False: it was there already, with the same seal), `seal`, `status` and what was logged.

    Every run is checked before anything is written: a record whose seal does not hold, a file that differs from
    the sealed record, or a run already in `out` under another seal is refused, and nothing is exported."""
    _import_mlflow()
    checked = [sealed(workspace, record) for record in {record.run_id: record for record in records}.values()]  # one MLflow run per run id
    out = out.expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--to mlflow {out}: not a folder; give a folder for mlflow.db and artifacts/")
    out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{out / DB_FILE}"
    with locks.held(out / LOCK_FILE, on_wait=lambda who: log.info("waiting for %s, which is exporting into %s", who, out)):
        client = _open(uri, out)
        name, experiment_id = _experiment(client, workspace, out)
        found = {c.record.run_id: _exported_before(client, c, uri) for c in checked}
        runs = []
        for c in checked:
            before = found[c.record.run_id]
            if before is not None:
                runs.append({"run_id": c.record.run_id, "mlflow_run_id": before, "exported": False, "seal": c.seal})
            else:
                runs.append(_export_run(client, experiment_id, workspace, c))
    return {"out": str(out), "tracking_uri": uri, "experiment": {"name": name, "id": experiment_id},
            "artifact_root": str(out / ARTIFACTS_DIR), "runs": runs}


def _import_mlflow() -> None:
    """Import MLflow, with its usage telemetry off for this process: an export writes files and sends nothing
    anywhere. The environment is put back as it was; a process that imported MLflow itself keeps its choice."""
    with _environment(MLFLOW_DISABLE_TELEMETRY="true"):
        try:
            import mlflow.tracking  # noqa: F401
        except ImportError:
            raise UserError("runs export --to mlflow needs MLflow: pip install 'veritrain[mlflow]'") from None


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ---------------------------------------------------------------- what is exported: the sealed files


def sealed(workspace: Workspace, record: Record) -> Checked:
    """The run of `record` with the files to export, after checking its seal (record.sha256 against the SHA-256 of
    record.json's bytes, which must be `record` itself) and the SHA-256 of each file against the sealed record.
    RunFailed (exit 1) names the first problem. This is not the whole of `veritrain verify`: checkpoints, the
    trajectory and the data version are not exported, and not checked."""
    run_dir, run_id = record.run_dir, record.run_id
    pending = journal.interrupted(run_dir, workspace.state_dir)
    if pending is not None:
        raise RunFailed(f"{run_id}: {pending.message}; export it after that")
    try:
        data = (run_dir / RECORD_FILE).read_bytes()
        seal_bytes = (run_dir / SEAL_FILE).read_bytes()
    except OSError as err:
        raise RunFailed(f"{run_id}: {err.filename}: cannot read it ({err.strerror}); see `veritrain verify {run_id}`") from None
    seal = seal_bytes.decode("utf-8", errors="replace").strip()
    if hashlib.sha256(data).hexdigest() != seal:
        raise RunFailed(f"{run_id}: record.json does not match its seal record.sha256; the run was changed after it was sealed, "
                        f"so it is not exported: see `veritrain verify {run_id}`")
    if record.chain is None or record.chain.base_seal != seal:  # the record read was built on another record.json
        raise RunFailed(f"{run_id}: record.json changed while it was read; export the run again")
    artifacts = record.get("artifacts") or {}
    files = {RECORD_FILE: run_dir / RECORD_FILE, SEAL_FILE: run_dir / SEAL_FILE}
    sha256 = {RECORD_FILE: seal, SEAL_FILE: hashlib.sha256(seal_bytes).hexdigest()}
    for rel in sorted(artifacts):
        if rel in SEALED_FILES or rel.startswith(SEALED_FOLDERS):
            path = record.path(rel)  # in the run, or in the amendment that wrote it
            found = sha256_file(path) if path.is_file() else None
            if found != artifacts[rel]["sha256"]:
                raise RunFailed(f"{run_id}: {rel}: {'changed' if found else 'missing'} since the run was sealed, so the run is not exported: "
                                f"see `veritrain verify {run_id}`")
            files[rel], sha256[rel] = path, str(artifacts[rel]["sha256"])
    if PROVENANCE_FILE not in artifacts and (run_dir / PROVENANCE_FILE).is_file():  # kept beside the seal it signs
        files[PROVENANCE_FILE], sha256[PROVENANCE_FILE] = run_dir / PROVENANCE_FILE, sha256_file(run_dir / PROVENANCE_FILE)
    for link in record.amendments:  # each amendment's record and seal, beside the run's own
        for name in ("amendment.json", "amendment.sha256"):
            rel = f"{link.folder.relative_to(run_dir).as_posix()}/{name}"
            files[rel], sha256[rel] = link.folder / name, sha256_file(link.folder / name)
    return Checked(record, record.seal or seal, files, sha256)


# ---------------------------------------------------------------- the MLflow store


def _open(uri: str, out: Path) -> MlflowClient:
    """A client of the store at `uri`, opened now (MLflow creates a new database's tables), so that a file that is
    not an MLflow database is said here, in one line."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as err:  # a foreign or damaged file: sqlalchemy, alembic and MLflow each raise their own
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise UserError(f"{out / DB_FILE}: MLflow {mlflow.__version__} cannot open it as a tracking database "
                        f"({type(err).__name__}: {first}); export into another folder") from None
    return client


def _experiment(client: MlflowClient, workspace: Workspace, out: Path) -> tuple[str, str]:
    """(name, id) of the experiment the workspace's runs go to, named after the workspace folder and created with
    `out`/artifacts as its artifact root when it is not there yet."""
    name = workspace.root.name or str(workspace.root)
    root = out / ARTIFACTS_DIR
    found = client.get_experiment_by_name(name)
    if found is None:
        return name, client.create_experiment(name, artifact_location=str(root), tags={"veritrain.workspace": str(workspace.root)})
    if found.lifecycle_stage != "active":
        raise UserError(f"{out / DB_FILE}: the experiment {name!r} is deleted; restore it (mlflow experiments restore "
                        f"--experiment-id {found.experiment_id}) or export into another folder")
    if _local_path(found.artifact_location) != root:
        raise UserError(f"{out / DB_FILE}: the experiment {name!r} keeps its artifacts in {found.artifact_location}, not in {root}; "
                        "export into another folder")
    return name, found.experiment_id


def _local_path(uri: str) -> Optional[Path]:
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    return Path(unquote(parsed.path) if parsed.scheme else uri).resolve()


def _exported_before(client: MlflowClient, checked: Checked, uri: str) -> Optional[str]:
    """The MLflow run id of this run in the store when it is there whole with the same seal; None when it is not
    there (a copy an interrupted export left, without the seal tag, is deleted). A copy under another seal (the run
    was re-sealed since: eval, export, baseline or gc) is refused: nothing is replaced behind the user's back."""
    from mlflow.entities import ViewType

    run_id = checked.record.run_id  # a run id (RunRecord validates it), safe inside the quotes
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    copies = client.search_runs(experiments, filter_string=f"tags.`veritrain.run_id` = '{run_id}'", run_view_type=ViewType.ACTIVE_ONLY)
    whole = None
    for copy in copies:
        seal = copy.data.tags.get(SEAL_TAG)
        if seal is None:
            log.warning("%s: deleting MLflow run %s, which an interrupted export left unfinished", run_id, copy.info.run_id)
            client.delete_run(copy.info.run_id)
        elif seal == checked.seal:
            whole = copy.info.run_id
        else:
            raise UserError(f"{run_id}: already exported as MLflow run {copy.info.run_id} with seal {seal[:12]}, and the run was re-sealed "
                            f"since (seal {checked.seal[:12]}); export into another folder, or delete that MLflow run first: "
                            f"MLFLOW_TRACKING_URI={uri} mlflow runs delete --run-id {copy.info.run_id}")
    return whole


def _export_run(client: MlflowClient, experiment_id: str, workspace: Workspace, checked: Checked) -> dict[str, Any]:
    """One veritrain run as one MLflow run. Everything is logged, the copies are hashed again, and the seal tag comes
    last; when anything fails on the way the MLflow run is deleted again."""
    from mlflow.entities import Param, RunTag

    record = checked.record
    start = _ms(record["started_at"])
    end = _end_ms(record, start)
    params, omitted = params_of(record["config"])
    metrics, omitted_metrics = metrics_of(record, _rows(checked), start, end)
    tags, omitted_tags = tags_of(workspace, checked)
    omitted.update(omitted_metrics)
    omitted.update(omitted_tags)
    if omitted:
        tags["veritrain.omitted"] = (f"{len(omitted)} value(s) MLflow cannot hold (a key over {MAX_KEY} characters or with other "
                                     f"characters, a param over {MAX_PARAM}, a tag over {MAX_TAG}): whole in {OMITTED_FILE}")
    status = _status(workspace, record)
    run = client.create_run(experiment_id, start_time=start, run_name=record.run_id)
    try:
        for chunk in _chunks([Param(k, v) for k, v in params.items()], PER_BATCH["params"]):
            client.log_batch(run.info.run_id, params=chunk)
        for chunk in _chunks(metrics, PER_BATCH["metrics"]):
            client.log_batch(run.info.run_id, metrics=chunk)
        for chunk in _chunks([RunTag(k, v) for k, v in tags.items()], PER_BATCH["tags"]):
            client.log_batch(run.info.run_id, tags=chunk)
        dataset = dataset_input(workspace, record)
        if dataset is not None:
            client.log_inputs(run.info.run_id, datasets=[dataset])
        _log_files(client, run.info.run_id, checked, omitted)
        _check_copies(run.info.artifact_uri, checked)
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status, end_time=end)
        client.set_tag(run.info.run_id, SEAL_TAG, checked.seal)
    except BaseException:
        with suppress(Exception):
            client.delete_run(run.info.run_id)
        raise
    return {"run_id": record.run_id, "mlflow_run_id": run.info.run_id, "exported": True, "seal": checked.seal, "status": status,
            "params": len(params), "metrics": len({m.key for m in metrics}), "artifacts": len(checked.files) + bool(omitted),
            "omitted": sorted(omitted)}


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for first in range(0, len(items), size):
        yield items[first:first + size]


def _log_files(client: MlflowClient, run_id: str, checked: Checked, omitted: dict[str, Any]) -> None:
    """The checked files, each at its path in the run, and the values MLflow cannot hold (OMITTED_FILE)."""
    for rel, path in checked.files.items():
        client.log_artifact(run_id, str(path), artifact_path=posixpath.dirname(rel) or None)
    if omitted:
        with tempfile.TemporaryDirectory(prefix="veritrain-mlflow-") as folder:
            listing = Path(folder) / OMITTED_FILE
            listing.write_text(json.dumps(omitted, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
            client.log_artifact(run_id, str(listing))


def _check_copies(artifact_uri: Optional[str], checked: Checked) -> None:
    """Each copy in the artifact root has the SHA-256 checked before it was copied (a file changed meanwhile is refused)."""
    root = _local_path(artifact_uri) if artifact_uri else None
    for rel, expected in checked.sha256.items():
        copy = root / rel if root is not None else None
        if copy is None or not copy.is_file() or sha256_file(copy) != expected:
            raise RunFailed(f"{checked.record.run_id}: {rel} changed while it was exported; the MLflow run is deleted again: export it again")


# ---------------------------------------------------------------- what a run's record becomes


def flat_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key → value for every leaf of the config (`optim.lr`); an empty mapping is a leaf of its own."""
    if not isinstance(config, dict) or (prefix and not config):
        return {prefix: config}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(flat_config(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def param_text(value: Any) -> str:
    """A config value as an MLflow param: a string as it is, anything else as JSON (`null`, `true`, `[32]`)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def valid_key(key: str) -> bool:
    """Whether MLflow takes `key` as a param, metric or tag key (mlflow.utils.validation)."""
    normal = posixpath.normpath(key)
    return len(key) <= MAX_KEY and KEY.fullmatch(key) is not None and normal == key and normal != "." and not normal.startswith(("..", "/"))


def params_of(config: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """(params, omitted): each config leaf as a param; what MLflow cannot hold whole goes to `omitted`
    (`params.<key>` → the value), never truncated."""
    params: dict[str, str] = {}
    omitted: dict[str, Any] = {}
    for key, value in flat_config(config).items():
        text = param_text(value)
        if valid_key(key) and len(text) <= MAX_PARAM and key not in params:
            params[key] = text
        else:
            omitted[f"params.{key}"] = value
    return params, omitted


def _rows(checked: Checked) -> list[dict[str, Any]]:
    """The rows of the run's metrics.jsonl (bytes that matched the sealed record), one per epoch."""
    path = checked.files.get("metrics.jsonl")
    if path is None:
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise RunFailed(f"{checked.record.run_id}: metrics.jsonl: line {number} is not JSON") from None
    return [row for row in rows if isinstance(row, dict)]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metrics_of(record: Record, rows: list[dict[str, Any]], start: int, end: int) -> tuple[list[Metric], dict[str, Any]]:
    """(metrics, omitted): every number of each metrics.jsonl row at that row's `step` (its `epoch` too, as the
    metric `epoch`), then the final metrics `runs list --json` shows, `<split>.<name>` at the step of the checkpoint
    they came from. Times: the run's start for the rows (metrics.jsonl keeps no time of day), its end for the rest."""
    from mlflow.entities import Metric

    metrics: list[Metric] = []
    omitted: dict[str, Any] = {}
    for index, row in enumerate(rows):
        step = next((row[k] for k in ("step", "epoch") if isinstance(row.get(k), int) and not isinstance(row.get(k), bool)), index)
        for key, value in row.items():
            if key == "step" or not _number(value):
                continue
            if valid_key(key):
                metrics.append(Metric(key, float(value), start, step))
            else:
                omitted.setdefault(f"metrics.{key}", []).append({"step": step, "value": value})
    for split, values in listed_metrics(record).items():
        entry = record["metrics"][split].get("trajectory_entry")
        step = entry.get("step") if isinstance(entry, dict) else None
        step = step if isinstance(step, int) and not isinstance(step, bool) else 0
        for name, value in values.items():
            key = f"{split}.{name}"
            if valid_key(key):
                metrics.append(Metric(key, float(value), end, step))
            else:
                omitted[f"metrics.{key}"] = value
    return metrics, omitted


def tags_of(workspace: Workspace, checked: Checked) -> tuple[dict[str, str], dict[str, Any]]:
    """(tags, omitted): who the run is and what it is bound to. The seal tag is set apart, last."""
    record = checked.record
    code, data = record.get("code") or {}, record.get("data") or {}
    tags = {
        "mlflow.runName": record.run_id,
        "veritrain.run_id": record.run_id,
        "veritrain.kind": str(record.get("kind") or "run"),
        "veritrain.status": record.status,
        "veritrain.record": str(record.run_dir / RECORD_FILE),
        "veritrain.code_version": str(code.get("git_commit") or f"veritrain {code.get('veritrain') or 'unknown'}"),
        "veritrain.workspace": str(workspace.root),
    }
    optional = {
        "veritrain.data_version": data.get("version"),
        "veritrain.version": code.get("veritrain"),
        "veritrain.git_dirty": None if code.get("git_dirty") is None else json.dumps(code.get("git_dirty")),
        "mlflow.source.git.commit": code.get("git_commit"),
        "veritrain.config_hash": record.get("config_hash"),
        "veritrain.final_state_sha256": record.get("final_state_sha256"),
        "veritrain.exp_name": record.get("exp_name"),
        "veritrain.parent": record.get("parent"),
        "mlflow.note.content": record.get("hypothesis"),
    }
    tags.update({key: str(value) for key, value in optional.items() if value is not None})
    omitted = {f"tags.{key}": value for key, value in tags.items() if len(value) > MAX_TAG}
    return {key: value for key, value in tags.items() if len(value) <= MAX_TAG}, omitted


def dataset_input(workspace: Workspace, record: Record) -> Optional[DatasetInput]:
    """The run's data version as an MLflow dataset: its digest is the data version id, which hashes every sample
    (cut to the 36 characters MLflow stores; the profile and the input's tag hold all 64), its source the version's
    folder in the workspace."""
    from mlflow.data.dataset_source_registry import get_dataset_source_from_json
    from mlflow.entities import Dataset, DatasetInput, InputTag

    version = record.data_version
    if version is None:
        return None
    data = record.get("data") or {}
    source = get_dataset_source_from_json(json.dumps({"uri": str(workspace.state_dir / "data" / version)}), source_type="local")
    name = str((data.get("card") or {}).get("name") or "")
    if not name or len(name) > MAX_DATASET_NAME:
        name = f"{str(data.get('source') or 'data')[:200]}@{version[:12]}"
    profile = {"data_version": version, "version_json_sha256": data.get("version_json_sha256"), "counts": data.get("counts"),
               "hash_algorithm": data.get("hash_algorithm"), "recipe": data.get("recipe")}
    dataset = Dataset(name=name, digest=version[:MAX_DIGEST], source_type="local", source=source.to_json(),
                      profile=json.dumps(profile, sort_keys=True))
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "data_version"), InputTag("veritrain.data_version", version)])


def _ms(iso: str) -> int:
    """An ISO 8601 time of the record as milliseconds since the epoch (a time without a zone is UTC)."""
    moment = datetime.fromisoformat(iso)
    return round((moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp() * 1000)


def _end_ms(record: Record, start: int) -> int:
    """The recorded end; a run still running (or whose process died) has none: its start plus the seconds it recorded."""
    if record.get("ended_at"):
        return _ms(record["ended_at"])
    total = (record.get("timings") or {}).get("total")
    return start + round(1000 * total) if isinstance(total, (int, float)) and not isinstance(total, bool) else start


def _status(workspace: Workspace, record: Record) -> str:
    if record.status == "running":
        return "KILLED" if workspace.lock_is_stale(record.run_id) else "RUNNING"
    return STATUS[record.status]
