"""Small seeded workloads and helpers shared by the tests."""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from simlab.cost.hardware import Hardware
from simlab.cost.shapes import BatchShape
from simlab.engines.timed.engine import TimedEngine, time_sources
from simlab.model.spec import ModelSpec
from traces.format import Trace, make_frame

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
GOLDENS = ROOT / "tests" / "goldens"
#: Set to 1 to rewrite the golden files from what the tests measure (after a reviewed change).
UPDATE_GOLDENS_ENV = "SIMLAB_UPDATE_GOLDENS"


def updating_goldens() -> bool:
    """Whether this run rewrites the goldens (``SIMLAB_UPDATE_GOLDENS=1``)."""
    return os.environ.get(UPDATE_GOLDENS_ENV) == "1"


def golden_value(file: str, key: str, measured: int) -> int:
    """The value pinned for ``key`` in ``tests/goldens/<file>`` (a flat JSON object); when
    :func:`updating_goldens`, ``measured`` is pinned first (other keys are kept)."""
    path = GOLDENS / file
    table = json.loads(path.read_text()) if path.is_file() else {}
    if updating_goldens():
        table[key] = measured
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    return table[key]


def model(name: str) -> ModelSpec:
    return ModelSpec.from_config(OmegaConf.load(CONFIGS / "model" / f"{name}.yaml"))


def hardware(name: str) -> Hardware:
    """The ``configs/hardware`` preset ``name``."""
    return Hardware.from_config(
        OmegaConf.to_container(OmegaConf.load(CONFIGS / "hardware" / f"{name}.yaml"))
    )


def timed_prefill_summary(hardware: str, model_name: str, tokens: int = 1000) -> dict:
    """The ``summary.json`` time sources of a timed engine's cost model on the ``hardware``
    and ``model_name`` presets after one prefill of ``tokens``."""
    preset = OmegaConf.to_container(OmegaConf.load(CONFIGS / "hardware" / f"{hardware}.yaml"))
    cost = TimedEngine(hardware=Hardware.from_config(preset)).cost_model(model(model_name))
    cost.time(BatchShape(prefill=[(0, tokens)]))
    return time_sources(cost, "lru")


def chat_trace(
    seed: int = 0,
    sessions: int = 12,
    turns: tuple[int, int] = (2, 6),
    system_prompts: int = 3,
    system_len: int = 300,
    msg_len: tuple[int, int] = (20, 400),
    vocab: int = 500,
) -> Trace:
    """Multi-turn chat sessions: a shared system prompt (one of a few), then user/assistant turns.

    Request k's input is the whole history plus a new user message; its output the reply, so
    input_k + output_k is a prefix of input_{k+1} (the "input and output" reuse), and sessions
    sharing a system prompt give "purely input" reuse. Arrivals interleave sessions.
    """
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, system_len, dtype=np.int32) for _ in range(system_prompts)]
    rows, clock = [], 0.0
    for sid in range(sessions):
        history = prompts[int(rng.integers(system_prompts))]
        t = clock = clock + float(rng.exponential(1.0))
        for turn in range(int(rng.integers(turns[0], turns[1] + 1))):
            user = rng.integers(0, vocab, int(rng.integers(*msg_len)), dtype=np.int32)
            reply = rng.integers(0, vocab, int(rng.integers(*msg_len)), dtype=np.int32)
            prompt = np.concatenate((history, user))
            rows.append(
                dict(
                    session_id=sid,
                    turn=turn,
                    arrival=t,
                    input_ids=prompt,
                    output_ids=reply,
                    output_len=len(reply),
                )
            )
            history = np.concatenate((prompt, reply))
            t += float(rng.exponential(3.0))
    return Trace(name=f"chat_fixture_{seed}", frame=make_frame(rows))


