import pytest

from priority_router import DOCBITS_THRESHOLDS, ConfigurationError, Policy


@pytest.mark.parametrize(
    ("pending", "priority"),
    [
        (0, 1),
        (-2, 1),
        (-3, 2),
        (-4, 2),
        (-5, 3),
        (-6, 3),
        (-7, 4),
        (-8, 4),
        (-9, 5),
        (-10, 5),
        (-11, 6),
        (-12, 6),
        (-13, 7),
        (-14, 7),
        (-15, 8),
        (-20, 8),
        (-21, 9),
        (-1000, 9),
    ],
)
def test_seed_table_boundaries(pending: int, priority: int) -> None:
    assert DOCBITS_THRESHOLDS.priority_for(pending) == priority


def test_worked_example_of_22_documents() -> None:
    # SPEC.md: checks 1-3 -> 1, 4-5 -> 2, ... 16-21 -> 8, 22 -> 9; check n is at pending 1 - n.
    got = [DOCBITS_THRESHOLDS.priority_for(1 - n) for n in range(1, 23)]
    assert got == [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9]


def test_custom_table_from_rows() -> None:
    policy = Policy.from_rows([(-10, 9), (-5, 5)], fallback=2)
    assert [policy.priority_for(p) for p in (0, -5, -6, -11)] == [2, 2, 5, 9]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([(-2, 2), (-20, 9)], "not strictly increasing"),
        ([(-20, 9), (-20, 8)], "not strictly increasing"),
        ([(-20, 10)], "outside 1..9"),
        ([(-20, 0)], "outside 1..9"),
        ([(-20, True)], "outside 1..9"),
        ([(-2.5, 3)], "not an integer"),
        ([], "empty"),
        ([(1, 2, 3)], r"not a \(below, priority\) pair"),
    ],
)
def test_invalid_tables_name_the_setting(rows: list, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        Policy.from_rows(rows)
    assert info.value.setting.startswith("thresholds")
    assert "Fix:" in str(info.value)


def test_fallback_out_of_range() -> None:
    with pytest.raises(ConfigurationError, match="fallback"):
        Policy.from_rows([(-2, 2)], fallback=12)
