"""The MLCommons Croissant 1.0 record of a data version (`.veritrain/data/<version>/`): a schema.org Dataset with
the data card's name, license, origin and citation, a FileObject (size, SHA-256, format) for every file the version
binds by its hash and a FileSet of the shards of each of its fields (data recipe 7 on), the RecordSets `manifest` (one record per sample: id, size, content hash, label, split, status),
`quarantine` and `splits` (the cr:Split convention, with each split's count), and the Responsible-AI fields
filled from the card and from what the data gate measured (class balance, label issues, quarantine, the secret
and e-mail scanner), always as counts, never as the values flagged.

    from veritrain.data import croissant
    warnings = croissant.write(version_dir, Path("croissant.json"))   # then: mlcroissant validate --jsonld croissant.json

Nothing is invented: a card field left empty stays out of the document, or its RAI property says it was not
given, and `write` returns one warning for it in the words of `data.report.card_warnings`. `version` is
`0.0.0+<version id>` (Croissant wants a semantic version; a data version has no order, so the id is the build
part) and `identifier` is the id itself. `datePublished`/`dateCreated` come from version.json's `created_at`
and are left out where it has none (text versions), which mlcroissant reports as a recommended property missing.

Where the files are (contentUrl). mlcroissant resolves a contentUrl that is not an http(s) URL as a path joined to
the folder of the JSON-LD file it was given (pathlib's `/`, so an absolute path stays itself). So:

- `base=None` gives paths relative to the version folder ("manifest.csv", "splits/train.txt"): right for a
  document that sits in the version folder (or in the temporary folder that becomes it, then renamed with it);
- `base="<folder or URL>"` gives `base + "/" + relative path`: an absolute folder for a document kept anywhere on
  this machine, the URL a copy of the version is served from for a published document;
- `write` chooses by itself when `base` is None: relative paths when `out` is in the version folder, else the
  version folder's absolute path (resolved), so a file written elsewhere (`veritrain data croissant -o x.json`)
  loads as it is, as long as the version stays where it is. Pass `base` to publish without local paths.

SHA-256 values are those version.json binds (recipe 3 on, and text versions); a version from an earlier recipe
binds only its arrays' hashes, so its other files are hashed when the document is made. The manifest is read once,
row by row, keeping counters only: time and memory are linear in the samples, the memory bounded.

mlcroissant reads CSV columns with pandas, which guesses their types: a column of integer-looking labels comes back
as `b"3"` (and as `b"3.0"` when another row's label is empty), empty cells as NaN, text as bytes. The document
declares every manifest column as sc:Text; the guessing is the reader's.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from veritrain.core.errors import UserError
from veritrain.core.files import write_atomic
from veritrain.core.hashing import sha256_file
from veritrain.data.identity import CARD_FILE, FIELDS_FOLDER, bound_files, field_specs, has_fields, recipe_of
from veritrain.data.report import card_gaps
from veritrain.data.split import SPLITS

CONFORMS_TO = "http://mlcommons.org/croissant/1.0"

# The Croissant 1.0 JSON-LD context, as mlcroissant 1.x writes it (`mlcroissant._src.core.rdf.make_context`): any
# other context makes its validator warn that the context is not standard
CONTEXT: dict[str, Any] = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}

SPLIT_URLS = {"train": "cr:TrainingSplit", "val": "cr:ValidationSplit", "test": "cr:TestSplit"}  # the Croissant 1.0 split names

ENCODING_FORMATS = {".csv": "text/csv", ".txt": "text/plain", ".json": "application/json", ".npy": "application/x-npy",
                    ".bin": "application/octet-stream"}

# card fields (data.card, core.config.schema.DataCard, and keys a hand-edited card.json may add) → Dataset properties;
# `origin` and the RAI fields are placed by `_card_properties`. A creator is schema.org's `author` (the same property
# for a CreativeWork, schema.org says): its `creator` must be a typed Person or Organization for mlcroissant, and the
# card does not say which
CARD_PROPERTIES = {"name": "name", "description": "description", "license": "license", "citation": "citeAs", "cite_as": "citeAs",
                   "citeAs": "citeAs", "url": "url", "creator": "author", "contact": "maintainer"}

@dataclass
class _Manifest:
    """What one pass over manifest.csv counts: its columns, its rows, and the placed rows per split."""

    columns: list[str]
    rows: int = 0
    placed: Counter[str] = field(default_factory=Counter)
    quarantined: int = 0


def document(version_dir: Path, card: Optional[dict[str, Any]] = None, *, base: Optional[str] = None) -> dict[str, Any]:
    """The Croissant JSON-LD of the data version in `version_dir`, with `card` (else the version's card.json) as
    its data card. `base`: the prefix of every contentUrl (see the module's docstring); None: paths relative to
    the version folder."""
    version_dir = Path(version_dir)
    info = _read_json(version_dir / "version.json", "version.json")
    if not isinstance(info, dict) or not isinstance(info.get("data_version"), str):
        raise UserError(f"{version_dir}: not a data version (its version.json names no data_version); give a folder under .veritrain/data/")
    card = _read_card(version_dir) if card is None else card
    report = _read_report(version_dir)
    algorithm = str(info.get("hash_algorithm") or "blake3")
    manifest = _scan_manifest(version_dir / "manifest.csv")
    quarantine = _scan_quarantine(version_dir / "quarantine.csv")
    name = _text(card.get("name")) if card.get("name") else f"veritrain data version {info['data_version'][:12]}"
    dataset: dict[str, Any] = {
        "@context": CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": CONFORMS_TO,
        "name": name,
        "description": _summary(info, manifest),
        "version": f"0.0.0+{info['data_version']}",
        "identifier": info["data_version"],
        "distribution": _file_objects(version_dir, info, base) + _field_sets(info, base),
        "recordSet": [_splits_record_set(info, manifest), _manifest_record_set(info, manifest, algorithm), _quarantine_record_set()],
        "rai:dataCollectionRawData": _raw_data(info),
        "rai:dataPreprocessingProtocol": _preprocessing(info),
        "rai:dataBiases": _biases(info, report, manifest, quarantine),
        "rai:personalSensitiveInformation": _sensitive(info, report),
    }
    if isinstance(info.get("created_at"), str):
        dataset["datePublished"] = dataset["dateCreated"] = info["created_at"]
    dataset.update(_card_properties(card, info, name))
    return dataset


def write(version_dir: Path, out: Path, card: Optional[dict[str, Any]] = None, *, base: Optional[str] = None) -> list[str]:
    """Write `document` to `out` (sorted keys, 2-space indent, UTF-8, a trailing newline; replaced atomically)
    and return the warnings: one per card field left empty, naming it. Writes nothing but `out` (and its temp
    file beside it). With `base` None, contentUrls are relative when `out` is in the version folder, else the
    version folder's absolute path."""
    version_dir, out = Path(version_dir), Path(out)
    folder = version_dir.resolve()
    target = out.resolve()
    if target.is_relative_to(folder) and target.relative_to(folder).as_posix() in _version_files(version_dir) | {"version.json", CARD_FILE}:
        raise UserError(f"{out}: that is a file of the data version; write the Croissant record to another name (croissant.json)")
    if not target.parent.is_dir():
        raise UserError(f"{out}: its folder {out.parent} does not exist; create it or give another path")
    if base is None and target.parent != folder:
        base = str(folder)
    card = _read_card(version_dir) if card is None else card
    doc = document(version_dir, card, base=base)
    text = json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a hand-edited card holding a lone surrogate (valid JSON, not Unicode): kept as its \u escape
        data = (json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")
    write_atomic(target, data)
    return card_gaps(card)


# ---------------------------------------------------------------- reading the version


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path.parent}: not a data version ({what} is missing); give a folder under .veritrain/data/") from None
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: {what} is not readable ({err.__class__.__name__}: {err}); `veritrain verify` on a run that uses it says more") from None


def _read_card(version_dir: Path) -> dict[str, Any]:
    """The version's card.json ({} when there is none: every required field is then reported missing)."""
    if not (version_dir / CARD_FILE).exists():
        return {}
    card = _read_json(version_dir / CARD_FILE, CARD_FILE)
    if not isinstance(card, dict):
        raise UserError(f"{version_dir / CARD_FILE}: the data card is not a JSON object; fix it, or prepare the data again to rewrite it")
    return card


def _read_report(version_dir: Path) -> dict[str, Any]:
    """data_report.json ({} when missing or unreadable: the RAI fields then say the report is not there)."""
    try:
        report = json.loads((version_dir / "data_report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def _scan_manifest(path: Path) -> _Manifest:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            columns = next(reader, [])
            manifest = _Manifest(columns)
            split_at, status_at = _index(columns, "split"), _index(columns, "status")
            for row in reader:
                manifest.rows += 1
                if status_at is not None and status_at < len(row) and row[status_at] != "ok":
                    manifest.quarantined += 1
                elif split_at is not None and split_at < len(row):
                    manifest.placed[row[split_at]] += 1
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UserError(f"{path}: the manifest is not readable ({err.__class__.__name__}: {err}); `veritrain verify` on a run that uses it says more") from None
    return manifest


def _index(columns: list[str], name: str) -> Optional[int]:
    return columns.index(name) if name in columns else None


def _scan_quarantine(path: Path) -> Counter[str]:
    """Quarantined samples by kind (quarantine.csv: sample_id, kind, reason)."""
    kinds: Counter[str] = Counter()
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            kind_at = _index(next(reader, []), "kind")
            for row in reader:
                kinds[row[kind_at] if kind_at is not None and kind_at < len(row) else "?"] += 1
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UserError(f"{path}: the quarantine list is not readable ({err.__class__.__name__}: {err}); `veritrain verify` on a run that uses it says more") from None
    return kinds


def _version_files(version_dir: Path) -> set[str]:
    """The files a version's version.json names (bound and report files), which `write` never replaces."""
    try:
        info = json.loads((version_dir / "version.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(info, dict):
        return set()
    return set(bound_files(info)) | set(info.get("files") or {}) | set(info.get("reports") or {}) | set(info.get("arrays_sha256") or {})


# ---------------------------------------------------------------- the resources and record sets


def _file_objects(version_dir: Path, info: dict[str, Any], base: Optional[str]) -> list[dict[str, Any]]:
    """A FileObject per bound file: the size and SHA-256 version.json records, else (earlier recipes) measured now."""
    recorded = _dict(info.get("files"))
    arrays = _dict(info.get("arrays_sha256"))
    names = list(recorded) if recorded else [name for name in bound_files(info) if (version_dir / name).is_file()]
    objects = []
    for name in names:
        entry = _dict(recorded.get(name))
        size = entry.get("size", entry.get("bytes"))
        digest = entry.get("sha256") or arrays.get(name)
        if not isinstance(size, int) or not isinstance(digest, str):
            size, digest = (version_dir / name).stat().st_size, sha256_file(version_dir / name)
        objects.append({
            "@type": "cr:FileObject",
            "@id": name,
            "name": name,
            "description": _file_description(name, info),
            "contentUrl": name if base is None else base.rstrip("/") + "/" + name,
            "contentSize": f"{size} B",
            "sha256": digest,
            "encodingFormat": ENCODING_FORMATS.get(os.path.splitext(name)[1], "application/octet-stream"),
        })
    return objects


def _field_sets(info: dict[str, Any], base: Optional[str]) -> list[dict[str, Any]]:
    """A FileSet per field of the version (recipe 7 on): its shard files (under `base` as contentUrls are), which
    version.json's `fields` binds block by block (docs/shards.md; a shard's file has no one SHA-256 of its own there,
    so the FileSet names none)."""
    prefix = "" if base is None else base.rstrip("/") + "/"
    if not has_fields(info):
        return []
    sets = []
    for name, spec in field_specs(info).items():
        if not spec.shards:  # an empty field (a split without documents): no file to name
            continue
        shape = f"{spec.shape} {spec.dtype} " if spec.layout == "array" else "UTF-8 text "
        rows = ("a split's token stream: its documents in id order, each followed by <|endoftext|>, cut into chunks after "
                "whole documents" if info.get("kind") == "text" else "row i is the i-th sample the manifest marks ok")
        sets.append({
            "@type": "cr:FileSet",
            "@id": f"{FIELDS_FOLDER}/{name}",
            "name": f"{FIELDS_FOLDER}/{name}",
            "description": (f"The field {name}: {spec.rows} rows of {shape}(shard layout {spec.layout}), in {len(spec.shards)} shard(s) "
                            f"listed in order with the SHA-256 of every 1 MiB block in version.json's `fields`; {rows}. The shard format "
                            "is described in veritrain's docs/shards.md."),
            "encodingFormat": "application/octet-stream",
            "includes": [f"{prefix}{FIELDS_FOLDER}/{entry.id[:2]}/{entry.id}" for entry in spec.shards],
        })
    return sets


def _file_description(name: str, info: dict[str, Any]) -> str:
    split = Path(name).stem
    tokenizer = _dict(info.get("tokenizer"))
    if name == "manifest.csv":
        return ("One row per sample, quarantined ones included: its id, size in bytes, content hash "
                f"({info.get('hash_algorithm')}), label, split and status (ok or quarantined).")
    if name == "quarantine.csv":
        return "The quarantined samples: id, kind of finding and reason."
    if name.startswith("splits/"):
        return f"The sample ids of the {split} split, one per line."
    if name == "inputs.npy":
        return f"The placed samples' inputs (NumPy), one row of shape {info.get('input_shape')} and dtype {info.get('input_dtype')} each."
    if name == "targets.npy":
        return f"The placed samples' targets (NumPy, dtype {info.get('target_dtype')}), one per row of inputs.npy" + (
            ": the index of the label in the classes." if info.get("classes") else ".")
    if name == "tokenizer.json":
        return f"The tokenizer the documents were tokenized with ({tokenizer.get('kind')}, {tokenizer.get('vocab_size')} ids)."
    if name.startswith("tokens/"):
        return (f"The {split} split's tokens ({tokenizer.get('dtype')}, little-endian): its documents in id order, "
                "each followed by <|endoftext|>.")
    return name


def _column_field(column: str, data_type: Any, description: str, **extra: Any) -> dict[str, Any]:
    return {"@type": "cr:Field", "@id": f"manifest/{column}", "name": column, "description": description, "dataType": data_type,
            "source": {"fileObject": {"@id": "manifest.csv"}, "extract": {"column": column}}, **extra}


def _manifest_record_set(info: dict[str, Any], manifest: _Manifest, algorithm: str) -> dict[str, Any]:
    text = info.get("kind") == "text"
    described = {
        "sample_id": ("sc:Text", "The sample's id: its path under data.root, its source's own id, or `<source>#<index>`."),
        "size": ("sc:Integer", "The sample's size in bytes (empty when it could not be read)."),
        algorithm: ("sc:Text", f"The {algorithm} hash of the sample's bytes" + (" (of the normalized text as UTF-8)" if text else "")
                    + ", which the version id binds."),
        "label": ("sc:Text" if text else ["sc:Text", "cr:Label"], "Empty: documents have no label." if text else "The sample's label."),
        "split": ("sc:Text", "The split it is placed in (train, val or test); empty when quarantined."),
        "status": ("sc:Text", "ok, or quarantined (see quarantine.csv)."),
        "key": ("sc:Text", "The key that placed it: the source's own id; empty when its content hash is the key."),
        "unit": ("sc:Text", "The key of the unit (a group kept in one split) that placed it, when that is another member's."),
    }
    fields = []
    for column in manifest.columns:
        data_type, description = described.get(column, ("sc:Text", column))
        extra = {"references": {"field": {"@id": "splits/name"}}} if column == "split" else {}
        fields.append(_column_field(column, data_type, description, **extra))
    return {"@type": "cr:RecordSet", "@id": "manifest", "name": "manifest", "field": fields,
            "description": f"The {manifest.rows} samples of manifest.csv, one record each ({manifest.quarantined} quarantined)."}


def _quarantine_record_set() -> dict[str, Any]:
    def column(name: str, description: str) -> dict[str, Any]:
        return {"@type": "cr:Field", "@id": f"quarantine/{name}", "name": name, "description": description, "dataType": "sc:Text",
                "source": {"fileObject": {"@id": "quarantine.csv"}, "extract": {"column": name}}}

    return {"@type": "cr:RecordSet", "@id": "quarantine", "name": "quarantine",
            "description": "The samples the data gate kept out of every split, with the finding that did.",
            "field": [column("sample_id", "The sample's id, as in the manifest."), column("kind", "The kind of finding."),
                      column("reason", "What was found.")]}


def _splits_record_set(info: dict[str, Any], manifest: _Manifest) -> dict[str, Any]:
    """The splits as Croissant 1.0 defines them (a RecordSet of dataType cr:Split, which the manifest's split
    column references), with the samples placed in each (and, for text, its tokens)."""
    tokens = info.get("tokens") if isinstance(info.get("tokens"), dict) else None
    fields = [
        {"@type": "cr:Field", "@id": "splits/name", "name": "name", "dataType": "sc:Text", "description": "The split's name in the manifest."},
        {"@type": "cr:Field", "@id": "splits/url", "name": "url", "dataType": "sc:URL", "description": "The Croissant split it is."},
        {"@type": "cr:Field", "@id": "splits/samples", "name": "samples", "dataType": "sc:Integer", "description": "Samples placed in it."},
    ]
    if tokens is not None:
        fields.append({"@type": "cr:Field", "@id": "splits/tokens", "name": "tokens", "dataType": "sc:Integer",
                       "description": "Tokens in its token array."})
    data = []
    for name in SPLITS:
        row: dict[str, Any] = {"splits/name": name, "splits/url": SPLIT_URLS[name], "splits/samples": manifest.placed.get(name, 0)}
        if tokens is not None:
            row["splits/tokens"] = int(tokens.get(name) or 0)
        data.append(row)
    return {"@type": "cr:RecordSet", "@id": "splits", "name": "splits", "dataType": "cr:Split", "key": {"@id": "splits/name"},
            "description": "The train, val and test splits.", "field": fields, "data": data}


# ---------------------------------------------------------------- the card and what the data gate found


def _dict(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else {} (an older or hand-edited file may lack a table or hold another type)."""
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    """A card value as text: a string exactly as given, anything else as its JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _card_properties(card: dict[str, Any], info: dict[str, Any], name: str) -> dict[str, Any]:
    """The Dataset properties the card gives: only the fields it fills; the RAI fields it leaves empty say so."""
    found: dict[str, Any] = {}
    for key, prop in CARD_PROPERTIES.items():
        if card.get(key) and prop not in found and prop != "name":  # the name is chosen by `document`
            found[prop] = _text(card[key])
    origin = card.get("origin")
    if isinstance(origin, dict):  # a hand-edited card may give {source, url, creator, ...}
        based = [_text(origin[k]) for k in ("source", "url") if origin.get(k)]
        based += [f"{k}: {_text(v)}" for k, v in origin.items() if k not in ("source", "url", "creator") and v]
        if based:
            found["isBasedOn"] = based if len(based) > 1 else based[0]
        if origin.get("creator") and "author" not in found:
            found["author"] = _text(origin["creator"])
    elif origin:
        found["isBasedOn"] = _text(origin)
    if "citeAs" not in found:  # the data version itself, by the facts it has: its name, id and date, and the origin as given
        based, date = found.get("isBasedOn"), info.get("created_at")
        found["citeAs"] = (f"{name + ', ' if card.get('name') else ''}veritrain data version {info['data_version']}"
                           + (f", prepared {date[:10]}" if isinstance(date, str) else "")
                           + (f"; data from: {based if isinstance(based, str) else '; '.join(based)}" if based else "") + ".")
    found["rai:dataCollection"] = _text(card["collection"]) if card.get("collection") else "Not given (data.card.collection is empty)."
    found["rai:dataLimitations"] = _text(card["limitations"]) if card.get("limitations") else "Not given (data.card.limitations is empty)."
    return found


def _summary(info: dict[str, Any], manifest: _Manifest) -> str:
    kind = "text" if info.get("kind") == "text" else "image"
    source = info.get("source") or _dict(_dict(info.get("preprocessing")).get("data")).get("source")
    placed = ", ".join(f"{name} {manifest.placed.get(name, 0)}" for name in SPLITS)
    classes = info.get("classes")
    return (f"Data version {info['data_version']}, prepared by veritrain ({kind} data, recipe {recipe_of(info)}) from the {source!s} source: "
            f"{sum(manifest.placed.values())} {'documents' if kind == 'text' else 'samples'} placed ({placed}), {manifest.quarantined} quarantined"
            + (f"; {len(classes)} classes" if isinstance(classes, list) else "") + ". The id binds every sample's content hash, label and split.")


def _raw_data(info: dict[str, Any]) -> str:
    data = _dict(_dict(info.get("preprocessing")).get("data"))
    parts = [f"Read by veritrain from the {info.get('source') or data.get('source')!s} source."]
    origin = info.get("origin")
    if isinstance(origin, dict) and origin:
        parts.append("The source describes itself as: " + "; ".join(f"{k}: {_text(v)}" for k, v in origin.items()) + ".")
    raw = info.get("raw_files")
    if isinstance(raw, list) and raw:
        shown = [f"{r.get('path')} ({r.get('bytes')} bytes, sha256 {r.get('sha256')})" for r in raw[:5] if isinstance(r, dict)]
        more = f" and {len(raw) - 5} more" if len(raw) > 5 else ""
        parts.append(f"Raw files ({len(raw)}): " + ", ".join(shown) + more + ".")
    if isinstance(info.get("listing_sha256"), str):
        parts.append(f"The listing of the raw samples (ids, groups, fixed splits, timestamps) hashes to sha256 {info['listing_sha256']}.")
    ignored = info.get("ignored")
    if isinstance(ignored, dict) and ignored.get("count"):
        parts.append(f"{ignored['count']} file(s) under data.root are not images by their extension and were ignored.")
    return " ".join(parts)


def _preprocessing(info: dict[str, Any]) -> str:
    data = _dict(_dict(info.get("preprocessing")).get("data"))
    split = (f"Split by data.split_by {data.get('split_by')!s}, data.split_seed {data.get('split_seed')!s}, "
             f"data.split_ratios {data.get('split_ratios')!s}" + (f", test split carried from {data['test_from']}" if data.get("test_from") else "") + ".")
    if info.get("kind") == "text":
        tokenizer = _dict(info.get("tokenizer"))
        contamination = _dict(info.get("contamination"))
        return (f"Prepared by veritrain, text recipe {recipe_of(info)}. {split} Exact and near duplicates kept in one split; train documents "
                f"sharing a {contamination.get('ngram_words')}-word n-gram with val or test handled by data.text.on_contamination "
                f"{contamination.get('policy')}. Tokenized by a {tokenizer.get('kind')} tokenizer ({tokenizer.get('vocab_size')} ids, sha256 "
                f"{tokenizer.get('sha256')}) into one {tokenizer.get('dtype')} array per split: "
                + ", ".join(f"{name} {_dict(info.get('tokens')).get(name)}" for name in SPLITS) + " tokens.")
    norm = _dict(info.get("normalization"))
    return (f"Prepared by veritrain, data recipe {recipe_of(info)}. Each placed sample decoded to shape {info.get('input_shape')} "
            f"{info.get('input_dtype')}, targets {info.get('target_dtype')}. Normalization statistics computed on the "
            f"{norm.get('computed_on')} split (scale {norm.get('scale')}): mean {norm.get('mean')}, std {norm.get('std')}. {split}")


def _findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    found = report.get("findings")
    return [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []


def _class_balance(info: dict[str, Any]) -> list[str]:
    per_class = info.get("counts_per_class")
    if not isinstance(per_class, dict) or not per_class:
        return ["No class labels (a regression target): class balance does not apply." if info.get("kind") != "text"
                else "Documents have no labels: class balance does not apply."]
    totals: Counter[str] = Counter()
    for counts in per_class.values():
        totals.update({str(name): int(n) for name, n in _dict(counts).items()})
    splits = list(per_class)
    rows = "; ".join(f"{name!r} " + " / ".join(str(_dict(per_class[s]).get(name, 0)) for s in splits) for name in totals)
    big, small = max(totals, key=lambda c: totals[c]), min(totals, key=lambda c: totals[c])
    ratio = f"{totals[big] / totals[small]:.2f}" if totals[small] else "unbounded"
    limit = _dict(_dict(info.get("preprocessing")).get("data")).get("imbalance_ratio")
    return [f"Placed samples per class ({' / '.join(splits)}): {rows}.",
            f"Largest class {big!r} has {totals[big]} samples, smallest {small!r} {totals[small]} (ratio {ratio}"
            + (f"; the gate flags imbalance from data.imbalance_ratio {limit})." if limit is not None else ").")]


def _biases(info: dict[str, Any], report: dict[str, Any], manifest: _Manifest, quarantine: Counter[str]) -> str:
    """Class balance, imbalance findings, label issues, outliers, duplicates, split skew, contamination and the
    quarantine, with their numbers, from version.json, the data report and quarantine.csv."""
    parts = _class_balance(info)
    findings = _findings(report)
    kinds = Counter(str(f.get("kind")) for f in findings)
    if not report:
        parts.append("The data report (data_report.json) is missing: the gate's findings are not known.")
    for f in (f for f in findings if f.get("kind") == "imbalance"):
        parts.append(f"Imbalance found: {_text(f.get('reason') or f.get('detail'))}.")
    summary = _dict(report.get("summary"))
    if info.get("kind") != "text" and report and "label_issues" not in summary:
        parts.append(f"Label issues and outliers: not checked (data recipe {recipe_of(info)} predates the check).")
    elif info.get("kind") != "text" and report:
        issues = [f for f in findings if f.get("kind") == "label_issue"]
        parts.append(f"Label issues found: {len(issues)} ({sum(1 for f in issues if f.get('split') == 'test')} in the test split, reported and "
                     f"never removed; {sum(1 for f in issues if f.get('severity') == 'quarantine')} quarantined); outliers found: {kinds['outlier']}.")
    duplicates = {k: kinds[k] for k in ("duplicate", "conflicting_duplicate", "near_duplicate", "conflicting_near_duplicate",
                                        "exact_duplicate", "leak_duplicate", "split_leak") if kinds[k]}
    if duplicates:
        parts.append("Duplicate findings: " + ", ".join(f"{k} {n}" for k, n in duplicates.items()) + ".")
    skewed = _dict(summary.get("achieved_split")).get("skewed")
    if isinstance(skewed, list):
        reasons = ": " + "; ".join(map(_text, skewed)) if skewed else ""
        parts.append(f"Achieved split: {len(skewed)} class(es) skewed from the asked ratios{reasons}.")
    contamination = info.get("contamination")
    if isinstance(contamination, dict):
        parts.append(f"Contamination: {contamination.get('train_documents')} train document(s) shared a {contamination.get('ngram_words')}-word "
                     f"n-gram with {contamination.get('eval_documents_contaminated')} val/test document(s) (policy {contamination.get('policy')}).")
    by_kind = " (" + ", ".join(f"{k} {n}" for k, n in sorted(quarantine.items())) + ")" if quarantine else ""
    parts.append(f"Quarantined: {sum(quarantine.values())} of {manifest.rows}{by_kind}.")
    return " ".join(parts)


def _sensitive(info: dict[str, Any], report: dict[str, Any]) -> str:
    """What the scanner flagged, by kind and count (never the flagged text); images are not scanned."""
    if info.get("kind") != "text":
        return ("Not scanned: veritrain scans text documents for secrets and e-mail addresses; the samples of this image data version "
                "were not checked for personal or sensitive information.")
    if not report:
        return "Not known: the data report (data_report.json), which holds what the scanner flagged, is missing."
    secrets: Counter[str] = Counter()
    email_documents = addresses = 0
    for f in _findings(report):
        detail = str(f.get("detail") or "")
        if f.get("kind") == "secret":
            secrets[detail.removeprefix("holds ")] += 1
        elif f.get("kind") == "email":
            email_documents += 1
            count = detail.split(" ", 1)[0]
            addresses += int(count) if count.isdigit() else 0
    scanned = ("veritrain's scanner read every document it could read for secrets by their shape and for e-mail addresses (it does not "
               "detect names, postal addresses or other personal data); flagged documents are reported, not removed.")
    flagged = []
    if secrets:
        flagged.append(f"{sum(secrets.values())} document(s) hold a secret (" + ", ".join(f"{k}: {n}" for k, n in sorted(secrets.items())) + ")")
    if email_documents:
        flagged.append(f"{email_documents} document(s) hold {addresses} e-mail address(es)")
    return scanned + (" Flagged: " + "; ".join(flagged) + "." if flagged else " It flagged none.")
