"""SGLang's real scheduler under load over a Llama-style (attention-only) radix cache: requests
arrive while others run, so they batch, share the radix tree as it fills, and the scheduler
admits them with its ``PrefillAdder`` and its new token ratio and retracts decoding requests when
the KV pool runs out.

    .venv-crosscheck/bin/python -m crosscheck.sglang_concurrent \
        --export .crosscheck/sharegpt_llama3_8b.npz --name sharegpt_llama3_8b \
        --size-gb 0.1 --gap 1 4 --mixed

The scheduling is SGLang 0.5.23's own code, called on a ``Scheduler`` built without a model
(``Scheduler.__new__`` and the attributes its scheduling methods read; :func:`build_scheduler`):

* ``Scheduler.get_next_batch_to_run``: the last prefill batch merged into the running batch,
  ``_get_new_batch_prefill_raw`` (``PrefillAdder`` with the tracker's new token ratio, the chunked
  request first, FCFS ``SchedulePolicy``, ``ScheduleBatch.init_new`` and ``prepare_for_extend``,
  which match, lock and allocate), and with no prefill ``update_running_batch``
  (``check_decode_mem``, ``retract_decode``, the tracker's decay or its post-retraction value,
  ``prepare_for_decode``);
* ``SchedulerBatchResultProcessor.process_batch_result_prefill`` / ``_decode``: the sampled token
  appended, ``update_finish_state``, ``checkpoint_kv_cache`` at a prompt's end and
  ``release_kv_cache`` at a request's;
* an iteration without a batch resets the ratio when the server is fully idle (``on_idle``).

The pools are SGLang's: ``TokenToKVPoolAllocator`` over a one-layer ``MHATokenToKVPool``, a
``ReqToTokenPool`` with ``max_running_requests`` rows, ``RadixCache`` (LRU), on the CPU; with
``--page-size P`` > 1 the ``PagedTokenToKVPoolAllocator`` over a pool cut to whole pages
(``crosscheck.sglang_radix.paged_capacity``), the tree keyed by pages and the scheduler's paged
admission, allocation and decode-memory check. ``--chunked-prefill-size -1`` turns chunked
prefill off (``init_chunked_prefill``: no chunk budget, no mixed step) and
``--max-prefill-tokens`` sets the pass's input budget (``rem_input_tokens``); the case name then
says so (``_unchunked``, ``_mptN``).
A hybrid export (Nemotron-H) runs over ``UnifiedRadixCache[FULL,MAMBA]`` with ``no_buffer``
or, with ``--strategy extra_buffer``, ``extra_buffer`` (``crosscheck.sglang_mamba.build_cache``:
``HybridReqToTokenPool``, ``HybridLinearKVPool``; the scheduler's own track bookkeeping in
``prepare_for_extend``, ``prepare_for_decode`` and the result processor, the track mask's
pinned staging served by the host tensor): ``--size-gb`` split by ``--mamba-ratio`` as
``crosscheck.sglang_mamba`` splits it, and ``max_running_requests`` capped at ``slots // 3``
(``slots // 4`` with ``extra_buffer`` without the overlap scheduler, ``slots // 5`` with it) as
``resolve_max_num_reqs`` caps it, and ``extra_buffer``'s ping-pong buffer sized as the server
sizes it (one track slot per request without the overlap scheduler, two with it).
The loop is ``event_loop_normal`` (``--disable-overlap-schedule``: a result is processed before
the next batch is scheduled). Only what does not decide anything is a stand-in: metrics,
publishers, the data-parallel adapter and the n-gram embedding pass (identities), no grammar, no
LoRA, no speculative decoding, and the model, whose "forward" samples each request's next
scripted output token.

``--overlap`` runs ``event_loop_overlap``'s order instead (SGLang's default): each batch is
scheduled and launched before the last one's result is processed (unless
``is_disable_overlap_for_batch``), with ``enable_skip_finishing_decode`` (a request whose queued
result finishes it by length sits the next decode out), and the result processor built for
overlap (it drops a retracted request's queued token); the faked forward samples a request's
token at launch, past the tokens its queued results commit (a middle prefill chunk's commits
none), and every finished request's outputs are checked against its script. A hybrid export
needs ``--strategy extra_buffer`` (SGLang refuses ``no_buffer`` under overlap): its batches are
built for overlap, so ``prepare_for_decode`` also stages the next step's track mask
(``mamba_track_mask_next_cpu``). The cases (``*_overlap``, ``"overlap": true`` in the
manifest) check simlab's ``engine.overlap=true``.

The clock and the arrivals are ``vllm_concurrent``'s: every batch takes one time unit; request
``i`` arrives at ``gap * i + 0.5 * frac(i * golden ratio)``; at time ``t`` the scheduler takes
every request that arrived by ``t``. With nothing to run the clock jumps to the next arrival.

Per request (the fixture's columns): ``arrival``; ``hit_tokens``: ``prefix_len`` when it was first
scheduled; ``last_hit``: that of its last scheduling (a retracted request re-prefills its input
and sampled outputs); ``preemptions``: its retractions; ``scheduled``: the start of the batch
that first scheduled it; ``first_token``: the end of the batch that sampled its first token;
``finished``: the end of the batch that sampled its last one.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import types
from array import array
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from crosscheck import stubs

stubs.install()

from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.scheduler_components.batch_result_processor import (  # noqa: E402
    SchedulerBatchResultProcessor,
)
from sglang.srt.managers.scheduler_components.logprob_result_processor import (  # noqa: E402
    SchedulerLogprobResultProcessor,
)
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import (  # noqa: E402
    NewTokenRatioTracker,
)
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache.kv_cache_configurator import (  # noqa: E402
    MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO,
)
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.runtime_context import get_context, get_schedule  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from crosscheck.common import (  # noqa: E402
    ROOT,
    Export,
    base_parser,
    capacity_tokens,
    manifest_size,
    setup_logging,
    size_label,
    versions,
    write_table,
)
from crosscheck.sglang_mamba import MAMBA_CHUNK, build_cache, capacities  # noqa: E402
from crosscheck.sglang_radix import cache_params, paged_capacity  # noqa: E402
from crosscheck.vllm_concurrent import COLUMNS, Timeline, arrivals  # noqa: E402

log = logging.getLogger(__name__)

FIXTURES = ROOT / "tests" / "fixtures" / "crosscheck_load_sglang"
MAX_PREFILL_TOKENS = 16384  # SGLang's --max-prefill-tokens default


class _Identity:
    """The data-parallel adapter and the n-gram embedding pass of a single-GPU server without
    n-gram embeddings: they hand the batch back unchanged."""

    def maybe_prepare_mlp_sync_batch(self, batch: Any, need_sync: bool = False) -> Any:
        return batch

    def maybe_convert_decode_to_extend(self, batch: Any) -> Any:
        return batch

    def prepare_for_forward(self, batch: Any, chunked_req: Any = None) -> Any:
        return batch


class _Silent:
    """Metrics, publishers and streamers: every call does nothing (they decide nothing)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _Metrics(_Silent):
    """The metrics reporter: counters it keeps, nothing it reports."""

    def __init__(self) -> None:
        self.enable_metrics = False
        self.num_generated_tokens = 0
        self.num_retracted_reqs = 0
        self.forward_ct_decode = 0


