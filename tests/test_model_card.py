"""The model card of an export (export/README.md) read back by huggingface_hub itself, offline: the front matter
parses, its license, tags, library and model-index say what the run's record says, hostile user text stays one YAML
value, and the commands it gives check the files they name. The records are real runs' (tests/fixtures/model_card/:
a digits image classifier and a tiny language model, trimmed to what the card reads)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub reads its settings: nothing here may reach the Hub

import yaml  # noqa: E402
from huggingface_hub import ModelCard, ModelCardData  # noqa: E402
from huggingface_hub.repocard import REGEX_YAML_BLOCK  # noqa: E402
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results  # noqa: E402

from veritrain.core.task_registry import task_spec  # noqa: E402
from veritrain.results import model_card as mc  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "model_card"
FINGERPRINT = hashlib.sha256(b"a public key").hexdigest()
# the metadata keys of the Hub's model card spec (hub-docs modelcard.md, and pipeline_tag from its model card docs):
# huggingface_hub 2.4.0 has no offline validator (ModelCard.validate posts to the Hub), so the keys are checked here
HUB_MODEL_CARD_KEYS = {"language", "license", "license_name", "license_link", "library_name", "tags", "datasets", "metrics",
                       "base_model", "model-index", "pipeline_tag"}
TAG = re.compile(r"[a-z0-9][a-z0-9-]*")
HOSTILE = [
    'quotes " and \' and a colon: here',
    "a line\n---\nlicense: mit\nlibrary_name: injected",
    "---",
    "...",
    "- item\n- item",
    "key: value\n  nested: {a: 1}",
    "&anchor *alias !!python/object:os.system [x]",
    "cr\rlf\r\nnel\x85ls\u2028ps\u2029vt\x0bff\x0c",
    "日本語 ✓ 👀 naïve",
    "\ufeffbom and \u202eright-to-left override and \x00nul \x1b[31mescape",
    "# heading\n<script>alert(1)</script> [link](javascript:alert(1)) | pipe | `code` ```fence",
    "\ud800 a lone surrogate",
    "x" * 100_000,
]


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails the test: the card is read and checked offline."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model card tests tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def fixture(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data["record"], data["description"]


def front_matter(text: str) -> dict[str, Any]:
    match = REGEX_YAML_BLOCK.search(text)
    assert match is not None and match.start() == 0, "the card does not open with front matter"
    return yaml.safe_load(match.group(2))


def outside_code_blocks(markdown: str) -> list[str]:
    """The lines of `markdown` that are not inside a fenced code block (CommonMark: a fence closes with at least as many)."""
    lines, fence = [], ""
    for line in markdown.splitlines():
        run = re.match(r"`{3,}", line)
        if fence:
            if run and len(run.group(0)) >= len(fence) and not line[len(run.group(0)):].strip():
                fence = ""
        elif run:
            fence = run.group(0)
        else:
            lines.append(line)
    return lines


def test_an_image_classifiers_card_reads_back_in_huggingface_hub():
    record, description = fixture("classification")
    card = ModelCard(mc.model_card(record, description, FINGERPRINT))
    assert card.data.license == "cc-by-4.0"  # from the data card's "CC BY 4.0 (UCI Machine Learning Repository)"
    assert card.data.library_name == "pytorch"
    assert card.data.pipeline_tag == "image-classification"
    assert card.data.tags == ["veritrain", "image-classification", "pytorch", "onnx", "safetensors", "torchscript"]
    assert card.data.datasets == ["digits"]
    body = card.text
    for fact in (record["run_id"], record["data"]["version"], record["final_state_sha256"], FINGERPRINT,
                 description["checkpoint_state_sha256"], f"veritrain verify {record['run_id']}", "sha256sum -c",
                 mc.VERIFY_SIGNATURE_COMMAND.format(folder=".", public_key=mc.PUBLIC_KEY_FILE), "docs/provenance.md",
                 "provenance.intoto.jsonl", "| Test accuracy | 0.988304 |"):
        assert fact in body, fact
    assert "unsigned" not in body


def test_a_language_models_card_reads_back_in_huggingface_hub():
    record, description = fixture("lm")
    card = ModelCard(mc.model_card(record, description, None))
    # "Python Software Foundation License Version 2 (PSF-2.0); ..." is not on the Hub's list
    assert (card.data.license, card.data.license_name, card.data.license_link) == ("other", "psf-2.0", None)
    assert card.data.library_name == "pytorch" and card.data.pipeline_tag == "text-generation"
    assert card.data.tags == ["veritrain", "text-generation", "pytorch", "onnx", "safetensors", "torchscript"]
    assert card.data.datasets == ["pydoc_topics"]
    body = card.text
    assert "| signing key | unsigned: no signing key was set |" in body
    assert "model_signing" not in body and "model.sig` to check" in body
    assert "| Test bits per byte | 3.77153 |" in body
    tokenizer = description["preprocessing"]["tokenizer"]
    assert f"{tokenizer['sha256']}  tokenizer.json\n" in body  # the companion file is checked with the model files


@pytest.mark.parametrize("name", ["classification", "lm"])
def test_the_model_index_reads_back_to_the_exact_test_metrics(name):
    record, description = fixture(name)
    text = mc.model_card(record, description, FINGERPRINT)
    model_name, results = model_index_to_eval_results(front_matter(text)["model-index"])
    assert model_name == record["exp_name"]
    test = record["metrics"]["test"]
    spec = task_spec(record["task"])  # the card reports what the task declares, under the names it declares
    expected = {m.name: m.value(test) for m in spec.metrics if m.value(test) is not None}
    assert len(results) == len(expected) and len(expected) >= 3
    by_name = {f"Test {m.shown}": m.name for m in spec.metrics}
    for result in results:
        assert result.task_type == spec.card.pipeline_tag
        assert (result.dataset_type, result.dataset_split, result.dataset_revision) == (record["data"]["source"], "test", record["data"]["version"])
        assert result.dataset_name == f"{record['data']['source']} (veritrain data version {record['data']['version'][:12]})"
        key = by_name[result.metric_name]
        assert result.metric_value == expected[key] and type(result.metric_value) is type(expected[key])  # the same float, bit for bit
    # huggingface_hub parses the same results out of the card itself
    assert ModelCard(text).data.eval_results == results


@pytest.mark.parametrize("name", ["classification", "lm"])
def test_the_metadata_validates_offline(name):
    """What huggingface_hub can check without the Hub: ModelCardData built from the front matter without
    ignore_metadata_errors (it parses and validates the model-index), and written back by huggingface_hub into the
    same front matter; the rest against the Hub's documented keys, license list and tasks."""
    record, description = fixture(name)
    metadata = front_matter(mc.model_card(record, description, None))
    data = ModelCardData(**copy.deepcopy(metadata))
    assert data.to_dict() == metadata
    assert eval_results_to_model_index(data.model_name, data.eval_results) == metadata["model-index"]  # type: ignore[arg-type]
    assert set(metadata) <= HUB_MODEL_CARD_KEYS
    assert metadata["license"] in mc.HUB_LICENSES
    assert metadata["pipeline_tag"] in {"image-classification", "text-generation"}
    assert all(isinstance(tag, str) and TAG.fullmatch(tag) for tag in metadata["tags"])
    assert all(isinstance(d, str) for d in metadata["datasets"])
    if metadata["license"] == "other":
        assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", metadata["license_name"])
    for entry in metadata["model-index"]:
        for result in entry["results"]:
            assert {"type", "name"} <= set(result["task"]) and {"type", "name", "split", "revision"} <= set(result["dataset"])
            assert all({"type", "value", "name"} <= set(metric) for metric in result["metrics"])


