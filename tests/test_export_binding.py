"""What predict and generate load from an export: a run's export only as its sealed record binds it (model.json must
name exactly the record's export files, and each file loaded must hash to the record's SHA-256), an export folder on
its own by its signature (model.sig: the signer named, a warning when unsigned or signed by a key not known here,
exit 1 when it does not verify). One small trained run serves the whole module."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from veritrain.core import signing_keys
from veritrain.core.errors import RunFailed
from veritrain.results import export, export_signing


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reseal(run_dir: Path, *changed: str) -> None:
    """What a forger with write access does after changing files of a run: list each changed file (path in the run)
    in record.json's artifacts with its hash and size as it is now, and seal record.json again."""
    record = json.loads((run_dir / "record.json").read_text())
    for rel in changed:
        path = run_dir / rel
        record["artifacts"][rel] = {"sha256": sha256(path), "size": path.stat().st_size}
    data = json.dumps(record, indent=2).encode()
    (run_dir / "record.json").write_bytes(data)
    (run_dir / "record.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def evil_onnx(source: Path, target: Path) -> None:
    """A copy of the exported ONNX model whose output bias favours class 0 by far: another model, same inputs."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    bias = model.graph.initializer[-1]
    values = numpy_helper.to_array(bias).copy()
    values[0] += 100.0
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(target))


def redirect(run_dir: Path) -> Path:
    """The attack: a second ONNX file beside the exported one, model.json pointed at it, the record sealed again over
    both, so every file of the run matches its record and the seal holds. Returns the planted file."""
    folder = run_dir / "export"
    evil_onnx(folder / "model.onnx", folder / "evil.onnx")
    description = json.loads((folder / "model.json").read_text())
    description["files"]["onnx"] = {"file": "evil.onnx", "sha256": sha256(folder / "evil.onnx")}
    (folder / "model.json").write_text(json.dumps(description, indent=2))
    reseal(run_dir, "export/evil.onnx", "export/model.json")
    return folder / "evil.onnx"


def one_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("images") / "digit.png"
    Image.new("L", (8, 8), 40).save(path)
    return path


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """The local key pair in a config folder of this test's own, and a second pair nobody here knows."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    local = signing_keys.init(signing_keys.default_key_path())
    stranger = signing_keys.init(tmp_path / "stranger" / "signing-key.pem")
    return signing_keys.default_key_path(), local, tmp_path / "stranger" / "signing-key.pem", stranger


def bare_copy(small_run, tmp_path: Path) -> Path:
    """The run's export folder copied out of the run, as someone who downloaded it has it."""
    folder = tmp_path / "downloaded" / "export"
    shutil.copytree(small_run.run_dir / "export", folder)
    return folder


# ---------------------------------------------------------------- a run's export, bound by its record


def test_an_honest_run_predicts_quietly_by_id_folder_and_export_folder(small_run, image, cli):
    run_dir = small_run.run_dir
    for ref in (run_dir.name, str(run_dir), str(run_dir / "export")):
        done = cli("predict", ref, str(image), "--workdir", str(small_run.workdir), "--json")
        assert done.code == 0 and done.json()["results"][0]["ok"], (ref, done.stderr)
        assert "warning" not in done.stderr and "signed" not in done.stderr, done.stderr
    opened = export.open_export(run_dir)
    assert opened.run_dir == run_dir and opened.model_files["onnx"] == run_dir / "export" / "model.onnx"
    assert set(opened.sha256) >= {"model.json", "model.onnx"} and opened.signer is None


def test_public_key_on_a_run_requires_its_export_signed_by_that_key(small_run, image, tmp_path, keys, cli):
    _, local, _, _ = keys
    done = cli("predict", small_run.run_dir.name, str(image), "--public-key", str(local.path), "--workdir", str(small_run.workdir))
    line = one_error(done)  # the shared run is sealed unsigned
    assert line.startswith(f"error: {small_run.run_dir / 'export'}: unsigned (no model.sig), but --public-key asks"), line
    (tmp_path / "not-a-key.pem").write_text("hello\n")
    refused = cli("predict", small_run.run_dir.name, str(image), "--public-key", str(tmp_path / "not-a-key.pem"), "--workdir", str(small_run.workdir))
    assert refused.code == 2 and refused.stderr.strip() == f"error: --public-key: {tmp_path / 'not-a-key.pem'}: not a PEM public key; give the .pub.pem that `veritrain keys show` prints"


def test_a_second_onnx_named_by_model_json_is_refused_though_the_record_was_sealed_again(small_run_copy, image, cli):
    run_dir = small_run_copy.run_dir
    planted = redirect(run_dir)
    assert sha256(run_dir / "record.json") == (run_dir / "record.sha256").read_text().strip()  # the seal holds
    for ref in (run_dir.name, str(run_dir), str(run_dir / "export")):
        line = one_error(cli("predict", ref, str(image), "--workdir", str(small_run_copy.workdir)))
        assert line.startswith(f"error: {planted}: model.json names it as the onnx model"), line
        assert "the run's record exports model.onnx" in line and f"`veritrain export {run_dir.name}`" in line
    # generate opens the export through the same check, before it looks at the task
    line = one_error(cli("generate", run_dir.name, "some text", "--workdir", str(small_run_copy.workdir)))
    assert line.startswith(f"error: {planted}: model.json names it as the onnx model"), line
    with pytest.raises(RunFailed, match="evil.onnx: model.json names it"):
        export.predict(run_dir / "export", [str(image)])


def test_model_json_changed_without_a_new_seal_and_a_swapped_model_file_are_refused(small_run_copy, image, cli):
    run_dir, at = small_run_copy.run_dir, ["--workdir", str(small_run_copy.workdir)]
    folder = run_dir / "export"
    original = folder / "model.onnx"
    kept = original.read_bytes()
    evil_onnx(original, original)  # the model file itself replaced, nothing else
    line = one_error(cli("predict", run_dir.name, str(image), *at))
    assert line.startswith(f"error: {original}: the model hashes to {sha256(original)[:12]}, but the run's record lists"), line
    description = json.loads((folder / "model.json").read_text())
    description["files"]["onnx"]["sha256"] = sha256(original)  # model.json made to agree, the run not sealed again
    (folder / "model.json").write_text(json.dumps(description))
    line = one_error(cli("predict", run_dir.name, str(image), *at))
    assert line.startswith(f"error: {folder / 'model.json'}: hashes to ") and "but the run's record lists" in line, line
    reseal(run_dir, "export/model.onnx", "export/model.json")  # and sealed again: the record's export section still names the old file
    line = one_error(cli("predict", run_dir.name, str(image), *at))
    assert line.startswith(f"error: {original}: model.json names it as the onnx model") and hashlib.sha256(kept).hexdigest()[:12] in line, line


def test_the_shared_check_binds_the_tokenizer_a_language_model_export_names(tmp_path):
    """generate's tokenizer: it must be listed by the record and be the one the run trained with."""
    run_dir = tmp_path / "run"
    folder = run_dir / "export"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"onnx bytes")
    (folder / "tokenizer.json").write_bytes(b'{"type": "byte"}')
    (folder / "evil-tokenizer.json").write_bytes(b'{"type": "bpe"}')
    onnx_entry = {"file": "model.onnx", "sha256": sha256(folder / "model.onnx")}
    trained = sha256(folder / "tokenizer.json")

    def record_for(tokenizer: str) -> dict:
        description = {"task": "lm", "files": {"onnx": onnx_entry}, "preprocessing": {"tokenizer": {"file": tokenizer, "sha256": sha256(folder / tokenizer)}}}
        (folder / "model.json").write_text(json.dumps(description))
        files = ["model.json", "model.onnx", "tokenizer.json", "evil-tokenizer.json"]
        return {"export": {"files": {"onnx": onnx_entry}}, "data": {"tokenizer": {"sha256": trained}},
                "artifacts": {f"export/{name}": {"sha256": sha256(folder / name)} for name in files}}

    opened = export.export_files_of_run(run_dir, record_for("tokenizer.json"))
    assert dict(opened.sha256) == {"model.json": sha256(folder / "model.json"), "model.onnx": onnx_entry["sha256"], "tokenizer.json": trained}
    assert opened.read("tokenizer.json") == b'{"type": "byte"}'
    with pytest.raises(RunFailed, match=r"evil-tokenizer.json: model.json names it as the tokenizer .* but the run trained with tokenizer"):
        export.export_files_of_run(run_dir, record_for("evil-tokenizer.json"))
    (folder / "tokenizer.json").write_bytes(b'{"type": "changed"}')  # after the check: the bytes read are hashed again
    with pytest.raises(RunFailed, match="the tokenizer hashes to .* but the run's record lists"):
        opened.read("tokenizer.json", "tokenizer")


