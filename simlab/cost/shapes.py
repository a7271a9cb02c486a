"""What one iteration computes: its batch (:class:`BatchShape`), the operations the cost model
reduces it to (:class:`Op`) and their classes, and the tensor-parallel split of the model's
heads (:func:`check_tp`; replicated KV heads: :func:`on_tp`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simlab.model.spec import ModelSpec

OP_CLASSES = (
    "gemm",
    "attn_prefill",
    "attn_decode",
    "ssm_scan",
    "selective_scan",
    "ssm_step",
    "state_copy",
    "elementwise",
    "allreduce",
)
#: classes computed on CUDA cores in FP32, not tensor cores: Mamba1's selective scan
#: (``selective_scan_cuda``), the recurrent decode step (``selective_state_update``) and the
#: elementwise ops; their compute rate never exceeds
#: :attr:`simlab.cost.hardware.Hardware.fp32_tflops`
CUDA_CORE_CLASSES = ("selective_scan", "ssm_step", "elementwise")
#: the op of the engine's CPU work per iteration (``engine.costs``: iteration and sequence
#: overheads), which an overlapped loop runs beside the GPU's
ENGINE_OVERHEAD = "engine_overhead"


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of an iteration, totalled over the layers it runs in. ``tokens``: the
    class curve's argument, its GEMMs' rows (the positions it processes; for the MoE op, one
    expert's share of them); ``fixed_s``: seconds added as they are
    (the :class:`~simlab.cost.terms.CostTerms`); ``shape`` and ``units``: the op is ``units``
    repetitions of one unit with these dimensions (layer sizes and dtype bytes), which a
    measured :class:`~simlab.cost.profiles.Profile` of that name and shape may time (empty, 0:
    not profiled); ``query``: what a measured kernel needs beyond them
    (:mod:`simlab.cost.measured.hooks`: prefill attention's chunks, equivalent length, whether
    they are equal and prefix-free, and KV tokens read; decode attention's requests, context
    sum and shared KV reads; the MoE's positions)."""

    name: str
    op_class: str
    flops: float
    bytes: float
    launches: int
    tokens: int = 0
    fixed_s: float = 0.0
    shape: tuple[int, ...] = ()
    units: int = 0
    query: tuple[int, ...] = ()


TimedOp = tuple[Op, float]  # an op and its op_time


@dataclass
class BatchShape:
    """What one iteration computes."""

    prefill: list[tuple[int, int]] = field(default_factory=list)  # (prefix, new) per chunk
    decode: list[int] = field(default_factory=list)  # context length per decoding request
    unique_tokens: int | None = None  # RadixMLP: deduplicated position-wise tokens (N')
    shared_kv_tokens: int = 0  # decode KV token reads saved by shared-context attention
    state_loads: int = 0  # SSM checkpoints copied into running slots (prefix hits)
    state_stores: int = 0  # SSM checkpoints copied out for the prefix cache
    sampled: int | None = None  # positions needing logits (default: decodes + final chunks)

    @property
    def tokens(self) -> int:
        return sum(q for _, q in self.prefill) + len(self.decode)


def check_tp(model: ModelSpec, tp: int) -> None:
    """Tensor parallelism as vLLM and SGLang split a model (their ``QKVParallelLinear`` and
    attention layers; vLLM's ``GatedDeltaNetAttention``, ``MambaMixer2``): ``tp`` must divide
    the attention heads and the SSM heads (and a GDN layer's key heads); the KV heads are split
    evenly where ``tp`` divides them, and each is copied onto ``tp / KV heads`` GPUs where the
    KV heads divide ``tp`` (:func:`kv_heads_per_gpu`); any other ``tp`` is an error naming
    ``engine.tp``."""
    heads = []
    if model.n_attn_layers:
        heads.append(("attention heads", model.n_heads))
    if model.n_ssm_layers:
        heads.append(("SSM heads", model.ssm_n_heads))
        if model.ssm_kind == "gdn":
            heads.append(("GDN key heads", model.ssm_n_groups))
    for what, n in heads:
        if n and n % tp:
            raise ValueError(
                f"engine.tp: {tp} does not divide {model.name}'s {n} {what} (tensor "
                "parallelism splits them evenly)"
            )
    kv = model.n_kv_heads if model.n_attn_layers else 0
    if kv and kv % tp and tp % kv:
        raise ValueError(
            f"engine.tp: {tp} neither divides {model.name}'s {kv} KV heads nor is a multiple "
            "of them (the engines split the KV heads evenly or copy each onto tp / KV heads "
            "GPUs)"
        )


def check_ep(model: ModelSpec, tp: int, ep: int) -> None:
    """Expert parallelism within the replica's ``tp`` GPUs (vLLM's ``--enable-expert-parallel``:
    ``ep = tp``; SGLang's ``--ep-size``; TensorRT-LLM's ``moe_expert_parallel_size``): each of
    ``ep`` groups holds ``experts / ep`` whole experts, split ``tp / ep`` ways (MoE TP). ``ep``
    must divide ``tp`` and the experts, and the model must have experts; else an error naming
    ``engine.ep``."""
    if ep == 1:
        return
    if not model.moe_experts:
        raise ValueError(f"engine.ep: {ep} on {model.name}, which has no experts (set 1)")
    for what, n in (("engine.tp", tp), (f"{model.name}'s experts", model.moe_experts)):
        if n % ep:
            raise ValueError(
                f"engine.ep: {ep} does not divide {what} ({n}): each expert-parallel group "
                "holds an equal share of the experts on tp / ep GPUs"
            )


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """The KV heads each of ``tp`` GPUs holds: ``max(1, KV heads // tp)``, vLLM's
    ``ModelConfig.get_num_kv_heads`` (with ``tp`` above the KV heads, each head is copied onto
    ``tp / KV heads`` GPUs)."""
    return max(1, model.n_kv_heads // tp)


def on_tp(model: ModelSpec, tp: int) -> ModelSpec:
    """``model`` as the ``tp`` GPUs of one replica hold it (after :func:`check_tp`):

    - with ``tp`` above its KV heads (GQA), the engines copy each KV head onto ``tp / KV heads``
      GPUs, so the replica stores and projects ``tp * kv_heads_per_gpu`` KV heads -- its KV
      bytes per token, K/V projection and attention KV reads grow by ``tp / KV heads``, and one
      GPU's share (``1 / tp`` of each) is its one KV head;
    - MLA's latent is not split by heads: every GPU keeps each token's whole latent (vLLM's,
      SGLang's and TensorRT-LLM's MLA caches without attention data parallelism), so the
      replica holds ``tp`` copies (``mla_kv_copies``) and one GPU reads a whole latent a token.

    ``model`` itself otherwise."""
    check_tp(model, tp)
    if not model.n_attn_layers or tp == 1:
        return model
    if model.attn_kind == "mla":
        return replace(model, mla_kv_copies=tp)
    if tp <= model.n_kv_heads:
        return model
    return replace(model, n_kv_heads=tp * kv_heads_per_gpu(model, tp))
