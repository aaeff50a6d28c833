"""The attacks of docs/threat-model.md, one test each: the forger controls the workspace, rewrites files and records,
re-seals with veritrain's own code and signs with a key of their own or none. Each test names the command that must
catch the attack and its exit code; attacks that keep the honest seal are caught without any key."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from conftest import FAST_OVERRIDES, in_process_run

UNSEALED = {"record.json", "record.sha256", "notes.jsonl", "archive_omitted.json", "provenance.intoto.jsonl"}


# ---------------------------------------------------------------- the forger's tools


def forge(run_dir: Path, change: Optional[Callable[[dict[str, Any]], None]] = None, key: Any = None, statement: bool = True) -> str:
    """Rewrite the run's record through `change`, list every file as it is now, seal it and write a provenance statement
    signed by `key` (None: unsigned; `statement` False: none at all, and the record names none), as a forger with
    veritrain's own code would. Returns the new seal."""
    from veritrain.records import provenance
    from veritrain.records.record import sealed_bytes, statement_bytes

    record = json.loads((run_dir / "record.json").read_text())
    if change is not None:
        change(record)
    if statement:
        record["provenance"] = provenance.field(key)
    else:
        record.pop("provenance", None)
        (run_dir / "provenance.intoto.jsonl").unlink(missing_ok=True)
    files = {p.relative_to(run_dir).as_posix(): p for p in sorted(run_dir.rglob("*")) if p.is_file() and p.relative_to(run_dir).as_posix() not in UNSEALED}
    data, seal = sealed_bytes(record, files)
    if statement:
        (run_dir / "provenance.intoto.jsonl").write_bytes(statement_bytes(record, seal, run_dir, key))
    (run_dir / "record.json").write_bytes(data)
    (run_dir / "record.sha256").write_text(seal + "\n")
    return seal


def strip_checkpoint_formats(run_dir: Path) -> None:
    """Save every checkpoint again without the record format its state holds (the witness), sidecars made to match."""
    import torch

    for path in sorted((run_dir / "checkpoints").glob("*.pt")):
        state = torch.load(path, map_location="cpu", weights_only=True)
        state.pop("record_format", None)
        torch.save(state, path)
        path.with_name(path.name + ".sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest() + "\n")


def kinds(result) -> list[str]:
    return [p["kind"] for p in result.json()["problems"]]


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """The honest signer's key pair (the default key, as `veritrain keys init` makes it) and a forger's key of their own."""
    from veritrain.core import signing_keys

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "honest-config"))
    honest = signing_keys.default_key_path()
    signing_keys.init(honest)
    forger = tmp_path / "forger" / "forger.pem"
    signing_keys.init(forger)
    return {"honest": signing_keys.load(honest), "honest_pub": signing_keys.public_path(honest), "forger": signing_keys.load(forger),
            "forger_pub": signing_keys.public_path(forger)}


@pytest.fixture
def signed(small_run_copy, keys, tmp_path):
    """The small run sealed by its honest owner with their key (as a run sealed when it ends with the key set); the local
    key pair is then moved away, so only what the checker names decides."""
    from veritrain.records.record import read_record, thawed, write_record

    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    seal = write_record(run_dir, thawed(read_record(run_dir)))
    public = tmp_path / "honest.pub.pem"
    shutil.copy(keys["honest_pub"], public)
    shutil.rmtree(keys["honest_pub"].parent)  # the checker's machine holds no key of its own
    return {"run_dir": run_dir, "workdir": workdir, "seal": seal, "public": public, **keys}


def verify(cli, run, *options: str):
    return cli("verify", run["run_dir"].name, "--workdir", str(run["workdir"]), *options, "--json")


# ---------------------------------------------------------------- absence is not age


def test_an_honest_signed_run_verifies_under_every_policy_and_names_its_signer(cli, signed):
    plain = cli("verify", signed["run_dir"].name, "--workdir", str(signed["workdir"]), "--public-key", str(signed["public"]))
    assert plain.code == 0, plain.stdout + plain.stderr
    fingerprint = signed["honest"].public.fingerprint
    assert f"signer: key {fingerprint} (not in your trusted keys); signature checked with --public-key" in plain.stdout
    assert "format: judged under record format 2 (declared 2; this veritrain writes 2)" in plain.stdout
    for options in (["--min-format", "1"], ["--expect", signed["seal"]], ["--public-key", str(signed["public"]), "--require-signature"]):
        assert verify(cli, signed, *options).code == 0, options


