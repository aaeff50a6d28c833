"""Hostile configs: every kind of bad input the config hardening names is refused before anything runs, with
exit code 2 and one `error: <file or --set>: <key.path>: <problem>` line, never a traceback or a hang.

The attacks go through the real command (`veritrain config show`); the exhaustive sweeps (every float key,
every integer key, 500 random overrides) run in-process on `load_config`, with a sample through the command.
"""

from __future__ import annotations

import json
import os
import random
import tarfile
import time
import typing
from pathlib import Path
from typing import Any

import pytest

from conftest import veritrain
from veritrain.core.config import (
    MAX_CONFIG_BYTES,
    MAX_NESTING,
    MAX_VALUES,
    RunConfig,
    Section,
    config_hash,
    load_config,
    to_yaml,
)
from veritrain.core.config.schema import ModelConfig, declared_sections, model_key_owner
from veritrain.core.errors import ConfigError
from veritrain.core.task_registry import DEFAULT_TASK

# A hang detector, not a benchmark: each refusal takes well under a second; a hang or a memory blow-up takes
# minutes (and the subprocess timeout below stops it).
SANE_SECONDS = 10


def refused(path_or_set: str, *args: str, key: str | None = None) -> str:
    """Run `veritrain config show ARGS`; assert exit 2 with one error line from `path_or_set` naming `key`."""
    started = time.monotonic()
    result = veritrain("config", "show", *args, timeout=60)
    elapsed = time.monotonic() - started
    assert result.code == 2, (result.code, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr[-2000:]
    prefix = f"error: {path_or_set}: " + (f"{key}: " if key is not None else "")
    assert result.stderr.startswith(prefix), result.stderr
    assert result.stdout == ""
    assert elapsed < SANE_SECONDS, f"took {elapsed:.1f} s"
    return result.stderr


def write(tmp_path: Path, text: str, name: str = "hostile.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def leaf_keys(kind: type) -> dict[str, Any]:
    """Every key whose type holds `kind` (int or float) — plain, optional, or in a list or tuple — with its type."""

    def holds(annotation: Any) -> bool:
        if annotation is kind:
            return True
        if typing.get_origin(annotation) is typing.Literal:
            return all(type(a) is kind for a in typing.get_args(annotation))
        return typing.get_origin(annotation) is not dict and any(holds(a) for a in typing.get_args(annotation))

    def walk(model: type, prefix: str) -> dict[str, Any]:
        found = {}
        for name, info in model.model_fields.items():
            if info.annotation is ModelConfig:  # every task's own section
                for _, section in reversed(declared_sections()):  # a key two sections declare: the first task's
                    found |= walk(section, f"{prefix}{name}.")
            elif isinstance(info.annotation, type) and issubclass(info.annotation, Section):
                found |= walk(info.annotation, f"{prefix}{name}.")
            elif holds(info.annotation):
                found[prefix + name] = info.annotation
        return found

    return walk(RunConfig, "")


def task_of(key: str) -> list[str]:
    """The overrides that make a config of the task whose model section declares `key` (none for the default task's)."""
    owner = model_key_owner(key.removeprefix("model."), DEFAULT_TASK) if key.startswith("model.") else None
    return [] if owner is None else [f"task={owner}", f"data.source={'pydoc_topics' if owner == 'lm' else 'digits'}"]


# ---------------------------------------------------------------- 1. non-finite floats


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=.inf", "optim.lr: expected a finite number > 0, got Infinity"),
        ("schedule.gamma=-.inf", "schedule.gamma: expected a finite number > 0 and ≤ 1, got -Infinity"),
        ("train.grad_clip=.nan", "train.grad_clip: expected a finite number > 0 or null, got NaN"),
        ("data.split_ratios=[.nan, 0.5, 0.5]", "data.split_ratios: expected a list of 3 finite numbers, got [NaN, 0.5, 0.5]"),
        ("export.parity_atol=1.0e+400", "export.parity_atol: expected a finite number > 0, got Infinity"),
    ],
)
def test_non_finite_float_is_refused(override, message):
    assert refused("--set", "--set", override) == f"error: --set: {message}\n"


def test_non_finite_float_in_a_file_is_refused(tmp_path):
    path = write(tmp_path, "augment:\n  mixup_alpha: .NaN\n")
    assert refused(str(path), str(path)) == f"error: {path}: augment.mixup_alpha: expected a finite number ≥ 0, got NaN\n"


