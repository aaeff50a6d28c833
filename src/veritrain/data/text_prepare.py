"""The text data gate: documents of a text source (veritrain.data.text_sources) checked, split, decontaminated and
tokenized into an immutable data version under `.veritrain/data/<version>/`, as the image data stage does for
pictures. The stages run in this order:

1. **validate**: what the source could not read (invalid UTF-8, empty, over `data.text.max_chars`, a JSONL line
   that is not a document) is a finding; `data.on_bad_file` says whether it quarantines (default), warns or stops.
2. **duplicates**: texts are compared in `text_dedup.match_form` (NFKD, case folded, zero-width and format
   characters, accents and punctuation dropped, confusables folded to their UTS #39 prototypes), for matching only:
   what is stored and trained on stays as given. Exact duplicates (the same match form) and near duplicates
   (MinHash + LSH over word shingles, confirmed by exact Jaccard ≥ `data.text.near_duplicates.threshold`) are grouped: a group
   stays in one split. A group whose members the data fixes to different splits is a `split_leak`: its members
   outside the group's most protected split (test, then val) are quarantined.
3. **split**: every unit (a document, or a group) is placed by the hash of `data.split_seed` and its key (the
   JSONL `id`, else the content hash; a group by its smallest member key), with no class strata; a JSONL `split`
   fixes a document.
4. **decontaminate**: each val and test document's `data.text.ngram_words`-word n-grams, in order and as bags of
   words, against every train document, and against the train documents read as one stream (in source order and in
   token-file order, so text cut into short documents is found); a train document sharing one is `contamination`: removed from train by `data.text.on_contamination:
   quarantine` (val and test documents are never removed), reported by `warn`, stopping the prepare by `fail`.
5. **tokenizer**: byte-level, or BPE trained on the train split after decontamination (veritrain.data.tokenizer).
6. **tokenize**: each split's documents, in id order, each followed by <|endoftext|>, into the token stream
   `tokens_<split>`: an array field of chunk shards of the tokenizer's dtype (text recipe 3 on; docs/shards.md), read
   through checked blocks. Text recipe 2 wrote `tokens/<split>.bin`, which its versions keep.

Documents holding a secret by its shape (the run record's secret scanner) or an e-mail address are flagged as
`secret` and `email` findings (reported, not removed).

The version id is `identity.version_id` over the documents (id, content hash, split or quarantined), the
preprocessing config (the data config without locations, with the source's normalization) and the hash of every
file written: the tokenizer's bytes, its special-token ids and every block of every token chunk among them
(TEXT_FIELD_BOUND_FILES and `fields`).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import shutil
import time
import unicodedata
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import DATA_HASH_ALGORITHM, sha256_file
from veritrain.core.secrets import find_secret
from veritrain.data import identity, shards, split as splitting, text_dedup, tokenizer
from veritrain.data.identity import CARD_FILE, TEXT_FIELD_BOUND_FILES, TEXT_RECIPE, TextVersion
from veritrain.data.split import SPLITS
from veritrain.data.store import MANIFEST_COLUMNS, merged_card, seal_reports, write_data_card as write_card
from veritrain.data.text_sources import JsonlFields, TextDocument, TextFinding, TextListing, read_embedded, read_jsonl, read_text_folder

if TYPE_CHECKING:
    from veritrain.core.config import DataConfig

log = logging.getLogger("veritrain")

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
TOP_PAIRS = 20  # contamination pairs (and near-duplicate pairs) shown in the report
DOCUMENTS_PER_CHUNK = 4096  # documents a chunk shard of a token stream holds, on average (shards.cuts)


def load_text_source(data_cfg: DataConfig, paths: dict[str, Path]) -> TextListing:
    """The documents of `data.source` (text, jsonl or pydoc_topics)."""
    text = data_cfg.text
    if data_cfg.source == "pydoc_topics":
        return read_embedded(text.split_documents, text.max_chars)
    root = paths.get("root")
    if root is None:
        raise UserError(f"data.root: the {data_cfg.source} source reads its documents from data.root; give the folder"
                        + (" (or the .jsonl file)" if data_cfg.source == "jsonl" else ""))
    if not root.exists():
        raise UserError(f"data.root: {root} does not exist; give the folder of the documents")
    if data_cfg.source == "text":
        if not root.is_dir():
            raise UserError(f"data.root: {root} is not a folder; the text source reads the .txt files in a folder")
        return read_text_folder(root, text.split_documents, text.max_chars)
    fields = text.fields
    return read_jsonl(root, JsonlFields(fields.text, fields.id, fields.split, fields.group, fields.timestamp), text.max_chars)


@dataclass
class _Documents:
    """The documents as the gate places them: `split[i]` is a split name or None (quarantined, `excluded[i]` says why)."""

    docs: list[TextDocument]
    keys: list[str]  # what places each document: its JSONL id, else its content hash
    hashes: list[str]  # content hash (DATA_HASH_ALGORITHM of the normalized text as UTF-8)
    split: list[Optional[str]] = field(default_factory=list)
    excluded: dict[int, TextFinding] = field(default_factory=dict)
    findings: list[TextFinding] = field(default_factory=list)


def _content_hash(text: str) -> str:
    import blake3

    return blake3.blake3(text.encode("utf-8")).hexdigest()


def prepare(data_cfg: DataConfig, paths: dict[str, Path], workspace_state: Path, id_only: bool = False) -> TextVersion:
    """Prepare (or reuse) the text data version for `data_cfg`; `id_only` (verify) returns only the id and writes nothing."""
    started = time.perf_counter()
    listing = load_text_source(data_cfg, paths)
    unreadable = [f for f in listing.findings if f.quarantines]
    if unreadable and data_cfg.on_bad_file == "fail":
        first = unreadable[0]
        raise RunFailed(f"data: {first.where}: {first.kind} ({first.detail}); {len(unreadable)} document(s) cannot be used: fix them, "
                        "or set data.on_bad_file: quarantine")
    docs = listing.documents
    hashes = [_content_hash(d.text) for d in docs]
    # a JSONL id places its document (it stays put when the text is edited); every other document by its content
    explicit = [d.line is not None and d.doc_id != f"{d.file}:{d.line}" for d in docs]
    found = _Documents(docs, [d.doc_id if own else digest for d, own, digest in zip(docs, explicit, hashes)], hashes)
    found.findings = list(listing.findings)
    texts = [d.text for d in docs]
    units, near = _units(data_cfg, found, texts)
    placed = splitting.assign(units, data_cfg.split_ratios, data_cfg.split_seed)
    found.split = [None] * len(docs)
    for unit, name in zip(units, placed):
        for i in unit.members:
            if i not in found.excluded:
                found.split[i] = name
    contamination = _decontaminate(data_cfg, found, texts)
    _flag_secrets(found)
    rows = {name: sorted((i for i in range(len(docs)) if found.split[i] == name), key=lambda i: docs[i].doc_id) for name in SPLITS}
    if not rows["train"]:
        raise RunFailed("data: no train document is left (see the findings in the data report); add documents or change data.split_ratios")
    tokenizer = _tokenizer(data_cfg, [texts[i] for i in rows["train"]])
    preprocessing = text_preprocessing(data_cfg, listing.preprocessing)
    samples = [(d.doc_id, found.hashes[i], "", found.split[i] or "quarantined") for i, d in enumerate(docs)]
    samples += [(f.where, None, "", "quarantined") for f in unreadable]
    store = workspace_state / "data"
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / f".tmp-{uuid.uuid4().hex}"
    (tmp / "splits").mkdir(parents=True)
    try:
        info = _write(tmp, data_cfg, found, unreadable, rows, tokenizer, preprocessing, contamination, near, listing)
        info["fields"] = _write_tokens(tmp, workspace_state / identity.SHARD_STORE, found.docs, rows, tokenizer)
        info["tokens"] = {name: info["fields"][identity.token_field(name)]["rows"] for name in SPLITS}
        version = identity.id_of(info, samples)
        info["data_version"] = version
        if id_only:
            return version  # type: ignore[return-value]
        info["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")  # outside the id, as for images
        final = store / version
        if (final / "version.json").exists():
            log.info("data: reusing data version %s (%d documents)", version[:12], len(docs))
        else:
            info["timings"] = {"total": round(time.perf_counter() - started, 3)}
            _write_report(tmp, info, found, unreadable, contamination, near)
            _seal(tmp, info, _card(data_cfg, listing))
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "version.json").exists():
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_data_card(final, data_cfg, listing)
    return identity.load_version(final)  # type: ignore[return-value]


@dataclass
class RawFiles:
    """The raw files of a text source against those a stored text version read (`raw_files`), every byte hashed again."""

    files: int  # raw files the source reads now
    changed: Optional[str] = None  # the first file the version read that changed or vanished; None: all as recorded
    grown: int = 0  # files added since, which the version does not hold: growth, not a change
    undecided: Optional[str] = None  # what else the version was made with that differs now (the tokenizer library)


def raw_files_check(data_cfg: DataConfig, paths: dict[str, Path], folder: Path) -> Optional[RawFiles]:
    """Whether the raw files are those the stored text version in `folder` was prepared from, told from their
    hashes (each file read and hashed again, never a stat cache) and the source's settings; None when the version
    lists no raw files. Files added since are growth: the version's own files are what is compared."""
    info = json.loads((folder / "version.json").read_text(encoding="utf-8"))
    if not info.get("raw_files"):
        return None
    recorded = {entry["path"]: entry["sha256"] for entry in info["raw_files"]}
    listing = load_text_source(data_cfg, paths)
    now = {entry["path"]: entry["sha256"] for entry in listing.files}
    found = RawFiles(len(now))
    for path in sorted(set(recorded) | set(now)):
        if path not in now:
            found.changed = f"{path}: read for the version, no longer in the raw data"
        elif path not in recorded:
            found.grown += 1
        elif now[path] != recorded[path]:
            found.changed = f"{path}: its bytes hash to {now[path][:12]}, the version read {recorded[path][:12]}"
        if found.changed:
            return found
    if (info.get("preprocessing") or {}).get("source") != listing.preprocessing:
        found.changed = "the source describes its preprocessing differently now"
    elif (info.get("tokenizer") or {}).get("kind") == "bpe":
        recorded_library = info["tokenizer"].get("trained_with")
        try:
            import tokenizers

            library: Optional[str] = f"tokenizers {tokenizers.__version__}"
        except ImportError:
            library = None
        if library != recorded_library:
            found.undecided = f"the tokenizer was trained with {recorded_library}, this environment has {library or 'no tokenizers'}"
    return found