# ---------------------------------------------------------------- an export folder on its own, judged by its signature


def test_an_unsigned_folder_is_a_warning_and_still_predicts(small_run, image, tmp_path, cli):
    folder = bare_copy(small_run, tmp_path)
    done = cli("predict", str(folder), str(image), "--json")
    assert done.code == 0 and done.json()["results"][0]["ok"], done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [line for line in done.stderr.splitlines() if line.strip()] and len(warnings) == 1, done.stderr
    assert warnings[0].startswith(f"warning: {folder}: unsigned: "), warnings


def test_a_folder_signed_by_a_known_key_names_its_signer(small_run, image, tmp_path, keys, cli):
    private, local, _, _ = keys
    folder = bare_copy(small_run, tmp_path)
    export_signing.sign(folder, private)
    done = cli("predict", str(folder), str(image))
    assert done.code == 0, done.stderr
    assert done.stderr.splitlines() == [f"{folder}: signed by the local key pair, key {local.fingerprint[:16]}; its files are as signed"]
    (signing_keys.default_key_path().parent / "trusted-keys").write_text(f"# who signs our models\nalice\n{local.pem}")
    done = cli("predict", str(folder), str(image), "--public-key", str(local.path))
    assert done.code == 0 and done.stderr.splitlines() == [f"{folder}: signed by alice, key {local.fingerprint[:16]}; its files are as signed"], done.stderr


