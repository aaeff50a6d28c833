"""Peak memory of preparing a text data version against the size of the corpus: what each extra MB costs.

    .venv/bin/python benchmarks/text_prepare_memory.py [--sizes 5 10 20 40] [--quick]

Writes a folder of `.txt` documents per size (MB = 10^6 bytes of UTF-8), made from veritrain's embedded corpus
(the pydoc topics, veritrain.data.text_corpus): each document a random window of 150–1,500 words of one topic with
half of its words replaced by random words of the corpus, so that the documents are distinct and near duplicates and
contamination stay rare, as among real distinct documents (at 30% replaced, 13-word n-grams shared by overlapping
windows quarantined 60 documents of 4 MB already, more with every MB); the same seed, so a smaller corpus is the
first documents of a larger one. For each size runs `python -m veritrain data prepare` in a fresh child process on a
config with `data.source: text`, `split_documents: file` and the byte-level tokenizer (the default), into a fresh
workspace, and reads the child's own peak resident memory from `os.wait4` (ru_maxrss: the kernel's high-water mark of
that process alone, no sampling; preparing text starts no workers). Prints MB of corpus, the peak RSS, its growth per
corpus MB between consecutive sizes, the whole gate's time and MB/s (`timings.total` of version.json: from reading the
folder to the sealed version) and the whole process's seconds, the documents quarantined and the MiB of tokens the
gate wrote.

Then, to see where the memory goes, a second child per size runs the gate's stages one after another on the same
documents, as `text_prepare.prepare` does (each result kept alive, as there): reading the folder
(`text_sources.read_text_folder`), content hashes, near duplicates, exact duplicates, contamination (every 10th
document and the next as val and test), `tokenizer.write_tokens` of every document into one file, the statistics.
Before each it resets the high-water mark (/proc/self/clear_refs) and prints the stage's peak above the resident
memory at its start, and what stayed resident after it. `--quick`: 1, 2 and 4 MB.

Since the gate streams (its documents in scratch files, their keys in partition files, 2 workers from 8 MB on):
95 / 95 / 111 / 120 MiB at 5 / 10 / 20 / 40 MB, 0.69 MiB per MB, the gate at 2.7-4.1 MB/s (benchmarks/README.md;
benchmarks/text_gigabyte.py for 100 MB and 1 GB). What follows was measured before, when the gate held the corpus.

Measured on the 2-core reference machine (default sizes; the times with other processes on the cores):

    corpus MB  documents  peak RSS MiB  growth MiB/MB  gate s  gate MB/s  process s  quarantined  tokens MiB  token stage MiB
          5.0      1,416         103.8                   2.01       2.48       2.67            0         9.5              0.1
         10.0      2,888         141.7           7.59    4.00       2.50       4.69            0        19.1              0.1
         20.0      5,795         224.3           8.25    7.96       2.51       8.68            0        38.2              0.1
         40.0     11,596         393.8           8.48   15.78       2.54      16.59            3        76.3              0.1
    peak RSS 8.28 MiB per corpus MB from 5 to 40 MB (62 MiB at 0 MB on that line)

               stage         5 MB        10 MB         20 MB         40 MB   (MiB at the stage's peak / kept after it)
      read documents    9.4 / 9.4  20.2 / 20.2   41.9 / 41.9   85.0 / 85.0
     near duplicates  30.1 / 18.8  36.8 / 24.2   49.8 / 38.0   84.0 / 55.6
       contamination   22.5 / 1.3   44.7 / 2.1   91.6 / 6.6  197.2 / 27.6
        write tokens    0.1 / 0.1    0.1 / 0.1    0.1 / 0.1    0.1 / 0.1
    (content hashes, exact duplicates and statistics: under 1 MiB each)

`--quick`: 72.3 / 79.3 / 93.7 MiB at 1 / 2 / 4 MB, 7.14 MiB per MB, the token stage 0.1–0.9 MiB.

So the gate's peak is linear in the corpus: about 8.3 MiB per MB of text (8.7 bytes per byte; the slope creeps up
from 7.6 to 8.5 as the contamination index grows) above about 62 MiB; the gate runs at 2.5 MB/s.

Tokenization streams, and its memory does not grow with the corpus. `tokenizer.write_tokens` takes an iterator of
documents and per document encodes it (byte level: the UTF-8 bytes, then their uint16 copy), writes the ids and the
end-of-text id through a 1 MiB buffered file, and keeps only a running count: the token arrays (2 bytes per byte
of text here, 76 MiB at 40 MB) are never held, and the stage's extra peak stays at 0.1–0.9 MiB at every size (the
`token stage` column); readers memory-map the files. What grows is the rest of the gate, which holds the whole
corpus at once: `load_text_source` reads every document into a `TextDocument` before any stage runs, and every later
stage works on that list, `write_tokens`' generator included. That list is 2.1 MiB per MB, not 1: CPython stores a
str at the width of its widest character, and 1,186 of the 1,416 documents of 5 MB hold one outside Latin-1 (the
curly quotes and dashes of 49 of the 79 topics), so they take 2 bytes a character. The largest part is the contamination index:
8 bytes of n-gram hash and 8 of owner per train word, concatenated and sorted (about 4.6–4.9 MiB per MB at its peak),
on top of what near-duplicate detection left resident (its shingle sets and signatures are freed, but glibc keeps
most of that memory: `malloc_trim(0)` after it gives back 30 of the 38 MiB at 20 MB). The gate's peak is about
their sum: at 40 MB, 62 + 85 + 56 + 197 = 400 MiB against the 394 measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

MB = 10**6
MIB = 1 << 20
WINDOW_WORDS = (150, 1500)
REPLACED = 0.50  # of a window's words: distinct documents share few word pairs and almost never a 13-word n-gram
SEED = 0


def write_corpus(folder: Path, megabytes: float) -> tuple[int, int]:
    """Documents until their UTF-8 reaches `megabytes` MB; returns (documents, bytes). The same prefix for every size."""
    from veritrain.data.text_corpus import embedded_topics

    topics = [text.split() for _, text in sorted(embedded_topics().items())]
    topics = [words for words in topics if len(words) >= WINDOW_WORDS[0]]
    pool = [word for words in topics for word in words]
    rng = random.Random(SEED)
    folder.mkdir(parents=True)
    documents = written = 0
    while written < megabytes * MB:
        words = rng.choice(topics)
        length = min(len(words), rng.randint(*WINDOW_WORDS))
        start = rng.randrange(len(words) - length + 1)
        window = words[start : start + length]
        for position in rng.sample(range(length), round(REPLACED * length)):
            window[position] = rng.choice(pool)
        data = " ".join(window).encode("utf-8")
        (folder / f"doc-{documents:06d}.txt").write_bytes(data)
        documents += 1
        written += len(data)
    return documents, written


def prepare(folder: Path, scratch: Path) -> tuple[int, float, dict]:
    """(peak RSS in bytes, wall seconds, version.json) of one `veritrain data prepare` in a fresh child process."""
    config = scratch / "data.yaml"
    config.write_text(f"task: lm\nmodel:\n  name: gpt\ndata:\n  source: text\n  root: {json.dumps(str(folder))}\n  text:\n    split_documents: file\n"
                      "  tokenizer:\n    kind: byte_level\n")
    started = time.perf_counter()
    with open(scratch / "stdout", "wb") as out, open(scratch / "stderr", "wb") as err:
        child = subprocess.Popen([sys.executable, "-m", "veritrain", "data", "prepare", str(config), "--workdir", str(scratch / "ws"), "--json"],
                                 stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)  # the rusage of this child alone
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"veritrain data prepare exited {os.waitstatus_to_exitcode(status)}:\n{(scratch / 'stderr').read_text()[-3000:]}")
    data_dir = Path(json.loads((scratch / "stdout").read_text())["split_files"]["train"]).parent.parent
    return usage.ru_maxrss * 1024, seconds, json.loads((data_dir / "version.json").read_text())  # Linux: ru_maxrss in KiB


def _status(key: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(key + ":"))


def stages(folder: Path, out: Path) -> None:
    """The child of `--stages`: the gate's stages one after another on the folder's documents, as `text_prepare.prepare`
    runs them (each result kept alive, as the gate keeps it), and for each the resident memory before it, its peak (the
    high-water mark reset before it through /proc/self/clear_refs) and after it; prints them as JSON."""
    import blake3

    from veritrain.data import text_dedup, tokenizer
    from veritrain.data.text_prepare import text_statistics
    from veritrain.data.text_sources import read_text_folder

    kept, measured = [], {}

    def stage(name: str, work: Callable[[], Any]) -> Any:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM back to the current resident memory
        before = _status("VmRSS")
        kept.append(work())
        measured[name] = {"before": before, "peak": _status("VmHWM"), "after": _status("VmRSS")}
        return kept[-1]

    listing = stage("read documents", lambda: read_text_folder(folder, "file", 1_000_000))
    texts = [doc.text for doc in listing.documents]
    stage("content hashes", lambda: [blake3.blake3(text.encode("utf-8")).hexdigest() for text in texts])
    stage("near duplicates", lambda: text_dedup.near_duplicates(texts))
    stage("exact duplicates", lambda: text_dedup.exact_duplicates(texts))
    held_out = [text for i, text in enumerate(texts) if i % 10 in (0, 1)]  # about the gate's 10% val + 10% test
    train = [text for i, text in enumerate(texts) if i % 10 not in (0, 1)]
    stage("contamination", lambda: text_dedup.contamination(held_out, train))
    byte_level = tokenizer.byte_level()
    stage("write tokens", lambda: tokenizer.write_tokens(iter(texts), byte_level, out))  # every split's documents, into one file
    stage("statistics", lambda: text_statistics(train))
    print(json.dumps(measured))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=float, nargs="+", default=[5, 10, 20, 40], help="corpus sizes in MB")
    parser.add_argument("--quick", action="store_true", help="1, 2 and 4 MB")
    parser.add_argument("--stages", nargs=2, metavar=("FOLDER", "OUT"), help=argparse.SUPPRESS)  # the stage child's own process
    args = parser.parse_args()
    if args.stages:
        stages(Path(args.stages[0]), Path(args.stages[1]))
        return
    sizes = [1.0, 2.0, 4.0] if args.quick else sorted(args.sizes)
    print(f"{'corpus MB':>9} {'documents':>9} {'peak RSS MiB':>12} {'growth MiB/MB':>13} {'gate s':>6} {'gate MB/s':>9} {'process s':>9} "
          f"{'quarantined':>11} {'tokens MiB':>10} {'token stage MiB':>15}")
    rows, breakdown = [], []
    for megabytes in sizes:
        scratch = Path(tempfile.mkdtemp(prefix="vt-text-memory-"))
        try:
            folder = scratch / "corpus"
            documents, written = write_corpus(folder, megabytes)
            peak, seconds, info = prepare(folder, scratch)
            child = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--stages", str(folder), str(scratch / "tokens.bin")],
                                   check=True, capture_output=True, text=True)
            measured = json.loads(child.stdout)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        gate = info["timings"]["total"]
        growth = f"{(peak - rows[-1][1]) / MIB / ((written - rows[-1][0]) / MB):>13.2f}" if rows else f"{'':>13}"
        rows.append((written, peak))
        breakdown.append((written, measured))
        tokens = measured["write tokens"]
        token_bytes = sum(info["tokens"].values()) * np.dtype(info["tokenizer"]["dtype"]).itemsize  # what the gate wrote
        print(f"{written / MB:>9.1f} {documents:>9,} {peak / MIB:>12.1f} {growth} {gate:>6.2f} {written / MB / gate:>9.2f} {seconds:>9.2f} "
              f"{sum(info['quarantined'].values()):>11} {token_bytes / MIB:>10.1f} {(tokens['peak'] - tokens['before']) / MIB:>15.1f}",
              flush=True)
    if len(rows) >= 2:
        (first_bytes, first_peak), (last_bytes, last_peak) = rows[0], rows[-1]
        slope = (last_peak - first_peak) / (last_bytes - first_bytes)
        print(f"peak RSS {slope * MB / MIB:.2f} MiB per corpus MB from {first_bytes / MB:.0f} to {last_bytes / MB:.0f} MB "
              f"({(first_peak - first_bytes * slope) / MIB:.0f} MiB at 0 MB on that line)")
    print("\nthe stages one by one (one child per size): MiB above the resident memory at the stage's start, at its peak / kept after it")
    print(f"{'stage':>16} " + " ".join(f"{f'{written / MB:.0f} MB':>13}" for written, _ in breakdown))
    for name in breakdown[0][1]:
        cells = [f"{(m[name]['peak'] - m[name]['before']) / MIB:.1f} / {(m[name]['after'] - m[name]['before']) / MIB:.1f}" for _, m in breakdown]
        print(f"{name:>16} " + " ".join(f"{cell:>13}" for cell in cells))
    print(f"{'(resident after)':>16} " + " ".join(f"{m['statistics']['after'] / MIB:>13.1f}" for _, m in breakdown))


if __name__ == "__main__":
    main()