class _NoBeams(_Silent):
    def pending_member_rows(self, batch: Any) -> int:
        return 0


class _NoLoads(_Silent):
    def _get_num_pending_tokens(self, chunk_deduct: int = 0) -> int:
        return 0


class _NoGrammar:
    grammar_queue: ClassVar[list[Any]] = []

    def has_waiting_grammars(self) -> bool:
        return False


class _NoDllm:
    def any_staging_reqs(self) -> bool:
        return False


def _switch_off_features(s: Scheduler) -> None:
    """What a single-GPU, text-only server without overlap, speculative decoding, LoRA,
    hierarchical cache, disaggregation or diffusion LM sets: each scheduling branch they guard
    is skipped."""
    s.enable_overlap = False
    s.spec_algorithm = SpeculativeAlgorithm.NONE
    s.disaggregation_mode = DisaggregationMode.NULL
    s.dllm_config = None
    s.dllm_manager = _NoDllm()
    s.require_mlp_sync = False
    s.is_hybrid_swa = False
    s.enable_hisparse = False
    s.hisparse_coordinator = None
    s.enable_lora = False
    s.enable_hicache_storage = False
    s.enable_lmcache = False
    s.enable_hierarchical_cache = False
    s.enable_unified_cache_external_linker = False
    s.decode_offload_manager = None
    s.truncation_align_size = None
    s.prefill_decode_interval = s._prefill_decode_interval_remaining = 0


