"""Mamba2's SSD (state-space duality) recurrence: a pure-PyTorch reference and the fla kernels.

Shapes (Mamba2 naming): ``x`` ``[b, T, H, P]`` (heads of ``P`` channels), ``dt`` ``[b, T, H]``
(after softplus, > 0), ``A`` ``[H]`` (< 0), ``B``/``C`` ``[b, T, G, N]`` (``G`` groups shared by
``H/G`` heads each), ``D`` ``[H]``; the state ``h`` is ``[b, H, N, P]`` (fla's ``[K, V]`` layout).
The recurrence, per head::

    h_t = exp(dt_t * A) * h_{t-1} + B_t (dt_t * x_t)^T        y_t = C_t^T h_t + D * x_t

:func:`ssd_sequential` runs it token by token (the definition); :func:`ssd_chunked` is the SSD
block decomposition (quadratic attention-like form inside chunks, a recurrence over chunk
states between them) and must agree with it; :func:`ssd_fla` calls fla's Triton
``chunk_simple_gla`` with ``q = C, k = B, v = dt * x, g = dt * A, scale = 1`` (GPU only). An
initial state ``h0`` is a prefix-cache hit: the scan continues from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def expand_groups(t: torch.Tensor, heads: int) -> torch.Tensor:
    """``[b, T, G, N]`` -> ``[b, T, H, N]``: head ``h`` uses group ``h // (H / G)``."""
    groups = t.shape[2]
    return t if groups == heads else t.repeat_interleave(heads // groups, dim=2)


def ssd_sequential(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    h0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence one token at a time, in float32. Returns ``(y, h_final)``."""
    b, T, H, P = x.shape
    Bh, Ch = expand_groups(B, H).float(), expand_groups(C, H).float()
    xf, dtf, Af = x.float(), dt.float(), A.float()
    h = torch.zeros(b, H, B.shape[-1], P, device=x.device) if h0 is None else h0.float().clone()
    ys = []
    for t in range(T):
        decay = torch.exp(dtf[:, t] * Af)[:, :, None, None]
        u = dtf[:, t, :, None] * xf[:, t]  # [b, H, P]
        h = h * decay + Bh[:, t, :, :, None] * u[:, :, None, :]
        ys.append(torch.einsum("bhn,bhnp->bhp", Ch[:, t], h))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + D.float()[None, None, :, None] * xf
    return y.to(x.dtype), h


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    h0: torch.Tensor | None = None,
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SSD by chunks of ``chunk`` tokens, in float32. Returns ``(y, h_final)``."""
    b, T, H, P = x.shape
    N = B.shape[-1]
    pad = (-T) % chunk  # padded steps have dt = 0: decay 1, no input, state unchanged
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad))
    dtf = torch.nn.functional.pad(dt.float(), (0, 0, 0, pad))
    Bh = torch.nn.functional.pad(expand_groups(B, H).float(), (0, 0, 0, 0, 0, pad))
    Ch = torch.nn.functional.pad(expand_groups(C, H).float(), (0, 0, 0, 0, 0, pad))
    nc = (T + pad) // chunk
    xc = xf.view(b, nc, chunk, H, P)
    dtc = dtf.view(b, nc, chunk, H)
    Bc = Bh.view(b, nc, chunk, H, N)
    Cc = Ch.view(b, nc, chunk, H, N)
    acum = (dtc * A.float()).cumsum(dim=2)  # [b, nc, Q, H]
    u = dtc[..., None] * xc  # [b, nc, Q, H, P]
    # inside chunks: y_i = sum_{j <= i} (C_i . B_j) exp(acum_i - acum_j) u_j
    seg = acum[:, :, :, None, :] - acum[:, :, None, :, :]  # [b, nc, Qi, Qj, H]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp(seg.masked_fill(~causal[None, None, :, :, None], float("-inf")))
    scores = torch.einsum("bcihn,bcjhn->bcijh", Cc, Bc) * decay
    y = torch.einsum("bcijh,bcjhp->bcihp", scores, u)
    # each chunk's own contribution to the state at its end
    to_end = torch.exp(acum[:, :, -1:, :] - acum)  # [b, nc, Q, H]
    states = torch.einsum("bcjhn,bcjh,bcjhp->bchnp", Bc, to_end, u)
    # between chunks: carry the state, add its read-out to every position of the next chunk
    h = torch.zeros(b, H, N, P, device=x.device) if h0 is None else h0.float().clone()
    chunk_decay = torch.exp(acum[:, :, -1, :])  # [b, nc, H]
    inter = []
    for c in range(nc):
        inter.append(torch.einsum("bihn,bih,bhnp->bihp", Cc[:, c], torch.exp(acum[:, c]), h))
        h = h * chunk_decay[:, c, :, None, None] + states[:, c]
    y = (y + torch.stack(inter, dim=1)).reshape(b, nc * chunk, H, P)[:, :T]
    if D is not None:
        y = y + D.float()[None, None, :, None] * x.float()
    return y.to(x.dtype), h


