"""The committed trajectory of a run: one entry per scheduled checkpoint, hash-chained.

Every checkpoint saved on the schedule (`checkpoint.every_steps`, `every_epochs`, the epoch that
improves `best.pt`, the end of training) adds `{step, epoch, state_sha256, model_sha256, chain}`, and
the initial state adds an entry at step 0. Saves that depend on timing (a signal, `every_minutes`) are
listed apart, in `other_saves`, so a resumed run's trajectory equals an uninterrupted run's. The
trajectory travels inside every checkpoint (loop state, outside the hashed part) and ends in the
record, where the seal covers it. `veritrain audit` replays segments between entries and demands
the same state hash; `veritrain verify` checks the chain and that every checkpoint on disk is in it.

Byte encodings (docs/record.md repeats them):

- `chain_0 = SHA-256("veritrain-trajectory-1\\n" ‖ config_hash ‖ "\\n" ‖ data_version ‖ "\\n")` (ASCII hex);
- `chain_i = SHA-256(chain_{i-1} ‖ step_i ‖ state_sha256_i)`: the previous chain's 32 raw bytes, the step as
  8 bytes unsigned big-endian, the state hash's 32 raw bytes; `chain` is written in hex.
- `state_sha256` (`state_sha256` below): SHA-256 over the checkpoint's training state, walked in a fixed
  order, independent of the machine, of torch.save's container format and of tensor memory layout.
"""

from __future__ import annotations

import hashlib
import re
import struct
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

if TYPE_CHECKING:
    from pathlib import Path

CHAIN_LABEL = b"veritrain-trajectory-1\n"
# Parts of a checkpoint that are not training state: why it was saved, the device and thread settings
# (the environment, compared on resume), the format number, and the trajectory itself.
NOT_STATE = ("reason", "settings", "format_version", "record_format")
NOT_LOOP_STATE = ("trajectory", "other_saves")


def chain_start(config_hash: str, data_version: str) -> str:
    return hashlib.sha256(CHAIN_LABEL + config_hash.encode() + b"\n" + data_version.encode() + b"\n").hexdigest()


def chain_next(previous: str, step: int, state_sha256: str) -> str:
    return hashlib.sha256(bytes.fromhex(previous) + struct.pack(">Q", step) + bytes.fromhex(state_sha256)).hexdigest()


def hashed_parts(state: dict[str, Any]) -> dict[str, Any]:
    """The training state a checkpoint holds, without what is not state (NOT_STATE, the trajectory), and
    without the CUDA generators of a run trained on the CPU (present only when the saving machine had a GPU)."""
    parts = {key: value for key, value in state.items() if key not in NOT_STATE}
    if isinstance(parts.get("loop"), dict):
        parts["loop"] = {key: value for key, value in parts["loop"].items() if key not in NOT_LOOP_STATE}
    on_cuda = str((state.get("settings") or {}).get("device", "cpu")).startswith("cuda")

    def drop_cuda(rng: Any) -> Any:
        return {k: v for k, v in rng.items() if k != "cuda"} if isinstance(rng, dict) and not on_cuda else rng

    if "rng" in parts:
        parts["rng"] = drop_cuda(parts["rng"])
    if isinstance(parts.get("distributed"), dict):
        parts["distributed"] = {**parts["distributed"],
                                "ranks": [{**r, "rng": drop_cuda(r.get("rng"))} for r in parts["distributed"].get("ranks", [])]}
    return parts


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs: dict keys in sorted order of their text, list and tuple items in order."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from leaves(value[key], f"{path}/{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}/{index}")
    else:
        yield path, value


def leaf_bytes(value: Any) -> tuple[bytes, bytes]:
    """(tag, payload) of one leaf. Floats are written exactly (float.hex), tensors as dtype, shape and
    their bytes in C order (little-endian on every machine veritrain runs on)."""
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        header = f"{tensor.dtype}\0{','.join(str(d) for d in tensor.shape)}\0".encode()
        return b"T", header + tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    if value is None:
        return b"N", b""
    if isinstance(value, bool):
        return b"B", b"1" if value else b"0"
    if isinstance(value, int):
        return b"I", str(value).encode()
    if isinstance(value, float):
        return b"F", value.hex().encode()
    if isinstance(value, str):
        return b"S", value.encode()
    if isinstance(value, bytes):
        return b"Y", value
    raise TypeError(f"a checkpoint holds a {type(value).__name__}, which the state hash does not cover")


