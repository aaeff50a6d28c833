"""Config loading and validation: every problem is one line with file/--set, key path and fix; exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import ROOT
from veritrain.core.config import RunConfig, TrainConfig, config_hash, load_config, reference_rows
from veritrain.core.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("train:\n  epochs: abc\n", "train.epochs: expected an integer ≥ 1, got 'abc'"),
        ("train:\n  epochs: 0\n", "train.epochs: expected an integer ≥ 1, got 0"),
        ("optim:\n  lr: 0\n", "optim.lr: expected a number > 0, got 0"),
        ("optim:\n  lr: -1.0e-3\n", "optim.lr: expected a number > 0, got -0.001"),
        ("optim:\n  name: adam\n", "optim.name: expected one of 'sgd', 'adamw', got 'adam'"),
        ("train:\n  epoch: 3\n", f"train.epoch: unknown key; did you mean 'epochs'? valid keys in train: {', '.join(TrainConfig.model_fields)}"),
        ("trian:\n  epochs: 3\n", f"trian: unknown key; did you mean 'train'? valid keys in the top level: {', '.join(RunConfig.model_fields)}"),
        ("model:\n  widths: [32, -1]\n", "model.widths: expected a non-empty list of integers ≥ 1, got [32, -1]"),
        ("data:\n  split_ratios: [0.5, 0.1, 0.1]\n", "data.split_ratios: expected fractions that sum to 1, got [0.5, 0.1, 0.1] (sum 0.7)"),
        ("data:\n  source: mnist\n", "data.source: expected one of 'cifar10', 'csv', 'digits', 'imagefolder', 'jsonl', 'labelmap', 'pydoc_topics', 'text', got 'mnist'"),
        ("train: 5\n", f"train: expected a section (mapping) with keys {', '.join(TrainConfig.model_fields)}, got 5"),
        ("seed: [1]\n", "seed: expected an integer, got [1]"),
        ("- a\n- b\n", "expected a mapping of keys (seed, data, model, ...) at the top level, got a list"),
    ],
)
def test_bad_config_file_is_one_line_exit_2(cli, tmp_path, yaml_text, message):
    path = write(tmp_path, yaml_text)
    result = cli("config", "show", str(path))
    assert result.code == 2
    assert result.stderr == f"error: {path}: {message}\n"
    assert result.stdout == ""


def test_bad_yaml_names_line_and_column(cli, tmp_path):
    path = write(tmp_path, "train:\n  epochs: [1, 2\nseed: 3\n")
    result = cli("run", str(path))
    assert result.code == 2
    assert result.stderr.startswith(f"error: {path}: line 3, column 5: invalid YAML: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_missing_config_file(cli, tmp_path):
    result = cli("run", str(tmp_path / "nope.yaml"), "--workdir", str(tmp_path))
    assert result.code == 2
    assert result.stderr == f"error: {tmp_path / 'nope.yaml'}: file not found; give the path of a YAML config, or none for the built-in default\n"
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epochs=abc", "error: --set: train.epochs: expected an integer ≥ 1, got 'abc'"),
        ("optim.lr=0", "error: --set: optim.lr: expected a number > 0, got 0"),
        ("optim.lrr=0.1", "error: --set: optim.lrr: unknown key; did you mean 'lr'? valid keys in optim: name, lr, momentum, weight_decay, nesterov"),
        ("train.epochs", "error: --set: train.epochs: expected KEY.PATH=VALUE, e.g. --set train.epochs=5"),
        ("seed.value=3", "error: --set: seed.value: seed is a value, not a section; set seed=... instead"),
    ],
)
def test_bad_set_is_one_line_exit_2(cli, override, message):
    result = cli("config", "show", "--set", override)
    assert result.code == 2
    assert result.stderr == message + "\n"


def test_set_is_typed_and_applied(cli):
    result = cli(
        "config", "show", "--json",
        "--set", "model.widths=[16, 32]", "--set", "optim.lr=1e-2", "--set", "exp_name=123", "--set", "train.threads=null",
    )
    assert result.code == 0, result.stderr
    config = result.json()["config"]
    assert config["model"]["widths"] == [16, 32]
    assert config["optim"]["lr"] == 0.01  # YAML reads `1e-2` as text; validation makes it a number
    assert config["exp_name"] == "123"
    assert config["train"]["threads"] is None


def test_shipped_digits_config_equals_default():
    shipped = load_config(ROOT / "configs" / "digits.yaml")
    default = load_config(None)
    assert shipped.as_dict() == default.as_dict()
    assert shipped.hash == default.hash


def test_exp_name_defaults_to_file_name(tmp_path):
    assert load_config(write(tmp_path, "seed: 1\n", "my_exp.yaml")).config.exp_name == "my_exp"
    assert load_config(write(tmp_path, "exp_name: other\n", "x.yaml")).config.exp_name == "other"


def test_config_hash_ignores_formatting_but_not_values(tmp_path):
    a = load_config(write(tmp_path, "seed: 1\ntrain:\n  epochs: 3\n  batch_size: 32\n", "a.yaml"))
    b = load_config(write(tmp_path, "train: {batch_size: 32, epochs: 3}\nseed: 1\n", "a2.yaml"), ["exp_name=a"])
    assert a.hash == b.hash
    c = load_config(write(tmp_path, "seed: 1\ntrain:\n  epochs: 4\n  batch_size: 32\n", "a.yaml"))
    assert c.hash != a.hash


def test_relative_data_root_resolves_against_config_folder_or_cwd(tmp_path, monkeypatch):
    sub = tmp_path / "cfg"
    sub.mkdir()
    path = write(sub, "data:\n  root: raw\n")
    assert load_config(path).data_root == (sub / "raw").resolve()
    monkeypatch.chdir(tmp_path)
    assert load_config(path, ["data.root=elsewhere"]).data_root == (tmp_path / "elsewhere").resolve()
    assert load_config(path).config.data.root == "raw"  # the form as written is kept for the record


def test_config_error_type_is_located():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["train.batch_size=0"])
    assert (info.value.source, info.value.key) == ("--set", "train.batch_size")


def test_docs_config_lists_every_key():
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    rows = reference_rows()
    assert len(rows) > 20
    for key, kind, default, meaning in rows:  # a model key two tasks' sections declare has a row for each
        lines = [line for line in text.splitlines() if line.startswith(f"| `{key}` |")]
        assert lines, f"docs/config.md lacks {key}"
        assert any(f"`{default}`" in line and kind in line for line in lines), f"docs/config.md is stale for {key}: run `veritrain config keys`"


def test_config_keys_json_lists_contract_keys(cli):
    keys = {row["key"] for row in cli("config", "keys", "--json").json()["keys"]}
    contract = {
        "exp_name", "seed", "data.split_seed", "data.source", "data.root", "model.name", "model.widths", "optim.name",
        "optim.lr", "optim.momentum", "optim.weight_decay", "train.epochs", "train.batch_size",
    }
    assert contract <= keys


def test_config_show_prints_yaml_that_loads_back(cli, tmp_path):
    result = cli("config", "show", "--set", "train.epochs=3")
    assert result.code == 0
    path = write(tmp_path, result.stdout, "digits.yaml")
    assert load_config(path).config.train.epochs == 3
    assert config_hash(load_config(path).config) == load_config(None, ["train.epochs=3"]).hash


@pytest.mark.parametrize("written, read", [("true", "on"), ("false", "off"), ("on", "on"), ("off", "off"), ("'auto'", "auto")])
def test_near_duplicates_takes_yaml_booleans(tmp_path, written, read):
    path = tmp_path / "c.yaml"
    path.write_text(f"data:\n  near_duplicates: {written}\n")
    assert load_config(path).config.data.near_duplicates == read


def test_keys_added_later_at_their_default_leave_the_config_hash_unchanged():
    from veritrain.core.config import KEYS_ADDED_LATER, RunConfig, config_dict, config_hash
    from veritrain.core.hashing import sha256_json

    config = RunConfig()
    before = config_dict(config)
    for dotted in KEYS_ADDED_LATER:  # the config as recorded before these keys existed
        section, key = dotted.split(".")
        before[section].pop(key, None)  # the GPT's keys are not the classifier's section's any more
    assert config_hash(config) == sha256_json(before)
    changed = RunConfig.model_validate({"data": {"split_tolerance": 0.05}})
    assert config_hash(changed) != config_hash(config)  # a key moved from its default counts


@pytest.mark.parametrize("overrides, pinned", [
    ([], "57a87ab75d2a4e3991b425ccc551b3832587d1d44c44191293ea037d929636b7"),
    (["train.epochs=3", "optim.lr=0.01"], "8f45b4661a2b4453eb4fdcab4d9bbad0fec74ca375254aed5978b60175ce63cd"),
    (["model.name=mlp", "model.hidden=[64]", "seed=7"], "bbf969c6d4338f066c5febdf9ba45a690c76f2a9c14a0d34238887362a480294"),
    (["model.target=kwargs_model:build", "model.kwargs={width: 16, note: plain text, depth: 2.5}"],
     "f8fd7241470543e893f5595fdcac4e22a8ed720339b3df5fa614bf890cac5446"),
    (["data.card.origin=https://example.org/digits", "exp_name=pinned"], "9d4c4dc0b3e242ac59d3bb5da9c661a432867f8bb742579156658b45ae01da39"),
    (["model.name=resnet18", "model.dropout=0.2"], "9cd51969de71c641c78658e4d7505d9b5a4e0bc9755914b0cb86d8f2d10e5015"),
])
def test_config_hashes_of_configs_without_secrets_are_pinned(overrides, pinned):
    # Pinned with the veritrain that still redacted values under secret-looking keys: recording configs as
    # given must leave the hash of every config without such a key as it was, or no earlier run would resume,
    # reproduce or compare with a new one.
    assert load_config(ROOT / "configs" / "digits.yaml", overrides).hash == pinned


@pytest.mark.parametrize("path, overrides, pinned", [
    ("tiny-lm.yaml", [], "c849ffef651f4ce04b0cc9354d36ba7c8a4b1131bbcaa4486797d054dfdaf690"),
    (None, ["task=lm", "data.source=pydoc_topics", "model.layers=3", "model.dropout=0.1"], "2714893238f3a5729024bfc29cde8888cf0d427278a8f243eaf22af1fc4b0664"),
    (None, ["model.name=mlp", "model.hidden=[]"], "f3b135b94d5f50c03ba6bf45f0b1b61b3057cd1f920e90703547c3a2cb70735d"),
])
def test_config_hashes_stay_those_of_the_flat_model_section(path, overrides, pinned):
    # Pinned when one flat model section held every model's keys (the GPT's config then recorded the CNN's widths):
    # each task's own section hashes as that did, so no earlier run's config hash changes.
    assert load_config(ROOT / "configs" / path if path else None, overrides).hash == pinned


def test_a_record_of_the_flat_model_section_still_rebuilds_its_config():
    from veritrain.core.config import FLAT_MODEL_SECTION

    flat = {"task": "lm", "data": {"source": "pydoc_topics"}, "model": {**FLAT_MODEL_SECTION, "name": "gpt", "layers": 3}}
    config = RunConfig.model_validate(flat)  # the classifier's widths and hidden at their defaults: left out
    assert "widths" not in config.model_dump()["model"] and config.model_dump()["model"]["layers"] == 3
    assert config_hash(config) == config_hash(RunConfig.model_validate({**flat, "model": {"layers": 3}}))
    with pytest.raises(ValidationError):  # set away from its default: a setting of the classifier, refused
        RunConfig.model_validate({**flat, "model": {**flat["model"], "widths": [8]}})
