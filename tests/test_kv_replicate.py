"""KV-head replication under tensor parallelism: vLLM's and SGLang's rule (``QKVParallelLinear``,
``ModelConfig.get_num_kv_heads``; their attention layers' asserts) against simlab's tp check,
KV bytes, cache capacity, per-GPU attention work and the measured attention hook."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hydra import compose, initialize_config_dir

from policies.production import mamba_page_bytes
from simlab.config import ConfigError
from simlab.cost.hardware import Hardware
from simlab.cost.measured import tables
from simlab.cost.model import CostModel
from simlab.cost.shapes import check_tp, kv_heads_per_gpu, on_tp
from simlab.engines.block_pool.queue import PoolShape
from simlab.experiments.predict import predict, timed_engine
from simlab.experiments.silicon import points
from simlab.model.spec import ModelSpec
from simlab.run.plan import plan_run
from simlab.run.policy import policy_step
from tests.fixtures import CONFIGS
from tests.fixtures import compose as compose_run

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)
QWEN35 = ["model=hf", "model.id=Qwen/Qwen3.5-397B-A17B", "hardware=h200"]
#: Qwen/Qwen3.5-397B-A17B's config.json: 2 KV heads of 256 (K and V) in 15 full-attention
#: layers of 60, BF16; 32 query heads; GDN: 16 key heads, 64 value heads
KV_HEADS, HEAD_DIM, ATTN_LAYERS, BYTES = 2, 256, 15, 2


def engines_accept(n_heads: int, n_kv_heads: int, tp: int) -> bool:
    """The engines' attention asserts, as written in vLLM's and SGLang's attention layers."""
    if n_heads % tp:
        return False
    if n_kv_heads >= tp:
        return n_kv_heads % tp == 0  # partitioned
    return tp % n_kv_heads == 0  # replicated


def gqa(n_heads: int, n_kv_heads: int) -> ModelSpec:
    return ModelSpec(
        d_model=128 * n_heads,
        n_attn_layers=2,
        n_ssm_layers=0,
        n_mlp_layers=2,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=128,
    )


def replica_kv_bytes(tp: int) -> int:
    """One token's KV over the replica's tp GPUs, counted GPU by GPU from the engine rule:
    each holds ``max(1, kv // tp)`` heads of K and V in every attention layer."""
    per_gpu = max(1, KV_HEADS // tp) * 2 * HEAD_DIM * BYTES * ATTN_LAYERS
    return tp * per_gpu


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(32, 8), (48, 8), (40, 8), (32, 2), (24, 3)])
def test_the_tp_check_accepts_what_the_engines_accept(n_heads, n_kv_heads):
    model = gqa(n_heads, n_kv_heads)
    for tp in range(1, 2 * n_heads + 1):
        if engines_accept(n_heads, n_kv_heads, tp):
            check_tp(model, tp)
            held = on_tp(model, tp)
            assert held.n_kv_heads == tp * kv_heads_per_gpu(model, tp)
            assert held.n_kv_heads // tp == max(1, n_kv_heads // tp)  # one GPU's heads
            assert on_tp(held, tp) == held  # idempotent: the cost model applies it again
        else:
            with pytest.raises(ValueError, match=f"^engine.tp: {tp} ") as err:
                check_tp(model, tp)
            assert "\n" not in str(err.value)


def test_a_rejected_kv_split_names_the_key_and_the_head_counts():
    with pytest.raises(ValueError, match=r"^engine\.tp: 12 neither divides") as err:
        check_tp(gqa(48, 8), 12)
    assert str(err.value).startswith(
        "engine.tp: 12 neither divides model's 8 KV heads nor is a multiple of them"
    )


@installed
def test_gdn_key_and_value_heads_must_still_split_evenly():
    """vLLM's ``GatedDeltaNetAttention`` shards both (``divide(num_v_heads, tp)``, key_dim //
    tp): tp 32 divides Qwen3.5's 32 query heads and 64 value heads, not its 16 key heads."""
    model = ModelSpec.from_config(predict_config(["engine.tp=32"]).model)
    with pytest.raises(ValueError, match=r"engine.tp: 32 does not divide .*16 GDN key heads"):
        check_tp(model, 32)
    check_tp(model, 16)


def predict_config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="predict", overrides=[*QWEN35, *overrides])


