"""Where each lost hit went (simlab/run/breakdown.py): the parts of every request's input are
>= 0 and sum to it exactly, for every policy and engine; the structural zeros (an infinite
cache loses nothing to capacity, replay nothing to concurrency, a Transformer on 1-token pages
nothing to granularity or placement); one hand-built case per part."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simlab.run.breakdown import COLUMNS, PARTS, Setting, add_breakdowns, attribute
from simlab.run.plan import RunPlan, plan_run
from simlab.run.policy import PolicyRun, run_policy
from tests.fixtures import compose
from traces.format import Request

POLICIES = {
    "lru": ["+policy=sglang_plus"],
    "marconi": ["+policy=marconi", "policy.tuning.enabled=false"],
    # 0.3 GB holds no Mamba slot at SGLang's default split (0.9): one at 3
    "sglang": ["+policy=sglang", "policy.mamba_full_memory_ratio=3"],
    "vllm": ["+policy=vllm"],
}
MODELS = {"hybrid": "nemotron_h_8b", "transformer": "llama3_8b"}
ENGINES = {
    "replay": ["engine=replay"],
    "timed": ["engine=timed"],
    "cluster": ["engine=timed", "cluster.replicas=2", "cluster.router=round_robin"],
}
SIZES = {"hybrid": "cache.size_gb=0.3", "transformer": "cache.size_gb=0.15"}


@functools.cache
def plan(policy: str, model: str, engine: str, *extra: str) -> RunPlan:
    overrides = [*POLICIES[policy], f"model={MODELS[model]}", *ENGINES[engine], SIZES[model]]
    return plan_run(compose([*overrides, "report=false", "bounds.enabled=false", *extra]))


def run(the_plan: RunPlan, requests: list[Request]) -> PolicyRun:
    """One policy's run of ``requests`` with its reuse breakdown."""
    ((name, spec),) = the_plan.policies.items()
    unit = requests[0].block_size  # tokens per id (a hash-id trace's block)
    done = run_policy(spec, requests, the_plan.model, the_plan.settings, the_plan.engine, unit)
    setting = Setting(the_plan.model, the_plan.settings, the_plan.engine, unit)
    add_breakdowns({name: done}, the_plan.policies, requests, setting)
    return done


def parts(done: PolicyRun) -> dict[str, np.ndarray]:
    records = done.records
    return {"hit": records["hit_tokens"]} | {p: records[c] for p, c in COLUMNS.items()}


def summed(split: dict[str, np.ndarray]) -> np.ndarray:
    """The parts added up, per request."""
    return np.sum(np.stack(list(split.values())), axis=0)


def request(i: int, tokens: list[int] | np.ndarray, output: int = 8, at: float | None = None):
    return Request(
        request_id=i,
        session_id=i,
        turn=0,
        arrival=float(i * 100) if at is None else at,
        input_ids=np.asarray(tokens, dtype=np.int32),
        output_ids=np.arange(10_000 + 50 * i, 10_000 + 50 * i + output, dtype=np.int32),
        output_len=output,
    )


