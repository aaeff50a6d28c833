"""Data sources: each lists the raw data (never modified, only opened for reading).

A source is a function `(DataConfig, paths) -> SourceData | FileListing` registered under the name
used in `data.source`; `paths` holds the absolute data paths of the config (`root`, `csv`, ...).
Array sources (`digits`, `cifar10`) return decoded arrays with one content hash per sample and ids
`<batch>#<index>`; file sources (`imagefolder`, `csv`, `labelmap`) return the files with their
labels, and the data stage hashes, decodes and validates them. Inputs end up as arrays training can
read without decoding again; for images that is uint8 N×H×W×C.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import json
import os
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

import numpy as np

from veritrain.core import source_registry
from veritrain.core.errors import RunFailed, UserError
from veritrain.data import cifar10
from veritrain.data.cifar10 import load_cifar10
from veritrain.data.columns import Codes, Names
from veritrain.data.split import SPLITS

if TYPE_CHECKING:
    from veritrain.core.config import DataConfig


@dataclass
class SourceData:
    sample_ids: list[str]  # `<batch>#<index>` for array sources, relpath for files
    inputs: np.ndarray  # N × ...; images: uint8 N×H×W×C
    targets: np.ndarray  # N; class indices (int64) for classification
    classes: Optional[list[str]]  # class names in target-index order; None for non-class targets
    content_hashes: list[str]  # BLAKE3 per sample (see `array_sample_hashes`)
    sizes: list[int]  # bytes per sample as stored
    preprocessing: dict[str, Any]  # everything that shaped `inputs` from the raw data (part of the version)
    origin: dict[str, Any] = field(default_factory=dict)  # where it came from, for the report (not hashed)
    fixed_split: Optional[list[Optional[str]]] = None  # an official split per sample (e.g. CIFAR's test batch)
    card: dict[str, str] = field(default_factory=dict)  # what the source knows of its provenance; data.card overrides

    def label_names(self) -> list[str]:
        if self.classes is not None:
            return [self.classes[int(t)] for t in self.targets]
        return [repr(float(t)) for t in self.targets]


@dataclass(slots=True)  # a million of them while a folder is listed: no per-object dict
class FileSample:
    sample_id: str  # the path relative to data.root, with `/` separators
    path: str  # absolute (text, not Path: listing a million files should not build a million Paths)
    label: Optional[str]  # None: no label found (a `missing_label` finding)
    group: Optional[str] = None  # samples of one group stay in one split
    fixed_split: Optional[str] = None  # train | val | test when given by the data
    timestamp: Optional[str] = None  # for data.split_by: time (ISO 8601 or any sortable text)
    source_id: Optional[str] = None  # the source's own id (csv `id` column): the split key instead of the content hash
    walked: bool = False  # found by walking data.root, not named by a listing: from data recipe 5 on taken only when an image


@dataclass
class FileListing:
    root: Path
    samples: Union[list[FileSample], WalkedFolder]  # WalkedFolder: columns that read as the list
    classes: Optional[list[str]]  # declared or discovered class names, in target-index order
    preprocessing: dict[str, Any]
    origin: dict[str, Any] = field(default_factory=dict)
    findings: list[tuple[str, list[str], str]] = field(default_factory=list)  # (kind, sample ids, reason) found while listing


Source = Union[SourceData, FileListing]


def array_sample_hashes(inputs: np.ndarray) -> list[str]:
    """BLAKE3 of each sample's bytes in C order (dtype and shape are recorded in the version)."""
    import blake3

    flat = np.ascontiguousarray(inputs).reshape(len(inputs), -1)
    return [blake3.blake3(row.tobytes()).hexdigest() for row in flat]


def _read_digits_csv(path: Path) -> Optional[np.ndarray]:
    """The rows of scikit-learn's digits.csv.gz (64 pixel columns, then the label), or None."""

    try:
        with gzip.open(path, mode="rt", encoding="utf-8") as f:
            return np.loadtxt(f, delimiter=",")
    except (OSError, ValueError):
        return None


