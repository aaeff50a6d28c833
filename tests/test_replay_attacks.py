"""Replays the verifier judges (docs/threat-model.md): the attacks on a script's replay, each caught by `audit` without
any key. The forger controls the run folder and the working directory, re-seals with veritrain's own code and signs
with a key of their own; the replay's child starts with the auditor's interpreter and veritrain, reads nothing from
the run but copies, and hands back states that the auditor hashes itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

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


def audit(place: Place, run_id: str):
    """`veritrain audit` as the checker runs it, from outside the working directory, with no key."""
    return veritrain("audit", run_id, "--segments", "1", "--seed", "1", "--json", "--workdir", str(place.root), cwd=place.root.parent)


def test_a_fake_interpreter_in_the_record_and_a_package_planted_in_the_working_directory_never_run(place, other_training, tmp_path):
    marker = tmp_path / "ran"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)

    def name_the_fake(record: dict) -> None:
        record["script"]["executable"] = str(fake)

    forge(place.root / "runs" / other_training, name_the_fake)
    planted = place.root / "veritrain"
    (planted / "userloop").mkdir(parents=True)
    for name in ("__init__.py", "userloop/__init__.py", "userloop/launch.py"):
        (planted / name).write_text(f"open({str(marker)!r}, 'w').close()\n")
    try:
        done = audit(place, other_training)
    finally:
        shutil.rmtree(planted)
    assert done.code == 1, done.stdout + done.stderr
    assert done.json()["verdict"] == "differs" and done.json()["segments"][0]["verdict"] == "differs"
    assert not marker.exists()


def test_a_raised_final_metric_re_signed_by_the_trainer_is_caught_by_re_deriving_it(place, honest, tmp_path):
    from veritrain.core import signing_keys

    run_dir = place.root / "runs" / honest  # its honest audit re-derives metrics.final identically (tests/test_api.py)
    key_path = tmp_path / "trainer.pem"
    signing_keys.init(key_path)

    def raise_it(record: dict) -> None:
        record["metrics"]["final"]["train_accuracy"] = 0.99

    forge(run_dir, raise_it, key=signing_keys.load(key_path))
    assert veritrain("verify", honest, "--workdir", str(place.root)).code == 0  # the seal and the signature hold
    done = audit(place, honest)
    assert done.code == 1, done.stdout + done.stderr
    result = done.json()
    assert {s["verdict"] for s in result["segments"]} == {"identical"}  # the training is the recorded one
    final = [r for r in result["results"] if r["what"] == "metrics.final"]
    assert final and final[0]["verdict"] == "differs" and "train_accuracy" in final[0]["detail"]


SNEAKY = """import shutil, sys
shutil.copyfile("innocent.py", "innocent_copy.py")
sys.modules["__main__"].__file__ = "innocent_copy.py"
"""


def test_a_script_that_names_another_file_as_main_is_bound_and_not_audited(place):
    (place.root / "innocent.py").write_text(place.script.read_text())
    sneaky = place.root / "sneaky.py"
    sneaky.write_text(SNEAKY + place.script.read_text())
    made = subprocess.run([sys.executable, str(sneaky)], cwd=place.root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    run_id, level = made.stdout.split()[-2:]
    assert level == "bound", made.stderr
    record = place.record(run_id)
    assert any("not the recorded file" in reason for reason in record["guarantee"]["reasons"])
    assert record["script"]["file"].endswith("innocent_copy.py")
    refused = audit(place, run_id)
    assert refused.code == 2 and "not the recorded file" in refused.stderr


def test_a_run_whose_training_depends_on_pythonhashseed_audits_identical(place):
    run_id = run_id_of(place.run("--hashed", env={"PYTHONHASHSEED": "123"}))
    assert place.record(run_id)["env"]["variables"]["PYTHONHASHSEED"] == "123"
    done = audit(place, run_id)  # this process's own hash seed is another (random) one
    assert done.code == 0, done.stdout + done.stderr
    assert done.json()["verdict"] == "identical"
