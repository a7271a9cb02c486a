"""The engine-faithful policies (``policies/production.py``), rule by rule, on hand-made requests.

The request-for-request check against the real engines is ``tests/test_crosscheck.py``; these
pin each rule on its own so that a regression names the rule it broke.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from omegaconf import OmegaConf

from policies.engine_lru import BlockLRU, RadixLRU
from policies.lru import LRU
from policies.production import VLLM, SGLang, vllm_hybrid_block_size
from simlab.cache.contract import Semantics, Tracking
from simlab.cache.keys import BlockKeys, TokenKeys
from simlab.cache.prefix import PrefixCache
from simlab.cache.state_pool import StatePool
from simlab.config import ConfigError
from simlab.cost.hardware import Hardware
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.feeders import SessionFeeder
from simlab.fastpaths.blocks.replay import block_replay
from simlab.model.spec import ModelSpec
from simlab.run.simulate import plan_run, simulate
from tests.fixtures import CONFIGS, compose, model, policy_plugins
from traces.format import Request

LLAMA = model("llama3_8b")
A100 = Hardware.from_config(OmegaConf.load(CONFIGS / "hardware" / "a100_40gb.yaml"))
KV = LLAMA.kv_bytes_per_token


def req(i: int, tokens, output, session: int = 0, turn: int = 0) -> Request:
    return Request(
        request_id=i,
        session_id=session,
        turn=turn,
        arrival=float(i),
        input_ids=np.asarray(tokens, dtype=np.int32),
        output_ids=np.asarray(output, dtype=np.int32),
        output_len=len(output),
    )


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def step_for(policy: str, capacity: float = math.inf, overrides=None) -> RequestStep:
    admission, eviction = policy_plugins(policy, overrides)
    return RequestStep.build(LLAMA, capacity, admission, eviction, policy)


# --------------------------------------------------------------------------- committed length
def test_the_last_sampled_token_is_never_cached():
    """Turn 0 has 9 + 10 tokens; turn 1 repeats them: SGLang hits 18, the paper's policy 19."""
    first = req(0, ids(0, 9), ids(100, 10))
    second = req(1, [*ids(0, 9), *ids(100, 10), *ids(500, 5)], [7])
    for policy, hit in (("sglang", 18), ("sglang_plus", 19)):
        step = step_for(policy)
        step.serve(first)
        assert step.serve(second).hit_tokens == hit, policy


def test_token_keys_trim_only_the_last_output_token():
    r = req(0, ids(0, 5), ids(10, 3))
    assert TokenKeys(committed=True).view(r).sequence.tolist() == [0, 1, 2, 3, 4, 10, 11]
    assert TokenKeys().view(r).sequence.tolist() == [0, 1, 2, 3, 4, 10, 11, 12]


# --------------------------------------------------------------------------- SGLang radix
def test_the_prompt_end_is_a_node_boundary():
    step = step_for("sglang")
    step.serve(req(0, ids(0, 30), ids(100, 11)))
    assert sorted((n.start, n.end) for n in step.cache.nodes()) == [(0, 30), (30, 40)]
    assert sorted((n.start, n.end) for n in step_for_tree("sglang_plus").cache.nodes()) == [(0, 41)]


def step_for_tree(policy: str) -> RequestStep:
    step = step_for(policy)
    step.serve(req(0, ids(0, 30), ids(100, 11)))
    return step


def test_eviction_frees_the_output_before_the_prompt():
    step = step_for("sglang", capacity=45 * KV)
    step.serve(req(0, ids(0, 30), ids(100, 11)))  # 40 cached tokens
    step.serve(req(1, ids(1000, 6), [5]))  # needs 6: the 10-token output goes, the prompt stays
    assert step.serve(req(2, [*ids(0, 30), 9], [1])).hit_tokens == 30


