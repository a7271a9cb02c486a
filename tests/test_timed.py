"""Timed engine and cost model: replay agreement at low load, Little's law, load, seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from simlab.cache.contract import Semantics
from simlab.cache.prefix import PrefixCache
from simlab.config import ConfigError, run_settings
from simlab.cost.calibration import Calibration
from simlab.cost.hardware import Hardware
from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape
from simlab.cost.terms import CostTerms
from simlab.engines.replay import ReplayEngine
from simlab.engines.step import RequestStep
from simlab.engines.timed.batch import unique_tokens
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.feeders import SessionFeeder
from simlab.model.spec import ModelSpec
from simlab.run.simulate import policy_spec, policy_step, simulate
from tests.fixtures import CONFIGS, POLICIES, chat_trace, compose, model, policy_plugins
from traces.arrivals import assign_arrivals
from traces.format import Request

HYBRID = model("marconi_7b")
A100 = Hardware.from_config(OmegaConf.load(CONFIGS / "hardware" / "a100_40gb.yaml"))


def engine_cost(spec: ModelSpec) -> CostModel:
    """The cost model the timed engine on ``A100`` times its iterations with (measured kernels
    first)."""
    return TimedEngine(hardware=A100).cost_model(spec)


CKPT = HYBRID.ssm_state_bytes


def timed_run(policy, trace, capacity, session_rate, seed=0, spec=HYBRID, **options):
    trace = assign_arrivals(trace, session_rate=session_rate, think_time_mean=2.0, seed=seed)
    admission, eviction = policy_plugins(policy)
    step = RequestStep.build(spec, capacity, admission, eviction, policy)
    requests = list(trace.requests())
    world = TimedEngine(hardware=A100, **options).world(requests, step)
    records = world.run(SessionFeeder(requests, options.get("typing_wpm")))
    return world, records, trace


@pytest.mark.parametrize("policy", POLICIES)
def test_low_load_hits_equal_replay(policy):
    """Sessions far apart: the timed engine sees requests in the replay's order, and the
    cache's logical clock makes every policy decide identically."""
    trace = chat_trace(seed=6, sessions=10)
    _engine, timed, arrived = timed_run(policy, trace, 12 * CKPT, session_rate=1e-4)
    admission, eviction = policy_plugins(policy)
    replayed = (
        ReplayEngine()
        .run(
            list(arrived.requests()),
            RequestStep.build(HYBRID, 12 * CKPT, admission, eviction, policy),
        )
        .records
    )
    by_id = {r.request_id: r.hit_tokens for r in replayed}
    assert [r.hit_tokens for r in timed] == [by_id[r.request_id] for r in timed]
    assert sum(by_id.values()) > 0


def low_load_runs(model_name: str, policy: str, size_gb: float, *extra: str) -> list:
    """Records of the replay and of the timed engine (sessions 10^4 s apart) on 40 chat
    sessions, by request id (``extra``: more overrides)."""
    base = [
        "trace=chat",
        "trace.n_sessions=40",
        "arrivals.mode=uniform",
        "arrivals.session_rate=0.0001",
        f"model={model_name}",
        f"+policy={policy}",
        f"cache.size_gb={size_gb}",
        "bounds.enabled=false",
        "report=false",
        *extra,
    ]
    runs = [simulate(compose([*base, f"engine={e}"])).records for e in ("replay", "timed")]
    return [r.sort_values("request_id").reset_index(drop=True) for r in runs]


@pytest.mark.parametrize("policy", ["sglang", "sglang_plus", "vllm"])
def test_low_load_records_equal_replay_on_a_tight_transformer_cache(policy):
    """Llama-3-8B with room for ~760 tokens, smaller than most requests: admissions are
    truncated and branch inside edges. Sessions 10^4 s apart: the timed engine (which
    publishes SGLang's and vLLM's prompts at the end of prefill) hits and evicts as the
    replay does, request for request."""
    replayed, timed = low_load_runs("llama3_8b", policy, 0.1)
    assert replayed["admission_truncated"].any() and replayed["hit_tokens"].sum() > 0
    for column in ("hit_tokens", "nodes_evicted", "bytes_evicted", "kv_bytes_admitted"):
        np.testing.assert_array_equal(timed[column], replayed[column], err_msg=column)


