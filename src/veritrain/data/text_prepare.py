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

The source is read once (`_read`), a document at a time, into compact columns (`_Documents`) and scratch files
(`_ScratchTexts`: each text and its word values), with the near-duplicate band keys in files of their own
(text_dedup.NearDuplicateIndex); decontamination and tokenization read the documents back from the scratch files,
the n-grams going through partition files (text_dedup.ContaminationIndex). So memory grows by the columns only,
never by the text (docs/data.md, "Memory while preparing text").
"""

from __future__ import annotations

import collections
import csv
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import unicodedata
import uuid
from array import array
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import numpy as np

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import DATA_HASH_ALGORITHM, sha256_file
from veritrain.core.secrets import find_secret
from veritrain.data import identity, shards, split as splitting, text_dedup, text_sources, tokenizer
from veritrain.data.columns import GrowingDigests, GrowingNames
from veritrain.data.identity import CARD_FILE, TEXT_FIELD_BOUND_FILES, TEXT_RECIPE, TextVersion
from veritrain.data.parallel import in_parallel
from veritrain.data.split import SPLITS
from veritrain.data.store import MANIFEST_COLUMNS, merged_card, seal_reports, write_data_card as write_card
from veritrain.data.text_sources import JsonlFields, TextDocument, TextFinding, TextListing

if TYPE_CHECKING:
    from veritrain.core.config import DataConfig

log = logging.getLogger("veritrain")

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
TOP_PAIRS = 20  # contamination pairs (and near-duplicate pairs) shown in the report
DOCUMENTS_PER_CHUNK = 4096  # documents a chunk shard of a token stream holds, on average (shards.cuts)


def load_text_source(data_cfg: DataConfig, paths: dict[str, Path]) -> TextListing:
    """The documents of `data.source` (text, jsonl or pydoc_topics), all read."""
    listing, documents = stream_text_source(data_cfg, paths)
    listing.documents = list(documents)
    return listing


def _source_root(data_cfg: DataConfig, paths: dict[str, Path]) -> Path:
    root = paths.get("root")
    if root is None:
        raise UserError(f"data.root: the {data_cfg.source} source reads its documents from data.root; give the folder"
                        + (" (or the .jsonl file)" if data_cfg.source == "jsonl" else ""))
    if not root.exists():
        raise UserError(f"data.root: {root} does not exist; give the folder of the documents")
    if data_cfg.source == "text" and not root.is_dir():
        raise UserError(f"data.root: {root} is not a folder; the text source reads the .txt files in a folder")
    return root


class _Documents:
    """The documents as the gate reads and places them, as columns (about 100 bytes a document, whatever its
    length); their texts and word values are in `scratch`. `split(i)` is a split name or None (quarantined,
    `excluded[i]` says why)."""

    def __init__(self, scratch: _ScratchTexts):
        self.scratch = scratch
        self.ids = GrowingNames()
        self.hashes = GrowingDigests()  # content hash (DATA_HASH_ALGORITHM of the normalized text as UTF-8)
        self.explicit = bytearray()  # 1: its JSONL id places it (it stays put when the text is edited); 0: its content
        self.fixed = bytearray()  # a split the data fixes: SPLITS index + 1, 0 for none
        self.groups = GrowingNames()  # the JSONL group, "" for none (has_group tells)
        self.has_group = bytearray()
        self.sizes = array("q")  # UTF-8 bytes
        self.matched = GrowingDigests()  # SHA-256 of the match form (exact duplicates), zeros for a text without a word
        self.split_codes = np.zeros(0, dtype=np.int8)  # SPLITS index, -1: quarantined (set by placing)
        self.excluded: dict[int, TextFinding] = {}
        self.findings: list[TextFinding] = []
        self.flagged: list[TextFinding] = []  # secrets and e-mail addresses, reported after every other finding

    def __len__(self) -> int:
        return len(self.sizes)

    def add(self, doc: TextDocument, data: bytes, matched: bytes) -> None:
        self.ids.append(doc.doc_id)
        self.hashes.append(_content_digest(data))
        self.explicit.append(doc.line is not None and doc.doc_id != f"{doc.file}:{doc.line}")
        self.fixed.append(SPLITS.index(doc.split) + 1 if doc.split else 0)
        self.groups.append(doc.group or "")
        self.has_group.append(doc.group is not None)
        self.sizes.append(len(data))
        self.matched.append(matched)

    def key(self, i: int) -> str:
        """What places document i: its JSONL id, else its content hash."""
        return self.ids[i] if self.explicit[i] else self.hashes.hex(i)

    def fixed_split(self, i: int) -> Optional[str]:
        return SPLITS[self.fixed[i] - 1] if self.fixed[i] else None

    def split(self, i: int) -> Optional[str]:
        code = int(self.split_codes[i])
        return SPLITS[code] if code >= 0 else None

    def exclude(self, i: int, finding: TextFinding) -> None:
        self.excluded[i] = finding
        self.split_codes[i] = -1

    def rows(self, name: str) -> list[int]:
        """The documents placed in split `name`, in id order (the order of their tokens)."""
        return sorted(np.flatnonzero(self.split_codes == SPLITS.index(name)).tolist(), key=self.ids.raw)


class _ScratchTexts:
    """Each document's text (UTF-8) and the uint64 values of its words as read for matching (primary reading, and
    the second one of a text holding ignorable characters) in files of a scratch folder, read back by offset: the
    later passes of the gate read them rather than the source, so they see exactly the documents the first read."""

    def __init__(self, folder: Path):
        self._texts = open(folder / "texts.bin", "w+b")
        self._values = open(folder / "words.u64", "w+b")
        self._text_at, self._values_at = array("q", [0]), array("q", [0])
        self._second_at: dict[int, int] = {}  # a document read twice → where its second reading starts

    def add(self, data: bytes, readings: list[np.ndarray]) -> None:
        document = len(self._text_at) - 1
        self._texts.write(data)
        self._text_at.append(self._text_at[-1] + len(data))
        at = self._values_at[-1]
        for k, values in enumerate(readings):
            if k == 1:
                self._second_at[document] = at
            self._values.write(values.astype("<u8", copy=False).tobytes())
            at += 8 * len(values)
        self._values_at.append(at)

    def text(self, i: int) -> str:
        return os.pread(self._texts.fileno(), self._text_at[i + 1] - self._text_at[i], self._text_at[i]).decode("utf-8")

    def readings(self, i: int) -> list[np.ndarray]:
        start, end = self._values_at[i], self._values_at[i + 1]
        if i not in self._second_at:
            return [self._read_values(start, end)]
        return [self._read_values(start, self._second_at[i]), self._read_values(self._second_at[i], end)]

    def words(self, i: int) -> np.ndarray:
        """The values of document i's words()."""
        return self._read_values(self._values_at[i], self._second_at.get(i, self._values_at[i + 1]))

    def words_read(self) -> int:
        """The word values kept, of every reading of every document."""
        return self._values_at[-1] // 8

    def _read_values(self, start: int, end: int) -> np.ndarray:
        return np.frombuffer(os.pread(self._values.fileno(), end - start, start), dtype="<u8").astype(np.uint64)

    def flush(self) -> None:
        self._texts.flush()
        self._values.flush()

    def close(self) -> None:
        self._texts.close()
        self._values.close()


