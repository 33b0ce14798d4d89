"""The public entry point: :class:`PriorityRouter`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import redis
from celery import Celery

from .batch import Batch, current_batch
from .config import RouterConfig, env_values
from .decision import Decision
from .engine import Engine, log_end_cost
from .errors import ConfigurationError
from .integration.install import configure_apps
from .integration.install import install as install_router
from .integration.install import uninstall as uninstall_router
from .integration.installation import installation_of
from .integration.publish import PublishReceiver
from .limits import NONE, Limits
from .redact import redact_url
from .store.client_ids import normalize_client_id
from .store.costs import cost_units
from .store.counter import CounterState
from .store.gate import GateState
from .store.writes import in_one_write
from .thresholds import Policy
from .tiers import Tier


class PriorityRouter:
    """Gives every published document a priority from its client's pending count.

    >>> router = PriorityRouter("redis://localhost:6379/0", reset_interval=900)  # doctest: +SKIP
    >>> router.install(app)                                                       # doctest: +SKIP

    Every keyword is a setting of :class:`RouterConfig` (see the configuration
    reference); a bad one raises :class:`ConfigurationError` naming it.  A setting comes
    from, in this order: a keyword here (or ``config``, which gives every setting), a
    ``PRIORITY_ROUTER_<NAME>`` environment variable (read from ``environ``, else
    ``os.environ``), the installed app's ``priority_router_<name>`` Celery setting, the
    default.  Nothing connects until the first check.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        config: RouterConfig | None = None,
        redis_client: redis.Redis | None = None,
        environ: Mapping[str, str] | None = None,
        **settings: Any,
    ) -> None:
        given = env_values(environ)
        given.update(config.as_dict() if config is not None else {})
        given.update(settings)
        if redis_url is not None:
            given["redis_url"] = redis_url
        self._engine = Engine(given, redis_client)

    @classmethod
    def from_config(cls, config: RouterConfig, redis_client: redis.Redis | None = None) -> PriorityRouter:
        """A router with every setting from ``config`` (no environment, no Celery settings)."""
        return cls(config=config, redis_client=redis_client)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        redis_client: redis.Redis | None = None,
        **overrides: Any,
    ) -> PriorityRouter:
        """A router configured from ``PRIORITY_ROUTER_*`` variables (``environ``, else
        ``os.environ``), as the constructor is; ``overrides`` that are not None win."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return cls(redis_client=redis_client, environ=environ, **given)

    @property
    def config(self) -> RouterConfig:
        """The settings in effect: the ones given, then those of the apps it is installed on
        (loading an app's configuration first, if it has not been loaded yet)."""
        self._follow_apps()
        return self._engine.config

    @property
    def policy(self) -> Policy:
        """The threshold table in effect (the ``thresholds`` setting)."""
        return self._engine.policy

    def __repr__(self) -> str:
        return f"<PriorityRouter {redact_url(self.config.redis_url)} prefix={self.config.key_prefix!r}>"

    # -- the counter ------------------------------------------------------------------

    def record(self, client_id: object, task_id: str | None = None, *, cost: float = 1) -> Decision:
        """One counted submission for ``client_id`` of ``cost`` (pages, megabytes, expected
        seconds: any positive unit, 1 by default): the pending count it is checked at (minus
        the costs counted before it) and its priority.

        In ``mode="inflight"`` the document's ``task_id`` is required (it is what
        :meth:`end` takes off again) and ignored otherwise.  Raises
        :class:`CounterUnavailable` when Redis cannot answer, a :class:`PriorityRouterError`
        that is also a ``ValueError`` for a cost that is not a positive finite number up to a
        million (its message names the cost and the fix), and ``ValueError`` when
        ``client_id`` cannot be a client id (None, empty, a container).  A document whose
        record raised is not counted: in ``mode="inflight"``, should a stalled store run the
        check later, the router ends it there once the store answers.
        """
        client = self._client(client_id)
        units = cost_units(cost)
        if self._engine.inflight is not None:
            task_id = _task_id(task_id)
        with self._engine.explicit("count", client):
            tiered, pending, stored = self._engine.count(client, task_id, units)
        return self._engine.decision(client, pending, stored, tiered, units)

    def end(self, client_id: object, task_id: str, *, cost: float | None = None) -> bool:
        """``mode="inflight"``: document ``task_id`` of ``client_id`` is finished: the cost it
        was counted with is given back; True when this call ended it (a document is ended at
        most once).  ``cost`` is a check, not a key: a document counted at another cost is
        ended all the same, at the cost it was counted with, and a WARNING names both.
        Installed workers call it for every counted document; call it yourself only for
        documents that run elsewhere.
        """
        if self._engine.inflight is None:
            raise ConfigurationError("mode", "end() counts finished documents", 'use mode="inflight"')
        client = self._client(client_id)
        units = None if cost is None else cost_units(cost)
        task = _task_id(task_id)
        with self._engine.explicit("end", client):
            counted = self._engine.inflight.end(client, task, units, self._engine.costs_in_use())
        if units is not None and counted is not None and counted != units:
            log_end_cost(task, client, counted, units)
        return counted is not None

    def record_many(self, client_id: object, n: int, *, cost: float = 1) -> list[Decision]:
        """``n`` counted submissions for ``client_id``, each of ``cost``, in one Redis round
        trip: exactly the decisions ``n`` calls of :meth:`record` would give, in order.

        Raises like :meth:`record`, and ``ValueError`` when ``n`` is not a whole number >= 0.
        """
        client = self._client(client_id)
        count = _batch_size(n)
        units = cost_units(cost)
        self._no_inflight_batch()
        with self._engine.explicit("count", client):
            tiered, pendings, stored = self._engine.count_many(client, count, units)
        return [self._engine.decision(client, p, stored, tiered, units) for p in pendings]

    @contextlib.contextmanager
    def batch(self, client_id: object, n: int, *, cost: float = 1) -> Iterator[Batch]:
        """Count ``n`` documents of one client in one round trip, for the publishes inside
        the block::

            with router.batch("acme", len(documents)):
                group(process.s(doc) for doc in documents).apply_async(headers={"client_id": "acme"})

        Each counted publish of that client in the block (in this thread or task) takes the
        next reserved decision, so the documents get exactly the priorities they would have
        got one by one.  Publishes beyond ``n`` are counted as usual; reserved decisions the
        block leaves unused still count (a WARNING says so).  When the counter store fails,
        the batch's documents are priced by this process's own counts, as single publishes
        are.  Each document counts ``cost``.
        """
        client = self._client(client_id)
        self._no_inflight_batch()
        cost_units(cost)  # a bad cost is an error here, before anything is counted
        reserved = Batch(client, self.decide_many(client, _batch_size(n), cost))
        token = current_batch.set(reserved)
        try:
            yield reserved
        finally:
            current_batch.reset(token)
            reserved.close()

    def peek(self, client_id: object) -> Decision:
        """The client's current pending count and priority, without counting."""
        state = self.state(client_id)
        with self._engine.explicit("read the tier of", state.client_id, reads_only=True):
            tiered = self._engine.tiered()
            stored = self._engine.tier_store.stored(state.client_id) if tiered else None
        return self._engine.decision(state.client_id, state.pending, stored, tiered)

    def reset(self, client_id: object) -> bool:
        """Forget one client's count, in both modes' keys (its next document is checked at
        0); True if it had one."""
        client = self._client(client_id)
        with self._engine.explicit("reset", client):
            # Both modes' keys: a router switched from one mode leaves the other's until their
            # idle reset.
            stores = (self._engine.counter, self._engine.inflight_lists())
            return any([store.clear(client) for store in stores])

    def decide(self, client_id: str, task_id: str | None = None, cost: object = None) -> Decision:
        """Like :meth:`record`, but never raises: when the counter store fails, the
        decision is priced by this process's own count of the client's recent documents
        (reason ``local``), and later calls are too, at once, until a background probe sees
        the store answer; a cost that cannot be one is logged once and counted as 1
        (``None``: none given).
        """
        return self._engine.decide(client_id, task_id, cost)

    def decide_many(self, client_id: str, n: int, cost: object = None) -> list[Decision]:
        """Like :meth:`record_many`, but never raises (see :meth:`decide`)."""
        return self._engine.decide_many(client_id, n, cost)

    def state(self, client_id: object) -> CounterState:
        """What the counter store holds for one client (count and time to its reset)."""
        client = self._client(client_id)
        with self._engine.explicit("read", client, reads_only=True):
            return self._engine.store.read(client)

    # -- tiers ------------------------------------------------------------------------

    def set_tier(
        self,
        client_id: object,
        *,
        weight: float = 1.0,
        shift: int = 0,
        fixed: int | None = None,
        max_in_flight: int | None = None,
        borrow: bool = False,
        rate: str | None = None,
        burst: int | None = None,
        max_cost_in_flight: float | None = None,
    ) -> Tier:
        """Give ``client_id`` a tier of its own (``tiers.py``): its priority adjustments, in
        effect from its next publish on every publisher, and its limits (``limits.py``:
        at most ``max_in_flight`` documents running at once, ``rate`` starts per unit), in
        effect on every worker within a second.  A tier of its own replaces the default
        tier, limits included; a neutral one exempts the client from it.  Raises
        :class:`ConfigurationError` for bad values, before anything is stored."""
        client = self._client(client_id)
        tier = Tier(weight, shift, fixed, Limits(max_in_flight, borrow, rate, burst, max_cost_in_flight))
        engine = self._engine
        with engine.explicit("set the tier of", client):
            in_one_write(
                engine.redis,
                lambda w: engine.tier_store.set(client, tier, w),
                lambda w: engine.limit_store.set(client, tier.limits, w),
            )
        return tier

    def unset_tier(self, client_id: object) -> bool:
        """Remove the client's own tier (the default tier applies again); True if it had one."""
        client = self._client(client_id)
        engine = self._engine
        with engine.explicit("unset the tier of", client):
            _, (had, *_) = in_one_write(
                engine.redis,
                lambda w: engine.limit_store.unset(client, w),
                lambda w: engine.tier_store.unset(client, w),
            )
            return bool(had)

    def tier(self, client_id: object) -> Tier | None:
        """The client's own tier with its limits, None when it has none."""
        client = self._client(client_id)
        with self._engine.explicit("read the tier of", client, reads_only=True):
            tier = self._engine.tier_store.get(client)
            return None if tier is None else tier.with_limits(self._engine.limit_store.get(client) or NONE)

    def limits(self, client_id: object) -> Limits:
        """The limits workers apply to ``client_id`` now: its own tier's, else the default's."""
        client = self._client(client_id)
        with self._engine.explicit("read the limits of", client, reads_only=True):
            own = self._engine.limit_store.get(client)
            return own if own is not None else self._engine.limit_store.get_default()

    def gate_state(self, client_id: object) -> GateState:
        """How many of the client's documents run and how many its limits hold."""
        client = self._client(client_id)
        with self._engine.explicit("read the gate of", client, reads_only=True):
            return self._engine.gate_store.read(client)

    def tiers(self) -> dict[str, Tier]:
        """Every client with a tier of its own (read with SCAN, in batches).  A tier stored
        in a form this version cannot read raises :class:`ConfigurationError` naming it."""
        found: dict[str, Tier] = {}
        self._follow_apps()
        with self._engine.explicit("list the tiers of", "every client", reads_only=True):
            limits = self._engine.limit_store.all()
            for client, tier in self._engine.tier_store.scan():
                if isinstance(tier, ConfigurationError):
                    raise ConfigurationError(f"the tier of {client!r}", tier.problem, tier.fix)
                own = limits.get(client, NONE)
                if isinstance(own, ConfigurationError):
                    raise ConfigurationError(f"the limits of {client!r}", own.problem, own.fix)
                found[client] = tier.with_limits(own)
        return found

    def set_default_tier(
        self,
        *,
        weight: float = 1.0,
        shift: int = 0,
        fixed: int | None = None,
        max_in_flight: int | None = None,
        borrow: bool = False,
        rate: str | None = None,
        burst: int | None = None,
        max_cost_in_flight: float | None = None,
    ) -> Tier:
        """The tier of every client without one of its own; publishers pick a change up
        within a few seconds (``store/tier_store.py``), workers its limits within a second."""
        tier = Tier(weight, shift, fixed, Limits(max_in_flight, borrow, rate, burst, max_cost_in_flight))
        if tier == Tier():
            raise ConfigurationError(
                "default tier",
                "a neutral default tier changes nothing",
                "give weight, shift, fixed or a limit; to remove the default tier, call unset_default_tier()",
            )
        self._follow_apps()
        engine = self._engine
        with engine.explicit("set the default tier for", "every client"):
            in_one_write(
                engine.redis,
                lambda w: engine.tier_store.set_default(tier, w),
                lambda w: engine.limit_store.set_default(tier.limits, w),
            )
        return tier

    def unset_default_tier(self) -> bool:
        """Remove the default tier and its limits; whether there was one."""
        self._follow_apps()
        engine = self._engine
        with engine.explicit("unset the default tier for", "every client"):
            (had_limits, *_), (had_tier, *_) = in_one_write(
                engine.redis,
                lambda w: engine.limit_store.set_default(NONE, w),
                lambda w: engine.tier_store.unset_default(w),
            )
            return bool(had_tier or had_limits)

    def default_tier(self) -> Tier | None:
        """The tier (with its limits) of every client without a tier of its own, or None."""
        self._follow_apps()
        with self._engine.explicit("read the default tier for", "every client", reads_only=True):
            tier, limits = self._engine.tier_store.get_default(), self._engine.limit_store.get_default()
            if tier is None and not limits:
                return None
            return (tier or Tier()).with_limits(limits)

    def _follow_apps(self) -> None:
        """Load the configuration of each app this router is installed on that has not
        loaded it yet, and follow its ``priority_router_*`` settings: every counting, reading
        and tier method does this first, so in a fresh process ``peek`` reads the store the
        app's settings name, not the default one."""
        configure_apps(self._engine)

    def _no_inflight_batch(self) -> None:
        if self._engine.inflight is not None:
            raise ConfigurationError(
                "mode",
                'record_many() and batch() count documents before they have task ids, which mode="inflight" '
                "needs to end them",
                "publish the documents without batch() (each is counted on its own), or use the seed mode",
            )

    def _client(self, client_id: object) -> str:
        self._follow_apps()
        client = normalize_client_id(client_id)
        if client is None:
            raise ValueError(f"{client_id!r} is not a client id: use a non-empty string or a number")
        return client

    # -- Celery -----------------------------------------------------------------------

    def install(self, app: Celery) -> PublishReceiver:
        """Route ``app``'s task publishes and apply the settings priorities need.

        Call it before or after the app is configured (``config_from_object``,
        ``conf.update``, Django settings): the settings, the broker and the queues follow
        the configuration the app finally has.  Install it in the publishers' app and in
        the workers' app.  Installing the same router twice is a no-op; other Celery apps
        in the process are left untouched.
        """
        return install_router(self, self._engine, app)

    def uninstall(self, app: Celery) -> None:
        """Undo :meth:`install`: ``app`` publishes as plain Celery does (the settings
        already merged into its configuration stay)."""
        uninstall_router(self._engine, app)


def installed_router(app: object) -> PriorityRouter | None:
    """The router installed on ``app``, if any."""
    installation = installation_of(app)
    if installation is None:
        return None
    assert isinstance(installation.router, PriorityRouter)
    return installation.router


def engine_of(router: PriorityRouter) -> Engine:
    """The working parts of ``router``, for the commands (``ops/``): not public API."""
    return router._engine


def _task_id(task_id: object) -> str:
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f'mode="inflight" counts a document by its task id; {task_id!r} is not one')
    return task_id


def _batch_size(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"batch size {n!r} is not a whole number of documents (0 or more)")
    return n
