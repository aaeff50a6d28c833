"""The shard format (veritrain.data.shards): equal content gives equal bytes and one id, the id is what standard tools
compute from the file, every byte a reader uses is checked first (a damaged block is an error only where it is read),
hostile entries are refused, and the cuts by key move only the shard a row is added to."""

from __future__ import annotations

import hashlib
import json
import subprocess

import numpy as np
import pytest

from veritrain.data import shards
from veritrain.data.shards import BLOCK, Field, Shard, ShardEntry, ShardError


def test_an_array_shard_round_trips_and_equal_content_gives_the_same_file(tmp_path):
    rows = np.random.default_rng(0).integers(0, 255, size=(300, 8, 8, 3), dtype=np.uint8)
    entry = shards.write_array(tmp_path, rows)
    assert (entry.layout, entry.rows, entry.size, entry.dtype, entry.shape) == ("array", 300, rows.nbytes, "|u1", (8, 8, 3))
    again = shards.write_array(tmp_path / "other", rows.copy())
    assert again == entry and shards.path_of(tmp_path, entry.id).read_bytes() == shards.path_of(tmp_path / "other", entry.id).read_bytes()
    with Shard(shards.path_of(tmp_path, entry.id), entry) as shard:
        assert all(np.array_equal(shard.get(i), rows[i]) for i in (0, 17, 299))
    big_endian = shards.write_array(tmp_path, rows[:4, 0, 0].astype(">f4"))
    assert big_endian.dtype == "<f4"  # stored little-endian whatever the writer's byte order
    assert big_endian == shards.write_array(tmp_path, rows[:4, 0, 0].astype("<f4"))
    assert ShardEntry.from_dict(json.loads(json.dumps(entry.as_dict()))) == entry


def test_a_blob_shard_holds_bytes_of_any_length_and_its_id_is_what_sha256sum_gives(tmp_path):
    payloads = [b"", b"x" * (BLOCK + 5), bytes(range(256)) * 3, b"last"]
    entry = shards.write_blob(tmp_path, payloads)
    path = shards.path_of(tmp_path, entry.id)
    assert len(entry.blocks) == 2 and entry.size == 8 * 5 + sum(map(len, payloads))
    with Shard(path, entry) as shard:
        assert [shard.get(i) for i in range(4)] == payloads
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    subprocess.run(["split", "-b", str(BLOCK), "-a", "4", str(path), str(pieces / "b.")], check=True)
    listed = subprocess.run(f"sha256sum {pieces}/b.* | cut -c1-64 | sha256sum", shell=True, capture_output=True, text=True, check=True)
    assert listed.stdout.split()[0] == entry.id  # docs/shards.md: the id anyone can compute


