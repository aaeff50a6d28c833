"""`veritrain search`: the space file and its refusals, proposals that a seed reproduces (also across a resumed
study), selection on val when val and test disagree, and one real 8-trial search with median pruning on a
300-image digits slice in which the enqueued bad configuration must be pruned."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import veritrain

from veritrain.core.selection import NOT_USED_FOR_SELECTION

# 1-epoch trials of a small MLP on 300 digits PNGs: every stage runs, in about 5 s a trial
TINY = """\
data: {source: imagefolder, root: digits300}
model: {name: mlp, hidden: [32]}
train: {epochs: 1, batch_size: 32}
eval: {baselines: false}
export: {formats: [safetensors]}
"""
SPACE = """\
optim.lr: {uniform: [1.0e-6, 0.05]}
model.hidden: {choice: [[32], [64]]}
"""
# a learning rate that cannot learn in one epoch: chance accuracy, below the median of any trial that learns
BAD = "{optim.lr: 1.0e-6, model.hidden: [32]}"


def write_digits(root: Path, count: int = 300) -> Path:
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for index in range(count):
        folder = root / str(digits.target[index])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.round(digits.images[index] * 255 / 16).astype("uint8"), "L").save(folder / f"{index:04d}.png")
    return root


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("search-configs")
    write_digits(folder / "digits300")
    (folder / "tiny.yaml").write_text(TINY)
    (folder / "space.yaml").write_text(SPACE)
    return folder


def search_args(configs: Path, workdir: Path, *more: str) -> list[str]:
    return ["search", str(configs / "tiny.yaml"), "--space", str(configs / "space.yaml"), "--trials", "8", "--metric", "val.accuracy",
            "--enqueue", BAD, "--no-smoke", "--workdir", str(workdir), *more]


@pytest.fixture(scope="module")
def searched(configs, tmp_path_factory):
    """8 trials, TPE, median pruning (5 startup trials), the bad configuration enqueued as trial 5."""
    workdir = tmp_path_factory.mktemp("search")
    result = veritrain(*search_args(configs, workdir, "--json"), cwd=configs)
    return workdir, result


def records(workdir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (workdir / "runs").glob("*/record.json")}


# ---------------------------------------------------------------- the real search


def test_the_enqueued_bad_configuration_is_pruned_and_never_tested(searched):
    workdir, result = searched
    assert result.code == 0, result.stderr
    summary = result.json()
    assert summary["counts"]["trials"] == 8 and summary["status"] == "completed"
    bad = summary["trials"][5]
    assert bad["change"] == {"optim.lr": 1e-06, "model.hidden": [32]}  # enqueued after the pruner's 5 startup trials
    assert bad["state"] == "pruned" and bad["test"] is None
    record = records(workdir)[bad["run_id"]]
    assert record["status"] == "pruned" and record["sweep"]["kind"] == "search" and record["sweep"]["trial"] == 5
    assert record["pruned"]["epoch"] == 1 and record["pruned"]["search"] == summary["id"]
    assert "below the median" in record["pruned"]["reason"] and record["pruned"]["value"] < 0.5
    assert not record.get("metrics")  # not evaluated on test (nor on val): the run stopped at the judged epoch
    assert not (workdir / "runs" / bad["run_id"] / "eval").exists()
    verified = veritrain("verify", bad["run_id"], "--workdir", str(workdir))
    assert verified.code == 0, verified.stderr


def test_every_trial_is_a_linked_run_and_the_study_has_no_duplicate_numbers(searched):
    workdir, result = searched
    summary = result.json()
    runs = [t["run_id"] for t in summary["trials"]]
    assert len(set(runs)) == 8 and set(runs) == set(records(workdir))
    for trial in summary["trials"]:
        record = records(workdir)[trial["run_id"]]
        assert record["sweep"] == {"id": summary["id"], "trial": trial["number"], "change": trial["change"], "kind": "search"}
        assert record["selection"]["sweep"] == {"id": summary["id"], "split": "val", "metric": "accuracy", "mode": "max"}
    folder = workdir / ".veritrain" / "searches" / summary["id"]
    operations = [json.loads(line)["op_code"] for line in (folder / "study.jsonl").read_text().splitlines()]
    assert operations.count(4) == 8  # one CREATE_TRIAL per trial: none proposed twice


def test_best_is_chosen_on_val_and_its_test_result_is_labelled(searched):
    _, result = searched
    summary = result.json()
    completed = [t for t in summary["trials"] if t["state"] == "completed"]
    best = max(completed, key=lambda t: t["value"])
    assert summary["best"]["number"] == best["number"] and summary["best"]["split"] == "val"
    assert summary["best"]["test"]["label"] == NOT_USED_FOR_SELECTION and summary["best"]["test"]["used_for_selection"] is False
    for trial in completed:  # the value told to the study is the run's own eval/val metric
        assert trial["value"] == records(searched[0])[trial["run_id"]]["metrics"]["val"]["accuracy"]


def test_the_search_folder_is_sealed_for_sha256sum(searched):
    from veritrain.orchestration.trials.search_summary import check_seal

    workdir, result = searched
    folder = workdir / ".veritrain" / "searches" / result.json()["id"]
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=folder, capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.count(": OK") == 3, checked.stdout
    assert check_seal(folder) == []
    spec = json.loads((folder / "spec.json").read_text())
    assert spec["reproducible"]["proposals"] is True and spec["metric"]["epoch_key"] == "val_acc"


def test_a_resumed_finished_search_proposes_nothing_new(searched):
    workdir, result = searched
    before = set(records(workdir))
    again = veritrain("search", "--resume", result.json()["id"], "--workdir", str(workdir), "--json")
    assert again.code == 0, again.stderr
    assert set(records(workdir)) == before and again.json()["counts"]["trials"] == 8


def test_the_search_page_shows_each_trial_the_val_metric_that_selected_and_the_seal(searched):
    """The browser's page of the search: every trial with its val accuracy and its test accuracy labelled as not used
    for selection (none for the pruned one), the best as the summary has it, the parallel coordinates' data, and the
    seal's verdict, which turns to "does not hold" when summary.json is edited."""
    import warnings

    pytest.importorskip("starlette")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    from veritrain.records.workspace import Workspace
    from veritrain.web import views
    from veritrain.web.server import create_app

    workdir, result = searched
    summary = result.json()
    workspace = Workspace.open(workdir)
    page = views.sweep_page(workspace, summary["id"])
    assert page["kind"] == "search" and page["metric"] == "accuracy" and page["split"] == "val"
    assert [t["number"] for t in page["trials"]] == [t["number"] for t in summary["trials"]]
    for shown, trial in zip(page["trials"], summary["trials"]):
        assert shown["value"] == trial["value"] and shown["state"] == trial["state"]
        assert shown["test"] == ((trial.get("test") or {}).get("metrics") or {}).get("accuracy")
        if trial["state"] == "pruned":
            assert shown["test"] is None and shown["pruned_at"] == f"epoch {trial['pruned']['epoch']}"
    assert page["best"]["number"] == summary["best"]["number"] and page["seal"] == {"ok": True, "problems": []}
    assert [a["key"] for a in page["plot"]["axes"]] == ["optim.lr", "model.hidden"]
    assert page["plot"]["axes"][1]["kind"] == "category" and len(page["plot"]["trials"]) == 8

    client = TestClient(create_app(workspace), base_url="http://127.0.0.1:8765")
    html = client.get(f"/sweeps/{summary['id']}").text
    assert html.count('<tr data-trial="') == 8 and "(not used for selection)" in html and 'id="sweep-seal" data-ok="true"' in html
    assert f'<tr data-trial="{summary["best"]["number"]}" class="best' in html and 'id="sweep-data"' in html
    folder = workdir / ".veritrain" / "searches" / summary["id"]
    original = (folder / "summary.json").read_bytes()
    try:
        (folder / "summary.json").write_bytes(original.replace(b'"status": "completed"', b'"status": "completed" ', 1))
        html = client.get(f"/sweeps/{summary['id']}").text
        assert 'id="sweep-seal" data-ok="false"' in html and "summary.json changed since the search sealed it" in html
    finally:
        (folder / "summary.json").write_bytes(original)
    assert page["recomputed"]["agrees"] and page["recomputed"]["best"] == summary["best"]["number"]
    # a forged winner with its seal made again: the seal holds, the best recomputed from the trials' records does not agree
    from veritrain.orchestration.trials.search_summary import seal

    loser = next(t for t in summary["trials"] if t["state"] == "completed" and t["number"] != summary["best"]["number"])
    forged = json.loads(original)
    forged["best"] = {**forged["best"], "number": loser["number"], "run_id": loser["run_id"]}
    try:
        (folder / "summary.json").write_text(json.dumps(forged))
        seal(folder)
        html = client.get(f"/sweeps/{summary['id']}").text
        assert 'id="sweep-seal" data-ok="true"' in html and 'id="sweep-recomputed" data-agrees="false"' in html
        assert f"summary.json names trial {loser['number']} as the best, the trials&#39; run records give trial {summary['best']['number']}" in html
    finally:
        (folder / "summary.json").write_bytes(original)
        seal(folder)
    assert client.get("/sweeps/%2e%2e").status_code == 404 and client.get("/sweeps/nope").status_code == 404


