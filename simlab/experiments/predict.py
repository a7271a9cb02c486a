"""``python -m simlab.predict``: how long a prefill takes, from the timed engine's cost model.

    python -m simlab.predict model=nemotron_h_8b hardware=h100_sxm engine.tp=2 'prefill=[1000,10000]'
    python -m simlab.predict prefix=8000 'prefill=[500]'     # a prefix hit: 500 new tokens

For each length in ``prefill`` it prints the predicted time of ``batch`` identical requests
that arrive together, alone on the GPU, each with ``prefix`` tokens cached, until the last one's
first token, and the ops that take most of it. The timed engine prefills them in iterations of
at most ``engine.token_budget`` tokens (chunked prefill: the requests in order, logits only in
a prompt's last chunk, a request whose prefill ended decoding meanwhile unless
``engine.batching=prefill_first``; :func:`prefill_iterations`), so a prompt longer than the
budget takes several iterations, each reading the weights again and attending to the chunks
before it (vLLM V1 on an A100 chunks at 8,192 tokens for ``LLM`` and 2,048 for its server).
With SGLang's admission on the shared pool (``engine.request_admission=sglang
engine.kv_pool=shared``) the requests start pass by pass as its ``PrefillAdder`` admits them,
each pass ending once ``engine.max_prefill_tokens`` is spent (with
``engine.token_budget=null`` a prompt reaching what is left of it waits for the next pass).
It writes ``prediction.json`` (atomically) into the run directory: ``prefill_tokens``,
``prefill_ms``, ``iterations`` (per length), ``breakdown_ms`` (op name -> one time per
length, summed over the iterations), the scheduling (``token_budget``, ``batching``,
``admission_passes``, ``max_prefill_tokens``), and the model, hardware, tensor-parallel
degree and calibration used (the hardware preset's own by default, ``engine.calibration=null``
for the default efficiencies) with its held-back error;
``measured_ops``: the ops timed from the calibration's measurements of their shape
(``engine.profiles=false``: none) with those measurements' own held-back error;
``measured_share``: per length, the share of the predicted time those ops make up. The
breakdown holds the ``engine.costs`` terms when charged (``engine_overhead``, ``moe_dispatch``).
The timed engine times its iterations with exactly this model
(:class:`simlab.cost.model.CostModel`).

``measured.path=FILE`` checks the model against measured prefill times (a TTFT table; columns
and units in :mod:`simlab.experiments.measured`): each row is predicted as ``prefill=[its new tokens]
prefix=[its cached prefix] engine.tp=[its degree]`` predicts it, and ``prediction.json``'s
``measured`` holds the rows and the error (MAPE, median and P90 ``|predicted / measured - 1|``,
the median ratio), over all rows and per band of prompt length, which the command prints too.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from simlab.config import ConfigError
from simlab.cost.measured.sources import SOURCES, shares
from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.settings import TimedSettings
from simlab.experiments import measured as measured_table
from simlab.experiments.breakdown import kernels_used, op_sources, summed, unmeasured_ranges
from simlab.model import layers
from simlab.model.spec import ModelSpec
from simlab.run.cli import reported_as_one_line, unknown_choice
from simlab.run.simulate import build_engine
from traces.atomic import atomic_path

log = logging.getLogger(__name__)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

TOP_OPS = 4  # ops named per length in the printed table
#: the scheduling settings a prefill's time depends on (compared with the engine's defaults)
PREFILL_KEYS = ("token_budget", "batching")


def lengths(cfg: DictConfig) -> tuple[list[int], int, int]:
    """``prefill``, ``prefix`` and ``batch``, checked (:class:`ConfigError` naming the key)."""
    prefill = cfg.get("prefill")
    if isinstance(prefill, int) and not isinstance(prefill, bool):
        prefill = [prefill]
    if not prefill or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in prefill
    ):
        raise ConfigError(f"prefill: must be a list of token counts > 0 (got {prefill!r})")
    prefix, batch = cfg.get("prefix", 0), cfg.get("batch", 1)
    if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
        raise ConfigError(f"prefix: must be an integer >= 0 (got {prefix!r})")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch: must be an integer >= 1 (got {batch!r})")
    return [int(n) for n in prefill], prefix, batch


def timed_engine(cfg: DictConfig) -> tuple[TimedEngine, CostModel]:
    """The configured timed engine and its cost model for the configured model (hardware,
    tp, calibration)."""
    try:
        model = ModelSpec.from_config(cfg.model)
    except ValueError as err:
        raise ConfigError(f"model: {err}") from err
    engine = build_engine(cfg)
    if not isinstance(engine, TimedEngine):
        raise ConfigError("engine: simlab.experiments.predict needs a timed engine (engine=timed)")
    model = engine.held(model)  # replicated KV heads; a tp the engines reject is an error
    weights = layers.weight_bytes(model) / 1e9  # at the checkpoint's format
    if weights > engine.hardware.mem_gb * engine.tp:
        log.warning(
            "%s's %.1f GB of weights exceed %g GB (%s x tp %d): no engine could serve this",
            model.name,
            weights,
            engine.hardware.mem_gb * engine.tp,
            engine.hardware.name,
            engine.tp,
        )
    return engine, engine.cost_model(model)


@dataclass(frozen=True)
class Scheduling:
    """How the timed engine batches prefill chunks (its settings, :class:`TimedSettings`).

    ``budget``: tokens per iteration (``engine.token_budget``; inf: chunked prefill off);
    ``prefill_first``: a step that prefills runs no decodes (``engine.batching``);
    ``passes``: SGLang's admission pass decides each step's new chunks
    (``engine.request_admission=sglang`` on the shared KV pool, where the engine runs it);
    ``cap``: what one pass may prefill (``engine.max_prefill_tokens``; inf: no cap)."""

    budget: float
    prefill_first: bool
    passes: bool
    cap: float

    @classmethod
    def of(cls, engine: TimedSettings) -> Scheduling:
        passes = engine.kv_pool == "shared" and engine.request_admission == "sglang"
        return cls(
            budget=math.inf if engine.token_budget is None else engine.token_budget,
            prefill_first=engine.batching == "prefill_first",
            passes=passes,
            cap=math.inf
            if engine.max_prefill_tokens is None or not passes
            else engine.max_prefill_tokens,
        )


def prefill_iterations(
    prefix: int, new: int, batch: int, scheduling: Scheduling, hybrid: bool
) -> list[BatchShape]:
    """The iterations in which the timed engine prefills ``batch`` identical requests of
    ``new`` uncached tokens after a cached ``prefix``, arrived together and alone on the GPU
    (memory to spare), up to the last one's first token. As in ``TimedWorld._iteration``: a
    request whose prefill ended decodes one token per later iteration (continuous batching;
    with ``prefill_first`` only in an iteration without chunks), and the others get chunks,
    in order, that fill the rest of the budget. Whole admission starts every request at once;
    SGLang's pass (:func:`_admission_pass`) admits them step by step. A hybrid loads a
    request's checkpoint in its first chunk when it has a prefix; decodes and chunks that end
    their prompt sample. Invariant: the chunks of each request cover its ``new`` tokens once,
    in order."""
    done = [0] * batch  # tokens prefilled per request
    decoded = [0] * batch  # tokens decoded since its prefill ended
    held = [0 if scheduling.passes else new] * batch  # tokens it may prefill so far
    started = 0 if scheduling.passes else batch
    iterations = []
    while done[-1] < new:
        decoders = [i for i in range(started) if done[i] == new]
        mixed = 0 if scheduling.prefill_first else len(decoders)
        if scheduling.passes:
            started = _admission_pass(held, started, new, scheduling, mixed)
        left, chunks, loads, sampled = scheduling.budget - mixed, [], 0, 0
        for i in range(started):
            take = min(left, held[i] - done[i])
            if take > 0:
                chunks.append((prefix + done[i], int(take)))
                loads += int(hybrid and prefix > 0 and done[i] == 0)
                sampled += int(done[i] + take == new)
                done[i] += int(take)
                left -= take
        if chunks and scheduling.prefill_first:
            decoders = []
        decode = [prefix + new + decoded[i] + 1 for i in decoders]
        for i in decoders:
            decoded[i] += 1
        iterations.append(
            BatchShape(
                prefill=chunks, decode=decode, state_loads=loads, sampled=sampled + len(decoders)
            )
        )
    return iterations


def _admission_pass(
    held: list[int], started: int, new: int, scheduling: Scheduling, mixed: int
) -> int:
    """SGLang's admission pass before a step (``Admission.schedule`` with
    memory to spare and one-token pages): the prompt the budget cut takes its next chunk
    first, then queued requests are admitted in order while the step's token budget (less
    ``mixed``, the decodes riding it) and the cap (``rem_input_tokens``) both have room, the
    last one cut by the budget; without chunked prefill a request whose extend reaches what
    is left of the cap waits, unless it is the pass's first. Grows ``held``; returns the
    requests started."""
    room = scheduling.budget - mixed
    spent = 0.0
    for i in range(started):  # the chunked request (``add_chunked_req``)
        take = min(new - held[i], room)
        if take > 0:
            held[i] += int(take)
            room -= take
            spent += take
    inputs = scheduling.cap - mixed - spent
    first = started
    while started < len(held) and min(room, inputs) > 0:
        if started > first and math.isinf(scheduling.budget) and not new < inputs:
            break
        take = min(new, room)
        held[started] = int(take)
        room -= take
        inputs -= take
        started += 1
    return started


def predict(cfg: DictConfig) -> dict[str, Any]:
    """The prediction as ``prediction.json`` holds it (see the module docstring)."""
    prefill, prefix, batch = lengths(cfg)
    engine, cost = timed_engine(cfg)
    if batch > engine.running_cap:
        raise ConfigError(
            f"batch: {batch} requests exceed engine.max_running={engine.max_running} (the "
            "others would wait for outputs simlab.experiments.predict does not model)"
        )
    rows = measured_table.load(cfg, prefix, engine.tp)  # checked before any prediction
    models = None if rows is None else models_by_tp(cfg, rows, (engine, cost))
    scheduling = Scheduling.of(engine)
    off_defaults = engine.defaults_caveat(PREFILL_KEYS)
    if off_defaults:
        log.warning("%s", off_defaults)
    runs = [prefill_iterations(prefix, n, batch, scheduling, cost.model.is_hybrid) for n in prefill]
    breakdowns = [summed(cost.breakdown(shape) for shape in run) for run in runs]
    totals = [prefill_seconds(cost, run) for run in runs]
    measured = [
        sum(cost.measured_share(shape) * cost.time(shape) for shape in run) / total
        for run, total in zip(runs, totals, strict=True)
    ]
    # before the kernels: a bound may lend a kernel (kernels.delta_rule_lent)
    unmeasured = unmeasured_ranges(cost, runs, totals)
    return {
        "model": cost.model.name,
        "hardware": cost.hw.name,
        "tp": cost.tp,
        "ep": cost.ep,
        "calibration": cfg.engine.get("calibration") or "default efficiencies (uncalibrated)",
        # the calibration's own held-back error per op class ({} when uncalibrated)
        "calibration_held_back_error": cost.calibration.held_back_error,
        # ops timed from measured times of their shape (calibration profiles), and their error
        "measured_ops": sorted(
            {
                op.name
                for run in runs
                for shape in run
                for op in cost.ops(shape)
                if cost.measured(op)
            }
        ),
        "measured_held_back_error": cost.calibration.profiled_held_back_error,
        "prefix_tokens": prefix,
        "batch": batch,
        "token_budget": cfg.engine.token_budget,  # null: chunked prefill off
        "batching": engine.batching,
        # where those differ from engine.backend's own defaults on the GPU (null: they agree)
        "engine_defaults": off_defaults,
        # SGLang's admission pass (request_admission=sglang, kv_pool=shared) and its cap
        "admission_passes": scheduling.passes,
        "max_prefill_tokens": engine.max_prefill_tokens if scheduling.passes else None,
        "prefill_tokens": prefill,
        "prefill_ms": [1000 * total for total in totals],
        "iterations": [len(run) for run in runs],
        "breakdown_ms": {
            op: [1000 * b.get(op, 0.0) for b in breakdowns]
            for op in dict.fromkeys(op for b in breakdowns for op in b)
        },
        # per length: the share of the predicted time that comes from measurements
        "measured_share": measured,
        # the measured kernel tables (null: engine.kernels=roofline or none for the GPU)
        "kernels": kernels_used(cost),
        # per op: its time source per length (simlab.cost.measured.sources; the worst over
        # the iterations), and per length the share of GPU time per source
        "breakdown_sources": op_sources(cost, runs),
        "time_sources": [shares(summed(cost.sources(shape) for shape in run)) for run in runs],
        # the unmeasured ops' modelled ranges (simlab.cost.measured.unmeasured)
        "unmeasured": unmeasured,
        # measured.path: the rows predicted and their error (simlab.experiments.measured.compare)
        "measured": None if rows is None or models is None else checked(rows, batch, models),
    }


def prefill_seconds(cost: CostModel, run: list[BatchShape]) -> float:
    """The predicted time of a prefill's iterations (:func:`prefill_iterations`)."""
    return sum(cost.time(shape) for shape in run)