def test_a_damaged_block_is_an_error_where_it_is_read_and_nowhere_else(tmp_path):
    rows = np.arange(3 * BLOCK // 4, dtype="<u4").reshape(-1, 256)  # 3 blocks of 1 KiB rows
    entry = shards.write_array(tmp_path, rows)
    path = shards.path_of(tmp_path, entry.id)
    data = bytearray(path.read_bytes())
    data[BLOCK + 10] ^= 1  # in block 1
    path.write_bytes(bytes(data))
    per_block = BLOCK // rows[0].nbytes
    with Shard(path, entry) as shard:
        assert np.array_equal(shard.get(0), rows[0]) and np.array_equal(shard.get(2 * per_block), rows[2 * per_block])
        with pytest.raises(ShardError, match="block 1 is not the one its entry names"):
            shard.get(per_block)
        with pytest.raises(ShardError):
            shard.take(np.array([0, per_block]))  # a batch touching the damaged block: refused whole
        with pytest.raises(ShardError):
            shard.values()
    assert shards.verify_shard(path, entry) == [f"{path}: block 1 differs from its entry"]
    path.write_bytes(bytes(data[:BLOCK]))  # cut short
    with Shard(path, entry) as shard, pytest.raises(ShardError):
        shard.get(2 * per_block)
    assert shards.verify_shard(path, entry)[0].endswith(f"{BLOCK} bytes, its entry says {entry.size}")


def test_a_writer_replaces_a_damaged_file_of_the_same_id(tmp_path):
    entry = shards.write_blob(tmp_path, [b"abc", b"def"])
    path = shards.path_of(tmp_path, entry.id)
    path.write_bytes(path.read_bytes()[:-1] + b"X")
    assert shards.write_blob(tmp_path, [b"abc", b"def"]) == entry and not shards.verify_shard(path, entry)


@pytest.mark.parametrize("change, message", [
    (lambda e: e.update(layout="pickle"), "layout 'pickle'"),
    (lambda e: e.update(rows=-1), "whole numbers"),
    (lambda e: e.update(rows=True), "whole numbers"),
    (lambda e: e.update(blocks=["A" * 64]), "lowercase hex"),
    (lambda e: e.update(id="0" * 64), "not the hash of its block list"),
    (lambda e: e.update(dtype="object"), "little-endian number type"),
    (lambda e: e.update(dtype=">u4"), "little-endian number type"),
    (lambda e: e.update(shape=[2, -1]), "shape"),
    (lambda e: e.update(rows=10**9), "are not"),
])
def test_a_hostile_entry_is_refused_before_anything_reads_by_it(tmp_path, change, message):
    entry = shards.write_array(tmp_path, np.zeros((4, 2), dtype="<u4")).as_dict()
    change(entry)
    with pytest.raises(ShardError, match=message):
        ShardEntry.from_dict(entry)


def test_a_blob_whose_offset_table_lies_is_refused(tmp_path):
    table = np.array([0, 5, 3, 9], dtype="<u8").tobytes()  # a row that ends before it starts
    entry = shards._store(tmp_path, table + b"123456789")
    forged = ShardEntry(entry.id, "blob", 3, entry.size, entry.blocks)
    with Shard(shards.path_of(tmp_path, entry.id), forged) as shard, pytest.raises(ShardError, match="offset table"):
        shard.get(0)


def test_a_field_reads_across_its_shards(tmp_path):
    parts = [np.full((n, 2), i, dtype=np.int16) for i, n in enumerate((3, 0, 5))]
    field = Field(tmp_path, [shards.write_array(tmp_path, p) for p in parts])
    assert len(field) == 8 and [int(field.get(i)[0]) for i in range(8)] == [0, 0, 0, 2, 2, 2, 2, 2]
    with pytest.raises(IndexError):
        field.get(8)
    field.close()


def test_cuts_by_key_move_only_the_shard_a_row_is_added_to():
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(5000)]
    ends = shards.cuts(keys, 50)
    assert ends[-1] == 5000 and 40 <= len(ends) <= 250 and all(b > a for a, b in zip([0] + ends, ends))
    added = sorted(keys + ["a new sample"])
    before = {tuple(sorted(keys)[a:b]) for a, b in zip([0] + shards.cuts(sorted(keys), 50), shards.cuts(sorted(keys), 50))}
    after = {tuple(added[a:b]) for a, b in zip([0] + shards.cuts(added, 50), shards.cuts(added, 50))}
    assert len(after - before) <= 2 and len(before - after) <= 2  # the shard it joins (and a neighbour when the cap cut)
    assert shards.cuts([], 50) == []


def test_a_field_takes_rows_in_any_order_spans_windows_across_shards_and_loads_whole(tmp_path):
    tokens = np.arange(10_000, dtype="<u2")
    entries = [shards.write_array(tmp_path, tokens[a:b]) for a, b in ((0, 3000), (3000, 3000), (3000, 7100), (7100, 10_000))]
    field = Field(tmp_path, entries)
    assert len(field) == 10_000
    assert np.array_equal(field.span(2990, 3010), tokens[2990:3010])  # a window across an empty shard and a boundary
    assert np.array_equal(field.span(0, 10_000), tokens) and field.span(5, 5).shape == (0,)
    order = np.array([9999, 0, 3000, 2999, 7100, 7099, 5])
    assert np.array_equal(field.take(order), tokens[order])
    assert np.array_equal(field.values(), tokens)
    with pytest.raises(IndexError):
        field.span(9990, 10_001)
    images = np.random.default_rng(1).integers(0, 255, size=(50, 4, 4, 3), dtype=np.uint8)
    pictures = Field(tmp_path, [shards.write_array(tmp_path, images[:20]), shards.write_array(tmp_path, images[20:])])
    picked = np.array([49, 3, 20, 19, 3])
    assert np.array_equal(pictures.take(picked), images[picked])
    field.close()
    pictures.close()


def test_a_field_written_as_its_rows_come_is_cut_where_cuts_says(tmp_path):
    keys = sorted(hashlib.sha256(str(i).encode()).hexdigest() for i in range(700))
    values = [np.full((2, 2), i, dtype="<i4") for i in range(700)]
    writer = shards.FieldWriter(tmp_path, "array", 40)
    for key, value in zip(keys, values):
        writer.add(key, value)
    entries = writer.close()
    assert np.cumsum([e.rows for e in entries]).tolist() == shards.cuts(keys, 40)
    assert np.array_equal(Field(tmp_path, entries).values(), np.stack(values))
    blobs = shards.FieldWriter(tmp_path, "blob", 40)
    for key in keys:
        blobs.add(key, key.encode())
    field = Field(tmp_path, blobs.close())
    assert [field.get(i) for i in (0, 699)] == [keys[0].encode(), keys[699].encode()]
    mixed = shards.FieldWriter(tmp_path, "array", 1000)
    mixed.add("a", np.zeros(2, dtype=np.uint8))
    with pytest.raises(ValueError, match="share one shape and dtype"):  # refused as it comes
        mixed.add("b", np.zeros(3, dtype=np.uint8))


