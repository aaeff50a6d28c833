"""Every result bound to the audited training. The forgeries a trainer who controls the machine (and re-seals)
would try, each made with veritrain's own functions: an outside checkpoint given to eval/export, best.pt replaced
by a state listed as a timing save, a kept checkpoint deleted with its flags rewritten, a checkpoint replaced by
something else, a metric rewritten, exported weights swapped. Each is refused or named by `verify` or `audit`, and
the run's recorded test metrics stay as they were. Nothing here trains more than the one shared run."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import in_process_run, veritrain

# 3 epochs of 23 steps, a checkpoint every 10 steps: entries at steps 0, 10, 20, 23, 30, 40, 46, 50, 60, 69 (9
# segments); keep_last 2 keeps steps 60 and 69; best.pt holds the best epoch's entry
HONEST = ["train.epochs=3", "model.name=mlp", "model.hidden=[16]", "checkpoint.every_steps=10", "export.formats=[onnx,safetensors]"]
STEPS = [0, 10, 20, 23, 30, 40, 46, 50, 60, 69]


def record_of(run_dir: Path) -> dict:
    """The run as its amendments leave it (what every reader sees)."""
    from veritrain.records.record import read_record, thawed

    return thawed(read_record(run_dir))


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("honest")
    outcome = in_process_run(workdir, HONEST)
    assert outcome.record["status"] == "completed", outcome.summary
    return Path(outcome.summary["run_dir"])


@pytest.fixture
def copy(honest, tmp_path) -> Path:
    """The honest workspace copied, so each forgery starts from the honest run."""
    shutil.copytree(honest.parent.parent, tmp_path / "ws")
    return tmp_path / "ws" / "runs" / honest.name


def workspace_of(run_dir: Path):
    from veritrain.records.workspace import Workspace

    return Workspace.open(run_dir.parent.parent)


def verified(run_dir: Path) -> dict:
    from veritrain.trust.verify import verify_run

    return verify_run(run_dir, run_dir.parent.parent / ".veritrain")


def kinds(run_dir: Path) -> set[str]:
    return {p["kind"] for p in verified(run_dir)["problems"]}


def perturbed(state: dict) -> dict:
    """The state with its model moved off the trajectory (as fine-tuning on the test split would)."""
    return {**state, "model": {k: (v + 0.01 if v.is_floating_point() else v) for k, v in state["model"].items()}}


def test_an_honest_run_names_its_entries_and_verifies(honest):
    record = record_of(honest)
    assert [e["step"] for e in record["trajectory"]] == STEPS
    best = record["trajectory"][-1]  # every epoch improved here: best.pt is the last epoch's entry
    assert record["metrics"]["test"]["trajectory_entry"] == {"index": 9, "step": 69, "state_sha256": best["state_sha256"]}
    assert record["export"]["trajectory_entry"]["index"] == 9 and record["export"]["checkpoint"] == "checkpoints/best.pt"
    result = verified(honest)
    assert result["ok"] and not result["problems"] and not result["not_checked"], result


def test_an_outside_checkpoint_makes_a_child_run_and_never_changes_the_run(honest, copy, tmp_path):
    import torch

    from veritrain.orchestration import pipeline
    from veritrain.trust.check import check_run
    from veritrain.train import checkpoint

    before = (copy / "record.json").read_bytes(), (copy / "record.sha256").read_bytes()
    outside = tmp_path / "fine-tuned-on-test.pt"
    torch.save(perturbed(checkpoint.load(copy / "checkpoints" / "best.pt")), outside)
    workspace = workspace_of(copy)
    done = pipeline.evaluate_run(workspace, copy.name, str(outside), "test", ["veritrain", "eval"])
    assert done.outside and done.parent == copy.name and done.run_dir != copy
    assert ((copy / "record.json").read_bytes(), (copy / "record.sha256").read_bytes()) == before  # byte for byte
    child = record_of(done.run_dir)
    assert child["kind"] == "eval" and child["parent"] == copy.name and child["status"] == "completed"
    assert child["input_checkpoint"]["file"] == "checkpoints/input.pt" and child["input_checkpoint"]["source"] == str(outside)
    assert child["metrics"]["test"]["checkpoint"] == "checkpoints/input.pt" and "trajectory_entry" not in child["metrics"]["test"]
    assert verified(done.run_dir)["ok"], verified(done.run_dir)["problems"]  # it verifies on its own: the checkpoint is inside
    row = next(i for i in check_run(done.run_dir, workspace.state_dir)["items"] if i["id"] == "results_from_trajectory")
    assert row["status"] == "fail" and "not from the audited training" in row["detail"] and row["fix"] == f"veritrain eval {copy.name}"
    assert workspace.resolve_run("latest", "model") == copy  # `latest` never names a run of an outside checkpoint
    listed = veritrain("runs", "list", "--workdir", str(copy.parent.parent))
    assert "eval (not from the audited training)" in listed.stdout + listed.stderr

    exported = pipeline.export_run(workspace, copy.name, str(outside), ["onnx"], ["veritrain", "export"])
    assert exported.outside and record_of(exported.run_dir)["export"]["checkpoint"] == "checkpoints/input.pt"
    assert ((copy / "record.json").read_bytes(), (copy / "record.sha256").read_bytes()) == before
    runs = sorted(p.name for p in copy.parent.iterdir())
    assert [record_of(copy.parent / r)["kind"] for r in runs] == ["run", "eval", "export"]

    # a path outside the run whose state the run keeps (a copy of step-60.pt) is that checkpoint: the run is amended
    shutil.copyfile(copy / "checkpoints" / "step-60.pt", tmp_path / "step-60-copy.pt")
    again = pipeline.evaluate_run(workspace, copy.name, str(tmp_path / "step-60-copy.pt"), "val", ["veritrain", "eval"])
    assert not again.outside and again.run_dir == copy
    assert record_of(copy)["metrics"]["val"]["checkpoint"] == "checkpoints/step-60.pt"
    assert record_of(copy)["metrics"]["val"]["trajectory_entry"]["index"] == 8
    assert verified(copy)["ok"]


def test_best_pt_replaced_by_a_state_listed_as_a_timing_save_fails_verify(copy):
    from veritrain.orchestration import pipeline
    from veritrain.core.errors import RunFailed
    from veritrain.records.record import write_record
    from veritrain.train import checkpoint, trajectory

    metrics = record_of(copy)["metrics"]["test"]
    forged = perturbed(checkpoint.load(copy / "checkpoints" / "best.pt"))
    checkpoint.write(copy / "checkpoints", checkpoint.encode(forged), ["best.pt"], keep_last=100)
    record = record_of(copy)
    record["other_saves"].append({"step": 69, "reason": "signal", "state_sha256": trajectory.state_sha256(forged), "after_step": 69})
    write_record(copy, record)  # re-sealed: every byte is consistent
    assert "best_not_best_epoch" in kinds(copy)
    with pytest.raises(RunFailed, match="best_not_best_epoch.*does not verify"):
        pipeline.evaluate_run(workspace_of(copy), copy.name, None, "test", ["veritrain", "eval"])
    assert record_of(copy)["metrics"]["test"] == metrics


def test_a_deleted_start_checkpoint_with_its_flags_rewritten_breaks_the_keep_rule(copy):
    from veritrain.records.record import write_record

    for name in ("step-60.pt", "step-60.pt.sha256"):
        (copy / "checkpoints" / name).unlink()
    record = record_of(copy)
    record["trajectory"][8]["kept"] = False
    write_record(copy, record)
    problems = [p for p in verified(copy)["problems"] if p["kind"] == "keep_rule"]
    assert [p["path"] for p in problems] == ["checkpoints/step-60.pt"] and "newest checkpoint.keep_last 2" in problems[0]["detail"]
    record["trajectory"][2]["kept_for_audit"] = True  # a flag the rule (audit_every 0) never sets
    write_record(copy, record)
    assert any("entry 2 (step 20) says kept_for_audit True" in p["detail"] for p in verified(copy)["problems"])


def test_a_checkpoint_replaced_by_something_else_fails_verify_audit_and_every_amend(copy):
    import torch

    from veritrain.records.record import write_record

    metrics = record_of(copy)["metrics"]["test"]
    target = copy / "checkpoints" / "step-60.pt"
    torch.save({"x": 1}, target)
    import hashlib

    (copy / "checkpoints" / "step-60.pt.sha256").write_text(hashlib.sha256(target.read_bytes()).hexdigest() + "\n")
    write_record(copy, record_of(copy))  # sidecar and seal fixed
    assert "not_in_trajectory" in kinds(copy)
    from veritrain.orchestration import housekeeping, pipeline
    from veritrain.trust import opening
    from veritrain.core.errors import RunFailed

    result = veritrain("audit", copy.name, "--segments", "1", "--workdir", str(copy.parent.parent))  # one line, exit 1
    assert result.code == 1 and result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "not_in_trajectory" in result.stderr and "does not verify" in result.stderr, result.stderr
    workspace = workspace_of(copy)
    amends = (lambda: pipeline.evaluate_run(workspace, copy.name, None, None, ["veritrain", "eval"]),
              lambda: pipeline.export_run(workspace, copy.name, None, None, ["veritrain", "export"]),
              lambda: opening.open_run(workspace, copy.name))  # baseline RUN opens the run this way
    for amend in amends:
        with pytest.raises(RunFailed, match="not_in_trajectory.*does not verify"):
            amend()
    assert housekeeping.gc(workspace, dry_run=False)["unverified"]
    assert record_of(copy)["metrics"]["test"] == metrics and target.exists()


def test_a_rewritten_metric_or_entry_is_named(copy):
    from veritrain.trust import audit
    from veritrain.records.record import write_record

    record = record_of(copy)
    honest_accuracy = record["metrics"]["test"]["accuracy"]
    record["metrics"]["test"]["accuracy"] = 1.0
    write_record(copy, record)  # a consistent record: only re-evaluating the entry shows the lie
    assert verified(copy)["ok"]
    result = audit.run(workspace_of(copy), copy.name, segments=1, seed=1)
    (evaluated,) = [r for r in result["results"] if r["what"] == "metrics.test"]
    assert evaluated["verdict"] == "differs" and "accuracy: recorded 1.0" in evaluated["detail"] and result["verdict"] == "differs"
    assert str(honest_accuracy)[:6] in evaluated["detail"]

    record["metrics"]["test"]["accuracy"] = honest_accuracy
    record["metrics"]["test"]["trajectory_entry"] = {**record["metrics"]["test"]["trajectory_entry"], "index": 8}
    write_record(copy, record)
    assert "result_not_from_trajectory" in kinds(copy)


def test_exported_weights_of_another_state_are_named(copy):
    from veritrain.results.export import write_safetensors
    from veritrain.records.record import write_record
    from veritrain.train import checkpoint

    other = checkpoint.load(copy / "checkpoints" / "step-60.pt")["model"]
    write_safetensors(copy / "export" / "model.safetensors", other, {})
    record = record_of(copy)
    write_record(copy, record)
    problems = [p for p in verified(copy)["problems"] if p["kind"] == "result_not_from_trajectory"]
    assert problems and problems[0]["path"] == "export/model.safetensors" and "entry 9 has weights" in problems[0]["detail"]


def test_the_printed_escape_probability_is_the_exact_figure(honest):
    result = veritrain("audit", honest.name, "--segments", "1", "--seed", "5", "--workdir", str(honest.parent.parent), "--json")
    assert result.code == 0, result.stderr
    audit = result.json()
    total, covered = audit["segments_total"], audit["segments_audited"]
    assert total == 9 and audit["segments_auditable"] == 9 and 1 <= covered <= total
    for forged in (1, 2, 5):
        expected = math.comb(total - covered, forged) / math.comb(total, forged)
        assert audit["escape_probability"][str(forged)] == pytest.approx(expected, abs=0)
        assert f"a trajectory with {forged} forged segment(s) among 9 escapes this audit (which checked {covered}) with probability {expected:.3f}" in result.stderr
    assert all(v["verdict"] == "identical" for v in audit["segments"])
    assert [(r["what"], r["verdict"]) for r in audit["results"]] == [("metrics.test", "identical"), ("baselines", "identical"), ("export parity", "identical")]


def test_escape_probability_formula():
    from veritrain.trust.audit import escape_probability

    assert escape_probability(9, 1, 3) == pytest.approx(6 / 9)  # C(6, 1) / C(9, 1)
    assert escape_probability(9, 2, 3) == pytest.approx(math.comb(6, 2) / math.comb(9, 2))
    assert escape_probability(9, 2, 9) == 0.0 and escape_probability(9, 5, 5) == 0.0


def test_metrics_evaluated_before_exact_sums_are_matched_within_tolerance_by_audit(copy):
    from veritrain.trust import audit
    from veritrain.records.record import write_record

    record = record_of(copy)
    metrics = record["metrics"]["test"]
    assert metrics.pop("sums") == "exact"
    metrics["ece"] += 1e-9  # as a float32-summing veritrain may have recorded it: within tolerance
    metrics["log_loss"] += 1e-3  # beyond it: still a difference
    write_record(copy, record)
    result = audit.run(workspace_of(copy), copy.name, segments=1, seed=1)
    (evaluated,) = [r for r in result["results"] if r["what"] == "metrics.test"]
    assert evaluated["verdict"] == "differs" and evaluated["detail"].startswith("1 value(s) differ, first log_loss"), evaluated
