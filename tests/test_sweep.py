"""`veritrain sweep`: the plan (one change at a time, grid), runs linked to one parent, the summary and its
deltas, experiments.md, the Ray backend, resume after an interrupt, and bad --vary options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import need_extra, veritrain, veritrain_process

from veritrain.records.experiments import config_diff
from veritrain.orchestration.trials.planning import parse_vary, split_values
from veritrain.orchestration.trials.sweep_plan import plan
from veritrain.records.workspace import Workspace

# The smallest digits config that still trains and goes through every stage of `veritrain run`.
TINY = """\
# A tiny digits config for the sweep tests: veritrain sweep tiny.yaml --vary optim.lr=0.1,0.05
model: {name: mlp, hidden: [32]}
train: {epochs: 1, batch_size: 128}
eval: {baselines: false}
export: {formats: [safetensors]}
"""


def records(workdir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (workdir / "runs").glob("*/record.json")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("configs") / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, tiny):
    """Four one-change trials, two at a time, in a fresh workspace (with the smoke test of the base config)."""
    workdir = tmp_path_factory.mktemp("sweep")
    result = veritrain("sweep", str(tiny), "--vary", "optim.lr=0.1,0.05", "--vary", "train.batch_size=32,64",
                       "--parallel", "2", "--workdir", str(workdir), "--json")
    return workdir, result


def test_one_change_at_a_time_each_trial_linked_to_one_parent(local_sweep):
    workdir, result = local_sweep
    assert result.code == 0, result.stderr
    summary = result.json()  # the whole of stdout is one JSON document
    assert summary["status"] == "completed" and summary["mode"] == "one-at-a-time"
    assert summary["threads"] == 1  # --parallel 2 pins one thread per run
    assert [t["change"] for t in summary["trials"]] == [{"optim.lr": 0.1}, {"optim.lr": 0.05},
                                                       {"train.batch_size": 32}, {"train.batch_size": 64}]
    found = records(workdir)
    assert len(found) == 5  # the parent and four trials
    (parent_id,) = summary["parent"]["run_ids"]
    parent = found[parent_id]
    assert parent["sweep"] == {"id": summary["id"], "trial": None, "change": {}}
    assert parent["smoke"]["status"] == "completed" and parent["smoke"]["key"]  # one smoke test, of the base config
    for trial in summary["trials"]:
        (run_id,) = trial["run_ids"]
        record = found[run_id]
        assert record["status"] == "completed" and trial["status"] == "completed"
        assert record["parent"] == parent_id
        assert record["sweep"] == {"id": summary["id"], "trial": trial["index"], "change": trial["change"]}
        ((key, value),) = trial["change"].items()
        assert record["hypothesis"] == f"{key}={value} vs parent"
        section, name = key.split(".")
        assert config_diff(parent["config"], record["config"]) == {key: (parent["config"][section][name], value)}
        assert record["config"]["train"]["threads"] == 1 and record["env"]["variables"]["OMP_NUM_THREADS"] == "1"
        assert record["smoke"]["status"] == "skipped" and "one smoke test, of the base config" in record["smoke"]["reason"]
        assert record["config_hash"] == trial["config_hash"]
        # val (selection) and test (the final report) from the same checkpoint, the one the run exports
        assert record["metrics"]["val"]["checkpoint_sha256"] == record["metrics"]["test"]["checkpoint_sha256"]
        assert record["metrics"]["test"]["checkpoint"] == record["export"]["checkpoint"]
        # no --metric: the task's headline metric (its TaskSpec), named when the sweep is planned
        assert record["selection"]["sweep"] == {"id": summary["id"], "split": "val", "metric": "accuracy", "mode": "max"}
        assert record["selection"]["best_checkpoint"] == {"split": "val", "metric": "val_acc", "mode": "max"}


def test_summary_has_deltas_best_trial_and_is_on_disk(local_sweep):
    workdir, result = local_sweep
    summary = result.json()
    folder = workdir / ".veritrain" / "sweeps" / summary["id"]
    assert json.loads((folder / "summary.json").read_text()) == summary
    assert json.loads((folder / "spec.json").read_text())["trials"][0]["change"] == {"optim.lr": 0.1}
    found = records(workdir)
    parent_metrics = found[summary["parent"]["run_ids"][0]]["metrics"]["val"]
    assert summary["headline"] == {"metric": "accuracy", "mode": "max"} and summary["split"] == "val"
    for trial in summary["trials"]:
        metrics = found[trial["run_ids"][0]]["metrics"]["val"]
        for name in ("accuracy", "macro_f1", "log_loss"):
            assert trial["metrics"][name] == metrics[name]
            assert trial["deltas"][name] == pytest.approx(metrics[name] - parent_metrics[name], abs=1e-12)
    best = max(summary["trials"], key=lambda t: t["metrics"]["accuracy"])
    assert summary["best"]["trial"] == best["index"] and summary["best"]["value"] == best["metrics"]["accuracy"]
    tested = found[best["run_ids"][0]]["metrics"]["test"]  # the chosen trial's final report, beside the selection
    assert summary["best"]["test"]["metrics"]["accuracy"] == tested["accuracy"] and summary["best"]["test"]["used_for_selection"] is False
    assert summary["failed"] == [] and summary["counts"]["completed"] == 4
    assert "best: trial" in result.stderr and "Δ vs parent" in result.stderr  # under --json the table goes to stderr, stdout holds the JSON
    assert "its test result, not used for selection: accuracy" in result.stderr


def test_experiments_md_has_the_sweep_section(local_sweep):
    workdir, result = local_sweep
    summary = result.json()
    text = (workdir / "experiments.md").read_text()
    section = text[text.index(f"## Sweep {summary['id']}"):]
    assert "| trial | change | runs | status | val accuracy | Δ vs parent |" in section
    for trial in summary["trials"]:
        ((key, value),) = trial["change"].items()
        marker = " **best**" if trial["index"] == summary["best"]["trial"] else ""
        assert f"| {trial['index']}{marker} | `{key}`={value} | {trial['run_ids'][0]} | completed |" in section
    # each trial's own entry compares it with the parent: one change
    assert text.count(f"changes vs {summary['parent']['run_ids'][0]}:") == 4
    assert "more than one change" not in text


def test_grid_plans_the_cartesian_product(tiny, tmp_path):
    workspace = Workspace.open(tmp_path)
    varies = ("optim.lr=0.1,0.05", "train.batch_size=32,64")
    grid = plan(str(tiny), [], varies, grid=True, repeat=1, parallel=2, backend="local", parent=None, workspace=workspace)
    assert grid.mode == "grid"
    assert [t.change for t in grid.trials] == [{"optim.lr": lr, "train.batch_size": bs} for lr in (0.1, 0.05) for bs in (32, 64)]
    assert grid.trials[0].hypothesis == "optim.lr=0.1, train.batch_size=32 vs parent"
    assert len({t.config_hashes[0] for t in grid.trials}) == 4
    single = plan(str(tiny), [], varies, grid=False, repeat=1, parallel=2, backend="local", parent=None, workspace=workspace)
    assert [t.change for t in single.trials] == [{"optim.lr": 0.1}, {"optim.lr": 0.05}, {"train.batch_size": 32}, {"train.batch_size": 64}]
    # a value that is the base config's own is the parent run: left out, with the reason; in a grid, a
    # combination keeps only the keys that differ from the base config as its change
    with_base = plan(str(tiny), [], ("train.batch_size=128,32", "optim.lr=0.1"), grid=True, repeat=1, parallel=2,
                     backend="local", parent=None, workspace=workspace)
    assert [t.change for t in with_base.trials] == [{"optim.lr": 0.1}, {"train.batch_size": 32, "optim.lr": 0.1}]
    alone = plan(str(tiny), [], ("train.batch_size=128,32",), grid=False, repeat=1, parallel=2, backend="local", parent=None, workspace=workspace)
    assert [t.change for t in alone.trials] == [{"train.batch_size": 32}]
    assert alone.skipped == ["train.batch_size=128: the same config as the base config (the parent run)"]
    # with seeds, each trial (and the parent) plans one config per seed
    seeded = plan(str(tiny), [], ("optim.lr=0.1",), grid=False, repeat=3, parallel=2, backend="local", parent=None, workspace=workspace)
    assert seeded.trials[0].seeds == [0, 1, 2] and len(set(seeded.trials[0].config_hashes)) == 3 and len(seeded.parent_hashes) == 3
    assert not (tmp_path / ".veritrain" / "sweeps").exists()  # planning runs nothing


def test_grid_dry_run_through_the_cli(cli, tiny, tmp_path):
    result = cli("sweep", str(tiny), "--vary", "model.hidden=[32,32],[64]", "--vary", "optim.lr=0.1,0.05", "--grid", "--dry-run",
                 "--parallel", "2", "--workdir", str(tmp_path), "--json")
    assert result.code == 0, result.stderr
    trials = result.json()["trials"]
    assert [t["change"] for t in trials] == [{"model.hidden": h, "optim.lr": lr} for h in ([32, 32], [64]) for lr in (0.1, 0.05)]
    assert not (tmp_path / "runs").exists()


def test_values_split_at_top_level_commas_only():
    assert split_values("0.1,0.01") == ["0.1", "0.01"]
    assert split_values("[32,32],[64]") == ["[32,32]", "[64]"]
    assert split_values("{a: 1, b: 2},'x,y'") == ["{a: 1, b: 2}", "'x,y'"]
    assert parse_vary(["optim.lr=0.1, 0.01"]) == [("optim.lr", ["0.1", "0.01"])]


@pytest.mark.parametrize("args, message", [
    (["--vary", "optim.lrr=0.1"], "error: --vary: optim.lrr: unknown key; did you mean 'lr'? valid keys in optim: name, lr, momentum, weight_decay, nesterov"),
    (["--vary", "optim.lr=abc"], "error: --vary: optim.lr: expected a number > 0, got 'abc'"),
    (["--vary", "train.epochs=1,0"], "error: --vary: train.epochs: expected an integer ≥ 1, got 0"),
    (["--vary", "optim.lr="], "error: --vary: optim.lr: no values; give one or more, comma-separated, e.g. --vary optim.lr=0.01,0.001"),
    (["--vary", "optim.lr"], "error: --vary: optim.lr: expected KEY.PATH=V1,V2,..., e.g. --vary optim.lr=0.01,0.001"),
    (["--vary", "optim.lr=0.1", "--vary", "optim.lr=0.2"], "error: --vary: optim.lr: given in two --vary options; list all its values in one: --vary KEY=V1,V2,..."),
    ([], "error: sweep: give at least one --vary KEY=V1,V2,..., e.g. --vary optim.lr=0.01,0.001"),
])
def test_bad_vary_is_one_line_exit_2_before_anything_runs(cli, tmp_path, args, message):
    result = cli("sweep", *args, "--parallel", "2", "--workdir", str(tmp_path), "--json")
    assert (result.code, result.stderr) == (2, message + "\n")
    assert json.loads(result.stdout) == {"error": {"message": message.removeprefix("error: "), "exit_code": 2}}  # --json: one document
    assert not (tmp_path / "runs").exists() and not (tmp_path / ".veritrain" / "sweeps").exists()


def test_missing_ray_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    from veritrain.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # importlib then finds no ray, as without the extra
    with pytest.raises(SystemExit) as stopped:
        main(["sweep", "--vary", "optim.lr=0.1", "--backend", "ray", "--workdir", str(tmp_path)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "error: --backend ray: the ray package is not installed; pip install 'veritrain[ray]'\n"


@pytest.mark.slow  # a Ray cluster in its own process: checked in `make test-slow`
def test_ray_backend_gives_the_same_runs_as_local(local_sweep, tiny):
    """A local Ray with 2 CPUs: the trial gets the same config hash, weights and metrics as the local one."""
    import importlib.util

    need_extra(importlib.util.find_spec("ray") is not None, "the Ray backend test needs ray (pip install -r requirements-slow.lock)")
    workdir, local = local_sweep
    assert local.code == 0, local.stderr
    local_summary = local.json()
    parent_id = local_summary["parent"]["run_ids"][0]
    result = veritrain_process("sweep", str(tiny), "--vary", "optim.lr=0.1", "--parallel", "2", "--backend", "ray", "--parent", parent_id,
                       "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    summary = result.json()  # Ray's own output stays out of stdout
    assert summary["backend"] == "ray" and summary["parent"]["run_ids"] == [parent_id]
    (trial,) = summary["trials"]
    found = records(workdir)
    by_ray = found[trial["run_ids"][0]]
    by_local = found[local_summary["trials"][0]["run_ids"][0]]  # optim.lr=0.1 in the local sweep
    assert by_ray["sweep"] == {"id": summary["id"], "trial": 0, "change": {"optim.lr": 0.1}}
    for key in ("config_hash", "final_state_sha256", "metrics", "parent", "hypothesis", "config", "seed"):
        assert by_ray[key] == by_local[key], key
    assert by_ray["env"]["variables"] == by_local["env"]["variables"]  # OMP_NUM_THREADS=1 on both backends
    assert trial["deltas"] == local_summary["trials"][0]["deltas"]


def test_a_failed_trial_exits_1_after_the_summary(local_sweep, tiny, capsys):
    workdir, local = local_sweep
    assert local.code == 0, local.stderr
    parent_id = local.json()["parent"]["run_ids"][0]
    # a module that imports (found beside the config) and whose factory fails when the run builds the model
    (tiny.parent / "sweep_failing_model.py").write_text("def build(**given):\n    raise RuntimeError('the factory cannot build this model')\n")
    result = veritrain_process("sweep", str(tiny), "--vary", "model.target=sweep_failing_model:build", "--parent", parent_id,
                       "--parallel", "2", "--workdir", str(workdir), "--json")
    assert result.code == 1
    summary = result.json()
    (failed,) = summary["failed"]
    assert summary["status"] == "failed" and failed["trial"] == 0 and "the factory cannot build this model" in failed["error"]
    (run_id,) = failed["run_ids"]
    assert records(workdir)[run_id]["status"] == "failed"
    assert [f["module"] for f in records(workdir)[run_id]["code"]["user_files"]] == ["sweep_failing_model"]  # the sweep's copy
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: sweep {summary['id']}: 1 of 1 trials failed: trial 0 (model.target=sweep_failing_model:build), run {run_id}: ")
    assert "the factory cannot build this model" in last
    text = (workdir / "experiments.md").read_text()
    assert f"| 0 | `model.target`=sweep_failing_model:build | {run_id} | failed: " in text
    # a module that is nowhere is a config problem: exit 2 before the sweep starts a run (in this process: there is
    # no code to import)
    from veritrain.cli import main

    before = set(records(workdir))
    with pytest.raises(SystemExit) as stopped:
        main(["sweep", str(tiny), "--vary", "model.target=veritrain_no_such_module:build", "--parent", parent_id, "--workdir", str(workdir)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.strip().splitlines()[-1].startswith("error: model.target: no module 'veritrain_no_such_module'"), err
    assert "Traceback" not in err and set(records(workdir)) == before


@pytest.mark.slow  # a driver stopped by SIGTERM mid-trial: checked in `make test-slow`
def test_resume_keeps_finished_trials_resumes_the_interrupted_and_runs_the_rest(local_sweep, tiny):
    """SIGTERM while the second trial trains: the first stays as it is, the second resumes in its own folder,
    the third (never started) runs."""
    workdir, local = local_sweep
    assert local.code == 0, local.stderr
    parent_id = local.json()["parent"]["run_ids"][0]
    before = set(records(workdir))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    driver = subprocess.Popen(
        [sys.executable, "-m", "veritrain", "sweep", str(tiny), "--parent", parent_id, "--vary", "optim.lr=0.02",
         "--vary", "train.epochs=200", "--vary", "train.batch_size=96", "--workdir", str(workdir), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    training = None
    # until the 200-epoch trial (several seconds, so the signal lands while it trains, even on a loaded machine) has an epoch
    while time.monotonic() < deadline and training is None and driver.poll() is None:
        time.sleep(0.1)
        for run_id, record in records(workdir).items():
            if run_id in before:
                continue
            metrics = workdir / "runs" / run_id / "metrics.jsonl"
            if (record.get("sweep") or {}).get("trial") == 1 and metrics.is_file() and metrics.read_text().count("\n") >= 1:
                training = run_id
    assert training is not None, "the second trial never started training"
    driver.send_signal(signal.SIGTERM)
    stdout, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 143, stderr
    interrupted = json.loads(stdout)
    assert interrupted["status"] == "interrupted"
    assert [t["status"] for t in interrupted["trials"]] == ["completed", "interrupted", "pending"]
    assert stderr.strip().splitlines()[-1] == "error: interrupted by SIGTERM"
    sweep_id = interrupted["id"]
    first = interrupted["trials"][0]["run_ids"][0]
    first_seal = (workdir / "runs" / first / "record.sha256").read_text()

    result = veritrain("sweep", "--resume", sweep_id[:-2], "--parallel", "2", "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    summary = result.json()
    assert summary["status"] == "completed" and [t["status"] for t in summary["trials"]] == ["completed"] * 3
    assert summary["trials"][0]["run_ids"] == [first]
    assert (workdir / "runs" / first / "record.sha256").read_text() == first_seal  # kept, not run again
    assert summary["trials"][1]["run_ids"] == [training]  # resumed in its own folder
    resumed = records(workdir)[training]
    assert resumed["status"] == "completed" and resumed["resumes"][0]["previous_status"] == "interrupted"
    assert resumed["training"]["epochs"] == 200
    new = set(records(workdir)) - before
    assert new == {first, training, summary["trials"][2]["run_ids"][0]}  # one run per trial, no duplicates
    assert all(records(workdir)[run_id]["parent"] == parent_id for run_id in new)


def test_resume_trusts_no_plan_from_a_copied_workspace(local_sweep):
    """spec.json is workspace state: a copy whose id is not its folder, or whose plan names code, is refused (exit 2)."""
    import shutil

    workdir, local = local_sweep
    assert local.code == 0, local.stderr
    original = workdir / ".veritrain" / "sweeps" / local.json()["id"]
    for case, new_id in (("renamed", "20991231-000000-aaaaaa"), ("code", "20991231-000000-bbbbbb")):
        copy = original.parent / new_id
        shutil.copytree(original, copy)
        spec = json.loads((copy / "spec.json").read_text())
        if case == "code":
            spec["id"] = new_id
            spec["trials"][0]["overrides"].append("model.target=veritrain_evil:build")
        (copy / "spec.json").write_text(json.dumps(spec))
        result = veritrain("sweep", "--resume", new_id, "--workdir", str(workdir))
        assert result.code == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()[-1:]
        assert line.startswith("error: --resume ") and ("names sweep" if case == "renamed" else "names code") in line, result.stderr
        shutil.rmtree(copy)
