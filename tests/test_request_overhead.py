"""``engine.request_overhead_s``: the time from a request's send to the engine's queue (the
API server, tokenisation). It adds to the request's TTFT and latency, not to its decode, and in
a closed loop the next request is sent that much later."""

from __future__ import annotations

import numpy as np
import pytest

from simlab.config import ConfigError
from simlab.engines.timed.feeders import ConcurrencyFeeder
from simlab.run.plan import plan_run
from simlab.run.policy import policy_step
from tests.fixtures import compose, model
from traces.format import Request

OVERHEAD = 0.05


def requests(n: int) -> list[Request]:
    rng = np.random.default_rng(0)
    return [
        Request(
            request_id=i,
            session_id=i,
            turn=0,
            arrival=0.0,
            input_ids=rng.integers(1, 2**31 - 1, int(rng.integers(200, 900)), dtype=np.int64),
            output_ids=np.zeros(0, dtype=np.int64),
            output_len=int(rng.integers(5, 40)),
        )
        for i in range(n)
    ]


def replay(concurrency: int, overhead: float):
    """Closed-loop records of 12 requests at ``concurrency`` (fresh prompts, FIFO)."""
    cfg = compose(
        ["+policy=fifo", "engine=timed", "report=false", f"engine.request_overhead_s={overhead}"]
    )
    plan = plan_run(cfg)
    (policy,) = plan.policies.values()
    reqs = requests(12)
    step = policy_step(policy, model("llama3_8b"), plan.settings)
    records = plan.engine.world(reqs, step).run(ConcurrencyFeeder(reqs, concurrency))
    return sorted(records, key=lambda r: r.request_id)


def test_one_at_a_time_each_request_waits_the_overhead_once_and_decodes_as_before():
    plain, slow = replay(1, 0.0), replay(1, OVERHEAD)
    for k, (a, b) in enumerate(zip(plain, slow, strict=True)):
        assert b.ttft == pytest.approx(a.ttft + OVERHEAD, abs=1e-9)
        assert b.tpot == pytest.approx(a.tpot, rel=1e-9)
        # each send waits for the last request's end, which came the overhead later each time
        assert b.arrival == pytest.approx(a.arrival + k * OVERHEAD, abs=1e-9)


def test_under_load_no_request_reaches_the_engine_before_its_overhead():
    slow = replay(4, OVERHEAD)
    assert min(r.ttft for r in slow) > OVERHEAD
    assert np.mean([r.ttft for r in slow]) > np.mean([r.ttft for r in replay(4, 0.0)])


@pytest.mark.parametrize("bad", [-0.1, "x", True])
def test_a_bad_overhead_is_a_one_line_error_naming_its_key(bad):
    with pytest.raises(ConfigError, match=r"engine\.request_overhead_s"):
        plan_run(compose(["+policy=fifo", "engine=timed", f"engine.request_overhead_s={bad}"]))


def test_a_run_without_engine_overheads_says_so_once_and_records_it(caplog):
    """The defaults charge no engine overhead: the run warns once, summary.json's config
    keeps the caveat, and the report's cost-model note repeats it; any overhead set clears it."""
    from simlab.report.describe import cost_model_note

    with caplog.at_level("WARNING"):
        plan = plan_run(compose(["+policy=fifo", "engine=timed"]))
    caveat = plan.config["engine_overheads"]
    assert "engine.costs.iteration_overhead_s" in caveat and "engine.request_overhead_s" in caveat
    assert [r.getMessage() for r in caplog.records].count(caveat) == 1
    assert caveat in cost_model_note(plan.config)
    for setting in ("engine.request_overhead_s=0.03", "engine.costs.iteration_overhead_s=0.001"):
        assert "engine_overheads" not in plan_run(compose(["+policy=fifo", setting])).config
