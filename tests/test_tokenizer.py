"""veritrain.data.tokenizer: BPE training gives the same file bytes in every process and at every thread count,
every encodable string round-trips, bad tokenizer files are one-line UserErrors naming the file, the SHA-256 is
of the file's bytes, and token files round-trip with the tokenizer's dtype."""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import need_extra

from veritrain.core.errors import UserError
from veritrain.data.text_corpus import embedded_topics
from veritrain.data.tokenizer import END_OF_TEXT, byte_level, load_tokenizer, read_tokens, train_bpe, write_tokens

SRC = Path(__file__).resolve().parents[1] / "src"
# BPE needs the tokenizers package (the lm extra), which the test-slow install has: those tests run there
BPE = pytest.mark.slow

# The file train_bpe(corpus, 2048) writes with tokenizers 0.23.3. Pinned because the file's bytes are the
# tokenizer's identity: a tokenizers release (or a change here) that trains other merges, or writes them otherwise,
# makes another tokenizer, and must be seen, not slip into new data versions unnoticed.
CORPUS_2048_SHA256 = "b58a6f2d3723e0485ec2079a1b3b3cb79c6251709620cb7c1c3ec9dd1f760a03"

TRAIN_AND_PRINT = (
    "import sys\n"
    "from veritrain.data.text_corpus import embedded_topics\n"
    "from veritrain.data.tokenizer import train_bpe\n"
    "sys.stdout.buffer.write(train_bpe(list(embedded_topics().values()), 2048).file_bytes)\n"
)

HOSTILE = [
    "", "\x00", "a\x00b\x00", "\r\n", "line one\r\nline two\r\n\r\n", "\r", "\ufeffbyte-order mark", "\t \t  \n\n   ",
    "emoji 🤗 family 👩‍👩‍👧 flag 🇫🇷", "combining e\u0301 and Å", "\U0010ffff\U000e0001", "\x7f\x80\x9f\xa0\xad\xff",
    "日本語のテキスト", "مرحبا بالعالم", f"a literal {END_OF_TEXT} inside text", "<|endoftext", "'s 're 'll'd", "   leading",
    "1234567890 3.14159 -0", "x" * 5000, " " * 300, "\u2028\u2029\x0b\x0c\x1c",
]

HAND_WRITTEN_BPE = b"""{
 "type": "bpe",
 "version": 1,
 "vocab_size": 259,
 "dtype": "uint16",
 "pre_tokenizer": "gpt2-regex",
 "special_tokens": [
  {"id": 256, "text": "<|endoftext|>"}
 ],
 "merges": [
  [104, 105],
  [257, 115]
 ]
}
"""  # two merges: "h" + "i" is 257, "hi" + "s" is 258


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return list(embedded_topics().values())


def need_tokenizers() -> None:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        need_extra(False, "BPE needs the tokenizers package (veritrain[lm])")


@pytest.fixture(scope="module")
def bpe(corpus):
    need_tokenizers()
    return train_bpe(corpus, 2048)


