"""gpu_validate: record format, fit and report without torch; kernels and a tiny end-to-end run
on the CPU with torch (skipped where torch is not installed); fla and CUDA checks on a GPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpu_validate.__main__ import main
from gpu_validate.cases import (
    FULL,
    TINY,
    load_hardware,
    load_model,
    one_layer,
    plan,
    spread,
    tiny_spec,
)
from gpu_validate.fit import floors, resolve_hardware, roofline, run_fit, select
from gpu_validate.records import (
    RecordWriter,
    done_keys,
    read_records,
    record_for,
    timed,
    validate,
)
from gpu_validate.report import build_report, predict
from gpu_validate.synth import TRUE_EFFICIENCY, synthetic_records, write_synthetic
from simlab.cost.calibration import DEFAULT_EFFICIENCY, Calibration, Efficiency
from simlab.cost.model import CostModel
from simlab.cost.shapes import OP_CLASSES, BatchShape


@pytest.fixture(scope="module")
def nemotron():
    return load_model("nemotron_h_8b")


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100_sxm")


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory, nemotron, h100):
    out = tmp_path_factory.mktemp("synth")
    write_synthetic(out, synthetic_records(nemotron, h100, "h100_sxm", noise=0.03, seed=1))
    return out


@pytest.fixture(scope="module")
def synth_fit(synth_dir):
    return run_fit([synth_dir], synth_dir / "calibration.json")


# ---------------------------------------------------------------------------- cases
def test_case_numbers_are_the_cost_models(nemotron):
    cases = {(c.suite, c.op_name, c.variant, json.dumps(c.params)): c for c in plan(nemotron, FULL)}
    mlp = cases[("gemm", "mlp", "", json.dumps({"tokens": 1024}))]
    # one Nemotron-H MLP layer (squared ReLU: up + down) on 1024 tokens
    assert mlp.flops == 2 * 1024 * 4096 * 21504 * 2
    assert mlp.launches == 2
    prefill = cases[
        ("attn", "attn_prefill", "prefix", json.dumps({"prefix": 4096, "new": 512, "batch": 1}))
    ]
    ref = CostModel(one_layer(nemotron), load_hardware("h100_sxm")).ops(
        BatchShape(prefill=[(4096, 512)])
    )
    assert prefill.ops[0] == next(o for o in ref if o.name == "attn_prefill")
    stack = next(c for c in plan(nemotron, FULL, ["stack"]) if c.params.get("hit") == 0.5)
    model = CostModel(nemotron, load_hardware("h100_sxm"))
    batch = BatchShape(prefill=[(stack.params["prefix"], stack.params["new"])], state_loads=1)
    assert sum(model.op_time(o) for o in stack.ops) == pytest.approx(model.time(batch))


def test_every_timed_case_has_a_known_op_class(nemotron):
    for case in plan(nemotron, FULL):
        if case.kind in ("op", "floor"):
            assert case.op_class in OP_CLASSES and case.ops
        if case.kind == "stack":
            assert {o.op_class for o in case.ops} <= set(OP_CLASSES)


def test_tiny_spec_keeps_the_architecture(nemotron):
    tiny = tiny_spec(nemotron)
    assert tiny.d_model == 64 and tiny.dtype_bytes == 4
    assert tiny.n_heads // tiny.n_kv_heads == min(nemotron.n_heads // nemotron.n_kv_heads, 4)
    assert tiny.mlp_gated == nemotron.mlp_gated and tiny.ssm_kind == "mamba2"
    assert tiny.n_attn_layers >= 1 and tiny.n_ssm_layers >= 1
    assert len(plan(tiny, TINY)) < len(plan(nemotron, FULL))


def test_spread_covers_the_range_first():
    assert spread(list(range(9)))[:3] == [0, 8, 4]
    assert sorted(spread(list(range(15)))) == list(range(15))


# ---------------------------------------------------------------------------- records
def test_records_survive_a_cut_off_write(tmp_path, nemotron):
    case = plan(nemotron, FULL, ["norms"])[0]
    timing = {"median_s": 1e-5, "p10_s": 9e-6, "p90_s": 2e-5, "mean_s": 1.1e-5, "n_reps": 7}
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        w.write({"kind": "header", "run_id": "r"})
        w.write(record_for(case, "r", "cpu", "x", timing))
    with path.open("a") as fh:
        fh.write('{"kind": "op", "suite": "no')  # killed mid-record
    recs = read_records([tmp_path])
    assert [r["kind"] for r in recs] == ["header", "op"]
    assert done_keys(recs) == {case.key}
    assert timed(recs)[0]["flops"] == case.flops


def test_validate_rejects_bad_records(nemotron):
    case = plan(nemotron, FULL, ["norms"])[0]
    good = record_for(
        case,
        "r",
        "cpu",
        "x",
        {"median_s": 2.0, "p10_s": 1.0, "p90_s": 3.0, "mean_s": 2.0, "n_reps": 3},
    )
    validate(good)
    with pytest.raises(ValueError, match="op_class"):
        validate({**good, "op_class": "tensor_magic"})
    with pytest.raises(ValueError, match="p10"):
        validate({**good, "p10_s": 5.0})


# ---------------------------------------------------------------------------- fit
def test_roofline_is_op_time(nemotron, h100):
    eff = Efficiency(0.6, 0.7, 5e-6)
    model = CostModel(nemotron, h100, Calibration({**DEFAULT_EFFICIENCY, "gemm": eff}))
    for case in plan(nemotron, FULL, ["gemm"])[1:20]:
        op = case.ops[0]
        vec = roofline(
            np.array([op.flops]), np.array([op.bytes]), np.array([op.launches]), h100, eff
        )
        assert vec[0] == pytest.approx(model.op_time(op), rel=1e-12)


def _prediction_gap(records, hw, fitted, true):
    """Median and max |fitted/true - 1| of the noise-free predictions over the records."""
    f, b, n = (np.array([r[k] for r in records], float) for k in ("flops", "bytes", "launches"))
    gap = roofline(f, b, n, hw, fitted) / roofline(f, b, n, hw, true) - 1
    return float(np.median(np.abs(gap))), float(np.max(np.abs(gap)))


def test_fit_recovers_synthetic_efficiencies(synth_dir, synth_fit, h100):
    """3% lognormal noise and 3% outliers (1.5-2.5x): predictions of the fitted model match the
    true model's within 2% (median) / 10% (max) per class, and the parameters the shapes pin
    down are recovered within 5%."""
    used = select(read_records([synth_dir]))
    for cls, v in synth_fit["ops"].items():
        fitted = Efficiency(v["eta_c"], v["eta_m"], v["t0"])
        rows = [r for r in used if r["op_class"] == cls]
        med, worst = _prediction_gap(rows, h100, fitted, TRUE_EFFICIENCY[cls])
        assert med < 0.02 and worst < 0.10, (cls, med, worst)
    ops = synth_fit["ops"]
    for cls, key in [
        ("gemm", "eta_c"),
        ("gemm", "eta_m"),
        ("attn_prefill", "eta_c"),
        ("attn_decode", "eta_m"),
        ("elementwise", "eta_m"),
    ]:  # (ssm_scan's FLOPs and bytes are both linear in tokens: only their mix is identified)
        true = getattr(TRUE_EFFICIENCY[cls], key)
        assert ops[cls][key] == pytest.approx(true, rel=0.05), (cls, key)
    assert ops["gemm"]["t0"] == pytest.approx(TRUE_EFFICIENCY["gemm"].t0, rel=0.2)


def test_fit_is_exact_without_noise(tmp_path, nemotron, h100):
    write_synthetic(
        tmp_path, synthetic_records(nemotron, h100, "h100_sxm", noise=0.0, outliers=0.0)
    )
    data = run_fit([tmp_path], tmp_path / "cal.json")
    for cls, v in data["ops"].items():
        assert v["median_rel_err"] < 1e-3, cls
        fitted = Efficiency(v["eta_c"], v["eta_m"], v["t0"])
        rows = [r for r in select(read_records([tmp_path])) if r["op_class"] == cls]
        assert _prediction_gap(rows, h100, fitted, TRUE_EFFICIENCY[cls])[1] < 2e-3, cls


def test_calibration_file_is_what_simlab_loads(synth_dir, synth_fit):
    cal = Calibration.load(synth_dir / "calibration.json")
    assert cal.efficiency["gemm"].eta_c == pytest.approx(synth_fit["ops"]["gemm"]["eta_c"])
    assert cal.efficiency["allreduce"] == DEFAULT_EFFICIENCY["allreduce"]  # not measured
    assert synth_fit["hardware"]["name"] == "h100_sxm"
    assert synth_fit["hardware"]["peak_tflops"] == 989
    assert len(synth_fit["residuals"]) == synth_fit["fit"]["n_records"]


def test_the_fit_writes_the_runs_shapes_as_profiles(synth_dir, synth_fit, nemotron, h100):
    """The run's op records of one layer's shapes become profiles (TP 1) that simlab loads and
    times those ops from: at a measured count, exactly the record's median per unit."""
    section = synth_fit["profiles"]
    ops = {s["op"] for s in section["series"]}
    assert ops == {"attn_qkv_proj", "attn_out_proj", "ssm_in_proj", "ssm_out_proj", "mlp"} | {
        "lm_head",
        "norms_residuals",
    }
    assert all(s["tp"] == 1 and s["models"] == ["nemotron_h_8b"] for s in section["series"])
    assert set(section["held_back_error"]) == {"gemm", "elementwise"}
    cal = Calibration.load(synth_dir / "calibration.json", "h100_sxm")
    on, off = (CostModel(nemotron, h100, c) for c in (cal, cal.without_profiles()))
    record = next(
        r
        for r in select(read_records([synth_dir]))
        if r["op_name"] == "ssm_in_proj" and r["params"]["tokens"] == 512
    )
    timed, plain = (c.breakdown(BatchShape(prefill=[(0, 512)])) for c in (on, off))
    assert timed["ssm_in_proj"] == pytest.approx(
        nemotron.n_ssm_layers * record["median_s"], rel=1e-5
    )
    assert timed["ssm_scan"] == plain["ssm_scan"]  # not a measured shape
    stack = next(r for r in read_records([synth_dir]) if r["kind"] == "stack")
    assert predict(stack, on) != predict(stack, off)  # the report times a stack as simlab does


