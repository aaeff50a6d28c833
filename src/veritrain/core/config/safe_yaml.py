"""The hardened YAML reader of config files and `--set` values: `yaml.safe_load` within limits on what a file
may be (a regular file of at most 1 MiB) and make (nesting, values once aliases expand, duplicate keys), each
refusal a one-line `ConfigError` naming the file and the line or key path."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from veritrain.core.config.quoting import key_text, kind, shown_value
from veritrain.core.errors import ConfigError

# What a config file may be and make. A config is a few KiB with a few levels of nesting; these limits refuse,
# before anything is built, what only a mistake or an attack produces: a device or FIFO given as the file, a
# huge file, nesting that exhausts the stack, an alias bomb ("billion laughs") that expands to gigabytes.
MAX_CONFIG_BYTES = 1 << 20  # 1 MiB
MAX_NESTING = 32  # levels of mappings and lists, aliases expanded; configs use 2-4 (model.kwargs may use more)
MAX_VALUES = 20_000  # keys and values in a file or --set value, aliases expanded (a class list of 10,000 fits)


def read_yaml(path: Path) -> dict[str, Any]:
    where = str(path)
    try:
        info = os.stat(path)  # follows a symlink: what counts is what would be read
    except FileNotFoundError:
        raise ConfigError(where, None, "file not found; give the path of a YAML config, or none for the built-in default") from None
    except (OSError, ValueError) as err:
        raise ConfigError(where, None, f"cannot read the file ({err.__class__.__name__}: {err}); check the path and its permissions") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(where, None, "is a folder; give the path of a YAML config file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(where, None, f"is {_file_kind(info.st_mode)}, not a regular file; give the path of a YAML config file")
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(where, None, f"is {info.st_size:,} bytes; a config is at most {MAX_CONFIG_BYTES:,} bytes (1 MiB), keep data out of it")
    try:
        # O_NONBLOCK: should a FIFO replace the file after the stat, opening it must not wait for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ConfigError(where, None, "is not a regular file; give the path of a YAML config file")
            content = file.read(MAX_CONFIG_BYTES + 1)
        text = content.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(where, None, f"cannot read the file ({err.__class__.__name__}: {err}); check its permissions and encoding (UTF-8)") from None
    if len(content) > MAX_CONFIG_BYTES:
        raise ConfigError(where, None, f"is larger than {MAX_CONFIG_BYTES:,} bytes (1 MiB); a config is a few KiB, keep data out of it")
    try:
        data = parse_yaml(text, where, [])
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        location = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(where, location, f"invalid YAML: {problem}; fix the syntax there") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(where, None, f"expected a mapping of keys (seed, data, model, ...) at the top level, got {kind(data)}")
    return data


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


class _ConfigLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses what a config never needs and an attack uses, before it is built: nesting
    deeper than MAX_NESTING (the composer recurses), more than MAX_VALUES nodes (after alias expansion: an alias
    bomb), a key given twice in one mapping (YAML would keep the last silently), a value Python cannot hold (an
    integer of 5,000 digits, a date that does not exist). Each refusal is a ConfigError naming the key path."""

    def __init__(self, text: str, source: str, prefix: list[str]):
        super().__init__(text)
        self.config_source, self.key_prefix = source, prefix
        self.key_path: list[str] = []  # keys and list indices from the value's root to the node being composed
        self.composed_nodes = 0

    def refuse(self, path: list[str], problem: str) -> ConfigError:
        return ConfigError(self.config_source, key_text(self.key_prefix + path) or None, problem)

    def compose_node(self, parent: Optional[yaml.Node], index: Union[yaml.Node, int, None]) -> Optional[yaml.Node]:
        if parent is None:
            return super().compose_node(parent, index)  # pyright: ignore[reportArgumentType]  (None at the root, see below)
        self.composed_nodes += 1
        self.key_path.append(index.value if isinstance(index, yaml.ScalarNode) else "?" if index is None else str(index))
        try:
            if len(self.key_prefix) + len(self.key_path) > MAX_NESTING and self.check_event(yaml.CollectionStartEvent):
                raise self.refuse(self.key_path, f"nested deeper than {MAX_NESTING} levels; a config needs a few (section, key, value)")
            if self.composed_nodes > MAX_VALUES:
                raise self.refuse(self.key_path, f"more than {MAX_VALUES:,} keys and values; a config is a few hundred, keep data out of it")
            # the stubs type `index` as int; PyYAML passes the key node of a mapping value, an int in a sequence, None at the root
            return super().compose_node(parent, index)  # pyright: ignore[reportArgumentType]
        finally:
            self.key_path.pop()

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # e.g. int() past 4,300 digits, a date that does not exist
            mark = node.start_mark
            reason = str(err).partition(";")[0]
            location = f"line {mark.line + 1}, column {mark.column + 1}" if self.config_source != "--set" else key_text(self.key_prefix)
            raise ConfigError(self.config_source, location, f"cannot read {shown_value(str(node.value))} as {node.tag.rpartition(':')[2]} ({reason}); fix the value, or quote it if it is text") from None

    def check_tree(self, node: yaml.Node) -> None:
        """Walk the composed nodes as the built value will be, aliases expanded, within the limits."""
        budget = MAX_VALUES

        def visit(node: yaml.Node, path: list[str]) -> None:
            nonlocal budget
            budget -= 1
            if budget < 0:
                raise self.refuse(path, f"more than {MAX_VALUES:,} keys and values once aliases (*name) are expanded; write the values out")
            if len(self.key_prefix) + len(path) > MAX_NESTING and isinstance(node, yaml.CollectionNode):
                raise self.refuse(path, f"nested deeper than {MAX_NESTING} levels once aliases (*name) are expanded; a config needs a few")
            if isinstance(node, yaml.ScalarNode):
                try:
                    node.value.encode("utf-8")
                except UnicodeEncodeError:  # "\ud800" is a valid YAML escape but no character
                    raise self.refuse(path, f"{shown_value(node.value)} is not text: an escape makes a lone surrogate; write the character itself") from None
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key, value in node.value:
                    name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                    if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                        if (key.tag, key.value) in seen:
                            raise self.refuse(path + [name], "key given twice in one mapping; keep one (YAML would silently use the last)")
                        seen.add((key.tag, key.value))
                    visit(key, path + [name])
                    visit(value, path + [name])
            elif isinstance(node, yaml.SequenceNode):
                for index, item in enumerate(node.value):
                    visit(item, path + [str(index)])

        visit(node, [])


def parse_yaml(text: str, source: str, prefix: list[str]) -> Any:
    """yaml.safe_load within the limits of _ConfigLoader; `prefix` is the key path of a --set value."""
    loader = _ConfigLoader(text, source, prefix)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        loader.check_tree(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    """A YAML file other than a config (a search space), read within the same limits: a mapping, or ConfigError."""
    return read_yaml(Path(path))


def load_yaml_text(text: str, source: str) -> Any:
    """A short YAML text given on the command line (`--enqueue '{optim.lr: 0.01}'`), within the same limits."""
    try:
        return parse_yaml(text, source, [])
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(source, None, f"invalid YAML: {problem}") from None
