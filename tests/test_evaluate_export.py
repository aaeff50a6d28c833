"""Evaluation, baselines, export with parity, predict and seed repeats."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from veritrain.data.identity import load_version
from veritrain.records.record import read_record

from conftest import in_process_run

# seed 2: on the digits split of data recipe 4 val accuracy peaks at epoch 2 of 3, so best.pt and last.pt differ
FAST = ["train.epochs=3", "model.name=mlp", "model.hidden=[64]", "seed=2"]
REBUILD_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "rebuild_from_export.py"
# `python -I -c WITHOUT_VERITRAIN script args...`: runs the script where importing veritrain fails, then
# checks none of it was loaded (veritrain is installed in this environment, so it is blocked, not absent)
WITHOUT_VERITRAIN = """
import runpy, sys
sys.modules["veritrain"] = None  # `import veritrain` and `import veritrain.x` now raise ImportError
try:
    import veritrain
except ImportError:
    pass
else:
    sys.exit("veritrain is importable")
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as done:
    if done.code:
        raise
loaded = [name for name, module in sys.modules.items() if name.split(".")[0] == "veritrain" and module is not None]
sys.exit(f"veritrain modules were loaded: {loaded}" if loaded else 0)
"""


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ws")
    outcome = in_process_run(workdir, FAST)
    assert outcome.error is None, outcome.summary
    return workdir, Path(outcome.summary["run_dir"]), outcome.record


def read_predictions(path: Path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    classes = [k[2:] for k in rows[0] if k.startswith("p_")]
    probabilities = np.array([[float(r[f"p_{c}"]) for c in classes] for r in rows])
    labels = np.array([classes.index(r["label"]) for r in rows])
    return rows, classes, probabilities, labels


def reference_ece(probabilities: np.ndarray, labels: np.ndarray, bins: int = 15) -> float:
    """A plain loop over the 15 equal-width bins (0, 1/15], (1/15, 2/15], ... as in Guo et al. 2017."""
    confidence = probabilities.max(1)
    correct = (probabilities.argmax(1) == labels).astype(float)
    total = 0.0
    for b in range(bins):
        low, high = b / bins, (b + 1) / bins
        members = (confidence > low) & (confidence <= high) if b else (confidence >= 0) & (confidence <= high)
        if members.sum():
            total += members.sum() / len(labels) * abs(correct[members].mean() - confidence[members].mean())
    return total


def test_metrics_equal_scikit_learn_from_predictions_csv(full_run):
    from sklearn import metrics as sk

    _, run_dir, _ = full_run
    out = run_dir / "eval" / "test"
    metrics = json.loads((out / "metrics.json").read_text())
    rows, classes, probabilities, labels = read_predictions(out / "predictions.csv")
    predicted = probabilities.argmax(1)
    k = list(range(len(classes)))
    assert [r["prediction"] for r in rows] == [classes[i] for i in predicted]
    assert metrics["accuracy"] == sk.accuracy_score(labels, predicted)
    assert metrics["top5_accuracy"] == sk.top_k_accuracy_score(labels, probabilities, k=5, labels=k)
    # averages and log loss are exactly rounded sums (independent of threads and order): scikit-learn's within rounding
    for average in ("macro", "weighted"):
        assert metrics[f"precision_{average}"] == pytest.approx(sk.precision_score(labels, predicted, labels=k, average=average, zero_division=0), abs=1e-12)
        assert metrics[f"recall_{average}"] == pytest.approx(sk.recall_score(labels, predicted, labels=k, average=average, zero_division=0), abs=1e-12)
        assert metrics["macro_f1" if average == "macro" else "f1_weighted"] == pytest.approx(sk.f1_score(labels, predicted, labels=k, average=average, zero_division=0), abs=1e-12)
    assert metrics["log_loss"] == pytest.approx(sk.log_loss(labels, probabilities, labels=k), abs=1e-12)
    assert metrics["ece"] == pytest.approx(reference_ece(probabilities, labels), abs=1e-12)
    per_class = sk.precision_recall_fscore_support(labels, predicted, labels=k, zero_division=0)
    for i, name in enumerate(classes):
        assert metrics["per_class"][name] == {"precision": per_class[0][i], "recall": per_class[1][i], "f1": per_class[2][i], "support": int(per_class[3][i])}


def test_eval_from_predictions_file_recomputes_every_metric(cli, full_run):
    _, run_dir, _ = full_run
    out = run_dir / "eval" / "test"
    result = cli("eval", "--predictions", str(out / "predictions.csv"), "--json")
    assert result.code == 0, result.stderr
    recomputed = result.json()
    stored = json.loads((out / "metrics.json").read_text())
    for key in ("accuracy", "top5_accuracy", "macro_f1", "f1_weighted", "precision_macro", "recall_weighted", "log_loss", "ece", "per_class"):
        assert recomputed[key] == stored[key], key


def test_eval_files_and_plots(full_run):
    _, run_dir, record = full_run
    out = run_dir / "eval" / "test"
    for name in ("metrics.json", "predictions.csv", "per_class.csv", "bad_cases.csv", "report.md"):
        assert (out / name).is_file(), name
    for name in ("confusion_matrix.png", "confusion_matrix_normalized.png", "bad_cases.png", "curves.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    from PIL import Image

    with Image.open(out / "bad_cases.png") as image:
        assert image.width > 200 and image.height > 200
    with open(out / "bad_cases.csv", newline="") as f:
        cases = list(csv.DictReader(f))
    assert all(c["label"] != c["prediction"] for c in cases)
    assert [float(c["confidence"]) for c in cases] == sorted((float(c["confidence"]) for c in cases), reverse=True)
    assert all(c["label"] in record["data"]["classes"] for c in cases)  # class names, not indices
    report = (out / "report.md").read_text()
    assert "logistic_regression" in report and "confusion_matrix.png" in report and "bad_cases.png" in report
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["checkpoint"] == "checkpoints/best.pt"
    from veritrain.core.hashing import sha256_file

    assert metrics["checkpoint_sha256"] == sha256_file(run_dir / "checkpoints" / "best.pt")
    assert record["artifacts"]["eval/test/predictions.csv"]["sha256"] == sha256_file(out / "predictions.csv")


def test_baselines_in_the_run(full_run):
    _, run_dir, record = full_run
    baselines = json.loads((run_dir / "eval" / "baselines.json").read_text())
    assert set(baselines["results"]) == {"majority_class", "logistic_regression"}
    assert 0.05 < baselines["results"]["majority_class"]["accuracy"] < 0.2
    assert baselines["results"]["logistic_regression"]["accuracy"] > 0.9
    assert record["baselines"]["results"] == baselines["results"]


def test_worse_than_linear_baseline_warns(tmp_path):
    outcome = in_process_run(tmp_path, ["train.epochs=1", "model.name=mlp", "model.hidden=[4]", "optim.lr=1e-5"])
    assert outcome.record["status"] == "completed"
    assert "above the logistic_regression baseline" in outcome.record["baselines"]["warning"]
    assert "**warning:**" in (Path(outcome.summary["run_dir"]) / "eval" / "test" / "report.md").read_text()


def test_export_files_model_json_and_parity(full_run):
    _, run_dir, record = full_run
    out = run_dir / "export"
    description = json.loads((out / "model.json").read_text())
    assert set(description["files"]) == {"onnx", "torchscript", "safetensors"}
    assert description["classes"] == record["data"]["classes"]
    assert description["input"]["shape"] == [None, 1, 8, 8] and description["data_version"] == record["data"]["version"]
    assert description["preprocessing"]["mean"] == pytest.approx([record_mean(run_dir)])
    assert description["config_hash"] == record["config_hash"]
    parity = json.loads((out / "parity.json").read_text())
    assert parity["passed"] and parity["samples"] == 171  # the digits test split (data recipe 4)
    assert parity["formats"]["onnx"]["max_abs_diff"] <= 1e-4 and parity["formats"]["onnx"]["agreement"] == 1.0
    # every listed format is checked; safetensors by loading it into the model
    assert set(parity["formats"]) == set(description["files"]) and parity["formats"]["safetensors"]["max_abs_diff"] == 0.0
    assert record["export"]["parity"]["passed"]


def test_model_json_describes_architecture_and_source_mapping(full_run):
    _, run_dir, _ = full_run
    description = json.loads((run_dir / "export" / "model.json").read_text())
    architecture = description["architecture"]
    assert {k: architecture[k] for k in ("name", "hidden", "dropout", "input_shape", "num_outputs")} == {
        "name": "mlp", "hidden": [64], "dropout": 0.0, "input_shape": [1, 8, 8], "num_outputs": 10}
    assert architecture["layer_list"] == ["Flatten", "Linear(64→64)", "ReLU", "Dropout(p=0; identity at inference)", "Linear(64→10)"]
    from safetensors import safe_open

    with safe_open(run_dir / "export" / "model.safetensors", "np") as f:
        stored = set(f.keys())
    named = {op[key] for op in architecture["layers"] for key in ("weight", "bias") if op.get(key)}
    assert named == stored == {"net.1.weight", "net.1.bias", "net.4.weight", "net.4.bias"}
    mapping = description["source_mapping"]
    assert mapping["source"] == "digits" and "255 / 16" in mapping["mapping"]
    # entry v is what raw value v became; it must be what the data version holds
    from veritrain.data.sources import bundled_digits

    values, _, _ = bundled_digits()
    inputs = np.asarray(load_version(Path(json.loads((run_dir / "record.json").read_text())["data"]["path"])).inputs)
    table = np.array(mapping["table"], dtype=np.uint8)
    assert len(table) == 17 and table[8] == 128 and table[16] == 255
    assert np.array_equal(np.sort(np.unique(inputs)), np.sort(np.unique(table[values.astype(int)])))


@pytest.mark.parametrize("source, target, shape, expected", [
    ({"source": "cifar10", "dtype": "uint8", "layout": "NHWC", "channel_order": "RGB"}, {"shape": [32, 32, 3], "dtype": "uint8"}, [32, 32, 3],
     "the bytes as they are (no scaling); each row reshaped to 3×32×32 and transposed to 32×32×3 (HWC, RGB)"),
    ({"source": "imagefolder"}, {"shape": [16, 24, 3], "convert": True, "resize": "bilinear", "exif_orientation": "not applied"}, [16, 24, 3],
     "decoded with Pillow 11.0.0 (Image.open, then load); a file not in mode RGB is converted with Image.convert('RGB') and one not "
     "24×16 (W×H) resized with Image.BILINEAR (data.convert: true); EXIF orientation not applied; numpy.asarray as uint8 H×W×C"),
    ({"source": "csv"}, {"shape": [8, 8, 1], "convert": False, "resize": None, "exif_orientation": "not applied"}, [8, 8, 1],
     "decoded with Pillow 11.0.0 (Image.open, then load); a file is used as it is when in mode L and 8×8 (W×H), else quarantined as "
     "bad_shape (data.convert: false); EXIF orientation not applied; numpy.asarray as uint8 H×W×C"),
])
def test_source_mapping_of_each_kind_of_source(source, target, shape, expected):
    from types import SimpleNamespace

    from veritrain.results.export import source_mapping

    data = SimpleNamespace(info={"preprocessing": {"source": source, "target": target}, "input_shape": shape, "decoders": {"pillow": "11.0.0"}})
    mapping = source_mapping(data)
    assert mapping["source"] == source["source"] and mapping["mapping"] == expected
    assert mapping["result"].startswith(f"uint8 array H×W×C = {'×'.join(map(str, shape))}")


def test_onnx_and_safetensors_carry_the_metadata_deterministically(full_run, tmp_path):
    import onnx
    from safetensors import safe_open
    from safetensors.torch import load_file

    from veritrain.results import export

    _, run_dir, record = full_run
    out = run_dir / "export"
    in_onnx = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    with safe_open(out / "model.safetensors", "pt") as f:
        in_safetensors = f.metadata()
    assert in_onnx == in_safetensors
    assert json.loads(in_onnx["classes"]) == record["data"]["classes"]
    assert json.loads(in_onnx["mean"]) == pytest.approx([record_mean(run_dir)]) and len(json.loads(in_onnx["std"])) == 1
    assert in_onnx["input_layout"] == "NCHW" and json.loads(in_onnx["input_shape"]) == [None, 1, 8, 8]
    assert (in_onnx["source_run"], in_onnx["data_version"], in_onnx["config_hash"]) == (run_dir.name, record["data"]["version"], record["config_hash"])
    assert in_onnx["model_json_format_version"] == str(export.MODEL_JSON_VERSION)
    # the same tensors and metadata, given in another order, give the same bytes (runs are compared by hash)
    again = tmp_path / "again.safetensors"
    export.write_safetensors(again, dict(reversed(list(load_file(str(out / "model.safetensors")).items()))), dict(reversed(list(in_safetensors.items()))))
    assert again.read_bytes() == (out / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def opened(full_run):
    from veritrain.trust import opening
    from veritrain.records.workspace import Workspace

    workdir, run_dir, _ = full_run
    return opening.open_run(Workspace.open(workdir), run_dir.name)


class Lines(logging.Handler):
    """What the `veritrain` logger says while it is attached (it does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))

    def __enter__(self):
        logging.getLogger("veritrain").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("veritrain").removeHandler(self)