def test_fit_leaves_out_the_stand_in_moe(synth_dir):
    recs = read_records([synth_dir])
    assert not any(r["op_name"] == "moe" for r in select(recs))
    assert any(r["op_name"] == "moe" for r in select(recs, exclude_ops=[]))


def test_cpu_peaks_come_from_the_floors():
    recs = [
        {"kind": "header", "device_name": "cpu:x", "hardware_preset": None},
        {
            "kind": "floor",
            "suite": "floors",
            "op_name": "gemm_peak",
            "params": {},
            "flops": 2e9,
            "bytes": 1.0,
            "launches": 1,
            "median_s": 0.01,
        },
        {
            "kind": "floor",
            "suite": "floors",
            "op_name": "copy_bw",
            "params": {},
            "flops": 0.0,
            "bytes": 1e9,
            "launches": 1,
            "median_s": 0.1,
        },
    ]
    hw, source = resolve_hardware(recs)
    assert hw.peak_tflops == pytest.approx(0.2) and hw.mem_bw_gbps == pytest.approx(10)
    assert "floors" in source and floors(recs)["gemm_tflops"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="--hardware"):
        resolve_hardware(recs[:1])


# ---------------------------------------------------------------------------- report
def test_report_compares_uncalibrated_and_calibrated(synth_dir, synth_fit, tmp_path):
    summary = build_report([synth_dir], synth_dir / "calibration.json", tmp_path)
    for name in ("report.md", "predictions.csv", "summary.json", "pred_vs_meas.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert summary["synthetic"]
    assert summary["all_ops"]["cal_median"] < 0.03 < summary["all_ops"]["uncal_median"]
    assert summary["stack_prefill"]["cal_median"] < 0.05
    assert summary["stack_decode"]["cal_median"] < summary["stack_decode"]["uncal_median"]
    assert summary["by_class"]["gemm"]["cv_median"] < 0.05
    text = (tmp_path / "report.md").read_text()
    assert "Composed hybrid stack" in text and "Synthetic records" in text


def test_cli_synth_fit_report(tmp_path, capsys):
    assert main(["synth", "--out", str(tmp_path), "--seed", "3"]) == 0
    assert main(["fit", str(tmp_path), "--out", str(tmp_path / "cal.json")]) == 0
    assert "gemm" in capsys.readouterr().out
    assert (
        main(
            [
                "report",
                str(tmp_path),
                "--calibration",
                str(tmp_path / "cal.json"),
                "--out",
                str(tmp_path / "rep"),
            ]
        )
        == 0
    )
    assert "stack prefill" in capsys.readouterr().out


# ---------------------------------------------------------------------------- torch on the CPU
def _ssd_inputs(torch, T, H=4, P=8, G=2, N=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, H, P, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(2, T, H, generator=g) - 1)
    A = -torch.rand(H, generator=g) - 0.5
    B = torch.randn(2, T, G, N, generator=g) / 4
    C = torch.randn(2, T, G, N, generator=g) / 4
    D = torch.randn(H, generator=g)
    h0 = torch.randn(2, H, N, P, generator=g)
    return x, dt, A, B, C, D, h0


@pytest.mark.parametrize(
    ("T", "chunk", "init"), [(1, 8, False), (37, 8, True), (64, 16, True), (50, 64, False)]
)
def test_ssd_chunked_equals_sequential(T, chunk, init):
    torch = pytest.importorskip("torch")
    from gpu_validate import ssd

    x, dt, A, B, C, D, h0 = _ssd_inputs(torch, T)
    h0 = h0 if init else None
    y1, h1 = ssd.ssd_chunked(x, dt, A, B, C, D, h0, chunk=chunk)
    y2, h2 = ssd.ssd_sequential(x, dt, A, B, C, D, h0)
    torch.testing.assert_close(y1, y2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h1, h2, rtol=1e-4, atol=1e-5)


def test_ssd_prefix_hit_continues_the_scan():
    """Scanning a prefix, then the rest from its final state (a checkpoint), equals one scan;
    so do decode steps from that state."""
    torch = pytest.importorskip("torch")
    from gpu_validate import ssd

    x, dt, A, B, C, D, _ = _ssd_inputs(torch, 40)
    y, h = ssd.ssd_sequential(x, dt, A, B, C, D)
    ya, ha = ssd.ssd_chunked(x[:, :25], dt[:, :25], A, B[:, :25], C[:, :25], D, chunk=8)
    yb, hb = ssd.ssd_chunked(x[:, 25:], dt[:, 25:], A, B[:, 25:], C[:, 25:], D, ha, chunk=8)
    torch.testing.assert_close(torch.cat([ya, yb], 1), y, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hb, h, rtol=1e-4, atol=1e-5)
    hs = ha.clone()
    steps = [ssd.ssd_step(x[:, t], dt[:, t], A, B[:, t], C[:, t], D, hs) for t in range(25, 40)]
    torch.testing.assert_close(torch.stack(steps, 1), y[:, 25:], rtol=1e-4, atol=1e-5)


def _fla_naive_simple_gla():
    """fla's pure-PyTorch simple-GLA references, loaded from their file: importing the ``fla``
    package itself needs Triton, which a CPU machine lacks."""
    import importlib.util

    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core (gpu_validate/wheels) not installed")
    path = f"{spec.submodule_search_locations[0]}/ops/simple_gla/naive.py"
    loader = importlib.util.spec_from_file_location("fla_simple_gla_naive", path)
    assert loader is not None and loader.loader is not None, path
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("T", "init"), [(1, True), (37, False), (130, True)])
def test_ssd_as_simple_gla_equals_the_recurrence(T, init):
    """The argument mapping ``ssd_fla`` hands to fla's Triton kernels (q = C, k = B, v = dt x,
    g = dt A, scale 1, + D x, state [K, V]) is exact SSD: checked on the CPU with fla's own
    pure-PyTorch kernels of the same signature (the Triton ones are checked on a GPU)."""
    torch = pytest.importorskip("torch")
    from gpu_validate import ssd

    naive = _fla_naive_simple_gla()
    x, dt, A, B, C, D, h0 = _ssd_inputs(torch, T)
    h0 = h0 if init else None
    y, h = ssd.ssd_sequential(x, dt, A, B, C, D, h0)
    for kernel in (naive.naive_chunk_simple_gla, naive.naive_recurrent_simple_gla):
        yk, hk = ssd.ssd_fla(x, dt, A, B, C, D, h0, kernel=kernel)
        torch.testing.assert_close(yk, y, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(hk, h, rtol=1e-4, atol=1e-4)
    hs = torch.zeros_like(h) if h0 is None else h0.clone()
    step = ssd.ssd_fla_step(
        x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, hs, kernel=naive.naive_recurrent_simple_gla
    )
    torch.testing.assert_close(step, y[:, 0], rtol=1e-4, atol=1e-4)
    if T == 1:
        torch.testing.assert_close(hs, h, rtol=1e-4, atol=1e-4)


def _env(torch):
    from gpu_validate.layers import Env

    torch.manual_seed(0)
    return Env(torch.device("cpu"), torch.float32)


def test_mamba2_decode_steps_continue_the_prefill(nemotron):
    torch = pytest.importorskip("torch")
    from gpu_validate.layers import Mamba2

    m = Mamba2(tiny_spec(nemotron), _env(torch))
    zx = torch.randn(1, 21, m.in_dim)
    full, conv_end, h_end = m.core(zx, None, None)
    part, conv, h = m.core(zx[:, :13], None, None)
    steps = [m.step(zx[:, t], conv, h) for t in range(13, 21)]
    torch.testing.assert_close(
        torch.cat([part, torch.stack(steps, 1)], 1), full, rtol=1e-4, atol=1e-4
    )
    torch.testing.assert_close(conv, conv_end)
    torch.testing.assert_close(h, h_end, rtol=1e-4, atol=1e-5)
    rest, _, _ = m.core(zx[:, 13:], *m.core(zx[:, :13], None, None)[1:])
    torch.testing.assert_close(rest, full[:, 13:], rtol=1e-4, atol=1e-4)


def test_lower_right_causal_mask_is_prefix_attention():
    torch = pytest.importorskip("torch")
    from gpu_validate.layers import sdpa

    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    mask = torch.ones(5, 12, dtype=torch.bool).tril(12 - 5)  # query i sees keys <= 7 + i
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(sdpa(q, k, v, causal=True), ref)


def test_cascade_and_ippd_flex_equal_full_attention():
    torch = pytest.importorskip("torch")
    from gpu_validate import flexattn

    context, m, own = 40, 3, 6
    q = torch.randn(1, 4, m, 16)
    k, v = (torch.randn(1, 2, context + m * own, 16) for _ in range(2))
    ref = flexattn.full_reference(q, k, v, context, m, own)
    k_ctx, k_own = flexattn.split_kv(k, context, m, own)
    v_ctx, v_own = flexattn.split_kv(v, context, m, own)
    flex = flexattn.flex_fn(torch.device("cpu"))
    torch.testing.assert_close(
        flexattn.cascade(flex, q, k_ctx, v_ctx, k_own, v_own), ref, rtol=1e-5, atol=1e-5
    )
    bm = flexattn.ippd_block_mask(context, m, own, torch.device("cpu"))
    torch.testing.assert_close(
        flex(q, k, v, block_mask=bm, enable_gqa=True), ref, rtol=1e-5, atol=1e-5
    )
    # question j alone: the context and its own region, as a request of its own would see it
    j = 1
    own_k = torch.cat([k_ctx, k_own[j : j + 1]], 2)
    own_v = torch.cat([v_ctx, v_own[j : j + 1]], 2)
    alone = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, j : j + 1], own_k, own_v, enable_gqa=True
    )
    torch.testing.assert_close(alone[:, :, 0], ref[:, :, j], rtol=1e-5, atol=1e-5)


