"""How the CLI finds the app (ops/cli_context.py)."""

from __future__ import annotations

from click.testing import CliRunner

from priority_router.ops.cli import main


def test_an_app_that_cannot_be_imported_is_named_with_where_to_run_from() -> None:
    result = CliRunner().invoke(main, ["-A", "no_such_project_here", "status"])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "cannot load the Celery app 'no_such_project_here'" in said
    assert "run from the directory that holds the module (as for celery -A) or put it on PYTHONPATH" in said
