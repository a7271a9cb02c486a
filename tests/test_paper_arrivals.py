"""The Marconi paper's trace construction as config options: uniform session starts
(``arrivals.mode=uniform``), typing-time gaps from the chat loaders' ``ref_user_words``
(``arrivals.gaps=typing``), Poisson whole-second gaps (``arrivals.gaps=poisson_seconds``) and
ShareGPT's ``max_tokens`` cap. The default (Poisson starts, exponential gaps) must not move."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from simlab.config import ArrivalSettings, ConfigError, run_settings
from simlab.run.plan import trace_spec
from simlab.run.simulate import load_trace
from tests.fixtures import ROOT, compose
from traces.arrival_modes import assign
from traces.arrivals import GapsError, assign_arrivals
from traces.format import Trace, make_frame
from traces.lmsys import load_lmsys
from traces.paths import resolve_data_dir
from traces.sharegpt import (
    conversation_messages,
    load_sharegpt,
    read_conversations,
    request_positions,
    sharegpt_path,
    user_words,
)

LMSYS = resolve_data_dir(None) / "lmsys" / "lmsys_1000.jsonl"
#: ShareGPT's first selected conversation and the words (spaces) of its first user messages
SHAREGPT_FIRST_ID = "SWdKUmo_0"
SHAREGPT_FIRST_WORDS = [19, 15, 8, 17]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("paper_arrivals_cache")


@pytest.fixture(scope="module")
def sharegpt(cache: Path) -> Trace:
    return load_sharegpt(cache_dir=cache)


def uneven(n_sessions: int = 5, words: bool = False) -> Trace:
    """Session s has s + 2 requests; rows reversed; ``ref_user_words = 3 s + t + 1`` if asked."""
    rows = [
        dict(
            session_id=s,
            turn=t,
            arrival=np.nan,
            input_ids=[s + 1, t + 1],
            output_ids=[9],
            output_len=1,
            **({"ref_user_words": 3 * s + t + 1} if words else {}),
        )
        for s in range(n_sessions)
        for t in range(s + 2)
    ]
    return Trace(name="uneven", frame=make_frame(rows[::-1]))


def by_turn(trace: Trace) -> pd.DataFrame:
    return trace.frame.sort_values(["session_id", "turn"])


def session_gaps(trace: Trace) -> np.ndarray:
    """Within-session gaps (turn >= 1) in (session_id, turn) order."""
    return by_turn(trace).groupby("session_id")["arrival"].diff().dropna().to_numpy()


# --- default unchanged ------------------------------------------------------------------------

#: arrivals of uneven() under mode=poisson, captured from the code before arrivals.gaps existed
BEFORE = {
    (2.0, 1.0, 1): ("06d306b20230c13c", [11.132796705981837, 9.96695870532151, 0.0]),
    (0.5, 5.0, 42): ("5ab7ee1219e790f9", [36.133437707235665, 32.854456937420665, 0.0]),
    (3.0, 0.0, 7): ("de62d187ec181a8d", [0.8984648744299415, 0.8984648744299415, 0.0]),
}


@pytest.mark.parametrize(("rate", "think", "seed"), list(BEFORE))
@pytest.mark.parametrize("explicit", [False, True])
def test_poisson_default_is_byte_identical_to_before(
    rate: float, think: float, seed: int, explicit: bool
) -> None:
    gaps: dict[str, Any] = {"gaps": "exponential"} if explicit else {}
    out = assign(
        uneven(), mode="poisson", session_rate=rate, think_time_mean=think, seed=seed, **gaps
    )
    arrival = out.frame["arrival"].to_numpy()
    digest, (first, second, last) = BEFORE[(rate, think, seed)]
    assert hashlib.sha256(arrival.tobytes()).hexdigest()[:16] == digest
    assert [arrival[0], arrival[1], arrival[-1]] == [first, second, last]


def test_config_defaults_keep_todays_arrivals() -> None:
    arrivals = run_settings(compose(["+policy=sglang_plus"])).arrivals
    assert (arrivals.mode, arrivals.gaps) == ("poisson", "exponential")
    assert (arrivals.typing_wpm, arrivals.response_time) == (90, 7.5)


# --- uniform starts ---------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.25, 0.3, 1.0, 7.0])
def test_uniform_session_i_starts_at_exactly_i_over_rate(rate: float) -> None:
    rows = [
        dict(session_id=sid, turn=t, arrival=np.nan, input_ids=[1], output_ids=[2], output_len=1)
        for sid in (40, 3, 17, 9)  # sparse ids, out of order: i is the rank in session_id order
        for t in range(3)
    ]
    trace = Trace(name="sparse", frame=make_frame(rows), block_size=4)
    out = assign(trace, mode="uniform", session_rate=rate, think_time_mean=2.0, seed=0)
    starts = by_turn(out).groupby("session_id")["arrival"].first()
    assert starts.index.tolist() == [3, 9, 17, 40]
    assert starts.tolist() == [i / rate for i in range(4)]  # exact, not approximate
    assert out.block_size == 4 and trace.frame["arrival"].isna().all()
    assert (session_gaps(out) > 0).all()


def test_uniform_with_exponential_gaps_draws_only_the_gaps() -> None:
    trace = uneven()
    out = assign(trace, mode="uniform", session_rate=2.0, think_time_mean=3.0, seed=5)
    draws = np.random.default_rng(5).exponential(3.0, size=len(trace))
    first = by_turn(out)["turn"].to_numpy() == 0
    assert np.allclose(session_gaps(out), draws[~first], rtol=0, atol=1e-9)


# --- typing gaps ------------------------------------------------------------------------------


@pytest.mark.parametrize("wpm", [90.0, 45, 200.0])
def test_typing_gaps_are_words_times_60_over_wpm(wpm: float) -> None:
    trace = uneven(words=True)
    out = assign(trace, mode="uniform", session_rate=0.5, seed=3, gaps="typing", typing_wpm=wpm)
    frame = by_turn(out)
    words = frame.loc[frame["turn"] > 0, "ref_user_words"].to_numpy()
    assert session_gaps(out) == pytest.approx(words * 60.0 / wpm, rel=0, abs=1e-9)
    assert frame.groupby("session_id")["arrival"].first().tolist() == [0, 2, 4, 6, 8]
    again = assign(trace, mode="uniform", session_rate=0.5, seed=99, gaps="typing", typing_wpm=wpm)
    assert np.array_equal(out.frame["arrival"], again.frame["arrival"])  # no random draws


def test_typing_gaps_with_poisson_starts_keep_the_start_draws() -> None:
    trace = uneven(words=True)
    typed = assign(trace, mode="poisson", session_rate=2.0, seed=1, gaps="typing")
    plain = assign(trace, mode="poisson", session_rate=2.0, think_time_mean=0.0, seed=1)
    start = by_turn(typed).groupby("session_id")["arrival"].first()
    assert start.tolist() == by_turn(plain).groupby("session_id")["arrival"].first().tolist()


def test_user_words_counts_spaces() -> None:
    assert user_words("now do the same calculation on an amortized loan") == 8
    assert user_words("one") == 0
    assert user_words("") == 0
    assert user_words("two  spaces") == 2  # every space counts
    assert user_words("line\nbreak\ttab") == 0  # only U+0020 counts


def test_typing_gaps_on_the_real_sharegpt_loader(sharegpt: Trace) -> None:
    frame = sharegpt.frame
    assert frame["ref_user_words"].dtype == np.int64 and (frame["ref_user_words"] >= 0).all()
    with sharegpt_path() as path:
        records = read_conversations(path).records
    record = next(r for r in records if r.get("id") == SHAREGPT_FIRST_ID)
    messages = conversation_messages(record)
    assert messages is not None
    raw_words = [messages[p - 1][1].count(" ") for p in request_positions(messages)]
    session = frame[frame["ref_conversation_id"] == SHAREGPT_FIRST_ID].sort_values("turn")
    assert session["ref_user_words"].tolist() == raw_words
    assert raw_words[:4] == SHAREGPT_FIRST_WORDS
    out = assign(sharegpt, mode="uniform", session_rate=1.0, gaps="typing", typing_wpm=90)
    arrival = by_turn(out).query(f"ref_conversation_id == '{SHAREGPT_FIRST_ID}'")["arrival"]
    expected = np.cumsum([0.0, *(w * 60 / 90 for w in raw_words[1:])])
    assert arrival.to_numpy() == pytest.approx(expected, rel=0, abs=1e-9)
    assert arrival.iloc[:4].tolist() == pytest.approx([0.0, 30 / 3, 46 / 3, 80 / 3])


@pytest.mark.skipif(not LMSYS.is_file(), reason=f"LMSys sample not at {LMSYS}")
def test_lmsys_records_user_words(cache: Path) -> None:
    trace = load_lmsys(path=LMSYS, cache_dir=cache)
    frame = trace.frame
    assert frame["ref_user_words"].dtype == np.int64
    first = frame[frame["session_id"] == 0].sort_values("turn")
    conv_id = first["ref_conversation_id"].iloc[0]
    for line in LMSYS.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("conversation_id") == conv_id:
            break
    messages = [(m["role"], m["content"]) for m in record["conversation"]]
    positions = request_positions(messages)[: len(first)]
    assert first["ref_user_words"].tolist() == [user_words(messages[p - 1][1]) for p in positions]


def test_typing_gaps_need_the_word_counts() -> None:
    with pytest.raises(GapsError, match="trace 'uneven' has no ref_user_words column"):
        assign(uneven(), mode="uniform", gaps="typing")
    missing = uneven(words=True)
    missing.frame["ref_user_words"] = missing.frame["ref_user_words"].astype(float)
    missing.frame.loc[0, "ref_user_words"] = np.nan
    with pytest.raises(GapsError, match="missing or negative ref_user_words"):
        assign(missing, mode="uniform", gaps="typing")


def test_typing_on_a_trace_without_words_is_a_one_line_config_error() -> None:
    cfg = compose(["+policy=sglang_plus", "trace=chat", "arrivals.gaps=typing"])
    with pytest.raises(ConfigError) as err:
        load_trace(trace_spec(cfg), run_settings(cfg))
    message = str(err.value)
    assert message.startswith("arrivals.gaps=typing: trace 'chat_synthetic' has no ref_user_words")
    assert "\n" not in message


# --- Poisson whole-second gaps ----------------------------------------------------------------


def test_poisson_seconds_gaps_are_integers_with_the_right_mean() -> None:
    trace = uneven(n_sessions=400)  # 80,600 requests, 80,200 gaps
    out = assign(trace, mode="uniform", session_rate=0.25, seed=42, gaps="poisson_seconds")
    gaps = session_gaps(out)  # starts 4 i: every arrival is an integer, so are the gaps
    assert np.array_equal(gaps, np.round(gaps)) and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(7.5, rel=0.01)
    assert gaps.var() == pytest.approx(7.5, rel=0.05)  # Poisson: variance = mean


def test_poisson_seconds_draw_order_and_determinism() -> None:
    trace = uneven()
    kwargs: dict[str, Any] = {"mode": "uniform", "session_rate": 1.0, "gaps": "poisson_seconds"}
    a = assign(trace, seed=42, response_time=5, **kwargs)
    b = assign(trace, seed=42, response_time=5, **kwargs)
    c = assign(trace, seed=43, response_time=5, **kwargs)
    assert np.array_equal(a.frame["arrival"], b.frame["arrival"])
    assert not np.array_equal(a.frame["arrival"], c.frame["arrival"])
    n_gaps = len(trace) - trace.n_sessions
    expected = np.random.default_rng(42).poisson(5, size=n_gaps)
    assert session_gaps(a).tolist() == expected.astype(float).tolist()
    zero = assign(trace, seed=42, response_time=0.0, **kwargs)
    assert (session_gaps(zero) == 0).all()


def test_poisson_seconds_after_poisson_starts() -> None:
    trace = uneven()
    out = assign(
        trace, mode="poisson", session_rate=2.0, seed=7, gaps="poisson_seconds", response_time=10
    )
    rng = np.random.default_rng(7)
    rng.exponential(0.5, size=trace.n_sessions)  # the session starts come first
    expected = rng.poisson(10, size=len(trace) - trace.n_sessions)
    assert session_gaps(out) == pytest.approx(expected, rel=0, abs=1e-9)


# --- ShareGPT cap -----------------------------------------------------------------------------


def test_sharegpt_max_tokens_stops_a_session_before_the_request_that_exceeds_it(
    sharegpt: Trace, cache: Path
) -> None:
    cap = 1500  # the default selection peaks at 2555 tokens
    capped = load_sharegpt(cache_dir=cache, max_tokens=cap)
    sizes = capped.frame["input_ids"].map(len) + capped.frame["output_len"]
    assert sizes.max() <= cap and capped.n_sessions == 100
    full = by_turn(sharegpt)
    full_sizes = full["input_ids"].map(len) + full["output_len"]
    truncated = 0
    for conv_id, session in by_turn(capped).groupby("ref_conversation_id", sort=False):
        whole = full_sizes[full["ref_conversation_id"] == conv_id]
        if len(whole) == 0:  # a conversation the cap let in after an emptied one
            continue
        kept = len(session)
        assert kept == len(whole) or whole.iloc[kept] > cap
        assert (whole.iloc[:kept] <= cap).all()
        truncated += kept < len(whole)
    assert truncated > 0 and len(capped) < len(sharegpt)
    assert capped.frame["ref_user_words"].dtype == np.int64


def test_sharegpt_default_has_no_cap(sharegpt: Trace, cache: Path) -> None:
    big = load_sharegpt(cache_dir=cache, max_tokens=10**9)
    assert len(big) == len(sharegpt) and big.n_sessions == sharegpt.n_sessions
    with pytest.raises(ValueError, match="max_tokens"):
        load_sharegpt(cache_dir=cache, max_tokens=1)


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"session_rate": 0.0}, "arrivals.session_rate"),
        ({"session_rate": -2.0}, "arrivals.session_rate"),
        ({"typing_wpm": 0}, "arrivals.typing_wpm"),
        ({"typing_wpm": -90.0}, "arrivals.typing_wpm"),
        ({"typing_wpm": math.nan}, "arrivals.typing_wpm"),
        ({"typing_wpm": math.inf}, "arrivals.typing_wpm"),
        ({"typing_wpm": "fast"}, "arrivals.typing_wpm"),
        ({"response_time": -1.0}, "arrivals.response_time"),
        ({"response_time": math.nan}, "arrivals.response_time"),
        ({"response_time": math.inf}, "arrivals.response_time"),
        ({"response_time": True}, "arrivals.response_time"),
        ({"gaps": "gamma"}, "arrivals.gaps"),
        ({"gaps": "typing", "mode": "trace"}, "arrivals.gaps"),
        ({"gaps": "poisson_seconds", "mode": "timestamps"}, "arrivals.gaps"),
        ({"mode": "bursty"}, "arrivals.mode"),
    ],
)
def test_bad_arrival_settings_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        ArrivalSettings(**kwargs)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_good_arrival_settings_are_accepted() -> None:
    ArrivalSettings(mode="uniform", gaps="typing", typing_wpm=90)
    ArrivalSettings(mode="uniform", gaps="poisson_seconds", response_time=0)
    ArrivalSettings(mode="azure", gaps="poisson_seconds", response_time=10)


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"typing_wpm": 0.0}, "typing_wpm"),
        ({"response_time": -0.5}, "response_time"),
        ({"gaps": "gamma"}, "gaps"),
        ({"gaps": "typing", "mode": "trace"}, "gaps"),
    ],
)
def test_the_library_rejects_bad_gap_parameters(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        assign(uneven(words=True), **{"mode": "uniform", **kwargs})
    with pytest.raises(ValueError, match=word):
        assign_arrivals(uneven(words=True), session_rate=1.0, think_time_mean=1.0, seed=0, **kwargs)


# --- end to end -------------------------------------------------------------------------------


def simlab(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"HYDRA_FULL_ERROR": "0", "SIMLAB_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "simlab", *args, f"hydra.run.dir={tmp_path / 'run'}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)


def test_end_to_end_uniform_typing_run(tmp_path: Path) -> None:
    proc = simlab(
        tmp_path,
        "+policy=sglang_plus",
        "engine=replay",
        "arrivals.mode=uniform",
        "arrivals.gaps=typing",
        "report=false",
        "bounds.enabled=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = pd.read_parquet(tmp_path / "run" / "records.parquet")
    records = records.sort_values(["session_id", "turn"])
    starts = records.groupby("session_id")["arrival"].first()
    assert starts.tolist() == [float(i) for i in range(len(starts))]  # session_rate 1.0
    first = records[records["session_id"] == 0]["arrival"].iloc[:4].tolist()
    assert first == pytest.approx([0.0, 30 / 3, 46 / 3, 80 / 3])


def test_end_to_end_typing_without_words_fails_in_one_line(tmp_path: Path) -> None:
    proc = simlab(
        tmp_path,
        "+policy=sglang_plus",
        "trace=chat",
        "arrivals.mode=uniform",
        "arrivals.gaps=typing",
        "report=false",
        "bounds.enabled=false",
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("simlab: error: arrivals.gaps=typing: trace 'chat_synthetic'")
    assert "Traceback" not in proc.stderr
