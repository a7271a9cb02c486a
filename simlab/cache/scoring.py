"""Building blocks the plug-in policies share (``policies/*`` import them from here, never
from each other): hit counts per node, the nodes a hit reuses, a checked weight, the alignment
of a prefill checkpoint, the recency eviction every LRU variant is, and the engines' rules for
a hybrid's recurrent state: the dtypes they keep it in, its page, the block vLLM forces to hold
it and the checks of vLLM's settings on that block.

Like :mod:`simlab.cache.contract`, this module imports nothing from ``simlab`` at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from simlab.cache.contract import CacheView, EvictionPolicy

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup, Node
    from simlab.model.spec import ModelSpec

#: Where a prefill checkpoint off a chunk boundary is taken (:func:`aligned`).
ALIGNMENTS = ("exact", "round_down")
#: Tie orders of a recency eviction (:class:`Recency`).
LRU_TIE_ORDERS = ("oldest", "heap")


def aligned(pos: int, alignment: str, chunk_size: int) -> int:
    """Position where a prefill checkpoint for ``pos`` is actually taken (0 = none)."""
    if alignment == "exact":
        return pos
    return (pos // chunk_size) * chunk_size


def checked_alpha(alpha: float) -> float:
    """``alpha`` if it is a finite number >= 0 (ValueError naming ``policy.alpha`` otherwise)."""
    if not (isinstance(alpha, int | float) and alpha >= 0.0 and math.isfinite(alpha)):
        raise ValueError(f"policy.alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


def reused_nodes(lookup: Lookup) -> list[Node]:
    """Nodes whose tokens the hit reuses (a node is reused if the hit reaches into it)."""
    nodes = [n for n in lookup.path if n.start < lookup.hit]
    if lookup.partial is not None and lookup.partial.start < lookup.hit:
        nodes.append(lookup.partial)
    return nodes


@dataclass
class HitCounts:
    """Per-node hit counts in slot-indexed arrays (a slot's count belongs to ``nid[slot]``).

    A new node starts at ``initial``; with ``inherit`` an upper node cut off by a split starts
    at the counts of its (already counted) children instead, when that is larger.
    """

    initial: float = 1.0
    inherit: bool = True
    nid: np.ndarray = field(
        default_factory=lambda: np.full(0, -1, dtype=np.int64), repr=False, compare=False
    )
    count: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.float64), repr=False, compare=False
    )

    def sync(self, cache: CacheView) -> tuple[np.ndarray, np.ndarray]:
        """Forget nodes that are gone, start counting new ones; returns (gone, new) slots."""
        n = cache.nids.shape[0]
        if self.nid.shape[0] < n:
            grow = n - self.nid.shape[0]
            self.nid = np.concatenate((self.nid, np.full(grow, -1, dtype=np.int64)))
            self.count = np.concatenate((self.count, np.zeros(grow)))
        tracked = self.nid[:n] >= 0
        gone = np.flatnonzero(tracked & (~cache.alive | (cache.nids != self.nid[:n])))
        self.nid[gone] = -1
        new = np.flatnonzero(cache.alive & (self.nid[:n] < 0))
        new = new[new != cache.root.slot]
        self.count[new] = self.initial
        for slot in new.tolist() if self.inherit else ():  # few: the last admission's nodes
            self.count[slot] = max(self.initial, self._children_count(cache.node_at(slot)))
        self.nid[new] = cache.nids[new]
        return gone, new

    def _children_count(self, node: Node) -> float:
        """Hits counted on ``node``'s already tracked children (a split's lower half)."""
        children = node.children.values()
        return float(sum(self.count[c.slot] for c in children if self.nid[c.slot] == c.nid))

    def hit(self, cache: CacheView, nodes: list[Node]) -> None:
        self.sync(cache)
        for node in nodes:
            self.count[node.slot] += 1.0


@dataclass
class Recency(EvictionPolicy):
    """The least recently used leaf goes first; its parent may become a leaf and go next.
    A plug-in built on it says what a hit refreshes (``on_hit``) and declares its ``order``
    (:data:`simlab.cache.contract.RECENCY_ORDERS`)."""

    evicts_inner_nodes: bool = False
    scores_depend_on_candidates: bool = False
    #: true: the insertion's walk refreshes the nodes it passes too (SGLang's ``_insert_helper``,
    #: and the Marconi reference code's SGLang+, ``policy.compat=reference``)
    refreshes_insert_path: bool = False
    #: ``oldest`` or ``heap`` (the reference's SGLang+, ``policy.compat=reference``)
    ties: str = "oldest"

    def __post_init__(self) -> None:
        if self.ties not in LRU_TIE_ORDERS:
            raise ValueError(f"eviction.ties must be one of {LRU_TIE_ORDERS}, got {self.ties!r}")

    def scores(self, cache: CacheView, candidates: np.ndarray) -> np.ndarray:
        return cache.last_access[candidates]


def min_max(values: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] over the candidates; all ones when they are all equal (reference code)."""
    lo, hi = np.minimum.reduce(values), np.maximum.reduce(values)  # .min(), without its wrapper
    if hi == lo:
        return np.ones_like(values)
    return (values - lo) / (hi - lo)


