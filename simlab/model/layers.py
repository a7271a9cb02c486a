"""Per-kind sizes and exact-mode FLOP coefficients of a :class:`~simlab.model.spec.ModelSpec`'s
layers: attention (GQA/MHA, MLA, sliding window), recurrent (Mamba1, Mamba2, GDN, KDA, short
convolution) and feed-forward (dense, MoE with shared experts, latent MoE).

Every function reads a resolved spec and returns integers, so the spec's FLOPs stay exact and
additive; the cost model (:mod:`simlab.cost.layers`) prices the same shapes.

Recurrent layers share one shape vocabulary (vLLM's ``MambaStateShapeCalculator`` is the oracle
for the state shapes):

============  ==========================  =========================  ==========================
kind          ``ssm_n_heads`` x           ``ssm_n_groups`` x          recurrent state per layer
              ``ssm_head_dim`` (d_inner)  ``ssm_state_dim`` (G x N)
============  ==========================  =========================  ==========================
mamba2        heads x head dim            groups x state size        ``H * P * N``
gdn           value heads x value dim     key heads x key dim        ``H_v * d_v * d_k``
kda           heads x head dim            heads x head dim           ``H * d * d``
mamba1        ``expand * d_model``        --                         ``d_inner * N``
short_conv    ``expand * d_model``        --                         none (conv only)
============  ==========================  =========================  ==========================

The conv state holds ``d_inner + 2 G N`` channels (``x, B, C`` or ``v, k, q``; ``d_inner`` for
Mamba1 and short conv) over ``ssm_conv_state_width`` steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simlab.model.spec import ModelSpec

#: recurrent kinds whose d_inner is heads x head dim and whose conv runs over x/v, B/k, C/q
HEADED_KINDS = ("mamba2", "gdn", "kda")


# ---------------------------------------------------------------------------- attention
def q_dims(m: ModelSpec) -> tuple[int, int]:
    """``(query width, attention-output width)``: ``n_heads * head_dim``, ``n_heads * v_head_dim``."""
    return m.n_heads * m.head_dim, m.n_heads * m.v_head_dim


def kv_elements_per_token(m: ModelSpec) -> int:
    """Cached elements of one token in one attention layer across the replica: K and V of every
    KV head (GQA), or MLA's latent (:func:`latent_elements`) once per GPU that keeps it."""
    if m.attn_kind == "mla":
        return latent_elements(m) * m.mla_kv_copies
    return m.n_kv_heads * (m.head_dim + m.v_head_dim)


def latent_elements(m: ModelSpec) -> int:
    """MLA's compressed latent of one token in one layer, ``kv_lora_rank + qk_rope_head_dim``
    (vLLM's MLA cache): what each tensor-parallel GPU keeps whole."""
    return m.mla_kv_rank + m.mla_rope_dim


def pair_flops(m: ModelSpec) -> int:
    """FLOPs of one (query, key) pair in one layer: scores ``2 H d_qk`` plus AV ``2 H d_v``."""
    return 2 * m.n_heads * (m.head_dim + m.v_head_dim)


def attention_gemms(m: ModelSpec) -> list[tuple[str, int, int]]:
    """``(name, d_in, d_out)`` of one attention layer's projections."""
    D = m.d_model
    qdim, odim = q_dims(m)
    gate = qdim if m.attn_gate else 0  # Qwen3-Next/3.5's output gate rides on q_proj
    if m.attn_kind != "mla":
        kv = m.n_kv_heads * (m.head_dim + m.v_head_dim)
        return [("attn_qkv_proj", D, qdim + gate + kv), ("attn_out_proj", odim, D)]
    nope = m.head_dim - m.mla_rope_dim
    gemms = [("attn_q_proj", D, qdim + gate)]
    if m.mla_q_rank:
        gemms = [("attn_q_a_proj", D, m.mla_q_rank), ("attn_q_b_proj", m.mla_q_rank, qdim)]
        if gate:
            gemms.append(("attn_gate_proj", D, gate))
    return [
        *gemms,
        ("attn_kv_a_proj", D, m.mla_kv_rank + m.mla_rope_dim),
        ("attn_kv_b_proj", m.mla_kv_rank, m.n_heads * (nope + m.v_head_dim)),
        ("attn_out_proj", odim, D),
    ]