def text_preprocessing(data_cfg: DataConfig, source_preprocessing: dict[str, Any]) -> dict[str, Any]:
    """What shapes a text data version besides its documents: the data config without file locations, the card and
    workers (keys added at their default left out, as for images), the source's normalization, the text recipe."""
    from veritrain.core.config import without_added_defaults

    cfg = data_cfg.model_dump(mode="json")
    for key in ("root", "csv", "labels", "split_dir", "test_split_file", "card", "workers", "on_split_skew"):
        cfg.pop(key, None)
    # the text sections always shape a text version: kept whole, at their default or not
    kept = {key: cfg[key] for key in ("text", "tokenizer")}
    cfg = without_added_defaults({"data": cfg})["data"]
    return {"format": TEXT_RECIPE, "kind": "text", "data": {**cfg, **kept}, "source": source_preprocessing}


def _units(data_cfg: DataConfig, found: _Documents, texts: list[str]) -> tuple[list[splitting.Unit], text_dedup.NearDuplicateReport]:
    """Exact and near duplicates and JSONL groups joined into units (each kept in one split); a unit the data fixes to
    more than one split keeps its most protected one, the members fixed elsewhere quarantined as `split_leak`."""
    settings = data_cfg.text.near_duplicates
    near = text_dedup.near_duplicates(texts, text_dedup.NearDuplicateSettings(
        shingle_words=settings.shingle_words, threshold=settings.threshold, bands=settings.bands, rows=settings.rows,
        min_words=settings.min_words))
    exact = text_dedup.exact_duplicates(texts)
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(a: int, b: int) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for group in exact:
        for i in group[1:]:
            join(group[0], i)
        found.findings.append(TextFinding("exact_duplicate", found.docs[group[0]].doc_id,
                                          f"{len(group)} documents with the same text: " + ", ".join(found.docs[i].doc_id for i in group[:5]),
                                          quarantines=False))
    exact_sets = [set(group) for group in exact]
    for pair in near.pairs:
        join(pair.first, pair.second)
        if not any(pair.first in s and pair.second in s for s in exact_sets):
            found.findings.append(TextFinding("near_duplicate", found.docs[pair.first].doc_id,
                                              f"Jaccard {pair.jaccard:.3f} with {found.docs[pair.second].doc_id}", quarantines=False))
    by_group: dict[str, int] = {}
    for i, doc in enumerate(found.docs):
        if doc.group is not None:
            if doc.group in by_group:
                join(by_group[doc.group], i)
            else:
                by_group[doc.group] = i
    members: dict[int, list[int]] = {}
    for i in range(len(texts)):
        members.setdefault(root(i), []).append(i)
    units = []
    for group in sorted(members.values()):
        fixed = {found.docs[i].split for i in group} - {None}
        unit_fixed = next((name for name in ("test", "val", "train") if name in fixed), None)
        if len(fixed) > 1:
            for i in group:
                if found.docs[i].split not in (None, unit_fixed):
                    found.excluded[i] = TextFinding("split_leak", found.docs[i].doc_id,
                                                    f"fixed to {found.docs[i].split}, but a duplicate or group member is fixed to {unit_fixed}")
        units.append(splitting.Unit(members=group, fixed=unit_fixed, key=splitting.unit_key(found.keys[i] for i in group)))
    return units, near


