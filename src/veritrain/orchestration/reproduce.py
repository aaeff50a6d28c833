"""`veritrain reproduce RUN`: run the recorded pipeline of a run again, into a new run (same config, seed, data
version, world size and the user code recorded with it), and compare the two (veritrain.trust.verify.compare_runs:
final weights, every epoch's metrics, every evaluation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from veritrain.core.config import config_hash, resolved_from_record
from veritrain.core.errors import UserError
from veritrain.data import prepare
from veritrain.data.identity import tokenizer_difference
from veritrain.orchestration import pipeline
from veritrain.records.record import Record, read_record
from veritrain.records.workspace import Workspace
from veritrain.trust.opening import code_session, refuse_untrusted_code
from veritrain.trust.verify import compare_runs
from veritrain.userloop import replay


def reproduce(workspace: Workspace, ref: str, argv: list[str], trust_code: bool = False, use_current_code: bool = False,
              python: Optional[str] = None, inputs_root: Optional[str] = None) -> dict[str, Any]:
    """Run the recorded pipeline of RUN again (same config, seed, data version, and the user code recorded with it,
    or today's with `use_current_code`) into a new run and compare the final weights and every epoch's metrics."""
    from veritrain.train import engines

    original_dir = workspace.resolve_run(ref, "model")
    original = read_record(original_dir)
    if replay.is_script_run(original):
        return _reproduce_script(workspace, original, trust_code, use_current_code, python, inputs_root)
    resolved = resolved_from_record(original)  # before the code is trusted: a run whose values were not recorded is refused either way
    cfg = resolved.config
    refuse_untrusted_code(workspace, original_dir, original, trust_code)
    if original.get("status") != "completed":
        raise UserError(f"{ref}: run {original_dir.name} is {original.get('status')}; only a completed run can be reproduced")
    if config_hash(cfg) != original["config_hash"]:
        raise UserError(f"{ref}: the recorded config no longer hashes to its config_hash with this veritrain; it cannot be re-run as recorded")
    data = prepare.run(cfg.data, resolved.data_paths, workspace.state_dir, recorded=original["data"]["version"])
    tokenizer = tokenizer_difference(original.get("data"), data)
    if tokenizer:  # a model's ids mean nothing under another tokenizer's bytes
        raise UserError(f"{ref}: {tokenizer}; restore the data and its tokenizer to reproduce")
    if data.version != original["data"]["version"]:
        raise UserError(f"{ref}: the data now prepares to version {data.version[:12]}, the run used {original['data']['version'][:12]}; "
                        "restore the data to reproduce" + prepare.earlier_recipe_hint(original.get("data")))
    distributed = original.get("distributed") or {}
    if int(distributed.get("nodes", 1)) > 1:
        raise UserError(f"{original['run_id']}: it was trained on {distributed['nodes']} machines; reproduce it there: start the same torchrun "
                        f"command ({distributed['world_size']} ranks) with `veritrain train runs/{original['run_id']}/config.yaml` and compare with `veritrain runs compare`")
    code = code_session(workspace, original_dir, original, "reproduce", use_current_code)
    outcome = pipeline.run(resolved, workspace, argv, kind=original["kind"], reproduced_from=original["run_id"], data_version=data.version,
                           nproc=int(distributed.get("world_size", 1)), code=code,  # the same world size: the result depends on it
                           engine=engines.of_record(original))  # and the same engine
    comparison = compare_runs(original_dir, Path(outcome.summary["run_dir"]))
    comparison["reproduction_status"] = outcome.record["status"]
    comparison["reproduction_seal"] = outcome.seal
    comparison["error"] = str(outcome.error) if outcome.error else None
    return comparison


def _reproduce_script(workspace: Workspace, original: Record, trust_code: bool, use_current_code: bool, python: Optional[str],
                      inputs_root: Optional[str]) -> dict[str, Any]:
    """A script's run (veritrain.userloop): its recorded command, with the recorded code, makes a new run; compare the two."""
    if use_current_code:
        raise UserError(f"--use-current-code: run {original.run_id} is a script's run, reproduced only with its recorded code; "
                        "run the script again for a run with the current code, then `veritrain runs compare`")
    if (why := replay.refusal(original, "reproduce")) is not None:
        raise UserError(why)
    refuse_untrusted_code(workspace, original.run_dir, original, trust_code)
    if original.status != "completed":
        raise UserError(f"{original.run_id}: the run is {original.status}; only a completed run can be reproduced")
    new_dir = replay.reproduce(workspace, original.run_dir, python, Path(inputs_root) if inputs_root else None)
    comparison = compare_runs(original.run_dir, new_dir)
    new = read_record(new_dir)
    comparison["reproduction_status"] = new.status
    comparison["reproduction_seal"] = (new_dir / "record.sha256").read_text().strip()
    comparison["error"] = None if new.status == "completed" else f"the reproduction {new.status}"
    return comparison