def _content_digest(data: bytes) -> bytes:
    import blake3

    return blake3.blake3(data).digest()


def prepare(data_cfg: DataConfig, paths: dict[str, Path], workspace_state: Path, id_only: bool = False) -> TextVersion:
    """Prepare (or reuse) the text data version for `data_cfg`; `id_only` (verify) returns only the id and writes nothing
    but its scratch files (in `.veritrain/tmp/prepare-<pid>-*`, removed as it ends)."""
    started = time.perf_counter()
    scratch_root = workspace_state / "tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"prepare-{os.getpid()}-", dir=scratch_root) as scratch:
        return _prepare_in(data_cfg, paths, workspace_state, id_only, Path(scratch), started)


def _prepare_in(data_cfg: DataConfig, paths: dict[str, Path], workspace_state: Path, id_only: bool, scratch: Path,
                started: float) -> TextVersion:
    texts = _ScratchTexts(scratch)
    try:
        listing, found, near = _read(data_cfg, paths, texts, scratch)
        unreadable = [f for f in listing.findings if f.quarantines]
        if unreadable and data_cfg.on_bad_file == "fail":
            first = unreadable[0]
            raise RunFailed(f"data: {first.where}: {first.kind} ({first.detail}); {len(unreadable)} document(s) cannot be used: fix them, "
                            "or set data.on_bad_file: quarantine")
        _place(data_cfg, found, near)
        contamination = _decontaminate(data_cfg, found, scratch)
        found.findings += found.flagged
        rows = {name: found.rows(name) for name in SPLITS}
        if not rows["train"]:
            raise RunFailed("data: no train document is left (see the findings in the data report); add documents or change data.split_ratios")
        tokenizer = _tokenizer(data_cfg, (texts.text(i) for i in rows["train"]))
        return _store(data_cfg, workspace_state, id_only, started, listing, found, unreadable, rows, tokenizer, contamination, near)
    finally:
        texts.close()


