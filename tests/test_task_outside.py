"""A task from outside veritrain, in one file (tests/outside_task/digit_value.py: the value a digits image shows,
learned as a number, with rmse and a train-mean baseline), named by a package's entry point and recorded as the user's
code. No file of veritrain knows it; it goes through every command a built-in task does."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import veritrain_process

pytestmark = pytest.mark.slow

TASK_FILE = Path(__file__).resolve().parent / "outside_task" / "digit_value.py"
CONFIG = "exp_name: value\ntask: digit_value\ndata:\n  source: digits\nmodel:\n  name: mlp\n  hidden: [32]\ntrain:\n  epochs: 3\n"


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A package installed beside veritrain, on PYTHONPATH: the task's file and its dist-info naming the entry point."""
    root = tmp_path_factory.mktemp("outside")
    plugin = root / "plugin"
    info = plugin / "digit_value_task-0.1.dist-info"
    info.mkdir(parents=True)
    shutil.copyfile(TASK_FILE, plugin / "digit_value.py")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: digit-value-task\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[veritrain.tasks]\ndigit_value = digit_value:DigitValueTask\n")
    workdir = root / "ws"
    workdir.mkdir()
    (workdir / "value.yaml").write_text(CONFIG)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(plugin), *([old] if old else [])])
    try:
        done = veritrain_process("run", "value.yaml", "--json", cwd=workdir)
        assert done.code == 0, done.stderr
        yield workdir, plugin, json.loads(done.stdout)["run_id"]
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def record_of(workdir: Path, run_id: str):
    from veritrain.records.record import read_record

    return read_record(workdir / "runs" / run_id)  # with its amendments (eval, export, baseline) applied


def test_the_task_is_one_file_that_veritrain_does_not_know():
    from veritrain.core.task_registry import FROM_ENTRY_POINTS
    from veritrain.tasks import builtin

    assert "digit_value" not in builtin.TASKS and "digit_value" not in FROM_ENTRY_POINTS
    assert len(TASK_FILE.read_text().splitlines()) <= 120


def test_a_run_trains_evaluates_fits_its_baseline_and_exports(outside):
    workdir, _, run_id = outside
    record = record_of(workdir, run_id)
    assert record["status"] == "completed" and record["task"] == "digit_value" and record["task_spec"]["name"] == "digit_value"
    assert [f["module"] for f in record["code"]["user_files"]] == ["digit_value"]  # recorded as the user's code
    assert set(record["metrics"]["test"]) >= {"rmse", "mae", "samples"}
    assert record["baselines"]["judged_by"] == {"metric": "rmse", "goal": "min", "baseline": "train_mean"}
    assert record["baselines"]["margin"] == record["config"]["eval"]["baseline_margin"] == 0.05  # the margin it declares
    assert record["metrics"]["test"]["rmse"] < record["baselines"]["results"]["train_mean"]["rmse"]
    assert record["export"]["parity"]["passed"] and "onnx" in record["export"]["files"]
    assert record["export"]["parity"]["min_agreement"] is None  # its parity rule: one output, no agreement of a largest one
    rows = [json.loads(line) for line in (workdir / "runs" / run_id / "metrics.jsonl").read_text().splitlines()]
    assert record["training"]["best_metric"]["name"] == "val_rmse" and all("val_rmse" in row for row in rows)


def test_eval_export_baseline_check_verify_audit_and_reproduce(outside):
    workdir, plugin, run_id = outside
    for args in (["eval", run_id, "--split", "val"], ["export", run_id], ["baseline", run_id]):
        done = veritrain_process(*args, cwd=workdir)
        assert done.code == 0, (args, done.stderr)
    record = record_of(workdir, run_id)
    assert "rmse" in record["metrics"]["val"]
    done = veritrain_process("check", run_id, "--json", cwd=workdir)
    assert done.code == 0, done.stdout
    rows = {row["id"]: row for row in json.loads(done.stdout)["items"]}
    assert rows["beats_baseline"]["status"] == "pass" and "rmse" in rows["beats_baseline"]["detail"]
    assert rows["bad_cases"]["status"] == "n/a"  # the task declares no file of bad cases
    assert veritrain_process("verify", run_id, cwd=workdir).code == 0
    # the user edits the task's file afterwards: every later command runs the copy the run recorded
    edited = (plugin / "digit_value.py").read_text().replace('"rmse": float(np.sqrt(np.mean(error ** 2)))', '"rmse": 0.0')
    (plugin / "digit_value.py").write_text(edited)
    done = veritrain_process("audit", run_id, "--json", cwd=workdir)
    assert done.code == 0, done.stderr
    verdicts = {row["what"]: row["verdict"] for row in json.loads(done.stdout)["results"]}
    assert verdicts == {"metrics.test": "identical", "metrics.val": "identical", "baselines": "identical", "export parity": "identical"}, verdicts
    done = veritrain_process("reproduce", run_id, "--json", cwd=workdir)
    assert done.code == 0 and json.loads(done.stdout)["verdict"] == "identical", done.stdout + done.stderr
    (plugin / "digit_value.py").write_text(TASK_FILE.read_text())


def test_a_search_selects_on_the_tasks_own_val_metric_and_the_pages_show_it(outside):
    workdir, _, run_id = outside
    (workdir / "space.yaml").write_text("optim.lr: {log_uniform: [1.0e-3, 3.0e-2]}\n")
    done = veritrain_process("search", "value.yaml", "--space", "space.yaml", "--trials", "2", "--metric", "val.rmse",
                             "--pruner", "none", "--no-smoke", "--set", "train.epochs=1", "--json", cwd=workdir)
    assert done.code == 0, done.stderr
    summary = json.loads(done.stdout)
    trials = [t for t in summary["trials"] if t.get("value") is not None]
    assert summary["selection"]["metric"] == "rmse" and summary["selection"]["mode"] == "min"
    assert summary["best"]["value"] == min(t["value"] for t in trials)
    listed = veritrain_process("runs", "list", cwd=workdir)
    assert listed.code == 0 and "rmse" in listed.stdout, listed.stdout
    other = summary["best"]["run_id"]
    compared = veritrain_process("runs", "compare", run_id, other, cwd=workdir)
    assert compared.code == 0 and "test.rmse" in compared.stdout, compared.stdout
    done = veritrain_process("publish", run_id, "--out", str(workdir / "site"), cwd=workdir)
    assert done.code == 0, done.stderr
    page = (workdir / "site" / "runs" / f"{run_id}.html").read_text()
    assert 'data-chart="rmse"' in page and "RMSE (digits)" in page
    order = veritrain_process("data", "order", run_id, "--steps", "0:1", "--json", cwd=workdir)
    assert order.code == 0 and json.loads(order.stdout)["steps"][0]["sample_ids"], order.stderr
