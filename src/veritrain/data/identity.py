"""What a data version is and how a stored one is opened: the data recipe (FORMAT_VERSION), the version id
(sample ids, content hashes, labels and splits, the preprocessing config and the hash of every file written), its
recomputation from a stored manifest, and `load_version`, which checks a stored version against its id before
anything reads it.

Readers elsewhere look up `identity.FORMAT_VERSION` and `identity.decoder_versions` on this module, so that one
replacement (a test standing in for an earlier recipe or other decoders) is seen by all of them."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from veritrain.core.errors import RunFailed
from veritrain.core.hashing import JsonRows, sha256_file, sha256_json
from veritrain.data.report import card_gaps, card_warnings
from veritrain.data.shards import BLOCK, FieldSpec, ShardError, array_of
from veritrain.data.split import SPLITS

log = logging.getLogger("veritrain")

if TYPE_CHECKING:
    from veritrain.core.config import DataConfig
    from veritrain.data.sources import Source
    from veritrain.data.table import Table

# The data recipe: how a data version is prepared and laid out; part of the version id. 3: near-duplicates
# confirmed by pixels, achieved-split check, label issues and outliers, exact normalization, every file of the
# version bound to its id. 4: stable splits (each unit placed by the hash of its key, see data/split.py), the
# achieved-split check against 3σ of chance, data.test_from, the manifest's `key` and `unit` columns. 5: a file
# found by walking data.root (imagefolder; labelmap, unless the map labels it) is a sample only when its name ends
# in one of IMAGE_EXTENSIONS, the rest are listed as ignored (README.txt, Thumbs.db); version.json binds
# `listing_sha256`, so `verify` can tell unchanged raw data from its hashes alone. 6: data.test_from matches the
# former version's samples by content hash as well as by key (a renamed id keeps its former split); time splits
# order samples by the instant each timestamp parses to (split.parse_instant; a value that is not a timestamp is a
# `bad_timestamp` finding), the formats read recorded with the achieved split. Runs made with an earlier recipe
# keep the version it prepared (see `run`'s `recorded`). 7: the inputs, labels, groups and timestamps are fields in
# shards (data/shards.py, docs/shards.md) that version.json lists and the id binds (`fields`), kept once in the
# workspace's shard store and linked into each version that holds them; opening a version checks its small files and
# each shard's presence and size, and every block is checked when it is read; beyond 50,000 distinct pictures, the
# near-duplicate candidates by spectrum come from hashed buckets (dedup.hashed_neighbours), not a brute-force search.
FORMAT_VERSION = 7
FIELDS_SINCE = 7  # the first recipe whose inputs and targets are fields in shards (earlier: inputs.npy, targets.npy)
FIELDS_FOLDER = "fields"  # where such a version holds its shards: fields/<id[:2]>/<id>, linked from the store
SHARD_STORE = "shards"  # the workspace's store of shards, in its `.veritrain/`: each shard once, whichever versions hold it
INPUT_FIELDS = ("image", "features")  # the field a version's `inputs` reads: decoded pixels, or an array source's rows
IN_MEMORY_BYTES = 256 << 20  # an inputs field up to this size is read whole when opened (every block checked once)


BOUND_FILES = ("manifest.csv", "quarantine.csv", "splits/train.txt", "splits/val.txt", "splits/test.txt", "inputs.npy", "targets.npy")


BOUND_INFO = ("classes", "counts", "counts_per_class", "input_shape", "input_dtype", "target_dtype", "normalization", "files", "achieved_split")


PLACED_FILE = "splits/placed.u8"  # fields recipes: each placed row's split (0 train, 1 val, 2 test), one byte a row in row order
FIELD_BOUND_FILES = BOUND_FILES[:5] + (PLACED_FILE,)  # recipe 7 on: the files beside the fields (which `fields` binds)


BOUND_INFO_SINCE = {"listing_sha256": 5, "fields": FIELDS_SINCE}  # parts of version.json bound from a recipe on (earlier versions keep their ids)


CARD_FILE = "card.json"  # the data card: beside the version, editable, outside every hash

# A text data version (veritrain.data.text_prepare), `kind: "text"` in version.json, has its own recipe and files:
# documents in the manifest, the tokenizer's file and one token array per split
# 2: texts matched in text_dedup.match_form, contamination over document boundaries and word order. 3: each split's
# tokens are a field of chunk shards (`tokens_train`, `tokens_val`, `tokens_test`), as image fields are from recipe 7
TEXT_RECIPE = 3
TEXT_FIELDS_SINCE = 3
TEXT_BOUND_FILES = ("manifest.csv", "quarantine.csv", "splits/train.txt", "splits/val.txt", "splits/test.txt", "tokenizer.json",
                    "tokens/train.bin", "tokens/val.bin", "tokens/test.bin")
TEXT_FIELD_BOUND_FILES = TEXT_BOUND_FILES[:6] + (PLACED_FILE,)  # text recipe 3 on: the token files are fields
TEXT_BOUND_INFO = ("kind", "counts", "tokens", "bytes", "tokenizer", "files", "raw_files", "achieved_split", "contamination")


def bound_files(info: dict[str, Any]) -> tuple[str, ...]:
    """The files a stored version's id binds by their SHA-256 (recipe 3 on), by its kind and recipe; from recipe 7 on
    its shards are bound through `fields` instead (`shard_files`)."""
    if info.get("kind") == "text":
        return TEXT_FIELD_BOUND_FILES if has_fields(info) else TEXT_BOUND_FILES
    return FIELD_BOUND_FILES if has_fields(info) else BOUND_FILES


def has_fields(info: dict[str, Any]) -> bool:
    """Whether a stored version's recipe keeps its data in fields (image recipe 7 on, text recipe 3 on): the kind and
    recipe it declares decide, never whether a `fields` table happens to be there."""
    return (recipe_of(info) or 0) >= (TEXT_FIELDS_SINCE if info.get("kind") == "text" else FIELDS_SINCE)


def token_field(split: str) -> str:
    """The field of a text version holding a split's token stream."""
    return f"tokens_{split}"


