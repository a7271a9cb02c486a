"""The timed engine's ``engine`` settings (:class:`TimedSettings`), validated."""

from __future__ import annotations

from dataclasses import dataclass

KV_POOLS = ("separate", "shared")
PREEMPTIONS = ("lifo", "fifo", "sglang")
ADMISSIONS = ("whole", "sglang")
BATCHINGS = ("mixed", "prefill_first")


@dataclass(frozen=True)
class TimedSettings:
    """``engine`` config of the timed engine (validated)."""

    token_budget: int | None = 8192  # None: chunked prefill off (request_admission=sglang)
    max_prefill_tokens: int | None = None  # SGLang's --max-prefill-tokens (None: no cap)
    max_running: int | None = 256  # None: engine.backend's default (TimedEngine resolves it)
    running_memory_gb: float = 16.0
    ckpt_split: bool = True
    ssm_chunk: int = 256
    radix_mlp: bool = False
    shared_prefix_attention: bool = False
    typing_wpm: float | None = None
    memory_check: bool = True  # false: what-if studies beyond the GPU's memory
    kv_pool: str = "separate"  # shared: running sequences and the prefix cache share one budget
    preemption: str = "lifo"  # shared pool: which running request is preempted first
    request_admission: str = "whole"  # shared pool: when a queued request may start
    ignore_eos: bool = False  # request_admission=sglang: requests run to max_new_tokens
    # prefill_first: a step that prefills runs no decodes (SGLang's default)
    batching: str = "mixed"
    #: the engine's overlapped loop, each batch scheduled before the last one's result is
    #: processed: SGLang's overlap scheduler (its default ``event_loop_overlap``) with
    #: request_admission=sglang; vLLM's async scheduling (its default ``AsyncScheduler``) on
    #: vLLM's block pool (:mod:`simlab.engines.timed.vllm`)
    overlap: bool = False
    #: SGLang's --scheduler-recv-interval: new requests pulled every N decode steps
    #: (:mod:`simlab.engines.timed.intake`)
    recv_interval: int = 1
    #: TensorRT-LLM's batch_wait_timeout_iters and batch_wait_max_tokens_ratio
    batch_wait_iters: int = 0
    batch_wait_tokens_ratio: float = 0.0
    #: seconds from a request's send to the engine's queue (the API server, tokenisation): on
    #: its TTFT and latency, beside the GPU (:meth:`TimedWorld.submit`)
    request_overhead_s: float = 0.0
    #: cache.size_gb=engine: the engine's memory fraction (vLLM's --gpu-memory-utilization,
    #: SGLang's --mem-fraction-static, TensorRT-LLM's free_gpu_memory_fraction; None: its own)
    memory_fraction: float | None = None

    def __post_init__(self) -> None:
        self._check_counts()
        self._check_seconds_and_fraction()
        shared = self.kv_pool == "shared"  # one budget: the cache alone may be the whole pool
        if not self.running_memory_gb >= 0:  # 0 separate: vLLM's pool (TimedEngine.check_memory)
            least = ">= 0 with kv_pool=shared" if shared else "> 0 (or 0 on vLLM's block pool)"
            raise ValueError(
                f"engine.running_memory_gb must be {least}, got {self.running_memory_gb!r}"
            )
        for key in (
            "ckpt_split",
            "radix_mlp",
            "shared_prefix_attention",
            "memory_check",
            "ignore_eos",
            "overlap",
        ):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"engine.{key} must be true or false, got {getattr(self, key)!r}")
        if self.typing_wpm is not None and not self.typing_wpm > 0:
            raise ValueError(f"engine.typing_wpm must be > 0 or null, got {self.typing_wpm!r}")
        if self.kv_pool not in KV_POOLS:
            raise ValueError(
                f"engine.kv_pool must be one of {'|'.join(KV_POOLS)}, got {self.kv_pool!r}"
            )
        if self.preemption not in PREEMPTIONS:
            raise ValueError(
                f"engine.preemption must be one of {'|'.join(PREEMPTIONS)}, got {self.preemption!r}"
            )
        if self.request_admission not in ADMISSIONS:
            raise ValueError(
                f"engine.request_admission must be one of {'|'.join(ADMISSIONS)}, "
                f"got {self.request_admission!r}"
            )
        if self.batching not in BATCHINGS:
            raise ValueError(
                f"engine.batching must be one of {'|'.join(BATCHINGS)}, got {self.batching!r}"
            )
        self._check_sglang_prefill_limits()
        self._check_holds()
        if self.overlap and self.request_admission == "sglang" and not shared:
            raise ValueError(
                "engine.overlap with engine.request_admission=sglang is SGLang's overlap "
                f"scheduler: it needs engine.kv_pool=shared, got {self.kv_pool!r}"
            )

    @property
    def running_cap(self) -> int:
        """``engine.max_running`` as the engine resolved it (null: the backend's cap,
        :class:`~simlab.engines.timed.engine.TimedEngine`, before any world runs)."""
        if self.max_running is None:
            raise ValueError("engine.max_running is unresolved: build the engine from its config")
        return self.max_running

    def _check_counts(self) -> None:
        """The token and request counts are integers >= 1 (the two SGLang limits may be
        null: :meth:`_check_sglang_prefill_limits`; ``max_running`` null: the engine's default,
        :class:`~simlab.engines.timed.engine.TimedEngine` resolves it)."""
        for key in (
            "token_budget",
            "max_prefill_tokens",
            "max_running",
            "ssm_chunk",
            "recv_interval",
        ):
            value = getattr(self, key)
            if value is None and key in ("token_budget", "max_prefill_tokens", "max_running"):
                continue
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"engine.{key} must be an integer >= 1, got {value!r}")

    def _check_seconds_and_fraction(self) -> None:
        """``request_overhead_s`` is >= 0 and ``memory_fraction`` null or in (0, 1]."""
        fraction = self.memory_fraction
        if fraction is not None and (
            isinstance(fraction, bool)
            or not (isinstance(fraction, int | float) and 0 < fraction <= 1)
        ):
            raise ValueError(f"engine.memory_fraction must be in (0, 1] or null, got {fraction!r}")
        overhead = self.request_overhead_s
        if isinstance(overhead, bool) or not (isinstance(overhead, int | float) and overhead >= 0):
            raise ValueError(f"engine.request_overhead_s must be >= 0 (seconds), got {overhead!r}")

    def _check_holds(self) -> None:
        """The engines' holds on new requests (:mod:`simlab.engines.timed.intake`)."""
        if not (isinstance(self.batch_wait_iters, int) and self.batch_wait_iters >= 0):
            raise ValueError(
                f"engine.batch_wait_iters must be an integer >= 0, got {self.batch_wait_iters!r}"
            )
        ratio = self.batch_wait_tokens_ratio
        if not (isinstance(ratio, int | float) and 0 <= ratio <= 1):
            raise ValueError(f"engine.batch_wait_tokens_ratio must be in [0, 1], got {ratio!r}")
        if self.batch_wait_iters and self.batching != "mixed":
            raise ValueError(
                "engine.batch_wait_iters is TensorRT-LLM's batch waiting: it needs "
                f"engine.batching=mixed, got {self.batching!r}"
            )

    def _check_sglang_prefill_limits(self) -> None:
        """``engine.max_prefill_tokens`` and ``engine.token_budget=null`` (chunked prefill
        off) are SGLang's ``--max-prefill-tokens`` and ``--chunked-prefill-size -1``: they
        need its admission, and without chunks SGLang runs no mixed step."""
        sglang = self.request_admission == "sglang"
        if self.max_prefill_tokens is not None and not sglang:
            raise ValueError(
                "engine.max_prefill_tokens is SGLang's --max-prefill-tokens: it needs "
                f"engine.request_admission=sglang, got {self.request_admission!r}"
            )
        if self.token_budget is None and not (sglang and self.batching == "prefill_first"):
            raise ValueError(
                "engine.token_budget=null (chunked prefill off, SGLang's "
                "--chunked-prefill-size -1) needs engine.request_admission=sglang and "
                f"engine.batching=prefill_first, got {self.request_admission!r} and "
                f"{self.batching!r}"
            )
