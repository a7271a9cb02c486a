"""What the harness measures, and what the cost model says about it (no ``torch`` here).

A :class:`Case` is one measured shape: its suite, the cost-model op it stands for, its shape
parameters and the :class:`~simlab.cost.shapes.Op` list the simlab cost model assigns to it
(one op for an op case, every op of an iteration for a composed-stack case). FLOPs, bytes and
launches always come from :meth:`simlab.cost.model.CostModel.ops` on a :class:`BatchShape`, never
from formulas re-derived here, so the fit and the report calibrate exactly the model simlab runs.

:func:`plan` lists the cases of the chosen suites in priority order. Shapes come from a simlab
model preset (``configs/model/*.yaml``); :func:`tiny_spec` scales it down for CPU runs and tests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simlab import CostModel, Hardware, ModelSpec
from simlab.cost.shapes import BatchShape, Op

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

#: Suites in priority order: a run cut off by its budget has the most useful data first.
SUITES = ("floors", "gemm", "norms", "attn", "ssm", "stack", "flex")

#: Share of the time budget each suite may use; what a suite leaves goes to the later ones.
SUITE_WEIGHTS = {
    "floors": 0.04,
    "gemm": 0.22,
    "norms": 0.05,
    "attn": 0.17,
    "ssm": 0.17,
    "stack": 0.23,
    "flex": 0.12,
}

#: GPU name fragment -> hardware preset (first match wins; order matters for "H100").
GPU_PRESETS = (
    ("H200", "h200"),
    ("H100", "h100_sxm"),
    ("A100-SXM4-40GB", "a100_40gb"),
    ("A100-SXM4-80GB", "a100_80gb"),
    ("A100 80GB", "a100_80gb"),
    ("A100", "a100_40gb"),
    ("L40S", "l40s"),
)

_NO_HW = Hardware("none", 1.0, 1.0, 1.0, 1.0)  # ops() does not depend on the hardware


# ---------------------------------------------------------------------------- presets
def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml  # PyYAML: installed with omegaconf here, present on the GPU image

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a mapping")
    return data


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name (``configs/model/NAME.yaml``) or by YAML path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / "model" / f"{name_or_path}.yaml"
    if not path.exists():
        raise ValueError(f"model preset {name_or_path!r} not found ({path})")
    return ModelSpec.from_config(_load_yaml(path))


def load_hardware(name_or_path: str) -> Hardware:
    """A hardware preset by name (``configs/hardware/NAME.yaml``) or by YAML path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / "hardware" / f"{name_or_path}.yaml"
    if not path.exists():
        raise ValueError(f"hardware preset {name_or_path!r} not found ({path})")
    return Hardware.from_config(_load_yaml(path))


def hardware_preset_for(device_name: str) -> str | None:
    """The simlab hardware preset of a GPU name as CUDA reports it (None if unknown)."""
    for fragment, preset in GPU_PRESETS:
        if fragment.lower() in device_name.lower():
            return preset
    return None


def spec_dict(spec: ModelSpec) -> dict[str, Any]:
    """The config fields of a spec (what :meth:`ModelSpec.from_config` takes back)."""
    from dataclasses import fields

    return {f.name: getattr(spec, f.name) for f in fields(spec) if f.init}


