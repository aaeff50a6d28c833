"""The test split is for the final report only: a sweep picks its best trial on val (and shows the test result of
that trial, labelled as not used for selection), `--metric test.*` and a `checkpoint.best_metric` on test are
refused (exit 2), a config that selects on an empty val split is refused, `--repeat` reports the test spread and
selects nothing, and the record's `selection` feeds check's `selection_on_validation` row. Pure functions over
fabricated records: nothing here trains."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from veritrain.core import selection
from veritrain.trust.check import ROWS, _selection_row
from veritrain.core.config import load_config
from veritrain.core.errors import ConfigError, RunFailed
from veritrain.orchestration.trials.state import Slot
from veritrain.orchestration.trials.sweep_plan import SlotState
from veritrain.orchestration.trials.sweep_summary import select_best, summary_from_records

ROOT = Path(__file__).resolve().parents[1]
RUN = "20261201-0000{:02d}-000-aaaaaa"
SHIPPED = "a" * 64  # the checkpoint every fabricated run evaluates (and would export)


def fabricated(index: int, val: float, test: float, test_checkpoint: str = SHIPPED) -> dict:
    """A completed run's record as far as a sweep summary reads it: status, data version, val and test metrics."""
    def metrics(accuracy: float, checkpoint: str) -> dict:
        return {"accuracy": accuracy, "log_loss": 1.0 - accuracy, "checkpoint_sha256": checkpoint}

    return {"run_id": RUN.format(index), "status": "completed", "data": {"version": "d" * 64}, "config": {"task": "classification"},
            "metrics": {"val": metrics(val, SHIPPED), "test": metrics(test, test_checkpoint)}}


def sweep_of(trials: list[list[tuple[float, float]]], parent: list[tuple[float, float]], selection_planned=None):
    """(spec, states, records) of a sweep whose trial i ran once per seed with the (val, test) accuracies given."""
    repeat = len(parent)
    spec = {"id": "20261201-000000-abcdef", "created_at": "2026-12-01T00:00:00.000+00:00", "exp_name": "digits",
            "config": {"path": None, "overrides": [], "hash": "c" * 64}, "mode": "one-at-a-time", "varied": {"optim.lr": []},
            "threads": 1, "threads_reason": "set", "repeat": repeat, "backend": "local", "skipped": [],
            "parent": {"run": None, "seeds": list(range(repeat)), "config_hashes": ["p" * 64] * repeat},
            "trials": [{"index": i, "change": {"optim.lr": 0.1 / (i + 1)}, "hypothesis": "h", "config_hashes": [str(i) * 64] * repeat,
                        "seeds": list(range(repeat))} for i in range(len(trials))]}
    if selection_planned is not None:
        spec["selection"] = selection_planned
    records, states, counter = {}, {}, 0
    for trial, runs in [(None, parent), *enumerate(trials)]:
        for seed, (val, test) in enumerate(runs):
            record = fabricated(counter, val, test)
            records[record["run_id"]] = record
            states[Slot(trial, seed)] = SlotState(record["run_id"], "completed")
            counter += 1
    return spec, states, records


def test_a_sweep_picks_the_val_winner_when_test_ranks_the_trials_otherwise():
    # trial 0 is best on test (0.97) and worst on val; trial 2 is best on val and worst on test
    spec, states, records = sweep_of([[(0.90, 0.97)], [(0.91, 0.93)], [(0.95, 0.85)]], parent=[(0.80, 0.80)])
    summary = summary_from_records(spec, states, records, None, "/sweeps/x")
    best = summary["best"]
    assert best["trial"] == 2 and best["split"] == "val" and best["metric"] == "accuracy" and best["value"] == 0.95
    assert best["delta"] == pytest.approx(0.15)
    assert best["test"] == {"split": "test", "used_for_selection": False, "label": "not used for selection",
                            "metrics": {"accuracy": 0.85, "log_loss": pytest.approx(0.15)}, "spread": None}
    assert summary["split"] == "val" and summary["selection"] == {"split": "val", "metric": "accuracy", "mode": "max", "given": False,
                                                                  "report_split": "test"}
    # the trials carry their val metrics only: no test number of another trial is there to pick by hand
    assert [t["metrics"]["accuracy"] for t in summary["trials"]] == [0.90, 0.91, 0.95]
    shown_trials = json.dumps(summary["trials"])
    assert "0.97" not in shown_trials and "0.93" not in shown_trials


