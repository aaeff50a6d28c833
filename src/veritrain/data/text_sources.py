"""Text sources: the documents a language model trains on, read-only, each raw file hashed, and what could not be
read reported as findings (never a traceback).

- `text`: a folder of `.txt` files (walked in sorted order); each file is a document, or with
  `split_documents: paragraph` each paragraph (text between blank lines) is.
- `jsonl`: `.jsonl` files (one file, or a folder of them); each line is a JSON object whose `text` field is a
  document, with optional `id`, `split` (train, val or test: fixes the document's split), `group` (documents of
  one group stay in one split) and `timestamp`; the field names can be configured.
- `pydoc_topics`: the corpus veritrain ships (veritrain.data.text_corpus), each help topic a document.

**Normalization** (recorded in the data version, and part of its id, as `TEXT_NORMALIZATION`): the bytes are
decoded as strict UTF-8 (a file or line that is not UTF-8 is an `invalid_utf8` finding, never guessed at); one
leading byte-order mark is removed; CRLF and lone CR line ends become LF; NUL characters are removed (a
`nul_characters` finding counts them). Nothing else is changed: no Unicode normalization, no case folding, no
whitespace change inside a document (paragraph mode strips each paragraph's surrounding whitespace).

A document over `max_chars` characters is `too_long`: a file is refused by its size before it is read
(`max_chars` × 4 bytes, the most UTF-8 needs), a JSONL line as soon as it is longer, without holding it in memory.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

import numpy as np

from veritrain.data import text_corpus

TEXT_NORMALIZATION = {"decode": "utf-8 strict", "bom": "removed", "newlines": "CRLF and CR to LF", "nul": "removed",
                      "unicode": "unchanged", "paragraph": "split on blank lines, each stripped"}
SPLIT_NAMES = ("train", "val", "test")
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")  # a blank line (spaces or tabs allowed on it)
READ_CHUNK = 1 << 20  # bytes read at a time when a JSONL line is skipped
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class TextDocument:
    doc_id: str  # the file's path (and `#p<k>` for paragraph k), the JSONL `id`, or `<file>:<line>`
    text: str  # normalized
    file: str  # the raw file it came from, relative to the source's root
    line: Optional[int] = None  # JSONL: the 1-based line
    split: Optional[str] = None  # a split the data fixes (JSONL `split`)
    group: Optional[str] = None
    timestamp: Optional[str] = None

    @property
    def sha256(self) -> str:
        """SHA-256 of the normalized text as UTF-8: the document's content hash."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass
class TextFinding:
    kind: str  # invalid_utf8, empty_document, too_long, bad_json, missing_text, bad_text, bad_split, duplicate_id, nul_characters
    where: str  # the file (and `:line`) or the document id
    detail: str
    quarantines: bool = True  # False: reported only (the document is still used)


@dataclass
class TextListing:
    source: str
    documents: list[TextDocument] = field(default_factory=list)
    findings: list[TextFinding] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)  # every raw file read: {"path", "sha256", "bytes"}
    card: dict[str, Any] = field(default_factory=dict)
    preprocessing: dict[str, Any] = field(default_factory=dict)  # the source's settings that shape the documents


@dataclass(frozen=True)
class JsonlFields:
    """The JSONL field names."""

    text: str = "text"
    id: str = "id"
    split: str = "split"
    group: str = "group"
    timestamp: str = "timestamp"


def normalize_text(text: str) -> tuple[str, int]:
    """(text as TEXT_NORMALIZATION says, NUL characters removed)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    nul = text.count("\x00")
    return (text.replace("\x00", "") if nul else text), nul


def paragraphs(text: str) -> list[str]:
    """The non-empty paragraphs of `text` (split on blank lines, each stripped)."""
    return [part.strip() for part in PARAGRAPH_BREAK.split(text) if part.strip()]


def read_text_folder(root: Path, split_documents: str, max_chars: int) -> TextListing:
    """The `.txt` files under `root`, each a document (or its paragraphs), all read at once."""
    listing = TextListing("text", preprocessing={"split_documents": split_documents, "normalization": TEXT_NORMALIZATION})
    listing.documents = list(iter_text_folder(listing, root, split_documents, max_chars))
    return listing


def iter_text_folder(listing: TextListing, root: Path, split_documents: str, max_chars: int) -> Iterator[TextDocument]:
    """The documents of the `.txt` files under `root`, one file read at a time; the files and findings go to `listing`."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() == ".txt") if root.is_dir() else []
    for path in files:
        name = path.relative_to(root).as_posix()
        size = path.stat().st_size
        if size > 4 * max_chars:  # more than max_chars characters whatever they are: not read at all
            listing.files.append({"path": name, "sha256": _sha256_file(path), "bytes": size})
            listing.findings.append(TextFinding("too_long", name, f"{size} bytes, over data.max_chars ({max_chars}) characters"))
            continue
        raw = path.read_bytes()
        listing.files.append({"path": name, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)})
        yield from _texts_of(listing, raw, name, name, split_documents, max_chars)


