"""Real-trace loaders beyond ShareGPT/SWE-bench: LMSys, Mooncake (block units), Azure, classic
SWE-agent trajectories and agent-history truncation, arrival modes. Each loader runs on the real
file in ../shared/data and on malformed input (truncated line, wrong field type, empty file):
strict = an error naming file and line, lenient = skipped and counted in the log."""

from __future__ import annotations

import io
import json
import logging
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from traces.agent_history import PLACEHOLDER
from traces.arrival_modes import assign, tiled_starts
from traces.azure import UNIQUE_BASE, azure_path, load_azure, load_azure_arrivals
from traces.cache import cached_trace
from traces.describe import ideal_reuse
from traces.format import Trace, TraceFormatError, make_frame, request_row
from traces.lmsys import load_lmsys
from traces.mooncake import load_mooncake
from traces.paths import DataFileMissingError, TraceFileError, resolve_data_dir
from traces.sweagent import load_sweagent
from traces.swebench import TAR_RELATIVE, load_swebench

REPO = Path(__file__).resolve().parent.parent
DATA = resolve_data_dir(None)
LMSYS = DATA / "lmsys" / "lmsys_1000.jsonl"
MOONCAKE = DATA / "mooncake" / "synthetic_trace.jsonl"
AZURE_CONV = DATA / "azure" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = DATA / "azure" / "AzureLLMInferenceTrace_code.csv"
SWE_TAR = DATA / TAR_RELATIVE


def needs(path: Path):
    return pytest.mark.skipif(not path.is_file(), reason=f"real data not at {path}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workload_cache")


def extends(trace: Trace) -> dict[tuple[int, int], bool]:
    """(session, turn t) -> whether input_{t+1} starts with input_t + output_t."""
    out = {}
    for sid, session in trace.frame.sort_values(["session_id", "turn"]).groupby("session_id"):
        inputs, outputs = list(session["input_ids"]), list(session["output_ids"])
        for t in range(len(inputs) - 1):
            full = np.concatenate((inputs[t], outputs[t]))
            out[(int(sid), t)] = bool(
                len(inputs[t + 1]) > len(full) and np.array_equal(inputs[t + 1][: len(full)], full)
            )
    return out


def write_lines(path: Path, lines: list[str], newline_at_end: bool = True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if newline_at_end else ""))
    return path


# --- LMSys -----------------------------------------------------------------------------------


def lmsys_record(turns: int, text: str = "hello", cid: str = "c") -> dict:
    conv = []
    for i in range(turns):
        conv += [
            {"role": "user", "content": f"{text} {i}"},
            {"role": "assistant", "content": f"reply {i}"},
        ]
    return {
        "conversation_id": cid,
        "model": "m",
        "turn": turns,
        "language": "English",
        "conversation": conv,
    }


@needs(LMSYS)
def test_lmsys_default_selection_on_the_shared_sample(cache: Path) -> None:
    trace = load_lmsys(cache_dir=cache)
    frame = trace.frame
    # the sample has 191 conversations with 3-20 turns: 15 have >= 10, none mostly non-ASCII,
    # none cut by the 32K cap -> 15 sessions, 188 requests
    assert (trace.name, trace.n_sessions, len(trace)) == ("lmsys", 15, 188)
    assert frame.groupby("session_id").size().min() >= 10
    assert (frame["input_ids"].map(len) + frame["output_len"]).max() <= 32768
    assert frame["ref_conversation_id"].nunique() == 15
    assert all(extends(trace).values()) and len(extends(trace)) == 188 - 15
    again = load_lmsys(cache_dir=cache)  # cache hit
    assert all(
        np.array_equal(a, b)
        for a, b in zip(frame["input_ids"], again.frame["input_ids"], strict=True)
    )
    everything = load_lmsys(cache_dir=cache, min_turns=1, limit=None, max_non_ascii=1.0)
    assert (everything.n_sessions, len(everything)) == (191, 1001)
    ascii_only = load_lmsys(cache_dir=cache, min_turns=1, limit=None)
    assert ascii_only.n_sessions == 188  # 3 conversations are > 50% non-ASCII


def test_lmsys_selection_rules(tmp_path: Path) -> None:
    records = [
        lmsys_record(12, cid="long"),
        lmsys_record(4, cid="short"),
        lmsys_record(11, text="\u043f\u0440\u0438\u0432\u0435\u0442" * 20, cid="russian"),
        lmsys_record(10, text="x " * 400, cid="capped"),
    ]
    path = write_lines(tmp_path / "l.jsonl", [json.dumps(r) for r in records])
    trace = load_lmsys(path=path, cache_dir=tmp_path / "c", max_tokens=4000)
    sizes = trace.frame.groupby("ref_conversation_id").size().to_dict()
    assert set(sizes) == {"long", "capped"} and sizes["long"] == 12
    assert 1 <= sizes["capped"] < 10  # the session stops before the request over the cap
    assert (trace.frame["input_ids"].map(len) + trace.frame["output_len"]).max() <= 4000
    with pytest.raises(TraceFileError, match="no conversation passes"):
        load_lmsys(path=path, cache_dir=tmp_path / "c", min_turns=50)


