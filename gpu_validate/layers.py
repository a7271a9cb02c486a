"""The layers the harness times, in plain PyTorch (plus fla's SSD kernels on a GPU), with their
shapes taken from a :class:`simlab.model.spec.ModelSpec`.

Each layer's weights are random (scaled by ``1/sqrt(fan_in)`` so activations stay O(1); never
zeros, which can run faster than real data). Every op the cost model names has a method here
(projections, attention over a cached prefix and decode, the Mamba2 mixer core and its decode
step, MLP, MoE, norm + residual, checkpoint copies), and :class:`HybridStack` composes them into
the model's layer stack for prefill (with or without a prefix hit) and decode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from gpu_validate import ssd
from simlab import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Env:
    """Where and how tensors are made."""

    device: torch.device
    dtype: torch.dtype
    use_fla: bool = False
    grouped_mm: bool = True
    choices: dict = field(default_factory=dict, compare=False)  # kernel paths picked so far

    def randn(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=self.dtype) * scale

    def weight(self, d_out: int, d_in: int) -> torch.Tensor:
        return self.randn(d_out, d_in, scale=d_in**-0.5)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def norm_residual(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One layer's ``norms_residuals`` op: residual add, then RMSNorm of the sum."""
    return rms_norm(x + r, w)


# ---------------------------------------------------------------------------- attention
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """``q`` ``[b, Hq, q, d]`` over ``k``/``v`` ``[b, Hkv, k, d]`` (GQA); ``causal``: the
    lower-right causal mask (query ``i`` sees keys ``<= k - q + i``: new tokens over a prefix)."""
    mask = causal_lower_right(q.shape[2], k.shape[2]) if causal and q.shape[2] > 1 else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _expand_kv(k: torch.Tensor, heads: int) -> torch.Tensor:
    return k if k.shape[1] == heads else k.repeat_interleave(heads // k.shape[1], dim=1)


#: SDPA paths tried on a GPU, fastest first: (backend name, expand the KV heads first?).
SDPA_PATHS = (
    ("sdpa_flash", "FLASH_ATTENTION", False),
    ("sdpa_cudnn", "CUDNN_ATTENTION", False),
    ("sdpa_efficient_expanded_kv", "EFFICIENT_ATTENTION", True),
)


def run_sdpa(
    path: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> torch.Tensor:
    """:func:`sdpa` restricted to one backend of :data:`SDPA_PATHS` (``sdpa_default``: any)."""
    for name, backend, expand in SDPA_PATHS:
        if name == path:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            if expand:
                k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
            with sdpa_kernel([getattr(SDPBackend, backend)]):
                return sdpa(q, k, v, causal)
    return sdpa(q, k, v, causal)


def pick_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[Callable[[], torch.Tensor], str]:
    """The fastest working SDPA path for these tensors and its name: on a GPU, flash (native
    GQA) if it accepts them, else cuDNN, else memory-efficient with the KV heads expanded;
    elsewhere (or if none works) the default dispatch."""
    if q.device.type == "cuda":
        for name, _, _ in SDPA_PATHS:
            try:
                run_sdpa(name, q, k, v, causal)
            except Exception as err:  # noqa: BLE001 - not built, not for these shapes, OOM...
                log.info("SDPA %s unavailable for %s: %s", name, tuple(q.shape), err)
                continue
            return (lambda path=name: run_sdpa(path, q, k, v, causal)), name
    return (lambda: sdpa(q, k, v, causal)), "sdpa_default"


class Attention:
    """GQA attention layer without positional encoding (Nemotron-H's attention has none)."""

    def __init__(self, spec: ModelSpec, env: Env):
        self.hq, self.hkv, self.hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.qdim, self.kvdim = self.hq * self.hd, self.hkv * self.hd
        self.w_qkv = env.weight(self.qdim + 2 * self.kvdim, spec.d_model)
        self.w_o = env.weight(spec.d_model, self.qdim)
        self.env = env

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
    ) -> torch.Tensor:
        """SDPA through the path :func:`pick_sdpa` chose on the first call of this kind."""
        key = ("sdpa", causal)
        if key not in self.env.choices:
            self.env.choices[key] = pick_sdpa(q, k, v, causal)[1]
        return run_sdpa(self.env.choices[key], q, k, v, causal)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = F.linear(x, self.w_qkv).split([self.qdim, self.kvdim, self.kvdim], dim=-1)
        return (
            q.view(b, t, self.hq, self.hd).transpose(1, 2),
            k.view(b, t, self.hkv, self.hd).transpose(1, 2),
            v.view(b, t, self.hkv, self.hd).transpose(1, 2),
        )

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape
        return F.linear(o.transpose(1, 2).reshape(b, t, self.qdim), self.w_o)

    def prefill(
        self, x: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, prefix: int
    ) -> torch.Tensor:
        """New tokens ``x`` ``[1, T, D]`` after ``prefix`` cached ones; appends their KV."""
        q, k, v = self.qkv(x)
        end = prefix + x.shape[1]
        cache_k[:, :, prefix:end] = k
        cache_v[:, :, prefix:end] = v
        return self.out(self.attend(q, cache_k[:, :, :end], cache_v[:, :, :end], causal=True))

    def decode(
        self, x: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, ctx: int
    ) -> torch.Tensor:
        """One token per sequence (``x`` ``[b, 1, D]``) whose KV lands at ``ctx - 1``; attends
        over ``ctx`` keys."""
        q, k, v = self.qkv(x)
        cache_k[:, :, ctx - 1 : ctx] = k
        cache_v[:, :, ctx - 1 : ctx] = v
        return self.out(self.attend(q, cache_k[:, :, :ctx], cache_v[:, :, :ctx], causal=False))


# ---------------------------------------------------------------------------- Mamba2
SSDInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class Mamba2:
    """Mamba2 mixer: in_proj -> causal depthwise conv + SiLU -> SSD -> gated RMSNorm ->
    out_proj. :meth:`core` is the cost model's ``ssm_scan`` op (everything between the two
    projections), :meth:`step` its ``ssm_step``."""

    def __init__(self, spec: ModelSpec, env: Env):
        self.env = env
        self.D, self.di, self.N = spec.d_model, spec.ssm_d_inner, spec.ssm_state_dim
        self.G, self.H, self.P = spec.ssm_n_groups, spec.ssm_n_heads, spec.ssm_head_dim
        self.K, self.conv_ch = spec.ssm_conv_kernel, spec.ssm_conv_channels
        self.in_dim = 2 * self.di + 2 * self.G * self.N + self.H
        self.w_in = env.weight(self.in_dim, self.D)
        self.w_out = env.weight(self.D, self.di)
        self.conv_w = env.randn(self.conv_ch, self.K, scale=self.K**-0.5)
        self.conv_b = env.randn(self.conv_ch, scale=0.1)
        dev = env.device
        self.dt_bias = (torch.rand(self.H, device=dev) * 4 - 5).to(env.dtype)  # softplus ~ 0.01-0.3
        self.A = -torch.rand(self.H, device=dev, dtype=torch.float32).add_(0.5)
        self.Dp = torch.ones(self.H, device=dev, dtype=env.dtype)
        self.norm_w = torch.ones(self.di, device=dev, dtype=env.dtype)

    # state shapes
    def conv_state(self, b: int) -> torch.Tensor:
        return self.env.randn(b, self.conv_ch, self.K)

    def ssm_state(self, b: int) -> torch.Tensor:
        return self.env.randn(b, self.H, self.N, self.P, scale=0.1)

    def split(self, zxbcdt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z, xbc, dt = zxbcdt.split([self.di, self.conv_ch, self.H], dim=-1)
        return z, xbc, dt

    def conv(
        self, xbc: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv + SiLU of ``xbc`` ``[b, T, C]``; ``state`` ``[b, C, K]`` holds
        the last ``K`` inputs before these (None: a fresh sequence). Returns (out, new state)."""
        xt = xbc.transpose(1, 2)
        left = F.pad(xt, (self.K - 1, 0)) if state is None else torch.cat([state[..., 1:], xt], -1)
        out = F.silu(F.conv1d(left, self.conv_w[:, None, :], self.conv_b, groups=self.conv_ch))
        return out.transpose(1, 2), left[..., -self.K :]  # left has >= K columns

    def ssd_inputs(self, xbc: torch.Tensor, dt: torch.Tensor) -> SSDInputs:
        b, t, _ = xbc.shape
        x, B, C = xbc.split([self.di, self.G * self.N, self.G * self.N], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias.float())
        return (
            x.reshape(b, t, self.H, self.P),
            dt,
            self.A,
            B.reshape(b, t, self.G, self.N),
            C.reshape(b, t, self.G, self.N),
        )

    def scan(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        h0: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.env.use_fla:
            return ssd.ssd_fla(x, dt.to(x.dtype), A, B, C, self.Dp, h0)
        return ssd.ssd_chunked(x, dt, A, B, C, self.Dp, h0)

    def gate(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        b, t = z.shape[:2]
        return rms_norm(y.reshape(b, t, self.di).to(z.dtype) * F.silu(z), self.norm_w)

    def core(
        self, zxbcdt: torch.Tensor, conv_state: torch.Tensor | None, h0: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ssm_scan``: ``zxbcdt`` ``[b, T, in_dim]`` -> gated output ``[b, T, d_inner]``,
        new conv state, final SSM state. ``conv_state``/``h0`` given = continuing a prefix."""
        z, xbc, dt = self.split(zxbcdt)
        xbc, conv_new = self.conv(xbc, conv_state)
        y, h = self.scan(*self.ssd_inputs(xbc, dt), h0)
        return self.gate(y, z), conv_new, h

    def step(self, zxbcdt: torch.Tensor, conv_state: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``ssm_step``: one token per sequence, ``zxbcdt`` ``[b, in_dim]``; updates
        ``conv_state`` ``[b, C, K]`` and ``h`` ``[b, H, N, P]`` in place."""
        b = zxbcdt.shape[0]
        z, xbc, dt = self.split(zxbcdt)
        conv_state.copy_(torch.roll(conv_state, -1, dims=-1))
        conv_state[..., -1] = xbc
        xbc = F.silu((conv_state * self.conv_w).sum(-1) + self.conv_b)
        x, dtp, A, B, C = self.ssd_inputs(xbc[:, None], dt[:, None])
        step = ssd.ssd_fla_step if self.env.use_fla else ssd.ssd_step
        y = step(x[:, 0], dtp[:, 0], A, B[:, 0], C[:, 0], self.Dp, h)
        return rms_norm(y.reshape(b, self.di) * F.silu(z), self.norm_w)

    def in_proj(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w_in)

    def out_proj(self, y: torch.Tensor) -> torch.Tensor:
        return F.linear(y, self.w_out)


# ---------------------------------------------------------------------------- MLP / MoE
def _act(h: torch.Tensor, gated: bool) -> torch.Tensor:
    if gated:
        g, u = h.chunk(2, dim=-1)
        return F.silu(g) * u
    return torch.square(F.relu(h))  # squared ReLU (Nemotron-H)


class MLP:
    """Gated (SwiGLU, gate and up fused in one GEMM) or squared-ReLU MLP."""

    def __init__(self, spec: ModelSpec, env: Env):
        self.gated = spec.mlp_gated
        inter = spec.mlp_intermediate
        self.w_up = env.weight((2 if self.gated else 1) * inter, spec.d_model)
        self.w_down = env.weight(spec.d_model, inter)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_act(F.linear(x, self.w_up), self.gated), self.w_down)


class MoE:
    """Top-k routed experts as grouped GEMMs: router GEMM, top-k, tokens sorted by expert,
    ``torch._grouped_mm`` over the experts (or one GEMM per expert where it is unavailable),
    weighted scatter-add back."""

    def __init__(self, spec: ModelSpec, env: Env):
        self.E, self.k, self.gated = spec.moe_experts, spec.moe_top_k, spec.mlp_gated
        inter, D = spec.moe_intermediate, spec.d_model
        self.router = env.weight(self.E, D)
        self.w_up = env.randn(self.E, (2 if self.gated else 1) * inter, D, scale=D**-0.5)
        self.w_down = env.randn(self.E, D, inter, scale=inter**-0.5)
        self.grouped = env.grouped_mm and hasattr(torch, "_grouped_mm")

    def route(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = torch.softmax(F.linear(x, self.router).float(), dim=-1)
        weight, expert = probs.topk(self.k, dim=-1)
        flat = expert.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        return order, order // self.k, counts, weight.reshape(-1)[order].to(x.dtype)

    def experts_grouped(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        offs = torch.cumsum(counts, 0).to(torch.int32)
        h = torch._grouped_mm(xs, self.w_up.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(_act(h, self.gated), self.w_down.transpose(-2, -1), offs=offs)

    def experts_loop(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        out = torch.empty(xs.shape[0], self.w_down.shape[1], device=xs.device, dtype=xs.dtype)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                h = _act(F.linear(xs[start : start + n], self.w_up[e]), self.gated)
                out[start : start + n] = F.linear(h, self.w_down[e])
            start += n
        return out

    def __call__(self, x: torch.Tensor, grouped: bool | None = None) -> torch.Tensor:
        _order, token, counts, weight = self.route(x)
        xs = x[token]
        use = self.grouped if grouped is None else grouped
        ys = self.experts_grouped(xs, counts) if use else self.experts_loop(xs, counts)
        return torch.zeros_like(x).index_add_(0, token, ys * weight[:, None])


# ---------------------------------------------------------------------------- stack
def layer_pattern(spec: ModelSpec) -> list[str]:
    """Layer kinds in order: mixers (attention spread evenly among SSM layers) interleaved with
    the FFN layers (MLP / MoE) in proportion, e.g. Nemotron-H's M-M-M-M*-... pattern."""

    def spread(a: str, na: int, b: str, nb: int) -> list[str]:
        keyed = [((i + 0.5) / na, 0, a) for i in range(na)] + [
            ((i + 0.5) / nb, 1, b) for i in range(nb)
        ]
        return [kind for _, _, kind in sorted(keyed)]

    mixers = spread("ssm", spec.n_ssm_layers, "attn", spec.n_attn_layers)
    ffns = spread("mlp", spec.n_mlp_layers, "moe", spec.n_moe_layers)
    keyed = [((i + 0.5) / len(mixers), 0, m) for i, m in enumerate(mixers)]
    keyed += [((i + 0.5) / len(ffns), 1, f) for i, f in enumerate(ffns)] if ffns else []
    return [kind for _, _, kind in sorted(keyed)]


Layer = Attention | Mamba2 | MLP | MoE


class HybridStack:
    """The model's layers (pre-norm residual blocks), final norm and LM head; input is hidden
    states (embedding lookup is not a cost-model op). Prefill: one sequence; decode: a batch."""

    def __init__(self, spec: ModelSpec, env: Env):
        self.spec, self.env = spec, env
        self.kinds = layer_pattern(spec)
        makers: dict[str, type[Layer]] = {"attn": Attention, "ssm": Mamba2, "mlp": MLP, "moe": MoE}
        self.layers: list[Layer] = [makers[k](spec, env) for k in self.kinds]
        self.norms = [
            torch.ones(spec.d_model, device=env.device, dtype=env.dtype) for _ in self.kinds
        ]
        self.final_norm = torch.ones(spec.d_model, device=env.device, dtype=env.dtype)
        self.lm_head = env.weight(spec.vocab_size, spec.d_model) if spec.vocab_size else None
        self.ssm = [i for i, layer in enumerate(self.layers) if isinstance(layer, Mamba2)]
        # per layer index: KV cache (attention), conv and SSM state (Mamba2)
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.conv: dict[int, torch.Tensor] = {}
        self.h: dict[int, torch.Tensor] = {}
        self.pool: torch.Tensor | None = None
        self.running: torch.Tensor | None = None

    def prepare(self, batch: int, length: int) -> None:
        """Allocate KV caches for ``batch`` x ``length`` tokens and SSM states for ``batch``
        sequences. For one sequence, every SSM layer's state lives in one contiguous running
        buffer, and a checkpoint pool row holds a copy: a prefix hit loads it with one copy."""
        env = self.env
        self.kv, self.conv, self.h = {}, {}, {}
        self.running = self.pool = None
        for i, layer in enumerate(self.layers):
            if isinstance(layer, Attention):
                shape = (batch, layer.hkv, length, layer.hd)
                self.kv[i] = (env.randn(*shape), env.randn(*shape))
        if not self.ssm:
            return
        if batch > 1:
            for i in self.ssm:
                m = self._mamba(i)
                self.h[i], self.conv[i] = m.ssm_state(batch), m.conv_state(batch)
            return
        m = self._mamba(self.ssm[0])
        hs, cs = m.H * m.N * m.P, m.conv_ch * m.K
        self.running = env.randn(len(self.ssm), hs + cs, scale=0.1)
        self.pool = env.randn(1, len(self.ssm) * (hs + cs), scale=0.1)
        for row, i in enumerate(self.ssm):
            self.h[i] = self.running[row, :hs].view(1, m.H, m.N, m.P)
            self.conv[i] = self.running[row, hs:].view(1, m.conv_ch, m.K)

    def _mamba(self, i: int) -> Mamba2:
        layer = self.layers[i]
        assert isinstance(layer, Mamba2)
        return layer

    def prefill(self, x: torch.Tensor, prefix: int) -> torch.Tensor:
        """``x`` ``[1, T, D]`` after ``prefix`` cached tokens (prefix > 0 on a hybrid: load the
        SSM checkpoint first). Returns the last position's logits."""
        if prefix and self.ssm:
            assert self.running is not None and self.pool is not None
            self.running.view(-1).copy_(self.pool[0])
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, self.norms[i])
            if isinstance(layer, Attention):
                y = layer.prefill(h, *self.kv[i], prefix)
            elif isinstance(layer, Mamba2):
                conv0, h0 = (self.conv[i], self.h[i]) if prefix else (None, None)
                core, conv, hf = layer.core(layer.in_proj(h), conv0, h0)
                self.conv[i].copy_(conv)
                self.h[i].copy_(hf)
                y = layer.out_proj(core)
            elif isinstance(layer, MoE):
                y = layer(h[0])[None]
            else:
                y = layer(h)
            x = x + y
        return self._head(x[:, -1:])

    def decode(self, x: torch.Tensor, ctx: int) -> torch.Tensor:
        """One decode step: ``x`` ``[b, 1, D]``, every sequence with ``ctx`` tokens of context."""
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, self.norms[i])
            if isinstance(layer, Attention):
                y = layer.decode(h, *self.kv[i], ctx)
            elif isinstance(layer, Mamba2):
                y = layer.out_proj(layer.step(layer.in_proj(h[:, 0]), self.conv[i], self.h[i]))
                y = y[:, None]
            elif isinstance(layer, MoE):
                y = layer(h[:, 0])[:, None]
            else:
                y = layer(h)
            x = x + y
        return self._head(x)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        x = rms_norm(x, self.final_norm)
        return F.linear(x, self.lm_head) if self.lm_head is not None else x
