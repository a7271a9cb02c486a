"""Prefill/decode disaggregation (``cluster.disaggregated``): the prefill side is a cluster of
prefill-only replicas (an oracle), the KV transfer is on each request's path, every request
completes, bad input."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from simlab.config import ClusterSettings
from simlab.engines.cluster.disaggregated import prompt_only
from simlab.engines.cluster.engine import ClusterEngine
from simlab.engines.records import records_frame
from simlab.engines.timed.engine import TimedEngine
from simlab.run.cli import USER_ERRORS
from simlab.run.simulate import simulate
from tests.fixtures import compose, hot_prefix_trace
from tests.test_cluster import A100, HYBRID, LLAMA, chat_requests, fresh_step

PREFILL_SIDE = ["hit_tokens", "matched_tokens", "scheduled", "first_token", "ttft", "replica"]


def run(requests, build, replicas, link_bw, router="prefix_aware", **settings):
    cluster = ClusterSettings(
        replicas, router, disaggregated=True, link_bw_gbps=link_bw, **settings
    )
    result = ClusterEngine(TimedEngine(hardware=A100), cluster).run(requests, build(), build)
    return records_frame(result.records).assign(**result.columns), result


def colocated(requests, build, replicas, router="prefix_aware"):
    result = ClusterEngine(TimedEngine(hardware=A100), ClusterSettings(replicas, router)).run(
        requests, build(), build
    )
    return records_frame(result.records).assign(**result.columns)


def one_request_sessions():
    """Independent one-request sessions: arrivals do not depend on completions."""
    return list(hot_prefix_trace(seed=4, requests=90).requests())


@pytest.mark.parametrize("router", ["round_robin", "prefix_aware"])
def test_the_prefill_side_is_a_cluster_serving_the_prompts_alone(router):
    """Oracle: with one-request sessions, the prefill replicas of a 2 + 2 disaggregated
    cluster hit, schedule and produce first tokens exactly as a 2-replica cluster serving the
    prompts alone (no output: the decode replicas make it)."""
    requests = one_request_sessions()
    build = fresh_step("sglang_plus", spec=LLAMA, capacity=2e9)
    split, _ = run(requests, build, 4, math.inf, router, prefill_replicas=2)
    prompts = colocated([prompt_only(r) for r in requests], build, 2, router)
    pd.testing.assert_frame_equal(split[PREFILL_SIDE], prompts[PREFILL_SIDE], check_exact=True)
    assert set(split["replica"]) <= {0, 1}


def test_the_kv_transfer_is_on_the_path_to_the_second_token():
    """Each request with more than one output token moves ``input x KV bytes per token`` over
    the link and reaches a decode replica; its completion is at least the transfer plus one
    decode step after its first token; with a slower link no TTFT changes (one-request
    sessions) and no request completes earlier in total."""
    requests = one_request_sessions()
    build = fresh_step("sglang_plus", spec=LLAMA, capacity=2e9)
    fast, _ = run(requests, build, 3, math.inf, prefill_replicas=1)
    slow, result = run(requests, build, 3, 2.0, prefill_replicas=1)
    many = slow["output_tokens"] > 1
    expected = slow["input_tokens"] * LLAMA.kv_bytes_per_token / 2e9
    assert np.allclose(slow.loc[many, "kv_transfer_s"], expected[many], rtol=1e-12)
    assert (slow.loc[~many, "kv_transfer_s"] == 0).all()
    assert set(slow.loc[many, "decode_replica"]) <= {1, 2}
    assert (slow.loc[~many, "decode_replica"] == -1).all()
    gap = slow["finished"] - slow["first_token"]
    assert (gap[many] > slow.loc[many, "kv_transfer_s"]).all()
    assert (fast.loc[many, "kv_transfer_s"] == 0).all()
    pd.testing.assert_series_equal(slow["ttft"], fast["ttft"])
    assert slow["e2e"].sum() > fast["e2e"].sum()
    assert result.extras["prefill_replicas"] == 1 and result.extras["decode_replicas"] == 2


def test_every_request_completes_with_its_whole_output_on_a_hybrid_model():
    """Chat sessions (the next turn waits for the previous one's last token) on a hybrid model:
    every request has a record with its whole output, TTFT <= end, and the state travels too."""
    requests = chat_requests(seed=5, sessions=10, rate=2.0)
    build = fresh_step("marconi", spec=HYBRID)
    frame, _ = run(requests, build, 3, 10.0, prefill_replicas=2)
    assert sorted(frame["request_id"]) == sorted(r.request_id for r in requests)
    outputs = {r.request_id: r.output_len for r in requests}
    assert frame["output_tokens"].tolist() == [outputs[i] for i in frame["request_id"]]
    assert (frame["first_token"] <= frame["finished"]).all()
    many = frame["output_tokens"] > 1
    per_token = HYBRID.kv_bytes_per_token
    expected = (frame["input_tokens"] * per_token + HYBRID.ssm_state_bytes) / 10e9
    assert np.allclose(frame.loc[many, "kv_transfer_s"], expected[many], rtol=1e-12)


def test_a_prefill_replica_caches_the_prompt_only():
    """The next turn of a session can reuse at most the previous prompt on the prefill side
    (its answer was generated on a decode replica), so the hit is below a colocated cluster's,
    where the answer is cached too."""
    requests = chat_requests(seed=1, sessions=8, rate=0.5)
    build = fresh_step("sglang_plus", spec=LLAMA, capacity=5e9)
    split, _ = run(requests, build, 2, math.inf, "session_affinity")
    together = colocated(requests, build, 1, "session_affinity")
    assert split["hit_tokens"].sum() < together["hit_tokens"].sum()
    assert (split["kv_bytes_admitted"] <= split["input_tokens"] * LLAMA.kv_bytes_per_token).all()


def test_a_disaggregated_run_writes_its_columns_and_summary(tmp_path):
    out = tmp_path / "out"
    overrides = [
        "report=false",
        "engine.calibration=null",
        "bounds.enabled=false",
        "+policy=sglang_plus",
        "cluster.replicas=3",
        "cluster.disaggregated=true",
        "cluster.link_bw_gbps=25",
        f"output_dir={out}",
    ]
    summary = simulate(compose(overrides)).policies["sglang_plus"]
    records = pd.read_parquet(out / "records.parquet")
    assert {"decode_replica", "kv_transfer_s", "replica"} <= set(records.columns)
    assert summary["disaggregated"] is True
    assert (summary["prefill_replicas"], summary["decode_replicas"]) == (1, 2)
    assert len(summary["decode_gpu_busy_frac"]) == 2
    assert summary["kv_transfer_s_mean"] == pytest.approx(records["kv_transfer_s"].mean())


BAD = [
    (
        ["cluster.disaggregated=true", "cluster.link_bw_gbps=10"],
        "cluster.disaggregated: needs cluster.replicas >= 2",
    ),
    (
        ["cluster.replicas=2", "cluster.disaggregated=true"],
        "cluster.link_bw_gbps: a disaggregated cluster",
    ),
    (
        ["cluster.replicas=2", "cluster.disaggregated=true", "cluster.link_bw_gbps=0"],
        "cluster.link_bw_gbps: must be a number > 0 or inf (got 0)",
    ),
    (
        [
            "cluster.replicas=3",
            "cluster.disaggregated=true",
            "cluster.link_bw_gbps=10",
            "cluster.prefill_replicas=3",
        ],
        "cluster.prefill_replicas: must be an integer from 1 to cluster.replicas - 1 = 2 (got 3)",
    ),
    (
        ["cluster.replicas=2", "cluster.link_bw_gbps=10"],
        "cluster.link_bw_gbps: only with cluster.disaggregated=true",
    ),
    (
        [
            "cluster.replicas=2",
            "cluster.disaggregated=true",
            "cluster.link_bw_gbps=10",
            "engine.kv_pool=shared",
        ],
        "cluster.disaggregated: not supported with engine.kv_pool=shared",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=lambda v: str(v)[:50])
def test_bad_disaggregation_config_is_one_line_naming_the_key(tmp_path, overrides, message):
    cfg = compose(
        ["report=false", "engine.calibration=null", *overrides, f"output_dir={tmp_path / 'o'}"]
    )
    with pytest.raises(USER_ERRORS) as caught:
        simulate(cfg)
    text = str(caught.value)
    assert message in text and "\n" not in text