@pytest.mark.parametrize(
    ("policy", "block_pool"), [("sglang", None), ("vllm", False), ("vllm", True)]
)
def test_low_load_records_equal_replay_for_production_rules_on_a_hybrid(policy, block_pool):
    """Nemotron-H-8B, 0.5 GB: SGLang's and vLLM's rules publish the prompt when its prefill
    ends, then the whole sequence; the replay makes both insertions back to back, so at low load
    the two engines evict at the same requests and hold the same bytes (the replay used to admit
    once, and 8 (SGLang) and 82 (vLLM) of 211 requests evicted differently). vLLM's both on
    the prefix tree (``block_pool=false``) and on its pool block by block (the default: both
    engines run ``simlab.engines.block_pool``'s pool, the timed one through ``simlab.engines.timed.vllm``)."""
    extra = [f"policy.admission.block_pool={block_pool}"] if policy == "vllm" else []
    replayed, timed = low_load_runs("nemotron_h_8b", policy, 0.5, *extra)
    assert replayed["nodes_evicted"].sum() > 0 and replayed["hit_tokens"].sum() > 0
    columns = ["hit_tokens", "nodes_evicted", "bytes_evicted", "kv_bytes_admitted"]
    columns += ["ssm_bytes_admitted", "cache_kv_bytes", "cache_ssm_bytes"]
    for column in columns:
        np.testing.assert_array_equal(timed[column], replayed[column], err_msg=column)


def test_littles_law_for_the_queue():
    engine, records, _ = timed_run(
        "sglang_plus", chat_trace(seed=7, sessions=30), 30 * CKPT, session_rate=3.0, max_running=4
    )
    stats = engine.stats.summary(len(records))
    mean_delay = float(np.mean([r.queue_delay for r in records]))
    assert mean_delay > 0.05, "fixture should queue"
    assert stats["mean_queue_len"] == pytest.approx(stats["arrival_rate"] * mean_delay, rel=0.02)


def test_ttft_grows_with_arrival_rate():
    p50 = []
    for rate in (0.05, 1.0, 8.0):
        _, records, _ = timed_run(
            "marconi", chat_trace(seed=8, sessions=30), 30 * CKPT, session_rate=rate, max_running=8
        )
        p50.append(float(np.median([r.ttft for r in records])))
    assert p50[0] < p50[1] < p50[2]


def test_prefix_hit_lowers_prefill_time_by_the_modelled_cost_of_the_skipped_part():
    cost = engine_cost(HYBRID)
    prompt, reply = np.arange(4000, dtype=np.int32), np.arange(20_000, 20_050, dtype=np.int32)
    second = np.concatenate((prompt, reply, np.arange(10_000, 10_450, dtype=np.int32)))
    reqs = [  # the second extends the first's input + output, checkpointed at its end (4050)
        Request(0, 0, 0, 0.0, prompt, reply, 50),
        Request(1, 1, 0, 100.0, second, np.arange(30_000, 30_010, dtype=np.int32), 10),
    ]
    admission, eviction = policy_plugins("sglang_plus")
    step = RequestStep(PrefixCache(HYBRID, math.inf), admission, eviction, "sglang_plus")
    first, warm = TimedEngine(hardware=A100).run(reqs, step).records
    assert warm.hit_tokens == 4050 and first.hit_tokens == 0
    # alone on the GPU, TTFT is exactly the predicted prefill of the uncached part
    assert warm.ttft == pytest.approx(cost.prefill_time(4050, 450))
    assert first.ttft == pytest.approx(cost.prefill_time(0, 4000))
    # the hit saves the modelled cost of the skipped part: a cold 4500-token prefill vs this one
    cold = cost.prefill_time(0, 4500)
    assert warm.prefill_time == pytest.approx(cost.prefill_time(4050, 450))
    assert cold - warm.prefill_time > 0.8 * cost.prefill_time(0, 4050)
    assert warm.flops_saved == pytest.approx(HYBRID.prefill_flops(0, 4050))


