"""The public entry point: :class:`PriorityRouter`."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import redis
from celery import Celery

from .batch import Batch, current_batch
from .config import RouterConfig, celery_name, env_values
from .decision import Decision, Reason
from .errors import ConfigurationError, CounterUnavailable
from .integration.install import configure_apps
from .integration.install import install as install_router
from .integration.install import uninstall as uninstall_router
from .integration.installation import installed_router as installed_router
from .integration.metrics import RouterMetrics, get_metrics
from .integration.publish import PublishReceiver
from .limits import NONE, Limits
from .redact import redact_url
from .store.breaker import STORE_ERRORS, CircuitBreaker
from .store.client_ids import normalize_client_id
from .store.connection import make_client
from .store.costs import ONE, CostsInUse, InvalidCost, as_count, cost_units
from .store.counter import Counter, CounterState
from .store.gate import GateState, GateStore
from .store.inflight import InflightCounter
from .store.limit_store import LimitStore
from .store.owed import MAX_OWED, End, OwedEnds
from .store.schema import SchemaMismatch, StoreSchema
from .store.tier_store import TierStore
from .tiers import Tier, decode

logger = logging.getLogger("priority_router")


def _log_end_cost(task_id: str, client: str, counted: int, given: int, said: str = "") -> None:
    """A document ended with another cost than it was counted with."""
    logger.warning(
        "priority-router: document %r of client %r was counted at cost %s, and its end gave cost %s: "
        "it is ended at cost %s, as counted. Give the end the cost the document was published "
        "with, or none%s",
        task_id,
        client,
        as_count(counted),
        as_count(given),
        as_count(counted),
        said,
    )


T = TypeVar("T")


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
        #: What the user chose; an app's Celery settings fill in only the rest.
        self._given = given
        self._redis_client = redis_client
        self._use(RouterConfig.from_mapping(given))

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

    def _use(self, config: RouterConfig) -> None:
        self.config = config
        redis_client = self._redis_client
        if redis_client is None:
            redis_client = make_client(config.redis_url, config.connect_timeout, config.socket_timeout)
        self.redis = redis_client
        self.counter = Counter(redis_client, config.key_prefix, config.reset_interval)
        #: The in-flight lists (``mode="inflight"``), else None.
        self.inflight = (
            InflightCounter(redis_client, config.key_prefix, config.reset_interval)
            if config.mode == "inflight"
            else None
        )
        #: The store's schema marker, checked before the store is counted in or read.
        self.schema = StoreSchema(redis_client, config.key_prefix)
        #: Per-client tiers and the default tier (``tiers.py``).
        self.tier_store = TierStore(redis_client, config.key_prefix)
        #: Per-client caps and rates (``limits.py``), which workers' gates enforce.
        self.limit_store = LimitStore(redis_client, config.key_prefix)
        #: The gate's per-client state: running, held (``store/gate.py``).
        self.gate_store = GateStore(redis_client, config.key_prefix, config.lease)
        #: What was said once, by kind: the clients and tasks already warned about.
        self._said: dict[str, set[object]] = {}
        #: Whether any costed document has been counted under the prefix (``store/costs.py``).
        self.costs_in_use = CostsInUse(redis_client, config.key_prefix)
        #: The store the mode counts in: what ``peek``, ``state`` and the CLI read.
        self.store: Counter | InflightCounter = self.inflight or self.counter
        self.policy = config.thresholds
        self.metrics = _metrics_for(config)
        self._breaker = CircuitBreaker(
            config.cooldown,
            f"the priority counter at {redact_url(config.redis_url)}",
            # A lambda: a cluster client is built (and connects) at its first use, not here.
            probe=lambda: redis_client.ping(),
        )
        #: ``mode="inflight"``: ends that could not be sent while the store failed.
        self._owed: OwedEnds[End] = OwedEnds()

    def follow_apps(self) -> PriorityRouter:
        """Load the configuration of each app this router is installed on that has not
        loaded it yet, and follow its ``priority_router_*`` settings; returns the router.

        Every counting, reading and tier method does this first, so in a fresh process
        ``peek`` reads the store the app's settings name, not the default one."""
        configure_apps(self)
        return self

    def follow(self, celery_settings: Mapping[str, Any], source: Callable[[str], str] = celery_name) -> bool:
        """Adopt an app's ``priority_router_*`` settings under the ones given to this router;
        True when the configuration changed.  A bad one raises :class:`ConfigurationError`
        naming it by ``source(name)``, the key the app's configuration has it under."""
        try:
            config = RouterConfig.from_mapping({**celery_settings, **self._given}, source)
        except ConfigurationError as exc:
            if exc.setting in celery_settings and exc.setting not in self._given:
                raise ConfigurationError(source(exc.setting), exc.problem, exc.fix) from None
            raise
        if config == self.config:
            return False
        self._use(config)
        return True

    def __repr__(self) -> str:
        return f"<PriorityRouter {redact_url(self.config.redis_url)} prefix={self.config.key_prefix!r}>"

    # -- the counter ------------------------------------------------------------------

    def record(self, client_id: object, task_id: str | None = None, *, cost: float = 1) -> Decision:
        """One counted submission for ``client_id`` of ``cost`` (pages, megabytes, expected
        seconds: any positive unit, 1 by default): the pending count it is checked at (minus
        the costs counted before it) and its priority.

        In ``mode="inflight"`` the document's ``task_id`` is required (it is what
        :meth:`end` takes off again) and ignored otherwise.  Raises
        :class:`CounterUnavailable` when Redis cannot answer, :class:`InvalidCost` for a
        cost that is not a positive finite number up to a million, and ``ValueError`` when
        ``client_id`` cannot be a client id (None, empty, a container).
        """
        client = self._client(client_id)
        units = cost_units(cost)
        if self.inflight is not None:
            task_id = _task_id(task_id)
        with self._store("count", client):
            tiered = self._tiered()
            pending, stored = self._count(client, task_id, tiered, units)
        return self._decision(client, pending, stored, tiered, units)

    def end(self, client_id: object, task_id: str, *, cost: float | None = None) -> bool:
        """``mode="inflight"``: document ``task_id`` of ``client_id`` is finished: the cost it
        was counted with is given back; True when this call ended it (a document is ended at
        most once).  ``cost`` is a check, not a key: a document counted at another cost is
        ended all the same, at the cost it was counted with, and a WARNING names both.
        Installed workers call it for every counted document; call it yourself only for
        documents that run elsewhere.
        """
        if self.inflight is None:
            raise ConfigurationError("mode", "end() counts finished documents", 'use mode="inflight"')
        client = self._client(client_id)
        units = None if cost is None else cost_units(cost)
        task = _task_id(task_id)
        with self._store("end", client):
            counted = self.inflight.end(client, task, units, self.costs_in_use())
        if units is not None and counted is not None and counted != units:
            _log_end_cost(task, client, counted, units)
        return counted is not None

    def end_quietly(self, client_id: str, task_id: str, cost: object = None) -> bool:
        """Like :meth:`end` for a worker's signal handlers: never raises.  When the store
        fails, the end is kept and sent again every ``cooldown`` until the store answers
        (only a background probe asks it meanwhile); a cost that cannot be one (``None``:
        none given) is not checked, as the end finds the document by its task id."""
        inflight = self.inflight
        if inflight is None:
            return False
        units: int | None = None
        if cost is not None:
            with contextlib.suppress(InvalidCost):  # its publish said so, and counted it as 1
                units = cost_units(cost)
        end = (client_id, task_id, units)
        ended = self._send_end(end) if self._breaker.allow("ends") else None
        if ended is None:
            self._owe(end)
            return False
        if self._owed:
            self.retry_ends_quietly()
        return ended

    def retry_ends_quietly(self, batch: int = 500) -> int:
        """Send again up to ``batch`` of the ends this process could not send while the
        store failed (oldest first); how many went.  Never raises."""
        if not self._owed or not self._breaker.allow("ends"):
            return 0
        ends = self._owed.take(batch)
        for sent, end in enumerate(ends):
            if self._send_end(end) is None:
                self._owed.give_back(ends[sent:])
                return sent
        return len(ends)

    def _send_end(self, end: tuple[str, str, int | None]) -> bool | None:
        """One end on the store: whether it ended the document, None when the store failed."""
        inflight = self.inflight
        assert inflight is not None
        client_id, task_id, units = end
        sent = self._quietly(lambda: [inflight.end(client_id, task_id, units, self.costs_in_use())], "ends")
        if sent is None:
            return None
        (counted,) = sent
        disagrees = units is not None and counted is not None and counted != units
        if disagrees and self._first_time("end-cost", client_id):
            assert units is not None and counted is not None  # for mypy: disagrees says so
            _log_end_cost(task_id, client_id, counted, units, " (said once per client)")
        return counted is not None

    def _owe(self, end: tuple[str, str, int | None]) -> None:
        if not self._owed.add(end):
            self.warn_once(
                "owed-ends",
                "priority-router: more than %d documents' ends could not reach the counter store; the "
                "oldest are forgotten (their clients' counts come back at the idle reset)",
                MAX_OWED,
            )
        self._owed.retry_every(self.config.cooldown, self.retry_ends_quietly)

    def record_many(self, client_id: object, n: int, *, cost: float = 1) -> list[Decision]:
        """``n`` counted submissions for ``client_id``, each of ``cost``, in one Redis round
        trip: exactly the decisions ``n`` calls of :meth:`record` would give, in order.

        Raises like :meth:`record`, and ``ValueError`` when ``n`` is not a whole number >= 0.
        """
        client = self._client(client_id)
        count = _batch_size(n)
        units = cost_units(cost)
        self._no_inflight_batch()
        with self._store("count", client):
            tiered = self._tiered()
            pendings, stored = self.counter.count(client, count, units, tiered, self._costs(units))
        return [self._decision(client, p, stored, tiered, units) for p in pendings]

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
        the batch's documents get ``default_priority``, as single publishes do.  Each
        document counts ``cost``.
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
        stored = None
        with self._store("read the tier of", state.client_id, reads_only=True):
            tiered = self._tiered()
            if tiered:
                stored = self.tier_store.stored(state.client_id)
        return self._decision(state.client_id, state.pending, stored, tiered)

    def reset(self, client_id: object) -> bool:
        """Forget one client's count, in both modes' keys (its next document is checked at
        0); True if it had one."""
        client = self._client(client_id)
        with self._store("reset", client):
            # Both modes' keys: a router switched from one mode leaves the other's until their
            # idle reset.  Built here: registering the inflight scripts connects, on a cluster.
            inflight = self.inflight or InflightCounter(
                self.redis, self.config.key_prefix, self.config.reset_interval
            )
            return any([store.clear(client) for store in (self.counter, inflight)])

    def decide(self, client_id: str, task_id: str | None = None, cost: object = None) -> Decision:
        """Like :meth:`record`, but never raises: when the counter store fails the
        decision is ``default_priority`` and later calls fail open at once until a background
        probe sees the store answer; a cost that cannot be one is logged once and counted as
        1 (``None``: none given).
        """
        batch = current_batch.get()
        if batch is not None:
            reserved = batch.take(client_id)
            if reserved is not None:
                return reserved
        if self.inflight is not None and not (isinstance(task_id, str) and task_id):
            return self._fail_open(client_id)  # nothing to end it by (Celery always gives an id)
        if not self._breaker.allow("publish"):
            return self._fail_open(client_id)
        units = self.units_quietly(cost, client_id)
        metrics = self.metrics
        started = time.perf_counter() if metrics is not None else 0.0

        def count() -> tuple[bool, int | float, Any]:
            tiered = self._tiered()
            return (tiered, *self._count(client_id, task_id, tiered, units))

        counted = self._quietly(count, "publish")
        if counted is None:
            return self._fail_open(client_id)
        if metrics is not None:
            metrics.counter_seconds.observe(time.perf_counter() - started)
        tiered, pending, stored = counted
        return self._decision(client_id, pending, stored, tiered, units)

    def decide_many(self, client_id: str, n: int, cost: object = None) -> list[Decision]:
        """Like :meth:`record_many`, but never raises (see :meth:`decide`)."""
        fail_open = [self._fail_open(client_id)] * n
        if n == 0 or not self._breaker.allow("publish"):
            return fail_open
        units = self.units_quietly(cost, client_id)

        def count() -> tuple[bool, list[int | float], Any]:
            tiered = self._tiered()
            return (tiered, *self.counter.count(client_id, n, units, tiered, self._costs(units)))

        counted = self._quietly(count, "publish")
        if counted is None:
            return fail_open
        tiered, pendings, stored = counted
        return [self._decision(client_id, p, stored, tiered, units) for p in pendings]

    def state(self, client_id: object) -> CounterState:
        """What the counter store holds for one client (count and time to its reset)."""
        client = self._client(client_id)
        with self._store("read", client, reads_only=True):
            return self.store.read(client)

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
        with self._store("set the tier of", client):
            self.tier_store.set(client, tier)
            self.limit_store.set(client, tier.limits)
        return tier

    def unset_tier(self, client_id: object) -> bool:
        """Remove the client's own tier (the default tier applies again); True if it had one."""
        client = self._client(client_id)
        with self._store("unset the tier of", client):
            self.limit_store.unset(client)
            return self.tier_store.unset(client)

    def tier(self, client_id: object) -> Tier | None:
        """The client's own tier with its limits, None when it has none."""
        client = self._client(client_id)
        with self._store("read the tier of", client, reads_only=True):
            tier = self.tier_store.get(client)
            if tier is None:
                return None
            return tier.with_limits(self.limit_store.get(client) or NONE)

    def limits(self, client_id: object) -> Limits:
        """The limits workers apply to ``client_id`` now: its own tier's, else the default's."""
        client = self._client(client_id)
        with self._store("read the limits of", client, reads_only=True):
            own = self.limit_store.get(client)
            return own if own is not None else self.limit_store.get_default()

    def gate_state(self, client_id: object) -> GateState:
        """How many of the client's documents run and how many its limits hold."""
        client = self._client(client_id)
        with self._store("read the gate of", client, reads_only=True):
            return self.gate_store.read(client)

    def tiers(self) -> dict[str, Tier]:
        """Every client with a tier of its own (read with SCAN, in batches).  A tier stored
        in a form this version cannot read raises :class:`ConfigurationError` naming it."""
        found: dict[str, Tier] = {}
        self.follow_apps()
        with self._store("list the tiers of", "every client", reads_only=True):
            limits = self.limit_store.all()
            for client, tier in self.tier_store.scan():
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
        self.follow_apps()
        with self._store("set the default tier for", "every client"):
            self.tier_store.set_default(tier)
            self.limit_store.set_default(tier.limits)
        return tier

    def unset_default_tier(self) -> bool:
        """Remove the default tier and its limits; whether there was one."""
        self.follow_apps()
        with self._store("unset the default tier for", "every client"):
            had_limits = self.limit_store.set_default(NONE)
            return self.tier_store.unset_default() or had_limits

    def default_tier(self) -> Tier | None:
        """The tier (with its limits) of every client without a tier of its own, or None."""
        self.follow_apps()
        with self._store("read the default tier for", "every client", reads_only=True):
            tier, limits = self.tier_store.get_default(), self.limit_store.get_default()
            if tier is None and not limits:
                return None
            return (tier or Tier()).with_limits(limits)

    def units_quietly(self, cost: object, client_id: object) -> int:
        """A document's cost in units from its header's value: 1 when it gives none
        (``None``) or a bad one, which is logged once per client (never raises)."""
        if cost is None:
            return ONE
        try:
            return cost_units(cost)
        except InvalidCost as exc:
            if self._first_time("cost", client_id):
                logger.error(
                    "priority-router: a document of client %r: %s; it is counted as 1", client_id, exc
                )
            return ONE

    def warn_once(self, key: str, message: str, *args: object) -> None:
        """Log ``message`` as an ERROR the first time ``key`` is given."""
        if self._first_time("warning", key):
            logger.error(message, *args)

    def _first_time(self, kind: str, key: object) -> bool:
        """Whether ``key`` is new among those said of ``kind`` (at most 1000 kept per kind)."""
        said = self._said.setdefault(kind, set())
        if key in said or len(said) >= 1000:
            return False
        said.add(key)
        return True

    def _count(
        self, client: str, task_id: str | None, tiered: bool, units: int = ONE
    ) -> tuple[int | float, Any]:
        """One counted document in the mode's store: the pending count it is checked at, and
        the client's stored tier when ``tiered`` (read in the same transaction), else None."""
        costs = self._costs(units)
        if self.inflight is not None:
            assert task_id is not None
            return self.inflight.count(client, task_id, units, tiered, costs)
        pendings, stored = self.counter.count(client, 1, units, tiered, costs)
        return pendings[0], stored

    def _costs(self, units: int) -> bool:
        """Whether this check reads the client's extras (``store/costs.py``): once any costed
        document has been counted under the prefix; a costed one marks that first."""
        if units != ONE:
            self.costs_in_use.mark()
            return True
        return self.costs_in_use()

    def _tiered(self) -> bool:
        """Whether checks read tiers: on unless ``tiers=False``, once any tier is stored
        (``store/tier_store.py``); may read the store, at most every few seconds."""
        return self.config.tiers and self.tier_store.in_use()

    def _decision(
        self, client_id: str, pending: int | float, stored: object, tiered: bool, units: int = ONE
    ) -> Decision:
        """The decision for a counted document, with the tier its check read, else the
        default tier, adjusting the table's priority.  A fractional count is truncated
        toward 0 for the table: a partial unit does not count."""
        cost = as_count(units)
        if not tiered:
            return Decision(client_id, pending, self.policy.priority_for(int(pending)), cost=cost)
        if stored is None:
            tier = self.tier_store.default()
            if tier is None:
                return Decision(client_id, pending, self.policy.priority_for(int(pending)), cost=cost)
            source = "default"
        else:
            try:
                tier = decode(stored if isinstance(stored, bytes | str) else str(stored))
            except ConfigurationError as exc:
                self._warn_bad_tier(client_id, exc)
                return Decision(client_id, pending, self.policy.priority_for(int(pending)), cost=cost)
            source = "client"
        priority = tier.priority(pending, self.policy)
        return Decision(client_id, pending, priority, tier=tier.applied_as(source), cost=cost)

    def _warn_bad_tier(self, client_id: str, exc: ConfigurationError) -> None:
        if not self._first_time("tier", client_id):
            return
        logger.error(
            "priority-router: the tier of client %r at %s is unreadable (%s); its documents "
            "get the threshold table's priority. Fix: %s",
            client_id,
            self.tier_store.key(client_id),
            exc.problem,
            exc.fix,
        )

    def _fail_open(self, client_id: str) -> Decision:
        return Decision(client_id, None, self.config.default_priority, Reason.FAIL_OPEN)

    def _no_inflight_batch(self) -> None:
        if self.inflight is not None:
            raise ConfigurationError(
                "mode",
                'record_many() and batch() count documents before they have task ids, which mode="inflight" '
                "needs to end them",
                "publish the documents without batch() (each is counted on its own), or use the seed mode",
            )

    def _client(self, client_id: object) -> str:
        self.follow_apps()
        client = normalize_client_id(client_id)
        if client is None:
            raise ValueError(f"{client_id!r} is not a client id: use a non-empty string or a number")
        return client

    def _quietly(self, use: Callable[[], T], purpose: str) -> T | None:
        """``use()`` on the store for ``purpose`` (``store/breaker.py``), for the calls that
        never raise: None when the store is another release's, or fails (the breaker then
        opens), or on a bug (logged once with its traceback; the breaker stays as it is)."""
        try:
            self.schema.check()
            result = use()
        except SchemaMismatch:
            return None
        except STORE_ERRORS as exc:
            self._breaker.failure(exc, purpose)
            return None
        except Exception as exc:
            if self._first_time("bug", (purpose, type(exc))):
                logger.exception("priority-router: unexpected error using the counter store (%s)", purpose)
            return None
        self._breaker.success()
        return result

    @contextlib.contextmanager
    def _store(self, what: str, client: str, reads_only: bool = False) -> Iterator[None]:
        """An explicit call's use of the store: refused when the store is another
        release's (:class:`SchemaMismatch`), Redis failures as :class:`CounterUnavailable`.
        A call that ``reads_only`` does not mark an unmarked store as this release's."""
        with _store_errors(what, client):
            self.schema.check(claim=not reads_only)
            yield

    # -- Celery -----------------------------------------------------------------------

    def install(self, app: Celery) -> PublishReceiver:
        """Route ``app``'s task publishes and apply the settings priorities need.

        Call it before or after the app is configured (``config_from_object``,
        ``conf.update``, Django settings): the settings, the broker and the queues follow
        the configuration the app finally has.  Install it in the publishers' app and in
        the workers' app.  Installing the same router twice is a no-op; other Celery apps
        in the process are left untouched.
        """
        return install_router(self, app)

    def uninstall(self, app: Celery) -> None:
        """Undo :meth:`install`: ``app`` publishes as plain Celery does (the settings
        already merged into its configuration stay)."""
        uninstall_router(self, app)


@contextlib.contextmanager
def _store_errors(what: str, client: str) -> Iterator[None]:
    """Redis failures of an explicit counter call, as :class:`CounterUnavailable`."""
    try:
        yield
    except STORE_ERRORS as exc:
        raise CounterUnavailable(f"could not {what} {client!r}: {exc}") from exc


def _task_id(task_id: object) -> str:
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f'mode="inflight" counts a document by its task id; {task_id!r} is not one')
    return task_id


def _batch_size(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"batch size {n!r} is not a whole number of documents (0 or more)")
    return n


def _metrics_for(config: RouterConfig) -> RouterMetrics | None:
    if not config.metrics and config.metrics_port is None:
        return None
    metrics = get_metrics()
    if metrics is None:
        raise ConfigurationError(
            "metrics" if config.metrics else "metrics_port",
            "prometheus_client is not installed",
            "pip install 'priority-router[metrics]', or leave metrics off",
        )
    return metrics
