"""The commands that start runs: `run`, `train` (and its resume), `sweep` and `search`."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

import click

from veritrain.cli import render
from veritrain.cli.options import (
    config_argument,
    hypothesis_option,
    json_option,
    nproc_option,
    parent_option,
    set_option,
    trust_code_option,
    use_current_code_option,
    workdir_option,
)
from veritrain.cli.render import emit_json
from veritrain.core import logs
from veritrain.core.errors import RunFailed, UserError
from veritrain.orchestration.trials import samplers

if TYPE_CHECKING:
    from veritrain.orchestration.pipeline import RunOutcome


@click.command("run")
@config_argument
@set_option
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Train N seeds (seed, seed+1, …) as linked runs and report mean ± std and a 95% interval.")
@hypothesis_option
@parent_option
@click.option("--no-smoke", is_flag=True, help="Skip the smoke test that runs first (recorded in the run).")
@click.option("--dry-run", is_flag=True, help="Print each stage with run/reuse and the reason; run nothing.")
@click.option("--reuse-completed", is_flag=True, help="Return an identical completed run (same config hash, data version, code version) instead of running.")
@nproc_option
@workdir_option
@json_option
def run_command(config: Optional[str], overrides: tuple[str, ...], repeat: int, hypothesis: Optional[str], parent: Optional[str],
                no_smoke: bool, dry_run: bool, reuse_completed: bool, nproc: Optional[int], workdir: Optional[str], as_json: bool) -> int:
    """Prepare data, train and evaluate: one recorded run.

    CONFIG is a YAML run config; without it the built-in default runs (scikit-learn's bundled digits,
    the same as configs/digits.yaml).

    \b
    Example:
      veritrain run configs/digits.yaml --set train.epochs=5
    """
    from veritrain.core.config import load_config
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace

    if _torchrun_follower():  # rank 1… of `torchrun … -m veritrain run`: rank 0 runs the command, this one trains along
        return pipeline.follow()
    resolved = load_config(config, overrides)
    pipeline.refuse_to_start(pipeline.python_argv(), hypothesis)  # before the smoke test: the record keeps them as given
    workspace = Workspace.open(workdir)
    if dry_run or reuse_completed:
        from veritrain.orchestration import housekeeping

        stages = housekeeping.dry_run(resolved, workspace, not no_smoke, reuse_completed)
        reused = next((s.run_id for s in stages if s.stage == "train" and s.action == "reuse"), None)
        if dry_run:
            if as_json:
                emit_json({"stages": [dataclasses.asdict(s) for s in stages]})
            else:
                render.stage_plan(stages)
            return 0
        if reused:
            from veritrain.records.record import read_record

            record = read_record(workspace.runs_dir / reused)
            logs.report(f"reusing completed run {reused} (same config hash, data version and code)")
            if as_json:
                emit_json({"run_id": reused, "run_dir": str(workspace.runs_dir / reused), "status": record["status"],
                           "data_version": record["data"]["version"], "final_state_sha256": record["final_state_sha256"],
                           "metrics": record["metrics"], "reused": True})
            return 0
    if no_smoke:
        smoke_result: dict[str, Any] = {"status": "skipped"}
    else:
        from veritrain.orchestration import smoke

        passed = smoke.ensure(resolved, workspace)  # fails fast (exit 1) before the long run starts
        smoke_result = {"key": passed["key"], "status": passed["status"], "cached": passed["cached"]}
    if repeat == 1:
        outcome = pipeline.run(resolved, workspace, pipeline.python_argv(), hypothesis=hypothesis, parent=parent, smoke=smoke_result,
                               nproc=nproc or 1)
        return _finish_run(outcome, as_json)
    from veritrain.orchestration import repeats

    result = repeats.run(resolved, workspace, pipeline.python_argv(), repeat, nproc=nproc or 1, hypothesis=hypothesis, parent=parent,
                         smoke=smoke_result)
    if as_json:
        emit_json(result)
    render.repeat_summary(result)
    if result["failed"]:
        raise RunFailed(f"{len(result['failed'])} of {repeat} runs failed: {', '.join(result['failed'])}")
    return 0


@click.command("train")
@config_argument
@set_option
@click.option("--resume", "resume_ref", metavar="RUN|auto", help="Continue RUN (id, prefix, folder, or `latest`: the newest interrupted run) from its newest valid checkpoint; "
              "`auto`: the newest interrupted run (of CONFIG and its data version when given).")
@hypothesis_option
@parent_option
@trust_code_option()
@use_current_code_option(help="With --resume: continue in a new run built from the current user code (the interrupted run is left as it is).")
@nproc_option
@workdir_option
@json_option
def train_command(config: Optional[str], overrides: tuple[str, ...], resume_ref: Optional[str], hypothesis: Optional[str],
                  parent: Optional[str], trust_code: bool, use_current_code: bool, nproc: Optional[int], workdir: Optional[str], as_json: bool) -> int:
    """Train only (preparing the data version if needed), or resume an interrupted run.

    A run killed at any moment and resumed ends with the same weights as one never interrupted.

    \b
    Examples:
      veritrain train configs/digits.yaml --set checkpoint.every_steps=50
      veritrain train --resume latest
    """
    from veritrain.core.config import load_config
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace

    if _torchrun_follower():  # rank 1… of `torchrun … -m veritrain train`: rank 0 runs the command, this one trains along
        return pipeline.follow()
    workspace = Workspace.open(workdir)
    if use_current_code and not resume_ref:
        raise UserError("--use-current-code: a new run always uses the current code; the flag goes with --resume RUN")
    if resume_ref and resume_ref != "auto":
        if config or overrides:
            raise UserError(f"--resume {resume_ref}: a resumed run keeps its own recorded config; drop CONFIG and --set")
        outcome = pipeline.resume(workspace, resume_ref, pipeline.python_argv(), trust_code=trust_code, nproc=nproc,
                                  use_current_code=use_current_code)
    elif resume_ref == "auto":  # with a config: the newest interrupted run of it; without: the newest of the workspace
        match = load_config(config, overrides) if (config or overrides) else None
        outcome = pipeline.resume(workspace, "auto", pipeline.python_argv(), match=match, trust_code=trust_code, nproc=nproc,
                                  use_current_code=use_current_code)
    else:
        outcome = pipeline.run(load_config(config, overrides), workspace, pipeline.python_argv(), kind="train",
                               hypothesis=hypothesis, parent=parent, nproc=nproc or 1)
    return _finish_run(outcome, as_json)


def _torchrun_follower() -> bool:
    from veritrain.train.distributed import from_environment

    ranks = from_environment()
    return ranks is not None and not ranks.is_main


def _finish_run(outcome: RunOutcome, as_json: bool) -> int:
    if as_json:
        emit_json(outcome.summary)
    render.run_outcome(outcome)
    if outcome.error is not None:
        raise outcome.error
    return 0


@click.command("sweep")
@config_argument
@set_option
@click.option("--vary", "varies", multiple=True, metavar="KEY.PATH=V1,V2,...",
              help="A key and the values to try (YAML, as --set; commas inside [] or quotes stay in the value). Repeatable.")
@click.option("--grid", is_flag=True, help="Every combination of the --vary values, instead of one change at a time.")
@click.option("--parallel", type=click.IntRange(min=1), default=None, help="Runs at once (default 1; with --resume, the sweep's own).")
@click.option("--backend", type=click.Choice(["local", "ray"]), default=None, help="Local processes (default) or Ray tasks (needs the ray extra).")
@click.option("--ray-address", default=None, metavar="ADDR", help="The Ray cluster to use (default: $RAY_ADDRESS, else a local Ray).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="Seeds per trial and parent (seed, seed+1, …).")
@click.option("--parent", default=None, metavar="RUN", help="A completed run of the base config to compare with, instead of running it first.")
@click.option("--metric", default=None, metavar="val.NAME",
              help="The val metric that picks the best trial, e.g. val.log_loss: one the task declares (default: its headline metric, val accuracy for classification); never a test metric.")
@click.option("--no-smoke", is_flag=True, help="Skip the smoke test of the base config that runs first.")
@click.option("--dry-run", is_flag=True, help="Print the planned trials; run nothing.")
@click.option("--resume", "resume_id", default=None, metavar="SWEEP_ID", help="Continue an interrupted sweep (id, unique prefix or `latest`).")
@trust_code_option(help="With --resume: start runs whose planned config names code (model.target) (read spec.json and that code first).")
@workdir_option
@json_option
def sweep_command(config: Optional[str], overrides: tuple[str, ...], varies: tuple[str, ...], grid: bool, parallel: Optional[int],
                  backend: Optional[str], ray_address: Optional[str], repeat: int, parent: Optional[str], metric: Optional[str], no_smoke: bool,
                  dry_run: bool, resume_id: Optional[str], trust_code: bool, workdir: Optional[str], as_json: bool) -> int:
    """Runs that each change the config in one key, compared with a parent run of the base config.

    Each --vary value is a trial (one change at a time; --grid: every combination); the parent
    runs first. Every run evaluates val and test from the same checkpoint; the best trial is chosen
    on val (--metric), and its test result is reported, never used for selection. Summary in
    .veritrain/sweeps/<id>/summary.json and experiments.md; see docs/sweep.md.

    \b
    Examples:
      veritrain sweep configs/digits.yaml --vary optim.lr=0.01,0.001 --vary train.batch_size=32,128 --parallel 2
      veritrain sweep --resume latest
    """
    from veritrain.orchestration import pipeline
    from veritrain.orchestration.trials import sweep, sweep_plan
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    if resume_id:
        given = [name for name, value in (("CONFIG", config), ("--set", overrides), ("--vary", varies), ("--grid", grid), ("--repeat", repeat != 1),
                                          ("--parent", parent), ("--metric", metric), ("--no-smoke", no_smoke), ("--dry-run", dry_run)) if value]
        if given:
            raise UserError(f"--resume {resume_id}: a resumed sweep keeps its plan; drop {', '.join(given)}")
        outcome = sweep.resume(workspace, resume_id, pipeline.python_argv(), parallel, backend, ray_address, trust_code=trust_code)
    else:
        plan = sweep_plan.plan(config, overrides, varies, grid, repeat, parallel or 1, backend or "local", parent, workspace, metric=metric)
        if dry_run:
            if as_json:
                emit_json(plan.as_dict())
            else:
                render.sweep_plan(plan)
            return 0
        outcome = sweep.start(plan, workspace, pipeline.python_argv(), smoke=not no_smoke, ray_address=ray_address)
    if as_json:
        emit_json(outcome.summary)
    render.sweep_summary(outcome.summary)
    if outcome.error is not None:
        raise outcome.error
    return 0


@click.command("search")
@config_argument
@set_option
@click.option("--space", "space_path", default=None, metavar="FILE",
              help="The search space: a YAML file of config keys to ranges or choices (optim.lr: {log_uniform: [1.0e-4, 1.0e-1]}).")
@click.option("--trials", type=click.IntRange(min=1), default=None, help="How many trials to run (a grid: at most its size).")
@click.option("--metric", default=None, metavar="val.NAME", help="The val metric the search optimizes and selects on, e.g. val.accuracy; never a test metric.")
@click.option("--sampler", type=click.Choice(list(samplers.SEARCH_SAMPLERS)), default="tpe", show_default=True, help="How trials are proposed (Optuna's).")
@click.option("--pruner", type=click.Choice(["median", "none"]), default="median", show_default=True,
              help="median: stop a trial after a validation (an epoch's end, or every eval.every_steps) whose val metric is worse than the "
                   "median of completed trials at that epoch (or step).")
@click.option("--parallel", type=click.IntRange(min=1), default=None, help="Trials at once (default 1; with --resume, the search's own).")
@click.option("--backend", type=click.Choice(["local", "ray"]), default=None, help="Local processes (default) or Ray tasks (needs the ray extra).")
@click.option("--ray-address", default=None, metavar="ADDR", help="The Ray cluster to use (default: $RAY_ADDRESS, else a local Ray).")
@click.option("--seed", type=int, default=0, show_default=True, help="The samplers' seed: the same seed proposes the same configurations (see docs/search.md).")
@click.option("--enqueue", "enqueue", multiple=True, metavar="'{KEY: VALUE, ...}'",
              help="A configuration to try (a value for every key of the space), as a trial of its own. Repeatable.")
@click.option("--enqueue-after", type=click.IntRange(min=0), default=None,
              help="The trial number the first --enqueue configuration takes (default: after the pruner's 5 startup trials; 0 without pruning).")
@click.option("--no-smoke", is_flag=True, help="Skip the smoke test of the base config that runs first.")
@click.option("--resume", "resume_id", default=None, metavar="SEARCH_ID", help="Continue an interrupted search (id, unique prefix or `latest`).")
@trust_code_option(help="With --resume: start trials whose config names code (model.target) (read spec.json and that code first).")
@workdir_option
@json_option
def search_command(config: Optional[str], overrides: tuple[str, ...], space_path: Optional[str], trials: Optional[int], metric: Optional[str],
                   sampler: str, pruner: str, parallel: Optional[int], backend: Optional[str], ray_address: Optional[str], seed: int,
                   enqueue: tuple[str, ...], enqueue_after: Optional[int], no_smoke: bool, resume_id: Optional[str], trust_code: bool,
                   workdir: Optional[str], as_json: bool) -> int:
    """A hyperparameter search with Optuna: trials proposed by a sampler, hopeless ones pruned, the best chosen on val.

    Each trial is a recorded run linked to the search; after every validation the driver reads its
    metrics.jsonl and asks the pruner, and a pruned trial stops (status pruned, never evaluated on
    test). The study (Optuna's journal storage), its summary and their seal are in
    .veritrain/searches/<id>/; see docs/search.md.

    \b
    Examples:
      veritrain search configs/digits.yaml --space space.yaml --trials 20 --metric val.accuracy
      veritrain search --resume latest
    """
    from veritrain.orchestration import pipeline
    from veritrain.orchestration.trials import search, search_plan
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    if resume_id:
        given = [name for name, value in (("CONFIG", config), ("--set", overrides), ("--space", space_path), ("--trials", trials), ("--metric", metric),
                                          ("--enqueue", enqueue), ("--enqueue-after", enqueue_after is not None), ("--no-smoke", no_smoke)) if value]
        if given:
            raise UserError(f"--resume {resume_id}: a resumed search keeps its plan; drop {', '.join(given)}")
        outcome = search.resume(workspace, resume_id, pipeline.python_argv(), parallel, backend, ray_address, trust_code=trust_code)
    else:
        missing = [name for name, value in (("--space FILE", space_path), ("--trials N", trials), ("--metric val.NAME", metric)) if not value]
        if missing:
            raise UserError(f"search: give {', '.join(missing)}, e.g. veritrain search configs/digits.yaml --space space.yaml --trials 20 "
                            "--metric val.accuracy")
        assert space_path and trials and metric
        plan = search_plan.plan(config, list(overrides), space_path, trials, metric, sampler, pruner, parallel or 1, backend or "local", seed,
                           list(enqueue), enqueue_after)
        outcome = search.start(plan, workspace, pipeline.python_argv(), smoke=not no_smoke, ray_address=ray_address)
    if as_json:
        emit_json(outcome.summary)
    render.search_summary(outcome.summary)
    if outcome.error is not None:
        raise outcome.error
    return 0