#: bytes of each dtype an engine may keep a recurrent state in
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: ``auto`` and the dtypes a user may set (``policy.mamba_ssm_cache_dtype``, ``policy.mamba_ssm_dtype``)
SSM_DTYPES = ("auto", *DTYPE_BYTES)
#: vLLM 0.33.0's per-architecture SSM dtype (``model_executor/models/config.py``:
#: ``NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE``, "only float32 is known to have no
#: accuracy issues"; the config's own ``mamba_ssm_cache_dtype`` first). Others: ``auto``, the
#: conv state's dtype, which is the model's.
VLLM_SSM_DTYPE = {"NemotronHForCausalLM": "float32"}
#: SGLang 0.5.23's state dtypes (``srt/configs/mamba_utils.py`` ``mamba2_state_dtype``): the SSM
#: state in float32 unless the config says ``mamba_ssm_dtype`` (or ``SGLANG_MAMBA_SSM_DTYPE``),
#: the conv state in bfloat16 (``SGLANG_MAMBA_CONV_DTYPE``), for every Mamba2 / GDN hybrid
SGLANG_SSM_DTYPE, SGLANG_CONV_DTYPE = "float32", "bfloat16"


#: the prefill checkpoint alignment of FlashInfer's GDN kernel (vLLM 0.33.0
#: ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``): vLLM's blocks for GDN layers are multiples of it
GDN_FLASHINFER_ALIGNMENT = 64


def vllm_gdn_prefill(capability: float | None, head_k_dim: int) -> str:
    """The GDN prefill kernel vLLM 0.33.0 picks (``--gdn-prefill-backend auto``,
    ``_resolve_gdn_prefill_backend``) on a GPU of CUDA compute ``capability`` (None: not CUDA):
    FlashInfer on SM 9.0 (Hopper), and on SM 10.x and 12.x (Blackwell) with 128-wide key heads
    and a CUDA 13 runtime (assumed); Triton elsewhere."""
    if capability is None:
        return "triton"
    blackwell = int(capability) in (10, 12) and head_k_dim == 128
    return "flashinfer" if capability == 9.0 or blackwell else "triton"


