import pytest

from priority_router import ConfigurationError, Transport, from_wire, to_wire


def test_redis_serves_low_numbers_first_so_logical_is_wire() -> None:
    assert [to_wire(p, Transport.REDIS) for p in range(1, 10)] == list(range(1, 10))


def test_amqp_serves_high_numbers_first_so_it_is_reversed() -> None:
    assert [to_wire(p, Transport.AMQP) for p in range(1, 10)] == [9, 8, 7, 6, 5, 4, 3, 2, 1]


@pytest.mark.parametrize("transport", list(Transport))
def test_round_trip(transport: Transport) -> None:
    assert [from_wire(to_wire(p, transport), transport) for p in range(1, 10)] == list(range(1, 10))


def test_out_of_range_logical_priority() -> None:
    with pytest.raises(ValueError):
        to_wire(0, Transport.REDIS)


def test_unknown_transport_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="broker_url") as info:
        Transport.from_driver("sqs", "sqs://key:secret@")
    assert "secret" not in str(info.value)
