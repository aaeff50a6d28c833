"""The inputs of a script's run, bound by content: every file of the paths `veritrain.start(inputs=[...])` names
(files, and folders walked in full), hashed at the start into a manifest that the run keeps as `inputs.json`.

    {"format": "veritrain-inputs-1", "root": "/abs/working/dir", "paths": ["data/train.csv", "data/images/"],
     "files": [{"path": "data/images/a.png", "size": 1234, "sha256": "…"}, …], "bytes": 123456}

Paths are relative to the working directory at the start (`root`), as given; absolute ones stay absolute. The
manifest's digest (`manifest_sha256`: SHA-256 of its `paths` and `files`, canonical JSON) binds the inputs into the
run's trajectory as a data version id binds a prepared dataset. `veritrain verify` hashes every byte again
(`problems`): a missing, changed or added file is named; no cache is trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import CHUNK_BYTES, canonical_json

FORMAT = "veritrain-inputs-1"
FILE = "inputs.json"  # in the run folder


def manifest_sha256(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json({"paths": manifest["paths"], "files": manifest["files"]})).hexdigest()


def hash_inputs(paths: Sequence[Union[str, os.PathLike[str]]], root: Path) -> dict[str, Any]:
    """The manifest of `paths` (relative to `root`). UserError naming the path for one that does not exist or is a
    link, and for a file that changed while it was hashed (its size or modification time moved)."""
    given = [_given(path) for path in paths]
    files: dict[str, dict[str, Any]] = {}
    for path in given:
        where = root / path
        try:
            info = where.lstat()
        except OSError:
            raise UserError(f"inputs: {path}: no such file or folder (relative to the working directory {root})") from None
        if stat.S_ISLNK(info.st_mode):
            raise UserError(f"inputs: {path}: a link; name the file or folder it points to")
        found = [where] if stat.S_ISREG(info.st_mode) else _walk(where, path)
        for file in found:
            name = _name(file, root)
            if name not in files:
                files[name] = {"path": name, **_hash_steady(file, name)}
    listed = [files[name] for name in sorted(files)]
    return {"format": FORMAT, "root": str(root), "paths": given, "files": listed, "bytes": sum(f["size"] for f in listed)}


def _given(path: object) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise UserError(f"inputs: {path!r} is a {type(path).__name__}; name each input as a path (a string)")
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise UserError(f"inputs: {path!r}: not a path")
    return text


def _walk(folder: Path, given: str) -> list[Path]:
    if not folder.is_dir():
        raise UserError(f"inputs: {given}: neither a regular file nor a folder")
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = Path(dirpath) / name
            if path.is_symlink():
                raise UserError(f"inputs: {path}: a link inside {given}; inputs are hashed as the files they are, so copy or remove it")
            if not path.is_file():
                raise UserError(f"inputs: {path}: not a regular file (inside {given})")
            found.append(path)
    return found


def _name(file: Path, root: Path) -> str:
    try:
        return file.relative_to(root).as_posix()
    except ValueError:
        return file.as_posix()  # outside the working directory: named by its full path


def _hash_steady(file: Path, name: str) -> dict[str, Any]:
    """{size, sha256} of a file that did not change while it was read."""
    before = file.stat()
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    after = file.stat()
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        raise UserError(f"inputs: {name}: it changed while it was hashed; start the run when nothing writes to it")
    return {"size": after.st_size, "sha256": digest.hexdigest()}


def problems(manifest: dict[str, Any], root: Path) -> list[dict[str, str]]:
    """Every input file as it is now against the manifest, hashed again: {path, kind (input_missing, input_changed,
    input_added), detail}. `root` is where the paths are relative to (the run's recorded working directory)."""
    found: list[dict[str, str]] = []
    try:
        now = hash_inputs(list(manifest["paths"]), root)
    except UserError as err:
        return [{"path": FILE, "kind": "input_missing", "detail": str(err).removeprefix("inputs: ")}]
    recorded = {f["path"]: f for f in manifest["files"]}
    current = {f["path"]: f for f in now["files"]}
    for name in sorted(set(recorded) | set(current)):
        if name not in current:
            found.append({"path": name, "kind": "input_missing", "detail": f"an input file of the run, not in {root} now"})
        elif name not in recorded:
            found.append({"path": name, "kind": "input_added", "detail": "in an input folder now, not when the run started"})
        elif (current[name]["size"], current[name]["sha256"]) != (recorded[name]["size"], recorded[name]["sha256"]):
            found.append({"path": name, "kind": "input_changed",
                          "detail": f"sha256 {current[name]['sha256'][:16]}…, recorded {recorded[name]['sha256'][:16]}…"})
    return found


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The run's inputs.json, checked for shape (it is data: a copied run may hold anything)."""

    try:
        manifest = json.loads((run_dir / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RunFailed(f"{run_dir.name}: {FILE}: cannot be read ({err})") from None
    ok = isinstance(manifest, dict) and manifest.get("format") == FORMAT and isinstance(manifest.get("paths"), list) \
        and all(isinstance(p, str) and p for p in manifest["paths"]) and isinstance(manifest.get("files"), list) \
        and all(isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("size"), int)
                and isinstance(f.get("sha256"), str) for f in manifest["files"])
    if not ok:
        raise RunFailed(f"{run_dir.name}: {FILE}: not an inputs manifest ({FORMAT})")
    return manifest