@pytest.mark.parametrize(
    ("lines", "fault", "line_no"),
    [
        (
            ['{"conversation": [{"role": "user", "content": "a"}]}', '{"conversation": [{"ro'],
            r"invalid JSON .*truncated\?",
            2,
        ),
        (
            ['{"conversation": [{"role": "user", "content": 7}]}'],
            r"conversation\[0\]: field 'content' is int",
            1,
        ),
        (['{"conversation": "hello"}'], "field 'conversation' is str", 1),
        (['{"conversation": [], "turn": 1}'], "empty list", 1),
        (['{"conversation": [{"role": "user", "content": "a"}], "turn": "3"}'], "field 'turn'", 1),
    ],
)
def test_lmsys_malformed_input_names_file_and_line(
    tmp_path: Path, lines: list[str], fault: str, line_no: int
) -> None:
    path = write_lines(tmp_path / "bad.jsonl", lines, newline_at_end="truncated" not in fault)
    with pytest.raises(TraceFileError, match=fault) as excinfo:
        load_lmsys(path=path, cache_dir=tmp_path / "c", min_turns=1)
    assert f"{path}:{line_no}:" in str(excinfo.value)


def test_lmsys_empty_file_lenient_and_missing_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    empty = write_lines(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(TraceFileError, match="empty file"):
        load_lmsys(path=empty, cache_dir=tmp_path / "c")
    good = json.dumps(lmsys_record(3))
    mixed = write_lines(tmp_path / "mixed.jsonl", [good, "{not json", good, '{"conversation": 1}'])
    with caplog.at_level(logging.WARNING):
        trace = load_lmsys(path=mixed, cache_dir=tmp_path / "c", min_turns=1, lenient=True)
    assert trace.n_sessions == 2
    assert "skipped 2 malformed record(s), kept 2" in caplog.text and f"{mixed}:2:" in caplog.text
    with pytest.raises(DataFileMissingError) as excinfo:
        load_lmsys(data_dir=tmp_path, cache_dir=tmp_path / "c")
    message = str(excinfo.value)
    assert str(tmp_path / "lmsys" / "lmsys_1000.jsonl") in message
    assert "lmsys/lmsys-chat-1m" in message and "license" in message and "trace.path" in message


# --- Mooncake --------------------------------------------------------------------------------


def brute_force_block_reuse(sequences: list[np.ndarray]) -> list[int]:
    """Per request: longest prefix of its ids equal to a prefix of an earlier request's ids,
    capped at len - 1 (all earlier rows compared at once, no tree)."""
    width = max(len(s) for s in sequences) + 1
    table = np.full((len(sequences), width), -1, dtype=np.int64)
    for i, seq in enumerate(sequences):
        table[i, : len(seq)] = seq
    hits = [0]
    for i in range(1, len(sequences)):
        seq = sequences[i]
        same = table[:i, : len(seq)] == seq
        leading = np.where(same.all(axis=1), len(seq), np.argmin(same, axis=1))
        hits.append(min(int(leading.max()), len(seq) - 1))
    return hits


@needs(MOONCAKE)
def test_mooncake_real_trace_in_block_units(cache: Path) -> None:
    trace = load_mooncake(cache_dir=cache)
    frame = trace.frame
    assert (trace.name, len(trace), trace.n_sessions, trace.block_size) == (
        "mooncake",
        3993,
        3993,
        512,
    )
    assert (frame["turn"] == 0).all() and (frame["output_ids"].map(len) == 0).all()
    assert frame["input_ids"].map(lambda a: a.dtype == np.int32).all()
    blocks = frame["input_ids"].map(len).to_numpy()
    assert np.array_equal(blocks, np.ceil(frame["ref_input_length"].to_numpy() / 512))
    assert frame["ref_timestamp"].iloc[0] == 0.0 and frame["ref_timestamp"].is_monotonic_increasing
    assert frame["output_len"].min() >= 0 and frame["output_len"].max() == 893  # tokens, not blocks
    reread = load_mooncake(cache_dir=cache)  # from the parquet cache: block size survives
    assert reread.block_size == 512 and len(reread) == 3993
    first = next(reread.requests())
    assert (first.input_len, first.input_tokens, first.block_size) == (79, 40160, 512)
    assert first.hit_tokens(78) == 78 * 512 and first.hit_tokens(79) == 40160


@needs(MOONCAKE)
def test_mooncake_infinite_cache_block_hits_equal_ideal_block_reuse(cache: Path) -> None:
    from policies.lru import LRU
    from simlab.cache.prefix import PrefixCache
    from simlab.model.spec import ModelSpec

    trace = load_mooncake(cache_dir=cache)
    spec = ModelSpec.from_config(OmegaConf.load(REPO / "configs/model/llama3_8b.yaml"))
    prefix_cache, policy = PrefixCache(spec, math.inf), LRU()
    requests = list(trace.requests())
    hits = []
    for req in requests:
        hits.append(prefix_cache.lookup(req.input_ids).hit)
        prefix_cache.insert(req.input_ids, [], req.input_len, policy)
    ideal = brute_force_block_reuse([r.input_ids for r in requests])
    assert hits == ideal
    assert sum(ideal) == 77_740  # blocks; 39.8M of 61.2M tokens
    token_hits = sum(r.hit_tokens(h) for r, h in zip(requests, hits, strict=True))
    assert token_hits == ideal_reuse(trace).reuse == 39_802_880


def mooncake_line(ts: float, length: int, ids: list[int], out: int = 5) -> str:
    return json.dumps(
        {"timestamp": ts, "input_length": length, "output_length": out, "hash_ids": ids}
    )


@pytest.mark.parametrize(
    ("bad", "fault"),
    [
        ('{"timestamp": 5, "input_length": 1024, "output_le', r"invalid JSON .*truncated\?"),
        (mooncake_line(5, 1024, [0, 1]).replace("1024", '"1024"'), "field 'input_length' is str"),
        (
            mooncake_line(5, 1024, [0, 1]).replace('"timestamp": 5', '"timestamp": null'),
            "field 'timestamp' is null",
        ),
        (mooncake_line(5, 1024, [0, "x"]), r"hash_ids\[1\]"),
        (mooncake_line(5, 1025, [0, 1]), r"needs ceil\(1025/512\) = 3"),
        (mooncake_line(5, 1024, [0, 1], out=-1), "expected >= 0"),
    ],
)
def test_mooncake_malformed_input_names_file_and_line(tmp_path: Path, bad: str, fault: str) -> None:
    truncated = "truncated" in fault
    path = write_lines(tmp_path / "m.jsonl", [mooncake_line(0, 600, [0, 1]), bad], not truncated)
    with pytest.raises(TraceFileError, match=fault) as excinfo:
        load_mooncake(path=path, cache_dir=tmp_path / "c")
    assert f"{path}:2:" in str(excinfo.value)


def test_mooncake_empty_lenient_and_remap(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(TraceFileError, match="empty file"):
        load_mooncake(path=write_lines(tmp_path / "e.jsonl", []), cache_dir=tmp_path / "c")
    big = 1 << 40  # ids outside int32 are remapped; equality (hence every match) is preserved
    lines = [
        mooncake_line(0, 1500, [big, big + 1, 7]),
        "{oops",
        mooncake_line(1000, 1100, [big, big + 1, 9]),
        mooncake_line(2500, 600, [big, 3]),
    ]
    path = write_lines(tmp_path / "m.jsonl", lines)
    with caplog.at_level(logging.WARNING):
        trace = load_mooncake(path=path, cache_dir=tmp_path / "c", lenient=True)
    assert "skipped 1 malformed record(s), kept 3" in caplog.text
    ids = [a.tolist() for a in trace.frame["input_ids"]]
    assert ids == [[0, 1, 2], [0, 1, 3], [0, 4]]
    assert trace.frame["ref_timestamp"].tolist() == [0.0, 1.0, 2.5]
    assert ideal_reuse(trace).reuse == 2 * 512 + 512  # 2 blocks, then 1 block (capped len-1)


def test_mooncake_time_unit_is_declared_not_guessed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``time_unit=s`` reads seconds; seconds read as milliseconds (a 1,000x too fast clock) are
    a warning naming the key; an unknown unit is an error naming it."""
    lines = [mooncake_line(t, 600, [0, t + 1]) for t in range(200)]  # one request a second
    path = write_lines(tmp_path / "m.jsonl", lines)
    trace = load_mooncake(path=path, cache_dir=tmp_path / "c", time_unit="s")
    assert trace.frame["ref_timestamp"].tolist()[:3] == [0.0, 1.0, 2.0]
    with caplog.at_level(logging.WARNING):
        as_ms = load_mooncake(path=path, cache_dir=tmp_path / "c")
    assert as_ms.frame["ref_timestamp"].tolist()[:2] == [0.0, 0.001]
    assert "trace.time_unit=ms: is the timestamp unit right?" in caplog.text
    with pytest.raises(ValueError, match=r"trace\.time_unit: must be one of ms, s"):
        load_mooncake(path=path, cache_dir=tmp_path / "c", time_unit="us")


def test_mooncake_lists_the_fields_it_does_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    line = mooncake_line(0, 600, [0, 1])[:-1] + ', "chat_id": 3, "parent_chat_id": -1}'
    path = write_lines(tmp_path / "m.jsonl", [line, mooncake_line(5, 600, [0, 2])])
    with caplog.at_level(logging.WARNING):
        load_mooncake(path=path, cache_dir=tmp_path / "c")
    assert "fields not read by the Mooncake format: chat_id (1), parent_chat_id (1)" in caplog.text


def test_block_size_travels_with_frames_and_parquet(tmp_path: Path) -> None:
    rows = [
        dict(
            session_id=0,
            turn=0,
            arrival=np.nan,
            input_ids=[1, 2],
            output_ids=[],
            output_len=3,
            ref_timestamp=0.0,
        )
    ]
    trace = Trace(name="blk", frame=make_frame(rows), block_size=16)
    assert Trace(name="copy", frame=trace.frame.copy()).block_size == 16  # via frame.attrs
    trace.to_parquet(tmp_path / "t.parquet")
    assert Trace.read_parquet(tmp_path / "t.parquet", "blk").block_size == 16
    cached = cached_trace("blk", {"k": 1}, lambda: trace, tmp_path)
    assert (
        cached_trace("blk", {"k": 1}, lambda: trace, tmp_path).block_size == cached.block_size == 16
    )
    plain = Trace(name="p", frame=make_frame(rows))
    assert plain.block_size == 1 and next(plain.requests()).input_tokens == 2


def _rows(n: int) -> list[dict]:
    """``n`` one-turn sessions with an input of ids 1..3 and an output of 2 ids."""
    return [request_row(i, 0, [1, 2, 3], [4, 5]) for i in range(n)]


@pytest.mark.parametrize(
    ("row", "change", "fault"),
    [
        (0, {"input_ids": []}, "empty input at row 0"),
        (2, {"output_ids": [4]}, r"output_len != len\(output_ids\) at row 2"),
        (3, {"output_len": -1, "output_ids": []}, "negative length or token id at row 3"),
        (1, {"input_ids": [1, -2, 3]}, "negative length or token id at row 1"),
        # two faults in one row: the first in the check's order; two rows: the first row
        (1, {"input_ids": [], "output_ids": [4]}, "empty input at row 1"),
        (2, {"output_ids": [4], "output_len": -1}, r"output_len != len\(output_ids\) at row 2"),
    ],
)
def test_a_faulty_row_is_named(row: int, change: dict, fault: str) -> None:
    rows = _rows(5)
    rows[row] = {**rows[row], **change}
    rows[4] = {**rows[4], "input_ids": []}  # a later faulty row is not the one named
    with pytest.raises(TraceFormatError, match=f"trace 'bad': {fault}$"):
        Trace(name="bad", frame=make_frame(rows))


def test_with_arrivals_copies_on_both_storages(tmp_path: Path) -> None:
    """The frame-backed and the arrow-backed trace give the same copy: the new arrivals, the
    same block size, columns and tokens, and the original left as it was."""
    trace = Trace(name="t", frame=make_frame(_rows(3)), block_size=16)
    trace.to_parquet(tmp_path / "t.parquet")
    arrow = Trace.read_parquet(tmp_path / "t.parquet", "t")
    arrival = np.array([2.0, 0.5, 1.0])
    for original in (trace, arrow):
        copy = original.with_arrivals(arrival)
        assert copy.name == "t" and copy.block_size == 16 and copy.columns == original.columns
        assert copy.column("arrival").tolist() == [2.0, 0.5, 1.0]
        assert np.isnan(original.column("arrival")).all()
        assert [r.request_id for r in copy.requests()] == [1, 2, 0]  # arrival order
        assert [r.input_ids.tolist() for r in copy.requests()] == [[1, 2, 3]] * 3


# --- Azure -----------------------------------------------------------------------------------


@needs(AZURE_CONV)
def test_azure_arrivals_and_no_sharing_baseline() -> None:
    conv = load_azure_arrivals(AZURE_CONV)
    code = load_azure_arrivals(azure_path("code"))
    assert (len(conv.timestamps_s), len(code.timestamps_s)) == (19_366, 8_819)
    for arrivals in (conv, code):
        assert arrivals.timestamps_s[0] == 0.0 and np.all(np.diff(arrivals.timestamps_s) >= 0)
        assert arrivals.context_tokens.min() >= 1 and arrivals.generated_tokens.min() >= 1
    assert 3400 < conv.timestamps_s[-1] < 3600  # about one hour
    trace = load_azure("code", limit=500, seed=3)
    assert trace.name == "azure_code" and len(trace) == trace.n_sessions == 500
    assert np.array_equal(trace.frame["input_ids"].map(len), code.context_tokens[:500])
    assert np.array_equal(trace.frame["output_len"], code.generated_tokens[:500])
    assert [int(a[0]) for a in trace.frame["input_ids"]] == list(
        range(UNIQUE_BASE, UNIQUE_BASE + 500)
    )
    assert ideal_reuse(trace).reuse == 0  # no two requests share a prefix
    again = load_azure("code", limit=500, seed=3)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(trace.frame["input_ids"], again.frame["input_ids"], strict=True)
    )


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


@pytest.mark.parametrize(
    ("bad", "fault"),
    [
        ("2023-11-16 18:15:52.0", "1 columns, expected 3"),
        ("2023-11-16 18:15:52.0,12", "2 columns, expected 3"),
        ("2023-11-16 18:15:52.0,twelve,5", "ContextTokens 'twelve' is not an integer"),
        ("yesterday,12,5", "TIMESTAMP 'yesterday' is not a date-time"),
        ("2023-11-16 18:15:52.0,0,5", "ContextTokens is 0"),
    ],
)
def test_azure_malformed_rows_name_file_and_line(tmp_path: Path, bad: str, fault: str) -> None:
    rows = [AZ_HEADER, "2023-11-16 18:15:46.6805900,374,44", bad]
    path = write_lines(tmp_path / "a.csv", rows, newline_at_end=False)  # cut mid-row
    with pytest.raises(TraceFileError, match=fault) as excinfo:
        load_azure_arrivals(path)
    assert f"{path}:3:" in str(excinfo.value)
    assert "truncated?" in str(excinfo.value)


def test_azure_empty_header_lenient(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(TraceFileError, match="empty file"):
        load_azure_arrivals(write_lines(tmp_path / "e.csv", []))
    with pytest.raises(TraceFileError, match="empty file"):
        load_azure_arrivals(write_lines(tmp_path / "h.csv", [AZ_HEADER]))
    with pytest.raises(TraceFileError, match=":1: header"):
        load_azure_arrivals(write_lines(tmp_path / "x.csv", ["a,b,c", "1,2,3"]))
    rows = [AZ_HEADER, "2023-11-16 18:00:02,10,1", "bad,row", "2023-11-16 18:00:00.5,20,2"]
    with caplog.at_level(logging.WARNING):
        arrivals = load_azure_arrivals(write_lines(tmp_path / "l.csv", rows), lenient=True)
    assert "skipped 1 malformed record(s), kept 2" in caplog.text
    assert "out of time order" in caplog.text  # sorted by TIMESTAMP
    assert arrivals.timestamps_s.tolist() == [0.0, 1.5]
    assert arrivals.context_tokens.tolist() == [20, 10]


# --- arrival modes ---------------------------------------------------------------------------


def small_sessions() -> Trace:
    rows = [
        dict(
            session_id=s,
            turn=t,
            arrival=np.nan,
            input_ids=[s + 1, t + 1],
            output_ids=[9],
            output_len=1,
            ref_timestamp=100.0 + 10 * s + (3 - t if s == 2 else t),
        )
        for s in range(3)
        for t in range(3)
    ]
    return Trace(name="small", frame=make_frame(rows[::-1]), block_size=4)


def test_timestamps_mode_replays_absolute_times(caplog: pytest.LogCaptureFixture) -> None:
    trace = small_sessions()
    with caplog.at_level(logging.WARNING):
        out = assign(trace, mode="timestamps")
    assert out.block_size == 4 and trace.frame["arrival"].isna().all()
    got = out.frame.sort_values(["session_id", "turn"])["arrival"].tolist()
    # session 2's clock runs backwards (123, 122, 121): clamped to its first arrival
    assert got == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 23.0, 23.0, 23.0]
    assert "2 within-session timestamps clamped" in caplog.text
    with pytest.raises(ValueError, match="ref_timestamp"):
        assign(
            Trace(name="x", frame=trace.frame.drop(columns=["ref_timestamp"])), mode="timestamps"
        )
    with pytest.raises(ValueError, match="mode must be one of"):
        assign(trace, mode="bursty")


def test_timestamps_mode_time_scale_speeds_up_the_clock() -> None:
    trace = small_sessions()
    base = assign(trace, mode="timestamps").frame.sort_values(["session_id", "turn"])
    fast = assign(trace, mode="timestamps", time_scale=0.5).frame.sort_values(
        ["session_id", "turn"]
    )
    assert fast["arrival"].tolist() == [0.0, 0.5, 1.0, 5.0, 5.5, 6.0, 11.5, 11.5, 11.5]
    assert np.allclose(fast["arrival"], 0.5 * base["arrival"])
    slow = assign(trace, mode="timestamps", time_scale=3.0).frame
    assert slow["arrival"].max() == 3 * base["arrival"].max()
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="time_scale must be a finite number > 0"):
            assign(trace, mode="timestamps", time_scale=bad)


def test_poisson_and_trace_modes_delegate_and_keep_block_size() -> None:
    trace = small_sessions()
    out = assign(trace, mode="poisson", session_rate=2.0, think_time_mean=1.0, seed=1)
    assert out.block_size == 4 and out.frame["arrival"].notna().all()


@needs(AZURE_CONV)
def test_azure_mode_maps_real_arrivals_onto_session_starts() -> None:
    trace = small_sessions()
    starts = load_azure_arrivals(AZURE_CONV).timestamps_s
    out = assign(trace, mode="azure", think_time_mean=0.0, time_scale=0.5).frame
    first = out.sort_values(["session_id", "turn"]).groupby("session_id")["arrival"].first()
    assert np.allclose(first.to_numpy(), 0.5 * starts[:3])
    timed = assign(trace, mode="azure", think_time_mean=2.0, seed=4).frame
    gaps = timed.sort_values(["session_id", "turn"]).groupby("session_id")["arrival"].diff()
    assert (gaps.dropna() > 0).all()
    tiled = tiled_starts(np.array([0.0, 1.0, 3.0]), 7)
    assert tiled.tolist() == [0.0, 1.0, 3.0, 4.5, 5.5, 7.5, 9.0]


# --- classic SWE-agent trajectories and history truncation ------------------------------------


def classic_traj(steps: int, instance: str = "demo__repo-1") -> dict:
    """A SWE-agent 1.x-style .traj: system, a demonstration, the instance, thought/action rounds."""
    history = [
        {
            "role": "system",
            "content": "SETTING: You are an autonomous programmer...",
            "agent": "main",
            "message_type": "system_prompt",
        },
        {
            "role": "user",
            "content": "Here is a demonstration of how to solve a task:\n...",
            "agent": "main",
            "message_type": "demonstration",
            "is_demo": True,
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": f"<uploaded_files>/{instance}\n"
                    "We're currently solving the following issue...",
                }
            ],
            "agent": "main",
            "message_type": "observation",
        },
    ]
    trajectory = []
    for k in range(steps):
        action = f"open src/module_{k}.py"
        response = f"DISCUSSION\nLet's look at module {k}.\n\n```\n{action}\n```"
        observation = "\n".join(f"{i}: line {i} of module {k}" for i in range(1, 30 + k))
        history += [
            {
                "role": "assistant",
                "content": response,
                "thought": f"Let's look at module {k}.",
                "action": action,
                "agent": "main",
                "message_type": "action",
            },
            {
                "role": "user",
                "content": f"{observation}\n(Open file: src/module_{k}.py)\nbash-$",
                "agent": "main",
                "message_type": "observation",
            },
        ]
        trajectory.append(
            {
                "action": action,
                "observation": observation,
                "response": response,
                "thought": f"Let's look at module {k}.",
                "execution_time": 0.5 + k,
                "state": '{"open_file": "src/module.py"}',
                "query": [],
            }
        )
    return {
        "environment": "swe_main",
        "trajectory": trajectory,
        "history": history,
        "info": {"exit_status": "submitted", "submission": "diff --git ..."},
    }


def write_traj(folder: Path, doc: dict | str, instance: str) -> Path:
    path = folder / instance / f"{instance}.traj"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return path


def test_classic_sweagent_trajectories_load_from_file_folder_and_tar(tmp_path: Path) -> None:
    folder = tmp_path / "trajectories" / "user" / "exp"
    one = write_traj(folder, classic_traj(9, "a__b-1"), "a__b-1")
    write_traj(folder, classic_traj(4, "c__d-2"), "c__d-2")
    trace = load_sweagent(path=tmp_path / "trajectories", cache_dir=tmp_path / "c")
    frame = trace.frame
    assert (trace.name, trace.n_sessions, len(trace)) == ("sweagent", 2, 13)
    assert frame.groupby("session_id")["ref_instance_id"].first().tolist() == ["a__b-1", "c__d-2"]
    assert frame["ref_execution_time"].tolist()[:3] == [0.5, 1.5, 2.5]
    assert (frame["ref_exit_status"] == "submitted").all()
    assert all(extends(trace).values())  # untruncated: every call extends the previous one
    single = load_sweagent(path=one, cache_dir=tmp_path / "c")
    assert len(single) == 9
    archive = tmp_path / "trajs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="trajs")
    from_tar = load_sweagent(path=archive, cache_dir=tmp_path / "c")
    assert all(
        np.array_equal(a, b)
        for a, b in zip(from_tar.frame["input_ids"], frame["input_ids"], strict=True)
    )
    with pytest.raises(DataFileMissingError, match="SWE-bench/experiments"):
        load_sweagent(data_dir=tmp_path / "nowhere", cache_dir=tmp_path / "c")


def test_history_truncation_turns_extend_into_branch(tmp_path: Path) -> None:
    write_traj(tmp_path / "t", classic_traj(12), "demo__repo-1")
    plain = load_sweagent(path=tmp_path / "t", cache_dir=tmp_path / "c")
    cut = load_sweagent(path=tmp_path / "t", cache_dir=tmp_path / "c", truncate_history=True)
    assert len(plain) == len(cut) == 12
    assert all(extends(plain).values())
    # turn t sees t observations; from t = 5 on, request t + 1 elides the one 5 rounds back
    assert extends(cut) == {(0, t): t < 5 for t in range(11)}
    last = cut.frame.sort_values("turn")["input_ids"].iloc[-1]
    assert len(last) < len(plain.frame.sort_values("turn")["input_ids"].iloc[-1])
    assert ideal_reuse(cut).reuse < ideal_reuse(plain).reuse
    capped = load_sweagent(
        path=tmp_path / "t",
        cache_dir=tmp_path / "c",
        truncate_history=True,
        max_turns=7,
        max_tokens=10**6,
    )
    assert len(capped) == 7
    tight = load_sweagent(path=tmp_path / "t", cache_dir=tmp_path / "c", max_tokens=1500)
    assert 0 < len(tight) < 12
    assert (tight.frame["input_ids"].map(len) + tight.frame["output_len"]).max() <= 1500


def test_truncation_placeholder_counts_lines() -> None:
    from traces.agent_history import AgentMessage, HistoryOptions, agent_requests
    from traces.tokenizer import ChatRenderer, get_encoding

    msgs = [AgentMessage("system", "s"), AgentMessage("user", "task")]
    for k in range(3):
        msgs += [AgentMessage("assistant", f"a{k}"), AgentMessage("user", f"o{k}\nx\ny")]
    msgs.append(AgentMessage("assistant", "final"))
    requests = agent_requests(ChatRenderer(), msgs, HistoryOptions(True, keep_last=1))
    assert [pos for pos, _, _ in requests] == [2, 4, 6, 8]
    text = get_encoding().decode(requests[-1][1].tolist())
    assert text.count(PLACEHOLDER.format(lines=3)) == 2  # o0 and o1 elided
    assert "o2\nx\ny" in text and "task" in text and "a0" in text and "o0" not in text


@pytest.mark.parametrize(
    ("mutate", "fault"),
    [
        (lambda text: text[: len(text) // 2], r"line \d+ column \d+: invalid JSON .*truncated"),
        (
            lambda text: json.dumps({**json.loads(text), "history": {"a": 1}}),
            "'history' missing or not a list",
        ),
        (lambda text: text.replace('"role": "assistant"', '"role": 5', 1), r"history\[3\]\.role"),
        (
            lambda text: text.replace('"is_demo": true', '"is_demo": "yes"'),
            r"history\[1\]\.is_demo",
        ),
        (
            lambda text: text.replace('"execution_time": 1.5', '"execution_time": "slow"'),
            r"trajectory\[1\]\.execution_time",
        ),
        (lambda text: "", "empty file"),
    ],
)
def test_classic_sweagent_malformed_file_is_named(tmp_path: Path, mutate, fault: str) -> None:
    write_traj(tmp_path / "t", classic_traj(3, "good__1"), "good__1")
    bad = write_traj(tmp_path / "t", mutate(json.dumps(classic_traj(3), indent=2)), "bad__2")
    with pytest.raises(TraceFileError, match=fault) as excinfo:
        load_sweagent(path=tmp_path / "t", cache_dir=tmp_path / "c")
    assert str(bad) in str(excinfo.value)


def test_classic_sweagent_lenient_skips_and_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_traj(tmp_path / "t", classic_traj(3, "good__1"), "good__1")
    write_traj(tmp_path / "t", '{"history": [', "bad__2")
    write_traj(tmp_path / "t", "", "bad__3")
    with caplog.at_level(logging.WARNING):
        trace = load_sweagent(path=tmp_path / "t", cache_dir=tmp_path / "c", lenient=True)
    assert trace.n_sessions == 1 and "skipped 2 malformed trajectories" in caplog.text


@needs(SWE_TAR)
def test_swebench_truncation_on_real_trajectories(cache: Path) -> None:
    plain = load_swebench(limit=3, cache_dir=cache)
    cut = load_swebench(
        limit=3, cache_dir=cache, truncate_history=True, max_tokens=32768, max_turns=51
    )
    assert all(extends(plain).values())
    pairs = extends(cut)
    assert pairs and all(ok == (t < 5) for (_, t), ok in pairs.items())
    assert cut.frame.groupby("session_id").size().max() <= 51
    assert (cut.frame["input_ids"].map(len) + cut.frame["output_len"]).max() <= 32768
    assert ideal_reuse(cut).reuse_share < ideal_reuse(plain).reuse_share


def _swe_member(payload: bytes, name: str) -> tuple[str, bytes]:
    return f"trajs/{name}/{name}.traj.json", payload


def test_swebench_lenient_and_empty_archive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = tmp_path / TAR_RELATIVE
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    with pytest.raises(TraceFileError, match=r"not a readable \.tar\.gz"):
        load_swebench(data_dir=tmp_path, cache_dir=tmp_path / "c")
    good = json.dumps(
        {
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "t"},
                {"role": "assistant", "content": "ls"},
                {"role": "user", "content": "out"},
            ]
        }
    ).encode()
    members = dict(
        [_swe_member(good, "good"), _swe_member(good[:-20], "cut"), _swe_member(b"", "empty")]
    )
    with tarfile.open(archive, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(TraceFileError, match=r"cut\.traj\.json: not valid JSON"):
        load_swebench(data_dir=tmp_path, limit=None, cache_dir=tmp_path / "c")
    with caplog.at_level(logging.WARNING):
        trace = load_swebench(data_dir=tmp_path, limit=None, cache_dir=tmp_path / "c", lenient=True)
    assert trace.n_sessions == 1 and "skipped 2 malformed trajectories" in caplog.text


def test_binary_lines_name_file_and_line_and_lenient_skips_them(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        (mooncake_line(0, 1024, [0, 1]) + "\n").encode()
        + b"\x98\xffgarbage\n"
        + (mooncake_line(1, 1024, [1, 1]) + "\n").encode()
    )
    with pytest.raises(
        TraceFileError, match=r"mixed\.jsonl:2: not UTF-8 text \(byte 0x98 at column 1\)"
    ):
        load_mooncake(path=str(path))
    assert len(load_mooncake(path=str(path), lenient=True)) == 2


def test_a_truncated_archive_names_the_file_and_the_last_member(tmp_path: Path) -> None:
    full = tmp_path / "full.tar.gz"
    rng = np.random.default_rng(0)
    with tarfile.open(full, "w:gz") as tar:
        for name in ("a", "b"):
            data = rng.bytes(200_000)  # incompressible: the cut lands inside the second member
            info = tarfile.TarInfo(f"trajs/{name}/{name}.traj.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(full.read_bytes()[:300_000])
    with pytest.raises(
        TraceFileError, match=r"cut\.tar\.gz: archive truncated or corrupt after member trajs/"
    ):
        load_swebench(path=str(cut))


def corrupted(data: bytes, rng: np.random.Generator) -> bytes:
    """``data`` with a few random bytes overwritten, inserted, deleted, or the tail cut."""
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 6))):
        pos = int(rng.integers(0, len(buf)))
        kind = int(rng.integers(0, 4))
        if kind == 0:
            buf[pos] = int(rng.integers(0, 256))
        elif kind == 1:
            buf.insert(pos, int(rng.integers(0, 256)))
        elif kind == 2 and len(buf) > 1:
            del buf[pos]
        else:
            del buf[pos:]
            break
    return bytes(buf)


FUZZED_LOADERS = {
    "mooncake": (
        "\n".join(mooncake_line(t, 1024, [t, 1]) for t in range(20)) + "\n",
        lambda p, lenient: load_mooncake(path=str(p), lenient=lenient),
    ),
    "lmsys": (
        "\n".join(json.dumps(lmsys_record(4, cid=f"c{i}")) for i in range(6)) + "\n",
        lambda p, lenient: load_lmsys(
            path=p, cache_dir=p.parent / "c", min_turns=1, lenient=lenient
        ),
    ),
    "azure": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{i:02d}.0000000,{100 + i},{10 + i}\n" for i in range(20)),
        lambda p, lenient: load_azure(path=str(p), lenient=lenient),
    ),
}


@pytest.mark.parametrize("loader", sorted(FUZZED_LOADERS))
@pytest.mark.parametrize("lenient", [False, True])
def test_corrupted_files_give_a_clear_error_or_a_lenient_skip(
    tmp_path: Path, loader: str, lenient: bool
) -> None:
    """Random byte corruptions: the loader returns a trace or raises an error that names the
    file (TraceFileError); never another exception."""
    text, load = FUZZED_LOADERS[loader]
    rng = np.random.default_rng(7)
    errors = []
    for i in range(40):
        path = tmp_path / f"{i}.data"
        path.write_bytes(corrupted(text.encode(), rng))
        try:
            load(path, lenient)
        except TraceFileError as exc:
            errors.append((str(path), str(exc)))
    assert all(path in message for path, message in errors)


def test_a_missing_field_is_called_missing(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 5}\n')
    with pytest.raises(
        TraceFileError, match=r"m\.jsonl:1: field 'hash_ids' is missing, expected a list"
    ):
        load_mooncake(path=str(path))