def test_a_chunked_prefill_computes_logits_only_in_the_chunk_that_ends_the_prompt():
    """A 20,000-token prompt alone in 8,192-token chunks: TTFT is the three chunks' times, the
    LM head only in the last (every chunk paid one before, 0.3-0.6 ms each)."""
    llama = model("llama3_8b")
    cost = engine_cost(llama)
    req = Request(0, 0, 0, 0.0, np.arange(20_000, dtype=np.int32), np.zeros(0, np.int32), 4)
    admission, eviction = policy_plugins("sglang_plus")
    step = RequestStep(PrefixCache(llama, math.inf), admission, eviction, "sglang_plus")
    (record,) = TimedEngine(hardware=A100, token_budget=8192).run([req], step).records
    chunks = [(0, 8192, 0), (8192, 8192, 0), (16384, 3616, 1)]
    expected = sum(cost.time(BatchShape(prefill=[(p, n)], sampled=s)) for p, n, s in chunks)
    assert record.ttft == pytest.approx(expected, rel=1e-12)
    head = cost.breakdown(BatchShape(prefill=[(0, 8192)]))["lm_head"]
    assert head > 0 and expected < sum(
        cost.time(BatchShape(prefill=[(p, n)])) for p, n, _ in chunks
    )


@pytest.mark.parametrize(("B", "P", "S"), [(32, 512, 64), (8, 2000, 200), (4, 100, 1000)])
def test_radix_mlp_compression_ratio(B, P, S):
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 1000, P, dtype=np.int32)
    seqs = [
        np.concatenate((prefix, rng.integers(1000 + i * 5000, 5000 + i * 5000, S, dtype=np.int32)))
        for i in range(B)
    ]
    n_unique = unique_tokens([(s, 0, P + S) for s in seqs])
    assert B * (P + S) / n_unique == pytest.approx(B * (P + S) / (P + B * S))


def test_radix_mlp_and_shared_attention_cut_iteration_time():
    spec = model("llama3_8b")
    cost = CostModel(spec, A100)
    plain = BatchShape(prefill=[(0, 2064)] * 8)
    dedup = BatchShape(prefill=[(0, 2064)] * 8, unique_tokens=2000 + 8 * 64)
    assert cost.time(dedup) < cost.time(plain)
    decode = BatchShape(decode=[8000] * 16)
    shared = BatchShape(decode=[8000] * 16, shared_kv_tokens=15 * 7900)
    assert cost.time(shared) < 0.5 * cost.time(decode)


def test_decode_span_equals_step_by_step():
    cost = CostModel(model("nemotron_h_8b"), A100)
    ctx = np.array([1000, 3000, 7000])
    span = cost.decode_span(ctx, 5)
    steps = [cost.time(BatchShape(decode=[int(c) + j for c in ctx])) for j in range(5)]
    assert np.allclose(span, steps)


def test_calibration_file_overrides_defaults(tmp_path):
    path = tmp_path / "calib.json"
    path.write_text(
        '{"hardware": "a100_40gb", "ops": {"gemm": {"eta_c": 0.35, "eta_m": 0.4, "t0": 1e-5}}}'
    )
    fast, slow = CostModel(HYBRID, A100), CostModel(HYBRID, A100, Calibration.load(path))
    assert slow.prefill_time(0, 4096) > fast.prefill_time(0, 4096)
    path.write_text('{"ops": {"warp_drive": {}}}')
    with pytest.raises(ValueError, match=r"calib\.json"):
        Calibration.load(path)