def test_a_walk_that_stops_inside_a_node_refreshes_all_of_it():
    """A (t1), B (t2), then C shares A's first 4 tokens (t3): SGLang's match stamps A's whole
    leaf at t3, so the next eviction takes B; plain LRU takes A's unmatched tail."""
    a, b = req(0, ids(0, 50), [1]), req(1, ids(1000, 50), [2])
    c = req(2, [*ids(0, 4), *ids(2000, 6)], [3])
    for eviction, survivor in ((RadixLRU(), "a"), (LRU(), "b")):
        step = RequestStep.build(LLAMA, 110 * KV, SGLang(), eviction, "p")
        for r in (a, b, c):
            step.serve(r)
        step.serve(req(3, ids(5000, 40), [4]))  # forces one eviction
        kept = {n.start: n for n in step.cache.nodes()}
        has_a_tail = any(n.tokens[0] == 4 for n in kept.values())
        assert has_a_tail == (survivor == "a"), type(eviction).__name__


def test_the_match_splits_where_it_stops():
    step = step_for("sglang")
    step.serve(req(0, ids(0, 40), [1]))
    step.serve(req(1, ids(0, 25), [2]))  # input inside the cached edge: match stops at 24
    ends = sorted(n.end for n in step.cache.nodes())
    assert {24, 25} <= set(ends)


# --------------------------------------------------------------------------- SGLang pages
def paged_sglang(capacity: float = math.inf, page: int = 4) -> RequestStep:
    """SGLang with ``--page-size page`` as ``cache.page_size`` sets it up."""
    admission, eviction = policy_plugins("sglang")
    return RequestStep.build(LLAMA, capacity, admission.paged(page, LLAMA), eviction, "sglang")


def test_sglang_pages_key_the_tree_by_pages_only_for_a_transformer():
    sglang = SGLang()
    assert sglang.paged(1, LLAMA) is sglang and sglang.paged(16, model("nemotron_h_8b")) is sglang
    keys = sglang.paged(16, LLAMA).keys
    assert (keys.block_size, keys.committed, keys.radix) == (16, True, True)


def test_sglangs_paged_tree_caches_full_pages_in_radix_nodes():
    """4-token pages: 10 prompt + 7 output tokens leave 16 committed, cached as 4 pages in two
    nodes, split where the prompt's full pages end (2 pages), not one node per page; a
    sequence parting inside a page shares none of it."""
    step = paged_sglang()
    step.serve(req(0, ids(0, 10), ids(100, 7)))
    assert sorted((n.start, n.end) for n in step.cache.nodes()) == [(0, 2), (2, 4)]
    assert step.serve(req(1, [*ids(0, 6), *ids(200, 6)], [1])).hit_tokens == 4
    assert step.cache.kv_bytes == (4 + 2) * 4 * KV  # its own second page is held again


def test_sglangs_paged_allocator_keeps_a_page_free():
    """A pool of 6 four-token pages holding A (8 prompt + 4 output tokens: a 2-page prompt
    node and a 1-page output node). B's 9-token prompt takes 3 pages and SGLang's extend asks
    for a fourth free one, so A's output page goes although 3 were free; without the spare
    page (a plan that does not ask for it) A stays whole."""
    for spare, hit in ((True, 8), (False, 12)):
        step = paged_sglang(capacity=6 * 4 * KV)
        step.serve(req(0, ids(0, 8), ids(100, 5)))
        if not spare:
            step.admission = replace(step.admission, kv_page=1)  # plans without the spare page
        step.serve(req(1, ids(1000, 9), [1]))
        assert step.serve(req(2, [*ids(0, 8), *ids(100, 4), 7], [1])).hit_tokens == hit, spare


# --------------------------------------------------------------------------- vLLM blocks
def test_only_full_blocks_are_shared():
    """Two sequences agree on 10 tokens of a 16-token block: vLLM shares nothing and holds the
    block twice; a token radix shares the 10 tokens."""
    step = step_for("vllm")
    step.serve(req(0, [*ids(0, 10), *ids(100, 30)], [1]))
    second = step.serve(req(1, [*ids(0, 10), *ids(200, 30)], [2]))
    assert second.hit_tokens == 0
    assert step.cache.kv_bytes == 4 * 16 * KV  # 2 full blocks each


