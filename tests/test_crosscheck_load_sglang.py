"""The timed engine on the shared KV pool under load, against SGLang 0.5.23's own scheduler
(``crosscheck/sglang_concurrent.py``'s fixtures: ``get_next_batch_to_run``, ``PrefillAdder``
with the new token ratio, ``retract_decode``, over a ``RadixCache`` on Llama-3-8B).

Agreement is partial (README, "Under load against SGLang's scheduler"): the tests hold it
where it is measured, so a regression in simlab's admission, ratio or retraction fails them.
- With ``enable_mixed_chunk`` (simlab's iteration structure) the first requests of every case
  agree on every column: hit, last hit, retractions, scheduling, first-token and finishing step
  (measured: 81 at 0.5 GB, 107-124 at 1 GB); at 0.5 GB 98% of them are scheduled at SGLang's
  step, and every request is retracted as often as in SGLang.
- Hits agree for at least 97% of the requests with mixed chunks (measured: 97.2-98.5%) and
  92% prefill first (measured: 93.6-94.7%); the hit rates are within 2% (mixed: at most 1.8%
  apart) and 3% (prefill first: 2.6%) of SGLang's."""

from __future__ import annotations

import pandas as pd
import pytest

from simlab.crosscheck import load_cases
from simlab.crosscheck_load import SGLANG_FIXTURES, compare

CASES = load_cases(SGLANG_FIXTURES)
MIXED = [c for c in CASES if c["enable_mixed_chunk"]]
#: measured: requests before the first that differs anywhere, per pool size (GB)
AGREEING_PREFIX = {0.5: 81, 1: 107}


def test_the_fixtures_cover_both_batchings_and_retract():
    assert len(MIXED) == 4
    assert len(CASES) == 8
    assert {c["size_gb"] for c in CASES} == {0.5, 1}
    for case in CASES:
        assert case["engine_version"] == "0.5.23"
        assert pd.read_csv(SGLANG_FIXTURES / case["file"])["preemptions"].sum() > 0


@pytest.mark.parametrize("case", MIXED, ids=[c["case"] for c in MIXED])
def test_the_first_requests_schedule_as_sglangs_mixed_scheduler(case):
    result = compare(case, SGLANG_FIXTURES)
    assert result.first_difference is not None  # update the docs when this goes
    assert result.first_difference >= AGREEING_PREFIX[case["size_gb"]]


SMALL_MIXED = [c for c in MIXED if c["size_gb"] == 0.5]


@pytest.mark.parametrize("case", SMALL_MIXED, ids=[c["case"] for c in SMALL_MIXED])
def test_under_pressure_requests_schedule_and_retract_as_in_sglang(case):
    result = compare(case, SGLANG_FIXTURES)
    assert result.identical["scheduled"] >= 0.98 * result.requests
    assert result.identical["first_token"] >= 0.99 * result.requests


@pytest.mark.parametrize("case", MIXED, ids=[c["case"] for c in MIXED])
def test_mixed_cases_retract_as_often_as_sglang(case):
    result = compare(case, SGLANG_FIXTURES)
    assert result.simlab_preemptions == result.engine_preemptions
    assert result.identical["preemptions"] == result.requests


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_hits_under_load_agree_for_most_requests(case):
    result = compare(case, SGLANG_FIXTURES)
    mixed = case["enable_mixed_chunk"]
    assert result.identical["hit_tokens"] >= (0.97 if mixed else 0.92) * result.requests
    rel = 0.02 if mixed else 0.03  # measured: at most 1.8% and 2.6% apart
    assert result.simlab_hit_rate == pytest.approx(result.engine_hit_rate, rel=rel)