def bundled_digits() -> tuple[np.ndarray, np.ndarray, str]:
    """(N×8×8 pixel counts 0–16 as floats, labels, scikit-learn version) of scikit-learn's digits.

    Read from the package's `datasets/data/digits.csv.gz` the way `load_digits()` reads it, without
    importing scikit-learn: that import (scipy with it) takes about 0.7 s, a fifth of a short
    `veritrain train` on digits. A test holds the two equal; `load_digits()` is the fallback when the
    file is not where it has always been or does not read as 65 columns with labels 0–9.
    """

    spec = util.find_spec("sklearn")  # locates the package without running it
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if csv is not None and csv.is_file():
        table = _read_digits_csv(csv)
        # anything but the layout load_digits() reads goes through load_digits() itself
        if table is not None and table.ndim == 2 and table.shape[1] == 65 and np.isin(table[:, -1], np.arange(10)).all():
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int), metadata.version("scikit-learn")
    import sklearn
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target, sklearn.__version__  # pyright: ignore[reportAttributeAccessIssue]  # load_digits() is typed as Bunch or (X, y); without return_X_y it is a Bunch


def load_digits_source(cfg: DataConfig, paths: dict[str, Path]) -> SourceData:
    """scikit-learn's bundled digits: 1,797 8×8 grey images of 10 classes, no download.

    Pixel values 0–16 are stored as uint8 `round(v * 255 / 16)`, so a PNG written from the stored
    array decodes back to exactly what training saw.
    """
    values, labels, sklearn_version = bundled_digits()
    images = np.rint(values * (255.0 / 16.0)).astype(np.uint8)[..., np.newaxis]  # N×8×8×1
    targets = labels.astype(np.int64)
    return SourceData(
        sample_ids=[f"digits#{i:05d}" for i in range(len(images))],
        inputs=images,
        targets=targets,
        classes=[str(k) for k in range(10)],  # load_digits' target_names: 0–9
        content_hashes=array_sample_hashes(images),
        sizes=[images[0].nbytes] * len(images),
        preprocessing={"source": "digits", "pixel_scale": "round(v * 255 / 16)", "dtype": "uint8", "layout": "NHWC"},
        origin={"provider": "scikit-learn load_digits (UCI optical recognition of handwritten digits, test part)", "scikit_learn": sklearn_version},
        card={
            "origin": "UCI Machine Learning Repository, Optical Recognition of Handwritten Digits (Alpaydin & Kaynak, 1998), "
            "test part as bundled with scikit-learn (sklearn.datasets.load_digits)",
            "license": "CC BY 4.0 (UCI Machine Learning Repository)",
            "collection": "32×32 bitmaps of digits written by 43 people, downsampled to 8×8 counts of on-pixels (0–16)",
            "limitations": "tiny grey images of a single script style; 1,797 samples",
        },
    )


def load_cifar10_source(cfg: DataConfig, paths: dict[str, Path]) -> SourceData:
    """CIFAR-10's python batches in data.root; the official test batch is the fixed test split."""

    root = _required(paths, "root", "the folder holding data_batch_1..5, test_batch and batches.meta")
    data = load_cifar10(root)
    return SourceData(
        sample_ids=data.sample_ids,
        inputs=data.images,
        targets=data.labels,
        classes=data.classes,
        content_hashes=array_sample_hashes(data.images),
        sizes=[data.images[0].nbytes] * len(data.images),
        preprocessing={"source": "cifar10", "dtype": "uint8", "layout": "NHWC", "channel_order": "RGB"},
        origin={"provider": "CIFAR-10 python batches", "files_sha256": data.files},
        fixed_split=data.fixed_split,
        card={
            "origin": "CIFAR-10 (Krizhevsky, 2009), https://www.cs.toronto.edu/~kriz/cifar.html",
            "collection": "32×32 colour images from the 80 Million Tiny Images collection, labelled into 10 classes",
        },
    )


