"""The language-model task (`task: lm`): a small GPT (veritrain.tasks.gpt) trained on a text data version
(veritrain.data.text_prepare) to predict each next token.

A split's token array (its documents in id order, each followed by <|endoftext|>) is cut into windows of
`model.context` + 1 tokens that start every `model.context` tokens: window k holds tokens [k·context,
(k+1)·context], its inputs the first `context` of them and its targets the last `context`. The rows the loop
orders are the window indices, so the training order is a permutation of window starts drawn from (seed, epoch)
alone, as for images (veritrain.train.loop): a mid-epoch resume and an audit replay need no loader state.

Metrics, on every window of a split: `loss` (mean nats per predicted token), `perplexity` = e^loss and
`bits_per_byte` = total nats / (ln 2 · the UTF-8 bytes the predicted tokens spell; <|endoftext|> spells none),
which does not depend on the tokenizer, so byte-level and BPE runs compare (veritrain.tasks.lm_metrics).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

import numpy as np
import torch
import torch.nn.functional as F

from veritrain.core.errors import UserError
from veritrain.core.task_spec import TaskSpec
from veritrain.data.identity import TextVersion
from veritrain.data.split import SPLITS
from veritrain.data.tokenizer import load_tokenizer
from veritrain.tasks import ExportSpec, gpt, lm_eval
from veritrain.tasks.evaluation import Evaluator, stream
from veritrain.tasks.lm_spec import SPEC, GptModelConfig

if TYPE_CHECKING:
    from veritrain.core.config import RunConfig
    from veritrain.data.identity import DataVersion, TextVersion


class LanguageModelTask:
    name: str = "lm"
    spec: TaskSpec = SPEC  # what it declares about its metrics (tasks/lm_spec.py, torch-free)
    epoch_metrics: tuple[str, ...] = ()
    best_metric: tuple[str, str] = ("val_loss", "min")

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        assert isinstance(cfg.model, GptModelConfig)  # the section task lm declares (RunConfig reads `model` with it)
        self.context = cfg.model.context

    # ------------------------------------------------------------ data

    def rows(self, data: DataVersion, split: str) -> np.ndarray:
        """The rows of `split`: its windows, numbered after those of the splits before it (train, val, test), so that a
        row names its split and window alone."""
        start, count = self._layout(data)[split]
        return np.arange(start, start + count, dtype=np.int64)

    def _layout(self, data: DataVersion) -> dict[str, tuple[int, int]]:
        """split → (first row, windows)."""

        layout, start = {}, 0
        for name in SPLITS:
            count = window_count(_text(data).tokens[name], self.context)
            layout[name] = (start, count)
            start += count
        return layout

    def prepare(self, data: DataVersion) -> None:
        """Refuse what cannot train, with the numbers: no window in train, or fewer windows than one batch."""
        text = _text(data)
        train = window_count(text.tokens["train"], self.context)
        batch = self.cfg.train.batch_size
        if train == 0:
            raise UserError(f"model.context: {self.context} tokens, but the train split holds {len(text.tokens['train'])} tokens, "
                            f"too few for one window of {self.context + 1}; lower model.context or add documents")
        if train < batch:
            raise UserError(f"train.batch_size: {batch}, but the train split holds {train} windows of {self.context} tokens "
                            f"({len(text.tokens['train'])} tokens); lower train.batch_size or model.context, or add documents")

    def batch(self, data: DataVersion, rows: np.ndarray, device: torch.device, train: bool,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of these windows, both (windows, context) int64 (no augmentation)."""
        rows = np.asarray(rows, dtype=np.int64)
        windows = np.empty((len(rows), self.context + 1), dtype=np.int64)
        offsets = np.arange(self.context + 1)
        for name, (start, count) in self._layout(data).items():
            mine = (rows >= start) & (rows < start + count)
            if mine.any():
                starts = (rows[mine] - start) * self.context
                windows[mine] = _text(data).tokens[name][starts[:, None] + offsets]
        if len(rows) and (rows.min() < 0 or rows.max() >= sum(c for _, c in self._layout(data).values())):
            raise IndexError(f"lm: rows {rows.min()}…{rows.max()} are not windows of this data version")
        tensor = torch.from_numpy(windows)
        return tensor[:, :-1].to(device), tensor[:, 1:].to(device)

    # ------------------------------------------------------------ model and loss

    def build_model(self, cfg: GptModelConfig, data: DataVersion) -> torch.nn.Module:
        tokenizer = _text(data).info["tokenizer"]
        return gpt.GPT(gpt.GPTConfig(vocab_size=int(tokenizer["vocab_size"]), context=cfg.context, layers=cfg.layers, width=cfg.width,
                                     heads=cfg.heads, dropout=cfg.dropout, tied_embeddings=cfg.tied_embeddings), seed=self.cfg.seed)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return gpt.lm_loss(outputs, targets)

    def show_rows(self, data: DataVersion, rows: np.ndarray) -> tuple[str, dict[str, list[Any]]]:
        """A training row is a window: its first token, counted in the train split's tokens."""
        return "window start (tokens of the train split)", {"window_starts": [int(r) * self.context for r in rows]}

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        return {}

    def validation_metrics(self, model: torch.nn.Module, data: DataVersion, device: torch.device, batch_size: int) -> dict[str, float]:
        """metrics.jsonl's val_loss (mean nats per predicted token) and val_bits_per_byte: the evaluation's own numbers
        on val, one batch of logits at a time."""
        was_training = model.training
        scoring = LanguageModelEvaluation(self, model, data, "val", None)
        stream(model, self, data, "val", device, batch_size, scoring, "the model being trained")
        model.train(was_training)
        scored = scoring.compute()
        return {"val_loss": scored["loss"], "val_bits_per_byte": scored["bits_per_byte"]}

    # ------------------------------------------------------------ evaluation (veritrain.tasks.lm_eval)

    def evaluator(self, model: torch.nn.Module, data: DataVersion, split: str, cfg: RunConfig) -> Evaluator:
        return LanguageModelEvaluation(self, model, data, split, cfg)

    def write_report(self, path: Path, metrics: dict[str, Any], baselines: Optional[dict[str, Any]], run_id: str) -> None:
        cases = json.loads((path.parent / "bad_cases.json").read_text(encoding="utf-8"))
        generated = json.loads((path.parent / "generations.json").read_text(encoding="utf-8"))["samples"]
        path.write_text(lm_eval.report_markdown(metrics, baselines, run_id, cases, generated), encoding="utf-8")

    def plot_curves(self, path: Path, history: list[dict[str, Any]]) -> None:
        lm_eval.plot_curves(path, history)

    def baselines(self, data: DataVersion, cfg: RunConfig) -> dict[str, Any]:
        """A byte unigram and an interpolated byte bigram, fit on train, in bits per byte on `eval.split`."""

        text = _text(data)
        assert text.tokenizer_file is not None
        return lm_eval.fit_baselines(text, cfg.eval.split, load_tokenizer(text.tokenizer_file))

    # ------------------------------------------------------------ smoke test and export

    def smoke_slice(self, data: DataVersion, counts: dict[str, int]) -> DataVersion:
        """The data version cut to the first `counts[split]` windows of each split (the smoke test's tiny slice)."""

        text = _text(data)
        return dataclasses.replace(text, tokens={name: array[: counts.get(name, 0) * self.context + 1] if len(array) else array
                                                 for name, array in text.tokens.items()})

    def export_spec(self, cfg: RunConfig, model: torch.nn.Module, data: DataVersion, example: torch.Tensor) -> ExportSpec:
        """What model.json says of a GPT export: token ids in, next-token logits out (batch and time dynamic, time at
        most the context), the tokenizer (copied beside the model, its SHA-256 bound), and the GPTConfig that rebuilds it."""

        text = _text(data)
        assert text.tokenizer_file is not None and isinstance(model, gpt.GPT)
        tokenizer = dict(text.info["tokenizer"])
        return ExportSpec(
            example,
            architecture={"name": "gpt", "module": "veritrain.tasks.gpt.GPT", "config": dataclasses.asdict(model.cfg),
                          "parameters": gpt.parameter_count(model),
                          "rebuild": "veritrain.tasks.gpt.GPT(veritrain.tasks.gpt.GPTConfig(**config)), then load model.safetensors"},
            input={"name": "input", "shape": [None, None], "dtype": "int64", "batch": "dynamic",
                   "time": f"dynamic, 1 … {model.cfg.context} token ids"},
            output={"name": "logits", "shape": [None, None, model.cfg.vocab_size], "dtype": "float32",
                    "meaning": "at each position, the logits of the token that follows"},
            dynamic_axes={"input": {0: "batch", 1: "time"}, "logits": {0: "batch", 1: "time"}},
            preprocessing={"tokenizer": {**tokenizer, "file": "tokenizer.json"}, "context": model.cfg.context,
                           "generation": "veritrain generate RUN \"prompt\": encode with tokenizer.json, feed the last `context` ids, "
                                         "sample the next id from the last position's logits"},
            source_mapping={"source": cfg.data.source, "result": "UTF-8 text, normalized as the data version recorded "
                            "(docs/data.md: text data versions), encoded by tokenizer.json",
                            "recorded": (text.info.get("preprocessing") or {}).get("source")},
            companions={"tokenizer.json": text.tokenizer_file},
        )


