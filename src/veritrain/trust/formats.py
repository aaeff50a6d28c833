"""What a run's record must carry, by the format it is judged under.

A record names its format (`record_format`; a record without it is format 0, made before records named one). A
forger who strips a field would like the record read as an older one, where the field was not yet written, so a
missing field reads as "not checked". Three things stop that:

- the format a record is judged under is the highest of what it declares and what bound content witnesses: a
  checkpoint written by a run of format N holds `record_format: N` inside its state (veritrain.train.checkpointer,
  veritrain.userloop.run), so a record stripped to an older format while its checkpoints stay is caught;
- under that format every field it requires is a named problem when missing (`format_requires`), never "not checked";
- a record presented as older than anything it still holds shows is caught only by policy: `--min-format N`, a
  required signature (`--public-key`, `--trusted-keys`, `--require-signature`) or `--expect SEAL`.

The formats:

- 0: records made before records named their format. A result without its trajectory entry, a run without a
  provenance statement or a trajectory, are what earlier veritrains wrote: listed as not checked.
- 1: every ended run has its provenance statement (`provenance`); a run that trained with veritrain's loop says what
  selected what (`selection`) and, once completed, has its trajectory; every result (each metric set, the export) of a
  run with a trajectory names the entry it came from (`trajectory_entry`), unless it is a run of an outside checkpoint;
  a kept framework checkpoint in a script's trajectory names its file; a script's run above the `logged` level keeps a
  copy of its script (`script.file`).
- 2: a training that followed a best validation names its step (`training.best_step`), which best.pt must hold:
  validations may fall inside an epoch (`eval.every_steps`), where the best epoch no longer names one state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from veritrain.records.record import RECORD_FILE, RECORD_FORMAT

# what a format checks that the one below it does not: shown by verify for a run judged under an older format
ADDED_BY = {
    1: ("the provenance statement of every ended run", "each result's trajectory entry", "the trajectory of a completed training",
        "what selected what (best.pt, early stopping)", "a framework checkpoint's file in the trajectory", "a script's recorded copy"),
    2: ("the best validation's step",),
}


@dataclass(frozen=True)
class FormatFacts:
    """The format a run is judged under and why."""

    declared: int  # the record's `record_format` (0 when absent)
    witnessed: int  # the highest format bound content shows (0: none shows more)
    witnesses: tuple[str, ...]  # what shows it, one line each
    minimum: int  # what the policy asks for (--min-format; 0: nothing)

    @property
    def effective(self) -> int:
        return max(self.declared, self.witnessed)

    @property
    def unchecked(self) -> tuple[str, ...]:
        """What the formats above the effective one check and this one does not."""
        return tuple(what for number in range(self.effective + 1, RECORD_FORMAT + 1) for what in ADDED_BY.get(number, ()))

    def as_dict(self) -> dict[str, Any]:
        return {"declared": self.declared, "witnessed": self.witnessed, "witnesses": list(self.witnesses), "effective": self.effective,
                "minimum": self.minimum, "current": RECORD_FORMAT, "unchecked": list(self.unchecked)}


def line(fmt: Mapping[str, Any]) -> str:
    """The record format a run was judged under (`FormatFacts.as_dict()`), why, and what that format leaves unchecked."""
    why = f"declared {fmt['declared']}" + (f"; its content shows {fmt['witnessed']}" if fmt["witnessed"] > fmt["declared"] else "")
    shown = f"format: judged under record format {fmt['effective']} ({why}; this veritrain writes {fmt['current']})"
    if fmt["unchecked"]:
        shown += f"; unchecked under it: {', '.join(fmt['unchecked'])}"
    return shown


def declared(record: Mapping[str, Any]) -> int:
    value = record.get("record_format")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 0


def facts(record: Mapping[str, Any], checkpoint_formats: Mapping[str, Optional[int]], minimum: int = 0) -> FormatFacts:
    """The format facts of `record`, given the `record_format` each checkpoint of the run holds in its state (None:
    none, as checkpoints of format-0 runs)."""
    witnesses = [f"{rel} holds a state written by a run of format {number}" for rel, number in sorted(checkpoint_formats.items())
                 if isinstance(number, int) and number > 0]
    witnessed = max((number for number in checkpoint_formats.values() if isinstance(number, int)), default=0)
    return FormatFacts(declared(record), witnessed, tuple(witnesses[:3]), minimum)


def problems(record: Mapping[str, Any], fmt: FormatFacts) -> list[dict[str, str]]:
    """What the format `fmt.effective` requires and the record lacks, each a problem of kind `format_requires`; a record
    that declares less than its witnesses show (`format_downgraded`) or less than the policy asks (`format_below_minimum`)."""
    found: list[dict[str, str]] = []
    if fmt.witnessed > fmt.declared:
        found.append({"path": RECORD_FILE, "kind": "format_downgraded",
                      "detail": f"the record says format {fmt.declared}, but {fmt.witnesses[0] if fmt.witnesses else 'its content'}: "
                                "a record made newer and presented as older; it is judged as format " + str(fmt.effective)})
    if fmt.effective < fmt.minimum:
        found.append({"path": RECORD_FILE, "kind": "format_below_minimum",
                      "detail": f"judged under format {fmt.effective} (declared {fmt.declared}), below the --min-format {fmt.minimum} asked: "
                                "made by an earlier veritrain, or stripped to look like it"})
    if fmt.effective >= 1:
        found.extend({"path": path, "kind": "format_requires", "detail": f"format {fmt.effective} requires {what}"}
                     for path, what in _missing_in_format_1(record) + (_missing_in_format_2(record) if fmt.effective >= 2 else []))
    return found


def _missing_in_format_2(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A training that names its best epoch without the best step: a forger who strips `best_step` would have best.pt
    judged by its epoch, whose last entry may be a later (and worse) state than the one validation chose."""
    training = record.get("training")
    if not isinstance(training, Mapping) or not training.get("best_epoch") or training.get("best_step") is not None:
        return []
    return [(RECORD_FILE, "training.best_step (the step of the best validation, which best.pt holds), which the record lacks")]