def test_export_of_one_format_keeps_the_others_only_from_the_same_checkpoint(full_run, opened, tmp_path):
    from veritrain.results import export
    from veritrain.core.hashing import sha256_file

    _, run_dir, _ = full_run
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)  # the shared run must still verify afterwards
    out = copy / "export"
    before = {p.name: sha256_file(p) for p in out.iterdir()}
    with Lines() as said:
        described = export.run(opened.config, opened.data, opened.task, copy, None, ["onnx"])
    assert described["kept"] == ["torchscript", "safetensors"] and described["removed"] == []
    assert not [m for level, m in said.lines if "removed" in m]
    description = json.loads((out / "model.json").read_text())
    assert {name: entry["sha256"] for name, entry in description["files"].items()} == {
        "onnx": before["model.onnx"], "torchscript": before["model.torchscript.pt"], "safetensors": before["model.safetensors"]}
    assert {p.name: sha256_file(p) for p in out.iterdir() if p.name.startswith("model.") and p.name != "model.json"} == {
        k: v for k, v in before.items() if k.startswith("model.") and k != "model.json"}  # ONNX written again, byte for byte
    parity = json.loads((out / "parity.json").read_text())
    assert set(parity["formats"]) == set(parity["files_sha256"]) == {"onnx", "torchscript", "safetensors"} and parity["passed"]

    # training kept improving after the best epoch of this run: last.pt is another checkpoint
    assert sha256_file(copy / "checkpoints" / "last.pt") != sha256_file(copy / "checkpoints" / "best.pt")
    with Lines() as said:
        described = export.run(opened.config, opened.data, opened.task, copy, "last", ["onnx"])
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.onnx", "parity.json"] and described["kept"] == []
    assert [(r["format"], r["file"]) for r in described["removed"]] == [("torchscript", "model.torchscript.pt"), ("safetensors", "model.safetensors")]
    assert all(r["reason"].startswith("made from another checkpoint (checkpoints/best.pt, sha256 ") for r in described["removed"])
    removals = [(level, m) for level, m in said.lines if "removed" in m]
    assert len(removals) == 1 and removals[0][0] == "WARNING"
    assert removals[0][1].startswith("export: removed model.torchscript.pt, model.safetensors: made from another checkpoint (checkpoints/best.pt")
    assert removals[0][1].endswith("; export them again with --format torchscript --format safetensors")
    description = json.loads((out / "model.json").read_text())
    assert set(description["files"]) == {"onnx"} and description["checkpoint"] == "checkpoints/last.pt"
    assert set(json.loads((out / "parity.json").read_text())["formats"]) == {"onnx"}

    # a model file model.json does not describe is never kept
    (out / "model.safetensors").write_bytes(b"not from this export")
    described = export.run(opened.config, opened.data, opened.task, copy, "last", ["onnx"])
    assert [(r["file"], r["reason"]) for r in described["removed"]] == [("model.safetensors", "not listed in the previous model.json, so its origin is unknown")]
    assert not (out / "model.safetensors").exists()


