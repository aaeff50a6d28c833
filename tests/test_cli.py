"""The command line contract: documented commands, --version, usage errors as one line with exit 2."""

from __future__ import annotations

import click

from conftest import ROOT
from veritrain.cli import cli as root_group


def all_commands(group: click.Group = root_group, prefix: str = "veritrain") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        if isinstance(command, click.Group):
            found.extend(all_commands(command, path))
        else:
            found.append((path, command))
    return found


def test_every_command_is_in_the_readme_with_an_example():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = all_commands()
    assert {path for path, _ in commands} >= {"veritrain run", "veritrain config show", "veritrain config keys"}
    for path, _ in commands:
        assert f"`{path}" in readme, f"README's command table lacks {path}"
        assert any(line.startswith(path) for line in readme.splitlines()), f"README has no example of {path}"


def test_every_command_has_help_with_an_example(cli):
    for path, command in all_commands():
        result = cli(*path.split()[1:], "--help")
        assert result.code == 0, path
        assert "Example" in result.stdout and "--workdir" in result.stdout, path
        if any(p.name == "as_json" for p in command.params) is False:
            continue
        assert "--json" in result.stdout


def test_top_level_help_lists_commands(cli):
    result = cli("--help")
    assert result.code == 0
    for name in root_group.commands:
        assert name in result.stdout


def test_version(cli):
    from veritrain import __version__

    result = cli("--version")
    assert result.code == 0 and result.stdout.strip() == f"veritrain {__version__}"


def test_unknown_command_and_option_are_one_line_exit_2(cli):
    result = cli("trian")
    assert result.code == 2
    assert result.stderr == "error: veritrain: No such command 'trian'; did you mean 'train'? (see `veritrain --help`)\n"
    result = cli("run", "--frobnicate", "3")
    assert result.code == 2
    assert result.stderr == "error: veritrain run: No such option '--frobnicate' (see `veritrain run --help`)\n"


def test_config_commands_do_not_import_torch(cli):
    code = (
        "import sys; from veritrain.cli import main\n"
        "try:\n    main(['config', 'show', '--json'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'torch' not in sys.modules, 'config show imported torch'\n"
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