def ssd_step(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    h: torch.Tensor,
) -> torch.Tensor:
    """One decode step for a batch: ``x`` ``[b, H, P]``, ``dt`` ``[b, H]``, ``B``/``C``
    ``[b, G, N]``; updates ``h`` ``[b, H, N, P]`` in place and returns ``y`` ``[b, H, P]``."""
    H = x.shape[1]
    Bh = expand_groups(B[:, None], H)[:, 0].to(h.dtype)
    Ch = expand_groups(C[:, None], H)[:, 0].to(h.dtype)
    decay = torch.exp(dt.float() * A.float()).to(h.dtype)
    u = (dt[..., None] * x).to(h.dtype)
    h.mul_(decay[:, :, None, None]).add_(Bh[:, :, :, None] * u[:, :, None, :])
    y = torch.einsum("bhn,bhnp->bhp", Ch, h).to(x.dtype)
    if D is not None:
        y = y + D[None, :, None].to(x.dtype) * x
    return y


# ---------------------------------------------------------------------------- fla (GPU)
def fla_available() -> bool:
    """Whether fla's Triton kernels can run here (fla-core importable and a CUDA device)."""
    if not torch.cuda.is_available():
        return False
    try:
        from fla.ops.simple_gla import chunk_simple_gla  # noqa: F401
    except Exception:  # noqa: BLE001 - missing package, triton, or an incompatible version
        return False
    return True


def simple_gla_inputs(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mamba2's SSD as simple GLA: ``q = C, k = B`` (groups expanded to heads),
    ``v = dt * x``, ``g = dt * A`` (log decay, fp32); all ``[b, T, H, ...]``, fla's layout.
    With ``scale = 1`` and ``D * x`` added afterwards, simple GLA's output equals SSD's."""
    H = x.shape[2]
    q = expand_groups(C, H).contiguous()
    k = expand_groups(B, H).contiguous()
    v = (dt[..., None] * x).to(x.dtype)
    g = (dt.float() * A.float()).contiguous()
    return q, k, v, g


def _add_skip(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None) -> torch.Tensor:
    """``y + D * x`` per head (``D`` ``[H]``, heads on dim -2)."""
    return y if D is None else y + D[:, None].to(x.dtype) * x


def ssd_fla(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    h0: torch.Tensor | None = None,
    kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SSD through fla's ``chunk_simple_gla`` (Triton). Returns ``(y, h_final)`` (state fp32).

    ``kernel`` replaces the Triton kernel by another with its signature (the tests pass fla's
    pure-PyTorch ``naive_chunk_simple_gla`` to check this mapping on a CPU)."""
    if kernel is None:
        from fla.ops.simple_gla import chunk_simple_gla

        kernel = chunk_simple_gla
    q, k, v, g = simple_gla_inputs(x, dt, A, B, C)
    y, h = kernel(q, k, v, g=g, scale=1.0, initial_state=h0, output_final_state=True)
    return _add_skip(y.to(x.dtype), x, D), h


def ssd_fla_step(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    h: torch.Tensor,
    kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """One decode step through fla's ``fused_recurrent_simple_gla``; writes the new state
    into ``h`` and returns ``y`` ``[b, H, P]``. ``kernel`` as in :func:`ssd_fla`."""
    if kernel is None:
        from fla.ops.simple_gla import fused_recurrent_simple_gla

        kernel = fused_recurrent_simple_gla
    q, k, v, g = simple_gla_inputs(x[:, None], dt[:, None], A, B[:, None], C[:, None])
    y, h_new = kernel(q, k, v, g=g, scale=1.0, initial_state=h, output_final_state=True)
    h.copy_(h_new)
    return _add_skip(y[:, 0].to(x.dtype), x, D)