def test_timed_runs_are_deterministic():
    a = timed_run("marconi", chat_trace(seed=9), 10 * CKPT, session_rate=2.0)[1]
    b = timed_run("marconi", chat_trace(seed=9), 10 * CKPT, session_rate=2.0)[1]
    assert [(r.request_id, r.ttft, r.hit_tokens) for r in a] == [
        (r.request_id, r.ttft, r.hit_tokens) for r in b
    ]


def test_pins_hold_while_running_and_capacity_is_never_exceeded():
    engine, records, _ = timed_run(
        "marconi", chat_trace(seed=10, sessions=25), 6 * CKPT, session_rate=5.0
    )
    assert all(r.cache_kv_bytes + r.cache_ssm_bytes <= 6 * CKPT for r in records)
    assert not engine.cache.pins.any()
    engine.cache.check_invariants()


@pytest.mark.parametrize("policy", ["clairvoyant", "sglang_plus"])
def test_a_clairvoyant_eviction_on_the_timed_engine_is_logged_as_no_bound(policy, caplog):
    """Its future is the arrival order, which requests in flight change (README)."""
    trace = assign_arrivals(
        chat_trace(seed=6, sessions=4), session_rate=1.0, think_time_mean=2.0, seed=0
    )
    admission, eviction = policy_plugins(policy)
    step = RequestStep.build(HYBRID, 12 * CKPT, admission, eviction, policy)
    with caplog.at_level("WARNING", logger="simlab.engines.timed.world"):
        TimedEngine(hardware=A100).run(list(trace.requests()), step)
    warned = [r for r in caplog.records if "not a bound" in r.getMessage()]
    assert len(warned) == (policy == "clairvoyant")


CALIBRATIONS = CONFIGS.parent / "gpu_validate" / "calibration"


def test_decode_span_equals_step_by_step_with_a_calibration_and_terms():
    """The closed-form decode span applies the token curves and the fixed terms per step."""
    terms = CostTerms(iteration_overhead_s=1e-3, sequence_overhead_s=2e-4)
    cal = Calibration.load(CALIBRATIONS / "a100_40gb.json", "a100_40gb")
    cost = CostModel(model("nemotron_h_8b"), A100, cal, tp=2, terms=terms)
    ctx = np.array([1000, 3000, 7000])
    span = cost.decode_span(ctx, 4)
    steps = [cost.time(BatchShape(decode=[int(c) + j for c in ctx])) for j in range(4)]
    assert np.allclose(span, steps)
    plain = CostModel(model("nemotron_h_8b"), A100, cal, tp=2).decode_span(ctx, 4)
    assert np.allclose(span - plain, 1e-3 + 3 * 2e-4)  # every step: one iteration, 3 sequences


@pytest.mark.parametrize("overhead", [1e-3, 0.2])  # below a decode step's GPU time, above it
def test_an_overlapped_loop_hides_the_engine_overhead_behind_the_gpu(overhead):
    """``engine.overlap``: the engine overhead runs beside the GPU, so an iteration lasts the
    longer of the two (synchronously: their sum); the decode span agrees step by step, on its
    closed form and on the generic path (taken when a decode batch's ops have another shape)."""
    terms = CostTerms(iteration_overhead_s=overhead, sequence_overhead_s=2e-5)
    ctx = np.array([1000, 3000, 7000])
    cpu = overhead + 3 * 2e-5
    spec = model("nemotron_h_8b")
    plain = CostModel(spec, A100, tp=2)
    hidden = CostModel(spec, A100, tp=2, terms=terms, overlap=True)
    summed = CostModel(spec, A100, tp=2, terms=terms)
    gpu = plain.decode_span(ctx, 4)
    assert np.allclose(hidden.decode_span(ctx, 4), np.maximum(gpu, cpu))
    assert np.allclose(hidden._decode_span_generic(ctx.tolist(), 4), np.maximum(gpu, cpu))
    assert np.allclose(summed.decode_span(ctx, 4), gpu + cpu)
    steps = [hidden.time(BatchShape(decode=[int(c) + j for c in ctx])) for j in range(4)]
    assert np.allclose(hidden.decode_span(ctx, 4), steps)
    batch = BatchShape(prefill=[(0, 4096)], decode=[500])
    assert hidden.time(batch) == pytest.approx(max(plain.time(batch), overhead + 2 * 2e-5))


