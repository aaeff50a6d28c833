"""Secret canaries never reach a run's files, the registry or experiments.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from veritrain.secrets import redact, redact_text

CANARIES = ("canary-env-4411", "canary-ref-5522", "canary-pass-6633", "canary-hyp-7744", "canary-key-8855")


def test_redaction_rules():
    assert redact_text("see https://ann:hunter2@example.org/x") == "see https://ann:***@example.org/x"
    assert redact_text("--set model.kwargs.api_key=abc123") == "--set model.kwargs.api_key=***"
    assert redact({"api_token": "abc", "keep_last": 2, "ref": "${env:X}", "password": "${env:PW}"}) == {
        "api_token": "***", "keep_last": 2, "ref": "${env:X}", "password": "${env:PW}"}
    assert redact_text("valid keys in optim: name, lr") == "valid keys in optim: name, lr"


def test_canaries_appear_nowhere(tmp_path):
    env = {**os.environ, "VT_CANARY_TOKEN": CANARIES[0], "VT_CONTACT": CANARIES[1], "VT_EXPECTED_KEY": CANARIES[4], "PYTHONWARNINGS": "ignore"}
    args = [
        sys.executable, "-m", "veritrain", "run", "--workdir", str(tmp_path),
        "--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "export.formats=[safetensors]",
        "--set", "data.card.contact=${env:VT_CONTACT}",
        "--set", f"data.card.origin=https://data:{CANARIES[2]}@example.org/digits",
        "--set", "model.target=secret_model:checking_factory",
        "--set", f"model.kwargs={{hidden: 4, api_key_unused: {CANARIES[4]}, token: '${{env:VT_CANARY_TOKEN}}'}}",
        "--hypothesis", f"token={CANARIES[3]} makes no difference",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, env={**env, "PYTHONPATH": str(Path(__file__).parent)})
    assert proc.returncode == 0, proc.stderr  # the factory saw the real values (it checks them)
    for canary in CANARIES:
        assert canary not in proc.stderr and canary not in proc.stdout, canary
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "record.json").read_text())
    assert record["config"]["data"]["card"]["contact"] == "${env:VT_CONTACT}"  # the reference is recorded
    assert record["config"]["model"]["kwargs"]["token"] == "${env:VT_CANARY_TOKEN}"
    assert "VT_CANARY_TOKEN" not in json.dumps(record["env"])
    checked = [p for p in run_dir.rglob("*") if p.is_file()]
    checked += [tmp_path / "experiments.md", tmp_path / ".veritrain" / "registry.sqlite"]
    checked += list((tmp_path / ".veritrain" / "data").rglob("card.json"))
    subprocess.run([sys.executable, "-m", "veritrain", "runs", "list", "--workdir", str(tmp_path)], capture_output=True)
    for path in checked:
        data = path.read_bytes()
        for canary in CANARIES:
            assert canary.encode() not in data, f"{canary} in {path}"
