"""Agreement with vLLM's real scheduler under load: the timed engine on vLLM's hybrid pool
(:mod:`simlab.engines.timed.vllm`) against ``crosscheck/vllm_concurrent.py``'s fixtures
(``tests/fixtures/crosscheck_load``), request by request.

The driver ran vLLM 0.33.0's ``Scheduler`` over Nemotron-H with open-loop arrivals on a clock
that counts scheduler steps (one time unit each). This module runs simlab's timed engine on the
same clock (:class:`StepClock`: every iteration lasts one unit, so a decode span of ``k`` steps
lasts ``k``) with the same arrivals (the fixture's ``arrival`` column, :class:`OpenLoop`), the
case's pool, ``max_num_seqs`` (``engine.max_running``) and ``max_num_batched_tokens``
(``engine.token_budget``), and compares, per request, its hit (that of its first scheduling,
vLLM's ``num_cached_tokens``), that of its last scheduling, its preemptions and when it was
first scheduled, got its first token and finished.

SGLang's scheduler (``crosscheck/sglang_concurrent.py``, fixtures in
``tests/fixtures/crosscheck_load_sglang``: SGLang 0.5.23's own ``get_next_batch_to_run``,
``PrefillAdder``, ``retract_decode`` and new token ratio over a ``RadixCache`` on Llama-3-8B) is
compared the same way against the timed engine on the shared KV pool (:data:`SGLANG_ENGINE`:
the pool is ``cache.size_gb``, SGLang's retraction and admission), with
``max_running_requests``, ``chunked_prefill_size`` and ``max_prefill_tokens`` as
``engine.max_running``, ``engine.token_budget`` (``null`` where chunked prefill is off) and
``engine.max_prefill_tokens``, and its batching as ``engine.batching``: ``mixed`` for the
``enable_mixed_chunk`` cases, ``prefill_first`` for SGLang's default (README, "Under load
against SGLang's scheduler").

    python -m simlab.crosscheck_load            # every case, vLLM's and SGLang's
    python -m simlab.crosscheck_load --case C   # one
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from simlab.cost.model import CostModel
from simlab.cost.shapes import BatchShape
from simlab.engines.records import RequestRecord
from simlab.engines.timed.engine import TimedEngine
from simlab.engines.timed.jobs import Job
from simlab.engines.timed.memory import MemoryFactory, tree_memory
from simlab.engines.timed.world import TimedWorld
from simlab.experiments.crosscheck import composed, load_cases, overrides_for
from traces.format import Request

log = logging.getLogger(__name__)

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "crosscheck_load"
SGLANG_FIXTURES = FIXTURES.parent / "crosscheck_load_sglang"
#: compared exactly
COUNTS = ("hit_tokens", "last_hit", "preemptions")
#: compared to 1e-6 of a step
TIMES = ("scheduled", "first_token", "finished")


class StepClock:
    """A cost model whose every iteration lasts one time unit (a scheduler step): timings
    count steps, as the driver's clock does."""

    def time(self, batch: BatchShape) -> float:
        return 1.0

    def decode_span_of(
        self, decoders: int, context_sum: int, steps: int, shared: int = 0
    ) -> np.ndarray:
        return np.ones(steps)

    def prefill_time(self, hit: int, new: int) -> float:
        return float("nan")  # not a step count: no single-request prefill time on this clock


@dataclass
class OpenLoop:
    """Each request arrives at its fixed time, whatever happens to the others."""

    requests: Sequence[Request]
    times: Sequence[float]

    def processes(self, world: TimedWorld) -> list[Generator[Any, Any, None]]:
        return [self._arrive(world, r, t) for r, t in zip(self.requests, self.times, strict=True)]

    @staticmethod
    def _arrive(world: TimedWorld, req: Request, at: float) -> Generator[Any, Any, None]:
        yield world.env.timeout(at)
        world.submit(Job(req=req, arrival=world.env.now, done=world.env.event()))

    def ready(self, job: Job) -> bool:
        return True

    def finished(self, job: Job, record: RequestRecord) -> bool:
        return True


@dataclass(frozen=True)
class LoadAgreement:
    """One case: per compared column, the requests where simlab gives the engine's value."""

    case: str
    requests: int
    identical: dict[str, int]
    engine_hit_rate: float
    simlab_hit_rate: float
    engine_preemptions: int
    simlab_preemptions: int
    first_difference: int | None  # fixture position of the first request differing anywhere


#: simlab's settings for SGLang's scheduler (``crosscheck/sglang_concurrent.py``): its KV pool is
#: the whole cache (running requests and the radix tree share it), its retraction and admission
SGLANG_ENGINE = [
    "engine.kv_pool=shared",
    "engine.running_memory_gb=0",
    "engine.preemption=sglang",
    "engine.request_admission=sglang",
]


def sglang_chunk(case: dict[str, Any]) -> str:
    """``engine.token_budget`` for an SGLang case: its ``chunked_prefill_size``, ``null`` when
    that turns chunked prefill off (0 or less)."""
    size = int(case["chunked_prefill_size"])
    return str(size) if size > 0 else "null"


