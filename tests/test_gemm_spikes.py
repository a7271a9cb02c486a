"""A GEMM table's spikes: weight-bound rows far over their fit are taken at it before any
interpolation (:func:`simlab.cost.measured.noise.despike_gemm`); the rest stay as measured."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from simlab.cost.measured import tables
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.noise import SPIKE, despike_gemm

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)

LINES = [(n, k) for n in (8192, 16384) for k in (8192, 16384)]  # weight-bound at m <= 16


def frame(rows: dict[tuple[int, int, int], float]) -> pd.DataFrame:
    return pd.DataFrame(
        [(n, k, m, t) for (n, k, m), t in rows.items()], columns=["n", "k", "m", "latency"]
    )


def table(spikes: dict[tuple[int, int, int], float]) -> dict[tuple[int, int, int], float]:
    """Four weight-bound lines, each twice as long at one row and faster at 8 (kernels' own
    steps, on every line), a compute-bound row at 64, and ``spikes``."""
    rows = {}
    for n, k in LINES:
        level = 1e-6 * (n + k)
        for m in (1, 2, 3, 4, 5, 6, 8, 16, 64):
            rows[(n, k, m)] = level * {1: 2.0, 8: 0.7, 64: 5.0}.get(m, 1.0)
    return rows | spikes


def test_a_spike_takes_its_fit_and_the_kernels_own_steps_stay():
    n, k = LINES[0]
    level = 1e-6 * (n + k)
    spiked = {(n, k, 4): 2 * level, (n, k, 5): 0.5 * level, (n, k, 64): 20 * level}
    rows = table(spiked)
    out, spikes = despike_gemm(frame(rows))
    got = {(r.n, r.k, r.m): r.latency for r in out.itertuples()}
    assert spikes == 1  # the 2x at m = 4
    assert got[(n, k, 4)] == pytest.approx(level)
    kept = {key: value for key, value in rows.items() if key != (n, k, 4)}
    assert {key: got[key] for key in kept} == kept  # m = 1 and 8 on every line, the dip at
    # m = 5 (noise only adds), the compute-bound row


def test_a_row_within_the_threshold_is_kept():
    n, k = LINES[0]
    rows = table({(n, k, 4): 1e-6 * (n + k) * SPIKE * 0.99})
    out, spikes = despike_gemm(frame(rows))
    assert spikes == 0 and out["latency"].tolist() == frame(rows)["latency"].tolist()


def test_a_line_of_two_weight_bound_rows_is_never_judged():
    rows = {(8192, 4096, 2): 0.01, (8192, 4096, 4): 0.03, (8192, 4096, 64): 0.05}
    assert despike_gemm(frame(rows))[1] == 0


@installed
def test_b200_vllm_fp8_spikes_are_taken_at_the_median_and_recorded(caplog):
    """vLLM 0.24.0's FP8 GEMM table on B200 measured Llama-70B's down projection at TP 4
    (8,192 x 7,168) twice as long at 4 rows as at 3 or 5; a decode step of 4 requests is timed
    as the line's weight read, and the run's summary counts the rows."""
    raw = Kernels("b200_sxm", "vllm", "0.24.0", "fp8", despike=False)
    with caplog.at_level(logging.WARNING):
        kernels = Kernels("b200_sxm", "vllm", "0.24.0", "fp8")
        four = kernels.gemm(4, 8192, 7168)
    three, five = (kernels.gemm(m, 8192, 7168) for m in (3, 5))
    assert four is not None and three is not None and five is not None
    assert raw.gemm(4, 8192, 7168)[0] > 1.8 * three[0]  # the table's row
    assert four[0] == pytest.approx(three[0], rel=0.1) and four[0] == pytest.approx(
        five[0], rel=0.1
    )
    spikes = kernels.lent()["gemm_spikes"]["fp8 0.24.0"]
    assert 100 < spikes < 1000
    assert "kernels.gemm_spikes" in caplog.text


@installed
def test_a_clean_table_is_read_as_measured():
    kernels = Kernels("h200_sxm", "vllm", "0.24.0", "fp8")
    raw = Kernels("h200_sxm", "vllm", "0.24.0", "fp8", despike=False)
    assert [kernels.gemm(m, 8192, 7168) for m in range(1, 17)] == [
        raw.gemm(m, 8192, 7168) for m in range(1, 17)
    ]
    assert "gemm_spikes" not in kernels.lent()