@pytest.mark.parametrize("name", ["classification", "lm"])
def test_the_same_inputs_give_the_same_bytes(name):
    record, description = fixture(name)
    first = mc.model_card(record, description, FINGERPRINT)
    again = mc.model_card(copy.deepcopy(record), json.loads(json.dumps(description)), FINGERPRINT)
    assert first.encode("utf-8") == again.encode("utf-8")
    # no date but the record's own start time
    assert set(re.findall(r"\d{4}-\d{2}-\d{2}T[\d:.+]+", first)) == {record["started_at"]}


@pytest.mark.parametrize("hostile", HOSTILE, ids=[f"hostile-{i}" for i in range(len(HOSTILE))])
def test_hostile_user_text_is_carried_exactly_and_injects_nothing(hostile):
    record, description = fixture("classification")
    record["exp_name"] = hostile
    record["hypothesis"] = hostile
    record["data"]["card"] = {"name": hostile, "origin": hostile, "license": hostile, "collection": hostile,
                              "limitations": hostile, "contact": hostile, "citation": hostile}
    description["classes"] = [hostile, *description["classes"][1:]]
    text = mc.model_card(record, description, FINGERPRINT)
    text.encode("utf-8")  # writable as UTF-8 whatever the text held (a lone surrogate is shown escaped)

    metadata = front_matter(text)
    assert set(metadata) == {"license", "license_name", "library_name", "pipeline_tag", "tags", "datasets", "model-index"} | (
        {"license_link"} if "http" in hostile else set())
    assert metadata["model-index"][0]["name"] == hostile  # exactly, through the YAML round trip
    assert metadata["datasets"] == [hostile]
    assert metadata["model-index"][0]["results"][0]["dataset"]["type"] == hostile
    assert metadata["license"] == "other" and re.fullmatch(r"[a-z0-9][a-z0-9.-]*", metadata["license_name"])
    assert metadata["library_name"] == "pytorch"
    card = ModelCard(text)
    assert card.data.datasets == [hostile] and card.data.model_name == hostile
    # the front matter ends where the card ends it: at the one line `---` after the metadata
    front = REGEX_YAML_BLOCK.search(text)
    assert front is not None
    assert text[front.end():].startswith("\n# ")
    assert text[:front.end()].count("\n---\n") == 1
    # and shows what it holds: no bidi override, control or other character that does not show is written as itself
    assert not [ch for ch in text[:front.end()] if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn")]
    # the body keeps to its own sections and holds no raw HTML or links from the text
    body = text[front.end():]
    headings = [line for line in outside_code_blocks(body) if line.startswith("#")]
    assert headings[1:] == ["## Where it comes from", "## Test metrics", "## Data", "## Files", "## Check it"]
    prose = "\n".join(outside_code_blocks(body))  # a citation is shown verbatim, in a code block
    assert "<script>" not in prose and not re.search(r"(?<!\\)\]\(javascript:", prose)  # a link only where `]` is not escaped


def test_a_record_without_test_metrics_has_no_model_index():
    record, description = fixture("classification")
    record["metrics"] = {"val": record["metrics"]["test"]}
    text = mc.model_card(record, description, None)
    assert "model-index" not in front_matter(text)
    assert "The run's record holds no test metrics." in ModelCard(text).text


@pytest.mark.parametrize("text, expected", [
    ("CC BY 4.0 (UCI Machine Learning Repository)", {"license": "cc-by-4.0"}),
    ("MIT", {"license": "mit"}),
    ("MIT License", {"license": "mit"}),
    ("Apache License, Version 2.0", {"license": "apache-2.0"}),
    ("apache-2.0", {"license": "apache-2.0"}),
    ("Creative Commons Attribution 4.0 International", {"license": "cc-by-4.0"}),
    ("CC-BY-SA-4.0", {"license": "cc-by-sa-4.0"}),
    ("GPL-3.0-or-later", {"license": "gpl-3.0"}),
    ("CC0", {"license": "cc0-1.0"}),
    ("ODbL-1.0", {"license": "odbl"}),
    ("openrail++", {"license": "openrail++"}),
    ("OpenRAIL", {"license": "openrail"}),
    ("Python Software Foundation License Version 2 (PSF-2.0); documentation © Python Software Foundation",
     {"license": "other", "license_name": "psf-2.0"}),
    ("Proprietary terms, see https://example.com/terms.", {"license": "other", "license_name": "proprietary-terms-see",
                                                          "license_link": "https://example.com/terms"}),
    ("MIT, but only for non-commercial use", {"license": "other", "license_name": "mit-but-only-for-non-commercial-use"}),
    ("许可证", {"license": "other", "license_name": "data-license"}),
    (None, {"license": "unknown"}),
    ("  ", {"license": "unknown"}),
])
def test_the_data_license_becomes_a_hub_license(text, expected):
    assert mc.hub_license(text) == expected


def test_an_unknown_license_is_other_with_its_name_in_the_card():
    record, description = fixture("classification")
    record["data"]["card"]["license"] = "Our Lab's Research-Only License v3 https://lab.example.org/license"
    card = ModelCard(mc.model_card(record, description, None))
    assert (card.data.license, card.data.license_name, card.data.license_link) == (
        "other", "our-lab-s-research-only-license-v3", "https://lab.example.org/license")
    assert "Our Lab's Research-Only License v3" in card.text


def test_the_checksum_command_checks_the_files_it_names(tmp_path):
    """The card's `sha256sum -c` block, run as written in a folder holding the files (and failing on a changed one)."""
    if shutil.which("sha256sum") is None:
        pytest.skip("sha256sum (GNU coreutils) is not installed")
    record, description = fixture("lm")
    for entry in [*description["files"].values(), description["preprocessing"]["tokenizer"]]:
        content = f"the bytes of {entry['file']}\n".encode()
        (tmp_path / entry["file"]).write_bytes(content)
        entry["sha256"] = hashlib.sha256(content).hexdigest()
    text = mc.model_card(record, description, None)
    block = re.search(r"```sh\n(sha256sum -c <<'EOF'\n.*?\nEOF)\n```", text, re.S)
    assert block is not None
    done = subprocess.run(["bash", "-c", block.group(1)], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": OK") == 4
    (tmp_path / "model.onnx").write_bytes(b"changed")
    assert subprocess.run(["bash", "-c", block.group(1)], cwd=tmp_path, capture_output=True).returncode == 1


def test_a_file_name_a_command_cannot_carry_is_refused():
    record, description = fixture("classification")
    description["files"]["onnx"]["file"] = "model.onnx\nrm -rf ~"
    with pytest.raises(ValueError, match="model.json lists onnx"):
        mc.model_card(record, description, None)
    record, description = fixture("classification")
    record["run_id"] = "x; rm -rf ~"
    with pytest.raises(ValueError, match="is not a run id"):
        mc.model_card(record, description, None)


def test_the_card_never_holds_the_seal():
    """The seal covers this file (record.json lists it with its hash), so a card naming it could never be right."""
    record, description = fixture("classification")
    seal = hashlib.sha256(b"record.json").hexdigest()
    record["seal"] = seal
    record["seal_history"] = [{"seal": seal, "by": "export", "replaced_at": record["started_at"]}]
    assert seal not in mc.model_card(record, description, None)
