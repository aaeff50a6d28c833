"""What data prepare keeps of each sample, kept compact: pictures and thumbnails in scratch files (what is written is
what is read back, in any order; the near-duplicate search reads them from there and finds what it found in memory;
the scratch folder is gone when prepare ends), the sample table as columns, contents grouped by sorting their digests,
the placement as a byte a sample, and JSON rows hashed a batch at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from veritrain.data import dedup
from veritrain.data.row_images import RowImages


def test_rows_written_in_any_order_read_back_by_index_slice_and_view(tmp_path: Path):
    images = RowImages(tmp_path / "p.u8", 10)
    rng = np.random.default_rng(0)
    written = {row: rng.integers(0, 256, (4, 5), dtype=np.uint8) for row in (7, 2, 9, 0)}
    for row, image in written.items():
        images.put(row, image)
    assert [r for r in range(10) if r in images] == [0, 2, 7, 9] and 3 not in images and -1 not in images
    assert images.get(3) is None and np.array_equal(images.get(7), written[7])
    assert np.array_equal(images.take(np.array([9, 0, 9])), np.stack([written[9], written[0], written[9]]))
    view = images.of([2, 7, 9])
    assert view.shape == (3, 4, 5) and np.array_equal(view[1], written[7]) and np.array_equal(view[1:], np.stack([written[7], written[9]]))
    with pytest.raises(KeyError, match="row 3"):
        images.take(np.array([3]))
    with pytest.raises(ValueError, match="the others"):
        images.put(1, np.zeros((5, 4), dtype=np.uint8))
    spectra = RowImages(tmp_path / "s.i16", 3, dtype=np.int16)
    spectra.put_rows(0, np.array([[-4096, 1], [2, 3], [4096, -1]]))
    assert spectra.take(np.array([2, 0])).tolist() == [[4096, -1], [-4096, 1]]
    with pytest.raises(RuntimeError, match="no features"):
        RowImages(None, 2).put(0, np.zeros(2))


def test_nearest_neighbours_kept_as_they_come_equal_the_nearest_of_everything_found():
    """`_merge_nearest`, fed one table's finds at a time, keeps what sorting all of them at once keeps: per row the
    k nearest by (distance, neighbour), a neighbour found twice once."""
    rng = np.random.default_rng(3)
    n, k = 50, 4
    best_j, best_d = np.full((n, k), -1, dtype=np.int32), np.full((n, k), np.iinfo(np.int64).max, dtype=np.int64)
    everything = []
    distance = rng.integers(0, 20, (n, n))
    distance = distance + distance.T  # a pair has one distance, whichever table finds it
    for _ in range(4):
        rows = rng.permutation(n)[:30]
        found_j = np.stack([rng.choice(np.delete(np.arange(n), r), 3, replace=False) for r in rows])
        found_d = distance[rows[:, None], found_j]
        dedup._merge_nearest(best_j, best_d, rows, found_j, found_d)
        everything += [(int(r), int(j), int(d)) for r, js, ds in zip(rows, found_j, found_d) for j, d in zip(js, ds)]
    for row in range(n):
        expected = sorted({(d, j) for r, j, d in everything if r == row})[:k]
        assert [(int(d), int(j)) for j, d in zip(best_j[row], best_d[row]) if j >= 0] == expected


def test_the_search_over_pictures_in_a_scratch_file_finds_what_it_finds_in_memory(tmp_path: Path, monkeypatch):
    rng = np.random.default_rng(1)
    pictures = rng.integers(0, 256, (600, 32, 32), dtype=np.uint8)
    pictures[300:330] = np.roll(pictures[:30], 1, axis=1)  # shifted copies, which only the spectra find
    phashes = np.array([dedup.perceptual_hash(p) for p in pictures], dtype=np.uint64)
    monkeypatch.setattr(dedup, "EXACT_NEIGHBOURS_UP_TO", 0)
    monkeypatch.setattr(dedup, "SPECTRUM_BUCKET", 16)
    monkeypatch.setattr(dedup, "CONFIRM_CHUNK", 64)  # many chunks
    stored = RowImages(tmp_path / "pictures.u8", len(pictures))
    stored.put_rows(0, pictures)
    in_memory = dedup.near_duplicates(phashes, pictures, 4, 0.1)
    from_file = dedup.near_duplicates(phashes, stored.of(np.arange(len(pictures))), 4, 0.1)
    assert {tuple(p) for p in from_file.pairs.tolist()} == {(k, 300 + k) for k in range(30)}
    assert np.array_equal(in_memory.pairs, from_file.pairs) and in_memory.candidates == from_file.candidates
    assert (tmp_path / "spectra.i16").exists()  # the spectra went beside the pictures


def test_prepare_keeps_its_features_in_a_scratch_folder_it_removes(tmp_path: Path):
    from realdata import write_png_dataset

    from veritrain.core.config import DataConfig
    from veritrain.data import prepare

    root = tmp_path / "images"
    write_png_dataset(root, 40, size=20)
    state = tmp_path / "ws" / ".veritrain"
    seen = []
    real = dedup.near_duplicates

    def watching(phashes, pictures, *args):
        seen.append(sorted(p.name for p in pictures.images.path.parent.iterdir()))
        return real(phashes, pictures, *args)

    monkeypatch = pytest.MonkeyPatch()
    from veritrain.data import grouping
    monkeypatch.setattr(grouping, "near_duplicates", watching)
    try:
        version = prepare.run(DataConfig(source="imagefolder", root=str(root), near_duplicates="on", on_split_skew="warn"), {"root": root}, state)
    finally:
        monkeypatch.undo()
    assert seen == [["pictures.u8", "thumbs.u8"]]
    assert version.inputs.shape[0] > 0 and list((state / "tmp").iterdir()) == []


def test_rows_hashed_a_batch_at_a_time_give_the_digest_of_the_whole_list(monkeypatch):
    """`JsonRows` (the listing's and the fingerprint's million rows) hash to the SHA-256 of the canonical JSON of the
    whole list: the bound `listing_sha256` of versions made before stays what it was."""
    import hashlib

    from veritrain.core import hashing

    rows = [[f"class_{i % 3}/{i}.png", None, "test" if i % 5 == 0 else None, "2026-01-01T00:00:0" + str(i % 10) + "é\""] for i in range(50)]
    monkeypatch.setattr(hashing, "JSON_ROWS_AT_ONCE", 7)  # batches, and a last one shorter
    for n in (0, 1, 7, 50):
        whole = {"samples": rows[:n], "findings": [["kind", ["a"], "why"]], "z": {"nested": 1}}
        lazy = {**whole, "samples": hashing.JsonRows(lambda n=n: iter(rows[:n]))}
        assert hashing.sha256_json(lazy) == hashlib.sha256(hashing.canonical_json(whole)).hexdigest() == hashing.sha256_json(whole)


def test_table_columns_read_like_the_lists_they_replace():
    from veritrain.data.columns import Codes, Digests, Names, Texts

    values = ["a/1.png", None, "ü/ß.png", "", None]
    texts = Texts(iter(values))
    assert list(texts) == values and [texts[i] for i in range(5)] == values and texts[-3] == "ü/ß.png" and texts[1:4] == values[1:4]
    assert list(Texts([None, None])) == [None, None] and len(Texts([])) == 0 and list(Names(["x", "y"])) == ["x", "y"]
    with pytest.raises(IndexError):
        texts[5]
    codes = Codes(["cat", None, "dog", "cat"])
    codes[1] = "test"
    codes[0] = None
    assert list(codes) == [None, "test", "dog", "cat"] and codes[2] == "dog" and codes[1:] == ["test", "dog", "cat"]
    hexed = "ab" * 32
    digests = Digests.of([hexed, None, "sha256:odd", "AB" * 32])
    assert list(digests) == [hexed, None, "sha256:odd", "AB" * 32] and digests[0] == hexed
    digests[2] = hexed
    digests[0] = None
    assert digests[:3] == [None, None, hexed]


def test_contents_grouped_by_sorting_digests_and_the_placement_read_as_dicts_were():
    from veritrain.data.columns import Codes, Digests, Names, Texts
    from veritrain.data.split import Placement
    from veritrain.data.table import ContentGroups, Table

    a, b, c = "aa" * 32, "bb" * 32, "0c" * 32
    n = 7
    table = Table(ids=Names(f"s{i}" for i in range(n)), paths=Texts([None] * n), sizes=np.zeros(n, dtype=np.int64),
                  hashes=Digests.of([b, a, c, a, b, a, "not-hex"]), labels=Codes([None] * n), groups=Texts([None] * n),
                  fixed=Codes([None] * n), timestamps=Texts([None] * n), source_ids=Texts([None] * n))
    groups = ContentGroups(table, np.array([0, 1, 2, 3, 4, 5]))
    assert groups.firsts.tolist() == [0, 1, 2] and [groups.members(k) for k in range(3)] == [[0, 4], [1, 3, 5], [2]]
    assert groups.copied() == [0, 1]
    mixed = ContentGroups(table, np.array([1, 5, 6]))  # a digest that is not hex: the texts are sorted instead
    assert mixed.firsts.tolist() == [1, 6] and mixed.members(0) == [1, 5]
    placed = Placement(6)
    for i, split in ((4, "test"), (0, "train"), (2, "val"), (0, "val")):
        placed[i] = split
    del placed[2]
    assert list(placed) == [4, 0] and dict(placed.items()) == {4: "test", 0: "val"} and len(placed) == 2
    assert 2 not in placed and 9 not in placed and placed.get(2, "quarantined") == "quarantined" and placed[4] == "test"
    assert placed.codes(np.array([0, 1, 4])).tolist() == [1, -1, 2]
    with pytest.raises(KeyError):
        placed[1]


def test_units_kept_as_arrays_read_as_the_unit_objects_they_replace():
    """`grouping._units` against the construction it replaces (one Unit object per component, sorted by first
    member): random components, fixed splits that disagree inside a unit (leak_duplicate), labels and timestamps."""
    from veritrain.data import grouping
    from veritrain.data.columns import Codes, Digests, Names, Texts
    from veritrain.data.grouping import SPLIT_PRIORITY
    from veritrain.data.split import Unit, unit_key
    from veritrain.data.table import Table

    rng = np.random.default_rng(5)
    n = 300
    fixed = [None if f == "" else f for f in rng.choice(["", "", "", "", "train", "test", "val"], n).tolist()]
    labels = [None if label == "" else label for label in rng.choice(["", "cat", "dog", "eel"], n).tolist()]
    unreadable = rng.permutation(n)[:20].tolist()

    def table() -> Table:
        made = Table(ids=Names(f"s{i:03d}" for i in range(n)), paths=Texts([None] * n), sizes=np.zeros(n, dtype=np.int64),
                     hashes=Digests.of([f"{i:064x}" for i in range(n)]), labels=Codes(labels), groups=Texts([None] * n),
                     fixed=Codes(fixed), timestamps=Texts([None] * n), source_ids=Texts([None] * n))
        for i in unreadable:
            made.add("undecodable", [i], "planted", exclude=True)
        return made

    component_of = rng.integers(0, 120, n)  # many components of several members, some of one
    instants = {i: int(rng.integers(0, 10**6)) for i in range(0, n, 3)}
    classes = ["cat", "dog"]  # eel is not a class: no class index
    got_table, want_table = table(), table()
    got = list(grouping._units(got_table, np.array(got_table.included()), component_of, classes, instants))

    components: dict[int, list[int]] = {}
    for i in want_table.included():
        components.setdefault(int(component_of[i]), []).append(i)
    want = []
    for members in components.values():
        splits = {want_table.fixed[i] for i in members if want_table.fixed[i]}
        winner = min(splits, key=SPLIT_PRIORITY.__getitem__) if splits else None
        if len(splits) > 1:
            keepers = [i for i in members if want_table.fixed[i] in (winner, None)]
            for i in members:
                if want_table.fixed[i] not in (winner, None):
                    want_table.add("leak_duplicate", [i], "x", exclude=True)
            members = keepers
        found = [instants[i] for i in members if i in instants]
        want.append(Unit(sorted(members), [{"cat": 0, "dog": 1}.get(labels[i]) for i in members], winner, max(found) if found else None,
                         unit_key(want_table.key(i) for i in members)))
    want.sort(key=lambda u: u.members[0])
    assert got == want and any(len(u.members) > 1 for u in got) and any(u.fixed for u in got)
    assert sorted(got_table.excluded) == sorted(want_table.excluded)


def test_label_issues_from_thumbnails_in_a_scratch_file_read_in_chunks_equal_those_in_memory(tmp_path: Path, monkeypatch):
    from veritrain.data import label_issues

    rng = np.random.default_rng(0)
    n = 900
    labels = rng.integers(0, 4, n)
    centres = rng.integers(0, 256, (4, 16, 16, 3))
    thumbs = np.clip(centres[labels] + rng.normal(0, 40, (n, 16, 16, 3)), 0, 255).astype(np.uint8)
    thumbs[:8] = rng.integers(0, 256, (8, 16, 16, 3))  # noise: outliers
    flipped = rng.permutation(n)[:30]
    labels[flipped] = (labels[flipped] + 1) % 4  # label errors
    in_memory = label_issues.find_label_issues_and_outliers(thumbs, labels, 4, 1)
    stored = RowImages(tmp_path / "thumbs.u8", n)
    stored.put_rows(0, thumbs)
    monkeypatch.setattr(label_issues, "QUERY_CHUNK", 100)  # ROW_CHUNK stays: it orders the sums of the PCA
    from_file = label_issues.find_label_issues_and_outliers(stored.of(np.arange(n)), labels, 4, 1)
    assert from_file == in_memory and in_memory.label_issues and in_memory.outliers
    assert (tmp_path / "features.f64").exists()  # the features went beside the thumbnails
    monkeypatch.setattr(label_issues, "MAX_RELABELLINGS", 500)  # a seeded share of the wrong labels, drawn chunk by chunk
    sampled = label_issues.find_label_issues_and_outliers(stored.of(np.arange(n)), labels, 4, 1)
    monkeypatch.setattr(label_issues, "QUERY_CHUNK", 65_536)
    assert label_issues.find_label_issues_and_outliers(thumbs, labels, 4, 1) == sampled != in_memory


def test_a_walked_folder_is_listed_as_columns_and_tabled_as_its_samples_would_be(tmp_path: Path):
    from veritrain.core.config import DataConfig
    from veritrain.data import sources, table

    for name in ("cat/a.png", "cat/sub/b.png", "dog/c.JPG", "root.png", ".hidden/x.png", "cat/.h.png", "README.txt", "dog/Thumbs.db"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    listing = sources.load_imagefolder_source(DataConfig(source="imagefolder", root=str(tmp_path)), {"root": tmp_path})
    assert isinstance(listing.samples, sources.WalkedFolder) and listing.classes == ["cat", "dog"]
    samples = list(listing.samples)
    assert [(s.sample_id, s.path, s.label, s.walked) for s in samples] == [
        (rel, path, rel.split("/", 1)[0] if "/" in rel else None, True) for rel, path in sources.walk_files(tmp_path)]
    assert [s.sample_id for s in samples] == ["README.txt", "cat/a.png", "cat/sub/b.png", "dog/Thumbs.db", "dog/c.JPG", "root.png"]
    for recipe in (4, 7):  # before recipe 5 every walked file is a sample
        columns = table._walked_table(listing.samples, recipe)
        as_list = sources.FileListing(tmp_path, samples, listing.classes, {})
        made = table._list_files(DataConfig(source="imagefolder", root=str(tmp_path)), as_list, None, True, {}, recipe)
        assert list(columns.ids) == list(made.ids) and list(columns.paths) == list(made.paths) and columns.ignored == made.ignored
        assert list(columns.labels) == list(made.labels) and list(columns.fixed) == list(made.fixed) == [None] * len(made.ids)
    assert columns.ignored == ["README.txt", "dog/Thumbs.db"]
