"""veritrain.lightning (docs/api.md): examples/lightning_module.py, a LightningModule fitted by a Trainer with the
Callback and the CheckpointIO plugin.

- With vt.lightning.loader and vt.lightning.ckpt_path it is `replayable`: it verifies, an audit replays segments
  from the initial state and from mid-epoch checkpoints and says identical (and says differs when the replayed
  training differs), reproduce gives the same final state, and a resume through the script's own ckpt_path
  continues the same run (ten kills, each continued with `veritrain train --resume`: test_lightning_chaos.py).
- With torch's DataLoader it is `bound`: it verifies, and reproduce and audit refuse it with the reason.
- The loader itself: the order of run.batches, a position that survives state_dict/load_state_dict, refusals.

Needs the lightning extra (make test-slow)."""

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


def fit(root: Path, *args: str, script: str = "lightning_module.py", env: dict | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, str(root / script), *args], cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def record(root: Path, run_id: str) -> dict:
    return json.loads((root / "runs" / run_id / "record.json").read_text())


@pytest.fixture(scope="module")
def replayable(tmp_path_factory) -> tuple[Path, str]:
    """One replayable run of the example, 2 epochs of 23 batches, a checkpoint every 8 steps."""
    root = tmp_path_factory.mktemp("lightning")
    shutil.copyfile(EXAMPLE, root / "lightning_module.py")
    done = fit(root, "--epochs", "2")
    assert done.returncode == 0, done.stderr
    (run_dir,) = (root / "runs").iterdir()
    return root, run_dir.name


def test_a_replayable_run_verifies_audits_identical_and_reproduces(replayable):
    root, run_id = replayable
    run = record(root, run_id)
    assert run["kind"] == "script" and run["script"]["integration"] == "lightning" and run["status"] == "completed"
    assert run["guarantee"] == {"level": "replayable", "reasons": []}
    assert run["script"]["api"]["batches"] and run["script"]["api"]["state_registered"]
    assert run["config"]["hparams"] == {"lr": 0.05, "hidden": 64} and run["config"]["trainer"]["max_epochs"] == 2
    assert [e["step"] for e in run["trajectory"]] == [0, 8, 16, 24, 32, 40, 46]
    assert all(e["kept"] and e["file"].endswith(".ckpt") for e in run["trajectory"][1:])
    assert veritrain("verify", run_id, cwd=root).code == 0
    before = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    # every segment: from the initial state (0 → 8), from mid-epoch checkpoints, and across the epoch's end (16 → 24)
    audited = veritrain("audit", run_id, "--segments", "6", "--seed", "1", "--json", cwd=root)
    assert audited.code == 0, audited.stderr
    verdicts = audited.json()["segments"]
    assert [v["verdict"] for v in verdicts] == ["identical"] * 6
    assert {v["replayed_from_step"] for v in verdicts} >= {0, 8}
    # the metrics at the end of fit, re-derived by replaying the last epoch with its validation
    assert [r["verdict"] for r in audited.json()["results"] if r["what"] == "metrics.final"] == ["identical"]
    after = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and ".veritrain" not in p.parts)
    assert after == [p for p in before if ".veritrain" not in p.parts]  # an audit writes nothing outside its state
    reproduced = veritrain("reproduce", run_id, "--json", cwd=root)
    assert reproduced.code == 0, reproduced.stderr
    checks = {c["what"]: c["verdict"] for c in reproduced.json()["checks"]}
    assert checks["final_state_sha256"] == "identical", checks
    checked = veritrain("check", run_id, "--json", cwd=root)
    assert checked.stdout.startswith("{"), checked.stderr
    rows = {r["id"]: r for r in checked.json()["items"]}
    assert rows["auditable"]["status"] == "pass"


def test_lightning_attacks_are_caught_by_the_audit_without_a_key(replayable, tmp_path):
    """After the honest audit: the forger names a fake interpreter in the record and raises a metric at the end of fit,
    and re-seals. The audit re-derives the metrics by replaying the last epoch with its validation, and never runs
    the fake interpreter (a marker file it would write stays absent)."""
    from test_threat_model import forge

    root, run_id = replayable
    run = record(root, run_id)
    assert run["metrics"]["final"]["val_acc"] < 1
    marker = tmp_path / "ran"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)

    def forged(record: dict) -> None:
        record["script"]["executable"] = str(fake)
        record["metrics"]["final"]["val_acc"] = 1.0

    run_dir = root / "runs" / run_id
    honest = {name: (run_dir / name).read_bytes() for name in ("record.json", "record.sha256", "provenance.intoto.jsonl")}
    forge(run_dir, forged)
    try:
        assert veritrain("verify", run_id, cwd=root).code == 0
        audited = veritrain("audit", run_id, "--segments", "1", "--seed", "3", "--json", cwd=root)
    finally:  # the honest run again, for the other tests of the module
        for name, content in honest.items():
            (run_dir / name).write_bytes(content)
    assert audited.code == 1, audited.stderr
    final = [r for r in audited.json()["results"] if r["what"] == "metrics.final"]
    assert final and final[0]["verdict"] == "differs" and "val_acc" in final[0]["detail"], final
    assert not marker.exists()


