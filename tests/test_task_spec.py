"""What a task declares about its metrics (veritrain.core.task_spec): the built-in tasks' declarations are read
without torch, a task registered from outside declares its own, and selection reads the declaration."""

from __future__ import annotations

import subprocess
import sys

import pytest

from veritrain.core.errors import ConfigError, UserError
from veritrain.core.selection import sweep_metric
from veritrain.core.task_spec import MetricSpec, TaskSpec
from veritrain.tasks import SPECS, TASKS, register_task, task_spec


def test_the_built_in_declarations_are_read_without_torch():
    probe = ("import sys\nfrom veritrain.core.task_registry import task_spec\n"
             "print(task_spec('classification').headline.name, task_spec('lm').headline.name, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["accuracy", "bits_per_byte", "False"]


def test_the_task_classes_carry_the_same_declaration():
    from veritrain.tasks.classification import ClassificationTask
    from veritrain.tasks.lm import LanguageModelTask

    assert ClassificationTask.spec is task_spec("classification") and LanguageModelTask.spec is task_spec("lm")


def test_a_declaration_is_checked_when_it_is_made():
    with pytest.raises(ValueError, match="goal must be 'max' or 'min'"):
        MetricSpec("rmse", "lower")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="declare exactly one headline metric"):
        TaskSpec("t", metrics=(MetricSpec("a", "max"), MetricSpec("b", "min")))
    with pytest.raises(ValueError, match="a metric name or alias is declared twice"):
        TaskSpec("t", metrics=(MetricSpec("a", "max", headline=True), MetricSpec("a", "min")))
    assert MetricSpec("rmse", "min", (0.0, None)).range == (0.0, float("inf"))


class Regression:  # a task from outside declares its metrics on its class
    spec = TaskSpec("regression", metrics=(MetricSpec("rmse", "min", (0.0, None), headline=True), MetricSpec("mae", "min", (0.0, None))))


def test_a_task_from_outside_declares_its_own_metrics_and_a_sweep_can_select_on_them(monkeypatch):
    monkeypatch.setitem(TASKS, "regression", Regression)
    monkeypatch.setitem(SPECS, "regression", None)
    assert task_spec("regression") is Regression.spec
    declared = sweep_metric("val.rmse", task_spec("regression"))
    assert (declared.name, declared.goal) == ("rmse", "min")
    with pytest.raises(ConfigError, match="task regression declares no such metric; give one of val.rmse, val.mae"):
        sweep_metric("val.accuracy", task_spec("regression"))
    given = TaskSpec("regression", metrics=(MetricSpec("r2", "max", (None, 1.0), headline=True),))
    register_task("regression", Regression, spec=given)  # given to register_task: it wins over the class's
    assert task_spec("regression") is given


def test_a_task_that_declares_nothing_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setitem(TASKS, "bare", lambda cfg: None)
    monkeypatch.setitem(SPECS, "bare", None)
    with pytest.raises(UserError, match=r"task 'bare' declares no TaskSpec: give register_task\(name, factory, spec=TaskSpec"):
        task_spec("bare")


def test_a_record_keeps_its_declaration_so_its_readers_need_no_task_code():
    from veritrain.core.task_registry import spec_of_record
    from veritrain.records.experiments import compare

    outside = TaskSpec("outside", metrics=(MetricSpec("dice", "max", (0.0, 1.0), headline=True), MetricSpec("hd95", "min", (0.0, None))))
    assert TaskSpec.from_json(outside.to_json()) == outside
    assert spec_of_record({"config": {"task": "outside"}, "task_spec": outside.to_json()}) == outside
    assert spec_of_record({"config": {"task": "outside"}}) is None  # a task not loaded here, a record without it
    assert spec_of_record({"config": {"task": "classification"}}) is task_spec("classification")  # records made before it
    a = {"run_id": "a", "config": {"task": "outside"}, "task_spec": outside.to_json(), "metrics": {"test": {"dice": 0.5, "hd95": 3.0}}}
    b = {**a, "run_id": "b", "metrics": {"test": {"dice": 0.7, "hd95": 4.0}}}
    rows = {row["key"]: (row["headline"], row["goal"]) for row in compare([a, b])["metrics"]}
    assert rows == {"test.dice": (True, "max"), "test.hd95": (True, "min")}


def test_the_baseline_rule_is_declared_by_the_task_and_judges_documents_that_do_not_name_one():
    from veritrain.core.baselines import judge
    from veritrain.core.task_spec import BaselineRule

    with pytest.raises(ValueError, match="its baseline is judged by 'r2', which it does not declare"):
        TaskSpec("t", metrics=(MetricSpec("rmse", "min", headline=True),), baseline=BaselineRule("r2", "mean"))
    rule = task_spec("classification").baseline_rule()
    assert rule == {"metric": "accuracy", "goal": "max", "baseline": "logistic_regression"}
    assert task_spec("lm").baseline_rule() == {"metric": "bits_per_byte", "goal": "min", "baseline": "bigram"}
    older = {"results": {"logistic_regression": {"accuracy": 0.9}}, "margin": 0.01}  # a document written before judged_by
    assert judge({"accuracy": 0.95}, older, rule).status == "beats"
    assert judge({"accuracy": 0.905}, older, rule).status == "does_not_beat"
    assert judge({"accuracy": 0.95}, older).status == "unknown"  # no rule named and none declared: never a pass
    other = {"results": {"mean": {"rmse": 1.0}}, "margin": 0.0}  # the declared baseline is not in the document
    assert judge({"accuracy": 0.95}, other, rule).status == "unknown"


