"""The measured serving points ``python -m simlab.validate silicon`` replays
(``silicon_sample.csv`` in aiconfigurator-core: NVIDIA's end-to-end measurements), and one
point's replay in the timed engine.

Each point (one model on one GPU type with one engine and version, its tensor-parallel degree,
concurrency ``C`` and input / output lengths) is replayed in the timed engine the way it was
measured: InferenceX's client (``benchmark_serving.py --dataset-name random
--random-range-ratio 0.8 --num-prompts 10*C --max-concurrency C --request-rate inf
--ignore-eos``, the protocol aiconfigurator's own replay of these points states) sends
:data:`PROMPTS_PER_SLOT` x ``C`` requests of fresh random tokens (no prefix reuse), input and
output lengths drawn uniformly from ``[int(0.8 isl), isl]`` and ``[int(0.8 osl), osl]``, all
ready at time 0 with at most ``C`` in flight (:class:`~simlab.engines.timed.feeders.ConcurrencyFeeder`),
on measured kernels of that GPU, backend and version (the closest measured: :func:`version_for`),
with its server's flags (InferenceX's launch script: :mod:`simlab.experiments.silicon_recipes`),
its requests admitted against its KV pool as its engine sizes and fills it
(:mod:`simlab.experiments.silicon_memory`).
The mean TTFT and TPOT of every request, the opening burst included as the benchmark includes
it, are compared with the point's.

Only what no kernel measures is fitted, per backend (:mod:`simlab.experiments.silicon_fit`):
the engine's CPU time per iteration and a fixed time per request on its TTFT. Each point is
simulated at two iteration overheads (0 and :data:`PROBE_S`). The command line, with its
resumable, parallel replay, is :mod:`simlab.experiments.silicon_run`.

Covered: InferenceX's points served aggregated (``mode=agg``), without pipeline or data
parallelism or expert parallelism, at BF16 or FP8, of models :mod:`simlab.model.hf` reads from
the configs the package ships; the rest (FP4 and INT4 among them, and NVIDIA's own runs:
:data:`NVIDIA_RUNS`) are counted by reason.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir

from simlab.cost.measured import tables
from simlab.cost.shapes import check_ep, check_tp, on_tp
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.feeders import ConcurrencyFeeder
from simlab.engines.timed.pool_sizing import KvPool, aic_model, shipped_config
from simlab.experiments.silicon_memory import admission, kv_pool
from simlab.experiments.silicon_recipes import recipe, script_expert_parallel, speculative
from simlab.model.hf import model_spec
from simlab.model.spec import ModelSpec
from simlab.run.plan import plan_run
from simlab.run.policy import policy_step
from simlab.run.routes import TIMED_ROUTES, Case, choose
from traces.format import Request

log = logging.getLogger(__name__)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

#: the benchmark's prompts per unit of concurrency (``--num-prompts 10*C``)
PROMPTS_PER_SLOT = 10
#: the benchmark's ``--random-range-ratio``: lengths drawn from ``[int(r * len), len]``
RANGE_RATIO = 0.8
#: the second overhead each point is simulated at (seconds per iteration)
PROBE_S = 0.01
#: the table's GPU -> simlab's hardware preset
PRESETS = {
    "h100_sxm": "h100_sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200_sxm",
    "b300_sxm": "b300_sxm",
    "gb200": "gb200",
}
DTYPE_BYTES = {"bf16": 2, "fp8": 1}
#: NVIDIA's own aggregated runs (their ``silicon_data_source`` names its "aic-auto-gap-analysis"
#: files): they name neither their client nor their server's flags, and give no attention-DP
#: degree and some no precision. The client decides their TTFT: at fixed lengths (the
#: benchmark aiconfigurator generates, ``aiperf --isl-stddev 0 --osl-stddev 0``) a closed loop
#: prefills each wave of ``C`` prompts together, at InferenceX's spread lengths the waves come
#: apart, and the two put a point's TTFT several times apart. They are counted, not replayed.
NVIDIA_RUNS = "aic-auto-gap-analysis"
NVIDIA_REASON = "NVIDIA's own run: its client and server flags are not published"
#: a point whose server's flags no InferenceX launch script read here gives
#: (:func:`~simlab.experiments.silicon_recipes.recipe`'s fallback) is counted, not replayed
NO_SCRIPT = "none"
NO_SCRIPT_REASON = "no InferenceX launch script read for it"
#: the GPUs of one node: rows of more (GB200 racks at TP 12 to 72; rows whose tp is the MoE
#: TP x EP of 16 or 64 GPUs, which no single-node script runs) are counted, not replayed
GPUS_PER_NODE = 8


def config_path(model_path: str) -> Path | None:
    """The model's Hugging Face ``config.json`` as aiconfigurator-core ships it (None: not
    shipped)."""
    return shipped_config(aic_model(model_path))


@functools.lru_cache(maxsize=64)
def spec_of(model_path: str, dtype_bytes: int, kv_dtype_bytes: int = 0) -> ModelSpec | None:
    """The model's :class:`ModelSpec` from its config (:mod:`simlab.model.hf`; None: no config
    shipped, or an architecture simlab.model does not read), its KV cache in
    ``kv_dtype_bytes`` (0: the model's)."""
    path = config_path(model_path)
    if path is None:
        return None
    try:
        return model_spec(model_path, path, dtype_bytes=dtype_bytes, kv_dtype_bytes=kv_dtype_bytes)
    except ValueError as err:
        log.info("%s: %s", model_path, err)
        return None


@dataclass(frozen=True)
class Point:
    """One measured serving point."""

    id: str
    model: str
    system: str
    backend: str
    version: str
    precision: str
    tp: int
    concurrency: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    measured: str = ""  # the measurement date (YYYY-MM-DD) the csv gives, else ''
    gemm_quant: str = ""  # the csv's gemm_quant_mode and moe_quant_mode ('' where none)
    moe_quant: str = ""
    ep: int = 1  # the MoE's expert-parallel degree within the tp GPUs (MoE TP = tp / ep)


def points(csv: Path) -> tuple[list[Point], dict[str, int]]:
    """The covered points of ``csv`` and the count of each reason a point was left out."""
    frame = pd.read_csv(csv)
    out: list[Point] = []
    skipped: dict[str, int] = {}
    for row in frame.itertuples(index=False):
        why = _uncovered(row)
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        source = str(row.silicon_data_source)
        concurrency = int(source.split("silicon_concurrency=")[1].split(";")[0])
        measured = _measured(source)
        out.append(
            Point(
                str(row.id),
                str(row.model_path),
                str(row.system),
                str(row.backend),
                str(row.backend_version),
                str(row.precision),
                int(row.tp_size),
                concurrency,
                int(row.isl),
                int(row.osl),
                float(row.silicon_ttft_ms),
                float(row.silicon_tpot_ms),
                measured,
                _mode(row.gemm_quant_mode),
                _mode(row.moe_quant_mode),
                _expert_parallel(row),
            )
        )
        if recipe(out[-1]).source.startswith(NO_SCRIPT):
            out.pop()
            skipped[NO_SCRIPT_REASON] = skipped.get(NO_SCRIPT_REASON, 0) + 1
    return out, skipped


def _measured(source: str) -> str:
    """The measurement date (YYYY-MM-DD) a row's ``silicon_data_source`` gives, else ''."""
    return source.split("measured=")[1][:10] if "measured=" in source else ""


def _mode(value: Any) -> str:
    return "" if pd.isna(value) else str(value)


def _expert_parallel(row: Any) -> int:
    """The row's expert-parallel degree: the csv's, or ``tp`` where its launch script enabled
    expert parallelism at the csv's EP 1 (:func:`script_expert_parallel`: vLLM's
    ``--enable-expert-parallel`` splits the experts over all ``tp`` GPUs)."""
    source = str(row.silicon_data_source)
    if script_expert_parallel(str(row.model_path), str(row.system), _measured(source)):
        return int(row.tp_size)
    return int(row.moe_ep_size)


def _uncovered(row: Any) -> str:
    """Why a row is not replayed ('' if it is)."""
    checks = (
        (row.mode != "agg", "disaggregated"),
        (NVIDIA_RUNS in str(row.silicon_data_source), NVIDIA_REASON),
        (row.pp_size != 1 or row.attention_dp_size != 1, "pipeline or attention data parallel"),
        (row.tp_size > GPUS_PER_NODE, f"tensor parallel over more than {GPUS_PER_NODE} GPUs"),
        (row.moe_tp_size * row.moe_ep_size != row.tp_size, "MoE TP x EP is not the tp"),
        (row.precision not in DTYPE_BYTES, f"precision {row.precision}"),
        (row.system not in PRESETS, f"GPU {row.system} has no preset"),
        ("silicon_concurrency=" not in str(row.silicon_data_source), "no concurrency"),
        (
            speculative(
                str(row.model_path),
                str(row.system),
                str(row.backend),
                str(row.precision),
                str(row.silicon_data_source),
            ),
            "speculative decoding (an InferenceX MTP config's run)",
        ),
    )
    for bad, why in checks:
        if bad:
            return why
    spec = spec_of(str(row.model_path), DTYPE_BYTES[row.precision])
    if spec is None:
        return "architecture simlab.model cannot describe"
    try:
        check_tp(spec, int(row.tp_size))
        check_ep(spec, int(row.tp_size), _expert_parallel(row))
    except ValueError:
        return "tensor or expert parallelism the engines reject"
    return ""


def version_for(point: Point) -> str | None:
    """The measured version of the point's backend closest to the one it ran (the csv's, else
    its workflow's image, :attr:`Recipe.image_version`): the newest at or below it, else the
    oldest above. Development builds (``.dev``) have no place in that order and are not
    picked; a version that is not a number (SGLang's nightly builds) takes the newest."""
    have = [v for v in tables.versions(point.system, point.backend) if ".dev" not in v]
    ran = point.version if point.version[:1].isdigit() else recipe(point).image_version
    if not have or ran is None:
        return have[-1] if have else None
    below = [v for v in have if tables.version_key(v) <= tables.version_key(ran)]
    return below[-1] if below else have[0]


def requests_of(point: Point, seed: int = 0) -> list[Request]:
    """The benchmark's prompts: :data:`PROMPTS_PER_SLOT` x ``concurrency`` requests of fresh
    random tokens, each its own session, input and output lengths drawn uniformly from
    ``[int(RANGE_RATIO * len), len]`` (the client's ``sample_random_requests``)."""
    rng = np.random.default_rng(seed)
    n = PROMPTS_PER_SLOT * point.concurrency
    isl = rng.integers(int(RANGE_RATIO * point.isl), point.isl + 1, n)
    osl = rng.integers(int(RANGE_RATIO * point.osl), point.osl + 1, n)
    return [
        Request(
            request_id=i,
            session_id=i,
            turn=0,
            arrival=0.0,
            input_ids=rng.integers(1, 2**31 - 1, int(isl[i]), dtype=np.int64),
            output_ids=np.zeros(0, dtype=np.int64),
            output_len=int(osl[i]),
        )
        for i in range(n)
    ]


def pool_of(point: Point) -> KvPool | None:
    """The point's KV pool as its engine sizes it (:mod:`simlab.experiments.silicon_memory`;
    None: aiconfigurator-core's memory model cannot size it)."""
    server = recipe(point)
    spec = spec_of(point.model, DTYPE_BYTES[point.precision], server.kv_dtype_bytes)
    assert spec is not None  # points() keeps only describable models
    return kv_pool(point, server, version_for(point), on_tp(spec, point.tp))


#: a point whose pool cannot be sized runs with memory unconstrained (no request ever waits
#: for memory); its row's ``kv_pool`` is null
UNCONSTRAINED = ["+policy=fifo", "engine.running_memory_gb=100000", "cache.size_gb=1"]


def simulate(point: Point, overhead_s: float) -> tuple[float, float]:
    """The point's mean TTFT and TPOT (ms) in the timed engine at ``overhead_s`` per iteration,
    its requests admitted against its KV pool the engine's way (no prefix is reused: the
    policy decides nothing else)."""
    server = recipe(point)
    spec = spec_of(point.model, DTYPE_BYTES[point.precision], server.kv_dtype_bytes)
    assert spec is not None  # points() keeps only describable models
    pool = pool_of(point)
    memory = UNCONSTRAINED if pool is None else admission(point.backend, pool.gb)
    overrides = [
        f"hardware={PRESETS[point.system]}",
        *memory,
        f"engine.tp={point.tp}",
        f"engine.backend={point.backend}",
        f"engine.backend_version={version_for(point)}",
        *server.overrides(point.concurrency),  # the server's flags
        f"engine.batching={'prefill_first' if point.backend == 'sglang' else 'mixed'}",
        f"engine.costs.iteration_overhead_s={overhead_s}",
        "engine.memory_check=false",  # the pool is sized from the GPU's memory already
        "report=false",
    ]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    plan = plan_run(cfg)
    (policy,) = plan.policies.values()
    assert isinstance(plan.engine, TimedEngine)
    # the experts' split is set here, not by override: the plan holds the default model
    engine = replace(plan.engine, ep=point.ep)
    requests = requests_of(point)
    step = policy_step(policy, on_tp(spec, point.tp), plan.settings)  # the replica's KV bytes
    route = choose(Case(step, engine, requests))  # policy=vllm: vLLM's block pool
    assert route.taken in TIMED_ROUTES
    feeder = ConcurrencyFeeder(requests, point.concurrency)
    records = engine.world(requests, step).run(feeder)
    ttft = np.mean([r.ttft for r in records])
    tpot = np.mean([r.tpot for r in records if r.tpot == r.tpot])
    return 1e3 * float(ttft), 1e3 * float(tpot)


def sample(pts: list[Point], per_group: int | None) -> list[Point]:
    """At most ``per_group`` points per model x GPU x engine, spread over its concurrencies and
    lengths (in the table's order; None: all)."""
    if per_group is None:
        return pts
    groups: dict[tuple[str, str, str], list[Point]] = {}
    for p in pts:
        groups.setdefault((p.model, p.system, p.backend), []).append(p)
    out = []
    for members in groups.values():
        ordered = sorted(members, key=lambda p: (p.isl, p.osl, p.concurrency, p.tp, p.id))
        idx = np.unique(np.linspace(0, len(ordered) - 1, min(per_group, len(ordered))).round())
        out += [ordered[int(i)] for i in idx]
    return out