def _read(data_cfg: DataConfig, paths: dict[str, Path], texts: _ScratchTexts,
          scratch: Path) -> tuple[TextListing, _Documents, text_dedup.NearDuplicateReport]:
    """The first pass: every document of the source, read once and in order, into the columns and the scratch files,
    with what is learnt of it as it passes (content hash, match form and its hash, shingles for near duplicates,
    secrets); the near-duplicate report once all are read."""
    listing, documents = stream_text_source(data_cfg, paths)
    found = _Documents(texts)
    settings = data_cfg.text.near_duplicates
    near_settings = text_dedup.NearDuplicateSettings(shingle_words=settings.shingle_words, threshold=settings.threshold,
                                                     bands=settings.bands, rows=settings.rows, min_words=settings.min_words)
    (scratch / "near").mkdir()
    near_index = text_dedup.NearDuplicateIndex(scratch / "near", near_settings)
    sent: collections.deque[TextDocument] = collections.deque()  # the documents handed to the workers, in order

    def handed() -> Iterator[str]:
        for doc in documents:
            sent.append(doc)
            yield doc.text

    workers = (data_cfg.workers or os.cpu_count() or 1) if _source_bytes(data_cfg, paths) >= PARALLEL_BYTES else 1
    for look in in_parallel(_first_look, handed(), workers, near_settings, size=LOOK_BATCH):
        first = len(found)
        for matched, readings, flags in zip(look.matched, look.readings, look.flags):
            doc = sent.popleft()
            data = doc.text.encode("utf-8")
            found.add(doc, data, matched)
            texts.add(data, readings)
            found.flagged += [TextFinding(kind, doc.doc_id, detail, quarantines=False) for kind, detail in flags]
        near_index.add_keys(range(first, len(found)), look.kept, look.sizes, look.keys)
    found.findings = list(listing.findings)
    found.split_codes = np.full(len(found), -1, dtype=np.int8)
    texts.flush()
    return listing, found, near_index.finish(texts.words)


PARALLEL_BYTES = 8 << 20  # a source of fewer bytes is read in this process alone (starting workers costs about a second)
LOOK_BATCH = 64  # documents a worker looks at per task


@dataclass
class _FirstLook:
    """What the first pass learns of a batch of documents (`_first_look`)."""

    matched: list[bytes]  # SHA-256 of each match form, 32 zero bytes for a text without a word
    readings: list[list[np.ndarray]]  # the word values of each document's readings (text_dedup.document_readings)
    flags: list[list[tuple[str, str]]]  # (kind, detail) of each document's secret and e-mail findings
    kept: np.ndarray  # text_dedup.band_keys of the batch
    sizes: np.ndarray
    keys: np.ndarray


_WORD_VALUES: dict[str, int] = {}  # a process's memo of word values (text_dedup.document_readings)


def _first_look(texts: list[str], settings: text_dedup.NearDuplicateSettings) -> list[_FirstLook]:
    """The per-document work of the first pass, for a batch of texts: pure, so it runs in a worker process or here."""
    look = _FirstLook([], [], [], *text_dedup.band_keys([], settings))
    for text in texts:
        form, readings = text_dedup.document_readings(text, _WORD_VALUES)
        look.matched.append(hashlib.sha256(form.encode("utf-8", "surrogatepass")).digest() if form else bytes(32))
        look.readings.append(readings)
        look.flags.append(_flags(text))
    if len(_WORD_VALUES) > WORD_CACHE:
        _WORD_VALUES.clear()
    look.kept, look.sizes, look.keys = text_dedup.band_keys([readings[0] for readings in look.readings], settings)
    return [look]


