"""`veritrain run` end to end: the record, its artifacts, determinism, honest failure, interrupts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import FAST, FAST_OVERRIDES, ROOT, in_process_run

from veritrain.core.config import load_config
from veritrain.core.hashing import sha256_file, state_dict_sha256
from veritrain.train import checkpoint

TIMING_FIELDS = {"seconds"}  # wall-clock fields; everything else in metrics.jsonl must reproduce exactly


def metrics_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]


@pytest.fixture(scope="module")
def fast_run(small_run):
    """The shared small run, as the pipeline's outcome gives it (record, summary, seal, error)."""
    from types import SimpleNamespace

    summary = {"run_dir": str(small_run.run_dir), "run_id": small_run.run_dir.name, "data_version": small_run.record["data"]["version"]}
    return SimpleNamespace(record=small_run.record, summary=summary, seal=small_run.seal, error=small_run.record["error"])


def test_record_holds_the_contract_fields(fast_run):
    record = fast_run.record
    run_dir = Path(fast_run.summary["run_dir"])
    on_disk = json.loads((run_dir / "record.json").read_text())
    assert on_disk == record
    assert record["status"] == "completed" and fast_run.error is None
    assert record["record_version"] == 1
    assert record["run_id"] == run_dir.name
    for key in ("started_at", "ended_at", "argv", "config", "config_hash", "code", "env", "data", "seed", "metrics",
                "final_state_sha256", "artifacts", "error"):
        assert key in record, key
    assert set(record["code"]) >= {"veritrain", "git_commit", "git_dirty"}
    assert set(record["env"]) >= {"python", "platform", "cpu", "torch", "device", "packages_sha256"}
    assert record["env"]["device"] == "cpu"
    assert record["data"]["counts"] == {"train": 1437, "val": 189, "test": 171}  # data recipe 4 on the digits
    assert record["data"]["version"] == fast_run.summary["data_version"]
    assert set(record["metrics"]["test"]) >= {"accuracy", "macro_f1"}
    assert record["config_hash"] == load_config(None, FAST_OVERRIDES).hash
    assert record["error"] is None
    from veritrain.core.task_registry import task_spec

    assert record["task_spec"] == task_spec("classification").to_json()  # what its task declares, kept with the run
    if record.get("baselines"):  # the rule its task declares is named in the document it judges
        assert record["baselines"]["judged_by"] == task_spec("classification").baseline_rule()


# Computed by the code as it was before the modules moved into their layers: the same inputs must keep
# giving the same config hash and data version id, or every earlier run would stop reusing and comparing.
PINNED_DEFAULT_CONFIG_HASH = "57a87ab75d2a4e3991b425ccc551b3832587d1d44c44191293ea037d929636b7"
PINNED_SMALL_RUN_CONFIG_HASH = "111d0325f8583bbdb1e95f7d1d6595f743f07eac05a8efb51dbb92e68051e631"
PINNED_DIGITS_DATA_VERSION = "89144aea2635b27493718b5421a220a8e91ee411ca1e7a04cdfbcf777305889c"  # data recipe 7
# the bundled digits' version id under each data recipe this veritrain still writes (a test stands in for an earlier one)
PINNED_DIGITS_BY_RECIPE = {6: "b84e2e83237b19c3b86cefff36f184045c8da8d88bdeea041f980d022e80e460", 7: PINNED_DIGITS_DATA_VERSION}


@pytest.mark.parametrize("recipe", sorted(PINNED_DIGITS_BY_RECIPE))
def test_each_data_recipe_gives_the_digits_its_pinned_version_id(recipe, tmp_path, monkeypatch):
    from veritrain.data import identity, prepare

    cfg = load_config(None, []).config
    monkeypatch.setattr(identity, "FORMAT_VERSION", recipe)  # every reader looks the recipe up there
    version = prepare.run(cfg.data, {}, tmp_path / ".veritrain")
    assert version.version == PINNED_DIGITS_BY_RECIPE[recipe] and version.info["format"] == recipe
    assert (version.path / "inputs.npy").exists() == (recipe < identity.FIELDS_SINCE)
    assert int(version.targets[0]) == 0 and version.inputs.shape == (1797, 8, 8, 1) and len(version.sample_ids) == 1797