def test_stripping_the_provenance_statement_fails_by_the_records_format_and_by_policy(cli, signed):
    forge(signed["run_dir"], statement=False)
    assert verify(cli, signed).code == 1 and "format_requires" in kinds(verify(cli, signed))  # no key needed: format 1 requires it
    caught = verify(cli, signed, "--public-key", str(signed["public"]))
    assert caught.code == 1 and "signature_required" in kinds(caught)
    checked = cli("check", signed["run_dir"].name, "--workdir", str(signed["workdir"]), "--public-key", str(signed["public"]), "--json")
    rows = {r["id"]: r for r in checked.json()["items"]}
    assert checked.code == 1 and rows["provenance_signed"]["status"] == "fail" and rows["run_verifies"]["status"] == "fail"
    assert "sealed before" not in rows["provenance_signed"]["detail"]  # a format-1 record is never called an older one


def test_stripping_the_best_step_fails_by_the_records_format(cli, signed):
    """Without `training.best_step` best.pt would be judged by its epoch, whose last entry may be a later, worse state
    than the one validation chose (validations inside an epoch): format 2 requires the step."""
    record = json.loads((signed["run_dir"] / "record.json").read_text())
    assert record["record_format"] == 2 and record["training"]["best_step"] >= 1

    def strip(record):
        del record["training"]["best_step"]

    forge(signed["run_dir"], strip)
    caught = verify(cli, signed)
    assert caught.code == 1 and "format_requires" in kinds(caught), caught.stdout
    assert any("training.best_step" in p["detail"] for p in caught.json()["problems"])


def test_a_record_presented_as_format_0_is_caught_by_its_checkpoints_then_by_policy(cli, signed):
    def as_format_0(record):
        del record["record_format"]

    forge(signed["run_dir"], as_format_0, statement=False)
    caught = verify(cli, signed)
    assert caught.code == 1 and "format_downgraded" in kinds(caught)  # the checkpoints were written by a format-2 run
    assert caught.json()["format"]["effective"] == 2 and caught.json()["format"]["declared"] == 0

    strip_checkpoint_formats(signed["run_dir"])  # the thorough forger rewrites the witnesses too
    forge(signed["run_dir"], statement=False)
    passed = verify(cli, signed)
    assert passed.code == 0  # indistinguishable from a run made before formats: the threat model says so
    assert "provenance statement" in " ".join(n["check"] for n in passed.json()["not_checked"])
    shown = cli("verify", signed["run_dir"].name, "--workdir", str(signed["workdir"]))
    assert "judged under record format 0" in shown.stdout and "unchecked under it: the provenance statement" in shown.stdout
    for options in (["--public-key", str(signed["public"])], ["--min-format", "1"], ["--require-signature"], ["--expect", signed["seal"]]):
        assert verify(cli, signed, *options).code == 1, options


def test_an_unsigned_statement_in_place_of_the_signed_one_fails_when_a_signature_is_required(cli, signed):
    forge(signed["run_dir"], key=None)
    assert verify(cli, signed).code == 0  # a consistent unsigned re-seal: only a signature or the published seal tells
    for options in (["--public-key", str(signed["public"])], ["--require-signature"]):
        caught = verify(cli, signed, *options)
        assert caught.code == 1 and "signature_required" in kinds(caught), options
    rows = {r["id"]: r for r in cli("check", signed["run_dir"].name, "--workdir", str(signed["workdir"]), "--public-key",
                                    str(signed["public"]), "--json").json()["items"]}
    assert rows["provenance_signed"]["status"] == "fail" and "unsigned" in rows["provenance_signed"]["detail"]


def test_a_result_without_its_trajectory_entry_and_a_raised_accuracy_fails_verify_check_and_audit(cli, signed):
    def raised(record):
        del record["metrics"]["test"]["trajectory_entry"]
        record["metrics"]["test"]["accuracy"] = 0.999

    forge(signed["run_dir"], raised, key=signed["forger"])
    caught = verify(cli, signed)
    assert caught.code == 1 and any("metrics.test.trajectory_entry" in p["detail"] for p in caught.json()["problems"])
    rows = {r["id"]: r for r in cli("check", signed["run_dir"].name, "--workdir", str(signed["workdir"]), "--json").json()["items"]}
    assert rows["results_from_trajectory"]["status"] == "fail" and rows["run_verifies"]["status"] == "fail"
    audited = cli("audit", signed["run_dir"].name, "--workdir", str(signed["workdir"]), "--segments", "1")
    assert audited.code == 1 and "format_requires" in audited.stderr


