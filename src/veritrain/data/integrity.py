"""Whether a prepared data version is intact, wherever its files lie: a workspace's `.veritrain/data/<id>/`
(verify, and every command that opens a version) or an archive's members (import). Reads only.
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Callable, Optional

REPORT_NAME = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")  # a relative path of plain names (no NUL; `.` and `..` parts refused too)


def data_version_problems(version: str, read: Callable[[str], bytes], sha256_of: Callable[[str], str],
                          names: Optional[list[str]] = None) -> list[dict[str, str]]:
    """Whether a prepared data version is intact, wherever its files are (a workspace folder for
    verify and every command that opens it, an archive's members for import): version.json and
    manifest.csv readable, the manifest and (recipe 3 on) every bound file hashing to `version`, the report
    files matching version.json, and, when `names` lists the files present, nothing else there.

    `read` and `sha256_of` take a file name inside the version and raise OSError or KeyError when
    it is missing. Returns [{"path" (inside the version), "kind", "detail"}], empty when intact.
    Versions of recipe 2 and before bind only the manifest; their arrays are checked against version.json.
    """
    from veritrain.data.prepare import BOUND_FILES, CARD_FILE, recipe_of, version_id_of_manifest

    def changed(name: str, detail: str) -> dict[str, str]:
        return {"path": name, "kind": "data_version_changed", "detail": detail}

    try:
        info = json.loads(read("version.json"))
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
    except (OSError, KeyError):
        return [changed("version.json", "version.json is missing")]
    except ValueError as err:  # JSON or UTF-8
        return [changed("version.json", f"version.json is not readable ({err})")]
    problems = []
    try:
        rows = list(csv.DictReader(io.StringIO(read("manifest.csv").decode("utf-8"), newline="")))
    except (OSError, KeyError):
        problems.append(changed("manifest.csv", "manifest.csv is missing"))
    except (ValueError, csv.Error) as err:  # UTF-8 or CSV
        problems.append(changed("manifest.csv", f"manifest.csv is not readable ({err})"))
    else:
        try:
            recomputed = version_id_of_manifest(info, rows)
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            problems.append(changed("manifest.csv", f"version.json or manifest.csv lacks a field or has one of the wrong type ({err})"))
        else:
            if recomputed != version:
                problems.append(changed("manifest.csv", f"the manifest and version.json hash to {recomputed[:12]}, not to the version id"))
            elif info.get("data_version") != version:
                problems.append(changed("version.json", f"version.json names version {str(info.get('data_version'))[:12]}"))
    recipe = recipe_of(info)
    if recipe is None:
        return problems + [changed("version.json", f"format {info.get('format')!r} is not a data recipe (a whole number)")]
    recipe3 = recipe >= 3
    if recipe3:
        files, reports = info.get("files"), info.get("reports")
        if not isinstance(files, dict) or not isinstance(reports, dict) or set(files) != set(BOUND_FILES) \
                or not all(isinstance(e, dict) for e in files.values()):
            return problems + [changed("version.json", "its tables of files are missing or malformed")]
        # a report is any other plain file of the folder: never one the id binds, never a path that leaves it
        odd = [name for name in reports if not isinstance(name, str) or name in set(BOUND_FILES) | {"version.json", CARD_FILE}
               or not REPORT_NAME.fullmatch(name) or {".", ".."} & set(name.split("/")) or not isinstance(reports[name], str)]
        if odd:
            return problems + [changed("version.json", f"its table of reports names {str(odd[0])[:60]!r}, which is not a report file")]
        expected = {name: entry.get("sha256") for name, entry in files.items()} | reports
    else:
        expected = info.get("arrays_sha256") or {}
        if not isinstance(expected, dict):
            return problems + [changed("version.json", "arrays_sha256 is not a table of file → sha256")]
    for name, digest in sorted(expected.items()):
        try:
            intact = sha256_of(name) == digest
        except (OSError, KeyError):
            problems.append(changed(name, f"{name} is missing"))
            continue
        if not intact:
            problems.append(changed(name, f"{name} does not match its sha256 in version.json"))
    if recipe3 and names is not None:
        for name in sorted(set(names) - set(expected) - {"version.json", CARD_FILE}):
            problems.append(changed(name, f"{name} is not part of the data version"))
    return problems
