"""The acceptance of docs/provenance.md: in a venv without veritrain, the standard tools check runs made here, signed
with a key of the test's own — a demo run, an `examples/own_loop.py` run and a reduced `configs/tiny-lm.yaml` run:

- the DSSE signature (the documented securesystemslib script) and `sha256sum -c` over the subjects;
- `model_signing verify key` over each export;
- `mlcroissant validate` over each data version's Croissant record;
- `mlflow.search_runs` over `veritrain runs export --to mlflow`, against `runs list --json`;
- TensorBoard's own reader over the event files, against metrics.jsonl;
- `huggingface_hub.ModelCard` over each export's README.md;

and a changed byte in a subject, in the statement or in a signature makes the standard verifier fail (make test-slow).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import veritrain_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ["securesystemslib", "cryptography", "model-signing", "pyOpenSSL", "mlcroissant", "mlflow", "tensorboard", "huggingface_hub"]
TINY_LM = ["--set", "model.layers=1", "--set", "model.width=32", "--set", "model.heads=2", "--set", "model.context=64",
           "--set", "train.epochs=1", "--set", "train.batch_size=256", "--set", "schedule.warmup_steps=2"]


def _pins(tmp: Path) -> Path:
    """The locks as pip constraints (no extras), so the tools venv gets exactly the tested versions."""
    lines = []
    for lock in ("requirements.lock", "requirements-test.lock"):
        for line in (ROOT / lock).read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                lines.append(re.sub(r"\[[^]]*\]", "", line.split("#")[0].strip()))
    path = tmp / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> Path:
    """A venv with the standard tools only: veritrain cannot be imported there."""
    folder = tmp_path_factory.mktemp("tools")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(folder / "venv")], check=True)
    python = folder / "venv" / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install", "-c", str(_pins(folder)), *TOOLS],
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    probe = subprocess.run([str(python), "-c", "import veritrain"], capture_output=True, text=True, env=_clean_env())
    assert probe.returncode != 0 and "No module named 'veritrain'" in probe.stderr
    return python


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true", **extra}


def in_tools(python: Path, code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=_clean_env(), timeout=600)


@pytest.fixture(scope="module")
def signed_runs(tmp_path_factory) -> dict:
    """The three runs, sealed with a key of this module's own; and the key's public half."""
    folder = tmp_path_factory.mktemp("runs")
    env = {"XDG_CONFIG_HOME": str(folder / "config")}
    os.environ.update(env)  # the processes below sign with it; restored at the end of the module
    try:
        made = veritrain_process("keys", "init")
        assert made.code == 0, made.stderr
        workdir = folder / "ws"
        demo = veritrain_process("run", "--set", "logging.tensorboard=true", "--workdir", str(workdir), "--json", timeout=900)
        assert demo.code == 0, demo.stderr
        lm = veritrain_process("run", str(ROOT / "configs" / "tiny-lm.yaml"), *TINY_LM, "--set", "logging.tensorboard=true",
                               "--no-smoke", "--workdir", str(workdir), "--json", timeout=900)
        assert lm.code == 0, lm.stderr
        own = subprocess.run([sys.executable, str(ROOT / "examples" / "own_loop.py"), "--epochs", "2", "--workdir", str(workdir)],
                             capture_output=True, text=True, timeout=600)
        assert own.returncode == 0, own.stderr
        own_id = json.loads((sorted((workdir / "runs").iterdir())[-1] / "record.json").read_text())["run_id"]
        runs = {"demo": workdir / "runs" / demo.json()["run_id"], "lm": workdir / "runs" / lm.json()["run_id"], "own_loop": workdir / "runs" / own_id}
        public = folder / "config" / "veritrain" / "signing-key.pub.pem"
        yield {"workdir": workdir, "runs": runs, "public": public}
    finally:
        os.environ.pop("XDG_CONFIG_HOME", None)


def _doc_block(marker: str, language: str) -> str:
    text = (ROOT / "docs" / "provenance.md").read_text(encoding="utf-8")
    return text.split(marker, 1)[1].split(f"```{language}\n", 1)[1].split("```", 1)[0]


def dsse_and_digests(python: Path, run_dir: Path, public: Path, script: Path) -> tuple[int, str]:
    listed = subprocess.run([str(python), str(script), "provenance.intoto.jsonl", str(public)], cwd=run_dir, capture_output=True,
                            text=True, env=_clean_env())
    if listed.returncode != 0:
        return listed.returncode, listed.stderr
    checked = subprocess.run(["sha256sum", "-c", "-"], cwd=run_dir, input=listed.stdout, capture_output=True, text=True)
    return checked.returncode, checked.stdout + checked.stderr


def model_signing_verify(python: Path, folder: Path, public: Path) -> tuple[int, str]:
    from veritrain.results.export_signing import VERIFY_COMMAND

    command = VERIFY_COMMAND.format(folder=folder, public_key=public).split()
    tool = python.parent / command[0]
    done = subprocess.run([str(tool), *command[1:]], capture_output=True, text=True, env=_clean_env())
    return done.returncode, done.stdout + done.stderr


def test_every_standard_tool_passes_on_the_three_runs(tools, signed_runs, tmp_path):
    from veritrain.results.export_signing import SUCCESS_LINE

    script = tmp_path / "check_provenance.py"
    script.write_text(_doc_block("<!-- provenance-script -->", "python"))
    public, workdir = signed_runs["public"], signed_runs["workdir"]
    for name, run_dir in signed_runs["runs"].items():
        code, shown = dsse_and_digests(tools, run_dir, public, script)
        assert code == 0 and "FAILED" not in shown and shown.count(": OK") >= 4, (name, shown)
        record = json.loads((run_dir / "record.json").read_text())
        assert record["provenance"]["key_fingerprint"]
        if (run_dir / "export").is_dir():
            code, shown = model_signing_verify(tools, run_dir / "export", public)
            assert code == 0 and SUCCESS_LINE in shown, (name, shown)
            card = in_tools(tools, "import sys, json; from huggingface_hub import ModelCard; c = ModelCard.load(sys.argv[1]); "
                                   "print(json.dumps(c.data.to_dict()))", str(run_dir / "export" / "README.md"))
            assert card.returncode == 0, card.stderr
            metadata = json.loads(card.stdout)
            stated = {m["type"]: m["value"] for m in metadata["model-index"][0]["results"][0]["metrics"]}
            assert all(record["metrics"]["test"][key] == value for key, value in stated.items() if key in record["metrics"]["test"]), (stated, name)
        version = (record.get("data") or {}).get("version")
        if version:
            croissant = workdir / ".veritrain" / "data" / version / "croissant.json"
            validated = subprocess.run([str(tools.parent / "mlcroissant"), "validate", "--jsonld", str(croissant)], capture_output=True,
                                       text=True, env=_clean_env())
            assert validated.returncode == 0 and "error" not in validated.stdout.lower(), (name, validated.stdout + validated.stderr)
        if (run_dir / "tensorboard").is_dir():
            read = in_tools(tools, "import sys, json\nfrom tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
                                   "a = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0}); a.Reload()\n"
                                   "print(json.dumps({t: [[e.step, e.value] for e in a.Scalars(t)] for t in a.Tags()['scalars']}))",
                            str(run_dir / "tensorboard"))
            assert read.returncode == 0, read.stderr
            scalars = json.loads(read.stdout)
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            for key in ("train_loss", "val_loss"):
                assert [round(v, 5) for _, v in scalars[f"epoch/{key}"]] == [round(row[key], 5) for row in rows], (name, key)

    out = tmp_path / "mlflow"
    exported = veritrain_process("runs", "export", *[r.name for r in signed_runs["runs"].values()], "--to", "mlflow", str(out),
                                 "--workdir", str(workdir), "--json", timeout=600)
    assert exported.code == 0, exported.stderr
    listed = {r["run_id"]: r for r in veritrain_process("runs", "list", "--json", "--workdir", str(workdir)).json()["runs"]}
    searched = in_tools(tools, "import sys, json, mlflow\nmlflow.set_tracking_uri(sys.argv[1])\nframe = mlflow.search_runs(search_all_experiments=True)\n"
                               "print(json.dumps(frame.to_dict(orient='records'), default=str))", f"sqlite:///{out / 'mlflow.db'}")
    assert searched.returncode == 0, searched.stderr
    found = {row["tags.veritrain.run_id"]: row for row in json.loads(searched.stdout)}
    assert set(found) == {r.name for r in signed_runs["runs"].values()}
    for run_id, row in found.items():
        shown = {f"{split}.{name}": value for split, values in (listed[run_id].get("metrics") or {}).items() for name, value in values.items()}
        assert shown, run_id
        for key, value in shown.items():
            assert row[f"metrics.{key}"] == pytest.approx(value, rel=1e-12), (run_id, key)


def test_a_changed_byte_anywhere_fails_the_standard_verifiers(tools, signed_runs, tmp_path):
    script = tmp_path / "check_provenance.py"
    script.write_text(_doc_block("<!-- provenance-script -->", "python"))
    original, public = signed_runs["runs"]["demo"], signed_runs["public"]

    def copy(name: str) -> Path:
        target = tmp_path / name / original.name
        shutil.copytree(original, target)
        return target

    def flip(path: Path, at: int | None = None) -> None:
        data = bytearray(path.read_bytes())
        data[len(data) // 2 if at is None else at] ^= 1
        path.write_bytes(bytes(data))

    final = json.loads((original / "record.json").read_text())["trajectory"][-1]["step"]
    for rel in sorted(p.relative_to(original).as_posix() for p in (original / "export").iterdir()) + [f"checkpoints/step-{final}.pt"]:
        run_dir = copy(rel.replace("/", "_"))
        flip(run_dir / rel)
        if rel != "export/model.sig":  # the signature file is no subject: the model signature's own check below catches it
            code, shown = dsse_and_digests(tools, run_dir, public, script)
            assert code != 0, (rel, shown)
        if rel.startswith("export/"):
            code, shown = model_signing_verify(tools, run_dir / "export", public)
            assert code != 0, (rel, shown)
    for part in ("payload", "sig"):
        run_dir = copy(part)
        envelope = json.loads((run_dir / "provenance.intoto.jsonl").read_text())
        raw = bytearray(base64.b64decode(envelope["payload"] if part == "payload" else envelope["signatures"][0]["sig"]))
        raw[len(raw) // 2] ^= 1
        encoded = base64.b64encode(bytes(raw)).decode()
        if part == "payload":
            envelope["payload"] = encoded
        else:
            envelope["signatures"][0]["sig"] = encoded
        (run_dir / "provenance.intoto.jsonl").write_text(json.dumps(envelope) + "\n")
        code, shown = dsse_and_digests(tools, run_dir, public, script)
        assert code != 0, (part, shown)