# ---------------------------------------------------------------- nothing in the workspace is believed


def test_a_planted_state_cache_entry_does_not_make_a_swapped_best_checkpoint_verify(cli, small_run_copy):
    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    record = json.loads((run_dir / "record.json").read_text())
    other = next(f"checkpoints/step-{e['step']}.pt" for e in record["trajectory"][1:]
                 if e["epoch"] != record["training"]["best_epoch"] and (run_dir / f"checkpoints/step-{e['step']}.pt").is_file())
    shutil.copy(run_dir / other, run_dir / "checkpoints" / "best.pt")  # a state of another epoch as the best one
    shutil.copy(run_dir / (other + ".sha256"), run_dir / "checkpoints" / "best.pt.sha256")
    forge(run_dir)
    from veritrain.core.version import __version__

    honest = next(e for e in record["trajectory"] if e["epoch"] == record["training"]["best_epoch"])
    swapped = hashlib.sha256((run_dir / "checkpoints" / "best.pt").read_bytes()).hexdigest()
    for folder in (workdir / ".veritrain" / "cache" / "states",):  # where verify kept its cache before
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{swapped}.json").write_text(json.dumps({"step": honest["step"], "state_sha256": honest["state_sha256"],
                                                            "record_format": 1, "veritrain": __version__, "cache_version": 2}))
    caught = cli("verify", run_dir.name, "--workdir", str(workdir), "--json")
    assert caught.code == 1 and "best_not_best_epoch" in kinds(caught)
    assert sorted(p.name for p in (workdir / ".veritrain" / "cache" / "states").iterdir()) == [f"{swapped}.json"]  # verify keeps none here


def test_a_hand_written_journal_makes_the_run_fail_verify_until_it_is_cleared(cli, small_run_copy):
    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
    journal = workdir / ".veritrain" / "journal" / run_dir.name
    (journal / "old").mkdir(parents=True)
    shutil.copy(run_dir / "metrics.jsonl", journal / "old" / "metrics.jsonl")  # the honest file kept "from before"
    (run_dir / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text().replace("0.", "0.9", 1))
    (journal / "plan.json").write_text(json.dumps({"plan_version": 1, "run_id": run_dir.name, "by": "eval", "seal": small_run_copy.seal,
                                                   "previous_seal": small_run_copy.seal, "write": ["metrics.jsonl"], "remove": [],
                                                   "existed": ["metrics.jsonl"]}))
    caught = cli("verify", run_dir.name, "--workdir", str(workdir), "--expect", small_run_copy.seal, "--json")
    assert caught.code == 1 and "amend_pending" in kinds(caught)
    assert f"veritrain gc --drop-journal {run_dir.name}" in caught.json()["interrupted_amend"]
    rows = {r["id"]: r for r in cli("check", run_dir.name, "--workdir", str(workdir), "--json").json()["items"]}
    assert rows["run_verifies"]["status"] == "fail"


# ---------------------------------------------------------------- one question, one answer


def _forged_copy(run, change) -> None:
    forge(run.run_dir, change)