def _decontaminate(data_cfg: DataConfig, found: _Documents, texts: list[str]) -> text_dedup.ContaminationReport:
    """Train documents sharing an n-gram with a val or test document, handled as data.text.on_contamination says."""
    train = [i for i, name in enumerate(found.split) if name == "train"]
    held_out = [i for i, name in enumerate(found.split) if name in ("val", "test")]
    # the train documents read as one stream in the order of the source and in the order of the token file
    token_order = sorted(range(len(train)), key=lambda k: found.docs[train[k]].doc_id)
    report = text_dedup.contamination([texts[i] for i in held_out], [texts[i] for i in train], data_cfg.text.ngram_words, TOP_PAIRS,
                                      streams=[range(len(train)), token_order])
    policy = data_cfg.text.on_contamination
    for index in report.train_indices:
        i = train[index]
        shared = [o for c in report.contaminated for o in c.overlaps if o.train_index == index]
        worst = max(shared, key=lambda o: o.covered_words)
        detail = (f"shares {worst.covered_words} words of {found.docs[held_out[worst.eval_index]].doc_id} "
                  f"({found.split[held_out[worst.eval_index]]}): {worst.spans[0].text[:120]!r}")
        finding = TextFinding("contamination", found.docs[i].doc_id, detail, quarantines=policy == "quarantine")
        if policy == "fail":
            raise RunFailed(f"data: contamination: {found.docs[i].doc_id} {detail}; remove it, or set data.text.on_contamination: quarantine")
        if policy == "quarantine":
            found.excluded[i] = finding
            found.split[i] = None
        else:
            found.findings.append(finding)
    report.train_indices = [train[k] for k in report.train_indices]  # as document indices from here on
    return report


