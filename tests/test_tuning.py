"""Marconi's alpha tuning: the protocol, its snapshot and replay, determinism, the known answer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from policies.flop_aware import FlopAware
from policies.judicious import Judicious
from policies.marconi_plus import MarconiPlus
from simlab.cache import PrefixCache
from simlab.config import ConfigError, run_settings
from simlab.records import records_frame
from simlab.replay import replay
from simlab.simulate import policy_step
from simlab.snapshot import pack, unpack
from simlab.tuning import (
    AlphaTuner,
    TuningSettings,
    WindowImage,
    best_alpha,
    replay_window,
    snapshot,
)
from tests.fixtures import chat_trace, compose, model
from traces.format import Trace, make_frame

HYBRID = model("marconi_7b")
CKPT = HYBRID.ssm_state_bytes
GRID = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)


def tuned(workers: int = 1, eviction=None, **settings) -> tuple[FlopAware, AlphaTuner]:
    """A FLOP-aware policy (or ``eviction``) and the alpha tuner that controls it."""
    policy = FlopAware() if eviction is None else eviction
    config = {"enabled": True, "grid": GRID, "workers": workers, **settings}
    tuner = AlphaTuner.for_policy(config, policy, "marconi")
    assert tuner is not None
    return policy, tuner


def run(trace: Trace, eviction, capacity: float, tuner: AlphaTuner | None = None):
    cache = PrefixCache(HYBRID, capacity)
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
def test_settings_from_the_policy_config():
    cfg = compose(["+policy=marconi", "policy.tuning.enabled=true", "policy.tuning.grid=[2,0,1]"])
    step = policy_step("marconi", cfg.policy, HYBRID, run_settings(cfg))
    (tuner,) = step.controllers
    assert isinstance(tuner, AlphaTuner) and tuner.settings.grid == (0.0, 1.0, 2.0)
    assert tuner.settings.bootstrap_multiplier == 5
    assert step.eviction.alpha == 0.0  # the paper: alpha = 0 until the first tuning
    assert tuner.template.alpha == 1.0 and tuner.template is not step.eviction
    plain = compose(["+policy=marconi"])
    assert policy_step("marconi", plain.policy, HYBRID, run_settings(plain)).controllers == ()


def test_tuning_a_policy_without_set_alpha_fails_clearly():
    cfg = compose(["+policy=sglang_plus", "+policy.tuning.enabled=true"])
    with pytest.raises(ConfigError, match="set_alpha"):
        policy_step("sglang_plus", cfg.policy, HYBRID, run_settings(cfg))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("policy.tuning.grid=[]", "policy.tuning.grid"),
        ("policy.tuning.grid=[-1,2]", "policy.tuning.grid"),
        ("policy.tuning.objective=latency", "policy.tuning.objective"),
        ("policy.tuning.bootstrap_multiplier=0", "bootstrap_multiplier"),
        ("policy.tuning.workers=0", "policy.tuning.workers"),
        ("policy.tuning.retune_every=0", "retune_every"),
        ("+policy.tuning.bogus=1", "unknown key"),
    ],
)
def test_bad_tuning_settings_fail_clearly(override, message):
    cfg = compose(["+policy=marconi", "policy.tuning.enabled=true", override])
    with pytest.raises(ConfigError, match=message):
        policy_step("marconi", cfg.policy, HYBRID, run_settings(cfg))


def test_ties_go_to_the_smallest_alpha():
    assert best_alpha({0.0: 0.5, 1.0: 0.7, 2.0: 0.7, 4.0: 0.1}) == 1.0
    assert best_alpha({8.0: 0.2, 0.5: 0.2}) == 0.5


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
def test_alpha_zero_until_the_window_is_replayed_then_the_winner():
    trace = conversations_trace()
    policy, tuner = tuned(bootstrap_multiplier=2)
    _, frame = run(trace, policy, 1.2e9, tuner)
    history = tuner.summary()["alpha_history"]
    n = tuner.summary()["bootstrap_requests"]
    assert history[0] == {"request": 0, "alpha": 0.0}
    assert len(history) == 2 and history[1]["window"] == [n, 3 * n]
    assert history[1]["request"] == 3 * n
    # no eviction before request n: its admission evicted for the first time
    assert (
        frame["nodes_evicted"].iloc[: n - 1].sum() == 0 and frame["nodes_evicted"].iloc[n - 1] > 0
    )


def test_the_grid_search_replays_the_window_exactly():
    """alpha = 0 replayed from the snapshot reproduces the real run's hits over the window
    (the run itself used alpha = 0 there): snapshot and replay follow the engine."""
    trace = conversations_trace()
    policy, tuner = tuned(bootstrap_multiplier=2)
    _, frame = run(trace, policy, 1.2e9, tuner)
    step = tuner.summary()["alpha_history"][1]
    lo, hi = step["window"]
    window = frame.iloc[lo:hi]
    assert step["scores"]["0.0"] == window["hit_tokens"].sum() / window["input_tokens"].sum()


def test_tuning_picks_a_high_alpha_where_it_clearly_wins():
    trace = documents_trace()
    policy, tuner = tuned(bootstrap_multiplier=4)
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
    policy, tuner = tuned(bootstrap_multiplier=2)
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
    policy, tuner = tuned(bootstrap_multiplier=4, objective="flops_saved")
    run(documents_trace(), policy, 0.9e9, tuner)
    step = tuner.summary()["alpha_history"][1]
    assert step["objective"] == "flops_saved" and step["alpha"] == 0.5
    assert step["scores"]["0.5"] > 1e12 and step["scores"]["0.0"] == 0.0


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


def test_tuned_run_is_deterministic_across_worker_counts():
    trace = documents_trace(cycles=6)
    out = {}
    for workers in (1, 2):
        policy, tuner = tuned(workers=workers, bootstrap_multiplier=2, retune_every=15)
        _, frame = run(trace, policy, 0.9e9, tuner)
        out[workers] = (frame, tuner.summary()["alpha_history"])
    assert out[1][0].equals(out[2][0])
    assert out[1][1] == out[2][1]


def test_no_eviction_no_tuning():
    policy, tuner = tuned()
    _, _frame = run(chat_trace(seed=1), policy, math.inf, tuner)
    summary = tuner.summary()
    assert summary["alpha_history"] == [{"request": 0, "alpha": 0.0}]
    assert summary["bootstrap_requests"] is None and summary["alpha_tunings"] == 0


@pytest.mark.parametrize(
    ("policy", "engine"), [("marconi", "replay"), ("marconi", "timed"), ("marconi_plus", "replay")]
)
def test_every_engine_and_tunable_policy_record_the_alpha_history(tmp_path, policy, engine):
    from simlab.simulate import simulate

    overrides = [
        f"+policy={policy}",
        "policy.tuning.enabled=true",
        "policy.tuning.bootstrap_multiplier=1",
        "policy.tuning.workers=1",
        f"engine={engine}",
        "trace=chat",
        "trace.n_sessions=20",
        "cache.size_gb=0.3",
        f"output_dir={tmp_path}",
    ]
    summary = simulate(compose(overrides))
    history = json.loads((tmp_path / "summary.json").read_text())["policies"][policy][
        "alpha_history"
    ]
    assert history == summary.policies[policy]["alpha_history"]
    assert len(history) == 2 and history[1]["alpha"] in GRID
    n = summary.policies[policy]["bootstrap_requests"]
    assert history[1]["window"] == [n, 2 * n]


def test_any_tunable_policy_is_tuned_through_set_alpha():
    """The tuner is not Marconi's: Marconi+ (another Tunable) runs alpha 0 until the grid
    search, which replays fresh copies of the policy as configured, then adopts the winner."""
    policy, tuner = tuned(eviction=MarconiPlus(alpha=3.0), bootstrap_multiplier=4)
    assert policy.alpha == 0.0 and tuner.template.alpha == 3.0
    run(documents_trace(), policy, 0.9e9, tuner)
    history = tuner.summary()["alpha_history"]
    assert len(history) == 2 and policy.alpha == history[1]["alpha"]
    assert len(history[1]["scores"]) == len(GRID)