def test_an_audit_says_differs_when_the_replayed_training_differs(tmp_path):
    """A run of the example whose script adds noise to the loss when a file LT_NOISE is in its working directory (the
    replay's environment is built from nothing, so a variable would not reach it): a replay with the file no longer
    reaches the recorded states."""
    copy = tmp_path
    noisy = EXAMPLE.read_text().replace("loss = F.cross_entropy(self.net(x), y)\n",
                                        "loss = F.cross_entropy(self.net(x), y)\n"
                                        "        loss = loss * 1.001 if __import__('os').path.exists('LT_NOISE') else loss\n")
    assert noisy != EXAMPLE.read_text()
    (copy / "lightning_module.py").write_text(noisy)
    done = fit(copy, "--epochs", "1")
    assert done.returncode == 0, done.stderr
    (new_id,) = [p.name for p in (copy / "runs").iterdir()]
    (copy / "LT_NOISE").touch()
    audited = veritrain("audit", new_id, "--segments", "2", "--seed", "4", "--json", cwd=copy)
    assert audited.code == 1, audited.stderr
    first = next(v for v in audited.json()["segments"] if v["verdict"] != "unchecked")
    assert first["verdict"] == "differs" and "recorded" in first["detail"]


def test_a_resume_through_ckpt_path_after_kill_9_continues_the_same_run(tmp_path):
    shutil.copyfile(EXAMPLE, tmp_path / "lightning_module.py")
    proc = subprocess.Popen([sys.executable, str(tmp_path / "lightning_module.py"), "--epochs", "30"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(tmp_path.glob("runs/*/checkpoints/*.ckpt"))) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert record(tmp_path, run_dir.name)["status"] == "running"
    newest = sorted(run_dir.glob("checkpoints/*.ckpt"), key=lambda p: p.stat().st_mtime)[-2]  # one before the newest
    done = fit(tmp_path, "--epochs", "30", "--ckpt", str(newest))
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]  # the same run, no new one
    run = record(tmp_path, run_dir.name)
    assert run["status"] == "completed" and len(run["resumes"]) == 1 and run["training"]["epochs"] == 30
    assert run["guarantee"]["level"] == "replayable"
    assert [e["step"] for e in run["trajectory"]] == [0, *range(8, 690, 8), 690]
    assert not list(run_dir.glob("checkpoints/*-v1.ckpt"))  # the files written after the one resumed from went first
    assert veritrain("verify", run_dir.name, cwd=tmp_path).code == 0


def test_with_torch_s_dataloader_a_run_is_bound_and_refused_a_replay(tmp_path):
    shutil.copyfile(EXAMPLE, tmp_path / "lightning_module.py")
    done = fit(tmp_path, "--epochs", "1", "--torch-loader")
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = record(tmp_path, run_dir.name)
    assert run["guarantee"]["level"] == "bound"
    assert run["guarantee"]["reasons"] == ["the training batches came from a loader of the script's own, whose position a resume or "
                                           "replay through Lightning does not restore (give trainer.fit vt.lightning.loader(dataset, batch_size))"]
    assert run["metrics"]["final"]["checkpoint"] == run["trajectory"][-1]["file"] and "val_acc" in run["metrics"]["final"]
    assert veritrain("verify", run_dir.name, cwd=tmp_path).code == 0
    rows = {r["id"]: r for r in veritrain("check", run_dir.name, "--json", cwd=tmp_path).json()["items"]}
    assert rows["checkpoint_with_optimizer"]["status"] == "pass" and rows["auditable"]["status"] == "missing"
    for command in ("reproduce", "audit"):
        refused = veritrain(command, run_dir.name, cwd=tmp_path)
        assert refused.code == 2 and f"a bound run, so {command} cannot replay it" in refused.stderr
        assert "vt.lightning.loader" in refused.stderr
    refused = veritrain("train", "--resume", run_dir.name, cwd=tmp_path)
    assert refused.code == 2 and "completed" in refused.stderr
    kept = run_dir / run["trajectory"][-1]["file"]
    content = kept.read_bytes()
    kept.write_bytes(content[:-1] + bytes([content[-1] ^ 1]))
    assert veritrain("verify", run_dir.name, cwd=tmp_path).code == 1


def test_a_fit_not_started_from_ckpt_path_is_bound_with_the_reason(tmp_path):
    script = tmp_path / "lightning_module.py"
    script.write_text(EXAMPLE.read_text().replace("ckpt_path=vt.lightning.ckpt_path(args.ckpt)", "ckpt_path=args.ckpt"))
    done = fit(tmp_path, "--epochs", "1")
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    guarantee = record(tmp_path, run_dir.name)["guarantee"]
    assert guarantee["level"] == "bound" and guarantee["reasons"] == [
        "trainer.fit did not take its ckpt_path from vt.lightning.ckpt_path(...), so a replay cannot start the fit at a checkpoint"]