def _source_bytes(data_cfg: DataConfig, paths: dict[str, Path]) -> int:
    """The bytes of the files a text or JSONL source reads (0 for the shipped corpus)."""
    root = paths.get("root")
    if data_cfg.source == "pydoc_topics" or root is None or not root.exists():
        return 0
    suffix = ".txt" if data_cfg.source == "text" else ".jsonl"
    if root.is_file():
        return root.stat().st_size
    return sum(p.stat().st_size for p in root.rglob("*") if p.suffix.lower() == suffix and p.is_file())


WORD_CACHE = 1 << 20  # distinct words whose values are remembered (then forgotten, all at once): memoizing only


def stream_text_source(data_cfg: DataConfig, paths: dict[str, Path]) -> tuple[TextListing, Iterator[TextDocument]]:
    """The listing of `data.source` (its files and findings filled as the documents are read) and its documents, one
    at a time."""
    text = data_cfg.text
    if data_cfg.source == "pydoc_topics":
        listing = text_sources.embedded_listing(text.split_documents)
        return listing, text_sources.iter_embedded(listing, text.split_documents, text.max_chars)
    root = _source_root(data_cfg, paths)
    if data_cfg.source == "text":
        listing = TextListing("text", preprocessing={"split_documents": text.split_documents, "normalization": text_sources.TEXT_NORMALIZATION})
        return listing, text_sources.iter_text_folder(listing, root, text.split_documents, text.max_chars)
    fields = JsonlFields(text.fields.text, text.fields.id, text.fields.split, text.fields.group, text.fields.timestamp)
    listing = text_sources.jsonl_listing(fields)
    return listing, text_sources.iter_jsonl(listing, root, fields, text.max_chars)


def _place(data_cfg: DataConfig, found: _Documents, near: text_dedup.NearDuplicateReport) -> None:
    """Every document's split: its unit's, placed by splitting.assign; a member of a unit that the data fixes to
    another split stays quarantined (`_units`)."""
    units = _units(found, near)
    placed = splitting.assign(units, data_cfg.split_ratios, data_cfg.split_seed)
    codes = np.array([SPLITS.index(name) for name in placed], dtype=np.int8)
    found.split_codes[units.members] = np.repeat(codes, np.diff(units.starts))
    for i in found.excluded:
        found.split_codes[i] = -1


def _store(data_cfg: DataConfig, workspace_state: Path, id_only: bool, started: float, listing: TextListing, found: _Documents,
           unreadable: list[TextFinding], rows: dict[str, list[int]], tokenizer: Any, contamination: text_dedup.ContaminationReport,
           near: text_dedup.NearDuplicateReport) -> TextVersion:
    """The version's files written in a temporary folder of the store and renamed to its id (or the stored one reused)."""
    preprocessing = text_preprocessing(data_cfg, listing.preprocessing)
    store = workspace_state / "data"
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / f".tmp-{uuid.uuid4().hex}"
    (tmp / "splits").mkdir(parents=True)
    try:
        info = _write(tmp, data_cfg, found, unreadable, rows, tokenizer, preprocessing, contamination, near, listing)
        info["fields"], info["statistics"] = _write_tokens(tmp, workspace_state / identity.SHARD_STORE, found, rows, tokenizer)
        info["tokens"] = {name: info["fields"][identity.token_field(name)]["rows"] for name in SPLITS}
        version = identity.id_of(info, ())  # text recipe 3 on: the documents are bound through the manifest's hash
        info["data_version"] = version
        if id_only:
            return version  # type: ignore[return-value]
        info["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")  # outside the id, as for images
        final = store / version
        if (final / "version.json").exists():
            log.info("data: reusing data version %s (%d documents)", version[:12], len(found))
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
    listing, documents = stream_text_source(data_cfg, paths)
    for _ in documents:  # read through, one document at a time: the files' hashes are what is compared
        pass
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


