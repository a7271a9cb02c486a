"""bench/peers.py without the peers: capacity mapping, output parsing, the skip path."""

from __future__ import annotations

import math
import subprocess
from typing import Any

import pytest

from bench import peers

#: kvcache-simulator 0.1.3 ``run --format json`` (trimmed: 2 of its points, 2 policies) on the
#: Mooncake synthetic trace, llama-3.1-8b, bf16_fp16, block size 512
KVSIM_SAMPLE: dict[str, Any] = {
    "metadata": {
        "modelId": "llama-3.1-8b",
        "blockSize": 512,
        "bytesPerToken": 131072.0,
        "bytesPerBlock": 67108864.0,
        "requestCount": 3993,
        "warmupRequests": 1996,
        "backend": "cpp",
    },
    "hitRateCeiling": 0.8627495917230483,
    "points": [
        {
            "gib": 16.0,
            "cacheBlocks": 256,
            "results": {
                "lru": {"cacheBlocks": 256, "hitTokens": 1283896, "hitRate": 0.035124812891872415},
                "fifo": {"cacheBlocks": 256, "hitTokens": 1155000, "hitRate": 0.0316},
            },
        },
        {
            "gib": 256.0,
            "cacheBlocks": 4096,
            "results": {
                "lru": {"cacheBlocks": 4096, "hitTokens": 13335869, "hitRate": 0.364842559970217},
                "fifo": {"cacheBlocks": 4096, "hitTokens": 13070000, "hitRate": 0.3576},
            },
        },
    ],
    "policies": ["lru", "fifo"],
}

#: bench/peer_driver.py ``dynosim`` output (ai-dynamo-runtime 1.6.1, sequential, 4096 blocks)
DYNOSIM_SAMPLE = {
    "call_s": 0.827,
    "sim_s": 0.813,
    "requests": 3993,
    "warmup_requests": 1996,
    "hit_tokens": 15779000,
    "input_tokens": 61194628,
    "hit_tokens_last_half": 13867000,
    "input_tokens_last_half": 36552394,
    "prefix_cache_reused_ratio": 0.2578,
    "duration_ms": 4479211.8,
}


def test_block_bytes_match_simlab_model():
    assert peers.BLOCK_BYTES == 512 * 131072 == peers.simlab_block_bytes()


@pytest.mark.parametrize("blocks", [1, 256, 1024, 4096, 16384])
def test_capacity_conversion_holds_exactly_the_blocks(blocks):
    gib = peers.blocks_to_gib(blocks)
    # kvcache-simulator: floor(gib * 2^30 / bytes_per_block)
    assert math.floor(gib * 2**30 / peers.BLOCK_BYTES) == blocks
    # simlab: a cache of size_gb * 1e9 bytes holds floor(bytes / block) whole blocks
    assert math.floor(peers.blocks_to_size_gb(blocks) * 1e9 / peers.BLOCK_BYTES) == blocks
    assert peers.point_key("lru", blocks) == f"lru@{blocks}"


def test_infinite_capacity():
    assert math.isinf(peers.blocks_to_size_gb(peers.INF_BLOCKS))
    assert peers.point_key("vllm", peers.INF_BLOCKS) == "vllm@inf"


def test_budgets_arg():
    assert peers.budgets_arg(peers.CAPACITIES) == "16,64,256,1024"


def test_parse_kvsim_sample():
    hits = peers.parse_kvsim(KVSIM_SAMPLE, [256, 4096])
    assert hits == {
        "lru@256": 0.035124812891872415,
        "fifo@256": 0.0316,
        "lru@4096": 0.364842559970217,
        "fifo@4096": 0.3576,
    }


def test_parse_kvsim_rejects_other_block_bytes():
    other = {**KVSIM_SAMPLE, "metadata": {**KVSIM_SAMPLE["metadata"], "bytesPerBlock": 1.0}}
    with pytest.raises(ValueError, match="sizes blocks"):
        peers.parse_kvsim(other, [256, 4096])
    with pytest.raises(ValueError, match="blocks"):
        peers.parse_kvsim(KVSIM_SAMPLE, [4096])


def test_parse_dynosim_sample():
    hits, extra = peers.parse_dynosim(DYNOSIM_SAMPLE)
    assert hits["last_half"] == pytest.approx(13867000 / 36552394)
    assert extra["hit_rate_all"] == pytest.approx(15779000 / 61194628)


def test_last_line_json_skips_noise():
    assert peers.last_line_json('warning: x\n{"a": 1}\n\n') == {"a": 1}


def test_window_hit_rate_is_the_last_half():
    # 5 requests: floor(5 / 2) = 2 warm-up requests, then 3 measured
    assert peers.window_hit_rate([9, 9, 1, 0, 2], [10, 10, 4, 4, 2]) == pytest.approx(3 / 10)


def test_format_hits_orders_capacities():
    text = peers.format_hits({"lru@4096": 0.5, "lru@256": 0.25, "fifo@inf": 1.0})
    assert text == "fifo inf=1.0000 | lru 256=0.2500 4096=0.5000"


