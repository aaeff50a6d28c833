"""The one writer of run records: `record.json` and its seal `record.sha256` (schema in veritrain.records.record).

A run's record changes in two ways only, both here:

- while the run runs, through its `Recorder` (pipeline: `start`, each stage, `finish`, `write` after each);
- once it is sealed, through `amending` (eval, export, baseline, gc): a sealed amendment beside the record
  (veritrain.records.amendments), written whole and made part of the run by one rename; the record itself never changes.

Every other module reads records through `veritrain.records.record.read_record`, which validates them and returns
them read-only. A test holds this: no module outside veritrain.records.record, veritrain.records.journal, veritrain.records.amendments and this one writes
record.json or record.sha256 or assigns into a record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from veritrain.core.errors import UserError
from veritrain.core.signing_keys import sealing_key
from veritrain.records import amendments, journal, provenance
from veritrain.records.record import RECORD_FORMAT, RECORD_VERSION, Record, RunRecord, frozen, now_iso, record_bytes, thawed, write_record

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace

# the fields of a new run's record that start empty; `Recorder.start` is given the others
_EMPTY_RUN_FIELDS: dict[str, Any] = {
    "status": "running", "ended_at": None, "env": None, "training": None, "metrics": {}, "final_state_sha256": None,
    "timings": {}, "events": [], "resumes": [], "error": None,
}


# what the stages of a run produce (Recorder.set): everything else has its own method or is set when the run starts
STAGE_FIELDS = frozenset({"env", "selection", "task_spec", "data", "distributed", "training", "trajectory", "other_saves",
                          "final_state_sha256", "baselines", "export", "guarantee"})


class Recorder(Mapping[str, Any]):
    """The record of one run while it runs. Reads (`record["data"]`, `record.get(...)`) give read-only copies;
    every change is a method; `write` validates the record against RunRecord and seals it."""

    def __init__(self, run_dir: Path, fields: dict[str, Any]) -> None:
        sealing_key()  # the key that will sign the run's statement, checked before the run starts (UserError if unusable)
        self.run_dir = run_dir
        self._fields = fields

    @classmethod
    def start(cls, run_dir: Path, **fields: Any) -> Recorder:
        """A new run's record: `fields` (run_id, kind, stages, argv, config, code, …) over the empty ones; status running."""
        return cls(run_dir, {"record_version": RECORD_VERSION, "record_format": RECORD_FORMAT, "started_at": now_iso(), **thawed(_EMPTY_RUN_FIELDS), **fields})

    @classmethod
    def resume(cls, record: Record, argv: list[str]) -> Recorder:
        """The record of the run in `record.run_dir`, running again: its earlier status is kept in `resumes`."""
        fields = thawed(record)
        fields.update(status="running", ended_at=None, error=None)
        fields.setdefault("resumes", []).append({"at": now_iso(), "argv": argv, "previous_status": record.get("status")})
        return cls(record.run_dir, fields)

    @classmethod
    def continue_in(cls, run_dir: Path, old: Record, argv: list[str], code: dict[str, Any], event: dict[str, Any],
                    dropped: tuple[str, ...]) -> Recorder:
        """A new run in `run_dir` that continues the run `old` (its parent) from its state, as `--use-current-code`
        resumes: its record is the old one less `dropped`, with this run's id, `code` and `event`."""
        fields = thawed(old)
        for key in dropped:
            fields.pop(key, None)
        fields.update(run_id=run_dir.name, status="running", ended_at=None, error=None, parent=old.run_dir.name, code=code)
        fields["events"] = [*fields.get("events", []), event]
        fields.setdefault("resumes", []).append({"at": now_iso(), "argv": argv, "previous_status": old.get("status")})
        return cls(run_dir, fields)

    # ------------------------------------------------------------ reading

    def __getitem__(self, key: str) -> Any:
        return frozen(self._fields[key])

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._fields))

    def __len__(self) -> int:
        return len(self._fields)

    @property
    def run_id(self) -> str:
        return self._fields["run_id"]

    @property
    def status(self) -> str:
        return self._fields["status"]

    def snapshot(self) -> Record:
        """The record as it is now, validated and read-only (what a reader of record.json would get after `write`)."""
        return Record(self._fields, self.run_dir, RunRecord.model_validate_json(record_bytes(self._fields)))

    # ------------------------------------------------------------ the parts that others fill in place

    @property
    def code(self) -> dict[str, Any]:
        """The record's `code` section, which record.save_code and the run's code session (veritrain.records.usercode) fill."""
        return self._fields["code"]

    @property
    def events(self) -> list[dict[str, Any]]:
        """The record's `events`, which the training loop appends to while it trains (rollbacks, rank changes)."""
        return self._fields["events"]

    # ------------------------------------------------------------ each stage

    def set(self, **fields: Any) -> None:
        """Set the top-level fields a stage produced (STAGE_FIELDS). Status, error and times change through the
        methods below; the artifact table and the seal history only when the record is sealed."""
        unknown = sorted(set(fields) - STAGE_FIELDS)
        if unknown:
            raise ValueError(f"Recorder.set: {', '.join(unknown)}: not a field a stage sets")
        self._fields.update(thawed(fields))

    def update_section(self, section: str, **fields: Any) -> None:
        """Set keys inside a section (env: device, threads; distributed: backend, devices)."""
        self._fields[section] = {**(self._fields.get(section) or {}), **thawed(fields)}

    def set_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        self._fields.setdefault("metrics", {})[split] = thawed(metrics)

    def time(self, stage: str, seconds: float, add: bool = False) -> None:
        """Record a stage's time in seconds; `add` sums it with the time of earlier attempts (train, total over resumes)."""
        timings = self._fields["timings"]
        timings[stage] = round((timings.get(stage, 0) if add else 0) + seconds, 3)

    def add_events(self, events: list[dict[str, Any]]) -> None:
        self._fields["events"].extend(thawed(events))

    # ------------------------------------------------------------ how it ends

    def completed(self) -> None:
        self._fields["status"] = "completed"

    def pruned(self, verdict: dict[str, Any]) -> None:
        """Stopped by its search after an epoch (the verdict: epoch, step, value, reason, search, trial): it ends here,
        trained that far, and is neither evaluated nor exported."""
        keep = ("epoch", "step", "value", "reason", "search", "trial")
        self._fields.update(status="pruned", pruned=thawed({k: verdict.get(k) for k in keep if k in verdict}))

    def interrupted(self, kind: str, message: str) -> None:
        self._fields.update(status="interrupted", error={"type": kind, "message": message})

    def failed(self, err: BaseException) -> None:
        self._fields.update(status="failed", error={"type": err.__class__.__name__, "message": str(err)})

    def end(self) -> None:
        self._fields["ended_at"] = now_iso()

    def finish(self, seconds: float, env: Optional[dict[str, Any]] = None) -> None:
        """The end time and the total time (over resumes); `env` when the run ended before it recorded its own."""
        self.end()
        self.time("total", seconds, add=True)
        if self._fields.get("env") is None and env is not None:
            self._fields["env"] = thawed(env)

    def write(self) -> str:
        """Validate, refresh the artifact table and seal; returns the seal (hex SHA-256)."""
        return write_record(self.run_dir, self._fields)