def test_hits_are_whole_blocks_within_input_minus_one():
    step = step_for("vllm")
    step.serve(req(0, ids(0, 40), ids(100, 9)))  # 48 committed tokens = 3 full blocks
    assert step.serve(req(1, ids(0, 48), [1])).hit_tokens == 32  # limit 47 -> 2 blocks
    assert step.serve(req(2, [*ids(0, 40), *ids(100, 8), 7], [1])).hit_tokens == 48


def test_block_keys_identify_a_block_by_content_and_give_the_tail_its_own_id():
    keys = BlockKeys(4)
    one = keys.view(req(0, ids(0, 10), ids(50, 3)))  # 12 committed tokens: 3 full blocks
    two = keys.view(req(1, ids(0, 8), [9]))
    assert one.cacheable == 3 and one.sequence.shape[0] == 3
    assert one.lookup[:2].tolist() == two.lookup[:2].tolist()
    assert one.lookup.shape[0] == 3 and one.lookup[2] < 0  # a partial input block: unique id
    assert keys.view(req(2, ids(0, 13), [1])).sequence[-1] < 0  # partial tail: held, not cached


def hash_req(i: int, hash_ids: list[int], tokens: int) -> Request:
    """A Mooncake-style request: one id per 512-token block, ``tokens`` true prompt tokens."""
    return replace(req(i, hash_ids, []), block_size=512, ref_input_tokens=tokens)


@pytest.mark.parametrize("whole_last_id", [False, True])
def test_a_hash_id_prompts_short_last_id_is_a_partial_block_vllm_never_caches(whole_last_id):
    """1,300 tokens in ids [1, 2, 3]: the last id holds 276 tokens, a partial 512-token block.
    vLLM caches the two full blocks only (the real ``KVCacheManager`` on the Mooncake trace:
    ``tests/fixtures/crosscheck/mooncake_*``), so the same prompt again, even with whole-input
    hits, reuses 1,024 tokens; ``whole_last_id`` (kvcache-simulator's rule: an id is a block)
    caches all three and reuses all 1,300. A prompt of whole blocks (1,536 tokens) is cached
    whole either way."""
    admission = VLLM(block_size=1, whole_last_id=whole_last_id)
    step = RequestStep.build(
        LLAMA, math.inf, admission, BlockLRU(), "vllm", unit_tokens=512,
        semantics=Semantics(whole_input_hit=True),
    )  # fmt: skip
    first = step.serve(hash_req(0, [1, 2, 3], 1300))
    blocks = 3 if whole_last_id else 2
    assert first.kv_bytes_admitted == blocks * 512 * KV
    assert step.serve(hash_req(1, [1, 2, 3], 1300)).hit_tokens == (1300 if whole_last_id else 1024)
    step.serve(hash_req(2, [7, 8, 9], 1536))
    assert step.serve(hash_req(3, [7, 8, 9], 1536)).hit_tokens == 1536
    keys = BlockKeys(1, whole_last_id=whole_last_id)
    view = keys.view(hash_req(4, [1, 2, 3], 1300))
    assert view.cacheable == blocks and view.sequence.shape[0] == 3  # the tail is held
    assert keys.input_blocks(hash_req(5, [1, 2, 3], 1300)) == blocks


