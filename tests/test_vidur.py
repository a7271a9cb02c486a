"""Calibration from Vidur's measured A100/H100 operator and all-reduce times (gpu_validate.vidur),
and the committed calibration files the hardware presets use by default."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from gpu_validate import vidur_network
from gpu_validate.cases import load_hardware
from gpu_validate.fit import fit_class, roofline
from gpu_validate.vidur import (
    ACCEPTANCE,
    MEASURED_ON,
    acceptance,
    calibrate,
    error_table,
    main,
    neighbour_floor,
    repeat_spread,
    weight_stream_gbps,
)
from simlab.cost.calibration import Calibration, Efficiency
from simlab.cost.model import CostModel
from simlab.cost.shapes import OP_CLASSES, Op
from tests.fixtures import ROOT, model
from traces.paths import resolve_data_dir

VIDUR = resolve_data_dir(None) / "vidur_profiling"
needs_vidur = pytest.mark.skipif(
    not (VIDUR / "compute" / "a100").is_dir(), reason="Vidur profiles not in the data dir"
)
CALIBRATIONS = ROOT / "gpu_validate" / "calibration"


def synthetic(eff: Efficiency, hw, seed=0, noise=0.02) -> list[dict]:
    """GEMM records made by the cost model itself (with a token curve) + noise."""
    rng = np.random.default_rng(seed)
    records = []
    for tokens in (1, 4, 16, 32, 64, 100, 128, 200, 256, 400, 512, 1024, 2048, 4096, 8192):
        for d_in, d_out in ((4096, 4096), (4096, 14336), (8192, 1024)):
            flops = 2.0 * tokens * d_in * d_out
            moved = 2.0 * (d_in * d_out + tokens * (d_in + d_out))
            arr = [np.array([v], dtype=float) for v in (flops, moved, 1, tokens)]
            t = float(roofline(arr[0], arr[1], arr[2], hw, eff, arr[3])[0])
            records.append(
                {
                    "flops": flops,
                    "bytes": moved,
                    "launches": 1,
                    "tokens": tokens,
                    "median_s": t * (1 + noise * rng.standard_normal()),
                }
            )
    return records


def test_the_fit_recovers_known_efficiencies_and_curve():
    hw = load_hardware("a100_80gb")
    curve = ((1.0, 1.0), (64.0, 1.0), (256.0, 1.25), (1024.0, 1.0), (8192.0, 1.0))
    true = Efficiency(0.6, 0.75, 6e-6, curve)
    records = synthetic(true, hw)
    fit = fit_class(records, hw, Efficiency(0.7, 0.8, 4e-6), "gemm", curve=True)
    plain = fit_class(records, hw, Efficiency(0.7, 0.8, 4e-6), "gemm")
    arr = [np.array([r[k] for r in records], float) for k in ("flops", "bytes", "launches")]
    tok = np.array([r["tokens"] for r in records], float)
    want = roofline(*arr, hw, true, tok)
    got = roofline(*arr, hw, fit.efficiency, tok)
    assert np.median(np.abs(got / want - 1)) < 0.02 and np.max(np.abs(got / want - 1)) < 0.08
    assert fit.p90_rel_err < 0.05 < plain.p90_rel_err  # the curve is what the data needs
    assert fit.efficiency.eta_c == pytest.approx(0.6, rel=0.1)


def test_the_allreduce_fit_recovers_latency_and_bandwidth():
    hw = load_hardware("a100_80gb")
    sizes = np.geomspace(4e3, 2e8, 80)
    frame = pd.DataFrame({"tp": 4, "message_bytes": sizes})
    true = Efficiency(1.0, 0.8, 25e-6)
    frame["median_s"] = vidur_network.predict(frame, hw, true)
    got = vidur_network.fit(frame, hw)
    assert got.t0 == pytest.approx(25e-6, rel=0.02) and got.eta_m == pytest.approx(0.8, rel=0.02)


def test_the_error_table_has_one_row_per_model_class_and_token_range():
    frame = pd.DataFrame(
        {
            "model": ["a"] * 4 + ["b"] * 4,
            "op_class": ["gemm", "gemm", "elementwise", "gemm"] * 2,
            "tokens": [1, 100, 100, 5000] * 2,
            "rel_err": [0.1, -0.2, 0.05, 0.0] * 2,
        }
    )
    table = error_table(frame)
    assert list(table.columns) == ["n", "median", "p90"]
    assert len(table) == 8  # 2 models x (gemm in 3 ranges + elementwise in 1)
    assert table.loc[("a", "gemm")]["median"].tolist() == pytest.approx([0.1, 0.2, 0.0])


def test_the_neighbour_lookup_interpolates_in_log_log_between_fitted_rows():
    """Hand-computed: fitted (1 token, 1 s), (4, 4 s) and (4, 9 s) repeated (log mean: 6 s);
    held back 2 tokens, measured 2.5 s: log-log halfway between 1 s and 6 s is sqrt(6) s; 8
    tokens (beyond the last fitted one), measured 10 s: the end value 6 s."""
    row = {"model": "m", "op_name": "mlp", "op_class": "gemm", "tp": 1}
    train = [row | {"tokens": t, "median_s": s} for t, s in ((1, 1.0), (4, 4.0), (4, 9.0))]
    test = [row | {"tokens": 2, "median_s": 2.5}, row | {"tokens": 8, "median_s": 10.0}]
    got = neighbour_floor(train, test)["rel_err"].tolist()
    assert got == pytest.approx([math.sqrt(6.0) / 2.5 - 1, 6.0 / 10.0 - 1])


def test_the_repeat_spread_is_largest_over_smallest_of_one_shape():
    row = {"model": "m", "op_name": "mlp", "op_class": "gemm", "tp": 2}
    records = [row | {"tokens": 8, "median_s": s} for s in (1.0, 1.05, 1.02)]
    records += [row | {"tokens": 16, "median_s": 2.0}]  # measured once: not a repeat
    spread = repeat_spread(records)
    assert spread["tokens"].tolist() == [8] and spread["spread"].tolist() == pytest.approx([0.05])


def test_acceptance_is_median_and_p90_against_the_target():
    assert ACCEPTANCE == {"median": 0.05, "p90": 0.10}
    got = acceptance({"gemm": {"median": 0.05, "p90": 0.101}, "x": {"median": 0.06, "p90": 0.1}})
    assert got == {
        "gemm": {"median_ok": True, "p90_ok": False},
        "x": {"median_ok": False, "p90_ok": True},
    }


#: Held-back |relative error| (median, P90) measured on Vidur's profiles (alternate token counts
#: of every (model, op, tp) series held back); README "GPU calibration" quotes them. A change of
#: the fit that moves them shows here.
MEASURED = {
    "a100": {"gemm": (0.043, 0.129), "elementwise": (0.034, 0.108)},
    "h100": {"gemm": (0.060, 0.172), "elementwise": (0.039, 0.111)},
}


@pytest.mark.parametrize(("gpu", "preset"), [("a100", "a100_80gb"), ("h100", "h100_sxm")])
def test_the_held_back_error_against_the_acceptance(gpu, preset):
    """The acceptance (median <= 5%, P90 <= 10% per class and GPU) on the real data: medians met
    except H100 GEMMs, no P90 met. The measurements allow it (repeated shapes agree within 3%
    P90 on A100, a per-series lookup of the two neighbouring token counts reaches <= 7% P90);
    what the cost model misses is the per-shape kernel staircase, which even a 13-knot curve per
    (model, op, tp) series does not follow within 10% on H100 GEMMs."""
    if not (VIDUR / "compute" / gpu).is_dir():
        pytest.skip(f"Vidur profiles for {gpu} not in the data dir ({VIDUR})")
    result = calibrate(gpu, preset, ["Llama-2-7b-hf"])
    held = result["held_back_error"]
    for cls, (median, p90) in MEASURED[gpu].items():
        assert held[cls]["median"] == pytest.approx(median, abs=0.005)
        assert held[cls]["p90"] == pytest.approx(p90, abs=0.005)
        ok = result["acceptance"][cls]
        assert ok == {"median_ok": median <= 0.05, "p90_ok": p90 <= 0.10}
        floor = result["error_floor"][cls]
        assert floor["neighbour_lookup"]["p90"] < 0.07 < held[cls]["p90"]
        assert floor["neighbour_lookup"]["p90"] < floor["series_curve"]["p90"] < held[cls]["p90"]
    assert result["error_floor"]["gemm"]["series_curve"]["p90"] > (0.10 if gpu == "h100" else 0.08)
    by_op = {r["op_name"]: r for r in result["held_back_by_op"]}
    assert set(by_op) == {"attn_qkv_proj", "attn_out_proj", "mlp", "norms_residuals"}
    assert sum(r["n"] for r in result["held_back_by_op_tp"]) == sum(r["n"] for r in by_op.values())


@needs_vidur
def test_vidur_calibration_and_its_held_back_error(tmp_path):
    """A100, fitted on alternate token counts: the file simlab loads, its provenance and
    tables (the figures: :func:`test_the_held_back_error_against_the_acceptance`)."""
    result = calibrate("a100", "a100_80gb", ["Llama-2-7b-hf"])
    held = result["held_back_error"]
    assert set(held) == {"gemm", "elementwise", "allreduce"}
    for cls in ("gemm", "elementwise"):  # the curve beats the plain roofline on held-back rows
        assert held[cls]["p90"] < result["held_back_error_plain_roofline"][cls]["p90"]
    assert result["held_back_error_by_model"]["held_back"] == ["Llama-2-70b-hf", "Meta-Llama-3-8B"]
    assert set(result["ops"]["allreduce"]["by_tp"]) == {"2", "4", "8"}
    table = pd.DataFrame(result["held_back_table"])
    assert set(table["model"]) == {"Llama-2-7b-hf", "Llama-2-70b-hf", "Meta-Llama-3-8B"}
    path = tmp_path / "a100.json"
    assert main(["--gpu", "a100", "--hardware", "a100_80gb", "--out", str(path)]) == 0
    loaded = Calibration.load(path, "a100_80gb")
    data = json.loads(path.read_text())
    assert loaded.efficiency["gemm"].eta_c == pytest.approx(data["ops"]["gemm"]["eta_c"])
    assert loaded.efficiency["gemm"].curve and loaded.by_tp["allreduce"][4].t0 > 0
    assert "attn_prefill" in data["unmeasured"] and "iteration_overhead_s" in data["terms"]


def test_an_unknown_model_to_fit_on_is_an_error(tmp_path, capsys):
    if not (VIDUR / "compute" / "a100").is_dir():
        pytest.skip("Vidur profiles not in the data dir")
    assert main(["--fit", "Llama-9", "--out", str(tmp_path / "x.json")]) == 2
    assert "--fit ['Llama-9']" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["a100_40gb", "a100_80gb", "h100_sxm"])
def test_the_committed_calibrations_load_for_their_preset(preset):
    path = CALIBRATIONS / f"{preset}.json"
    cal = Calibration.load(path, preset)
    data = json.loads(path.read_text())
    assert set(data["ops"]) | set(data["unmeasured"]) == set(OP_CLASSES)
    assert all(math.isfinite(e["median"]) for e in data["held_back_error"].values())
    assert cal.hardware == preset and cal.efficiency["gemm"].curve
    cost = CostModel(model("llama3_8b"), load_hardware(preset), cal)
    for tokens in (1, 100, 300, 5000, 60000):  # the simulator and the fit time an op alike
        op = Op("x", "gemm", 2e9 * tokens, 1e7 + 1e4 * tokens, 3, tokens)
        arr = [np.array([v], dtype=float) for v in (op.flops, op.bytes, 3, tokens)]
        want = roofline(arr[0], arr[1], arr[2], cost.hw, cal.efficiency["gemm"], arr[3])[0]
        assert cost.op_time(op) == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError, match=rf"{preset}\.json: fitted for hardware '{preset}', not"):
        Calibration.load(path, "h200")


@needs_vidur
def test_vidurs_a100_is_the_80_gb_card_so_the_40_gb_file_runs_at_its_own_bandwidth():
    """Vidur's A100 profiles stream Llama-3-8B's MLP up-projection weights (235 MB, far above
    L2) faster than a 40 GB card's peak: they were measured on the 80 GB card (Vidur's device
    config says 80 GB too). The a100_40gb file keeps the fitted fractions of peak, so its
    memory-bound ops take up to 2,039 / 1,555 = 1.31x the 80 GB card's time, and its
    compute-bound ops the same time (same clocks, same tensor peak)."""
    llama3 = VIDUR / "compute" / "a100" / "meta-llama" / "Meta-Llama-3-8B" / "mlp.csv"
    a40, a80 = load_hardware("a100_40gb"), load_hardware("a100_80gb")
    assert a40.mem_bw_gbps < weight_stream_gbps(llama3) < a80.mem_bw_gbps  # 1,655 GB/s
    assert MEASURED_ON["a100"] == "a100_80gb"
    files = {
        p: json.loads((CALIBRATIONS / f"{p}.json").read_text()) for p in ("a100_40gb", "a100_80gb")
    }
    for data in files.values():
        assert data["measured_on"]["name"] == "a100_80gb"
    for cls in ("gemm", "elementwise"):
        for key in ("eta_c", "eta_m"):
            assert files["a100_40gb"]["ops"][cls][key] == pytest.approx(
                files["a100_80gb"]["ops"][cls][key], rel=1e-4
            )
    costs = {
        p: CostModel(
            model("llama3_8b"), load_hardware(p), Calibration.load(CALIBRATIONS / f"{p}.json", p)
        )
        for p in files
    }
    ratio = {
        n: costs["a100_40gb"].prefill_time(0, n) / costs["a100_80gb"].prefill_time(0, n)
        for n in (1, 8192)
    }
    assert (
        1.2 < ratio[1] <= a80.mem_bw / a40.mem_bw
    )  # weight-bound: the bandwidth ratio but launches
    assert 1.0 <= ratio[8192] < 1.02  # compute-bound (the norms stay memory-bound)
    series = {
        p: {(s["op"], tuple(s["shape"]), s["tp"]): s for s in files[p]["profiles"]["series"]}
        for p in files
    }
    mlp = next(k for k in series["a100_80gb"] if k[0] == "mlp" and k[2] == 1)
    slow, fast = series["a100_40gb"][mlp], series["a100_80gb"][mlp]
    assert slow["tokens"] == fast["tokens"]
    scale = np.array(slow["seconds"]) / np.array(fast["seconds"])
    assert 1.2 < scale[0] <= a80.mem_bw / a40.mem_bw and scale[-1] == pytest.approx(1.0, abs=0.01)
    reduce = [k for k in series["a100_80gb"] if k[0] == "tp_allreduce"]
    assert all(
        series["a100_40gb"][k]["seconds"] == series["a100_80gb"][k]["seconds"] for k in reduce
    )


def test_a_preset_of_another_chip_than_the_measured_one_is_refused():
    with pytest.raises(ValueError, match="--hardware h100_sxm: not the chip Vidur's a100"):
        calibrate("a100", "h100_sxm", ["Llama-2-7b-hf"])
