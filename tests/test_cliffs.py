"""The known cliffs of vLLM's hybrid prefix caching, on workloads of the shapes their reporters
measured: one shared system prompt, then a different question per request, one request per
session. Nemotron-H-8B under ``+policy=vllm`` at vLLM 0.33.0's defaults for it (FP32 SSM state:
1,040-token blocks) unless a case says otherwise.

* vllm #40696: a shared prefix shorter than one block never hits;
* vllm #36010 / #47430: a prefix just above one block hits exactly one block;
* vllm #42317: in ``align`` mode at concurrency 1, prompts that diverge before their last block
  boundary get 0% (the state is saved only there, past the divergence) without the
  shared-prefix junction (vLLM before #37898, ``junction: false``); vLLM 0.33.0's junction
  state brings the hit back from the third request;
* #42317 again, under load: partial hits, the whole blocks of the shared prefix (vLLM 0.33.0
  keeps a chunk's end state only where it is a semantic checkpoint, so the hits come from the
  junction state, not from where chunked prefill happened to stop).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from simlab.cost.hardware import Hardware
from simlab.engines.replay import ReplayEngine
from simlab.engines.step import RequestStep
from simlab.engines.timed.engine import TimedEngine
from tests.fixtures import CONFIGS, model, policy_plugins, routed
from traces.format import Request

A100 = Hardware.from_config(OmegaConf.load(CONFIGS / "hardware" / "a100_40gb.yaml"))
NEMOTRON = model("nemotron_h_8b")
BLOCK = 1040  # vLLM 0.33.0, Nemotron-H-8B, FP32 SSM state (tests/fixtures/crosscheck/geometry.json)


def shared_prefix(prefix: int, question: int, n: int, gap: float = 1000.0) -> list[Request]:
    """``n`` one-request sessions: the same ``prefix`` tokens, then ``question`` tokens of
    their own, 8 output tokens; one every ``gap`` seconds."""
    rng = np.random.default_rng(prefix + question)
    system = rng.integers(0, 30_000, prefix, dtype=np.int32)
    out = []
    for i in range(n):
        own = rng.integers(30_000, 60_000, question, dtype=np.int32)
        reply = rng.integers(60_000, 90_000, 8, dtype=np.int32)
        out.append(Request(i, i, 0, i * gap, np.concatenate((system, own)), reply, 8))
    return out


def vllm_step(overrides: list[str] | None = None) -> RequestStep:
    """``+policy=vllm`` on Nemotron-H-8B, the state dtype vLLM's default for it."""
    admission, eviction = policy_plugins("vllm", overrides)
    return RequestStep.build(
        admission.engine_model(NEMOTRON), math.inf, admission, eviction, "vllm"
    )


def replay_hits(requests: list[Request], overrides: list[str] | None = None) -> list[int]:
    """Concurrency 1: the replay engine on vLLM's pool, block by block."""
    step = vllm_step(overrides)
    engine = ReplayEngine()
    run = engine.run(requests, routed(step, engine, requests))
    return [r.hit_tokens for r in run.records]


def test_the_engine_default_forces_the_block():
    step = vllm_step()
    assert step.admission.keys.block_size == BLOCK
    assert step.cache.model.ssm_state_dtype_bytes == 4
    assert vllm_step(["policy.mamba_ssm_cache_dtype=bfloat16"]).admission.keys.block_size == 528


@pytest.mark.parametrize("prefix", [100, 528, BLOCK - 1])
def test_no_hit_below_one_block(prefix):
    """vllm #40696: whatever the traffic repeats below one block is never a hit."""
    assert replay_hits(shared_prefix(prefix, 200, 6)) == [0] * 6


@pytest.mark.parametrize("prefix", [BLOCK, BLOCK + 1, BLOCK + 300])
def test_one_block_hit_just_above_it(prefix):
    """vllm #36010 / #47430: a prefix of one block and a little more hits one block, no more."""
    assert replay_hits(shared_prefix(prefix, 200, 6)) == [0] + [BLOCK] * 5


def test_align_mode_at_concurrency_1_gets_nothing_when_prompts_diverge_before_their_end():
    """vllm #42317: a 2,500-token system prompt and 1,500-token questions, one prompt per
    step (8,192 tokens): the state is saved at 3,120 only, past the divergence. Without the
    junction state: 0%; with it (0.33.0), the second request leaves one at 2,080, which every
    later request hits."""
    requests = shared_prefix(2500, 1500, 6)
    budget = ["policy.admission.max_num_batched_tokens=8192"]
    assert replay_hits(requests, [*budget, "policy.admission.junction=false"]) == [0] * 6
    assert replay_hits(requests, budget) == [0, 0] + [2 * BLOCK] * 4


