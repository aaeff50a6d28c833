"""Training features: batch augmentation, models, schedules, accumulation, precision, early
stopping, step logs, the startup header."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import in_process_run
from veritrain import models
from veritrain.core.config import AugmentConfig, load_config
from veritrain.core.errors import ConfigError
from veritrain.tasks.classification import ClassificationTask
from veritrain.train.loop import schedule_factor

FAST = ["model.name=mlp", "model.hidden=[32]"]


def rows(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def fake_data(n: int = 6, size: int = 8, channels: int = 3):
    images = np.arange(n * size * size * channels, dtype=np.int64).reshape(n, size, size, channels) % 251
    return SimpleNamespace(
        version=f"fake-{n}-{size}-{channels}", inputs=images.astype(np.uint8), targets=np.arange(n) % 3, classes=["a", "b", "c"],
        info={"normalization": {"mean": [0.0] * channels, "std": [1.0] * channels}, "input_shape": [size, size, channels]},
    )


def task_with(**augment) -> ClassificationTask:
    cfg = load_config(None, [f"augment.{k}={v}" for k, v in augment.items()]).config
    return ClassificationTask(cfg)


def test_random_crop_takes_a_window_of_the_zero_padded_image():
    data = fake_data()
    plain, _ = task_with().batch(data, np.arange(6), torch.device("cpu"), True, torch.Generator().manual_seed(0))
    cropped, _ = task_with(crop_padding=2).batch(data, np.arange(6), torch.device("cpu"), True, torch.Generator().manual_seed(0))
    assert cropped.shape == plain.shape
    padded = torch.nn.functional.pad(plain, (2, 2, 2, 2))
    for i in range(6):  # each output is one of the 25 windows of its own padded image
        windows = [padded[i, :, dy : dy + 8, dx : dx + 8] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(cropped[i], w) for w in windows)


def test_flip_and_determinism_from_the_generator():
    data = fake_data()
    task = task_with(hflip=True)
    a, _ = task.batch(data, np.arange(6), torch.device("cpu"), True, torch.Generator().manual_seed(5))
    b, _ = task.batch(data, np.arange(6), torch.device("cpu"), True, torch.Generator().manual_seed(5))
    plain, _ = task_with().batch(data, np.arange(6), torch.device("cpu"), True, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    for i in range(6):
        assert torch.equal(a[i], plain[i]) or torch.equal(a[i], plain[i].flip(2))
    assert not torch.equal(a, plain)  # with 6 coin flips, some came up
    evaluation, _ = task.batch(data, np.arange(6), torch.device("cpu"), False, torch.Generator().manual_seed(5))
    assert torch.equal(evaluation, plain)  # no augmentation outside training


def test_a_resized_crop_is_a_box_of_each_image_resized_back():
    """Each output is its own image's box, interpolated: a ramp along the width stays a ramp (rising, within the image's
    values), a constant image stays constant, and the same generator draws the same boxes."""
    from veritrain.tasks.classification import _resized_crop

    ramp = torch.linspace(0, 1, 32).expand(6, 3, 32, 32).contiguous()
    cropped = _resized_crop(ramp, (0.2, 0.6), torch.Generator().manual_seed(3))
    assert cropped.shape == ramp.shape and float(cropped.min()) >= 0 and float(cropped.max()) <= 1
    assert bool((cropped[:, :, :, 1:] >= cropped[:, :, :, :-1] - 1e-6).all())  # still rising along the width
    spans = cropped[:, 0, 0, -1] - cropped[:, 0, 0, 0]
    assert bool((spans < 0.95).all()) and len(set(spans.tolist())) == 6  # a box narrower than the image, each its own
    assert torch.equal(cropped, _resized_crop(ramp, (0.2, 0.6), torch.Generator().manual_seed(3)))
    assert torch.allclose(_resized_crop(torch.full((2, 1, 8, 8), 0.25), (0.1, 1.0), torch.Generator()), torch.full((2, 1, 8, 8), 0.25))
    plain, _ = task_with().batch(fake_data(), np.arange(6), torch.device("cpu"), True, torch.Generator().manual_seed(0))
    boxed, _ = task_with(resized_crop="[0.3, 0.9]").batch(fake_data(), np.arange(6), torch.device("cpu"), True, torch.Generator().manual_seed(0))
    assert boxed.shape == plain.shape and not torch.equal(boxed, plain)
    with pytest.raises(ConfigError, match="0 < low ≤ high ≤ 1"):
        task_with(resized_crop="[0.9, 0.3]")


@pytest.mark.parametrize("augment", [{}, {"hflip": True}, {"crop_padding": 2, "hflip": True}, {"mixup_alpha": 0.4}, {"cutmix_alpha": 1.0, "hflip": True},
                                     {"resized_crop": "[0.25, 1.0]", "hflip": True}])
def test_decoded_copy_in_memory_gives_the_same_batches_as_reading_the_mapped_array(augment, monkeypatch):
    data = fake_data(n=40)
    data.info["normalization"] = {"mean": [0.3, 0.4, 0.5], "std": [0.2, 0.25, 0.3]}
    rows = np.array([5, 0, 17, 33, 2, 2, 39])
    in_memory = task_with(**augment)
    in_memory.prepare(data)
    monkeypatch.setattr("veritrain.tasks.classification.DECODED_CACHE_BYTES", 0)
    streamed = task_with(**augment)
    streamed.prepare(data)  # over the size limit: stays on the mapped array
    for seed in range(4):
        for train in (True, False):
            a = in_memory.batch(data, rows, torch.device("cpu"), train, torch.Generator().manual_seed(seed))
            b = streamed.batch(data, rows, torch.device("cpu"), train, torch.Generator().manual_seed(seed))
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            assert a[0].is_contiguous() and a[0].stride() == b[0].stride()
    assert in_memory._images is not None and streamed._images is None


@pytest.mark.parametrize("mix", ["mixup_alpha", "cutmix_alpha"])
def test_mixing_gives_soft_targets_that_sum_to_one(mix):
    x, y = task_with(**{mix: 1.0}).batch(fake_data(), np.arange(6), torch.device("cpu"), True, torch.Generator().manual_seed(1))
    assert y.shape == (6, 3) and torch.allclose(y.sum(1), torch.ones(6))


def test_resnet18_is_the_cifar_variant():
    model = models.build("resnet18", (3, 32, 32), 10, [], [], 0.0)
    assert model.stem[0].kernel_size == (3, 3) and model.stem[0].stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert 11_000_000 < sum(p.numel() for p in model.parameters()) < 11_300_000
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def tiny_factory(input_shape, num_outputs, hidden=8, **unused):
    """A user model for the `model.target` test."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(input_shape)), hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, num_outputs))


