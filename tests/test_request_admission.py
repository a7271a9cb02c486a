"""SGLang's request admission on the shared KV pool (``engine.request_admission=sglang``,
:mod:`simlab.engines.timed.new_token_ratio`): the ratio's dynamics, the expected outputs in closed form, no
preemption when every output is reserved whole (``ignore_eos``), and decode spans that give the
records of single steps (no admission happens inside one: SGLang's ``batch_is_full``)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from simlab.engines.records import records_frame
from simlab.engines.timed.feeders import SessionFeeder
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.new_token_ratio import (
    CLIP_MAX_NEW_TOKENS,
    INIT_RATIO,
    RETRACT_DECODE_STEPS,
    NewTokenRatio,
)
from simlab.engines.timed.preemption import Preemption
from simlab.engines.timed.settings import TimedSettings
from simlab.engines.timed.shared import SharedMemory
from simlab.engines.timed.world import TimedWorld
from tests.test_kv_pool import KV, build, engine, requests, tiny
from traces.format import Request

TIMES = ["scheduled", "first_token", "finished"]


def test_the_ratio_decays_from_0_7_to_its_floor_in_600_steps_and_resets_when_idle():
    ratio = NewTokenRatio()
    assert ratio.current == INIT_RATIO == 0.7
    for _ in range(300):
        ratio.decay(1)
    assert ratio.current == pytest.approx(0.7 - 300 * (0.7 - 0.098) / 600)
    assert ratio.current == pytest.approx(float(NewTokenRatio().after(300)))
    ratio.decay(400)
    assert ratio.current == pytest.approx(0.7 * 0.14) and ratio.current >= NewTokenRatio.MIN
    ratio.decay(0)
    assert ratio.current == pytest.approx(0.098)
    ratio.reset()
    assert ratio.current == 0.7


def test_a_retraction_sets_the_ratio_to_what_the_kept_requests_show():
    """``(decoded + 20 each) / (max_new_tokens + 1)``, at most 1; below the floor until the
    next decay lifts it there, as SGLang's tracker does."""
    ratio = NewTokenRatio()
    ratio.retracted([10, 30], [100, 200])
    assert ratio.current == pytest.approx((40 + 2 * RETRACT_DECODE_STEPS) / 301)
    ratio.retracted([90], [100])
    assert ratio.current == 1.0
    ratio.retracted([0], [1000])
    assert ratio.current == pytest.approx(20 / 1001) and ratio.current < NewTokenRatio.MIN
    assert float(ratio.after(0)) == ratio.current
    ratio.decay(1)
    assert ratio.current == NewTokenRatio.MIN


@pytest.mark.parametrize("preemption", ["lifo", "sglang"])
def test_reserving_every_output_whole_never_preempts(preemption):
    """With ``ignore_eos`` the running requests' outputs are reserved whole (ratio 1): the
    tiny pool that preempts under the whole-KV rule and under the decaying ratio never does."""
    reqs = requests()
    runs = {
        (admission, eos): tiny(
            reqs, preemption=preemption, request_admission=admission, ignore_eos=eos
        ).run(reqs, build()())
        for admission, eos in [("whole", False), ("sglang", False), ("sglang", True)]
    }
    for run in runs.values():
        assert len(run.records) == len(reqs)
    assert runs["sglang", True].extras["preemptions"] == 0
    assert runs["sglang", True].extras["request_admission"] == "sglang"
    assert runs["whole", False].extras["preemptions"] > runs["sglang", False].extras["preemptions"]


def unique_prompts(n: int = 16, seed: int = 1) -> list[Request]:
    """Prompts that share nothing (no hit whatever is cached or evicted) and long outputs,
    whose expected share falls faster with the ratio than their KV grows."""
    rng = np.random.default_rng(seed)
    out, start = [], 0
    for i in range(n):
        size = int(rng.integers(40, 300))
        ids = np.arange(start, start + size, dtype=np.int32)
        start += size
        out.append(
            Request(i, i, 0, 0.05 * i, ids, np.zeros(0, np.int32), int(rng.integers(1500, 3000)))
        )
    return out


def test_decode_spans_give_the_records_of_single_steps(monkeypatch):
    """Under ``request_admission=sglang`` a decode span admits nobody: a queued request that did
    not fit is tried again only once a request leaves (SGLang's ``batch_is_full``), which ends
    the span. So its records equal those of the same world planning one step at a time
    (times up to float summation)."""
    reqs = unique_prompts()
    plan = SharedMemory.span_plan

    def one_step(memory: SharedMemory) -> tuple[list[Job], int]:
        decoders, steps = plan(memory)
        return decoders, min(steps, 1)

    def run() -> pd.DataFrame:
        settings = {"kv_pool": "shared", "running_memory_gb": 8000 * KV / 1e9}
        world = engine(**settings, request_admission="sglang").world(reqs, build(cache_bytes=KV)())
        return records_frame(world.run(SessionFeeder(reqs)))

    spans = run()
    waited = spans["scheduled"] - spans["arrival"]
    assert (waited > 1.0).sum() >= 4, "no request waited for room: the case tests nothing"
    monkeypatch.setattr(SharedMemory, "span_plan", one_step)
    steps = run()
    floats = spans.select_dtypes("float").columns
    assert set(TIMES) <= set(floats)
    pd.testing.assert_frame_equal(spans.drop(columns=floats), steps.drop(columns=floats))
    for column in floats:
        np.testing.assert_allclose(spans[column], steps[column], rtol=1e-9, err_msg=column)


