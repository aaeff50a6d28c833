"""A second task through the same core: regression on tabular data, plugged in from outside.

Nothing in the workspace, record, data version, loop or CLI code knows about it; it only implements
the `Task` protocol and registers a data source.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import in_process_run
from veritrain import models
from veritrain.data import sources
from veritrain.core.task_spec import MetricSpec, TaskSpec
from veritrain.tasks import TASKS, ExportSpec, Task, plain_report, sample_rows, sample_slice, sample_split
from veritrain.tasks.evaluation import OutputsEvaluator, validate_with_criterion


def toy_tabular_source(cfg, data_root):
    rng = np.random.default_rng(1234)
    features = rng.normal(size=(400, 5)).astype(np.float32)
    targets = (features @ np.array([1.5, -2.0, 0.5, 0.0, 3.0], dtype=np.float32) + 0.05 * rng.normal(size=400)).astype(np.float32)
    return sources.SourceData(
        sample_ids=[f"toy#{i:04d}" for i in range(400)],
        inputs=features,
        targets=targets,
        classes=None,
        content_hashes=sources.array_sample_hashes(features),
        sizes=[features[0].nbytes] * 400,
        preprocessing={"source": "toy_tabular", "dtype": "float32"},
    )


class RegressionTask:
    """Every member of the Task protocol; where it does what most tasks do, it calls the default."""

    name = "regression"
    spec = TaskSpec("regression", metrics=(MetricSpec("rmse", "min", (0.0, None), headline=True), MetricSpec("mae", "min", (0.0, None))))
    epoch_metrics = ("abs_err",)
    best_metric = ("val_loss", "min")

    def __init__(self, cfg=None):
        self.cfg = cfg

    def rows(self, data, split):
        return sample_split(data, split)

    def prepare(self, data):
        pass

    def show_rows(self, data, rows):
        return sample_rows(data, rows)

    def smoke_slice(self, data, counts):
        return sample_slice(data, counts)

    def build_model(self, cfg, data):
        return models.build("mlp", data.info["input_shape"], 1, [], cfg.hidden, cfg.dropout)

    def batch(self, data, rows, device, train, generator):
        stats = data.info["normalization"]
        x = (torch.from_numpy(np.asarray(data.inputs[rows])) - torch.tensor(stats["mean"])) / torch.tensor(stats["std"])
        return x.float().to(device), torch.from_numpy(np.asarray(data.targets[rows])).to(device)

    def loss(self, outputs, targets):
        return F.mse_loss(outputs.squeeze(1), targets)

    def batch_stats(self, outputs, targets):
        return {"abs_err": float((outputs.squeeze(1) - targets).abs().sum())}

    def validation_metrics(self, model, data, device, batch_size):
        return validate_with_criterion(self, model, data, device, batch_size)

    def evaluator(self, model, data, split, cfg):
        return OutputsEvaluator(self.metrics)

    def metrics(self, outputs, targets):
        err = outputs.squeeze(1) - targets
        return {"mae": float(err.abs().mean()), "rmse": float(err.pow(2).mean().sqrt()), "loss": float(err.pow(2).mean())}

    def write_report(self, path, metrics, baselines, run_id):
        plain_report(path, metrics, self.spec, run_id)

    def plot_curves(self, path, history):
        pass

    def baselines(self, data, cfg):
        return None

    def export_spec(self, cfg, model, data, example):
        return ExportSpec(example, agreement=False)


@pytest.fixture
def regression_registered(monkeypatch):
    monkeypatch.setitem(TASKS, "regression", RegressionTask)
    monkeypatch.setitem(sources.SOURCES, "toy_tabular", toy_tabular_source)


def test_regression_task_satisfies_protocol():
    task: Task = RegressionTask()  # a structural check: no base class to inherit
    assert callable(task.batch) and task.best_metric == ("val_loss", "min")


def test_regression_runs_through_the_whole_pipeline(regression_registered, tmp_path):
    overrides = ["task=regression", "data.source=toy_tabular", "model.name=mlp", "model.hidden=[16]",
                 "train.epochs=20", "optim.lr=0.02", "exp_name=toy"]  # 20 epochs at 0.01 stop short on some splits (MAE 0.52)
    outcome = in_process_run(tmp_path, overrides)
    assert outcome.error is None, outcome.summary
    record = outcome.record
    assert record["status"] == "completed" and record["task"] == "regression"
    assert record["data"]["classes"] is None
    assert sum(record["data"]["counts"].values()) == 400
    assert record["metrics"]["test"]["mae"] < 0.5  # y has std ≈ 3.9; a learned linear map does far better
    rows = [json.loads(l) for l in (Path(outcome.summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert {"train_loss", "train_abs_err", "val_loss", "val_abs_err"} <= set(rows[-1])
    assert record["training"]["best_metric"]["name"] == "val_loss"
    again = in_process_run(tmp_path, overrides)
    assert again.record["final_state_sha256"] == record["final_state_sha256"]


def test_a_sweep_of_the_regression_task_selects_on_the_metric_it_declares(regression_registered, tmp_path):
    from veritrain.core.errors import ConfigError
    from veritrain.orchestration.trials.sweep_plan import plan
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(tmp_path / "ws")
    base = ["task=regression", "data.source=toy_tabular", "model.name=mlp", "model.hidden=[16]", "train.epochs=1"]
    assert plan(None, base, ["optim.lr=0.01,0.02"], False, 1, 1, "local", None, workspace, "val.rmse").selection == {
        "split": "val", "metric": "rmse", "mode": "min"}
    assert plan(None, base, ["optim.lr=0.01"], False, 1, 1, "local", None, workspace).selection["metric"] == "rmse"  # its headline
    with pytest.raises(ConfigError, match="task regression declares no such metric; give one of val.rmse, val.mae"):
        plan(None, base, ["optim.lr=0.01"], False, 1, 1, "local", None, workspace, "val.accuracy")


def test_unregistered_task_is_a_config_error():
    from veritrain.core.config import load_config
    from veritrain.core.errors import ConfigError

    with pytest.raises(ConfigError, match="task: expected one of 'classification', 'lm', got 'regression'"):
        load_config(None, ["task=regression"])


def test_a_task_without_every_member_of_the_protocol_is_refused_when_built(monkeypatch):
    from veritrain.core.config import load_config
    from veritrain.core.errors import UserError
    from veritrain.tasks import get_task, protocol_members

    assert "evaluator" in protocol_members() and "spec" in protocol_members() and "export_spec" in protocol_members()
    partial = type("Partial", (), {k: v for k, v in vars(RegressionTask).items() if k not in ("evaluator", "baselines")})
    monkeypatch.setitem(TASKS, "regression", partial)
    monkeypatch.setitem(sources.SOURCES, "toy_tabular", toy_tabular_source)
    with pytest.raises(UserError, match=r"task: 'regression' \(.*Partial\) lacks baselines, evaluator of the Task protocol"):
        get_task(load_config(None, ["task=regression", "data.source=toy_tabular", "model.name=mlp"]).config)


def test_the_settings_a_users_model_leaves_unused_are_the_ones_the_tasks_declare(monkeypatch):
    """A run of a user's model (model.target) uses none of the built-in models' settings: which keys those are is what
    each task declares for its models (TaskSpec.model_settings), a registered task's included, not a shared table."""
    from veritrain.core import task_registry
    from veritrain.core.config import RunConfig
    from veritrain.records import registry

    assert set(task_registry.built_in_model_keys()) == {"model.name", "model.widths", "model.hidden", "model.dropout", "model.layers",
                                                        "model.width", "model.heads", "model.context", "model.tied_embeddings"}
    spec = TaskSpec("tabular", metrics=(MetricSpec("rmse", "min", (0.0, None), headline=True),), models=("trees",),
                    model_settings=(("trees", ("model.kwargs.depth",)),))
    monkeypatch.setitem(task_registry.SPECS, "tabular", spec)
    assert "model.kwargs.depth" in task_registry.built_in_model_keys()
    config = RunConfig().model_dump(mode="json")
    config["model"].update(target="my_models:net", widths=[8, 16], context=64)
    changed = registry.changed_params(config)
    assert "model.target" in changed and "model.widths" not in changed and "model.context" not in changed
    with pytest.raises(ValueError, match="model_settings"):
        TaskSpec("bad", metrics=spec.metrics, models=("a",), model_settings=(("b", ("model.x",)),))