def test_sglangs_radix_tree_holds_a_hash_id_prompts_true_tokens():
    """SGLang's radix tree over a Mooncake-style trace (the real ``RadixCache`` on the Mooncake
    trace: ``tests/fixtures/crosscheck/mooncake_*-sglang_*``). A prompt of 1,300 tokens in ids
    [1, 2, 3] holds 1,300 tokens of KV, not 3 x 512; the same prompt again reuses 1,299 (the
    hit leaves one token, not one id). A cache of exactly 1,300 + 1,100 tokens holds it and a
    1,100-token prompt together (at 512 tokens an id, admitting the second would evict the
    first). Its short last id (276 tokens) is keyed apart: a prompt [1, 2, 3, 4] of whole ids
    reuses the two whole ids only."""
    cap = (1300 + 1100) * KV
    step = RequestStep.build(LLAMA, cap, SGLang(), RadixLRU(), "sglang", unit_tokens=512)
    first = step.serve(hash_req(0, [1, 2, 3], 1300))
    assert first.kv_bytes_admitted == step.cache.kv_bytes == 1300 * KV
    assert step.serve(hash_req(1, [1, 2, 3], 1300)).hit_tokens == 1299
    assert step.serve(hash_req(2, [7, 8, 9], 1100)).bytes_evicted == 0
    assert step.cache.kv_bytes == cap
    step.cache.check_invariants()
    assert step.serve(hash_req(3, [1, 2, 3], 1300)).hit_tokens == 1299
    assert step.serve(hash_req(4, [1, 2, 3, 4], 2048)).hit_tokens == 1024
    keys = TokenKeys()
    view = keys.view(hash_req(5, [1, 2, 3], 1300))
    assert view.short == 236 and view.lookup[-1] < 0 and view.lookup[:2].tolist() == [1, 2]
    assert keys.lookup_ids(hash_req(6, [1, 2, 3], 1300)).tolist() == view.lookup.tolist()
    assert keys.lookup_ids(hash_req(7, [1, 2, 3], 1301))[-1] not in view.lookup  # unseen


def test_the_running_request_also_holds_its_partial_block():
    """Capacity 4 blocks. A leaves 3 full blocks. B needs 1 full + 1 partial block, so vLLM
    evicts one of A's blocks (room for the partial one, freed uncached when B ends): A then
    hits 2 blocks, not 3."""
    step = step_for("vllm", capacity=4 * 16 * KV)
    step.serve(req(0, ids(0, 48), [1]))  # 48 committed tokens: 3 blocks
    step.serve(req(1, ids(1000, 20), [1]))  # 20 tokens: 1 full + 1 partial
    assert step.cache.kv_bytes == 3 * 16 * KV
    assert step.serve(req(2, ids(0, 49), [1])).hit_tokens == 32


def test_block_lru_evicts_a_requests_tail_block_first():
    step = RequestStep.build(LLAMA, 3 * 16 * KV, VLLM(), BlockLRU(), "vllm")
    step.serve(req(0, ids(0, 48), [1]))
    step.serve(req(1, ids(1000, 16), [1]))  # one block: A's last block goes
    assert step.serve(req(2, ids(0, 49), [1])).hit_tokens == 32


def test_a_fully_cached_prompt_holds_the_block_it_recomputes_as_real_vllm_does():
    """4-token blocks, a pool of 4. Y and X take 2 blocks each; X again hits 1 block (the hit
    stops at ``len - 1``) and vLLM allocates a fresh block for the recomputed second one,
    evicting the least recent (Y's tail), though X's own copy is cached. So Y + 4 tokens then
    hits 4 tokens, not 8. The hits are real vLLM 0.33.0's ``KVCacheManager`` driven through
    ``crosscheck.vllm_blocks.VllmReplay`` on these four requests: after X again, its hash
    maps to two blocks (vLLM does not de-duplicate). Request by request and the one-pass block
    path agree."""
    y, x = ids(100, 8), ids(200, 8)
    trace = [req(0, y, [1]), req(1, x, [1]), req(2, x, [1]), req(3, [*y, *ids(300, 4)], [1])]
    real_vllm_hits = [0, 0, 4, 4]

    def fresh() -> RequestStep:
        step = RequestStep.build(LLAMA, 4 * 4 * KV, VLLM(block_size=4), BlockLRU(), "vllm")
        step.prepare(trace)
        return step

    step = fresh()
    records = [step.serve(r) for r in trace]
    assert [r.hit_tokens for r in records] == real_vllm_hits
    assert records[2].bytes_evicted == 4 * KV  # Y's tail makes room for X's recomputed block
    one_pass = block_replay(trace, [fresh()])[0].records
    assert np.asarray(one_pass["hit_tokens"]).tolist() == real_vllm_hits
    assert np.asarray(one_pass["bytes_evicted"]).tolist() == [r.bytes_evicted for r in records]