@installed
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_kv_bytes_and_capacity_follow_the_engine_rule(tp):
    """The run's caches size with the replica's KV: at tp 4 and 8 each of Qwen3.5's 2 KV heads
    is on tp / 2 GPUs, so a token takes tp / 2 times the model's own KV bytes."""
    size_gb = 100
    overrides = [*QWEN35, "+policy=vllm", f"engine.tp={tp}", f"cache.size_gb={size_gb}"]
    plan = plan_run(compose_run([*overrides, "engine.memory_check=false"]))
    expected = replica_kv_bytes(tp)
    assert plan.model.kv_bytes_per_token == expected
    assert expected == max(1, tp // KV_HEADS) * 30_720  # the model's own: 30,720 bytes
    replicated = {"kv_heads": tp, "kv_bytes_per_token": expected} if tp > KV_HEADS else None
    assert plan.config.get("kv_replicated") == replicated  # summary.json's config
    step = policy_step(plan.policies["vllm"], plan.model, plan.settings)
    assert step.cache.kv_per_unit_token == expected
    tokens = plan.settings.cache.kv_bytes // step.cache.kv_per_unit_token
    assert tokens == size_gb * 10**9 // expected
    # vLLM sizes a hybrid's attention block on one GPU: its KV heads' page holds its share of
    # one layer's GDN state (value heads split over tp), in multiples of 64 tokens on an H200
    # (FlashInfer's GDN prefill kernel, compute capability 9.0), 16 elsewhere
    state_page = mamba_page_bytes(step.cache.model) // tp
    token_page = max(1, KV_HEADS // tp) * 2 * HEAD_DIM * BYTES
    align = 64 if plan.config["hardware"]["compute_capability"] == 9.0 else 16
    assert step.admission.keys.block_size == align * -(-state_page // (align * token_page))
    # vLLM's pool: a block is 16 tokens of one group of 15 layers (the 15 attention layers)
    shape = PoolShape.of(plan.model, 16, plan.settings.cache.kv_bytes)
    assert shape is not None
    assert shape.block_bytes == 16 * expected
    assert shape.blocks == plan.settings.cache.kv_bytes // shape.block_bytes


@installed
def test_the_memory_check_counts_the_replicated_weights_and_kv():
    """tp 8 on H200s: 8 x 141 GB; the replicated K/V projections add to the weights."""
    run = [*QWEN35, "+policy=vllm", "engine.tp=8", "engine.running_memory_gb=1"]
    plan = plan_run(compose_run([*run, "cache.size_gb=100"]))
    configured = ModelSpec.from_config(compose_run(run).model)
    kv_proj = 2 * HEAD_DIM * configured.d_model * ATTN_LAYERS  # K and V of one head, all layers
    assert plan.model.layer_params - configured.layer_params == (8 - KV_HEADS) * kv_proj
    with pytest.raises(ConfigError, match=r"^cache\.size_gb: 1000 GB of cache"):
        plan_run(compose_run([*run, "cache.size_gb=1000"]))


@installed
@pytest.mark.parametrize("tp", [4, 8])
def test_one_gpus_attention_reads_and_projects_its_one_kv_head(tp):
    model = ModelSpec.from_config(predict_config([]).model)
    hardware = Hardware.from_config(predict_config([]).hardware)
    cost = CostModel(model, hardware, tp=tp)
    one = cost.layers.attention_decode(1, 1000, 0)
    more = cost.layers.attention_decode(1, 3000, 0)
    per_token = 1 * 2 * HEAD_DIM * BYTES * ATTN_LAYERS  # one KV head per GPU
    assert more.bytes - one.bytes == pytest.approx(2000 * per_token, rel=1e-12)
    qkv = cost.layers.attention_proj(100)[0]
    assert qkv.name == "attn_qkv_proj"
    q_and_gate = 2 * model.n_heads * HEAD_DIM // tp
    d_out = q_and_gate + 2 * HEAD_DIM  # this GPU's query and gate heads, its one K and V head
    assert qkv.flops == pytest.approx(2 * 100 * model.d_model * d_out * ATTN_LAYERS, rel=1e-12)


@installed
@pytest.mark.parametrize("tp", [4, 8])
def test_the_measured_attention_hook_takes_the_per_gpu_heads(tp):
    _, cost = timed(tp)
    assert cost.kernels is not None
    assert cost.kernels.heads == (32 // tp, 1, HEAD_DIM)


def timed(tp: int):
    return timed_engine(predict_config([f"engine.tp={tp}"]))


@installed
def test_qwen35_predicts_at_tp_4_and_8_on_h200():
    out = {tp: predict(predict_config([f"engine.tp={tp}", "prefill=[1000,8000]"])) for tp in (4, 8)}
    for prediction in out.values():
        assert all(math.isfinite(ms) and ms > 0 for ms in prediction["prefill_ms"])
        assert prediction["prefill_ms"][0] < prediction["prefill_ms"][1]
        sources = prediction["breakdown_sources"]
        assert "roofline" not in sources["attn_prefill"] + sources["attn_qkv_proj"]
    for i in range(2):  # half the query heads, the same one KV head per GPU
        assert out[8]["breakdown_ms"]["attn_prefill"][i] < out[4]["breakdown_ms"]["attn_prefill"][i]
        assert out[8]["prefill_ms"][i] < out[4]["prefill_ms"][i]


def test_without_replication_the_model_is_its_own():
    for (n_heads, kv), tp in itertools.product([(32, 8), (32, 32)], [1, 2, 4, 8]):
        model = gqa(n_heads, kv)
        assert on_tp(model, tp) is model
    mqa = dataclasses.replace(gqa(32, 32), n_kv_heads=1)  # one KV head: on every GPU
    assert on_tp(mqa, 4).kv_bytes_per_token == 4 * mqa.kv_bytes_per_token


@installed
def test_silicon_replays_qwen35_at_tp_4_and_8():
    """Every measured serving point of the hybrid is at a TP above its 2 KV heads (its TP 16
    and 64 points are data or expert parallel); the coverage filter keeps those at TP 4 and 8."""
    systems = tables.systems_dir()
    assert systems is not None
    pts, _ = points(systems / "silicon_sample.csv")
    tps = {p.tp for p in pts if p.model == "Qwen/Qwen3.5-397B-A17B"}
    assert tps == {4, 8}


#: deepseek-ai/DeepSeek-V3's config.json: MLA over 61 layers, a latent of kv_lora_rank 512 +
#: qk_rope_head_dim 64 elements a token and layer
DEEPSEEK = ["model=deepseek_v3", "hardware=h200"]
LATENT, MLA_LAYERS = 512 + 64, 61


@installed
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_every_gpu_keeps_the_whole_mla_latent(tp):
    """vLLM's, SGLang's and TensorRT-LLM's MLA caches are not split by heads: each of the tp
    GPUs keeps every token's latent, so a cache of S GB holds S / (tp x latent) tokens."""
    size_gb = 50
    run = [*DEEPSEEK, "+policy=fifo", f"engine.tp={tp}", f"cache.size_gb={size_gb}"]
    plan = plan_run(compose_run([*run, "engine.memory_check=false"]))
    latent_bytes = LATENT * MLA_LAYERS * plan.model.kv_dtype_bytes
    assert plan.model.kv_bytes_per_token == tp * latent_bytes
    replicated = {"mla_kv_copies": tp, "kv_bytes_per_token": tp * latent_bytes}
    assert plan.config.get("kv_replicated") == (replicated if tp > 1 else None)
    step = policy_step(plan.policies["fifo"], plan.model, plan.settings)
    tokens = plan.settings.cache.kv_bytes // step.cache.kv_per_unit_token
    assert tokens == size_gb * 10**9 // (tp * latent_bytes)
    assert on_tp(plan.model, tp) == plan.model  # idempotent: the cost model applies it again


@installed
@pytest.mark.parametrize("tp", [2, 8])
def test_one_gpu_reads_the_whole_latent_a_token(tp):
    """The roofline's decode attention on one GPU reads each token's whole latent whatever the
    tp (its query heads split); the measured hook's KV floor reads the same."""
    cfg = compose_run([*DEEPSEEK, "+policy=fifo"])
    model = ModelSpec.from_config(cfg.model)
    cost = CostModel(model, Hardware.from_config(cfg.hardware), tp=tp)
    one = cost.layers.attention_decode(1, 1000, 0)
    more = cost.layers.attention_decode(1, 3000, 0)
    per_token = LATENT * model.kv_dtype_bytes * MLA_LAYERS
    assert more.bytes - one.bytes == pytest.approx(2000 * per_token, rel=1e-12)