def radix_tree(
    capacity: int, max_running: int, max_context_len: int, page_size: int = 1
) -> RadixCache:
    """SGLang's ``RadixCache`` over ``capacity`` KV slots in pages of ``page_size`` (its
    ``PagedTokenToKVPoolAllocator`` when > 1) and ``max_running`` request rows."""
    return RadixCache(
        cache_params(capacity, max_context_len, rows=max_running, page_size=page_size)
    )


def mamba_rows(
    slots: int, max_running: int, strategy: str = "no_buffer", overlap: bool = False
) -> int:
    """``max_running_requests`` of a hybrid server with ``slots`` Mamba slots and
    ``--max-running-requests max_running``: SGLang's ``resolve_max_num_reqs`` caps it at
    ``slots // 3`` with ``no_buffer`` (a request's own slot, its locked hit's state and the state
    its prompt donates; ``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``), plus with
    ``extra_buffer`` its tracking slots (``get_mamba_tracking_slots``: one without the overlap
    scheduler, two with it)."""
    tracking = (1 + overlap) if strategy == "extra_buffer" else 0
    return min(max_running, slots // (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO + tracking))


def _pinned_on_the_cpu() -> None:
    """``prepare_for_decode`` stages ``extra_buffer``'s track mask in pinned host memory before
    its copy to the GPU; without an accelerator the host tensor itself serves (pinning is a
    transfer optimisation, it decides nothing)."""
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]


def build_scheduler(
    tree: Any,
    max_running: int,
    chunked_prefill_size: int,
    max_prefill_tokens: int,
    mixed: bool,
    mamba_strategy: str | None = None,
    page_size: int = 1,
) -> Scheduler:
    """A ``Scheduler`` without a model over ``tree`` (a cache over CPU pools with
    ``max_running`` request rows: :func:`radix_tree`, :func:`mamba_tree`), with the given
    prefill limits (module docstring), ``--page-size`` and, for a hybrid cache,
    ``--mamba-radix-cache-strategy``.
    The cache is built first: SGLang's Mamba test builder publishes server args of its own."""
    args = ServerArgs(
        model_path="dummy",
        page_size=page_size,
        disable_overlap_schedule=True,
        chunked_prefill_size=chunked_prefill_size,
        max_prefill_tokens=max_prefill_tokens,
        max_running_requests=max_running,
        enable_mixed_chunk=mixed,
        **({"mamba_radix_cache_strategy": mamba_strategy} if mamba_strategy else {}),
    )
    if mamba_strategy is not None:
        args._mamba_cache_chunk_size = MAMBA_CHUNK
    if mamba_strategy == "extra_buffer":
        _pinned_on_the_cpu()
    set_global_server_args_for_scheduler(args)
    get_context().override(
        "scheduler.pp_max_micro_batch_size_default", pp_max_micro_batch_size=max_running
    )
    rows, allocator = tree.req_to_token_pool, tree.token_to_kv_pool_allocator
    s = Scheduler.__new__(Scheduler)
    s.tree_cache, s.req_to_token_pool, s.token_to_kv_pool_allocator = tree, rows, allocator
    model_config = types.SimpleNamespace(
        vocab_size=1 << 30,
        is_encoder_decoder=False,
        is_multimodal=False,
        self_opened_think_start_ids=None,  # not a reasoning model
        think_end_ids=None,
        hf_text_config=types.SimpleNamespace(mamba_chunk_size=MAMBA_CHUNK),
    )
    s.model_config = model_config
    s.init_running_status()  # waiting queue, running batch, last batch, forward count
    # init_chunked_prefill's attributes for a text-only model (it reads the model's architecture)
    chunked = get_schedule().chunked_prefill_size
    s.chunked_prefill_size = chunked if chunked is not None and chunked > 0 else None
    s.is_mixed_chunk = s.chunked_prefill_size is not None and get_schedule().enable_mixed_chunk
    s.chunked_req = s._pending_chunked_abort_req = None
    s.page_size = page_size
    s.max_prefill_tokens = max_prefill_tokens
    s.max_running_requests = max_running
    s.max_queued_requests = None
    s.schedule_policy = get_schedule().schedule_policy
    s.enable_priority_scheduling = False
    s.enable_priority_preemption = False
    s.abort_on_priority_when_disabled = False
    s.schedule_low_priority_values_first = False
    s.priority_scheduling_preemption_threshold = (
        get_schedule().priority_scheduling_preemption_threshold
    )
    s.policy = SchedulePolicy(s.schedule_policy, tree, False, False, False)
    s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()
    s.prefill_delayer = None
    s.max_prefill_bs = 0
    s.min_free_slots_delayer = None
    s.dynamic_chunk_sizer = None
    s.processed_tokens_counter = 0
    _switch_off_features(s)
    s.grammar_manager = _NoGrammar()
    s.dp_attn_adapter = _Identity()
    s.ngram_embedding_manager = _Identity()
    s.beam_coordinator = _NoBeams()
    s.load_inquirer = _NoLoads()
    s.metrics_reporter = _Metrics()
    s.scheduler_stage_metrics = None
    s.tp_worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(attn_backend=object(), prefill_aware_swa=False)
    )
    s.batch_result_processor = SchedulerBatchResultProcessor(
        is_generation=True,
        disaggregation_mode=DisaggregationMode.NULL,
        enable_overlap=False,
        enable_overlap_mlx=False,
        model_config=model_config,
        token_to_kv_pool_allocator=allocator,
        tree_cache=tree,
        hisparse_coordinator=None,
        req_to_token_pool=rows,
        decode_offload_manager=None,
        metrics_collector=_Silent(),
        metrics_reporter=s.metrics_reporter,
        draft_worker=None,
        model_worker=None,
        logprob_result_processor=SchedulerLogprobResultProcessor(model_config=model_config),
        output_streamer=_Silent(),
        beam_coordinator=_NoBeams(),
        abort_request=lambda *args, **kwargs: None,
    )
    return s


