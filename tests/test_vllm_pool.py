"""vLLM's hybrid pool block by block (``simlab.engines.block_pool``): the rules that separate it from
the prefix tree, on pools small enough to count by hand (blocks of 4 tokens, 2 Mamba groups).
The real engine's agreement is ``tests/test_crosscheck.py``'s (ShareGPT and SWE-bench, 1 GB to
infinite, 100% of requests)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from gpu_validate.cases import load_model
from simlab.config import ConfigError
from simlab.engines.block_pool import (
    REPLY_TOKEN,
    HybridPool,
    PoolFull,
    PoolRun,
    PoolShape,
    committed_tokens,
    pool_records,
    request_keys,
    token_keys,
)
from traces.format import Request

B = 4  # tokens per block


def pool(blocks: float, junction: bool = True) -> HybridPool:
    return HybridPool(PoolShape(block=B, state_groups=2, block_bytes=1, blocks=blocks), junction)


def serve(p: HybridPool, prompt: list[int], output: int = 0) -> tuple[int, int, int, int]:
    """One request; its output tokens are fresh ids."""
    tokens = prompt + [1000 + i for i in range(output)]
    run = p.serve(tokens, len(prompt), len(tokens) - (1 if output else 0))
    return run.hit_tokens, run.matched_tokens, run.kv_cached, run.states_cached


def test_a_prompt_caches_its_state_at_the_last_boundary_below_its_end():
    """One state, at floor((L - 1) / B) blocks, and the KV of every full block: the same
    prompt hits 8 of its 10 tokens; its first 8 tokens alone match one KV block (the last
    token is computed) and hit nothing, as no state was kept at 4."""
    p = pool(math.inf)
    prompt = list(range(10))
    assert serve(p, prompt, output=3) == (0, 0, 3, 1)  # 12 tokens computed: 3 KV blocks
    assert serve(p, prompt)[:2] == (8, 8)
    assert serve(p, prompt[:8])[:2] == (0, 4)


def test_the_junction_caches_the_state_where_the_kv_hit_outruns_the_state_hit():
    """The second prompt shares 9 tokens with the first: its KV hit is 8 tokens, its state hit
    0, so it stops at 8 and caches that state; a third prompt through 8 tokens then hits it.
    Without the junction (vLLM before #37898) it does not."""
    first, second, third = list(range(14)), [*range(9), *range(50, 61)], [*range(9), 70, 71]
    for junction, hit in ((True, 8), (False, 0)):
        p = pool(math.inf, junction)
        serve(p, first)
        assert serve(p, second)[:2] == (0, 8)
        assert serve(p, third)[:2] == (hit, 8)


def test_a_state_goes_before_its_requests_kv_and_dies_with_its_first_group_block():
    """A 9-token prompt caches 2 KV blocks and a state (a block in each of the 2 Mamba groups);
    at its finish the state's blocks enter the free queue before the KV. An unrelated 8-token
    prompt then takes 6 blocks (a checkpoint and a running block per group, 2 KV) from the 9
    with 5 free: it evicts exactly one, the state's first group block. The first prompt again
    still matches its 8 KV tokens but hits nothing: the state's other block is useless."""
    p = pool(9)
    first = list(range(9))
    serve(p, first)
    assert p.cached_bytes() == (2, 2)
    serve(p, list(range(100, 108)))
    assert p.pool.evicted == 1
    assert serve(p, first)[:2] == (0, 8)


def test_a_long_prompt_is_prefilled_in_block_aligned_chunks():
    """With 8 tokens a step, a 21-token prompt is prefilled 0-8-16-21: each step takes a new
    running block per Mamba group and frees the one before last, and the last step also takes
    the checkpoint's; so the last holds 3 blocks per group and 6 KV blocks: 12, one more than
    an 11-block pool has. Its state is at 20."""
    shape = PoolShape(block=B, state_groups=2, block_bytes=1, blocks=11)
    prompt = list(range(21))
    with pytest.raises(PoolFull):
        serve(HybridPool(shape, max_tokens=8), prompt)
    p = HybridPool(replace(shape, blocks=12), max_tokens=8)
    serve(p, prompt)
    assert serve(p, prompt)[:2] == (20, 20)


def test_a_request_the_whole_pool_cannot_hold_is_an_error_naming_the_capacity():
    req = Request(0, 0, 0, 0.0, np.arange(40, dtype=np.int32), np.arange(2, dtype=np.int32), 2)
    shape = PoolShape(block=B, state_groups=2, block_bytes=1, blocks=5)
    with pytest.raises(ConfigError, match=r"cache\.size_gb"):
        pool_records([req], load_model("nemotron_h_8b"), "vllm", HybridPool(shape), True)


def _hash_id_request(rid: int, ids: list[int], tokens: int, output: int) -> Request:
    """A hash-id request: ``ids`` of 8 tokens each, ``tokens`` long, ``output`` reply tokens."""
    return Request(
        rid,
        rid,
        0,
        0.0,
        np.array(ids, dtype=np.int32),
        np.array([], dtype=np.int32),
        output,
        block_size=8,
        ref_input_tokens=tokens,
    )


def _spelled_out(req: Request) -> list[int]:
    """``crosscheck.export``'s tokens of a hash-id request (``--outputs trace``)."""
    prompt = np.repeat(req.input_ids, req.block_size)[: req.input_tokens].tolist()
    return prompt + [REPLY_TOKEN] * req.output_len


@pytest.mark.parametrize("block", [4, 8, 16, 12])
def test_a_hash_id_requests_block_keys_match_where_its_spelled_out_tokens_do(block):
    """The keys of a hash-id request (ids of 8 tokens, a short last id, replies of unknown
    tokens) are equal across requests exactly where vLLM's hashes of the tokens the engine
    drivers feed it (each id spelled out, replies -1) are: blocks smaller than an id, equal
    to one, spanning two, or cut across them; a short last id shared or not; replies that
    fill a block. Compared pairwise over every block of every request."""
    requests = [
        _hash_id_request(0, [1, 2, 3], 24, 5),
        _hash_id_request(1, [1, 2, 3], 21, 9),  # the same ids, the last one 5 tokens short
        _hash_id_request(2, [1, 2, 3, 4], 30, 2),
        _hash_id_request(3, [1, 2, 5], 20, 12),
        _hash_id_request(4, [1, 2, 3], 21, 9),  # request 1 again: every block equal
        _hash_id_request(5, [7, 7, 2], 24, 0),  # one id twice in a row: one run
        _hash_id_request(6, [7], 8, 8),
    ]
    ours: list[int] = []
    theirs: list[int] = []
    for req in requests:
        committed = committed_tokens(req, committed=True)
        keys = request_keys(req, block, committed)
        assert len(keys) == committed // block
        ours += keys
        theirs += token_keys(_spelled_out(req), block, committed)
    assert len(ours) == len(theirs) > 0
    same_ours = [[a == b for b in ours] for a in ours]
    same_theirs = [[a == b for b in theirs] for a in theirs]
    assert same_ours == same_theirs
    assert sum(map(sum, same_ours)) > len(ours)  # some blocks are shared


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_decode_step_is_idle_exactly_when_it_takes_no_block_and_keys_none(asynchronous):
    """``PoolRun.idle`` (which the timed scheduler's running pass inlines) against what the
    step does: at every decode position of a Transformer's request, past the prompt and past
    its last key (the committed tokens end inside a block), under vLLM's sync and async
    scheduling (async: the token in flight keys nothing)."""
    p = HybridPool(PoolShape(block=B, state_groups=0, block_bytes=1, blocks=64))
    prompt, total = list(range(10)), 30
    keys = token_keys(prompt + [1000 + i for i in range(total)], B, total - 1)
    run = PoolRun(p, keys, len(prompt))
    run.acquire()
    run.step(0, len(prompt))
    seen = []
    for n in range(len(prompt), total):
        known = n if asynchronous else None
        before = (list(run.attn), run.keyed, run.kv_cached, list(p.pool.queue))
        idle = run.idle(n + 1, known)
        run.step(n, n + 1, known=known)
        assert idle == (before == (list(run.attn), run.keyed, run.kv_cached, list(p.pool.queue)))
        seen.append(idle)
    assert True in seen and False in seen
