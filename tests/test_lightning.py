"""veritrain.lightning (docs/api.md): examples/lightning_module.py, a LightningModule fitted by a Trainer with the
Callback and the CheckpointIO plugin, recorded as a `bound` run: it verifies (every Lightning checkpoint it keeps is
loaded again and must hold its trajectory entry's state), reproduce and audit refuse it with the reason, and a
resume through ckpt_path after kill -9 continues the same run. Needs the lightning extra (make test-slow)."""

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
EXAMPLE = ROOT / "examples" / "lightning_module.py"

try:
    import lightning  # noqa: F401
    HAVE_LIGHTNING = True
except ImportError:
    HAVE_LIGHTNING = False


@pytest.fixture(autouse=True)
def _lightning():
    need_extra(HAVE_LIGHTNING, "the lightning extra (pip install 'veritrain[lightning]')")


def fit(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "lightning_module.py"), *args], cwd=root, capture_output=True, text=True, timeout=600)


def record(root: Path, run_id: str) -> dict:
    return json.loads((root / "runs" / run_id / "record.json").read_text())


def test_a_lightning_run_is_bound_verifies_and_is_refused_a_replay(tmp_path):
    shutil.copyfile(EXAMPLE, tmp_path / "lightning_module.py")
    done = fit(tmp_path, "--epochs", "2")
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = record(tmp_path, run_dir.name)
    assert run["kind"] == "script" and run["script"]["integration"] == "lightning" and run["status"] == "completed"
    assert run["guarantee"]["level"] == "bound" and "Lightning owns the loop" in run["guarantee"]["reasons"][0]
    assert run["config"]["hparams"] == {"lr": 0.05, "hidden": 64} and run["config"]["trainer"]["max_epochs"] == 2
    files = [e["file"] for e in run["trajectory"] if e.get("kept")]
    assert files and all((run_dir / f).is_file() for f in files) and files[-1].endswith(".ckpt")
    assert run["metrics"]["final"]["checkpoint"] == files[-1] and "val_acc" in run["metrics"]["final"]
    assert veritrain("verify", run_dir.name, cwd=tmp_path).code == 0
    rows = {r["id"]: r for r in veritrain("check", run_dir.name, "--json", cwd=tmp_path).json()["items"]}
    assert rows["checkpoint_with_optimizer"]["status"] == "pass" and rows["auditable"]["status"] == "missing"
    for command in ("reproduce", "audit"):
        refused = veritrain(command, run_dir.name, cwd=tmp_path)
        assert refused.code == 2 and f"a bound run, so {command} cannot replay it" in refused.stderr
    refused = veritrain("train", "--resume", run_dir.name, cwd=tmp_path)
    assert refused.code == 2 and "completed" in refused.stderr
    kept = run_dir / files[-1]
    content = kept.read_bytes()
    kept.write_bytes(content[:-1] + bytes([content[-1] ^ 1]))
    assert veritrain("verify", run_dir.name, cwd=tmp_path).code == 1


def test_a_resume_through_ckpt_path_after_kill_9_continues_the_same_run(tmp_path):
    shutil.copyfile(EXAMPLE, tmp_path / "lightning_module.py")
    proc = subprocess.Popen([sys.executable, str(tmp_path / "lightning_module.py"), "--epochs", "30"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp_path.glob("runs/*/checkpoints/*.ckpt")):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert record(tmp_path, run_dir.name)["status"] == "running"
    refused = veritrain("train", "--resume", run_dir.name, cwd=tmp_path)  # Lightning resumes through its own ckpt_path
    assert refused.code == 2 and "ckpt_path" in refused.stderr, refused.stderr
    newest = sorted(run_dir.glob("checkpoints/*.ckpt"), key=lambda p: p.stat().st_mtime)[-1]
    done = fit(tmp_path, "--epochs", "30", "--ckpt", str(newest))
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]  # the same run, no new one
    run = record(tmp_path, run_dir.name)
    assert run["status"] == "completed" and len(run["resumes"]) == 1 and run["training"]["epochs"] == 30
    assert [e["step"] for e in run["trajectory"]] == [0] + [23 * k for k in range(1, 31)]
    assert veritrain("verify", run_dir.name, cwd=tmp_path).code == 0


def test_the_callback_without_the_plugin_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "lightning_module.py"
    script.write_text(EXAMPLE.read_text().replace("plugins=[vt.lightning.CheckpointIO()]", "plugins=[]"))
    done = fit(tmp_path, "--epochs", "1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("error: vt.lightning.Callback: the Trainer's checkpoints are not hashed; "
                                                    "add plugins=[vt.lightning.CheckpointIO()]")
