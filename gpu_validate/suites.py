"""Turn a :class:`~gpu_validate.cases.Case` into something to time (or to check).

:meth:`Suites.build` returns ``(fn, impl, flush)``: a zero-argument callable running the case's
op once on tensors made beforehand (allocation stays out of the timing), the name of the kernel
path taken, and whether L2 should be flushed between repetitions. :meth:`Suites.check` runs a
numerical equality check and returns its record fields. Large objects (weights, a composed
stack) are cached within a suite and dropped by :meth:`Suites.clear`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from gpu_validate import flexattn, ssd
from gpu_validate.cases import Case
from gpu_validate.layers import (
    MLP,
    Env,
    HybridStack,
    Mamba2,
    MoE,
    norm_residual,
    pick_sdpa,
)
from simlab import ModelSpec

Fn = Callable[[], Any]
log = logging.getLogger(__name__)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |out - ref|, that over max |ref|)."""
    diff = float((out.float() - ref.float()).abs().max())
    return diff, diff / max(float(ref.float().abs().max()), 1e-12)


class Suites:
    def __init__(self, env: Env):
        self.env = env
        self._cache: dict[Any, Any] = {}
        self._flex_fn: Any = None

    def clear(self) -> None:
        self._cache.clear()
        if self.env.device.type == "cuda":
            torch.cuda.empty_cache()

    def _cached(self, key: Any, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    @property
    def flex(self) -> Any:
        if self._flex_fn is None:
            self._flex_fn = flexattn.flex_fn(self.env.device)
        return self._flex_fn

    @property
    def ssm_impl(self) -> str:
        return "fla_chunk_simple_gla" if self.env.use_fla else "torch_ssd_chunked"

    # ------------------------------------------------------------------ timed cases
    def build(self, case: Case) -> tuple[Fn, str, bool]:
        maker = getattr(self, f"_{case.suite}_{case.op_name}", None) or getattr(
            self, f"_{case.suite}", None
        )
        if maker is None:
            raise NotImplementedError(f"no builder for {case.suite}/{case.op_name}")
        return maker(case)

    def _floors(self, case: Case) -> tuple[Fn, str, bool]:
        env, p = self.env, case.params
        if case.op_name == "gemm_peak":
            a, b = env.randn(p["m"], p["k"]), env.randn(p["k"], p["n"])
            c = torch.empty(p["m"], p["n"], device=env.device, dtype=env.dtype)
            return (lambda: torch.mm(a, b, out=c)), "torch.mm", False
        if case.op_name == "copy_bw":
            n = p["mbytes"] * 2**20
            src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=env.device)
            dst = torch.empty_like(src)
            return (lambda: dst.copy_(src)), "copy_", False
        x = torch.zeros(1, device=env.device)
        k = p["launches"]

        def launches() -> None:
            for _ in range(k):
                x.add_(1.0)

        return launches, "add_ x1 element", False

    def _gemm(self, case: Case) -> tuple[Fn, str, bool]:
        env, spec, t = self.env, self._spec(case), case.params["tokens"]
        D = spec.d_model
        name = case.op_name
        if name == "mlp":
            mlp = self._cached(("mlp", spec), lambda: MLP(spec, env))
            x = env.randn(t, D)
            return (lambda: mlp(x)), "F.linear", True
        if name == "moe":
            moe = self._cached(("moe", spec), lambda: MoE(spec, env))
            x = env.randn(t, D)
            if moe.grouped:
                try:
                    moe(x)
                except Exception as err:  # noqa: BLE001 - unsupported here: a GEMM per expert
                    log.warning("torch._grouped_mm failed (%s); per-expert GEMMs", err)
                    moe.grouped = False
            return (lambda: moe(x)), ("torch._grouped_mm" if moe.grouped else "loop"), True
        qdim, kvdim = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
        di, GN, H = spec.ssm_d_inner, spec.ssm_n_groups * spec.ssm_state_dim, spec.ssm_n_heads
        dims = {
            "attn_qkv_proj": (D, qdim + 2 * kvdim),
            "attn_out_proj": (qdim, D),
            "ssm_in_proj": (D, 2 * di + 2 * GN + H),
            "ssm_out_proj": (di, D),
            "lm_head": (D, spec.vocab_size),
        }
        d_in, d_out = dims[name]
        w = self._cached((name, spec), lambda: env.weight(d_out, d_in))
        x = env.randn(t, d_in)
        return (lambda: F.linear(x, w)), "F.linear", True

    def _norms(self, case: Case) -> tuple[Fn, str, bool]:
        env, D = self.env, self._spec(case).d_model
        t = case.params["tokens"]
        x, r = env.randn(t, D), env.randn(t, D)
        w = torch.ones(D, device=env.device, dtype=env.dtype)
        return (lambda: norm_residual(x, r, w)), "add + F.rms_norm", True

    def _attn(self, case: Case) -> tuple[Fn, str, bool]:
        env, spec, p = self.env, self._spec(case), case.params
        hq, hkv, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        if case.op_name == "attn_prefill":
            b, q_len, k_len = p["batch"], p["new"], p["prefix"] + p["new"]
            causal = True
        else:
            b, q_len, k_len = p["batch"], 1, p["ctx"]
            causal = False
        q = env.randn(b, hq, q_len, hd)
        k, v = env.randn(b, hkv, k_len, hd), env.randn(b, hkv, k_len, hd)
        fn, impl = pick_sdpa(q, k, v, causal)
        return fn, impl, True

    def _mamba(self, spec: ModelSpec) -> Mamba2:
        layer = self._cached(("mamba", spec), lambda: Mamba2(spec, self.env))
        assert isinstance(layer, Mamba2)
        return layer

    def _ssm(self, case: Case) -> tuple[Fn, str, bool]:
        env, spec, p = self.env, self._spec(case), case.params
        if case.op_name == "ssm_state_copy":
            per = spec.ssm_state_bytes_per_layer * p["layers"]
            c = p["copies"]
            pool = torch.randint(0, 255, (c, per), dtype=torch.uint8, device=env.device)
            running = torch.empty_like(pool)

            def copies() -> None:
                for i in range(c):
                    running[i].copy_(pool[i])

            return copies, "copy_ per checkpoint", True
        m = self._mamba(spec)
        if case.op_name == "ssm_step":
            b = p["batch"]
            zx1, cs1, hs1 = env.randn(b, m.in_dim), m.conv_state(b), m.ssm_state(b)
            impl = "fla_fused_recurrent" if env.use_fla else "torch_step"
            return (lambda: m.step(zx1, cs1, hs1)), impl, True
        b, t, init = p["batch"], p["tokens"], p["init"]
        cs = m.conv_state(b) if init else None
        h0 = m.ssm_state(b) if init else None
        if case.op_name == "ssm_scan":
            zx = env.randn(b, t, m.in_dim)
            return (lambda: m.core(zx, cs, h0)), f"conv1d + {self.ssm_impl}", True
        xbc, dt = env.randn(b, t, m.conv_ch), env.randn(b, t, m.H)
        if case.op_name == "ssm_conv":
            return (lambda: m.conv(xbc, cs)), "F.conv1d depthwise", True
        inputs = m.ssd_inputs(xbc, dt)
        return (lambda: m.scan(*inputs, h0)), self.ssm_impl, True

    def _stack(self, case: Case) -> tuple[Fn, str, bool]:
        env, spec, p = self.env, self._spec(case), case.params
        stack: HybridStack = self._cached(("stack", spec), lambda: HybridStack(spec, env))
        impl = f"torch{' + ' + self.ssm_impl if stack.ssm else ''}"
        if p["mode"] == "prefill":
            if self._cache.get("stack_shape") != (1, p["len"]):
                stack.prepare(1, p["len"])
                self._cache["stack_shape"] = (1, p["len"])
            x = env.randn(1, p["new"], spec.d_model)
            return (lambda: stack.prefill(x, p["prefix"])), impl, True
        shape = (p["batch"], p["ctx"])
        if self._cache.get("stack_shape") != shape:
            stack.prepare(*shape)
            self._cache["stack_shape"] = shape
        x = env.randn(p["batch"], 1, spec.d_model)
        return (lambda: stack.decode(x, p["ctx"])), impl, True

    def _flex(self, case: Case) -> tuple[Fn, str, bool]:
        env, spec, p = self.env, self._spec(case), case.params
        C, m, own = p["context"], p["questions"], p["own"]
        hq, hkv, hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        q = env.randn(1, hq, m, hd)
        k_all, v_all = env.randn(1, hkv, C + m * own, hd), env.randn(1, hkv, C + m * own, hd)
        flex = self.flex
        if case.variant == "ippd_flex":
            bm = flexattn.ippd_block_mask(C, m, own, env.device)
            return (
                (lambda: flex(q, k_all, v_all, block_mask=bm, enable_gqa=True)),
                "flex_attention + IPPD block mask",
                True,
            )
        if case.variant == "cascade":
            k_ctx, k_own = flexattn.split_kv(k_all, C, m, own)
            v_ctx, v_own = flexattn.split_kv(v_all, C, m, own)
            return (
                (lambda: flexattn.cascade(flex, q, k_ctx, v_ctx, k_own, v_own)),
                "flex_attention x2 + LSE merge",
                True,
            )
        kb, vb = (flexattn.batched_kv(t, C, m, own) for t in (k_all, v_all))
        fn, impl = pick_sdpa(q.transpose(0, 2).contiguous(), kb, vb, causal=False)
        return fn, impl, True

    def _spec(self, case: Case) -> ModelSpec:
        if case.spec is None:
            raise ValueError(f"case {case.key} has no model spec")
        return case.spec

    # ------------------------------------------------------------------ checks
    def check(self, case: Case) -> dict[str, Any]:
        """Run a numerical check: ``max_abs_err``, ``rel_err``, ``tol``, ``ok`` (None when the
        check cannot run here), ``impl``."""
        fn = getattr(self, f"_check_{case.op_name}")
        with torch.no_grad():
            result: dict[str, Any] = fn(case)
            return result

    def _tol(self, dtype: torch.dtype, fp32: float = 1e-4, low: float = 3e-2) -> float:
        return fp32 if dtype == torch.float32 else low

    def _result(self, out: torch.Tensor, ref: torch.Tensor, tol: float, impl: str) -> dict:
        abs_err, rel = rel_err(out, ref)
        return {
            "max_abs_err": abs_err,
            "rel_err": rel,
            "tol": tol,
            "ok": bool(rel <= tol),
            "impl": impl,
        }

    def _check_moe_grouped_vs_loop(self, case: Case) -> dict:
        moe = MoE(self._spec(case), self.env)
        x = self.env.randn(case.params["tokens"], self._spec(case).d_model)
        if not moe.grouped:
            return {"ok": None, "impl": "torch._grouped_mm unavailable"}
        try:
            out = moe(x, grouped=True)
        except Exception as err:  # noqa: BLE001 - not supported for this device / dtype
            return {"ok": None, "impl": f"torch._grouped_mm failed: {err}"[:300]}
        return self._result(
            out,
            moe(x, grouped=False),
            self._tol(self.env.dtype),
            "torch._grouped_mm vs per-expert F.linear",
        )

    def _check_lower_right_vs_dense(self, case: Case) -> dict:
        env, spec = self.env, self._spec(case)
        new, total = case.params["new"], case.params["total"]
        q = env.randn(1, spec.n_heads, new, spec.head_dim)
        k = env.randn(1, spec.n_kv_heads, total, spec.head_dim)
        v = env.randn(1, spec.n_kv_heads, total, spec.head_dim)
        fn, impl = pick_sdpa(q, k, v, causal=True)
        mask = torch.ones(new, total, dtype=torch.bool, device=env.device).tril(total - new)
        ref = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True
        )
        return self._result(fn(), ref, self._tol(env.dtype), f"{impl} vs dense mask")

    def _ssd_inputs(self, spec: ModelSpec, t: int, dtype: torch.dtype) -> tuple:
        dev = self.env.device
        H, P, G, N = spec.ssm_n_heads, spec.ssm_head_dim, spec.ssm_n_groups, spec.ssm_state_dim
        x = torch.randn(1, t, H, P, device=dev).to(dtype)
        dt = F.softplus(torch.randn(1, t, H, device=dev) - 3)
        A = -torch.rand(H, device=dev) - 0.5
        B = (torch.randn(1, t, G, N, device=dev) * N**-0.5).to(dtype)
        C = (torch.randn(1, t, G, N, device=dev) * N**-0.5).to(dtype)
        D = torch.ones(H, device=dev)
        h0 = torch.randn(1, H, N, P, device=dev) * 0.1
        return x, dt, A, B, C, D, h0

    def _check_ssd_chunked_vs_sequential(self, case: Case) -> dict:
        spec = self._spec(case)
        x, dt, A, B, C, D, h0 = self._ssd_inputs(spec, case.params["tokens"], torch.float32)
        y1, h1 = ssd.ssd_chunked(x, dt, A, B, C, D, h0, chunk=16)
        y2, h2 = ssd.ssd_sequential(x, dt, A, B, C, D, h0)
        res = self._result(
            torch.cat([y1.flatten(), h1.flatten()]),
            torch.cat([y2.flatten(), h2.flatten()]),
            1e-4,
            "torch chunked (chunk 16) vs sequential, fp32, with h0",
        )
        return res

    def _check_fla_vs_reference(self, case: Case) -> dict:
        if not self.env.use_fla:
            return {"ok": None, "impl": "fla unavailable (needs fla-core, triton and CUDA)"}
        spec = self._spec(case)
        dtype = self.env.dtype
        x, dt, A, B, C, D, h0 = self._ssd_inputs(spec, case.params["tokens"], dtype)
        y1, h1 = ssd.ssd_fla(x, dt.to(dtype), A, B, C, D.to(dtype), h0)
        y2, h2 = ssd.ssd_sequential(x.float(), dt.to(dtype).float(), A, B.float(), C.float(), D, h0)
        return self._result(
            torch.cat([y1.float().flatten(), h1.float().flatten()]),
            torch.cat([y2.flatten(), h2.flatten()]),
            self._tol(dtype),
            "fla chunk_simple_gla vs sequential reference, with h0",
        )

    def _check_mixer_step_vs_core(self, case: Case) -> dict:
        env, spec = self.env, self._spec(case)
        m = Mamba2(spec, env)
        t = case.params["tokens"]
        zx = env.randn(1, t, m.in_dim)
        cs, h0 = m.conv_state(1), m.ssm_state(1)
        ref, _, _ = m.core(zx, cs, h0)
        cs2, h2 = cs.clone(), h0.clone().float() if not env.use_fla else h0.clone()
        steps = [m.step(zx[:, i], cs2, h2) for i in range(t)]
        return self._result(
            torch.stack(steps, 1),
            ref,
            self._tol(env.dtype, 1e-3, 5e-2),
            f"decode steps vs {self.ssm_impl} core over the same tokens",
        )

    def _flex_inputs(self, case: Case) -> tuple:
        spec, p, dev = self._spec(case), case.params, self.env.device
        C, m, own = p["context"], p["questions"], p["own"]
        q = torch.randn(1, spec.n_heads, m, spec.head_dim, device=dev)
        k = torch.randn(1, spec.n_kv_heads, C + m * own, spec.head_dim, device=dev)
        v = torch.randn(1, spec.n_kv_heads, C + m * own, spec.head_dim, device=dev)
        return q, k, v, C, m, own

    def _flex_tol(self) -> float:
        return 1e-4 if self.env.device.type == "cpu" else 5e-3  # GPU kernels may use TF32

    def _check_cascade_vs_full(self, case: Case) -> dict:
        q, k, v, C, m, own = self._flex_inputs(case)
        k_ctx, k_own = flexattn.split_kv(k, C, m, own)
        v_ctx, v_own = flexattn.split_kv(v, C, m, own)
        out = flexattn.cascade(self.flex, q, k_ctx, v_ctx, k_own, v_own)
        ref = flexattn.full_reference(q, k, v, C, m, own)
        return self._result(
            out,
            ref,
            self._flex_tol(),
            "cascade (2 passes, LSE merge) vs full attention, IPPD mask, fp32",
        )

    def _check_ippd_flex_vs_dense(self, case: Case) -> dict:
        q, k, v, C, m, own = self._flex_inputs(case)
        bm = flexattn.ippd_block_mask(C, m, own, q.device)
        out = self.flex(q, k, v, block_mask=bm, enable_gqa=True)
        ref = flexattn.full_reference(q, k, v, C, m, own)
        return self._result(
            out, ref, self._flex_tol(), "flex_attention IPPD block mask vs dense-mask SDPA, fp32"
        )
