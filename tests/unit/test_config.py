import fakeredis
import pytest
from celery import Celery

from priority_router import ConfigurationError, PriorityRouter, RouterConfig


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"reset_interval": 0}, "reset_interval"),
        ({"reset_interval": -5}, "reset_interval"),
        ({"reset_interval": float("nan")}, "reset_interval"),
        ({"default_priority": 0}, "default_priority"),
        ({"default_priority": 10}, "default_priority"),
        ({"thresholds": [(-2, 2), (-4, 3)]}, "thresholds"),
        ({"thresholds": [(-4, 11)]}, "thresholds"),
        ({"redis_url": "localhost:6379"}, "redis_url"),
        ({"redis_url": "http://localhost:6379"}, "redis_url"),
        ({"redis_url": "redis://localhost:notaport/0"}, "redis_url"),
        ({"key_prefix": ""}, "key_prefix"),
        ({"key_prefix": "a{b}"}, "key_prefix"),
        ({"client_id_header": ""}, "client_id_header"),
        ({"client_id_getter": "not callable"}, "client_id_getter"),
        ({"tasks": [1, 2]}, "tasks"),
        ({"cooldown": 0}, "cooldown"),
        ({"socket_timeout": -1}, "socket_timeout"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"metrics_port": "9808"}, "metrics_port"),
        ({"flower_kwargsrepr": "yes"}, "flower_kwargsrepr"),
        ({"redis_url": "redis+sentinel://127.0.0.1:26379"}, "redis_url"),
        ({"redis_url": "redis+sentinel://127.0.0.1:notaport/docs"}, "redis_url"),
        ({"redis_url": "redis://localhost:6379/notadb"}, "redis_url"),
        ({"redis_url": "redis://localhost:6379/0?db=x"}, "redis_url"),
        ({"redis_url": "redis://localhost:99999/0"}, "redis_url"),
        ({"redis_url": "redis+sentinel://127.0.0.1:26379/docs/notadb"}, "redis_url"),
        ({"reset_interval": 1e-9}, "reset_interval"),
        ({"reset_interval": 0.5}, "reset_interval"),
        ({"thresholds": [(5, 9)]}, "thresholds"),
        ({"consumer_check_interval": -1}, "consumer_check_interval"),
    ],
)
def test_bad_settings_raise_configuration_error_naming_them(kwargs: dict, setting: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        PriorityRouter(**kwargs)
    assert info.value.setting.startswith(setting)
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("redis+sentinel://127.0.0.1:26379", "redis+sentinel://host:26379[,host:26379...]/service_name/db"),
        ("redis://localhost:6379/notadb", "redis://host:port/db"),
        ("rediss://localhost:6379/0?ssl_ca_cert=/ca.pem", "ssl_ca_certs (a query gives"),
        ("redis://localhost:6379/0?ssl_ca_certs=/ca.pem", "rediss:// for TLS"),
        ("redis+cluster://a:1,b:2?ssl_cert_reqs=required", "rediss+cluster:// for TLS"),
        ("redis://localhost:6379/0?sockettimeout=1", "socket_timeout (a query"),
        ("rediss+sentinel://h1:26379/docs/0?ssl_ca_certs=/ca.pem", "no query; the database goes in the path"),
    ],
)
def test_a_bad_url_is_fixed_in_its_own_scheme(url: str, fix: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        PriorityRouter(redis_url=url)
    assert str(info.value).split("Fix:", 1)[1].strip().startswith(f"use {fix}"), str(info.value)


def test_password_never_in_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        PriorityRouter(redis_url="http://user:s3cret@host:1/0")
    assert "s3cret" not in str(info.value)


def test_from_env_reads_variables_and_overrides_win() -> None:
    env = {
        "PRIORITY_ROUTER_REDIS_URL": "redis://example:6380/2",
        "PRIORITY_ROUTER_RESET_INTERVAL": "60",
        "PRIORITY_ROUTER_DEFAULT_PRIORITY": "7",
        "PRIORITY_ROUTER_TASKS": "docs.*, other.task",
        "PRIORITY_ROUTER_KEY_PREFIX": "mine:",
    }
    config = RouterConfig.from_env(env, default_priority=3)
    assert config.redis_url == "redis://example:6380/2"
    assert config.reset_interval == 60
    assert config.default_priority == 3
    assert config.tasks == ("docs.*", "other.task")
    assert config.key_prefix == "mine:"


def test_from_env_bad_number_names_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="PRIORITY_ROUTER_RESET_INTERVAL"):
        RouterConfig.from_env({"PRIORITY_ROUTER_RESET_INTERVAL": "soon"})


