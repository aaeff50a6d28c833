"""Small surfaces a new user meets: each says what is true, in one line, and never in a form that misleads."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT


def test_the_checklist_labels_each_row_on_one_line(cli, small_run):
    shown = cli("check", small_run.run_dir.name, "--workdir", str(small_run.workdir))
    assert "data: validated and versioned (data_versioned)" in shown.stdout, shown.stdout
    assert "\\n" not in shown.stdout


def test_runs_compare_says_the_direction_its_arrows_go(cli, small_run):
    first = small_run.run_dir.name
    other = cli("train", "--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "model.hidden=[16]",
                "--workdir", str(small_run.workdir), "--json").json()["run_id"]
    shown = cli("runs", "compare", first, other, "--workdir", str(small_run.workdir)).stdout
    assert f"{first} → {other} (changes from the first run to this one):" in shown, shown
    assert "config model.hidden: [32] → [16]" in shown, shown


def test_latest_says_why_a_scripts_run_cannot_be_replayed(tmp_path, monkeypatch):
    from veritrain.core.errors import UserError
    from veritrain.records import workspace as workspace_module
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(tmp_path)
    run_id = "20260101-000000-000-abcdef"
    (workspace.runs_dir / run_id).mkdir(parents=True)
    (workspace.runs_dir / run_id / "record.json").write_text("{}")  # read through the stand-in below
    script_run = {"run_id": run_id, "kind": "script", "trajectory": [{"step": 0}],
                  "guarantee": {"level": "logged", "reasons": ["no inputs were bound (run.inputs)"]}}
    monkeypatch.setattr(workspace_module, "read_record", lambda run_dir: script_run)
    with pytest.raises(UserError) as refused:
        workspace.resolve_run("latest", "model")
    assert f"the newest script's run, {run_id}, is logged (no inputs were bound (run.inputs)), so it cannot be replayed" in str(refused.value)


def test_the_provenance_check_keeps_the_public_key_outside_the_run_folder():
    text = (ROOT / "docs" / "provenance.md").read_text(encoding="utf-8")
    commands = text.split("<!-- provenance-commands -->", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    assert "../../signing-key.pub.pem" in commands and "> ../../subjects.sha256" in commands
    assert Path("signing-key.pub.pem").name not in commands.replace("../../signing-key.pub.pem", "")


def test_a_fifo_in_a_run_hangs_no_page_and_fails_verify(cli, small_run_copy):
    import os
    import threading
    import warnings

    pytest.importorskip("starlette")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    from veritrain.records.workspace import Workspace
    from veritrain.web.server import create_app

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    (run_dir / "metrics.jsonl").unlink()
    os.mkfifo(run_dir / "metrics.jsonl")  # nothing ever writes to it: a blocking read would wait forever
    os.mkfifo(run_dir / "notes.jsonl")
    client = TestClient(create_app(Workspace.open(workdir)), base_url="http://127.0.0.1:8765")
    answers: dict[str, int] = {}

    def visit() -> None:
        for url in (f"/api/runs/{run_dir.name}/live?metrics=0&steps=0", f"/runs/{run_dir.name}", "/", "/api/runs"):
            answers[url] = client.get(url).status_code

    visitor = threading.Thread(target=visit, daemon=True)
    visitor.start()
    visitor.join(timeout=60)
    assert not visitor.is_alive() and len(answers) == 4 and set(answers.values()) == {200}, answers
    verified = cli("verify", run_dir.name, "--workdir", str(workdir), "--json").json()
    assert {"path": "metrics.jsonl", "kind": "special", "detail": "a run directory holds only regular files; remove it"} in verified["problems"]


def test_data_order_is_clamped_to_the_steps_the_run_trained(cli, small_run):
    run, workdir = small_run.run_dir.name, str(small_run.workdir)
    trained = small_run.record["training"]["steps"]
    shown = cli("data", "order", run, "--steps", f"{trained - 2}:100000000", "--workdir", workdir, "--json")
    assert shown.code == 0 and [s["step"] for s in shown.json()["steps"]] == [trained - 2, trained - 1]
    assert f"were never trained (the run has {trained})" in shown.stderr
    past = cli("data", "order", run, "--steps", f"{trained}:{trained + 5}", "--workdir", workdir)
    assert past.code == 2 and past.stderr.strip().splitlines()[-1] == (f"error: --steps {trained}:{trained + 5}: the run trained {trained} optimizer steps "
                                                      f"(0 … {trained - 1}); give A below {trained}")


def test_an_out_that_is_not_a_regular_file_is_one_line_exit_2(cli, small_run, tmp_path):
    import os

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    for target in (fifo, tmp_path):
        refused = cli("audit", small_run.run_dir.name, "--out", str(target), "--workdir", str(small_run.workdir))
        assert refused.code == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert refused.stderr.startswith("error: ") and "--out" in refused.stderr and "Traceback" not in refused.stderr
    fifo_said = cli("audit", small_run.run_dir.name, "--out", str(fifo), "--workdir", str(small_run.workdir)).stderr
    assert fifo_said.strip() == f"error: --out {fifo}: not a regular file (a FIFO, socket or device); give a file"


def test_a_relative_checkpoint_path_is_read_from_the_current_folder(cli, small_run_copy):
    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    step = sorted((run_dir / "checkpoints").glob("step-*.pt"))[0]
    relative = step.relative_to(workdir).as_posix()  # runs/RUN/checkpoints/step-N.pt, as tab completion gives it
    done = cli("eval", run_dir.name, "--checkpoint", relative, "--split", "val", "--workdir", str(workdir), "--json", cwd=workdir)
    assert done.code == 0, done.stderr
    assert done.json()["checkpoint"] == f"checkpoints/{step.name}"
    inside = cli("eval", run_dir.name, "--checkpoint", f"checkpoints/{step.name}", "--split", "val", "--workdir", str(workdir), cwd=workdir)
    assert inside.code == 0, inside.stderr  # relative to the run, as before


def test_check_reads_a_checkpoint_folder_as_a_folder(tmp_path):
    from veritrain.trust.check import _has_optimizer

    artifacts = {"checkpoints/checkpoint-20/model.safetensors": {}, "checkpoints/checkpoint-20/optimizer.pt": {},
                 "checkpoints/checkpoint-40/model.safetensors": {}}
    assert _has_optimizer(tmp_path, artifacts, ["checkpoints/checkpoint-20"])
    assert not _has_optimizer(tmp_path, artifacts, ["checkpoints/checkpoint-40"])


def test_a_baseline_that_did_not_converge_is_said_where_it_is_compared():
    from veritrain.core.baselines import judge

    baselines = {"judged_by": {"metric": "accuracy", "goal": "max", "baseline": "logistic_regression"}, "margin": 0.01,
                 "results": {"logistic_regression": {"accuracy": 0.9, "converged": False}}}
    judged = judge({"accuracy": 0.95}, baselines)
    assert judged.status == "beats" and "did not converge (raise eval.baseline_max_iter)" in judged.detail
    baselines["results"]["logistic_regression"]["converged"] = True
    assert "converge" not in judge({"accuracy": 0.95}, baselines).detail


def test_compare_leaves_out_the_built_in_model_settings_of_a_users_model():
    """A user's model (`model.target`) does not use the built-in models' settings: they never tell it apart, in a
    comparison as in the runs table's parameter columns (one rule: registry.changed_params)."""
    from veritrain.records.experiments import compare
    from veritrain.records.registry import changed_params, default_leaves

    widths = default_leaves()["model.widths"]
    built_in = {"run_id": "a", "config": {"model": {"name": "cnn", "widths": widths, "target": None}, "seed": 0}}
    own = {"run_id": "b", "config": {"model": {"name": "cnn", "widths": [256], "target": "net:make"}, "seed": 0}}
    assert compare([built_in, own])["config"] == [{"key": "model.target", "values": [None, "net:make"]}]
    assert changed_params(own["config"]) == {"model.target": "net:make"} | ({} if default_leaves()["seed"] == 0 else {"seed": 0})
    assert compare([own, {**own, "run_id": "c", "config": {"model": {"name": "mlp", "widths": [8], "target": "net:make"}}}])["config"] == []
    mlp = {"run_id": "d", "config": {"model": {"name": "mlp", "widths": [32], "target": None}, "seed": 0}}
    other_mlp = {"run_id": "e", "config": {"model": {"name": "mlp", "widths": [64], "target": None}, "seed": 0}}
    rows = {row["key"]: row["values"] for row in compare([mlp, own, other_mlp])["config"]}  # compared among the runs using them
    assert rows == {"model.widths": [[32], None, [64]], "model.target": [None, "net:make", None]}  # None: not used