class LanguageModelEvaluation:
    """The nats the model gives each token of a split from the tokens before it in its window, filled in batch by batch
    (a window at a time: only one batch of logits is held); then bits per byte, perplexity and loss over every scored
    token (lm_eval.split_metrics), and with a run config the documents with the most bits per byte and samples from
    the fixed prompts."""

    def __init__(self, task: LanguageModelTask, model: torch.nn.Module, data: DataVersion, split: str, cfg: Optional[RunConfig]) -> None:
        self.model, self.text, self.split, self.cfg, self.context = model, _text(data), split, cfg, task.context
        self.tokens = self.text.tokens[split]
        self.first = task._layout(data)[split][0]  # the split's first row
        self.nats = np.full(len(self.tokens), np.nan)  # NaN where no window predicts the token

    def update(self, outputs: torch.Tensor, targets: torch.Tensor, rows: np.ndarray) -> None:
        lost = F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1), reduction="none")
        starts = (np.asarray(rows, dtype=np.int64) - self.first) * self.context
        self.nats[(starts[:, None] + 1 + np.arange(self.context)).reshape(-1)] = lost.double().cpu().numpy()

    def compute(self) -> dict[str, Any]:
        return lm_eval.split_metrics(self.tokens, self.nats, byte_lengths(self.text), self.context)

    def write(self, out_dir: Path, metrics: dict[str, Any]) -> None:
        """bad_cases.json (the documents with the most bits per byte) and generations.json (samples from the fixed prompts)."""

        assert self.cfg is not None and self.text.tokenizer_file is not None
        tokenizer = load_tokenizer(self.text.tokenizer_file)
        cases = lm_eval.bad_cases(self.text, self.split, self.tokens, self.nats, byte_lengths(self.text), tokenizer, self.cfg.eval.bad_cases)
        generation = self.cfg.eval.generation
        generated = lm_eval.generations(cast(gpt.GPT, self.model), generation,
                                        lm_eval.prompts(generation, self.text, self.split, self.tokens, tokenizer), tokenizer)
        (out_dir / "bad_cases.json").write_text(json.dumps(cases, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (out_dir / "generations.json").write_text(json.dumps(generated, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def window_count(tokens: np.ndarray, context: int) -> int:
    """Full windows of context + 1 tokens starting every `context` tokens."""
    return max(0, (len(tokens) - 1) // context)


def byte_lengths(data: TextVersion) -> np.ndarray:
    """The UTF-8 bytes each token id spells (special tokens: 0)."""
    return _Lengths.of(data)


class _Lengths:
    _cache: dict[str, np.ndarray] = {}

    @classmethod
    def of(cls, data: TextVersion) -> np.ndarray:
        digest = str(data.info["tokenizer"]["sha256"])
        if digest not in cls._cache:
            assert data.tokenizer_file is not None
            tokenizer = load_tokenizer(data.tokenizer_file)
            lengths = np.array([len(b) for b in tokenizer.token_bytes], dtype=np.int64)
            lengths[list(tokenizer.special_ids.values())] = 0
            cls._cache[digest] = lengths
        return cls._cache[digest]


def _text(data: DataVersion) -> TextVersion:
    if not isinstance(data, TextVersion):
        raise UserError("task: lm trains on a text data version; set data.source to text, jsonl or pydoc_topics")
    return data
