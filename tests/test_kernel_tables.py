"""gpu_validate writes its measurements in the per-op table format (gpu_validate.tables), and
simlab times the ops the package lacks from them (engine.kernel_tables)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from gpu_validate.synth import synthetic_records, write_synthetic
from gpu_validate.tables import write_tables
from simlab.config import ConfigError
from simlab.cost.hardware import Hardware
from simlab.cost.measured import tables
from simlab.cost.measured.sources import MEASURED, ROOFLINE
from simlab.cost.shapes import BatchShape
from simlab.engines.timed.engine import TimedEngine
from simlab.model.spec import ModelSpec
from tests.fixtures import CONFIGS

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def load(kind: str, name: str) -> dict:
    return yaml.safe_load((CONFIGS / kind / f"{name}.yaml").read_text())


def test_measured_scans_from_gpu_validate_time_the_scans_the_package_lacks(tmp_path):
    spec = ModelSpec.from_config(load("model", "nemotron_h_8b"))
    hw = Hardware.from_config(load("hardware", "h100_sxm"))
    records = synthetic_records(spec, hw, "h100_sxm", suites=("gemm", "attn", "ssm"), seed=2)
    write_synthetic(tmp_path / "run", records)
    written = write_tables(
        [str(tmp_path / "run")], tmp_path / "tables", "h100_sxm", "vllm", "0.24.0"
    )
    assert {p.name for p in written} >= {"mamba2_scan_perf.parquet", "mamba2_step_perf.parquet"}
    scans = pd.read_parquet(tmp_path / "tables/h100_sxm/ssm/vllm/0.24.0/mamba2_scan_perf.parquet")
    assert set(scans.columns) >= {
        "batch_size",
        "seq_len",
        "nheads",
        "head_dim",
        "d_state",
        "latency",
    }

    local = TimedEngine(hardware=hw, kernel_tables=str(tmp_path / "tables")).cost_model(spec)
    package = TimedEngine(hardware=hw).cost_model(spec)
    tokens = int(scans["seq_len"].iloc[0])
    batch = BatchShape(prefill=[(0, tokens)])
    scan = next(op for op in local.ops(batch) if op.name == "ssm_scan")
    assert local.source(scan) == MEASURED
    assert package.source(scan) == ROOFLINE
    expected = spec.n_ssm_layers * float(scans["latency"].iloc[0]) / 1e3
    assert local.op_time(scan) == pytest.approx(expected, rel=1e-12)
    gemm = next(op for op in local.ops(batch) if op.name == "mlp")  # the package's table wins
    assert local.op_time(gemm) == package.op_time(gemm)


def test_kernel_tables_must_be_a_directory(tmp_path):
    hw = Hardware.from_config(load("hardware", "h100_sxm"))
    with pytest.raises(ConfigError, match=r"engine\.kernel_tables: .* is not a directory"):
        TimedEngine(hardware=hw, kernel_tables=str(tmp_path / "missing"))
