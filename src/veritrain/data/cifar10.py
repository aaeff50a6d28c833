"""Read CIFAR-10 from its official python-pickle folder (`cifar-10-batches-py`) into uint8 N×32×32×3 arrays.

The files come from outside, so their opcode stream is first checked against limits on nesting, length and
memo size (a crafted pickle can otherwise crash the process), then they are unpickled with an allowlist that
admits only what a pickled numpy array needs, then checked field by field; they are opened for reading only
and never downloaded.
`write_fake_cifar10` writes a tiny set in the same format for tests.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import pickletools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union, cast

import numpy as np

from veritrain.core.errors import RunFailed, UserError

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct  # pyright: ignore[reportGeneralTypeIssues]  # the same function, older path

BATCH_FILES: tuple[str, ...] = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")
META_FILE = "batches.meta"
TEST_BATCH = "test_batch"
MAX_FILE_BYTES = 200 * 1024 * 1024  # a real batch is ~31 MB; anything far larger is not CIFAR-10
ROW_BYTES = 3 * 32 * 32  # one image per row: 1024 red, then 1024 green, then 1024 blue, each 32×32 row-major

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@dataclass
class Cifar10:
    images: np.ndarray  # uint8 N×32×32×3 (HWC, RGB); data_batch_1..5, then test_batch
    labels: np.ndarray  # int64 N; indices into `classes`
    classes: list[str]  # batches.meta label_names, decoded as UTF-8
    sample_ids: list[str]  # "<batch file>#<row:05d>", e.g. "test_batch#09999"
    fixed_split: list[Optional[str]]  # "test" for test_batch samples; None for the rest (split later)
    files: dict[str, str]  # file name → SHA-256 of its bytes: the six batches and batches.meta


# --- restricted unpickling -------------------------------------------------------------------------------


class _Refused(pickle.UnpicklingError):
    """The pickle asked for something outside the allowlist; `str()` is the reason."""


def _ndarray_marker(*args: Any) -> None:
    # Stands in for numpy.ndarray: numpy's pickles only pass the class to _reconstruct, never call it.
    raise _Refused("refused to call numpy.ndarray directly; only numpy's own array pickles are allowed")


def _reconstruct_empty_array(cls: Any, shape: Any, typecode: Any) -> np.ndarray:
    # numpy pickles an array as _reconstruct(ndarray, (0,), 'b') and fills it by BUILD (__setstate__, which
    # checks the data length against the shape); any other arguments would allocate or build other types.
    if cls is not _ndarray_marker or shape != (0,) or typecode not in (b"b", "b"):
        raise _Refused("refused numpy _reconstruct arguments other than (numpy.ndarray, (0,), 'b')")
    return cast(np.ndarray, _reconstruct(np.ndarray, (0,), b"b"))  # typed as returning object; given ndarray, it makes one


def _numeric_dtype(spec: Any, align: Any = False, copy: Any = True) -> np.dtype:
    # Object dtypes would let the array hold arbitrary pickled objects; CIFAR-10 only needs numbers.
    if not isinstance(spec, (bytes, str)):
        raise _Refused("refused a numpy dtype that is not a plain type code")
    dtype = np.dtype(spec.decode("ascii") if isinstance(spec, bytes) else spec, bool(align), bool(copy))
    if dtype.kind not in "biuf":
        raise _Refused(f"refused numpy dtype {str(dtype)!r}; only booleans, integers and floats are allowed")
    return dtype


def _latin1_encode(text: Any, encoding: Any) -> bytes:
    # Python 3 writes bytes in protocol-2 pickles as _codecs.encode(str, "latin1"); other codecs are refused.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused("refused _codecs.encode other than encode(str, 'latin1')")
    return text.encode("latin-1")


def _empty_bytes(*args: Any) -> bytes:
    # Python 3 writes an empty bytes in protocol 2 as __builtin__.bytes(); bytes(n) would allocate n bytes.
    if args:
        raise _Refused("refused __builtin__.bytes with arguments; only bytes() (empty) is allowed")
    return b""


# (module, name) in the pickle → what it resolves to. Everything else is refused.
_ALLOWED_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct_empty_array,  # numpy 1 spelling (the official files)
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct_empty_array,  # numpy 2 spelling
    ("numpy", "ndarray"): _ndarray_marker,
    ("numpy", "dtype"): _numeric_dtype,
    ("_codecs", "encode"): _latin1_encode,  # this and the next only in protocol-2 pickles written by Python 3
    ("__builtin__", "bytes"): _empty_bytes,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise _Refused(
                f"refused to unpickle global '{module}.{name}'; only numpy arrays, dicts, lists, bytes and numbers are allowed"
            ) from None


# --- limits checked on the opcode stream before anything is unpickled --------------------------------------
# The unpickler and Python itself recurse without a guard in places (hashing a tuple nested 1,000,000 deep as a
# dict key segfaults) and size some allocations by what the file declares (a memo index of 2**32 - 1 asks for
# 64 GiB), so the opcodes are walked first with a model of the unpickler's stack that tracks only nesting.
MAX_NESTING = 32  # containers inside containers, open MARKs included; a real batch nests 5 deep
MAX_OPCODES = 1_000_000  # a real batch has about 30,000 (120,000 when re-pickled with protocol 0)
MAX_MEMO_INDEX = 200_000  # memo slots; a real batch uses about 10,000 (30,000 when re-pickled with protocol 2)
MAX_INT_BITS = 64  # wider integers have no place in CIFAR-10, and printing a huge one in an error fails


class _Node:
    """One object on the modelled stack: how deep containers nest in it, and whether it is already inside another
    object. A placed object must not change (else the depth recorded for its holders would go stale); the
    pickler never does that, only a hand-made stream that nests by aliasing memo entries."""

    __slots__ = ("depth", "placed")

    def __init__(self, depth: int) -> None:
        self.depth, self.placed = depth, False


_ATOM = _Node(0)  # numbers, strings, bytes, None, True/False, globals: nothing nests inside them

_ATOM_OPCODES = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "NEXT_BUFFER",
    "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "GLOBAL", "EXT1", "EXT2", "EXT4", "PERSID",
})
_BUILT_FROM_MARK = frozenset({"LIST", "TUPLE", "DICT", "FROZENSET", "OBJ", "INST"})  # a new object from the items above MARK
_BUILT_FROM_TOP = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "REDUCE": 2, "NEWOBJ": 2, "NEWOBJ_EX": 3}  # ... from the top n
_ADDED_FROM_MARK = frozenset({"APPENDS", "SETITEMS", "ADDITEMS"})  # the items above MARK go into the object below it
_ADDED_FROM_TOP = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}  # the top n go into the object below them


def _too_deep() -> _Refused:
    return _Refused(f"refused a pickle nested more than {MAX_NESTING} levels deep; a real CIFAR-10 file nests 5")


def _opcodes(raw: bytes) -> Iterator[tuple[pickletools.OpcodeInfo, Any, int]]:
    """pickletools.genops over bytes, typed as it behaves here: the argument's type depends on the opcode (None for
    opcodes without one), and every opcode has a position, as genops reads bytes through an io.BytesIO."""
    for opcode, arg, pos in pickletools.genops(raw):
        assert pos is not None
        yield opcode, arg, pos


def _check_opcodes(raw: bytes) -> None:
    """Refuse (`_Refused`) a pickle over the limits above; ValueError for one the unpickler could not load either."""
    stack: list[_Node] = []
    marks: list[int] = []  # stack lengths at each open MARK, as in the C unpickler
    memo: dict[int, _Node] = {}

    def fence() -> int:
        return marks[-1] if marks else 0

    def pop(n: int, pos: int) -> list[_Node]:
        if len(stack) - n < fence():
            raise ValueError(f"unpickling stack underflow at byte {pos}")
        items = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return items

    def pop_mark(pos: int) -> list[_Node]:
        if not marks:
            raise ValueError(f"no MARK for the opcode at byte {pos}")
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    def top(pos: int) -> _Node:
        if len(stack) <= fence():
            raise ValueError(f"unpickling stack underflow at byte {pos}")
        return stack[-1]

    def holding(holder: _Node, items: list[_Node]) -> _Node:
        for item in items:
            if item is holder:
                raise _Refused("refused a pickle with an object that contains itself; CIFAR-10 files have none")
            if item is not _ATOM:
                item.placed = True
            holder.depth = max(holder.depth, item.depth + 1)
        if holder.depth > MAX_NESTING:
            raise _too_deep()
        return holder

    for count, (opcode, arg, pos) in enumerate(_opcodes(raw), start=1):
        if count > MAX_OPCODES:
            raise _Refused(f"refused a pickle of more than {MAX_OPCODES:,} opcodes; a real CIFAR-10 batch has about 30,000")
        name = opcode.name
        if name in _ATOM_OPCODES:
            if name in ("INT", "LONG", "LONG1", "LONG4") and abs(arg).bit_length() > MAX_INT_BITS:
                raise _Refused(f"refused an integer wider than {MAX_INT_BITS} bits at byte {pos}")
            stack.append(_ATOM)
        elif name in ("EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_SET"):
            stack.append(_Node(1))
        elif name in _BUILT_FROM_MARK:
            stack.append(holding(_Node(1), pop_mark(pos)))
        elif name in _BUILT_FROM_TOP:
            stack.append(holding(_Node(1), pop(_BUILT_FROM_TOP[name], pos)))
        elif name in _ADDED_FROM_MARK or name in _ADDED_FROM_TOP:
            items = pop_mark(pos) if name in _ADDED_FROM_MARK else pop(_ADDED_FROM_TOP[name], pos)
            holder = top(pos)
            if holder is _ATOM:  # adding to a number or string fails in the unpickler itself
                continue
            if holder.placed:
                raise _Refused(f"refused a pickle that changes an object after placing it in another (byte {pos}); the pickler never does")
            holding(holder, items)
        elif name == "MARK":
            if len(marks) >= MAX_NESTING:
                raise _too_deep()
            marks.append(len(stack))
        elif name == "POP":
            if marks and marks[-1] == len(stack):
                marks.pop()  # POP right after MARK drops the mark, as in the C unpickler
            else:
                pop(1, pos)
        elif name == "POP_MARK":
            pop_mark(pos)
        elif name == "DUP":
            stack.append(top(pos))
        elif name in ("STACK_GLOBAL", "BINPERSID"):
            pop(2 if name == "STACK_GLOBAL" else 1, pos)
            stack.append(_ATOM)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            index = len(memo) if name == "MEMOIZE" else arg
            if index >= MAX_MEMO_INDEX:
                raise _Refused(f"refused memo index {index:,} at byte {pos}; the limit is {MAX_MEMO_INDEX:,} (a real CIFAR-10 batch uses about 10,000)")
            memo[index] = top(pos)
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise ValueError(f"memo index {arg} at byte {pos} was never stored")
            stack.append(memo[arg])
        elif name == "FRAME":
            if arg > len(raw) - (pos + 9):  # 1 opcode byte and an 8-byte length
                raise ValueError(f"frame at byte {pos} declares {arg:,} bytes but only {len(raw) - pos - 9:,} follow")
        elif name == "STOP":
            top(pos)
        elif name not in ("PROTO", "READONLY_BUFFER"):
            raise _Refused(f"refused pickle opcode {name} at byte {pos}")


def _read_bounded(path: Path) -> bytes:
    """The bytes of one file of the folder, refused past MAX_FILE_BYTES (RunFailed naming the file)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise RunFailed(
                f"data.root: {path}: {size:,} bytes is over the {MAX_FILE_BYTES:,}-byte limit for a CIFAR-10 file (a real batch is about 31 MB)"
            )
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # bounded even if the file grew after stat
    except OSError as err:
        raise RunFailed(f"data.root: {path}: cannot read: {err.strerror or err}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise RunFailed(f"data.root: {path}: grew past the {MAX_FILE_BYTES:,}-byte limit for a CIFAR-10 file while being read")
    return raw


def file_hashes(root: Path) -> Optional[dict[str, str]]:
    """The SHA-256 of every file `load_cifar10` reads, by name, read but not parsed: equal hashes are equal samples
    (the `files` of what it loads). None when one is missing (`load_cifar10` says what)."""
    names = (*BATCH_FILES, META_FILE)
    if not all((Path(root) / name).is_file() for name in names):
        return None
    return {name: hashlib.sha256(_read_bounded(Path(root) / name)).hexdigest() for name in names}


def _read_pickle(path: Path) -> tuple[Any, str]:
    """The unpickled object and the SHA-256 of the file's bytes; RunFailed naming the file if it is not one."""
    raw = _read_bounded(path)
    buffer = io.BytesIO(raw)
    try:
        _check_opcodes(raw)
        # The official files are Python 2 pickles: their str values (keys, pixel data) load as bytes.
        obj = _RestrictedUnpickler(buffer, encoding="bytes").load()
    except _Refused as err:
        raise RunFailed(f"data.root: {path}: {err}") from None
    except Exception as err:  # any failure to decode untrusted bytes means a malformed file, not a bug here
        problem = " ".join(f"{type(err).__name__}: {err}".split())
        raise RunFailed(f"data.root: {path}: not a readable CIFAR-10 pickle ({problem})") from None
    if buffer.tell() != len(raw):
        raise RunFailed(f"data.root: {path}: {len(raw) - buffer.tell():,} unexpected bytes after the pickle")
    return obj, hashlib.sha256(raw).hexdigest()


# --- structure checks ------------------------------------------------------------------------------------


def _key(batch: dict, key: bytes, path: Path) -> Any:
    if key not in batch:
        found = ", ".join(sorted(repr(k) for k in batch)) or "none"
        raise RunFailed(f"data.root: {path}: missing key {key!r} (keys found: {found})")
    return batch[key]


def _check_meta(meta: Any, path: Path) -> list[str]:
    if not isinstance(meta, dict):
        raise RunFailed(f"data.root: {path}: expected a dict, found {type(meta).__name__}")
    names = _key(meta, b"label_names", path)
    if not isinstance(names, list) or not names or not all(isinstance(name, bytes) for name in names):
        raise RunFailed(f"data.root: {path}: label_names must be a non-empty list of byte strings")
    try:
        classes = [name.decode("utf-8") for name in names]
    except UnicodeDecodeError:
        raise RunFailed(f"data.root: {path}: label_names are not valid UTF-8") from None
    if len(set(classes)) != len(classes):
        raise RunFailed(f"data.root: {path}: label_names has duplicates: {classes}")
    return classes


def _check_batch(batch: Any, path: Path, n_classes: int) -> tuple[np.ndarray, list[int]]:
    if not isinstance(batch, dict):
        raise RunFailed(f"data.root: {path}: expected a dict, found {type(batch).__name__}")
    data = _key(batch, b"data", path)
    labels = _key(batch, b"labels", path)
    if not isinstance(data, np.ndarray):
        raise RunFailed(f"data.root: {path}: data must be a numpy array, found {type(data).__name__}")
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[0] == 0 or data.shape[1] != ROW_BYTES:
        raise RunFailed(f"data.root: {path}: data must be uint8 of shape (N, {ROW_BYTES}) with N > 0, found {data.dtype} {data.shape}")
    if not isinstance(labels, list) or len(labels) != data.shape[0]:
        found = f"{len(labels)} labels" if isinstance(labels, list) else type(labels).__name__
        raise RunFailed(f"data.root: {path}: labels must be a list of {data.shape[0]} ints (one per data row), found {found}")
    for row, label in enumerate(labels):
        if type(label) is not int or not 0 <= label < n_classes:
            raise RunFailed(f"data.root: {path}: label {label!r} at row {row} is not a class index in 0..{n_classes - 1}")
    return data, labels


# --- loading ---------------------------------------------------------------------------------------------


def load_cifar10(root: Path) -> Cifar10:
    """All six batches of the CIFAR-10 folder `root`; UserError if it is not there, RunFailed if a file is bad."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(
            f"data.root: {root}: CIFAR-10 not found (no such folder); download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and extract its cifar-10-batches-py folder there (veritrain never downloads data)"
        )
    missing = [name for name in (*BATCH_FILES, META_FILE) if not (root / name).exists()]
    if missing:
        if (root / "cifar-10-batches-py" / META_FILE).exists():
            raise UserError(
                f"data.root: {root}: CIFAR-10 not found (missing {', '.join(missing)}); the files are in {root / 'cifar-10-batches-py'}: set data.root to that folder"
            )
        raise UserError(
            f"data.root: {root}: CIFAR-10 not found (missing {', '.join(missing)}); download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and extract its cifar-10-batches-py folder there (veritrain never downloads data)"
        )

    meta, meta_sha = _read_pickle(root / META_FILE)
    classes = _check_meta(meta, root / META_FILE)
    images, labels, sample_ids, fixed_split, files = [], [], [], [], {}
    for name in BATCH_FILES:
        batch, files[name] = _read_pickle(root / name)
        data, batch_labels = _check_batch(batch, root / name, len(classes))
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))  # rows of CHW planes → HWC
        labels.extend(batch_labels)
        sample_ids.extend(f"{name}#{row:05d}" for row in range(len(data)))
        fixed_split.extend(["test" if name == TEST_BATCH else None] * len(data))
    files[META_FILE] = meta_sha
    return Cifar10(
        images=np.ascontiguousarray(np.concatenate(images)),
        labels=np.asarray(labels, dtype=np.int64),
        classes=classes,
        sample_ids=sample_ids,
        fixed_split=fixed_split,
        files=files,
    )


# --- a tiny set in the official format, for tests --------------------------------------------------------


class _Python2StylePickler(pickle._Pickler):
    """Protocol 2 as Python 2's cPickle wrote the official files: strings as BINSTRING (they load as bytes with
    encoding="bytes") and numpy's `numpy.core.multiarray._reconstruct` spelling, so no `_codecs.encode` calls."""

    # the stubs type the dispatch table as Unpickler's and leave out the pickler's own write and memoize
    dispatch: dict[type, Callable[..., None]] = pickle._Pickler.dispatch.copy()
    write: Callable[[bytes], Any]
    memoize: Callable[[Any], None]

    def _save_binstring(self, obj: Union[bytes, str]) -> None:
        data = obj if isinstance(obj, bytes) else obj.encode("ascii")  # a Python 2 str is bytes
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = _save_binstring
    dispatch[str] = _save_binstring

    def save_global(self, obj: Any, name: Optional[str] = None) -> None:
        if obj is _reconstruct:
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)  # pyright: ignore[reportAttributeAccessIssue]  # missing from the stubs