@pytest.fixture(scope="module")
def nondeterministic(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("nondeterministic") / "ws"
    outcome = in_process_run(workdir, [*FAST_OVERRIDES, "train.epochs=1", "train.deterministic=false"])
    assert outcome.error is None, outcome.error
    return Path(outcome.summary["run_dir"])


def _multi_process(record):
    record["distributed"] = {"world_size": 2, "nodes": 1, "backend": "gloo", "devices": ["cpu", "cpu"], "launch": ["torchrun"]}


def _script_bound(record):
    record["kind"] = "script"
    record["script"] = {"file": "config.yaml", "sha256": "0" * 64, "argv": ["train.py"], "cwd": "/nowhere", "executable": "python",
                        "deterministic": True, "checkpoints": {"keep_last": 2, "audit_every": 0}}
    record["guarantee"] = {"level": "bound", "reasons": ["the data order did not come from run.batches"]}


@pytest.mark.parametrize("case", ["deterministic", "nondeterministic", "multi_process", "script_bound", "script_elsewhere"])
def test_check_and_audit_agree_on_whether_a_run_can_be_audited(cli, case, small_run_copy, nondeterministic, tmp_path):
    if case == "nondeterministic":
        run_dir, workdir = nondeterministic, nondeterministic.parent.parent
    elif case == "script_elsewhere":  # a replayable script's run, imported where its working directory is not
        workdir = tmp_path / "imported"
        archive = Path(__file__).parent / "fixtures" / "legacy" / "format0-script.tar.gz"
        run_dir = workdir / "runs" / cli("import", str(archive), "--workdir", str(workdir), "--json").json()["run_id"]

        def elsewhere(record):
            record["script"]["cwd"] = str(tmp_path / "where-it-ran")  # not on this machine

        forge(run_dir, elsewhere)
    else:
        run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir
        if case == "multi_process":
            forge(run_dir, _multi_process)
        if case == "script_bound":
            forge(run_dir, _script_bound)
    rows = {r["id"]: r for r in cli("check", run_dir.name, "--workdir", str(workdir), "--json").json()["items"]}
    audited = cli("audit", run_dir.name, "--workdir", str(workdir), "--segments", "1", "--json")
    row = rows["auditable"]
    if row["status"] == "pass":
        assert audited.code == 0, audited.stderr
    else:
        assert audited.code == 2, (case, audited.stderr)
        assert row["detail"] in audited.stderr.replace("\n", " ") or audited.json()["error"]["message"].endswith(row["detail"])
    assert (case == "deterministic") == (row["status"] == "pass"), (case, row)


def test_beating_the_baseline_is_one_judgement_and_an_unknown_metric_never_passes(cli, small_run_copy):
    from veritrain.core.baselines import judge

    regression = {"results": {"mean": {"rmse": 0.0001}}, "margin": 0.0}
    assert judge({"rmse": 4.48}, regression).status == "unknown"
    declared = {**regression, "judged_by": {"metric": "rmse", "goal": "min", "baseline": "mean"}}
    assert judge({"rmse": 4.48}, declared).status == "does_not_beat" and judge({"rmse": 0.00001}, declared).status == "beats"
    assert "is not 0 below the mean baseline's 0.0001" in judge({"rmse": 4.48}, declared).warning

    def regression_run(record):
        record["metrics"]["test"] = {**record["metrics"]["test"], "rmse": 4.48}
        del record["metrics"]["test"]["accuracy"]
        record["baselines"] = regression

    forge(small_run_copy.run_dir, regression_run)
    rows = {r["id"]: r for r in cli("check", small_run_copy.run_dir.name, "--workdir", str(small_run_copy.workdir), "--json").json()["items"]}
    assert rows["beats_baseline"]["status"] == "missing" and "not judged" in rows["beats_baseline"]["detail"]


# ---------------------------------------------------------------- keys that mean something


def test_a_run_re_signed_by_another_key_names_that_key_and_fails_a_required_signer(cli, signed, tmp_path):
    forge(signed["run_dir"], key=signed["forger"])
    shown = cli("verify", signed["run_dir"].name, "--workdir", str(signed["workdir"]))
    assert shown.code == 0  # nothing was required: but the console says who signed
    assert f"signer: key {signed['forger'].public.fingerprint} (not in your trusted keys)" in shown.stdout
    trusted = tmp_path / "trusted-keys"
    trusted.write_text(f"# the team\nalice {signed['honest'].public.fingerprint}\n")
    for options in (["--public-key", str(signed["public"])], ["--trusted-keys", str(trusted)], ["--require-signature"]):
        caught = verify(cli, signed, *options)
        assert caught.code == 1 and {"provenance_signature"} & set(kinds(caught)), options
        rows = {r["id"]: r for r in cli("check", signed["run_dir"].name, "--workdir", str(signed["workdir"]), *options, "--json").json()["items"]}
        assert rows["provenance_signed"]["status"] == "fail", options


def test_the_trusted_keys_file_names_the_signer_and_an_enforced_one_accepts_a_listed_key(cli, signed, tmp_path, monkeypatch):
    pem = signed["public"].read_text()
    listed = tmp_path / "team-keys"
    listed.write_text(f"alice\n{pem}\nbob {signed['forger'].public.fingerprint}\n")
    passed = cli("verify", signed["run_dir"].name, "--workdir", str(signed["workdir"]), "--trusted-keys", str(listed))
    assert passed.code == 0, passed.stderr
    assert f"signer: alice ({signed['honest'].public.fingerprint}); signature checked with trusted keys (alice)" in passed.stdout
    default = Path(str(tmp_path / "honest-config")) / "veritrain" / "trusted-keys"
    default.parent.mkdir(parents=True, exist_ok=True)
    default.write_text(listed.read_text())
    named = cli("verify", signed["run_dir"].name, "--workdir", str(signed["workdir"]))
    assert named.code == 0 and "signer: alice (" in named.stdout  # the default file names, it does not require
    rows = {r["id"]: r for r in cli("check", signed["run_dir"].name, "--workdir", str(signed["workdir"]), "--json").json()["items"]}
    assert rows["provenance_signed"]["status"] == "pass" and rows["provenance_signed"]["detail"].startswith("alice (")


@pytest.mark.parametrize("text, message", [
    ("alice 1234\n", "is not a fingerprint"),
    ("alice\nnot a pem\n", "neither a fingerprint nor a PEM public key"),
    ("a b c\n", "expected `NAME FINGERPRINT`"),
    ("alice " + "a" * 64 + "\nalice " + "b" * 64 + "\n", "listed twice"),
])
def test_a_trusted_keys_file_that_cannot_be_read_is_refused_in_one_line(cli, small_run_copy, tmp_path, text, message):
    path = tmp_path / "keys"
    path.write_text(text)
    refused = cli("verify", small_run_copy.run_dir.name, "--workdir", str(small_run_copy.workdir), "--trusted-keys", str(path))
    assert refused.code == 2 and message in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_min_format_beyond_this_veritrain_is_a_usage_error(cli, small_run_copy):
    refused = cli("verify", small_run_copy.run_dir.name, "--workdir", str(small_run_copy.workdir), "--min-format", "9")
    assert refused.code == 2 and "--min-format: 9" in refused.stderr


# ---------------------------------------------------------------- check what you were given


def test_an_archive_is_verified_without_importing_it(cli, small_run_copy, tmp_path):
    import io
    import tarfile

    archive = tmp_path / "run.tar.gz"
    made = cli("archive", small_run_copy.run_dir.name, "--workdir", str(small_run_copy.workdir), "-o", str(archive), "--with-data")
    assert made.code == 0, made.stderr
    elsewhere = tmp_path / "reader"
    elsewhere.mkdir()
    checked = cli("verify", str(archive), "--json", cwd=elsewhere)
    assert checked.code == 0, checked.stderr
    assert checked.json()["run_id"] == small_run_copy.run_dir.name and checked.json()["with_data"] is True
    assert list(elsewhere.iterdir()) == []  # no workspace was made
    assert cli("verify", str(archive), "--min-format", "1").code == 0
    assert cli("verify", str(archive), "--require-signature").code == 1  # the small run is unsigned

    forged = tmp_path / "forged.tar.gz"  # one member's bytes changed, the record left as it was
    with tarfile.open(archive) as source, tarfile.open(forged, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None
            if data is not None and member.name.endswith("metrics.jsonl"):
                data = data.replace(b"0.", b"1.", 1)  # the same size: only its hash tells
            target.addfile(member, io.BytesIO(data) if data is not None else None)
    refused = cli("verify", str(forged), "--json")
    assert refused.code == 1 and "does not match its hash in the record" in refused.json()["error"]["message"]
    (tmp_path / "notes.txt").write_text("not an archive")
    assert cli("verify", str(tmp_path / "notes.txt")).code == 2


def test_a_lowered_baseline_passes_check_and_fails_the_audit_that_fits_it_again(cli, small_run_copy):
    run_dir, workdir = small_run_copy.run_dir, small_run_copy.workdir

    def lowered(record):
        record["baselines"]["results"]["logistic_regression"]["accuracy"] = 0.05
        record["baselines"].pop("warning", None)

    forge(run_dir, lowered)
    rows = {r["id"]: r for r in cli("check", run_dir.name, "--workdir", str(workdir), "--json").json()["items"]}
    assert rows["beats_baseline"]["status"] == "pass"  # the record says so, and verify cannot tell
    audited = cli("audit", run_dir.name, "--workdir", str(workdir), "--segments", "1", "--json")
    assert audited.code == 1, audited.stderr
    baselines = next(r for r in audited.json()["results"] if r["what"] == "baselines")
    assert baselines["verdict"] == "differs" and "logistic_regression.accuracy: recorded 0.05" in baselines["detail"]
