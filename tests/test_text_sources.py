"""veritrain.data.text_sources: folders of .txt files, JSONL files and the shipped corpus read as documents, with the
stated normalization, and every kind of bad input a finding that names the file (and line), never a traceback."""

from __future__ import annotations

import hashlib
import json

from veritrain.data import text_corpus
from veritrain.data.text_sources import JsonlFields, normalize_text, paragraphs, read_embedded, read_jsonl, read_text_folder


def kinds(listing) -> dict[str, str]:
    return {f.where: f.kind for f in listing.findings}


def test_a_text_folder_is_read_with_the_stated_normalization_and_its_bad_files_are_findings(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_bytes("\ufeffFirst line\r\nsecond\rthird\n".encode())
    (tmp_path / "sub" / "b.txt").write_bytes(b"para one\n\n  para two  \n \t\npara\x00 three\n")
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 latin-1")
    (tmp_path / "empty.txt").write_bytes(b"\n \n")
    (tmp_path / "big.txt").write_bytes(b"x" * 401)
    (tmp_path / "notes.md").write_text("not a .txt file")
    listing = read_text_folder(tmp_path, "file", max_chars=100)
    texts = {d.doc_id: d.text for d in listing.documents}
    assert texts == {"a.txt": "First line\nsecond\nthird", "sub/b.txt": "para one\n\n  para two  \n \t\npara three"}
    assert kinds(listing) == {"bad.txt": "invalid_utf8", "empty.txt": "empty_document", "big.txt": "too_long", "sub/b.txt": "nul_characters"}
    assert [f["path"] for f in listing.files] == ["a.txt", "bad.txt", "big.txt", "empty.txt", "sub/b.txt"]
    paragraph = read_text_folder(tmp_path, "paragraph", max_chars=100)
    assert [d.text for d in paragraph.documents if d.file == "sub/b.txt"] == ["para one", "para two", "para three"]
    assert [d.doc_id for d in paragraph.documents if d.file == "sub/b.txt"] == ["sub/b.txt#p0000", "sub/b.txt#p0001", "sub/b.txt#p0002"]


def test_jsonl_lines_that_are_not_documents_are_findings_naming_file_and_line(tmp_path):
    lines = [json.dumps({"text": "one", "id": "d1", "split": "test", "group": 7}), "{not json", json.dumps({"body": "x"}),
             json.dumps({"text": 5}), json.dumps([1, 2]), "", json.dumps({"text": "dup", "id": "d1"}),
             json.dumps({"text": "s", "split": "holdout"}), json.dumps({"text": "y" * 500}), json.dumps({"text": "two\r\n"})]
    (tmp_path / "data.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b'{"text": "\xff"}\n')
    listing = read_jsonl(tmp_path / "data.jsonl", JsonlFields(), max_chars=100)
    assert [(d.doc_id, d.text, d.split, d.group, d.line) for d in listing.documents] == [
        ("d1", "one", "test", "7", 1), ("data.jsonl:10", "two\n", None, None, 10)]
    assert kinds(listing) == {"data.jsonl:2": "bad_json", "data.jsonl:3": "missing_text", "data.jsonl:4": "bad_text",
                              "data.jsonl:5": "bad_json", "data.jsonl:7": "duplicate_id", "data.jsonl:8": "bad_split",
                              "data.jsonl:9": "too_long", "data.jsonl:11": "invalid_utf8"}
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(json.dumps({"body": "b", "key": "k"}) + "\n")
    (document,) = read_jsonl(renamed, JsonlFields(text="body", id="key"), max_chars=100).documents
    assert (document.doc_id, document.text) == ("k", "b")


def test_an_over_long_jsonl_line_is_skipped_in_chunks_and_the_next_line_is_read(tmp_path):
    path = tmp_path / "long.jsonl"
    with open(path, "wb") as out:
        out.write(b'{"text": "' + b"z" * (3 << 20) + b'"}\n')  # 3 MB on one line, max_chars 1000
        out.write(b'{"text": "after"}\n')
    listing = read_jsonl(path, JsonlFields(), max_chars=1000)
    assert [d.text for d in listing.documents] == ["after"]
    assert kinds(listing) == {"long.jsonl:1": "too_long"}
    import hashlib

    assert listing.files[0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()  # every byte still hashed


def test_the_shipped_corpus_is_79_topics_and_its_bytes_are_checked():
    listing = read_embedded("file", max_chars=1_000_000)
    assert len(listing.documents) == 79 and not listing.findings
    assert listing.preprocessing["corpus_sha256"] == text_corpus.CORPUS_SHA256
    assert "Python Software Foundation License" in listing.card["license"]
    assert len(read_embedded("paragraph", max_chars=1_000_000).documents) > 1000


def test_normalization_helpers():
    assert normalize_text("\ufeffa\r\nb\x00c\r") == ("a\nbc\n", 1)
    assert normalize_text("\ufeff\ufeffx")[0] == "\ufeffx"  # one mark only: a second is text
    assert paragraphs("a\n\nb\n  \n\n c \n") == ["a", "b", "c"]


def test_a_lone_surrogate_escaped_in_json_is_a_finding_and_repeated_ids_are_found_across_merges(tmp_path, monkeypatch):
    from veritrain.data import text_sources

    monkeypatch.setattr(text_sources.SeenIds, "MERGE_AT", 3)  # the sorted arrays take over after every third id
    ids = [f"id{k}" for k in range(20)]
    lines = [json.dumps({"id": i, "text": f"text {i}"}) for i in ids]
    lines += [json.dumps({"id": "id0", "text": "again"}), json.dumps({"id": "id19", "text": "again"}), '{"id": "s", "text": "a \\ud800 b"}']
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    listing = read_jsonl(tmp_path / "data.jsonl", JsonlFields(), max_chars=100)
    assert [d.doc_id for d in listing.documents] == ids
    assert kinds(listing) == {"data.jsonl:21": "duplicate_id", "data.jsonl:22": "duplicate_id", "data.jsonl:23": "bad_text"}
    details = {f.where: f.detail for f in listing.findings}
    assert details["data.jsonl:21"].endswith("is also at data.jsonl:1") and details["data.jsonl:22"].endswith("is also at data.jsonl:20")
    assert "U+D800" in details["data.jsonl:23"]


def test_seen_ids_tell_digests_apart_that_end_in_zero_bytes(monkeypatch):
    from veritrain.data import text_sources

    monkeypatch.setattr(text_sources.SeenIds, "MERGE_AT", 1)
    seen = text_sources.SeenIds()
    # ids whose 16-byte digests end in a zero byte: numpy's S16 drops trailing NULs when it reads one back
    zeros = [f"z{k}" for k in range(4000) if hashlib.blake2b(f"z{k}".encode(), digest_size=16).digest()[-1] == 0][:5]
    assert zeros
    for line, doc_id in enumerate(zeros, 1):
        assert seen.add(doc_id, 0, line) is None
    assert [seen.add(doc_id, 0, 99) for doc_id in zeros] == [(0, line) for line in range(1, len(zeros) + 1)]