def simlab_table(case: dict[str, Any], engine: pd.DataFrame) -> pd.DataFrame:
    """The timed engine's run of ``case`` on the step clock, one row per fixture row."""
    from simlab.engines.block_pool import pool_shape
    from simlab.engines.timed.vllm import VllmMemory
    from simlab.run.routes import pool_refusal
    from simlab.run.simulate import plan_run, policy_step, trace_requests

    sglang = case["engine"] == "sglang"
    extra_buffer = case.get("mamba_strategy") == "extra_buffer"
    limits = (
        [
            f"engine.max_running={case['max_running_requests']}",
            f"engine.token_budget={sglang_chunk(case)}",
            f"engine.max_prefill_tokens={case['max_prefill_tokens']}",
            *SGLANG_ENGINE,
            f"engine.batching={'mixed' if case['enable_mixed_chunk'] else 'prefill_first'}",
            f"engine.overlap={str(bool(case.get('overlap'))).lower()}",
            # without the overlap scheduler a request has one track slot (two with it)
            *(
                ["policy.admission.tracking_slots=1"]
                if extra_buffer and not case.get("overlap")
                else []
            ),
        ]
        if sglang
        else [
            f"engine.max_running={case['max_num_seqs']}",
            f"engine.token_budget={case['max_num_batched_tokens']}",
            # vLLM's async scheduling (its AsyncScheduler loop)
            f"engine.overlap={str(bool(case.get('async_scheduling'))).lower()}",
        ]
    )
    plan = plan_run(composed([*overrides_for(case, engine="timed"), *limits, "report=false"]))
    trace, loaded = trace_requests(plan.trace, plan.settings)
    by_id = {r.request_id: r for r in loaded}
    requests = [by_id[int(i)] for i in engine["request_id"]]
    (spec,) = plan.policies.values()
    step = policy_step(spec, plan.model, plan.settings, trace.block_size)
    settings = plan.engine
    assert isinstance(settings, TimedEngine)  # the case's overrides pick engine=timed
    clock = cast(CostModel, StepClock())
    memory: MemoryFactory = tree_memory
    if not sglang:
        why = pool_refusal(step, requests, transformers=True)
        shape = pool_shape(step, requests) if why is None else None
        if shape is None:
            raise ValueError(f"{case['case']}: the policy does not run on vLLM's pool ({why})")
        memory = VllmMemory.factory(shape)
    world = TimedWorld(requests, step, clock, settings, memory=memory)
    records = world.run(OpenLoop(requests, engine["arrival"].tolist()))
    preempted = dict(
        zip([r.request_id for r in records], world.preemption_column(records), strict=True)
    )
    rows = {r.request_id: r for r in records}
    ours = [rows[r.request_id] for r in requests]
    last = {i: hits[-1] for i, hits in world.resume_hits.items()}
    return pd.DataFrame(
        {
            "request_id": [r.request_id for r in ours],
            "hit_tokens": [r.hit_tokens for r in ours],
            "last_hit": [last.get(r.request_id, r.hit_tokens) for r in ours],
            "preemptions": [preempted[r.request_id] for r in ours],
            **{c: [getattr(r, c) for r in ours] for c in TIMES},
        }
    )


def compare(case: dict[str, Any], fixtures: Path = FIXTURES) -> LoadAgreement:
    engine = pd.read_csv(fixtures / case["file"])
    ours = simlab_table(case, engine)
    same = {c: ours[c].to_numpy() == engine[c].to_numpy() for c in COUNTS}
    same |= {c: np.abs(ours[c].to_numpy() - engine[c].to_numpy()) < 1e-6 for c in TIMES}
    every = np.logical_and.reduce(list(same.values()))
    total = float(engine["input_len"].sum())
    return LoadAgreement(
        case=case["case"],
        requests=len(engine),
        identical={c: int(s.sum()) for c, s in same.items()},
        engine_hit_rate=float(engine["hit_tokens"].sum()) / total,
        simlab_hit_rate=float(ours["hit_tokens"].sum()) / total,
        engine_preemptions=int(engine["preemptions"].sum()),
        simlab_preemptions=int(ours["preemptions"].sum()),
        first_difference=None if every.all() else int(np.argmin(every)),
    )


def table(rows: list[LoadAgreement]) -> str:
    frame = pd.DataFrame(
        {
            "case": [r.case for r in rows],
            "requests": [r.requests for r in rows],
            **{
                c: [f"{100 * r.identical[c] / r.requests:.2f}%" for r in rows]
                for c in (*COUNTS, *TIMES)
            },
            "engine hit": [f"{r.engine_hit_rate:.4f}" for r in rows],
            "simlab hit": [f"{r.simlab_hit_rate:.4f}" for r in rows],
            "preempted (engine / simlab)": [
                f"{r.engine_preemptions} / {r.simlab_preemptions}" for r in rows
            ],
            "first diff": [r.first_difference for r in rows],
        }
    )
    return frame.to_string(index=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simlab.crosscheck_load", description=__doc__)
    parser.add_argument("--fixtures", type=Path, nargs="+", default=[FIXTURES, SGLANG_FIXTURES])
    parser.add_argument("--case", action="append", help="only these cases (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for fixtures in args.fixtures:
        cases = load_cases(fixtures)
        rows += [compare(c, fixtures) for c in cases if not args.case or c["case"] in args.case]
    if not rows:
        print("no matching crosscheck_load cases (run `make crosscheck`)", file=sys.stderr)
        return 2
    print(table(rows))
    return 0


def run_main() -> None:
    """``python -m simlab.crosscheck_load``."""
    sys.exit(main())


if __name__ == "__main__":
    run_main()
