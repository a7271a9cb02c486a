"""The route table: which code computes a policy's records, chosen in one place from what its
plug-ins declare (:mod:`simlab.cache.contract`: the eviction's ``order``, the admission's
``kind`` and ``pools_blocks``), the engine, the cache settings and the trace, never from class
names.

The routes of an engine, fastest first; the first that accepts a policy is taken, and each it
passed over says why (``summary.json``'s ``routes``):

=================  =====================================================================
route              what computes the records, and what it needs
=================  =====================================================================
stack_distances    every capacity in one pass (:mod:`simlab.fastpaths.stack`): the replay
                   engine, a Transformer keyed by whole blocks (admission ``blocks``), a
                   recency order whose insertion refreshes its path, leaves only
block_heap         a heap over block ids per capacity (:mod:`simlab.fastpaths.blocks.heap`):
                   the same pools, ``fifo`` or ``next_use`` (``compiled_block_heap`` when
                   the heap ran compiled, per ``cache.compiled``)
compiled_radix     the request step as one numba kernel (:mod:`simlab.fastpaths.radix.kernel`):
                   the replay engine, a token trace, admission ``judicious`` or
                   ``fine_grained``, order ``flop_aware`` or ``recency`` (a hybrid's
                   hash-id trace too)
block_pool         vLLM's hybrid pool block by block (:mod:`simlab.engines.block_pool`): the
                   replay engine, an admission vLLM's pool models, its ``free_queue``
request_step       the request step on the prefix tree (:mod:`simlab.engines.replay`)
pool_world         the timed engine on vLLM's pool (:mod:`simlab.engines.timed.vllm`)
timed_world        the timed engine on the prefix tree (:mod:`simlab.engines.timed.world`)
=================  =====================================================================

The fast routes give the request step's records exactly (``tests/test_routes.py`` runs every
route on the cases it accepts); ``block_pool`` and ``pool_world`` are vLLM's own pool, which the
prefix tree does not model for hybrids. ``cache.one_pass=false`` and ``cache.compiled=false``
refuse the block and the compiled routes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from simlab.cache.contract import RECENCY_ORDERS, Keys, Semantics
from simlab.cache.keys import BlockKeys, key_scheme
from simlab.engines.base import Engine, Replicated
from simlab.engines.block_pool import pool_shape
from simlab.engines.replay import ReplayEngine
from simlab.engines.step import RequestStep
from simlab.engines.tuning.tuner import AlphaTuner
from simlab.fastpaths.radix import kernel as radix_kernel
from simlab.fastpaths.radix import tuning as radix_tuning
from traces.format import Request

if TYPE_CHECKING:  # imported when a timed engine is routed (SimPy: not for the replay)
    from simlab.engines.timed.engine import TimedEngine

log = logging.getLogger(__name__)

REPLAY_ROUTES = ("stack_distances", "block_heap", "compiled_radix", "block_pool", "request_step")
TIMED_ROUTES = ("pool_world", "timed_world")
#: the routes that run a step on vLLM's pool (``RequestStep.pool``)
POOL_ROUTES = ("block_pool", "pool_world")
#: the routes over block ids (:func:`simlab.run.policy.stacked_runs`)
BLOCK_ROUTES = ("stack_distances", "block_heap")


@dataclass(frozen=True)
class Case:
    """What a route depends on: the policy's step, the engine, the requests and the cache's
    ``one_pass`` and ``compiled`` settings."""

    step: RequestStep
    engine: Engine
    requests: Sequence[Request]
    one_pass: bool = True
    compiled: bool | str = "auto"


@dataclass(frozen=True)
class Route:
    """The route ``taken`` and why each faster one was ``refused``."""

    taken: str
    refused: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"taken": self.taken, "refused": dict(self.refused)}


def first(checks: Sequence[tuple[bool, str]]) -> str | None:
    """The reason of the first check that fails (None: all pass)."""
    return next((why for ok, why in checks if not ok), None)


# ------------------------------------------------------------------ blocks (stack, heap)
def blocks_refusal(case: Case) -> str | None:
    """Why neither block route serves ``case`` whatever its eviction (None: they may)."""
    step = case.step
    cache, admission = step.cache, step.admission
    return first(
        (
            (not cache.hybrid, "a hybrid model (states make it no eviction over blocks alone)"),
            (admission.kind == "blocks", f"admission is {admission.kind} (whole blocks only)"),
            (isinstance(key_scheme(admission.keys), BlockKeys), "token keys (not whole blocks)"),
            (
                cache.semantics in (Semantics(), Semantics(whole_input_hit=True)),
                "the reference code's semantics",
            ),
            (cache.host is None and cache.ssm_capacity is None, "a host tier or SSM pool"),
            (not step.controllers and step.page_size == 1, "controllers or pages"),
            (case.one_pass, "cache.one_pass=false"),
        )
    )


def stack_refusal(case: Case) -> str | None:
    eviction = case.step.eviction
    return blocks_refusal(case) or first(
        (
            (eviction.order in RECENCY_ORDERS, f"eviction is {eviction.order} (recency only)"),
            (eviction.refreshes_insert_path, "an insertion that refreshes nothing"),
            (
                eviction.ties == "oldest" and not eviction.evicts_inner_nodes,
                "eviction tie order or inner nodes",
            ),
        )
    )


def heap_refusal(case: Case) -> str | None:
    eviction = case.step.eviction
    order = eviction.order
    return blocks_refusal(case) or first(
        (
            (order in ("fifo", "next_use"), f"eviction is {order} (fifo or next_use only)"),
            (eviction.ties == "oldest", "eviction tie order"),
            (order != "fifo" or not eviction.evicts_inner_nodes, "a FIFO of inner nodes"),
        )
    )


# ------------------------------------------------------------------ the compiled radix replay
def radix_refusal(step: RequestStep, requests: Sequence[Request]) -> str | None:
    """Why the kernel cannot serve ``requests`` as ``step`` does, whatever the engine (None: it
    can; the grid search of a tuned run on another engine replays its windows so): a token
    trace, or a hybrid's ids of many tokens (a hash-id trace,
    :func:`simlab.fastpaths.radix.kernel.keyed`)."""
    cache, admission, eviction = step.cache, step.admission, step.eviction
    kind, order = admission.kind, eviction.order
    many = cache.unit > 1 and cache.hybrid and all(r.block_size == cache.unit for r in requests)
    return first(
        (
            (
                kind in radix_kernel.ADMISSIONS and admission.keys == Keys(),
                f"admission is {kind} (judicious on its input, fine-grained)",
            ),
            (
                kind != "fine_grained" or not step.controllers,
                "alpha tuning with a fine-grained admission",
            ),
            (cache.semantics == Semantics(), "the reference code's semantics"),
            (cache.host is None and cache.ssm_capacity is None, "a host tier or SSM pool"),
            (
                all(type(c) is AlphaTuner for c in step.controllers) and len(step.controllers) <= 1,
                "controllers other than the alpha tuner",
            ),
            (
                cache.page_size == 1 and (cache.unit == 1 or many) and not cache.block_keys,
                "pages or ids of many tokens",
            ),
            (cache.kv_per_token > 0 and cache.ckpt_states == 1, "a model without attention KV"),
            (
                many or all(r.block_size == 1 and r.ref_input_tokens is None for r in requests),
                "a hash-id trace",
            ),
            (
                order in radix_kernel.EVICTIONS,
                f"eviction is {order} (flop_aware with the paper's terms, or recency)",
            ),
            (
                eviction.ties == "oldest"
                and not eviction.refreshes_insert_path
                and not eviction.ticks_on_insert,
                "eviction ties or an insertion that refreshes or ticks",
            ),
            (not eviction.miscounts_freed_bytes, "the reference code's FLOP-aware terms"),
            (
                eviction.evicts_inner_nodes == (order == "flop_aware"),
                "a recency order of inner nodes, or a FLOP-aware eviction of leaves only",
            ),
        )
    )


def compiled_refusal(case: Case) -> str | None:
    step, requests = case.step, case.requests
    if not radix_kernel.use_compiled(case.compiled, requests, step):
        return f"cache.compiled={case.compiled} (too little work, or no numba)"
    if not (step.cache.now == 0 and step.cache.used_bytes == 0):
        return "a cache already in use"
    return radix_refusal(step, requests)


def with_compiled_search(step: RequestStep, case: Case) -> RequestStep:
    """``step``, its alpha tuner's grid search replaying the windows on the kernel where it can
    (a tuned run the kernel does not serve whole: the timed engine, a cluster's replicas)."""
    tuner = next(iter(step.controllers), None)
    if not isinstance(tuner, AlphaTuner):
        return step
    if not radix_kernel.use_compiled(case.compiled, case.requests, step):
        return step
    why = radix_refusal(step, case.requests)
    if why is not None:
        log.debug("%s: the grid search request by request (%s)", step.policy, why)
        return step
    log.info("%s: the alpha grid search compiled (cache.compiled=%s)", step.policy, case.compiled)
    radix_tuning.search_compiled(step, tuner)
    return step


# ------------------------------------------------------------------ vLLM's pool
def pool_refusal(
    step: RequestStep, requests: Sequence[Request], transformers: bool = False
) -> str | None:
    """Why vLLM's pool does not run ``step`` (None: it does): an admission it models (on a
    Transformer only where ``transformers``: the timed engine's shared KV pool), vLLM's free
    queue, one shared budget, a token trace (a Transformer's, a hash-id trace too:
    :func:`simlab.engines.block_pool.request_keys`)."""
    cache, eviction = step.cache, step.eviction
    hybrid = cache.hybrid
    return first(
        (
            (hybrid or transformers, "a Transformer (the prefix tree's hits are vLLM's)"),
            (step.admission.pools_blocks(hybrid), "an admission vLLM's pool does not model"),
            (
                eviction.order == "free_queue" and eviction.ties == "oldest",
                f"eviction is {eviction.order} (vLLM's free queue only)",
            ),
            (cache.host is None and cache.ssm_capacity is None, "a host tier or SSM pool"),
            (not step.controllers, "controllers"),
            (not hybrid or all(r.block_size == 1 for r in requests), "a hash-id trace"),
            (pool_shape(step, requests) is not None, "attention layers in several groups"),
        )
    )


def timed_pool_refusal(case: Case) -> str | None:
    from simlab.engines.timed.engine import TimedEngine

    timed = timed_engine(case.engine)
    if timed is None or type(timed) is not TimedEngine:  # a subclass's feeders: the tree
        return f"engine {case.engine.name} (the timed engine only)"
    return pool_refusal(case.step, case.requests, transformers=timed.kv_pool == "shared")


def timed_engine(engine: Engine) -> TimedEngine | None:
    """The timed engine behind ``engine`` (itself, or a cluster's replicas'), or None."""
    from simlab.engines.timed.engine import TimedEngine

    if isinstance(engine, TimedEngine):
        return engine
    if not isinstance(engine, Replicated):
        return None
    from simlab.engines.cluster.engine import ClusterEngine  # loaded for replicas only

    return engine.engine if isinstance(engine, ClusterEngine) else None


def accept(case: Case) -> None:
    """The route that always serves."""
    return None


Refusal = Callable[[Case], str | None]
TABLE: dict[str, Refusal] = {
    "stack_distances": stack_refusal,
    "block_heap": heap_refusal,
    "compiled_radix": compiled_refusal,
    "block_pool": lambda case: pool_refusal(case.step, case.requests),
    "request_step": accept,
    "pool_world": timed_pool_refusal,
    "timed_world": accept,
}


def engine_routes(engine: Engine) -> tuple[str, ...]:
    """The routes of ``engine``, fastest first."""
    if type(engine) is ReplayEngine:
        return REPLAY_ROUTES
    if timed_engine(engine) is not None:
        return TIMED_ROUTES
    return ("request_step",)


def choose(case: Case) -> Route:
    """The first route of the engine's that accepts ``case``, with why each before it did not;
    marks the step for vLLM's pool where that is the route (``RequestStep.pool``)."""
    refused: dict[str, str] = {}
    for name in engine_routes(case.engine):
        why = TABLE[name](case)
        if why is None:
            case.step.pool = name in POOL_ROUTES
            return Route(name, refused)
        refused[name] = why
    raise AssertionError("every engine has a route that always serves")


def on_pool(step: RequestStep, engine: Engine, block_size: int = 1) -> bool:
    """Whether :func:`choose` runs ``step`` on vLLM's pool, told before the trace is loaded (the
    run plan): a request of ``block_size`` tokens per id (the trace's) stands for its requests."""
    empty = np.zeros(0, dtype=np.int64)
    probe = Request(0, 0, 0, 0.0, empty, empty, 0, block_size=block_size)
    return choose(Case(step, engine, [probe])).taken in POOL_ROUTES


def routed(step: RequestStep, route: Route) -> RequestStep:
    """``step`` marked for ``route`` (a cluster's fresh replica steps)."""
    step.pool = route.taken in POOL_ROUTES
    return step


def describe(route: Route) -> str:
    """The route and the first refusal before it, for the log."""
    why = "; ".join(f"not {name}: {reason}" for name, reason in route.refused.items())
    return f"route {route.taken}" + (f" ({why})" if why else "")
