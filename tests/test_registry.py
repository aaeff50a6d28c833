"""The run registry, `runs` commands and experiments.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import in_process_run

FAST = ["train.epochs=1", "model.name=mlp", "model.hidden=[16]", "export.formats=[safetensors]"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ws")
    first = in_process_run(workdir, FAST)
    second = in_process_run(workdir, FAST + ["optim.lr=0.01"])
    failed = in_process_run(workdir, FAST + ["optim.name=sgd", "optim.lr=1e30", "train.max_rollbacks=0"])
    return workdir, [first, second, failed]


def test_runs_list_json_and_filters(cli, workspace):
    workdir, outcomes = workspace
    result = cli("runs", "list", "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    runs = result.json()["runs"]
    assert [r["run_id"] for r in runs] == [o.summary["run_id"] for o in reversed(outcomes)]  # newest first
    assert {r["status"] for r in runs} == {"completed", "failed"}
    completed = cli("runs", "list", "--status", "completed", "--sort", "test.accuracy", "--workdir", str(workdir), "--json").json()["runs"]
    assert len(completed) == 2
    assert completed[0]["metrics"]["test"]["accuracy"] >= completed[1]["metrics"]["test"]["accuracy"]
    by_lr = cli("runs", "list", "--filter", "optim.lr=0.01", "--workdir", str(workdir), "--json").json()["runs"]
    assert [r["run_id"] for r in by_lr] == [outcomes[1].summary["run_id"]]


def test_registry_is_rebuilt_from_the_folders(cli, workspace):
    workdir, outcomes = workspace
    (workdir / ".veritrain" / "registry.sqlite").unlink()
    for suffix in ("-wal", "-shm"):
        (workdir / ".veritrain" / f"registry.sqlite{suffix}").unlink(missing_ok=True)
    result = cli("runs", "list", "--workdir", str(workdir), "--json")
    assert len(result.json()["runs"]) == 3
    reindexed = cli("runs", "reindex", "--workdir", str(workdir), "--json")
    assert reindexed.code == 0 and reindexed.json()["runs"] == 3


def test_runs_list_does_not_import_torch(workspace):
    workdir, _ = workspace
    code = ("import sys\nfrom veritrain.cli import main\ntry:\n    main(['runs', 'list', '--json', '--workdir', sys.argv[1]])\n"
            "except SystemExit as e:\n    assert e.code == 0\nassert 'torch' not in sys.modules, 'runs list imported torch'\n")
    proc = subprocess.run([sys.executable, "-c", code, str(workdir)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_show_compare_and_note(cli, workspace):
    workdir, outcomes = workspace
    first, second = outcomes[0].summary["run_id"], outcomes[1].summary["run_id"]
    shown = cli("runs", "show", first[:17], "--workdir", str(workdir), "--json")
    assert shown.code == 0 and shown.json()["run_id"] == first
    compared = cli("runs", "compare", first, second, "--workdir", str(workdir), "--json").json()
    assert compared["config"][second] == {"optim.lr": {"base": 0.003, "this": 0.01}}
    assert "test.accuracy" in compared["metrics"][second] and compared["metrics"][second]["test.accuracy"]["delta"] is not None
    assert compared["data_version"][first] == compared["data_version"][second]
    before = (workdir / "runs" / second / "record.sha256").read_text()
    note = cli("runs", "note", second, "higher lr converges faster", "--conclusion", "--workdir", str(workdir))
    assert note.code == 0
    notes = [json.loads(l) for l in (workdir / "runs" / second / "notes.jsonl").read_text().splitlines()]
    assert notes[-1]["text"] == "higher lr converges faster" and notes[-1]["conclusion"] is True
    assert (workdir / "runs" / second / "record.sha256").read_text() == before  # notes are outside the seal
    assert cli("verify", second, "--workdir", str(workdir)).code == 0
    listed = cli("runs", "list", "--workdir", str(workdir), "--json").json()["runs"]
    assert next(r for r in listed if r["run_id"] == second)["notes"][-1]["conclusion"] is True


def test_experiments_md_has_every_run_with_changes_and_reasons(cli, workspace):
    workdir, outcomes = workspace
    cli("runs", "reindex", "--workdir", str(workdir))
    text = (workdir / "experiments.md").read_text()
    for outcome in outcomes:
        assert f"## {outcome.summary['run_id']}" in text
    second = outcomes[1].summary["run_id"]
    section = text.split(f"## {second}")[1].split("\n## ")[0]
    assert "`optim.lr` 0.003 → 0.01" in section and "(single seed)" in section
    failed = text.split(f"## {outcomes[2].summary['run_id']}")[1].split("\n## ")[0]
    assert "**failed:**" in failed and "loss became" in failed


def test_hypothesis_and_parent_are_recorded(tmp_path, workspace):
    workdir, outcomes = workspace
    from veritrain.orchestration import pipeline
    from veritrain.core.config import load_config
    from veritrain.records.workspace import Workspace

    outcome = pipeline.run(load_config(None, FAST + ["seed=7"]), Workspace.open(workdir), ["veritrain", "run"],
                           hypothesis="a new seed changes accuracy by < 1%", parent=outcomes[0].summary["run_id"])
    assert outcome.record["hypothesis"] == "a new seed changes accuracy by < 1%"
    assert outcome.record["parent"] == outcomes[0].summary["run_id"]
    text = (workdir / "experiments.md").read_text()
    section = text.split(f"## {outcome.summary['run_id']}")[1].split("\n## ")[0]
    assert "hypothesis: a new seed changes accuracy by < 1%" in section
    assert f"changes vs {outcomes[0].summary['run_id']}: `seed` 0 → 7" in section


@pytest.mark.slow  # concurrent processes: checked in `make test-slow`
def test_four_runs_started_at_once_all_complete(tmp_path):
    """Parallel starts in one workspace: distinct ids, shared data version and caches, all indexed."""
    procs = [subprocess.Popen([sys.executable, "-m", "veritrain", "train", "--set", "train.epochs=1", "--set", "model.name=mlp",
                               "--set", f"seed={i}", "--workdir", str(tmp_path), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    results = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    ids = {json.loads(out)["run_id"] for out, _ in results}
    assert len(ids) == 4
    listed = subprocess.run([sys.executable, "-m", "veritrain", "runs", "list", "--json", "--workdir", str(tmp_path)],
                            capture_output=True, text=True, check=True)
    assert {r["run_id"] for r in json.loads(listed.stdout)["runs"]} == ids
    assert len({json.loads(out)["data_version"] for out, _ in results}) == 1
    text = (tmp_path / "experiments.md").read_text()
    assert all(f"## {run_id}" in text for run_id in ids)


def test_dry_run_reuse_completed_and_gc(cli, tmp_path):
    args = ["--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "model.hidden=[16]", "--set", "export.formats=[onnx]",
            "--set", "checkpoint.every_steps=5", "--no-smoke", "--workdir", str(tmp_path)]
    plan = cli("run", *args, "--dry-run", "--json").json()["stages"]
    assert [s["stage"] for s in plan] == ["smoke", "prepare", "train", "baselines", "eval", "export"]
    assert plan[1]["action"] == "run" and plan[2]["action"] == "run"
    first = cli("run", *args, "--json").json()
    plan = cli("run", *args, "--dry-run", "--reuse-completed", "--json").json()["stages"]
    assert plan[1]["action"] == "reuse" and plan[2]["action"] == "reuse" and plan[2]["run_id"] == first["run_id"] and first["run_id"] in plan[2]["reason"]
    again = cli("run", *args, "--reuse-completed", "--json").json()
    assert again["run_id"] == first["run_id"] and again["reused"] is True
    assert len(list((tmp_path / "runs").iterdir())) == 1  # nothing new ran

    run_dir = Path(first["run_dir"])
    steps = list((run_dir / "checkpoints").glob("step-*.pt"))
    assert steps
    preview = cli("gc", "--dry-run", "--workdir", str(tmp_path), "--json").json()
    assert preview["dry_run"] and all(Path(tmp_path / p).exists() for p in preview["removed"])
    assert preview["resealed"] == [run_dir.name]  # would be: nothing was re-sealed yet
    said = cli("gc", "--dry-run", "--workdir", str(tmp_path)).stdout
    assert "would amend 1 run(s)" in said and "would remove " in said and " amended" not in said
    result = cli("gc", "--workdir", str(tmp_path), "--json").json()
    assert not list((run_dir / "checkpoints").glob("step-*")) and (run_dir / "checkpoints" / "best.pt").exists()
    assert result["resealed"] == [run_dir.name]
    from veritrain.records.record import read_record

    record = read_record(run_dir)
    assert record["events"][-1]["kind"] == "gc" and record.amendments[-1].by == "gc"
    assert cli("verify", run_dir.name, "--workdir", str(tmp_path)).code == 0  # amended, still verifies


def test_a_bad_line_in_notes_is_skipped_with_a_warning(cli, workspace, tmp_path):
    """notes.jsonl is edited by hand: one broken line must not take `runs list` or `runs show` down."""
    import shutil

    workdir, outcomes = workspace
    source = Path(outcomes[0].summary["run_dir"])
    run_dir = tmp_path / "runs" / source.name
    shutil.copytree(source, run_dir)
    good = {"at": "2024-01-01T00:00:00", "text": "kept", "conclusion": False}
    (run_dir / "notes.jsonl").write_text(json.dumps(good) + "\n{not json\n42\n\n" + json.dumps({"no": "text"}) + "\n", encoding="utf-8")
    listed = cli("runs", "list", "--workdir", str(tmp_path), "--json")
    assert listed.code == 0, listed.stderr
    assert listed.json()["runs"][0]["notes"] == [good]
    assert "Traceback" not in listed.stderr
    warnings = [l for l in listed.stderr.splitlines() if l.startswith("warning: ")]
    assert [w.split("notes.jsonl: ")[1].split(":")[0] for w in warnings] == ["line 2", "line 3", "line 5"]
    shown = cli("runs", "show", source.name, "--workdir", str(tmp_path), "--json")
    assert shown.code == 0, shown.stderr
    assert shown.json()["notes"] == [good]


@pytest.mark.parametrize("args, words", [
    (["--filter", "foo=bar"], "has a column or config key 'foo'; filter on a column (run_id, exp_name,"),
    (["--filter", "optim.lrr=0.01"], "(did you mean optim.lr?)"),
    (["--filter", "status=complete"], "--filter status=complete: status is one of running, completed, failed, interrupted"),
    (["--sort", "nonsense.metric"], "has a column or metric 'nonsense.metric'; sort by a metric (test.accuracy, "),
    (["--sort", "-test.acuracy"], "(did you mean test.accuracy?)"),
])
def test_an_unknown_filter_or_sort_key_is_exit_2_naming_the_valid_ones(workspace, capsys, args, words):
    from veritrain.cli import main

    workdir, _ = workspace
    with pytest.raises(SystemExit) as exited:
        main(["runs", "list", *args, "--workdir", str(workdir)])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ") and words in err, err


def test_filters_take_recorded_config_paths_and_columns(workspace):
    from veritrain.records import registry

    workdir, outcomes = workspace
    state, runs = workdir / ".veritrain", workdir / "runs"
    every = registry.query(state, runs)  # the fixture's runs, and those other tests of this module add (all hidden=[16])
    assert len(every) >= 3
    assert len(registry.query(state, runs, filters=("model.hidden=[16]",))) == len(every)  # a list value, compared as JSON
    assert len(registry.query(state, runs, filters=("model.hidden[0]=16",))) == len(every)  # an item of it
    assert registry.query(state, runs, filters=("model.hidden=[17]",)) == []
    assert len(registry.query(state, runs, filters=("status=failed",), sort="-test.log_loss")) == 1
    assert registry.query(state, runs, filters=("kind=eval",)) == []  # a known key that matches nothing is no error


@pytest.mark.parametrize("sort", ["test.accuracy", "-test.log_loss", "status", "-started_at", ""])
def test_runs_list_and_the_browsers_table_list_the_same_runs_in_the_same_order(workspace, sort):
    """One query layer (veritrain.records.run_query): a sort or a status filter means the same in both."""
    from veritrain.records import registry
    from veritrain.records.workspace import Workspace
    from veritrain.web.runs_table import runs_table

    workdir, _ = workspace
    listed = [r["run_id"] for r in registry.query(workdir / ".veritrain", workdir / "runs", status=("completed",), sort=sort or None)]
    table = runs_table(Workspace.open(workdir), {"sort": sort, "status": "completed"})
    assert [row["run_id"] for row in table["rows"]] == listed and len(listed) >= 2


def test_the_flat_model_section_of_earlier_records_is_no_change():
    """An earlier veritrain recorded every model's keys for every task; the runs table, experiments.md, the run page and
    sweep --parent read configs as their hashes do, so those keys at their defaults are no change."""
    from veritrain.core.config import FLAT_MODEL_SECTION, RunConfig
    from veritrain.records import registry
    from veritrain.records.experiments import config_changes

    def config(**sets):
        return RunConfig.model_validate(sets).model_dump(mode="json")

    flat_classifier = config()
    flat_classifier["model"] = {**FLAT_MODEL_SECTION, **flat_classifier["model"]}
    assert registry.changed_params(flat_classifier) == {} and config_changes(flat_classifier, config()) == {}
    lm = config(task="lm", data={"source": "pydoc_topics"})
    flat_lm = {**lm, "model": {**FLAT_MODEL_SECTION, **lm["model"]}}
    assert config_changes(flat_lm, lm) == {}
    assert registry.changed_params(lm) == registry.changed_params(flat_lm) == {"task": "lm", "data.source": "pydoc_topics", "model.name": "gpt"}
    deeper = config(task="lm", data={"source": "pydoc_topics"}, model={"layers": 3})
    assert config_changes(flat_lm, deeper) == {"model.layers": (2, 3)}