def _units(found: _Documents, near: text_dedup.NearDuplicateReport) -> splitting.Units:
    """Exact and near duplicates and JSONL groups joined into units (each kept in one split), in the order of their
    first member; a unit the data fixes to more than one split keeps its most protected one, the members fixed
    elsewhere quarantined as `split_leak`. Lone documents stay arrays (splitting.Units)."""
    count = len(found)
    parent = np.arange(count, dtype=np.int64)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    def join(a: int, b: int) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    exact = _exact_groups(found)
    for group in exact:
        for i in group[1:]:
            join(group[0], i)
        found.findings.append(TextFinding("exact_duplicate", found.ids[group[0]],
                                          f"{len(group)} documents with the same text: " + ", ".join(found.ids[i] for i in group[:5]),
                                          quarantines=False))
    exact_of = {i: k for k, group in enumerate(exact) for i in group}
    for pair in near.pairs:
        join(pair.first, pair.second)
        if exact_of.get(pair.first, -1) != exact_of.get(pair.second, -2):
            found.findings.append(TextFinding("near_duplicate", found.ids[pair.first],
                                              f"Jaccard {pair.jaccard:.3f} with {found.ids[pair.second]}", quarantines=False))
    grouped = np.flatnonzero(np.frombuffer(bytes(found.has_group), dtype=np.uint8)) if count else np.zeros(0, dtype=np.int64)
    first_of: dict[str, int] = {}
    for i in grouped.tolist():
        group = found.groups[i]
        if group in first_of:
            join(first_of[group], i)
        else:
            first_of[group] = i
    del first_of
    while True:  # every document's root: the first member of its unit
        jumped = parent[parent]
        if np.array_equal(jumped, parent):
            break
        parent = jumped
    members = np.argsort(parent, kind="stable")  # by unit, each unit's members ascending
    firsts = np.flatnonzero(np.concatenate([[True], parent[members][1:] != parent[members][:-1]])) if count else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([firsts, [count]]).astype(np.int64)
    fixed = np.frombuffer(bytes(found.fixed), dtype=np.uint8).astype(np.int8)[members[firsts]] - 1 if count else np.zeros(0, dtype=np.int8)
    keys = {}
    for u in np.flatnonzero(np.diff(starts) > 1).tolist():
        group = members[starts[u]:starts[u + 1]].tolist()
        fixed[u] = _unit_fixed(found, group)
        keys[u] = splitting.unit_key(found.key(i) for i in group)
    return splitting.Units(count, members, starts, np.full(count, -1, dtype=np.int32), fixed, keys, {}, found.key)


def _exact_groups(found: _Documents) -> list[list[int]]:
    """Documents whose match forms have the same SHA-256: groups of two or more, each ascending, by first member;
    documents without a word are left out (text_dedup.exact_duplicates, from the digests kept)."""
    digests = found.matched.raw()
    worded = np.flatnonzero(digests != b"")  # a text without a word kept 32 zero bytes, which S32 reads as empty
    order = worded[np.argsort(digests[worded], kind="stable")]
    ordered = digests[order]
    if len(ordered) < 2:
        return []
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.concatenate([starts[1:], [len(ordered)]])
    return sorted(order[a:b].tolist() for a, b in zip(starts.tolist(), ends.tolist()) if b - a >= 2)


def _unit_fixed(found: _Documents, group: list[int]) -> int:
    """The SPLITS index a unit of several documents is fixed to (-1: none); members fixed elsewhere quarantined."""
    fixed = {found.fixed_split(i) for i in group} - {None}
    unit_fixed = next((name for name in ("test", "val", "train") if name in fixed), None)
    if len(fixed) > 1:
        for i in group:
            if found.fixed_split(i) not in (None, unit_fixed):
                found.excluded[i] = TextFinding("split_leak", found.ids[i],
                                                f"fixed to {found.fixed_split(i)}, but a duplicate or group member is fixed to {unit_fixed}")
    return SPLITS.index(unit_fixed) if unit_fixed else -1