def test_decode_only_steps_decay_the_ratio_and_mixed_ones_do_not(monkeypatch):
    """A request decoding 400 tokens while another's 2,000-token prompt is prefilled in
    chunks of 128 beside it (mixed iterations) and then decodes beside it (spans): at its
    finish the ratio decayed once per decode-only step it ran, ``after(399 - mixed)`` (SGLang
    decays it in ``update_running_batch``, which a step running a prefill never calls); a
    request arriving once the server was idle starts again from 0.7."""
    reqs = [
        Request(0, 0, 0, 0.0, np.arange(50, dtype=np.int32), np.zeros(0, np.int32), 400),
        Request(1, 1, 0, 0.5, np.arange(100, 2100, dtype=np.int32), np.zeros(0, np.int32), 600),
        Request(2, 2, 0, 1e4, np.arange(5000, 5050, dtype=np.int32), np.zeros(0, np.int32), 100),
    ]
    at_finish: dict[int, float] = {}
    mixed: list[int] = []
    finish, batch = SharedMemory.finish, TimedWorld._batch

    def spy(memory: SharedMemory, job: Job) -> None:
        at_finish[job.req.request_id] = memory.world.batch.ratio.current
        finish(memory, job)

    def count_mixed(world: TimedWorld, chunks: list, decoders: list[Job]):
        if chunks and any(j.req.request_id == 0 for j in decoders):
            mixed.append(1)
        return batch(world, chunks, decoders)

    monkeypatch.setattr(SharedMemory, "finish", spy)
    monkeypatch.setattr(TimedWorld, "_batch", count_mixed)
    settings = {"kv_pool": "shared", "running_memory_gb": 10_000 * KV / 1e9, "token_budget": 128}
    world = engine(**settings, request_admission="sglang").world(reqs, build()())
    records = world.run(SessionFeeder(reqs))
    assert world.pool.preemptions == 0 and records[1].scheduled < records[0].first_token + 1.0
    assert records[0].finished > records[1].first_token  # chunks ran beside its decode
    assert len(mixed) >= 15  # 2,000 tokens in chunks of at most 127
    expected = NewTokenRatio().after(399 - len(mixed))
    assert at_finish[0] == pytest.approx(float(expected), abs=1e-12)
    assert at_finish[2] == pytest.approx(float(NewTokenRatio().after(99)), abs=1e-12)


@pytest.mark.parametrize("batching", ["mixed", "prefill_first"])
def test_running_requests_expect_their_clipped_outputs_left_times_the_ratio(batching):
    """``PrefillAdder``'s running offset: a decoding request expects its outputs left times the
    ratio, clipped at 4,096, plus with mixed batching its next step's token
    (``num_mixed_decode_tokens``); ``ignore_eos``: the ratio is 1. A prompt the budget cut is
    not in the running batch: its next chunk (``add_chunked_req``) takes the budget first
    (less one token per decoder with mixed batching) and expects one page and, as it ends the
    prompt, the clipped outputs whole."""
    reqs = [
        Request(i, i, 0, 0.0, np.arange(10, dtype=np.int32), np.zeros(0, np.int32), out)
        for i, out in enumerate([100, 9000, 300])
    ]
    mixed = batching == "mixed"
    for eos in (False, True):
        settings = {"kv_pool": "shared", "running_memory_gb": 1e5 * KV / 1e9, "ignore_eos": eos}
        world = engine(**settings, request_admission="sglang", batching=batching).world(
            reqs, build()()
        )
        jobs = [Job(r, 0.0, world.env.event()) for r in reqs]
        for job in jobs:
            job.held_to = job.input_tokens
        jobs[0].prefilled, jobs[0].decoded = 10, 39  # 60 outputs left
        jobs[1].prefilled, jobs[1].decoded = 10, 0  # 8,999 left: clipped
        jobs[2].prefilled = jobs[2].held_to = 4  # its first chunk computed and published
        world.running = jobs
        world.batch.ratio.current = 0.25
        ratio = 1.0 if eos else 0.25
        expected = (60 + CLIP_MAX_NEW_TOKENS) * ratio + 2 * mixed
        admission = world.memory.admission
        assert admission.expected_bytes() == pytest.approx(expected * KV)
        spent, hold, added, ask = admission.continue_prompts(0.0, 128 - 2 * mixed)
        assert spent == 6
        assert added == (300 + 1) * KV
        assert jobs[2].held_to == 10 and hold == 6 * KV
        assert ask == (6 + 1) * KV  # the chunk's eviction asks one page more