def test_export_refuses_a_model_with_non_finite_outputs(full_run, opened, tmp_path):
    from veritrain.results import export
    from veritrain.core.errors import RunFailed
    from veritrain.core.hashing import sha256_file
    from veritrain.train import checkpoint

    _, run_dir, _ = full_run
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    state = checkpoint.load(copy / "checkpoints" / "best.pt")
    state["model"]["net.4.bias"][3] = float("nan")  # the output layer: every sample's class-3 logit is NaN
    checkpoint.write(copy / "checkpoints", checkpoint.encode(state), ["diverged.pt"], keep_last=10)
    before = {p.name: sha256_file(p) for p in (copy / "export").iterdir()}
    with pytest.raises(RunFailed) as failed:
        export.run(opened.config, opened.data, opened.task, copy, "checkpoints/diverged.pt")
    message = str(failed.value)
    assert message.startswith("export: the model gives non-finite outputs (NaN or inf) for 171 of 171 test samples; ")
    assert "--checkpoint" in message and "\n" not in message
    assert {p.name: sha256_file(p) for p in (copy / "export").iterdir()} == before  # nothing exported, nothing removed


def _rebuild_without_veritrain(export_dir: Path, *args: str) -> dict:
    """examples/rebuild_from_export.py in a fresh interpreter (-I: no PYTHONPATH, no user site) where importing
    veritrain fails: veritrain is installed in this environment, so it is taken out of reach first."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", "-c", WITHOUT_VERITRAIN, str(REBUILD_SCRIPT), str(export_dir), *args, "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _digit_inputs(run_dir: Path, tmp_path: Path, n: int = 64) -> Path:
    """`n` digits of the data version preprocessed with numpy as model.json says: x / 255, (x - mean) / std, HWC → CHW."""
    record = json.loads((run_dir / "record.json").read_text())
    prep = json.loads((run_dir / "export" / "model.json").read_text())["preprocessing"]
    images = np.asarray(load_version(Path(record["data"]["path"])).inputs)[:n].astype(np.float32) / 255.0
    x = ((images - np.float32(prep["mean"][0])) / np.float32(prep["std"][0])).transpose(0, 3, 1, 2)
    np.save(tmp_path / "inputs.npy", np.ascontiguousarray(x, dtype=np.float32))
    return tmp_path / "inputs.npy"


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    outcome = in_process_run(tmp_path_factory.mktemp("cnn"), ["train.epochs=1", "model.name=cnn", "model.widths=[8,16]",
                                                              "data.split_ratios=[0.2,0.2,0.6]", "eval.baselines=false", "export.parity_samples=64"])
    assert outcome.error is None, outcome.summary
    return Path(outcome.summary["run_dir"])


@pytest.mark.parametrize("which", ["mlp", "cnn"])
def test_a_script_without_veritrain_rebuilds_the_model_from_the_export(request, which, tmp_path):
    run_dir = request.getfixturevalue("full_run")[1] if which == "mlp" else request.getfixturevalue("cnn_run")
    result = _rebuild_without_veritrain(run_dir / "export", "--inputs", str(_digit_inputs(run_dir, tmp_path)))
    atol = json.loads((run_dir / "record.json").read_text())["config"]["export"]["parity_atol"]
    assert result["model"] == which and result["samples"] == 64
    assert result["max_abs_diff"] <= atol and result["argmax_agreement"] == 1.0


def test_a_script_without_veritrain_rebuilds_resnet18(opened, tmp_path):
    """ResNet-18 with random weights and batch statistics, exported by the export stage (training it takes too long here)."""
    import torch

    from veritrain.results import export
    from veritrain.train import checkpoint

    cfg = opened.config.model_copy(deep=True, update={"model": opened.config.model.model_copy(update={"name": "resnet18"}),
                                                      "export": opened.config.export.model_copy(update={"parity_samples": 8})})
    torch.manual_seed(0)
    state = opened.task.build_model(cfg.model, opened.data).state_dict()
    generator = torch.Generator().manual_seed(1)
    for key, value in state.items():  # fresh statistics (0 and 1) would hide a batch norm read wrongly
        if key.endswith("running_mean"):
            value.copy_(torch.randn(value.shape, generator=generator) * 0.1)
        elif key.endswith("running_var"):
            value.copy_(torch.rand(value.shape, generator=generator) + 0.5)
    run_dir = tmp_path / "resnet-run"
    (run_dir / "checkpoints").mkdir(parents=True)
    checkpoint.write(run_dir / "checkpoints", checkpoint.encode({"model": state, "loop": {"epochs_done": 0}}), ["best.pt"], keep_last=1)
    described = export.run(cfg, opened.data, opened.task, run_dir, "best", ["onnx", "safetensors"])
    assert described["architecture"]["layer_list"][3:6] == [
        "BasicBlock(64→64, stride 1, identity shortcut)", "BasicBlock(64→64, stride 1, identity shortcut)",
        "BasicBlock(64→128, stride 2, Conv1×1+BatchNorm shortcut)"]
    result = _rebuild_without_veritrain(run_dir / "export")
    assert result["model"] == "resnet18" and result["tensors"] == len(state)
    assert result["max_abs_diff"] <= cfg.export.parity_atol and result["argmax_agreement"] == 1.0


def record_mean(run_dir: Path) -> float:
    record = json.loads((run_dir / "record.json").read_text())
    info = json.loads((Path(record["data"]["path"]) / "version.json").read_text())
    return info["normalization"]["mean"][0]


def test_onnx_has_a_dynamic_batch(full_run):
    from veritrain.results.export import onnx_logits

    _, run_dir, _ = full_run
    for n in (1, 7):
        assert onnx_logits(run_dir / "export" / "model.onnx", np.zeros((n, 1, 8, 8), dtype=np.float32)).shape == (n, 10)


def test_parity_fails_on_an_altered_export(full_run, tmp_path):
    import onnx
    from onnx import numpy_helper

    from veritrain.results import export
    from veritrain.trust import opening
    from veritrain.records.workspace import Workspace

    workdir, run_dir, _ = full_run
    opened = opening.open_run(Workspace.open(workdir), run_dir.name)
    model_path = run_dir / "export" / "model.onnx"
    original = model_path.read_bytes()
    parity_file = run_dir / "export" / "parity.json"
    original_parity = parity_file.read_bytes()  # the run is shared: it must still verify afterwards
    try:
        graph = onnx.load(str(model_path))
        weight = graph.graph.initializer[-1]  # the output layer's bias
        changed = numpy_helper.to_array(weight).copy()
        changed[0] += 0.5
        weight.CopyFrom(numpy_helper.from_array(changed, weight.name))
        onnx.save(graph, str(model_path))
        import torch

        from veritrain.results.evaluate import load_model

        model, _ = load_model(opened.config, opened.data, opened.task, run_dir / "checkpoints" / "best.pt", torch.device("cpu"))
        parity = export.check_parity(opened.config, opened.data, opened.task, model, run_dir / "export", {"onnx": "model.onnx"})
        assert not parity["passed"] and "onnx: max |Δlogit|" in parity["reason"]
    finally:
        model_path.write_bytes(original)
        parity_file.write_bytes(original_parity)


def test_export_command_fails_with_exit_1_when_parity_fails(cli, tmp_path, monkeypatch):
    from veritrain.results import export

    run = cli("train", "--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "export.parity_atol=1e-30", "--set", "export.parity_rtol=0",
              "--set", "export.formats=[onnx]", "--workdir", str(tmp_path), "--json")
    run_id = run.json()["run_id"]
    real = export.onnx_logits
    # ONNX and torch agree to ~1e-6 (on some CPUs exactly): an ONNX runtime that is off by 1e-3 fails any tolerance below it
    monkeypatch.setattr(export, "onnx_logits", lambda path, inputs: real(path, inputs) + 1e-3)
    result = cli("export", run_id, "--workdir", str(tmp_path))
    assert result.code == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: export: parity check failed (onnx: max |Δlogit|")
    record = read_record(tmp_path / "runs" / run_id)  # the run as its amendments leave it
    assert record["export"]["parity"]["passed"] is False and record["events"][-1]["kind"] == "export"


@pytest.mark.parametrize("workers", [0, 2])
def test_predict_matches_eval_on_digit_pngs(cli, full_run, tmp_path, monkeypatch, workers):
    """In chunks (7 files here, 256 by default), decoded here or by workers ahead of the model, in the order given."""
    from PIL import Image

    from veritrain.results import export

    monkeypatch.setattr(export, "PREDICT_CHUNK", 7)
    workdir, run_dir, record = full_run
    out = run_dir / "eval" / "test"
    with open(out / "predictions.csv", newline="") as f:
        expected = {r["sample_id"]: r["prediction"] for r in csv.DictReader(f)}
    info_dir = Path(record["data"]["path"])
    inputs = np.asarray(load_version(info_dir).inputs)
    with open(info_dir / "manifest.csv", newline="") as f:
        ids = [r["sample_id"] for r in csv.DictReader(f) if r["status"] == "ok"]
    files = []
    for sid in list(expected)[:60]:
        path = tmp_path / f"{sid.replace('#', '_')}.png"
        Image.fromarray(inputs[ids.index(sid), :, :, 0]).save(path)
        files.append((sid, path))
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG not really")
    given = [str(p) for _, p in files[:30]] + [str(broken)] + [str(p) for _, p in files[30:]]
    result = cli("predict", run_dir.name, *given, "--top", "3", "--workers", str(workers), "--workdir", str(workdir), "--json")
    assert result.code == 1  # one file failed, the others were predicted
    results = result.json()["results"]
    assert [r["file"] for r in results] == given
    assert results[30]["ok"] is False and "cannot decode" in results[30]["error"]
    for (sid, _), r in zip(files, results[:30] + results[31:]):
        assert r["ok"] and r["top"][0]["label"] == expected[sid], sid
        assert len(r["top"]) == 3 and r["top"][0]["prob"] >= r["top"][1]["prob"]
    assert result.stderr.strip().splitlines()[-1] == "error: 1 of 61 file(s) could not be predicted: " + str(broken)


def test_predict_resizes_any_size_and_mode(full_run, tmp_path):
    from PIL import Image

    from veritrain.results import export

    _, run_dir, _ = full_run
    path = tmp_path / "big.jpg"
    Image.new("RGB", (50, 37), (200, 10, 10)).save(path)
    (result,) = export.predict(run_dir / "export", [str(path)], top=2)
    assert result["ok"] and len(result["top"]) == 2


def _external_data_model(folder: Path) -> None:
    """model.onnx rewritten so its weights live in another file, as an attacker's export might."""
    import onnx

    model = onnx.load(str(folder / "model.onnx"))
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)


