"""Hostile or stray inputs never hang and never print a traceback: each is one line with the exit code of the
contract. Stray torchrun variables, checkpoints and ONNX files from elsewhere, FIFOs given to predict, records
holding null, credentials in free text, secrets in error lines and tracebacks, terminal escapes in records,
publish into the workspace, killed commands' scratch folders, and NaN in --json."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import veritrain as cli_run
from veritrain import cli
from veritrain.core.errors import RunFailed, UserError

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "VERITRAIN_NPROC_LAUNCH")


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `veritrain ARGS` run in this process."""
    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


# ---------------------------------------------------------------- stray torchrun variables


def test_torchrun_variables_without_torchrun_are_exit_2_not_a_hang(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    proc = subprocess.run([sys.executable, "-m", "veritrain", "train", "--workdir", str(tmp_path)], capture_output=True, text=True,
                          env={**env, "RANK": "1", "WORLD_SIZE": "2", "PYTHONWARNINGS": "ignore"}, timeout=60)  # it used to wait forever
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["error: environment: RANK, WORLD_SIZE are set but no torchrun launch was found; "
                                        "unset them or start with torchrun"]
    assert not (tmp_path / "runs").exists()


def test_each_stray_variable_is_named_and_a_torchrun_launch_is_trusted(monkeypatch, capsys, tmp_path):
    from veritrain.train import distributed

    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # used to fail inside torch.distributed with a traceback
    code, out, err = run_cli(capsys, "run", "--workdir", str(tmp_path))
    assert code == 2 and err.splitlines() == ["error: environment: WORLD_SIZE is set but no torchrun launch was found; "
                                              "unset them or start with torchrun"]
    assert distributed.stray_rank_variables({"MASTER_PORT": "1", "LOCAL_RANK": "0", "PATH": "/bin"}) == ["LOCAL_RANK", "MASTER_PORT"]
    assert distributed.stray_rank_variables({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}) == []
    assert distributed.stray_rank_variables({"RANK": "0", "WORLD_SIZE": "2", distributed.NPROC_MARKER: "1"}) == []
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # under torchrun the variables describe the ranks
    assert distributed.from_environment().world_size == 2


# ---------------------------------------------------------------- checkpoints and ONNX files from elsewhere


class LinearTask:
    def build_model(self, model_cfg, data):
        import torch

        return torch.nn.Linear(2, 2)


@pytest.mark.parametrize("state, expected", [
    ([1, 2, 3], "not a veritrain checkpoint"),  # a valid pickle, not a dict: used to be a TypeError
    ({"model": {"w": 1}, "loop": {"epochs_done": 1, "step": 3}}, "its weights do not fit the run's model"),
    ({"model": {}, "loop": {"epochs_done": 1, "step": 3}}, "its weights do not fit the run's model"),
])
def test_a_foreign_checkpoint_is_one_line_exit_1(tmp_path, state, expected):
    import torch

    from veritrain.results import evaluate
    from veritrain.train import checkpoint

    checkpoint.write(tmp_path, checkpoint.encode(state), ["best.pt"], keep_last=1)  # with a matching sidecar
    with pytest.raises(RunFailed) as refused:
        evaluate.load_model(SimpleNamespace(model=None), None, LinearTask(), tmp_path / "best.pt", torch.device("cpu"))
    message = str(refused.value)
    assert refused.value.exit_code == 1 and len(message.splitlines()) == 1 and expected in message, message


def write_export(folder: Path, nodes: list, initializers: list = (), domains: tuple = ()) -> Path:
    """An export folder from elsewhere: model.json (2 classes, 1×8×8 input) and an ONNX graph x -> y."""
    from onnx import TensorProto, helper

    folder.mkdir(parents=True)
    graph = helper.make_graph(nodes, "foreign", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)])
    data = model.SerializeToString()
    (folder / "model.onnx").write_bytes(data)
    (folder / "model.json").write_text(json.dumps({
        "classes": ["a", "b"], "input": {"shape": [None, 1, 8, 8]}, "preprocessing": {"mean": [0.5], "std": [0.25]},
        "files": {"onnx": {"file": "model.onnx", "sha256": hashlib.sha256(data).hexdigest()}}}), encoding="utf-8")
    return folder


