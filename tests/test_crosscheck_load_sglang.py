"""The timed engine on the shared KV pool under load, against SGLang 0.5.23's own scheduler
(``crosscheck/sglang_concurrent.py``'s fixtures: ``get_next_batch_to_run``, ``PrefillAdder``
with the new token ratio, ``retract_decode``, over a ``RadixCache`` on Llama-3-8B), with its
default batching (``engine.batching=prefill_first``) and with ``--enable-mixed-chunk``
(``mixed``).

The tests hold the agreement where it is measured (README, "Under load against SGLang's
scheduler"), so a regression in simlab's admission, batching, ratio or retraction fails them:
- the first requests of every case agree on every column: hit, last hit, retractions,
  scheduling, first-token and finishing step (measured: 165-207 at 0.5 GB, 107-492 at 1 GB);
- every request is retracted as often as in SGLang, in every case;
- at least 99% of the requests are scheduled and get their first token at SGLang's step
  (measured: 99.8-100%), but in the prefill-first 1 GB case with arrivals 4 steps apart (86.5%:
  the schedules part from request 1,047 on, after request 399's hit came out 3 tokens short;
  not traced further);
- hits agree for at least 98.5% of the requests (measured: 99.0-99.8%), and the hit rates are
  within 2% of SGLang's (measured: at most 1.6% apart)."""

from __future__ import annotations

import pandas as pd
import pytest

from simlab.crosscheck import load_cases
from simlab.crosscheck_load import SGLANG_FIXTURES, compare

CASES = load_cases(SGLANG_FIXTURES)
MIXED = [c for c in CASES if c["enable_mixed_chunk"]]
IDS = [c["case"] for c in CASES]
#: measured: requests before the first that differs anywhere, per pool size (GB)
AGREEING_PREFIX = {0.5: 165, 1: 107}
#: measured: the share of requests scheduled at SGLang's step where it is below 99%
SCHEDULED = {"sharegpt_llama3_8b-sglang_sched_prefill_first-1-gap4": 0.86}


def test_the_fixtures_cover_both_batchings_and_retract():
    assert len(MIXED) == 4
    assert len(CASES) == 8
    assert {c["size_gb"] for c in CASES} == {0.5, 1}
    for case in CASES:
        assert case["engine_version"] == "0.5.23"
        assert pd.read_csv(SGLANG_FIXTURES / case["file"])["preemptions"].sum() > 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_first_requests_schedule_as_sglangs_scheduler(case):
    result = compare(case, SGLANG_FIXTURES)
    assert result.first_difference is not None  # update the docs when this goes
    assert result.first_difference >= AGREEING_PREFIX[case["size_gb"]]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_requests_schedule_and_retract_as_in_sglang(case):
    result = compare(case, SGLANG_FIXTURES)
    floor = SCHEDULED.get(case["case"], 0.99)
    assert result.identical["scheduled"] >= floor * result.requests
    assert result.identical["first_token"] >= floor * result.requests
    assert result.simlab_preemptions == result.engine_preemptions
    assert result.identical["preemptions"] == result.requests


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hits_under_load_agree_for_most_requests(case):
    result = compare(case, SGLANG_FIXTURES)
    assert result.identical["hit_tokens"] >= 0.985 * result.requests
    assert result.simlab_hit_rate == pytest.approx(result.engine_hit_rate, rel=0.02)