def test_after_a_retraction_the_ratio_is_what_the_kept_decoders_show(monkeypatch):
    """SGLang's ``retract_decode`` returns the ratio of the batch it kept: their outputs so far
    plus 20 steps each, over their ``max_new_tokens`` (the output lengths) + 1."""
    checked: list[bool] = []
    reserve = Preemption.reserve_decode

    def spy(preemption: Preemption, limit: int | None) -> int:
        world = preemption.world
        before = world.pool.preemptions
        steps = reserve(preemption, limit)
        if world.pool.preemptions > before:
            kept = world.decoders()
            outputs = sum(j.req.output_len - j.outputs_left for j in kept)
            max_new = sum(j.req.output_len for j in kept)
            estimate = min(1.0, (outputs + RETRACT_DECODE_STEPS * len(kept)) / (max_new + 1))
            checked.append(world.batch.ratio.current == pytest.approx(estimate))
        return steps

    monkeypatch.setattr(Preemption, "reserve_decode", spy)
    reqs = requests()
    run = tiny(reqs, preemption="sglang", request_admission="sglang").run(reqs, build()())
    assert len(run.records) == len(reqs)
    assert checked and all(checked)


def step_world(reqs: list[Request], **settings) -> list:
    """``reqs`` through SGLang's scheduler rules on the step clock (every iteration one time
    unit), arriving at their ``arrival``; their records in request order."""
    from simlab.experiments.crosscheck_load import OpenLoop, StepClock

    shared = {"kv_pool": "shared", "running_memory_gb": 1e4 * KV / 1e9, "token_budget": 128}
    settings = {**shared, "request_admission": "sglang", "preemption": "sglang", **settings}
    world = TimedWorld(reqs, build("sglang")(), StepClock(), engine(**settings))  # type: ignore[arg-type]
    records = world.run(OpenLoop(reqs, [r.arrival for r in reqs]))
    return sorted(records, key=lambda r: r.request_id)


def test_prefill_first_batching_stalls_the_decodes_while_a_prompt_is_prefilled():
    """A request decoding 50 tokens while a 1,000-token prompt arrives: mixed batching runs its
    decode beside each of the prompt's 8 chunks of 128 (SGLang's ``--enable-mixed-chunk``);
    prefill_first runs the chunks alone, so it finishes 8 steps later (SGLang's default)."""
    zeros = np.zeros(0, np.int32)
    reqs = [
        Request(0, 0, 0, 0.0, np.arange(20, dtype=np.int32), zeros, 50),
        Request(1, 1, 0, 2.0, np.arange(100, 1100, dtype=np.int32), zeros, 5),
    ]
    mixed = step_world(reqs, batching="mixed")
    first = step_world(reqs, batching="prefill_first")
    assert mixed[0].finished == 50.0  # first token after step 1, then 49 decode steps
    assert first[0].finished == mixed[0].finished + 8
    assert first[1].first_token == mixed[1].first_token  # the prompt's chunks take as long


@pytest.mark.parametrize("batching", ["mixed", "prefill_first"])
def test_a_prompt_cut_into_chunks_is_published_chunk_by_chunk(batching):
    """A 1,000-token prompt in chunks of 128 publishes what it computed between chunks
    (SGLang's ``checkpoint_kv_cache``): a request sharing its first 600 tokens, admitted in the
    step of its last chunk (the only one with budget left), hits them though that prompt has
    not ended; it holds only the 24 tokens the budget leaves it, and goes on next step."""
    zeros = np.zeros(0, np.int32)
    prompt = np.arange(1000, dtype=np.int32)
    reqs = [
        Request(0, 0, 0, 0.0, prompt, zeros, 5),
        Request(
            1,
            1,
            0,
            2.0,
            np.concatenate([prompt[:600], np.arange(5000, 5100, dtype=np.int32)]),
            zeros,
            5,
        ),
    ]
    records = step_world(reqs, batching=batching)
    assert records[1].scheduled == 7.0 == records[0].first_token - 1
    assert records[1].hit_tokens == 600
    assert records[1].first_token == 9.0  # 24 tokens, then its last 76


