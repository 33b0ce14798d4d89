"""The command's three descriptions of itself agree with what it accepts: the usage lines in
``ops/cli.py``'s and ``ops/tier_cli.py``'s docstrings, ``tier --help`` and docs/cli.md name
only commands and options that exist, and every command is in each of them."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from priority_router.ops import cli, tier_cli
from priority_router.ops.cli import main

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = (ROOT / "docs" / "cli.md").read_text()
#: Options every subcommand takes from the group, before or after its name.
GROUP_OPTIONS = {opt for param in main.params for opt in param.opts}
#: What the tier group's summary leaves to the store options and `-A`, as every command does.
SHARED_OPTIONS = {"--mode", "--redis-url", "--key-prefix", "--reset-interval", "--app", "-A", "--help", "-h"}


def _usage_lines(text: str) -> list[str]:
    return [line.split("#")[0] for line in re.findall(r"^\s*priority-router (.+)$", text, flags=re.M)]


def _page_block() -> str:
    found = re.search(r"```sh\n(.*?)```", CLI_PAGE, flags=re.S)
    assert found is not None, "docs/cli.md has no usage block"
    return found.group(1)


SOURCES = {
    "ops/cli.py docstring": cli.__doc__ or "",
    "ops/tier_cli.py docstring": tier_cli.__doc__ or "",
    "docs/cli.md": _page_block(),
}


def _resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    """The (sub)command the words name, and the words after its name."""
    command: click.Command = main
    rest = list(words)
    while isinstance(command, click.Group) and rest and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
    return command, rest


def _options(command: click.Command) -> set[str]:
    return {
        opt
        for param in command.params
        if isinstance(param, click.Option)
        for opt in (*param.opts, *param.secondary_opts)
    }


def _is_option(word: str) -> bool:
    return word.startswith("-") and re.fullmatch(r"-[\d.]+", word) is None


def _segments(line: str) -> list[list[str]]:
    """A usage line's alternatives (`tier set X | tier unset X`), each as its words."""
    segments = []
    for part in line.split("|"):
        words = [w.strip("[]().,") for w in part.split()]
        segments.append([w for w in words if w])
    return segments


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_option_a_usage_line_names_exists(source: str) -> None:
    unknown = []
    for line in _usage_lines(SOURCES[source]):
        previous: click.Command = main
        for words in _segments(line):
            command, rest = _resolve(words)
            if command is main:  # `| --all --yes`: an alternative of the previous command
                command, rest = previous, words
            previous = command
            accepted = _options(command) | GROUP_OPTIONS
            unknown += [f"{command.name}: {w}" for w in rest if _is_option(w) and w not in accepted]
    assert not unknown, f"{source} names options the command does not take: {unknown}"


@pytest.mark.parametrize(
    ("source", "group", "commands"),
    [
        ("ops/cli.py docstring", [], main.commands),
        ("docs/cli.md", [], main.commands),
        ("ops/tier_cli.py docstring", ["tier"], tier_cli.tier.commands),
    ],
)
def test_every_command_is_described(
    source: str, group: list[str], commands: dict[str, click.Command]
) -> None:
    depth = len(group)
    named = {
        words[depth]
        for line in _usage_lines(SOURCES[source])
        for words in _segments(line)
        if len(words) > depth and words[:depth] == group
    }
    assert set(commands) <= named, f"{source} does not describe: {sorted(set(commands) - named)}"


def test_the_tier_summary_lists_every_option_of_tier_set() -> None:
    summary = tier_cli.tier.help or ""
    listed = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", summary))
    expected = _options(tier_cli.tier.commands["set"]) - SHARED_OPTIONS
    assert listed - {"--json"} == expected
