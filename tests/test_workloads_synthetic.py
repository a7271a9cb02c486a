"""Synthetic generators (BatchLLM, common-context QA, chat), the describe statistics (radix-tree
ideal reuse and its purely-input / input-and-output split) and `python -m traces describe`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.__main__ import load_configured_trace, main
from traces.describe import describe, format_description, ideal_reuse, log2_histogram
from traces.format import Trace, make_frame
from traces.paths import resolve_data_dir
from traces.radix import RadixTree
from traces.synthetic import (
    BARE_VOCAB,
    CCQA_DATASETS,
    bounded_pareto,
    load_batchllm,
    load_ccqa,
    load_chat,
    microbenchmark_batch,
    table3_batch,
)

REPO = Path(__file__).resolve().parent.parent
DATA = resolve_data_dir(None)
TRACE_CONFIGS = sorted(p.stem for p in (REPO / "configs" / "trace").glob("*.yaml"))


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def brute_force_reuse(trace: Trace) -> tuple[list[int], list[int]]:
    """Per request (in request order): reuse = min(LCP with earlier full sequences, n - 1) and
    M_in = LCP with earlier inputs, both by pairwise comparison."""
    inputs: list[np.ndarray] = []
    fulls: list[np.ndarray] = []
    reuse, m_in = [], []
    for req in trace.requests():
        reuse.append(min(max([lcp(req.input_ids, f) for f in fulls], default=0), req.input_len - 1))
        m_in.append(max([lcp(req.input_ids, x) for x in inputs], default=0))
        inputs.append(req.input_ids)
        fulls.append(req.full_sequence())
    return reuse, m_in


def rows_trace(sequences: list[tuple[list[int], list[int]]], name: str = "t") -> Trace:
    rows = [
        dict(
            session_id=i,
            turn=0,
            arrival=float(i),
            input_ids=inp,
            output_ids=out,
            output_len=len(out),
        )
        for i, (inp, out) in enumerate(sequences)
    ]
    return Trace(name=name, frame=make_frame(rows))


# --- radix tree and describe -----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=12),
            st.lists(st.integers(0, 3), max_size=4),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_ideal_reuse_matches_brute_force(sequences) -> None:
    trace = rows_trace(sequences)
    reuse, m_in = brute_force_reuse(trace)
    totals = ideal_reuse(trace)
    assert totals.per_request.tolist() == reuse
    pure = sum(r for r, m in zip(reuse, m_in, strict=True) if r and m >= r)
    assert (totals.purely_input, totals.input_and_output) == (pure, sum(reuse) - pure)
    assert totals.output_dependent == sum(r - min(m, r) for r, m in zip(reuse, m_in, strict=True))


def test_radix_tree_match_and_insert() -> None:
    tree = RadixTree()
    assert tree.insert(np.array([1, 2, 3, 4])) == 0
    assert tree.insert(np.array([1, 2, 9])) == 2  # splits the edge
    assert tree.match(np.array([1, 2, 3, 4, 5])) == 4
    assert tree.match(np.array([1, 2, 9, 9])) == 3
    assert tree.match(np.array([1, 2])) == 2 and tree.match(np.array([7])) == 0
    assert tree.insert(np.array([1, 2])) == 2 and tree.nodes == 3


def test_reuse_kinds_follow_marconi_taxonomy() -> None:
    system = list(range(100, 110))
    trace = rows_trace(
        [
            ([*system, 1, 2], [3, 4]),  # nothing before it
            ([*system, 5], [6]),  # shares the system prompt: purely input (10)
            ([*system, 1, 2, 3, 4, 7], [8]),  # runs through request 0's reply: input and output
        ]
    )
    totals = ideal_reuse(trace)
    assert totals.per_request.tolist() == [0, 10, 14]
    assert (totals.purely_input, totals.input_and_output) == (10, 14)
    assert (totals.requests_purely_input, totals.requests_input_and_output) == (1, 1)
    assert totals.output_dependent == 2  # tokens 3, 4 exist only in a cached reply
    stats = describe(trace)
    assert stats["ideal_reuse"]["tokens"] == 24 and stats["input_tokens"]["total"] == 12 + 11 + 15
    text = format_description(stats)
    assert "purely input" in text and "input and output" in text and "histogram" in text


def test_log2_histogram_bins() -> None:
    assert log2_histogram(np.array([0, 1, 3, 5, 1000])) == [
        (0, 2, 2),
        (2, 4, 1),
        (4, 8, 1),
        (8, 16, 0),
        (16, 32, 0),
        (32, 64, 0),
        (64, 128, 0),
        (128, 256, 0),
        (256, 512, 0),
        (512, 1024, 1),
    ]


# --- BatchLLM --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "share"),
    [
        ({"n_groups": 3, "prefix_len": 2000, "distinct_len": 200}, 15 * 2000 / (16 * 2200)),
        ({"n_groups": 2, "prefix_len": 16000, "distinct_len": 200}, 15 * 16000 / (16 * 16200)),
    ],
)
def test_batchllm_microbenchmark_reuse_is_exact(kwargs: dict, share: float) -> None:
    trace = load_batchllm(seed=1, **kwargs)
    assert len(trace) == trace.n_sessions == 16 * kwargs["n_groups"]
    assert ideal_reuse(trace).reuse_share == pytest.approx(share, abs=1e-12)  # 85.2%, 92.6%


@pytest.mark.parametrize(
    ("prefix", "sub", "two_level", "first_level"),
    [
        (490, 11, (127 * 490 + 64 * 11) / 128000, 0.486),
        (400, 101, (127 * 400 + 64 * 101) / 128000, 0.397),
    ],
)
def test_batchllm_table3_two_level_prefixes(
    prefix: int, sub: int, two_level: float, first_level: float
) -> None:
    kwargs = dict(
        n_subgroups=64, sharing_degree=2, prefix_len=prefix, sub_prefix_len=sub, distinct_len=499
    )
    trace = load_batchllm(n_groups=5, **kwargs)
    frame = trace.frame
    assert (frame["input_ids"].map(len) == 1000).all() and len(trace) == 5 * 128
    assert ideal_reuse(trace).reuse_share == pytest.approx(two_level, abs=1e-12)
    # BatchLLM's first-level-only saving ratio (Table 3) from the same structure
    assert 127 * prefix / 128000 == pytest.approx(first_level, abs=5e-4)
    group_of = frame.groupby("ref_subgroup")["ref_group"].nunique()
    assert (group_of == 1).all() and frame.groupby("ref_subgroup").size().eq(2).all()


def test_batchllm_is_seeded_and_outputs_follow_the_chosen_distribution() -> None:
    a = load_batchllm(n_groups=4, perturb="poisson", output_dist="pareto", seed=5)
    b = load_batchllm(n_groups=4, perturb="poisson", output_dist="pareto", seed=5)
    c = load_batchllm(n_groups=4, perturb="poisson", output_dist="pareto", seed=6)
    same = [
        np.array_equal(x, y)
        for x, y in zip(a.frame["input_ids"], b.frame["input_ids"], strict=True)
    ]
    assert all(same) and not np.array_equal(a.frame["output_len"], c.frame["output_len"])
    assert a.frame["output_len"].between(10, 512).all()
    lengths = a.frame["input_ids"].map(len)
    assert lengths.nunique() > 10 and abs(lengths.mean() - 2200) < 60
    draws = bounded_pareto(np.random.default_rng(0), 1.5, 10, 512, 200_000)
    assert draws.min() >= 10 and draws.max() <= 512
    assert 25.0 < draws.mean() < 27.0 and np.median(draws) == 16  # not the paper's 51.2 / 25
    unshuffled = load_batchllm(n_groups=2, shuffle=False)
    assert unshuffled.frame.sort_values("session_id")["ref_group"].is_monotonic_increasing


def test_bare_batchllm_batches_are_the_prompts_of_load_batchllm() -> None:
    """microbenchmark_batch / table3_batch (the planner tests' bare arrays) share the generator."""
    pairs = [
        (
            microbenchmark_batch(30, 7, 4, n_prefixes=3, seed=2),
            load_batchllm(
                n_groups=3,
                sharing_degree=4,
                prefix_len=30,
                distinct_len=7,
                seed=2,
                output_len=0,
                vocab=BARE_VOCAB,
            ),
        ),
        (
            table3_batch(20, 5, 40, groups=3, subcategories=4, per_subcategory=2, seed=1),
            load_batchllm(
                n_groups=3,
                n_subgroups=4,
                sharing_degree=2,
                prefix_len=20,
                sub_prefix_len=5,
                distinct_len=15,
                seed=1,
                output_len=0,
                vocab=BARE_VOCAB,
            ),
        ),
    ]
    for batch, trace in pairs:
        assert len(batch) == len(trace)
        for a, b in zip(batch, trace.frame["input_ids"], strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)


# --- CCQA and chat ---------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", sorted(CCQA_DATASETS))
def test_ccqa_follows_table1(dataset: str) -> None:
    stats = CCQA_DATASETS[dataset]
    n = 12 if dataset != "longhealth" else 3
    trace = load_ccqa(dataset=dataset, n_contexts=n, perturb="none", seed=2)
    frame = trace.frame
    questions = round(stats.parallelism)
    assert trace.name == f"ccqa_{dataset}" and len(trace) == n * questions
    expected = round(stats.instruction) + round(stats.context) + round(stats.question)
    assert (frame["input_ids"].map(len) == expected).all()
    assert (frame["output_len"] == round(stats.answer)).all()
    shared = round(stats.instruction) * (len(trace) - 1) + round(stats.context) * n * (
        questions - 1
    )
    assert ideal_reuse(trace).reuse == shared
    noisy = load_ccqa(dataset=dataset, n_contexts=n, seed=2)
    assert noisy.frame["output_len"].min() >= 1


def test_ccqa_default_sizes_and_parallelism() -> None:
    trace = load_ccqa(dataset="race", seed=0)
    assert trace.frame["ref_context"].nunique() == 1407
    per_context = trace.frame.groupby("ref_context").size()
    assert per_context.mean() == pytest.approx(3.51, abs=0.1)


def test_chat_sessions_extend_and_share_system_prompts() -> None:
    trace = load_chat(n_sessions=30, seed=4)
    frame = trace.frame.sort_values(["session_id", "turn"])
    for _, session in frame.groupby("session_id"):
        inputs, outputs = list(session["input_ids"]), list(session["output_ids"])
        for k in range(len(inputs) - 1):
            full = np.concatenate((inputs[k], outputs[k]))
            assert np.array_equal(inputs[k + 1][: len(full)], full)
    totals = ideal_reuse(trace)
    assert totals.purely_input > 0 and totals.input_and_output > totals.purely_input
    capped = load_chat(n_sessions=30, seed=4, max_tokens=1500)
    assert (capped.frame["input_ids"].map(len) + capped.frame["output_len"]).max() <= 1500


@pytest.mark.skipif(not (DATA / "azure").is_dir(), reason="Azure trace not in the data dir")
def test_chat_lengths_from_the_azure_distribution() -> None:
    trace = load_chat(n_sessions=40, lengths="azure_code", seed=1, turns_max=3)
    replies = trace.frame["output_len"]
    assert replies.median() < 40  # code completions are short (median 13 tokens)
    with pytest.raises(ValueError, match="lengths must be"):
        load_chat(lengths="zipf")


# --- configs and the describe CLI ------------------------------------------------------------


def test_every_trace_config_composes_with_a_loader_target() -> None:
    from traces.__main__ import compose_trace_config

    for name in TRACE_CONFIGS:
        cfg = compose_trace_config(name, [])
        assert cfg.trace._target_.startswith("traces.") and cfg.trace.name


@pytest.mark.parametrize(
    ("config", "overrides", "name"),
    [
        ("batchllm_table3a", ["trace.n_groups=2"], "batchllm_table3a"),
        ("ccqa", ["trace.dataset=race", "trace.n_contexts=5", "seed=3"], "ccqa_race"),
        ("chat", ["trace.n_sessions=5"], "chat_synthetic"),
    ],
)
def test_synthetic_configs_instantiate(config: str, overrides: list[str], name: str) -> None:
    trace = load_configured_trace(config, overrides)
    assert trace.name == name and len(trace) > 0


def test_describe_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "m.jsonl"
    data.write_text(
        "\n".join(
            json.dumps(
                {"timestamp": t, "input_length": 1500, "output_length": 9, "hash_ids": [0, 1, t]}
            )
            for t in (10, 20, 30)
        )
        + "\n"
    )
    cache = f"+trace.cache_dir={tmp_path / 'c'}"
    assert main(["describe", "mooncake", f"trace.path={data}", cache]) == 0
    out = capsys.readouterr().out
    assert "3 in 3 sessions" in out and "512-token blocks" in out and "2,048 tokens" in out
    assert main(["describe", "mooncake", f"trace.path={data}", cache, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["ideal_reuse"]["tokens"] == 2 * 1024 and stats["block_size"] == 512
    assert main(["describe", "mooncake", f"trace.path={tmp_path / 'missing.jsonl'}"]) == 2
    assert "Mooncake hash-id trace not found" in capsys.readouterr().err
    assert main(["describe", "no_such_trace"]) == 2
