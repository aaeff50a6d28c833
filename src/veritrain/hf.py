"""veritrain for the Hugging Face Trainer (`pip install veritrain[hf]`): a Trainer's run recorded and sealed as a
script's run.

    trainer = Trainer(model=model, args=TrainingArguments(save_steps=50, ...), train_dataset=ds,
                      callbacks=[vt.hf.Callback(inputs=["data/train.jsonl"])])
    trainer.train()                                   # trainer.train(resume_from_checkpoint=True) continues the same run

- The config is the `TrainingArguments` (as `to_dict()` gives them, less `output_dir`, `logging_dir` and `run_name`,
  which say where, not what) and the model's config. HF's Dataset objects do not name files, so `inputs` names them.
- Each checkpoint folder (`checkpoint-<step>/`) is hashed in `on_save`, which the Trainer calls after the save: its
  weights, optimizer, scheduler, scaler, the Trainer's own `rng_state.pth` and `trainer_state.json`; the folder then
  gets a `veritrain.json` (the run id and the trajectory so far), which a resume reads.
- The final step is always saved, so the trajectory ends at the final state. The logs go to metrics.jsonl.
- Checkpoints go into the run's `checkpoints/` when `output_dir` is left at the Trainer's default; elsewhere they
  stay where the user put them, outside the run's seal, and the run's guarantee says so.

A Trainer run is `bound` (docs/api.md): reproduce and audit refuse it, with the reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Union

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from veritrain.core.errors import RunFailed
from veritrain.core.hashing import state_dict_sha256
from veritrain.train import trajectory
from veritrain.userloop import frameworks, run as run_module
from veritrain.userloop.canonical import canonical_config
from veritrain.userloop.run import Run

__all__ = ["Callback"]

MARK = "veritrain.json"  # in a checkpoint folder: the run it belongs to and the trajectory before it
WHERE_NOT_WHAT = ("output_dir", "logging_dir", "run_name")
DEFAULT_OUTPUT_DIRS = (None, "trainer_output", "tmp_trainer")
TIMINGS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")  # seconds, not results


class Callback(TrainerCallback):
    """Records a Trainer's training as a veritrain run (see the module docstring). `config`: the config to record
    instead of the TrainingArguments and the model's config."""

    def __init__(self, inputs: Optional[list[Union[str, Path, Any]]] = None, name: Optional[str] = None, workdir: Union[str, Path] = ".",
                 config: Optional[object] = None) -> None:
        self.inputs, self.name, self.workdir, self.config = inputs, name, workdir, config
        self.run: Optional[Run] = None
        run_module.install_excepthook()  # a veritrain error, or an exception the Trainer lets through, ends the run in one line

    def _config(self, args: TrainingArguments, model: Optional[torch.nn.Module]) -> dict[str, Any]:
        if self.config is not None:
            return canonical_config(self.config)
        arguments = {k: _plain(v) for k, v in args.to_dict().items() if k not in WHERE_NOT_WHAT}
        model_config = getattr(model, "config", None)
        described = {k: _plain(v) for k, v in model_config.to_dict().items()} if model_config is not None else None
        return {"training_args": arguments, "model_config": described, "seed": int(args.seed)}

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Optional[torch.nn.Module] = None,
                       **kwargs: Any) -> None:
        if self.run is not None or not state.is_world_process_zero:
            return
        given_output = args.output_dir
        folder = _resumed_from(args, state, model, Path(self.workdir)) if state.global_step else None
        resumed = _mark_of(folder) if folder is not None else None
        self.run = run = run_module.start_for("hf", self._config(args, model), self.name, self.inputs, self.workdir,
                                              str(resumed["run_id"]) if resumed else None,
                                              bool(args.full_determinism or torch.are_deterministic_algorithms_enabled()))
        assert run.dir is not None
        if resumed and folder is not None:  # on into the folder it resumed from
            args.output_dir = str(folder.parent)
        elif given_output in DEFAULT_OUTPUT_DIRS:  # into the run, whose seal then covers them
            args.output_dir = str(run.dir / "checkpoints")
        elif not Path(str(args.output_dir)).resolve().is_relative_to(run.dir.resolve()):
            run.facts.other.append(f"its checkpoints are in output_dir {args.output_dir}, outside the run folder, so the run's seal "
                                    "does not cover them (leave output_dir at its default to keep them in the run)")
        if resumed and folder is not None:
            state_hash, model_hash = _hashes(folder, run.state_recipe)
            entries = list(resumed.get("trajectory") or [])
            entry = trajectory.entry(entries, run.config_hash, run.engine.binding, state.global_step, int(state.epoch or 0), state_hash, model_hash)
            if folder.resolve().is_relative_to(run.dir.resolve()):
                entry["file"] = folder.resolve().relative_to(run.dir.resolve()).as_posix()
            run.continue_trajectory(entries + [entry], state.global_step)
        elif model is not None:  # a new run: the initial state is entry 0
            weights = model.state_dict()
            run.enter_checkpoint(None, trajectory.state_sha256({"state_dict": weights}), state_dict_sha256(weights), 0, 0)
            run.facts.checkpoints -= 1  # the initial state is no save

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.run is not None and state.max_steps and state.global_step >= state.max_steps:
            control.should_save = True  # the final state, as the trajectory's last entry

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        run = self.run
        if run is None:
            return
        folder = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        if run.engine.entries and run.engine.entries[-1]["step"] == state.global_step:
            return  # saved at this step already
        (folder / MARK).write_text(json.dumps({"run_id": run.id, "trajectory": list(run.engine.entries)}, indent=2) + "\n", encoding="utf-8")
        state_hash, model_hash = _hashes(folder, run.state_recipe)
        run.enter_checkpoint(folder, state_hash, model_hash, state.global_step, int(state.epoch or 0))

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: Optional[dict[str, Any]] = None,
               **kwargs: Any) -> None:
        if self.run is not None and logs:
            self.run.log(state.global_step, **_numbers(logs))

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        run.epochs_done = int(math.floor(state.epoch or 0))
        last = next((entry for entry in reversed(state.log_history) if "train_loss" in entry or "loss" in entry), {})
        run.finish(metrics=_numbers({k: v for k, v in last.items() if k not in ("step", "epoch") and k not in TIMINGS}))