def test_a_changed_file_of_a_signed_folder_is_exit_1(small_run, image, tmp_path, keys, cli):
    private = keys[0]
    folder = bare_copy(small_run, tmp_path)
    export_signing.sign(folder, private)
    evil_onnx(folder / "model.onnx", folder / "model.onnx")
    description = json.loads((folder / "model.json").read_text())
    description["files"]["onnx"]["sha256"] = sha256(folder / "model.onnx")  # model.json made to agree: the signature does not
    (folder / "model.json").write_text(json.dumps(description))
    line = one_error(cli("predict", str(folder), str(image)))
    assert line.startswith(f"error: {folder / 'model.sig'}: the folder is not as signed: changed model.json, model.onnx"), line


def test_a_stranger_signature_is_a_warning_until_the_files_change_and_public_key_requires_its_key(small_run, image, tmp_path, keys, cli):
    _, local, stranger_private, stranger = keys
    folder = bare_copy(small_run, tmp_path)
    export_signing.sign(folder, stranger_private)
    done = cli("predict", str(folder), str(image))
    assert done.code == 0, done.stderr
    assert done.stderr.splitlines()[0].startswith(f"warning: {folder}: signed by a key not known here: its files are as signed"), done.stderr
    line = one_error(cli("predict", str(folder), str(image), "--public-key", str(local.path)))
    assert line == f"error: {folder / 'model.sig'}: signed with another key than the one given with --public-key; get the export again from its maker"
    done = cli("predict", str(folder), str(image), "--public-key", str(stranger.path))
    assert done.code == 0 and done.stderr.startswith(f"{folder}: signed by the key given with --public-key, key {stranger.fingerprint[:16]}"), done.stderr
    (folder / "README.md").write_text("another card\n")
    line = one_error(cli("predict", str(folder), str(image)))
    assert line.startswith(f"error: {folder / 'model.sig'}: the folder is not as signed: changed README.md"), line
    (folder / "model.sig").unlink()
    line = one_error(cli("predict", str(folder), str(image), "--public-key", str(stranger.path)))
    assert line.startswith(f"error: {folder}: unsigned (no model.sig), but --public-key asks for a signature"), line


def test_model_json_names_only_files_of_the_folder(small_run, image, tmp_path, cli):
    folder = bare_copy(small_run, tmp_path)
    description = json.loads((folder / "model.json").read_text())
    (folder / description["non_model_files"][0]).unlink()  # the card it names
    line = one_error(cli("predict", str(folder), str(image)))
    assert line.startswith(f"error: {folder / description['non_model_files'][0]}: missing; model.json names it (non_model_files.0)"), line
    shutil.rmtree(folder)
    folder = bare_copy(small_run, tmp_path)
    description["files"]["onnx"]["file"] = "../outside.onnx"
    (folder / "model.json").write_text(json.dumps(description))
    line = one_error(cli("generate", str(folder), "text"))
    assert line.startswith(f"error: {folder / 'model.json'}: files.onnx.file: '../outside.onnx' is not a file of this folder"), line