def test_with_overlap_a_finished_request_is_published_one_step_later():
    """SGLang's overlap scheduler (``engine.overlap``) processes a batch's result after it
    plans the next batch. A 100-token prompt with 3 outputs finishes at step 3 (its prefill,
    then two decode steps); its next turn arrives then. Without overlap the finish is
    processed first and the next turn hits the prompt and the 2 outputs with KV (102 tokens);
    with it the next turn is admitted before the finish is inserted and hits the prompt,
    published at the end of the prefill's result (100). Every time is the same."""
    prompt = np.arange(100, dtype=np.int32)
    outputs = np.arange(900, 903, dtype=np.int32)
    follow = np.concatenate([prompt, outputs, np.arange(2000, 2010, dtype=np.int32)])
    reqs = [
        Request(0, 0, 0, 0.0, prompt, outputs, 3),
        Request(1, 0, 1, 3.0, follow, np.zeros(0, np.int32), 2),
    ]
    normal = step_world(reqs, batching="prefill_first")
    overlap = step_world(reqs, batching="prefill_first", overlap=True)
    assert normal[0].finished == overlap[0].finished == 3.0
    assert normal[1].scheduled == overlap[1].scheduled == 3.0
    assert (normal[1].hit_tokens, overlap[1].hit_tokens) == (102, 100)


def test_with_overlap_a_finishing_request_still_counts_in_the_running_batch():
    """Under overlap the request whose queued result finishes it stays in SGLang's running
    batch until that result is processed. ``max_running_requests`` 2: requests 0 (3 outputs)
    and 1 (10 outputs) run, request 2 waits. Without overlap it is admitted as request 0
    finishes (step 3); with it the step at 3 still counts request 0 and decodes request 1
    alone, so request 2 starts at step 4. (Had nothing else been running, no batch would
    run at 3, the result would be processed at once and request 2 start at 3.)"""
    zeros = np.zeros(0, np.int32)
    reqs = [
        Request(0, 0, 0, 0.0, np.arange(50, dtype=np.int32), zeros, 3),
        Request(1, 1, 0, 0.0, np.arange(100, 150, dtype=np.int32), zeros, 10),
        Request(2, 2, 0, 1.5, np.arange(500, 550, dtype=np.int32), zeros, 2),
    ]
    normal = step_world(reqs, max_running=2)
    overlap = step_world(reqs, max_running=2, overlap=True)
    assert normal[0].finished == overlap[0].finished == 3.0
    assert (normal[2].scheduled, overlap[2].scheduled) == (3.0, 4.0)


def three_prompts(length: int) -> list[Request]:
    """Three ``length``-token prompts with nothing in common, arriving together."""
    zeros = np.zeros(0, np.int32)
    return [
        Request(i, i, 0, 0.0, np.arange(i * length, (i + 1) * length, dtype=np.int32), zeros, 5)
        for i in range(3)
    ]


def test_max_prefill_tokens_ends_the_pass_once_spent_but_cuts_no_prompt():
    """SGLang's ``--max-prefill-tokens`` (``rem_input_tokens``) with chunks: the pass admits
    while the cap has tokens left, charging each page-ceiled extend, so the request that spends
    it runs whole (the chunk budget alone cuts prompts) and the next waits for the next step."""
    reqs = three_prompts(300)
    free = step_world(reqs, token_budget=1024)
    capped = step_world(reqs, token_budget=1024, max_prefill_tokens=512)
    assert [r.scheduled for r in free] == [0.0, 0.0, 0.0]
    assert [r.scheduled for r in capped] == [0.0, 0.0, 1.0]
    assert [r.first_token for r in capped[:2]] == [1.0, 1.0]  # the second ran whole: 300 > 212


def test_without_chunked_prefill_a_prompt_past_the_cap_waits_unless_it_is_first():
    """``engine.token_budget=null`` (SGLang's ``--chunked-prefill-size -1``): no prompt is cut,
    and a candidate whose extend reaches what the pass left of ``max_prefill_tokens`` waits
    for the next step (``_select_prefill_admission``) unless the pass admitted nobody yet."""
    off = {"token_budget": None, "max_prefill_tokens": 500, "batching": "prefill_first"}
    long = step_world(three_prompts(3000), **off)
    assert [r.scheduled for r in long] == [0.0, 1.0, 2.0]  # each alone, each whole
    assert [r.first_token for r in long] == [1.0, 2.0, 3.0]
    short = step_world(three_prompts(200), **off)
    assert [r.scheduled for r in short] == [0.0, 0.0, 1.0]  # 200 < 300 left; 200 >= 100 left


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_prefill_tokens": 0}, "engine.max_prefill_tokens must be an integer >= 1"),
        ({"max_prefill_tokens": 1024}, "engine.max_prefill_tokens is SGLang's"),
        ({"token_budget": None}, "engine.token_budget=null (chunked prefill off"),
        (
            {"token_budget": None, "request_admission": "sglang", "batching": "mixed"},
            "needs engine.request_admission=sglang and engine.batching=prefill_first",
        ),
    ],
)
def test_sglang_prefill_limits_are_checked(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TimedSettings(**settings)
