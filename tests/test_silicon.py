"""simlab.validate silicon: which serving points it replays, the closed loop in the timed
engine, and the overhead fit with leave-one-model-out cross-validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from simlab.cost.measured import tables
from simlab.engines.timed.feeders import ConcurrencyFeeder
from simlab.engines.timed.world import TimedWorld
from simlab.experiments.silicon import (
    CONFIGS,
    PROBE_S,
    Point,
    points,
    requests_of,
    simulate,
    spec_of,
    version_for,
)
from simlab.experiments.silicon_fit import at, cross_validate, distinct, folds, summary
from simlab.experiments.silicon_recipes import Recipe, recipe
from simlab.run.plan import plan_run
from simlab.run.policy import policy_step

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
    assert spec_of("deepseek-ai/DeepSeek-V3.2", 1) is None  # an architecture simlab.model.hf lacks
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


def test_the_benchmark_prompts_are_the_clients():
    requests = requests_of(point(concurrency=3, isl=1000, osl=50))
    assert len(requests) == 30 and {r.arrival for r in requests} == {0.0}
    assert len({r.session_id for r in requests}) == 30  # single-turn: no session reuse
    assert all(800 <= r.input_tokens <= 1000 and 40 <= r.output_len <= 50 for r in requests)
    assert len({r.input_tokens for r in requests}) > 10  # drawn, not fixed
    assert requests_of(point())[0].input_ids.tolist() == requests_of(point())[0].input_ids.tolist()


def test_at_most_c_requests_are_in_flight_and_each_next_starts_on_a_completion():
    """bench_serving at --max-concurrency C --request-rate inf: the first C together, then the
    next in order the moment one finishes."""
    requests = requests_of(point(concurrency=3, isl=600, osl=6))
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(  # the point's GPU: its FP8 GEMMs are measured there, not on an A100
            config_name="config",
            overrides=["+policy=fifo", "engine=timed", "hardware=h100_sxm", "report=false"],
        )
    plan = plan_run(cfg)
    (policy,) = plan.policies.values()
    spec = spec_of(point().model, 1)
    cost = plan.engine.cost_model(spec)
    step = policy_step(policy, spec, plan.settings)
    feeder = ConcurrencyFeeder(requests, 3)
    records = sorted(
        TimedWorld(requests, step, cost, plan.engine).run(feeder), key=lambda r: r.arrival
    )
    assert len(records) == 30
    assert [r.arrival for r in records[:3]] == [0.0] * 3 and records[3].arrival > 0
    finishes = sorted(r.finished for r in records)
    for r in records[3:]:  # each later request starts exactly when an earlier one ends
        assert min(abs(f - r.arrival) for f in finishes) == pytest.approx(0.0, abs=1e-12)
    for r in records:
        in_flight = sum(q.arrival <= r.arrival < q.finished for q in records)
        assert in_flight <= 3
    assert [r.request_id for r in records] == sorted(r.request_id for r in records)


def test_the_iteration_overhead_adds_once_to_every_decode_token():
    ttft0, tpot0 = simulate(point(), 0.0)
    ttft1, tpot1 = simulate(point(), PROBE_S)
    assert ttft1 > ttft0 > 0
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


def test_a_point_runs_with_its_launch_scripts_holds(monkeypatch):
    """Llama-3.1-70B on TensorRT-LLM at TP 4 and 1,024 / 1,024 tokens ran with
    ``batch_wait_timeout_iters: 20`` (InferenceX's script; TP 8 without it): each later prompt
    waits 20 decode iterations beside the running ones, so the point's TTFT grows by about 20
    decode steps over the same point run with the engine's defaults."""
    import simlab.experiments.silicon as silicon

    p = point(system="b200_sxm", backend="trtllm", version="1.3.0rc20", concurrency=2,
              isl=1024, osl=1024)  # fmt: skip
    assert recipe(p).batch_wait_iters == 20 and recipe(p).token_budget == 16384
    assert (
        recipe(
            point(system="b200_sxm", backend="trtllm", tp=8, isl=1024, osl=1024)
        ).batch_wait_iters
        == 0
    )
    held_ttft, tpot = simulate(p, 0.0)
    defaults = Recipe("defaults", token_budget=16384, kv_dtype_bytes=1)  # the same FP8 cache
    monkeypatch.setattr(silicon, "recipe", lambda _: defaults)
    plain_ttft, plain_tpot = simulate(p, 0.0)
    assert tpot == pytest.approx(plain_tpot, rel=0.01)
    # 20 held iterations for every prompt but the opening pair (arriving to an idle engine)
    assert held_ttft - plain_ttft == pytest.approx(20 * tpot * 18 / 20, rel=0.15)


def test_minimax_runs_with_its_vllm_scripts_flags_or_is_counted():
    """MiniMax-M2.5 FP8 (read as Mixtral-like MoE: 62 layers of 256 experts, top 8): on B200
    from 2026-04-03 its script passes ``--max-num-batched-tokens`` twice the ISL, an FP8 KV
    cache and 0.90 of the memory; on H200 on 2026-03-01 vLLM's defaults at 0.95. Its scripts
    of the weeks between passed ``--enable-expert-parallel`` at the csv's EP 1: those points
    run with their experts over all tp GPUs. B300's nightly run of 2026-04-03 has no script
    read here: counted, not replayed."""
    from simlab.experiments.silicon import NO_SCRIPT_REASON, spec_of
    from simlab.experiments.silicon_recipes import script_expert_parallel

    spec = spec_of("MiniMaxAI/MiniMax-M2.5", 1)
    assert spec is not None and spec.n_moe_layers == 62 == spec.n_attn_layers
    assert (spec.moe_experts, spec.moe_top_k, spec.moe_shared_intermediate) == (256, 8, 0)
    minimax = dict(model="MiniMaxAI/MiniMax-M2.5", backend="vllm", isl=8192, osl=1024)
    b200 = recipe(point(system="b200_sxm", measured="2026-04-03", **minimax))
    assert (b200.token_budget, b200.kv_dtype_bytes, b200.memory_fraction) == (16384, 1, 0.9)
    assert b200.source.endswith("minimaxm2.5_fp8_b200.sh@bddbf4031")
    early = recipe(point(system="b200_sxm", measured="2026-03-28", **minimax))
    assert (early.token_budget, early.kv_dtype_bytes, early.memory_fraction) == (8192, 2, 0.95)
    assert early.moe_kernel == "vllm_fused_moe"  # FlashInfer's and DeepGEMM's MoE off
    h200 = recipe(point(system="h200_sxm", measured="2026-03-01", **minimax))
    assert (h200.token_budget, h200.kv_dtype_bytes, h200.memory_fraction) == (8192, 2, 0.95)
    assert script_expert_parallel("MiniMaxAI/MiniMax-M2.5", "h200_sxm", "2026-03-27")
    assert script_expert_parallel("MiniMaxAI/MiniMax-M2.5", "b200_sxm", "2026-03-28")
    assert not script_expert_parallel("MiniMaxAI/MiniMax-M2.5", "b200_sxm", "2026-04-03")
    assert recipe(point(system="b300_sxm", measured="2026-04-03", **minimax)).source[:4] == "none"
    pts, skipped = points(tables.systems_dir() / "silicon_sample.csv")
    assert skipped[NO_SCRIPT_REASON] == 16
    replayed = [p for p in pts if p.model == minimax["model"]]
    by_script = [p for p in replayed if script_expert_parallel(p.model, p.system, p.measured)]
    assert len(by_script) == 94 and all(p.ep == p.tp > 1 for p in by_script)
    assert len(replayed) == 176 + 94 + 35  # + the csv's own EP 2-4 points (H100, B200)
    assert {p.ep for p in replayed if p.system == "h100_sxm"} == {4}


def test_deepseeks_tensorrt_llm_token_budget_is_its_scripts_at_the_measurement_date():
    """``max_num_tokens`` is the concurrency + ISL + 64 rounded up to 64; the scripts from
    2026-01-21 raise it to at least 8,192, the slurm scripts before did not: at 1,024 tokens the
    earlier points prefilled one prompt an iteration."""

    def budget(system, measured, isl, concurrency):  # fmt: skip
        p = point(model="deepseek-ai/DeepSeek-R1", system=system, backend="trtllm", tp=8,
                  measured=measured, isl=isl, concurrency=concurrency)  # fmt: skip
        return recipe(p).token_budget

    assert budget("h200_sxm", "2025-11-02", 1024, 4) == 1152
    assert budget("h200_sxm", "2025-11-02", 1024, 256) == 1344
    assert budget("h200_sxm", "2025-11-02", 8192, 4) == 8320
    assert budget("b200_sxm", "2025-11-02", 1024, 64) == 1152
    assert budget("b200_sxm", "2026-01-29", 1024, 4) == 8192
    assert budget("h200_sxm", "2026-01-14", 1024, 4) == 1152  # before the floor reached H200
    assert budget("h200_sxm", "2026-01-28", 1024, 4) == 8192
    assert budget("b200_sxm", "2026-01-29", 8192, 64) == 8320


def test_a_point_runs_on_the_measured_version_closest_to_the_one_it_ran():
    """The csv's version, else the image of the workflow that measured it (InferenceX ran
    vLLM 0.10.2 and TensorRT-LLM 1.1.0rc2.post2 in October 2025): the newest measured at or
    below it, else the oldest above; never a development build; a nightly takes the newest."""
    have = tables.versions("h100_sxm", "vllm")
    assert any(".dev" in v for v in have)  # 0.1.dev..., which orders below every release
    llama = point(version="nan", system="h100_sxm")
    assert recipe(llama).image_version == "0.10.2"
    releases = [v for v in have if ".dev" not in v]
    assert version_for(llama) == releases[0]  # nothing measured at or below 0.10.2
    assert version_for(point(version="99.0.0")) == releases[-1]
    sglang = tables.versions("b200_sxm", "sglang")
    deepseek = dict(model="deepseek-ai/DeepSeek-R1", system="b200_sxm", backend="sglang", tp=8)
    older = point(version="0.5.6", **deepseek)
    above = [v for v in sglang if tables.version_key(v) > tables.version_key("0.5.6")]
    assert version_for(older) == above[0] != sglang[-1]
    assert version_for(point(version="nightly-dev", **deepseek)) == sglang[-1]


def test_one_architecture_is_held_out_as_one_model():
    """DeepSeek-V3 and R1 share their config but for the name, and the csv gives most of V3's
    points R1's very measurements: they leave the fit together, each other model alone."""
    pts, _ = points(tables.systems_dir() / "silicon_sample.csv")
    r1 = {(p.system, p.backend, p.tp, p.concurrency, p.isl, p.osl, p.ttft_ms)
          for p in pts if p.model == "deepseek-ai/DeepSeek-R1"}  # fmt: skip
    v3 = [p for p in pts if p.model == "deepseek-ai/DeepSeek-V3"]
    copies = [p for p in v3 if (p.system, p.backend, p.tp, p.concurrency, p.isl, p.osl, p.ttft_ms) in r1]  # fmt: skip
    assert len(copies) > len(v3) / 2
    fold = folds({p.model for p in pts})
    assert fold["deepseek-ai/DeepSeek-V3"] == fold["deepseek-ai/DeepSeek-R1"]
    assert len(set(fold.values())) == len(fold) - 1
    sims = np.zeros((len(pts), 2, 2))
    cv = cross_validate(pts, sims)
    deepseek = "without deepseek-ai/DeepSeek-R1 + deepseek-ai/DeepSeek-V3"
    assert set(cv["overheads"]["trtllm"]) == {
        "in_sample",
        deepseek,
        "without meta-llama/Llama-3.1-70B",
    }


def test_each_measurement_counts_once_in_the_distinct_figure():
    """The csv repeats measurements, one row per dump file (their TTFTs differ in the last
    digit at most), and gives DeepSeek-V3 R1's: ``distinct`` keeps each once, and a point of
    another shape or another TTFT stays."""
    pts, _ = points(tables.systems_dir() / "silicon_sample.csv")
    first = distinct(pts)
    assert 500 < len(first) < len(pts)
    key = lambda p: (p.system, p.backend, p.precision, p.tp, p.concurrency, p.isl, p.osl)  # noqa: E731
    kept = {(key(pts[i]), round(pts[i].ttft_ms, 6)) for i in first}
    assert len(kept) == len(first)  # no two kept points are one measurement
    assert all((key(p), round(p.ttft_ms, 6)) in kept for p in pts)  # every one is kept once
    base = pts[first[0]]
    twin = dataclasses.replace(base, id="twin", ttft_ms=base.ttft_ms * (1 + 1e-15))
    other = dataclasses.replace(base, id="other", ttft_ms=base.ttft_ms * 1.01)
    assert distinct([base, twin, other]) == [0, 2]
    sims = np.ones((3, 2, 2))
    once = summary([base, twin, other], cross_validate([base, twin, other], sims))["distinct"]
    assert once["points"] == 2


def test_the_runs_of_speculative_decoding_configs_are_counted_not_replayed():
    """The csv does not mark InferenceX's MTP runs. Two are known by their image and date:
    DeepSeek-R1 FP8 on B200 with TensorRT-LLM 1.2.0rc6.post3 on 2026-02-05 (its non-MTP config
    ran 1.2.0rc6.post2) and Qwen3.5 FP8 on B200 with SGLang v0.5.9-cu130 on 2026-03-20 (its
    non-MTP config ran v0.5.9-cu129-amd64). They decode several tokens a step, which the replay
    does not model."""
    from simlab.experiments.silicon_recipes import speculative

    source = "model=x; silicon_concurrency=4; measured=2026-02-05T19:55:05Z; image=nvcr.io#nvidia/tensorrt-llm/release:1.2.0rc6.post3"  # fmt: skip
    assert speculative("deepseek-ai/DeepSeek-R1", "b200_sxm", "trtllm", "fp8", source)
    assert not speculative("deepseek-ai/DeepSeek-R1", "b200_sxm", "trtllm", "fp8",
                           source.replace("post3", "post2"))  # fmt: skip
    assert not speculative("deepseek-ai/DeepSeek-R1", "b200_sxm", "trtllm", "fp8",
                           source.replace("02-05", "02-06"))  # fmt: skip
    pts, skipped = points(tables.systems_dir() / "silicon_sample.csv")
    assert skipped["speculative decoding (an InferenceX MTP config's run)"] == 78
    assert not any(
        p.measured in ("2026-02-05", "2026-03-20") for p in pts if p.system == "b200_sxm"
    )
    assert any(p.measured == "2026-01-29" and p.backend == "trtllm" for p in pts)  # its non-MTP run


def test_nvidias_own_runs_are_counted_as_such_not_as_parallel():
    """NVIDIA's own rows ("aic-auto-gap-analysis") give no attention-DP degree (blank, which
    compared as parallel) and name no client, whose fixed or spread lengths decide their TTFT:
    they are counted under their own reason; every row that gives no attention-DP degree or no
    precision is one of them."""
    from simlab.experiments.silicon import NVIDIA_REASON, NVIDIA_RUNS

    csv = tables.systems_dir() / "silicon_sample.csv"
    frame = pd.read_csv(csv)
    nvidia = frame.silicon_data_source.str.contains(NVIDIA_RUNS)
    agg = frame["mode"] == "agg"
    blank = frame.attention_dp_size.isna() | frame.precision.isna()
    assert (nvidia | ~(blank & agg)).all()
    pts, skipped = points(csv)
    assert skipped[NVIDIA_REASON] == int((nvidia & agg).sum()) > 800
    replayed = {p.id for p in pts}
    assert not replayed & set(frame.id[nvidia])


def test_each_groups_own_overheads_are_a_floor_not_a_prediction():
    """Two groups of one engine, each with its own true overheads: the engine's one fit misses
    them, the groups' own fits recover each exactly."""
    rng = np.random.default_rng(1)
    pts = [point(model=m, id=f"{m}{i}") for m in ("a", "b") for i in range(6)]
    zero = rng.uniform(10, 100, (len(pts), 2))
    sims = np.stack([zero, zero + 1e3 * PROBE_S * rng.uniform(1, 5, zero.shape)], axis=1)
    truth = np.concatenate([at(sims[:6], (0.002, 0.01)), at(sims[6:], (0.01, 0.2))])
    pts = [
        point(model=p.model, id=p.id, ttft_ms=float(t[0]), tpot_ms=float(t[1]))
        for p, t in zip(pts, truth, strict=True)
    ]
    cv = cross_validate(pts, sims)
    np.testing.assert_allclose(cv["own_group"], truth, rtol=1e-9)
    assert np.abs(cv["in_sample"] / truth - 1).mean() > 0.01