# --------------------------------------------------------------------------- config errors
def hybrid_sglang(kv_tokens: float, states: int) -> RequestStep:
    """SGLang on Nemotron-H with its KV pool and Mamba-slot pool sized apart."""
    admission, eviction = policy_plugins("sglang")
    kv = kv_tokens * NEMOTRON.kv_bytes_per_token
    return RequestStep.build(
        NEMOTRON,
        kv,
        admission,
        eviction,
        "sglang",
        state_pool=StatePool.given(kv, states * STATE, STATE),
    )


def test_a_hybrid_match_refreshes_the_path_up_to_its_hit_only():
    """A state at 50 and a tombstoned leaf [50, 100): a match of all 100 tokens hits 50 and
    stamps [0, 50) only (SGLang stamps ``best_match_node`` and its ancestors); a Transformer's
    match stamps every node it passes."""
    for spec, stamped in ((NEMOTRON, [True, False]), (LLAMA, [True, True])):
        cache = PrefixCache(spec, math.inf)
        cache.insert(np.arange(100, dtype=np.int32), [50, 100], 100, RadixLRU(), cuts=[50])
        upper, lower = sorted(cache.nodes(), key=lambda n: n.start)
        if spec.is_hybrid:
            cache.drop_state(lower)
        cache.now = 7.0
        lookup = cache.lookup(np.arange(101, dtype=np.int32))
        assert lookup.matched == 100 and lookup.hit == (50 if spec.is_hybrid else 100)
        RadixLRU().on_hit(cache, lookup)
        assert [cache.last_access[n.slot] == 7.0 for n in (upper, lower)] == stamped


def test_the_match_splits_when_the_request_starts():
    """The same 9-token input again: SGLang's match (limit 8) splits [0, 9) at 8 before the
    request allocates anything, and stamps both halves."""
    step = hybrid_sglang(math.inf, 10)
    step.serve(req(0, ids(0, 9), [1]))
    started = step.start(req(1, ids(0, 9), [2]), pin=False)
    assert sorted((n.start, n.end) for n in step.cache.nodes()) == [(0, 8), (8, 9)]
    assert started.lookup.split is not None and started.lookup.split.start == 8
    assert all(step.cache.last_access[n.slot] == step.cache.now for n in step.cache.nodes())


def test_the_allocation_may_evict_kv_matched_past_the_hit():
    """KV for 150 tokens. r0 leaves [0, 100) (state at 100), r1 30 more tokens. r2 shares r0's
    first 60 tokens but no state (hit 0), so it allocates all 100 of its tokens with nothing
    locked: r1's leaf, then both halves of r0's node go (the split stamped them after r1), and
    r2's prompt is inserted whole (SGLang locks only the hit's node; before, the matched 60
    stayed pinned and the admission was truncated)."""
    step = hybrid_sglang(150, 10)
    step.serve(req(0, ids(0, 100), [1]))
    step.serve(req(1, ids(1000, 30), [1]))
    r2 = [*ids(0, 60), *ids(5000, 40)]
    record = step.serve(req(2, r2, [1]))
    assert record.hit_tokens == 0 and not record.admission_truncated
    assert sorted((n.start, n.end) for n in step.cache.nodes()) == [(0, 100)]
    assert step.cache.kv_bytes == 100 * NEMOTRON.kv_bytes_per_token
    assert step.serve(req(3, [*r2, 9], [1])).hit_tokens == 100


