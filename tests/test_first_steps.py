"""The newcomer's tour from the README, in its order, after the demo run: every command succeeds without a
misleading message, and the checklist passes after only the fixes it suggests."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, veritrain


def first_steps() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- first-steps", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_lists_the_tour():
    steps = first_steps()
    assert [s[1] for s in steps] == ["baseline", "export", "predict", "eval", "verify", "reproduce", "check"]


@pytest.mark.slow
def test_the_readme_tour_works_in_order_after_the_demo(tmp_path):
    for folder in ("configs", "examples"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    demo = veritrain("run", "--json", cwd=tmp_path, timeout=900)  # what `make demo` runs
    assert demo.code == 0, demo.stderr
    printed = (Path(demo.json()["run_dir"]) / "record.sha256").read_text().strip()  # the seal the demo printed
    assert "next steps:" in demo.stderr and f"veritrain check {demo.json()['run_id']}" in demo.stderr
    for step in first_steps():
        result = veritrain(*step[1:], cwd=tmp_path, timeout=900)
        shown = result.stdout + result.stderr  # the report (stdout) and the progress and warnings (stderr)
        misleading = [line for line in shown.splitlines() if "--checkpoint" in line or "Traceback" in line]
        assert not misleading, (step, shown)
        if step[1] != "check":
            assert result.code == 0, (step, result.stderr)
        if step[1] == "reproduce":  # evaluation sums exactly: the re-run's metrics are the same numbers, not close ones
            shown = result.stdout + result.stderr  # the table's title may wrap: every verdict in it must be identical
            assert "identical" in shown and "within tolerance" not in shown and "differs" not in shown, shown
    last = veritrain("check", "latest", "--json", cwd=tmp_path)
    for _ in range(3):  # the fixes it suggests, then the check again
        fixes = [item["fix"] for item in last.json()["items"] if item["fix"] and item["fix"].startswith("veritrain ")]
        if not fixes:
            break
        for fix in dict.fromkeys(fixes):
            done = veritrain(*shlex.split(fix)[1:], cwd=tmp_path, timeout=900)
            assert done.code == 0, (fix, done.stderr)
        last = veritrain("check", "latest", "--json", cwd=tmp_path)
    assert last.code == 0, last.stdout
    demo_check = veritrain("check", demo.json()["run_id"], "--json", cwd=tmp_path)
    assert demo_check.code == 0, [i for i in demo_check.json()["items"] if i["status"] != "pass"]
    assert re.search(r"[0-9a-f]{64}", (Path(demo.json()["run_dir"]) / "record.sha256").read_text())
    # the seal the demo printed still holds after the tour, and says what came after it
    kept = veritrain("verify", demo.json()["run_id"], "--expect", printed, cwd=tmp_path)
    assert kept.code == 0, kept.stdout + kept.stderr
    later = [line for line in kept.stdout.splitlines() if line.startswith("amendment ") and "NOT covered" in line]
    assert any(" by export " in line for line in later) and any(" by eval " in line for line in later), kept.stdout