def test_a_task_declares_its_own_typed_model_section(monkeypatch, cli):
    """`task` picks the section `model` is read with: a task's own keys with their types, ranges and defaults, refused
    with the key's path when wrong; another task's keys refused naming that task, or left out at their default."""
    from pydantic import Field

    from veritrain.core import task_registry
    from veritrain.core.config import ModelConfig, RunConfig, config_hash, load_config
    from veritrain.core.errors import ConfigError

    class TreesConfig(ModelConfig):
        name: str = Field("trees", description="gradient-boosted trees")
        depth: int = Field(3, ge=1, le=64, description="the deepest a tree grows")

    spec = TaskSpec("tabular", metrics=(MetricSpec("rmse", "min", (0.0, None), headline=True),), models=("trees",),
                    model_settings=(("trees", ("model.depth",)),), model_section=TreesConfig)
    monkeypatch.setitem(TASKS, "tabular", RegressionTask)
    monkeypatch.setitem(task_registry.SPECS, "tabular", spec)
    monkeypatch.setitem(sources.SOURCES, "toy_tabular", toy_tabular_source)
    base = ["task=tabular", "data.source=toy_tabular"]

    config = load_config(None, [*base, "model.depth=5"]).config
    assert isinstance(config.model, TreesConfig) and (config.model.name, config.model.depth) == ("trees", 5)
    assert config.model_dump(mode="json")["model"] == {"name": "trees", "target": None, "kwargs": {}, "depth": 5}
    for override, problem in [("model.depth=0", "expected an integer ≥ 1 and ≤ 64, got 0"),
                              ("model.dept=4", "unknown key; did you mean 'depth'? valid keys in model: name, target, kwargs, depth"),
                              ("model.layers=4", "a setting of task lm, which task tabular does not read; remove it (or set task: lm)")]:
        with pytest.raises(ConfigError) as refused:
            load_config(None, [*base, override])
        assert (refused.value.key, refused.value.problem) == (override.split("=")[0], problem)
    at_default = RunConfig.model_validate({"task": "tabular", "data": {"source": "toy_tabular"}, "model": {"layers": 2, "widths": [32, 64, 128]}})
    assert config_hash(at_default) == config_hash(RunConfig.model_validate({"task": "tabular", "data": {"source": "toy_tabular"}}))
    with pytest.raises(ValueError, match="does not declare"):  # what its models read is its section's
        TaskSpec("bad", metrics=spec.metrics, models=("trees",), model_settings=(("trees", ("model.leaves",)),), model_section=TreesConfig)
    keys = cli("config", "keys").stdout
    assert "| `model.depth` | an integer ≥ 1 and ≤ 64 | `3` | task tabular: the deepest a tree grows |" in keys
