"""Replays the verifier judges (docs/threat-model.md): the attacks on a script's replay, each caught by `audit` without
any key. The forger controls the run folder and the working directory, re-seals with veritrain's own code and signs
with a key of their own; the replay's child starts with the auditor's interpreter and veritrain, reads nothing from
the run but copies, and hands back states that the auditor hashes itself."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import veritrain
from test_api import Place, make_place, run_id_of
from test_threat_model import forge


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Place:
    return make_place(tmp_path_factory.mktemp("attacks"))


@pytest.fixture(scope="module")
def honest(place) -> str:
    return run_id_of(place.run())


@pytest.fixture(scope="module")
def other_training(place) -> str:
    """A run of the same script, config and inputs whose training was not what the recorded code does (a variable the
    record does not name changed it): the forger's model, with a record that looks honest."""
    return run_id_of(place.run(env={"TINY_NOISE": "1"}))


def copy_run(place: Place, run_id: str, tmp_path: Path) -> Path:
    """A copy of the run under a new folder of the same workspace, so that each attack starts from the same run."""
    target = place.root / "runs" / f"{run_id[:-6]}{abs(hash(tmp_path.name)) % 16**6:06x}"
    shutil.copytree(place.root / "runs" / run_id, target)

    def rename(record: dict) -> None:
        record["run_id"] = target.name
    forge(target, rename)
    return target


def _audit_process(place: Place, run_dir: Path, *options: str):
    from conftest import veritrain_process

    return veritrain_process("audit", run_dir.name, "--segments", "4", "--seed", "1", "--trust-code", "--json", *options,
                             "--workdir", str(place.root), cwd=place.root.parent)


def test_a_fake_interpreter_named_in_the_record_is_never_run(place, other_training, tmp_path):
    marker = tmp_path / "fake-ran"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    run_dir = copy_run(place, other_training, tmp_path)

    def name_the_fake(record: dict) -> None:
        record["script"]["executable"] = str(fake)

    forge(run_dir, name_the_fake)
    done = _audit_process(place, run_dir)
    assert done.code == 1, done.stdout + done.stderr
    assert done.json()["verdict"] == "differs"
    assert not marker.exists()


def test_a_package_planted_in_the_working_directory_is_never_imported(place, other_training, tmp_path):
    marker = tmp_path / "planted-ran"
    planted = place.root / "veritrain"
    (planted / "userloop").mkdir(parents=True)
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted / "userloop" / "__init__.py").write_text("")
    (planted / "userloop" / "launch.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    try:
        done = _audit_process(place, place.root / "runs" / other_training)
    finally:
        shutil.rmtree(planted)
    assert done.code == 1, done.stdout + done.stderr
    assert done.json()["verdict"] == "differs"
    assert not marker.exists()


def test_a_raised_final_metric_re_signed_by_the_trainer_is_caught_by_re_deriving_it(place, honest, tmp_path):
    from veritrain.core import signing_keys

    key_path = tmp_path / "trainer.pem"
    signing_keys.init(key_path)
    run_dir = copy_run(place, honest, tmp_path)

    def raise_it(record: dict) -> None:
        record["metrics"]["final"]["train_accuracy"] = 0.99

    forge(run_dir, raise_it, key=signing_keys.load(key_path))
    assert veritrain("verify", run_dir.name, "--workdir", str(place.root)).code == 0  # the seal and the signature hold
    done = _audit_process(place, run_dir)
    assert done.code == 1, done.stdout + done.stderr
    result = done.json()
    assert {s["verdict"] for s in result["segments"]} == {"identical"}  # the training is the recorded one
    final = [r for r in result["results"] if r["what"] == "metrics.final"]
    assert final and final[0]["verdict"] == "differs" and "train_accuracy" in final[0]["detail"]


def test_the_honest_run_re_derives_its_final_metrics_identically(place, honest):
    done = _audit_process(place, place.root / "runs" / honest)
    assert done.code == 0, done.stdout + done.stderr
    result = done.json()
    assert [r["verdict"] for r in result["results"] if r["what"] == "metrics.final"] == ["identical"]


SNEAKY = '''import shutil, sys
shutil.copyfile("innocent.py", "innocent_copy.py")
sys.modules["__main__"].__file__ = "innocent_copy.py"
'''


def test_a_script_that_names_another_file_as_main_is_bound_and_not_audited(place, tmp_path):
    (place.root / "innocent.py").write_text(place.script.read_text())
    sneaky = place.root / "sneaky.py"
    sneaky.write_text(SNEAKY + place.script.read_text())
    import subprocess

    made = subprocess.run([sys.executable, str(sneaky)], cwd=place.root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    run_id, level = made.stdout.split()[-2:]
    assert level == "bound", made.stderr
    record = place.record(run_id)
    assert any("not the recorded file" in reason for reason in record["guarantee"]["reasons"])
    assert record["script"]["file"].endswith("innocent_copy.py")
    refused = _audit_process(place, place.root / "runs" / run_id)
    assert refused.code == 2 and "not the recorded file" in refused.stdout + refused.stderr


def test_a_run_whose_training_depends_on_pythonhashseed_audits_identical(place):
    made = place.run("--hashed", env={"PYTHONHASHSEED": "123"})
    run_id = run_id_of(made)
    assert place.record(run_id)["env"]["variables"]["PYTHONHASHSEED"] == "123"
    done = _audit_process(place, place.root / "runs" / run_id)
    assert done.code == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["verdict"] == "identical"
