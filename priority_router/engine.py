"""The router's working parts: what :class:`~priority_router.PriorityRouter` is made of.

One :class:`Engine` per router, built from its configuration: the counter store's objects
(counts, tiers, limits, the gate's state), the circuit breaker, and the calls that never
raise, which the publish hook and the worker's signal handlers make.  The router's public
methods are a front to it; the Celery integration (``integration/``) and the commands
(``ops/``) use it directly: the integration finds it on an app
(``integration.installation.installed_engine``), a command on a router
(``router.engine_of``).  None of it is public API.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import redis

from .batch import current_batch
from .config import RouterConfig, celery_name
from .decision import Decision, Reason
from .errors import ConfigurationError, CounterUnavailable
from .local_counts import LocalCounts
from .metrics import RouterMetrics, get_metrics
from .redact import redact_url
from .store.breaker import STORE_ERRORS, CircuitBreaker
from .store.connection import make_client, ping_every_master
from .store.costs import ONE, CostsInUse, InvalidCost, as_count, cost_units
from .store.counter import Counter
from .store.gate import GateStore
from .store.inflight import InflightCounter
from .store.limit_store import LimitStore
from .store.owed import MAX_OWED, End, OwedEnds
from .store.permissions import acl_user, refusal
from .store.schema import SchemaMismatch, StoreSchema
from .store.tier_store import TierStore
from .tiers import Tier, decode

logger = logging.getLogger("priority_router")

T = TypeVar("T")

#: Seconds between a publishing process's confirms of the documents the broker took
#: (``mode="inflight"``): sent in one batch, off the publish path.
CONFIRM_EVERY = 2.0
#: One document a publish counted and the broker took: client, task id, units.
Sent = tuple[str, str, int]


class Engine:
    """The stores one configuration names, and the calls on them that never raise.

    ``follow`` swaps the configuration (an app's ``priority_router_*`` settings) in place,
    so whoever holds the engine sees the new stores."""

    def __init__(self, given: Mapping[str, Any], redis_client: redis.Redis | None = None) -> None:
        #: What the user chose; an app's Celery settings fill in only the rest.
        self._given = dict(given)
        self._redis_client = redis_client
        self._confirms_at_exit = False
        self.use(RouterConfig.from_mapping(self._given))

    def use(self, config: RouterConfig) -> None:
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
        #: This process's own counts, which price its publishes while the store fails.
        self.local = LocalCounts(config.reset_interval)
        self._breaker = CircuitBreaker(
            config.cooldown,
            f"the priority counter at {redact_url(config.redis_url)}",
            # A lambda: a cluster client is built (and connects) at its first use, not here.
            probe=lambda: ping_every_master(redis_client),
            user=acl_user(config.redis_url),
            prefix=config.key_prefix,
        )
        #: ``mode="inflight"``: ends that could not be sent while the store failed.
        self._owed: OwedEnds[End] = OwedEnds()
        #: In another mode, the in-flight lists of documents counted in the inflight mode.
        self._ends_only: InflightCounter | None = None
        #: ``mode="inflight"``: documents sent, their confirms not yet sent (``confirm_quietly``).
        self._unconfirmed: OwedEnds[Sent] = OwedEnds()

    def follow(self, celery_settings: Mapping[str, Any], source: Callable[[str], str] = celery_name) -> bool:
        """Adopt an app's ``priority_router_*`` settings under the ones given to the router;
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
        self.use(config)
        return True

    # -- counting -----------------------------------------------------------------------

    def decide(
        self, client_id: str, task_id: str | None = None, cost: object = None, provisional: bool = False
    ) -> Decision:
        """A publish's decision; never raises (``PriorityRouter.decide``).  ``provisional``
        (a Celery publish, whose sender confirms it: :meth:`confirm_quietly`): in the
        inflight mode, the document stops counting after 50 s unless confirmed."""
        batch = current_batch.get()
        if batch is not None:
            reserved = batch.take(client_id)
            if reserved is not None:
                return reserved
        if self.inflight is not None and not (isinstance(task_id, str) and task_id):
            return self.fail_open(client_id)  # nothing to end it by (Celery always gives an id)
        units = self.units_quietly(cost, client_id)
        if not self._breaker.allow("publish"):
            return self.counted_here(client_id, units)[0]
        metrics = self.metrics
        started = time.perf_counter() if metrics is not None else 0.0
        counted = self._quietly(lambda: self.count(client_id, task_id, units, provisional), "publish")
        if counted is None:
            return self.uncounted(client_id, units)[0]
        if metrics is not None:
            metrics.counter_seconds.observe(time.perf_counter() - started)
        tiered, pending, stored = counted
        own, default = self.tiers_of(client_id, stored, tiered)
        self.local.counted(client_id, pending - as_count(units), own)
        return self.priced(client_id, pending, units, own, default)

    def decide_many(self, client_id: str, n: int, cost: object = None) -> list[Decision]:
        """``n`` decisions in one round trip; never raises (``PriorityRouter.decide_many``)."""
        if n == 0:
            return []
        units = self.units_quietly(cost, client_id)
        if not self._breaker.allow("publish"):
            return self.counted_here(client_id, units, n)
        counted = self._quietly(lambda: self.count_many(client_id, n, units), "publish")
        if counted is None:
            return self.uncounted(client_id, units, n)
        tiered, pendings, stored = counted
        own, default = self.tiers_of(client_id, stored, tiered)
        self.local.counted(client_id, pendings[-1] - as_count(units), own)
        return [self.priced(client_id, p, units, own, default) for p in pendings]

    def uncounted(self, client_id: str, units: int, n: int = 1) -> list[Decision]:
        """Decisions for documents the store did not count: priced here (``counted_here``)
        when it failed, else (another release's store, a bug) ``default_priority``."""
        if self._breaker.is_open:
            return self.counted_here(client_id, units, n)
        return [self.fail_open(client_id)] * n

    def counted_here(self, client_id: str, units: int, n: int = 1) -> list[Decision]:
        """While the store fails: ``n`` documents priced by this process's own count of the
        client (``local_counts.py``), with the client's tier as the store last gave it,
        else the default tier as this process last read it."""
        pendings, own = self.local.count(client_id, as_count(units), n)
        default = self.tier_store.known_default() if own is None and self.config.tiers else None
        return [self.priced(client_id, p, units, own, default, Reason.LOCAL) for p in pendings]

    def count(
        self, client: str, task_id: str | None, units: int = ONE, provisional: bool = False
    ) -> tuple[bool, int | float, Any]:
        """One counted document in the mode's store: whether checks read tiers, the pending
        count it is checked at, and the client's stored tier when they do (read in the same
        transaction), else None."""
        tiered = self.tiered()
        costs = self.costs(units)
        if self.inflight is not None:
            assert task_id is not None
            try:
                return (tiered, *self.inflight.count(client, task_id, units, tiered, costs, provisional))
            except STORE_ERRORS:
                # The script may have reached the store and run there after the timeout (a
                # stall, a lost reply), while its caller takes the document as uncounted
                # (a publish fails open, ``record`` raises), so nothing would end it.  Its
                # end is owed: sent once the store answers, it removes the entry if it
                # landed and changes nothing if it did not.
                self._owe((client, task_id, units))
                raise
        pendings, stored = self.counter.count(client, 1, units, tiered, costs)
        return tiered, pendings[0], stored

    def count_many(self, client: str, n: int, units: int) -> tuple[bool, list[int | float], Any]:
        """``n`` counted documents in one round trip (seed mode): as :meth:`count`, with each
        one's pending count."""
        tiered = self.tiered()
        return (tiered, *self.counter.count(client, n, units, tiered, self.costs(units)))

    def costs(self, units: int) -> bool:
        """Whether this check reads the client's extras (``store/costs.py``): once any costed
        document has been counted under the prefix; a costed one marks that first."""
        if units != ONE:
            self.costs_in_use.mark()
            return True
        return self.costs_in_use()

    def tiered(self) -> bool:
        """Whether checks read tiers: on unless ``tiers=False``, once any tier is stored
        (``store/tier_store.py``); may read the store, at most every few seconds."""
        return self.config.tiers and self.tier_store.in_use()

    def decision(
        self, client_id: str, pending: int | float, stored: object, tiered: bool, units: int = ONE
    ) -> Decision:
        """The decision for a counted document, with the tier its check read, else the
        default tier, adjusting the table's priority."""
        return self.priced(client_id, pending, units, *self.tiers_of(client_id, stored, tiered))

    def tiers_of(self, client_id: str, stored: object, tiered: bool) -> tuple[Tier | None, Tier | None]:
        """The client's own tier as its check read it (None: it has none), and the default
        tier when it has none."""
        if not tiered:
            return None, None
        if stored is None:
            return None, self.tier_store.default()
        try:
            return decode(stored if isinstance(stored, bytes | str) else str(stored)), None
        except ConfigurationError as exc:
            self._warn_bad_tier(client_id, exc)
            return None, None

    def priced(
        self,
        client_id: str,
        pending: int | float,
        units: int,
        own: Tier | None,
        default: Tier | None,
        reason: Reason = Reason.COUNTED,
    ) -> Decision:
        """The decision for a document checked at ``pending``: the table's priority,
        adjusted by the client's own tier, else by the default tier.  A fractional count is
        truncated toward 0 for the table: a partial unit does not count."""
        cost = as_count(units)
        tier, source = (own, "client") if own is not None else (default, "default")
        if tier is None:
            return Decision(client_id, pending, self.policy.priority_for(int(pending)), reason, cost=cost)
        priority = tier.priority(pending, self.policy)
        return Decision(client_id, pending, priority, reason, tier=tier.applied_as(source), cost=cost)

    def fail_open(self, client_id: str) -> Decision:
        return Decision(client_id, None, self.config.default_priority, Reason.FAIL_OPEN)

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

    # -- ends (mode="inflight") ---------------------------------------------------------

    def end_quietly(self, client_id: str, task_id: str, cost: object = None) -> bool:
        """Like ``PriorityRouter.end`` for a worker's signal handlers, for a document counted
        in the inflight mode (whatever this process's own mode): never raises.  When the
        store fails, the end is kept and sent again every ``cooldown`` until the store
        answers (only a background probe asks it meanwhile); a cost that cannot be one
        (``None``: none given) is not checked, as the end finds the document by its task id."""
        if self.inflight is None and self._first_time("mode", "ends"):
            logger.warning(
                "priority-router: this process runs mode=%r and received documents its publishers "
                "counted in mode='inflight'; it ends them as they ask, in the inflight lists under "
                "key prefix %r. Fix: give it mode='inflight' too (PRIORITY_ROUTER_MODE=inflight), "
                "so that its configuration says what it does",
                self.config.mode,
                self.config.key_prefix,
            )
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
        inflight = self.inflight_lists()
        client_id, task_id, units = end
        sent = self._quietly(lambda: [inflight.end(client_id, task_id, units, self.costs_in_use())], "ends")
        if sent is None:
            return None
        (counted,) = sent
        disagrees = units is not None and counted is not None and counted != units
        if disagrees and self._first_time("end-cost", client_id):
            assert units is not None and counted is not None  # for mypy: disagrees says so
            log_end_cost(task_id, client_id, counted, units, " (said once per client)")
        return counted is not None

    # -- confirms (mode="inflight") -----------------------------------------------------

    def confirm_quietly(self, client_id: str, task_id: str, cost: object = None) -> None:
        """The broker took a document this process counted provisionally: it counts until
        it ends.  Kept, and sent with the others every :data:`CONFIRM_EVERY` seconds from a
        daemon thread, and at the process's exit; never raises."""
        if self.inflight is None:
            return
        units = ONE
        if cost is not None:
            with contextlib.suppress(InvalidCost):  # its publish counted it as 1
                units = cost_units(cost)
        if not self._unconfirmed.add((client_id, task_id, units)) and self._first_time("warning", "confirms"):
            logger.error(
                "priority-router: more than %d documents' confirms are waiting to reach the counter store; "
                "the oldest are forgotten (their documents stop counting 50 s after their publish)",
                MAX_OWED,
            )
        self._unconfirmed.retry_every(CONFIRM_EVERY, self.send_confirms_quietly)
        if not self._confirms_at_exit:
            self._confirms_at_exit = True
            atexit.register(_confirm_at_exit, weakref.ref(self))

    def send_confirms_quietly(self, batch: int = 10_000) -> None:
        """Send the confirms kept, in batches of ``batch``; those the store could not take
        are kept for the next try.  Never raises."""
        inflight = self.inflight
        while inflight is not None and self._unconfirmed and self._breaker.allow("confirms"):
            documents = self._unconfirmed.take(batch)
            if self._quietly(functools.partial(inflight.confirm, documents), "confirms") is None:
                self._unconfirmed.give_back(documents)
                return

    def inflight_lists(self) -> InflightCounter:
        """The inflight mode's lists: the mode's own, else (the seed mode, for ends of
        documents counted in the inflight mode, and for ``reset``) one built at first use:
        registering its scripts connects, on a cluster."""
        if self.inflight is not None:
            return self.inflight
        if self._ends_only is None:
            config = self.config
            self._ends_only = InflightCounter(self.redis, config.key_prefix, config.reset_interval)
        return self._ends_only

    def _owe(self, end: tuple[str, str, int | None]) -> None:
        if not self._owed.add(end) and self._first_time("warning", "owed-ends"):
            logger.error(
                "priority-router: more than %d documents' ends could not reach the counter store; the "
                "oldest are forgotten (their clients' counts come back at the idle reset)",
                MAX_OWED,
            )
        self._owed.retry_every(self.config.cooldown, self.retry_ends_quietly)

    # -- saying things once, and the store's errors ---------------------------------------

    def _first_time(self, kind: str, key: object) -> bool:
        """Whether ``key`` is new among those said of ``kind`` (at most 1000 kept per kind)."""
        said = self._said.setdefault(kind, set())
        if key in said or len(said) >= 1000:
            return False
        said.add(key)
        return True

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
    def explicit(self, what: str, client: str, reads_only: bool = False) -> Iterator[None]:
        """An explicit call's use of the store: refused when the store is another
        release's (:class:`SchemaMismatch`), Redis failures as :class:`CounterUnavailable`.
        A call that ``reads_only`` does not mark an unmarked store as this release's."""
        try:
            self.schema.check(claim=not reads_only)
            yield
        except STORE_ERRORS as exc:
            raise CounterUnavailable(f"could not {what} {client!r}: {exc}{self.refusal_fix(exc)}") from exc

    def refusal_fix(self, exc: BaseException) -> str:
        """``". Fix: ACL SETUSER ..."`` when ``exc`` is the store refusing a command or key
        to the router's Redis user (``store/permissions.py``), else empty."""
        refused = refusal(exc)
        if refused is None:
            return ""
        return f". Fix: {refused.fix(acl_user(self.config.redis_url), self.config.key_prefix)}"


def _confirm_at_exit(engine: weakref.ref[Engine]) -> None:
    """A publisher exiting right after its publishes confirms them before it goes."""
    alive = engine()
    if alive is not None:
        alive.send_confirms_quietly()


def log_end_cost(task_id: str, client: str, counted: int, given: int, said: str = "") -> None:
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
