"""Where each lost hit went: every request's input tokens split into parts that sum exactly.

Per request, five *levels* of reuse are computed, each a counterfactual with one more of the
run's constraints than the level above it, from ideal reuse down to the hit:

1. ``ideal``: the longest prefix shared with the input + output of any request that arrived
   before it (the trace's order, which the replays follow; without each output's last token
   where the policy's keys are ``committed``, as the production engines never compute its KV),
   capped at the input less one token (:func:`simlab.run.bounds.infinite_cache_hits`);
2. ``grid``: ``ideal`` rounded down to the policy's block grid (its block or page, in tokens);
3. ``infinite``: the hit of the same policy with an infinite cache (GPU, SSM states, no host
   tier) on the replay engine: instant completion, one cache;
4. ``capacity``: the hit of the same policy at the run's capacity on the replay engine (a
   cluster's: one cache of all its replicas' bytes); the run itself on the replay engine;
5. ``routed``: the hit plus the cluster router's regret (what the best replica offered at
   routing time beyond the chosen one's; the hit itself with one replica).

The parts are the steps between them: ``compulsory`` = input - ideal (never seen before, the
last token included), ``granularity`` = ideal - grid, ``placement`` = grid - infinite (no KV or
state kept at a usable depth), ``capacity`` = infinite - capacity (evicted), ``concurrency`` =
capacity - routed (what the engine's time took: sharers still in flight, memory held by running
requests), ``routing`` = routed - hit, and ``hit``. A level is not monotone in general (a
hybrid's checkpoints depend on what was evicted; chunked prefill under load leaves states replay
does not), so the levels are clamped from the bottom up: the hit is exact, and each level is
raised to at least the one below it (and capped at the input), so every part is >= 0 and they
sum to the input exactly; the tokens raised are reported as ``clamped``. A counterfactual that
cannot run leaves its level equal to the one below (its loss counted in the part above) and is
named in ``uncomputed``: never a silent 0.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from simlab.config import CacheSettings, ConfigError, RunSettings
from simlab.engines.base import Engine, Replicated
from simlab.engines.records import Columns
from simlab.engines.replay import ReplayEngine
from simlab.engines.step import RequestStep
from simlab.model.spec import ModelSpec
from simlab.run.bounds import infinite_cache_hits
from simlab.run.policy import PolicyRun, PolicySpec, policy_step, run_policy
from traces.format import Request

log = logging.getLogger(__name__)

#: the parts of every request's input, in ``summary.json``'s ``reuse_breakdown``
PARTS = ("hit", "compulsory", "granularity", "placement", "capacity", "concurrency", "routing")
#: the levels from ideal reuse down to the hit, and the part each loses to the next
LEVELS = ("ideal", "grid", "infinite", "capacity", "routed")
LOSSES = ("granularity", "placement", "capacity", "concurrency", "routing")
#: the record column of each part but the hit (``hit_tokens``)
COLUMNS = {part: f"{part}_tokens" for part in PARTS[1:]}


@dataclass
class Counterfactuals:
    """What the policies of one trace share across capacities: ideal reuse with and without
    the outputs' last tokens, and each policy's infinite-cache hits (request id -> tokens)."""

    ideal: dict[bool, dict[int, int]] = field(default_factory=dict)
    infinite: dict[str, dict[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    """What a policy's counterfactuals need: the run's model, settings, engine and the trace's
    tokens per id."""

    model: ModelSpec
    settings: RunSettings
    engine: Engine
    unit: int = 1


def add_breakdowns(
    runs: dict[str, PolicyRun],
    specs: dict[str, PolicySpec],
    requests: list[Request],
    setting: Setting,
    shared: Counterfactuals | None = None,
) -> None:
    """Add each policy's parts to its records (``<part>_tokens``, and ``gpu_hit_tokens`` with a
    host tier) and its summary (``reuse_breakdown``, ``reuse_breakdown_notes``)."""
    shared = shared if shared is not None else Counterfactuals()
    for name, run in runs.items():
        levels, notes = policy_levels(run.records, specs[name], requests, setting, shared)
        parts, clamped = attribute(run.records["input_tokens"], run.records["hit_tokens"], levels)
        total = int(np.sum(run.records["input_tokens"]))
        for part in PARTS[1:]:
            run.records[COLUMNS[part]] = parts[part]
        breakdown = {part: _share(parts[part], total) for part in PARTS}
        if "host_hit_tokens" in run.records:
            host = np.asarray(run.records["host_hit_tokens"], dtype=np.int64)
            run.records["gpu_hit_tokens"] = parts["hit"] - host
            breakdown |= {
                "hit_gpu": _share(parts["hit"] - host, total),
                "hit_host": _share(host, total),
            }
        notes["clamped"] = _share(clamped, total)
        run.summary["reuse_breakdown"] = breakdown
        run.summary["reuse_breakdown_notes"] = notes


def _share(tokens: np.ndarray, total: int) -> float:
    return float(np.sum(tokens)) / total if total else 0.0


def attribute(
    inputs: np.ndarray, hits: np.ndarray, levels: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The parts of every request from its levels (:data:`LEVELS`, tokens), clamped from the
    bottom up (module docstring), and the tokens the clamping raised, per request."""
    inputs = np.asarray(inputs, dtype=np.int64)
    below = np.asarray(hits, dtype=np.int64)
    parts = {"hit": below}
    clamped = np.zeros_like(inputs)
    for level, loss in reversed(list(zip(LEVELS, LOSSES, strict=True))):
        raw = np.minimum(np.asarray(levels[level], dtype=np.int64), inputs)
        above = np.maximum(raw, below)
        parts[loss] = above - below
        clamped += above - raw
        below = above
    parts["compulsory"] = inputs - below
    return {part: parts[part] for part in PARTS}, clamped