def _flag_secrets(found: _Documents) -> None:
    for i, doc in enumerate(found.docs):
        kind = find_secret(doc.text)
        if kind is not None:
            found.findings.append(TextFinding("secret", doc.doc_id, f"holds {kind}", quarantines=False))
        emails = EMAIL.findall(doc.text)
        if emails:
            found.findings.append(TextFinding("email", doc.doc_id, f"{len(emails)} e-mail address(es)", quarantines=False))


def _tokenizer(data_cfg: DataConfig, train_texts: list[str]) -> Any:
    if data_cfg.tokenizer.kind == "byte_level":
        return tokenizer.byte_level()
    return tokenizer.train_bpe(train_texts, data_cfg.tokenizer.vocab_size)


def text_statistics(texts: list[str]) -> dict[str, Any]:
    """Characters, UTF-8 bytes, the share of ASCII characters and the characters by Unicode script (the first word of
    each non-ASCII letter's Unicode name, e.g. LATIN, CJK, CYRILLIC), of the given documents."""
    chars = sum(len(t) for t in texts)
    non_ascii = Counter()
    for text in texts:
        for ch in text:
            if ord(ch) > 127 and ch.isalpha():
                non_ascii[unicodedata.name(ch, "UNKNOWN").split(" ")[0]] += 1
    ascii_chars = sum(sum(1 for ch in t if ord(ch) < 128) for t in texts)
    return {"documents": len(texts), "characters": chars, "bytes": sum(len(t.encode("utf-8")) for t in texts),
            "ascii_fraction": round(ascii_chars / chars, 6) if chars else None,
            "non_ascii_letters_by_script": dict(sorted(non_ascii.items(), key=lambda kv: (-kv[1], kv[0]))[:10])}