def _write_python2_pickle(path: Path, obj: Any) -> None:
    with open(path, "wb") as f:
        _Python2StylePickler(f, protocol=2).dump(obj)


def write_fake_cifar10(root: Path, per_batch: int = 10, seed: int = 0, classes: Optional[list[str]] = None) -> None:
    """Write a tiny CIFAR-10 folder in the official format: `per_batch` random images in each of the six
    batches, labels cycling through `classes` (default: the real ten) so every class is in every batch."""
    classes = list(CIFAR10_CLASSES if classes is None else classes)
    if per_batch < len(classes):
        raise ValueError(f"per_batch={per_batch} is less than the {len(classes)} classes; every class must be in every batch")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for number, name in enumerate(BATCH_FILES, start=1):
        batch_label = "testing batch 1 of 1" if name == TEST_BATCH else f"training batch {number} of 5"
        batch = {
            b"batch_label": batch_label.encode("ascii"),
            b"labels": [row % len(classes) for row in range(per_batch)],
            b"data": rng.integers(0, 256, size=(per_batch, ROW_BYTES), dtype=np.uint8),
            b"filenames": [f"fake_{name}_{row:05d}.png".encode("ascii") for row in range(per_batch)],
        }
        _write_python2_pickle(root / name, batch)
    meta = {
        b"label_names": [name.encode("utf-8") for name in classes],
        b"num_cases_per_batch": per_batch,
        b"num_vis": ROW_BYTES,
    }
    _write_python2_pickle(root / META_FILE, meta)
