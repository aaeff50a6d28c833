"""The text gate on a gigabyte: peak memory and throughput of `veritrain data prepare` on 100 MB and 1 GB of distinct
text, and whether it finds every fault planted in it.

    .venv/bin/python benchmarks/text_gigabyte.py [--sizes 100 1000] [--corpora DIR]

The corpus (MB = 10^6 bytes of document text, UTF-8) is JSONL, 10 MB a file, each line `{"id", "text"[, "split"]}`,
written by a seeded word-bigram model of the text veritrain ships (the pydoc topics, veritrain.data.text_corpus):
each next word follows the current one as it does somewhere in the topics, or with probability JUMP is any word of
their vocabulary, so documents of 150-1,500 words are distinct text rather than copies of the topics. The same seed
gives the same documents, so the 100 MB corpus is the first tenth of the gigabyte. Writing the gigabyte takes about
five minutes and 1.1 GB of disk in `--corpora` (kept, and reused when its marker file is there); preparing it about
as long again, and a few GB of scratch files in the workspace while it runs.

Planted, at fixed places in every 5,000 documents (so 6 of each at 100 MB and 60 at 1 GB):
- contamination: a train document (its JSONL `split` fixed to train) holding 30 words of a test document (fixed to
  test) in the middle of its own text;
- an exact duplicate: a document whose text is another's, under its own id;
- a near duplicate: another's text with 3% of its words replaced;
- and every 50,000 documents a line that is not JSON.
Every 50th document is fixed to test, so that the contaminated test documents are known in advance.

For each size the gate runs in a fresh child process (`python -m veritrain data prepare --json`, byte-level
tokenizer, the default near-duplicate and contamination settings) into a fresh workspace; its peak resident memory
is the child's own high-water mark (`os.wait4`'s ru_maxrss: the gate starts no workers), its time `timings.total`
of version.json (from reading the source to the sealed version) and MB/s the corpus's MB over it. Then the data
report is read: each planted fault must be among the findings (contamination and bad_json by document or line, an
exact duplicate by its group, a near duplicate by its pair), and the findings beyond the planted ones are counted:
the corpus's own duplicate and contamination rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_memory import _descendants, _status_bytes  # noqa: E402

MB = 10**6
MIB = 1 << 20
SEED = 0
WORDS = (150, 1500)  # words a document holds
JUMP = 0.3  # chance that the next word is any word of the vocabulary rather than one that follows the current one
BATCH = 2048  # documents generated at once
FILE_BYTES = 10 * MB  # text bytes per JSONL file, about
PLANT_EVERY = 5000  # documents between two plants of each kind
CONTAMINATION, EXACT, NEAR = 17, 29, 41  # where in every PLANT_EVERY documents each kind is planted
BAD_EVERY, BAD_AT = 50_000, 7  # a line that is not JSON, every BAD_EVERY documents
TEST_EVERY = 50  # every 50th document is fixed to test
SHARED_WORDS = 30  # words of a test document a contaminated train document holds
NEAR_REPLACED = 0.03
POLL = 0.05  # seconds between two samples of the resident memory of the gate and its workers


def bigram_model() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vocabulary, successor starts, successors): the words that follow word w in the topics are
    successors[starts[w]:starts[w + 1]], with repeats (so sampling one follows the topics' frequencies)."""
    from veritrain.data.text_corpus import embedded_topics

    words = [word for _, text in sorted(embedded_topics().items()) for word in text.split()]
    vocabulary, ids = np.unique(np.array(words, dtype=object).astype(str), return_inverse=True)
    order = np.argsort(ids[:-1], kind="stable")
    successors = ids[1:][order]
    starts = np.searchsorted(ids[:-1][order], np.arange(len(vocabulary) + 1))
    return vocabulary, starts, successors