def test_a_planned_metric_and_its_direction_pick_the_trial():
    spec, states, records = sweep_of([[(0.90, 0.97)], [(0.95, 0.85)]], parent=[(0.80, 0.80)],
                                     selection_planned={"split": "val", "metric": "log_loss", "mode": "min"})
    summary = summary_from_records(spec, states, records, None, "/sweeps/x")
    assert summary["best"]["trial"] == 1 and summary["best"]["metric"] == "log_loss" and summary["selection"]["given"] is True
    assert select_best(summary["trials"], "log_loss", "max")["index"] == 0  # the direction decides


def test_with_repeat_the_means_over_seeds_select_and_the_best_reports_its_test_spread():
    # trial 0: val mean 0.91, test mean 0.95; trial 1: val mean 0.93, test mean 0.86
    spec, states, records = sweep_of([[(0.90, 0.96), (0.92, 0.94)], [(0.94, 0.85), (0.92, 0.87)]], parent=[(0.8, 0.8), (0.8, 0.8)])
    summary = summary_from_records(spec, states, records, None, "/sweeps/x")
    best = summary["best"]
    assert best["trial"] == 1 and best["value"] == pytest.approx(0.93)
    assert best["test"]["metrics"]["accuracy"] == pytest.approx(0.86)
    assert best["test"]["spread"]["accuracy"]["values"] == [0.85, 0.87] and best["test"]["spread"]["accuracy"]["n"] == 2
    assert summary["trials"][1]["spread"]["accuracy"]["values"] == [0.94, 0.92]  # the trials' spreads are of val


def test_a_run_whose_val_and_test_come_from_different_checkpoints_is_left_out():
    spec, states, records = sweep_of([[(0.99, 0.90)], [(0.91, 0.90)]], parent=[(0.80, 0.80)])
    winner = states[Slot(0, 0)].run_id
    records[winner]["metrics"]["test"]["checkpoint_sha256"] = "b" * 64  # val re-evaluated on another checkpoint afterwards
    summary = summary_from_records(spec, states, records, None, "/sweeps/x")
    assert summary["best"]["trial"] == 1 and summary["trials"][0]["metrics"] == {}
    assert f"veritrain eval {winner} --split val" in summary["trials"][0]["note"]


def test_a_given_parent_without_val_metrics_says_how_to_add_them():
    spec, states, records = sweep_of([[(0.9, 0.9)]], parent=[(0.8, 0.8)])
    parent_id = states[Slot(None, 0)].run_id
    spec["parent"]["run"] = parent_id
    del records[parent_id]["metrics"]["val"]  # an ordinary run: eval.split only
    summary = summary_from_records(spec, states, records, None, "/sweeps/x")
    assert summary["trials"][0]["deltas"] == {} and summary["best"]["delta"] is None
    assert summary["parent"]["note"].endswith(f"veritrain eval {parent_id} --split val")


def test_the_experiments_section_and_the_browser_label_the_test_result(tmp_path):
    from veritrain.records.experiments import sweep_sections
    from veritrain.web.views import sweeps_of

    spec, states, records = sweep_of([[(0.90, 0.97)], [(0.95, 0.85)]], parent=[(0.80, 0.80)])
    summary = summary_from_records(spec, states, records, None, "/sweeps/x")
    folder = tmp_path / "sweeps" / summary["id"]
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    text = "\n".join(sweep_sections(tmp_path))
    assert "- best: trial 1 (`optim.lr`=0.05), chosen on val accuracy: 0.9500 (+0.1500 vs parent); test accuracy 0.8500 (not used for selection)" in text
    assert "| trial | change | runs | status | val accuracy | Δ vs parent |" in text
    (view,) = sweeps_of(tmp_path)
    assert view["best"]["trial"] == 1 and view["best"]["test"] == 0.85 and view["best"]["label"] == "not used for selection"
    assert view["split"] == "val" and [t["value"] for t in view["trials"]] == [0.90, 0.95]
    assert sweeps_of(tmp_path, only=[RUN.format(0)]) == []  # publish: only sweeps whose every run is published


