"""The timed engine on the shared KV pool under load, against SGLang 0.5.23's own scheduler
(``crosscheck/sglang_concurrent.py``'s fixtures: ``get_next_batch_to_run``, ``PrefillAdder``
with the new token ratio, ``retract_decode``, over a ``RadixCache`` on Llama-3-8B), with its
default batching (``engine.batching=prefill_first``) and with ``--enable-mixed-chunk``
(``mixed``).

Every request agrees with SGLang on every column (hit, last hit, retractions, scheduling,
first-token and finishing step) in all eight cases (0.5 and 1 GB, arrivals 1 and 4 steps
apart, both batchings; 9-23 retractions each), so a regression in simlab's admission,
batching, ratio, retraction or in what a retracted request matches and publishes fails them.

The hybrid cases run the same scheduler over SGLang's ``UnifiedRadixCache[FULL,MAMBA]``
(``no_buffer``) on Nemotron-H 8B, its Mamba pool split off the budget as SGLang splits it
(``cache.ssm_gb``) and ``max_running_requests`` capped by it (``slots // 3``): every request
agrees on every column, where the Mamba pool binds (2 and 5 GB at SGLang's default ratio 0.9:
6 and 15 running) and where the KV pool binds too (1 GB, ratio 9: 5 running, 6,097 KV tokens,
5-7 retractions). With the Mamba pool 19 and 39 times the KV pool (a few thousand KV tokens,
15-28 retractions) later turns hit a retracted request's recompute, published with its
sampled outputs and the state at their end: every request agrees on every column there too.

SWE-bench agent sessions (the 10-instance slice, 307 requests of 1.5-38K tokens, every prompt
chunked over several steps) agree on every column too, on both models and both batchings:
Llama-3-8B at 8 GB (4-6 retractions, one retracted request re-hitting into its own outputs) and
16 GB with arrivals 32 steps apart, Nemotron-H at 1.5 GB (4 running, one retraction), 5 GB and
10 GB at ratio 9 (57 running over 61,035 KV tokens, 4-6 retractions).

With ``extra_buffer`` (SGLang's choice for Nemotron-H; here without the overlap scheduler, so
its running cap is ``slots // 4`` and a request holds one track slot,
``policy.admission.tracking_slots=1``) every request agrees
on every column too, on ShareGPT and on the SWE-bench sessions (whose prompts are chunked over
up to 19 steps), where the Mamba pool binds and where the KV pool binds too (3-4 retractions):
a prefill tracks one state per extend, on the grid counted from the chunk's start, and each
chunk publishes its own; a decode step riding a prefill batch tracks nothing; the finish
publishes only the last decode-tracked state; a publish whose state is cached already
refreshes it; a chunked prompt publishes after the step's finished requests; and a publish
is newer than every match before it (SGLang stamps each access from one global counter).

With ``--page-size`` 16 and 64 (SGLang's ``PagedTokenToKVPoolAllocator``; ShareGPT at 0.5 and
1 GB, the SWE-bench slice at 8 GB, both batchings) every request agrees on every column too:
running requests hold whole pages, the admission charges them, allocation evicts a page more
per request, and a retracted request's fill ids are pages.

With ``--max-prefill-tokens`` 1,024 below the 2,048 chunk budget, and with chunked prefill off
(``--chunked-prefill-size -1``, the cap 1,024 or SGLang's 16,384), every request agrees on
every column too (ShareGPT and SWE-bench, both models, page 1 and 16): the pass ends once its
page-ceiled extends spend the cap, and without chunks a prompt reaching what is left waits
unless it is the pass's first. Without these rules 3.8-38% of the requests were scheduled at
the same step.

Under SGLang's default overlap scheduler (``--overlap``: ``event_loop_overlap``, each batch
planned before the last one's result is processed) the timed engine with
``engine.overlap=true`` agrees on every column too: in 31 Llama-3-8B cases over the settings
above, and in 26 Nemotron-H cases over ``extra_buffer`` (SGLang runs no other hybrid strategy
under overlap), whose requests then hold two track slots each."""

from __future__ import annotations

import pandas as pd
import pytest

