"""The language-model task (veritrain.tasks.lm) on a text data version: windows of model.context + 1 tokens as the
rows the loop orders, a GPT trained by the built-in loop, a run that verifies and evaluates in bits per byte, and
one-line refusals of configs that cannot train. A small corpus (eight help topics as .txt files, about 20 steps)
keeps it short; the full configs/tiny-lm.yaml is a slow test."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, veritrain
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
    done = veritrain("train", str(ROOT / "configs" / "tiny-lm.yaml"), *args, "--json", cwd=corpus)
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
    (["task=lm"], "data: task lm trains on text, but data.source is 'digits'; use text, jsonl or pydoc_topics"),
    (["model.name=gpt"], "model: model.name gpt is a language model; it needs task: lm (task is 'classification')"),
    (["task=lm", "data.source=pydoc_topics", "model.name=cnn"], "model: task lm trains model.name: gpt, not 'cnn'"),
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


def test_the_stages_the_language_model_lacks_are_refused_in_one_line(trained):
    root, run_dir = trained
    config = str(ROOT / "configs" / "tiny-lm.yaml")
    for args in (["run", config], ["baseline", config], ["sweep", config, "--vary", "optim.lr=0.001,0.003"]):
        done = veritrain(*args, cwd=root)
        assert done.code == 2 and done.stderr.startswith("error: task: lm: ") and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    done = veritrain("export", run_dir.name, cwd=root)
    assert done.code == 2 and "the language-model task has no export" in done.stderr, done.stderr


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