def models_by_tp(
    cfg: DictConfig,
    table: measured_table.MeasuredTable,
    configured: tuple[TimedEngine, CostModel],
) -> dict[int, tuple[TimedEngine, CostModel]]:
    """The timed engine and cost model at each tensor-parallel degree of ``table`` (a degree
    that does not split the model is a :class:`ConfigError` naming its row)."""
    models = {configured[0].tp: configured}
    for i, tp in enumerate(table.tp.tolist()):
        if tp not in models:
            models[tp] = _at_tp(cfg, tp, f"measured.tp: row {i + 1} of {table.path}")
    return models


def checked(
    table: measured_table.MeasuredTable,
    batch: int,
    models: dict[int, tuple[TimedEngine, CostModel]],
) -> dict[str, Any]:
    """Every row of ``table`` predicted as ``prefill=[its new tokens]`` with its prefix and
    tensor-parallel degree (each distinct row once), compared with its measured time."""
    keys = list(zip(table.tp.tolist(), table.prefix.tolist(), table.new.tolist(), strict=True))
    seconds = {}
    for tp, prefix, new in dict.fromkeys(keys):
        engine, cost = models[tp]
        run = prefill_iterations(prefix, new, batch, Scheduling.of(engine), cost.model.is_hybrid)
        seconds[tp, prefix, new] = prefill_seconds(cost, run)
    return measured_table.compare(np.array([seconds[key] for key in keys]), table)


