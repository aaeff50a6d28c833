"""Data sources: each turns raw data (never modified) into arrays with one content hash per sample.

A source is a function `(DataConfig, data_root) -> SourceData` registered under the name used in
`data.source`. Inputs are stored as arrays training can read without decoding again; for images that
is uint8 N×H×W×C.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from veritrain.errors import UserError


@dataclass
class SourceData:
    sample_ids: list[str]  # `<batch>#<index>` for array sources, relpath for files
    inputs: np.ndarray  # N × ...; images: uint8 N×H×W×C
    targets: np.ndarray  # N; class indices (int64) for classification
    classes: Optional[list[str]]  # class names in target-index order; None for non-class targets
    content_hashes: list[str]  # SHA-256 per sample (see `array_sample_hashes`)
    sizes: list[int]  # bytes per sample as stored
    preprocessing: dict[str, Any]  # everything that shaped `inputs` from the raw data (part of the version)
    origin: dict[str, Any] = field(default_factory=dict)  # where it came from, for the report (not hashed)

    def label_names(self) -> list[str]:
        if self.classes is not None:
            return [self.classes[int(t)] for t in self.targets]
        return [repr(float(t)) for t in self.targets]


def array_sample_hashes(inputs: np.ndarray) -> list[str]:
    """SHA-256 of each sample's bytes in C order (dtype and shape are recorded in the version)."""
    flat = np.ascontiguousarray(inputs).reshape(len(inputs), -1)
    return [hashlib.sha256(row.tobytes()).hexdigest() for row in flat]


def load_digits_source(cfg: Any, data_root: Optional[Path]) -> SourceData:
    """scikit-learn's bundled digits: 1,797 8×8 grey images of 10 classes, no download.

    Pixel values 0–16 are stored as uint8 `round(v * 255 / 16)`, so a PNG written from the stored
    array decodes back to exactly what training saw.
    """
    import sklearn
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[..., np.newaxis]  # N×8×8×1
    targets = bunch.target.astype(np.int64)
    return SourceData(
        sample_ids=[f"digits#{i:05d}" for i in range(len(images))],
        inputs=images,
        targets=targets,
        classes=[str(int(name)) for name in bunch.target_names],
        content_hashes=array_sample_hashes(images),
        sizes=[images[0].nbytes] * len(images),
        preprocessing={"source": "digits", "pixel_scale": "round(v * 255 / 16)", "dtype": "uint8", "layout": "NHWC"},
        origin={"provider": "scikit-learn load_digits (UCI optical recognition of handwritten digits, test part)", "scikit_learn": sklearn.__version__},
    )


SourceLoader = Callable[[Any, Optional[Path]], SourceData]

SOURCES: dict[str, SourceLoader] = {"digits": load_digits_source}


def register_source(name: str, loader: SourceLoader) -> None:
    """Make `data.source: <name>` available (used by tasks and tests that bring their own data)."""
    SOURCES[name] = loader


def load_source(cfg: Any, data_root: Optional[Path]) -> SourceData:
    try:
        loader = SOURCES[cfg.source]
    except KeyError:  # validated in config; kept for callers that build configs by hand
        raise UserError(f"data.source: unknown source {cfg.source!r}; use one of {', '.join(sorted(SOURCES))}") from None
    return loader(cfg, data_root)
