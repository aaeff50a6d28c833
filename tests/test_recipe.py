"""The built-in recipe over the engine (veritrain.train.recipe, veritrain.train.engine): the record names the engine,
its checkpoints carry it, a record that names another is caught, the engine is chosen from the record, and the
engine's pure parts (per-step generators, the data order of a step, Best) behave as documented."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import veritrain

from veritrain.core.errors import UserError
from veritrain.train import checkpoint, engines, parts, recipe
from veritrain.train.engine import Best, Engine, Guard, UsageError


def reseal(run_dir: Path, record: dict) -> None:
    data = json.dumps(record, indent=2).encode()
    (run_dir / "record.json").write_bytes(data)
    (run_dir / "record.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def test_a_new_run_names_its_engine_and_every_checkpoint_carries_it(small_run):
    record = small_run.record
    assert record["training"]["engine"] == recipe.ENGINE == engines.of_record(record)
    for path in (small_run.run_dir / "checkpoints").glob("*.pt"):
        state = checkpoint.load(path)
        assert state["engine"] == recipe.ENGINE and state["format_version"] == 1
        assert {"sums", "best"} <= set(state["extra"]) and "augment_rng" not in state  # no generator state: k's is a function of (seed, k)
    assert record["training"]["steps"] == record["trajectory"][-1]["step"]


def test_a_record_stripped_of_its_engine_is_caught_by_verify(small_run_copy):
    run_dir = small_run_copy.run_dir
    record = json.loads((run_dir / "record.json").read_text())
    del record["training"]["engine"]  # read as the earlier loop's run: resumed, audited and reproduced by the wrong engine
    reseal(run_dir, record)
    result = veritrain("verify", run_dir.name, "--json", "--workdir", str(small_run_copy.workdir))
    assert result.code == 1
    kinds = {p["kind"] for p in result.json()["problems"]}
    assert "engine_mismatch" in kinds, result.stdout


def test_the_engine_comes_from_the_record():
    assert engines.of_record({}) == engines.LOOP == engines.of_record({"training": {"epochs": 3, "steps": 9}})
    assert engines.of_record({"training": {"engine": "recipe-2"}}) == recipe.ENGINE
    assert engines.of_record({"training": {"engine": "recipe-1"}}) == "recipe-1" == recipe.SCHEMES[0]  # trained on by the recipe alike
    with pytest.raises(UserError, match="no engine this veritrain has"):
        engines.of_record({"training": {"engine": "recipe-9"}})
    assert engines.for_new_run() == recipe.ENGINE
    assert engines.recorded(engines.LOOP) == {}


def test_a_steps_generator_is_a_function_of_seed_step_and_stream():
    engine = Engine(7, "c" * 64, "d" * 64, None)
    draw = lambda e, step, stream=1: torch.rand(4, generator=e.generator(step, stream))  # noqa: E731
    assert torch.equal(draw(engine, 3), draw(Engine(7, "x", "y", None), 3))
    assert not torch.equal(draw(engine, 3), draw(engine, 4))
    assert not torch.equal(draw(engine, 3), draw(engine, 3, stream=2))
    assert not torch.equal(draw(engine, 3), draw(Engine(8, "c", "d", None), 3))


def test_a_steps_rows_are_its_share_of_the_epochs_permutation(small_run):
    from veritrain.core.config import resolved_from_record

    cfg = resolved_from_record(small_run.record).config
    rows = torch.arange(101).numpy() * 10  # positions → row ids
    order = parts.order_of(cfg, len(rows))
    per_step = cfg.train.batch_size * cfg.train.accumulate_steps
    assert order.per_epoch == -(-101 // per_step) or 101 % per_step == 1
    seen = []
    for step in range(order.per_epoch):
        epoch, batches = parts.step_rows(cfg, rows, step)
        assert epoch == 1 and all(len(b) <= cfg.train.batch_size for b in batches)
        seen += [int(r) for b in batches for r in b]
    assert sorted(seen) == sorted(int(r) for r in rows)  # one epoch: every row once
    epoch, _ = parts.step_rows(cfg, rows, order.per_epoch)
    assert epoch == 2


def test_best_follows_the_mode_and_stops_after_patience():
    best = Best("min", patience=2)
    assert best.update(1.0, 1) and not best.update(1.5, 2) and not best.stop
    assert not best.update(1.2, 3) and best.stop and (best.value, best.epoch) == (1.0, 1)
    again = Best("min", patience=2)
    again.load_state_dict(best.state_dict())
    assert again.stop and again.value == 1.0
    with pytest.raises(UsageError):
        Best("up")


def test_the_guard_refuses_an_unknown_policy():
    with pytest.raises(UsageError, match="on_nonfinite='retry'"):
        Guard("retry")
    with pytest.raises(UsageError):
        Guard("rollback", rollback_lr_factor=0)


def test_a_last_step_that_would_leave_a_rank_under_two_samples_is_dropped():
    """With several ranks every rank gets at least two samples of each batch (BatchNorm cannot normalise one); with one
    process the rule is the one the recipe always had (a last step of one sample)."""
    from types import SimpleNamespace

    from veritrain.train.parts import batches_of, order_of

    cfg = SimpleNamespace(seed=0, train=SimpleNamespace(batch_size=8, accumulate_steps=2, epochs=1, max_steps=0))
    assert [order_of(cfg, n, 1).drop_last for n in (33, 34, 35)] == [True, False, False]  # type: ignore[arg-type]
    assert [order_of(cfg, n, 2).drop_last for n in (33, 34, 35, 36)] == [True, True, True, False]  # type: ignore[arg-type]
    assert not order_of(cfg, 3, 2).drop_last  # type: ignore[arg-type]  # one short step is all there is: kept
    rows, train_rows = np.arange(11), np.arange(100, 111)
    assert [len(p) for p in batches_of(cfg, train_rows, rows, 1)] == [8, 3]  # type: ignore[arg-type]
    assert [len(p) for p in batches_of(cfg, train_rows, rows, 2)] == [8]  # type: ignore[arg-type]  # 3 rows: a rank would get 1


AUGMENTED = ["train.epochs=2", "model.name=cnn", "model.widths=[8]", "train.batch_size=64", "train.accumulate_steps=2",
             "augment.crop_padding=1", "augment.hflip=true", "augment.mixup_alpha=0.4", "model.dropout=0.3", "eval.baselines=false",
             "export.formats=[]", "train.threads=1"]


@pytest.mark.slow  # several processes
def test_the_number_of_workers_changes_nothing_but_who_builds_the_batches(tmp_path):
    """Each step's batches (rows, crops, flips, mixing) are a pure function of the step, so workers that build them
    ahead give the same final state as the training process building them, for 0, 1 and 2 workers; their seeds come
    from a private generator, so dropout draws alike too."""
    from conftest import in_process_run
    from veritrain.records.experiments import flatten

    finals = {}
    for workers in (0, 1, 2):  # evaluation builds its batches with the same workers
        record = in_process_run(tmp_path, [*AUGMENTED, f"train.num_workers={workers}"]).record
        assert record["status"] == "completed" and record["training"]["settings"]["num_workers"] == workers
        numbers = {k: v for k, v in flatten(json.loads(json.dumps(record["metrics"]))).items() if isinstance(v, float)}
        finals[workers] = record["final_state_sha256"], numbers  # (a checkpoint's hash binds its config, num_workers too)
    assert finals[0] == finals[1] == finals[2]


def test_a_feeder_asked_for_another_step_starts_its_workers_there():
    """A resume point or a rollback asks for a step that is not the next one: the workers begin again from it."""
    from veritrain.data.loader import Feeder

    built = lambda step: [torch.full((2,), float(step))]  # noqa: E731
    with Feeder(built, 10, workers=2) as feed:
        assert [float(feed.get(k)[0][0]) for k in (0, 1, 2, 5, 6, 1, 2)] == [0, 1, 2, 5, 6, 1, 2]
    assert [float(t[0]) for k in (3, 4) for t in Feeder(built, 10, workers=0).get(k)] == [3, 4]