def policy_levels(
    records: Columns,
    spec: PolicySpec,
    requests: list[Request],
    setting: Setting,
    shared: Counterfactuals,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One policy's :data:`LEVELS` per record (tokens) and the notes of how they were made."""
    ids = [int(i) for i in records["request_id"]]
    hits = np.asarray(records["hit_tokens"], dtype=np.int64)
    step = policy_step(spec, setting.model, setting.settings, setting.unit)
    ideal = _ideal(requests, step.admission.keys.committed, shared)
    grid = grid_tokens(step, setting.unit)
    routed = hits + np.asarray(records.get("routing_regret", np.zeros_like(hits)), dtype=np.int64)
    notes: dict[str, Any] = {"grid_tokens": grid}
    capacity = _capacity_hits(spec, requests, setting, ids, routed, notes)
    infinite = _infinite_hits(spec, requests, setting, shared, ids, capacity, notes)
    levels = {
        "ideal": np.array([ideal[i] for i in ids], dtype=np.int64),
        "grid": np.array([ideal[i] // grid * grid for i in ids], dtype=np.int64),
        "infinite": infinite,
        "capacity": capacity,
        "routed": routed,
    }
    return levels, notes


def grid_tokens(step: RequestStep, unit: int) -> int:
    """The policy's block grid in tokens: its block (a block-keyed policy; the finer grid its
    hits land on, vLLM's ``prefix_match_unit``) or its page."""
    admission = step.admission
    block = admission.hit_grid() or admission.keys.block_size or 1
    return math.lcm(block, step.page_size) * unit


def _ideal(requests: list[Request], committed: bool, shared: Counterfactuals) -> dict[int, int]:
    """Ideal reuse per request id, in arrival order (the requests' order, the replays'), each
    output's last token left out if ``committed`` (shared by the policies alike in it)."""
    if committed not in shared.ideal:
        hits = infinite_cache_hits(requests, committed=committed)
        shared.ideal[committed] = {
            req.request_id: hit for req, hit in zip(requests, hits, strict=True)
        }
    return shared.ideal[committed]


def _capacity_hits(
    spec: PolicySpec,
    requests: list[Request],
    setting: Setting,
    ids: list[int],
    routed: np.ndarray,
    notes: dict[str, Any],
) -> np.ndarray:
    """The ``capacity`` level: the run's own hits on the replay engine (its ``routed`` level),
    else a replay at the run's capacity (a cluster's, pooled)."""
    if isinstance(setting.engine, ReplayEngine):
        return routed
    settings = setting.settings
    if isinstance(setting.engine, Replicated):
        settings = replace(settings, cache=pooled(settings.cache, setting.engine.replicas))
    found = _replay_hits(spec, requests, setting, settings, notes, "concurrency")
    if found is None:
        return routed
    notes["counterfactuals"] = ["replay_at_capacity"]
    return np.array([found[i] for i in ids], dtype=np.int64)


def _infinite_hits(
    spec: PolicySpec,
    requests: list[Request],
    setting: Setting,
    shared: Counterfactuals,
    ids: list[int],
    capacity: np.ndarray,
    notes: dict[str, Any],
) -> np.ndarray:
    """The ``infinite`` level: the policy's hits with an infinite cache on the replay engine
    (shared across capacities); the ``capacity`` level if that cannot run."""
    if spec.name not in shared.infinite:
        cache = replace(
            setting.settings.cache, size_gb=math.inf, ssm_gb=None, host_gb=None, host_bw_gbps=None
        )
        settings = replace(setting.settings, cache=cache)
        found = _replay_hits(spec, requests, setting, settings, notes, "capacity")
        if found is None:
            return capacity
        shared.infinite[spec.name] = found
    notes.setdefault("counterfactuals", []).insert(0, "infinite_cache_replay")
    return np.array([shared.infinite[spec.name][i] for i in ids], dtype=np.int64)


def _replay_hits(
    spec: PolicySpec,
    requests: list[Request],
    setting: Setting,
    settings: RunSettings,
    notes: dict[str, Any],
    part: str,
) -> dict[int, int] | None:
    """Hits per request id of ``spec`` replayed under ``settings``; None (and ``part`` named
    in the notes' ``uncomputed``, counted in the part above it) if that cannot run."""
    size = settings.cache.size_gb
    log.info(
        "%s: reuse breakdown: replaying at cache.size_gb=%s (the %s part)", spec.name, size, part
    )
    try:
        with quiet_counterfactual():
            engine = counterfactual_engine(setting.engine)
            run = run_policy(spec, requests, setting.model, settings, engine, setting.unit)
    except ConfigError as err:
        above = LOSSES[LOSSES.index(part) - 1]
        log.warning("%s: reuse breakdown: %s not computed (in %s): %s", spec.name, part, above, err)
        notes.setdefault("uncomputed", {})[part] = f"counted in {above}: {err}"
        return None
    ids = (int(i) for i in run.records["request_id"])
    return dict(zip(ids, (int(h) for h in run.records["hit_tokens"]), strict=True))


def counterfactual_engine(engine: Engine) -> ReplayEngine:
    """The replay engine of a run's counterfactuals on ``engine``: vLLM's hybrid pool prefills
    as many tokens a step as the run's engine did (a timed engine's ``engine.token_budget``,
    a cluster's replicas'), so the replays differ from the run only where the breakdown says."""
    if isinstance(engine, ReplayEngine):
        return engine
    inner = getattr(engine, "engine", engine)  # a cluster: its replicas' timed engine
    return ReplayEngine(token_budget=getattr(inner, "token_budget", None))


@contextmanager
def quiet_counterfactual() -> Iterator[None]:
    """A counterfactual replay's warnings are about a run the user did not ask for (Marconi's
    alpha never tunes in an infinite cache, which never evicts): only errors pass."""
    loggers = [logging.getLogger(name) for name in ("simlab", "policies")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.ERROR))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def pooled(cache: CacheSettings, replicas: int) -> CacheSettings:
    """One cache holding ``replicas`` caches' bytes (GPU, SSM pool and host tier)."""
    scale = {k: getattr(cache, k) for k in ("size_gb", "ssm_gb", "host_gb")}
    return replace(cache, **{k: v * replicas for k, v in scale.items() if v is not None})