@st.composite
def traces(draw) -> list[Request]:
    """2-7 requests, each a prefix of an earlier request's input + output or of a shared
    prompt (or nothing), then fresh tokens: shared prefixes of every length, block-aligned or
    not, and whole earlier turns."""
    shared = [np.arange(1, 1 + n, dtype=np.int32) * 7 for n in (40, 600, 1400)]
    requests: list[Request] = []
    for i in range(draw(st.integers(2, 7))):
        sources = shared + [np.concatenate((r.input_ids, r.output_ids)) for r in requests]
        source = sources[draw(st.integers(0, len(sources) - 1))]
        keep = draw(st.integers(0, len(source)))
        fresh = np.arange(draw(st.integers(1, 300)), dtype=np.int32) + 50_000 + 1000 * i
        tokens = np.concatenate((source[:keep], fresh))
        requests.append(
            request(i, tokens, draw(st.integers(1, 40)), at=i * draw(st.sampled_from([0.01, 50.0])))
        )
    return requests


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=traces())
def test_parts_sum_to_the_input(policy, model, engine, requests):
    """Every part >= 0, their sum the input on every request; replay loses nothing to
    concurrency, one replica nothing to routing, a Transformer on a 1-token grid nothing to
    granularity or placement; the summary's fractions sum to 1."""
    done = run(plan(policy, model, engine), requests)
    split = parts(done)
    assert (summed(split) == done.records["input_tokens"]).all()
    assert all((values >= 0).all() for values in split.values())
    if engine == "replay":
        assert not split["concurrency"].any()
    if engine != "cluster":
        assert not split["routing"].any()
    notes = done.summary["reuse_breakdown_notes"]
    if model == "transformer" and notes["grid_tokens"] == 1:
        assert not split["granularity"].any() and not split["placement"].any()
    assert sum(done.summary["reuse_breakdown"][p] for p in PARTS) == pytest.approx(1.0)
    assert "uncomputed" not in notes


