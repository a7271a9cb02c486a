"""The engines' holds on new requests (:mod:`simlab.engines.timed.intake`) on the step clock
(every iteration one time unit): SGLang's ``--scheduler-recv-interval`` and TensorRT-LLM's
batch waiting, each against the same world without the hold."""

from __future__ import annotations

import numpy as np
import pytest

from simlab.engines.timed.world import TimedWorld
from tests.test_kv_pool import build, engine
from tests.test_request_admission import step_world
from traces.format import Request

ZEROS = np.zeros(0, np.int32)


def decoding_and_arriving(prompt: int) -> list[Request]:
    """A request decoding 50 tokens from time 0, and a ``prompt``-token one arriving at 2.5."""
    return [
        Request(0, 0, 0, 0.0, np.arange(20, dtype=np.int32), ZEROS, 50),
        Request(1, 1, 0, 2.5, np.arange(100, 100 + prompt, dtype=np.int32), ZEROS, 5),
    ]


def test_sglang_pulls_new_requests_every_recv_interval_decode_steps():
    """With ``recv_interval=10`` the first request is pulled at once (the scheduler is idle)
    and prefilled in step 1; the poll after that prefill resets the counter, so the next pull
    is 10 decode steps later, at time 11: the second request, arrived at 2.5, is prefilled
    then (first token at 12) instead of after the step in progress (at 4)."""
    reqs = decoding_and_arriving(30)
    plain = step_world(reqs, batching="prefill_first")
    held = step_world(reqs, batching="prefill_first", recv_interval=10)
    assert plain[0].first_token == held[0].first_token == 1.0
    assert plain[1].first_token == 4.0
    assert held[1].scheduled == 11.0 and held[1].first_token == 12.0
    assert held[1].finished - held[1].first_token == plain[1].finished - plain[1].first_token


def test_sglang_pulls_at_once_after_a_prefill_step():
    """Two requests arriving in the same prefill step: the poll after an extend step pulls at
    once, so the second is prefilled in the next step as without the hold."""
    reqs = decoding_and_arriving(30)
    reqs[1] = Request(1, 1, 0, 0.5, reqs[1].input_ids, ZEROS, 5)
    plain = step_world(reqs, batching="prefill_first")
    held = step_world(reqs, batching="prefill_first", recv_interval=10)
    assert held[1].first_token == plain[1].first_token == 2.0


def trt_world(reqs: list[Request], **settings) -> list:
    from simlab.experiments.crosscheck_load import OpenLoop, StepClock

    world = TimedWorld(
        reqs,
        build("sglang")(),
        StepClock(),
        engine(token_budget=128, **settings),  # type: ignore[arg-type]
    )
    return sorted(world.run(OpenLoop(reqs, [r.arrival for r in reqs])), key=lambda r: r.request_id)


def test_tensorrt_llm_holds_a_small_prompt_for_the_timeout_while_others_decode():
    """A 30-token prompt arriving while one request decodes: 30 + 1 tokens are under 0.9 x
    128, so TensorRT-LLM holds it 5 iterations (decode-only steps 3 to 8) and prefills it
    beside the decode in step 9; without the hold in step 4. The first request, arriving to an
    idle engine, is never held."""
    reqs = decoding_and_arriving(30)
    plain = trt_world(reqs)
    held = trt_world(reqs, batch_wait_iters=5, batch_wait_tokens_ratio=0.9)
    assert plain[0].first_token == held[0].first_token == 1.0
    assert plain[1].first_token == 4.0 and held[1].first_token == 9.0
    assert held[0].finished == plain[0].finished  # the held steps still decode


def test_tensorrt_llm_releases_prompts_that_reach_the_token_ratio():
    """A 120-token prompt (+1 decoder: at least 0.9 x 128) is not held."""
    reqs = decoding_and_arriving(120)
    held = trt_world(reqs, batch_wait_iters=5, batch_wait_tokens_ratio=0.9)
    assert held[1].first_token == trt_world(reqs)[1].first_token == 4.0


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"recv_interval": 0}, "engine.recv_interval"),
        ({"batch_wait_iters": -1}, "engine.batch_wait_iters"),
        ({"batch_wait_tokens_ratio": 1.5}, "engine.batch_wait_tokens_ratio"),
        ({"batch_wait_iters": 5, "batching": "prefill_first"}, "engine.batch_wait_iters"),
    ],
)
def test_bad_holds_are_refused_naming_the_key(settings, key):
    with pytest.raises(ValueError, match=key):
        engine(**settings)
