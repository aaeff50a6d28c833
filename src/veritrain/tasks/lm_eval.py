"""The language model's evaluation (task lm, veritrain.tasks.lm): a split scored window by window without holding its
logits, per-document bits per byte for the bad cases, samples from fixed prompts, the byte baselines fit on train, and
the files of eval/<split>/ (metrics.json is the stage's; this writes bad_cases.json, generations.json, curves.png and
report.md, through the task's evaluator (LanguageModelEvaluation) and `write_report`).

Every position of a split's token array that a window predicts counts once: window k predicts tokens
k·context + 1 … (k+1)·context, so the split's first token and the tail after its last full window are not scored
(their count is in the metrics as `unscored_tokens`). A document is the run of tokens up to and including its
<|endoftext|>; its bits per byte are its scored nats / (ln 2 · the UTF-8 bytes its scored tokens spell).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from veritrain.core.baselines import judge
from veritrain.core.display import rows_axis
from veritrain.tasks import gpt, lm_metrics, lm_spec

if TYPE_CHECKING:
    from veritrain.core.config import GenerationConfig
    from veritrain.data.identity import TextVersion
    from veritrain.data.tokenizer import Tokenizer

PROMPT_DOCUMENTS = 3  # with eval.generation.prompts empty: the openings of this many documents of the evaluated split
EXCERPT_CHARS = 240  # of a bad case's text in bad_cases.json


@torch.no_grad()
def document_scores(tokens: np.ndarray, nats: np.ndarray, lengths: np.ndarray, end_of_text: int) -> tuple[np.ndarray, np.ndarray]:
    """(scored bytes, scored nats) of each document of a split's token array (a document ends with its end-of-text id)."""
    ends = np.asarray(tokens) == end_of_text
    document = np.concatenate([[0], np.cumsum(ends)[:-1]])  # the document each position belongs to
    count = int(ends.sum()) + (0 if len(tokens) == 0 or ends[-1] else 1)
    scored = ~np.isnan(nats)
    spelled = lengths[np.asarray(tokens, dtype=np.int64)]
    doc_bytes = np.bincount(document[scored], weights=spelled[scored], minlength=count)
    doc_nats = np.bincount(document[scored], weights=nats[scored], minlength=count)
    return doc_bytes, doc_nats