# ---------------------------------------------------------------- file sources


def cifar10_files(cfg: DataConfig, paths: dict[str, Path]) -> Optional[dict[str, str]]:
    """The SHA-256s of the files a cifar10 source's samples are made from (its origin's `files_sha256`), None when
    data.root lacks one."""
    return cifar10.file_hashes(paths["root"]) if "root" in paths else None


# data.source → the SHA-256s of the files its samples are made from, read without parsing them: where a source names
# a fixed set of files, a prepare of the same config from the same bytes reuses its version without reading them
# again (veritrain.data.prepare); a source not listed is read and listed every time
FILES_OF: dict[str, Callable[[DataConfig, dict[str, Path]], Optional[dict[str, str]]]] = {"cifar10": cifar10_files}


def _required(paths: dict[str, Path], key: str, what: str) -> Path:
    if key not in paths:
        raise UserError(f"data.{key}: not set; give {what}")
    return paths[key]


def _root(paths: dict[str, Path]) -> Path:
    root = _required(paths, "root", "the folder holding the data files")
    if not root.is_dir():
        raise UserError(f"data.root: {root}: no such folder; point data.root at the data (relative paths start at the config file's folder)")
    return root


def walk_names(root: Path) -> list[str]:
    """The relative path (with `/` separators) of every regular file under `root`, sorted; hidden files and folders
    (`.name`) are skipped."""
    found = []
    base = str(root)
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        prefix = folder[len(base) + 1 :].replace(os.sep, "/")
        found.extend(f"{prefix}/{name}" if prefix else name for name in files if not name.startswith("."))
    found.sort()
    return found


def walk_files(root: Path) -> list[tuple[str, str]]:
    """(relpath, absolute path) of every regular file under `root`, sorted by relpath (`walk_names`)."""
    return [(rel, os.path.join(str(root), *rel.split("/"))) for rel in walk_names(root)]


class WalkedFolder:
    """The files found by walking a folder whose first level names their classes (`imagefolder`), as columns: their
    relative paths, sorted, and the class folder of each. Read as the list of FileSample it stands for (each made as
    it is read); the sample table takes the columns themselves (`table.sample_table`), so a million files listed are
    never a million objects."""

    def __init__(self, root: Path, names: Names):
        self.root, self.names = root, names
        self.labels = Codes(name.split("/", 1)[0] if "/" in name else None for name in names)  # a file in root has no class

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[FileSample]:
        root = str(self.root)
        return (FileSample(name, os.path.join(root, *name.split("/")), label, walked=True) for name, label in zip(self.names, self.labels))


def load_imagefolder_source(cfg: DataConfig, paths: dict[str, Path]) -> FileListing:
    """`root/<class name>/<image files>`, any nesting below the class folder."""
    root = _root(paths)
    listed = WalkedFolder(root, Names(walk_names(root)))
    discovered = sorted(label for label in listed.labels.values)
    return FileListing(root, listed, list(cfg.classes) if cfg.classes else discovered, {"source": "imagefolder"})