def vllm_block_size(
    state_page: int, token_page: int, minimum: int = 16, alignment: int = 1, mla: bool = False
) -> int:
    """vLLM 0.33.0's attention block for a hybrid (``Platform._align_hybrid_block_size``): the
    fewest tokens, in multiples of ``max(16, minimum)`` (the kernels' block; 128 for MLA) and of
    the layers' prefill checkpoint ``alignment`` (64 for GDN on Hopper), whose attention page
    (``token_page`` bytes a token) holds one recurrent state page (``state_page``)."""
    align = math.lcm(max(128 if mla else 16, minimum), alignment)
    block = align * -(-state_page // (align * token_page))
    return max(minimum, 16 * -(-block // 16))


def positive_int(value: object, key: str) -> int:
    """``value`` if it is an integer >= 1, else a ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def check_bool(value: object, key: str) -> None:
    """A ValueError naming ``key`` unless ``value`` is true or false."""
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")


def check_capability(value: object) -> None:
    """A ValueError unless ``value`` is a CUDA compute capability (a number) or None."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"hardware.compute_capability must be a number or null, got {value!r}")


def model_dtype(model: ModelSpec) -> str:
    """The model's own dtype by its bytes (the presets are BF16)."""
    return {4: "float32", 2: "bfloat16"}.get(model.dtype_bytes, f"{model.dtype_bytes} bytes")


def check_ssm_dtype(value: str, key: str) -> None:
    if value not in SSM_DTYPES:
        raise ValueError(f"{key} must be one of {SSM_DTYPES}, got {value!r}")


def with_ssm_dtype(model: ModelSpec, dtype: str) -> ModelSpec:
    """``model`` with its recurrent (SSM) state kept in ``dtype``."""
    size = DTYPE_BYTES[dtype]
    if not model.is_hybrid or model.ssm_state_dtype_bytes == size:
        return model
    return replace(model, ssm_state_dtype_bytes=size)


def mamba_page_bytes(model: ModelSpec, conv_bytes: int | None = None) -> int:
    """One layer's recurrent state as the engines keep it (vLLM's ``MambaSpec.page_size_bytes``,
    SGLang's ``mamba_cache_per_req`` per layer): the conv state over ``kernel - 1`` steps (in
    ``conv_bytes``, default the model's dtype) plus the SSM state."""
    conv = model.dtype_bytes if conv_bytes is None else conv_bytes
    return (
        model.ssm_state_channels * model.ssm_state_dim * model.ssm_state_dtype_bytes
        + model.ssm_conv_channels * (model.ssm_conv_kernel - 1) * conv
    )


def vllm_hybrid_block_size(model: ModelSpec, minimum: int, alignment: int = 1) -> int:
    """Tokens per block of a hybrid under ``align`` (:func:`vllm_block_size`): one layer's KV
    page of a block holds one layer's Mamba state (:func:`mamba_page_bytes`), in multiples of
    the layers' prefill checkpoint ``alignment`` (64 with FlashInfer's GDN prefill).
    Nemotron-H-8B: 528 with a BF16 state, 1,040 with vLLM's FP32 default for it."""
    page, token = mamba_page_bytes(model), model.kv_bytes_per_token_per_layer
    return vllm_block_size(page, token, minimum, alignment, mla=model.attn_kind == "mla")


def states_kept(junction: bool, retention: int | None, block: int) -> str:
    """Where vLLM's ``align`` mode keeps a request's states (``engine_geometry``), with the
    shared-prefix ``junction`` and ``--prefix-cache-retention-interval`` ``retention``
    (tokens; None: dense) on blocks of ``block`` tokens."""
    kept = "the prompt's last block boundary below its end"
    kept += " and the shared-prefix junction" if junction else ""
    if retention is None or 0 < retention <= block:
        return kept + ", and every block boundary a scheduler step ends on"
    if retention:
        return kept + f", and every multiple of {retention} tokens a scheduler step ends on"
    return kept


def gdn_prefill_items(
    kernel: str | None, capability: float | None, version: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """A GDN hybrid's prefill ``kernel`` on a GPU of compute ``capability``: its
    ``engine_geometry`` items and where it comes from (``engine_defaults``); none for a model
    without GDN layers (``kernel`` None)."""
    if kernel is None:
        return {}, {}
    gpu = f"compute capability {capability} (hardware.compute_capability)"
    blocks = ", blocks in multiples of 64 tokens" if kernel == "flashinfer" else ""
    source = f"{kernel} (vLLM {version}'s auto on {gpu}{blocks})"
    return (
        {"compute_capability": capability, "gdn_prefill_backend": kernel},
        {"gdn_prefill_backend": source},
    )


def check_grid_options(retention: int | None, unit: int | None) -> None:
    """``--prefix-cache-retention-interval`` (0, None or a positive integer) and
    ``--prefix-match-unit`` (None or a positive integer), or a ValueError naming the key."""
    if retention is not None and retention != 0:
        positive_int(retention, "policy.prefix_cache_retention_interval")
    if unit is not None:
        positive_int(unit, "policy.prefix_match_unit")


def check_grid(retention: int | None, unit: int | None, block: int, hybrid: bool = True) -> None:
    """vLLM's checks of ``--prefix-cache-retention-interval`` (``retention``) and
    ``--prefix-match-unit`` (``unit``) on the grid of its ``block`` (tokens; forced for a
    hybrid); a prefix match unit other than the block is not modelled."""
    if retention and not hybrid:
        raise ValueError(
            "policy.prefix_cache_retention_interval applies to Mamba layers, and this "
            "model has none (vLLM refuses it); leave it 0"
        )
    if retention and retention % block:
        raise ValueError(
            f"policy.prefix_cache_retention_interval ({retention}) must be a multiple of "
            f"vLLM's block for this model ({block} tokens), as vLLM requires"
        )
    if unit is not None and unit != block:
        raise ValueError(
            f"policy.prefix_match_unit ({unit}): hits on a grid other than vLLM's block "
            f"({block} tokens for this model) are not modelled; leave it null"
        )


__all__ = [
    "ALIGNMENTS",
    "DTYPE_BYTES",
    "GDN_FLASHINFER_ALIGNMENT",
    "LRU_TIE_ORDERS",
    "SGLANG_CONV_DTYPE",
    "SGLANG_SSM_DTYPE",
    "SSM_DTYPES",
    "VLLM_SSM_DTYPE",
    "HitCounts",
    "Recency",
    "aligned",
    "check_bool",
    "check_capability",
    "check_grid",
    "check_grid_options",
    "check_ssm_dtype",
    "checked_alpha",
    "gdn_prefill_items",
    "mamba_page_bytes",
    "min_max",
    "model_dtype",
    "positive_int",
    "reused_nodes",
    "states_kept",
    "vllm_block_size",
    "vllm_gdn_prefill",
    "vllm_hybrid_block_size",
    "with_ssm_dtype",
]
