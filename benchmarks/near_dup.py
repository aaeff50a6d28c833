"""Near-duplicate text detection: veritrain.data.text_dedup against datasketch's MinHash + MinHashLSH.

    .venv/bin/python benchmarks/near_dup.py [--mb 50] [--repeat 1] [--memory-sizes 10 25 50] [--brute-mb 2]
    .venv/bin/python benchmarks/near_dup.py --choose-defaults     # the measurement behind the defaults

The corpus is made by perturbing text that ships with installed packages: veritrain's embedded corpus (CPython's
pydoc topics) plus every *.rst, *.md and dist-info METADATA file under site-packages that reads as prose (valid
UTF-8, ≥ 100 words, ≥ 60% of them alphabetic). A document is a random window of 150–1,500 whitespace-separated
words of one of those files with 30% of its words replaced by random words of the pool (so two documents share
few word pairs even when their windows overlap); 10% of the documents get 1–3 copies with 5% of the words
replaced (families). Both sides use the same settings (2-word shingles of words(), 128 hash functions as 32 bands
× 4 rows, documents under 20 words skipped) and find candidates that are then confirmed by exact Jaccard ≥ 0.6.

Ground truth: every pair inside a family with exact Jaccard ≥ 0.6 (word-tuple sets, text_dedup.jaccard), plus any
pair either side confirmed outside the families; a brute-force all-pairs check on the first --brute-mb MB shows
no pair across families reaches the threshold. Columns: seconds, MB/s, candidate recall, confirmed recall. Memory:
one process per size and side, peak RSS of the stage above the RSS once the corpus is built (VmHWM after a
/proc/self/clear_refs reset). Target: veritrain at least as fast as datasketch at the same recall, memory at most
linear in corpus size.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from veritrain.data.text_corpus import embedded_topics
from veritrain.data.text_dedup import (
    DEFAULT_SETTINGS,
    all_pairs_jaccard,
    contamination,
    exact_duplicates,
    jaccard,
    lsh_candidates,
    minhash_signatures,
    near_duplicates,
    pair_overlaps,
    shingle_sets,
    words,
)

DISTINCT_REPLACED = 0.30  # of the words of a window, so that distinct documents stay far below the threshold
COPY_REPLACED = 0.05  # of the words of a family copy: the edit the defaults were chosen for
FAMILY_SHARE = 0.10  # of the distinct documents get copies
WINDOW_WORDS = (150, 1500)


# ---------------------------------------------------------------------------------------------- the corpus


def source_texts() -> tuple[list[tuple[str, str]], dict[str, int]]:
    """(name, text) of the prose the corpus is made from, and the bytes contributed by each kind of source."""
    texts = [(f"pydoc:{topic}", text) for topic, text in embedded_topics().items()]
    sizes = {"pydoc topics (veritrain's embedded corpus)": sum(len(t.encode()) for _, t in texts)}
    site = Path(sysconfig.get_paths()["purelib"])
    for path in sorted(site.rglob("*")):
        kind = "METADATA" if path.name == "METADATA" else path.suffix
        if kind not in ("METADATA", ".rst", ".md") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        document = words(text)
        if len(document) < 100 or sum(word.isalpha() for word in document) < 0.6 * len(document):
            continue
        texts.append((str(path.relative_to(site)), text))
        sizes[f"site-packages {kind}"] = sizes.get(f"site-packages {kind}", 0) + len(text.encode())
    return texts, sizes


@dataclass
class Corpus:
    texts: list[str]
    families: list[list[int]]  # a distinct document and its copies
    sources: dict[str, int]  # bytes of source text by kind
    megabytes: float


def build_corpus(megabytes: float, seed: int = 0) -> Corpus:
    """Documents made from the source texts until their UTF-8 size reaches `megabytes` (10^6 bytes)."""
    texts_by_name, sizes = source_texts()
    rng = np.random.default_rng(seed)
    vocabulary: dict[str, int] = {}
    streams = [np.array([vocabulary.setdefault(token, len(vocabulary)) for token in text.split()], dtype=np.int64)
               for _, text in texts_by_name]
    streams = [stream for stream in streams if len(stream) >= WINDOW_WORDS[0]]
    tokens = np.array(list(vocabulary), dtype=object)
    weights = np.array([len(stream) for stream in streams], dtype=np.float64)
    weights /= weights.sum()

    def replaced(ids: np.ndarray, share: float) -> np.ndarray:
        ids = ids.copy()
        positions = rng.choice(len(ids), size=max(1, round(share * len(ids))), replace=False)
        ids[positions] = rng.integers(0, len(tokens), len(positions))
        return ids

    texts: list[str] = []
    families: list[list[int]] = []
    total = 0
    while total < megabytes * 1e6:
        stream = streams[rng.choice(len(streams), p=weights)]
        length = min(len(stream), int(rng.integers(*WINDOW_WORDS)))
        start = int(rng.integers(0, len(stream) - length + 1))
        ids = replaced(stream[start : start + length], DISTINCT_REPLACED)
        members = [len(texts)]
        texts.append(" ".join(tokens[ids]))
        if rng.random() < FAMILY_SHARE:
            for _ in range(int(rng.integers(1, 4))):
                members.append(len(texts))
                texts.append(" ".join(tokens[replaced(ids, COPY_REPLACED)]))
        total += sum(len(texts[i].encode()) for i in members)
        if len(members) > 1:
            families.append(members)
    return Corpus(texts, families, sizes, total / 1e6)


def family_truth(corpus: Corpus) -> set[tuple[int, int]]:
    """Pairs inside a family whose exact Jaccard (word tuples) reaches the threshold."""
    truth = set()
    for members in corpus.families:
        for position, first in enumerate(members):
            for second in members[position + 1 :]:
                if jaccard(corpus.texts[first], corpus.texts[second]) >= DEFAULT_SETTINGS.threshold:
                    truth.add((first, second))
    return truth


# ---------------------------------------------------------------------------------------------- the two sides


def veritrain_side(texts: list[str]) -> dict:
    """The stage in pieces (for the comparable part) and whole (near_duplicates, for the stage's MB/s)."""
    s = DEFAULT_SETTINGS
    start = time.perf_counter()
    shingles = shingle_sets(texts, s.shingle_words, s.min_words)
    shingled = time.perf_counter()
    signatures = minhash_signatures(shingles.sets, s.num_perm, s.seed)
    signed = time.perf_counter()
    local = lsh_candidates(signatures, s.bands, s.rows)
    banded = time.perf_counter()
    shared, union = pair_overlaps(shingles.sets, local)
    confirmed = time.perf_counter()
    kept = np.array(shingles.kept)
    candidates = {(int(kept[i]), int(kept[j])) for i, j in local}
    keep = shared / np.maximum(union, 1) >= s.threshold  # the test near_duplicates makes
    pairs = {(int(kept[i]), int(kept[j])) for (i, j), k in zip(local, keep) if k}
    whole_start = time.perf_counter()
    report = near_duplicates(texts)
    whole = time.perf_counter() - whole_start
    assert {(p.first, p.second) for p in report.pairs} == pairs
    return {"shingles_s": shingled - start, "signatures_s": signed - shingled, "lsh_s": banded - signed,
            "confirm_s": confirmed - banded, "candidates_s": banded - start, "whole_s": whole,
            "candidates": candidates, "pairs": pairs}


def datasketch_side(texts: list[str]) -> dict:
    """datasketch 1.6.5 as documented: MinHash.update_batch on the UTF-8 shingles (its fastest update), one
    MinHashLSH with params=(bands, rows), insertion through an insertion session, one query per document; then
    the candidates confirmed by exact Jaccard of the Python sets of shingles."""
    from datasketch import MinHash, MinHashLSH

    s = DEFAULT_SETTINGS
    start = time.perf_counter()
    documents = [words(text) for text in texts]
    worded = time.perf_counter()
    permutations = MinHash(num_perm=s.num_perm, seed=1).permutations  # made once, not per document
    lsh = MinHashLSH(num_perm=s.num_perm, params=(s.bands, s.rows))
    sets, minhashes = {}, {}
    with lsh.insertion_session() as session:
        for index, document in enumerate(documents):
            if len(document) < s.min_words:
                continue
            shingles = {" ".join(document[i : i + s.shingle_words]).encode("utf-8")
                        for i in range(len(document) - s.shingle_words + 1)}
            minhash = MinHash(num_perm=s.num_perm, permutations=permutations)
            minhash.update_batch(shingles)
            session.insert(index, minhash)
            sets[index], minhashes[index] = shingles, minhash
    candidates = set()
    for index, minhash in minhashes.items():
        for other in lsh.query(minhash):
            if other != index:
                candidates.add((min(index, other), max(index, other)))
    banded = time.perf_counter()
    pairs = set()
    for first, second in candidates:
        a, b = sets[first], sets[second]
        shared = len(a & b)
        if shared / (len(a) + len(b) - shared) >= s.threshold:
            pairs.add((first, second))
    confirmed = time.perf_counter()
    return {"words_s": worded - start, "candidates_s": banded - start, "confirm_s": confirmed - banded,
            "whole_s": confirmed - start, "candidates": candidates, "pairs": pairs}


def whole_stage(corpus: Corpus) -> None:
    """The duplicate and contamination stage as a data gate runs it: exact and near duplicates over every document,
    then every tenth document taken as val/test and checked against the others for 13-gram overlap."""
    texts = corpus.texts
    start = time.perf_counter()
    exact = exact_duplicates(texts)
    exact_done = time.perf_counter()
    near = near_duplicates(texts)
    near_done = time.perf_counter()
    eval_texts = texts[::10]
    train_texts = [text for index, text in enumerate(texts) if index % 10]
    report = contamination(eval_texts, train_texts)
    done = time.perf_counter()
    mb = corpus.megabytes
    print(f"\nwhole stage on {mb:.1f} MB: exact duplicates {exact_done - start:.2f} s ({len(exact)} groups), near duplicates "
          f"{near_done - exact_done:.2f} s ({len(near.pairs)} pairs), contamination of {len(eval_texts)} eval documents "
          f"{done - near_done:.2f} s ({len(report.contaminated)} contaminated, mostly family copies split across the "
          f"two sides): {done - start:.2f} s, {mb / (done - start):.2f} MB/s")


# ---------------------------------------------------------------------------------------------- memory


def memory_child(megabytes: float, side: str) -> None:
    """Run one side on one corpus size and print the stage's peak RSS above the RSS before it, as JSON."""
    corpus = build_corpus(megabytes)
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    start = time.perf_counter()
    if side == "veritrain":
        near_duplicates(corpus.texts)
    else:
        datasketch_side(corpus.texts)
    print(json.dumps({"mb": corpus.megabytes, "documents": len(corpus.texts), "seconds": time.perf_counter() - start,
                      "rss_before_mib": before / 1024, "peak_mib": _status_kib("VmHWM") / 1024}))


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def measure_memory(sizes: list[float], sides: list[str]) -> None:
    print("\npeak memory of the stage (one process per run; corpus built first, its RSS subtracted):")
    print(f"{'side':<11} {'MB':>6} {'docs':>7} {'s':>7} {'RSS before':>11} {'peak':>9} {'stage':>9} {'per MB':>8}")
    for side in sides:
        for size in sizes:
            out = subprocess.run([sys.executable, __file__, "--memory-child", str(size), side], check=True,
                                 capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            grown = r["peak_mib"] - r["rss_before_mib"]
            print(f"{side:<11} {r['mb']:>6.1f} {r['documents']:>7} {r['seconds']:>7.2f} {r['rss_before_mib']:>8.0f} MiB"
                  f" {r['peak_mib']:>5.0f} MiB {grown:>5.0f} MiB {grown / r['mb']:>5.2f} MiB")


# ---------------------------------------------------------------------------------------------- the defaults


def choose_defaults(seeds: int = 10) -> None:
    """Jaccard of 5%-edited copies of every corpus paragraph of ≥ 20 words, per shingle size, and what bands ×
    rows make of it: the numbers in NearDuplicateSettings' docstring."""
    paragraphs = [p for text in embedded_topics().values() for p in re.split(r"\n[ \t]*\n", text)
                  if len(words(p)) >= DEFAULT_SETTINGS.min_words]
    vocabulary = sorted({token for p in paragraphs for token in p.split()})
    print(f"{len(paragraphs)} paragraphs of ≥ {DEFAULT_SETTINGS.min_words} words, {seeds} edited copies each")
    measured = {}
    for k in (2, 3, 4, 5):
        rng = random.Random(0)
        values = []
        for _ in range(seeds):
            for paragraph in paragraphs:
                tokens = paragraph.split()
                for position in rng.sample(range(len(tokens)), max(1, round(COPY_REPLACED * len(tokens)))):
                    replacement = rng.choice(vocabulary)
                    while replacement == tokens[position]:
                        replacement = rng.choice(vocabulary)
                    tokens[position] = replacement
                values.append(jaccard(paragraph, " ".join(tokens), k))
        v = np.array(values)
        measured[k] = v
        print(f"k={k}: mean {v.mean():.3f}, 0.1% quantile {np.quantile(v, 0.001):.3f}, min {v.min():.3f}; "
              f"below 0.5: {(v < 0.5).mean():.2%}, 0.6: {(v < 0.6).mean():.2%}, 0.7: {(v < 0.7).mean():.2%}")
    # unrelated documents: 450-word windows of the whole corpus, pairs not overlapping in text
    stream = [w for text in embedded_topics().values() for w in words(text)]
    rng = random.Random(2)
    windows = [" ".join(stream[s : s + 450]) for s in rng.sample(range(len(stream) - 450), 300)]
    unrelated = np.array([p.jaccard for p in all_pairs_jaccard(windows, threshold=1e-9, shingle_words=2)])
    unrelated = np.concatenate([unrelated[unrelated < 0.3], np.zeros(300 * 299 // 2 - len(unrelated))])
    print(f"unrelated 450-word windows, k=2: mean Jaccard {unrelated.mean():.4f}")
    edited = measured[2]
    for bands, rows in ((32, 4), (42, 3), (25, 5), (64, 2), (16, 8)):
        def chance(j):
            return 1 - (1 - j**rows) ** bands
        found = np.mean(np.where(edited >= 0.6, chance(edited), 0.0))
        print(f"k=2, J ≥ 0.6, {bands} bands × {rows} rows ({bands * rows} hashes): candidate at J=0.6 "
              f"{chance(0.6):.4f}, at the edited minimum {chance(edited.min()):.4f}, edited copies found {found:.5f}, "
              f"unrelated pairs proposed {chance(unrelated).mean():.1e}")


# ---------------------------------------------------------------------------------------------- main


def recall(found: set, truth: set) -> float:
    return len(found & truth) / len(truth) if truth else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=50.0, help="corpus size for the speed comparison, 10^6 bytes")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved runs of each side; medians are shown")
    parser.add_argument("--memory-sizes", type=float, nargs="*", default=[10.0, 25.0, 50.0])
    parser.add_argument("--memory-datasketch", action="store_true", help="measure datasketch's memory too")
    parser.add_argument("--brute-mb", type=float, default=2.0, help="all-pairs check of the ground truth on this much")
    parser.add_argument("--choose-defaults", action="store_true")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(float(args.memory_child[0]), args.memory_child[1])
        return
    if args.choose_defaults:
        choose_defaults()
        return
    import datasketch

    started = time.perf_counter()
    corpus = build_corpus(args.mb)
    tokens = sum(len(text.split()) for text in corpus.texts)
    print(f"corpus: {corpus.megabytes:.1f} MB, {len(corpus.texts)} documents, {tokens / 1e6:.1f} M whitespace-separated "
          f"words (source words are long: URLs, markup), {len(corpus.families)} families "
          f"(built in {time.perf_counter() - started:.0f} s) from")
    for kind, size in corpus.sources.items():
        print(f"  {kind}: {size / 1e6:.2f} MB")
    print(f"datasketch {datasketch.__version__}, numpy {np.__version__}; settings {DEFAULT_SETTINGS}")

    if args.brute_mb > 0:
        prefix, size = [], 0
        for text in corpus.texts:
            if size >= args.brute_mb * 1e6:
                break
            prefix.append(text)
            size += len(text.encode())
        family_of = {i: n for n, members in enumerate(corpus.families) for i in members}
        brute = all_pairs_jaccard(prefix)
        across = [p for p in brute if family_of.get(p.first, -1 - p.first) != family_of.get(p.second, -2 - p.second)]
        print(f"brute force on the first {len(prefix)} documents ({size / 1e6:.1f} MB): {len(brute)} pairs ≥ "
              f"{DEFAULT_SETTINGS.threshold}, {len(across)} of them across families")

    truth = family_truth(corpus)
    ours, theirs = [], []
    for _ in range(args.repeat):
        ours.append(veritrain_side(corpus.texts))
        theirs.append(datasketch_side(corpus.texts))
    outside = (ours[0]["pairs"] | theirs[0]["pairs"]) - truth
    truth |= {pair for pair in outside if jaccard(corpus.texts[pair[0]], corpus.texts[pair[1]]) >= DEFAULT_SETTINGS.threshold}
    print(f"ground truth: {len(truth)} pairs ({len(outside)} found outside the families)")

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(run[key] for run in runs)

    mb = corpus.megabytes
    print(f"\n{'':<34} {'seconds':>8} {'MB/s':>7} {'cand. recall':>13} {'recall':>7} {'candidates':>11}")
    for name, runs in (("veritrain (shingles→candidates)", ours), ("datasketch (words→candidates)", theirs)):
        t = median(runs, "candidates_s")
        print(f"{name:<34} {t:>8.2f} {mb / t:>7.2f} {recall(runs[0]['candidates'], truth):>13.4f} "
              f"{recall(runs[0]['pairs'], truth):>7.4f} {len(runs[0]['candidates']):>11}")
    for name, runs in (("veritrain whole stage", ours), ("datasketch + exact confirmation", theirs)):
        t = median(runs, "whole_s")
        print(f"{name:<34} {t:>8.2f} {mb / t:>7.2f}")
    print(f"\nveritrain pieces: shingles {median(ours, 'shingles_s'):.2f} s, signatures {median(ours, 'signatures_s'):.2f} s, "
          f"LSH {median(ours, 'lsh_s'):.2f} s, confirmation {median(ours, 'confirm_s'):.2f} s")
    print(f"datasketch pieces: words() {median(theirs, 'words_s'):.2f} s, MinHash + LSH "
          f"{median(theirs, 'candidates_s') - median(theirs, 'words_s'):.2f} s, confirmation {median(theirs, 'confirm_s'):.2f} s")
    print(f"speed ratio (datasketch time / veritrain time): candidates {median(theirs, 'candidates_s') / median(ours, 'candidates_s'):.2f}×, "
          f"with confirmation {median(theirs, 'whole_s') / median(ours, 'whole_s'):.2f}×")

    whole_stage(corpus)

    if args.memory_sizes:
        measure_memory(args.memory_sizes, ["veritrain"] + (["datasketch"] if args.memory_datasketch else []))


if __name__ == "__main__":
    main()
