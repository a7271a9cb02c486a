"""``policy.compat``: run a paper policy with the Marconi reference code's semantics.

The Marconi paper's numbers come from its authors' code (github ``ruipeterpan/marconi``, HEAD
``0801661``), which differs from the paper's text, and from simlab's default, in four semantic
choices and four bugs (``../shared/notes/marconi_reference.md``). Each is a switch of its own;
a compat preset sets them all at once:

=========================  =================================================================
switch (config key)        the reference's behaviour (file: place)
=========================  =================================================================
eviction.memory=path       FLOP efficiency per byte of SSM state + the KV of the node's whole
                           path (``radix_cache_hybrid.py``: FLOP-efficiency block, l. 528)
eviction.recency=          ``1 / (now - last_access)`` (``evict_v2``) on a clock that ticks on
inverse_age, semantics.    every match, insert, speculative match and evict (``logical_ts``,
clock=operation            ``use_logical_ts=True``)
eviction.ties=dfs          the first minimum in depth-first order
                           (``_collect_leaf_and_single_child_nodes`` then ``min``)
semantics.pin_insert=false nothing is pinned while an insertion evicts
semantics.reference_insert bytes to free estimated from the speculative match (1 state, 2 on a
                           branch inside an edge, + KV past the match), then insert anyway
admission.branch_on=       the branch state is where input + output diverges (``insert``'s
sequence                   speculative ``match_prefix`` on the whole sequence)
semantics.whole_input_hit  every fully matched node is reused, the whole input included
eviction.                  SGLang+ (``evict_policy_version=1``): the insertion's walk refreshes
refreshes_insert_path      the nodes it passes
eviction.ties=heap         SGLang+: the leaves ``heapq``-ed by ``last_access_time`` alone
                           (``TreeNode.__lt__``, ``evict_v1``): ties in the heap's order
eviction.mlp_bug           bug: ``28 * (mlp(T) - attn(P))`` (l. 526)
eviction.                  bug: a deleted leaf counts the last candidate's KV, not its own
miscounts_freed_bytes      (``node`` for ``node_to_evict``, l. 555)
semantics.partial_descent  bug: after a mismatch inside an edge the match descends into that
                           node's children and credits what it matches (l. 360-362)
=========================  =================================================================

Presets: ``reference`` (all of the above, bugs included: the published numbers' code) and
``reference_fixed`` (the same semantics with the three bugs fixed). ``null`` keeps simlab's
semantics (the paper's text). A preset sets all of its switches; without one, each switch can be
set on its own (``policy.eviction.memory=path``, ``policy.semantics.clock=operation``, ...) to
measure what it alone changes.

vLLM+ (``radix_cache_vllm.py``) takes the clock, whole-input, heap-tie, insert-path refresh
and no-pin switches, and ``semantics.reference_insert`` with its own estimate
(``semantics.block_estimate``: the tokens past the whole blocks matched + 1, a state per block
of them): it evicts what it estimates, then inserts past capacity (its bug 4; ``reference`` and
``reference_fixed`` alike, as the fork keeps it). Not reproduced: its partial tail blocks (the
last, partial block of a sequence cached with a state and extended in place; simlab caches
whole blocks only, as vLLM does; 0.02-0.11 points in the notes).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from hydra.utils import get_class

from simlab.cache.contract import Semantics

PRESETS = ("reference", "reference_fixed")

#: Semantics of each preset (cache level).
_SEMANTICS: dict[str, dict[str, Any]] = {
    "reference": {
        "clock": "operation",
        "pin_insert": False,
        "reference_insert": True,
        "whole_input_hit": True,
        "partial_descent": True,
    },
}
_SEMANTICS["reference_fixed"] = _SEMANTICS["reference"] | {"partial_descent": False}


def compat_preset(pcfg: Mapping[str, Any]) -> str | None:
    """The policy's ``compat`` preset (None for simlab's semantics); ValueError naming
    ``policy.compat`` for an unknown one."""
    compat = pcfg.get("compat")
    if compat is None:
        return None
    if compat not in PRESETS:
        raise ValueError(f"policy.compat must be null or one of {PRESETS}, got {compat!r}")
    return str(compat)


def plugin_class(plugin: Mapping[str, Any]) -> type | None:
    """The class a plug-in's config names (``_target_``); None when it names none that loads
    (instantiating it reports why)."""
    try:
        return get_class(str(plugin.get("_target_")))
    except (ImportError, ValueError):
        return None


def semantics_for(pcfg: Mapping[str, Any]) -> Semantics:
    """The cache semantics of a policy: its preset's, then what its admission's reference
    counterpart sets over them (:meth:`simlab.cache.contract.AdmissionPolicy.
    reference_semantics`: vLLM+'s own match and insertion estimate), then its own
    ``semantics`` keys."""
    preset = compat_preset(pcfg)
    values = dict(_SEMANTICS[preset]) if preset else {}
    if preset:
        admission = pcfg.get("admission") or {}
        kind = plugin_class(admission)
        if kind is not None and hasattr(kind, "reference_semantics"):
            values |= kind.reference_semantics(admission)
    own = pcfg.get("semantics") or {}
    if not isinstance(own, Mapping):
        raise ValueError(f"policy.semantics must be a mapping, got {own!r}")
    known = set(Semantics.__dataclass_fields__)
    unknown = sorted(set(own) - known)
    if unknown:
        raise ValueError(f"policy.semantics: unknown key(s) {unknown}; known: {sorted(known)}")
    return Semantics(**(values | dict(own)))


def with_compat(pcfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """``pcfg`` (a plain mapping) with its preset's plug-in switches set, as each plug-in class
    declares them (``reference_switches``; a preset sets all of a plug-in's switches, a plug-in
    declaring none is left as it is). Without a preset, ``pcfg`` itself."""
    preset = compat_preset(pcfg)
    if preset is None:
        return pcfg
    out = copy.deepcopy(dict(pcfg))
    for part in ("admission", "eviction"):
        plugin = out.get(part)
        if plugin is not None:
            switches = getattr(plugin_class(plugin), "reference_switches", {})
            out[part] = dict(plugin) | switches.get(preset, {})
    return out
