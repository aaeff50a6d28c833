"""Verify a run: re-hash every file against its sealed record, check the seal, and check that the
recorded data version still resolves and matches.

Threat model: the seal (`record.sha256`, the SHA-256 of `record.json`'s exact bytes) catches
accidents and naive edits — a changed byte, a missing or added file, an edited record. Someone who
rewrites the files, the record *and* the seal can only be caught against a seal kept elsewhere: the
seal is printed at the end of every run so it can be published, and `verify --expect SEAL` checks
against it.

    veritrain verify latest --expect 63a6a0c8…
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import tempfile
import threading
import uuid
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

from veritrain.core import selection
from veritrain.core.errors import RunFailed
from veritrain.core.hashing import sha256_file, state_dict_sha256
from veritrain.core.task_registry import spec_of_record
from veritrain.core.user_dirs import cache_dir
from veritrain.core.version import __version__
from veritrain.data import prepare
from veritrain.data.identity import TEXT_RECIPE, data_version_problems
from veritrain.data.prepare import FORMAT_VERSION, carried_test_from, stored_recipe
from veritrain.records import amendments, verdicts
from veritrain.records.journal import JOURNAL_DIR, folder_of
from veritrain.records.record import (
    OMITTED_FILE,
    PROVENANCE_FILE,
    RECORD_FILE,
    SEAL_FILE,
    UNSEALED,
    now_iso,
    package_list,
    read_record,
    record_problem,
)
from veritrain.train import trajectory as trajectory_module
from veritrain.train.trajectory import audit_only_checkpoints, unbound_weights
from veritrain.trust import formats, provenance_check
from veritrain.trust.policy import Policy
from veritrain.userloop import inputs
from veritrain.userloop.frameworks import file_hashes

Progress = Callable[[str, int, int], None]  # (stage, done, total): "files", "states", "data version", "raw data"
log = logging.getLogger("veritrain")


def verify_run(run_dir: Path, state_dir: Path, policy: Optional[Policy] = None, rehash_data: bool = True, check_data: bool = True,
               check_states: bool = True, progress: Optional[Progress] = None, state_cache: Optional[Path] = None) -> dict[str, Any]:
    """{"ok", "seal", "problems": [{"path", "kind", "detail"}], "drift": [{"what", "recorded", "now"}], "raw_data",
    "not_checked", "format", "signer"}: the run's files, seal, trajectory, results, data version and provenance,
    judged under `policy` (the published seal, the keys required or trusted, the oldest format accepted; default:
    none). `check_data` False leaves the data version out (for callers that open it next, which checks it);
    `check_states` False skips loading the checkpoints to match them with the trajectory (their bytes
    are checked either way). `progress` is told each stage as it goes (the run browser shows it). While an amend of
    the run is unfinished (veritrain.records.journal) the run does not verify: its files are half switched, and the
    journal that would finish them is a workspace file, which nothing here takes on trust ("interrupted_amend" says so).
    `state_cache`: a folder outside the workspace where the state hashes of checkpoints (and the weights hash of an
    export) are kept by the SHA-256 of the file's bytes (`state_cache_dir()`); None loads every file. Nothing is
    written in the workspace."""

    policy = policy or Policy()
    expect, strict = (policy.expect.strip().lower() if policy.expect else None), policy.strict
    report: Progress = progress or (lambda stage, done, total: None)
    problems: list[dict[str, Any]] = []
    drift: list[dict[str, Any]] = []

    def problem(path: str, kind: str, detail: str = "") -> None:
        problems.append({"path": path, "kind": kind, "detail": detail})

    listing = {path.relative_to(run_dir).as_posix(): path for path in sorted(run_dir.rglob("*"))}
    note = pending_amend(run_dir, state_dir)
    if note is not None:  # threat: a hand-written plan that would make verify judge the files in old/ instead
        problem(f".veritrain/{JOURNAL_DIR}/{run_dir.name}", "amend_pending", note)
    try:
        record_bytes = (run_dir / RECORD_FILE).read_bytes()
    except OSError:
        problem(RECORD_FILE, "missing", "no record.json: not a run, or it was deleted")
        return {"ok": False, "seal": None, "problems": problems, "drift": drift, "interrupted_amend": note}
    seal = hashlib.sha256(record_bytes).hexdigest()
    try:
        stored_seal = (run_dir / SEAL_FILE).read_text().strip()
        if stored_seal != seal:
            problem(RECORD_FILE, "seal_mismatch", f"record.json hashes to {seal[:16]}…, record.sha256 says {stored_seal[:16]}…")
    except OSError:
        problem(SEAL_FILE, "missing", "the seal is missing")
    try:
        record = json.loads(record_bytes)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except ValueError as err:  # JSON or UTF-8
        record = None
        problem(RECORD_FILE, "unreadable", str(err))
    if record is None:
        if expect is not None and expect != seal:
            problem(RECORD_FILE, "seal_differs_from_expected", f"record.json hashes to {seal}, expected {expect}")
        return {"ok": False, "seal": seal, "problems": problems, "drift": drift, "interrupted_amend": note}

    malformed = record_problem(record, None)
    if malformed is not None:  # nothing below may trust its fields (a data version that is a path, say)
        problem(RECORD_FILE, "unreadable", malformed)
        return {"ok": False, "seal": seal, "problems": problems, "drift": drift, "interrupted_amend": note}
    base = record
    layout = _layout(run_dir, base, seal)
    problems.extend(layout.chain.problems)  # threat: an amendment forged, reordered, cut from its chain or written on another seal
    record = layout.applied.fields
    if layout.chain.links and (amended := record_problem(record, None)) is not None:
        problem(amendments.AMENDMENTS_DIR, "amendment_chain", f"the run as amended is not a valid record ({amended})")
        return {"ok": False, "seal": layout.chain.newest, "problems": problems, "drift": drift, "interrupted_amend": note}
    covered = _expected_seal(layout.chain, base, expect, problem)
    omitted = omitted_for_audit(run_dir, record)
    intact, present = _file_problems(run_dir, layout, listing, omitted, report, problem)
    not_checked: list[dict[str, str]] = []  # checks whose fields the record does not carry (older runs), and why
    digests = {rel: str(record["artifacts"][rel].get("sha256")) for rel in intact}  # each intact file's bytes hash so, just checked
    checkpoint_formats: dict[str, Optional[int]] = {}  # each checkpoint's record_format, read with its state
    problems.extend(_trajectory_problems(record, intact, check_states, report, present, omitted, not_checked,
                                         _StateCache(state_cache, digests), checkpoint_formats))

    problems.extend(_best_validation_problems(record, intact))
    problems.extend(unbound_weights(record, present))
    fmt = formats.facts(record, checkpoint_formats, policy.min_format)
    problems.extend(formats.problems(record, fmt))

    data = record.get("data") or {}
    checked: list[str] = []  # how the raw data was checked, in a line
    if data.get("version") and check_data:
        problems.extend(_check_data_version(record, state_dir, rehash_data, drift, report, checked, not_checked))
    if record.get("inputs") and check_data:
        problems.extend(_check_inputs(run_dir, record, intact, report, checked))
    base_listing = {rel: path for rel, path in listing.items() if not rel.startswith(amendments.AMENDMENTS_DIR + "/")}
    found, signer = provenance_check.problems(base_listing, base, seal, state_dir, policy, not_checked)
    problems.extend(found)
    chain = _chain_rows(layout, policy, covered, not_checked, problem)
    if fmt.effective == 0:  # what a format-0 record leaves unchecked, said rather than implied
        not_checked.extend({"check": what, "reason": "the record is judged under format 0 (made before records named their format); "
                                                     "require more with --min-format, a signature or --expect"} for what in fmt.unchecked)
    drift.extend(_environment_drift(record))
    fatal = problems + ([{"path": d["what"], "kind": "drift"} for d in drift] if strict else [])
    return {"ok": not fatal, "seal": layout.chain.newest, "base_seal": seal, "amendments": chain, "problems": problems, "drift": drift,
            "strict": strict, "not_checked": not_checked, "interrupted_amend": note, "raw_data": checked[0] if checked else None,
            "format": fmt.as_dict(), "signer": signer.as_dict()}


@dataclass(frozen=True)
class _Layout:
    """The run's files as its record and amendments lay them out: `expected` maps each file's path in the run folder to
    (its sealed entry, its name in the run); `unsealed` are the statements beside the seals (record.sha256, an
    amendment's amendment.json, ...), which no table lists."""

    chain: amendments.Chain
    applied: amendments.Applied
    expected: dict[str, tuple[dict[str, Any], str]]
    unsealed: frozenset[str]


def _layout(run_dir: Path, base: dict[str, Any], seal: str) -> _Layout:
    chain = amendments.read_chain(run_dir, seal, str(base["run_id"]))
    applied = amendments.apply(base, run_dir, chain.links)
    expected = {rel: (entry, rel) for rel, entry in (base.get("artifacts") or {}).items()}
    unsealed = set(UNSEALED)
    for link in chain.links:
        prefix = f"{amendments.AMENDMENTS_DIR}/{amendments.folder_name(link.index)}/"
        unsealed |= {prefix + amendments.AMENDMENT_FILE, prefix + amendments.AMENDMENT_SEAL, prefix + PROVENANCE_FILE}
        expected.update({f"{prefix}{amendments.FILES_DIR}/{rel}": (entry, rel) for rel, entry in link.doc["files"].items()})
    return _Layout(chain, applied, expected, frozenset(unsealed))


def _file_problems(run_dir: Path, layout: _Layout, listing: dict[str, Path], omitted: set[str], report: Progress,
                   problem: Callable[[str, str, str], None]) -> tuple[dict[str, Path], set[str]]:
    """Every file of the run folder against the tables that seal it (the record's and each amendment's): (the run's
    files found intact, by their name in the run; the names of those present). A file of the record that an
    amendment retired may be absent (gc removed it); an amendment's own files never."""
    present: dict[str, Path] = {}
    for rel, path in sorted(listing.items()):
        if path.is_symlink():
            problem(rel, "link", "a run directory holds only regular files")
        elif not path.is_file() and not path.is_dir():  # a FIFO, socket or device: a reader of it could hang
            problem(rel, "special", "a run directory holds only regular files; remove it")
        elif path.is_file() and rel not in layout.unsealed:
            present[rel] = path
    bad: set[str] = set()
    for done, (rel, (entry, name)) in enumerate(layout.expected.items()):
        report("files", done, len(layout.expected))
        path = present.get(rel)
        if path is None and (rel in omitted or (rel == name and name in layout.applied.retired)):
            continue  # left out of an archive on purpose (audit cannot start there), or retired by an amendment
        if path is None:
            problem(rel, "missing", "")
            bad.add(rel)
        elif path.stat().st_size != entry.get("size") or (digest := sha256_file(path)) != entry.get("sha256"):
            shown = "size differs" if path.stat().st_size != entry.get("size") else f"sha256 {digest[:16]}…"
            problem(rel, "changed", f"{shown}, recorded {str(entry.get('sha256'))[:16]}…")
            bad.add(rel)
    for rel in sorted(set(present) - set(layout.expected)):
        where = "not listed in record.json" if not rel.startswith(amendments.AMENDMENTS_DIR + "/") else "not listed in any amendment"
        problem(rel, "added", where)
    report("files", len(layout.expected), len(layout.expected))
    intact, names = {}, set()
    for name, path in layout.applied.files.items():
        rel = path.relative_to(run_dir).as_posix()
        if rel in present:
            names.add(name)
            if rel not in bad:
                intact[name] = path
    return intact, names


def _expected_seal(chain: amendments.Chain, base: dict[str, Any], expect: Optional[str],
                   problem: Callable[[str, str, str], None]) -> int:
    """How many amendments the seal the user expects covers (all of them without --expect): the run's own seal covers
    none, an amendment's seal itself and those before it. A seal in no place of the chain is a problem."""
    if expect is None:
        return len(chain.links)
    seals = chain.seals()
    if expect in seals:
        return seals.index(expect)
    history = [h for h in base.get("seal_history") or [] if isinstance(h, dict) and h.get("seal") == expect]
    hint = f"; that seal was replaced when {history[-1].get('by')} re-sealed the run at {history[-1].get('replaced_at')}" if history else ""
    newest = f"; its newest seal (amendment {len(chain.links)}) is {chain.newest}" if chain.links else ""
    problem(RECORD_FILE, "seal_differs_from_expected", f"record.json hashes to {chain.base_seal}, expected {expect}{newest}{hint}")
    return len(chain.links)


def _chain_rows(layout: _Layout, policy: Policy, covered: int, not_checked: list[dict[str, str]],
                problem: Callable[[str, str, str], None]) -> list[dict[str, Any]]:
    """One row per amendment: its index, command, time, seal, signer, whether the seal the user expects covers it, and the
    results it gives. A covered amendment's statement is judged under `policy`; one written after that seal is listed
    with its signer, its signature checked when its key is known here, and no signature required of it."""

    relaxed = replace(policy, public_key=None, trusted=replace(policy.trusted, enforced=False), require_signature=False)
    results: dict[int, list[str]] = {}
    for name, link in layout.applied.sources.items():
        results.setdefault(link.index, []).append(name)
    rows = []
    for link in layout.chain.links:
        is_covered = link.index <= covered
        files = {rel: link.file(rel) for rel in link.doc["files"]}
        found, signer = provenance_check.amendment_problems(link, files, policy if is_covered else relaxed, not_checked)
        for row in found:
            problem(row["path"], row["kind"], row["detail"])
        rows.append({"index": link.index, "by": link.by, "at": link.at, "seal": link.seal, "covered": is_covered,
                     "signer": signer.as_dict(), "results": sorted(results.get(link.index, []))})
    return rows


def pending_amend(run_dir: Path, state_dir: Path) -> Optional[str]:
    """Why the run does not verify while a journal of an amend of it is in the workspace (its files may be half
    switched, and the journal that would finish them is not taken on trust), with the fix; None without one. Reads
    only whether the journal is there: never its plan."""

    if not os.path.lexists(folder_of(state_dir, run_dir.name)):
        return None
    return (f"an amend of this run is pending (.veritrain/{JOURNAL_DIR}/{run_dir.name}/): its files may be half switched; "
            f"finish or roll it back with `veritrain gc`, or remove the journal with `veritrain gc --drop-journal {run_dir.name}`, "
            "then verify again")


def quick_problems(run_dir: Path) -> list[dict[str, Any]]:
    """What a look at the run folder finds without hashing any file but record.json: a seal that does not match,
    a record that cannot be read, a listed file missing or of another size, an unlisted file, a link. Each is a
    problem `verify_run` reports too, so a page that shows them says what verify would (it finds more: a changed
    byte, the data version, the trajectory). [] when nothing is seen."""

    problems: list[dict[str, Any]] = []
    try:
        record_bytes = (run_dir / RECORD_FILE).read_bytes()
    except OSError:
        return [{"path": RECORD_FILE, "kind": "missing", "detail": "no record.json: not a run, or it was deleted"}]
    seal = hashlib.sha256(record_bytes).hexdigest()
    try:
        stored = (run_dir / SEAL_FILE).read_text().strip()
        if stored != seal:
            problems.append({"path": RECORD_FILE, "kind": "seal_mismatch", "detail": f"record.json hashes to {seal[:16]}…, record.sha256 says {stored[:16]}…"})
    except OSError:
        problems.append({"path": SEAL_FILE, "kind": "missing", "detail": "the seal is missing"})
    try:
        record = json.loads(record_bytes)
        malformed = record_problem(record, None) if isinstance(record, dict) else "not a JSON object"
    except (ValueError, RecursionError) as err:
        record, malformed = None, str(err)
    if malformed is not None or not isinstance(record, dict):
        return [*problems, {"path": RECORD_FILE, "kind": "unreadable", "detail": malformed}]
    layout = _layout(run_dir, record, seal)
    problems.extend(layout.chain.problems)
    omitted = omitted_for_audit(run_dir, layout.applied.fields)
    present = set()
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir).as_posix()
        if path.is_symlink():
            problems.append({"path": rel, "kind": "link", "detail": "a run directory holds only regular files"})
        elif not path.is_file() and not path.is_dir():
            problems.append({"path": rel, "kind": "special", "detail": "a run directory holds only regular files; remove it"})
        elif path.is_file() and rel not in layout.unsealed:
            present.add(rel)
            if rel not in layout.expected:
                problems.append({"path": rel, "kind": "added", "detail": "not listed in record.json or an amendment"})
            elif path.stat().st_size != layout.expected[rel][0].get("size"):
                problems.append({"path": rel, "kind": "changed", "detail": f"size differs, recorded {str(layout.expected[rel][0].get('sha256'))[:16]}…"})
    excused = set(omitted) | {rel for rel, (_, name) in layout.expected.items() if rel == name and name in layout.applied.retired}
    problems.extend({"path": rel, "kind": "missing", "detail": None} for rel in sorted(set(layout.expected) - present - excused))
    return problems