def test_state_copies_are_charged_per_load_and_per_store():
    terms = CostTerms(state_load_s=1e-3, state_store_s=5e-3)
    with_terms = CostModel(HYBRID, A100, terms=terms)
    plain = CostModel(HYBRID, A100)
    batch = BatchShape(prefill=[(512, 1024), (0, 2048)], state_loads=1, state_stores=3)
    assert with_terms.time(batch) - plain.time(batch) == pytest.approx(1e-3 + 3 * 5e-3)


def test_the_timed_engine_charges_checkpoint_stores_and_zero_terms_change_nothing():
    trace = chat_trace(seed=3, sessions=8)
    base = timed_run("marconi", trace, 20 * CKPT, session_rate=0.5)[1]
    zero = timed_run("marconi", trace, 20 * CKPT, session_rate=0.5, costs={"state_store_s": 0.0})[1]
    assert [(r.ttft, r.hit_tokens) for r in zero] == [(r.ttft, r.hit_tokens) for r in base]
    slow = timed_run("marconi", trace, 20 * CKPT, session_rate=0.5, costs={"state_store_s": 0.05})[
        1
    ]
    assert sum(r.ttft for r in slow) > sum(r.ttft for r in base) + 0.05


def test_the_prompt_end_state_of_a_hash_id_request_is_charged_where_its_input_ends():
    """Three ids of 512 tokens holding 1,300 (the last block partial), alone: the state taken
    at the prompt's end (id 3) is stored in its last prefill chunk and charged once. At
    3 x 512 = 1,536 tokens it lay past the 1,300 prefilled and was never charged."""
    admission, eviction = policy_plugins("sglang_plus")
    step = RequestStep(PrefixCache(HYBRID, math.inf, unit_tokens=512), admission, eviction, "p")
    ids, empty = np.arange(1, 4, dtype=np.int32), np.zeros(0, dtype=np.int32)
    req = Request(0, 0, 0, 0.0, ids, empty, 1, block_size=512, ref_input_tokens=1300)
    engine = TimedEngine(hardware=A100, costs={"state_store_s": 0.05})
    (record,) = engine.run([req], step).records
    cost = engine.cost_model(HYBRID)
    assert record.ttft == pytest.approx(cost.time(BatchShape(prefill=[(0, 1300)], state_stores=1)))
    assert record.ttft > engine_cost(HYBRID).prefill_time(0, 1300) + 0.05 - 1e-9


def test_vllm_plus_stores_every_state_of_a_hash_id_as_of_its_tokens():
    """vLLM+ on three 512-token ids stores a state per 32 tokens, 48, not one per id: alone, its
    first token comes when the same prompt's tokens spelled out get theirs."""
    cfg = compose(["+policy=vllm_plus", "cache.size_gb=inf"])
    settings = run_settings(cfg)
    empty = np.zeros(0, dtype=np.int32)
    by_ids = Request(0, 0, 0, 0.0, np.arange(1, 4, dtype=np.int32), empty, 1, block_size=512)
    tokens = Request(0, 0, 0, 0.0, np.arange(512, 2048, dtype=np.int32), empty, 1)
    ttft = []
    for req, unit in ((by_ids, 512), (tokens, 1)):
        step = policy_step(policy_spec("vllm_plus", cfg.policy), HYBRID, settings, unit_tokens=unit)
        engine = TimedEngine(hardware=A100, costs={"state_store_s": 0.05})
        ttft.append(engine.run([req], step).records[0].ttft)
    assert ttft[0] == pytest.approx(ttft[1])
    assert ttft[0] > engine_cost(HYBRID).prefill_time(0, 1536) + 48 * 0.05 - 1e-9