from simlab.experiments.crosscheck import load_cases
from simlab.experiments.crosscheck_load import SGLANG_FIXTURES, compare

MAX_PREFILL_TOKENS = 16384  # SGLang's --max-prefill-tokens default

CASES_ALL = load_cases(SGLANG_FIXTURES)
#: SGLang's overlap scheduler (``event_loop_overlap``, ``*_overlap``): ``engine.overlap=true``
OVERLAP_ALL = [c for c in CASES_ALL if c.get("overlap")]
NORMAL = [c for c in CASES_ALL if c not in OVERLAP_ALL]
#: Llama-3-8B over a RadixCache, and Nemotron-H over ``extra_buffer`` (two track slots)
OVERLAP = [c for c in OVERLAP_ALL if "mamba_slots" not in c]
OVERLAP_HYBRID = [c for c in OVERLAP_ALL if c not in OVERLAP]
#: ``--max-prefill-tokens`` below the chunk budget, or chunked prefill off (``_mptN``,
#: ``_unchunked``): ``engine.max_prefill_tokens``, ``engine.token_budget=null``
LIMITS = [
    c
    for c in NORMAL
    if c["max_prefill_tokens"] != MAX_PREFILL_TOKENS or c["chunked_prefill_size"] <= 0
]
ALL = [c for c in NORMAL if c not in LIMITS]
#: ``--page-size`` 16 and 64 (``PagedTokenToKVPoolAllocator``) on Llama-3-8B
PAGED = [c for c in ALL if c["block_size"] > 1]
SHAREGPT = [c for c in ALL if "trace=sharegpt" in c["overrides"] and c not in PAGED]
CASES = [c for c in SHAREGPT if "mamba_slots" not in c]  # Llama-3-8B over a RadixCache


def mamba_ratio(case: dict) -> float:
    """The Mamba pool's bytes over the KV pool's (SGLang's ``--mamba-full-memory-ratio``)."""
    return case["ssm_gb"] / (case["size_gb"] - case["ssm_gb"])


#: Nemotron-H over the Mamba radix cache, no_buffer and extra_buffer (ShareGPT and SWE-bench)
NO_BUFFER = [c for c in SHAREGPT if c.get("mamba_strategy") == "no_buffer"]
#: the Mamba pool 19 and 39 times the KV pool: 3,662-4,577 KV tokens, 15-28 retractions
RECOMPUTE = [c for c in NO_BUFFER if mamba_ratio(c) > 10]
HYBRID = [c for c in NO_BUFFER if c not in RECOMPUTE]
EXTRA = [c for c in ALL if c.get("mamba_strategy") == "extra_buffer"]
SWEBENCH = [
    c for c in ALL if "trace=swebench" in c["overrides"] and c not in EXTRA and c not in PAGED
]
MIXED = [c for c in CASES if c["enable_mixed_chunk"]]
IDS = [c["case"] for c in CASES]
#: hybrid cases whose KV pool binds too (a few thousand tokens): they retract
KV_BOUND = [c for c in HYBRID if c["capacity_tokens"] < 10_000]
STATE_BOUND = [c for c in HYBRID if c not in KV_BOUND]