@pytest.mark.parametrize("label, edit, message", [
    ("not JSON", lambda d, folder: "{", "not an export's description"),
    ("a path for the ONNX file", lambda d, folder: d["files"]["onnx"].__setitem__("file", "../../outside.onnx"), "files.onnx.file"),
    ("classes of numbers", lambda d, folder: d.__setitem__("classes", [1, 2]), "classes.0"),
    ("a huge input", lambda d, folder: d["input"].__setitem__("shape", [None, 1, 10**9, 8]), "input.shape"),
    ("a zero std", lambda d, folder: d["preprocessing"].__setitem__("std", [0.0]), "preprocessing.std"),
    ("weights in another file", lambda d, folder: (_external_data_model(folder), d["files"]["onnx"].__setitem__(
        "sha256", __import__("veritrain.core.hashing", fromlist=["x"]).sha256_file(folder / "model.onnx"))), "self-contained"),
])
def test_predict_refuses_a_hostile_export_in_one_line(cli, full_run, tmp_path, label, edit, message):
    import shutil

    from PIL import Image

    _, run_dir, _ = full_run
    folder = tmp_path / "export"
    shutil.copytree(run_dir / "export", folder)
    description = json.loads((folder / "model.json").read_text())
    edited = edit(description, folder)
    (folder / "model.json").write_text("{" if edited == "{" else json.dumps(description))
    image = tmp_path / "x.png"
    Image.new("L", (8, 8), 3).save(image)
    result = cli("predict", str(folder), str(image))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.code == 1 and len(errors) == 1 and message in errors[0] and "Traceback" not in result.stderr, (label, result.stderr)