class Amendment:
    """One amendment of a sealed run being written (see `amending`): the command stages its files under `new` (laid out
    as in the run) and says here what else changed; `commit` seals the amendment and adds it to the run."""

    def __init__(self, draft: amendments.Draft, record: Record, key: Any, state_dir: Path) -> None:
        self.draft = draft
        self.record = record  # the run as the command read it
        self.key = key
        self.state_dir = state_dir
        self._fields = thawed(record)

    @property
    def new(self) -> Path:
        return self.draft.files

    def replace_folder(self, rel: str) -> Path:
        """The staging folder for the run's folder `rel`: every file of the run there that the command does not write
        again is retired (export/: formats not kept)."""
        self.draft.replaced.append(rel.strip("/"))
        staged = self.new / rel
        staged.mkdir(parents=True, exist_ok=True)
        return staged

    def remove(self, rel: str) -> None:
        """Retire the run's file `rel` (gc removes it once the amendment is part of the run)."""
        self.draft.retired.add(rel)

    def get(self, key: str, default: Any = None) -> Any:
        return frozen(self._fields.get(key, default))

    def set_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        self._fields.setdefault("metrics", {})[split] = thawed(metrics)

    def set_baselines(self, baselines: dict[str, Any]) -> None:
        self._fields["baselines"] = thawed(baselines)

    def set_export(self, export: dict[str, Any]) -> None:
        self._fields["export"] = thawed(export)

    def add_event(self, kind: str, detail: str) -> None:
        self.draft.events.append({"kind": kind, "step": None, "detail": detail, "at": now_iso()})

    def commit(self, by: str) -> str:
        """Seal the amendment, with its own signed provenance statement, and add it to the run; returns its seal."""
        changed = {key: self._fields[key] for key in amendments.AMENDABLE if key in self._fields and self._fields[key] != self.record.get(key)}
        doc = self.draft.document(by, now_iso(), changed, provenance.field(self.key))
        chain = self.record.chain
        links = (*chain.links, amendments.Link(doc["index"], self.draft.folder, "0" * 64, doc))
        RunRecord.model_validate_json(record_bytes(amendments.apply(_base_fields(self.record), self.record.run_dir, links).fields))
        seal = provenance.amendment_seal(doc)
        statement = provenance.envelope_bytes(provenance.amendment_statement(doc, seal), self.key)
        return self.draft.commit(doc, statement)