def documents(total_bytes: int):
    """(id, text, split) of the corpus, in order, until their text reaches total_bytes; a bad line as (id, None, None)."""
    vocabulary, starts, successors = bigram_model()
    counts = np.diff(starts)
    rng = np.random.default_rng(SEED)
    written, number, recent = 0, 0, {}
    while written < total_bytes:
        lengths = rng.integers(WORDS[0], WORDS[1] + 1, size=BATCH)
        current = rng.integers(len(vocabulary), size=BATCH)
        ids = np.empty((BATCH, WORDS[1]), dtype=np.int64)
        for step in range(WORDS[1]):
            ids[:, step] = current
            follow = counts[current] > 0
            picked = successors[np.minimum(starts[current] + (rng.random(BATCH) * counts[current]).astype(np.int64), len(successors) - 1)]
            current = np.where(follow & (rng.random(BATCH) >= JUMP), picked, rng.integers(len(vocabulary), size=BATCH))
        for row in range(BATCH):
            text = " ".join(vocabulary[ids[row, : lengths[row]]].tolist())
            doc_id, split = f"g{number:07d}", None
            place = number % PLANT_EVERY
            if number % BAD_EVERY == BAD_AT:
                yield doc_id, None, None
                number += 1
                continue
            if number % TEST_EVERY == 0:
                split = "test"
            elif place == CONTAMINATION:
                words = text.split()
                shared = recent[number - CONTAMINATION].split()
                middle = len(words) // 2
                text = " ".join(words[:middle] + shared[40 : 40 + SHARED_WORDS] + words[middle:])
                split = "train"
            elif place == EXACT:
                text = recent[number - EXACT + 1]
            elif place == NEAR:
                words = recent[number - NEAR + 2].split()
                for position in rng.choice(len(words), max(1, round(NEAR_REPLACED * len(words))), replace=False):
                    words[position] = vocabulary[rng.integers(len(vocabulary))]
                text = " ".join(words)
            if place <= NEAR:
                recent[number] = text
            elif place == NEAR + 1:
                recent.clear()
            yield doc_id, text, split
            number += 1
            written += len(text.encode("utf-8"))
            if written >= total_bytes:
                return


def write_corpus(folder: Path, megabytes: float) -> dict:
    """The corpus of `megabytes` MB in `folder` (reused when its marker is there); returns what it holds."""
    marker = folder / "corpus.json"
    if marker.exists():
        return json.loads(marker.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = time.perf_counter()
    file_number, in_file, stream = 0, 0, None
    held = {"documents": 0, "bytes": 0, "planted": {"contamination": [], "exact_duplicate": [], "near_duplicate": [], "bad_json": []}}
    for doc_id, text, split in documents(int(megabytes * MB)):
        if stream is None or in_file >= FILE_BYTES:
            if stream is not None:
                stream.close()
            stream = open(folder / f"part-{file_number:04d}.jsonl", "w", encoding="utf-8")
            file_number, in_file = file_number + 1, 0
        number = int(doc_id[1:])
        if text is None:
            stream.write('{"id": "' + doc_id + '", "text": \n')
            held["planted"]["bad_json"].append(f"{stream.name.rsplit('/', 1)[1]}")
            continue
        line = {"id": doc_id, "text": text}
        if split:
            line["split"] = split
        stream.write(json.dumps(line, ensure_ascii=False) + "\n")
        size = len(text.encode("utf-8"))
        in_file += size
        held["documents"] += 1
        held["bytes"] += size
        place = number % PLANT_EVERY
        if place == CONTAMINATION:
            held["planted"]["contamination"].append(doc_id)
        elif place == EXACT:
            held["planted"]["exact_duplicate"].append([f"g{number - EXACT + 1:07d}", doc_id])
        elif place == NEAR:
            held["planted"]["near_duplicate"].append([f"g{number - NEAR + 2:07d}", doc_id])
    if stream is not None:
        stream.close()
    held["seconds_to_write"] = round(time.perf_counter() - started, 1)
    marker.write_text(json.dumps(held))
    return held


def prepare(folder: Path, scratch: Path) -> dict:
    """One `veritrain data prepare` in a fresh child process: its own peak resident memory (`os.wait4`'s ru_maxrss),
    the largest sum of its and its workers' resident memory (sampled every POLL seconds), the process's seconds,
    version.json and data_report.json."""
    config = scratch / "data.yaml"
    config.write_text(f"task: lm\nmodel:\n  name: gpt\ndata:\n  source: jsonl\n  root: {json.dumps(str(folder))}\n"
                      "  tokenizer:\n    kind: byte_level\n")
    started, tree_peak = time.perf_counter(), 0
    with open(scratch / "stdout", "wb") as out, open(scratch / "stderr", "wb") as err:
        child = subprocess.Popen([sys.executable, "-m", "veritrain", "data", "prepare", str(config), "--workdir", str(scratch / "ws"), "--json"],
                                 stdout=out, stderr=err)
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)  # the rusage of this child alone
            if pid:
                break
            tree = _status_bytes(child.pid, ("VmRSS",)).get("VmRSS", 0)
            tree_peak = max(tree_peak, tree + sum(_status_bytes(w, ("VmRSS",)).get("VmRSS", 0) for w in _descendants(child.pid)))
            time.sleep(POLL)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"veritrain data prepare exited {os.waitstatus_to_exitcode(status)}:\n{(scratch / 'stderr').read_text()[-3000:]}")
    data_dir = Path(json.loads((scratch / "stdout").read_text())["split_files"]["train"]).parent.parent
    return {"peak": usage.ru_maxrss * 1024, "tree_peak": tree_peak, "seconds": seconds,  # Linux: ru_maxrss in KiB
            "info": json.loads((data_dir / "version.json").read_text()), "report": json.loads((data_dir / "data_report.json").read_text())}


