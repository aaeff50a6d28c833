"""The pure parts of `veritrain.start` (veritrain.userloop), without training: the canonical config, the data order,
the guarantee levels, the inputs manifest and the script checks."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel

from veritrain.core.errors import UserError
from veritrain.core.hashing import sha256_json
from veritrain.userloop import inputs
from veritrain.userloop.canonical import canonical_config
from veritrain.userloop.levels import Facts, level_of
from veritrain.train.order import Order
from veritrain.userloop.script import reads_file_variable


@dataclasses.dataclass
class Optim:
    lr: float = 0.1
    betas: tuple = (0.9, 0.99)


@dataclasses.dataclass
class Config:
    seed: int = 3
    optim: Optim = dataclasses.field(default_factory=Optim)
    out: Path = Path("out/x")


class PydanticConfig(BaseModel):
    seed: int = 3
    optim: dict = {"lr": 0.1, "betas": [0.9, 0.99]}
    out: str = "out/x"


def test_every_config_form_gives_the_same_canonical_config_and_hash():
    expected = {"seed": 3, "optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "out": "out/x"}
    forms = [expected, Config(), PydanticConfig(), argparse.Namespace(seed=3, optim={"lr": 0.1, "betas": (0.9, 0.99)}, out=Path("out/x"))]
    for form in forms:
        assert canonical_config(form) == expected, form
    assert len({sha256_json(canonical_config(form)) for form in forms}) == 1


@pytest.mark.parametrize("config, key", [
    ({"a": {1, 2}}, "config: a:"),
    ({"opt": {"lr": float("nan")}}, "config: opt.lr:"),
    ({"opt": {"betas": [0.9, np.float32(0.99)]}}, "config: opt.betas[1]:"),
    ({"x": object()}, "config: x:"),
    ({"layers": {3: "relu"}}, "config: layers: the key 3"),
    ({"n": np.int64(3)}, "config: n:"),
])
def test_a_value_json_cannot_hold_exactly_is_refused_with_its_key(config, key):
    with pytest.raises(UserError) as err:
        canonical_config(config)
    assert str(err.value).startswith(key), str(err.value)
    assert "\n" not in str(err.value)


def test_a_config_that_is_no_mapping_is_refused():
    with pytest.raises(UserError, match="a list is not a config"):
        canonical_config([1, 2])


def test_distinct_configs_never_hash_the_same():
    """No value is transformed into another: 1 and 1.0 and "1" and True stay apart."""
    values = [1, 1.0, "1", True, None, [1], {"v": 1}]
    assert len({sha256_json(canonical_config({"v": v})) for v in values}) == len(values)


def test_the_order_is_a_pure_function_of_seed_epoch_and_batch():
    order = Order(n=103, batch_size=10, epochs=3, drop_last=False, seed=7)
    assert order.per_epoch == 11 and order.total == 33
    whole = [order.rows(step) for step in range(order.total)]
    again = Order(103, 10, 3, False, 7)
    assert all(np.array_equal(whole[s], again.rows(s)) for s in (0, 10, 11, 25, 32))  # any batch, from its step alone
    for epoch in range(3):  # each epoch is a permutation of every row
        rows = np.concatenate(whole[epoch * 11:(epoch + 1) * 11])
        assert sorted(rows.tolist()) == list(range(103))
    assert not np.array_equal(whole[0], whole[11])  # epochs differ
    assert not np.array_equal(whole[0], Order(103, 10, 3, False, 8).rows(0))  # seeds differ
    assert len(whole[10]) == 3  # the short last batch
    dropped = Order(103, 10, 3, True, 7)
    assert dropped.per_epoch == 10 and all(len(dropped.rows(s)) == 10 for s in range(30))
    assert order.epoch_of(11) == (2, 0) and order.epoch_of(15) == (2, 4)


def test_an_order_says_how_it_differs_from_a_saved_one():
    order = Order(100, 10, 2, False, 0)
    assert order.difference(order.as_dict()) == ""
    assert order.difference({**order.as_dict(), "batch_size": 20}) == "batch_size 20 → 10"
    with pytest.raises(UserError, match="batch_size=0"):
        Order(100, 0, 2, False, 0)
    with pytest.raises(UserError, match="no full batch"):
        Order(5, 10, 1, True, 0)


def test_levels():
    full = Facts(inputs_bound=True, batches_used=True, state_registered=True, checkpoints=2)
    assert level_of(full) == ("replayable", [])
    for change, word in [({"batches_used": False}, "run.batches"), ({"checkpoints": 0}, "no checkpoint"),
                         ({"deterministic": False}, "deterministic"), ({"reads_file_variable": True}, "__file__"),
                         ({"cudnn_benchmark": True}, "benchmark"), ({"state_registered": False}, "run.resume")]:
        level, reasons = level_of(dataclasses.replace(full, **change))
        assert level == "bound" and any(word in r for r in reasons), (change, reasons)
    assert level_of(dataclasses.replace(full, inputs_bound=False))[0] == "logged"
    level, reasons = level_of(dataclasses.replace(full, code_not_recorded="stdin"))
    assert level == "logged" and "stdin" in reasons[0]


def test_levels_of_a_framework_s_run():
    """Lightning is replayable with veritrain's loader, ckpt_path, a checkpoint and deterministic algorithms; the HF
    Trainer is always bound (its replay is not proven)."""
    lightning = Facts(inputs_bound=True, batches_used=True, state_registered=True, checkpoints=1, integration="lightning")
    assert level_of(lightning) == ("replayable", [])
    for change, word in [({"batches_used": False}, "vt.lightning.loader"), ({"state_registered": False}, "vt.lightning.ckpt_path"),
                         ({"checkpoints": 0}, "no checkpoint was saved, so"), ({"deterministic": False}, "deterministic"),
                         ({"reads_file_variable": True}, "__file__")]:
        level, reasons = level_of(dataclasses.replace(lightning, **change))
        assert level == "bound" and len(reasons) == 1 and word in reasons[0], (change, reasons)
    assert level_of(dataclasses.replace(lightning, inputs_bound=False))[0] == "logged"
    level, reasons = level_of(dataclasses.replace(lightning, integration="hf"))
    assert level == "bound" and "the Hugging Face Trainer owns the loop" in reasons[0]


def test_the_inputs_manifest_binds_every_byte(tmp_path):
    (tmp_path / "data" / "images").mkdir(parents=True)
    (tmp_path / "data" / "train.csv").write_text("a,b\n1,2\n")
    for name in ("b.png", "a.png"):
        (tmp_path / "data" / "images" / name).write_bytes(os.urandom(64))
    manifest = inputs.hash_inputs(["data/train.csv", "data/images/"], tmp_path)
    assert [f["path"] for f in manifest["files"]] == ["data/images/a.png", "data/images/b.png", "data/train.csv"]
    assert manifest["bytes"] == 128 + 8
    assert inputs.problems(manifest, tmp_path) == []
    digest = inputs.manifest_sha256(manifest)
    image = tmp_path / "data" / "images" / "a.png"
    content = image.read_bytes()
    image.write_bytes(bytes([content[0] ^ 1]) + content[1:])  # one changed byte
    assert [(p["path"], p["kind"]) for p in inputs.problems(manifest, tmp_path)] == [("data/images/a.png", "input_changed")]
    assert inputs.manifest_sha256(inputs.hash_inputs(["data/train.csv", "data/images/"], tmp_path)) != digest
    image.write_bytes(content)
    (tmp_path / "data" / "images" / "c.png").write_bytes(b"new")
    assert [(p["path"], p["kind"]) for p in inputs.problems(manifest, tmp_path)] == [("data/images/c.png", "input_added")]
    (tmp_path / "data" / "images" / "c.png").unlink()
    (tmp_path / "data" / "train.csv").unlink()
    found = inputs.problems(manifest, tmp_path)
    assert found[0]["kind"] == "input_missing" and "data/train.csv" in found[0]["detail"]


def test_inputs_that_do_not_exist_or_are_links_are_refused_naming_the_path(tmp_path):
    with pytest.raises(UserError, match=r"^inputs: data/none.csv: no such file"):
        inputs.hash_inputs(["data/none.csv"], tmp_path)
    (tmp_path / "real.csv").write_text("x")
    (tmp_path / "link.csv").symlink_to(tmp_path / "real.csv")
    with pytest.raises(UserError, match=r"^inputs: link.csv: a link"):
        inputs.hash_inputs(["link.csv"], tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "inner.csv").symlink_to(tmp_path / "real.csv")
    with pytest.raises(UserError, match="a link inside folder"):
        inputs.hash_inputs(["folder"], tmp_path)


def test_an_input_that_changes_while_it_is_hashed_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "grow.csv"
    path.write_text("1\n")
    real_open = open

    def growing_open(file, *args, **kwargs):
        handle = real_open(file, *args, **kwargs)
        if Path(file) == path:
            with real_open(path, "a") as more:  # another process appends while the hash reads
                more.write("2\n")
        return handle

    monkeypatch.setattr("builtins.open", growing_open)
    with pytest.raises(UserError, match=r"^inputs: grow.csv: it changed while it was hashed"):
        inputs.hash_inputs(["grow.csv"], tmp_path)


def test_a_script_that_reads_its_own_file_variable_is_found():
    assert reads_file_variable(b"from pathlib import Path\nDATA = Path(__file__).parent / 'data'\n")
    assert not reads_file_variable(b"import os\nDATA = os.path.join(os.getcwd(), 'data')\n# __file__ in a comment\ns = '__file__'\n")


def test_every_public_name_is_documented_and_import_veritrain_stays_light():
    import subprocess
    import sys

    import veritrain

    documented = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    table = documented.split("## The public names", 1)[1].split("\n### ", 1)[0]
    for name in veritrain.__all__:
        assert f"| `{name}` |" in table, f"veritrain.{name} is public (veritrain.__all__) but docs/api.md does not document it"
        if name not in ("lightning", "hf"):  # those need their extras (tests/test_lightning.py, tests/test_hf.py)
            assert getattr(veritrain, name) is not None
    probe = "import sys, veritrain; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"


def test_bad_arguments_to_start_are_refused_before_anything_is_written(tmp_path):
    import importlib.util

    import veritrain as vt

    cases = [({"config": {"a": 1}, "keep_last": 0}, "keep_last=0"), ({"config": {"seed": "7"}}, "config: seed"),
             ({"config": {"token": "hf_" + "a" * 34}}, "holds a secret"), ({"config": {"a": 1}, "resume": 3}, "resume=3")]
    if importlib.util.find_spec("tensorboard") is None:
        cases.append(({"config": {"a": 1}, "tensorboard": True}, "tensorboard package is not installed"))
    for kwargs, message in cases:
        with pytest.raises(vt.UsageError, match=message):
            vt.start(workdir=tmp_path / "ws", **kwargs)
    assert not (tmp_path / "ws" / "runs").exists()