def load_csv_source(cfg: DataConfig, paths: dict[str, Path]) -> FileListing:
    """A csv file (data.csv) with columns path,label and optional group, split, timestamp, id (a stable id per
    row that places the sample instead of its content hash, so an edited file keeps its split; empty: the hash)."""
    root = _root(paths)
    csv_path = _required(paths, "csv", "the csv file listing path,label (paths relative to data.root)")
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            columns = set(reader.fieldnames or [])
            rows = list(reader)
    except FileNotFoundError:
        raise UserError(f"data.csv: {csv_path}: file not found; give the csv listing path,label") from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UserError(f"data.csv: {csv_path}: cannot read it ({err}); save it as UTF-8 csv with a header row") from None
    missing = {"path", "label"} - columns
    if missing:
        raise UserError(f"data.csv: {csv_path}: missing column(s) {', '.join(sorted(missing))}; the header needs path,label (optional group, split, timestamp, id)")
    if cfg.split_by == "time" and "timestamp" not in columns:
        raise UserError(f"data.split_by: 'time' needs a timestamp column in {csv_path}; add it or use split_by: random")
    samples: list[FileSample] = []
    seen: dict[str, int] = {}
    id_lines: dict[str, int] = {}  # id → the line that gave it
    label_lines: dict[str, list[int]] = {}  # label → the lines that give it
    findings = []
    for line, row in enumerate(rows, start=2):
        rel = (row.get("path") or "").strip().replace("\\", "/")
        if not rel:
            continue
        if rel.startswith("/") or ".." in rel.split("/"):
            raise RunFailed(f"data.csv: {csv_path}: line {line}: path {rel!r} leaves data.root; give paths relative to data.root")
        if rel in seen:
            findings.append(("duplicate_entry", [rel], f"listed again on line {line} of {csv_path.name}; the first entry (line {seen[rel]}) is used"))
            continue
        seen[rel] = line
        split = (row.get("split") or "").strip().lower() or None
        if split is not None and split not in SPLITS:
            raise RunFailed(f"data.csv: {csv_path}: line {line}: split {split!r}; use train, val, test or leave it empty")
        label = (row.get("label") or "").strip() or None
        if label is not None:
            label_lines.setdefault(label, []).append(line)
        source_id = (row.get("id") or "").strip() or None
        if source_id is not None:
            if source_id in id_lines:
                raise RunFailed(f"data.csv: {csv_path}: line {line}: id {source_id!r} is also on line {id_lines[source_id]}; "
                                "give each row its own id, or leave it empty to place the sample by its content hash")
            id_lines[source_id] = line
        samples.append(FileSample(rel, os.path.join(root, rel), label, (row.get("group") or "").strip() or None, split,
                                  (row.get("timestamp") or "").strip() or None, source_id))
    if cfg.split_by == "time":
        undated = [s.sample_id for s in samples if s.timestamp is None]
        if undated:
            raise RunFailed(f"data.csv: {len(undated)} row(s) without a timestamp (first: {undated[0]}); data.split_by: time needs one on every row")
    if not cfg.classes:  # declared classes quarantine any other label (unknown_label); discovered ones would take a typo as a class
        _refuse_label_typos(label_lines, csv_path)
    discovered = sorted({s.label for s in samples if s.label is not None})
    return FileListing(root, samples, list(cfg.classes) if cfg.classes else discovered, {"source": "csv"}, findings=findings)


TYPO_MAX_ROWS = 2  # a label on this many rows or fewer, beside a look-alike label on
TYPO_RATIO = 10  # at least this many times as many rows, is taken for a typo of it
TYPO_SIMILARITY = 0.6  # difflib's ratio, case ignored: 'dgo' and 'dog' 0.67, 'Dog' and 'dog' 1.0


def _refuse_label_typos(label_lines: dict[str, list[int]], csv_path: Path) -> None:
    """Without data.classes every label in the csv becomes a class, so a mistyped label would be a class of one
    sample, failing the split far from its cause (too_small) or silently training an extra class. Refuse it
    where it is: the file and line (RunFailed, bad data). A rare class of its own is kept by listing data.classes."""

    counts = {label: len(lines) for label, lines in label_lines.items()}
    for label, lines in sorted(label_lines.items(), key=lambda item: item[1][0]):
        if len(lines) > TYPO_MAX_ROWS:
            continue
        common = {other.casefold(): other for other, n in counts.items() if n >= TYPO_RATIO * len(lines)}
        close = difflib.get_close_matches(label.casefold(), list(common), n=1, cutoff=TYPO_SIMILARITY)
        if close:
            other = common[close[0]]
            raise RunFailed(f"data.csv: {csv_path}: line {lines[0]}: label {label!r} is on {len(lines)} row(s), {other!r} on {counts[other]}; "
                            f"a typo of {other!r}? fix it, or list every class in data.classes to keep {label!r} as a class of its own")


