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
    commands_page = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    examples = commands_page.split("## Examples", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    commands = all_commands()
    assert {path for path, _ in commands} >= {"veritrain run", "veritrain config show", "veritrain config keys"}
    for path, _ in commands:
        assert f"| `{path}" in readme, f"README's command list lacks {path}"
        assert f"| `{path}" in commands_page, f"docs/commands.md's table of what each command does lacks {path}"
        assert any(line == path or line.startswith(path + " ") for line in examples), f"docs/commands.md has no example of {path}"


def test_docs_cli_is_generated_from_the_commands():
    from veritrain.cli_reference import REGENERATE, reference_markdown

    written = (ROOT / "docs" / "cli.md").read_bytes()
    assert written == reference_markdown(root_group).encode("utf-8"), f"docs/cli.md is stale: run `{REGENERATE}`"
    text = written.decode("utf-8")
    for path, command in all_commands():
        section = text.split(f"\n## `{path}`\n", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            if isinstance(param, click.Option):
                assert f"`{param.opts[0]}" in section, (path, param.opts)
    assert "| 130 |" in text and "| 143 |" in text and "| 2 |" in text


def test_the_cli_reference_walks_any_click_group():
    @click.group()
    def tool() -> None:
        """A tool."""

    @tool.group("things")
    def things() -> None:
        """Things to do."""

    @things.command("make")
    @click.argument("name", metavar="NAME")
    @click.option("--size", type=click.IntRange(min=1, max=9), default=3, help="How big | how wide.")
    @click.option("--kind", type=click.Choice(["a", "b"]), default=None, help="Which kind.")
    @click.option("--tag", "tags", multiple=True, metavar="TAG", help="A tag (repeatable).")
    @click.option("--dry-run", is_flag=True, help="Make nothing.")
    @click.option("--secret-knob", hidden=True, help="Not shown.")
    def make(name, size, kind, tags, dry_run, secret_knob) -> None:
        """Make a thing.

        \b
        Example:
          tool things make cup --size 2
        """

    @tool.command("internal", hidden=True)
    def internal() -> None:
        """Not shown."""

    from veritrain.cli_reference import reference_markdown

    text = reference_markdown(tool, "tool")
    assert text == reference_markdown(tool, "tool")  # deterministic
    assert "## `tool things make`" in text and "[`tool things`](#tool-things)" in text
    assert "tool things make [OPTIONS] NAME" in text
    assert "| `--size` | integer ≥ 1, ≤ 9 | `3` | How big \\| how wide. |" in text
    assert "| `--kind` | one of `a`, `b` | — | Which kind. |" in text
    assert "| `--tag TAG` | text, repeatable | — | A tag (repeatable). |" in text
    assert "| `--dry-run` | flag | off | Make nothing. |" in text
    assert "| `NAME` | text, required | — | — |" in text
    assert "```sh\ntool things make cup --size 2\n```" in text
    assert "internal" not in text and "secret" not in text and "Not shown" not in text


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
    from veritrain.core.version import __version__

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
