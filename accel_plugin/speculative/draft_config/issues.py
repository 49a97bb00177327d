"""A problem of the draft YAML and where it is: :class:`ConfigIssue` (key, message,
file:line), :class:`DraftConfigError` (every issue found, raised together), and the
map from a key path to its line in the file."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

__all__ = ["ConfigIssue", "DraftConfigError", "key_lines", "line_of"]


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: the key path (``domains.code.draft``), a message, where it is."""

    key: str
    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = self.file or "<config>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where}: {self.key or '(top level)'}: {self.message}"


class DraftConfigError(ValueError):
    """The draft YAML cannot be used; ``issues`` lists every problem found."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = issues
        lines = "\n".join(f"  {issue}" for issue in issues)
        super().__init__(f"invalid draft config ({len(issues)} problem(s)):\n{lines}")


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Key path -> 1-based line, from the YAML node tree (best effort)."""
    lines: dict[tuple[str, ...], int] = {}
    walked: set[int] = set()  # an alias is walked once (nested aliases would be exponential)

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in walked:
            return
        walked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = (*path, str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?")
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, str(i)))
                lines[(*path, str(i))] = item.start_mark.line + 1

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def line_of(lines: dict[tuple[str, ...], int], path: tuple[str, ...]) -> int | None:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None

