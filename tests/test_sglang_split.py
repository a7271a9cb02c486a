"""SGLang 0.5.23's default Mamba pool: its memory split between the Mamba state pool and the
KV pool when ``cache.ssm_gb`` is unset (``policy.mamba_full_memory_ratio``), checked against
SGLang's formula written out here from its code, with the states per request SGLang's own
config classes give (``tests/fixtures/crosscheck/geometry.json``)."""

from __future__ import annotations

import json
import logging

import pytest

from simlab.config import ConfigError
from simlab.experiments import geometry
from simlab.run.plan import plan_run
from simlab.run.policy import policy_step
from simlab.run.simulate import simulate
from tests.fixtures import compose

SGLANG_STATES = {
    m["config"]: m["sglang_state_bytes"] for m in json.loads(geometry.FIXTURE.read_text())["models"]
}
#: Nemotron-H-8B's states per request in SGLang (24 Mamba2 layers: FP32 SSM, BF16 conv of
#: ``kernel - 1`` columns of 8,192 + 2 * 8 * 128 channels)
NEMOTRON_STATE = 24 * (128 * 64 * 128 * 4 + 10_240 * 3 * 2)


def sglang(rest_bytes: float, per_req: int, ratio: float = 0.9) -> tuple[int, int]:
    """``_handle_max_mamba_cache`` and ``_profile_available_bytes`` (GiB floats), no
    speculative decoding: the Mamba slots and the KV pool's bytes."""
    total_rest_memory = rest_bytes / (1 << 30)
    mamba_budget = total_rest_memory * ratio / (1 + ratio)
    max_mamba_cache_size = int((mamba_budget * (1 << 30) - per_req) // per_req)
    mamba_state_memory = (max_mamba_cache_size + 1) * per_req / (1 << 30)
    return max_mamba_cache_size, int((total_rest_memory - mamba_state_memory) * (1 << 30))


def step(overrides: list[str]):
    plan = plan_run(compose(["+policy=sglang", "engine=replay", *overrides]))
    return policy_step(plan.policies["sglang"], plan.model, plan.settings)


@pytest.mark.parametrize(
    ("model", "size_gb", "per_req", "slots"),
    [
        (["model=nemotron_h_8b"], 2, NEMOTRON_STATE, 8),
        (["model=nemotron_h_8b"], 8, NEMOTRON_STATE, 36),
        (["model=qwen3_5_27b"], 8, SGLANG_STATES["Qwen--Qwen3.5-27B_config.json"], 23),
        (
            ["model=hf", "model.id=Qwen/Qwen3.5-27B"],
            40,
            SGLANG_STATES["Qwen--Qwen3.5-27B_config.json"],
            122,
        ),
    ],
)
def test_the_default_split_is_sglangs(model, size_gb, per_req, slots):
    """Slots and KV bytes as SGLang computes them; the cache holds exactly those slots of its
    own states, and summary.json says so."""
    try:
        made = step([*model, f"cache.size_gb={size_gb}"])
    except ConfigError as err:
        if "aiconfigurator" in str(err):
            pytest.skip("aiconfigurator-core is not installed")
        raise
    assert sglang(size_gb * 1e9, per_req) == (slots, made.state_pool.kv_bytes)
    cache = made.cache
    assert cache.capacity == made.state_pool.kv_bytes
    assert cache.ssm_capacity == slots * cache.model.ssm_state_bytes
    geo = made.engine_items()
    assert geo["engine_geometry"]["state_bytes"] == per_req
    assert geo["engine_geometry"]["mamba_pool"] == {
        "shared_with_kv": False,
        "source": "default split",
        "mamba_full_memory_ratio": 0.9,
        "slots": slots,
        "ssm_gb": (slots + 1) * per_req / 1e9,
        "kv_gb": made.state_pool.kv_bytes / 1e9,
    }
    assert geo["engine_defaults"]["mamba_full_memory_ratio"].startswith("0.9 (SGLang 0.5.23")


def test_the_ratio_setting_and_cache_ssm_gb():
    """``policy.mamba_full_memory_ratio`` sets the split (not a default then);
    ``cache.ssm_gb`` overrides it; an infinite cache, or a host tier, has one shared budget."""
    ratio = step(["model=nemotron_h_8b", "policy.mamba_full_memory_ratio=3"])
    assert ratio.state_pool.slots == sglang(2e9, NEMOTRON_STATE, 3)[0] == 13
    assert "mamba_full_memory_ratio" not in ratio.engine_items()["engine_defaults"]
    given = step(["model=nemotron_h_8b", "cache.ssm_gb=0.5"]).engine_items()
    assert given["engine_geometry"]["mamba_pool"]["source"] == "cache.ssm_gb"
    assert "mamba_full_memory_ratio" not in given["engine_defaults"]
    infinite = step(["model=nemotron_h_8b", "cache.size_gb=inf"])
    assert infinite.state_pool is None
    assert infinite.engine_items()["engine_geometry"]["mamba_pool"] == {"shared_with_kv": True}
    assert step(["model=llama3_8b"]).state_pool is None
    host = step(["model=nemotron_h_8b", "cache.host_gb=1", "cache.host_bw_gbps=25"])
    assert host.state_pool is None  # a host tier needs one shared GPU budget
    (note,) = host.notes  # ... and says so: SGLang itself would split
    assert note.startswith("cache.host_gb: the SSM states share the GPU budget")
    assert note in host.summary()["caveats"]
    assert not step(["model=nemotron_h_8b", "cache.host_gb=1", "cache.host_bw_gbps=25",
                     "cache.size_gb=inf"]).notes  # fmt: skip


def test_the_default_is_warned_once(caplog):
    with caplog.at_level(logging.WARNING, logger="simlab.run.plan"):
        plan_run(compose(["+policy=sglang", "model=nemotron_h_8b"]))
    lines = [r.message for r in caplog.records if "memory split" in r.message]
    assert len(lines) == 1 and "8 state slots" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="simlab.run.plan"):
        plan_run(compose(["+policy=sglang", "model=nemotron_h_8b", "cache.ssm_gb=1"]))
    assert not [r for r in caplog.records if "memory split" in r.message]


def test_bad_ratios_and_no_slot_are_errors_naming_the_key():
    with pytest.raises(ConfigError, match=r"policy\.mamba_full_memory_ratio must be a positive"):
        plan_run(compose(["+policy=sglang", "policy.mamba_full_memory_ratio=0"]))
    with pytest.raises(ConfigError, match=r"cache\.size_gb: SGLang's memory split .* no Mamba"):
        step(["model=nemotron_h_8b", "policy.mamba_full_memory_ratio=0.05"])


def test_the_hits_change_with_the_ratio(tmp_path):
    """The ratio moves the hits: a quarter of 0.9's slots loses most of them."""
    hits = {}
    for ratio in (0.25, 0.9, 9):
        out = tmp_path / str(ratio)
        overrides = ["+policy=sglang", "model=nemotron_h_8b", "engine=replay", "trace.limit=4"]
        overrides += [f"policy.mamba_full_memory_ratio={ratio}", "bounds.enabled=false"]
        simulate(compose([*overrides, f"output_dir={out}"]))
        written = json.loads((out / "summary.json").read_text())["policies"]["sglang"]
        hits[ratio] = written["token_hit_rate"]
    assert hits[0.25] < hits[0.9] < hits[9], hits
