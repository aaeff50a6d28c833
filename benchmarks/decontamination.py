"""Test-set decontamination before and after a change to text matching: veritrain.data.text_dedup.contamination
(13-word n-grams) of the working tree against the same module at an earlier revision.

    .venv/bin/python benchmarks/decontamination.py [--quick] [--before 11894df] [--seed 1729] [--samples 400]

BEFORE is src/veritrain/data/text_dedup.py at --before, read with `git show` into a temporary file and imported
as text_dedup_before; AFTER is the installed veritrain.data.text_dedup. Both get the same inputs; a planted copy
counts as caught when contamination() lists it among the train documents of its own eval document.

1. Named variants. Held-out paragraphs are paragraphs of veritrain's embedded corpus (the pydoc topics, split on
   blank lines), distinct, of ≥ 60 whitespace-separated words, sharing no 13-gram with any other paragraph of the
   corpus under either version. For each of 20 of them (eval: the clean text) a disguised copy goes into train
   among 300 unrelated paragraphs (ones that share no 13-gram with any held-out paragraph). "12-word pieces" cuts
   the copy into documents of 12 whitespace-separated words placed one after another in train (caught: any piece
   flagged; the last column is the share of pieces flagged); "12-word pieces, scattered" puts the same pieces at
   random places among the unrelated paragraphs, which no n-gram check on documents can see.
2. Recall per edit rate. A share of the words of each held-out paragraph (whitespace-separated; rounded) is
   edited, each edited word by an edit kind drawn from a mixture: replace (by a random word of the corpus, drawn
   by frequency), delete, insert (a random word after it), swap (with the next word, which is taken along),
   homoglyph (one character replaced by a Cyrillic or Greek look-alike; a word with none gets a zero-width space
   instead), zero-width (U+200B at a random place inside). Each rate draws --samples paragraphs (the held-out
   paragraphs in rounds, each round its own contamination() call with the unrelated paragraphs). Cells: recall
   before → after.
3. False flags. Every module, class and function docstring of ≥ 30 words in the standard library's sources
   (parsed with ast, never imported; test, idlelib, lib2to3, site-packages, tkinter and turtledemo skipped),
   identical docstrings kept once, shuffled into 10% eval and 90% train. Flags new after the change are put down
   to one of: "normal form" (an ordered 13-gram shared once both texts are read in the new match form),
   "bag" (only a 14-word window with the same words in another order) or "boundary" (only a window across
   the boundary of two consecutive train documents). Times: wall seconds of one contamination() call, best of 3,
   after a warm-up call that builds each version's character tables (shown separately).

Measured on the 2-core reference machine (default settings, text_dedup.py of the working tree against 11894df;
other processes on the cores, load average about 1.9, so the seconds move by ±50% between runs):

    before: text_dedup.py at 11894df; after: text_dedup.py of the working tree; Python 3.11.7
    held-out paragraphs: 174 (≥ 60 words, no 13-gram shared with another paragraph); unrelated paragraphs: 1007

    1. Named variants: 20 held-out paragraphs (61–206 words), each disguised copy among 300 unrelated paragraphs;
       caught = the copy is flagged for its own eval paragraph
       variant                                   before   after   pieces flagged before / after
       exact copy                                 20/20   20/20
       upper case                                 20/20   20/20
       punctuation changed                        20/20   20/20
       NBSP for spaces                            20/20   20/20
       filler word every 20 words                 19/20   19/20
       newlines for spaces                        20/20   20/20
       ZWSP inside every word                      0/20   20/20
       ZWSP inside every 6th word                  0/20   20/20
       ZWSP for spaces                             0/20   20/20
       Cyrillic o, a, e                            1/20   20/20
       soft hyphens inside words (≥ 4 chars)       1/20   20/20
       word joiners for spaces                     0/20   20/20
       fullwidth characters                        0/20   20/20
       word pairs swapped                          2/20   20/20
       12-word pieces                              0/20   20/20   0% of 164 / 100% of 164
       12-word pieces, scattered                   0/20    6/20   0% of 164 / 5% of 164

    2. Recall per edit rate: 400 perturbed copies per rate and mixture (3 round(s) of the 174 held-out paragraphs,
       each among 300 unrelated paragraphs); cells: recall before → after
       mixture                       2% edited      5% edited     10% edited     20% edited     30% edited
       all six kinds               1.00 → 1.00    1.00 → 1.00    0.98 → 0.99    0.57 → 0.95    0.14 → 0.83
       word-level (first four)     1.00 → 1.00    0.99 → 0.99    0.96 → 0.98    0.57 → 0.86    0.15 → 0.53
       char-level (last two)       1.00 → 1.00    0.99 → 1.00    0.94 → 1.00    0.52 → 1.00    0.17 → 1.00
       replace only                1.00 → 1.00    0.98 → 0.98    0.96 → 0.96    0.55 → 0.55    0.14 → 0.15
       delete only                 1.00 → 1.00    1.00 → 1.00    0.98 → 0.99    0.60 → 0.68    0.17 → 0.23
       insert only                 1.00 → 1.00    0.99 → 0.99    0.96 → 0.96    0.62 → 0.68    0.18 → 0.25
       swap only                   1.00 → 1.00    1.00 → 1.00    0.97 → 1.00    0.59 → 1.00    0.17 → 1.00
       homoglyph only              1.00 → 1.00    0.99 → 1.00    0.95 → 1.00    0.54 → 1.00    0.12 → 1.00
       zero-width only             1.00 → 1.00    0.99 → 1.00    0.95 → 1.00    0.54 → 1.00    0.15 → 1.00

    3. False flags: 2090 distinct docstrings of ≥ 30 words from 608 stdlib files (0.17 M words,
       read in 4 s): 209 eval, 1881 train
                                            before    after
       train docs flagged                       67       70
       eval docs contaminated                   45       45
       seconds, contamination() (best of 3)     0.15     0.34   after/before 2.24
       seconds, first call (tables)           0.11     0.16
       new flags after: 3 (bag: 3); flags lost: 0
       words of these docstrings (old form) that the new form merges with another: 34 in 17 groups of 12013,
         e.g. 0/o, 00/oo, 01/o1, 0s/os, 1/l, 10/lo, c1/cl, cal1/call, cur1/curl, d0/do
       - [bag] eval 146: 'Bind fun to mouse-click event on canvas. Arguments: fun -- a function…'
         train 1265: 'Bind fun to mouse-button-release event on this turtle on canvas. Argu…'
         shared (17 words): 'coordinates of the clicked point on the canvas. btn the number of the mouse-button,'
       - [bag] eval 146: 'Bind fun to mouse-click event on canvas. Arguments: fun -- a function…'
         train 339: 'Bind fun to mouse-move event on this turtle on canvas. Arguments: fun…'
         shared (17 words): 'coordinates of the clicked point on the canvas. btn the number of the mouse-button,'
       - [bag] eval 146: 'Bind fun to mouse-click event on canvas. Arguments: fun -- a function…'
         train 113: 'Bind fun to mouse-click event on this turtle on canvas. Arguments: fu…'
         shared (17 words): 'coordinates of the clicked point on the canvas. btn the number of the mouse-button,'

    variants with copies missed after the change:
       filler word every 20 words: 1 missed, e.g. 'format_spec     ::= [[fill]align][sign]["z"]["#"]["0"][width'
       12-word pieces, scattered: 14 missed, e.g. '[3] The Unicode standard distinguishes between *code points*'

    total 27 s

So after the change every named disguise is caught; before, only the ones words() already undid (case,
punctuation, NBSP and newlines, which str.split() treats as spaces). The two misses after are expected: the
format_spec paragraph is a grammar whose tokens are mostly punctuation, so with a filler every 20 tokens no
13 consecutive words are left (missed before too), and scattered 12-word pieces hold no 13-gram of any one
document. The 6 of 20 scattered paragraphs caught after are luck: a piece plus the first or last word of the
unrelated paragraph beside it in train ("The", "When", "is") forms a 13-gram or 14-word bag of the eval text, the
windows across document boundaries at work; so at a boundary 12 shared words and one common word suffice.

Recall: character-level edits (homoglyph, zero-width) and swaps no longer cost recall at any rate; replacing words
costs what it did (0.55 at 20%); deletions and insertions gain a little (0.60 → 0.68 at 20%) from the bag windows,
where the deleted or inserted word occurs again within 14 words. The word-level mixture at 30%: 0.15 → 0.53.

False flags: 3 new flags, all bag matches and all true reuse: turtle's onclick/onrelease/ondrag docstrings repeat
"fun -- a function with two arguments, to which will be assigned the coordinates of the clicked point on the
canvas" and "num/btn, the number of the mouse-button" with a word added or moved; no flag was lost. The new match
form also folds UTS #39 confusables among ASCII: '0' reads as 'o', '1' as 'l', 'm' as 'rn' (words() gives
'rnethod' for "method" and 'xl' for "x=1"), which merges 34 of the 12,013 distinct docstring words into 17 groups;
none of them caused a flag here. Time: one contamination() call on the docstrings took 0.34 s after against 0.15
s before (2.2×); the first call's tables 0.16 against 0.11 s. The whole run: 27 s (`--quick`: 12 s).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import random
import re
import string
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

from veritrain.data import text_dedup as after_module
from veritrain.data.text_corpus import embedded_topics

NGRAM = 13
MIN_PARAGRAPH_WORDS = 60
MIN_DOCSTRING_WORDS = 30
STDLIB_SKIPPED = {"test", "idlelib", "lib2to3", "site-packages", "tkinter", "turtledemo"}
ZWSP, SOFT_HYPHEN, WORD_JOINER, NBSP = "\u200b", "\u00ad", "\u2060", "\u00a0"
CYRILLIC = str.maketrans({"o": "\u043e", "a": "\u0430", "e": "\u0435"})
HOMOGLYPHS = {  # Latin letter -> look-alikes (Cyrillic, Greek)
    "a": "\u0430", "c": "\u0441", "e": "\u0435", "i": "\u0456\u03b9", "j": "\u0458", "o": "\u043e\u03bf",
    "p": "\u0440\u03c1", "s": "\u0455", "v": "\u03bd", "x": "\u0445\u03c7", "y": "\u0443", "A": "\u0410\u0391",
    "B": "\u0412\u0392", "C": "\u0421", "E": "\u0415\u0395", "H": "\u041d\u0397", "I": "\u0406\u0399",
    "K": "\u041a\u039a", "M": "\u041c\u039c", "N": "\u039d", "O": "\u041e\u039f", "P": "\u0420\u03a1",
    "T": "\u0422\u03a4", "X": "\u0425\u03a7", "Y": "\u03a5", "Z": "\u0396",
}
EDIT_KINDS = ("replace", "delete", "insert", "swap", "homoglyph", "zero-width")
MIXTURES = {
    "all six kinds": EDIT_KINDS,
    "word-level (first four)": EDIT_KINDS[:4],
    "char-level (last two)": EDIT_KINDS[4:],
    **{f"{kind} only": (kind,) for kind in EDIT_KINDS},
}
RATES = (0.02, 0.05, 0.10, 0.20, 0.30)
PUNCTUATION_SWAP = str.maketrans(string.punctuation, string.punctuation[7:] + string.punctuation[:7])
FULLWIDTH = str.maketrans({c: chr(c + 0xFEE0) for c in range(ord("!"), ord("~") + 1)})


# ---------------------------------------------------------------------------------------------- the two versions


def load_before(revision: str) -> ModuleType:
    """text_dedup.py as it was at `revision`, imported under the name text_dedup_before."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "-C", str(root), "show", f"{revision}:src/veritrain/data/text_dedup.py"],
                            check=True, capture_output=True, text=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="decontamination-"))
    path = folder / "text_dedup_before.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("text_dedup_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["text_dedup_before"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def flagged_for(report) -> dict[int, set[int]]:
    """eval index -> the train indices it shares an n-gram with."""
    return {item.eval_index: set(item.train_indices) for item in report.contaminated}


# ---------------------------------------------------------------------------------------------- held-out text


def split_paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def held_out(versions: dict[str, ModuleType], seed: int) -> tuple[list[str], list[str], list[str]]:
    """(held-out paragraphs, unrelated paragraphs, corpus vocabulary), each held-out paragraph sharing no 13-gram
    with any other distinct paragraph and none with an unrelated one, under either version; both lists shuffled."""
    everything = [p for text in embedded_topics().values() for p in split_paragraphs(text)]
    distinct = list(dict.fromkeys(p.strip() for p in everything))
    candidates = [i for i, p in enumerate(distinct) if len(p.split()) >= MIN_PARAGRAPH_WORDS]
    eval_texts = [distinct[i] for i in candidates]
    matched: dict[int, set[int]] = {n: set() for n in range(len(candidates))}
    for module in versions.values():
        for eval_index, trains in flagged_for(module.contamination(eval_texts, distinct, NGRAM)).items():
            matched[eval_index] |= trains
    chosen = [n for n in range(len(candidates)) if matched[n] <= {candidates[n]}]
    pool = [distinct[candidates[n]] for n in chosen]
    near = set(candidates) | {t for n in chosen for t in matched[n]}
    unrelated = [p for i, p in enumerate(distinct) if i not in near and len(p.split()) >= NGRAM]
    rng = random.Random(seed)
    rng.shuffle(pool)
    rng.shuffle(unrelated)
    vocabulary = [w for p in everything for w in p.split() if w.isalpha()]
    return pool, unrelated, vocabulary


def plant(unrelated: list[str], copies: list[list[str]], rng: random.Random,
          scatter: bool = False) -> tuple[list[str], list[list[int]]]:
    """train texts: the unrelated paragraphs with each copy's documents put in among them (one block, or with
    `scatter` each document at its own random place), and per copy the train indices of its documents."""
    blocks: list[tuple[int, list[str]]] = [(-1, [text]) for text in unrelated]
    for number, pieces in enumerate(copies):
        blocks.extend([(number, [piece]) for piece in pieces] if scatter else [(number, pieces)])
    rng.shuffle(blocks)
    train: list[str] = []
    where: list[list[int]] = [[] for _ in copies]
    for number, pieces in blocks:
        for piece in pieces:
            if number >= 0:
                where[number].append(len(train))
            train.append(piece)
    return train, where


# ---------------------------------------------------------------------------------------------- 1. named variants


def inside(word: str, mark: str, at: int | None = None) -> str:
    """`word` with `mark` put inside it (in the middle unless `at` says where); a 1-character word gets it after."""
    if len(word) < 2:
        return word + mark
    cut = len(word) // 2 if at is None else at
    return word[:cut] + mark + word[cut:]


def swap_pairs(words: list[str]) -> list[str]:
    out = list(words)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def filler_every(words: list[str], every: int, filler: str = "basically") -> list[str]:
    out: list[str] = []
    for i, word in enumerate(words, 1):
        out.append(word)
        if i % every == 0:
            out.append(filler)
    return out


def twelve_word_pieces(text: str) -> list[str]:
    words = text.split()
    return [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]


VARIANTS: dict[str, Callable[[str], str | list[str]]] = {
    "exact copy": lambda p: p,
    "upper case": lambda p: p.upper(),
    "punctuation changed": lambda p: p.translate(PUNCTUATION_SWAP),
    "NBSP for spaces": lambda p: NBSP.join(p.split()),
    "filler word every 20 words": lambda p: " ".join(filler_every(p.split(), 20)),
    "newlines for spaces": lambda p: "\n".join(p.split()),
    "ZWSP inside every word": lambda p: " ".join(inside(w, ZWSP) for w in p.split()),
    "ZWSP inside every 6th word": lambda p: " ".join(inside(w, ZWSP) if i % 6 == 5 else w for i, w in enumerate(p.split())),
    "ZWSP for spaces": lambda p: ZWSP.join(p.split()),
    "Cyrillic o, a, e": lambda p: p.translate(CYRILLIC),
    "soft hyphens inside words (≥ 4 chars)": lambda p: " ".join(inside(w, SOFT_HYPHEN) if len(w) >= 4 else w for w in p.split()),
    "word joiners for spaces": lambda p: WORD_JOINER.join(p.split()),
    "fullwidth characters": lambda p: p.translate(FULLWIDTH),
    "word pairs swapped": lambda p: " ".join(swap_pairs(p.split())),
    "12-word pieces": twelve_word_pieces,
    "12-word pieces, scattered": twelve_word_pieces,
}


def named_variants(versions: dict[str, ModuleType], pool: list[str], unrelated: list[str], count: int,
                   fillers: int, seed: int) -> list[tuple[str, list[str]]]:
    """Prints the variants table; returns each (variant, version) that missed copies, with the missed paragraphs."""
    tests = pool[:count]
    print(f"\n1. Named variants: {len(tests)} held-out paragraphs ({min(len(t.split()) for t in tests)}–"
          f"{max(len(t.split()) for t in tests)} words), each disguised copy among {min(fillers, len(unrelated))} "
          f"unrelated paragraphs;\n   caught = the copy is flagged for its own eval paragraph")
    print(f"   {'variant':<40} {'before':>7} {'after':>7}   pieces flagged before / after")
    misses = []
    for number, (name, variant) in enumerate(VARIANTS.items()):
        copies = []
        for text in tests:
            made = variant(text)
            copies.append(made if isinstance(made, list) else [made])
        rng = random.Random(seed * 1000 + number)
        train, where = plant(unrelated[:fillers], copies, rng, scatter=name.endswith("scattered"))
        caught, pieces = {}, {}
        for label, module in versions.items():
            found = flagged_for(module.contamination(tests, train, NGRAM))
            hits = [[t in found.get(n, set()) for t in where[n]] for n in range(len(tests))]
            caught[label] = sum(any(h) for h in hits)
            pieces[label] = (sum(map(sum, hits)), sum(map(len, hits)))
            if caught[label] < len(tests):
                misses.append((f"{name} ({label})", [tests[n][:60] for n in range(len(tests)) if not any(hits[n])]))
        extra = ""
        if any(len(c) > 1 for c in copies):
            extra = "   " + " / ".join(f"{pieces[k][0] / pieces[k][1]:.0%} of {pieces[k][1]}" for k in versions)
        print(f"   {name:<40} {caught['before']:>4}/{len(tests):<2} {caught['after']:>4}/{len(tests):<2}{extra}")
    return misses


# ---------------------------------------------------------------------------------------------- 2. recall per rate


def homoglyph(word: str, rng: random.Random) -> str:
    spots = [i for i, c in enumerate(word) if c in HOMOGLYPHS]
    if not spots:
        return inside(word, ZWSP, rng.randrange(1, len(word)) if len(word) > 1 else None)
    i = rng.choice(spots)
    return word[:i] + rng.choice(HOMOGLYPHS[word[i]]) + word[i + 1 :]


def perturb(text: str, rate: float, kinds: tuple[str, ...], vocabulary: list[str], rng: random.Random) -> str:
    """`text` with round(rate × words) of its whitespace-separated words edited, each by a kind drawn from `kinds`."""
    words = text.split()
    chosen = set(rng.sample(range(len(words)), round(rate * len(words))))
    out: list[str] = []
    i = 0
    while i < len(words):
        word, step = words[i], 1
        kind = rng.choice(kinds) if i in chosen else None
        if kind is None:
            out.append(word)
        elif kind == "replace":
            out.append(rng.choice(vocabulary))
        elif kind == "insert":
            out += [word, rng.choice(vocabulary)]
        elif kind == "swap" and i + 1 < len(words):
            out += [words[i + 1], word]
            step = 2
        elif kind == "homoglyph":
            out.append(homoglyph(word, rng))
        elif kind == "zero-width":
            out.append(inside(word, ZWSP, rng.randrange(1, len(word)) if len(word) > 1 else None))
        elif kind == "swap":
            out.append(word)  # the last word has no next one
        i += step  # "delete" appends nothing
    return " ".join(out)


def recall_per_rate(versions: dict[str, ModuleType], pool: list[str], unrelated: list[str], vocabulary: list[str],
                    samples: int, fillers: int, seed: int) -> None:
    rounds = [pool[: min(len(pool), samples - start)] for start in range(0, samples, len(pool))]
    print(f"\n2. Recall per edit rate: {samples} perturbed copies per rate and mixture ({len(rounds)} round(s) of the "
          f"{len(pool)} held-out paragraphs,\n   each among {min(fillers, len(unrelated))} unrelated paragraphs); "
          f"cells: recall before → after")
    print(f"   {'mixture':<24}" + "".join(f"{f'{rate:.0%} edited':>15}" for rate in RATES))
    for m, (mixture, kinds) in enumerate(MIXTURES.items()):
        cells = []
        for r, rate in enumerate(RATES):
            caught = {label: 0 for label in versions}
            for k, tests in enumerate(rounds):
                rng = random.Random(f"{seed}/{m}/{r}/{k}")
                copies = [[perturb(text, rate, kinds, vocabulary, rng)] for text in tests]
                train, where = plant(unrelated[:fillers], copies, rng)
                for label, module in versions.items():
                    found = flagged_for(module.contamination(tests, train, NGRAM))
                    caught[label] += sum(where[n][0] in found.get(n, set()) for n in range(len(tests)))
            cells.append(f"{caught['before'] / samples:.2f} → {caught['after'] / samples:.2f}")
        print(f"   {mixture:<24}" + "".join(f"{cell:>15}" for cell in cells))


# ---------------------------------------------------------------------------------------------- 3. false flags


def stdlib_docstrings() -> tuple[list[str], int]:
    """Distinct docstrings of ≥ 30 words of the standard library's sources, in path order, and the files parsed."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: dict[str, None] = {}
    files = 0
    for path in sorted(root.rglob("*.py")):
        if STDLIB_SKIPPED & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue
        files += 1
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= MIN_DOCSTRING_WORDS:
                    found.setdefault(doc, None)
    return list(found), files


def new_flag_cause(eval_text: str, train_text: str, module: ModuleType) -> str:
    """Why AFTER pairs these two documents: see the module docstring."""
    def grams(words: list[str], width: int, bag: bool) -> set[tuple[str, ...]]:
        return {tuple(sorted(words[i : i + width])) if bag else tuple(words[i : i + width])
                for i in range(len(words) - width + 1)}

    eval_words = module.words(eval_text)
    readings = [module.words(train_text), module.match_form(train_text, ignorable_as_space=True).split()]
    if any(grams(eval_words, NGRAM, False) & grams(r, NGRAM, False) for r in readings):
        return "normal form"
    width = module.bag_words(NGRAM)
    if any(grams(eval_words, width, True) & grams(r, width, True) for r in readings):
        return "bag"
    return "boundary"


def merged_words(docs: list[str], before: ModuleType, after: ModuleType) -> list[list[str]]:
    """Groups of distinct old-form words that read as one word in the new form ('0' and 'o', 'm' and 'rn'),
    largest first."""
    groups: dict[str, set[str]] = {}
    for word in {w for d in docs for w in before.words(d)}:
        groups.setdefault(" ".join(after.words(word)), set()).add(word)
    return sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g))


def timed(module: ModuleType, eval_texts: list[str], train_texts: list[str], repeat: int) -> tuple[object, float]:
    best, report = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        report = module.contamination(eval_texts, train_texts, NGRAM)
        best = min(best, time.perf_counter() - started)
    return report, best


def clip(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def false_flags(versions: dict[str, ModuleType], setup: dict[str, float], seed: int, repeat: int, examples: int) -> None:
    started = time.perf_counter()
    docs, files = stdlib_docstrings()
    rng = random.Random(seed)
    rng.shuffle(docs)
    cut = len(docs) // 10
    eval_texts, train_texts = docs[:cut], docs[cut:]
    print(f"\n3. False flags: {len(docs)} distinct docstrings of ≥ {MIN_DOCSTRING_WORDS} words from {files} stdlib files "
          f"({sum(len(d.split()) for d in docs) / 1e6:.2f} M words,\n   read in {time.perf_counter() - started:.0f} s): "
          f"{len(eval_texts)} eval, {len(train_texts)} train")
    reports, seconds = {}, {}
    for label, module in versions.items():
        reports[label], seconds[label] = timed(module, eval_texts, train_texts, repeat)
    flagged = {label: set(report.train_indices) for label, report in reports.items()}
    new = sorted(flagged["after"] - flagged["before"])
    lost = sorted(flagged["before"] - flagged["after"])
    print(f"   {'':<34} {'before':>8} {'after':>8}")
    print(f"   {'train docs flagged':<34} {len(flagged['before']):>8} {len(flagged['after']):>8}")
    print(f"   {'eval docs contaminated':<34} {len(reports['before'].contaminated):>8} {len(reports['after'].contaminated):>8}")
    print(f"   {'seconds, contamination() (best of ' + str(repeat) + ')':<34} {seconds['before']:>8.2f} "
          f"{seconds['after']:>8.2f}   after/before {seconds['after'] / seconds['before']:.2f}")
    print(f"   {'seconds, first call (tables)':<34} {setup['before']:>8.2f} {setup['after']:>8.2f}")
    pairs: dict[int, tuple[int, object]] = {}
    for overlap in sorted((o for item in reports["after"].contaminated for o in item.overlaps), key=lambda o: -o.covered_words):
        pairs.setdefault(overlap.train_index, (overlap.eval_index, overlap))
    causes: dict[str, list[int]] = {}
    for train_index in new:
        eval_index, _ = pairs[train_index]
        cause = new_flag_cause(eval_texts[eval_index], train_texts[train_index], versions["after"])
        causes.setdefault(cause, []).append(train_index)
    print(f"   new flags after: {len(new)} ({', '.join(f'{c}: {len(v)}' for c, v in sorted(causes.items())) or 'none'}); "
          f"flags lost: {len(lost)}")
    merged = merged_words(docs, versions["before"], versions["after"])
    print(f"   words of these docstrings (old form) that the new form merges with another: {sum(map(len, merged))} in "
          f"{len(merged)} groups of {len({w for d in docs for w in versions['before'].words(d)})},\n     e.g. "
          + ", ".join("/".join(group) for group in merged[:10]))
    shown = [t for group in zip(*[rng.sample(v, min(examples, len(v))) for v in causes.values()]) for t in group] if causes else []
    leftovers = [t for v in causes.values() for t in v if t not in shown]
    for train_index in (shown + leftovers)[:examples]:
        eval_index, overlap = pairs[train_index]
        cause = next(c for c, v in causes.items() if train_index in v)
        print(f"   - [{cause}] eval {eval_index}: {clip(eval_texts[eval_index], 70)!r}\n"
              f"     train {train_index}: {clip(train_texts[train_index], 70)!r}\n"
              f"     shared ({overlap.covered_words} words): {clip(overlap.spans[0].text, 110)!r}")


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="11894df", help="git revision of text_dedup.py to compare against")
    parser.add_argument("--seed", type=int, default=1729)
    parser.add_argument("--quick", action="store_true", help="fewer samples, one timing run")
    parser.add_argument("--samples", type=int, default=None, help="perturbed copies per rate and mixture (400; quick 100)")
    args = parser.parse_args()
    samples = args.samples or (100 if args.quick else 400)
    started = time.perf_counter()
    before = load_before(args.before)
    versions = {"before": before, "after": after_module}
    setup = {}
    for label, module in versions.items():  # builds each version's character tables once
        tick = time.perf_counter()
        module.contamination(["warm up " * 10], ["warm up " * 10], NGRAM)
        setup[label] = time.perf_counter() - tick
    pool, unrelated, vocabulary = held_out(versions, args.seed)
    print(f"before: text_dedup.py at {args.before}; after: {Path(after_module.__file__).name} of the working tree; "
          f"Python {sys.version.split()[0]}")
    print(f"held-out paragraphs: {len(pool)} (≥ {MIN_PARAGRAPH_WORDS} words, no 13-gram shared with another paragraph); "
          f"unrelated paragraphs: {len(unrelated)}")
    misses = named_variants(versions, pool, unrelated, 20, 300, args.seed)
    recall_per_rate(versions, pool, unrelated, vocabulary, samples, 300, args.seed)
    false_flags(versions, setup, args.seed, 1 if args.quick else 3, 5)
    print("\nvariants with copies missed after the change:")
    for name, texts in misses:
        if name.endswith("(after)"):
            print(f"   {name[: -len(' (after)')]}: {len(texts)} missed, e.g. {texts[0]!r}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
