"""Prefix-chain storage of traces (traces.columnar): exact round trips, one buffer per chain."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.columnar import chain_owners, decode, encode
from traces.format import Trace, make_frame, request_row


def frame_of(sessions: list[list[list[int]]]):
    rows = [
        request_row(s, t, ids, [900 + t, 901])
        for s, turns in enumerate(sessions)
        for t, ids in enumerate(turns)
    ]
    return make_frame(rows)


def test_an_agent_session_is_one_chain_and_a_branch_starts_another():
    frame = frame_of(
        [[[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5]], [[1, 2], [7, 8]], [[5, 6, 7], [5, 6]]]
    )
    assert chain_owners(frame).tolist() == [2, 2, 2, 3, 4, 5, 5]


def test_a_trace_survives_the_round_trip_and_shares_one_buffer(tmp_path):
    frame = frame_of([[[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5]], [[9], [9, 9, 1]]])
    Trace("t", frame).to_parquet(tmp_path / "t.parquet")
    back = Trace.read_parquet(tmp_path / "t.parquet", "t").frame
    assert list(back.columns) == list(frame.columns)
    for col in ("input_ids", "output_ids"):
        assert [a.tolist() for a in back[col]] == [a.tolist() for a in frame[col]]
        assert all(a.dtype == np.int32 for a in back[col])
    first, last = back["input_ids"].iloc[0], back["input_ids"].iloc[2]
    assert np.shares_memory(first, last)  # views of the session's one chain


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=5),
        min_size=1,
        max_size=4,
    )
)
def test_decode_inverts_encode(sessions):
    """Any inputs (prefixes, extensions, branches, repeats): the same ids in every cell."""
    frame = frame_of(sessions)
    scalars, back = decode(pa.Table.from_pandas(encode(frame), preserve_index=False))
    assert [a.tolist() for a in back["input_ids"]] == [a.tolist() for a in frame["input_ids"]]
    assert [a.tolist() for a in back["output_ids"]] == [a.tolist() for a in frame["output_ids"]]
    assert scalars.column("turn").to_pylist() == frame["turn"].tolist()
