"""veritrain.hf (docs/api.md): examples/hf_trainer.py, a tiny BERT built from its config (nothing downloaded) trained by
the Hugging Face Trainer with the Callback, recorded as a `bound` run: every checkpoint folder is hashed after the
save (the Trainer's rng_state.pth included) and verified again, reproduce and audit refuse it with the reason, and a
resume from a checkpoint folder after kill -9 continues the same run. Needs the hf extra (make test-slow)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, need_extra, veritrain

pytestmark = pytest.mark.slow
EXAMPLE = ROOT / "examples" / "hf_trainer.py"

try:
    import accelerate  # noqa: F401
    import transformers  # noqa: F401
    HAVE_HF = True
except ImportError:
    HAVE_HF = False


@pytest.fixture(autouse=True)
def _hf():
    need_extra(HAVE_HF, "the hf extra (pip install 'veritrain[hf]')")


def train(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "hf_trainer.py"), *args], cwd=root, capture_output=True, text=True, timeout=600)


def record(root: Path, run_id: str) -> dict:
    return json.loads((root / "runs" / run_id / "record.json").read_text())


def test_a_trainer_run_is_bound_verifies_and_is_refused_a_replay(tmp_path):
    shutil.copyfile(EXAMPLE, tmp_path / "hf_trainer.py")
    done = train(tmp_path, "--steps", "25")
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = record(tmp_path, run_dir.name)
    assert run["script"]["integration"] == "hf" and run["guarantee"]["level"] == "bound" and run["status"] == "completed"
    assert run["config"]["training_args"]["max_steps"] == 25 and run["config"]["model_config"]["hidden_size"] == 32
    assert "output_dir" not in run["config"]["training_args"]
    assert [e["step"] for e in run["trajectory"]] == [0, 10, 20, 25]  # the final step is always saved
    last = run_dir / run["trajectory"][-1]["file"]
    assert (last / "rng_state.pth").is_file() and (last / "veritrain.json").is_file()
    assert run["metrics"]["final"]["checkpoint"] == run["trajectory"][-1]["file"] and "train_runtime" not in run["metrics"]["final"]
    assert veritrain("verify", run_dir.name, cwd=tmp_path).code == 0
    for command in ("reproduce", "audit"):
        refused = veritrain(command, run_dir.name, cwd=tmp_path)
        assert refused.code == 2 and f"a bound run, so {command} cannot replay it" in refused.stderr
    rng = last / "rng_state.pth"  # the Trainer's own RNG record is part of the hashed state
    content = rng.read_bytes()
    rng.write_bytes(content[:-1] + bytes([content[-1] ^ 1]))
    verified = veritrain("verify", run_dir.name, "--json", cwd=tmp_path)
    assert verified.code == 1 and any(p["path"].endswith("rng_state.pth") for p in verified.json()["problems"])
    rng.write_bytes(content)

    # config.json changes what from_pretrained builds from the same weights: HF state recipe 2 hashes it with the state
    from veritrain.records.record import read_record, thawed, write_record
    from veritrain.userloop import frameworks

    assert run["script"]["state_recipe"] == frameworks.HF_STATE_RECIPE == 2
    config = json.loads((last / "config.json").read_text())
    (last / "config.json").write_text(json.dumps({**config, "hidden_act": "relu", "layer_norm_eps": 1.0}))
    write_record(run_dir, thawed(read_record(run_dir)))  # the forger seals the edit in
    forged = veritrain("verify", run_dir.name, "--json", cwd=tmp_path)
    assert forged.code == 1 and {"path": run["trajectory"][-1]["file"], "kind": "not_in_trajectory"} in [
        {k: p[k] for k in ("path", "kind")} for p in forged.json()["problems"]], forged.stdout
    files = {p.name: p for p in last.iterdir() if p.is_file()}  # recipe 1, as runs made before it were hashed: config.json left out
    before = frameworks.hf_hashes({k: v for k, v in files.items() if k != "config.json"}, recipe=1)
    assert frameworks.hf_hashes(files, recipe=1) == before and frameworks.hf_hashes(files, recipe=2) != before


def test_a_resume_from_a_checkpoint_folder_after_kill_9_continues_the_same_run(tmp_path):
    shutil.copyfile(EXAMPLE, tmp_path / "hf_trainer.py")
    proc = subprocess.Popen([sys.executable, str(tmp_path / "hf_trainer.py"), "--steps", "400"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not list(tmp_path.glob("runs/*/checkpoints/checkpoint-20/veritrain.json")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert record(tmp_path, run_dir.name)["status"] == "running"
    newest = max(run_dir.glob("checkpoints/checkpoint-*/veritrain.json"), key=lambda p: int(p.parent.name.split("-")[1])).parent
    done = train(tmp_path, "--steps", "400", "--resume", str(newest))
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]
    run = record(tmp_path, run_dir.name)
    assert run["status"] == "completed" and len(run["resumes"]) == 1
    assert [e["step"] for e in run["trajectory"]] == [0] + list(range(10, 401, 10))
    assert veritrain("verify", run_dir.name, cwd=tmp_path).code == 0
