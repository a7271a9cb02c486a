"""Agreement with the real engines: simlab's per-request hits against ``make crosscheck``'s fixtures.

``make crosscheck`` (``crosscheck/README.md``) drives SGLang's and vLLM's own cache managers over
simlab's request sequence and writes, per case, the hit tokens of every request
(``tests/fixtures/crosscheck/*.csv`` and ``manifest.json``). This module replays the same case in
simlab (``engine=replay``, the case's trace, model and capacity) and reports the share of requests
whose hit tokens are identical. CI checks it without installing the engines. ``--engine timed``
runs the timed engine at low load instead (the replay's arrivals slowed down 10^6 times, so
requests come in the replay's order, one at a time).

    python -m simlab.crosscheck                       # the engine-faithful policies, every case
    python -m simlab.crosscheck --policy sglang_plus  # another policy on the same cases
    python -m simlab.crosscheck --engine timed        # the timed engine at low load
    python -m simlab.crosscheck geometry              # vLLM's forced block per bundled hybrid
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "crosscheck"
#: simlab's engine-faithful policy for each engine of the fixtures
FAITHFUL = {"sglang": "sglang", "vllm": "vllm"}
#: where a block-paged policy takes the fixture's block size
BLOCK_KEYS = {"vllm": "policy.block_size", "vllm_plus": "policy.admission.block_size"}
#: the faithful policies' SSM dtype setting
DTYPE_KEYS = {"sglang": "policy.mamba_ssm_dtype", "vllm": "policy.mamba_ssm_cache_dtype"}
#: the engines a case can be replayed on: their overrides (the timed one at low load: the default
#: arrivals' session rate, think times and a trace's timestamps scaled by 10^6, so the order is
#: the replay's; a budget past the longest prompt, so that each prompt is prefilled in one
#: extend as the fixtures' drivers run it: SGLang's ``extra_buffer`` places its states relative
#: to each extend, :class:`simlab.cache.contract.Tracking`; times from the roofline: one request
#: at a time, the hits do not depend on them, and the measured tables' interpolation took a third
#: of each run)
ENGINES = {
    "replay": ["engine=replay"],
    "timed": [
        "engine=timed",
        "engine.memory_check=false",
        "engine.token_budget=1048576",
        "arrivals.session_rate=0.000001",
        "arrivals.think_time_mean=5000000",
        "arrivals.time_scale=1000000",
        "engine.kernels=roofline",
    ],
}


@dataclass(frozen=True)
class Agreement:
    """One case: how many requests simlab gives exactly the engine's hit tokens."""

    case: str
    policy: str
    requests: int
    identical: int
    engine_hit_rate: float
    simlab_hit_rate: float
    first_difference: int | None  # replay position of the first request that differs

    @property
    def share(self) -> float:
        return self.identical / self.requests if self.requests else 1.0


def load_cases(fixtures: Path = FIXTURES) -> list[dict[str, Any]]:
    """The manifest's cases (empty when there is no manifest)."""
    manifest = fixtures / "manifest.json"
    if not manifest.exists():
        return []
    cases: list[dict[str, Any]] = json.loads(manifest.read_text())["cases"]
    return cases


def overrides_for(
    case: dict[str, Any], policy: str | None = None, engine: str = "replay"
) -> list[str]:
    """simlab's overrides that run ``case`` under ``policy`` (default: the faithful one) on
    ``engine`` (:data:`ENGINES`)."""
    name = policy or FAITHFUL[case["engine"]]
    out = [*case["overrides"], f"+policy={name}", *ENGINES[engine], "bounds.enabled=false"]
    out.append(f"cache.size_gb={case['size_gb']}")
    if case.get("ssm_gb") is not None:  # SGLang's separate Mamba pool
        out.append(f"cache.ssm_gb={case['ssm_gb']}")
    strategy = case.get("mamba_strategy")
    if strategy is not None and name == "sglang":  # SGLang's --mamba-radix-cache-strategy
        out.append(f"policy.mamba={strategy}")
    out += fixture_dtype(case, name)
    block = case.get("block_size")
    if case["engine"] == "vllm" and block and name in BLOCK_KEYS:
        out.append(f"{BLOCK_KEYS[name]}={block}")
    if case["engine"] == "vllm" and name == "vllm":  # the budget its scheduler stepped at
        from simlab.engines.block_pool.replay import SCHEDULER_TOKENS  # the drivers' default

        tokens = case.get("max_num_batched_tokens", SCHEDULER_TOKENS)
        out.append(f"policy.admission.max_num_batched_tokens={tokens}")
    if case.get("prefix_match_unit") is not None and name == "vllm":  # --prefix-match-unit
        out.append(f"policy.prefix_match_unit={case['prefix_match_unit']}")
    if "prefix_cache_retention_interval" in case and name == "vllm":
        retention = case["prefix_cache_retention_interval"]
        value = "null" if retention is None else retention
        out.append(f"policy.prefix_cache_retention_interval={value}")
    if case["engine"] == "sglang" and block and block > 1:  # SGLang's --page-size
        out.append(f"cache.page_size={block}")
    return out