@pytest.mark.parametrize("engine", ["replay", "timed"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_an_infinite_cache_loses_nothing_to_capacity(policy, engine):
    requests = [request(i, np.arange(1, 700 + 100 * i) % (300 + 37 * i)) for i in range(8)]
    for model in MODELS:
        done = run(plan(policy, model, engine, "cache.size_gb=inf"), requests)
        assert not parts(done)["capacity"].any()


@pytest.mark.parametrize("policy", ["lru", "sglang", "vllm"])
def test_a_transformer_on_one_token_pages_loses_nothing_to_the_grid(policy):
    """Shared prefixes of every length, multi-turn and cross-session; the grid is 1 token."""
    base = np.arange(1, 2000, dtype=np.int32)
    requests = [request(i, np.concatenate((base[: 37 * i + 5], [90_000 + i]))) for i in range(10)]
    pages = ["policy.block_size=1"] if policy == "vllm" else []
    done = run(plan(policy, "transformer", "replay", *pages), requests)
    split = parts(done)
    assert done.summary["reuse_breakdown_notes"]["grid_tokens"] == 1
    assert not split["granularity"].any() and not split["placement"].any()
    assert split["hit"][1:].all()


def test_never_seen_before_is_compulsory():
    requests = [request(0, np.arange(1, 500)), request(1, np.arange(1000, 1300))]
    split = parts(run(plan("lru", "transformer", "replay"), requests))
    assert split["compulsory"].tolist() == [499, 300]


def test_a_shared_prefix_shorter_than_a_block_is_granularity():
    """vLLM's 16-token blocks on a Transformer: 10 shared tokens never hit (vllm #54607)."""
    shared = list(range(1, 11))
    requests = [request(0, [*shared, *range(100, 140)]), request(1, [*shared, *range(200, 230)])]
    split = parts(run(plan("vllm", "transformer", "replay"), requests))
    assert split["granularity"][1] == 10
    assert split["hit"][1] == 0 and split["compulsory"][1] == 30


def test_align_mode_states_past_the_divergence_are_placement():
    """vLLM's align mode at concurrency 1 (vllm #42317): a shared system prompt, then
    different questions; the state is kept only at the first prompt's end, past where the
    second diverges, so the block-aligned shared prefix is lost to placement. (Questions long
    enough that the last block boundary of each prompt lies past the system prompt with vLLM's
    1,040-token blocks for Nemotron-H-8B's FP32 state, in a cache that holds them.)"""
    system = np.arange(1, 1201, dtype=np.int32)
    requests = [
        request(0, np.concatenate((system, np.arange(20_000, 21_000)))),
        request(1, np.concatenate((system, np.arange(30_000, 30_900)))),
    ]
    done = run(plan("vllm", "hybrid", "replay", "cache.size_gb=5"), requests)
    split, grid = parts(done), done.summary["reuse_breakdown_notes"]["grid_tokens"]
    assert grid > 16  # the hybrid's forced block
    assert split["hit"][1] == 0
    assert split["placement"][1] == 1200 // grid * grid
    assert split["granularity"][1] == 1200 - 1200 // grid * grid


def test_an_evicted_prefix_is_capacity():
    """A 1,000-token prompt evicted by an unrelated one before a third request shares 800 of
    its tokens (0.15 GB holds about 1,100 tokens of Llama-3-8B)."""
    first = np.arange(1, 1001, dtype=np.int32)
    requests = [
        request(0, first),
        request(1, np.arange(5000, 6000)),
        request(2, np.concatenate((first[:800], np.arange(9000, 9100)))),
    ]
    split = parts(run(plan("lru", "transformer", "replay"), requests))
    assert split["capacity"][2] == 800 and split["hit"][2] == 0


def test_a_sharer_in_flight_is_concurrency():
    """Two requests arriving together with a long shared prefix: the second is looked up
    before the first has published it."""
    shared = np.arange(1, 1001, dtype=np.int32)
    requests = [
        request(0, np.concatenate((shared, [7000])), output=64, at=0.0),
        request(1, np.concatenate((shared, [8000])), output=64, at=0.0),
    ]
    split = parts(run(plan("lru", "transformer", "timed", "arrivals.mode=timestamps"), requests))
    assert split["concurrency"][1] == 1000 and split["hit"][1] == 0


def test_the_other_replica_had_it_is_routing():
    """Round robin sends the second request to the replica without its prefix."""
    shared = np.arange(1, 1001, dtype=np.int32)
    requests = [
        request(0, np.concatenate((shared, [7000]))),
        request(1, np.concatenate((shared, [8000]))),
    ]
    done = run(plan("lru", "transformer", "cluster", "arrivals.mode=timestamps"), requests)
    split = parts(done)
    assert split["routing"][1] == 1000 and split["hit"][1] == 0


def test_clamping_keeps_the_hit_and_the_sum():
    """A counterfactual above the level over it (a non-monotone policy) raises that level:
    the hit stays exact, every part >= 0, the sum the input; the raised tokens are counted."""
    inputs, hits = np.array([100, 100]), np.array([60, 10])
    levels = {
        "ideal": np.array([90, 99]),
        "grid": np.array([80, 96]),
        "infinite": np.array([40, 96]),  # below the hit of request 0
        "capacity": np.array([70, 50]),
        "routed": np.array([60, 30]),
    }
    split, clamped = attribute(inputs, hits, levels)
    assert split["hit"].tolist() == [60, 10]
    assert split["placement"].tolist() == [10, 0] and split["capacity"].tolist() == [0, 46]
    assert summed(split).tolist() == [100, 100]
    assert clamped.tolist() == [30, 0]


@pytest.mark.parametrize("engine", ["replay", "timed", "offline"])
def test_a_host_tier_splits_the_hit(engine):
    """With a host tier the hit is split into its GPU and host parts, in the records and the
    summary; the parts still sum to the input (here also on the offline engine)."""
    shared = np.arange(1, 1001, dtype=np.int32)
    requests = [
        request(i, np.concatenate((shared[: 900 - 50 * (i % 3)], [7000 + i]))) for i in range(6)
    ]
    requests.insert(3, request(99, np.arange(20_000, 21_100)))
    host = ["cache.host_gb=1", "cache.host_bw_gbps=25", "cache.size_gb=0.15"]
    engines = {"offline": ["engine=offline"]}.get(engine, [])
    the_plan = plan(
        "lru", "transformer", "timed" if engine == "offline" else engine, *host, *engines
    )
    done = run(the_plan, requests)
    records, shares = done.records, done.summary["reuse_breakdown"]
    assert (records["gpu_hit_tokens"] + records["host_hit_tokens"] == records["hit_tokens"]).all()
    assert (summed(parts(done)) == records["input_tokens"]).all()
    assert shares["hit_gpu"] + shares["hit_host"] == pytest.approx(shares["hit"])
    assert sum(shares[p] for p in PARTS) == pytest.approx(1.0)


def test_a_hash_id_trace_is_split_in_tokens():
    """Mooncake-style ids of 512 tokens, a prompt's last id short: the parts are tokens and
    sum to the input; a block-keyed vLLM on 512-token blocks has the trace's grid."""

    def hashed(i: int, ids: list[int], tokens: int) -> Request:
        return Request(i, i, 0, float(i), np.asarray(ids, dtype=np.int32),
                       np.zeros(0, dtype=np.int32), 4, block_size=512, ref_input_tokens=tokens)  # fmt: skip

    requests = [
        hashed(0, [1, 2, 3], 1400),
        hashed(1, [1, 2, 4], 1300),
        hashed(2, [1, 2, 3, 5], 2000),
    ]
    done = run(
        plan("vllm", "transformer", "replay", "policy.block_size=512", "cache.size_gb=1"), requests
    )
    split = parts(done)
    assert (summed(split) == done.records["input_tokens"]).all()
    assert split["hit"].tolist()[1:] == [1024, 1024]  # request 0's id 3 was short: another key
    assert done.summary["reuse_breakdown_notes"]["grid_tokens"] == 512


def test_capacities_share_the_infinite_cache(tmp_path):
    """A cache.size_gb list: every capacity gets its breakdown; more room, less capacity loss."""
    from simlab.run.capacities import run_capacities

    overrides = ["+policy=sglang_plus", "model=llama3_8b", "engine=replay", "trace=chat",
                 "trace.n_sessions=12", "cache.size_gb=[0.05,0.5]", "report=false",
                 f"output_dir={tmp_path}"]  # fmt: skip
    done = run_capacities(compose(overrides))
    small, large = (s.policies["sglang_plus"]["reuse_breakdown"] for s in done.summaries)
    assert small["capacity"] > large["capacity"] and small["hit"] < large["hit"]
    assert small["compulsory"] == large["compulsory"] and small["granularity"] == 0.0


def test_the_report_draws_the_summary_and_can_be_turned_off(tmp_path):
    """The waterfall page reads summary.json's shares; ``reuse_breakdown=false`` writes no
    columns or keys, and the report leaves the page out, saying why."""
    from simlab.report.__main__ import main as report_main
    from simlab.report.breakdown_pages import breakdown_table, waterfall_steps
    from simlab.report.build import BREAKDOWN, render_report
    from simlab.report.load import load_run
    from simlab.run.simulate import simulate

    common = ["+policy=vllm", "model=nemotron_h_8b", "engine=replay", "trace=chat",
              "trace.n_sessions=10", "bounds.enabled=false", "report=false"]  # fmt: skip
    simulate(compose([*common, f"output_dir={tmp_path / 'on'}"]))
    results = load_run(tmp_path / "on")
    shares = results.summary["policies"]["vllm"]["reuse_breakdown"]
    table = breakdown_table(results)
    assert table.loc["vllm"].to_dict() == {p: shares[p] for p in PARTS}
    steps = waterfall_steps(shares)
    assert steps[-1] == ("hit", 0.0, shares["hit"])
    assert steps[-2][1] == pytest.approx(shares["hit"])  # the last loss ends on the hit
    simulate(compose([*common, "reuse_breakdown=false", f"output_dir={tmp_path / 'off'}"]))
    off = load_run(tmp_path / "off")
    assert "reuse_breakdown" not in off.summary["policies"]["vllm"]
    assert "placement_tokens" not in off.records.columns
    report = render_report(tmp_path / "off", tmp_path / "off.pdf")
    assert BREAKDOWN not in report.pages and "reuse_breakdown=false" in report.skipped[BREAKDOWN]
    png = tmp_path / "waterfall.png"
    assert report_main([str(tmp_path / "on"), "--waterfall", str(png)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    assert report_main([str(tmp_path / "off"), "--waterfall", str(png)]) == 2  # says why


def test_a_counterfactual_that_cannot_run_is_named(monkeypatch):
    """If the infinite cache's replay fails, its capacity loss is counted in placement and
    ``uncomputed`` says so (never a silent 0); the parts still sum to the input."""
    import simlab.run.breakdown as breakdown
    from simlab.config import ConfigError

    def refuse(spec, requests, model, settings, *args):
        if settings.cache.size_gb == float("inf"):
            raise ConfigError("cache.size_gb: refused")
        return run_policy(spec, requests, model, settings, *args)

    monkeypatch.setattr(breakdown, "run_policy", refuse)
    first = np.arange(1, 1001, dtype=np.int32)
    requests = [request(0, first), request(1, np.arange(5000, 6000)), request(2, first[:900])]
    done = run(plan("lru", "transformer", "timed"), requests)
    notes, split = done.summary["reuse_breakdown_notes"], parts(done)
    assert notes["uncomputed"] == {"capacity": "counted in placement: cache.size_gb: refused"}
    assert not split["capacity"].any() and split["placement"][2] > 0
    assert (summed(split) == done.records["input_tokens"]).all()


def test_a_counterfactual_replay_does_not_warn_about_the_users_run(caplog):
    """The infinite-cache replay never evicts, so Marconi's alpha never tunes there: that is
    not the user's run, and only the run's own caveat is logged (it used to appear twice)."""
    requests = [request(i, np.arange(1, 200) + 1000 * (i % 2)) for i in range(4)]
    the_plan = plan_run(
        compose(["+policy=marconi", "model=nemotron_h_8b", "engine=replay", "cache.size_gb=8"])
    )
    with caplog.at_level("WARNING"):
        run(the_plan, requests)
    assert caplog.text.count("alpha never tuned") == 1


@pytest.mark.parametrize("engine", ["replay", "timed"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=traces())
def test_parts_sum_to_the_input_with_a_prefix_match_unit(engine, requests):
    """vLLM's pool keyed every 16 tokens (a hybrid's block is 1,040): the parts still sum to
    the input, granularity is measured on the unit, replay loses nothing to concurrency."""
    done = run(plan("vllm", "hybrid", engine, "policy.prefix_match_unit=16"), requests)
    split = parts(done)
    assert (summed(split) == done.records["input_tokens"]).all()
    assert all((values >= 0).all() for values in split.values())
    assert done.summary["reuse_breakdown_notes"]["grid_tokens"] == 16
    assert (split["granularity"] < 16).all()
    if engine == "replay":
        assert not split["concurrency"].any()


def test_a_timed_hybrid_is_replayed_at_its_own_token_budget():
    """A timed run's counterfactuals prefill as many tokens a step as it did: vLLM's align
    mode keeps a state every retention interval where a step ends there (vllm #42317), so a
    replay at another budget would count the difference as concurrency. A 2,500-token system
    prompt and 1,500-token questions one at a time, each prompt in one step of the default
    8,192 tokens: no state at 2,080 from the first (at 2,048 a step would end there), the
    junction state the second leaves hit by the later ones, as the replay at that budget has
    it."""
    system = np.arange(1, 2501, dtype=np.int32)
    requests = [
        request(i, np.concatenate((system, np.arange(1500) + 20_000 + 2000 * i)), at=i * 100.0)
        for i in range(4)
    ]
    extra = (
        "cache.size_gb=5",
        "arrivals.mode=timestamps",
        "policy.prefix_cache_retention_interval=1040",
    )
    split = parts(run(plan("vllm", "hybrid", "timed", *extra), requests))
    assert not split["concurrency"].any()
    assert split["hit"][0] == split["hit"][1] == 0 and split["hit"][2:].all()