def test_the_callback_without_the_plugin_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "lightning_module.py"
    script.write_text(EXAMPLE.read_text().replace("plugins=[vt.lightning.CheckpointIO()]", "plugins=[]"))
    done = fit(tmp_path, "--epochs", "1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("error: vt.lightning.Callback: the Trainer's checkpoints are not hashed; "
                                                    "add plugins=[vt.lightning.CheckpointIO()]")


# ---------------------------------------------------------------- the loader alone


def test_the_loader_draws_run_batches_order_and_resumes_at_its_position():
    import numpy as np
    import torch
    from torch.utils.data import TensorDataset

    import veritrain as vt
    from veritrain.train.order import Order

    data = TensorDataset(torch.arange(50).float())
    loader = vt.lightning.loader(data, batch_size=8, seed=7)
    assert isinstance(loader, vt.lightning.Loader) and len(loader) == 7
    iter(loader)  # Lightning calls iter() once only to check: nothing moves until a batch is drawn
    first = [batch[0].long().tolist() for batch in loader]
    order = Order(50, 8, 2, False, 7)
    assert first == [order.rows(step).tolist() for step in range(7)]
    second = iter(loader)  # each pass is the next epoch
    assert next(second)[0].long().tolist() == order.rows(7).tolist()
    for _ in range(3):
        loader._batch_trained()  # as the Callback counts the batches trained
    state = loader.state_dict()
    assert (state["epoch"], state["batch"], state["seed"], state["n"]) == (1, 3, 7, 50)
    again = vt.lightning.loader(data, batch_size=8, seed=7)
    again.load_state_dict(state)
    assert [b[0].long().tolist() for b in again] == [order.rows(step).tolist() for step in range(10, 14)]
    assert [b[0].long().tolist() for b in again] == [order.rows(step).tolist() for step in range(14, 21)]
    plain = vt.lightning.loader(data, batch_size=8, shuffle=False, drop_last=True, seed=7)
    assert len(plain) == 6 and np.concatenate([b[0].long().numpy() for b in plain]).tolist() == list(range(48))


def test_the_loader_refuses_another_order_and_bad_arguments():
    import torch
    from torch.utils.data import TensorDataset

    import veritrain as vt

    data = TensorDataset(torch.arange(50).float())
    state = vt.lightning.loader(data, batch_size=8, seed=7).state_dict()
    with pytest.raises(vt.UsageError, match=r"another order \(batch_size 8 → 16\)"):
        vt.lightning.loader(data, batch_size=16, seed=7).load_state_dict(state)
    with pytest.raises(vt.UsageError, match="seed 7 → 8"):
        vt.lightning.loader(data, batch_size=8, seed=8).load_state_dict(state)
    with pytest.raises(vt.UsageError, match="batch_size 0"):
        vt.lightning.loader(data, batch_size=0)
    with pytest.raises(vt.UsageError, match="no len"):
        vt.lightning.loader(iter(range(3)), batch_size=1)
    with pytest.raises(vt.UsageError, match="no full batch"):
        vt.lightning.loader(data, batch_size=64, drop_last=True)


def test_a_resume_from_the_checkpoint_on_an_epoch_s_last_batch_is_bit_identical(tmp_path):
    """Step 184 is both a checkpoint (every 8 steps) and the last batch of epoch 8 (23 batches an epoch): Lightning
    skips that epoch's validation after resuming from it, and validation must not have moved the training's RNG."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    for root in (reference, resumed):
        root.mkdir()
        shutil.copyfile(EXAMPLE, root / "lightning_module.py")
    assert fit(reference, "--epochs", "9").returncode == 0
    proc = subprocess.Popen([sys.executable, str(resumed / "lightning_module.py"), "--epochs", "9"], cwd=resumed,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(resumed.glob("runs/*/checkpoints/epoch=7-step=184.ckpt")):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (boundary,) = resumed.glob("runs/*/checkpoints/epoch=7-step=184.ckpt")
    time.sleep(0.5)  # the file is complete: Lightning writes it whole before the next batch
    done = fit(resumed, "--epochs", "9", "--ckpt", str(boundary))
    assert done.returncode == 0, done.stderr
    (a,), (b,) = (reference / "runs").iterdir(), (resumed / "runs").iterdir()
    ra, rb = record(reference, a.name), record(resumed, b.name)
    assert [(e["step"], e["state_sha256"]) for e in ra["trajectory"]] == [(e["step"], e["state_sha256"]) for e in rb["trajectory"]]
    assert ra["final_state_sha256"] == rb["final_state_sha256"]
