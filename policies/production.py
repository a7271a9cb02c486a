"""The production engines' own prefix caches: SGLang 0.5.23's radix tree, vLLM 0.33.0's block pool.

The paper's baselines (``sglang_plus``, ``vllm_plus``) stay as the paper defines them; these
follow the engines' code (``crosscheck/README.md`` drives the real cache managers and
``tests/fixtures/crosscheck`` holds their per-request hits). Rules, each with its source:

Both engines
    * Committed length: a request leaves ``input + output - 1`` tokens; the last sampled token
      is never fed back (SGLang ``kv_committed_len``, vLLM's last decode step), so its KV and
      state are never computed (:class:`simlab.cache.contract.Keys` ``committed``).
    * The running request allocates everything past its hit (``held_from``): eviction makes
      room for all of it, duplicates of cached tokens included (SGLang frees them at insert,
      vLLM keeps the duplicate block).

SGLang (``mem_cache/radix_cache.py``, ``unified_cache``)
    * Node boundaries: the match (limit ``len(input) - 1``) splits the node it stops inside
      when the request starts (``splits_at_match``); the prefill publish
      (``checkpoint_kv_cache``) puts one at the prompt end, the finish one at the committed end
      (``cuts``). Eviction therefore frees a request's output before its prompt.
    * Recency: a match or insert walk refreshes every node it passes, the one it stops inside
      included, before splitting it (:class:`policies.engine_lru.RadixLRU`); on a hybrid the
      match refreshes the path up to its hit only. Eviction: LRU over leaves.
    * The running request's allocation evicts with only its hit locked: KV it matched past its
      hit may go (``held_from``, :meth:`simlab.cache.prefix.PrefixCache.insert`).
    * Hybrid, ``no_buffer``: Mamba states are published at the prompt end (after prefill) and
      at the committed end, never at branch points; a hit is the deepest matched node holding a
      state within ``len(input) - 1`` (the cache's hybrid hit rule).

vLLM (``v1/core/block_pool.py``, ``kv_cache_manager.py``)
    * Blocks of ``block_size`` tokens identified by the hash chain; only full blocks are cached
      and shared, a branch inside a block duplicates it, memory is counted in whole blocks
      (:class:`simlab.cache.contract.Keys` ``block_size``: one tree node per block).
    * A hit is the longest chain of cached full blocks within ``len(input) - 1`` tokens.
    * Eviction pops one block at a time from an LRU free queue to which a finished request's
      blocks return tail first (:class:`policies.engine_lru.BlockLRU`: leaves only, so a
      request's deepest block goes first); its partial tail block is held while it runs and
      freed uncached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from simlab.cache.contract import Admission, AdmissionPolicy, Keys, Tokens, Tracking
from simlab.cache.engine_rules import (
    DTYPE_BYTES,
    GDN_FLASHINFER_ALIGNMENT,
    SGLANG_CONV_DTYPE,
    SGLANG_SSM_DTYPE,
    VLLM_SSM_DTYPE,
    check_bool,
    check_capability,
    check_grid,
    check_grid_options,
    check_ssm_dtype,
    gdn_prefill_items,
    mamba_page_bytes,
    model_dtype,
    positive_int,
    states_kept,
    vllm_gdn_prefill,
    vllm_hybrid_block_size,
    with_ssm_dtype,
)
from simlab.cache.state_pool import check_ratio, sglang_pool

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup
    from simlab.cache.state_pool import StatePool
    from simlab.model.spec import ModelSpec

#: SGLang's Mamba radix-cache strategies (``--mamba-radix-cache-strategy``).
SGLANG_MAMBA = ("no_buffer", "extra_buffer")
#: vLLM's ``mamba_cache_mode`` values per modelled engine version.
VLLM_MAMBA_MODES = {"0.33.0": ("align", "none")}


@dataclass
class SGLang(AdmissionPolicy):
    """SGLang's radix cache (see the module docstring); ``mamba``: the hybrid strategy.

    ``extra_buffer`` (SGLang's choice for Nemotron-H under its default overlap scheduler;
    checked request for request against the engine's own tracking code,
    ``crosscheck/sglang_mamba.py``, and its scheduler, ``crosscheck/sglang_concurrent.py``):
    a prefill extend of ``e >= checkpoint_grid`` tokens from ``h`` tracks one state, at ``h +
    floor(e / grid) * grid``, or at the branch point ``floor(kv_match / grid) * grid`` when that
    lies inside the extend on the same grid (``schedule_batch.py``), and the prefill publishes
    it (each chunk of a chunked prompt its own); decode-only steps track one every
    ``lcm(grid, mamba_track_interval)`` tokens and the finish publishes the last one, or
    nothing (``components/mamba.py`` ``_select_finished_checkpoint``). The plan places them for
    one whole-prompt extend and undisturbed decoding (:class:`simlab.cache.contract.Tracking`); a timed
    engine replaces them as its chunks and steps run. KV is published only up to a published
    state, and a running request holds its Mamba slot and its track slots: three by default,
    two with ``tracking_slots=1`` (:attr:`running_state_slots`).
    """

    splits_at_match = True
    mamba: str = "no_buffer"
    #: ``--page-size`` in ids when the tree is keyed by pages (set from ``cache.page_size`` by
    #: :meth:`paged`; 1: by token)
    kv_page: int = 1
    checkpoint_grid: Tokens = 256  # lcm(max(mamba chunk size, page), page)
    mamba_track_interval: Tokens = 256
    tracking_slots: int = 2  # extra_buffer's track slots (held; the cap): 2 with overlap
    #: ``mamba_ssm_dtype`` (SGLang's config field; ``auto``: SGLang's default, float32)
    mamba_ssm_dtype: str = "auto"
    #: ``--mamba-full-memory-ratio``: the Mamba pool's share without ``cache.ssm_gb`` (None:
    #: SGLang's default, 0.9; :mod:`simlab.cache.state_pool`)
    mamba_full_memory_ratio: float | None = None

    def __post_init__(self) -> None:
        check_ssm_dtype(self.mamba_ssm_dtype, "policy.mamba_ssm_dtype")
        check_ratio(self.mamba_full_memory_ratio)
        if self.mamba not in SGLANG_MAMBA:
            raise ValueError(f"policy.mamba must be one of {SGLANG_MAMBA}, got {self.mamba!r}")
        positive_int(self.checkpoint_grid, "policy.admission.checkpoint_grid")
        positive_int(self.mamba_track_interval, "policy.admission.mamba_track_interval")
        if isinstance(self.tracking_slots, bool) or self.tracking_slots not in (1, 2):
            raise ValueError(
                f"policy.admission.tracking_slots must be 1 or 2, got {self.tracking_slots!r}"
            )

    @property
    def keys(self) -> Keys:
        if self.kv_page > 1:
            return Keys(self.kv_page, committed=True, radix=True)
        return Keys(committed=True)

    def paged(self, page: int, model: ModelSpec) -> SGLang:
        """A Transformer's tree on ``page``-id pages is keyed by pages (``RadixKey.page_aligned``
        and ``child_key``: a match, an insertion and a split go page by page; only full pages
        are cached; a request's partial last page is its own). Hybrids keep token keys."""
        if page <= 1 or model.is_hybrid:
            return self
        return replace(self, kv_page=page)

    @property
    def allocates_pages(self) -> bool:
        return self.kv_page > 1

    @property
    def running_state_slots(self) -> int:
        """The request's Mamba slot, and with ``extra_buffer`` its ping-pong track slots
        (``HybridReqToTokenPool.alloc``, ``mamba_ping_pong_track_buffer``): as many as its
        tracking slots (``get_mamba_tracking_slots``: 2 under the overlap scheduler, 1 with
        ``--disable-overlap-schedule``; ``tracking_slots``)."""
        return 1 if self.mamba == "no_buffer" else 1 + self.tracking_slots

    @property
    def slots_per_running_request(self) -> int:
        """SGLang's running cap divides the Mamba slots by 3, plus with ``extra_buffer`` its
        tracking slots (``resolve_max_num_reqs``; ``tracking_slots``)."""
        return 3 if self.mamba == "no_buffer" else 3 + self.tracking_slots

    def ssm_dtype(self, model: ModelSpec) -> str:
        """The SSM state's dtype SGLang keeps for ``model``: the setting, else the config's,
        else ``SGLANG_SSM_DTYPE``."""
        if self.mamba_ssm_dtype != "auto":
            return self.mamba_ssm_dtype
        return model.config_ssm_dtype or SGLANG_SSM_DTYPE

    def engine_model(self, model: ModelSpec) -> ModelSpec:
        return with_ssm_dtype(model, self.ssm_dtype(model))

    def state_bytes(self, model: ModelSpec) -> int:
        """A request's states as SGLang sizes them (``mamba_cache_per_req``)."""
        return mamba_page_bytes(model, DTYPE_BYTES[SGLANG_CONV_DTYPE]) * model.n_ssm_layers

    def state_pool(self, model: ModelSpec, capacity_bytes: float) -> StatePool:
        """SGLang's Mamba pool from its memory split (:mod:`simlab.cache.state_pool`)."""
        per_req, ratio = self.state_bytes(model), self.mamba_full_memory_ratio
        return sglang_pool(capacity_bytes, per_req, model.ssm_state_bytes, ratio)

    def geometry(self, model: ModelSpec, unit: int, pool: StatePool | None) -> dict[str, Any]:
        """SGLang's hybrid layout: strategy, page, state dtypes and bytes, the Mamba pool."""
        if not model.is_hybrid:
            return {"engine": "sglang 0.5.23", "page_size": self.kv_page * unit, "state_bytes": 0}
        defaults = {
            "mamba_ssm_dtype": self.dtype_source(model),
            "mamba_conv_dtype": SGLANG_CONV_DTYPE,
        }
        grid = {
            "checkpoint_grid": self.checkpoint_grid,
            "track_interval": self.mamba_track_interval,
        }
        return {
            "engine": "sglang 0.5.23",
            "mamba_radix_cache_strategy": self.mamba,
            "page_size": self.kv_page * unit,
            "ssm_state_dtype": self.ssm_dtype(model),
            "conv_state_dtype": SGLANG_CONV_DTYPE,
            "state_bytes": self.state_bytes(model),
            "simlab_state_bytes": model.ssm_state_bytes,
            "mamba_pool": {"shared_with_kv": True} if pool is None else pool.summary,
            "running_state_slots": self.running_state_slots,
            "defaults": defaults | ({} if pool is None else pool.defaults),
        } | (grid if self.mamba == "extra_buffer" else {})

    def dtype_source(self, model: ModelSpec) -> str:
        """The SSM dtype and where it comes from."""
        if self.mamba_ssm_dtype != "auto":
            return f"{self.mamba_ssm_dtype} (policy.mamba_ssm_dtype)"
        if model.config_ssm_dtype:
            return f"{model.config_ssm_dtype} (the config's)"
        return f"{SGLANG_SSM_DTYPE} (SGLang 0.5.23's default: mamba2_state_dtype)"

    def plan(self, lookup: Lookup, input_len: int, seq_len: int) -> Admission:
        tracking = None if self.mamba == "no_buffer" else self._tracking(lookup, input_len)
        if tracking is None:
            states = sorted({input_len, seq_len})
        else:
            tracked = (tracking.extend(lookup.hit, input_len), tracking.decode(input_len, seq_len))
            states = [s for s in tracked if s is not None]
        return Admission(
            ckpts=states,
            end=seq_len,
            cuts=(input_len, seq_len) if tracking is None else (),
            held_from=lookup.hit,
            publishes_prompt=True,
            chunk_states=tracking is None,
            tracking=tracking,
            spare_page=self.kv_page > 1,
        )

    def _tracking(self, lookup: Lookup, input_len: int) -> Tracking:
        """``extra_buffer``'s tracking: the branch point is where the input's KV match stops,
        on the grid (``mamba_branching_seqlen``)."""
        grid = self.checkpoint_grid
        branch = (min(lookup.matched, input_len - 1) // grid) * grid
        return Tracking(grid, math.lcm(grid, self.mamba_track_interval), branch)


@dataclass
class BlockPool(AdmissionPolicy):
    """A paged KV pool keyed by blocks: hash-chained full blocks, one node per block, whole
    blocks counted; for a hybrid, a state after every block. With ``committed`` false (input +
    output cached) and a clairvoyant eviction it is the block-trie Belady bound
    (``policy=clairvoyant_blocks``)."""

    block_size: Tokens = 16
    committed: bool = False
    whole_last_id: bool = False  # hash-id traces: :class:`simlab.cache.contract.Keys`
    kind = "blocks"

    def __post_init__(self) -> None:
        positive_int(self.block_size, "policy.block_size")
        if not isinstance(self.whole_last_id, bool):
            raise ValueError(
                f"policy.admission.whole_last_id must be true or false, got {self.whole_last_id!r}"
            )

    @property
    def keys(self) -> Keys:
        return Keys(self.block_size, self.committed, self.whole_last_id)

    def plan(self, lookup: Lookup, input_len: int, seq_len: int) -> Admission:
        return Admission(ckpts=list(range(1, seq_len + 1)), end=seq_len, held_from=lookup.hit)


@dataclass
class VLLM(BlockPool):
    """vLLM's block prefix cache (see the module docstring).

    Hybrids, ``mamba_cache_mode: align`` (0.33.0's default for them, its default
    ``prefix_cache_retention_interval`` 0): the block size is raised to hold a Mamba state
    (:func:`vllm_hybrid_block_size`); a request caches one state, where its prefill stops on
    the last block boundary below the prompt end, ``floor((L - 1) / B)`` blocks
    (``_mamba_block_aligned_split``), plus one at the junction when its attention hit is
    longer than its Mamba hit (Marconi-style admission, vLLM #37898), and the KV of every full
    block. A hit is the deepest cached state within the attention hit (the minimum over the
    KV-cache groups), so a prompt of at most one block never hits. ``none``: no Mamba
    prefix caching, no hits. ``junction: false`` drops the junction state (vLLM before #37898).
    A GDN model on a GPU where vLLM prefills it with FlashInfer (Hopper; :meth:`gdn_prefill`)
    gets blocks in multiples of FlashInfer's 64-token checkpoint alignment. A retention
    interval also keeps the states steps leave on its grid, and a ``prefix_match_unit``
    below the block its hits and the prompt's partial tail on that finer grid (vLLM's pool
    only: :mod:`simlab.engines.block_pool`); the sub-block junction of #53945
    (``enable_mamba_shared_prefix_checkpoint``) needs EAGLE, so it changes nothing.
    """

    committed: bool = True
    mamba_cache_mode: str = "align"
    #: ``policy.block_size`` before :meth:`for_model` forced it (0: not forced)
    requested_block_size: int = 0
    version: str = "0.33.0"
    junction: bool = True
    #: tokens one scheduler step prefills (vLLM's ``max_num_batched_tokens``): a hybrid's
    #: longer prompt is prefilled in block-aligned chunks (:mod:`simlab.engines.block_pool`);
    #: None: the engine's (the timed engine's ``engine.token_budget``; on the replay engine
    #: ``SchedulerConfig``'s 2,048, as the cross-checks drove vLLM)
    max_num_batched_tokens: int | None = None
    #: hybrids on the replay and timed engines: vLLM's pool block by block
    #: (:mod:`simlab.engines.block_pool`, :mod:`simlab.engines.timed.vllm`; checked request for request); false:
    #: the prefix tree, as the cluster and offline engines
    block_pool: bool = True
    #: vLLM's ``--mamba-ssm-cache-dtype`` (``auto``: its default for the model, :data:`VLLM_SSM_DTYPE`)
    mamba_ssm_cache_dtype: str = "auto"
    #: the GPU's CUDA compute capability (``hardware.compute_capability``; None: not CUDA):
    #: GDN models get FlashInfer's prefill, and its 64-token block alignment, on Hopper
    compute_capability: float | None = None
    #: vLLM's ``--prefix-cache-retention-interval`` in tokens: 0 (0.33.0's default) keeps the
    #: semantic states only; N > 0, a multiple of the block, also every state a step leaves at
    #: a multiple of N tokens; None, every state a step leaves (vLLM's pool only:
    #: :mod:`simlab.engines.block_pool`)
    prefix_cache_retention_interval: int | None = 0
    #: vLLM's ``--prefix-match-unit`` (None: 0.33.0's default, the block): a divisor of a
    #: hybrid's block, below it on vLLM's pool only (:meth:`pool_only`)
    prefix_match_unit: int | None = None
    #: vLLM's ``--enable-mamba-shared-prefix-checkpoint``: effective only with EAGLE on the
    #: Mamba group (and a finer ``prefix_match_unit``), so without effect here
    enable_mamba_shared_prefix_checkpoint: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ssm_dtype(self.mamba_ssm_cache_dtype, "policy.mamba_ssm_cache_dtype")
        if self.max_num_batched_tokens is not None:
            positive_int(self.max_num_batched_tokens, "policy.admission.max_num_batched_tokens")
        check_bool(self.block_pool, "policy.admission.block_pool")
        check_bool(
            self.enable_mamba_shared_prefix_checkpoint,
            "policy.enable_mamba_shared_prefix_checkpoint",
        )
        check_grid_options(self.prefix_cache_retention_interval, self.prefix_match_unit)
        check_capability(self.compute_capability)
        modes = VLLM_MAMBA_MODES.get(self.version)
        if modes is None:
            raise ValueError(
                f"policy.version: vLLM {self.version!r} is not modelled "
                f"(known: {sorted(VLLM_MAMBA_MODES)})"
            )
        if self.mamba_cache_mode not in modes:
            raise ValueError(
                f"policy.mamba_cache_mode: vLLM {self.version} supports {modes}, "
                f"got {self.mamba_cache_mode!r}"
            )

    def pools_blocks(self, hybrid: bool) -> bool:
        """With ``block_pool`` on: a hybrid in ``align`` mode, and a Transformer."""
        return self.block_pool and (self.mamba_cache_mode == "align" or not hybrid)

    def tree_caveats(self, hybrid: bool) -> tuple[str, ...]:
        if hybrid and self.prefix_cache_retention_interval != 0:
            return (
                "policy.prefix_cache_retention_interval is modelled in vLLM's block pool only "
                "(the replay and timed engines' block_pool route); this route keeps the "
                "semantic states alone, as at 0",
            )
        return ()

    def pool_only(self, hybrid: bool) -> str | None:
        unit = self.prefix_match_unit
        if hybrid and unit is not None and unit < self.block_size:
            return (
                f"policy.prefix_match_unit ({unit}) below vLLM's block ({self.block_size}) is "
                "modelled in vLLM's block pool only: the replay or timed engine on a token "
                "trace, with no host tier or cache.ssm_gb"
            )
        return None

    def hit_grid(self) -> int | None:
        return self.prefix_match_unit

    def caveats(self, hybrid: bool) -> tuple[str, ...]:
        if hybrid and self.mamba_cache_mode == "none":
            return (
                "policy.mamba_cache_mode=none disables vLLM's prefix caching for the Mamba "
                "state: a hybrid never hits",
            )
        if hybrid and self.enable_mamba_shared_prefix_checkpoint:
            return (
                "policy.enable_mamba_shared_prefix_checkpoint changes nothing: vLLM 0.33.0 "
                "acts on it only with EAGLE on the Mamba group, which simlab does not run",
            )
        return ()

    def ssm_dtype(self, model: ModelSpec) -> str:
        """The SSM state's dtype vLLM keeps for ``model``: the setting, else the
        architecture's default, else ``auto`` (the conv state's: the model's dtype)."""
        if self.mamba_ssm_cache_dtype != "auto":
            return self.mamba_ssm_cache_dtype
        if model.config_ssm_dtype:
            return model.config_ssm_dtype
        if model.ssm_kind == "kda":  # kda_state_dtype: float32 on auto
            return "float32"
        return VLLM_SSM_DTYPE.get(model.architecture, model_dtype(model))

    def engine_model(self, model: ModelSpec) -> ModelSpec:
        return with_ssm_dtype(model, self.ssm_dtype(model))

    def geometry(self, model: ModelSpec, unit: int, pool: StatePool | None) -> dict[str, Any]:
        """vLLM's layout: the block (forced up from ``policy.block_size`` for a hybrid in
        ``align``), the pages it equalizes, the state dtypes and where states are kept."""
        block = self.block_size * unit
        out: dict[str, Any] = {"engine": f"vllm {self.version}", "block_size": block}
        if not model.is_hybrid:
            return out | {"state_bytes": 0}
        page = mamba_page_bytes(model)
        align = self.mamba_cache_mode == "align"
        retention = self.prefix_cache_retention_interval
        gdn, gdn_defaults = gdn_prefill_items(
            self.gdn_prefill(model), self.compute_capability, self.version
        )
        return (
            out
            | {
                "requested_block_size": (self.requested_block_size or self.block_size) * unit,
                "mamba_cache_mode": self.mamba_cache_mode,
                "ssm_state_dtype": self.ssm_dtype(model),
                "conv_state_dtype": model_dtype(model),
                "state_page_bytes": page,
                "attention_page_bytes": block * model.kv_bytes_per_token_per_layer,
                "state_bytes": page * model.n_ssm_layers,
                "simlab_state_bytes": model.ssm_state_bytes,
                "prefix_match_unit": self.prefix_match_unit,  # None: the block
                "enable_mamba_shared_prefix_checkpoint": self.enable_mamba_shared_prefix_checkpoint,
                "prefix_cache_retention_interval": retention,
                "states_kept": (
                    states_kept(self.junction, retention, block, self.prefix_match_unit)
                    if align
                    else "none"
                ),
                # None: the engine's (config.engine.token_budget on the timed engine)
                "max_num_batched_tokens": (
                    None
                    if self.max_num_batched_tokens is None
                    else self.max_num_batched_tokens * unit
                ),
                "defaults": {"mamba_ssm_cache_dtype": self.dtype_source(model)} | gdn_defaults,
            }
            | gdn
        )

    def checkpoint_alignment(self, model: ModelSpec, block: int) -> int | None:
        """The Mamba layers' prefill checkpoint alignment on vLLM's ``block`` (None: no
        checkpoint written inside a step): FlashInfer's GDN prefill keeps its offsets on
        ``lcm(prefix_match_unit, 64)`` (``get_mamba_prefill_checkpoint_grid``); GDN on Triton
        writes none with a prefix match unit below the block (at the block simlab writes
        its checkpoint inside the step: the same states, one step fewer); Mamba2 any token."""
        unit = self.prefix_match_unit or block
        kernel = self.gdn_prefill(model)
        if kernel == "flashinfer":
            return math.lcm(unit, GDN_FLASHINFER_ALIGNMENT) if unit < block else block
        if kernel == "triton" and unit < block:
            return None
        return 1

    def gdn_prefill(self, model: ModelSpec) -> str | None:
        """A GDN hybrid's prefill kernel on the run's GPU (None: no GDN layer)."""
        if model.ssm_kind != "gdn" or not model.is_hybrid:
            return None
        return vllm_gdn_prefill(self.compute_capability, model.ssm_state_dim)

    def dtype_source(self, model: ModelSpec) -> str:
        """The SSM dtype and where it comes from."""
        dtype = self.ssm_dtype(model)
        if self.mamba_ssm_cache_dtype != "auto":
            return f"{dtype} (policy.mamba_ssm_cache_dtype)"
        if model.config_ssm_dtype:
            return f"{dtype} (the config's)"
        if model.ssm_kind == "kda":
            return f"{dtype} (vLLM {self.version}'s kda_state_dtype)"
        if model.architecture in VLLM_SSM_DTYPE:
            return f"{dtype} (vLLM {self.version}'s default for {model.architecture})"
        return f"{dtype} (vLLM {self.version}'s auto: the model's dtype)"

    def for_model(self, model: ModelSpec, unit_tokens: int = 1) -> VLLM:
        block = self.block_size * unit_tokens
        forced = model.is_hybrid and self.mamba_cache_mode == "align"
        if forced:
            alignment = GDN_FLASHINFER_ALIGNMENT if self.gdn_prefill(model) == "flashinfer" else 1
            block = vllm_hybrid_block_size(model, block, alignment)
        retention, unit = self.prefix_cache_retention_interval, self.prefix_match_unit
        check_grid(retention, unit, block, model.is_hybrid)
        if not forced:
            return self
        return replace(
            self, block_size=-(-block // unit_tokens), requested_block_size=self.block_size
        )

    def plan(self, lookup: Lookup, input_len: int, seq_len: int) -> Admission:
        states: list[int] = []
        if self.mamba_cache_mode == "align":
            prompt = input_len - 1  # floor((L - 1) / B): the last block boundary below the end
            junction = min(lookup.matched, prompt) if self.junction else 0
            states = sorted({p for p in (junction, prompt) if p > lookup.hit})
        return Admission(
            ckpts=states,
            end=seq_len,
            held_from=lookup.hit,
            stateless_kv=True,
            publishes_prompt=True,
        )