CREDENTIAL_KEYS = ["password ", "api-key", "clientSecret", "private_key", "credentials", "wandb_key", "Api.Key", "DB_PASSWORD"]
ORDINARY_KEYS = ["label_key", "sort_key", "primary_key_column", "max_tokens", "key_dim", "eos_token", "tokenizer", "num_tokens"]


def test_credential_keys_are_read_in_any_spelling_and_ordinary_names_are_not():
    from veritrain.core.secrets import config_secret, is_credential_key, secret_in_command_line

    assert [k for k in CREDENTIAL_KEYS if not is_credential_key(k)] == []
    assert [k for k in ORDINARY_KEYS if is_credential_key(k)] == []
    assert config_secret({"credentials": ["user", "pw"]}) == (["credentials"], "a credential written out (its key names one)")
    assert config_secret({"credentials": ["${env:PW}"]}) is None
    assert config_secret({"note": "--password=hunter2"}) == (["note"], "a credential written out (its key names one)")
    assert secret_in_command_line(["train.py", "--api-key=xyzzysecretvalue123"]) == "--api-key (a credential written out: the flag names one)"
    assert secret_in_command_line(["train.py", "--password", "hunter2"]) == "--password (a credential written out: the flag names one)"
    assert secret_in_command_line(["train.py", "--api-key=${env:KEY}", "--label-key", "y", "--max-tokens=64"]) is None


