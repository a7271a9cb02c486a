"""The roofline reference of the measured-kernel interpolation (simlab.cost.measured.reference):
a table that follows its roofline is interpolated exactly off its points, measured points stay
exact and tagged, values stay between their measured neighbours, the held-out check predicts
exactly as the grid does, on the real tables it lowers the held-out error, and the noise floor
is the scatter of equal-work shapes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from simlab.cost.measured import reference, tables
from simlab.cost.measured.heldout import axis_errors, class_grids, report
from simlab.cost.measured.interpolate import Grid
from simlab.cost.measured.kernels import Kernels
from simlab.cost.measured.noise import attention_scatter, gemm_scatter
from simlab.cost.measured.reference import Roofline
from simlab.cost.measured.sources import INTERPOLATED, MEASURED

installed = pytest.mark.skipif(
    tables.systems_dir() is None, reason="aiconfigurator-core is not installed"
)
PEAKS = {"peak_tflops": 1000.0, "mem_bw_gbps": 3000.0}
NS, MS = (256, 1024, 4096), (1, 4, 16, 64, 256, 1024, 4096, 16384)


def gemm_roofline() -> Roofline:
    roofline = reference.roofline(PEAKS, reference.gemm("bf16"))
    assert roofline is not None
    return roofline


def on_roofline(n: float, k: float, m: float, floor: float = 0.005) -> float:
    """A latency at a constant efficiency against the GEMM roofline whose smallest table
    value (n, k 256, m 1) is ``floor``."""
    ref = gemm_roofline()
    scale = floor / (floor + ref(NS[0], NS[0], MS[0]))
    return scale * (floor + ref(n, k, m))


def gemm_points() -> dict[tuple[float, ...], float]:
    return {(n, k, m): on_roofline(n, k, m) for n, k, m in itertools.product(NS, NS, MS)}


def test_a_table_on_its_roofline_is_interpolated_exactly_between_points():
    points = gemm_points()
    with_ref = Grid.from_points(points, reference=gemm_roofline())
    plain = Grid.from_points(points)
    for n, m in itertools.product((300.0, 1024.0, 3000.0), (2.0, 30.0, 700.0, 3000.0, 9000.0)):
        value, tag = with_ref.at((n, 700.0, m))
        assert value == pytest.approx(on_roofline(n, 700, m), rel=1e-9) and tag == INTERPOLATED
    # the plain power law between neighbours misses the bend from weight-bound to compute-bound
    assert abs(plain.at((1024, 1024, 700.0))[0] / on_roofline(1024, 1024, 700) - 1) > 0.01


def test_with_a_reference_measured_points_stay_exact_and_values_between_neighbours():
    rng = np.random.default_rng(0)
    points = {s: t * float(rng.uniform(0.8, 1.25)) for s, t in gemm_points().items()}
    grid = Grid.from_points(points, reference=gemm_roofline())
    plain = Grid.from_points(points)
    for shape, latency in points.items():
        assert grid.at(shape) == plain.at(shape)  # bit for bit, as without a reference
        assert grid.at(shape) == (pytest.approx(latency, rel=1e-12), MEASURED)
    for _ in range(300):
        n, k = (float(v) for v in rng.uniform(256, 4096, 2))
        m = float(rng.uniform(1, 16384))
        value, tag = grid.at((n, k, m))
        i, j, h = (int(np.searchsorted(axis, x)) for axis, x in ((NS, n), (NS, k), (MS, m)))
        corners = [
            points[(a, b, c)]
            for a, b, c in itertools.product(
                NS[i - 1 : i + 1], NS[j - 1 : j + 1], MS[h - 1 : h + 1]
            )
        ]
        assert min(corners) <= value <= max(corners) and tag == INTERPOLATED


def test_the_held_out_check_predicts_as_the_grid_does():
    rng = np.random.default_rng(1)
    points = {(m,): 0.005 + 1e-5 * m * float(rng.uniform(0.9, 1.1)) for m in MS}
    work = reference.moe((1024, 512, 2, 8, 1, 1), "bf16")
    grid = Grid.from_points(points, reference=reference.roofline(PEAKS, work))
    kept = {s: t for i, (s, t) in enumerate(sorted(points.items())) if i % 2 == 0 or i == 7}
    sub = Grid.from_points(kept, reference=reference.roofline(PEAKS, work))
    floor = grid.reference.floor if grid.reference else 0.0
    assert sub.reference is not None and sub.reference.floor == floor  # the floor is kept
    expected = [abs(sub.at((m,))[0] / points[(m,)] - 1) for m in MS[1:-1:2]]
    assert axis_errors(grid) == pytest.approx(expected, rel=1e-9)


@installed
@pytest.mark.parametrize(("gpu", "version"), [("h100_sxm", "0.24.0"), ("a100_sxm", "0.14.0")])
def test_the_reference_lowers_the_held_out_p90_of_gemm_attention_and_moe(gpu, version):
    grids = class_grids(Kernels(gpu, "vllm", version))
    for cls in ("gemm", "attention", "moe"):
        assert any(g.reference is not None for g in grids[cls])
        plain = [Grid(g.axes, g.log_y, g.power) for g in grids[cls]]
        better, before = (
            np.quantile(np.concatenate([axis_errors(g) for g in gs]), 0.9)
            for gs in (grids[cls], plain)
        )
        assert better < before, (cls, better, before)


def test_the_noise_floor_is_the_scatter_of_equal_work_shapes():
    big = (8192.0, 16384.0)  # weight-bound at m <= 16: m (n + k) < 1% of n k
    scale = {1: 1.0, 2: 1.0, 4: 1.2, 8: 1.0, 16: 1.0, 64: 3.0}
    gemm = Grid.from_points(
        {(n, k, m): 0.1 * s for n in big for k in big for m, s in scale.items()}
    )
    scatter = gemm_scatter(gemm)
    assert sorted(scatter.tolist()) == pytest.approx([0.0] * 16 + [0.2] * 4)  # m 64 is not flat
    attention = Grid.from_points(
        {
            (8.0, 2.0, 1.0, 128.0): 0.010,
            (4.0, 1.0, 2.0, 128.0): 0.012,  # the same work as the shape above
            (8.0, 1.0, 1.0, 128.0): 0.050,
        }
    )
    assert attention_scatter(attention) == pytest.approx([abs(0.010 / 0.012 - 1) / math.sqrt(2)])


@installed
def test_the_held_out_report_gives_the_noise_floor_of_gemm_and_attention():
    result = report(Kernels("h100_sxm", "vllm", "0.24.0"))
    assert 0 < result["gemm"]["noise_p90"] < 1 and 0 < result["attention"]["noise_p90"] < 1
    assert "noise_p90" not in result["moe"]