def test_summarize_flags_disagreement():
    def unused(setup: peers.Setup) -> peers.Run:
        raise AssertionError("summarize runs nothing")

    case = peers.Case("c", {"simlab": unused, "peer": unused}, {"peer"}, "")
    runs = {
        "simlab": [peers.Run(2.0, 1.0, {"lru@1": 0.5})],
        "peer": [peers.Run(1.0, 0.5, {"lru@1": 0.502})],
    }
    rows = peers.summarize(case, runs)["rows"]
    assert rows[0]["hits_agree"] is None
    assert rows[1]["hits_agree"] is False
    assert rows[1]["simlab_over_peer_process"] == pytest.approx(2.0)
    runs["peer"] = [peers.Run(1.0, 0.5, {"lru@1": 0.5005})]
    assert peers.summarize(case, runs)["rows"][1]["hits_agree"] is True


def test_install_failure_raises_peer_unavailable(monkeypatch, tmp_path):
    def fail(cmd, timeout=None):
        raise subprocess.CalledProcessError(1, cmd, stderr="ERROR: No matching distribution")

    monkeypatch.setattr(peers, "run_command", fail)
    with pytest.raises(peers.PeerUnavailable, match="No matching distribution"):
        peers.ensure_env(peers.KVSIM, tmp_path)


def test_installed_stamp_skips_the_install(monkeypatch, tmp_path):
    env = tmp_path / peers.KVSIM.env
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").touch()
    (env / ".installed").write_text("kvcache-simulator==0.1.3")

    def never(cmd, timeout=None):
        raise AssertionError("installed again")

    monkeypatch.setattr(peers, "run_command", never)
    assert peers.ensure_env(peers.KVSIM, tmp_path) == env / "bin" / "python"


def test_main_skips_cleanly_when_no_peer_installs(monkeypatch, tmp_path, capsys):
    def offline(cmd, timeout=None):
        raise OSError("Network is unreachable")

    def no_run(*args, **kwargs):
        raise AssertionError("nothing may run without a peer")

    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n')
    monkeypatch.setattr(peers, "run_command", offline)
    monkeypatch.setattr(peers, "timed", no_run)
    out = tmp_path / "peers.json"
    code = peers.main(["--trace", str(trace), "--cache-dir", str(tmp_path), "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "skipping kvcache-simulator" in printed and "Network is unreachable" in printed
    assert "no peer simulator could be installed" in printed
    assert not out.exists()


def test_main_skips_without_trace(tmp_path, capsys):
    assert peers.main(["--trace", str(tmp_path / "missing.jsonl")]) == 0
    assert "no Mooncake-format trace" in capsys.readouterr().out


def test_one_call_compare_set_is_the_three_peer_policies():
    """The one-call case's ``compare`` set: kvcache-simulator's names, 512-token blocks, LRU
    computed in one stack-distance pass, FIFO and optimal on block ids (no request-by-request
    replay)."""
    from simlab.fastpaths.blocks.replay import heap_order
    from simlab.run import routes
    from simlab.run.simulate import build_engine, plan_run, policy_step
    from tests.fixtures import compose

    cfg = compose(
        [
            "trace=mooncake",
            f"model={peers.SIMLAB_MODEL}",
            "engine=replay",
            *peers.compare_overrides(peers.POLICIES),
            "cache.size_gb=2",
        ]
    )
    plan = plan_run(cfg)
    settings, model = plan.settings, plan.model
    assert list(plan.policies) == list(peers.POLICIES)
    engine = build_engine(cfg)
    orders = {}
    for name, spec in plan.policies.items():
        step = policy_step(spec, model, settings, peers.BLOCK_TOKENS)
        assert step.cache.semantics.whole_input_hit
        assert step.admission.keys.whole_last_id  # kvcache-simulator: every id a whole block
        assert step.cache.kv_per_token == peers.BLOCK_BYTES  # one node per 512-token block
        assert routes.choose(routes.Case(step, engine, [])).taken in routes.BLOCK_ROUTES
        orders[name] = heap_order(step.eviction)
    assert orders == {"fifo": "fifo", "lru": "lru", "optimal": "belady"}


def test_size_list_holds_exactly_the_blocks():
    arg = peers.size_list([256, peers.INF_BLOCKS])
    assert arg == f"cache.size_gb=[{peers.blocks_to_size_gb(256)!r},inf]"


def test_start_up_floor_runs_the_one_capacity_command_without_simulating(tmp_path):
    """The floor's ``--cfg job`` process composes the one-capacity case's config (its trace and
    its exact capacity) and exits without simulating: no output directory is written."""
    trace = tmp_path / "trace.jsonl"
    setup = peers.Setup(trace, tmp_path / "work", {})
    commands = peers.floor_commands(setup)
    (stack, simlab) = commands.values()
    assert subprocess.run(stack, check=False).returncode == 0
    done = subprocess.run(simlab, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert f"path: {trace}" in done.stdout
    assert f"size_gb: {peers.blocks_to_size_gb(peers.ONE_CAPACITY)!r}" in done.stdout
    assert list(tmp_path.iterdir()) == []  # no outputs/ run directory


def test_format_floor_divides_by_each_peers_one_capacity_process():
    floor = {"stack": {"process_s": 0.2, "runs_s": [0.2]}}
    results = [
        {
            "case": f"LRU, {peers.ONE_CAPACITY} blocks",
            "rows": [
                {"tool": "simlab replay (vllm LRU)", "process_s": 0.7},
                {"tool": "kvcache-simulator cpp", "process_s": 0.1},
            ],
        }
    ]
    text = peers.format_floor(floor, results)
    assert "0.20 s  2.00x kvcache-simulator cpp" in text
    assert "simlab replay" not in text