def tiny_spec(spec: ModelSpec, dtype_bytes: int = 4) -> ModelSpec:
    """The same architecture scaled down for CPU runs: d_model 64, 16-dim heads, state 16,
    about one layer in eight of each kind (at least one), the same GQA ratio, MLP ratio and
    gating. ``dtype_bytes`` is the element size the run uses (4 = float32 on the CPU)."""
    D = 64
    heads = 4
    gqa = max(1, spec.n_heads // max(spec.n_kv_heads, 1)) if spec.n_attn_layers else 1
    ratio = spec.mlp_intermediate / spec.d_model
    moe_ratio = spec.moe_intermediate / spec.d_model

    def layers(n: int) -> int:
        return 0 if n == 0 else max(1, math.ceil(n / 8))

    ssm_heads = spec.ssm_expand * D // 16
    groups = 2 if spec.ssm_n_groups > 1 and ssm_heads % 2 == 0 else 1
    return replace(
        spec,
        name=f"{spec.name}_tiny",
        d_model=D,
        n_attn_layers=layers(spec.n_attn_layers),
        n_ssm_layers=layers(spec.n_ssm_layers),
        n_mlp_layers=layers(spec.n_mlp_layers),
        n_moe_layers=layers(spec.n_moe_layers),
        n_heads=heads if spec.n_attn_layers else spec.n_heads,
        n_kv_heads=max(1, heads // min(gqa, heads)) if spec.n_attn_layers else spec.n_kv_heads,
        head_dim=16 if spec.n_attn_layers else spec.head_dim,
        mlp_intermediate=max(16, round(ratio * D / 16) * 16),
        moe_intermediate=max(16, round(moe_ratio * D / 16) * 16),
        moe_experts=min(spec.moe_experts, 4) if spec.n_moe_layers else spec.moe_experts,
        moe_top_k=min(spec.moe_top_k, 2) if spec.n_moe_layers else spec.moe_top_k,
        ssm_state_dim=16,
        ssm_head_dim=16,
        ssm_n_heads=ssm_heads,
        ssm_n_groups=groups,
        vocab_size=512 if spec.vocab_size else 0,
        dtype_bytes=dtype_bytes,
        ssm_state_dtype_bytes=dtype_bytes,
        flop_formula="exact",
    )


def with_dtype(spec: ModelSpec, dtype_bytes: int) -> ModelSpec:
    """The spec with activations, weights and SSM state held in ``dtype_bytes``-byte elements."""
    if spec.dtype_bytes == dtype_bytes and spec.ssm_state_dtype_bytes == dtype_bytes:
        return spec
    return replace(spec, dtype_bytes=dtype_bytes, ssm_state_dtype_bytes=dtype_bytes)


def one_layer(spec: ModelSpec) -> ModelSpec:
    """At most one layer of each kind: an op of this spec is one layer's op."""
    return replace(
        spec,
        n_attn_layers=min(spec.n_attn_layers, 1),
        n_ssm_layers=min(spec.n_ssm_layers, 1),
        n_mlp_layers=min(spec.n_mlp_layers, 1),
        n_moe_layers=min(spec.n_moe_layers, 1),
    )


def moe_spec(spec: ModelSpec) -> ModelSpec:
    """One MoE layer: the preset's own, or (for a model without MoE) a MoE-style grouped GEMM of
    16 experts (4 when tiny), top-2, expert width 3.5 d_model (Jamba/Mixtral-like)."""
    base = one_layer(spec)
    if spec.n_moe_layers:
        return base
    tiny = spec.d_model <= 256
    inter = max(16, round(3.5 * spec.d_model / 16) * 16)
    return replace(
        base, n_moe_layers=1, moe_experts=4 if tiny else 16, moe_top_k=2, moe_intermediate=inter
    )


def norm_spec(spec: ModelSpec) -> ModelSpec:
    """Exactly one layer in total, so ``norms_residuals`` is one layer's norm + residual."""
    attn = 1 if spec.n_attn_layers else 0
    return replace(spec, n_attn_layers=attn, n_ssm_layers=1 - attn, n_mlp_layers=0, n_moe_layers=0)


def cost_ops(spec: ModelSpec, batch: BatchShape) -> list[Op]:
    """The cost model's op list for ``batch`` (tp = 1)."""
    return CostModel(spec, _NO_HW).ops(batch)


def cost_op(spec: ModelSpec, batch: BatchShape, name: str) -> Op:
    """The cost model's op ``name`` for ``batch``."""
    for op in cost_ops(spec, batch):
        if op.name == name:
            return op
    raise KeyError(f"cost model has no op {name!r} for {batch}")


def op_dict(op: Op) -> dict[str, Any]:
    """An op as a record holds it: with its token count (a class curve's argument) and its
    profile key, ``shape`` and ``units``, when it has one (a calibration's measured shapes then
    time it as simlab does)."""
    out = {
        "name": op.name,
        "op_class": op.op_class,
        "flops": float(op.flops),
        "bytes": float(op.bytes),
        "launches": int(op.launches),
        "tokens": int(op.tokens),  # the class curve's argument
    }
    if op.units:
        out |= {"shape": list(op.shape), "units": int(op.units)}
    return out


# ---------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One measured shape and the cost-model ops that predict it.

    ``kind``: ``op`` (one cost-model op; fitted), ``floor`` (a hardware probe: achieved peak
    FLOP/s, bandwidth, launch overhead), ``component`` (part of an op, diagnostic only: no
    cost-model numbers), ``stack`` (a composed-stack iteration; ``ops`` is the whole op list)
    or ``check`` (a numerical equality check, no timing).
    """

    suite: str
    kind: str
    op_name: str
    op_class: str | None
    params: dict[str, Any]
    variant: str = ""
    ops: tuple[Op, ...] = ()
    spec: ModelSpec | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> str:
        """Identity for ``--resume``: suite, op, variant and shape."""
        return record_key(self.suite, self.op_name, self.variant, self.params)

    @property
    def flops(self) -> float | None:
        return sum(o.flops for o in self.ops) if self.ops else None

    @property
    def bytes(self) -> float | None:
        return sum(o.bytes for o in self.ops) if self.ops else None

    @property
    def launches(self) -> int | None:
        return sum(o.launches for o in self.ops) if self.ops else None


def record_key(suite: str, op_name: str, variant: str, params: dict[str, Any]) -> str:
    return json.dumps([suite, op_name, variant, params], sort_keys=True)


@dataclass(frozen=True)
class Scale:
    """Shape grids of a run (``FULL`` on a GPU, ``TINY`` for CPU checks)."""

    tokens: tuple[int, ...]
    lm_head_max: int
    prefill_new: tuple[int, ...]
    prefill_prefix: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_ctx: tuple[int, ...]
    decode_max_kv: int  # batch * ctx cap
    scan_tokens: tuple[int, ...]
    step_batch: tuple[int, ...]
    copies: tuple[int, ...]
    stack_len: tuple[int, ...]
    stack_hits: tuple[float, ...]
    stack_decode: tuple[tuple[int, int], ...]  # (batch, ctx)
    flex: tuple[tuple[int, int, int], ...]  # (context, questions, own tokens)
    gemm_floor: int
    copy_floor_mb: int
    launch_floor: int


FULL = Scale(
    tokens=tuple(2**i for i in range(15)),  # 1 .. 16384
    lm_head_max=4096,
    prefill_new=(16, 128, 512, 2048, 8192),
    prefill_prefix=(0, 1024, 4096, 16384),
    decode_batch=(1, 4, 16, 64, 256),
    decode_ctx=(256, 1024, 4096, 16384, 65536),
    decode_max_kv=1 << 20,
    scan_tokens=(16, 64, 256, 1024, 4096, 16384),
    step_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    copies=(1, 2, 4, 8, 16, 32, 64),
    stack_len=(2048, 8192),
    stack_hits=(0.0, 0.5, 0.9),
    stack_decode=((1, 2048), (16, 2048), (64, 2048), (16, 8192)),
    flex=((2048, 4, 64), (2048, 16, 64), (8192, 4, 64), (8192, 16, 64)),
    gemm_floor=8192,
    copy_floor_mb=1024,
    launch_floor=2000,
)

TINY = Scale(
    tokens=(1, 4, 16, 64, 256),
    lm_head_max=64,
    prefill_new=(4, 32),
    prefill_prefix=(0, 64),
    decode_batch=(1, 4),
    decode_ctx=(32, 128),
    decode_max_kv=1 << 12,
    scan_tokens=(8, 64),
    step_batch=(1, 4),
    copies=(1, 4),
    stack_len=(64,),
    stack_hits=(0.0, 0.5, 0.9),
    stack_decode=((1, 64), (4, 64)),
    flex=((32, 2, 8), (32, 4, 8)),
    gemm_floor=128,
    copy_floor_mb=4,
    launch_floor=200,
)


def spread(values: Sequence[Any]) -> list[Any]:
    """Reorder so the first few items already span the range (ends, middle, quarters, ...):
    a suite cut off by its time share still covers its grid coarsely."""
    n = len(values)
    if n <= 2:
        return list(values)
    order = [0, n - 1]
    step = n - 1
    while len(order) < n:
        step = max(step // 2, 1)
        for i in range(0, n, step):
            if i not in order:
                order.append(i)
    return [values[i] for i in order]


def _gemm_cases(spec: ModelSpec, scale: Scale) -> Iterable[Case]:
    layer = one_layer(spec)
    names = []
    if spec.n_attn_layers:
        names += ["attn_qkv_proj", "attn_out_proj"]
    if spec.n_ssm_layers and spec.ssm_kind == "mamba2":
        names += ["ssm_in_proj", "ssm_out_proj"]
    if spec.n_mlp_layers:
        names.append("mlp")
    yield Case("gemm", "check", "moe_grouped_vs_loop", None, {"tokens": 37}, "", (), moe_spec(spec))
    for tokens in spread(scale.tokens):
        batch = BatchShape(prefill=[(0, tokens)], sampled=tokens)
        for name in names:
            yield Case(
                "gemm",
                "op",
                name,
                "gemm",
                {"tokens": tokens},
                "",
                (cost_op(layer, batch, name),),
                layer,
            )
        moe = moe_spec(spec)
        yield Case(
            "gemm", "op", "moe", "gemm", {"tokens": tokens}, "", (cost_op(moe, batch, "moe"),), moe
        )
        if spec.vocab_size and tokens <= scale.lm_head_max:
            yield Case(
                "gemm",
                "op",
                "lm_head",
                "gemm",
                {"tokens": tokens},
                "",
                (cost_op(layer, batch, "lm_head"),),
                layer,
            )


def _norm_cases(spec: ModelSpec, scale: Scale) -> Iterable[Case]:
    one = norm_spec(spec)
    for tokens in spread(scale.tokens):
        batch = BatchShape(prefill=[(0, tokens)], sampled=0)
        yield Case(
            "norms",
            "op",
            "norms_residuals",
            "elementwise",
            {"tokens": tokens},
            "",
            (cost_op(one, batch, "norms_residuals"),),
            one,
        )


def _attn_cases(spec: ModelSpec, scale: Scale) -> Iterable[Case]:
    if not spec.n_attn_layers:
        return
    layer = one_layer(spec)
    yield Case(
        "attn", "check", "lower_right_vs_dense", None, {"new": 24, "total": 80}, "", (), layer
    )
    grid = [(p, n) for n in scale.prefill_new for p in scale.prefill_prefix]
    for prefix, new in spread(grid):
        batch = BatchShape(prefill=[(prefix, new)])
        yield Case(
            "attn",
            "op",
            "attn_prefill",
            "attn_prefill",
            {"prefix": prefix, "new": new, "batch": 1},
            "prefix" if prefix else "",
            (cost_op(layer, batch, "attn_prefill"),),
            layer,
        )
    dgrid = [
        (b, c) for b in scale.decode_batch for c in scale.decode_ctx if b * c <= scale.decode_max_kv
    ]
    for b, ctx in spread(dgrid):
        batch = BatchShape(decode=[ctx] * b)
        yield Case(
            "attn",
            "op",
            "attn_decode",
            "attn_decode",
            {"batch": b, "ctx": ctx},
            "",
            (cost_op(layer, batch, "attn_decode"),),
            layer,
        )


def _ssm_cases(spec: ModelSpec, scale: Scale) -> Iterable[Case]:
    if not spec.n_ssm_layers or spec.ssm_kind != "mamba2":
        return
    layer = one_layer(spec)
    for check in ("ssd_chunked_vs_sequential", "fla_vs_reference", "mixer_step_vs_core"):
        yield Case(
            "ssm", "check", check, None, {"tokens": 150 if "fla" in check else 37}, "", (), layer
        )
    for tokens in spread(scale.scan_tokens):
        for init in (False, True):
            params = {"tokens": tokens, "batch": 1, "init": init}
            variant = "init" if init else ""
            batch = BatchShape(prefill=[(0, tokens)])  # the prefix does not change scan work
            yield Case(
                "ssm",
                "op",
                "ssm_scan",
                "ssm_scan",
                params,
                variant,
                (cost_op(layer, batch, "ssm_scan"),),
                layer,
            )
            for comp in ("ssm_conv", "ssm_ssd"):
                yield Case("ssm", "component", comp, None, params, variant, (), layer)
    for b in spread(scale.step_batch):
        batch = BatchShape(decode=[1] * b)
        yield Case(
            "ssm",
            "op",
            "ssm_step",
            "ssm_step",
            {"batch": b},
            "",
            (cost_op(layer, batch, "ssm_step"),),
            layer,
        )
    for copies in spread(scale.copies):
        # one copy per checkpoint of every SSM layer's state (a contiguous per-slot pool row)
        batch = BatchShape(prefill=[(1, 1)], state_loads=copies)
        yield Case(
            "ssm",
            "op",
            "ssm_state_copy",
            "state_copy",
            {"copies": copies, "layers": spec.n_ssm_layers},
            "",
            (cost_op(spec, batch, "ssm_state_copy"),),
            spec,
        )


def _stack_cases(spec: ModelSpec, scale: Scale) -> Iterable[Case]:
    if spec.ssm_kind != "mamba2" and spec.n_ssm_layers:
        return
    for length in scale.stack_len:
        for hit in scale.stack_hits:
            prefix = round(length * hit)
            loads = 1 if (prefix and spec.is_hybrid) else 0
            batch = BatchShape(prefill=[(prefix, length - prefix)], state_loads=loads)
            params = {
                "mode": "prefill",
                "len": length,
                "hit": hit,
                "prefix": prefix,
                "new": length - prefix,
            }
            yield Case(
                "stack",
                "stack",
                "stack_prefill",
                None,
                params,
                f"hit={hit:g}",
                tuple(cost_ops(spec, batch)),
                spec,
            )
    for b, ctx in scale.stack_decode:
        batch = BatchShape(decode=[ctx] * b)
        yield Case(
            "stack",
            "stack",
            "stack_decode",
            None,
            {"mode": "decode", "batch": b, "ctx": ctx},
            "",
            tuple(cost_ops(spec, batch)),
            spec,
        )


def _flex_cases(spec: ModelSpec, scale: Scale) -> Iterable[Case]:
    if not spec.n_attn_layers:
        return
    layer = one_layer(spec)
    for check in ("cascade_vs_full", "ippd_flex_vs_dense"):
        yield Case(
            "flex", "check", check, None, {"context": 64, "questions": 3, "own": 8}, "", (), layer
        )
    for context, m, own in scale.flex:
        params = {"context": context, "questions": m, "own": own}
        shared = BatchShape(decode=[context + own] * m, shared_kv_tokens=(m - 1) * context)
        alone = BatchShape(decode=[context + own] * m)
        for variant, batch in (("ippd_flex", shared), ("cascade", shared), ("batched", alone)):
            yield Case(
                "flex",
                "op",
                "attn_decode",
                "attn_decode",
                params,
                variant,
                (cost_op(layer, batch, "attn_decode"),),
                layer,
            )


def _floor_cases(scale: Scale, dtype_bytes: int) -> Iterable[Case]:
    n = scale.gemm_floor
    w = dtype_bytes
    yield Case(
        "floors",
        "floor",
        "gemm_peak",
        "gemm",
        {"m": n, "n": n, "k": n},
        "",
        (Op("gemm_peak", "gemm", 2.0 * n**3, 3.0 * n * n * w, 1),),
    )
    size = scale.copy_floor_mb * 2**20
    yield Case(
        "floors",
        "floor",
        "copy_bw",
        "state_copy",
        {"mbytes": scale.copy_floor_mb},
        "",
        (Op("copy_bw", "state_copy", 0.0, 2.0 * size, 1),),
    )
    k = scale.launch_floor
    yield Case(
        "floors",
        "floor",
        "launch_overhead",
        "elementwise",
        {"launches": k},
        "",
        (Op("launch_overhead", "elementwise", float(k), 2.0 * k * 4, k),),
    )


def plan(spec: ModelSpec, scale: Scale, suites: Sequence[str] = SUITES) -> list[Case]:
    """Every case of ``suites`` (in :data:`SUITES` priority order) for model ``spec``."""
    unknown = set(suites) - set(SUITES)
    if unknown:
        raise ValueError(f"unknown suite(s) {sorted(unknown)}; known: {list(SUITES)}")
    makers = {
        "floors": lambda: _floor_cases(scale, spec.dtype_bytes),
        "gemm": lambda: _gemm_cases(spec, scale),
        "norms": lambda: _norm_cases(spec, scale),
        "attn": lambda: _attn_cases(spec, scale),
        "ssm": lambda: _ssm_cases(spec, scale),
        "stack": lambda: _stack_cases(spec, scale),
        "flex": lambda: _flex_cases(spec, scale),
    }
    out: list[Case] = []
    for suite in SUITES:
        if suite in suites:
            out.extend(makers[suite]())
    return out