def test_eval_command_adds_a_sealed_amendment_and_records(cli, full_run):
    workdir, run_dir, _ = full_run
    before = (run_dir / "record.json").read_bytes(), (run_dir / "record.sha256").read_text()
    result = cli("eval", run_dir.name, "--checkpoint", "last", "--split", "val", "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    metrics = result.json()
    assert metrics["split"] == "val" and metrics["checkpoint"] == "checkpoints/last.pt"
    record = read_record(run_dir)
    assert record["events"][-1]["kind"] == "eval" and "val" in record["metrics"] and record.source("metrics.val") is not None
    assert ((run_dir / "record.json").read_bytes(), (run_dir / "record.sha256").read_text()) == before  # never rewritten
    link = record.amendments[-1]
    assert link.by == "eval" and (link.folder / "amendment.sha256").read_text().strip() == link.seal == record.seal
    assert record.path("eval/val/metrics.json") == link.folder / "files" / "eval" / "val" / "metrics.json"


def test_eval_refuses_data_drift(cli, tmp_path):
    from datafixtures import good_imagefolder, save, structured_image

    root = good_imagefolder(tmp_path / "images", per_class=15)  # 24 / 2 / 4: fewer leave val empty, which best.pt refuses
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  source: imagefolder\n  root: images\nmodel:\n  name: mlp\n  hidden: [8]\ntrain:\n  epochs: 1\n")
    run_id = cli("train", str(config), "--workdir", str(tmp_path), "--json").json()["run_id"]
    save(structured_image(999), root / "cat" / "new.png")
    refused = cli("eval", run_id, "--workdir", str(tmp_path))
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.code == 2 and last.startswith(f"error: {run_id}: the data now prepares to version") and "--allow-data-drift" in last
    allowed = cli("eval", run_id, "--allow-data-drift", "--workdir", str(tmp_path), "--json")
    assert allowed.code == 0, allowed.stderr
    record = read_record(tmp_path / "runs" / run_id)
    assert [e["kind"] for e in record["events"]][-2:] == ["data_drift", "eval"]


def test_baseline_command_for_a_config(cli, tmp_path):
    result = cli("baseline", str(Path(__file__).resolve().parents[1] / "configs" / "digits.yaml"), "--workdir", str(tmp_path), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["results"]["logistic_regression"]["accuracy"] > 0.9
    record = json.loads((tmp_path / "runs" / payload["run_id"] / "record.json").read_text())
    assert record["kind"] == "baseline" and record["status"] == "completed"


def test_repeat_reports_mean_std_and_interval(cli, tmp_path):
    result = cli("run", "--repeat", "3", "--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "model.hidden=[32]",
                 "--set", "eval.baselines=false", "--set", "export.formats=[safetensors]", "--no-smoke",
                 "--hypothesis", "three seeds agree", "--workdir", str(tmp_path), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert [r["seed"] for r in payload["runs"]] == [0, 1, 2]
    accuracy = payload["summary"]["accuracy"]
    values = accuracy["values"]
    assert accuracy["mean"] == pytest.approx(np.mean(values)) and accuracy["std"] == pytest.approx(np.std(values, ddof=1))
    from scipy.stats import t

    half = t.ppf(0.975, 2) * accuracy["std"] / np.sqrt(3)
    assert accuracy["ci95"] == pytest.approx([accuracy["mean"] - half, accuracy["mean"] + half])
    records = [json.loads((Path(r["run_dir"]) / "record.json").read_text()) for r in payload["runs"]]
    assert {r["repeat"]["group"] for r in records} == {payload["group"]}
    assert [r["hypothesis"] for r in records] == ["three seeds agree"] * 3  # kept by every seed's run
    assert (tmp_path / ".veritrain" / "repeats" / f"{payload['group']}.json").exists()
    experiments = (tmp_path / "experiments.md").read_text()
    assert "group of 3 seeds" in experiments and "(single seed)" not in experiments


class Unscriptable(__import__("torch").nn.Module):
    """TorchScript cannot compile *args in forward; torch.export can."""

    def __init__(self, features: int, outputs: int):
        import torch

        super().__init__()
        self.linear = torch.nn.Linear(features, outputs)

    def forward(self, x, *extra):
        import torch

        return self.linear(torch.flatten(x, 1))


def unscriptable(input_shape, num_outputs):
    return Unscriptable(int(np.prod(input_shape)), num_outputs)


def test_unscriptable_model_exports_with_torch_export(tmp_path):
    outcome = in_process_run(tmp_path, ["train.epochs=1", "model.target=test_evaluate_export:unscriptable"])
    assert outcome.error is None, outcome.summary
    out = Path(outcome.summary["run_dir"]) / "export"
    description = json.loads((out / "model.json").read_text())
    assert set(description["files"]) == {"onnx", "torch_export", "safetensors"} and (out / "model.pt2").is_file()
    assert description["parity"]["passed"] and set(description["parity"]["formats"]) == {"onnx", "torch_export", "safetensors"}
    architecture = description["architecture"]
    assert architecture["target"] == "test_evaluate_export:unscriptable" and architecture["kwargs"] == {}
    assert architecture["layers"] is None and architecture["module"] == "test_evaluate_export.Unscriptable"
    assert architecture["input_shape"] == [1, 8, 8] and architecture["num_outputs"] == 10
