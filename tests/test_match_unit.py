"""vLLM's ``--prefix-match-unit`` below a hybrid's block in simlab's pool
(``simlab.engines.block_pool``): the table ``crosscheck/vllm_match_unit.py`` prints from vLLM
0.33.0's own ``KVCacheManager`` and ``Scheduler._mamba_block_aligned_split`` (the engine geometry
guide), the copies a hit inside a block makes, and the config checks. The real scheduler's
agreement over whole traces, alone and under load, is ``tests/test_crosscheck.py``'s and
``tests/test_crosscheck_load.py``'s ``*_pmu*`` cases."""

from __future__ import annotations

import pytest

from simlab.config import ConfigError
from simlab.engines.block_pool import HybridPool, PoolShape, token_keys
from simlab.run.plan import plan_run
from tests.fixtures import compose

BLOCK, PROMPT, OUTPUTS, BUDGET = 1040, 3000, 10, 8192
SHARED = (2999, 2500, 2100)

#: crosscheck/vllm_match_unit.py's output (docs/guides/engine-geometry.md): B's hit for each
#: SHARED, by prefix_match_unit, where the Mamba layers write the prompt's checkpoint (inside the
#: prefill chunk at offsets on an alignment: 1 for MambaMixer2, lcm(P, 64) for GDN with
#: FlashInfer; None: the chunk is split there) and the block
VLLM = {
    (None, 1, BLOCK): [2080, 2080, 2080],
    (None, None, BLOCK): [2080, 2080, 2080],
    (16, 1, BLOCK): [2992, 0, 0],
    (16, None, BLOCK): [2992, 2080, 2080],
    (80, 1, BLOCK): [2960, 0, 0],
    (80, None, BLOCK): [2960, 2080, 2080],
    (16, 64, 1088): [2992, 2176, 0],
    (64, 64, 1088): [2944, 0, 0],
}


def pool(unit: int | None, alignment: int | None, block: int = BLOCK) -> HybridPool:
    """The harness's pool: one attention and one Mamba group, 200 blocks."""
    shape = PoolShape(block=block, state_groups=1, block_bytes=1, blocks=200)
    return HybridPool(shape, max_tokens=BUDGET, unit=unit, alignment=alignment)


def hit(p: HybridPool, shared: int) -> int:
    tokens = list(range(shared)) + [10**6 + i for i in range(PROMPT + 200 - shared)]
    return p.open(tokens, len(tokens), len(tokens) - 1).hit_tokens


@pytest.mark.parametrize(("unit", "alignment", "block"), list(VLLM))
def test_the_hits_are_vllms_own_for_each_unit_and_checkpoint_kind(unit, alignment, block):
    """A 3,000-token prompt and 10 outputs run alone; a later prompt shares 2,999, 2,500 or
    2,100 of its tokens: the hits vLLM's own cache code gives."""
    p = pool(unit, alignment, block)
    a = list(range(PROMPT)) + [5 * 10**6 + i for i in range(OUTPUTS)]
    p.serve(a, PROMPT, PROMPT + OUTPUTS - 1)
    assert [hit(p, s) for s in SHARED] == VLLM[unit, alignment, block]


def test_a_hit_inside_a_block_copies_it_and_leaves_the_source_cached():
    """The next turn hits the prompt's tail, 2,992 tokens, inside the third block: its first
    step copies that block's KV and state (one more block per group, vLLM's copy-on-write),
    the sources go back to the free queue still cached, so a third turn hits them again, and
    nothing stays held once all have finished."""
    p = pool(16, 1)
    first = list(range(PROMPT))
    p.serve(first, PROMPT, PROMPT)
    second = first + [7 * 10**6 + i for i in range(500)]
    run = p.serve(second, len(second), len(second))
    assert run.hit_tokens == 2992 and run.matched_tokens == 2992
    assert hit(p, PROMPT) == 2992
    queue = p.pool
    assert not any(queue.refs.values()) and len(queue.queue) == 200


def test_a_prompt_split_at_its_tail_moves_the_tail_state_to_a_block_of_its_own():
    """Without an in-chunk checkpoint the prefill stops at the tail (2,992), keys the running
    state there, and the next step copies it out before computing on: the cached tail state
    survives the request (one cached block more than at the block grid)."""
    p = pool(16, None)
    assert p.chunk(2080, PROMPT, 0, BUDGET) == (2992, 0)
    p.serve(list(range(PROMPT)), PROMPT, PROMPT)
    cached_states = p.pool.per_group[0]
    assert cached_states == 2  # the block boundary's (2,080) and the tail's (2,992)
    assert hit(p, 2999) == 2992 and hit(p, 2500) == 2080


def test_keys_every_unit_key_each_block_by_its_last_unit():
    """A block's key is the key of its last unit boundary (vLLM's ``BlockHashListWithBlockSize``):
    one namespace for whole blocks and tails."""
    tokens = list(range(100))
    fine, whole = token_keys(tokens, 10, 100), token_keys(tokens, 50, 100)
    assert len(fine) == 10 and fine[4] != whole[0]  # chained differently, same prefixes
    assert [fine[4] == fine[4], fine[9] == fine[9]] == [True, True]


def run_with(*overrides: str) -> None:
    plan_run(compose(["+policy=vllm", *overrides]))


def test_a_unit_that_does_not_divide_the_block_is_refused():
    with pytest.raises(ConfigError, match=r"policy.prefix_match_unit \(100\) must divide"):
        run_with("model=nemotron_h_8b", "policy.prefix_match_unit=100")


def test_a_unit_below_the_block_off_vllms_pool_is_refused():
    """The prefix tree's routes (here a separate SSM pool) key whole blocks: a finer unit there would
    be a silent wrong number, so it is an error naming the key."""
    with pytest.raises(ConfigError, match=r"policy.prefix_match_unit \(16\) below"):
        run_with("model=nemotron_h_8b", "policy.prefix_match_unit=16", "cache.ssm_gb=1")


def test_a_transformer_takes_no_other_unit_than_its_block():
    with pytest.raises(ConfigError, match="one KV-cache group"):
        run_with("model=llama3_8b", "policy.prefix_match_unit=8")


def test_a_block_keyed_finer_keeps_or_drops_its_keys_as_vllms_pool_does():
    """``FreeQueue.cache_at``: a deeper key replaces a shallower one (a partial tail promoted
    to a full block), a shallower one joins a deeper one (a tail registered on a full block),
    ``replace`` drops them all (a checkpoint re-keyed), ``move`` hands them to a copy, and
    taking the block evicts every key."""
    from simlab.engines.block_pool import FreeQueue

    q = FreeQueue(4)
    (block,) = q.take(1)
    assert q.cache_at(block, (0, 7), 80)  # the tail, 80 tokens in
    assert not q.cache_at(block, (0, 9), 100)  # promoted: the full block's key alone
    assert q.get((0, 7)) is None and q.get((0, 9)) == block
    assert not q.cache_at(block, (0, 7), 80)  # the tail again, beside the full key
    assert q.get((0, 7)) == block and q.get((0, 9)) == block
    (copy,) = q.take(1)
    q.move(block, copy)
    assert q.get((0, 7)) == copy and q.get((0, 9)) == copy and block not in q.key
    q.cache_at(copy, (0, 5), 64, replace=True)
    assert q.get((0, 7)) is None and q.get((0, 9)) is None and q.get((0, 5)) == copy
    q.free([block, copy])
    taken = q.take(4)
    assert copy in taken and q.get((0, 5)) is None and q.evicted == 1
    assert q.per_group[0] == 0
