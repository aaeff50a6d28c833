"""The model card of an export: `export/README.md`, the page a Hugging Face model repository shows. YAML front matter
the Hub reads (license, library, task, tags, datasets and the test metrics as `model-index`), then what the model is,
where it came from (run, data version, final state hash, signing key) and the exact commands that check the files,
the run and the signature.

    model_card(record, description, key_fingerprint)   # record.json's content, model.json's, the key's fingerprint or None

The card cannot hold the run's seal (`record.sha256`): the seal is the SHA-256 of record.json, and record.json lists
every file of the run with its hash, this card among them, so a card naming the seal would change the hash it names
(and every re-seal by eval, export or gc would make it stale). The card names the run; the seal is published beside
the model and checked with `veritrain verify RUN --expect SEAL`.

Everything the user wrote (the data card, exp_name, the hypothesis, class names) is treated as hostile: in the front
matter it is only ever a YAML scalar on one line, double-quoted with escapes when it is not plainly safe, so it cannot
add keys or end the front matter; in the body it is escaped for Markdown and HTML. The same inputs give the same bytes:
the card holds no date but the record's own `started_at`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from veritrain.core.signing_keys import KEY_NAME, public_path
from veritrain.core.task_registry import spec_of_record

# the one spelling of the signature check; the folder is the export (a downloaded repository), model.sig beside the files
VERIFY_SIGNATURE_COMMAND = "model_signing verify key {folder} --no-ignore-git-paths --signature {folder}/model.sig --public_key {public_key}"  # export_signing.VERIFY_COMMAND
PUBLIC_KEY_FILE = public_path(Path(KEY_NAME)).name  # signing-key.pub.pem: the public half `veritrain keys init` writes
PROVENANCE_FILE = "provenance.intoto.jsonl"
LIBRARY_NAME = "pytorch"  # the framework the weights are for; no modeling library of the Hub's list loads them

# the license identifiers the Hub accepts (hub-docs docs/hub/repositories-licenses.md), with their full names
HUB_LICENSES: dict[str, str] = {
    "apache-2.0": "Apache license 2.0", "mit": "MIT", "openrail": "OpenRAIL license family",
    "bigscience-openrail-m": "BigScience OpenRAIL-M", "creativeml-openrail-m": "CreativeML OpenRAIL-M",
    "bigscience-bloom-rail-1.0": "BigScience BLOOM RAIL 1.0", "bigcode-openrail-m": "BigCode Open RAIL-M v1",
    "afl-3.0": "Academic Free License v3.0", "artistic-2.0": "Artistic license 2.0", "bsl-1.0": "Boost Software License 1.0",
    "bsd": "BSD license family", "bsd-2-clause": "BSD 2-clause Simplified license", "bsd-3-clause": "BSD 3-clause New or Revised license",
    "bsd-3-clause-clear": "BSD 3-clause Clear license", "c-uda": "Computational Use of Data Agreement",
    "cc": "Creative Commons license family", "cc0-1.0": "Creative Commons Zero v1.0 Universal",
    "cc-by-2.0": "Creative Commons Attribution 2.0", "cc-by-2.5": "Creative Commons Attribution 2.5",
    "cc-by-3.0": "Creative Commons Attribution 3.0", "cc-by-4.0": "Creative Commons Attribution 4.0",
    "cc-by-sa-3.0": "Creative Commons Attribution Share Alike 3.0", "cc-by-sa-4.0": "Creative Commons Attribution Share Alike 4.0",
    "cc-by-nc-2.0": "Creative Commons Attribution Non Commercial 2.0", "cc-by-nc-3.0": "Creative Commons Attribution Non Commercial 3.0",
    "cc-by-nc-4.0": "Creative Commons Attribution Non Commercial 4.0", "cc-by-nd-4.0": "Creative Commons Attribution No Derivatives 4.0",
    "cc-by-nc-nd-3.0": "Creative Commons Attribution Non Commercial No Derivatives 3.0",
    "cc-by-nc-nd-4.0": "Creative Commons Attribution Non Commercial No Derivatives 4.0",
    "cc-by-nc-sa-2.0": "Creative Commons Attribution Non Commercial Share Alike 2.0",
    "cc-by-nc-sa-3.0": "Creative Commons Attribution Non Commercial Share Alike 3.0",
    "cc-by-nc-sa-4.0": "Creative Commons Attribution Non Commercial Share Alike 4.0",
    "cdla-sharing-1.0": "Community Data License Agreement Sharing Version 1.0",
    "cdla-permissive-1.0": "Community Data License Agreement Permissive Version 1.0",
    "cdla-permissive-2.0": "Community Data License Agreement Permissive Version 2.0",
    "wtfpl": "Do What The F*ck You Want To Public License", "ecl-2.0": "Educational Community License v2.0",
    "epl-1.0": "Eclipse Public License 1.0", "epl-2.0": "Eclipse Public License 2.0", "etalab-2.0": "Etalab Open License 2.0",
    "eupl-1.1": "European Union Public License 1.1", "eupl-1.2": "European Union Public License 1.2",
    "agpl-3.0": "GNU Affero General Public License v3.0", "gfdl": "GNU Free Documentation License family",
    "gpl": "GNU General Public License family", "gpl-2.0": "GNU General Public License v2.0", "gpl-3.0": "GNU General Public License v3.0",
    "lgpl": "GNU Lesser General Public License family", "lgpl-2.1": "GNU Lesser General Public License v2.1",
    "lgpl-3.0": "GNU Lesser General Public License v3.0", "isc": "ISC", "lppl-1.3c": "LaTeX Project Public License v1.3c",
    "ms-pl": "Microsoft Public License", "mpl-2.0": "Mozilla Public License 2.0", "odc-by": "Open Data Commons License Attribution family",
    "odbl": "Open Database License family", "openrail++": "Open Rail++-M License", "osl-3.0": "Open Software License 3.0",
    "postgresql": "PostgreSQL License", "ofl-1.1": "SIL Open Font License 1.1", "ncsa": "University of Illinois/NCSA Open Source License",
    "unlicense": "The Unlicense", "zlib": "zLib License", "pddl": "Open Data Commons Public Domain Dedication and License",
    "lgpl-lr": "Lesser General Public License For Linguistic Resources", "deepfloyd-if-license": "DeepFloyd IF Research License Agreement",
    "llama2": "Llama 2 Community License Agreement", "gemma": "Gemma Terms of Use", "unknown": "Unknown", "other": "Other",
}
# SPDX spellings of the Hub's licenses that its list writes otherwise (a version where the Hub names the family)
_SPDX_SPELLINGS = {"cc0": "cc0-1.0", "odbl-1.0": "odbl", "odc-by-1.0": "odc-by", "pddl-1.0": "pddl", "gfdl-1.1": "gfdl",
                   "gfdl-1.2": "gfdl", "gfdl-1.3": "gfdl", "bsd-2-clause-simplified": "bsd-2-clause", "bsd-3-clause-new": "bsd-3-clause"}
_LICENSE_FILLER = {"license", "the", "version", "international"}  # words a license's name may carry or leave out

# The Hub's task (huggingface.js pipelines) and the test metrics a card reports come from the run's task declaration
# (its TaskSpec: `card`, and each metric's label, hub_type and hub_args).
FORMAT_TAGS = {"onnx": "onnx", "safetensors": "safetensors", "torchscript": "torchscript", "torch_export": "torch-export"}

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._+/-]{0,199}")  # text YAML may write unquoted (if it does not read as a number, bool...)
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CODE_SAFE = re.compile(r"[A-Za-z0-9._/:+-]+")  # text shown as `code` unchanged
_HIDDEN = ("Cc", "Cf", "Cs", "Co", "Cn")  # Unicode categories that do not show: controls, format (bidi), surrogates, private, unassigned
_MARKDOWN_SPECIAL = set("\\`*_[]|~!#{}$")  # escaped by a backslash in running text; & < > become entities


def model_card(record: Mapping[str, Any], description: Mapping[str, Any], key_fingerprint: Optional[str]) -> str:
    """The text of export/README.md for the run `record` (record.json's content as it is when exporting) and its
    export `description` (model.json's content), signed by the key with `key_fingerprint` (hex SHA-256 of its public
    key), or None for an unsigned export. Raises ValueError when the run id or an exported file's name or hash is not
    one a command can carry safely."""
    run_id = str(record.get("run_id") or "")
    if not _FILE_NAME.fullmatch(run_id):
        raise ValueError(f"model card: run_id {run_id!r} is not a run id")
    files = _hashed_files(description)
    metadata = card_metadata(record, description)
    return f"---\n{_yaml(metadata)}---\n\n{_body(record, description, key_fingerprint, files, metadata)}"


def card_metadata(record: Mapping[str, Any], description: Mapping[str, Any]) -> dict[str, Any]:
    """The front matter: the Hub's model card keys, in the order the Hub's own template writes them."""
    task = str(record.get("task") or description.get("task") or "")
    data = _mapping(record.get("data"))
    card = _mapping(data.get("card"))
    metadata: dict[str, Any] = hub_license(card.get("license"))
    metadata["library_name"] = LIBRARY_NAME
    said = _card_text(record, description)
    hub_task = (said.pipeline_tag, said.hub_name or said.pipeline_tag) if said is not None and said.pipeline_tag else None
    if hub_task:
        metadata["pipeline_tag"] = hub_task[0]
    formats = [FORMAT_TAGS[name] for name in FORMAT_TAGS if name in _mapping(description.get("files"))]
    task_tag = hub_task[0] if hub_task else _slug(task, "task")
    metadata["tags"] = list(dict.fromkeys(["veritrain", task_tag, LIBRARY_NAME, *formats]))
    dataset = _dataset_id(data)
    metadata["datasets"] = [dataset]
    results = _model_index_metrics(record, description, _mapping(_mapping(record.get("metrics")).get("test")))
    if hub_task and results:
        version = str(data.get("version") or description.get("data_version") or "")
        dataset_entry: dict[str, Any] = {"name": _dataset_name(data, version), "type": dataset, "split": "test"}
        if version:
            dataset_entry["revision"] = version
        metadata["model-index"] = [{
            "name": str(record.get("exp_name") or record.get("run_id")),
            "results": [{"task": {"type": hub_task[0], "name": hub_task[1]}, "dataset": dataset_entry, "metrics": results}],
        }]
    return metadata


def hub_license(text: Any) -> dict[str, str]:
    """The data card's license as the Hub's metadata: `license` one of HUB_LICENSES when the text names one (as its
    identifier, its SPDX id or its full name, alone or followed by a remark in parentheses, as in "CC BY 4.0 (UCI
    Machine Learning Repository)"), else `license: other` with `license_name` (an id made from the text: the SPDX-like
    id it gives in parentheses, or the text as a slug) and `license_link` (the first http(s) URL in the text, if any).
    No license at all is `unknown`."""
    if not isinstance(text, str) or not text.strip():
        return {"license": "unknown"}
    known = _known_license(text)
    if known:
        return {"license": known}
    found: dict[str, str] = {"license": "other", "license_name": _license_name(text)}
    url = re.search(r"https?://[A-Za-z0-9._~:/?#@!$&*+,;=%-]+", text)
    if url:
        found["license_link"] = url.group(0).rstrip(".,;:!?")
    return found


def _known_license(text: str) -> Optional[str]:
    aliases = _license_aliases()
    candidate = text.strip()
    while True:
        key = _license_key(candidate)
        if key in aliases:
            return aliases[key]
        shorter = re.sub(r"\s*\([^()]*\)\s*$", "", candidate)  # one trailing remark in parentheses less
        if shorter == candidate or not shorter:
            return None
        candidate = shorter


def _license_key(text: str) -> str:
    """A license's name reduced to its words: lowercase, no filler words, `v2.0` as `2.0`, SPDX's -only/-or-later dropped."""
    folded = text.casefold().replace("licence", "license").replace("++", "plusplus")
    words = [w for w in re.findall(r"[a-z0-9]+(?:\.[a-z0-9]+)*", folded) if w not in _LICENSE_FILLER]
    key = "-".join(w[1:] if re.fullmatch(r"v\d+(?:\.\d+)*", w) else w for w in words)
    return re.sub(r"-(?:only|or-later)$", "", key)


def _license_aliases() -> dict[str, str]:
    aliases: dict[str, str] = {}
    for identifier, name in HUB_LICENSES.items():
        aliases.setdefault(_license_key(identifier), identifier)
        aliases.setdefault(_license_key(name), identifier)
    for spelling, identifier in _SPDX_SPELLINGS.items():
        aliases.setdefault(_license_key(spelling), identifier)
    return aliases


def _license_name(text: str) -> str:
    spdx = re.search(r"\(([A-Za-z][A-Za-z0-9.+]*(?:-[A-Za-z0-9.+]+)*-[0-9][A-Za-z0-9.+-]*)\)", text)
    return _slug(spdx.group(1) if spdx else re.sub(r"https?://\S+", "", text), "data-license")


def _slug(text: str, empty: str) -> str:
    """Lowercase ASCII letters, digits, dots and single dashes, at most 64 characters; `empty` when none are left."""
    slug = re.sub(r"[^a-z0-9.]+", "-", text.casefold()).strip("-.")[:64].strip("-.")
    return slug or empty


def _dataset_id(data: Mapping[str, Any]) -> str:
    card = _mapping(data.get("card"))
    for value in (card.get("name"), data.get("source")):
        if isinstance(value, str) and value.strip():
            return value
    return f"veritrain-data-{str(data.get('version') or '')[:12]}".rstrip("-")


def _dataset_name(data: Mapping[str, Any], version: str) -> str:
    return f"{_dataset_id(data)} (veritrain data version {version[:12]})" if version else _dataset_id(data)


def _spec(record: Mapping[str, Any], description: Mapping[str, Any]) -> Any:
    """The TaskSpec of the run's task (veritrain.core.task_spec): the installed one, else the record's own; None when
    neither is known (the card then reports no metric and says the task's name)."""

    task = record.get("task") or description.get("task")
    return spec_of_record({"config": {"task": task}}) or spec_of_record(dict(record))


def _card_text(record: Mapping[str, Any], description: Mapping[str, Any]) -> Any:
    spec = _spec(record, description)
    return getattr(spec, "card", None)


def _test_rows(record: Mapping[str, Any], description: Mapping[str, Any], test: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """(declared metric, its test value) for each metric the task declares that the test split has a number for."""
    spec = _spec(record, description)
    rows = [(metric, metric.value(dict(test))) for metric in (spec.metrics if spec is not None else ())]
    return [(metric, value) for metric, value in rows if _is_number(value)]


def _model_index_metrics(record: Mapping[str, Any], description: Mapping[str, Any], test: Mapping[str, Any]) -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    for declared, value in _test_rows(record, description, test):
        metric: dict[str, Any] = {"type": declared.hub_type or declared.name, "value": value, "name": f"Test {declared.shown}"}
        if declared.hub_args:
            metric["args"] = dict(declared.hub_args)
        metrics.append(metric)
    return metrics


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _hashed_files(description: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(file, what it is, SHA-256) of every exported file model.json gives a hash for: the formats, then a tokenizer."""
    listed: list[tuple[str, str, str]] = []
    for name, entry in _mapping(description.get("files")).items():
        entry = _mapping(entry)
        listed.append((str(entry.get("file")), str(name), str(entry.get("sha256"))))
    tokenizer = _mapping(_mapping(description.get("preprocessing")).get("tokenizer"))
    if tokenizer.get("file"):
        listed.append((str(tokenizer["file"]), "tokenizer", str(tokenizer.get("sha256"))))
    for file, what, sha256 in listed:
        if not _FILE_NAME.fullmatch(file) or not _SHA256.fullmatch(sha256):
            raise ValueError(f"model card: model.json lists {what} as {file!r} with SHA-256 {sha256!r}; "
                             "expected a plain file name and 64 hex digits")
    return listed


# ---------------------------------------------------------------- YAML


class _CardDumper(yaml.SafeDumper):
    """Block mappings, no anchors or aliases, and every string that is not plainly safe double-quoted: its line
    breaks, quotes, colons, control and separator characters all escaped, so that it stays one scalar on one line."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def process_scalar(self) -> None:
        # a scalar holding characters that do not show (bidi overrides, surrogates...) is written all in \u escapes,
        # so that what the YAML shows is what it holds; others keep their letters (allow_unicode)
        value = getattr(self.event, "value", "")
        hidden = any(unicodedata.category(ch) in _HIDDEN for ch in value)
        allow_unicode = self.allow_unicode
        self.allow_unicode = allow_unicode and not hidden
        try:
            super().process_scalar()
        finally:
            self.allow_unicode = allow_unicode


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = None if _PLAIN.fullmatch(text) and not text.endswith(" ") else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_CardDumper.add_representer(str, _represent_str)


def _yaml(data: Mapping[str, Any]) -> str:
    # a width no scalar reaches: PyYAML folds long scalars at spaces otherwise, and a folded line could start with ---
    return yaml.dump(dict(data), Dumper=_CardDumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=1 << 30, line_break="\n")


# ---------------------------------------------------------------- Markdown


def _body(record: Mapping[str, Any], description: Mapping[str, Any], key_fingerprint: Optional[str],
          files: list[tuple[str, str, str]], metadata: Mapping[str, Any]) -> str:
    run_id = str(record["run_id"])
    task = str(record.get("task") or description.get("task") or "")
    title = _inline(record.get("exp_name")) if record.get("exp_name") else f"veritrain run {run_id}"
    parts = [f"# {title}\n\n{_what_it_is(record, task, description)}\n",
             _run_section(record, description, key_fingerprint),
             _metrics_section(record, description),
             _data_section(record, description, metadata),
             _files_section(files),
             _checks_section(run_id, files, key_fingerprint)]
    return "\n".join(parts)


def _what_it_is(record: Mapping[str, Any], task: str, description: Mapping[str, Any]) -> str:
    architecture = _mapping(description.get("architecture"))
    model = _code(description.get("model") or architecture.get("name") or "a user model")
    parameters = architecture.get("parameters")
    size = f", {parameters:,} parameters" if _is_number(parameters) else ""
    said = _card_text(record, description)
    preprocessing = _mapping(description.get("preprocessing"))
    tokenizer = _mapping(preprocessing.get("tokenizer"))
    classes = description.get("classes")
    shape = _mapping(description.get("input")).get("shape")
    fills = {"input": f" of shape `{_shape(shape)}`" if isinstance(shape, list) else "",
             "classes": f" over {len(classes)} classes" if isinstance(classes, list) else ""}
    what = said.what if said is not None else f"A model for the task {_code(task)}"
    gives = said.gives.format(**fills) if said is not None else "it takes float32 input{input} and gives logits{classes}".format(**fills)
    if tokenizer or "tokenizer" in preprocessing:
        context = preprocessing.get("context")
        vocabulary = f"a {_inline(tokenizer.get('kind'))} tokenizer of {tokenizer.get('vocab_size')} tokens (`tokenizer.json`)" if tokenizer else "its tokenizer"
        window = f", a context of {context} tokens" if _is_number(context) else ""
        gives = f"{gives}; {vocabulary}{window}"
    return f"{what} ({model}{size}) trained and exported by veritrain: {gives}."


def _run_section(record: Mapping[str, Any], description: Mapping[str, Any], key_fingerprint: Optional[str]) -> str:
    data = _mapping(record.get("data"))
    rows = [("run", _code(record["run_id"])), ("started", _inline(record.get("started_at") or "-"))]
    if record.get("exp_name"):
        rows.append(("experiment", _inline(record["exp_name"])))
    if record.get("hypothesis"):
        rows.append(("hypothesis", _inline(record["hypothesis"])))
    rows.append(("data version", _code(data.get("version") or description.get("data_version") or "-")))
    final = record.get("final_state_sha256")
    rows.append(("final state (`final_state_sha256`)", _code(final) if final else "none: this run trained nothing"))
    checkpoint = description.get("checkpoint")
    if checkpoint:
        epoch = description.get("checkpoint_epoch")
        at = f", epoch {epoch}" if _is_number(epoch) else ""
        rows.append(("exported checkpoint", f"{_code(checkpoint)}{at}, state {_code(description.get('checkpoint_state_sha256') or '-')}"))
    if record.get("config_hash") or description.get("config_hash"):
        rows.append(("config hash", _code(record.get("config_hash") or description.get("config_hash"))))
    rows.append(("signing key", f"{_code(key_fingerprint)} (SHA-256 of the public key, `veritrain keys show`)"
                 if key_fingerprint else "unsigned: no signing key was set"))
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"## Where it comes from\n\n| | |\n|---|---|\n{table}\n"


def _metrics_section(record: Mapping[str, Any], description: Mapping[str, Any]) -> str:
    test = _mapping(_mapping(record.get("metrics")).get("test"))
    rows = [(f"Test {declared.shown}", value) for declared, value in _test_rows(record, description, test)]
    if not rows:
        return "## Test metrics\n\nThe run's record holds no test metrics.\n"
    table = "\n".join(f"| {name} | {_number(value)} |" for name, value in rows)
    counted = [f"{test[key]:,} {unit}" for key, unit in (("samples", "samples"), ("bytes", "bytes"), ("tokens", "tokens"))
               if _is_number(test.get(key))]
    version = str(test.get("data_version") or description.get("data_version") or "")
    on = f" of data version {_code(version[:12])}" if version else ""
    size = f" ({', '.join(counted)})" if counted else ""
    entry = _mapping(test.get("trajectory_entry"))
    source = (f", from {_code(test.get('checkpoint') or '-')} (trajectory entry {entry.get('index')}, step {entry.get('step')})"
              if entry else "")
    return (f"## Test metrics\n\nOn the test split{on}{size}{source}; the exact values are in the metadata above and in "
            f"the run's `eval/test/metrics.json`.\n\n| metric | value |\n|---|---|\n{table}\n")


def _data_section(record: Mapping[str, Any], description: Mapping[str, Any], metadata: Mapping[str, Any]) -> str:
    data = _mapping(record.get("data"))
    card = _mapping(data.get("card"))
    lines = [f"- source: {_inline(data.get('source') or '-')}"]
    counts = _mapping(data.get("counts"))
    if counts:
        order = [s for s in ("train", "val", "test") if s in counts] + sorted(s for s in counts if s not in ("train", "val", "test"))
        lines.append("- samples: " + ", ".join(f"{_inline(split)} {_inline(counts[split])}" for split in order))
    license_meta = f"`{metadata['license']}`" + (f" ({_code(metadata['license_name'])})" if "license_name" in metadata else "")
    for key in ("name", "origin", "license", "collection", "limitations", "contact"):
        if card.get(key):
            shown = f"{_inline(card[key])} (metadata: {license_meta})" if key == "license" else _inline(card[key])
            lines.append(f"- {key}: {shown}")
    if not card.get("license"):
        lines.append(f"- license: not given in the data card (metadata: {license_meta})")
    classes = description.get("classes")
    if isinstance(classes, list) and classes:
        shown = ", ".join(_inline(c) for c in classes[:20])
        more = f", … and {len(classes) - 20} more (`model.json` `classes`, in output order)" if len(classes) > 20 else " (in output order)"
        lines.append(f"- classes: {shown}{more}")
    citation = f"\n\nCite the data as:\n\n{_code_block(str(card['citation']))}" if card.get("citation") else ""
    return "## Data\n\n" + "\n".join(lines) + citation + "\n"


def _files_section(files: list[tuple[str, str, str]]) -> str:
    rows = "\n".join(f"| `{file}` | {what} | `{sha256}` |" for file, what, sha256 in files)
    return ("## Files\n\n`model.json` describes the inputs, the preprocessing, the classes and the architecture; the ONNX "
            f"and safetensors files also carry its essentials in their own metadata.\n\n| file | format | SHA-256 |\n|---|---|---|\n{rows}\n")


def _checks_section(run_id: str, files: list[tuple[str, str, str]], key_fingerprint: Optional[str]) -> str:
    sums = "".join(f"{sha256}  {file}\n" for file, _, sha256 in files)
    if key_fingerprint:
        command = VERIFY_SIGNATURE_COMMAND.format(folder=".", public_key=PUBLIC_KEY_FILE)
        signature = (f"the files are signed (`model.sig`) by the key with fingerprint `{_code_text(key_fingerprint)}`. With its public "
                     f"key (`veritrain keys show` prints it; `{PUBLIC_KEY_FILE}` beside the private key), in this folder:\n\n"
                     f"```sh\n{command}\n```\n")
    else:
        signature = "unsigned: no signing key was set, so there is no `model.sig` to check.\n"
    return (
        "## Check it\n\n"
        f"The files against the hashes above, in this folder:\n\n```sh\nsha256sum -c <<'EOF'\n{sums}EOF\n```\n\n"
        "The run: in the workspace that holds it (or after `veritrain import` of its archive), re-hash every file of the run, "
        "this card included, and the trajectory of its training states:\n\n"
        f"```sh\nveritrain verify {run_id}\n```\n\n"
        "This card cannot hold the run's seal (`record.sha256`): the seal covers every file of the run, this one too. Take "
        f"the seal from where the model was published and add `--expect SEAL` to check that the run is the one published.\n\n"
        f"The signature: {signature}\n"
        f"The provenance: `{PROVENANCE_FILE}` is an in-toto statement of what made these files; veritrain's "
        "`docs/provenance.md` shows how to verify it with standard tools.\n"
    )


def _inline(value: Any) -> str:
    """User text as one line of Markdown that shows it literally: line breaks as spaces, invisible and control
    characters as visible escapes, Markdown punctuation backslash-escaped, & < > as HTML entities."""
    out: list[str] = []
    for ch in _visible(str(value), keep="").replace("\r\n", " "):
        if ch in "\n\r\t\v\f\x1c\x1d\x1e\x85\u2028\u2029":
            out.append(" ")
        elif ch in "&<>":
            out.append({"&": "&amp;", "<": "&lt;", ">": "&gt;"}[ch])
        elif ch in _MARKDOWN_SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _visible(text: str, keep: str) -> str:
    """Characters that would not show (controls but line breaks and those in `keep`, format characters such as bidi
    overrides, surrogates, private and unassigned code points) written as \\uXXXX."""
    line_breaks = "\n\r\t\v\f\x1c\x1d\x1e\x85\u2028\u2029"
    return "".join(ch if ch in line_breaks or ch in keep or unicodedata.category(ch) not in _HIDDEN
                   else f"\\u{ord(ch):04x}" for ch in text)


def _code(value: Any) -> str:
    text = str(value)
    return f"`{text}`" if _CODE_SAFE.fullmatch(text) else _inline(text)


def _code_text(value: Any) -> str:
    text = str(value)
    return text if _CODE_SAFE.fullmatch(text) else "?"


def _code_block(text: str) -> str:
    """`text` verbatim in a fenced block whose fence no run of backticks in it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    lines = _visible(text, keep="\t").replace("\r\n", "\n")
    lines = re.sub(r"[\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]", "\n", lines)
    return f"{fence}text\n{lines.rstrip(chr(10))}\n{fence}"


def _shape(shape: list[Any]) -> str:
    return "[" + ", ".join("batch" if i == 0 and d is None else "dynamic" if d is None else str(d) for i, d in enumerate(shape)) + "]"


def _number(value: float) -> str:
    return f"{value:.6g}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