def field_specs(info: dict[str, Any]) -> dict[str, FieldSpec]:
    """The fields version.json lists, each checked (`FieldSpec.from_dict`; ShardError when one is malformed): an
    image version's inputs field (INPUT_FIELDS) and `label`, with one row per placed sample each; a text version's
    token stream per split (one unsigned token a row)."""
    table = info.get("fields")
    if not isinstance(table, dict):
        raise ShardError("version.json: `fields` is not a table of fields")
    specs = {name: FieldSpec.from_dict(name, spec) for name, spec in table.items()}
    if info.get("kind") == "text":
        streams = [specs.get(token_field(name)) for name in SPLITS]
        if any(s is None or s.layout != "array" or s.shape != () or np.dtype(s.dtype).kind != "u" for s in streams):
            raise ShardError(f"version.json: `fields` lacks a stream of tokens ({', '.join(token_field(n) for n in SPLITS)})")
        return specs
    if not any(name in specs for name in INPUT_FIELDS) or "label" not in specs:
        raise ShardError(f"version.json: `fields` lacks {' or '.join(INPUT_FIELDS)} or label")
    rows = {spec.rows for spec in specs.values()}
    if len(rows) != 1:
        raise ShardError(f"version.json: its fields hold different numbers of rows ({', '.join(f'{n} {s.rows}' for n, s in specs.items())})")
    return specs


def shard_files(info: dict[str, Any]) -> list[str]:
    """The shard files of a version's fields, as paths inside the version (`fields/<id[:2]>/<id>`); none before recipe 7."""
    if not has_fields(info):
        return []
    return sorted({f"{FIELDS_FOLDER}/{entry.id[:2]}/{entry.id}" for spec in field_specs(info).values() for entry in spec.shards})


@dataclass
class DataVersion:
    """A prepared data version as training reads it (arrays are memory-mapped, read-only)."""

    version: str
    path: Path
    info: dict[str, Any]  # the content of version.json
    inputs: np.ndarray
    targets: np.ndarray
    splits: dict[str, np.ndarray]  # split name → row indices into inputs/targets
    sample_ids: list[str]  # per row (quarantined samples have no row)
    reused: bool = False

    @property
    def classes(self) -> Optional[list[str]]:
        return self.info.get("classes")

    @property
    def counts(self) -> dict[str, int]:
        return {name: int(len(rows)) for name, rows in self.splits.items()}

    def report(self) -> dict[str, Any]:
        """The data report, with the data card as it is now (the card may be edited after preparing)."""

        report = json.loads((self.path / "data_report.json").read_text(encoding="utf-8"))
        if "achieved_split" in self.info and isinstance(report.get("summary"), dict):
            report["summary"]["achieved_split"] = self.info["achieved_split"]  # the bound copy, not the report's
        card_file = self.path / CARD_FILE
        if card_file.exists():
            report["card"] = json.loads(card_file.read_text(encoding="utf-8"))
            report["card_warnings"] = card_warnings(report["card"])
            report["card_gaps"] = card_gaps(report["card"])  # every empty field: the Croissant record leaves each out
        return report