@dataclass
class LoadReplay:
    """The requests through the scheduler on the step clock (module docstring)."""

    scheduler: Scheduler
    capacity: int
    mamba_slots: int | None = None  # a hybrid cache's Mamba pool

    def run(
        self, requests: list[tuple[list[int], list[int]]], times: list[float]
    ) -> list[Timeline]:
        """Every request through the scheduler; its timeline."""
        s = self.scheduler
        self._reset(requests, times)
        nxt, now = 0, 0.0
        while nxt < len(requests) or self.live:
            nxt, now = self._arrive(requests, times, nxt, now)
            batch = self._next_batch()
            if batch is None:
                if s.is_fully_idle():
                    s.new_token_ratio_tracker.reset()  # on_idle
                now = self._idle(times, nxt, now)
                continue
            self._note_starts(batch, now)
            now += 1.0
            self._run_batch(batch, now)
            s.last_batch = batch
        self.check_pool()
        return self.lines

    def run_overlap(
        self, requests: list[tuple[list[int], list[int]]], times: list[float]
    ) -> list[Timeline]:
        """:meth:`run` in ``event_loop_overlap``'s order (module docstring): schedule, process
        the last result first if overlap is off for this batch, launch, then process the last
        result; a batch's times are its own step's even when processed a step later."""
        s = self.scheduler
        s.enable_overlap = True
        # the result processor then drops a retracted request's queued token
        s.batch_result_processor = replace(s.batch_result_processor, enable_overlap=True)
        s.enable_skip_finishing_decode = True
        s.result_queue = deque()
        self._reset(requests, times)
        nxt, now = 0, 0.0
        while nxt < len(requests) or self.live:
            nxt, now = self._arrive(requests, times, nxt, now)
            batch = self._next_batch()
            disable = s.is_disable_overlap_for_batch(batch, s.last_batch)
            processed = disable and self._process_queued()
            if batch is not None:
                self._note_starts(batch, now)
                now += 1.0
                s.result_queue.append(self._launch(batch, now))
            if s.last_batch is not None:
                processed = (not disable and self._process_queued()) or processed
            elif batch is None and s.is_fully_idle():
                s.new_token_ratio_tracker.reset()  # on_idle
            if batch is None and not processed and not s.result_queue:
                now = self._idle(times, nxt, now)
                continue
            s.last_batch = batch
        while self._process_queued():
            pass
        self.check_pool()
        return self.lines

    def _reset(self, requests: list[tuple[list[int], list[int]]], times: list[float]) -> None:
        self.lines = [Timeline(arrival=a) for a in times]
        self.outputs = [out for _, out in requests]
        self.live: dict[str, Req] = {}
        self.active: set[str] = set()  # scheduled since its last (re)start
        self.queued: dict[str, int] = {}  # request id -> its results launched, not processed

    def _arrive(
        self, requests: list[tuple[list[int], list[int]]], times: list[float], nxt: int, now: float
    ) -> tuple[int, float]:
        """Requests that arrived by ``now`` join the queue (with none live, the clock jumps to
        the next arrival); the next request's index and the clock."""
        if not self.live:
            now = max(now, times[nxt])
        while nxt < len(requests) and times[nxt] <= now:
            req = self._request(str(nxt), *requests[nxt])
            self.live[req.rid] = req
            self.scheduler._add_request_to_queue(req)
            nxt += 1
        return nxt, now

    def _next_batch(self) -> Any:
        """``get_next_batch_to_run``; the retractions it made are noted."""
        s = self.scheduler
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        self._note_retractions()
        return plan.batch_to_run

    def _idle(self, times: list[float], nxt: int, now: float) -> float:
        """Nothing was scheduled: the clock jumps to the next arrival (an error with none left
        and requests still live)."""
        if self.live and nxt >= len(times):
            raise RuntimeError(f"t={now}: {len(self.live)} requests, nothing scheduled")
        self.scheduler.last_batch = None
        return max(now, times[nxt]) if self.live else now

    def _launch(
        self, batch: Any, end: float
    ) -> tuple[Any, GenerationBatchResult, float, list[Any]]:
        """The faked forward of an overlapped batch (:meth:`_sample`), its requests' results
        queued: the batch (copied, as SGLang queues it), its result, its end step and the
        requests whose result commits a token (all but a middle prefill chunk's, SGLang's
        ``chunked_req``: its result commits nothing, ``inflight_middle_chunks``)."""
        result = self._sample(batch)
        chunked = self.scheduler.chunked_req if batch.forward_mode.is_extend() else None
        committing = [req for req in batch.reqs if req is not chunked]
        for req in committing:
            self.queued[req.rid] = self.queued.get(req.rid, 0) + 1
        return batch.copy(), result, end, committing

    def _sample(self, batch: Any) -> GenerationBatchResult:
        """The faked forward: each request samples its next scripted token past those its
        queued results hold (ignored for a middle prefill chunk)."""
        s = self.scheduler
        s.forward_ct += 1
        batch.forward_iter = s.forward_ct
        tokens = []
        for req in batch.reqs:
            script = self.outputs[int(req.rid)]
            n = len(req.output_ids) + self.queued.get(req.rid, 0)
            tokens.append(script[n] if n < len(script) else 0)
        return GenerationBatchResult(next_token_ids=torch.tensor(tokens, dtype=torch.int64))

    def _process_queued(self) -> bool:
        """The oldest queued result through SGLang's result processor (``pop_and_process``);
        False when none is queued."""
        if not self.scheduler.result_queue:
            return False
        batch, result, end, committing = self.scheduler.result_queue.popleft()
        for req in committing:
            self.queued[req.rid] -= 1
        self._process(batch, result, end)
        return True

    def _process(self, batch: Any, result: GenerationBatchResult, end: float) -> None:
        """SGLang's result processor takes ``batch``'s ``result``; the batch ended at ``end``."""
        processor = self.scheduler.batch_result_processor
        if batch.forward_mode.is_decode():
            processor.process_batch_result_decode(batch, result)
        else:
            processor.process_batch_result_prefill(batch, result)
        for req in batch.reqs:
            line = self.lines[int(req.rid)]
            if req.output_ids and math.isnan(line.first_token):
                line.first_token = end
            if req.finished() and req.rid in self.live:
                script = self.outputs[int(req.rid)]
                if list(req.output_ids) != list(script[: len(req.output_ids)]):
                    raise RuntimeError(f"request {req.rid} sampled outputs off its script")
                line.finished = end
                self.active.discard(req.rid)
                del self.live[req.rid]

    def _request(self, rid: str, input_ids: list[int], output_ids: list[int]) -> Req:
        if not output_ids:
            raise ValueError("SGLang always samples at least one output token")
        params = SamplingParams(temperature=0, max_new_tokens=len(output_ids))
        params.normalize(None)  # what the tokenizer manager does (no stop strings)
        return Req(
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", input_ids),
            sampling_params=params,
        )

    def _note_retractions(self) -> None:
        """Requests ``update_running_batch`` retracted this iteration are queued again."""
        queued = {req.rid for req in self.scheduler.waiting_queue}
        for rid in list(self.active):
            if rid in queued:
                self.active.discard(rid)
                self.lines[int(rid)].preemptions += 1

    def _note_starts(self, batch: Any, now: float) -> None:
        """Requests this prefill batch schedules from the queue: their hit."""
        if not batch.forward_mode.is_extend():
            return
        for req in batch.reqs:
            if req.rid in self.active or req.finished():
                continue
            self.active.add(req.rid)
            line = self.lines[int(req.rid)]
            line.last_hit = int(req.prefix_len)
            if line.hit_tokens < 0:
                line.hit_tokens, line.scheduled = line.last_hit, now

    def _run_batch(self, batch: Any, end: float) -> None:
        """The faked forward (:meth:`_sample`); SGLang's result processor takes it; the batch
        ends at ``end``."""
        self._process(batch, self._sample(batch), end)

    def check_pool(self) -> None:
        """Nothing runs: every KV slot (and Mamba slot) is free or in the tree, nothing is
        locked."""
        tree = self.scheduler.tree_cache
        free = self.scheduler.token_to_kv_pool_allocator.available_size()
        assert tree.protected_size() == 0, tree.protected_size()
        assert free + tree.evictable_size() == self.capacity, (free, tree.evictable_size())
        if self.mamba_slots is not None:
            mamba_free = self.scheduler.req_to_token_pool.mamba_allocator.available_size()
            assert tree.mamba_protected_size() == 0, tree.mamba_protected_size()
            cached = tree.mamba_evictable_size()
            assert mamba_free + cached == self.mamba_slots, (mamba_free, cached)