def test_every_float_key_refuses_non_finite_values():
    keys = leaf_keys(float)
    named = {
        "optim.lr", "optim.weight_decay", "optim.momentum", "schedule.gamma", "train.grad_clip", "train.label_smoothing",
        "train.rollback_lr_factor", "augment.mixup_alpha", "augment.cutmix_alpha", "checkpoint.every_minutes",
        "eval.baseline_margin", "export.parity_atol", "export.parity_rtol", "export.parity_min_agreement", "data.imbalance_ratio",
        "data.split_tolerance", "data.near_duplicate_difference", "data.split_ratios", "model.dropout",
    }
    assert {"model.layers", "model.context", "model.widths"} <= set(leaf_keys(int))  # every task's model section
    assert named <= set(keys)
    for key in keys:
        for value in (".inf", "-.inf", ".nan", "1.0e+999"):
            text = {"data.split_ratios": f"[{value}, 0.5, 0.5]", "augment.resized_crop": f"[0.5, {value}]"}.get(key, value)
            with pytest.raises(ConfigError) as info:
                load_config(None, [*task_of(key), f"{key}={text}"])
            assert (info.value.source, info.value.key) == ("--set", key)
            assert "finite number" in info.value.problem


# ---------------------------------------------------------------- 2. nesting


@pytest.mark.parametrize(
    "text, key",
    [
        # the key path of the first list or mapping that is too deep: MAX_NESTING + 1 keys and indices from the top
        ("[" * 3000 + "]" * 3000 + "\n", ".".join(["0"] * (MAX_NESTING + 1))),
        ("model:\n  kwargs:\n    deep: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", "model.kwargs.deep." + ".".join(["a"] * (MAX_NESTING - 2))),
        ("model:\n  kwargs:\n" + "".join("  " * (depth + 2) + "a:\n" for depth in range(300)) + "  " * 302 + "b: 1\n",
         "model.kwargs." + ".".join(["a"] * (MAX_NESTING - 1))),
    ],
    ids=["flow-lists", "flow-mappings", "block-mappings"],
)
def test_deep_nesting_in_a_file_is_refused(tmp_path, text, key):
    path = write(tmp_path, text)
    assert f"nested deeper than {MAX_NESTING} levels" in refused(str(path), str(path), key=key)


def test_deep_nesting_in_a_set_value_is_refused():
    override = "model.kwargs={a: " + "[" * 3000 + "]" * 3000 + "}"
    assert f"nested deeper than {MAX_NESTING} levels" in refused("--set", "--set", override, key="model.kwargs.a." + ".".join(["0"] * (MAX_NESTING - 2)))


# ---------------------------------------------------------------- 3. alias expansion


