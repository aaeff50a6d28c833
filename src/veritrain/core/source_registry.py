"""The registry of data sources by name: name → loader(data config, paths) → Source (veritrain.data.sources).

A leaf module, so that config validation (`data.source:` must name a registered source, `split_by: time` needs
one with timestamps) and the data stage share one registry without the config importing the stage, as
core.task_registry does for tasks. The built-in loaders are imported when a run first loads one; add a source
with `veritrain.data.sources.register_source`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the config's validation imports this module
    from veritrain.core.config.schema import DataConfig


def _builtin(target: str) -> Callable[..., Any]:
    """A loader that imports its module ("module:function") when it is first called: this registry imports nothing."""

    def loader(cfg: DataConfig, paths: dict[str, Path]) -> Any:
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)(cfg, paths)

    loader.__qualname__ = f"source {target}"
    return loader


SOURCES: dict[str, Callable[..., Any]] = {
    name: _builtin(f"veritrain.data.sources:load_{name}_source") for name in ("digits", "cifar10", "imagefolder", "csv", "labelmap")
}

# text sources (veritrain.data.text_sources): documents for a language model, prepared by veritrain.data.text_prepare
TEXT_SOURCES: set[str] = {"text", "jsonl", "pydoc_topics"}
SOURCES.update({name: _builtin("veritrain.data.text_prepare:load_text_source") for name in sorted(TEXT_SOURCES)})

# the fields each source's samples give (a task's TaskSpec.fields must be among them); a source not listed (one a
# user registers without saying) is not checked
FIELDS: dict[str, tuple[str, ...]] = {**{name: ("image", "label") for name in ("digits", "cifar10", "imagefolder", "csv", "labelmap")},
                                      **{name: ("tokens",) for name in sorted(TEXT_SOURCES)}}

# sources whose samples carry a timestamp: the only ones `data.split_by: time` accepts
TIMESTAMPED_SOURCES: set[str] = {"csv"}
