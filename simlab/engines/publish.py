"""A request's publishes: what its prefill admits before it finishes, and what it holds itself.

:class:`simlab.engines.step.RequestStep` delegates here. A plan that publishes its prompt
(SGLang's and vLLM's rules) admits it when the prefill ends (:func:`prefilled`), or chunk by
chunk between the chunks of a prefill cut into pieces (:func:`checkpoint`), and the request's pin
moves to what it published; an engine that runs extends and decode steps itself places a
tracking plan's states (:func:`track_extend`, :func:`track_decode`). The request's own slots
(``Admission.held_from``) move past what it published, and :func:`own_from`, :func:`spare_ids`
say what it holds and what free room its engine keeps beside it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from simlab.cache.nodes import InsertResult, Node

if TYPE_CHECKING:
    import numpy as np

    from simlab.cache.prefix import PrefixCache
    from simlab.engines.step import RequestStep, Started


def prefilled(step: RequestStep, started: Started, keep_room: bool = True) -> None:
    """The request's prefill ended (timed engines; the replay calls it right after
    :meth:`simlab.engines.step.RequestStep.start`). A plan that ``publishes_prompt`` admits the prompt now, so requests
    scheduled from now on can hit it, and the request's pin moves to the published prompt
    (SGLang moves its lock there). ``keep_room``: the publish first makes room in the cache
    for the request's whole allocation (``held_from``: every id past its hit, and with a
    separate SSM pool a state slot of its own), as the engines allocate it when the request
    starts; False when the engine counts running requests' memory itself (the timed
    engine's shared KV pool). A plan with ``tracking`` publishes only the states its
    extends tracked since its last publish, KV up to the last, and nothing (no walk, no
    refresh) when they tracked none (SGLang's ``cache_len`` 0)."""
    plan, cache = started.plan, step.cache
    if not plan.publishes_prompt or started.prompt <= 0:
        return
    seq, held_from = started.seq, None
    end, ckpts = started.fill, _prefill_states(cache, started)
    if plan.tracking is not None:  # the states its extends tracked, not yet published
        ckpts = [c for c in ckpts if c > started.states_to]
        end = started.states_to = max(ckpts, default=0)
    if keep_room and plan.held_from is not None:
        seq, held_from = seq[: started.allocated], plan.held_from
    published = started.published  # what a chunked prefill published between chunks
    started.published = cache.insert(
        seq,
        ckpts,
        end,
        step.eviction,
        cuts=_publish_cuts(started, end),
        held_from=held_from,
        stateless_kv=plan.stateless_kv,
        short=started.short,
        running_states=step.admission.running_state_slots if held_from is not None else 0,
        spare=spare_ids(step, started, decoding=False),
    )
    if published is not None:
        started.published = merged(published, started.published)
    if plan.held_from is not None:  # the published prompt's slots are the tree's now
        started.plan = replace(plan, held_from=_held_after_publish(cache, started))
    if started.pins and end > 0:
        page = step.page_size
        _move_pin(cache, started, _published_node(cache, started.seq, end // page * page))


def _published_node(cache: PrefixCache, seq: np.ndarray, ids: int) -> Node | None:
    """The deepest node on the cached prefix of ``seq[:ids]``, a cached edge running past
    it split there first (SGLang's insertion splits where its key ends: another request
    may have published a longer edge over the same ids meanwhile, e.g. a chunked prompt
    stashed before this one's publish under the overlap scheduler)."""
    prefix = seq[:ids]
    cache.split_match(cache.lookup(prefix), ids)
    return cache.deepest_cached(prefix)


def _prefill_states(cache: PrefixCache, started: Started) -> list[int]:
    """States a prefill has published by its end: with ``tracking`` those its extends
    tracked; else the plan's within the prompt, a recomputed hybrid's at its fill's end
    instead of its prompt's (its one extend ran through the sampled outputs: SGLang's
    ``checkpoint`` up to ``extend_end`` keeps the state there, and a later turn of the
    conversation hits it)."""
    plan, prompt, fill = started.plan, started.prompt, started.fill
    if plan.tracking is not None:
        return [c for c in plan.ckpts if c <= fill]
    states = [c for c in plan.ckpts if c <= prompt]
    if fill > prompt and cache.hybrid:
        return [*(c for c in states if c < prompt), fill]
    return states


def _publish_cuts(started: Started, end: int) -> list[int]:
    """Node boundaries of a publish up to ``end``: the plan's within the prompt, and the
    prompt's end where the publish goes past it (SGLang's ``split_prompt``)."""
    prompt = started.prompt
    cuts = [c for c in started.plan.cuts if c <= min(prompt, end)]
    return [*cuts, prompt] if end > prompt else cuts


def publishes_chunks(step: RequestStep, started: Started) -> bool:
    """Whether a prefill cut into chunks publishes what it computed between them
    (:func:`checkpoint`): a plan that publishes its prompt, on a cache whose ids are tokens
    or a radix tree's pages of tokens (a hash id stands for many tokens), a hybrid's only
    with a state at each chunk's end (``chunk_states``) or at the state each chunk tracked
    (``tracking``): a hybrid's KV is cached only up to a state."""
    cache, plan = step.cache, started.plan
    return (
        plan.publishes_prompt
        and (plan.chunk_states or plan.tracking is not None or not cache.hybrid)
        and (step.keys.tokens_are_ids or step.keys.pages_of_tokens)
    )


def tracks_runs(step: RequestStep, started: Started) -> bool:
    """Whether an engine that runs ``started``'s extends and decode steps itself places its
    states (:func:`track_extend`, :func:`track_decode`): a plan with ``tracking``, on a
    cache whose ids are tokens. If so the plan's states, those of one whole-prompt extend
    and undisturbed decoding, are dropped now, before the engine's first extend."""
    if started.plan.tracking is None or not step.keys.tokens_are_ids:
        return False
    started.plan = replace(started.plan, ckpts=[])
    return True


def track_extend(started: Started, start: int, end: int) -> int | None:
    """A prefill extend of positions ``[start, end)`` ran: the state it tracked (None if
    none) joins the plan's, where the prefill publish (:func:`checkpoint` between chunks,
    :func:`prefilled` at its end) takes it; one past the ids its prefill publishes (its
    fill, :meth:`simlab.engines.keying.StepKeys.fill`) is not kept. Requires :func:`tracks_runs`."""
    plan = started.plan
    assert plan.tracking is not None
    state = plan.tracking.extend(start, end)
    if state is None or state > started.fill:
        return None
    started.plan = replace(plan, ckpts=[*plan.ckpts, state])
    return state


def track_decode(started: Started, start: int, end: int) -> None:
    """Decode steps grew the sequence from ``start`` to ``end`` ids: the last state they
    tracked replaces the one an earlier decode step tracked (SGLang's ping-pong buffer
    keeps the latest; the finish publishes it). Requires :func:`tracks_runs`."""
    plan = started.plan
    assert plan.tracking is not None
    state = plan.tracking.decode(start, end)
    if state is not None:
        prefill = [c for c in plan.ckpts if c <= started.fill]
        started.plan = replace(plan, ckpts=[*prefill, state])


def checkpoint(step: RequestStep, started: Started, tokens: int) -> int:
    """A prefill cut into chunks publishes its first ``tokens`` (whole pages) between
    them, as at its end (:func:`prefilled` without making room: SGLang's
    ``checkpoint_kv_cache`` of its chunked request), and its pin moves there (a cached edge
    running past them is split there first, as SGLang's insertion splits it). Returns the
    tokens of the prompt now cached on its path. Requires :func:`publishes_chunks`."""
    plan, cache = started.plan, step.cache
    per_key = (
        cache.unit
    )  # tokens per id: 1, or a page's (:attr:`simlab.engines.keying.StepKeys.pages_of_tokens`)
    ids = min(tokens // per_key, started.fill) // step.page_size * step.page_size
    if plan.tracking is not None:
        started.states_to = ids
    if ids > 0:
        result = cache.insert(
            started.seq,
            [ids] if cache.hybrid else [],
            ids,
            step.eviction,
            cuts=_publish_cuts(started, ids),
            stateless_kv=plan.stateless_kv,
        )
        published = started.published
        started.published = result if published is None else merged(published, result)
    deepest = _published_node(cache, started.seq, ids)
    if deepest is None:
        return 0
    if started.pins:
        _move_pin(cache, started, deepest)
    return deepest.end * per_key


def _move_pin(cache: PrefixCache, started: Started, node: Node | None) -> None:
    """The request's pin moves to ``node``, what it published (SGLang's
    ``cache_unfinished_req`` moves the request's lock to its new last node, the root's
    lock of a request that hit nothing included): a running request's published prompt is
    never evicted under it."""
    cache.pin(node)
    cache.unpin(started.pinned)
    started.pinned = node


def own_from(step: RequestStep, started: Started) -> int | None:
    """Where the tokens the request holds itself start (``plan.held_from`` in tokens, at
    most its input's, or past it by the recomputed outputs it published: ``Started.fill``);
    None when the plan does not say."""
    held_from = started.plan.held_from
    if held_from is None:
        return None
    past = min(max(held_from - started.prompt, 0), started.refill)
    per_key = step.keys.per_key  # the outputs' keys are whole pages of tokens, or tokens
    return started.req.hit_tokens((held_from - past) * per_key) + past * per_key


def _holds_whole_blocks(cache: PrefixCache) -> bool:
    """A Transformer's block pool (vLLM): a request keeps the blocks it recomputed though
    they were cached (:func:`_held_after_publish`). Hybrid pools keep the plain rule: no
    real-engine case checks their duplicates yet. SGLang's paged tree frees them when it
    publishes (``_insert_cache``)."""
    return cache.block_nodes and not cache.hybrid


def _held_after_publish(cache: PrefixCache, started: Started) -> int:
    """Where the request's own slots start once its prompt is published: past the prompt,
    except that a block pool (vLLM) keeps the blocks it recomputed though they were cached
    (the hit stops at ``len - 1``): vLLM allocates fresh blocks for every position past the
    hit and never de-duplicates them against the cached ones, so they hold memory until the
    request finishes (real vLLM 0.33 ``KVCacheManager``: ``tests/test_production.py``).
    Hybrid pools keep the plain rule: no real-engine case checks their duplicates yet.
    A hybrid whose KV is cached only up to a state published the prompt's KV up to its last
    state in the prompt, and holds the rest itself (SGLang's ``extra_buffer`` checkpoints
    the prompt at its tracked state, ``cache_unfinished_req``).
    Invariant: ``plan.held_from <= result``."""
    plan, prompt = started.plan, started.prompt
    assert plan.held_from is not None
    published = started.fill
    if cache.hybrid and not plan.stateless_kv:
        published = max(_prefill_states(cache, started), default=0)
    held_from = max(plan.held_from, published)
    if _holds_whole_blocks(cache):
        recomputed = min(started.lookup.matched, prompt) - plan.held_from
        held_from -= max(0, recomputed)
    return held_from


def finish_cuts(started: Started) -> list[int]:
    """The plan's node boundaries, a cut at the input's end (its lookup ids) put at the
    end of the prompt's full blocks: with block keys a prompt's partial last block is
    never cached, so a paged tree splits where its cached prompt ends (SGLang's
    ``split_prompt`` on the page-aligned prompt key)."""
    cuts, prompt, lookup = started.plan.cuts, started.prompt, started.allocated
    if prompt == lookup:
        return list(cuts)
    return [prompt if c == lookup else c for c in cuts]


def spare_ids(step: RequestStep, started: Started, decoding: bool) -> int:
    """Keys of free room the engine's eviction keeps beyond the request's allocation
    (``Admission.spare_page``; a key is a page). SGLang's paged allocator: before the
    prefill extend, one page more than it takes (``alloc_paged_token_slots_extend``); before
    each decode step, one free page (``alloc_paged_token_slots_decode``), which at the last
    step (feeding token ``C - 1`` of the ``C`` it leaves) is the page it takes when that
    token starts one, else one more. A request without decode steps (one output) has none."""
    if not started.plan.spare_page:
        return 0
    if not decoding:
        return 1
    req = started.req
    left = req.input_len + req.output_ids.shape[0] - 1  # C: the committed tokens
    if left <= req.input_len:
        return 0
    return 0 if (left - 1) % step.keys.per_key == 0 else 1


def merged(first: InsertResult, second: InsertResult) -> InsertResult:
    """A request's two admissions (prompt at prefill, the rest at finish) as one."""
    return InsertResult(
        kv_bytes=first.kv_bytes + second.kv_bytes,
        ssm_bytes=first.ssm_bytes + second.ssm_bytes,
        ckpts=first.ckpts + second.ckpts,
        admitted_end=second.admitted_end,
        truncated=first.truncated or second.truncated,
        evicted_bytes=first.evicted_bytes + second.evicted_bytes,
        evicted_nodes=first.evicted_nodes + second.evicted_nodes,
    )
