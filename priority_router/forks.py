"""What a forked child must not inherit: locks that other threads held, and threads.

Only the forking thread lives on in a child.  A lock another thread of the parent held at
that moment stays held in the child for good, and prefork pools fork all the time (every
``--max-tasks-per-child`` recycle, every replaced process) while the worker's gate thread
holds locks across Redis and broker calls.  An object owning such a lock registers here,
and each child calls its ``after_fork()`` before anything else runs in it.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    def after_fork(self) -> None:
        """In a forked child: start with free locks, and without the parent's threads."""


_OWNERS: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def renew_after_fork(owner: ForkAware) -> None:
    """Call ``owner.after_fork()`` in every child forked from now on, while ``owner`` lives."""
    _OWNERS.add(owner)


def _in_child() -> None:
    for owner in list(_OWNERS):
        owner.after_fork()


os.register_at_fork(after_in_child=_in_child)
