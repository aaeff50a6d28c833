"""CIFAR-10 reading: the official pickle layout to N×32×32×3, a restricted unpickler, strict checks, clear errors."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import pickletools
import struct
import subprocess
import sys

import numpy as np
import pytest

from veritrain.data.cifar10 import (
    BATCH_FILES,
    CIFAR10_CLASSES,
    MAX_FILE_BYTES,
    MAX_MEMO_INDEX,
    MAX_NESTING,
    MAX_OPCODES,
    load_cifar10,
    write_fake_cifar10,
)
from veritrain.core.errors import RunFailed, UserError

DOWNLOAD_HINT = (
    "download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and extract its "
    "cifar-10-batches-py folder there (veritrain never downloads data)"
)


def read_raw(path):
    with open(path, "rb") as f:  # our own fake files: a plain unpickler is fine here
        return pickle.load(f, encoding="bytes")


def globals_in(path) -> set[str]:
    return {arg for op, arg, _ in pickletools.genops(path.read_bytes()) if op.name == "GLOBAL"}


def file_state(root) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in sorted(root.iterdir())}


@pytest.fixture
def fake(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    write_fake_cifar10(root, per_batch=12, seed=3)
    return root


def test_fake_set_round_trip(fake):
    data = load_cifar10(fake)
    assert data.images.shape == (72, 32, 32, 3) and data.images.dtype == np.uint8
    assert data.images.flags.c_contiguous
    assert data.labels.dtype == np.int64 and data.labels.tolist() == [i % 10 for i in range(12)] * 6
    assert data.classes == CIFAR10_CLASSES
    assert data.sample_ids[:2] == ["data_batch_1#00000", "data_batch_1#00001"]
    assert data.sample_ids[12] == "data_batch_2#00000" and data.sample_ids[-1] == "test_batch#00011"
    assert len(set(data.sample_ids)) == 72
    assert data.fixed_split == [None] * 60 + ["test"] * 12
    assert list(data.files) == [*BATCH_FILES, "batches.meta"]
    for name, sha in data.files.items():
        assert sha == hashlib.sha256((fake / name).read_bytes()).hexdigest()


def test_pixels_are_reordered_from_planar_rows_to_hwc(fake):
    data = load_cifar10(fake)
    rows = read_raw(fake / "data_batch_3")[b"data"]  # row: 1024 red, 1024 green, 1024 blue, each 32×32 row-major
    first = 24  # data_batch_3 starts after two batches of 12
    for i, y, x, c in [(0, 0, 0, 0), (5, 7, 19, 1), (11, 31, 31, 2), (3, 0, 31, 2), (8, 31, 0, 0)]:
        assert data.images[first + i, y, x, c] == rows[i, c * 1024 + y * 32 + x]
    image = [[[rows[4, c * 1024 + y * 32 + x] for c in range(3)] for x in range(32)] for y in range(32)]
    assert np.array_equal(data.images[first + 4], np.array(image, dtype=np.uint8))


def test_fake_files_are_python2_style_like_the_official_ones(fake):
    # The official files were written by Python 2's cPickle: str as BINSTRING, numpy 1's module name.
    raw = (fake / "data_batch_1").read_bytes()
    assert raw.startswith(b"\x80\x02}")
    assert globals_in(fake / "data_batch_1") == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
    assert not {op.name for op, _, _ in pickletools.genops(raw)} & {"BINUNICODE", "SHORT_BINUNICODE", "BINBYTES"}
    batch = read_raw(fake / "data_batch_1")
    assert sorted(batch) == [b"batch_label", b"data", b"filenames", b"labels"]
    assert batch[b"batch_label"] == b"training batch 1 of 5" and batch[b"filenames"][0] == b"fake_data_batch_1_00000.png"
    assert read_raw(fake / "test_batch")[b"batch_label"] == b"testing batch 1 of 1"
    assert read_raw(fake / "batches.meta") == {
        b"label_names": [name.encode() for name in CIFAR10_CLASSES],
        b"num_cases_per_batch": 12,
        b"num_vis": 3072,
    }


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4])
def test_python3_pickles_of_the_same_content_load_the_same(fake, tmp_path, protocol):
    copy = tmp_path / "repickled"
    copy.mkdir()
    for path in fake.iterdir():
        (copy / path.name).write_bytes(pickle.dumps(read_raw(path), protocol=protocol))
    if protocol == 2:  # Python 3 writes bytes in protocol 2 as _codecs.encode(str, "latin1")
        assert "_codecs encode" in globals_in(copy / "data_batch_1")
    original, repickled = load_cifar10(fake), load_cifar10(copy)
    assert np.array_equal(original.images, repickled.images) and np.array_equal(original.labels, repickled.labels)
    assert original.classes == repickled.classes


def test_custom_classes_appear_in_every_batch(tmp_path):
    write_fake_cifar10(tmp_path, per_batch=5, seed=1, classes=["cat", "dog", "émeu"])
    data = load_cifar10(tmp_path)
    assert data.classes == ["cat", "dog", "émeu"]
    for batch in range(6):
        assert set(data.labels[batch * 5 : (batch + 1) * 5].tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match="less than the 10 classes"):
        write_fake_cifar10(tmp_path / "small", per_batch=9)


def test_same_seed_same_files_other_seed_other_images(tmp_path):
    write_fake_cifar10(tmp_path / "a", seed=7)
    write_fake_cifar10(tmp_path / "b", seed=7)
    write_fake_cifar10(tmp_path / "c", seed=8)
    assert load_cifar10(tmp_path / "a").files == load_cifar10(tmp_path / "b").files
    assert not np.array_equal(load_cifar10(tmp_path / "a").images, load_cifar10(tmp_path / "c").images)


def test_loading_leaves_the_raw_files_unchanged(fake):
    before = file_state(fake)
    load_cifar10(fake)
    assert file_state(fake) == before


# --- missing data: UserError (exit 2) with one line saying where to put the files ------------------------


def test_missing_folder_says_where_to_put_the_files(tmp_path):
    root = tmp_path / "nowhere"
    with pytest.raises(UserError) as err:
        load_cifar10(root)
    assert str(err.value) == f"data.root: {root}: CIFAR-10 not found (no such folder); {DOWNLOAD_HINT}"
    assert err.value.exit_code == 2


def test_missing_batch_file_is_named(fake):
    (fake / "data_batch_3").unlink()
    with pytest.raises(UserError) as err:
        load_cifar10(fake)
    assert str(err.value) == f"data.root: {fake}: CIFAR-10 not found (missing data_batch_3); {DOWNLOAD_HINT}"


def test_empty_folder_names_every_missing_file(tmp_path):
    with pytest.raises(UserError) as err:
        load_cifar10(tmp_path)
    expected = "data_batch_1, data_batch_2, data_batch_3, data_batch_4, data_batch_5, test_batch, batches.meta"
    assert str(err.value) == f"data.root: {tmp_path}: CIFAR-10 not found (missing {expected}); {DOWNLOAD_HINT}"


def test_folder_above_the_extracted_one_points_to_it(fake):
    parent = fake.parent
    with pytest.raises(UserError) as err:
        load_cifar10(parent)
    assert str(err.value).endswith(f"; the files are in {fake}: set data.root to that folder")
    assert "\n" not in str(err.value)


# --- hostile or malformed files: RunFailed (exit 1) naming the file and the problem ---------------------


class RunsShell:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_malicious_pickle_is_refused_without_running_it(fake, tmp_path):
    marker = tmp_path / "pwned"
    batch = read_raw(fake / "data_batch_2")
    batch[b"data"] = RunsShell(f"echo pwned > {marker}")
    (fake / "data_batch_2").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(RunFailed) as err:
        load_cifar10(fake)
    assert str(err.value) == (
        f"data.root: {fake / 'data_batch_2'}: refused to unpickle global '{os.system.__module__}.system'; "
        "only numpy arrays, dicts, lists, bytes and numbers are allowed"
    )
    assert err.value.exit_code == 1
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload, problem",
    [
        (b"cbuiltins\neval\n(S'1+1'\ntR.", "refused to unpickle global 'builtins.eval'"),
        (b"c__builtin__\nexec\n(S'1'\ntR.", "refused to unpickle global '__builtin__.exec'"),  # Python 2 name
        (b"csubprocess\ncall\n(S'true'\ntR.", "refused to unpickle global 'subprocess.call'"),
        (b"cnumpy.testing._private.utils\nrunstring\n(S'1'\n}tR.", "refused to unpickle global 'numpy.testing._private.utils.runstring'"),
        (b"cnumpy\nload\n(S'x'\ntR.", "refused to unpickle global 'numpy.load'"),
        # allowed globals used other than the way numpy's own pickles use them
        (b"\x80\x02cnumpy\nndarray\nK\x01\x85R.", "refused to call numpy.ndarray directly"),
        (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nJ\x00\x00\x00\x40\x85U\x01b\x87R.", "refused numpy _reconstruct arguments"),
        (b"\x80\x02cnumpy\ndtype\nU\x02O8K\x00K\x01\x87R.", "refused numpy dtype 'object'"),
        (b"\x80\x02c__builtin__\nbytes\nJ\x00\x00\x00\x40\x85R.", "refused __builtin__.bytes with arguments"),
        (b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x04\x00\x00\x00zlib\x86R.", "refused _codecs.encode other than"),
    ],
)
def test_forbidden_globals_and_misused_allowed_ones_are_refused(fake, payload, problem):
    (fake / "data_batch_5").write_bytes(payload)
    with pytest.raises(RunFailed) as err:
        load_cifar10(fake)
    assert str(err.value).startswith(f"data.root: {fake / 'data_batch_5'}: {problem}")


def ints_as_floats(batch):
    batch[b"labels"] = [float(label) for label in batch[b"labels"]]


@pytest.mark.parametrize(
    "corrupt, problem",
    [
        (lambda b: b.update({b"data": b[b"data"][:, :3071]}), "data must be uint8 of shape (N, 3072) with N > 0, found uint8 (12, 3071)"),
        (lambda b: b.update({b"data": b[b"data"].astype(np.int64)}), "data must be uint8 of shape (N, 3072) with N > 0, found int64 (12, 3072)"),
        (lambda b: b.update({b"data": b[b"data"].reshape(12, 3, 1024)}), "found uint8 (12, 3, 1024)"),
        (lambda b: b.update({b"data": b[b"data"][:0], b"labels": []}), "found uint8 (0, 3072)"),
        (lambda b: b.update({b"data": b[b"data"].tolist()}), "data must be a numpy array, found list"),
        (lambda b: b[b"labels"].__setitem__(7, 10), "label 10 at row 7 is not a class index in 0..9"),
        (lambda b: b[b"labels"].__setitem__(0, -1), "label -1 at row 0 is not a class index in 0..9"),
        (ints_as_floats, "label 0.0 at row 0 is not a class index in 0..9"),
        (lambda b: b[b"labels"].pop(), "labels must be a list of 12 ints (one per data row), found 11 labels"),
        (lambda b: b.update({b"labels": np.array(b[b"labels"])}), "labels must be a list of 12 ints (one per data row), found ndarray"),
        (lambda b: b.pop(b"labels"), "missing key b'labels'"),
    ],
)
def test_malformed_batch_is_refused_naming_the_file(fake, corrupt, problem):
    batch = read_raw(fake / "data_batch_4")
    corrupt(batch)
    (fake / "data_batch_4").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(RunFailed) as err:
        load_cifar10(fake)
    assert str(err.value).startswith(f"data.root: {fake / 'data_batch_4'}: ") and problem in str(err.value)
    assert "\n" not in str(err.value)


def test_str_keys_and_non_dicts_are_refused(fake):
    batch = {key.decode(): value for key, value in read_raw(fake / "test_batch").items()}
    (fake / "test_batch").write_bytes(pickle.dumps(batch, protocol=4))
    with pytest.raises(RunFailed, match=r"test_batch: missing key b'data' \(keys found: 'batch_label', 'data'"):
        load_cifar10(fake)
    (fake / "test_batch").write_bytes(pickle.dumps([1, 2, 3], protocol=2))
    with pytest.raises(RunFailed, match="test_batch: expected a dict, found list"):
        load_cifar10(fake)


@pytest.mark.parametrize(
    "meta, problem",
    [
        ({b"num_vis": 3072}, "missing key b'label_names' (keys found: b'num_vis')"),
        ({b"label_names": []}, "label_names must be a non-empty list of byte strings"),
        ({b"label_names": ["cat", "dog"]}, "label_names must be a non-empty list of byte strings"),
        ({b"label_names": [b"cat", b"\xff"]}, "label_names are not valid UTF-8"),
        ({b"label_names": [b"cat", b"cat"]}, "label_names has duplicates: ['cat', 'cat']"),
    ],
)
def test_malformed_meta_is_refused(fake, meta, problem):
    (fake / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    with pytest.raises(RunFailed) as err:
        load_cifar10(fake)
    assert str(err.value) == f"data.root: {fake / 'batches.meta'}: {problem}"


def test_labels_are_checked_against_the_number_of_classes_in_meta(fake):
    (fake / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"a", b"b", b"c"]}, protocol=2))
    with pytest.raises(RunFailed, match=r"data_batch_1: label 3 at row 3 is not a class index in 0\.\.2"):
        load_cifar10(fake)


def test_truncated_and_padded_files_are_refused(fake):
    raw = (fake / "data_batch_1").read_bytes()
    (fake / "data_batch_1").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(RunFailed) as err:
        load_cifar10(fake)
    assert str(err.value).startswith(f"data.root: {fake / 'data_batch_1'}: not a readable CIFAR-10 pickle (")
    assert "\n" not in str(err.value)
    (fake / "data_batch_1").write_bytes(raw + b"extra")
    with pytest.raises(RunFailed, match="data_batch_1: 5 unexpected bytes after the pickle"):
        load_cifar10(fake)


def test_oversized_file_is_refused_before_reading(fake):
    with open(fake / "data_batch_2", "r+b") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: costs no disk and, since it is refused unread, no memory
    with pytest.raises(RunFailed) as err:
        load_cifar10(fake)
    assert str(err.value) == (
        f"data.root: {fake / 'data_batch_2'}: 209,715,201 bytes is over the 209,715,200-byte limit for a CIFAR-10 file "
        "(a real batch is about 31 MB)"
    )


def test_a_folder_in_place_of_a_file_is_refused(fake):
    (fake / "data_batch_1").unlink()
    (fake / "data_batch_1").mkdir()
    with pytest.raises(RunFailed, match="data_batch_1: cannot read: Is a directory"):
        load_cifar10(fake)


def test_the_fixed_test_batch_prepares_without_split_skew(tmp_path):
    # the official test batch is fixed: only the training batches are split (train/val at 8:1), and judged
    from veritrain.core.config import load_config
    from veritrain.data import prepare

    write_fake_cifar10(tmp_path / "cifar", per_batch=100, seed=3)
    resolved = load_config(None, ["data.source=cifar10", f"data.root={tmp_path / 'cifar'}"])
    data = prepare.run(resolved.config.data, resolved.data_paths, tmp_path / ".veritrain")
    achieved = data.report()["summary"]["achieved_split"]
    assert achieved["judged"] and not achieved["skewed"]
    assert achieved["wanted_for_free_samples"]["test"] == 0.0
    assert sum(c["samples"] for c in achieved["per_class"].values()) == 500  # the five training batches only
    assert {data.sample_ids[r].split("#")[0] for r in data.splits["test"]} == {"test_batch"}
    assert not [f for f in data.report()["findings"] if f["kind"] == "split_skew"]


def test_a_prepare_from_the_same_files_reuses_the_version_without_parsing_them(tmp_path, monkeypatch):
    """The files' SHA-256s name the version a config prepared from them: unchanged bytes reuse it without unpickling;
    one changed byte, another config, an edited card or a memo naming a version of other files prepare anew."""
    from veritrain.core.config import load_config
    from veritrain.data import prepare, sources

    write_fake_cifar10(tmp_path / "cifar", per_batch=40, seed=3)
    state = tmp_path / ".veritrain"

    def prepared(*overrides):
        resolved = load_config(None, ["data.source=cifar10", f"data.root={tmp_path / 'cifar'}", "data.near_duplicates=off", *overrides])
        return prepare.run(resolved.config.data, resolved.data_paths, state)

    first = prepared()
    parsed = []
    real = sources.load_cifar10
    monkeypatch.setattr(sources, "load_cifar10", lambda root: parsed.append(root) or real(root))
    again = prepared()
    assert (again.version, again.reused, parsed) == (first.version, True, [])
    carded = prepared("data.card.license=CC0")  # another config: read and listed, the same version, its card written
    assert (carded.version, len(parsed)) == (first.version, 1)
    assert json.loads((carded.path / "card.json").read_text())["license"] == "CC0"
    assert prepared("data.card.license=CC0").version == first.version and len(parsed) == 1
    assert prepared().version == first.version and len(parsed) == 1
    assert json.loads((first.path / "card.json").read_text()).get("license") != "CC0"  # this config's card again

    batch = tmp_path / "cifar" / "data_batch_2"
    raw = bytearray(batch.read_bytes())
    raw[len(raw) // 2] ^= 1  # one pixel (the middle of the file is the pixel array)
    batch.write_bytes(bytes(raw))
    changed = prepared()
    assert changed.version != first.version and len(parsed) == 2

    memo = next(p for p in (state / "cache" / "prepared").glob("files-*") if json.loads(p.read_text())["version"] == changed.version)
    memo.write_text(json.dumps({"version": first.version, "card": {}}))  # names a version made from other bytes
    assert prepared().version == changed.version and len(parsed) == 3
    resolved = load_config(None, ["data.source=cifar10", f"data.root={tmp_path / 'cifar'}", "data.near_duplicates=off"])
    assert prepare.version_now(resolved.config.data, resolved.data_paths, tmp_path / "scratch") == changed.version
    assert len(parsed) == 4  # verify's way (version_now) always reads the samples


# --- pickles made to crash or exhaust the reader: refused from their opcodes, before unpickling ------------
# Each is loaded in a child process, since without the limits some kill the process (hashing a tuple nested
# 1,000,000 deep as a dict key segfaults; a memo index of 2**32 - 1 asks for 64 GiB). RunFailed, exit 1, like
# every other bad CIFAR-10 file.

N = 100_000
DEEP = f"refused a pickle nested more than {MAX_NESTING} levels deep; a real CIFAR-10 file nests 5"
PROTO2 = b"\x80\x02"


def memo_put(index: int) -> bytes:
    return b"r" + struct.pack("<I", index)  # LONG_BINPUT


def memo_get(index: int) -> bytes:
    return b"j" + struct.pack("<I", index)  # LONG_BINGET


def lists_linked_through_the_memo(count: int, backwards: bool) -> bytes:
    """`count` empty lists in the memo, then list i appended to list i - 1 by fetching both from the memo: a chain
    as deep as `count` although no opcode nests more than two levels."""
    made = b"".join(b"]" + memo_put(i) + b"0" for i in range(count))  # EMPTY_LIST, PUT i, POP
    order = range(count - 1, 0, -1) if backwards else range(1, count)
    links = b"".join(memo_get(i - 1) + memo_get(i) + b"a0" for i in order)  # GET i-1, GET i, APPEND, POP
    return PROTO2 + made + links + memo_get(0) + b"."


HOSTILE = {
    # nesting, by each way the opcodes can nest
    "marks_then_lists": (PROTO2 + b"(" * N + b"l" * N + b".", DEEP),
    "empty_lists_then_appends": (PROTO2 + b"]" * N + b"a" * (N - 1) + b".", DEEP),
    "tuple1_chain": (PROTO2 + b")" + b"\x85" * N + b".", DEEP),
    "deep_tuple_as_dict_key": (PROTO2 + b"})" + b"\x85" * 1_000_000 + b"K\x01s.", DEEP),  # segfaulted when hashed
    "dicts_in_dicts": (PROTO2 + b"}" + b"K\x01}" * N + b"s" * N + b".", DEEP),
    "reduce_args_chain": (PROTO2 + b"c__builtin__\nbytes\n)" + b"\x85" * N + b"R.", DEEP),
    "chain_through_the_memo": (lists_linked_through_the_memo(N, backwards=True), DEEP),
    "chain_through_the_memo_forwards": (lists_linked_through_the_memo(N, backwards=False),
                                        # at the second link's APPEND: after N lists (7 bytes each) and one link (12 bytes)
                                        f"refused a pickle that changes an object after placing it in another (byte {2 + 7 * N + 12 + 10}); the pickler never does"),
    "list_inside_itself": (PROTO2 + b"]" + memo_put(0) + memo_get(0) + b"a.", "refused a pickle with an object that contains itself; CIFAR-10 files have none"),
    # sizes the file declares
    "memo_index_2_32": (PROTO2 + b"N" + memo_put(2**32 - 1) + b".", f"refused memo index 4,294,967,295 at byte 3; the limit is {MAX_MEMO_INDEX:,} (a real CIFAR-10 batch uses about 10,000)"),
    "memo_entries": (b"\x80\x04" + b"N\x94" * MAX_MEMO_INDEX + b"N\x94.",
                     f"refused memo index {MAX_MEMO_INDEX:,} at byte {2 + 2 * MAX_MEMO_INDEX + 1}; the limit is {MAX_MEMO_INDEX:,} (a real CIFAR-10 batch uses about 10,000)"),
    "frame_2_62": (b"\x80\x04\x95" + struct.pack("<Q", 2**62) + b"N.",
                   "not a readable CIFAR-10 pickle (ValueError: frame at byte 2 declares 4,611,686,018,427,387,904 bytes but only 2 follow)"),
    "bytes8_2_62": (b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"x.",
                    "not a readable CIFAR-10 pickle (ValueError: expected 4611686018427387904 bytes in a bytes8, but only 2 remain)"),
    "unicode8_2_62": (b"\x80\x04\x8d" + struct.pack("<Q", 2**62) + b"x.",
                      "not a readable CIFAR-10 pickle (ValueError: expected 4611686018427387904 bytes in a unicodestring8, but only 2 remain)"),
    "long4_2_31": (PROTO2 + b"\x8b" + struct.pack("<i", 2**31 - 1) + b"\x01.",
                   "not a readable CIFAR-10 pickle (ValueError: not enough data in stream to read long4)"),
    "binstring_negative": (PROTO2 + b"T" + struct.pack("<i", -1) + b".", "not a readable CIFAR-10 pickle (ValueError: string4 byte count < 0: -1)"),
    "int_of_5000_digits": (PROTO2 + b"\x8b" + struct.pack("<i", 2080) + b"\x01" * 2080 + b".", "refused an integer wider than 64 bits at byte 2"),
    # length of the stream
    "opcodes": (PROTO2 + b"N0" * (MAX_OPCODES // 2) + b"N.", f"refused a pickle of more than {MAX_OPCODES:,} opcodes; a real CIFAR-10 batch has about 30,000"),
}

LOAD_EACH = """
import json, shutil, sys
from pathlib import Path
from veritrain.data.cifar10 import load_cifar10
from veritrain.core.errors import VeritrainError