def load_labelmap_source(cfg: DataConfig, paths: dict[str, Path]) -> FileListing:
    """Every file under data.root, labelled by a JSON map (data.labels) relpath → label; optional
    split lists in data.split_dir (train.txt, val.txt, test.txt)."""
    root = _root(paths)
    labels_path = _required(paths, "labels", "the JSON file mapping relpath → label")
    try:
        mapping = json.loads(labels_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"data.labels: {labels_path}: file not found; give the JSON map of relpath → label") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"data.labels: {labels_path}: not valid JSON ({err}); it must map relpath → label") from None
    if not isinstance(mapping, dict) or not all(isinstance(v, (str, int)) for v in mapping.values()):
        raise UserError(f"data.labels: {labels_path}: expected a JSON object mapping relpath → label (text or integer)")
    mapping = {str(k).replace("\\", "/"): str(v) for k, v in mapping.items()}
    fixed = _split_lists(paths["split_dir"]) if "split_dir" in paths else {}
    files = walk_files(root)
    present = {rel for rel, _ in files}
    samples = [FileSample(rel, path, mapping.get(rel), None, fixed.get(rel), walked=rel not in mapping) for rel, path in files]
    findings = []
    ghosts = sorted(set(mapping) - present)
    if ghosts:
        findings.append(("unreadable", ghosts, f"labelled in {labels_path.name} but no such file under data.root"))
    discovered = sorted(set(mapping.values()))
    return FileListing(root, samples, list(cfg.classes) if cfg.classes else discovered, {"source": "labelmap"}, findings=findings)


def _split_lists(split_dir: Path) -> dict[str, str]:
    """relpath → split from data.split_dir's train.txt, val.txt, test.txt (one relpath per line; any may be absent)."""
    if not split_dir.is_dir():
        raise UserError(f"data.split_dir: {split_dir}: no such folder; give the folder holding train.txt, val.txt, test.txt (relative paths start at the config file's folder)")
    fixed: dict[str, str] = {}
    found = False
    for split in SPLITS:
        listed = split_dir / f"{split}.txt"
        if not listed.exists():
            continue
        found = True
        try:
            lines = listed.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise UserError(f"data.split_dir: {listed}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8 with one relpath per line") from None
        except OSError as err:
            raise UserError(f"data.split_dir: {listed}: cannot read it ({err.strerror or err}); give a readable file with one relpath per line") from None
        for rel in lines:
            if rel.strip():
                fixed[rel.strip()] = split
    if not found:
        raise UserError(f"data.split_dir: {split_dir}: none of train.txt, val.txt, test.txt in it; add them (one relpath per line) or drop data.split_dir")
    return fixed


SourceLoader = Callable[[Any, dict[str, Path]], Source]
SOURCES = source_registry.SOURCES  # one registry with config validation (veritrain.core.source_registry)

def register_source(name: str, loader: SourceLoader, timestamps: bool = False, fields: Optional[tuple[str, ...]] = None) -> None:
    """Make `data.source: <name>` available (used by tasks and tests that bring their own data);
    `timestamps`: its FileSamples carry a timestamp, so `data.split_by: time` may be used with it; `fields`: what
    its samples give (image, label, tokens, ...), checked against a task's TaskSpec.fields (None: not checked)."""
    SOURCES[name] = loader
    if fields is None:
        source_registry.FIELDS.pop(name, None)
    else:
        source_registry.FIELDS[name] = tuple(fields)
    if timestamps:
        source_registry.TIMESTAMPED_SOURCES.add(name)
    else:
        source_registry.TIMESTAMPED_SOURCES.discard(name)


def load_source(cfg: DataConfig, paths: dict[str, Path]) -> Source:
    try:
        loader = SOURCES[cfg.source]
    except KeyError:  # validated in config; kept for callers that build configs by hand
        raise UserError(f"data.source: unknown source {cfg.source!r}; use one of {', '.join(sorted(SOURCES))}") from None
    return loader(cfg, paths)