def _decontaminate(data_cfg: DataConfig, found: _Documents, scratch: Path) -> text_dedup.ContaminationReport:
    """Train documents sharing an n-gram with a val or test document, handled as data.text.on_contamination says:
    a second pass over the scratch files into a text_dedup.ContaminationIndex."""
    codes = found.split_codes
    train = np.flatnonzero(codes == 0)
    held_out = np.flatnonzero((codes == 1) | (codes == 2))
    (scratch / "contamination").mkdir()
    index = text_dedup.ContaminationIndex(scratch / "contamination", data_cfg.text.ngram_words, words=found.scratch.words_read())
    for k, i in enumerate(train.tolist()):
        index.add_train(k, found.scratch.readings(i))
    # the train documents read as one stream in the order of the source and in the order of the token file
    index.add_stream(range(len(train)))
    index.add_stream(sorted(range(len(train)), key=lambda k: found.ids.raw(int(train[k]))))
    for k, i in enumerate(held_out.tolist()):
        index.add_eval(k, found.scratch.words(i))
    report = index.report(lambda k: found.scratch.text(int(held_out[k])), TOP_PAIRS)
    policy = data_cfg.text.on_contamination
    worst_of: dict[int, text_dedup.Overlap] = {}
    for item in report.contaminated:
        for overlap in item.overlaps:
            best = worst_of.get(overlap.train_index)
            if best is None or overlap.covered_words > best.covered_words:
                worst_of[overlap.train_index] = overlap
    for k in report.train_indices:
        i = int(train[k])
        worst = worst_of[k]
        eval_doc = int(held_out[worst.eval_index])
        detail = (f"shares {worst.covered_words} words of {found.ids[eval_doc]} "
                  f"({found.split(eval_doc)}): {worst.spans[0].text[:120]!r}")
        finding = TextFinding("contamination", found.ids[i], detail, quarantines=policy == "quarantine")
        if policy == "fail":
            raise RunFailed(f"data: contamination: {found.ids[i]} {detail}; remove it, or set data.text.on_contamination: quarantine")
        if policy == "quarantine":
            found.exclude(i, finding)
        else:
            found.findings.append(finding)
    report.train_indices = [int(train[k]) for k in report.train_indices]  # as document indices from here on
    return report


def _flags(text: str) -> list[tuple[str, str]]:
    """(kind, detail) of a secret by its shape and of e-mail addresses in the text: reported, not removed."""
    flags = []
    kind = find_secret(text)
    if kind is not None:
        flags.append(("secret", f"holds {kind}"))
    emails = EMAIL.findall(text) if "@" in text else []
    if emails:
        flags.append(("email", f"{len(emails)} e-mail address(es)"))
    return flags


def _tokenizer(data_cfg: DataConfig, train_texts: Iterator[str]) -> Any:
    if data_cfg.tokenizer.kind == "byte_level":
        return tokenizer.byte_level()
    return tokenizer.train_bpe(train_texts, data_cfg.tokenizer.vocab_size)


class TextStatistics:
    """Characters, UTF-8 bytes, the share of ASCII characters and the characters by Unicode script (the first word of
    each non-ASCII letter's Unicode name, e.g. LATIN, CJK, CYRILLIC), of the documents added one at a time."""

    NON_ASCII = re.compile(r"[^\x00-\x7f]+")

    def __init__(self) -> None:
        self.documents = self.characters = self.bytes = self.ascii = 0
        self.scripts: Counter[str] = Counter()

    def add(self, text: str, size: Optional[int] = None) -> None:
        self.documents += 1
        self.characters += len(text)
        self.bytes += len(text.encode("utf-8")) if size is None else size
        if text.isascii():
            self.ascii += len(text)
            return
        others = "".join(self.NON_ASCII.findall(text))
        self.ascii += len(text) - len(others)
        for ch in others:
            if ch.isalpha():
                self.scripts[unicodedata.name(ch, "UNKNOWN").split(" ")[0]] += 1

    def as_dict(self) -> dict[str, Any]:
        return {"documents": self.documents, "characters": self.characters, "bytes": self.bytes,
                "ascii_fraction": round(self.ascii / self.characters, 6) if self.characters else None,
                "non_ascii_letters_by_script": dict(sorted(self.scripts.items(), key=lambda kv: (-kv[1], kv[0]))[:10])}


def text_statistics(texts: Iterable[str]) -> dict[str, Any]:
    """TextStatistics of these documents."""
    statistics = TextStatistics()
    for text in texts:
        statistics.add(text)
    return statistics.as_dict()


