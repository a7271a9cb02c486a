"""``engine.ep``: the fused MoE's experts split over ``ep`` of the ``tp`` GPUs (vLLM's
``--enable-expert-parallel``, SGLang's ``--ep-size``, TensorRT-LLM's
``moe_expert_parallel_size``), timed from the tables' rows of that MoE TP x EP; the silicon
replay runs the csv's expert-parallel points with their degree."""

from __future__ import annotations

import pytest

from simlab.config import ConfigError
from simlab.cost.measured import moe_kernel, tables
from simlab.cost.shapes import BatchShape, on_tp
from simlab.engines.timed.engine import TimedEngine
from simlab.experiments.silicon import GPUS_PER_NODE, points, spec_of
from tests.fixtures import hardware, model

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def table_row(shape: tuple[int, ...], tokens: int) -> float:
    """TensorRT-LLM 1.3.0rc10's H200 CUTLASS row of DeepSeek's FP8 experts at ``shape``, at the
    skewed routing the MoE takes (the first of ``MOE_DISTRIBUTIONS`` measured)."""
    path = tables.table_path("h200_sxm", "moe", "trtllm", "1.3.0rc10", "moe_perf")
    assert path is not None
    frame, _ = moe_kernel.shape_rows(path, ("fp8",), shape)
    picked = moe_kernel.of(frame, "cutlass")
    assert set(picked.distribution) == {"power_law_1.01"}
    return float(picked[picked.num_tokens == tokens].latency.iloc[0])


@installed
def test_the_moe_takes_the_tables_rows_of_its_moe_tp_and_ep():
    """DeepSeek-R1 on 8 H200s: with ``ep=8`` each GPU holds 32 whole experts (MoE TP 1, EP 8),
    with ``ep=1`` a 1/8 slice of all 256 (MoE TP 8); each MoE layer takes its row of the table
    (at 8 decoding tokens the skewed routing loads the busiest of 8 GPUs: 0.252 ms against
    TP's 0.145) plus the router GEMM, which both share."""
    spec = spec_of("deepseek-ai/DeepSeek-R1", 1, 1)
    assert spec is not None
    held = on_tp(spec, 8)
    shape = BatchShape(decode=[1000] * 8)
    moe = {}
    for ep in (1, 8):
        engine = TimedEngine(
            hardware=hardware("h200"), tp=8, ep=ep, backend="trtllm",
            backend_version="1.3.0rc10", moe_kernel="cutlass",
        )  # fmt: skip
        cost = engine.cost_model(held)
        assert cost.kernels is not None
        assert cost.kernels.moe_shape() == (7168, 2048, 8, 256, 8 // ep, ep)
        moe[ep] = cost.breakdown(shape)["moe"]
    tp_row, ep_row = (
        table_row((7168, 2048, 8, 256, 8, 1), 8),
        table_row((7168, 2048, 8, 256, 1, 8), 8),
    )
    assert (tp_row, ep_row) == (pytest.approx(0.145, abs=0.001), pytest.approx(0.252, abs=0.001))
    # the same router beside each: the difference is the fused kernels' rows, layer by layer
    assert moe[8] - moe[1] == pytest.approx(spec.n_moe_layers * (ep_row - tp_row) / 1e3)


@installed
def test_a_degree_that_does_not_split_the_experts_is_a_one_line_error():
    h100 = hardware("h100_sxm")
    with pytest.raises(ConfigError, match=r"engine\.ep must be an integer dividing engine\.tp"):
        TimedEngine(hardware=h100, tp=4, ep=3)
    with pytest.raises(ConfigError, match=r"engine\.ep: 2 on llama3_8b, which has no experts"):
        TimedEngine(hardware=h100, tp=2, ep=2).held(model("llama3_8b"))
    jamba = model("jamba_1_5_mini")  # 16 experts
    with pytest.raises(ConfigError, match=r"engine\.ep: 32 does not divide .*experts \(16\)"):
        TimedEngine(hardware=h100, tp=32, ep=32, memory_check=False).held(jamba)
    assert TimedEngine(hardware=h100, tp=8, ep=8).held(jamba).moe_experts == 16


@installed
def test_the_csvs_expert_parallel_points_are_replayed_at_their_degree():
    """Its points with experts in parallel over a tensor-parallel group (attention DP 1) run at
    that degree: Qwen3.5 on SGLang at TP 4 / 8, DeepSeek-R1 on TensorRT-LLM at TP 8,
    MiniMax-M2.5 on vLLM. Attention data parallelism and rows of more GPUs than a node stay
    counted, not replayed."""
    pts, skipped = points(tables.systems_dir() / "silicon_sample.csv")
    ep = {(p.model.split("/")[1], p.system, p.backend, p.tp, p.ep) for p in pts if p.ep > 1}
    assert ("Qwen3.5-397B-A17B", "h200_sxm", "sglang", 8, 8) in ep
    assert ("Qwen3.5-397B-A17B", "b200_sxm", "sglang", 4, 4) in ep
    assert ("DeepSeek-R1", "h200_sxm", "trtllm", 8, 8) in ep
    assert all(p.tp <= GPUS_PER_NODE and p.tp % p.ep == 0 for p in pts)
    assert skipped["pipeline or attention data parallel"] > 100
    assert skipped[f"tensor parallel over more than {GPUS_PER_NODE} GPUs"] > 100


@installed
def test_predict_states_the_degree_and_times_jambas_moe_at_it():
    """``simlab.predict ... engine.ep=N``: ``prediction.json`` keeps ``ep``, its table line
    names it, and only the MoE's time changes (Jamba-1.5-Mini's 16 experts over 4 GPUs each
    whole, timed from Mixtral's rows at the same EP 4, at equal tokens per expert)."""
    from hydra import compose, initialize_config_dir

    from simlab.experiments.predict import predict, table
    from tests.fixtures import CONFIGS

    def run(ep: int) -> dict:
        overrides = ["model=jamba_1_5_mini", "engine.tp=4", f"engine.ep={ep}", "prefill=[4096]"]
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            return predict(compose(config_name="predict", overrides=overrides))

    tp, ep = run(1), run(4)
    assert (tp["ep"], ep["ep"]) == (1, 4)
    assert "(experts: ep 4)" in table(ep) and "experts" not in table(tp)
    moved = {op for op in tp["breakdown_ms"] if tp["breakdown_ms"][op] != ep["breakdown_ms"][op]}
    assert moved == {"moe"}


def test_the_reports_gpu_label_names_the_degree():
    from simlab.report.describe import hardware_label

    engine = {"hardware": {"name": "h200"}, "tp": 8}
    assert hardware_label({"engine": engine}) == " on h200 x tp 8"
    assert hardware_label({"engine": engine | {"ep": 8}}) == " on h200 x tp 8 (experts: ep 8)"
