"""examples/own_loop.py, the hand-written loop of docs/api.md, held to the acceptance of the API: two runs end in
the same state, ten kills at random moments each resume bit-identically (benchmarks/chaos_resume.py), an audit of
two segments is identical, replays use the recorded copy of the script, and verify catches one changed byte of
an input or of that copy. The fast checks of the same machinery are tests/test_api.py."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sklearn.datasets
from conftest import ROOT, veritrain

pytestmark = pytest.mark.slow
EXAMPLE = ROOT / "examples" / "own_loop.py"


def test_ten_kills_at_random_moments_each_resume_bit_identically():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos_resume.py"), "--kills", "0", "--script-kills", "10",
                           "--seed", "3"], capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "10/10 identical (script;" in done.stdout, done.stdout


def test_the_example_verifies_reproduces_audits_and_binds_its_script_and_data(tmp_path):
    data = tmp_path / "digits.csv"
    with gzip.open(Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz") as source:
        data.write_bytes(source.read())
    script = tmp_path / "own_loop.py"
    shutil.copyfile(EXAMPLE, script)

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, str(script), "--epochs", "2", "--data", "digits.csv", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        run_id, level = done.stdout.split()[-2:]
        assert level == "replayable"
        return run_id

    first, second = run(), run()
    records = [json.loads((tmp_path / "runs" / r / "record.json").read_text()) for r in (first, second)]
    assert records[0]["final_state_sha256"] == records[1]["final_state_sha256"]
    assert veritrain("verify", first, cwd=tmp_path).code == 0

    original = script.read_text()
    script.write_text(original.replace("lr=cfg[\"lr\"]", "lr=2 * cfg[\"lr\"]"))  # edited after the run: replays ignore it
    try:
        audit = veritrain("audit", first, "--segments", "2", "--json", cwd=tmp_path)
        reproduce = veritrain("reproduce", first, "--json", cwd=tmp_path)
    finally:
        script.write_text(original)
    assert audit.code == 0 and audit.json()["verdict"] == "identical", audit.stdout
    assert reproduce.code == 0 and reproduce.json()["verdict"] == "identical", reproduce.stderr
    for done in (audit, reproduce):
        named = [line for line in done.stderr.splitlines() if "differs from the copy recorded" in line]
        assert len(named) >= 1 and "own_loop.py" in named[0] and "line" in named[0]

    for path, named in ((data, "digits.csv"), (tmp_path / "runs" / first / "code" / "script" / "own_loop.py", "code/script/own_loop.py")):
        content = path.read_bytes()
        path.write_bytes(content[:100] + bytes([content[100] ^ 1]) + content[101:])
        try:
            verified = veritrain("verify", first, "--json", cwd=tmp_path)
        finally:
            path.write_bytes(content)
        assert verified.code == 1 and [p["path"] for p in verified.json()["problems"]] == [named]