def test_user_model_target(tmp_path):
    outcome = in_process_run(tmp_path, ["train.epochs=1", "model.target=test_training_features:tiny_factory", "model.kwargs={hidden: 12}"])
    assert outcome.error is None, outcome.summary
    state = torch.load(Path(outcome.summary["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert state["model"]["1.weight"].shape == (12, 64)
    source = outcome.record["code"]["model_source"]
    assert source["file"] == "code/test_training_features.py"  # the factory's source travels with the run
    assert (Path(outcome.summary["run_dir"]) / source["file"]).read_text() == Path(__file__).read_text()


def test_bad_user_model_target_fails_cleanly(tmp_path):
    from veritrain.core.errors import UserError

    with pytest.raises(UserError, match="model.target: no module 'no_such_module' in "):  # before a run exists
        in_process_run(tmp_path, ["train.epochs=1", "model.target=no_such_module:factory"])
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_accumulation_counts_optimizer_steps(tmp_path):
    # `veritrain train`: the optimizer steps are the training's own (no eval or export needed to count them)
    outcome = in_process_run(tmp_path, FAST + ["train.epochs=1", "train.batch_size=32", "train.accumulate_steps=3"], kind="train")
    assert outcome.record["status"] == "completed"
    batches = -(-1437 // 32)  # the digits train split (data recipe 4)
    assert outcome.record["training"]["steps"] == -(-batches // 3)


def test_schedule_factor_steps_warms_up_and_decays():
    """The lr multiplier per optimizer step, as a pure function (the loop multiplies optim.lr by it)."""
    step = load_config(None, ["schedule.name=step", "schedule.step_epochs=1", "schedule.gamma=0.5"]).config.schedule
    by_step = schedule_factor(step, steps_per_epoch=23, total_steps=69)
    assert [by_step(s) for s in (0, 22, 23, 46, 68, 69)] == [1.0, 1.0, 0.5, 0.25, 0.25, 0.125]
    warm = load_config(None, ["schedule.warmup_steps=10"]).config.schedule  # then cosine to 0
    ramp = schedule_factor(warm, steps_per_epoch=23, total_steps=23)
    assert [ramp(s) for s in (0, 2, 4, 9)] == pytest.approx([0.1, 0.3, 0.5, 1.0])
    assert ramp(10) == pytest.approx(1.0) and ramp(23) == pytest.approx(0.0, abs=1e-12)
    assert 0.0 < ramp(16) < 1.0
    constant = load_config(None, ["schedule.name=constant"]).config.schedule
    assert {schedule_factor(constant, 23, 69)(s) for s in range(69)} == {1.0}


def test_steps_jsonl_rows_log_the_scheduled_lr(tmp_path):
    overrides = ["train.epochs=1", "logging.every_steps=5", "train.grad_clip=1.0", "schedule.warmup_steps=10", "optim.lr=0.01"]
    outcome = in_process_run(tmp_path, FAST + overrides, kind="train")  # steps.jsonl is written by the training alone
    steps = rows(Path(outcome.summary["run_dir"]), "steps.jsonl")
    assert [r["step"] for r in steps] == list(range(5, 23, 5))
    assert set(steps[0]) == {"step", "epoch", "loss", "lr", "grad_norm", "samples_per_s"}
    assert all(r["grad_norm"] is not None for r in steps)
    factor = schedule_factor(load_config(None, FAST + overrides).config.schedule, 23, 23)
    assert [r["lr"] for r in steps] == pytest.approx([0.01 * factor(r["step"]) for r in steps], rel=1e-6)
    assert steps[0]["lr"] == pytest.approx(0.006)  # still warming up: (5 + 1) / 10 of the rate


def test_bf16_label_smoothing_channels_last_complete(tmp_path):
    outcome = in_process_run(tmp_path, ["train.epochs=1", "model.widths=[8,16]", "train.precision=bf16",
                                        "train.label_smoothing=0.1", "train.channels_last=true"])
    assert outcome.error is None, outcome.summary
    assert outcome.record["metrics"]["test"]["accuracy"] > 0.2  # well above chance (0.1) after one epoch


def test_fp16_needs_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: fp16 is allowed here")
    outcome = in_process_run(tmp_path, FAST + ["train.epochs=1", "train.precision=fp16", "train.device=cpu"])
    assert outcome.record["status"] == "failed" and "fp16" in outcome.record["error"]["message"]


def test_early_stopping_records_an_event(tmp_path):
    outcome = in_process_run(tmp_path, FAST + ["train.epochs=10", "optim.lr=1e-9", "schedule.name=constant", "train.early_stopping_patience=2"])
    record = outcome.record
    assert record["status"] == "completed"
    assert record["training"]["epochs"] == 3  # epoch 1 sets the best, 2 and 3 do not improve
    assert [e["kind"] for e in record["events"]] == ["early_stop"]
    # what stopped training and what picked best.pt, on which split (check's selection_on_validation row reads it)
    assert record["selection"] == {"best_checkpoint": {"split": "val", "metric": "val_acc", "mode": "max"},
                                   "early_stopping": {"split": "val", "metric": "val_acc", "mode": "max", "patience": 2}, "sweep": None}


def test_mixup_and_cutmix_batches_replay_from_the_generator_and_train(tmp_path):
    task = task_with(mixup_alpha=0.4, cutmix_alpha=1.0, hflip=True)
    data = fake_data(n=12)
    task.prepare(data)
    draws = [task.batch(data, np.arange(12), torch.device("cpu"), True, torch.Generator().manual_seed(seed)) for seed in (3, 3, 4)]
    assert torch.equal(draws[0][0], draws[1][0]) and torch.equal(draws[0][1], draws[1][1])  # the same generator, the same batch
    assert not torch.equal(draws[0][0], draws[2][0])
    # the loop trains on the soft targets (the run's own replay is checked by reproduce and audit)
    outcome = in_process_run(tmp_path, FAST + ["train.epochs=1", "augment.mixup_alpha=0.4", "augment.cutmix_alpha=1.0", "augment.hflip=true"])
    assert outcome.error is None and outcome.record["status"] == "completed"


def test_startup_header_and_peak_memory(small_run):
    log_text = (small_run.run_dir / "train.log").read_text()
    for piece in ("command: veritrain run", "config ", "code: veritrain", "torch ", "threads", "data: version", "peak memory"):
        assert piece in log_text, piece
    assert small_run.record["training"]["peak_memory_mb"] > 0
    assert small_run.record["training"]["settings"]["threads"] >= 1


def test_tensorboard_needs_its_package(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        outcome = in_process_run(tmp_path, FAST + ["train.epochs=1", "logging.tensorboard=true"])
        assert "tensorboard package is not installed" in outcome.record["error"]["message"]
    else:
        outcome = in_process_run(tmp_path, FAST + ["train.epochs=1", "logging.tensorboard=true"])
        assert list((Path(outcome.summary["run_dir"]) / "tensorboard").iterdir())


def test_compile_trains_through_the_compiled_forward_and_audit_refuses_to_replay_it(tmp_path, monkeypatch):
    """torch.compile itself takes minutes on this CPU and is outside the bit-exact promise: a stand-in that
    counts its calls shows that `train.compile` trains through what torch.compile returns, and the run says
    why an audit cannot replay it."""
    from veritrain.trust.audit import replay_blockers

    compiled: list[torch.nn.Module] = []
    calls = []

    def stand_in(module, *args, **kwargs):
        compiled.append(module)

        def forward(*inputs, **named):
            calls.append(1)
            return module(*inputs, **named)

        return forward

    monkeypatch.setattr(torch, "compile", stand_in)
    outcome = in_process_run(tmp_path, FAST + ["train.epochs=1", "train.compile=true"])
    assert outcome.error is None, outcome.record["error"]
    assert len(compiled) == 1 and len(calls) == outcome.record["training"]["steps"]
    blockers, _ = replay_blockers(outcome.record, Path(outcome.summary["run_dir"]))
    assert "train.compile is true: torch.compile is outside the bit-exact promise" in blockers