def _mode_and_cache(args: Any, hybrid: bool) -> tuple[str, str]:
    """The case name's scheduling mode (batching, ``extra_buffer``, page size) and the cache."""
    mode = "mixed" if args.mixed else "prefill_first"
    if hybrid and args.strategy != "no_buffer":
        mode = f"{args.strategy}_{mode}"
    if args.page_size > 1:
        mode = f"{mode}_p{args.page_size}"
    if args.chunked_prefill_size <= 0:
        mode = f"{mode}_unchunked"
    if args.max_prefill_tokens != MAX_PREFILL_TOKENS:
        mode = f"{mode}_mpt{args.max_prefill_tokens}"
    if args.overlap:
        mode = f"{mode}_overlap"
    cache = f"UnifiedRadixCache[FULL,MAMBA] {args.strategy}" if hybrid else "RadixCache"
    return mode, cache


def _check_args(parser: argparse.ArgumentParser, args: Any, hybrid: bool) -> None:
    """Settings SGLang itself refuses, or that the driver does not drive."""
    if args.mixed and args.chunked_prefill_size <= 0:
        parser.error("--mixed needs chunked prefill: SGLang mixes no step without it")
    if hybrid and args.page_size > 1:
        parser.error("--page-size > 1 is for attention-only exports")
    if hybrid and args.overlap and args.strategy == "no_buffer":
        parser.error(
            "--overlap with a hybrid export needs --strategy extra_buffer (SGLang: "
            "no_buffer do not support overlap schedule)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("python -m crosscheck.sglang_concurrent", __doc__)
    parser.set_defaults(fixtures=FIXTURES)
    parser.add_argument(
        "--gap", type=float, nargs="+", default=[2.0], help="steps between arrivals"
    )
    parser.add_argument("--requests", type=int, default=None, help="only the first N requests")
    parser.add_argument("--max-running", type=int, default=128)
    parser.add_argument(
        "--chunked-prefill-size", type=int, default=2048, help="-1: chunked prefill off"
    )
    parser.add_argument("--max-prefill-tokens", type=int, default=MAX_PREFILL_TOKENS)
    parser.add_argument(
        "--mixed", action="store_true", help="--enable-mixed-chunk (prefill beside decode)"
    )
    parser.add_argument(
        "--strategy",
        choices=("no_buffer", "extra_buffer"),
        default="no_buffer",
        help="a hybrid export: --mamba-radix-cache-strategy",
    )
    parser.add_argument(
        "--page-size", type=int, default=1, help="SGLang's --page-size (attention-only exports)"
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="event_loop_overlap's order (SGLang's default; a hybrid export needs "
        "--strategy extra_buffer, whose ping-pong buffer then has two track slots)",
    )
    parser.add_argument(
        "--mamba-ratio",
        type=float,
        default=0.9,
        help="a hybrid export: Mamba bytes / KV bytes (SGLang's --mamba-full-memory-ratio)",
    )
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    logging.getLogger("sglang").setLevel(logging.ERROR)
    export = Export.load(args.export)
    n = len(export) if args.requests is None else min(args.requests, len(export))
    requests = list(export.requests())[:n]
    hybrid = export.ssm_state_bytes > 0
    page = args.page_size
    _check_args(parser, args, hybrid)
    for size_gb in args.size_gb:
        if hybrid:
            if math.isinf(size_gb):
                parser.error("a hybrid export needs finite --size-gb (the Mamba pool's split)")
            capacity, slots, ssm_gb = capacities(size_gb, args.mamba_ratio, export)
            max_running = mamba_rows(slots, args.max_running, args.strategy, args.overlap)
        else:
            tokens = capacity_tokens(size_gb, export.kv_bytes_per_token, export)
            capacity = paged_capacity(tokens, page)
            slots, ssm_gb, max_running = None, None, args.max_running
        for gap in args.gap:
            if hybrid:
                assert slots is not None
                tree = build_cache(
                    capacity,
                    slots,
                    export.max_sequence + 1,
                    args.strategy,
                    rows=max_running,
                    overlap=args.overlap,
                )
            else:
                tree = radix_tree(capacity, max_running, export.max_sequence + page, page)
            scheduler = build_scheduler(
                tree,
                max_running,
                args.chunked_prefill_size,
                args.max_prefill_tokens,
                args.mixed,
                args.strategy if hybrid else None,
                page,
            )
            mode, cache = _mode_and_cache(args, hybrid)
            case = {
                "case": f"{args.name}-sglang_sched_{mode}-{size_label(size_gb)}-gap{gap:g}",
                "engine": "sglang",
                "engine_version": versions()["sglang"],
                "cache": f"Scheduler ({cache}"
                + (", overlap schedule" if args.overlap else ", disable_overlap_schedule")
                + (", enable_mixed_chunk)" if args.mixed else ")"),
                "block_size": page,
                "size_gb": manifest_size(size_gb),
                "capacity_tokens": capacity,
                "gap": gap,
                "max_running_requests": max_running,
                "chunked_prefill_size": args.chunked_prefill_size,
                "max_prefill_tokens": args.max_prefill_tokens,
                "enable_mixed_chunk": args.mixed,
                **({"overlap": True} if args.overlap else {}),
            }
            if hybrid:
                case |= {"mamba_slots": slots, "ssm_gb": ssm_gb, "mamba_strategy": args.strategy}
            start = time.perf_counter()
            replay = LoadReplay(scheduler, capacity, slots)
            lines = (replay.run_overlap if args.overlap else replay.run)(requests, arrivals(n, gap))
            columns = {c: [getattr(line, c) for line in lines] for c in COLUMNS}
            entry = write_table(case, export, n, columns, args.fixtures)
            retracted = sum(line.preemptions for line in lines)
            print(  # noqa: T201
                f"{entry['case']}: {n} requests, hit rate {entry['hit_rate']:.4f}, "
                f"{retracted} retractions, makespan {max(x.finished for x in lines):.0f} "
                f"steps, {time.perf_counter() - start:.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