def state_sha256(state: dict[str, Any]) -> str:
    """The state hash: for each leaf of `hashed_parts(state)`, the path (UTF-8), NUL, a one-letter tag
    (T tensor, N none, B bool, I int, F float, S string, Y bytes), NUL, the payload's length in decimal,
    NUL, the payload."""
    digest = hashlib.sha256()
    for path, value in leaves(hashed_parts(state)):
        tag, payload = leaf_bytes(value)
        digest.update(path.encode() + b"\0" + tag + b"\0" + str(len(payload)).encode() + b"\0")
        digest.update(payload)
    return digest.hexdigest()


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> Optional[str]:
    """The path of the first leaf (in hashing order) where two states differ, or None."""
    left, right = dict(leaves(hashed_parts(a))), dict(leaves(hashed_parts(b)))
    for path in sorted(set(left) | set(right)):
        if path not in left or path not in right:
            return f"{path} (only in the {'replayed' if path in left else 'recorded'} state)"
        if leaf_bytes(left[path]) != leaf_bytes(right[path]):
            return path
    return None


def entry(trajectory: list[dict[str, Any]], config_hash: str, data_version: str, step: int, epoch: int,
          state_hash: str, model_sha256: str) -> dict[str, Any]:
    previous = trajectory[-1]["chain"] if trajectory else chain_start(config_hash, data_version)
    return {"step": step, "epoch": epoch, "state_sha256": state_hash, "model_sha256": model_sha256,
            "chain": chain_next(previous, step, state_hash)}


def chain_binding(record: dict[str, Any]) -> str:
    """What a recorded run's chain binds besides its config: its data version id, or for a script's run
    (veritrain.userloop) the digest of its inputs manifest; "None" for a run that bound neither."""
    version = (record.get("data") or {}).get("version")
    if version:
        return str(version)
    manifest = (record.get("inputs") or {}).get("manifest_sha256")
    return str(manifest) if manifest else "None"


def chain_problem(trajectory: list[dict[str, Any]], config_hash: str, data_version: str) -> Optional[str]:
    """Why a recorded trajectory's chain does not hold (one line), or None."""
    previous = chain_start(config_hash, data_version)
    last_step = -1
    for index, item in enumerate(trajectory):
        try:
            step, state_hash, chain = int(item["step"]), str(item["state_sha256"]), str(item["chain"])
            expected = chain_next(previous, step, state_hash)
        except (KeyError, TypeError, ValueError, struct.error):
            return f"entry {index} is malformed"
        if step < last_step:
            return f"entry {index} (step {step}) comes after step {last_step}"
        if chain != expected:
            return f"entry {index} (step {step}): chain {chain[:12]} is not SHA-256(previous chain ‖ step ‖ state hash) = {expected[:12]}"
        previous, last_step = chain, step
    return None


def for_record(entries: list[dict[str, Any]], checkpoints: Path, audit_every: int) -> list[dict[str, Any]]:
    """The record's trajectory: each entry with `kept` (its checkpoints/step-<N>.pt is in the run) and
    `kept_for_audit` (kept by checkpoint.audit_every beyond keep_last; an archive may leave those out)."""
    return [{**item, "kept": index > 0 and ((checkpoints.parent / item["file"]) if item.get("file") else (checkpoints / f"step-{item['step']}.pt")).exists(),
             "kept_for_audit": kept_for_audit(index, audit_every)}
            for index, item in enumerate(entries)]


def entry_with_state(trajectory: list[dict[str, Any]], state_hash: str) -> Optional[int]:
    """The index of the (last) entry holding `state_hash`, or None: the state is not one the run committed to."""
    found = [index for index, item in enumerate(trajectory) if item.get("state_sha256") == state_hash]
    return found[-1] if found else None


