"""`veritrain audit`: an honest run replays identically; a run with one forged segment, rewritten
consistently (trajectory, record, seal) so that plain `verify` passes, is caught when that segment is
drawn; a trajectory that lies about its endpoint fails `verify`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import veritrain

# 4 epochs of 23 steps; every epoch's checkpoint kept for audit: entries at steps 0, 23, 46, 69, 92
AUDITED = ["--set", "train.epochs=4", "--set", "model.name=mlp", "--set", "model.hidden=[32]", "--set", "checkpoint.audit_every=1"]
COPY_ID = "20261130-000000-000-f0f0f0"


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "record.json").read_text())


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("audit")
    result = veritrain("train", *AUDITED, "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stderr
    return Path(result.json()["run_dir"])


def copy_run(run_dir: Path, new_id: str) -> Path:
    """A copy of a run under another id in the same workspace, its record rewritten and sealed again."""
    from veritrain.records.record import write_record

    copy = run_dir.parent / new_id
    shutil.copytree(run_dir, copy)
    rewritten = record(copy)
    rewritten["run_id"] = new_id
    write_record(copy, rewritten)
    return copy


def test_an_honest_run_replays_identically_in_every_segment(honest):
    trajectory = record(honest)["trajectory"]
    assert [e["step"] for e in trajectory] == [0, 23, 46, 69, 92]
    assert all(e["kept"] and e["kept_for_audit"] for e in trajectory[1:])
    result = veritrain("audit", honest.name, "--segments", "10", "--workdir", str(honest.parent.parent), "--json")
    assert result.code == 0, result.stderr
    audit = result.json()
    assert audit["verdict"] == "identical" and audit["segments_audited"] == 4 == audit["segments_auditable"]
    assert [s["verdict"] for s in audit["segments"]] == ["identical"] * 4
    assert "seed" in audit and f"--seed {audit['seed']}" in result.stderr  # the drawn seed is printed, so the audit can be repeated
    assert audit["escape_probability"]["1"] == 0.0  # every segment drawn: nothing escapes
    # the audit writes nothing into the run: it still verifies with the same seal
    assert veritrain("verify", honest.name, "--workdir", str(honest.parent.parent)).code == 0


def test_the_same_seed_draws_the_same_segments(honest):
    workdir = str(honest.parent.parent)
    first = veritrain("audit", honest.name, "--segments", "2", "--seed", "12345", "--workdir", workdir, "--json").json()
    again = veritrain("audit", honest.name, "--segments", "2", "--seed", "12345", "--workdir", workdir, "--json").json()
    assert [s["segment"] for s in first["segments"]] == [s["segment"] for s in again["segments"]]
    assert first["escape_probability"]["1"] == pytest.approx(0.5)  # C(3, 2) / C(4, 2)


def test_a_forged_segment_passes_verify_and_is_caught_by_the_audit(honest, tmp_path):
    """The forger replaces the checkpoint at step 46 with a state trained on other data (another split),
    enters it in the trajectory, and lets veritrain resume honestly from it: record, chain and seal are
    all consistent. Only replaying segment 23 → 46 on the recorded data shows the lie."""
    from veritrain.core.hashing import state_dict_sha256
    from veritrain.records.record import write_record
    from veritrain.train import checkpoint, trajectory

    workdir = honest.parent.parent
    other = veritrain("train", *AUDITED, "--set", "train.epochs=2", "--set", "data.split_seed=1", "--workdir", str(tmp_path), "--json")
    assert other.code == 0, other.stderr
    foreign = checkpoint.load(Path(other.json()["run_dir"]) / "checkpoints" / "step-46.pt")

    forged_dir = copy_run(honest, COPY_ID)
    honest_record = record(forged_dir)
    start = checkpoint.load(forged_dir / "checkpoints" / "step-23.pt")
    foreign["config_hash"], foreign["data_version"] = start["config_hash"], start["data_version"]
    # the best validation so far as the story's metrics.jsonl tells it, or verify finds the best named elsewhere
    foreign["extra"]["best"] = checkpoint.load(forged_dir / "checkpoints" / "step-46.pt")["extra"]["best"]
    entries = start["loop"]["trajectory"]
    entries = entries + [trajectory.entry(entries, start["config_hash"], start["data_version"], 46, 2,
                                          trajectory.state_sha256(foreign), state_dict_sha256(foreign["model"]))]
    foreign["loop"]["trajectory"], foreign["loop"]["other_saves"] = entries, []
    for path in (forged_dir / "checkpoints").iterdir():
        if path.name.split(".")[0] not in ("step-23",):
            path.unlink()
    best_here = ["best.pt"] if foreign["extra"]["best"]["step"] == 46 else []  # the story's best so far is this state
    checkpoint.write(forged_dir / "checkpoints", checkpoint.encode(foreign), ["step-46.pt", *best_here], keep_last=100)
    metrics = (forged_dir / "metrics.jsonl").read_text().splitlines()[:2]  # epochs 1 and 2: the forger's story
    (forged_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in metrics))
    (forged_dir / "steps.jsonl").unlink(missing_ok=True)
    # as in a run killed while it trained: the record names its engine and no counts yet
    honest_record.update(status="interrupted", training={"engine": honest_record["training"]["engine"], "epochs": 0, "steps": 0},
                         final_state_sha256=None)
    for key in ("trajectory", "other_saves"):  # absent until training ends, as in a run killed while it trained
        honest_record.pop(key, None)
    write_record(forged_dir, honest_record)

    resumed = veritrain("train", "--resume", COPY_ID, "--workdir", str(workdir), "--json")
    assert resumed.code == 0, resumed.stderr
    forged = record(forged_dir)
    assert [e["step"] for e in forged["trajectory"]] == [0, 23, 46, 69, 92]
    assert forged["final_state_sha256"] != record(honest)["final_state_sha256"]

    verified = veritrain("verify", COPY_ID, "--workdir", str(workdir), "--json")
    assert verified.code == 0 and verified.json()["ok"], verified.stdout  # plain verify cannot tell: why audit exists

    audited = veritrain("audit", COPY_ID, "--segments", "10", "--workdir", str(workdir), "--json")
    assert audited.code == 1, audited.stderr
    verdicts = {s["segment"]: s for s in audited.json()["segments"]}
    assert verdicts[2]["verdict"] == "differs" and verdicts[2]["first_difference"].startswith("/")
    assert [verdicts[i]["verdict"] for i in (1, 3, 4)] == ["identical"] * 3  # the forger trained honestly after the lie
    assert "segment(s) 2 differ" in audited.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("lie", ["dropped_last_entry", "endpoint_weights_swapped"])
def test_a_trajectory_that_lies_about_its_endpoint_fails_verify(honest, lie):
    from veritrain.records.record import write_record
    from veritrain.train import trajectory

    workdir = honest.parent.parent
    run_id = {"dropped_last_entry": "20261130-000000-001-f0f0f1", "endpoint_weights_swapped": "20261130-000000-002-f0f0f2"}[lie]
    lying = copy_run(honest, run_id)
    rewritten = record(lying)
    entries = [dict(e) for e in rewritten["trajectory"]]
    if lie == "dropped_last_entry":  # a trajectory that stops at step 69 while the weights are step 92's
        entries = entries[:-1]
    else:  # the last entry claims another state (entry 3's) while naming the final weights
        entries[-1]["state_sha256"] = entries[-2]["state_sha256"]
        chained = []
        for e in entries:
            chained.append({**e, "chain": trajectory.entry(chained, rewritten["config_hash"], rewritten["data"]["version"], e["step"], e["epoch"],
                                                           e["state_sha256"], e["model_sha256"])["chain"]})
        entries = chained
    rewritten["trajectory"] = entries
    write_record(lying, rewritten)  # consistently sealed: only the trajectory lies
    result = veritrain("verify", run_id, "--workdir", str(workdir), "--json")
    assert result.code == 1
    kinds = {p["kind"] for p in result.json()["problems"]}
    assert kinds & {"trajectory_endpoint", "not_in_trajectory"}, kinds
    assert "trajectory_broken" not in kinds  # the chain itself was rewritten correctly


def test_a_broken_chain_fails_verify(honest):
    from veritrain.records.record import write_record

    run_id = "20261130-000000-003-f0f0f3"
    broken = copy_run(honest, run_id)
    rewritten = record(broken)
    rewritten["trajectory"][2]["state_sha256"] = "0" * 64  # changed without recomputing the chain
    write_record(broken, rewritten)
    result = veritrain("verify", run_id, "--workdir", str(honest.parent.parent), "--json")
    assert result.code == 1 and "trajectory_broken" in {p["kind"] for p in result.json()["problems"]}


def test_an_audit_that_cannot_be_exact_here_exits_2_naming_the_difference(honest, monkeypatch):
    from veritrain.trust import audit
    from veritrain.core.errors import UserError
    from veritrain.records.workspace import Workspace

    from veritrain.trust import assessment

    monkeypatch.setattr(assessment.platform, "python_version", lambda: "3.99.0")  # the one replayability check, audit's and check's
    with pytest.raises(UserError, match=r"python \S+ recorded, 3\.99\.0 here"):
        audit.run(Workspace.open(honest.parent.parent), honest.name, segments=1)


def test_a_run_without_trajectory_has_nothing_to_audit(tmp_path):
    baseline = veritrain("baseline", "configs/digits.yaml", "--workdir", str(tmp_path), "--json", cwd=Path(__file__).resolve().parents[1])
    assert baseline.code == 0, baseline.stderr
    result = veritrain("audit", "latest", "--workdir", str(tmp_path))
    assert result.code == 2 and result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1


def test_escape_probability():
    from veritrain.trust.audit import escape_probability

    assert escape_probability(20, 1, 2) == pytest.approx(0.9)  # C(19, 2) / C(20, 2)
    assert escape_probability(20, 2, 2) == pytest.approx(153 / 190)
    assert escape_probability(4, 1, 4) == 0.0


@pytest.mark.slow
def test_no_false_alarm_on_ten_honest_runs(tmp_path):
    """Ten honest runs (seeds 0–9, with augmentation and dropout drawing from every generator), each
    audited in every segment: all identical on this machine."""
    for seed in range(10):
        trained = veritrain("train", *AUDITED, "--set", "train.epochs=2", "--set", f"seed={seed}", "--set", "model.dropout=0.2", "--set", "augment.hflip=true",
                            "--set", "checkpoint.every_steps=7", "--workdir", str(tmp_path), "--json")
        assert trained.code == 0, trained.stderr
        audited = veritrain("audit", trained.json()["run_id"], "--segments", "100", "--workdir", str(tmp_path), "--json")
        assert audited.code == 0, f"seed {seed}: {audited.stdout}{audited.stderr}"
        assert audited.json()["verdict"] == "identical" and audited.json()["segments_audited"] >= 6


@pytest.mark.slow
def test_a_forged_segment_without_a_start_checkpoint_is_replayed_from_an_earlier_state(tmp_path):
    """With the default audit_every 0 only the newest checkpoints stay. The forger puts a state trained on other data
    at step 40 and lets the real loop resume from it: verify passes, the segment 30 → 40 has no checkpoint to start
    from, and the audit replays it from the initial state and names it."""
    from veritrain.core.hashing import state_dict_sha256
    from veritrain.records.record import write_record
    from veritrain.train import checkpoint, trajectory

    plain = ["--set", "train.epochs=3", "--set", "model.name=mlp", "--set", "model.hidden=[16]", "--set", "checkpoint.every_steps=10"]
    workdir = tmp_path / "ws"
    honest = veritrain("train", *plain, "--workdir", str(workdir), "--json")
    assert honest.code == 0, honest.stderr
    honest_dir = Path(honest.json()["run_dir"])
    other = veritrain("train", *plain, "--set", "data.split_seed=1", "--set", "checkpoint.keep_last=100", "--workdir", str(tmp_path / "other"), "--json")
    assert other.code == 0, other.stderr
    foreign = checkpoint.load(Path(other.json()["run_dir"]) / "checkpoints" / "step-40.pt")

    forged_dir = copy_run(honest_dir, COPY_ID)
    honest_record = record(forged_dir)
    entries = honest_record["trajectory"][:5]  # steps 0, 10, 20, 23, 30: the honest story up to step 30
    foreign["config_hash"], foreign["data_version"] = honest_record["config_hash"], honest_record["data"]["version"]
    entries = [{k: e[k] for k in ("step", "epoch", "state_sha256", "model_sha256", "chain")} for e in entries]
    entries.append(trajectory.entry(entries, foreign["config_hash"], foreign["data_version"], 40, 2,
                                    trajectory.state_sha256(foreign), state_dict_sha256(foreign["model"])))
    foreign["loop"]["trajectory"], foreign["loop"]["other_saves"] = entries, []
    for path in (forged_dir / "checkpoints").iterdir():
        path.unlink()
    checkpoint.write(forged_dir / "checkpoints", checkpoint.encode(foreign), ["step-40.pt"], keep_last=100)
    (forged_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in (honest_dir / "metrics.jsonl").read_text().splitlines()[:1]))
    (forged_dir / "steps.jsonl").unlink(missing_ok=True)
    # as in a run killed while it trained: the record names its engine and no counts yet
    honest_record.update(status="interrupted", training={"engine": honest_record["training"]["engine"], "epochs": 0, "steps": 0},
                         final_state_sha256=None)
    for key in ("trajectory", "other_saves"):  # absent until training ends, as in a run killed while it trained
        honest_record.pop(key, None)
    write_record(forged_dir, honest_record)
    resumed = veritrain("train", "--resume", COPY_ID, "--workdir", str(workdir), "--json")
    assert resumed.code == 0, resumed.stderr
    forged = record(forged_dir)
    assert [e["step"] for e in forged["trajectory"]] == [0, 10, 20, 23, 30, 40, 46, 50, 60, 69]
    assert not (forged_dir / "checkpoints" / "step-30.pt").exists()  # no start checkpoint for the forged segment
    assert veritrain("verify", COPY_ID, "--workdir", str(workdir)).code == 0

    audited = veritrain("audit", COPY_ID, "--segments", "100", "--workdir", str(workdir), "--json")
    assert audited.code == 1, audited.stderr
    verdicts = {s["segment"]: s for s in audited.json()["segments"]}
    assert [verdicts[i]["verdict"] for i in range(1, 5)] == ["identical"] * 4
    assert verdicts[5]["verdict"] == "differs" and verdicts[5]["replayed_from_step"] == 0  # from the initial state
    assert verdicts[9]["verdict"] == "identical" and verdicts[9]["replayed_from_step"] == 60  # its own kept start
    assert "segment(s) 5 differ" in audited.stderr.strip().splitlines()[-1]


def test_a_multi_process_run_is_refused_with_the_check_that_works_on_this_machine(tmp_path):
    from veritrain.trust.audit import cannot_replay, replay_blockers

    two = {"config": {"train": {"deterministic": True}}, "distributed": {"world_size": 2, "nodes": 1}}
    blockers, _ = replay_blockers(two, tmp_path)  # made here: no machine difference
    assert not any("process" in b for b in blockers)  # the world size is no difference of this machine
    message = cannot_replay("R", two, [])
    assert message == ("R: the run was trained by 2 processes and audit replays a segment in one process, which cannot give a 2-process "
                       "step bit for bit; check it with `veritrain reproduce R`, which trains it again with 2 processes on this machine "
                       "and compares the weights and metrics (identical on the same kind of machine)")
    assert "a machine like the recorded one" not in message
    elsewhere = cannot_replay("R", two, ["python 3.10.1 recorded, 3.11.2 here"])
    assert "`veritrain reproduce R` on a machine like the recorded one (this one differs: python 3.10.1 recorded, 3.11.2 here)" in elsewhere
    nodes = cannot_replay("R", {"distributed": {"world_size": 4, "nodes": 2}}, [])
    assert "trained by 4 processes on 2 machines" in nodes and "the same torchrun launch (4 ranks)" in nodes
    assert cannot_replay("R", {"distributed": None}, []) is None
    assert cannot_replay("R", {}, ["CPU 'a' recorded, 'b' here"]).endswith("audit it on a machine like the recorded one (`veritrain runs show R`)")


def test_a_timing_save_without_a_step_is_a_keep_rule_problem_not_a_crash():
    """A damaged record's other_saves entry without a step names no checkpoint; the keep rule still judges the rest
    (sorting it among the steps used to raise TypeError)."""
    from veritrain.train.trajectory import keep_rule_problems

    damaged = {"trajectory": [{"step": 0, "epoch": 0}, {"step": 5, "epoch": 1, "kept": True}], "training": {"epochs": 1},
               "config": {"checkpoint": {"keep_last": 2}}, "other_saves": [{"reason": "signal", "state_sha256": "0" * 64}]}
    problems = keep_rule_problems(damaged, {"checkpoints/step-5.pt"}, set())
    assert [p["path"] for p in problems] == ["checkpoints/last.pt"]