def test_a_token_stream_is_chunked_by_document_and_an_added_document_changes_one_chunk(tmp_path):
    rng = np.random.default_rng(2)
    documents = {hashlib.sha256(f"doc{i}".encode()).hexdigest(): rng.integers(0, 2048, size=int(rng.integers(1, 60))) for i in range(400)}

    def written(docs: dict) -> tuple[list, list, np.ndarray]:
        writer = shards.StreamWriter(tmp_path, "<u2", 16)
        for key in sorted(docs):
            writer.add(key, docs[key])
        entries, starts = writer.close()
        return entries, starts, np.concatenate([docs[k] for k in sorted(docs)])

    entries, starts, stream = written(documents)
    field = Field(tmp_path, entries)
    assert len(field) == len(stream) and np.array_equal(field.values(), stream.astype("<u2"))
    first = sorted(documents)[123]
    assert np.array_equal(field.span(starts[123], starts[123] + len(documents[first])), documents[first])
    assert np.array_equal(field.span(100, 900), stream[100:900])  # a window across chunks
    more, _, _ = written({**documents, "an added document": np.arange(7)})
    assert len({e.id for e in more} - {e.id for e in entries}) <= 2 and len({e.id for e in entries} - {e.id for e in more}) <= 2
    with pytest.raises(ValueError, match="whole numbers"):
        shards.StreamWriter(tmp_path, "<u2", 16).add("k", np.array([-1]))


def test_a_token_chunk_written_as_its_documents_come_is_the_shard_the_whole_array_gives(tmp_path):
    """StreamWriter writes a chunk a block at a time (never the chunk in memory): the same bytes, blocks and id as
    write_array of the whole chunk, across block boundaries, and nothing left behind but the shard."""
    rng = np.random.default_rng(5)
    pieces = [rng.integers(0, 60000, size=int(rng.integers(1, 300_000)), dtype=np.uint16) for _ in range(12)]
    writer = shards.StreamWriter(tmp_path / "store", "<u2", 1000)  # one chunk: no key of these ends it
    for k, piece in enumerate(pieces):
        writer.add(f"k{k}", piece)
    (entry,), starts = writer.close()
    whole = shards.write_array(tmp_path / "other", np.concatenate(pieces))
    assert (entry.id, entry.rows, entry.size, entry.blocks) == (whole.id, whole.rows, whole.size, whole.blocks) and len(entry.blocks) > 2
    assert starts == np.concatenate([[0], np.cumsum([len(p) for p in pieces])[:-1]]).tolist()
    assert sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file()) == [entry.id]
    assert shards.StreamWriter(tmp_path / "store", "<u2", 16).close() == ([], [])


def test_a_field_array_is_indexed_like_the_array_it_replaces(tmp_path):
    images = np.random.default_rng(3).integers(0, 255, size=(30, 2, 2, 3), dtype=np.uint8)
    field = shards.FieldArray(Field(tmp_path, [shards.write_array(tmp_path, images[:11]), shards.write_array(tmp_path, images[11:])]))
    assert (field.shape, field.dtype, field.ndim, len(field)) == (images.shape, images.dtype, 4, 30)
    for index in (5, -1, slice(3, 17), slice(None, None, 4), np.array([29, 0, 11, 10]), [2, 2], images[:, 0, 0, 0] > 128):
        assert np.array_equal(field[index], images[index]), index
    assert np.array_equal(np.asarray(field), images) and np.asarray(field, dtype=np.float32).dtype == np.float32
    windows = np.array([[0, 1, 2], [27, 28, 29], [10, 11, 12]])  # a token stream's windows: across shard boundaries
    assert np.array_equal(field[windows], images[windows])
    with pytest.raises(IndexError):
        field[np.array([0.5])]
    with pytest.raises(IndexError):
        field[np.array([30])]



def test_a_field_that_fits_in_memory_is_read_whole_once_and_acts_as_an_array(tmp_path):
    images = np.random.default_rng(4).integers(0, 255, size=(40, 2, 2, 3), dtype=np.uint8)
    entries = [shards.write_array(tmp_path, images[:25]), shards.write_array(tmp_path, images[25:])]
    small = shards.FieldArray(Field(tmp_path, entries), whole_up_to=1 << 20)
    assert small.max() == images.max() and np.array_equal(small[..., 0], images[..., 0])  # from the whole field, read once
    assert isinstance(small.whole(), np.ndarray) and not small.whole().flags.writeable
    large = shards.FieldArray(Field(tmp_path, entries), whole_up_to=0)
    assert large.whole() is large and np.array_equal(large[[3, 30]], images[[3, 30]])
    with pytest.raises(AttributeError, match="is read by rows"):
        large.max()
