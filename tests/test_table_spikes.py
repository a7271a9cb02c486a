"""A fused-MoE or attention table's spikes: a row far over the same kernel's time at a larger
shape (more tokens, a longer sequence) is taken at that time before any interpolation
(:func:`simlab.cost.measured.noise.despike_along`); the rest stay as measured."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.noise import SPIKE, despike_along
from tests.test_gemm_spikes import installed

KIMI_K2_TP2 = (7168, 2048, 8, 384, 2, 1)  # Kimi-K2's experts at MoE TP 2


def frame(times: dict[int, float]) -> pd.DataFrame:
    return pd.DataFrame(list(times.items()), columns=["num_tokens", "latency"])


def despike_moe(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    return despike_along(rows, "num_tokens")


def test_a_spike_takes_the_fastest_time_at_more_tokens_and_the_rest_stay():
    # the shape of TensorRT-LLM 1.3.0rc10's H100 rows of Kimi-K2 at MoE TP 2 (ms)
    times = {512: 4.9, 768: 5.5, 1024: 17.8, 1536: 22.8, 2048: 7.6, 3072: 9.5}
    out, spikes = despike_moe(frame(times))
    got = dict(zip(out["num_tokens"], out["latency"], strict=True))
    assert spikes == 2
    assert got[1024] == got[1536] == 7.6  # the 2,048-token row bounds both
    assert {n: got[n] for n in (512, 768, 2048, 3072)} == {512: 4.9, 768: 5.5, 2048: 7.6, 3072: 9.5}


def test_rows_within_the_threshold_a_dip_and_the_last_row_are_kept():
    times = {1: 0.1, 2: 0.3, 4: 0.3 / SPIKE * 1.01, 8: 0.5, 16: 50.0}
    out, spikes = despike_moe(frame(times))  # 2 is within 1.25x of 4's; nothing bounds 16
    assert spikes == 0 and out["latency"].tolist() == list(times.values())


def test_a_token_count_measured_twice_is_bounded_by_the_faster_row_at_more_tokens():
    rows = pd.DataFrame(
        [(64, 1.0), (128, 3.0), (128, 1.1), (256, 1.5)], columns=["num_tokens", "latency"]
    )
    out, spikes = despike_moe(rows)
    assert spikes == 1 and out["latency"].tolist() == [1.0, 1.5, 1.1, 1.5]


@installed
def test_kimi_k2_on_h100_tensorrt_llm_is_no_longer_slower_at_tp_2_than_at_tp_1(caplog):
    """The raw rows put 1,024 tokens at MoE TP 2 at 17.8 ms, three times 768's and twice TP
    1's; taken at 2,048's time (7.6 ms), a prefill's experts are faster at TP 2 than at TP 1, as their
    weights and work halve. The run's summary counts the rows."""
    raw = Kernels("h100_sxm", "trtllm", "1.3.0rc10", "bf16", despike=False)
    with caplog.at_level(logging.WARNING):
        kernels = Kernels("h100_sxm", "trtllm", "1.3.0rc10", "bf16")
        tp2 = kernels.moe(1024, KIMI_K2_TP2)
    tp1 = kernels.moe(1024, (*KIMI_K2_TP2[:4], 1, 1))
    spiked = raw.moe(1024, KIMI_K2_TP2)
    assert tp1 is not None and tp2 is not None and spiked is not None
    assert spiked[0] > 1.2 * tp1[0]  # the table's row
    assert tp2[0] < tp1[0] and tp2[0] == pytest.approx(raw.moe(2048, KIMI_K2_TP2)[0])
    assert kernels.lent()["spikes"]["fused MoE 7168x2048 top-8 of 384 (MoE TP 2, EP 1)"] == 2
    assert "kernels.spikes" in caplog.text
    assert "spikes" not in raw.lent()


@installed
def test_a_clean_shape_is_read_as_measured():
    deepseek = (7168, 2048, 8, 256, 8, 1)
    kernels = Kernels("b200_sxm", "sglang", "0.5.14", "fp8")
    raw = Kernels("b200_sxm", "sglang", "0.5.14", "fp8", despike=False)
    tokens = (1, 16, 100, 1024, 5000, 16384)
    assert [kernels.moe(n, deepseek) for n in tokens] == [raw.moe(n, deepseek) for n in tokens]
    assert "spikes" not in kernels.lent()


def test_each_line_is_bounded_by_its_own_larger_shapes_only():
    rows = pd.DataFrame(
        [
            (h, n, t)
            for h, times in ((4, (1.0, 9.0, 2.0)), (8, (5.0, 1.0, 6.0)))
            for n, t in zip((16, 32, 64), times, strict=True)
        ],
        columns=["num_heads", "length", "latency"],
    )
    out, spikes = despike_along(rows, "length", ("num_heads",))
    # 4 heads at 32 (9.0) is bounded by its own 64 (2.0); 8 heads at 16 (5.0) by its own 32
    # (1.0), not by the other line's faster rows; 8 heads at 64 has no larger row on its line
    assert spikes == 2
    assert out["latency"].tolist() == [1.0, 2.0, 2.0, 1.0, 1.0, 6.0]


@installed
def test_a_short_prefill_on_b200_tensorrt_llm_is_no_longer_nineteen_times_a_longer_one(caplog):
    """TensorRT-LLM 1.3.0rc20's B200 table times a 16-token prefill at head dim 256 (4 heads,
    1 KV head: Qwen3.5-397B at TP 8) in 0.285 ms and 32 tokens in 0.015: a short chunk after a
    prefix hit took 19 times a longer one."""
    raw = Kernels("b200_sxm", "trtllm", "1.3.0rc20", despike=False)
    with caplog.at_level(logging.WARNING):
        kernels = Kernels("b200_sxm", "trtllm", "1.3.0rc20")
        sixteen = kernels.context(1, 16, 4, 1, 256)
    assert raw.context(1, 16, 4, 1, 256)[0] > 15 * raw.context(1, 32, 4, 1, 256)[0]
    assert sixteen == (raw.context(1, 32, 4, 1, 256)[0], "measured")
    assert kernels.lent()["spikes"] == {"context attention, head dim 256": 1}
    assert "kernels.spikes" in caplog.text
