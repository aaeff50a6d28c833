"""Steps as the unit of training: `train.max_steps` ends a run inside an epoch, `eval.every_steps` validates inside
epochs, and best.pt, early stopping, the rows of metrics.jsonl and their rewind, the search's judgement and verify's
best.pt rule follow the validations by their step. Epoch configs keep their hashes and their rows."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import veritrain
from veritrain.core.config import load_config
from veritrain.train import steplog, trajectory
from veritrain.train.engine import Best
from veritrain.train.order import Order
from veritrain.train.parts import order_of
from veritrain.train.recipe import Validations
from veritrain.trust import formats

# digits: 1437 train samples, 23 steps of 64 per epoch; 40 steps end inside epoch 2; validations at 15, 30 and 40
STEPPED = ["--set", "model.name=mlp", "--set", "model.hidden=[32]", "--set", "model.dropout=0.2", "--set", "augment.hflip=true",
           "--set", "train.max_steps=40", "--set", "eval.every_steps=15", "--set", "checkpoint.audit_every=1",
           "--set", "logging.every_steps=4", "--set", "train.threads=1", "--set", "schedule.warmup_steps=40"]


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "record.json").read_text())


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def stepped_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("stepped")
    result = veritrain("train", *STEPPED, "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def stepped(stepped_run) -> Path:
    return Path(stepped_run.json()["run_dir"])


# ---------------------------------------------------------------- the pure parts


def test_max_steps_orders_whole_epochs_and_stops_inside_the_last():
    order = Order.of_steps(100, 10, 25, False, 0)
    assert (order.epochs, order.total, order.per_epoch) == (3, 25, 10)
    assert order.as_dict()["steps"] == 25
    whole = Order(100, 10, 3, False, 0)
    assert "steps" not in whole.as_dict()  # an order of whole epochs is saved (and hashed) as before the field
    assert whole.total == 30 and [list(order.rows(k)) for k in (0, 24)] == [list(whole.rows(k)) for k in (0, 24)]
    with pytest.raises(Exception, match="steps=31"):
        Order(100, 10, 3, False, 0, 31)
    cfg = SimpleNamespace(seed=0, train=SimpleNamespace(batch_size=8, accumulate_steps=1, epochs=50, max_steps=7))
    assert order_of(cfg, 20, 1).total == 7  # type: ignore[arg-type]  # max_steps decides, not epochs


def test_validations_fall_at_epoch_ends_or_every_n_steps_and_at_the_last():
    by_epoch, by_step = Validations(0, 10, 25), Validations(4, 10, 25)
    assert [k for k in range(1, 26) if by_epoch.due(k)] == [10, 20, 25]
    assert [k for k in range(1, 26) if by_step.due(k)] == [4, 8, 12, 16, 20, 24, 25]
    assert (by_epoch.unit, by_step.unit) == ("epoch", "step")


def test_best_keeps_its_step_only_when_given_one():
    best = Best("max", 2)
    best.update(0.5, 1)
    assert "step" not in best.state_dict()  # a script's Best, and recipe-1's, save what they always saved
    counted = Best("max", 2)
    assert counted.update(0.5, 1, 15) and not counted.update(0.4, 1, 30) and not counted.update(0.4, 2, 40)
    assert counted.state_dict() == {"value": 0.5, "epoch": 1, "step": 15, "bad_epochs": 2} and counted.stop
    again = Best("max", 2)
    again.load_state_dict(counted.state_dict())
    assert again.step == 15


def test_the_best_entry_is_named_by_step_and_by_epoch_only_without_one():
    entries = [{"step": 0, "epoch": 0}, {"step": 15, "epoch": 1}, {"step": 23, "epoch": 1}, {"step": 30, "epoch": 2}]
    assert trajectory.best_entry(entries, {"best_epoch": 1, "best_step": 15}) == 1
    assert trajectory.best_entry(entries, {"best_epoch": 1}) == 2  # the earlier rule: the epoch's last entry
    assert trajectory.best_entry(entries, {"best_epoch": 1, "best_step": 16}) is None
    assert trajectory.best_entry(entries, {"best_step": True}) is None and trajectory.best_entry(entries, None) is None


def test_format_2_requires_the_best_step_of_a_training_with_a_best():
    record = {"record_format": 2, "status": "completed", "training": {"epochs": 2, "steps": 40, "best_epoch": 1}}
    fmt = formats.facts(record, {})
    missing = [p for p in formats.problems(record, fmt) if "best_step" in p["detail"]]
    assert [p["kind"] for p in missing] == ["format_requires"]
    assert not [p for p in formats.problems({**record, "record_format": 1}, formats.facts({**record, "record_format": 1}, {}))
                if "best_step" in p["detail"]]  # format 1 did not write it


def test_the_rows_are_rewound_by_step_and_the_earlier_loops_by_epoch(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, "step": s}) + "\n" for e, s in ((1, 15), (1, 23), (2, 30))))
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (4, 8, 12, 16, 20, 24, 28)))
    steplog.rewind(tmp_path, 23)
    assert [r["step"] for r in steplog.read_metrics(tmp_path)] == [15, 23]
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 5
    steplog.rewind(tmp_path, 20, epochs_done=0)  # the earlier loop's rows stand for epochs
    assert steplog.read_metrics(tmp_path) == []


def test_the_new_keys_at_their_default_leave_config_hashes_unchanged():
    plain = load_config(None, [])
    same = load_config(None, ["train.max_steps=0", "eval.every_steps=0"])
    assert plain.hash == same.hash
    assert load_config(None, ["eval.every_steps=5"]).hash != plain.hash


def test_a_search_judges_steps_when_its_trials_validate_inside_epochs(tmp_path):
    from veritrain.orchestration.trials import search

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": 15, "val_acc": 0.5}) + "\n"
                                            + json.dumps({"epoch": 1, "step": 23, "val_acc": 0.6}) + "\n" + '{"epoch": 2, "st')
    assert [r["step"] for r in search._validation_rows(tmp_path, "step")] == [15, 23]  # a line being written is not one yet
    assert search.judged_at({"metric": {}}) == "epoch" and search.judged_at({"metric": {"judged_at": "step"}}) == "step"


# ---------------------------------------------------------------- a run


def test_a_run_of_max_steps_validates_every_n_steps_and_best_pt_holds_the_best_step(stepped):
    made = record(stepped)
    assert made["training"]["engine"] == "recipe-2" and made["record_format"] == 2
    assert [(r["epoch"], r["step"]) for r in rows(stepped)] == [(1, 15), (2, 30), (2, 40)]
    training = made["training"]
    assert training["steps"] == 40 and training["epochs"] == 2
    best = max(rows(stepped), key=lambda r: r["val_acc"])  # the first of equals
    assert (training["best_step"], training["best_epoch"]) == (best["step"], best["epoch"])
    steps = [e["step"] for e in made["trajectory"]]
    assert steps == [0, 15, 23, 30, 40]  # the validations' saves, every epoch's end, the last step
    index = trajectory.best_entry(made["trajectory"], training)
    assert made["trajectory"][index]["step"] == training["best_step"]
    assert veritrain("verify", stepped.name, "--workdir", str(stepped.parent.parent)).code == 0


def test_a_best_named_against_metrics_jsonl_or_a_best_pt_of_another_step_is_caught(stepped, tmp_path):
    """Another state named as validation's choice, with best.pt made to agree (the record resealed, as a forger with
    veritrain's own code would): metrics.jsonl's best is found again. best.pt alone swapped for another state of the
    same epoch: the best step names the one it must hold."""
    from veritrain.records.record import write_record

    workdir = tmp_path / "ws"
    shutil.copytree(stepped.parent.parent, workdir)
    run_dir = workdir / "runs" / stepped.name
    honest = record(run_dir)["training"]["best_step"]
    other = 40 if honest != 40 else 30
    made = record(run_dir)
    made["training"]["best_step"] = other
    for suffix in ("", ".sha256"):
        shutil.copyfile(run_dir / "checkpoints" / f"step-{other}.pt{suffix}", run_dir / "checkpoints" / f"best.pt{suffix}")
    write_record(run_dir, made)
    result = veritrain("verify", stepped.name, "--workdir", str(workdir), "--json")
    assert result.code == 1
    assert {p["kind"] for p in result.json()["problems"]} == {"best_not_best_validation"}, result.stdout

    made["training"]["best_step"] = honest  # the record honest again, best.pt still the other step's state
    write_record(run_dir, made)
    result = veritrain("verify", stepped.name, "--workdir", str(workdir), "--json")
    assert result.code == 1
    assert {p["kind"] for p in result.json()["problems"]} == {"best_not_best_epoch"}, result.stdout


def test_the_pages_and_tables_place_its_rows_by_step(stepped):
    from veritrain.core.display import rows_axis
    from veritrain.web.run_page import curves

    made = record(stepped)
    drawn = curves(stepped, made)
    assert drawn["rows_by"] == "step" and drawn["epochs"] == [15, 30, 40]
    assert rows_axis(rows(stepped)) == ("step", [15, 30, 40])
    assert rows_axis([{"epoch": 1, "step": 23}, {"epoch": 2, "step": 46}]) == ("epoch", [1, 2])  # epoch rows stay by epoch
    shown = veritrain("runs", "show", stepped.name, "--workdir", str(stepped.parent.parent))
    assert f"best step {made['training']['best_step']} (epoch {made['training']['best_epoch']})" in shown.stdout, shown.stdout


# ---------------------------------------------------------------- killed inside an epoch, resumed, audited

DIE_AT_STEP = """
import os, sys
from veritrain.train import steplog
real_step = steplog.StepLog.step
def dying_step(self, state, *args):
    real_step(self, state, *args)
    if state.step == int(sys.argv[1]):
        os._exit(137)  # killed here, as by SIGKILL: no handler runs, no save