def found_faults(held: dict, report: dict) -> dict:
    """Planted faults found / planted, by kind, and the findings of each kind beyond the planted ones."""
    findings = report["findings"]
    by_kind: dict[str, list[dict]] = {}
    for finding in findings:
        by_kind.setdefault(finding["kind"], []).append(finding)
    planted = held["planted"]
    contaminated = {f["where"] for f in by_kind.get("contamination", [])}
    exact = [(f["where"], f["detail"]) for f in by_kind.get("exact_duplicate", [])]
    near = {(f["where"], f["detail"].rsplit(" with ", 1)[1]) for f in by_kind.get("near_duplicate", [])}
    bad_files = [f["where"].split(":")[0] for f in by_kind.get("bad_json", [])]
    result = {
        "contamination": (sum(d in contaminated for d in planted["contamination"]), len(planted["contamination"]),
                          len(contaminated - set(planted["contamination"]))),
        "exact_duplicate": (sum(any(first == where and copy in detail for where, detail in exact) for first, copy in planted["exact_duplicate"]),
                            len(planted["exact_duplicate"]), len(exact) - len(planted["exact_duplicate"])),
        "near_duplicate": (sum((first, copy) in near for first, copy in planted["near_duplicate"]), len(planted["near_duplicate"]),
                           len(near) - len(planted["near_duplicate"])),
        "bad_json": (sum(name in bad_files for name in planted["bad_json"]), len(planted["bad_json"]), len(bad_files) - len(planted["bad_json"])),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=float, nargs="+", default=[100, 1000], help="corpus sizes in MB")
    parser.add_argument("--corpora", type=Path, default=Path(tempfile.gettempdir()) / "veritrain-text-gigabyte",
                        help="where the corpora are written (and kept)")
    args = parser.parse_args()
    print(f"{'MB':>6} {'documents':>9} {'peak MiB':>8} {'all MiB':>7} {'gate s':>7} {'MB/s':>5} {'process s':>9}  found / planted (more found)",
          flush=True)
    runs = {}
    for size in args.sizes:
        held = write_corpus(args.corpora / f"mb_{size:g}", size)
        with tempfile.TemporaryDirectory(prefix="veritrain-text-gb-") as scratch:
            run = prepare(args.corpora / f"mb_{size:g}", Path(scratch))
        info = run["info"]
        gate = info["timings"]["total"]
        faults = found_faults(held, run["report"])
        runs[size] = run
        shown = ", ".join(f"{kind} {found}/{planted} (+{more})" for kind, (found, planted, more) in faults.items())
        print(f"{held['bytes'] / MB:6.0f} {held['documents']:9,d} {run['peak'] / MIB:8.1f} {run['tree_peak'] / MIB:7.1f} {gate:7.1f} "
              f"{held['bytes'] / MB / gate:5.2f} {run['seconds']:9.1f}  {shown}", flush=True)
        print(f"       near-duplicate candidates {info['near_duplicates']['candidates']:,}, quarantined {info['quarantined']}, "
              f"tokens {sum(info['tokens'].values()):,}", flush=True)
    if len(runs) > 1:
        small, large = runs[min(runs)], runs[max(runs)]
        print(f"peak at {max(runs):g} MB / at {min(runs):g} MB: {large['peak'] / small['peak']:.2f}x "
              f"(all processes {large['tree_peak'] / small['tree_peak']:.2f}x)")

if __name__ == "__main__":
    main()