def laughs(levels: int = 9) -> list[str]:
    """The "billion laughs": each level 9 aliases of the previous one, 9**9 strings once expanded."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    return lines


@pytest.mark.parametrize(
    "text, key",
    [
        ("\n".join(laughs()) + "\n", "l4"),
        ("model:\n  kwargs:\n" + "".join(f"    {line}\n" for line in laughs()), "model.kwargs.l4"),
        ("model:\n  kwargs:\n    loop: &loop [*loop]\n", "model.kwargs.loop"),
    ],
    ids=["top-level", "in-kwargs", "self-reference"],
)
def test_alias_expansion_past_the_budget_is_refused(tmp_path, text, key):
    path = write(tmp_path, text)
    message = refused(str(path), str(path))
    assert message.startswith(f"error: {path}: {key}.") and "once aliases (*name) are expanded" in message


def test_alias_bomb_in_a_set_value_is_refused():
    override = "model.kwargs={" + ", ".join(laughs()) + "}"
    message = refused("--set", "--set", override)
    assert message.startswith("error: --set: model.kwargs.l4.") and f"more than {MAX_VALUES:,} keys and values" in message


def test_aliases_within_the_budget_still_work(tmp_path):
    path = write(tmp_path, "model:\n  kwargs:\n    base: &base {depth: 2, act: relu}\n    copy: *base\n    merged:\n      <<: *base\n      depth: 3\n")
    kwargs = load_config(path).config.model.kwargs
    assert kwargs["copy"] == {"depth": 2, "act": "relu"} and kwargs["merged"] == {"depth": 3, "act": "relu"}


# ---------------------------------------------------------------- 4. not a regular file, or too large


def test_symlink_to_dev_zero_is_refused(tmp_path):
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    assert refused(str(link), str(link)) == f"error: {link}: is a character device, not a regular file; give the path of a YAML config file\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert refused(str(fifo), str(fifo)) == f"error: {fifo}: is a FIFO (named pipe), not a regular file; give the path of a YAML config file\n"


@pytest.mark.parametrize("size", [MAX_CONFIG_BYTES + 1, 50 * MAX_CONFIG_BYTES])
def test_file_over_one_mebibyte_is_refused(tmp_path, size):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.write(b"seed: 1\n# ")
        f.truncate(size)  # sparse: the size is what counts, and the file is never read
    message = refused(str(path), str(path))
    assert message == f"error: {path}: is {size:,} bytes; a config is at most {MAX_CONFIG_BYTES:,} bytes (1 MiB), keep data out of it\n"


def test_file_of_exactly_one_mebibyte_is_read(tmp_path):
    text = "seed: 7\n# "
    path = write(tmp_path, text + "x" * (MAX_CONFIG_BYTES - len(text) - 1) + "\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert load_config(path).config.seed == 7


def test_too_many_values_in_a_file_are_refused(tmp_path):
    path = write(tmp_path, "data:\n  classes: [" + ", ".join(["c"] * (MAX_VALUES + 10)) + "]\n")
    assert f"more than {MAX_VALUES:,} keys and values" in refused(str(path), str(path))


# ---------------------------------------------------------------- 5. duplicate keys


@pytest.mark.parametrize(
    "text, key",
    [
        ("seed: 1\ntrain:\n  epochs: 3\nseed: 2\n", "seed"),
        ("train:\n  epochs: 3\n  batch_size: 32\n  epochs: 4\n", "train.epochs"),
        ("optim: {lr: 0.1, lr: 0.2}\n", "optim.lr"),
        ("train: {epochs: 3}\ntrain: {epochs: 4}\n", "train"),
        ("model:\n  kwargs:\n    block: {depth: 2, 'depth': 3}\n", "model.kwargs.block.depth"),
    ],
)
def test_duplicate_key_in_a_file_is_refused(tmp_path, text, key):
    path = write(tmp_path, text)
    assert refused(str(path), str(path)) == f"error: {path}: {key}: key given twice in one mapping; keep one (YAML would silently use the last)\n"


def test_duplicate_key_in_a_set_value_is_refused():
    message = refused("--set", "--set", "train={epochs: 3, epochs: 4}")
    assert message == "error: --set: train.epochs: key given twice in one mapping; keep one (YAML would silently use the last)\n"


# ---------------------------------------------------------------- 6. booleans are not integers


@pytest.mark.parametrize(
    "override, message",
    [
        ("seed=true", "seed: expected an integer, got true"),
        ("seed=yes", "seed: expected an integer, got true"),
        ("train.epochs=on", "train.epochs: expected an integer ≥ 1, got true"),
        ("data.channels=true", "data.channels: expected one of 1, 3 or null, got true"),
        ("model.widths=[16, false]", "model.widths: expected a non-empty list of integers ≥ 1, got [16, false]"),
        ("optim.lr=true", "optim.lr: expected a number > 0, got true"),
    ],
)
def test_boolean_for_a_number_is_refused(override, message):
    assert refused("--set", "--set", override) == f"error: --set: {message}\n"


def test_boolean_for_an_integer_in_a_file_is_refused(tmp_path):
    path = write(tmp_path, "seed: yes\n")
    assert refused(str(path), str(path)) == f"error: {path}: seed: expected an integer, got true\n"


def test_numbers_written_plainly_still_load(tmp_path):
    assert load_config(None, ["train.epochs=3"]).config.train.epochs == 3
    assert load_config(write(tmp_path, "train:\n  epochs: 3\n")).config.train.epochs == 3
    assert load_config(None, ["train.epochs=3.0"]).config.train.epochs == 3  # an integral float is that integer
    assert type(load_config(None, ["train.epochs=3.0"]).config.train.epochs) is int
    assert load_config(None, ["optim.lr=1"]).config.optim.lr == 1.0  # an integer is a number
    assert load_config(None, ["optim.lr=1e-2"]).config.optim.lr == 0.01  # YAML 1.1 reads 1e-2 as text
    assert load_config(None, ["seed=-3"]).config.seed == -3
    assert load_config(None, ["data.channels=3"]).config.data.channels == 3
    assert load_config(None, ["data.near_duplicates=true"]).config.data.near_duplicates == "on"  # a documented boolean


@pytest.mark.parametrize("archive", ["legacy-completed.tar.gz", "legacy-interrupted.tar.gz"])
def test_recorded_configs_hash_as_before(tmp_path, archive):
    """Hardening changes what is refused, not how an accepted config hashes: the runs of an earlier veritrain
    (tests/fixtures/legacy) keep their config hash, read back from the record and from their config.yaml."""
    with tarfile.open(Path(__file__).parent / "fixtures" / "legacy" / archive) as tar:
        names = tar.getnames()
        record = json.load(tar.extractfile(next(n for n in names if n.endswith("/record.json"))))  # type: ignore[arg-type]
        config_yaml = tar.extractfile(next(n for n in names if n.endswith("/config.yaml"))).read()  # type: ignore[union-attr]
    assert config_hash(RunConfig.model_validate(record["config"])) == record["config_hash"]
    path = tmp_path / "config.yaml"
    path.write_bytes(config_yaml)
    assert load_config(path).hash == record["config_hash"]


# ---------------------------------------------------------------- 7. sizes out of range


@pytest.mark.parametrize(
    "override, message",
    [
        ("augment.crop_padding=1e20", "augment.crop_padding: expected an integer ≥ 0, got '1e20'"),  # YAML 1.1: text
        ("augment.crop_padding=1.0e+20", "augment.crop_padding: expected an integer ≥ 0 and ≤ 1024, got 1e+20"),
        ("train.batch_size=" + str(10**30), f"train.batch_size: expected an integer ≥ 1 and ≤ 1048576, got {10**30}"),
        ("model.widths=[1000000000]", "model.widths: expected a non-empty list of integers ≥ 1 and ≤ 65536, got [1000000000]"),
        ("model.widths=[1e9]", "model.widths: expected a non-empty list of integers ≥ 1, got [\"1e9\"]"),
        ("train.epochs=3.5", "train.epochs: expected an integer ≥ 1, got 3.5"),
        ("seed=0x" + "f" * 40, "seed: expected an integer ≥ -9223372036854775808 and ≤ 9223372036854775807, got "
         + str(int("f" * 40, 16))),
        ("seed=" + "9" * 5000, None),  # past Python's 4,300-digit conversion limit
    ],
)
def test_out_of_range_size_is_refused(override, message):
    key = override.partition("=")[0]
    stderr = refused("--set", "--set", override, key=key)
    if message is not None:
        assert stderr == f"error: --set: {message}\n"
    assert len(stderr) < 1000  # a huge value is cut in the message


def test_every_integer_key_has_an_upper_bound():
    for key, annotation in leaf_keys(int).items():
        huge = str(2**64)
        shape = " ".join(str(a) for a in (annotation, *typing.get_args(annotation)))
        text = f"[{huge}, {huge}]" if "tuple" in shape else f"[{huge}]" if "list" in shape else huge
        with pytest.raises(ConfigError) as raised:
            load_config(None, [*task_of(key), f"{key}={text}"])
        assert raised.value.key == key, key
        assert "≤" in raised.value.problem or "one of" in raised.value.problem, (key, raised.value.problem)


# ---------------------------------------------------------------- fuzz: random overrides


def random_value(rng: random.Random) -> str:
    """YAML text for an override value: wrong types, huge, non-finite, unicode, empty, YAML tricks."""
    atoms = [
        "", " ", "~", "null", "true", "no", "on", "0", "-1", "1", "3", "3.0", "3.5", "-0.0", "1e-2", "1.0e+20",
        ".inf", "-.inf", ".nan", ".NaN", "1.0e+400", "0x" + "f" * 80, "0b101", "0o17", "1_000", "1:20",
        str(10**30), "-" + str(10**30), "9" * 5000, "x" * rng.choice([1, 100, 10_000, 200_000]),
        "abc", "'quoted'", '"\\ud800"', '"\\x00"', '"a\\nb"', "é", "日本語", "🙂" * 50, "\u202e", "\u200b", "\u2028",
        "[]", "{}", "[1, 2, 3]", "[true]", "[.nan]", "[1e400]", "{a: 1}", "{a: 1, a: 2}", "[[[[[[]]]]]]",
        "[" * 200 + "]" * 200, "&a [*a]", "*undefined", "!!binary aGVsbG8=", "!!python/object:os.system",
        "!!set {a, b}", "!!omap [a: 1]", "2001-13-45", "2001-01-01", "12:30:00", "- a", "? a", "[", "{", "'",
        "a: b", "${env:VERITRAIN_FUZZ_UNSET}", "~nobody-veritrain/x", "cnn", "adamw", "mlp", "sgd", "digits", "fp16",
        "quarantine", "(" * 5000 + ")" * 5000, "(a){4294967295}", "[[a](x)", "(?P<x>a)(?P=x)", "(a)(b)",
    ]
    value = rng.choice(atoms)
    if rng.random() < 0.2:  # a list or mapping of atoms
        items = [rng.choice(atoms[:60]) for _ in range(rng.randint(1, 4))]
        value = "[" + ", ".join(items) + "]" if rng.random() < 0.5 else "{" + ", ".join(f"k{i}: {v}" for i, v in enumerate(items)) + "}"
    return value


def fuzz_overrides(keys: list[str], count: int = 500, seed: int = 20240611) -> list[str]:
    rng = random.Random(seed)
    sections = sorted({key.split(".")[0] for key in keys if "." in key})
    overrides = []
    for _ in range(count):
        key = rng.choice(keys)
        twist = rng.random()
        if twist < 0.05:
            key = rng.choice(sections)  # a whole section
        elif twist < 0.08:
            key = key + ".x"  # below a value
        elif twist < 0.1:
            key = key + rng.choice(["é", "\u200b", " ", "-"])  # nearly a key
        overrides.append(f"{key}={random_value(rng)}")
    return overrides


@pytest.fixture(scope="module")
def documented_keys() -> list[str]:
    result = veritrain("config", "keys", "--json", timeout=60)
    assert result.code == 0, result.stderr
    return [row["key"] for row in result.json()["keys"]]


def check_in_process(config: Path | None, overrides: list[str]) -> str | None:
    """What `veritrain config show` does, in-process: None when accepted, else the one-line error."""
    try:
        resolved = load_config(config, overrides)
    except ConfigError as err:
        message = f"error: {err}"
        assert "\n" not in message and message.isprintable(), repr(message)
        assert len(message) < 2000, message[:200]
        return message
    json.dumps({"config": resolved.as_dict(), "config_hash": resolved.hash}, allow_nan=False).encode("utf-8")
    to_yaml(resolved.config).encode("utf-8")
    return None


def test_fuzzed_overrides_are_accepted_or_refused_in_one_line(documented_keys, monkeypatch, tmp_path):
    monkeypatch.delenv("VERITRAIN_FUZZ_UNSET", raising=False)
    monkeypatch.chdir(tmp_path)  # relative data paths resolve here
    overrides = fuzz_overrides(documented_keys)
    refused_count = 0
    for override in overrides:
        try:
            outcome = check_in_process(None, [override])
        except Exception as err:  # anything but a ConfigError is a bug
            raise AssertionError(f"--set {override[:200]!r} raised {err.__class__.__name__}: {err}") from err
        refused_count += outcome is not None
        if outcome is not None and not override.partition("=")[0].endswith(("é", "\u200b", " ", "-")):
            assert outcome.startswith("error: --set: "), (override[:200], outcome)
    assert 0 < refused_count < len(overrides)  # the fuzz reaches both outcomes


def test_fuzzed_values_in_a_file_are_accepted_or_refused_in_one_line(documented_keys, monkeypatch, tmp_path):
    monkeypatch.delenv("VERITRAIN_FUZZ_UNSET", raising=False)
    path = tmp_path / "fuzz.yaml"
    for override in fuzz_overrides(documented_keys, count=300, seed=7):
        key, _, value = override.partition("=")
        parts = key.split(".")
        text = "".join("  " * depth + f"{part}:\n" for depth, part in enumerate(parts[:-1]))
        path.write_text(text + "  " * (len(parts) - 1) + f"{parts[-1]}: {value}\n", encoding="utf-8", errors="surrogateescape")
        try:
            check_in_process(path, [])
        except Exception as err:
            raise AssertionError(f"{path.read_text(errors='replace')[:300]!r} raised {err.__class__.__name__}: {err}") from err


def test_fuzzed_overrides_through_the_command(documented_keys):
    rng = random.Random(5)
    sample = rng.sample([o for o in fuzz_overrides(documented_keys) if "\x00" not in o and len(o) < 50_000], 12)
    for override in sample:
        result = veritrain("config", "show", "--set", override, timeout=60)
        assert "Traceback" not in result.stderr, (override[:200], result.stderr[-2000:])
        if result.code == 0:
            assert result.stderr == ""
        else:
            assert result.code == 2, (override[:200], result.code, result.stderr[-2000:])
            assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), (override[:200], result.stderr)
