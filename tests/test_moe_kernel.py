"""``engine.moe_kernel``: the fused MoE takes the rows of the kernel the server ran, from
another engine's table on the same GPU where the engine's own lacks it; the silicon replay
takes each point's MoE backend from its launch script."""

from __future__ import annotations

import pytest
import yaml

from simlab.config import ConfigError
from simlab.cost.hardware import Hardware
from simlab.cost.measured import moe_kernel, tables
from simlab.cost.measured.kernels import Kernels
from simlab.engines.timed.engine import TimedEngine
from simlab.experiments.silicon import Point
from simlab.experiments.silicon_recipes import recipe
from tests.fixtures import CONFIGS

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)

DEEPSEEK_TP8 = (7168, 2048, 8, 256, 8, 1)  # DeepSeek-V3/R1's experts at MoE TP 8


def row(system: str, backend: str, version: str, kernel: str, tokens: int) -> float:
    path = tables.table_path(system, "moe", backend, version, "moe_perf")
    assert path is not None and path.parent.name == version
    frame, _ = moe_kernel.shape_rows(path, ("fp8_block",), DEEPSEEK_TP8)
    picked = moe_kernel.of(frame, kernel)
    return float(picked[picked.num_tokens == tokens].latency.iloc[0])


@installed
def test_a_kernel_the_engines_table_lacks_comes_from_another_engines_table_on_the_gpu():
    """TensorRT-LLM's B200 table times DeepSeek's FP8 experts with DeepGEMM only; its TRTLLM
    backend's kernels are measured in vLLM's B200 table (through FlashInfer), which SGLang's
    measures within 7% (0.050 and 0.053 ms at 4 tokens, against DeepGEMM's 0.133)."""
    plain = Kernels("b200_sxm", "trtllm", "1.3.0rc20", "fp8")
    gen = Kernels("b200_sxm", "trtllm", "1.3.0rc20", "fp8", None, "bf16", "flashinfer_trtllm")
    deepgemm, own = plain.moe(4, DEEPSEEK_TP8), gen.moe(4, DEEPSEEK_TP8)
    assert deepgemm is not None and own is not None
    assert deepgemm[0] == pytest.approx(row("b200_sxm", "trtllm", "1.3.0rc20", "deepgemm", 4))
    vllm = row("b200_sxm", "vllm", "0.24.0", "flashinfer_trtllm", 4)
    sglang = row("b200_sxm", "sglang", "0.5.14", "flashinfer_trtllm", 4)
    assert own[0] == pytest.approx(vllm) and abs(sglang / vllm - 1) < 0.07
    assert own[0] < 0.5 * deepgemm[0]
    (where,) = gen.lent()["moe_kernels"].values()
    assert where.startswith("vllm 0.24.0 ") and "flashinfer_trtllm" in where
    assert "moe_kernels" not in plain.lent()


@installed
def test_the_engines_own_rows_of_the_kernel_come_first():
    kernels = Kernels("b200_sxm", "sglang", "0.5.14", "fp8", None, "bf16", "flashinfer_trtllm")
    timed = kernels.moe(4, DEEPSEEK_TP8)
    assert timed is not None
    assert timed[0] == pytest.approx(row("b200_sxm", "sglang", "0.5.14", "flashinfer_trtllm", 4))
    assert "moe_kernels" not in kernels.lent()


@installed
def test_a_kernel_no_table_on_the_gpu_measured_is_a_one_line_error():
    hardware = Hardware.from_config(
        yaml.safe_load((CONFIGS / "hardware" / "b200_sxm.yaml").read_text())
    )
    with pytest.raises(ConfigError, match=r"engine\.moe_kernel: no fused-MoE kernel on b200_sxm"):
        TimedEngine(hardware=hardware, backend="trtllm", moe_kernel="bogus")
    TimedEngine(hardware=hardware, backend="trtllm", moe_kernel="deepgemm")


def point(system: str, backend: str, isl: int = 1024, osl: int = 1024, c: int = 4) -> Point:
    model = "deepseek-ai/DeepSeek-R1"
    return Point("x", model, system, backend, "", "fp8", 8, c, isl, osl, 1.0, 1.0, "2026-02-05")


@pytest.mark.parametrize(
    ("p", "kernel"),
    [
        (point("b200_sxm", "trtllm"), "flashinfer_trtllm"),  # moe_config.backend: TRTLLM
        (point("b200_sxm", "trtllm", 1024, 8192, 256), "deepgemm"),  # DEEPGEMM there
        (point("h200_sxm", "trtllm"), "cutlass"),
        (point("b200_sxm", "sglang"), "flashinfer_trtllm"),  # --moe-runner-backend
        (point("h200_sxm", "sglang"), None),  # no flag: SGLang's default
    ],
)
def test_each_silicon_point_takes_its_scripts_moe_backend(p, kernel):
    assert recipe(p).moe_kernel == kernel


@installed
def test_a_kernel_no_table_measured_at_the_shape_keeps_the_tables_own_and_says_so():
    """Marlin is measured on B200 (vLLM's and SGLang's INT4 / MXFP4 experts), never at
    DeepSeek's FP8 shape: the table's own DeepGEMM times it, and the run records that."""
    plain = Kernels("b200_sxm", "trtllm", "1.3.0rc20", "fp8")
    marlin = Kernels("b200_sxm", "trtllm", "1.3.0rc20", "fp8", None, "bf16", "marlin")
    assert marlin.moe(64, DEEPSEEK_TP8) == plain.moe(64, DEEPSEEK_TP8)
    assert marlin.lent()["moe_kernels"] == {
        "7168x2048 top-8 of 256 (MoE TP 8, EP 1)": "not measured: the table's deepgemm"
    }
