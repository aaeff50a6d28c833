"""Tokenizers for language-model training whose identity is the bytes of their file, and the flat token files
they write.

Two kinds, one small JSON file of veritrain's own (`Tokenizer.save`, `load_tokenizer`; its SHA-256 names it):

- `byte_level(special_tokens)`: no training; ids 0-255 are the bytes of the text's UTF-8, the special tokens
  follow (`<|endoftext|>` = 256 by default).
- `train_bpe(texts, vocab_size, special_tokens)`: byte-level BPE. The same ids 0-255 and specials, then one id per
  merged token, in the order training made them; `vocab_size` counts all three. Every string encodes (there is
  no unknown token). Words are split, before merging, by the GPT-2 pattern (`tokenizers`' ByteLevel pre-tokenizer:
  letters, digits, other symbols and whitespace runs, each with its leading space).

**Why `tokenizers` trains and encodes BPE.** Its `BpeTrainer` has no seed, and tokenizers issue #1794 reports runs
that differ; the cause there is the ids of `continuing_subword_prefix` tokens, assigned in hash-map order, which
then break ties between merges. Byte-level BPE has no such tokens: the alphabet is sorted before ids are given and
ties between equal counts go to the smaller pair of ids. Measured with tokenizers 0.23.3 on the embedded corpus
(79 documents, 466 KB): 5 processes with RAYON_NUM_THREADS=1 and 5 with =2 saved byte-identical tokenizer.json
files at vocab 2048, as did 9 processes at 1, 2 and 4 threads at vocab 4096; tests/test_tokenizer.py keeps that
check and pins the resulting file's SHA-256. So the trainer is used as it is and its merges are written into
veritrain's own file, whose bytes depend on nothing but the merges (not on tokenizers' own file format).
`tokenizers` (the `veritrain[lm]` extra) is imported only to train and to encode with BPE; this module, byte-level
tokenizers and the decoding of every kind work without it.

**What round-trips.** `decode(encode(text)) == text` for every `str` that UTF-8 can encode: NUL, control
characters, CR, CRLF, a byte-order mark, emoji and any code point but the surrogates U+D800-U+DFFF; a lone
surrogate (which a strict UTF-8 decode never yields) is refused with a UserError. `encode` treats a special
token's text inside the text as plain text, so a document cannot forge a document boundary; `decode` writes a
special id as its text, and a sequence cut inside a character decodes that character as U+FFFD.

Use: `tok = train_bpe(docs, 4096); tok.save(path); write_tokens(docs, tok, "train.bin")`, and to read them back
`read_tokens("train.bin", load_tokenizer(path).dtype)`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from veritrain.core.errors import UserError
from veritrain.core.files import sync_data, write_atomic

END_OF_TEXT = "<|endoftext|>"  # the document separator: every tokenizer has it, write_tokens puts it after each document
FORMAT_VERSION = 1  # of the tokenizer file; a change in its meaning gives a new number
KINDS = ("byte_level", "bpe")
PRE_TOKENIZER = "gpt2-regex"  # BPE words: tokenizers' ByteLevel(add_prefix_space=False, use_regex=True)
BYTE_TOKENS = 256  # ids 0-255: the bytes
TOKEN_DTYPES = ("uint16", "uint32")  # the narrowest that holds every id is chosen
FILE_KEYS = {"type", "version", "vocab_size", "dtype", "pre_tokenizer", "special_tokens", "merges"}
WRITE_BUFFER_BYTES = 1 << 20  # of token bytes held before they go to disk: write_tokens' memory beside one document
SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Tokenizer:
    """A tokenizer as its file describes it; built by `byte_level`, `train_bpe` or `load_tokenizer`."""

    kind: str  # "byte_level" or "bpe"
    special_tokens: tuple[str, ...]  # their texts; ids 256, 257, ... in this order
    merges: tuple[tuple[int, int], ...]  # BPE: the pairs of ids merged, earliest (applied first) first; byte_level: ()
    dtype: np.dtype  # of the ids in token files: uint16 while the vocabulary fits, else uint32
    file_bytes: bytes  # the file as `save` writes it, or as `load_tokenizer` read it: the tokenizer's identity

    @property
    def sha256(self) -> str:
        """SHA-256 of the file's bytes (hex): one changed byte, even of layout, is another tokenizer."""
        return hashlib.sha256(self.file_bytes).hexdigest()

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...]:
        """The bytes each id stands for, by id (a special token: its text as UTF-8)."""
        return _token_table(self.special_tokens, self.merges)

    @property
    def vocab_size(self) -> int:
        """The number of ids: 256 bytes + the special tokens + the tokens BPE merged."""
        return len(self.token_bytes)

    @property
    def special_ids(self) -> dict[str, int]:
        """{text: id} of the special tokens."""
        return {text: BYTE_TOKENS + i for i, text in enumerate(self.special_tokens)}

    @property
    def end_of_text_id(self) -> int:
        return self.special_ids[END_OF_TEXT]

    def save(self, path: str | Path) -> None:
        """Write the file's bytes to `path`, atomically (a reader sees no half-written tokenizer)."""
        write_atomic(Path(path), self.file_bytes)

    def encode(self, text: str) -> np.ndarray:
        """The ids of `text` (a 1-D array of `dtype`); special tokens' texts in it are encoded as plain text."""
        if self.kind == "byte_level":
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(_surrogate_message(text)) from None
            return np.frombuffer(data, dtype=np.uint8).astype(self.dtype)
        try:
            ids = self._bpe_encoder.encode(text, add_special_tokens=False).ids
        except TypeError:  # tokenizers refuses a str it cannot convert to UTF-8: one with a lone surrogate
            if isinstance(text, str) and SURROGATE.search(text):
                raise UserError(_surrogate_message(text)) from None
            raise
        return np.array(ids, dtype=self.dtype)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`; a character cut by the sequence's ends decodes as U+FFFD."""
        table = self.token_bytes
        as_list = np.asarray(ids).tolist()
        outside = next((i for i in as_list if not 0 <= i < len(table)), None)
        if outside is not None:
            raise UserError(f"token id {outside} is outside this tokenizer's vocabulary (0-{len(table) - 1}); decode ids made by the same tokenizer ({self.sha256[:12]})")
        return b"".join([table[i] for i in as_list]).decode("utf-8", errors="replace")

    @cached_property
    def _bpe_encoder(self) -> Any:
        """tokenizers' BPE model and pre-tokenizer, built from this file's merges with veritrain's ids."""
        return _hf_bpe(self.token_bytes, self.merges, len(self.special_tokens))


def byte_level(special_tokens: Sequence[str] = (END_OF_TEXT,)) -> Tokenizer:
    """The byte-level tokenizer: ids 0-255 are the bytes, the special tokens follow from 256."""
    specials = _checked_specials(special_tokens)
    return _tokenizer("byte_level", specials, ())


def _checked_texts(texts: Iterable[str]) -> Iterator[str]:
    for n, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"training text {n} is a {type(text).__name__}, not a str; give the documents' texts")
        if SURROGATE.search(text):
            raise UserError(f"training text {n}: {_surrogate_message(text)}")
        yield text


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str] = (END_OF_TEXT,)) -> Tokenizer:
    """Byte-level BPE trained on `texts`: at most `vocab_size` ids (256 bytes + the specials + merged tokens;
    fewer when the texts run out of pairs to merge). The same texts give the same file, byte for byte."""
    specials = _checked_specials(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not BYTE_TOKENS + len(specials) <= vocab_size < 2**32:
        raise UserError(f"vocab_size {vocab_size!r} must be a whole number from {BYTE_TOKENS + len(specials)} (the 256 bytes and {len(specials)} special tokens) to 2**32 - 1")
    tokenizers = _import_tokenizers("train a BPE tokenizer")
    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials),  # tokenizers' vocabulary: bytes and merges; veritrain adds the specials
        special_tokens=[],  # kept out of training: their ids are veritrain's, and text never produces them
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen in the texts or not
        min_frequency=0,
        show_progress=False,
    )
    hf.train_from_iterator(_checked_texts(texts), trainer=trainer)  # read once, as they come: never all held
    model = json.loads(hf.to_str())["model"]
    byte_of = {char: byte for byte, char in enumerate(_BYTE_CHARS)}
    id_of = {bytes([byte]): byte for byte in range(BYTE_TOKENS)}
    next_id = BYTE_TOKENS + len(specials)
    merges: list[tuple[int, int]] = []
    for merge in model["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge  # "a b" before tokenizers 0.20
        left_bytes, right_bytes = (bytes(byte_of[c] for c in part) for part in (left, right))
        merges.append((id_of[left_bytes], id_of[right_bytes]))
        if left_bytes + right_bytes not in id_of:
            id_of[left_bytes + right_bytes] = next_id
            next_id += 1
    return _tokenizer("bpe", specials, tuple(merges))


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer in `path` (a file `Tokenizer.save` wrote); a file that is not one is a one-line UserError."""
    path = Path(path)
    fix = "write it with veritrain's Tokenizer.save (train_bpe or byte_level)"
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot read the tokenizer file ({err.strerror}); give the path of a tokenizer file") from None
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_refuse_repeated_keys)
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a tokenizer file (not UTF-8 text); {fix}") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not a tokenizer file (not valid JSON: {err.msg} at line {err.lineno} column {err.colno}); {fix}") from None
    except ValueError as err:  # a repeated key
        raise UserError(f"{path}: not a tokenizer file ({err}); {fix}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: not a tokenizer file (a JSON {type(doc).__name__}, not an object); {fix}")
    if doc.get("type") not in KINDS:
        raise UserError(f"{path}: unknown tokenizer type {doc.get('type')!r}; veritrain reads {' or '.join(KINDS)}, {fix}")
    if doc.get("version") != FORMAT_VERSION:
        raise UserError(f"{path}: tokenizer file version {doc.get('version')!r}, this veritrain reads version {FORMAT_VERSION}; use the veritrain that wrote it or write it again")
    unknown = sorted(set(doc) - FILE_KEYS)
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r} in the tokenizer file; the keys are {', '.join(sorted(FILE_KEYS))}")
    specials = _specials_from_file(path, doc.get("special_tokens"))
    merges = _merges_from_file(path, doc, len(specials))
    table = _token_table(specials, merges)
    dtype = doc.get("dtype")
    if dtype not in TOKEN_DTYPES:
        raise UserError(f"{path}: dtype {dtype!r} is not one of {', '.join(TOKEN_DTYPES)}; {fix}")
    if len(table) > np.iinfo(dtype).max + 1:
        raise UserError(f"{path}: the vocabulary of {len(table)} tokens exceeds the declared dtype {dtype} (ids up to {np.iinfo(dtype).max}); declare uint32 or write the file again with veritrain")
    if doc.get("vocab_size") != len(table):
        raise UserError(f"{path}: vocab_size {doc.get('vocab_size')!r} does not match the {len(table)} tokens the bytes, special tokens and merges make; {fix}")
    if doc["type"] == "bpe" and doc.get("pre_tokenizer") != PRE_TOKENIZER:
        raise UserError(f"{path}: pre_tokenizer {doc.get('pre_tokenizer')!r} is not {PRE_TOKENIZER!r}, the only one veritrain encodes with; {fix}")
    return Tokenizer(doc["type"], specials, merges, np.dtype(dtype), data)


def write_tokens(documents: Iterable[str], tokenizer: Tokenizer, path: str | Path) -> int:
    """Write each document's ids, then the end-of-text id, to `path`: a flat file of `tokenizer.dtype`,
    little-endian, with no header. Returns the number of tokens written. Memory holds one document and a 1 MiB
    buffer, never the corpus; the file appears under `path` only once complete (a failure leaves no file there)."""
    if isinstance(documents, str):
        raise UserError("write_tokens takes an iterable of documents, not one str (it would write each character as a document); pass [text]")
    path = Path(path)
    dtype = tokenizer.dtype.newbyteorder("<")  # a token file reads the same on every machine
    end_of_text = np.array([tokenizer.end_of_text_id], dtype=dtype).tobytes()
    temp = path.with_name(f".{path.name}.tmp")
    count = 0
    try:
        with open(temp, "wb", buffering=WRITE_BUFFER_BYTES) as out:
            for document in documents:
                ids = tokenizer.encode(document)
                out.write(ids.astype(dtype, copy=False).tobytes())
                out.write(end_of_text)
                count += len(ids) + 1
            out.flush()
            sync_data(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return count


def read_tokens(path: str | Path, dtype: np.dtype | type | str) -> np.ndarray:
    """The ids in a token file `write_tokens` wrote, as a read-only memmap of `dtype` (an empty array for an
    empty file, which cannot be mapped)."""
    path = Path(path)
    dtype = np.dtype(dtype)
    if dtype.name not in TOKEN_DTYPES:
        raise UserError(f"{path}: token dtype {dtype.name} is not one of {', '.join(TOKEN_DTYPES)}; pass the tokenizer's dtype")
    dtype = dtype.newbyteorder("<")
    try:
        size = path.stat().st_size  # bytes
    except OSError as err:
        raise UserError(f"{path}: cannot read the token file ({err.strerror}); write it with write_tokens") from None
    if size % dtype.itemsize:
        raise UserError(f"{path}: {size} bytes is not a whole number of {dtype.name} tokens; the file is truncated or was written with another tokenizer's dtype")
    if size == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _tokenizer(kind: str, specials: tuple[str, ...], merges: tuple[tuple[int, int], ...]) -> Tokenizer:
    """A new tokenizer and its file's bytes."""
    table = _token_table(specials, merges)
    dtype = np.dtype(next(name for name in TOKEN_DTYPES if len(table) <= np.iinfo(name).max + 1))
    return Tokenizer(kind, specials, merges, dtype, _file_bytes(kind, specials, merges, len(table), dtype))


def _file_bytes(kind: str, specials: tuple[str, ...], merges: tuple[tuple[int, int], ...], vocab_size: int, dtype: np.dtype) -> bytes:
    """The canonical file: ASCII JSON (specials' other characters as \\u escapes), one merge a line, fixed key
    order, so that the same tokenizer is always the same bytes."""
    lines = ["{", f' "type": {json.dumps(kind)},', f' "version": {FORMAT_VERSION},', f' "vocab_size": {vocab_size},',
             f' "dtype": {json.dumps(dtype.name)},']
    if kind == "bpe":
        lines.append(f' "pre_tokenizer": {json.dumps(PRE_TOKENIZER)},')
    entries = [f'  {{"id": {BYTE_TOKENS + i}, "text": {json.dumps(text, ensure_ascii=True)}}}' for i, text in enumerate(specials)]
    lines += [' "special_tokens": ['] + [",\n".join(entries)] + [" ]" + ("," if kind == "bpe" else "")]
    if kind == "bpe":
        lines += [' "merges": ['] + ([",\n".join(f"  [{a}, {b}]" for a, b in merges)] if merges else []) + [" ]"]
    return ("\n".join(lines) + "\n}\n").encode("ascii")


def _token_table(specials: tuple[str, ...], merges: tuple[tuple[int, int], ...]) -> tuple[bytes, ...]:
    """The bytes of every id: the 256 bytes, the specials' texts, then each merge's result the first time a merge
    makes it (a later merge of other parts into the same bytes reuses that id). Merges are assumed checked."""
    table = [bytes([byte]) for byte in range(BYTE_TOKENS)] + [text.encode("utf-8") for text in specials]
    known = {token: i for i, token in enumerate(table[:BYTE_TOKENS])}
    for left, right in merges:
        merged = table[left] + table[right]
        if merged not in known:
            known[merged] = len(table)
            table.append(merged)
    return tuple(table)


def _checked_specials(special_tokens: Sequence[str]) -> tuple[str, ...]:
    """The special tokens a caller gave, refused unless they are distinct non-empty strings with END_OF_TEXT."""
    specials = (special_tokens,) if isinstance(special_tokens, str) else tuple(special_tokens)
    for text in specials:
        if not isinstance(text, str) or not text or SURROGATE.search(text):
            raise UserError(f"special token {text!r} must be a non-empty string of UTF-8-encodable characters")
    if len(set(specials)) != len(specials):
        raise UserError(f"special tokens {list(specials)} repeat a token; give each once")
    if END_OF_TEXT not in specials:
        raise UserError(f"special tokens {list(specials)} lack {END_OF_TEXT}, the document separator; add it")
    return specials


def _specials_from_file(path: Path, entries: Any) -> tuple[str, ...]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) and set(e) == {"id", "text"} for e in entries):
        raise UserError(f'{path}: special_tokens must be a list of {{"id": ..., "text": ...}} objects; write the file again with veritrain')
    texts = [e["text"] for e in entries]
    for entry in entries:
        if not isinstance(entry["text"], str) or not entry["text"] or SURROGATE.search(entry["text"]):
            raise UserError(f"{path}: special token text {entry['text']!r} must be a non-empty string; write the file again with veritrain")
        if isinstance(entry["id"], bool) or not isinstance(entry["id"], int):
            raise UserError(f"{path}: special token {entry['text']!r} has id {entry['id']!r}, not a whole number; write the file again with veritrain")
    if END_OF_TEXT not in texts:
        raise UserError(f"{path}: special token {END_OF_TEXT} (the document separator) is missing; add it with the next free id or write the file again with veritrain")
    text_seen: set[str] = set()
    holder_of_id: dict[int, str] = {}
    for i, entry in enumerate(entries):
        if entry["text"] in text_seen:
            raise UserError(f"{path}: special token {entry['text']!r} is listed twice; keep one entry and renumber the rest from 256")
        text_seen.add(entry["text"])
        if entry["id"] < BYTE_TOKENS:
            raise UserError(f"{path}: special token {entry['text']!r} has id {entry['id']}, which collides with byte token {entry['id']} (ids 0-255 are the bytes); number the special tokens from 256")
        if entry["id"] in holder_of_id:
            raise UserError(f"{path}: special tokens {holder_of_id[entry['id']]!r} and {entry['text']!r} collide on id {entry['id']}; number the special tokens 256, 257, ... in order")
        holder_of_id[entry["id"]] = entry["text"]
        if entry["id"] != BYTE_TOKENS + i:
            raise UserError(f"{path}: special token {entry['text']!r} has id {entry['id']}, expected {BYTE_TOKENS + i} (special tokens take 256, 257, ... in order, before the merged tokens); renumber them")
    return tuple(texts)


def _merges_from_file(path: Path, doc: dict[str, Any], n_specials: int) -> tuple[tuple[int, int], ...]:
    """The merges, each refused unless it joins two ids that exist by then and are not special tokens."""
    if doc["type"] == "byte_level":
        if "merges" in doc or "pre_tokenizer" in doc:
            raise UserError(f"{path}: a byte_level tokenizer has no merges or pre_tokenizer; remove them or declare type bpe")
        return ()
    merges = doc.get("merges")
    if not isinstance(merges, list):
        raise UserError(f"{path}: merges must be a list of [id, id] pairs; write the file again with veritrain")
    table = [bytes([byte]) for byte in range(BYTE_TOKENS)] + [b""] * n_specials  # the specials' ids, not their texts, matter here
    known = {token: i for i, token in enumerate(table[:BYTE_TOKENS])}
    first_special, end_special = BYTE_TOKENS, BYTE_TOKENS + n_specials
    checked: list[tuple[int, int]] = []
    for rank, pair in enumerate(merges):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in pair)):
            raise UserError(f"{path}: merge {rank} is {pair!r}, not a pair of token ids; write the file again with veritrain")
        for i in pair:
            if not 0 <= i < len(table) or first_special <= i < end_special:
                raise UserError(f"{path}: merge {rank} {pair} names id {i}, which is a special token or not yet made by an earlier merge (ids 0-{len(table) - 1}); write the file again with veritrain")
        merged = table[pair[0]] + table[pair[1]]
        if merged not in known:
            known[merged] = len(table)
            table.append(merged)
        checked.append((pair[0], pair[1]))
    return tuple(checked)


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: a key given twice would otherwise silently keep the last value."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r} appears twice")
        result[key] = value
    return result


def _surrogate_message(text: str) -> str:
    match = SURROGATE.search(text)
    where = f"a lone surrogate U+{ord(match.group()):04X} at character {match.start()}" if match else "characters UTF-8 cannot encode"
    return f"text has {where}, which UTF-8 cannot encode; decode the source as strict UTF-8 (veritrain's text sources do)"


def _import_tokenizers(purpose: str) -> Any:
    try:
        import tokenizers
        import tokenizers.models
        import tokenizers.pre_tokenizers
        import tokenizers.trainers
    except ImportError:
        raise UserError(f"to {purpose} veritrain needs the tokenizers package; install it with: pip install 'veritrain[lm]'") from None
    return tokenizers


def _gpt2_byte_chars() -> tuple[str, ...]:
    """The character tokenizers' byte-level pre-tokenizer writes for each byte (GPT-2's printable stand-ins):
    printable Latin-1 bytes as themselves, the other 68 (controls, space, DEL, the C1 block, NBSP, soft hyphen) as
    U+0100 onwards in byte order. Only used to translate between tokenizers' strings and veritrain's byte ids."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    chars, stand_in = [], 0x100
    for byte in range(BYTE_TOKENS):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(stand_in))
            stand_in += 1
    return tuple(chars)


_BYTE_CHARS = _gpt2_byte_chars()


def _hf_bpe(token_bytes: tuple[bytes, ...], merges: tuple[tuple[int, int], ...], n_specials: int) -> Any:
    """A tokenizers Tokenizer that encodes with `merges` and gives veritrain's ids: its vocabulary maps each byte
    and merged token (in tokenizers' byte characters) to its id; the specials are left out, so no text becomes one."""
    tokenizers = _import_tokenizers("encode with a BPE tokenizer")
    as_chars = ["".join(_BYTE_CHARS[byte] for byte in token) for token in token_bytes]
    vocab = {chars: i for i, chars in enumerate(as_chars) if not BYTE_TOKENS <= i < BYTE_TOKENS + n_specials}
    model = tokenizers.models.BPE(vocab=vocab, merges=[(as_chars[a], as_chars[b]) for a, b in merges])
    hf = tokenizers.Tokenizer(model)
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return hf
