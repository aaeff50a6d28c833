"""`veritrain check RUN`: the completion checklist of a run (data, environment, training, evaluation,
export, archive), one row each with its status and the fix that clears it.

A row is `pass`, `fail`, `missing`, `n/a` (it does not apply to this kind of run, e.g. training rows
of a baseline run), `waived` (a note gave the reason it cannot pass: `veritrain runs note RUN --waive
ROW "reason"`) or `unknown` (the run page's `run_verifies` row when no fresh verdict is kept: it shows
no verdict it did not compute). A waived or unknown row is never shown as passed. Each fix is what clears the row: a command on
this run when one exists (eval, export, baseline, smoke, resume), else a new run that addresses the
recorded cause (a failed run is never resumed: it would fail the same way).
"""

from __future__ import annotations

import json
import shlex
import zipfile
from pathlib import Path
from typing import Any, Mapping, Optional

from veritrain.core.baselines import Judgement
from veritrain.core.errors import RunFailed
from veritrain.core.selection import SELECTION_SPLIT, selected_on
from veritrain.core.task_registry import spec_of_record
from veritrain.records.record import read_record
from veritrain.records.registry import read_notes
from veritrain.records.smoke_results import passed_before, smoke_key
from veritrain.trust import formats
from veritrain.trust.assessment import (
    Replayability,
    assess,
    baseline_of,
    config_path,
    new_run_fix,
    rederivation,
    replayability,
    test_history,
)
from veritrain.trust.policy import Policy
from veritrain.trust.provenance_check import Signer

# row id → what it checks; ids are what `runs note --waive` takes
ROWS = {
    "data_versioned": "data: validated and versioned",
    "no_leakage": "data: no leakage between splits",
    "achieved_split": "data: achieved split follows the ratios (no split_skew)",
    "normalization_from_train": "data: normalization statistics from the train split only",
    "packages_locked": "environment: package list locked with the run",
    "smoke_passed": "environment: smoke test passed for this config",
    "baseline_present": "environment: baseline on the same splits",
    "hyperparameters_recorded": "training: hyperparameters recorded",
    "log_complete": "training: log complete",
    "checkpoint_with_optimizer": "training: checkpoint with optimizer state",
    "test_metrics": "evaluation: metrics on the fixed test split",
    "selection_on_validation": "evaluation: best.pt, early stopping and sweep choices on validation only (test: final report)",
    "bad_cases": "evaluation: bad cases recorded",
    "beats_baseline": "evaluation: beats the baseline",
    "export_parity": "export: parity verified",
    "code_version": "archive: code version recorded",
    "run_verifies": "archive: data, config, logs and model present and verified",
    "provenance_signed": "archive: signed provenance statement (in-toto, SLSA v1)",
    "results_amended": "archive: results sealed with the run, or amended by the run's signer",
    "auditable": "audit: auditable segments",
    "results_from_trajectory": "audit: metrics and export from the audited training",
}
TRAINING_ROWS = ("smoke_passed", "log_complete", "checkpoint_with_optimizer", "test_metrics", "selection_on_validation", "bad_cases",
                 "beats_baseline", "export_parity")
PASSING = ("pass", "waived", "n/a")


