"""Reading a CSV trace: what is accepted, and errors that name the line and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from priority_router.simulation.trace import Trace, TraceBuilder, TraceError, load_csv, size_group


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_trace_is_sorted_by_time_keeps_file_order_at_one_instant_and_starts_at_zero(tmp_path: Path) -> None:
    trace = load_csv(
        write(
            tmp_path,
            "timestamp,client_id,duration\n"
            "1700000010.5,acme,0.5\n"
            "1700000010,globex,2\n"
            "1700000010,acme,1\n"
            "\n"
            '1700000012," spaced , name",0.25\n',
        )
    )
    assert [trace.clients[c] for c in trace.client] == ["globex", "acme", "acme", "spaced , name"]
    assert trace.at == [0.0, 0.0, 0.5, 2.0]
    assert trace.duration == [2.0, 1.0, 0.5, 0.25]


def test_clients_are_grouped_by_how_many_documents_they_send(tmp_path: Path) -> None:
    rows = ["a"] + ["b"] * 5 + ["c"] * 12
    trace = load_csv(write(tmp_path, "timestamp,client_id,duration\n" + "".join(f"0,{c},1\n" for c in rows)))
    assert dict(zip(trace.clients, trace.groups, strict=True)) == {
        "a": "1 doc",
        "b": "2-9 docs",
        "c": "10-99 docs",
    }
    assert [size_group(n) for n in (1, 2, 9, 10, 99, 100, 12345)] == [
        "1 doc",
        "2-9 docs",
        "2-9 docs",
        "10-99 docs",
        "10-99 docs",
        "100-999 docs",
        "10000-99999 docs",
    ]


def test_a_header_in_other_case_and_a_byte_order_mark_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffTimestamp, Client_ID ,Duration\n0,a,1\n".encode())
    assert load_csv(path).clients == ("a",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty"),
        ("time,client,seconds\n0,a,1\n", "line 1: the header is 'time,client,seconds'"),
        ("timestamp,client_id,duration\n", "header but no documents"),
        ("timestamp,client_id,duration\n0,a,1\n0,a\n", "line 3: 2 field(s)"),
        ("timestamp,client_id,duration\n0,a,1\n0,a,1,x\n", "line 3: 4 field(s)"),
        ("timestamp,client_id,duration\n0,a,1\nsoon,a,1\n", "line 3: timestamp 'soon' is not a number"),
        ("timestamp,client_id,duration\nnan,a,1\n", "line 2: timestamp 'nan'"),
        ("timestamp,client_id,duration\n0,a,1\n\n1,  ,1\n", "line 4: the client_id is empty"),
        ("timestamp,client_id,duration\n0,a,0\n", "line 2: duration '0' is not a positive number"),
        ("timestamp,client_id,duration\n0,a,-1\n", "line 2: duration '-1'"),
        ("timestamp,client_id,duration\n0,a,inf\n", "line 2: duration 'inf'"),
        ("timestamp,client_id,duration\n0,a,1 s\n", "line 2: duration '1 s'"),
    ],
)
def test_bad_traces_name_the_line_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        load_csv(write(tmp_path, text))
    assert message in str(caught.value)
    assert any(fix in str(caught.value) for fix in ("write", "must be", "add", "give", "each line", "header"))


def test_a_quoted_line_break_counts_lines_as_the_file_has_them(tmp_path: Path) -> None:
    text = 'timestamp,client_id,duration\n0,"two\nlines",1\nlater,a,1\n'
    with pytest.raises(TraceError, match="line 4: timestamp 'later'"):
        load_csv(write(tmp_path, text))


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"timestamp,client_id,duration\n0,caf\xe9,1\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        load_csv(path)


def test_a_trace_checks_its_own_shape() -> None:
    with pytest.raises(TraceError, match="no documents"):
        TraceBuilder().build()
    with pytest.raises(TraceError, match="positive number of seconds"):
        Trace(("a",), ("g",), [0], [0.0], [0.0])
    with pytest.raises(TraceError, match="time order"):
        Trace(("a",), ("g",), [0, 0], [1.0, 0.0], [1.0, 1.0])
    with pytest.raises(TraceError, match="earlier document"):
        Trace(("a",), ("g",), [0, 0], [0.0, 0.0], [1.0, 1.0], after=[-1, 1])


# -- the optional cost column --------------------------------------------------------------


def test_a_cost_column_gives_each_document_its_cost_in_thousandths(tmp_path: Path) -> None:
    trace = load_csv(
        write(
            tmp_path,
            "Timestamp,Client_ID,Duration, Cost \n"
            "0,scans,30,30\n"
            "0,invoices,1,1\n"
            "1,invoices,1,\n"  # an empty cell: 1, as a document published without a cost
            "0.5,notes,0.2,0.25\n",
        )
    )
    assert [trace.clients[c] for c in trace.client] == ["scans", "invoices", "notes", "invoices"]
    assert trace.cost_units == [30_000, 1000, 250, 1000]


def test_without_a_cost_column_or_with_every_cost_1_documents_are_counted_as_before(tmp_path: Path) -> None:
    plain = load_csv(write(tmp_path, "timestamp,client_id,duration\n0,a,1\n0,b,2\n"))
    ones = load_csv(write(tmp_path, "timestamp,client_id,duration,cost\n0,a,1,1\n0,b,2,1.0\n", "ones.csv"))
    assert plain.cost_units == ones.cost_units == []
    assert (plain.at, plain.duration, plain.clients) == (ones.at, ones.duration, ones.clients)


COST_HEADER = "timestamp,client_id,duration,cost\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (COST_HEADER + "0,a,1,0\n", "line 2: cost 0.0 is not a positive finite number"),
        (COST_HEADER + "0,a,1,1\n0,a,1,-2\n", "line 3: cost -2.0 is not a positive finite number"),
        (COST_HEADER + "0,a,1,nan\n", "line 2: cost nan is not a positive finite number"),
        (COST_HEADER + "0,a,1,inf\n", "line 2: cost inf is not a positive finite number"),
        (COST_HEADER + "0,a,1,30 pages\n", "line 2: cost '30 pages' is not a number"),
        (COST_HEADER + "0,a,1,1e10\n", "line 2: cost 10000000000.0 is above 1,000,000"),
        (COST_HEADER + "0,a,1,0.0001\n", "line 2: cost 0.0001 is below 0.001"),
        (
            COST_HEADER + "0,a,1\n",
            "line 2: 3 field(s) ['0', 'a', '1']; each line is timestamp,client_id,duration,cost",
        ),
        ("timestamp,client_id,duration,weight\n0,a,1,1\n", "or timestamp,client_id,duration,cost when"),
    ],
)
def test_a_bad_cost_names_the_line_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        load_csv(write(tmp_path, text))
    assert message in str(caught.value)
    assert any(fix in str(caught.value) for fix in ("fix the cost column", "each line", "header"))


def test_a_trace_checks_its_costs() -> None:
    with pytest.raises(TraceError, match="one entry per document"):
        Trace(("a",), ("g",), [0, 0], [0.0, 0.0], [1.0, 1.0], cost_units=[1000])
    with pytest.raises(TraceError, match="at most 1,000,000"):
        Trace(("a",), ("g",), [0], [0.0], [1.0], cost_units=[0])
    builder = TraceBuilder()
    builder.add("a", "g", 0.0, 1.0, units=2500)
    builder.add("a", "g", 0.0, 1.0)
    assert builder.build().cost_units == [2500, 1000]
