"""The data stage: read a source, hash every sample, split, and store an immutable data version.

Entry point: `veritrain.data.prepare.run(...)`; training reads the stored version through
`veritrain.data.prepare.load_version(...)`. The stage's parts: `identity` (the version id, opening a stored
version), `table` (the sample table), `grouping` (duplicates, groups, the split and its checks), `store` (writing
`.veritrain/data/<id>/`), over `sources`, `validate`, `dedup`, `split`, `label_issues` and `report`.
"""

import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from veritrain.data.for_scripts import Data


class _CallableData(types.ModuleType):
    """`veritrain.data(config)` (docs/api.md) is a call of this package: the public API names the data stage by its
    own name, so the package itself is callable (veritrain.data.for_scripts.data does the work)."""

    def __call__(self, config: Union[str, Path, Mapping[str, Any], None] = None, workdir: Union[str, Path] = ".") -> "Data":
        from veritrain.data.for_scripts import data

        return data(config, workdir)


sys.modules[__name__].__class__ = _CallableData