def test_the_running_request_takes_a_mamba_slot_and_an_ancestors_state_may_go():
    """Three Mamba slots. r0 leaves states at 100 and 110. r1 extends r0 and hits 110; it
    holds a slot of its own, so publishing its prompt state at 130 needs two free: the state
    at 100, an ancestor of r1's locked node, is tombstoned (SGLang locks only the locked
    node's Mamba state), and 110's, locked, stays."""
    step = hybrid_sglang(math.inf, 3)
    step.serve(req(0, ids(0, 100), ids(500, 11)))
    r1 = step.serve(req(1, [*ids(0, 100), *ids(500, 10), *ids(900, 20)], [1]))
    assert r1.hit_tokens == 110 and not r1.admission_truncated
    cache = step.cache
    assert sorted(n.end for n in cache.nodes() if n.ckpt) == [110, 130]
    assert sorted(n.end for n in cache.nodes()) == [100, 110, 130]  # 100 keeps its KV
    cache.check_invariants()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+policy=vllm", "policy.block_size=0"], "policy.block_size must be a positive integer"),
        (["+policy=vllm", "policy.block_size=1.5"], "policy.block_size must be a positive integer"),
        (["+policy=vllm", "policy.mamba_cache_mode=all"], "policy.mamba_cache_mode"),
        (["+policy=vllm", "cache.page_size=32"], "cache.page_size"),
        (["+policy=sglang", "policy.mamba=ring"], "policy.mamba must be one of"),
    ],
)
def test_bad_policy_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan_run(compose(overrides))


# --------------------------------------------------------------------------- vLLM hybrids
def test_vllm_hybrid_block_size_is_computed_from_the_model():
    """Nemotron-H-8B with a BF16 state: 528 tokens (vLLM #40696); FP32 state: 1040."""
    nemotron = model("nemotron_h_8b")
    assert vllm_hybrid_block_size(nemotron, 16) == 528
    fp32 = ModelSpec.from_config(
        OmegaConf.merge(
            OmegaConf.load(CONFIGS / "model" / "nemotron_h_8b.yaml"), {"ssm_state_dtype_bytes": 4}
        )
    )
    assert vllm_hybrid_block_size(fp32, 16) == 1040
    assert VLLM().for_model(LLAMA).block_size == 16


def test_vllm_align_never_hits_a_prompt_of_one_block_or_less():
    """The block-size cliff: a state is cached only on a block boundary below the prompt end,
    so a prompt of at most 528 tokens is never a hit, however often it repeats."""
    nemotron = model("nemotron_h_8b")
    admission, eviction = policy_plugins("vllm")
    step = RequestStep.build(nemotron, math.inf, admission, eviction, "vllm")
    short, long = ids(0, 500), ids(0, 1200)
    hits = [
        step.serve(req(i, r, [1, 2])).hit_tokens for i, r in enumerate([short] * 3 + [long] * 3)
    ]
    assert hits[:3] == [0, 0, 0]
    assert hits[3:] == [0, 1056, 1056]  # floor(1199 / 528) = 2 blocks, after the first sighting


def test_sglang_extra_buffer_tracks_states_on_the_grid():
    """A 600-token miss tracks a prefill state at 512 (2 grid steps from the hit) and, with
    300 output tokens (899 committed), the last decode-tracked one at 768; the prompt end and
    the committed end get none."""
    admission, eviction = policy_plugins("sglang", ["policy.mamba=extra_buffer"])
    step = RequestStep.build(model("nemotron_h_8b"), math.inf, admission, eviction, "sglang")
    step.serve(req(0, ids(0, 600), ids(5000, 300)))
    assert sorted(n.end for n in step.cache.nodes() if n.ckpt) == [512, 768]
    assert step.serve(req(1, [*ids(0, 600), *ids(5000, 299), 1], [1])).hit_tokens == 768


