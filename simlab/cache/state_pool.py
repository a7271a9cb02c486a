"""A hybrid's separate state pool: what the KV and the recurrent states each get when the
engine keeps the states in a pool of their own (SGLang's Mamba pool), and how ``summary.json``
states it (``engine_geometry.mamba_pool``, ``engine_defaults``). Part of the plug-in contract
(:meth:`simlab.cache.contract.AdmissionPolicy.state_pool` returns one): like it, this module
imports nothing from ``simlab`` at run time.

SGLang 0.5.23 splits a hybrid's memory between its Mamba pool and its KV pool, when
``--max-mamba-cache-size`` (``cache.ssm_gb``) does not set it, as
``mem_cache/kv_cache_configurator.py`` ``_handle_max_mamba_cache`` does without speculative
decoding (:func:`sglang_split`)::

    budget = rest * ratio / (1 + ratio)          # --mamba-full-memory-ratio, default 0.9
    slots = int((budget - per_req) // per_req)   # max_mamba_cache_size
    kv = rest - (slots + 1) * per_req            # the KV pool's bytes

``rest`` is the memory left for both pools (``cache.size_gb``), in GiB floats as SGLang computes
it; ``per_req`` is ``mamba2_cache_params.mamba_cache_per_req``, a request's conv and SSM states
in every Mamba layer at SGLang's dtypes. The pool allocates one padding slot beyond ``slots``
(``MambaPool``: ``size + 1``) that no request uses, so the KV pool gets what ``slots + 1``
states leave. ``extra_buffer``'s ping-pong track slots come out of the same ``slots``
(``HybridReqToTokenPool.alloc``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class StatePool:
    """``kv_bytes`` for the KV pool; ``ssm_bytes`` for the states the cache may hold (``slots``
    of the cache's states); ``gb``: the memory the engine gives the pool; ``source``: where the
    split comes from (``cache.ssm_gb``, or the engine's ``default split``) and ``details`` its
    settings; ``defaults``: the engine defaults it used (``engine_defaults``) and ``warning``
    the line logged for them ("" when the user set the split)."""

    kv_bytes: float
    ssm_bytes: float
    slots: int
    gb: float
    source: str
    details: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)
    warning: str = ""

    @classmethod
    def given(cls, kv_bytes: float, ssm_bytes: float, state_bytes: int) -> StatePool:
        """``cache.ssm_gb``'s pool: ``ssm_bytes`` of states of ``state_bytes`` each."""
        slots = int(ssm_bytes // state_bytes)
        return cls(kv_bytes, ssm_bytes, slots, ssm_bytes / 1e9, "cache.ssm_gb")

    @property
    def summary(self) -> dict[str, Any]:
        """``engine_geometry.mamba_pool``."""
        sizes = {"slots": self.slots, "ssm_gb": self.gb, "kv_gb": self.kv_bytes / 1e9}
        return {"shared_with_kv": False, "source": self.source} | sizes | self.details


#: ``--mamba-full-memory-ratio`` when unset (``ScheduleArgs``: ``fallback=0.9``)
DEFAULT_RATIO = 0.9
GIB = 1 << 30


def check_ratio(ratio: object) -> None:
    """``policy.mamba_full_memory_ratio``: a positive number, or None (SGLang's default)."""
    if ratio is not None and (
        isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio > 0
    ):
        raise ValueError(
            f"policy.mamba_full_memory_ratio must be a positive number or null, got {ratio!r}"
        )


def sglang_split(rest_bytes: float, per_req: int, ratio: float) -> tuple[int, int]:
    """SGLang's Mamba slots and KV pool bytes for ``rest_bytes`` of memory, ``per_req`` bytes
    a state and ``ratio`` (``--mamba-full-memory-ratio``), as its code computes them."""
    rest = rest_bytes / GIB
    budget = rest * ratio / (1 + ratio)
    slots = int((budget * GIB - per_req) // per_req)
    return slots, int((rest - (slots + 1) * per_req / GIB) * GIB)


def sglang_pool(
    rest_bytes: float, per_req: int, cache_state_bytes: int, ratio: float | None
) -> StatePool:
    """SGLang's Mamba pool for ``rest_bytes`` (``ratio`` None: its default), holding as many of
    the cache's states (``cache_state_bytes``) as SGLang has slots; a ValueError naming the
    settings when it has none (SGLang refuses to start)."""
    used = DEFAULT_RATIO if ratio is None else ratio
    slots, kv = sglang_split(rest_bytes, per_req, used)
    if slots < 1:
        raise ValueError(
            f"cache.size_gb: SGLang's memory split (policy.mamba_full_memory_ratio={used}) "
            f"leaves no Mamba state slot of {per_req:,} bytes in {rest_bytes / 1e9:.4g} GB; "
            "raise cache.size_gb or the ratio, or set cache.ssm_gb"
        )
    gb = (slots + 1) * per_req / 1e9
    details = {"mamba_full_memory_ratio": used}
    pool = StatePool(kv, slots * cache_state_bytes, slots, gb, "default split", details)
    if ratio is not None:
        return pool
    warning = (
        f"SGLang's default memory split (mamba_full_memory_ratio {used}) gives the Mamba pool "
        f"{slots:,} state slots ({gb:.4g} GB) and the KV pool {kv / 1e9:.4g} GB of the "
        f"{rest_bytes / 1e9:.4g} GB cache (summary.json's engine_defaults; "
        "policy.mamba_full_memory_ratio or cache.ssm_gb sets it)"
    )
    default = f"{used} (SGLang 0.5.23's default --mamba-full-memory-ratio)"
    return replace(pool, defaults={"mamba_full_memory_ratio": default}, warning=warning)