def test_the_experiments_page_shows_the_sweep_and_its_test_result_label(tmp_path):
    pytest.importorskip("starlette")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    from veritrain.web.server import create_app
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(tmp_path / "ws")
    spec, states, records = sweep_of([[(0.90, 0.97)], [(0.95, 0.85)]], parent=[(0.80, 0.80)])
    summary = summary_from_records(spec, states, records, None, "/sweeps/x")
    folder = workspace.state_dir / "sweeps" / summary["id"]
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    page = TestClient(create_app(workspace), base_url="http://127.0.0.1:8765").get("/experiments").text
    assert f'id="sweep-{summary["id"]}"' in page
    assert "its test accuracy: 0.85" in page and "(not used for selection)" in page  # 4 significant digits


# ---------------------------------------------------------------- refused before anything runs


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    from veritrain.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(args)
    return stopped.value.code, capsys.readouterr().err


@pytest.mark.parametrize("metric, message", [
    ("test.accuracy", "error: --metric: test.accuracy: the test split is for the final report only, never for selection; "
                      "select on validation: --metric val.accuracy"),
    ("train.accuracy", "error: --metric: train.accuracy: a sweep selects its best trial on the val split; give --metric val.accuracy"),
    ("val.acc", "error: --metric: val.acc: task classification declares no such metric; give one of val.accuracy, val.macro_f1, "
                "val.log_loss, val.top5_accuracy, val.f1_weighted, val.precision_macro, val.recall_macro, val.ece"),
    ("val.rmse", "error: --metric: val.rmse: task classification declares no such metric; give one of val.accuracy, val.macro_f1, "
                 "val.log_loss, val.top5_accuracy, val.f1_weighted, val.precision_macro, val.recall_macro, val.ece"),
])
def test_sweep_metric_on_test_or_unknown_is_exit_2(tmp_path, capsys, metric, message):
    code, err = run_cli(["sweep", "--vary", "optim.lr=0.1", "--metric", metric, "--workdir", str(tmp_path)], capsys)
    assert (code, err) == (2, message + "\n")
    assert not (tmp_path / ".veritrain" / "sweeps").exists()


def test_a_sweep_metric_is_one_its_task_declares():
    from veritrain.core.task_registry import task_spec

    classification, lm = task_spec("classification"), task_spec("lm")
    declared = selection.sweep_metric("val.log_loss", classification)
    assert (declared.name, declared.goal, declared.epoch_key) == ("log_loss", "min", None)  # val_loss is the smoothed criterion
    assert (selection.sweep_metric("accuracy", classification).goal, selection.sweep_metric("accuracy", classification).epoch_key) == ("max", "val_acc")
    assert selection.sweep_metric("val.bits_per_byte", lm).epoch_key == "val_bits_per_byte"
    with pytest.raises(ConfigError, match=r"task lm declares no such metric; give one of val.bits_per_byte, val.perplexity, val.loss"):
        selection.sweep_metric("val.accuracy", lm)