def test_moe_grouped_gemm_equals_per_expert_loop(nemotron):
    torch = pytest.importorskip("torch")
    from gpu_validate.cases import moe_spec
    from gpu_validate.layers import MoE

    moe = MoE(moe_spec(tiny_spec(nemotron)), _env(torch))
    x = torch.randn(29, 64)
    loop = moe(x, grouped=False)
    if not moe.grouped:
        pytest.skip("torch._grouped_mm not in this torch")
    torch.testing.assert_close(moe(x, grouped=True), loop, rtol=1e-4, atol=1e-4)


def test_stack_prefix_hit_equals_full_prefill(nemotron):
    """The composed stack after a prefix hit (KV + loaded checkpoint) gives the full prefill's
    last logits: the layers, caches and state layout are wired right."""
    torch = pytest.importorskip("torch")
    from gpu_validate.layers import HybridStack

    spec = tiny_spec(nemotron)
    stack = HybridStack(spec, _env(torch))
    stack.prepare(1, 24)
    x = torch.randn(1, 24, spec.d_model)
    full = stack.prefill(x, 0)
    stack.prepare(1, 24)
    stack.prefill(x[:, :16], 0)
    assert stack.running is not None and stack.pool is not None
    stack.pool[0].copy_(stack.running.view(-1))  # checkpoint after 16 tokens
    stack.running.zero_()
    torch.testing.assert_close(stack.prefill(x[:, 16:], 16), full, rtol=1e-4, atol=1e-4)


