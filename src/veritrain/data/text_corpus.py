"""The text corpus veritrain ships: a snapshot of CPython 3.11.7's `pydoc_data.topics`, the 79 help topics of the
Python documentation (about 466 KB of English text; Python Software Foundation License Version 2), stored in the
package as xz-compressed JSON ({topic: text}, keys sorted) with the SHA-256 of its uncompressed bytes. Every
machine reads these bytes, never the running interpreter's own copy, which changes between Python versions."""

from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path

from veritrain.core.errors import RunFailed

CORPUS_FILE = Path(__file__).parent / "corpora" / "pydoc_topics-cpython-3.11.7.json.xz"
CORPUS_SHA256 = "5995015bae077ec02e49b859f8fcf314bad467cda7183f64bc3463adfdf7ad54"  # of the uncompressed JSON
CORPUS_NAME = "pydoc-topics"
CARD = {  # the data card's keys (data.card), filling those the config leaves empty
    "origin": "CPython 3.11.7, Lib/pydoc_data/topics.py: the help topics of the Python documentation (79 topics of English "
              "reference text), generated from the documentation sources",
    "license": "Python Software Foundation License Version 2 (PSF-2.0); documentation © Python Software Foundation",
    "collection": "the topics dict as CPython 3.11.7 ships it, serialized as JSON with sorted keys; each topic a document",
    "limitations": "reference prose and code examples about Python only; a small corpus (about 466 KB)",
}


def corpus_bytes() -> bytes:
    """The uncompressed JSON, checked against its SHA-256 (RunFailed when the package's copy is damaged)."""
    data = lzma.decompress(CORPUS_FILE.read_bytes())
    if hashlib.sha256(data).hexdigest() != CORPUS_SHA256:
        raise RunFailed(f"{CORPUS_FILE}: the embedded corpus does not match its recorded SHA-256; reinstall veritrain")
    return data


def embedded_topics() -> dict[str, str]:
    """{topic: text}, sorted by topic."""
    return dict(sorted(json.loads(corpus_bytes().decode("utf-8")).items()))