def _write(out: Path, data_cfg: DataConfig, found: _Documents, unreadable: list[TextFinding], rows: dict[str, list[int]], tokenizer: Any,
           preprocessing: dict[str, Any], contamination: text_dedup.ContaminationReport, near: text_dedup.NearDuplicateReport,
           listing: TextListing) -> dict[str, Any]:
    """The bound files (manifest, quarantine list, split lists, tokenizer, token arrays); returns version.json's content."""

    docs = found.docs
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(MANIFEST_COLUMNS)
        for i, doc in enumerate(docs):
            placed = found.split[i]
            explicit = found.keys[i] if found.keys[i] != found.hashes[i] else ""
            writer.writerow([doc.doc_id, len(doc.text.encode("utf-8")), found.hashes[i], "", placed or "", "ok" if placed else "quarantined", explicit, ""])
        for finding in unreadable:
            writer.writerow([finding.where, "", "", "", "", "quarantined", "", ""])
    with open(out / "quarantine.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sample_id", "kind", "reason"])
        for finding in [*sorted(found.excluded.values(), key=lambda x: x.where), *unreadable]:
            writer.writerow([finding.where, finding.kind, finding.detail])
    for name in SPLITS:
        (out / "splits" / f"{name}.txt").write_text("".join(docs[i].doc_id + "\n" for i in rows[name]), encoding="utf-8")
    (out / identity.PLACED_FILE).write_bytes(bytes(SPLITS.index(split) for split in found.split if split))  # the manifest's order
    tokenizer.save(out / "tokenizer.json")
    files = {name: {"sha256": sha256_file(out / name), "bytes": (out / name).stat().st_size} for name in TEXT_FIELD_BOUND_FILES}
    counts = {name: len(rows[name]) for name in SPLITS}
    quarantined = Counter(f.kind for f in [*found.excluded.values(), *unreadable])
    return {
        "format": TEXT_RECIPE,
        "kind": "text",
        "source": listing.source,
        "hash_algorithm": DATA_HASH_ALGORITHM,
        "preprocessing": preprocessing,
        "counts": counts,
        "tokens": None,  # counted as the streams are written
        "bytes": {name: sum(len(docs[i].text.encode("utf-8")) for i in rows[name]) for name in SPLITS},
        "tokenizer": {"file": "tokenizer.json", "kind": tokenizer.kind, "sha256": tokenizer.sha256, "vocab_size": tokenizer.vocab_size,
                      "dtype": str(tokenizer.dtype), "special_ids": tokenizer.special_ids, "trained_with": _tokenizer_library(tokenizer)},
        "files": files,
        "raw_files": listing.files,
        "achieved_split": {"documents": counts, "ratios": list(data_cfg.split_ratios)},
        "contamination": {"ngram_words": contamination.ngram_words, "train_documents": len(contamination.train_indices),
                          "eval_documents_contaminated": len(contamination.contaminated),
                          "eval_words_covered_fraction": _covered_fraction(contamination),
                          "policy": data_cfg.text.on_contamination},
        "near_duplicates": {"pairs": len(near.pairs), "groups": len(near.groups), "candidates": near.candidates},
        "quarantined": dict(sorted(quarantined.items())),
        "findings_by_kind": dict(sorted(Counter(f.kind for f in [*found.findings, *found.excluded.values()]).items())),
        "statistics": {name: text_statistics([docs[i].text for i in rows[name]]) for name in SPLITS},
    }


def _write_tokens(out: Path, shard_store: Path, docs: list[TextDocument], rows: dict[str, list[int]], tokenizer: Any) -> dict[str, Any]:
    """Each split's documents, in id order, each followed by <|endoftext|>, as a token stream of chunk shards in
    `shard_store` (`shards.StreamWriter`: a chunk ends after a document whose id ends a shard, so an added document
    changes its chunk alone), linked into `out`; returns version.json's `fields`. Memory holds one chunk."""
    dtype = tokenizer.dtype.newbyteorder("<")
    end_of_text = np.array([tokenizer.end_of_text_id], dtype=dtype)
    fields = {}
    for name in SPLITS:
        writer = shards.StreamWriter(shard_store, dtype.str, DOCUMENTS_PER_CHUNK)
        for i in rows[name]:
            writer.add(docs[i].doc_id, np.concatenate([tokenizer.encode(docs[i].text).astype(dtype, copy=False), end_of_text]))
        entries, _ = writer.close()
        for entry in entries:
            shards.link(shard_store, entry, out / identity.FIELDS_FOLDER)
        fields[identity.token_field(name)] = shards.FieldSpec.of(identity.token_field(name), entries, "array", dtype.str, ()).as_dict()
    return fields


