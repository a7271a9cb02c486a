"""The timed engine's batches: SGLang's running batch as its scheduler sees it
(:class:`RunningBatch`), and the :class:`BatchShape` an iteration's chunks and decoders give the
cost model (:func:`batch_shape`, with RadixMLP's and shared-prefix attention's savings)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from simlab.cost.shapes import BatchShape
from simlab.engines.timed.new_token_ratio import NewTokenRatio

if TYPE_CHECKING:
    from simlab.cache.prefix import PrefixCache
    from simlab.engines.timed.jobs import Job
    from simlab.engines.timed.settings import TimedSettings


@dataclass
class RunningBatch:
    """SGLang's running batch under ``engine.request_admission=sglang`` (the flags stay unset
    otherwise): whether it is full, what the last decode memory check did, the admission
    passes run and the new token ratio (``engine.kv_pool=shared``)."""

    #: mixed batching puts a step's admissions ahead of the running batch, prefill_first behind
    prefill_first: bool = False
    full: bool = False  # a request did not fit; no admission attempt until one leaves
    retracted: bool = False  # the last decode memory check preempted (so did not decay)
    decode_skipped: bool = False  # engine.overlap: the last decode check skipped the step
    passes: int = 0  # admission passes with requests queued (``calc_priority``)
    admission_passes: int = 0  # shared KV pool: passes run (``Job.batch_rank``)
    ratio: NewTokenRatio = field(default_factory=NewTokenRatio)

    def rank(self, index: int) -> tuple[int, int]:
        """Batch rank of the ``index``-th request of the last admission pass: mixed batching
        puts a step's admissions ahead of the running batch, prefill_first behind it (SGLang's
        ``mix_with_running`` and ``merge_batch``)."""
        passes = self.admission_passes
        return (passes if self.prefill_first else -passes, index)


def batch_shape(
    chunks: list[tuple[Job, int]], decoders: list[Job], cache: PrefixCache, s: TimedSettings
) -> BatchShape:
    """What the cost model times of an iteration running ``chunks`` (job, tokens) beside
    ``decoders``: its state loads and stores on a hybrid, and its sampled tokens."""
    hybrid = cache.model.is_hybrid
    loads = sum(1 for job, _ in chunks if job.prefilled == job.hit and job.hit > 0)
    stores = sum(
        bisect.bisect_right(job.ckpt_tokens, job.prefilled + take)
        - bisect.bisect_right(job.ckpt_tokens, job.prefilled)
        for job, take in chunks
    )
    batch = BatchShape(
        prefill=[(job.prefilled, take) for job, take in chunks],
        decode=[j.input_tokens + j.decoded + 1 for j in decoders],
        state_loads=loads if hybrid else 0,
        state_stores=stores * cache.ckpt_states if hybrid else 0,
        # logits only where a token is sampled: decodes and chunks that end their prompt
        sampled=len(decoders)
        + sum(1 for job, take in chunks if job.prefilled + take >= job.input_tokens),
    )
    if s.radix_mlp and len(chunks) > 1 and cache.unit == 1:
        batch.unique_tokens = unique_tokens(
            [(job.seq, job.prefilled, job.prefilled + take) for job, take in chunks]
        ) + len(decoders)
    if s.shared_prefix_attention:
        batch.shared_kv_tokens = shared_prefix_reads(decoders)
    return batch


def unique_tokens(chunks: list[tuple[np.ndarray, int, int]]) -> int:
    """RadixMLP's ``N'``: tokens of the chunks ``seq[start:end]`` counted once per distinct
    prefix (a token is a duplicate of another chunk's when their whole prefixes are equal)."""
    total = 0
    for i, (seq, start, end) in enumerate(chunks):
        dup = 0
        for other, o_start, o_end in chunks[:i]:
            hi = min(end, o_end)
            if hi <= max(start, o_start):
                continue
            diff = np.flatnonzero(seq[:hi] != other[:hi])
            common = int(diff[0]) if diff.size else hi
            dup = max(dup, min(hi, common) - max(start, o_start))
        total += (end - start) - max(dup, 0)
    return total


def shared_prefix_reads(decoders: list[Job]) -> int:
    """KV token reads saved when decoders reusing the same cached prefix read it once."""
    groups: dict[int, tuple[int, int]] = {}
    for job in decoders:
        if job.hit_node is not None and job.hit:
            count, length = groups.get(id(job.hit_node), (0, job.hit))
            groups[id(job.hit_node)] = (count + 1, min(length, job.hit))
    return sum((count - 1) * length for count, length in groups.values())