def test_tiny_run_end_to_end(tmp_path, nemotron):
    """The harness on the CPU with tiny shapes: every case recorded, checks pass, fit and report
    run on its records, resume skips what is done, a zero budget stops cleanly."""
    pytest.importorskip("torch")
    out = tmp_path / "run"
    assert main(["--budget", "120", "--out", str(out), "--tiny", "--device", "cpu", "-q"]) == 0
    recs = read_records([out])
    kinds = [r["kind"] for r in recs]
    assert kinds[0] == "header" and kinds[-1] == "end" and "error" not in kinds
    assert recs[-1]["reason"] == "complete"
    cases = plan(tiny_spec(nemotron), TINY)
    assert done_keys(recs) == {c.key for c in cases}
    checks = [r for r in recs if r["kind"] == "check"]
    assert all(r["ok"] in (True, None) for r in checks), checks
    assert any(r["ok"] for r in checks if r["op_name"] == "cascade_vs_full")
    for r in timed(recs, ("op", "stack", "floor")):
        assert 0 < r["p10_s"] <= r["median_s"] <= r["p90_s"] and r["device"] == "cpu"
    # one GPU: no all-reduce; a Mamba2 model: no Mamba1 selective scan
    assert {r["op_class"] for r in timed(recs)} == set(OP_CLASSES) - {"allreduce", "selective_scan"}

    cal = tmp_path / "cal.json"
    data = run_fit([out], cal)
    assert data["hardware"]["source"].startswith("measured floors")
    Calibration.load(cal)
    summary = build_report([out], cal, tmp_path / "report")
    assert summary["stack_prefill"]["n"] == 3 and summary["stack_decode"]["n"] == 2
    assert all(math.isfinite(e["cal_median"]) for e in summary["by_class"].values())

    assert (
        main(["--budget", "60", "--out", str(out), "--tiny", "--device", "cpu", "--resume", "-q"])
        == 0
    )
    end = read_records([out])[-1]
    assert end["measured"] == 0 and end["skipped_done"] == len(cases)
    with pytest.raises(SystemExit, match="--resume"):
        main(["--out", str(out), "--tiny", "--device", "cpu", "-q"])

    empty = tmp_path / "zero"
    assert main(["--budget", "0", "--out", str(empty), "--tiny", "--device", "cpu", "-q"]) == 0
    recs = read_records([empty])
    assert [r["kind"] for r in recs] == ["header", "end"] and recs[-1]["reason"] == "budget"


