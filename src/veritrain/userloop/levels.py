"""The guarantee a script's run can prove, from what the script did (`Facts`): one level and the reasons it is not
higher. No command claims more than the level.

- **replayable**: the inputs are bound, the script and its modules are recorded, the data order came from
  `run.batches`, the state from `run.resume`/`run.checkpoint` (at least one checkpoint), and deterministic
  algorithms stayed on. `veritrain reproduce` re-runs the recorded command; `veritrain audit` replays segments.
- **bound**: data, code, config and checkpoints are hashed and `verify` covers every byte, but something veritrain
  cannot control was used; `reproduce` and `audit` refuse with the reasons.
- **logged**: no inputs were bound, or the code could not be recorded (stdin, `-c`, a notebook): the config and
  the metrics only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

LEVELS = ("logged", "bound", "replayable")  # low → high


@dataclass
class Facts:
    """What a script's run did, as `veritrain.start` and the run's calls saw it."""

    code_not_recorded: Optional[str] = None  # why the script could not be recorded (None: it was)
    inputs_bound: bool = False
    batches_used: bool = False
    state_registered: bool = False
    checkpoints: int = 0  # run.checkpoint saves (the final save at finish not counted)
    deterministic: bool = True  # deterministic algorithms on at the start and still on at the end
    cudnn_benchmark: bool = False
    reads_file_variable: bool = False  # the script reads __file__ (a replay runs the recorded copy elsewhere)
    other: list[str] = field(default_factory=list)  # further reasons, as sentences
    integration: Optional[str] = None  # "lightning", "hf": a framework owned the loop, its data order and checkpoints
    # for Lightning, batches_used: the training batches came from vt.lightning.loader; state_registered: trainer.fit's
    # ckpt_path came from vt.lightning.ckpt_path


def level_of(facts: Facts) -> tuple[str, list[str]]:
    """(level, reasons it is not higher), the reasons as short sentences."""
    logged = []
    if facts.code_not_recorded:
        logged.append(f"the code could not be recorded ({facts.code_not_recorded})")
    if not facts.inputs_bound:
        logged.append("no inputs were bound (give vt.start inputs=[...] or a veritrain data version)")
    if logged:
        return "logged", logged
    bound = list(facts.other)
    if facts.integration == "lightning":  # Lightning's loop, replayable with veritrain's loader and ckpt_path()
        if not facts.batches_used:
            bound.append("the training batches came from a loader of the script's own, whose position a resume or replay through "
                         "Lightning does not restore (give trainer.fit vt.lightning.loader(dataset, batch_size))")
        if not facts.state_registered:
            bound.append("trainer.fit did not take its ckpt_path from vt.lightning.ckpt_path(...), so a replay cannot start the fit "
                         "at a checkpoint")
    elif facts.integration is not None:  # the framework's own loop: its checkpoints are hashed, its replay is not proven
        framework = {"hf": "the Hugging Face Trainer"}.get(facts.integration, facts.integration)
        bound.append(f"{framework} owns the loop and the data order, and a kill -9 resume or a replay through it is not "
                     "proven bit-identical; its checkpoints are hashed and in the trajectory")
        if not facts.checkpoints:
            bound.append("no checkpoint was saved")
        return "bound", bound
    elif not facts.batches_used:
        bound.append("the data order is the script's own (run.batches was not used), so a replay cannot draw the same batches")
    if facts.integration is None and not facts.state_registered:
        bound.append("no training state was given to run.resume, so nothing can be restored")
    elif not facts.checkpoints:
        bound.append("no checkpoint was saved" + (" with run.checkpoint" if facts.integration is None else "")
                     + ", so no segment has a start to replay from")
    if not facts.deterministic:
        bound.append("deterministic algorithms were off (deterministic=False, or turned off while it ran)")
    if facts.cudnn_benchmark:
        bound.append("torch.backends.cudnn.benchmark was on, which picks kernels by timing")
    if facts.reads_file_variable:
        bound.append("the script reads __file__, and a replay runs the recorded copy from the run folder; "
                     "locate data relative to the working directory instead")
    return ("bound", bound) if bound else ("replayable", [])