# configs/tiny-lm.yaml's text data version under text recipe 3 (its recipe 2 version, 045ffc4b…, is kept in the fixture
# tests/fixtures/legacy/format0-lm.tar.gz, which tests/test_legacy_kinds.py verifies)
PINNED_TINY_LM_DATA_VERSION = "c5a7cfed96e6c686971d30765501649071dedc913a47edb75e8e68f7396b16a4"


def test_the_tiny_lm_text_version_id_is_pinned(tmp_path):
    from veritrain.data import identity, prepare

    resolved = load_config(ROOT / "configs" / "tiny-lm.yaml", [])
    version = prepare.run(resolved.config.data, resolved.data_paths, tmp_path / ".veritrain")
    assert version.info["format"] == identity.TEXT_RECIPE == 3 and version.version == PINNED_TINY_LM_DATA_VERSION
    assert all(len(version.tokens[split]) == version.info["tokens"][split] for split in ("train", "val", "test"))  # type: ignore[attr-defined]


def test_config_hash_and_data_version_id_are_unchanged_for_the_same_inputs(fast_run):
    assert load_config(None, []).hash == PINNED_DEFAULT_CONFIG_HASH
    assert load_config(ROOT / "configs" / "digits.yaml", []).hash == PINNED_DEFAULT_CONFIG_HASH
    assert load_config(None, FAST_OVERRIDES).hash == fast_run.record["config_hash"] == PINNED_SMALL_RUN_CONFIG_HASH
    assert fast_run.record["data"]["version"] == PINNED_DIGITS_DATA_VERSION


def test_the_resolved_config_of_a_recorded_run_is_the_one_it_ran(fast_run):
    """`resolved_from_record` is the one rebuild of a run's config (resume, reproduce, eval, export, audit, ranks):
    the same hash, and the data paths as recorded."""
    from veritrain.core.config import resolved_from_record

    resolved = resolved_from_record(fast_run.record)
    assert resolved.hash == fast_run.record["config_hash"]
    assert resolved.recorded_data_paths() == fast_run.record["config_source"]["data_paths_resolved"]
    assert resolved.path is None and resolved.overrides == []


def test_run_directory_layout(fast_run):
    run_dir = Path(fast_run.summary["run_dir"])
    for name in ("record.json", "record.sha256", "config.yaml", "train.log", "metrics.jsonl",
                 "checkpoints/last.pt", "checkpoints/best.pt", "eval/test/metrics.json", "env/requirements.lock"):
        assert (run_dir / name).is_file(), name
    assert not any(p.is_symlink() for p in run_dir.rglob("*"))
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved == fast_run.record["config"]
    log_text = (run_dir / "train.log").read_text()
    assert "epoch 2/2" in log_text and "eval: test split" in log_text and "completed" in log_text


def test_every_artifact_hash_matches_its_file(fast_run):
    run_dir = Path(fast_run.summary["run_dir"])
    artifacts = fast_run.record["artifacts"]
    files = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()}
    assert set(artifacts) == files - {"record.json", "record.sha256", "provenance.intoto.jsonl"}  # statements about the seal
    for rel, entry in artifacts.items():
        assert entry == {"sha256": sha256_file(run_dir / rel), "size": (run_dir / rel).stat().st_size}, rel
    seal = (run_dir / "record.sha256").read_text().strip()
    assert seal == hashlib.sha256((run_dir / "record.json").read_bytes()).hexdigest() == fast_run.seal