def read_embedded(split_documents: str, max_chars: int) -> TextListing:
    """The corpus veritrain ships, each topic a document (or its paragraphs), in topic order."""
    listing = embedded_listing(split_documents)
    listing.documents = list(iter_embedded(listing, split_documents, max_chars))
    return listing


def embedded_listing(split_documents: str) -> TextListing:
    return TextListing("pydoc_topics", card=dict(text_corpus.CARD),
                       preprocessing={"split_documents": split_documents, "normalization": TEXT_NORMALIZATION,
                                      "corpus_sha256": text_corpus.CORPUS_SHA256})


def iter_embedded(listing: TextListing, split_documents: str, max_chars: int) -> Iterator[TextDocument]:
    data = text_corpus.corpus_bytes()
    listing.files.append({"path": text_corpus.CORPUS_FILE.name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})
    for topic, text in sorted(json.loads(data.decode("utf-8")).items()):
        yield from _texts_of(listing, text.encode("utf-8"), topic, text_corpus.CORPUS_FILE.name, split_documents, max_chars)


def _texts_of(listing: TextListing, raw: bytes, doc_id: str, file: str, split_documents: str, max_chars: int) -> Iterator[TextDocument]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        listing.findings.append(TextFinding("invalid_utf8", doc_id, f"not UTF-8 at byte {err.start} ({raw[err.start:err.start + 4]!r})"))
        return
    text, nul = normalize_text(text)
    if nul:
        listing.findings.append(TextFinding("nul_characters", doc_id, f"{nul} NUL character(s) removed", quarantines=False))
    parts = [(doc_id, text.strip())] if split_documents == "file" else [(f"{doc_id}#p{k:04d}", p) for k, p in enumerate(paragraphs(text))]
    if not any(part for _, part in parts):
        listing.findings.append(TextFinding("empty_document", doc_id, "no text after normalization"))
        return
    for part_id, part in parts:
        if not part:
            listing.findings.append(TextFinding("empty_document", part_id, "no text after normalization"))
        elif len(part) > max_chars:
            listing.findings.append(TextFinding("too_long", part_id, f"{len(part)} characters, over data.max_chars ({max_chars})"))
        else:
            yield TextDocument(part_id, part, file)


def read_jsonl(path: Path, fields: JsonlFields, max_chars: int) -> TextListing:
    """The documents of a `.jsonl` file, or of every `.jsonl` file under a folder (sorted), all read at once."""
    listing = jsonl_listing(fields)
    listing.documents = list(iter_jsonl(listing, path, fields, max_chars))
    return listing


def jsonl_listing(fields: JsonlFields) -> TextListing:
    return TextListing("jsonl", preprocessing={"fields": vars(fields), "normalization": TEXT_NORMALIZATION})


