"""``policy.compat=reference``: simlab's paper policies with the Marconi reference code's
semantics, checked request by request against an independent model of that code
(``tests/marconi_reference_model.py``), and against the real reference code's per-request hits
(``tests/fixtures/marconi_reference``, recorded by ``crosscheck/marconi_reference.py``)."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from policies.flop_aware import FlopAware
from policies.judicious import Judicious
from policies.lru import LRU
from simlab.cache.contract import Semantics
from simlab.cache.prefix import PrefixCache
from simlab.config import ConfigError, run_settings
from simlab.engines.replay import replay_step
from simlab.engines.step import RequestStep
from simlab.model.spec import ModelSpec
from simlab.run.compat import semantics_for, with_compat
from simlab.run.plan import trace_spec
from simlab.run.simulate import load_trace, policy_spec, policy_step
from tests.fixtures import compose, model
from tests.marconi_reference_model import HybridShape, ReferenceTree
from traces.format import Request
from traces.paths import resolve_data_dir
from traces.swebench import TAR_RELATIVE

HYBRID = model("marconi_7b")


@functools.cache
def requests(trace: str) -> tuple[Request, ...]:
    overrides = [f"trace={trace}"] + (["trace.limit=10"] if trace == "swebench" else [])
    cfg = compose(overrides)
    return tuple(load_trace(trace_spec(cfg), run_settings(cfg)).requests())


def simlab_hits(
    trace: str, policy: str, gb: float, alpha: float, compat: str, extra: tuple = ()
) -> list[int]:
    overrides = [f"+policy={policy}", f"policy.compat={compat}", f"cache.size_gb={gb}", *extra]
    if policy == "marconi":
        overrides += [f"policy.alpha={alpha}", "policy.tuning.enabled=false"]
    cfg = compose(overrides)
    step = policy_step(
        policy_spec(policy, cfg.policy), ModelSpec.from_config(cfg.model), run_settings(cfg)
    )
    return [r.hit_tokens for r in replay_step(list(requests(trace)), step)]


def reference_hits(
    trace: str, policy: str, gb: float, alpha: float, bugs: bool, **flags: bool
) -> list[int]:
    version = 2 if policy == "marconi" else 1
    tree = ReferenceTree(gb * 1e9, version, alpha=alpha, bugs=bugs, **flags)
    return [tree.serve(r.input_ids.tolist(), r.output_ids.tolist()) for r in requests(trace)]


def needs_data(trace: str) -> None:
    tar = resolve_data_dir() / TAR_RELATIVE
    if trace == "swebench" and not tar.is_file():
        pytest.skip(f"SWE-bench trajectories not at {tar}")


CASES = [
    ("sharegpt", policy, gb, alpha)
    for gb in (1.0, 2.0)
    for policy, alpha in (("marconi", 0.0), ("marconi", 1.0), ("sglang_plus", 0.0))
] + [
    ("swebench", policy, gb, alpha)
    for gb in (4.0, 8.0)
    for policy, alpha in (("marconi", 0.0), ("marconi", 1.0), ("sglang_plus", 0.0))
]


def test_the_model_shape_is_the_paper_preset():
    shape = HybridShape()
    assert (shape.kv_per_token, shape.state_bytes) == (
        HYBRID.kv_bytes_per_token,
        HYBRID.ssm_state_bytes,
    )


@pytest.mark.parametrize(("trace", "policy", "gb", "alpha"), CASES)
def test_compat_reference_hits_equal_the_reference_model(trace, policy, gb, alpha):
    needs_data(trace)
    sim = simlab_hits(trace, policy, gb, alpha, "reference")
    ref = reference_hits(trace, policy, gb, alpha, bugs=True)
    assert sum(ref) < sum(len(r.input_ids) for r in requests(trace))  # contended: evictions
    assert sim == ref


def test_reference_fixed_is_the_reference_without_its_bugs():
    fixed = simlab_hits("sharegpt", "marconi", 2.0, 1.0, "reference_fixed")
    assert fixed == reference_hits("sharegpt", "marconi", 2.0, 1.0, bugs=False)
    assert fixed != reference_hits("sharegpt", "marconi", 2.0, 1.0, bugs=True)


def test_simlab_semantics_differ_from_the_reference():
    """The four choices of the notes move hits even at alpha = 0 (pinning, ties, the branch
    point, the clock), so the differential test above can fail."""
    default = simlab_hits("sharegpt", "marconi", 2.0, 0.0, "null")
    assert default != reference_hits("sharegpt", "marconi", 2.0, 0.0, bugs=True)


# ------------------------------------------------------------------------ the switches
def test_presets_set_every_switch():
    pcfg = with_compat(policy_dict(["+policy=marconi", "policy.compat=reference"]))
    evict = pcfg["eviction"]
    assert evict["memory"] == "path" and evict["recency"] == "inverse_age"
    assert evict["ties"] == "dfs" and evict["mlp_bug"] is True
    sglang = with_compat(policy_dict(["+policy=sglang_plus", "policy.compat=reference"]))
    assert sglang["eviction"]["ties"] == "heap"
    assert sglang["eviction"]["refreshes_insert_path"] is True
    assert evict["miscounts_freed_bytes"] is True
    assert pcfg["admission"]["branch_on"] == "sequence"
    assert semantics_for(pcfg) == Semantics("operation", False, True, True, True)
    vllm = policy_dict(["+policy=vllm_plus", "policy.compat=reference"])
    assert semantics_for(vllm) == Semantics("operation", False, True, True, False, 32)
    fixed = with_compat(policy_dict(["+policy=marconi", "policy.compat=reference_fixed"]))
    assert fixed["eviction"]["mlp_bug"] is False and fixed["eviction"]["memory"] == "path"
    plain = policy_dict(["+policy=marconi"])
    assert with_compat(plain) is plain and semantics_for(plain) == Semantics()


def policy_dict(overrides: list[str]) -> dict:
    """The composed ``policy`` section as plain values (what a plan's policy spec reads)."""
    policy = OmegaConf.to_container(compose(overrides).policy, resolve=True)
    assert isinstance(policy, dict)
    return policy


def test_a_switch_alone_changes_the_run():
    """``memory=path`` on its own (simlab's semantics otherwise) keeps shallow shared
    prefixes where ``own`` keeps deep leaves: the hits differ."""
    base = simlab_hits("sharegpt", "marconi", 2.0, 1.0, "null")
    cfg = compose(
        [
            "+policy=marconi",
            "cache.size_gb=2",
            "policy.alpha=1",
            "policy.tuning.enabled=false",
            "policy.eviction.memory=path",
        ]
    )
    step = policy_step(policy_spec("marconi", cfg.policy), HYBRID, run_settings(cfg))
    assert [r.hit_tokens for r in replay_step(list(requests("sharegpt")), step)] != base


def test_reference_insertion_may_exceed_the_capacity():
    """The reference inserts whatever the capacity: a sequence larger than the cache is
    admitted whole (simlab's own insertion truncates it)."""
    seq = np.arange(1, 40_001, dtype=np.int32)
    capacity = 1e9  # about 15K tokens of KV with states
    ref = RequestStep.build(
        HYBRID,
        capacity,
        Judicious(branch_on="sequence"),
        FlopAware(alpha=0.0),
        "marconi",
        semantics=Semantics(reference_insert=True, pin_insert=False),
    )
    ref.serve(Request(0, 0, 0, 0.0, seq[:30_000], seq[30_000:], 10_000))
    assert ref.cache.used_bytes > capacity
    ref.cache.check_invariants()
    own = RequestStep.build(HYBRID, capacity, Judicious(), FlopAware(alpha=0.0), "marconi")
    record = own.serve(Request(0, 0, 0, 0.0, seq[:30_000], seq[30_000:], 10_000))
    assert record.admission_truncated and own.cache.used_bytes <= capacity


def test_reference_vllm_plus_inserts_past_capacity():
    """The reference vLLM+ (bug 4 of the notes) evicts what its block estimate asks, then
    inserts the whole sequence: a 1 GB cache (about 1,100 tokens at 902,656 B per token) ends
    up holding a 3,200-token sequence; simlab's own vLLM+ stops at the capacity."""
    seq = np.arange(1, 3_201, dtype=np.int32)
    request = Request(0, 0, 0, 0.0, seq[:3_000], seq[3_000:], 200)
    used = {}
    for preset in ("reference", "null"):
        cfg = compose(["+policy=vllm_plus", f"policy.compat={preset}", "cache.size_gb=1"])
        step = policy_step(policy_spec("vllm_plus", cfg.policy), HYBRID, run_settings(cfg))
        step.serve(request)
        step.cache.check_invariants()
        used[preset] = step.cache.used_bytes
    assert used["reference"] == 100 * (32 * HYBRID.kv_bytes_per_token + HYBRID.ssm_state_bytes)
    assert used["reference"] > 1e9 >= used["null"]


def test_reference_vllm_plus_estimates_in_a_hash_id_traces_ids():
    """On ids of 512 tokens vLLM+'s 32-token block is one id holding 16 states (one per 32
    tokens), and so is its insertion estimate: distinct 4-id requests through a cache of 10 ids
    stay within one id of it (the estimate's own root block). In tokens against ids the
    estimate went negative and nothing was evicted (a Mooncake run held 33.7 GB in a 20 GB
    cache)."""
    per_id = 512 * HYBRID.kv_bytes_per_token + 16 * HYBRID.ssm_state_bytes
    cfg = compose(["+policy=vllm_plus", "policy.compat=reference", "cache.size_gb=1"])
    settings = run_settings(cfg)
    settings = replace(settings, cache=replace(settings.cache, size_gb=10 * per_id / 1e9))
    step = policy_step(policy_spec("vllm_plus", cfg.policy), HYBRID, settings, unit_tokens=512)
    empty = np.zeros(0, dtype=np.int32)
    for i in range(6):
        ids = np.arange(4 * i + 1, 4 * i + 5, dtype=np.int32)
        step.serve(Request(i, i, 0, 0.0, ids, empty, 1, block_size=512))
        assert step.cache.used_bytes <= 11 * per_id
    assert step.cache.used_bytes > 9 * per_id


def test_the_whole_input_may_hit_under_the_reference():
    seq = np.arange(1, 101, dtype=np.int32)
    for whole, expected in ((True, 100), (False, 0)):
        cache = PrefixCache(HYBRID, 1e12, semantics=Semantics(whole_input_hit=whole))
        cache.insert(seq, [100], 100, FlopAware())
        assert cache.lookup(seq).hit == expected


def test_the_descent_bug_credits_what_is_not_a_prefix():
    """The notes' example: the tree holds [1,2,3] -> [4,5,6] -> [9,10]; the reference credits
    the query [1,2,3,4,9,10,11] with 5 reusable tokens and a 6-token match (truth: 3 and 4)."""
    chain = np.array([1, 2, 3, 4, 5, 6, 9, 10], dtype=np.int32)
    query = np.array([1, 2, 3, 4, 9, 10, 11], dtype=np.int32)
    for descent, expected in ((True, (5, 6)), (False, (3, 4))):
        cache = PrefixCache(HYBRID, 1e12, semantics=Semantics(partial_descent=descent))
        for end in (3, 6, 8):
            cache.insert(chain, [end], end, FlopAware())
        found = cache.lookup(query)
        assert (found.hit, found.matched) == expected
        tree = ReferenceTree(1e12, 2, bugs=False, descent_bug=descent)
        for end in (3, 6, 8):
            tree.insert(tuple(chain[:end].tolist()))
        _, reusable, prefix = tree.match_prefix(tuple(query.tolist()))
        assert (reusable, prefix) == expected


# ------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("policy.compat=referense", "policy.compat"),
        ("+policy.semantics.clok=operation", "policy.semantics"),
        ("+policy.semantics.clock=tick", "policy.semantics.clock"),
        ("policy.eviction.memory=edge", "eviction.memory"),
        ("+policy.semantics.pin_insert=false", "policy.semantics.pin_insert"),
        ("+policy.semantics.block_estimate=-1", "policy.semantics.block_estimate"),
    ],
)
def test_bad_compat_settings_name_the_key(override, key):
    cfg = compose(["+policy=marconi", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        policy_step(policy_spec("marconi", cfg.policy), HYBRID, run_settings(cfg))


# ------------------------------------------------------------------------ the real code
REAL = Path(__file__).parent / "fixtures" / "marconi_reference"


def real_case(csv: Path) -> tuple[str, str, float, float, pd.DataFrame]:
    case = json.loads((REAL / "manifest.json").read_text())["cases"][csv.stem]
    trace = case["trace_overrides"][0].removeprefix("trace=")
    needs_data(trace)
    policy = "marconi" if case["evict_policy_version"] == 2 else "sglang_plus"
    expected = pd.read_csv(csv)
    assert expected["request_id"].tolist() == [r.request_id for r in requests(trace)]
    return trace, policy, case["capacity_bytes"] / 1e9, float(case["eff_weight"]), expected


@pytest.mark.parametrize("csv", sorted(REAL.glob("*.csv")), ids=lambda p: p.stem)
def test_the_model_equals_the_real_reference_code(csv):
    """The independent model, with the fork's bugs (the descent bug only), gives the real
    code's hit on every request: the model the differential tests above use is right."""
    trace, policy, gb, alpha, expected = real_case(csv)
    hits = reference_hits(trace, policy, gb, alpha, bugs=False, descent_bug=True)
    assert hits == expected["reference_hit"].tolist()


@pytest.mark.parametrize("csv", sorted(REAL.glob("*.csv")), ids=lambda p: p.stem)
def test_hits_equal_the_real_reference_code(csv):
    """Per-request hits of the Marconi reference code itself (the public fork
    meghrathod/marconi, which fixes the MLP and freed-bytes bugs and keeps the descent bug),
    driven over simlab's requests by ``crosscheck/marconi_reference.py``: simlab's
    ``reference_fixed`` preset with ``partial_descent`` gives the same hit on every request."""
    trace, policy, gb, alpha, expected = real_case(csv)
    sim = simlab_hits(
        trace, policy, gb, alpha, "reference_fixed", ("+policy.semantics.partial_descent=true",)
    )
    assert sim == expected["reference_hit"].tolist()


def test_the_heap_tie_order_is_the_real_codes(monkeypatch):
    """SWE-bench at 2 GB: two SGLang+ leaves share an access time and the real code's
    ``heapq`` (by ``last_access_time`` alone) picks one; the oldest-node rule picks the other
    and differs from the real code on a request."""
    csv = REAL / "swebench_2gb_sglang_plus.csv"
    trace, policy, gb, alpha, expected = real_case(csv)
    fixed = ("+policy.semantics.partial_descent=true",)
    switches = LRU.reference_switches
    oldest_ties = switches["reference_fixed"] | {"ties": "oldest"}
    monkeypatch.setattr(LRU, "reference_switches", switches | {"reference_fixed": oldest_ties})
    oldest = simlab_hits(trace, policy, gb, alpha, "reference_fixed", fixed)
    assert oldest != expected["reference_hit"].tolist()


def test_lru_ties_are_checked():
    with pytest.raises(ValueError, match=r"eviction\.ties"):
        LRU(ties="dfs")