def test_metrics_jsonl_has_one_row_per_epoch(fast_run):
    rows = metrics_rows(Path(fast_run.summary["run_dir"]))
    assert [r["epoch"] for r in rows] == [1, 2]
    for row in rows:
        assert {"epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "seconds"} <= set(row)


def test_final_state_hash_is_the_last_step_weights(fast_run):
    run_dir = Path(fast_run.summary["run_dir"])
    last = checkpoint.load(run_dir / "checkpoints" / "last.pt")
    assert state_dict_sha256(last["model"]) == fast_run.record["final_state_sha256"]


def test_state_hash_follows_the_documented_recipe():
    import torch

    state = {"b": torch.tensor([1, 2], dtype=torch.int64), "a": torch.ones(2, 1)}
    digest = hashlib.sha256()
    digest.update(b"a\0torch.float32\x002,1\0" + torch.ones(2, 1).numpy().tobytes())
    digest.update(b"b\0torch.int64\x002\0" + torch.tensor([1, 2]).numpy().tobytes())
    assert state_dict_sha256(state) == digest.hexdigest()


def test_same_seed_same_weights_and_metrics_other_seed_differs(fast_run, tmp_path):
    again = in_process_run(tmp_path, FAST_OVERRIDES)
    # Exact equality is promised for the same config and seed on the same machine.
    assert again.record["final_state_sha256"] == fast_run.record["final_state_sha256"]
    assert again.record["metrics"] == fast_run.record["metrics"]
    assert without_timing(metrics_rows(Path(again.summary["run_dir"]))) == without_timing(
        metrics_rows(Path(fast_run.summary["run_dir"]))
    )
    assert again.summary["run_id"] != fast_run.summary["run_id"]

    # only its weights and data version are compared: no baselines, one cheap export
    other = in_process_run(tmp_path, FAST_OVERRIDES + ["seed=1", "eval.baselines=false", "export.formats=[safetensors]"])
    assert other.record["final_state_sha256"] != fast_run.record["final_state_sha256"]
    assert other.record["data"]["version"] == fast_run.record["data"]["version"]  # the split has its own seed


def test_default_config_reaches_095_on_digits(default_run_copy):
    record = default_run_copy.record
    assert record["status"] == "completed" and record["config_hash"] == PINNED_DEFAULT_CONFIG_HASH
    assert record["metrics"]["test"]["accuracy"] >= 0.95


def test_a_crash_mid_run_is_recorded_as_failed(tmp_path, monkeypatch):
    from veritrain.tasks.classification import ClassificationTask

    calls = {"n": 0}
    original = ClassificationTask.loss

    def exploding_loss(self, outputs, targets):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("simulated failure in the loss")
        return original(self, outputs, targets)

    monkeypatch.setattr(ClassificationTask, "loss", exploding_loss)
    outcome = in_process_run(tmp_path, FAST_OVERRIDES)
    run_dir = Path(outcome.summary["run_dir"])
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "failed"
    assert record["error"] == {"type": "RuntimeError", "message": "simulated failure in the loss"}
    assert outcome.error is not None and outcome.error.exit_code == 1
    assert str(outcome.error) == f"run {run_dir.name} failed: RuntimeError: simulated failure in the loss (traceback in {run_dir / 'train.log'})"
    log_text = (run_dir / "train.log").read_text()
    assert "Traceback (most recent call last)" in log_text and "exploding_loss" in log_text
    for rel, entry in record["artifacts"].items():  # a failed run is still sealed and consistent
        assert sha256_file(run_dir / rel) == entry["sha256"]
    assert not (tmp_path / ".veritrain" / "locks" / f"{run_dir.name}.lock").exists()


def test_cli_run_json_and_summary(cli, tmp_path):
    result = cli("run", *FAST, "--workdir", str(tmp_path), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()  # stdout holds exactly one JSON document
    assert set(payload) == {"run_id", "run_dir", "status", "data_version", "final_state_sha256", "metrics"}
    assert payload["status"] == "completed"
    assert Path(payload["run_dir"]) == tmp_path / "runs" / payload["run_id"]
    assert "record.json" in result.stderr and "data version" in result.stderr
    record = json.loads((Path(payload["run_dir"]) / "record.json").read_text())
    assert record["argv"][1:] == ["run", *FAST, "--workdir", str(tmp_path), "--json"]
    assert record["config_source"]["overrides"] == FAST_OVERRIDES
    assert record["config"]["train"]["epochs"] == 2


def test_cli_failed_run_exits_1_with_one_line(cli, tmp_path):
    result = cli("run", *FAST, "--set", "optim.name=sgd", "--set", "optim.lr=1e30", "--no-smoke", "--workdir", str(tmp_path))
    assert result.code == 1
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: run ") and "failed: train: loss became" in last_line
    assert "Traceback" not in result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "record.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_marks_run_interrupted(tmp_path, signum, code):
    proc = subprocess.Popen(
        [sys.executable, "-m", "veritrain", "run", "--no-smoke", "--workdir", str(tmp_path), "--set", "train.epochs=500",
         "--set", "model.name=mlp"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("runs/*/metrics.jsonl")):  # training has started
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == f"error: interrupted by {signal.Signals(signum).name}"
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "interrupted" and record["ended_at"]
    assert "Traceback" not in stderr


@pytest.mark.slow  # several processes
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_the_process_group_stops_a_run_with_workers_at_a_step_and_it_resumes(tmp_path, signum, code):
    """A terminal's Ctrl-C, or a service manager's SIGTERM, reaches every process of the group, the batch workers too:
    they leave it to the training process, which saves at the end of its step and stops (exit 130 or 143); the run then
    resumes and completes."""
    common = ["--workdir", str(tmp_path), "--set", "train.epochs=40", "--set", "model.name=mlp", "--set", "train.num_workers=2",
              "--set", "augment.hflip=true", "--set", "checkpoint.every_steps=7"]
    proc = subprocess.Popen([sys.executable, "-m", "veritrain", "train", *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("runs/*/metrics.jsonl")):  # training has started, and its workers
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    os.killpg(proc.pid, signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code and "Traceback" not in stderr, stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "record.json").read_text())["status"] == "interrupted"
    done = subprocess.run([sys.executable, "-m", "veritrain", "train", "--resume", run_dir.name, "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "record.json").read_text())["status"] == "completed"


def test_git_state_and_diff_patch(small_run_copy):
    from veritrain.records.record import capture_code

    workdir = small_run_copy.workdir  # a workspace that has runs/, .veritrain/ and experiments.md

    def git(*args):
        subprocess.run(["git", "-C", str(workdir), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    (workdir / "train_notes.txt").write_text("v1\n")
    git("add", "train_notes.txt")
    git("commit", "-qm", "first")
    assert (workdir / "experiments.md").is_file()
    clean = capture_code(workdir)
    assert clean["git_dirty"] is False  # its own runs/, .veritrain/ and experiments.md do not count
    assert len(clean["git_commit"]) == 40
    (workdir / "train_notes.txt").write_text("v2\n")
    dirty = in_process_run(workdir, FAST_OVERRIDES)
    code = dirty.record["code"]
    assert code["git_dirty"] is True and code["git_commit"] == clean["git_commit"]
    patch = (Path(dirty.summary["run_dir"]) / "code" / "diff.patch").read_text()
    assert "-v1" in patch and "+v2" in patch
    assert code["diff_patch"]["sha256"] == hashlib.sha256(patch.encode()).hexdigest()
    assert dirty.record["artifacts"]["code/diff.patch"]["sha256"] == code["diff_patch"]["sha256"]


def test_a_note_stays_outside_the_seal_when_the_run_is_sealed_again(small_run_copy):
    from veritrain.records.record import read_record, thawed, write_record
    from veritrain.trust.verify import verify_run

    run_dir = small_run_copy.run_dir  # a sealed run of its own workspace, free to amend
    assert not (run_dir / "notes.jsonl").exists()
    (run_dir / "notes.jsonl").write_text(json.dumps({"text": "looks fine"}) + "\n")
    write_record(run_dir, thawed(read_record(run_dir)))  # what eval, export, baseline and gc do after a note
    assert "notes.jsonl" not in read_record(run_dir)["artifacts"]
    (run_dir / "notes.jsonl").write_text(json.dumps({"text": "second thoughts"}) + "\n")  # notes change freely
    assert verify_run(run_dir, small_run_copy.workdir / ".veritrain")["ok"]


def test_gc_keeps_every_data_version_while_a_record_cannot_be_read(small_run_copy):
    from veritrain.orchestration import housekeeping
    from veritrain.records.workspace import Workspace

    record = small_run_copy.record  # the one run of this workspace and the data version it was trained on
    workspace = Workspace.open(small_run_copy.workdir)
    orphan = workspace.state_dir / "data" / ("0" * 64)  # a data version no run references
    orphan.mkdir()
    (orphan / "version.json").write_text("{}")
    broken = workspace.runs_dir / "20990101-000000-000-broken"
    broken.mkdir()
    (broken / "record.json").write_text("{not json")
    kept = housekeeping.gc(workspace, dry_run=False)
    assert orphan.exists() and "cannot be read" in kept["data_versions_kept_because"]
    shutil.rmtree(broken)
    freed = housekeeping.gc(workspace, dry_run=False)
    assert not orphan.exists() and freed["data_versions_kept_because"] is None
    assert (workspace.state_dir / "data" / record["data"]["version"]).exists()


def test_eval_and_export_failures_are_one_line_errors(cli, tmp_path):
    outcome = in_process_run(tmp_path, ["train.epochs=1", "model.name=mlp", "model.hidden=[16]", "checkpoint.best=false",
                                        "eval.baselines=false", "export.formats=[safetensors]"])
    run_id = outcome.summary["run_id"]
    assert outcome.record["status"] == "completed"
    evaluated = cli("eval", run_id, "--workdir", str(tmp_path), "--json")  # no best.pt: the default is last.pt
    assert evaluated.code == 0 and evaluated.json()["checkpoint"].endswith("last.pt")
    missing = cli("eval", run_id, "--checkpoint", "checkpoints/nosuch.pt", "--workdir", str(tmp_path))
    errors = [line for line in missing.stderr.splitlines() if line.startswith("error:")]
    assert missing.code == 2 and len(errors) == 1 and "nosuch.pt" in errors[0] and "Traceback" not in missing.stderr
    exported = cli("export", run_id, "--checkpoint", "best", "--workdir", str(tmp_path))
    assert exported.code == 2 and "best.pt" in exported.stderr and "Traceback" not in exported.stderr
    last = Path(outcome.summary["run_dir"]) / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:100])  # damaged: does not match its sidecar
    damaged = cli("eval", run_id, "--checkpoint", "last", "--workdir", str(tmp_path))
    # caught by the run's own seal before the checkpoint's sidecar is even read: nothing is evaluated or re-sealed
    assert damaged.code == 1 and "checkpoints/last.pt: changed" in damaged.stderr and "does not verify" in damaged.stderr
    assert "Traceback" not in damaged.stderr
    predictions = tmp_path / "short.csv"
    predictions.write_text("sample_id,label,prediction,confidence,p_a,p_b\nx,a,a\n")
    parsed = cli("eval", "--predictions", str(predictions))
    assert parsed.code == 2 and "line 2" in parsed.stderr and "Traceback" not in parsed.stderr
    (Path(outcome.summary["run_dir"]) / "record.json").write_text("{damaged")
    shown = cli("runs", "show", run_id, "--workdir", str(tmp_path))
    assert shown.code == 1 and "record.json" in shown.stderr and "Traceback" not in shown.stderr