def verify_and_keep(run_dir: Path, state_dir: Path, policy: Optional[Policy] = None, progress: Optional[Progress] = None) -> dict[str, Any]:
    """`verify_run` as the CLI runs it (the state cache in the user's cache folder), its verdict then kept (never in
    the run) for the views that show it; the answer gains "verified_at". Keeping is best effort: a read-only
    or full workspace still gets its answer."""

    policy = policy or Policy()
    covered = verdicts.fingerprint(run_dir, state_dir)  # before: a file changed while verify runs makes the verdict stale
    result = verify_run(run_dir, state_dir, policy, progress=progress, state_cache=state_cache_dir())
    result["verified_at"] = now_iso()
    try:
        verdicts.store(run_dir, state_dir, result, covered, result["verified_at"], expect=policy.expect, strict=policy.strict)
    except OSError:
        pass
    return result


STATE_CACHE_VERSION = 3  # of what an entry holds (2: the checkpoint's record_format too; 3: its engine); part of every entry


def state_cache_dir() -> Path:
    """Where verify keeps what loading a checkpoint gave, by the SHA-256 of the file's bytes: the user's cache folder,
    never the workspace (threat: a planted entry giving a swapped checkpoint the honest state hash). Safe to delete."""

    return cache_dir() / "states"


class _StateCache:
    """What loading a checkpoint (or an export's weights) gave, kept by the SHA-256 of the file's bytes: a changed
    file has another hash, so it misses. Best effort: an unreadable or unwritable cache only costs the load."""

    def __init__(self, folder: Optional[Path], digests: dict[str, str]):
        self.folder, self.digests = folder, digests

    def get(self, rel: str) -> Optional[dict[str, Any]]:
        if self.folder is None or not re.fullmatch(r"[0-9a-f]{64}", self.digests.get(rel, "")):
            return None
        try:
            found = json.loads((self.folder / f"{self.digests[rel]}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

        # another veritrain may hash states another way: what it kept is computed again
        ok = isinstance(found, dict) and found.get("veritrain") == __version__ and found.get("cache_version") == STATE_CACHE_VERSION
        return found if ok else None

    def put(self, rel: str, value: dict[str, Any]) -> None:
        if self.folder is None or not re.fullmatch(r"[0-9a-f]{64}", self.digests.get(rel, "")):
            return

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".tmp-{uuid.uuid4().hex}"
            from veritrain.core.version import __version__

            tmp.write_text(json.dumps({**value, "veritrain": __version__, "cache_version": STATE_CACHE_VERSION}), encoding="utf-8")
            os.replace(tmp, self.folder / f"{self.digests[rel]}.json")
        except OSError:
            pass


def _check_inputs(run_dir: Path, record: dict[str, Any], intact: dict[str, Path], report: Progress, checked: list[str]) -> list[dict[str, Any]]:
    """A script's run (veritrain.userloop): every input file hashed again, against the manifest the run sealed."""

    section = record["inputs"]
    if section.get("file") not in intact:
        return [{"path": str(section.get("file")), "kind": "missing", "detail": "the inputs manifest the record names is not intact"}]
    try:
        manifest = inputs.read_manifest(run_dir)
    except RunFailed as err:
        return [{"path": inputs.FILE, "kind": "unreadable", "detail": str(err)}]
    if inputs.manifest_sha256(manifest) != section.get("manifest_sha256"):
        return [{"path": inputs.FILE, "kind": "changed", "detail": "its digest is not the manifest_sha256 the record binds"}]
    root = Path(str((record.get("script") or {}).get("cwd") or manifest.get("root")))
    report("inputs", 0, len(manifest["files"]))
    found = inputs.problems(manifest, root)
    report("inputs", len(manifest["files"]), len(manifest["files"]))
    if not found:
        checked.append(f"{len(manifest['files'])} input file(s), {manifest.get('bytes', 0)} bytes, hashed again under {root}")
    return found


def omitted_for_audit(run_dir: Path, record: dict[str, Any]) -> set[str]:
    """The checkpoint files that may be absent: listed by import as left out of the archive, and kept only
    for audit according to the record itself (never a checkpoint that keep_last, best or last keeps)."""

    try:
        listed = json.loads((run_dir / OMITTED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    names = listed.get("files") if isinstance(listed, dict) else None
    if not isinstance(names, list):
        return set()
    allowed = {name for name in names if isinstance(name, str)} & set(audit_only_checkpoints(record))
    return allowed | {name + ".sha256" for name in allowed}


def _trajectory_problems(record: dict[str, Any], files: dict[str, Path], check_states: bool, report: Progress,
                         present: set[str], omitted: set[str], not_checked: list[dict[str, str]],
                         cache: _StateCache, checkpoint_formats: dict[str, Optional[int]]) -> list[dict[str, Any]]:
    """The trajectory's chain holds, its last entry is the final state, the checkpoints kept are those the keep rule
    keeps, every checkpoint in the run holds a state of the trajectory (a step file may hold a timing save of
    `other_saves`, a resume point), best.pt holds the best validation's entry and last.pt the final one, and every result
    (metrics, export) comes from the entry its record names. Runs made before the trajectory have none; checks whose
    fields a record does not carry are listed in `not_checked`. `checkpoint_formats` gains each checkpoint's record_format."""

    entries = record.get("trajectory")
    outside = record.get("input_checkpoint")
    if not entries and not outside:
        if (record.get("training") or {}).get("steps"):
            not_checked.append({"check": "trajectory", "reason": "the record has no trajectory (made before veritrain kept one)"})
        return []
    problems = []
    entries = entries or []
    training = record.get("training") or {}
    if entries:
        broken = trajectory_module.chain_problem(entries, str(record.get("config_hash")), trajectory_module.chain_binding(record))
        if broken:
            problems.append({"path": RECORD_FILE, "kind": "trajectory_broken", "detail": broken})
        last = entries[-1]
        if record.get("status") == "completed" and training:
            if last.get("model_sha256") != record.get("final_state_sha256") or last.get("step") != training.get("steps"):
                problems.append({"path": RECORD_FILE, "kind": "trajectory_endpoint",
                                 "detail": f"the last entry (step {last.get('step')}, weights {str(last.get('model_sha256'))[:12]}) is not the final state "
                                           f"(step {training.get('steps')}, final_state_sha256 {str(record.get('final_state_sha256'))[:12]})"})
        problems.extend(trajectory_module.keep_rule_problems(record, present, omitted))
    if not check_states:
        not_checked.append({"check": "checkpoint states", "reason": "not asked for (check_states off)"})
        return problems
    by_step = {(e["step"], e["state_sha256"]) for e in entries} | {(e["step"], e["state_sha256"]) for e in record.get("other_saves") or []}
    in_trajectory = {e["state_sha256"] for e in entries}
    best_index = trajectory_module.best_entry(entries, training)

    states: dict[str, str] = {}  # checkpoint file → its state hash
    framework = (record.get("script") or {}).get("integration") if record.get("kind") == "script" else None  # its own files: below
    checkpoints = [(rel, path) for rel, path in sorted(files.items()) if rel.startswith("checkpoints/") and rel.endswith(".pt") and not framework]
    for done, (rel, path) in enumerate(checkpoints):
        report("states", done, len(checkpoints))
        kept = cache.get(rel)
        if kept is not None and isinstance(kept.get("step"), int) and isinstance(kept.get("state_sha256"), str):
            step, digest, written_by, engine = kept["step"], kept["state_sha256"], kept.get("record_format"), kept.get("engine")
        else:
            import torch

            try:  # its bytes were just matched with the sealed record: no second hash (checkpoint.load's sidecar check)
                state = torch.load(path, map_location="cpu", weights_only=True)
                step = int(state["loop"]["step"])
                digest = trajectory_module.state_sha256(state)
                written_by, engine = state.get("record_format"), state.get("engine")
            except Exception as err:  # not a checkpoint veritrain could have written
                problems.append({"path": rel, "kind": "not_in_trajectory", "detail": f"cannot be read as a checkpoint ({str(err)[:120]})"})
                continue
            cache.put(rel, {"step": step, "state_sha256": digest, "record_format": written_by, "engine": engine})
        states[rel] = digest
        if engine != training.get("engine") and not outside:
            # the engine a state was trained by is inside its hash: a record that names another (or none, to be read as
            # the earlier loop's) would have its run resumed, audited and reproduced by the wrong one
            problems.append({"path": rel, "kind": "engine_mismatch", "detail": f"written by the {engine or 'earlier loop or script'} engine, "
                             f"while the record's training.engine is {training.get('engine') or 'absent'}"})
        checkpoint_formats[rel] = written_by if isinstance(written_by, int) and not isinstance(written_by, bool) else None
        name = path.name
        if outside:
            fits, wanted = name == "input.pt" and digest == outside.get("state_sha256"), "the input_checkpoint the record names"
        elif name == "last.pt" and record.get("status") == "completed":
            fits, wanted = digest == entries[-1]["state_sha256"], "the last entry"
        elif name == "best.pt" and best_index is not None:
            fits, wanted = digest == entries[best_index]["state_sha256"], f"the entry of the best validation ({_best_named(training)}, entry {best_index})"
        elif name.startswith("step-"):
            fits, wanted = (step, digest) in by_step, "in the trajectory or a timing save at its step"
        elif name == "last.pt":  # an interrupted run: its last save may be a timing save
            fits, wanted = (step, digest) in by_step, "in the trajectory or a timing save at its step"
        else:
            fits, wanted = digest in in_trajectory, "in the trajectory"
        if not fits:
            kind = "best_not_best_epoch" if name == "best.pt" and best_index is not None else "not_in_trajectory"
            problems.append({"path": rel, "kind": kind, "detail": f"its state (step {step}, state_sha256 {digest[:12]}) is not {wanted}"})
    problems.extend(_framework_file_problems(record, entries, files, states, cache))
    problems.extend(_result_problems(record, entries, states, files, not_checked, cache))
    return problems


def _best_validation_problems(record: dict[str, Any], files: dict[str, Path]) -> list[dict[str, Any]]:
    """The best validation the record names (`training.best_step`, or `best_epoch` in a record without it) is the row of
    metrics.jsonl the best-metric rule picks (`selection.best_row`, the rule training followed), found again here.
    Threat: another state named as validation's choice (say the one that does best on test), best.pt and the record
    made to agree with it; the trajectory checks alone accept any entry the record names."""
    training = record.get("training") or {}
    chosen = training.get("best_metric")
    if record.get("kind") == "script" or not isinstance(chosen, dict) or chosen.get("mode") not in ("max", "min") or "metrics.jsonl" not in files:
        return []
    try:
        rows = [json.loads(line) for line in files["metrics.jsonl"].read_text(encoding="utf-8").splitlines() if line.strip()]
    except ValueError as err:
        return [{"path": "metrics.jsonl", "kind": "unreadable", "detail": f"not JSON lines ({str(err)[:80]})"}]
    best = selection.best_row(rows, str(chosen.get("name")), str(chosen["mode"]))
    if best is None:
        return []
    unit = "step" if training.get("best_step") is not None else "epoch"
    if best.get(unit) == training.get(f"best_{unit}"):
        return []
    return [{"path": RECORD_FILE, "kind": "best_not_best_validation",
             "detail": f"training.best_{unit} is {training.get(f'best_{unit}')}, but metrics.jsonl's best {chosen.get('name')} "
                       f"({chosen['mode']}) is at {unit} {best.get(unit)}"}]


def _best_named(training: dict[str, Any]) -> str:
    """The best validation as the record names it: its step, or (a record without one) its epoch."""
    return f"step {training['best_step']}" if training.get("best_step") is not None else f"epoch {training.get('best_epoch')}"


def _framework_file_problems(record: dict[str, Any], entries: list[dict[str, Any]], files: dict[str, Path], states: dict[str, str],
                             cache: _StateCache) -> list[dict[str, Any]]:
    """A script's run through a framework (veritrain.lightning): every checkpoint file its trajectory names and the run
    keeps holds that entry's state and weights, computed again from the file (`states` gains them)."""
    integration = (record.get("script") or {}).get("integration") if record.get("kind") == "script" else None
    if not integration:
        return []

    recipe = int((record.get("script") or {}).get("state_recipe") or 1)  # how the run hashed its checkpoint folders
    problems = []
    for index, entry in enumerate(entries):
        rel = entry.get("file")
        inside = [r for r in files if r.startswith(f"{rel}/")] if rel else []  # a Trainer's checkpoint is a folder
        if not rel or (rel not in files and not inside):
            continue
        where = files[rel] if rel in files else files[inside[0]].parent
        kept = cache.get(rel)
        if kept is not None and isinstance(kept.get("state_sha256"), str) and isinstance(kept.get("model_sha256"), str):
            state_hash, model_hash = kept["state_sha256"], kept["model_sha256"]
        else:
            try:
                state_hash, model_hash = file_hashes(str(integration), where, recipe)
            except ValueError as err:
                problems.append({"path": rel, "kind": "not_in_trajectory", "detail": str(err)})
                continue
            cache.put(rel, {"state_sha256": state_hash, "model_sha256": model_hash})
        states[rel] = state_hash
        if (state_hash, model_hash) != (entry.get("state_sha256"), entry.get("model_sha256")):
            problems.append({"path": rel, "kind": "not_in_trajectory",
                             "detail": f"it holds state {state_hash[:12]}, not entry {index}'s {str(entry.get('state_sha256'))[:12]}"})
    last = "checkpoints/last.ckpt"  # Lightning's copy of its latest save: it must hold a state of the trajectory
    if integration == "lightning" and last in files and not any(e.get("file") == last for e in entries):
        try:
            state_hash, model_hash = file_hashes(str(integration), files[last])
        except ValueError as err:
            return [*problems, {"path": last, "kind": "not_in_trajectory", "detail": str(err)}]
        if (state_hash, model_hash) not in {(e.get("state_sha256"), e.get("model_sha256")) for e in entries}:
            problems.append({"path": last, "kind": "not_in_trajectory", "detail": f"it holds state {state_hash[:12]}, which no trajectory entry has"})
    return problems


def _result_problems(record: dict[str, Any], entries: list[dict[str, Any]], states: dict[str, str], files: dict[str, Path],
                     not_checked: list[dict[str, str]], cache: _StateCache) -> list[dict[str, Any]]:
    """Every metric set and the export come from the trajectory entry the record names: the entry is the trajectory's,
    the checkpoint the result names holds its state, and export/model.safetensors holds its weights."""
    problems = []

    def differs(path: str, detail: str) -> None:
        problems.append({"path": path, "kind": "result_not_from_trajectory", "detail": detail})

    def entry_problem(what: str, ref: Any) -> Optional[str]:
        if not isinstance(ref, dict) or not isinstance(ref.get("index"), int) or not 0 <= ref["index"] < len(entries):
            return f"{what} names no entry of the trajectory ({str(ref)[:60]})"
        entry = entries[ref["index"]]
        if (ref.get("step"), ref.get("state_sha256")) != (entry["step"], entry["state_sha256"]):
            return f"{what} names entry {ref['index']} as step {ref.get('step')}, state {str(ref.get('state_sha256'))[:12]}; the trajectory says step {entry['step']}, state {entry['state_sha256'][:12]}"
        return None

    outside = record.get("input_checkpoint")
    results = [(f"metrics.{split}", m, m.get("checkpoint")) for split, m in (record.get("metrics") or {}).items() if isinstance(m, dict)]
    export = record.get("export") or {}
    if export.get("files"):
        results.append(("export", export, export.get("checkpoint")))
    for what, result, checkpoint_name in results:
        if outside:  # an eval or export run: its results come from the outside checkpoint it holds, and say so
            if checkpoint_name not in (None, outside.get("file")):
                differs(RECORD_FILE, f"{what} comes from {checkpoint_name}, not the run's input_checkpoint {outside.get('file')}")
            continue
        ref = result.get("trajectory_entry")
        if ref is None:
            not_checked.append({"check": f"{what} from the trajectory", "reason": "the record does not name the trajectory entry it came from (made by an earlier veritrain)"})
            continue
        wrong = entry_problem(what, ref)
        if wrong:
            differs(RECORD_FILE, wrong)
            continue
        if checkpoint_name is not None:
            held = states.get(str(checkpoint_name))
            if held is None:
                differs(str(checkpoint_name), f"{what} comes from {checkpoint_name}, which is not in the run")
            elif held != ref["state_sha256"]:
                differs(str(checkpoint_name), f"{what} names entry {ref['index']} (state {ref['state_sha256'][:12]}), but {checkpoint_name} holds state {held[:12]}")
        if what == "export":
            safetensors = files.get("export/model.safetensors")
            if safetensors is None:
                not_checked.append({"check": "export weights", "reason": "the export has no model.safetensors to compare with the entry's weights"})
                continue
            kept = cache.get("export/model.safetensors")
            if kept is not None and isinstance(kept.get("weights_sha256"), str):
                weights = kept["weights_sha256"]
            else:
                from safetensors.torch import load_file


                try:
                    weights = state_dict_sha256(load_file(str(safetensors)))
                except Exception as err:  # not a safetensors file
                    differs("export/model.safetensors", f"cannot be read ({str(err)[:120]})")
                    continue
                cache.put("export/model.safetensors", {"weights_sha256": weights})
            wanted = entries[ref["index"]]["model_sha256"]
            if weights != wanted:
                differs("export/model.safetensors", f"its weights hash to {weights[:12]}, entry {ref['index']} has weights {wanted[:12]}")
    return problems


def _check_data_version(record: dict[str, Any], state_dir: Path, rehash: bool, drift: list[dict[str, Any]],
                        report: Progress, checked: list[str], not_checked: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The stored data version must still hash to its id; the raw data, when present, must still prepare to it:
    told from the hashes of its bytes when they, the listing and the decoders are as the version records
    (`prepare.raw_data_check`), else by preparing it again in a scratch folder. `checked` gets the line saying
    which check was made."""
    report("data version", 0, 1)
    problems = []
    version = record["data"]["version"]
    folder = state_dir / "data" / version
    if not (folder / "version.json").exists():
        # an imported run without its data: what is here is verified; the absence is drift (--strict fails on it)
        drift.append({"what": f"data version {version[:12]}", "recorded": "used by the run", "now": "not_present in this workspace"})
    else:
        names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        for p in data_version_problems(version, lambda name: (folder / name).read_bytes(), lambda name: sha256_file(folder / name), names):
            problems.append({"path": f".veritrain/data/{version}/{p['path']}", "kind": p["kind"],
                             "detail": f"{p['detail']}; remove .veritrain/data/{version} and run `veritrain data prepare` on the run's config"})
        bound = record["data"].get("version_json_sha256")  # runs since the data version had a record of its own
        if bound is not None and (folder / "version.json").is_file() and sha256_file(folder / "version.json") != bound:
            problems.append({"path": f".veritrain/data/{version}/version.json", "kind": "data_version_changed",
                             "detail": "version.json is not the one the run recorded (its sha256 is in the run's record)"})
    source = record.get("config_source") or {}
    from veritrain.core.config import paths_from_record

    try:
        paths = paths_from_record(source.get("data_paths_resolved") or {})
    except Exception:  # an ${env:...} path whose variable is not set here
        paths = {}
        drift.append({"what": "raw data", "recorded": str(source.get("data_paths_resolved")), "now": "its environment variable is not set"})

    recipe = stored_recipe(folder)

    try:  # a text data version has a recipe of its own
        current_recipe = TEXT_RECIPE if json.loads((folder / "version.json").read_text(encoding="utf-8")).get("kind") == "text" else FORMAT_VERSION
    except (OSError, ValueError, AttributeError):
        current_recipe = FORMAT_VERSION
    carried = carried_test_from(folder)  # data.test_from's version: re-preparing reads its test split
    raw = None
    if "root" in paths and not paths["root"].exists():
        drift.append({"what": "raw data", "recorded": str(paths["root"]), "now": "not present"})
    elif rehash and carried is not None and not (state_dir / "data" / carried / "version.json").is_file():
        drift.append({"what": "raw data", "recorded": f"test split carried over from data version {carried[:12]} (data.test_from)",
                      "now": "that version is not in this workspace, so the raw data cannot be re-prepared to compare"})
    elif rehash and (raw := _raw_by_hashes(record, paths, folder, state_dir, carried, report)) is not None and raw.unchanged:
        what = "raw files" if raw.files else "raw samples"
        held = raw.samples - raw.grown
        checked.append(f"{held:,} {what} hash as recorded {raw.basis}"
                       + (f"; {raw.grown:,} added since, which data version {version[:12]} does not hold (growth, not a change)" if raw.grown else ""))
        if raw.not_compared:
            not_checked.append({"check": "raw data listing", "reason": raw.not_compared})
    elif raw is not None and raw.changed:
        problems.append({"path": str(paths.get("root", "data")), "kind": "data_changed",
                         "detail": f"the raw data is not what data version {version[:12]} was prepared from: {raw.changed}"})
        checked.append(f"raw data hashed: {raw.changed}")
    elif raw is not None and raw.grown and raw.undecided:  # preparing again would take in the new samples too
        drift.append({"what": "raw data", "recorded": f"data version {version[:12]}",
                      "now": f"{raw.undecided}, and {raw.grown:,} sample(s) were added since, so it cannot be prepared again to compare"})
    elif rehash and recipe is not None and recipe != current_recipe:
        why = f"{raw.undecided}, and " if raw is not None and raw.undecided else ""
        drift.append({"what": "raw data", "recorded": f"prepared by data recipe {recipe}",
                      "now": f"{why}this veritrain prepares with recipe {current_recipe}, so the raw data cannot be re-prepared to compare"})
    elif rehash:
        checked.append("raw data prepared again to compare" + (f" ({raw.undecided})" if raw is not None and raw.undecided else ""))


        report("raw data", 0, 1)
        quiet = _QuietThread()  # prepare's info lines ("writing a data version") would describe the scratch folder
        logging.getLogger("veritrain").addFilter(quiet)
        try:  # in a folder of its own, removed afterwards: verify never writes into the workspace's data
            with tempfile.TemporaryDirectory(prefix="veritrain-verify-") as scratch:
                data_cfg = _data_config(record)
                if carried is not None:  # the full id the version recorded, whatever prefix the config gave
                    data_cfg = data_cfg.model_copy(update={"test_from": carried})
                again = prepare.version_now(data_cfg, paths, Path(scratch), versions=state_dir / "data")
        except Exception as err:  # bad data now is a finding of verify, not a crash
            problems.append({"path": str(paths.get("root", "data")), "kind": "data_changed", "detail": f"the data no longer prepares ({err})"})
        else:
            if again != version:
                problems.append({"path": str(paths.get("root", "data")), "kind": "data_changed",
                                 "detail": f"the raw data now prepares to version {again[:12]}, not {version[:12]}"})
        finally:
            logging.getLogger("veritrain").removeFilter(quiet)
    return problems


def _raw_by_hashes(record: dict[str, Any], paths: dict[str, Path], folder: Path, state_dir: Path, carried: Optional[str],
                   report: Progress) -> Any:
    """`prepare.raw_data_check` of the stored version, or None when there is none to compare with (not stored, or
    its manifest cannot be read: its damage is a problem already) or the raw data cannot be listed (preparing it
    again then says why)."""

    if not (folder / "version.json").is_file() or not (folder / "manifest.csv").is_file():
        return None
    report("raw data", 0, 1)
    quiet = _QuietThread()  # the listing's info lines (ignored files) belong to prepare, not to verify
    logging.getLogger("veritrain").addFilter(quiet)
    try:
        data_cfg = _data_config(record)
        if carried is not None:
            data_cfg = data_cfg.model_copy(update={"test_from": carried})
        return prepare.raw_data_check(data_cfg, paths, folder, state_dir / "data")
    except Exception:  # a damaged manifest, unlisted data: the full comparison below reports it
        return None
    finally:
        logging.getLogger("veritrain").removeFilter(quiet)
        report("raw data", 1, 1)


def _data_config(record: dict[str, Any]) -> Any:
    """The data section a run's data version was prepared with: its config's, or for a script's run (veritrain.data)
    the one its `data` section keeps."""
    from veritrain.core.config import RunConfig
    from veritrain.core.config.schema import DataConfig

    if record.get("kind") == "script":
        return DataConfig.model_validate(record["data"]["config"])
    return RunConfig.model_validate(record["config"]).data


class _QuietThread(logging.Filter):
    """Drops the info lines one thread logs (the run browser verifies in a worker: other threads keep theirs)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or record.thread != self.thread


def _environment_drift(record: dict[str, Any]) -> list[dict[str, Any]]:
    env = record.get("env") or {}
    now: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine()}
    try:
        now["torch"] = metadata.version("torch")
    except metadata.PackageNotFoundError:
        now["torch"] = None

    now["packages_sha256"] = hashlib.sha256(package_list().encode()).hexdigest()
    drift = []
    for key, value in now.items():
        recorded = env.get(key)
        if key == "torch" and recorded and value and recorded.split("+")[0] == value.split("+")[0]:
            continue
        if recorded is not None and recorded != value:
            drift.append({"what": f"env.{key}", "recorded": recorded, "now": value})
    return drift


# ---------------------------------------------------------------- reproduce

TIMING_KEYS = {"seconds", "samples_per_s"}  # wall-clock fields: never compared
TOLERANCE = 1e-6  # relative, for "within tolerance"


def _rows(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / name
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def compare_runs(a: Path, b: Path) -> dict[str, Any]:
    """identical / within tolerance / differs, with the first divergence. Both records are read through their
    validation (`read_record`): a forged one is a one-line RunFailed, never a comparison of whatever it holds."""

    ra, rb = read_record(a), read_record(b)
    checks = []
    checks.append(compare_values("final_state_sha256", ra.get("final_state_sha256"), rb.get("final_state_sha256")))
    epochs_a, epochs_b = _rows(a, "metrics.jsonl"), _rows(b, "metrics.jsonl")
    first = None
    worst = "identical"
    if len(epochs_a) != len(epochs_b):
        worst = "differs"
        first = {"where": "metrics.jsonl", "detail": f"{len(epochs_a)} {'epochs' if all('epoch' in r for r in epochs_a) else 'rows'} vs {len(epochs_b)}"}
    for row_a, row_b in zip(epochs_a, epochs_b):
        for key in sorted((set(row_a) | set(row_b)) - TIMING_KEYS):
            verdict = compare_values(key, row_a.get(key), row_b.get(key))["verdict"]
            if verdict != "identical":
                if first is None:
                    where = f"step {row_a['step']} (epoch {row_a.get('epoch')})" if "step" in row_a else f"epoch {row_a.get('epoch')}"
                    first = {"where": f"metrics.jsonl {where}", "key": key, "original": row_a.get(key), "reproduction": row_b.get(key)}
                worst = "differs" if "differs" in (verdict, worst) else "within tolerance"
    checks.append({"what": f"metrics.jsonl ({_rows_shown(epochs_a)})", "verdict": worst, "first_divergence": first})

    spec = spec_of_record(dict(rb))  # a reproduction by this veritrain of an earlier one's run: compared under its names
    for split, metrics in (ra.get("metrics") or {}).items():
        other = (rb.get("metrics") or {}).get(split, {})
        if spec is not None and isinstance(other, dict) and isinstance(metrics, dict):
            other = spec.as_recorded(other, metrics)
        keys = sorted(k for k, v in metrics.items() if isinstance(v, float))
        verdicts = [compare_values(k, metrics.get(k), other.get(k)) for k in keys]
        bad = [v for v in verdicts if v["verdict"] != "identical"]
        checks.append({"what": f"metrics.{split}", "verdict": bad[0]["verdict"] if bad else "identical",
                       "first_divergence": bad[0] if bad else None})
    order = {"identical": 0, "within tolerance": 1, "differs": 2}
    overall = max((c["verdict"] for c in checks), key=order.__getitem__)
    return {"original": a.name, "reproduction": b.name, "verdict": overall, "checks": checks}


def _rows_shown(rows: list[dict[str, Any]]) -> str:
    """How many epochs metrics.jsonl covers, in words: a script's run logs a row per `run.log` call, and a framework
    several per epoch (Lightning: one for training, one for validation), so rows are epochs only when one row is one."""
    if not rows or not all("epoch" in row for row in rows):
        return f"{len(rows)} rows"
    epochs = len({json.dumps(row["epoch"]) for row in rows})
    return f"{epochs} epochs" if epochs == len(rows) else f"{len(rows)} rows over {epochs} epochs"


def compare_values(what: str, x: Any, y: Any) -> dict[str, Any]:
    if x == y:
        verdict = "identical"
    elif isinstance(x, float) and isinstance(y, float) and abs(x - y) <= TOLERANCE * max(1.0, abs(x), abs(y)):
        verdict = "within tolerance"
    else:
        verdict = "differs"
    return {"what": what, "verdict": verdict, "original": x, "reproduction": y}