def _missing_in_format_1(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    missing: list[tuple[str, str]] = []
    status, kind = record.get("status"), record.get("kind") or "run"
    if status != "running" and not isinstance(record.get("provenance"), Mapping):
        missing.append(("provenance.intoto.jsonl", "the provenance statement of an ended run (`provenance`), which the record lacks"))
    entries = record.get("trajectory") or []
    outside = record.get("input_checkpoint")
    trained = "train" in (record.get("stages") or ()) and kind in ("run", "train")
    if trained and status in ("completed", "pruned") and (record.get("training") or {}).get("steps"):
        if not entries:
            missing.append((RECORD_FILE, "the trajectory of a completed training (`trajectory`), which the record lacks"))
    if trained and record.get("training") and "selection" not in record:
        missing.append((RECORD_FILE, "what selected what (`selection`), which the record lacks"))
    if entries and not outside:
        results = [(f"metrics.{split}", m) for split, m in (record.get("metrics") or {}).items() if isinstance(m, Mapping)]
        export = record.get("export") or {}
        if isinstance(export, Mapping) and export.get("files"):
            results.append(("export", export))
        missing.extend((RECORD_FILE, f"{what}.trajectory_entry (the entry the result came from), which the record lacks")
                       for what, result in results if not result.get("trajectory_entry"))
    script = record.get("script") if kind == "script" else None
    if isinstance(script, Mapping):
        if script.get("integration"):
            missing.extend((RECORD_FILE, f"trajectory[{index}].file (the framework checkpoint holding that entry), which the record lacks")
                           for index, entry in enumerate(entries) if index and isinstance(entry, Mapping) and entry.get("kept") and not entry.get("file"))
        level = (record.get("guarantee") or {}).get("level")
        if level in ("replayable", "bound") and not script.get("file"):
            missing.append((RECORD_FILE, f"script.file (the recorded copy of the script of a {level} run), which the record lacks"))
    return missing
