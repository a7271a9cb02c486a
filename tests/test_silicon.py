"""simlab.validate silicon: which serving points it replays, the closed loop in the timed
engine, and the overhead fit with leave-one-model-out cross-validation."""

from __future__ import annotations

import numpy as np
import pytest

from simlab.cost.measured import tables
from simlab.experiments.silicon import (
    PROBE_S,
    Point,
    at,
    cross_validate,
    points,
    requests_of,
    simulate,
    spec_of,
)

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def test_models_come_from_the_configs_the_package_ships():
    llama = spec_of("meta-llama/Llama-3.1-70B", 1)
    assert llama is not None
    assert (llama.d_model, llama.n_attn_layers, llama.n_heads, llama.n_kv_heads) == (
        8192,
        80,
        64,
        8,
    )
    assert (llama.head_dim, llama.mlp_intermediate, llama.dtype_bytes) == (128, 28672, 1)
    hybrid = spec_of("Qwen/Qwen3.5-397B-A17B", 1)
    assert hybrid is not None and hybrid.ssm_kind == "gdn" and hybrid.n_moe_layers
    assert spec_of("deepseek-ai/DeepSeek-R1", 1).attn_kind == "mla"
    assert spec_of("MiniMaxAI/MiniMax-M2.5", 1) is None  # an architecture simlab.model.hf lacks
    assert spec_of("nobody/none", 1) is None  # no config shipped


def test_every_point_is_replayed_or_counted_with_its_reason():
    csv = tables.systems_dir() / "silicon_sample.csv"
    pts, skipped = points(csv)
    assert len(pts) + sum(skipped.values()) == sum(1 for _ in csv.open()) - 1
    assert len(pts) > 100 and "disaggregated" in skipped
    assert all(p.concurrency > 0 and p.ttft_ms > 0 and p.tpot_ms > 0 for p in pts)


def point(**kw) -> Point:
    base = dict(
        id="t", model="meta-llama/Llama-3.1-70B", system="h100_sxm", backend="vllm",
        version="0.24.0", precision="fp8", tp=4, concurrency=2, isl=256, osl=8,
        ttft_ms=1.0, tpot_ms=1.0,
    )  # fmt: skip
    return Point(**(base | kw))


def test_a_closed_loop_adds_the_overhead_to_every_decode_token():
    requests = requests_of(point(), duration_s=1.0)
    assert len(requests) == 6 and sorted({r.arrival for r in requests}) == [0.0, 0.5]
    ttft0, tpot0 = simulate(point(), 0.0)
    ttft1, tpot1 = simulate(point(), PROBE_S)
    assert ttft1 > ttft0 > 0
    # one iteration per output token (the clients' staggering moves with the overhead)
    assert tpot1 - tpot0 == pytest.approx(1e3 * PROBE_S, rel=0.01)


def test_the_fit_recovers_a_known_overhead_held_out_and_in_sample():
    rng = np.random.default_rng(0)
    pts = [point(model=m, id=f"{m}{i}") for m in ("a", "b", "c") for i in range(4)]
    zero = rng.uniform(10, 100, (len(pts), 2))
    sims = np.stack([zero, zero + 1e3 * PROBE_S * rng.uniform(1, 5, zero.shape)], axis=1)
    truth = at(sims, (0.005, 0.02))
    pts = [
        point(model=p.model, id=p.id, ttft_ms=float(t[0]), tpot_ms=float(t[1]))
        for p, t in zip(pts, truth, strict=True)
    ]
    cv = cross_validate(pts, sims)
    assert cv["overheads"]["vllm"]["in_sample"] == pytest.approx((0.005, 0.02))
    assert cv["overheads"]["vllm"]["without a"] == pytest.approx((0.005, 0.02))
    np.testing.assert_allclose(cv["held_out"], truth, rtol=1e-9)