steplog.StepLog.step = dying_step
from veritrain.cli import main
main(sys.argv[2:])
"""


@pytest.mark.slow  # processes killed and resumed
@pytest.mark.parametrize("die_at", [19, 35])
def test_killed_inside_an_epoch_the_run_resumes_and_audits_identically(stepped, tmp_path, die_at):
    """Killed after step 19 (after the validation at 15, inside epoch 1) or 35 (inside epoch 2, after the validation at 30):
    resumed from the newest save, its rows, steps and trajectory equal the uninterrupted run's, and every segment audits."""
    killed = subprocess.run([sys.executable, "-c", DIE_AT_STEP, str(die_at), "train", *STEPPED, "--workdir", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == 137, killed.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert max(r["step"] for r in rows(run_dir)) < 40
    resumed = veritrain("train", "--resume", run_dir.name, "--workdir", str(tmp_path), "--json")
    assert resumed.code == 0, resumed.stderr

    def comparable(folder: Path) -> tuple:
        made = record(folder)
        steps = [{k: v for k, v in json.loads(line).items() if k != "samples_per_s"} for line in (folder / "steps.jsonl").read_text().splitlines()]
        return (made["final_state_sha256"], made["training"]["best_step"], [{k: v for k, v in r.items() if k != "seconds"} for r in rows(folder)],
                steps, [{k: v for k, v in e.items() if k not in ("kept", "kept_for_audit")} for e in made["trajectory"]])

    assert comparable(run_dir) == comparable(stepped)
    audited = veritrain("audit", run_dir.name, "--segments", "10", "--workdir", str(tmp_path), "--json")
    assert audited.code == 0, audited.stdout + audited.stderr
    assert [s["verdict"] for s in audited.json()["segments"]] == ["identical"] * 4


def test_a_warmup_as_long_as_the_run_is_warned_about(stepped_run):
    assert "schedule.warmup_steps 40 is not below the run's 40 steps: the learning rate never reaches optim.lr" in stepped_run.stderr