def test_a_document_that_names_a_weaker_baseline_is_not_believed_where_the_task_is_installed():
    from veritrain.core.baselines import judge

    rule = task_spec("classification").baseline_rule()
    forged = {"results": {"logistic_regression": {"accuracy": 0.99}, "majority_class": {"accuracy": 0.1}}, "margin": 0.0,
              "judged_by": {"metric": "accuracy", "goal": "max", "baseline": "majority_class"}}
    assert judge({"accuracy": 0.5}, forged, rule).status == "does_not_beat"  # the installed declaration judges
    assert judge({"accuracy": 0.5}, forged).status == "beats"  # a task not loaded here: only the document's rule is there


def test_check_judges_a_record_by_the_installed_rule_not_by_what_the_record_says():
    """A forger who names the majority class as the baseline to beat, in the baselines document and in the record's
    copy of the declaration, for a model that does not beat the logistic regression: `check` (the one assessment)
    judges by the installed classification task's rule."""
    from veritrain.core.task_spec import BaselineRule
    from veritrain.trust.assessment import baseline_of

    results = {"logistic_regression": {"accuracy": 0.95}, "majority_class": {"accuracy": 0.10}}
    weaker = {"metric": "accuracy", "goal": "max", "baseline": "majority_class"}
    copy = TaskSpec("classification", metrics=task_spec("classification").metrics, baseline=BaselineRule("accuracy", "majority_class"))
    record = {"config": {"task": "classification"}, "metrics": {"test": {"accuracy": 0.5}}, "task_spec": copy.to_json(),
              "baselines": {"results": results, "margin": 0.0, "judged_by": weaker}}
    judged = baseline_of(record)
    assert judged.status == "does_not_beat" and judged.baseline == "logistic_regression"


def test_a_task_names_its_own_model_and_data_fields():
    from pydantic import ValidationError

    from veritrain.core.config import RunConfig, config_hash

    lm = RunConfig.model_validate({"task": "lm", "data": {"source": "jsonl"}})
    assert lm.model.name == "gpt"  # the task's default model: `task: lm` alone trains the GPT
    written = RunConfig.model_validate({"task": "lm", "data": {"source": "jsonl"}, "model": {"name": "gpt"}})
    assert config_hash(lm) == config_hash(written)  # filled as if written: the same config, the same hash
    assert config_hash(RunConfig.model_validate({})) == config_hash(RunConfig())
    with pytest.raises(ValidationError, match="task lm trains model.name gpt, not a user model"):
        RunConfig.model_validate({"task": "lm", "data": {"source": "jsonl"}, "model": {"target": "pkg.mod:build"}})
    with pytest.raises(ValidationError, match="task classification learns from image and label, but data.source 'text' gives tokens"):
        RunConfig.model_validate({"data": {"source": "text"}})


def test_a_setting_only_another_task_reads_is_refused_where_it_was_written(tmp_path):
    from veritrain.core.config import load_config, resolved_from_record

    with pytest.raises(ConfigError, match=r"^--set: augment.hflip: a setting of task classification, which task lm does not read; remove it"):
        load_config(None, ["task=lm", "data.source=jsonl", "augment.hflip=true"])
    (tmp_path / "c.yaml").write_text("eval:\n  generation:\n    tokens: 8\n    seed: 0\n")  # seed at its default: no matter
    with pytest.raises(ConfigError, match=r"c.yaml: eval.generation.tokens: a setting of task lm, which task classification does not read"):
        load_config(tmp_path / "c.yaml")
    lm = load_config(None, ["task=lm", "data.source=jsonl", "eval.generation.tokens=8", "eval.batch_size=32"])  # its own, and shared
    assert lm.config.eval.generation.tokens == 8
    # a key only another task's models read (TaskSpec.model_settings) is that task's setting; model.dropout both read
    with pytest.raises(ConfigError, match=r"^--set: model.context: a setting of task lm, which task classification does not read"):
        load_config(None, ["model.context=64"])
    with pytest.raises(ConfigError, match=r"^--set: model.widths: a setting of task classification, which task lm does not read"):
        load_config(None, ["task=lm", "data.source=jsonl", "model.widths=[8]"])
    assert load_config(None, ["task=lm", "data.source=jsonl", "model.dropout=0.1", "model.layers=1"]).config.model.layers == 1
    classifier = load_config(None, ["augment.hflip=true", "train.label_smoothing=0.1"])
    # a recorded config holds every key: it is not what the user wrote, and rebuilds as it was
    record = {"config": classifier.config.model_dump(mode="json"), "config_hash": classifier.hash}
    assert resolved_from_record(record).hash == classifier.hash


def test_the_baseline_margin_a_config_leaves_out_is_the_tasks(monkeypatch):
    from veritrain.core.config import RunConfig, config_hash
    from veritrain.core.task_spec import BaselineRule

    spec = TaskSpec("wide", metrics=(MetricSpec("rmse", "min", (0.0, None), headline=True),), baseline=BaselineRule("rmse", "mean", margin=0.5))
    monkeypatch.setitem(TASKS, "wide", lambda cfg: None)
    monkeypatch.setitem(SPECS, "wide", spec)
    assert RunConfig.model_validate({"task": "wide"}).eval.baseline_margin == 0.5
    assert RunConfig.model_validate({"task": "wide", "eval": {"baseline_margin": 0.2}}).eval.baseline_margin == 0.2  # written: kept
    # the built-in tasks declare the margin every config had: their configs hash as before
    assert config_hash(RunConfig.model_validate({"task": "lm", "data": {"source": "jsonl"}})) == config_hash(
        RunConfig.model_validate({"task": "lm", "data": {"source": "jsonl"}, "model": {"name": "gpt"}, "eval": {"baseline_margin": 0.01}}))
