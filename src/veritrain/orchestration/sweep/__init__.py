"""`veritrain sweep`: runs that each change the base config in one key (or, with `--grid`, in every
combination of the values given), each compared with one parent run of the base config.

    veritrain sweep configs/digits.yaml --vary optim.lr=0.01,0.001 --vary train.batch_size=32,128 --parallel 2
    veritrain sweep --resume latest

The plan goes to `.veritrain/sweeps/<id>/spec.json` before anything runs. The parent run of the base config
runs first, then the trials, up to `--parallel` at once, each in a fresh process (`veritrain.orchestration.sweep_trial`) or as
a Ray task. Every one is a normal run whose record names the sweep (`sweep`: id, trial, change), its parent and
a hypothesis. Every run evaluates the val and the test split from the same checkpoint (the one it would ship).
`summary.json` beside the spec is rewritten as runs finish: each trial's val metrics with their deltas against the
parent, the seed spread with `--repeat`, the best trial (chosen on val, by `--metric` or the headline) with its
test result, which is reported and never used for selection, and the failed trials with their reason.

The package: `planning` (`plan`), `driver` (`start`, `resume`), `backends` (local processes, Ray) and `summary`
(summary.json); the names below are its public face. One run's own process stays a module of its own outside the
package, `veritrain.orchestration.sweep_trial`: it installs its signal handling once its imports are done, and importing this
package would first load the config, workspace and record modules (about 1 s instead of 0.2 s).
"""

from veritrain.orchestration.sweep.backends import TRIAL_ENTRY, LocalTrials, RayTrials, TrialBackend
from veritrain.orchestration.sweep.driver import POLL_SECONDS, SweepOutcome, resolve_sweep, resume, start
from veritrain.orchestration.sweep.planning import (
    GRID,
    ONE_AT_A_TIME,
    SWEEP_VERSION,
    PlannedTrial,
    Slot,
    SlotState,
    SweepPlan,
    change_text,
    parse_vary,
    plan,
    require_ray,
    split_values,
)
from veritrain.orchestration.sweep.summary import planned_selection, select_best, summarize, summary_from_records

__all__ = [
    "GRID", "ONE_AT_A_TIME", "POLL_SECONDS", "SWEEP_VERSION", "TRIAL_ENTRY", "LocalTrials", "PlannedTrial", "RayTrials", "Slot",
    "SlotState", "SweepOutcome", "SweepPlan", "TrialBackend", "change_text", "parse_vary", "plan", "planned_selection", "require_ray",
    "resolve_sweep", "resume", "select_best", "split_values", "start", "summarize", "summary_from_records",
]
