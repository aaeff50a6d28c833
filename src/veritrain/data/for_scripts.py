"""`veritrain.data(config)` (this package called, veritrain.data): a veritrain data version for a script's own loop. The data stage validates, dedups and
splits the data as for `veritrain run` (docs/data.md), and the script gets the arrays and the fixed splits; given to
`veritrain.start(inputs=[data])`, the version is bound to the run by id, as a run of veritrain's loop binds it,
and `veritrain verify` checks the stored version and the raw data it came from.

    data = vt.data("configs/digits.yaml")           # or {"source": "folder", "root": "data/images"}, or None: digits
    x, y = data.inputs, data.targets                 # read-only arrays, one row per sample
    train_rows = data.splits["train"]                # row indices; also "val" and "test"
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from veritrain.core.config import load_config
from veritrain.core.errors import ConfigError, UserError
from veritrain.data import prepare
from veritrain.data.identity import DataVersion, data_summary
from veritrain.data.shards import FieldArray
from veritrain.records.workspace import Workspace


@dataclass(frozen=True)
class Data:
    """A prepared data version (veritrain.data.identity.DataVersion) and what a run records of it."""

    version: str  # the data version id (SHA-256 of every sample's content, label and split, and the recipe)
    path: Path  # .veritrain/data/<version>/
    inputs: np.ndarray
    targets: np.ndarray
    splits: dict[str, np.ndarray]  # split → row indices into inputs and targets
    classes: Optional[list[str]]
    summary: dict[str, Any] = field(repr=False)  # the record's `data` section (docs/record.md)
    config: dict[str, Any] = field(repr=False)  # the data section it was prepared with
    recorded_paths: dict[str, str] = field(repr=False)  # its data paths as a record keeps them

    @property
    def counts(self) -> dict[str, int]:
        return {name: int(len(rows)) for name, rows in self.splits.items()}


def data(config: Union[str, Path, Mapping[str, Any], None] = None, workdir: Union[str, Path] = ".") -> Data:
    """Prepare (or reuse) the data version of `config`: a veritrain YAML config file (its `data` section), a mapping
    of the `data` section's keys (paths relative to the working directory), or None for the built-in default."""

    if config is None or isinstance(config, (str, Path)):
        resolved = load_config(config)
    elif isinstance(config, Mapping):
        try:
            resolved = load_config(None, [f"data={json.dumps(dict(config))}"])
        except ConfigError as err:
            raise UserError(f"vt.data: {err.key}: {err.problem}" if err.key else f"vt.data: {err.problem}") from None
        except (TypeError, ValueError) as err:
            raise UserError(f"vt.data: the data section holds a value JSON cannot hold ({err})") from None
    else:
        raise UserError(f"vt.data: a {type(config).__name__} is not a data config; give a YAML config's path, a dict of data keys or None")
    workspace = Workspace.open(workdir)
    version: DataVersion = prepare.run(resolved.config.data, resolved.data_paths, workspace.state_dir)
    inputs = version.inputs.whole() if isinstance(version.inputs, FieldArray) else version.inputs  # an array when it fits in memory
    return Data(version=version.version, path=version.path, inputs=inputs, targets=version.targets, splits=version.splits,
                classes=version.classes, summary=data_summary(version), config=resolved.config.data.model_dump(mode="json"),
                recorded_paths=resolved.recorded_data_paths())
