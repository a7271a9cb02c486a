"""vLLM v1's real ``Scheduler`` under load, over a Nemotron-H hybrid or Llama-3-8B (by the
export's model): requests arrive while others run, so they batch, share blocks as they are
computed and preempt each other.

    .venv-crosscheck/bin/python -m crosscheck.vllm_concurrent \
        --export .crosscheck/sharegpt_nemotron_h_8b.npz --name sharegpt_nemotron_h_8b \
        --size-gb 1 2 --gap 2

The scheduler, its pool and its config are ``vllm_hybrid.py``'s (real vLLM 0.33.0 code; only the
platform's two CUDA answers and the model runner are stand-ins). The clock counts scheduler
steps: every step takes one time unit, whatever it computes, so the timings measure scheduling
alone and simlab's timed engine can be run on the same clock (``simlab.experiments.crosscheck_load``).

Arrivals are open loop: request ``i`` (replay order) arrives at
``gap * i + 0.5 * frac(i * golden ratio)``; the fractional offsets keep every arrival off every
step boundary (no ties to break). At time ``t`` the engine adds every request that arrived by
``t``, runs ``schedule()``, the faked model samples a token for each request whose computed
tokens reach its tokens (its next scripted output token), ``update_from_output`` follows and
the clock moves to ``t + 1``. With nothing to run, the clock jumps to the next arrival.

``--async-scheduling`` runs vLLM's default loop instead (``AsyncScheduler``, two steps in
flight: :meth:`LoadReplay.run_async`); its cases (``*_async``, ``"async_scheduling": true`` in
the manifest) are compared against simlab's ``engine.overlap=true``.

Per request (the fixture's columns): ``arrival``; ``hit_tokens``: its computed tokens when it
was first scheduled (its hit, vLLM's ``num_cached_tokens``); ``last_hit``: those of its last
scheduling (after a preemption, its hit on resuming, which may reach into the outputs it
recomputes); ``preemptions``; ``scheduled``: the start of
the step that first scheduled it; ``first_token``: the end of the step that sampled its first
token; ``finished``: the end of the step that sampled its last one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crosscheck import stubs

stubs.install()

from crosscheck.common import (  # noqa: E402
    Export,
    base_parser,
    manifest_size,
    setup_logging,
    size_label,
    versions,
    write_table,
)
from crosscheck.vllm_hybrid import (  # noqa: E402
    SchedulerReplay,
    add_retention,
    build_config,
    build_scheduler,
    check_model,
    model_of,
    retention_item,
    retention_label,
)

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "crosscheck_load"
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
COLUMNS = (
    "arrival",
    "hit_tokens",
    "last_hit",
    "preemptions",
    "scheduled",
    "first_token",
    "finished",
)


def arrivals(n: int, gap: float) -> list[float]:
    """Open-loop arrival times of ``n`` requests (see the module docstring)."""
    return [gap * i + 0.5 * ((i * GOLDEN) % 1.0) for i in range(n)]


@dataclass
class Timeline:
    """What one request went through (the fixture's columns)."""

    arrival: float
    hit_tokens: int = -1
    last_hit: int = -1
    preemptions: int = 0
    scheduled: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan


class LoadReplay(SchedulerReplay):
    """The requests through the real scheduler on the step clock (module docstring)."""

    def run(
        self, requests: list[tuple[list[int], list[int]]], times: list[float]
    ) -> list[Timeline]:
        """Every request through the scheduler on the step clock; its timeline."""
        self.lines = [Timeline(arrival=a) for a in times]
        self.outputs = [out for _, out in requests]
        self.live: dict[str, Any] = {}  # request id -> Request, until it finishes
        self.active: set[str] = set()  # scheduled since its last (re)start
        nxt, now = 0, 0.0
        while nxt < len(requests) or self.live:
            if not self.live:
                now = max(now, times[nxt])
            while nxt < len(requests) and times[nxt] <= now:
                req = self._request(str(nxt), *requests[nxt])
                self.live[req.request_id] = req
                self.scheduler.add_request(req)
                nxt += 1
            step = self.scheduler.schedule()
            if not step.num_scheduled_tokens:
                raise RuntimeError(f"t={now}: {len(self.live)} requests and nothing scheduled")
            self._note_starts(step, now)
            now += 1.0
            self._run_step(step, now)
        self.check_pool()
        return self.lines

    def run_async(
        self, requests: list[tuple[list[int], list[int]]], times: list[float]
    ) -> list[Timeline]:
        """:meth:`run` in the order of vLLM's default engine loop, ``--async-scheduling``
        (``EngineCore.step_with_batch_queue`` with two batches in flight): each step is
        scheduled and launched before the last step's output is processed
        (``update_from_output``); with nothing to schedule the oldest output is processed.
        The faked model samples a request's token at launch, past those its queued outputs
        hold (a prefill chunk samples none); an output queued before its request was
        preempted still delivers its token (vLLM's stale share: it must not move the reset
        counters). Every finished request's outputs are checked against its script. A step's
        times are its own even when processed a step later."""
        self.lines = [Timeline(arrival=a) for a in times]
        self.outputs = [out for _, out in requests]
        self.live = {}
        self.active = set()
        queue: deque[tuple[Any, set[str], float]] = deque()
        nxt, now = 0, 0.0
        while nxt < len(requests) or self.live:
            if not self.live:
                now = max(now, times[nxt])
            while nxt < len(requests) and times[nxt] <= now:
                req = self._request(str(nxt), *requests[nxt])
                self.live[req.request_id] = req
                self.scheduler.add_request(req)
                nxt += 1
            step = self.scheduler.schedule()
            launched = bool(step.num_scheduled_tokens)
            if launched:
                self._note_starts(step, now)
                now += 1.0
                queue.append((step, self._launch(step, now), now))
            if queue and (len(queue) == 2 or not launched):
                self._process(*queue.popleft())
            elif not launched:
                if nxt >= len(requests):
                    raise RuntimeError(f"t={now}: {len(self.live)} requests, nothing scheduled")
                now = max(now, times[nxt])
        self.check_pool()
        return self.lines

    def _launch(self, step: Any, end: float) -> set[str]:
        """The requests of ``step`` that sample a token (all but prefill chunks)."""
        sampling = set()
        for rid in step.num_scheduled_tokens:
            req, line = self.live[rid], self.lines[int(rid)]
            if req.is_prefill_chunk:
                continue
            if math.isnan(line.first_token):
                line.first_token = end
            sampling.add(rid)
        return sampling

    def _process(self, step: Any, sampling: set[str], end: float) -> None:
        """``update_from_output`` of a queued step: each sampling request's next scripted
        token (outputs are processed in launch order); finished requests are checked."""
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(step.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            req = self.scheduler.requests.get(rid)
            if rid not in sampling or req is None:
                sampled.append([])
                continue
            script = self.outputs[int(rid)]
            n = len(req.output_token_ids)
            sampled.append([script[n] if n < len(script) else 0])
        output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: k for k, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        self.scheduler.update_from_output(step, output)
        for rid in ids:
            if rid in self.live and rid not in self.scheduler.requests:  # finished
                req = self.live.pop(rid)
                if list(req.output_token_ids) != list(self.outputs[int(rid)]):
                    raise AssertionError(f"request {rid}: outputs differ from its script")
                self.lines[int(rid)].finished = end
                self.active.discard(rid)

    def _note_starts(self, step: Any, now: float) -> None:
        """Requests this step scheduled from the queue (their hit) or preempted."""
        from vllm.v1.request import RequestStatus

        for rid, n in step.num_scheduled_tokens.items():
            if rid not in self.active:  # a new or resumed request
                self.active.add(rid)
                line = self.lines[int(rid)]
                line.last_hit = self.live[rid].num_computed_tokens - n
                if line.hit_tokens < 0:
                    line.hit_tokens, line.scheduled = line.last_hit, now
        for rid in list(self.active):
            if self.live[rid].status == RequestStatus.PREEMPTED:
                self.active.discard(rid)
                self.lines[int(rid)].preemptions += 1

    def _run_step(self, step: Any, end: float) -> None:
        """The faked model: a request whose computed tokens reach its tokens samples its next
        scripted token; the step ends at ``end``."""
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(step.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            req, line = self.live[rid], self.lines[int(rid)]
            if req.num_computed_tokens < req.num_tokens:
                sampled.append([])
                continue
            sampled.append([self.outputs[int(rid)][len(req.output_token_ids)]])
            if math.isnan(line.first_token):
                line.first_token = end
        output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: k for k, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        self.scheduler.update_from_output(step, output)
        for rid in ids:
            if rid not in self.scheduler.requests:  # finished
                self.lines[int(rid)].finished = end
                self.active.discard(rid)
                del self.live[rid]


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("python -m crosscheck.vllm_concurrent", __doc__)
    parser.set_defaults(fixtures=FIXTURES)
    parser.add_argument(
        "--gap", type=float, nargs="+", default=[2.0], help="steps between arrivals"
    )
    parser.add_argument("--requests", type=int, default=None, help="only the first N requests")
    parser.add_argument("--ssm-dtype", default="bfloat16", help="vLLM's mamba_ssm_cache_dtype")
    parser.add_argument(
        "--block-size", type=int, default=16, help="a Transformer: vLLM's --block-size"
    )
    parser.add_argument(
        "--prefix-match-unit",
        type=int,
        default=None,
        help="a hybrid: vLLM's --prefix-match-unit (default: the block); cases *_pmuP",
    )
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="vLLM's default engine loop (AsyncScheduler, two steps in flight; cases *_async, "
        "simlab's engine.overlap=true)",
    )
    add_retention(parser)
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    logging.getLogger("vllm").setLevel(logging.WARNING)
    export = Export.load(args.export)
    # a Mooncake prompt passes Llama-3.1's 131,072 positions; the scheduler never reads them
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    n = len(export) if args.requests is None else min(args.requests, len(export))
    requests = list(export.requests())[:n]
    model, model_config = model_of(export)
    hybrid = export.ssm_state_bytes > 0
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(model_config))
        for size_gb in args.size_gb:
            for gap in args.gap:
                config = build_config(
                    model_dir,
                    args.ssm_dtype,
                    export.max_sequence + 2048,
                    hybrid=hybrid,
                    block=args.block_size,
                    match_unit=args.prefix_match_unit,
                    retention=args.retention_interval if hybrid else 0,
                )
                total = export.total_tokens + export.max_sequence
                scheduler, hash_block, per_block, specs = build_scheduler(
                    config,
                    size_gb,
                    blocks_for_inf=total // 16 + 16 * len(export) + 1024,
                    async_scheduling=args.async_scheduling,
                )
                check_model(export, specs, config.cache_config.block_size)
                sched = config.scheduler_config
                kind = "vllm_hybrid" if hybrid else "vllm_sched"
                if not hybrid and args.block_size != 16:
                    kind += f"_b{args.block_size}"
                if hybrid and args.prefix_match_unit:
                    kind += f"_pmu{args.prefix_match_unit}"
                if hybrid:
                    kind += retention_label(args.retention_interval)
                if args.async_scheduling:
                    kind += "_async"
                cache = (
                    "Scheduler (HybridKVCacheCoordinator, mamba_cache_mode=align)"
                    if hybrid
                    else f"Scheduler (KVCacheManager, {model})"
                )
                case = {
                    "case": f"{args.name}-{kind}-{size_label(size_gb)}-gap{gap:g}",
                    "engine": "vllm",
                    "engine_version": versions()["vllm"],
                    "cache": cache,
                    "block_size": config.cache_config.block_size,
                    **({"ssm_dtype": args.ssm_dtype} if hybrid else {}),
                    **({"prefix_match_unit": hash_block} if args.prefix_match_unit else {}),
                    **(retention_item(args.retention_interval) if hybrid else {}),
                    "size_gb": manifest_size(size_gb),
                    "num_blocks": scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
                    "block_bytes": per_block,
                    "gap": gap,
                    "max_num_seqs": sched.max_num_seqs,
                    "max_num_batched_tokens": sched.max_num_batched_tokens,
                    **({"async_scheduling": True} if args.async_scheduling else {}),
                }
                start = time.perf_counter()
                replay = LoadReplay(scheduler, hash_block, config)
                run = replay.run_async if args.async_scheduling else replay.run
                lines = run(requests, arrivals(n, gap))
                columns = {c: [getattr(line, c) for line in lines] for c in COLUMNS}
                entry = write_table(case, export, n, columns, args.fixtures)
                preempted = sum(line.preemptions for line in lines)
                print(  # noqa: T201
                    f"{entry['case']}: {n} requests, hit rate {entry['hit_rate']:.4f}, "
                    f"{preempted} preemptions, makespan {max(x.finished for x in lines):.0f} "
                    f"steps, {time.perf_counter() - start:.1f} s"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