def iter_jsonl(listing: TextListing, path: Path, fields: JsonlFields, max_chars: int) -> Iterator[TextDocument]:
    """The documents of the JSONL file(s), a line at a time; the files and findings go to `listing`. A repeated id is
    a `duplicate_id` finding (the first document with it is kept), told by `SeenIds` (16 bytes an id, not a dict)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() == ".jsonl")
        base = path
    else:
        files, base = ([path] if path.is_file() else []), path.parent
    seen = SeenIds()
    for file_number, file in enumerate(files):
        name = file.relative_to(base).as_posix()
        digest = hashlib.sha256()
        with open(file, "rb") as stream:
            for number, raw in _lines(stream, 4 * max_chars + 1024, digest):
                where = f"{name}:{number}"
                if raw is None:
                    listing.findings.append(TextFinding("too_long", where, f"a line over data.max_chars ({max_chars}) characters"))
                    continue
                document = _jsonl_document(listing, raw, where, name, number, fields, max_chars)
                if document is None:
                    continue
                first = seen.add(document.doc_id, file_number, number)
                if first is not None:
                    listing.findings.append(TextFinding("duplicate_id", where, f"id {document.doc_id!r} is also at {files[first[0]].relative_to(base).as_posix()}:{first[1]}"))
                    continue
                yield document
        listing.files.append({"path": name, "sha256": digest.hexdigest(), "bytes": file.stat().st_size})


class SeenIds:
    """The ids seen so far, each as its 16-byte BLAKE2b digest with the file and line it was first at: sorted arrays
    and a small dict of the latest, merged into them when it grows (a repeated id among 10^9 distinct ones collides
    by chance with probability about 10^-21)."""

    MERGE_AT = 1 << 16

    def __init__(self) -> None:
        self._digests = np.zeros(0, dtype="S16")
        self._places = np.zeros(0, dtype=np.int64)  # file number << 32 | line
        self._recent: dict[bytes, int] = {}

    def add(self, doc_id: str, file_number: int, line: int) -> Optional[tuple[int, int]]:
        """None for an id not seen before (now recorded); else (file number, line) where it was first."""
        digest = hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        place = self._recent.get(digest)
        if place is None and len(self._digests):
            at = int(np.searchsorted(self._digests, np.array(digest, dtype="S16")))
            if at < len(self._digests) and bytes(self._digests[at]).ljust(16, b"\0") == digest:  # S16 drops trailing NULs
                place = int(self._places[at])
        if place is not None:
            return place >> 32, place & 0xFFFFFFFF
        self._recent[digest] = file_number << 32 | line
        if len(self._recent) >= self.MERGE_AT:
            self._merge()
        return None

    def _merge(self) -> None:
        digests = np.concatenate([self._digests, np.array(list(self._recent), dtype="S16")])
        places = np.concatenate([self._places, np.fromiter(self._recent.values(), dtype=np.int64, count=len(self._recent))])
        order = np.argsort(digests, kind="stable")
        self._digests, self._places, self._recent = digests[order], places[order], {}


def _lines(stream: BinaryIO, limit: int, digest: Any) -> Iterator[tuple[int, Optional[bytes]]]:
    """(1-based line number, its bytes without the line end, or None when it is longer than `limit` bytes: skipped in
    chunks, never held whole); blank lines are skipped. Every byte read goes into `digest`."""
    number = 0
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        digest.update(line)
        number += 1
        if len(line) > limit and not line.endswith(b"\n"):
            while True:  # the rest of the over-long line
                chunk = stream.readline(READ_CHUNK)
                digest.update(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield number, None
            continue
        stripped = line.rstrip(b"\r\n")
        if stripped.strip():
            yield number, stripped


def _jsonl_document(listing: TextListing, raw: bytes, where: str, file: str, number: int, fields: JsonlFields,
                    max_chars: int) -> Optional[TextDocument]:
    def finding(kind: str, detail: str) -> None:
        listing.findings.append(TextFinding(kind, where, detail))

    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        finding("invalid_utf8", f"not UTF-8 at byte {err.start} of the line")
        return None
    try:
        value = json.loads(line)
    except ValueError as err:
        finding("bad_json", f"not JSON ({str(err)[:80]})")
        return None
    if not isinstance(value, dict):
        finding("bad_json", f"a JSON {type(value).__name__}, not an object")
        return None
    if fields.text not in value:
        finding("missing_text", f"no {fields.text!r} field")
        return None
    text = value[fields.text]
    if not isinstance(text, str):
        finding("bad_text", f"{fields.text!r} is a {type(text).__name__}, not a string")
        return None
    surrogate = LONE_SURROGATE.search(text)
    if surrogate:  # a JSON escape such as "\ud800" decodes to a character UTF-8 cannot hold
        finding("bad_text", f"{fields.text!r} holds a lone surrogate U+{ord(surrogate[0]):04X} at character {surrogate.start()}, "
                            "which UTF-8 cannot encode")
        return None
    text, nul = normalize_text(text)
    if nul:
        listing.findings.append(TextFinding("nul_characters", where, f"{nul} NUL character(s) removed", quarantines=False))
    if not text.strip():
        finding("empty_document", "no text after normalization")
        return None
    if len(text) > max_chars:
        finding("too_long", f"{len(text)} characters, over data.max_chars ({max_chars})")
        return None
    split = value.get(fields.split)
    if split is not None and split not in SPLIT_NAMES:
        finding("bad_split", f"{fields.split!r} is {split!r}; give train, val or test")
        return None
    doc_id = value.get(fields.id)
    group, timestamp = value.get(fields.group), value.get(fields.timestamp)
    return TextDocument(str(doc_id) if doc_id is not None else f"{file}:{number}", text, file, number, split,
                        str(group) if group is not None else None, str(timestamp) if timestamp is not None else None)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(READ_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