def foreign_exports(root: Path) -> dict[str, Path]:
    from onnx import helper, numpy_helper

    def const(name: str, values: list[int]):
        return numpy_helper.from_array(np.array(values, dtype=np.int64), name)

    nan_scores = [helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("Sub", ["f", "f"], ["z"]),
                  helper.make_node("Div", ["z", "z"], ["n"]), helper.make_node("Slice", ["n", "starts", "ends", "axes"], ["y"])]  # 0/0
    return {
        "unknown_op": write_export(root / "unknown_op", [helper.make_node("Bar", ["x"], ["y"], domain="com.example")], domains=("com.example",)),
        "allocation": write_export(root / "allocation", [helper.make_node("ConstantOfShape", ["shape"], ["y"])], [const("shape", [1 << 40, 1 << 20])]),
        "wrong_shape": write_export(root / "wrong_shape", [helper.make_node("Identity", ["x"], ["y"])]),
        "nan": write_export(root / "nan", nan_scores, [const("starts", [0]), const("ends", [2]), const("axes", [1])]),
    }


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("exports")
    Image.new("L", (8, 8), 3).save(root / "image.png")
    return root, foreign_exports(root)


@pytest.mark.parametrize("which, expected", [
    ("unknown_op", "onnxruntime cannot run it ("),
    ("allocation", "Failed to allocate memory"),
    ("wrong_shape", "its output has shape [1, 1, 8, 8], not [1, 2]"),
])
def test_a_foreign_onnx_export_is_one_line_exit_1(exports, capsys, which, expected):
    root, folders = exports
    code, out, err = run_cli(capsys, "predict", str(folders[which]), str(root / "image.png"))
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {folders[which] / 'model.onnx'}: ") and expected in err and err.rstrip().endswith("re-export the run")


def test_predict_json_writes_nan_as_null_with_its_path(exports, capsys):
    root, folders = exports
    code, out, _ = run_cli(capsys, "predict", str(folders["nan"]), str(root / "image.png"), "--json")
    document = json.loads(out)  # bare NaN is not JSON; the standard parser would take it, so look at the text too
    assert code == 0 and "NaN" not in out
    assert document["results"][0]["top"][0]["prob"] is None and document["nonfinite"] == ["results[0].top[0].prob"]


def test_json_documents_never_hold_nan_or_infinity(capsys):
    from veritrain.core.display import finite_json

    payload, paths = finite_json({"a": [1.0, float("nan"), {"b": float("-inf")}], "c": np.float64("inf"), "d": "NaN", "e": 2})
    assert payload == {"a": [1.0, None, {"b": None}], "c": None, "d": "NaN", "e": 2} and paths == ["a[1]", "a[2].b", "c"]
    cli.emit_json({"loss": float("nan")})
    assert json.loads(capsys.readouterr().out) == {"loss": None, "nonfinite": ["loss"]}


def test_predict_refuses_a_fifo_or_a_folder_without_opening_it(exports, tmp_path):
    root, folders = exports
    fifo = tmp_path / "image.fifo"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    result = cli_run("predict", str(folders["nan"]), str(fifo), str(tmp_path), str(root / "image.png"), "--json", timeout=60)
    assert result.code == 1
    errors = {r["file"]: r["error"] for r in result.json()["results"]}
    assert errors == {str(fifo): "not a regular file (a FIFO); give image files", str(tmp_path): "not a regular file (a folder); give image files",
                      str(root / "image.png"): None}
    assert result.stderr.splitlines()[-1] == f"error: 2 of 3 file(s) could not be predicted: {fifo}, {tmp_path}"
    export = tmp_path / "export"
    shutil.copytree(folders["nan"], export)
    (export / "model.json").unlink()
    os.mkfifo(export / "model.json")
    result = cli_run("predict", str(export), str(root / "image.png"), timeout=60)
    assert result.code == 1 and result.stderr.splitlines() == [
        f"error: {export / 'model.json'}: not a regular file (a FIFO); an export's model.json is a plain file, re-export the run"]


# ---------------------------------------------------------------- records holding null


