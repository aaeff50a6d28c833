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

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from veritrain.core.errors import UserError
from veritrain.tasks import gpt, lm_metrics

if TYPE_CHECKING:
    from veritrain.core.config import ModelConfig, RunConfig
    from veritrain.data.identity import DataVersion, TextVersion


class LanguageModelTask:
    name = "lm"
    epoch_metrics: tuple[str, ...] = ()
    best_metric = ("val_loss", "min")

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.context = cfg.model.context

    # ------------------------------------------------------------ data

    def rows(self, data: DataVersion, split: str) -> np.ndarray:
        """The rows of `split`: its windows, numbered after those of the splits before it (train, val, test), so that a
        row names its split and window alone."""
        start, count = self._layout(data)[split]
        return np.arange(start, start + count, dtype=np.int64)

    def _layout(self, data: DataVersion) -> dict[str, tuple[int, int]]:
        """split → (first row, windows)."""
        from veritrain.data.split import SPLITS

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

    def build_model(self, cfg: ModelConfig, data: DataVersion) -> torch.nn.Module:
        tokenizer = _text(data).info["tokenizer"]
        return gpt.GPT(gpt.GPTConfig(vocab_size=int(tokenizer["vocab_size"]), context=cfg.context, layers=cfg.layers, width=cfg.width,
                                     heads=cfg.heads, dropout=cfg.dropout, tied_embeddings=cfg.tied_embeddings), seed=self.cfg.seed)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return gpt.lm_loss(outputs, targets)

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        return {}

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor, data: DataVersion) -> dict[str, Any]:
        nats = gpt.summed_nats(outputs, targets)
        spelled = int(self._byte_lengths(data)[targets.numpy()].sum())
        score = lm_metrics.lm_score(nats, int(targets.numel()), spelled)
        return {"loss": score.loss_per_token, "perplexity": score.perplexity, "bits_per_byte": score.bits_per_byte,
                "tokens": int(targets.numel()), "bytes": spelled, "windows": int(targets.shape[0])}

    def _byte_lengths(self, data: DataVersion) -> np.ndarray:
        return byte_lengths(_text(data))


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
            from veritrain.data.tokenizer import load_tokenizer

            assert data.tokenizer_file is not None
            tokenizer = load_tokenizer(data.tokenizer_file)
            lengths = np.array([len(b) for b in tokenizer.token_bytes], dtype=np.int64)
            lengths[list(tokenizer.special_ids.values())] = 0
            cls._cache[digest] = lengths
        return cls._cache[digest]


def _text(data: DataVersion) -> TextVersion:
    from veritrain.data.identity import TextVersion

    if not isinstance(data, TextVersion):
        raise UserError("task: lm trains on a text data version; set data.source to text, jsonl or pydoc_topics")
    return data