def check_run(run_dir: Path, state_dir: Path, verified: Optional[dict[str, Any]] = None,
              unverified: Optional[str] = None, policy: Optional[Policy] = None) -> dict[str, Any]:
    """{"ok", "run", "items": [{"id", "item", "status", "detail", "fix"}]}; `ok` when every row passes,
    is waived or does not apply. The rows that judge trust (run_verifies, provenance_signed, auditable, beats_baseline,
    results_from_trajectory) render the run's assessment (veritrain.trust.assessment), the same facts verify and audit
    act on. `verified`: the run's verify result under `policy`, when the caller has it (each file of the run is then
    hashed once); else it is computed here and kept like the CLI's. `unverified`: why the caller has no fresh verdict
    and wants none computed (the run page): the `run_verifies` row is then `unknown`, saying so."""

    run = run_dir.name
    try:
        record = read_record(run_dir)
    except RunFailed as err:  # nothing else can be checked without the record
        return {"ok": False, "run": run, "items": [{"id": "run_verifies", "item": "archive: record.json readable", "status": "fail",
                                                    "detail": str(err), "fix": f"veritrain verify {run}"}]}
    artifacts = record.get("artifacts") or {}
    data = record.get("data") or {}
    kind = record.get("kind") or "run"
    status = record.get("status")
    new_run = new_run_fix(run_dir, record)
    rows: dict[str, tuple[str, Optional[str], str]] = {}  # id → (status, fix, detail); fix None: nothing to run

    version_dir = state_dir / "data" / str(data.get("version"))
    try:
        info = json.loads((version_dir / "version.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing or damaged: reported by the rows below and by verify
        info = None
    info = info if isinstance(info, dict) else None
    config = config_path(run_dir)
    prepare = f"veritrain data prepare {config}" if data.get("version") else new_run
    rows["data_versioned"] = ("pass" if data.get("version") and info else "missing", prepare,
                              f"version {str(data.get('version'))[:12]}, {data.get('quarantined', 0)} quarantined")
    leakage = data.get("leakage_pairs")
    rows["no_leakage"] = ("missing" if leakage is None else ("pass" if leakage == 0 else "fail"), new_run,
                          f"{leakage} cross-split duplicate pairs")
    achieved = (data.get("summary") or {}).get("achieved_split")
    # recipe 4 on: a group mixing data.test_from's former test and train/val samples fails the row like a skew
    skewed = ((achieved or {}).get("skewed") or []) + (((achieved or {}).get("test_from") or {}).get("leaks") or [])
    rows["achieved_split"] = (
        "missing" if achieved is None else ("fail" if skewed else "pass"),
        new_run if achieved is None else f"fix the data or its groups (see `veritrain data report {run}`), then start a new run: {new_run}",
        "not checked: prepared by an earlier data recipe" if achieved is None
        else (skewed[0] if skewed else "every class within data.split_tolerance" if achieved.get("judged") else "fixed or time-ordered split"))
    if (info or {}).get("kind") == "text":  # no statistics: what is fit to the data is the tokenizer
        tokenizer = (info or {}).get("tokenizer") or {}
        rows["normalization_from_train"] = ("n/a", None, "a text data version has no normalization statistics; its tokenizer is "
                                            + ("byte-level (fit to nothing)" if tokenizer.get("kind") == "byte_level"
                                               else "trained on the train split only, after decontamination"))
    else:
        on_train = (info or {}).get("normalization", {}).get("computed_on") == "train"
        rows["normalization_from_train"] = ("pass" if on_train else "missing", prepare, "")

    rows["packages_locked"] = ("pass" if "env/requirements.lock" in artifacts else "missing", new_run, "")
    rows["smoke_passed"] = _smoke_row(run, record, state_dir, config)
    baselines = record.get("baselines")
    rows["baseline_present"] = ("pass" if baselines else "missing", f"veritrain baseline {run}", "")
    rows["hyperparameters_recorded"] = ("pass" if record.get("config") and "config.yaml" in artifacts else "missing", new_run, "")

    training = record.get("training") or {}
    has_checkpoint = any(p.startswith("checkpoints/") and p.endswith(".pt") for p in artifacts)
    train_fix = _training_fix(run, record, new_run)
    detail = f"status {status}, {training.get('epochs', 0)} epochs" + (f": {record['error'].get('message')}" if record.get("error") else "")
    if status == "pruned":  # ended on purpose by its search: its log is whole, and its fix is a new run of its config
        detail = f"pruned by search {(record.get('pruned') or {}).get('search')} after epoch {(record.get('pruned') or {}).get('epoch')}"
    rows["log_complete"] = ("pass" if "train.log" in artifacts and status in ("completed", "pruned") else ("fail" if status in ("failed", "interrupted") else "missing"),
                            train_fix, detail)
    rows["checkpoint_with_optimizer"] = ("pass" if has_checkpoint and _has_optimizer(run_dir, artifacts) else "missing",
                                         train_fix if status != "completed" else new_run, "")
    failed = status == "failed"  # its fix is a new run: evaluating or exporting it would not complete it
    eval_fix = f"veritrain eval {run} --split test" if has_checkpoint and not failed else train_fix
    metrics = (record.get("metrics") or {}).get("test")
    rows["test_metrics"] = ("pass" if metrics and metrics.get("data_version") in (None, data.get("version")) else "missing", eval_fix, "")
    rows["selection_on_validation"] = _selection_row(record, new_run)
    rows["bad_cases"] = _bad_cases_row(record, artifacts, eval_fix)
    rows["beats_baseline"] = _baseline_row(run, baseline_of(record), failed, eval_fix)
    parity = (record.get("export") or {}).get("parity")
    rows["export_parity"] = (
        "missing" if not parity else ("pass" if parity.get("passed") else "fail"),
        (f"veritrain export {run}" if has_checkpoint and not failed else train_fix) if not parity
        else f"see runs/{run}/export/parity.json; fix the model in a new run, or say why: veritrain runs note {run} --waive export_parity \"...\"",
        "" if not parity else f"{parity.get('samples')} samples, {', '.join(parity.get('formats', {}))}")

    code = record.get("code") or {}
    rows["code_version"] = ("pass" if code.get("veritrain") else "missing", new_run,
                            f"veritrain {code.get('veritrain')}, git {str(code.get('git_commit') or 'not in git')[:12]}")
    rows.update(_trust_rows(run_dir, record, state_dir, verified, unverified, policy or Policy(), rows["selection_on_validation"], new_run))

    if failed:  # a new run that addresses the cause is the fix for every row the failure left open
        for row in ("smoke_passed", "baseline_present"):
            state, _, detail = rows[row]
            rows[row] = (state, train_fix, detail)
    if kind == "baseline":  # a baseline run trains nothing: its training rows do not apply
        for row in TRAINING_ROWS:
            rows[row] = ("n/a", None, "baseline run: no model is trained")
    if kind == "script":
        _script_rows(run_dir, record, rows)
    waived = {n.get("waive"): n.get("text") for n in read_notes(run_dir) if isinstance(n.get("waive"), str)}
    items = []
    for row, (state, fix, detail) in rows.items():
        if state in ("fail", "missing") and row in waived:
            state, detail = "waived", f"waived: {waived[row]}" + (f" ({detail})" if detail else "")
        items.append({"id": row, "item": ROWS[row], "status": state, "detail": detail, "fix": None if state in PASSING else fix})
    return {"ok": all(i["status"] in PASSING for i in items), "run": run, "items": items}


SCRIPT_NOT_APPLICABLE = {
    "no_leakage": "its data are the script's own inputs, bound by content, not a veritrain data version with splits",
    "achieved_split": "its data are the script's own inputs: veritrain made no split",
    "normalization_from_train": "the script computes its own normalization, which veritrain does not see",
    "smoke_passed": "veritrain's smoke test runs its own loop, not a script",
    "baseline_present": "veritrain's baselines need a veritrain data version",
    "test_metrics": "its evaluation is the script's own (metrics.final), on splits veritrain did not make",
    "selection_on_validation": "veritrain selected nothing; what the script selects, and on which split, is its own",
    "bad_cases": "its evaluation is the script's own",
    "beats_baseline": "veritrain's baselines need a veritrain data version",
    "export_parity": "`veritrain export` builds veritrain's models, not a script's",
}


def _script_rows(run_dir: Path, record: dict[str, Any], rows: dict[str, tuple[str, Optional[str], str]]) -> None:
    """The rows of a script's run (veritrain.start): those that do not apply say n/a and why; the data row is its inputs.
    (Its audit row is the assessment's, which reads its guarantee level, docs/api.md.)"""
    for row, why in SCRIPT_NOT_APPLICABLE.items():
        rows[row] = ("n/a", None, f"a script's run: {why}")
    run = run_dir.name
    inputs = record.get("inputs") or {}
    rows["data_versioned"] = (("pass", None, f"{inputs.get('files')} input file(s) bound by content (manifest {str(inputs.get('manifest_sha256'))[:12]})")
                              if inputs else ("missing", "give veritrain.start inputs=[...] (the files it trains on) in a new run", "no inputs were bound"))
    rows["hyperparameters_recorded"] = ("pass" if isinstance(record.get("config"), dict) else "missing", "run the script again", "the config given to veritrain.start")
    script = record.get("script") or {}
    if rows["code_version"][0] == "pass":
        rows["code_version"] = (("pass", None, rows["code_version"][2] + f"; script {script.get('file')}") if script.get("file")
                                else ("missing", "run the script from a file (not stdin, -c or a notebook)", "the script could not be recorded"))
    if status_fix := {"interrupted": f"veritrain train --resume {run}", "running": f"veritrain train --resume {run}"}.get(str(record.get("status"))):
        state, _, detail = rows["log_complete"]
        rows["log_complete"] = (state, status_fix, detail)
    files = [str(e["file"]) for e in record.get("trajectory") or [] if e.get("file") and e.get("kept")]
    if files and rows["checkpoint_with_optimizer"][0] != "pass":  # a framework's own checkpoint files
        rows["checkpoint_with_optimizer"] = ("pass" if _has_optimizer(run_dir, record.get("artifacts") or {}, files[-1:]) else "missing",
                                             "save the optimizer with the framework's checkpoints", "")


def _training_fix(run: str, record: dict[str, Any], new_run: str) -> str:
    """How to get a complete training: resume an interrupted run; for a failed one, a new run that addresses
    the recorded cause (a lower learning rate after non-finite values), since a resume fails the same way."""
    status = record.get("status")
    if status in ("interrupted", "running"):
        return f"veritrain train --resume {run}"
    if status != "failed":
        return new_run
    nonfinite = any(e.get("kind") == "nonfinite_stop" for e in record.get("events") or ()) or "non-finite" in str((record.get("error") or {}).get("message"))
    lr = ((record.get("config") or {}).get("optim") or {}).get("lr")
    if nonfinite and isinstance(lr, (int, float)):
        return f"{new_run} --set optim.lr={lr / 10:g}"
    return f"fix the cause ({str((record.get('error') or {}).get('message'))[:120]}), then start a new run: {new_run}"


def _trust_rows(run_dir: Path, record: dict[str, Any], state_dir: Path, verified: Optional[dict[str, Any]], unverified: Optional[str],
                policy: Policy, selection: tuple[str, Optional[str], str], new_run: str) -> dict[str, tuple[str, Optional[str], str]]:
    """The rows that render the run's assessment: run_verifies, provenance_signed, auditable, results_from_trajectory, and
    selection_on_validation where the record's format requires what it lacks."""

    run = run_dir.name
    rows: dict[str, tuple[str, Optional[str], str]] = {"selection_on_validation": selection}
    if verified is None and unverified is not None:
        rows["run_verifies"] = ("unknown", f"veritrain verify {run}", unverified)
        replay = replayability(run_dir, record, state_dir)
    else:
        facts = assess(run_dir, state_dir, policy, verified=verified)
        verified, replay = facts.verified, facts.replay
        rows["run_verifies"] = ("pass" if verified["ok"] else "fail",
                                f"restore what changed (`veritrain verify {run}` lists it), or import the run's archive again",
                                "; ".join(f"{p['kind']} {p['path']}" for p in verified["problems"][:3]))
        if verified.get("interrupted_amend"):  # its files may be half switched: the journal finishes or rolls them back
            rows["run_verifies"] = ("fail", f"veritrain gc (it completes or rolls back the amend), or veritrain gc --drop-journal {run}",
                                    verified["interrupted_amend"])
    rows["provenance_signed"] = _provenance_row(run, record, verified, policy)
    rows["results_amended"] = _amended_row(run, record, verified)
    rows["auditable"] = _auditable_row(replay)
    effective = ((verified or {}).get("format") or {}).get("effective", formats.declared(record))
    rows["results_from_trajectory"] = _results_row(run, record, effective)
    if effective >= 1 and rows["selection_on_validation"][2].startswith("not checked"):  # the format requires it: absent is a problem
        rows["selection_on_validation"] = ("fail", new_run, f"the record is format {effective}, which says what selected what; its `selection` is missing")
    return rows


def _baseline_row(run: str, judged: Judgement, failed: bool, eval_fix: str) -> tuple[str, Optional[str], str]:
    """The assessment's judgement of the test result against the baselines (veritrain.core.baselines), as a row."""
    waive = f"improve the model in a new run, or say why it need not: veritrain runs note {run} --waive beats_baseline \"...\""
    if judged.status == "missing":
        return ("missing", f"veritrain baseline {run}" if judged.detail == "no baselines" and not failed else eval_fix, judged.detail)
    if judged.status == "unknown":
        return ("missing", waive, f"not judged: {judged.detail}")
    return ("pass" if judged.status == "beats" else "fail", waive, judged.detail)


def _provenance_row(run: str, record: dict[str, Any], verified: Optional[dict[str, Any]], policy: Policy) -> tuple[str, Optional[str], str]:
    """Who signed the run, as verify found it. With a signature required (--public-key, --trusted-keys,
    --require-signature) the row passes only for a signature checked by a required key; without, it passes for a signature
    checked with a key known here and is n/a otherwise, naming the signer (a key substituted by a forger is named, never
    passed silently)."""
    sign = f"; its seal stays unsigned: to sign what comes next, veritrain keys init (amendments such as veritrain export {run} are then signed)"
    found = (verified or {}).get("signer")
    if found is None:  # no fresh verdict (the run page): what the record says, unchecked
        fingerprint = (record.get("provenance") or {}).get("key_fingerprint")
        return ("n/a", None, f"signed by key {fingerprint[:16]}… (not checked: no fresh verdict)" if fingerprint else "not signed, as the record says")
    signer = Signer(**found)
    problems = [p for p in (verified or {}).get("problems") or [] if p["kind"] in ("signature_required", "provenance_signature")]
    if policy.signature_required:
        if signer.checked and not problems:
            return ("pass", None, signer.line().removeprefix("signer: "))
        why = problems[0]["detail"] if problems else signer.line().removeprefix("signer: ")
        return ("fail", f"get the run from whoever holds {policy.required_signer()}, or check it without requiring that key", why)
    if signer.status == "no_statement":
        return ("n/a", None, "no provenance: the record names no statement (made before veritrain wrote them)" + sign)
    if signer.status == "unsigned":
        return ("n/a", None, "unsigned: no signing key was set when the run was sealed; its statement binds the digests, but only a "
                "signature lets others check it without trusting whoever holds the files" + sign)
    if signer.checked and not problems:
        return ("pass", None, signer.line().removeprefix("signer: "))
    return ("n/a", None, signer.line().removeprefix("signer: ") + "; no key is required: give --public-key or --trusted-keys to require one")


def amendment_rows(record: Any, verified: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """The run's amendments as verify lists them (`verified["amendments"]`), or as the record reads them when there is no
    verdict (signers then unchecked): index, command, seal, signer and the results each gives."""
    if verified is not None and verified.get("amendments") is not None:
        return list(verified["amendments"])
    results: dict[int, list[str]] = {}
    for name, link in (record.applied.sources.items() if getattr(record, "applied", None) is not None else ()):
        results.setdefault(link.index, []).append(name)
    return [{"index": link.index, "by": link.by, "at": link.at, "seal": link.seal, "covered": True,
             "signer": {"status": "signed" if link.signer else "unsigned", "fingerprint": link.signer, "checked": False},
             "results": sorted(results.get(link.index, []))} for link in getattr(record, "amendments", ())]


def signed_by(signer: dict[str, Any]) -> str:
    """Who signed an amendment, in a few words."""
    if not signer.get("fingerprint"):
        return "unsigned"
    return f"signed by {signer.get('name') or 'key ' + str(signer['fingerprint'])[:16] + '…'}" + ("" if signer.get("checked") else ", not checked")


def _amended_row(run: str, record: Any, verified: Optional[dict[str, Any]]) -> tuple[str, Optional[str], str]:
    """Which results come from amendments rather than the run's own seal, and who signed each: the row fails when the run
    is signed and an amendment that gives a result is not signed by the run's key (threat: someone else appends an
    amendment with better numbers; the run's own seal never covered them)."""
    rows = amendment_rows(record, verified)
    giving = [row for row in rows if row["results"]]
    if not giving:
        return "pass", None, "every result is covered by the run's own seal" + (f"; {len(rows)} amendment(s) give no result" if rows else "")
    parts = [f"{', '.join(row['results'])} from amendment {row['index']:04d} ({row['by']}, {signed_by(row['signer'])})" for row in giving]
    own = str((record.get("provenance") or {}).get("key_fingerprint") or "")
    foreign = [row for row in giving if own and row["signer"].get("fingerprint") != own]
    if foreign:
        return ("fail", f"`veritrain verify {run} --expect SEAL` with the run's own seal says what it vouches for; eval or export the run again with its key",
                "; ".join(parts) + f": not signed by the run's key {own[:16]}…")
    return "pass", None, "; ".join(parts)


def _smoke_row(run: str, record: dict[str, Any], state_dir: Path, config: str) -> tuple[str, str, str]:
    """Passed when the run relied on a passing smoke test, or one has passed since for the same config
    hash, data version and code (`veritrain smoke runs/<run>/config.yaml` files it under that key)."""

    smoke = record.get("smoke") or {}
    fix = f"veritrain smoke {config}"
    if smoke.get("status") == "completed":
        return "pass", fix, "passed before the run"
    version, config_hash = (record.get("data") or {}).get("version"), record.get("config_hash")
    if version and config_hash:
        key = smoke_key(config_hash, version, record.get("code") or {})
        if passed_before(state_dir, key):
            # a workspace file, which a forger of the workspace could write: said, since check does not run it again
            return "pass", fix, f"passed after the run, as .veritrain/smoke/{key[:12]} says (a workspace file, not run again: `{fix}` runs it)"
    return "missing", fix, f"smoke {smoke.get('status', 'not run')}"


def _auditable_row(facts: Replayability) -> tuple[str, Optional[str], str]:
    """The assessment's replayability as a row: `veritrain audit` starts exactly when it passes."""
    status = {"auditable": "pass", "n/a": "n/a", "broken": "fail"}.get(facts.status, "missing")
    return status, facts.fix, facts.reason


def _results_row(run: str, record: dict[str, Any], effective_format: int) -> tuple[str, Optional[str], str]:
    """Whether every metric set and export names the trajectory entry it came from (verify checks that it holds). A run of
    an outside checkpoint (kind eval or export) fails: its results are not from the audited training."""
    outside = record.get("input_checkpoint")
    if outside or record.get("kind") in ("eval", "export"):
        parent = record.get("parent") or "the parent run"
        if any(event.get("kind") == "not_selected" for event in record.get("events") or []):
            return "fail", f"veritrain eval {parent}", \
                f"not the selected model: {(outside or {}).get('source', 'its checkpoint')} is a checkpoint of {parent} that validation did not select, evaluated on test"
        if any(event.get("kind") == "current_code" for event in record.get("events") or []):
            return "fail", f"veritrain {record.get('kind') or 'eval'} {parent}", \
                f"not from the recorded code: {parent}'s checkpoint was built with the code current when this run was made"
        return "fail", f"veritrain {record.get('kind') or 'eval'} {parent}", \
            f"not from the audited training: {(outside or {}).get('file', 'its checkpoint')} came from {(outside or {}).get('source', 'outside')}, not from the trajectory of {parent}"
    if record.get("kind") == "baseline":
        return "n/a", None, "baseline run: no model is trained"
    results = [(f"metrics.{split}", m) for split, m in (record.get("metrics") or {}).items() if isinstance(m, dict)]
    if (record.get("export") or {}).get("files"):
        results.append(("export", record["export"]))
    if not results:
        return "n/a", None, "no metrics or export yet"
    unbound = [what for what, r in results if not r.get("trajectory_entry")]
    if effective_format >= 1 and (unbound or not record.get("trajectory")):  # the format requires them: absence is a problem
        what = ", ".join(unbound) if record.get("trajectory") else "the trajectory"
        return "fail", f"veritrain verify {run}", f"the record is format {effective_format}, which binds every result to its trajectory entry; {what} lacks it"
    if not record.get("trajectory"):
        return "n/a", None, "not checked: the run has no trajectory (made before veritrain kept one)"
    if unbound:
        return "n/a", None, f"not checked: {', '.join(unbound)} name no trajectory entry (made by an earlier veritrain)"

    done, not_done = rederivation(record)
    return "pass", None, "; ".join(f"{what} from entry {r['trajectory_entry']['index']} (step {r['trajectory_entry']['step']})" for what, r in results) \
        + (f"; an audit re-derives {', '.join(done)}" if done else "") + (f"; not re-derived: {', '.join(not_done)}" if not_done else "")


def _bad_cases_row(record: Mapping[str, Any], artifacts: Any, eval_fix: str) -> tuple[str, Optional[str], str]:
    """Whether the test evaluation wrote its worst-scored samples, to the file the run's task declares (TaskSpec.bad_cases)."""

    spec = spec_of_record({"config": record.get("config")}) or spec_of_record(dict(record))
    if spec is None or spec.bad_cases is None:
        return ("n/a", None, f"the task {record.get('task')} declares no file of bad cases")
    return ("pass" if f"eval/test/{spec.bad_cases}" in set(artifacts) else "missing", eval_fix, "")


def _selection_row(record: dict[str, Any], new_run: str) -> tuple[str, Optional[str], str]:
    """Whether everything that selected (best.pt, early stopping, the sweep's choice of its best trial) read the val
    split only, as the record's `selection` says, and training picked best.pt by the metric it names. n/a for a run
    that trains nothing and for one made before records said it."""

    if "train" not in (record.get("stages") or ()):
        return "n/a", None, "trains nothing: nothing is selected"
    if "selection" not in record:
        return "n/a", None, "not checked: the record does not say what selected what (made by an earlier veritrain)"
    picked = record.get("selection") or {}
    chosen = selected_on(picked)
    if not chosen:
        history, broken = test_history(record)
        if broken is not None:
            return "fail", new_run, f"{broken} ({'; '.join(history) or 'the run evaluated test itself'})"
        return "pass", None, "nothing selected: the last checkpoint is evaluated"
    fix = f"{new_run} --set checkpoint.best_metric=null --set checkpoint.best_mode=null"  # null: the task's val metric
    elsewhere = [f"{what} on {metric} ({split or 'no'} split)" for what, split, metric in chosen if split != SELECTION_SPLIT]
    if elsewhere:
        return "fail", fix, f"not on validation: {'; '.join(elsewhere)}"
    history, broken = test_history(record)
    if broken is not None:
        return "fail", new_run, f"{broken} ({'; '.join(history) or 'the run evaluated test itself'})"
    trained_on = ((record.get("training") or {}).get("best_metric") or {}).get("name")
    recorded = (picked.get("best_checkpoint") or {}).get("metric")
    if recorded and trained_on and trained_on != recorded:
        return "fail", fix, f"training picked best.pt on {trained_on}, the record's selection says {recorded}"
    return "pass", None, "; ".join(f"{what} on {split} {metric}" for what, split, metric in chosen) + "; test: final report only"


def _has_optimizer(run_dir: Path, artifacts: dict[str, Any], names: tuple[str, ...] | list[str] = ("checkpoints/last.pt", "checkpoints/best.pt")) -> bool:
    """Whether a checkpoint holds optimizer state (read from its zip index, without unpickling); a framework's checkpoint
    folder (a Hugging Face Trainer's checkpoint-N/) holds it as a file of its own (optimizer.pt)."""
    for name in names:
        inside = [rel for rel in artifacts if rel.startswith(name.rstrip("/") + "/")]
        if inside:  # a folder
            return any(rel.rsplit("/", 1)[-1].startswith("optimizer.") for rel in inside)
        if name in artifacts:
            try:
                with zipfile.ZipFile(run_dir / name) as archive:
                    pickled = next(n for n in archive.namelist() if n.endswith("data.pkl"))
                    return b"optimizer" in archive.read(pickled)
            except (OSError, zipfile.BadZipFile, StopIteration):
                return False
    return False


def fix_commands(result: dict[str, Any]) -> list[list[str]]:
    """The fixes of a check that are commands (argv lists), in row order, without repeats."""
    seen, commands = set(), []
    for item in result["items"]:
        fix = item.get("fix") or ""
        if fix.startswith("veritrain ") and fix not in seen:
            seen.add(fix)
            commands.append(shlex.split(fix))
    return commands
