"""Prefill attention at a head width a GPU's tables lack (simlab.cost.measured.head_width):
from the nearest measured width scaled by the two references with the table's floor, tagged
interpolated, recorded, and bounded by its error on the class's GPUs that measured both."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from simlab.cost.measured import head_width, reference, tables
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.sources import INTERPOLATED
from simlab.experiments.predict import kernel_lines, predict
from simlab.report.describe import time_sources_note
from tests.fixtures import CONFIGS, timed_prefill_summary

pytestmark = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)


def test_a_width_the_tables_lack_is_the_nearest_widths_time_scaled_by_the_references(
    caplog, monkeypatch
):
    monkeypatch.setattr("simlab.cost.measured.kernels._WARNED", set())  # once per process
    kernels = Kernels("a100_sxm", "vllm", "0.14.0")  # 128-wide heads only
    assert kernels.grid(("context", 256, 0)) is None
    source = kernels.grid(("context", 128, 0))
    point = (16, 2, 1, 8192)
    with caplog.at_level(logging.WARNING):
        ms, tag = kernels.context(1, 8192, 16, 2, 256)
        kernels.context(1, 4096, 16, 2, 256)
    wide = reference.Roofline(reference.context(256), *_peak_bw_floor(source))
    assert ms == pytest.approx(source.at(point)[0] * wide(*point) / source.reference(*point))
    assert tag == INTERPOLATED and 1.8 < ms / source.at(point)[0] < 2.0
    assert kernels.head_widths == {256: 128}
    assert kernels.lent()["head_widths"] == {"256-wide prefill attention": "from 128-wide"}
    assert sum("kernels.head_widths" in r.getMessage() for r in caplog.records) == 1
    # the other GPUs' tables that bound the transfer are read as measured, not warned of
    head_width.class_errors.cache_clear()
    with caplog.at_level(logging.WARNING):
        assert head_width.transfer_p90(kernels, 256) > 0.1
    assert all(r.getMessage().startswith("a100_sxm vllm 0.14.0") for r in caplog.records)
    # short prefills are launch-bound: the floor keeps them near the 128-wide time
    short = kernels.context(1, 128, 16, 2, 256)[0] / source.at((16, 2, 1, 128))[0]
    assert short < 1.5
    # a sliding window's table has no reference to scale by
    assert kernels.context(1, 8192, 16, 2, 256, 128) is None


def _peak_bw_floor(grid):
    ref = grid.reference
    return ref.peak, ref.bandwidth, ref.floor


def test_a_width_the_table_holds_is_never_transferred_and_the_nearest_wider_one_lends():
    h100 = Kernels("h100_sxm", "vllm", "0.24.0")
    assert h100.context(1, 8192, 16, 2, 256) == h100.grid(("context", 256, 0)).at((16, 2, 1, 8192))
    assert not h100.head_widths
    l40s = Kernels("l40s", "sglang", "0.5.14")  # 64-256 wide, no 512
    assert head_width.source_width(l40s, 512) == 256
    assert head_width.source_width(Kernels("a100_sxm", "vllm", "0.14.0"), 64) == 128


def test_the_transfer_with_the_floor_holds_on_the_class_gpus_that_measured_both():
    errors = head_width.class_errors("a100_sxm", "vllm", 128, 256)
    assert errors.size > 1000
    assert np.median(errors) < 0.08 and np.quantile(errors, 0.9) < 0.30
    # without the floor, twice the 128-wide time: short prefills are far off
    naive = []
    for gpu in ("l40s", "rtx_pro_6000_server"):
        kernels = Kernels(gpu, "vllm", "0.24.0")
        narrow, wide = kernels.grid(("context", 128, 0)), kernels.grid(("context", 256, 0))
        naive += [
            abs(2 * narrow.at((16, 2, b, n))[0] / wide.at((16, 2, b, n))[0] - 1)
            for b in (1, 4)
            for n in (128, 256, 512)
            if narrow.at((16, 2, b, n)) and wide.at((16, 2, b, n))
        ]
    assert np.median(naive) > 0.3


def test_the_prediction_records_the_width_and_bounds_it_by_that_error():
    overrides = ["model=qwen3_5_35b_a3b", "hardware=a100_80gb", "engine.backend=vllm"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        prediction = predict(
            compose(config_name="predict", overrides=[*overrides, "prefill=[8192]"])
        )
    assert prediction["breakdown_sources"]["attn_prefill"] == [INTERPOLATED]
    assert prediction["kernels"]["head_widths"] == {"256-wide prefill attention": "from 128-wide"}
    ((low, high),) = prediction["unmeasured"]["ops_ms"]["attn_prefill"]
    attention = prediction["breakdown_ms"]["attn_prefill"][0]
    p90 = float(np.quantile(head_width.class_errors("a100_sxm", "vllm", 128, 256), 0.9))
    assert low == pytest.approx(attention / (1 + p90)) and high == pytest.approx(
        attention * (1 + p90)
    )
    assert "256-wide prefill attention: not measured, from 128-wide heads" in "\n".join(
        kernel_lines(prediction["kernels"])
    )
    summary = timed_prefill_summary("a100_80gb", "qwen3_5_35b_a3b", 8192)
    config = {"engine": {"backend": "vllm", "hardware": {"system": "a100_sxm"}}}
    note = time_sources_note(config, {"lru": summary})
    assert "; 256-wide prefill attention from 128-wide" in note