base = Path(sys.argv[1])
for payload in sorted(base.glob("*.pickle")):
    shutil.copyfile(payload, base / "cifar" / "data_batch_1")
    try:
        load_cifar10(base / "cifar")
        result = ["loaded", 0, ""]
    except VeritrainError as err:
        result = [type(err).__name__, err.exit_code, str(err)]
    print(json.dumps([payload.stem, *result]), flush=True)
"""


@pytest.fixture(scope="module")
def hostile_loads(tmp_path_factory):
    """Every HOSTILE payload (and an intact batch, `control`) loaded as data_batch_1 in one child process."""
    base = tmp_path_factory.mktemp("hostile")
    write_fake_cifar10(base / "cifar", per_batch=10)
    (base / "control.pickle").write_bytes((base / "cifar" / "data_batch_1").read_bytes())
    for name, (payload, _) in HOSTILE.items():
        (base / f"{name}.pickle").write_bytes(payload)
    proc = subprocess.run([sys.executable, "-c", LOAD_EACH, str(base)], capture_output=True, text=True, timeout=300)
    results = {line[0]: line[1:] for line in map(json.loads, proc.stdout.splitlines())}
    return base / "cifar" / "data_batch_1", results, proc


def test_an_intact_batch_still_loads_in_the_child(hostile_loads):
    _, results, proc = hostile_loads
    assert results.get("control") == ["loaded", 0, ""], proc.stderr[-3000:]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_pickle_is_refused_in_one_line(hostile_loads, name):
    path, results, proc = hostile_loads
    assert name in results, f"the child died (exit {proc.returncode}) before finishing it: {proc.stderr[-3000:]}"
    assert results[name] == ["RunFailed", 1, f"data.root: {path}: {HOSTILE[name][1]}"]


def test_real_size_batch_passes_the_limits(tmp_path):
    # a full 10,000-image batch (31 MB) as the official files have it, and re-pickled with every protocol that loads
    root = tmp_path / "cifar"
    write_fake_cifar10(root, per_batch=10)
    rng = np.random.default_rng(0)
    batch = read_raw(root / "data_batch_1")
    batch[b"labels"] = [int(label) for label in rng.integers(0, 10, 10_000)]
    batch[b"data"] = rng.integers(0, 256, size=(10_000, 3072), dtype=np.uint8)
    batch[b"filenames"] = [f"leptodactylus_pentadactylus_s_{row:06d}.png".encode() for row in range(10_000)]
    for protocol in (0, 2, 4):
        (root / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=protocol))
        assert len(load_cifar10(root).labels) == 10_050


def test_cli_refuses_a_deeply_nested_batch_in_one_line_exit_1(cli, tmp_path):
    write_fake_cifar10(tmp_path / "cifar", per_batch=10)
    (tmp_path / "cifar" / "test_batch").write_bytes(HOSTILE["marks_then_lists"][0])
    config = tmp_path / "exp.yaml"
    config.write_text("data:\n  source: cifar10\n  root: cifar\n")
    result = cli("data", "prepare", str(config), "--workdir", str(tmp_path))
    assert (result.code, result.stderr) == (1, f"error: data.root: {tmp_path / 'cifar' / 'test_batch'}: {DEEP}\n")
