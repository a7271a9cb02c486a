"""Model architecture specs: cache bytes per token / per SSM checkpoint, and prefill FLOPs.

A :class:`ModelSpec` is a frozen description of one model, built from the ``model`` config
group with :meth:`ModelSpec.from_config` (a preset's fields, or ``model=hf model.id=...``: a
Hugging Face ``config.json`` read by :mod:`simlab.model.hf`). Everything the cache and the cost
model ask of it is a precomputed attribute or a one-line polynomial in ``(prefix, new)``, so it
is cheap enough for hot loops (the prefix cache calls :meth:`ModelSpec.prefill_flops` for every
node it touches). Each layer kind's shapes, bytes and FLOPs are in :mod:`simlab.model.layers`.

Layer kinds: ``n_attn_layers`` attention layers (``attn_kind`` ``gqa``: MHA/GQA, optionally
with Qwen's output gate ``attn_gate``; ``mla``: DeepSeek's latent attention), of which
``n_swa_layers`` are sliding-window (``swa_window``); ``n_ssm_layers`` recurrent layers of one
``ssm_kind`` (``mamba1``, ``mamba2``, ``gdn`` = gated delta net, ``kda`` = Kimi delta attention,
``short_conv``); ``n_mlp_layers`` dense MLPs and ``n_moe_layers`` MoE layers (routed experts,
``moe_shared_intermediate`` of shared experts, optionally at a ``moe_latent`` width). A layer of
the config counts once per part it has (Falcon-H1's layer is one attention, one SSM, one MLP).

Bytes (precomputed ``int`` attributes)
  * ``kv_bytes_per_token``: what one token writes in *all* attention layers: K and V of every
    KV head (``n_kv_heads * (head_dim + v_head_dim) * kv_dtype_bytes`` per layer), or MLA's
    latent ``(mla_kv_rank + mla_rope_dim) * kv_dtype_bytes`` on each of its ``mla_kv_copies``
    GPUs (``kv_dtype_bytes`` 0: ``dtype_bytes``). Sliding-window layers are counted for every
    token (a cached prefix keeps their blocks until evicted; a running request needs only its
    last ``swa_window`` of them).
  * ``ssm_state_bytes``: one SSM checkpoint = recurrent state + conv state of *all* SSM layers:
    per layer ``ssm_state_channels * N * ssm_state_dtype_bytes + ssm_conv_channels *
    ssm_conv_state_width * dtype_bytes``. The hand-written presets count the conv state over
    the full kernel width (``ssm_conv_state_width`` 0 = the kernel, as ``mamba_ssm``/Hugging
    Face caches keep it and as the Marconi reference code counts it); ``model=hf`` uses vLLM's
    ``kernel - 1`` columns and its state dtypes, and says which in ``state_dtypes``.
    ``ssm_state_dtype_bytes`` defaults to 2 (FP16/BF16, as in the Marconi paper).

FLOPs (``float``; prefill of ``new`` tokens after an already-cached prefix of ``prefix``)
  ``attention_flops + ssm_flops + mlp_flops == prefill_flops``, each summed over all layers of
  that type. Embeddings, norms, residual adds, RoPE, softmax and the LM head are *not* included
  (:meth:`ModelSpec.lm_head_flops` gives the head separately: prefill needs logits for the last
  token only). Every count is exactly additive:
  ``prefill_flops(p, q) == prefill_flops(0, p + q) - prefill_flops(0, p)``, which is what the
  FLOP-efficiency of a radix node ("savings beyond its parent") needs.

  ``flop_formula: paper`` -- the Marconi paper's per-layer full-sequence formulas (``D`` =
  d_model, ``N`` = state dim): Attention ``8LD^2 + 4L^2D``, MLP ``16LD^2``,
  SSM ``12LD^2 + 16LDN + 10LD``; the cost of ``new`` after ``prefix`` is ``F(p+q) - F(p)``.
  The paper model is MHA with ``n_heads * head_dim == d_model``, a non-gated ``4D`` MLP and a
  Mamba2 SSM (this is validated), so its KV bytes are ``2 * D * dtype_bytes`` per attention
  layer, and its SSM state is the reference code's ``get_mamba_state_size``:
  ``D*N + (expand*D + 2N)*conv`` elements (``ssm_state_channels = D``).

  ``flop_formula: exact`` -- matmul FLOPs counted as ``2*m*n*k`` (:mod:`simlab.model.layers`):
    * Attention: the projections, plus scores and AV over the keys a query attends,
      ``2 * n_heads * (head_dim + v_head_dim)`` per (query, key) pair: ``prefix + i`` keys for
      token ``i`` of ``new`` in a full layer, ``swa_window`` in a sliding-window layer.
    * Mamba2 per token: in_proj ``D -> 2*d_inner + 2*G*N + H``; causal conv (``2*kernel`` per
      conv channel); SSD scan ``6*d_inner*N``; gating, D-skip and gated RMSNorm ``10*d_inner``;
      out_proj ``d_inner -> D``. Why ``6*d_inner*N``: the chunked SSD algorithm costs
      ``4*d_inner*N`` (chunk states ``B^T x`` and state-to-output ``C h``) plus an intra-chunk
      ``2*Q*(d_inner + G*N)``, i.e. about ``6*d_inner*N`` for chunk ``Q ~ N``; the recurrent
      decode step is ~5-6 ``d_inner*N`` too. One per-token count keeps the FLOPs additive; the
      scan is ~3% of a Mamba2 layer's FLOPs, so the choice of ``Q`` changes totals by ~1%.
    * Mamba1 per token: in_proj ``D -> 2*d_inner``; conv; x_proj ``d_inner -> dt_rank + 2N``;
      dt_proj ``dt_rank -> d_inner``; selective scan ``9*d_inner*N`` (the Mamba paper's scan
      count); gating ``10*d_inner``; out_proj. GDN and KDA: their projections, conv, a delta
      rule of ``8*d_inner*N``, gating and out_proj. SSM FLOPs do not depend on the prefix.
    * MLP: ``2*3*D*I`` per token if gated (SwiGLU), ``2*2*D*I`` if not (squared-ReLU, GELU).
      MoE: router ``2*D*E`` plus ``top_k`` experts' MLP plus the shared experts' MLP.

Config values of ``0`` for ``n_kv_heads``, ``head_dim``, ``v_head_dim``, ``mlp_intermediate``,
``moe_intermediate``, ``ssm_n_heads``, ``ssm_dt_rank`` and ``ssm_conv_state_width`` mean
"derive" (``n_heads``, ``d_model // n_heads``, ``head_dim``, ``4 * d_model``,
``mlp_intermediate``, ``d_inner // ssm_head_dim``, ``ceil(d_model / 16)``, the kernel); they are
resolved once, at construction. ``ssm_expand`` 0 (Mamba2, GDN, KDA) makes ``d_inner`` the
heads times the head dim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from simlab.model import layers

__all__ = ["ATTN_KINDS", "FLOP_FORMULAS", "SSM_KINDS", "ModelSpec"]

FLOP_FORMULAS = ("paper", "exact")
SSM_KINDS = ("mamba1", "mamba2", "gdn", "kda", "short_conv")
ATTN_KINDS = ("gqa", "mla")

_STR_FIELDS: tuple[str, ...] = ("name", "architecture", "ssm_kind", "flop_formula", "attn_kind")
_STR_FIELDS += ("state_dtypes", "config_ssm_dtype", "source", "weight_quant")
# Fields that may be 0 in a config, meaning "derive from the others".
_AUTO_FIELDS = frozenset(
    {
        "n_kv_heads",
        "head_dim",
        "v_head_dim",
        "mlp_intermediate",
        "moe_intermediate",
        "ssm_n_heads",
        "ssm_dt_rank",
        "ssm_conv_state_width",
        "kv_dtype_bytes",
    }
)


@dataclass(frozen=True)
class ModelSpec:
    """One model's architecture, with precomputed byte sizes and FLOP coefficients.

    Invariants: all FLOP methods are exact polynomials in ``(prefix, new)`` (additive, see the
    module docstring); ``kv_bytes_per_token`` and ``ssm_state_bytes`` are exact ints; a spec
    always has at least one attention or SSM layer. ``dataclasses.replace`` re-validates and
    re-derives, but "0 = derive" fields already hold their resolved values.
    """

    d_model: int
    n_attn_layers: int
    n_ssm_layers: int
    name: str = "model"
    #: the Hugging Face ``architectures`` entry the engines dispatch on (their per-model
    #: defaults, e.g. vLLM's FP32 SSM state for ``NemotronHForCausalLM``); "" for none
    architecture: str = ""
    n_mlp_layers: int = 0
    n_moe_layers: int = 0
    # attention (``n_swa_layers`` of the ``n_attn_layers`` are sliding-window)
    n_heads: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    attn_kind: Literal["gqa", "mla"] = "gqa"
    attn_gate: bool = False
    mla_q_rank: int = 0
    mla_kv_rank: int = 0
    mla_rope_dim: int = 0
    mla_kv_copies: int = 1  # the replica's copies of the latent (on_tp: each GPU keeps it whole)
    n_swa_layers: int = 0
    swa_window: int = 0
    # dense MLP / MoE
    mlp_intermediate: int = 0
    mlp_gated: bool = False
    moe_experts: int = 0
    moe_top_k: int = 0
    moe_intermediate: int = 0
    moe_shared_intermediate: int = 0
    moe_latent: int = 0
    # SSM (recurrent layers: see simlab.model.layers for each kind's shapes)
    ssm_kind: Literal["mamba1", "mamba2", "gdn", "kda", "short_conv"] = "mamba2"
    ssm_state_dim: int = 128
    ssm_expand: int = 2
    ssm_conv_kernel: int = 4
    ssm_n_groups: int = 1
    ssm_head_dim: int = 64
    ssm_n_heads: int = 0
    ssm_dt_rank: int = 0
    ssm_conv_state_width: int = 0
    # numerics and head; state_dtypes says which dtype each state is kept in, and why
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 0  # the KV cache's (the engines' --kv-cache-dtype); 0: dtype_bytes
    ssm_state_dtype_bytes: int = 2
    vocab_size: int = 0
    tie_embeddings: bool = False
    flop_formula: Literal["paper", "exact"] = "exact"
    state_dtypes: str = ""
    weight_quant: str = ""  # the checkpoint's weight format (its quantization_config; "": none)
    #: the recurrent state's dtype the config.json names (``mamba_ssm_cache_dtype`` /
    #: ``mamba_ssm_dtype``; "" for none): the engines follow it over their own defaults
    config_ssm_dtype: str = ""
    source: str = ""  # model=hf: the config.json it was read from

    # ---- derived at construction (not config fields) ----
    is_hybrid: bool = field(default=False, init=False, repr=False, compare=False)
    is_transformer: bool = field(default=False, init=False, repr=False, compare=False)
    ssm_d_inner: int = field(default=0, init=False, repr=False, compare=False)
    ssm_state_channels: int = field(default=0, init=False, repr=False, compare=False)
    ssm_conv_channels: int = field(default=0, init=False, repr=False, compare=False)
    kv_bytes_per_token_per_layer: int = field(default=0, init=False, repr=False, compare=False)
    kv_bytes_per_token: int = field(default=0, init=False, repr=False, compare=False)
    ssm_state_bytes_per_layer: int = field(default=0, init=False, repr=False, compare=False)
    ssm_state_bytes: int = field(default=0, init=False, repr=False, compare=False)
    layer_params: int = field(default=0, init=False, repr=False, compare=False)
    active_layer_params: int = field(default=0, init=False, repr=False, compare=False)
    embedding_params: int = field(default=0, init=False, repr=False, compare=False)
    # FLOPs = new * (_lin + _pq * prefix + _qq * new); attention holds the only quadratic terms.
    _attn_lin: float = field(default=0.0, init=False, repr=False, compare=False)
    _attn_pq: float = field(default=0.0, init=False, repr=False, compare=False)
    _attn_qq: float = field(default=0.0, init=False, repr=False, compare=False)
    _ssm_lin: float = field(default=0.0, init=False, repr=False, compare=False)
    _mlp_lin: float = field(default=0.0, init=False, repr=False, compare=False)
    _lin: float = field(default=0.0, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ModelSpec:
        """Build from a mapping (plain dict or OmegaConf ``DictConfig``); keys are field names.

        Keys starting with ``_`` (e.g. ``_target_``) are ignored; unknown keys, missing required
        keys and bad values raise ``ValueError`` naming the field.
        """
        if not isinstance(cfg, Mapping):
            raise ValueError(f"model config must be a mapping, got {type(cfg).__name__}")
        if "id" in cfg:  # model=hf: a Hugging Face config.json (simlab.model.hf imports us)
            from simlab.model.hf import spec_from_config

            return spec_from_config(cfg)
        known = {f.name for f in fields(cls) if f.init}
        values: dict[str, Any] = {}
        unknown: list[str] = []
        for key in cfg:
            k = str(key)
            if k.startswith("_"):
                continue
            if k in known:
                values[k] = cfg[key]
            else:
                unknown.append(k)
        if unknown:
            raise ValueError(f"model: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        for required in ("d_model", "n_attn_layers", "n_ssm_layers"):
            if required not in values:
                raise ValueError(f"model.{required} is required")
        return cls(**values)

    def __post_init__(self) -> None:
        self._check_types()
        self._resolve_auto()
        self._validate()
        self._derive()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_types(self) -> None:
        for f in fields(self):
            if not f.init:
                continue
            v = getattr(self, f.name)
            if f.name in ("mlp_gated", "tie_embeddings", "attn_gate"):
                if not isinstance(v, bool):
                    raise ValueError(f"model.{f.name} must be true/false, got {v!r}")
            elif f.name in _STR_FIELDS:
                if not isinstance(v, str):
                    raise ValueError(f"model.{f.name} must be a string, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise ValueError(f"model.{f.name} must be an integer, got {v!r}")
            else:
                self._set(f.name, int(v))
        if self.flop_formula not in FLOP_FORMULAS:
            raise ValueError(
                f"model.flop_formula must be one of {FLOP_FORMULAS}, got {self.flop_formula!r}"
            )
        if self.ssm_kind not in SSM_KINDS:
            raise ValueError(f"model.ssm_kind must be one of {SSM_KINDS}, got {self.ssm_kind!r}")
        if self.attn_kind not in ATTN_KINDS:
            raise ValueError(f"model.attn_kind must be one of {ATTN_KINDS}, got {self.attn_kind!r}")

    def _resolve_auto(self) -> None:
        for name in _AUTO_FIELDS:
            if getattr(self, name) < 0:
                raise ValueError(
                    f"model.{name} must be >= 0 (0 = derive), got {getattr(self, name)}"
                )
        if self.n_kv_heads == 0:
            self._set("n_kv_heads", self.n_heads)
        if self.head_dim == 0 and self.n_heads > 0:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"model.head_dim: set it explicitly, n_heads ({self.n_heads}) does not "
                    f"divide d_model ({self.d_model})"
                )
            self._set("head_dim", self.d_model // self.n_heads)
        if self.mlp_intermediate == 0:
            self._set("mlp_intermediate", 4 * self.d_model)
        if self.moe_intermediate == 0:
            self._set("moe_intermediate", self.mlp_intermediate)
        d_inner = self.ssm_expand * self.d_model
        if self.ssm_n_heads == 0 and self.ssm_head_dim > 0:
            self._set("ssm_n_heads", d_inner // self.ssm_head_dim)
        self._resolve_widths()

    def _resolve_widths(self) -> None:
        if self.kv_dtype_bytes == 0:
            self._set("kv_dtype_bytes", self.dtype_bytes)
        elif self.kv_dtype_bytes != self.dtype_bytes and self.state_dtypes:
            note = f"; KV cache {self.kv_dtype_bytes} bytes (model.kv_dtype_bytes)"
            self._set("state_dtypes", self.state_dtypes + note)
        if self.v_head_dim == 0:
            self._set("v_head_dim", self.head_dim)
        if self.ssm_conv_state_width == 0:
            self._set("ssm_conv_state_width", self.ssm_conv_kernel)
        if self.ssm_dt_rank == 0:
            self._set("ssm_dt_rank", math.ceil(self.d_model / 16))

    def _positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)}")

    def _validate(self) -> None:
        self._positive("d_model", "dtype_bytes", "ssm_state_dtype_bytes")
        for name in ("n_attn_layers", "n_ssm_layers", "n_mlp_layers", "n_moe_layers", "vocab_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.{name} must be >= 0, got {getattr(self, name)}")
        if self.n_attn_layers + self.n_ssm_layers == 0:
            raise ValueError("model.n_attn_layers + model.n_ssm_layers must be >= 1")
        if self.n_attn_layers:
            self._validate_attention()
        if self.n_ssm_layers:
            self._validate_ssm()
        if self.n_mlp_layers:
            self._positive("mlp_intermediate")
        if self.n_moe_layers:
            self._positive("moe_experts", "moe_top_k", "moe_intermediate")
            if self.moe_top_k > self.moe_experts:
                raise ValueError(
                    f"model.moe_top_k ({self.moe_top_k}) must be <= moe_experts ({self.moe_experts})"
                )
        if self.flop_formula == "paper":
            self._validate_paper()

    def _validate_attention(self) -> None:
        self._positive("n_heads", "n_kv_heads", "head_dim")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})"
            )
        if not 0 <= self.n_swa_layers <= self.n_attn_layers:
            raise ValueError(
                f"model.n_swa_layers ({self.n_swa_layers}) must be in 0..n_attn_layers "
                f"({self.n_attn_layers})"
            )
        if self.n_swa_layers:
            self._positive("swa_window")
        if self.attn_kind == "mla":
            self._positive("mla_kv_rank", "mla_rope_dim", "mla_kv_copies")
            if self.mla_rope_dim >= self.head_dim:
                raise ValueError(
                    f"model.mla_rope_dim ({self.mla_rope_dim}) must be < head_dim "
                    f"({self.head_dim} = qk_nope_head_dim + qk_rope_head_dim)"
                )

    def _validate_ssm(self) -> None:
        self._positive("ssm_state_dim", "ssm_conv_kernel", "ssm_n_groups")
        if not 0 < self.ssm_conv_state_width <= self.ssm_conv_kernel:
            raise ValueError(
                f"model.ssm_conv_state_width ({self.ssm_conv_state_width}) must be in "
                f"1..ssm_conv_kernel ({self.ssm_conv_kernel})"
            )
        if self.ssm_kind in ("mamba1", "short_conv"):
            self._positive("ssm_expand", *(("ssm_dt_rank",) if self.ssm_kind == "mamba1" else ()))
            return
        self._positive("ssm_head_dim", "ssm_n_heads")
        d_inner = self.ssm_expand * self.d_model
        if self.ssm_expand < 0 or (d_inner and self.ssm_n_heads * self.ssm_head_dim != d_inner):
            raise ValueError(
                f"model.ssm_n_heads * ssm_head_dim ({self.ssm_n_heads} * {self.ssm_head_dim}) "
                f"must equal ssm_expand * d_model ({d_inner}) for {self.ssm_kind} "
                "(ssm_expand 0: d_inner is ssm_n_heads * ssm_head_dim)"
            )
        if self.ssm_n_heads % self.ssm_n_groups:
            raise ValueError(
                f"model.ssm_n_groups ({self.ssm_n_groups}) must divide ssm_n_heads ({self.ssm_n_heads})"
            )

    def _validate_paper(self) -> None:
        why = "flop_formula 'paper' models"
        if self.n_moe_layers:
            raise ValueError(f"model.n_moe_layers must be 0: {why} have no MoE")
        if self.attn_kind != "gqa" or self.n_swa_layers or self.attn_gate:
            raise ValueError(f"model.attn_kind/n_swa_layers/attn_gate: {why} plain full attention")
        if self.n_ssm_layers and self.ssm_kind != "mamba2":
            raise ValueError(f"model.ssm_kind must be mamba2: {why} use the Mamba2 SSM formula")
        if self.n_attn_layers and (
            self.n_kv_heads != self.n_heads or self.n_heads * self.head_dim != self.d_model
        ):
            raise ValueError(
                f"model.n_kv_heads/head_dim: {why} MHA with n_kv_heads == n_heads and "
                f"n_heads * head_dim == d_model (use flop_formula 'exact' for GQA)"
            )
        if self.n_mlp_layers and (self.mlp_gated or self.mlp_intermediate != 4 * self.d_model):
            raise ValueError(
                f"model.mlp_intermediate/mlp_gated: {why} a non-gated MLP with "
                f"mlp_intermediate == 4 * d_model (16LD^2)"
            )

    # ------------------------------------------------------------------ derived numbers
    def _derive(self) -> None:
        dtype = self.dtype_bytes
        state_ch, conv_ch = layers.ssm_channels(self)
        width = self.ssm_conv_state_width or self.ssm_conv_kernel
        kv = self.kv_dtype_bytes
        kv_layer = layers.kv_elements_per_token(self) * kv if self.n_attn_layers else 0
        state_layer = (
            state_ch * self.ssm_state_dim * self.ssm_state_dtype_bytes + conv_ch * width * dtype
            if self.n_ssm_layers
            else 0
        )
        self._set("is_hybrid", self.n_ssm_layers > 0)
        self._set("is_transformer", self.n_ssm_layers == 0)
        self._set("ssm_d_inner", layers.ssm_d_inner(self))
        self._set("ssm_state_channels", state_ch)
        self._set("ssm_conv_channels", conv_ch)
        self._set("kv_bytes_per_token_per_layer", kv_layer)
        self._set("kv_bytes_per_token", kv_layer * self.n_attn_layers)
        self._set("ssm_state_bytes_per_layer", state_layer)
        self._set("ssm_state_bytes", state_layer * self.n_ssm_layers)
        self._derive_flops()
        self._derive_params()

    def _derive_flops(self) -> None:
        D, N = self.d_model, self.ssm_state_dim
        na, ns = self.n_attn_layers, self.n_ssm_layers
        if self.flop_formula == "paper":
            # F(p+q) - F(p) for 8LD^2 + 4L^2D  ->  q * (8D^2 + 8D*p + 4D*q)
            attn = (8 * D * D * na, 8 * D * na, 4 * D * na)
            ssm = 12 * D * D + 16 * D * N + 10 * D
            mlp = 16 * D * D * self.n_mlp_layers
        else:
            attn = layers.attention_coefficients(self) if na else (0, 0, 0)
            ssm = layers.ssm_token_flops(self) if ns else 0
            mlp = layers.ffn_flops(self)
        self._set("_attn_lin", float(attn[0]))
        self._set("_attn_pq", float(attn[1]))
        self._set("_attn_qq", float(attn[2]))
        self._set("_ssm_lin", float(ssm * ns))
        self._set("_mlp_lin", float(mlp))
        self._set("_lin", float(attn[0] + ssm * ns + mlp))

    def _derive_params(self) -> None:
        """Weight counts (norm vectors included, biases of projections excluded)."""
        D = self.d_model
        attn = layers.attention_params(self) if self.n_attn_layers else 0
        ssm = layers.ssm_params(self) if self.n_ssm_layers else 0
        mlp = layers.mlp_matrices(self) * D * self.mlp_intermediate + D
        expert, moe_other = layers.moe_params(self)
        common = (
            attn * self.n_attn_layers
            + ssm * self.n_ssm_layers
            + mlp * self.n_mlp_layers
            + moe_other * self.n_moe_layers
            + D  # final norm
        )
        self._set("layer_params", common + expert * self.moe_experts * self.n_moe_layers)
        self._set("active_layer_params", common + expert * self.moe_top_k * self.n_moe_layers)
        self._set("embedding_params", self.vocab_size * D * (1 if self.tie_embeddings else 2))

    def config_fields(self) -> dict[str, Any]:
        """The config fields, resolved (what ``from_config`` of them rebuilds)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    # ------------------------------------------------------------------ hot-loop queries
    def attention_flops(self, prefix: int, new: int) -> float:
        """FLOPs of all attention layers to prefill ``new`` tokens after ``prefix`` cached ones."""
        return new * (self._attn_lin + self._attn_pq * prefix + self._attn_qq * new)

    def ssm_flops(self, prefix: int, new: int) -> float:
        """FLOPs of all SSM layers for ``new`` tokens (independent of ``prefix``)."""
        return new * self._ssm_lin

    def mlp_flops(self, prefix: int, new: int) -> float:
        """FLOPs of all dense-MLP and MoE layers for ``new`` tokens (independent of ``prefix``)."""
        return new * self._mlp_lin

    def prefill_flops(self, prefix: int, new: int) -> float:
        """Attention + SSM + MLP FLOPs of prefilling ``new`` tokens after ``prefix`` (no LM head)."""
        return new * (self._lin + self._attn_pq * prefix + self._attn_qq * new)

    @property
    def prefill_coefficients(self) -> tuple[float, float, float]:
        """``(lin, pq, qq)`` of :meth:`prefill_flops`: ``new * (lin + pq * prefix + qq * new)``."""
        return self._lin, self._attn_pq, self._attn_qq

    def prefill_flops_array(
        self, prefix: npt.ArrayLike, new: npt.ArrayLike
    ) -> npt.NDArray[np.float64]:
        """Vectorised :meth:`prefill_flops` (float64, broadcasting)."""
        p = np.asarray(prefix, dtype=np.float64)
        q = np.asarray(new, dtype=np.float64)
        return q * (self._lin + self._attn_pq * p + self._attn_qq * q)

    def decode_flops(self, context: int) -> float:
        """FLOPs of one decode step with ``context`` tokens already in the cache (no LM head)."""
        return self._lin + self._attn_pq * context + self._attn_qq

    def lm_head_flops(self, tokens: int = 1) -> float:
        """FLOPs of the LM head for ``tokens`` positions (0 if ``vocab_size`` is 0)."""
        return 2.0 * self.d_model * self.vocab_size * tokens

    def cache_bytes(self, kv_tokens: int, n_checkpoints: int = 0) -> int:
        """Bytes of ``kv_tokens`` tokens' KV plus ``n_checkpoints`` SSM checkpoints."""
        return kv_tokens * self.kv_bytes_per_token + n_checkpoints * self.ssm_state_bytes

    @property
    def total_params(self) -> int:
        """All weights: layers (every expert) plus embeddings and LM head."""
        return self.layer_params + self.embedding_params
