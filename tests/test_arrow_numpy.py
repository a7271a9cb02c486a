"""The pandas-free paths give what pandas and pyarrow give: buffer conversions (traces.arrow_numpy),
grouped running sums and maxima of arrivals (traces.arrival_modes), records summaries and the
trace read back from parquet, bit for bit."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pandas.testing import assert_frame_equal

from simlab.engines.records import as_frame, latency_summary, record_columns
from traces.arrival_modes import compensated_cumsum_within, running_max_within
from traces.arrow_numpy import from_numpy, from_optional, list_views, to_numpy
from traces.format import Trace, make_frame, request_row

floats = st.floats(0, 1e6, allow_nan=False, width=64) | st.floats(0, 1e-6, width=64)
sessions = st.lists(st.lists(floats, min_size=1, max_size=12), min_size=1, max_size=12)


def grouped(lists: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    values = np.array([v for group in lists for v in group])
    first = np.zeros(len(values), dtype=bool)
    first[np.cumsum([0, *map(len, lists)])[:-1]] = True
    return values, first, np.cumsum(first) - 1


@settings(max_examples=150, deadline=None)
@given(sessions)
def test_grouped_cumsum_is_pandas_bit_for_bit(lists):
    values, first, index = grouped(lists)
    expected = pd.Series(values).groupby(index).cumsum().to_numpy()
    assert np.array_equal(compensated_cumsum_within(values, first), expected)


@settings(max_examples=150, deadline=None)
@given(sessions, st.randoms(use_true_random=False))
def test_grouped_running_max_is_pandas(lists, rnd):
    values, first, index = grouped(lists)
    values = values - np.array([rnd.random() * 1e5 for _ in values])
    expected = pd.Series(values).groupby(index).cummax().to_numpy()
    assert np.array_equal(running_max_within(values, first), expected)


def test_a_plain_sum_would_differ_from_pandas():
    """The compensation matters: without it these gaps' sums are not pandas' floats."""
    values = np.array([0.0, 0.1, 0.2, 0.3, 1e-17, 0.7, 1e16, 1.0, 3.3])
    first = np.zeros(len(values), dtype=bool)
    first[0] = True
    expected = pd.Series(values).groupby(np.zeros(len(values))).cumsum().to_numpy()
    assert not np.array_equal(np.cumsum(values), expected)
    assert np.array_equal(compensated_cumsum_within(values, first), expected)


@given(st.lists(st.integers(-(2**62), 2**62), max_size=30), st.integers(0, 5))
def test_numbers_round_trip_through_buffers(ints, cut):
    array = pa.array(ints, pa.int64()).slice(min(cut, len(ints)))
    assert np.array_equal(to_numpy(array), array.to_numpy())
    back = from_numpy(np.asarray(ints, dtype=np.int64))
    assert back.equals(pa.array(np.asarray(ints, dtype=np.int64)))


def test_booleans_floats_strings_and_lists():
    flags = np.array([True, False, True, True, False, False, False, True, True])
    assert from_numpy(flags).equals(pa.array(flags))
    halves = np.array([0.5, math.nan, -2.0])
    assert from_numpy(halves).to_pylist()[::2] == [0.5, -2.0]
    names = np.array(["lru", "marconi", "é"], dtype=object)
    assert from_numpy(names).equals(pa.array(list(names), pa.large_string()))
    lists = pa.array([[1, 2], [], [3], [4, 5, 6]], pa.list_(pa.int32())).slice(1)
    values, offsets = list_views(pa.chunked_array([lists]))
    assert [values[a:b].tolist() for a, b in itertools.pairwise(offsets)] == [
        [],
        [3],
        [4, 5, 6],
    ]


def test_a_null_falls_back_to_pyarrow():
    column = pa.chunked_array([pa.array([1, None, 3], pa.int64())])
    assert np.isnan(to_numpy(column)[1])


def test_a_trace_read_back_is_the_frame_it_was_written_from(tmp_path):
    rows = [
        request_row(s, t, [s, t, 7], [1, 2], ref_timestamp=1.5 * s + t, ref_model=f"m{s}")
        for s in range(3)
        for t in range(2)
    ]
    trace = Trace("t", make_frame(rows), block_size=4)
    trace.to_parquet(tmp_path / "t.parquet")
    back = Trace.read_parquet(tmp_path / "t.parquet", "t")
    assert back.block_size == 4 and len(back) == 6 and back.n_sessions == 3
    assert back.columns == list(trace.frame.columns)
    assert np.array_equal(back.column("turn"), trace.frame["turn"].to_numpy())
    frame = back.frame
    assert frame.attrs == trace.frame.attrs
    scalar = [c for c in frame.columns if c not in ("input_ids", "output_ids")]
    assert_frame_equal(frame[scalar], trace.frame[scalar])
    moved = back.with_arrivals(np.arange(6.0))
    assert moved.column("arrival").tolist() == list(range(6)) and moved.block_size == 4


def test_records_columns_give_the_frame_and_the_summary_pandas_would():
    from simlab.engines.records import RECORD_COLUMNS, RequestRecord

    records = [
        RequestRecord(
            "lru",
            i,
            i % 2,
            i // 2,
            0.5 * i,
            10,
            3,
            4,
            4,
            1e9,
            4e8,
            5,
            0,
            0,
            0,
            0,
            i == 2,
            100,
            0,
            ttft=math.nan if i == 1 else 0.1 * i,
            queue_delay=0.3 * i,
            finished=1.0 + i,
        )
        for i in range(4)
    ]
    old = pd.DataFrame.from_records(
        [tuple(getattr(r, c) for c in RECORD_COLUMNS) for r in records], columns=RECORD_COLUMNS
    )
    frame = as_frame(record_columns(records))
    assert_frame_equal(frame, old)
    latency = latency_summary(record_columns(records))
    assert latency["mean_queue_delay"] == old["queue_delay"].mean()
    assert latency["ttft_p50"] == float(np.percentile(old["ttft"].dropna(), 50))
    assert latency["makespan_s"] == old["finished"].max() - old["arrival"].min()


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["int64", "float64", "bool", "string"]),
    data=st.data(),
)
def test_from_optional_equals_pyarrows_own_conversion(kind, data):
    """Values with nulls anywhere (none, some, all; no values at all) as pa.array makes them."""
    value = {
        "int64": st.integers(-(2**62), 2**62),
        "float64": st.floats(allow_nan=False),
        "bool": st.booleans(),
        "string": st.text(max_size=5),
    }[kind]
    values = data.draw(st.lists(st.none() | value, max_size=12))
    arrow_type = {"bool": pa.bool_(), "string": pa.string()}.get(kind) or pa.type_for_alias(kind)
    got = from_optional(values, arrow_type)
    got.validate(full=True)
    assert got.equals(pa.array(values, type=arrow_type))
