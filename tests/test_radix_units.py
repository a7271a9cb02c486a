"""The compiled radix replay over ids of many tokens: a hybrid on a hash-id trace (each id
stands for ``block_size`` tokens, a prompt's last id usually short and keyed apart), with
Marconi's alpha tuning.

The oracle is the request step (simlab/engines/step.py over simlab/cache/prefix.py) and its own
grid search (simlab/engines/tuning/window.py): with ``cache.compiled=true`` the replay engine
takes the ``compiled_radix`` route (the tuner's windows on the kernel's snapshots,
``KernelSearch``), the timed engine keeps its own and replays the tuner's windows on the kernel
(``ImageSearch``), and every record, every summary item, every window, grid score and adopted
alpha must be the ones ``cache.compiled=false`` gives: on a small hash-id trace built here
(short last ids, shared prefixes, rewritten histories, evictions) and on a slice of the real
Claude Code trace when ``../shared/data`` holds it."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from simlab.fastpaths.radix import kernel as radix_kernel
from simlab.run import routes
from simlab.run.simulate import plan_run, policy_step, run_policy, trace_requests
from tests.fixtures import compose
from tests.test_compat import needs_data
from traces.format import Request

pytest.importorskip("numba", reason="the compiled path needs numba (pip install simlab[fast])")

TUNED = ["+policy=marconi", "policy.tuning.workers=1", "model=nemotron_h_8b"]
BLOCK = 16


def hashed_trace(seed: int = 3, sessions: int = 6, turns: int = 12) -> list[Request]:
    """Sessions whose prompts extend their history by a few ids of ``BLOCK`` tokens each (the
    last one short, its true tokens in ``ref_input_tokens``), some on a common system prompt,
    interleaved in arrival order."""
    rng = np.random.default_rng(seed)
    system = np.arange(1, 9, dtype=np.int32)
    requests: list[tuple[float, int, int, np.ndarray, int]] = []
    next_id = 100
    for s in range(sessions):
        history = system.copy() if s % 2 else np.zeros(0, np.int32)
        for t in range(turns):
            added = int(rng.integers(2, 12))
            history = np.concatenate((history, np.arange(next_id, next_id + added, dtype=np.int32)))
            next_id += added
            tokens = len(history) * BLOCK - int(rng.integers(0, BLOCK))  # short last id
            arrival = t * 10.0 + s
            requests.append((arrival, s, t, history.copy(), tokens))
            if rng.random() < 0.3:  # a rewritten turn: the history loses its tail
                history = history[: max(1, len(history) - int(rng.integers(1, 4)))]
    requests.sort(key=lambda r: (r[0], r[1]))
    empty = np.zeros(0, np.int32)
    return [
        Request(i, s, t, arrival, ids, empty, 0, BLOCK, tokens)
        for i, (arrival, s, t, ids, tokens) in enumerate(requests)
    ]


def run(overrides: list[str], compiled: bool, requests: list[Request] | None = None):
    cfg = compose(["engine=replay", *overrides, f"cache.compiled={str(compiled).lower()}"])
    plan = plan_run(cfg)
    block = BLOCK
    if requests is None:
        trace, requests = trace_requests(plan.trace, plan.settings)
        block = trace.block_size
    (spec,) = plan.policies.values()
    return run_policy(spec, requests, plan.model, plan.settings, plan.engine, block)


def tunings(caplog) -> list[str]:
    """The tuner's log lines (window, every grid alpha's score, the alpha adopted), less their
    wall time."""
    lines = [r.getMessage() for r in caplog.records]
    return [re.sub(r"\(\d+\.\d+ s\)", "", m) for m in lines if "alpha tuning at request" in m]


def assert_same_run(overrides, caplog, requests=None, tuned=True) -> None:
    caplog.set_level("INFO", logger="simlab")
    got = run(overrides, compiled=True, requests=requests)
    timed = "engine=timed" in overrides
    assert got.route is not None
    assert got.route.taken == ("timed_world" if timed else "compiled_radix")
    assert not timed or "the alpha grid search compiled" in caplog.text
    got_tunings = tunings(caplog)
    caplog.clear()
    want = run(overrides, compiled=False, requests=requests)
    assert want.route is not None and want.route.taken in ("timed_world", "request_step")
    assert "the alpha grid search compiled" not in caplog.text
    assert got_tunings == tunings(caplog) and bool(got_tunings) == tuned
    for name, column in want.records.items():
        assert np.array_equal(got.records[name], column, equal_nan=column.dtype.kind == "f"), name
    timing = ("wall_s", "requests_per_s", "tuning_wall_s", "snapshot_wall_s")
    for key, value in want.summary.items():
        if key not in timing:
            nan = isinstance(value, float) and math.isnan(value)
            assert got.summary[key] == value or (nan and math.isnan(got.summary[key])), key
    assert not tuned or want.summary["alpha_tunings"] >= 1


SMALL = {
    "robust, 0.6 GB": ["cache.size_gb=0.6", "policy.tuning.retune_every=20"],
    "paper, FLOPs saved, 0.5 GB": ["cache.size_gb=0.5", "policy.tuning.protocol=paper"],
    "robust, 4 MB, states rounded down to 4-id chunks": [
        "cache.size_gb=0.8",
        "policy.tuning.retune_every=15",
        "policy.admission.alignment=round_down",
        f"policy.admission.chunk_size={4 * BLOCK}",
    ],
}


ENGINES = ["engine=replay", "engine=timed"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", list(SMALL))
def test_a_hash_id_run_on_the_kernel_tunes_as_the_request_step(case, engine, caplog):
    requests = hashed_trace()
    assert sum(r.input_tokens < r.input_len * BLOCK for r in requests) > len(requests) // 2
    assert_same_run([*TUNED, "trace=mooncake", *SMALL[case], engine], caplog, requests)


UNTUNED = {
    "SGLang+ (LRU), 0.5 GB": ["+policy=sglang_plus", "cache.size_gb=0.5"],
    "Marconi, alpha 1, 0.3 GB (admissions truncated)": [
        "+policy=marconi",
        "policy.tuning.enabled=false",
        "cache.size_gb=0.3",
    ],
    "vLLM+ (a state every 2 ids), 2 GB": [
        "+policy=vllm_plus",
        f"policy.admission.block_size={2 * BLOCK}",
        "cache.size_gb=2",
    ],
}


@pytest.mark.parametrize("case", list(UNTUNED))
def test_an_untuned_hash_id_replay_on_the_kernel_is_the_request_steps(case, caplog):
    overrides = ["model=nemotron_h_8b", "trace=mooncake", *UNTUNED[case]]
    assert_same_run(overrides, caplog, hashed_trace(seed=5), tuned=False)


def test_a_claude_code_slice_tunes_as_the_request_step(caplog):
    needs_data("claude_code")
    overrides = [*TUNED, "trace=claude_code", "trace.sessions=2", "cache.size_gb=1"]
    assert_same_run([*overrides, "policy.tuning.retune_every=40"], caplog)


def test_ids_of_many_tokens_compile_on_a_hybrid_only():
    """A Transformer's token-keyed tree over ids of many tokens counts a short last id's true
    tokens and leaves one token, not one id (``PrefixCache.exact_tokens``): request by request;
    so are ids of another size than the cache's."""
    requests = hashed_trace()
    for model, why in (("nemotron_h_8b", None), ("llama3_8b", "pages or ids of many tokens")):
        cfg = compose(["engine=replay", "+policy=sglang_plus", f"model={model}", "trace=mooncake"])
        plan = plan_run(cfg)
        (spec,) = plan.policies.values()
        step = policy_step(spec, plan.model, plan.settings, BLOCK)
        assert routes.radix_refusal(step, requests) == why
    tokens = Request(0, 0, 0, 0.0, np.array([5], np.int32), np.zeros(0, np.int32), 0)
    assert routes.radix_refusal(step, [*requests, tokens]) == "pages or ids of many tokens"


def test_short_keys_become_kernel_ids_below_two_to_the_31():
    ids = np.array([7, 9, -1], np.int32)
    assert radix_kernel.kernel_ids(ids).tolist() == [7, 9, 2**31 - 1]
    with pytest.raises(ValueError, match="ids must stay below"):
        radix_kernel.kernel_ids(np.array([2**31 - 1, -1], np.int64))
