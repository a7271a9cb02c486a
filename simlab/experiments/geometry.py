"""vLLM's hybrid geometry for every bundled hybrid ``config.json``: simlab's computation beside
vLLM's own (``tests/fixtures/crosscheck/geometry.json``, written by ``make crosscheck-geometry``
with vLLM 0.33.0's code on the CPU).

    python -m simlab.crosscheck geometry            # the table (markdown), exit 1 on a mismatch

simlab reads each config as ``model=hf`` does (:func:`simlab.model.hf.model_spec`) and asks
``+policy=vllm``'s and ``+policy=sglang``'s admissions, built from their configs as a run builds
them, what they make of it (:func:`simlab_geometry`): the engine's state dtype, its pages and
the block vLLM forces (and on Hopper, where vLLM prefills GDN layers with FlashInfer's kernel
and its 64-token checkpoint alignment, the block ``+policy=vllm hardware=h100_sxm`` forces). The
configs come from aiconfigurator-core; without it the table says "not read".
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from simlab.cache.contract import AdmissionPolicy
from simlab.model.hf import model_spec
from simlab.model.spec import ModelSpec

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "crosscheck" / "geometry.json"
CONFIGS = ROOT / "configs" / "admission"
#: Hopper's compute capability: vLLM prefills GDN layers with FlashInfer's kernel there
HOPPER = 9.0
#: the values compared, simlab's against the fixture's
COMPARED = (
    "block_size",
    "block_size_hopper",
    "state_page_bytes",
    "state_bytes",
    "kv_bytes_per_token",
    "ssm_dtype",
    "sglang_state_bytes",
)


def admissions() -> tuple[AdmissionPolicy, AdmissionPolicy]:
    """``+policy=vllm``'s and ``+policy=sglang``'s admissions at their defaults, built from
    their configs as a run builds them."""
    from hydra.utils import instantiate

    def load(name: str) -> AdmissionPolicy:
        admission: AdmissionPolicy = instantiate(OmegaConf.load(CONFIGS / f"{name}.yaml"))
        return admission

    return load("vllm"), load("sglang")


def simlab_geometry(
    model: ModelSpec, vllm: AdmissionPolicy, sglang: AdmissionPolicy
) -> dict[str, Any]:
    """simlab's values (:data:`COMPARED`) for ``model``, from the policies' own hooks: the
    engine's state dtype (``engine_model``), the forced block (``for_model``) and the pages
    (``geometry``); for a GDN model also on Hopper (``compute_capability`` 9.0)."""
    engine = vllm.engine_model(model)
    geo = vllm.for_model(engine).geometry(engine, 1, None)
    sglang_engine = sglang.engine_model(model)
    out = {
        "ssm_dtype": geo["ssm_state_dtype"],
        "state_page_bytes": geo["state_page_bytes"],
        "state_bytes": geo["state_bytes"],
        "kv_bytes_per_token": engine.kv_bytes_per_token,
        "block_size": geo["block_size"],
        "sglang_state_bytes": sglang.geometry(sglang_engine, 1, None)["state_bytes"],
    }
    if model.ssm_kind == "gdn":
        hopper = dataclasses.replace(vllm, compute_capability=HOPPER)  # type: ignore[type-var]
        out["block_size_hopper"] = hopper.for_model(engine).geometry(engine, 1, None)["block_size"]
    return out


def model_id(config: str) -> str:
    """``org/name`` of a bundled ``org--name_config.json``."""
    return config.removesuffix("_config.json").replace("--", "/", 1)


def rows(fixture: Path = FIXTURE) -> list[dict[str, Any]]:
    """Per hybrid of the fixture: vLLM's values, simlab's (None where ``model=hf`` cannot read
    the config: aiconfigurator-core missing), and whether they agree."""
    vllm, sglang = admissions()
    out = []
    for engine in json.loads(fixture.read_text())["models"]:
        engine = engine | {"ssm_dtype": engine["state_dtypes"][-1]}
        try:
            spec = model_spec(model_id(engine["config"]))
        except ValueError as err:
            log.warning("%s", err)
            ours = None
        else:
            ours = simlab_geometry(spec, vllm, sglang)
        same = ours is not None and all(ours.get(k) == engine.get(k) for k in COMPARED)
        out.append({"config": engine["config"], "vllm": engine, "simlab": ours, "agree": same})
    return out


def table(found: list[dict[str, Any]]) -> str:
    """The docs' table: one row per bundled hybrid, vLLM's numbers (simlab's where they
    differ, after a slash)."""
    head = (
        "| model | layers (attn + recurrent) | SSM dtype | state MB / request (vLLM, SGLang) | "
        "KV bytes / token | vLLM block | on Hopper | simlab |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for row in found:
        v, ours = row["vllm"], row["simlab"] or {}

        def cell(
            key: str, v: dict[str, Any] = v, ours: dict[str, Any] = ours, scale: float = 1
        ) -> str:
            value, mine = v.get(key, ""), ours.get(key)
            shown = f"{value / scale:.1f}" if scale != 1 and value != "" else f"{value}"
            return shown if mine is None or mine == value else f"{shown} / {mine}"

        name = model_id(row["config"])
        layers_cell = f"{v['attention_layers']} + {v['recurrent_layers']}"
        state = f"{v['state_bytes'] / 1e6:.1f}, {cell('sglang_state_bytes', scale=1e6)}"
        verdict = "agrees" if row["agree"] else ("not read" if not ours else "differs")
        lines.append(
            f"| {name} | {layers_cell} | {cell('ssm_dtype')} | {state} | "
            f"{cell('kv_bytes_per_token')} | {cell('block_size')} | "
            f"{cell('block_size_hopper') or '='} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 1 when simlab disagrees with vLLM on a model."""
    logging.basicConfig(level=logging.WARNING)
    fixture = Path(argv[0]) if argv else FIXTURE
    found = rows(fixture)
    print(table(found))
    return 0 if all(r["agree"] for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