def test_the_fixtures_cover_both_batchings_and_retract():
    assert len(MIXED) == 4
    assert len(CASES) == 8
    assert {c["size_gb"] for c in CASES} == {0.5, 1}
    for case in CASES:
        assert case["engine_version"] == "0.5.23"
        assert pd.read_csv(SGLANG_FIXTURES / case["file"])["preemptions"].sum() > 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_request_agrees_with_sglangs_scheduler_on_every_column(case):
    """Needs, beside the admission and retraction rules, SGLang's handling of a retracted
    request: its admission reserves its whole ``max_new_tokens`` though its check asks room
    for those left only; it is matched, refreshed and published with the outputs it prefills
    again (its fill ids); and a decode step that does not fit evicts what it can before it
    retracts (``check_decode_mem``)."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions > 0
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate


def test_the_hybrid_fixtures_bind_on_either_pool():
    assert len(HYBRID) == 8
    assert len(STATE_BOUND) == 4 and len(KV_BOUND) == 4
    assert {c["max_running_requests"] for c in STATE_BOUND} == {6, 15}
    assert {c["max_running_requests"] for c in KV_BOUND} == {5}
    assert sum(c["enable_mixed_chunk"] for c in KV_BOUND) == 2
    for case in HYBRID:
        assert case["engine_version"] == "0.5.23"
        assert case["mamba_strategy"] == "no_buffer"
        assert case["max_running_requests"] == case["mamba_slots"] // 3
        retracted = pd.read_csv(SGLANG_FIXTURES / case["file"])["preemptions"].sum()
        assert (retracted > 0) == (case in KV_BOUND)


@pytest.mark.parametrize("case", STATE_BOUND, ids=[c["case"] for c in STATE_BOUND])
def test_hybrid_requests_agree_on_every_column_where_the_mamba_pool_binds(case):
    """Needs each of SGLang's rules: a running request's published prompt stays locked (a
    request that hit nothing too), every match refreshes its Mamba state's recency, a chunked
    prompt publishes a state at each chunk's end, and the pass takes its state slots after
    its matches (a hit's copy as it is matched)."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate


@pytest.mark.parametrize("case", KV_BOUND, ids=[c["case"] for c in KV_BOUND])
def test_hybrid_requests_agree_on_every_column_where_kv_binds_too(case):
    """Needs, beside the rules above, a retracted request's prompt and outputs prefilled in
    one pass (SGLang does not split an extend at the prompt's end for its state) and its
    outputs' KV held by it after its last chunk (not counted as moved into the tree)."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions > 0
    assert result.first_difference is None


def test_the_recompute_fixtures_retract_often_in_a_tiny_kv_pool():
    assert len(RECOMPUTE) == 8
    assert {round(mamba_ratio(c)) for c in RECOMPUTE} == {19, 39}
    assert sum(c["enable_mixed_chunk"] for c in RECOMPUTE) == 4
    for case in RECOMPUTE:
        assert case["mamba_strategy"] == "no_buffer"
        assert case["capacity_tokens"] < 5_000
        assert pd.read_csv(SGLANG_FIXTURES / case["file"])["preemptions"].sum() >= 15


@pytest.mark.parametrize("case", RECOMPUTE, ids=[c["case"] for c in RECOMPUTE])
def test_a_retracted_hybrids_recompute_is_published_with_a_state_at_its_fills_end(case):
    """SGLang re-prefills a retracted hybrid request's prompt and sampled outputs in one
    extend, publishes that fill with the Mamba state at its end (``checkpoint_kv_cache`` up
    to ``extend_end``), and a later turn of the conversation hits it: request 917 re-hit 451
    tokens (the retracted request 916's fill) where its prompt alone gives 427. Keying and
    publishing the recompute by its prompt alone (the rule before) made 1-2 last hits and up
    to 6 finishing steps differ in 6 of the 8 cases."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions > 0
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate


def test_the_swebench_fixtures_cover_both_models_batchings_and_retractions():
    assert len(SWEBENCH) == 14
    assert sum(c["enable_mixed_chunk"] for c in SWEBENCH) == 7
    assert sum("mamba_slots" in c for c in SWEBENCH) == 8
    retracted = {c["case"]: pd.read_csv(SGLANG_FIXTURES / c["file"]) for c in SWEBENCH}
    assert sum(t["preemptions"].sum() > 0 for t in retracted.values()) == 10
    # a retracted request re-hits into the outputs it sampled (its fill ids)
    assert any((t["last_hit"] > t["input_len"]).any() for t in retracted.values())


@pytest.mark.parametrize("case", SWEBENCH, ids=[c["case"] for c in SWEBENCH])
def test_swebench_sessions_agree_with_sglangs_scheduler_on_every_column(case):
    """Long agent prompts: each is chunked over several steps, later turns hit a prefix that
    earlier turns published chunk by chunk, and a retracted request is re-prefilled with the
    outputs it sampled."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate


def test_the_extra_buffer_fixtures_cap_the_running_requests_by_four_slots():
    assert len(EXTRA) == 36
    parts = [CASES, HYBRID, RECOMPUTE, EXTRA, SWEBENCH, PAGED, LIMITS, OVERLAP, OVERLAP_HYBRID]
    assert len(CASES_ALL) == sum(len(part) for part in parts)
    assert sum(c["enable_mixed_chunk"] for c in EXTRA) == 17
    assert sum("trace=swebench" in c["overrides"] for c in EXTRA) == 10
    assert sum(mamba_ratio(c) > 10 for c in EXTRA) == 16  # ratios 19 and 39, as RECOMPUTE's
    for case in EXTRA:
        assert case["max_running_requests"] == case["mamba_slots"] // 4
    retracted = [pd.read_csv(SGLANG_FIXTURES / c["file"])["preemptions"].sum() for c in EXTRA]
    assert sum(r > 0 for r in retracted) == 24


@pytest.mark.parametrize("case", EXTRA, ids=[c["case"] for c in EXTRA])
def test_extra_buffer_requests_agree_with_sglangs_scheduler_on_every_column(case):
    """The running cap (``slots // (3 + tracking slots)``), each request's Mamba slots (its
    own and its one track slot: the server without the overlap scheduler sizes the ping-pong
    buffer so; with the two of the overlap scheduler 91.2% of the hits agreed at 2 GB),
    and where SGLang's tracking puts the states: per extend (a chunk's start plus whole grid
    steps, each chunk publishing its own), none for a decode step riding a prefill batch, only
    the last decode-tracked one at the finish; a publish whose state is cached already makes
    it the most recently used; a chunked prompt publishes after the step's finished requests;
    a publish is newer than every match before it (``RadixLRU.ticks_on_insert``: without it
    1-3 hits differ in the 8 cases at Mamba ratio 19). Dropping any of these fails some case."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate


def test_the_paged_fixtures_cover_both_batchings_two_page_sizes_and_retract():
    assert len(PAGED) == 14
    assert {c["block_size"] for c in PAGED} == {16, 64}
    assert sum(c["enable_mixed_chunk"] for c in PAGED) == 6
    assert sum("trace=swebench" in c["overrides"] for c in PAGED) == 4
    for case in PAGED:
        assert case["capacity_tokens"] % case["block_size"] == 0  # SGLang's whole pages
        assert "mamba_slots" not in case
        assert pd.read_csv(SGLANG_FIXTURES / case["file"])["preemptions"].sum() > 0


@pytest.mark.parametrize("case", PAGED, ids=[c["case"] for c in PAGED])
def test_paged_pool_requests_agree_with_sglangs_scheduler_on_every_column(case):
    """SGLang's paged pool under load: a running request holds its partial last page whole;
    the admission charges a page-ceiled extend and a page per request, cuts a prompt on a
    page (admitting nobody when less than a page of the budget is left) and finds the pool
    full once the ceiled charges spend it; a decode step needs a page for each request whose
    token starts one, and its allocation first evicts to a free page per request; a
    retracted request re-hits and publishes the full pages of its input and sampled outputs.
    Without these rules 2-4% of the requests were scheduled at the same step."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions > 0
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate


def test_the_prefill_limit_fixtures_cover_the_cap_and_chunked_prefill_off():
    assert len(LIMITS) == 18
    unchunked = [c for c in LIMITS if c["chunked_prefill_size"] <= 0]
    assert len(unchunked) == 8
    assert not any(c["enable_mixed_chunk"] for c in unchunked)  # SGLang mixes no step then
    assert {c["max_prefill_tokens"] for c in unchunked} == {1024, MAX_PREFILL_TOKENS}
    capped = [c for c in LIMITS if c not in unchunked]
    assert all(c["max_prefill_tokens"] < c["chunked_prefill_size"] for c in capped)
    assert sum(c["enable_mixed_chunk"] for c in capped) == 4
    assert sum("mamba_slots" in c for c in LIMITS) == 2
    assert sum(c["block_size"] > 1 for c in LIMITS) == 2
    for case in LIMITS:
        assert pd.read_csv(SGLANG_FIXTURES / case["file"])["preemptions"].sum() > 0


@pytest.mark.parametrize("case", LIMITS, ids=[c["case"] for c in LIMITS])
def test_prefill_limits_agree_with_sglangs_scheduler_on_every_column(case):
    """SGLang's ``rem_input_tokens``: the admission pass charges each page-ceiled extend to
    ``--max-prefill-tokens`` as to the chunk budget and admits nobody once it is spent, the
    request that spent it still whole; with chunked prefill off no prompt is cut and one whose
    extend reaches what the pass left waits unless it is the pass's first."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions > 0
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate


def test_the_overlap_fixtures_cover_the_normal_loops_settings_and_retract():
    assert len(OVERLAP) == 31
    assert all(c["case"].split("-")[1].endswith("overlap") for c in OVERLAP)
    assert sum(c["enable_mixed_chunk"] for c in OVERLAP) == 16
    assert sum("trace=swebench" in c["overrides"] for c in OVERLAP) == 9
    assert {c["block_size"] for c in OVERLAP} == {1, 16, 64}
    assert sum(c["chunked_prefill_size"] <= 0 for c in OVERLAP) == 3
    assert sum(c["max_prefill_tokens"] != MAX_PREFILL_TOKENS for c in OVERLAP) == 4
    retracted = [pd.read_csv(SGLANG_FIXTURES / c["file"])["preemptions"].sum() for c in OVERLAP]
    assert sum(r > 0 for r in retracted) == 29  # all but the two 8 GB ShareGPT cases


@pytest.mark.parametrize("case", OVERLAP, ids=[c["case"] for c in OVERLAP])
def test_requests_agree_with_sglangs_overlap_scheduler_on_every_column(case):
    """``engine.overlap=true`` against ``event_loop_overlap``: the last batch's result is
    processed once the next batch is planned (a prompt it ended is published, a request it
    finished frees and inserts, a step late; the finishing request still counts in the
    running batch meanwhile but decodes no more), a request's outputs lag by its queued token
    (its expected outputs, its retraction order), a retracted request drops that token, and a
    decode that does not fit while a finishing result is queued sits the step out. Besides,
    two rules the normal loop rarely reaches: a publish ending inside a longer cached edge
    splits it there and the lock moves to the upper half (a chunked prompt stashed before
    this one's publish), and a retraction leaves the batch in its sorted order. Before
    simlab modelled the overlap, 2.8-15% of the requests were scheduled at SGLang's step."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate


def test_the_hybrid_overlap_fixtures_cover_both_traces_and_retract():
    """Nemotron-H over ``extra_buffer`` under the overlap scheduler: two track slots per
    request, so the running cap is ``slots // 5``; ShareGPT (Mamba ratio 0.9 and 19) and the
    SWE-bench slice (0.9 and 9), both batchings."""
    assert len(OVERLAP_HYBRID) == 26
    assert all(c["mamba_strategy"] == "extra_buffer" for c in OVERLAP_HYBRID)
    assert all(c["max_running_requests"] == c["mamba_slots"] // 5 for c in OVERLAP_HYBRID)
    assert sum(c["enable_mixed_chunk"] for c in OVERLAP_HYBRID) == 13
    assert sum("trace=swebench" in c["overrides"] for c in OVERLAP_HYBRID) == 10
    assert sum(mamba_ratio(c) > 10 for c in OVERLAP_HYBRID) == 8
    retracted = [
        pd.read_csv(SGLANG_FIXTURES / c["file"])["preemptions"].sum() for c in OVERLAP_HYBRID
    ]
    assert sum(r > 0 for r in retracted) == 10  # ratio 19 and 9


@pytest.mark.parametrize("case", OVERLAP_HYBRID, ids=[c["case"] for c in OVERLAP_HYBRID])
def test_hybrid_requests_agree_with_sglangs_overlap_scheduler_on_every_column(case):
    """``engine.overlap=true`` on Nemotron-H with ``policy.mamba=extra_buffer``: the overlap
    loop's rules and the ``extra_buffer`` tracking rules together, with each running request
    holding its Mamba slot and two ping-pong track slots (``tracking_slots=2``, the default).
    SGLang's own ``prepare_for_decode`` and result processor take their overlap paths in the
    driver; simlab needed no rule beyond the two sets."""
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions
    assert result.first_difference is None
    assert result.simlab_hit_rate == result.engine_hit_rate