def test_a_config_key_spelled_as_a_credential_is_refused_in_one_line(cli, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  name: mlp\n  kwargs:\n    clientSecret: abc\n")
    refused = cli("train", str(config), "--workdir", str(tmp_path))
    assert refused.code == 2 and refused.stderr.strip() == (
        f"error: {config}: model.kwargs.clientSecret: holds a credential written out (its key names one), and a run records its "
        "config as written; write the secret as ${env:NAME} and export NAME before running")


def test_a_secret_logged_by_a_script_is_written_as_stars_with_one_warning(tmp_path):
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "leak.py"
    script.write_text(
        "import os\nimport veritrain as vt\n"
        "with vt.start(config={'lr': 0.1}) as run:\n"
        "    for step in range(3):\n"
        "        run.log(step, loss=1.0 / (step + 1), note=os.environ['LEAKME'], api_key='abc')\n"
        "    run.finish()\n")
    token = "ghp_" + "A1b2C3d4E5" * 4  # a GitHub token's shape
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LEAKME": token, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["note"], r["api_key"], r["redacted"]) for r in rows] == [("***", "***", ["note", "api_key"])] * 3
    assert token not in (run_dir / "metrics.jsonl").read_text() and token not in done.stderr
    warned = [line for line in done.stderr.splitlines() if "holds a secret" in line]
    assert len(warned) == 2 and "run.log: api_key" in warned[0] + warned[1], done.stderr


def test_test_is_evaluated_once_on_the_selected_model(cli, small_run_copy):
    from veritrain.records import recorder
    from veritrain.records.record import read_record, thawed
    from veritrain.records.workspace import Workspace
    from veritrain.trust.check import check_run

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    entries = small_run_copy.record["trajectory"]
    other = f"checkpoints/step-{entries[1]['step']}.pt"  # an epoch validation did not select (the best is the last)
    assert small_run_copy.record["training"]["best_epoch"] == 2
    before = read_record(run_dir).seal
    child = cli("eval", run_dir.name, "--checkpoint", other, "--split", "test", "--workdir", str(workdir))
    assert child.code == 0, child.stderr
    assert "(kind eval, parent" in child.stdout and "not the selected model" in child.stdout
    assert read_record(run_dir).seal == before  # the run's final report is untouched
    (made,) = [p for p in (workdir / "runs").iterdir() if p.name != run_dir.name]
    rows = {i["id"]: i for i in check_run(made, workdir / ".veritrain")["items"]}
    assert rows["results_from_trajectory"]["status"] == "fail" and "not the selected model" in rows["results_from_trajectory"]["detail"]
    assert cli("eval", run_dir.name, "--checkpoint", other, "--split", "val", "--workdir", str(workdir)).code == 0  # val: any entry
    assert read_record(run_dir).seal != before

    # a test report from another entry, written into the run (a forger's amendment, or an earlier veritrain)
    record = read_record(run_dir)
    with recorder.amending(Workspace.open(workdir), record) as change:
        test = thawed(record["metrics"]["test"])
        change.set_metrics("test", {**test, "checkpoint": other, "trajectory_entry": {**test["trajectory_entry"], "index": 1,
                                                                                        "step": entries[1]["step"], "state_sha256": entries[1]["state_sha256"]}})
        change.add_event("eval", f"{other} on test: accuracy 0.9")
        change.commit(by="eval")
    rows = {i["id"]: i for i in check_run(run_dir, workdir / ".veritrain")["items"]}
    selection = rows["selection_on_validation"]
    assert selection["status"] == "fail" and "metrics.test come from trajectory entry 1" in selection["detail"], selection
    assert f"test evaluated on {other}" in selection["detail"]


def test_weights_anywhere_in_a_run_are_bound_or_named(small_run_copy):
    import shutil

    from veritrain.records.record import read_record, thawed, write_record
    from veritrain.trust.verify import verify_run

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    other = run_dir / "checkpoints" / "step-23.pt"
    for planted in ("checkpoints/best.pth", "checkpoints/final.PT", "model/deploy.pt", "export/extra.safetensors"):
        (run_dir / planted).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(other, run_dir / planted)
    write_record(run_dir, thawed(read_record(run_dir)))  # the forger seals them in
    found = verify_run(run_dir, workdir / ".veritrain", rehash_data=False)
    unbound = sorted(p["path"] for p in found["problems"] if p["kind"] == "unbound_weights")
    assert not found["ok"] and unbound == ["checkpoints/best.pth", "checkpoints/final.PT", "export/extra.safetensors", "model/deploy.pt"]


def test_predict_warns_for_an_image_unlike_the_training_data(cli, small_run, tmp_path):
    from PIL import Image

    photo, digit = tmp_path / "photo.png", tmp_path / "digit.png"
    Image.new("RGB", (64, 64), (200, 120, 40)).save(photo)
    Image.new("L", (8, 8), 3).save(digit)
    done = cli("predict", small_run.run_dir.name, str(photo), str(digit), "--workdir", str(small_run.workdir))
    assert done.code == 0 and done.stdout.count(": ") == 2, done.stdout + done.stderr
    warned = [line for line in done.stderr.splitlines() if "its prediction is a guess" in line]
    assert len(warned) == 1 and f"{photo}: a 64×64 RGB image; the model was trained on 8×8 L images" in warned[0], done.stderr


def test_a_reproduction_counts_epochs_not_rows():
    from veritrain.trust.verify import _rows_shown

    lightning = [{"epoch": 0, "train_loss": 1.0}, {"epoch": 0, "val_loss": 1.1}, {"epoch": 1, "train_loss": 0.9}, {"epoch": 1, "val_loss": 1.0},
                 {"epoch": 2, "train_loss": 0.8}, {"epoch": 2, "val_loss": 0.9}]
    assert _rows_shown(lightning) == "6 rows over 3 epochs"
    assert _rows_shown([{"epoch": 1}, {"epoch": 2}]) == "2 epochs" and _rows_shown([{"step": 1}]) == "1 rows"


def test_prepare_says_when_samples_of_an_earlier_test_split_moved_to_train(tmp_path):
    import csv
    import json

    from veritrain.core.hashing import DATA_HASH_ALGORITHM
    from veritrain.data.prepare import _moved_out_of_test

    store = tmp_path / "data"
    previous = store / ("a" * 64)
    previous.mkdir(parents=True)
    (previous / "version.json").write_text(json.dumps({"preprocessing": {"data": {"source": "imagefolder", "root": "images"}}}))
    with open(previous / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sample_id", DATA_HASH_ALGORITHM, "split"])
        writer.writerows([["cat/1.png", "h1", "test"], ["cat/2.png", "h2", "test"], ["dog/1.png", "h3", "train"]])
    preprocessing = {"data": {"source": "imagefolder", "root": "images"}}
    now = [("cat/1.png", "h1", "cat", "train"), ("cat/2.png", "h2", "cat", "test"), ("dog/1.png", "h3", "dog", "train"),
           ("cat/1-shifted.png", "h9", "cat", "test")]
    said = _moved_out_of_test(store, "b" * 64, preprocessing, now)
    assert said is not None and said.startswith(f"1 sample(s) that data version {'a' * 12} of this data config had in test are in train or val now")
    assert "(first: cat/1.png;" in said and said.endswith(f"set data.test_from: {'a' * 12}")
    assert _moved_out_of_test(store, "b" * 64, {"data": {"source": "csv"}}, now) is None  # another data config


@pytest.mark.parametrize("text", ['clientSecret: "s3cr3t-value"', "--api-key=xyzzysecretvalue123", 'the wandb_key=abcdef123456 we used',
                                  '{"password ": "hunter2"}', "'Api Key': 'zzz-123'", "private_key = xyzzy", "credentials: [a, b]"])
def test_notes_and_hypotheses_refuse_credentials_in_any_spelling(text):
    from veritrain.core.secrets import text_secret

    assert text_secret(text) == "a credential written out (its key names one)"
    for ordinary in ("sorted by label_key: 3 groups", "max_tokens: 512", "eos_token: <|end|>", "token=plain makes no difference"):
        assert text_secret(ordinary) is None, ordinary
