"""Outputs people read: evaluation refuses non-finite model outputs in one line, curves have whole-epoch
ticks, repeat intervals stay inside each metric's range, the data report's images section is a table."""

from __future__ import annotations

import hashlib
import io
import json
import math

import numpy as np
import pytest
import torch

from veritrain.core.config import load_config
from veritrain.data import prepare
from veritrain.core.errors import RunFailed

TINY = ["model.name=mlp", "model.hidden=[16]"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    resolved = load_config(None, TINY)
    return resolved.config, prepare.run(resolved.config.data, resolved.data_paths, tmp_path_factory.mktemp("state"))


def _write_checkpoint(path, model: torch.nn.Module) -> None:
    """A checkpoint as the training loop leaves it, as far as evaluation reads one: weights, epochs done, sidecar."""
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "loop": {"epochs_done": 1}}, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    path.with_name(path.name + ".sha256").write_text(hashlib.sha256(buffer.getvalue()).hexdigest() + "\n")


# ---------------------------------------------------------------- non-finite outputs


class _Table(torch.nn.Module):
    """A model that gives row i of `table` for input i."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x]


class _Rows:
    """The task side of a split of five rows: the rows are their own inputs and targets."""

    def rows(self, data, split):
        return np.arange(5)

    def batch(self, data, rows, device, train, generator):
        return torch.as_tensor(rows), torch.as_tensor(rows)


def test_evaluation_counts_the_samples_with_nan_or_inf_across_batches():
    from veritrain.tasks.evaluation import OutputsEvaluator, stream

    outputs = torch.zeros(5, 3)
    outputs[1, 2] = float("nan")
    outputs[3, 0] = float("inf")
    outputs[3, 1] = float("-inf")  # one sample, however many of its outputs
    seen = OutputsEvaluator(lambda o, t: {"rows": len(o)})
    with pytest.raises(RunFailed) as caught:
        stream(_Table(outputs), _Rows(), None, "val", torch.device("cpu"), 2, seen, "checkpoints/best.pt")  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith("eval: the model gives non-finite outputs (NaN or inf) for 2 of 5 val samples at checkpoints/best.pt; ")
    assert "optim.lr" in message and "train.grad_clip" in message and "\n" not in message
    assert seen.compute() == {"rows": 0}  # no batch reached the evaluator from the first bad one on
    huge = OutputsEvaluator(lambda o, t: {"rows": len(o)})
    assert stream(_Table(torch.full((5, 3), 3e38)), _Rows(), None, "val", torch.device("cpu"), 2, huge, "best.pt") == 5  # type: ignore[arg-type]
    assert huge.compute() == {"rows": 5}  # huge but finite passes


def test_eval_refuses_a_checkpoint_whose_outputs_are_nan(digits, tmp_path):
    from veritrain.results import evaluate
    from veritrain.tasks import get_task

    cfg, data = digits
    task = get_task(cfg)
    model = task.build_model(cfg.model, data)
    with torch.no_grad():
        last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.bias[3] = float("nan")  # every sample's class-3 logit
    _write_checkpoint(tmp_path / "checkpoints" / "best.pt", model)
    with pytest.raises(RunFailed) as caught:
        evaluate.run(cfg, data, task, tmp_path, torch.device("cpu"), "best")
    n = len(data.splits["test"])
    assert f"for {n} of {n} test samples at checkpoints/best.pt" in str(caught.value)
    assert not (tmp_path / "eval").exists()  # nothing half-written


def test_huge_finite_logits_give_probabilities_and_metrics_not_nan(digits):
    from veritrain.tasks import get_task
    from veritrain.tasks.classification import class_probabilities

    cfg, data = digits
    logits = torch.tensor([[3e38, -3e38] + [0.0] * 8, [1e30, 2e30] + [-1e30] * 8, [0.0] * 10], dtype=torch.float32)
    probabilities = class_probabilities(logits)
    assert np.isfinite(probabilities).all() and np.allclose(probabilities.sum(axis=1), 1.0)
    assert probabilities[0, 0] == 1.0 and probabilities[1, 1] == 1.0 and np.allclose(probabilities[2], 0.1)
    metrics = get_task(cfg).metrics(logits, torch.tensor([0, 0, 5]), data)
    assert all(math.isfinite(metrics[k]) for k in ("accuracy", "log_loss", "ece", "loss"))


def test_predictions_file_with_nan_is_refused_in_one_line(tmp_path):
    from veritrain.tasks.classification_eval import read_predictions

    path = tmp_path / "predictions.csv"
    path.write_text("sample_id,label,prediction,confidence,p_a,p_b\ns1,a,a,0.9,0.9,0.1\ns2,b,a,nan,nan,nan\n")
    with pytest.raises(ValueError, match=r"^line 3 has a p_<class> value that is NaN or inf \(1 line\(s\) in all\)$"):
        read_predictions(path)


def test_diverged_run_fails_in_one_line_naming_the_non_finite_outputs(cli, tmp_path):
    result = cli("run", "--set", "optim.lr=1e12", "--set", "train.epochs=1", "--set", "model.name=mlp", "--set", "model.hidden=[16]",
                 "--set", "export.formats=[onnx]", "--workdir", str(tmp_path))
    assert result.code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == result.stderr.strip().splitlines()[-1]
    assert "non-finite" in errors[0] and "ValueError" not in errors[0]
    assert "Traceback" not in result.stderr
    (folder,) = (tmp_path / ".veritrain" / "smoke").iterdir()
    assert errors[0].endswith(f"; log in {folder / 'train.log'}")
    logged = (folder / "train.log").read_text()
    assert "Traceback" in logged and "non-finite outputs" in logged  # the console stays short, the log keeps it all
    record = json.loads((folder / "record.json").read_text())
    assert record["status"] == "failed" and "train.log" in record["artifacts"]


# ---------------------------------------------------------------- smoke log


def test_smoke_keeps_the_traceback_of_an_unexpected_error_in_its_train_log(digits, tmp_path, monkeypatch):
    from veritrain.orchestration import smoke
    from veritrain.results import evaluate
    from veritrain.records.workspace import Workspace

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug\nover two lines")

    monkeypatch.setattr(evaluate, "run", broken)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(RunFailed) as caught:
            smoke.run(load_config(None, TINY), Workspace.open(tmp_path))
    finally:
        torch.set_num_threads(threads)
    (folder,) = (tmp_path / ".veritrain" / "smoke").iterdir()
    log_path = folder / "train.log"
    assert str(caught.value) == f"smoke: ZeroDivisionError: a bug over two lines; traceback in {log_path}"
    logged = log_path.read_text()
    assert "Traceback (most recent call last)" in logged and "ZeroDivisionError: a bug" in logged
    assert "train: mlp" in logged  # the stages that ran before it are logged too
    record = json.loads((folder / "record.json").read_text())
    assert record["status"] == "failed" and record["error"]["type"] == "ZeroDivisionError"


# ---------------------------------------------------------------- curves


def test_curves_have_whole_epoch_ticks():
    from veritrain.tasks.classification_eval import _pyplot, curves_figure

    history = [{"epoch": 1, "train_loss": 1.2, "val_loss": 1.0, "train_acc": 0.5, "val_acc": 0.6},
               {"epoch": 2, "train_loss": 0.7, "val_loss": 0.8, "train_acc": 0.8, "val_acc": 0.7}]
    fig = curves_figure(history)
    try:
        fig.canvas.draw()
        for ax in fig.axes:
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
            assert {1.0, 2.0} <= set(ticks)
    finally:
        _pyplot().close(fig)


# ---------------------------------------------------------------- repeat intervals


def test_repeat_intervals_stay_inside_each_metrics_range():
    from veritrain.core.task_registry import task_spec
    from veritrain.orchestration.repeats import spread

    # the bounds each task declares for its metrics (veritrain.core.task_spec)
    RANGES = {m.name: m.range for name in ("classification", "lm") for m in task_spec(name).metrics} | {"mae": (0.0, float("inf"))}
    near_zero = [0.002, 0.03]  # two seeds: t(0.975, 1) = 12.7, the raw interval reaches far below 0
    assert spread(near_zero)["ci95"][0] < 0  # what an unclipped interval would say
    for name in ("log_loss", "ece", "mae"):
        s = spread(near_zero, RANGES[name])
        assert s["ci95"][0] == 0.0 and s["ci95"][1] > s["mean"], name
    near_one = spread([0.999, 0.97], RANGES["accuracy"])
    assert near_one["ci95"][1] == 1.0 and 0.0 <= near_one["ci95"][0] < near_one["mean"]
    assert spread([0.998, 0.6], RANGES["ece"])["ci95"] == [0.0, 1.0]
    inside = spread([0.5, 0.52, 0.51], RANGES["accuracy"])  # far from the bounds: the plain t interval
    assert spread([0.5, 0.52, 0.51])["ci95"] == inside["ci95"]
    assert spread([1.5, 1.6], RANGES["log_loss"])["ci95"][1] > 1.6  # log loss has no upper bound


# ---------------------------------------------------------------- data report


def test_data_report_images_section_is_a_markdown_table(digits):
    _, data = digits
    text = (data.path / "data_report.md").read_text(encoding="utf-8")
    section = text.split("## Images", 1)[1].split("\n## ", 1)[0]
    assert "| property | value | samples |\n|---|---|---|" in section
    assert "| shape (height × width × channels) | 8×8×1 | 1797 |" in section
    assert "\\u" not in section and "{" not in section and "```" not in section


def test_images_table_of_image_files():
    from veritrain.data.report import images_table

    lines = images_table({"sizes": {"32×32": 20, "64×48": 3}, "modes": {"RGB": 22, "L": 1}, "formats": {"PNG": 23}})
    assert lines[:2] == ["| property | value | samples |", "|---|---|---|"]
    assert lines[2:] == ["| size (width × height) | 32×32 | 20 |", "| size (width × height) | 64×48 | 3 |",
                         "| mode | RGB | 22 |", "| mode | L | 1 |", "| format | PNG | 23 |"]


@pytest.mark.parametrize("wanted, shown", [
    ({"train": 0.8, "val": 0.1, "test": 0.1}, "asked 0.8 / 0.1 / 0.1 (data.split_ratios); every class"),
    # a csv split column fixes the test rows: the other samples follow train and val alone, and the line says why
    ({"train": 0.8 / 0.9, "val": 0.1 / 0.9, "test": 0.0},
     "asked 0.8 / 0.1 / 0.1 (data.split_ratios), so the samples without a fixed split follow 0.89 / 0.11 / 0.00 as the data fixes test;"),
])
def test_the_data_report_shows_the_split_ratios_asked(wanted, shown):
    from veritrain.data.report import summary_lines

    achieved = {"judged": True, "asked": {"train": 0.8, "val": 0.1, "test": 0.1}, "wanted_for_free_samples": wanted,
                "per_class": {}, "skewed": []}
    [line] = [line for line in summary_lines({"achieved_split": achieved}) if line.startswith("- achieved split")]
    assert shown in line, line
