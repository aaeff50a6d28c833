"""The user's code that ran is recorded with the run and is what runs again.

A run trains a user model from a package beside its config (`nets.blocks:make`, which imports `nets.act` with a
relative import and `helpers` with an absolute one); afterwards the user edits those files. eval, export,
reproduce, resume and audit keep building the recorded copies, say in one line which file differs, and
`--use-current-code` makes new runs instead of re-sealing the old one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from conftest import in_process_run

from veritrain.orchestration import pipeline
from veritrain.records import usercode
from veritrain.trust import opening
from veritrain.core.errors import RunFailed, UserError
from veritrain.orchestration.reproduce import reproduce
from veritrain.trust.verify import verify_run
from veritrain.records.workspace import Workspace

TINY = ["train.epochs=2", "eval.baselines=false", "export.formats=[safetensors]"]

ACT_RELU = "from torch import nn\n\n\ndef activation():\n    return nn.ReLU()\n"
ACT_TANH = "from torch import nn\n\n\ndef activation():\n    return nn.Tanh()\n"
BLOCKS = '''from torch import nn

from helpers import width
from .act import activation


def make(input_shape, num_outputs, hidden=16):
    size = 1
    for d in input_shape:
        size *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(size, width(hidden)), activation(), nn.Linear(width(hidden), num_outputs))
'''
# fails at the 21st training step of each process (after the step-20 checkpoint) until FAIL_AT is set to 0
FLAKY = '''import torch
from torch import nn

FAIL_AT = 21  # training forward calls in this process; 0: never
calls = 0


class Counting(nn.Module):
    def forward(self, x):
        global calls
        calls += int(self.training)
        if FAIL_AT and calls == FAIL_AT:
            raise RuntimeError("a bug in the user's model")
        return torch.relu(x)


def activation():
    return Counting()
'''


def write_project(root: Path, act: str = ACT_RELU) -> Path:
    (root / "nets").mkdir(parents=True)
    (root / "nets" / "__init__.py").write_text("")
    (root / "nets" / "act.py").write_text(act)
    (root / "nets" / "blocks.py").write_text(BLOCKS)
    (root / "helpers.py").write_text("def width(hidden):\n    return hidden\n")
    config = root / "cfg.yaml"
    config.write_text('model:\n  target: "nets.blocks:make"\n')
    return config


@pytest.fixture
def warnings_seen(caplog):
    logger = logging.getLogger("veritrain")
    added = not logger.propagate  # the CLI's logger does not propagate to the root one, where caplog listens
    if added:
        logger.addHandler(caplog.handler)
    yield caplog
    if added:
        logger.removeHandler(caplog.handler)


def differs_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "differs from the copy recorded" in r.getMessage()]


# ---------------------------------------------------------------- pure functions


def test_layout_paths_follow_the_module_name(tmp_path):
    assert usercode.layout_path("nets.blocks", tmp_path / "nets" / "blocks.py") == "nets/blocks.py"
    assert usercode.layout_path("nets", tmp_path / "nets" / "__init__.py") == "nets/__init__.py"
    assert usercode.layout_path("other", tmp_path / "nets" / "blocks.py") is None  # loaded under another name


@pytest.mark.parametrize("entry, problem", [
    ({"module": "nets.blocks", "path": "../blocks.py"}, "not a relative .py path"),
    ({"module": "nets.blocks", "path": "/etc/blocks.py"}, "not a relative .py path"),
    ({"module": "nets.blocks", "path": "nets/other.py"}, "not where module nets.blocks is imported from"),
    ({"module": "nets;rm", "path": "nets.py"}, "is not a module name"),
    ({"module": "json", "path": "json.py"}, "the standard-library module json"),
    ({"module": "torch", "path": "torch/__init__.py"}, "the installed module torch"),
    ({"module": "veritrain", "path": "veritrain/__init__.py"}, "veritrain itself"),
    # not installed here, but imported by torch's TensorBoard writer when it is: a copy by that name would run without any model.target
    ({"module": "tensorflow", "path": "tensorflow/__init__.py"}, "a package veritrain or its dependencies import"),
])
def test_a_hostile_listing_is_refused(entry, problem):
    assert problem in usercode.check_listing([{**entry, "sha256": "0" * 64}])


def test_a_good_listing_passes():
    assert usercode.check_listing([{"module": "nets", "path": "nets/__init__.py", "sha256": "0" * 64},
                                   {"module": "nets.blocks", "path": "nets/blocks.py", "sha256": "0" * 64}]) is None


def test_first_difference_names_the_line():
    assert usercode.first_difference(ACT_RELU.encode(), ACT_TANH.encode()) == "line 5 (now `return nn.Tanh()`, recorded `return nn.ReLU()`)"


def test_a_record_with_only_model_source_uses_it_and_says_the_rest_is_current(tmp_path, warnings_seen):
    run_dir = tmp_path / "runs" / "old"
    (run_dir / "code").mkdir(parents=True)
    (run_dir / "code" / "oldmodel.py").write_text("def make(**kw):\n    return 'recorded'\n")
    import hashlib

    digest = hashlib.sha256((run_dir / "code" / "oldmodel.py").read_bytes()).hexdigest()
    record = {"config": {"model": {"target": "oldmodel:make"}},
              "code": {"model_source": {"target": "oldmodel:make", "file": "code/oldmodel.py", "sha256": digest}}}
    with usercode.recorded(run_dir, record, tmp_path / "scratch", "eval") as code:
        assert code.import_target("oldmodel:make")() == "recorded"
    assert any("recorded only oldmodel.py; its other modules come from the current tree" in r.getMessage() for r in warnings_seen.records)
    assert not (tmp_path / "scratch").exists() or not list((tmp_path / "scratch").iterdir())  # the copies are removed


def test_a_copy_that_does_not_match_its_hash_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "code").mkdir(parents=True)
    (run_dir / "code" / "m.py").write_text("x = 1\n")
    record = {"code": {"user_files": [{"module": "m", "path": "m.py", "sha256": "0" * 64}]}}
    with pytest.raises(RunFailed, match="does not match its recorded hash"):
        usercode.recorded(run_dir, record, tmp_path / "scratch", "eval")


def test_a_record_that_carries_code_needs_trust_code_even_without_a_target(tmp_path):
    workspace = Workspace.open(tmp_path / "ws")
    run_dir = workspace.runs_dir / "copied"
    run_dir.mkdir(parents=True)
    record = {"config": {"model": {"target": None}}, "config_hash": "0" * 64,
              "code": {"user_files": [{"module": "helpers", "path": "helpers.py", "sha256": "0" * 64}]}}
    with pytest.raises(UserError, match=r"its record names code \(1 recorded module\(s\), e.g. helpers\).*pass --trust-code"):
        opening.refuse_untrusted_code(workspace, run_dir, record, trust_code=False)
    opening.refuse_untrusted_code(workspace, run_dir, record, trust_code=True)


def test_a_link_in_the_recorded_code_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "code").mkdir(parents=True)
    (tmp_path / "elsewhere.py").write_text("x = 1\n")
    (run_dir / "code" / "m.py").symlink_to(tmp_path / "elsewhere.py")
    record = {"code": {"user_files": [{"module": "m", "path": "m.py", "sha256": "0" * 64}]}}
    with pytest.raises(RunFailed, match="a link in the recorded code"):
        usercode.recorded(run_dir, record, tmp_path / "scratch", "eval")


def test_a_stale_bytecode_file_never_stands_in_for_the_source(tmp_path, monkeypatch):
    """An edit within the same second that keeps the file's size leaves a __pycache__ file Python would trust:
    the session runs the source it hashes and copies, not that bytecode."""
    import os
    import py_compile

    monkeypatch.setattr("sys.dont_write_bytecode", False)
    module = tmp_path / "stale_model.py"
    module.write_text("VALUE = 1\n")
    py_compile.compile(str(module), doraise=True)  # what an earlier import leaves in __pycache__
    stamp = module.stat().st_mtime_ns
    module.write_text("VALUE = 2\n")  # the same size
    os.utime(module, ns=(stamp, stamp))  # and the same mtime, as within one second
    (tmp_path / "cfg.yaml").write_text("")
    with usercode.fresh(tmp_path / "cfg.yaml") as code:
        assert code.import_target("stale_model:VALUE") == 2
        assert [entry["sha256"] for entry in code.listing()] == [hashlib.sha256(module.read_bytes()).hexdigest()]
    assert "stale_model" not in __import__("sys").modules


def test_namespace_packages_are_imported_afresh_by_each_session(tmp_path):
    (tmp_path / "ns").mkdir()  # no __init__.py
    (tmp_path / "ns" / "layers.py").write_text("VALUE = 1\n")
    (tmp_path / "ns" / "model.py").write_text("from ns import layers\n\n\ndef make():\n    return layers.VALUE\n")
    (tmp_path / "json").mkdir()  # a data folder named like a module is no module: never refused
    (tmp_path / "cfg.yaml").write_text("")
    listings = []
    for value in (1, 2):
        (tmp_path / "ns" / "layers.py").write_text(f"VALUE = {value}\n")
        with usercode.fresh(tmp_path / "cfg.yaml") as code:
            assert code.import_target("ns.model:make")() == value
            listings.append([entry["path"] for entry in code.listing()])
    assert listings == [["ns/layers.py", "ns/model.py"]] * 2
    assert "ns" not in __import__("sys").modules


def test_a_user_module_named_json_is_refused(tmp_path, monkeypatch):
    config = write_project(tmp_path / "proj")
    (tmp_path / "proj" / "json.py").write_text("def dumps(value):\n    return 'mine'\n")
    (tmp_path / "proj" / "helpers.py").write_text("import json\n\n\ndef width(hidden):\n    return hidden\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"helpers.py imports json, and the user module json \(.*json.py\) has the name of the standard-library module json"):
        in_process_run(tmp_path / "ws", TINY, config=config)
    with pytest.raises(UserError, match="the user module json .* has the name of the standard-library module json; rename json.py"):
        in_process_run(tmp_path / "ws", [*TINY, "model.target=json:make"], config=config)
    assert not (tmp_path / "ws" / "runs").exists() or not list((tmp_path / "ws" / "runs").iterdir())  # refused before a run exists


def test_a_missing_module_is_exit_2_in_one_line(tmp_path, monkeypatch, capsys):
    from veritrain.cli import main

    config = write_project(tmp_path / "proj")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:  # in this process: refused before any of the project's code is imported
        main(["run", str(config), "--set", "model.target=nets.nothing:make", "--no-smoke", "--workdir", str(tmp_path / "ws")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: model.target: no module 'nets.nothing' in ")
    assert "nets" not in __import__("sys").modules
    assert not (tmp_path / "ws" / "runs").exists() or not list((tmp_path / "ws" / "runs").iterdir())


# ---------------------------------------------------------------- one run, then the user edits the code


def test_edited_code_leaves_eval_export_and_reproduce_on_the_recorded_copies(tmp_path, monkeypatch, warnings_seen):
    project = tmp_path / "proj"
    config = write_project(project)
    monkeypatch.chdir(tmp_path)  # the config's folder is not the working directory, nor on PYTHONPATH
    outcome = in_process_run(tmp_path / "ws", TINY, config=config)
    assert outcome.error is None, outcome.summary
    run_dir = Path(outcome.summary["run_dir"])
    listed = {entry["module"]: entry["path"] for entry in outcome.record["code"]["user_files"]}
    assert listed == {"helpers": "helpers.py", "nets": "nets/__init__.py", "nets.act": "nets/act.py", "nets.blocks": "nets/blocks.py"}
    assert (run_dir / "code" / "nets" / "act.py").read_text() == ACT_RELU
    recorded_accuracy = outcome.record["metrics"]["test"]["accuracy"]
    from veritrain.core.config import load_config
    from veritrain.orchestration.housekeeping import identical_completed

    workspace = Workspace.open(tmp_path / "ws")
    version = outcome.record["data"]["version"]
    assert identical_completed(load_config(config, TINY), workspace, version)["run_id"] == run_dir.name  # --reuse-completed

    (project / "nets" / "act.py").write_text(ACT_TANH)  # the edit: a module the model imports
    assert identical_completed(load_config(config, TINY), workspace, version) is None  # an edit is never served the old run
    evaluated = pipeline.evaluate_run(workspace, run_dir.name, None, None, ["veritrain", "eval"])
    assert evaluated.run_dir == run_dir and evaluated.result["accuracy"] == recorded_accuracy
    exported = pipeline.export_run(workspace, run_dir.name, None, ["safetensors"], ["veritrain", "export"])
    assert exported.run_dir == run_dir and exported.result["parity"]["passed"]
    (line,) = {message.split(": ", 1)[1] for message in differs_lines(warnings_seen)}  # the same one line from each command
    assert line.startswith(f"{project / 'nets' / 'act.py'} differs from the copy recorded with run {run_dir.name} at line 5 (now `return nn.Tanh()`")
    assert {message.split(":")[0] for message in differs_lines(warnings_seen)} == {"eval", "export"}
    comparison = reproduce(workspace, run_dir.name, ["veritrain", "reproduce"])
    assert comparison["verdict"] == "identical", comparison
    assert verify_run(run_dir, workspace.state_dir)["ok"]

    # --use-current-code: a new run with today's code; the run itself keeps its seal
    seal = (run_dir / "record.sha256").read_text()
    current = pipeline.evaluate_run(workspace, run_dir.name, None, None, ["veritrain", "eval"], use_current_code=True)
    assert current.outside and current.parent == run_dir.name and current.result["accuracy"] != recorded_accuracy
    child = json.loads((current.run_dir / "record.json").read_text())
    assert child["kind"] == "eval" and child["events"][0]["kind"] == "current_code"
    assert {e["module"]: e["sha256"] for e in child["code"]["user_files"]}["nets.act"] != \
        {e["module"]: e["sha256"] for e in outcome.record["code"]["user_files"]}["nets.act"]
    assert (run_dir / "record.sha256").read_text() == seal
    assert verify_run(current.run_dir, workspace.state_dir)["ok"]
    retrained = reproduce(workspace, run_dir.name, ["veritrain", "reproduce"], use_current_code=True)  # Tanh now: another model
    assert retrained["verdict"] == "differs" and (run_dir / "record.sha256").read_text() == seal
    assert not list((tmp_path / "ws" / ".veritrain" / "tmp").glob("code-*"))  # the scratch copies are gone


def test_resume_runs_the_recorded_code_and_use_current_code_continues_in_a_new_run(tmp_path, monkeypatch):
    project = tmp_path / "proj"
    config = write_project(project, act=FLAKY)
    monkeypatch.chdir(tmp_path)
    outcome = in_process_run(tmp_path / "ws", [*TINY, "checkpoint.every_steps=10"], config=config, kind="train")
    assert outcome.record["status"] == "failed" and "a bug in the user's model" in outcome.record["error"]["message"]
    run_dir = Path(outcome.summary["run_dir"])
    (project / "nets" / "act.py").write_text(FLAKY.replace("FAIL_AT = 21", "FAIL_AT = 0"))  # the fix
    workspace = Workspace.open(tmp_path / "ws")

    again = pipeline.resume(workspace, run_dir.name, ["veritrain", "train", "--resume", run_dir.name])
    assert again.record["status"] == "failed"  # the recorded copy still has the bug
    assert any(e["kind"] == "resume" and e["step"] == 20 for e in again.record["events"])
    seal = (run_dir / "record.sha256").read_text()
    fixed = pipeline.resume(workspace, run_dir.name, ["veritrain", "train", "--resume", run_dir.name], use_current_code=True)
    assert fixed.error is None, fixed.summary
    new_dir = Path(fixed.summary["run_dir"])
    assert new_dir != run_dir and fixed.record["parent"] == run_dir.name
    assert any(e["kind"] == "current_code" for e in fixed.record["events"])
    assert "FAIL_AT = 0" in (new_dir / "code" / "nets" / "act.py").read_text()
    assert (run_dir / "record.sha256").read_text() == seal  # the failed run is left as it was
    assert verify_run(new_dir, workspace.state_dir)["ok"]


def test_an_imported_run_evaluates_from_its_archived_code_with_trust_code(tmp_path, monkeypatch):
    from veritrain.trust import archive

    project = tmp_path / "proj"
    config = write_project(project)
    monkeypatch.chdir(tmp_path)
    outcome = in_process_run(tmp_path / "ws", TINY, config=config)
    run_dir = Path(outcome.summary["run_dir"])
    archive.create(run_dir, tmp_path / "ws" / ".veritrain", tmp_path / "run.tar.gz", with_data=True)
    (project / "nets").rename(project / "gone")  # the model code is nowhere to import from now
    elsewhere = Workspace.open(tmp_path / "elsewhere")
    archive.import_archive(tmp_path / "run.tar.gz", elsewhere)
    with pytest.raises(UserError, match="pass --trust-code"):
        pipeline.evaluate_run(elsewhere, run_dir.name, None, None, ["veritrain", "eval"])
    evaluated = pipeline.evaluate_run(elsewhere, run_dir.name, None, None, ["veritrain", "eval"], trust_code=True)
    assert evaluated.result["accuracy"] == outcome.record["metrics"]["test"]["accuracy"]


def test_sweep_trials_import_the_copies_made_at_the_sweeps_start(tmp_path, monkeypatch):
    from veritrain.orchestration.trials.process import _sweep_code

    project = tmp_path / "proj"
    config = write_project(project)
    monkeypatch.chdir(tmp_path)
    workspace = Workspace.open(tmp_path / "ws")
    folder = workspace.state_dir / "sweeps" / "s1"
    folder.mkdir(parents=True)
    listed: dict = {}
    with usercode.fresh(config) as session:  # what sweep.start does before its first trial
        session.import_target("nets.blocks:make")
        session.save(folder, listed)
    spec = {"sweep_id": "s1", "code": {"user_files": listed["user_files"], "sha256": usercode.listing_sha256(listed["user_files"])}}
    (project / "nets" / "act.py").write_text(ACT_TANH)  # edited while the sweep runs
    with _sweep_code(spec, workspace) as code:
        model = code.import_target("nets.blocks:make")(input_shape=[1, 8, 8], num_outputs=10)
    assert type(model[2]).__name__ == "ReLU"  # the copy from the start, not today's Tanh
    spec["code"]["user_files"][0]["sha256"] = "0" * 64
    with pytest.raises(RunFailed, match="does not hash to the sha256 recorded at the start"):
        _sweep_code(spec, workspace)