def test_the_device_script_rehearses_on_the_cpu(tmp_path):
    """``gpu_validate/device.sh`` as a GPU machine runs it, on the CPU with tiny shapes: the
    carried wheels install offline into their own folder, and the files it promises land in
    ``OUT`` (all but ``pytest.log``: the GPU tests run on a GPU only)."""
    pytest.importorskip("torch")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "DEVICE": "cpu",
        "TINY": "1",
        "BUDGET": "30",
        "SITE": str(tmp_path / "site"),
        "PYTHON": sys.executable,
    }
    proc = subprocess.run(
        ["bash", "gpu_validate/device.sh"],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    assert files == [
        "calibration.json",
        "report/pred_vs_meas.png",
        "report/predictions.csv",
        "report/report.md",
        "report/stack_prefill.csv",
        "report/summary.json",
        "run/records.jsonl",
    ]
    assert (tmp_path / "site" / "fla").is_dir()  # fla-core from gpu_validate/wheels
    assert read_records([out / "run"])[-1]["reason"] == "complete"


# ---------------------------------------------------------------------------- GPU only
def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch


@pytest.mark.gpu
def test_fla_chunk_simple_gla_equals_reference():
    torch = _cuda()
    from gpu_validate import ssd

    if not ssd.fla_available():
        pytest.skip("fla-core (gpu_validate/wheels) not installed")
    x, dt, A, B, C, D, h0 = (t.cuda() for t in _ssd_inputs(torch, 300, H=8, P=64, G=2, N=128))

    def rel(a, b):
        return float((a.float() - b).abs().max() / b.abs().max())

    y, h = ssd.ssd_sequential(x, dt, A, B, C, D, h0)
    yf, hf = ssd.ssd_fla(x, dt, A, B, C, D, h0)  # fp32 inputs (Triton dots may use TF32)
    assert rel(yf, y) < 5e-3 and rel(hf, h) < 5e-3
    yb, hb = ssd.ssd_fla(
        x.bfloat16(), dt.bfloat16(), A, B.bfloat16(), C.bfloat16(), D.bfloat16(), h0
    )
    assert rel(yb, y) < 3e-2 and rel(hb, h) < 3e-2
    hs = h0.clone()
    step = ssd.ssd_fla_step(x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, hs)
    y1, _ = ssd.ssd_sequential(x[:, :1], dt[:, :1], A, B[:, :1], C[:, :1], D, h0)
    assert rel(step, y1[:, 0]) < 5e-3


@pytest.mark.gpu
def test_tiny_run_on_the_gpu(tmp_path):
    _cuda()
    out = tmp_path / "gpu"
    assert main(["--budget", "300", "--out", str(out), "--tiny", "--device", "cuda", "-q"]) == 0
    recs = read_records([out])
    assert recs[0]["hardware_preset"] is not None or "cuda" in recs[0]["device"]
    assert all(r["ok"] in (True, None) for r in recs if r["kind"] == "check")
    assert not [r for r in recs if r["kind"] == "error"]


def test_synthetic_run_uses_only_known_classes(nemotron, h100):
    recs = synthetic_records(replace(nemotron, name="x"), h100, None, noise=0.0, outliers=0.0)
    assert {r["op_class"] for r in recs if r["kind"] == "op"} <= set(OP_CLASSES)