def _tokenizer_library(tokenizer: Any) -> Optional[str]:
    if tokenizer.kind != "bpe":
        return None
    import tokenizers

    return f"tokenizers {tokenizers.__version__}"


def _covered_fraction(report: text_dedup.ContaminationReport) -> Optional[float]:
    words = sum(c.words for c in report.contaminated)
    return round(sum(c.covered_words for c in report.contaminated) / words, 6) if words else 0.0


def _write_report(out: Path, info: dict[str, Any], found: _Documents, unreadable: list[TextFinding],
                  contamination: text_dedup.ContaminationReport, near: text_dedup.NearDuplicateReport) -> None:
    """data_report.json and data_report.md: every finding, the contamination pairs with their shared text, the
    near-duplicate pairs, the statistics (reports: hashed in version.json, outside the id)."""
    docs = found.docs
    findings = [{"kind": f.kind, "where": f.where, "detail": f.detail, "quarantined": f.quarantines}
                for f in [*found.findings, *found.excluded.values()]]
    report = {
        "data_version": info["data_version"],
        "kind": "text",
        "source": info["source"],
        "counts": info["counts"],
        "tokens": info["tokens"],
        "tokenizer": info["tokenizer"],
        "findings_by_kind": info["findings_by_kind"],
        "findings": findings,
        "quarantined": [{"sample_id": f.where, "kind": f.kind, "reason": f.detail} for f in [*found.excluded.values(), *unreadable]],
        "contamination": {**info["contamination"],
                          "top_pairs": [{"eval_index": o.eval_index, "train_index": o.train_index, "covered_words": o.covered_words,
                                         "covered_fraction": o.covered_fraction, "shared_text": [s.text for s in o.spans[:3]]}
                                        for o in contamination.top_pairs]},
        "near_duplicate_pairs": [{"first": docs[p.first].doc_id, "second": docs[p.second].doc_id, "jaccard": round(p.jaccard, 4)}
                                 for p in near.pairs[:TOP_PAIRS]],
        "statistics": info["statistics"],
        "hash_algorithm": info["hash_algorithm"],
        "leakage": {"cross_split_duplicate_pairs": 0},
        "summary": {"achieved_split": info["achieved_split"]},
        "charts": [],
    }
    (out / "data_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    lines = [f"# Data report: text data version {info['data_version'][:12]}", "",
             f"Source `{info['source']}`: {sum(info['counts'].values())} documents placed "
             f"(train {info['counts']['train']}, val {info['counts']['val']}, test {info['counts']['test']}); "
             f"tokens {info['tokens']}; tokenizer {info['tokenizer']['kind']} ({info['tokenizer']['vocab_size']} ids, "
             f"sha256 {info['tokenizer']['sha256'][:12]}).", "", "## Findings", ""]
    lines += [f"- {kind}: {count}" for kind, count in info["findings_by_kind"].items()] or ["none"]
    lines += ["", "## Contamination", "",
              f"{info['contamination']['train_documents']} train document(s) share a {info['contamination']['ngram_words']}-word n-gram "
              f"with val or test ({info['contamination']['policy']}); {info['contamination']['eval_words_covered_fraction']:.4%} of the "
              "words of the contaminated val/test documents are covered.", ""]
    for pair in report["contamination"]["top_pairs"][:10]:
        shared = " … ".join(pair["shared_text"])[:300].replace("`", "'")
        lines.append(f"- {pair['covered_words']} shared words: `{shared}`")
    (out / "data_report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _seal(out: Path, info: dict[str, Any], card: dict[str, Any]) -> None:
    seal_reports(out, info, set(identity.bound_files(info)) | set(identity.shard_files(info)) | {"version.json", CARD_FILE}, card)


def _card(data_cfg: DataConfig, listing: TextListing) -> dict[str, Any]:
    return merged_card(data_cfg.card.model_dump(), listing.card)


def write_data_card(final: Path, data_cfg: DataConfig, listing: TextListing) -> None:
    write_card(final, _card(data_cfg, listing))
