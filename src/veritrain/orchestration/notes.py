"""Notes on a run: `runs/<id>/notes.jsonl`, one JSON object a line, kept outside the seal on purpose (a note is
added after the run and says what a person concluded, not what the run did). `veritrain runs note` adds one;
veritrain.records.registry reads them for `runs show`, experiments.md and the run browser; a note with `waive` waives a
`veritrain check` row for the reason it gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from veritrain.core.errors import UserError
from veritrain.core.secrets import text_secret
from veritrain.records.record import NOTES_FILE, now_iso
from veritrain.trust.check import ROWS

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace


def add(workspace: Workspace, ref: str, text: str, conclusion: bool = False, waive: Optional[str] = None) -> tuple[Path, dict[str, Any]]:
    """Append a note (the run's conclusion with `conclusion`; waiving the check row `waive` for the reason `text`) to
    the run `ref`; returns the run folder and the note. UserError for a row that is not a check row, a waiver
    without a reason, or a text that holds a secret (a note is kept and shown as written)."""
    from veritrain.orchestration import pipeline

    if waive is not None and waive not in ROWS:
        raise UserError(f"--waive {waive}: not a check row; give one of {', '.join(ROWS)}")
    if waive is not None and not text.strip():
        raise UserError(f"--waive {waive}: give the reason the row cannot pass as TEXT")
    kind = text_secret(text)
    if kind is not None:
        raise UserError(f"TEXT holds {kind}; a note is kept as written (and shown in experiments.md): leave the secret out")
    run_dir = workspace.resolve_run(ref)
    note: dict[str, Any] = {"at": now_iso(), "text": text, "conclusion": conclusion}
    if waive is not None:
        note["waive"] = waive
    with open(run_dir / NOTES_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(note) + "\n")
    pipeline.update_experiments(workspace)
    return run_dir, note