# ---------------------------------------------------------------- proposals, without training


def _plan_spec(tmp_path: Path, space: str, sampler: str = "tpe", trials: int = 12, parallel: int = 1, enqueue=(), seed: int = 0):
    from veritrain.orchestration.trials import search_plan

    (tmp_path / "space.yaml").write_text(space)
    plan = search_plan.plan(None, ["train.threads=1"], str(tmp_path / "space.yaml"), trials, "val.accuracy", sampler, "median", parallel,
                       "local", seed, list(enqueue), None)
    return {**plan.as_dict(), "id": "test"}


def _propose(spec: dict, folder: Path, stop_after: int | None = None) -> list[dict]:
    """Ask and tell as the driver does, with a made-up val accuracy per configuration (no training)."""
    from veritrain.orchestration.trials.search import _ask, open_study

    folder.mkdir(parents=True, exist_ok=True)
    study = open_study(folder, spec)
    changes = []
    while (asked := _ask(study, spec)) is not None:
        number, change = asked
        changes.append(change)
        study.tell(number, 1.0 - abs(np.log10(change.get("optim.lr", 0.01)) + 2.0) / 10 + 0.01 * len(json.dumps(change)))
        if stop_after is not None and len(changes) == stop_after:
            break
    return changes


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_the_same_seed_proposes_the_same_configurations(tmp_path, sampler):
    space = "optim.lr: {log_uniform: [1.0e-4, 0.1]}\nmodel.hidden: {choice: [[16], [32], [64]]}\n"
    spec = _plan_spec(tmp_path, space, sampler, trials=14)
    first = _propose(spec, tmp_path / "a")
    assert first == _propose(spec, tmp_path / "b") and len(first) == 14
    # a study reopened from its file halfway (a resumed search) goes on with the same proposals
    assert _propose(spec, tmp_path / "c", stop_after=6) == first[:6]
    assert _propose(spec, tmp_path / "c") == first[6:]
    other = _propose(_plan_spec(tmp_path, space, sampler, trials=14, seed=1), tmp_path / "d")
    assert other != first


