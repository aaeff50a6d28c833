"""Language-model evaluation figures that do not depend on the tokenizer, in numpy.

A model's summed loss becomes loss per token, perplexity and bits per byte; bits per byte divides by the UTF-8
bytes of the text, not by tokens, so models with different tokenizers compare. The byte baselines (a unigram
and a bigram interpolated with it) are fit on train bytes and scored on bytes, for the same reason. And the
documents with the highest loss are picked out for a person to read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

BYTE_VALUES = 256
# λ, the bigram's weight in the interpolation, is chosen on val from these. Dense near 1: on a few hundred KB of English
# the best λ is 0.99-0.995 (the pydoc corpus: 0.995). 1.0 is left out: a byte pair never seen in train would get
# probability 0 and the text an infinite cost
LAMBDA_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)


@dataclass(frozen=True)
class LMScore:
    tokens: int  # predicted positions whose losses were summed (a window's first token, never predicted, is not one)
    text_bytes: int  # UTF-8 bytes of the text those predicted tokens spell
    total_nats: float  # summed cross-entropy of those tokens, natural log
    loss_per_token: float  # nats per predicted token
    perplexity: float  # exp(loss_per_token): per token, so it changes with the tokenizer
    bits_per_byte: float  # total_nats / (ln 2 · text_bytes): the cost of coding the text, comparable across tokenizers


def lm_score(total_nats: float, tokens: int, text_bytes: int) -> LMScore:
    """The figures of one evaluation from the summed loss (nats) of `tokens` predicted tokens that spell `text_bytes`
    UTF-8 bytes. Count the bytes of exactly the tokens whose loss was summed; a token that was only context (the first
    of a document) counts in neither, or the bits per byte come out too low."""
    if tokens < 1 or text_bytes < 1:
        raise ValueError(f"an evaluation needs at least one token and one byte, got {tokens} tokens, {text_bytes} bytes")
    loss = total_nats / tokens
    return LMScore(tokens=tokens, text_bytes=text_bytes, total_nats=total_nats, loss_per_token=loss,
                   perplexity=math.exp(loss) if loss < 700 else math.inf,  # exp overflows float64 past ~709
                   bits_per_byte=total_nats / (math.log(2) * text_bytes))


def _as_bytes(data: Union[np.ndarray, bytes]) -> np.ndarray:
    array = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else np.asarray(data)
    if array.dtype != np.uint8 or array.ndim != 1:
        raise ValueError(f"expected a 1-D uint8 array of bytes, got {array.dtype} with shape {array.shape}")
    return array


# ---------------------------------------------------------------- byte baselines


def byte_unigram(train: Union[np.ndarray, bytes]) -> np.ndarray:
    """P(byte), 256 float64 probabilities with add-one smoothing: (count + 1) / (train bytes + 256), so a byte
    never seen in train still has a finite cost."""
    counts = np.bincount(_as_bytes(train), minlength=BYTE_VALUES).astype(np.float64)
    return (counts + 1.0) / (counts.sum() + BYTE_VALUES)


def unigram_bits_per_byte(unigram: np.ndarray, data: Union[np.ndarray, bytes]) -> float:
    """Mean -log2 P(byte) over every byte of `data`."""
    data = _as_bytes(data)
    counts = np.bincount(data, minlength=BYTE_VALUES).astype(np.float64)
    return float(-(counts * np.log2(unigram)).sum() / max(1, len(data)))


@dataclass(frozen=True)
class ByteBigram:
    unigram: np.ndarray  # (256,) P(b), add-one smoothed (byte_unigram)
    conditional: np.ndarray  # (256, 256) P(b | previous a) by counts in train; a row of an unseen a is the unigram
    lam: float  # weight of `conditional` in P(b | a) = lam·conditional[a, b] + (1 - lam)·unigram[b]
    val_bits_per_byte: dict[float, float]  # each λ tried → bits per byte on val; `lam` has the lowest


def _pair_counts(data: np.ndarray) -> np.ndarray:
    """(256, 256) counts of (previous byte, byte) over consecutive bytes."""
    pairs = data[:-1].astype(np.int64) * BYTE_VALUES + data[1:]
    return np.bincount(pairs, minlength=BYTE_VALUES * BYTE_VALUES).reshape(BYTE_VALUES, BYTE_VALUES).astype(np.float64)


def _bigram_bits(unigram: np.ndarray, conditional: np.ndarray, lam: float, data: np.ndarray) -> float:
    """Mean -log2 P over every byte of `data`: its first byte, which has no previous one, by the unigram; each later
    byte by the interpolated bigram given the byte before it."""
    if len(data) == 0:
        return 0.0
    probs = lam * conditional + (1.0 - lam) * unigram[None, :]
    total = -math.log2(unigram[data[0]]) - float((_pair_counts(data) * np.log2(probs)).sum())
    return total / len(data)


def fit_byte_bigram(train: Union[np.ndarray, bytes], val: Union[np.ndarray, bytes],
                    grid: Sequence[float] = LAMBDA_GRID) -> ByteBigram:
    """Counts from `train`; λ the value of `grid` with the fewest bits per byte on `val` (the smaller λ on a tie)."""
    train, val = _as_bytes(train), _as_bytes(val)
    if any(not 0.0 <= lam < 1.0 for lam in grid) or not grid:
        raise ValueError(f"λ grid: expected values in [0, 1), got {list(grid)}")
    unigram = byte_unigram(train)
    pairs = _pair_counts(train)
    seen = pairs.sum(axis=1, keepdims=True)  # times each byte was followed by another one in train
    conditional = np.where(seen > 0, pairs / np.maximum(seen, 1.0), unigram[None, :])
    scores = {float(lam): _bigram_bits(unigram, conditional, float(lam), val) for lam in grid}
    best = min(sorted(scores), key=lambda lam: scores[lam])  # sorted: the smaller λ wins a tie
    return ByteBigram(unigram=unigram, conditional=conditional, lam=best, val_bits_per_byte=scores)


def bigram_bits_per_byte(model: ByteBigram, data: Union[np.ndarray, bytes]) -> float:
    return _bigram_bits(model.unigram, model.conditional, model.lam, _as_bytes(data))


@dataclass(frozen=True)
class ByteBaselines:
    unigram_bits_per_byte: float  # on the evaluated bytes
    bigram_bits_per_byte: float  # on the evaluated bytes
    bigram_lambda: float  # chosen on val
    val_bits_per_byte: dict[float, float]  # the bigram's score on val for each λ tried


def byte_baselines(train: Union[np.ndarray, bytes], val: Union[np.ndarray, bytes],
                   evaluated: Union[np.ndarray, bytes]) -> ByteBaselines:
    """Both baselines fit on `train` (the bigram's λ on `val`) and scored on `evaluated`, in bits per byte."""
    bigram = fit_byte_bigram(train, val)
    return ByteBaselines(unigram_bits_per_byte=unigram_bits_per_byte(bigram.unigram, evaluated),
                         bigram_bits_per_byte=bigram_bits_per_byte(bigram, evaluated),
                         bigram_lambda=bigram.lam, val_bits_per_byte=bigram.val_bits_per_byte)


# ---------------------------------------------------------------- bad cases


def worst_documents(losses: Union[Sequence[float], np.ndarray], k: int) -> list[int]:
    """Indices of the `k` documents with the highest loss, highest first; equal losses keep document order (the lower
    index first) and a NaN loss ranks above every number (a document the model cannot score is the worst case).
    Pass a per-byte or per-token loss, not a document's sum, or the longest documents win."""
    values = np.asarray(losses, dtype=np.float64).reshape(-1)
    if k < 0:
        raise ValueError(f"k: expected a count ≥ 0, got {k}")
    nan = np.isnan(values)
    # np.lexsort sorts by its last key first: NaN first, then higher loss, then lower index
    order = np.lexsort((np.arange(len(values)), -np.where(nan, 0.0, values), ~nan))
    return [int(i) for i in order[:k]]
