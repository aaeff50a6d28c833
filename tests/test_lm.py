"""The language-model task (veritrain.tasks.lm) on a text data version: windows of model.context + 1 tokens as the
rows the loop orders, a GPT trained by the built-in loop, a run that verifies and evaluates in bits per byte, and
one-line refusals of configs that cannot train. A small corpus (eight help topics as .txt files, about 20 steps)
keeps it short; the full configs/tiny-lm.yaml is a slow test."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, veritrain

from veritrain.core.hashing import sha256_file
from veritrain.data.text_corpus import embedded_topics

TINY = ["--set", "model.layers=1", "--set", "model.width=32", "--set", "model.heads=2", "--set", "model.context=64",
        "--set", "train.epochs=4", "--set", "train.batch_size=16", "--set", "schedule.warmup_steps=2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    docs = root / "docs"
    docs.mkdir()
    topics = embedded_topics()
    for name in ["assert", "break", "continue", "del", "global", "if", "pass", "while"]:
        (docs / f"{name}.txt").write_text(topics[name], encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def trained(corpus):
    args = ["--set", "data.source=text", "--set", f"data.root={corpus / 'docs'}", "--set", "data.split_ratios=[0.6,0.2,0.2]", *TINY]
    done = veritrain("run", str(ROOT / "configs" / "tiny-lm.yaml"), *args, "--json", cwd=corpus)
    assert done.code == 0, done.stderr
    (run_dir,) = (corpus / "runs").iterdir()
    return corpus, run_dir


def test_a_language_model_trains_verifies_and_evaluates_in_bits_per_byte(trained):
    root, run_dir = trained
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "completed" and record["config"]["task"] == "lm"
    assert 10 <= record["training"]["steps"] <= 40
    tokenizer = json.loads((root / ".veritrain" / "data" / record["data"]["version"] / "version.json").read_text())["tokenizer"]
    assert record["data"]["tokenizer"] == tokenizer and tokenizer["sha256"] and sum(record["data"]["tokens"].values()) > 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["val_loss"] < 5.6  # below the 5.55 nats of a uniform guess over 257 ids
    assert veritrain("verify", run_dir.name, cwd=root).code == 0
    done = veritrain("eval", run_dir.name, "--json", cwd=root)
    assert done.code == 0, done.stderr
    metrics = json.loads((run_dir / "eval" / "test" / "metrics.json").read_text())
    assert np.isclose(metrics["perplexity"], np.exp(metrics["loss"]))
    assert np.isclose(metrics["bits_per_byte"], metrics["loss"] * metrics["tokens"] / (np.log(2) * metrics["bytes"]))
    assert metrics["tokens"] == metrics["windows"] * 64 and 0 < metrics["bytes"] <= metrics["tokens"]


def test_a_text_run_verifies_when_its_raw_folder_grows_and_fails_when_a_file_it_read_changes(trained):
    """New documents beside those a data version read are growth, reported; a file it read that changed fails."""
    root, run_dir = trained
    docs = root / "docs"
    added = docs / "zz-added.txt"
    added.write_text(embedded_topics()["for"], encoding="utf-8")
    try:
        grown = veritrain("verify", run_dir.name, "--json", cwd=root)
        assert grown.code == 0, grown.stdout + grown.stderr
        assert grown.json()["raw_data"].startswith("8 raw files hash as recorded") and "; 1 added since" in grown.json()["raw_data"]
        original = (docs / "pass.txt").read_bytes()
        (docs / "pass.txt").write_bytes(original + b"\nA sentence added later.")
        try:
            changed = veritrain("verify", run_dir.name, "--json", cwd=root)
            assert changed.code == 1
            (problem,) = [p for p in changed.json()["problems"] if p["kind"] == "data_changed"]
            assert "pass.txt: its bytes hash to" in problem["detail"]
        finally:
            (docs / "pass.txt").write_bytes(original)
    finally:
        added.unlink()
    assert veritrain("verify", run_dir.name, cwd=root).code == 0


def test_the_windows_are_the_rows_and_a_batch_is_their_tokens(trained):
    from veritrain.core.config import load_config
    from veritrain.data.identity import load_version
    from veritrain.tasks import get_task, split_rows

    root, run_dir = trained
    record = json.loads((run_dir / "record.json").read_text())
    data = load_version(root / ".veritrain" / "data" / record["data"]["version"])
    cfg = load_config(run_dir / "config.yaml").config
    task = get_task(cfg)
    rows = {name: split_rows(task, data, name) for name in ("train", "val", "test")}
    assert [len(rows[n]) for n in rows] == [(len(data.tokens[n]) - 1) // 64 for n in rows]
    assert rows["val"][0] == len(rows["train"]) and rows["test"][0] == len(rows["train"]) + len(rows["val"])
    import torch

    x, y = task.batch(data, np.array([rows["val"][1], rows["train"][0]]), torch.device("cpu"), False, torch.Generator())
    assert x.shape == (2, 64) and x[0].tolist() == data.tokens["val"][64:128].tolist() and y[0].tolist() == data.tokens["val"][65:129].tolist()
    assert x[1].tolist() == data.tokens["train"][:64].tolist()
    with pytest.raises(IndexError):
        task.batch(data, np.array([rows["test"][-1] + 1]), torch.device("cpu"), False, torch.Generator())


@pytest.mark.parametrize("overrides, message", [
    (["task=lm"], "data: task lm learns from tokens, but data.source 'digits' gives image and label; use a source that gives them "
                  "(jsonl, pydoc_topics, text) or a task that learns from image and label (task: classification)"),
    (["model.name=gpt"], "model: task classification trains model.name cnn or mlp or resnet18 (or a user model as model.target), "
                         "not 'gpt'; model gpt is trained by task lm"),
    (["task=lm", "data.source=pydoc_topics", "model.name=cnn"], "model: task lm trains model.name gpt, not 'cnn'"),
    (["task=lm", "data.source=pydoc_topics", "model.name=gpt", "model.width=30"], "model.width 30 is not a multiple of model.heads 4"),
])
def test_configs_that_cannot_train_a_language_model_are_one_line(overrides, message, tmp_path):
    done = veritrain("train", *[arg for o in overrides for arg in ("--set", o)], cwd=tmp_path)
    assert done.code == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_corpus_too_small_for_a_batch_or_a_window_is_refused_with_the_numbers(corpus, tmp_path):
    base = ["--set", "data.source=text", "--set", f"data.root={corpus / 'docs'}", "--set", "data.split_ratios=[0.6,0.2,0.2]", *TINY]
    done = veritrain("train", str(ROOT / "configs" / "tiny-lm.yaml"), *base, "--set", "train.batch_size=100000", cwd=tmp_path)
    assert done.code == 2 and "train.batch_size: 100000, but the train split holds" in done.stderr, done.stderr
    done = veritrain("train", str(ROOT / "configs" / "tiny-lm.yaml"), *base, "--set", "model.context=1000000", cwd=tmp_path)
    assert done.code == 2 and "model.context: 1000000 tokens, but the train split holds" in done.stderr, done.stderr


def test_a_run_has_the_smoke_test_baselines_bad_cases_samples_and_an_export_that_passes_parity(trained):
    root, run_dir = trained
    record = json.loads((run_dir / "record.json").read_text())
    assert record["smoke"]["status"] == "completed" and record["stages"] == ["prepare", "train", "baselines", "eval", "export"]
    baselines = record["baselines"]["results"]
    assert baselines["bigram"]["bits_per_byte"] < baselines["unigram"]["bits_per_byte"] < 8.0
    assert 0.0 <= baselines["bigram"]["lambda"] <= 1.0 and record["baselines"]["split"] == "test"
    test = record["metrics"]["test"]
    assert test["bits_per_byte"] < 8.0 and test["trajectory_entry"] is not None
    cases = json.loads((run_dir / "eval" / "test" / "bad_cases.json").read_text())
    assert cases and [c["rank"] for c in cases] == list(range(1, len(cases) + 1))
    assert all(a["bits_per_byte"] >= b["bits_per_byte"] for a, b in zip(cases, cases[1:]))
    test_ids = {line for line in (root / ".veritrain" / "data" / record["data"]["version"] / "splits" / "test.txt").read_text().split()}
    assert {c["sample_id"] for c in cases} <= test_ids
    generated = json.loads((run_dir / "eval" / "test" / "generations.json").read_text())
    assert len(generated["samples"]) == 3 and all(len(s["token_ids"]) == 64 for s in generated["samples"])
    assert [s["seed"] for s in generated["samples"]] == [0, 1, 2] and generated["temperature"] == 0.8
    report = (run_dir / "eval" / "test" / "report.md").read_text()
    assert "| bigram |" in report and "## Samples" in report and "## Documents with the most bits per byte" in report
    export = json.loads((run_dir / "export" / "model.json").read_text())
    assert export["task"] == "lm" and export["parity"]["passed"] and set(export["files"]) == {"onnx", "torchscript", "safetensors"}
    tokenizer = export["preprocessing"]["tokenizer"]
    assert tokenizer["sha256"] == record["data"]["tokenizer"]["sha256"] == sha256_file(run_dir / "export" / "tokenizer.json")
    assert export["architecture"]["config"]["context"] == 64 and export["input"]["dtype"] == "int64"
    rows = {row["id"]: row for row in veritrain("check", run_dir.name, "--json", cwd=root).json()["items"]}
    assert rows["bad_cases"]["status"] == "pass" and rows["normalization_from_train"]["status"] == "n/a"
    assert rows["beats_baseline"]["detail"].startswith("bits_per_byte ") and "vs bigram" in rows["beats_baseline"]["detail"]
    assert veritrain("verify", run_dir.name, cwd=root).code == 0


def test_generate_samples_from_the_export_as_the_evaluation_samples_from_the_model(trained):
    import torch

    from veritrain.core.config import load_config
    from veritrain.data.identity import load_version
    from veritrain.tasks import get_task, gpt
    from veritrain.train import checkpoint

    root, run_dir = trained
    first = veritrain("generate", run_dir.name, "The pass statement", "--tokens", "30", "--seed", "3", "--json", cwd=root)
    assert first.code == 0, first.stderr
    again = veritrain("generate", run_dir.name, "The pass statement", "--tokens", "30", "--seed", "3", "--json", cwd=root).json()
    other = veritrain("generate", str(run_dir / "export"), "The pass statement", "--tokens", "30", "--seed", "4", "--json", cwd=root).json()
    assert first.json()["token_ids"] == again["token_ids"] and len(again["token_ids"]) == 30 and other["token_ids"] != again["token_ids"]
    shown = veritrain("generate", run_dir.name, "The pass statement", "--tokens", "5", cwd=root)
    assert shown.code == 0 and shown.stdout.startswith("The pass statement") and shown.stderr == ""
    # greedy from the ONNX export = greedy from the trained model itself
    greedy = veritrain("generate", run_dir.name, "The pass statement", "--tokens", "20", "--temperature", "0", "--json", cwd=root).json()
    record = json.loads((run_dir / "record.json").read_text())
    cfg = load_config(run_dir / "config.yaml").config
    data = load_version(root / ".veritrain" / "data" / record["data"]["version"])
    model = get_task(cfg).build_model(cfg.model, data)
    model.load_state_dict(checkpoint.load(run_dir / "checkpoints" / "best.pt")["model"])
    prompt = list(b"The pass statement")
    assert isinstance(model, gpt.GPT) and greedy["token_ids"] == gpt.generate(model, torch.tensor(prompt), 20, 0.0, seed=0)


def test_generate_refuses_an_export_whose_tokenizer_is_not_the_one_it_was_trained_with(trained, tmp_path):
    import shutil

    root, run_dir = trained
    export = tmp_path / "export"
    shutil.copytree(run_dir / "export", export)
    recorded = json.loads((export / "model.json").read_text())["preprocessing"]["tokenizer"]["sha256"]
    tokenizer = json.loads((export / "tokenizer.json").read_text())
    tokenizer["note"] = "changed"
    (export / "tokenizer.json").write_text(json.dumps(tokenizer))
    done = veritrain("generate", str(export), "The pass statement", cwd=root)
    assert done.code == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"model.json records {recorded[:12]}" in done.stderr and sha256_file(export / "tokenizer.json")[:12] in done.stderr
    done = veritrain("predict", str(export), str(export / "model.json"), cwd=root)
    assert done.code == 2 and "veritrain generate" in done.stderr, done.stderr


def test_a_tokenizer_that_now_makes_other_bytes_is_refused_by_eval_and_reproduce_with_both_hashes(trained, tmp_path, monkeypatch):
    """As when a new tokenizers release trains other merges: the data prepares with another tokenizer, and no result or
    continuation may mix the ids of two tokenizers (never a warning, not even with --allow-data-drift)."""
    import hashlib
    import shutil

    from veritrain.data import tokenizer as tokenizer_module

    root, run_dir = trained
    workspace = tmp_path / "ws"
    shutil.copytree(root, workspace, symlinks=True)
    record = json.loads((run_dir / "record.json").read_text())
    trained_with = record["data"]["tokenizer"]["sha256"]
    original = tokenizer_module.byte_level
    monkeypatch.setattr(tokenizer_module, "byte_level", lambda special_tokens=(tokenizer_module.END_OF_TEXT,): original((*special_tokens, "<|pad|>")))
    for args, code in ((["eval", run_dir.name, "--allow-data-drift"], 2), (["reproduce", run_dir.name], 2)):
        done = veritrain(*args, "--workdir", str(workspace), cwd=workspace)
        assert done.code == code and f"but the run was trained with {trained_with[:12]} (byte_level, 257 tokens)" in done.stderr, (args, done.stderr)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "the tokenizer is " in errors[0] and "258 tokens" in errors[0], done.stderr
    # a run interrupted before the tokenizer changed does not continue under the new one
    copied = workspace / "runs" / run_dir.name / "record.json"
    shutil.rmtree(copied.parent / "amendments", ignore_errors=True)  # a run that was interrupted has none
    interrupted = json.dumps({**json.loads(copied.read_text()), "status": "interrupted"}, indent=2)
    copied.write_text(interrupted)
    (copied.parent / "record.sha256").write_text(hashlib.sha256(interrupted.encode()).hexdigest() + "\n")
    done = veritrain("train", "--resume", run_dir.name, "--workdir", str(workspace), cwd=workspace)
    assert done.code == 1 and "resume: the tokenizer is " in done.stderr and f"trained with {trained_with[:12]}" in done.stderr, done.stderr


def test_data_order_lists_the_windows_the_loop_trained_on(corpus, tmp_path, monkeypatch):
    """The rows `veritrain data order` recomputes from the record are those the training loop gave the task."""
    from veritrain.tasks import lm

    seen: list[list[int]] = []
    original = lm.LanguageModelTask.batch

    def recording(self, data, rows, device, train, generator):
        if train:
            seen.append([int(r) for r in rows])
        return original(self, data, rows, device, train, generator)

    monkeypatch.setattr(lm.LanguageModelTask, "batch", recording)
    args = ["--set", "data.source=text", "--set", f"data.root={corpus / 'docs'}", "--set", "data.split_ratios=[0.6,0.2,0.2]", *TINY,
            "--set", "seed=5"]
    assert veritrain("train", str(ROOT / "configs" / "tiny-lm.yaml"), *args, "--workdir", str(tmp_path), cwd=corpus).code == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    steps = json.loads((run_dir / "record.json").read_text())["training"]["steps"]
    listed = veritrain("data", "order", run_dir.name, "--steps", f"0:{steps}", "--json", "--workdir", str(tmp_path), cwd=corpus).json()
    assert [[start // 64 for start in s["window_starts"]] for s in listed["steps"]] == seen
    again = veritrain("data", "order", run_dir.name, "--steps", f"0:{steps}", "--json", "--workdir", str(tmp_path), cwd=corpus).json()
    assert again["sha256"] == listed["sha256"] and len(listed["sha256"]) == 64
    refused = veritrain("data", "order", run_dir.name, "--steps", "5:2", "--workdir", str(tmp_path), cwd=corpus)
    assert refused.code == 2 and "give A:B with 0 ≤ A < B" in refused.stderr


def test_a_language_model_run_reproduces_bit_identically(trained):
    root, run_dir = trained
    done = veritrain("reproduce", run_dir.name, "--json", cwd=root)
    assert done.code == 0 and done.json()["verdict"] == "identical", done.stdout + done.stderr


def test_the_published_page_shows_bits_per_byte_curves_samples_and_worst_documents_escaped(trained, tmp_path):
    from markupsafe import escape

    from veritrain.core.display import CONTROL
    from veritrain.web.views import visible_text

    root, run_dir = trained
    done = veritrain("publish", run_dir.name, "--out", str(tmp_path / "site"), cwd=root)
    assert done.code == 0, done.stderr
    with open(tmp_path / "site" / "runs" / f"{run_dir.name}.html", encoding="utf-8", newline="") as f:
        page = f.read()
    assert 'data-chart="bits_per_byte"' in page and 'data-chart="accuracy"' not in page and 'data-chart="loss"' in page
    curves = json.loads(page.split('<script type="application/json" id="curves-data">')[1].split("</script>")[0])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert curves["series"]["val_bits_per_byte"] == [row["val_bits_per_byte"] for row in rows]
    generated = json.loads((run_dir / "eval" / "test" / "generations.json").read_text())["samples"]
    cases = json.loads((run_dir / "eval" / "test" / "bad_cases.json").read_text())
    assert "samples from fixed prompts" in page and "documents with the most bits per byte" in page
    for text in [s["prompt"] for s in generated] + [s["text"] for s in generated] + [c["excerpt"] for c in cases[:5]]:
        shown = visible_text(text)
        assert f"<pre>{escape(shown)}</pre>" in page  # shown as text, never as markup
        assert not CONTROL.search(shown.replace("\n", "").replace("\t", ""))  # control characters as their escapes
    assert "test bits per byte" in page.split('id="headline"')[1][:800]  # beside the baselines' values


def test_task_lm_with_only_a_jsonl_source_prepares_and_trains(tmp_path):
    """No model section, no tokenizer, no split settings: the task's own defaults (its model, the GPT) train it."""
    topics = embedded_topics()
    lines = [json.dumps({"text": topics[name]}) for name in sorted(topics)[:16]]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "lm.yaml").write_text("task: lm\ndata:\n  source: jsonl\n  root: docs.jsonl\n", encoding="utf-8")
    done = veritrain("train", "lm.yaml", "--set", "train.epochs=1", "--set", "model.context=16", "--set", "model.width=16",
                     "--set", "model.layers=1", "--json", cwd=tmp_path)
    assert done.code == 0, done.stderr
    record = json.loads((tmp_path / "runs" / json.loads(done.stdout)["run_id"] / "record.json").read_text())
    assert record["status"] == "completed" and record["config"]["model"]["name"] == "gpt" and record["data"]["source"] == "jsonl"
    assert "val_bits_per_byte" in (tmp_path / "runs" / record["run_id"] / "metrics.jsonl").read_text()