def _base_fields(record: Record) -> dict[str, Any]:
    """The run's own record.json (before its amendments)."""

    return json.loads((record.run_dir / "record.json").read_text(encoding="utf-8"))


@contextmanager
def amending(workspace: Workspace, record: Record) -> Iterator[Amendment]:
    """Amend the sealed run `record` was read from (veritrain.records.amendments): the amendment is staged in
    `.veritrain/amending/`, and leaving the block without `commit` leaves the run as it was. One amend of a run at a
    time (its lock); an amendment written meanwhile by another command is refused at commit."""
    key = sealing_key()  # an unusable key stops the command before it does any work
    run_dir = record.run_dir
    staging = amendments.staging_root(workspace.state_dir)
    if staging.is_symlink():  # an amendment is written there before it joins the run: never through a link
        raise UserError(f"{staging}: a link, not a folder; veritrain never makes it a link: remove the link itself and run the command again")
    staging.mkdir(parents=True, exist_ok=True)
    if os.stat(staging).st_dev != os.stat(run_dir).st_dev:
        raise UserError(f"{staging}: not on the filesystem of {run_dir}; an amendment is added to a run by renaming it, "
                        "so keep runs/ and .veritrain/ in one filesystem")
    journal.recover(workspace, run_dir)  # an amend an earlier veritrain began, completed or rolled back first
    workspace.lock_run(record.run_id)
    draft = None
    try:
        amendments.clear_staging(workspace.state_dir, lambda owner: True, record.run_id)  # what a kill left: the lock is ours
        draft = amendments.Draft(workspace.state_dir, run_dir, record.run_id, record.chain, record.get("artifacts") or {})
        yield Amendment(draft, record, key, workspace.state_dir)
    finally:
        if draft is not None:
            draft.discard()  # committed: renamed away already, nothing left to remove
        workspace.unlock_run(record.run_id)


def write_smoke_record(folder: Path, document: dict[str, Any]) -> str:
    """The record of a smoke test's folder (`.veritrain/smoke/<key>/`, veritrain.orchestration.smoke): not a run's record, so not
    validated as one; sealed the same way."""
    return write_record(folder, document, run=False)