@pytest.fixture(scope="module")
def legacy_records(tmp_path_factory) -> list[Path]:
    """Every record.json of the runs in tests/fixtures/legacy (the archives' runs, unpacked)."""
    root = tmp_path_factory.mktemp("legacy")
    for archive in sorted(LEGACY.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            tar.extractall(root / archive.name.removesuffix(".tar.gz"), members=[m for m in tar.getmembers() if m.name.endswith("record.json")],
                           filter="data")
    return sorted(root.rglob("record.json"))


@pytest.mark.parametrize("field, value, expected", [
    ("started_at", None, "started_at: Input should be a valid string (found null)"),
    ("started_at", "yesterday", "started_at: not an ISO 8601 time"),
    ("metrics", None, "metrics: null where the writer always puts a value"),
    ("artifacts", None, "artifacts: null where the writer always puts a value"),
    ("argv", None, "argv: null where the writer always puts a value"),
])
def test_a_record_holding_null_where_a_value_is_needed_is_refused_and_not_imported(legacy_records, field, value, expected):
    from veritrain.trust import archive
    from veritrain.records.record import record_problem

    path = legacy_records[0]
    record = {**json.loads(path.read_text()), field: value}
    assert record_problem(record, path.parent.name).startswith(expected)
    with pytest.raises(RunFailed) as refused:
        archive._sealed_record_parts(json.dumps(record).encode(), path.parent.name)  # import's check of an archived record
    assert expected in str(refused.value) and len(str(refused.value).splitlines()) == 1
    for optional in ("ended_at", "hypothesis", "error", "final_state_sha256"):  # null has a meaning there
        assert record_problem({**json.loads(path.read_text()), optional: None}, path.parent.name) is None


def test_one_bad_record_leaves_experiments_md_and_the_list_to_the_others(legacy_records, tmp_path, caplog, capsys):
    from veritrain.records import experiments

    good = legacy_records[0].parent
    bad_id = good.name[:-6] + "0badba"
    shutil.copytree(good, tmp_path / "runs" / good.name)
    shutil.copytree(good, tmp_path / "runs" / bad_id)
    record = json.loads((tmp_path / "runs" / bad_id / "record.json").read_text())
    (tmp_path / "runs" / bad_id / "record.json").write_text(json.dumps({**record, "run_id": bad_id, "started_at": None}))
    with caplog.at_level(logging.WARNING, logger="veritrain"):
        out = experiments.write(tmp_path / ".veritrain", tmp_path / "runs", tmp_path / "experiments.md")
    text = out.read_text()
    assert f"## {good.name}" in text and bad_id not in text
    assert any(bad_id in r.getMessage() and "not listed: started_at" in r.getMessage() for r in caplog.records)
    pytest.importorskip("starlette")
    import warnings

    from veritrain.web.server import create_app
    from veritrain.records.workspace import Workspace

    with warnings.catch_warnings():  # Starlette's TestClient on httpx warns that httpx2 is its successor
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    client = TestClient(create_app(Workspace.open(tmp_path)), base_url="http://127.0.0.1:8765")
    page = client.get("/experiments")
    assert page.status_code == 200 and good.name in page.text and bad_id not in page.text  # was a 500 for the whole workspace


# ---------------------------------------------------------------- credentials in free text


@pytest.mark.parametrize("text", [
    '{"api_key": "X"}', 'notes "password": "X" here', 'secret:"A B"', "password: hunter two", "db_password=1234",
    "{'Access_Token': 'x y'}", "API-KEY = abc", "use Bearer hunter22 for the api",
])
def test_free_text_holding_a_credential_is_refused_by_the_config_rule(text):
    from veritrain.core.secrets import text_secret

    assert text_secret(text) is not None


@pytest.mark.parametrize("text", [
    "max_tokens 512", "the password field was removed", "max_tokens=512 key_dim: 8 secret_sauce: 3", "api_key=${env:MY_KEY}",
    '{"password": null, "secret": ""}', "the bearer of this letter, bearer tokens.", "lr 3e-3 converges twice as fast",
])
def test_honest_free_text_is_kept(text):
    from veritrain.core.secrets import text_secret

    assert text_secret(text) is None


def test_a_note_hypothesis_or_experiment_name_with_a_credential_is_exit_2_and_never_stored(tmp_path, capsys):
    code, out, err = run_cli(capsys, "runs", "note", "nosuchrun", '{"api_key": "sk-never-stored"}', "--workdir", str(tmp_path))
    assert code == 2 and err.splitlines() == ["error: TEXT holds a credential written out (its key names one); a note is kept as "
                                              "written (and shown in experiments.md): leave the secret out"]
    code, _, err = run_cli(capsys, "run", "--hypothesis", 'secret:"A B"', "--dry-run", "--workdir", str(tmp_path))
    assert code == 2 and err.splitlines() == ["error: --hypothesis (a credential written out (its key names one)): a run records its "
                                              "command line as given; leave the secret out (a config value can be ${env:NAME}, read when it is used)"]
    code, _, err = run_cli(capsys, "run", "--set", """exp_name='digits "password": "A B"'""", "--dry-run", "--workdir", str(tmp_path))
    assert code == 2 and err.splitlines() == ["error: --set: exp_name: holds a credential written out (its key names one), and a run "
                                              "records its config as written; write the secret as ${env:NAME} and export NAME before running"]
    assert "A B" not in err and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- secrets in error lines and tracebacks


def test_an_error_line_masks_a_bearer_token_it_quotes(tmp_path, capsys):
    code, _, err = run_cli(capsys, "config", "show", "--set", "Bearer abc.def-ghi", "--workdir", str(tmp_path))
    assert code == 2 and err.splitlines() == ["error: --set: Bearer ***: expected KEY.PATH=VALUE, e.g. --set train.epochs=5"]


def test_a_logged_exception_and_an_unexpected_traceback_are_redacted(capsys):
    from veritrain.core.secrets import RedactingFilter, redacting_excepthook

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(logging.Formatter().format(record))
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("veritrain.test_bad_inputs")
    logger.addHandler(handler)
    token = "hf_" + "Q7" * 17
    try:
        raise RuntimeError(f"request failed with Authorization: Bearer hunter2xyz and {token}")
    except RuntimeError:
        logger.exception("upload failed")
        redacting_excepthook(*sys.exc_info())
    logger.removeHandler(handler)
    shown = lines[0] + capsys.readouterr().err
    assert "Traceback" in lines[0] and "RuntimeError: request failed" in shown
    assert "hunter2xyz" not in shown and token not in shown and shown.count("***") >= 4


# ---------------------------------------------------------------- terminal escapes from records


def test_terminal_control_characters_from_records_are_escaped(legacy_records, tmp_path, capsys):
    from veritrain.core.display import terminal_safe

    assert terminal_safe("a\x1b[2Jb\u202ec\x07\x9b\n") == "a\\x1b[2Jb\\u202ec\\x07\\x9b\\n"
    assert terminal_safe("accuracy 0.93 — ünïcode") == "accuracy 0.93 — ünïcode"
    run = legacy_records[0].parent
    shutil.copytree(run, tmp_path / "runs" / run.name)
    record = json.loads((run / "record.json").read_text())
    record.update(exp_name="e\x1b[2J\x1b]0;title\x07", hypothesis="h \x1b[31mred [/] [bold]x")  # as an imported record may hold
    (tmp_path / "runs" / run.name / "record.json").write_text(json.dumps(record))
    for command in (["runs", "list"], ["runs", "show", run.name]):
        code, out, err = run_cli(capsys, *command, "--workdir", str(tmp_path))
        shown = out + err  # the tables' stream is the output contract's business, not this test's
        assert code == 0 and "\x1b" not in shown and "\x07" not in shown, command
        assert "e\\x1b[2J\\x1b]0;title\\x07" in shown, command
    assert "h \\x1b[31mred [/] [bold]x" in shown  # markup is shown as written, never read (`[/]` used to end the command)
    other = run.name[:-6] + "0e5c0e"
    shutil.copytree(tmp_path / "runs" / run.name, tmp_path / "runs" / other)
    record.update(run_id=other, config={**record["config"], "exp_name": "x\x1b[8m"})
    (tmp_path / "runs" / other / "record.json").write_text(json.dumps(record))
    code, out, err = run_cli(capsys, "runs", "compare", run.name, other, "--workdir", str(tmp_path))
    assert code == 0 and "\x1b" not in out + err and "config exp_name: " in out and "→ x\\x1b[8m" in out


# ---------------------------------------------------------------- publish and gc


def test_publish_refuses_an_out_inside_the_workspace(tmp_path):
    from veritrain.web.publish import refuse_out_in_workspace
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(tmp_path / "ws")
    run_dir = workspace.runs_dir / "20260101-000000-000-aaaaaa"
    run_dir.mkdir(parents=True)
    (tmp_path / "link").symlink_to(run_dir)
    for out in (run_dir / "site", tmp_path / "link" / "site", workspace.runs_dir, workspace.state_dir / "site", workspace.root):
        with pytest.raises(UserError) as refused:
            refuse_out_in_workspace(workspace, out)
        assert str(refused.value).startswith(f"--out {out}: ") and "publish to a folder outside them" in str(refused.value)
    refuse_out_in_workspace(workspace, tmp_path / "site")
    refuse_out_in_workspace(workspace, workspace.root / "site")


def test_gc_removes_the_scratch_of_killed_commands_only(tmp_path):
    from veritrain.orchestration import housekeeping
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(tmp_path)
    scratch = workspace.state_dir / "tmp"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now
    killed = [f"audit-{gone.pid}-k1", f"audit-eval-{gone.pid}-k2", f"code-{gone.pid}-k3"]
    live = [f"audit-{os.getpid()}-live", f"code-{gone.pid}-young", "notes-1-x"]
    for name in killed + live:
        (scratch / name).mkdir(parents=True)
        (scratch / name / "file").write_text("x")
        if not name.endswith("young"):
            past = time.time() - 2 * housekeeping.LEFTOVER_AGE
            os.utime(scratch / name, (past, past))
    dry = housekeeping.gc(workspace, dry_run=True)
    assert sorted(r.split(" ")[0] for r in dry["removed"]) == sorted(f".veritrain/tmp/{n}" for n in killed)
    housekeeping.gc(workspace, dry_run=False)
    assert sorted(p.name for p in scratch.iterdir()) == sorted(live)


def test_a_report_line_escapes_control_characters_of_names_it_shows(capsys):
    """verify's problem lines name files found in a run folder, which anyone may have named: a report line is
    printed with its control characters escaped, and its own line breaks kept."""
    from veritrain.core import logs

    logs.report("unlisted_file: eval/\x1b[2Jx.png\nsecond line")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "eval/\\x1b[2Jx.png\nsecond line" in out
