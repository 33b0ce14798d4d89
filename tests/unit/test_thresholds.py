import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from priority_router import DEFAULT_THRESHOLDS, ConfigurationError, Policy


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
    assert DEFAULT_THRESHOLDS.priority_for(pending) == priority


def test_worked_example_of_22_documents() -> None:
    # docs/scheme.md: checks 1-3 -> 1, 4-5 -> 2, ... 16-21 -> 8, 22 -> 9; check n is at pending 1 - n.
    got = [DEFAULT_THRESHOLDS.priority_for(1 - n) for n in range(1, 23)]
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


def test_a_table_more_urgent_for_a_busier_client_is_refused() -> None:
    """It would run a client's later documents before its earlier ones, in either mode."""
    with pytest.raises(ConfigurationError, match="more urgent") as raised:
        Policy.from_rows([(-20, 2), (-10, 9)])
    assert "[2, 9, 1]" in raised.value.problem
    with pytest.raises(ConfigurationError, match="more urgent"):
        Policy.from_rows([(-20, 9), (-10, 5)], fallback=6)


def test_fallback_out_of_range() -> None:
    with pytest.raises(ConfigurationError, match="fallback"):
        Policy.from_rows([(-2, 2)], fallback=12)


# -- properties -------------------------------------------------------------------------


def _spec_priority(pending: int) -> int:
    """The table of docs/scheme.md, written out independently of the implementation."""
    for limit, priority in ((-20, 9), (-14, 8), (-12, 7), (-10, 6), (-8, 5), (-6, 4), (-4, 3), (-2, 2)):
        if pending < limit:
            return priority
    return 1


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_seed_table_matches_the_spec_everywhere(pending: int) -> None:
    assert DEFAULT_THRESHOLDS.priority_for(pending) == _spec_priority(pending)


@given(st.integers(max_value=0), st.integers(max_value=0))
def test_more_pending_is_never_more_urgent(a: int, b: int) -> None:
    low, high = sorted((a, b))  # low has more documents in its spell
    assert DEFAULT_THRESHOLDS.priority_for(low) >= DEFAULT_THRESHOLDS.priority_for(high)


def _monotone(limits: list[int], priorities: list[int]) -> list[tuple[int, int]]:
    """Rows lowest limit first, their priorities the same or more urgent going up."""
    return list(zip(sorted(limits), sorted(priorities, reverse=True), strict=True))


rows = st.integers(1, 9).flatmap(
    lambda n: st.builds(
        _monotone,
        st.lists(st.integers(-1000, 0), min_size=n, max_size=n, unique=True),
        st.lists(st.integers(1, 9), min_size=n, max_size=n),
    )
)


@given(rows, st.integers(1, 9), st.integers(-2000, 2000))
def test_any_valid_table_picks_the_first_matching_row(
    table: list[tuple[int, int]], fallback: int, pending: int
) -> None:
    fallback = min(fallback, table[-1][1])
    policy = Policy.from_rows(table, fallback=fallback)
    expected = next((p for limit, p in table if pending < limit), fallback)
    assert policy.priority_for(pending) == expected
    assert 1 <= policy.priority_for(pending) <= 9


@given(st.lists(st.tuples(st.integers(-100, 100), st.integers(-5, 15)), min_size=1, max_size=6))
def test_any_table_is_either_valid_or_refused_by_name(table: list[tuple[int, int]]) -> None:
    limits = [limit for limit, _ in table]
    priorities = [p for _, p in table] + [1]  # the fallback
    valid = (
        limits == sorted(set(limits))
        and all(1 <= p <= 9 and limit <= 0 for limit, p in table)
        and priorities == sorted(priorities, reverse=True)
    )
    try:
        Policy.from_rows(table)
    except ConfigurationError as exc:
        assert not valid
        assert exc.setting.startswith("thresholds") and exc.fix
    else:
        assert valid


def test_the_old_name_of_the_default_table_still_imports_with_a_deprecation_warning() -> None:
    import priority_router
    from priority_router import DEFAULT_THRESHOLDS, policy

    with pytest.warns(DeprecationWarning, match="DOCBITS_THRESHOLDS is deprecated: use DEFAULT_THRESHOLDS"):
        assert priority_router.DOCBITS_THRESHOLDS is DEFAULT_THRESHOLDS
    with pytest.warns(DeprecationWarning):
        assert policy.DOCBITS_THRESHOLDS is DEFAULT_THRESHOLDS
    with pytest.raises(AttributeError, match="no attribute 'NO_SUCH_NAME'"):
        _ = priority_router.NO_SUCH_NAME


def test_the_old_module_still_imports_each_name_with_one_deprecation_warning() -> None:
    from priority_router import thresholds

    for name in ("Policy", "Threshold", "DEFAULT_THRESHOLDS", "is_priority", "MOST_URGENT"):
        namespace: dict[str, object] = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(f"from priority_router.policy import {name} as found", namespace)
        assert namespace["found"] is getattr(thresholds, name)
        assert [str(w.message) for w in caught] == [
            f"priority_router.policy is deprecated: import {name} from priority_router.thresholds"
        ]
        assert all(w.category is DeprecationWarning and w.filename == "<string>" for w in caught)
    with pytest.warns(DeprecationWarning, match=r"import DEFAULT_THRESHOLDS from priority_router\.thresh"):
        from priority_router.policy import DOCBITS_THRESHOLDS
    assert DOCBITS_THRESHOLDS is thresholds.DEFAULT_THRESHOLDS
    with pytest.raises(ImportError, match="NO_SUCH_NAME"):
        from priority_router.policy import NO_SUCH_NAME  # noqa: F401