def split_metrics(tokens: np.ndarray, nats: np.ndarray, lengths: np.ndarray, context: int) -> dict[str, Any]:
    """loss, perplexity and bits per byte over every scored position, with the counts they come from."""
    scored = ~np.isnan(nats)
    spelled = int(lengths[np.asarray(tokens, dtype=np.int64)[scored]].sum())
    score = lm_metrics.lm_score(float(nats[scored].sum()), int(scored.sum()), spelled)
    return {"loss": score.loss_per_token, "perplexity": score.perplexity, "bits_per_byte": score.bits_per_byte,
            "tokens": int(scored.sum()), "bytes": spelled, "windows": max(0, (len(tokens) - 1) // context),
            "unscored_tokens": int(len(tokens) - scored.sum())}


def bad_cases(data: TextVersion, split: str, tokens: np.ndarray, nats: np.ndarray, lengths: np.ndarray, tokenizer: Tokenizer,
              count: int) -> list[dict[str, Any]]:
    """The `count` documents of `split` with the most bits per byte (ties: the lower document first), each with its id,
    bits per byte, scored bytes and the opening of its text."""
    doc_bytes, doc_nats = document_scores(tokens, nats, lengths, tokenizer.end_of_text_id)
    per_byte = np.where(doc_bytes > 0, doc_nats / (math.log(2) * np.maximum(doc_bytes, 1)), -np.inf)  # unscored: never a bad case
    ids = sorted(data.sample_ids[int(r)] for r in data.splits[split])  # the token array holds them in id order
    bounds = np.concatenate([[0], np.flatnonzero(np.asarray(tokens) == tokenizer.end_of_text_id) + 1])
    cases = []
    for index in lm_metrics.worst_documents(per_byte, count):
        if not doc_bytes[index] > 0:
            break
        start = int(bounds[index])
        end = int(bounds[index + 1]) - 1 if index + 1 < len(bounds) else len(tokens)
        text = tokenizer.decode(np.asarray(tokens[start:min(end, start + 4 * EXCERPT_CHARS)]))
        cases.append({"rank": len(cases) + 1, "sample_id": ids[index] if index < len(ids) else None,
                      "bits_per_byte": float(per_byte[index]), "scored_bytes": int(doc_bytes[index]),
                      "excerpt": text[:EXCERPT_CHARS]})
    return cases


def prompts(cfg: GenerationConfig, data: TextVersion, split: str, tokens: np.ndarray, tokenizer: Tokenizer) -> list[str]:
    """The configured prompts, or the opening `prompt_chars` characters of the split's first documents."""
    if cfg.prompts:
        return list(cfg.prompts)
    chosen: list[str] = []
    start = 0
    ends = np.flatnonzero(np.asarray(tokens) == tokenizer.end_of_text_id)
    for end in ends[:PROMPT_DOCUMENTS]:
        opening = tokenizer.decode(np.asarray(tokens[start:min(int(end), start + 4 * cfg.prompt_chars)]))[: cfg.prompt_chars]
        if opening:
            chosen.append(opening)
        start = int(end) + 1
    return chosen


def generations(model: gpt.GPT, cfg: GenerationConfig, texts: list[str], tokenizer: Tokenizer) -> dict[str, Any]:
    """Samples from `texts` with the configured seed (prompt i: seed + i), temperature and top-k; each with the ids it drew."""
    samples = []
    for i, prompt in enumerate(texts):
        ids = [int(t) for t in tokenizer.encode(prompt)][-model.cfg.context:]
        drawn = gpt.generate(model, ids, cfg.tokens, cfg.temperature, cfg.seed + i, cfg.top_k) if ids else []
        samples.append({"prompt": prompt, "seed": cfg.seed + i, "text": tokenizer.decode(drawn), "token_ids": drawn})
    return {"tokens": cfg.tokens, "temperature": cfg.temperature, "top_k": cfg.top_k, "samples": samples}


def fit_baselines(data: TextVersion, split: str, tokenizer: Tokenizer) -> dict[str, Any]:
    """A byte unigram and a byte bigram interpolated with it (λ chosen on val), fit on the train split's bytes and scored
    on `split`'s, in bits per byte; the bytes are what the split's tokens spell, documents joined without separator."""
    def spelled(name: str) -> np.ndarray:
        table = tokenizer.token_bytes
        specials = set(tokenizer.special_ids.values())
        return np.frombuffer(b"".join(table[t] for t in np.asarray(data.tokens[name]).tolist() if t not in specials), dtype=np.uint8)

    train, val, evaluated = spelled("train"), spelled("val"), spelled(split)
    fitted = lm_metrics.byte_baselines(train, val if len(val) else train, evaluated)
    return {
        "split": split,
        "metric": "bits_per_byte",
        "results": {"unigram": {"bits_per_byte": fitted.unigram_bits_per_byte, "bytes": int(len(evaluated))},
                    "bigram": {"bits_per_byte": fitted.bigram_bits_per_byte, "bytes": int(len(evaluated)), "lambda": fitted.bigram_lambda}},
        "bigram": {"train_bytes": int(len(train)), "val_bytes": int(len(val)), "lambda_chosen_on": "val" if len(val) else "train",
                   "val_bits_per_byte": {f"{k:g}": v for k, v in fitted.val_bits_per_byte.items()}},
    }


def baseline_warning(metrics: dict[str, Any], baselines: Optional[dict[str, Any]]) -> Optional[str]:
    """A warning when the model's bits per byte are not `margin` below the bigram's (veritrain.core.baselines judges)."""

    return judge(metrics, baselines, lm_spec.SPEC.baseline_rule()).warning


def report_markdown(metrics: dict[str, Any], baselines: Optional[dict[str, Any]], run_id: str, cases: list[dict[str, Any]],
                    generated: list[dict[str, Any]]) -> str:
    """eval/<split>/report.md: the metrics, the baselines beside them, the samples and the bad cases (as code spans: a
    document's text is shown, never rendered)."""
    split = metrics.get("split", "?")
    lines = [f"# Evaluation of run {run_id} on the {split} split", "",
             f"bits per byte **{metrics['bits_per_byte']:.4f}**, loss {metrics['loss']:.4f} nats/token, perplexity "
             f"{metrics['perplexity']:.2f} ({metrics['tokens']} tokens, {metrics['bytes']} bytes, {metrics['windows']} windows)"]
    if baselines:
        lines += ["", "## Model vs baselines (same splits, bits per byte)", "", "| model | bits per byte |", "|---|---|",
                  f"| this model | {metrics['bits_per_byte']:.4f} |"]
        for name, result in (baselines.get("results") or {}).items():
            lines.append(f"| {name} | {result['bits_per_byte']:.4f} |")
        warning = baseline_warning(metrics, baselines)
        if warning:
            lines += ["", f"**warning:** {warning}"]
    if generated:
        lines += ["", "## Samples", ""]
        for sample in generated:
            lines.append(f"- prompt `{_code(sample['prompt'])}` → `{_code(sample['text'])}`")
    if cases:
        lines += ["", "## Documents with the most bits per byte", "", "| rank | document | bits per byte | excerpt |", "|---|---|---|---|"]
        for case in cases:
            lines.append(f"| {case['rank']} | `{_code(str(case['sample_id']))}` | {case['bits_per_byte']:.4f} | `{_code(case['excerpt'][:80])}` |")
    return "\n".join(lines) + "\n"


def _code(text: str) -> str:
    """Text inside a Markdown code span on one table row: no backtick, pipe or line break can end it."""
    return " ".join(text.replace("`", "'").replace("|", "¦").split())


def plot_curves(path: Path, history: list[dict[str, Any]]) -> None:
    """Train and val loss per epoch, or per validation step (nats per token)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [h for h in history if "epoch" in h and "train_loss" in h]
    if not rows:
        return
    unit, xs = rows_axis(rows)
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot(xs, [h["train_loss"] for h in rows], label="train loss")
    val = [(x, h["val_loss"]) for x, h in zip(xs, rows) if isinstance(h.get("val_loss"), float)]
    if val:
        axis.plot([x for x, _ in val], [v for _, v in val], label="val loss")
    axis.set_xlabel(unit)
    axis.set_ylabel("nats per token")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)
