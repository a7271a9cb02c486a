"""Block keys and the walk of a trace over whole blocks sharing a session's context
(simlab/cache/keys.py ``BlockKeys.session_blocks``, simlab/fastpaths/blocks/walk.py ``block_paths``).

The oracle is keying every block of every request (``BlockKeys(share_prefixes=False)``): the
views and the walk that take a session's shared context from its previous request must give
the same ids, lengths and paths. Real traces: agent sessions (SWE-bench), chats (ShareGPT,
LMSys) in 16- and 32-token blocks with and without the committed last token, and Mooncake's hash ids with and
without a short last id counted whole."""

from __future__ import annotations

import numpy as np
import pytest

from simlab.cache.keys import BlockKeys, shared_prefix
from simlab.fastpaths.blocks.replay import step_keys
from simlab.fastpaths.blocks.walk import block_paths
from simlab.run.simulate import plan_run, policy_step, trace_requests
from tests.fixtures import compose
from tests.test_capacities import MOONCAKE

QUIET = ["bounds.enabled=false", "report=false", "engine=replay", "model=llama3_8b"]
CASES = {
    "swebench, 16-token blocks": ["trace=swebench", "trace.limit=120", "+policy=vllm"],
    "sharegpt, 32-token blocks": [
        "trace=sharegpt",
        "trace.limit=300",
        "+policy=vllm",
        "policy.block_size=32",
    ],
    "sharegpt, 16-token blocks, uncommitted": [
        "trace=sharegpt",
        "trace.limit=300",
        "+policy=clairvoyant_blocks",
        "policy.admission.committed=false",
    ],
    "lmsys, 16-token blocks": ["trace=lmsys", "+policy=vllm"],
    "mooncake, hash ids": [
        "trace=mooncake",
        "trace.limit=600",
        "+policy=vllm",
        "policy.block_size=512",
    ],
    "mooncake, hash ids, a short last id whole": [
        "trace=mooncake",
        "trace.limit=600",
        "+policy=vllm",
        "policy.block_size=512",
        "policy.admission.whole_last_id=true",
    ],
}


def requests_and_keys(overrides: list[str]):
    cfg = compose([*overrides, *QUIET])
    plan = plan_run(cfg)
    _, requests = trace_requests(plan.trace, plan.settings)
    (spec,) = plan.policies.values()
    step = policy_step(spec, plan.model, plan.settings, requests[0].block_size)
    keys = step_keys(step)
    assert isinstance(keys, BlockKeys)
    return requests, keys


def fresh_pair(keys: BlockKeys) -> tuple[BlockKeys, BlockKeys]:
    """Two fresh key tables of the scheme: one keying every block, one sharing sessions'."""
    plain = BlockKeys(keys.block_size, keys.committed, keys.whole_last_id, share_prefixes=False)
    return plain, BlockKeys(keys.block_size, keys.committed, keys.whole_last_id)


@pytest.mark.parametrize("case", list(CASES))
def test_sharing_a_sessions_context_keys_every_request_alike(case):
    """Every view (a request viewed twice too, as at its lookup and its admission) is the one
    that keying every block gives."""
    overrides = CASES[case]
    if "trace=mooncake" in overrides and not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    requests, keys = requests_and_keys(overrides)
    plain, sharing = fresh_pair(keys)
    shared = 0
    for req in requests:
        for _ in range(2):
            want, got = plain.view(req), sharing.view(req)
            assert got.lookup.tolist() == want.lookup.tolist()
            assert got.sequence.tolist() == want.sequence.tolist()
            assert (got.cacheable, got.prompt, got.short) == (
                want.cacheable,
                want.prompt,
                want.short,
            )
        shared += int(sharing._latest[req.session_id][1].shape[0])
    assert plain._ids == sharing._ids  # the same contents, the same ids
    assert shared > 0


@pytest.mark.parametrize("case", list(CASES))
def test_sharing_a_sessions_context_gives_the_same_paths(case):
    overrides = CASES[case]
    if "trace=mooncake" in overrides and not MOONCAKE.is_file():
        pytest.skip(f"no trace at {MOONCAKE}")
    requests, keys = requests_and_keys(overrides)
    plain, sharing = fresh_pair(keys)
    want = block_paths(requests, plain)
    got = block_paths(requests, sharing)
    assert got == want
    assert len(got.parent) > 1 and sum(map(len, got.nodes)) > len(got.parent)  # blocks reused


def test_shared_prefix_counts_the_leading_equal_ids():
    a = np.array([1, 2, 3, 4, 5, 6, 7])
    assert shared_prefix(a, np.array([1, 2, 3, 4, 5, 9])) == 5
    assert shared_prefix(a, a[:5]) == 5
    assert shared_prefix(a, np.array([9])) == 0
    assert shared_prefix(a, a) == 7
    assert shared_prefix(a, a[:0]) == 0


def test_a_session_past_the_kept_ones_is_keyed_alike(monkeypatch):
    """With room for 3 sessions' last views, requests of older sessions key every block: the
    same views still, and no more than 3 kept."""
    from simlab.cache import keys as keys_module

    monkeypatch.setattr(keys_module, "SESSIONS_KEPT", 3)
    requests, keys = requests_and_keys(CASES["sharegpt, 32-token blocks"])
    plain, sharing = fresh_pair(keys)
    for req in requests:
        want, got = plain.view(req), sharing.view(req)
        assert got.sequence.tolist() == want.sequence.tolist()
        assert got.lookup.tolist() == want.lookup.tolist()
        assert len(sharing._latest) <= 3
    assert len({r.session_id for r in requests}) > 3
