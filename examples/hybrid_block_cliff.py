"""vLLM's block-size cliff for hybrids (``mamba_cache_mode=align``): hit rate by prompt length.

    python examples/hybrid_block_cliff.py [OVERRIDES...]

Replays ShareGPT through ``+policy=vllm`` with Nemotron-H-8B at infinite capacity (any simlab
override may be added) and prints the token hit rate per prompt-length bin, in multiples of the
block size vLLM computes for the model (1,040 tokens for Nemotron-H-8B with vLLM's default FP32
state, 528 with ``policy.mamba_ssm_cache_dtype=bfloat16``): a prompt of at most one block is
never a hit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from simlab import ModelSpec, simulate

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DEFAULTS = ["+policy=vllm", "model=nemotron_h_8b", "engine=replay", "cache.size_gb=inf"]


def main(overrides: list[str]) -> None:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("config", [*DEFAULTS, *overrides, "report=false", "bounds.enabled=false"])
    cfg.output_dir = None
    admission = instantiate(cfg.policy.admission)
    spec = admission.engine_model(ModelSpec.from_config(cfg.model))  # vLLM's state dtype
    block = admission.for_model(spec).block_size
    records = simulate(cfg).records
    assert records is not None
    edges = [0, block // 2, block, block + block // 2, 2 * block, 3 * block, 4 * block, 1 << 30]
    records["prompt"] = pd.cut(records["input_tokens"], edges)
    table = records.groupby("prompt", observed=True).agg(
        requests=("hit_tokens", "size"), hit=("hit_tokens", "sum"), tokens=("input_tokens", "sum")
    )
    table["token hit rate"] = (table["hit"] / table["tokens"]).round(3)
    print(f"block size {block} tokens ({cfg.model.name})")
    print(table[["requests", "token hit rate"]].to_string())


if __name__ == "__main__":
    main(sys.argv[1:])