def test_trials_that_validate_inside_epochs_are_judged_by_step(tmp_path):
    """With eval.every_steps the study counts steps: every trial's rows are reported at their step, and a trial worse
    than the median of the completed ones at a step is pruned there, its verdict written for that step."""
    from types import SimpleNamespace

    from veritrain.orchestration.trials import search, search_plan

    (tmp_path / "space.yaml").write_text("optim.lr: {log_uniform: [1.0e-4, 0.1]}\n")
    plan = search_plan.plan(None, ["train.threads=1", "eval.every_steps=10"], str(tmp_path / "space.yaml"), 8, "val.accuracy", "random",
                            "median", 1, "local", 0, [], None)
    spec = {**plan.as_dict(), "id": "test"}
    assert spec["metric"]["judged_at"] == "step" == spec["pruner"]["step"]
    folder, runs = tmp_path / "search", tmp_path / "runs"
    (folder / "verdicts").mkdir(parents=True)
    study = search.open_study(folder, spec)
    for _ in range(5):  # completed trials, each with a validation at steps 10 and 20 of one epoch
        number, _change = search._ask(study, spec)
        for step, value in ((10, 0.8), (20, 0.9)):
            study._storage.set_trial_intermediate_value(search._trial_id(study, number), step, value)
        study.tell(number, 0.9)
    number, _change = search._ask(study, spec)
    run_id = "20261207-000000-000-abcdef"
    (runs / run_id).mkdir(parents=True)
    (runs / run_id / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": 10, "val_acc": 0.2}) + "\n")
    slot = search.Slot(number, 0).name(1)
    (folder / "verdicts" / f"{slot}.wait.json").write_text(json.dumps({"run_id": run_id, "epoch": 1, "step": 10}))
    pruned = []
    live = search.Live(number, handle="trial")
    search._judge_waiting(SimpleNamespace(runs_dir=runs), spec, folder, study, live, SimpleNamespace(prune=pruned.append))
    verdict = json.loads((folder / "verdicts" / f"{slot}.verdict.json").read_text())
    assert (verdict["step"], verdict["epoch"], verdict["prune"], pruned) == (10, 1, True, ["trial"])
    assert "at step 10 is below the median 0.8" in verdict["reason"]
    assert study._storage.get_trial(search._trial_id(study, number)).intermediate_values == {10: 0.2}


def test_enqueued_configurations_take_the_numbers_after_the_startup_trials(tmp_path):
    spec = _plan_spec(tmp_path, "optim.lr: {log_uniform: [1.0e-4, 0.1]}\n", "random", trials=8,
                      enqueue=["{optim.lr: 0.0001}", "{optim.lr: 0.1}"])
    changes = _propose(spec, tmp_path / "study")
    assert changes[5] == {"optim.lr": 0.0001} and changes[6] == {"optim.lr": 0.1} and len(changes) == 8


def test_grid_takes_every_point_once_in_a_seeded_order(tmp_path):
    spec = _plan_spec(tmp_path, "model.hidden: {choice: [[16], [32]]}\ntrain.batch_size: {int: [16, 64], step: 16}\n", "grid", trials=50)
    assert spec["trials"] == 8  # clamped to the grid's size
    changes = _propose(spec, tmp_path / "study")
    assert len(changes) == 8 and len({json.dumps(c, sort_keys=True) for c in changes}) == 8
    assert changes == _propose(spec, tmp_path / "again")


def test_best_trial_is_the_val_best_even_where_test_ranks_them_the_other_way():
    from veritrain.orchestration.trials.search_summary import select_best_trial, summary_from_study

    trials = [{"number": n, "state": "COMPLETE", "user_attrs": {"change": {"optim.lr": lr}}, "intermediate": {1: val}, "value": val}
              for n, (lr, val) in enumerate([(0.1, 0.80), (0.01, 0.90), (0.001, 0.85)])]
    test = {0: 0.99, 1: 0.70, 2: 0.95}  # test ranks trial 0 first and trial 1 last
    records = {n: {"run_id": f"run{n}", "status": "completed", "config_hash": "h", "metrics": {"val": {"accuracy": t["value"]},
                                                                                              "test": {"accuracy": test[n]}}}
               for n, t in enumerate(trials)}
    spec = {"id": "s", "created_at": "now", "exp_name": "e", "config": {}, "space": {}, "sampler": {"name": "tpe"}, "pruner": {"name": "none"},
            "reproducible": {"proposals": True}, "parallel": 1, "backend": "local", "threads": 1, "trials": 3,
            "metric": {"name": "accuracy", "split": "val", "mode": "max"}}
    summary = summary_from_study(spec, trials, records, {}, None)
    assert summary["best"]["number"] == 1 and summary["best"]["value"] == 0.90
    assert summary["best"]["test"]["metrics"] == {"accuracy": 0.70} and summary["best"]["test"]["label"] == NOT_USED_FOR_SELECTION
    loss = [{**t, "value": 1 - t["value"]} for t in summary["trials"]]
    assert select_best_trial(loss, "min")["number"] == 1


# ---------------------------------------------------------------- refused before anything runs


@pytest.mark.parametrize("space, more, message", [
    ("optim.lr: {log_uniform: [1.0e-4, 0.1]}\n", ["--metric", "test.accuracy"],
     "error: --metric: test.accuracy: the test split is for the final report only, never for selection; select on validation: --metric val.accuracy"),
    ("optim.lr: {log_uniform: [1.0e-4, 0.1]}\n", ["--sampler", "grid"],
     "error: {space}: optim.lr: a continuous range has no grid; give --sampler tpe or random, or list the values to try: {choice: [...]}"),
    ("optim.lr: {uniform: [0.1, 0.01]}\n", [], "error: {space}: optim.lr.uniform: the range [0.1, 0.01] is empty; give low < high"),
    ("optim.lrr: {uniform: [0.01, 0.1]}\n", [],
     "error: {space}: optim.lrr: 0.01: unknown key; did you mean 'lr'? valid keys in optim: name, lr, momentum, weight_decay, nesterov"),
    ("train.epochs: {uniform: [1, 3]}\n", [], "error: {space}: train.epochs: 1.74: expected an integer ≥ 1, got 1.74"),
    ("model.hidden: {choice: []}\n", [], "error: {space}: model.hidden.choice: expected a non-empty list of values, e.g. {choice: [32, 64]}"),
    ("optim.lr: {normal: [0, 1]}\n", [], "error: {space}: optim.lr.normal: unknown; give one of uniform, log_uniform, int, log_int, choice (and step, for int)"),
    ("data.split_seed: {int: [0, 3]}\n", [], "error: {space}: data.split_seed: a search compares its trials on one data version and its val split; "
     "data keys change them: search the other keys, and give the data with --set or the config"),
    ("optim.lr: {uniform: [0.01, 0.1]}\n", ["--metric", "val.macro_f1"], "error: --pruner: median: val.macro_f1 is computed once, at evaluation, "
     "not after every epoch, so the pruner has nothing to judge; prune on val.accuracy, or give --pruner none"),
    ("optim.lr: {uniform: [0.01, 0.1]}\n", ["--metric", "val.log_loss"], "error: --pruner: median: val.log_loss is computed once, at evaluation, "
     "not after every epoch, so the pruner has nothing to judge; prune on val.accuracy, or give --pruner none"),
    ("eval.every_steps: {int: [5, 10]}\n", [], "error: {space}: eval.every_steps: the trials of a search are judged at the same validations; "
     "set it in the config (or --set), not in the space"),
    ("optim.lr: {uniform: [0.01, 0.1]}\n", ["--enqueue", "{optim.lr: 0.5}"],
     "error: --enqueue: optim.lr: 0.5 is outside the space (uniform [0.01, 0.1]); widen the space or give a value inside it"),
])
def test_bad_space_or_options_are_one_line_exit_2(cli, tmp_path, space, more, message):
    path = tmp_path / "space.yaml"
    path.write_text(space)
    metric = [] if "--metric" in more else ["--metric", "val.accuracy"]
    result = cli("search", "--space", str(path), "--trials", "3", *metric, *more, "--set", "train.threads=1", "--workdir", str(tmp_path / "ws"))
    expected = message.replace("{space}", str(path))
    assert (result.code, result.stderr) == (2, expected + "\n")
    assert not (tmp_path / "ws" / "runs").exists() and not (tmp_path / "ws" / ".veritrain" / "searches").exists()


def test_search_without_its_options_says_what_to_give(cli, tmp_path):
    result = cli("search", "--workdir", str(tmp_path), "--json")
    assert result.code == 2 and json.loads(result.stdout)["error"]["message"].startswith("search: give --space FILE, --trials N, --metric val.NAME")


@pytest.mark.slow  # two trial processes that fail as they build the model (about 16 s): checked in `make test-slow`
def test_a_search_whose_every_trial_fails_exits_1_with_the_first_error(configs, tmp_path):
    from conftest import veritrain_process

    (configs / "search_failing_model.py").write_text("def build(**given):\n    raise RuntimeError('the factory cannot build this model')\n")
    (tmp_path / "failing.yaml").write_text(TINY.replace("model: {name: mlp, hidden: [32]}", "model: {target: search_failing_model:build}")
                                           .replace("root: digits300", f"root: {configs / 'digits300'}"))
    (tmp_path / "space.yaml").write_text("optim.lr: {uniform: [0.01, 0.05]}\n")
    (tmp_path / "search_failing_model.py").write_text((configs / "search_failing_model.py").read_text())
    result = veritrain_process("search", str(tmp_path / "failing.yaml"), "--space", str(tmp_path / "space.yaml"), "--trials", "2",
                               "--metric", "val.accuracy", "--pruner", "none", "--no-smoke", "--workdir", str(tmp_path / "ws"), "--json")
    assert result.code == 1, result.stderr
    summary = result.json()
    assert [t["state"] for t in summary["trials"]] == ["failed", "failed"]  # the first failure did not stop the search
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: search {summary['id']}: every trial failed; the first, trial 0: ") and "cannot build this model" in last


@pytest.mark.slow  # a second search of 8 trials, its driver killed with SIGKILL mid-trial: checked in `make test-slow`
def test_kill_9_of_the_driver_then_resume_completes_with_the_same_configurations_and_no_duplicate(configs, searched, tmp_path):
    import os
    import signal
    import sys
    import time

    workdir, first = searched
    assert first.code == 0, first.stderr
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    driver = subprocess.Popen([sys.executable, "-m", "veritrain", *search_args(configs, killed)], cwd=configs, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the kill lands while the third trial trains
        if len(list((killed / "runs").glob("*/record.json"))) >= 3:
            break
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    time.sleep(2.5)  # the orphaned trial stops itself within a second, as interrupted
    resumed = subprocess.run([sys.executable, "-m", "veritrain", "search", "--resume", "latest", "--workdir", str(killed), "--json"],
                             cwd=configs, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["counts"]["trials"] == 8 and summary["status"] == "completed"
    assert [t["change"] for t in summary["trials"]] == [t["change"] for t in first.json()["trials"]]  # the same seed, the same proposals
    assert [t["state"] for t in summary["trials"]] == [t["state"] for t in first.json()["trials"]]
    found = records(killed)
    assert len(found) == 8 and sorted(r["sweep"]["trial"] for r in found.values()) == list(range(8))  # one run per trial number
    folder = killed / ".veritrain" / "searches" / summary["id"]
    assert [json.loads(line)["op_code"] for line in (folder / "study.jsonl").read_text().splitlines()].count(4) == 8
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=folder, capture_output=True).returncode == 0