def attention_coefficients(m: ModelSpec) -> tuple[int, int, int]:
    """``(lin, pq, qq)`` of all attention layers: ``new * (lin + pq * prefix + qq * new)``.

    A full layer's token ``i`` of ``new`` attends ``prefix + i`` keys. A sliding-window layer's
    token attends ``swa_window`` keys: exact once the sequence is longer than the window, an
    over-count of at most ``window^2 / 2`` pairs per layer and sequence before (kept so the
    FLOPs stay an additive polynomial)."""
    proj = sum(2 * d_in * d_out for _, d_in, d_out in attention_gemms(m))
    pair = pair_flops(m)
    full = m.n_attn_layers - m.n_swa_layers
    lin = proj * m.n_attn_layers + (pair // 2) * full + pair * m.swa_window * m.n_swa_layers
    return lin, pair * full, (pair // 2) * full


def attention_params(m: ModelSpec) -> int:
    """Weights of one attention layer (projections and its pre-norm)."""
    return sum(d_in * d_out for _, d_in, d_out in attention_gemms(m)) + m.d_model


# ---------------------------------------------------------------------------- recurrent
def ssm_d_inner(m: ModelSpec) -> int:
    """The recurrent layer's inner width (see the module table)."""
    if m.ssm_kind in HEADED_KINDS and m.ssm_expand == 0:
        return m.ssm_n_heads * m.ssm_head_dim
    return m.ssm_expand * m.d_model


def ssm_channels(m: ModelSpec) -> tuple[int, int]:
    """``(state channels, conv channels)`` of one recurrent layer: the recurrent state is
    ``state channels x ssm_state_dim`` elements, the conv state ``conv channels x width``."""
    di, GN = ssm_d_inner(m), m.ssm_n_groups * m.ssm_state_dim
    if m.flop_formula == "paper":
        return m.d_model, di + 2 * GN
    if m.ssm_kind in HEADED_KINDS:
        return m.ssm_n_heads * m.ssm_head_dim, di + 2 * GN
    if m.ssm_kind == "short_conv":
        return 0, di
    return di, di


def ssm_in_dim(m: ModelSpec) -> int:
    """Output width of one recurrent layer's input projection(s)."""
    di, GN, H = ssm_d_inner(m), m.ssm_n_groups * m.ssm_state_dim, m.ssm_n_heads
    return {
        "mamba2": 2 * di + 2 * GN + H,  # z, x, B, C, dt
        "gdn": 2 * GN + 2 * di + 2 * H,  # q, k, v, z; b, a
        "kda": 2 * GN + 3 * di + H,  # q, k, v, forget gate, output gate; beta
        "short_conv": 3 * di,  # B, C, x
        "mamba1": 2 * di,  # x, z
    }[m.ssm_kind]


def scan_flops_per_token(m: ModelSpec) -> int:
    """One token's conv, scan and gating FLOPs in one recurrent layer (no projections).

    Mamba2: chunked SSD ``6 d_inner N``; Mamba1: the selective scan ``9 d_inner N``; GDN and
    KDA: the delta rule per head (decay, ``k^T S``, rank-1 update, ``q S``, the gate:
    ``8 d_inner N``); short conv: its gates only. Each adds its causal conv ``2 K`` per conv
    channel and ``10 d_inner`` of gating, D-skip and gated norm (short conv: ``4 d_inner``)."""
    di, N, K = ssm_d_inner(m), m.ssm_state_dim, m.ssm_conv_kernel
    conv = 2 * K * ssm_channels(m)[1]
    if m.ssm_kind == "short_conv":
        return conv + 4 * di
    scan = {"mamba2": 6, "mamba1": 9, "gdn": 8, "kda": 8}[m.ssm_kind]
    return scan * di * N + conv + 10 * di


def ssm_token_flops(m: ModelSpec) -> int:
    """Exact-mode FLOPs of one recurrent layer for one token."""
    D, di = m.d_model, ssm_d_inner(m)
    extra = 0
    if m.ssm_kind == "mamba1":  # x_proj d_inner -> dt_rank + 2N, dt_proj dt_rank -> d_inner
        R = m.ssm_dt_rank
        extra = 2 * di * (R + 2 * m.ssm_state_dim) + 2 * R * di
    return 2 * D * ssm_in_dim(m) + scan_flops_per_token(m) + extra + 2 * di * D


def ssm_params(m: ModelSpec) -> int:
    """Weights of one recurrent layer: projections, conv weight and bias, per-head/-channel
    vectors, norms."""
    D, N, di, K = m.d_model, m.ssm_state_dim, ssm_d_inner(m), m.ssm_conv_kernel
    conv_ch = ssm_channels(m)[1]
    if m.ssm_kind == "mamba1":
        R = m.ssm_dt_rank
        # in_proj, conv weight+bias, x_proj, dt_proj(+bias), A, D, out_proj, pre-norm
        return (
            D * 2 * di + di * (K + 1) + di * (R + 2 * N) + (R + 1) * di + di * N + di + di * D + D
        )
    # in_proj, conv weight+bias, A/D/dt_bias, gated norm, out_proj, pre-norm
    return D * ssm_in_dim(m) + conv_ch * (K + 1) + 3 * m.ssm_n_heads + di + di * D + D


# ---------------------------------------------------------------------------- feed-forward
def mlp_matrices(m: ModelSpec) -> int:
    """Weight matrices of one (dense or expert) MLP: 3 gated (SwiGLU), 2 plain."""
    return 3 if m.mlp_gated else 2


def moe_width(m: ModelSpec) -> int:
    """The width the routed experts run at: ``moe_latent`` (latent MoE) or ``d_model``."""
    return m.moe_latent or m.d_model


def moe_token_flops(m: ModelSpec) -> int:
    """One MoE layer, one token: router, ``top_k`` experts, shared experts, latent projections."""
    D, mats = m.d_model, mlp_matrices(m)
    per_expert = 2 * mats * moe_width(m) * m.moe_intermediate
    latent = 2 * 2 * D * m.moe_latent  # down to the latent width and back
    shared = 2 * mats * D * m.moe_shared_intermediate
    return 2 * D * m.moe_experts + m.moe_top_k * per_expert + shared + latent


def ffn_flops(m: ModelSpec) -> int:
    """FLOPs of all dense-MLP and MoE layers for one token."""
    dense = 2 * mlp_matrices(m) * m.d_model * m.mlp_intermediate * m.n_mlp_layers
    return dense + moe_token_flops(m) * m.n_moe_layers


def moe_params(m: ModelSpec) -> tuple[int, int]:
    """``(one routed expert's weights, a MoE layer's other weights)``."""
    D, mats = m.d_model, mlp_matrices(m)
    expert = mats * moe_width(m) * m.moe_intermediate
    other = D * m.moe_experts + D + mats * D * m.moe_shared_intermediate + 2 * D * m.moe_latent
    return expert, other


# ---------------------------------------------------------------------------- weights' memory
#: bytes a layer weight takes in a checkpoint's format (``weight_quant``) where that is known:
#: FP8 one byte (its per-block or per-tensor scales negligible), ModelOpt's NVFP4 half a byte
#: plus an FP8 scale per 16 weights
QUANT_WEIGHT_BYTES = {"fp8": 1.0, "nvfp4": 0.5 + 1 / 16}


def weight_bytes(m: ModelSpec) -> float:
    """The weights' bytes as the engines load them: the layers' parameters at the checkpoint's
    format (:data:`QUANT_WEIGHT_BYTES`; others, e.g. MXFP4 on the experts only, at
    ``dtype_bytes``), the embedding and LM head at ``dtype_bytes`` and at least BF16 (the
    quantized checkpoints keep them unquantized; a one-byte ``dtype_bytes`` is an FP8
    checkpoint)."""
    layer = min(QUANT_WEIGHT_BYTES.get(m.weight_quant, m.dtype_bytes), m.dtype_bytes)
    return m.layer_params * layer + m.embedding_params * max(m.dtype_bytes, 2)
