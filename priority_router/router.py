"""The public entry point: :class:`PriorityRouter`."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import redis
from celery import Celery

from .config import ClientIdGetter, RouterConfig
from .decision import Decision, Reason
from .errors import CounterUnavailable
from .integration.install import install as install_router
from .integration.install import receiver_of
from .integration.install import uninstall as uninstall_router
from .integration.metrics import get_metrics, serve
from .integration.publish import PublishReceiver
from .integration.worker import unwatch, watch_queue_wait
from .policy import DOCBITS_THRESHOLDS, Policy
from .redact import redact_url
from .store.breaker import CircuitBreaker
from .store.connection import make_client
from .store.counter import Counter
from .store.keys import normalize_client_id

logger = logging.getLogger("priority_router")


class PriorityRouter:
    """Gives every published document a priority from its client's pending count.

    >>> router = PriorityRouter(redis_url="redis://localhost:6379/1")  # doctest: +SKIP
    >>> router.install(app)                                             # doctest: +SKIP

    Nothing connects until the first check.  Use :meth:`from_env` to read every
    setting from ``PRIORITY_ROUTER_*`` environment variables.
    """

    def __init__(
        self,
        redis_url: str = "redis://localhost:6379/0",
        reset_interval: float = 1500,
        thresholds: Policy = DOCBITS_THRESHOLDS,
        default_priority: int = 5,
        key_prefix: str = "priority-router:",
        client_id_header: str = "client_id",
        client_id_kwarg: str = "client_id",
        client_id_getter: ClientIdGetter | None = None,
        tasks: str | list[str] | tuple[str, ...] | None = None,
        *,
        connect_timeout: float = 0.05,
        socket_timeout: float = 0.05,
        cooldown: float = 5.0,
        flower_kwargsrepr: bool = True,
        metrics_port: int | None = None,
        consumer_check_interval: float = 60.0,
        redis_client: redis.Redis | None = None,
    ) -> None:
        config = RouterConfig(
            redis_url=redis_url,
            reset_interval=reset_interval,
            thresholds=thresholds,
            default_priority=default_priority,
            key_prefix=key_prefix,
            client_id_header=client_id_header,
            client_id_kwarg=client_id_kwarg,
            client_id_getter=client_id_getter,
            tasks=(tasks,) if isinstance(tasks, str) else None if tasks is None else tuple(tasks),
            connect_timeout=connect_timeout,
            socket_timeout=socket_timeout,
            cooldown=cooldown,
            flower_kwargsrepr=flower_kwargsrepr,
            metrics_port=metrics_port,
            consumer_check_interval=consumer_check_interval,
        )
        self._setup(config, redis_client)

    @classmethod
    def from_config(cls, config: RouterConfig, redis_client: redis.Redis | None = None) -> PriorityRouter:
        router = cls.__new__(cls)
        router._setup(config, redis_client)
        return router

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        redis_client: redis.Redis | None = None,
        **overrides: Any,
    ) -> PriorityRouter:
        """A router configured from ``PRIORITY_ROUTER_*`` variables; ``overrides`` win."""
        return cls.from_config(RouterConfig.from_env(environ, **overrides), redis_client)

    def _setup(self, config: RouterConfig, redis_client: redis.Redis | None) -> None:
        self.config = config
        if redis_client is None:
            redis_client = make_client(config.redis_url, config.connect_timeout, config.socket_timeout)
        self.redis = redis_client
        self.counter = Counter(redis_client, config.key_prefix, config.reset_interval)
        self.policy = config.thresholds
        self._metrics = get_metrics()
        self._breaker = CircuitBreaker(
            config.cooldown, f"the priority counter at {redact_url(config.redis_url)}"
        )

    def __repr__(self) -> str:
        return f"<PriorityRouter {redact_url(self.config.redis_url)} prefix={self.config.key_prefix!r}>"

    # -- the counter ------------------------------------------------------------------

    def record(self, client_id: object) -> Decision:
        """One counted submission for ``client_id``: the new pending count and its priority.

        Raises :class:`CounterUnavailable` when Redis cannot answer and ``ValueError``
        when ``client_id`` cannot be a client id (None, empty, a container).
        """
        client = self._client(client_id)
        try:
            pending = self.counter.check(client)
        except (redis.RedisError, OSError) as exc:
            raise CounterUnavailable(f"could not count {client!r}: {exc}") from exc
        return Decision(client, pending, self.policy.priority_for(pending))

    def peek(self, client_id: object) -> Decision:
        """The client's current pending count and priority, without counting."""
        client = self._client(client_id)
        try:
            state = self.counter.read(client)
        except (redis.RedisError, OSError) as exc:
            raise CounterUnavailable(f"could not read {client!r}: {exc}") from exc
        return Decision(client, state.pending, self.policy.priority_for(state.pending))

    def reset(self, client_id: object) -> bool:
        """Forget one client's count (its next document is checked at 0); True if it had one."""
        client = self._client(client_id)
        try:
            return self.counter.clear(client)
        except (redis.RedisError, OSError) as exc:
            raise CounterUnavailable(f"could not reset {client!r}: {exc}") from exc

    def decide(self, client_id: str) -> Decision:
        """Like :meth:`record`, but never raises: when the counter store fails the
        decision is ``default_priority`` and the store is left alone for ``cooldown``.
        """
        if not self._breaker.allow():
            return Decision(client_id, None, self.config.default_priority, Reason.FAIL_OPEN)
        started = time.perf_counter()
        try:
            pending = self.counter.check(client_id)
        except Exception as exc:
            self._breaker.failure(exc)
            return Decision(client_id, None, self.config.default_priority, Reason.FAIL_OPEN)
        if self._metrics is not None:
            self._metrics.counter_seconds.observe(time.perf_counter() - started)
        self._breaker.success()
        return Decision(client_id, pending, self.policy.priority_for(pending))

    @staticmethod
    def _client(client_id: object) -> str:
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
        receiver = install_router(self, app)
        if self._metrics is not None:
            receiver.on_decision = self._metrics.record_decision
            watch_queue_wait(app, self._metrics, self.config.metrics_port)
        elif self.config.metrics_port is not None:
            serve(self.config.metrics_port)  # raises: the extra is missing
        return receiver

    def uninstall(self, app: Celery) -> None:
        """Stop routing ``app``'s publishes (settings already applied stay)."""
        if uninstall_router(self, app):
            unwatch(app)


def installed_router(app: Celery) -> PriorityRouter | None:
    """The router installed on ``app``, if any."""
    receiver = receiver_of(app)
    return receiver.router if receiver is not None else None