def test_best_metric_on_test_is_exit_2(tmp_path, capsys):
    code, err = run_cli(["run", "--set", "checkpoint.best_metric=test_acc", "--workdir", str(tmp_path)], capsys)
    assert code == 2
    assert err == ("error: --set: checkpoint.best_metric: 'test_acc' is computed on the test split, which is for the final report only, "
                   "never for selection; pick best.pt on validation: val_acc (best_mode: max) or val_loss (best_mode: min)\n")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("overrides, key, words", [
    (["data.split_ratios=[0.9,0,0.1]"], "data.split_ratios", "checkpoint.best picks best.pt on"),
    (["data.split_ratios=[0.9,0,0.1]", "checkpoint.best=false", "train.early_stopping_patience=2"], "data.split_ratios",
     "train.early_stopping_patience stops training on"),
])
def test_selection_without_a_val_split_is_refused_when_the_config_loads(overrides, key, words):
    with pytest.raises(ConfigError) as refused:
        load_config(None, overrides)
    assert (refused.value.source, refused.value.key) == ("--set", key) and words in refused.value.problem
    assert "[0.8, 0.1, 0.1]" in refused.value.problem
    # selecting nothing, or on the train split, needs no val samples
    load_config(None, ["data.split_ratios=[0.9,0,0.1]", "checkpoint.best=false"])
    load_config(None, ["data.split_ratios=[0.9,0,0.1]", "checkpoint.best_metric=train_loss", "checkpoint.best_mode=min"])


def test_a_sweep_without_a_val_split_is_exit_2(tmp_path, capsys):
    code, err = run_cli(["sweep", "--set", "data.split_ratios=[0.9,0,0.1]", "--set", "checkpoint.best=false", "--vary", "optim.lr=0.1",
                         "--workdir", str(tmp_path)], capsys)
    assert code == 2
    assert err == ("error: --set: data.split_ratios: [0.9, 0.0, 0.1] gives the val split no samples, and a sweep picks its best trial on val "
                   "(the test split is for the final report only); give val a share, e.g. --set data.split_ratios=[0.8,0.1,0.1]\n")
    code, err = run_cli(["sweep", "--set", "checkpoint.best=false", "--vary", "data.split_ratios=[0.9,0,0.1]", "--workdir", str(tmp_path)], capsys)
    assert code == 2 and err.startswith("error: --vary: data.split_ratios: data.split_ratios=[0.9,0,0.1] gives the val split no samples")


def test_an_empty_val_split_found_by_preparing_fails_the_run_before_training():
    config = load_config(None, ["train.early_stopping_patience=3"]).config
    picked = selection.for_run(config, ("val_acc", "max"), ["prepare", "train", "eval"], {"id": "s1", "metric": None, "mode": None})
    with pytest.raises(RunFailed, match=r"the val split has no samples, and best.pt \(val val_acc\) and early stopping \(val val_acc\) and "
                                        r"the sweep's best trial \(val its headline metric\) select\(s\) on it"):
        selection.require_validation(picked, 0)
    selection.require_validation(picked, 5)
    unselected = selection.for_run(load_config(None, ["checkpoint.best=false"]).config, ("val_acc", "max"), ["prepare", "train"])
    selection.require_validation(unselected, 0)  # nothing selects: the run may train without val
    assert unselected == {"best_checkpoint": None, "early_stopping": None, "sweep": None}


# ---------------------------------------------------------------- what a run evaluates, --repeat


def test_a_sweep_run_evaluates_val_and_test_and_a_repeat_seed_test_too(tmp_path):
    from veritrain.orchestration.pipeline import evaluation_splits

    on_val = load_config(None, ["eval.split=val"]).config
    assert evaluation_splits({"sweep": {"id": "s"}}, on_val, tmp_path) == ["val", "test"]
    assert evaluation_splits({"repeat": {"group": "g", "index": 0, "of": 2}}, on_val, tmp_path) == ["val", "test"]
    assert evaluation_splits({}, on_val, tmp_path) == ["val"]
    original = tmp_path / RUN.format(1)
    original.mkdir()
    (original / "record.json").write_text(json.dumps({"record_version": 1, "run_id": RUN.format(1), "status": "completed", "started_at": "2026-01-01T00:00:00+00:00", "config": {},
                                                      "metrics": {"val": {}, "test": {}}}))
    plain = load_config(None, []).config
    assert evaluation_splits({"reproduced_from": RUN.format(1)}, plain, tmp_path) == ["test", "val"]  # what its original evaluated


