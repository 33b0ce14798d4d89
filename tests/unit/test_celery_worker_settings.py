"""How the router knows a ``celery worker`` command is starting (its log not yet set up)."""

from __future__ import annotations

import click
from celery.bin.celery import celery as celery_group
from celery.bin.worker import worker as worker_command

from priority_router.integration import celery_internals


def test_the_worker_command_is_told_by_celerys_own_commands() -> None:
    """While the ``celery`` group loads the app for ``worker`` (``invoked_subcommand``) and
    while ``worker`` reads its options, whose defaults read the app's configuration."""
    assert not celery_internals.in_worker_command()
    with click.Context(celery_group, info_name="celery") as root:
        assert not celery_internals.in_worker_command()
        root.invoked_subcommand = "worker"
        assert celery_internals.in_worker_command()
        with click.Context(worker_command, info_name="worker", parent=root):
            assert celery_internals.in_worker_command()
    with click.Context(celery_group, info_name="celery") as root:
        root.invoked_subcommand = "beat"
        assert not celery_internals.in_worker_command()
    assert not celery_internals.in_worker_command()
