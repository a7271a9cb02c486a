"""A quantized checkpoint's weight format (``ModelSpec.weight_quant``): read from the config's
``quantization_config`` or a ModelOpt ``hf_quant_config.json`` beside it, and a run or a
prediction that times those weights on other tables says so, once, and records it."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import yaml

from simlab.cost.hardware import Hardware
from simlab.cost.measured import select, tables
from simlab.cost.shapes import BatchShape
from simlab.engines.timed.engine import TimedEngine, time_sources
from simlab.experiments.breakdown import kernels_used
from simlab.model.hf import model_spec
from simlab.model.hf.resolve import find_config
from tests.fixtures import CONFIGS

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def h200() -> Hardware:
    return Hardware.from_config(yaml.safe_load((CONFIGS / "hardware" / "h200.yaml").read_text()))


@installed
@pytest.mark.parametrize(
    ("model_id", "quant"),
    [
        ("deepseek-ai/DeepSeek-V3", "fp8"),  # quantization_config: quant_method fp8
        ("Qwen/Qwen3-32B-FP8-Static-PerTensor", "fp8"),  # ModelOpt's quant_algo FP8
        ("openai/gpt-oss-120b", "mxfp4"),
        ("moonshotai/Kimi-K2.5", "compressed-tensors"),
        # no quantization_config: NVIDIA's ModelOpt hf_quant_config.json beside the config
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4", "nvfp4"),
        ("nvidia/Llama-3.1-70B-Instruct-FP8", "fp8"),
        ("meta-llama/Meta-Llama-3.1-70B", ""),
    ],
)
def test_the_checkpoints_weight_format_is_read_from_its_config(model_id, quant):
    assert model_spec(model_id).weight_quant == quant


@installed
def test_a_checkpoint_directory_with_modelopts_file_beside_its_config(tmp_path):
    config = tmp_path / "config.json"
    shutil.copy(find_config("meta-llama/Meta-Llama-3.1-70B"), config)
    assert model_spec("me/llama", config).weight_quant == ""
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}})
    )
    assert model_spec("me/llama", config).weight_quant == "nvfp4"
    (tmp_path / "hf_quant_config.json").write_text("{quantization: NVFP4")
    with pytest.raises(ValueError, match=r"hf_quant_config\.json: not a ModelOpt quantization"):
        model_spec("me/llama", config)


@installed
def test_fp8_weights_on_the_bf16_tables_warn_once_and_are_recorded(caplog):
    """DeepSeek-V3's FP8 checkpoint without ``engine.dtype`` is timed on the BF16 tables (its
    dtype_bytes is the config's torch_dtype): the run and the prediction say so, and name the
    setting; the FP8 tables, or the weights charged at one byte, clear it."""
    model = model_spec("deepseek-ai/DeepSeek-V3", name="test/DeepSeek-V3-warned-once")
    engine = TimedEngine(hardware=h200(), backend="sglang", tp=8)
    with caplog.at_level(logging.WARNING, logger="simlab.cost.measured.select"):
        costs = [engine.cost_model(model) for _ in range(2)]
    warned = [r for r in caplog.records if "checkpoint's weights are fp8" in r.message]
    assert len(warned) == 1 and "engine.dtype=fp8" in warned[0].message
    cost = costs[0]
    cost.time(BatchShape(prefill=[(0, 1000)]))
    assert "timed on the bf16 tables" in time_sources(cost, "fifo")["kernels"]["caveat"]
    assert "checkpoint's weights are fp8" in kernels_used(cost)["checkpoint"]
    for fp8 in (
        TimedEngine(hardware=h200(), backend="sglang", tp=8, dtype="fp8").cost_model(model),
        engine.cost_model(model_spec("deepseek-ai/DeepSeek-V3", dtype_bytes=1)),
    ):
        fp8.time(BatchShape(prefill=[(0, 1000)]))
        assert "checkpoint" not in kernels_used(fp8)
        assert "checkpoint" not in time_sources(fp8, "fifo")["kernels"].get("caveat", "")


@installed
def test_a_format_no_table_measures_is_named():
    line = select.checkpoint_caveat(model_spec("openai/gpt-oss-120b"), "bf16")
    assert line is not None and "mxfp4" in line and "no table measures that format" in line
    assert select.checkpoint_caveat(model_spec("meta-llama/Meta-Llama-3.1-70B"), "bf16") is None


@installed
def test_the_memory_check_charges_a_quantized_checkpoints_weights_at_their_format():
    """DeepSeek-V3's FP8 checkpoint (config dtype BF16): its 671 billion parameters take about
    673 GB loaded (layers at one byte, embedding and LM head at two), so it fits eight H200s
    (1,128 GB) beside 400 GB of cache; charged at BF16 (1,342 GB) it could not load at all.
    ModelOpt's NVFP4 weights take half a byte and an FP8 scale per 16."""
    from simlab.config import ConfigError
    from simlab.model.layers import weight_bytes

    deepseek = model_spec("deepseek-ai/DeepSeek-V3")
    assert (deepseek.weight_quant, deepseek.dtype_bytes) == ("fp8", 2)
    params = deepseek.layer_params + deepseek.embedding_params
    assert weight_bytes(deepseek) == deepseek.layer_params + 2 * deepseek.embedding_params
    assert 670e9 < weight_bytes(deepseek) < 675e9 < params * 2
    engine = TimedEngine(hardware=h200(), tp=8, memory_check=True, running_memory_gb=1.0)
    engine.check_memory(deepseek, 400.0)
    with pytest.raises(ConfigError, match=r"^cache\.size_gb: 500 GB of cache"):
        engine.check_memory(deepseek, 500.0)
    nvfp4 = model_spec("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4")
    assert nvfp4.weight_quant == "nvfp4"
    assert weight_bytes(nvfp4) == pytest.approx(
        nvfp4.layer_params * 0.5625 + nvfp4.embedding_params * nvfp4.dtype_bytes
    )
    plain = model_spec("meta-llama/Meta-Llama-3.1-70B")  # BF16: every weight at two bytes
    assert weight_bytes(plain) == 2 * (plain.layer_params + plain.embedding_params)