def _write(out: Path, data_cfg: DataConfig, found: _Documents, unreadable: list[TextFinding], rows: dict[str, list[int]], tokenizer: Any,
           preprocessing: dict[str, Any], contamination: text_dedup.ContaminationReport, near: text_dedup.NearDuplicateReport,
           listing: TextListing) -> dict[str, Any]:
    """The bound files (manifest, quarantine list, split lists, tokenizer); returns version.json's content, the
    token fields and statistics to come (`_write_tokens`)."""
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(MANIFEST_COLUMNS)
        for i in range(len(found)):
            placed = found.split(i)
            explicit = found.ids[i] if found.explicit[i] and found.ids[i] != found.hashes.hex(i) else ""
            writer.writerow([found.ids[i], found.sizes[i], found.hashes.hex(i), "", placed or "", "ok" if placed else "quarantined", explicit, ""])
        for finding in unreadable:
            writer.writerow([finding.where, "", "", "", "", "quarantined", "", ""])
    with open(out / "quarantine.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sample_id", "kind", "reason"])
        for finding in [*sorted(found.excluded.values(), key=lambda x: x.where), *unreadable]:
            writer.writerow([finding.where, finding.kind, finding.detail])
    for name in SPLITS:
        with open(out / "splits" / f"{name}.txt", "w", encoding="utf-8", newline="") as f:
            f.writelines(found.ids[i] + "\n" for i in rows[name])
    codes = found.split_codes
    (out / identity.PLACED_FILE).write_bytes(codes[codes >= 0].astype(np.uint8).tobytes())  # the manifest's order
    tokenizer.save(out / "tokenizer.json")
    files = {name: {"sha256": sha256_file(out / name), "bytes": (out / name).stat().st_size} for name in TEXT_FIELD_BOUND_FILES}
    counts = {name: len(rows[name]) for name in SPLITS}
    quarantined = Counter(f.kind for f in [*found.excluded.values(), *unreadable])
    sizes = np.frombuffer(found.sizes, dtype=np.int64) if len(found) else np.zeros(0, dtype=np.int64)
    return {
        "format": TEXT_RECIPE,
        "kind": "text",
        "source": listing.source,
        "hash_algorithm": DATA_HASH_ALGORITHM,
        "preprocessing": preprocessing,
        "counts": counts,
        "tokens": None,  # counted as the streams are written
        "bytes": {name: int(sizes[codes == k].sum()) for k, name in enumerate(SPLITS)},
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
        "statistics": None,  # gathered as the tokens are written
    }


def _write_tokens(out: Path, shard_store: Path, found: _Documents, rows: dict[str, list[int]],
                  tokenizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each split's documents, in id order, each followed by <|endoftext|>, as a token stream of chunk shards in
    `shard_store` (`shards.StreamWriter`: a chunk ends after a document whose id ends a shard, so an added document
    changes its chunk alone), linked into `out`; returns version.json's `fields` and each split's statistics
    (TextStatistics), gathered on the way. Memory holds one chunk."""
    dtype = tokenizer.dtype.newbyteorder("<")
    end_of_text = np.array([tokenizer.end_of_text_id], dtype=dtype)
    fields, statistics = {}, {}
    for name in SPLITS:
        writer = shards.StreamWriter(shard_store, dtype.str, DOCUMENTS_PER_CHUNK)
        counted = TextStatistics()
        for i in rows[name]:
            text = found.scratch.text(i)
            counted.add(text, found.sizes[i])
            writer.add(found.ids[i], np.concatenate([tokenizer.encode(text).astype(dtype, copy=False), end_of_text]))
        entries, _ = writer.close()
        for entry in entries:
            shards.link(shard_store, entry, out / identity.FIELDS_FOLDER)
        fields[identity.token_field(name)] = shards.FieldSpec.of(identity.token_field(name), entries, "array", dtype.str, ()).as_dict()
        statistics[name] = counted.as_dict()
    return fields, statistics


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
        "near_duplicate_pairs": [{"first": found.ids[p.first], "second": found.ids[p.second], "jaccard": round(p.jaccard, 4)}
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