def _hashes(folder: Path, recipe: int) -> tuple[str, str]:
    try:
        return frameworks.hf_hashes({p.name: p for p in folder.iterdir() if p.is_file()}, recipe)
    except (OSError, ValueError) as err:
        raise RunFailed(f"vt.hf: {folder}: cannot hash the checkpoint ({err})") from None


def _resumed_from(args: TrainingArguments, state: TrainerState, model: Optional[torch.nn.Module], workdir: Path) -> Optional[Path]:
    """The checkpoint folder the Trainer resumed from (it does not tell its callbacks): the `checkpoint-<step>` of
    output_dir or of a run of the workspace whose weights are the model's now."""
    step = state.global_step
    candidates = [Path(str(args.output_dir)) / f"checkpoint-{step}", *sorted((workdir / "runs").glob(f"*/checkpoints/checkpoint-{step}"))]
    marked = [folder for folder in candidates if _mark_of(folder) is not None]
    if not marked or model is None:
        return None
    weights = state_dict_sha256(model.state_dict())
    for folder in marked:
        try:
            if _hashes(folder, frameworks.HF_STATE_RECIPE)[1] == weights:  # the weights' hash: the same under every recipe
                return folder
        except RunFailed:
            continue
    return None


def _mark_of(folder: Path) -> Optional[dict[str, Any]]:
    """veritrain's mark in a checkpoint folder the Trainer resumes from, or None for one veritrain did not see."""
    try:
        mark = json.loads((folder / MARK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and mark.get("run_id") else None


def _plain(value: Any) -> Any:
    """A TrainingArguments or model config value as JSON holds it (what is no JSON value is named by its text)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _numbers(logs: dict[str, Any]) -> dict[str, Any]:
    return {str(k): float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