def hot_prefix_trace(
    seed: int = 0,
    requests: int = 120,
    hot_prefixes: int = 3,
    questions: int = 2,
    hot_every: int = 4,
    hot_len: tuple[int, int] = (1000, 1600),
    question_len: tuple[int, int] = (20, 60),
    cold_len: tuple[int, int] = (400, 900),
    output_len: tuple[int, int] = (20, 80),
    vocab: int = 32_000,
) -> Trace:
    """A few hot shared prefixes (documents, system prompts) re-requested at long intervals,
    interleaved with a stream of cold one-off sequences: a workload where recency matters.

    Every ``hot_every``-th request asks one of ``questions`` fixed questions about one of
    ``hot_prefixes`` long prefixes (both picked at random) and gets that question's fixed
    answer (a popular question, answered the same way under greedy decoding); every other
    request is a cold sequence of fresh random tokens, never seen again. One request per
    session, arrivals one apart.

    Why recency matters here: once a hot request has been seen, repeating it admits nothing
    new, so the only trace it leaves in the cache is a hit on its path. A policy that refreshes
    the path on a hit (LRU) keeps a prefix that is re-requested within the time the cold stream
    takes to fill the cache; one that does not (FIFO) evicts it once the cold sequences
    admitted after its first request fill the cache, then pays misses (and, for a hybrid
    model, another request to checkpoint the branch point again) to get it back. A hot request
    that always brought a new question would not tell the two apart: with leaf-only eviction
    the new question's leaf, born at the hit, would protect its prefix under both.
    """
    rng = np.random.default_rng(seed)

    def tokens(bounds: tuple[int, int]) -> np.ndarray:
        return rng.integers(0, vocab, int(rng.integers(*bounds)), dtype=np.int32)

    hot = [
        [
            (np.concatenate((prefix, tokens(question_len))), tokens(output_len))
            for _ in range(questions)
        ]
        for prefix in [tokens(hot_len) for _ in range(hot_prefixes)]
    ]
    rows = []
    for i in range(requests):
        if i % hot_every == hot_every - 1:
            prompt, reply = hot[int(rng.integers(hot_prefixes))][int(rng.integers(questions))]
        else:
            prompt, reply = tokens(cold_len), tokens(output_len)
        rows.append(
            dict(
                session_id=i,
                turn=0,
                arrival=float(i),
                input_ids=prompt,
                output_ids=reply,
                output_len=len(reply),
            )
        )
    return Trace(name=f"hot_prefix_fixture_{seed}", frame=make_frame(rows))


def ideal_hits(trace: Trace) -> list[int]:
    """Brute-force ideal reuse: per request (in arrival order) the longest common prefix with any
    earlier full sequence, capped at input length - 1 (infinite cache, token granularity)."""
    seen: list[np.ndarray] = []
    hits = []
    for req in trace.requests():
        best = 0
        for prev in seen:
            n = min(len(prev), req.input_len)
            diff = np.flatnonzero(prev[:n] != req.input_ids[:n])
            best = max(best, int(diff[0]) if diff.size else n)
        hits.append(min(best, req.input_len - 1))
        seen.append(req.full_sequence())
    return hits


def compose(overrides: list[str] | None = None):
    """The composed run config, as `python -m simlab OVERRIDES` would see it: a copy of the
    first composition of the same overrides in this process (the config files do not change
    while the tests run; composing takes ~0.15 s, a copy ~4 ms, and the suite composes the
    same overrides hundreds of times)."""
    return copy.deepcopy(_composed(tuple(overrides or ())))


@functools.lru_cache(maxsize=512)
def _composed(overrides: tuple[str, ...]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def policy_plugins(name: str, overrides: list[str] | None = None):
    """(admission, eviction) instances of a named policy config."""
    from hydra.utils import instantiate

    cfg = compose([f"+policy={name}", *(overrides or [])])
    return instantiate(cfg.policy.admission), instantiate(cfg.policy.eviction)


POLICIES = sorted(p.stem for p in (CONFIGS / "policy").glob("*.yaml"))


def routed(step, engine, requests=()):
    """``step`` marked for the route the route table picks on ``engine`` (vLLM's pool where
    that is the route: ``RequestStep.pool``), as a run marks it."""
    from simlab.run.routes import Case, choose

    choose(Case(step, engine, list(requests)))
    return step
