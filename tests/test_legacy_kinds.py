"""Runs of every kind made by veritrain at commit 57f72b8 (tests/fixtures/legacy/README.md: a script's run, a signed
run, a language model, a run sealed again by later commands, a Lightning run) still verify with this one: each is
imported into a workspace of its own, and only imported and checked, never trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import need_extra

from veritrain.records.record import RECORD_FORMAT

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
PUBLIC_KEY = LEGACY / "format0-signed.pub.pem"

SCRIPT = "20261206-174255-156-11d251"
SIGNED = "20261206-174154-618-9ebe6f"
LM = "20261206-174424-312-173755"
RESEALED = "20261206-174218-765-1763bf"
LIGHTNING = "20261206-174503-173-0bfcf5"
HF = "20261207-020118-156-354f65"  # format1-hf.tar.gz: before Hugging Face state recipe 2

try:
    import lightning  # noqa: F401
    HAVE_LIGHTNING = True
except ImportError:
    HAVE_LIGHTNING = False


def imported(cli, workdir: Path, archive: str, run_id: str) -> dict:
    result = cli("import", str(LEGACY / archive), "--workdir", str(workdir), "--json")
    assert result.code == 0, result.stdout + result.stderr
    assert result.json()["run_id"] == run_id
    return json.loads((workdir / "runs" / run_id / "record.json").read_text())


def verified(cli, workdir: Path, run_id: str, *options: str) -> dict:
    result = cli("verify", run_id, "--workdir", str(workdir), "--json", *options)
    assert result.code == 0, result.stdout + result.stderr
    verdict = result.json()
    assert verdict["ok"] is True and not verdict["problems"], verdict
    return verdict


@pytest.mark.parametrize("archive, run_id", [
    ("format0-script.tar.gz", SCRIPT), ("format0-lm.tar.gz", LM), ("format0-signed.tar.gz", SIGNED),
    ("format0-resealed.tar.gz", RESEALED)])
def test_a_run_of_the_previous_code_verifies_under_format_0_and_says_so(cli, tmp_path, archive, run_id):
    record = imported(cli, tmp_path, archive, run_id)
    assert record["status"] == "completed" and "record_format" not in record
    verdict = verified(cli, tmp_path, run_id)
    assert verdict["format"]["effective"] == 0 and verdict["format"]["declared"] == 0 and verdict["format"]["witnessed"] == 0
    shown = cli("verify", run_id, "--workdir", str(tmp_path))
    assert f"format: judged under record format 0 (declared 0; this veritrain writes {RECORD_FORMAT}); unchecked under it:" in shown.stdout
    refused = cli("verify", run_id, "--workdir", str(tmp_path), "--min-format", "1", "--json")  # a policy can ask for more
    assert refused.code == 1 and [p["kind"] for p in refused.json()["problems"]] == ["format_below_minimum"]


def test_a_signed_run_of_the_previous_code_verifies_with_its_public_key_and_its_signature_is_checked(cli, tmp_path):
    record = imported(cli, tmp_path, "format0-signed.tar.gz", SIGNED)
    assert record["provenance"]["key_fingerprint"] == "f0296790143778eeaa47a9a4c6b3a48a231a81b28d5fd5561081d7bfffb1b9c7"
    assert (tmp_path / "runs" / SIGNED / "export" / "model.sig").is_file()
    verdict = verified(cli, tmp_path, SIGNED, "--public-key", str(PUBLIC_KEY))
    not_checked = {n["check"] for n in verdict.get("not_checked") or []}
    assert not not_checked & {"provenance signature", "export signature"}, verdict["not_checked"]  # both checked with the key
    rows = {}
    for options in ((), ("--public-key", str(PUBLIC_KEY))):
        checked = cli("check", SIGNED, "--workdir", str(tmp_path), "--json", *options)
        assert checked.code in (0, 1), checked.stdout + checked.stderr  # 1: rows of the run itself (a short run, no smoke test)
        rows[options] = next(i for i in checked.json()["items"] if i["id"] == "provenance_signed")
    # with its public key the signature is checked and the row passes; without one nothing is required of it
    assert rows[("--public-key", str(PUBLIC_KEY))]["status"] == "pass", rows
    assert rows[()]["status"] != "fail", rows


def test_a_run_the_previous_code_sealed_again_verifies_against_its_current_seal_only(cli, tmp_path):
    record = imported(cli, tmp_path, "format0-resealed.tar.gz", RESEALED)
    earlier = [entry["seal"] for entry in record["seal_history"]]
    assert [entry["by"] for entry in record["seal_history"]] == ["eval", "export"]
    seal = (tmp_path / "runs" / RESEALED / "record.sha256").read_text().strip()
    assert seal not in earlier
    verified(cli, tmp_path, RESEALED, "--expect", seal)
    for replaced in earlier:
        result = cli("verify", RESEALED, "--workdir", str(tmp_path), "--json", "--expect", replaced)
        assert result.code == 1, result.stdout + result.stderr
        assert result.json()["ok"] is False


def test_a_hugging_face_run_made_before_state_recipe_2_verifies_by_the_recipe_it_was_made_with(cli, tmp_path):
    """Its checkpoint folders were hashed without config.json: read by recipe 1, they still match the trajectory, and
    a weight changed in one of them is still caught."""
    record = imported(cli, tmp_path, "format1-hf.tar.gz", HF)
    assert record["script"]["integration"] == "hf" and "state_recipe" not in record["script"]
    verified(cli, tmp_path, HF)
    folder = tmp_path / "runs" / HF / record["trajectory"][-1]["file"]
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    from veritrain.records.record import read_record, thawed, write_record

    write_record(tmp_path / "runs" / HF, thawed(read_record(tmp_path / "runs" / HF)))  # the forger seals the change in
    forged = cli("verify", HF, "--workdir", str(tmp_path), "--json")
    assert forged.code == 1 and any(p["kind"] == "not_in_trajectory" for p in forged.json()["problems"]), forged.stdout


@pytest.mark.slow  # imports lightning: compatibility, checked in `make test-slow`
def test_a_lightning_run_of_the_previous_code_verifies(cli, tmp_path):
    need_extra(HAVE_LIGHTNING, "the lightning extra (pip install 'veritrain[lightning]')")
    record = imported(cli, tmp_path, "format0-lightning.tar.gz", LIGHTNING)
    assert record["status"] == "completed" and record["guarantee"]["level"] == "replayable"
    verified(cli, tmp_path, LIGHTNING)


@pytest.mark.slow  # an import and a full audit each: compatibility, checked in `make test-slow`
@pytest.mark.parametrize("archive, run_id", [("format0-signed.tar.gz", SIGNED), ("format0-lm.tar.gz", LM)])
def test_a_run_of_the_previous_code_audits_identical_in_the_replay_child(cli, tmp_path, archive, run_id):
    """Replayed by the child process that imports the run's code from copies and hands its states back: the states
    the previous code recorded are reached bit for bit, and its results are computed again alike."""
    imported(cli, tmp_path, archive, run_id)
    audited = cli("audit", run_id, "--segments", "2", "--seed", "1", "--workdir", str(tmp_path), "--json")
    if audited.code == 2 and "this machine cannot replay the run exactly" in audited.stderr:
        pytest.skip(f"this machine is not the kind the fixture was made on: {audited.stderr.strip().splitlines()[-1]}")
    assert audited.code == 0, audited.stdout + audited.stderr
    result = audited.json()
    assert result["verdict"] == "identical" and result["segments_audited"] >= 2
    assert {r["verdict"] for r in result["results"]} <= {"identical", "unchecked"}
    assert any(r["what"].startswith("metrics.") and r["verdict"] == "identical" for r in result["results"])


def test_a_scripts_run_has_no_data_version_to_archive_and_says_so(cli, tmp_path):
    imported(cli, tmp_path, "format0-script.tar.gz", SCRIPT)
    out = tmp_path / "again.tar.gz"
    refused = cli("archive", SCRIPT, "-o", str(out), "--with-data", "--workdir", str(tmp_path))
    assert refused.code == 2 and f"--with-data: run {SCRIPT} has no data version" in refused.stderr and "None" not in refused.stderr
    assert cli("archive", SCRIPT, "-o", str(out), "--workdir", str(tmp_path)).code == 0
