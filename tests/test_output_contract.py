"""The output contract: with `--json`, exactly one JSON document on stdout, for failures too.

Every command that takes a RUN is given one that does not exist; stdout must parse as one JSON document,
`{"error": {"message", "exit_code"}}`, with the exit code of the contract and the same one line on stderr.
"""

from __future__ import annotations

import json

import pytest

from veritrain import cli

BAD = "nosuchrun"

COMMANDS = [
    ["verify", BAD], ["check", BAD], ["eval", BAD], ["export", BAD], ["baseline", BAD], ["reproduce", BAD],
    ["audit", BAD], ["archive", BAD, "-o", "out.tar.gz"], ["runs", "show", BAD], ["runs", "compare", BAD, BAD],
    ["runs", "note", BAD, "a note"], ["train", "--resume", BAD], ["data", "report", BAD], ["data", "diff", BAD, BAD],
    ["import", "no-such-archive.tar.gz"], ["predict", BAD, "no-such-image.png"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_failure_with_json_prints_one_json_document(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--workdir", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    document = json.loads(out)  # exactly one document: json.loads refuses trailing text
    assert set(document) == {"error"} and set(document["error"]) == {"message", "exit_code"}
    assert exited.value.code == document["error"]["exit_code"] in (1, 2)
    assert err.strip().splitlines()[-1] == f"error: {document['error']['message']}"


def test_a_usage_error_with_json_is_json_too(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["verify", "--no-such-option", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert exited.value.code == 2 and "no-such-option" in document["error"]["message"]


def test_without_json_a_failure_prints_nothing_on_stdout(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["verify", BAD, "--workdir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert out == "" and err.strip().startswith("error: ")


def test_reports_go_to_stdout_and_under_json_to_stderr(tmp_path, capsys):
    from veritrain.core import logs

    with pytest.raises(SystemExit) as exited:
        cli.main(["runs", "list", "--workdir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert exited.value.code == 0 and out.startswith(f"0 run(s) in {tmp_path / 'runs'}") and err == ""  # a table: stdout
    with pytest.raises(SystemExit):
        cli.main(["runs", "list", "--workdir", str(tmp_path), "--json"])
    logs.report("run R verified")  # what a command reports after its --json document
    out, err = capsys.readouterr()
    assert json.loads(out) == {"runs": []} and err == "run R verified\n"
    with pytest.raises(SystemExit):
        cli.main(["runs", "list", "--workdir", str(tmp_path)])  # the next command without --json reports on stdout again
    logs.report("run R verified")
    out, err = capsys.readouterr()
    assert out.endswith("run R verified\n") and err == ""