def best_entry(trajectory: list[dict[str, Any]], training: Any) -> Optional[int]:
    """The index of the entry best.pt must hold, by the record's `training` section: the save at `best_step` (the steps
    done at the best validation), or, in a record without it (the earlier loop's, recipe-1's before it was recorded), the
    save at the end of `best_epoch` (the last entry of that epoch; saves inside an epoch carry the epoch in progress).
    None when the trajectory has no such entry (no best, or a run resumed from a checkpoint made before trajectories).
    Whether a record must carry best_step is its format's question (veritrain.trust.formats), never this one's."""
    training = training if isinstance(training, Mapping) else {}
    best_step, best_epoch = training.get("best_step"), training.get("best_epoch")
    if _counted(best_step):
        found = [index for index, item in enumerate(trajectory) if index and item.get("step") == best_step]
    elif _counted(best_epoch) and best_epoch >= 1:
        found = [index for index, item in enumerate(trajectory) if index and item.get("epoch") == best_epoch]
    else:
        return None
    return found[-1] if found else None


def _counted(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def kept_for_audit(index: int, audit_every: int) -> bool:
    """The keep rule of `checkpoint.audit_every` K: every K-th entry of the trajectory after the initial state keeps
    its checkpoint for `veritrain audit` (beyond keep_last). Training applies it when it deletes old step files, the
    record marks the entries with it, and verify checks the run against it."""
    return bool(audit_every) and index > 0 and index % audit_every == 0


def audit_steps(trajectory: list[dict[str, Any]], audit_every: int) -> set[int]:
    """The steps whose checkpoint `checkpoint.audit_every` K keeps (`kept_for_audit`)."""
    return {item["step"] for index, item in enumerate(trajectory) if kept_for_audit(index, audit_every)}


def checkpoint_rules(record: dict[str, Any]) -> dict[str, Any]:
    """The keep rule a run's checkpoints followed: its config's `checkpoint` section, or for a script's run
    (veritrain.userloop, whose config is the user's own) what `veritrain.start` was given: keep_last, audit_every,
    no best.pt, and last.pt once it completed."""
    if record.get("kind") == "script":
        rules = (record.get("script") or {}).get("checkpoints") or {}
        return {"keep_last": rules.get("keep_last", 2), "audit_every": rules.get("audit_every", 0), "best": False,
                "last": record.get("status") == "completed" and not (record.get("script") or {}).get("integration")}
    section = (record.get("config") or {}).get("checkpoint")
    return section if isinstance(section, dict) else {}


def keep_rule_problems(record: dict[str, Any], present: set[str], omitted: set[str]) -> list[dict[str, str]]:
    """Where the checkpoints a run holds differ from the rule that kept them, as the commands that ran on the run
    applied it: training keeps best.pt, last.pt, the newest `checkpoint.keep_last` step files (of every save: the
    trajectory's and the timing saves') and every `audit_every`-th entry; `veritrain gc` (its amendment's `gc` event, or
    seal_history in runs re-sealed by an earlier veritrain) then removes every step file but those kept for audit; an archive made without --with-audit leaves out the
    audit-only ones (`omitted`, listed by import). `present`: the run's files (relative paths). A checkpoint the
    rule keeps that is not there, or a `kept`/`kept_for_audit` flag that disagrees with the rule or the files, is
    a problem: a forger who deletes the start of a forged segment must also break the rule."""
    entries = [e for e in record.get("trajectory") or [] if isinstance(e, dict)]
    training = record.get("training") or {}
    if not entries or not training:
        return []
    checkpoint_cfg = checkpoint_rules(record)
    keep_last, every = int(checkpoint_cfg.get("keep_last", 2)), int(checkpoint_cfg.get("audit_every", 0) or 0)
    problems: list[dict[str, str]] = []

    def problem(path: str, detail: str) -> None:
        problems.append({"path": path, "kind": "keep_rule", "detail": detail})

    for index, item in enumerate(entries):
        expected = kept_for_audit(index, every)
        if bool(item.get("kept_for_audit")) != expected:
            problem("record.json", f"trajectory entry {index} (step {item.get('step')}) says kept_for_audit {bool(item.get('kept_for_audit'))}, "
                                   f"but checkpoint.audit_every {every} {'keeps' if expected else 'does not keep'} it")
    # a timing save without a step (a damaged record) names no checkpoint, and cannot be sorted among the steps
    written = sorted({e["step"] for e in entries[1:]} | {o["step"] for o in record.get("other_saves") or [] if isinstance(o, dict) and o.get("step") is not None}, reverse=True)
    collected = (any(isinstance(h, dict) and h.get("by") == "gc" for h in record.get("seal_history") or [])  # an earlier gc's re-seal
                 or any(isinstance(e, dict) and e.get("kind") == "gc" for e in record.get("events") or []))  # a gc amendment's event
    required = audit_steps(entries, every) | (set() if collected else set(written[:keep_last]))
    for step in sorted(required):
        name = f"checkpoints/step-{step}.pt"
        if name not in present and name not in omitted:
            why = "kept for audit (checkpoint.audit_every)" if step in audit_steps(entries, every) else f"one of the newest checkpoint.keep_last {keep_last}"
            problem(name, f"the keep rule keeps it ({why}) but it is not in the run")
    for index, item in enumerate(entries[1:], start=1):
        name = str(item.get("file") or f"checkpoints/step-{item['step']}.pt")  # a framework's own file, or veritrain's
        here = name in present or name in omitted or any(p.startswith(name + "/") for p in present)  # a framework's folder
        if bool(item.get("kept")) != here:
            problem("record.json", f"trajectory entry {index} (step {item['step']}) says kept {bool(item.get('kept'))}, but {name} is {'' if here else 'not '}in the run")
    if checkpoint_cfg.get("best", True) and best_entry(entries, training) is not None and "checkpoints/best.pt" not in present:
        problem("checkpoints/best.pt", "checkpoint.best keeps the best validation's state, but best.pt is not in the run")
    if checkpoint_cfg.get("last", True) and "checkpoints/last.pt" not in present:
        problem("checkpoints/last.pt", "checkpoint.last keeps the final state, but last.pt is not in the run")
    return problems


def kept_checkpoints(run_dir: Path, record: dict[str, Any]) -> dict[int, Path]:
    """Entry index → the checkpoint of the run (a Path) that holds its state: its step file (or the framework's file
    the entry names), or best.pt for the best validation's entry when its step file is gone (verify matches both with the
    trajectory)."""
    entries = record.get("trajectory") or []
    folder = run_dir / "checkpoints"
    files = {index: folder / f"step-{e['step']}.pt" for index, e in enumerate(entries) if index and (folder / f"step-{e['step']}.pt").is_file()}
    files.update({index: run_dir / str(e["file"]) for index, e in enumerate(entries)  # a framework's own checkpoint files
                  if index and e.get("file") and (run_dir / str(e["file"])).is_file()})
    best = best_entry(entries, record.get("training"))
    if best is not None and best not in files and (folder / "best.pt").is_file():
        files[best] = folder / "best.pt"
    return files


def start_points(trajectory: list[dict[str, Any]], files: dict[int, Path]) -> dict[int, Optional[Path]]:
    """Entry index → where a replay can start from it: the initial state (None: rebuilt from the config) and each
    entry with a kept checkpoint (`files`: entry index → checkpoint path)."""
    starts: dict[int, Optional[Path]] = {index: path for index, path in files.items() if 0 < index < len(trajectory)}
    if len(trajectory) > 1 and starts_at_initial_state(trajectory, 1):
        starts[0] = None
    return starts


def stretches(segments: list[int], starts: set[int]) -> list[tuple[int, int]]:
    """The replays that cover `segments` (segment i: entry i−1 → entry i): each from the nearest earlier start
    (an entry in `starts`) to the last segment that needs it, every entry on the way checked. Segments sharing a
    start share one replay, and stretches never overlap, so auditing any set of segments replays each at most once."""
    ends: dict[int, int] = {}
    for segment in sorted(segments):
        earlier = [k for k in starts if k <= segment - 1]
        if not earlier:
            continue
        start = max(earlier)
        ends[start] = max(ends.get(start, segment), segment)
    return sorted(ends.items())


def longest_stretch(trajectory: list[dict[str, Any]], starts: set[int]) -> Optional[tuple[int, int]]:
    """(segments, steps) of the longest replay any one segment needs, or None when some segment has no start."""
    longest = (0, 0)
    for segment in range(1, len(trajectory)):
        earlier = [k for k in starts if k <= segment - 1]
        if not earlier:
            return None
        start = max(earlier)
        longest = max(longest, (segment - start, trajectory[segment]["step"] - trajectory[start]["step"]))
    return longest


def starts_at_initial_state(trajectory: list[dict[str, Any]], index: int) -> bool:
    """Whether segment `index` starts at the initial state (a run resumed from a checkpoint made before
    trajectories has no entry for it)."""
    return index == 1 and trajectory[0]["step"] == 0 and trajectory[0]["epoch"] == 0


def audit_only_checkpoints(record: dict[str, Any]) -> list[str]:
    """The `checkpoints/step-<N>.pt` files a record keeps only for audit: entries marked `kept_for_audit`,
    less the newest `checkpoint.keep_last` entries of the trajectory (by position: the resume points
    keep_last keeps in any case). An archive made without --with-audit leaves exactly these out, and
    verify excuses exactly these when import listed them; best.pt and last.pt are never among them."""
    entries = [e for e in record.get("trajectory") or [] if isinstance(e, dict)]
    try:
        keep_last = int(checkpoint_rules(record).get("keep_last", 2))
    except (TypeError, ValueError, AttributeError):  # no usable keep_last: nothing counts as audit-only
        return []
    if keep_last < 1:
        return []
    newest = {f"checkpoints/step-{e.get('step')}.pt" for e in entries[1:][-keep_last:]}
    return sorted({f"checkpoints/step-{e.get('step')}.pt" for e in entries[1:] if e.get("kept_for_audit") is True} - newest)


WEIGHT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".onnx")  # files that can hold a model's weights, in any case
STATE_CHECKED = re.compile(r"checkpoints/[^/]+\.pt")  # each is loaded and matched with the trajectory by verify


