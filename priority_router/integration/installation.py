"""The record ``install`` keeps on each app, and the one way to find an app's router.

``install.py`` writes the record; the worker-side modules (``endings.py``, ``gate.py``)
find the router's working parts (``engine.py``) through :func:`installed_engine`; the
router itself, which the integration never uses, is found by ``router.installed_router``.
This module imports nothing of the package at run time, so every module can use it
without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..engine import Engine
    from ..errors import ConfigurationError
    from .pools import WorkerPool
    from .publish import PublishReceiver


class Thread(Protocol):
    """A worker-side thread the installation starts and ``uninstall`` stops (the gate's,
    ``gate.GateThread``; the max_wait sweeper, ``starvation.Sweeper``; a green worker's
    ``green_restore.UnackedSweep``)."""

    def stop(self) -> None: ...


@dataclass
class Installation:
    """What ``install`` set up on one app, so that ``uninstall`` can take it all down."""

    #: The router the user installed (a ``PriorityRouter``: the layer above, which only
    #: hands it back, ``router.installed_router``), and its working parts, which the
    #: integration uses.
    router: object
    engine: Engine
    receiver: PublishReceiver
    #: Warnings already given for this app (each is said once).
    warned: set[str] = field(default_factory=set)
    #: The app's ``priority_router_*`` settings the router last followed.
    celery_settings: dict[str, Any] | None = None
    #: The worker's max_wait sweeper (Redis), once the worker is ready.
    sweeper: Thread | None = None
    #: The gate's thread (leases, releases, borrowing), once the worker is ready.
    gate: Thread | None = None
    #: A green worker's sweep of killed workers' unacked documents (Redis), once it is ready.
    unacked_sweep: Thread | None = None
    #: The pool of the worker this app runs in, once a worker starts (``pools.py``).
    pool: WorkerPool | None = None
    #: The values the router set in the app's configuration, by key: not the user's choice.
    applied: dict[str, object] = field(default_factory=dict)
    #: Why the router could not read the app's ``priority_router_*`` settings when it
    #: last settled on them (its publishes then go out unrouted), else None.
    settings_error: ConfigurationError | None = None
    #: A ``celery worker`` is starting in this process (it sent ``celeryd_init``). Its log,
    #: ``--logfile`` included, is set up only by ``celeryd_after_setup``, before it consumes:
    #: what the router says at start waits for that, or it would go to a bare stderr.
    logs_later: bool = False
    #: Why that worker must not start, said and acted on at ``celeryd_after_setup``.
    refusal: str | None = None


#: Where an app keeps its installation: read on every publish, so a plain attribute
#: lookup rather than a WeakKeyDictionary (which builds a weak reference per lookup).
ATTRIBUTE = "_priority_router_installation"


def installation_of(app: object) -> Installation | None:
    """The installation on ``app`` (a Celery app), None when no router is installed on it."""
    namespace = getattr(app, "__dict__", None)  # None for None, or an object without one
    installation: Installation | None = namespace.get(ATTRIBUTE) if namespace is not None else None
    return installation


def installed_engine(app: object) -> Engine | None:
    """The working parts of the router installed on ``app``, if any."""
    installation = installation_of(app)
    return installation.engine if installation is not None else None
