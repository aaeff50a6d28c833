"""Where smoke results are filed: `.veritrain/smoke/<key>/`, keyed by what the result depends on (config hash,
data version, how the slice is taken, the code), and whether the one filed under a key passed. veritrain.orchestration.smoke
runs them; `veritrain check` and `gc` only read them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from veritrain.core.hashing import sha256_json
from veritrain.records.usercode import listing_sha256

SLICE = "stratified"  # how the slice is taken (`stratified`): in the key, so a result from the first rows is not reused


def smoke_key(config_hash: str, data_version: str, code: dict[str, Any]) -> str:
    """Where a smoke result is filed: config hash, data version, veritrain and git version, and the user's model
    code when there is any (`user_files`, as usercode.current_listing gives it)."""
    keyed: dict[str, Any] = {"config_hash": config_hash, "data_version": data_version, "slice": SLICE,
                             "code": {k: code.get(k) for k in ("veritrain", "git_commit", "git_dirty")}}
    if code.get("user_files"):
        keyed["user_code"] = listing_sha256(code["user_files"])
    return sha256_json(keyed)[:32]


def passed_before(state_dir: Path, key: str) -> bool:
    """Whether the smoke test filed under `key` in `.veritrain/smoke/` passed; a missing or damaged result
    counts as not passed (the smoke test then runs again)."""
    try:
        record = json.loads((state_dir / "smoke" / key / "record.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(record, dict) and record.get("status") == "completed"
