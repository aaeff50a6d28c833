"""The small GPT (veritrain.tasks.gpt) and the tokenizer-free LM figures (veritrain.tasks.lm_metrics): causality,
tying, init and sampling reproducibility, the optimizer rules, a few training steps, DDP, ONNX parity, and the metric
formulas on hand-computed examples. Tiny models on one thread: the file runs in a few seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from veritrain.core.errors import UserError
from veritrain.tasks import gpt, lm_metrics
from veritrain.tasks.gpt import GPT, GPTConfig

torch.set_num_threads(1)

TINY = GPTConfig(vocab_size=48, context=16, layers=2, width=32, heads=4)


def _ids(shape: tuple[int, ...], vocab: int = TINY.vocab_size, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- the model


def test_logits_shape_and_causality():
    model = GPT(TINY, seed=0).eval()
    idx = _ids((2, TINY.context))
    changed = idx.clone()
    changed[:, 9] = (changed[:, 9] + 1) % TINY.vocab_size  # a different token at position 9 only
    with torch.no_grad():
        before, after = model(idx), model(changed)
    assert before.shape == (2, TINY.context, TINY.vocab_size) and before.dtype == torch.float32
    # positions 0-8 cannot see position 9: bit-identical; position 9 onwards do see it
    assert torch.equal(before[:, :9], after[:, :9])
    assert not torch.allclose(before[:, 9:], after[:, 9:])


def test_a_window_longer_than_the_context_is_refused():
    with pytest.raises(ValueError, match="more than the model's context of 16"):
        GPT(TINY)(_ids((1, TINY.context + 1)))


def test_tied_embeddings_are_one_tensor_counted_once():
    tied = GPT(TINY)
    assert tied.head.weight is tied.token_embedding.weight
    untied = GPT(GPTConfig(**{**TINY.__dict__, "tied_embeddings": False}))
    assert untied.head.weight is not untied.token_embedding.weight
    # the untied model has one more vocab × width matrix; the tied one lists its matrix once
    assert gpt.parameter_count(untied) - gpt.parameter_count(tied) == TINY.vocab_size * TINY.width
    assert sum(1 for _ in tied.parameters()) == sum(1 for _ in untied.parameters()) - 1


def test_the_same_seed_gives_bit_identical_weights_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = GPT(TINY, seed=7), GPT(TINY, seed=7), GPT(TINY, seed=8)
    assert torch.equal(torch.random.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[name], sb[name]) for name in sa)
    assert not torch.equal(sa["token_embedding.weight"], sc["token_embedding.weight"])


def test_init_follows_the_documented_rule():
    cfg = GPTConfig(vocab_size=512, context=64, layers=8, width=64, heads=4)
    model = GPT(cfg, seed=0)
    # std of 32768 draws: within 5% of the target (the standard error of a std estimate is std/sqrt(2n), ~0.4%)
    assert model.token_embedding.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(model.blocks[0].attn.qkv.bias, torch.zeros(3 * cfg.width))
    assert torch.equal(model.ln_final.weight, torch.ones(cfg.width))
    assert torch.equal(model.ln_final.bias, torch.zeros(cfg.width))


@pytest.mark.parametrize("change, message", [
    ({"width": 30}, "gpt.width: 30 is not a multiple of gpt.heads (4); choose a width that heads divides"),
    ({"heads": 0}, "gpt.heads: expected a positive integer, got 0"),
    ({"vocab_size": 2.5}, "gpt.vocab_size: expected a positive integer, got 2.5"),
    ({"layers": True}, "gpt.layers: expected a positive integer, got True"),
    ({"context": -1}, "gpt.context: expected a positive integer, got -1"),
    ({"dropout": 1.0}, "gpt.dropout: expected a probability in [0, 1), got 1.0"),
    ({"tied_embeddings": "yes"}, "gpt.tied_embeddings: expected true or false, got 'yes'"),
])
def test_config_validation_names_the_key(change, message):
    with pytest.raises(UserError) as err:
        GPTConfig(**{**TINY.__dict__, **change})
    assert str(err.value) == message


# ---------------------------------------------------------------- optimization


def test_weight_decay_goes_to_linear_matrices_only():
    for tied in (True, False):
        model = GPT(GPTConfig(**{**TINY.__dict__, "tied_embeddings": tied}))
        decay, no_decay = gpt.weight_decay_split(model)
        expected = [f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")]
        # an untied head is a Linear matrix and decays; tied, it is the token embedding and does not
        assert decay == expected + ([] if tied else ["head.weight"])
        assert "token_embedding.weight" in no_decay and "position_embedding.weight" in no_decay
        assert all(name.endswith("bias") or ".ln" in name or name.startswith(("ln_", "token_", "position_"))
                   for name in no_decay)
        groups = gpt.param_groups(model, weight_decay=0.1)
        assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
        listed = [id(p) for g in groups for p in g["params"]]
        assert sorted(listed) == sorted(id(p) for p in model.parameters())  # every parameter, once
        torch.optim.AdamW(groups, lr=1e-3)  # accepted as they are


def _repeating_text() -> tuple[torch.Tensor, int]:
    text = "the cat sat on the mat. " * 20
    alphabet = sorted(set(text))
    return torch.tensor([alphabet.index(c) for c in text]), len(alphabet)


def test_a_few_steps_on_a_repeating_text_reduce_the_loss_with_deterministic_algorithms():
    data, vocab = _repeating_text()
    model = GPT(GPTConfig(vocab_size=vocab, context=16, layers=2, width=32, heads=4), seed=0)
    optimizer = torch.optim.AdamW(gpt.param_groups(model, 0.1), lr=1e-2)
    starts = torch.arange(0, len(data) - 17, 7)
    x = torch.stack([data[s:s + 16] for s in starts])
    y = torch.stack([data[s + 1:s + 17] for s in starts])
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        losses = []
        for _ in range(25):
            loss = gpt.lm_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            # DDP without find_unused_parameters needs a gradient for every parameter after each backward
            assert all(p.grad is not None for p in model.parameters())
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.use_deterministic_algorithms(previous)
    assert losses[0] == pytest.approx(math.log(vocab), rel=0.1)  # a fresh model is near uniform
    assert losses[-1] < 0.5 * losses[0]


def test_summed_nats_is_the_mean_loss_times_the_positions():
    logits, targets = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0)), _ids((3, 5), vocab=11)
    assert gpt.summed_nats(logits, targets) == pytest.approx(15 * gpt.lm_loss(logits, targets).item(), rel=1e-6)


def test_ddp_trains_without_unused_parameters(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = DistributedDataParallel(GPT(TINY, seed=0), find_unused_parameters=False)
        optimizer = torch.optim.AdamW(gpt.param_groups(model.module, 0.1), lr=1e-3)
        x, y = _ids((2, TINY.context)), _ids((2, TINY.context), seed=1)
        for _ in range(2):  # an unused parameter makes the second step fail: its reduction never finished
            optimizer.zero_grad()
            gpt.lm_loss(model(x), y).backward()
            optimizer.step()
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- sampling


def test_generate_is_reproducible_per_seed_and_uses_its_own_generator():
    model = GPT(TINY, seed=0)
    prompt = [1, 2, 3]
    state = torch.random.get_rng_state()
    a = gpt.generate(model, prompt, 40, temperature=1.0, seed=5)
    b = gpt.generate(model, torch.tensor(prompt), 40, temperature=1.0, seed=5)
    c = gpt.generate(model, prompt, 40, temperature=1.0, seed=6)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a == b and a != c
    assert len(a) == 40 and all(0 <= i < TINY.vocab_size for i in a)
    assert model.training  # put back in the mode it was in


def test_greedy_and_top_k():
    model = GPT(TINY, seed=0).eval()
    greedy = gpt.generate(model, [4], 10, temperature=0.0, seed=0)
    assert greedy == gpt.generate(model, [4], 10, temperature=0.0, seed=99)  # the seed plays no part
    assert greedy == gpt.generate(model, [4], 10, temperature=1.0, seed=3, top_k=1)
    ids = [4]
    for token in greedy[:3]:  # greedy is the argmax of the last position, step by step
        with torch.no_grad():
            assert token == int(model(torch.tensor([ids]))[0, -1].argmax())
        ids.append(token)


def test_generate_crops_to_the_context():
    model = GPT(TINY, seed=0)
    long_prompt = _ids((3 * TINY.context,)).tolist()
    out = gpt.generate(model, long_prompt, 5, temperature=0.0, seed=0)
    assert out == gpt.generate(model, long_prompt[-TINY.context:], 5, temperature=0.0, seed=0)
    with pytest.raises(UserError, match="prompt: empty"):
        gpt.generate(model, [], 5, 1.0, 0)
    with pytest.raises(UserError, match="temperature"):
        gpt.generate(model, [1], 5, -1.0, 0)


# ---------------------------------------------------------------- metrics


def test_lm_score_formulas():
    # 4 tokens, 6 nats in all, spelling 3 bytes: 1.5 nats per token, perplexity e^1.5, 6 / (ln 2 · 3) bits per byte
    score = lm_metrics.lm_score(total_nats=6.0, tokens=4, text_bytes=3)
    assert score.loss_per_token == 1.5
    assert score.perplexity == pytest.approx(math.exp(1.5))
    assert score.bits_per_byte == pytest.approx(2.0 / math.log(2))
    # a uniform byte model costs ln 256 nats per byte: exactly 8 bits per byte
    assert lm_metrics.lm_score(10 * math.log(256), 10, 10).bits_per_byte == pytest.approx(8.0)
    with pytest.raises(ValueError):
        lm_metrics.lm_score(1.0, 0, 1)


def test_unigram_by_hand():
    # train "aab": counts a=2, b=1; add-one over 256 values: P(a) = 3/259, P(b) = 2/259
    unigram = lm_metrics.byte_unigram(b"aab")
    assert unigram[ord("a")] == pytest.approx(3 / 259) and unigram[ord("z")] == pytest.approx(1 / 259)
    assert unigram.sum() == pytest.approx(1.0)
    expected = -(math.log2(3 / 259) + math.log2(2 / 259)) / 2
    assert lm_metrics.unigram_bits_per_byte(unigram, b"ab") == pytest.approx(expected)


def test_bigram_by_hand():
    # train "abab": pairs ab, ba, ab → P(b|a) = 1, P(a|b) = 1; P(a) = P(b) = 3/260
    bigram = lm_metrics.fit_byte_bigram(b"abab", b"ab", grid=(0.5,))
    assert bigram.lam == 0.5 and bigram.conditional[ord("a"), ord("b")] == 1.0
    assert bigram.conditional[ord("z")].tolist() == bigram.unigram.tolist()  # an unseen previous byte: the unigram
    uni = 3 / 260
    # "aba": the first byte by the unigram, then 0.5·1 + 0.5·uni twice
    expected = -(math.log2(uni) + 2 * math.log2(0.5 + 0.5 * uni)) / 3
    assert lm_metrics.bigram_bits_per_byte(bigram, b"aba") == pytest.approx(expected)


def test_lambda_is_chosen_on_val():
    train = b"abcabcabcabc" * 10
    # val that follows train's pairs: the most bigram weight wins; val of pairs train never had: none (λ = 0)
    assert lm_metrics.fit_byte_bigram(train, b"abcabcabc").lam == lm_metrics.LAMBDA_GRID[-1]
    assert lm_metrics.fit_byte_bigram(train, b"acbacbacb").lam == 0.0
    scores = lm_metrics.fit_byte_bigram(train, b"abcabcabc").val_bits_per_byte
    assert list(scores) == list(lm_metrics.LAMBDA_GRID)


def test_bigram_beats_unigram_on_english_text():
    from veritrain.data.text_corpus import embedded_topics

    topics = list(embedded_topics().values())
    as_bytes = lambda texts: np.frombuffer("\n".join(texts).encode("utf-8"), dtype=np.uint8)  # noqa: E731
    train, val, test = as_bytes(topics[2::3] + topics[1::3]), as_bytes(topics[0::6]), as_bytes(topics[3::6])
    baselines = lm_metrics.byte_baselines(train, val, test)
    assert 0.9 <= baselines.bigram_lambda < 1.0
    assert baselines.val_bits_per_byte[baselines.bigram_lambda] == min(baselines.val_bits_per_byte.values())
    # English bytes: a unigram near 4.8 bits, a bigram near 3.8, both far from the 8 of a uniform guess
    assert baselines.bigram_bits_per_byte < baselines.unigram_bits_per_byte - 0.5
    assert 4.0 < baselines.unigram_bits_per_byte < 5.5


def test_worst_documents_is_a_stable_top_k():
    losses = [1.0, 3.0, 2.0, 3.0, float("nan"), 0.5]
    assert lm_metrics.worst_documents(losses, 3) == [4, 1, 3]  # NaN first, then the tie in document order
    assert lm_metrics.worst_documents(losses, 10) == [4, 1, 3, 2, 0, 5]
    assert lm_metrics.worst_documents(np.array(losses), 0) == []
    assert lm_metrics.worst_documents([], 2) == []