def unbound_weights(record: dict[str, Any], names: set[str]) -> list[dict[str, str]]:
    """The files of the run (`names`, by their name in the run) that can hold weights and that nothing binds: not a
    checkpoint verify matches with the trajectory (`checkpoints/*.pt`), not a file or folder a trajectory entry names
    (a framework's checkpoint), not a file of the export the record certifies, not a Lightning run's `last.ckpt` (matched
    with the trajectory too). Threat: other weights shipped in a run (`checkpoints/best.pth`, `model/deploy.pt`) that a
    reader could load while verify passes."""
    entries = [e for e in record.get("trajectory") or [] if isinstance(e, dict)]
    named = {str(e["file"]) for e in entries if e.get("file")}
    exported = {f"export/{f['file']}" for f in ((record.get("export") or {}).get("files") or {}).values() if isinstance(f, dict) and f.get("file")}
    integration = (record.get("script") or {}).get("integration") if record.get("kind") == "script" else None
    problems = []
    for name in sorted(names):
        if not name.lower().endswith(WEIGHT_SUFFIXES) or STATE_CHECKED.fullmatch(name) or name in exported or name in named:
            continue
        if any(name.startswith(folder + "/") for folder in named):  # inside a framework's checkpoint folder
            continue
        if integration == "lightning" and name == "checkpoints/last.ckpt":
            continue
        problems.append({"path": name, "kind": "unbound_weights",
                         "detail": "a file that can hold weights, bound to no trajectory entry and not the export the record "
                                   "certifies: remove it (a model a run ships is its export or a checkpoint of its trajectory)"})
    return problems