def _at_tp(cfg: DictConfig, tp: int, where: str) -> tuple[TimedEngine, CostModel]:
    """The timed engine and cost model of ``cfg`` at tensor-parallel degree ``tp``."""
    at_tp = copy.deepcopy(cfg)
    OmegaConf.set_readonly(at_tp, False)
    with open_dict(at_tp):
        at_tp.engine.tp = tp
    try:
        return timed_engine(at_tp)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from err


def kernel_lines(kernels: dict[str, Any]) -> list[str]:
    """The measured tables a prediction read, and where its MoE and weights came from."""
    lines = [
        f"measured kernels: {kernels['system']} {kernels['backend']} {kernels['version']} "
        f"{kernels['dtype']}, KV cache {kernels['kv_cache_dtype']} (tables: "
        + ", ".join(f"{k} {v}" for k, v in kernels["tables"].items())
        + "); the other ops on the calibrated roofline"
    ]
    for shape, version in (kernels.get("moe_versions") or {}).items():
        lines.append(f"fused MoE {shape}: from the {version} table")
    for shape, where in (kernels.get("moe_kernels") or {}).items():
        lines.append(f"fused MoE {shape}: {kernels['moe_kernel']} kernel from {where}")
    for shape, source in (kernels.get("moe_shapes") or {}).items():
        lines.append(f"fused MoE {shape}: not measured, timed from the measured {source}")
    for shape, how in (kernels.get("moe_gating") or {}).items():
        lines.append(f"fused MoE {shape}: {how}")
    for width, source in (kernels.get("head_widths") or {}).items():
        lines.append(f"{width}: not measured, {source} heads scaled by the references")
    return lines + ([kernels["checkpoint"]] if kernels.get("checkpoint") else [])