def version_id(preprocessing: dict[str, Any], hash_algorithm: str, samples: Iterable[tuple[str, Optional[str], str, str]],
               content: Optional[str] = None) -> str:
    """The data version id: SHA-256 over the preprocessing config, the hash algorithm and every
    (sample id, content hash or None, label, split or "quarantined"), sorted by sample id; from recipe 3 on
    also over `content`, the hash of what was written (`content_hash`: every file's SHA-256, the classes,
    counts and normalization), so nothing training reads can change without changing the id."""
    bound = {"preprocessing": preprocessing, "hash_algorithm": hash_algorithm, "samples": sorted(tuple(s) for s in samples)}
    if content is not None:
        bound["content"] = content
    return sha256_json(bound)


def id_of(info: dict[str, Any], samples: Iterable[tuple[str, Optional[str], str, str]]) -> str:
    """The id of a version whose version.json holds `info` (its `data_version` aside) and whose manifest lists
    `samples`. From the fields recipes on (image 7, text 3) the samples are bound through the manifest's SHA-256 in
    `files`, not listed again, so the id is recomputed from version.json and the file hashes alone (`samples` unread)."""
    return version_id(info["preprocessing"], info["hash_algorithm"], () if has_fields(info) else samples, content_hash(info))


def content_hash(info: dict[str, Any]) -> str:
    """SHA-256 of the parts of version.json that the id binds (BOUND_INFO, and BOUND_INFO_SINCE from its recipe on)."""
    if info.get("kind") == "text":
        return sha256_json({key: info.get(key) for key in TEXT_BOUND_INFO + (("fields",) if has_fields(info) else ())})
    recipe = recipe_of(info) or 0
    keys = BOUND_INFO + tuple(key for key, since in BOUND_INFO_SINCE.items() if recipe >= since)
    return sha256_json({key: info.get(key) for key in keys})


def listing_sha256(table: Table, source: Source) -> str:
    """SHA-256 of what the listing gives each sample beyond the manifest's columns (group, fixed split, timestamp)
    and of the listing's own findings: with the manifest and the source's preprocessing it binds every input of
    preparing (recipe 5 on), so that unchanged raw data can be told from its hashes without decoding it again."""
    return sha256_json({"samples": JsonRows(lambda: ([table.ids[i], table.groups[i], table.fixed[i], table.timestamps[i]] for i in range(len(table.ids)))),
                        "findings": [[kind, ids, reason] for kind, ids, reason in getattr(source, "findings", [])]})


def recipe_of(info: Any) -> Optional[int]:
    """The data recipe (version.json `format`) of a stored version: a whole number, else None. The one reader of
    it, so that no check can read "3" as recipe 3 while another reads it as an earlier one."""
    recipe = info.get("format") if isinstance(info, dict) else None
    return recipe if isinstance(recipe, int) and not isinstance(recipe, bool) else None


def version_id_of_manifest(info: dict[str, Any], rows: list[dict[str, str]]) -> str:
    """`version_id` recomputed from a stored version.json and its manifest.csv rows (verify, import)."""
    key = info["hash_algorithm"]
    recipe = recipe_of(info)
    if recipe is None:
        raise ValueError(f"format {info.get('format')!r} is not a data recipe")
    if has_fields(info):
        return id_of(info, ())
    content = content_hash(info) if recipe >= 3 or info.get("kind") == "text" else None
    return version_id(info["preprocessing"], key, (
        (r["sample_id"], r[key] or None, r["label"], r["split"] if r["status"] == "ok" else "quarantined") for r in rows), content)


