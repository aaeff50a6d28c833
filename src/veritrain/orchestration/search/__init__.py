"""`veritrain search`: a hyperparameter search with Optuna over a typed space file, every trial a recorded run.

    veritrain search configs/digits.yaml --space space.yaml --trials 20 --metric val.accuracy --sampler tpe --pruner median
    veritrain search --resume latest

The plan (`planning`: the space checked against the config, the val metric, sampler, pruner, enqueued
configurations) goes to `.veritrain/searches/<id>/spec.json` before anything runs. The driver (`driver`) alone
writes the study (Optuna's journal storage, study.jsonl): it asks for a trial, runs it as a normal run in a
process of its own (`veritrain.orchestration.sweep_trial`) or a Ray task, and after every epoch reads the run's
metrics.jsonl, reports the val metric and asks the pruner; a pruned trial is stopped with SIGTERM and sealed with
status `pruned`. `summary` writes summary.json (the best trial chosen on val, its test result beside it, never
used for selection) and SHA256SUMS, its seal. `space` reads the space file.
"""

from veritrain.orchestration.search.driver import POLL_SECONDS, SearchOutcome, open_study, resolve_search, resume, start
from veritrain.orchestration.search.planning import (
    PRUNERS,
    SAMPLERS,
    SEARCH_VERSION,
    SearchPlan,
    grid_points,
    plan,
    sampler_for,
    trial_seed,
)
from veritrain.orchestration.search.space import Param, Space, enqueued, load_space
from veritrain.orchestration.search.summary import check_seal, search_runs, select_best_trial, summary_from_study

__all__ = [
    "POLL_SECONDS", "PRUNERS", "SAMPLERS", "SEARCH_VERSION", "Param", "SearchOutcome", "SearchPlan", "Space", "check_seal", "enqueued",
    "grid_points", "load_space", "open_study", "plan", "resolve_search", "resume", "sampler_for", "search_runs", "select_best_trial",
    "start", "summary_from_study", "trial_seed",
]