def fixture_dtype(case: dict[str, Any], policy: str) -> list[str]:
    """The SSM state's dtype the case's engine ran with (its manifest's ``ssm_dtype``; the
    drivers were sized with simlab's BF16 state otherwise), for the faithful policy, whose own
    default is the engine's default for the model (``engine_defaults``)."""
    key = DTYPE_KEYS.get(policy) if policy == FAITHFUL[case["engine"]] else None
    return [] if key is None else [f"{key}={case.get('ssm_dtype', 'bfloat16')}"]


def composed(overrides: list[str]) -> Any:
    """The run config of ``overrides``: a copy of the first composition of the same overrides
    in this process (the tests compare many cases more than once; composing takes ~0.15 s)."""
    return copy.deepcopy(_compose(tuple(overrides)))


@functools.lru_cache(maxsize=256)
def _compose(overrides: tuple[str, ...]) -> Any:
    from hydra import compose, initialize_config_dir

    configs = Path(__file__).resolve().parents[2] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def simlab_hits(overrides: list[str]) -> pd.DataFrame:
    """Records of a run composed from ``overrides`` (nothing written; without the reuse
    breakdown, whose counterfactual replays the comparison of hits does not read)."""
    from simlab.run.simulate import simulate

    cfg = composed([*overrides, "report=false", "reuse_breakdown=false"])
    cfg.output_dir = None
    records = simulate(cfg).records
    assert records is not None
    return records.reset_index(drop=True)


def compare(
    case: dict[str, Any],
    fixtures: Path = FIXTURES,
    policy: str | None = None,
    engine_name: str = "replay",
) -> Agreement:
    """Run ``case`` in simlab (on ``engine_name``) and count identical per-request hits (same
    request order and lengths are checked first: a trace that changed is an error, not a
    disagreement)."""
    engine = pd.read_csv(fixtures / case["file"])
    ours = simlab_hits(overrides_for(case, policy, engine_name))
    if len(ours) != len(engine) or not np.array_equal(
        ours["request_id"].to_numpy(), engine["request_id"].to_numpy()
    ):
        raise ValueError(f"{case['case']}: simlab's request order differs from the fixture's")
    if not np.array_equal(ours["input_tokens"].to_numpy(), engine["input_len"].to_numpy()):
        raise ValueError(f"{case['case']}: input lengths differ from the fixture's")
    same = ours["hit_tokens"].to_numpy() == engine["hit_tokens"].to_numpy()
    total = float(engine["input_len"].sum())
    first = int(np.argmin(same)) if not same.all() else None
    return Agreement(
        case=case["case"],
        policy=policy or FAITHFUL[case["engine"]],
        requests=len(engine),
        identical=int(same.sum()),
        engine_hit_rate=float(engine["hit_tokens"].sum()) / total,
        simlab_hit_rate=float(ours["hit_tokens"].sum()) / total,
        first_difference=first,
    )


def table(rows: list[Agreement]) -> str:
    frame = pd.DataFrame(
        {
            "case": [r.case for r in rows],
            "policy": [r.policy for r in rows],
            "requests": [r.requests for r in rows],
            "identical": [f"{100 * r.share:.2f}%" for r in rows],
            "engine hit": [f"{r.engine_hit_rate:.4f}" for r in rows],
            "simlab hit": [f"{r.simlab_hit_rate:.4f}" for r in rows],
            "first diff": [r.first_difference for r in rows],
        }
    )
    return frame.to_string(index=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["geometry"]:  # vLLM's hybrid geometry per bundled config
        from simlab.experiments import geometry

        return geometry.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m simlab.crosscheck", description=__doc__)
    parser.add_argument("--fixtures", type=Path, default=FIXTURES)
    parser.add_argument("--policy", default=None, help="compare this policy instead")
    parser.add_argument("--case", action="append", help="only these cases (repeatable)")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="replay")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    cases = selected_cases(args.fixtures, args.case)
    if not cases:
        return 2
    print(table([compare(c, args.fixtures, args.policy, args.engine) for c in cases]))
    return 0


def selected_cases(fixtures: Path, names: list[str] | None) -> list[dict[str, Any]]:
    """The manifest's cases named in ``names`` (all when None); none is said on stderr."""
    cases = [c for c in load_cases(fixtures) if not names or c["case"] in names]
    if not cases:
        print(f"no crosscheck cases in {fixtures} (run `make crosscheck`)", file=sys.stderr)
    return cases


def run_main() -> None:
    """``python -m simlab.crosscheck``."""
    sys.exit(main())


if __name__ == "__main__":
    run_main()