def preprocessing_config(data_cfg: DataConfig, source_preprocessing: dict[str, Any],
                         target: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Everything besides the samples that decides the prepared arrays and the split: the data config
    without file locations, the data card or worker count, plus what the source and decoder did."""
    from veritrain.core.config import without_added_defaults

    cfg = without_added_defaults({"data": data_cfg.model_dump(mode="json")})["data"]
    # locations, the card and workers do not shape the data; on_split_skew only decides whether to stop on it
    for key in ("root", "csv", "labels", "split_dir", "test_split_file", "card", "workers", "on_split_skew"):
        cfg.pop(key, None)
    return {"format": FORMAT_VERSION, "data": cfg, "source": source_preprocessing, "target": target}


def decoder_versions() -> dict[str, str]:
    """What turns raw bytes into the prepared arrays, as version.json records it (`decoders`)."""
    import PIL

    return {"pillow": PIL.__version__, "numpy": np.__version__}


def earlier_recipe_hint(recorded_data: Optional[dict[str, Any]]) -> str:
    """What to add when a run's data version no longer prepares: runs recorded before this recipe (no
    `recipe`, or another one) need the version they stored, since this recipe gives the same data another id."""
    recipe = (recorded_data or {}).get("recipe")
    current = TEXT_RECIPE if (recorded_data or {}).get("tokenizer") else FORMAT_VERSION  # a text data version has recipes of its own
    if recipe == current:
        return ""
    return (f"; the run's data was prepared by {'an earlier data recipe' if recipe is None else f'data recipe {recipe}'}, which this "
            f"veritrain (recipe {current}) does not repeat: bring its stored version along (`veritrain archive RUN --with-data` "
            "where it was made, then `veritrain import`)")


def stored_recipe(folder: Path) -> Optional[int]:
    """The recipe (format) of a stored data version, None when it is not there or not readable."""
    try:
        return recipe_of(json.loads((folder / "version.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def carried_test_from(folder: Path) -> Optional[str]:
    """The data version a stored version took its test split from (data.test_from, recipe 4 on), if any;
    None when it names none or cannot be read."""
    try:
        carried = json.loads((folder / "version.json").read_text(encoding="utf-8"))["preprocessing"]["data"].get("test_from")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return carried if isinstance(carried, str) else None


_checked: dict[str, tuple] = {}  # version folder → file identities when last checked in this process


def check_version(path: Path) -> None:
    """Refuse a stored data version whose files do not match what its id binds (RunFailed, one line naming
    the file and the fix). Checked once per process while the files stay the same (inode, size, mtime)."""
    names = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != CARD_FILE)
    identity = tuple((name, *_identity(path / name)) for name in names)
    if _checked.get(str(path)) == identity:
        return
    problems = data_version_problems(path.name, lambda name: (path / name).read_bytes(), lambda name: sha256_file(path / name), names,
                                     size_of=lambda name: (path / name).stat().st_size)
    if problems:
        first = problems[0]
        raise RunFailed(f"{path / first['path']}: data version {path.name[:12]} is damaged ({first['detail']}); nothing was trained on it: "
                        f"remove {path} and prepare it again (`veritrain data prepare CONFIG`), or import its run again with --with-data")
    _checked[str(path)] = identity


def _identity(file: Path) -> tuple[int, int, int, int]:
    stat = file.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns  # ctime: a restored mtime cannot hide an edit


def load_version(path: Path) -> DataVersion:
    """A stored data version, after `check_version`. The splits come from the manifest's split column, which
    every recipe binds to the id (recipe 2 and before did not bind the split lists)."""
    check_version(path)
    info = json.loads((path / "version.json").read_text(encoding="utf-8"))
    if info.get("kind") == "text":
        return _load_text_version(path, info)
    if has_fields(info):  # read from checked blocks: a small inputs field whole now, a large one as rows are asked for
        specs = field_specs(info)
        inputs = array_of(specs[next(name for name in INPUT_FIELDS if name in specs)], path / FIELDS_FOLDER, IN_MEMORY_BYTES)
        targets = array_of(specs["label"], path / FIELDS_FOLDER, 1 << 62, eager=True)  # a few bytes a row
        return DataVersion(version=info["data_version"], path=path, info=info, inputs=inputs, targets=targets,
                           splits=placed_splits(path, len(inputs)), sample_ids=ManifestIds(path / "manifest.csv", len(inputs)))  # type: ignore[arg-type]
    with open(path / "manifest.csv", newline="", encoding="utf-8") as f:
        placed = [(row["sample_id"], row["split"]) for row in csv.DictReader(f) if row["status"] == "ok"]
    inputs = np.load(path / "inputs.npy", mmap_mode="r")
    targets = np.load(path / "targets.npy", mmap_mode="r")
    if len(inputs) != len(placed) or len(targets) != len(placed) or any(split not in SPLITS for _, split in placed):
        raise RunFailed(f"{path / 'manifest.csv'}: data version {path.name[:12]} does not match its arrays ({len(placed)} placed samples, "
                        f"{len(inputs)} rows); remove {path} and prepare it again, or import its run again")
    splits = {name: np.array([row for row, (_, split) in enumerate(placed) if split == name], dtype=np.int64) for name in SPLITS}
    return DataVersion(
        version=info["data_version"],
        path=path,
        info=info,
        inputs=inputs,
        targets=targets,
        splits=splits,
        sample_ids=[sid for sid, _ in placed],
    )


@dataclass
class TextVersion(DataVersion):
    """A text data version: `splits` are the placed documents' rows, `tokens` each split's token array (memory-mapped,
    every document followed by <|endoftext|>), `tokenizer_file` the tokenizer it was tokenized with. `inputs` and
    `targets` are empty: a language-model task cuts its windows from `tokens`."""

    tokens: dict[str, Any] = field(default_factory=dict)
    tokenizer_file: Optional[Path] = None

    @property
    def classes(self) -> Optional[list[str]]:
        return None


def _load_text_version(path: Path, info: dict[str, Any]) -> TextVersion:
    empty = np.zeros(0, dtype=np.int64)
    if has_fields(info):  # chunk shards read through their checked blocks: a small stream whole now
        specs = field_specs(info)
        tokens = {name: array_of(specs[token_field(name)], path / FIELDS_FOLDER, IN_MEMORY_BYTES) for name in SPLITS}
        documents = int(np.fromfile(path / PLACED_FILE, dtype=np.uint8).size)
        return TextVersion(version=info["data_version"], path=path, info=info, inputs=empty, targets=empty,
                           splits=placed_splits(path, documents), sample_ids=ManifestIds(path / "manifest.csv", documents),  # type: ignore[arg-type]
                           tokens=tokens, tokenizer_file=path / "tokenizer.json")
    with open(path / "manifest.csv", newline="", encoding="utf-8") as f:
        placed = [(row["sample_id"], row["split"]) for row in csv.DictReader(f) if row["status"] == "ok"]
    dtype = np.dtype(str((info.get("tokenizer") or {}).get("dtype") or "uint16")).newbyteorder("<")
    tokens: dict[str, Any] = {}
    for name in SPLITS:
        file = path / "tokens" / f"{name}.bin"
        count = int((info.get("tokens") or {}).get(name) or 0)
        if file.stat().st_size != count * dtype.itemsize:
            raise RunFailed(f"{file}: data version {path.name[:12]} holds {file.stat().st_size} bytes, not the {count} tokens its version.json "
                            f"counts; remove {path} and prepare it again")
        tokens[name] = np.memmap(file, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype=dtype)
    splits = {name: np.array([row for row, (_, split) in enumerate(placed) if split == name], dtype=np.int64) for name in SPLITS}
    return TextVersion(version=info["data_version"], path=path, info=info, inputs=empty, targets=empty, splits=splits,
                       sample_ids=[sid for sid, _ in placed], tokens=tokens, tokenizer_file=path / "tokenizer.json")


# ---------------------------------------------------------------- whether a stored version is intact

REPORT_NAME = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")  # a relative path of plain names (no NUL; `.` and `..` parts refused too)


def data_version_problems(version: str, read: Callable[[str], bytes], sha256_of: Callable[[str], str],
                          names: Optional[list[str]] = None, size_of: Optional[Callable[[str], int]] = None) -> list[dict[str, str]]:
    """Whether a prepared data version is intact, wherever its files are (a workspace folder for
    verify and every command that opens it, an archive's members for import): version.json and
    manifest.csv readable, the manifest and (recipe 3 on) every bound file hashing to `version`, the report
    files matching version.json, and, when `names` lists the files present, nothing else there.

    `read` and `sha256_of` take a file name inside the version and raise OSError or KeyError when
    it is missing. Returns [{"path" (inside the version), "kind", "detail"}], empty when intact.
    Versions of recipe 2 and before bind only the manifest; their arrays are checked against version.json.
    The shards of a version's fields (recipe 7 on) are read and every block hashed; with `size_of` (opening a version,
    whose reader checks each block it reads) only their presence and size are checked.
    """
    changed = _changed

    try:
        info = json.loads(read("version.json"))
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
    except (OSError, KeyError):
        return [changed("version.json", "version.json is missing")]
    except ValueError as err:  # JSON or UTF-8
        return [changed("version.json", f"version.json is not readable ({err})")]
    problems = []
    rows: Optional[list[dict[str, str]]] = None
    # a fields recipe binds the manifest by its SHA-256 (in `files`): opening hashes it without parsing its rows,
    # a whole check (verify, import) parses them too, to compare them with the placed rows
    parse = not (has_fields(info) and size_of is not None)
    try:
        rows = list(csv.DictReader(io.StringIO(read("manifest.csv").decode("utf-8"), newline=""))) if parse else []
    except (OSError, KeyError):
        problems.append(changed("manifest.csv", "manifest.csv is missing"))
    except (ValueError, csv.Error) as err:  # UTF-8 or CSV
        problems.append(changed("manifest.csv", f"manifest.csv is not readable ({err})"))
    if rows is not None:
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
    recipe3 = recipe >= 3 or info.get("kind") == "text"
    bound = bound_files(info)
    if recipe3:
        files, reports = info.get("files"), info.get("reports")
        if not isinstance(files, dict) or not isinstance(reports, dict) or set(files) != set(bound) \
                or not all(isinstance(e, dict) for e in files.values()):
            return problems + [changed("version.json", "its tables of files are missing or malformed")]
        # a report is any other plain file of the folder: never one the id binds, never a path that leaves it
        odd = [name for name in reports if not isinstance(name, str) or name in set(bound) | {"version.json", CARD_FILE}
               or not REPORT_NAME.fullmatch(name) or {".", ".."} & set(name.split("/")) or not isinstance(reports[name], str)
               or name.startswith(FIELDS_FOLDER + "/")]
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
    shards: dict[str, Any] = {}
    if has_fields(info):
        try:
            shards = {f"{FIELDS_FOLDER}/{e.id[:2]}/{e.id}": e for spec in field_specs(info).values() for e in spec.shards}
        except ShardError as err:
            return problems + [changed("version.json", f"its table of fields is malformed ({err})")]
        for name, entry in sorted(shards.items()):
            problems += _shard_problems(name, entry, read, size_of)
        if parse and rows:
            problems += _placement_problems(rows, read)
    if recipe3 and names is not None:
        for name in sorted(set(names) - set(expected) - set(shards) - {"version.json", CARD_FILE}):
            problems.append(changed(name, f"{name} is not part of the data version"))
    return problems


def _placement_problems(rows: list[dict[str, str]], read: Callable[[str], bytes]) -> list[dict[str, str]]:
    """The placed rows' splits (PLACED_FILE) against the manifest's: training reads the one, a person or a raw-data
    check the other, so they must say the same."""
    try:
        placed = read(PLACED_FILE)
        wanted = bytes(SPLITS.index(row["split"]) for row in rows if row.get("status") == "ok")
    except (OSError, KeyError):
        return [_changed(PLACED_FILE, f"{PLACED_FILE} is missing")]
    except (ValueError, TypeError):
        return [_changed("manifest.csv", "a placed sample of the manifest names no split (train, val or test)")]
    if placed != wanted:
        return [_changed(PLACED_FILE, f"{PLACED_FILE} places {len(placed)} rows otherwise than the manifest's {len(wanted)} placed samples")]
    return []


def placed_splits(path: Path, rows: int) -> dict[str, np.ndarray]:
    """A fields version's row indices per split, from PLACED_FILE (bound by its SHA-256; `rows`: the fields' rows)."""
    placed = np.fromfile(path / PLACED_FILE, dtype=np.uint8)
    if len(placed) != rows or (len(placed) and placed.max() >= len(SPLITS)):
        raise RunFailed(f"{path / PLACED_FILE}: data version {path.name[:12]} places {len(placed)} rows, its fields hold {rows}; "
                        f"remove {path} and prepare it again")
    return {name: np.flatnonzero(placed == k).astype(np.int64) for k, name in enumerate(SPLITS)}


class ManifestIds(Sequence[str]):
    """The placed samples' ids in row order, read from the manifest the first time one is asked for (training a large
    version never asks): a sequence of `count` strings."""

    def __init__(self, manifest: Path, count: int) -> None:
        self.manifest, self.rows = manifest, count
        self._ids: Optional[list[str]] = None

    def _all(self) -> list[str]:
        if self._ids is None:
            with open(self.manifest, newline="", encoding="utf-8") as f:
                ids = [row["sample_id"] for row in csv.DictReader(f) if row["status"] == "ok"]
            if len(ids) != self.rows:
                raise RunFailed(f"{self.manifest}: {len(ids)} placed samples, the data version's fields hold {self.rows} rows; "
                                f"remove {self.manifest.parent} and prepare it again")
            self._ids = ids
        return self._ids

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: Any) -> Any:
        return self._all()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def _changed(name: str, detail: str) -> dict[str, str]:
    return {"path": name, "kind": "data_version_changed", "detail": detail}


def _shard_problems(name: str, entry: Any, read: Callable[[str], bytes], size_of: Optional[Callable[[str], int]]) -> list[dict[str, str]]:
    """One shard file against its entry: every block hashed, or with `size_of` its size alone."""
    try:
        if size_of is not None:
            size = size_of(name)
            return [] if size == entry.size else [_changed(name, f"{name} holds {size} bytes, its entry in version.json {entry.size}")]
        data = memoryview(read(name))
    except (OSError, KeyError):
        return [_changed(name, f"{name} is missing")]
    if len(data) != entry.size:
        return [_changed(name, f"{name} holds {len(data)} bytes, its entry in version.json {entry.size}")]
    for index, digest in enumerate(entry.blocks):
        if hashlib.sha256(data[index * BLOCK:(index + 1) * BLOCK]).hexdigest() != digest:
            return [_changed(name, f"{name}: block {index} does not match its SHA-256 in version.json")]
    return []


def data_summary(data: DataVersion) -> dict[str, Any]:
    """What a run record says about its data: the version, counts, findings by kind, the card (`data` in docs/record.md)."""

    report = data.report()
    for kind, count in report["findings_by_kind"].items():
        log.debug("data finding: %s × %d", kind, count)
    quarantined = len(report["quarantined"])
    warnings = {k: n for k, n in report["findings_by_kind"].items() if k not in {q["kind"] for q in report["quarantined"]}}
    if quarantined:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(q["kind"] for q in report["quarantined"]).items()))
        log.warning("data: %d sample(s) quarantined (%s); see %s", quarantined, kinds, data.path / "data_report.md")
    if warnings:
        log.info("data: findings %s; see %s", ", ".join(f"{k} {n}" for k, n in warnings.items()), data.path / "data_report.md")
    for warning in report["card_warnings"]:
        log.warning("data: %s", warning)
    return {
        "version": data.version,
        "path": str(data.path),
        "source": report["source"],
        "counts": data.counts,
        "classes": data.classes,
        "quarantined": quarantined,
        "findings_by_kind": report["findings_by_kind"],
        "leakage_pairs": report["leakage"]["cross_split_duplicate_pairs"],
        "hash_algorithm": report["hash_algorithm"],
        "recipe": data.info.get("format"),
        # the version's own record (its report tables included), so the run's seal covers the data version too
        "version_json_sha256": sha256_file(data.path / "version.json"),
        "summary": report.get("summary"),  # quarantined by kind, achieved split, label issues, outliers (recipe 3 on)
        "card": report["card"],
        # a text data version: its tokenizer (kind, ids, the SHA-256 of its file, which the version id binds) and tokens per split
        **({"tokenizer": data.info.get("tokenizer"), "tokens": data.info.get("tokens")} if data.info.get("kind") == "text" else {}),
    }


def tokenizer_difference(recorded: Optional[Mapping[str, Any]], data: DataVersion) -> Optional[str]:
    """How the tokenizer of `data` differs from the one a run recorded (its record's `data` section), or None when they are
    the same bytes, or when neither is a text data version. A model is only meaningful with the ids it was trained on:
    a difference is refused by every caller, never warned about. The file itself is hashed, not its recorded digest."""
    if "tokenizer" not in (recorded or {}):  # nothing recorded to compare with: image data, or a reproduction's first record
        return None
    was = (recorded or {}).get("tokenizer") or {}
    file = getattr(data, "tokenizer_file", None)
    now = sha256_file(file) if file is not None and Path(file).is_file() else None
    if was.get("sha256") == now:
        return None
    info = data.info.get("tokenizer") or {}
    return (f"the tokenizer is {now[:12] if now else 'missing'} ({info.get('kind', '?')}, {info.get('vocab_size', '?')} tokens), but the run "
            f"was trained with {str(was.get('sha256') or 'none')[:12]} ({was.get('kind', '?')}, {was.get('vocab_size', '?')} tokens)")
