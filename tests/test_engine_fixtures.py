"""Runs interrupted mid-epoch by the training engines as they were before the built-in training became a recipe over
the public primitives (tests/fixtures/legacy/README.md: engine0-*): a cnn run kept for audit, a language model, a
user's own loop (examples/own_loop.py) and a run of two processes; and a run of the recipe as it was before its
batches could be built by workers (engine1-recipe). Each resumes to the weights an uninterrupted run of
that code reached, then reproduces identically, and audits identically where one process trained it: a run keeps the
engine that trained it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import veritrain_process

pytestmark = pytest.mark.slow

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
# archive, run id, the final state an uninterrupted run of the same command reached with that code, its working folder
FIXTURES = {
    "cnn": ("engine0-cnn.tar.gz", "20261207-053537-974-0407bb", "5f05e6b33c3d4bc600b3b0ced72ff6ec311bb7dd37a2a7ee7bb3dfa2fa4164b8", None),
    "lm": ("engine0-lm.tar.gz", "20261207-053604-730-fbfd64", "5980ef6b74c52f4a207140f370bfca3855ef30d7e9d218b579b60b029b656307", None),
    "ranks": ("engine0-ranks.tar.gz", "20261207-095959-207-e26880", "3031a36588481ea54f325b0106f15086a9d52f25c854628a5f190adf61cfdc10", None),
    "script": ("engine0-script.tar.gz", "20261207-054859-206-74bf7f", "b814bf474460c5a6377d1ccf55c589bc340786c3cbc29b2c02e13f514b64bfb6",
               "/tmp/fx/script"),
    # the recipe (training.engine recipe-1) before batches could be built by workers and steps became the unit
    "recipe": ("engine1-recipe.tar.gz", "20261207-135111-356-c19121", "663650fcaa439c80c91838e10489258c9cc2ef08180b91340d1208bc86642054", None),
}


@pytest.mark.parametrize("kind", sorted(FIXTURES))
def test_an_interrupted_run_of_the_previous_engine_resumes_audits_and_reproduces_identically(kind, tmp_path):
    archive, run_id, uninterrupted, cwd = FIXTURES[kind]
    if cwd is not None:  # a script's run is replayed in the folder it was started in, where its input is (by a relative path)
        import sklearn.datasets

        Path(cwd).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz", Path(cwd) / "digits.csv.gz")
    done = veritrain_process("import", str(LEGACY / archive), "--workdir", str(tmp_path), "--json")
    assert done.code == 0, done.stderr
    before = json.loads((tmp_path / "runs" / run_id / "record.json").read_text())
    assert before["status"] == "interrupted"
    done = veritrain_process("train", "--resume", run_id, "--trust-code", "--workdir", str(tmp_path), "--json", timeout=600)
    assert done.code == 0, done.stderr
    resumed = json.loads((tmp_path / "runs" / run_id / "record.json").read_text())
    assert resumed["status"] == "completed"

    done = veritrain_process("reproduce", run_id, "--trust-code", "--workdir", str(tmp_path), "--json", timeout=600)
    comparison = json.loads(done.stdout)
    fresh = json.loads((tmp_path / "runs" / comparison["reproduction"] / "record.json").read_text())
    if fresh["final_state_sha256"] != uninterrupted and comparison["verdict"] != "identical":
        pytest.skip(f"this machine's kernels round unlike the fixture's ({comparison['verdict']}): "
                    f"{[c for c in comparison['checks'] if c['verdict'] != 'identical'][:1]}")
    assert done.code == 0 and comparison["verdict"] == "identical", comparison
    assert resumed["final_state_sha256"] == fresh["final_state_sha256"] == uninterrupted

    engine = "recipe-1" if kind == "recipe" else None  # the earlier loop (no engine named) for the engine0 runs, both times
    assert resumed["training"].get("engine") == engine and fresh["training"].get("engine") == engine
    done = veritrain_process("audit", run_id, "--trust-code", "--workdir", str(tmp_path), "--json", timeout=600)
    if kind == "ranks":  # a segment of a 2-process run cannot be replayed in one process: the reproduction above is its check
        assert done.code == 2 and "reproduce" in done.stderr, done.stderr
        return
    assert done.code == 0, done.stdout + done.stderr
    audited = json.loads(done.stdout)
    assert audited["verdict"] == "identical" and all(s["verdict"] == "identical" for s in audited["segments"]), audited


def test_an_epoch_config_trains_today_to_the_weights_the_recipe_reached_before_steps_became_the_unit(tmp_path):
    """recipe-2 changed what a run saves (the best validation's step), not what an epoch config trains: a new run of the
    recipe-1 fixture's config reaches that fixture's uninterrupted weights."""
    archive, run_id, uninterrupted, _ = FIXTURES["recipe"]
    done = veritrain_process("import", str(LEGACY / archive), "--workdir", str(tmp_path / "old"), "--json")
    assert done.code == 0, done.stderr
    config = tmp_path / "old" / "runs" / run_id / "config.yaml"
    done = veritrain_process("train", str(config), "--workdir", str(tmp_path / "new"), "--json", timeout=600)
    assert done.code == 0, done.stderr
    fresh = json.loads((Path(json.loads(done.stdout)["run_dir"]) / "record.json").read_text())
    assert fresh["training"]["engine"] == "recipe-2" and fresh["final_state_sha256"] == uninterrupted