def test_a_whole_input_hit_still_computes_the_last_position_for_its_first_token():
    """Under the reference's ``whole_input_hit`` a repeated prompt hits all of its input; the
    first token still needs that position's logits, so alone its TTFT is a one-token prefill
    over the rest (it was NaN: no prefill chunk ever ran)."""
    llama = model("llama3_8b")
    cache = PrefixCache(llama, math.inf, semantics=Semantics(whole_input_hit=True))
    admission, eviction = policy_plugins("sglang_plus")
    prompt, out = np.arange(100, dtype=np.int32), np.arange(500, 505, dtype=np.int32)
    reqs = [Request(i, i, 0, 100.0 * i, prompt, out, 5) for i in range(2)]
    first, again = (
        TimedEngine(hardware=A100).run(reqs, RequestStep(cache, admission, eviction, "p")).records
    )
    assert again.hit_tokens == 100 and first.hit_tokens == 0
    assert again.ttft == pytest.approx(engine_cost(llama).prefill_time(99, 1))


def test_a_calibration_for_another_preset_is_rejected_by_the_engine():
    with pytest.raises(
        ConfigError,
        match=r"engine\.calibration: calibration file .*h100_sxm\.json: fitted for hardware 'h100_sxm', not for the preset 'a100_40gb'",
    ):
        TimedEngine(hardware=A100, calibration=str(CALIBRATIONS / "h100_sxm.json"))
    with pytest.raises(ConfigError, match=r"engine\.costs\.state_store_s must be >= 0"):
        TimedEngine(hardware=A100, costs={"state_store_s": -1})


def test_a_calibration_file_missing_a_class_or_with_a_negative_overhead_is_rejected(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text('{"ops": {"gemm": {"eta_c": 0.5, "eta_m": 0.5, "t0": 0}}, "unmeasured": {}}')
    with pytest.raises(
        ValueError, match=r"cal\.json: op class 'attn_prefill' is neither in ops nor"
    ):
        Calibration.load(path)
    path.write_text('{"ops": {"gemm": {"eta_c": 0.5, "eta_m": 0.5, "t0": -1e-6}}}')
    with pytest.raises(
        ValueError, match=r"cal\.json: ops\.gemm: t0 \(overhead per launch\) must be >= 0"
    ):
        Calibration.load(path)
    path.write_text('{"ops": {"gemm": {"eta_c": 0.5, "t0": 0}}}')
    with pytest.raises(ValueError, match=r"cal\.json: ops\.gemm: missing eta_m"):
        Calibration.load(path)
    path.write_text('{"ops": {"gemm": {"eta_c": 0.5, "eta_m": 0.5, "t0": Infinity}}}')
    with pytest.raises(ValueError, match=r"cal\.json: ops\.gemm: t0 .* finite, got inf"):
        Calibration.load(path)
    curve = '"curve": {"x": "tokens", "knots": [1, 64], "scale": [1.0, Infinity]}'
    path.write_text(f'{{"ops": {{"gemm": {{"eta_c": 0.5, "eta_m": 0.5, "t0": 0, {curve}}}}}}}')
    with pytest.raises(ValueError, match=r"cal\.json: ops\.gemm: curve scales must be finite"):
        Calibration.load(path)


def test_a_calibration_file_naming_no_hardware_is_refused_for_a_preset(tmp_path):
    """The file cannot show it was fitted for the preset's GPU, so the engine refuses it; a
    file read on its own (no preset) is still accepted."""
    path = tmp_path / "cal.json"
    path.write_text('{"ops": {"gemm": {"eta_c": 0.5, "eta_m": 0.5, "t0": 0}}}')
    assert Calibration.load(path).hardware is None
    with pytest.raises(
        ConfigError,
        match=r"engine\.calibration: calibration file .*cal\.json: no hardware name: cannot "
        r"tell whether it was fitted for the preset 'a100_40gb'",
    ):
        TimedEngine(hardware=A100, calibration=str(path))