def test_repr_redacts_password() -> None:
    router = PriorityRouter(redis_url="redis://:hunter2@localhost:6379/0")
    assert "hunter2" not in repr(router)


def test_from_env_reads_the_observability_settings() -> None:
    config = RouterConfig.from_env(
        {"PRIORITY_ROUTER_METRICS_PORT": "9808", "PRIORITY_ROUTER_FLOWER_KWARGSREPR": "off"}
    )
    assert (config.metrics_port, config.flower_kwargsrepr) == (9808, False)
    with pytest.raises(ConfigurationError, match="PRIORITY_ROUTER_FLOWER_KWARGSREPR"):
        RouterConfig.from_env({"PRIORITY_ROUTER_FLOWER_KWARGSREPR": "maybe"})


def test_sentinel_and_tls_urls_are_accepted() -> None:
    for url in (
        "redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/docs/3",
        "rediss+sentinel://s1/docs",
        "rediss://:pw@redis.example:6380/0?ssl_cert_reqs=required",
        "unix:///var/run/redis.sock?db=2",
    ):
        assert RouterConfig(redis_url=url).redis_url == url


def test_a_string_tasks_setting_is_split_at_commas_wherever_it_is_given() -> None:
    assert PriorityRouter(tasks="docs.process").config.tasks == ("docs.process",)
    assert RouterConfig(tasks="docs.*").tasks == ("docs.*",)
    assert RouterConfig(tasks=(t for t in ["a", "b"])).tasks == ("a", "b")
    text = " docs.*, billing.*,"
    keyword = PriorityRouter(tasks=text, environ={}).config.tasks
    environment = PriorityRouter(environ={"PRIORITY_ROUTER_TASKS": text}).config.tasks
    app = Celery("tasks", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.priority_router_tasks = text
    router = PriorityRouter(redis_client=fakeredis.FakeRedis(), environ={})
    router.install(app)
    assert app.conf.broker_url  # loads the configuration, which the router follows
    assert keyword == environment == router.config.tasks == ("docs.*", "billing.*")
    with pytest.raises(ConfigurationError, match="names no task"):
        RouterConfig(tasks=" , ")


def test_valid_urls_and_boundaries_are_accepted() -> None:
    for url in ("redis://localhost", "redis://:pw@h:6380/15", "unix:///run/redis.sock?db=3", "rediss://h/2"):
        assert RouterConfig(redis_url=url).redis_url == url
    assert RouterConfig(reset_interval=1).reset_interval == 1.0
    assert RouterConfig(thresholds=[(0, 9)]).thresholds.priority_for(-1) == 9
    assert RouterConfig(consumer_check_interval=0).consumer_check_interval == 0


def test_a_config_shown_or_logged_never_shows_the_stores_password() -> None:
    config = RouterConfig(redis_url="redis://router:s3cret-pass@127.0.0.1:6402/0", key_prefix="docs:")
    assert "s3cret-pass" not in repr(config) and "s3cret-pass" not in f"{config}"
    assert "redis://router:***@127.0.0.1:6402/0" in repr(config) and "key_prefix='docs:'" in repr(config)
    assert config.redis_url.endswith(":s3cret-pass@127.0.0.1:6402/0")  # the value itself is kept


def test_the_store_password_is_masked_in_the_app_settings_and_still_followed() -> None:
    """Celery prints ``priority_router_redis_url`` as it is (``celery inspect conf``,
    ``celery report``): once read, it reads masked, the router still reads the URL, a
    copy pickled for a pool process too, and a value set later is followed."""
    import pickle

    from priority_router.config import celery_values, hide_store_password

    app = Celery("masked", set_as_current=False)
    app.conf.priority_router_redis_url = "redis://user:pw1@h:6379/0"
    hide_store_password(app.conf)
    assert app.conf.priority_router_redis_url == "redis://user:***@h:6379/0"
    assert "pw1" not in app.conf.humanize()
    assert celery_values(app.conf)["redis_url"] == "redis://user:pw1@h:6379/0"
    copied = pickle.loads(pickle.dumps(app.conf.priority_router_redis_url))
    assert (copied, copied.url) == ("redis://user:***@h:6379/0", "redis://user:pw1@h:6379/0")
    app.conf.priority_router_redis_url = "redis://user:pw2@h:6379/0"
    assert celery_values(app.conf)["redis_url"] == "redis://user:pw2@h:6379/0"
    hide_store_password(app.conf)
    assert "pw2" not in app.conf.humanize()