def table(prediction: dict[str, Any]) -> str:
    """One line per length: the time and the ops that take most of it."""
    ep = prediction.get("ep", 1)
    experts = f" (experts: ep {ep})" if ep > 1 else ""
    lines = [
        f"{prediction['model']} on {prediction['hardware']} x tp {prediction['tp']}{experts}, "
        f"{prediction['calibration']}; prefix {prediction['prefix_tokens']} tokens, "
        f"batch {prediction['batch']}"
    ]
    errors = prediction.get("calibration_held_back_error") or {}
    if errors:
        lines.append(
            "calibration held-back error (median / P90): "
            + ", ".join(
                f"{cls} {100 * e['median']:.1f}% / {100 * e['p90']:.1f}%"
                for cls, e in errors.items()
            )
            + "; classes not listed run on defaults"
        )
    kernels = prediction.get("kernels")
    if kernels:
        lines += kernel_lines(kernels)
    if prediction.get("engine_defaults"):
        lines.append(prediction["engine_defaults"])
    measured = prediction.get("measured_ops") or []
    if measured and not kernels:
        lines.append(
            f"timed from measurements of their shape: {', '.join(measured)} (held back: "
            + ", ".join(
                f"{cls} {100 * e['median']:.1f}% / {100 * e['p90']:.1f}%"
                for cls, e in (prediction.get("measured_held_back_error") or {}).items()
            )
            + ")"
        )
    ops = prediction["breakdown_ms"]
    for i, (n, ms) in enumerate(
        zip(prediction["prefill_tokens"], prediction["prefill_ms"], strict=True)
    ):
        top = sorted(ops, key=lambda op: -ops[op][i])[:TOP_OPS]
        parts = ", ".join(f"{op} {ops[op][i]:.2f}" for op in top)
        share = prediction["measured_share"][i]
        measured_part = f"; {100 * share:.0f}% measured" if measured else ""
        if prediction.get("kernels"):
            time_sources = prediction["time_sources"][i]
            measured_part = "; " + " / ".join(
                f"{100 * time_sources[tag]:.0f}% {tag}" for tag in SOURCES
            )
        unmeasured_ms = (prediction.get("unmeasured") or {}).get("prefill_ms")
        if unmeasured_ms and unmeasured_ms[i][1] > unmeasured_ms[i][0]:
            low, high = unmeasured_ms[i]
            measured_part += f"; {low:.2f}-{high:.2f} ms with the unmeasured ops at their bounds"
        chunks = prediction["iterations"][i]
        chunked = f"; {iterations(chunks, prediction)}" if chunks > 1 else ""
        lines.append(f"prefill {n:>7,} tokens: {ms:9.2f} ms  ({parts} ms{measured_part}{chunked})")
    if prediction.get("measured") is not None:
        lines += measured_table.lines(prediction["measured"])
    return "\n".join(lines)


def iterations(count: int, prediction: dict[str, Any]) -> str:
    """How the engine split the batch's prefill: chunks of the token budget, or passes the
    prefill cap ended (chunked prefill off)."""
    budget, cap = prediction["token_budget"], prediction["max_prefill_tokens"]
    if budget is None:
        return f"{count} iterations, each pass capped at {cap:,} tokens"
    return f"{count} iterations of <= {budget:,} tokens"


def write(prediction: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "prediction.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(prediction, indent=2) + "\n")
    return path


# an absolute path: run through the shim simlab/predict.py, Hydra would resolve a relative one
# against this module's package, where configs/ is not a package
@hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name="predict")
def main(cfg: DictConfig) -> None:
    with reported_as_one_line():
        prediction = predict(cfg)
        path = write(prediction, Path(HydraConfig.get().runtime.output_dir))
    print(table(prediction))
    print(f"prediction: {path}")


def run_main() -> None:
    """``python -m simlab.predict``: an unknown config choice is one error line."""
    problem = unknown_choice(sys.argv[1:])
    if problem is not None:
        print(f"simlab.predict: error: {problem}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    run_main()