@pytest.mark.parametrize(
    ("start", "end", "branch", "state"),
    [
        (0, 739, 0, 512),  # one extend: whole grid steps from its start
        (0, 264, 0, 256),  # the same prompt chunked as 264 + 475 ...
        (264, 739, 0, 520),  # ... tracks on each chunk's own grid
        (600, 800, 0, None),  # an extend shorter than the grid tracks nothing
        (0, 1000, 512, 512),  # the branch point, inside the extend on its grid
        (100, 1000, 512, 868),  # off the extend's grid: not tracked
        (600, 1000, 512, 856),  # before the extend: not tracked
    ],
)
def test_sglang_extra_buffer_tracks_a_state_per_extend_on_its_own_grid(start, end, branch, state):
    assert Tracking(256, 256, branch).extend(start, end) == state


def test_sglang_extra_buffer_decode_tracks_every_interval_crossed():
    tracking = Tracking(256, 512)
    assert tracking.decode(600, 1038) == 1024
    assert tracking.decode(1024, 1500) is None  # the last boundary lies before the steps


def test_sglang_extra_buffer_under_a_scheduler_tracks_what_its_chunks_and_decodes_ran():
    """A 739-token prompt prefilled as 264 + 475 tokens publishes 256 and 520, not 512. Its
    decode steps cross 768 in a step riding a prefill batch (untracked) and 1024 in a
    decode-only one: the finish publishes 1024 alone. A second turn hits it; a prompt whose
    decode crossed only in mixed steps publishes nothing at its finish."""
    admission, eviction = policy_plugins("sglang", ["policy.mamba=extra_buffer"])
    step = RequestStep.build(model("nemotron_h_8b"), math.inf, admission, eviction, "sglang")
    started = step.start(req(0, ids(0, 739), ids(5000, 300)))
    assert started.plan.ckpts == [512, 1024] and step.tracks_runs(started)
    assert step.track_extend(started, 0, 264) == 256
    step.checkpoint(started, 256)
    assert step.track_extend(started, 264, 739) == 520
    step.prefilled(started)
    step.track_decode(started, 739, 767)  # 768 is crossed by a step riding a prefill batch
    step.track_decode(started, 768, 1038)
    step.finish(started)
    assert sorted(n.end for n in step.cache.nodes() if n.ckpt) == [256, 520, 1024]
    assert step.serve(req(1, [*ids(0, 739), *ids(5000, 299), 1], [1])).hit_tokens == 1024
    second = step.start(req(2, ids(9000, 600), ids(9900, 200)))
    assert step.tracks_runs(second) and step.track_extend(second, 0, 600) == 512
    step.prefilled(second)
    step.track_decode(second, 600, 767)
    step.track_decode(second, 768, 799)
    step.finish(second)
    assert sorted(n.end for n in step.cache.nodes() if n.ckpt and n.end < 800) == [256, 512, 520]


def test_a_separate_ssm_pool_evicts_states_in_the_order_they_were_used():
    """Two slots; A and B are admitted at the same tick of the clock, then A's state is
    published again (it is cached already: SGLang moves it to the front of its Mamba LRU).
    C's state evicts B's, the least recently used, not A's (the older node)."""
    step = hybrid_sglang(math.inf, 2)
    cache = step.cache
    a, b, c = (np.asarray(ids(k, 10), np.int32) for k in (0, 100, 200))
    for seq in (a, b, a, c):
        cache.insert(seq, [10], 10, step.eviction)
    assert sorted(int(n.tokens[0]) for n in cache.nodes() if n.ckpt) == [0, 200]


