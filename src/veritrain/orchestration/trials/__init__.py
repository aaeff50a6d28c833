"""Sets of trials of one base config, each trial a recorded run: `veritrain sweep` and `veritrain search`.

    veritrain sweep configs/digits.yaml --vary optim.lr=0.01,0.001 --vary train.batch_size=32,128 --grid --parallel 2
    veritrain search configs/digits.yaml --space space.yaml --trials 20 --metric val.accuracy --sampler tpe

Both are the same process: a plan checked before anything runs (`planning`, with a kind's own part in
`sweep_plan` and `search_plan`), changes proposed by a sampler (`samplers`: one-at-a-time and grid, fixed in
advance; random and TPE, Optuna's, proposed one trial at a time) over a space of config keys (`space`; a sweep's
`--vary` values are a space of choices), a folder under `.veritrain/` with spec.json, the code copied and a lock
(`state`), each trial run in a process of its own or a Ray task, up to `--parallel` at once, signals passed on
(`backends`, `process`), and a summary whose best trial is chosen on val, its test result reported beside it.

A sweep compares each trial with one parent run of the base config (`sweep`, `sweep_summary`); a search keeps an
Optuna study and prunes trials after their epochs (`search`, `search_summary`). This module imports nothing, so
that a trial's own process (`process`) starts without loading the drivers.
"""
