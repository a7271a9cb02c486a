"""The KV cache's dtype (``model.kv_dtype_bytes``, the engines' ``--kv-cache-dtype``): it sizes
the cache, sets the bytes attention reads on the roofline, and picks the attention tables' FP8
or BF16 rows; the silicon replay takes it from each point's launch script."""

from __future__ import annotations

import math

import pytest
import yaml

from simlab.config import ConfigError
from simlab.cost.hardware import Hardware
from simlab.cost.measured import tables
from simlab.cost.measured.kernels import KV_ROWS, Kernels
from simlab.cost.shapes import BatchShape
from simlab.engines.timed.engine import TimedEngine, time_sources
from simlab.experiments.silicon import Point
from simlab.experiments.silicon_recipes import recipe
from simlab.model.spec import ModelSpec
from simlab.report.describe import time_sources_note
from tests.fixtures import CONFIGS

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def spec(name: str, **fields: int) -> ModelSpec:
    config = yaml.safe_load((CONFIGS / "model" / f"{name}.yaml").read_text())
    return ModelSpec.from_config(config | fields)


def preset(name: str) -> Hardware:
    return Hardware.from_config(yaml.safe_load((CONFIGS / "hardware" / f"{name}.yaml").read_text()))


def test_the_kv_cache_dtype_defaults_to_the_models_and_sizes_the_cache():
    bf16, fp8 = spec("llama3_8b"), spec("llama3_8b", kv_dtype_bytes=1)
    assert bf16.kv_dtype_bytes == bf16.dtype_bytes == 2
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 32 * 8 * 256 * 2
    assert fp8.layer_params == bf16.layer_params  # the weights keep their dtype
    assert spec("llama3_8b", dtype_bytes=1).kv_dtype_bytes == 1
    with pytest.raises(ValueError, match=r"model\.kv_dtype_bytes must be >= 0"):
        spec("llama3_8b", kv_dtype_bytes=-1)


def test_an_fp8_cache_halves_the_kv_bytes_attention_reads_on_the_roofline():
    """Decode attention at long contexts reads the KV cache: its bytes halve with an FP8
    cache, the query and output bytes (BF16) do not; FLOPs are unchanged."""
    engine = TimedEngine(hardware=preset("h100_sxm"), kernels="roofline")
    ops = {}
    for kv in (2, 1):
        cost = engine.cost_model(spec("llama3_8b", kv_dtype_bytes=kv))
        (ops[kv],) = [o for o in cost.ops(BatchShape(decode=[8000] * 8)) if o.name == "attn_decode"]
    assert ops[1].flops == ops[2].flops
    assert ops[2].bytes / 2 < ops[1].bytes < ops[2].bytes * 0.51


@installed
def test_measured_attention_takes_the_rows_of_the_caches_dtype():
    """On TensorRT-LLM's H200 tables, a measured context-attention shape is the table's row
    for the KV cache's dtype; decode attention over a 16K context is about twice as fast
    from an FP8 cache, where reading the cache bounds it."""
    path = Kernels("h200_sxm", "trtllm", "1.3.0rc20").path("context")
    for kv, rows in KV_ROWS.items():
        kernels = Kernels("h200_sxm", "trtllm", "1.3.0rc20", "fp8", None, kv)
        filters = (("attn_dtype", "bfloat16"), ("kv_cache_dtype", rows), ("head_dim", 128))
        frame = tables.rows(path, (*filters, ("window_size", 0)))
        row = frame[
            (frame.batch_size == 1)
            & (frame.isl == 8192)
            & (frame.num_heads == 64)
            & (frame.num_key_value_heads == 8)
            & (frame.step == 0)
        ]
        timed = kernels.context(1, 8192, 64, 8, 128)
        assert timed is not None and timed[1] == "measured"
        assert timed[0] == pytest.approx(float(row.latency.iloc[0]))
    decode = {
        kv: Kernels("h200_sxm", "trtllm", "1.3.0rc20", "fp8", None, kv).generation(64, 16, 2, 128)
        for kv in KV_ROWS
    }
    assert decode["bf16"] is not None and decode["fp8"] is not None
    ratio = decode["bf16"].value(16384) / decode["fp8"].value(16384)
    assert 1.6 < ratio < 2.2


@installed
def test_a_run_records_its_caches_dtype_and_a_bad_one_is_a_one_line_error():
    engine = TimedEngine(hardware=preset("h200"), backend="trtllm")
    cost = engine.cost_model(spec("llama3_8b", kv_dtype_bytes=1))
    cost.time(BatchShape(prefill=[(0, 1000)]))
    summary = time_sources(cost, "lru")
    assert summary["kernels"]["kv_cache_dtype"] == "fp8"
    config = {"engine": {"backend": "trtllm", "hardware": {"system": "h200_sxm"}}}
    assert "kernels measured on h200_sxm, KV cache fp8;" in time_sources_note(
        config, {"lru": summary}
    )
    with pytest.raises(ConfigError, match=r"model\.kv_dtype_bytes: 4 has no measured KV cache"):
        engine.cost_model(spec("llama3_8b", kv_dtype_bytes=4))
    roofline = TimedEngine(hardware=preset("h200"), kernels="roofline")
    assert math.isfinite(
        roofline.cost_model(spec("llama3_8b", kv_dtype_bytes=4)).time(
            BatchShape(prefill=[(0, 1000)])
        )
    )


def point(model: str, system: str, backend: str, precision: str = "fp8", tp: int = 8) -> Point:
    return Point("x", model, system, backend, "", precision, tp, 4, 1024, 1024, 1.0, 1.0, "")


@pytest.mark.parametrize(
    ("p", "kv"),
    [
        (point("meta-llama/Llama-3.1-70B", "h200_sxm", "trtllm"), 1),  # kv_cache_config fp8
        (point("meta-llama/Llama-3.1-70B", "h100_sxm", "vllm"), 1),  # kv-cache-dtype: fp8
        (point("deepseek-ai/DeepSeek-R1", "h200_sxm", "sglang"), 2),  # no flag: auto, BF16
        (point("deepseek-ai/DeepSeek-R1", "b200_sxm", "sglang"), 1),  # fp8_e4m3
        (point("deepseek-ai/DeepSeek-R1", "h200_sxm", "trtllm"), 1),
        (point("Qwen/Qwen3.5-397B-A17B", "b200_sxm", "sglang", "bf16"), 2),
        (point("Qwen/Qwen3.5-397B-A17B", "b300_sxm", "sglang", "fp8"), 1),
    ],
)
def test_each_silicon_point_takes_its_scripts_kv_cache_dtype(p, kv):
    assert recipe(p).kv_dtype_bytes == kv