@pytest.mark.parametrize(
    ("overrides", "holds", "cap"),
    [
        ([], 1, 3),
        (["policy.mamba=extra_buffer"], 3, 5),
        (["policy.mamba=extra_buffer", "policy.admission.tracking_slots=1"], 2, 4),
    ],
)
def test_sglang_running_requests_hold_and_are_capped_by_their_mamba_slots(overrides, holds, cap):
    """A running request holds its own slot and with ``extra_buffer`` its ping-pong track
    slots, as many as its tracking slots (2 under the overlap scheduler, 1 without:
    ``HybridReqToTokenPool(enable_overlap_schedule=...)``), while SGLang's running cap divides
    the slots by 3 plus the tracking slots: without overlap the real scheduler under load
    holds 2 slots per request and caps 18 slots at 4 requests."""
    admission, _ = policy_plugins("sglang", overrides)
    assert admission.running_state_slots == holds
    assert admission.slots_per_running_request == cap


# --------------------------------------------------------------------------- separate pools
NEMOTRON = model("nemotron_h_8b")
STATE = NEMOTRON.ssm_state_bytes


def test_separate_pools_never_overflow_either_and_tombstone_inner_states():
    """KV and SSM states in pools of their own (SGLang's sizing): neither is ever exceeded;
    a full SSM pool frees states, an inner node's alone (it keeps its KV)."""
    admission, eviction = policy_plugins("sglang")
    step = RequestStep.build(
        NEMOTRON,
        4000 * NEMOTRON.kv_bytes_per_token,
        admission,
        eviction,
        "sglang",
        state_pool=StatePool.given(4000 * NEMOTRON.kv_bytes_per_token, 3 * STATE, STATE),
    )
    system = ids(0, 300)
    tombstones = 0
    for i in range(12):
        step.serve(req(i, [*system, *ids(1000 * (i + 1), 40)], ids(50000 + 100 * i, 20)))
        cache = step.cache
        assert cache.kv_bytes <= cache.capacity and cache.ssm_bytes <= 3 * STATE
        cache.check_invariants()
        tombstones += sum(1 for n in cache.nodes() if n.children and not n.ckpt)
    assert tombstones > 0
    assert step.cache.ssm_bytes == 3 * STATE


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=llama3_8b", "cache.ssm_gb=1"], "has no SSM states"),
        (["model=nemotron_h_8b", "cache.size_gb=2", "cache.ssm_gb=2"], "less than cache.size_gb"),
        (["model=nemotron_h_8b", "cache.ssm_gb=0.01"], "smaller than one SSM state"),
        (["model=nemotron_h_8b", "cache.ssm_gb=abc"], "cache.ssm_gb: must be a number"),
    ],
)
def test_bad_separate_pools_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan_run(compose(["+policy=sglang", *overrides]))


def test_a_kv_pool_that_cannot_hold_the_longest_request_is_refused():
    cfg = compose(
        [
            "+policy=sglang",
            "model=nemotron_h_8b",
            "engine=replay",
            "cache.size_gb=0.12",
            "cache.ssm_gb=0.11",
            "bounds.enabled=false",
            "report=false",
        ]
    )
    with pytest.raises(ConfigError, match="cannot hold the longest request"):
        simulate(cfg)


def test_a_timed_engine_publishes_the_prompt_when_its_prefill_ends():
    """Two sessions send the same 3,000-token prompt 0.05 s apart; the first is still decoding
    (200 tokens) when the second is scheduled. SGLang and vLLM publish the prompt at the end of
    its prefill, so the second hits it; the paper's sglang_plus admits only at the finish."""
    prompt = ids(0, 3000)
    requests = [
        Request(
            i,
            i,
            0,
            0.05 * i,
            np.asarray([*prompt, 9000 + i], np.int32),
            np.asarray(ids(20000, 200), np.int32),
            200,
        )
        for i in range(2)
    ]
    hits = {}
    for policy in ("sglang", "vllm", "sglang_plus"):
        admission, eviction = policy_plugins(policy)
        step = RequestStep.build(LLAMA, math.inf, admission, eviction, policy)
        world = TimedEngine(hardware=A100).world(requests, step)
        records = world.run(SessionFeeder(requests))
        hits[policy] = sorted(r.hit_tokens for r in records)
    assert hits == {"sglang": [0, 3000], "vllm": [0, 2992], "sglang_plus": [0, 0]}
