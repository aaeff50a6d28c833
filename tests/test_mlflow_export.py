"""`veritrain runs export RUN... --to mlflow DIR`: the runs in an MLflow store that stock MLflow reads back with the
numbers of the runs themselves (params = the flattened config, per-epoch metrics = metrics.jsonl, final metrics =
`runs list --json`), their seal and data version, their files byte for byte; runs whose seal does not hold are
refused; a second export adds nothing. Needs the mlflow extra (make test-slow)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import SmallRun, need_extra, veritrain, veritrain_process

pytestmark = pytest.mark.slow

HAVE_MLFLOW = importlib.util.find_spec("mlflow") is not None
SECOND_RUN = "20300101-000000-000-abcdef"  # a second sealed run made from the small run's files (no training)


@pytest.fixture(autouse=True)
def _mlflow_installed() -> None:
    need_extra(HAVE_MLFLOW, "the mlflow extra (pip install 'veritrain[mlflow]')")


def reseal(run_dir: Path, change: Callable[[dict[str, Any]], None]) -> str:
    """Change the run's record and seal it again, as a writer would (the seal is a hash, not a signature), with its
    unsigned provenance statement written again for the new seal."""
    from veritrain.records.record import record_bytes, statement_bytes

    record = json.loads((run_dir / "record.json").read_text(encoding="utf-8"))
    change(record)
    data = record_bytes(record)
    (run_dir / "record.json").write_bytes(data)
    seal = hashlib.sha256(data).hexdigest()
    (run_dir / "record.sha256").write_text(seal + "\n")
    (run_dir / "provenance.intoto.jsonl").write_bytes(statement_bytes(record, seal, run_dir, None))
    return seal


def second_run(small: SmallRun) -> Path:
    """A copy of the small run under another run id, sealed: a second run of the same workspace."""
    twin = small.run_dir.parent / SECOND_RUN
    if not twin.exists():
        shutil.copytree(small.run_dir, twin)
        reseal(twin, lambda r: r.update(run_id=SECOND_RUN, started_at="2030-01-01T00:00:00.000+00:00", ended_at="2030-01-01T00:00:09.250+00:00"))
    return twin


def flattened(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The config as the params the docs promise: dotted keys, strings as they are, other values as JSON."""
    params: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            params.update(flattened(value, f"{prefix}{key}."))
        else:
            params[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return params


def epoch_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def listed(workdir: Path) -> dict[str, dict[str, float]]:
    """run id → the final metrics `veritrain runs list --json` shows, as `<split>.<name>`."""
    result = veritrain("runs", "list", "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    return {row["run_id"]: {f"{split}.{name}": value for split, values in row["metrics"].items() for name, value in values.items()}
            for row in result.json()["runs"]}


def exported_files(run_dir: Path) -> list[str]:
    """What the export copies: the record, its seal, its provenance statement, the config, metrics.jsonl, eval/ and export/."""
    names = ["record.json", "record.sha256", "config.yaml", "metrics.jsonl"] + (["provenance.intoto.jsonl"] if (run_dir / "provenance.intoto.jsonl").exists() else [])
    names += [p.relative_to(run_dir).as_posix() for folder in ("eval", "export") for p in sorted((run_dir / folder).rglob("*")) if p.is_file()]
    return sorted(names)


# what stock MLflow reads back, in a process of its own that never imports veritrain
STOCK_READER = r"""
import json, sys
import mlflow

mlflow.set_tracking_uri(sys.argv[1])
frame = mlflow.search_runs(experiment_names=[sys.argv[2]])
client = mlflow.MlflowClient()
found = {}
for _, row in frame.iterrows():
    run = client.get_run(row["run_id"])
    def walk(path=None):
        for item in client.list_artifacts(run.info.run_id, path):
            yield from (walk(item.path) if item.is_dir else [item.path])
    dataset = run.inputs.dataset_inputs[0].dataset
    found[row["tags.veritrain.run_id"]] = {
        "mlflow_run_id": row["run_id"],
        "status": row["status"],
        "start_time": round(row["start_time"].timestamp() * 1000),
        "end_time": round(row["end_time"].timestamp() * 1000),
        "metrics": {k[len("metrics."):]: v for k, v in row.items() if k.startswith("metrics.") and v == v},
        "params": {k[len("params."):]: v for k, v in row.items() if k.startswith("params.") and v is not None},
        "tags": {k[len("tags."):]: v for k, v in row.items() if k.startswith("tags.") and isinstance(v, str)},
        "history": {key: [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, key)]
                    for key in ("train_loss", "val_acc", "epoch")},
        "dataset": {"name": dataset.name, "digest": dataset.digest, "profile": json.loads(dataset.profile),
                    "source": mlflow.data.get_source(dataset).uri},
        "artifacts": sorted(walk()),
    }
assert "veritrain" not in sys.modules
print(json.dumps(found))
"""


def stock_read(out: Path, experiment: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    proc = subprocess.run([sys.executable, "-c", STOCK_READER, f"sqlite:///{out / 'mlflow.db'}", experiment],
                          capture_output=True, text=True, timeout=300, cwd=out, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def two_exported(small_run: SmallRun, tmp_path_factory) -> dict[str, Any]:
    """The small run and a second run exported together, by the command in a process of its own, with --json."""
    twin = second_run(small_run)
    out = tmp_path_factory.mktemp("mlflow-two") / "out"
    result = veritrain_process("runs", "export", small_run.run_dir.name, SECOND_RUN[:15], "--to", "mlflow", str(out),
                               "--workdir", str(small_run.workdir), "--json")
    return {"result": result, "out": out, "runs": {small_run.run_dir.name: small_run.run_dir, SECOND_RUN: twin}}


def test_the_command_prints_one_json_document_and_keeps_mlflow_logs_on_stderr(two_exported):
    result = two_exported["result"]
    assert result.code == 0, result.stderr
    summary = json.loads(result.stdout)  # exactly one document: json.loads refuses anything after it
    out = two_exported["out"]
    assert summary["out"] == str(out) and summary["tracking_uri"] == f"sqlite:///{out / 'mlflow.db'}"
    assert summary["artifact_root"] == str(out / "artifacts") and (out / "artifacts").is_dir()
    assert [r["run_id"] for r in summary["runs"]] == list(two_exported["runs"])
    assert all(r["exported"] and r["status"] == "FINISHED" and r["omitted"] == [] for r in summary["runs"])
    assert "mlflow" in result.stderr.lower()  # MLflow's own lines (creating the tables) went to stderr


def test_stock_mlflow_reads_back_the_runs_with_the_numbers_of_the_runs(two_exported, small_run):
    experiment = json.loads(two_exported["result"].stdout)["experiment"]["name"]
    assert experiment == small_run.workdir.name  # named after the workspace
    found = stock_read(two_exported["out"], experiment)
    final = listed(small_run.workdir)
    assert set(found) == set(two_exported["runs"])
    for run_id, run_dir in two_exported["runs"].items():
        record = json.loads((run_dir / "record.json").read_text())
        rows = epoch_rows(run_dir)
        got = found[run_id]
        assert got["params"] == flattened(record["config"])
        last = {k: v for k, v in rows[-1].items() if k != "step"}
        assert got["metrics"] == {**final[run_id], **last}  # final ones exactly as `runs list --json`, per-epoch ones at their last row
        assert got["metrics"]["test.accuracy"] == record["metrics"]["test"]["accuracy"]
        for key in ("train_loss", "val_acc", "epoch"):
            assert got["history"][key] == [[row["step"], row[key]] for row in rows]
        assert got["tags"]["veritrain.seal"] == (run_dir / "record.sha256").read_text().strip()
        assert got["tags"]["veritrain.data_version"] == record["data"]["version"]
        assert got["tags"]["mlflow.runName"] == run_id and got["tags"]["veritrain.kind"] == "run"
        assert got["tags"]["veritrain.status"] == "completed" and got["status"] == "FINISHED"
        assert got["tags"]["veritrain.record"] == str(run_dir / "record.json")
        assert got["tags"]["veritrain.code_version"] == (record["code"]["git_commit"] or f"veritrain {record['code']['veritrain']}")
        from datetime import datetime

        assert got["start_time"] == round(datetime.fromisoformat(record["started_at"]).timestamp() * 1000)
        assert got["end_time"] == round(datetime.fromisoformat(record["ended_at"]).timestamp() * 1000)
        version = record["data"]["version"]
        assert got["dataset"]["digest"] == version[:36]  # all MLflow stores of a digest
        assert got["dataset"]["profile"]["data_version"] == version and len(version) == 64
        assert got["dataset"]["source"] == str(small_run.workdir / ".veritrain" / "data" / version)
        assert got["dataset"]["name"] == f"digits@{version[:12]}"
        assert got["artifacts"] == exported_files(run_dir)
        copies = two_exported["out"] / "artifacts" / got["mlflow_run_id"] / "artifacts"
        for name in got["artifacts"]:
            assert (copies / name).read_bytes() == (run_dir / name).read_bytes(), name


def test_a_fresh_client_reads_the_export_of_the_library_call(small_run, tmp_path):
    from mlflow.tracking import MlflowClient

    from veritrain.records.record import read_record
    from veritrain.records.workspace import Workspace
    from veritrain.trust import mlflow_export

    environment = dict(os.environ)
    summary = mlflow_export.export(Workspace.open(small_run.workdir), [read_record(small_run.run_dir)], tmp_path / "out")
    assert dict(os.environ) == environment  # no MLFLOW_* variable left behind
    import mlflow

    assert mlflow.get_tracking_uri() != summary["tracking_uri"]  # the process's own tracking URI is untouched
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    run = client.get_run(summary["runs"][0]["mlflow_run_id"])
    assert run.data.params == flattened(small_run.record["config"])
    assert run.data.tags["veritrain.run_id"] == small_run.run_dir.name and run.data.tags["veritrain.seal"] == small_run.seal
    for key in ("train_loss", "train_acc", "val_loss", "val_acc", "lr"):
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == \
            [(row["step"], row[key]) for row in epoch_rows(small_run.run_dir)]
    assert run.inputs.dataset_inputs[0].dataset.digest == small_run.record["data"]["version"][:36]
    assert {t.key: t.value for t in run.inputs.dataset_inputs[0].tags}["veritrain.data_version"] == small_run.record["data"]["version"]


def test_exporting_again_adds_nothing_and_a_run_sealed_anew_is_refused(small_run_copy, tmp_path):
    out, ref = tmp_path / "out", small_run_copy.run_dir.name
    first = veritrain("runs", "export", "latest", "--to", "mlflow", str(out), "--workdir", str(small_run_copy.workdir), "--json")
    assert first.code == 0, first.stderr
    again = veritrain("runs", "export", "latest", "--to", "mlflow", str(out), "--workdir", str(small_run_copy.workdir))
    assert again.code == 0, again.stderr
    mlflow_id = first.json()["runs"][0]["mlflow_run_id"]
    assert again.stdout.splitlines()[0] == f"{ref} is in {out} already, with the same seal, as MLflow run {mlflow_id}: left as it is"
    assert "mlflow.store" not in again.stdout and "INFO" not in again.stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(small_run_copy.workdir.name)
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [mlflow_id]

    reseal(small_run_copy.run_dir, lambda r: r.update(hypothesis="re-sealed after the export"))
    refused = veritrain("runs", "export", ref, "--to", "mlflow", str(out), "--workdir", str(small_run_copy.workdir))
    assert refused.code == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1].startswith(f"error: {ref}: already exported as MLflow run {mlflow_id} with seal {small_run_copy.seal[:12]}")
    assert "mlflow runs delete --run-id" in refused.stderr
    assert len(client.search_runs([experiment.experiment_id])) == 1


def test_what_an_interrupted_export_left_is_replaced(small_run_copy, tmp_path):
    from mlflow.tracking import MlflowClient

    from veritrain.records.record import read_record
    from veritrain.records.workspace import Workspace
    from veritrain.trust import mlflow_export

    workspace, out = Workspace.open(small_run_copy.workdir), tmp_path / "out"
    first = mlflow_export.export(workspace, [read_record(small_run_copy.run_dir)], out)["runs"][0]
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    client.delete_tag(first["mlflow_run_id"], "veritrain.seal")  # as a kill before the last step leaves it
    second = mlflow_export.export(workspace, [read_record(small_run_copy.run_dir)], out)["runs"][0]
    assert second["exported"] and second["mlflow_run_id"] != first["mlflow_run_id"]
    assert client.get_run(first["mlflow_run_id"]).info.lifecycle_stage == "deleted"
    assert [r.info.run_id for r in client.search_runs([client.get_experiment_by_name(workspace.root.name).experiment_id])] == [second["mlflow_run_id"]]


def test_a_run_whose_seal_or_files_do_not_hold_is_refused_and_nothing_is_written(small_run_copy, tmp_path):
    run_dir, ref, out = small_run_copy.run_dir, small_run_copy.run_dir.name, tmp_path / "out"
    text = (run_dir / "record.json").read_text()
    (run_dir / "record.json").write_text(text.replace('"exp_name": "digits"', '"exp_name": "digitz"', 1))
    tampered = veritrain("runs", "export", ref, "--to", "mlflow", str(out), "--workdir", str(small_run_copy.workdir), "--json")
    assert tampered.code == 1
    assert tampered.json()["error"]["message"] == (f"{ref}: record.json does not match its seal record.sha256; the run was changed after it "
                                                   f"was sealed, so it is not exported: see `veritrain verify {ref}`")
    assert not out.exists()

    (run_dir / "record.json").write_text(text)
    (run_dir / "eval" / "test" / "report.md").write_text("a better report\n")
    changed = veritrain("runs", "export", ref, "--to", "mlflow", str(out), "--workdir", str(small_run_copy.workdir))
    assert changed.code == 1 and changed.stdout == ""
    assert changed.stderr.strip().splitlines()[-1] == (f"error: {ref}: eval/test/report.md: changed since the run was sealed, so the run is not "
                                                       f"exported: see `veritrain verify {ref}`")
    assert not out.exists()


def test_usage_errors_are_one_line_with_exit_2(small_run, tmp_path):
    workdir, out = str(small_run.workdir), str(tmp_path / "out")
    missing = veritrain("runs", "export", "nosuchrun", "--to", "mlflow", out, "--workdir", workdir, "--json")
    assert missing.code == 2
    assert missing.json()["error"]["message"] == f"nosuchrun: no such run in {small_run.workdir / 'runs'}; give a run id, a unique prefix, `latest` or a run folder"
    unknown = veritrain("runs", "export", "latest", "--to", "wandb", out, "--workdir", workdir)
    assert unknown.code == 2 and unknown.stdout == ""
    assert unknown.stderr.strip().splitlines()[-1] == ("error: veritrain runs export: Invalid value for '--to': 'wandb' is not 'mlflow' "
                                                       "(see `veritrain runs export --help`)")
    no_folder = veritrain("runs", "export", "latest", "--to", "mlflow", "--workdir", workdir)
    assert no_folder.code == 2 and no_folder.stderr.strip().splitlines()[-1] == (
        "error: veritrain runs export: Invalid value for '--to': mlflow --workdir: give the folder after the format, e.g. --to mlflow out/ "
        "(see `veritrain runs export --help`)")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    refused = veritrain("runs", "export", "latest", "--to", "mlflow", str(not_a_folder), "--workdir", workdir)
    assert refused.code == 2 and refused.stderr.strip().splitlines()[-1].startswith("error: veritrain runs export: Invalid value for '--to'")
    assert not Path(out).exists()


def test_without_mlflow_the_export_says_how_to_install_it(small_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    result = veritrain("runs", "export", "latest", "--to", "mlflow", str(tmp_path / "out"), "--workdir", str(small_run.workdir))
    assert result.code == 2
    assert result.stderr.strip().splitlines()[-1] == "error: runs export --to mlflow needs MLflow: pip install 'veritrain[mlflow]'"


def test_runs_list_and_verify_do_not_import_mlflow(small_run):
    script = ("import sys; from veritrain.cli import main\n"
              "from veritrain.trust import mlflow_export  # the module itself imports MLflow only when an export runs\n"
              f"for args in (['runs', 'list', '--workdir', {str(small_run.workdir)!r}, '--json'], ['verify', 'latest', '--workdir', {str(small_run.workdir)!r}]):\n"
              "    try:\n        main(args)\n    except SystemExit as exit_:\n        assert exit_.code == 0, exit_.code\n"
              "assert not any(m == 'mlflow' or m.startswith('mlflow.') for m in sys.modules), 'mlflow was imported'\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_values_mlflow_cannot_hold_go_whole_into_an_artifact_never_cut(small_run_copy, tmp_path):
    long_value = "x" * 7000  # MLflow keeps 6,000 characters of a param
    reseal(small_run_copy.run_dir, lambda r: r["config"]["model"].update(kwargs={"note": long_value, "a+b": 1, "depth": 3}))
    result = veritrain("runs", "export", "latest", "--to", "mlflow", str(tmp_path / "out"), "--workdir", str(small_run_copy.workdir), "--json")
    assert result.code == 0, result.stderr
    exported = result.json()["runs"][0]
    assert exported["omitted"] == ["params.model.kwargs.a+b", "params.model.kwargs.note"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    run = client.get_run(exported["mlflow_run_id"])
    assert "model.kwargs.note" not in run.data.params and "model.kwargs.a+b" not in run.data.params
    assert run.data.params["model.kwargs.depth"] == "3"
    assert "config_omitted.json" in run.data.tags["veritrain.omitted"]
    copies = tmp_path / "out" / "artifacts" / run.info.run_id / "artifacts"
    assert json.loads((copies / "config_omitted.json").read_text()) == {"params.model.kwargs.a+b": 1, "params.model.kwargs.note": long_value}


def test_params_and_keys_follow_mlflow_limits():
    from veritrain.trust.mlflow_export import params_of, valid_key

    assert valid_key("optim.lr") and valid_key("test.accuracy") and valid_key("data/split: 1")
    assert not valid_key("a+b") and not valid_key("a/../b") and not valid_key("/a") and not valid_key("k" * 251)
    params, omitted = params_of({"a": {"b": None, "c": [1, 2], "d": {}, "e": "text", "f": True, "g": "y" * 6001}})
    assert params == {"a.b": "null", "a.c": "[1, 2]", "a.d": "{}", "a.e": "text", "a.f": "true"}
    assert omitted == {"params.a.g": "y" * 6001}
