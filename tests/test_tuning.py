"""Marconi's alpha tuning: the protocol, its snapshot and replay, determinism, the known answer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from policies.flop_aware import FlopAware
from policies.judicious import Judicious
from policies.marconi_plus import MarconiPlus
from simlab.cache.prefix import PrefixCache
from simlab.cache.snapshot import pack, unpack
from simlab.config import ConfigError, run_settings
from simlab.engines.records import records_frame
from simlab.engines.replay import replay
from simlab.engines.tuning.search import best_alpha, choose_alpha, worker_pool
from simlab.engines.tuning.settings import PROTOCOLS, TuningSettings
from simlab.engines.tuning.tuner import AlphaTuner
from simlab.engines.tuning.window import (
    WindowImage,
    WindowResult,
    empty_like,
    replay_window,
    snapshot,
)
from simlab.run.simulate import policy_spec, policy_step
from tests.fixtures import chat_trace, compose, model
from traces.format import Trace, make_frame

HYBRID = model("marconi_7b")
LLAMA = model("llama3_8b")
CKPT = HYBRID.ssm_state_bytes
GRID = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)


def tuned(workers: int = 1, eviction=None, **settings) -> tuple[FlopAware, AlphaTuner]:
    """A FLOP-aware policy (or ``eviction``) and the alpha tuner that controls it."""
    policy = FlopAware() if eviction is None else eviction
    config = {"enabled": True, "grid": GRID, "workers": workers, **settings}
    tuner = AlphaTuner.for_policy(config, policy, "marconi")
    assert tuner is not None
    return policy, tuner


def run(trace: Trace, eviction, capacity: float, tuner: AlphaTuner | None = None, spec=HYBRID):
    cache = PrefixCache(spec, capacity)
    controllers = () if tuner is None else (tuner,)
    records = replay(trace.requests(), cache, Judicious(), eviction, "marconi", controllers)
    return cache, records_frame(records)


def rate(frame) -> float:
    return frame["hit_tokens"].sum() / frame["input_tokens"].sum()


def _trace(name: str, rows: list[dict]) -> Trace:
    for i, row in enumerate(rows):
        row.setdefault("turn", 0)
        row["arrival"] = float(i)
        row["output_len"] = len(row["output_ids"])
    return Trace(name=name, frame=make_frame(rows))


def documents_trace(cycles: int = 8) -> Trace:
    """Three long documents asked about in turn, each ask followed by four one-off short prompts.

    Recency evicts a document before it comes round again (the short prompts push it out); the
    FLOP-aware score keeps the documents (many FLOPs per byte) and drops the short prompts (their
    SSM checkpoint dominates their bytes): any alpha > 0 clearly wins.
    """
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 30000, 3000, dtype=np.int32) for _ in range(3)]
    rows, sid = [], 0
    for _ in range(cycles):
        for doc in docs:
            question = rng.integers(30000, 32000, 20, dtype=np.int32)
            rows.append(
                dict(
                    session_id=sid,
                    input_ids=np.concatenate((doc, question)),
                    output_ids=rng.integers(0, 32000, 30, dtype=np.int32),
                )
            )
            sid += 1
            for _ in range(4):
                rows.append(
                    dict(
                        session_id=sid,
                        input_ids=rng.integers(0, 32000, 100, dtype=np.int32),
                        output_ids=rng.integers(0, 32000, 50, dtype=np.int32),
                    )
                )
                sid += 1
    return _trace("documents", rows)


def conversations_trace(rounds: int = 25) -> Trace:
    """Three chats whose every turn reuses the whole history, and one long one-off prompt per
    round. A high alpha keeps the one-offs (never reused) and drops the chats: it clearly loses."""
    rng = np.random.default_rng(1)
    histories = [rng.integers(0, 32000, 200, dtype=np.int32) for _ in range(3)]
    rows, turns = [], [0, 0, 0]
    for r in range(rounds):
        for s in range(3):
            prompt = np.concatenate((histories[s], rng.integers(0, 32000, 50, dtype=np.int32)))
            reply = rng.integers(0, 32000, 50, dtype=np.int32)
            rows.append(dict(session_id=s, turn=turns[s], input_ids=prompt, output_ids=reply))
            histories[s] = np.concatenate((prompt, reply))
            turns[s] += 1
        rows.append(
            dict(
                session_id=100 + r,
                input_ids=rng.integers(0, 32000, 6000, dtype=np.int32),
                output_ids=rng.integers(0, 32000, 20, dtype=np.int32),
            )
        )
    return _trace("conversations", rows)


# ---------------------------------------------------------------------------------- settings
def test_marconi_is_tuned_by_default_with_the_robust_protocol():
    cfg = compose(["+policy=marconi", "policy.tuning.grid=[2,0,1]"])
    step = policy_step(policy_spec("marconi", cfg.policy), HYBRID, run_settings(cfg))
    (tuner,) = step.controllers
    assert isinstance(tuner, AlphaTuner) and tuner.settings.grid == (0.0, 1.0, 2.0)
    robust = PROTOCOLS["robust"]
    assert tuner.settings.protocol == "robust"
    assert tuner.settings.objective == robust["objective"] == "token_hit_rate"
    assert tuner.settings.snapshot == robust["snapshot"] == "first_eviction"
    assert tuner.settings.retune_every == robust["retune_every"] is not None
    assert step.eviction.alpha == 0.0  # alpha = 0 until the first tuning
    assert tuner.template.alpha == 1.0 and tuner.template is not step.eviction


def test_tuning_off_runs_the_fixed_alpha():
    cfg = compose(["+policy=marconi", "policy.tuning.enabled=false", "policy.alpha=0.7"])
    step = policy_step(policy_spec("marconi", cfg.policy), HYBRID, run_settings(cfg))
    assert step.controllers == () and step.eviction.alpha == 0.7


def test_marconi_plus_takes_the_same_tuning_block():
    cfg = compose(["+policy=marconi_plus"])
    assert set(cfg.policy.tuning) == set(compose(["+policy=marconi"]).policy.tuning)
    step = policy_step(policy_spec("marconi_plus", cfg.policy), HYBRID, run_settings(cfg))
    assert step.controllers == () and step.eviction.alpha == 1.0


def test_one_override_selects_the_paper_protocol():
    cfg = compose(["+policy=marconi", "policy.tuning.protocol=paper"])
    (tuner,) = policy_step(
        policy_spec("marconi", cfg.policy), HYBRID, run_settings(cfg)
    ).controllers
    s = tuner.settings
    assert s.grid == tuple(i / 10 for i in range(21)) and len(s.grid) == 21
    assert (s.bootstrap_multiplier, s.objective, s.snapshot) == (5.0, "flops_saved", "start")
    assert (s.score_last, s.retune_every, s.margin) == (500, None, 0.0)


def test_explicit_keys_override_the_protocol_and_nulls_take_it():
    s = TuningSettings.resolve(protocol="paper", objective="token_hit_rate", grid=None)
    assert s.objective == "token_hit_rate" and s.grid == PROTOCOLS["paper"]["grid"]
    assert s.snapshot == "start" and s.score_last == 500
    cfg = compose(
        ["+policy=marconi", "policy.tuning.protocol=paper", "policy.tuning.bootstrap_multiplier=15"]
    )
    assert TuningSettings.from_config(cfg.policy.tuning).bootstrap_multiplier == 15
    assert TuningSettings.resolve(enabled=True) == TuningSettings(enabled=True)  # robust


def test_tuning_a_policy_without_set_alpha_fails_clearly():
    cfg = compose(["+policy=sglang_plus", "+policy.tuning.enabled=true"])
    with pytest.raises(ConfigError, match="set_alpha"):
        policy_step(policy_spec("sglang_plus", cfg.policy), HYBRID, run_settings(cfg))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("policy.tuning.grid=[]", "policy.tuning.grid"),
        ("policy.tuning.grid=[-1,2]", "policy.tuning.grid"),
        ("policy.tuning.grid=[0.5,1,2]", "policy.tuning.grid must contain 0"),
        ("policy.tuning.protocol=oracle", "policy.tuning.protocol must be one of"),
        ("policy.tuning.objective=latency", "policy.tuning.objective"),
        ("policy.tuning.snapshot=never", "policy.tuning.snapshot"),
        ("policy.tuning.score_last=0", "policy.tuning.score_last must be an integer >= 1"),
        ("policy.tuning.margin=-0.1", "policy.tuning.margin"),
        ("policy.tuning.bootstrap_multiplier=0", "bootstrap_multiplier"),
        ("policy.tuning.workers=0", "policy.tuning.workers"),
        ("policy.tuning.retune_every=0", "retune_every"),
        ("+policy.tuning.bogus=1", "unknown key"),
    ],
)
def test_bad_tuning_settings_fail_clearly(override, message):
    cfg = compose(["+policy=marconi", override])
    with pytest.raises(ConfigError, match=message) as err:
        policy_step(policy_spec("marconi", cfg.policy), HYBRID, run_settings(cfg))
    assert "\n" not in str(err.value)  # one line


@pytest.mark.parametrize("protocol", ["paper", "robust"])
def test_every_protocol_rejects_a_grid_without_zero(protocol):
    with pytest.raises(ValueError, match=r"policy\.tuning\.grid must contain 0"):
        TuningSettings.resolve(enabled=True, protocol=protocol, grid=[0.1, 1.0])


def test_ties_go_to_the_smallest_alpha():
    assert best_alpha({0.0: 0.5, 1.0: 0.7, 2.0: 0.7, 4.0: 0.1}) == 1.0
    assert best_alpha({8.0: 0.2, 0.5: 0.2}) == 0.5


def _results(**shares: float) -> dict[float, WindowResult]:
    """Window results whose token hit rate is each share (keys: ``a0_5`` = alpha 0.5)."""
    return {
        float(k[1:].replace("_", ".")): WindowResult(hit_tokens=round(v * 1000), input_tokens=1000)
        for k, v in shares.items()
    }


def test_the_incumbent_is_kept_unless_beaten_by_more_than_the_margin():
    results = _results(a0=0.30, a0_5=0.34, a1=0.36)
    assert choose_alpha(results, "token_hit_rate", incumbent=0.5, margin=0.05) == 0.5
    assert choose_alpha(results, "token_hit_rate", incumbent=0.5, margin=0.01) == 1.0
    assert choose_alpha(results, "token_hit_rate", incumbent=0.0, margin=0.05) == 1.0
    # margin 0: a tie with the incumbent keeps it; an unscored incumbent never blocks
    tie = _results(a0=0.3, a0_5=0.3)
    assert choose_alpha(tie, "token_hit_rate", incumbent=0.5, margin=0.0) == 0.5
    assert choose_alpha(tie, "token_hit_rate", incumbent=0.7, margin=0.0) == 0.0


def test_the_margin_of_flops_saved_is_a_share_of_the_prefill_flops():
    results = {
        0.0: WindowResult(flops_saved=30.0, prefill_flops=100.0),
        1.0: WindowResult(flops_saved=33.0, prefill_flops=100.0),
    }
    assert choose_alpha(results, "flops_saved", incumbent=0.0, margin=0.02) == 1.0
    assert choose_alpha(results, "flops_saved", incumbent=0.0, margin=0.05) == 0.0


def test_disabled_tuning_is_none():
    assert TuningSettings.from_config({"enabled": False}) is None
    assert TuningSettings.from_config(None) is None


# ---------------------------------------------------------------------------------- snapshot
def _filled_cache(capacity: float) -> tuple[PrefixCache, list]:
    requests = list(chat_trace(seed=6).requests())
    cache = PrefixCache(HYBRID, capacity)
    adm, ev = Judicious(), FlopAware(alpha=1.0)
    replay_window(cache, requests[:40], adm, ev)
    return cache, requests[40:]


def test_snapshot_is_an_independent_equal_copy():
    cache, rest = _filled_cache(12 * CKPT)
    cache.pin(next(iter(cache.root.children.values())))
    copy = snapshot(cache)
    copy.check_invariants()
    assert (copy.kv_bytes, copy.ssm_bytes, copy.now) == (cache.kv_bytes, cache.ssm_bytes, cache.now)
    assert not copy.pins.any() and cache.pins.any()
    shape = lambda c: sorted((n.start, n.end, n.ckpt, n.nid) for n in c.nodes())  # noqa: E731
    assert shape(copy) == shape(cache)
    cache.unpin(next(iter(cache.root.children.values())))
    # the same requests on the original and on the copy take the same decisions
    a = replay_window(cache, rest, Judicious(), FlopAware(alpha=1.0))
    b = replay_window(copy, rest, Judicious(), FlopAware(alpha=1.0))
    assert a == b and shape(copy) == shape(cache)


def test_an_image_can_be_unpacked_many_times():
    cache, rest = _filled_cache(12 * CKPT)
    image = pack(cache)
    first = replay_window(unpack(image), rest, Judicious(), FlopAware(alpha=2.0))
    second = replay_window(unpack(image), rest, Judicious(), FlopAware(alpha=2.0))
    assert first == second


def test_a_deep_tree_packs_without_recursion():
    cache = PrefixCache(HYBRID, math.inf)
    seq = np.arange(30000, dtype=np.int32)
    cache.insert(seq, list(range(5, 30001, 5)), 30000, FlopAware())  # a chain of 6000 nodes
    copy = snapshot(cache)
    copy.check_invariants()
    assert sum(1 for _ in copy.nodes()) == 6000


def test_a_window_packs_into_one_array_and_back():
    requests = list(chat_trace(seed=2).requests())
    image = WindowImage.pack(requests)
    assert image.ids.shape[0] == sum(r.input_len + r.output_ids.shape[0] for r in requests)
    for a, b in zip(requests, image.requests(), strict=True):
        assert np.array_equal(a.full_sequence(), b.full_sequence())
        assert (a.request_id, a.session_id, a.turn, a.arrival, a.output_len, a.input_tokens) == (
            b.request_id,
            b.session_id,
            b.turn,
            b.arrival,
            b.output_len,
            b.input_tokens,
        )


# ---------------------------------------------------------------------------------- protocol
#: The first tuning only (a robust tuner whose re-tunes fall after the end of every trace here).
ONCE = {"retune_every": 10**6}
#: The paper's protocol on this module's small grid.
PAPER = {"protocol": "paper", "grid": GRID}


def test_alpha_zero_until_the_window_is_replayed_then_the_winner():
    trace = conversations_trace()
    policy, tuner = tuned(bootstrap_multiplier=2, **ONCE)
    _, frame = run(trace, policy, 1.2e9, tuner)
    history = tuner.summary()["alpha_history"]
    n = tuner.summary()["bootstrap_requests"]
    assert history[0] == {"request": 0, "alpha": 0.0}
    assert len(history) == 2 and history[1]["window"] == [n, 3 * n]
    assert history[1]["request"] == 3 * n and history[1]["incumbent"] == 0.0
    # no eviction before request n: its admission evicted for the first time
    assert (
        frame["nodes_evicted"].iloc[: n - 1].sum() == 0 and frame["nodes_evicted"].iloc[n - 1] > 0
    )


def test_the_grid_search_replays_the_window_exactly():
    """alpha = 0 replayed from the snapshot reproduces the real run's hits over the window
    (the run itself used alpha = 0 there): snapshot and replay follow the engine."""
    trace = conversations_trace()
    policy, tuner = tuned(bootstrap_multiplier=2, **ONCE)
    _, frame = run(trace, policy, 1.2e9, tuner)
    step = tuner.summary()["alpha_history"][1]
    lo, hi = step["window"]
    window = frame.iloc[lo:hi]
    assert step["scores"]["0.0"] == window["hit_tokens"].sum() / window["input_tokens"].sum()


def test_tuning_picks_a_high_alpha_where_it_clearly_wins():
    trace = documents_trace()
    policy, tuner = tuned(bootstrap_multiplier=4, **ONCE)
    _, frame = run(trace, policy, 0.9e9, tuner)
    step = tuner.summary()["alpha_history"][1]
    scores = {float(a): v for a, v in step["scores"].items()}
    # every alpha > 0 keeps the documents (the same decisions, a tie): the smallest is adopted
    assert scores[0.0] == 0.0 and all(scores[a] == scores[8.0] > 0.3 for a in GRID[1:])
    assert step["alpha"] == 0.5 and policy.alpha == 0.5
    fixed = {a: rate(run(trace, FlopAware(alpha=a), 0.9e9)[1]) for a in (0.0, 0.5, 8.0)}
    assert fixed[8.0] == fixed[0.5] > fixed[0.0] + 0.3
    assert rate(frame) > fixed[0.0] + 0.2


def test_tuning_keeps_alpha_low_where_a_high_alpha_clearly_loses():
    trace = conversations_trace()
    policy, tuner = tuned(bootstrap_multiplier=2, **ONCE)
    _, frame = run(trace, policy, 1.2e9, tuner)
    step = tuner.summary()["alpha_history"][1]
    scores = {float(a): v for a, v in step["scores"].items()}
    # the window's hit rate falls as alpha grows; the one-offs' tokens are all misses
    assert [scores[a] for a in GRID] == sorted(scores.values(), reverse=True)
    assert step["alpha"] == 0.0 and scores[0.0] > 5 * scores[8.0]
    fixed = {a: rate(run(trace, FlopAware(alpha=a), 1.2e9)[1]) for a in (0.0, 8.0)}
    assert fixed[0.0] > fixed[8.0] + 0.3
    assert rate(frame) == pytest.approx(fixed[0.0])


def test_flops_saved_objective():
    policy, tuner = tuned(bootstrap_multiplier=4, objective="flops_saved", **ONCE)
    run(documents_trace(), policy, 0.9e9, tuner)
    step = tuner.summary()["alpha_history"][1]
    assert step["objective"] == "flops_saved" and step["alpha"] == 0.5
    assert step["scores"]["0.5"] > 1e12 and step["scores"]["0.0"] == 0.0


# -- the paper's protocol (the reference code's tuner)
@pytest.mark.parametrize("spec", [HYBRID, LLAMA], ids=["hybrid", "transformer"])
def test_paper_protocol_replays_the_trace_from_its_start_on_an_empty_cache(spec):
    """The window is the first 3N requests and its snapshot the empty cache: alpha 0 replayed
    from it reproduces the run itself (alpha 0 from the first request), so its FLOPs saved are
    the run's (on a Transformer, a snapshot holding the first request would let the replay of
    that request hit itself)."""
    trace = conversations_trace()
    policy, tuner = tuned(bootstrap_multiplier=3, score_last=10**6, **PAPER)
    _, frame = run(trace, policy, 1.2e9, tuner, spec)
    n = tuner.summary()["bootstrap_requests"]
    (step,) = tuner.summary()["alpha_history"][1:]
    assert step["window"] == step["scored"] == [0, 3 * n] and step["request"] == 3 * n
    assert step["objective"] == "flops_saved"
    assert step["scores"]["0.0"] == pytest.approx(frame["flops_saved"].iloc[: 3 * n].sum())
    assert n < 3 * n < len(frame)


def test_paper_protocol_scores_the_last_score_last_requests_of_each_replay():
    trace = conversations_trace()
    policy, tuner = tuned(bootstrap_multiplier=3, score_last=7, **PAPER)
    _, frame = run(trace, policy, 1.2e9, tuner)
    n = tuner.summary()["bootstrap_requests"]
    (step,) = tuner.summary()["alpha_history"][1:]
    assert step["window"] == [0, 3 * n] and step["scored"] == [3 * n - 7, 3 * n]
    scored = frame["flops_saved"].iloc[3 * n - 7 : 3 * n].sum()
    assert step["scores"]["0.0"] == pytest.approx(scored)


def test_paper_protocol_scores_the_last_500_by_default():
    trace = documents_trace(cycles=40)  # 600 requests
    policy, tuner = tuned(bootstrap_multiplier=50, **PAPER)
    _, frame = run(trace, policy, 0.9e9, tuner)
    m = 50 * tuner.summary()["bootstrap_requests"]
    (step,) = tuner.summary()["alpha_history"][1:]
    assert 500 < m <= len(frame) and step["window"] == [0, m]
    assert step["scored"] == [m - 500, m]
    assert step["scores"]["0.0"] == pytest.approx(frame["flops_saved"].iloc[m - 500 : m].sum())


def test_paper_protocol_tunes_exactly_once():
    trace = documents_trace(cycles=12)
    policy, tuner = tuned(bootstrap_multiplier=1, **PAPER)
    _, frame = run(trace, policy, 0.9e9, tuner)
    n = tuner.summary()["bootstrap_requests"]
    history = tuner.summary()["alpha_history"]
    assert len(frame) > 10 * n and len(history) == 2 and history[1]["window"] == [0, n]
    assert tuner.summary()["alpha_tunings"] == 1 and tuner.summary()["alpha_protocol"] == "paper"


def test_paper_protocol_keeps_alpha_zero_if_the_trace_ends_first():
    trace = documents_trace()
    policy, tuner = tuned(bootstrap_multiplier=100, **PAPER)
    _, frame = run(trace, policy, 0.9e9, tuner)
    assert tuner.summary()["bootstrap_requests"] is not None
    assert tuner.summary()["alpha_history"] == [{"request": 0, "alpha": 0.0}]
    assert policy.alpha == 0.0
    assert frame.equals(run(trace, FlopAware(alpha=0.0), 0.9e9)[1])


def test_the_start_snapshot_is_an_empty_cache_of_the_same_shape():
    cache, _ = _filled_cache(12 * CKPT)
    empty = empty_like(cache)
    empty.check_invariants()
    fresh = PrefixCache(HYBRID, 12 * CKPT)
    assert [n.nid for n in empty.nodes()] == [n.nid for n in fresh.nodes()]
    assert (empty.capacity, empty.kv_bytes, empty.ssm_bytes, empty.now) == (12 * CKPT, 0, 0, 0)


# -- the robust protocol
def test_periodic_retuning_on_a_sliding_window():
    policy, tuner = tuned(bootstrap_multiplier=2, retune_every=10, window=15)
    _, frame = run(documents_trace(), policy, 0.9e9, tuner)
    history = tuner.summary()["alpha_history"]
    n = tuner.summary()["bootstrap_requests"]
    first = 3 * n
    assert [h["request"] for h in history[1:]] == list(range(first, len(frame) + 1, 10))
    for h in history[2:]:
        lo, hi = h["window"]
        assert hi == h["request"] and hi - lo == 15


def test_robust_retunes_by_default():
    policy, tuner = tuned(bootstrap_multiplier=1)
    _, frame = run(documents_trace(cycles=30), policy, 0.9e9, tuner)
    every = PROTOCOLS["robust"]["retune_every"]
    n = tuner.summary()["bootstrap_requests"]
    history = tuner.summary()["alpha_history"]
    assert [h["request"] for h in history[1:]] == list(range(2 * n, len(frame) + 1, every))
    assert len(history) > 2 and history[1]["window"] == [n, 2 * n]


def test_a_window_longer_than_the_run_starts_at_the_first_eviction():
    policy, tuner = tuned(bootstrap_multiplier=1, retune_every=10, window=10**9)
    run(documents_trace(), policy, 0.9e9, tuner)
    n = tuner.summary()["bootstrap_requests"]
    history = tuner.summary()["alpha_history"]
    assert len(history) > 3 and all(h["window"] == [n, h["request"]] for h in history[1:])


def test_an_adopted_alpha_never_scores_below_alpha_zero_or_the_incumbent():
    """What the design guarantees, on every window: the adopted alpha's replay scores at least
    the incumbent's, and alpha 0's (0 is always in the grid) up to the margin; a switch beats
    the incumbent by more than the margin."""
    for margin in (0.0, 0.02):
        policy, tuner = tuned(bootstrap_multiplier=1, retune_every=8, window=24, margin=margin)
        run(documents_trace(cycles=12), policy, 0.9e9, tuner)
        history = tuner.summary()["alpha_history"]
        assert len(history) > 5
        for h in history[1:]:
            scores = {float(a): v for a, v in h["scores"].items()}
            assert scores[h["alpha"]] >= scores[h["incumbent"]]
            assert scores[h["alpha"]] >= scores[0.0] - margin
            if h["alpha"] != h["incumbent"]:
                assert scores[h["alpha"]] > scores[h["incumbent"]] + margin


@pytest.mark.parametrize("protocol", [PAPER, {"window": 20}])
def test_a_tuned_run_is_the_alpha_zero_run_until_its_first_tuning(protocol):
    trace = documents_trace()
    policy, tuner = tuned(bootstrap_multiplier=2, **protocol)
    _, frame = run(trace, policy, 0.9e9, tuner)
    first = tuner.summary()["alpha_history"][1]["request"]
    fixed = run(trace, FlopAware(alpha=0.0), 0.9e9)[1]
    assert frame.iloc[:first].equals(fixed.iloc[:first])


@pytest.mark.parametrize("protocol", [PAPER, {"retune_every": 15}])
def test_tuned_run_is_deterministic_across_worker_counts(protocol):
    trace = documents_trace(cycles=6)
    out = {}
    for workers in (1, 2, 3):
        worker_pool(workers - 1, wait=True)  # started: the grid search uses them from the first
        policy, tuner = tuned(workers=workers, bootstrap_multiplier=2, **protocol)
        _, frame = run(trace, policy, 0.9e9, tuner)
        out[workers] = (frame, tuner.summary()["alpha_history"])
    assert len(out[1][1]) > 1
    for workers in (2, 3):
        assert out[1][0].equals(out[workers][0])
        assert out[1][1] == out[workers][1]


def _pool_here() -> bool:
    return worker_pool(1, wait=True) is None


def test_grid_search_pool_only_outside_joblib_workers():
    """The grid search's workers: none for one process or inside a joblib worker (a sweep's
    point runs every share itself), a pool kept between calls otherwise."""
    from joblib import Parallel, delayed

    assert worker_pool(0) is None
    pool = worker_pool(1, wait=True)
    assert pool is not None and worker_pool(1) is pool
    assert Parallel(n_jobs=2)(delayed(_pool_here)() for _ in range(2)) == [True, True]


def test_no_eviction_no_tuning():
    policy, tuner = tuned()
    _, _frame = run(chat_trace(seed=1), policy, math.inf, tuner)
    summary = tuner.summary()
    assert summary["alpha_history"] == [{"request": 0, "alpha": 0.0}]
    assert summary["bootstrap_requests"] is None and summary["alpha_tunings"] == 0


@pytest.mark.parametrize(
    ("policy", "engine", "protocol"),
    [
        ("marconi", "replay", "robust"),
        ("marconi", "timed", "robust"),
        ("marconi", "replay", "paper"),
        ("marconi_plus", "replay", "robust"),
    ],
)
def test_every_engine_and_tunable_policy_record_the_alpha_history(
    tmp_path, policy, engine, protocol
):
    from simlab.run.simulate import simulate

    overrides = [
        f"+policy={policy}",
        "policy.tuning.enabled=true",
        f"policy.tuning.protocol={protocol}",
        "policy.tuning.bootstrap_multiplier=1",
        "policy.tuning.workers=1",
        f"engine={engine}",
        "trace=chat",
        "trace.n_sessions=20",
        "cache.size_gb=0.3",
        f"output_dir={tmp_path}",
    ]
    summary = simulate(compose(overrides))
    entry = json.loads((tmp_path / "summary.json").read_text())["policies"][policy]
    history = entry["alpha_history"]
    assert history == summary.policies[policy]["alpha_history"]
    assert entry["alpha_protocol"] == protocol
    n = summary.policies[policy]["bootstrap_requests"]
    assert len(history) >= 2 and history[1]["alpha"] in PROTOCOLS[protocol]["grid"]
    assert history[1]["window"] == ([0, n] if protocol == "paper" else [n, 2 * n])


def test_any_tunable_policy_is_tuned_through_set_alpha():
    """The tuner is not Marconi's: Marconi+ (another Tunable) runs alpha 0 until the grid
    search, which replays fresh copies of the policy as configured, then adopts the winner."""
    policy, tuner = tuned(eviction=MarconiPlus(alpha=3.0), bootstrap_multiplier=4, **ONCE)
    assert policy.alpha == 0.0 and tuner.template.alpha == 3.0
    run(documents_trace(), policy, 0.9e9, tuner)
    history = tuner.summary()["alpha_history"]
    assert len(history) == 2 and policy.alpha == history[1]["alpha"]
    assert len(history[1]["scores"]) == len(GRID)