def _train_in_processes(threads: list[int]) -> list[bytes]:
    """The file bytes train_bpe writes in a fresh process per entry, with RAYON_NUM_THREADS set to it (two at a
    time: the machine's two cores)."""
    outputs: list[bytes] = []
    for start in range(0, len(threads), 2):
        procs = []
        for count in threads[start:start + 2]:
            env = dict(os.environ, RAYON_NUM_THREADS=str(count), PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
            procs.append(subprocess.Popen([sys.executable, "-c", TRAIN_AND_PRINT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            outputs.append(out)
    return outputs


@BPE
def test_bpe_training_gives_the_pinned_file_in_five_processes_at_one_thread_and_five_at_two(bpe):
    """tokenizers' BpeTrainer has no seed and its hash maps are seeded afresh in every process; byte-level BPE must
    still give one file (about 5 s: ten processes, two at a time)."""
    outputs = _train_in_processes([1] * 5 + [2] * 5)
    assert [hashlib.sha256(out).hexdigest() for out in outputs] == [CORPUS_2048_SHA256] * 10
    assert bpe.file_bytes == outputs[0] and bpe.sha256 == hashlib.sha256(bpe.file_bytes).hexdigest()
    assert (bpe.vocab_size, bpe.dtype, bpe.special_ids) == (2048, np.uint16, {END_OF_TEXT: 256})


@pytest.mark.parametrize("kind", ["byte_level", pytest.param("bpe", marks=pytest.mark.slow)])
def test_the_corpus_and_hostile_strings_round_trip(kind, corpus, request):
    tokenizer = byte_level() if kind == "byte_level" else request.getfixturevalue("bpe")
    for text in corpus + HOSTILE:
        ids = tokenizer.encode(text)
        assert ids.dtype == np.uint16 and ids.ndim == 1
        assert tokenizer.decode(ids) == text
        assert tokenizer.end_of_text_id not in ids  # a special token's text in a document stays plain text
    encoded_bytes = sum(len(tokenizer.encode(t)) for t in corpus)
    if kind == "byte_level":
        assert tokenizer.encode("é\x00").tolist() == [0xC3, 0xA9, 0] and encoded_bytes == sum(len(t.encode()) for t in corpus)
    else:
        assert encoded_bytes < sum(len(t.encode()) for t in corpus) / 3  # BPE does compress


@BPE
def test_bpe_encodes_as_the_tokenizer_tokenizers_trained(corpus):
    """veritrain's ids for tokenizers' byte characters: the same tokens as tokenizers' own trained tokenizer, so
    the byte mapping and the id translation lose nothing."""
    need_tokenizers()
    import tokenizers

    ours = train_bpe(corpus[:20], 600)
    theirs = tokenizers.Tokenizer(tokenizers.models.BPE())
    theirs.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    theirs.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=599, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    theirs.train_from_iterator(corpus[:20], trainer=trainer)
    for text in corpus[20:30] + HOSTILE:
        theirs_tokens = [theirs.decoder.decode([t]) for t in theirs.encode(text).tokens]
        our_tokens = [ours.decode([i]) for i in ours.encode(text)]
        assert len(our_tokens) == len(theirs_tokens), text
        for our_token, their_token in zip(our_tokens, theirs_tokens):  # a token of part of a character reads as U+FFFD
            assert our_token == their_token or ("\ufffd" in our_token and "\ufffd" in their_token), text


def test_a_lone_surrogate_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"lone surrogate U\+D800 at character 1") as err:
        byte_level().encode("a\ud800b")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="training text 1: text has a lone surrogate U\\+DFFF"):
        train_bpe(["fine", "bad \udfff"], 300)


@BPE
def test_bpe_rejects_a_surrogate_when_encoding(bpe):
    with pytest.raises(UserError, match="lone surrogate"):
        bpe.encode("\udc80")


@BPE
def test_save_and_load_keep_the_bytes_and_the_behaviour(bpe, tmp_path, corpus):
    path = tmp_path / "tok.json"
    bpe.save(path)
    assert path.read_bytes() == bpe.file_bytes
    loaded = load_tokenizer(path)
    assert (loaded.sha256, loaded.vocab_size, loaded.merges, loaded.special_tokens) == (bpe.sha256, 2048, bpe.merges, bpe.special_tokens)
    assert loaded.encode(corpus[0]).tolist() == bpe.encode(corpus[0]).tolist()
    byte_path = tmp_path / "bytes.json"
    byte_level([END_OF_TEXT, "<|pad|>"]).save(byte_path)
    assert load_tokenizer(byte_path).special_ids == {END_OF_TEXT: 256, "<|pad|>": 257}
    assert byte_level().file_bytes == byte_level().file_bytes and byte_level().sha256 != byte_level([END_OF_TEXT, "<|pad|>"]).sha256


@BPE
def test_one_changed_byte_of_the_file_is_another_tokenizer(bpe, tmp_path, corpus):
    path = tmp_path / "tok.json"
    layout = bpe.file_bytes.replace(b'"type": "bpe"', b'"type":\t"bpe"', 1)  # one byte: the same content, a tab for a space
    assert len(layout) == len(bpe.file_bytes) and sum(a != b for a, b in zip(layout, bpe.file_bytes)) == 1
    path.write_bytes(layout)
    assert load_tokenizer(path).sha256 == hashlib.sha256(layout).hexdigest() != bpe.sha256
    changed = bpe.file_bytes.replace(b"  [32, 32],", b"  [32, 33],", 1)  # the first merge joins space and "!"
    path.write_bytes(changed)
    other = load_tokenizer(path)
    assert other.sha256 != bpe.sha256 and other.encode("a    b").tolist() != bpe.encode("a    b").tolist()


def _load_error(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "tok.json"
    path.write_bytes(data)
    with pytest.raises(UserError) as err:
        load_tokenizer(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


def test_bad_tokenizer_files_are_one_line_errors_naming_the_file_and_the_fix(tmp_path):
    good = byte_level([END_OF_TEXT, "<|pad|>"]).file_bytes
    assert "not valid JSON" in _load_error(tmp_path, b'{"type": "bpe",')
    assert "not UTF-8" in _load_error(tmp_path, b"\xff\xfe")
    assert "a JSON list, not an object" in _load_error(tmp_path, b"[]")
    assert "unknown tokenizer type 'wordpiece'" in _load_error(tmp_path, good.replace(b'"byte_level"', b'"wordpiece"'))
    assert "version 2" in _load_error(tmp_path, good.replace(b'"version": 1', b'"version": 2'))
    assert "key 'dtype' appears twice" in _load_error(tmp_path, good.replace(b'"dtype": "uint16"', b'"dtype": "uint16", "dtype": "uint32"'))
    assert "unknown key 'comment'" in _load_error(tmp_path, good.replace(b'"version": 1', b'"comment": "", "version": 1'))
    assert "<|endoftext|> (the document separator) is missing" in _load_error(tmp_path, good.replace(b"<|endoftext|>", b"<|eot|>"))
    assert "'<|endoftext|>' is listed twice" in _load_error(tmp_path, good.replace(b'"text": "<|pad|>"', b'"text": "<|endoftext|>"'))
    assert "collides with byte token 65" in _load_error(tmp_path, good.replace(b'"id": 256', b'"id": 65'))
    assert "collide on id 256" in _load_error(tmp_path, good.replace(b'"id": 257', b'"id": 256'))
    assert "expected 257" in _load_error(tmp_path, good.replace(b'"id": 257', b'"id": 300'))
    assert "vocab_size 300 does not match the 258 tokens" in _load_error(tmp_path, good.replace(b'"vocab_size": 258', b'"vocab_size": 300'))
    assert "dtype 'int8' is not one of uint16, uint32" in _load_error(tmp_path, good.replace(b'"uint16"', b'"int8"'))
    assert "a byte_level tokenizer has no merges" in _load_error(tmp_path, good.replace(b'"version": 1', b'"merges": [], "version": 1'))
    bpe = HAND_WRITTEN_BPE
    assert "merge 0 [256, 105] names id 256, which is a special token" in _load_error(tmp_path, bpe.replace(b"[104, 105]", b"[256, 105]"))
    assert "merge 0 [257, 105] names id 257, which is a special token or not yet made" in _load_error(tmp_path, bpe.replace(b"[104, 105]", b"[257, 105]"))
    assert "not a pair of token ids" in _load_error(tmp_path, bpe.replace(b"[104, 105]", b'[104, "105"]'))
    assert "not a pair of token ids" in _load_error(tmp_path, bpe.replace(b"[104, 105]", b"[104, true]"))
    assert "pre_tokenizer 'whitespace'" in _load_error(tmp_path, bpe.replace(b'"gpt2-regex"', b'"whitespace"'))
    missing = tmp_path / "absent.json"
    with pytest.raises(UserError, match=f"^{missing}: cannot read the tokenizer file"):
        load_tokenizer(missing)


def test_the_dtype_is_uint16_while_the_vocabulary_fits_and_a_file_may_not_declare_less(tmp_path):
    extra = [f"<|s{i}|>" for i in range(65536 - 257)]
    fits = byte_level([END_OF_TEXT] + extra)  # 65536 ids: 0-65535, the most uint16 holds
    over = byte_level([END_OF_TEXT] + extra + ["<|one more|>"])
    assert (fits.vocab_size, fits.dtype, over.vocab_size, over.dtype) == (65536, np.uint16, 65537, np.uint32)
    assert over.encode("ab").dtype == np.uint32
    message = _load_error(tmp_path, over.file_bytes.replace(b'"uint32"', b'"uint16"'))
    assert "the vocabulary of 65537 tokens exceeds the declared dtype uint16" in message


def test_bad_arguments_to_train_and_byte_level_are_user_errors():
    with pytest.raises(UserError, match="vocab_size 256 must be a whole number from 257"):
        train_bpe(["text"], 256)  # refused before tokenizers is needed
    with pytest.raises(UserError, match="lack <\\|endoftext\\|>"):
        byte_level(["<|pad|>"])
    with pytest.raises(UserError, match="repeat a token"):
        byte_level([END_OF_TEXT, END_OF_TEXT])
    with pytest.raises(UserError, match="token id 300 is outside this tokenizer's vocabulary \\(0-256\\)"):
        byte_level().decode([1, 300])


def test_a_small_text_makes_fewer_merges_than_asked_and_still_loads(tmp_path):
    need_tokenizers()
    tokenizer = train_bpe(["abab abab"], 1000)
    assert 257 < tokenizer.vocab_size < 1000 and tokenizer.decode(tokenizer.encode("abab xyz")) == "abab xyz"
    tokenizer.save(tmp_path / "tok.json")
    assert load_tokenizer(tmp_path / "tok.json").file_bytes == tokenizer.file_bytes


@BPE
def test_tokens_are_written_per_document_with_the_separator_and_read_back(bpe, tmp_path, corpus):
    documents = corpus[:10] + HOSTILE[:5]
    path = tmp_path / "train.bin"
    count = write_tokens(iter(documents), bpe, path)  # any iterable: a generator is read once, lazily
    assert count == sum(len(bpe.encode(d)) + 1 for d in documents)
    tokens = read_tokens(path, bpe.dtype)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16 and len(tokens) == count
    assert path.stat().st_size == 2 * count
    ends = np.flatnonzero(tokens == bpe.end_of_text_id)
    assert len(ends) == len(documents) and ends[-1] == count - 1
    assert [bpe.decode(part[:-1]) for part in np.split(np.asarray(tokens), ends + 1)[:-1]] == documents
    wide = byte_level([END_OF_TEXT] + [f"<|s{i}|>" for i in range(65536)])
    assert write_tokens(["hé"], wide, path) == 4 and path.stat().st_size == 16
    assert read_tokens(path, wide.dtype).tolist() == [104, 0xC3, 0xA9, 256]
    assert write_tokens([], bpe, path) == 0 and len(read_tokens(path, np.uint16)) == 0
    with pytest.raises(UserError, match="not one str"):
        write_tokens("one document", bpe, path)


def test_a_failure_while_writing_leaves_no_token_file(tmp_path):
    def documents():
        yield "one"
        yield "two"
        raise OSError("source went away")

    path = tmp_path / "train.bin"
    with pytest.raises(OSError, match="source went away"):
        write_tokens(documents(), byte_level(), path)
    assert list(tmp_path.iterdir()) == []


def test_a_truncated_token_file_is_refused(tmp_path):
    path = tmp_path / "train.bin"
    path.write_bytes(b"\x01\x00\x02")
    with pytest.raises(UserError, match="3 bytes is not a whole number of uint16 tokens"):
        read_tokens(path, np.uint16)
    with pytest.raises(UserError, match="token dtype int64 is not one of"):
        read_tokens(path, np.int64)


def test_the_module_and_byte_level_work_without_tokenizers(monkeypatch, tmp_path):
    (tmp_path / "tok.json").write_bytes(HAND_WRITTEN_BPE)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` now raises ImportError
    monkeypatch.delitem(sys.modules, "veritrain.data.tokenizer")
    fresh = importlib.import_module("veritrain.data.tokenizer")
    assert fresh.byte_level().decode(fresh.byte_level().encode("ok")) == "ok"
    loaded = fresh.load_tokenizer(tmp_path / "tok.json")
    assert (loaded.vocab_size, loaded.token_bytes[257:]) == (259, (b"hi", b"his"))
    assert loaded.decode([258, 32, 257, 256]) == "his hi<|endoftext|>"
    with pytest.raises(UserError, match=r"pip install 'veritrain\[lm\]'"):
        loaded.encode("x")
    with pytest.raises(UserError, match=r"to train a BPE tokenizer veritrain needs the tokenizers package"):
        fresh.train_bpe(["x"], 300)


def test_a_hand_written_bpe_file_encodes_by_its_merges(tmp_path):
    need_tokenizers()
    (tmp_path / "tok.json").write_bytes(HAND_WRITTEN_BPE)
    tokenizer = load_tokenizer(tmp_path / "tok.json")
    assert tokenizer.encode("his hi h!").tolist() == [258, 32, 257, 32, 104, 33]
    assert tokenizer.encode("hi's").tolist() == [257, 39, 115]  # the GPT-2 split makes "'s" a word of its own


@BPE
def test_bpe_trains_from_texts_given_one_at_a_time_to_the_same_file(bpe, corpus):
    """The text gate hands train_bpe a generator (the documents read back one at a time): the same file as a list."""
    need_tokenizers()
    assert train_bpe((text for text in corpus), 2048).file_bytes == bpe.file_bytes
