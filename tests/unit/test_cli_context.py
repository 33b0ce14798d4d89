"""How the CLI finds the app and prints its tables (ops/cli_context.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from priority_router.ops import cli_context
from priority_router.ops.cli import main


def test_an_app_that_cannot_be_imported_is_named_with_where_to_run_from() -> None:
    result = CliRunner().invoke(main, ["-A", "no_such_project_here", "status"])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "cannot load the Celery app 'no_such_project_here'" in said
    assert "run from the directory that holds the module (as for celery -A) or put it on PYTHONPATH" in said


def test_a_piped_table_keeps_a_row_a_line_unless_columns_gives_a_width(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    table = Table("check", "fix")
    table.add_row("acks_late", "set task_acks_late = True " * 20)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli_context, "console", Console())
    cli_context.print_table(table)
    assert max(map(len, capsys.readouterr().out.splitlines())) > 500
    # A CI log or a pager: COLUMNS=80 wraps the long cells at 80 (Rich reads it at start).
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(cli_context, "console", Console())
    cli_context.print_table(table)
    assert max(map(len, capsys.readouterr().out.splitlines())) <= 80
