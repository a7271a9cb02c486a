"""Agentic traces: the Claude Code loader, sub-agents as a session graph on the timed engine,
the request-log format and its converters (issue 81, items 1-3).

Oracles: an independent count of repeated hash ids per session in the raw JSON; the infinite
cache's hit rate against that reuse; the graph's ordering invariant in the timed engine's
records; token-id and hash-id logs of the same prompts; converted traces against the loader."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from simlab.run.simulate import simulate
from tests.fixtures import compose
from traces.agents import assign_agent_arrivals, within_session_reuse
from traces.claude_code import Options, build_claude_code, load_claude_code, trace_files
from traces.convert import convert
from traces.paths import TraceFileError, resolve_data_dir
from traces.request_log import load_request_log

CC = resolve_data_dir(None) / "claude_code" / "traces"
#: sessions with sub-agents: one; two siblings at the end; three, then two siblings
WITH_SUBAGENTS = ["trace_0014", "trace_0004", "trace_0254"]
needs_data = pytest.mark.skipif(not CC.is_dir(), reason=f"real data not at {CC}")


def raw_reuse(paths: list[Path]) -> tuple[int, int, int, int]:
    """``(reused tokens, input tokens, sessions, requests)`` counted from the JSON alone: per
    session (a sub-agent its own), the hash ids seen earlier in it, in tokens, each request
    capped at its input - 1."""
    totals = [0, 0, 0, 0]

    def walk(entries: list[dict]) -> None:
        totals[2] += 1
        seen: set[int] = set()
        for entry in entries:
            if entry["type"] == "subagent":
                walk(entry["requests"])
                continue
            hits = sum(h in seen for h in entry["hash_ids"])
            totals[0] += min(hits * 64, entry["in"] - 1)
            totals[1] += entry["in"]
            totals[3] += 1
            seen.update(entry["hash_ids"])

    for path in paths:
        walk(json.loads(gzip.decompress(path.read_bytes()))["requests"])
    return totals[0], totals[1], totals[2], totals[3]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SIMLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@needs_data
@pytest.mark.slow
def test_every_shipped_session_reuse_equals_an_independent_count() -> None:
    files = trace_files(CC)
    trace = build_claude_code(files, Options(shared_prefix="none"), None, 0)
    reused, total, sessions, requests = raw_reuse(files)
    assert (len(files), trace.n_sessions, len(trace)) == (572, sessions, requests)
    assert within_session_reuse(trace) == (reused, total)
    assert 0.95 < reused / total < 0.97  # the data's README: about 96% of blocks seen earlier


def run(overrides: list[str], out: Path):
    base = ["trace=claude_code", "model=llama3_8b", "report=false", f"output_dir={out}"]
    return simulate(compose([*base, *overrides]))


def sessions_override(names: list[str]) -> str:
    return f"trace.sessions=[{','.join(names)}]"


@needs_data
def test_infinite_cache_hits_the_within_session_reuse(cache: Path, tmp_path: Path) -> None:
    reused, total, _, _ = raw_reuse([CC / f"{n}.json.gz" for n in WITH_SUBAGENTS])
    summary = run(
        [
            sessions_override(WITH_SUBAGENTS),
            "trace.shared_prefix=none",
            "engine=replay",
            "+policy=fifo",
            "cache.size_gb=inf",
            "bounds.enabled=true",
        ],
        tmp_path / "run",
    )
    assert summary.bounds["infinite"] == pytest.approx(reused / total, abs=1e-12)
    assert summary.policies["fifo"]["token_hit_rate"] == pytest.approx(reused / total, abs=1e-12)
    records = summary.record_columns
    assert set(records["agent_depth"].tolist()) == {0, 1}
    assert (records["parent_session"][records["agent_depth"] == 0] == -1).all()


@needs_data
def test_shared_prefix_joins_sessions_positionally(cache: Path) -> None:
    names = ["trace_0001", "trace_0002"]
    shared = load_claude_code(sessions=names, data_dir=CC.parent.parent)
    none = load_claude_code(sessions=names, data_dir=CC.parent.parent, shared_prefix="none")
    a, b = (shared.column("input_ids")[rows[0]] for rows in list(_rows(shared).values())[:2])
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    common = int(diff[0]) if diff.size else n
    expected = min(
        (doc["system_tokens"] + doc["tool_tokens"]) // 64
        for doc in (json.loads(gzip.decompress((CC / f"{n}.json.gz").read_bytes())) for n in names)
    )
    assert common == expected
    a, b = (none.column("input_ids")[rows[0]] for rows in list(_rows(none).values())[:2])
    assert not set(a.tolist()) & set(b.tolist())


def _rows(trace) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for pos, sid in enumerate(trace.column("session_id").tolist()):
        rows.setdefault(sid, []).append(pos)
    return rows


def _by_session(records: dict, trace) -> dict[int, dict[int, tuple[float, float]]]:
    """session -> turn -> (arrival, finished) from the records."""
    out: dict[int, dict[int, tuple[float, float]]] = {}
    for s, t, a, f in zip(
        records["session_id"], records["turn"], records["arrival"], records["finished"], strict=True
    ):
        out.setdefault(int(s), {})[int(t)] = (float(a), float(f))
    return out


@needs_data
@pytest.mark.parametrize("timing", ["think", "original", "scaled"])
def test_subagents_start_at_the_marker_and_the_parent_waits(
    cache: Path, tmp_path: Path, timing: str
) -> None:
    overrides = [sessions_override(WITH_SUBAGENTS), f"trace.timing={timing}", "+policy=sglang"]
    overrides += ["hardware=h100_sxm", "cache.size_gb=20", "bounds.enabled=false"]
    summary = run(overrides, tmp_path / "run")
    trace = load_claude_code(sessions=WITH_SUBAGENTS, timing=timing, data_dir=CC.parent.parent)
    times = _by_session(summary.record_columns, trace)
    parent, spawn = trace.column("ref_parent_session"), trace.column("ref_spawn_turn")
    kids: dict[tuple[int, int], list[int]] = {}
    for rows in _rows(trace).values():
        if parent[rows[0]] >= 0:
            kids.setdefault((int(parent[rows[0]]), int(spawn[rows[0]])), []).append(
                int(trace.column("session_id")[rows[0]])
            )
    assert len(kids) == 4 and sum(map(len, kids.values())) == 2 + 1 + 3 + 2
    for (p, k), children in kids.items():
        marker = times[p][k - 1][1] if k > 0 else times[p][0][0]
        starts = [times[c][0][0] for c in children]
        ends = [max(f for _, f in times[c].values()) for c in children]
        assert min(starts) >= marker  # never before the parent's marker
        if k in times[p]:
            assert times[p][k][0] >= max(ends)  # the parent resumes after its last sub-agent
        if len(children) > 1:
            assert max(starts) < min(ends)  # siblings run concurrently


@needs_data
def test_replay_order_is_topological_and_users_close_the_loop(cache: Path) -> None:
    loaded = load_claude_code(sessions=WITH_SUBAGENTS, data_dir=CC.parent.parent, users=1)
    trace = assign_agent_arrivals(loaded, mode="poisson", session_rate=1.0, seed=0)
    order = [(r.session_id, r.turn) for r in trace.requests()]
    position = {key: i for i, key in enumerate(order)}
    parent, spawn = trace.column("ref_parent_session"), trace.column("ref_spawn_turn")
    for sid, rows in _rows(trace).items():
        p, k = int(parent[rows[0]]), int(spawn[rows[0]])
        if p < 0:
            continue
        first, last = position[(sid, 0)], position[(sid, len(rows) - 1)]
        assert k == 0 or position[(p, k - 1)] < first
        assert (p, k) not in position or last < position[(p, k)]
    roots = [s for s, rows in _rows(trace).items() if parent[rows[0]] < 0]
    spans = [
        (position[(s, 0)], max(position[(s, t)] for t in range(len(_rows(trace)[s]))))
        for s in roots
    ]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))  # one user: in turn


def token_and_hash_logs(tmp_path: Path, block: int = 16) -> tuple[Path, Path]:
    """The same prompts as token ids and as chained block hashes (whole blocks; the tail's
    tokens in ``input_len``); no prompt a whole number of blocks."""
    rng = np.random.default_rng(7)
    chain: dict[tuple, int] = {}
    tokens_lines, hash_lines = [], []
    for session in range(6):
        prompt = rng.integers(0, 50, size=int(rng.integers(20, 60))).tolist()
        for turn in range(5):
            prompt += rng.integers(0, 50, size=int(rng.integers(5, 90))).tolist()
            if len(prompt) % block == 0:
                prompt.append(1)
            if turn == 3:  # a branch: the session edits its history
                prompt[len(prompt) // 2] = 99
            ids: list[int] = []
            key: tuple = ()
            for b in range(len(prompt) // block):
                key = (key, tuple(prompt[b * block : (b + 1) * block]))
                ids.append(chain.setdefault(key, len(chain)))
            common = {"session": f"s{session}", "output_len": 5, "think": 1.0}
            tokens_lines.append({**common, "input_ids": list(prompt)})
            hash_lines.append(
                {**common, "hash_ids": ids, "block_size": block, "input_len": len(prompt)}
            )
    paths = tmp_path / "tokens.jsonl", tmp_path / "hashes.jsonl"
    for path, lines in zip(paths, (tokens_lines, hash_lines), strict=True):
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return paths


@pytest.mark.parametrize("engine", ["replay", "timed"])
def test_token_and_hash_logs_give_the_same_hit_rates(
    cache: Path, tmp_path: Path, engine: str
) -> None:
    rates = []
    for path in token_and_hash_logs(tmp_path):
        summary = simulate(
            compose(
                [
                    "trace=request_log",
                    f"trace.path={path}",
                    "+policy=sglang",
                    "model=llama3_8b",
                    "cache.size_gb=inf",
                    "cache.page_size=16",
                    f"engine={engine}",
                    "report=false",
                    f"output_dir={tmp_path / path.stem}",
                ]
            )
        )
        rates.append(summary.policies["sglang"]["token_hit_rate"])
    # (the infinite-cache bound is token-granular on token ids, block-granular on hash ids)
    assert rates[0] == pytest.approx(rates[1], abs=1e-12)
    assert 0.3 < rates[0] < 1


# --------------------------------------------------------------------------- bad input


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def write_doc(path: Path, doc: dict) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def small_doc() -> dict:
    request = {"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 3], "think_time": 0}
    sub = {"type": "subagent", "t": 3.0, "duration_ms": 1000, "agent_id": "agent_001"}
    sub |= {"system_tokens": 64, "tool_tokens": 0}
    sub["requests"] = [dict(request), dict(request, t=1.0)]
    doc = {"id": "tiny", "block_size": 64, "system_tokens": 64, "tool_tokens": 64}
    doc["requests"] = [request, sub, dict(request, t=5.0, think_time=1.0)]
    return doc


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (
            lambda d: d["requests"][2].update(hash_ids=[1]),
            "session tiny: requests[2]: hash_ids has 1",
        ),
        (
            lambda d: d["requests"][1]["requests"][1].update(out="x"),
            "session tiny/agent_001: requests[1]: field 'out'",
        ),
        (lambda d: d["requests"][0].pop("in"), "session tiny: requests[0]: field 'in' is missing"),
    ],
)
def test_a_bad_request_is_named_by_file_session_and_request(
    tmp_path: Path, damage, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    doc = small_doc()
    damage(doc)
    path = write_doc(tmp_path / "tiny.json.gz", doc)
    with pytest.raises(TraceFileError) as exc:
        build_claude_code([path], Options(), None, 0)
    assert one_line(exc).startswith(f"{path}: ") and expected in str(exc.value)
    with caplog.at_level(logging.WARNING):
        trace = build_claude_code([path], Options(lenient=True), None, 0)
    assert len(trace) == 3 and "skipped 0 file(s) and 1 request(s)" in caplog.text


def test_truncated_binary_and_malformed_files(tmp_path: Path, caplog) -> None:
    good = write_doc(tmp_path / "a.json.gz", small_doc())
    cut = tmp_path / "b.json.gz"
    cut.write_bytes(good.read_bytes()[:-20])
    binary = tmp_path / "c.json"
    binary.write_bytes(bytes(range(256)) * 4)
    broken = tmp_path / "d.json"
    broken.write_text(json.dumps(small_doc())[:-40])
    for path, fault in [
        (cut, "not a complete gzip file"),
        (binary, "not UTF-8"),
        (broken, "invalid JSON"),
    ]:
        with pytest.raises(TraceFileError) as exc:
            build_claude_code([path], Options(), None, 0)
        assert one_line(exc).startswith(f"{path}: ") and fault in str(exc.value)
    with caplog.at_level(logging.WARNING):
        trace = build_claude_code(trace_files(tmp_path), Options(lenient=True), None, 0)
    assert len(trace) == 4 and "skipped 3 file(s) and 0 request(s)" in caplog.text


@pytest.mark.parametrize(
    ("line", "fault"),
    [
        ('{"session": 1, "output_len": 3}', "exactly one of the fields"),
        ('{"session": 1, "input_ids": [1, -2], "output_len": 3}', "input_ids[1]"),
        ('{"session": 1, "hash_ids": [1, 2], "output_len": 3}', "field 'block_size' is missing"),
        ('{"session": 1, "input_ids": [1], "output_len": "a"}', "field 'output_len'"),
        ('{"session": 2, "parent": 9, "input_ids": [1], "output_len": 3}', "parent '9'"),
        ('{"session": 1, "input_ids": [1], "outp', "invalid JSON"),
    ],
)
def test_request_log_errors_name_file_line_and_field(
    tmp_path: Path, cache: Path, line: str, fault: str, caplog
) -> None:
    path = tmp_path / "log.jsonl"
    good = '{"session": 1, "input_ids": [1, 2], "output_len": 3}\n'
    path.write_text(good + line + "\n" + good)
    with pytest.raises(TraceFileError) as exc:
        load_request_log(path)
    assert one_line(exc).startswith(f"{path}:2: ") and fault in str(exc.value)
    if "parent" not in line:
        with caplog.at_level(logging.WARNING):
            assert len(load_request_log(path, lenient=True)) == 2
        assert "skipped 1 malformed record(s)" in caplog.text


# --------------------------------------------------------------------------- converters


@needs_data
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_claude_code_converted_replays_the_same(cache: Path, tmp_path: Path, suffix: str) -> None:
    from simlab.run.bounds import infinite_cache_hits

    out = tmp_path / f"cc{suffix}"
    convert("claude_code", CC / "trace_0254.json.gz", out)
    direct = build_claude_code([CC / "trace_0254.json.gz"], Options(), None, 0)
    logged = load_request_log(out)
    assert (
        logged.column("ref_parent_session").tolist() == direct.column("ref_parent_session").tolist()
    )
    assert logged.column("ref_delay").tolist() == pytest.approx(direct.column("ref_delay").tolist())
    hits = [infinite_cache_hits(list(t.requests())) for t in (direct, logged)]
    assert hits[0] == hits[1] and sum(hits[0]) > 0


def test_converters_of_the_other_formats(cache: Path, tmp_path: Path) -> None:
    sources: dict[str, list[dict]] = {
        "mooncake": [
            {"timestamp": 1000, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
        ],
        "bailian": [
            {
                "chat_id": 5,
                "parent_chat_id": -1,
                "timestamp": 1.0,
                "input_length": 40,
                "output_length": 3,
                "turn": 1,
                "type": "text",
                "hash_ids": [1, 2, 3],
            },
            {
                "chat_id": 8,
                "parent_chat_id": 5,
                "timestamp": 4.0,
                "input_length": 70,
                "output_length": 3,
                "turn": 2,
                "type": "text",
                "hash_ids": [1, 2, 3, 4, 5],
            },
        ],
        "aiperf": [
            {"session_id": "a", "turns": [{"text": "hello there", "delay": 500}, {"text": "more"}]},
            {"text": "one shot", "output_length": 9},
        ],
        "vllm_bench": [{"prompt": "the prompt", "output_tokens": 7}, {"prompt": "another"}],
    }
    sessions = {"mooncake": 1, "bailian": 1, "aiperf": 2, "vllm_bench": 2}
    for fmt, lines in sources.items():
        source, out = tmp_path / f"{fmt}.jsonl", tmp_path / f"{fmt}.out.jsonl"
        source.write_text("".join(json.dumps(line) + "\n" for line in lines))
        convert(fmt, source, out)
        trace = load_request_log(out)
        assert trace.n_sessions == sessions[fmt], fmt
    bailian = load_request_log(tmp_path / "bailian.out.jsonl")
    assert bailian.block_size == 16 and bailian.column("turn").tolist() == [0, 1]
    aiperf = load_request_log(tmp_path / "aiperf.out.jsonl")
    first, second = aiperf.column("input_ids")[:2]
    assert second[: len(first)].tolist() == first.tolist()  # a turn holds the earlier text
    assert math.isclose(aiperf.column("ref_delay")[0], 0.5)


@needs_data
def test_users_close_the_loop_on_the_timed_engine(cache: Path, tmp_path: Path) -> None:
    overrides = [sessions_override(WITH_SUBAGENTS), "trace.users=2", "+policy=sglang"]
    overrides += ["hardware=h100_sxm", "cache.size_gb=20", "bounds.enabled=false"]
    records = run(overrides, tmp_path / "run").record_columns
    trace = load_claude_code(sessions=WITH_SUBAGENTS, users=2, data_dir=CC.parent.parent)
    parent = {
        int(s): int(p)
        for s, p in zip(trace.column("session_id"), trace.column("ref_parent_session"), strict=True)
    }

    def root(sid: int) -> int:
        return sid if parent[sid] < 0 else root(parent[sid])

    spans: dict[int, list[float]] = {}
    for sid, arrival, finished in zip(
        records["session_id"], records["arrival"], records["finished"], strict=True
    ):
        span = spans.setdefault(root(int(sid)), [math.inf, 0.0])
        span[0], span[1] = min(span[0], float(arrival)), max(span[1], float(finished))
    (a0, a1), (b0, b1), (c0, _) = sorted(spans.values())
    assert a0 == b0 == 0.0 < min(a1, b1) <= c0  # two users; the third waits for one of them