def test_repeat_reports_the_test_spread_and_selects_nothing(tmp_path, monkeypatch):
    from veritrain.orchestration import repeats
    from veritrain.records.workspace import Workspace

    accuracies = iter([(0.99, 0.80), (0.50, 0.90)])  # val would rank the seeds the other way

    given = []

    def fake_run(seeded, workspace, argv, repeat, nproc, **recorded):
        given.append(recorded)
        val, test = next(accuracies)
        record = {"status": "completed", "seed": seeded.config.seed, "baselines": None,
                  "metrics": {"val": {"accuracy": val}, "test": {"accuracy": test}}}
        return SimpleNamespace(record=record, summary={"run_id": f"run-{seeded.config.seed}", "status": "completed"})

    monkeypatch.setattr(repeats.pipeline, "run", fake_run)
    monkeypatch.setattr(repeats.pipeline, "update_experiments", lambda workspace: None)
    smoke = {"key": "k", "status": "passed", "cached": True}
    result = repeats.run(load_config(None, ["eval.split=val"]), Workspace.open(tmp_path), ["veritrain", "run"], 2,
                         hypothesis="wider is better", parent="run-parent", smoke=smoke)
    assert result["split"] == "test" and result["selection"] is None and "no seed or run is selected" in result["report"]
    assert result["summary"]["accuracy"]["values"] == [0.80, 0.90]
    assert "best" not in result and [r["seed"] for r in result["runs"]] == [0, 1]
    # every seed's run records what `run --repeat N --hypothesis TEXT --parent RUN` was given, as a single run does
    assert given == [{"hypothesis": "wider is better", "parent": "run-parent", "smoke": smoke}] * 2


# ---------------------------------------------------------------- the record and check


def test_the_selection_row_passes_on_validation_only():
    new_run = "veritrain run runs/x/config.yaml"
    trained = {"stages": ["prepare", "train", "eval"], "training": {"best_metric": {"name": "val_acc", "mode": "max", "value": 0.9}}}
    on_val = {**trained, "selection": {"best_checkpoint": {"split": "val", "metric": "val_acc", "mode": "max"}, "early_stopping": None,
                                       "sweep": {"id": "s1", "split": "val", "metric": None, "mode": None}}}
    status, fix, detail = _selection_row(on_val, new_run)
    assert status == "pass" and fix is None
    assert detail == "best.pt on val val_acc; the sweep's best trial on val its headline metric; test: final report only"
    on_test = {**trained, "selection": {"best_checkpoint": {"split": "test", "metric": "test_acc", "mode": "max"}}}
    status, fix, detail = _selection_row(on_test, new_run)
    assert status == "fail" and "best.pt on test_acc (test split)" in detail
    assert fix == f"{new_run} --set checkpoint.best_metric=null --set checkpoint.best_mode=null"
    mismatch = {**on_val, "training": {"best_metric": {"name": "train_acc", "mode": "max", "value": 1.0}}}
    assert _selection_row(mismatch, new_run)[0] == "fail"
    assert _selection_row({**trained, "selection": {"best_checkpoint": None}}, new_run)[:2] == ("pass", None)
    older = _selection_row(trained, new_run)  # made before records said what selected what
    assert older[0] == "n/a" and "earlier veritrain" in older[2]
    assert _selection_row({"stages": ["prepare", "baselines"]}, new_run)[0] == "n/a"


def test_the_selection_field_validates_and_the_row_is_documented():
    from veritrain.records.record import RunRecord

    record = {"record_version": 1, "run_id": RUN.format(1), "status": "completed", "started_at": "2026-01-01T00:00:00+00:00", "config": {},
              "selection": {"best_checkpoint": {"split": "val", "metric": "val_acc", "mode": "max"},
                            "early_stopping": {"split": "val", "metric": "val_acc", "mode": "max", "patience": 3},
                            "sweep": {"id": "s1", "split": "val", "metric": "accuracy", "mode": "max"}}}
    RunRecord.model_validate(record)
    del record["selection"]
    RunRecord.model_validate(record)  # older records have none
    assert "selection_on_validation" in ROWS
    checklist = (ROOT / "docs" / "verify.md").read_text(encoding="utf-8").split("## `check`", 1)[1].split("\n## ", 1)[0]
    assert "`selection_on_validation`" in checklist
