"""simlab.validate silicon: each point's KV pool sized as its engine sizes it, and the engines'
admission against it (:mod:`simlab.experiments.silicon_memory`)."""

from __future__ import annotations

import dataclasses

import pytest

from simlab.cost.measured import tables
from simlab.cost.shapes import on_tp
from simlab.engines.timed.pool_sizing import GIB, aic_model, gpu_memory, weights_per_gpu
from simlab.experiments import silicon
from simlab.experiments.silicon import Point, pool_of, simulate, spec_of

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def point(**kw) -> Point:
    base = dict(
        id="t", model="meta-llama/Llama-3.1-70B", system="h200_sxm", backend="trtllm",
        version="1.3.0rc20", precision="fp8", tp=1, concurrency=64, isl=1024, osl=8192,
        ttft_ms=1.0, tpot_ms=1.0, gemm_quant="fp8", moe_quant="fp8",
    )  # fmt: skip
    return Point(**(base | kw))


@pytest.mark.parametrize(
    ("backend", "version", "fraction"),
    [("trtllm", "1.3.0rc20", 0.9), ("vllm", "0.24.0", 0.9)],
)
def test_each_engine_sizes_its_pool_by_its_own_rule(backend, version, fraction):
    """TensorRT-LLM takes its fraction of what the weights, activations and buffers leave
    free; vLLM its fraction of the whole memory less them; the replica's pool is tp GPUs'."""
    p = point(backend=backend, version=version, tp=2)
    pool = pool_of(p)
    assert pool is not None and pool.fraction == fraction
    g = pool.per_gpu
    non_kv = g["weights"] + g["activations"] + g["runtime"] + g["communication"]
    kv = (
        fraction * (g["capacity"] - non_kv)
        if backend == "trtllm"
        else (fraction * g["capacity"] - non_kv)
    )
    assert g["kv"] == pytest.approx(kv, rel=1e-9)
    assert pool.gb == pytest.approx(2 * kv * GIB / 1e9, rel=1e-9)
    held = on_tp(spec_of(p.model, 1, 1), 2)
    assert pool.tokens == int(pool.gb * 1e9 // held.kv_bytes_per_token)


def test_sglang_keeps_activations_out_of_its_static_fraction():
    """SGLang's pool is mem_fraction_static of the memory less what is resident after loading
    (its KVCacheConfigurator): the activations aiconfigurator models do not shrink it."""
    p = point(model="deepseek-ai/DeepSeek-R1", system="b200_sxm", backend="sglang",
              version="0.5.16", tp=8, gemm_quant="fp8", moe_quant="fp8_block")  # fmt: skip
    pool = pool_of(p)
    assert pool is not None and pool.fraction == 0.82  # the script's --mem-fraction-static
    g = pool.per_gpu
    assert g["activations"] > 1  # modelled, and not charged
    assert g["kv"] == pytest.approx(0.82 * g["capacity"] - g["weights"] - g["communication"])


def test_weights_are_the_replayed_models_parameters():
    """Llama-3.1-70B at FP8: simlab's weights and aiconfigurator's agree to 0.1%; DeepSeek-R1's
    are its 671 billion parameters at one byte, the embedding and LM head at two."""
    llama = spec_of("meta-llama/Llama-3.1-70B", 1, 1)
    theirs = gpu_memory(aic_model(llama.name), "h200_sxm", "trtllm", "1.3.0rc20", 1, 16384,
                     ("fp8", "fp8", "fp8"))  # fmt: skip
    assert theirs is not None
    assert weights_per_gpu(on_tp(llama, 1), 1) == pytest.approx(theirs["weights"], rel=1e-3)
    deepseek = on_tp(spec_of("deepseek-ai/DeepSeek-R1", 1, 1), 8)
    params = deepseek.layer_params + deepseek.embedding_params
    assert 670e9 < params < 672e9
    assert weights_per_gpu(deepseek, 8) == (params + deepseek.embedding_params) / 8


def test_past_its_pool_trtllm_queues_where_vllm_admits_on_the_prompt():
    """Llama-3.1-70B on one H200 at 1,024 / 8,192 tokens and concurrency 64: 64 requests' whole
    KV exceeds the pool. TensorRT-LLM (GUARANTEED_NO_EVICT) starts a request only once its
    prompt and output fit, so the rest wait whole generations (measured: 79.5 s mean TTFT);
    vLLM starts each on its prompt's blocks and preempts later (measured: 5.3 s)."""
    trt = point()
    vllm = point(backend="vllm", version="0.24.0")
    assert pool_of(trt).tokens < 64 * (1024 + 8192) * 0.9
    trt_ttft, _ = simulate(trt, 0.0)
    vllm_ttft, _ = simulate(vllm, 0.0)
    assert trt_ttft > 20_000 and vllm_ttft < trt_ttft / 5


def test_a_point_without_a_memory_model_runs_unconstrained(monkeypatch):
    """Where aiconfigurator-core cannot size a pool, the point's memory is not constrained (as
    every point was before pools were sized), and its row says so with a null ``kv_pool``."""
    p = point(concurrency=4, osl=64)
    monkeypatch.setattr(silicon, "kv_pool", lambda *_: None)
    assert pool_of(p) is None
    ttft, tpot = simulate(p, 0.0)
    assert ttft > 0 and tpot > 0


def test_an_fp8_checkpoint_keeps_its_states_in_its_bf16_dtype_under_vllm():
    """vLLM's ``mamba_ssm_cache_dtype: auto`` is the model's dtype: for an FP8 checkpoint
    (one byte a weight) its BF16 ``torch_dtype``, not an unknown one-byte dtype."""
    from policies.production import VLLM

    qwen = spec_of("Qwen/Qwen3.5-397B-A17B", 1, 1)  # its config names float32: no default
    fp8 = dataclasses.replace(qwen, config_ssm_dtype="", architecture="")
    assert fp8.dtype_bytes == 1 and fp8.is_hybrid
    assert VLLM().ssm_dtype(fp8) == "bfloat16"
    assert VLLM().engine_model(fp8).ssm_state_dtype_bytes == 2
    llama = spec_of("meta-llama/Llama-3.1-70B", 1, 1)
    assert VLLM().engine_model(llama) is llama  # no recurrent state to keep
