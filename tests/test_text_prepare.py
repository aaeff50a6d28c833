"""The text data gate (veritrain.data.text_prepare): documents validated, grouped by exact and near duplicates,
split by the stable hash, decontaminated (train documents only), tokenized into a data version whose id binds
every token and the tokenizer's bytes; a changed token or tokenizer byte is refused on open."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from veritrain.core.config import load_config
from veritrain.core.errors import RunFailed
from veritrain.data import identity, prepare
from veritrain.data.text_corpus import embedded_topics
from veritrain.data.tokenizer import load_tokenizer


def prepared(tmp_path, *overrides: str):
    resolved = load_config(None, ["task=lm", "model.name=gpt", *overrides])
    return prepare.run(resolved.config.data, resolved.data_paths, tmp_path / ".veritrain")


def _data_page(root, version: str) -> str:
    import warnings

    from veritrain.records.workspace import Workspace
    from veritrain.web.server import create_app

    with warnings.catch_warnings():  # Starlette's TestClient on httpx warns about its successor
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

        response = TestClient(create_app(Workspace.open(root)), base_url="http://127.0.0.1:8765").get(f"/data/{version}")
    assert response.status_code == 200
    return response.text


@pytest.fixture(scope="module")
def pydoc(tmp_path_factory):
    root = tmp_path_factory.mktemp("pydoc")
    return root, prepared(root, "data.source=pydoc_topics", "data.text.split_documents=paragraph")


def test_the_shipped_corpus_prepares_to_one_id_and_its_tokens_decode_to_its_documents(pydoc, tmp_path):
    root, data = pydoc
    assert isinstance(data, identity.TextVersion) and data.info["kind"] == "text"
    assert data.counts["train"] > 1500 and data.counts["val"] > 150 and data.counts["test"] > 150
    assert {name: len(t) for name, t in data.tokens.items()} == data.info["tokens"]
    tokenizer = load_tokenizer(data.tokenizer_file)
    assert tokenizer.sha256 == data.info["tokenizer"]["sha256"] and data.info["tokenizer"]["special_ids"] == {"<|endoftext|>": 256}
    text = tokenizer.decode(np.asarray(data.tokens["test"]))
    documents = text.split("<|endoftext|>")[:-1]
    assert len(documents) == data.counts["test"] and sum(len(d.encode()) for d in documents) == data.info["bytes"]["test"]
    assert data.info["contamination"]["train_documents"] >= 1  # the corpus repeats passages across topics
    again = prepared(tmp_path, "data.source=pydoc_topics", "data.text.split_documents=paragraph")
    assert again.version == data.version  # another workspace, the same bytes: the same id


def test_one_changed_token_or_tokenizer_byte_is_refused_before_it_is_used(pydoc, tmp_path):
    import shutil

    root, data = pydoc
    chunk = data.info["fields"]["tokens_train"]["shards"][0]["id"]
    for name, said in ((f"fields/{chunk[:2]}/{chunk}", f"{chunk}: block 0 is not the one its entry names"),
                       ("tokenizer.json", "tokenizer.json.*does not match its sha256")):
        copy = tmp_path / name.replace("/", "-") / data.version
        shutil.copytree(data.path, copy)
        target = copy / name
        content = bytearray(target.read_bytes())
        content[len(content) // 2] ^= 1
        target.unlink()  # a new file: a shard's is a link the store shares
        target.write_bytes(bytes(content))
        with pytest.raises(RunFailed, match=said):  # the chunk when its tokens are first read, the tokenizer on open
            np.asarray(identity.load_version(copy).tokens["train"])  # type: ignore[attr-defined]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def words(seed: int, n: int) -> str:
    vocabulary = sorted({w for text in embedded_topics().values() for w in text.split() if w.isalpha()})
    rng = random.Random(seed)
    return " ".join(rng.choice(vocabulary) for _ in range(n))


def test_a_train_document_holding_a_test_passage_is_removed_from_train_and_test_keeps_its_own(tmp_path):
    passage = words(1, 60)
    rows = [{"id": "test-1", "text": words(2, 40) + " " + passage + " " + words(3, 40), "split": "test"},
            {"id": "train-leak", "text": words(4, 200) + " " + passage + " " + words(5, 200), "split": "train"},
            *({"id": f"train-{k}", "text": words(10 + k, 120)} for k in range(20))]
    write_jsonl(tmp_path / "docs.jsonl", rows)
    data = prepared(tmp_path, "data.source=jsonl", f"data.root={tmp_path / 'docs.jsonl'}")
    report = data.report()
    assert [q["sample_id"] for q in report["quarantined"]] == ["train-leak"] and report["quarantined"][0]["kind"] == "contamination"
    assert "test-1" in (data.path / "splits" / "test.txt").read_text().split()
    (pair,) = report["contamination"]["top_pairs"]
    assert pair["covered_words"] == 60 and pair["shared_text"] == [passage.lower()]
    page = _data_page(tmp_path, data.version)  # the run browser's data page shows the finding with the text shared
    assert "train-leak" in page and "contamination" in page and " ".join(passage.lower().split()[:12]) in page
    warned = prepared(tmp_path / "w", "data.source=jsonl", f"data.root={tmp_path / 'docs.jsonl'}", "data.text.on_contamination=warn")
    assert "train-leak" in (warned.path / "splits" / "train.txt").read_text().split() and warned.version != data.version
    with pytest.raises(RunFailed, match="contamination: train-leak"):
        prepared(tmp_path / "f", "data.source=jsonl", f"data.root={tmp_path / 'docs.jsonl'}", "data.text.on_contamination=fail")


def test_duplicates_stay_in_one_split_and_a_duplicate_fixed_elsewhere_is_a_split_leak(tmp_path):
    same = words(7, 80)
    rows = [{"id": "a", "text": same, "split": "test"}, {"id": "b", "text": same.upper(), "split": "train"},
            *({"id": f"n-{k}", "text": words(30 + k, 100)} for k in range(20))]
    write_jsonl(tmp_path / "docs.jsonl", rows)
    data = prepared(tmp_path, "data.source=jsonl", f"data.root={tmp_path / 'docs.jsonl'}")
    quarantined = {q["sample_id"]: q["kind"] for q in data.report()["quarantined"]}
    assert quarantined == {"b": "split_leak"}
    assert data.info["findings_by_kind"]["exact_duplicate"] == 1


def test_unreadable_files_are_quarantined_and_named(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for k in range(12):
        (docs / f"doc{k:02d}.txt").write_text(words(50 + k, 120), encoding="utf-8")
    (docs / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (docs / "empty.txt").write_text("\n")
    data = prepared(tmp_path, "data.source=text", f"data.root={docs}")
    assert {q["sample_id"]: q["kind"] for q in data.report()["quarantined"]} == {"latin1.txt": "invalid_utf8", "empty.txt": "empty_document"}
    assert sum(data.counts.values()) == 12
    with pytest.raises(RunFailed, match="empty.txt: empty_document .*2 document"):
        prepared(tmp_path / "f", "data.source=text", f"data.root={docs}", "data.on_bad_file=fail")


def test_the_gate_reads_the_source_once_and_leaves_no_scratch_file(tmp_path, monkeypatch):
    """The later passes read the documents back from the gate's scratch files, never the source again (so a file
    edited while the gate runs cannot give two passes two texts); the scratch folder goes when the gate ends. A lone
    surrogate escaped in the JSON is a finding, not a traceback."""
    from veritrain.data import text_sources

    rows = [{"id": f"d{k}", "text": words(200 + k, 90)} for k in range(30)]
    write_jsonl(tmp_path / "docs.jsonl", rows)
    with open(tmp_path / "docs.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": "odd", "text": "half \\udc80 a pair"}\n')
    reads = []
    original = text_sources.iter_jsonl
    monkeypatch.setattr(text_sources, "iter_jsonl", lambda *args: (reads.append(1), original(*args))[1])
    data = prepared(tmp_path, "data.source=jsonl", f"data.root={tmp_path / 'docs.jsonl'}")
    assert reads == [1] and sum(data.counts.values()) == 30
    assert {q["sample_id"]: q["kind"] for q in data.report()["quarantined"]} == {"docs.jsonl:31": "bad_text"}
    assert not list((tmp_path / ".veritrain" / "tmp").iterdir())


def test_workers_give_the_version_one_process_gives(tmp_path, monkeypatch):
    """The first look at each document runs in worker processes for a large source: results come back in order,
    so the version (every id, split, finding and token) is the one a single process makes."""
    from veritrain.data import text_prepare

    rows = [{"id": f"d{k}", "text": words(300 + k, 60)} for k in range(40)]
    rows += [{"id": "copy", "text": rows[3]["text"]}, {"id": "mail", "text": words(9, 30) + " write to a.b@example.org"}]
    write_jsonl(tmp_path / "docs.jsonl", rows)
    source = ["data.source=jsonl", f"data.root={tmp_path / 'docs.jsonl'}"]
    alone = prepared(tmp_path / "one", *source)
    monkeypatch.setattr(text_prepare, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(text_prepare, "LOOK_BATCH", 7)
    asked = []
    original = text_prepare.in_parallel
    monkeypatch.setattr(text_prepare, "in_parallel", lambda func, items, workers, *args, **kw: (asked.append(workers), original(func, items, workers, *args, **kw))[1])
    together = prepared(tmp_path / "two", *source, "data.workers=2")
    assert asked == [2] and together.version == alone.version
    assert together.info["findings_by_kind"] == alone.info["findings_by_kind"] == {"email": 1, "exact_duplicate": 1}