def test_partial_hits_under_load():
    """vllm #42317 under load: 16 requests of a 2,500-token system prompt and a 700-token
    question arriving together, prefilled in chunks of vLLM's 2,048-token steps. vLLM 0.33.0
    keeps only semantic checkpoints at its default ``prefix_cache_retention_interval=0`` (the
    prompt's last block boundary and the shared-prefix junction), not every chunk's end: the
    hits are partial, the whole blocks of the shared prefix (2,080 of 2,500 tokens), from the
    third request on, as at concurrency 1; without the junction state load brings none back."""
    requests = shared_prefix(2500, 700, 16, gap=0.0)
    hits = {}
    for junction in ("true", "false"):
        step = vllm_step([f"policy.admission.junction={junction}"])
        engine = TimedEngine(hardware=A100, token_budget=2048, memory_check=False)
        run = engine.run(requests, routed(step, engine, requests))
        hits[junction] = [r.hit_tokens for r in run.records]
    assert hits["true"] == [0, 0] + [2 * BLOCK] * 14
    assert hits["false"] == [0] * 16


@pytest.mark.parametrize(
    ("interval", "second"),
    [
        ("0", 0),
        (f"{BLOCK}", 2 * BLOCK),
        (f"{2 * BLOCK}", 2 * BLOCK),
        (f"{3 * BLOCK}", 0),
        ("null", 2 * BLOCK),
    ],
)
def test_a_retention_interval_keeps_the_states_chunked_prefill_leaves(interval, second):
    """``prefix_cache_retention_interval``: a 2,500-token system prompt and 1,500-token
    questions at concurrency 1, prefilled in vLLM's 2,048-token steps, which end on every
    block (1,040, 2,080, then the prompt's checkpoint at 3,120). At 0 (vLLM 0.33.0's default)
    only the prompt's checkpoint and the junction are kept: the second request misses and
    leaves the junction state. An interval keeping the state at 2,080 (every block, every
    two blocks, or dense: null) gives the second request its whole shared blocks; one of
    three blocks keeps only 3,120, past the divergence, as at 0."""
    requests = shared_prefix(2500, 1500, 6)
    hits = replay_hits(requests, [f"policy.prefix_cache_retention_interval={interval}"])
    assert hits == [0, second] + [2 * BLOCK] * 4


def test_a_retention_interval_needs_a_step_ending_there():
    """States are kept where a step ends: with the whole prompt in one step (8,192-token
    budget) no state is left at 2,080 whatever the interval."""
    requests = shared_prefix(2500, 1500, 6)
    budget = "policy.admission.max_num_batched_tokens=8192"
    for interval in ("0", f"{BLOCK}"):
        hits = replay_hits(requests, [budget, f"policy.prefix_cache_retention_interval={interval}"])
        assert hits == [0, 0] + [2 * BLOCK] * 4


def test_a_retention_interval_off_the_block_grid_is_refused():
    """vLLM requires a multiple of the block; the error names the key and the block."""
    with pytest.raises(ValueError, match=r"prefix_cache_retention_interval \(1000\).*1040"):
        vllm_step(["policy.prefix_cache_retention_interval=1000"])


def test_a_retention_interval_under_load():
    """The requests of :func:`test_partial_hits_under_load`, arriving together, with every
    block's state kept (an interval of one block): the first request's chunked prefill leaves
    a state on each block it ends on (1,040, 2,080), so from the second request on every one
    hits the whole shared blocks, without waiting for a junction state."""
    requests = shared_prefix(2500, 700, 16, gap=0.0)
    hits = {}
    for interval in ("0", f"{BLOCK}"):
        step = vllm_step([f"policy.prefix_cache_retention_interval={interval}"])
        engine = TimedEngine(hardware=A100, token_budget=2048, memory_check=False)
        run = engine.run(requests, routed(step, engine, requests))
        hits[interval] = [r.hit_tokens for r in run.records]
    assert hits["0"] == [0, 0] + [2 * BLOCK] * 14
    assert hits[f"{BLOCK}"] == [0] + [2 * BLOCK] * 15
